"""Round benchmark: the whole Python cluster (controller, relays, ranks as processes on loopback).

For each configuration (world size W on H hosts, frame size, wire dtype) it starts
``flodl-proto controller`` (port mux), H ``flodl-proto relay`` processes and W rank processes,
runs warm-up + measured rounds of ``all_reduce_scaled`` (mean, consensus adopted into the rank's
arrays), and prints the median round time beside:

(a) the CPU floor of this protocol on this machine, computed in the same run: the bytes every
    party must hash (every MAC the protocol requires, at ranks, relays and controller), add
    (fold accumulations), scale/encode and copy (loopback TCP: one copy in, one copy out per leg;
    the decode into the rank's arrays) per round, each divided by its single-core rate measured
    here, summed, and divided by the number of cores — ranks, relays and controller share them;
(b) ``torch.distributed`` gloo ``all_reduce`` of the same size and W, when torch is installed.

    python bench/round.py            # quick: W = 2, 4; frames 4, 64 MiB; f32 and bf16
    python bench/round.py --full     # W = 2, 4, 8; frames 4, 64, 256 MiB; f32 and bf16
    python bench/round.py --write    # also replace the "Round" section of bench/RESULTS.md

The last line is the verdict (target: round <= 1.5 x floor at >= 64 MiB); the exit code is 0 when
the target is met, 1 when it is missed or no >= 64 MiB configuration ran; ``--no-verdict`` exits 0
whatever the verdict (exploration).

Frame size = bytes of tensor payload on the wire per rank (bf16 frames carry twice as many
elements as f32 frames of the same size).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
TENSORS = 4
SECTION = "## Round (bench/round.py)"


# -- rank worker (a separate process) ------------------------------------------------------------
def worker(cfg: dict[str, Any]) -> None:
    """One rank: connect, run warm-up + measured rounds, print one JSON line of round times."""
    from flodl_proto.runner.rank import RankClient

    nbytes = int(cfg["mib"] * MiB)
    bf16 = cfg["dtype"] == "bf16"
    per = nbytes // TENSORS // (2 if bf16 else 4)
    arrays = []
    for i in range(TENSORS):
        a = (np.arange(per, dtype=np.float32) % 997) * np.float32(1e-3)
        a += np.float32(cfg["rank"] + i)
        arrays.append(a.astype(ml_dtypes.bfloat16) if bf16 else a)
    salt = bytes.fromhex(os.environ["FLODL_SESSION_SALT"])
    times = []
    with RankClient.connect(cfg["relay"], cfg["rank"], cfg["world"], salt, cfg["version"],
                            bf16=bf16) as client:
        for k in range(cfg["warmup"] + cfg["rounds"]):
            t0 = time.perf_counter()
            client.all_reduce_scaled(arrays, 1.0)
            dt = time.perf_counter() - t0
            if k >= cfg["warmup"]:
                times.append(dt)
    print(json.dumps({"rank": cfg["rank"], "times": times}), flush=True)


# -- single-core rates ---------------------------------------------------------------------------
@dataclass
class Rates:
    """Single-core throughputs in bytes/s (of the S-byte payload each operation processes)."""

    hash: float
    add_f32: float
    add_bf16: float
    scale_f32: float
    scale_bf16: float
    copy: float


def _best(fn: Any, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_rates(mib: int = 64) -> Rates:
    """Measure each primitive over ``mib`` MiB on one core (this process)."""
    from flodl_proto.reduce import _kernels as K
    from flodl_proto.reduce import bf16_from_f32, scale_payload

    n = mib * MiB
    buf = np.frombuffer(os.urandom(n), dtype=np.uint8)
    key = os.urandom(16)
    t_hash = _best(lambda: hmac.new(key, buf, "sha256").digest())
    x32 = np.arange(n // 4, dtype=np.float32)
    acc = np.zeros(n // 4, np.float32)
    ws = K.Workspace()
    t_add32 = _best(lambda: K.accumulate(acc, x32, 0, ws))
    x16 = bf16_from_f32(np.arange(n // 2, dtype=np.float32) % 1000)
    acc2 = np.zeros(n // 2, np.float32)
    t_add16 = _best(lambda: K.accumulate(acc2, x16, 1, ws))
    # the scale step as the rank's hot path runs it: into a buffer reused from round to round
    out32 = np.empty_like(x32)
    t_scale32 = _best(lambda: np.multiply(x32, np.float32(0.5), out=out32))
    out16 = np.empty(x16.nbytes, np.uint8)
    t_scale16 = _best(lambda: scale_payload(1, x16.view(np.uint8).data, 0.5, out=out16))
    dst = np.empty_like(buf)
    t_copy = _best(lambda: np.copyto(dst, buf))
    return Rates(n / t_hash, n / t_add32, n / t_add16, n / t_scale32, n / t_scale16, n / t_copy)


def floor_seconds(world: int, hosts: list[list[int]], nbytes: int, dtype: str, rates: Rates,
                  cores: int) -> tuple[float, dict[str, float]]:
    """The CPU floor of one round (seconds) and its parts in bytes.

    hash: ranks sign + verify (2W); relays verify deposits (W), sign the HostFrame record (H)
    and, on multi-rank hosts, its merged inner frame, verify the Broadcast record (H);
    controller verifies record + inner frame per host (2H), signs consensus + record (2).
    add: relay folds (k accumulations on a k-rank host, none on a 1-rank host) and the
    controller's (H). scale/encode: rank pre-scale (W), relay encode of merged sums (multi-rank
    hosts), controller encode + normalise (2). copy: two copies per byte per TCP leg (ranks ->
    relays, relays -> ranks, relays -> controller, controller -> relays) and the decode into the
    rank's arrays (W).
    """
    h = len(hosts)
    multi = [len(g) for g in hosts if len(g) > 1]
    parts = {
        "hash": (3 * world + 4 * h + len(multi) + 2) * nbytes,
        "add": (sum(multi) + h) * nbytes,
        "scale": (world + len(multi) + 2) * nbytes,
        "copy": (2 * (2 * world + 2 * h) + world) * nbytes,
    }
    add_rate = rates.add_bf16 if dtype == "bf16" else rates.add_f32
    scale_rate = rates.scale_bf16 if dtype == "bf16" else rates.scale_f32
    t = (parts["hash"] / rates.hash + parts["add"] / add_rate + parts["scale"] / scale_rate
         + parts["copy"] / rates.copy)
    return t / cores, parts


# -- cluster driver ------------------------------------------------------------------------------
def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _first_line(p: subprocess.Popen[str], what: str, timeout: float = 60.0) -> str:
    q: queue.Queue[str] = queue.Queue()
    assert p.stdout is not None
    t = threading.Thread(target=lambda: q.put(p.stdout.readline() if p.stdout else ""))
    t.start()
    try:
        line = q.get(timeout=timeout)
    except queue.Empty:
        raise RuntimeError(f"{what}: no output") from None
    finally:
        t.join(timeout=1.0)
    if not line.startswith("listening on "):
        raise RuntimeError(f"{what}: {line!r} {p.stderr.read() if p.stderr else ''}")
    return line.split()[-1]


def run_cluster(world: int, hosts: list[list[int]], mib: float, dtype: str, version: int,
                warmup: int, rounds: int) -> list[float]:
    """Run one configuration; return the per-round times (max over ranks), seconds."""
    env = dict(os.environ, FLODL_SESSION_SALT=os.urandom(16).hex())
    procs: list[subprocess.Popen[str]] = []
    try:
        ctrl = _spawn(["-m", "flodl_proto.cli", "controller", "--listen", "127.0.0.1:0",
                       "--world-size", str(world), "--protocol-version", str(version)], env)
        procs.append(ctrl)
        caddr = _first_line(ctrl, "controller")
        relay_of = {}
        relays = []
        for i, g in enumerate(hosts):
            r = _spawn(["-m", "flodl_proto.cli", "relay", "--controller", caddr, "--ranks",
                        ",".join(map(str, g)), "--world-size", str(world), "--listen-port", "0",
                        "--protocol-version", str(version), "--host", f"bench{i}"], env)
            procs.append(r)
            relays.append((r, g))
        for r, g in relays:
            addr = _first_line(r, "relay")
            for rank in g:
                relay_of[rank] = addr
        ranks = []
        for rank in range(world):
            cfg = {"rank": rank, "world": world, "relay": relay_of[rank], "mib": mib,
                   "dtype": dtype, "version": version, "warmup": warmup, "rounds": rounds}
            p = _spawn([str(Path(__file__).resolve()), "--worker", json.dumps(cfg)], env)
            procs.append(p)
            ranks.append(p)
        per_rank = []
        for p in ranks:
            out, err = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise RuntimeError(f"rank failed: {err[-2000:]}")
            per_rank.append(json.loads(out.strip().splitlines()[-1])["times"])
        for p in procs:
            p.wait(timeout=60)
        return [max(ts) for ts in zip(*per_rank, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


# -- torch gloo (optional) -----------------------------------------------------------------------
def _gloo_worker(rank: int, world: int, port: int, numel: int, dtype: str, rounds: int,
                 out: Any) -> None:  # pragma: no cover - needs torch
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t = torch.ones(numel, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    times = []
    for k in range(rounds + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if k:
            times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    out.put((rank, times))


def gloo_round(world: int, mib: float, dtype: str, rounds: int) -> float | None:
    """Median gloo all_reduce time of the same payload, or None without torch."""
    try:
        import torch.multiprocessing as tmp
    except ImportError:
        return None
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    numel = int(mib * MiB) // (2 if dtype == "bf16" else 4)
    ctx = tmp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_gloo_worker, args=(r, world, port, numel, dtype, rounds, q))
          for r in range(world)]
    for p in ps:
        p.start()
    res = [q.get(timeout=3600) for _ in ps]
    for p in ps:
        p.join()
    per_round = [max(ts) for ts in zip(*(r[1] for r in res), strict=True)]
    return statistics.median(per_round)


# -- main ----------------------------------------------------------------------------------------
def _hosts(world: int) -> list[list[int]]:
    h = 1 if world <= 2 else 2
    return [list(map(int, g)) for g in np.array_split(np.arange(world), h)]


def main() -> int:
    """Run the configurations chosen on the command line, print the table and the verdict.

    Returns the exit code: 0 when the target is met, 1 when it is missed or no configuration of
    at least 64 MiB ran (``--no-verdict``: always 0, for exploration)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--full", action="store_true", help="W = 2, 4, 8 and 4, 64, 256 MiB")
    ap.add_argument("--worlds", default=None, help="comma-separated world sizes")
    ap.add_argument("--sizes", default=None, help="comma-separated frame sizes in MiB")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--protocol-version", type=int, default=2, choices=(2, 3))
    ap.add_argument("--rounds", type=int, default=None, help="measured rounds (default 5; 3 "
                    "at 256 MiB)")
    ap.add_argument("--write", action="store_true", help="write the table to bench/RESULTS.md")
    ap.add_argument("--no-verdict", action="store_true",
                    help="exit 0 even when the target is missed (exploration)")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    worlds = [int(w) for w in (args.worlds or ("2,4,8" if args.full else "2,4")).split(",")]
    sizes = [float(s) for s in (args.sizes or ("4,64,256" if args.full else "4,64")).split(",")]
    dtypes = args.dtypes.split(",")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    os.environ.setdefault("FLODL_NET_TIMEOUT_SCALE", "1.0")
    print(f"{cores} cores; single-core rates are re-measured before every configuration "
          "(other processes may share the machine)", flush=True)
    all_rates: list[Rates] = []
    rows = []
    lines: list[str] = []
    header = ("| W | hosts | frame | dtype | median round | CPU floor | ratio | gloo |\n"
              "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    print(header, flush=True)
    for world in worlds:
        hosts = _hosts(world)
        for mib in sizes:
            rounds = args.rounds or (3 if mib >= 256 else 5)
            warmup = 1
            for dtype in dtypes:
                rates = measure_rates()
                all_rates.append(rates)
                times = run_cluster(world, hosts, mib, dtype, args.protocol_version, warmup,
                                    rounds)
                med = statistics.median(times)
                floor, _ = floor_seconds(world, hosts, int(mib * MiB), dtype, rates, cores)
                gloo = gloo_round(world, mib, dtype, rounds)
                gtxt = f"{gloo * 1e3:.1f} ms" if gloo is not None else "n/a"
                layout = f"{len(hosts)} ({'+'.join(str(len(g)) for g in hosts)} ranks)"
                row = (f"| {world} | {layout} | {mib:g} MiB | "
                       f"{dtype} | {med * 1e3:.1f} ms | {floor * 1e3:.1f} ms | "
                       f"{med / floor:.2f} | {gtxt} |")
                rows.append((mib, med / floor))
                lines.append(row)
                print(row, flush=True)
    med_rates = Rates(*(statistics.median(getattr(r, f) for r in all_rates)
                        for f in ("hash", "add_f32", "add_bf16", "scale_f32", "scale_bf16",
                                  "copy")))
    rate_line = (f"median single-core rates (GB/s): hmac {med_rates.hash / 1e9:.2f}, add f32 "
                 f"{med_rates.add_f32 / 1e9:.2f}, add bf16 {med_rates.add_bf16 / 1e9:.2f}, "
                 f"scale f32 {med_rates.scale_f32 / 1e9:.2f}, scale bf16 "
                 f"{med_rates.scale_bf16 / 1e9:.2f}, copy {med_rates.copy / 1e9:.2f}; {cores} "
                 "cores")
    print(rate_line, flush=True)
    big = [r for m, r in rows if m >= 64]
    met = bool(big) and max(big) <= 1.5
    verdict = (f"target round <= 1.5 x floor at >= 64 MiB: "
               f"{'met' if met else 'NOT met'}"
               f" (worst {max(big):.2f})" if big else "no >= 64 MiB configuration run")
    print(verdict, flush=True)
    if args.write:
        _write_results("\n".join([rate_line, "", header, *lines, verdict]))
    return 0 if met or args.no_verdict else 1


def _write_results(body: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    section = (f"{SECTION}\n\n`python bench/round.py` — the Python cluster (controller, relays and "
               "ranks as separate processes on loopback), median of the "
               "measured rounds after one warm-up; the CPU floor is computed in the same run "
               "from single-core rates (see the script's docstring); gloo is `n/a` when torch "
               "is not installed.\n\n```\n" + body + "\n```\n")
    start = text.find(SECTION)
    if start >= 0:
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())

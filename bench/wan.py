"""WAN benchmark: round time against the network floor, with the cluster in the network lab.

The controller and every host run in network namespaces of their own joined by a bridge
(``flodl_proto.netlab``); every link (the controller's and each host's) is capped at the same rate
in each direction with a token bucket. Each host runs one relay and two ranks. For each
configuration (world size W on W / 2 hosts, wire dtype, link cap) it runs H warm-up rounds (every
relay folds once: compiled kernels load) and ``--rounds`` measured rounds of 64 MiB frames (four
tensors) at protocol version 3 in which one host's ranks are idle each round (round k: host
k mod H). Idle ranks send elided frames of weight 0, so that host's HostFrame is elided too: the
relay fold keeps an all-elided round elided, while a tensor elided by only some deposits, or only
some tensors of a frame, comes out of the fold as real zeros, as upstream's fold does. W is
even (two ranks per host) and at least 4: on one host, every round would be that host's idle
round, with nothing to measure. It prints the median round time (max over ranks) beside the
network floor:

    floor = (bytes into the controller + bytes out of it) per round / link cap

Every host's HostFrame must reach the controller before the consensus exists, and every host's
Broadcast leaves it afterwards, so the two directions of the controller's link cannot overlap
within a round: the floor is the sum of both directions' bytes divided by the cap. Bytes are the
mux records' bytes (record header, frame, tags; not TCP/IP headers, about 5 % more on the wire).

Target: round time <= 1.2 x floor at 100 Mbit/s (the network, not the CPU, is the bottleneck
there); the 1 Gbit/s rows are printed for information (on a 2-core machine the CPU is the
bottleneck there). Exit 1 when the target is missed (``--no-verdict``: always 0; under
``--loss``, below, the target is not applied: 0).

``--loss PERCENT`` (0 <= PERCENT < 100, in the lab's steps of 0.01 %; default 0) adds random
packet loss on every link in each direction, through the lab's loss rule
(:meth:`flodl_proto.netlab.NetLab.set_loss`): a packet between a host and the controller crosses
two links (the host's and the controller's), so it is lost with probability
1 - (1 - PERCENT / 100)^2, about twice PERCENT; TCP retransmits. While a loss rule is on, the
lab's nodes send MTU-sized packets (no GSO bundles), which costs CPU. The intro line names the
loss, and the table's ``dropped`` column counts the packets the rules dropped over the
configuration's run (warm-up included). The floor counts no retransmission, so under loss the
target is not applied: the verdict line gives the worst ratio at 100 Mbit/s and says the target is
not applied (``target ...: not applied under 1 % packet loss (the floor counts no retransmission;
worst 1.27)``), and the exit code is 0.

Before each configuration the script waits (up to ``--quiet-wait`` seconds) for the machine to be
quiet (other processes using less than ``--quiet-cores`` cores) and records the CPU time other
processes used during the run, in cores, beside the figures.

    sudo python bench/wan.py                  # W = 4, 8; f32, bf16; 100 Mbit/s and 1 Gbit/s
    sudo python bench/wan.py --write          # also replace the WAN section of bench/RESULTS.md
    sudo python bench/wan.py --caps 100 --worlds 4 --no-verdict
    sudo python bench/wan.py --caps 100 --worlds 4 --dtypes f32 --mib 4 --loss 1

Needs root, iproute2 and nftables (the network lab); without them it says what is missing in one
line (``bench/wan.py: error: the network lab needs root (...)``, ``... needs iproute2 and nftables:
nft not found (...)``) and exits 1, as a run that fails (2 is for a bad command line).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _cli import (
    MIB_WHY,
    WORLD_WHY,
    BenchFailed,
    Parser,
    config,
    exited,
    listed,
    loading,
    mib_max,
    number,
    one_of,
    queue_get,
    run,
    shown,
    whole,
    worker_salt,
    world_max,
)

with loading("bench/wan.py", __name__ == "__main__"):  # Ctrl-C: one line, not a traceback
    import numpy as np

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
TENSORS = 4
SECTION = "## WAN (bench/wan.py)"
TARGET = 1.2
TARGET_CAP = 100


# -- rank worker (a separate process, inside a host's namespace) ---------------------------------
#: the keys of a rank process's ``--worker`` configuration (:func:`worker`) and their types
WORKER_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rank": int, "world": int, "relay": str, "mib": (int, float), "dtype": str, "warmup": int,
    "rounds": int, "host": int, "hosts": int}


def worker(cfg: dict[str, Any], salt: bytes) -> None:
    """One rank: connect, run warm-up + measured rounds, print one JSON line of round times.
    ``salt``: the session salt, 16 bytes (:func:`_cli.worker_salt`)."""
    import ml_dtypes

    from flodl_proto.codec import Dtype, RoundFrame, RoundKind, TensorPayload
    from flodl_proto.runner.rank import RankClient

    bf16 = cfg["dtype"] == "bf16"
    wire = Dtype.BF16 if bf16 else Dtype.F32
    per = int(cfg["mib"] * MiB) // TENSORS // (2 if bf16 else 4)
    tensors = []
    for _ in range(TENSORS):
        a = (np.arange(per, dtype=np.float32) % 997) * np.float32(1e-3) + np.float32(cfg["rank"])
        data = a.astype(ml_dtypes.bfloat16) if bf16 else a
        tensors.append(TensorPayload(int(wire), (per,), data.view(np.uint8).data))
    full = RoundFrame(RoundKind.MODEL, 1.0, tensors)
    idle = RoundFrame(RoundKind.MODEL, 0.0,
                      [TensorPayload.elide(int(wire), (per,)) for _ in range(TENSORS)])
    times = []
    with RankClient.connect(cfg["relay"], cfg["rank"], cfg["world"], salt, 3) as client:
        for k in range(cfg["warmup"] + cfg["rounds"]):
            t0 = time.perf_counter()
            client.all_reduce(idle if k % cfg["hosts"] == cfg["host"] else full)
            dt = time.perf_counter() - t0
            if k >= cfg["warmup"]:
                times.append(dt)
    print(json.dumps({"rank": cfg["rank"], "times": times}), flush=True)


# -- machine load --------------------------------------------------------------------------------
def _busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def _own_cpu() -> float:
    """CPU seconds of this process and its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _tick() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def others_cores(seconds: float = 1.0) -> float:
    """Cores other processes kept busy over the next ``seconds`` (this process idle)."""
    b0, _ = _busy_ticks()
    own0 = _own_cpu()
    time.sleep(seconds)
    b1, _ = _busy_ticks()
    return max(0.0, ((b1 - b0) / _tick() - (_own_cpu() - own0)) / seconds)


def wait_quiet(limit: float, max_wait: float) -> tuple[float, float]:
    """Wait until other processes use less than ``limit`` cores (at most ``max_wait`` s);
    return (seconds waited, their last measured use in cores)."""
    t0 = time.monotonic()
    load = others_cores()
    while load >= limit and time.monotonic() - t0 < max_wait:
        load = others_cores(2.0)
    return time.monotonic() - t0, load


# -- one configuration in the lab ----------------------------------------------------------------
@dataclass
class Result:
    """One configuration's figures."""

    world: int
    hosts: int
    dtype: str
    cap: float
    median: float
    bytes_in: int
    bytes_out: int
    others: float  # cores other processes used during the run
    waited: float
    dropped: int = 0  # packets the lab's loss rules dropped over the run (warm-up included)

    @property
    def floor(self) -> float:
        return (self.bytes_in + self.bytes_out) * 8 / (self.cap * 1e6)

    @property
    def ratio(self) -> float:
        return self.median / self.floor


def _spawn(lab: Any, node: Any, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    p: subprocess.Popen[str] = lab.popen(node, [sys.executable, *argv], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=env,
                                         cwd=str(ROOT))
    return p


def _readline(p: subprocess.Popen[str], what: str, timeout: float = 120.0) -> str:
    q: queue.Queue[str] = queue.Queue()
    t = threading.Thread(target=lambda: q.put(p.stdout.readline() if p.stdout else ""))
    t.start()
    try:
        line = queue_get(q, timeout)  # in steps: the reader may be the thread a signal went to
    except queue.Empty:
        raise BenchFailed(f"{what}: no output within {timeout:g}s") from None
    finally:
        t.join(timeout=1.0)
    if not line:
        err = p.stderr.read() if p.stderr else ""
        raise exited(what, p.wait(timeout=60), err)
    return line.strip()


def shape_links(lab: Any, cap: float, loss: float) -> None:
    """Cap every link of ``lab`` (the controller's and each host's) at ``cap`` Mbit/s and, when
    ``loss`` (percent) is above 0, drop that share of its packets at random in each direction
    (:meth:`~flodl_proto.netlab.NetLab.set_rate`, :meth:`~flodl_proto.netlab.NetLab.set_loss`)."""
    for node in lab.nodes:
        lab.set_rate(node, cap)
        if loss:
            lab.set_loss(node, loss)


def run_config(world: int, dtype: str, cap: float, mib: float, rounds: int,
               loss: float = 0.0) -> Result:
    """Build a lab of ``world / 2`` hosts capped at ``cap`` Mbit/s, with ``loss`` % packet loss
    on every link (:func:`shape_links`), and run one configuration."""
    from flodl_proto.netlab import NetLab

    hosts = [[2 * h, 2 * h + 1] for h in range(world // 2)]
    env = dict(os.environ, FLODL_SESSION_SALT=os.urandom(16).hex(), PYTHONUNBUFFERED="1",
               FLODL_NET_TIMEOUT_SCALE="1.0", PYTHONPATH=str(ROOT))
    with NetLab(len(hosts)) as lab:
        shape_links(lab, cap, loss)
        procs: list[subprocess.Popen[str]] = []
        try:
            ctrl = _spawn(lab, lab.controller, [
                "-m", "flodl_proto.cli", "controller", "--listen", f"{lab.controller.address}:0",
                "--world-size", str(world), "--protocol-version", "3"], env)
            procs.append(ctrl)
            caddr = _readline(ctrl, "controller").split()[-1]
            relays = [_spawn(lab, lab.hosts[h], [
                "-m", "flodl_proto.cli", "relay", "--controller", caddr, "--ranks",
                ",".join(map(str, g)), "--world-size", str(world), "--listen-port", "0",
                "--protocol-version", "3", "--host", f"h{h}"], env)
                for h, g in enumerate(hosts)]
            procs += relays
            relay_addr = [_readline(r, f"relay{h}").split()[-1] for h, r in enumerate(relays)]
            ranks = []
            for h, g in enumerate(hosts):
                for rank in g:
                    cfg = {"rank": rank, "world": world, "relay": relay_addr[h], "mib": mib,
                           "dtype": dtype, "warmup": len(hosts), "rounds": rounds, "host": h,
                           "hosts": len(hosts)}
                    ranks.append(_spawn(lab, lab.hosts[h], [
                        str(Path(__file__).resolve()), "--worker", json.dumps(cfg)], env))
            procs += ranks
            b0, _ = _busy_ticks()
            own0 = _own_cpu()
            t0 = time.monotonic()
            per_rank = []
            for rank, p in enumerate(ranks):  # hosts hold ranks 0, 1, 2, ... in order
                out, err = p.communicate(timeout=3600)
                if p.returncode != 0:
                    raise exited(f"rank {rank}", p.returncode, err)
                per_rank.append(json.loads(out.strip().splitlines()[-1])["times"])
            for p in procs:
                p.wait(timeout=120)
            wall = time.monotonic() - t0
            b1, _ = _busy_ticks()
            others = max(0.0, ((b1 - b0) / _tick() - (_own_cpu() - own0)) / wall)
            ctl_out = ctrl.communicate()[0]
            relay_out = [r.communicate()[0] for r in relays]
            dropped = sum(lab.dropped(node) for node in lab.nodes)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.communicate()
    times = [max(ts) for ts in zip(*per_rank, strict=True)]
    # the relays' counters: every byte each relay wrote to / read from the controller over the
    # warm-up and the measured rounds (Hello, HelloAck, RankExits: a few hundred bytes in all)
    up = sum(relay_counter(o, "upstream_out", h) for h, o in enumerate(relay_out))
    down = sum(relay_counter(o, "upstream_in", h) for h, o in enumerate(relay_out))
    if "round" not in ctl_out:
        raise BenchFailed("the controller reported no round")
    total = len(hosts) + rounds
    per_round_in, per_round_out = up / total, down / total
    return Result(world, len(hosts), dtype, cap, statistics.median(times), int(per_round_in),
                  int(per_round_out), others, 0.0, dropped)


def relay_counter(out: str, name: str, host: int) -> int:
    """The counter ``name`` (``upstream_out``, ``upstream_in``: bytes) of the ``relay stats
    ...`` line in the output ``out`` of host ``host``'s relay.

    Raises:
        BenchFailed: ``out`` holds no such counter (``relay1 printed no upstream_out count``),
            where the script ended in an AttributeError's traceback.

    No upstream counterpart: a measurement of this bench.
    """
    found = re.search(rf"\b{re.escape(name)}=(\d+)", out)
    if found is None:
        raise BenchFailed(f"relay{host} printed no {name} count")
    return int(found.group(1))


#: why a world size is at least 4, for the message of one below
WORLD_MIN_WHY = " (two ranks per host, two hosts: one is idle every round)"


def _world(text: str) -> int:
    """``type=`` of one world size of ``--worlds``: a whole number in 4..:func:`world_max` (two
    ranks per host, two hosts: one is idle every round; ``must be >= 4 (...), got '2'``, where
    0 read ``must be >= 2`` and 2 was then refused as one host) and even, named as typed
    (``world size '05' is odd``), where the check after parsing named the integer read."""
    value = whole(4, world_max(), WORLD_WHY, minimum_why=WORLD_MIN_WHY)(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"world size {shown(text)} is odd (two ranks per host)")
    return value


def _under_one_element(mib: float) -> str | None:
    """Why a ``--mib`` in its bounds still makes no frame: under one f32 element per tensor."""
    if int(mib * MiB) // TENSORS // 4 < 1:
        return f"less than one f32 element per tensor ({TENSORS} tensors)"
    return None


#: the lab's loss rule draws in steps of 0.01 % (:meth:`flodl_proto.netlab.NetLab.set_loss`)
LOSS_STEPS = 10000
#: why a loss is below 100 %, for the message of one that is not
LOSS_WHY = " (100 % drops every packet)"


def _loss_step(percent: float) -> str | None:
    """Why a ``--loss`` in 0..100 still cannot be set: finer than the lab's 0.01 % steps (the
    rule would round it, and a loss of 0.004 % would drop nothing)."""
    steps = percent * LOSS_STEPS / 100
    if abs(steps - round(steps)) > 1e-6:
        return "finer than the network lab's loss steps of 0.01 %"
    return None


def _loss_words(loss: float) -> str:
    """The intro line's words for ``--loss``."""
    return f"{loss:g} % packet loss on every link, each direction" if loss else "no packet loss"


def verdict_line(results: Sequence[Result], loss: float) -> tuple[str, bool]:
    """The verdict line of ``results`` and whether the script exits 0 on it: the target
    (:data:`TARGET` x the floor at :data:`TARGET_CAP` Mbit/s) against the worst ratio of the
    rows at that cap (``... met (worst 1.17)``, ``... NOT met (worst 1.36)``: exit 1); none at
    that cap, no verdict. With ``loss`` (``--loss``, percent) above 0 the target is not applied
    (exit 0): the floor counts no retransmission, so a lossy run is not held to the lossless
    bound, and the line gives the worst ratio without a verdict (``... not applied under 1 %
    packet loss (the floor counts no retransmission; worst 1.27)``).

    No upstream counterpart: a measurement of this bench.
    """
    worst = max((r.ratio for r in results if r.cap == TARGET_CAP), default=None)
    if worst is None:
        return f"no {TARGET_CAP} Mbit/s configuration run: no verdict", True
    target = f"target round <= {TARGET} x network floor at {TARGET_CAP} Mbit/s"
    if loss:
        return (f"{target}: not applied under {loss:g} % packet loss (the floor counts no "
                f"retransmission; worst {worst:.2f})", True)
    ok = worst <= TARGET
    return f"{target}: {'met' if ok else 'NOT met'} (worst {worst:.2f})", ok


def _unit(cap: float) -> str:
    return f"{cap / 1000:g} Gbit/s" if cap >= 1000 else f"{cap:g} Mbit/s"


def main(argv: list[str] | None = None) -> int:
    """Run the configurations, print the table and the verdict; return the exit code.
    ``argv``: the options (default: the command line's)."""
    ap = Parser(prog="bench/wan.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", type=config(WORKER_FIELDS), help=argparse.SUPPRESS)
    ap.add_argument("--worlds", type=listed(_world), default="4,8",
                    help="comma-separated world sizes (even, >= 4: two ranks per host, one "
                    "host idle per round; default 4,8)")
    ap.add_argument("--dtypes", type=listed(one_of(("f32", "bf16"))), default="f32,bf16",
                    help="comma-separated wire dtypes, f32 and/or bf16 (default f32,bf16)")
    ap.add_argument("--caps", type=listed(number(0, inclusive=False)), default="100,1000",
                    help="link caps in Mbit/s (default 100,1000)")
    ap.add_argument("--mib", type=number(0, inclusive=False, maximum=mib_max(), why=MIB_WHY,
                                         problem=_under_one_element),
                    default=64.0,
                    help="frame size in MiB (default 64)")
    ap.add_argument("--rounds", type=whole(1), default=3, help="measured rounds (default 3)")
    ap.add_argument("--loss", type=number(0, inclusive=True, maximum=100, below=True,
                                          why=LOSS_WHY, problem=_loss_step),
                    default=0.0, metavar="PERCENT",
                    help="random packet loss on every link, each direction, in %% (0 <= "
                    "PERCENT < 100, steps of 0.01; default 0); above 0, the round target "
                    "against the lossless floor is not applied (the worst ratio is printed, "
                    "exit 0)")
    ap.add_argument("--quiet-cores", type=number(0, inclusive=False), default=0.5,
                    help="wait until other processes use fewer cores than this (default 0.5)")
    ap.add_argument("--quiet-wait", type=number(0, inclusive=True), default=120.0,
                    help="longest wait for a quiet machine, seconds (default 120)")
    ap.add_argument("--no-verdict", action="store_true", help="exploration: always exit 0")
    ap.add_argument("--write", action="store_true", help="write the table to bench/RESULTS.md")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, worker_salt(ap))
        return 0
    sys.path.insert(0, str(ROOT))
    from flodl_proto.netlab import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:  # this machine, not the command line: a failed run's line and code
        print(f"bench/wan.py: error: {reason}", file=sys.stderr)
        return 1
    worlds, dtypes, caps = args.worlds, args.dtypes, args.caps
    cores = _cores()
    header = ("| W | hosts | dtype | link cap | median round | network floor | ratio | "
              "in / out per round | dropped | other processes |\n"
              "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    intro = (f"{cores} cores; {args.mib:g} MiB frames (4 tensors), protocol v3, one host idle "
             f"per round (elided), H warm-up + {args.rounds} measured rounds; "
             f"{_loss_words(args.loss)}; dropped = packets the loss rules dropped; other "
             "processes = cores other processes kept busy during the run")
    print(intro, flush=True)
    print(header, flush=True)
    results: list[Result] = []
    lines = []
    for cap in caps:
        for world in worlds:
            for dtype in dtypes:
                waited, _ = wait_quiet(args.quiet_cores, args.quiet_wait)
                res = run_config(world, dtype, cap, args.mib, args.rounds, args.loss)
                res.waited = waited
                results.append(res)
                row = (f"| {res.world} | {res.hosts} | {dtype} | {_unit(cap)} | "
                       f"{res.median:.2f} s | {res.floor:.2f} s | {res.ratio:.2f} | "
                       f"{res.bytes_in / MiB:.1f} / {res.bytes_out / MiB:.1f} MiB | "
                       f"{res.dropped} | {res.others:.2f} cores |")
                lines.append(row)
                print(row, flush=True)
    verdict, ok = verdict_line(results, args.loss)
    print(verdict, flush=True)
    if args.write:
        _write_results("\n".join([intro, "", header, *lines, verdict]))
    if args.no_verdict:
        return 0
    return 0 if ok else 1


def _write_results(body: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    section = (f"{SECTION}\n\n`sudo python bench/wan.py` — the cluster in the network lab "
               "(controller and each host in network namespaces behind a bridge; every link "
               "capped with a token bucket in both directions), median round (max over ranks) "
               "against the network floor, (bytes into + out of the controller per round) / "
               "cap; `--loss PERCENT` adds random packet loss on every link in each direction "
               "(the lab's loss rule; dropped: packets it dropped), and under loss the "
               "1.2 x target is not applied (the floor counts no retransmission); see the "
               "script's docstring.\n\n```\n" + body + "\n```\n")
    start = text.find(SECTION)
    if start >= 0:
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    run(main, "bench/wan.py")

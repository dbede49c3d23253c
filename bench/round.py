"""Round benchmark: the whole Python cluster (controller, relays, ranks as processes on loopback).

For each configuration (world size W on H hosts, frame size, wire dtype) it starts
``flodl-proto controller`` (port mux), H ``flodl-proto relay`` processes and W rank processes,
runs warm-up + measured rounds of ``all_reduce_scaled`` (mean, consensus adopted into the rank's
arrays), and prints the median and 95th-percentile round time beside:

(a) the CPU floor of this protocol on this machine, computed in the same run: the bytes every
    party must hash (every MAC the protocol requires, at ranks, relays and controller), add
    (fold accumulations), scale/encode and copy (loopback TCP: one copy in, one copy out per leg;
    the decode into the rank's arrays) per round, each divided by its single-core rate measured
    here, summed, and divided by the number of cores — ranks, relays and controller share them;
    beside it, the median over the same floor with each TCP leg's two copies at the measured
    cost of a loopback TCP transfer (both ends' CPU, the kernel's work around the copies
    included; the ``tcp`` rate): the verdict is taken against the floor, this column says how
    much of the distance to it is the sockets' own cost;
    beside these, the chain floor (:func:`chain_floor_seconds`): the same work in the four
    steps the protocol runs one after the other, each at least its longest chain of operations
    that cannot overlap (a MAC cannot be split between cores, and a signed record cannot leave
    before its header's tag is known), so no implementation does a round in less on these
    cores; it lies 1.15 to 1.3 x above the CPU floor on the 2-core reference machine, most of
    that the TCP legs' own cost (it is within a few per cent of the TCP floor);
(b) upstream flodl's median round at 4 KiB and 64 KiB (measured back to back on the reference
    machine, f32, protocol v2; the same figures are the target for every dtype and version);
(c) ``torch.distributed`` gloo ``all_reduce`` of the same size and W, when torch is installed.

Every process of the cluster records the stages of every round (``FLODL_STAGE_TRACE``,
:mod:`flodl_proto.runner.stages`); the bench prints the stage breakdown of each row's median round
(rank send, relay deposits -> HostFrame sent, controller last HostFrame -> Broadcast sent, relay
Broadcast -> fan-out done, and the gaps between parties: wire and wake-up time, the last one
including the rank's parse of the reply). Peak RSS per role is the largest ``ru_maxrss`` of the
role's processes.

CPU per round per party: every rank waits after its warm-up and again after its last measured
round while the bench samples the controller's and the relays' CPU time (all threads:
``/proc/<pid>/task/*/schedstat``, exact; the tick count of ``/proc/<pid>/stat`` when threads
ended in between); each rank measures its own (``time.process_time``) over the measured rounds.
The table gives the controller's, a relay's (mean) and a rank's (mean) CPU milliseconds per
round: other load moves it less than the round times, but two runs of one configuration still
differ (up to 40 % on the 2-core reference machine). Beside it, each figure over the role's
share of the floor's work (:func:`role_floor_seconds`): which party spends how much more than
the work the floor counts for it.

Quiet-machine guard: before each configuration the bench waits (at most ``--max-wait`` seconds)
until other processes use under 0.1 core; it records their CPU use during the configuration (all
CPU time of the machine, ``/proc/stat`` user + nice + system, minus that of the bench's own process
tree, plus the steal time a hypervisor gave other guests) and reruns a configuration they
disturbed (over 0.1 core) up to ``--reruns`` times; a row still disturbed is marked ``!``.

    python bench/round.py                  # quick: W = 2, 4; frames 4 KiB, 64 KiB, 4 MiB, 64 MiB
    python bench/round.py --full           # W = 2, 4, 8; 4 KiB .. 256 MiB; f32 and bf16
    python bench/round.py --sizes 4k,1m    # sizes with a unit (k = KiB, m = MiB, g = GiB)
    python bench/round.py --write          # also replace this version's section of RESULTS.md

Targets (the verdict lines): 4 KiB and 64 KiB: median <= upstream's and p95 <= 2 x median;
4 MiB: median <= 1.35 x floor; >= 64 MiB: median <= 1.25 x floor. The last line is ``targets
met``, ``TARGETS MISSED`` or ``no configuration with a target ran``; the exit code is 0 only for
the first; ``--no-verdict`` exits 0 whatever the verdict (exploration).

Frame size = bytes of tensor payload on the wire per rank (bf16 frames carry twice as many
elements as f32 frames of the same size).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hmac
import json
import math
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from _cli import (
    TENSORS,
    WORLD_WHY,
    BenchFailed,
    Parser,
    config,
    exited,
    join_thread,
    listed,
    loading,
    mib_max,
    number,
    one_of,
    option_message,
    queue_get,
    results_note,
    run,
    shown,
    whole,
    whole_number,
    worker_salt,
    world_max,
)

from flodl_proto.spec import DEFAULT_VERSION, SUPPORTED_VERSIONS

with loading("bench/round.py", __name__ == "__main__"):  # Ctrl-C: one line, not a traceback
    import numpy as np
    import numpy.typing as npt

if TYPE_CHECKING:  # imported where used: the runner package loads its runners and ml_dtypes
    from collections.abc import Callable

    from flodl_proto.runner import stages

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Round (bench/round.py)"
#: other processes' CPU use, steal time included (cores), above which a configuration counts
#: as disturbed
QUIET = 0.1
#: upstream flodl's median round (seconds) by (world size, frame bytes); 2/1, 4/2, 8/2 hosts
UPSTREAM = {(2, 4 * KiB): 0.43e-3, (4, 4 * KiB): 1.10e-3, (8, 4 * KiB): 1.83e-3,
            (2, 64 * KiB): 1.19e-3, (4, 64 * KiB): 3.01e-3, (8, 64 * KiB): 4.05e-3}
#: round <= this x CPU floor: at 4 MiB, and at 64 MiB and above
FLOOR_4M = 1.35
FLOOR_LARGE = 1.25
#: p95 <= this x median at the small frames
P95_SPREAD = 2.0
#: seconds between two looks for a rank killed while another rank's line is awaited
WATCH_PERIOD = 0.25
#: the stage breakdown's columns (short names of stages.SEGMENTS, in order)
STAGE_COLUMNS = ("rank send", "->relay", "relay fold", "->ctl", "ctl", "->relay", "fan-out",
                 "->rank")
_UNITS = {"k": KiB, "m": MiB, "g": GiB}


def parse_size(text: str) -> int:
    """Frame size in bytes from ``4k`` / ``64K`` / ``1m`` / ``256m`` / ``1g`` (KiB, MiB, GiB);
    a bare number is MiB (``64`` = 64 MiB), in ASCII digits without ``_``. Raises ``ValueError``
    naming the text when it is not, is not a positive size of whole bytes divisible into the
    bench's 4 tensors of 4-byte elements, or is larger than this machine's physical memory
    (:func:`_cli.mib_max`)."""
    t = text.strip().lower().removesuffix("ib")
    if not t.isascii() or "_" in t:  # float() reads '４k', '١٠' and '1_0' too
        raise ValueError(f"frame size {shown(text)}: expected e.g. 4k, 64k, 1m, 256m (a size is "
                         "written in ASCII digits, without '_')")
    unit = _UNITS.get(t[-1:], None)
    try:
        n = float(t[:-1] if unit else t) * (unit or MiB)
    except ValueError:
        raise ValueError(f"frame size {shown(text)}: expected e.g. 4k, 64k, 1m, 256m") from None
    if math.isnan(n):  # no size: int(nan) below raised ValueError with Python's words
        raise ValueError(f"frame size {shown(text)}: expected e.g. 4k, 64k, 1m, 256m")
    memory = mib_max()
    if memory is not None and n > memory * MiB:  # inf too (1e400)
        raise ValueError(f"frame size {shown(text)}: must be at most {memory} MiB (this "
                         "machine's physical memory)")
    if n <= 0 or n != int(n) or int(n) % (TENSORS * 4):
        raise ValueError(f"frame size {shown(text)}: must be a positive multiple of "
                         f"{TENSORS * 4} bytes")
    return int(n)


def size_label(nbytes: int) -> str:
    """``4 KiB``, ``64 MiB``, ``1.5 MiB``, ``1000 B``."""
    if nbytes >= MiB:
        return f"{nbytes / MiB:g} MiB"
    if nbytes >= KiB:
        return f"{nbytes / KiB:g} KiB"
    return f"{nbytes} B"


def _ms(sec: float) -> str:
    return f"{sec * 1e3:.2f} ms" if sec < 0.1 else f"{sec * 1e3:.1f} ms"


def p95(values: list[float]) -> float:
    """95th percentile (linear interpolation between order statistics, numpy's default)."""
    return float(np.percentile(np.asarray(values), 95)) if values else float("nan")


# -- rank worker (a separate process) ------------------------------------------------------------
#: the keys of a rank process's ``--worker`` configuration (:func:`worker`) and their types
WORKER_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rank": int, "world": int, "relay": str, "nbytes": int, "dtype": str, "version": int,
    "warmup": int, "rounds": int}


def worker(cfg: dict[str, Any], salt: bytes) -> None:
    """One rank: connect, run warm-up + measured rounds, print one JSON line of round times.
    ``salt``: the session salt, 16 bytes (:func:`_cli.worker_salt`)."""
    import ml_dtypes  # here: the bench's own process needs none (about a second to import)

    from flodl_proto.runner.rank import RankClient

    nbytes = int(cfg["nbytes"])
    bf16 = cfg["dtype"] == "bf16"
    per = nbytes // TENSORS // (2 if bf16 else 4)
    arrays = []
    for i in range(TENSORS):
        a = (np.arange(per, dtype=np.float32) % 997) * np.float32(1e-3)
        a += np.float32(cfg["rank"] + i)
        arrays.append(a.astype(ml_dtypes.bfloat16) if bf16 else a)
    times = []
    pause = bool(cfg.get("pause"))
    with RankClient.connect(cfg["relay"], cfg["rank"], cfg["world"], salt, cfg["version"],
                            bf16=bf16) as client:
        for _ in range(cfg["warmup"]):
            client.all_reduce_scaled(arrays, 1.0)
        if pause:  # the bench samples the controller's and relays' CPU while every rank waits
            print("warm", flush=True)
            sys.stdin.readline()
        cpu0 = time.process_time()
        for _ in range(cfg["rounds"]):
            t0 = time.perf_counter()
            client.all_reduce_scaled(arrays, 1.0)
            times.append(time.perf_counter() - t0)
        cpu = time.process_time() - cpu0
        print(json.dumps({"rank": cfg["rank"], "times": times, "cpu": cpu,
                          "hwm_kib": vm_hwm_kib()}), flush=True)
        if pause:  # stay connected until the bench has taken its second sample
            sys.stdin.readline()


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
    #: a loopback TCP transfer's CPU cost as a rate: bytes over the sending and the receiving
    #: thread's CPU seconds together (0: not measured)
    tcp: float = 0.0


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
    t_hash = _best(lambda: hmac.new(key, buf.data, "sha256").digest())
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
    return Rates(n / t_hash, n / t_add32, n / t_add16, n / t_scale32, n / t_scale16, n / t_copy,
                 loopback_tcp_rate(buf, dst))


def loopback_tcp_rate(src: npt.NDArray[np.uint8], dst: npt.NDArray[np.uint8],
                      repeat: int = 3) -> float:
    """What moving bytes over loopback TCP costs in CPU, as a rate: ``src``'s bytes over the CPU
    seconds of the thread that sends them (``sendall``) and of the one that receives them into
    ``dst`` (``recv_into``), added (``time.thread_time``; each thread on a core of its own when
    one is free, as the cluster's parties are); the best of ``repeat`` transfers. Both copies of
    a TCP leg, with the kernel's work around them: the floor counts them as two copies at the
    ``copy`` rate.

    Raises:
        the sending thread's error (an ``OSError``, or a ``TypeError`` for a ``src`` that is no
        buffer): it ends the sending side, so the receiving one ends too instead of waiting.
        BenchFailed: the connection ended before every byte arrived.

    No upstream counterpart: a measurement of this bench.
    """
    n = src.nbytes
    best = float("inf")
    with socket.create_server(("127.0.0.1", 0)) as srv, \
            socket.create_connection(srv.getsockname()[:2]) as tx:
        rx, _ = srv.accept()
        with rx:
            for sock in (tx, rx):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            view = dst.data
            spent = [0.0]
            failed: list[BaseException] = []

            def send() -> None:
                t = time.thread_time()
                try:
                    tx.sendall(src.data)
                except BaseException as e:  # the receiver sees the end of the stream
                    failed.append(e)
                    with contextlib.suppress(OSError):  # a connection that failed is closed
                        tx.shutdown(socket.SHUT_WR)
                    return
                spent[0] = time.thread_time() - t

            for _ in range(repeat):
                sender = threading.Thread(target=send)
                t0 = time.thread_time()
                sender.start()
                got = 0
                while got < n:
                    r = rx.recv_into(view[got:], n - got)
                    if not r:
                        sender.join()
                        if failed:
                            raise failed[0]
                        raise BenchFailed("loopback TCP rate: the connection ended")
                    got += r
                took = time.thread_time() - t0
                sender.join()
                best = min(best, took + spent[0])
    return n / best


def floor_seconds(world: int, hosts: list[list[int]], nbytes: int, dtype: str, rates: Rates,
                  cores: int) -> tuple[float, dict[str, int]]:
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


def role_floor_seconds(hosts: list[list[int]], nbytes: int, dtype: str,
                       rates: Rates) -> dict[str, float]:
    """Each role's share of the CPU floor's work, single-core seconds per round: the
    controller's, a relay's (mean over the hosts) and a rank's. The parts of
    :func:`floor_seconds`, each given to the party that does it (a TCP leg's two copies: one to
    the sender, one to the receiver); the three shares, times their parties' counts, add up to
    the floor's work (its ``cores`` times the floor).

    rank: sign + verify (2 hashes), pre-scale (1), copies: its send, its reply's receive and
    the decode into its arrays (3). relay of a k-rank host: verify k deposits, sign the HostFrame
    record, on a multi-rank host also its merged inner frame, verify the Broadcast record
    (k + 2 + [k > 1] hashes), k accumulations and one encode on a multi-rank host, copies: k
    deposits and the Broadcast in, the HostFrame and k fan-outs out (2k + 2). controller of H
    hosts: verify record + inner frame per host, sign consensus + record (2H + 2 hashes), H
    accumulations, encode + normalise (2), copies: H HostFrames in, H Broadcasts out (2H).
    """
    add_rate = rates.add_bf16 if dtype == "bf16" else rates.add_f32
    scale_rate = rates.scale_bf16 if dtype == "bf16" else rates.scale_f32

    def sec(hashes: int, adds: int, scales: int, copies: int) -> float:
        return nbytes * (hashes / rates.hash + adds / add_rate + scales / scale_rate
                         + copies / rates.copy)

    h = len(hosts)
    relays = [sec(len(g) + 2 + (len(g) > 1), len(g) if len(g) > 1 else 0, int(len(g) > 1),
                  2 * len(g) + 2) for g in hosts]
    return {"controller": sec(2 * h + 2, h, 2, 2 * h),
            "relay": statistics.mean(relays),
            "rank": sec(2, 0, 1, 3)}


def tcp_floor_seconds(world: int, hosts: list[list[int]], nbytes: int, dtype: str,
                      rates: Rates, cores: int) -> float | None:
    """:func:`floor_seconds` with each TCP leg's two copies at the measured loopback TCP cost
    (``rates.tcp``, both ends and the kernel's work around the copies) instead of two copies at
    the ``copy`` rate; None when ``rates.tcp`` was not measured. The decode into the rank's
    arrays stays a copy."""
    if rates.tcp <= 0:
        return None
    floor, _ = floor_seconds(world, hosts, nbytes, dtype, rates, cores)
    legs = (2 * world + 2 * len(hosts)) * nbytes
    return floor + (legs / rates.tcp - 2 * legs / rates.copy) / cores


#: the four steps of a round, in order, that the protocol makes wait for each other
CHAIN_PHASES: Final = ("deposit", "host frame", "reduce", "scatter")


def chain_floor_seconds(world: int, hosts: list[list[int]], nbytes: int, dtype: str,
                        rates: Rates, cores: int) -> tuple[float, dict[str, float]]:
    """The dependency-chain floor of one round (seconds) and each step's part: the work of
    :func:`floor_seconds` (each TCP leg at the measured loopback TCP cost when ``rates.tcp`` was
    measured, else two copies), split into the four steps the protocol runs one after the other
    (:data:`CHAIN_PHASES`), each step taking the longer of its work over ``cores`` and its
    longest chain of operations that cannot overlap:

    - deposit: ranks pre-scale (W) and sign (W) their frames, the W legs to the relays, relays
      verify (W). Chain: one rank's pre-scale, then its MAC (the relay's verify runs beside the
      sending, as the bytes arrive).
    - host frame: relays fold (k accumulations on a k-rank host, none on a 1-rank host), encode
      merged sums (multi-rank hosts), sign the HostFrame record (H) and merged inner frames, the
      H legs to the controller, which verifies record and inner frame (2H). Chain: the largest
      host's fold and encode, its signing (record and inner frame MACs side by side: one MAC's
      time), then the controller's verify (the record's tag leads its payload: nothing is sent
      before the signing ends).
    - reduce: the controller's accumulations (H), encode and normalise (2), signing consensus
      and record (2). Chain: all of it but one of the two MACs (they run side by side).
    - scatter: the H legs to the relays, which verify the Broadcast record (H) and forward the
      frame (W legs), ranks verify (W) and decode into their arrays (W copies). Chain: one MAC
      (the forwarding and the ranks' verifies run as the bytes arrive), then one decode.

    Every step must end before the next begins: a HostFrame waits for its host's deposits, the
    consensus for every HostFrame, and a signed record cannot leave before its MAC, which its
    header carries, is complete. No implementation on ``cores`` cores does a round in less;
    the work adds up to the floor's (with ``rates.tcp``: to :func:`tcp_floor_seconds`'s).

    Returns:
        ``(seconds, parts)``: the floor and each step's seconds (keyed by :data:`CHAIN_PHASES`).
    """
    add_rate = rates.add_bf16 if dtype == "bf16" else rates.add_f32
    scale_rate = rates.scale_bf16 if dtype == "bf16" else rates.scale_f32
    hash_s, add_s, scale_s = nbytes / rates.hash, nbytes / add_rate, nbytes / scale_rate
    copy_s = nbytes / rates.copy
    leg_s = nbytes / rates.tcp if rates.tcp > 0 else 2 * copy_s
    h = len(hosts)
    multi = [len(g) for g in hosts if len(g) > 1]
    largest = max(len(g) for g in hosts)
    fold_chain = (largest * add_s + scale_s) if largest > 1 else 0.0
    steps = {  # (work, chain) in single-core seconds
        "deposit": (world * (scale_s + 2 * hash_s + leg_s), scale_s + hash_s),
        "host frame": (sum(multi) * add_s + len(multi) * scale_s + (h + len(multi)) * hash_s
                       + h * leg_s + 2 * h * hash_s, fold_chain + 2 * hash_s),
        "reduce": (h * add_s + 2 * scale_s + 2 * hash_s, h * add_s + 2 * scale_s + hash_s),
        "scatter": (h * (leg_s + hash_s) + world * (leg_s + hash_s + copy_s), hash_s + copy_s),
    }
    parts = {name: max(work / cores, chain) for name, (work, chain) in steps.items()}
    return sum(parts.values()), parts


# -- quiet-machine guard -------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuSample:
    """CPU time used so far, in clock ticks: ``busy`` by the whole machine (user + nice +
    system + steal of ``/proc/stat``'s ``cpu`` line: :func:`machine_busy`), ``own`` by this
    process and its descendants
    (utime + stime + cutime + cstime, so reaped children count); ``t`` monotonic seconds."""

    t: float
    busy: int
    own: int


def machine_busy(stat_text: str) -> int:
    """User + nice + system + steal ticks of ``/proc/stat``'s first (all-CPU) line.

    Steal (the 8th number, absent from kernels before 2.6.11) is time this virtual machine's
    CPUs were ready to run but the hypervisor ran another guest: the cluster waited as it would
    for another process here, so it counts as other processes' use (:func:`others_cores`). A
    run whose every role took twice its CPU per round, with no other process busy, was seen
    so."""
    f = stat_text.split("\n", 1)[0].split()
    if not f or f[0] != "cpu":
        raise ValueError(f"/proc/stat: unexpected first line {f[:3]}")
    return int(f[1]) + int(f[2]) + int(f[3]) + (int(f[8]) if len(f) > 8 else 0)


def tree_ticks(root: int, stats: dict[int, str]) -> int:
    """CPU ticks (utime + stime + cutime + cstime) of ``root`` and every descendant, from the
    text of each process's ``/proc/<pid>/stat`` (``stats``: pid -> text)."""
    kids: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for pid, text in stats.items():
        f = text[text.rfind(")") + 2:].split()  # fields from the state on (field 3)
        kids.setdefault(int(f[1]), []).append(pid)
        ticks[pid] = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(kids.get(pid, ()))
    return total


def cpu_sample() -> CpuSample | None:
    """The machine's and this process tree's CPU time now; None without ``/proc``."""
    try:
        busy = machine_busy(Path("/proc/stat").read_text())
    except OSError:
        return None
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stats[int(d)] = Path(f"/proc/{d}/stat").read_text()
            except OSError:  # the process ended meanwhile
                continue
    return CpuSample(time.monotonic(), busy, tree_ticks(os.getpid(), stats))


def others_cores(a: CpuSample | None, b: CpuSample | None) -> float | None:
    """Cores other processes used on average between two samples (never below 0); None when
    either sample is missing or no time passed."""
    if a is None or b is None or b.t <= a.t:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return max(0.0, ((b.busy - a.busy) - (b.own - a.own)) / tick / (b.t - a.t))


def wait_quiet(max_wait: float, window: float = 1.0) -> float | None:
    """Wait until other processes use under :data:`QUIET` cores over one ``window`` (seconds),
    at most ``max_wait`` seconds; return the last window's figure (None without ``/proc``)."""
    deadline = time.monotonic() + max_wait
    while True:
        a = cpu_sample()
        time.sleep(window)
        used = others_cores(a, cpu_sample())
        if used is None or used < QUIET or time.monotonic() >= deadline:
            return used


# -- cluster driver ------------------------------------------------------------------------------
def vm_hwm_kib(pid: int | str = "self") -> int:
    """Peak resident set size (``VmHWM`` of ``/proc/<pid>/status``) in KiB; 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _ended(q: _Proc) -> bool:
    """Whether ``q``'s process has exited (a zombie not reaped yet, or reaped), read without
    reaping it."""
    try:
        with open(f"/proc/{q.p.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return q.p.returncode is not None


def _server_failed(servers: list[tuple[str, _Proc]]) -> BenchFailed | None:
    """The failure of the first of ``servers`` (the controller, the relays) that has exited
    with an error, or None: waited for a second at most, as a rank notices its relay's or the
    controller's end a moment after it."""
    deadline = time.monotonic() + 1.0
    while True:
        for name, q in servers:
            if _ended(q) and q.reap(1.0) != 0:
                return exited(name, q.p.returncode, "".join(q.err))
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _rank_killed(ranks: list[_Proc]) -> BenchFailed | None:
    """The failure of the first of ``ranks`` that a signal ended, or None: a rank killed makes
    its peers fail after it (no averaged frame within their deadline), and the rank waited for
    can be such a peer."""
    for i, q in enumerate(ranks):
        if _ended(q) and q.reap(1.0) < 0:
            return exited(f"rank {i}", q.p.returncode, "".join(q.err))
    return None


def process_cpu_ns(pid: int) -> tuple[int, int] | None:
    """CPU time a process has used so far, two ways: the sum of its live threads' run time
    (``/proc/<pid>/task/*/schedstat``, nanoseconds, exact) and its whole CPU time in clock
    ticks (``/proc/<pid>/stat`` utime + stime: threads that have ended count too, but only to
    the tick). None when the process is gone or there is no ``/proc``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        f = text[text.rfind(")") + 2:].split()
        ticks = int(f[11]) + int(f[12])
        ns = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended meanwhile
                continue
    except (OSError, ValueError, IndexError):
        return None
    return ns, ticks


def cpu_between(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """Seconds of CPU a process used between two :func:`process_cpu_ns` samples: the threads'
    exact run time, unless the tick count grew by more than two ticks beyond it (threads that
    ended between the samples, e.g. a large record's helper threads): then the tick count.
    None when a sample is missing."""
    if a is None or b is None:
        return None
    tick = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
    exact = max(0, b[0] - a[0]) / 1e9
    ticks = max(0, b[1] - a[1]) * tick
    return ticks if ticks > exact + 2 * tick else exact


class _Proc:
    """A child process whose stdout and stderr are drained by threads (so a chatty child never
    blocks on a full pipe); ``first`` receives its first stdout line, ``lines`` every line;
    ``stdin`` is a pipe when asked for (:meth:`tell` writes a line to it)."""

    def __init__(self, args: list[str], env: dict[str, str], stdin: bool = False) -> None:
        self.p = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env,
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        self.out: list[str] = []
        self.err: list[str] = []
        self.first: queue.Queue[str] = queue.Queue()
        self.lines: queue.Queue[str] = queue.Queue()
        self.hwm_kib = 0
        assert self.p.stdout is not None and self.p.stderr is not None
        self._threads = [threading.Thread(target=self._drain, args=(self.p.stdout, self.out,
                                                                    True), daemon=True),
                         threading.Thread(target=self._drain, args=(self.p.stderr, self.err,
                                                                    False), daemon=True)]
        for t in self._threads:
            t.start()

    def _drain(self, stream: IO[str], sink: list[str], announce: bool) -> None:
        for line in stream:
            if announce and not sink:
                self.first.put(line)
            if announce:
                self.lines.put(line)
            sink.append(line)
        if announce and not sink:
            self.first.put("")
        if announce:
            self.lines.put("")  # end of output

    def next_line(self, what: str, timeout: float = 3600.0,
                  watch: Callable[[], BenchFailed | None] | None = None) -> str:
        """The child's next stdout line; ``BenchFailed`` when it ends its output first (or
        says nothing for ``timeout`` seconds), or the failure ``watch`` returns (asked every
        ``WATCH_PERIOD`` seconds while no line has come: a peer that died, whose end this child
        would only notice at its read deadline, 120 s x ``FLODL_NET_TIMEOUT_SCALE``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = queue_get(self.lines, max(0.0, min(WATCH_PERIOD if watch else timeout,
                                                          deadline - time.monotonic())))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise BenchFailed(f"{what}: no output for {timeout:g} s") from None
                failed = watch() if watch is not None else None
                if failed is not None:
                    raise failed from None
        if not line:
            raise exited(what, self.p.wait(timeout=60), "".join(self.err[-20:]))
        return line

    def tell(self) -> None:
        """Write one line to the child's stdin (a go-ahead); a child that is gone is ignored."""
        if self.p.stdin is not None:
            try:
                self.p.stdin.write("\n")
                self.p.stdin.flush()
            except OSError:
                pass

    def address(self, what: str, timeout: float = 60.0) -> str:
        """The address of the child's ``listening on ADDR`` first line."""
        try:
            line = queue_get(self.first, timeout)
        except queue.Empty:
            raise BenchFailed(f"{what}: no output") from None
        if not line.startswith("listening on "):
            time.sleep(0.2)
            raise BenchFailed(f"{what}: said {line!r} where 'listening on ADDR' was due")
        return line.split()[-1]

    def sample_hwm(self) -> None:
        """Take the child's peak RSS so far (``VmHWM``) while it runs. (Not ``ru_maxrss``: a
        child started by vfork inherits the bench's own peak into it.)"""
        if self.p.returncode is None:
            self.hwm_kib = max(self.hwm_kib, vm_hwm_kib(self.p.pid))

    def reap(self, timeout: float) -> int:
        """Wait for the exit (kill after ``timeout`` seconds); return the exit code (at once
        when it was reaped before)."""
        if self.p.returncode is not None:
            return self.p.returncode
        self.sample_hwm()
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() >= deadline:
                os.kill(self.p.pid, signal.SIGKILL)  # not Popen.kill: its poll() would reap
                deadline = float("inf")
            time.sleep(0.01)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        for t in self._threads:  # in steps: a signal either reader got runs its handler
            join_thread(t, 5.0)
        return self.p.returncode

    def kill(self) -> None:
        if self.p.returncode is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.reap(60.0)


@dataclass
class ClusterRun:
    """One configuration's measured rounds: ``times`` (seconds, the slowest rank's each round),
    ``stages`` (the traced rounds after the warm-up), ``rss_kib`` (peak RSS per role) and
    ``cpu`` (CPU seconds per measured round per role: the controller's, the mean of the
    relays' and the mean of the ranks'; a role whose CPU could not be sampled is absent)."""

    times: list[float]
    stages: list[stages.RoundStages] = field(default_factory=list)
    rss_kib: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)


def run_cluster(world: int, hosts: list[list[int]], nbytes: int, dtype: str, version: int,
                warmup: int, rounds: int, trace: bool = True) -> ClusterRun:
    """Run one configuration: controller, relays and ranks as processes; see :class:`ClusterRun`.
    Raises ``BenchFailed`` when a process fails or falls silent."""
    from flodl_proto.runner import stages

    with tempfile.TemporaryDirectory(prefix="flodl-round-") as tmp:
        env = dict(os.environ, FLODL_SESSION_SALT=os.urandom(16).hex())
        env.pop(stages.ENV, None)
        trace_path = Path(tmp) / "stages.tsv"
        if trace:
            env[stages.ENV] = str(trace_path)
        procs: list[tuple[str, _Proc]] = []
        done = threading.Event()
        try:
            ctrl = _Proc(["-m", "flodl_proto.cli", "controller", "--listen", "127.0.0.1:0",
                          "--world-size", str(world), "--protocol-version", str(version)], env)
            procs.append(("controller", ctrl))
            caddr = ctrl.address("controller")
            relay_of = {}
            relays = []
            for i, g in enumerate(hosts):
                r = _Proc(["-m", "flodl_proto.cli", "relay", "--controller", caddr, "--ranks",
                           ",".join(map(str, g)), "--world-size", str(world), "--listen-port",
                           "0", "--protocol-version", str(version), "--host", f"bench{i}"], env)
                procs.append((f"relay {i}", r))
                relays.append((r, g))
            for r, g in relays:
                addr = r.address("relay")
                for rank in g:
                    relay_of[rank] = addr
            def sample() -> None:  # the controller's and relays' peak RSS while they run
                while not done.wait(0.25):
                    for _, q in procs[:1 + len(hosts)]:
                        q.sample_hwm()

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            ranks = []
            for rank in range(world):
                cfg = {"rank": rank, "world": world, "relay": relay_of[rank], "nbytes": nbytes,
                       "dtype": dtype, "version": version, "warmup": warmup, "rounds": rounds,
                       "pause": True}
                p = _Proc([str(Path(__file__).resolve()), "--worker", json.dumps(cfg)], env,
                          stdin=True)
                procs.append(("rank", p))
                ranks.append(p)
            # CPU per round: the controller and relays are sampled while every rank waits
            # after its warm-up and again after its last measured round (nothing else runs)
            servers = procs[:1 + len(hosts)]
            try:
                def killed() -> BenchFailed | None:
                    return _rank_killed(ranks)

                for i, p in enumerate(ranks):
                    p.next_line(f"rank {i}", watch=killed)  # "warm"
                before = [process_cpu_ns(q.p.pid) for _, q in servers]
                for p in ranks:
                    p.tell()
                reports = [json.loads(p.next_line(f"rank {i}", watch=killed))
                           for i, p in enumerate(ranks)]
                after = [process_cpu_ns(q.p.pid) for _, q in servers]
                for p in ranks:
                    p.tell()
                per_rank = []
                for rank, (p, report) in enumerate(zip(ranks, reports, strict=True)):
                    if p.reap(3600.0) != 0:
                        raise exited(f"rank {rank}", p.p.returncode, "".join(p.err))
                    per_rank.append(report["times"])
                    p.hwm_kib = report["hwm_kib"]
            except BenchFailed as e:  # a rank that failed because its relay, the controller or
                # a rank killed did: that one is named
                raise _server_failed(servers) or _rank_killed(ranks) or e from None
            used = [cpu_between(a, b) for a, b in zip(before, after, strict=True)]
            cpu: dict[str, float] = {"rank": statistics.mean(r["cpu"] for r in reports) / rounds}
            if used[0] is not None:
                cpu["controller"] = used[0] / rounds
            if used[1:] and all(u is not None for u in used[1:]):
                cpu["relay"] = statistics.mean(u for u in used[1:] if u is not None) / rounds
            done.set()
            sampler.join()
            for name, p in procs:
                if p.reap(60.0) != 0:
                    raise exited(name, p.p.returncode, "".join(p.err))
        finally:
            done.set()
            for _, p in procs:
                p.kill()
        rss: dict[str, int] = {}
        for name, p in procs:  # per role: "relay 0" and "relay 1" are both a relay
            role = name.split(" ")[0]
            rss[role] = max(rss.get(role, 0), p.hwm_kib)
        traced = (stages.breakdown(stages.read_trace(trace_path), skip=warmup)
                  if trace and trace_path.exists() else [])
        times = [max(ts) for ts in zip(*per_rank, strict=True)]
        return ClusterRun(times, traced, rss, cpu)


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


def gloo_round(world: int, nbytes: int, dtype: str, rounds: int) -> float | None:
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
    numel = nbytes // (2 if dtype == "bf16" else 4)
    ctx = tmp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_gloo_worker, args=(r, world, port, numel, dtype, rounds, q))
          for r in range(world)]
    for p in ps:
        p.start()
    res: list[tuple[int, list[float]]] = [q.get(timeout=3600) for _ in ps]
    for p in ps:
        p.join()
    per_round: list[float] = [max(ts) for ts in zip(*(r[1] for r in res), strict=True)]
    return statistics.median(per_round)


# -- rows and verdicts ---------------------------------------------------------------------------
def _hosts(world: int) -> list[list[int]]:
    h = 1 if world <= 2 else 2
    return [list(map(int, g)) for g in np.array_split(np.arange(world), h)]


def default_rounds(nbytes: int) -> tuple[int, int]:
    """(warm-up, measured) rounds by frame size: small frames need many rounds for a p95."""
    if nbytes < MiB:
        return 5, 50
    if nbytes < 64 * MiB:
        return 2, 20
    return (1, 5) if nbytes < 256 * MiB else (1, 3)


@dataclass
class Row:
    """One configuration's result: its cluster run, CPU floor (seconds), gloo's median (None
    without torch), other processes' CPU use during the run (cores; None without ``/proc``)
    and how many runs it took."""

    world: int
    hosts: list[list[int]]
    nbytes: int
    dtype: str
    run: ClusterRun
    floor: float
    gloo: float | None = None
    others: float | None = None
    attempts: int = 1
    shares: dict[str, float] = field(default_factory=dict)
    tcp_floor: float | None = None
    chain_floor: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.run.times)

    @property
    def p95(self) -> float:
        return p95(self.run.times)

    @property
    def disturbed(self) -> bool:
        return self.others is not None and self.others > QUIET

    @property
    def layout(self) -> str:
        return f"{len(self.hosts)} ({'+'.join(str(len(g)) for g in self.hosts)} ranks)"


def check(row: Row) -> tuple[str, bool, float, float] | None:
    """The row's target: (class, met, figure, second figure) or None when it has none.
    Classes: ``small`` (figure: median / upstream, second: p95 / median), ``4 MiB`` and
    ``large`` (figure: median / floor, second: 0)."""
    med = row.median
    if row.nbytes in (4 * KiB, 64 * KiB):
        up = UPSTREAM.get((row.world, row.nbytes))
        if up is None:
            return None
        spread = row.p95 / med
        return "small", med <= up and spread <= P95_SPREAD, med / up, spread
    ratio = med / row.floor
    if row.nbytes == 4 * MiB:
        return "4 MiB", ratio <= FLOOR_4M, ratio, 0.0
    if row.nbytes >= 64 * MiB:
        return "large", ratio <= FLOOR_LARGE, ratio, 0.0
    return None


def verdicts(rows: list[Row]) -> tuple[list[str], bool]:
    """The verdict lines (the range of the chain floor over the CPU floor of the rows of 4 MiB
    and more, one per target class that ran, a disturbance note, then ``targets met`` /
    ``TARGETS MISSED`` / ``no configuration with a target ran``) and whether all targets were
    met."""
    by: dict[str, list[tuple[bool, float, float]]] = {}
    for r in rows:
        c = check(r)
        if c is not None:
            by.setdefault(c[0], []).append(c[1:])
    lines = []
    chains = [r.chain_floor / r.floor for r in rows if r.nbytes >= 4 * MiB and r.chain_floor]
    if chains:
        lines.append(f"chain floor at >= 4 MiB: {min(chains):.2f} to {max(chains):.2f} x the CPU "
                     "floor (no round can take less than its chain floor)")
    if "small" in by:
        v = by["small"]
        lines.append(f"target 4 KiB and 64 KiB: median <= upstream and p95 <= {P95_SPREAD:g} x "
                     f"median: {'met' if all(ok for ok, *_ in v) else 'NOT met'} "
                     f"({sum(ok for ok, *_ in v)} of {len(v)} rows; worst median "
                     f"{max(a for _, a, _ in v):.2f} x upstream, worst p95 "
                     f"{max(b for *_, b in v):.2f} x median)")
    for cls, text, limit in (("4 MiB", "4 MiB", FLOOR_4M), ("large", ">= 64 MiB", FLOOR_LARGE)):
        if cls in by:
            v = by[cls]
            lines.append(f"target {text}: median <= {limit:g} x floor: "
                         f"{'met' if all(ok for ok, *_ in v) else 'NOT met'} "
                         f"({sum(ok for ok, *_ in v)} of {len(v)} rows; worst "
                         f"{max(a for _, a, _ in v):.2f})")
    bad = sum(r.disturbed for r in rows)
    if bad:
        lines.append(f"{bad} row(s) disturbed by other processes (> {QUIET:g} core) after every "
                     "rerun: marked !")
    met = bool(by) and all(ok for v in by.values() for ok, *_ in v)
    lines.append("targets met" if met else "TARGETS MISSED" if by
                 else "no configuration with a target ran")
    return lines, met


TABLE_HEADER = (
    "| W | hosts | frame | dtype | rounds | median | p95 | CPU floor | ratio | ratio, TCP floor "
    "| chain floor | ratio, chain floor | upstream | target "
    "| others | CPU ms/round ctl / relay / rank | CPU / floor share ctl / relay / rank "
    "| peak RSS MiB ctl / relay / rank | gloo |\n"
    "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
    "| --- | ---: | ---: | ---: | ---: | ---: |")


def cpu_cell(cpu: dict[str, float]) -> str:
    """``ctl / relay / rank`` CPU ms per round (``?`` for a role not sampled), e.g.
    ``0.41 / 0.38 / 0.21``; two decimals below 10 ms, one from there."""
    def ms(role: str) -> str:
        if role not in cpu:
            return "?"
        v = cpu[role] * 1e3
        return f"{v:.2f}" if v < 10 else f"{v:.1f}"

    return " / ".join(ms(k) for k in ("controller", "relay", "rank"))


def share_cell(cpu: dict[str, float], shares: dict[str, float]) -> str:
    """``ctl / relay / rank`` CPU per round over the role's share of the floor's work
    (:func:`role_floor_seconds`), e.g. ``1.21 / 1.43 / 1.10`` (``?``: not sampled, or no
    share)."""
    def ratio(role: str) -> str:
        if role not in cpu or not shares.get(role):
            return "?"
        return f"{cpu[role] / shares[role]:.2f}"

    return " / ".join(ratio(k) for k in ("controller", "relay", "rank"))


def format_row(row: Row) -> str:
    """The row's line of the results table."""
    up = UPSTREAM.get((row.world, row.nbytes))
    c = check(row)
    target = "-" if c is None else ("ok" if c[1] else "MISS")
    others = "n/a" if row.others is None else f"{row.others:.2f}" + (" !" if row.disturbed
                                                                     else "")
    if row.attempts > 1:
        others += f" ({row.attempts} runs)"
    rss = " / ".join(f"{row.run.rss_kib[k] / 1024:.0f}" if k in row.run.rss_kib else "?"
                     for k in ("controller", "relay", "rank"))
    return (f"| {row.world} | {row.layout} | {size_label(row.nbytes)} | {row.dtype} | "
            f"{len(row.run.times)} | {_ms(row.median)} | {_ms(row.p95)} | {_ms(row.floor)} | "
            f"{row.median / row.floor:.2f} | "
            f"{f'{row.median / row.tcp_floor:.2f}' if row.tcp_floor else '-'} | "
            f"{_ms(row.chain_floor) if row.chain_floor else '-'} | "
            f"{f'{row.median / row.chain_floor:.2f}' if row.chain_floor else '-'} | "
            f"{_ms(up) if up else '-'} | {target} | {others} | "
            f"{cpu_cell(row.run.cpu)} | {share_cell(row.run.cpu, row.shares)} | {rss} | "
            f"{_ms(row.gloo) if row.gloo is not None else 'n/a'} |")


STAGE_HEADER = (
    "| W | frame | dtype | traced median round | " + " | ".join(STAGE_COLUMNS) + " |\n"
    "| ---: | ---: | --- | ---: | " + " | ".join("---:" for _ in STAGE_COLUMNS) + " |")


def format_stages(row: Row) -> str:
    """The row's median traced round, each part in ms (``-`` for a part not traced)."""
    from flodl_proto.runner import stages

    med = stages.median_round(row.run.stages)
    if med is None:
        return (f"| {row.world} | {size_label(row.nbytes)} | {row.dtype} | not traced | "
                + " | ".join("-" for _ in STAGE_COLUMNS) + " |")
    parts = ordered_parts(med)

    def num(sec: float) -> str:
        return f"{sec * 1e3:.3f}" if abs(sec) < 0.01 else f"{sec * 1e3:.1f}"

    cells = [num(parts[label]) if label in parts else "-" for label, *_ in stages.SEGMENTS]
    return (f"| {row.world} | {size_label(row.nbytes)} | {row.dtype} | {num(med.total)} | "
            + " | ".join(cells) + " |")


def ordered_parts(med: stages.RoundStages) -> dict[str, float]:
    """``med``'s parts (label -> seconds), each stage's mark taken no later than the next
    stage's: a sender's mark after the receiver's (a party descheduled after its write, or the
    latest relay's fan-out ending after the last rank parsed its reply) is taken at the
    receiver's, as the bytes had left by then. Every part is then >= 0 and, as before, they add
    up to the round's total. A round with a part not traced keeps its parts as measured."""
    from flodl_proto.runner import stages

    parts = {label: sec for label, sec, _ in med.parts}
    labels = [label for label, *_ in stages.SEGMENTS]
    if any(label not in parts for label in labels):
        return parts
    marks = [0.0]  # each stage's time from the round's start, seconds
    for label in labels:
        marks.append(marks[-1] + parts[label])
    for i in range(len(marks) - 2, -1, -1):
        marks[i] = max(0.0, min(marks[i], marks[i + 1]))
    return {label: marks[i + 1] - marks[i] for i, label in enumerate(labels)}


STAGE_LEGEND = (
    "Stage breakdown of each row's median traced round, ms (the round from the last rank's "
    "send to the last rank's reply parsed; each stage's latest time over the parties): rank "
    "send; ->relay = rank send done to the relay's last deposit (wire, wake-up); relay fold = "
    "relay deposits to HostFrame sent; ->ctl = to the controller's last HostFrame; ctl = "
    "controller last HostFrame to Broadcast sent; ->relay = to the relay's Broadcast read; "
    "fan-out = relay Broadcast to fan-out done; ->rank = to the rank's reply parsed. A mark "
    "later than the next stage's (a sender descheduled after its write, or the latest relay's "
    "fan-out ending after the last reply was parsed) is taken at the next stage's, as the bytes "
    "had left by then, so no part is negative and the parts add up to the round.")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "flodl_proto"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (package modified)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    """Run the configurations chosen on the command line, print the table, the stage breakdown
    and the verdict lines. Returns the exit code: 0 when every target that ran was met, 1 when
    one was missed or no configuration with a target ran (``--no-verdict``: always 0)."""
    ap = Parser(prog="bench/round.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", type=config(WORKER_FIELDS), help=argparse.SUPPRESS)
    ap.add_argument("--full", action="store_true",
                    help="W = 2, 4, 8 and 4 KiB, 64 KiB, 1, 4, 64, 256 MiB")
    ap.add_argument("--worlds", type=listed(whole(1, world_max(), WORLD_WHY)), default=None,
                    help="comma-separated world sizes")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated frame sizes, e.g. 4k,64k,1m,4m,64m (bare: MiB)")
    ap.add_argument("--dtypes", type=listed(one_of(("f32", "bf16"))), default="f32,bf16",
                    help="comma-separated wire dtypes, f32 and/or bf16 (default f32,bf16)")
    # as the controller's and the relay's own option (ASCII digits: int() took '３' and '0_3')
    ap.add_argument("--protocol-version", type=whole_number, default=DEFAULT_VERSION,
                    choices=SUPPORTED_VERSIONS)
    ap.add_argument("--rounds", type=whole(1), default=None,
                    help="measured rounds (default 50 below 1 MiB, 20 below 64 MiB, 5, 3 at "
                    "256 MiB)")
    ap.add_argument("--warmup", type=whole(0), default=None, help="warm-up rounds (default 5 below "
                    "1 MiB, 2 below 64 MiB, else 1)")
    ap.add_argument("--max-wait", type=number(0, inclusive=True), default=120.0,
                    help="seconds to wait for a quiet machine before each configuration "
                    "(0: no wait)")
    ap.add_argument("--reruns", type=whole(0), default=2,
                    help="reruns of a configuration other processes disturbed")
    ap.add_argument("--time-budget", type=number(0, inclusive=False), default=None,
                    help="seconds; start no configuration after this (the rest is listed)")
    ap.add_argument("--no-trace", action="store_true", help="run without the stage trace")
    ap.add_argument("--note", default=None, type=results_note,
                    help="a sentence written above the table (one line: no line break, tab "
                         "or other character that is not printable; not a Markdown heading, "
                         "code fence or HTML block left open)")
    ap.add_argument("--write", action="store_true", help="write the table to bench/RESULTS.md")
    ap.add_argument("--no-verdict", action="store_true",
                    help="exit 0 even when a target is missed (exploration)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, worker_salt(ap))
        return 0
    worlds = args.worlds or ([2, 4, 8] if args.full else [2, 4])
    try:
        sizes = [parse_size(s) for s in (args.sizes or (
            "4k,64k,1m,4m,64m,256m" if args.full else "4k,64k,4m,64m")).split(",")]
    except ValueError as e:  # checked here: the default follows --full
        ap.error(option_message("--sizes", str(e)))
    dtypes = args.dtypes
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    os.environ.setdefault("FLODL_NET_TIMEOUT_SCALE", "1.0")
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    info = (f"{when}, commit {_commit()}, protocol v{args.protocol_version}, {cores} cores; "
            "single-core rates are re-measured before every configuration")
    print(info, flush=True)
    t_start = time.monotonic()
    all_rates: list[Rates] = []
    rows: list[Row] = []
    skipped: list[str] = []
    print(TABLE_HEADER, flush=True)
    for nbytes in sizes:
        warmup, rounds = default_rounds(nbytes)
        warmup = args.warmup if args.warmup is not None else warmup
        rounds = args.rounds if args.rounds is not None else rounds
        for world in worlds:
            hosts = _hosts(world)
            for dtype in dtypes:
                if (args.time_budget is not None
                        and time.monotonic() - t_start > args.time_budget):
                    skipped.append(f"W={world} {size_label(nbytes)} {dtype}")
                    continue
                for attempt in range(1, args.reruns + 2):
                    if args.max_wait > 0:
                        quiet = wait_quiet(args.max_wait)
                        if quiet is not None and quiet >= QUIET:
                            print(f"  (not quiet after {args.max_wait:g} s: others use "
                                  f"{quiet:.2f} core; running anyway)", flush=True)
                    rates = measure_rates()
                    a = cpu_sample()
                    run = run_cluster(world, hosts, nbytes, dtype, args.protocol_version, warmup,
                                      rounds, not args.no_trace)
                    others = others_cores(a, cpu_sample())
                    floor, _ = floor_seconds(world, hosts, nbytes, dtype, rates, cores)
                    row = Row(world, hosts, nbytes, dtype, run, floor, None, others, attempt,
                              role_floor_seconds(hosts, nbytes, dtype, rates),
                              tcp_floor_seconds(world, hosts, nbytes, dtype, rates, cores),
                              chain_floor_seconds(world, hosts, nbytes, dtype, rates, cores)[0])
                    if not row.disturbed or attempt == args.reruns + 1:
                        break
                    print(f"  (W={world} {size_label(nbytes)} {dtype} disturbed: others used "
                          f"{others:.2f} core; rerun)", flush=True)
                all_rates.append(rates)
                row.gloo = gloo_round(world, nbytes, dtype, rounds)
                rows.append(row)
                print(format_row(row), flush=True)
    if not all_rates:
        all_rates.append(measure_rates())
    med_rates = Rates(*(statistics.median(getattr(r, f) for r in all_rates)
                        for f in ("hash", "add_f32", "add_bf16", "scale_f32", "scale_bf16",
                                  "copy", "tcp")))
    rate_line = (f"median single-core rates (GB/s): hmac {med_rates.hash / 1e9:.2f}, add f32 "
                 f"{med_rates.add_f32 / 1e9:.2f}, add bf16 {med_rates.add_bf16 / 1e9:.2f}, "
                 f"scale f32 {med_rates.scale_f32 / 1e9:.2f}, scale bf16 "
                 f"{med_rates.scale_bf16 / 1e9:.2f}, copy {med_rates.copy / 1e9:.2f}, loopback "
                 f"TCP {med_rates.tcp / 1e9:.2f} (both ends' CPU); {cores} cores")
    print(rate_line, flush=True)
    stage_lines = [format_stages(r) for r in rows]
    print("\n" + STAGE_HEADER, *stage_lines, sep="\n", flush=True)
    notes = []
    if skipped:
        notes.append(f"Not run (time budget of {args.time_budget:g} s spent): "
                     + ", ".join(skipped) + ".")
        print(notes[-1], flush=True)
    lines, met = verdicts(rows)
    print(*lines, sep="\n", flush=True)
    if args.write:
        if args.note:
            notes.insert(0, args.note)
        _write_results(args.protocol_version, info, notes, rate_line,
                       [TABLE_HEADER, *(format_row(r) for r in rows)],
                       [STAGE_HEADER, *stage_lines], lines)
    return 0 if met or args.no_verdict else 1


def section_title(version: int) -> str:
    """The RESULTS.md section a run of ``version`` replaces."""
    return SECTION if version == 2 else f"## Round, protocol v{version} (bench/round.py)"


def _write_results(version: int, info: str, notes: list[str], rate_line: str,
                   table: list[str], stage_table: list[str], verdict: list[str]) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    title = section_title(version)
    section = "\n".join([
        title, "",
        "`python bench/round.py` — the Python cluster (controller, relays and ranks as separate "
        "processes on loopback); median and p95 of the measured rounds after the warm-up; the "
        "CPU floor is computed in the same run from single-core rates (see the script's "
        "docstring); ratio, TCP floor = the median over that floor with each TCP leg at the "
        "measured cost of a loopback TCP transfer (both ends' CPU) instead of two copies at the "
        "copy rate; chain floor = the same work split into the four steps a round runs one "
        "after the other (deposit, host frame, reduce, scatter), each step at least its "
        "longest chain of operations that cannot overlap (a MAC, the fold before it), so that "
        "no implementation on these cores does a round in less, and the ratio over it; "
        "upstream = upstream flodl's median round on the reference machine; others "
        "= other processes' CPU use during the configuration, the hypervisor's steal time "
        "included (cores; `!`: over 0.1 after every rerun); CPU ms/round = CPU time per "
        "measured round of the controller, of a relay (mean) and of a rank (mean), all "
        "threads; CPU / floor share = each of these over that role's "
        "share of the floor's work (the hashes, adds, scales and copies the floor counts for "
        "it, at the single-core rates); gloo is `n/a` when torch is not installed.", "",
        info + ".", "", *(n + "\n" for n in notes), rate_line + ".", "",
        *table, "", STAGE_LEGEND, "", *stage_table, "",
        "```", *verdict, "```", ""])
    start = text.find(title + "\n")
    if start >= 0:
        nxt = text.find("\n## ", start + len(title))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    run(main, "bench/round.py")

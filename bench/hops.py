#!/usr/bin/env python3
"""A small round's transport floor in Python: the round's socket hops alone, beside the cluster.

    python bench/hops.py                          # W = 2, 4, 8; 4 KiB and 64 KiB; 5 pairs
    python bench/hops.py --worlds 2 --sizes 4k --pairs 9

Each pair runs, one after the other on a quiet machine (the wait of ``bench/round.py``), two
configurations of the same world size, hosts and frame size:

- the bare chain: processes in the cluster's shape and with its threads (each rank a process;
  each host's relay a process with one reader thread per rank, whose last reader of a round
  writes the host's record upstream, and one reader of the controller, which writes the reply to
  every rank; the controller a process with one reader thread per relay, whose last reader of a
  round writes the Broadcast to every relay), each record written with one ``sendmsg`` on a
  blocking TCP_NODELAY loopback socket and read into a kept buffer, records of the protocol's
  lengths (:func:`record_lengths`: a rank frame of ``bench/round.py``'s 4 tensors, the HostFrame
  and Broadcast records around it), and no protocol work at all: no MAC, no fold, no parse, no
  state machine;
- the cluster of ``bench/round.py`` (``run_cluster``, untraced): this package's controller, relays
  and ranks.

Both take each round's time as the slowest rank's, as ``bench/round.py`` does. The table gives each
pair's medians, the median of the pairs' ratios (cluster over bare chain) and other processes' CPU
use during the pair. The bare chain is what a round of this architecture costs in CPython on this
machine before the protocol does anything: the part of the cluster's round above it is the
protocol's work and this package's layers; the part below it is the interpreter, the threads'
wake-ups and the kernel's TCP path. No upstream source: a measuring tool of this package.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import round as cluster
from _cli import WORLD_WHY, BenchFailed, listed, number, one_of, run, whole, world_max

from flodl_proto._oserr import os_reason
from flodl_proto.codec import Dtype, FrameTemplate, RoundKind
from flodl_proto.spec import LEN_PREFIX_LEN, MUX_HEADER_LEN


def record_lengths(nbytes: int, dtype: str) -> dict[str, int]:
    """The lengths (bytes) of a round's records in ``bench/round.py``'s frames of ``nbytes``
    payload bytes (its 4 tensors, f32 or bf16): a rank's and a reply's loopback blob (4-byte
    length prefix and the frame), the HostFrame and Broadcast records (25-byte mux header and the
    frame)."""
    element = 2 if dtype == "bf16" else 4
    wire = Dtype.BF16 if dtype == "bf16" else Dtype.F32
    per = nbytes // cluster.TENSORS // element
    frame = FrameTemplate(RoundKind.MODEL, [(int(wire), (per,))] * cluster.TENSORS).wire_len
    return {"rank": LEN_PREFIX_LEN + frame, "host": MUX_HEADER_LEN + frame,
            "broadcast": MUX_HEADER_LEN + frame}


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True


#: seconds a bare-chain socket call may wait (a peer that died or stopped): kernel timeouts
#: (SO_RCVTIMEO, SO_SNDTIMEO), as the package's sockets have, so CPython makes each call as on a
#: blocking socket, with no poll before it
STALL = 30


def _stall_after(sock: socket.socket) -> socket.socket:
    tv = struct.pack("ll", STALL, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    return sock


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _stall_after(sock)


def _listen() -> socket.socket:
    srv = _stall_after(socket.socket())
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    return srv


class _Barrier:
    """The round's last arrival (among ``count`` readers) writes ``out`` to every socket of
    ``to``; the others return at once."""

    def __init__(self, count: int, to: list[socket.socket], out: bytes) -> None:
        self.count, self.to, self.out = count, to, out
        self.seen = 0
        self.done = 0  # rounds completed
        self.lock = threading.Lock()

    def arrive(self) -> None:
        with self.lock:
            self.seen += 1
            last = self.seen == self.count
            if last:
                self.seen = 0
                self.done += 1
                for s in self.to:
                    if s.sendmsg([self.out]) != len(self.out):
                        raise OSError("a record written in part (the peer stopped reading)")


def _reader(sock: socket.socket, size: int, barrier: _Barrier) -> None:
    """Read records of ``size`` bytes until end of stream; a failed read or write ends the
    process: one line on stderr, exit 1 (its peers then see the connection end, and end)."""
    view = memoryview(bytearray(size))
    try:
        while _recv_exact(sock, view):
            barrier.arrive()
    except OSError as e:
        _died(e)


def _died(e: OSError) -> NoReturn:
    role = sys.argv[sys.argv.index("--role") + 1] if "--role" in sys.argv else "?"
    print(f"bench/hops.py: bare-chain {role}: {os_reason(e)}", file=sys.stderr, flush=True)
    os._exit(1)


def _cpu_report(started: float, records: int) -> None:
    """A server's CPU seconds (all threads) from its first connection to its end, and the
    records one of its connections read (its rounds), as one JSON line."""
    print(json.dumps({"cpu": time.process_time() - started, "rounds": records}), flush=True)


def role_controller(relays: int, host: int, broadcast: int) -> None:
    """The bare chain's controller: print its port, take ``relays`` connections, read their
    ``host``-byte records and, once a round has one from each, write a ``broadcast``-byte record
    to every relay; at the end, print its CPU (:func:`_cpu_report`)."""
    srv = _listen()
    print(srv.getsockname()[1], flush=True)
    conns = [_nodelay(srv.accept()[0]) for _ in range(relays)]
    started = time.process_time()
    barrier = _Barrier(relays, conns, bytes(broadcast))
    threads = [threading.Thread(target=_reader, args=(c, host, barrier))
               for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _cpu_report(started, barrier.done)


def role_relay(port: int, ranks: int, rank: int, host: int, broadcast: int) -> None:
    """The bare chain's relay: dial the controller at ``port``, print its own port, take
    ``ranks`` connections, read their ``rank``-byte records and, once a round has one from
    each, write a ``host``-byte record upstream; each ``broadcast``-byte record from the
    controller is answered with a ``rank``-byte record to every rank; at the end, print its
    CPU."""
    up = _nodelay(socket.create_connection(("127.0.0.1", port)))
    srv = _listen()
    print(srv.getsockname()[1], flush=True)
    conns = [_nodelay(srv.accept()[0]) for _ in range(ranks)]
    started = time.process_time()
    barrier = _Barrier(ranks, [up], bytes(host))
    fan = _Barrier(1, conns, bytes(rank))  # every Broadcast: the replies
    threads = [threading.Thread(target=_reader, args=(c, rank, barrier))
               for c in conns]
    threads.append(threading.Thread(target=_reader,
                                    args=(up, broadcast, fan)))
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join()
    up.shutdown(socket.SHUT_RDWR)  # the ranks are gone: end the upstream reader and the
    threads[-1].join()  # controller's reader of this relay
    _cpu_report(started, barrier.done)


def role_rank(port: int, size: int, warmup: int, rounds: int) -> None:
    """The bare chain's rank: dial its relay at ``port``, then ``warmup`` + ``rounds`` times
    write a ``size``-byte record and read one back; print the measured rounds' times (seconds)
    and its CPU over them as one JSON line."""
    sock = _nodelay(socket.create_connection(("127.0.0.1", port)))
    frame = bytes(size)
    view = memoryview(bytearray(size))
    times = []
    cpu = 0.0
    for i in range(warmup + rounds):
        if i == warmup:
            cpu = time.process_time()
        t0 = time.perf_counter()
        try:
            sent = sock.sendmsg([frame])
            whole = sent == len(frame) and _recv_exact(sock, view)
        except OSError as e:
            _died(e)
        if not whole:
            _died(OSError("the relay closed the connection"))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"times": times, "cpu": time.process_time() - cpu}), flush=True)
    sock.close()


def _spawn(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--role", *map(str, args)],
                            stdout=subprocess.PIPE, text=True)


def bare_chain(hosts: list[list[int]], lengths: dict[str, int], warmup: int,
               rounds: int) -> tuple[list[float], dict[str, float]]:
    """The bare chain's rounds (seconds, the slowest rank's each round) and its CPU seconds per
    round by role (``controller``; ``relay`` and ``rank``: the mean of theirs), as
    ``bench/round.py``'s ``ClusterRun`` gives them (the servers' over every round, warm-up
    included; the ranks' over the measured rounds)."""
    procs = [_spawn("controller", len(hosts), lengths["host"], lengths["broadcast"])]
    try:
        cport = int(_line(procs[0]))
        relays, ranks = [], []
        for g in hosts:  # each process in procs as soon as it runs: a stop while the others
            # start (Ctrl-C, a failure) kills it too
            r = _spawn("relay", cport, len(g), lengths["rank"], lengths["host"],
                       lengths["broadcast"])
            relays.append(r)
            procs.append(r)
            rport = int(_line(r))
            for _ in g:
                ranks.append(_spawn("rank", rport, lengths["rank"], warmup, rounds))
                procs.append(ranks[-1])
        per_rank = [json.loads(_line(p)) for p in ranks]
        servers = [json.loads(_line(p)) for p in [procs[0], *relays]]
        for p in [procs[0], *relays, *ranks]:
            try:
                code = p.wait(STALL * 2)
            except subprocess.TimeoutExpired:
                raise BenchFailed(f"a bare-chain process did not end: {_role_of(p)}") from None
            if code != 0:
                raise BenchFailed(f"a bare-chain process failed (exit {p.returncode}): "
                                  f"{_role_of(p)}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    cpu = {"controller": servers[0]["cpu"] / servers[0]["rounds"],
           "relay": statistics.mean(s["cpu"] / s["rounds"] for s in servers[1:]),
           "rank": statistics.mean(r["cpu"] for r in per_rank) / rounds}
    return [max(ts) for ts in zip(*(r["times"] for r in per_rank), strict=True)], cpu


def _line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        raise BenchFailed(f"a bare-chain process ended early (its line above): {_role_of(p)}")
    return line


def _role_of(p: subprocess.Popen[str]) -> str:
    args = [str(a) for a in p.args]  # type: ignore[union-attr]
    return " ".join(args[args.index("--role") + 1:])


def _cpu_cell(cpu: dict[str, float]) -> str:
    # three decimals, where bench/round.py's cpu_cell gives two: a bare chain's role takes
    # some 0.03 ms a round
    return " / ".join(f"{cpu[k] * 1e3:.3f}" if k in cpu else "n/a"
                      for k in ("controller", "relay", "rank"))


def _size(text: str) -> int:
    try:
        return cluster.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/hops.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--worlds", type=listed(whole(1, world_max(), WORLD_WHY)),
                    default=[2, 4, 8], help="comma-separated world sizes (default 2,4,8)")
    ap.add_argument("--sizes", type=listed(_size), default=[4 * 1024, 64 * 1024],
                    help="comma-separated frame sizes, e.g. 4k,64k (default 4k,64k)")
    ap.add_argument("--dtype", type=one_of(("f32", "bf16")), default="f32",
                    help="the cluster's wire dtype, f32 or bf16 (default f32)")
    ap.add_argument("--rounds", type=whole(1), default=1500,
                    help="measured rounds a run (default 1500; 20 warm-up rounds before)")
    ap.add_argument("--pairs", type=whole(1), default=5, help="pairs a row (default 5)")
    ap.add_argument("--max-wait", type=number(0, inclusive=True), default=120.0,
                    help="seconds to wait for a quiet machine before each run (0: no wait)")
    args = ap.parse_args(argv)
    if args.role:  # a bare-chain process: the bench kills it (Ctrl-C reaches the bench alone)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # SIGTERM (often sent to the whole process group) ends it without a line: the bench
        # writes the run's one line
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        role, *rest = args.role
        nums = [int(x) for x in rest]
        try:  # a connection or an accept that fails (a peer gone, a socket timeout): one line
            if role == "controller":
                role_controller(*nums)
            elif role == "relay":
                role_relay(*nums)
            else:
                role_rank(*nums)
        except OSError as e:
            _died(e)
        return 0
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {cluster._commit()}, "
          f"{os.cpu_count()} cores, {args.dtype}, protocol v2, {args.rounds} rounds a run, "
          f"{args.pairs} pairs a row")
    print("| W | hosts | frame | bare chain, median of runs | cluster, median of runs | "
          "ratio (median of pairs) | ratios of the pairs | CPU ms/round ctl / relay / rank, "
          "bare chain | the same, cluster | others |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for world in args.worlds:
        hosts = cluster._hosts(world)
        for nbytes in args.sizes:
            bare, ours, ratios, others = [], [], [], []
            cpus: dict[str, list[dict[str, float]]] = {"bare": [], "ours": []}
            for i in range(args.pairs):
                order = ("bare", "ours") if i % 2 == 0 else ("ours", "bare")
                got: dict[str, float] = {}
                for which in order:
                    cluster.wait_quiet(args.max_wait)
                    a = cluster.cpu_sample()
                    if which == "bare":
                        times, cpu = bare_chain(hosts, record_lengths(nbytes, args.dtype), 20,
                                                args.rounds)
                    else:
                        result = cluster.run_cluster(world, hosts, nbytes, args.dtype, 2, 20,
                                                     args.rounds, trace=False)
                        times, cpu = result.times, result.cpu
                    got[which] = statistics.median(times)
                    cpus[which].append(cpu)
                    used = cluster.others_cores(a, cluster.cpu_sample())
                    if used is not None:
                        others.append(used)
                bare.append(got["bare"])
                ours.append(got["ours"])
                ratios.append(got["ours"] / got["bare"])
            med = {w: {k: statistics.median(c[k] for c in cs if k in c)
                       for k in ("controller", "relay", "rank") if any(k in c for c in cs)}
                   for w, cs in cpus.items()}
            busy = f"{max(others):.2f}" if others else "n/a"
            print(f"| {world} | {len(hosts)} | {cluster.size_label(nbytes)} | "
                  f"{statistics.median(bare) * 1e3:.3f} ms | "
                  f"{statistics.median(ours) * 1e3:.3f} ms | {statistics.median(ratios):.2f} | "
                  f"{' '.join(f'{r:.2f}' for r in ratios)} | {_cpu_cell(med['bare'])} | "
                  f"{_cpu_cell(med['ours'])} | {busy} |", flush=True)
    return 0


if __name__ == "__main__":
    run(main, "bench/hops.py")

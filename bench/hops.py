#!/usr/bin/env python3
"""A small round's transport floor in Python: the round's socket hops, bare and with the
protocol's minimum work, beside the cluster.

    python bench/hops.py                          # W = 2, 4, 8; 4 KiB and 64 KiB; 5 sets
    python bench/hops.py --worlds 2 --sizes 4k --pairs 9

Each set (``--pairs`` of them a row) runs, one after the other on a quiet machine (the wait of
``bench/round.py``) and in an order that turns from set to set, three configurations of the same
world size, hosts, frame size and dtype:

- the bare chain: processes in the cluster's shape and with its threads (each rank a process;
  each host's relay a process with one reader thread per rank, whose last reader of a round
  writes the host's record upstream, and one reader of the controller, which writes the reply to
  every rank; the controller a process with one reader thread per relay, whose last reader of a
  round writes the Broadcast to every relay), each record written with one ``sendmsg`` on a
  blocking TCP_NODELAY loopback socket and read into a kept buffer, records of the protocol's
  lengths (:func:`record_lengths`: a rank frame of ``bench/round.py``'s 4 tensors, the HostFrame
  and Broadcast records around it), and no protocol work at all: no MAC, no fold, no parse, no
  state machine;
- the lean chain: the same processes, threads and records, each party doing the protocol's
  minimum work on them in plain Python, NumPy and :mod:`hmac` (:class:`_Image`; a test checks
  its records against the codec): a rank scales its arrays by its weight into its frame's
  tensors (in the wire dtype), writes the weight and signs the frame, and checks the reply's
  tag, weight and layout before decoding its tensors into the arrays; a relay checks each rank
  frame's length prefix, tag, weight and layout, folds the round's frames in f32 into the
  HostFrame with the weights' sum and signs it (frame and record tags), and checks each
  Broadcast's header, record tag, weight and layout before writing its frame to every rank; the
  controller checks each HostFrame's header, both tags, weight and layout, sums the round's
  frames in f32, scales them by f32(1 / the weights' sum) into the Broadcast (bf16: rounded
  after the sum and again after the scale, as upstream) and signs it. No state machine, no
  error paths, no deaths or deadlines: what any implementation of this design in CPython must
  do a round, and no more (a rank that ends with arrays other than their mean fails the run);
- the cluster of ``bench/round.py`` (``run_cluster``, untraced): this package's controller, relays
  and ranks.

All take each round's time as the slowest rank's, as ``bench/round.py`` does. The table gives
each row's medians, the cluster's ratio to each chain (the median of the sets' ratios, then
each set's), CPU per round per role of each, and other processes' CPU use. The bare chain is
what a round of this architecture costs in CPython on this machine before the protocol does
anything; the lean chain, what it costs with the protocol's work done as leanly as CPython
allows; the cluster's distance above the lean chain is this package's own layers (its state
machines, checks, error paths and bookkeeping). No upstream source: a measuring tool of this
package.
"""
from __future__ import annotations

import argparse
import hmac
import inspect
import itertools
import json
import math
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

if __name__ == "__main__" and "--role" in sys.argv[1:]:
    # a bare-chain process: the bench kills it (Ctrl-C reaches the bench alone); ignored from
    # the start, before the imports below, as in main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import (
    TENSORS,
    WORLD_WHY,
    BenchFailed,
    Parser,
    listed,
    loading,
    number,
    one_of,
    run,
    whole,
    world_max,
)

# after _cli, which puts the checkout's package on the path when none is installed
from flodl_proto.commands._demo_report import exit_words

# Ctrl-C while the bench (not a bare-chain process: SIGTERM ends it without a line) imports
# NumPy and the codec: one line, not a traceback
with loading("bench/hops.py", __name__ == "__main__" and "--role" not in sys.argv[1:]):
    import numpy as np

    if __name__ != "__main__" or "--role" not in sys.argv[1:]:
        # not in a chain process: the cluster bench (ml_dtypes, the runner: about as long to
        # import as the rest) is the bench's own, and a chain has up to a dozen processes
        import round as cluster

    from flodl_proto._oserr import os_reason
    from flodl_proto.codec import Dtype, FrameTemplate, RecordKind, RoundKind
    from flodl_proto.codec.loopback import encode_len_prefix
    from flodl_proto.codec.mux import encode_mux_record_parts
    from flodl_proto.codec.structs import PACKED
    from flodl_proto.errors import shown
    from flodl_proto.spec import (
        AUTH_TAG_LEN,
        LEN_PREFIX_LEN,
        MUX_AUTH_COVERED_HEADER_LEN,
        MUX_HEADER_LEN,
        MUX_PROTOCOL_VERSION,
        MUX_RECORD_MAGIC,
        ROUND_FRAME_HEADER_LEN,
    )


def record_lengths(nbytes: int, dtype: str) -> dict[str, int]:
    """The lengths (bytes) of a round's records in ``bench/round.py``'s frames of ``nbytes``
    payload bytes (its 4 tensors, f32 or bf16): a rank's and a reply's loopback blob (4-byte
    length prefix and the frame), the HostFrame and Broadcast records (25-byte mux header and the
    frame)."""
    element = 2 if dtype == "bf16" else 4
    wire = Dtype.BF16 if dtype == "bf16" else Dtype.F32
    per = nbytes // TENSORS // element
    frame = FrameTemplate(RoundKind.MODEL, [(int(wire), (per,))] * TENSORS).wire_len
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
    print(f"bench/hops.py: {_chain_named(role)} {role.removeprefix('lean-')}: {os_reason(e)}",
          file=sys.stderr, flush=True)
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


def _rank_rounds(warmup: int, rounds: int, one_round: Callable[[], bool]) -> tuple[
        list[float], float]:
    """Run ``warmup`` + ``rounds`` rounds of a chain's rank (``one_round``: False when the relay
    closed the connection, which ends the process in one line, as an OSError does); return the
    measured rounds' times and the CPU over them (seconds)."""
    times = []
    cpu = 0.0
    for i in range(warmup + rounds):
        if i == warmup:
            cpu = time.process_time()
        t0 = time.perf_counter()
        try:
            whole = one_round()
        except OSError as e:
            _died(e)
        if not whole:
            _died(OSError("the relay closed the connection"))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times, time.process_time() - cpu


def _rank_report(times: list[float], cpu: float) -> None:
    print(json.dumps({"times": times, "cpu": cpu}), flush=True)


def role_rank(port: int, size: int, warmup: int, rounds: int) -> None:
    """The bare chain's rank: dial its relay at ``port``, then ``warmup`` + ``rounds`` times
    write a ``size``-byte record and read one back; print the measured rounds' times (seconds)
    and its CPU over them as one JSON line."""
    sock = _nodelay(socket.create_connection(("127.0.0.1", port)))
    frame = bytes(size)
    view = memoryview(bytearray(size))

    def one_round() -> bool:
        return sock.sendmsg([frame]) == len(frame) and _recv_exact(sock, view)

    _rank_report(*_rank_rounds(warmup, rounds, one_round))
    sock.close()


# -- the lean chain: the bare chain doing the protocol's minimum work a record ------------------
_HEADER = PACKED["MUX_HEADER"]
_F64 = struct.Struct("<d")
#: the lean chain's session salt (any 16 bytes)
SALT = bytes(range(16))


class _Image:
    """A record's buffer in a lean-chain process: ``lead`` bytes (a loopback length prefix or a
    mux header), then the frame of ``bench/round.py``'s 4 tensors of ``nbytes`` payload bytes in
    ``dtype``, its tag last; made from the codec's bytes of such a record (weight 1.0), with
    NumPy views of its tensors (``tensors``, in the wire dtype) and the bytes a reader that
    remembers a frame's layout compares (``regions``: the length prefix of a loopback blob, and
    every byte of the frame that is neither a payload, the weight nor the tag)."""

    def __init__(self, nbytes: int, dtype: str, kind: RecordKind | None) -> None:
        element = 2 if dtype == "bf16" else 4
        per = nbytes // TENSORS // element
        wire = Dtype.BF16 if dtype == "bf16" else Dtype.F32
        layout = [(int(wire), (per,))] * TENSORS
        plain = FrameTemplate(RoundKind.MODEL, layout)
        if kind is None:  # a loopback blob: the length prefix and the frame
            self.lead = LEN_PREFIX_LEN
            record = bytes(FrameTemplate(RoundKind.MODEL, layout,
                                         encode_len_prefix(plain.wire_len)).seal(1.0, SALT))
        else:
            self.lead = MUX_HEADER_LEN
            record = b"".join(bytes(b) for b in encode_mux_record_parts(
                kind, 0, [plain.seal(1.0, SALT)], SALT))
        self.buf = bytearray(record)
        self.view = memoryview(self.buf)
        whole = np.frombuffer(self.buf, np.uint8)
        image = np.frombuffer(plain.seal(1.0, SALT), np.uint8)
        starts = [self.lead + p.ctypes.data - image.ctypes.data for p in plain.payloads]
        size = per * element
        self.tensors = [whole[at:at + size].view(plain.payloads[0].dtype) for at in starts]
        #: the frame's weight (f64): after its magic, tensor count and kind
        self.weight_at = self.lead + ROUND_FRAME_HEADER_LEN + 1
        spans = [(self.lead, self.weight_at), (self.weight_at + _F64.size, starts[0])]
        spans += [(at + size, nxt) for at, nxt in itertools.pairwise(starts)]
        spans += [(starts[-1] + size, len(self.buf) - AUTH_TAG_LEN)]
        if kind is None:
            spans.insert(0, (0, LEN_PREFIX_LEN))
        self.regions = [(x, y, bytes(self.buf[x:y])) for x, y in spans if y > x]

    @property
    def weight(self) -> float:
        """The frame's weight."""
        w: float = _F64.unpack_from(self.buf, self.weight_at)[0]
        return w

    @weight.setter
    def weight(self, w: float) -> None:
        _F64.pack_into(self.buf, self.weight_at, w)

    def layout_ok(self) -> bool:
        """The remembered bytes (``regions``) unchanged, and the weight finite and not below
        0."""
        v = self.view
        return 0.0 <= self.weight < math.inf and all(v[x:y] == b for x, y, b in self.regions)

    def sign_frame(self) -> None:
        """Write the frame's tag (its bytes before the tag, the session salt)."""
        v = self.view
        v[-AUTH_TAG_LEN:] = hmac.digest(SALT, v[self.lead:-AUTH_TAG_LEN], "sha256")[
            :AUTH_TAG_LEN]

    def frame_ok(self) -> bool:
        """The frame's tag and its layout (:meth:`layout_ok`)."""
        v = self.view
        return (hmac.compare_digest(hmac.digest(SALT, v[self.lead:-AUTH_TAG_LEN], "sha256")[
            :AUTH_TAG_LEN], v[-AUTH_TAG_LEN:]) and self.layout_ok())

    def _record_tag(self) -> bytes:
        v = self.view
        m = hmac.new(SALT, v[:MUX_AUTH_COVERED_HEADER_LEN], "sha256")
        m.update(v[MUX_HEADER_LEN:])
        return m.digest()[:AUTH_TAG_LEN]

    def sign_record(self) -> None:
        """Write the frame's tag, then the record's (header bytes 0..17 and the payload)."""
        self.sign_frame()
        self.view[MUX_AUTH_COVERED_HEADER_LEN:MUX_HEADER_LEN] = self._record_tag()

    def record_ok(self, kind: RecordKind, inner: bool) -> bool:
        """The header's fields, the record's tag, the frame's layout and (``inner``) the frame's
        tag."""
        magic, version, got, _, length, tag = _HEADER.unpack_from(self.view, 0)
        return (magic == MUX_RECORD_MAGIC and version == MUX_PROTOCOL_VERSION and got == kind
                and length == len(self.buf) - MUX_HEADER_LEN
                and hmac.compare_digest(self._record_tag(), tag)
                and (self.frame_ok() if inner else self.layout_ok()))


def _fold(images: list[_Image], sums: list[np.ndarray]) -> float:
    """The fold: each tensor of ``images`` added, in f32, into ``sums``, in order; returns the
    weights' sum (f64, from -0.0, as upstream's)."""
    first, *rest = images
    for k, acc in enumerate(sums):
        if rest:
            np.add(first.tensors[k], rest[0].tensors[k], out=acc, dtype=np.float32)
        else:
            np.copyto(acc, first.tensors[k])
        for im in rest[1:]:
            np.add(acc, im.tensors[k], out=acc, dtype=np.float32)
    total = -0.0
    for im in images:
        total += im.weight
    return total


def _lean_server(conns: list[socket.socket], images: list[_Image],
                 arrived: Callable[[_Image], bool], done: Callable[[], None]) -> int:
    """Read each connection's records into its image on a thread of its own; a record that
    ``arrived`` refuses ends the process (one line); the round's last arrival calls ``done``
    under the round's lock. Returns the rounds done once every reader has ended."""
    lock = threading.Lock()
    state = [0, 0]  # arrivals this round, rounds done

    def reader(sock: socket.socket, image: _Image) -> None:
        try:
            while _recv_exact(sock, image.view):
                if not arrived(image):
                    raise OSError("a record failed its check")
                with lock:
                    state[0] += 1
                    if state[0] == len(conns):
                        state[0] = 0
                        state[1] += 1
                        done()
        except OSError as e:
            _died(e)

    threads = [threading.Thread(target=reader, args=ci) for ci in zip(conns, images, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return state[1]


def _send_whole(sock: socket.socket, buffers: list[Any]) -> None:
    if sock.sendmsg(buffers) != sum(len(b) for b in buffers):
        raise OSError("a record written in part (the peer stopped reading)")


def _sums_for(out: _Image) -> list[np.ndarray]:
    """Where a fold of ``out``'s dtype sums: ``out``'s own f32 tensors, or f32 arrays beside its
    bf16 ones (the sum is then rounded into them)."""
    if out.tensors[0].dtype == np.float32:
        return out.tensors
    return [np.empty(t.shape, np.float32) for t in out.tensors]


def lean_controller(relays: int, nbytes: int, dtype: str) -> None:
    """The lean chain's controller: as :func:`role_controller`, and each HostFrame's header,
    record tag, frame tag, weight and layout checked; the round's frames summed in f32 (the sum
    rounded to the wire dtype), scaled by f32(1 / the weights' sum) into the Broadcast's frame
    (rounded again), its weight and two tags written."""
    srv = _listen()
    print(srv.getsockname()[1], flush=True)
    conns = [_nodelay(srv.accept()[0]) for _ in range(relays)]
    started = time.process_time()
    images = [_Image(nbytes, dtype, RecordKind.HOST_FRAME) for _ in conns]
    out = _Image(nbytes, dtype, RecordKind.BROADCAST)
    sums = _sums_for(out)

    def done() -> None:
        weight = _fold(images, sums)
        inv = np.float32(1.0 / weight) if weight > 0.0 else None
        for acc, t in zip(sums, out.tensors, strict=True):
            if acc is not t:  # bf16: the sum is rounded, then widened, scaled, rounded again
                np.copyto(t, acc, casting="unsafe")
            if inv is not None:
                np.multiply(t, inv, out=t, dtype=np.float32, casting="unsafe")
        out.weight = weight
        out.sign_record()
        for c in conns:
            _send_whole(c, [out.buf])

    rounds = _lean_server(conns, images, lambda im: im.record_ok(RecordKind.HOST_FRAME, True),
                          done)
    _cpu_report(started, rounds)


def lean_relay(port: int, ranks: int, nbytes: int, dtype: str) -> None:
    """The lean chain's relay: as :func:`role_relay`, and each rank's length prefix, frame
    tag, weight and layout checked; the round's frames summed in f32 into the HostFrame's frame
    (rounded to the wire dtype), its weight (the weights' sum) and two tags written; each
    Broadcast's header, record tag, weight and layout checked before its frame goes to every
    rank behind a length prefix."""
    up = _nodelay(socket.create_connection(("127.0.0.1", port)))
    srv = _listen()
    print(srv.getsockname()[1], flush=True)
    conns = [_nodelay(srv.accept()[0]) for _ in range(ranks)]
    started = time.process_time()
    images = [_Image(nbytes, dtype, None) for _ in conns]
    out = _Image(nbytes, dtype, RecordKind.HOST_FRAME)
    sums = _sums_for(out)
    broadcast = _Image(nbytes, dtype, RecordKind.BROADCAST)
    prefix = bytes(images[0].buf[:LEN_PREFIX_LEN])

    def done() -> None:
        weight = _fold(images, sums)
        for acc, t in zip(sums, out.tensors, strict=True):
            if acc is not t:
                np.copyto(t, acc, casting="unsafe")
        out.weight = weight
        out.sign_record()
        _send_whole(up, [out.buf])

    def fan_out() -> None:
        try:
            while _recv_exact(up, broadcast.view):
                if not broadcast.record_ok(RecordKind.BROADCAST, False):
                    raise OSError("a Broadcast failed its check")
                for c in conns:
                    _send_whole(c, [prefix, broadcast.view[MUX_HEADER_LEN:]])
        except OSError as e:
            _died(e)

    upstream = threading.Thread(target=fan_out)
    upstream.start()
    rounds = _lean_server(conns, images, _Image.frame_ok, done)
    up.shutdown(socket.SHUT_RDWR)
    upstream.join()
    _cpu_report(started, rounds)


#: the weight (realized-work mass) each lean-chain rank sends: the consensus of ranks whose
#: arrays are all ones stays all ones, round after round
LEAN_WEIGHT = 1.0


def lean_rank(port: int, nbytes: int, dtype: str, warmup: int, rounds: int) -> None:
    """The lean chain's rank: as :func:`role_rank`, and each round its 4 f32 arrays (all ones)
    scaled by f32(its weight) into the frame's tensors (rounded to the wire dtype), the weight
    and the frame's tag written; the reply's length prefix, tag, weight and layout checked and,
    its weight above 0, its tensors decoded into the arrays."""
    sock = _nodelay(socket.create_connection(("127.0.0.1", port)))
    frame, reply = _Image(nbytes, dtype, None), _Image(nbytes, dtype, None)
    arrays = [np.ones(t.shape, np.float32) for t in frame.tensors]
    scale = np.float32(LEAN_WEIGHT)

    def one_round() -> bool:
        for a, t in zip(arrays, frame.tensors, strict=True):
            np.multiply(a, scale, out=t, casting="unsafe")
        frame.weight = LEAN_WEIGHT
        frame.sign_frame()
        _send_whole(sock, [frame.buf])
        if not _recv_exact(sock, reply.view):
            return False
        if not reply.frame_ok():
            raise OSError("a reply failed its check")
        if reply.weight > 0.0:
            for a, t in zip(arrays, reply.tensors, strict=True):
                np.copyto(a, t)
        return True

    times, cpu = _rank_rounds(warmup, rounds, one_round)
    if not all(np.allclose(a, 1.0, rtol=1e-3, atol=0.0) for a in arrays):  # a fault of the work
        _died(OSError("the consensus is not the ranks' mean"))
    _rank_report(times, cpu)
    sock.close()


def _spawn(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--role", *map(str, args)],
                            stdout=subprocess.PIPE, text=True)


def bare_chain(hosts: list[list[int]], lengths: dict[str, int], warmup: int,
               rounds: int, *, lean: tuple[int, str] | None = None
               ) -> tuple[list[float], dict[str, float]]:
    """The bare chain's rounds (seconds, the slowest rank's each round) and its CPU seconds per
    round by role (``controller``; ``relay`` and ``rank``: the mean of theirs), as
    ``bench/round.py``'s ``ClusterRun`` gives them (the servers' over every round, warm-up
    included; the ranks' over the measured rounds). With ``lean`` (the frame's payload bytes
    and its dtype, those ``lengths`` were computed for): the lean chain's (:func:`lean_controller`,
    :func:`lean_relay`, :func:`lean_rank`), whose records have the same lengths."""
    if lean is None:
        ctl: tuple[object, ...] = ("controller", len(hosts), lengths["host"],
                                   lengths["broadcast"])

        def relay(n: int, port: int) -> tuple[object, ...]:
            return ("relay", port, n, lengths["rank"], lengths["host"], lengths["broadcast"])

        def rank(port: int) -> tuple[object, ...]:
            return ("rank", port, lengths["rank"], warmup, rounds)
    else:
        nbytes, dtype = lean
        ctl = ("lean-controller", len(hosts), nbytes, dtype)

        def relay(n: int, port: int) -> tuple[object, ...]:
            return ("lean-relay", port, n, nbytes, dtype)

        def rank(port: int) -> tuple[object, ...]:
            return ("lean-rank", port, nbytes, dtype, warmup, rounds)
    procs = [_spawn(*ctl)]
    try:
        cport = int(_line(procs[0]))
        relays, ranks = [], []
        for g in hosts:  # each process in procs as soon as it runs: a stop while the others
            # start (Ctrl-C, a failure) kills it too
            r = _spawn(*relay(len(g), cport))
            relays.append(r)
            procs.append(r)
            rport = int(_line(r))
            for _ in g:
                ranks.append(_spawn(*rank(rport)))
                procs.append(ranks[-1])
        per_rank = [json.loads(_line(p)) for p in ranks]
        servers = [json.loads(_line(p)) for p in [procs[0], *relays]]
        for p in [procs[0], *relays, *ranks]:
            try:
                code = p.wait(STALL * 2)
            except subprocess.TimeoutExpired:
                raise BenchFailed(f"a {_chain_of(p)} process did not end: {_role_of(p)}"
                                  ) from None
            if code != 0:
                raise BenchFailed(f"a {_chain_of(p)} process failed (it {exit_words(code)}): "
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
        try:
            code = p.wait(STALL * 2)
        except subprocess.TimeoutExpired:
            how = "its output closed"
        else:  # a signal (SIGTERM, SIGKILL) ends a chain process without a line of its own
            how = f"it {exit_words(code)}" + (", its line above" if code >= 0 else "")
        raise BenchFailed(f"a {_chain_of(p)} process ended early ({how}): {_role_of(p)}")
    return line


def _role_of(p: subprocess.Popen[str]) -> str:
    args = [str(a) for a in p.args]  # type: ignore[union-attr]
    return " ".join(args[args.index("--role") + 1:])


def _chain_named(role: str) -> str:
    """``lean-chain`` for a role of the lean chain (``lean-...``), else ``bare-chain``."""
    return "lean-chain" if role.startswith("lean-") else "bare-chain"


def _chain_of(p: subprocess.Popen[str]) -> str:
    """The chain (:func:`_chain_named`) of a process the bench started."""
    return _chain_named(_role_of(p))


def _cpu_cell(cpu: dict[str, float]) -> str:
    # three decimals, where bench/round.py's cpu_cell gives two: a bare chain's role takes
    # some 0.03 ms a round
    return " / ".join(f"{cpu[k] * 1e3:.3f}" if k in cpu else "n/a"
                      for k in ("controller", "relay", "rank"))


def _ratio_cell(ratios: list[float]) -> str:
    """The median of a row's ratios, then each set's."""
    return f"{statistics.median(ratios):.2f} ({' '.join(f'{r:.2f}' for r in ratios)})"


#: the bare-chain processes' roles, by the name ``--role`` gives
ROLES: dict[str, Callable[..., None]] = {
    "controller": role_controller, "relay": role_relay, "rank": role_rank,
    "lean-controller": lean_controller, "lean-relay": lean_relay, "lean-rank": lean_rank}


def role_call(words: list[str]) -> tuple[Callable[..., None], list[Any]]:
    """The role function of ``--role NAME VALUE...`` (:data:`ROLES`) and its arguments: each a
    whole number where the function takes an ``int``, a wire dtype (``f32``, ``bf16``) where it
    takes a ``str``. ``ValueError`` naming the word for an unknown role, a count of values the
    function does not take, or a value of the wrong kind."""
    name, *rest = words
    if name not in ROLES:
        raise ValueError(f"expected one of {', '.join(ROLES)}, got {shown(name)}")
    role = ROLES[name]
    params = list(inspect.signature(role).parameters.values())
    if len(rest) != len(params):
        raise ValueError(f"{name} takes {len(params)} values "
                         f"({' '.join(p.name.upper() for p in params)}), got {len(rest)}")
    values: list[Any] = []
    for param, text in zip(params, rest, strict=True):
        if param.annotation in ("int", int):
            if not (text.isascii() and text.isdigit()):
                raise ValueError(f"{name} {param.name.upper()}: expected a whole number, got "
                                 f"{shown(text)}")
            if param.name in ("relays", "ranks") and int(text) < 1:  # a server of no peer
                raise ValueError(f"{name} {param.name.upper()}: expected a whole number >= 1, "
                                 f"got {shown(text)}")
            values.append(int(text))
        elif text not in ("f32", "bf16"):
            raise ValueError(f"{name} {param.name.upper()}: expected f32 or bf16, got "
                             f"{shown(text)}")
        else:
            values.append(text)
    return role, values


def _size(text: str) -> int:
    try:
        return cluster.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="bench/hops.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--worlds", type=listed(whole(1, world_max(), WORLD_WHY)),
                    default=[2, 4, 8], help="comma-separated world sizes (default 2,4,8)")
    ap.add_argument("--sizes", type=listed(_size), default=[4 * 1024, 64 * 1024],
                    help="comma-separated frame sizes, e.g. 4k,64k (default 4k,64k)")
    ap.add_argument("--dtype", type=one_of(("f32", "bf16")), default="f32",
                    help="the cluster's wire dtype, f32 or bf16 (default f32)")
    ap.add_argument("--rounds", type=whole(1), default=1500,
                    help="measured rounds a run (default 1500; 20 warm-up rounds before)")
    ap.add_argument("--pairs", type=whole(1), default=5,
                    help="sets of the three configurations a row (default 5)")
    ap.add_argument("--max-wait", type=number(0, inclusive=True), default=120.0,
                    help="seconds to wait for a quiet machine before each run (0: no wait)")
    args = ap.parse_args(argv)
    if args.role:  # a bare-chain process: the bench kills it (Ctrl-C reaches the bench alone)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # SIGTERM (often sent to the whole process group) ends it without a line: the bench
        # writes the run's one line
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            role, values = role_call(args.role)
        except ValueError as e:
            from flodl_proto.commands._option_error import option_message

            ap.error(option_message("--role", str(e)))
        try:  # a connection or an accept that fails (a peer gone, a socket timeout): one line
            role(*values)
        except OSError as e:
            _died(e)
        return 0
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {cluster._commit()}, "
          f"{os.cpu_count()} cores, {args.dtype}, protocol v2, {args.rounds} rounds a run, "
          f"{args.pairs} sets a row")
    print("| W | hosts | frame | bare chain | lean chain | cluster | cluster / bare "
          "(of each set) | cluster / lean (of each set) | CPU ms/round ctl / relay / rank: "
          "bare | lean | cluster | others |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    chains = ("bare", "lean", "ours")
    for world in args.worlds:
        hosts = cluster._hosts(world)
        for nbytes in args.sizes:
            lengths = record_lengths(nbytes, args.dtype)
            medians: dict[str, list[float]] = {w: [] for w in chains}
            cpus: dict[str, list[dict[str, float]]] = {w: [] for w in chains}
            others: list[float] = []
            for i in range(args.pairs):
                for which in chains[i % 3:] + chains[:i % 3]:  # each set in another order
                    cluster.wait_quiet(args.max_wait)
                    a = cluster.cpu_sample()
                    if which == "ours":
                        result = cluster.run_cluster(world, hosts, nbytes, args.dtype, 2, 20,
                                                     args.rounds, trace=False)
                        times, cpu = result.times, result.cpu
                    else:
                        times, cpu = bare_chain(
                            hosts, lengths, 20, args.rounds,
                            lean=(nbytes, args.dtype) if which == "lean" else None)
                    medians[which].append(statistics.median(times))
                    cpus[which].append(cpu)
                    used = cluster.others_cores(a, cluster.cpu_sample())
                    if used is not None:
                        others.append(used)
            med = {w: {k: statistics.median(c[k] for c in cs if k in c)
                       for k in ("controller", "relay", "rank") if any(k in c for c in cs)}
                   for w, cs in cpus.items()}
            ratios = {w: [o / x for o, x in zip(medians["ours"], medians[w], strict=True)]
                      for w in ("bare", "lean")}
            busy = f"{max(others):.2f}" if others else "n/a"
            print(f"| {world} | {len(hosts)} | {cluster.size_label(nbytes)} | "
                  + " | ".join(f"{statistics.median(medians[w]) * 1e3:.3f} ms" for w in chains)
                  + " | " + " | ".join(_ratio_cell(r) for r in ratios.values())
                  + " | " + " | ".join(_cpu_cell(med[w]) for w in chains)
                  + f" | {busy} |", flush=True)
    return 0


if __name__ == "__main__":
    run(main, "bench/hops.py")

"""The relay's small-round path against hostile or broken peers: a rank that sends its blob a
byte at a time, stalls inside it, packs two blobs into one segment, closes inside one or claims a
length above the ceiling; a controller that packs two records into one segment; a rank that stops
reading its Broadcasts (the others still get theirs, and the stalled one is dropped, never fed
the next Broadcast after a cut one). Plus the fold's planned completion against layouts that
change, elided tensors and mixed dtypes.

Ephemeral ports only; ``FLODL_NET_TIMEOUT_SCALE=0.1`` (conftest); every wait has a deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from flodl_proto.codec import (
    DeclareDead,
    Dtype,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    TensorPayload,
    decode_round_frame,
    encode_frame_record,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from flodl_proto.errors import SchemaMismatch
from flodl_proto.reduce import HostFold
from flodl_proto.runner import _netio, _netio_send
from flodl_proto.runner.relay import Relay

from .cli_util import close_and_drain
from .cluster_util import (
    SALT,
    ControllerConn,
    FakeController,
    RawRank,
    frame,
    leak_guard,
    recv_exact,
    small_relay_send_buffers,
    values,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    with leak_guard():
        yield


def _blob(f: RoundFrame) -> bytes:
    body = encode_round_frame_bytes(f, SALT)
    return len(body).to_bytes(4, "little") + body


def _two_ranks(ctrl: FakeController, rcvbuf: int | None = None
               ) -> tuple[Relay, list[RawRank], ControllerConn]:
    relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0, host="h0").start()
    ranks = []
    for r in range(2):
        rr = RawRank.__new__(RawRank)
        s = socket.socket()
        if rcvbuf is not None and r == 0:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(20.0)
        s.connect(relay.address)
        rr.sock = s
        assert len(rr.handshake(r, 2)) == 8
        ranks.append(rr)
    conn = ctrl.accept()
    conn.handshake()
    return relay, ranks, conn


def _close(relay: Relay, ranks: list[RawRank]) -> None:
    relay.shutdown()
    for rr in ranks:
        rr.close()


def test_a_blob_sent_a_byte_at_a_time_and_stalled_midway_is_read_whole() -> None:
    with FakeController() as ctrl:
        relay, (r0, r1), conn = _two_ranks(ctrl)
        try:
            r0.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = _blob(frame([1.0, 2.0, 3.0], weight=1.0))
            for i, b in enumerate(data):
                r0.sock.sendall(bytes([b]))
                if i in (2, len(data) // 2):
                    time.sleep(0.35)  # a stall longer than the relay's read poll, prefix and body
            r1.send_frame(frame([10.0, 20.0, 30.0], weight=2.0))
            rec = conn.read_record()
            assert rec is not None and rec.kind is RecordKind.HOST_FRAME
            f = rec.frame(SALT)
            assert (values(f), f.weight) == ([[11.0, 22.0, 33.0]], 3.0)
        finally:
            _close(relay, [r0, r1])


def test_two_blobs_in_one_segment_are_two_rounds() -> None:
    """A rank's round-1 blob and round-2 blob in one write: the one-read blob path takes exactly
    its length, the next blob's bytes stay for the next read."""
    with FakeController() as ctrl:
        relay, (r0, r1), conn = _two_ranks(ctrl)
        try:
            r1.send_frame(frame([1.0, 1.0], weight=1.0))
            wait_until(lambda: 1 in relay.fold.deposited)  # else rank 0's two would be one round
            r0.sock.sendall(_blob(frame([2.0, 2.0], weight=1.0))
                            + _blob(frame([5.0, 7.0], weight=1.0)))
            rec = conn.read_record()
            assert rec is not None and values(rec.frame(SALT)) == [[3.0, 3.0]]
            r1.send_frame(frame([1.0, 2.0], weight=3.0))
            rec = conn.read_record()
            assert rec is not None
            f = rec.frame(SALT)
            assert (values(f), f.weight) == ([[6.0, 9.0]], 4.0)
            assert relay.error is None
        finally:
            _close(relay, [r0, r1])


def test_two_controller_records_in_one_segment_are_both_handled() -> None:
    """A Broadcast and a DeclareDead in one segment: the Broadcast reaches the alive ranks, then
    rank 1 is out of the barrier (rank 0's next frame alone completes the round)."""
    with FakeController() as ctrl:
        relay, (r0, r1), conn = _two_ranks(ctrl)
        try:
            r0.send_frame(frame([1.0], weight=1.0))
            r1.send_frame(frame([2.0], weight=1.0))
            assert conn.read_record() is not None
            consensus = frame([1.5], weight=2.0)
            parts = encode_frame_record(RecordKind.BROADCAST, consensus, SALT)
            dd = encode_mux_record_bytes(MuxRecord.control_msg(DeclareDead(1), 2), SALT)
            conn.sock.sendall(b"".join(bytes(p) for p in parts) + dd)
            payload = encode_round_frame_bytes(consensus, SALT)
            assert r0.read_reply() == payload and r1.read_reply() == payload
            r0.send_frame(frame([4.0], weight=1.0))
            rec = conn.read_record()
            assert rec is not None and values(rec.frame(SALT)) == [[4.0]]
        finally:
            _close(relay, [r0, r1])


@pytest.mark.parametrize("how", ["closed inside the blob", "length above the ceiling"])
def test_a_rank_that_breaks_its_stream_leaves_and_the_round_ships(how: str) -> None:
    with FakeController() as ctrl:
        relay, (r0, r1), conn = _two_ranks(ctrl)
        try:
            r1.send_frame(frame([2.0, 4.0], weight=1.0))
            if how == "closed inside the blob":
                r0.sock.sendall(_blob(frame([1.0, 1.0]))[:20])
            else:
                r0.sock.sendall((relay.ceiling + 1).to_bytes(4, "little") + bytes(64))
            r0.sock.shutdown(socket.SHUT_WR)
            got = [conn.read_record(), conn.read_record()]
            kinds = sorted(str(r.kind) for r in got if r is not None)
            assert len(kinds) == 2
            host = next(r for r in got if r is not None and r.kind is RecordKind.HOST_FRAME)
            exit_ = next(r for r in got if r is not None and r.kind is RecordKind.CONTROL)
            assert values(host.frame(SALT)) == [[2.0, 4.0]]  # rank 1's frame alone
            assert exit_.control == RankExit(0)
            assert relay.error is None
        finally:
            _close(relay, [r0, r1])


def _slow_rank_round(conn: ControllerConn, ranks: list[RawRank], size: int) -> bytes:
    for r, rr in enumerate(ranks):
        rr.send_frame(frame([float(r)], weight=1.0))
    rec = conn.read_record()
    assert rec is not None and rec.kind is RecordKind.HOST_FRAME
    big = RoundFrame(0, 2.0, [TensorPayload(Dtype.F32, [size // 4], bytes(size))])
    return conn.broadcast(big)


def test_a_rank_that_stops_reading_delays_nobody_and_is_dropped_whole(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Rank 0 never reads its Broadcasts (small socket buffers): rank 1 gets the Broadcast
    before rank 0's write gives up (the fan-out does not make it wait out rank 0's write-stall
    deadline), and once rank 0's write has failed inside a Broadcast, rank 0 is dropped: its
    connection closed, RankExit upstream, and never the next Broadcast after the cut one."""
    small_relay_send_buffers(monkeypatch)
    # a write-stall deadline of 6 s: rank 1's reader has that long, even on a loaded machine;
    # and no TCP_USER_TIMEOUT within the test (it would reset rank 0's stalled connection)
    monkeypatch.setattr(_netio, "write_stall_timeout", lambda: 6.0)  # SO_SNDTIMEO
    monkeypatch.setattr(_netio_send, "write_stall_timeout", lambda: 6.0)  # send_all's deadline
    monkeypatch.setattr(_netio, "keepalive_bound", lambda: 120.0)
    size = 256 << 10  # below the parallel fan-out size: the targets are written in turn
    with FakeController() as ctrl:
        relay, ranks, conn = _two_ranks(ctrl, rcvbuf=4096)
        r0, r1 = ranks
        failed = threading.Event()
        real_failed = relay._broadcast_failed

        def spy(rank: int, error: OSError) -> None:
            failed.set()
            real_failed(rank, error)

        relay._broadcast_failed = spy  # type: ignore[method-assign]
        try:
            payload = _slow_rank_round(conn, ranks, size)
            assert r1.read_reply() == payload
            assert not failed.is_set()  # rank 1 was written before rank 0's write gave up
            assert failed.wait(20)
            # rank 0 reads again: what was written before the cut, then the end of the stream
            # (a connection left open would next carry a Broadcast after the cut one)
            r0.sock.settimeout(10.0)
            stream = b""
            while chunk := r0.sock.recv(1 << 20):
                stream += chunk
            whole = len(payload).to_bytes(4, "little") + payload
            assert 0 < len(stream) < len(whole) and whole.startswith(stream)
            # said at the default level (the stream was closed after the line was logged)
            [line] = [r for r in caplog.records if "broadcast to rank" in r.getMessage()]
            assert line.levelname == "WARNING"
            assert line.getMessage().startswith(f"relay {relay.host}: broadcast to rank 0 "
                                                "failed: ")
            assert line.getMessage().endswith("; closing it")
            rec = conn.read_record()
            assert rec is not None and rec.control == RankExit(0)
            assert relay.fold.dead_ranks == frozenset({0})
            # the next round goes on with rank 1 alone
            r1.send_frame(frame([3.0], weight=1.0))
            rec = conn.read_record()
            assert rec is not None and values(rec.frame(SALT)) == [[3.0]]
        finally:
            _close(relay, ranks)


def _stalled_pair() -> tuple[socket.socket, socket.socket]:
    """A socketpair whose first end's send buffer is full (its peer reads nothing) and whose
    write timeout is short."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.setblocking(False)
    try:
        while True:
            a.send(bytes(4096))
    except BlockingIOError:
        pass
    a.setblocking(True)
    _netio.set_timeouts(a, send=0.3)
    return a, b


def test_write_to_each_writes_live_peers_before_waiting_on_stalled_ones() -> None:
    """Targets 0 and 2 do not read (full buffers): target 1, after the first of them, has the
    whole record before either stalled write gives up; both are reported failed."""
    pairs = [_stalled_pair(), socket.socketpair(), _stalled_pair()]
    prefix = b"\x10\x00\x00\x00"
    payload = memoryview(bytes(range(16)))
    seen: list[tuple[int, int]] = []

    def failed(ident: int, error: OSError) -> None:
        assert isinstance(error, TimeoutError)
        try:
            ready = len(pairs[1][1].recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            ready = 0
        seen.append((ident, ready))

    try:
        written = _netio_send.write_to_each([(i, pairs[i][0]) for i in range(3)], prefix, payload,
                                       failed)
        assert written == 20
        assert sorted(seen) == [(0, 20), (2, 20)]
        assert recv_exact(pairs[1][1], 20) == prefix + bytes(payload)
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def _frame_blob(*tensors: TensorPayload, weight: float = 1.0) -> bytes:
    return encode_round_frame_bytes(RoundFrame(0, weight, list(tensors)), SALT)


def _f32(shape: tuple[int, ...], *vals: float) -> TensorPayload:
    import numpy as np

    return TensorPayload(Dtype.F32, shape, np.asarray(vals, "<f4").tobytes())


def test_the_planned_fold_follows_a_layout_that_changes_under_the_same_byte_count() -> None:
    """Rounds of one f32 tensor of 16 bytes shaped (4,), then (2, 2), then (4,) again: each
    round's HostFrame has its own round's shape; a deposit whose shape disagrees with its
    round's seed (same dtype and byte count) is a SchemaMismatch, never summed."""
    fold = HostFold([0, 1], SALT)
    shapes = [(4,), (2, 2), (4,)]
    for k, shape in enumerate(shapes):
        assert fold.deposit_frame(0, _frame_blob(_f32(shape, 1, 2, 3, float(k)))) is None
        res = fold.deposit_frame(1, _frame_blob(_f32(shape, 10, 20, 30, 40), weight=2.0))
        assert isinstance(res, RoundFrame)
        assert [(t.dtype, t.shape) for t in res.tensors] == [(Dtype.F32, shape)]
        assert values(res) == [[11.0, 22.0, 33.0, 40.0 + k]] and res.weight == 3.0
    fold.deposit_frame(0, _frame_blob(_f32((4,), 1, 2, 3, 4)))
    with pytest.raises(SchemaMismatch) as e:
        fold.deposit_frame(1, _frame_blob(_f32((2, 2), 1, 2, 3, 4)))
    assert e.value.error_id == "fold.shape_mismatch"


@pytest.mark.parametrize("shape", [(4,), (8,)], ids=["fewer bytes", "same bytes"])
def test_a_bf16_deposit_into_an_f32_round_is_a_schema_mismatch(shape: tuple[int, ...]) -> None:
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _frame_blob(_f32((4,), 1, 2, 3, 4)))
    bf16 = TensorPayload(Dtype.BF16, shape, bytes(2 * shape[0]))
    with pytest.raises(SchemaMismatch) as e:
        fold.deposit_frame(1, _frame_blob(bf16))
    assert e.value.error_id == "fold.dtype_mismatch"
    assert fold.error is e.value


def test_v3_elided_deposits_fold_as_zeros_round_after_round() -> None:
    """Version 3, one layout: full then idle (elided, weight 0), idle then full, full then
    full: each HostFrame carries the full deposits' sums (an elided tensor counts as zeros) and
    their weight; the planned completion never sums an elided payload."""
    fold = HostFold([0, 1], SALT, version=3)
    full = _f32((3,), 1.5, -2.0, 4.0)
    idle = TensorPayload(Dtype.F32, (3,), b"")
    for first, second, want in (((full, 1.0), (idle, 0.0), ([1.5, -2.0, 4.0], 1.0)),
                                ((idle, 0.0), (full, 1.0), ([1.5, -2.0, 4.0], 1.0)),
                                ((full, 1.0), (full, 1.0), ([3.0, -4.0, 8.0], 2.0))):
        assert fold.deposit_frame(0, _frame_blob(first[0], weight=first[1])) is None
        res = fold.deposit_frame(1, _frame_blob(second[0], weight=second[1]))
        assert res is not None
        got = res if isinstance(res, RoundFrame) else decode_round_frame(bytes(res), SALT)[0]
        assert (values(got), got.weight) == ([want[0]], want[1])


def test_a_controller_record_cut_by_a_full_socket_is_not_overtaken() -> None:
    """The controller's direct write: a Broadcast the socket takes only part of is finished by
    the connection's writer, and a small record written meanwhile (a DeclareDead) waits behind
    it: the peer reads both records whole, in order."""
    from flodl_proto.codec.stream import MuxStream
    from flodl_proto.fsm.events import SendKind, SendTo
    from flodl_proto.runner._controller_conn import Conn, Written

    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    _netio.set_timeouts(a, send=_netio.write_stall_timeout())
    big = [b"\x01" * 25, memoryview(bytes(range(256)) * 2048), b"\x02" * 8]  # ~512 KiB
    small = [b"\x03" * 25, b"\x04" * 10]
    conn = Conn(0, a, "test", MuxStream(SALT))
    reports: list[Written] = []
    try:
        assert not conn.write_now(SendTo(0, tuple(big), SendKind.BROADCAST,
                                         _netio_send.buffers_nbytes(big), 1))
        assert conn.queued == 1
        assert not conn.write_now(SendTo(0, tuple(small), SendKind.DECLARE_DEAD, 35))
        assert conn.queued == 2
        writer = threading.Thread(target=conn.write_loop, args=(reports.append,))
        writer.start()
        want = b"".join(bytes(x) for x in big + small)
        got = recv_exact(b, len(want))
        conn.outbox.put(None)
        writer.join()
        assert got == want
        assert [(w.send.kind, w.error) for w in reports] == [(SendKind.BROADCAST, None)]
        assert conn.queued == 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("coalesce", [0.0, 0.01], ids=["plain", "coalesced"])
def test_stdout_lines_to_a_slow_reader_are_never_reordered_or_doubled(
        monkeypatch: pytest.MonkeyPatch, coalesce: float) -> None:
    """A 4 KiB pipe nobody reads while 2000 lines are put, then read to the end after close:
    what arrives is an ordered run of whole lines, each at most once, and every line put is
    either written or counted as dropped; at most the backlog (plus the pipe's bytes) waited."""
    import fcntl
    import os
    import sys

    from flodl_proto.commands._output import LineWriter

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
    out = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    w = LineWriter("stdout", 32, coalesce=coalesce)
    w.start()
    lines = [f"round {i}: kind model weight 2 bytes 4202 ms 0.5 " + "x" * 60 for i in range(2000)]
    for ln in lines:
        w.put(ln)
    text = close_and_drain(w, read_end, out)
    assert text.endswith("\n")
    received = text.splitlines()
    index = {ln: i for i, ln in enumerate(lines)}
    order = [index[ln] for ln in received]
    assert order == sorted(set(order))  # in order, none twice, none altered
    assert len(received) + w.dropped == len(lines)
    assert 0 < w.dropped and len(received) <= 32 + 1 + 4096 // 100 + 1 + 32
    assert not w.broken


@pytest.mark.parametrize("coalesce", [0.0, 0.01], ids=["plain", "coalesced"])
def test_stdout_closed_while_the_writer_is_blocked_ends_quietly(
        monkeypatch: pytest.MonkeyPatch, coalesce: float) -> None:
    """``| head -1``: the reader takes a little, then goes away while the writer is blocked on a
    full pipe: the blocked write fails (EPIPE, no SIGPIPE death), the lines left are discarded,
    close() returns and nothing is raised."""
    import fcntl
    import os
    import sys

    from flodl_proto.commands._output import LineWriter

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
    out = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    w = LineWriter("stdout", 64, coalesce=coalesce)
    w.start()
    for i in range(500):
        w.put(f"line {i} " + "y" * 100)
    first = os.read(read_end, 9)
    assert first == b"line 0 yy"
    # the writer is blocked on the full pipe, lines wait behind it (or in its coalesced batch)
    wait_until(lambda: w._lines.qsize() > 0 or w._held > 1)
    os.close(read_end)  # the reader goes away
    w.close()
    out.close()
    assert w.broken and not w._writer.is_alive()


def test_trailing_bytes_in_a_blob_and_a_trickled_broadcast() -> None:
    """A blob with 5 bytes after its frame's footer (ignored, as upstream; the MAC taken while
    the blob arrived covers more than the frame, so the fold checks the tag itself), and a
    Broadcast record the controller sends a byte at a time with a stall inside: both ranks get
    it whole."""
    with FakeController() as ctrl:
        relay, (r0, r1), conn = _two_ranks(ctrl)
        try:
            body = encode_round_frame_bytes(frame([1.0, 2.0], weight=1.0), SALT) + b"\xee" * 5
            r0.sock.sendall(len(body).to_bytes(4, "little") + body)
            r1.send_frame(frame([3.0, 5.0], weight=1.0))
            rec = conn.read_record()
            assert rec is not None and values(rec.frame(SALT)) == [[4.0, 7.0]]
            consensus = frame([2.0, 3.5], weight=2.0)
            record = b"".join(bytes(p) for p in encode_frame_record(RecordKind.BROADCAST,
                                                                     consensus, SALT))
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(len(record)):
                conn.sock.sendall(record[i:i + 1])
                if i in (10, 40):
                    time.sleep(0.35)  # longer than the relay's read poll, header and payload
            payload = encode_round_frame_bytes(consensus, SALT)
            assert r0.read_reply() == payload and r1.read_reply() == payload
            assert relay.error is None
        finally:
            _close(relay, [r0, r1])


def test_host_frames_cut_by_a_full_upstream_leave_whole_and_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller reads nothing for 12 rounds of 64 KiB HostFrames (small socket
    buffers): a HostFrame the direct write could only start is finished by the outbound writer
    and every later one queues behind it; the controller then reads 12 whole records, in round
    order, each with its round's sums."""
    import numpy as np

    small_relay_send_buffers(monkeypatch)
    n = 16 << 10  # f32 elements: 64 KiB a frame
    with FakeController() as ctrl:
        ctrl.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        relay, (r0, r1), conn = _two_ranks(ctrl)
        try:
            for k in range(12):
                r0.send_frame(frame(np.full(n, float(k), np.float32), weight=1.0))
                r1.send_frame(frame(np.full(n, 100.0, np.float32), weight=1.0))
                wait_until(lambda k=k: relay.fold.rounds_completed == k + 1)
            wait_until(lambda: relay.stats.host_frames == 12)  # counted after the fold's round
            for k in range(12):
                rec = conn.read_record()
                assert rec is not None and rec.kind is RecordKind.HOST_FRAME
                f = rec.frame(SALT)
                assert f.weight == 2.0 and values(f) == [[100.0 + k] * n]
            assert relay.error is None
        finally:
            _close(relay, [r0, r1])


_SIGPIPE_PROBE = r"""
import signal, socket, sys
from flodl_proto.runner import _netio_send
from flodl_proto.runner._controller_conn import _write_direct
from flodl_proto.runner.status_http import serve_status


def status(s):
    peer = s.peer
    peer.sendall(b"GET /status HTTP/1.1\r\n\r\n")
    peer.close()  # the client is gone before the answer
    serve_status(s, "test", lambda: {"round": 1})

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a program that wants `| head` quiet does
results = []
for name, write in (
    ("send_all", lambda s: _netio_send.send_all(s, [b"x" * 10])),
    ("send_now", lambda s: _netio_send.send_now(s, [b"x" * 10])),
    ("send_at_once", lambda s: _netio_send.send_at_once(s, [b"x" * 10], 10)),
    ("write_to_each", lambda s: _netio_send.write_to_each(
        [(0, s)], b"x", memoryview(b"y" * 9), lambda i, e: results.append(type(e).__name__))),
    ("write_direct", lambda s: _write_direct(s, (b"x" * 10,), 10)),
    ("status", status),
):
    a, b = socket.socketpair()
    if name == "status":
        a = type("S", (socket.socket,), {})(fileno=a.detach())
        a.peer = b
    else:
        b.close()
    try:
        write(a)
        results.append(f"{name}:returned")
    except OSError as e:
        results.append(f"{name}:{type(e).__name__}")
    a.close()
print(" ".join(results))
"""


def test_a_closed_peer_is_an_error_not_a_sigpipe_death() -> None:
    """In a process whose SIGPIPE is the default action (a program embedding the runners that
    restored it for a quiet ``| head``), writing to a peer that closed raises or reports an
    error; the process is not killed by SIGPIPE."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _SIGPIPE_PROBE], capture_output=True, text=True,
                         timeout=60)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout.split() == ["send_all:BrokenPipeError", "send_now:returned",
                                  "send_at_once:returned", "BrokenPipeError",
                                  "write_to_each:returned", "write_direct:returned",
                                  "status:returned"]


def test_a_starved_blob_drops_the_rank_and_a_starved_record_ends_the_relay() -> None:
    """Starvation bound lowered to 0.3 s (60 s by default): a rank that stops inside its blob
    is dropped (RankExit, the round ships with the other rank); a controller that stops inside
    a record ends the relay with a typed error (mux.starved), no hang."""
    from flodl_proto.errors import TruncatedInput

    with FakeController() as ctrl:
        relay, (r0, r1), conn = _two_ranks(ctrl)
        relay._starve = 0.3
        try:
            r1.send_frame(frame([2.0], weight=1.0))
            r0.sock.sendall(_blob(frame([1.0]))[:12])  # prefix and part of the frame, then silence
            got = [conn.read_record(), conn.read_record()]
            assert sorted(str(r.kind) for r in got if r is not None) == [
                str(RecordKind.CONTROL), str(RecordKind.HOST_FRAME)]
            assert any(r is not None and r.control == RankExit(0) for r in got)
            record = b"".join(bytes(p) for p in encode_frame_record(
                RecordKind.BROADCAST, frame([2.0], weight=1.0), SALT))
            conn.sock.sendall(record[:30])
            err = relay.wait(20)
            assert isinstance(err, TruncatedInput) and err.error_id == "mux.starved"
            assert str(err) == ("relay_mux: committed read starved mid-frame for 0.3s "
                                f"(30 of {len(record)} bytes)")  # the record's, not the step's
        finally:
            _close(relay, [r0, r1])


def test_a_huge_ranks_range_is_refused_before_it_is_expanded(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--ranks 0-4999999`` (a typo) with a world size of 4, or more ranks than the process may
    open connections for: one line, exit 2, without building the list (before, the range was
    expanded into millions of ints and echoed whole in the error line)."""
    import tracemalloc

    from flodl_proto.cli import main

    salt = ["--salt", SALT.hex(), "--controller", "127.0.0.1:1"]
    tracemalloc.start()
    try:
        code = main(["relay", *salt, "--ranks", "0-4999999", "--world-size", "4"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert (code, err) == (2, "flodl-proto relay: error: argument --ranks: '0-4999999': every rank "
                              "must be < --world-size 4, got rank 4999999\n")
    assert peak < 8 << 20
    code = main(["relay", *salt, "--ranks", "0-99999999", "--world-size", "4294967295"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(
        "flodl-proto relay: error: argument --ranks: '0-99999999': 100000000 ranks need as many "
        "loopback connections, more than this process may open (")
    assert err.count("\n") == 1


def test_a_host_name_longer_than_a_hello_carries_is_refused_up_front(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--host`` of 256 UTF-8 bytes or more: refused when the relay is made (before, the relay
    accepted its ranks, dialed, and the controller refused the Hello as 'corrupt or hostile',
    so the relay ended with 'controller closed connection before HelloAck'); 255 bytes is fine."""
    from flodl_proto.cli import main
    from flodl_proto.errors import InvalidValue

    with pytest.raises(InvalidValue) as e:
        Relay(("127.0.0.1", 1), [0], 1, SALT, listen_port=0, host="\u00e9" * 128)
    assert (e.value.error_id, e.value.remote) == ("relay.host_too_long", False)
    assert str(e.value) == ("relay: host name is 256 bytes (UTF-8), more than the 255 a Hello "
                            "may carry")
    Relay(("127.0.0.1", 1), [0], 1, SALT, listen_port=0, host="h" * 255).shutdown()
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error: the option's type
        main(["relay", "--controller", "127.0.0.1:1", "--salt", SALT.hex(), "--ranks", "0",
              "--world-size", "1", "--host", "h" * 300])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"flodl-proto relay: error: argument --host: '{'h' * 40}...{'h' * 20}' (300 characters) "
        "is 300 bytes (UTF-8), more than the 255 a Hello may carry")

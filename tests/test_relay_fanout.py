"""The relay's cut-through Broadcast fan-out (:class:`~flodl_proto.runner.relay_fanout.
BroadcastStream`) on socket pairs: what each rank's end receives when the record is committed
(everything, byte for byte), aborted (a strict prefix that stops before the held-back tag, then
the end of the stream), committed without a rank that left (cut and closed) or written to a rank
that is gone (its hook called, the others whole); and, through the relay runner against a fake
controller, a large Broadcast that arrives whole, one whose record tag is wrong and one cut by
the controller's end of stream (no rank ever completes the frame).

Ephemeral ports only; ``FLODL_NET_TIMEOUT_SCALE=0.1`` (conftest); every wait has a deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from flodl_proto.codec import (
    Dtype,
    RankExit,
    RecordKind,
    RoundFrame,
    TensorPayload,
    encode_frame_record,
)
from flodl_proto.codec.mux import (
    DeclareDead,
    MuxRecord,
    control_too_long,
    encode_mux_record_bytes,
    max_control_payload,
)
from flodl_proto.codec.structs import PACKED
from flodl_proto.errors import (
    AuthenticationError,
    LimitExceeded,
    ProtocolError,
    RemoteProtocolError,
)
from flodl_proto.runner import _netio, _netio_send, relay_fanout
from flodl_proto.runner.relay import Relay
from flodl_proto.runner.relay_fanout import CUT_THROUGH_MIN, BroadcastStream, UpstreamReader
from flodl_proto.spec import MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC

from .cluster_util import (
    SALT,
    ControllerConn,
    FakeController,
    RawRank,
    frame,
    in_thread,
    leak_guard,
    small_relay_send_buffers,
    values,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

PREFIX = b"\x10\x00\x00\x00"
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB, every byte value
HOLD = 8


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    with leak_guard():
        yield


def _drain(sock: socket.socket, out: bytearray) -> None:
    """Read ``sock`` to its end into ``out`` (a reset counts as the end)."""
    sock.settimeout(20.0)
    try:
        while chunk := sock.recv(1 << 20):
            out += chunk
    except ConnectionResetError:
        pass


class _Peers:
    """``n`` socket pairs: the stream writes to the first ends, a thread per pair drains the
    second into ``got[i]``."""

    def __init__(self, n: int, gone: int | None = None) -> None:
        self.pairs = [socket.socketpair() for _ in range(n)]
        self.got = [bytearray() for _ in range(n)]
        if gone is not None:  # that pair's reading end is closed before anything is written
            self.pairs[gone][1].close()
        self.readers = [threading.Thread(target=_drain, args=(b, g))
                        for i, ((_, b), g) in enumerate(zip(self.pairs, self.got, strict=True))
                        if i != gone]
        for t in self.readers:
            t.start()

    def targets(self) -> list[tuple[int, socket.socket]]:
        return [(10 + i, a) for i, (a, _) in enumerate(self.pairs)]

    def finish(self) -> list[bytes]:
        """Close the writing ends, wait for the readers, return what each received."""
        for a, _ in self.pairs:
            a.close()
        for t in self.readers:
            t.join(30)
            assert not t.is_alive()
        for _, b in self.pairs:
            b.close()  # a second close of a gone pair's end is a no-op
        return [bytes(g) for g in self.got]


def test_a_committed_stream_delivers_prefix_and_payload_whole_to_every_rank() -> None:
    peers = _Peers(3)
    failures: list[tuple[int, OSError]] = []
    stream = BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: failures.append((r, e)))
    for filled in range(0, len(PAYLOAD), 100_000):
        stream.arrived(filled)
    stream.arrived(len(PAYLOAD))
    assert stream.commit([10, 11, 12]) == 3 * (4 + len(PAYLOAD))
    assert stream.written == 3 * (4 + len(PAYLOAD))
    assert peers.finish() == [PREFIX + PAYLOAD] * 3
    assert failures == []


def test_what_is_left_at_the_commit_is_written_under_one_deadline_taken_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces forwarded before the commit each take the default deadline (None: one stall per
    call); every piece after it shares the deadline the commit took (now + one stall), so the
    commit waits one stall at most for a rank that reads slowly."""
    from flodl_proto.runner import relay_fanout

    calls: list[tuple[int, float | None]] = []
    real = relay_fanout.send_all

    def send_all(sock: socket.socket, bufs: list[bytes], *,
                 deadline: float | None = None) -> int:
        calls.append((sum(memoryview(b).nbytes for b in bufs), deadline))
        return real(sock, bufs, deadline=deadline)

    monkeypatch.setattr(relay_fanout, "send_all", send_all)
    monkeypatch.setattr(relay_fanout, "write_stall_timeout", lambda: 7.0)
    peers = _Peers(1)
    stream = BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: None)
    stream.arrived(len(PAYLOAD))  # all but the held-back tag may go
    wait_until(lambda: sum(n for n, _ in calls) == 4 + len(PAYLOAD) - HOLD, 20.0)
    before = time.monotonic()
    assert stream.commit([10]) == 4 + len(PAYLOAD)
    after = time.monotonic()
    assert peers.finish() == [PREFIX + PAYLOAD]
    assert [d for _, d in calls[:-1]] == [None] * (len(calls) - 1)
    last_n, last_deadline = calls[-1]
    assert last_n == HOLD and last_deadline is not None
    assert before + 7.0 <= last_deadline <= after + 7.0


def test_an_aborted_stream_stops_before_the_held_back_tag_and_ends_each_stream() -> None:
    """Every byte that arrived may go, except the last HOLD of the payload: even with the whole
    payload arrived, an aborted record leaves each rank a strict prefix without the tag, then
    the end of its stream."""
    peers = _Peers(2)
    stream = BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: None)
    stream.arrived(len(PAYLOAD))  # the whole payload arrived; its check failed
    stream.abort()
    got = peers.finish()
    whole = PREFIX + PAYLOAD
    for g in got:
        assert len(g) <= len(whole) - HOLD and whole.startswith(g)
    assert stream.written == 0


def test_an_abort_before_any_byte_arrived_writes_nothing_and_closes_no_one() -> None:
    peers = _Peers(2)
    stream = BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: None)
    stream.arrived(HOLD)  # nothing beyond the held-back tail
    stream.abort()
    for a, _ in peers.pairs:  # not shut down by the stream: the connection is still usable
        a.sendall(b"ok")
    assert peers.finish() == [b"ok", b"ok"]


def test_a_rank_left_out_of_the_commit_is_cut_and_closed_the_others_get_it_whole() -> None:
    peers = _Peers(2)
    stream = BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: None)
    stream.arrived(len(PAYLOAD) // 2)
    wait_until(lambda: len(peers.got[1]) > 0, 20.0)  # rank 11's stream began
    assert stream.commit([10]) == 4 + len(PAYLOAD)
    # rank 11's end sees the end of its stream although its writing end is still open
    peers.readers[1].join(20)
    assert not peers.readers[1].is_alive()
    got = peers.finish()
    assert got[0] == PREFIX + PAYLOAD
    assert 0 < len(got[1]) <= 4 + len(PAYLOAD) // 2 - HOLD
    assert (PREFIX + PAYLOAD).startswith(got[1])


def test_a_write_to_a_gone_rank_calls_the_hook_and_the_others_get_it_whole() -> None:
    peers = _Peers(2, gone=0)  # rank 10's end is gone before anything is written
    failures: list[tuple[int, OSError]] = []
    stream = BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: failures.append((r, e)))
    stream.arrived(len(PAYLOAD))
    assert stream.commit([10, 11]) == 4 + len(PAYLOAD)
    assert [r for r, _ in failures] == [10]
    assert isinstance(failures[0][1], OSError)
    got = peers.finish()
    assert got[1] == PREFIX + PAYLOAD


def test_a_writer_that_cannot_start_stops_the_ones_started_and_nothing_is_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The second writer thread fails to start (no thread left): the error reaches the caller,
    the first writer, already waiting for bytes, is stopped and joined (the leak guard checks
    no thread is left), and neither rank's stream got a byte (both connections still usable)."""
    real_start = threading.Thread.start
    names: list[str] = []

    def start(thread: threading.Thread) -> None:
        names.append(thread.name)
        if len(names) == 2:
            raise RuntimeError("can't start new thread")
        real_start(thread)

    peers = _Peers(2)
    monkeypatch.setattr(threading.Thread, "start", start)
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            BroadcastStream(peers.targets(), PREFIX, memoryview(PAYLOAD), HOLD,
                            lambda r, e: None)
    finally:
        monkeypatch.undo()
    assert names == ["flodl-relay-fwd-r10", "flodl-relay-fwd-r11"]
    assert [t.name for t in threading.enumerate() if t.name.startswith("flodl-relay-fwd")] == []
    for a, _ in peers.pairs:
        a.sendall(b"ok")
    assert peers.finish() == [b"ok", b"ok"]


def _unread_pair() -> tuple[socket.socket, socket.socket]:
    """A socket pair whose reading end is never read and whose writing end has no write
    timeout: a write of more than the buffers hold blocks until the writing end is shut down."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return a, b


@pytest.mark.parametrize("end", ["abort", "commit without the rank"])
def test_a_rank_that_reads_nothing_does_not_hold_up_the_end_of_a_cut_stream(
        end: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 11 reads nothing (its writer blocks inside a write with no deadline of its own).
    When its stream is cut (the record failed, or the checked record goes without it), it is
    closed before the writers are joined: abort / commit return (the write fails) instead of
    waiting out the write-stall deadline (raised here out of reach), rank 10 gets its part, and
    rank 11's end holds a strict prefix without the tag."""
    monkeypatch.setattr(_netio, "write_stall_timeout", lambda: 3600.0)  # SO_SNDTIMEO
    monkeypatch.setattr(_netio_send, "write_stall_timeout", lambda: 3600.0)  # send_all's deadline
    fast_r, fast_w = socket.socketpair()
    slow_w, slow_r = _unread_pair()
    got = bytearray()
    reader = threading.Thread(target=_drain, args=(fast_w, got))
    reader.start()
    failures: list[int] = []
    stream = BroadcastStream([(10, fast_r), (11, slow_w)], PREFIX, memoryview(PAYLOAD), HOLD,
                             lambda r, e: failures.append(r))
    try:
        stream.arrived(len(PAYLOAD))
        wait_until(lambda: len(got) == 4 + len(PAYLOAD) - HOLD, 20.0)
        t, out = in_thread(stream.abort if end == "abort" else lambda: stream.commit([10]))
        t.join(20.0)
        assert not t.is_alive(), f"{end} waited for the rank that reads nothing"
        assert "error" not in out
        fast_r.close()
        reader.join(20.0)
        whole = PREFIX + PAYLOAD
        assert bytes(got) == (whole if end != "abort" else whole[:-HOLD])
        assert failures == []  # cut by the stream, not a failed write
        slow_r.settimeout(20.0)
        cut = bytearray()
        _drain(slow_r, cut)  # what rank 11's buffers hold, then the end of its stream
        assert 0 < len(cut) < len(whole) - HOLD and whole.startswith(bytes(cut))
    finally:
        for s in (fast_r, fast_w, slow_w, slow_r):
            s.close()


@pytest.mark.parametrize("hold", [0, -1, len(PAYLOAD) + 1])
def test_a_hold_outside_the_payload_is_refused(hold: int) -> None:
    with pytest.raises(ValueError, match=f"hold {hold} outside 1..{len(PAYLOAD)}"):
        BroadcastStream([], PREFIX, memoryview(PAYLOAD), hold, lambda r, e: None)


def test_the_upstream_reader_counts_the_header_when_building_a_route_fails() -> None:
    record, _ = _big_broadcast()
    counted: list[int] = []

    def route(kind: int, payload_len: int, view: memoryview) -> BroadcastStream | None:
        assert (kind, payload_len) == (RecordKind.BROADCAST, len(record) - 25)
        raise RuntimeError("no route")

    a, b = socket.socketpair()
    with a, b:
        b.settimeout(20.0)
        a.sendall(record[:25])  # the header only: the reader stops before the payload
        reader = UpstreamReader(SALT, 2, 1 << 30, threading.Event(), route, counted.append)
        with pytest.raises(RuntimeError, match="no route"):
            reader.read(b, None)
    assert counted == [25]


def _control_header(claim: int) -> bytes:
    return PACKED["MUX_HEADER"].pack(MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION, RecordKind.CONTROL,
                                     0, claim, bytes(8))


def test_the_upstream_reader_refuses_a_control_record_past_its_bound_from_the_header() -> None:
    """Departure control_bound: a Control record claiming more than ``control_limit`` is the
    remote relay.control_too_long, its payload not read (the 25 header bytes counted); one at
    the bound is read and decoded as before."""
    counted: list[int] = []
    at = encode_mux_record_bytes(MuxRecord(RecordKind.CONTROL, 0, b"\x03\x01" + bytes(8)), SALT)
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(20.0)
        reader = UpstreamReader(SALT, 2, 1 << 30, threading.Event(), lambda *_: None,
                                counted.append, control_limit=10)
        a.sendall(at + _control_header(11) + bytes(11))
        rec = reader.read(b, None)
        assert rec is not None and rec.control == DeclareDead(1)
        with pytest.raises(LimitExceeded) as e:
            reader.read(b, None)
    assert isinstance(e.value, RemoteProtocolError)
    assert e.value.error_id == "relay.control_too_long"
    assert str(e.value) == ("relay: a Control record from the controller claims payload_len 11 "
                            "(> 10 bytes, the longest legal control message for the world "
                            "size); corrupt or hostile peer")
    assert counted == [35, 25]


def test_the_upstream_reader_asks_the_codec_for_the_bound_of_control_records_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control bound is the codec's rule (codec.mux.control_too_long, which the
    controller's stream uses too), where the reader compared the length itself; it is asked
    for Control records only, so a Broadcast's read costs no call more."""
    asked: list[tuple[int, int, int, str]] = []

    def spy(kind: int, payload_len: int, limit: int, reader: str) -> ProtocolError | None:
        asked.append((kind, payload_len, limit, reader))
        return control_too_long(kind, payload_len, limit, reader)

    monkeypatch.setattr(relay_fanout, "control_too_long", spy)
    record, _ = _big_broadcast_of(64)
    at = encode_mux_record_bytes(MuxRecord(RecordKind.CONTROL, 0, b"\x03\x01" + bytes(8)), SALT)
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(20.0)
        reader = UpstreamReader(SALT, 2, 1 << 30, threading.Event(), lambda *_: None,
                                lambda n: None, control_limit=10)
        a.sendall(at + record + _control_header(11))
        assert reader.read(b, None) is not None
        assert reader.read(b, None) is not None
        with pytest.raises(LimitExceeded) as e:
            reader.read(b, None)
    assert e.value.error_id == "relay.control_too_long"
    assert asked == [(RecordKind.CONTROL, 10, 10, "relay"), (RecordKind.CONTROL, 11, 10, "relay")]


def test_a_relay_ends_on_a_control_record_past_the_bound_for_its_world_size() -> None:
    """Through the runner: the relay bounds the controller's Control records by
    max_control_payload of its world size (2: 361 bytes); a claim of 1 GiB ends it with
    relay.control_too_long at once, where it waited for the gigabyte to decode it."""
    with FakeController() as ctrl:
        relay, ranks, conn = _relay_with_two_ranks(ctrl)
        try:
            conn.sock.sendall(_control_header(1 << 30))
            err = relay.wait(20)
            assert isinstance(err, LimitExceeded) and err.error_id == "relay.control_too_long"
            assert err.fields == {"length": 1 << 30, "limit": max_control_payload(2)}
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()


# -- through the relay runner ---------------------------------------------------------------------

def _first_round(ctrl: FakeController, relay: Relay, ranks: list[RawRank], *, version: int = 2,
                 rcvbuf: int | None = None) -> ControllerConn:
    """Connect ranks 0 and 1 to ``relay`` and hand-shake them (each appended to ``ranks`` as it
    connects, so the caller closes them; ``rcvbuf``: rank sockets' receive buffer, bytes),
    accept the relay's controller connection and complete round 1 (one HostFrame); returns the
    connection."""
    for r in range(2):
        rr = RawRank.__new__(RawRank)
        rr.sock = socket.socket()
        if rcvbuf is not None:
            rr.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        rr.sock.settimeout(20.0)
        rr.sock.connect(relay.address)
        ranks.append(rr)
        assert len(rr.handshake(r, 2, version)) == 8
    conn = ctrl.accept()
    conn.handshake()
    for r, rr in enumerate(ranks):
        rr.send_frame(frame([float(r)], weight=1.0))
    rec = conn.read_record()
    assert rec is not None and rec.kind is RecordKind.HOST_FRAME
    return conn


def _relay_with_two_ranks(ctrl: FakeController) -> tuple[Relay, list[RawRank], ControllerConn]:
    relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0, host="h0").start()
    ranks: list[RawRank] = []
    return relay, ranks, _first_round(ctrl, relay, ranks)


def _big_broadcast_of(nbytes: int) -> tuple[bytes, bytes]:
    """A Broadcast record whose one f32 tensor holds ``nbytes`` bytes, and its payload."""
    data = (bytes(range(251)) * (nbytes // 251 + 1))[:nbytes]
    # as given: any byte count, so a test can reach any record length
    consensus = RoundFrame(0, 2.0, [TensorPayload(Dtype.F32, [nbytes // 4], data)],
                           check_nbytes=False)
    record = b"".join(bytes(p) for p in encode_frame_record(RecordKind.BROADCAST, consensus,
                                                            SALT))
    return record, record[25:]


def _big_broadcast() -> tuple[bytes, bytes]:
    """A Broadcast record above the cut-through size (1.5 MiB of f32), and its payload."""
    return _big_broadcast_of(3 * CUT_THROUGH_MIN // 4 * 2)


def _read_all(rr: RawRank) -> bytes:
    out = bytearray()
    _drain(rr.sock, out)
    return bytes(out)


def test_a_large_broadcast_reaches_every_rank_byte_for_byte_in_pieces() -> None:
    record, payload = _big_broadcast()
    with FakeController() as ctrl:
        relay, ranks, conn = _relay_with_two_ranks(ctrl)
        try:
            for i in range(0, len(record), 300_000):  # the record in pieces, the ranks keep up
                conn.sock.sendall(record[i:i + 300_000])
            assert [rr.read_reply() for rr in ranks] == [payload, payload]
            assert relay.error is None
            # the two 8-byte handshake acks, then the prefix and payload to each rank
            wait_until(lambda: relay.stats.to_ranks == 2 * 8 + 2 * (4 + len(payload)), 20.0)
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()


def test_the_ranks_receive_a_large_broadcast_before_its_end_has_left_the_controller() -> None:
    """Cut-through: with the first part of the record sent and the rest held back, each rank
    already receives the payload's start; the rest follows once the record is whole."""
    record, payload = _big_broadcast()
    whole = len(payload).to_bytes(4, "little") + payload
    half = len(record) // 2
    with FakeController() as ctrl:
        relay, ranks, conn = _relay_with_two_ranks(ctrl)
        try:
            conn.sock.sendall(record[:half])
            early = []
            for rr in ranks:
                rr.sock.settimeout(20.0)
                early.append(rr.sock.recv(1 << 16))  # arrives before the record's end is sent
            for got in early:
                assert 0 < len(got) and whole.startswith(got)
            conn.sock.sendall(record[half:])
            for rr, got in zip(ranks, early, strict=True):
                rest = bytearray(got)
                while len(rest) < len(whole):
                    chunk = rr.sock.recv(1 << 20)
                    assert chunk
                    rest += chunk
                assert bytes(rest) == whole
            assert relay.error is None
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()


@pytest.mark.parametrize("fault", ["bad record tag", "controller closes inside it"])
def test_a_forwarded_broadcast_that_fails_never_completes_at_any_rank(fault: str) -> None:
    """The payload is forwarded as it arrives, but its last 8 bytes only once the record is
    checked: a record with a wrong tag ends the relay with the authentication error, one the
    controller cuts ends it too, and in both cases each rank's stream ends before the frame's
    tag (a strict prefix of what it would have received)."""
    record, payload = _big_broadcast()
    if fault == "bad record tag":
        record = record[:17] + bytes([record[17] ^ 1]) + record[18:]  # the header's tag
    with FakeController() as ctrl:
        relay, ranks, conn = _relay_with_two_ranks(ctrl)
        try:
            if fault == "bad record tag":
                conn.sock.sendall(record)
            else:
                conn.sock.sendall(record[:len(record) - 100])
                conn.close()
            whole = len(payload).to_bytes(4, "little") + payload
            for rr in ranks:
                got = _read_all(rr)
                assert len(got) <= len(whole) - 8 and whole.startswith(got)
            wait_until(lambda: relay.done, 20.0)
            if fault == "bad record tag":
                assert isinstance(relay.error, AuthenticationError)
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()


@pytest.mark.parametrize("fault", ["bad record tag", "controller stalls inside it"])
def test_a_failed_forwarded_broadcast_ends_the_relay_while_its_ranks_read_nothing(
        fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither rank reads (small socket buffers, a write-stall deadline out of reach): a record
    with a wrong tag, or one the controller stops sending inside (starvation bound 0.3 s), still
    ends the relay with its error, since the cut ranks are closed rather than waited for; each
    rank's stream then holds a strict prefix without the tag."""
    from flodl_proto.errors import TruncatedInput

    small_relay_send_buffers(monkeypatch)
    monkeypatch.setattr(_netio, "write_stall_timeout", lambda: 3600.0)  # SO_SNDTIMEO
    monkeypatch.setattr(_netio_send, "write_stall_timeout", lambda: 3600.0)  # send_all's deadline
    monkeypatch.setattr(_netio, "keepalive_bound", lambda: 3600.0)
    record, payload = _big_broadcast()
    if fault == "bad record tag":
        record = record[:17] + bytes([record[17] ^ 1]) + record[18:]
    else:
        record = record[:len(record) - 1000]
    with FakeController() as ctrl:
        relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0, host="h0")
        relay._starve = 0.3  # read by every record's read from the start
        relay.start()
        ranks: list[RawRank] = []
        try:
            conn = _first_round(ctrl, relay, ranks, rcvbuf=4096)
            conn.sock.sendall(record)
            err = relay.wait(30)
            if fault == "bad record tag":
                assert isinstance(err, AuthenticationError)
            else:
                assert isinstance(err, TruncatedInput) and err.error_id == "mux.starved"
            whole = len(payload).to_bytes(4, "little") + payload
            for rr in ranks:
                got = _read_all(rr)  # what reached its buffers (maybe nothing), then the end
                assert len(got) <= len(whole) - 8 and whole.startswith(got)
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("delta", [-64, 0], ids=["payload under 1 MiB", "payload of 1 MiB"])
def test_broadcasts_at_the_cut_through_size_arrive_whole_round_after_round(
        version: int, delta: int) -> None:
    """Payloads just under and exactly at CUT_THROUGH_MIN bytes (read whole first / forwarded
    as they arrive), three in a row through one relay (the record buffer reused), v2 and v3:
    every rank gets every one byte for byte."""
    frame_overhead = len(_big_broadcast_of(4)[1]) - 4
    record, payload = _big_broadcast_of(CUT_THROUGH_MIN + delta - frame_overhead)
    assert len(payload) == CUT_THROUGH_MIN + delta
    with FakeController(version=version) as ctrl:
        relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0, host="h0",
                      version=version).start()
        ranks: list[RawRank] = []
        try:
            conn = _first_round(ctrl, relay, ranks, version=version)
            for _ in range(3):
                conn.sock.sendall(record)
                assert [rr.read_reply() for rr in ranks] == [payload, payload]
            assert relay.error is None
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()


@pytest.mark.parametrize("event", ["rank closes", "rank deadline", "relay shuts down"])
def test_a_rank_lost_between_the_header_and_the_end_of_a_forwarded_broadcast(
        event: str) -> None:
    """Half the record sent, rank 0 has received its start; then rank 0 closes (RankExit
    upstream), or misses the rank deadline (rank 1 deposits the next round early: the round
    ships without rank 0, whose connection is closed), or the relay shuts down. Rank 0 never
    completes the frame; rank 1 gets it whole once the rest arrives (or, on shutdown, a strict
    prefix); no thread or socket is left (leak guard)."""
    record, payload = _big_broadcast()
    whole = len(payload).to_bytes(4, "little") + payload
    half = len(record) // 2
    with FakeController() as ctrl:
        relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0, host="h0",
                      rank_timeout=3.0 if event == "rank deadline" else None).start()
        ranks: list[RawRank] = []
        try:
            conn = _first_round(ctrl, relay, ranks)
            r0, r1 = ranks
            conn.sock.sendall(record[:half])
            r0.sock.settimeout(20.0)
            first = r0.sock.recv(1000)
            assert first and whole.startswith(first)
            if event == "rank closes":
                r0.sock.close()
            elif event == "rank deadline":
                r1.send_frame(frame([5.0], weight=1.0))  # round 2's first deposit
                rec = conn.read_record()  # rank 0 missed the deadline: shipped without it
                assert rec is not None and values(rec.frame(SALT)) == [[5.0]]
            else:
                relay.shutdown(20.0)
            if event != "relay shuts down":
                conn.sock.sendall(record[half:])
            if event != "rank closes":
                got = first + _read_all(r0)
                assert len(got) <= len(whole) - 8 and whole.startswith(got)
            if event == "relay shuts down":
                got = _read_all(r1)
                assert len(got) <= len(whole) - 8 and whole.startswith(got)
                assert relay.error is None
                return
            assert r1.read_reply() == payload
            if event == "rank closes":
                rec = conn.read_record()
                assert rec is not None and rec.control == RankExit(0)
            r1.send_frame(frame([3.0], weight=1.0))  # the next round goes on with rank 1
            rec = conn.read_record()
            assert rec is not None and values(rec.frame(SALT)) == [[3.0]]
            assert relay.error is None
        finally:
            relay.shutdown()
            for rr in ranks:
                rr.close()

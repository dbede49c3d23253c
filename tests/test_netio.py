"""Socket plumbing (runner/_netio.py, _netio_recv.py, _netio_send.py) over real loopback sockets:
the write-stall deadline covers a whole record, record buffers grow without a chunk-sized
temporary, TCP keepalive is on for every data-channel socket (an addition to upstream), and a
connection the kernel gave up on is reported as :class:`PeerTimedOut`, not as a poll timeout.

Ephemeral ports only; ``FLODL_NET_TIMEOUT_SCALE=0.1`` (conftest); every wait has a deadline.
"""

from __future__ import annotations

import errno
import hmac
import socket
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from flodl_proto.codec.auth import PARALLEL_MAC_MIN
from flodl_proto.errors import TruncatedInput
from flodl_proto.runner import _netio, _netio_recv, _netio_send
from flodl_proto.runner._netio import (
    PeerTimedOut,
    configure_socket,
    keepalive_bound,
    keepalive_settings,
)
from flodl_proto.runner._netio_recv import grow_zeroed, recv_exact_into
from flodl_proto.runner._netio_send import send_all
from flodl_proto.spec import SPEC

TRICKLE = 64 << 10  # bytes the slow peer reads at a time


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as lst:
        rx = socket.socket()
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        rx.connect(lst.getsockname())
        tx, _ = lst.accept()
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    configure_socket(tx)  # the write-stall timeout as SO_SNDTIMEO
    try:
        yield tx, rx
    finally:
        tx.close()
        rx.close()


@pytest.mark.timeout(120)
def test_write_stall_deadline_covers_the_whole_record(
        pair: tuple[socket.socket, socket.socket]) -> None:
    # the peer reads 64 KiB about every third of the write-stall timeout: every sendmsg makes
    # some progress, so a timeout that restarted on each partial send would never fire before
    # the 32 MiB record is through (about 500 timeouts); the deadline for the record fires
    tx, rx = pair
    stop = threading.Event()
    got = [0]

    def trickle() -> None:
        rx.settimeout(0.2)
        while not stop.wait(0.1):
            try:
                n = len(rx.recv(TRICKLE))
            except TimeoutError:
                continue
            except OSError:
                return
            if n == 0:
                return
            got[0] += n

    reader = threading.Thread(target=trickle)
    reader.start()
    record = bytes(32 << 20)
    try:
        with pytest.raises(TimeoutError) as ei:
            send_all(tx, [record[:1 << 20], memoryview(record)[1 << 20:]])
    finally:
        stop.set()
        reader.join()
    msg = str(ei.value)
    assert msg.startswith("write stalled: the 3s write-stall deadline passed with ")
    assert msg.endswith(f" of {32 << 20} bytes written (peer not reading)")
    assert got[0] > 0  # the peer did read: progress was made, and the deadline still fired
    # the socket's own write timeout is restored once the call is over
    raw = tx.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)
    sec, usec = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
    assert (sec, usec) == (3, 0)


@pytest.mark.timeout(60)
def test_an_explicit_deadline_spans_several_calls(
        pair: tuple[socket.socket, socket.socket]) -> None:
    import time

    tx, _rx = pair
    deadline = time.monotonic() - 1.0  # already passed: nothing may be written
    with pytest.raises(TimeoutError) as ei:
        send_all(tx, b"x" * 10, deadline=deadline)
    assert "with 0 of 10 bytes written" in str(ei.value)


def test_grow_zeroed_holds_no_chunk_sized_temporary() -> None:
    buf = bytearray(b"abc")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        grow_zeroed(buf, 64 << 20)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(buf) == 64 << 20 and buf[:3] == b"abc" and buf.count(0) == len(buf) - 3
    # the buffer itself (with the allocator's over-allocation), never a second 64 MiB beside it
    assert peak < (64 << 20) * 1.25
    grow_zeroed(buf, 10)  # never shrinks
    assert len(buf) == 64 << 20


def test_keepalive_timings_come_from_the_spec_and_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = SPEC.raw["timeouts"]
    assert raw["TCP_KEEPALIVE_IDLE"]["seconds"] == 30.0
    assert raw["TCP_KEEPALIVE_INTERVAL"]["seconds"] == 5.0
    assert raw["TCP_KEEPALIVE_INTERVAL"]["probes"] == 3
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "1")
    assert keepalive_settings() == (30, 5, 3) and keepalive_bound() == 45.0
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.1")
    assert keepalive_settings() == (3, 1, 3) and keepalive_bound() == 6.0


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="needs Linux TCP options")
def test_configure_socket_turns_keepalive_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.1")
    lst = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    with lst, a, b:
        configure_socket(a, recv=0.1)
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 3
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 6000
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


class _TimedOutSocket:
    """A socket whose every call fails as the kernel reports a dead connection (ETIMEDOUT)."""

    def recv_into(self, view: memoryview, n: int) -> int:
        raise TimeoutError(errno.ETIMEDOUT, "Connection timed out")

    def sendmsg(self, buffers: object, *args: object) -> int:
        raise TimeoutError(errno.ETIMEDOUT, "Connection timed out")

    def getpeername(self) -> tuple[str, int]:
        return ("198.18.0.10", 4242)


def test_a_connection_the_kernel_gave_up_on_is_reported_not_polled_again() -> None:
    sock = _TimedOutSocket()
    stop = threading.Event()
    with pytest.raises(PeerTimedOut, match=r"read on the connection to 198\.18\.0\.10:4242 "
                       r"failed: the peer did not answer for \d+s \(TCP keepalive"):
        recv_exact_into(sock, memoryview(bytearray(4)), stop=stop)  # type: ignore[arg-type]
    with pytest.raises(PeerTimedOut, match="write on the connection"):
        send_all(sock, b"abc")  # type: ignore[arg-type]
    assert issubclass(PeerTimedOut, ConnectionError)
    assert not issubclass(PeerTimedOut, TimeoutError)
    assert "PeerTimedOut" in _netio.__all__


class _ScriptedSocket:
    """A socket whose ``recv_into`` plays a script: a byte string is received, None is a poll
    timeout (the socket's read timeout)."""

    def __init__(self, script: list[bytes | None]) -> None:
        self.script = script

    def recv_into(self, view: memoryview, n: int) -> int:
        step = self.script.pop(0)
        if step is None:
            raise TimeoutError("timed out")
        view[:len(step)] = step
        return len(step)


class _Clock:
    """``time`` for _netio_recv: ``monotonic`` returns the scripted instants, counting the reads."""

    def __init__(self, *instants: float) -> None:
        self.instants = list(instants)
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.instants.pop(0)


def test_recv_exact_reads_the_clock_only_when_a_wait_may_need_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A read filled by one ``recv_into`` (the common case) reads no clock, or once for a
    committed read (its starvation clock starts at the call); each partial read restarts the
    clock. Starvation is measured from the last progress: 2 bytes at t=1, a wait seen at t=60.5
    goes on (59.5 s), one at t=61.5 fails (60.5 s > 60 s)."""
    stop = threading.Event()
    for committed, reads in ((False, 0), (True, 1)):
        clock = _Clock(0.0)
        monkeypatch.setattr(_netio_recv, "time", clock)
        view = memoryview(bytearray(4))
        assert recv_exact_into(_ScriptedSocket([b"abcd"]), view, stop=stop,  # type: ignore[arg-type]
                               committed=committed, starvation=60.0) == 4
        assert bytes(view) == b"abcd" and clock.reads == reads
    clock = _Clock(0.0, 1.0, 60.5, 61.5)
    monkeypatch.setattr(_netio_recv, "time", clock)
    sock = _ScriptedSocket([b"ab", None, None])
    with pytest.raises(TruncatedInput) as ei:
        recv_exact_into(sock, memoryview(bytearray(4)), stop=stop,  # type: ignore[arg-type]
                        committed=True, starvation=60.0)
    assert ei.value.error_id == "mux.starved"
    assert dict(ei.value.fields) == {"seconds": "60", "got": 2, "need": 4}
    assert str(ei.value) == "relay_mux: committed read starved mid-frame for 60s (2 of 4 bytes)"
    assert clock.instants == [] and sock.script == []
    # a scaled starvation (FLODL_NET_TIMEOUT_SCALE) below a second is shown as it is, not as 0s
    clock = _Clock(0.0, 0.7)
    monkeypatch.setattr(_netio_recv, "time", clock)
    with pytest.raises(TruncatedInput) as ei:
        recv_exact_into(_ScriptedSocket([None]), memoryview(bytearray(4)),  # type: ignore[arg-type]
                        stop=stop, committed=True, starvation=0.6)
    assert str(ei.value) == "relay_mux: committed read starved mid-frame for 0.6s (0 of 4 bytes)"
    clock = _Clock(5.0, 6.0)  # not committed: no starvation before the first byte
    monkeypatch.setattr(_netio_recv, "time", clock)
    sock = _ScriptedSocket([None, None, b"x", None, b"yz"])
    view = memoryview(bytearray(3))
    assert recv_exact_into(sock, view, stop=stop, starvation=60.0) == 3  # type: ignore[arg-type]
    assert bytes(view) == b"xyz" and clock.reads == 2  # after "x", and at the wait after it


@pytest.mark.timeout(30)
def test_send_now_writes_a_small_record_in_one_call(pair: tuple[socket.socket, socket.socket],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A small record goes out whole in one non-blocking sendmsg from the calling thread."""
    tx, rx = pair
    calls: list[int] = []
    real = socket.socket.sendmsg

    class Counting(socket.socket):
        def sendmsg(self, buffers, *args):  # type: ignore[no-untyped-def, override]
            calls.append(args[1] if len(args) > 1 else 0)
            return real(self, buffers, *args)

    sock = Counting(fileno=tx.detach())
    try:
        assert _netio_send.send_now(sock, [b"head", memoryview(b"payload"), b"tag"]) == []
        assert calls == [socket.MSG_DONTWAIT | _netio_send.NO_SIGPIPE]
        got = bytearray(14)
        assert recv_exact_into(rx, memoryview(got)) == 14
        assert bytes(got) == b"headpayloadtag"
    finally:
        sock.close()


@pytest.mark.timeout(30)
def test_send_now_never_waits_and_returns_what_is_left(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A peer that does not read: the attempt stops at a full send buffer and returns the rest
    (for the writer thread); the bytes written plus the rest are the record, in order."""
    tx, _rx = pair
    record = bytes(range(256)) * 4096  # 1 MiB, far above both 4 KiB buffers
    rest = _netio_send.send_now(tx, [record[:1000], memoryview(record)[1000:]])
    left = sum(b.nbytes for b in rest)
    assert 0 < left < len(record)
    assert b"".join(bytes(b) for b in rest) == record[len(record) - left:]
    tx.close()
    rest2 = _netio_send.send_now(tx, [b"x"])  # a closed socket: no exception, nothing written
    assert [bytes(b) for b in rest2] == [b"x"]


def test_advance_skips_written_buffers_and_keeps_the_tail_of_a_partial_one() -> None:
    """The buffer advance shared by send_all and send_now: partial sends that end inside a
    buffer, exactly on a boundary, and across several buffers."""
    data = [b"abcd", b"ef", b"ghijk"]
    bufs = [memoryview(b) for b in data]
    i = _netio_send._advance(bufs, 0, 0)  # nothing sent
    assert i == 0 and [bytes(b) for b in bufs] == [b"abcd", b"ef", b"ghijk"]
    i = _netio_send._advance(bufs, i, 3)  # inside the first buffer
    assert i == 0 and [bytes(b) for b in bufs[i:]] == [b"d", b"ef", b"ghijk"]
    assert bufs[0].obj is data[0]  # a view of the caller's bytes, not a copy
    i = _netio_send._advance(bufs, i, 3)  # the first buffer's tail, then exactly the second
    assert i == 2 and [bytes(b) for b in bufs[i:]] == [b"ghijk"]
    i = _netio_send._advance(bufs, i, 2)
    assert i == 2 and [bytes(b) for b in bufs[i:]] == [b"ijk"]
    i = _netio_send._advance(bufs, i, 3)  # the rest
    assert i == 3 and bufs[i:] == []
    bufs = [memoryview(b) for b in data]
    assert _netio_send._advance(bufs, 0, 9) == 2  # across two boundaries into the third
    assert bytes(bufs[2]) == b"jk"
    assert _netio_send._advance(bufs, 1, 0) == 1  # a zero-byte send changes nothing


@pytest.mark.parametrize("parallel_min", [PARALLEL_MAC_MIN, 1],
                         ids=["one-step", "stepped"])
@pytest.mark.parametrize("cut", [0, 30], ids=["whole", "eof-inside"])
def test_read_record_into_feeds_each_range_once(
        pair: tuple[socket.socket, socket.socket], parallel_min: int, cut: int) -> None:
    # a small unit is read in one step (the default parallel_min), a larger one by the stepped
    # reader (forced here by parallel_min=1): both fill the buffer, grow a short bytearray and
    # feed each MAC exactly the bytes of its range that arrived, after what it was already fed
    a, b = pair
    salt = bytes(range(16))
    record = bytes(range(256)) * 2  # 512 bytes; the first 25 are already in the buffer
    size, start = len(record), 25
    a.sendall(record[start:size - cut])
    if cut:
        a.shutdown(socket.SHUT_WR)
    buf = bytearray(record[:start])  # shorter than the unit: grown as it arrives
    head, inner = hmac.new(salt, digestmod="sha256"), hmac.new(salt, digestmod="sha256")
    head.update(record[:start])  # a range that starts before `start`: those bytes were fed
    ranges = [(head, 10, size), (inner, start, size - 8)]
    view, got = _netio_recv.read_record_into(b, buf, size, ranges, start=start, grow_step=1 << 20,
                                        parallel_min=parallel_min)
    assert got == size - cut and len(buf) == size
    assert bytes(view[:got]) == record[:got]
    assert head.digest() == hmac.new(salt, record[:got], "sha256").digest()
    assert inner.digest() == hmac.new(salt, record[start:min(got, size - 8)], "sha256").digest()


class _AskedSocket(_ScriptedSocket):
    """A :class:`_ScriptedSocket` that keeps the byte count each ``recv_into`` asked for."""

    def __init__(self, script: list[bytes | None]) -> None:
        super().__init__(script)
        self.asked: list[int] = []

    def recv_into(self, view: memoryview, n: int) -> int:
        self.asked.append(n)
        return super().recv_into(view, n)


def test_recv_exact_with_least_returns_once_that_much_is_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``least``, every call asks for the rest of the view and the read returns as soon as
    ``least`` bytes are in: one call when they came together (no clock read: no wait follows),
    more while fewer arrived, short only at end of stream; without it the view is filled."""
    view = memoryview(bytearray(10))
    sock = _AskedSocket([b"abcdef", b"gh"])
    clock = _Clock()
    monkeypatch.setattr(_netio_recv, "time", clock)
    assert recv_exact_into(sock, view, least=4) == 6  # type: ignore[arg-type]
    assert sock.asked == [10] and bytes(view[:6]) == b"abcdef" and sock.script == [b"gh"]
    assert clock.reads == 0
    monkeypatch.undo()
    sock = _AskedSocket([b"ab", b"c", b"defg", b"h"])
    assert recv_exact_into(sock, view, least=4) == 7  # type: ignore[arg-type]
    assert sock.asked == [10, 8, 7] and bytes(view[:7]) == b"abcdefg"
    sock = _AskedSocket([b"ab", b""])  # the stream ends before `least`
    assert recv_exact_into(sock, view, least=4) == 2  # type: ignore[arg-type]
    sock = _AskedSocket([b"abcd", b"efghij"])
    assert recv_exact_into(sock, view) == 10  # type: ignore[arg-type]
    assert sock.asked == [10, 6]
    sock = _AskedSocket([])
    assert recv_exact_into(sock, view, least=0) == 0 and sock.asked == []  # type: ignore[arg-type]
    sock = _AskedSocket([None])  # a poll timeout before `least`: the caller's deadline
    with pytest.raises(TimeoutError, match="read timed out"):
        recv_exact_into(sock, view, least=4)  # type: ignore[arg-type]


class _Ticking:
    """``time`` for _netio_recv whose every ``monotonic`` read is 100 s after the last one (so any
    wait after progress exceeds a 60 s starvation bound)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 100.0
        return self.now


@pytest.mark.parametrize(("script", "size", "start", "step", "got"), [
    # stepped read: three whole 10-byte steps, then 5 bytes of the fourth, then silence
    ([b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 5, None], 100, 0, 10, 35),
    # one read after 5 bytes already in place (a header): 7 more, then silence
    ([b"x" * 7, None], 20, 5, 1 << 20, 12),
])
def test_a_starved_unit_counts_the_units_bytes_not_the_read_steps(
        monkeypatch: pytest.MonkeyPatch, script: list[bytes | None], size: int, start: int,
        step: int, got: int) -> None:
    """``mux.starved`` names how many of the record's (or frame's) bytes arrived and its
    length: a 1 GiB record starved after 10 bytes of a step said "10 of 4194304 bytes"."""
    monkeypatch.setattr(_netio_recv, "time", _Ticking())
    with pytest.raises(TruncatedInput) as ei:
        _netio_recv.read_record_into(_ScriptedSocket(script), bytearray(size),  # type: ignore[arg-type]
                                size, [], start=start, stop=threading.Event(),
                                starvation=60.0, step=step)
    assert ei.value.error_id == "mux.starved"
    assert dict(ei.value.fields) == {"seconds": "60", "got": got, "need": size}
    assert str(ei.value) == (f"relay_mux: committed read starved mid-frame for 60s "
                             f"({got} of {size} bytes)")

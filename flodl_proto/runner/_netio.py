"""Socket plumbing shared by the relay and the rank client.

Every cluster socket here is a *blocking* Python socket whose timeouts are set at the OS level
(``SO_RCVTIMEO`` / ``SO_SNDTIMEO``), so one socket can have a short read poll and a long
write-stall ceiling at the same time (Python's own ``settimeout`` covers both directions and
puts the descriptor in non-blocking mode). A timed-out ``recv`` or ``send`` then raises
``BlockingIOError``, exactly like a Rust ``read``/``write`` with a timeout returns ``WouldBlock``.

``socket.shutdown(SHUT_RDWR)`` from another thread wakes a blocked ``recv``/``send``; the
runners use it to stop their threads before joining them.

Upstream: ``flodl/src/distributed/wire.rs`` (``connect_with_retry``, ``WRITE_STALL_TIMEOUT``,
``net_timeout_scale``), ``relay/mux.rs`` (committed reads, starvation ceiling).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._oserr import os_reason
from ..addr import format_addr, parse_addr
from ..codec._common import BytesLike, as_view
from ..codec.auth import PARALLEL_MAC_MIN, Premac
from ..codec.plans import frame_macs, frame_premac
from ..errors import ProtocolError, protocol_error
from ..spec import SPEC, net_timeout_scale
from ._macworker import MacWorker

__all__ = [
    "DIRECT_WRITE_MAX",
    "HASH_STEP",
    "NOW_FLAGS",
    "NO_SIGPIPE",
    "MacRange",
    "MacWorker",
    "PeerTimedOut",
    "ReadDeadlinePassed",
    "Stopped",
    "buffers_nbytes",
    "committed_read_starvation",
    "configure_socket",
    "connect_attempts",
    "connect_with_retry",
    "format_addr",
    "grow_zeroed",
    "handshake_read_timeout",
    "keepalive_bound",
    "keepalive_settings",
    "parse_addr",
    "poll_interval",
    "read_frame_into",
    "read_record_into",
    "recv_exact_into",
    "recv_hashing_into",
    "reduce_read_deadline",
    "send_all",
    "send_at_once",
    "send_now",
    "set_timeouts",
    "shutdown_quietly",
    "skip_sent",
    "write_stall_timeout",
    "write_to_each",
]

log = logging.getLogger(__name__)

#: bytes received between two MAC updates by :func:`recv_hashing_into` (4 MiB)
HASH_STEP = 4 << 20

#: records up to this size are written by the thread that produced them (:func:`send_now`)
#: when nothing is queued before them on their connection; larger ones, and whatever a
#: non-blocking write left, go to the connection's writer thread (bytes)
DIRECT_WRITE_MAX = 1 << 20

#: a payload from this size on is written to several peers concurrently (:func:`write_to_each`;
#: bytes)
PARALLEL_FAN_OUT_MIN = 1 << 20

#: the most buffers :func:`send_at_once` hands to one ``sendmsg`` (more: the general writes,
#: which batch them by the system's IOV_MAX)
DIRECT_IOVECS = 64

#: ``sendmsg`` flag: a write to a peer that closed fails with EPIPE instead of raising SIGPIPE,
#: which kills a process that restored SIGPIPE's default action (Python itself ignores it, but
#: a program embedding the runners may not); 0 where the platform lacks it
NO_SIGPIPE: int = getattr(socket, "MSG_NOSIGNAL", 0)
#: ``MSG_DONTWAIT | MSG_NOSIGNAL``, or-ed once (or-ing the flag enums costs a microsecond a call)
NOW_FLAGS: int = int(socket.MSG_DONTWAIT) | NO_SIGPIPE

try:
    _IOV_MAX = max(16, min(1024, int(os.sysconf("SC_IOV_MAX"))))
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 1024


class Stopped(Exception):
    """A blocking read was abandoned because its owner asked the thread to stop."""


class ReadDeadlinePassed(TimeoutError):
    """A read given a ``deadline`` (:func:`recv_exact_into`) was still short when it passed;
    ``got``: the bytes of the unit read by then (they are in the caller's buffer)."""

    def __init__(self, got: int) -> None:
        super().__init__(f"read deadline passed after {got} bytes")
        self.got = got


class PeerTimedOut(ConnectionError):
    """The kernel gave up on the connection (``ETIMEDOUT``): keepalive probes went unanswered,
    or sent data stayed unacknowledged, for :func:`keepalive_bound` seconds. The peer vanished
    without closing (power loss, a partition, a frozen host)."""


def keepalive_settings() -> tuple[int, int, int]:
    """``(idle, interval, probes)`` of the TCP keepalive of every data-channel socket: idle and
    interval in whole seconds (scaled by ``FLODL_NET_TIMEOUT_SCALE``, ceil, at least 1).

    A departure (addition) from upstream: ``tcp_keepalive`` in ``spec/wire.yaml``.
    """
    scale = net_timeout_scale()
    idle = max(1, math.ceil(SPEC.timeout("TCP_KEEPALIVE_IDLE") * scale))
    interval = max(1, math.ceil(SPEC.timeout("TCP_KEEPALIVE_INTERVAL") * scale))
    probes = int(SPEC.raw["timeouts"]["TCP_KEEPALIVE_INTERVAL"]["probes"])
    return idle, interval, probes


def keepalive_bound() -> float:
    """Seconds within which a silent peer's connection fails: idle + probes x interval of
    :func:`keepalive_settings` (also the socket's TCP_USER_TIMEOUT)."""
    idle, interval, probes = keepalive_settings()
    return float(idle + probes * interval)


def set_keepalive(sock: socket.socket) -> None:
    """Turn on TCP keepalive with :func:`keepalive_settings` and set TCP_USER_TIMEOUT to
    :func:`keepalive_bound` (options the platform lacks are skipped)."""
    idle, interval, probes = keepalive_settings()
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", probes),
                        ("TCP_USER_TIMEOUT", int(keepalive_bound() * 1000))):
        opt = getattr(socket, name, None)
        if opt is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)


def write_stall_timeout() -> float:
    """SO_SNDTIMEO of every cluster socket, seconds: 30 s x ``FLODL_NET_TIMEOUT_SCALE``."""
    return SPEC.timeout("WRITE_STALL") * net_timeout_scale()


def connect_attempts() -> int:
    """``connect_with_retry`` attempts: ``ceil(60 x scale)``, at least 1."""
    attempts = int(SPEC.raw["timeouts"]["CONNECT_BACKOFF"]["attempts"])
    return max(1, math.ceil(attempts * net_timeout_scale()))


def handshake_read_timeout() -> float:
    """Handshake wait, seconds (10 s, not scaled): a rank's for its ack, a relay's for a local
    rank's handshake."""
    return SPEC.timeout("HANDSHAKE_READ")


def reduce_read_deadline() -> float:
    """Rank-side per-read deadline after the handshake, seconds: ``ceil(120 x scale)``, >= 1."""
    return float(max(1, math.ceil(SPEC.timeout("REDUCE_READ_DEADLINE") * net_timeout_scale())))


def poll_interval() -> float:
    """Relay socket poll period, seconds (100 ms)."""
    return SPEC.timeout("RELAY_POLL")


def committed_read_starvation() -> float:
    """A read inside a started record/blob that makes no progress this long fails (60 s)."""
    return SPEC.timeout("COMMITTED_READ_STARVATION")


class _Timeval(ctypes.Structure):
    """The C ``struct timeval`` that ``SO_RCVTIMEO`` / ``SO_SNDTIMEO`` take (native longs)."""

    _fields_ = (("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long))


def _timeval(seconds: float | None) -> bytes:
    if seconds is None or seconds <= 0:
        return bytes(_Timeval(0, 0))  # 0 = no timeout
    sec = int(seconds)
    usec = round((seconds - sec) * 1_000_000)
    if sec == 0 and usec == 0:
        usec = 1
    return bytes(_Timeval(sec, usec))


def set_timeouts(sock: socket.socket, *, recv: float | None = None,
                 send: float | None = None) -> None:
    """Set the OS-level read / write timeouts (seconds; ``None`` = block forever).

    The socket is left in blocking mode; a timed-out call raises ``BlockingIOError``.
    """
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(recv))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(send))


def configure_socket(sock: socket.socket, *, recv: float | None = None,
                     send: float | None = None) -> None:
    """TCP_NODELAY, TCP keepalive (:func:`set_keepalive`) and :func:`set_timeouts` (``send``
    defaults to the write-stall ceiling)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    set_keepalive(sock)
    set_timeouts(sock, recv=recv, send=write_stall_timeout() if send is None else send)


def connect_with_retry(addr: tuple[str, int], what: str, *,
                       stop: threading.Event | None = None,
                       on_retry: Callable[[str], None] | None = None) -> socket.socket:
    """TCP connect with the cluster retry budget (``connect_attempts()`` x 500 ms).

    Args:
        addr: ``(host, port)``.
        what: names the dial in the error (``"relay upstream"``, ``"cpu_reduce"``).
        stop: abandon the retries when set.
        on_retry: called once, when the first attempt failed and more follow, with one line
            naming the address, the error, the retry period and the budget (``"connect to
            HOST:PORT failed: <error>; retrying every 0.5s, giving up after ~30s (60
            attempts)"``), so a command can say it is waiting instead of retrying silently.

    Returns:
        A connected blocking socket (no timeouts set yet).

    Raises:
        ConnectionError: every attempt failed (message in upstream's wording:
            ``"<what>: connect to HOST:PORT failed after N attempts (~Ss): <last error>"``).
        Stopped: ``stop`` was set.

    Upstream: ``wire.rs`` ``connect_with_retry``.
    """
    attempts = connect_attempts()
    backoff = SPEC.timeout("CONNECT_BACKOFF")
    last: OSError | None = None
    for i in range(attempts):
        if stop is not None and stop.is_set():
            raise Stopped(what)
        try:
            return socket.create_connection(addr, timeout=max(backoff, 10.0))
        except OSError as e:
            last = e
            log.debug("%s: connect attempt %d/%d to %s failed: %s", what, i + 1, attempts,
                      format_addr(addr), e)
            if i + 1 < attempts:
                if i == 0 and on_retry is not None:
                    on_retry(f"connect to {format_addr(addr)} failed: {os_reason(e)}; "
                             f"retrying every {backoff:g}s, giving up after "
                             f"~{attempts * backoff:g}s ({attempts} attempts)")
                if stop is not None:
                    if stop.wait(backoff):
                        raise Stopped(what) from None
                else:
                    time.sleep(backoff)
    raise ConnectionError(
        f"{what}: connect to {format_addr(addr)} failed after {attempts} attempts "
        f"(~{attempts * backoff:g}s): {last}"
    )


def recv_exact_into(
    sock: socket.socket,
    view: memoryview,
    *,
    stop: threading.Event | None = None,
    committed: bool = False,
    starvation: float | None = None,
    least: int | None = None,
    deadline: float | None = None,
) -> int:
    """Fill ``view`` from ``sock``; return the number of bytes read (short only at end of stream).

    With ``least``, return as soon as at least that many bytes are in: each ``recv`` still
    asks for the rest of ``view``, so a unit whose size is only expected is read with one call
    when it has arrived, and nothing past ``view`` is taken (short of ``least`` only at end of
    stream).

    The socket's read timeout is the poll period: each timeout re-checks ``stop``. Until the
    first byte arrives (``committed`` False) the wait is unbounded; once a byte of the unit
    has arrived, a wait without progress longer than ``starvation`` seconds fails. With
    ``deadline`` (a :func:`time.monotonic` time), the whole unit must be in by then.

    Raises:
        Stopped: ``stop`` was set while waiting.
        ReadDeadlinePassed: ``deadline`` passed first (checked at each poll timeout).
        TimeoutError: no ``stop`` given and the read timed out (the caller's deadline).
        TruncatedInput (remote): a committed read starved (``mux.starved``).
        PeerTimedOut: the kernel gave up on the connection (keepalive or user timeout).
        OSError: a socket error other than a reset (a reset counts as end of stream).
    """
    n = len(view)
    need = n if least is None else least
    got = 0
    # the time of the last progress, read only when a later wait may need it: a committed read
    # starts the starvation clock now; otherwise it starts with the first byte
    last = time.monotonic() if committed else 0.0
    while got < need:
        try:
            r = sock.recv_into(view[got:], n - got)
        except (BlockingIOError, TimeoutError) as e:
            if isinstance(e, TimeoutError) and e.errno == errno.ETIMEDOUT:
                raise _timed_out(sock, "read") from None
            if stop is None:
                raise TimeoutError("read timed out") from None
            if stop.is_set():
                raise Stopped("read") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise ReadDeadlinePassed(got) from None
            if (committed or got) and starvation is not None \
                    and time.monotonic() - last > starvation:
                raise protocol_error("mux.starved", seconds=f"{starvation:g}", got=got,
                                     need=n) from None
            continue
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
        except (ConnectionResetError, ConnectionAbortedError):
            return got
        if r == 0:
            return got
        got += r
        if got < need:  # another wait may follow: the starvation clock restarts here
            last = time.monotonic()
    return got


@dataclass(slots=True)
class MacRange:
    """One MAC to compute over ``view[start:stop]`` of the buffer :func:`recv_hashing_into`
    fills (after whatever the MAC was already fed, e.g. a record's covered header bytes).

    Attributes:
        mac: a streaming MAC (from a :mod:`flodl_proto.codec.plans` plan).
        start, stop: the byte range of the filled view it covers (``stop`` clamped to the view).
        worker: run its updates on this :class:`MacWorker` (None: on the reading thread).
        done: bytes of the range already fed (maintained by the reader).
    """

    mac: Any
    start: int
    stop: int
    worker: MacWorker | None = None
    done: int = 0


def recv_hashing_into(
    sock: socket.socket,
    view: memoryview,
    macs: Sequence[MacRange],
    *,
    stop: threading.Event | None = None,
    committed: bool = False,
    starvation: float | None = None,
    start: int = 0,
    step: int = HASH_STEP,
    progress: Callable[[int], None] | None = None,
) -> int:
    """:func:`recv_exact_into` of ``view[start:]`` that also feeds each MAC its range's bytes as
    they arrive (ranges are offsets into ``view``; bytes before ``start`` were already fed).

    Bytes are read in steps of ``step`` bytes (default :data:`HASH_STEP`); after each step
    ``progress(filled)`` is called first, if given (``filled``: the bytes of ``view`` now in
    place, e.g. for a writer that forwards them), then every MAC is fed the newly filled part
    of its range (on the reading thread, or on its worker), so the hashing overlaps the peer's
    sending. Every worker is drained before this returns, so a MAC covering only received bytes
    is complete. Returns the number of bytes read into ``view[start:]`` (short only at end of
    stream; the MACs then cover only what arrived).

    Raises:
        everything :func:`recv_exact_into` raises.
    """
    n = len(view)
    got = start
    try:
        while got < n:
            upto = min(n, got + step)
            try:
                r = recv_exact_into(sock, view[got:upto], stop=stop,
                                    committed=committed or got > start,
                                    starvation=starvation)
            except ProtocolError as e:
                raise _starved_unit(e, got, n) from None
            got += r
            if progress is not None:
                progress(got)
            for m in macs:
                end = min(m.stop, got)
                begin = m.start + m.done
                if end > begin:
                    if m.worker is not None:
                        m.worker.submit(m.mac, view[begin:end])
                    else:
                        m.mac.update(view[begin:end])
                    m.done = end - m.start
            if got < upto:
                break
    finally:
        for m in macs:
            if m.worker is not None:
                m.worker.drain()
    return got - start


def read_record_into(
    sock: socket.socket,
    buf: bytearray | memoryview,
    size: int,
    ranges: Sequence[tuple[Any, int, int]],
    *,
    start: int = 0,
    stop: threading.Event | None = None,
    starvation: float | None = None,
    grow_step: int | None = None,
    worker: Callable[[], MacWorker] | None = None,
    parallel_min: int = PARALLEL_MAC_MIN,
    step: int = HASH_STEP,
    progress: Callable[[int], None] | None = None,
) -> tuple[memoryview, int]:
    """Read the rest of one record, frame or blob into ``buf``: bytes ``start..size`` (the bytes
    before ``start``, e.g. a header already read, are in place), every MAC of the codec's read
    plan fed its range as the bytes arrive. The one body reader of every runner (the controller
    per relay, the relay upstream and per rank, the rank's reply).

    Args:
        sock: the connection.
        buf: the destination. A ``bytearray`` with ``grow_step`` is grown (zero-filled, in steps
            of ``grow_step`` bytes as the bytes arrive, so a hostile length claim costs memory
            only as fast as the peer sends); otherwise it must hold ``size`` bytes.
        size: the unit's length in ``buf`` (bytes).
        ranges: ``(mac, start, stop)`` of the plan (``plans.FrameMacs.ranges`` /
            ``plans.RecordMacs.ranges``): offsets into ``buf``; bytes before ``start`` were fed.
        start: bytes already in ``buf``.
        stop, starvation: as :func:`recv_exact_into` (the read is committed: a unit has begun).
        worker: gives the MAC worker for a range after the first of at least ``parallel_min``
            bytes (hashed beside the reading thread); None, or a smaller range: on this thread.
        step, progress: as :func:`recv_hashing_into` (``progress`` gets the bytes of ``buf``
            in place, counted from its start; not called for a unit read in one step).

    Returns:
        ``(view, got)``: a view of ``buf`` (release it, or drop it, before growing ``buf``
        again) and the bytes now in it (``got < size``: the stream ended inside the unit; the
        MACs then cover only what arrived).

    Raises:
        everything :func:`recv_exact_into` raises.
    """
    if size - start <= step and size < parallel_min:
        # a small unit (the common case: every record of a small-frame round): one read, then
        # each MAC fed its range on this thread, as the stepped read below would do in one step
        if grow_step is not None and isinstance(buf, bytearray) and len(buf) < size:
            grow_zeroed(buf, size)
        view = memoryview(buf)
        try:
            got = start + recv_exact_into(sock, view[start:size], stop=stop, committed=True,
                                          starvation=starvation)
        except ProtocolError as e:
            raise _starved_unit(e, start, size) from None
        for mac, lo, hi in ranges:
            begin, end = max(lo, min(start, hi)), min(hi, got)
            if end > begin:
                mac.update(view[begin:end])
        return view, got
    macs = [MacRange(mac, lo, hi, worker() if worker is not None and i and hi - lo >= parallel_min
                     else None)
            for i, (mac, lo, hi) in enumerate(ranges)]
    for m in macs:
        m.done = max(0, min(start, m.stop) - m.start)
    view = memoryview(buf)
    got = start
    while got < size:
        if grow_step is not None and isinstance(buf, bytearray) \
                and len(buf) < min(size, got + grow_step):
            view.release()
            grow_zeroed(buf, min(size, got + grow_step))
            view = memoryview(buf)
        upto = min(size, len(view))
        try:
            n = recv_hashing_into(sock, view[:upto], macs, stop=stop, committed=True,
                                  starvation=starvation, start=got, step=step,
                                  progress=progress)
        except ProtocolError as e:
            raise _starved_unit(e, 0, size) from None
        got += n
        if got < upto:  # end of stream inside the unit
            break
    return view, got


def _starved_unit(error: ProtocolError, before: int, size: int) -> ProtocolError:
    """``error`` restated for the whole unit when it is a starved step's (``mux.starved``):
    ``before`` bytes of the unit were in before the step, ``size`` is the unit's length, so
    the message counts the record's or frame's bytes, not the read step's. Any other error
    is returned as it is."""
    if error.error_id != "mux.starved":
        return error
    return protocol_error("mux.starved", seconds=error.fields["seconds"],
                          got=before + error.fields["got"], need=size)


#: the zero block :func:`grow_zeroed` appends (1 MiB): the most it adds beside the buffer
_ZERO_STEP = bytes(1 << 20)


def grow_zeroed(buf: bytearray, size: int) -> None:
    """Grow ``buf`` to ``size`` bytes (zero-filled; a no-op when it is already that long).

    Appends a shared 1 MiB zero block step by step, so growing a record buffer by a 64 MiB read
    chunk never holds a second chunk-sized temporary (``buf.extend(bytes(n))`` builds one and
    copies it: two chunks at the peak). The allocator grows a large buffer in place.
    """
    step = memoryview(_ZERO_STEP)
    while len(buf) < size:
        buf += step[:min(step.nbytes, size - len(buf))]


def _flatten(buffers: Iterable[BytesLike]) -> list[memoryview]:
    out = []
    for b in buffers:
        mv = memoryview(b) if type(b) is bytes else as_view(b)  # bytes: flat "B" already
        if mv.nbytes:
            out.append(mv)
    return out


def _advance(bufs: list[memoryview], i: int, sent: int) -> int:
    """Account for ``sent`` bytes of a ``sendmsg`` that started at ``bufs[i]``.

    Buffers written whole are skipped; a buffer written in part is replaced in ``bufs`` by the
    view of its unwritten tail (no copy). Returns the index of the first buffer with bytes left
    (``len(bufs)`` when everything was written). ``sent`` is in bytes, at most what
    ``bufs[i:]`` holds (``sendmsg`` never reports more than it was given).
    """
    while sent and i < len(bufs):
        ln = bufs[i].nbytes
        if sent >= ln:
            sent -= ln
            i += 1
        else:
            bufs[i] = bufs[i][sent:]
            sent = 0
    return i


def send_all(sock: socket.socket, buffers: Sequence[BytesLike] | BytesLike, *,
             deadline: float | None = None) -> int:
    """Write every buffer with ``sendmsg`` (batches of at most IOV_MAX, partial sends resumed).

    The write-stall timeout is a deadline for the whole call, not for each ``sendmsg``: a peer
    that reads a little now and then cannot stretch it (a socket's ``SO_SNDTIMEO`` restarts on
    every partial send; spec departure ``write_stall_deadline``). The first ``sendmsg`` is
    bounded by the socket's own ``SO_SNDTIMEO`` (:func:`configure_socket` sets the write-stall
    timeout); after a partial send ``SO_SNDTIMEO`` is lowered to the time left, and restored
    before this returns.

    Args:
        sock: a blocking socket.
        buffers: one bytes-like object, or a sequence of them written in order.
        deadline: ``time.monotonic()`` value by which everything must be written (default: now
            plus :func:`write_stall_timeout`); pass one deadline to several calls that write
            one record.

    Returns:
        Bytes written.

    Raises:
        TimeoutError: the deadline passed before everything was written (message: "write
            stalled ...", with the bytes written and the total).
        PeerTimedOut: the kernel gave up on the connection (keepalive or user timeout).
        OSError: the connection failed.

    Upstream: ``wire.rs`` (``WRITE_STALL_TIMEOUT`` as the socket write timeout).
    """
    if isinstance(buffers, bytes | bytearray | memoryview):
        bufs = _flatten([buffers])
    else:
        bufs = _flatten(buffers)
    rearm = deadline is not None  # a caller's deadline may be nearer than SO_SNDTIMEO
    started = time.monotonic()  # the default deadline is computed only if a send is partial
    want = sum(b.nbytes for b in bufs)
    total = 0
    i = 0
    saved: bytes | None = None  # the socket's SO_SNDTIMEO before this call lowered it

    def stalled() -> TimeoutError:
        return TimeoutError(f"write stalled: the {write_stall_timeout():g}s write-stall deadline "
                            f"passed with {total} of {want} bytes written (peer not reading)")

    try:
        while i < len(bufs):
            if rearm:
                if deadline is None:
                    deadline = started + write_stall_timeout()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise stalled()
                if saved is None:
                    saved = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                            len(_timeval(1.0)))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(left))
            try:
                sent = sock.sendmsg(bufs[i:i + _IOV_MAX], (), NO_SIGPIPE)
            except BlockingIOError:
                raise stalled() from None
            except TimeoutError as e:
                if e.errno == errno.ETIMEDOUT:
                    raise _timed_out(sock, "write") from None
                raise
            except InterruptedError:  # pragma: no cover
                continue
            total += sent
            if total == want:  # everything written (a small record's one sendmsg)
                break
            i = _advance(bufs, i, sent)
            rearm = True  # a partial send: what is left gets only the time left
    finally:
        if saved is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, saved)
    return total


def send_now(sock: socket.socket, buffers: Sequence[BytesLike]) -> list[memoryview]:
    """Write as much of ``buffers`` as the socket takes without waiting (``MSG_DONTWAIT``
    ``sendmsg`` calls) and return what is left (an empty list: everything was written).

    Never blocks and never raises: a full send buffer, and any socket error, end the attempt
    with the rest returned, so the caller hands it to a writer thread whose :func:`send_all`
    waits under the write-stall deadline and reports the error. One ``sendmsg`` writes a small
    record whole (TCP_NODELAY: one segment, no Nagle wait).
    """
    bufs = _flatten(buffers)
    i = 0
    while i < len(bufs):
        try:
            sent = sock.sendmsg(bufs[i:i + _IOV_MAX], (), NOW_FLAGS)
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
        except OSError:  # full (BlockingIOError) or failed: the writer takes over
            break
        i = _advance(bufs, i, sent)
    return bufs[i:]


def _timed_out(sock: socket.socket, what: str) -> PeerTimedOut:
    try:
        peer = f" to {format_addr(sock.getpeername())}"
    except OSError:  # already disconnected: the caller knows whom it talked to
        peer = ""
    return PeerTimedOut(errno.ETIMEDOUT,
                        f"{what} on the connection{peer} failed: the peer did not answer for "
                        f"{keepalive_bound():g}s (TCP keepalive / user timeout)")


def shutdown_quietly(sock: socket.socket | None, how: int = socket.SHUT_RDWR) -> None:
    """``sock.shutdown(how)``, ignoring errors (wakes threads blocked on the socket)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(how)


def buffers_nbytes(buffers: Sequence[BytesLike]) -> int:
    """The bytes in ``buffers`` (any bytes-like objects)."""
    n = 0
    for b in buffers:
        n += len(b) if type(b) is bytes else memoryview(b).nbytes
    return n


def send_at_once(sock: socket.socket, buffers: Sequence[BytesLike], nbytes: int) -> int:
    """One non-blocking ``sendmsg`` of ``buffers`` (``nbytes`` bytes in all, flat or not):
    the bytes it wrote (a small record leaves whole, with none of :func:`send_now`'s buffer
    walk). 0 when the socket takes nothing now, when there are more than
    :data:`DIRECT_IOVECS` buffers, or when it failed: the caller's general write
    (:func:`send_now`, :func:`send_all`), which waits and reports errors, goes on from what
    this wrote (:func:`skip_sent`). Never raises."""
    if len(buffers) > DIRECT_IOVECS:
        return 0
    try:
        return sock.sendmsg(buffers, (), NOW_FLAGS)
    except OSError:
        return 0


def skip_sent(buffers: Sequence[BytesLike], sent: int) -> Sequence[BytesLike]:
    """``buffers`` without their first ``sent`` bytes (flat views, no copy; ``buffers``
    itself when ``sent`` is 0)."""
    if not sent:
        return buffers
    out: list[BytesLike] = []
    for b in buffers:
        mv = memoryview(b).cast("B")
        n = mv.nbytes
        if sent >= n:
            sent -= n
            continue
        out.append(mv[sent:] if sent else mv)
        sent = 0
    return out


def write_to_each(targets: Sequence[tuple[int, socket.socket]], prefix: bytes,
                  payload: memoryview, failed: Callable[[int, OSError], None]) -> int:
    """Write ``prefix`` then ``payload`` to every ``(id, socket)`` of ``targets`` (the relay's
    Broadcast fan-out); returns the bytes written in all (a target whose write failed counts
    nothing). A failed write calls ``failed(id, error)`` (the target's stream is then cut inside
    the record: the caller must write nothing more to it) and the others go on.

    Below :data:`PARALLEL_FAN_OUT_MIN` bytes of payload, or with one target, every target is
    first offered the whole record in one non-blocking ``sendmsg`` (:func:`send_at_once`), so a
    peer that reads slowly, or not at all, delays no target after it; what a socket did not take
    is then written under the write-stall deadline (:func:`send_all`), by the caller for one
    such target, by a thread each for more. From that size on every target after the first is
    written by its own thread at once (each peer reads and verifies at its own pace), the first
    by the caller. Every thread is joined here.
    """
    nbytes = len(prefix) + payload.nbytes
    bufs: list[BytesLike] = [prefix, payload]
    if len(targets) < 2 or payload.nbytes < PARALLEL_FAN_OUT_MIN:
        written = 0
        rest: list[tuple[int, socket.socket, Sequence[BytesLike]]] = []
        for ident, sock in targets:
            sent = send_at_once(sock, bufs, nbytes)
            if sent == nbytes:
                written += nbytes
            else:
                rest.append((ident, sock, skip_sent(bufs, sent)))
        return written + _finish_each(rest, nbytes, failed) if rest else written
    return _finish_each([(ident, sock, bufs) for ident, sock in targets], nbytes, failed)


def _finish_each(items: Sequence[tuple[int, socket.socket, Sequence[BytesLike]]], nbytes: int,
                 failed: Callable[[int, OSError], None]) -> int:
    """:func:`send_all` of each item's buffers to its socket (the first by the caller, every
    other by a thread of its own, joined here); ``nbytes`` counted per item written whole,
    ``failed(id, error)`` called for the others."""
    counts: list[int] = []

    def one(ident: int, sock: socket.socket, buffers: Sequence[BytesLike]) -> None:
        try:
            send_all(sock, buffers)
            counts.append(nbytes)
        except OSError as e:
            failed(ident, e)

    threads = [threading.Thread(target=one, args=item, name=f"flodl-relay-fan-r{item[0]}")
               for item in items[1:]]
    for t in threads:
        t.start()
    try:
        one(*items[0])
    finally:
        for t in threads:
            t.join()
    return sum(counts)


def read_frame_into(sock: socket.socket, view: memoryview, salt: bytes, *,
                    stop: threading.Event | None = None,
                    starvation: float | None = None) -> tuple[int, Premac | None]:
    """Read a RoundFrame that fills ``view`` (a loopback blob whose length prefix was read),
    its MAC computed as the codec's read plan names it (:func:`~flodl_proto.codec.plans.
    frame_macs`): returns the bytes read and the frame's :class:`~flodl_proto.codec.auth.Premac`
    (valid only when every byte arrived). Below ``PARALLEL_MAC_MIN`` bytes: one
    :func:`recv_exact_into` and one MAC update (:func:`~flodl_proto.codec.plans.frame_premac`);
    otherwise :func:`read_record_into` with the plan's ranges.

    Raises:
        everything :func:`recv_exact_into` raises.
    """
    n = len(view)
    if n < PARALLEL_MAC_MIN:  # read_record_into's one-read case, without its set-up
        got = recv_exact_into(sock, view, stop=stop, committed=True, starvation=starvation)
        return got, frame_premac(view, salt) if got == n else None
    plan = frame_macs(n, salt)
    _, got = read_record_into(sock, view, n, plan.ranges(), stop=stop, starvation=starvation)
    return got, plan.premac()

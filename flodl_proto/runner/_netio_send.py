"""The writes of every runner: a record written whole under the write-stall deadline
(:func:`send_all`), as much as the socket takes now (:func:`send_now`, :func:`send_at_once`,
:func:`skip_sent`), and the relay's Broadcast fan-out to several peers (:func:`write_to_each`).
The socket settings and the errors a write raises are in :mod:`flodl_proto.runner._netio`.

Upstream: ``flodl/src/distributed/wire.rs`` (``WRITE_STALL_TIMEOUT`` as the socket write
timeout), ``relay/agent.rs`` (the Broadcast fan-out to each rank).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from .._threads import start_thread
from ..codec._common import BytesLike, as_view
from ._netio import _timed_out, _timeval, write_stall_timeout

__all__ = [
    "DIRECT_IOVECS",
    "DIRECT_WRITE_MAX",
    "NOW_FLAGS",
    "NO_SIGPIPE",
    "PARALLEL_FAN_OUT_MIN",
    "buffers_nbytes",
    "send_all",
    "send_at_once",
    "send_now",
    "skip_sent",
    "write_to_each",
]

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
    bounded by the socket's own ``SO_SNDTIMEO``
    (:func:`~flodl_proto.runner._netio.configure_socket` sets the write-stall timeout); after a
    partial send ``SO_SNDTIMEO`` is lowered to the time left, and restored before this returns.

    Args:
        sock: a blocking socket.
        buffers: one bytes-like object, or a sequence of them written in order.
        deadline: ``time.monotonic()`` value by which everything must be written (default: now
            plus :func:`~flodl_proto.runner._netio.write_stall_timeout`); pass one deadline to
            several calls that write one record.

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
            try:  # send_at_once of the two buffers, inline
                sent = sock.sendmsg(bufs, (), NOW_FLAGS)
            except OSError:
                sent = 0
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
        start_thread(t)
    try:
        one(*items[0])
    finally:
        for t in threads:
            t.join()
    return sum(counts)

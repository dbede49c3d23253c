"""The reads of every runner: a unit of bytes filled from a blocking socket under the poll, the
starvation bound and a deadline (:func:`recv_exact_into`), hashed as it arrives
(:func:`recv_hashing_into`), the one body reader of records, frames and blobs, driven by the
codec's read plans (:func:`read_record_into`), and a loopback RoundFrame's read
(:func:`read_frame_into`). The socket settings and the errors a wait raises are in
:mod:`flodl_proto.runner._netio`.

Upstream: ``flodl/src/distributed/relay/mux.rs`` (committed reads, starvation ceiling).
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..codec.auth import PARALLEL_MAC_MIN, Premac
from ..codec.plans import frame_macs, frame_premac
from ..errors import ProtocolError, protocol_error
from ._macworker import MacWorker
from ._netio import ReadDeadlinePassed, Stopped, _timed_out

__all__ = [
    "HASH_STEP",
    "HASH_STEP_MIN",
    "MacRange",
    "grow_zeroed",
    "read_frame_into",
    "read_record_into",
    "recv_exact_into",
    "recv_hashing_into",
]

#: the most bytes received between two MAC updates by :func:`recv_hashing_into` (4 MiB)
HASH_STEP = 4 << 20
#: the fewest bytes between two MAC updates of a unit read or written in steps (1 MiB)
HASH_STEP_MIN = 1 << 20


def hash_step(size: int) -> int:
    """The bytes read, or written, between two MAC updates of a unit of ``size`` bytes: a
    quarter of the unit, at least :data:`HASH_STEP_MIN` and at most :data:`HASH_STEP`.

    A frame of a few MiB is so hashed in four steps, each overlapping the transfer of the next
    (the reader verifies step ``k`` while the writer hashes step ``k + 1``), where one step of
    the whole frame would leave each side idle while the other hashes; a large frame keeps
    steps of 4 MiB, whose per-step cost (a wake-up of the MAC worker, a write) is small
    beside them. Measured with ``bench/round.py`` (``bench/RESULTS.md``).
    """
    return min(HASH_STEP, max(HASH_STEP_MIN, size >> 2))


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
        worker: run its updates on this :class:`~flodl_proto.runner._macworker.MacWorker`
            (None: on the reading thread).
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
    step: int | None = None,
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
        step: bytes read between two MAC updates (default: :func:`hash_step` of ``size``).
        progress: as :func:`recv_hashing_into` (gets the bytes of ``buf`` in place, counted
            from its start; not called for a unit read in one step).

    Returns:
        ``(view, got)``: a view of ``buf`` (release it, or drop it, before growing ``buf``
        again) and the bytes now in it (``got < size``: the stream ended inside the unit; the
        MACs then cover only what arrived).

    Raises:
        everything :func:`recv_exact_into` raises.
    """
    if step is None:
        step = hash_step(size)
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

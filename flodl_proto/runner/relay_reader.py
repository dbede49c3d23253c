"""The controller's read side of one relay connection: bytes -> codec -> events for the core.

One reader thread per relay connection reads the channel magic, then each mux record: its
25-byte header (checked at once: magic, version, ``payload_len`` against the frame ceiling and,
for the first record, the largest legal Hello), then the payload into a pooled buffer grown in
64 MiB steps as bytes arrive, the MACs computed meanwhile as the codec's plan names them
(:func:`~flodl_proto.codec.plans.record_macs`; the inner frame of a HostFrame of at least
:data:`~flodl_proto.codec.auth.PARALLEL_MAC_MIN` bytes on a worker thread, started at the first
such record; a smaller one on the reading thread, as a hand-off costs more than it saves).
A record read in one step (below ``PARALLEL_MAC_MIN`` bytes, every record of a small-frame
round) takes its record and inner-frame digests from MACs keyed once per connection
(:func:`~flodl_proto.codec.plans.record_premac_for`, :func:`~flodl_proto.codec.plans.
frame_premac_for`) instead of a plan built per record; the same reads, errors and events.
The connection's :class:`~flodl_proto.codec.stream.MuxStream` turns the bytes into events
(verifying the tags against the MACs); the events go to the coordinator through ``post``.

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``reduce_reader``), ``relay/mux.rs``
(``read_record``: committed reads, EOF inside a header is a clean end).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Final

from ..codec._common import unviewed
from ..codec.auth import PARALLEL_MAC_MIN, Premac
from ..codec.mux import MuxHeader, header_or_none
from ..codec.plans import frame_premac_for, record_macs, record_premac_for
from ..codec.stream import MuxStream, StreamEvent
from ..errors import ProtocolError
from ..spec import CHANNEL_MAGIC_LEN, MUX_HEADER_LEN, READ_CHUNK, REC_HOST_FRAME
from ._macworker import MacWorker
from ._netio import PeerTimedOut, Stopped, committed_read_starvation
from ._netio_recv import (
    HASH_STEP,
    _starved_unit,
    grow_zeroed,
    read_record_into,
    recv_exact_into,
)

__all__ = ["POOL_PER_CONN", "BufferPool", "read_relay_connection"]

log = logging.getLogger("flodl_proto.runner.controller")

#: record buffers kept per connection
POOL_PER_CONN: Final = 3


class BufferPool:
    """Record buffers of one connection, reused across rounds.

    A buffer is free when nothing holds a view of it (frames decoded from a record are views of
    its buffer; :func:`~flodl_proto.codec._common.unviewed` tells whether one is alive).

    No upstream counterpart: buffer reuse of this package's reader (upstream grows a buffer for an
    untrusted length in 64 MiB steps, ``wire.rs`` ``READ_CHUNK``).
    """

    __slots__ = ("_bufs",)

    def __init__(self) -> None:
        self._bufs: list[bytearray] = []

    def acquire(self) -> bytearray:
        """A free buffer of the pool (grown by the reader as a record needs), or a new one."""
        for buf in self._bufs:
            if unviewed(buf):
                return buf
        buf = bytearray(MUX_HEADER_LEN)
        if len(self._bufs) < POOL_PER_CONN:
            self._bufs.append(buf)
        return buf



def read_relay_connection(sock: socket.socket, stream: MuxStream,
                          post: Callable[[list[StreamEvent]], None], *,
                          stop: threading.Event, salt: bytes, ceiling: int, label: str,
                          worker_name: str) -> None:
    """Read one relay connection until its stream is done, posting its events.

    Args:
        sock: the connection.
        stream: its parser (channel magic, then records).
        post: called with each non-empty list of events, in order.
        stop: set when the controller stops (reads poll it).
        salt: the session salt (MAC key).
        ceiling: frame ceiling in bytes.
        label: names the connection in logs.
        worker_name: the inner-frame MAC worker thread's name.

    A starved committed read fails the stream; a dead connection (keepalive), EOF or a read
    error ends it (EOF); a stop returns quietly.

    Upstream: ``controller/mod.rs`` ``reduce_reader`` and ``relay/mux.rs`` ``read_record``.
    """
    starve = committed_read_starvation()
    pool = BufferPool()
    worker = _LazyWorker(worker_name)
    keyed = _Keyed(salt, worker)

    def emit(events: list[StreamEvent]) -> None:
        if events:
            post(events)

    try:
        magic = bytearray(CHANNEL_MAGIC_LEN)
        got = recv_exact_into(sock, memoryview(magic), stop=stop, starvation=starve)
        events = stream.feed(memoryview(magic)[:got])
        if got < CHANNEL_MAGIC_LEN:
            events += stream.feed_eof()
        emit(events)
        while not stream.done:
            emit(_read_record(sock, stream, pool, starve, keyed, stop, salt, ceiling))
    except Stopped:
        pass
    except ProtocolError as e:  # a starved committed read
        emit(stream.fail(e))
    except PeerTimedOut as e:  # keepalive: the relay vanished without closing
        log.warning("controller: %s is dead: %s", label, e)
        emit(stream.feed_eof())
    except OSError as e:
        log.debug("controller: read on %s failed: %s", label, e)
        emit(stream.feed_eof())
    finally:
        worker.close()


class _LazyWorker:
    """The connection's inner-frame MAC worker, started when a large HostFrame first needs it."""

    __slots__ = ("_name", "_worker")

    def __init__(self, name: str) -> None:
        self._name = name
        self._worker: MacWorker | None = None

    def get(self) -> MacWorker:
        if self._worker is None:
            self._worker = MacWorker(self._name)
        return self._worker

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


class _Keyed:
    """A connection's per-record helpers: its MAC worker, and the record and inner-frame
    digests of a record read in one step, keyed with the session salt once per connection
    (:func:`~flodl_proto.codec.plans.record_premac_for`,
    :func:`~flodl_proto.codec.plans.frame_premac_for`)."""

    __slots__ = ("frame_premac", "record_premac", "worker")

    def __init__(self, salt: bytes, worker: _LazyWorker) -> None:
        self.worker = worker
        self.record_premac = record_premac_for(salt)
        self.frame_premac = frame_premac_for(salt)


def _read_record(sock: socket.socket, stream: MuxStream, pool: BufferPool, starve: float,
                 keyed: _Keyed, stop: threading.Event, salt: bytes,
                 ceiling: int) -> list[StreamEvent]:
    buf = pool.acquire()
    view = memoryview(buf)
    got = recv_exact_into(sock, view[:MUX_HEADER_LEN], stop=stop, starvation=starve)
    if got < MUX_HEADER_LEN:
        events = stream.feed(view[:got])
        del view
        return events + stream.feed_eof()
    hdr = header_or_none(view, ceiling)  # None: parse_mux_header would raise
    if hdr is None:
        return stream.feed(view[:MUX_HEADER_LEN])  # reports that error
    if hdr.payload_len > stream.limit_for(hdr.kind):  # a first record larger than any Hello,
        return stream.feed(view[:MUX_HEADER_LEN])  # a later Control longer: the stream says so
    view.release()  # the buffer grows as the payload arrives
    total = MUX_HEADER_LEN + hdr.payload_len
    # read_record_into's one-read case (a record of a small-frame round): see _read_small
    read = _read_small if hdr.payload_len <= HASH_STEP and total < PARALLEL_MAC_MIN \
        else _read_planned
    return read(sock, stream, buf, hdr, total, starve, keyed, stop, salt)


def _read_planned(sock: socket.socket, stream: MuxStream, buf: bytearray, hdr: MuxHeader,
                  total: int, starve: float, keyed: _Keyed, stop: threading.Event,
                  salt: bytes) -> list[StreamEvent]:
    """The payload of the record whose checked header ``hdr`` is in ``buf`` (``total``: the
    record's bytes), read with the codec's MAC plan (:func:`~flodl_proto.codec.plans.
    record_macs`) fed as the bytes arrive; the stream's events for it."""
    # MACs computed as the payload arrives: the record's here, a large HostFrame's inner
    # frame (assumed to fill the payload; the decode hashes it itself otherwise) on the worker
    plan = record_macs(buf, hdr, salt, inner_frame=True)  # the header: its first bytes
    view, got = read_record_into(sock, buf, total, plan.ranges(), start=MUX_HEADER_LEN,
                                 stop=stop, starvation=starve, grow_step=READ_CHUNK,
                                 worker=keyed.worker.get, parallel_min=PARALLEL_MAC_MIN)
    if got < total:  # EOF inside the record
        events = stream.feed(view[:got])
        del view
        return events + stream.feed_eof()
    events = stream.feed(view[:total], premac=plan.premac(),
                         frame_premac=plan.frame_premac(), header=hdr)
    del view
    return events


def _read_small(sock: socket.socket, stream: MuxStream, buf: bytearray, hdr: MuxHeader,
                total: int, starve: float, keyed: _Keyed, stop: threading.Event,
                salt: bytes) -> list[StreamEvent]:
    """:func:`_read_planned` for a record whose payload is at most ``HASH_STEP`` bytes and
    whose ``total`` bytes are below ``PARALLEL_MAC_MIN`` (read in one step by
    :func:`~flodl_proto.runner._netio_recv.read_record_into`): one committed read of the
    payload, then the record digest over header bytes 0..17 and the payload, and a HostFrame's
    inner-frame digest over the payload but its last 8 bytes, through the connection's keyed
    MACs instead of a plan built per record; the same buffer, reads, errors and events."""
    if len(buf) < total:
        grow_zeroed(buf, total)
    view = memoryview(buf)
    try:
        got = MUX_HEADER_LEN + recv_exact_into(sock, view[MUX_HEADER_LEN:total], stop=stop,
                                               committed=True, starvation=starve)
    except ProtocolError as e:
        raise _starved_unit(e, MUX_HEADER_LEN, total) from None
    if got < total:  # EOF inside the record
        events = stream.feed(view[:got])
        del view
        return events + stream.feed_eof()
    payload = view[MUX_HEADER_LEN:total]
    premac: Premac = keyed.record_premac(view, payload)
    frame = keyed.frame_premac(payload) if hdr.kind == REC_HOST_FRAME else None
    events = stream.feed(view[:total], premac=premac, frame_premac=frame, header=hdr)
    del view, payload
    return events

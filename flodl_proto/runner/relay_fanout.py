"""The relay's controller-side read (:class:`UpstreamReader`) and its cut-through Broadcast
fan-out (:class:`BroadcastStream`): a large Broadcast goes to the local ranks as it arrives from
the controller, not after.

A Broadcast record carries its auth tag in its header, so the relay can check it only once the
whole payload has arrived; waiting for that before writing to any rank puts the relay's whole
read and MAC in line before every rank's own read and MAC (the round's fan-out stage). Instead,
when the core gives a route for the record from its header
(:meth:`~flodl_proto.fsm.relay_core.RelayCore.broadcast_route`), a :class:`BroadcastStream`
writes the payload to each rank of the route while the reader is still receiving and hashing
it, all but its last ``hold`` bytes (the inner frame's auth tag): no rank can complete the
frame before the relay has checked the record. When the core takes the checked record (its
:class:`~flodl_proto.fsm.events.FanOut`), :meth:`BroadcastStream.commit` releases the tail;
when the record fails its check or the stream ends inside it, :meth:`BroadcastStream.abort`
closes every rank the stream wrote to (their streams are cut inside a frame: spec departure
``broadcast_cut_through``).

Each rank is written by a thread of its own under the write-stall deadline (a rank that reads
slowly, or not at all, delays neither the reader nor the other ranks); a failed or stalled
write calls the caller's ``failed`` hook, as the whole-record fan-out does
(:func:`~flodl_proto.runner._netio_send.write_to_each`, departure ``broadcast_write_failure``).
No tensor byte is copied: the writers send views of the record buffer the reader fills, and
every writer has finished when :meth:`~BroadcastStream.commit` or
:meth:`~BroadcastStream.abort` returns, so the buffer may be reused for the next record.

Upstream: none (``flodl/src/distributed/relay/agent.rs`` reads the whole record, then writes
it to each rank in turn).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from .._threads import start_thread
from ..codec._common import END_OF_STREAM, BytesLike
from ..codec.auth import PARALLEL_MAC_MIN
from ..codec.mux import (
    MuxHeader,
    MuxRecord,
    control_too_long,
    parse_mux_header_or_eos,
    read_mux_record_or_eos,
)
from ..codec.plans import record_macs, record_premac_for
from ..errors import ProtocolError
from ..spec import MUX_HEADER_LEN, REC_CONTROL
from ._netio import Stopped, shutdown_quietly, write_stall_timeout
from ._netio_recv import HASH_STEP, _starved_unit, hash_step, read_record_into, recv_exact_into
from ._netio_send import send_all

__all__ = ["CUT_THROUGH_MIN", "FORWARD_STEP", "BroadcastStream", "UpstreamReader"]

#: Broadcast payloads from this size on are forwarded as they arrive (bytes); smaller ones
#: are read whole first (their round's time is the path's fixed cost, not the bytes)
CUT_THROUGH_MIN = 1 << 20

#: the reader's step while forwarding (bytes): how far the writers may trail the bytes received
FORWARD_STEP = 512 << 10


class BroadcastStream:
    """Forward one Broadcast payload to local ranks while it arrives (see the module doc).

    Args:
        targets: ``(rank, socket)`` of each rank of the route (blocking sockets).
        prefix: the payload's 4-byte loopback length prefix, written first.
        payload: a view of the whole payload's buffer (``len(payload)`` bytes, filled by the
            reader from the start; only bytes reported by :meth:`arrived` are read).
        hold: payload bytes kept back until :meth:`commit` (the inner frame's auth tag).
        failed: called with ``(rank, error)`` on a writer's thread when a write fails or
            stalls past the write-stall deadline; that rank gets nothing more.

    Raises:
        ValueError: ``hold`` is not between 1 and the payload's length.
        RuntimeError: a writer thread could not be started (the writers already started are
            stopped and joined first; nothing was written to any rank).

    Attributes:
        written: bytes written to ranks that got the whole record (prefix and payload), set
            by :meth:`commit`.

    Upstream: none (``relay/agent.rs`` writes a checked record to each rank in turn).
    """

    def __init__(self, targets: Sequence[tuple[int, socket.socket]], prefix: bytes,
                 payload: memoryview, hold: int,
                 failed: Callable[[int, OSError], None]) -> None:
        if not 0 < hold <= payload.nbytes:
            raise ValueError(f"hold {hold} outside 1..{payload.nbytes}")
        self._prefix = prefix
        self._payload = payload
        self._hold = hold
        self._failed = failed
        self._cond = threading.Condition()
        self._avail = 0  # payload bytes the writers may send
        self._end: int | None = None  # set by commit: everything may go
        self._keep: frozenset[int] | None = None  # set by commit: the ranks that get the rest
        self._deadline: float | None = None  # set by commit: by when the rest must be written
        self._aborted = False
        self._started: set[int] = set()  # ranks whose stream has begun
        self._whole: list[int] = []  # ranks written whole
        self.written = 0
        self._socks = dict(targets)
        self._threads = [threading.Thread(target=self._write, args=(rank, sock),
                                          name=f"flodl-relay-fwd-r{rank}")
                         for rank, sock in targets]
        started: list[threading.Thread] = []
        try:
            for t in self._threads:
                start_thread(t)
                started.append(t)
        except BaseException:  # e.g. no thread left: the writers started must not wait forever
            with self._cond:
                self._aborted = True
                self._cond.notify_all()
            for t in started:
                t.join()
            raise

    def arrived(self, filled: int) -> None:
        """The first ``filled`` payload bytes are in the buffer: all but the held-back tail may
        go."""
        avail = filled - self._hold
        if avail > self._avail:
            with self._cond:
                self._avail = avail
                self._cond.notify_all()

    def commit(self, ranks: Sequence[int]) -> int:
        """The record was checked and the core fanned it out to ``ranks``: write the rest to
        those of them on the route; a rank of the route not in ``ranks`` (it left meanwhile)
        gets nothing more and, if its stream began, is closed at once. Waits for every writer:
        at most one write-stall deadline from now (what is left is written under one deadline
        taken here; a piece being written began earlier under its own, which ends sooner);
        returns the bytes written to ranks that got it whole."""
        with self._cond:
            self._end = self._payload.nbytes
            self._keep = frozenset(ranks)
            # one write-stall deadline for everything written from here on: a piece already
            # being written began before and ends before it, so the wait is one stall at most
            self._deadline = time.monotonic() + write_stall_timeout()
            cut = self._started - self._keep  # a rank left out begins no stream from here on
            self._cond.notify_all()
        self._cut(cut)
        self._join()
        self.written = len(self._whole) * (len(self._prefix) + self._payload.nbytes)
        return self.written

    def abort(self) -> None:
        """The record failed its check, or did not arrive whole: write nothing more, close every
        rank whose stream began (cut inside a frame, it cannot resynchronise; a writer blocked
        on it fails at once), and wait for every writer."""
        with self._cond:
            self._aborted = True
            cut = set(self._started)  # no writer starts a stream from here on
            self._cond.notify_all()
        self._cut(cut)
        self._join()

    def _cut(self, ranks: set[int]) -> None:
        """Close the streams of ``ranks`` before their writers are joined: a writer blocked on
        a rank that reads nothing fails at once instead of holding the caller for the
        write-stall deadline."""
        for rank in ranks:
            shutdown_quietly(self._socks[rank])

    def _join(self) -> None:
        for t in self._threads:
            t.join()

    def _cut_off(self, rank: int) -> bool:
        """True when ``rank``'s stream was cut by :meth:`abort` or :meth:`commit`."""
        with self._cond:
            return self._aborted or (self._keep is not None and rank not in self._keep)

    def _write(self, rank: int, sock: socket.socket) -> None:
        sent = 0  # payload bytes written
        first = True
        payload = self._payload
        while True:
            with self._cond:
                while not self._aborted and self._end is None and self._avail <= sent:
                    self._cond.wait()
                if self._aborted or (self._keep is not None and rank not in self._keep):
                    return
                upto = self._end if self._end is not None else self._avail
                deadline = self._deadline  # None before the commit: one stall per piece
                if first:
                    self._started.add(rank)
            if upto > sent:
                piece = payload[sent:upto]
                bufs: list[BytesLike] = [self._prefix, piece] if first else [piece]
                first = False
                try:
                    send_all(sock, bufs, deadline=deadline)
                except OSError as e:
                    if not self._cut_off(rank):  # a write that failed, not a cut stream
                        self._failed(rank, e)
                    return
                sent = upto
            if sent == payload.nbytes:
                with self._cond:
                    self._whole.append(rank)
                return


class UpstreamReader:
    """Reads the relay's records from the controller, one at a time: the header (polling the
    stop flag), then exactly the payload into a buffer reused from record to record (the record
    is used before the next read: fan-out, control), the record MAC computed as it arrives and
    checked by the codec's decode.

    When ``route(kind, payload_len, payload_view)`` returns a :class:`BroadcastStream` for a
    record (the relay asks its core for a route, from :data:`CUT_THROUGH_MIN` bytes), the
    payload is forwarded as it arrives (read in :data:`FORWARD_STEP` steps); the stream is left
    in :attr:`forwarding` for the caller to commit once its core has taken the record, or is
    aborted here when the read or the check fails.

    Args:
        salt: the session salt (16 bytes). version, ceiling: the relay's protocol version and
            frame ceiling (bytes).
        stop: the relay's stop flag.
        route: see above; returns None to read the whole record first.
        count: called with the bytes read (header and payload) of each record.
        control_limit: the largest payload, in bytes, of a Control record (None: the ceiling);
            the relay passes :func:`~flodl_proto.codec.mux.max_control_payload` of its world
            size (spec departure ``control_bound``).

    Upstream: ``flodl/src/distributed/relay/mux.rs`` (``read_record``), ``relay/agent.rs``.
    """

    def __init__(self, salt: bytes, version: int, ceiling: int, stop: threading.Event,
                 route: Callable[[int, int, memoryview], BroadcastStream | None],
                 count: Callable[[int], None], *, control_limit: int | None = None) -> None:
        self._salt, self._version, self._ceiling, self._stop = salt, version, ceiling, stop
        self._control_limit = ceiling if control_limit is None else control_limit
        self._route, self._count = route, count
        self._header = memoryview(bytearray(MUX_HEADER_LEN))
        self._record_premac = record_premac_for(salt)  # a small record's MAC, keyed once
        self._buf: npt.NDArray[np.uint8] | None = None
        #: the stream of the record last returned, forwarded as it arrived (None: not one)
        self.forwarding: BroadcastStream | None = None

    def read(self, sock: socket.socket, starvation: float | None) -> MuxRecord | None:
        """Read one record; None at the end of the stream (inside the header: a clean end;
        inside the payload: the codec's decode says which). ``starvation``: the committed-read
        starvation bound (seconds), as :func:`~flodl_proto.runner._netio_recv.recv_exact_into`.

        Raises:
            Stopped: the stream ended inside the record after the stop flag was set (the
                relay's own shutdown cut it, not the peer).
            LimitExceeded (remote) ``relay.control_too_long``: a Control record's header claims
                more than ``control_limit`` bytes (its payload is not read; the codec's rule,
                :func:`~flodl_proto.codec.mux.control_too_long`).
            every error of :func:`~flodl_proto.runner._netio_recv.read_record_into` and of the
            codec's ``read_mux_record_or_eos`` (a bad tag: AuthenticationError).
        """
        hv = self._header
        got = recv_exact_into(sock, hv, stop=self._stop, starvation=starvation)
        if got < MUX_HEADER_LEN:
            self._count(got)
            return None  # end of stream inside the header is a clean end
        hdr = parse_mux_header_or_eos(hv, ceiling=self._ceiling)
        assert hdr is not END_OF_STREAM  # the view holds the whole header (for the type)
        if hdr.kind == REC_CONTROL:  # the codec's control bound, asked of Control records only
            too_long = control_too_long(hdr.kind, hdr.payload_len, self._control_limit, "relay")
            if too_long is not None:
                self._count(MUX_HEADER_LEN)
                raise too_long
        size = MUX_HEADER_LEN + hdr.payload_len
        if self._buf is None or self._buf.shape[0] != size:
            self._buf = np.empty(size, dtype=np.uint8)
        view = self._buf.data
        view[:MUX_HEADER_LEN] = hv
        try:
            fwd = self._route(hdr.kind, hdr.payload_len, view[MUX_HEADER_LEN:])
        except BaseException:  # the header was read all the same
            self._count(MUX_HEADER_LEN)
            raise
        if fwd is None and size < PARALLEL_MAC_MIN and size - MUX_HEADER_LEN <= HASH_STEP:
            return self._read_small(sock, view, size, hdr, starvation)
        # the record MAC is computed as the payload arrives (the tag is checked by the decode)
        plan = record_macs(hv, hdr, self._salt)
        progress: Callable[[int], None] | None = None
        if fwd is not None:
            stream = fwd

            def progress(filled: int) -> None:  # bytes of the record: the payload's after
                stream.arrived(filled - MUX_HEADER_LEN)
        try:
            _, got = read_record_into(
                sock, view, size, plan.ranges(), start=MUX_HEADER_LEN, stop=self._stop,
                starvation=starvation, step=FORWARD_STEP if fwd else hash_step(size),
                progress=progress)
        except BaseException:
            self._count(MUX_HEADER_LEN)
            if fwd is not None:
                fwd.abort()
            raise
        body = got - MUX_HEADER_LEN
        self._count(got)  # the header and the payload
        if got < size and self._stop.is_set():
            # the relay stopping shut the connection down inside the record: not the peer's cut
            if fwd is not None:
                fwd.abort()
            raise Stopped("read")
        try:
            res = read_mux_record_or_eos(view[:MUX_HEADER_LEN + body], self._salt,
                                         version=self._version, ceiling=self._ceiling,
                                         premac=plan.premac(body), header=hdr)
        except BaseException:
            if fwd is not None:
                fwd.abort()
            raise
        assert res is not END_OF_STREAM  # the buffer holds the whole header
        if fwd is not None and res[0] is None:  # the stream ended inside the record
            fwd.abort()
            fwd = None
        self.forwarding = fwd
        return res[0]

    def _read_small(self, sock: socket.socket, view: memoryview, size: int, hdr: MuxHeader,
                    starvation: float | None) -> MuxRecord | None:
        """The rest of :meth:`read` for a record not forwarded whose payload is read in one
        step (``size``: the record's bytes, below ``PARALLEL_MAC_MIN``, its header in place in
        ``view``): what :func:`~flodl_proto.runner._netio_recv.read_record_into`'s one-read
        case and :func:`~flodl_proto.codec.plans.record_macs`' plan give (one committed read of
        the payload, then the record MAC over header bytes 0..17 and the payload bytes that
        arrived), without building the plan; the same counts, errors and record."""
        try:
            got = MUX_HEADER_LEN + recv_exact_into(sock, view[MUX_HEADER_LEN:size],
                                                   stop=self._stop, committed=True,
                                                   starvation=starvation)
        except ProtocolError as e:
            self._count(MUX_HEADER_LEN)
            raise _starved_unit(e, MUX_HEADER_LEN, size) from None
        except BaseException:
            self._count(MUX_HEADER_LEN)
            raise
        self._count(got)  # the header and the payload
        if got < size and self._stop.is_set():
            # the relay stopping shut the connection down inside the record: not the peer's cut
            raise Stopped("read")
        premac = self._record_premac(view, view[MUX_HEADER_LEN:got])
        res = read_mux_record_or_eos(view[:got], self._salt, version=self._version,
                                     ceiling=self._ceiling, premac=premac, header=hdr)
        assert res is not END_OF_STREAM  # the buffer holds the whole header
        self.forwarding = None
        return res[0]

"""The relay's running half: the fold barrier's threads and the plumbing they share.

:class:`~flodl_proto.runner.relay.Relay` builds on :class:`_RelayBarrier`, which holds what
runs once the local ranks are in and the controller has acknowledged Hello: one reader thread
per local rank (its loopback blobs into the core's fold, a departure reported as RankExit), the
upstream reader (the controller's records into the core, a Broadcast fanned out to the alive
local ranks, as it arrives when it is large), and the outbound writer (the records upstream
that were not written at once by the thread that produced them, through a bounded queue, in
round order). Every core call is made under one lock and its actions executed here
(:meth:`_RelayBarrier._core_call`); a failure ends the relay (:meth:`_RelayBarrier._fail`).
Also here: the relay's counters (:class:`RelayStats`). Internal to
:mod:`flodl_proto.runner.relay` (the attributes are :class:`~flodl_proto.runner.relay.Relay`'s,
set by its constructor).

Upstream: ``flodl/src/distributed/relay/agent.rs`` (``RelayChannel``'s rank readers, upstream
reader and writer: the fold barrier).
"""

from __future__ import annotations

import functools
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._oserr import os_reason
from .._threads import start_thread
from ..codec._common import BytesLike
from ..codec.auth import Premac
from ..codec.mux import MuxRecord, RecordKind
from ..errors import ProtocolError
from ..fsm.events import (
    CloseRank,
    DrainUpstream,
    FanOut,
    Finished,
    RelayAction,
    SendUpstream,
    UpstreamKind,
)
from ..fsm.relay_core import RelayCore
from ..reduce import HostFold
from . import stages
from ._netio import PeerTimedOut, Stopped, format_addr, poll_interval, shutdown_quietly
from ._netio_send import (
    DIRECT_WRITE_MAX,
    buffers_nbytes,
    send_all,
    send_at_once,
    send_now,
    skip_sent,
    write_to_each,
)
from .relay_fanout import CUT_THROUGH_MIN, BroadcastStream, UpstreamReader
from .relay_ranks import RankBlobReader

__all__ = ["RelayStats"]

#: the relay's logger: its records name the relay runner, as before the runner was split
log = logging.getLogger("flodl_proto.runner.relay")


@dataclass(frozen=True, slots=True)
class _Record:
    """An outbound-queue item: a record (or what a direct write left of it) to write upstream.

    ``host_frame_round``: the round (from 0) of a HostFrame, for the stage trace; None for
    other records."""

    buffers: list[BytesLike]
    host_frame_round: int | None


@dataclass(frozen=True, slots=True)
class _Drained:
    """An outbound-queue item queued after the last local rank left: the writer flushes and
    closes upstream."""


_Outbound: TypeAlias = _Record | _Drained


@dataclass(slots=True)
class RelayStats:
    """Byte and round counters of a relay (bytes include prefixes and record headers).

    Attributes:
        from_ranks: bytes read from local ranks (handshakes included), counted once per
            blob, when it has been read or its read failed.
        to_ranks: bytes written to local ranks (acks and fanned-out consensus frames).
        upstream_out: bytes written to the controller (magic, Hello, HostFrames, RankExits).
        upstream_in: bytes read from the controller, counted once per record, when it has
            been read or its read failed (a record being read is not in it yet).
        host_frames: HostFrame records queued.
        broadcasts: Broadcast records received.

    No upstream counterpart: byte and round counters of this package's relay.
    """

    from_ranks: int = 0
    to_ranks: int = 0
    upstream_out: int = 0
    upstream_in: int = 0
    host_frames: int = 0
    broadcasts: int = 0


class _RelayBarrier:
    """The fold barrier's threads, the core calls and the relay's shared plumbing (the
    attributes are :class:`~flodl_proto.runner.relay.Relay`'s, set by its constructor)."""

    host: str
    ranks: tuple[int, ...]
    ceiling: int
    stats: RelayStats
    _controller: tuple[str, int]
    _core: RelayCore
    _fold: HostFold
    _salt: bytes
    _timed: bool
    _starve: float
    _stop: threading.Event
    _lock: threading.Lock
    _core_lock: threading.Lock
    _fanout_lock: threading.RLock
    _error: BaseException | None
    _rank_socks: dict[int, socket.socket]
    _pending: list[socket.socket]
    _upstream: socket.socket | None
    _workers: list[threading.Thread]
    _queue: queue.Queue[_Outbound]
    _out_lock: threading.Lock
    _out_queued: int
    _up_reader: UpstreamReader

    # -- plumbing --------------------------------------------------------------------------------
    def _fail(self, err: BaseException) -> None:
        self._stop.set()
        with self._lock:
            if self._error is None and not isinstance(err, Stopped):
                self._error = err
                log.info("relay %s (ranks %s) failed: %s", self.host, list(self.ranks), err)
        self._wake_all()

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def _count_upstream_in(self, n: int) -> None:
        """``_count("upstream_in", n)`` (the upstream reader's per-record count)."""
        with self._lock:
            self.stats.upstream_in += n

    def _wake_all(self) -> None:
        with self._lock:
            socks = [*self._rank_socks.values(), *self._pending]
            up = self._upstream
        shutdown_quietly(up)
        # a Broadcast already received is delivered whole before the rank sockets go down
        # (each rank write is bounded by the write-stall timeout), as upstream's relay does:
        # its upstream reader finishes a fan-out before it sees the shutdown flag
        with self._fanout_lock:
            for s in socks:
                shutdown_quietly(s)

    # -- the controller's records ----------------------------------------------------------------
    def _read_record(self, sock: socket.socket) -> MuxRecord | None:
        """Read one mux record from the controller; None at EOF.

        Raises:
            PeerTimedOut: the connection died silently (keepalive), naming the controller.
            everything :meth:`UpstreamReader.read <flodl_proto.runner.relay_fanout.
            UpstreamReader.read>` raises.
        """
        try:
            return self._up_reader.read(sock, self._starve)
        except PeerTimedOut as e:
            raise PeerTimedOut(e.errno, f"controller {format_addr(self._controller)}: "
                                        f"{e.strerror}") from None

    def _forward(self, kind: int, payload_len: int,
                 payload: memoryview) -> BroadcastStream | None:
        """Start forwarding a record's payload to the ranks as it arrives, if it is large and
        the core gives it a route (:mod:`flodl_proto.runner.relay_fanout`)."""
        if payload_len < CUT_THROUGH_MIN:
            return None
        with self._core_lock:
            route = self._core.broadcast_route(kind, payload_len)
        if route is None:
            return None
        targets = [(r, s) for r in route.ranks if (s := self._rank_socks.get(r)) is not None]
        if not targets:
            return None
        return BroadcastStream(targets, route.prefix, payload, route.hold,
                               self._broadcast_failed)

    # -- phase 3: the fold barrier ---------------------------------------------------------------
    def _spawn_workers(self) -> None:
        def spawn(target: Callable[..., None], name: str, *args: Any) -> None:
            t = threading.Thread(target=self._guard, args=(target, *args), name=name)
            self._workers.append(t)
            start_thread(t)

        spawn(self._outbound_writer, "flodl-relay-out")
        spawn(self._upstream_reader, "flodl-relay-up")
        for rank in self.ranks:
            spawn(self._rank_reader, f"flodl-relay-r{rank}", rank)

    def _guard(self, target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        except Stopped:
            pass
        except BaseException as e:
            self._fail(e)

    def _enqueue(self, item: _Outbound) -> None:
        while True:
            if self._stop.is_set():
                raise Stopped("enqueue")
            try:
                self._queue.put(item, timeout=poll_interval())
                return
            except queue.Full:
                continue

    def _core_call(self, method: Callable[..., list[RelayAction]], *args: Any,
                   **kwargs: Any) -> None:
        """Call a core input and execute its actions: the records it queues are queued under
        the same lock (round order); a fan-out runs after the lock is released (the rank
        readers and the upstream reader make this call inline: :meth:`_rank_reader`,
        :meth:`_upstream_reader`)."""
        with self._core_lock:
            actions = method(*args, **kwargs)
            if not actions:  # most deposits
                return
            fan_outs = self._execute(actions)
        for f in fan_outs:
            self._fan_out(f)

    def _execute(self, actions: list[RelayAction]) -> list[FanOut]:
        """Execute a core call's actions, under the core lock (:meth:`_core_call`): returns
        its fan-outs, for the caller to run once it has released the lock."""
        fan_outs: list[FanOut] = []
        for a in actions:
            if isinstance(a, SendUpstream):
                self._send_upstream(a)
            elif isinstance(a, FanOut):
                fan_outs.append(a)
            elif isinstance(a, DrainUpstream):
                self._queue_upstream(_Drained())
            elif isinstance(a, CloseRank):
                with self._lock:
                    sock = self._rank_socks.get(a.rank)
                shutdown_quietly(sock)  # its reader ends; the core sends no RankExit
            elif isinstance(a, Finished):
                self._finished(a)
            else:  # pragma: no cover - accept-phase actions never come from these inputs
                raise AssertionError(f"unexpected action {a!r}")
        return fan_outs

    def _send_upstream(self, action: SendUpstream) -> None:
        """Write a record upstream now (small, nothing queued before it: one non-blocking
        ``sendmsg``), else queue it, or what that write left, for the outbound writer; a
        HostFrame is counted (``host_frames``) either way."""
        host_frame = action.kind is UpstreamKind.HOST_FRAME
        buffers: Sequence[BytesLike] = action.buffers
        written, whole = 0, False
        up = self._upstream
        # one read of the count, without the lock: the writer lowers it only once its write
        # is done, and it is raised only under the core lock, which this thread holds
        if self._out_queued == 0 and up is not None:
            nbytes = buffers_nbytes(buffers)
            if nbytes <= DIRECT_WRITE_MAX:
                sent = send_at_once(up, buffers, nbytes)
                if sent < nbytes:
                    buffers = send_now(up, skip_sent(buffers, sent))
                    written = nbytes - sum(b.nbytes for b in buffers)
                    whole = not buffers
                else:
                    written, whole = nbytes, True
        with self._lock:  # both counters under one hold
            if host_frame:
                self.stats.host_frames += 1
            self.stats.upstream_out += written
        if whole:
            if host_frame and stages.is_enabled():
                stages.mark("relay", self._fold.rounds_completed - 1, "hostframe_sent")
            return
        self._queue_upstream(_Record(list(buffers), self._fold.rounds_completed - 1
                                     if host_frame else None))

    def _queue_upstream(self, item: _Outbound) -> None:
        with self._out_lock:
            self._out_queued += 1
        try:
            self._enqueue(item)
        except BaseException:
            with self._out_lock:
                self._out_queued -= 1
            raise

    def _finished(self, action: Finished) -> None:
        """The core ended the relay: a clean end stops it, an error fails it."""
        if action.outcome.error is not None:
            self._fail(action.outcome.error)
        else:
            self._stop.set()
            self._wake_all()

    def _rank_reader(self, rank: int) -> None:
        sock = self._rank_socks[rank]
        fold = self._fold
        reader = RankBlobReader(self._salt, self.ceiling, self._stop,
                                functools.partial(fold.has_deposited, rank))
        rank_frame, timed = self._core.rank_frame, self._timed
        core_lock, stopped = self._core_lock, self._stop.is_set
        try:
            while not stopped():
                got = self._read_blob(rank, sock, reader)
                if got is None:
                    break
                blob, premac = got
                if stages.is_enabled():
                    stages.mark("relay", self._fold.rounds_completed, "deposits_done")
                # deposit and HostFrame queued in round order (_core_call's steps, inline); the
                # time is for a rank deadline
                now = time.monotonic() if timed else None
                with core_lock:
                    actions = rank_frame(rank, blob, premac=premac, now=now)
                    fan_outs = self._execute(actions) if actions else None
                    # dropped now, not at the next deposit: a HostFrame's buffers are the
                    # core's kept record image, rewritten in place only once no view is alive
                    del actions
                if fan_outs:
                    for f in fan_outs:
                        self._fan_out(f)
            else:
                return
            # local end of stream (or a broken loopback stream): out of the barrier, tell upstream
            if not self._stop.is_set():
                self._core_call(self._core.rank_left, rank)
        except Stopped:
            pass

    def _read_blob(self, rank: int, sock: socket.socket,
                   reader: RankBlobReader) -> tuple[memoryview, Premac | None] | None:
        """One loopback blob of ``rank`` and the MAC of its bytes before the last 8 (computed as
        they arrived: the frame's MAC when the frame fills the blob), or None when the rank is
        gone.

        End of stream, a reset, a prefix above the ceiling, a blob cut short or starved: the
        rank is treated as gone (upstream's rank reader turns every read error into RankExit).
        ``reader``: the rank's :class:`~flodl_proto.runner.relay_ranks.RankBlobReader`.
        """
        before = reader.received  # bytes read, counted once per blob (or when the read fails)
        try:
            res = reader.read(sock, self._starve)
            if res is None:
                return None
            view, body, premac = res
        except ProtocolError as e:
            log.warning("relay %s: rank %d loopback stream failed: %s", self.host, rank, e)
            return None
        except OSError as e:
            log.info("relay %s: rank %d loopback read failed: %s", self.host, rank, e)
            return None
        finally:
            with self._lock:
                self.stats.from_ranks += reader.received - before
        if body < len(view):
            log.warning("relay %s: rank %d closed inside a %d-byte blob (%d bytes read)",
                        self.host, rank, len(view), body)
            return None
        return view, premac

    def _upstream_reader(self) -> None:
        up = self._upstream
        assert up is not None
        upstream_record, core_lock = self._core.upstream_record, self._core_lock
        up_reader, stopped = self._up_reader, self._stop.is_set
        while not stopped():
            rec = self._read_record(up)
            broadcast = rec is not None and rec.kind is RecordKind.BROADCAST
            if broadcast:
                with self._lock:
                    rnd = self.stats.broadcasts
                    self.stats.broadcasts = rnd + 1
            traced = broadcast and stages.is_enabled()
            if traced:
                stages.mark("relay", rnd, "broadcast_read")
            try:  # _core_call's steps, inline
                with core_lock:
                    actions = upstream_record(rec)
                    fan_outs = self._execute(actions) if actions else None
                    del actions  # as in _rank_reader: no action outlives its call
                if fan_outs:
                    for f in fan_outs:
                        self._fan_out(f)
            finally:
                fwd = up_reader.forwarding
                if fwd is not None:  # the core took no FanOut from it (it failed or ended)
                    up_reader.forwarding = None
                    fwd.abort()
            if traced:
                stages.mark("relay", rnd, "fanout_done")
            if rec is None:
                return

    def _fan_out(self, action: FanOut) -> None:
        up_reader = self._up_reader
        fwd = up_reader.forwarding
        if fwd is not None:
            up_reader.forwarding = None
        with self._fanout_lock:
            if fwd is not None:  # forwarded as it arrived: the checked record's tail
                n = fwd.commit(action.ranks)
            else:
                socks = self._rank_socks
                targets = [(rank, sock) for rank in action.ranks
                           if (sock := socks.get(rank)) is not None]
                n = write_to_each(targets, action.prefix, action.payload, self._broadcast_failed)
            with self._lock:
                self.stats.to_ranks += n

    def _broadcast_failed(self, rank: int, error: OSError) -> None:
        # a stream cut inside a Broadcast cannot resynchronise: closed; its reader reports it
        log.warning("relay %s: broadcast to rank %d failed: %s; closing it", self.host, rank,
                    error)
        shutdown_quietly(self._rank_socks.get(rank))

    def _outbound_writer(self) -> None:
        up = self._upstream
        assert up is not None
        while True:
            try:
                item = self._queue.get(timeout=poll_interval())
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if isinstance(item, _Drained):
                shutdown_quietly(up, socket.SHUT_WR)
                self._stop.set()  # first: a thread blocked queueing under the core lock lets go
                self._wake_all()
                self._core_call(self._core.drained)
                return
            if self._stop.is_set():
                return
            buffers = item.buffers
            host_frame_round = item.host_frame_round
            del item
            try:
                n = send_all(up, buffers)
                # the record's buffers (the fold's pooled arrays) are free for its next round
                del buffers
                with self._out_lock:
                    self._out_queued -= 1
                if host_frame_round is not None:
                    stages.mark("relay", host_frame_round, "hostframe_sent")
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
                log.info("relay %s: controller connection closed while writing: %s",
                         self.host, os_reason(e))
                self._stop.set()  # first: a thread blocked queueing under the core lock lets go
                self._wake_all()
                self._core_call(self._core.controller_closed,
                                f"connection closed while writing: {os_reason(e)}")
                return
            self._count("upstream_out", n)

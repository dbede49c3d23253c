"""The per-host relay of the data channel: local ranks on loopback, one connection upstream.

The relay's protocol rules (which ranks it accepts, the handshakes, Hello/HelloAck, the fold
barrier, RankExit, DeclareDead, the drain) live in the sans-IO
:class:`~flodl_proto.fsm.relay_core.RelayCore`; this runner owns the sockets, threads and
buffers, feeds the core what happened (one lock serialises the calls) and executes the actions
it returns. A :class:`Relay` binds the loopback data port (upstream's default: the controller's
port + 4), reads each local rank's 16-byte handshake for the core, then dials the controller and
sends what the core answers. It then runs the fold barrier:

* one reader thread per local rank reads ``u32 length | RoundFrame`` blobs (prefix checked
  against the frame ceiling, then ``recv_into`` one buffer of exactly that length) and deposits
  them into the core's :class:`~flodl_proto.reduce.HostFold`; the deposit (or death) that
  completes a round queues one ``HostFrame`` record;
* one upstream reader (the sole writer of the rank sockets) fans every ``Broadcast`` payload out
  verbatim (``u32 length | payload``) to every alive local rank (a rank whose write fails or
  stalls is closed, so it leaves), and applies ``DeclareDead``;
* records upstream (HostFrame, RankExit) are written by the thread whose core call produced
  them when they are small (up to 1 MiB) and nothing is queued before them, with one
  non-blocking ``sendmsg``; the others, and whatever that write left, go to one outbound
  writer thread through a bounded queue of 64 records (round order is kept: the core lock
  serialises the producers, and nothing is written directly while the queue holds a record).

A local rank that closes (or whose stream breaks) is marked dead in the fold (which may complete
the round) and reported upstream with ``RankExit``. The relay ends when the controller closes its
connection, when the last local rank has left (its records are flushed first, then the upstream
connection is closed), or on a fatal error (parse, MAC, schema, double deposit, an upstream
protocol error, a stalled upstream write), which :meth:`Relay.wait` reports.

Upstream: ``flodl/src/distributed/relay/agent.rs`` (``RelayChannel``, the fold barrier),
``relay/mod.rs`` (loopback port offsets), ``relay/mux.rs`` (records, len-framed blobs).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias

from ..addr import PORT_MAX
from ..codec._common import BytesLike
from ..codec.auth import Premac
from ..codec.ceiling import check_frame_ceiling
from ..codec.mux import MuxRecord, RecordKind
from ..errors import ProtocolError, protocol_error
from ..fsm.deadline import check_timeout
from ..fsm.events import (
    AckRank,
    CloseRank,
    DrainUpstream,
    FanOut,
    Finished,
    RankConnected,
    RelayAction,
    SendUpstream,
    UpstreamKind,
)
from ..fsm.relay_core import RelayCore
from ..reduce import HostFold
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_LEN,
    RELAY_DATA_LOOPBACK_OFFSET,
    RELAY_OUTBOUND_QUEUE,
    net_timeout_scale,
)
from . import stages
from ._netio import (
    PeerTimedOut,
    ReadDeadlinePassed,
    Stopped,
    committed_read_starvation,
    configure_socket,
    connect_with_retry,
    format_addr,
    handshake_read_timeout,
    parse_addr,
    poll_interval,
    shutdown_quietly,
)
from ._netio_recv import recv_exact_into
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

__all__ = ["Relay", "RelayStats", "default_relay_port"]

log = logging.getLogger(__name__)

#: period of the note naming the local ranks not connected yet (seconds)
_WAITING_NOTE_PERIOD = 10.0


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


def default_relay_port(controller_port: int) -> int:
    """Upstream's loopback data port of a host relay: the controller's port + 4.

    Upstream: ``relay/mod.rs`` ``RELAY_DATA_LOOPBACK_OFFSET``.
    """
    return controller_port + RELAY_DATA_LOOPBACK_OFFSET


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
    """

    from_ranks: int = 0
    to_ranks: int = 0
    upstream_out: int = 0
    upstream_in: int = 0
    host_frames: int = 0
    broadcasts: int = 0


class Relay:
    """One host's data-channel relay.

    Args:
        controller: the controller's address, ``"HOST:PORT"`` or ``(host, port)``.
        ranks: the global rank ids of this host (non-empty, distinct, each < ``world_size``).
        world_size: the cluster's world size (every rank's handshake must carry it).
        salt: the 16-byte session salt.
        version: data-channel protocol version (2 default, or 3).
        listen_host: loopback address to bind (``127.0.0.1``).
        listen_port: the rank-facing port; ``None`` = the controller's port + 4 (upstream's
            default), ``0`` = any free port (read :attr:`port` after :meth:`start`).
        host: the host name announced in ``Hello`` (diagnostic; default the machine's name).
        ceiling: frame ceiling in bytes for every length read (default 1 GiB).
        rank_timeout: seconds (before ``FLODL_NET_TIMEOUT_SCALE``, applied here) after a
            round's first local deposit after which a local rank that has not sent its frame is
            declared dead, its connection closed, and the host's round completes without it (an
            addition to upstream, spec departure ``rank_timeout``; default None: no deadline).
        on_retry: called once (from the relay's thread) with one line when the first connect
            attempt to the controller failed and the retries begin (address, error, retry
            period, budget); see :func:`flodl_proto.runner._netio.connect_with_retry`.

    Use as a context manager, or call :meth:`start`, then :meth:`wait` (or :meth:`shutdown`).

    Raises:
        InvalidValue (local): a bad rank set (``relay.bad_rank_set``), salt or host name
            (``relay.host_too_long``), a ``rank_timeout`` that is not a positive number
            (``deadline.bad_timeout``) or is above ``TIMEOUT_OPTION_MAXIMUM`` once scaled
            (``deadline.too_long``), a ``listen_port`` outside 0..65535 (given, or the
            controller's port + 4: ``relay.bad_listen_port``), a ``ceiling`` below the
            smallest RoundFrame (``ceiling.below_minimum``), a ``controller`` address that
            cannot be dialed (``addr.invalid``: port 0 included).
        VersionMismatch (local): unsupported version.

    Upstream: ``relay/agent.rs`` ``RelayChannel`` (``ChannelKind::Data``).
    """

    def __init__(
        self,
        controller: str | tuple[str, int],
        ranks: Iterable[int],
        world_size: int,
        salt: BytesLike,
        *,
        version: int = DEFAULT_VERSION,
        listen_host: str = "127.0.0.1",
        listen_port: int | None = None,
        host: str | None = None,
        ceiling: int = DEFAULT_FRAME_CEILING,
        rank_timeout: float | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self._on_retry = on_retry
        self._controller = parse_addr(controller, field="controller", dial=True)
        self.host = host if host is not None else socket.gethostname()
        timeout = check_timeout("rank_timeout", rank_timeout)
        ceiling = check_frame_ceiling(ceiling, "relay")
        # a large HostFrame's two MACs run side by side (the thread starts at the first such
        # round; joined when the relay finishes)
        self._mac_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flodl-relay-mac")
        self._core = RelayCore(ranks, world_size, salt, version=version, host=self.host,
                               ceiling=ceiling,
                               rank_timeout=None if timeout is None
                               else timeout * net_timeout_scale(),
                               mac_executor=self._mac_pool)
        self.ranks: tuple[int, ...] = self._core.ranks
        self.world_size = self._core.world_size
        self._salt = self._core.salt
        self.version = self._core.version
        self._listen_host = listen_host
        port = (default_relay_port(self._controller[1]) if listen_port is None
                else int(listen_port))
        if not 0 <= port <= PORT_MAX:
            raise protocol_error("relay.bad_listen_port", port=port, max=PORT_MAX,
                                 why=" (the controller's port + 4)" if listen_port is None
                                 else "")
        self._listen_port = port
        self.ceiling = self._core.ceiling
        self.stats = RelayStats()
        self._fold = self._core.fold

        self._listener: socket.socket | None = None
        self._port: int | None = None
        self._rank_socks: dict[int, socket.socket] = {}
        self._pending: list[socket.socket] = []
        self._upstream: socket.socket | None = None
        self._stop = threading.Event()
        self._fanout_lock = threading.RLock()
        self._done = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # bookkeeping: sockets, error, counters
        # one core call and the records it queues are atomic (HostFrames leave in round order)
        self._core_lock = threading.Lock()
        self._main: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._queue: queue.Queue[_Outbound] = queue.Queue(maxsize=RELAY_OUTBOUND_QUEUE)
        # records in the outbound queue not written yet; direct writes only when it is 0
        self._out_lock = threading.Lock()
        self._out_queued = 0
        self._starve = committed_read_starvation()  # seconds, read once
        # the controller's records, read by one thread at a time (the dial, then the reader)
        self._up_reader = UpstreamReader(self._salt, self.version, self.ceiling, self._stop,
                                         self._forward, lambda n: self._count("upstream_in", n))
        self._timed = timeout is not None  # a rank deadline: deposits carry their time

    # -- public surface --------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound loopback data port (valid after :meth:`start`).

        Raises:
            RuntimeError: the relay was not started.
        """
        if self._port is None:
            raise RuntimeError("relay not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(listen_host, port)`` the ranks dial."""
        return self._listen_host, self.port

    @property
    def fold(self) -> HostFold:
        """The relay's fold barrier (read-only use: alive ranks, rounds completed)."""
        return self._fold

    @property
    def core(self) -> RelayCore:
        """The relay's protocol core (read-only use: state, outcome)."""
        return self._core

    @property
    def connected(self) -> bool:
        """True once every local rank has hand-shaken and the controller acknowledged Hello."""
        return self._ready.is_set()

    @property
    def done(self) -> bool:
        """True once the relay has finished (cleanly or not) and released its resources."""
        return self._done.is_set()

    @property
    def error(self) -> BaseException | None:
        """The error that ended the relay, or None (still running, or a clean end)."""
        return self._error

    def start(self) -> Relay:
        """Bind the loopback port and start the relay's supervisor thread; returns ``self``.

        The supervisor accepts the local ranks, dials the controller and runs the fold barrier;
        this call returns as soon as the port is bound.

        Raises:
            OSError: the port could not be bound.
            RuntimeError: already started.
        """
        if self._listener is not None or self._main is not None:
            raise RuntimeError("relay already started")
        lsock = socket.socket(socket.AF_INET6 if ":" in self._listen_host else socket.AF_INET)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((self._listen_host, self._listen_port))
            lsock.listen(max(8, len(self.ranks)))
            lsock.settimeout(poll_interval())
        except BaseException:
            lsock.close()
            raise
        self._listener = lsock
        self._port = int(lsock.getsockname()[1])
        log.info("relay %s: ranks %s listening on %s", self.host, list(self.ranks),
                 format_addr((self._listen_host, self._port)))
        self._main = threading.Thread(target=self._supervise, name=f"flodl-relay-{self._port}")
        self._main.start()
        return self

    def wait(self, timeout: float | None = None) -> BaseException | None:
        """Block until the relay has finished; return the error that ended it (None: clean).

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"relay still running after {timeout}s")
        if self._main is not None:
            self._main.join()
        return self._error

    def shutdown(self, timeout: float | None = None,
                 reason: str = "shutdown requested") -> BaseException | None:
        """Stop the relay (closing every connection), join its threads; return its error.

        A relay still running ends cleanly with ``reason`` (e.g. ``"stopped by a signal"``) as
        its outcome's detail, not with what closing its connections then shows (the controller
        connection closed). Idempotent.
        """
        self._stop.set()
        if self._main is not None:
            with self._core_lock:  # before the sockets go down: the request is the reason
                self._core.stop(reason)
        self._wake_all()
        if self._main is None:
            self._release()
            self._done.set()
            return self._error
        return self.wait(timeout)

    def __enter__(self) -> Relay:
        if self._main is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    # -- supervisor ------------------------------------------------------------------------------
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

    def _supervise(self) -> None:
        try:
            self._accept_ranks()
            self._dial_upstream()
            self._ready.set()
            self._spawn_workers()
            while not self._stop.wait(poll_interval()):
                if self._core.next_deadline() is not None:  # the rank deadline (if any)
                    self._core_call(self._core.tick, time.monotonic())
        except BaseException as e:  # every failure ends the relay; reported by wait()
            self._fail(e)
        finally:
            self._stop.set()
            self._wake_all()
            for t in self._workers:
                t.join()
            self._mac_pool.shutdown(wait=True)
            with self._core_lock:  # a no-op when the core already finished
                if isinstance(self._error, ProtocolError):
                    self._core.fail(self._error)
                else:
                    self._core.stop("relay shut down")
            self._release()
            self._done.set()
            log.info("relay %s finished%s", self.host,
                     f" with error: {self._error}" if self._error else "")

    def _release(self) -> None:
        with self._lock:
            socks = [*self._rank_socks.values(), *self._pending]
            self._rank_socks = {}
            self._pending = []
            up, self._upstream = self._upstream, None
            lsock, self._listener = self._listener, None
        for s in socks:
            s.close()
        if up is not None:
            up.close()
        if lsock is not None:
            lsock.close()

    # -- phase 1: local ranks --------------------------------------------------------------------
    def _accept_ranks(self) -> None:
        assert self._listener is not None
        next_note = time.monotonic() + _WAITING_NOTE_PERIOD
        while len(self._rank_socks) < len(self.ranks):
            if self._stop.is_set():
                raise Stopped("accept")
            if time.monotonic() >= next_note:  # upstream waits without a deadline; say for whom
                next_note = time.monotonic() + _WAITING_NOTE_PERIOD
                missing = self._core.missing_ranks()
                log.warning("relay %s: still waiting for local rank(s) %s to connect to %s:%d",
                            self.host, missing, *self.address)
            try:
                conn, peer = self._listener.accept()
            except (TimeoutError, BlockingIOError):
                continue
            with self._lock:
                self._pending.append(conn)
            configure_socket(conn, recv=poll_interval())
            hs = bytearray(HANDSHAKE_LEN)
            wait = handshake_read_timeout()
            try:
                got = recv_exact_into(conn, memoryview(hs), stop=self._stop,
                                      deadline=time.monotonic() + wait)
            except ReadDeadlinePassed as e:  # the handshakes are read one at a time
                self._count("from_ranks", e.got)
                with self._core_lock:
                    actions = self._core.rank_handshake_expired(e.got, wait)
            else:
                self._count("from_ranks", got)
                with self._core_lock:
                    actions = self._core.rank_handshake(memoryview(hs)[:got])
            for a in actions:
                if isinstance(a, AckRank):
                    send_all(conn, a.ack)
                    self._count("to_ranks", len(a.ack))
                elif isinstance(a, RankConnected):
                    with self._lock:
                        self._pending.remove(conn)
                        self._rank_socks[a.rank] = conn
                    log.debug("relay %s: rank %d connected from %s", self.host, a.rank, peer)
                else:
                    try:
                        self._raise_if_finished(a)
                    except ProtocolError as e:  # say whose handshake it was
                        e.add_note(f"the rank connecting from {format_addr(peer)}")
                        raise
        with self._lock:
            lsock, self._listener = self._listener, None
        if lsock is not None:
            lsock.close()

    # -- phase 2: upstream -----------------------------------------------------------------------
    def _dial_upstream(self) -> None:
        up = connect_with_retry(self._controller, "relay upstream", stop=self._stop,
                                on_retry=self._on_retry)
        with self._lock:
            self._upstream = up
        if self._stop.is_set():
            raise Stopped("dial")
        configure_socket(up, recv=poll_interval())
        with self._core_lock:
            actions = self._core.dialed()
        for a in actions:
            if isinstance(a, SendUpstream):
                self._count("upstream_out", send_all(up, list(a.buffers)))
            else:
                self._raise_if_finished(a)
        rec = self._read_record(up)
        with self._core_lock:
            actions = self._core.upstream_record(rec)
        for a in actions:
            self._raise_if_finished(a)
        log.info("relay %s: controller %s acknowledged ranks %s", self.host,
                 format_addr(self._controller), list(self.ranks))

    def _raise_if_finished(self, action: RelayAction) -> None:
        """The core ended the relay during the accept or dial phase: raise what ended it."""
        if isinstance(action, Finished):
            if action.outcome.error is not None:
                raise action.outcome.error
            raise Stopped(action.outcome.reason)
        raise AssertionError(f"unexpected action {action!r}")  # pragma: no cover

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
            t.start()

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
        the same lock (round order); a fan-out runs after the lock is released."""
        fan_outs: list[FanOut] = []
        with self._core_lock:
            actions = method(*args, **kwargs)
            if not actions:  # most deposits
                return
            for a in actions:
                if isinstance(a, FanOut):
                    fan_outs.append(a)
                elif isinstance(a, SendUpstream):
                    if a.kind is UpstreamKind.HOST_FRAME:
                        with self._lock:
                            self.stats.host_frames += 1
                    self._send_upstream(a)
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
        for f in fan_outs:
            self._fan_out(f)

    def _send_upstream(self, action: SendUpstream) -> None:
        """Write a record upstream now (small, nothing queued before it: one non-blocking
        ``sendmsg``), else queue it, or what that write left, for the outbound writer."""
        host_frame = action.kind is UpstreamKind.HOST_FRAME
        buffers: list[BytesLike] = list(action.buffers)
        up = self._upstream
        with self._out_lock:
            direct = self._out_queued == 0 and up is not None
        if direct and up is not None:
            nbytes = buffers_nbytes(buffers)
            if nbytes <= DIRECT_WRITE_MAX:
                sent = send_at_once(up, buffers, nbytes)
                rest = send_now(up, skip_sent(buffers, sent)) if sent < nbytes else []
                with self._lock:
                    self.stats.upstream_out += nbytes - sum(b.nbytes for b in rest)
                if not rest:
                    if host_frame and stages.is_enabled():
                        stages.mark("relay", self._fold.rounds_completed - 1, "hostframe_sent")
                    return
                buffers = list(rest)
        self._queue_upstream(_Record(buffers, self._fold.rounds_completed - 1 if host_frame
                                     else None))

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
                                lambda: fold.has_deposited(rank))
        rank_frame, timed = self._core.rank_frame, self._timed
        try:
            while not self._stop.is_set():
                got = self._read_blob(rank, sock, reader)
                if got is None:
                    break
                blob, premac = got
                if stages.is_enabled():
                    stages.mark("relay", self._fold.rounds_completed, "deposits_done")
                # deposit and HostFrame queued in round order; the time is for a rank deadline
                self._core_call(rank_frame, rank, blob, premac=premac,
                                now=time.monotonic() if timed else None)
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
        while not self._stop.is_set():
            rec = self._read_record(up)
            broadcast = rec is not None and rec.kind is RecordKind.BROADCAST
            if broadcast:
                with self._lock:
                    rnd = self.stats.broadcasts
                    self.stats.broadcasts = rnd + 1
            traced = broadcast and stages.is_enabled()
            if traced:
                stages.mark("relay", rnd, "broadcast_read")
            try:
                self._core_call(self._core.upstream_record, rec)
            finally:
                fwd, self._up_reader.forwarding = self._up_reader.forwarding, None
                if fwd is not None:  # the core took no FanOut from it (it failed or ended)
                    fwd.abort()
            if traced:
                stages.mark("relay", rnd, "fanout_done")
            if rec is None:
                return

    def _fan_out(self, action: FanOut) -> None:
        fwd, self._up_reader.forwarding = self._up_reader.forwarding, None
        with self._fanout_lock:
            if fwd is not None:  # forwarded as it arrived: the checked record's tail
                self._count("to_ranks", fwd.commit(action.ranks))
            else:
                self._fan_out_locked(action.prefix, action.payload, action.ranks)

    def _fan_out_locked(self, prefix: bytes, payload: memoryview,
                        ranks: tuple[int, ...]) -> None:
        targets = [(rank, sock) for rank in ranks
                   if (sock := self._rank_socks.get(rank)) is not None]
        self._count("to_ranks", write_to_each(targets, prefix, payload, self._broadcast_failed))

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
                         self.host, e)
                self._stop.set()  # first: a thread blocked queueing under the core lock lets go
                self._wake_all()
                self._core_call(self._core.controller_closed,
                                f"connection closed while writing: {e}")
                return
            self._count("upstream_out", n)



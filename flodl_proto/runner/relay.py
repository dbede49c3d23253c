"""The per-host relay of the data channel: local ranks on loopback, one connection upstream.

The relay's protocol rules (which ranks it accepts, the handshakes, Hello/HelloAck, the fold
barrier, RankExit, DeclareDead, the drain) live in the sans-IO
:class:`~flodl_proto.fsm.relay_core.RelayCore`; this runner owns the sockets, threads and
buffers, feeds the core what happened (one lock serialises the calls) and executes the actions
it returns. A :class:`Relay` binds the loopback data port (upstream's default: the controller's
port + 4), reads each local rank's 16-byte handshake for the core, then dials the controller and
sends what the core answers (this module: the set-up, the accept and dial phases and the
supervisor). It then runs the fold barrier (:mod:`flodl_proto.runner._relay_barrier`, the
threads that :class:`Relay` inherits):

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
from types import TracebackType

from .._names import adopt
from .._threads import start_thread
from ..addr import PORT_MAX
from ..codec._common import BytesLike
from ..codec.ceiling import check_frame_ceiling
from ..codec.mux import max_control_payload
from ..errors import ProtocolError, protocol_error
from ..fsm.deadline import check_timeout
from ..fsm.events import (
    AckRank,
    Finished,
    RankConnected,
    RelayAction,
    SendUpstream,
)
from ..fsm.relay_core import RelayCore
from ..reduce import HostFold
from ..spec import (
    CHANNEL_MAGIC_DATA,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_LEN,
    RELAY_DATA_LOOPBACK_OFFSET,
    RELAY_OUTBOUND_QUEUE,
    net_timeout_scale,
)
from ._netio import (
    ReadDeadlinePassed,
    Stopped,
    committed_read_starvation,
    configure_socket,
    connect_with_retry,
    format_addr,
    handshake_read_timeout,
    parse_addr,
    poll_interval,
)
from ._netio_recv import recv_exact_into
from ._netio_send import (
    send_all,
)
from ._relay_barrier import RelayStats, _Outbound, _RelayBarrier
from .relay_fanout import UpstreamReader

__all__ = ["Relay", "RelayStats", "default_relay_port", "waiting_note"]

# its code lives in runner/_relay_barrier.py; it is this module's name, so help(), pydoc and
# pickle name it (set once, at import)
adopt(__name__, RelayStats)

log = logging.getLogger(__name__)

#: period of the note naming the local ranks not connected yet (seconds)
_WAITING_NOTE_PERIOD = 10.0
_WAITING_SHOWN = 16  # missing ranks the waiting note lists (the lowest)
#: seconds of one step of :meth:`Relay.shutdown`'s wait for the core's lock: an untimed wait
#: of the main thread holds the handler of a signal the kernel gave another thread
_LOCK_STEP = 0.1


def default_relay_port(controller_port: int) -> int:
    """Upstream's loopback data port of a host relay: the controller's port + 4.

    Upstream: ``relay/mod.rs`` ``RELAY_DATA_LOOPBACK_OFFSET``.
    """
    return controller_port + RELAY_DATA_LOOPBACK_OFFSET


def waiting_note(host: str, missing: list[int], total: int, address: tuple[str, int]) -> str:
    """The accept phase's note (logged every 10 s while ranks are missing): how many of the
    ``total`` local ranks have not connected to ``address`` yet, and the lowest
    ``_WAITING_SHOWN`` of them (``missing``, ascending), so the line stays one short line
    (``relay node-a: still waiting for 2 of 4 local rank(s) to connect to 127.0.0.1:7005:
    1, 3``). ``total`` and the counts are ranks; ``address`` is (host, port). Raises nothing.

    Upstream: none (upstream's relay agent waits for its ranks without a note).
    """
    listed = ", ".join(map(str, missing[:_WAITING_SHOWN]))
    more = " ..." if len(missing) > _WAITING_SHOWN else ""
    return (f"relay {host}: still waiting for {len(missing)} of {total} local rank(s) to "
            f"connect to {format_addr(address)}: {listed}{more}")

class Relay(_RelayBarrier):
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
                                 why=(" (the controller's port + "
                                      f"{RELAY_DATA_LOOPBACK_OFFSET})") if listen_port is None
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
                                         self._forward, self._count_upstream_in,
                                         control_limit=max_control_payload(self.world_size))
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
        start_thread(self._main)
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
        connection closed). Idempotent. The core's lock, which a fold in progress holds, is
        waited for in steps of :data:`_LOCK_STEP` seconds (a signal's handler runs meanwhile on
        the main thread, whichever thread the kernel gave the signal to).

        Raises:
            TimeoutError: still running after ``timeout`` seconds (as :meth:`wait`).
        """
        self._stop.set()
        if self._main is not None:
            while not self._core_lock.acquire(timeout=_LOCK_STEP):
                pass
            try:  # before the sockets go down: the request is the reason
                self._core.stop(reason)
            finally:
                self._core_lock.release()
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
                log.warning("%s", waiting_note(self.host, self._core.missing_ranks(),
                                               len(self.ranks), self.address))
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
                        relay = (e.kind == "magic" and bytes(hs[:4])
                                 == CHANNEL_MAGIC_DATA.to_bytes(4, "little"))
                        e.add_note(f"the rank connecting from {format_addr(peer)}" + (
                            ", which sent the data-channel magic a relay sends its controller:"
                            " a relay was given this rank port as its --controller"
                            if relay else ""))
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

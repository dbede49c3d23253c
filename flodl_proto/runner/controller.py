"""The reference cluster controller: :class:`ReferenceController` feeds the sans-IO
:class:`~flodl_proto.fsm.controller_core.ControllerCore` from real sockets.

Threads (all named ``flodl-controller-*``, none daemon, all joined by :meth:`shutdown`):

* *accept* (:class:`~flodl_proto.runner._port_mux.PortMux`): takes TCP connections. With the
  **port mux** (the default, as flodl runs in production) it peeks each connection's first 4
  bytes (the channel magic, left in place) within 5 s x ``FLODL_NET_TIMEOUT_SCALE`` (ceil, at
  least 1 s): the data channel goes to the controller, ``GET ``/``POST`` go to the status
  responder (``GET /status`` answers a JSON status), and an unknown or unserved magic, an EOF or
  a timeout before 4 bytes drops only that connection. **Direct** (``port_mux=False``) hands
  every connection to the controller, which consumes the magic itself (a wrong magic ends the
  run with upstream's error);
* one *reader* per data connection: reads the magic, then each record's 25-byte header (checked
  at once: magic, version, ``payload_len`` against the frame ceiling and, for the first record,
  the largest legal Hello), then the payload into a reused buffer grown as bytes arrive, hashed
  as it arrives (:func:`~flodl_proto.runner._netio_recv.read_record_into`); the connection's
  :class:`~flodl_proto.codec.stream.MuxStream` verifies the tags, and the reader itself runs
  the core on the events (one core lock) and executes its actions, the round's reduce included;
* one *writer* per data connection: a record of up to 1 MiB is written by the thread that
  produced it when its connection has nothing queued (one non-blocking ``sendmsg``); larger
  records, and whatever that write left, are written here in order, each under a write-stall
  deadline for the whole record. So a relay that stops reading delays no one (elastic scatter,
  upstream's rule), and its ranks are declared dead when its deadline passes (a round's report
  waits for all its writes);
* *coordinator*: ticks the core's clock and takes the inputs from elsewhere (stop, declare
  dead, a crash) as typed messages; tears down at the end;
* a *checkpoint* writer (with ``checkpoint_dir``), and short-lived *status* responders.

Every data socket has TCP_NODELAY, a write-stall deadline (30 s x scale for a whole record,
spec departure ``write_stall_deadline``; a stalled Broadcast declares that relay's ranks dead and
the round goes on) and a 100 ms read poll; a read inside a started record that makes no progress
for 60 s fails; TCP keepalive with a matching TCP_USER_TIMEOUT (an addition to upstream,
``tcp_keepalive`` in the spec: 45 s x scale) reports a relay that vanished without closing (a
warning naming the connection), which then ends as an end of stream would. A connection's close
waits for the records queued before it, and :meth:`ReferenceController.shutdown` lets the writers
finish theirs (each within its deadline).

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``ClusterController``),
``port_mux.rs`` (``PortMux``, ``StreamSource``), ``wire.rs`` (write-stall timeout),
``checkpoint_forge.rs``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeAlias

from .._oserr import os_reason
from .._slots import slot_builder
from .._threads import start_thread
from ..codec._common import BytesLike
from ..codec.ceiling import check_frame_ceiling
from ..codec.mux import RecordKind
from ..codec.stream import (
    RecordReceived,
    StreamEvent,
)
from ..errors import ProtocolError, shown_name
from ..fsm.controller_core import ControllerCore
from ..fsm.deadline import check_timeout
from ..fsm.events import (
    Action,
    CheckpointWindow,
    CloseConnection,
    Finished,
    RelayJoined,
    RoundScattered,
    SendTo,
    StopAccepting,
)
from ..fsm.lifecycle import Outcome
from ..membership import DeadRanks
from ..reduce import OuterOptimizer
from ..reduce._kernels import default_threads
from ..spec import (
    CONTROLLER_BROADCAST_BACKLOG,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    SPEC,
    net_timeout_scale,
)
from . import stages
from ._controller_conn import (
    Conn,
    Crashed,
    DeadDeclared,
    Drain,
    Message,
    Scatter,
    StopRequested,
    Wake,
    Written,
)
from ._netio import configure_socket, format_addr, parse_addr, shutdown_quietly
from ._port_mux import PortMux, peek_timeout
from .checkpoint import write_checkpoint
from .relay_reader import read_relay_connection
from .reports import RoundReport
from .status_http import serve_status

__all__ = ["ControllerNotice", "ReferenceController", "RoundReport", "peek_timeout"]

log = logging.getLogger(__name__)

_REDUCE_POLL: Final = SPEC.timeout("REDUCE_POLL")
#: period of the accept-phase note naming the ranks not covered yet (seconds)
_WAITING_NOTE_PERIOD = 10.0
_WAITING_SHOWN = 16  # uncovered ranks the waiting note lists (the lowest; up to 2**32 - 1 exist)
_STATUS_CORE_WAIT = 0.5  # seconds status() waits for a busy core (then: the last snapshot)
ControllerNotice: TypeAlias = RelayJoined | RoundReport
#: ``_round_report(round, kind, weight, nbytes, relays, ms, at)``: ``RoundReport(...)`` of those
#: values without the frozen dataclass's per-field ``object.__setattr__`` (one a round)
_round_report: Callable[..., RoundReport] = slot_builder(RoundReport)


class ReferenceController:
    """A cluster controller on real sockets, byte-exact with flodl's ``ClusterController``.

    Args:
        world_size: number of ranks (> 0).
        salt: 16-byte session salt.
        host: address to bind (default ``127.0.0.1``).
        port: port to bind (0: kernel-assigned, read back with :attr:`port`).
        version: data-channel protocol version, 2 (default) or 3.
        port_mux: peek the channel magic and serve ``GET /status`` on the same port (default);
            False: every connection is a data-channel connection (direct mode).
        outer: optional outer optimizer applied to the consensus before scatter.
        checkpoint_dir: write each sync window's Model consensus as
            ``consensus-<window>.npz`` (``p<i>`` params, ``b<j>`` buffers, float32) there.
        dead_ranks: a ledger shared with a coordinator (default: a private one).
        ceiling: frame ceiling in bytes.
        on_notice: called on the coordinator thread with each :class:`RelayJoined` and
            :class:`RoundReport` (keep it short; exceptions are logged and ignored).
        round_timeout: seconds (before ``FLODL_NET_TIMEOUT_SCALE``, applied here) after a
            round's first HostFrame after which a relay that has not sent its own has its ranks
            declared dead and the round completes without it (an addition to upstream, spec
            departure ``round_timeout``; default None: no deadline). Logged, and listed in
            :meth:`status` as ``round_timeouts``.

    Raises:
        InvalidValue (local): ``world_size`` is 0, the ledger size differs, the salt is not 16
            bytes, ``round_timeout`` is not a positive number or too long once scaled, ``ceiling``
            is below 25 bytes, ``host``/``port`` are refused by ``parse_addr``; VersionMismatch.

    Use as a context manager (``start()`` on enter, ``shutdown()`` on exit), or call
    :meth:`start`, then :meth:`wait` and/or :meth:`shutdown`.

    Upstream: ``controller/mod.rs`` ``ClusterController::start_with_dead_ranks`` /
    ``start_from_source`` / ``shutdown``; ``port_mux.rs`` ``PortMux``.
    """

    def __init__(
        self,
        world_size: int,
        salt: BytesLike,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        version: int = DEFAULT_VERSION,
        port_mux: bool = True,
        outer: OuterOptimizer | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        dead_ranks: DeadRanks | None = None,
        ceiling: int = DEFAULT_FRAME_CEILING,
        on_notice: Callable[[ControllerNotice], None] | None = None,
        round_timeout: float | None = None,
    ) -> None:
        ceiling = check_frame_ceiling(ceiling, "controller")  # before the core converts it
        timeout = check_timeout("round_timeout", round_timeout)
        scaled = None if timeout is None else timeout * net_timeout_scale()
        # a large consensus Broadcast's two MACs run side by side (threads: joined by teardown)
        self._mac_pool = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="flodl-controller-mac")
        self._core = ControllerCore(world_size, salt, version=version, dead_ranks=dead_ranks,
                                    outer=outer, checkpoint=checkpoint_dir is not None,
                                    ceiling=ceiling, reduce_threads=default_threads(),
                                    round_timeout=scaled, mac_executor=self._mac_pool)
        self._host, self._req_port = parse_addr((host, port), field="host, port")
        self._port_mux = port_mux
        self._ceiling = ceiling
        self._ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self._on_notice = on_notice
        self._listener: socket.socket | None = None
        self._port = 0
        self._events: queue.Queue[Message] = queue.Queue()
        # every core call and the execution of its actions (readers, accept, writers, coordinator)
        self._core_lock = threading.RLock()
        self._stop = threading.Event()  # stops the accept thread and the readers
        self._done = threading.Event()  # the coordinator finished its teardown
        self._started = False
        self._lock = threading.Lock()
        self._conns: dict[int, Conn] = {}
        self._next_id = 0
        self._threads: list[threading.Thread] = []  # accept, status responders, readers
        self._coordinator: threading.Thread | None = None
        self._scatters: dict[int, Scatter] = {}  # round -> its unfinished scatter
        self._ckpt_queue: queue.Queue[CheckpointWindow | None] = queue.Queue()
        self._ckpt_thread: threading.Thread | None = None
        self._outcome: Outcome | None = None
        self._status: dict[str, Any] = self._core.status()
        self._status_stale = False  # the core changed since the snapshot (core lock held)
        self._last_report: RoundReport | None = None
        self._accepting_data = True

    # -- public API ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound TCP port (never 0 once started)."""
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` as bound."""
        return self._host, self._port

    @property
    def world_size(self) -> int:
        """The world size."""
        return self._core.world_size

    @property
    def dead_ranks(self) -> DeadRanks:
        """The dead-rank ledger."""
        return self._core.dead_ranks

    @property
    def outcome(self) -> Outcome | None:
        """The run's outcome once it is over, else None."""
        return self._outcome

    def start(self) -> ReferenceController:
        """Bind, listen and start the threads. Returns ``self``.

        A start that raises leaves the controller as if never started: :meth:`shutdown`
        returns at once (a clean ``stop`` outcome, "never started") and :meth:`start` may be
        called again.

        Raises:
            OSError: the checkpoint folder cannot be made, the host does not resolve
                (:class:`socket.gaierror`), or the address cannot be bound (e.g. the port is in
                use).
            RuntimeError: already started.
        """
        if self._started:
            raise RuntimeError("ReferenceController already started")
        if self._ckpt_dir is not None:  # before the bind: a failure here leaves nothing open
            self._ckpt_dir.mkdir(parents=True, exist_ok=True)
        infos = socket.getaddrinfo(self._host, self._req_port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        lst = socket.socket(family, socket.SOCK_STREAM)
        try:
            lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lst.bind(sockaddr)
            lst.listen(128)
            lst.setblocking(False)
        except OSError:
            lst.close()
            raise
        self._started = True
        self._listener = lst
        self._port = int(lst.getsockname()[1])
        if self._ckpt_dir is not None:
            self._ckpt_thread = threading.Thread(
                target=self._guarded, args=(self._checkpoint_loop, "the checkpoint writer"),
                name="flodl-controller-checkpoint")
            start_thread(self._ckpt_thread)
        with self._core_lock:
            self._run_actions(self._core.start(), time.monotonic())
        accept = threading.Thread(target=self._guarded,
                                  args=(self._accept_loop, "the accept loop"),
                                  name=f"flodl-controller-accept:{self._port}")
        self._threads.append(accept)
        start_thread(accept)
        self._coordinator = threading.Thread(target=self._coordinate,
                                             name=f"flodl-controller:{self._port}")
        start_thread(self._coordinator)
        log.info("controller: listening on %s (world size %d, protocol version %d, %s)",
                 format_addr(self.address), self.world_size, self._core.version,
                 "port mux" if self._port_mux else "direct")
        return self

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Wait until the run is over (at most ``timeout`` seconds); return the outcome, or None
        if it is still running. Once over, every thread has been joined."""
        if not self._started:
            return None
        if not self._done.wait(timeout):
            return None
        self._join_coordinator()
        return self._outcome

    def request_stop(self, detail: str = "") -> None:
        """Ask the run to stop cleanly (thread- and signal-safe; returns at once)."""
        self._events.put(StopRequested(detail))

    def declare_dead(self, rank: int) -> None:
        """Declare ``rank`` dead from outside (as a coordinator would); returns at once."""
        self._events.put(DeadDeclared(int(rank)))

    def shutdown(self, timeout: float | None = None) -> Outcome:
        """Stop (cleanly, if still running), join every thread, close every socket; return the
        outcome. Idempotent.

        Raises:
            TimeoutError: the threads did not finish within ``timeout`` seconds.
        """
        if not self._started:
            self._started = True
            self._done.set()
            self._outcome = Outcome(True, "stop", None, "never started")
            return self._outcome
        if not self._done.is_set():
            self.request_stop("shutdown()")
        if not self._done.wait(timeout):
            raise TimeoutError("controller did not shut down in time")
        self._join_coordinator()
        assert self._outcome is not None
        return self._outcome

    def status(self) -> dict[str, Any]:
        """The latest JSON-ready status (state, world size, relays and ranks, dead ranks, rounds
        reduced, bytes in/out, last round, listening address, mode).

        The core's part is retaken here when the core changed since the last snapshot (not on
        the round's path); a core busy for over 0.5 s (a large reduce) gives the last one."""
        if self._status_stale and self._core_lock.acquire(timeout=_STATUS_CORE_WAIT):
            try:
                if self._status_stale:
                    self._status_stale = False
                    core_st = self._core.status()
                    with self._lock:
                        self._status = core_st
            finally:
                self._core_lock.release()
        with self._lock:
            st = dict(self._status)
            rep = self._last_report
        st["listen"] = format_addr(self.address)
        st["mode"] = "port mux" if self._port_mux else "direct"
        last = st.get("last_round")
        if last is not None:  # ms / at: null until the round's scatter is done
            done = rep is not None and rep.round == last["round"]
            st["last_round"] = last = dict(last)
            last["ms"] = round(rep.ms, 3) if rep is not None and done else None
            last["at"] = rep.at if rep is not None and done else None
        return st

    def __enter__(self) -> ReferenceController:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    # -- coordinator -----------------------------------------------------------------------------
    def _join_coordinator(self) -> None:
        t = self._coordinator
        if t is not None and t is not threading.current_thread():
            t.join()

    def _coordinate(self) -> None:
        core = self._core
        next_tick = time.monotonic() + _REDUCE_POLL
        next_waiting_note = time.monotonic() + _WAITING_NOTE_PERIOD
        try:
            while not core.finished:
                timeout = max(0.0, next_tick - time.monotonic())
                try:
                    item: Message | None = self._events.get(timeout=timeout)
                except queue.Empty:
                    item = None
                with self._core_lock:
                    if core.finished:
                        break
                    t0 = time.monotonic()
                    actions = self._dispatch(item, t0) if item is not None else []
                    if t0 >= next_tick:
                        actions += core.tick(t0)
                        next_tick = t0 + _REDUCE_POLL
                    # the core names when it next needs a tick (a handshake deadline, the round
                    # wait's poll); between those the loop still wakes every poll period
                    wanted = core.next_deadline(t0)
                    if wanted is not None and wanted < next_tick:
                        next_tick = wanted
                    if t0 >= next_waiting_note:
                        next_waiting_note = t0 + _WAITING_NOTE_PERIOD
                        self._note_waiting()
                    if actions:
                        self._run_actions(actions, t0)
        except Exception as e:  # a bug, or a failure outside the protocol: fail the run
            with self._core_lock:
                self._crashed(e, "the coordinator")
        finally:
            self._teardown()

    def _inline(self, call: Callable[[float], list[Action]]) -> None:
        """Run one core input on the calling thread (a reader, the accept loop, a writer) and
        execute its actions there: no hand-off to the coordinator on the round's path. Once the
        core has finished, inputs are dropped; the thread that finishes it wakes the
        coordinator, which tears down."""
        with self._core_lock:
            if self._core.finished:
                return
            t0 = time.monotonic()
            try:
                self._run_actions(call(t0), t0)
            except Exception as e:  # a bug, or a failure outside the protocol: fail the run
                self._crashed(e, "the coordinator")
            if self._core.finished:
                self._events.put(Wake())

    def _guarded(self, target: Callable[..., None], where: str, *args: Any) -> None:
        """Run a thread's ``target``; an unexpected exception fails the run (through the
        coordinator) instead of ending the thread silently."""
        try:
            target(*args)
        except Exception as e:
            log.debug("controller: unexpected error in %s", where, exc_info=e)
            self._events.put(Crashed(where, e))

    def _crashed(self, error: Exception, where: str) -> None:
        """An unexpected exception on the coordinator: the core fails with it (Shutdown, the
        exception as the outcome's error); the traceback goes to the debug log."""
        log.debug("controller: unexpected error in %s", where, exc_info=error)
        core = self._core
        if core.finished:
            log.warning("controller: unexpected error in %s after the run ended: %s: %s",
                        where, type(error).__name__, error)
            return
        actions = core.runner_failed(error, where)
        try:
            self._run_actions(actions, time.monotonic())
        except Exception as again:
            log.debug("controller: closing after the failure failed too", exc_info=again)
            self._outcome = core.outcome

    def _note_waiting(self) -> None:
        """Log, during the accept phase, which ranks no relay has announced yet (upstream waits
        for them without a deadline; the note tells an operator what it is waiting for)."""
        if missing := self._core.uncovered_count():
            shown = ", ".join(map(str, self._core.uncovered_ranks(_WAITING_SHOWN)))
            log.warning("controller: still waiting for relays to announce %d of %d rank(s): %s%s",
                        missing, self._core.world_size, shown, " ..." * (missing > _WAITING_SHOWN))

    def _dispatch(self, item: Message, now: float) -> list[Action]:
        core = self._core
        if isinstance(item, StopRequested):
            return core.stop(item.detail)
        if isinstance(item, DeadDeclared):
            return core.declare_dead(item.rank)
        if isinstance(item, Written):
            return self._written(item.conn, item.send, item.error, now)
        if isinstance(item, Crashed):
            log.debug("controller: %s failed; the run fails", item.where)
            return core.runner_failed(item.error, item.where)
        return []  # Wake: the loop sees the finished core

    def _run_actions(self, actions: list[Action], t0: float) -> None:
        # a small record is written here when its connection has nothing queued; the others go
        # to the connections' writers and are written there, concurrently: a relay that stops
        # reading holds up only its own connection (elastic scatter)
        # the core is done with this input: its status first, so a relay that has the
        # Broadcast already sees the round in /status
        self._update_status()
        broadcasts: dict[int, int] = {}  # round -> Broadcast records handed to writers
        for a in actions:
            if isinstance(a, SendTo):
                if not self._send(a, t0) and a.round is not None:
                    broadcasts[a.round] = broadcasts.get(a.round, 0) + 1
            elif isinstance(a, RoundScattered):  # second: a round's actions are these two
                n = broadcasts.pop(a.round, 0)
                if n:
                    self._scatters[a.round] = Scatter(a, t0, n)
                else:
                    self._report(a, t0)
            elif isinstance(a, CloseConnection):
                self._close_conn(a.conn, a.reason, drain=a.drain)
            elif isinstance(a, RelayJoined):
                self._notify(a)
            elif isinstance(a, CheckpointWindow):
                self._ckpt_queue.put(a)
            elif isinstance(a, StopAccepting):
                self._accepting_data = False
            elif isinstance(a, Finished):
                self._outcome = a.outcome

    def _send(self, send: SendTo, now: float) -> bool:
        """Write ``send`` now, or hand it to its connection's writer (:meth:`Conn.write_now`).
        Returns True when it was written whole here."""
        conn = self._conns.get(send.conn)
        if conn is None or conn.closed:
            self._events.put(Written(send.conn, send, "connection closed"))
            return False
        written = conn.write_now(send)
        if written is None:  # a relay that reads slower than rounds end: failed now
            self._events.put(Written(send.conn, send, (
                f"{CONTROLLER_BROADCAST_BACKLOG} earlier Broadcasts not written yet: the relay "
                "reads slower than rounds end")))
            return False
        if not written:
            return False
        if send.round is not None:
            stages.mark("controller", send.round - 1, "broadcast_sent")
        return True

    def _written(self, conn_id: int, send: SendTo, error: str | None,
                 now: float) -> list[Action]:
        """A writer finished ``send`` (``error``: why it failed, else None)."""
        actions = self._core.write_failed(conn_id, send.kind, error) if error is not None else []
        sc = self._scatters.get(send.round) if send.round is not None else None
        if sc is not None:
            sc.pending -= 1
            if sc.pending == 0:
                del self._scatters[sc.notice.round]
                self._report(sc.notice, sc.t0, now)
                self._update_status()
        return actions

    def _report(self, r: RoundScattered, t0: float, now: float | None = None) -> None:
        end = time.monotonic() if now is None else now
        rep = _round_report(r.round, r.kind, r.weight, r.nbytes, r.relays,
                            (end - t0) * 1000.0, time.time())
        with self._lock:
            self._last_report = rep
        log.info("controller: round %d %s weight %g, %d bytes to %d relay(s) in %.2f ms",
                 rep.round, rep.kind, rep.weight, rep.nbytes, rep.relays, rep.ms)
        self._notify(rep)

    def _notify(self, notice: ControllerNotice) -> None:
        if self._on_notice is None:
            return
        try:
            self._on_notice(notice)
        except Exception:
            log.exception("controller: on_notice callback failed")

    def _update_status(self) -> None:
        """The core's status changed (once per batch of actions, core lock held): the snapshot
        is retaken when :meth:`status` is next asked (it adds the address, the mode and the
        last round's time), not on the round's path."""
        self._status_stale = True

    def _write_loop(self, conn: Conn) -> None:
        conn.write_loop(self._inline_written)

    def _inline_written(self, done: Written) -> None:
        """A writer's report, run on the writer thread (core lock held)."""
        self._inline(lambda now: self._written(done.conn, done.send, done.error, now))

    def _close_conn(self, conn_id: int, reason: str, *, drain: bool = False) -> None:
        conn = self._conns.get(conn_id)
        if conn is None or conn.closed:
            return
        conn.closed = True
        # closed by its writer, once the records queued before are out; a drained connection
        # only gets FIN (its reader goes on reading and the core ignores what arrives)
        conn.queue_close(Drain(reason) if drain else reason)

    def _teardown(self) -> None:
        """Close everything and join every thread but the coordinator (which runs this).

        The writers finish the records already queued first (each within its write-stall
        deadline), so a relay gets every Broadcast scattered before the end."""
        for conn in list(self._conns.values()):
            conn.closed = True
            conn.outbox.put(None)
        for conn in list(self._conns.values()):
            if conn.writer is not None:
                conn.writer.join()
        self._stop.set()
        lst = self._listener
        for conn in list(self._conns.values()):
            shutdown_quietly(conn.sock)
        joined: set[threading.Thread] = set()
        while True:
            with self._lock:
                todo = [t for t in self._threads if t not in joined]
            if not todo:
                break
            for t in todo:
                t.join()
                joined.add(t)
        for conn in list(self._conns.values()):  # connections opened while stopping
            if conn.writer is not None and conn.writer.is_alive():
                conn.outbox.put(None)
                conn.writer.join()
        if self._ckpt_thread is not None:
            self._ckpt_queue.put(None)
            self._ckpt_thread.join()
        self._mac_pool.shutdown(wait=True)
        for conn in list(self._conns.values()):
            with contextlib.suppress(OSError):
                conn.sock.close()
        if lst is not None:
            with contextlib.suppress(OSError):
                lst.close()
        if self._outcome is None:
            self._outcome = self._core.outcome or Outcome(
                False, "fail", RuntimeError("the controller stopped without an outcome"))
        self._update_status()
        self._done.set()

    # -- accept / port mux -----------------------------------------------------------------------
    def _accept_loop(self) -> None:
        lst = self._listener
        assert lst is not None
        PortMux(lst, port_mux=self._port_mux, stop=self._stop,
                accepting_data=lambda: self._accepting_data, open_data=self._open_data,
                open_status=self._open_status).run()

    def _open_status(self, sock: socket.socket, addr: str) -> None:
        t = threading.Thread(target=self._guarded,
                             args=(self._serve_status, "a status responder", sock, addr),
                             name="flodl-controller-status")
        with self._lock:
            self._threads.append(t)
            start_thread(t)

    def _open_data(self, sock: socket.socket, addr: str) -> None:
        try:
            configure_socket(sock, recv=_REDUCE_POLL)
        except OSError as e:
            log.info("controller: cannot configure connection from %s (%s); dropping", addr, e)
            with contextlib.suppress(OSError):
                sock.close()
            return
        conn_id = self._next_id
        self._next_id += 1
        stream = self._core.new_stream()
        conn = Conn(conn_id, sock, addr, stream)
        with self._core_lock:
            self._conns[conn_id] = conn
        log.info("controller: data-channel connection %d from %s", conn_id, addr)
        self._inline(lambda now: self._core.connection_opened(conn_id, now, stream=stream))
        t = threading.Thread(target=self._guarded,
                             args=(self._read_loop, f"the reader of connection {conn_id}", conn),
                             name=f"flodl-controller-relay{conn_id}")
        conn.reader = t
        writer = threading.Thread(target=self._guarded, name=f"flodl-controller-write{conn_id}",
                                  args=(self._write_loop, f"the writer of connection {conn_id}",
                                        conn))
        # _teardown (joining) sees a thread only once started: the accept loop runs meanwhile
        start_thread(writer)
        conn.writer = writer
        with self._lock:
            self._threads.append(t)
            start_thread(t)

    # -- readers -----------------------------------------------------------------------------------
    def _post(self, conn: Conn, events: list[StreamEvent]) -> None:
        if not events:
            return
        if stages.is_enabled() and any(isinstance(e, RecordReceived)
                                       and e.record.kind is RecordKind.HOST_FRAME
                                       for e in events):
            stages.mark("controller", self._core.rounds, "hostframes_done")
        self._inline(lambda now: self._core.receive_events(conn.id, events, now))

    def _read_loop(self, conn: Conn) -> None:
        read_relay_connection(conn.sock, conn.stream, lambda events: self._post(conn, events),
                              stop=self._stop, salt=self._core.salt, ceiling=self._ceiling,
                              label=f"connection {conn.id} ({conn.addr})",
                              worker_name=f"flodl-controller-mac{conn.id}")

    # -- status ------------------------------------------------------------------------------------
    def _serve_status(self, sock: socket.socket, addr: str) -> None:
        serve_status(sock, addr, self.status)

    # -- checkpoints -------------------------------------------------------------------------------
    def _checkpoint_loop(self) -> None:
        while True:
            item = self._ckpt_queue.get()
            if item is None:
                return
            try:
                self._write_checkpoint(item)
            except (OSError, ValueError, ProtocolError) as e:
                log.error("controller: checkpoint of window %d in %s failed: %s", item.window,
                          shown_name(str(self._ckpt_dir)), os_reason(e))

    def _write_checkpoint(self, w: CheckpointWindow) -> None:
        assert self._ckpt_dir is not None
        write_checkpoint(self._ckpt_dir, w)

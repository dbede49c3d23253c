"""Sans-IO cluster controller core: events in, actions out (h11 style; the clock is passed in).

The core owns the lifecycle machine (:mod:`flodl_proto.fsm.lifecycle`), one round slot per
accepted relay, and the :class:`~flodl_proto.membership.DeadRanks` ledger. It never touches a
socket, a thread or a clock: a runner feeds it what happened and executes the actions it returns.

Inputs (each returns a list of actions):

* :meth:`ControllerCore.start` — the controller listens; relays may connect;
* :meth:`ControllerCore.connection_opened` — a data-channel connection was accepted;
* :meth:`ControllerCore.receive_data` — bytes arrived on a connection (any split; the core parses
  them incrementally: the channel magic first, then mux records), or
  :meth:`ControllerCore.receive_events` with events a runner pre-parsed on its reader thread with
  the connection's :class:`~flodl_proto.codec.stream.MuxStream`
  (:meth:`ControllerCore.stream`);
* :meth:`ControllerCore.connection_closed` — the peer closed (EOF) or the read failed;
* :meth:`ControllerCore.write_failed` — sending a :class:`SendTo` failed (or stalled);
* :meth:`ControllerCore.declare_dead` — a rank was declared dead from outside (the coordinator);
* :meth:`ControllerCore.stop` — stop cleanly;
* :meth:`ControllerCore.tick` — time passed (handshake deadlines, dead-rank forwarding).

Outputs (actions, :mod:`flodl_proto.fsm.events`): :class:`SendTo` (write these buffers to
connection c), :class:`CloseConnection`, :class:`StopAccepting` (no more data-channel connections
will be taken), :class:`RelayJoined` and :class:`RoundScattered` (notices for logs and status),
:class:`CheckpointWindow` (write a consensus checkpoint off the hot path) and :class:`Finished`
(the run is over, with its :class:`~flodl_proto.fsm.lifecycle.Outcome`). After :class:`Finished`
every input is a no-op.

Rules (upstream's, facts §d.8–§d.10, and this package's departures in ``spec/wire.yaml`` and
``spec/lifecycle.yaml``):

* accept phase: each connection sends the 4-byte data-channel magic, then one mux record that must
  be ``Control(Hello)``; every announced rank must be ``< world_size`` and not yet announced (a
  repeat inside one Hello counts); the relay gets ``Control(HelloAck)`` and a connection number in
  acceptance order; the phase ends when every rank is covered, after which new connections are
  closed. A connection that has not completed magic + Hello within 10 s fails the run. Any failure
  in this phase ends the run and closes every connection (departure: upstream leaves earlier ones
  open);
* per relay (from its HelloAck on; upstream's per-relay reader): a HostFrame from a relay whose
  ranks are all dead is dropped; otherwise its payload must hold a complete RoundFrame (bytes
  after it are ignored), which fills the relay's slot (a second one overwrites the first); a Data
  record fails the run; ``RankExit`` for a rank the relay carries ends the run cleanly unless that
  rank is dead (then it is ignored), and for a rank it does not carry fails the run (departure);
  other Control records are ignored; a Broadcast from a relay is dropped; EOF ends the run cleanly
  when the relay still carries an alive rank; a read error fails the run when the relay still
  carries an alive rank. After EOF or an error nothing more is read from that relay. While other
  relays have still to join, such an end (the first clean request, else the first error) is held
  and acted on as soon as every rank is covered, as upstream's reduce loop does;
* round: a relay is expected while one of its ranks is alive; once every expected relay deposited,
  the frames (connection order, ``None`` for the others) go through
  :func:`~flodl_proto.reduce.reduce_realized_work`, the optional outer optimizer, then ONE
  serialization of the consensus shared by a Broadcast to every relay with an alive rank (none
  over the frame ceiling: the run fails, departure ``broadcast_over_ceiling``); a failed write
  declares that relay's ranks dead, the round goes on (elastic scatter); all ranks dead: clean end;
* while a round is incomplete, every newly dead rank is forwarded once as
  ``Control(DeclareDead{rank})`` to the relay carrying it (a failed forward is only logged);
* round deadline (an addition, off by default: ``round_timeout``, departure ``round_timeout``): a
  :class:`~flodl_proto.fsm.deadline.RoundDeadline` starts at the round's first HostFrame (the
  time passed to :meth:`ControllerCore.receive_events`); when :meth:`ControllerCore.tick` finds it
  expired, every expected relay without a HostFrame has its ranks declared dead in the ledger,
  gets ``DeclareDead`` for each, then its connection is closed, and the round completes with the
  others. Each such event is logged and kept in :attr:`ControllerCore.round_timeouts` (status).

This module holds the inputs, the round wait and the scatter; the accept phase and the relays'
streams are in ``fsm/_controller_relays.py``, the action queue and the end of the run in
``fsm/_controller_end.py`` (the classes :class:`ControllerCore` builds on).

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``run_reduce_thread``, ``ReduceSlots``,
``reduce_reader``, ``forward_dead_diffs``, ``average_and_scatter``), ``outer_optimizer.rs``,
``checkpoint_forge.rs``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Final

from .._slots import slot_builder
from ..codec._common import BytesLike, check_version
from ..codec.auth import check_salt
from ..codec.ceiling import frame_ceiling_int
from ..codec.mux import (
    DeclareDead,
    MuxRecord,
    encode_mux_record,
    max_control_payload,
    max_hello_payload,
    ranks_str,
)
from ..codec.record_image import FrameRecordImages
from ..codec.round_frame import RoundKind
from ..codec.stream import (
    MagicReceived,
    MuxStream,
    RecordReceived,
    StreamEvent,
)
from ..errors import ProtocolError, protocol_error
from ..membership import DeadRanks
from ..reduce import OuterOptimizer, OuterStepper, OutputPool, reduce_realized_work
from ..spec import (
    CHANNEL_MAGIC_LEN,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    SPEC,
)
from ._controller_end import _CLEAN_END
from ._controller_relays import _ControllerRelays
from ._controller_state import (
    _AliveRelays,
    _all_deposited,
    _Conn,
    _Guards,
    _Relay,
    _Windows,
    broadcast_record,
    check_core_args,
    lowest_not_in,
)
from .deadline import RoundDeadline
from .events import (
    Action,
    CloseConnection,
    RelayInfo,
    RoundScattered,
    SendKind,
    SendTo,
)
from .lifecycle import Lifecycle, LifecycleEvent, LifecycleState

__all__ = ["HANDSHAKE_TIMEOUT", "REDUCE_POLL", "ControllerCore"]

log = logging.getLogger(__name__)

#: seconds a new connection has to deliver the channel magic and its Hello (not scaled)
HANDSHAKE_TIMEOUT: Final = SPEC.timeout("HANDSHAKE_READ")
#: upstream's round-wait poll period (seconds): deaths in a shared ledger are forwarded on it
REDUCE_POLL: Final = SPEC.timeout("REDUCE_POLL")


#: a round's kind as its notice names it (``model``, ``control``)
_KIND_NAMES: Final = {k: k.name.lower() for k in RoundKind}
#: the events whose bytes count in ``bytes_in``
_COUNTED: Final = (MagicReceived, RecordReceived)

# the two actions of every round, built without their frozen dataclasses' per-field
# ``object.__setattr__``:
#: ``_broadcast_to(conn, buffers, nbytes, round_no)``:
#: ``SendTo(conn, buffers, SendKind.BROADCAST, nbytes, round_no)``
_broadcast_to: Callable[..., SendTo] = slot_builder(SendTo,
                                                    fixed={"kind": SendKind.BROADCAST})
#: ``_scattered(round_no, kind, weight, nbytes, relays, contributors)``:
#: ``RoundScattered(round_no, kind, weight, nbytes, relays, contributors)``
_scattered: Callable[..., RoundScattered] = slot_builder(RoundScattered)


class ControllerCore(_ControllerRelays):
    """The sans-IO cluster controller (see the module doc for the rules).

    Args:
        world_size: number of ranks (1..4294967295).
        salt: the 16-byte session salt (HMAC key of every record and frame).
        version: data-channel protocol version, 2 (default) or 3.
        dead_ranks: a ledger shared with a coordinator (default: a private one); its world size
            must equal ``world_size``.
        outer: optional outer optimizer applied to the consensus before scatter (parameters frames
            only, via :class:`~flodl_proto.reduce.OuterStepper`).
        checkpoint: emit :class:`CheckpointWindow` actions with each window's Model consensus.
        ceiling: frame ceiling, bytes (1 GiB; no floor: the runner's), of each record and Broadcast.
        reduce_threads: threads the reduce may split a large tensor across (>= 1, default 1; the
            runner passes :func:`~flodl_proto.reduce.default_threads`); the core starts none.
        round_timeout: seconds after a round's first HostFrame after which the relays that have
            not sent theirs are declared dead (None, the default: no deadline, as upstream). The
            caller applies ``FLODL_NET_TIMEOUT_SCALE``.
        mac_executor: runs a 1 MiB+ Broadcast's record MAC beside its frame MAC (the runner's;
            None, the default: both on the calling thread).

    Raises:
        InvalidValue (local): ``world_size`` 0 (``controller.world_size_zero``) or no u32 (a
            negative one included, named with its value) or
            ``reduce_threads`` < 1 (``controller.bad_argument``), a ledger of another world size
            (``controller.ledger_mismatch``), a salt not of 16 bytes, a ``ceiling`` that is no
            byte count (``ceiling.invalid``), or a ``round_timeout`` that is not a positive
            number or above 864000 s (``deadline.bad_timeout`` / ``.too_long``).
        VersionMismatch (local): unsupported version.

    Upstream: ``controller/mod.rs`` ``ClusterController::start_from_source`` and
    ``run_reduce_thread``.
    """

    def __init__(self, world_size: int, salt: BytesLike, *, version: int = DEFAULT_VERSION,
                 dead_ranks: DeadRanks | None = None, outer: OuterOptimizer | None = None,
                 checkpoint: bool = False, ceiling: int = DEFAULT_FRAME_CEILING,
                 reduce_threads: int = 1, round_timeout: float | None = None,
                 mac_executor: Executor | None = None) -> None:
        world_size, reduce_threads = check_core_args(world_size, reduce_threads)
        ledger = dead_ranks if dead_ranks is not None else DeadRanks(world_size)
        if ledger.world_size() != world_size:
            raise protocol_error("controller.ledger_mismatch", ledger=ledger.world_size(),
                                 world_size=world_size)
        self.world_size = int(world_size)
        self.salt = check_salt(salt)
        self.version = check_version(version)
        self.ceiling = frame_ceiling_int(ceiling)
        self.dead_ranks = ledger
        self._stepper = OuterStepper(outer) if outer is not None else None
        self._checkpoint = checkpoint
        self._reduce_threads = reduce_threads  # any count: bit-identical
        self._mac_executor = mac_executor
        self._images = FrameRecordImages()  # the Broadcast's wire image per small layout
        self._pool = OutputPool()  # the consensus arrays of large tensors, reused
        self._conns: dict[int, _Conn] = {}
        self._relays: list[_Relay] = []
        self._rank_relay: dict[int, _Relay] = {}
        self._forwarded: set[int] = set()  # dead ranks seen by _forward_dead (forwarded or not)
        self._alive_relays = _AliveRelays()
        self._pending_exit: tuple[LifecycleEvent, str] | None = None
        self._pending_error: tuple[ProtocolError, str] | None = None
        self.covered = 0
        #: rounds reduced and scattered so far
        self.rounds = 0
        #: bytes parsed from relays / handed out in SendTo actions
        self.bytes_in = 0
        self.bytes_out = 0
        self.last_round: RoundScattered | None = None
        self._windows = _Windows()  # the checkpoint window being gathered
        self._actions: list[Action] = []
        self._deadline = RoundDeadline(round_timeout)
        #: relays given up by the round deadline: dicts of round (from 1), relay, host, ranks,
        #: waited (seconds)
        self.round_timeouts: list[dict[str, Any]] = []
        self.lifecycle_guards = _Guards(self)
        self.lifecycle = Lifecycle(self.lifecycle_guards)  # last: the library reads the guards

    # -- read-only state (state, finished, outcome: _ControllerEnd) -----------------------------
    def relays(self) -> list[RelayInfo]:
        """Snapshots of the accepted relays, in connection (acceptance) order."""
        out = []
        for r in self._relays:
            alive = tuple(x for x in r.ranks if not self.dead_ranks.is_dead(x))
            conn = self._conns.get(r.conn)
            out.append(RelayInfo(r.index, r.conn, r.host, r.ranks, alive, r.frame is not None,
                                 conn is not None and not conn.closed))
        return out

    def uncovered_count(self) -> int:
        """How many ranks no accepted relay has announced (0 once the accept phase is over)."""
        accepting = self.state in (LifecycleState.IDLE, LifecycleState.ACCEPTING)
        return self.world_size - self.covered if accepting else 0

    def uncovered_ranks(self, limit: int | None = None) -> list[int]:
        """The lowest ``limit`` ranks no relay has announced (None: all, up to ``2**32 - 1``: a
        runner that reports them passes a limit), ascending; empty after the accept phase."""
        return (lowest_not_in(self.world_size, self._rank_relay, limit)
                if self.uncovered_count() else [])

    def status(self) -> dict[str, Any]:
        """A JSON-ready status snapshot: state, world size, version, relays and their ranks, dead
        ranks, rounds reduced, bytes in/out, the last round, the outcome once finished."""
        last = self.last_round
        outcome = self.outcome
        return {
            "state": self.lifecycle.state_name,
            "world_size": self.world_size,
            "protocol_version": self.version,
            "relays": [
                {"relay": r.relay, "host": r.host, "ranks": list(r.ranks),
                 "alive_ranks": list(r.alive_ranks), "deposited": r.deposited, "open": r.open}
                for r in self.relays()
            ],
            "ranks_covered": self.covered,
            "dead_ranks": self.dead_ranks.dead_ranks(),
            "rounds_reduced": self.rounds,
            "round_timeout": self._deadline.timeout,
            "round_timeouts": [dict(t) for t in self.round_timeouts],
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "last_round": None if last is None else {
                "round": last.round, "kind": last.kind, "weight": last.weight,
                "bytes": last.nbytes, "relays": last.relays,
            },
            "outcome": None if outcome is None else {
                "clean": outcome.clean, "reason": outcome.reason,
                "error": None if outcome.error is None else str(outcome.error),
            },
        }

    # -- inputs ----------------------------------------------------------------------------------
    def start(self) -> list[Action]:
        """The controller is listening: Idle -> Accepting.

        Raises:
            LocalProtocolError (``controller.bad_event``): not in Idle.
        """
        self.lifecycle.fire(LifecycleEvent.START)
        return self._flush()

    def connection_opened(self, conn: int, now: float,
                          stream: MuxStream | None = None) -> list[Action]:
        """A data-channel connection ``conn`` (a runner-chosen id, unique per run) was accepted at
        time ``now`` (seconds, any monotonic clock). It must deliver the channel magic and a
        Hello within 10 s. After the accept phase it is closed at once.

        Args:
            conn: the connection id.
            now: the time, seconds.
            stream: the connection's parser when the runner parses on its own reader thread
                (then it passes the events to :meth:`receive_events`); default: a new one, fed
                by :meth:`receive_data`.

        Raises:
            LocalProtocolError: in Idle (``controller.bad_event``) or ``conn`` reused
                (``controller.unknown_connection``).
        """
        if self.finished:
            return [CloseConnection(conn, "controller finished")]
        if self.state not in (LifecycleState.ACCEPTING, LifecycleState.REDUCING):
            raise protocol_error("controller.bad_event", event="connection_opened",
                                 state=self.lifecycle.state_name)
        if conn in self._conns:
            raise protocol_error("controller.unknown_connection", conn=conn,
                                 problem="already open")
        if stream is None:
            stream = self.new_stream()
        c = _Conn(conn, stream, now + HANDSHAKE_TIMEOUT)
        self._conns[conn] = c
        if self.state == LifecycleState.REDUCING:
            log.info("controller: connection %s after the accept phase; closing it", conn)
            self._close(c, "every rank is already covered")
        return self._flush()

    def new_stream(self) -> MuxStream:
        """The parser of a new relay connection: the channel magic, then records of this
        core's salt, version and frame ceiling, the first bounded by the largest legal Hello
        for the world size and every later Control record by the longest legal control message
        (spec departures ``hello_bound`` and ``control_bound``). Raises nothing.

        Upstream: ``controller/mod.rs`` (the accept phase's reader; the bounds are ours).
        """
        return MuxStream(self.salt, version=self.version, ceiling=self.ceiling,
                         hello_limit=max_hello_payload(self.world_size),
                         control_limit=max_control_payload(self.world_size))

    def stream(self, conn: int) -> MuxStream:
        """The parser of connection ``conn`` (for a runner that parses on its reader thread and
        passes the events to :meth:`receive_events`; use one or the other per connection).

        Raises:
            LocalProtocolError (``controller.unknown_connection``): ``conn`` was never opened.
        """
        return self._conn(conn).stream

    def receive_data(self, conn: int, data: BytesLike, now: float | None = None
                     ) -> list[Action]:
        """Bytes ``data`` arrived on ``conn`` (any split) at time ``now`` (the clock of
        :meth:`tick`; needed for the round deadline). Frames decoded from ``data`` may keep views
        of it until their round is reduced: do not modify it meanwhile.

        Raises:
            LocalProtocolError (``controller.unknown_connection``): ``conn`` was never opened.
        """
        if self.finished:
            return []
        c = self._conn(conn)
        if c.closed:
            return []
        return self.receive_events(conn, c.stream.feed(data), now)

    def receive_events(self, conn: int, events: Sequence[StreamEvent],
                       now: float | None = None) -> list[Action]:
        """Handle events produced by ``stream(conn)`` (see :meth:`stream`) at time ``now`` (the
        clock of :meth:`tick`; a HostFrame starts the round deadline then; None: no deadline
        starts)."""
        if self.finished:
            return []
        c = self._conn(conn)
        lifecycle = self.lifecycle
        for ev in events:
            if c.closed or lifecycle.is_final:
                break
            if isinstance(ev, _COUNTED):
                self.bytes_in += ev.nbytes
            if c.relay is None:
                self._handshake_event(c, ev)
            else:
                self._relay_event(c, c.relay, ev)
                if now is not None and c.relay.frame is not None:
                    self._deadline.deposit(now)
        self._evaluate()
        return self._flush()

    def connection_closed(self, conn: int, error: ProtocolError | None = None) -> list[Action]:
        """The peer closed ``conn`` (EOF), or reading it failed with ``error``. EOF inside a
        record (after its 25-byte header) is a truncation error; EOF at a record boundary or
        inside a header is a clean end of stream.

        Raises:
            LocalProtocolError (``controller.unknown_connection``): ``conn`` was never opened.
        """
        if self.finished:
            return []
        c = self._conn(conn)
        if c.closed:
            return []
        events = c.stream.fail(error) if error is not None else c.stream.feed_eof()
        return self.receive_events(conn, events)

    def write_failed(self, conn: int, kind: SendKind, reason: str = "") -> list[Action]:
        """Writing a :class:`SendTo` of ``kind`` to ``conn`` failed (error or write stall).

        A failed Broadcast declares every rank of that relay dead and closes the connection
        (elastic scatter: the run goes on with the others); a failed DeclareDead forward is only
        logged; a failed HelloAck fails the run.
        """
        if self.finished:
            return []
        c = self._conn(conn)
        if c.relay is None:
            return []
        relay = c.relay
        if kind is SendKind.BROADCAST:
            # once: the records queued behind the failed one fail too, each reported here
            log.log(logging.DEBUG if c.closed else logging.WARNING,
                    "controller: consensus broadcast to %s failed (%s); declaring its "
                    "ranks dead and continuing with survivors", relay.name,
                    reason or "write error")
            for r in relay.ranks:
                self.dead_ranks.declare_dead(r)
            relay.frame = None
            self._close(c, "broadcast write failed")
            self._evaluate()
        elif kind is SendKind.DECLARE_DEAD:
            log.info("controller: DeclareDead forward to %s failed (%s); connection "
                     "presumed dying", relay.name, reason or "write error")
        else:
            self._fail(protocol_error("controller.hello_ack_write_failed", conn=relay.index,
                                      reason=reason or "write error"), relay.name)
        return self._flush()

    def declare_dead(self, rank: int) -> list[Action]:
        """Rank ``rank`` was declared dead from outside (a coordinator). Ranks never come back;
        an out-of-range rank is a no-op, and so is any call once finished."""
        if self.finished:
            return []
        self.dead_ranks.declare_dead(rank)
        self._evaluate()
        return self._flush()

    def runner_failed(self, error: Exception, where: str = "") -> list[Action]:
        """The runner hit an unexpected exception (not a protocol error: a bug, or a failure
        outside the protocol, e.g. inside the scatter): the run fails with ``error`` as the
        outcome's error, carried as is (state Shutdown, every connection closed). A no-op once
        finished.

        Args:
            error: the exception.
            where: what the runner was doing (for the outcome's detail and the log).
        """
        if not self.finished:
            log.info("controller: run failed: the runner failed%s: %r",
                     f" ({where})" if where else "", error)
            self._finish(LifecycleEvent.FAIL, error=error, detail=f"in {where}" if where else "")
        return self._flush()

    def stop(self, detail: str = "") -> list[Action]:
        """Stop cleanly (an external shutdown); a no-op once finished."""
        if not self.finished:
            self._finish(LifecycleEvent.STOP, detail=detail or "shutdown requested")
        return self._flush()

    def next_deadline(self, now: float) -> float | None:
        """When the core next needs :meth:`tick` (same clock as ``now``): in the accept phase the
        earliest handshake deadline of a connection without a Hello yet; while a round waits,
        ``now`` + :data:`REDUCE_POLL` (deaths written straight into a shared ledger are forwarded
        on it); else None."""
        if self.finished:
            return None
        if self.state == LifecycleState.ACCEPTING:
            return min((c.deadline for c in self._conns.values()
                        if c.relay is None and not c.closed), default=None)
        if self.state == LifecycleState.REDUCING and not self.lifecycle_guards.round_complete:
            due = self._deadline.due()  # the round deadline (an addition), when configured
            return now + REDUCE_POLL if due is None else min(now + REDUCE_POLL, due)
        return None

    def next_round_deadline(self) -> float | None:
        """When the current round's deadline expires (the :meth:`tick` clock), or None (no
        round deadline configured, or no HostFrame yet this round)."""
        return self._deadline.due() if self.state == LifecycleState.REDUCING else None

    def tick(self, now: float) -> list[Action]:
        """Time is ``now`` (same clock as :meth:`connection_opened`): enforce the handshake
        deadline and the round deadline, and forward deaths declared directly in a shared
        ledger."""
        if self.finished:
            return []
        if self.state == LifecycleState.REDUCING and self._deadline.expired(now):
            self._round_deadline_expired(now)
        if self.state == LifecycleState.ACCEPTING:
            for c in list(self._conns.values()):
                if c.relay is None and not c.closed and now >= c.deadline:
                    what = "channel magic" if c.stream.bytes_in < CHANNEL_MAGIC_LEN else "Hello"
                    self._fail(protocol_error("controller.handshake_timeout", conn=c.id,
                                              what=what, seconds=f"{HANDSHAKE_TIMEOUT:g}"),
                               f"connection {c.id} (before its Hello)")
                    break
        self._evaluate()
        return self._flush()

    # -- rounds ----------------------------------------------------------------------------------
    def _round_deadline_expired(self, now: float) -> None:
        """Give up the expected relays without a HostFrame: their ranks are declared dead (the
        ledger a coordinator uses), each gets DeclareDead, then its connection is closed."""
        waited = self._deadline.waited(now)
        late = [r for r in self._expected() if r.frame is None]
        for relay in late:
            alive = [r for r in relay.ranks if not self.dead_ranks.is_dead(r)]
            log.warning("controller: round %d: relay %d ('%s', ranks %s) sent no HostFrame "
                        "within %gs of the round's first one (round timeout); declaring its "
                        "ranks dead and going on without it", self.rounds + 1, relay.index,
                        relay.host, ranks_str(relay.ranks), self._deadline.timeout)
            self.round_timeouts.append({"round": self.rounds + 1, "relay": relay.index,
                                        "host": relay.host, "ranks": alive,
                                        "waited": round(waited, 3)})
            for r in alive:
                self.dead_ranks.declare_dead(r)
        self._forward_dead()
        for relay in late:
            self._close(self._conns[relay.conn], "round timeout: its ranks were declared dead",
                        drain=True)

    def _expected(self) -> list[_Relay]:
        """The relays a round waits for (the cached list: read it, never modify it)."""
        return self._alive_relays.get(self.dead_ranks, self._relays)[0]

    def _evaluate(self) -> None:
        """The round wait: end when no relay is alive, reduce when complete, else forward dead
        ranks (upstream: ``wait_for_round`` and its poll hook)."""
        lifecycle = self.lifecycle
        while lifecycle.state == LifecycleState.REDUCING:
            if self._pending_exit is not None:
                event, detail = self._pending_exit
                self._finish(event, detail=detail)
                return
            if self._pending_error is not None:
                self._fail(*self._pending_error)
                return
            expected = self._expected()
            if not expected:
                dead = ",".join(map(str, self.dead_ranks.dead_ranks()))
                self._finish(LifecycleEvent.ALL_DEAD,
                             detail=f"no relay carries an alive rank (dead ranks {dead}): "
                                    f"{_CLEAN_END}")
                return
            if not _all_deposited(expected):
                self._forward_dead()
                return
            self._round(expected)
            self._deadline.reset()

    def _forward_dead(self) -> None:
        if self.dead_ranks.dead_count() == len(self._forwarded):  # no death since the last call
            return
        for rank in self.dead_ranks.dead_ranks():
            if rank in self._forwarded:
                continue
            self._forwarded.add(rank)
            relay = self._rank_relay.get(rank)
            if relay is None or (c := self._conns[relay.conn]).closed:
                continue
            log.info("controller: forwarding DeclareDead(%d) to %s", rank, relay.name)
            self._send(c, encode_mux_record(MuxRecord.control_msg(DeclareDead(rank),
                                                                  self.version), self.salt),
                       SendKind.DECLARE_DEAD)

    def _round(self, expected: list[_Relay]) -> None:
        relays = self._relays
        if len(expected) == len(relays):  # every relay expected (the usual round): the same list
            frames = [r.frame for r in relays]
        else:
            chosen = {r.index for r in expected}
            frames = [r.frame if r.index in chosen else None for r in relays]
        try:
            consensus = reduce_realized_work(frames, version=self.version,
                                             threads=self._reduce_threads, pool=self._pool)
            if self._stepper is not None:
                consensus = self._stepper.process_frame(consensus)
            buffers = broadcast_record(self._images, consensus, self.salt, self.ceiling,
                                       self._mac_executor, self.rounds + 1)
        except ProtocolError as e:
            hints = "".join(f"; {r.name}: {r.hint}" for r in expected if r.hint)
            self._fail(e, f"reducing round {self.rounds + 1} of "
                          + ", ".join(r.name for r in expected) + hints)
            return
        self.lifecycle.fire(LifecycleEvent.ROUND_SCATTERED)
        for r in relays:
            r.frame = None
        del frames
        nbytes = sum([b.nbytes if type(b) is memoryview else
                      len(b) if type(b) is bytes else memoryview(b).nbytes for b in buffers])
        sent = 0
        round_no = self.rounds + 1
        conns = self._conns
        actions = self._actions
        for r in expected:
            c = conns[r.conn]
            if not c.closed:  # _send, inlined (the one Broadcast of every relay of every round)
                actions.append(_broadcast_to(c.id, buffers, nbytes, round_no))
                sent += 1
        self.bytes_out += nbytes * sent
        notice = _scattered(round_no, _KIND_NAMES[consensus.kind], consensus.weight, nbytes,
                            sent, len(expected))
        self.rounds += 1
        self.last_round = notice
        self._actions.append(notice)
        log.debug("controller: round %d %s weight %r, %d bytes to %d relay(s)", notice.round,
                  notice.kind, notice.weight, nbytes, sent)
        if self._checkpoint:
            self._actions += self._windows.tap(consensus)

"""The controller core's connections before and after their Hello: the accept phase (the
channel magic, one ``Control(Hello)`` whose ranks are below the world size and not yet
announced, ``Control(HelloAck)``, the end of the phase once every rank is covered) and each
relay's stream after it (a HostFrame fills the relay's round slot; a Data record, a truncated
HostFrame or a RankExit for a rank it does not carry fails the run; a RankExit or an EOF while it
carries an alive rank ends it cleanly; during the accept phase such an end is held until every
rank is covered). Internal to :mod:`flodl_proto.fsm.controller_core`, whose
:class:`~flodl_proto.fsm.controller_core.ControllerCore` builds on :class:`_ControllerRelays`.

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``ClusterController::start_from_source``'s
accept loop, ``reduce_reader``).
"""

from __future__ import annotations

from ..codec.mux import (
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    encode_mux_record,
    encode_mux_record_bytes,
    ranks_str,
    rust_debug,
)
from ..codec.round_frame import RoundFrame
from ..codec.stream import (
    MagicReceived,
    StreamEnded,
    StreamEvent,
    StreamFailed,
    other_version_hello,
)
from ..errors import ProtocolError, protocol_error
from ..membership import DeadRanks
from ._controller_end import _CLEAN_END, _ControllerEnd, log
from ._controller_state import _AliveRelays, _Conn, _Relay
from .events import RelayJoined, SendKind, StopAccepting
from .lifecycle import LifecycleEvent, LifecycleState

__all__: list[str] = []


class _ControllerRelays(_ControllerEnd):
    """The accept phase and the relays' streams (the attributes are
    :class:`~flodl_proto.fsm.controller_core.ControllerCore`'s, set by its constructor)."""

    world_size: int
    version: int
    salt: bytes
    dead_ranks: DeadRanks
    covered: int
    _rank_relay: dict[int, _Relay]
    _alive_relays: _AliveRelays
    _pending_exit: tuple[LifecycleEvent, str] | None
    _pending_error: tuple[ProtocolError, str] | None

    # -- event handling --------------------------------------------------------------------------
    def _conn(self, conn: int) -> _Conn:
        c = self._conns.get(conn)
        if c is None:
            raise protocol_error("controller.unknown_connection", conn=conn, problem="not open")
        return c

    def _handshake_event(self, c: _Conn, ev: StreamEvent) -> None:
        if isinstance(ev, MagicReceived):
            return
        where = f"connection {c.id} (before its Hello)"
        if isinstance(ev, StreamFailed):
            self._fail(ev.error, f"{where}; {ev.hint}" if ev.hint else where)
        elif isinstance(ev, StreamEnded):
            self._fail(protocol_error("controller.closed_before_hello"), where)
        elif not isinstance(ev.record.control, Hello):
            self._fail(protocol_error("controller.expected_hello", got=rust_debug(ev.record)),
                       where)
        else:
            self._accept_hello(c, ev.record.control)
            if c.relay is not None and self.version == 2:  # a version-3 Hello decodes too
                relay = c.relay
                relay.hint = other_version_hello(encode_mux_record_bytes(ev.record, self.salt),
                                                 self.salt, self.version)
                if relay.hint:
                    log.warning("controller: %s: %s", relay.name, relay.hint)

    def _accept_hello(self, c: _Conn, hello: Hello) -> None:
        where = f"connection {c.id} (host '{hello.host}', ranks {ranks_str(hello.ranks)})"
        seen: set[int] = set()
        for r in hello.ranks:
            if r >= self.world_size:
                self._fail(protocol_error("controller.rank_out_of_range", rank=r,
                                          world_size=self.world_size), where)
                return
            if r in self._rank_relay or r in seen:
                first = self._rank_relay.get(r)
                self._fail(protocol_error("controller.rank_twice", rank=r),
                           where + (f"; {first.name} announced it first" if first else ""))
                return
            seen.add(r)
        self.lifecycle.fire(LifecycleEvent.HELLO_ACCEPTED)
        relay = _Relay(len(self._relays), c.id, hello.host, tuple(hello.ranks))
        self._relays.append(relay)
        for r in relay.ranks:
            self._rank_relay[r] = relay
        self.covered += len(relay.ranks)
        c.relay = relay
        log.info("controller: relay '%s' carries ranks %s (connection %d)", relay.host,
                 ranks_str(relay.ranks), relay.index)
        self._send(c, encode_mux_record(MuxRecord.control_msg(HelloAck(), self.version),
                                        self.salt), SendKind.HELLO_ACK)
        self._actions.append(RelayJoined(c.id, relay.index, relay.host, relay.ranks))
        if self.covered == self.world_size:
            self.lifecycle.fire(LifecycleEvent.ALL_COVERED)
            log.info("controller: every rank covered by %d relay(s); reducing", len(self._relays))
            self._actions.append(StopAccepting())
            for other in list(self._conns.values()):
                if other.relay is None and not other.closed:
                    self._close(other, "every rank is already covered")

    def _relay_event(self, c: _Conn, relay: _Relay, ev: StreamEvent) -> None:
        if not relay.reading:  # upstream's reader thread for it has exited
            return
        alive = relay.index in self._alive_relays.get(self.dead_ranks, self._relays)[1]
        if isinstance(ev, MagicReceived):  # pragma: no cover - the stream emits it once, first
            return
        if isinstance(ev, StreamEnded):
            relay.reading = False
            if alive:
                self._reader_exit(LifecycleEvent.RELAY_EOF,
                                  f"{relay.name} closed its connection: {_CLEAN_END}")
            else:
                self._close(c, "relay with no alive rank closed")
            return
        if isinstance(ev, StreamFailed):
            relay.reading = False
            if alive:
                self._reader_error(ev.error, relay)
            else:
                log.info("controller: read error on %s with no alive rank: %s", relay.name,
                         ev.error)
                self._close(c, "read error on a relay with no alive rank")
            return
        rec = ev.record
        if rec.kind is RecordKind.HOST_FRAME:
            if not alive:
                log.debug("controller: late HostFrame from fully-dead relay %d dropped",
                          relay.index)
            elif isinstance(ev.frame, RoundFrame):
                relay.frame = ev.frame
            else:
                relay.reading = False
                self._reader_error(ev.frame if isinstance(ev.frame, ProtocolError) else
                                   protocol_error("controller.truncated_hostframe",
                                                  conn=relay.index,
                                                  ranks=ranks_str(relay.ranks)), relay)
        elif rec.kind is RecordKind.DATA:
            relay.reading = False
            self._reader_error(protocol_error("controller.data_record", rank=rec.rank), relay)
        elif rec.kind is RecordKind.BROADCAST:
            log.warning("controller: unexpected Broadcast record from relay %d; dropping",
                        relay.index)
        elif isinstance(rec.control, RankExit):
            rank = rec.control.rank
            if rank not in relay.ranks:
                relay.reading = False
                self._reader_error(protocol_error("controller.foreign_rank_exit",
                                                  conn=relay.index,
                                                  ranks=ranks_str(relay.ranks), rank=rank),
                                   relay)
            elif not self.dead_ranks.is_dead(rank):
                self._reader_exit(LifecycleEvent.RANK_EXIT,
                                  f"rank {rank} of {relay.name} exited: {_CLEAN_END}")
            else:
                log.debug("controller: RankExit for dead rank %d ignored", rank)
        else:
            log.debug("controller: %s from relay %d ignored", rust_debug(rec), relay.index)

    def _reader_exit(self, event: LifecycleEvent, detail: str) -> None:
        """A relay asks for a clean end of the run: at once while reducing; during the accept
        phase it is remembered (the first one) and acted on when every rank is covered."""
        if self.state == LifecycleState.REDUCING:
            self._finish(event, detail=detail)
        elif self._pending_exit is None:  # a warning: the run is over, the wait goes on
            log.warning("controller: %s during the accept phase; the run ends once every rank "
                        "is covered", detail)
            self._pending_exit = (event, detail)

    def _reader_error(self, error: ProtocolError, relay: _Relay) -> None:
        """A relay's stream failed: the run fails at once while reducing; during the accept
        phase the first such error is remembered and raised when every rank is covered (after a
        pending clean exit, which wins, as upstream's round wait checks it first)."""
        where = f"reading {relay.name}" + (f"; {relay.hint}" if relay.hint else "")
        if self.state == LifecycleState.REDUCING:
            self._fail(error, where)
        elif self._pending_error is None:  # a warning: the run has failed, the wait goes on
            log.warning("controller: %s: %s (during the accept phase; reported once every rank "
                        "is covered)", where, error)
            self._pending_error = (error, where)

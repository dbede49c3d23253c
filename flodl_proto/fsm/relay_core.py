"""Sans-IO host relay core: events in, actions out (the relay's rules, without sockets or threads).

The core owns the relay lifecycle (``spec/lifecycle.yaml`` ``machines.relay``), the host's rank
set, and the fold barrier (:class:`~flodl_proto.reduce.HostFold`). The runner
(:mod:`flodl_proto.runner.relay`) keeps the sockets, threads and buffers: it feeds the core what
happened and executes the actions it returns (:data:`~flodl_proto.fsm.events.RelayAction`). The
core is not thread-safe: the runner serialises calls (one lock) and executes the actions of one
call before the next call, so HostFrames leave in round order.

Inputs (each returns a list of actions):

* :meth:`RelayCore.rank_handshake` — a loopback connection delivered its 16-byte handshake;
* :meth:`RelayCore.dialed` — the controller connection is open;
* :meth:`RelayCore.upstream_record` — a record (or the end of stream) from the controller;
* :meth:`RelayCore.broadcast_route` — a question, not an input: may a Broadcast whose header
  has arrived be forwarded to the ranks while its payload arrives (spec departure
  ``broadcast_cut_through``)?
* :meth:`RelayCore.rank_frame` — a local rank's loopback blob (one signed RoundFrame);
* :meth:`RelayCore.rank_left` — a local rank's loopback stream ended or broke;
* :meth:`RelayCore.drained` — the drain requested by :class:`~flodl_proto.fsm.events.DrainUpstream`
  completed;
* :meth:`RelayCore.controller_closed` — a write found the controller connection closed;
* :meth:`RelayCore.stop` / :meth:`RelayCore.fail` — stop cleanly / a runner-side protocol error.

Rules (upstream's, facts §d.7, and ``spec/lifecycle.yaml``):

* accept: every handshake must carry the protocol version and the world size; its rank gets the
  ack first, then must be one of the host's ranks (``relay.rank_not_in_host``) and not connected
  yet (``relay.duplicate_rank``); either failure ends the relay. When every local rank is
  connected, the relay dials;
* dial: the channel magic and ``Control(Hello{host, ranks ascending})`` (``model_sigs`` empty at
  version 3); the first record back must be ``Control(HelloAck)`` (``relay.expected_helloack``;
  end of stream: ``relay.closed_before_helloack``);
* fold: each blob is deposited into the fold; a deposit or death that completes a round sends one
  HostFrame (a frame signed here: the merged sums, or the seed's tensors under a weight later
  deposits changed; or the seed's bytes verbatim, copied since the runner reuses the blob's
  buffer); a fold error (MAC, schema, double deposit...) ends the relay. A
  Broadcast is fanned out to the alive local ranks (one above the frame ceiling ends the relay
  with ``mux.payload_too_large``, as the runner's reader would); ``DeclareDead`` for a local
  rank takes it out of the barrier (for another rank it is logged and ignored); any other
  record is logged and ignored. The end of the controller's stream ends the relay cleanly;
* a local rank that leaves is declared dead in the fold and reported with ``RankExit``; after the
  last one the queued records are flushed and the upstream connection closed (drain);
* when the controller has declared every local rank dead and then closes the connection, the
  relay fails with ``relay.host_declared_dead`` (the run goes on without this host: the
  controller's round deadline, or a coordinator, gave it up);
* rank deadline (an addition, off by default: ``rank_timeout``, departure ``rank_timeout``): a
  :class:`~flodl_proto.fsm.deadline.RoundDeadline` starts at the round's first local deposit
  (the time passed to :meth:`RelayCore.rank_frame`); when :meth:`RelayCore.tick` finds it
  expired, every alive local rank without a deposit is declared dead in the fold (which
  completes the host's round) and its connection is closed (:class:`CloseRank`); no
  ``RankExit`` is sent for it, then or when its stream ends (upstream ends the run on one);
* after :class:`~flodl_proto.fsm.events.Finished` every input is a no-op (caller misuse, such
  as a rank that is not the host's, still raises).

Upstream: ``flodl/src/distributed/relay/agent.rs`` (``RelayChannel``, ``run_data_relay``,
``FoldCtx``), ``relay/mux.rs``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any, cast

from .._slots import slot_builder
from ..codec._common import BytesLike, as_view, check_version, wire_int
from ..codec.auth import Premac, check_salt
from ..codec.ceiling import frame_ceiling_int
from ..codec.handshake import decode_handshake, encode_ack, encode_channel_magic
from ..codec.loopback import encode_len_prefix
from ..codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    encode_mux_record,
    encode_mux_record_parts,
    ranks_str,
)
from ..codec.record_image import FrameRecordImages
from ..codec.round_frame import FRAME_TAG_TAIL, RoundFrame
from ..errors import LimitExceeded, ProtocolError, protocol_error, shown_type
from ..reduce import HostFold
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_LEN,
    MAX_HELLO_HOST_LEN,
    U32_MAX,
)
from .deadline import RoundDeadline
from .events import (
    AckRank,
    BroadcastRoute,
    CloseRank,
    DrainUpstream,
    FanOut,
    Finished,
    RankConnected,
    RelayAction,
    SendUpstream,
    UpstreamKind,
)
from .lifecycle import Lifecycle, Outcome, RelayEvent, RelayState

__all__ = ["RelayCore"]

log = logging.getLogger(__name__)

# the two actions of every round, built without their frozen dataclasses' per-field
# ``object.__setattr__`` (see :mod:`flodl_proto._slots`):
#: ``_host_frame_up(buffers)``: ``SendUpstream(buffers, UpstreamKind.HOST_FRAME)``
_host_frame_up: Callable[..., SendUpstream] = slot_builder(
    SendUpstream, fixed={"kind": UpstreamKind.HOST_FRAME})
#: ``_fan_out(prefix, payload, ranks)``: ``FanOut(prefix, payload, ranks)``
_fan_out: Callable[..., FanOut] = slot_builder(FanOut)


class _Guards:
    """The relay lifecycle's guard model: reads the core's state on demand."""

    __slots__ = ("_core", "state")

    def __init__(self, core: RelayCore) -> None:
        self._core = core
        self.state: Any = None  # written by the state machine library

    @property
    def every_local_rank_connected(self) -> bool:
        return len(self._core._connected) == len(self._core.ranks)

    @property
    def every_local_rank_gone(self) -> bool:
        return len(self._core._gone) == len(self._core.ranks)


class RelayCore:
    """The sans-IO host relay (see the module doc for the rules).

    Args:
        ranks: the host's global rank ids (non-empty, distinct whole numbers, each <
            ``world_size``).
        world_size: the cluster's world size, 1..4294967295 (every handshake must carry it).
        salt: the 16-byte session salt.
        version: data-channel protocol version, 2 (default) or 3.
        host: the host name announced in ``Hello`` (at most ``MAX_HELLO_HOST_LEN`` = 255 UTF-8
            bytes).
        ceiling: frame ceiling in bytes, any byte count (the runner, :class:`~flodl_proto.runner.
            relay.Relay`, refuses one below the smallest RoundFrame: departure ``ceiling_floor``;
            the core takes a smaller one, so tests reach the limit paths with small frames).
        rank_timeout: seconds after a round's first local deposit after which the local ranks
            that have not sent their frame are declared dead (None, the default: no deadline,
            as upstream). The caller applies ``FLODL_NET_TIMEOUT_SCALE``.
        mac_executor: an executor (the runner's) on which a merged HostFrame's record MAC runs
            beside its frame MAC when the frame is at least 1 MiB (None, the default: both on
            the calling thread); the core itself starts no thread.

    Raises:
        InvalidValue (local): a bad rank set (``relay.bad_rank_set``: ``ranks`` no iterable
            of whole numbers, text and bytes-like objects included, whose characters or bytes
            would be taken as the ranks, and a mapping, whose keys would be; empty, a rank
            twice, or a rank negative or not below ``world_size``, named with its value) or
            salt, a host name that is not text (``mux.bad_field``, as a Hello's) or longer
            than a Hello may carry (``relay.host_too_long``), or a ``rank_timeout`` that is not
            a positive number (``deadline.bad_timeout``).
        VersionMismatch (local): unsupported version.

    Upstream: ``relay/agent.rs`` ``RelayChannel`` (``ChannelKind::Data``).
    """

    def __init__(self, ranks: Iterable[int], world_size: int, salt: BytesLike, *,
                 version: int = DEFAULT_VERSION, host: str = "",
                 ceiling: int = DEFAULT_FRAME_CEILING,
                 rank_timeout: float | None = None,
                 mac_executor: Executor | None = None) -> None:
        if isinstance(ranks, str | bytes | bytearray | memoryview):
            # each character or byte would be taken as a rank: b"\x00\x01" as the ranks 0, 1
            raise protocol_error(
                "relay.bad_rank_set", ranks=bytes(ranks) if isinstance(ranks, memoryview)
                else ranks, world_size=world_size,
                reason=f"ranks must be an iterable of whole numbers, got {shown_type(ranks)} "
                       "(each of its items would be taken as a rank; pass a list of ints)")
        if isinstance(ranks, Mapping):  # its keys would be taken as the ranks, its values lost
            raise protocol_error(
                "relay.bad_rank_set", ranks=ranks, world_size=world_size,
                reason=f"ranks must be an iterable of whole numbers, got {shown_type(ranks)} "
                       "(its keys would be taken as the ranks; pass a list of ints)")
        try:
            given = list(ranks)
        except TypeError:  # None, a number: no rank set
            raise protocol_error(
                "relay.bad_rank_set", ranks=ranks, world_size=world_size,
                reason=f"ranks must be an iterable of whole numbers, got {shown_type(ranks)}"
            ) from None
        rank_list = [wire_int(r) for r in given]  # None: no whole number (a bool, a float...)
        world = wire_int(world_size)
        reason = None
        if not rank_list:
            reason = "no ranks"
        elif None in rank_list:
            reason = "every rank must be a whole number (not a bool, a float or text)"
        elif len(set(rank_list)) != len(rank_list):
            reason = "a rank is listed twice"
        elif world is not None and world <= 0:
            reason = "world_size must be > 0"
        elif world is None or world > U32_MAX:
            reason = f"world_size must be a whole number in 1..{U32_MAX}"
        elif (bad := next((r for r in rank_list if r is not None and not 0 <= r < world),
                          None)) is not None:
            reason = (f"rank {bad} is negative" if bad < 0 else
                      f"rank {bad} is not below world_size {world}") + \
                f" (the ranks of a world of {world} are 0..{world - 1})"
        if reason is not None:
            raise protocol_error("relay.bad_rank_set", ranks=given, world_size=world_size,
                                 reason=reason)
        #: the host's ranks, ascending
        self.ranks: tuple[int, ...] = tuple(sorted(cast("list[int]", rank_list)))
        self._local = frozenset(self.ranks)
        self.world_size = cast(int, world)
        self.salt = check_salt(salt)
        self.version = check_version(version)
        if not isinstance(host, str):  # the Hello's rule, before the length is measured
            raise protocol_error("mux.bad_field", field="Hello.host", value=host,
                                 reason="not text (str)")
        length = len(Hello(host, ()).host.encode("utf-8"))  # the Hello's rules, then its length
        if length > MAX_HELLO_HOST_LEN:  # a Hello the controller's Hello bound may refuse
            raise protocol_error("relay.host_too_long", length=length, max=MAX_HELLO_HOST_LEN)
        self.host = host
        self.ceiling = frame_ceiling_int(ceiling)
        #: runs a large HostFrame's second MAC beside the first (None: both on the calling
        #: thread); owned by the runner
        self._mac_executor = mac_executor
        self._images = FrameRecordImages()  # the merged HostFrame's wire image per small layout
        #: the fold barrier (read-only use outside the core: alive ranks, rounds completed)
        self.fold = HostFold(self.ranks, self.salt, version=self.version, ceiling=self.ceiling)
        self._connected: set[int] = set()
        self._gone: set[int] = set()
        self._declared_dead: set[int] = set()  # by the controller's DeclareDead
        self._deadline = RoundDeadline(rank_timeout, "rank_timeout")
        #: local ranks given up by the rank deadline: dicts of round (from 1), rank, waited (s)
        self.rank_timeouts: list[dict[str, Any]] = []
        self._actions: list[RelayAction] = []
        #: the last Broadcast's length and its encoded prefix (see _broadcast_prefix)
        self._last_prefix: tuple[int, bytes] = (-1, b"")
        self.lifecycle = Lifecycle(_Guards(self), "relay")  # last: the library reads the guards

    # -- read-only state -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """Lifecycle state id (a :class:`~flodl_proto.fsm.lifecycle.RelayState` value)."""
        return self.lifecycle.state

    @property
    def finished(self) -> bool:
        """True once the relay is done."""
        return self.lifecycle.is_final

    @property
    def outcome(self) -> Outcome | None:
        """How the relay ended, once finished."""
        return self.lifecycle.outcome

    def missing_ranks(self) -> list[int]:
        """The local ranks not connected yet, ascending (empty once the accept phase is over)."""
        if self.state != RelayState.ACCEPTING_RANKS:
            return []
        return [r for r in self.ranks if r not in self._connected]

    # -- inputs ----------------------------------------------------------------------------------
    def rank_handshake(self, data: BytesLike) -> list[RelayAction]:
        """A loopback connection delivered ``data``, its handshake (16 bytes; fewer when the
        connection ended early).

        Returns:
            :class:`AckRank` and :class:`RankConnected`, or :class:`AckRank` then
            :class:`Finished` (rank outside the host's set, or connected twice), or
            :class:`Finished` alone (a handshake the reader rejects).

        Raises:
            LocalProtocolError (``relay.bad_event``): not accepting ranks.
        """
        if not self._accepting("rank_handshake"):
            return []
        try:
            rank = decode_handshake(data, self.world_size, self.version)[0].rank
        except ProtocolError as e:
            self._fail(e)
            return self._flush()
        self._actions.append(AckRank(rank, encode_ack(self.version)))
        if rank not in self.ranks:
            self._fail(protocol_error("relay.rank_not_in_host", rank=rank,
                                      ranks=list(self.ranks)))
        elif rank in self._connected:
            self._fail(protocol_error("relay.duplicate_rank", rank=rank))
        else:
            self._connected.add(rank)
            self._actions.append(RankConnected(rank))
            if len(self._connected) == len(self.ranks):
                self.lifecycle.fire(RelayEvent.ALL_CONNECTED)
            else:
                self.lifecycle.fire(RelayEvent.RANK_CONNECTED)
        return self._flush()

    def rank_handshake_expired(self, got: int, seconds: float) -> list[RelayAction]:
        """A loopback connection delivered only ``got`` bytes of its 16-byte handshake before
        the handshake deadline of ``seconds`` passed (``HANDSHAKE_READ``; departure
        ``relay_handshake_deadline`` in ``spec/wire.yaml``).

        Returns:
            :class:`Finished` with a :class:`~flodl_proto.errors.TruncatedInput`
            (``relay.handshake_timeout``), as a short handshake ends the relay.

        Raises:
            LocalProtocolError (``relay.bad_event``): not accepting ranks.
        """
        if not self._accepting("rank_handshake_expired"):
            return []
        self._fail(protocol_error("relay.handshake_timeout", seconds=f"{seconds:g}", got=got,
                                  need=HANDSHAKE_LEN))
        return self._flush()

    def _accepting(self, event: str) -> bool:
        """Whether the accept-phase input ``event`` acts: True while accepting ranks, False
        once finished (it is ignored); raises ``relay.bad_event`` in any other state."""
        if self.finished:
            return False
        if self.state != RelayState.ACCEPTING_RANKS:
            raise protocol_error("relay.bad_event", event=event, state=self.lifecycle.state_name)
        return True

    def dialed(self) -> list[RelayAction]:
        """The controller connection is open: send the channel magic and Hello.

        Raises:
            LocalProtocolError (``relay.bad_event``): not dialing.
        """
        if self.finished:
            return []
        self.lifecycle.fire(RelayEvent.HELLO_SENT)
        self._actions.append(SendUpstream(
            (encode_channel_magic("data"), *encode_mux_record(self._hello(), self.salt)),
            UpstreamKind.HELLO))
        return self._flush()

    def upstream_record(self, record: MuxRecord | None) -> list[RelayAction]:
        """A record from the controller (already authenticated by the codec), or None at a clean
        end of stream.

        A Broadcast whose payload is above this relay's frame ceiling ends the relay with the
        remote ``mux.payload_too_large`` the runner's reader raises for such a record, whatever
        ceiling the caller read it with (the ranks' length prefix is bounded by the ceiling).

        Raises:
            LocalProtocolError (``relay.bad_event``): before the Hello was sent.
        """
        state = self.lifecycle.state
        if state in (RelayState.FOLDING, RelayState.DRAINING):
            self._controller_record(record)
        elif state == RelayState.AWAITING_HELLO_ACK:
            self._hello_ack(record)
        elif self.lifecycle.is_final:
            return []
        else:
            raise protocol_error("relay.bad_event", event="upstream_record",
                                 state=self.lifecycle.state_name)
        return self._flush()

    def broadcast_route(self, kind: int, payload_len: int) -> BroadcastRoute | None:
        """May a controller record whose header announces ``kind`` and ``payload_len`` bytes be
        forwarded to the local ranks as its payload arrives, before its auth tag is checked?
        Changes nothing: the record is still handed to :meth:`upstream_record` once read, and
        only that call's :class:`FanOut` lets the runner write the held-back tail (spec
        departure ``broadcast_cut_through``).

        Returns:
            the route (the payload's length prefix, the alive local ranks, the frame's
            ``FRAME_TAG_TAIL`` tag bytes to hold back) for a Broadcast of more than
            ``FRAME_TAG_TAIL`` and at most :attr:`ceiling` bytes while the relay folds or drains
            with a local rank alive; None otherwise (the runner reads the whole record first, as
            upstream does).

        Upstream: none (``relay/agent.rs`` reads and checks the whole record before writing it
        to any rank).
        """
        if (kind != RecordKind.BROADCAST or not FRAME_TAG_TAIL < payload_len <= self.ceiling
                or self.lifecycle.state not in (RelayState.FOLDING, RelayState.DRAINING)):
            return None
        ranks = self.fold.alive_ranks
        if not ranks:
            return None
        return BroadcastRoute(encode_len_prefix(payload_len, ceiling=self.ceiling), ranks,
                              FRAME_TAG_TAIL)

    def rank_frame(self, rank: int, blob: BytesLike, *,
                   premac: Premac | None = None, now: float | None = None) -> list[RelayAction]:
        """Local rank ``rank`` sent ``blob`` (one loopback blob). The fold keeps views into it
        until the round completes: the runner must not modify it before then (see
        :attr:`HostFold.deposited <flodl_proto.reduce.HostFold.deposited>`).

        Args:
            rank: a local rank.
            blob: the blob.
            premac: the MAC of the blob's bytes before its last 8, computed as they arrived.
            now: the time (the clock of :meth:`tick`); the round's first deposit starts the
                rank deadline (None: it does not start).

        Raises:
            InvalidValue (local): ``rank`` is not one of the host's ranks
                (``relay.not_local_rank``) or ``blob`` is no bytes-like buffer
                (``codec.not_bytes_like``); the run goes on (a peer's bad bytes end it instead,
                as a :class:`Finished` action).
        """
        if rank.__class__ is not int or rank not in self._local:  # else what it returns
            rank = self._local_rank(rank, "rank_frame")
        blob = as_view(blob, "blob")
        if self.lifecycle.is_final:
            return []
        if now is not None and self.fold.is_alive(rank):
            self._deadline.deposit(now)
        try:
            done = self.fold.deposit_view(rank, blob, premac)
            if done is not None:
                self._ship(done)
        except ProtocolError as e:
            e.add_note(f"local rank {rank}'s frame")  # whose deposit it was, for the report
            self._fail(e)
        out, self._actions = self._actions, []  # _flush, inline
        return out

    def next_deadline(self) -> float | None:
        """When the current round's rank deadline expires (the :meth:`tick` clock), or None (no
        rank deadline configured, or no local deposit yet this round)."""
        return None if self.finished else self._deadline.due()

    def tick(self, now: float) -> list[RelayAction]:
        """Time is ``now``: enforce the rank deadline (see the module doc)."""
        if self.finished or not self._deadline.expired(now):
            return []
        waited = self._deadline.waited(now)
        late = [r for r in self.fold.alive_ranks if r not in self.fold.deposited]
        round_ = self.fold.rounds_completed + 1
        for rank in late:
            log.warning("relay %s: round %d: local rank %d sent no frame within %gs of the "
                        "round's first one (rank timeout); declaring it dead and going on "
                        "without it", self.host, round_, rank, self._deadline.timeout)
            self.rank_timeouts.append({"round": round_, "rank": rank,
                                       "waited": round(waited, 3)})
            self._gone.add(rank)
            try:
                self._ship(self.fold.declare_dead_frame(rank))
            except ProtocolError as e:
                self._fail(e)
                return self._flush()
            self._actions.append(CloseRank(rank, "rank timeout"))
        self._deadline.reset()
        self._after_gone()
        return self._flush()

    def rank_left(self, rank: int) -> list[RelayAction]:
        """Local rank ``rank``'s loopback stream ended or broke (upstream's rank reader turns
        every read error into an exit): out of the barrier, ``RankExit`` upstream, and after the
        last one the drain. Repeats are no-ops, and so is a rank given up by the rank deadline
        (already out, no RankExit).

        Raises:
            InvalidValue (local) ``relay.not_local_rank``: ``rank`` is not one of the host's.
        """
        rank = self._local_rank(rank, "rank_left")
        if self.finished or rank in self._gone:
            return []
        self._gone.add(rank)
        log.info("relay %s: rank %d left", self.host, rank)
        try:
            self._ship(self.fold.declare_dead_frame(rank))
        except ProtocolError as e:
            self._fail(e)
            return self._flush()
        exit_rec = encode_mux_record(MuxRecord.control_msg(RankExit(rank), self.version),
                                     self.salt)
        self._actions.append(SendUpstream(tuple(exit_rec), UpstreamKind.RANK_EXIT))
        self._after_gone()
        return self._flush()

    def _local_rank(self, rank: int, event: str) -> int:
        """``rank`` when it is one of the host's ranks (an integer: ``True`` is not rank 1)."""
        n = rank if rank.__class__ is int else wire_int(rank)  # another integer: its value
        if n is None or n not in self._local:
            raise protocol_error("relay.not_local_rank", event=event,
                                 rank=rank if n is None else n, ranks=list(self.ranks))
        return n

    def _after_gone(self) -> None:
        """After the last local rank is gone: drain; else a rank-left transition."""
        if len(self._gone) == len(self.ranks):
            log.info("relay %s: last local rank left; closing upstream", self.host)
            self.lifecycle.fire(RelayEvent.LAST_RANK_LEFT)
            self._actions.append(DrainUpstream())
        else:
            self.lifecycle.fire(RelayEvent.RANK_LEFT)

    def drained(self) -> list[RelayAction]:
        """Every queued record was written and the upstream write side closed (clean end)."""
        if not self.finished:
            self._finish(RelayEvent.DRAINED, detail="every local rank left")
        return self._flush()

    def controller_closed(self, detail: str = "") -> list[RelayAction]:
        """A write found the controller connection closed while folding or draining: a clean
        end, as the end of its stream is (a closed connection before HelloAck is
        :meth:`upstream_record` with None); after the controller declared every local rank
        dead, the same failure as that end of stream (``relay.host_declared_dead``), whichever
        of the two the runner meets first.

        Raises:
            LocalProtocolError (``relay.bad_event``): before HelloAck.
        """
        if not self.finished:
            self._controller_gone(detail or "the controller closed the connection")
        return self._flush()

    def stop(self, detail: str = "") -> list[RelayAction]:
        """Stop cleanly (an external shutdown, or the runner gave up on an I/O error it reports
        itself); a no-op once finished."""
        if not self.finished:
            self._finish(RelayEvent.STOP, detail=detail or "shutdown requested")
        return self._flush()

    def fail(self, error: ProtocolError) -> list[RelayAction]:
        """A protocol error the runner met (a record the reader rejected, a truncated read)."""
        if not self.finished:
            self._fail(error)
        return self._flush()

    # -- rules -----------------------------------------------------------------------------------
    def _hello(self) -> MuxRecord:
        """The Control(Hello) record this relay sends: its host and ranks (a controller refuses
        one whose payload is above its frame ceiling)."""
        return MuxRecord.control_msg(Hello(self.host, self.ranks), self.version)

    def _hello_ack(self, record: MuxRecord | None) -> None:
        if record is None:
            self._fail(protocol_error("relay.closed_before_helloack",
                                      hello_bytes=self._hello().payload.nbytes))
        elif not isinstance(record.control, HelloAck):
            got = (type(record.control).__name__ if record.control is not None
                   else record.kind.name)
            self._fail(protocol_error("relay.expected_helloack", got=got))
        else:
            self.lifecycle.fire(RelayEvent.HELLO_ACKED)
            log.debug("relay %s: controller acknowledged ranks %s", self.host,
                      ranks_str(self.ranks))

    def _controller_record(self, rec: MuxRecord | None) -> None:
        if rec is None:
            self._controller_gone("the controller closed the connection", note=True)
        elif rec.kind is RecordKind.BROADCAST:
            payload = rec.payload
            if payload.nbytes > self.ceiling:  # a caller that read it with a larger ceiling
                self._fail(protocol_error("mux.payload_too_large", length=payload.nbytes,
                                          ceiling=self.ceiling, kind=int(rec.kind),
                                          rank=rec.rank))
                return
            self._actions.append(_fan_out(self._broadcast_prefix(payload.nbytes), payload,
                                          self.fold.alive_ranks))
        elif rec.kind is RecordKind.CONTROL and isinstance(rec.control, DeclareDead):
            rank = rec.control.rank
            if rank not in self.ranks:
                log.warning("relay %s: DeclareDead for rank %d, not one of ours %s",
                            self.host, rank, ranks_str(self.ranks))
                return
            log.warning("relay %s: controller declared rank %d dead", self.host, rank)
            self._declared_dead.add(rank)
            try:
                self._ship(self.fold.declare_dead_frame(rank))
            except ProtocolError as e:
                self._fail(e)
        else:
            log.warning("relay %s: ignoring unexpected %s record from the controller",
                        self.host, rec.kind.name)

    def _broadcast_prefix(self, length: int) -> bytes:
        """``encode_len_prefix(length, ceiling=self.ceiling)``, kept for the last length asked
        for (a run's Broadcasts are of one length round after round): the same bytes."""
        last = self._last_prefix
        if last[0] == length:
            return last[1]
        prefix = encode_len_prefix(length, ceiling=self.ceiling)
        self._last_prefix = (length, prefix)
        return prefix

    def _ship(self, payload: RoundFrame | memoryview | None) -> None:
        if payload is None:
            return
        try:
            if isinstance(payload, RoundFrame):  # merged sums: small ones into the layout's
                # kept image, large ones with the frame and record MACs in parallel
                parts = self._images.encode(RecordKind.HOST_FRAME, payload, self.salt,
                                            ceiling=self.ceiling, mac_executor=self._mac_executor)
            else:  # the seed verbatim, copied: the runner reuses its blob buffer for the next one
                parts = encode_mux_record_parts(int(RecordKind.HOST_FRAME), 0, [bytes(payload)],
                                                self.salt, ceiling=self.ceiling)
        except LimitExceeded as e:  # the record, not any one deposit, is over the ceiling
            f = dict(e.fields)
            raise protocol_error("relay.host_frame_too_large", length=f["length"],
                                 ceiling=f["ceiling"]) from e
        self._actions.append(_host_frame_up(tuple(parts)))
        self._deadline.reset()  # the host's round is complete

    def _controller_gone(self, detail: str, *, note: bool = False) -> None:
        """The controller connection ended (its stream, or a write): a clean end (logged when
        ``note``), unless the controller had declared every local rank dead (the host was
        dropped from the run)."""
        if self._declared_dead >= set(self.ranks):
            self._fail(protocol_error("relay.host_declared_dead",
                                      ranks=ranks_str(sorted(self._declared_dead))))
            return
        if note:
            log.info("relay %s: controller closed the connection", self.host)
        self._finish(RelayEvent.CONTROLLER_CLOSED, detail=detail)

    def _fail(self, error: ProtocolError) -> None:
        log.info("relay %s (ranks %s) failed: %s", self.host, ranks_str(self.ranks), error)
        self._finish(RelayEvent.FAIL, error=error)

    def _finish(self, event: RelayEvent, *, error: ProtocolError | None = None,
                detail: str = "") -> None:
        if self.finished:
            return
        if event is RelayEvent.FAIL:
            self.lifecycle.fire(RelayEvent.FAIL, error=error, detail=detail)
        else:
            self.lifecycle.fire(event, detail=detail)
        outcome = self.outcome
        assert outcome is not None
        self._actions.append(Finished(outcome))

    def _flush(self) -> list[RelayAction]:
        out, self._actions = self._actions, []
        return out

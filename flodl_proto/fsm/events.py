"""The cores' actions: what a sans-IO core asks its runner to do, and notices for logs and status.

Every action is a frozen, slotted dataclass; a core returns a list of them from each input and
never performs one itself. :data:`Action` is the controller core's union, :data:`RelayAction`
the relay core's (:class:`Finished` serves both).

Upstream: the socket writes, closes and log lines of ``flodl/src/distributed/controller/mod.rs``
(``run_reduce_thread``, ``average_and_scatter``) and ``relay/agent.rs`` (``RelayChannel``) that the
cores turn into values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from ..codec._common import BytesLike
from ..codec.round_frame import RoundFrame
from .lifecycle import Outcome

__all__ = [
    "AckRank",
    "Action",
    "BroadcastRoute",
    "CheckpointWindow",
    "CloseConnection",
    "CloseRank",
    "DrainUpstream",
    "FanOut",
    "Finished",
    "RankConnected",
    "RelayAction",
    "RelayInfo",
    "RelayJoined",
    "RoundScattered",
    "SendKind",
    "SendTo",
    "SendUpstream",
    "StopAccepting",
    "UpstreamKind",
]


class SendKind(enum.Enum):
    """What a :class:`SendTo` carries (decides what a failed write means).

    Upstream: ``controller/mod.rs`` (``run_reduce_thread``, ``average_and_scatter``), where this is
    a socket write, close or log line; as a value it is this package's.
    """

    HELLO_ACK = "HelloAck"
    DECLARE_DEAD = "DeclareDead"
    BROADCAST = "Broadcast"


@dataclass(frozen=True, slots=True, eq=False)
class SendTo:
    """Write ``buffers`` (in order, e.g. with ``socket.sendmsg``) to connection ``conn``.

    Attributes:
        conn: the runner's connection id.
        buffers: the record's buffers; for a Broadcast the same tuple object is shared by every
            relay of the round (one serialization).
        kind: what the record is (:class:`SendKind`).
        nbytes: total length in bytes.
        round: the round number for a Broadcast, else None.

    Upstream: ``controller/mod.rs`` (``run_reduce_thread``, ``average_and_scatter``), where this is
    a socket write, close or log line; as a value it is this package's.
    """

    conn: int
    buffers: tuple[BytesLike, ...]
    kind: SendKind
    nbytes: int
    round: int | None = None


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close connection ``conn`` once the records queued before it are written.

    Attributes:
        conn: the runner's connection id.
        reason: why (for logs).
        drain: False: close both directions. True: send FIN only and keep reading, discarding
            whatever arrives, until the peer closes (a relay given up by the round deadline gets
            its DeclareDead records and the end of stream even if its late HostFrame is still
            on the way; closing the reading side would answer that HostFrame with a reset).

    Upstream: ``controller/mod.rs`` (``run_reduce_thread``, ``average_and_scatter``), where this is
    a socket write, close or log line; as a value it is this package's.
    """

    conn: int
    reason: str
    drain: bool = False


@dataclass(frozen=True, slots=True)
class StopAccepting:
    """Every rank is covered: no further data-channel connection will be accepted (a listener
    serving only the data channel may close).

    Upstream: the end of the accept phase of ``controller/mod.rs`` (every rank announced).
    """


@dataclass(frozen=True, slots=True)
class RelayJoined:
    """A relay's Hello was accepted (notice).

    Attributes:
        conn: the runner's connection id.
        relay: connection number in acceptance order (0-based; the reduce order).
        host: the host name the relay announced.
        ranks: the ranks it carries, as announced.

    Upstream: the accepted Hello of ``controller/mod.rs`` (accept phase); as a notice it is this
    package's.
    """

    conn: int
    relay: int
    host: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RoundScattered:
    """A round was reduced and its consensus scattered (notice).

    Attributes:
        round: round number (1-based: the first round is round 1, in every role's messages).
        kind: ``"model"`` or ``"control"``.
        weight: the consensus weight (the accepted realized-work mass).
        nbytes: the Broadcast record's length in bytes.
        relays: number of relays the Broadcast was sent to.
        contributors: number of relays whose frame entered the reduce.

    Upstream: the scatter of ``controller/mod.rs`` ``average_and_scatter``; as a notice it is this
    package's.
    """

    round: int
    kind: str
    weight: float
    nbytes: int
    relays: int
    contributors: int


@dataclass(frozen=True, slots=True, eq=False)
class CheckpointWindow:
    """The Model consensus frames of one sync window, to be written as a checkpoint off the hot
    path (the runner writes ``consensus-<window>.npz``: ``p<i>`` from ``params``, ``b<j>`` from
    ``buffers``, all float32).

    Attributes:
        window: window number (0-based, counting written windows).
        params: the window's first realized Model consensus (the parameters).
        buffers: its second realized Model consensus (the buffers), if any.

    Upstream: the checkpoint forge tap of ``checkpoint_forge.rs`` (after the scatter); the ``.npz``
    file is this package's.
    """

    window: int
    params: RoundFrame
    buffers: RoundFrame | None


@dataclass(frozen=True, slots=True)
class Finished:
    """The run is over.

    Attributes:
        outcome: clean, or the error (:class:`~flodl_proto.fsm.lifecycle.Outcome`).

    Upstream: the end of ``controller/mod.rs`` ``run_reduce_thread`` (its result, as ``shutdown()``
    returns it) and of ``relay/agent.rs`` ``RelayChannel``.
    """

    outcome: Outcome


Action: TypeAlias = (
    SendTo | CloseConnection | StopAccepting | RelayJoined | RoundScattered | CheckpointWindow
    | Finished
)


@dataclass(frozen=True, slots=True)
class RelayInfo:
    """A snapshot of one accepted relay (for status).

    Attributes:
        relay: connection number (acceptance order).
        conn: the runner's connection id.
        host: announced host name.
        ranks: announced ranks.
        alive_ranks: the ranks not dead.
        deposited: whether its slot holds a frame for the current round.
        open: whether the connection is still open.

    No upstream counterpart: a status snapshot of this package's controller.
    """

    relay: int
    conn: int
    host: str
    ranks: tuple[int, ...]
    alive_ranks: tuple[int, ...]
    deposited: bool
    open: bool


# -- the relay core's actions -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AckRank:
    """Write ``ack`` (the 8-byte handshake ack) to the loopback connection whose handshake was
    just handed to the core. Sent before the rank is checked, as upstream does.

    Attributes:
        rank: the rank the handshake named.
        ack: the ack bytes.

    Upstream: ``relay/agent.rs`` (``RelayChannel``) terminating a rank's handshake with the 8-byte
    ack of ``controller/mod.rs`` ``write_handshake_ack``.
    """

    rank: int
    ack: bytes


@dataclass(frozen=True, slots=True)
class RankConnected:
    """The loopback connection whose handshake was just handed to the core is local rank
    ``rank`` (the runner files it under that rank).

    Attributes:
        rank: the local rank.

    Upstream: ``relay/agent.rs`` filing an accepted loopback connection under its rank id.
    """

    rank: int


class UpstreamKind(enum.Enum):
    """What a :class:`SendUpstream` carries.

    Upstream: ``relay/agent.rs`` (``RelayChannel``), where this is a socket write, close or log
    line; as a value it is this package's.
    """

    HELLO = "Hello"
    HOST_FRAME = "HostFrame"
    RANK_EXIT = "RankExit"


@dataclass(frozen=True, slots=True, eq=False)
class SendUpstream:
    """Write ``buffers`` (in order) to the controller connection. A Hello (with the channel magic
    before it) is written at once, before anything is read; the others go through the runner's
    bounded outbound queue in the order the core returned them (round order).

    Attributes:
        buffers: the record's buffers (a HostFrame's are the fold's pooled arrays: drop every
            reference once written so a later round may reuse them).
        kind: what the record is (:class:`UpstreamKind`).

    Upstream: ``relay/agent.rs`` (``RelayChannel``), where this is a socket write, close or log
    line; as a value it is this package's.
    """

    buffers: tuple[BytesLike, ...]
    kind: UpstreamKind


@dataclass(frozen=True, slots=True, eq=False)
class FanOut:
    """Write ``prefix`` then ``payload`` (a Broadcast's RoundFrame, verbatim) to each local rank
    in ``ranks``; a failed write is only logged (that rank's reader reports it).

    Attributes:
        prefix: the 4-byte loopback length prefix.
        payload: the Broadcast payload (a view of the record the runner read).
        ranks: the alive local ranks, ascending.

    Upstream: ``relay/agent.rs`` writing a Broadcast's payload verbatim to each local alive rank.
    """

    prefix: bytes
    payload: memoryview
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BroadcastRoute:
    """Where a Broadcast may go while its payload is still arriving (the answer of
    :meth:`~flodl_proto.fsm.relay_core.RelayCore.broadcast_route`, not an action): the runner
    may write ``prefix`` and all but the payload's last ``hold`` bytes to each rank of ``ranks``
    before the record's auth tag is checked; the rest only once the core has taken the whole
    record (its :class:`FanOut`). A record that fails its check, or ends early, leaves those
    ranks' streams cut inside a frame: the runner closes them (spec departure
    ``broadcast_cut_through``).

    Attributes:
        prefix: the 4-byte loopback length prefix of the payload.
        ranks: the alive local ranks, ascending.
        hold: payload bytes kept back until the record is checked (the inner frame's auth tag,
            8 bytes: no rank can complete the frame before then).

    Upstream: none (``relay/agent.rs`` forwards a Broadcast only once it has read it whole).
    """

    prefix: bytes
    ranks: tuple[int, ...]
    hold: int


@dataclass(frozen=True, slots=True)
class DrainUpstream:
    """The last local rank left: write every queued record, then close the controller
    connection's write side, then tell the core
    (:meth:`~flodl_proto.fsm.relay_core.RelayCore.drained`).

    Upstream: ``relay/agent.rs`` (``RelayChannel``), where this is a socket write, close or log
    line; as a value it is this package's.
    """


@dataclass(frozen=True, slots=True)
class CloseRank:
    """Close local rank ``rank``'s loopback connection (its rank deadline passed; it is already
    out of the fold, and no RankExit follows when its stream ends).

    Attributes:
        rank: the local rank.
        reason: why (for logs).

    No upstream counterpart: upstream has no rank deadline; the loopback close it leads to is that
    of ``relay/agent.rs``.
    """

    rank: int
    reason: str


RelayAction: TypeAlias = (AckRank | RankConnected | SendUpstream | FanOut | DrainUpstream
                          | CloseRank | Finished)

"""The loopback leg (rank <-> relay) as events: the counterpart of :class:`~.stream.MuxStream`.

One :class:`LoopbackStream` per direction of a rank's data connection to its host relay:

* ``"rank_to_relay"``: the 16-byte handshake (``magic | version | rank | world_size``, u32
  LE each), then the rank's deposits, each ``u32 LE length | RoundFrame`` (bytes after the
  frame's tag inside the blob are ignored, the spec's leniency ``loopback_trailing``);
* ``"relay_to_rank"``: the 8-byte ack (``magic | version``), then the relay's replies, each
  ``u32 LE length | RoundFrame`` that must fill its prefix exactly.

Usage (sans-IO)::

    stream = LoopbackStream("rank_to_relay", salt, world_size=4)
    for ev in stream.feed(chunk):   # HandshakeReceived / AckReceived, FrameReceived, StreamFailed
        ...
    events = stream.feed_eof()      # when the peer closed: StreamEnded or StreamFailed

Upstream: ``flodl/src/distributed/relay/mod.rs`` (the relay's loopback reader: the handshake
of ``controller/mod.rs`` ``read_handshake``, then ``relay/mux.rs`` ``read_len_framed``) and
``cpu_reduce.rs`` (the rank's reader: the ack check after ``send_handshake``, then
``read_framed_round``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from ..errors import ProtocolError, protocol_error
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_ACK_LEN,
    HANDSHAKE_LEN,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    LEN_PREFIX_LEN,
)
from ._common import END_OF_STREAM, BytesLike, as_view, check_ceiling, check_version
from .auth import check_salt
from .handshake import Handshake, _check_u32, decode_ack, decode_handshake
from .loopback import decode_framed_round_or_eos, decode_len_framed, whole_len_prefix
from .round_frame import RoundFrame, decode_round_frame_or_eos
from .stream import StreamEnded, StreamFailed

__all__ = [
    "AckReceived",
    "FrameReceived",
    "HandshakeReceived",
    "LoopbackEvent",
    "LoopbackStream",
]

Direction: TypeAlias = Literal["rank_to_relay", "relay_to_rank"]
_DIRECTIONS = ("rank_to_relay", "relay_to_rank")


@dataclass(frozen=True, slots=True)
class HandshakeReceived:
    """The rank's 16-byte handshake arrived and passed the relay's checks (magic, version, and
    the world size when the stream was given one).

    Attributes:
        handshake: the decoded handshake (its ``rank`` may be >= its ``world_size``: the reader
            accepts it, the relay checks its host rank set).
        nbytes: bytes consumed (16).

    Upstream: ``controller/mod.rs`` ``read_handshake``.
    """

    handshake: Handshake
    nbytes: int = HANDSHAKE_LEN


@dataclass(frozen=True, slots=True)
class AckReceived:
    """The relay's 8-byte handshake ack arrived and passed the rank's checks (magic, version).

    Attributes:
        version: the protocol version it carried (the stream's).
        nbytes: bytes consumed (8).

    Upstream: ``cpu_reduce.rs`` (the ack check after ``send_handshake``).
    """

    version: int
    nbytes: int = HANDSHAKE_ACK_LEN


@dataclass(frozen=True, slots=True, eq=False)
class FrameReceived:
    """One length-prefixed RoundFrame, authenticated.

    Attributes:
        frame: the decoded frame (its tensors are views of the stream's own copy of the blob's
            bytes, valid whatever the caller does with the chunks it fed).
        nbytes: bytes consumed (4 + the prefix's length).
        trailing: bytes after the frame's 8-byte tag inside the blob, ignored (``rank_to_relay``
            only, the spec's leniency ``loopback_trailing``; always 0 ``relay_to_rank``).

    Upstream: a deposit the relay reads with ``relay/mux.rs`` ``read_len_framed``, or a reply
    the rank reads with ``cpu_reduce.rs`` ``read_framed_round``.
    """

    frame: RoundFrame
    nbytes: int
    trailing: int = 0


LoopbackEvent: TypeAlias = (HandshakeReceived | AckReceived | FrameReceived | StreamEnded
                            | StreamFailed)


def _direction_hint(error: ProtocolError) -> str:
    """A hint when the stream starts with the other direction's handshake, else ""."""
    got = error.fields.get("got")
    if error.error_id == "handshake.bad_magic" and got == HANDSHAKE_MAGIC_CONTROLLER_ACK:
        return ("the stream starts with a handshake ack: it is the relay -> rank direction "
                "(direction='relay_to_rank')")
    if error.error_id == "ack.bad_magic" and got == HANDSHAKE_MAGIC_RANK:
        return ("the stream starts with a rank handshake: it is the rank -> relay direction "
                "(direction='rank_to_relay')")
    return ""


class LoopbackStream:
    """Incremental parser of one direction of a rank <-> relay data connection: its handshake
    (``rank_to_relay``) or ack (``relay_to_rank``), then length-prefixed RoundFrames, pushed as
    :data:`LoopbackEvent` values.

    Pure (no I/O). Bounded: the stream holds at most one item's bytes (the 16- or 8-byte
    handshake, or one blob of 4 + length bytes); a length prefix above the frame ceiling fails
    the stream as soon as its 4 bytes arrive, before any of its body. Each item is decoded from
    the stream's own copy of its bytes. After a :class:`StreamFailed` or :class:`StreamEnded`
    the stream is done and ignores further input (:meth:`feed` and :meth:`feed_eof` return
    ``[]``).

    The checks, each the reader's of its direction, in order:

    * ``rank_to_relay``: the handshake's magic, version, then world size (``world_size``
      given; ``handshake.*``); each prefix against the ceiling (``len.too_large``); the
      deposit's RoundFrame with its tag (``frame.*``); a body that ends inside the frame's
      8-byte header is ``fold.truncated`` naming the handshake's rank.
    * ``relay_to_rank``: the ack's magic, then version (``ack.*``); each prefix against the
      ceiling; the reply's RoundFrame with its tag, which must fill the prefix
      (``framed_round.body_ended``, ``framed_round.underrun``).

    Running out of input inside the handshake or ack (at byte 0 too) fails the stream
    (TruncatedInput, ``handshake.read_failed`` / ``ack.read_failed``); inside a 4-byte prefix
    it is a clean end (:class:`StreamEnded`); inside a body, the direction's truncation error
    (``len.body_read_failed`` for the relay's reader, the frame reader's or
    ``framed_round.body_ended`` for the rank's).

    Args:
        direction: ``"rank_to_relay"`` or ``"relay_to_rank"``.
        salt: the 16-byte session salt (tags are checked).
        version: data-channel protocol version (2 or 3) the handshake or ack must carry.
        world_size: the world size the relay serves (a u32), checked against the handshake's;
            None: not checked (a capture tool that does not know it). Ignored
            ``relay_to_rank``.
        ceiling: frame ceiling in bytes (bounds each length prefix and the frame's tensors).

    Raises:
        InvalidValue (local): ``handshake.bad_field`` for a ``direction`` that is neither
            direction or a ``world_size`` that is neither None nor a u32; a bad salt
            (``salt.*``) or ceiling (``ceiling.invalid``). VersionMismatch (local):
            unsupported version.

    Upstream: ``relay/mod.rs`` (``read_handshake`` then ``read_len_framed`` per deposit) and
    ``cpu_reduce.rs`` (the ack check, then ``read_framed_round`` per reply).
    """

    __slots__ = ("_buf", "_ceiling", "_direction", "_done", "_head", "_rank", "_salt",
                 "_version", "_world_size", "bytes_in")

    def __init__(self, direction: Direction, salt: BytesLike, *, version: int = DEFAULT_VERSION,
                 world_size: int | None = None, ceiling: int = DEFAULT_FRAME_CEILING) -> None:
        if direction not in _DIRECTIONS:
            raise protocol_error("handshake.bad_field", field="direction", value=direction,
                                 reason="not 'rank_to_relay' (the 16-byte handshake first) "
                                        "or 'relay_to_rank' (the 8-byte ack first)")
        self._direction = direction
        self._salt = check_salt(salt)
        self._version = check_version(version)
        self._world_size = None if world_size is None else _check_u32("world_size", world_size)
        self._ceiling = check_ceiling(ceiling)
        #: bytes of the handshake or ack still to come first (0 once it is in)
        self._head = HANDSHAKE_LEN if direction == "rank_to_relay" else HANDSHAKE_ACK_LEN
        self._rank: int | None = None
        self._buf = bytearray()
        self._done = False
        #: total bytes fed (for statistics)
        self.bytes_in = 0

    @property
    def direction(self) -> Direction:
        """``"rank_to_relay"`` or ``"relay_to_rank"``, as given."""
        return self._direction

    @property
    def done(self) -> bool:
        """True once the stream ended or failed."""
        return self._done

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete handshake, ack or blob (at most one item's)."""
        return len(self._buf)

    def feed(self, data: BytesLike) -> list[LoopbackEvent]:
        """Parse ``data`` (the next bytes of the connection); return the events it completes.

        Returns:
            The events, in stream order; a :class:`StreamFailed` (the last event) for the
            first remote error, after which the stream is done; ``[]`` once it is done.

        Raises:
            InvalidValue (local) ``codec.not_bytes_like``: ``data`` is not a contiguous buffer
                (raised before anything is taken; the stream stays as it was).
        """
        if self._done:
            return []
        mv = as_view(data)
        self.bytes_in += mv.nbytes
        events: list[LoopbackEvent] = []
        pos, end = 0, mv.nbytes
        try:
            while not self._done:
                need = self._need()  # a prefix above the ceiling fails here, before its body
                if len(self._buf) == need:
                    item, self._buf = self._buf, bytearray()  # the item keeps its own bytes
                    events.append(self._decode(memoryview(item)))
                    continue
                if pos == end:
                    break
                take = min(need - len(self._buf), end - pos)
                self._buf += mv[pos:pos + take]
                pos += take
        except ProtocolError as e:
            self._fail(e, events)
        return events

    def feed_eof(self) -> list[LoopbackEvent]:
        """The peer closed: return :class:`StreamEnded` (clean) or :class:`StreamFailed`.

        Returns:
            ``[]`` when the stream is already done; ``[StreamEnded()]`` when the input ended
            at a blob boundary or inside a 4-byte prefix, after the handshake or ack; else
            ``[StreamFailed(error)]`` with the reader's remote error for what was cut short
            (the handshake or ack, none of it included, or a blob's body).
        """
        if self._done:
            return []
        self._done = True
        buf = bytes(self._buf)
        self._buf = bytearray()
        try:
            if self._head:
                if self._direction == "rank_to_relay":
                    decode_handshake(buf, self._world_size, self._version)
                else:
                    decode_ack(buf, self._version)
            elif len(buf) < LEN_PREFIX_LEN:
                return [StreamEnded()]
            elif self._direction == "rank_to_relay":
                decode_len_framed(buf, ceiling=self._ceiling)
            else:
                decode_framed_round_or_eos(buf, self._salt, ceiling=self._ceiling)
        except ProtocolError as e:
            return [StreamFailed(e, _direction_hint(e))]
        raise AssertionError("a buffered partial item decoded")  # pragma: no cover

    # -- internals -------------------------------------------------------------------------------
    def _fail(self, error: ProtocolError, events: list[LoopbackEvent]) -> None:
        self._done = True
        self._buf = bytearray()
        events.append(StreamFailed(error, _direction_hint(error)))

    def _need(self) -> int:
        """Bytes the item at the buffer's start needs: the handshake's or ack's, a prefix's 4
        while fewer are held, then 4 + its length (checked against the ceiling at once)."""
        if self._head:
            return self._head
        if len(self._buf) < LEN_PREFIX_LEN:
            return LEN_PREFIX_LEN
        return LEN_PREFIX_LEN + whole_len_prefix(memoryview(self._buf), self._ceiling)

    def _decode(self, item: memoryview) -> LoopbackEvent:
        if self._head:
            self._head = 0
            if self._direction == "rank_to_relay":
                hs, _ = decode_handshake(item, self._world_size, self._version)
                self._rank = hs.rank
                return HandshakeReceived(hs)
            decode_ack(item, self._version)
            return AckReceived(self._version)
        if self._direction == "relay_to_rank":
            res = decode_framed_round_or_eos(item, self._salt, ceiling=self._ceiling)
            if res is END_OF_STREAM:  # pragma: no cover - a whole blob holds its prefix
                raise AssertionError("a whole blob read as end of stream")
            return FrameReceived(res[0], res[1])
        body = item[LEN_PREFIX_LEN:]
        got = decode_round_frame_or_eos(body, self._salt, ceiling=self._ceiling)
        if got is END_OF_STREAM:
            raise protocol_error("fold.truncated", rank=self._rank)
        frame, used = got
        return FrameReceived(frame, item.nbytes, body.nbytes - used)

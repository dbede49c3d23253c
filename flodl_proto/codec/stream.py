"""Incremental, bounded decoding of a byte stream: feed bytes, get records.

One decoder per leg:

* :class:`RoundFrameDecoder` — back-to-back RoundFrames;
* :class:`LenFramedDecoder` — loopback length-prefixed blobs;
* :class:`MuxStream` — relay <-> controller: the channel magic (when expected), then mux records
  (a HostFrame's inner RoundFrame decoded too), pushed as :data:`StreamEvent` values. It is the
  one mux parser: the controller runs it on each relay connection (zero copy for records that
  arrive whole), the decode CLI without tag checks, tests and tools with ``copy=True``.

Usage of the pull decoders (sans-IO)::

    dec = RoundFrameDecoder(salt)
    dec.feed(chunk)            # any number of times
    dec.feed_eof()             # when the peer closed
    ev = dec.next_event()      # a record, NeedData(n), or END_OF_STREAM

and of the mux stream::

    stream = MuxStream(salt, version=2, expect_magic=None)
    for ev in stream.feed(chunk):   # MagicReceived, RecordReceived, StreamEnded, StreamFailed
        ...
    events = stream.feed_eof()      # when the peer closed: StreamEnded or StreamFailed

Memory is bounded: each record's length is checked against the frame ceiling (and every other
pre-tag check of the leg is applied) as soon as its header is buffered, before its body is waited
for; the buffer then grows only as bytes actually arrive. A pull decoder decodes a complete
record from its own ``bytes`` copy, so records stay valid while the decoder keeps buffering.
(The socket runners do not use the pull decoders for tensor traffic: they read a record's
header, then ``recv_into`` one buffer of exactly the record's length.)

After an error a pull decoder is stuck: every further :meth:`next_event` re-raises it; a
:class:`MuxStream` reports one :class:`StreamFailed` and ignores further input. Running out of
input inside the clean-end-of-stream prefix of a leg (RoundFrame header, mux header, length
prefix; including at byte 0) gives :data:`END_OF_STREAM` (:class:`StreamEnded`); anywhere else,
the leg's truncation error.

Upstream: the streamed readers of ``flodl/src/distributed/controller/round_frame.rs`` and
``relay/mux.rs`` (``read_record``, ``read_len_framed``, committed reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeAlias, TypeVar

from .._slots import slot_builder
from ..errors import ProtocolError, protocol_error, shown_type
from ..spec import (
    AUTH_TAG_LEN,
    CHANNEL_MAGIC_DATA,
    CHANNEL_MAGIC_LEN,
    CHANNELS,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    LEN_PREFIX_LEN,
    MUX_HEADER_LEN,
    MUX_RECORD_MAGIC,
    REC_CONTROL,
    ROUND_FRAME_HEADER_LEN,
    U32_MAX,
)
from ._common import (
    END_OF_STREAM,
    BytesLike,
    EndOfStream,
    NeedData,
    as_view,
    check_ceiling,
    check_version,
    wire_int,
)
from .auth import Premac, check_salt
from .handshake import expect_channel_magic
from .loopback import (
    decode_len_framed,
    decode_len_prefix,
)
from .mux import (
    Hello,
    MuxHeader,
    MuxRecord,
    RecordKind,
    control_too_long,
    decode_mux_record,
    parse_mux_header_or_eos,
    read_headed_record,
    read_mux_record_or_eos,
)
from .round_frame import (
    RoundFrame,
    _FrameWalk,
    decode_round_frame,
    decode_round_frame_or_eos,
    parse_round_frame_or_eos,
)

__all__ = [
    "LenFramedDecoder",
    "MagicReceived",
    "MuxStream",
    "RecordReceived",
    "RoundFrameDecoder",
    "StreamEnded",
    "StreamEvent",
    "StreamFailed",
]

T = TypeVar("T")
_WHAT = "cluster_controller"


class _StreamDecoder(Generic[T]):
    """Buffering, end-of-stream and sticky-error logic shared by the leg decoders."""

    #: bytes at the start of a record inside which end of input is a clean end of stream
    _clean_prefix: int = 0

    def __init__(self, ceiling: int) -> None:
        self._buf = bytearray()
        self._eof = False
        self._error: ProtocolError | None = None
        self.ceiling = check_ceiling(ceiling)
        #: bytes taken off the stream so far: complete records handed out, plus a record that
        #: was framed completely but then rejected (tag, kind or payload) and the channel magic
        self.consumed = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as part of a record."""
        return len(self._buf)

    def feed(self, data: BytesLike) -> None:
        """Append received bytes.

        Raises:
            SequenceError (local): bytes fed after :meth:`feed_eof`.
            InvalidValue (local) ``codec.not_bytes_like``: ``data`` is not a contiguous buffer.
        """
        if self._eof:
            raise protocol_error("stream.fed_after_eof", nbytes=as_view(data).nbytes)
        if self._error is not None:
            return  # the stream is dead; the error is re-raised by next_event
        try:
            self._buf += as_view(data)
        except BufferError:  # a caller still holds a view of the old buffer: move on from it
            self._buf = self._buf + as_view(data)

    def feed_eof(self) -> None:
        """Signal that the peer closed the stream (no more bytes will be fed)."""
        self._eof = True

    def next_event(self) -> T | NeedData | EndOfStream:
        """Return the next complete record, ``NeedData(n)``, or :data:`END_OF_STREAM`.

        Raises:
            RemoteProtocolError: the leg's reader error (sticky: raised again on every call).
        """
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except ProtocolError as e:
            self._error = e
            raise

    def _need(self) -> int | NeedData:
        """Full length of the record at the buffer start, or NeedData."""
        raise NotImplementedError

    def _decode(self, record: bytes) -> T:
        raise NotImplementedError

    def _truncated(self, data: bytes) -> ProtocolError:
        """The leg's error for input that ended mid-record (after the clean prefix)."""
        raise NotImplementedError

    def _next(self) -> T | NeedData | EndOfStream:
        if len(self._buf) < self._clean_prefix:
            if self._eof:
                return END_OF_STREAM
            return NeedData(self._clean_prefix - len(self._buf))
        need = self._need()
        if isinstance(need, NeedData):
            if self._eof:
                raise self._truncated(bytes(self._buf))
            return need
        record = bytes(self._buf[:need])
        try:
            del self._buf[:need]
        except BufferError:  # a caller still holds a view of the old buffer: move on from it
            self._buf = self._buf[need:]
        self.consumed += need
        self._record_done()
        return self._decode(record)

    def _record_done(self) -> None:
        """Reset per-record parsing state (after a record left the buffer)."""


class RoundFrameDecoder(_StreamDecoder[RoundFrame]):
    """Back-to-back RoundFrames (e.g. a capture of one direction of a legacy stream).

    Errors are the one-shot reader's (:func:`~flodl_proto.codec.round_frame.decode_round_frame`
    of the frame's bytes), word for word whatever the split, so the offsets they name count
    from the first byte of the frame they are in, as the errors :class:`MuxStream` and
    :class:`~flodl_proto.codec.loopback_stream.LoopbackStream` report count from their
    record's: the third frame of a stream, cut inside its weight, is ``frame weight read
    failed ... (offset 9)``. The frame starts at the stream offset :attr:`consumed` held
    before the :meth:`next_event` call that raised (after it, ``consumed`` also counts a frame
    that was framed completely and then rejected).

    Args:
        salt: the 16-byte session salt.
        ceiling: frame ceiling in bytes.

    Raises:
        InvalidValue (local): the salt is not 16 bytes (``salt.*``), or ``ceiling`` is not a
            non-negative integer (``ceiling.invalid``).

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """

    _clean_prefix = ROUND_FRAME_HEADER_LEN

    def __init__(self, salt: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> None:
        super().__init__(ceiling)
        self._salt = check_salt(salt)
        self._walk = _FrameWalk(ceiling)
        self._want = 0

    def _need(self) -> int | NeedData:
        # resume the structure walk only once the bytes it waits for have arrived
        if len(self._buf) < self._want:
            return NeedData(self._want - len(self._buf))
        with memoryview(self._buf) as mv:
            want = self._walk.advance(mv, partial=True)
        if want is not None:
            self._want = want
            return NeedData(want - len(self._buf))
        return self._walk.pos + AUTH_TAG_LEN

    def _record_done(self) -> None:
        self._walk = _FrameWalk(self.ceiling)
        self._want = 0

    def _decode(self, record: bytes) -> RoundFrame:
        res = decode_round_frame(record, self._salt, ceiling=self.ceiling)
        return res[0]

    def _truncated(self, data: bytes) -> ProtocolError:
        try:
            decode_round_frame(data, self._salt, ceiling=self.ceiling)
        except ProtocolError as e:
            return e
        raise AssertionError("a truncated frame decoded")  # pragma: no cover


class LenFramedDecoder(_StreamDecoder[memoryview]):
    """Loopback length-prefixed blobs; each event is the blob (a view of its own bytes).

    Args:
        ceiling: frame ceiling in bytes (checked on each prefix before the body is awaited).

    Raises:
        InvalidValue (local) ``ceiling.invalid``: ``ceiling`` is not a non-negative integer.

    Upstream: ``relay/mux.rs`` ``read_len_framed``.
    """

    _clean_prefix = LEN_PREFIX_LEN

    def __init__(self, *, ceiling: int = DEFAULT_FRAME_CEILING) -> None:
        super().__init__(ceiling)

    def _need(self) -> int | NeedData:
        length = decode_len_prefix(self._buf, ceiling=self.ceiling)
        total = LEN_PREFIX_LEN + length
        return total if len(self._buf) >= total else NeedData(total - len(self._buf))

    def _decode(self, record: bytes) -> memoryview:
        return memoryview(record)[LEN_PREFIX_LEN:]

    def _truncated(self, data: bytes) -> ProtocolError:
        try:
            decode_len_framed(data, ceiling=self.ceiling)
        except ProtocolError as e:
            return e
        raise AssertionError("a truncated blob decoded")  # pragma: no cover


# -- the mux stream as events (the controller's parser, and the tools') ----------------------------
@dataclass(frozen=True, slots=True)
class MagicReceived:
    """The 4-byte data-channel magic arrived and matched.

    Attributes:
        nbytes: bytes consumed (4).

    Upstream: ``wire.rs`` ``expect_channel_magic``.
    """

    nbytes: int = CHANNEL_MAGIC_LEN


@dataclass(frozen=True, slots=True, eq=False)
class RecordReceived:
    """One mux record (authenticated, unless the stream checks no tags).

    Attributes:
        record: the record (its payload is a view of the bytes that were fed, or of the stream's
            own copy of them with ``copy=True`` or when the record arrived split).
        frame: for a HostFrame, the decoded inner RoundFrame, or :data:`END_OF_STREAM` when the
            payload ends inside the frame header, or the :class:`ProtocolError` the frame reader
            raised (the core decides whether it matters); None for other kinds.
        nbytes: bytes consumed (25 + payload length).
        header: the record's parsed 25-byte header (its ``rank`` is the wire's rank field and
            its ``auth_tag`` the carried tag, for tools that show them).

    Upstream: a record returned by ``relay/mux.rs`` ``read_record``.
    """

    record: MuxRecord
    frame: RoundFrame | EndOfStream | ProtocolError | None
    nbytes: int
    header: MuxHeader


#: ``_received(record, frame, nbytes, header)``: ``RecordReceived(...)`` built without the
#: frozen dataclass's per-field ``object.__setattr__`` (one per record)
_received: Callable[..., RecordReceived] = slot_builder(RecordReceived)


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The peer closed the connection at a record boundary or inside a 25-byte record header
    (a clean end of stream).

    Upstream: the clean end (``None``) of ``relay/mux.rs`` ``read_record``.
    """


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """The stream is unusable: a reader error (bad magic, MAC, truncation, ceiling...) or a read
    failure reported by the runner.

    Attributes:
        error: the error.
        hint: a likely cause in words, when one is known (e.g. the relay's first record is a
            Hello of the other protocol version: "the protocol versions differ"; the stream is
            the other direction's, with or without its channel magic: "the stream starts with
            a mux record, not a channel magic ..."), else "".

    Upstream: an error of ``relay/mux.rs`` ``read_record`` or of the socket under it.
    """

    error: ProtocolError
    hint: str = ""


StreamEvent: TypeAlias = MagicReceived | RecordReceived | StreamEnded | StreamFailed


def other_version_hello(record: BytesLike, salt: BytesLike, version: int) -> str:
    """A hint when ``record`` (a whole mux record) is a ``Control(Hello)`` of the other
    protocol version: a version-2 Hello read at version 3 fails to decode (its ``model_sigs``
    are missing); a version-3 Hello read at version 2 decodes but leaves its ``model_sigs``
    unread. Returns "" when the record is no such Hello.

    Upstream: ``relay/mux.rs`` (``Hello`` gained ``model_sigs`` without a mux version bump).
    """
    other = 2 if version == 3 else 3
    try:
        rec, _ = decode_mux_record(record, salt, version=other)
        if not isinstance(rec.control, Hello):
            return ""
    except ProtocolError:
        return ""
    return (f"the relay sent a protocol-version-{other} Hello to this version-{version} "
            "controller: the protocol versions differ (set the same --protocol-version on both "
            "sides)")


def _direction_hint(error: ProtocolError, first: bool) -> str:
    """A hint when the stream's first bytes are the other direction's: a mux record where the
    channel magic was expected, or a channel magic where the first record was (the relay ->
    controller direction starts with the magic, the controller -> relay one does not); else "".
    """
    got = error.fields.get("got")
    if error.error_id == "channel.bad_magic" and got == MUX_RECORD_MAGIC:
        return ("the stream starts with a mux record, not a channel magic (the controller -> "
                "relay direction carries none)")
    names = [n for n, m in CHANNELS.items() if m == got]
    if error.error_id == "mux.bad_magic" and first and names:
        return (f"the stream starts with the {names[0]} channel magic, not a mux record (the "
                "relay -> controller direction starts with it)")
    return ""


def _optional_count(field: str, value: int | None) -> int | None:
    """``value`` (None, or an integer >= 0 by the codec's integer rule), or the local error
    naming ``field``: checked when a stream is built, not when its first bytes meet it."""
    if value is None:
        return None
    n = wire_int(value)
    if n is None or n < 0:
        raise protocol_error("mux.bad_field", field=field, value=value,
                             reason="not None or a number of bytes >= 0")
    return n


def _expected_magic(value: int | str | None) -> int | None:
    """``MuxStream``'s ``expect_magic``: None, a channel name of the spec's ``Channel`` enum (its
    magic), or a u32 by the codec's integer rule; else the local error naming it."""
    magic = CHANNELS.get(value) if isinstance(value, str) else None
    if magic is not None:
        return magic
    n = None if isinstance(value, str) or value is None else wire_int(value)
    if value is None or (n is not None and 0 <= n <= U32_MAX):
        return n
    raise protocol_error("mux.bad_field", field="expect_magic", value=value,
                         reason=f"not None, a channel name ({', '.join(sorted(CHANNELS))}) "
                                "or a u32")


def _check_hints(premac: object, frame_premac: object, header: object) -> MuxHeader | None:
    """Refuse :meth:`MuxStream.feed`'s optional ``premac``, ``frame_premac`` and ``header``
    when one is of another type than its own or None (``mux.bad_type``, local), and a
    ``header`` whose ``payload_len`` is no u32 by the codec's integer rule (:func:`wire_int`:
    a bool, a float, text or an array of one or more dimensions is none; ``mux.bad_field``,
    local: no header the readers parse holds one, and the stream would cut the chunk at its
    length). Return ``header``, one whose ``payload_len`` is a NumPy integer with it as an
    ``int``."""
    for name, value in (("premac", premac), ("frame_premac", frame_premac)):
        if value is not None and not isinstance(value, Premac):
            raise protocol_error("mux.bad_type", field=name,
                                 expected="a Premac (a MAC over the bytes being decoded) or None",
                                 got=shown_type(value))
    if header is not None:
        if not isinstance(header, MuxHeader):
            raise protocol_error("mux.bad_type", field="header",
                                 expected="a MuxHeader (parse_mux_header's result) or None",
                                 got=shown_type(header))
        length = header.payload_len
        if length.__class__ is int and 0 <= length <= U32_MAX:
            return header
        n = wire_int(length)
        if n is None or not 0 <= n <= U32_MAX:
            raise protocol_error("mux.bad_field", field="header.payload_len", value=length,
                                 reason="not a u32 (parse_mux_header's result holds the "
                                        "record's length)")
        return replace(header, payload_len=n)
    return None


class MuxStream:
    """Incremental parser of one relay <-> controller stream: the channel magic (when expected),
    then mux records, pushed as :data:`StreamEvent` values.

    Pure (no I/O), so a runner may run it on the connection's reader thread (MACs are verified
    there, in parallel) and hand the events to the core. Bytes that complete records in the chunk
    they arrive in are decoded in place (zero copy: records and frames are views of the chunk, so
    the caller must not modify a chunk while records decoded from it are alive; ``copy=True``
    lifts that); a record split across chunks is buffered, the buffer growing only as bytes
    arrive, and its header is checked (magic, version, ``payload_len`` against the frame ceiling)
    as soon as it is complete. After a :class:`StreamFailed` or :class:`StreamEnded` the stream
    is done and ignores further input.

    Args:
        salt: 16-byte session salt; ``None``: tags are not checked (every other check is, in
            the same order), for tools that report tags rather than enforce them (the decode
            CLI); a HostFrame's inner frame is then parsed without its tag too.
        version: data-channel protocol version (the ``Hello`` shape).
        ceiling: frame ceiling in bytes.
        expect_magic: the channel magic the stream starts with (the relay -> controller
            direction): a u32, or a channel name of the spec's ``Channel`` enum (``"data"``,
            ``"control"``, ``"rendezvous"``, ``"join"``), as :func:`expect_channel_magic`
            takes it; ``None``: no magic (the controller -> relay direction).
        hello_limit: the largest payload, in bytes, the first record (which may only be a
            ``Hello``) may claim, checked from its header (``LimitExceeded``,
            ``controller.hello_too_long``); ``None``: only the frame ceiling. The controller
            passes :func:`~flodl_proto.codec.mux.max_hello_payload` of its world size (spec
            departure ``hello_bound``).
        control_limit: the largest payload, in bytes, a Control record after the first may
            claim, checked from its header (``LimitExceeded``, ``controller.control_too_long``:
            :func:`~flodl_proto.codec.mux.control_too_long`, the relay's rule too);
            ``None``: only the frame ceiling. The controller passes
            :func:`~flodl_proto.codec.mux.max_control_payload` of its world size (spec departure
            ``control_bound``: no legal control message is longer than the largest Hello, and a
            longer one would be decoded whole, a rank list of up to one entry per byte).
        copy: decode every record from the stream's own copy of its bytes, so records stay
            valid whatever the caller does with the chunks it fed (one copy per record; the
            default decodes records that arrive whole in place).

    Raises:
        InvalidValue (local): bad salt or ceiling, an ``expect_magic`` that is neither None, a
            channel name (names are lower case) nor a u32 (``mux.bad_field`` naming it), or a
            ``hello_limit`` or ``control_limit`` that is neither None nor an integer >= 0;
            VersionMismatch (local):
            unsupported version.

    Upstream: ``wire.rs`` ``expect_channel_magic`` then ``relay/mux.rs`` ``read_record`` /
    ``try_read_from`` (committed reads; EOF inside a header is a clean end of stream).
    """

    __slots__ = ("_buf", "_ceiling", "_control_limit", "_copy", "_done", "_first",
                 "_hello_limit", "_hint", "_magic", "_salt", "_version",
                 "bytes_in")

    def __init__(self, salt: BytesLike | None, *, version: int = DEFAULT_VERSION,
                 ceiling: int = DEFAULT_FRAME_CEILING,
                 expect_magic: int | str | None = CHANNEL_MAGIC_DATA,
                 hello_limit: int | None = None, control_limit: int | None = None,
                 copy: bool = False) -> None:
        self._salt = check_salt(salt) if salt is not None else None
        self._version = check_version(version)
        self._ceiling = check_ceiling(ceiling)
        self._magic = _expected_magic(expect_magic)
        # the Hello bound of the largest world (2**32 - 1 ranks) is above u32: no upper bound
        self._hello_limit = _optional_count("hello_limit", hello_limit)
        control = _optional_count("control_limit", control_limit)
        #: the largest Control payload after the first record (the ceiling when not given)
        self._control_limit = self._ceiling if control is None else min(control, self._ceiling)
        self._copy = copy
        self._first = True  # the next record is the first (a Hello on the data channel)
        self._hint = ""
        self._buf = bytearray()
        self._done = False
        #: total bytes fed (for statistics)
        self.bytes_in = 0

    @property
    def done(self) -> bool:
        """True once the stream ended or failed."""
        return self._done

    @property
    def payload_limit(self) -> int:
        """The largest payload, in bytes, the next record may claim: the Hello bound before the
        first record, the frame ceiling after it. A reader that sees a larger ``payload_len``
        in a header feeds the header alone; the stream then fails with the limit's error."""
        return self._ceiling if self._hello_limit is None else min(self._ceiling,
                                                                   self._hello_limit)

    def limit_for(self, kind: int) -> int:
        """The largest payload, in bytes, the next record may claim when its header's kind
        byte is ``kind``: :attr:`payload_limit`, or for a Control record after the first the
        stream's ``control_limit`` (at most the ceiling). A reader that sees a larger
        ``payload_len`` feeds the header alone; the stream then fails with the limit's error.
        Raises nothing."""
        if kind == REC_CONTROL and not self._first:
            return self._control_limit
        return self.payload_limit

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete magic or record."""
        return len(self._buf)

    def feed(self, data: BytesLike, *, premac: Premac | None = None,
             frame_premac: Premac | None = None,
             header: MuxHeader | None = None) -> list[StreamEvent]:
        """Parse ``data`` (the next bytes of the connection); return the events it completes.

        Args:
            data: the next bytes.
            premac: when ``data`` is exactly one whole record (and nothing is buffered), the
                record MAC the runner computed as its bytes arrived (see
                :class:`~flodl_proto.codec.auth.Premac`); otherwise ignored.
            frame_premac: likewise, the MAC of the HostFrame's inner RoundFrame (over the
                payload's bytes before its last 8), used when the frame fills the payload.
            header: likewise, the header
                :func:`~flodl_proto.codec.mux.parse_mux_header` returned for the record's
                first 25 bytes (the runner's read of the header before the payload), so the
                stream does not parse it again; ignored when its payload is above
                :attr:`payload_limit` (the stream then reports the limit from the bytes).

        Raises:
            InvalidValue (local) ``codec.not_bytes_like``: ``data`` is not a contiguous buffer;
            ``mux.bad_type``: a ``premac`` or ``frame_premac`` that is neither a
            :class:`~flodl_proto.codec.auth.Premac` nor None, or a ``header`` that is neither a
            :class:`~flodl_proto.codec.mux.MuxHeader` nor None, named with its type (as the
            record readers refuse such an argument); ``mux.bad_field``: a ``header`` whose
            ``payload_len`` is no u32 by the codec's integer rule (a NumPy integer is taken as
            its value; a bool or a float is none; a negative one would cut a record shorter
            than its own 25-byte header). Each is the caller's mistake, not the peer's: it is raised
            before ``data`` is taken, and the stream stays as it was (the same bytes may be
            fed again).
            AssertionError: only if the stream's own invariant broke, never for any input or
                call order: a record is handed to its reader only once all of it is there (at
                least its 25-byte header, a length checked above), so the reader never finds
                the clean end of stream of a header cut short. An internal error (a bug of
                this class), neither the peer's (``RemoteProtocolError``: the stream reports
                those as :class:`StreamFailed`) nor the caller's (``LocalProtocolError``).
        """
        if self._done:
            return []
        mv = as_view(data)
        if premac is not None or frame_premac is not None or header is not None:
            header = _check_hints(premac, frame_premac, header)
        self.bytes_in += mv.nbytes
        events: list[StreamEvent] = []
        try:
            if self._buf:
                self._buf += mv
                self._drain_buffer(events)
            elif (header is not None and self._magic is None and not self._copy
                  and mv.nbytes == MUX_HEADER_LEN + header.payload_len
                  and (header.payload_len <= self._ceiling if self._hello_limit is None
                       else header.payload_len <= self.payload_limit)
                  # limit_for and control_too_long's rule, inlined (no call per record)
                  and (header.kind != REC_CONTROL or self._first
                       or header.payload_len <= self._control_limit)):
                # exactly the one whole record the runner read (its header in hand): decoded
                # as _parse_in_place would decode it, without walking the chunk
                self._decode_one(mv, events, premac, frame_premac, header)
            else:
                pos = self._parse_in_place(mv, events, premac, frame_premac, header)
                if pos < mv.nbytes:  # an item the chunk does not complete: kept for the next
                    self._buf += mv[pos:]
        except ProtocolError as e:
            self._fail(e, events)
        return events

    def feed_eof(self) -> list[StreamEvent]:
        """The peer closed: return :class:`StreamEnded` (clean) or :class:`StreamFailed`.

        Returns:
            ``[]`` when the stream is already done; ``[StreamEnded()]`` when the input ended at
            a record boundary or inside a record's 25-byte header (a clean end, as upstream's
            reader takes it); else ``[StreamFailed(error)]`` with the reader's remote error for
            what was cut short: the channel magic (none of it included) or a record past its
            header (TruncatedInput).

        Raises:
            AssertionError: only if the stream's own invariant broke, never for any input or
                call order: :meth:`feed` decodes every record as soon as its last byte arrives,
                so what is held at the end is always less than one record, whose reader then
                fails. An internal error (a bug of this class), neither the peer's
                (``RemoteProtocolError``) nor the caller's (``LocalProtocolError``).
        """
        if self._done:
            return []
        self._done = True
        buf = bytes(self._buf)
        self._buf = bytearray()
        try:
            if self._magic is not None:
                expect_channel_magic(buf, self._magic, _WHAT)  # raises: fewer than 4 bytes
            if len(buf) < MUX_HEADER_LEN:
                return [StreamEnded()]
            read_mux_record_or_eos(buf, self._salt, version=self._version, ceiling=self._ceiling)
        except ProtocolError as e:
            return [StreamFailed(e)]
        raise AssertionError("a buffered partial record decoded")  # pragma: no cover

    def fail(self, error: ProtocolError) -> list[StreamEvent]:
        """A read failure reported by the runner (e.g. a starved committed read)."""
        if self._done:
            return []
        self._done = True
        self._buf = bytearray()
        return [StreamFailed(error)]

    # -- internals -------------------------------------------------------------------------------
    def _fail(self, error: ProtocolError, events: list[StreamEvent]) -> None:
        self._done = True
        self._buf = bytearray()
        events.append(StreamFailed(error, self._hint or _direction_hint(error, self._first)))

    def _next_length(self, mv: memoryview) -> int | None:
        """Bytes the next item needs from the start of ``mv``, or None while that is unknown."""
        if self._magic is not None:
            return CHANNEL_MAGIC_LEN
        hdr = parse_mux_header_or_eos(mv, ceiling=self._ceiling)
        if hdr is END_OF_STREAM:
            return None
        return self._record_length(hdr)

    def _record_length(self, hdr: MuxHeader) -> int:
        """The bytes of the record ``hdr`` heads, checking the first record's Hello bound and
        a later Control record's bound."""
        limit = self._hello_limit
        if limit is not None and hdr.payload_len > limit:
            raise protocol_error("controller.hello_too_long", length=hdr.payload_len,
                                 limit=limit, kind=hdr.kind)
        if not self._first and hdr.kind == REC_CONTROL:
            too_long = control_too_long(hdr.kind, hdr.payload_len, self._control_limit)
            if too_long is not None:
                raise too_long
        return MUX_HEADER_LEN + hdr.payload_len

    def _decode_one(self, mv: memoryview, events: list[StreamEvent],
                    premac: Premac | None = None, frame_premac: Premac | None = None,
                    header: MuxHeader | None = None) -> None:
        if self._magic is not None:
            expect_channel_magic(mv, self._magic, _WHAT)
            self._magic = None
            events.append(MagicReceived())
            return
        res: tuple[MuxRecord, MuxHeader, int] | EndOfStream
        try:
            if type(header) is MuxHeader:  # read_mux_record_or_eos's arguments are checked
                res = read_headed_record(mv, self._salt, self._version, premac, header)
            else:
                res = read_mux_record_or_eos(mv, self._salt, version=self._version,
                                             ceiling=self._ceiling, premac=premac,
                                             header=header)
        except ProtocolError:
            if self._first and self._salt is not None:
                self._hint = other_version_hello(mv, self._salt, self._version)
            raise
        if res is END_OF_STREAM:  # pragma: no cover - the caller passes one whole record
            raise AssertionError("a whole record read as end of stream")
        record, header, n = res
        self._first = False
        self._hello_limit = None  # only the first record is bounded by the Hello size
        frame: RoundFrame | EndOfStream | ProtocolError | None = None
        if record.kind is RecordKind.HOST_FRAME:
            try:
                if self._salt is None:
                    parsed = parse_round_frame_or_eos(record.payload, ceiling=self._ceiling)
                    frame = parsed if parsed is END_OF_STREAM else parsed[0]
                else:
                    decoded = decode_round_frame_or_eos(record.payload, self._salt,
                                                        ceiling=self._ceiling,
                                                        premac=frame_premac)
                    frame = decoded if decoded is END_OF_STREAM else decoded[0]
            except ProtocolError as e:
                frame = e
        events.append(_received(record, frame, n, header))

    def _parse_in_place(self, mv: memoryview, events: list[StreamEvent],
                        premac: Premac | None = None,
                        frame_premac: Premac | None = None,
                        header: MuxHeader | None = None) -> int:
        pos = 0
        end = mv.nbytes
        if header is not None and (self._magic is not None
                                   or header.payload_len > self.payload_limit):
            header = None  # not a record the runner may vouch for: parsed from the bytes
        while not self._done and pos < end:
            if pos == 0 and header is not None:
                need: int | None = self._record_length(header)
            else:
                need = self._next_length(mv[pos:])
            if need is None or end - pos < need:
                break
            item = mv[pos:pos + need]
            if self._copy:
                item = memoryview(bytes(item))
            if pos == 0 and need == end and self._magic is None:  # the one whole record
                self._decode_one(item, events, premac, frame_premac, header)
            else:
                self._decode_one(item, events)
            pos += need
        return pos

    def _drain_buffer(self, events: list[StreamEvent]) -> None:
        while not self._done:
            need = self._next_length(memoryview(self._buf))
            if need is None or len(self._buf) < need:
                return
            item = bytes(self._buf[:need])  # its own copy: views into it outlive the buffer
            del self._buf[:need]
            self._decode_one(memoryview(item), events)


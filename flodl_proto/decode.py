"""Decode a captured data-channel byte stream into records, for operators reading what crossed
the wire (``flodl-proto decode``).

Three legs, told apart from the first bytes by :func:`detect_leg` (or named by the caller):

* ``mux`` (relay <-> controller): the 4-byte channel magic first when present (the relay ->
  controller direction starts with it, the other direction does not), then mux records; the
  RoundFrame inside a HostFrame or Broadcast is decoded too.
* ``loopback`` (rank <-> relay): the 16-byte handshake (rank -> relay) or the 8-byte ack
  (relay -> rank) first when present, then length-framed RoundFrames.
* ``frame``: bare RoundFrames one after another (a frame cut out of a capture or written by
  hand).

A stream decodes cleanly only when it ends at a record boundary. A stream that ends anywhere
inside a record, its header included (a capture stopped mid-record), is reported as such, not as
a protocol error (:attr:`DecodeFailure.capture_ended`), with the error a whole-buffer reader would
give (inside a header, that message says flodl's stream reader takes the cut as a clean end of
stream). The bytes present are checked as far as they go: a cut header whose first 4 bytes are not
the record's magic (mux record, RoundFrame) is a protocol error, not a capture that ended.

Every structural check of the codec's readers applies, in upstream's order, with upstream's error
messages; decoding stops at the first failure, which is reported with the byte offset of the
record it happened in. Auth tags are the exception: they are parsed separately from the
structure, then, when a session salt is given, recomputed and compared (reported ``ok`` or
``bad``, and decoding goes on); without a salt they are shown and reported ``unchecked``.
The structure walk is the codec's own (the mux leg is read by
:class:`flodl_proto.codec.stream.MuxStream`, the controller's parser, with its tag checks off;
frames by :func:`flodl_proto.codec.round_frame.round_frame_extent` and its walker; the handshake
and length-prefix readers); only the tag comparison is done here, with
:func:`flodl_proto.codec.auth.compute_tag`.

Each record is a JSON-ready ``dict`` with at least ``offset`` and ``length`` (bytes, in the
stream) and ``type``; tensors are summarized (dtype, shape, bytes, min/max/mean, elided) unless
values are asked for.

Upstream: the readers of ``flodl/src/distributed/relay/mux.rs`` (``read_record``,
``read_len_framed``), ``controller/round_frame.rs`` (``read_round_frame_streamed``),
``controller/mod.rs`` (``read_handshake``, channel magic) and ``cpu_reduce.rs`` (ack, prefixed
reply frame).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ._decode_leg import Leg, UnknownLeg, detect_leg, other_leg_hint
from ._decode_render import control_fields, frame_json
from ._decode_table import format_table, table_end, table_head, table_line
from ._hexdump import parse_hex_dump
from ._names import adopt
from .codec._common import END_OF_STREAM, BytesLike, as_view, check_version
from .codec.auth import check_salt, compute_tag, tags_equal
from .codec.ceiling import frame_ceiling_int
from .codec.handshake import decode_ack, decode_handshake
from .codec.loopback import decode_len_framed_or_eos
from .codec.mux import (
    ControlMessage,
    MuxHeader,
    MuxRecord,
    RecordKind,
    control_too_long,
    decode_control,
    encode_control,
    max_control_payload,
    max_hello_payload,
    parse_mux_header_or_eos,
)
from .codec.round_frame import RoundFrame, round_frame_extent
from .codec.round_frame import parse_round_frame as _parse_unverified
from .codec.round_frame import parse_round_frame_or_eos as _parse_unverified_or_eos
from .codec.stream import (
    MagicReceived,
    MuxStream,
    RecordReceived,
    StreamEvent,
    StreamFailed,
)
from .codec.structs import HANDSHAKE, HANDSHAKE_ACK
from .errors import ProtocolError, protocol_error
from .spec import (
    AUTH_TAG_LEN,
    CHANNEL_MAGIC_DATA,
    CHANNEL_MAGIC_LEN,
    CHANNELS,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_ACK_LEN,
    HANDSHAKE_LEN,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    LEN_PREFIX_LEN,
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_HEADER_LEN,
    MUX_RECORD_MAGIC,
    ROUND_FRAME_HEADER_LEN,
    ROUND_FRAME_MAGIC,
    SPEC,
    SUPPORTED_VERSIONS,
)

__all__ = [
    "EXIT_BAD_TAG",
    "EXIT_CAPTURE_ENDED",
    "EXIT_ERROR",
    "EXIT_OK",
    "DecodeFailure",
    "DecodeReport",
    "Leg",
    "ParsedFrame",
    "TagStatus",
    "UnknownLeg",
    "decode_stream",
    "detect_leg",
    "format_table",
    "parse_hex_dump",
    "parse_round_frame",
    "table_end",
    "table_head",
    "table_line",
    "tag_status",
]

# defined in _decode_leg.py: help() and pickle name this module
adopt(__name__, UnknownLeg, detect_leg)

#: ``ok`` / ``bad`` when a salt was given, ``unchecked`` otherwise
TagStatus = Literal["ok", "bad", "unchecked"]

#: exit code: the stream decoded to its end (a clean end of stream included)
EXIT_OK = 0
#: exit code: decoding stopped at an error
EXIT_ERROR = 1
#: exit code: a salt was given and at least one auth tag did not verify (no error)
EXIT_BAD_TAG = 3
#: exit code: the input ended inside a record (a capture stopped mid-record), nothing else wrong
EXIT_CAPTURE_ENDED = 4

_DATA_PREVIEW = 64  # bytes of an opaque payload shown without --values
_MAGIC_FAMILY = HANDSHAKE_MAGIC_RANK >> 8  # top 24 bits shared by every data-channel magic
_U32 = struct.Struct("<I")


# -------------------------------------------------------------------------------------------------
# Tag-agnostic frame parsing
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ParsedFrame:
    """A RoundFrame parsed without verifying its tag.

    Attributes:
        frame: the decoded frame (payloads are views into the input).
        length: bytes consumed, tag included.
        tag: the 8 tag bytes the frame carries.
        covered: the number of leading bytes the tag covers (``length - 8``).

    No upstream counterpart: upstream has no decoder tool; the frame is parsed as
    ``controller/round_frame.rs`` ``read_round_frame_streamed`` reads it, without the tag check.
    """

    frame: RoundFrame
    length: int
    tag: bytes
    covered: int


def parse_round_frame(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> ParsedFrame:
    """Parse one complete RoundFrame at the start of ``data`` with every reader check but the tag.

    Args:
        data: bytes-like input.
        ceiling: frame ceiling in bytes (running total of ``nbytes``).

    Returns:
        The parsed frame (payloads are views into ``data``).

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput (remote): exactly the errors, in the
        order, of :func:`flodl_proto.codec.round_frame.decode_round_frame` before its tag check
        (input ending inside the 8-byte header is ``frame.header_read_failed``).

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed`` (without the MAC step).
    """
    frame, consumed, tag = _parse_unverified(data, ceiling=ceiling)
    return ParsedFrame(frame, consumed, tag, consumed - AUTH_TAG_LEN)


def _parse_frame_or_none(data: BytesLike, ceiling: int) -> ParsedFrame | None:
    """:func:`parse_round_frame`, or None when ``data`` ends inside the 8-byte header."""
    res = _parse_unverified_or_eos(data, ceiling=ceiling)
    if res is END_OF_STREAM:
        return None
    frame, consumed, tag = res
    return ParsedFrame(frame, consumed, tag, consumed - AUTH_TAG_LEN)


def tag_status(salt: bytes | None, covered: list[BytesLike], carried: BytesLike) -> TagStatus:
    """Recompute an auth tag over ``covered`` (in order) and compare it with ``carried``.

    Args:
        salt: the 16-byte session salt, or None (no check).
        covered: the bytes the tag covers, as a list of buffers (a frame's first
            :attr:`ParsedFrame.covered` bytes: ``[data[:pf.covered]]``; a mux record's 17
            header bytes, then its payload).
        carried: the 8-byte tag the message carries (:attr:`ParsedFrame.tag`).

    Returns:
        ``"unchecked"`` without a salt, else ``"ok"`` or ``"bad"`` (constant-time compare).

    Raises:
        InvalidValue (local): a salt that is not 16 bytes (``salt.*``), or ``covered`` that is
            not an iterable of buffers (``codec.not_pieces``: an ``int`` such as
            :attr:`ParsedFrame.covered` itself, or one buffer not in a list).

    Upstream: ``flodl/src/distributed/wire.rs`` (``hmac_sha256_64``), the MAC steps of
    ``controller/round_frame.rs`` and ``relay/mux.rs``.
    """
    if salt is None:
        return "unchecked"
    return "ok" if tags_equal(compute_tag(salt, covered), carried) else "bad"


# -------------------------------------------------------------------------------------------------
# Report
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DecodeFailure:
    """Where and why decoding stopped.

    Attributes:
        offset: byte offset (in the stream) of the record that could not be decoded.
        message: the protocol error's message (upstream's wording); when the stream's first
            magic is refused and its first bytes start another leg, followed by
            ``; the first bytes look like the mux leg (a mux record header), not the frame
            leg`` (the leg they start, what was seen, the leg asked for).
        kind: the error kind (``truncated``, ``magic``, ...).
        error_id: the catalogue id, when the error has one.
        capture_ended: True when the input simply ended inside the record, its header included
            (the bytes present are consistent; a capture stopped there), not a protocol error.

    No upstream counterpart: upstream has no decoder tool.
    """

    offset: int
    message: str
    kind: str
    error_id: str | None
    capture_ended: bool = False


@dataclass(slots=True)
class DecodeReport:
    """The result of :func:`decode_stream`.

    Attributes:
        records: the decoded records, in stream order (JSON-ready dicts, each field listed in
            ``docs/decode.md``); empty when :func:`decode_stream` handed them to ``on_record``.
        end: the offset where decoding ended (the end of the last complete record).
        size: the stream's total length in bytes.
        failure: why decoding stopped early, or None for a clean end of stream.
        salted: True when tags were verified.
        bad_tags: how many tags did not verify.
        version: the protocol version the stream was decoded as.
        count: how many records were decoded (kept or handed on).
        version_told: True when the stream's own bytes told the version (no version given): a
            loopback handshake or ack of a supported version, or a mux Hello.

    No upstream counterpart: upstream has no decoder tool.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    end: int = 0
    size: int = 0
    failure: DecodeFailure | None = None
    salted: bool = False
    bad_tags: int = 0
    version: int = DEFAULT_VERSION
    count: int = 0  # after the fields before, which keep their positions
    version_told: bool = False

    @property
    def exit_code(self) -> int:
        """0 (clean end), 1 (stopped at a protocol error; wins over the others), 3 (some tag
        bad), 4 (the input ended inside a record)."""
        if self.failure is not None and not self.failure.capture_ended:
            return EXIT_ERROR
        if self.salted and self.bad_tags:
            return EXIT_BAD_TAG
        if self.failure is not None:
            return EXIT_CAPTURE_ENDED
        return EXIT_OK

    def final_record(self) -> dict[str, Any]:
        """The closing record: ``type`` ``end`` (clean: the input ended at a record boundary),
        ``capture_ended`` (the input stopped inside a record, its header included) or ``error``
        (a protocol error), with offset and message."""
        f = self.failure
        if f is not None and f.capture_ended:
            return {"type": "capture_ended", "offset": f.offset, "error_id": f.error_id,
                    "error": f"capture ended inside a record at offset {f.offset} (a reader "
                             f"would report: {f.message})"}
        if f is not None:
            return {"type": "error", "offset": f.offset, "error_kind": f.kind,
                    "error_id": f.error_id, "error": f.message}
        rec: dict[str, Any] = {"type": "end", "offset": self.end, "records": self.count}
        if self.salted:
            rec["bad_tags"] = self.bad_tags
        return rec


class _Stop(Exception):
    """Internal: a ProtocolError at a known record offset (``ended``: the input ran out)."""

    def __init__(self, offset: int, error: ProtocolError, ended: bool = False) -> None:
        super().__init__(str(error))
        self.offset = offset
        self.error = error
        self.ended = ended


#: errors that only say the input ran out (as the first bytes of a stream are read)
_RAN_OUT = frozenset({"channel.read_failed", "handshake.read_failed", "ack.read_failed",
                      "len.body_read_failed"})


def _version_telling(variants: Iterable[Mapping[str, Any]],
                     supported: Iterable[int]) -> frozenset[str]:
    """The names of the control messages (``variants``: ``relay_control_msg``'s in
    ``spec/wire.yaml``) whose layout differs between the ``supported`` versions: one of their
    fields is missing from some supported version (its ``versions``; a field without them is in
    every one). Decoded whole at one version only, such a message tells a stream's version."""
    every = frozenset(supported)
    return frozenset(str(var["name"]) for var in variants
                     if any(frozenset(f.get("versions", every)) & every != every
                            for f in var["fields"]))


#: the control messages whose layout differs between versions, from the spec (a Hello: version
#: 3 added ``model_sigs``); the first of them in a mux stream tells its version
_VERSION_TELLING: Final[frozenset[str]] = _version_telling(
    SPEC.message("relay_control_msg")["variants"], SUPPORTED_VERSIONS)


# -------------------------------------------------------------------------------------------------
# Decoding
# -------------------------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, data: memoryview, salt: bytes | None, version: int | None,
                 values: bool, ceiling: int,
                 on_record: Callable[[dict[str, Any]], None] | None = None,
                 control_limit: int | None = None, hello_limit: int | None = None,
                 world_size: int | None = None) -> None:
        self.mv = data
        self.salt = salt
        self.explicit_version = version
        self.detected = False  # the stream's own bytes told the version
        self.version = version if version is not None else DEFAULT_VERSION
        self.values = values
        self.ceiling = ceiling
        self.control_limit = control_limit  # the control bound, with the world size given
        self.hello_limit = hello_limit  # the bound on a relay's first record, likewise
        self.world_size = world_size  # a rank's handshake must carry it, when given
        self.report = DecodeReport(size=len(data), salted=salt is not None)
        self.on_record = on_record if on_record is not None else self.report.records.append

    # -- shared ------------------------------------------------------------------------------------
    def _emit(self, rec: dict[str, Any]) -> None:
        self.report.count += 1
        self.report.end = int(rec["offset"]) + int(rec["length"])
        self.on_record(rec)

    def _count(self, status: TagStatus) -> TagStatus:
        if status == "bad":
            self.report.bad_tags += 1
        return status

    def _frame(self, body: memoryview, at: int) -> ParsedFrame | None:
        try:
            return _parse_frame_or_none(body, self.ceiling)
        except ProtocolError as e:
            raise _Stop(at, e) from None

    def _frame_json(self, pf: ParsedFrame, body: memoryview) -> dict[str, Any]:
        """The frame's fields, its tag checked over ``body`` (the bytes it was parsed from)."""
        status = self._count(tag_status(self.salt, [body[:pf.covered]], pf.tag))
        return frame_json(pf.frame, pf.length, pf.tag, status, self.version, self.values)

    def run(self, leg: Leg) -> DecodeReport:
        try:
            if leg == "mux":
                self._mux()
            elif leg == "frame":
                self._frames()
            else:
                self._loopback()
            if self.report.end < len(self.mv):
                self._cut_in_header(leg)
        except _Stop as s:
            e = s.error
            ended = s.ended or e.error_id in _RAN_OUT
            message = str(e)
            # a stream read as a leg its first bytes do not start stops at its first byte
            if (hint := other_leg_hint(self.mv, leg, e.error_id)):
                message = f"{message}; {hint}"
            self.report.failure = DecodeFailure(s.offset, message, e.kind, e.error_id, ended)
        self.report.version, self.report.version_told = self.version, self.detected
        return self.report

    def _cut_in_header(self, leg: Leg) -> None:
        """The input ends inside the header of the record after the last whole one (the
        ``*_or_eos`` readers' clean end): raise the capture's end, or the bad magic the bytes
        present already show. Mux and loopback legs only: :meth:`_frames` reports a cut frame
        header itself (its extent check parses the cut frame), so it never stops short."""
        pos = self.report.end
        got = len(self.mv) - pos
        if leg == "mux":
            if got >= 4 and (magic := _U32.unpack_from(self.mv, pos)[0]) != MUX_RECORD_MAGIC:
                raise _Stop(pos, protocol_error("mux.bad_magic", got=magic,
                                                expected=MUX_RECORD_MAGIC))
            raise _Stop(pos, protocol_error("mux.header_read_failed", got=got,
                                            need=MUX_HEADER_LEN), ended=True)
        # loopback: a u32 length prefix, no magic to check
        raise _Stop(pos, protocol_error("len.prefix_read_failed", got=got,
                                        need=LEN_PREFIX_LEN), ended=True)

    # -- mux leg ---------------------------------------------------------------------------------
    def _mux(self) -> None:
        mv = self.mv
        magic: int | None = None  # the relay -> controller direction starts with the magic
        if len(mv) >= CHANNEL_MAGIC_LEN:
            if _U32.unpack_from(mv, 0)[0] in CHANNELS.values():
                magic = CHANNEL_MAGIC_DATA  # another channel's magic: the stream reports it
        elif len(mv) and _U32.pack(CHANNEL_MAGIC_DATA).startswith(bytes(mv)):
            magic = CHANNEL_MAGIC_DATA  # cut inside the magic: the stream reports it
        # tags are compared here (reported, not enforced), so the stream checks none
        self.read_version, self.detected = self.version, False  # until a Hello tells it
        self.mux_seen = 0  # mux records read
        stream = MuxStream(None, version=self.version, ceiling=self.ceiling,
                           expect_magic=magic)
        # without a version, the magic and the first record (a Hello that may tell it) go first,
        # and the rest to a stream of the version told: each Control record is decoded once
        first = self._first_record_end(magic) if self.explicit_version is None else len(mv)
        pos = self._mux_events(stream.feed(mv[:first]), 0, magic)
        if self.version != self.read_version:
            self.read_version = self.version
            stream = MuxStream(None, version=self.version, ceiling=self.ceiling,
                               expect_magic=None)
        self._mux_events([*stream.feed(mv[first:]), *stream.feed_eof()], pos, magic)

    def _first_record_end(self, magic: int | None) -> int:
        """Where the channel magic (when ``magic``) and the first record end, when both are in
        the input whole; else the input's end (the stream reports what is wrong or cut)."""
        start = CHANNEL_MAGIC_LEN if magic is not None else 0
        try:
            hdr = parse_mux_header_or_eos(self.mv[start:], ceiling=self.ceiling)
        except ProtocolError:
            return len(self.mv)
        if hdr is END_OF_STREAM:
            return len(self.mv)
        return min(start + MUX_HEADER_LEN + hdr.payload_len, len(self.mv))

    def _mux_events(self, events: list[StreamEvent], pos: int, magic: int | None) -> int:
        """Emit the records of ``events`` (the first at offset ``pos``); return the offset
        after them."""
        for ev in events:
            if isinstance(ev, MagicReceived):
                self._emit({"offset": 0, "length": ev.nbytes, "type": "channel_magic",
                            "channel": "data", "magic": f"0x{magic:08x}"})
                pos += ev.nbytes
            elif isinstance(ev, RecordReceived):
                self._bound(pos, ev.header, magic)
                self._emit(self._mux_record(pos, ev.record, ev.header, ev.nbytes))
                pos += ev.nbytes
            elif isinstance(ev, StreamFailed):
                if magic is None or pos > 0:  # a record failed, not the magic
                    self._bound_of_failed(pos, magic)
                    self._failed_record_tag(pos)
                raise _Stop(pos, ev.error, ended=ev.error.error_id == "mux.truncated")
        return pos

    def _bound(self, pos: int, hdr: MuxHeader, magic: int | None) -> None:
        """With the world size given, the bounds the reader of the direction applies from the
        record's header, before its payload: the controller (the direction that starts with
        the channel magic) bounds the relay's first record, of any kind, by the longest legal
        Hello (spec departure ``hello_bound``, ``controller.hello_too_long``) and a Control
        record after it by the control bound (departure ``control_bound``,
        ``controller.control_too_long``); the relay bounds every Control record of the
        controller so (``relay.control_too_long``); raise the error as the record's."""
        first = self.mux_seen == 0
        self.mux_seen += 1
        if self.control_limit is None or self.hello_limit is None:
            return
        if magic is not None and first:
            if hdr.payload_len > self.hello_limit:
                raise _Stop(pos, protocol_error("controller.hello_too_long",
                                                length=hdr.payload_len, limit=self.hello_limit,
                                                kind=hdr.kind))
            return
        err = control_too_long(hdr.kind, hdr.payload_len, self.control_limit,
                               "relay" if magic is None else "controller")
        if err is not None:
            raise _Stop(pos, err)

    def _bound_of_failed(self, pos: int, magic: int | None) -> None:
        """:meth:`_bound` of a record the stream could not read whole or decode: the bound
        comes first when its header is whole and sound (the reader reads no payload past it)."""
        if self.control_limit is None:
            return
        try:
            hdr = parse_mux_header_or_eos(self.mv[pos:], ceiling=self.ceiling)
        except ProtocolError:
            return  # the header's own error is the stream's
        if hdr is not END_OF_STREAM:
            self._bound(pos, hdr, magic)

    def _control(self, pos: int, payload: memoryview, read: ControlMessage) -> ControlMessage:
        """The message of the Control record at ``pos`` (``read``: as the stream read it).
        Without an explicit version, the first message of ``_VERSION_TELLING`` tells it, as
        the dissector detects it: the highest version that decodes the whole payload (a Hello:
        version 3 added ``model_sigs``); a later one that does not decode at that version stops
        the decode there."""
        undecided = self.explicit_version is None and not self.detected
        for v in sorted(SUPPORTED_VERSIONS, reverse=True) if undecided else ():
            try:  # each version decoded once: the stream's read is reused
                msg = read if v == self.read_version else decode_control(payload, v)
            except ProtocolError:
                continue
            if len(encode_control(msg, v)) == len(payload):
                if type(msg).__name__ in _VERSION_TELLING:  # its layout differs by version
                    self.version, self.detected = v, True
                    return msg  # the records after it are read at v (the first record's)
                break
        if self.version == self.read_version:
            return read
        try:
            return decode_control(payload, self.version)
        except ProtocolError as e:  # a Hello of the other version, once the version is known
            raise _Stop(pos, e) from None

    def _mux_tag(self, pos: int, hdr: MuxHeader, payload: memoryview) -> TagStatus:
        covered = self.mv[pos:pos + MUX_AUTH_COVERED_HEADER_LEN]
        return self._count(tag_status(self.salt, [covered, payload], hdr.auth_tag))

    def _failed_record_tag(self, pos: int) -> None:
        """Count the tag of a whole record that failed after its tag step (kind, bincode)."""
        mv = self.mv[pos:]
        try:
            hdr = parse_mux_header_or_eos(mv, ceiling=self.ceiling)
        except ProtocolError:
            return  # failed in its header: no tag step
        if hdr is not END_OF_STREAM and len(mv) >= MUX_HEADER_LEN + hdr.payload_len:
            self._mux_tag(pos, hdr, mv[MUX_HEADER_LEN:MUX_HEADER_LEN + hdr.payload_len])

    def _mux_record(self, pos: int, record: MuxRecord, hdr: MuxHeader, end: int
                    ) -> dict[str, Any]:
        payload = record.payload
        status = self._mux_tag(pos, hdr, payload)
        kind = record.kind
        rec: dict[str, Any] = {
            "offset": pos, "length": end, "type": "mux_record", "kind": kind.name.lower(),
            "kind_byte": int(kind), "rank": record.rank,
            "payload_len": hdr.payload_len, "tag": hdr.auth_tag.hex(), "tag_status": status,
        }
        if kind is not RecordKind.DATA and hdr.rank:
            rec["wire_rank"] = hdr.rank  # ignored by the reader (leniency mux_rank_ignored)
        if record.control is not None:
            control = self._control(pos, payload, record.control)
            rec.update(control_fields(control, self.version, len(payload)))
        elif kind is RecordKind.DATA:
            shown = payload if self.values else payload[:_DATA_PREVIEW]
            rec["payload"] = bytes(shown).hex()
            if len(shown) < len(payload):
                rec["payload_truncated"] = True
        else:
            pf = self._frame(payload, pos)
            if pf is None:  # the payload ends inside the frame header
                raise _Stop(pos, protocol_error("frame.header_read_failed", got=payload.nbytes,
                                                need=ROUND_FRAME_HEADER_LEN))
            fj = self._frame_json(pf, payload)
            if pf.length < payload.nbytes:  # leniency hostframe_trailing
                fj["trailing_bytes"] = payload.nbytes - pf.length
            rec["frame"] = fj
        return rec

    # -- bare RoundFrames --------------------------------------------------------------------------
    def _frames(self) -> None:
        pos = 0
        while pos < len(self.mv):
            mv = self.mv[pos:]
            try:
                extent = round_frame_extent(mv, ceiling=self.ceiling)
            except ProtocolError as e:
                raise _Stop(pos, e) from None
            # the ceiling bounds a bare frame's whole length, as the mux and loopback legs bound
            # the record or prefix that carries one (the codec's own check is on tensor bytes)
            whole = extent if isinstance(extent, int) else len(mv) + extent.nbytes
            if whole > self.ceiling:
                size = str(whole) if isinstance(extent, int) else f"at least {whole}"
                raise _Stop(pos, protocol_error("stream.frame_over_ceiling", size=size,
                                                ceiling=self.ceiling))
            if not isinstance(extent, int):  # the frame goes on past the input
                if len(mv) >= 4 and (magic := _U32.unpack_from(mv, 0)[0]) != ROUND_FRAME_MAGIC:
                    raise _Stop(pos, protocol_error("frame.bad_magic", got=magic,
                                                    expected=ROUND_FRAME_MAGIC))
                try:
                    _parse_unverified(mv, ceiling=self.ceiling)
                except ProtocolError as e:
                    raise _Stop(pos, e, ended=True) from None
            pf = self._frame(mv, pos)
            if pf is None:
                return
            fj = self._frame_json(pf, mv)
            self._emit({"offset": pos, "length": pf.length, "type": "round_frame", "frame": fj})
            pos += pf.length

    # -- loopback leg ----------------------------------------------------------------------------
    def _loopback(self) -> None:
        mv = self.mv
        pos = 0
        direction = "unknown"
        rank: int | None = None
        head = bytes(mv[:CHANNEL_MAGIC_LEN])
        if len(mv) >= CHANNEL_MAGIC_LEN:
            first = _U32.unpack_from(mv, 0)[0]
            if first >> 8 == _MAGIC_FAMILY:
                if first == HANDSHAKE_MAGIC_CONTROLLER_ACK:
                    pos, direction = self._ack(), "relay_to_rank"
                else:
                    pos, rank = self._handshake()
                    direction = "rank_to_relay"
        elif head and _U32.pack(HANDSHAKE_MAGIC_RANK).startswith(head):
            self._handshake()  # a handshake cut inside its magic: truncated
        elif head and _U32.pack(HANDSHAKE_MAGIC_CONTROLLER_ACK).startswith(head):
            self._ack()
        while True:
            rec = self._blob(pos, direction, rank)
            if rec is None:
                return
            self._emit(rec)
            pos += int(rec["length"])

    def _auto_version(self, carried: int) -> None:
        if self.explicit_version is None and carried in SUPPORTED_VERSIONS:
            self.version, self.detected = carried, True

    def _handshake(self) -> tuple[int, int | None]:
        mv = self.mv
        rank: int | None = None
        try:
            # the version field as the codec's layout reads it, the checks left to the codec
            head = HANDSHAKE.parse(mv[:HANDSHAKE_LEN]) if len(mv) >= HANDSHAKE_LEN else None
            if head is not None and head.magic == HANDSHAKE_MAGIC_RANK:
                self._auto_version(head.version)
            # without a world size given, the codec checks all else and returns the carried one
            hs, n = decode_handshake(mv, self.world_size, check_version(self.version))
        except ProtocolError as e:
            raise _Stop(0, e) from None
        rank = hs.rank
        rec = {"offset": 0, "length": n, "type": "handshake", "rank": hs.rank,
               "world_size": hs.world_size, "version": hs.version}
        if hs.rank >= hs.world_size:
            rec["note"] = ("rank >= world_size (accepted by the reader; the relay checks its "
                           "rank set)")
        self._emit(rec)
        return n, rank

    def _ack(self) -> int:
        mv = self.mv
        try:
            if len(mv) >= HANDSHAKE_ACK_LEN:
                self._auto_version(HANDSHAKE_ACK.parse(mv[:HANDSHAKE_ACK_LEN]).version)
            n = decode_ack(mv, check_version(self.version))
        except ProtocolError as e:
            raise _Stop(0, e) from None
        self._emit({"offset": 0, "length": n, "type": "handshake_ack", "version": self.version})
        return n

    def _blob(self, pos: int, direction: str, rank: int | None) -> dict[str, Any] | None:
        mv = self.mv[pos:]
        try:
            res = decode_len_framed_or_eos(mv, ceiling=self.ceiling)
        except ProtocolError as e:
            raise _Stop(pos, e) from None
        if res is END_OF_STREAM:
            return None
        body, n = res
        length = n - 4
        pf = self._frame(body, pos)
        if pf is None:
            if direction == "rank_to_relay":
                err = protocol_error("fold.truncated", rank=rank)
            else:
                err = protocol_error("framed_round.body_ended", length=length, got=body.nbytes)
            raise _Stop(pos, err)
        rec: dict[str, Any] = {"offset": pos, "length": n, "type": "len_framed",
                               "body_len": length}
        fj = self._frame_json(pf, body)
        if pf.length < length:
            if direction == "relay_to_rank":
                raise _Stop(pos, protocol_error("framed_round.underrun", short=length - pf.length,
                                                length=length))
            fj["trailing_bytes"] = length - pf.length  # leniency loopback_trailing
        rec["frame"] = fj
        return rec


def decode_stream(
    data: BytesLike,
    leg: Leg,
    *,
    salt: BytesLike | None = None,
    version: int | None = None,
    values: bool = False,
    ceiling: int = DEFAULT_FRAME_CEILING,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    world_size: int | None = None,
) -> DecodeReport:
    """Decode one direction of one connection, from its first byte.

    Args:
        data: the captured bytes.
        leg: ``"mux"`` (relay <-> controller), ``"loopback"`` (rank <-> relay) or ``"frame"``
            (bare RoundFrames); :func:`detect_leg` tells it from the first bytes.
        salt: the 16-byte session salt; with it every tag is verified (``ok``/``bad``), without it
            tags are reported ``unchecked``.
        version: the data-channel protocol version (2 or 3). ``None``: detected as the
            dissector detects it, from the version the loopback handshake or ack carries (a
            supported one) or, on the mux leg, from a Control message whose layout differs
            between versions (a Hello: the highest version that decodes its payload whole);
            the default (2) until then.
        values: include every tensor element (``values``; raw ``data`` hex where the elements
            cannot be decoded) beside the summary (``min``, ``max``, ``mean``), which a record
            always has.
        ceiling: frame ceiling in bytes: the largest mux ``payload_len`` or loopback length
            prefix, the largest bare RoundFrame (its whole length, tag included:
            ``stream.frame_over_ceiling``), and the codec's bound on a frame's tensor bytes.
        on_record: called with each record as it is decoded, which the report then does not
            keep (its ``count`` counts them): memory stays flat over a long stream, and a
            reader sees the first records before the last is decoded.
        world_size: the run's world size (ranks), which no mux record carries. With it the mux
            leg applies the control bound (spec departure ``control_bound``,
            :func:`~flodl_proto.codec.mux.control_too_long` at
            :func:`~flodl_proto.codec.mux.max_control_payload` of it) as each direction's reader
            does, from the record's header: in the direction that starts with the channel
            magic (relay -> controller) a Control record after the first (the Hello) that
            claims more stops the decode with ``controller.control_too_long``, and the first
            record, of any kind, is bound by the longest legal Hello (departure
            ``hello_bound``, :func:`~flodl_proto.codec.mux.max_hello_payload` of it:
            ``controller.hello_too_long``); in the other (controller -> relay) every such
            Control record, ``relay.control_too_long``. On the loopback leg a rank's
            handshake carrying another world size stops the decode as the relay refuses it
            (``handshake.world_size_mismatch``). ``None``: records are bound by ``ceiling``
            only, and any handshake world size is read.

    Returns:
        A :class:`DecodeReport`: the records, and the failure that stopped decoding (if any).

    Raises:
        InvalidValue (local): unknown ``leg`` (``stream.unknown_leg``), the salt is not 16
            bytes, or ``ceiling`` is not a non-negative integer (``ceiling.invalid``: a bool, a
            float or text included; checked before any byte is read, as the codec's readers
            check theirs); a ``world_size`` that is no whole number in 1..2**32 - 1
            (``controller.world_size_zero``, ``controller.bad_argument``); VersionMismatch
            (local): bad version.

    Upstream: the readers the receiving peer runs, in its order: ``controller/mod.rs``
    (channel magic), ``relay/mux.rs`` (``read_record``, ``read_len_framed``),
    ``controller/round_frame.rs`` (``read_round_frame_streamed``), ``cpu_reduce.rs``
    (ack, prefixed reply frame), ``relay/agent.rs`` (deposited frames).
    """
    if leg not in ("mux", "loopback", "frame"):
        raise protocol_error("stream.unknown_leg", leg=leg)
    key = check_salt(salt) if salt is not None else None
    if version is not None:
        check_version(version)
    ceiling = frame_ceiling_int(ceiling)
    limit = max_control_payload(world_size) if world_size is not None else None
    hello = max_hello_payload(world_size) if world_size is not None else None
    return _Decoder(as_view(data), key, version, values, ceiling, on_record, limit,
                    hello, world_size).run(leg)

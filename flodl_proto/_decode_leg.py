"""Which leg a captured byte stream is, told from its first bytes, for :mod:`flodl_proto.decode`
(:func:`detect_leg`, :class:`UnknownLeg`, both exported by it under its name). No upstream
counterpart: upstream has no decoder tool (it knows each socket's leg)."""

from __future__ import annotations

import struct
from typing import Literal

from .codec._common import BytesLike, as_view
from .codec.handshake import http_stream
from .spec import (
    CHANNELS,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    LEN_PREFIX_LEN,
    MUX_RECORD_MAGIC,
    ROUND_FRAME_MAGIC,
)

__all__ = ["Leg", "UnknownLeg", "detect_leg", "other_leg_hint"]

Leg = Literal["mux", "loopback", "frame"]
_U32 = struct.Struct("<I")


#: how the library names the leg to decode (:class:`UnknownLeg`'s words)
_LEG_ARGUMENT = "decode_stream's leg= (mux, loopback or frame)"
#: how the library reads hex text into bytes (:class:`UnknownLeg`'s words)
_HEX_READER = "parse_hex_dump"
#: how the library reads a golden vector file (:class:`UnknownLeg`'s words)
_VECTOR_READER = "flodl_proto.interop.vectors.iter_file_cases"


class UnknownLeg(ValueError):
    """The first bytes of a stream are no leg's (:func:`detect_leg`), or they are HTTP.

    The message is ``cannot tell the leg from the first bytes (HEX): ...``, ``HEX`` the first
    8 bytes; for bytes no leg starts it ends ``name it with decode_stream's leg= (mux,
    loopback or frame)``, and, when they read as hex text, ``; they read as hex text: decode
    it with parse_hex_dump``, or, when the stream starts with ``{`` or ``[`` (after
    optional blanks), ``; they look like JSON (a vector file?
    flodl_proto.interop.vectors.iter_file_cases reads those)``. A command line names its own
    options and commands instead (:meth:`describe`), so the wording has one home.

    Attributes:
        head: the first 8 bytes of the stream (bytes).
        http: True when they are HTTP (the controller's status requests and replies share its
            port with the data channel: skip such a stream, no leg applies).
        hex_text: True when they read as hex text (digits, blanks, an offset's colon) and the
            stream is not JSON.
        json: True when the stream starts, after optional blanks (and a UTF-8 byte order
            mark), with ``{`` or ``[``: most likely a golden vector file or other JSON.

    No upstream counterpart: upstream has no decoder tool (it knows each socket's leg).
    """

    def __init__(self, head: bytes, *, http: bool, hex_text: bool, json: bool = False) -> None:
        self.head = bytes(head)
        self.http = http
        self.hex_text = hex_text
        self.json = json
        super().__init__(self.describe())

    def describe(self, leg: str = _LEG_ARGUMENT, hex_reader: str | None = _HEX_READER,
                 vector_reader: str | None = _VECTOR_READER) -> str:
        """The message, naming ``leg`` as the way to give the leg, ``hex_reader`` as the way
        to read hex text and ``vector_reader`` as the way to read a vector file (None: no hint
        about hex text, or about JSON, where none applies).

        Args:
            leg: what names the leg (the library: ``decode_stream's leg= (mux, loopback or
                frame)``; ``flodl-proto decode``: ``--leg``).
            hex_reader: what reads hex text into bytes (the library: ``parse_hex_dump``;
                ``flodl-proto decode``: ``--hex``), or None.
            vector_reader: what reads a golden vector file (the library:
                ``flodl_proto.interop.vectors.iter_file_cases``; ``flodl-proto decode``:
                ``'flodl-proto vectors check FILE'``), or None.

        Returns:
            One line of text (str).
        """
        start = f"cannot tell the leg from the first bytes ({self.head.hex()}): "
        if self.http:
            return (start + "they are HTTP (a GET /status to the controller's port mux, or "
                    "its reply), not a flodl leg")
        hint = ""
        if self.json and vector_reader is not None:
            hint = f"; they look like JSON (a vector file? {vector_reader} reads those)"
        elif self.hex_text and hex_reader is not None:
            hint = f"; they read as hex text: decode it with {hex_reader}"
        return (start + "not a channel magic, handshake, ack, RoundFrame, mux record or "
                f"length-prefixed frame; name it with {leg}{hint}")


def detect_leg(data: BytesLike) -> tuple[Leg, str]:
    """Tell the leg of a captured stream from its first bytes.

    Returns:
        ``(leg, why)``: ``mux`` for the data channel magic or a mux record header; ``loopback``
        for the rank handshake, the relay's ack or a u32 length prefix followed by a RoundFrame;
        ``frame`` for a bare RoundFrame; ``why`` names what was seen. Input too short to tell
        (under 8 bytes) is ``mux``.

    Raises:
        UnknownLeg (a ValueError): the first bytes are none of these (the caller should name
            the leg: ``decode_stream(data, leg)``), or they are HTTP (the requests to the
            controller's status responder, and its replies, share its port with the data
            channel: skip such a stream); its ``http``, ``hex_text`` and ``json`` say which
            (``json``: the stream is most likely a golden vector file).

    No upstream counterpart: upstream has no decoder tool (it knows each socket's leg).
    """
    mv = as_view(data)
    if len(mv) < 4:
        return "mux", "too short to tell"
    seen = _leg_start(mv)
    if seen is not None:
        return seen
    if len(mv) < 8:
        return "mux", "too short to tell"
    head = bytes(mv[:8])
    json = _json_start(mv)
    hex_text = not json and all(chr(b) in _HEX_TEXT for b in head)
    raise UnknownLeg(head, http=http_stream(mv), hex_text=hex_text, json=json)


def _leg_start(mv: memoryview) -> tuple[Leg, str] | None:
    """``(leg, what)`` when the first bytes of ``mv`` start a leg (a magic, or a length prefix
    and a RoundFrame's magic), else None (too short, or no leg's)."""
    if len(mv) < 4:
        return None
    first = _U32.unpack_from(mv, 0)[0]
    if first in CHANNELS.values():
        return "mux", f"channel magic 0x{first:08x}"
    if first == MUX_RECORD_MAGIC:
        return "mux", "a mux record header"
    if first == HANDSHAKE_MAGIC_RANK:
        return "loopback", "the rank handshake"
    if first == HANDSHAKE_MAGIC_CONTROLLER_ACK:
        return "loopback", "the relay's handshake ack"
    if first == ROUND_FRAME_MAGIC:
        return "frame", "a bare RoundFrame"
    if len(mv) >= LEN_PREFIX_LEN + 4 and _U32.unpack_from(mv, 4)[0] == ROUND_FRAME_MAGIC:
        return "loopback", "a length prefix and a RoundFrame"
    return None


#: the errors of the magic a stream's first record (or handshake, or channel magic) starts with
_FIRST_MAGIC_ERRORS = frozenset({"mux.bad_magic", "frame.bad_magic", "handshake.bad_magic",
                                 "ack.bad_magic", "channel.bad_magic"})


def other_leg_hint(data: BytesLike, leg: Leg, error_id: str | None) -> str:
    """Why a stream read as ``leg`` failed on the magic at its first byte (``error_id``, one of
    the magic errors), when its first bytes start another leg (as :func:`detect_leg` tells
    it): ``the first bytes look like the mux leg (a mux record header), not the frame leg``;
    else "" (another error, or bytes no leg starts).

    No upstream counterpart: upstream has no decoder tool (it knows each socket's leg).
    """
    if error_id not in _FIRST_MAGIC_ERRORS:
        return ""
    seen = _leg_start(as_view(data))
    if seen is None or seen[0] == leg:
        return ""
    return f"the first bytes look like the {seen[0]} leg ({seen[1]}), not the {leg} leg"


#: bytes a JSON text may start with before its first value (blanks, a UTF-8 byte order mark)
_JSON_BLANKS = b" \t\r\n"
_UTF8_BOM = b"\xef\xbb\xbf"
#: how far into the stream the first non-blank byte is looked for
_JSON_LOOKAHEAD = 4096


def _json_start(mv: memoryview) -> bool:
    """Whether ``mv`` starts, after optional blanks (within its first 4 KiB) and a UTF-8 byte
    order mark, with ``{`` or ``[``: a JSON object or array, such as a golden vector file."""
    text = bytes(mv[:_JSON_LOOKAHEAD]).removeprefix(_UTF8_BOM).lstrip(_JSON_BLANKS)
    return text[:1] in (b"{", b"[")


#: the characters hex text starts with (digits, an offset's colon, blanks, a code fence)
_HEX_TEXT = frozenset("0123456789abcdefABCDEF: \t\r\n`~")

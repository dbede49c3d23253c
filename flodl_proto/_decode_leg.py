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

__all__ = ["Leg", "UnknownLeg", "detect_leg"]

Leg = Literal["mux", "loopback", "frame"]
_U32 = struct.Struct("<I")


#: how the library names the leg to decode (:class:`UnknownLeg`'s words)
_LEG_ARGUMENT = "decode_stream's leg= (mux, loopback or frame)"
#: how the library reads hex text into bytes (:class:`UnknownLeg`'s words)
_HEX_READER = "parse_hex_dump"


class UnknownLeg(ValueError):
    """The first bytes of a stream are no leg's (:func:`detect_leg`), or they are HTTP.

    The message is ``cannot tell the leg from the first bytes (HEX): ...``, ``HEX`` the first
    8 bytes; for bytes no leg starts it ends ``name it with decode_stream's leg= (mux,
    loopback or frame)``, and, when they read as hex text, ``; they read as hex text: decode
    it with parse_hex_dump``. A command line names its own options instead
    (:meth:`describe`), so the wording has one home.

    Attributes:
        head: the first 8 bytes of the stream (bytes).
        http: True when they are HTTP (the controller's status requests and replies share its
            port with the data channel: skip such a stream, no leg applies).
        hex_text: True when they read as hex text (digits, blanks, an offset's colon).

    No upstream counterpart: upstream has no decoder tool (it knows each socket's leg).
    """

    def __init__(self, head: bytes, *, http: bool, hex_text: bool) -> None:
        self.head = bytes(head)
        self.http = http
        self.hex_text = hex_text
        super().__init__(self.describe())

    def describe(self, leg: str = _LEG_ARGUMENT, hex_reader: str | None = _HEX_READER) -> str:
        """The message, naming ``leg`` as the way to give the leg and ``hex_reader`` as the way
        to read hex text (None: no hint about hex text, where none applies).

        Args:
            leg: what names the leg (the library: ``decode_stream's leg= (mux, loopback or
                frame)``; ``flodl-proto decode``: ``--leg``).
            hex_reader: what reads hex text into bytes (the library: ``parse_hex_dump``;
                ``flodl-proto decode``: ``--hex``), or None.

        Returns:
            One line of text (str).
        """
        start = f"cannot tell the leg from the first bytes ({self.head.hex()}): "
        if self.http:
            return (start + "they are HTTP (a GET /status to the controller's port mux, or "
                    "its reply), not a flodl leg")
        hint = (f"; they read as hex text: decode it with {hex_reader}"
                if self.hex_text and hex_reader is not None else "")
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
            channel: skip such a stream); its ``http`` and ``hex_text`` say which.

    No upstream counterpart: upstream has no decoder tool (it knows each socket's leg).
    """
    mv = as_view(data)
    if len(mv) < 4:
        return "mux", "too short to tell"
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
    if len(mv) < 8:
        return "mux", "too short to tell"
    head = bytes(mv[:8])
    raise UnknownLeg(head, http=http_stream(mv), hex_text=all(chr(b) in _HEX_TEXT for b in head))


#: the characters hex text starts with (digits, an offset's colon, blanks, a code fence)
_HEX_TEXT = frozenset("0123456789abcdefABCDEF: \t\r\n`~")

"""What a failing step expected, in the protocol's words: the message a step's builder names
(``a Broadcast record``) and the field of the expected bytes a differing byte falls in
(``payload.tensor[0].data, element 1``), so a failure line points at the rule rather than at a
bare offset."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

from ..spec import SPEC

__all__ = ["expected_message", "field_at", "observed_message"]

_U32: Final = struct.Struct("<I")
_MUX_MAGIC: Final = SPEC.const("MUX_RECORD_MAGIC")
_FRAME_MAGIC: Final = SPEC.const("ROUND_FRAME_MAGIC")
_HANDSHAKE_MAGIC: Final = SPEC.const("HANDSHAKE_MAGIC_RANK")
_ACK_MAGIC: Final = SPEC.const("HANDSHAKE_MAGIC_CONTROLLER_ACK")
_MUX_HEADER: Final = (("magic", 4), ("version", 4), ("kind", 1), ("rank", 4),
                      ("payload_len", 4), ("auth_tag", 8))
_FRAME_HEADER: Final = (("magic", 4), ("num_tensors", 4), ("kind", 1), ("weight", 8))
_HANDSHAKE: Final = (("magic", 4), ("version", 4), ("rank", 4), ("world_size", 4))
_ACK: Final = (("magic", 4), ("version", 4))
_ELEMENT_SIZE: Final = {0: 4, 1: 2}
#: record kinds whose payload is one RoundFrame (HostFrame, Broadcast)
_FRAME_RECORDS: Final = (3, 4)

_RECORD_KINDS: Final = {1: "Data", 2: "Control", 3: "HostFrame", 4: "Broadcast"}
_CONTROL_VARIANTS: Final = {0: "Hello", 1: "HelloAck", 2: "RankExit", 3: "DeclareDead"}

#: builder key of a step -> the message it builds
_MESSAGES: Final = {
    "magic": "a channel magic", "handshake": "a rank handshake", "ack": "a handshake ack",
    "hello": "a Control(Hello) record", "hello_ack": "a Control(HelloAck) record",
    "rank_exit": "a Control(RankExit) record", "declare_dead": "a Control(DeclareDead) record",
    "data": "a Data record", "record": "a mux record", "host_frame": "a HostFrame record",
    "broadcast": "a Broadcast record", "frame": "a RoundFrame",
    "framed": "a length-framed RoundFrame", "len_prefix": "a length prefix",
    "mux_header": "a mux record header",
}


def expected_message(step: Mapping[str, Any]) -> str | None:
    """The message an ``expect`` step's builder names (``a Broadcast record``), or None for
    raw bytes (``hex``).

    No upstream counterpart: upstream has no conformance kit.
    """
    return next((m for k, m in _MESSAGES.items() if k in step), None)


def observed_message(data: bytes) -> str | None:
    """What the bytes a target sent start with, when they start with a mux record of a known
    kind (``a Broadcast record``, ``a Control(HelloAck) record``); else None.

    No upstream counterpart: upstream has no conformance kit.
    """
    if len(data) < 9 or _U32.unpack_from(data, 0)[0] != _MUX_MAGIC:
        return None
    kind = _RECORD_KINDS.get(data[8])
    if kind is None:
        return None
    variant = _CONTROL_VARIANTS.get(data[25]) if kind == "Control" and len(data) > 25 else None
    return f"a {kind}({variant}) record" if variant else f"a {kind} record"


def _fixed(fields: tuple[tuple[str, int], ...], offset: int) -> tuple[str, int] | None:
    """The field of a fixed layout holding byte ``offset``, and where that field ends."""
    at = 0
    for name, size in fields:
        if offset < at + size:
            return name, at + size
        at += size
    return None


def _frame_field(f: bytes, offset: int) -> str | None:
    """The RoundFrame field holding byte ``offset`` of the well-formed frame ``f``."""
    head = _fixed(_FRAME_HEADER, offset)
    if head is not None:
        return head[0]
    if len(f) < 17:
        return None
    at = 17
    for i in range(_U32.unpack_from(f, 4)[0]):
        if at + 2 > len(f) - 8:
            return None
        dtype, ndim = f[at], f[at + 1]
        meta = (("dtype", 1), ("ndim", 1), *((f"dim[{j}]", 4) for j in range(ndim)),
                ("nbytes", 8))
        name = _fixed(meta, offset - at)
        if name is not None:
            return f"tensor[{i}].{name[0]}"
        at += 10 + 4 * ndim
        if at > len(f):
            return None
        nbytes = int.from_bytes(f[at - 8:at], "little")
        if offset < at + nbytes:
            size = _ELEMENT_SIZE.get(dtype)
            return f"tensor[{i}].data" + (
                f", element {(offset - at) // size}" if size is not None else "")
        at += nbytes
    return "auth_tag" if at <= offset < at + 8 else None


def field_at(data: bytes, offset: int) -> str | None:
    """The field of the expected bytes ``data`` that holds byte ``offset``, in the names of
    docs/protocol.md: a mux record's header fields and, for a HostFrame or a Broadcast, its
    RoundFrame's as ``payload.<field>``; a RoundFrame's (``tensor[0].data, element 1``); a
    length-framed frame's ``length`` and ``body.<field>``; a handshake's and an ack's. None when
    the bytes are none of these (raw bytes, a tampered frame) or ``offset`` is past them.

    No upstream counterpart: upstream has no conformance kit.
    """
    if not 0 <= offset < len(data) or len(data) < 4:
        return None
    magic = _U32.unpack_from(data, 0)[0]
    if magic == _MUX_MAGIC and len(data) >= 25:
        head = _fixed(_MUX_HEADER, offset)
        if head is not None:
            return head[0]
        if data[8] in _FRAME_RECORDS and len(data) >= 25 + 4 \
                and _U32.unpack_from(data, 25)[0] == _FRAME_MAGIC:
            inner = _frame_field(data[25:], offset - 25)
            return None if inner is None else f"payload.{inner}"
        return "payload"
    if magic == _FRAME_MAGIC:
        return _frame_field(data, offset)
    if len(data) >= 8 and _U32.unpack_from(data, 4)[0] == _FRAME_MAGIC \
            and magic == len(data) - 4:
        if offset < 4:
            return "length"
        inner = _frame_field(data[4:], offset - 4)
        return None if inner is None else f"body.{inner}"
    if magic == _HANDSHAKE_MAGIC and len(data) == 16:
        return _fixed(_HANDSHAKE, offset)[0]  # type: ignore[index]
    if magic == _ACK_MAGIC and len(data) == 8:
        return _fixed(_ACK, offset)[0]  # type: ignore[index]
    return None

"""What a failing step expected, in the protocol's words: the message a step's builder names
(``a Broadcast record``) and the field of the expected bytes a differing byte falls in
(``payload.tensor[0].data, element 1``), so a failure line points at the rule rather than at a
bare offset. The layouts, record kinds, control variants and element sizes are the codec's
structs (:mod:`flodl_proto.codec.structs`) and the spec's, read here, never written again."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from ..codec.mux import RecordKind
from ..codec.structs import (
    HANDSHAKE,
    HANDSHAKE_ACK,
    MUX_HEADER,
    ROUND_FRAME_HEADER,
    ROUND_FRAME_KIND,
    ROUND_FRAME_WEIGHT,
    TENSOR_DIM,
    TENSOR_META,
    TENSOR_NBYTES,
)
from ..spec import (
    AUTH_TAG_LEN,
    CONTROL_VARIANTS,
    ELEMENT_SIZE,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    MUX_HEADER_LEN,
    MUX_RECORD_MAGIC,
    ROUND_FRAME_MAGIC,
)

__all__ = ["expected_message", "field_at", "field_value_pair", "observed_message"]


def _layout(*structs: Any) -> tuple[tuple[str, int], ...]:
    """The (name, size) of each field of the codec's fixed-layout ``structs``, in wire order."""
    return tuple((sub.name, sub.sizeof()) for st in structs for sub in st.subcons)


_U32: Final = struct.Struct("<I")
_MUX_HEADER: Final = _layout(MUX_HEADER)
_FRAME_HEADER: Final = _layout(ROUND_FRAME_HEADER, ROUND_FRAME_KIND, ROUND_FRAME_WEIGHT)
_FRAME_HEADER_LEN: Final = sum(size for _, size in _FRAME_HEADER)
_TENSOR_META: Final = _layout(TENSOR_META)
_DIM_LEN: Final = TENSOR_DIM.sizeof()
_NBYTES: Final = _layout(TENSOR_NBYTES)
_HANDSHAKE: Final = _layout(HANDSHAKE)
_ACK: Final = _layout(HANDSHAKE_ACK)
#: record kinds whose payload is one RoundFrame (HostFrame, Broadcast)
_FRAME_RECORDS: Final = (RecordKind.HOST_FRAME, RecordKind.BROADCAST)

#: record kind byte -> the kind as the docs write it (HOST_FRAME: HostFrame)
_RECORD_KINDS: Final = {int(k): "".join(p.capitalize() for p in k.name.split("_"))
                        for k in RecordKind}
_CONTROL_VARIANTS: Final = {code: name for name, code in CONTROL_VARIANTS.items()}

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
    if len(data) < 9 or _U32.unpack_from(data, 0)[0] != MUX_RECORD_MAGIC:
        return None
    kind = _RECORD_KINDS.get(data[8])
    if kind is None:
        return None
    variant = (_CONTROL_VARIANTS.get(data[MUX_HEADER_LEN])
               if kind == "Control" and len(data) > MUX_HEADER_LEN else None)
    return f"a {kind}({variant}) record" if variant else f"a {kind} record"


def _fixed(fields: tuple[tuple[str, int], ...], offset: int) -> tuple[str, int, int] | None:
    """The field of a fixed layout holding byte ``offset``: its name, start and size."""
    at = 0
    for name, size in fields:
        if offset < at + size:
            return name, at, size
        at += size
    return None


#: a field's span in the expected bytes: name, start, size and how its value reads (a struct
#: format, ``f32`` / ``bf16`` for a tensor element, None for bytes shown only as hex)
_Span = tuple[str, int, int, str | None]


def _typed(name: str, start: int, size: int) -> _Span:
    """A fixed field's span, its value read as the wire types of docs/protocol.md."""
    if name.endswith("auth_tag"):
        return name, start, size, None
    fmt = {1: "<B", 4: "<I", 8: "<d" if name.endswith("weight") else "<Q"}.get(size)
    return name, start, size, fmt


def _frame_span(f: bytes, offset: int) -> _Span | None:
    """The RoundFrame field holding byte ``offset`` of the well-formed frame ``f``."""
    head = _fixed(_FRAME_HEADER, offset)
    if head is not None:
        return _typed(*head)
    if len(f) < _FRAME_HEADER_LEN:
        return None
    at = _FRAME_HEADER_LEN
    for i in range(_U32.unpack_from(f, 4)[0]):
        if at + 2 > len(f) - AUTH_TAG_LEN:
            return None
        dtype, ndim = f[at], f[at + 1]
        meta = (*_TENSOR_META, *((f"dim[{j}]", _DIM_LEN) for j in range(ndim)), *_NBYTES)
        name = _fixed(meta, offset - at)
        if name is not None:
            return _typed(f"tensor[{i}].{name[0]}", at + name[1], name[2])
        at += sum(size for _, size in meta)
        if at > len(f):
            return None
        nbytes = int.from_bytes(f[at - _NBYTES[0][1]:at], "little")
        if offset < at + nbytes:
            size = ELEMENT_SIZE.get(dtype)
            if size is None:
                return f"tensor[{i}].data", at, nbytes, None
            k = (offset - at) // size
            return (f"tensor[{i}].data, element {k}", at + k * size, size,
                    "f32" if size == 4 else "bf16")
        at += nbytes
    return ("auth_tag", at, AUTH_TAG_LEN, None) if at <= offset < at + AUTH_TAG_LEN else None


def _inner(prefix: str, base: int, span: _Span | None) -> _Span | None:
    """``span`` of a frame carried at ``base``, named ``prefix.<field>``."""
    if span is None:
        return None
    return f"{prefix}.{span[0]}", base + span[1], span[2], span[3]


def _span(data: bytes, offset: int) -> _Span | None:
    """The span of the field of the expected bytes ``data`` holding byte ``offset``."""
    if not 0 <= offset < len(data) or len(data) < 4:
        return None
    magic = _U32.unpack_from(data, 0)[0]
    if magic == MUX_RECORD_MAGIC and len(data) >= MUX_HEADER_LEN:
        head = _fixed(_MUX_HEADER, offset)
        if head is not None:
            return _typed(*head)
        if data[8] in _FRAME_RECORDS and len(data) >= MUX_HEADER_LEN + 4 \
                and _U32.unpack_from(data, MUX_HEADER_LEN)[0] == ROUND_FRAME_MAGIC:
            return _inner("payload", MUX_HEADER_LEN,
                          _frame_span(data[MUX_HEADER_LEN:], offset - MUX_HEADER_LEN))
        return "payload", MUX_HEADER_LEN, len(data) - MUX_HEADER_LEN, None
    if magic == ROUND_FRAME_MAGIC:
        return _frame_span(data, offset)
    if len(data) >= 8 and _U32.unpack_from(data, 4)[0] == ROUND_FRAME_MAGIC \
            and magic == len(data) - 4:
        if offset < 4:
            return "length", 0, 4, "<I"
        return _inner("body", 4, _frame_span(data[4:], offset - 4))
    if magic == HANDSHAKE_MAGIC_RANK and len(data) == HANDSHAKE.sizeof():
        return _typed(*_fixed(_HANDSHAKE, offset))  # type: ignore[misc]
    if magic == HANDSHAKE_MAGIC_CONTROLLER_ACK and len(data) == HANDSHAKE_ACK.sizeof():
        return _typed(*_fixed(_ACK, offset))  # type: ignore[misc]
    return None


def field_at(data: bytes, offset: int) -> str | None:
    """The field of the expected bytes ``data`` that holds byte ``offset``, in the names of
    docs/protocol.md: a mux record's header fields and, for a HostFrame or a Broadcast, its
    RoundFrame's as ``payload.<field>``; a RoundFrame's (``tensor[0].data, element 1``); a
    length-framed frame's ``length`` and ``body.<field>``; a handshake's and an ack's. None when
    the bytes are none of these (raw bytes, a tampered frame) or ``offset`` is past them.

    No upstream counterpart: upstream has no conformance kit.
    """
    span = _span(data, offset)
    return None if span is None else span[0]


def _value(raw: bytes, fmt: str, name: str) -> str:
    """The value of a field's ``raw`` bytes: an f32 or bf16 element, an f64, or an integer
    (a magic in hex)."""
    if fmt in ("f32", "bf16"):
        wide = raw if fmt == "f32" else b"\0\0" + raw
        return repr(float(np.frombuffer(wide, "<f4")[0]))
    v = struct.unpack(fmt, raw)[0]
    if fmt == "<d":
        return repr(v)
    return f"0x{v:08x}" if name.endswith("magic") else str(v)


def field_value_pair(expected: bytes, observed: bytes, offset: int) -> tuple[str, str] | None:
    """The values, as text, of the field of ``expected`` holding byte ``offset`` (the first that
    differs) and of the same bytes of ``observed`` (``('258.0', '256.0')``: an f32 or bf16
    element or an f64 as Python's ``repr`` of the float, an integer in decimal, a magic in hex,
    ``'0x1234abcd'``), when that field has a value (an integer, a weight, a tensor element) and
    ``observed`` holds all its bytes; else None.

    No upstream counterpart: upstream has no conformance kit.
    """
    span = _span(expected, offset)
    if span is None:
        return None
    name, start, size, fmt = span
    if fmt is None or start + size > len(observed):
        return None
    return (_value(expected[start:start + size], fmt, name),
            _value(observed[start:start + size], fmt, name))


"""construct declarations of every fixed-layout wire part.

Each struct mirrors a field table of ``spec/wire.yaml`` (``struct:`` names it) field for field:
names, order, types and sizes; ``tests/test_spec.py`` proves it. Magics are ``Const`` values read
from the spec, never written here. These structs are only ever used uncompiled (``parse`` /
``build``), and never on tensor payloads: payload bytes are sliced as memoryviews by the codec.

Upstream layouts: ``flodl/src/distributed/controller/mod.rs`` (handshake, ack),
``controller/round_frame.rs`` (RoundFrame), ``relay/mux.rs`` (mux header, length prefix),
``wire.rs`` (channel magic).

The hot path (every record and frame of every round) reads and writes through
:func:`packed` forms of the same declarations: a precompiled :class:`struct.Struct` derived
field by field from the construct struct (so the layout is still written once, here), about
30 times faster than construct's interpreted ``parse``/``build``.
"""

from __future__ import annotations

import functools
import struct as _struct
from typing import Any, Final

from construct import Array, Bytes, Float64l, FormatField, Int8ul, Int32ul, Int64ul, Struct, this

from ..spec import (
    AUTH_TAG_LEN,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    MUX_RECORD_MAGIC,
    ROUND_FRAME_MAGIC,
)

__all__ = [
    "AUTH_TAG",
    "CHANNEL_MAGIC",
    "HANDSHAKE",
    "HANDSHAKE_ACK",
    "LEN_PREFIX",
    "MUX_HEADER",
    "PACKED",
    "ROUND_FRAME_HEADER",
    "ROUND_FRAME_KIND",
    "ROUND_FRAME_WEIGHT",
    "STRUCTS",
    "TENSOR_DIM",
    "TENSOR_DIMS",
    "TENSOR_META",
    "TENSOR_NBYTES",
    "dims_packed",
    "packed",
]

#: 16-byte rank handshake (rank -> relay). Magic checked by the reader (to name the value).
HANDSHAKE: Final[Any] = Struct(
    "magic" / Int32ul,
    "version" / Int32ul,
    "rank" / Int32ul,
    "world_size" / Int32ul,
)
#: 8-byte handshake ack (relay -> rank).
HANDSHAKE_ACK: Final[Any] = Struct(
    "magic" / Int32ul,
    "version" / Int32ul,
)
#: 4-byte channel-select magic (relay -> controller).
CHANNEL_MAGIC: Final[Any] = Struct("magic" / Int32ul)

#: RoundFrame bytes 0..8: magic, num_tensors (end of stream inside it is clean).
ROUND_FRAME_HEADER: Final[Any] = Struct(
    "magic" / Int32ul,
    "num_tensors" / Int32ul,
)
#: RoundFrame byte 8: the round kind.
ROUND_FRAME_KIND: Final[Any] = Struct("kind" / Int8ul)
#: RoundFrame bytes 9..17: the realized-work weight.
ROUND_FRAME_WEIGHT: Final[Any] = Struct("weight" / Float64l)
#: per tensor: dtype tag and ndim.
TENSOR_META: Final[Any] = Struct(
    "dtype" / Int8ul,
    "ndim" / Int8ul,
)
#: one dimension of a tensor's shape.
TENSOR_DIM: Final[Any] = Struct("dim" / Int32ul)
#: all ``ndim`` dimensions at once (context: ``ndim``).
TENSOR_DIMS: Final[Any] = Struct("dims" / Array(this._.ndim, Int32ul))
#: per tensor: payload byte count.
TENSOR_NBYTES: Final[Any] = Struct("nbytes" / Int64ul)
#: the 8-byte auth tag (RoundFrame footer).
AUTH_TAG: Final[Any] = Struct("auth_tag" / Bytes(AUTH_TAG_LEN))

#: the u32 length prefix of a loopback blob.
LEN_PREFIX: Final[Any] = Struct("length" / Int32ul)

#: 25-byte mux record header.
MUX_HEADER: Final[Any] = Struct(
    "magic" / Int32ul,
    "version" / Int32ul,
    "kind" / Int8ul,
    "rank" / Int32ul,
    "payload_len" / Int32ul,
    "auth_tag" / Bytes(AUTH_TAG_LEN),
)

#: the first field of each struct that has a fixed magic, for building: struct -> magic value
MAGICS: Final[dict[str, int]] = {
    "HANDSHAKE": HANDSHAKE_MAGIC_RANK,
    "HANDSHAKE_ACK": HANDSHAKE_MAGIC_CONTROLLER_ACK,
    "ROUND_FRAME_HEADER": ROUND_FRAME_MAGIC,
    "MUX_HEADER": MUX_RECORD_MAGIC,
}

#: struct name (as ``spec/wire.yaml`` ``struct:`` spells it) -> construct struct
STRUCTS: Final[dict[str, Any]] = {
    "HANDSHAKE": HANDSHAKE,
    "HANDSHAKE_ACK": HANDSHAKE_ACK,
    "CHANNEL_MAGIC": CHANNEL_MAGIC,
    "ROUND_FRAME_HEADER": ROUND_FRAME_HEADER,
    "ROUND_FRAME_KIND": ROUND_FRAME_KIND,
    "ROUND_FRAME_WEIGHT": ROUND_FRAME_WEIGHT,
    "TENSOR_META": TENSOR_META,
    "TENSOR_DIM": TENSOR_DIM,
    "TENSOR_NBYTES": TENSOR_NBYTES,
    "AUTH_TAG": AUTH_TAG,
    "LEN_PREFIX": LEN_PREFIX,
    "MUX_HEADER": MUX_HEADER,
}




def _field_format(sub: Any) -> str:
    """The :mod:`struct` format of one construct field (without the byte-order mark)."""
    if isinstance(sub, FormatField):
        fmt = str(sub.fmtstr)
        if not fmt.startswith("<"):  # pragma: no cover - every wire field is little-endian
            raise TypeError(f"{fmt!r} is not a little-endian field")
        return fmt[1:]
    if isinstance(sub, Bytes) and isinstance(sub.length, int):
        return f"{sub.length}s"
    raise TypeError(f"no struct format for {sub!r}")  # pragma: no cover - declarations above


def packed(st: Any) -> _struct.Struct:
    """The precompiled :class:`struct.Struct` of a fixed-size construct ``Struct`` above: the
    same fields in the same order (``unpack`` returns them as a tuple, ``pack`` takes them
    positionally; ``Bytes`` fields are ``bytes``).

    No upstream counterpart: a precompiled form of this module's declarations; the layouts are
    those of ``controller/mod.rs``, ``controller/round_frame.rs`` and ``relay/mux.rs``.
    """
    return _struct.Struct("<" + "".join(_field_format(sc.subcon) for sc in st.subcons))


@functools.cache
def dims_packed(ndim: int) -> _struct.Struct:
    """The precompiled form of :data:`TENSOR_DIMS` for ``ndim`` dimensions (cached)."""
    (arr,) = TENSOR_DIMS.subcons
    return _struct.Struct("<" + _field_format(arr.subcon.subcon) * ndim)


#: struct name -> its :func:`packed` form, for every fixed-size struct of :data:`STRUCTS`
PACKED: Final[dict[str, _struct.Struct]] = {name: packed(st) for name, st in STRUCTS.items()}

"""The subset of bincode 2 (``config::standard()``) that ``RelayControlMsg`` needs.

``standard()`` is little-endian with variable-length integers:

* unsigned varint: ``v <= 250`` is one byte; else a marker — ``0xFB`` + u16, ``0xFC`` + u32,
  ``0xFD`` + u64, ``0xFE`` + u128 (little-endian). Decoding accepts non-minimal forms (3 as
  ``FB 03 00``) but rejects a marker wider than the field's type and the reserved ``0xFF``;
  encoding always emits the minimal form.
* ``u8`` is one raw byte; ``String`` is a u64-varint length + UTF-8; ``Vec<T>`` a u64-varint length
  + elements; ``[u8; 32]`` 32 raw bytes; an enum is its variant index as a u32 varint + fields.

Decoding reads from a memoryview and never allocates more than the input holds: sequence lengths
are not trusted for preallocation, each element consumes at least one input byte.

Upstream: ``flodl/src/distributed/relay/mux.rs`` (``bincode::serde::encode_to_vec`` /
``decode_from_slice`` with ``bincode::config::standard()``, crate ``bincode`` 2).
"""

from __future__ import annotations

from typing import Final

from ..errors import protocol_error
from ..spec import VARINT_SINGLE_BYTE_MAX, VARINT_U16, VARINT_U32, VARINT_U64, VARINT_U128

__all__ = ["BincodeReader", "encode_bytes_fixed", "encode_string", "encode_varint"]

_WIDTH_NAME: Final = {16: "U16", 32: "U32", 64: "U64", 128: "U128"}
_MARKER_WIDTH: Final = {VARINT_U16: 16, VARINT_U32: 32, VARINT_U64: 64, VARINT_U128: 128}


def encode_varint(value: int, bits: int = 64, *, field: str = "value") -> bytes:
    """Encode an unsigned integer as a minimal bincode-2 varint.

    Args:
        value: the integer, ``0 <= value < 2**bits``.
        bits: the Rust type's width (16, 32, 64).
        field: field name for the error message.

    Raises:
        InvalidValue (local): ``value`` does not fit the type.

    Upstream: ``bincode::serde::encode_to_vec`` with ``bincode::config::standard()`` (crate
    ``bincode`` 2), as ``relay/mux.rs`` calls it.
    """
    if not 0 <= value < (1 << bits):
        raise protocol_error("bincode.value_out_of_range", field=field, value=value,
                             type=f"u{bits}")
    if value <= VARINT_SINGLE_BYTE_MAX:
        return bytes((value,))
    if value < 1 << 16:
        return bytes((VARINT_U16,)) + value.to_bytes(2, "little")
    if value < 1 << 32:
        return bytes((VARINT_U32,)) + value.to_bytes(4, "little")
    if value < 1 << 64:
        return bytes((VARINT_U64,)) + value.to_bytes(8, "little")
    return bytes((VARINT_U128,)) + value.to_bytes(16, "little")  # pragma: no cover - u128 unused


def encode_string(text: str) -> bytes:
    """Encode a ``String``: u64-varint byte length, then the UTF-8 bytes.

    Upstream: ``bincode::serde::encode_to_vec`` with ``bincode::config::standard()`` (crate
    ``bincode`` 2), as ``relay/mux.rs`` calls it.
    """
    raw = text.encode("utf-8")
    return encode_varint(len(raw), 64, field="string length") + raw


def encode_bytes_fixed(data: bytes, size: int, *, field: str = "array") -> bytes:
    """Encode a ``[u8; size]`` (raw bytes, no length).

    Raises:
        InvalidValue (local): ``data`` is not exactly ``size`` bytes.

    Upstream: ``bincode::serde::encode_to_vec`` with ``bincode::config::standard()`` (crate
    ``bincode`` 2), as ``relay/mux.rs`` calls it.
    """
    if len(data) != size:
        raise protocol_error("bincode.value_out_of_range", field=field, value=len(data),
                             type=f"[u8; {size}]")
    return bytes(data)


class BincodeReader:
    """Sequential bincode-2 reader over a memoryview.

    Every read names the field it reads so errors say what was being decoded and where.
    Errors (all remote): ``bincode.unexpected_end`` (TruncatedInput),
    ``bincode.invalid_integer_type`` and ``bincode.invalid_utf8`` (InvalidValue).

    Upstream: ``bincode::serde::decode_from_slice`` with ``bincode::config::standard()`` (crate
    ``bincode`` 2), as ``relay/mux.rs`` calls it.
    """

    __slots__ = ("_mv", "pos")

    def __init__(self, data: memoryview) -> None:
        self._mv = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        """Bytes not yet read."""
        return len(self._mv) - self.pos

    def raw(self, n: int, field: str) -> memoryview:
        """Read ``n`` raw bytes."""
        if self.remaining < n:
            raise protocol_error("bincode.unexpected_end", field=field, offset=self.pos,
                                 need=n - self.remaining)
        out = self._mv[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self, field: str) -> int:
        """Read one raw byte."""
        return int(self.raw(1, field)[0])

    def varint(self, bits: int, field: str) -> int:
        """Read an unsigned varint of a ``bits``-wide Rust type (16, 32 or 64)."""
        start = self.pos
        marker = self.u8(field)
        if marker <= VARINT_SINGLE_BYTE_MAX:
            return marker
        width = _MARKER_WIDTH.get(marker)
        if width is None or width > bits:
            self.pos = start
            raise protocol_error(
                "bincode.invalid_integer_type", expected=_WIDTH_NAME[bits],
                found=_WIDTH_NAME.get(width or 0, "Reserved"), field=field, offset=start,
            )
        return int.from_bytes(self.raw(width // 8, field), "little")

    def string(self, field: str) -> str:
        """Read a ``String`` (u64-varint length + UTF-8)."""
        n = self.varint(64, f"{field} length")
        start = self.pos
        raw = self.raw(n, field)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise protocol_error("bincode.invalid_utf8", reason=e.reason, field=field,
                                 offset=start + e.start) from None

    def seq_len(self, field: str) -> int:
        """Read a ``Vec`` length (u64 varint). The caller reads the elements one by one."""
        return self.varint(64, f"{field} length")

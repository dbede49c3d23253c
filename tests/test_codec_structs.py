"""The precompiled struct forms and the codec's shared primitives, against literal expectations.

:func:`packed` and :func:`_field_format` run once at import (building :data:`PACKED`), so these
tests call them directly. The expected formats are written out from the field tables of
``spec/wire.yaml`` (u8 = ``B``, u32 = ``L``, u64 = ``Q``, f64 = ``d``, an 8-byte tag = ``8s``,
all little-endian).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from construct import Array, Bytes, Float64l, Int8ul, Int32ub, Int32ul, Int64ul, Struct, this

from flodl_proto import errors
from flodl_proto.codec import structs
from flodl_proto.codec._common import (
    END_OF_STREAM,
    as_view,
    check_ceiling,
    check_version,
    unviewed,
)
from flodl_proto.codec.structs import _field_format, dims_packed, packed
from flodl_proto.errors import LocalProtocolError


# -- structs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "fmt", "size"), [
    ("HANDSHAKE", "<LLLL", 16),
    ("HANDSHAKE_ACK", "<LL", 8),
    ("CHANNEL_MAGIC", "<L", 4),
    ("ROUND_FRAME_HEADER", "<LL", 8),
    ("ROUND_FRAME_KIND", "<B", 1),
    ("ROUND_FRAME_WEIGHT", "<d", 8),
    ("TENSOR_META", "<BB", 2),
    ("TENSOR_DIM", "<L", 4),
    ("TENSOR_NBYTES", "<Q", 8),
    ("AUTH_TAG", "<8s", 8),
    ("LEN_PREFIX", "<L", 4),
    ("MUX_HEADER", "<LLBLL8s", 25),
])
def test_packed_gives_the_spec_layout(name: str, fmt: str, size: int) -> None:
    st = packed(structs.STRUCTS[name])
    assert st.format == fmt
    assert st.size == size
    assert structs.PACKED[name].format == fmt


def test_packed_mux_header_bytes() -> None:
    st = packed(structs.MUX_HEADER)
    wire = st.pack(0xF10D17D0, 1, 2, 7, 3, b"\x01" * 8)
    assert wire == struct.pack("<IIBII", 0xF10D17D0, 1, 2, 7, 3) + b"\x01" * 8
    assert st.unpack(wire) == (0xF10D17D0, 1, 2, 7, 3, b"\x01" * 8)


@pytest.mark.parametrize(("sub", "fmt"), [
    (Int8ul, "B"), (Int32ul, "L"), (Int64ul, "Q"), (Float64l, "d"), (Bytes(8), "8s"),
    (Bytes(3), "3s"),
])
def test_field_format_of_each_wire_type(sub: object, fmt: str) -> None:
    assert _field_format(sub) == fmt


def test_field_format_refuses_a_big_endian_field() -> None:
    with pytest.raises(TypeError, match=r"^'>L' is not a little-endian field$"):
        _field_format(Int32ub)


@pytest.mark.parametrize("sub", [Bytes(this.n), Array(3, Int8ul), Struct("a" / Int8ul)],
                         ids=["bytes-of-context-length", "array", "struct"])
def test_field_format_refuses_a_field_without_fixed_format(sub: object) -> None:
    with pytest.raises(TypeError, match=r"^no struct format for "):
        _field_format(sub)


def test_dims_packed() -> None:
    assert dims_packed(0).format == "<"
    assert dims_packed(3).format == "<LLL"
    assert dims_packed(2).pack(5, 2**32 - 1) == struct.pack("<II", 5, 2**32 - 1)


# -- _common ---------------------------------------------------------------------------------------
def test_end_of_stream_repr() -> None:
    assert repr(END_OF_STREAM) == "END_OF_STREAM"


def test_as_view_keeps_a_flat_byte_view() -> None:
    mv = memoryview(b"abc")
    assert as_view(mv) is mv
    ba = bytearray(b"xyz")
    got = as_view(ba)
    assert isinstance(got, memoryview) and got.obj is ba and got.format == "B"
    assert bytes(as_view(b"\x01\x02")) == b"\x01\x02"


@pytest.mark.parametrize("make", [
    lambda: memoryview(np.array([1.0, -2.0], dtype="<f4")),
    lambda: memoryview(bytes(range(6))).cast("B", (2, 3)),
    lambda: memoryview(np.array([[1, 2], [3, 4]], dtype="<u2")),
    lambda: memoryview(bytes(range(4))).cast("b"),
], ids=["f32", "byte-2d", "u16-2d", "signed-bytes"])
def test_as_view_casts_other_formats_to_flat_unsigned_bytes(make: object) -> None:
    src = make()  # type: ignore[operator]
    got = as_view(src)
    assert got.format == "B" and got.ndim == 1
    assert got.nbytes == src.nbytes
    assert bytes(got) == src.tobytes()
    assert got.obj is src.obj


def test_as_view_refuses_a_strided_buffer() -> None:
    arr = np.arange(8, dtype=np.float32)[::2]
    with pytest.raises(LocalProtocolError, match=r"^data must be a contiguous bytes-like object "
                       r"\(bytes, bytearray or memoryview\), got a non-contiguous memoryview$"):
        as_view(memoryview(arr))
    with pytest.raises(LocalProtocolError,
                       match=r"^payload must be .*, got a non-contiguous ndarray$"):
        as_view(arr, "payload")
    flat = memoryview(np.arange(8, dtype=np.uint8))[::2]  # 1-D, format B, strided
    with pytest.raises(LocalProtocolError, match=r"got a non-contiguous memoryview$"):
        as_view(flat)


@pytest.mark.parametrize("data", [b"", b"\x07", b"\x01\x02\xfe\xff"])
def test_unviewed_is_true_for_a_buffer_no_view_holds_and_leaves_it_as_it_was(data: bytes) -> None:
    buf = bytearray(data)
    assert unviewed(buf) is True
    assert buf == data  # the probe byte is gone, and no byte before it was touched
    mv = memoryview(buf)
    mv.release()
    assert unviewed(buf) is True
    assert buf == data


@pytest.mark.parametrize("hold", [
    memoryview,
    lambda b: memoryview(b)[1:3],  # a slice keeps the whole buffer's export
    lambda b: np.frombuffer(b, dtype=np.uint8),
], ids=["memoryview", "slice", "numpy"])
def test_unviewed_is_false_while_a_view_is_alive(hold: object) -> None:
    buf = bytearray(b"\x01\x02\x03\x04")
    view = hold(buf)  # type: ignore[operator]
    assert unviewed(buf) is False
    assert buf == b"\x01\x02\x03\x04"
    del view
    assert unviewed(buf) is True
    assert buf == b"\x01\x02\x03\x04"


@pytest.mark.parametrize("ceiling", [0, 1, 1 << 30, 1 << 40])
def test_check_ceiling_accepts_non_negative_ints(ceiling: int) -> None:
    assert check_ceiling(ceiling) == ceiling


@pytest.mark.parametrize("ceiling", [-1, 1.5, 0.0, "5", True, False, None])
def test_check_ceiling_refuses(ceiling: object) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        check_ceiling(ceiling)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == "ceiling.invalid"
    assert ei.value.fields == {"value": ceiling}
    assert str(ei.value) == f"frame ceiling must be a non-negative number of bytes, got {ceiling!r}"


@pytest.mark.parametrize("version", [2, 3])
def test_check_version_accepts_supported(version: int) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize("version", [0, 1, 4])
def test_check_version_refuses(version: int) -> None:
    with pytest.raises(errors.VersionMismatch) as ei:
        check_version(version)
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == "version.unsupported"
    assert ei.value.fields == {"got": version, "supported": [2, 3]}
    assert str(ei.value) == f"protocol version {version} is not supported (supported: [2, 3])"

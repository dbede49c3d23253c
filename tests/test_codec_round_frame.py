"""RoundFrame and TensorPayload against frames built by hand from ``spec/wire.yaml``.

Layout (``messages.round_frame``, little-endian): magic u32 (0xF10D17F1) | num_tensors u32 |
kind u8 | weight f64 | per tensor: dtype u8 | ndim u8 | ndim x u32 | nbytes u64 | data |
tag = HMAC-SHA256(salt, magic .. last data byte)[:8]. Every expected byte string, offset, field
and message below is written out here with :mod:`struct` / :mod:`hmac` and the error catalogue's
templates, never taken from the code under test.
"""

from __future__ import annotations

import copy
import decimal
import fractions
import hashlib
import hmac
import math
import pickle
import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto import errors
from flodl_proto.codec import (
    END_OF_STREAM,
    Dtype,
    FrameTemplate,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    decode_round_frame_or_eos,
    encode_round_frame,
    encode_round_frame_bytes,
    round_frame_extent,
)
from flodl_proto.codec._common import NeedData
from flodl_proto.codec.auth import Premac
from flodl_proto.codec.round_frame import (
    _FrameWalk,
    _rust_f64,
    declared_tensor_count,
    delivered_tensors,
    parse_round_frame,
    parse_round_frame_or_eos,
    round_frame_pieces,
    round_frame_wire_len,
)

MAGIC = 0xF10D17F1
SALT = bytes(range(16))
GIB = 1 << 30


def head(count: int, kind: int = 0, weight: float = 1.0, magic: int = MAGIC) -> bytes:
    """Header, kind byte and weight: 17 bytes."""
    return struct.pack("<IIBd", magic, count, kind, weight)


def tensor(dtype: int, shape: list[int], data: bytes, nbytes: int | None = None) -> bytes:
    """One tensor entry: meta, dims, nbytes (``len(data)`` unless given), data."""
    return (struct.pack("<BB", dtype, len(shape)) + struct.pack(f"<{len(shape)}I", *shape)
            + struct.pack("<Q", len(data) if nbytes is None else nbytes) + data)


def tag(body: bytes, salt: bytes = SALT) -> bytes:
    return hmac.new(salt, body, hashlib.sha256).digest()[:8]


def signed(body: bytes, salt: bytes = SALT) -> bytes:
    return body + tag(body, salt)


def u64(b: bytes) -> int:
    return int.from_bytes(b, "little")


def expect(ei: pytest.ExceptionInfo[Any], kind: type, remote: bool, error_id: str,
           fields: dict[str, Any], message: str) -> None:
    err = ei.value
    assert isinstance(err, kind)
    assert isinstance(err, errors.RemoteProtocolError if remote else errors.LocalProtocolError)
    assert err.remote is remote
    assert err.error_id == error_id
    assert err.fields == fields
    assert str(err) == message


# The reference frame: Control, weight 2.0, tensor 0 = f32 [2] (8 bytes), tensor 1 = bf16 [3]
# (6 bytes). Offsets: kind 8, weight 9, t0 meta 17, dims 19, nbytes 23, data 31..39; t1 meta 39,
# dims 41, nbytes 45, data 53..59; footer 59..67.
T0 = struct.pack("<2f", 1.5, -2.0)
T1 = bytes([0x80, 0x3F, 0x00, 0x40, 0x00, 0xC0])  # bf16 1.0, 2.0, -2.0
BODY = head(2, 1, 2.0) + tensor(0, [2], T0) + tensor(1, [3], T1)
WIRE = signed(BODY)
# the smallest total length needed at each stage: header, kind, weight, t0 meta/dims/nbytes/data,
# t1 meta/dims/nbytes/data, footer
STEPS = [8, 9, 17, 19, 23, 31, 39, 41, 45, 53, 59, 67]


def test_reference_frame_offsets() -> None:
    assert len(BODY) == 59 and len(WIRE) == 67


# -- enums -----------------------------------------------------------------------------------------
def test_enums() -> None:
    assert RoundKind.MODEL.label == "Model" and RoundKind.CONTROL.label == "Control"
    assert (int(RoundKind.MODEL), int(RoundKind.CONTROL)) == (0, 1)
    assert Dtype.F32.element_size == 4 and Dtype.BF16.element_size == 2
    assert Dtype.F32.numpy == np.dtype("<f4")
    assert Dtype.BF16.numpy == np.dtype(ml_dtypes.bfloat16)


# -- TensorPayload construction --------------------------------------------------------------------
def test_tensor_payload_fields() -> None:
    t = TensorPayload(Dtype.BF16, [np.int64(2), np.uint32(3)], bytearray(12))
    assert type(t.dtype) is int and t.dtype == 1
    assert t.shape == (2, 3) and all(type(d) is int for d in t.shape)
    assert isinstance(t.data, memoryview) and t.data.format == "B" and t.nbytes == 12
    g = TensorPayload(255, (d for d in [4]), b"ab")
    assert g.dtype == 255 and g.shape == (4,) and bytes(g.data) == b"ab"
    e = TensorPayload(0, [])
    assert e.shape == () and e.nbytes == 0 and bytes(e.data) == b""


def test_tensor_payload_bounds_accepted() -> None:
    t = TensorPayload(0, [1] * 255 + [], b"")
    assert t.ndim == 255
    assert TensorPayload(0, [0, 2**32 - 1]).shape == (0, 2**32 - 1)


@pytest.mark.parametrize("dtype", [-1, 256, 1000])
def test_tensor_payload_bad_dtype(dtype: int) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(dtype, [1], b"")
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "dtype", "value": dtype, "reason": "not a u8"},
           f"round_frame: dtype = {dtype} is invalid: not a u8")


@pytest.mark.parametrize("dtype", [True, False, np.True_, 1.0, 2.5, np.float32(1)])
def test_tensor_payload_dtype_must_be_an_integer(dtype: Any) -> None:
    """A bool or float dtype tag is refused, never taken as 1 / 0 or truncated."""
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(dtype, [1], b"")
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "dtype", "value": dtype, "reason": "not a u8"},
           f"round_frame: dtype = {dtype!r} is invalid: not a u8")


@pytest.mark.parametrize(("dtype", "got"), [
    ("f32", "str"), ("1", "str"), (None, "None"), (b"\x00", "bytes"), ([0], "list")])
def test_tensor_payload_dtype_that_is_no_number_is_a_type_error(dtype: Any, got: str) -> None:
    """A dtype tag given as text ("f32") or another non-number is the wrong type of argument,
    as a shape given as text is: it read ``dtype = 'f32' is invalid: not a u8``."""
    expected = "a wire dtype tag (an integer 0..255: 0 f32, 1 bf16)"
    for build in (lambda: TensorPayload(dtype, [1], bytes(4)),
                  lambda: TensorPayload.elide(dtype, [1])):
        with pytest.raises(errors.InvalidValue) as ei:
            build()
        expect(ei, errors.InvalidValue, False, "frame.bad_type",
               {"field": "dtype", "expected": expected, "got": got},
               f"round_frame: dtype must be {expected}, got {got}")


@pytest.mark.parametrize(("shape", "dim"), [
    ([2.5], 0), ([3, 2.0], 1), ([True], 0), ([2, np.False_], 1), ([np.float32(4)], 0),
    ([np.array(2.0)], 0)])
def test_tensor_payload_dim_must_be_an_integer(shape: list[Any], dim: int) -> None:
    """A float dim is refused, never truncated (2.5 is not a 2-element tensor), and a bool dim
    is not 1 / 0; NumPy integer dims are integers."""
    value = shape[dim]
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(0, shape, bytes(8))
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": f"shape[{dim}]", "value": value, "reason": "not an integer"},
           f"round_frame: shape[{dim}] = {value!r} is invalid: not an integer")
    assert TensorPayload(0, [np.int32(2)], bytes(8)).shape == (2,)


@pytest.mark.parametrize(("shape", "dim", "got"), [
    (["3"], 0, "str"), ([2, None], 1, "None"), ([b"\x02"], 0, "bytes"),
    ([np.str_("3")], 0, "str_"), ([2, [3]], 1, "list")])
def test_tensor_payload_dim_that_is_no_number_is_a_type_error(shape: list[Any], dim: int,
                                                              got: str) -> None:
    """A dim given as text ("3"), bytes or None is the wrong type of argument, as a dtype tag
    given as text is: it read ``shape[0] = '3' is invalid: not an integer``."""
    expected = "a dim (an integer 0..2**32-1)"
    for build in (lambda: TensorPayload(0, shape, bytes(8)),
                  lambda: TensorPayload.elide(0, shape)):
        with pytest.raises(errors.InvalidValue) as ei:
            build()
        expect(ei, errors.InvalidValue, False, "frame.bad_type",
               {"field": f"shape[{dim}]", "expected": expected, "got": got},
               f"round_frame: shape[{dim}] must be {expected}, got {got}")


def test_tensor_payload_shape_must_be_a_sequence() -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(0, 3, b"")  # type: ignore[arg-type]
    expect(ei, errors.InvalidValue, False, "frame.bad_type",
           {"field": "shape", "expected": "a sequence of ints", "got": "int"},
           "round_frame: shape must be a sequence of ints, got int")
    # text: its first character was named as the dim at fault, and 256 characters as too
    # many dimensions
    for text in ("12", "1" * 256):
        with pytest.raises(errors.InvalidValue) as ei:
            TensorPayload(0, text, b"")  # type: ignore[arg-type]
        expect(ei, errors.InvalidValue, False, "frame.bad_type",
               {"field": "shape", "expected": "a sequence of ints (text is none)", "got": "str"},
               "round_frame: shape must be a sequence of ints (text is none), got str")


@pytest.mark.parametrize("given", [b"\x02", bytearray(b"\x02"), memoryview(b"\x02")])
def test_tensor_payload_shape_of_bytes_is_refused(given: Any) -> None:
    """A bytes-like shape was iterated to its byte values: b"\\x02" was taken as (2,)."""
    reason = ("not a sequence of ints (bytes are none: each byte would be taken as a dim; pass "
              "a tuple of ints)")
    for build in (lambda: TensorPayload(0, given, bytes(8)), lambda: TensorPayload.elide(0, given)):
        with pytest.raises(errors.InvalidValue) as ei:
            build()
        expect(ei, errors.InvalidValue, False, "frame.bad_field",
               {"field": "shape", "value": b"\x02", "reason": reason},
               f"round_frame: shape = b'\\x02' is invalid: {reason}")
    assert TensorPayload(0, [2], bytes(8)).shape == (2,)  # a list of ints is a shape


@pytest.mark.parametrize(("given", "got"), [({3, 2}, "set"), (frozenset({2}), "frozenset"),
                                            ({2: 1}, "dict")])
def test_tensor_payload_shape_of_a_set_or_dict_is_refused(given: Any, got: str) -> None:
    """A set or dict has no order of dims: {3, 2} was taken as the shape (2, 3), {2: 1} as
    (2,)."""
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(0, given, bytes(24))
    expect(ei, errors.InvalidValue, False, "frame.bad_type",
           {"field": "shape", "expected": "a sequence of ints (a set or dict has no order)",
            "got": got},
           f"round_frame: shape must be a sequence of ints (a set or dict has no order), got {got}")


def test_tensor_payload_too_many_dims() -> None:
    """A tensor does not know its place in a frame: the error names no tensor index (it said
    tensor[0] whatever the tensor)."""
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(0, [1] * 256, b"")
    expect(ei, errors.InvalidValue, False, "tensor.too_many_dims",
           {"ndim": 256, "max": 255},
           "round_frame: tensor has 256 dimensions; the u8 ndim field carries at most 255")


def _gen(n: int) -> Any:
    return (1 for _ in range(n))


# every way a caller gives a payload's shape: MAX_NDIM (255) dims are taken, one more is
# refused with tensor.too_many_dims naming the count, before the dims are held (a range of
# 10**12 dims or a generator that never ends included); a shape whose length is not known
# ahead is named "more than 255" once its 256th dim is drawn
@pytest.mark.parametrize(("build", "ndim"), [
    (lambda: TensorPayload(0, [1] * 256, bytes(4)), 256),
    (lambda: TensorPayload(0, (1,) * 256, bytes(4)), 256),
    (lambda: TensorPayload(0, np.ones(256, np.int64), bytes(4)), 256),
    (lambda: TensorPayload(0, range(10**12), b""), 10**12),
    (lambda: TensorPayload(0, range(2**64), b""), "more than 255"),  # len() overflows
    (lambda: TensorPayload(0, _gen(256), bytes(4)), "more than 255"),
    (lambda: TensorPayload(0, iter(int, 1), b""), "more than 255"),  # never ends
    (lambda: TensorPayload.elide(1, [1] * 300), 300),
    # a copy or an unpickled payload is built by the constructor: refused as the caller's
    (lambda: copy.copy(TensorPayload.trusted(0, (1,) * 256, memoryview(b""))), 256),
    (lambda: pickle.loads(pickle.dumps(TensorPayload.trusted(0, (1,) * 256, memoryview(b"")))),
     256),
], ids=["list", "tuple", "ndarray", "range", "range-past-ssize", "generator", "endless",
        "elide", "copy", "pickle"])
def test_every_caller_shape_over_max_ndim_is_refused(build: Any, ndim: int | str) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        build()
    expect(ei, errors.InvalidValue, False, "tensor.too_many_dims", {"ndim": ndim, "max": 255},
           f"round_frame: tensor has {ndim} dimensions; the u8 ndim field carries at most 255")


@pytest.mark.parametrize("shape", [[1] * 255, (1,) * 255, range(1, 256), _gen(255),
                                   np.ones(255, np.int64)],
                         ids=["list", "tuple", "range", "generator", "ndarray"])
def test_a_caller_shape_of_max_ndim_is_taken(shape: Any) -> None:
    p = TensorPayload(0, shape, b"")
    assert p.ndim == 255 and p.shape[:2] in ((1, 1), (1, 2)) and len(p.shape) == 255


def test_a_peer_shape_cannot_pass_max_ndim() -> None:
    """The wire's ndim field is one byte: its largest value, 255, is MAX_NDIM, and a frame of
    255 dims decodes as a frame, a HostFrame or a Broadcast (upstream reads any u8), so a shape
    from a peer never has more dims than a caller's may."""
    from flodl_proto.codec.mux import MuxRecord, decode_mux_record, encode_mux_record_bytes
    from flodl_proto.spec import MAX_NDIM
    assert MAX_NDIM == 0xFF
    wire = signed(head(1) + tensor(0, [1] * 255, bytes(4)))
    assert wire[18] == 0xFF  # the tensor's ndim byte
    frame, _ = decode_round_frame(wire, SALT)
    assert frame.tensors[0].shape == (1,) * 255
    for rec in (MuxRecord.host_frame(wire), MuxRecord.broadcast(wire)):
        got, _ = decode_mux_record(encode_mux_record_bytes(rec, SALT), SALT)
        assert got.frame(SALT).tensors[0].shape == (1,) * 255


@pytest.mark.parametrize(("shape", "dim", "value"), [
    ([2, -1], 1, -1), ([2**32], 0, 2**32), ([1, 1, 2**40], 2, 2**40), ([3, 2**32, 5], 1, 2**32)])
def test_tensor_payload_dim_out_of_u32(shape: list[int], dim: int, value: int) -> None:
    """The error names the offending dimension's index and value, and no tensor index (it said
    tensor[0] whatever the tensor)."""
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload(0, shape, b"")
    expect(ei, errors.InvalidValue, False, "tensor.dim_too_large", {"dim": dim, "value": value},
           f"round_frame: tensor dim[{dim}] = {value} doesn't fit in u32")


def test_tensor_payload_properties() -> None:
    t = TensorPayload(0, [2, 3], bytes(24))
    assert (t.nbytes, t.ndim, t.numel, t.elided, t.element_size, t.expected_nbytes) == (
        24, 2, 6, False, 4, 24)
    b = TensorPayload(1, [2, 3, 4], b"")
    assert (b.nbytes, b.ndim, b.numel, b.elided, b.element_size, b.expected_nbytes) == (
        0, 3, 24, True, 2, 48)
    s = TensorPayload(9, [], b"xyz")
    assert (s.nbytes, s.ndim, s.numel, s.elided, s.element_size, s.expected_nbytes) == (
        3, 0, 1, False, None, None)
    z = TensorPayload(0, [5, 0, 7], b"")
    assert (z.numel, z.elided, z.expected_nbytes) == (0, True, 0)
    assert TensorPayload(0, [7]).numel == 7


def test_elide() -> None:
    t = TensorPayload.elide(Dtype.BF16, [3, 2])
    assert type(t.dtype) is int and t.dtype == 1 and t.shape == (3, 2)
    assert t.nbytes == 0 and bytes(t.data) == b"" and t.elided


@pytest.mark.parametrize(("payload", "text"), [
    (TensorPayload(1, (2, 3), bytes(12)), "TensorPayload(dtype=bf16, shape=(2, 3), nbytes=12)"),
    (TensorPayload(0, [4], bytes(16)), "TensorPayload(dtype=f32, shape=(4,), nbytes=16)"),
    (TensorPayload.elide(0, [5]), "TensorPayload(dtype=f32, shape=(5,), nbytes=0)"),
    (TensorPayload(0, [], b"\x01\x02\x03\x04"), "TensorPayload(dtype=f32, shape=(), nbytes=4)"),
    (TensorPayload(7, [2], b"ab"), "TensorPayload(dtype=7, shape=(2,), nbytes=2)"),
], ids=["bf16", "f32", "elided", "0-d", "unknown-tag"])
def test_repr(payload: TensorPayload, text: str) -> None:
    """The shape was shown as a list ('shape=[2, 3]') and the dtype as its tag ('dtype=1'):
    the shape is a tuple, as the attribute is, and a known dtype is named as the spec names
    it; an unknown tag is shown as its number; the data bytes never are."""
    assert repr(payload) == str(payload) == text
    assert repr(RoundFrame(0, 1.0, [payload])).endswith(f"tensors=({text},))")


@pytest.mark.parametrize(("shape", "text"), [
    ((2, 3, 4, 5, 6, 7, 8, 9), "(2, 3, 4, 5, 6, 7, 8, 9)"),
    ((2, 3, 4, 5, 6, 7, 8, 9, 10), "(2, 3, 4, ..., 9, 10) (9 dims)"),
    ((2, 3, 4) + (1,) * 252, "(2, 3, 4, ..., 1, 1) (255 dims)"),
], ids=["8-dims", "9-dims", "255-dims"])
def test_repr_of_many_dims(shape: tuple[int, ...], text: str) -> None:
    """A payload of 255 dims was shown with every dim (a repr of 789 characters): a shape of
    more than 8 dims is shown by its first 3 and last 2 and its count of dims."""
    payload = TensorPayload.elide(1, shape)
    assert repr(payload) == f"TensorPayload(dtype=bf16, shape={text}, nbytes=0)"


def test_round_frame_repr_names_its_kind() -> None:
    """The kind was shown as Python's enum repr ('kind=<RoundKind.MODEL: 0>'): it is named as
    the class and the member are ('kind=RoundKind.MODEL')."""
    t = TensorPayload(1, (2, 3), bytes(12))
    assert repr(RoundFrame(0, 1.0, [t])) == (
        "RoundFrame(kind=RoundKind.MODEL, weight=1.0, "
        "tensors=(TensorPayload(dtype=bf16, shape=(2, 3), nbytes=12),))")
    assert repr(RoundFrame(1, 0.5)) == str(RoundFrame(1, 0.5)) == (
        "RoundFrame(kind=RoundKind.CONTROL, weight=0.5, tensors=())")


def test_round_frame_repr_of_many_tensors() -> None:
    """A frame of many tensors was shown with every one (a repr of 48,054 characters for
    1,000 tensors, about 3 MB at the cap of 65,536): a frame of more than 8 tensors is shown by
    its first 3 and last 2 and its count of tensors, as a shape of many dims is."""
    ts = [TensorPayload(1, (i,), bytes(2 * i)) for i in range(1000)]
    shown = [f"TensorPayload(dtype=bf16, shape=({i},), nbytes={2 * i})" for i in range(1000)]
    assert repr(RoundFrame(0, 1.0, ts[:8])) == (
        f"RoundFrame(kind=RoundKind.MODEL, weight=1.0, tensors=({', '.join(shown[:8])}))")
    assert repr(RoundFrame(0, 1.0, ts[:9])) == (
        f"RoundFrame(kind=RoundKind.MODEL, weight=1.0, tensors=({', '.join(shown[:3])}, ..., "
        f"{shown[7]}, {shown[8]}) (9 tensors))")
    assert repr(RoundFrame(1, 2.5, ts)) == (
        f"RoundFrame(kind=RoundKind.CONTROL, weight=2.5, tensors=({', '.join(shown[:3])}, ..., "
        f"{shown[998]}, {shown[999]}) (1000 tensors))")


# -- from_array ----------------------------------------------------------------------------------
def test_from_array_f32_is_a_view() -> None:
    arr = np.array([[1.0, -2.5], [3.0, 0.5]], dtype="<f4")
    t = TensorPayload.from_array(arr)
    assert t.dtype == 0 and type(t.dtype) is int and t.shape == (2, 2)
    assert bytes(t.data) == struct.pack("<4f", 1.0, -2.5, 3.0, 0.5)
    assert t.data.format == "B" and t.data.ndim == 1
    assert np.shares_memory(np.frombuffer(t.data, np.uint8), arr)


def test_from_array_bf16() -> None:
    arr = np.array([1.0, 2.0, -2.0], dtype=ml_dtypes.bfloat16)
    t = TensorPayload.from_array(arr)
    assert t.dtype == 1 and t.shape == (3,) and bytes(t.data) == T1


@pytest.mark.parametrize(("values", "np_dtype"), [
    ([1.5, -2.0, 3.0], "<f8"), ([1, -2, 3], "<i8"), ([1, 2, 3], "<u2"), ([1.5, -2.0, 3.0], ">f4"),
    ([True, False, True], "?"),
])
def test_from_array_casts_real_dtypes_to_f32(values: list[Any], np_dtype: str) -> None:
    t = TensorPayload.from_array(np.array(values, dtype=np_dtype))
    assert t.dtype == 0 and t.shape == (3,)
    assert bytes(t.data) == struct.pack("<3f", *[float(v) for v in values])


def test_from_array_explicit_dtype_casts() -> None:
    t = TensorPayload.from_array(np.array([1.0, 2.0, -2.0], dtype="<f4"), Dtype.BF16)
    assert t.dtype == 1 and bytes(t.data) == T1
    u = TensorPayload.from_array(np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16), dtype=0)
    assert u.dtype == 0 and bytes(u.data) == struct.pack("<2f", 1.5, -2.0)


def test_from_array_scalar_strided_and_empty() -> None:
    s = TensorPayload.from_array(np.float32(2.5))
    assert s.shape == () and bytes(s.data) == struct.pack("<f", 2.5)
    st = TensorPayload.from_array(np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::2])
    assert st.shape == (2, 2) and bytes(st.data) == struct.pack("<4f", 0, 2, 4, 6)
    e = TensorPayload.from_array(np.zeros((2, 0), np.float32))
    assert e.shape == (2, 0) and e.nbytes == 0
    lst = TensorPayload.from_array([[1, 2, 3]])
    assert lst.shape == (1, 3) and bytes(lst.data) == struct.pack("<3f", 1, 2, 3)


@pytest.mark.parametrize(("array", "name"), [
    (np.array([1j]), "complex128"), (np.array(["a"]), "<U1"), (np.array([None]), "object"),
])
def test_from_array_refuses_non_real(array: Any, name: str) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(array)
    reason = "only real numbers (f32, bf16, or a real dtype to cast) can ride as f32 / bf16"
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "array dtype", "value": name, "reason": reason},
           f"round_frame: array dtype = {name!r} is invalid: {reason}")


@pytest.mark.parametrize(("array", "name"), [
    ([[1.0, 2.0], [3.0]], "list"), (([1], [2, 3]), "tuple"),
])
def test_from_array_refuses_ragged_rows(array: Any, name: str) -> None:
    # NumPy makes no array of ragged rows: a typed error naming the argument, not NumPy's own
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(array)
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == "frame.bad_type"
    assert str(ei.value).startswith(
        f"round_frame: array must be an array of numbers, got {name} (NumPy makes no array of "
        "it: setting an array element with a sequence.")


@pytest.mark.parametrize("dtype", [True, 1.0])  # True and 1.0 were bf16
def test_from_array_dtype_that_is_no_integer(dtype: Any) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(np.zeros(2, np.float32), dtype)
    reason = "not an integer wire dtype tag (Dtype.F32, Dtype.BF16)"
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "dtype", "value": dtype, "reason": reason},
           f"round_frame: dtype = {dtype!r} is invalid: {reason}")


@pytest.mark.parametrize("dtype", ["1", "bf16"])
def test_from_array_dtype_given_as_text_is_a_type_error(dtype: str) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(np.zeros(2, np.float32), dtype)  # type: ignore[arg-type]
    expected = "an integer wire dtype tag (Dtype.F32, Dtype.BF16)"
    expect(ei, errors.InvalidValue, False, "frame.bad_type",
           {"field": "dtype", "expected": expected, "got": "str"},
           f"round_frame: dtype must be {expected}, got str")


@pytest.mark.parametrize("dtype", [2, 7, 255, np.int64(9)])
def test_from_array_unknown_dtype(dtype: int) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(np.zeros(2, np.float32), dtype)
    expect(ei, errors.InvalidValue, False, "payload.unknown_dtype", {"dtype": dtype},
           f"unsupported wire dtype tag {dtype} (0 = f32, 1 = bf16); extend "
           "round_frame.rs::payload_element_size and the codec helpers together")


@pytest.mark.filterwarnings("error")  # refused without NumPy's overflow warning
@pytest.mark.parametrize(("array", "dtype", "index", "value", "name"), [
    (np.array([1e300, 1.0]), None, 0, 1e300, "f32"),
    (np.array([[1.0, -1e39]]), Dtype.BF16, 1, -1e39, "bf16"),
    (np.array([1.0, 3.4e38], np.float32), Dtype.BF16, 1, float(np.float32(3.4e38)), "bf16"),
])
def test_from_array_refuses_a_finite_value_the_cast_makes_infinite(
        array: Any, dtype: Any, index: int, value: float, name: str) -> None:
    """A float64 1e300 rode as f32 +inf, with NumPy's overflow warning pointing into the codec."""
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(array, dtype)
    reason = f"finite, but beyond the {name} range: it would ride as an infinity"
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": f"array (flat index {index})", "value": value, "reason": reason},
           f"round_frame: array (flat index {index}) = {value!r} is invalid: {reason}")
    # a long double beyond even f64's range shows as its own text, not as inf
    with pytest.raises(errors.InvalidValue) as ei:
        TensorPayload.from_array(np.array([np.longdouble("1e4000")]), dtype)
    assert str(ei.value).startswith("round_frame: array (flat index 0) = '1e+4000' is invalid")
    # infinities and NaNs that are already there ride as they are
    p = TensorPayload.from_array(np.array([np.inf, -np.inf, np.nan, 2.0**70]), dtype)
    got = p.array().astype(np.float64)
    assert list(got[:2]) == [np.inf, -np.inf] and np.isnan(got[2]) and got[3] == 2.0**70


# -- array -----------------------------------------------------------------------------------------
def test_array_f32_is_a_read_only_view() -> None:
    buf = bytearray(struct.pack("<6f", 0, 1, 2, 3, 4, 5.5))
    t = TensorPayload(0, [2, 3], buf)
    a = t.array()
    assert a.dtype == np.dtype("<f4") and a.shape == (2, 3)
    assert a.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.5]]
    assert not a.flags.writeable
    assert np.shares_memory(a, np.frombuffer(buf, np.uint8))


def test_array_bf16() -> None:
    a = TensorPayload(1, [3], bytearray(T1)).array()
    assert a.dtype == np.dtype(ml_dtypes.bfloat16) and a.shape == (3,)
    assert a.astype(np.float32).tolist() == [1.0, 2.0, -2.0]
    assert not a.flags.writeable


def test_array_zero_element_shapes() -> None:
    a = TensorPayload(0, [2, 0], b"").array()
    assert a.shape == (2, 0) and a.dtype == np.dtype("<f4")
    s = TensorPayload(1, [], b"\x80\x3f").array()
    assert s.shape == () and float(s) == 1.0


@pytest.mark.parametrize("dtype", [2, 9, 255])
def test_array_of_an_unknown_dtype_the_caller_built_is_local(dtype: int) -> None:
    """A payload built here with a tag that has no view: the caller's misuse, in the caller's
    words (it was the remote error, telling to extend the Rust source)."""
    received = TensorPayload.trusted(dtype, (2,), memoryview(bytes(8)))
    for made in (TensorPayload(dtype, [2], bytes(8)), TensorPayload.elide(dtype, [2]),
                 copy.copy(received)):  # a copy is built by the constructor
        with pytest.raises(errors.InvalidValue) as ei:
            made.array(materialize_elided=True)
        expect(ei, errors.InvalidValue, False, "tensor.unknown_dtype_local", {"dtype": dtype},
               f"TensorPayload.array: dtype = {dtype} has no array view: only 0 (f32) and 1 "
               "(bf16) have one; a payload of any other dtype tag carries its bytes as given "
               "(read them from .data)")


@pytest.mark.parametrize("dtype", [2, 9, 255])
def test_array_of_an_unknown_dtype_from_a_peer_is_remote(dtype: int) -> None:
    """The same payload read from a peer's bytes keeps upstream's remote error."""
    wire = signed(head(1) + tensor(dtype, [2], bytes(8)))
    frame, _ = decode_round_frame(wire, SALT)
    [received] = frame.tensors
    assert received == TensorPayload(dtype, [2], bytes(8))  # equal, whoever built it
    trusted = TensorPayload.trusted(dtype, (2,), memoryview(bytes(8)))
    for got in (received, trusted):
        with pytest.raises(errors.InvalidValue) as ei:
            got.array(materialize_elided=True)
        expect(ei, errors.InvalidValue, True, "tensor.unknown_dtype", {"dtype": dtype},
               f"unsupported wire dtype tag {dtype} (0 = f32, 1 = bf16); extend "
               "round_frame.rs::payload_element_size and the codec helpers together")


@pytest.mark.parametrize(("dtype", "shape", "n", "expected", "materialize"), [
    (0, [3], 8, 12, False), (0, [3], 8, 12, True), (1, [2, 2], 16, 8, True),
])
def test_array_byte_count_must_match_the_shape(dtype: int, shape: list[int], n: int,
                                               expected: int, materialize: bool) -> None:
    """A payload the caller built with a byte count its shape does not take: the caller's
    misuse, in the caller's words (it was the remote error, the peer's fault)."""
    es = 4 if dtype == 0 else 2
    made = TensorPayload(dtype, shape, bytes(n))
    for payload in (made, copy.copy(made), pickle.loads(pickle.dumps(made))):
        with pytest.raises(errors.SchemaMismatch) as ei:
            payload.array(materialize_elided=materialize)
        expect(ei, errors.SchemaMismatch, False, "tensor.nbytes_vs_shape_local",
               {"shape": shape, "dtype": dtype, "element_size": es, "expected": expected,
                "got": n},
               f"TensorPayload.array: shape {shape} dtype {dtype} ({es} bytes per element) "
               f"needs numel*element_size {expected} payload bytes, got {n}; a payload built "
               "with another byte count carries its bytes as given (read them from .data)")


@pytest.mark.parametrize(("dtype", "shape", "n", "expected", "materialize"), [
    (0, [3], 8, 12, False), (0, [3], 8, 12, True), (1, [2, 2], 16, 8, True),
])
def test_array_byte_count_from_a_peer_is_remote(dtype: int, shape: list[int], n: int,
                                                expected: int, materialize: bool) -> None:
    """The same payload read from a peer's bytes keeps upstream's remote error."""
    frame, _ = decode_round_frame(signed(head(1) + tensor(dtype, shape, bytes(n))), SALT)
    [received] = frame.tensors
    trusted = TensorPayload.trusted(dtype, tuple(shape), memoryview(bytes(n)))
    for got in (received, trusted):
        with pytest.raises(errors.SchemaMismatch) as ei:
            got.array(materialize_elided=materialize)
        expect(ei, errors.SchemaMismatch, True, "tensor.nbytes_vs_shape",
               {"shape": shape, "expected": expected, "got": n},
               f"tensor shape {shape} numel*element_size {expected} != nbytes {n}")


@pytest.mark.parametrize(("dtype", "shape", "expected"), [
    (0, [2], 8), (0, [2, 3], 24), (1, [5], 10), (0, [], 4)])
def test_array_does_not_materialise_by_default(dtype: int, shape: list[int],
                                               expected: int) -> None:
    """An elided payload read "numel*element_size 8 != nbytes 0", a remote error, with no word of
    the option that gives its zeros."""
    with pytest.raises(errors.SchemaMismatch) as ei:
        TensorPayload.elide(dtype, shape).array()
    expect(ei, errors.SchemaMismatch, False, "tensor.elided",
           {"shape": shape, "expected": expected},
           f"tensor shape {shape} is zero-elided (0 payload bytes for {expected}; legal at "
           "protocol version 3 only, the version 2 fold rejects it): pass "
           "materialize_elided=True for its zeros")


def test_array_materialises_elided_zeros() -> None:
    z = TensorPayload.elide(0, [2, 3]).array(materialize_elided=True)
    assert z.dtype == np.dtype("<f4") and z.shape == (2, 3) and not z.any()
    b = TensorPayload.elide(1, [4]).array(materialize_elided=True, ceiling=8)
    assert b.dtype == np.dtype(ml_dtypes.bfloat16) and b.shape == (4,) and not b.any()
    d = TensorPayload.elide(0, [1] * 64).array(materialize_elided=True, ceiling=4)
    assert d.shape == (1,) * 64


def test_array_materialise_refused_above_the_ceiling() -> None:
    with pytest.raises(errors.LimitExceeded) as ei:
        TensorPayload.elide(1, [4]).array(materialize_elided=True, ceiling=7)
    expect(ei, errors.LimitExceeded, False, "tensor.elided_too_large",
           {"shape": [4], "nbytes": 8, "ceiling": 7},
           "tensor shape [4] would materialise 8 bytes of zeros, above the frame ceiling 7")
    with pytest.raises(errors.LimitExceeded) as ei:
        TensorPayload.elide(0, [GIB // 4 + 1]).array(materialize_elided=True)
    assert ei.value.fields == {"shape": [GIB // 4 + 1], "nbytes": GIB + 4, "ceiling": GIB}


def test_array_too_many_dims_for_numpy() -> None:
    for t in (TensorPayload(0, [1] * 65, bytes(4)), TensorPayload.elide(0, [1] * 65)):
        with pytest.raises(errors.InvalidValue) as ei:
            t.array(materialize_elided=True)
        expect(ei, errors.InvalidValue, False, "tensor.ndim_unsupported",
               {"where": "TensorPayload.array", "ndim": 65, "max": 64},
               "TensorPayload.array: tensor has 65 dimensions; NumPy arrays carry at most 64 "
               "(use the raw payload bytes)")
    assert TensorPayload(0, [1] * 64, bytes(4)).array().shape == (1,) * 64


@pytest.mark.parametrize(("shape", "data", "kwargs"), [
    ([0] + [2**32 - 1] * 3, b"", {}),
    ([2**32 - 1] * 4, b"", {"materialize_elided": True, "ceiling": 1 << 200}),
], ids=["zero-numel", "elided"])
def test_array_shape_unrepresentable(shape: list[int], data: bytes, kwargs: dict[str, Any]) -> None:
    """The caller's payload is the caller's error (it was the remote one, as if a peer had
    sent it); a payload a reader built keeps the remote error."""
    with pytest.raises(errors.LimitExceeded) as ei:
        TensorPayload(0, shape, data).array(**kwargs)
    expect(ei, errors.LimitExceeded, False, "tensor.shape_unrepresentable_local",
           {"where": "TensorPayload.array", "shape": shape},
           f"TensorPayload.array: tensor shape {shape} cannot be represented as a NumPy array "
           "(dimensions overflow its index type)")
    wire = encode_round_frame_bytes(
        RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, shape, data)]), SALT)
    [read] = decode_round_frame(wire, SALT)[0].tensors
    for peers in (read, TensorPayload.trusted(0, tuple(shape), memoryview(data))):
        with pytest.raises(errors.LimitExceeded) as ei:
            peers.array(**kwargs)
        expect(ei, errors.LimitExceeded, True, "tensor.shape_unrepresentable", {"shape": shape},
               f"tensor shape {shape} cannot be represented as a NumPy array (dimensions "
               "overflow its index type)")


# -- equality ------------------------------------------------------------------------------------
def test_tensor_payload_equality() -> None:
    t = TensorPayload(0, [2], bytes(T0))
    assert t == TensorPayload(0, (2,), bytearray(T0))
    assert t != TensorPayload(1, [2], T0)
    assert t != TensorPayload(0, [1, 2], T0)
    assert t != TensorPayload(0, [2], T0[:-1] + b"\x00")
    assert t.__eq__(T0) is NotImplemented
    with pytest.raises(TypeError):
        hash(t)


def test_round_frame_equality() -> None:
    t = TensorPayload(0, [2], T0)
    f = RoundFrame(RoundKind.MODEL, 1.0, [t])
    assert f == RoundFrame(0, 1, [TensorPayload(0, [2], bytearray(T0))])
    assert f != RoundFrame(RoundKind.CONTROL, 1.0, [t])
    assert f != RoundFrame(RoundKind.MODEL, 1.5, [t])
    assert f != RoundFrame(RoundKind.MODEL, 1.0, [])
    assert RoundFrame(0, 0.0) != RoundFrame(0, -0.0)
    assert f.__eq__(t) is NotImplemented
    with pytest.raises(TypeError):
        hash(f)


# -- RoundFrame construction ---------------------------------------------------------------------
def test_round_frame_defaults_and_coercion() -> None:
    d = RoundFrame()
    assert d.kind is RoundKind.MODEL and d.weight == 1.0 and d.tensors == ()
    f = RoundFrame(1, np.float32(0.5), (t for t in [TensorPayload(0, [])]))
    assert f.kind is RoundKind.CONTROL and type(f.weight) is float and f.weight == 0.5
    assert f.tensors == (TensorPayload(0, []),) and type(f.tensors) is tuple
    for w, want in ((3, 3.0), (np.int64(7), 7.0), (0.0, 0.0), (5e-324, 5e-324),
                    (1e308, 1e308)):  # a bool is no mass (the codec's integer rule)
        got = RoundFrame(0, w).weight
        assert type(got) is float and got == want
    neg = RoundFrame(0, -0.0).weight
    assert neg == 0.0 and math.copysign(1.0, neg) == -1.0


@pytest.mark.parametrize("kind", [2, -1, 255, "Model", None, True, False, np.True_, 1.0, 0.0])
def test_round_frame_bad_kind(kind: Any) -> None:
    """Only the integers 0 and 1 (or a RoundKind): ``True`` is not Control, ``0.0`` not Model."""
    with pytest.raises(errors.InvalidValue) as ei:
        RoundFrame(kind, 1.0)
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "kind", "value": kind, "reason": "not 0 (Model) or 1 (Control)"},
           f"round_frame: kind = {kind!r} is invalid: not 0 (Model) or 1 (Control)")
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


@pytest.mark.parametrize("weight", ["1", b"1", bytearray(b"1"), None, 1j, [1.0], True,
                                    np.bool_(False)])  # True rode as a mass of 1.0
def test_round_frame_weight_not_a_number(weight: Any) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        RoundFrame(0, weight)
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "weight", "value": weight, "reason": "not a real number"},
           f"round_frame: weight = {weight!r} is invalid: not a real number")


def test_round_frame_weight_of_another_real_type_is_its_nearest_float() -> None:
    """A ``fractions.Fraction`` is a real number (``numbers.Real``): it was refused as 'not a
    real number'; it is taken as the nearest float, as a NumPy scalar is (one beyond the f64
    range as an infinity, so refused as out of range). A ``decimal.Decimal``, which Python's
    numeric tower does not count as real, is still refused."""
    assert RoundFrame(0, fractions.Fraction(1, 3)).weight == 1 / 3
    assert type(RoundFrame(0, fractions.Fraction(6, 2)).weight) is float
    for big, shown in ((fractions.Fraction(10**400), "<a Fraction of 1329 bits over 1 bit>"),
                       (-fractions.Fraction(10**400, 3),
                        "<a negative Fraction of 1329 bits over 2 bits>")):
        with pytest.raises(errors.InvalidValue) as ei:
            RoundFrame(0, big)
        # named as given, as the int 10**400 is (it was named 'inf' / '-inf')
        assert str(ei.value) == (f"round_frame: weight = {shown} is invalid: not a finite "
                                 "non-negative realized-work mass")
        assert ei.value.fields["value"] == big
    with pytest.raises(errors.InvalidValue) as ei:
        RoundFrame(0, decimal.Decimal("0.5"))
    assert str(ei.value) == "round_frame: weight = Decimal('0.5') is invalid: not a real number"


TINY_WEIGHTS = [
    (fractions.Fraction(1, 10**400), "<a Fraction of 1 bit over 1329 bits>", "0.0"),
    (fractions.Fraction(-1, 10**400), "<a negative Fraction of 1 bit over 1329 bits>", "-0.0"),
    (fractions.Fraction(1, 2**1075), "<a Fraction of 1 bit over 1076 bits>", "0.0"),
]


@pytest.mark.parametrize(("weight", "shown", "rounded"), TINY_WEIGHTS,
                         ids=["1/10**400", "-1/10**400", "half-5e-324"])
def test_a_nonzero_exact_weight_that_rounds_to_zero_is_refused(weight: fractions.Fraction,
                                                               shown: str, rounded: str) -> None:
    """Fraction(1, 10**400) was taken as the weight 0.0 and Fraction(-1, 10**400) as -0.0: a
    weight that is not zero became a round that realized nothing. A nonzero int or Fraction
    whose nearest f64 is a zero is refused, named as given, by the constructor and by
    FrameTemplate.seal; floats are taken as before."""
    reason = f"nonzero, but rounds to {rounded} in f64"
    for build in (lambda: RoundFrame(0, weight),
                  lambda: FrameTemplate(RoundKind.MODEL, [(0, (1,))]).seal(weight, bytes(16))):
        with pytest.raises(errors.InvalidValue) as ei:
            build()
        expect(ei, errors.InvalidValue, False, "frame.bad_field",
               {"field": "weight", "value": weight, "reason": reason},
               f"round_frame: weight = {shown} is invalid: {reason}")
    assert RoundFrame(0, fractions.Fraction(3, 2**1076)).weight == 5e-324  # not a zero
    assert RoundFrame(0, fractions.Fraction(0)).weight == 0.0
    assert math.copysign(1.0, RoundFrame(0, -0.0).weight) == -1.0
    assert RoundFrame(0, 1e-400).weight == 0.0  # a float is the float it is


@pytest.mark.parametrize("weight", [-1.0, -5e-324, float("inf"), float("-inf"), -3])
def test_round_frame_weight_out_of_range(weight: float) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        RoundFrame(0, weight)
    reason = "not a finite non-negative realized-work mass"
    w = float(weight)
    expect(ei, errors.InvalidValue, False, "frame.bad_field",
           {"field": "weight", "value": w, "reason": reason},
           f"round_frame: weight = {w!r} is invalid: {reason}")


def test_round_frame_weight_nan() -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        RoundFrame(0, float("nan"))
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == "frame.bad_field" and math.isnan(ei.value.fields["value"])
    assert str(ei.value) == ("round_frame: weight = nan is invalid: not a finite non-negative "
                             "realized-work mass")


def test_round_frame_tensor_cap() -> None:
    t = TensorPayload(0, [])
    assert len(RoundFrame(0, 1.0, [t] * 65536).tensors) == 65536
    with pytest.raises(errors.LimitExceeded) as ei:
        RoundFrame(0, 1.0, [t] * 65537)
    expect(ei, errors.LimitExceeded, False, "frame.too_many_tensors_local",
           {"count": 65537, "cap": 65536},
           "round_frame: 65537 tensors exceed the cap of 65536 a reader accepts")


def test_round_frame_tensors_must_be_payloads() -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        RoundFrame(0, 1.0, [TensorPayload(0, []), b"x"])  # type: ignore[list-item]
    expect(ei, errors.InvalidValue, False, "frame.bad_type",
           {"field": "tensors[1]", "expected": "a TensorPayload", "got": "bytes"},
           "round_frame: tensors[1] must be a TensorPayload, got bytes")


# -- encoding ------------------------------------------------------------------------------------
A = TensorPayload(0, [2], T0)
B = TensorPayload.elide(0, [3])
C = TensorPayload(9, [], b"xyz")
D = TensorPayload.elide(1, [2, 2])


def test_wire_len() -> None:
    assert round_frame_wire_len([]) == 25
    # A 2+4+8+8, B 2+4+8+0, C 2+0+8+3, D 2+8+8+0
    assert round_frame_wire_len([A, B, C, D]) == 25 + 22 + 14 + 13 + 18
    assert round_frame_wire_len(iter([A, C])) == 25 + 22 + 13
    assert RoundFrame(0, 1.0, [A, B, C, D]).wire_len == 92


def test_round_frame_pieces_alternate_metadata_and_payload_views() -> None:
    frame = RoundFrame(RoundKind.CONTROL, 0.25, [A, B, C, D])
    pieces = round_frame_pieces(frame)
    assert len(pieces) == 5
    assert pieces[0] == head(4, 1, 0.25) + struct.pack("<BBIQ", 0, 1, 2, 8)
    assert pieces[1] is A.data
    assert pieces[2] == struct.pack("<BBIQ", 0, 1, 3, 0) + struct.pack("<BBQ", 9, 0, 3)
    assert pieces[3] is C.data
    assert pieces[4] == struct.pack("<BBIIQ", 1, 2, 2, 2, 0)
    assert all(type(p) is bytes for p in (pieces[0], pieces[2], pieces[4]))
    assert round_frame_pieces(RoundFrame(0, 1.0, [])) == [head(0, 0, 1.0)]
    last = round_frame_pieces(RoundFrame(0, 1.0, [C]))
    assert len(last) == 2 and last[1] is C.data
    assert last[0] == head(1) + struct.pack("<BBQ", 9, 0, 3)


@pytest.mark.parametrize(("data", "got"), [
    # an array is taken when it is C-contiguous: the line says what is wrong with this one
    (np.zeros(4, np.float32)[::2], "a non-contiguous ndarray"),  # strided
    (np.asfortranarray(np.zeros((2, 2), np.float32)), "a non-contiguous ndarray"),
    ("abcd", "str"),
    (7, "int"),
])
def test_payload_data_that_is_no_contiguous_buffer_is_refused_by_field(data: Any,
                                                                       got: str) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        TensorPayload(0, (2,), data)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "codec.not_bytes_like"  # the codec's one rule for buffers
    assert ei.value.fields == {"field": "data", "got": got}
    assert str(ei.value) == ("data must be a contiguous bytes-like object (bytes, bytearray or "
                             f"memoryview), got {got}")


@pytest.mark.parametrize(("dtype", "fmt", "hint"), [
    (">f4", ">f", "<f4"), (">u2", ">H", "<u2"), (">f8", ">d", "<f8"), (">i2", ">h", "<i2")])
def test_payload_data_of_big_endian_elements_is_refused(dtype: str, fmt: str,
                                                        hint: str) -> None:
    """A big-endian array's bytes went out as they were, each element's bytes reversed on the
    wire (``np.arange(3, dtype='>f4')`` viewed back as 0, 4.6e-41, 9.0e-44)."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        TensorPayload(0, (3,), np.arange(3, dtype=dtype))
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "codec.big_endian"
    assert ei.value.fields["field"] == "data" and ei.value.fields["got"] == "ndarray"
    # named as the payload's other checks name theirs: ``round_frame: FIELD = VALUE``
    assert str(ei.value) == (f"round_frame: data = ndarray of big-endian elements (buffer "
                             f"format '{fmt}') is invalid: the wire's are little-endian; pass "
                             f"data.astype('{hint}') or its little-endian bytes")


def test_payload_data_of_a_big_endian_memoryview_names_its_type() -> None:
    view = memoryview(np.arange(2, dtype=">f4"))
    with pytest.raises(errors.LocalProtocolError) as ei:
        TensorPayload(0, (2,), view)
    assert str(ei.value).startswith("round_frame: data = memoryview of big-endian elements "
                                    "(buffer format '>f') is invalid: ")


def test_payload_data_of_little_endian_or_single_byte_elements_is_taken() -> None:
    """The byte order of one-byte elements is no matter, and a little-endian array is the
    wire's order."""
    for data in (np.arange(3, dtype="<f4"), np.arange(12, dtype=">i1"),
                 np.arange(12, dtype=np.uint8)):
        p = TensorPayload(0, (3,), data)
        assert bytes(p.data) == data.tobytes()
    assert TensorPayload(0, (3,), np.arange(3, dtype="<f4")).array().tolist() == [0.0, 1.0, 2.0]


@pytest.mark.timeout(60)
def test_a_run_of_elided_tensors_is_joined_once() -> None:
    """At the tensor cap, 65,536 elided tensors of 8 dims (v3: every tensor zero): the 2.75 MB
    of metadata is one buffer, built in linear time. Each tensor's meta was appended with
    ``bytes +=``, which copies the run so far: about 90 GB copied here (minutes, so the
    timeout fails it)."""
    n = 65536
    meta = struct.pack("<BB8IQ", 1, 8, *range(1, 9), 0)
    elided = TensorPayload.elide(Dtype.BF16, range(1, 9))
    frame = RoundFrame(RoundKind.MODEL, 0.5, [elided] * n)
    pieces = round_frame_pieces(frame)
    assert len(pieces) == 1 and type(pieces[0]) is bytes
    assert pieces[0] == head(n, 0, 0.5) + meta * n
    with_data = RoundFrame(RoundKind.MODEL, 0.5, [elided] * (n - 4) + [A] + [elided] * 3)
    pieces = round_frame_pieces(with_data)
    assert len(pieces) == 3 and pieces[1] is A.data
    assert pieces[0] == head(n, 0, 0.5) + meta * (n - 4) + struct.pack("<BBIQ", 0, 1, 2, 8)
    assert pieces[2] == meta * 3


def test_encode_round_frame() -> None:
    frame = RoundFrame(RoundKind.CONTROL, 0.25, [A, B, C, D])
    body = head(4, 1, 0.25) + tensor(0, [2], T0) + tensor(0, [3], b"") + tensor(9, [], b"xyz") \
        + tensor(1, [2, 2], b"")
    pieces = encode_round_frame(frame, SALT)
    assert len(pieces) == 6 and pieces[1] is A.data and pieces[3] is C.data
    assert type(pieces[-1]) is bytes and pieces[-1] == tag(body)
    assert b"".join(pieces) == signed(body)
    wire = encode_round_frame_bytes(frame, bytearray(SALT))
    assert type(wire) is bytes and wire == signed(body) and len(wire) == 92
    assert encode_round_frame_bytes(RoundFrame(), b"\xff" * 16) == signed(head(0), b"\xff" * 16)


def test_encode_refuses_a_bad_salt() -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        encode_round_frame(RoundFrame(), b"short")
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == "salt.bad_length"


# -- reading -------------------------------------------------------------------------------------
def test_parse_reference_frame() -> None:
    buf = bytearray(WIRE + b"tail")
    frame, consumed, carried = parse_round_frame(buf)
    assert consumed == 67 and type(carried) is bytes and carried == tag(BODY)
    assert frame.kind is RoundKind.CONTROL and frame.weight == 2.0
    assert frame.tensors == (TensorPayload(0, [2], T0), TensorPayload(1, [3], T1))
    assert all(t.data.obj is buf for t in frame.tensors)
    buf[31] ^= 0xFF  # the payloads are views of the input
    assert bytes(frame.tensors[0].data)[0] == T0[0] ^ 0xFF
    res = parse_round_frame_or_eos(WIRE)
    assert not isinstance(res, type(END_OF_STREAM))
    assert res[1] == 67 and res[2] == tag(BODY) and res[0].tensors[1].shape == (3,)


def test_decode_reference_frame() -> None:
    buf = bytearray(WIRE + b"\x00" * 5)
    frame, consumed = decode_round_frame(buf, SALT)
    assert consumed == 67
    assert frame == RoundFrame(1, 2.0, [TensorPayload(0, [2], T0), TensorPayload(1, [3], T1)])
    assert frame.tensors[1].data.obj is buf
    res = decode_round_frame_or_eos(WIRE, SALT)
    assert not isinstance(res, type(END_OF_STREAM)) and res[1] == 67 and res[0] == frame
    assert round_frame_extent(WIRE + b"more") == 67


def test_frame_with_dimensionless_and_empty_tensors() -> None:
    body = head(3, 0, 0.5) + tensor(9, [], b"xyz") + tensor(0, [4, 0], b"") + tensor(0, [2], b"")
    frame, consumed = decode_round_frame(signed(body), SALT)
    assert consumed == len(body) + 8 == 70
    assert frame.tensors == (TensorPayload(9, [], b"xyz"), TensorPayload(0, [4, 0]),
                             TensorPayload(0, [2]))


def test_negative_zero_weight_passes() -> None:
    frame, _ = decode_round_frame(signed(head(0, 0, -0.0)), SALT)
    assert math.copysign(1.0, frame.weight) == -1.0


@pytest.mark.parametrize("n", range(68))
def test_extent_and_resumable_walk_need_exactly_the_next_field(n: int) -> None:
    need = next((s for s in STEPS if s > n), None)
    got = round_frame_extent(WIRE[:n])
    assert got == (67 if need is None else NeedData(need - n))


_MODEL_BODY = head(1, 0, 0.0) + tensor(9, [], b"ab")
_EMPTY_BODY = head(0, 0, 3.0)
_MATRIX_BODY = head(1, 1, 1.0) + tensor(1, [2, 2], bytes(range(8)))


@pytest.mark.parametrize(("wire", "steps", "last"), [
    (WIRE, STEPS, (2, 1, 2.0, 59, 14, [(0, (2,), 31, 8), (1, (3,), 53, 6)])),
    (signed(_MODEL_BODY), [8, 9, 17, 19, 27, 29, 37], (1, 0, 0.0, 29, 2, [(9, (), 27, 2)])),
    (signed(_EMPTY_BODY), [8, 9, 17, 25], (0, 0, 3.0, 17, 0, [])),
    (signed(_MATRIX_BODY), [8, 9, 17, 19, 27, 35, 43, 51],
     (1, 1, 1.0, 43, 8, [(1, (2, 2), 35, 8)])),
], ids=["control", "model", "no-tensors", "two-dims"])
def test_walk_resumes_across_a_trickle(wire: bytes, steps: list[int],
                                       last: tuple[Any, ...]) -> None:
    walk = _FrameWalk(1000)
    assert (walk.ceiling, walk.num_tensors, walk.kind, walk.weight, walk.pos, walk.total,
            walk.entries) == (1000, -1, -1, 0.0, 0, 0, [])
    mv = memoryview(wire)
    seen = [walk.advance(mv[:n], True) for n in range(len(wire) + 1)]
    assert seen == [next(s for s in steps if s > n) for n in range(len(wire))] + [None]
    assert (walk.num_tensors, walk.kind, walk.weight, walk.pos, walk.total, walk.entries) == last
    assert walk.advance(mv, False) is None  # walking a complete frame again changes nothing
    assert (walk.num_tensors, walk.kind, walk.weight, walk.pos, walk.total, walk.entries) == last


def test_walk_jumps_straight_to_the_end() -> None:
    walk = _FrameWalk(14)
    assert walk.advance(memoryview(WIRE)[:30], True) == 31
    assert walk.advance(memoryview(WIRE)[:60], True) == 67
    assert walk.advance(memoryview(WIRE), False) is None
    assert walk.entries == [(0, (2,), 31, 8), (1, (3,), 53, 6)] and walk.total == 14


def test_walk_whole_buffer_short_header_returns_eight() -> None:
    assert _FrameWalk(0).advance(memoryview(WIRE)[:7], False) == 8


# truncation anywhere after the header: the whole-buffer reader names the field and the offset
_TRUNC = (
    [(n, "frame.kind_read_failed", {"offset": 8},
      "cluster_controller: frame kind read failed: failed to fill whole buffer (offset 8)")
     for n in [8]]
    + [(n, "frame.weight_read_failed", {"offset": 9},
        "cluster_controller: frame weight read failed: failed to fill whole buffer (offset 9)")
       for n in [9, 16]]
    + [(n, "frame.meta_read_failed", {"index": i, "offset": o},
        f"cluster_controller: tensor[{i}] meta read failed: failed to fill whole buffer "
        f"(offset {o})") for n, i, o in [(17, 0, 17), (18, 0, 17), (39, 1, 39), (40, 1, 39)]]
    + [(n, "frame.shape_read_failed", {"index": i, "offset": o},
        f"cluster_controller: tensor[{i}] shape read failed: failed to fill whole buffer "
        f"(offset {o})") for n, i, o in [(19, 0, 19), (22, 0, 19), (41, 1, 41), (44, 1, 41)]]
    + [(n, "frame.nbytes_read_failed", {"index": i, "offset": o},
        f"cluster_controller: tensor[{i}] nbytes read failed: failed to fill whole buffer "
        f"(offset {o})") for n, i, o in [(23, 0, 23), (30, 0, 23), (45, 1, 45), (52, 1, 45)]]
    + [(n, "frame.data_read_failed", {"index": i, "got": g, "need": nd, "offset": o},
        f"cluster_controller: tensor[{i}] data read failed: failed to fill whole buffer ({g} of "
        f"{nd} bytes at offset {o})")
       for n, i, g, nd, o in [(31, 0, 0, 8, 31), (38, 0, 7, 8, 31), (53, 1, 0, 6, 53),
                              (58, 1, 5, 6, 53)]]
    + [(n, "frame.footer_read_failed", {"offset": 59},
        "cluster_controller: frame HMAC footer read failed: failed to fill whole buffer (sender "
        "at PROTOCOL_VERSION < 2, or stream truncated mid-frame) (offset 59)") for n in [59, 66]]
)


@pytest.mark.parametrize(("n", "error_id", "fields", "message"), _TRUNC)
def test_truncation_names_the_field(n: int, error_id: str, fields: dict[str, Any],
                                    message: str) -> None:
    for call in (lambda: parse_round_frame(WIRE[:n]), lambda: parse_round_frame_or_eos(WIRE[:n]),
                 lambda: decode_round_frame(WIRE[:n], SALT),
                 lambda: decode_round_frame_or_eos(WIRE[:n], SALT)):
        with pytest.raises(errors.TruncatedInput) as ei:
            call()
        expect(ei, errors.TruncatedInput, True, error_id, fields, message)


@pytest.mark.parametrize("n", range(8))
def test_short_header(n: int) -> None:
    assert parse_round_frame_or_eos(WIRE[:n]) is END_OF_STREAM
    assert decode_round_frame_or_eos(WIRE[:n], SALT) is END_OF_STREAM
    msg = (f"RoundFrame header read failed: input ended inside the 8-byte header ({n} of 8 bytes; "
           "a stream reader takes this as a clean end of stream)")
    for call in (lambda: parse_round_frame(WIRE[:n]), lambda: decode_round_frame(WIRE[:n], SALT)):
        with pytest.raises(errors.TruncatedInput) as ei:
            call()
        expect(ei, errors.TruncatedInput, True, "frame.header_read_failed",
               {"got": n, "need": 8}, msg)


def _all_readers(data: bytes, **kw: Any) -> list[Any]:
    return [lambda: parse_round_frame(data, **kw), lambda: parse_round_frame_or_eos(data, **kw),
            lambda: decode_round_frame(data, SALT, **kw),
            lambda: decode_round_frame_or_eos(data, SALT, **kw),
            lambda: round_frame_extent(data, **kw)]


@pytest.mark.parametrize(("data", "kind", "error_id", "fields", "message"), [
    (head(0, magic=0xDEADBEEF), errors.BadMagic, "frame.bad_magic",
     {"got": 0xDEADBEEF, "expected": MAGIC},
     "cluster_controller: frame magic 0xdeadbeef != 0xf10d17f1"),
    (struct.pack("<II", 0xF10D17F0, 2**32 - 1), errors.BadMagic, "frame.bad_magic",
     {"got": 0xF10D17F0, "expected": MAGIC},
     "cluster_controller: frame magic 0xf10d17f0 != 0xf10d17f1"),
    (struct.pack("<IIB", MAGIC, 65537, 7), errors.LimitExceeded, "frame.too_many_tensors",
     {"count": 65537, "cap": 65536},
     "cluster_controller: frame claims 65537 tensors (> 65536); corrupt or hostile peer"),
    (struct.pack("<II", MAGIC, 2**32 - 1), errors.LimitExceeded, "frame.too_many_tensors",
     {"count": 2**32 - 1, "cap": 65536},
     "cluster_controller: frame claims 4294967295 tensors (> 65536); corrupt or hostile peer"),
    (struct.pack("<IIB", MAGIC, 0, 2), errors.InvalidValue, "frame.unknown_kind", {"value": 2},
     "cluster_controller: unknown RoundKind wire byte 2"),
    (head(0, 255, float("nan")), errors.InvalidValue, "frame.unknown_kind", {"value": 255},
     "cluster_controller: unknown RoundKind wire byte 255"),
], ids=["magic", "magic-before-count", "count", "count-max", "kind", "kind-before-weight"])
def test_header_checks(data: bytes, kind: type, error_id: str, fields: dict[str, Any],
                       message: str) -> None:
    for call in _all_readers(data):
        with pytest.raises(kind) as ei:
            call()
        expect(ei, kind, True, error_id, fields, message)


def test_tensor_cap_itself_is_accepted() -> None:
    data = struct.pack("<II", MAGIC, 65536)
    assert round_frame_extent(data) == NeedData(1)
    with pytest.raises(errors.TruncatedInput) as ei:
        parse_round_frame(data)
    assert ei.value.error_id == "frame.kind_read_failed"
    assert declared_tensor_count(data) == 65536


@pytest.mark.parametrize(("weight", "text"), [
    (float("nan"), "NaN"), (float("inf"), "inf"), (float("-inf"), "-inf"), (-1.0, "-1"),
    (-0.5, "-0.5"), (-5e-324, "-0." + "0" * 323 + "5"), (-2.5e16, "-25000000000000000"),
])
def test_bad_weight(weight: float, text: str) -> None:
    data = head(1, 0, weight)  # the weight is checked before the (missing) tensor
    for call in _all_readers(data):
        with pytest.raises(errors.InvalidValue) as ei:
            call()
        expect(ei, errors.InvalidValue, True, "frame.bad_weight", {"weight": text},
               f"cluster_controller: frame weight {text} is not a finite non-negative "
               "realized-work mass")


@pytest.mark.parametrize(("x", "text"), [
    (float("nan"), "NaN"), (-float("nan"), "NaN"), (float("inf"), "inf"), (float("-inf"), "-inf"),
    (-1.0, "-1"), (-10.0, "-10"), (0.0, "0"), (-0.0, "-0"), (2.0, "2"), (-0.5, "-0.5"),
    (-1.25, "-1.25"), (-1e-7, "-0.0000001"), (-1.5e-5, "-0.000015"),
    # Rust's Display writes no exponent: the shortest digits, padded with zeros
    (-1e-300, "-0." + "0" * 299 + "1"), (1e300, "1" + "0" * 300), (-2.5e16, "-25000000000000000"),
    (1e16, "10000000000000000"), (-1.2345678901234568e17, "-123456789012345680"),
    (1.7976931348623157e308, "17976931348623157" + "0" * 292),
])
def test_rust_f64(x: float, text: str) -> None:
    assert _rust_f64(x) == text


def test_ceiling_is_a_running_total() -> None:
    message = ("cluster_controller: tensor[1] pushes frame past the 13 byte ceiling; corrupt or "
               "hostile peer, or a model that has outgrown the frame ceiling (nbytes 6, running "
               "total 14)")
    for call in _all_readers(WIRE, ceiling=13):
        with pytest.raises(errors.LimitExceeded) as ei:
            call()
        expect(ei, errors.LimitExceeded, True, "frame.past_ceiling",
               {"index": 1, "ceiling": 13, "nbytes": 6, "total": 14}, message)
    assert round_frame_extent(WIRE, ceiling=14) == 67
    assert parse_round_frame(WIRE, ceiling=14)[1] == 67
    assert decode_round_frame(WIRE, SALT, ceiling=14)[1] == 67
    res = decode_round_frame_or_eos(WIRE, SALT, ceiling=14)
    assert not isinstance(res, type(END_OF_STREAM)) and res[1] == 67
    with pytest.raises(errors.LimitExceeded) as ei:
        parse_round_frame(WIRE, ceiling=7)
    assert ei.value.fields == {"index": 0, "ceiling": 7, "nbytes": 8, "total": 8}


def test_ceiling_is_checked_before_waiting_for_the_data() -> None:
    over = head(1) + tensor(0, [1], b"", nbytes=GIB + 1)
    for call in _all_readers(over):
        with pytest.raises(errors.LimitExceeded) as ei:
            call()
        assert ei.value.fields == {"index": 0, "ceiling": GIB, "nbytes": GIB + 1, "total": GIB + 1}
    at = head(1) + tensor(0, [1], b"", nbytes=GIB)
    assert round_frame_extent(at) == NeedData(GIB)
    with pytest.raises(errors.TruncatedInput) as ei:
        parse_round_frame(at)
    assert ei.value.fields == {"index": 0, "got": 0, "need": GIB, "offset": 31}


@pytest.mark.parametrize("ceiling", [-1, 1.5, True, "1"])
def test_readers_refuse_a_bad_ceiling(ceiling: Any) -> None:
    for call in _all_readers(WIRE, ceiling=ceiling):
        with pytest.raises(errors.InvalidValue) as ei:
            call()
        assert ei.value.error_id == "ceiling.invalid" and not ei.value.remote


def test_decode_checks_the_salt_first() -> None:
    for call in (lambda: decode_round_frame_or_eos(b"", b"short"),
                 lambda: decode_round_frame(b"", b"short")):
        with pytest.raises(errors.InvalidValue) as ei:
            call()
        assert ei.value.error_id == "salt.bad_length" and not ei.value.remote


# bytes whose change keeps the frame well-formed: weight, dtype, a dim, payloads, the tag
@pytest.mark.parametrize("flip", [9, 16, 17, 19, 31, 38, 53, 58, 59, 66])
def test_tag_covers_magic_through_last_payload_byte(flip: int) -> None:
    bad = bytearray(WIRE)
    bad[flip] ^= 0x01
    carried = bytes(bad[59:67])
    computed = tag(bytes(bad[:59]))
    assert computed != carried
    for call in (lambda: decode_round_frame(bad, SALT),
                 lambda: decode_round_frame_or_eos(bad, SALT)):
        with pytest.raises(errors.AuthenticationError) as ei:
            call()
        expect(ei, errors.AuthenticationError, True, "frame.auth_failed",
               {"computed": u64(computed), "carried": u64(carried)},
               f"cluster_controller: RoundFrame HMAC verification failed (computed "
               f"0x{u64(computed):016x}, wire carried 0x{u64(carried):016x}); session salt "
               "disagreement, tampered frame, or payload corruption")


def test_wrong_salt() -> None:
    with pytest.raises(errors.AuthenticationError) as ei:
        decode_round_frame(WIRE, bytes(16))
    assert ei.value.fields == {"computed": u64(tag(BODY, bytes(16))), "carried": u64(tag(BODY))}


def test_premac_is_used_when_it_covers_the_frame() -> None:
    full = hmac.new(SALT, BODY, hashlib.sha256).digest()
    assert decode_round_frame(WIRE, SALT, premac=Premac(59, full))[1] == 67
    bogus = Premac(59, b"\x01" * 32)
    for call in (lambda: decode_round_frame(WIRE, SALT, premac=bogus),
                 lambda: decode_round_frame_or_eos(WIRE, SALT, premac=bogus)):
        with pytest.raises(errors.AuthenticationError) as ei:
            call()
        assert ei.value.fields == {"computed": u64(b"\x01" * 8), "carried": u64(tag(BODY))}
    for covered in (58, 60, 67):  # any other coverage is ignored: the frame is hashed here
        assert decode_round_frame(WIRE, SALT, premac=Premac(covered, b"\x01" * 32))[1] == 67


# -- delivered_tensors / declared_tensor_count -----------------------------------------------------
def test_delivered_tensors() -> None:
    body = head(4, 0, 1.0) + tensor(0, [2], T0) + tensor(9, [], b"xyz") + tensor(1, [3], T1) \
        + tensor(0, [1, 1], b"")
    buf = bytearray(body[:-3])  # the reader failed inside tensor 3
    assert delivered_tensors(buf, 0) == []
    got = delivered_tensors(buf, 3)
    assert got == [TensorPayload(0, [2], T0), TensorPayload(9, [], b"xyz"),
                   TensorPayload(1, [3], T1)]
    assert all(t.data.obj is buf for t in got)
    assert delivered_tensors(body, 4)[3] == TensorPayload(0, [1, 1])
    assert delivered_tensors(memoryview(body), 1) == [TensorPayload(0, [2], T0)]


@pytest.mark.parametrize(("data", "count"), [
    (WIRE, 2), (struct.pack("<II", MAGIC, 0), 0), (struct.pack("<II", MAGIC, 70000) + b"x", 70000),
    (bytearray(struct.pack("<II", 0, 2**32 - 1)), 2**32 - 1),
])
def test_declared_tensor_count(data: bytes, count: int) -> None:
    got = declared_tensor_count(data)
    assert type(got) is int and got == count


def _local_value(exc: pytest.ExceptionInfo[errors.ProtocolError], error_id: str,
                 **fields: Any) -> str:
    assert isinstance(exc.value, errors.InvalidValue)
    assert isinstance(exc.value, errors.LocalProtocolError)
    assert exc.value.error_id == error_id
    assert dict(exc.value.fields) == fields
    return str(exc.value)


@pytest.mark.parametrize(("frame", "got"), [
    (None, "None"), ("x", "str"), ([TensorPayload(0, [1], bytes(4))], "list"),
    (b"frame", "bytes"),
])
def test_encoding_something_that_is_no_round_frame_is_refused(frame: Any, got: str) -> None:
    for encode in (encode_round_frame, encode_round_frame_bytes):
        with pytest.raises(errors.ProtocolError) as ei:
            encode(frame, SALT)
        msg = _local_value(ei, "frame.bad_type", field="frame", expected="a RoundFrame",
                           got=got)
        assert msg == f"round_frame: frame must be a RoundFrame, got {got}"
    with pytest.raises(errors.ProtocolError) as ei:
        round_frame_pieces(frame)
    _local_value(ei, "frame.bad_type", field="frame", expected="a RoundFrame", got=got)


def test_round_frame_wire_len_refuses_what_is_no_tensor_list() -> None:
    with pytest.raises(errors.ProtocolError) as ei:
        round_frame_wire_len(None)  # type: ignore[arg-type]
    _local_value(ei, "frame.bad_type", field="tensors", expected="an iterable of TensorPayload",
                 got="None")
    frame = RoundFrame(RoundKind.MODEL, 1.0, [])
    with pytest.raises(errors.ProtocolError) as ei:
        round_frame_wire_len(frame)  # type: ignore[arg-type]
    _local_value(ei, "frame.bad_type", field="tensors", expected="an iterable of TensorPayload",
                 got="RoundFrame")
    with pytest.raises(errors.ProtocolError) as ei:
        round_frame_wire_len([TensorPayload(0, [1], bytes(4)), None])  # type: ignore[list-item]
    msg = _local_value(ei, "frame.bad_type", field="tensors[1]", expected="a TensorPayload",
                       got="None")
    assert msg == "round_frame: tensors[1] must be a TensorPayload, got None"
    assert round_frame_wire_len(t for t in [TensorPayload(0, [1], bytes(4))]) == 25 + 2 + 4 + 8 + 4


@pytest.mark.parametrize(("flag", "got"), [("no", "str"), (0, "int"), (None, "None")])
def test_round_frame_check_nbytes_must_be_a_bool(flag: Any, got: str) -> None:
    """A truthy non-bool ("no") was taken as true, a falsy one (0, None) as false."""
    with pytest.raises(errors.ProtocolError) as ei:
        RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, [1], bytes(4))], check_nbytes=flag)
    msg = _local_value(ei, "frame.bad_type", field="check_nbytes", expected="a bool", got=got)
    assert msg == f"round_frame: check_nbytes must be a bool, got {got}"
    short = TensorPayload(0, [2], bytes(4))
    assert RoundFrame(RoundKind.MODEL, 1.0, [short], check_nbytes=False).tensors == (short,)


@pytest.mark.parametrize("ceiling", [None, -1, 8.0, True, "64"])
def test_array_refuses_a_bad_ceiling(ceiling: Any) -> None:
    elided = TensorPayload(0, [2], b"")
    full = TensorPayload(0, [2], bytes(8))
    for payload in (elided, full):
        with pytest.raises(errors.ProtocolError) as ei:
            payload.array(materialize_elided=True, ceiling=ceiling)
        msg = _local_value(ei, "ceiling.invalid", value=ceiling)
        assert msg == f"frame ceiling must be a non-negative number of bytes, got {ceiling!r}"


def test_array_takes_a_numpy_integer_ceiling() -> None:
    elided = TensorPayload(0, [2], b"")
    assert elided.array(materialize_elided=True, ceiling=np.int64(8)).tolist() == [0.0, 0.0]
    with pytest.raises(errors.LimitExceeded) as ei:
        elided.array(materialize_elided=True, ceiling=np.uint32(7))
    assert ei.value.error_id == "tensor.elided_too_large"


@pytest.mark.parametrize("weight", [2**1100, -(2**1100)], ids=["above", "below"])
def test_a_weight_beyond_f64_is_named_as_given(weight: int) -> None:
    with pytest.raises(errors.ProtocolError) as ei:
        RoundFrame(RoundKind.MODEL, weight, [])
    reason = "not a finite non-negative realized-work mass"
    msg = _local_value(ei, "frame.bad_field", field="weight", value=weight, reason=reason)
    # 332 digits: shown by its size (it was printed whole)
    size = "an integer" if weight > 0 else "a negative integer"
    assert msg == f"round_frame: weight = <{size} of 1101 bits> is invalid: {reason}"
    assert ei.value.fields["value"] == weight


@pytest.mark.parametrize("tensors", [[], [TensorPayload(0, [1], bytes(4))]], ids=["empty", "one"])
def test_a_round_frame_is_never_hashable(tensors: list[TensorPayload]) -> None:
    frame = RoundFrame(RoundKind.MODEL, 1.0, tensors)
    with pytest.raises(TypeError, match="unhashable type: 'RoundFrame'"):
        hash(frame)
    assert frame == RoundFrame(RoundKind.MODEL, 1.0, list(tensors))  # equality is by value

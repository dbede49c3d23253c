"""bf16 and payload codec: exhaustive proofs against upstream's bit formula."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from flodl_proto.errors import InvalidValue, LocalProtocolError, SchemaMismatch
from flodl_proto.reduce import (
    bf16_bits_to_f32_bits,
    bf16_from_f32,
    bf16_to_f32,
    decode_payload,
    encode_payload,
    f32_bits_to_bf16_bits,
    payload_element_size,
    scale_payload,
)


def upstream_bf16(bits: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint16]:
    """Upstream's f32 -> bf16 rule written in integer ops: NaN -> (b >> 16) | 0x0040, else
    round to nearest even: (b + 0x7FFF + ((b >> 16) & 1)) >> 16."""
    b = bits.astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    rne = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return np.where(nan, (b >> 16) | 0x0040, rne).astype(np.uint16)


ALL_BF16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_widen_is_exact_on_every_bf16_pattern() -> None:
    got = bf16_to_f32(ALL_BF16).view(np.uint32)
    assert np.array_equal(got, ALL_BF16.astype(np.uint32) << 16)


def test_decode_encode_identity_except_signalling_nans() -> None:
    back = bf16_from_f32(bf16_to_f32(ALL_BF16))
    b = ALL_BF16.astype(np.uint32)
    exp_mag = b & 0x7F80
    mant = b & 0x7F
    nan = (exp_mag == 0x7F80) & (mant != 0)
    signalling = nan & ((b & 0x0040) == 0)
    assert int(np.count_nonzero(signalling)) == 126
    assert np.array_equal(back[~signalling], ALL_BF16[~signalling])
    assert np.array_equal(back[signalling], ALL_BF16[signalling] | 0x0040)
    # the 126 are exactly 0x7F81..0x7FBF and 0xFF81..0xFFBF
    expected = set(range(0x7F81, 0x7FC0)) | set(range(0xFF81, 0xFFC0))
    assert set(int(x) for x in ALL_BF16[signalling]) == expected


def test_encode_matches_upstream_formula_on_random_patterns() -> None:
    rng = np.random.default_rng(20240531)
    bits = rng.integers(0, 1 << 32, size=1_200_000, dtype=np.uint64).astype(np.uint32)
    got = bf16_from_f32(bits.view(np.float32))
    assert np.array_equal(got, upstream_bf16(bits))


EDGE_F32 = [
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00007FFF, 0x00008000, 0x00008001,
    0x00018000, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x3F808000, 0x3F808001, 0x3F818000,
    0x3F80FFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
    0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF,
    0x7F80FFFF, 0x7F818000,
]


def test_encode_edge_patterns_and_scalar_path() -> None:
    bits = np.array(EDGE_F32, dtype=np.uint32)
    want = upstream_bf16(bits)
    assert np.array_equal(bf16_from_f32(bits.view(np.float32)), want)
    for b, w in zip(EDGE_F32, want, strict=True):
        assert f32_bits_to_bf16_bits(b) == int(w)
    # upstream's own examples
    assert f32_bits_to_bf16_bits(0x3F808000) == 0x3F80  # tie to even
    assert f32_bits_to_bf16_bits(0x3F808001) == 0x3F81  # above the tie
    assert f32_bits_to_bf16_bits(0x7F7FFFFF) == 0x7F80  # overflow rounds to +inf
    assert f32_bits_to_bf16_bits(0x7F800001) == 0x7FC0  # signalling NaN quietened, not inf
    assert bf16_bits_to_f32_bits(0xFFFF) == 0xFFFF0000


def test_encode_keeps_shape_and_handles_empty() -> None:
    x = np.ones((2, 3), np.float32)
    assert bf16_from_f32(x).shape == (2, 3)
    assert bf16_from_f32(np.zeros(0, np.float32)).shape == (0,)


def test_payload_codec_round_trips() -> None:
    vals = np.array([1.5, -3.0, 0.0, 42.0], np.float32)
    for dtype in (0, 1):
        data = encode_payload(dtype, vals)
        assert len(data) == 4 * payload_element_size(dtype)
        assert np.array_equal(decode_payload(dtype, data), vals)
    with pytest.raises(InvalidValue, match="unsupported wire dtype tag 9"):
        encode_payload(9, vals)
    with pytest.raises(InvalidValue, match="unsupported wire dtype tag 9"):
        decode_payload(9, b"")
    with pytest.raises(SchemaMismatch):
        decode_payload(0, b"\0" * 6)


def test_f32_payload_encode_is_bit_exact_for_nan_payloads() -> None:
    bits = np.array([0x7F800001, 0xFFC12345, 0x80000000], np.uint32)
    data = encode_payload(0, bits.view(np.float32))
    assert np.array_equal(np.frombuffer(data, "<u4"), bits)


def test_scale_f32_and_bf16_single_rounding() -> None:
    data = np.array([1.0, -2.5, 0.1], np.float32).tobytes()
    out = scale_payload(0, data, 0.25)
    assert np.array_equal(np.frombuffer(out, "<f4"),
                          np.array([1.0, -2.5, 0.1], np.float32) * np.float32(0.25))
    rng = np.random.default_rng(7)
    b16 = rng.integers(0, 1 << 16, 5000, dtype=np.uint32).astype(np.uint16)
    f = np.float32(1.0 / 7.0)
    scaled = np.frombuffer(scale_payload(1, b16.tobytes(), f), "<u2")
    with np.errstate(all="ignore"):
        prod = bf16_to_f32(b16) * f
    assert np.array_equal(scaled, upstream_bf16(prod.view(np.uint32)))


def test_scale_leaves_a_trailing_partial_element_alone() -> None:
    data = np.array([2.0], np.float32).tobytes() + b"\xaa\xbb"
    out = scale_payload(0, data, 0.5)
    assert out[:4] == np.array([1.0], np.float32).tobytes() and out[4:] == b"\xaa\xbb"
    with pytest.raises(InvalidValue, match="scale_payload: unsupported wire dtype tag 3"):
        scale_payload(3, data, 0.5)


@pytest.mark.parametrize("dtype", [0, 1])
def test_scale_into_a_caller_buffer(dtype: int) -> None:
    """``out=``: the same bytes as a fresh buffer, written over stale contents (a trailing
    partial element copied too), a larger buffer used from its start; a bad buffer is refused."""
    rng = np.random.default_rng(11 + dtype)
    data = rng.integers(0, 256, 4 * 1001 + 3, dtype=np.uint8).tobytes()
    want = bytes(scale_payload(dtype, data, 0.37))
    out = np.full(len(data) + 64, 0xEE, np.uint8)
    got = scale_payload(dtype, data, 0.37, out=out)
    assert bytes(got) == want
    assert np.frombuffer(got, np.uint8).ctypes.data == out.ctypes.data
    assert bytes(out[len(data):]) == b"\xee" * 64
    for bad in (np.empty(len(data) - 1, np.uint8), np.empty(len(data), np.uint16),
                np.empty((2, len(data)), np.uint8)):
        with pytest.raises(ValueError):
            scale_payload(dtype, data, 0.37, out=bad)


@pytest.mark.parametrize(("fn", "bits", "width", "maximum"), [
    (bf16_bits_to_f32_bits, -1, "u16", "0xffff"),
    (bf16_bits_to_f32_bits, 65536, "u16", "0xffff"),
    (bf16_bits_to_f32_bits, None, "u16", "0xffff"),
    (bf16_bits_to_f32_bits, 1.0, "u16", "0xffff"),
    (bf16_bits_to_f32_bits, True, "u16", "0xffff"),
    (bf16_bits_to_f32_bits, "1", "u16", "0xffff"),
    (f32_bits_to_bf16_bits, 2**32, "u32", "0xffffffff"),
    (f32_bits_to_bf16_bits, -1, "u32", "0xffffffff"),
    (f32_bits_to_bf16_bits, 1.0, "u32", "0xffffffff"),
    (f32_bits_to_bf16_bits, np.float32(1.0), "u32", "0xffffffff"),
])
def test_a_bit_pattern_that_is_no_integer_in_range_is_refused(
        fn: object, bits: object, width: str, maximum: str) -> None:
    with pytest.raises(InvalidValue) as ei:
        fn(bits)  # type: ignore[operator]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "frame.bad_field"
    assert ei.value.fields["field"] == "bits"
    assert ei.value.fields["value"] is bits
    assert str(ei.value) == (f"round_frame: bits = {bits!r} is invalid: not a {width} bit "
                             f"pattern (an integer in 0..{maximum})")


def test_bit_patterns_take_numpy_integers_and_the_range_ends() -> None:
    assert bf16_bits_to_f32_bits(np.uint16(0x3F80)) == 0x3F800000
    assert bf16_bits_to_f32_bits(0xFFFF) == 0xFFFF0000
    assert f32_bits_to_bf16_bits(np.int64(0x3F800000)) == 0x3F80
    assert f32_bits_to_bf16_bits(0xFFFFFFFF) == 0xFFFF  # a NaN keeps its sign and top bits


@pytest.mark.parametrize(("values", "shown"), [
    ("x", "<U1"), (["1.5"], "<U3"), ([1j], "complex128"), ([object()], "object"),
    ([None], "object"), ([1.0, None], "object"),  # None was cast to NaN
])
def test_encode_payload_refuses_values_that_are_no_real_numbers(values: object,
                                                                shown: str) -> None:
    for dtype in (0, 1):
        with pytest.raises(InvalidValue) as ei:
            encode_payload(dtype, values)  # type: ignore[arg-type]
        assert isinstance(ei.value, LocalProtocolError)
        assert ei.value.error_id == "frame.bad_field"
        assert ei.value.fields["field"] == "array dtype"
        assert ei.value.fields["value"] == shown


def test_encode_payload_refuses_ragged_rows() -> None:
    # NumPy makes no array of them: it raised NumPy's own ValueError
    for dtype in (0, 1):
        with pytest.raises(InvalidValue) as ei:
            encode_payload(dtype, [[1.0], [2.0, 3.0]])
        assert isinstance(ei.value, LocalProtocolError)
        assert ei.value.error_id == "frame.bad_type"
        assert ei.value.fields["field"] == "array"
        assert str(ei.value).startswith("round_frame: array must be an array of numbers, got "
                                        "list (NumPy makes no array of it: setting an array "
                                        "element with a sequence.")


def test_encode_payload_still_takes_python_ints_beyond_int64() -> None:
    assert encode_payload(0, [2**70]) == np.float32(2.0**70).tobytes()
    # beyond f64 (it raised OverflowError): an infinity of its sign, as beyond f32
    inf = np.float32(np.inf)
    assert encode_payload(0, [10**400, -(10**400), 10**300]) == np.array(
        [inf, -inf, inf], np.float32).tobytes()

"""scale_payload's destination buffer rules and its silent saturation (upstream multiplies
without a floating-point warning; an overflow gives inf, as libtorch's mul_scalar)."""

from __future__ import annotations

import fractions
import warnings

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload
from flodl_proto.errors import InvalidValue, LocalProtocolError, ProtocolError
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce import reduce_realized_work
from flodl_proto.reduce.payload import bf16_from_f32, bf16_to_f32, decode_payload, scale_payload


def test_an_out_buffer_of_exactly_the_payload_size_is_accepted() -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    out = np.zeros(8, np.uint8)
    got = scale_payload(0, data, 0.5, out=out)
    assert np.frombuffer(got, np.float32).tolist() == [0.5, -1.0]
    assert np.frombuffer(out, np.float32).tolist() == [0.5, -1.0]


def test_a_short_out_buffer_is_refused_with_the_size_needed() -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    with pytest.raises(ValueError) as ei:
        scale_payload(0, data, 0.5, out=np.zeros(7, np.uint8))
    assert str(ei.value) == "out must be a flat uint8 array of >= 8 bytes"


@pytest.mark.parametrize("dtype", [0, 1])
def test_overflow_saturates_without_a_warning(dtype: int) -> None:
    big = (np.asarray([3e38], np.float32).tobytes() if dtype == 0
           else np.asarray([0x7F7F], np.uint16).tobytes())  # bf16 max, about 3.39e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bytes(scale_payload(dtype, big, 4.0))
    inf = np.asarray([np.inf], np.float32).tobytes() if dtype == 0 else bytes.fromhex("807f")
    assert got == inf


# -- the payload helpers' and backend selection's exact results ------------------------------------
def test_decode_payload_gives_f32_and_names_a_bad_length() -> None:
    got = decode_payload(0, np.asarray([1.5], np.float32).tobytes())
    assert got.dtype == np.float32 and got.tolist() == [1.5]
    with pytest.raises(ProtocolError) as ei:
        decode_payload(1, b"\x00\x00\x00")
    assert ei.value.error_id == "payload.bad_length"
    assert dict(ei.value.fields) == {"got": 3, "element_size": 2}


def test_bf16_to_f32_takes_plain_integers() -> None:
    got = bf16_to_f32([0x3F80, 0xC000, 0x7F80])
    assert got.dtype == np.float32 and got.tolist() == [1.0, -2.0, float("inf")]


@pytest.mark.parametrize(("cpus", "want"), [(1, 1), (2, 2), (4, 4), (16, 4)])
def test_default_threads_follow_the_affinity_up_to_four(monkeypatch: pytest.MonkeyPatch,
                                                       cpus: int, want: int) -> None:
    monkeypatch.setattr(K.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert K.default_threads() == want


@pytest.mark.parametrize(("count", "want"), [(None, 1), (3, 3), (12, 4)])
def test_default_threads_without_affinity(monkeypatch: pytest.MonkeyPatch, count: int | None,
                                          want: int) -> None:
    monkeypatch.delattr(K.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(K.os, "cpu_count", lambda: count)
    assert K.default_threads() == want


def test_backend_selection_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = K.kernel_backend()
    try:
        monkeypatch.setenv("FLODL_PROTO_KERNELS", "numpy")
        assert K.set_kernel_backend() == "numpy" and K._backend["module"] is None
        monkeypatch.delenv("FLODL_PROTO_KERNELS")
        assert K.set_kernel_backend() in ("numpy", "numba")  # unset: auto
        with pytest.raises(ProtocolError) as ei:
            K.set_kernel_backend("numpy", min_elems=-1)
        assert ei.value.error_id == "kernels.bad_min_elems"
        assert dict(ei.value.fields) == {"value": -1}
    finally:
        K.set_kernel_backend(before)


def test_check_backend_name_refuses_a_non_string() -> None:
    for value in (None, 3):
        with pytest.raises(ProtocolError) as ei:
            K.check_backend_name(value, origin="here")
        assert ei.value.error_id == "kernels.unknown_backend"
        assert dict(ei.value.fields)["value"] == value


def test_bf16_from_f32_takes_plain_floats() -> None:
    assert bf16_from_f32([1.0, 3.0, -0.5]).tolist() == [0x3F80, 0x4040, 0xBF00]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_quiet_nan_survives_the_reduce_with_its_sign_and_payload(backend: str) -> None:
    before = K.kernel_backend()
    try:
        K.set_kernel_backend(backend)
        bits = np.asarray([0x7FC0, 0x3F80], np.uint16).tobytes()  # +qNaN, 1.0
        f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(1, (2,), bits)])
        out = reduce_realized_work([f, f], version=3)
        assert np.frombuffer(bytes(out.tensors[0].data), np.uint16).tolist() == [0x7FC0, 0x3F80]
    finally:
        K.set_kernel_backend(before)


def test_a_parallel_split_of_an_uneven_size_matches_one_thread() -> None:
    n = K.PARALLEL_MIN_ELEMS * 3 // 2  # 1.5 split units: one worker
    rng = np.random.default_rng(5)
    f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        rng.standard_normal(n).astype(np.float32).astype(ml_dtypes.bfloat16))])
    one = reduce_realized_work([f, f], version=3, threads=1)
    two = reduce_realized_work([f, f], version=3, threads=2)
    assert bytes(two.tensors[0].data) == bytes(one.tensors[0].data)


def test_scale_bf16_small_path_exact_values_and_threshold() -> None:
    """Below K.SMALL_ELEMS the bf16 scale takes one scratch array and the small encoder; from
    there on the chunked kernels: both give upstream's bytes (one rounding, NaN rule)."""
    import numpy as np

    from flodl_proto.reduce import _kernels as K

    src = np.array([0x3F80, 0x3F81, 0x8000, 0x7FA1, 0xFF80, 0x7F7F, 0x0001], np.uint16)
    dst = np.zeros(len(src), np.uint16)
    with np.errstate(all="ignore"):
        K.scale_bf16(src, dst, np.float32(1.5))
    # 1.5, 1.0078125 * 1.5 = 1.51171875 (tie -> even 0x3FC2), -0 * 1.5 = -0, NaN kept quiet,
    # -inf, max finite * 1.5 overflows to +inf, the smallest subnormal * 1.5 rounds to even
    assert dst.tolist() == [0x3FC0, 0x3FC2, 0x8000, 0x7FE1, 0xFF80, 0x7F80, 0x0002]
    rng = np.random.default_rng(11)
    for n in (K.SMALL_ELEMS - 1, K.SMALL_ELEMS):
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        got = np.zeros(n, np.uint16)
        with np.errstate(all="ignore"):
            K.scale_bf16(bits, got, np.float32(1 / 3))
            wide = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(1 / 3)
        u = wide.view(np.uint32).astype(np.uint64)
        ref = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(wide)
        ref[nan] = ((wide.view(np.uint32)[nan] >> 16) | 0x40).astype(np.uint16)
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("factor", ["2", None, True, np.bool_(False), 1j, [2.0]])
@pytest.mark.parametrize("dtype", [0, 1])
def test_a_factor_that_is_no_real_number_is_refused(dtype: int, factor: object) -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    with pytest.raises(InvalidValue) as ei:
        scale_payload(dtype, data, factor)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "frame.bad_field"
    assert ei.value.fields == {"field": "factor", "value": factor, "reason": "not a real number"}


def test_real_factors_of_every_type_and_a_nan_factor() -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    for factor in (2, 2.0, np.float32(2.0), np.int8(2), np.float64(2.0)):
        assert np.frombuffer(scale_payload(0, data, factor), np.float32).tolist() == [2.0, -4.0]
    nan = np.frombuffer(scale_payload(0, data, float("nan")), np.float32)
    assert np.isnan(nan).all()  # documented: NaN times x is NaN, as upstream's f32 multiply


def test_a_factor_beyond_the_f64_range_is_an_infinity_of_its_sign() -> None:
    """``scale_payload(0, p, 10**5000)`` raised OverflowError though the docstring said such a
    factor becomes an infinity."""
    data = np.array([1.0, -2.0], np.float32).tobytes()
    got = np.frombuffer(scale_payload(0, data, 10**5000), np.float32)
    assert got.tolist() == [np.inf, -np.inf]
    got = np.frombuffer(scale_payload(0, data, -(10**400)), np.float32)
    assert got.tolist() == [-np.inf, np.inf]


@pytest.mark.parametrize(("factor", "text", "rounded"), [
    (fractions.Fraction(1, 10**400), "<a Fraction of 1 bit over 1329 bits>", "0.0"),
    (fractions.Fraction(-1, 10**400), "<a negative Fraction of 1 bit over 1329 bits>", "-0.0"),
], ids=["1/10**400", "-1/10**400"])
def test_a_nonzero_exact_factor_that_rounds_to_zero_is_refused(factor: fractions.Fraction,
                                                               text: str, rounded: str) -> None:
    """A factor of Fraction(1, 10**400) scaled every element to 0.0 (-0.0 for the negative
    one): refused, named as given; a Fraction past the f64 range is an infinity of its sign,
    as the int of its size is; a float factor is taken as it is."""
    data = np.array([1.0, -2.0], np.float32).tobytes()
    reason = f"nonzero, but rounds to {rounded} in f64"
    with pytest.raises(InvalidValue) as ei:
        scale_payload(0, data, factor)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "frame.bad_field"
    assert ei.value.fields == {"field": "factor", "value": factor, "reason": reason}
    assert str(ei.value) == f"round_frame: factor = {text} is invalid: {reason}"
    got = np.frombuffer(scale_payload(0, data, fractions.Fraction(-(10**400))), np.float32)
    assert got.tolist() == [-np.inf, np.inf]
    assert np.frombuffer(scale_payload(0, data, 1e-400), np.float32).tolist() == [0.0, -0.0]


@pytest.mark.parametrize("dtype", [True, 1.0, np.True_, 0.0])
def test_a_dtype_tag_that_is_no_integer_is_refused(dtype: object) -> None:
    """``encode_payload(True, ...)``, ``scale_payload(1.0, ...)`` and ``decode_payload(np.True_,
    ...)`` took the value as tag 1 (bf16) or 0, where ``TensorPayload`` refuses it."""
    from flodl_proto.reduce import encode_payload

    data = np.ones(2, np.float32).tobytes()
    for call, error_id in ((lambda: encode_payload(dtype, [1.0]), "payload.unknown_dtype"),
                           (lambda: decode_payload(dtype, data), "payload.unknown_dtype"),
                           (lambda: scale_payload(dtype, data, 2.0), "scale.unknown_dtype")):
        with pytest.raises(InvalidValue) as ei:
            call()
        assert isinstance(ei.value, LocalProtocolError)
        assert ei.value.error_id == error_id and ei.value.fields == {"dtype": dtype}
    # NumPy integers are tags
    assert scale_payload(np.int8(0), data, 2.0) == np.full(2, 2.0, np.float32).tobytes()

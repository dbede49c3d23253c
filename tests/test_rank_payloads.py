"""The rank's small-frame pre-scale (runner/_rank_payloads.py ``fill_small``): each tensor lands
in its template place as the bytes of the tensor-by-tensor payload, for every staging on
either wire dtype, NaN payloads and shaped, strided and empty arrays included."""

from __future__ import annotations

import fractions
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import Dtype, RoundKind
from flodl_proto.codec.template import FrameTemplate
from flodl_proto.errors import InvalidValue, LocalProtocolError
from flodl_proto.reduce import bf16_from_f32
from flodl_proto.reduce.payload import Bf16Scaler
from flodl_proto.runner._rank_payloads import (
    SmallLayout,
    fill_small,
    real_argument,
    scaled_payload,
)


def _bf16(a: np.ndarray) -> np.ndarray:
    return bf16_from_f32(a).view(ml_dtypes.bfloat16)


def _arrays(staging: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    big = (rng.standard_normal((6, 10)) * 1e3).astype(np.float32)
    big[0, :6] = np.array([0x7F800001, 0xFFC00123, 0x7FBFFFFF, 0x3F808000, 0x7F800000,
                           0x80000000], np.uint32).view(np.float32)  # NaN payloads, a tie, inf
    small = np.float32(rng.standard_normal()).reshape(())
    tail = (rng.standard_normal(257) * 1e-38).astype(np.float32)
    empty = np.zeros((0, 3), np.float32)
    arrs = [big[:, ::2], small, empty, tail]
    if staging == "f32":
        return arrs
    bf = [_bf16(big)[:, ::2], _bf16(small), _bf16(empty), _bf16(tail)]  # NaN payloads kept
    if staging == "bf16":
        return bf
    arrs[0], arrs[3] = bf[0], bf[3]
    return arrs


@pytest.mark.parametrize("wire", [Dtype.F32, Dtype.BF16], ids=["f32-wire", "bf16-wire"])
@pytest.mark.parametrize("staging", ["f32", "bf16", "mixed"])
def test_fill_small_writes_the_payloads_of_each_tensor(
        monkeypatch: pytest.MonkeyPatch, wire: Dtype, staging: str) -> None:
    arrs0 = _arrays(staging, 0)
    tpl = FrameTemplate(RoundKind.MODEL, [(int(wire), a.shape) for a in arrs0])
    kept = SmallLayout((), tpl, b"", Bf16Scaler(tpl.payloads) if wire is Dtype.BF16 else None)
    bits_seen: list[bool] = []
    real_run = Bf16Scaler.run

    def run(self: Bf16Scaler, srcs: Any, factor: np.float32, bits: bool) -> None:
        bits_seen.append(bits)
        assert all(s.dtype == (np.uint16 if bits else s.dtype) for s in srcs)
        real_run(self, srcs, factor, bits)

    monkeypatch.setattr(Bf16Scaler, "run", run)
    for seed, scale in enumerate([0.3, 1 / 7, 2.0, 1e-30, 0.0, float("inf")]):
        arrs = _arrays(staging, seed)
        with np.errstate(all="ignore"):
            fill_small(kept, arrs, np.float32(scale))
            want = [bytes(scaled_payload(a, wire, scale).data) for a in arrs]
        assert [p.tobytes() for p in tpl.payloads] == want
    # bf16 staging goes through as bit patterns (a shift), anything else as values
    assert bits_seen == ([staging == "bf16"] * 6 if wire is Dtype.BF16 else [])


def test_a_bf16_reply_is_widened_into_f32_arrays_exactly_on_every_pattern() -> None:
    """Every bf16 pattern (NaN payloads and signalling NaNs included) of a reply lands in an
    f32 destination as its bits in the high half, through a destination of another shape too,
    as ml_dtypes' cast widened it; a bf16 destination takes the bits as they are."""
    from flodl_proto.codec import RoundFrame, TensorPayload
    from flodl_proto.runner._rank_payloads import decode_into

    bits = np.arange(1 << 16, dtype=np.uint32).astype("<u2")
    payload = TensorPayload(int(Dtype.BF16), (256, 256), bits.tobytes())
    frame = RoundFrame(RoundKind.MODEL, 1.0, [payload, payload, payload])
    flat = np.full(1 << 16, 7.0, np.float32)
    square = np.full((256, 256), 7.0, np.float32)
    same = np.zeros((256, 256), ml_dtypes.bfloat16)
    decode_into(frame, [flat, square, same])
    want = bits.astype(np.uint32) << 16
    assert np.array_equal(flat.view(np.uint32), want)
    assert np.array_equal(square.reshape(-1).view(np.uint32), want)
    assert np.array_equal(want, bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32))
    assert np.array_equal(same.reshape(-1).view(np.uint16), bits)


def test_a_bf16_reply_is_widened_in_place_into_a_contiguous_f32_array() -> None:
    """A bf16 reply of 1 Mi elements widens into its contiguous f32 destination with no
    array of the destination's size beside it (NumPy's allocations are traced: the peak stays
    under a quarter of the destination's 4 MiB); a strided destination gets the same values."""
    import tracemalloc

    from flodl_proto.codec import RoundFrame, TensorPayload
    from flodl_proto.runner._rank_payloads import decode_into

    n = 1 << 20
    bits = (np.arange(n, dtype=np.uint32) * 2654435761 >> 16).astype("<u2")
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(int(Dtype.BF16), (n,), bits.tobytes())])
    dst = np.zeros(n, np.float32)
    tracemalloc.start()
    try:
        decode_into(frame, [dst])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(dst.view(np.uint32), bits.astype(np.uint32) << 16)
    assert peak < dst.nbytes // 4, peak
    strided = np.zeros(2 * n, np.float32)[::2]
    decode_into(frame, [strided])
    assert np.array_equal(strided.view(np.uint32), bits.astype(np.uint32) << 16)


@pytest.mark.parametrize(("value", "text"), [
    (10**400, "<an integer of 1329 bits>"),
    (fractions.Fraction(10**400), "<a Fraction of 1329 bits over 1 bit>"),
    (-fractions.Fraction(10**400, 3), "<a negative Fraction of 1329 bits over 2 bits>"),
], ids=["int", "Fraction", "-Fraction/3"])
def test_a_real_argument_past_the_f64_range_is_refused_as_given(value: object,
                                                                text: str) -> None:
    """A Fraction past the f64 range was taken as an infinity (a scale of Fraction(10**400)
    became the frame's weight and was refused as 'weight = inf'), where an int was refused
    as itself: both are refused, named as given."""
    with pytest.raises(LocalProtocolError) as ei:
        real_argument("scale", value)
    assert isinstance(ei.value, InvalidValue) and ei.value.error_id == "client.bad_argument"
    assert dict(ei.value.fields) == {"field": "scale", "value": value,
                                     "reason": "beyond the f64 range"}
    assert str(ei.value) == f"cpu_reduce: scale = {text} is invalid: beyond the f64 range"
    assert real_argument("scale", fractions.Fraction(1, 4)) == 0.25
    assert real_argument("scale", float("inf")) == float("inf")  # a float infinity is a float


@pytest.mark.parametrize(("value", "text", "rounded"), [
    (fractions.Fraction(1, 10**400), "<a Fraction of 1 bit over 1329 bits>", "0.0"),
    (fractions.Fraction(-1, 10**400), "<a negative Fraction of 1 bit over 1329 bits>", "-0.0"),
], ids=["1/10**400", "-1/10**400"])
@pytest.mark.parametrize("field", ["scale", "weight", "value"])
def test_a_nonzero_exact_argument_that_rounds_to_zero_is_refused(field: str, value: object,
                                                                 text: str, rounded: str) -> None:
    """A scale or weight of Fraction(1, 10**400) was taken as 0.0 (a scale of 0.0 sends an
    elided round of weight 0.0, which realized nothing) and Fraction(-1, 10**400) as -0.0:
    refused, named as given, as a Fraction past the f64 range is; a float is taken as it is."""
    reason = f"nonzero, but rounds to {rounded} in f64"
    with pytest.raises(LocalProtocolError) as ei:
        real_argument(field, value)
    assert isinstance(ei.value, InvalidValue) and ei.value.error_id == "client.bad_argument"
    assert dict(ei.value.fields) == {"field": field, "value": value, "reason": reason}
    assert str(ei.value) == f"cpu_reduce: {field} = {text} is invalid: {reason}"
    assert real_argument(field, fractions.Fraction(0)) == 0.0
    assert real_argument(field, fractions.Fraction(3, 2**1076)) == 5e-324
    assert real_argument(field, 1e-400) == 0.0  # the float 0.0

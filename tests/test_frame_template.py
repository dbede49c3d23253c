"""FrameTemplate (a reusable wire image of one frame layout) and the batched bf16 pre-scale
(scale_to_bf16, bf16_from_f32 / bf16_to_f32 into a caller's buffer): the bytes are those of
the one-shot encoders and kernels, for every layout shape and value class."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import (
    FrameTemplate,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_len_prefix,
    encode_round_frame_bytes,
)
from flodl_proto.errors import InvalidValue, LimitExceeded
from flodl_proto.reduce import bf16_from_f32, bf16_to_f32, scale_payload, scale_to_bf16

SALT = bytes(range(16))

LAYOUTS = [
    [],
    [(0, (4,))],
    [(1, (7,))],
    [(0, ())],
    [(1, (0,))],
    [(0, (0, 3)), (1, (2, 3, 1))],
    [(0, (3, 4)), (1, (5,)), (0, ()), (1, (0, 7)), (0, (2, 2, 2))],
]


def _filled(tpl: FrameTemplate, seed: int) -> RoundFrame:
    """Write random values (NaN, infinities and signed zeros among them) into every payload
    of ``tpl``; return the RoundFrame carrying the same payloads."""
    rng = np.random.default_rng(seed)
    tensors = []
    for (dtype, shape), view in zip(tpl.layout, tpl.payloads, strict=True):
        vals = rng.standard_normal(view.size).astype(np.float32)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0], np.float32)
        vals[: min(4, vals.size)] = specials[: min(4, vals.size)]
        view[...] = vals.astype(view.dtype).reshape(view.shape)
        tensors.append(TensorPayload(dtype, shape, np.ascontiguousarray(view).tobytes()))
    return RoundFrame(tpl.kind, 0.0, tensors)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: str(lay))
@pytest.mark.parametrize("kind", [RoundKind.MODEL, RoundKind.CONTROL])
def test_sealed_template_is_the_encoded_frame(layout: list[tuple[int, tuple[int, ...]]],
                                              kind: RoundKind) -> None:
    lead = encode_len_prefix(0)  # any bytes before the frame
    tpl = FrameTemplate(kind, layout, lead)
    assert tpl.layout == tuple((d, s) for d, s in layout) and tpl.kind is kind
    for (dtype, shape), view in zip(layout, tpl.payloads, strict=True):
        assert view.shape == shape and view.flags.writeable
        assert view.dtype == (np.dtype("<f4") if dtype == 0 else np.dtype(ml_dtypes.bfloat16))
    for seed, weight in enumerate([0.0, 0.75, 3.0, 1e300, -0.0]):
        ref = _filled(tpl, seed)
        got = bytes(tpl.seal(weight, SALT))
        want = lead + encode_round_frame_bytes(
            RoundFrame(kind, weight, ref.tensors), SALT)
        assert got == want
        assert tpl.wire_len == len(want) - len(lead)


def test_a_bad_weight_is_refused_and_the_image_keeps_its_bytes() -> None:
    tpl = FrameTemplate(RoundKind.MODEL, [(0, (2,))])
    tpl.payloads[0][...] = [1.0, 2.0]
    before = bytes(tpl.seal(0.5, SALT))
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(InvalidValue, match="weight"):
            tpl.seal(bad, SALT)
    assert bytes(tpl.seal(0.5, SALT)) == before
    with pytest.raises(InvalidValue, match="salt"):
        tpl.seal(0.5, b"short")


def test_a_template_refuses_what_a_frame_refuses() -> None:
    with pytest.raises(InvalidValue, match=r"dtype.*7"):
        FrameTemplate(RoundKind.MODEL, [(7, (2,))])
    with pytest.raises(InvalidValue, match="kind"):
        FrameTemplate(5, [(0, (2,))])
    with pytest.raises(LimitExceeded, match="65536"):
        FrameTemplate(RoundKind.MODEL, [(0, (0,))] * 65537)


def _values() -> np.ndarray:
    rng = np.random.default_rng(11)
    v = rng.standard_normal(3000).astype(np.float32) * np.float32(1e3)
    v[:12] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3.4e38, -3.4e38,
              1.0, 2.0 ** -133]
    v[12:16] = np.array([0x7F800001, 0xFFC00123, 0x7FBFFFFF, 0x3F808000],
                        np.uint32).view(np.float32)  # NaN payloads; a tie to even
    return v


@pytest.mark.parametrize("factor", [1.0, 0.3, 1 / 7, 0.0, -2.5, float("inf"), 1e-30])
@pytest.mark.parametrize("source", ["f32", "bf16"])
def test_scale_to_bf16_is_the_per_tensor_scale(factor: float, source: str) -> None:
    v = _values()
    cuts = [0, 5, 5, 517, 1200, 3000]  # an empty tensor among them
    if source == "bf16":
        bits = bf16_from_f32(v)
        srcs = [bits[a:b] for a, b in itertools.pairwise(cuts)]
        want = [bytes(scale_payload(1, s.tobytes(), factor)) for s in srcs]
    else:
        srcs = [v[a:b] for a, b in itertools.pairwise(cuts)]
        with np.errstate(all="ignore"):
            want = [bf16_from_f32(s * np.float32(factor)).tobytes() for s in srcs]
    buf = np.zeros(2 * 3000 + 1, np.uint8)  # destinations at odd offsets: unaligned
    dsts = [buf[1 + 2 * a:1 + 2 * b].view(ml_dtypes.bfloat16)
            for a, b in itertools.pairwise(cuts)]
    scale_to_bf16(srcs, factor, dsts)
    assert [d.tobytes() for d in dsts] == want
    assert buf[0] == 0


def test_scale_to_bf16_refuses_mixed_or_mismatched_arrays() -> None:
    f = np.ones(4, np.float32)
    u = np.ones(4, np.uint16)
    d = np.zeros(4, np.uint16)
    with pytest.raises(ValueError, match="all <f4 or all <u2"):
        scale_to_bf16([f, u], 1.0, [d, d.copy()])
    with pytest.raises(ValueError, match="all <f4 or all <u2"):
        scale_to_bf16([np.ones(4)], 1.0, [d])
    with pytest.raises(ValueError, match="one length"):
        scale_to_bf16([f], 1.0, [np.zeros(3, np.uint16)])
    with pytest.raises(ValueError, match="one length"):
        scale_to_bf16([f], 1.0, [np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="2 sources for 1"):
        scale_to_bf16([f, f], 1.0, [d])
    scale_to_bf16([], 1.0, [])  # nothing to do


def test_bf16_conversions_into_a_callers_buffer() -> None:
    v = _values()
    buf = np.zeros(2 * v.size + 1, np.uint8)
    dst = buf[1:].view(np.uint16)
    got = bf16_from_f32(v.reshape(30, 100), out=dst)
    assert got.shape == (30, 100) and dst.tobytes() == bf16_from_f32(v).tobytes()
    wbuf = np.zeros(4 * v.size + 2, np.uint8)
    wide = wbuf[2:].view(np.float32)
    back = bf16_to_f32(dst, out=wide)
    assert back.tobytes() == bf16_to_f32(dst).tobytes() == wide.tobytes()
    with pytest.raises(ValueError, match="2-byte"):
        bf16_from_f32(v, out=np.zeros(v.size, np.float32))
    with pytest.raises(ValueError, match="2-byte"):
        bf16_from_f32(v, out=np.zeros(v.size - 1, np.uint16))
    with pytest.raises(ValueError, match="float32"):
        bf16_to_f32(dst, out=np.zeros(v.size, np.float64))

"""FrameTemplate, a reusable wire image of one frame layout: its sealed bytes are those of the
one-shot encoder, for every layout shape, kind, weight and value class."""

from __future__ import annotations

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


def test_without_a_lead_the_record_is_the_frame() -> None:
    tpl = FrameTemplate(RoundKind.CONTROL, [(0, (3,))])
    tpl.payloads[0][...] = [1.0, -2.0, 0.5]
    frame = RoundFrame(RoundKind.CONTROL, 2.0, [TensorPayload.from_array(tpl.payloads[0])])
    assert bytes(tpl.seal(2.0, SALT)) == encode_round_frame_bytes(frame, SALT)


def test_a_template_refuses_what_a_frame_refuses() -> None:
    with pytest.raises(InvalidValue) as ei:
        FrameTemplate(RoundKind.MODEL, [(7, (2,))])
    assert ei.value.error_id == "frame.bad_field"
    assert dict(ei.value.fields) == {
        "field": "dtype", "value": 7,
        "reason": "a template carries f32 (0) or bf16 (1) payloads"}
    with pytest.raises(InvalidValue, match="kind"):
        FrameTemplate(5, [(0, (2,))])
    with pytest.raises(LimitExceeded, match="65536"):
        FrameTemplate(RoundKind.MODEL, [(0, (0,))] * 65537)

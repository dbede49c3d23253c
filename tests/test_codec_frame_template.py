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
    template,
)
from flodl_proto.errors import InvalidValue, LimitExceeded, LocalProtocolError

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
    with pytest.raises(LimitExceeded) as big:
        FrameTemplate(RoundKind.MODEL, [(0, (0,))] * 65537)
    assert big.value.error_id == "frame.too_many_tensors_local"
    assert dict(big.value.fields) == {"count": 65537, "cap": 65536}


def test_a_template_takes_what_a_frame_takes_at_its_limits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly the tensor cap (lowered to 3 here: 65,536 tensors take seconds to build), and
    64 dims (NumPy's limit), are accepted."""
    monkeypatch.setattr(template, "MAX_ROUND_FRAME_TENSORS", 3)
    assert len(FrameTemplate(RoundKind.MODEL, [(0, (0,))] * 3).payloads) == 3
    with pytest.raises(LimitExceeded) as big:
        FrameTemplate(RoundKind.MODEL, [(0, (0,))] * 4)
    assert dict(big.value.fields) == {"count": 4, "cap": 3}
    tpl = FrameTemplate(RoundKind.MODEL, [(1, (1,) * 64)])
    assert tpl.payloads[0].shape == (1,) * 64


@pytest.mark.parametrize(("layout", "error_id", "fields"), [
    ([(0, (-1,))], "frame.dim_too_large", {"index": 0, "dim": 0, "value": -1}),
    ([(0, (2,)), (1, (3, 2 ** 33))], "frame.dim_too_large",  # refused before 64 GiB are built
     {"index": 1, "dim": 1, "value": 2 ** 33}),
    ([(0, (2.5,))], "frame.bad_field",  # never truncated into a 2-element tensor
     {"field": "layout[0]", "value": (0, (2.5,)),
      "reason": "not a (dtype tag, shape of ints) pair"}),
    ([(0, (2,)), (1.7, (2,))], "frame.bad_field",  # never taken as bf16
     {"field": "layout[1]", "value": (1.7, (2,)),
      "reason": "not a (dtype tag, shape of ints) pair"}),
    ([(0, (2, True))], "frame.bad_field",  # a bool dim is not 1
     {"field": "layout[0]", "value": (0, (2, True)),
      "reason": "not a (dtype tag, shape of ints) pair"}),
    ([(True, (2,))], "frame.bad_field",  # a bool dtype is not bf16
     {"field": "layout[0]", "value": (True, (2,)),
      "reason": "not a (dtype tag, shape of ints) pair"}),
    ([(0, (2, 1.0))], "frame.bad_field",  # a float dim, 1.0 too
     {"field": "layout[0]", "value": (0, (2, 1.0)),
      "reason": "not a (dtype tag, shape of ints) pair"}),
    ([(0, "3")], "frame.bad_type",  # a shape given as text: its characters are no dims
     {"field": "layout[0] shape", "expected": "a sequence of ints (text is none)",
      "got": "str"}),
    # a dtype or dim that is no number is the wrong type of argument (it read
    # "layout[0] = ('f32', (2,)) is invalid: not a (dtype tag, shape of ints) pair")
    ([(0, (2,)), ("f32", (2,))], "frame.bad_type",
     {"field": "layout[1] dtype", "expected": "a wire dtype tag (0 f32 or 1 bf16)",
      "got": "str"}),
    ([(None, (2,))], "frame.bad_type",
     {"field": "layout[0] dtype", "expected": "a wire dtype tag (0 f32 or 1 bf16)",
      "got": "None"}),
    ([(b"\x00", (2,))], "frame.bad_type",
     {"field": "layout[0] dtype", "expected": "a wire dtype tag (0 f32 or 1 bf16)",
      "got": "bytes"}),
    ([(0, ("3",))], "frame.bad_type",
     {"field": "layout[0] shape[0]", "expected": "a dim (an integer 0..2**32-1)",
      "got": "str"}),
    ([(1, (2, None))], "frame.bad_type",
     {"field": "layout[0] shape[1]", "expected": "a dim (an integer 0..2**32-1)",
      "got": "None"}),
    ([(0, 3)], "frame.bad_field",
     {"field": "layout[0]", "value": (0, 3), "reason": "not a (dtype tag, shape of ints) pair"}),
    ([(0,)], "frame.bad_field",
     {"field": "layout[0]", "value": (0,), "reason": "not a (dtype tag, shape of ints) pair"}),
    (None, "frame.bad_type",
     {"field": "layout", "expected": "a sequence of (dtype tag, shape) pairs", "got": "None"}),
    (5, "frame.bad_type",
     {"field": "layout", "expected": "a sequence of (dtype tag, shape) pairs", "got": "int"}),
    ([(0, (1,) * 65)], "tensor.ndim_unsupported",
     {"where": "FrameTemplate", "ndim": 65, "max": 64}),
    # the dim count is refused before a dim is converted or held: a bad 66th dim, a range
    # of 10**12 dims, a generator (its count is not known ahead: "more than 64")
    ([(0, (1,) * 65 + ("x",))], "tensor.ndim_unsupported",
     {"where": "FrameTemplate", "ndim": 66, "max": 64}),
    ([(1, range(10**12))], "tensor.ndim_unsupported",
     {"where": "FrameTemplate", "ndim": 10**12, "max": 64}),
    ([(0, (1 for _ in range(65)))], "tensor.ndim_unsupported",
     {"where": "FrameTemplate", "ndim": "more than 64", "max": 64}),
    ([(0, iter(int, 1))], "tensor.ndim_unsupported",  # a shape that never ends
     {"where": "FrameTemplate", "ndim": "more than 64", "max": 64}),
    ([(0, (2 ** 28,)), (1, (1,))], "template.too_large",  # 1 GiB + 2 bytes
     {"index": 1, "total": 2 ** 30 + 2, "ceiling": 2 ** 30}),
    ([(1, (0, 2 ** 32 - 1, 2 ** 32 - 1, 2 ** 32 - 1))], "tensor.shape_unrepresentable_local",
     {"where": "FrameTemplate", "shape": [0, 2 ** 32 - 1, 2 ** 32 - 1, 2 ** 32 - 1]}),
], ids=lambda v: str(v)[:40])
def test_a_bad_layout_is_a_typed_local_error_before_the_image_is_built(
        layout: object, error_id: str, fields: dict[str, object]) -> None:
    with pytest.raises((InvalidValue, LimitExceeded)) as ei:
        FrameTemplate(RoundKind.MODEL, layout)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == error_id and dict(ei.value.fields) == fields


@pytest.mark.parametrize(("layout", "text"), [
    ([("bf16", (2,))], "round_frame: layout[0] dtype must be a wire dtype tag (0 f32 or 1 bf16), "
                       "got str"),
    ([(0, (2,)), (1, (3, "4"))], "round_frame: layout[1] shape[1] must be a dim (an integer "
                                 "0..2**32-1), got str"),
    ([(True, (2,))], "round_frame: layout[0] = (True, (2,)) is invalid: not a (dtype tag, "
                     "shape of ints) pair"),
])
def test_a_layout_dtype_or_dim_is_named_with_what_is_wrong(layout: object, text: str) -> None:
    """Text where a dtype tag or a dim goes is named with its type, a bool or a float with
    the entry."""
    with pytest.raises(InvalidValue) as ei:
        FrameTemplate(RoundKind.MODEL, layout)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError) and str(ei.value) == text


def test_the_ceiling_bounds_the_image_and_lead_and_kind_are_checked() -> None:
    tpl = FrameTemplate(RoundKind.MODEL, [(0, (4,)), (1, (2,))], ceiling=20)  # 16 + 4 bytes
    assert tpl.wire_len == 25 + 14 + 16 + 14 + 4
    with pytest.raises(LimitExceeded) as ei:
        FrameTemplate(RoundKind.MODEL, [(0, (4,)), (1, (3,))], ceiling=20)
    assert str(ei.value) == ("round_frame: a frame template's payloads reach 22 bytes at "
                             "tensor[1], above its ceiling 20")
    with pytest.raises(InvalidValue) as ei2:
        FrameTemplate(RoundKind.MODEL, [(0, (4,))], ceiling=-1)
    assert ei2.value.error_id == "ceiling.invalid"
    with pytest.raises(InvalidValue) as ei2:
        FrameTemplate(RoundKind.MODEL, [(0, (4,))], "ab")  # type: ignore[arg-type]
    assert ei2.value.error_id == "codec.not_bytes_like"
    assert dict(ei2.value.fields) == {"field": "lead", "got": "str"}
    with pytest.raises(InvalidValue) as ei2:
        FrameTemplate(2, [(0, (2 ** 40,))])  # the kind first, nothing built
    assert dict(ei2.value.fields)["field"] == "kind"
    for kind in (True, False, 1.0):  # a bool or float kind is none (True is not Control)
        with pytest.raises(InvalidValue) as ei2:
            FrameTemplate(kind, [(0, (4,))])
        assert dict(ei2.value.fields) == {"field": "kind", "value": kind,
                                          "reason": "not 0 (Model) or 1 (Control)"}


def test_seal_checks_salt_and_weight_before_writing() -> None:
    tpl = FrameTemplate(RoundKind.MODEL, [(0, (2,))])
    tpl.payloads[0][...] = [1.0, 2.0]
    before = bytes(tpl.seal(0.5, SALT))
    for salt, error_id in ((b"short", "salt.bad_length"), (None, "salt.not_bytes_like"),
                           (16, "salt.not_bytes_like")):
        with pytest.raises(InvalidValue) as ei:
            tpl.seal(3.0, salt)  # type: ignore[arg-type]
        assert ei.value.error_id == error_id
        assert bytes(tpl._buf) == before  # the weight was not written either
    for weight, reason in (("1.5", "not a real number"), (None, "not a real number"),
                           (10 ** 400, "not a finite non-negative realized-work mass")):
        with pytest.raises(InvalidValue) as ei:
            tpl.seal(weight, SALT)  # type: ignore[arg-type]
        assert ei.value.fields["field"] == "weight" and ei.value.fields["reason"] == reason
        with pytest.raises(InvalidValue) as ei:
            RoundFrame(RoundKind.MODEL, weight, [])  # type: ignore[arg-type]
        assert ei.value.fields["field"] == "weight" and ei.value.fields["reason"] == reason
    assert bytes(tpl.seal(0.5, SALT)) == before


_BYTES_ARE_NONE = ("not a sequence of ints (bytes are none: each byte would be taken as a dim; "
                   "pass a tuple of ints)")


@pytest.mark.parametrize(("shape", "error_id", "text"), [
    # its bytes were taken as the dims: b"\x02" as the shape (2,), b"" as ()
    (b"\x02", "frame.bad_field", "shape = b'\\x02' is invalid: " + _BYTES_ARE_NONE),
    (bytearray(b"\x02\x03"), "frame.bad_field",
     "shape = b'\\x02\\x03' is invalid: " + _BYTES_ARE_NONE),
    (memoryview(b"\x02"), "frame.bad_field", "shape = b'\\x02' is invalid: " + _BYTES_ARE_NONE),
    (b"", "frame.bad_field", "shape = b'' is invalid: " + _BYTES_ARE_NONE),
    # text: was 'layout[0] = (0, '3') is invalid: not a (dtype tag, shape of ints) pair'
    ("3", "frame.bad_type", "shape must be a sequence of ints (text is none), got str"),
    (np.str_("3"), "frame.bad_type", "shape must be a sequence of ints (text is none), got "
                                     "NumPy text (str_ of dtype <U1)"),
    # NumPy text: its characters were named as dims, an empty one taken as the shape ()
    (np.array(["ab"]), "frame.bad_type", "shape must be a sequence of ints (text is none), got "
                                         "NumPy text (ndarray of dtype <U2)"),
    (np.array([], "U1"), "frame.bad_type", "shape must be a sequence of ints (text is none), "
                                           "got NumPy text (ndarray of dtype <U1)"),
    # no order of dims: {3, 2} was taken as (2, 3), {2: 1} as (2,)
    ({3, 2}, "frame.bad_type",
     "shape must be a sequence of ints (a set or dict has no order), got set"),
    ({2: 1}, "frame.bad_type",
     "shape must be a sequence of ints (a set or dict has no order), got dict"),
])
def test_a_layout_shape_is_refused_as_a_payload_refuses_it(shape: object, error_id: str,
                                                             text: str) -> None:
    """A template's shape is refused with the error of a TensorPayload given that shape, naming
    ``layout[i] shape``, before anything is built."""
    with pytest.raises(InvalidValue) as ei:
        FrameTemplate(RoundKind.MODEL, [(0, (2,)), (0, shape)])  # type: ignore[list-item]
    assert isinstance(ei.value, LocalProtocolError) and ei.value.__cause__ is None
    assert (ei.value.error_id, str(ei.value)) == (error_id, f"round_frame: layout[1] {text}")
    with pytest.raises(InvalidValue) as ep:
        TensorPayload(0, shape, b"")  # type: ignore[arg-type]
    assert (ep.value.error_id, str(ep.value)) == (error_id, f"round_frame: {text}")
    # a NumPy array of integers is a shape to both
    assert FrameTemplate(RoundKind.MODEL, [(0, np.array([2, 3]))]).layout == ((0, (2, 3)),)
    assert TensorPayload(0, np.array([2, 3]), bytes(24)).shape == (2, 3)

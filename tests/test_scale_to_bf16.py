"""The batched bf16 pre-scale (scale_to_bf16) and the bf16 conversions into a caller's buffer
(bf16_from_f32 / bf16_to_f32 with out=): the bytes of the per-tensor kernels, for every value
class, with unaligned destinations."""

from __future__ import annotations

import fractions
import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.reduce import bf16_from_f32, bf16_to_f32, scale_payload, scale_to_bf16
from flodl_proto.reduce.payload import Bf16Scaler


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
    with pytest.raises(ValueError, match=r"dsts\[0\] must be a contiguous array of 4 2-byte "
                                         r"elements, got 3 elements"):
        scale_to_bf16([f], 1.0, [np.zeros(3, np.uint16)])
    with pytest.raises(ValueError, match=r"dsts\[0\] must hold bf16 bits as uint16"):
        scale_to_bf16([f], 1.0, [np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="2 sources for 1"):
        scale_to_bf16([f, f], 1.0, [d])
    scale_to_bf16([], 1.0, [])  # nothing to do
    # complex is refused whole, source or factor, before anything is written (no hole to close:
    # pinned beside bf16_from_f32's refusal)
    with pytest.raises(ValueError, match=r"all <f4 or all <u2, got \['complex64'\]"):
        scale_to_bf16([np.ones(4, np.complex64)], 1.0, [d])
    for factor in (1j, np.complex64(1)):
        with pytest.raises(ValueError, match="factor must be a real number"):
            scale_to_bf16([f], factor, [d])  # type: ignore[arg-type]
    assert d.tolist() == [0, 0, 0, 0]


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
    with pytest.raises(ValueError, match="out must hold bf16 bits as uint16"):
        bf16_from_f32(v, out=np.zeros(v.size, np.float32))
    with pytest.raises(ValueError, match="2-byte"):
        bf16_from_f32(v, out=np.zeros(v.size - 1, np.uint16))
    with pytest.raises(ValueError, match="float32"):
        bf16_to_f32(dst, out=np.zeros(v.size, np.float64))


@pytest.mark.parametrize(("values", "dtype"), [
    (np.array([1.5 + 2j, 3.0], np.complex64), "complex64"),
    ([1.5 + 2j, 3.0], "complex128"),  # the imaginary part is never dropped in silence
    (["1.5", "2"], "<U3"),
    (np.array([1.0, 2.0], object), "object"),
    (np.array(["2020-01-01", "2020-01-02"], "datetime64[D]"), "datetime64[D]"),
])
def test_bf16_from_f32_refuses_non_real_values_before_writing(values: object, dtype: str
                                                               ) -> None:
    out = np.full(2, 0xABCD, np.uint16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ValueError, not a ComplexWarning and a result
        for kwargs in ({}, {"out": out}):
            with pytest.raises(ValueError) as ei:
                bf16_from_f32(values, **kwargs)  # type: ignore[arg-type]
            assert str(ei.value) == ("values must be real numbers (f32, or a real dtype to cast "
                                     f"to f32), got {dtype} values")
    assert out.tolist() == [0xABCD, 0xABCD]
    # real values of any dtype are still cast (bool, ints, f64, bf16)
    assert bf16_from_f32([True, 2, 0.5]).tolist() == [0x3F80, 0x4000, 0x3F00]
    assert bf16_from_f32(np.array([1.5], ml_dtypes.bfloat16)).tolist() == [0x3FC0]


def test_bf16_from_f32_of_values_beyond_f32_is_infinity_without_a_warning() -> None:
    """f64 values beyond f32's range cast to +-inf (upstream's f32 has no other value); the
    cast's overflow RuntimeWarning was raised as an error where warnings are errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bf16_from_f32([1e300, -1e300, 1.0]).tolist() == [0x7F80, 0xFF80, 0x3F80]
        assert bf16_from_f32(np.array([1e39])).tolist() == [0x7F80]


def test_scale_to_bf16_refuses_strided_arrays_and_warns_of_nothing() -> None:
    v = np.arange(8, dtype=np.float32)
    d = np.zeros(4, np.uint16)
    with pytest.raises(ValueError, match="contiguous"):
        scale_to_bf16([v[::2]], 1.0, [d])
    with pytest.raises(ValueError, match="contiguous"):
        scale_to_bf16([v[:4]], 1.0, [np.zeros(8, np.uint16)[::2]])
    inf_nan = np.array([np.inf, np.nan, 3e38, 1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0 * inf, a NaN cast and an overflow stay silent
        scale_to_bf16([inf_nan], 0.0, [d])
        scale_to_bf16([inf_nan], 1e30, [d])
    with np.errstate(all="ignore"):
        want = bf16_from_f32(inf_nan * np.float32(1e30))
    assert d.tolist() == want.tolist()


def test_bf16_conversions_keep_the_shape_into_a_flat_or_shaped_buffer() -> None:
    v = _values().reshape(30, 100)
    flat16 = np.zeros(3000, np.uint16)
    got = bf16_from_f32(v, out=flat16)
    assert got.shape == (30, 100) and flat16.tobytes() == bf16_from_f32(v).tobytes()
    shaped16 = np.zeros((100, 30), ml_dtypes.bfloat16)
    assert bf16_from_f32(v, out=shaped16).shape == (30, 100)
    assert shaped16.view(np.uint16).tobytes() == flat16.tobytes()
    bits = flat16.reshape(30, 100)
    flat32 = np.zeros(3000, np.float32)
    wide = bf16_to_f32(bits, out=flat32)
    assert wide.shape == (30, 100) and flat32.tobytes() == bf16_to_f32(bits).tobytes()
    shaped32 = np.zeros((60, 50), np.float32)
    assert bf16_to_f32(bits, out=shaped32).shape == (30, 100)
    assert shaped32.tobytes() == flat32.tobytes()
    with pytest.raises(ValueError, match="contiguous float32"):
        bf16_to_f32(bits, out=np.zeros(6000, np.float32)[::2])


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("dtype", ["<f2", "<i2", ">u2", ">f4"])
def test_a_buffer_that_would_not_read_back_as_the_bits_is_refused(dtype: str) -> None:
    """bf16 bits written into a float16, an int16 or a big-endian array would read back as
    other values: each conversion refuses such an ``out`` (and a read-only one, a list) with a
    ValueError naming it, and writes nothing."""
    x = np.array([1.5, -2.0, 3.25], np.float32)
    for call in (lambda o: bf16_from_f32(x, out=o),
                 lambda o: scale_to_bf16([x, x], 2.0, [np.zeros(3, np.uint16), o])):
        for bad in (np.zeros(3, dtype), _read_only(np.zeros(3, np.uint16)), [0, 0, 0]):
            before = np.asarray(bad).tobytes()
            with pytest.raises(ValueError, match=r"(out|dsts\[1\]) (must|is read-only)"):
                call(bad)
            assert np.asarray(bad).tobytes() == before
    bits = bf16_from_f32(x)
    with pytest.raises(ValueError, match="out must be a contiguous float32 array of 3"):
        bf16_to_f32(bits, out=np.zeros(3, dtype))
    with pytest.raises(ValueError, match="out is read-only"):
        bf16_to_f32(bits, out=_read_only(np.zeros(3, np.float32)))


def test_bits_are_bit_patterns_and_factor_is_a_number() -> None:
    """A bfloat16 array given as ``bits`` is read as its bits; float values or integers
    outside 0..0xFFFF are refused rather than cast into other bits; a scale factor of None or
    text is refused, never taken as NaN."""
    x = np.array([1.5, -2.0, 3.25], np.float32)
    assert bf16_to_f32(x.astype(ml_dtypes.bfloat16)).tolist() == [1.5, -2.0, 3.25]
    with pytest.raises(ValueError, match="bf16 bit patterns \\(uint16\\), got float32 values"):
        bf16_to_f32(x)
    with pytest.raises(ValueError, match=r"in 0\.\.0xFFFF, got -1\.\.70000"):
        bf16_to_f32(np.array([-1, 70000], np.int32))
    assert bf16_to_f32([0x3FC0, 0]).tolist() == [1.5, 0.0]
    d = np.zeros(3, np.uint16)
    for factor in (None, "2.0"):
        with pytest.raises(ValueError, match="factor must be a real number"):
            scale_to_bf16([x], factor, [d])  # type: ignore[arg-type]
        assert d.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"srcs\[0\] must be a NumPy array, got list"):
        scale_to_bf16([[1.0]], 1.0, [d[:1]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"srcs\[0\] must be a NumPy array, got None$"):
        scale_to_bf16([None], 1.0, [d[:1]])  # type: ignore[list-item]


def test_scale_to_bf16_names_a_shaped_destination_and_a_strided_source() -> None:
    msg = ("each source and destination must be flat, contiguous and of one length, the "
           "destination of 2-byte elements")
    f = np.ones(4, np.float32)
    with pytest.raises(ValueError) as ei:
        scale_to_bf16([f], 1.0, [np.zeros((2, 2), np.uint16)])  # four elements, not flat
    assert str(ei.value) == msg
    with pytest.raises(ValueError) as ei:
        scale_to_bf16([np.ones(8, np.float32)[::2]], 1.0, [np.zeros(4, np.uint16)])
    assert str(ei.value) == msg


def test_bf16_to_f32_takes_integer_bits_only_in_the_u16_range() -> None:
    ok = np.array([0, 0x3F80, 0xFFFF], np.int64)
    assert bf16_to_f32(ok).tobytes() == bf16_to_f32(ok.astype(np.uint16)).tobytes()
    for bad in ([-1, 2], [0, 65536], [70000, 3]):
        with pytest.raises(ValueError) as ei:
            bf16_to_f32(np.array(bad, np.int64))
        assert str(ei.value) == (f"bits must be bf16 bit patterns in 0..0xFFFF, got "
                                 f"{min(bad)}..{max(bad)}")
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError) as ei:
        bf16_to_f32(ok.astype(np.uint16), out=ro)
    assert str(ei.value) == "out is read-only"


_SHAPES: list[tuple[int, ...]] = [(5,), (), (0, 3), (6, 7), (2, 3, 4), (1200,)]


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "shaped"])
@pytest.mark.parametrize("source", ["f32", "bf16"])
def test_a_scaler_writes_what_scale_to_bf16_writes(flat: bool, source: str) -> None:
    """:class:`Bf16Scaler` keeps its destinations (checked once) and writes, run after run, the
    bytes :func:`scale_to_bf16` gives for the same sources flattened, into unaligned places,
    for every value class, flat or shaped (0-d, empty, strided sources among them)."""
    shapes = [(int(np.prod(s)),) for s in _SHAPES] if flat else _SHAPES
    sizes = [int(np.prod(s)) for s in shapes]
    buf = np.zeros(2 * sum(sizes) + 3, np.uint8)
    dsts, at = [], 1  # odd offsets: unaligned
    for s, n in zip(shapes, sizes, strict=True):
        dsts.append(buf[at:at + 2 * n].view(ml_dtypes.bfloat16).reshape(s))
        at += 2 * n
    scaler = Bf16Scaler(dsts)
    assert scaler.shapes == tuple(shapes)
    v = _values()
    for round_, factor in enumerate([1.0, 0.3, float("inf"), 0.0, -2.5, 1 / 7]):
        vals = np.roll(v, round_ * 101)[:sum(sizes)]
        cuts = np.cumsum([0, *sizes])
        srcs = []
        for (a, b), s in zip(itertools.pairwise(cuts), shapes, strict=True):
            part = vals[a:b]
            if len(s) == 2 and s[0] and round_ % 2:  # a strided source of the same shape
                wide = np.zeros((s[0], 2 * s[1]), np.float32)
                wide[:, ::2] = part.reshape(s)
                arr = wide[:, ::2]
            else:
                arr = part.reshape(s)
            srcs.append(bf16_from_f32(arr) if source == "bf16" else arr)
        want = [np.zeros(n, np.uint16) for n in sizes]
        scale_to_bf16([np.ascontiguousarray(s).reshape(-1) for s in srcs], factor, want)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with np.errstate(all="ignore"):
                scaler.run(srcs, np.float32(factor), source == "bf16")
        assert [d.tobytes() for d in dsts] == [w.tobytes() for w in want]
        assert buf[0] == 0 and buf[-1] == 0 and buf[-2] == 0


def test_a_flat_layout_is_gathered_along_its_axis() -> None:
    flat = Bf16Scaler([np.zeros(3, np.uint16), np.zeros(0, np.uint16)])
    shaped = Bf16Scaler([np.zeros(3, np.uint16), np.zeros((2, 2), np.uint16)])
    assert flat._axis == 0 and shaped._axis is None  # shaped sources are read in C order


def test_a_scaler_of_nothing_writes_nothing() -> None:
    for dsts in ([], [np.zeros(0, np.uint16), np.zeros((0, 4), ml_dtypes.bfloat16)]):
        scaler = Bf16Scaler(dsts)
        scaler.run([np.zeros(d.shape, np.float32) for d in dsts], np.float32(2.0), False)


def test_a_scaler_checks_its_destinations_once() -> None:
    with pytest.raises(ValueError, match=r"dsts\[1\] must be a NumPy array, got list"):
        Bf16Scaler([np.zeros(2, np.uint16), [0, 0]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"dsts\[0\] must hold bf16 bits as uint16"):
        Bf16Scaler([np.zeros(2, np.float16)])
    with pytest.raises(ValueError, match=r"dsts\[0\] must be a contiguous array of 2 2-byte "
                                         r"elements, got 2 elements, strided"):
        Bf16Scaler([np.zeros(4, np.uint16)[::2]])
    ro = np.zeros(2, np.uint16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"dsts\[0\] is read-only"):
        Bf16Scaler([ro])


def test_a_factor_takes_the_real_number_rule_of_scale_payload() -> None:
    """A factor of 10**400 raised a bare OverflowError and Fraction(10**400) was refused as no
    real number: each is an infinity of its sign, the bytes scale_payload gives; a Fraction is
    a real number (Fraction(1, 4) as 0.25), and a nonzero one whose f64 is a zero is refused,
    named as given, before anything is written."""
    x = np.array([1.5, -2.0, 3.25], np.float32)
    for factor in (10**400, fractions.Fraction(10**400), -(10**400),
                   fractions.Fraction(-(10**400), 3), fractions.Fraction(1, 4)):
        d = np.zeros(3, np.uint16)
        scale_to_bf16([x], factor, [d])  # type: ignore[arg-type]
        assert d.tobytes() == bytes(scale_payload(1, bf16_from_f32(x).tobytes(), factor))
    assert d.tolist() == bf16_from_f32(x * np.float32(0.25)).tolist()
    d = np.zeros(3, np.uint16)
    with pytest.raises(ValueError) as ei:
        scale_to_bf16([x], fractions.Fraction(-1, 10**400), [d])  # type: ignore[arg-type]
    assert str(ei.value) == ("factor = <a negative Fraction of 1 bit over 1329 bits> is invalid: "
                             "nonzero, but rounds to -0.0 in f64")
    assert d.tolist() == [0, 0, 0]
    with pytest.raises(ValueError) as ei:
        scale_to_bf16([x], "2.0", [d])  # type: ignore[arg-type]
    assert str(ei.value) == "factor must be a real number, got '2.0'"
    scale_to_bf16([x], True, [d])  # a bool is taken as 0 or 1, as it was
    assert d.tolist() == bf16_from_f32(x).tolist()

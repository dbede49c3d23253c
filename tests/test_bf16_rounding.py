"""bf16 encoding rounds to nearest, ties to even, never truncates, on both kernel backends
(NumPy and compiled), through every public path that encodes bf16: the fold monoid, the
controller's reduce (sum, then scaled product), the relay's HostFold, the f32 -> bf16 helper and
the payload scale.

The inputs are chosen so that truncation (keeping the top 16 bits) gives a different answer
from rounding: ``0x3F80C000`` rounds up to ``0x3F81`` (truncation: ``0x3F80``), the tie
``0x3F818000`` goes to the even ``0x3F82`` (truncation: ``0x3F81``), the tie ``0x3F808000``
stays at the even ``0x3F80``. Expected bytes come from the tests' own reference
(``tests/reference.py``)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.reduce import (
    HostFold,
    bf16_from_f32,
    reduce_realized_work,
    scale_payload,
    sum_frames,
)

from .reference import BF16_TAG, bf16_bits, ref_reduce, ref_sum

SALT = bytes(range(16))
#: (a, b) bf16 bit patterns whose f32 sum is not a bf16 value: (sum bits, rounded, truncated)
PAIRS = [
    (0x3F80, 0x3BC0, 0x3F80C000, 0x3F81, 0x3F80),  # 1 + 3 * 2**-9: above half, rounds up
    (0x3F81, 0x3B80, 0x3F818000, 0x3F82, 0x3F81),  # a tie with an odd lower half: up to even
    (0x3F80, 0x3B80, 0x3F808000, 0x3F80, 0x3F80),  # a tie with an even lower half: stays
    (0xBF80, 0xBBC0, 0xBF80C000, 0xBF81, 0xBF80),  # the same below zero
]
#: elements per tensor: the patterns repeated (long enough for any kernel's vector loop)
N = 64 * len(PAIRS)

backends = pytest.mark.parametrize("kernels", ["numpy_kernels", "compiled_kernels"])


def _bf16(bits: list[int]) -> TensorPayload:
    return TensorPayload(BF16_TAG, (len(bits),), struct.pack(f"<{len(bits)}H", *bits))


def _frames(weights: tuple[float, float] = (1.0, 0.0)) -> list[RoundFrame]:
    a = [p[0] for p in PAIRS] * (N // len(PAIRS))
    b = [p[1] for p in PAIRS] * (N // len(PAIRS))
    return [RoundFrame(RoundKind.MODEL, weights[0], [_bf16(a)]),
            RoundFrame(RoundKind.MODEL, weights[1], [_bf16(b)])]


def _bits(t: TensorPayload) -> list[int]:
    return list(struct.unpack(f"<{t.nbytes // 2}H", bytes(t.data)))


def test_the_cases_tell_rounding_from_truncation() -> None:
    for a, b, total, rounded, truncated in PAIRS:
        wide = [np.float32(struct.unpack("<f", struct.pack("<I", x << 16))[0]) for x in (a, b)]
        s = np.float32(wide[0] + wide[1])
        assert struct.unpack("<I", struct.pack("<f", float(s)))[0] == total
        assert bf16_bits(s) == rounded and total >> 16 == truncated
    assert any(r != t for *_, r, t in PAIRS)


@backends
def test_fold_monoid_rounds(kernels: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(kernels)
    got = sum_frames(_frames(), version=3)
    assert _bits(got.tensors[0]) == [p[3] for p in PAIRS] * (N // len(PAIRS))
    assert got == ref_sum(_frames(), version=3)


@backends
def test_controller_reduce_rounds_the_sum_then_the_product(kernels: str,
                                                           request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(kernels)
    for weights in ((1.0, 0.0), (2.0, 1.0), (0.5, 0.25)):
        frames = _frames(weights)
        assert reduce_realized_work(frames, version=3) == ref_reduce(frames, version=3), weights


@backends
def test_host_fold_rounds(kernels: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(kernels)
    fold = HostFold([0, 1], SALT, version=3)
    a, b = _frames()
    assert fold.deposit(0, encode_round_frame_bytes(a, SALT)) is None
    out = fold.deposit(1, encode_round_frame_bytes(b, SALT))
    assert out == encode_round_frame_bytes(ref_sum([a, b], version=3), SALT)


@backends
def test_f32_to_bf16_and_scale_round(kernels: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(kernels)
    sums = np.array([struct.unpack("<f", struct.pack("<I", p[2]))[0] for p in PAIRS] * 64,
                    np.float32)
    want = [p[3] for p in PAIRS] * 64
    assert np.asarray(bf16_from_f32(sums)).view(np.uint16).tolist() == want
    # scaling 1.0-ish bf16 values by 1 + 3 * 2**-9 gives the same products as the sums above
    ones = struct.pack("<H", 0x3F80) * len(sums)
    factor = struct.unpack("<f", struct.pack("<I", 0x3F80C000))[0]
    scaled = bytes(scale_payload(BF16_TAG, ones, factor))
    assert set(struct.unpack(f"<{len(sums)}H", scaled)) == {0x3F81}


# -- the small-tensor kernels (integer rounding or ml_dtypes' cast, NaN lanes patched) -------------
#: (f32 bits, upstream's bf16 bits): ties to even, above half, overflow to infinity, subnormals,
#: signed zeros, infinities, and NaNs (sign and top payload bits kept, quiet bit set)
ENCODE_CASES = [
    (0x3F800000, 0x3F80), (0x3F80C000, 0x3F81), (0x3F818000, 0x3F82), (0x3F808000, 0x3F80),
    (0x3F808001, 0x3F81), (0xBF80C000, 0xBF81), (0x7F7FFFFF, 0x7F80), (0xFF7FFFFF, 0xFF80),
    (0x7F7F7FFF, 0x7F7F), (0x00008000, 0x0000), (0x00018000, 0x0002), (0x00017FFF, 0x0001),
    (0x80000000, 0x8000), (0x00000000, 0x0000), (0x7F800000, 0x7F80), (0xFF800000, 0xFF80),
    (0x7FA00001, 0x7FE0), (0xFF812345, 0xFFC1), (0x7FC00000, 0x7FC0), (0x7F800001, 0x7FC0),
    (0xFFFFFFFF, 0xFFFF),
]


def _f32(bits: list[int]) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


@pytest.fixture(params=["integer", "cast"])
def small_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The small-run encoder's form: its integer rounding (a process without ml_dtypes) or
    ml_dtypes' cast (a process that has imported it), whatever this test process imported."""
    from flodl_proto._bf16 import bf16
    from flodl_proto.reduce import _small_kernels as S

    dtype = None if request.param == "integer" else bf16()
    monkeypatch.setattr(S, "loaded_bf16", lambda: dtype)
    return str(request.param)


def test_encode_bf16_small_exact_values(small_form: str) -> None:
    from flodl_proto.reduce import _kernels as K

    src = _f32([a for a, _ in ENCODE_CASES])
    want = [b for _, b in ENCODE_CASES]
    for may in (None, True):
        dst = np.full(len(src), 0xAAAA, np.uint16)
        with np.errstate(all="ignore"):
            K.encode_bf16_small(src, dst, may)
        assert [int(x) for x in dst] == want
    # told there is no NaN: the NaN lanes are not patched (no scan): the cast's default NaN,
    # or the integer rounding of the NaN's bits (a carry may leave no NaN); the others exact
    dst = np.zeros(len(src), np.uint16)
    with np.errstate(all="ignore"):
        K.encode_bf16_small(src, dst, False)
    if small_form == "cast":  # NaN source bits -> the default NaN of their sign
        unpatched = {0x7FA00001: 0x7FC0, 0xFF812345: 0xFFC0, 0x7FC00000: 0x7FC0,
                     0x7F800001: 0x7FC0, 0xFFFFFFFF: 0xFFC0}
    else:  # (b + 0x7FFF + ((b >> 16) & 1)) >> 16 of the NaN's bits, modulo 2**32
        unpatched = {0x7FA00001: 0x7FA0, 0xFF812345: 0xFF81, 0x7FC00000: 0x7FC0,
                     0x7F800001: 0x7F80, 0xFFFFFFFF: 0x0000}
    assert [int(x) for x in dst] == [unpatched.get(a, b) for a, b in ENCODE_CASES]
    finite = _f32([0x3F80C000, 0x3F818000])
    dst = np.zeros(2, np.uint16)
    K.encode_bf16_small(finite, dst, False)
    assert dst.tolist() == [0x3F81, 0x3F82]
    empty = np.zeros(0, np.uint16)
    K.encode_bf16_small(np.zeros(0, np.float32), empty)  # no scan of an empty array
    assert empty.size == 0


@pytest.mark.parametrize("n", [1, 2, 1 << 13, (1 << 14) - 1, 1 << 14, (1 << 14) + 3])
def test_encode_bf16_small_and_large_paths_agree(n: int, small_form: str) -> None:
    """encode_bf16 takes the small encoder below SMALL_ELEMS (either form) and the chunked
    integer ops from there on; both give the integer rule's bytes, NaNs included, on either
    side of the threshold."""
    from flodl_proto.reduce import _kernels as K

    assert K.SMALL_ELEMS == 1 << 14
    rng = np.random.default_rng(n)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    bits[: min(n, len(ENCODE_CASES))] = [a for a, _ in ENCODE_CASES][: min(n, len(ENCODE_CASES))]
    u = bits.astype(np.uint64)
    ref = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    src = bits.view(np.float32)
    nan = np.isnan(src)
    ref[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    dst = np.zeros(n, np.uint16)
    with np.errstate(all="ignore"):
        K.encode_bf16(src, dst, K.Workspace(n))
    assert np.array_equal(dst, ref)
    direct = np.zeros(n, np.uint16)
    with np.errstate(all="ignore"):
        K.encode_bf16_small(src, direct)
    assert np.array_equal(direct, ref)


def _upstream_encode(bits: np.ndarray) -> np.ndarray:
    """Upstream's f32 -> bf16 rule on u32 bit patterns, in u64 (no wrap-around): NaN ->
    ``(b >> 16) | 0x0040``, else ``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``."""
    b = bits.astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (b >> 16) | 0x0040, (b + 0x7FFF + ((b >> 16) & 1)) >> 16
                    ).astype(np.uint16)


def _small_patterns() -> np.ndarray:
    """Every bf16 pattern as the high half of f32 patterns whose low halves are 0, 1, just
    under, at and just over the half (0x7FFF, 0x8000, 0x8001), 0xFFFF and one random value;
    then random f32 patterns (NaNs with any payload and sign among them), random subnormals,
    the infinities and signed zeros."""
    rng = np.random.default_rng(0xBF16)
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = [np.full(1 << 16, v, np.uint32) for v in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)]
    lows.append(rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32))
    rand = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    sub = rng.integers(0, 1 << 23, 50_000, dtype=np.uint32) | (
        rng.integers(0, 2, 50_000, dtype=np.uint32) << 31)
    ends = np.array([0x7F800000, 0xFF800000, 0, 0x80000000], np.uint32)
    return np.concatenate([*(high | lo for lo in lows), rand, sub, ends])


@pytest.mark.parametrize("n", [16, 256, 1024, 4096, (1 << 14) - 1])
def test_small_encode_and_rounding_match_upstream_on_every_bf16_pattern(
        n: int, small_form: str) -> None:
    """The small-run encoder (in runs of ``n`` elements, told to scan, told exactly whether a
    run holds a NaN, and into a strided destination) and the small rounding give upstream's
    bits on every bf16 pattern with every kind of lower half, and on random f32 patterns:
    NaNs (every payload, either sign), infinities, subnormals, signed zeros."""
    from flodl_proto.reduce import _kernels as K

    bits = _small_patterns()
    want = _upstream_encode(bits)
    src = bits.view(np.float32)
    got = np.zeros(len(bits), np.uint16)
    hinted = np.zeros(len(bits), np.uint16)
    strided = np.zeros(2 * len(bits), np.uint16)
    rounded = src.copy()
    ws = K.Workspace(n)
    with np.errstate(all="ignore"):
        for s in range(0, len(bits), n):
            e = min(s + n, len(bits))
            run = src[s:e]
            has_nan = bool(np.isnan(run).any())
            K.encode_bf16_small(run, got[s:e])
            K.encode_bf16_small(run, hinted[s:e], has_nan)
            K.encode_bf16_small(run, strided[2 * s + 1:2 * e:2], None)
            K.round_bf16_small(rounded[s:e], ws, has_nan)
    assert np.array_equal(got, want)
    assert np.array_equal(hinted, want)
    assert np.array_equal(strided[1::2], want) and not strided[0::2].any()
    assert np.array_equal(rounded.view(np.uint32), want.astype(np.uint32) << 16)


def test_round_bf16_small_exact_values(small_form: str) -> None:
    from flodl_proto.reduce import _kernels as K

    src = _f32([a for a, _ in ENCODE_CASES])
    a = src.copy()
    with np.errstate(all="ignore"):
        K.round_bf16_small(a, K.Workspace(len(a)), True)
    assert a.view(np.uint32).tolist() == [b << 16 for _, b in ENCODE_CASES]
    # the general rounding gives the same bits (it takes the small path below SMALL_ELEMS)
    big = np.tile(src, (K.SMALL_ELEMS // len(src)) + 1)
    ref = big.copy()
    with np.errstate(all="ignore"):
        K._round_bf16(ref, K.Workspace(len(ref)), True)
    assert ref.view(np.uint32)[: len(src)].tolist() == [b << 16 for _, b in ENCODE_CASES]
    finite = _f32([0x3F80C000, 0x3F818000, 0x3F808000])
    K.round_bf16_small(finite, K.Workspace(3), False)
    assert finite.view(np.uint32).tolist() == [0x3F810000, 0x3F820000, 0x3F800000]

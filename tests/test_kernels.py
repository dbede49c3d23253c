"""The compiled (numba) bf16 kernels against the NumPy kernels, and the backend switch.

The two backends must give the same bytes on every bf16 pattern, in every contribution position,
with every scale the reduce can produce, at any length, chunk split and thread split, except in
one place upstream leaves to the platform (protocol facts, open question 6): when two NaNs meet,
which NaN's payload survives. There only NaN-ness is compared (:func:`_assert_same`). The
compiled kernels' own rule (the left operand's NaN) is pinned exactly."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from flodl_proto.cli import main as cli_main
from flodl_proto.codec.round_frame import (
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame_or_eos,
    encode_round_frame_bytes,
)
from flodl_proto.errors import LocalProtocolError
from flodl_proto.reduce import (
    HostFold,
    bf16_from_f32,
    reduce_realized_work,
    scale_payload,
    sum_frames,
)
from flodl_proto.reduce import _kernels as K

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
#: scales reduce_realized_work can hand the kernels: ordinary, 1, huge, tiny, 0 and inf
#: (weights 1e-300 and inf), and None (a pure sum)
SCALES = [None, np.float32(1 / 3), np.float32(1.0), np.float32(3e30), np.float32(1e-30),
          np.float32(0.0), np.float32(np.inf)]
SALT = bytes(range(16))


def _bf16_nan(b: np.ndarray) -> np.ndarray:
    return ((b & 0x7F80) == 0x7F80) & ((b & 0x007F) != 0)


def _assert_same(ref: Any, got: Any) -> None:
    """Equal bf16 payloads, except lanes where both are NaN (their payloads may differ)."""
    r = np.frombuffer(bytes(ref), np.uint16)
    g = np.frombuffer(bytes(got), np.uint16)
    assert r.shape == g.shape
    diff = r != g
    if diff.any():
        both_nan = _bf16_nan(r) & _bf16_nan(g)
        bad = np.nonzero(diff & ~both_nan)[0]
        assert bad.size == 0, (
            f"{bad.size} lanes differ, first at {bad[0]}: numpy {r[bad[0]]:#06x}, "
            f"numba {g[bad[0]]:#06x}")


def _unaligned(values: np.ndarray) -> np.ndarray:
    """``values`` (u16) copied into a read-only view at an odd byte offset, as decoded frames
    hand payloads over."""
    raw = bytearray(values.nbytes + 1)
    raw[1:] = values.tobytes()
    return np.frombuffer(bytes(raw), dtype="<u2", offset=1)


def _both(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` under the NumPy kernels, then under the compiled kernels (every size); the
    backend in use before is restored."""
    before = K.kernel_backend()
    try:
        K.set_kernel_backend("numpy")
        ref = fn()
        K.set_kernel_backend("numba", min_elems=0)
        got = fn()
    finally:
        K.set_kernel_backend(before)
    return ref, got


def _cohort(w: int, seed: int, n: int = 1 << 16) -> list[np.ndarray]:
    """W views of ``n`` elements covering every pattern, each a different permutation, so every
    pattern meets NaNs, infinities, zeros and subnormals in every position of the sum."""
    rng = np.random.default_rng(seed)
    reps = -(-n // (1 << 16))
    base = np.tile(ALL16, reps)[:n]
    views = [base.copy()] + [rng.permutation(base) for _ in range(w - 1)]
    return [_unaligned(v) for v in views]


def _frames(views: list[np.ndarray], weights: list[float]) -> list[RoundFrame | None]:
    return [RoundFrame(RoundKind.MODEL, w, [TensorPayload(1, [v.shape[0]], v.tobytes())])
            for v, w in zip(views, weights, strict=True)]


@pytest.mark.parametrize("w", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("scale", SCALES, ids=lambda s: "sum" if s is None else f"{s:g}")
def test_sum_contributions_all_patterns(w: int, scale: np.float32 | None) -> None:
    views = _cohort(w, seed=w)
    n = ALL16.shape[0]
    ref, got = _both(lambda: K.sum_contributions(views, 1, n, scale, K.Workspace()))
    assert ref.dtype == got.dtype == np.dtype("<u2")
    _assert_same(ref, got)


@pytest.mark.parametrize("n", [1, 17, 65_535, 65_537, 3 * 65_536 + 5])
@pytest.mark.parametrize("threads", [1, 2])
def test_public_reduce_any_length(n: int, threads: int) -> None:
    """reduce_realized_work and sum_frames through the public API: lengths that are not a
    multiple of the SIMD width or the chunk, several chunks, and a two-thread split."""
    views = _cohort(3, seed=n, n=n)
    frames = _frames(views, [1.0, 2.5, 1e-30])

    def run() -> bytes:
        a = reduce_realized_work(frames, version=3, threads=threads)
        b = sum_frames(frames, version=3, threads=threads)
        assert a.weight == b.weight
        return bytes(a.tensors[0].data) + bytes(b.tensors[0].data)

    ref, got = _both(run)
    _assert_same(ref, got)


def test_compiled_nan_rule_pinned() -> None:
    """The compiled kernels keep the accumulator's (left) NaN, quietened, when two NaNs meet;
    NumPy agrees wherever a single NaN is involved and gives a NaN wherever two meet."""
    # lanes: sNaN + -sNaN, -sNaN + sNaN, qNaN + -sNaN, 1.0 + sNaN; 20 lanes (SIMD body and tail)
    a = _unaligned(np.array([0x7F81, 0xFF85, 0x7FC1, 0x3F80] * 5, np.uint16))
    b = _unaligned(np.array([0xFFA0, 0x7FA3, 0xFF81, 0x7F90] * 5, np.uint16))
    ref, got = _both(lambda: K.sum_contributions([a, b], 1, 20, None, K.Workspace()))
    assert [hex(v) for v in got[:4]] == ["0x7fc1", "0xffc5", "0x7fc1", "0x7fd0"]
    assert list(got) == list(got[:4]) * 5
    assert all(v == 0x7FD0 for v in ref[3::4])
    assert _bf16_nan(ref).all()
    _assert_same(ref, got)


def test_host_fold_all_patterns() -> None:
    """The relay's fold (promote, accumulate, encode_sums) through HostFold, every pattern in
    three deposits, an odd length, several chunks."""
    n = 2 * 65_536 + 3
    views = _cohort(3, seed=11, n=n)

    def fold() -> bytes:
        hf = HostFold([0, 1, 2], SALT, version=3)
        out = None
        for r, v in enumerate(views):
            frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(1, [n], v.tobytes())])
            out = hf.deposit(r, encode_round_frame_bytes(frame, SALT))
        assert out is not None
        host, _ = decode_round_frame_or_eos(out, SALT)
        assert host.weight == 3.0
        return bytes(host.tensors[0].data)

    ref, got = _both(fold)
    _assert_same(ref, got)


def test_kernel_level_fold_all_patterns() -> None:
    """promote, accumulate and encode_sums directly: the f32 sums and their encoding."""
    views = _cohort(3, seed=12, n=65_536 + 9)

    def fold() -> tuple[bytes, bytes]:
        ws = K.Workspace()
        acc = K.promote(views[0], 1, views[0].shape[0], ws)
        for v in views[1:]:
            K.accumulate(acc, v, 1, ws)
        return K.encode_sums(acc, 1, ws).tobytes(), acc.tobytes()

    (ref16, ref32), (got16, got32) = _both(fold)
    _assert_same(ref16, got16)
    r, g = np.frombuffer(ref32, np.uint32), np.frombuffer(got32, np.uint32)
    nan32 = ((r & 0x7F800000) == 0x7F800000) & ((r & 0x7FFFFF) != 0)
    assert np.array_equal(r[~nan32], g[~nan32])
    gn = ((g & 0x7F800000) == 0x7F800000) & ((g & 0x7FFFFF) != 0)
    assert np.array_equal(nan32, gn)


@pytest.mark.parametrize("dtype", [0, 1])
@pytest.mark.parametrize("count", [0, 1, 2, 3])
@pytest.mark.parametrize("with_acc", [False, True])
def test_fold_into_matches_the_kernel_sequence(dtype: int, count: int, with_acc: bool) -> None:
    """fold_into (one pass: sums plus views, encoded) equals promote / accumulate / encode_sums,
    on both backends; promote_into and encode_sums_into equal promote and encode_sums and
    overwrite whatever their buffers held."""
    n = 2 * 65_536 + 9
    if dtype == 1:
        views = _cohort(max(count, 1) + 1, seed=20 + count, n=n)
    else:
        rng = np.random.default_rng(30 + count)
        views = [rng.standard_normal(n).astype(np.float32) for _ in range(max(count, 1) + 1)]
        for i, v in enumerate(views):
            v[i::11] = -0.0
            v[i::97] = np.nan
    start = views[-1] if with_acc else None
    contribs = views[:count]
    if not with_acc and count == 0:
        start = None

    def sequence() -> tuple[bytes, bytes]:
        ws = K.Workspace()
        if start is not None:
            acc = K.promote(start, dtype, n, ws)
            rest = contribs
        elif contribs:
            acc = K.promote(contribs[0], dtype, n, ws)
            rest = contribs[1:]
        else:
            acc = K.promote(None, dtype, n, ws)
            rest = []
        for v in rest:
            K.accumulate(acc, v, dtype, ws)
        return K.encode_sums(acc, dtype, ws).tobytes(), acc.tobytes()

    def one_pass() -> tuple[bytes, bytes]:
        ws = K.Workspace()
        acc = None
        if start is not None:
            acc = np.full(n, 7.0, np.float32)  # stale contents: promote_into overwrites them
            K.promote_into(acc, start, dtype, ws)
        out = np.full(n, 0x1234, np.uint16) if dtype == 1 else np.full(n, 5.0, np.float32)
        K.fold_into(out, acc, contribs, dtype, ws)
        return out.tobytes(), (acc.tobytes() if acc is not None else b"")

    def encoded() -> bytes:
        ws = K.Workspace()
        acc = K.promote(views[0], dtype, n, ws)
        if dtype == 0:
            return K.encode_sums(acc, dtype, ws).tobytes()
        out = np.full(n, 0xFFFF, np.uint16)
        K.encode_sums_into(acc, out, ws)
        return out.tobytes()

    (ref16, ref32), (got16, got32) = _both(sequence)
    (one16, one32), (onej16, onej32) = _both(one_pass)
    if dtype == 1:
        _assert_same(ref16, got16)
        assert one16 == ref16 and onej16 == got16
        if start is not None:
            assert one32 == ref32 and onej32 == got32
        e_np, e_jit = _both(encoded)
        assert e_np == K.encode_sums(K.promote(views[0], 1, n, K.Workspace()), 1,
                                     K.Workspace()).tobytes()
        _assert_same(e_np, e_jit)
    else:
        assert one16 == ref16 == got16 == onej16
        if start is not None:
            assert one32 == ref32
        assert _both(encoded)[0] == (views[0] + np.float32(0.0)).tobytes()


@pytest.mark.parametrize("n", [5, 65_536, 2 * 65_536 + 9])
def test_f32_fold_into_equals_fold_small_and_may_write_into_the_sums(n: int) -> None:
    """f32: fold_into (chunk by chunk) and fold_small (one pass) give the same bytes, with the
    output a separate buffer or the running sums themselves (which then hold the result)."""
    rng = np.random.default_rng(n)
    seed, x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    seed[::7] = -0.0
    x[::5] = np.nan
    want = ((seed + np.float32(0.0)) + x) + y
    for fold in (K.fold_into, K.fold_small):
        out = np.full(n, 9.0, np.float32)
        fold(out, None, [seed, x, y], 0, K.Workspace(8))
        assert out.tobytes() == want.tobytes()
        acc = seed + np.float32(0.0)
        out = np.full(n, 9.0, np.float32)
        fold(out, acc, [x, y], 0, K.Workspace(8))
        assert out.tobytes() == acc.tobytes() == want.tobytes()
        acc = seed + np.float32(0.0)
        fold(acc, acc, [x, y], 0, K.Workspace(8))
        assert acc.tobytes() == want.tobytes()


def test_encode_random_f32_patterns() -> None:
    """encode_sums on 2**21 + 7 random f32 bit patterns (NaN payloads, subnormals, ties):
    exactly equal (no arithmetic, so no NaN choice)."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, size=(1 << 21) + 7, dtype=np.uint64).astype(np.uint32)
    bits[:4096] = (bits[:4096] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # exact ties
    acc = bits.view(np.float32)
    ref, got = _both(lambda: K.encode_sums(acc.copy(), 1, K.Workspace()).tobytes())
    assert ref == got


def test_bf16_from_f32_random_patterns() -> None:
    """The rank's f32 -> bf16 encode on random f32 patterns, odd length, 2-D shape kept."""
    rng = np.random.default_rng(9)
    bits = rng.integers(0, 1 << 32, size=3 * 100_003, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32).reshape(3, -1)
    ref, got = _both(lambda: bf16_from_f32(values))
    assert ref.shape == got.shape == (3, 100_003)
    assert ref.tobytes() == got.tobytes()


NAN_FACTOR = float(np.uint32(0xFFC12345).view(np.float32))


@pytest.mark.parametrize("factor", [0.25, 1 / 3, 0.0, float("inf"), 1e-40, 7e37, -2.5,
                                    NAN_FACTOR])
@pytest.mark.parametrize("n", [1 << 16, 65_536 + 17])
def test_scale_payload_all_patterns(factor: float, n: int) -> None:
    data = np.tile(ALL16, 2)[:n].tobytes() + b"\x07"  # a trailing partial element is kept
    ref, got = _both(lambda: bytes(scale_payload(1, data, factor)))
    assert ref[-1:] == got[-1:] == b"\x07"
    _assert_same(ref[:-1], got[:-1])


def test_small_tensors_stay_on_numpy() -> None:
    """Below JIT_MIN_ELEMS the compiled backend is not consulted (no compilation for small
    payloads); from it on it is."""
    before = K.kernel_backend()
    try:
        K.set_kernel_backend("numba")
        assert K._jit_for(K.JIT_MIN_ELEMS - 1) is None
        assert K._jit_for(K.JIT_MIN_ELEMS) is not None
    finally:
        K.set_kernel_backend(before)


def test_backend_choice_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    before = K.kernel_backend()
    try:
        assert K.set_kernel_backend("NumPy ") == "numpy"
        assert K.kernel_backend() == "numpy"
        monkeypatch.setenv("FLODL_PROTO_KERNELS", " NUMBA")
        assert K.set_kernel_backend() == "numba"
        monkeypatch.setenv("FLODL_PROTO_KERNELS", "")
        assert K.set_kernel_backend() == "numba"  # empty means auto; numba is installed
        # min_elems is not sticky: omitted means the default again
        K.set_kernel_backend("numba", min_elems=0)
        assert K._jit_for(1) is not None
        K.set_kernel_backend("numba")
        assert K._jit_for(1) is None
        # errors name the value and leave the backend as it was
        K.set_kernel_backend("numpy")
        with pytest.raises(LocalProtocolError) as ei:
            K.set_kernel_backend("cuda")
        assert ei.value.kind == "value"
        assert str(ei.value) == "kernel backend must be one of auto, numpy, numba, got 'cuda'"
        monkeypatch.setenv("FLODL_PROTO_KERNELS", "off")
        with pytest.raises(LocalProtocolError,
                           match=r"^FLODL_PROTO_KERNELS must be one of .*'off'"):
            K.set_kernel_backend()
        for bad in (-1, 1.5, "10", True, None):
            with pytest.raises(LocalProtocolError, match="min_elems must be a non-negative"):
                K.set_kernel_backend("numba", min_elems=bad)  # type: ignore[arg-type]
        assert K.kernel_backend() == "numpy"
        # numba missing: 'numba' is an error naming the extra, 'auto' falls back to NumPy
        monkeypatch.setitem(sys.modules, "flodl_proto.reduce._jit", None)
        with pytest.raises(LocalProtocolError, match="the 'fast' extra installs numba"):
            K.set_kernel_backend("numba")
        assert K.set_kernel_backend("auto") == "numpy"
    finally:
        monkeypatch.undo()
        K.set_kernel_backend(before)


def test_backend_that_cannot_set_up_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba present but refusing to set up (e.g. no cache locator): auto uses NumPy; an explicit
    'numba' is a local error carrying numba's reason."""
    before = K.kernel_backend()

    def refuse(name: str, package: str | None = None) -> Any:
        raise RuntimeError("cannot cache function '_widen': no locator available")

    monkeypatch.setattr(K.importlib, "import_module", refuse)
    try:
        assert K.set_kernel_backend("auto") == "numpy"
        with pytest.raises(LocalProtocolError, match="no locator available"):
            K.set_kernel_backend("numba")
    finally:
        monkeypatch.undo()
        K.set_kernel_backend(before)


@pytest.mark.parametrize(("argv", "prog"), [
    (["docs", "--check"], "flodl-proto docs"),
    (["demo"], "flodl-proto demo"),
    (["rank", "--relay", "127.0.0.1:1", "--rank", "3", "--world-size", "4"], "flodl-proto rank 3"),
    (["vectors", "check"], "flodl-proto vectors check"),
    (["conform", "relay", "--launch", "x"], "flodl-proto conform relay"),
    (["--log-level", "INFO", "conform", "relay", "--list"], "flodl-proto conform relay"),
    (["decode", "--hex", "/dev/null"], "flodl-proto decode"),
    ([], "flodl-proto"),
])
def test_cli_rejects_bad_kernel_env(argv: list[str], prog: str, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A bad choice is one line prefixed with the command, as the command's other errors (it
    read ``flodl-proto: error: ...`` for every command)."""
    monkeypatch.setenv("FLODL_PROTO_KERNELS", "jit")
    with pytest.raises(SystemExit) as ei:
        cli_main(argv)
    assert ei.value.code == 2
    assert capsys.readouterr().err == (
        f"{prog}: error: FLODL_PROTO_KERNELS must be one of auto, numpy, numba, got 'jit'\n")


def test_cli_rejects_unloadable_numba_at_startup(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = K.kernel_backend()
    monkeypatch.setenv("FLODL_PROTO_KERNELS", "numba")
    monkeypatch.setitem(sys.modules, "flodl_proto.reduce._jit", None)
    try:
        with pytest.raises(SystemExit) as ei:
            cli_main(["docs", "--check"])
        assert ei.value.code == 2
        err = capsys.readouterr().err
        assert "kernel backend 'numba' requested but the compiled kernels cannot be loaded" in err
        assert K.kernel_backend() == before
    finally:
        monkeypatch.undo()
        K.set_kernel_backend(before)


#: f32 NaN patterns: quiet and signalling, both signs, payload bits high and low
_NANS = [0x7FC00000, 0x7FC12345, 0xFF812345, 0x7F800001, 0xFFFFFFFF]


def test_may_hold_nan_finds_a_nan_in_any_lane() -> None:
    """Every length up to past two SIMD widths and a few longer ones, a NaN of each pattern in
    each lane among values whose squares overflow (+inf), infinities of both signs, signed zeros
    and subnormals: found; the same arrays without the NaN: none."""
    rng = np.random.default_rng(7)
    base = [0x7F7FFFFF, 0xFF800000, 0x7F800000, 0x80000000, 0x00000001, 0x807FFFFF]
    for n in [*range(1, 40), 63, 64, 65, 127, 128, 129, 2047, 2048]:
        vals = (rng.standard_normal(n) * 1e3).astype(np.float32).view(np.uint32)
        k = min(n, len(base))
        vals[:k] = base[:k]
        rng.shuffle(vals)
        clean = vals.view(np.float32)
        with np.errstate(all="ignore"):
            assert K.may_hold_nan(clean) is False
            lanes = range(n) if n < 200 else [0, 1, n // 2, n - 2, n - 1]
            for lane in lanes:
                for pat in _NANS:
                    v = vals.copy()
                    v[lane] = pat
                    assert K.may_hold_nan(v.view(np.float32)) is True, (n, lane, hex(pat))
    assert K.may_hold_nan(np.zeros(0, np.float32)) is False


def test_encode_bf16_small_without_a_hint_patches_every_nan_lane() -> None:
    """No hint: the scan finds a NaN in any lane and re-encodes it with upstream's rule; a
    strided destination takes the same bits."""
    for n in (1, 5, 31, 200):
        for lane in {0, n // 2, n - 1}:
            for pat in _NANS:
                src = np.full(n, 1.5, np.float32)
                src.view(np.uint32)[lane] = pat
                dst = np.zeros(2 * n, np.uint16)
                with np.errstate(all="ignore"):
                    K.encode_bf16_small(src, dst[1::2])
                want = np.full(n, 0x3FC0, np.uint16)
                want[lane] = (pat >> 16) | 0x0040
                assert dst[1::2].tolist() == want.tolist()
                assert not dst[0::2].any()

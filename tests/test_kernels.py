"""The compiled (numba) bf16 kernels against the NumPy kernels: identical bytes on every bf16
pattern, in every contribution position, with the scales the reduce can produce; and the backend
switch."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from flodl_proto.errors import LocalProtocolError
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce import scale_payload

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
#: scales reduce_realized_work can hand the kernels: ordinary, 1, huge, tiny, 0 and inf
#: (weights 1e-300 and inf), and None (a pure sum)
SCALES = [None, np.float32(1 / 3), np.float32(1.0), np.float32(3e30), np.float32(1e-30),
          np.float32(0.0), np.float32(np.inf)]


def _unaligned(values: np.ndarray) -> np.ndarray:
    """``values`` (u16) copied into a read-only view at an odd byte offset, as decoded frames
    hand payloads over."""
    raw = bytearray(values.nbytes + 1)
    raw[1:] = values.tobytes()
    return np.frombuffer(bytes(raw), dtype="<u2", offset=1)


def _both(fn, *args):  # type: ignore[no-untyped-def]
    """``fn(*args)`` under the NumPy kernels, then under the compiled kernels (every size)."""
    before = K.kernel_backend()
    try:
        K.set_kernel_backend("numpy")
        ref = fn(*args)
        K.set_kernel_backend("numba", min_elems=0)
        got = fn(*args)
    finally:
        K.set_kernel_backend(before, min_elems=K.JIT_MIN_ELEMS)
    return ref, got


def _cohort(w: int, seed: int) -> list[np.ndarray]:
    """W views: all 65,536 patterns, each view a different permutation, so every pattern meets
    NaNs, infinities, zeros and subnormals in every position of the sum."""
    rng = np.random.default_rng(seed)
    views = [ALL16.copy()] + [rng.permutation(ALL16) for _ in range(w - 1)]
    return [_unaligned(v) for v in views]


@pytest.mark.parametrize("w", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("scale", SCALES, ids=lambda s: "sum" if s is None else f"{s:g}")
def test_sum_contributions_all_patterns(w: int, scale: np.float32 | None) -> None:
    views = _cohort(w, seed=w)
    n = ALL16.shape[0]
    ref, got = _both(lambda: K.sum_contributions(views, 1, n, scale, K.Workspace()))
    assert ref.dtype == got.dtype == np.dtype("<u2")
    assert ref.tobytes() == got.tobytes()


def test_sum_contributions_nan_order_pinned() -> None:
    """Two NaNs meet: the accumulator's (left) NaN wins, quietened, as x86 ``acc + x`` gives."""
    a = _unaligned(np.array([0x7F81, 0xFF85, 0x7FC1, 0x3F80], np.uint16))  # sNaN, -sNaN, qNaN, 1
    b = _unaligned(np.array([0xFFA0, 0x7FA3, 0xFF81, 0x7F90], np.uint16))
    for backend in ("numpy", "numba"):
        K.set_kernel_backend(backend, min_elems=0)
        try:
            out = K.sum_contributions([a, b], 1, 4, None, K.Workspace())
        finally:
            K.set_kernel_backend("auto", min_elems=K.JIT_MIN_ELEMS)
        assert [hex(v) for v in out] == ["0x7fc1", "0xffc5", "0x7fc1", "0x7fd0"], backend


def test_host_fold_kernels_all_patterns() -> None:
    """promote, accumulate and encode_sums (the relay's fold) on every pattern."""
    views = _cohort(3, seed=11)

    def fold() -> bytes:
        ws = K.Workspace()
        acc = K.promote(views[0], 1, views[0].shape[0], ws)
        for v in views[1:]:
            K.accumulate(acc, v, 1, ws)
        return bytes(K.encode_sums(acc, 1, ws).tobytes()) + acc.tobytes()

    ref, got = _both(fold)
    assert ref == got


def test_encode_random_f32_patterns() -> None:
    """encode_sums on 2**21 random f32 bit patterns (NaN payloads, subnormals, ties)."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, size=1 << 21, dtype=np.uint64).astype(np.uint32)
    bits[:4096] = (bits[:4096] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # exact ties
    acc = bits.view(np.float32)
    ref, got = _both(lambda: K.encode_sums(acc.copy(), 1, K.Workspace()).tobytes())
    assert ref == got


def test_bf16_from_f32_random_patterns() -> None:
    """The rank's f32 -> bf16 encode on random f32 patterns, odd length, 2-D shape kept."""
    from flodl_proto.reduce import bf16_from_f32

    rng = np.random.default_rng(9)
    bits = rng.integers(0, 1 << 32, size=3 * 100_003, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32).reshape(3, -1)
    ref, got = _both(lambda: bf16_from_f32(values))
    assert ref.shape == got.shape == (3, 100_003)
    assert ref.tobytes() == got.tobytes()


@pytest.mark.parametrize("factor", [0.25, 1 / 3, 0.0, float("inf"), 1e-40, 7e37, -2.5])
def test_scale_payload_all_patterns(factor: float) -> None:
    data = ALL16.tobytes() + b"\x07"  # a trailing partial element is kept as it was
    ref, got = _both(lambda: bytes(scale_payload(1, data, factor)))
    assert ref == got
    assert ref[-1:] == b"\x07"


def test_small_tensors_stay_on_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below JIT_MIN_ELEMS the compiled backend is not consulted (no compilation for small
    payloads); from it on it is."""
    K.set_kernel_backend("numba")
    try:
        assert K._jit_for(K.JIT_MIN_ELEMS - 1) is None
        assert K._jit_for(K.JIT_MIN_ELEMS) is not None
    finally:
        K.set_kernel_backend("auto", min_elems=K.JIT_MIN_ELEMS)


def test_backend_choice_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        assert K.set_kernel_backend("numpy") == "numpy"
        assert K.kernel_backend() == "numpy"
        monkeypatch.setenv("FLODL_PROTO_KERNELS", "NumPy")
        assert K.set_kernel_backend() == "numpy"
        monkeypatch.setenv("FLODL_PROTO_KERNELS", "numba")
        assert K.set_kernel_backend() == "numba"
        with pytest.raises(LocalProtocolError) as ei:
            K.set_kernel_backend("cuda")
        assert ei.value.kind == "value"
        assert "'cuda'" in str(ei.value) and "auto, numpy, numba" in str(ei.value)
        # numba missing: 'numba' is an error naming the extra, 'auto' falls back to NumPy
        monkeypatch.setitem(sys.modules, "flodl_proto.reduce._jit", None)
        with pytest.raises(LocalProtocolError) as ei:
            K.set_kernel_backend("numba")
        assert "install the 'fast' extra" in str(ei.value)
        assert K.set_kernel_backend("auto") == "numpy"
    finally:
        monkeypatch.undo()
        K.set_kernel_backend("auto", min_elems=K.JIT_MIN_ELEMS)
    assert K.kernel_backend() == "numba"

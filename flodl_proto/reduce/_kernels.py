"""Chunked NumPy kernels of the fold: exact bf16 widening, upstream's bf16 rounding, in-place f32
accumulation.

Everything here works on flat NumPy views of payload bytes and touches memory in chunks of
:data:`CHUNK_ELEMS` elements, so a bf16 contribution is never materialised whole as f32 and the
working set of one chunk (accumulator slice, widened slice, the inputs' slices) stays in the L2
cache. No Python loop runs over elements; the Python loop runs over chunks only. On request, a
large tensor is split into contiguous ranges handled by worker threads (NumPy releases the GIL
inside its loops); the arithmetic is element-wise, so the result does not depend on the split.
Runs of small tensors take :mod:`._small_kernels` (the same arithmetic in fewer NumPy calls;
its names are re-exported here).

Arithmetic matches upstream bit for bit (x86-64 NaN rules, see the vectors' README):

* f32 accumulation is ``acc = acc + x`` in f32, in contribution order, the accumulator starting
  from ``+0.0`` (so a lone ``-0.0`` becomes ``+0.0``);
* bf16 widening is exact (``bits << 16``, NaN payloads kept);
* bf16 encoding is round-to-nearest-even (``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``), and a NaN
  keeps its sign and top payload bits with the quiet bit forced (``(b >> 16) | 0x0040``); NaN
  lanes are patched only when a scan found one (or the arithmetic could create one);
* normalisation (encode, decode, multiply, encode) rounds the sum to bf16 in the f32 domain
  (``(b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000``), which is exactly encode-then-widen.

Both conversions are written as vectorised integer ops rather than ``ml_dtypes`` casts: the
``ml_dtypes`` float32 -> bfloat16 cast rounds identically but replaces every NaN by
``0x7FC0``/``0xFFC0`` (dropping the payload upstream keeps) and measured about 4x slower than the
integer ops on model-like data (and the bfloat16 -> float32 cast about 2x slower than a widening
copy plus a shift). ``tests/test_bf16.py`` proves the integer path against upstream's formula on
every bf16 pattern and on random f32 patterns.

Two backends compute the bf16 paths, giving the same bytes (``tests/test_kernels.py`` checks them
against each other on every bf16 pattern) except which payload survives when two NaNs meet,
which upstream leaves to the platform too: these NumPy kernels (always available; about 25
vectorised passes per output element) and, when the ``fast`` extra (``numba``) is installed,
compiled single-pass loops (:mod:`flodl_proto.reduce._jit`), used for tensors of at least
:data:`JIT_MIN_ELEMS` elements. ``FLODL_PROTO_KERNELS=numpy|numba|auto`` (default ``auto``) or
:func:`set_kernel_backend` chooses. f32 paths are NumPy in both (already memory-bound).

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``accumulate_payload_into``,
``f32_slice_to_payload_bytes``, ``scale_payload_bytes``, ``f32_to_bf16_bits``,
``bf16_bits_to_f32``).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from .._threads import start_thread
from ..errors import protocol_error
from ..spec import DTYPE_BF16, DTYPE_F32, KERNELS_ENV
from ._small_kernels import (
    F32,
    U16,
    encode_bf16_small,
    may_hold_nan,
    round_bf16_small,
    sum_small_batch,
)

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("flodl_proto.reduce needs a little-endian host (payloads are LE on the wire)")

__all__ = [
    "CHUNK_ELEMS",
    "F32",
    "JIT_MIN_ELEMS",
    "KERNEL_BACKENDS",
    "PARALLEL_MIN_ELEMS",
    "SMALL_ELEMS",
    "U16",
    "Workspace",
    "accumulate",
    "check_backend_name",
    "default_threads",
    "encode_bf16",
    "encode_bf16_small",
    "encode_sums",
    "encode_sums_into",
    "fold_into",
    "fold_small",
    "kernel_backend",
    "may_hold_nan",
    "promote",
    "promote_into",
    "round_bf16_small",
    "scale_bf16",
    "set_kernel_backend",
    "sum_contributions",
    "sum_small",
    "sum_small_batch",
    "widen_bf16",
]

#: Elements per chunk: 64 Ki elements (256 KiB of f32), measured fastest on the reference machine
#: (the working set of a W = 4 chunk stays in L2; larger chunks spill, smaller ones pay per-call
#: overhead).
CHUNK_ELEMS: Final = 1 << 16
#: Tensors below this many elements per worker are summed on the calling thread only.
PARALLEL_MIN_ELEMS: Final = 1 << 20
#: Below this many elements, bf16 encoding takes :func:`encode_bf16_small` (no workspace; ml_dtypes'
#: one-call cast where ml_dtypes is loaded already, bit-identical to the integer rounding for every
#: non-NaN f32, NaN lanes patched after it) and :func:`sum_small` sums a tensor in one pass with
#: no per-tensor set-up: per-call overhead dominates there. At a full chunk the integer ops are as
#: fast as the cast (measured), so large tensors keep them.
SMALL_ELEMS: Final = 1 << 14

_U32: Final = np.dtype("<u4")
_ZERO: Final = np.float32(0.0)
_ONE_F32: Final = np.float32(1.0)
_QUIET16: Final = np.uint32(0x0040)
_QUIET32: Final = np.uint32(0x00400000)
_HALF_MINUS: Final = np.uint32(0x7FFF)
_ONE: Final = np.uint32(1)
_HIGH: Final = np.uint32(0xFFFF0000)
_SIXTEEN: Final = np.uint32(16)

#: The bf16 kernel backends: ``auto`` (compiled when ``numba`` is importable, else NumPy),
#: ``numpy``, ``numba`` (the compiled loops; requires the ``fast`` extra).
KERNEL_BACKENDS: Final = ("auto", "numpy", "numba")
#: Tensors of fewer elements take the NumPy kernels even with the compiled backend (no
#: compilation for small payloads; below one chunk the two cost about the same).
JIT_MIN_ELEMS: Final = CHUNK_ELEMS

F32Array = npt.NDArray[np.float32]
U16Array = npt.NDArray[np.uint16]
U32Array = npt.NDArray[np.uint32]


def default_threads() -> int:
    """Worker threads for large tensors: the CPUs this process may run on, at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return max(1, min(4, n))


_backend_lock = threading.Lock()
_backend: dict[str, Any] = {"name": None, "module": None, "min_elems": JIT_MIN_ELEMS}
_log = logging.getLogger(__name__)


def check_backend_name(value: object, origin: str = "kernel backend") -> str:
    """``value`` as a backend name of :data:`KERNEL_BACKENDS` (case and surrounding blanks
    ignored; empty means ``auto``), without importing anything.

    Raises:
        InvalidValue (local): any other value (``kernels.unknown_backend``, naming ``origin``).

    Upstream: none (a local configuration value).
    """
    name = value.strip().lower() if isinstance(value, str) else value
    if name == "":
        name = "auto"
    if name not in KERNEL_BACKENDS:
        raise protocol_error("kernels.unknown_backend", origin=origin, value=value,
                             allowed=", ".join(KERNEL_BACKENDS))
    return str(name)


def set_kernel_backend(name: str | None = None, *, min_elems: int = JIT_MIN_ELEMS) -> str:
    """Choose the bf16 kernel backend for this process.

    Args:
        name: one of :data:`KERNEL_BACKENDS` (case-insensitive); None reads
            ``$FLODL_PROTO_KERNELS`` (unset or empty: ``auto``).
        min_elems: tensors below this many elements use the NumPy kernels (default
            :data:`JIT_MIN_ELEMS`; 0 sends every tensor to the compiled loops).

    Returns:
        The backend now in use: ``"numpy"`` or ``"numba"``. ``auto`` takes ``numba`` when it
        imports and can compile, else NumPy (the reason is logged at INFO).

    Raises:
        InvalidValue (local): unknown ``name`` (``kernels.unknown_backend``), a ``min_elems``
            that is not a non-negative integer (``kernels.bad_min_elems``), or ``numba``
            requested but unusable (``kernels.unavailable``). On error the backend in use is
            left as it was.

    The backends give identical bytes except in one place upstream leaves to the platform: when
    two NaNs meet in an add or multiply, which NaN's payload survives (the compiled kernels keep
    the left operand's, NumPy's SIMD loops either one). NaN-ness and every non-NaN value agree.

    No upstream counterpart: a choice among this package's bf16 kernels; the arithmetic they must
    match is that of ``controller/round_frame.rs``.
    """
    if name is None:
        name = check_backend_name(os.environ.get(KERNELS_ENV, ""), origin=KERNELS_ENV)
    else:
        name = check_backend_name(name)
    if isinstance(min_elems, bool) or not isinstance(min_elems, (int, np.integer)) \
            or min_elems < 0:
        raise protocol_error("kernels.bad_min_elems", value=min_elems)
    module: ModuleType | None = None
    if name != "numpy":
        try:
            module = importlib.import_module("._jit", __package__)
        except Exception as exc:  # ImportError, or numba refusing to set up (no cache, no JIT)
            if name == "numba":
                raise protocol_error("kernels.unavailable", reason=str(exc)) from exc
            _log.info("compiled bf16 kernels unavailable (%s); using the NumPy kernels", exc)
    with _backend_lock:
        _backend["module"] = module
        _backend["name"] = "numba" if module is not None else "numpy"
        _backend["min_elems"] = int(min_elems)
        return str(_backend["name"])


def kernel_backend() -> str:
    """The bf16 kernel backend in use (``"numpy"`` or ``"numba"``), choosing it from
    ``$FLODL_PROTO_KERNELS`` on first call (see :func:`set_kernel_backend`).

    Raises:
        InvalidValue (local): on that first call, as :func:`set_kernel_backend` with no name
            (a bad ``$FLODL_PROTO_KERNELS``, or ``numba`` requested and unusable).

    Upstream: none (a local choice of how ``round_frame.rs``'s arithmetic is computed).
    """
    if _backend["name"] is None:
        return set_kernel_backend(None)
    return str(_backend["name"])


def _jit_for(numel: int) -> ModuleType | None:
    """The compiled kernels when selected and ``numel`` is large enough, else None.

    The backend is chosen (and numba imported, about 64 MiB) on the first range long enough for
    the compiled kernels, so a process that only sums small tensors never loads them."""
    if _backend["name"] is None:
        if numel < _backend["min_elems"]:
            return None
        kernel_backend()
    mod: ModuleType | None = _backend["module"]
    if mod is None or numel < _backend["min_elems"]:
        return None
    return mod


class Workspace:
    """Scratch buffers of one chunk (accumulator, widened input, u32 temp, NaN mask); one per
    thread. ``high``: u32 lanes whose low halves stay zero, made at first use by the small-run
    kernels (:mod:`._small_kernels`), which alone write them, through their high halves."""

    __slots__ = ("acc", "high", "mask", "tmp", "wide")

    def __init__(self, n: int = CHUNK_ELEMS) -> None:
        self.acc: F32Array = np.empty(n, F32)
        self.wide: F32Array = np.empty(n, F32)
        self.tmp: U32Array = np.empty(n, _U32)
        self.mask: npt.NDArray[np.bool_] = np.empty(n, np.bool_)
        self.high: U32Array | None = None


def widen_bf16(src: U16Array, dst: F32Array) -> None:
    """``dst[i] = f32::from_bits(src[i] << 16)`` (exact; NaN payloads kept). Same length."""
    u = dst.view(_U32)
    np.copyto(u, src, casting="unsafe")
    np.left_shift(u, _SIXTEEN, out=u)


def encode_bf16(
    src: F32Array, dst: U16Array, ws: Workspace, may_have_nan: bool | None = None
) -> None:
    """bf16 bits of ``src`` into ``dst`` with upstream's rounding and NaN rule, in integer ops.

    Args:
        src, dst: same length, at most the workspace size.
        ws: scratch (``tmp`` and ``mask`` are used).
        may_have_nan: False when the caller knows ``src`` holds no NaN (skips the scan); None
            to scan.
    """
    n = src.shape[0]
    if n < SMALL_ELEMS:
        encode_bf16_small(src, dst, may_have_nan)
        return
    u = src.view(_U32)
    t = ws.tmp[:n]
    np.right_shift(u, _SIXTEEN, out=t)
    np.bitwise_and(t, _ONE, out=t)
    np.add(t, _HALF_MINUS, out=t)
    np.add(t, u, out=t)
    np.right_shift(t, _SIXTEEN, out=t)
    np.copyto(dst, t, casting="unsafe")
    if may_have_nan is None:
        may_have_nan = bool(n) and bool(np.isnan(np.min(src)))
    if may_have_nan:
        m = np.isnan(src, out=ws.mask[:n])
        if m.any():
            dst[m] = ((u[m] >> _SIXTEEN) | _QUIET16).astype(U16)


def sum_small(
    views: Sequence[npt.NDArray[Any]],
    dtype: int,
    numel: int,
    scale: np.float32 | None,
    ws: Workspace,
) -> npt.NDArray[Any]:
    """:func:`sum_contributions` for a tensor of fewer than :data:`SMALL_ELEMS` elements, on the
    calling thread, with no per-call set-up: no warning context (the caller holds
    ``np.errstate(all="ignore")`` around its whole fold), no closure, no thread split. Same
    arguments (``ws`` of at least ``numel`` elements for bf16) and bit-identical result: a new
    flat ``<f4`` or ``<u2`` array of ``numel`` elements.

    Upstream: ``controller/round_frame.rs`` ``sum_frames`` / ``reduce_realized_work`` (per
    tensor).
    """
    if dtype == DTYPE_F32:
        out32: F32Array = np.add(views[0], _ZERO)
        for v in views[1:]:
            np.add(out32, v, out=out32)
        if scale is not None:
            np.multiply(out32, scale, out=out32)
        return out32
    out16: U16Array = np.empty(numel, U16)
    _sum_bf16(views, 0, numel, out16, scale, ws)
    return out16


def _chunks(start: int, stop: int) -> range:
    return range(start, stop, CHUNK_ELEMS)


_T = TypeVar("_T")


def _quiet(fn: Callable[..., _T]) -> Callable[..., _T]:
    """Run ``fn`` with NumPy float warnings off (NaN/overflow casts and inf arithmetic are part of
    the protocol's arithmetic, not errors)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


def _run_split(numel: int, threads: int, body: Callable[[int, int, Workspace], None],
               ws: Workspace) -> None:
    """Run ``body(start, stop, workspace)`` over ``[0, numel)``: on the calling thread alone for
    small tensors, else split in chunk-aligned ranges across up to ``threads`` threads (each
    joined before returning; the first exception is re-raised)."""
    workers = min(threads, numel // PARALLEL_MIN_ELEMS) if threads > 1 else 1
    if workers <= 1:
        body(0, numel, ws)
        return
    per = -(-numel // workers)
    per = -(-per // CHUNK_ELEMS) * CHUNK_ELEMS
    bounds = [(s, min(s + per, numel)) for s in range(0, numel, per)]
    errors: list[BaseException] = []

    def run(s: int, e: int) -> None:
        try:
            with np.errstate(all="ignore"):
                body(s, e, Workspace())
        except BaseException as exc:  # pragma: no cover - re-raised below
            errors.append(exc)

    pool = [threading.Thread(target=run, args=b, name="flodl-reduce") for b in bounds[1:]]
    for t in pool:
        start_thread(t)
    try:
        body(bounds[0][0], bounds[0][1], ws)
    finally:
        for t in pool:
            t.join()
    if errors:  # pragma: no cover - the kernels raise nothing on validated input
        raise errors[0]


@_quiet
def sum_contributions(
    views: Sequence[npt.NDArray[Any]],
    dtype: int,
    numel: int,
    scale: np.float32 | None,
    ws: Workspace,
    threads: int = 1,
    out: npt.NDArray[Any] | None = None,
) -> npt.NDArray[Any]:
    """Element-wise sum of ``views`` in order from ``+0.0``, re-encoded in ``dtype``.

    Args:
        views: one flat array per contribution (``<f4`` for f32, ``<u2`` bf16 bits), each of
            ``numel`` elements (checked by the caller), at least one.
        dtype: wire dtype tag (f32 or bf16). numel: element count.
        scale: when given, the encoded sum is then decoded, multiplied by ``scale`` in f32 and
            re-encoded (upstream's normalisation; two roundings for bf16).
        ws: scratch of the calling thread. threads: worker threads allowed for a large tensor.
        out: the array to write (``numel`` elements of the result's dtype, every one written;
            it must not overlap ``views``); None: a new one.

    Returns:
        ``out``, or a new flat array (``<f4`` or ``<u2``) of ``numel`` elements: the payload.
    """
    first, rest = views[0], views[1:]
    if dtype == DTYPE_F32:
        out32: F32Array = np.empty(numel, F32) if out is None else out

        def body32(start: int, stop: int, w: Workspace) -> None:
            for s in _chunks(start, stop):
                e = min(s + CHUNK_ELEMS, stop)
                a = out32[s:e]
                np.add(first[s:e], _ZERO, out=a)
                for v in rest:
                    np.add(a, v[s:e], out=a)
                if scale is not None:
                    np.multiply(a, scale, out=a)

        _run_split(numel, threads, body32, ws)
        return out32
    if dtype != DTYPE_BF16:  # pragma: no cover - callers validate the tag
        raise ValueError(f"dtype {dtype}")
    out16: U16Array = np.empty(numel, U16) if out is None else out

    def body16(start: int, stop: int, w: Workspace) -> None:
        _sum_bf16(views, start, stop, out16, scale, w)

    _run_split(numel, threads, body16, ws)
    return out16


def _sum_bf16(
    views: Sequence[U16Array],
    start: int,
    stop: int,
    out16: U16Array,
    scale: np.float32 | None,
    w: Workspace,
) -> None:
    """bf16 sum (and optional normalisation) of elements ``start .. stop`` into ``out16``.

    Per chunk: each contribution is widened exactly with integer ops and added to the f32
    accumulator; one scan tells whether the sum holds a NaN (only then are NaN lanes patched
    to upstream's encoding); normalisation rounds to bf16 in the f32 domain, multiplies, and the
    cast encodes (NaNs the multiply creates are default NaNs, which the cast encodes as upstream
    does, unless the scale is 0 or infinite, where the result is scanned again)."""
    jit = _jit_for(stop - start)
    if jit is not None:
        f = _ONE_F32 if scale is None else np.float32(scale)
        for s in _chunks(start, stop):
            e = min(s + CHUNK_ELEMS, stop)
            a = w.acc[: e - s]
            jit.bf16_widen_first(a, views[0][s:e])
            for v in views[1:]:
                jit.bf16_accumulate(a, v[s:e])
            jit.bf16_finish(a, out16[s:e], f, scale is not None)
        return
    finite_scale = scale is None or bool(0.0 < scale < np.inf)
    for s in _chunks(start, stop):
        e = min(s + CHUNK_ELEMS, stop)
        k = e - s
        a = w.acc[:k]
        t = w.wide[:k]
        widen_bf16(views[0][s:e], a)
        np.add(a, _ZERO, out=a)
        for v in views[1:]:
            widen_bf16(v[s:e], t)
            np.add(a, t, out=a)
        has_nan = bool(np.isnan(np.min(a)))
        if scale is not None:
            _round_bf16(a, w, has_nan)
            np.multiply(a, scale, out=a)
        encode_bf16(a, out16[s:e], w, has_nan or not finite_scale)


def _round_bf16(a: F32Array, ws: Workspace, has_nan: bool) -> None:
    """``a = widen(encode_bf16(a))`` in place (rounding to bf16 precision in the f32 domain)."""
    n = a.shape[0]
    if n < SMALL_ELEMS:
        round_bf16_small(a, ws, has_nan)
        return
    u = a.view(_U32)
    if has_nan:
        m = np.isnan(a, out=ws.mask[:n])
        nan_bits = (u[m] | _QUIET32) & _HIGH
    t = ws.tmp[:n]
    np.right_shift(u, _SIXTEEN, out=t)
    np.bitwise_and(t, _ONE, out=t)
    np.add(t, _HALF_MINUS, out=t)
    np.add(u, t, out=u)
    np.bitwise_and(u, _HIGH, out=u)
    if has_nan:
        u[m] = nan_bits


@_quiet
def promote(view: npt.NDArray[Any] | None, dtype: int, numel: int, ws: Workspace) -> F32Array:
    """A fresh f32 accumulator holding ``0.0 + decode(view)`` (zeros when ``view`` is None).

    Upstream: ``payload_to_f32`` (zeros, then one accumulate).
    """
    if view is None:
        return np.zeros(numel, F32)
    acc: F32Array = np.empty(numel, F32)
    promote_into(acc, view, dtype, ws)
    return acc


@_quiet
def promote_into(acc: F32Array, view: npt.NDArray[Any] | None, dtype: int,
                 ws: Workspace) -> None:
    """:func:`promote` into an existing accumulator: ``acc[i] = 0.0 + decode(view[i])`` (every
    element written, so ``acc`` may hold anything before; zeros when ``view`` is None).

    Args:
        acc: flat ``<f4`` array of the tensor's element count (a slice of a larger one is fine).
        view: flat payload elements (``<f4`` for f32, ``<u2`` bf16 bits), same length, or None.
        dtype: wire dtype tag (f32 or bf16).
        ws: scratch of the calling thread.

    Upstream: ``payload_to_f32`` (zeros, then one accumulate).
    """
    numel = acc.shape[0]
    if view is None:
        acc.fill(_ZERO)
        return
    if dtype == DTYPE_F32:
        np.add(view, _ZERO, out=acc)
        return
    jit = _jit_for(numel)
    if jit is not None:
        jit.bf16_widen_first(acc, view)
        return
    for s in _chunks(0, numel):
        e = min(s + CHUNK_ELEMS, numel)
        a = acc[s:e]
        widen_bf16(view[s:e], a)
        np.add(a, _ZERO, out=a)


@_quiet
def accumulate(acc: F32Array, view: npt.NDArray[Any], dtype: int, ws: Workspace) -> None:
    """``acc += decode(view)`` in place (bf16 widened chunk by chunk). Same element count.

    Upstream: ``accumulate_payload_into``.
    """
    n = acc.shape[0]
    if dtype == DTYPE_F32:
        np.add(acc, view, out=acc)
        return
    jit = _jit_for(n)
    if jit is not None:
        jit.bf16_accumulate(acc, view)
        return
    for s in _chunks(0, n):
        e = min(s + CHUNK_ELEMS, n)
        a = acc[s:e]
        t = ws.wide[: e - s]
        widen_bf16(view[s:e], t)
        np.add(a, t, out=a)


@_quiet
def encode_sums(acc: F32Array, dtype: int, ws: Workspace) -> npt.NDArray[Any]:
    """The f32 sums ``acc`` encoded in ``dtype`` (f32: ``acc`` itself; bf16: a new array).

    Upstream: ``f32_slice_to_payload_bytes``.
    """
    if dtype == DTYPE_F32:
        return acc
    out: U16Array = np.empty(acc.shape[0], U16)
    encode_sums_into(acc, out, ws)
    return out


@_quiet
def encode_sums_into(acc: F32Array, out: U16Array, ws: Workspace) -> None:
    """bf16 bits of the f32 sums ``acc`` into ``out`` (flat, same length; every element
    written): :func:`encode_sums`'s bf16 arm into a caller's buffer.

    Upstream: ``f32_slice_to_payload_bytes`` (bf16 arm).
    """
    n = acc.shape[0]
    jit = _jit_for(n)
    if jit is not None:
        jit.bf16_encode(acc, out)
        return
    for s in _chunks(0, n):
        e = min(s + CHUNK_ELEMS, n)
        encode_bf16(acc[s:e], out[s:e], ws)


@_quiet
def fold_into(
    out: npt.NDArray[Any],
    acc: F32Array | None,
    views: Sequence[npt.NDArray[Any]],
    dtype: int,
    ws: Workspace,
) -> None:
    """The last step of a fold in one pass: ``out = encode(sum)`` where ``sum`` is ``acc`` plus
    every view in order (``acc`` None: ``0.0 + views[0]`` plus the rest; no views either:
    ``+0.0``), each contribution widened and added in f32 exactly as :func:`promote` and
    :func:`accumulate` do, then encoded as :func:`encode_sums` does (bit-identical to that
    sequence), chunk by chunk so no f32 array is written when ``acc`` is None.

    Args:
        out: flat result array of ``dtype`` (``<f4`` or ``<u2``), every element written; for f32
            it may be ``acc`` itself.
        acc: flat ``<f4`` running sums of the same length, or None. When given it is updated in
            place (it then holds the f32 sum).
        views: flat payload elements (``<f4`` for f32, ``<u2`` bf16 bits), same length.
        dtype: wire dtype tag (f32 or bf16).
        ws: scratch of the calling thread.

    Upstream: ``payload_to_f32``, ``accumulate_payload_into``, ``f32_slice_to_payload_bytes``.
    """
    n = out.shape[0]
    if acc is None and not views:
        out.fill(0)
        return
    if dtype == DTYPE_F32:  # chunk by chunk, each folded as fold_small folds a tensor
        for s in _chunks(0, n):
            e = min(s + CHUNK_ELEMS, n)
            a = None if acc is None else acc[s:e]
            # the sums' own slice when out is acc, so fold_small copies nothing onto itself
            o = a if a is not None and acc is out else out[s:e]
            fold_small(o, a, [v[s:e] for v in views], dtype, ws)
        return
    if dtype != DTYPE_BF16:  # pragma: no cover - callers validate the tag
        raise ValueError(f"dtype {dtype}")
    if acc is None:
        _sum_bf16(views, 0, n, out, None, ws)
        return
    jit = _jit_for(n)
    for s in _chunks(0, n):
        e = min(s + CHUNK_ELEMS, n)
        a = acc[s:e]
        for v in views:
            if jit is not None:
                jit.bf16_accumulate(a, v[s:e])
            else:
                t = ws.wide[: e - s]
                widen_bf16(v[s:e], t)
                np.add(a, t, out=a)
        if jit is not None:
            jit.bf16_encode(a, out[s:e])
        else:
            encode_bf16(a, out[s:e], ws)


def fold_small(
    out: npt.NDArray[Any],
    acc: F32Array | None,
    views: Sequence[npt.NDArray[Any]],
    dtype: int,
    ws: Workspace,
) -> None:
    """:func:`fold_into` for a tensor of fewer than :data:`SMALL_ELEMS` elements, in one pass
    with no per-call set-up: no warning context (the caller holds ``np.errstate(all="ignore")``
    around its fold), no chunk loop. Same arguments (``ws`` of at least ``len(out)`` elements),
    same result bit for bit. Its f32 arm takes any length (it uses no workspace):
    :func:`fold_into` folds each chunk of an f32 tensor with it.

    Upstream: ``payload_to_f32``, ``accumulate_payload_into``, ``f32_slice_to_payload_bytes``.
    """
    if acc is None and not views:
        out.fill(0)
        return
    if dtype == DTYPE_F32:
        o = out if acc is None else acc  # the running sums live here
        rest = views
        if acc is None:
            np.add(views[0], _ZERO, out=o)
            rest = views[1:]
        for v in rest:
            np.add(o, v, out=o)
        if acc is not None and acc is not out:
            np.copyto(out, o)  # f32 sums are their own encoding
        return
    if acc is None:
        _sum_bf16(views, 0, out.shape[0], out, None, ws)
        return
    t = ws.wide[: acc.shape[0]]
    for v in views:
        widen_bf16(v, t)
        np.add(acc, t, out=acc)
    encode_bf16_small(acc, out)


@_quiet
def scale_bf16(src: U16Array, dst: U16Array, factor: np.float32) -> None:
    """``dst = encode(decode(src) * factor)`` for bf16 bits (same length; one rounding).

    Upstream: ``scale_payload_bytes`` (bf16 arm).
    """
    n = src.shape[0]
    jit = _jit_for(n)
    if jit is not None:
        jit.bf16_scale(src, dst, np.float32(factor))
        return
    if n < SMALL_ELEMS:  # one scratch array, no workspace, no chunk loop
        wide = np.empty(n, F32)
        widen_bf16(src, wide)
        np.multiply(wide, factor, out=wide)
        encode_bf16_small(wide, dst)
        return
    ws = Workspace(min(n, CHUNK_ELEMS))
    for s in _chunks(0, n):
        e = min(s + CHUNK_ELEMS, n)
        t = ws.wide[: e - s]
        widen_bf16(src[s:e], t)
        np.multiply(t, factor, out=t)
        encode_bf16(t, dst[s:e], ws)

"""Chunked NumPy kernels of the fold: exact bf16 widening, upstream's bf16 rounding, in-place f32
accumulation.

Everything here works on flat NumPy views of payload bytes and touches memory in chunks of
:data:`CHUNK_ELEMS` elements, so a bf16 contribution is never materialised whole as f32 and the
working set of one chunk (accumulator slice, widened slice, the inputs' slices) stays in the L2
cache. No Python loop runs over elements; the Python loop runs over chunks only.

Arithmetic matches upstream bit for bit (x86-64 NaN rules, see the vectors' README):

* f32 accumulation is ``acc = acc + x`` in f32, in contribution order, the accumulator starting
  from ``+0.0`` (so a lone ``-0.0`` becomes ``+0.0``);
* bf16 widening is exact (``bits << 16``, NaN payloads kept);
* bf16 encoding is round-to-nearest-even, and a NaN keeps its sign and top payload bits with the
  quiet bit forced (``(bits >> 16) | 0x0040``). ``ml_dtypes`` rounds identically but turns every
  NaN into ``0x7FC0`` / ``0xFFC0``, so NaN lanes are patched after the cast.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``accumulate_payload_into``,
``f32_slice_to_payload_bytes``, ``scale_payload_bytes``, ``f32_to_bf16_bits``,
``bf16_bits_to_f32``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..spec import DTYPE_BF16, DTYPE_F32

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("flodl_proto.reduce needs a little-endian host (payloads are LE on the wire)")

__all__ = [
    "BF16",
    "CHUNK_ELEMS",
    "F32",
    "U16",
    "Workspace",
    "accumulate",
    "encode_bf16",
    "encode_sums",
    "promote",
    "sum_contributions",
    "widen_bf16",
]

#: Elements per chunk: 64 Ki elements (256 KiB of f32), measured fastest on the reference machine
#: (the working set of a W = 4 chunk stays in L2; larger chunks spill, smaller ones pay per-call
#: overhead).
CHUNK_ELEMS: Final = 1 << 16

F32: Final = np.dtype("<f4")
U16: Final = np.dtype("<u2")
BF16: Final = np.dtype(ml_dtypes.bfloat16)
_U32: Final = np.dtype("<u4")
_ZERO: Final = np.float32(0.0)
_QUIET: Final = np.uint32(0x0040)

F32Array = npt.NDArray[np.float32]
U16Array = npt.NDArray[np.uint16]


class Workspace:
    """Per-call scratch buffers of one chunk (accumulator, widened input, NaN mask)."""

    __slots__ = ("acc", "mask", "wide")

    def __init__(self, n: int = CHUNK_ELEMS) -> None:
        self.acc: F32Array = np.empty(n, F32)
        self.wide: F32Array = np.empty(n, F32)
        self.mask: npt.NDArray[np.bool_] = np.empty(n, np.bool_)


def widen_bf16(src: U16Array, dst: F32Array) -> None:
    """``dst[i] = f32::from_bits(src[i] << 16)`` (exact; NaN payloads kept). Same length."""
    np.copyto(dst, src.view(BF16), casting="unsafe")


def encode_bf16(src: F32Array, dst: U16Array, mask: npt.NDArray[np.bool_]) -> None:
    """bf16 bits of ``src`` into ``dst`` with upstream's rounding and NaN rule.

    ``mask`` is scratch of at least ``len(src)`` booleans. Call inside ``np.errstate`` (the cast
    warns on NaN and overflow).
    """
    n = src.shape[0]
    np.copyto(dst.view(BF16), src, casting="unsafe")
    if n and np.isnan(np.min(src)):
        m = np.isnan(src, out=mask[:n])
        bits = src.view(_U32)[m]
        dst[m] = ((bits >> 16) | _QUIET).astype(U16)


def _chunks(n: int) -> range:
    return range(0, n, CHUNK_ELEMS)


_T = TypeVar("_T")


def _quiet(fn: Callable[..., _T]) -> Callable[..., _T]:
    """Run ``fn`` with NumPy float warnings off (NaN/overflow casts and inf arithmetic are part of
    the protocol's arithmetic, not errors)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


@_quiet
def sum_contributions(
    views: Sequence[npt.NDArray[Any]],
    dtype: int,
    numel: int,
    scale: np.float32 | None,
    ws: Workspace,
) -> npt.NDArray[Any]:
    """Element-wise sum of ``views`` in order from ``+0.0``, re-encoded in ``dtype``.

    Args:
        views: one flat array per contribution (``<f4`` for f32, ``<u2`` bf16 bits), each of
            ``numel`` elements (checked by the caller), at least one.
        dtype: wire dtype tag (f32 or bf16).
        numel: element count.
        scale: when given, the encoded sum is then decoded, multiplied by ``scale`` in f32 and
            re-encoded (upstream's normalisation; two roundings for bf16).
        ws: scratch.

    Returns:
        A new flat array (``<f4`` or ``<u2``) of ``numel`` elements: the payload.
    """
    if dtype == DTYPE_F32:
        out32: F32Array = np.empty(numel, F32)
        for s in _chunks(numel):
            e = min(s + CHUNK_ELEMS, numel)
            a = out32[s:e]
            np.add(views[0][s:e], _ZERO, out=a)
            for v in views[1:]:
                np.add(a, v[s:e], out=a)
            if scale is not None:
                np.multiply(a, scale, out=a)
        return out32
    if dtype != DTYPE_BF16:  # pragma: no cover - callers validate the tag
        raise ValueError(f"dtype {dtype}")
    out16: U16Array = np.empty(numel, U16)
    for s in _chunks(numel):
        e = min(s + CHUNK_ELEMS, numel)
        k = e - s
        a = ws.acc[:k]
        t = ws.wide[:k]
        o = out16[s:e]
        widen_bf16(views[0][s:e], t)
        np.add(t, _ZERO, out=a)
        for v in views[1:]:
            widen_bf16(v[s:e], t)
            np.add(a, t, out=a)
        encode_bf16(a, o, ws.mask)
        if scale is not None:
            widen_bf16(o, t)
            np.multiply(t, scale, out=a)
            encode_bf16(a, o, ws.mask)
    return out16


@_quiet
def promote(view: npt.NDArray[Any] | None, dtype: int, numel: int, ws: Workspace) -> F32Array:
    """A fresh f32 accumulator holding ``0.0 + decode(view)`` (zeros when ``view`` is None).

    Upstream: ``payload_to_f32`` (zeros, then one accumulate).
    """
    acc: F32Array = np.zeros(numel, F32) if view is None else np.empty(numel, F32)
    if view is None:
        return acc
    if dtype == DTYPE_F32:
        np.add(view, _ZERO, out=acc)
        return acc
    for s in _chunks(numel):
        e = min(s + CHUNK_ELEMS, numel)
        a = acc[s:e]
        widen_bf16(view[s:e], a)
        np.add(a, _ZERO, out=a)
    return acc


@_quiet
def accumulate(acc: F32Array, view: npt.NDArray[Any], dtype: int, ws: Workspace) -> None:
    """``acc += decode(view)`` in place (bf16 widened chunk by chunk). Same element count.

    Upstream: ``accumulate_payload_into``.
    """
    n = acc.shape[0]
    for s in _chunks(n):
        e = min(s + CHUNK_ELEMS, n)
        a = acc[s:e]
        if dtype == DTYPE_F32:
            np.add(a, view[s:e], out=a)
        else:
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
    n = acc.shape[0]
    out: U16Array = np.empty(n, U16)
    for s in _chunks(n):
        e = min(s + CHUNK_ELEMS, n)
        encode_bf16(acc[s:e], out[s:e], ws.mask)
    return out

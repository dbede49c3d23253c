"""The fold's kernels for short runs (fewer than ``SMALL_ELEMS`` elements; see
:mod:`flodl_proto.reduce._kernels`): a run of tensors summed in one pass, upstream's bf16 encoding
(through ml_dtypes' cast where ml_dtypes is loaded already), the rounding to bf16 precision in the
f32 domain.

At these sizes each NumPy call costs more than the arithmetic it does, so these kernels spend as
few calls as they can, with the arithmetic of the chunked kernels bit for bit:

* bf16 bits are widened by copying them into the high halves of u32 lanes whose low halves stay
  zero (the workspace's ``high`` lanes, written only here and only through their high halves):
  one strided copy gives ``bits << 16``, the exact widening (NaN payloads kept);
* whether a sum may hold a NaN is read from its dot product with itself (:func:`may_hold_nan`);
* the encode is upstream's integer rounding (``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``, five
  NumPy calls), or, in a process that has imported ml_dtypes already, its float32 -> bfloat16
  cast (one call, about 4 us faster below 1 Ki elements), which rounds to nearest-even exactly
  as the integer rule for every non-NaN value; either way NaN lanes are then re-encoded with
  upstream's rule (``(bits >> 16) | 0x0040``). ml_dtypes is never imported for it: its import
  costs about a second of CPU (the casts of its many dtypes registered with NumPy), which a
  relay or a controller, which only encodes bits, never needs.

Call them with NumPy's float warnings off (a NaN cast and inf arithmetic warn).

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``sum_frames``,
``reduce_realized_work``, ``f32_to_bf16_bits``, ``bf16_bits_to_f32``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from .._bf16 import loaded_bf16
from ..spec import DTYPE_F32

__all__ = [
    "F32",
    "U16",
    "encode_bf16_small",
    "may_hold_nan",
    "round_bf16_small",
    "sum_small_batch",
]

F32: Final = np.dtype("<f4")
U16: Final = np.dtype("<u2")
_U32: Final = np.dtype("<u4")
_ZERO: Final = np.float32(0.0)
_QUIET16: Final = np.uint32(0x0040)
_SIXTEEN: Final = np.uint32(16)
_ONE: Final = np.uint32(1)
_HALF_MINUS: Final = np.uint32(0x7FFF)

F32Array = npt.NDArray[np.float32]
U16Array = npt.NDArray[np.uint16]
U32Array = npt.NDArray[np.uint32]


class Workspace(Protocol):
    """The scratch these kernels use, as ``_kernels.Workspace`` holds it (named here by its
    shape, so that this module imports nothing of ``_kernels``): ``acc`` (f32) and ``tmp``
    (u32) of at least a run's length, and ``high``, the zero-low lanes :func:`high_lanes`
    makes. No upstream counterpart (scratch of this implementation's kernels)."""

    acc: F32Array
    tmp: U32Array
    high: U32Array | None


def may_hold_nan(a: F32Array) -> bool:
    """Whether the flat f32 array ``a`` holds a NaN, from ``a . a``: every square is
    non-negative, ``+inf`` or NaN, and a sum of non-negative values and ``+inf`` is never NaN, so
    the dot product is NaN exactly when a lane is (in any order of summation, fused or not). One
    BLAS call, several times cheaper than ``np.isnan(np.min(a))`` at these sizes.

    No upstream counterpart: upstream's encode tests each lane as it goes
    (``controller/round_frame.rs`` ``f32_to_bf16_bits``)."""
    s = a.dot(a)
    return bool(s != s)


def high_lanes(ws: Workspace, n: int) -> tuple[F32Array, U16Array]:
    """The first ``n`` of the workspace's ``high`` lanes (zero when made: at first use, and
    again, longer, when a run needs more), as f32 and their high halves as a strided ``<u2``
    view. Bits copied into the halves read back, as f32, as their exact widening; nothing may
    write the lanes but through that view. The widening is upstream's bf16-to-f32 one (the bits
    in the top half), done lane by lane there (``controller/round_frame.rs``)."""
    h = ws.high
    if h is None or h.shape[0] < n:
        h = ws.high = np.zeros(n, _U32)
    lanes = h[:n]
    return lanes.view(F32), lanes.view(U16)[1::2]


def encode_bf16_small(src: F32Array, dst: U16Array, may_have_nan: bool | None = None) -> None:
    """bf16 bits of ``src`` into ``dst`` with upstream's rounding and NaN rule, for a short
    ``src`` (any length; the fast choice below ``SMALL_ELEMS``): upstream's integer rounding
    (``(b + 0x7FFF + ((b >> 16) & 1)) >> 16`` in a fresh u32 scratch), or, when this process
    has imported ml_dtypes already (:func:`~flodl_proto._bf16.loaded_bf16`; it is never
    imported here), ml_dtypes' float32 -> bfloat16 cast, one call that rounds to nearest-even
    exactly as the integer rule for every non-NaN value (subnormals, overflow to infinity and
    signed zeros included); then NaN lanes re-encoded with upstream's rule
    (``(bits >> 16) | 0x0040``; the cast gives the default NaN, the rounding may carry out of
    a NaN's payload). The same bits either way.

    Args:
        src: flat ``<f4``. dst: ``<u2`` of the same length (a strided view is fine).
        may_have_nan: False when the caller knows ``src`` holds no NaN (skips the scan); None
            to scan.

    Call it with NumPy's invalid-value warning off (a NaN cast warns).

    Upstream: ``controller/round_frame.rs`` ``f32_to_bf16_bits``.
    """
    cast = loaded_bf16()
    if cast is not None:
        np.copyto(dst.view(cast), src, casting="unsafe")
    else:
        u = src.view(_U32)
        t = np.right_shift(u, _SIXTEEN)
        np.bitwise_and(t, _ONE, out=t)
        np.add(t, _HALF_MINUS, out=t)
        np.add(t, u, out=t)
        np.right_shift(t, _SIXTEEN, out=t)
        np.copyto(dst, t, casting="unsafe")
    if may_have_nan is None:
        may_have_nan = may_hold_nan(src)
    if may_have_nan:
        m = np.isnan(src)
        if m.any():
            dst[m] = ((src.view(_U32)[m] >> _SIXTEEN) | _QUIET16).astype(U16)


def round_bf16_small(a: F32Array, ws: Workspace, has_nan: bool) -> None:
    """``a = widen(encode_bf16(a))`` in place (rounding to bf16 precision in the f32 domain), for
    a short ``a``: encoded with :func:`encode_bf16_small` into the workspace, then widened back
    into ``a`` (bit-identical: a NaN keeps its sign and top payload bits with the quiet bit set).
    ``ws`` holds at least ``len(a)`` elements; ``has_nan``: whether ``a`` may hold a NaN.

    Upstream: ``controller/round_frame.rs`` ``f32_to_bf16_bits`` then ``bf16_bits_to_f32``."""
    n = a.shape[0]
    bits = ws.tmp[:n].view(U16)[:n]
    encode_bf16_small(a, bits, has_nan)
    u = a.view(_U32)
    np.copyto(u, bits, casting="unsafe")
    np.left_shift(u, _SIXTEEN, out=u)


def _widen_into(bits: U16Array, c: Sequence[npt.NDArray[Any]] | npt.NDArray[Any]) -> None:
    """One contribution's bf16 bits (a 2-D array, a row a tensor, or a list of flat arrays laid
    end to end) copied into ``bits``, the high halves of zero-low lanes."""
    if type(c) is np.ndarray:
        np.copyto(bits.reshape(c.shape), c)
    elif len(c) == 1:
        np.copyto(bits, c[0])
    else:
        np.concatenate(c, out=bits)


def sum_small_batch(contribs: Sequence[Sequence[npt.NDArray[Any]] | npt.NDArray[Any]],
                    dtype: int, total: int, scale: np.float32 | None,
                    ws: Workspace) -> npt.NDArray[Any]:
    """``sum_small`` of a run of tensors of one dtype laid end to end, in one pass (one
    widening, one add per contribution, one encode): each element bit-identical to
    ``sum_small`` of its tensor (element-wise arithmetic; the NaN scans only decide whether
    NaN lanes are re-encoded, by the same rule wherever they sit).

    Args:
        contribs: per contribution, in summing order, the run's flat element arrays in tensor
            order (``<f4`` for f32, ``<u2`` bf16 bits), lengths adding up to ``total``; or, for
            tensors of one length, per contribution one 2-D array, a row a tensor.
        dtype: wire dtype tag (f32 or bf16). total: the run's element count.
        scale: when given, the encoded sum is then decoded, multiplied by ``scale`` in f32 and
            re-encoded (upstream's normalisation; two roundings for bf16).
        ws: scratch of at least ``total`` elements (bf16 only).

    Returns:
        A new flat ``<f4`` or ``<u2`` array of ``total`` elements (tensor ``i`` after tensors
        ``0 .. i-1``). Call it with NumPy's float warnings off.

    Upstream: ``controller/round_frame.rs`` ``sum_frames`` / ``reduce_realized_work``.
    """
    first = contribs[0]
    if dtype == DTYPE_F32:
        out32: F32Array = np.empty(total, F32)
        if type(first) is np.ndarray:  # 2-D: a row a tensor, each op over the whole run
            rows = out32.reshape(first.shape)
            np.add(first, _ZERO, out=rows)
            for c in contribs[1:]:
                np.add(rows, c, out=rows)
        else:
            np.concatenate(first, out=out32)
            np.add(out32, _ZERO, out=out32)
            if len(contribs) > 1:  # the later ones added tensor by tensor (no gather copy)
                at = 0  # each tensor's slice of the run (np.split's views, without its set-up)
                segs = [out32[at:(at := at + v.shape[0])] for v in first]
                for c in contribs[1:]:
                    for seg, v in zip(segs, c, strict=True):
                        np.add(seg, v, out=seg)
        if scale is not None:
            np.multiply(out32, scale, out=out32)
        return out32
    out16: U16Array = np.empty(total, U16)
    if total == 0:
        return out16
    a = ws.acc[:total]
    wide, bits = high_lanes(ws, total)
    _widen_into(bits, first)
    np.add(wide, _ZERO, out=a)  # 0.0 + the first contribution, as upstream's zeroed accumulator
    for c in contribs[1:]:
        _widen_into(bits, c)
        np.add(a, wide, out=a)
    may_have_nan = has_nan = may_hold_nan(a)
    if scale is not None:  # a zero or infinite scale can make a NaN (0 * inf) where none was
        encode_bf16_small(a, bits, has_nan)  # rounded to bf16: its widening is in `wide`
        np.multiply(wide, scale, out=a)
        may_have_nan = has_nan or not bool(0.0 < scale < np.inf)
    encode_bf16_small(a, out16, may_have_nan)
    return out16

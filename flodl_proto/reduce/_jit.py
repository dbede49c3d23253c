"""Compiled bf16 kernels of the fold (numba), giving the NumPy kernels' bytes.

Imported only by :mod:`flodl_proto.reduce._kernels`, and only when the ``fast`` extra
(``numba``) is installed and the compiled backend is selected (see
:func:`flodl_proto.reduce.kernel_backend`). Each kernel is one loop over elements, compiled on
first use (and cached on disk), that releases the GIL; the callers hand it flat arrays of equal
length, in chunks when they want the working set to stay in cache.

The arithmetic is upstream's, operation for operation. One choice is made explicit: when both
operands of an add or multiply are NaN, x86 returns the *first* operand's NaN, but a compiler may
swap the operands of a commutative ``+`` or ``*``, so every add and multiply whose left operand
is a NaN yields that NaN, quietened (``bits | 0x00400000``). Which NaN survives is platform
behaviour upstream (and NumPy's SIMD loops keep either one), so only NaN-ness is compared there.
Otherwise the hardware result is taken as is (a single NaN operand is quietened by the
instruction; an invalid operation gives the default NaN ``0xFFC00000``).

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``accumulate_payload_into``,
``f32_slice_to_payload_bytes``, ``scale_payload_bytes``, ``f32_to_bf16_bits``,
``bf16_bits_to_f32``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

__all__ = ["bf16_accumulate", "bf16_encode", "bf16_finish", "bf16_scale", "bf16_widen_first"]

_F = TypeVar("_F", bound=Callable[..., Any])


if getattr(numba.config, "DISABLE_JIT", False):
    raise ImportError("numba's JIT is disabled (NUMBA_DISABLE_JIT)")


def _njit(fn: _F, **options: Any) -> _F:
    """Compile ``fn`` with the GIL released, no bounds checks and the NumPy error model,
    cached on disk where numba finds a writable cache directory (else compiled per process)."""
    try:
        return cast(_F, numba.njit(nogil=True, boundscheck=False, cache=True,
                                   error_model="numpy", **options)(fn))
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return cast(_F, numba.njit(nogil=True, boundscheck=False, cache=False,
                                   error_model="numpy", **options)(fn))


def _kernel(fn: _F) -> _F:
    """A compiled kernel (see :func:`_njit`)."""
    return _njit(fn)


def _inline(fn: _F) -> _F:
    """As :func:`_kernel`, inlined into its callers."""
    return _njit(fn, inline="always")


def _bits_to_f32_impl(typingctx: Any, x: Any) -> Any:
    """LLVM bitcast u32 -> f32 (``f32::from_bits``)."""
    sig = types.float32(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return sig, codegen


def _f32_to_bits_impl(typingctx: Any, x: Any) -> Any:
    """LLVM bitcast f32 -> u32 (``f32::to_bits``)."""
    sig = types.uint32(types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return sig, codegen


_bits_to_f32 = cast(Callable[[Any], Any], intrinsic(_bits_to_f32_impl))
_f32_to_bits = cast(Callable[[Any], Any], intrinsic(_f32_to_bits_impl))


@_inline
def _widen(b: Any) -> Any:
    return _bits_to_f32(np.uint32(b) << np.uint32(16))


@_inline
def _quiet(x: Any) -> Any:
    return _bits_to_f32(_f32_to_bits(x) | np.uint32(0x00400000))


@_inline
def _encode(x: Any) -> Any:
    b: Any = _f32_to_bits(x)
    if x != x:
        return np.uint16((b >> np.uint32(16)) | np.uint32(0x0040))
    return np.uint16(
        (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    )


@_kernel
def bf16_widen_first(acc: Any, src: Any) -> None:
    """``acc[i] = 0.0 + widen(src[i])`` (f32 ``acc``, bf16 bits ``src``, same length)."""
    for i in range(acc.shape[0]):
        acc[i] = np.float32(0.0) + _widen(src[i])


@_kernel
def bf16_accumulate(acc: Any, src: Any) -> None:
    """``acc[i] = acc[i] + widen(src[i])`` in f32 (left operand's NaN first)."""
    for i in range(acc.shape[0]):
        a = acc[i]
        r = a + _widen(src[i])
        if a != a:
            r = _quiet(a)
        acc[i] = r


@_kernel
def bf16_encode(src: Any, dst: Any) -> None:
    """``dst[i] = bf16 bits of src[i]`` (round-to-nearest-even; NaN keeps sign and top payload,
    quiet bit forced)."""
    for i in range(src.shape[0]):
        dst[i] = _encode(src[i])


@_kernel
def bf16_finish(acc: Any, dst: Any, scale: Any, has_scale: bool) -> None:
    """``dst[i] = encode(acc[i])``, or with ``has_scale``
    ``encode(widen(encode(acc[i])) * scale)`` (upstream's normalisation: two roundings)."""
    if has_scale:
        for i in range(acc.shape[0]):
            r = _widen(_encode(acc[i]))
            y = r * scale
            if r != r:
                y = _quiet(r)
            dst[i] = _encode(y)
    else:
        for i in range(acc.shape[0]):
            dst[i] = _encode(acc[i])


@_kernel
def bf16_scale(src: Any, dst: Any, factor: Any) -> None:
    """``dst[i] = encode(widen(src[i]) * factor)`` (bf16 bits in and out, f32 ``factor``)."""
    for i in range(src.shape[0]):
        r = _widen(src[i])
        y = r * factor
        if r != r:
            y = _quiet(r)
        dst[i] = _encode(y)

"""A rank's tensors to and from wire payloads: the checks of the caller's arrays and numbers,
each tensor pre-scaled into a payload or into its place in a frame template, and the consensus
written back into the caller's arrays.

The :class:`~flodl_proto.runner.rank.RankClient` calls these; they do no I/O. Every product is
computed in f32 and rounded once into the wire dtype (bf16 with upstream's rounding and NaN
rule).

Upstream: ``flodl/src/distributed/cpu_reduce.rs`` (``CpuReduceClient``: the pre-scale and the
decode into the request's tensors).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .._bf16 import is_bf16
from ..codec._common import underflow_reason, wire_real
from ..codec._frame_model import _NUMPY_MAX_NDIM
from ..codec.round_frame import Dtype, RoundFrame, TensorPayload
from ..codec.template import FrameTemplate
from ..errors import protocol_error, shown_type
from ..reduce import bf16_from_f32, bf16_to_f32, scale_payload
from ..reduce.payload import Bf16Scaler
from ..spec import U32_MAX

__all__ = ["F32", "SmallLayout", "check_array", "decode_into", "fill_small",
           "real_argument", "scaled_payload"]

#: the f32 dtype, little-endian (the wire's byte order)
F32 = np.dtype("<f4")
_U16 = np.dtype("<u2")
_F32_TAG = int(Dtype.F32)
_BF16_TAG = int(Dtype.BF16)


def _wire_tag(dtype: np.dtype[Any]) -> int | None:
    """The wire dtype tag whose payload bytes are the bits of a destination of ``dtype``: f32's
    or bf16's, else None."""
    if dtype == F32:
        return _F32_TAG
    return _BF16_TAG if is_bf16(dtype) else None


def check_array(index: int, a: Any, receives: bool = False) -> npt.NDArray[Any]:
    """``a`` as an array the wire can carry; with ``receives``, one the consensus can be
    written into (a writable NumPy array, not a scalar or a copy made here).

    Raises:
        InvalidValue (local): another dtype (``client.bad_dtype``), a dim over u32
            (``frame.dim_too_large``), or (``receives``) an array that cannot take the consensus
            (``client.not_writable``).

    Upstream: ``cpu_reduce.rs`` (the request's tensors: f32 or bf16, u32 dims).
    """
    arr = np.asarray(a)
    if arr.dtype != F32 and not is_bf16(arr.dtype):
        raise protocol_error("client.bad_dtype", index=index, dtype=str(arr.dtype))
    for d, n in enumerate(arr.shape):
        if n > U32_MAX:
            raise protocol_error("frame.dim_too_large", index=index, dim=d, value=n)
    if receives:
        if not isinstance(a, np.ndarray):  # a subclass's base view shares its memory
            raise protocol_error("client.not_writable", index=index, reason=(
                f"got {shown_type(a)}, not a NumPy array, so the consensus would go into a "
                f"copy; pass an array"))
        if not arr.flags.writeable:
            raise protocol_error("client.not_writable", index=index, reason=(
                "the array is read-only; pass a writable array"))
    return arr


def real_argument(field: str, value: Any) -> float:
    """``value`` as a float when it is a real number by the codec's rule
    (:func:`~flodl_proto.codec._common.wire_real`: an int, a float, a NumPy number or a 0-d
    NumPy array of one; not text, not a bool), for the scale, weight and count arguments; an
    int or a ``Fraction`` beyond the f64 range, which that rule takes as an infinity, is
    refused here, named as given, and so is a nonzero ``Fraction`` whose f64 is a zero
    (``Fraction(1, 10**400)``: a scale or weight of 0.0 is a round that realized nothing).

    Raises:
        InvalidValue (local): ``client.bad_argument`` naming ``field`` and the value.

    No upstream counterpart: upstream's arguments are typed ``f64`` by the compiler.
    """
    x = wire_real(value)
    if x is None:
        raise protocol_error("client.bad_argument", field=field, value=value,
                             reason="not a real number")
    if math.isinf(x) and isinstance(value, numbers.Rational):  # an int, a Fraction past f64
        raise protocol_error("client.bad_argument", field=field, value=value,
                             reason="beyond the f64 range")
    if x == 0.0 and (tiny := underflow_reason(value, x)) is not None:
        raise protocol_error("client.bad_argument", field=field, value=value, reason=tiny)
    return x


def scaled_payload(arr: npt.NDArray[Any], wire: Dtype, scale: float | None,
             out: npt.NDArray[np.float32] | None = None) -> TensorPayload:
    """One tensor's payload in ``wire`` dtype, pre-scaled by ``scale`` (None: unscaled).

    The product is computed in f32 and rounded once into the wire dtype (bf16 with upstream's
    rounding and NaN rule). ``out`` (f32, ``arr.size`` elements) receives an f32 product that
    goes on the wire as is, or the bf16 product of a bf16 array (in its first half), sparing an
    allocation per round. With a ``scale``, call it with NumPy's float warnings off
    (``np.errstate(all="ignore")``: the protocol's arithmetic overflows and makes NaNs by
    design); ``arr`` comes from :func:`check_array` (its shape fits the wire).

    Upstream: ``cpu_reduce.rs`` ``all_reduce_scaled`` (pre-scale, then one rounding).
    """
    src_bf16 = is_bf16(arr.dtype)
    flat = np.ascontiguousarray(arr).reshape(-1)
    if scale is None:
        if src_bf16 == (wire is Dtype.BF16):
            data: memoryview = flat.view(np.uint8).data
        elif src_bf16:  # bf16 staged, f32 wire: exact widening
            data = bf16_to_f32(flat.view(np.uint16)).view(np.uint8).data
        else:  # f32 staged, bf16 wire: one rounding
            data = bf16_from_f32(flat).view(np.uint8).data
        return TensorPayload.trusted(int(wire), arr.shape, data)
    f = np.float32(scale)
    if src_bf16 and wire is Dtype.BF16:
        dst = None if out is None else out.view(np.uint8)  # 4 bytes per element: room
        data = scale_payload(int(Dtype.BF16), flat.view(np.uint8).data, f, out=dst)
    else:
        wide = bf16_to_f32(flat.view(np.uint16)) if src_bf16 else flat
        if wire is Dtype.F32 and out is not None and not src_bf16:
            prod = np.multiply(wide, f, out=out)
        else:
            prod = np.multiply(wide, f, dtype=F32)
        if wire is Dtype.F32:
            data = prod.view(np.uint8).data
        else:
            data = bf16_from_f32(prod).view(np.uint8).data
    return TensorPayload.trusted(int(wire), arr.shape, data)


class SmallLayout(NamedTuple):
    """What a client keeps for the layout of its small frames (payloads up to
    ``TEMPLATE_MAX_PAYLOAD`` bytes).

    Attributes:
        key: ``(kind, wire dtype, frame ceiling, *shapes)`` of the frames it serves.
        template: the frame image the payloads are pre-scaled into.
        prefix: the record's 4-byte length prefix (the template's ``wire_len``).
        bf16: on a bf16 wire, the scaler of the template's payloads (their checks done once);
            None on an f32 wire.

    No upstream counterpart: upstream's client encodes every frame afresh
    (``cpu_reduce.rs``).
    """

    key: tuple[Any, ...]
    template: FrameTemplate
    prefix: bytes
    bf16: Bf16Scaler | None


def fill_small(kept: SmallLayout, arrs: Sequence[npt.NDArray[Any]], f: np.float32) -> None:
    """Write ``arrs`` (from :func:`check_array`, of the layout's shapes) pre-scaled by ``f``
    into their places in ``kept``'s template: the values :func:`scaled_payload` gives, computed in
    f32 and rounded once into the wire dtype (bf16 with upstream's rounding and NaN rule).

    On a bf16 wire every tensor goes through the layout's scaler in one pass (one gather, one
    multiply, one NaN scan, one rounding cast, one copy per tensor): bf16 staging as its bit
    patterns (widened by a shift), f32 or mixed staging as values (the gather widens bf16
    values exactly). On an f32 wire, one ``np.multiply`` per tensor into its place (a bf16
    array's values widened exactly to f32 first). Call it with NumPy's float warnings off."""
    scaler = kept.bf16
    if scaler is not None:
        if arrs and all(is_bf16(a.dtype) for a in arrs):
            scaler.run([a.view(_U16) for a in arrs], f, True)
        else:
            scaler.run(arrs, f, False)
        return
    for a, dst in zip(arrs, kept.template.payloads, strict=True):
        np.multiply(a, f, out=dst)  # a bf16 array's values are widened exactly to f32 first


def decode_into(frame: RoundFrame, arrays: Sequence[npt.NDArray[Any]]) -> None:
    """Write ``frame``'s tensors into ``arrays`` in place, without intermediate copies.

    Each payload is viewed read-only and copied with ``np.copyto``: bf16 payloads are widened
    exactly into f32 destinations (from their bits, a shift: no ml_dtypes array is made, so an
    f32 caller never loads ml_dtypes), f32 payloads are rounded into bf16 destinations with
    upstream's rule, same-dtype payloads are copied bit for bit; an elided payload zeroes the
    destination.

    Raises:
        SchemaMismatch (local): tensor count or element count differs (``client.reply_schema``).
        InvalidValue / SchemaMismatch: a payload with an unknown dtype or a byte count that does
            not match its shape.
        ValueError: a destination is read-only.
        Every error but the last is raised before any destination is written.

    Upstream: ``cpu_reduce.rs`` (decode-into-destination).
    """
    tensors = frame.tensors
    if len(tensors) != len(arrays):
        raise protocol_error("client.reply_schema", index=len(arrays), reason=(
            f"the consensus carries {len(tensors)} tensors, the request {len(arrays)}"))
    # the common reply: every payload carries its destination's own bits (dtype, shape and
    # byte count). Such a payload can fail no check of the general loop below, which would
    # copy it bit for bit too, so it is copied at once, without the lists of that loop
    for p, dst in zip(tensors, arrays, strict=True):
        if (p.shape != dst.shape or p.data.nbytes != dst.nbytes
                or p.dtype != _wire_tag(dst.dtype)):
            break
    else:
        for p, dst in zip(tensors, arrays, strict=True):
            flat = np.frombuffer(p.data, dst.dtype)
            dst[...] = flat if len(p.shape) == 1 else flat.reshape(p.shape)
        return
    # every payload is checked and viewed before any destination is written: a reply that
    # fails at tensor k leaves every destination as it was, not the first k adopted
    srcs: list[npt.NDArray[Any] | None] = []
    same: list[bool] = []  # per tensor: the payload's bits are the destination's
    widen: list[bool] = []  # per tensor: bf16 bits (``<u2``) for an f32 destination
    for i, (p, dst) in enumerate(zip(tensors, arrays, strict=True)):
        data = p.data
        shape = dst.shape
        if (p.shape == shape and data.nbytes == dst.nbytes
                and p.dtype == _wire_tag(dst.dtype)):  # same dtype and shape: the bits
            flat = np.frombuffer(data, dst.dtype)  # of the destination's element count
            srcs.append(flat if len(shape) == 1 else flat.reshape(shape))
            same.append(True)
            widen.append(False)
            continue
        if p.numel != dst.size:
            raise protocol_error("client.reply_schema", index=i, reason=(
                f"consensus shape {list(p.shape)} does not fit destination shape "
                f"{list(shape)}"))
        same.append(False)
        if p.elided and p.numel:
            srcs.append(None)
            widen.append(False)
            continue
        # a well-formed bf16 payload of elements for an f32 destination: its bits (any other
        # payload is viewed, and checked, by TensorPayload.array)
        bf16_bits = (p.dtype == _BF16_TAG and dst.dtype == F32 and p.numel > 0
                     and data.nbytes == 2 * p.numel and len(p.shape) <= _NUMPY_MAX_NDIM)
        view = np.frombuffer(data, _U16) if bf16_bits else p.array()
        srcs.append(view if view.shape == shape else view.reshape(shape))
        widen.append(bf16_bits)
    for src, dst, bits, bf16_src in zip(srcs, arrays, same, widen, strict=True):
        if src is None:
            dst[...] = 0
        elif bits:  # np.copyto of one dtype and shape, without its argument handling
            dst[...] = src
        elif bf16_src:  # exact: the bits in the high half of each f32, widened in place
            if dst.flags.c_contiguous:  # (a destination of another layout takes a copy)
                bf16_to_f32(src, out=dst)
            else:
                np.copyto(dst, bf16_to_f32(src))
        elif is_bf16(dst.dtype) and not is_bf16(src.dtype):
            np.copyto(dst.view(np.uint16), bf16_from_f32(src))
        else:
            np.copyto(dst, src, casting="unsafe")

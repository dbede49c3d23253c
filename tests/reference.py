"""An independent reference for the expected consensus, written plainly for the tests.

It does not call the package's reduce, fold or kernels: each element is summed one at a time in
f32 (NumPy scalars), with the rounding points of the protocol spelled out (the vectors' README
and ``reduce/fold.py`` describe them):

* a tensor's sum starts from ``+0.0`` and adds the contributions in list order, each add rounded
  to f32; bf16 elements are widened exactly (``bits << 16``);
* the mass is the f64 sum of the weights from ``-0.0``;
* a Model round whose mass is above zero multiplies each sum by ``f32(1.0 / mass)`` (the
  reciprocal computed in f64, rounded once to f32), the product rounded to f32;
* the result is encoded in the tensor's dtype; bf16 rounds to nearest-even (twice for a scaled
  round: the sum, then the product);
* version 3: an elided payload adds nothing; a tensor elided in every frame stays elided.

Only finite inputs are supported (NaN payload rules are the vectors' business).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload

F32_TAG, BF16_TAG = 0, 1


def bf16_bits(x: np.float32) -> int:
    """Round-to-nearest-even of an f32 to bf16, on the bit pattern (finite values only)."""
    (b,) = struct.unpack("<I", struct.pack("<f", float(x)))
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(bits: int) -> np.float32:
    """The f32 value of a bf16 bit pattern (exact)."""
    return np.float32(struct.unpack("<f", struct.pack("<I", bits << 16))[0])


def elements(t: TensorPayload) -> list[np.float32]:
    """A payload's elements as f32 scalars (bf16 widened exactly)."""
    raw = bytes(t.data)
    if t.dtype == F32_TAG:
        return [np.float32(v) for v in struct.unpack(f"<{len(raw) // 4}f", raw)]
    return [bf16_value(b) for b in struct.unpack(f"<{len(raw) // 2}H", raw)]


def encode(vals: Sequence[np.float32], dtype: int) -> bytes:
    """Elements encoded in ``dtype`` (bf16 rounded to nearest-even)."""
    if dtype == F32_TAG:
        return struct.pack(f"<{len(vals)}f", *(float(v) for v in vals))
    return struct.pack(f"<{len(vals)}H", *(bf16_bits(v) for v in vals))


def mass(frames: Sequence[RoundFrame]) -> float:
    """The f64 sum of the weights from ``-0.0``, in list order."""
    total = -0.0
    for f in frames:
        total += f.weight
    return total


def ref_sum(frames: Sequence[RoundFrame | None], *, version: int = 2) -> RoundFrame:
    """The fold monoid: element-wise f32 sums, encoded in each tensor's dtype; never scaled."""
    return _reduce([f for f in frames if f is not None], version, scale=False)


def ref_reduce(frames: Sequence[RoundFrame | None], *, version: int = 2) -> RoundFrame:
    """The controller's realized-work consensus of the accepted frames (``None`` skipped)."""
    return _reduce([f for f in frames if f is not None], version, scale=True)


def _reduce(frames: list[RoundFrame], version: int, scale: bool) -> RoundFrame:
    assert frames, "the reference needs at least one accepted frame"
    first = frames[0]
    w = mass(frames)
    factor: np.float32 | None = None
    if scale and first.kind is RoundKind.MODEL and w > 0.0:
        factor = np.float32(1.0 / w)
    out = []
    for i, t0 in enumerate(first.tensors):
        contribs = [f.tensors[i] for f in frames]
        if version >= 3:
            contribs = [t for t in contribs if t.nbytes or t.numel == 0]
            if not contribs and t0.numel:
                out.append(TensorPayload(t0.dtype, t0.shape, b""))
                continue
        acc = [np.float32(0.0)] * t0.numel
        for t in contribs:
            acc = [np.float32(a + x) for a, x in zip(acc, elements(t), strict=True)]
        if factor is not None:
            if t0.dtype == BF16_TAG:  # the sum is rounded to bf16 before it is scaled
                acc = [bf16_value(bf16_bits(a)) for a in acc]
            acc = [np.float32(a * factor) for a in acc]
        out.append(TensorPayload(t0.dtype, t0.shape, encode(acc, t0.dtype)))
    return RoundFrame(first.kind, w, out)

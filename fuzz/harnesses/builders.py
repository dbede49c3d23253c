"""Well-formed protocol pieces built from a few fuzz bytes, so the stateful targets (the relay's
fold, the controller) get past the MACs and reach their round logic quickly, plus a knob to break
each piece in one chosen way."""

from __future__ import annotations

import struct

from flodl_proto.codec import RoundFrame, TensorPayload

from .common import Params

#: weights a built frame can carry (finite, not below zero; -0.0 passes the reader; two of the
#: largest sum past the f64 range)
WEIGHTS: tuple[float, ...] = (1.0, 0.5, 0.0, 2.0, -0.0, 1.6e308, 1e-30, 1e30)
#: shapes a built tensor can have (including zero-element ones)
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (3,), (2, 2), (0,), (2, 0, 3), (5,))
#: element size of the two known dtypes
ELEMENT_SIZE = {0: 4, 1: 2}

Schema = list[tuple[int, tuple[int, ...]]]


def read_schema(p: Params) -> Schema:
    """A round schema: 0-3 tensors, each f32 or bf16 with a shape from :data:`SHAPES`."""
    out: Schema = []
    for _ in range(p.u8() % 4):
        t = p.u8()
        out.append((t & 1, SHAPES[(t >> 1) % len(SHAPES)]))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def build_frame(p: Params, schema: Schema) -> RoundFrame:
    """A RoundFrame following ``schema`` with values read from ``p``.

    One control byte: bit 0 kind (Model / Control), bits 1-3 the weight (:data:`WEIGHTS`), bit 4
    elide every payload (nbytes 0), bits 5-6 break tensor 0 (1: one byte short, 2: unknown dtype
    2, 3: shape (7,)), bit 7 drop the last tensor.
    """
    c = p.u8()
    tensors: list[TensorPayload] = []
    for i, (dtype, shape) in enumerate(schema):
        n = _numel(shape) * ELEMENT_SIZE[dtype]
        data = b"" if c & 0x10 else p.take(n).ljust(n, b"\0")
        if i == 0:
            brk = (c >> 5) & 3
            if brk == 1 and data:
                data = data[:-1]
            elif brk == 2:
                dtype = 2
            elif brk == 3:
                shape = (7,)
        tensors.append(TensorPayload(dtype, shape, data))
    if c & 0x80 and tensors:
        tensors.pop()
    # as given: a broken byte count is one of the fuzzed inputs (the folds must reject it)
    return RoundFrame(c & 1, WEIGHTS[(c >> 1) & 7], tensors, check_nbytes=False)


def f64(x: float) -> bytes:
    """The 8 little-endian bytes of ``x`` as an f64."""
    return struct.pack("<d", x)

"""Payload byte codec: f32 <-> bf16 bit conversion, payload encode / decode / scale.

bf16 is the top half of an f32. Encoding rounds to nearest-even; a NaN keeps its sign and the top
seven payload bits and gets the quiet bit (``(bits >> 16) | 0x0040``), so a NaN can never round
into an infinity; decoding is exact (``bits << 16``). bf16 exists only on the wire: every sum,
scale and outer step runs in f32.

Element bytes are little-endian. Wire dtype tags: 0 = f32 (4 bytes per element), 1 = bf16
(2 bytes); any other tag is refused with upstream's message.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``f32_to_bf16_bits``,
``bf16_bits_to_f32``, ``payload_element_size``, ``payload_to_f32``,
``f32_slice_to_payload_bytes``, ``scale_payload_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._bf16 import is_bf16
from ..codec._arrays import as_array, real_array
from ..codec._common import BytesLike, as_view, underflow_reason, wire_int, wire_real
from ..errors import protocol_error, shown, shown_type
from ..spec import DTYPE_BF16, DTYPE_F32, ELEMENT_SIZE, U32_MAX
from . import _kernels as K

__all__ = [
    "Bf16Scaler",
    "bf16_bits_to_f32_bits",
    "bf16_from_f32",
    "bf16_to_f32",
    "decode_payload",
    "encode_payload",
    "f32_bits_to_bf16_bits",
    "payload_element_size",
    "scale_payload",
    "scale_to_bf16",
]


def payload_element_size(dtype: int) -> int:
    """Bytes per element of wire dtype ``dtype`` (4 for f32, 2 for bf16).

    Raises:
        InvalidValue (local): unknown dtype tag (``payload.unknown_dtype``), or one that is no
            integer (the codec's integer rule: ``True`` is no tag 1, ``0.0`` no tag 0).

    Upstream: ``controller/round_frame.rs`` ``payload_element_size``.
    """
    es = ELEMENT_SIZE.get(dtype if type(dtype) is int else wire_int(dtype))  # type: ignore[arg-type]
    if es is None:
        raise protocol_error("payload.unknown_dtype", dtype=dtype)
    return es


def _check_bits_buffer(arg: str, buf: Any, count: int) -> None:
    """Refuse ``buf`` as a destination of ``count`` bf16 bit patterns unless it is a writable,
    contiguous ``uint16`` or ``ml_dtypes.bfloat16`` array of that many elements.

    Raises:
        ValueError: naming ``arg``, what it is and what it should be.
    """
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"{arg} must be a NumPy array, got {shown_type(buf)}")
    # uint16 or bf16: their elements are the bits, read back as such (a float16, int16 or
    # big-endian array would show other values)
    if buf.dtype != K.U16 and not is_bf16(buf.dtype):
        raise ValueError(f"{arg} must hold bf16 bits as uint16 or ml_dtypes.bfloat16 "
                         f"(little-endian), got {buf.dtype.str} ({buf.dtype})")
    if not buf.flags.c_contiguous or buf.size != count:
        raise ValueError(f"{arg} must be a contiguous array of {count} 2-byte elements, got "
                         f"{buf.size} elements{'' if buf.flags.c_contiguous else ', strided'}")
    if not buf.flags.writeable:
        raise ValueError(f"{arg} is read-only")


def bf16_from_f32(values: npt.ArrayLike, *, out: npt.NDArray[Any] | None = None
                  ) -> npt.NDArray[np.uint16]:
    """bf16 bit patterns of f32 ``values`` (any shape; the result has the same shape).

    Args:
        values: f32 values (an array of another float dtype is first cast to f32). To convert
            raw f32 bit patterns, pass ``bits.view(np.float32)``.
        out: optional destination: a writable contiguous ``uint16`` or ``ml_dtypes.bfloat16``
            array (it may be unaligned) with as many elements as ``values``, written in full.
            Default: a fresh ``uint16`` array.

    Returns:
        ``uint16`` array: round-to-nearest-even, NaN -> ``(bits >> 16) | 0x0040`` (``out``
        viewed as ``uint16``, of ``values``' shape, when given).

    Raises:
        ValueError: ``values`` are not real numbers (complex, whose imaginary part a cast would
            drop, text, objects, dates: only bool, integer, float and ``ml_dtypes.bfloat16``
            values are converted), or ``out`` is not a NumPy array, has another dtype (a float16,
            int16 or big-endian array would show other values than the bits), is not contiguous,
            has another element count, or is read-only; nothing is written.

    Upstream: ``controller/round_frame.rs`` ``f32_to_bf16_bits``.
    """
    given = np.asarray(values)
    if given.dtype.kind not in "biuf" and not is_bf16(given.dtype):
        raise ValueError(f"values must be real numbers (f32, or a real dtype to cast to f32), "
                         f"got {given.dtype} values")
    with np.errstate(over="ignore"):  # a real beyond f32's range is +-inf, as the cast says
        src = np.ascontiguousarray(given, dtype=K.F32)
    flat = src.reshape(-1)
    if out is None:
        dst = np.empty(flat.shape[0], K.U16)
    else:
        _check_bits_buffer("out", out, flat.shape[0])
        dst = out.reshape(-1).view(K.U16)
    K.encode_sums_into(flat, dst, K.Workspace(min(flat.shape[0], K.CHUNK_ELEMS)))
    return dst.reshape(src.shape)


def scale_to_bf16(srcs: Sequence[npt.NDArray[Any]], factor: float | np.floating[Any],
                  dsts: Sequence[npt.NDArray[Any]]) -> None:
    """Pre-scale tensors into bf16 payloads in one pass: ``dsts[i]`` receives the bf16 bits of
    ``f32(srcs[i]) * f32(factor)``, computed in f32 and rounded once with upstream's rule
    (round-to-nearest-even, NaN -> ``(bits >> 16) | 0x0040``): the bytes
    :func:`scale_payload` (bf16 sources) or an f32 multiply then :func:`bf16_from_f32` (f32
    sources) give tensor by tensor.

    Every source is widened (bf16) or gathered (f32) into one f32 run, multiplied once, scanned
    for NaN once, rounded into one bf16 run in one cast, and that run copied out tensor by
    tensor into the destinations: a handful of NumPy calls per frame instead of about ten per
    tensor, for one more copy of the bf16 bytes. Meant for small frames (the runs are fresh
    arrays of every element).

    Args:
        srcs: flat contiguous arrays, all ``<f4`` (f32 values) or all ``<u2`` (bf16 bits).
        factor: the scale, a real number by :func:`scale_payload`'s rule (an int or a
            ``Fraction`` beyond the f64 range is an infinity of its sign); converted to f32
            first.
        dsts: per source a flat, contiguous, writable ``uint16`` or ``ml_dtypes.bfloat16``
            array (it may be unaligned) of the same length, written in full.

    Raises:
        ValueError: the sources mix dtypes or are neither ``<f4`` nor ``<u2``, a source or
            destination is not a NumPy array, a destination does not match its source or is
            read-only, or ``factor`` is not a real number (None is not NaN) or is a nonzero
            ``Fraction`` whose f64 is a zero; all checked before anything is written.

    Upstream: ``controller/round_frame.rs`` ``scale_payload_bytes`` (bf16 arm) and
    ``f32_to_bf16_bits``: the rank-side realized-work pre-scale.
    """
    if len(srcs) != len(dsts):
        raise ValueError(f"{len(srcs)} sources for {len(dsts)} destinations")
    if type(factor) is not float:
        # a bool is taken as 0 or 1, as it was; anything else by the real-number rule
        real = float(factor) if isinstance(factor, bool) else wire_real(factor)
        if real is None:
            raise ValueError(f"factor must be a real number, got {shown(factor)}")
        if math.isinf(real):  # an int or a Fraction beyond the f64 range: np.float32() raised
            factor = real
        elif real == 0.0 and (tiny := underflow_reason(factor, real)) is not None:
            raise ValueError(f"factor = {shown(factor)} is invalid: {tiny}")
    for i, s in enumerate(srcs):
        if not isinstance(s, np.ndarray):
            raise ValueError(f"srcs[{i}] must be a NumPy array, got {shown_type(s)}")
    dtypes = {s.dtype for s in srcs}
    if len(dtypes) > 1 or not dtypes <= {K.F32, K.U16}:
        raise ValueError(f"sources must be all <f4 or all <u2, got {sorted(map(str, dtypes))}")
    for i, (s, d) in enumerate(zip(srcs, dsts, strict=True)):
        if s.ndim != 1 or not s.flags.c_contiguous or getattr(d, "ndim", 1) != 1:
            raise ValueError("each source and destination must be flat, contiguous and of one "
                             "length, the destination of 2-byte elements")
        _check_bits_buffer(f"dsts[{i}]", d, s.shape[0])
    total = sum(s.shape[0] for s in srcs)
    if total == 0:
        return
    wide = np.empty(total, K.F32)
    with np.errstate(all="ignore"):
        _scale_run(srcs, K.U16 in dtypes, np.float32(factor), wide, np.empty(total, K.U16),
                   [d.view(K.U16) for d in dsts], 0)


def _scale_run(srcs: Sequence[npt.NDArray[Any]], bits: bool, factor: np.float32,
               wide: npt.NDArray[np.float32], run: npt.NDArray[np.uint16],
               dsts: Sequence[npt.NDArray[np.uint16]], axis: int | None) -> None:
    """The pass of :func:`scale_to_bf16`, nothing checked: ``srcs`` (all bf16 bits ``<u2``
    when ``bits``, else ``<f4`` or ``ml_dtypes.bfloat16`` values, which the gather widens
    exactly, NaN payloads included) gathered in order into ``wide`` (f32, one element per
    source element, at least one; ``axis`` as :func:`numpy.concatenate` takes it: 0 for flat
    sources, None to read any shapes in C order), widened, multiplied by ``factor``, rounded
    into ``run`` (``<u2``, as long) in one cast, its NaN lanes re-encoded, and ``run`` copied
    out, tensor by tensor, into the flat ``<u2`` ``dsts``. Call it with NumPy's float warnings
    off."""
    if bits:  # the exact widening of every tensor: bits << 16
        u = wide.view(np.uint32)
        np.concatenate(srcs, out=u, axis=axis)
        np.left_shift(u, _SIXTEEN, out=u)
    else:
        np.concatenate(srcs, out=wide, axis=axis)
    np.multiply(wide, factor, out=wide)
    low = np.minimum.reduce(wide)  # NaN when any lane is NaN
    K.encode_bf16_small(wide, run, bool(low != low))
    at = 0
    for d in dsts:
        n = d.shape[0]
        d[...] = run[at:at + n]
        at += n


#: the shift of a bf16 bit pattern into its f32's top half
_SIXTEEN = np.uint32(16)


class Bf16Scaler:
    """:func:`scale_to_bf16` for one list of destinations, checked once and kept with the runs
    it needs: for a sender that pre-scales tensors of one layout into the same places round
    after round (a rank's :class:`~flodl_proto.codec.template.FrameTemplate`).

    Args:
        dsts: per tensor a contiguous, writable ``uint16`` or ``ml_dtypes.bfloat16`` array (any
            shape; it may be unaligned), written in full by each :meth:`run`.

    Attributes:
        shapes: the shape of each destination, in order: what :meth:`run` takes.

    Raises:
        ValueError: a destination is not a NumPy array, has another dtype, is not contiguous or
            is read-only (as :func:`scale_to_bf16` says it).

    Upstream: as :func:`scale_to_bf16`.
    """

    __slots__ = ("_axis", "_dsts", "_run", "_wide", "shapes")

    def __init__(self, dsts: Sequence[npt.NDArray[Any]]) -> None:
        flat = []
        for i, d in enumerate(dsts):
            _check_bits_buffer(f"dsts[{i}]", d, getattr(d, "size", 0))
            flat.append(d.reshape(-1).view(K.U16))
        self.shapes = tuple(d.shape for d in dsts)
        total = sum(d.shape[0] for d in flat)
        self._wide = np.empty(total, K.F32)
        self._run = np.empty(total, K.U16)
        self._dsts = tuple(flat)
        #: flat sources are gathered along their one axis (cheaper than flattening each)
        self._axis = 0 if all(len(shape) == 1 for shape in self.shapes) else None

    def run(self, srcs: Sequence[npt.NDArray[Any]], factor: np.float32, bits: bool) -> None:
        """Write the bf16 bits of ``f32(srcs[i]) * factor`` into destination ``i``: the bytes
        :func:`scale_to_bf16` gives for the same sources flattened.

        Nothing is checked here (the caller checked its arrays once): ``srcs`` holds one array
        per destination, of its shape in :attr:`shapes` (any strides): with ``bits`` all
        ``<u2`` bf16 bit patterns, else ``<f4`` or ``ml_dtypes.bfloat16`` values in any mix
        (bf16 values are widened exactly; bit patterns are cheaper); ``factor`` is an
        ``np.float32``. Call it with NumPy's float warnings off (``np.errstate(all="ignore")``).
        """
        if self._wide.shape[0]:
            _scale_run(srcs, bits, factor, self._wide, self._run, self._dsts, self._axis)


def bf16_to_f32(bits: npt.ArrayLike, *, out: npt.NDArray[Any] | None = None
                ) -> npt.NDArray[np.float32]:
    """Exact f32 values of bf16 bit patterns ``bits`` (``uint16``, any shape).

    Args:
        bits: the bf16 bit patterns: integers in ``0..0xFFFF`` (an ``ml_dtypes.bfloat16``
            array is read as its bits).
        out: optional destination: a writable contiguous ``float32`` array (it may be
            unaligned) with as many elements as ``bits``, written in full. Default: a fresh
            array.

    Returns:
        The f32 values, of ``bits``' shape (``out`` reshaped, when given).

    Raises:
        ValueError: ``bits`` holds floats (values, not bit patterns; cast them with
            :func:`bf16_from_f32`) or integers outside ``0..0xFFFF``; ``out`` is not a
            writable contiguous ``float32`` array of the same element count.

    Upstream: ``controller/round_frame.rs`` ``bf16_bits_to_f32``.
    """
    arr = bits if isinstance(bits, np.ndarray) else np.asarray(bits)
    if is_bf16(arr.dtype):
        arr = arr.view(K.U16)
    elif arr.dtype != K.U16:
        if arr.dtype.kind not in "biu":
            raise ValueError(f"bits must be bf16 bit patterns (uint16), got {arr.dtype} values")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFF):
            raise ValueError("bits must be bf16 bit patterns in 0..0xFFFF, got "
                             f"{int(arr.min())}..{int(arr.max())}")
    src = np.ascontiguousarray(arr, dtype=K.U16)
    if out is None:
        dst = np.empty(src.shape, K.F32)
    else:
        if (not isinstance(out, np.ndarray) or out.dtype != K.F32 or not out.flags.c_contiguous
                or out.size != src.size):
            raise ValueError(f"out must be a contiguous float32 array of {src.size} elements")
        if not out.flags.writeable:
            raise ValueError("out is read-only")
        dst = out.reshape(src.shape)
    K.widen_bf16(src.reshape(-1), dst.reshape(-1))
    return dst


def _bit_pattern(bits: Any, maximum: int, width: str) -> int:
    """``bits`` as an ``int`` bit pattern in 0..``maximum`` by the codec's integer rule.

    Raises:
        InvalidValue (local): ``frame.bad_field`` naming ``bits`` and the value.
    """
    n = wire_int(bits)
    if n is None or not 0 <= n <= maximum:
        raise protocol_error("frame.bad_field", field="bits", value=bits,
                             reason=f"not a {width} bit pattern (an integer in 0..{maximum:#x})")
    return n


def f32_bits_to_bf16_bits(bits: int) -> int:
    """bf16 bit pattern (0..0xFFFF) of one f32 given as its bit pattern (0..0xFFFFFFFF).

    Raises:
        InvalidValue (local) ``frame.bad_field``: ``bits`` is not an integer in 0..0xFFFFFFFF
            (the codec's integer rule: a bool, a float or text is refused, never truncated;
            NumPy integers are taken).

    Upstream: ``controller/round_frame.rs`` ``f32_to_bf16_bits``.
    """
    arr = np.array([_bit_pattern(bits, U32_MAX, "u32")], dtype=np.uint32).view(np.float32)
    return int(bf16_from_f32(arr)[0])


def bf16_bits_to_f32_bits(bits: int) -> int:
    """f32 bit pattern (0..0xFFFFFFFF) of one bf16 bit pattern (0..0xFFFF): ``bits << 16``.

    Raises:
        InvalidValue (local) ``frame.bad_field``: ``bits`` is not an integer in 0..0xFFFF
            (the codec's integer rule, as :func:`f32_bits_to_bf16_bits`).

    Upstream: ``controller/round_frame.rs`` ``bf16_bits_to_f32``.
    """
    n = _bit_pattern(bits, 0xFFFF, "u16")
    return int(bf16_to_f32(np.array([n], dtype=np.uint16)).view(np.uint32)[0])


def encode_payload(dtype: int, values: npt.ArrayLike) -> bytes:
    """Payload bytes of f32 ``values`` in wire dtype ``dtype``.

    Args:
        dtype: 0 (f32: the values' little-endian bytes, bit for bit) or 1 (bf16: rounded as
            :func:`bf16_from_f32`).
        values: f32 values, any shape (flattened in C order); other real values are cast to
            f32 (beyond its range: an infinity of the sign, a Python ``int`` beyond f64's too).

    Returns:
        ``numel * element_size`` bytes.

    Raises:
        InvalidValue (local): unknown ``dtype`` (``payload.unknown_dtype``), checked first;
            ``values`` that are not real numbers (text, complex, objects, ``None``, dates:
            ``frame.bad_field`` naming the array dtype), or nested sequences of ragged rows
            (``frame.bad_field`` naming ``array``, its type and NumPy's reason).

    Upstream: ``controller/round_frame.rs`` ``f32_slice_to_payload_bytes``.
    """
    payload_element_size(dtype)
    given = as_array(values)
    if given.dtype.kind == "O":  # Python ints beyond int64, or what is no number (None, text)
        flat = [wire_real(v) for v in given.reshape(-1)]  # an int beyond f64: an infinity
        if any(v is None for v in flat):
            real_array(given)  # raises, naming the dtype (None was cast to NaN)
        with np.errstate(over="ignore"):  # beyond f32: an infinity, as every cast to f32
            src = np.array(flat, dtype=np.float64).astype(K.F32)
    else:
        real_array(given)
        src = np.ascontiguousarray(given, dtype=K.F32).reshape(-1)
    if dtype == DTYPE_F32:
        return src.tobytes()
    return bf16_from_f32(src).tobytes()


def _typed_view(dtype: int, data: BytesLike, n: int) -> npt.NDArray[Any]:
    mv = as_view(data)
    return np.frombuffer(mv, dtype=K.F32 if dtype == DTYPE_F32 else K.U16, count=n)


def decode_payload(dtype: int, data: BytesLike) -> npt.NDArray[np.float32]:
    """Decode payload bytes to a flat f32 array (exact for both dtypes).

    Raises:
        InvalidValue (local): unknown ``dtype`` (``payload.unknown_dtype``).
        SchemaMismatch (local): the byte count is not a whole number of elements
            (``payload.bad_length``).

    Upstream: ``controller/round_frame.rs`` ``payload_to_f32`` (sized from the bytes here; the
    fold checks bytes against the shape before decoding).
    """
    es = payload_element_size(dtype)
    nbytes = as_view(data).nbytes
    if nbytes % es:
        raise protocol_error("payload.bad_length", got=nbytes, element_size=es)
    view = _typed_view(dtype, data, nbytes // es)
    if dtype == DTYPE_F32:
        return view.astype(K.F32)
    return bf16_to_f32(view)


def scale_payload(dtype: int, data: BytesLike, factor: float | np.floating[Any], *,
                  out: npt.NDArray[np.uint8] | None = None) -> memoryview:
    """Multiply every element of a payload by ``factor``: decode to f32, multiply in f32, re-encode.

    Args:
        dtype: wire dtype tag (0 f32, 1 bf16).
        data: the payload bytes (little-endian elements); not modified.
        factor: the scale, a real number (``int``, ``float`` or a NumPy integer or floating
            scalar; not a bool or text); converted to f32 first (round-to-nearest-even; a factor
            beyond the f32 range becomes an infinity of its sign), the product is computed in f32
            and re-encoded once (one rounding for bf16). A NaN factor is multiplied as any
            other: every whole element becomes NaN (f32: NaN times x; bf16: that NaN encoded
            with upstream's NaN rule), as upstream's f32 multiply gives.
        out: optional destination: a flat ``uint8`` array of at least ``len(data)`` bytes whose
            first ``len(data)`` bytes receive the result (all of them written; it must not
            overlap ``data``). Default: a fresh buffer.

    Returns:
        The scaled payload, same length, as a flat unsigned-byte memoryview over a fresh buffer
        (or over ``out``; one pass, no further copy). As upstream, trailing bytes that do not
        make a whole element are left as they were.

    Raises:
        InvalidValue (local): unknown ``dtype`` (``scale.unknown_dtype``); ``factor`` is not a
            real number, or is a nonzero ``Fraction`` whose f64 is a zero (``Fraction(1,
            10**400)``: ``frame.bad_field`` naming ``factor`` and the value).
        ValueError: ``out`` is not a flat ``uint8`` array of at least ``len(data)`` bytes.

    Upstream: ``controller/round_frame.rs`` ``scale_payload_bytes`` (also the rank-side
    realized-work pre-scale, bit-identical to libtorch ``mul_scalar``).
    """
    if (dtype if type(dtype) is int else wire_int(dtype)) not in (DTYPE_F32, DTYPE_BF16):
        raise protocol_error("scale.unknown_dtype", dtype=dtype)  # True is no tag 1
    if type(factor) is not float:
        real = wire_real(factor)
        if real is None:
            raise protocol_error("frame.bad_field", field="factor", value=factor,
                                 reason="not a real number")
        if math.isinf(real):  # an int beyond the f64 range (np.float32() of it raised)
            factor = real
        elif real == 0.0 and (tiny := underflow_reason(factor, real)) is not None:
            raise protocol_error("frame.bad_field", field="factor", value=factor, reason=tiny)
    es = ELEMENT_SIZE[dtype]
    mv = as_view(data)
    n = mv.nbytes // es
    whole = n * es
    if out is None:
        out = np.empty(mv.nbytes, np.uint8)
    else:
        if out.dtype != np.uint8 or out.ndim != 1 or out.shape[0] < mv.nbytes:
            raise ValueError(f"out must be a flat uint8 array of >= {mv.nbytes} bytes")
        out = out[:mv.nbytes]
    if whole < mv.nbytes:
        out[whole:] = np.frombuffer(mv[whole:], np.uint8)
    src = _typed_view(dtype, mv, n)
    with np.errstate(all="ignore"):
        f = np.float32(factor)
        if dtype == DTYPE_F32:
            np.multiply(src, f, out=out[:whole].view(K.F32))
        else:
            K.scale_bf16(src, out[:whole].view(K.U16), f)
    return out.data

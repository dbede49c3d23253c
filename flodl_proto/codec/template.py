"""FrameTemplate: the wire image of one RoundFrame layout, reused round after round.

A sender whose frames keep their layout (kind, and every tensor's dtype and shape) writes each
round's payloads straight into the image and seals it with the round's weight, instead of
building frame and payload objects every round. The metadata are written by
:func:`~flodl_proto.codec.round_frame.round_frame_pieces` and the payload offsets found by the
frame reader's walk, so no layout rule is written here a second time.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` ``write_round_frame_streamed``
(the same bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ProtocolError, protocol_error, shown_type
from ..spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    DTYPE_F32,
    ELEMENT_SIZE,
    MAX_ROUND_FRAME_TENSORS,
    ROUND_FRAME_HEADER_LEN,
    U32_MAX,
)
from ._arrays import no_number
from ._common import BytesLike, as_view, check_ceiling, wire_int
from ._frame_model import _SHAPE_LOOKED_AT, _dims_at_most, _no_shape
from ._walk import _FrameWalk
from .auth import check_salt, new_mac
from .round_frame import (
    _NUMPY_DTYPE,
    _NUMPY_MAX_NDIM,
    _WEIGHT,
    RoundFrame,
    RoundKind,
    TensorPayload,
    _checked_weight,
    _numel,
    round_frame_pieces,
)

__all__ = ["FrameTemplate"]

_INF = math.inf
_PACK_WEIGHT = _WEIGHT.pack_into
#: the payload views' dtypes: f32 values, bf16 bit patterns (little-endian, as on the wire)
_F32 = np.dtype("<f4")
_U16 = np.dtype("<u2")


class FrameTemplate:
    """A reusable wire image of the RoundFrames of one layout: ``lead`` bytes, the frame, its
    8-byte tag, in one writable buffer.

    A sender whose frames keep their layout round after round (kind, and every tensor's dtype
    and shape) writes each round's payloads straight into :attr:`payloads`, then calls
    :meth:`seal` with the round's weight: the weight is written, the tag computed over the frame
    and written, and the whole record is returned as one buffer to send. No per-round frame or
    payload objects are built. The bytes are those of ``lead`` followed by
    :func:`encode_round_frame` of the equal :class:`RoundFrame` (the metadata are written once,
    by :func:`round_frame_pieces`, and the payload offsets are found by the frame reader's own
    walk).

    Attributes:
        kind: the frames' :class:`RoundKind`.
        layout: ``((dtype, shape), ...)`` per tensor (dtype tags 0 f32 / 1 bf16).
        wire_len: the frame's length in bytes, tag included (``lead`` excluded).
        payloads: per tensor a writable NumPy view of its payload bytes in the buffer, of the
            tensor's shape, ``<f4`` for f32 and ``ml_dtypes.bfloat16`` for bf16 (may be
            unaligned; ml_dtypes is imported when a bf16 template's views are first asked for).
            Empty tensors have zero-size views.
        bits: the same views with bf16 payloads as their ``<u2`` bit patterns (f32 ones as
            ``<f4``): a bf16 template filled through them never imports ml_dtypes.

    Args:
        kind: the round kind.
        layout: ``(dtype, shape)`` per tensor; only f32 and bf16 (payloads are written as
            values).
        lead: bytes sent before the frame in the same record (a loopback length prefix); it
            must not depend on the weight or the payloads.

        ceiling: the most payload bytes the template may hold (the frame reader's running total
            of ``nbytes``; default 1 GiB, the default frame ceiling), checked before anything is
            allocated.

    Raises:
        InvalidValue (local): a bad kind (``frame.bad_field``; as a RoundFrame's: a bool is
            none), a bad ``ceiling``
            (``ceiling.invalid``), a ``layout`` that is no sequence (``frame.bad_type`` naming
            its type), a layout entry that is not a ``(dtype tag, shape of ints)``
            pair (``frame.bad_field`` naming ``layout[i]``; a bool or float dtype or dim is
            refused, never truncated), a shape that is text (NumPy text too), bytes-like (whose
            bytes would be the dims: ``b"\\x02"`` is no ``(2,)``), a set or a dict (refused
            as :class:`TensorPayload` refuses it, ``frame.bad_type`` or ``frame.bad_field``
            naming ``layout[i] shape``), a dtype or dim that is no
            number (text, bytes, None: ``frame.bad_type`` naming ``layout[i] dtype`` or
            ``layout[i] shape[k]`` and its type), a dtype
            other than f32 / bf16 (``frame.bad_field``), more than 64 dims (NumPy's limit,
            ``tensor.ndim_unsupported``, found before a dim is converted, as
            :class:`TensorPayload` finds more than 255), a dim outside ``0..2**32-1``
            (``frame.dim_too_large``), a ``lead`` that is not bytes-like (``codec.not_bytes_like``).
        LimitExceeded (local): more than 65,536 tensors (``frame.too_many_tensors_local``),
            payloads over ``ceiling`` (``template.too_large``), a zero-element shape whose other
            dims overflow NumPy's index (``tensor.shape_unrepresentable_local``).
        All but the last are found before the image is allocated.

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed`` (the same bytes).
    """

    __slots__ = ("_buf", "_covered", "_payloads", "_tag", "_weight_at", "_whole", "bits",
                 "kind", "layout", "wire_len")

    def __init__(self, kind: RoundKind | int, layout: Sequence[tuple[int, tuple[int, ...]]],
                 lead: BytesLike = b"", *, ceiling: int = DEFAULT_FRAME_CEILING) -> None:
        kind_e = RoundFrame(kind, 0.0).kind  # a bad kind: refused before anything is built
        specs = _template_layout(layout, check_ceiling(ceiling))
        head = as_view(lead, "lead").tobytes()
        tensors = []
        for d, shape in specs:
            zeros = memoryview(bytes(_numel(shape) * ELEMENT_SIZE[d]))
            tensors.append(TensorPayload.trusted(d, shape, zeros))
        frame = RoundFrame.trusted(kind_e, 0.0, tuple(tensors))
        body = b"".join(bytes(p) for p in round_frame_pieces(frame))
        buf = np.zeros(len(head) + len(body) + AUTH_TAG_LEN, np.uint8)
        buf[:len(head)] = np.frombuffer(head, np.uint8)
        buf[len(head):len(head) + len(body)] = np.frombuffer(body, np.uint8)
        walk = _FrameWalk(len(body))  # the reader finds the payloads (its ceiling: the body)
        walk.advance(buf.data[len(head):], partial=False)
        payloads = []
        for d, dims, at, nbytes in walk.entries:
            start = len(head) + at
            view = buf[start:start + nbytes].view(_F32 if d == DTYPE_F32 else _U16)
            try:
                payloads.append(view.reshape(dims) if len(dims) != 1 else view)
            except ValueError:  # a zero-element shape whose other dims overflow NumPy's index
                raise protocol_error("tensor.shape_unrepresentable_local", where="FrameTemplate",
                                     shape=list(dims)) from None
        self._buf = buf
        # the views :meth:`seal` writes and hashes, taken once: the whole record, the bytes the
        # tag covers (the frame up to its tag), the tag's place; and the weight's offset
        mv = buf.data
        self._whole = mv
        self._covered = mv[len(head):len(head) + len(body)]
        self._tag = mv[len(head) + len(body):]
        self._weight_at = len(head) + ROUND_FRAME_HEADER_LEN + 1
        self.kind = frame.kind
        self.layout = specs
        self.wire_len = len(body) + AUTH_TAG_LEN
        self.bits = tuple(payloads)
        self._payloads: tuple[npt.NDArray[Any], ...] | None = None

    @property
    def payloads(self) -> tuple[npt.NDArray[Any], ...]:
        """Per tensor a writable view of its payload, ``<f4`` for f32 and
        ``ml_dtypes.bfloat16`` for bf16 (:attr:`bits` viewed as values; the first call on a
        bf16 template imports ml_dtypes). Raises nothing but ml_dtypes' own ImportError."""
        if self._payloads is None:
            self._payloads = tuple(b if d == DTYPE_F32 else b.view(_NUMPY_DTYPE[d])
                                   for (d, _), b in zip(self.layout, self.bits, strict=True))
        return self._payloads

    def seal(self, weight: float, salt: BytesLike) -> memoryview:
        """Write ``weight`` and the tag; return the whole record (lead, frame, tag).

        The returned view is of the template's buffer: it is valid until the next write into
        :attr:`payloads` or the next :meth:`seal`.

        Args:
            weight: the frame's realized-work mass (f64), finite and not below zero.
            salt: the 16-byte session salt.

        Raises:
            InvalidValue (local): a bad weight (``frame.bad_field``) or salt.
        """
        key = check_salt(salt)
        # a float in range is what the weight check returns it as (``-0.0`` included); any
        # other value (NaN, an infinity, below zero, not a float) gets the check and its error
        w = weight if type(weight) is float and 0.0 <= weight < _INF else _checked_weight(weight)
        mv = self._whole
        _PACK_WEIGHT(mv, self._weight_at, w)
        mac = new_mac(key)
        mac.update(self._covered)
        self._tag[:] = mac.digest()[:AUTH_TAG_LEN]
        return mv


def _template_layout(layout: Iterable[Any], ceiling: int
                     ) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """A :class:`FrameTemplate`'s layout checked before its image is allocated: per tensor an
    integer dtype tag of f32 or bf16 and a shape of at most 64 integer dims in u32, at most
    65,536 tensors, their payloads within ``ceiling`` bytes. Errors: as the class's."""
    try:
        entries = list(layout)
    except TypeError:
        raise protocol_error("frame.bad_type", field="layout",
                             expected="a sequence of (dtype tag, shape) pairs",
                             got=shown_type(layout)) from None
    if len(entries) > MAX_ROUND_FRAME_TENSORS:
        raise protocol_error("frame.too_many_tensors_local", count=len(entries),
                             cap=MAX_ROUND_FRAME_TENSORS)
    specs = []
    total = 0
    for i, entry in enumerate(entries):
        try:
            d, shape = entry
        except (TypeError, ValueError):
            raise _not_a_pair(i, entry) from None
        if type(shape) is not tuple and isinstance(shape, _SHAPE_LOOKED_AT):
            refused = _no_shape(shape, f"layout[{i}] shape")  # as a TensorPayload refuses it
            if refused is not None:
                raise refused
        try:
            given, ndim = _dims_at_most(shape, _NUMPY_MAX_NDIM)
        except (TypeError, ValueError):
            raise _not_a_pair(i, entry) from None
        # the codec's one integer rule (wire_int: no bool, no float); a dtype or dim that is
        # no number at all (text, bytes, None) is the wrong type of argument
        dtype = _layout_int(d, i, entry, "dtype", "a wire dtype tag (0 f32 or 1 bf16)")
        if given is None:  # refused before its dims are held or converted
            raise protocol_error("tensor.ndim_unsupported", where="FrameTemplate",
                                 ndim=ndim, max=_NUMPY_MAX_NDIM)
        dims_list = [_layout_int(g, i, entry, f"shape[{k}]", "a dim (an integer 0..2**32-1)")
                     for k, g in enumerate(given)]
        dims = tuple(dims_list)
        if dtype not in _NUMPY_DTYPE:
            raise protocol_error("frame.bad_field", field="dtype", value=dtype,
                                 reason="a template carries f32 (0) or bf16 (1) payloads")
        for k, n in enumerate(dims):
            if not 0 <= n <= U32_MAX:
                raise protocol_error("frame.dim_too_large", index=i, dim=k, value=n)
        total += _numel(dims) * ELEMENT_SIZE[dtype]
        if total > ceiling:
            raise protocol_error("template.too_large", index=i, total=total, ceiling=ceiling)
        specs.append((dtype, dims))
    return tuple(specs)


def _layout_int(value: Any, i: int, entry: Any, part: str, expected: str) -> int:
    """The integer ``value`` of layout entry ``i`` (its dtype tag or a dim, ``part``) by the
    codec's one integer rule (``wire_int``: no bool, no float). Raises ``frame.bad_type``
    naming ``layout[i] part`` for a value that is no number at all (text, bytes, None), else
    :func:`_not_a_pair`'s error."""
    n = wire_int(value)
    if n is None:
        if no_number(value):
            raise protocol_error("frame.bad_type", field=f"layout[{i}] {part}",
                                 expected=expected, got=shown_type(value))
        raise _not_a_pair(i, entry)
    return n


def _not_a_pair(i: int, entry: Any) -> ProtocolError:
    """The error for layout entry ``i`` that is no ``(dtype tag, shape of ints)`` pair (or holds
    a bool or a float where an integer goes): ``frame.bad_field`` naming ``layout[i]`` and it."""
    return protocol_error("frame.bad_field", field=f"layout[{i}]", value=entry,
                          reason="not a (dtype tag, shape of ints) pair")

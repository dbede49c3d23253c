"""RoundFrame and TensorPayload as values: the round kinds, the wire dtype tags, a tensor's
payload (a view of its bytes, its NumPy view when the dtype and byte count allow one) and a
frame's kind, weight and tensors, with the checks their constructors make and the frame's exact
wire length. Every name is re-exported by :mod:`flodl_proto.codec.round_frame`, the module to
import them from (it holds the frame's encoder and reader).

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``RoundFrame``, ``TensorPayload``,
``RoundKind``, ``payload_element_size``, ``round_frame_wire_len``).
"""

from __future__ import annotations

import enum
import itertools
import math
import numbers
import struct as _struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .._bf16 import bf16
from ..errors import ProtocolError, protocol_error, shown_type
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DTYPE_BF16,
    DTYPE_F32,
    ELEMENT_SIZE,
    MAX_NDIM,
    MAX_ROUND_FRAME_TENSORS,
    ROUND_FRAME_FIXED_OVERHEAD,
    ROUND_KIND_CONTROL,
    ROUND_KIND_MODEL,
    U32_MAX,
)
from ._arrays import integer_error, real_array, wire_dtype_tag, wire_elements
from ._common import (
    ENCODE_FIRST,
    BytesLike,
    as_view,
    numpy_text,
    numpy_text_named,
    short_items,
    underflow_reason,
    wire_int,
    wire_real,
)
from .ceiling import frame_ceiling_int

__all__: list[str] = []

_NUMPY_MAX_NDIM = 64  # NumPy 2 arrays carry at most 64 dimensions
_F32_LE = np.dtype("<f4")


class RoundKind(enum.IntEnum):
    """RoundFrame kind byte: ``MODEL`` (divided once by the summed weight) or ``CONTROL``
    (pure sum). Upstream: ``controller/round_frame.rs`` ``RoundKind``."""

    MODEL = ROUND_KIND_MODEL
    CONTROL = ROUND_KIND_CONTROL

    @property
    def label(self) -> str:
        """Upstream's Debug spelling (``Model`` / ``Control``), used in error messages."""
        return self.name.capitalize()


class Dtype(enum.IntEnum):
    """Known wire dtype tags: ``F32`` (4 bytes/element) and ``BF16`` (2 bytes/element).
    A :class:`TensorPayload` may carry any byte; only these two can be summed or viewed.

    Upstream: ``controller/round_frame.rs`` ``payload_element_size`` (the dtype tags).
    """

    F32 = DTYPE_F32
    BF16 = DTYPE_BF16

    @property
    def element_size(self) -> int:
        """Bytes per element."""
        return ELEMENT_SIZE[int(self)]

    @property
    def numpy(self) -> np.dtype[Any]:
        """The NumPy dtype of the element bytes (``<f4`` or ``ml_dtypes.bfloat16``)."""
        return _F32_LE if self is Dtype.F32 else bf16()


#: a known wire dtype tag -> its name in a payload's repr (``f32``, ``bf16``)
_DTYPE_NAME: Final = {int(d): d.name.lower() for d in Dtype}

#: the trusted constructors' building block, bound once (a frozen dataclass's fields are set
#: through its slots' descriptors, ``_set_dtype`` .. ``_set_tensors`` below)
_new = object.__new__

class _NumpyDtypes(Mapping[int, "np.dtype[Any]"]):
    """The NumPy dtype of each viewable wire dtype tag (:attr:`Dtype.numpy`), keyed by the tag
    as a dict of the two would be; bf16's dtype is loaded when first asked for
    (:mod:`flodl_proto._bf16`), not when a key is looked up."""

    __slots__ = ()

    def __getitem__(self, tag: int) -> np.dtype[Any]:
        if tag == DTYPE_F32:
            return _F32_LE
        if tag == DTYPE_BF16:
            return bf16()
        raise KeyError(tag)

    def __contains__(self, tag: object) -> bool:
        return tag in _VIEWABLE_TAGS

    def __iter__(self) -> Iterator[int]:
        return iter(_VIEWABLE_TAGS)

    def __len__(self) -> int:
        return len(_VIEWABLE_TAGS)


_VIEWABLE_TAGS: Final = (DTYPE_F32, DTYPE_BF16)
_NUMPY_DTYPE: Final = _NumpyDtypes()


#: iterables the payload's constructor refuses as a shape: text, bytes-like objects (whose
#: items are characters, or bytes that would be taken as the dims), and sets and dicts (no
#: order: {3, 2} would be the shape (2, 3), a dict's keys its dims)
_NO_SHAPE: Final = (str, bytes, bytearray, memoryview, set, frozenset, dict)
#: of those, the ones with no order of items
_UNORDERED: Final = (set, frozenset, dict)
#: what a shape is looked at as before it is iterated (:func:`_no_shape`): those, and NumPy
#: arrays and scalars (NumPy text is refused, a numeric array is a shape)
_SHAPE_LOOKED_AT: Final = (*_NO_SHAPE, np.ndarray, np.generic)


def _no_shape(shape: Any, field: str) -> ProtocolError | None:
    """The local error for a ``shape`` that iterates but is no sequence of dims, named as
    ``field``, or None when it may be one (``shape`` is an instance of
    :data:`_SHAPE_LOOKED_AT`, looked at once per call before it is iterated).

    Text (NumPy text too, a ``str_`` or an array of dtype kind ``U``, named with its dtype:
    its characters are no dims, an empty one would be the shape ``()``) and a set or a dict
    (no order of dims: ``{3, 2}`` would be ``(2, 3)``) are ``frame.bad_type``; a bytes-like
    object, whose bytes would be taken as the dims (``b"\\x02"`` as ``(2,)``), is
    ``frame.bad_field`` naming its bytes. Raises nothing. Shared by :class:`TensorPayload`
    and :class:`~flodl_proto.codec.template.FrameTemplate`'s layout.

    No upstream counterpart (upstream's shapes are typed ``Vec<u32>``)."""
    if isinstance(shape, str) or numpy_text(shape):  # its characters would be taken as dims
        got = numpy_text_named(shape) if numpy_text(shape) else "str"
        return protocol_error("frame.bad_type", field=field,
                              expected="a sequence of ints (text is none)", got=got)
    if isinstance(shape, _UNORDERED):
        return protocol_error("frame.bad_type", field=field,
                              expected="a sequence of ints (a set or dict has no order)",
                              got=shown_type(shape))
    if isinstance(shape, bytes | bytearray | memoryview):
        # its bytes would be taken as the dims: b"\x02" as the shape (2,)
        return protocol_error("frame.bad_field", field=field, value=bytes(shape),
                              reason="not a sequence of ints (bytes are none: each byte "
                                     "would be taken as a dim; pass a tuple of ints)")
    return None  # a NumPy array of numbers or a NumPy scalar: iterated as any shape


def _dims_at_most(shape: Any, most: int) -> tuple[tuple[Any, ...] | None, int | str]:
    """``shape``'s items and their count when it has at most ``most`` of them, else None and
    its count: a sized shape's ``len`` (a ``range``, a list, a NumPy array), found without
    iterating it, or, for one whose length is not known (a generator, a ``range`` too long
    for ``len``), the text ``"more than {most}"``, after iterating ``most + 1`` items. A
    shape of too many dims is so refused before they are held (a tuple of every dim of
    ``range(3 * 10**7)`` took 1.2 GB before its count was compared). Shared by
    :class:`TensorPayload` (``most`` 255, :data:`MAX_NDIM`) and
    :class:`~flodl_proto.codec.template.FrameTemplate`'s layout (64).

    Raises:
        TypeError: ``shape`` does not iterate (as ``tuple(shape)`` raises it), and whatever
            its iteration raises.

    No upstream counterpart (upstream's shapes are typed ``Vec<u32>``)."""
    if type(shape) is tuple or type(shape) is list:
        return (tuple(shape), len(shape)) if len(shape) <= most else (None, len(shape))
    try:
        count: int | None = len(shape)
    except (TypeError, OverflowError):  # no length, or one past sys.maxsize
        count = None
    if count is not None and count > most:
        return None, count
    items = tuple(itertools.islice(shape, most + 1))
    if len(items) > most:
        return None, f"more than {most}"
    return items, len(items)


#: what a dim is, for the error naming a dim that is no number
_DIM_EXPECTED: Final = "a dim (an integer 0..2**32-1)"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True, slots=True, eq=False)
class TensorPayload:
    """One tensor of a RoundFrame: wire dtype tag, shape and the raw payload bytes.

    Attributes:
        dtype: wire dtype tag, 0..255 (0 = f32, 1 = bf16; any other byte round-trips but cannot be
            viewed or summed).
        shape: dimensions, each 0..2**32-1, at most 255 of them.
        data: the raw payload as a flat unsigned-byte memoryview (element bytes little-endian).
            Any byte count round-trips; ``nbytes == 0`` with ``numel > 0`` is a zero-elided
            payload (legal at protocol version 3 only; rejected by the version-2 fold).

    Raises:
        InvalidValue (local): a field is out of its wire range (``frame.bad_field``,
            ``tensor.too_many_dims``, ``tensor.dim_too_large``; a shape of more than 255 dims
            is refused before its dims are held, named by its ``len``, or ``more than 255``
            for one of no known length, a generator), ``shape`` is no sequence (a
            number, or text, NumPy text too, named with its dtype: ``frame.bad_type`` naming
            ``shape`` and its type; a bytes-like
            object, whose bytes would be taken as the dims: ``frame.bad_field`` naming
            ``shape`` and its bytes:
            ``b"\\x02"`` is refused, not taken as the shape ``(2,)``; a set or a dict, whose
            order is not the dims': ``frame.bad_type``), ``dtype`` or a dim is no number
            (text such as ``"f32"`` or ``"3"``, None, bytes: ``frame.bad_type`` naming
            ``dtype`` or ``shape[i]`` and its type), or ``dtype`` or a dim is a number that
            is not an integer (``frame.bad_field`` naming ``dtype`` or ``shape[i]`` and the
            value): a bool or a float (``2.5`` and ``2.0`` alike) is refused, never truncated
            (:func:`~flodl_proto.codec._common.wire_int`, the rule :class:`FrameTemplate` and the
            round kind share), or ``data`` is not a C-contiguous bytes-like buffer
            (``codec.not_bytes_like`` naming ``data`` and its type: text, a number, a strided
            or Fortran-ordered array), or a typed buffer of big-endian elements
            (``codec.big_endian``: a NumPy ``>f4`` array, whose bytes would go out in the
            wrong order).

    Upstream: ``controller/round_frame.rs`` ``TensorPayload``.
    """

    dtype: int
    shape: tuple[int, ...]
    data: memoryview
    #: built by the constructor (the caller's values: a dtype :meth:`array` cannot view is the
    #: caller's misuse), not by :meth:`trusted` (a reader's or a fold's, from a peer's bytes:
    #: the peer's fault); not compared, not shown
    _local: bool = field(init=False, repr=False, compare=False)

    def __init__(self, dtype: int, shape: Iterable[int], data: BytesLike = b"") -> None:
        d_tag = wire_int(dtype)
        if d_tag is None or not 0 <= d_tag <= 0xFF:  # text ("f32") is no number: a type error
            raise integer_error("dtype", dtype,
                                "a wire dtype tag (an integer 0..255: 0 f32, 1 bf16)", "not a u8")
        if type(shape) is not tuple and isinstance(shape, _SHAPE_LOOKED_AT):  # a tuple: one test
            refused = _no_shape(shape, "shape")
            if refused is not None:
                raise refused
        try:
            given, ndim = _dims_at_most(shape, MAX_NDIM)
        except TypeError:
            raise protocol_error("frame.bad_type", field="shape", expected="a sequence of ints",
                                 got=shown_type(shape)) from None
        if given is None:  # more than MAX_NDIM, refused before the dims are held
            raise protocol_error("tensor.too_many_dims", ndim=ndim, max=MAX_NDIM)
        dims = []
        for i, g in enumerate(given):
            d = wire_int(g)
            if d is None:  # a bool or float dim: refused, never truncated (2.5 is not 2);
                # text ("3"), bytes or None is no number: a type error
                raise integer_error(f"shape[{i}]", g, _DIM_EXPECTED, "not an integer")
            if not 0 <= d <= U32_MAX:
                raise protocol_error("tensor.dim_too_large", dim=i, value=d)
            dims.append(d)
        shape_t = tuple(dims)
        # text, a number, a strided, Fortran-ordered or big-endian array: refused
        view = as_view(data, "data", elements=True)
        object.__setattr__(self, "dtype", d_tag)
        object.__setattr__(self, "shape", shape_t)
        object.__setattr__(self, "data", view)
        object.__setattr__(self, "_local", True)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def trusted(cls, dtype: int, shape: tuple[int, ...], data: memoryview) -> TensorPayload:
        """A payload from fields already known to be in range, built without checking them
        again: for the frame reader and the folds, which build payloads from a checked frame's
        fields on every round.

        Args:
            dtype: 0..255. shape: a tuple of at most 255 ints, each 0..2**32-1. data: a flat
                unsigned-byte memoryview (a slice of a frame's view, or
                ``ndarray.view(np.uint8).data`` of a 1-D array).

        Returns:
            The payload, equal to ``TensorPayload(dtype, shape, data)`` for such values.
            Anything else gives a payload that breaks the class's invariants: build values of
            unknown origin with the constructor, which checks them. Its values are taken as a
            peer's: :meth:`array` refuses a dtype tag it cannot view, a byte count that does
            not match the shape, or a shape NumPy cannot represent, as the peer's fault (remote
            ``tensor.unknown_dtype``, ``tensor.nbytes_vs_shape``,
            ``tensor.shape_unrepresentable``), where a payload the constructor built gets the
            local ``tensor.unknown_dtype_local``, ``tensor.nbytes_vs_shape_local``,
            ``tensor.shape_unrepresentable_local``.
        """
        p = _new(cls)
        _set_dtype(p, dtype)
        _set_shape(p, shape)
        _set_data(p, data)
        _set_local(p, False)
        return p

    @classmethod
    def from_array(cls, array: npt.ArrayLike, dtype: int | None = None) -> TensorPayload:
        """Wrap a NumPy array's bytes (no copy when it is already contiguous little-endian).

        Args:
            array: f32 or ``ml_dtypes.bfloat16`` values (real values of another dtype are cast
                to ``dtype`` by NumPy: rounded to nearest even, integers included; a NaN cast to
                bf16 becomes the quiet NaN of its sign, where upstream's ``f32_to_bf16_bits``
                keeps its top payload bits: :func:`flodl_proto.reduce.bf16_from_f32` gives
                upstream's bits).
            dtype: wire dtype tag (``Dtype.F32`` / ``Dtype.BF16``, an integer: a bool or a
                float is refused); default: from the array's dtype, f32 for anything that is not
                bfloat16.

        Returns:
            A payload of ``array.size * element_size`` bytes with ``array.shape``.

        Raises:
            InvalidValue (local): a ``dtype`` that is no number (``frame.bad_type``: text
                such as ``"f32"``), a number that is no integer (``frame.bad_field``) or an
                unknown one (``payload.unknown_dtype``), a complex /
                non-numeric array, nested sequences of ragged rows (``[[1, 2], [3]]``:
                ``frame.bad_type`` naming ``array``, its type and NumPy's reason), or a
                finite value that the cast would make infinite (``frame.bad_field`` naming
                its flat index and the value).
        """
        arr = real_array(array)
        wire = Dtype(wire_dtype_tag(dtype, arr))
        return cls(int(wire), arr.shape, wire_elements(arr, wire.numpy, wire.name.lower()))

    @classmethod
    def elide(cls, dtype: int, shape: Iterable[int]) -> TensorPayload:
        """A zero-elided payload: no bytes, meaning all zeros of ``dtype`` and ``shape``.

        Only legal on the wire at protocol version 3 (version 2 folds reject it).

        Raises:
            InvalidValue (local): ``dtype`` or ``shape`` as the constructor refuses them
                (``frame.bad_type``, ``frame.bad_field``, ``tensor.too_many_dims``,
                ``tensor.dim_too_large``).
        """
        return cls(dtype, shape, b"")

    # -- properties ----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Payload byte count as carried on the wire."""
        return self.data.nbytes

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements (product of the shape; 1 for ndim 0)."""
        return _numel(self.shape)

    @property
    def elided(self) -> bool:
        """True when no payload bytes were carried (``nbytes == 0``, zero-numel tensors too)."""
        return self.data.nbytes == 0

    @property
    def element_size(self) -> int | None:
        """Bytes per element for a known dtype, else None."""
        return ELEMENT_SIZE.get(self.dtype)

    @property
    def expected_nbytes(self) -> int | None:
        """``numel * element_size`` for a known dtype, else None."""
        es = self.element_size
        return None if es is None else self.numel * es

    def array(self, *, materialize_elided: bool = False, ceiling: int = DEFAULT_FRAME_CEILING
              ) -> npt.NDArray[Any]:
        """Return the values as a read-only NumPy view (no copy) of ``shape``.

        f32 gives ``<f4``, bf16 gives ``ml_dtypes.bfloat16``. An elided payload with elements
        raises unless ``materialize_elided`` is set, in which case fresh zeros are returned
        (refused above ``ceiling`` bytes: a non-negative integer, as the frame readers' ceiling;
        like theirs it has no upper bound, so a ceiling above the memory available lets NumPy
        raise ``MemoryError`` for zeros that large).

        Raises:
            InvalidValue: the dtype tag is neither 0 (f32) nor 1 (bf16): local
                ``tensor.unknown_dtype_local`` (naming the tag and the two that have a view)
                for a payload the constructor built, remote ``tensor.unknown_dtype`` (upstream's
                wording) for one a reader built from a peer's bytes (:meth:`trusted`).
            InvalidValue (local): more than 64 dimensions (NumPy's limit; the wire allows 255).
            LimitExceeded: a zero-element shape whose other dimensions overflow NumPy's index
                type (legal on the wire, not representable as an array): local
                ``tensor.shape_unrepresentable_local`` (naming ``TensorPayload.array`` and the
                shape) for a payload the constructor built, remote
                ``tensor.shape_unrepresentable`` for one a reader built from a peer's bytes
                (:meth:`trusted`).
            SchemaMismatch: the byte count does not match ``numel * element_size``: local
                ``tensor.nbytes_vs_shape_local`` (naming the shape, dtype, element size, the
                expected and the given byte count) for a payload the constructor built (the
                constructor takes any byte count, so frames a fold must reject can be built),
                remote ``tensor.nbytes_vs_shape`` (upstream's wording) for one a reader built
                from a peer's bytes (:meth:`trusted`); local ``tensor.elided``: elided, and no
                ``materialize_elided``.
            LimitExceeded (local): materialising the zeros would exceed ``ceiling``.
            InvalidValue (local) ``ceiling.invalid``: ``ceiling`` is not a non-negative integer
                (a bool, a float or text is refused; NumPy integers are taken).
        """
        if type(ceiling) is not int or ceiling < 0:
            ceiling = frame_ceiling_int(ceiling)
        element_size = ELEMENT_SIZE.get(self.dtype)
        if element_size is None:
            raise protocol_error("tensor.unknown_dtype_local" if self._local
                                 else "tensor.unknown_dtype", dtype=self.dtype)
        np_dtype = _NUMPY_DTYPE[self.dtype]
        shape = self.shape
        expected = _numel(shape) * element_size
        nbytes = self.data.nbytes
        if nbytes != expected:
            if nbytes == 0 and materialize_elided:
                if len(shape) > _NUMPY_MAX_NDIM:
                    raise protocol_error("tensor.ndim_unsupported", where="TensorPayload.array",
                                         ndim=len(shape), max=_NUMPY_MAX_NDIM)
                if expected > ceiling:
                    raise protocol_error("tensor.elided_too_large", shape=list(shape),
                                         nbytes=expected, ceiling=ceiling)
                try:
                    return np.zeros(shape, dtype=np_dtype)
                except ValueError:
                    raise self._unrepresentable() from None
            if nbytes == 0:
                raise protocol_error("tensor.elided", shape=list(shape), expected=expected)
            if self._local:  # the caller's bytes, not a peer's
                raise protocol_error("tensor.nbytes_vs_shape_local", shape=list(shape),
                                     dtype=self.dtype, element_size=element_size,
                                     expected=expected, got=nbytes)
            raise protocol_error("tensor.nbytes_vs_shape", shape=list(shape), expected=expected,
                                 got=nbytes)
        if len(shape) > _NUMPY_MAX_NDIM:
            raise protocol_error("tensor.ndim_unsupported", where="TensorPayload.array",
                                 ndim=len(shape), max=_NUMPY_MAX_NDIM)
        arr = np.frombuffer(self.data, dtype=np_dtype)  # flat, of exactly numel elements
        if len(shape) != 1:
            try:
                arr = arr.reshape(shape)
            except ValueError:  # a zero-element shape whose other dims overflow NumPy's index
                raise self._unrepresentable() from None
        arr.flags.writeable = False
        return arr

    def _unrepresentable(self) -> ProtocolError:
        """The error of :meth:`array` for a shape NumPy cannot represent: local
        ``tensor.shape_unrepresentable_local`` for a payload the constructor built, remote
        ``tensor.shape_unrepresentable`` for one a reader built from a peer's bytes."""
        if self._local:
            return protocol_error("tensor.shape_unrepresentable_local",
                                  where="TensorPayload.array", shape=list(self.shape))
        return protocol_error("tensor.shape_unrepresentable", shape=list(self.shape))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorPayload):
            return NotImplemented
        return self.dtype == other.dtype and self.shape == other.shape and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """``TensorPayload(dtype=bf16, shape=(2, 3), nbytes=12)``: a known dtype by its name
        (``f32``, ``bf16``, the spec's ``Dtype`` names), any other by its tag; a shape of more
        than 8 dims by its first 3 and last 2 and its count (``shape=(2, 3, 4, ..., 1, 1)
        (255 dims)``), so that the repr stays short; never the data bytes."""
        dtype = _DTYPE_NAME.get(self.dtype, self.dtype)
        return (f"TensorPayload(dtype={dtype}, shape={short_items(self.shape, 'dims')}, "
                f"nbytes={self.nbytes})")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied with its bytes (a memoryview does not pickle): the constructor's
        arguments, ``data`` as ``bytes``. A copy is built by the constructor, so it is the
        caller's payload: :meth:`array` refuses its unknown dtype tag as the local
        ``tensor.unknown_dtype_local`` and a byte count that does not match its shape as the
        local ``tensor.nbytes_vs_shape_local``, whoever built the original."""
        return (type(self), (self.dtype, self.shape, bytes(self.data)))


#: the slot setters of a payload's fields (a slot's own descriptor: no attribute lookup by
#: name, unlike ``object.__setattr__``), for the trusted constructors
_set_dtype: Final[Any] = vars(TensorPayload)["dtype"].__set__
_set_shape: Final[Any] = vars(TensorPayload)["shape"].__set__
_set_data: Final[Any] = vars(TensorPayload)["data"].__set__
_set_local: Final[Any] = vars(TensorPayload)["_local"].__set__


def _checked_weight(weight: Any) -> float:
    """``weight`` as a float when it is a real number (the real-number rule,
    :func:`~flodl_proto.codec._common.wire_real`: not text, and ``True`` is no mass of 1.0) and
    a finite realized-work mass not below zero (``-0.0`` allowed).

    Raises:
        InvalidValue (local): ``frame.bad_field`` naming the weight (as a float; an ``int`` or
            a ``Fraction`` beyond the f64 range as itself, not as the ``inf`` it converts to);
            a nonzero ``Fraction`` whose f64 is a zero (``Fraction(1, 10**400)``), named as
            itself (:func:`~flodl_proto.codec._common.underflow_reason`).
    """
    w = wire_real(weight)
    if w is None:
        raise protocol_error("frame.bad_field", field="weight", value=weight,
                             reason="not a real number")
    if w == 0.0 and (tiny := underflow_reason(weight, w)) is not None:
        raise protocol_error("frame.bad_field", field="weight", value=weight, reason=tiny)
    if not math.isfinite(w) or w < 0.0:
        # a number past the f64 range (an int, a Fraction) as itself, not as its infinity
        shown = weight if math.isinf(w) and isinstance(weight, numbers.Rational) else w
        raise protocol_error("frame.bad_field", field="weight", value=shown,
                             reason="not a finite non-negative realized-work mass")
    return w


_ELEMENT_SIZE_OF: Final = ELEMENT_SIZE.get  # wire dtype tag -> bytes per element, or None
_prod: Final = math.prod


def _no_size(dtype: int) -> None:
    """The element size lookup of a frame built with ``check_nbytes=False``: none."""
    return None


def _payload_nbytes_error(tensors: tuple[TensorPayload, ...], t: TensorPayload, es: int
                          ) -> ProtocolError:
    """``frame.payload_nbytes_local`` for tensor ``t`` of ``tensors`` (``es``: its element
    size)."""
    index = next(i for i, u in enumerate(tensors) if u is t)
    return protocol_error("frame.payload_nbytes_local", index=index, shape=list(t.shape),
                          dtype=t.dtype, element_size=es, expected=_prod(t.shape) * es,
                          got=t.data.nbytes)


@dataclass(frozen=True, slots=True, eq=False)
class RoundFrame:
    """A reduce round's frame: kind, realized-work weight and tensors.

    Attributes:
        kind: :class:`RoundKind` (Model: pre-scaled contributions / consensus; Control: pure sum).
        weight: realized-work mass (f64), finite and not below zero (``-0.0`` allowed). From a
            rank: its weight; in a consensus: the summed weight of the accepted frames.
        tensors: the tensor payloads, at most 65,536.

    ``check_nbytes`` (keyword, default True): refuse a tensor of a known dtype (f32, bf16) whose
    payload byte count is neither ``numel * element_size`` nor 0 (a zero-elided payload: the
    frame carries no protocol version, so an elided tensor is framed at both; version 2 folds
    reject it). A length comparison per tensor, no copy. Pass False to frame payloads exactly as
    given, as upstream's writer writes them and a reader accepts them (golden vectors,
    conformance cases a fold must reject); a frame decoded from a peer is written as it came.

    Raises:
        InvalidValue (local): bad kind (``frame.bad_field``; only the integers 0 and 1 or a
            :class:`RoundKind`: ``True`` is not Control, ``1.0`` is refused) or weight;
            ``frame.bad_type`` naming ``tensors`` (no iterable: ``got None``),
            ``tensors[i]`` (no :class:`TensorPayload`) or ``check_nbytes`` (no bool) and its
            type;
            LimitExceeded (local): too many tensors.
        SchemaMismatch (local): ``frame.payload_nbytes_local`` naming the tensor's index, shape,
            dtype, the expected and the given byte count (``check_nbytes``).

    Frames compare equal by value (kind, weight bits, tensors) and, as their payloads, are not
    hashable: their payload bytes may live in a caller's writable buffer.

    Upstream: ``controller/round_frame.rs`` ``RoundFrame`` (its writer does not compare the
    byte count with the shape: departure ``payload_nbytes_on_write``).
    """

    kind: RoundKind
    weight: float
    tensors: tuple[TensorPayload, ...]

    def __init__(
        self,
        kind: RoundKind | int = RoundKind.MODEL,
        weight: float = 1.0,
        tensors: Iterable[TensorPayload] = (),
        *,
        check_nbytes: bool = True,
    ) -> None:
        kind_e = _KINDS.get(wire_int(kind))  # a bool is no kind (True is not Control), nor 1.0
        if kind_e is None:
            raise protocol_error("frame.bad_field", field="kind", value=kind,
                                 reason="not 0 (Model) or 1 (Control)") from None
        w = _checked_weight(weight)
        try:
            ts = tuple(tensors)
        except TypeError:  # None, a number: no sequence of tensors
            raise protocol_error("frame.bad_type", field="tensors",
                                 expected="an iterable of TensorPayload",
                                 got=shown_type(tensors)) from None
        if len(ts) > MAX_ROUND_FRAME_TENSORS:
            raise protocol_error("frame.too_many_tensors_local", count=len(ts),
                                 cap=MAX_ROUND_FRAME_TENSORS)
        if check_nbytes is not True and check_nbytes is not False:  # "no" was taken as true
            raise protocol_error("frame.bad_type", field="check_nbytes", expected="a bool",
                                 got=shown_type(check_nbytes))
        size_of = _ELEMENT_SIZE_OF if check_nbytes else _no_size
        for t in ts:
            if not isinstance(t, TensorPayload):
                index = next(i for i, u in enumerate(ts) if u is t)
                raise protocol_error("frame.bad_type", field=f"tensors[{index}]",
                                     expected="a TensorPayload", got=shown_type(t))
            # a length comparison: nbytes 0 (elided, or no elements) and an unknown dtype
            # (no element size) pass
            if (got := t.data.nbytes) and (es := size_of(t.dtype)) and got != _prod(t.shape) * es:
                raise _payload_nbytes_error(ts, t, es)
        object.__setattr__(self, "kind", kind_e)
        object.__setattr__(self, "weight", w)
        object.__setattr__(self, "tensors", ts)

    @classmethod
    def trusted(cls, kind: RoundKind, weight: float, tensors: tuple[TensorPayload, ...]
                ) -> RoundFrame:
        """A frame from fields already known to be valid, built without checking them again
        (the frame reader's and the folds' per-round construction): ``kind`` a
        :class:`RoundKind`, ``weight`` a finite float not below zero (``-0.0`` allowed),
        ``tensors`` a tuple of at most 65,536 :class:`TensorPayload`. Equal to
        ``RoundFrame(kind, weight, tensors)`` for such values; use the constructor for values
        of unknown origin."""
        f = _new(cls)
        _set_kind(f, kind)
        _set_weight(f, weight)
        _set_tensors(f, tensors)
        return f

    @property
    def wire_len(self) -> int:
        """Exact encoded length in bytes, tag included (``round_frame_wire_len``)."""
        return round_frame_wire_len(self.tensors)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RoundFrame):
            return NotImplemented
        return (
            self.kind == other.kind
            and _struct.pack("<d", self.weight) == _struct.pack("<d", other.weight)
            and self.tensors == other.tensors
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """``RoundFrame(kind=RoundKind.MODEL, weight=1.0, tensors=(TensorPayload(...),))``: the
        kind by its class and member name (not Python's enum repr ``<RoundKind.MODEL: 0>``),
        the weight as Python writes a float, each tensor as :class:`TensorPayload` shows it; a
        frame of more than 8 tensors by its first 3 and last 2 and its count (``tensors=(T0,
        T1, T2, ..., T998, T999) (1000 tensors)``), so that the repr stays short."""
        kind = self.kind
        return (f"RoundFrame(kind={type(kind).__name__}.{kind.name}, weight={self.weight!r}, "
                f"tensors={short_items(self.tensors, 'tensors')})")


#: a frame's slot setters (as the payload's above)
_set_kind: Final[Any] = vars(RoundFrame)["kind"].__set__
_set_weight: Final[Any] = vars(RoundFrame)["weight"].__set__
_set_tensors: Final[Any] = vars(RoundFrame)["tensors"].__set__


#: kind byte -> RoundKind (the walk accepts only these two bytes; the key None, what
#: :func:`wire_int` gives for a value that is no integer, is absent)
_KINDS: Final[dict[int | None, RoundKind]] = {int(k): k for k in RoundKind}


#: a frame given where its bytes belong (MuxRecord.host_frame, encode_len_framed, a decoder) is
#: told to encode it first
ENCODE_FIRST[RoundFrame] = "encode_round_frame_bytes(frame, salt)"


def round_frame_wire_len(tensors: Iterable[TensorPayload]) -> int:
    """Exact wire length of a frame carrying ``tensors``: 25 + sum(2 + 4*ndim + 8 + nbytes).

    Raises:
        InvalidValue (local) ``frame.bad_type``: ``tensors`` is not an iterable (``None``, a
            frame: use :attr:`RoundFrame.wire_len`), or ``tensors[i]`` is not a
            :class:`TensorPayload` (named with its type).

    Upstream: ``controller/round_frame.rs`` ``round_frame_wire_len``.
    """
    if isinstance(tensors, RoundFrame) or not isinstance(tensors, Iterable):
        raise protocol_error("frame.bad_type", field="tensors",
                             expected="an iterable of TensorPayload", got=shown_type(tensors))
    n = ROUND_FRAME_FIXED_OVERHEAD
    for i, t in enumerate(tensors):
        if not isinstance(t, TensorPayload):
            raise protocol_error("frame.bad_type", field=f"tensors[{i}]",
                                 expected="a TensorPayload", got=shown_type(t))
        n += 2 + 4 * t.ndim + 8 + t.nbytes
    return n


def not_a_frame(field: str, value: Any) -> ProtocolError:
    """The local error for a caller's ``field`` that should be a :class:`RoundFrame` and is
    ``value`` (``frame.bad_type``, naming its type: ``got None``, ``got dict``)."""
    return protocol_error("frame.bad_type", field=field, expected="a RoundFrame",
                          got=shown_type(value))

"""RoundFrame and TensorPayload: one reduce round's contribution or consensus.

Layout (``spec/wire.yaml`` ``messages.round_frame``; all little-endian)::

    magic u32 | num_tensors u32 | kind u8 | weight f64 |
    per tensor: dtype u8 | ndim u8 | ndim x u32 dims | nbytes u64 | nbytes data bytes |
    auth tag (8 bytes: HMAC-SHA256(salt, magic .. last data byte)[:8])

Decoding never copies payload bytes: each :class:`TensorPayload` holds a memoryview slice of the
input. Encoding returns a list of buffers (metadata pieces, the payload views themselves, the tag)
ready for ``socket.sendmsg``; :func:`encode_round_frame_bytes` joins them for convenience.

The reader accepts exactly what upstream's reader accepts: any dtype byte and any ``nbytes``
(checked later by the fold and by :meth:`TensorPayload.array`); it checks magic, the tensor-count
cap, the kind byte and the weight (finite, not below zero; ``-0.0`` passes) before the tag, and the
running byte total against the frame ceiling before reading each payload.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``RoundFrame``, ``TensorPayload``,
``read_round_frame_streamed``, ``write_round_frame_streamed``, ``round_frame_wire_len``).
"""

from __future__ import annotations

import enum
import functools
import math
import struct as _struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..errors import ProtocolError, protocol_error
from ..spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    DTYPE_BF16,
    DTYPE_F32,
    ELEMENT_SIZE,
    MAX_NDIM,
    MAX_ROUND_FRAME_TENSORS,
    ROUND_FRAME_FIXED_OVERHEAD,
    ROUND_FRAME_HEADER_LEN,
    ROUND_FRAME_MAGIC,
    ROUND_KIND_CONTROL,
    ROUND_KIND_MODEL,
    U32_MAX,
)
from ._arrays import real_array, wire_dtype_tag, wire_elements
from ._common import END_OF_STREAM, BytesLike, EndOfStream, NeedData, as_view, wire_int
from ._walk import _WEIGHT_UNPACK, _known_layout, _remember
from ._walk import _FrameWalk as _FrameWalk  # the stream decoders resume it
from ._walk import _rust_f64 as _rust_f64
from ._walk import read_known_frame as _read_known_frame
from .auth import Premac, check_salt, new_mac, tag_as_u64, tags_equal
from .structs import PACKED, dims_packed

# the precompiled forms of the structs.py declarations (the hot path of every round)
_HEADER = PACKED["ROUND_FRAME_HEADER"]
_KIND = PACKED["ROUND_FRAME_KIND"]
_WEIGHT = PACKED["ROUND_FRAME_WEIGHT"]
_META = PACKED["TENSOR_META"]
_NBYTES = PACKED["TENSOR_NBYTES"]

__all__ = [
    "FRAME_TAG_TAIL",
    "Dtype",
    "RoundFrame",
    "RoundKind",
    "TensorPayload",
    "declared_tensor_count",
    "decode_round_frame",
    "decode_round_frame_or_eos",
    "delivered_tensors",
    "encode_round_frame",
    "encode_round_frame_bytes",
    "known_layout",
    "known_round_frame",
    "parse_round_frame",
    "parse_round_frame_or_eos",
    "read_known_frame",
    "round_frame_extent",
    "round_frame_pieces",
    "round_frame_wire_len",
]

#: the bytes that end every RoundFrame: its auth tag (``AUTH_TAG_LEN``), after everything it
#: covers, so no reader can accept a frame before these arrive (the relay holds them back
#: while it forwards a Broadcast it has not checked yet)
FRAME_TAG_TAIL: Final = AUTH_TAG_LEN

#: ``known_layout(mv, ceiling)``: the layout the frame reader remembers for a frame whose
#: metadata bytes (magic, tensor count, kind, each tensor's dtype, ndim, dims and nbytes) ``mv``
#: carries, read with the frame ceiling ``ceiling`` (bytes), when ``mv`` is long enough for that
#: frame and its tag: an opaque object, the same one (``is``) for every such frame while it is
#: remembered, so a caller can tell a frame of a layout it kept. None when no such layout is
#: remembered (not read yet, read with another ceiling, forgotten, or a frame of more tensors
#: than are remembered). It costs no parse: one unpack of the metadata bytes per remembered
#: layout, nothing checked (the weight, the tag) and no payload touched; a hit moves that layout
#: first. It is the reader's own lookup (``_walk._known_layout``), not a wrapper. No upstream
#: counterpart (upstream's reader remembers nothing).
known_layout: Final = _known_layout
#: ``read_known_frame(mv, salt, ceiling, premac)``: a frame of a layout ``known_layout`` finds,
#: given every check its decode makes without building it (``_walk.read_known_frame``).
read_known_frame: Final = _read_known_frame

_NUMPY_MAX_NDIM = 64  # NumPy 2 arrays carry at most 64 dimensions
_BF16 = np.dtype(ml_dtypes.bfloat16)
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
        return _F32_LE if self is Dtype.F32 else _BF16


#: the trusted constructors' building block, bound once (a frozen dataclass's fields are set
#: through its slots' descriptors, ``_set_dtype`` .. ``_set_tensors`` below)
_new = object.__new__

#: the NumPy dtype of each viewable wire dtype tag (:attr:`Dtype.numpy`, keyed by the tag)
_NUMPY_DTYPE: dict[int, np.dtype[Any]] = {int(d): d.numpy for d in Dtype}


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
            ``tensor.too_many_dims``, ``tensor.dim_too_large``), or ``dtype`` or a dim is not an
            integer (``frame.bad_field`` naming ``dtype`` or ``shape[i]`` and the value): a bool,
            a float (``2.5`` and ``2.0`` alike) or text is refused, never truncated
            (:func:`~flodl_proto.codec._common.wire_int`, the rule :class:`FrameTemplate` and the
            round kind share), or ``data`` is not a C-contiguous bytes-like buffer
            (``codec.not_bytes_like`` naming ``data`` and its type: text, a number, a strided
            or Fortran-ordered array).

    Upstream: ``controller/round_frame.rs`` ``TensorPayload``.
    """

    dtype: int
    shape: tuple[int, ...]
    data: memoryview

    def __init__(self, dtype: int, shape: Iterable[int], data: BytesLike = b"") -> None:
        d_tag = wire_int(dtype)
        if d_tag is None or not 0 <= d_tag <= 0xFF:
            raise protocol_error("frame.bad_field", field="dtype", value=dtype, reason="not a u8")
        try:
            given = tuple(shape)
        except TypeError:
            raise protocol_error("frame.bad_field", field="shape", value=type(shape).__name__,
                                 reason="not a sequence of ints") from None
        if len(given) > MAX_NDIM:
            raise protocol_error("tensor.too_many_dims", ndim=len(given), max=MAX_NDIM)
        dims = []
        for i, g in enumerate(given):
            d = wire_int(g)
            if d is None:  # a bool or float dim: refused, never truncated (2.5 is not 2)
                raise protocol_error("frame.bad_field", field=f"shape[{i}]", value=g,
                                     reason="not an integer")
            if not 0 <= d <= U32_MAX:
                raise protocol_error("tensor.dim_too_large", dim=i, value=d)
            dims.append(d)
        shape_t = tuple(dims)
        view = as_view(data, "data")  # text, a number, a strided or Fortran-ordered array: refused
        object.__setattr__(self, "dtype", d_tag)
        object.__setattr__(self, "shape", shape_t)
        object.__setattr__(self, "data", view)

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
            unknown origin with the constructor, which checks them.
        """
        p = _new(cls)
        _set_dtype(p, dtype)
        _set_shape(p, shape)
        _set_data(p, data)
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
            InvalidValue (local): a ``dtype`` that is no integer (``frame.bad_field``) or an
                unknown one (``payload.unknown_dtype``), a complex /
                non-numeric array, or a finite value that the cast would make infinite
                (``frame.bad_field`` naming its flat index and the value).
        """
        arr = real_array(array)
        wire = Dtype(wire_dtype_tag(dtype, arr))
        return cls(int(wire), arr.shape, wire_elements(arr, wire.numpy, wire.name.lower()))

    @classmethod
    def elide(cls, dtype: int, shape: Iterable[int]) -> TensorPayload:
        """A zero-elided payload: no bytes, meaning all zeros of ``dtype`` and ``shape``.

        Only legal on the wire at protocol version 3 (version 2 folds reject it)."""
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
        (refused above ``ceiling`` bytes).

        Raises:
            InvalidValue: the dtype tag is unknown; InvalidValue (local): more than 64 dimensions
                (NumPy's limit; the wire allows 255).
            LimitExceeded: a zero-element shape whose other dimensions overflow NumPy's index
                type (legal on the wire, not representable as an array).
            SchemaMismatch: the byte count does not match ``numel * element_size`` (these
                three are remote, for a payload built here too: it does not know where its
                bytes came from); local ``tensor.elided``: elided, and no ``materialize_elided``.
            LimitExceeded (local): materialising the zeros would exceed ``ceiling``.
        """
        element_size = ELEMENT_SIZE.get(self.dtype)
        if element_size is None:
            raise protocol_error("tensor.unknown_dtype", dtype=self.dtype)
        np_dtype = _NUMPY_DTYPE[self.dtype]
        shape = self.shape
        expected = _numel(shape) * element_size
        nbytes = self.data.nbytes
        if nbytes != expected:
            if nbytes == 0 and materialize_elided:
                if len(shape) > _NUMPY_MAX_NDIM:
                    raise protocol_error("tensor.ndim_unsupported", ndim=len(shape),
                                         max=_NUMPY_MAX_NDIM)
                if expected > ceiling:
                    raise protocol_error("tensor.elided_too_large", shape=list(shape),
                                         nbytes=expected, ceiling=ceiling)
                try:
                    return np.zeros(shape, dtype=np_dtype)
                except ValueError:
                    raise protocol_error("tensor.shape_unrepresentable",
                                         shape=list(shape)) from None
            if nbytes == 0:
                raise protocol_error("tensor.elided", shape=list(shape), expected=expected)
            raise protocol_error("tensor.nbytes_vs_shape", shape=list(shape), expected=expected,
                                 got=nbytes)
        if len(shape) > _NUMPY_MAX_NDIM:
            raise protocol_error("tensor.ndim_unsupported", ndim=len(shape), max=_NUMPY_MAX_NDIM)
        arr = np.frombuffer(self.data, dtype=np_dtype)  # flat, of exactly numel elements
        if len(shape) != 1:
            try:
                arr = arr.reshape(shape)
            except ValueError:  # a zero-element shape whose other dims overflow NumPy's index
                raise protocol_error("tensor.shape_unrepresentable",
                                     shape=list(shape)) from None
        arr.flags.writeable = False
        return arr

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorPayload):
            return NotImplemented
        return self.dtype == other.dtype and self.shape == other.shape and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TensorPayload(dtype={self.dtype}, shape={list(self.shape)}, nbytes={self.nbytes})"


#: the slot setters of a payload's fields (a slot's own descriptor: no attribute lookup by
#: name, unlike ``object.__setattr__``), for the trusted constructors
_set_dtype: Final[Any] = vars(TensorPayload)["dtype"].__set__
_set_shape: Final[Any] = vars(TensorPayload)["shape"].__set__
_set_data: Final[Any] = vars(TensorPayload)["data"].__set__


def _checked_weight(weight: Any) -> float:
    """``weight`` as a float when it is a real number (not text) and a finite realized-work
    mass not below zero (``-0.0`` allowed).

    Raises:
        InvalidValue (local): ``frame.bad_field`` naming the weight.
    """
    if isinstance(weight, str | bytes | bytearray | bool | np.bool_) or not isinstance(
            weight, int | float | np.integer | np.floating):  # True is no mass of 1.0
        raise protocol_error("frame.bad_field", field="weight", value=weight,
                             reason="not a real number")
    try:
        w = float(weight)
    except OverflowError:  # an int beyond the f64 range
        w = math.inf
    if not math.isfinite(w) or w < 0.0:
        raise protocol_error("frame.bad_field", field="weight", value=w,
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


@dataclass(frozen=True, slots=True)
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
            LimitExceeded (local): too many tensors.
        SchemaMismatch (local): ``frame.payload_nbytes_local`` naming the tensor's index, shape,
            dtype, the expected and the given byte count (``check_nbytes``).

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
            raise protocol_error("frame.bad_field", field="tensors", value=type(tensors).__name__,
                                 reason="not an iterable of TensorPayload") from None
        if len(ts) > MAX_ROUND_FRAME_TENSORS:
            raise protocol_error("frame.too_many_tensors_local", count=len(ts),
                                 cap=MAX_ROUND_FRAME_TENSORS)
        size_of = _ELEMENT_SIZE_OF if check_nbytes else _no_size
        for t in ts:
            if not isinstance(t, TensorPayload):
                raise protocol_error("frame.bad_field", field="tensors", value=type(t).__name__,
                                     reason="every tensor must be a TensorPayload")
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


#: a frame's slot setters (as the payload's above)
_set_kind: Final[Any] = vars(RoundFrame)["kind"].__set__
_set_weight: Final[Any] = vars(RoundFrame)["weight"].__set__
_set_tensors: Final[Any] = vars(RoundFrame)["tensors"].__set__


def round_frame_wire_len(tensors: Iterable[TensorPayload]) -> int:
    """Exact wire length of a frame carrying ``tensors``: 25 + sum(2 + 4*ndim + 8 + nbytes).

    Upstream: ``controller/round_frame.rs`` ``round_frame_wire_len``.
    """
    n = ROUND_FRAME_FIXED_OVERHEAD
    for t in tensors:
        n += 2 + 4 * t.ndim + 8 + t.nbytes
    return n


def round_frame_pieces(frame: RoundFrame) -> list[BytesLike]:
    """The wire bytes of ``frame`` up to (not including) its 8-byte tag, as buffers.

    Small metadata ``bytes`` alternate with the payload buffers themselves (no payload copy);
    the tag is the first 8 bytes of HMAC-SHA256 over exactly these pieces, appended last. Use it
    to sign the frame while the pieces are hashed for another purpose too (a record MAC) or while
    they are sent; :func:`encode_round_frame` is the one-call form.

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed`` (before the footer).
    """
    pieces: list[BytesLike] = []
    # the metadata before each payload is gathered in a list and joined once (``bytes +=``
    # copied the run so far for every tensor: quadratic in a run of elided tensors)
    heads = [_FRAME_HEAD.pack(ROUND_FRAME_MAGIC, len(frame.tensors), int(frame.kind),
                              frame.weight)]
    for t in frame.tensors:
        shape = t.shape
        nbytes = t.data.nbytes
        heads.append(_tensor_head(len(shape)).pack(t.dtype, len(shape), *shape, nbytes))
        if nbytes:
            pieces.append(b"".join(heads))
            pieces.append(t.data)
            heads = []
    if heads:
        pieces.append(b"".join(heads))
    return pieces


#: header, kind and weight, the first 17 bytes of a frame, as one struct (the declared structs'
#: little-endian formats, which have no padding, written one after the other)
_FRAME_HEAD: Final = _struct.Struct(
    "<" + "".join(p.format.lstrip("<") for p in (_HEADER, _KIND, _WEIGHT)))


@functools.cache
def _tensor_head(ndim: int) -> _struct.Struct:
    """A tensor's meta, ``ndim`` dims and nbytes as one struct (what precedes its data)."""
    return _struct.Struct(
        "<" + "".join(p.format.lstrip("<") for p in (_META, dims_packed(ndim), _NBYTES)))


def encode_round_frame(frame: RoundFrame, salt: BytesLike) -> list[BytesLike]:
    """Encode ``frame`` signed with ``salt`` as a list of buffers for ``socket.sendmsg``.

    The list alternates small metadata ``bytes`` with the payload memoryviews themselves (no
    payload copy) and ends with the 8-byte tag. ``b"".join(...)`` gives the wire bytes.

    Raises:
        InvalidValue (local): the salt is not 16 bytes.

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed``.
    """
    key = check_salt(salt)
    pieces = round_frame_pieces(frame)
    mac = new_mac(key)
    for p in pieces:
        mac.update(p)
    pieces.append(bytes(mac.digest()[:AUTH_TAG_LEN]))
    return pieces


def encode_round_frame_bytes(frame: RoundFrame, salt: BytesLike) -> bytes:
    """Encode ``frame`` signed with ``salt`` into one ``bytes`` (copies the payloads once).

    Raises:
        InvalidValue (local): the salt is not 16 bytes.

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed``.
    """
    return b"".join(encode_round_frame(frame, salt))


#: kind byte -> RoundKind (the walk accepts only these two bytes; the key None, what
#: :func:`wire_int` gives for a value that is no integer, is absent)
_KINDS: Final[dict[int | None, RoundKind]] = {int(k): k for k in RoundKind}


def round_frame_extent(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> int | NeedData:
    """Total length of the frame starting ``data`` if it is all present, else how much is needed.

    Applies every check upstream makes before the tag (magic, tensor cap, kind, weight, ceiling)
    so a stream can reject hostile input before buffering it; never verifies the tag.

    Returns:
        the frame's full length in bytes (tag included), or ``NeedData(n)``: at least ``n`` more
        bytes are needed before the structure can be walked further.

    Raises:
        BadMagic, LimitExceeded, InvalidValue (remote).
    """
    mv = as_view(data)
    walk = _FrameWalk(ceiling)
    need = walk.advance(mv, partial=True)
    if need is not None:
        return NeedData(need - len(mv))
    return walk.pos + AUTH_TAG_LEN


def parse_round_frame_or_eos(
    data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING,
) -> tuple[RoundFrame, int, bytes] | EndOfStream:
    """Stream form of :func:`parse_round_frame`: :data:`END_OF_STREAM` instead of an error when
    ``data`` ends inside the 8-byte header (including empty input), as a stream reader at a frame
    boundary sees a clean close.

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput (remote).
    """
    mv = as_view(data)
    if type(ceiling) is int and (lay := _known_layout(mv, ceiling)) is not None:
        (weight,) = _WEIGHT_UNPACK(mv, ROUND_FRAME_HEADER_LEN + 1)
        if 0.0 <= weight < math.inf:  # else the walk below reports it
            pos = lay.body_end
            return (known_round_frame(lay, weight, mv), pos + AUTH_TAG_LEN,
                    mv[pos:pos + AUTH_TAG_LEN].tobytes())
    walk = _FrameWalk(ceiling)
    if walk.advance(mv, partial=False) is not None:
        return END_OF_STREAM
    pos = walk.pos
    tensors = tuple([TensorPayload.trusted(d, s, mv[start:start + n])
                     for d, s, start, n in walk.entries])
    frame = RoundFrame.trusted(_KINDS[walk.kind], walk.weight, tensors)
    _remember(mv, walk)
    return frame, pos + AUTH_TAG_LEN, bytes(mv[pos:pos + AUTH_TAG_LEN])


def known_round_frame(lay: Any, weight: float, mv: memoryview) -> RoundFrame:
    """The frame ``mv`` starts with, of the remembered layout ``lay`` and weight ``weight``, as
    :func:`~flodl_proto.codec._walk.read_known_frame` found them (payloads are views of ``mv``)."""
    trusted = TensorPayload.trusted
    return RoundFrame.trusted(_KINDS[lay.kind], weight,
                              tuple([trusted(d, s, mv[a:b]) for d, s, a, b in lay.entries]))


def parse_round_frame(
    data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING,
) -> tuple[RoundFrame, int, bytes]:
    """Parse one complete RoundFrame WITHOUT verifying its auth tag (for inspection tools).

    Every other check of :func:`decode_round_frame` is applied, in the same order. Returns
    ``(frame, consumed, carried tag)``; the tag covers ``data[:consumed - 8]``. Never trust the
    values before verifying the tag (:func:`flodl_proto.codec.auth.compute_tag`).

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput (remote); ``data`` ending inside the
        8-byte header is TruncatedInput ``frame.header_read_failed`` (see
        :func:`parse_round_frame_or_eos` for the stream form).
    """
    res = parse_round_frame_or_eos(data, ceiling=ceiling)
    if res is END_OF_STREAM:
        raise protocol_error("frame.header_read_failed", got=as_view(data).nbytes,
                             need=ROUND_FRAME_HEADER_LEN)
    return res


def decode_round_frame(
    data: BytesLike,
    salt: BytesLike,
    *,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
) -> tuple[RoundFrame, int]:
    """Decode and authenticate one complete RoundFrame from the start of ``data``.

    The whole-buffer form: ``data`` must hold the frame. Arguments, checks and errors are those
    of :func:`decode_round_frame_or_eos`, except that ``data`` ending inside the 8-byte header
    (including empty input) raises TruncatedInput ``frame.header_read_failed``.

    Returns:
        ``(frame, consumed)``: payloads are views into ``data``; bytes after the frame are left
        alone.

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput, AuthenticationError (remote).

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed`` (``Ok(None)`` is an
    error here).
    """
    res = decode_round_frame_or_eos(data, salt, ceiling=ceiling, premac=premac)
    if res is END_OF_STREAM:
        raise protocol_error("frame.header_read_failed", got=as_view(data).nbytes,
                             need=ROUND_FRAME_HEADER_LEN)
    return res


def decode_round_frame_or_eos(
    data: BytesLike,
    salt: BytesLike,
    *,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
) -> tuple[RoundFrame, int] | EndOfStream:
    """Stream form: decode and authenticate one RoundFrame from the start of ``data``, or
    report a clean end of stream.

    Args:
        data: bytes-like input; the payloads of the result are views into it (keep it alive and
            unmodified while the frame is in use).
        salt: the 16-byte session salt.
        ceiling: frame ceiling in bytes (running total of ``nbytes``); default 1 GiB.
        premac: the MAC the caller already computed over ``data[:n]`` (see
            :class:`~flodl_proto.codec.auth.Premac`); used when ``n`` is the frame's length
            minus its tag, else the covered bytes are hashed here.

    Returns:
        ``(frame, consumed)`` (bytes after the frame are left alone), or :data:`END_OF_STREAM` if
        ``data`` ends inside the 8-byte header (including empty input).

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput, AuthenticationError (remote), in
        upstream's order: magic, tensor cap, kind, weight, per tensor (meta, shape, nbytes,
        ceiling, data), footer, tag.

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """
    key = check_salt(salt)
    mv = as_view(data)
    res = parse_round_frame_or_eos(mv, ceiling=ceiling)
    if res is END_OF_STREAM:
        return END_OF_STREAM
    frame, consumed, carried = res
    if premac is not None and premac.covered == consumed - AUTH_TAG_LEN:
        computed = premac.digest[:AUTH_TAG_LEN]
    else:
        mac = new_mac(key)
        mac.update(mv[0:consumed - AUTH_TAG_LEN])
        computed = mac.digest()[:AUTH_TAG_LEN]
    if not tags_equal(computed, carried):
        raise protocol_error("frame.auth_failed", computed=tag_as_u64(computed),
                             carried=tag_as_u64(carried))
    return frame, consumed


def delivered_tensors(data: BytesLike, count: int) -> list[TensorPayload]:
    """The first ``count`` tensors of a frame whose reader got past them before failing.

    For a consumer that folds tensors as a streamed reader delivers them (upstream's relay fold
    merges each tensor before the footer is read): given a reader error naming tensor ``count``
    (or, for an error after the last tensor, :func:`declared_tensor_count`), it returns the
    tensors the reader had already delivered. The structure up to them was checked by the reader
    that failed; nothing is checked again and nothing is copied (payloads are views of
    ``data``).
    """
    mv = as_view(data)
    out: list[TensorPayload] = []
    pos = ROUND_FRAME_HEADER_LEN + 1 + 8  # after the header, the kind byte and the weight
    for _ in range(count):
        dtype, ndim = _META.unpack_from(mv, pos)
        pos += 2
        dims = dims_packed(ndim).unpack_from(mv, pos) if ndim else ()
        pos += 4 * ndim
        (nbytes,) = _NBYTES.unpack_from(mv, pos)
        pos += 8
        out.append(TensorPayload.trusted(dtype, dims, mv[pos:pos + nbytes]))
        pos += nbytes
    return out


def declared_tensor_count(data: BytesLike) -> int:
    """The tensor count a frame's header declares (the header was checked by its reader)."""
    return int(_HEADER.unpack_from(as_view(data)[:ROUND_FRAME_HEADER_LEN], 0)[1])

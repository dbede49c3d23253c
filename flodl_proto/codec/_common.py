"""Shared codec primitives: the end-of-stream sentinel, "need more data", bytes-like views.

Upstream: the ``Ok(None)`` clean-EOF convention of ``controller/round_frame.rs`` and
``relay/mux.rs`` readers (fab2s/floDl, ``flodl/src/distributed/``).
"""

from __future__ import annotations

import enum
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np

from ..errors import ProtocolError, protocol_error, shown_type
from ..spec import SPEC, U32_MAX

__all__ = [
    "END_OF_STREAM",
    "BytesLike",
    "EndOfStream",
    "NeedData",
    "as_view",
    "check_ceiling",
    "check_version",
    "check_world_size",
    "not_bytes_like",
    "not_pieces",
    "numpy_text",
    "numpy_text_named",
    "short_items",
    "underflow_reason",
    "unviewed",
    "wire_int",
    "wire_real",
    "zero_d_scalar",
]

#: Anything the decoders accept without copying (NumPy arrays: pass ``memoryview(arr)``).
BytesLike: TypeAlias = bytes | bytearray | memoryview


class EndOfStream(enum.Enum):
    """Type of the :data:`END_OF_STREAM` sentinel.

    Upstream: the ``Ok(None)`` clean end of stream of ``controller/round_frame.rs`` and
    ``relay/mux.rs`` readers.
    """

    END_OF_STREAM = "END_OF_STREAM"

    def __repr__(self) -> str:
        return "END_OF_STREAM"


#: Returned (never raised) by a decoder when the input ended cleanly: at byte 0, or inside the
#: 8-byte RoundFrame header, the 25-byte mux header or the 4-byte length prefix.
END_OF_STREAM: Final = EndOfStream.END_OF_STREAM


@dataclass(frozen=True, slots=True)
class NeedData:
    """Returned by an incremental decoder that needs at least ``nbytes`` more bytes.

    Attributes:
        nbytes: minimum number of further bytes (>= 1) before the next record can complete.

    Upstream: none as such: upstream's readers block in ``read_exact`` for the bytes a record still
    needs.
    """

    nbytes: int


def as_view(data: BytesLike, field: str = "data", *, elements: bool = False) -> memoryview:
    """Return a flat unsigned-byte memoryview of ``data`` without copying.

    Args:
        data: any C-contiguous buffer (bytes, bytearray, memoryview, a NumPy array's memory,
            that of an array whose dtype exports no buffer format, ``ml_dtypes.bfloat16``,
            included).
        field: the argument's name, for the error.
        elements: ``data`` holds a RoundFrame tensor's elements, which the wire stores
            little-endian: a typed buffer of big-endian elements (a NumPy ``>f4`` array) is
            refused, where its bytes would go out as they are, each element's byte order
            reversed.

    Raises:
        InvalidValue (local, ``codec.not_bytes_like``): ``data`` is not a buffer (``None``, text,
            a list, a message object), not a C-contiguous one (a strided view), a buffer of
            Python object pointers (a NumPy object array: its bytes are addresses), or NumPy
            text (a ``str_`` or an array of dtype ``<U2``: its buffer holds UCS-4 characters,
            :func:`numpy_text`; a ``memoryview`` of it is taken as the bytes it asks for);
        InvalidValue (local, ``codec.big_endian``): with ``elements``, ``data`` is a typed
            buffer of big-endian elements of more than one byte (named as the RoundFrame's
            other checks name theirs: ``round_frame: data = ndarray of big-endian elements
            (buffer format '>f') is invalid: ...``).
    """
    try:
        mv = data if isinstance(data, memoryview) else memoryview(data)
        if mv.format != "B" or mv.ndim != 1 or not mv.c_contiguous:
            if elements and mv.format[:1] in (">", "!") and mv.itemsize > 1:
                raise protocol_error("codec.big_endian", field=field, got=type(data).__name__,
                                     format=mv.format,
                                     kind=_ELEMENT_KIND.get(mv.format[1:], "f"),
                                     size=mv.itemsize)
            if "O" in mv.format:  # Python object pointers (a NumPy object array): no bytes
                raise TypeError
            if mv.format[-1:] == "w" and numpy_text(data):  # UCS-4 characters: no bytes
                raise TypeError
            mv = mv.cast("B")  # refuses a strided view (TypeError)
    except (TypeError, BufferError, ValueError):
        raw = _array_bytes(data)
        if raw is None:
            raise not_bytes_like(field, data, one_buffer=True) from None
        return raw
    return mv


def numpy_text(value: Any) -> bool:
    """Whether ``value`` is NumPy text: a ``str_`` or an array of dtype kind ``U``, whose buffer
    holds its characters as UCS-4 (``np.array(["ab"])`` exports the 8 bytes
    ``b"a\\0\\0\\0b\\0\\0\\0"``), no bytes to send: the codec refuses it where it takes
    bytes (:func:`not_bytes_like` names it). Raises nothing.

    No upstream counterpart (upstream's API takes byte slices)."""
    return isinstance(value, np.ndarray | np.generic) and value.dtype.kind == "U"


def numpy_text_named(value: Any) -> str:
    """How a message names NumPy text ``value`` (:func:`numpy_text` is true of it) after "got":
    ``NumPy text (ndarray of dtype <U2)``, its type and its dtype. Raises nothing.

    No upstream counterpart (upstream's API takes byte slices)."""
    return f"NumPy text ({shown_type(value)} of dtype {value.dtype.str})"


def _array_bytes(data: Any) -> memoryview | None:
    """The memory of a C-contiguous NumPy array whose dtype exports no buffer format (NumPy
    refuses ``memoryview`` of an ``ml_dtypes.bfloat16`` array), as flat unsigned bytes; None for
    anything else (NumPy text included). Such dtypes are native-endian."""
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous or data.dtype.hasobject \
            or data.dtype.kind == "U":
        return None
    try:
        return data.reshape(-1).view(np.uint8).data
    except (TypeError, BufferError, ValueError):
        return None


# the NumPy kind of a struct-module format character, for the hint of codec.big_endian
_ELEMENT_KIND = {"f": "f", "d": "f", "e": "f", "h": "i", "i": "i", "l": "i", "q": "i",
                 "H": "u", "I": "u", "L": "u", "Q": "u"}


def is_buffer(value: Any) -> bool:
    """Whether ``value`` exports a buffer (``memoryview(value)`` works: bytes, bytearray, an
    ``array.array``, a NumPy array of a buffer dtype...), contiguous or not. Raises nothing.

    No upstream counterpart (upstream's API takes byte slices)."""
    try:
        memoryview(value).release()
    except (TypeError, BufferError, ValueError):
        return False
    return True


def _holds_pointers(value: Any) -> bool:
    """Whether ``value`` is a buffer of Python object pointers (a NumPy object array's)."""
    try:
        with memoryview(value) as mv:
            return "O" in mv.format
    except (TypeError, BufferError, ValueError):
        return False


#: the codec's message types that are given where their bytes belong, with the call that makes
#: the bytes (the modules that define them fill it in: this module imports none of them)
ENCODE_FIRST: Final[dict[type, str]] = {}


def not_bytes_like(field: str, value: Any, *, one_buffer: bool = False) -> ProtocolError:
    """The local error for a caller's ``field`` that is not a contiguous buffer (``value``).

    With ``one_buffer`` (the field takes one buffer, not pieces), a list or tuple of buffers,
    as the encoders for ``socket.sendmsg`` return, gets the hint to join it. NumPy text (a
    ``str_`` or an array of dtype kind ``U``) is named as text with its dtype, not as a
    buffer's layout. A message of :data:`ENCODE_FIRST` (a ``RoundFrame``) gets the hint to
    encode it first."""
    got = shown_type(value)
    if (encoder := ENCODE_FIRST.get(type(value))) is not None:
        got += f" (encode it first: {encoder})"
    elif numpy_text(value):
        got = f"{numpy_text_named(value)}: encode it to bytes"
    elif _holds_pointers(value):
        got = (f"a {type(value).__name__} of Python objects (its buffer holds their addresses, "
               "not bytes to send)")
    elif isinstance(value, memoryview) or is_buffer(value) or (
            isinstance(value, np.ndarray) and not value.flags.c_contiguous):
        # a buffer, but a strided or Fortran-ordered one
        got = f"a non-contiguous {type(value).__name__}"
    elif one_buffer and isinstance(value, list | tuple) and value and all(
            is_buffer(p) for p in value):
        got += ' (join a buffer list, as the encoders for sendmsg return, with b"".join)'
    return protocol_error("codec.not_bytes_like", field=field, got=got)


def not_pieces(field: str, value: Any) -> ProtocolError:
    """The local error for a caller's ``field`` that should be a sequence of buffers (pieces
    sent back to back) and is ``value``, which is not: ``codec.not_pieces`` when ``value`` is
    one buffer, text or no iterable, else ``codec.not_bytes_like`` naming its first piece that
    is no contiguous buffer (``field[i]``, with its type).

    Meant for an encoder's error path: it is called once the pieces failed to measure."""
    if isinstance(value, bytes | bytearray | memoryview | str) or is_buffer(value):
        return protocol_error("codec.not_pieces", field=field, got=shown_type(value))
    try:
        items = list(value)
    except TypeError:
        return protocol_error("codec.not_pieces", field=field, got=shown_type(value))
    for i, p in enumerate(items):
        try:
            as_view(p)
        except ProtocolError:
            return not_bytes_like(f"{field}[{i}]", p)
    return not_bytes_like(field, value)  # every piece is a buffer: nothing more precise to say


def unviewed(buf: bytearray) -> bool:
    """Whether no view of ``buf`` is alive: ``True`` when nothing holds an export of its buffer
    (no ``memoryview`` of it, nor of a slice of one, nor a NumPy array over it), ``False`` while
    one does. Such a buffer may be rewritten or resized without changing bytes a holder still
    reads (a record buffer reused, a kept wire image written again).

    The probe is the one CPython offers: a bytearray with live exports cannot be resized, so one
    byte is appended (``BufferError`` when a view is alive) and deleted again. The buffer is
    never copied and its length and bytes are as they were whatever the answer; the append may
    enlarge its allocation once, as any append does.

    No upstream counterpart: upstream's buffers are owned, not shared through views.
    """
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


def wire_int(value: Any) -> int | None:
    """``value`` as a Python ``int`` when it is an integer, else ``None``: the one rule for the
    integer fields a caller hands the codec (dtype tags, dims, round kinds, ranks).

    Integers are ``int``, the NumPy integer scalars and 0-d NumPy integer arrays
    (``np.array(5)``; whatever ``operator.index`` takes; :func:`wire_real` takes 0-d arrays too);
    a ``bool`` (Python or NumPy), a float (``2.5`` and ``2.0`` alike), an array of one or more
    dimensions (``np.array([5])``), text or anything else is not one, so a caller's value is
    refused, never truncated or taken as 0 / 1. The range is the caller's check; the error
    names the field and the value.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def wire_real(value: Any) -> float | None:
    """``value`` as a Python ``float`` when it is a real number, else ``None``: the rule for the
    real-valued arguments a caller hands the package (weights, masses, scale factors).

    Real numbers are ``int``, ``float``, the NumPy integer and floating scalars, 0-d NumPy
    arrays of an integer or floating dtype (``np.array(0.5)``, taken as its scalar, as
    :func:`wire_int` takes ``np.array(5)``) and any other :class:`numbers.Real`
    (``fractions.Fraction(1, 3)``, taken as the nearest float; a ``decimal.Decimal`` is none,
    as Python's numeric tower has it); a number beyond the f64 range is taken as an infinity of
    its sign (as Rust's ``as f64`` saturates). A ``bool`` (Python or NumPy: ``True``
    is no 1.0; a 0-d bool array neither), text (``"2"`` is not parsed), ``None``, an array of one
    or more dimensions or anything else is not one. The 0-d array is looked for only once the
    value is none of the scalar types, so the scalars cost what they did. NaN and the
    infinities are floats: whether they are in range is the caller's check.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating):
        scalar = zero_d_scalar(value)
        if scalar is None and (isinstance(value, bool | np.bool_)
                               or not isinstance(value, numbers.Real)):
            return None
        value = value if scalar is None else scalar
    try:
        return float(value)
    except OverflowError:  # an int beyond the f64 range
        return math.inf if value > 0 else -math.inf


def underflow_reason(value: Any, x: float) -> str | None:
    """Why ``value``, taken by :func:`wire_real` as ``x``, is refused where a weight, a mass or
    a scale is given: an exact number (an ``int``, a ``fractions.Fraction``: any
    :class:`numbers.Rational`) that is not zero but whose nearest f64 ``x`` is a zero
    (``Fraction(1, 10**400)``: ``'nonzero, but rounds to 0.0 in f64'``; its negative: ``-0.0``),
    which would pass for no realized work. None for anything else: a float, or a NumPy
    floating scalar, is the number it is (``1e-400`` is the float 0.0), and an int is never
    taken as a zero.

    No upstream counterpart: upstream's arguments are f64 values already."""
    if x == 0.0 and isinstance(value, numbers.Rational) and value != 0:
        return f"nonzero, but rounds to {x!r} in f64"
    return None


def zero_d_scalar(value: Any) -> int | float | None:
    """The value of a 0-d NumPy array of an integer or floating dtype as a Python number
    (``np.array(0.5)`` gives ``0.5``, exactly), else ``None`` (anything else: a bool or complex
    dtype, an array of one or more dimensions, not an array). The real-number rules take a 0-d
    array as its value, as the integer rule (``operator.index``) takes a 0-d integer array."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf":
        number: int | float = value.item()
        return number
    return None


def check_ceiling(ceiling: int) -> int:
    """Validate a frame ceiling argument (bytes) and return it.

    Raises:
        InvalidValue (local): ``ceiling`` is not a non-negative integer.
    """
    if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 0:
        raise protocol_error("ceiling.invalid", value=ceiling)
    return ceiling


def check_version(version: int) -> int:
    """Validate a data-channel protocol version and return it.

    Raises:
        VersionMismatch (local): ``version`` is not one of ``SPEC.supported_versions`` (2, 3),
            or not an integer (``2.0`` and ``True`` are refused: the codec's integer rule,
            :func:`wire_int`).

    Upstream: the version switch of ``flodl/src/distributed/relay/mux.rs`` (``Hello`` shape) and
    ``controller/round_frame.rs`` (zero-elision from version 3).
    """
    if version.__class__ is not int or version not in SPEC.supported_versions:
        n = wire_int(version)  # a NumPy integer is one; a float (2.0) or a bool is not
        if n is None or n not in SPEC.supported_versions:
            got = repr(version) if isinstance(version, str | bytes) else version  # '2' is no 2
            raise protocol_error(
                "version.unsupported", got=got, supported=list(SPEC.supported_versions)
            )
        return n
    return version


def check_world_size(world_size: object) -> int:
    """A controller's world size (ranks, a whole number in 1..U32_MAX: ranks are u32 on the
    wire) as a plain ``int``, by the codec's integer rule (:func:`wire_int`: an ``int`` or a
    NumPy integer; a bool, a float or text is refused, never truncated). The one rule of
    :class:`~flodl_proto.fsm.ControllerCore` and of the codec's Hello and control bounds.

    Raises:
        InvalidValue (local): ``controller.world_size_zero`` for 0 (upstream's words), else
            ``controller.bad_argument`` naming ``world_size`` and the value (a negative one, one
            past U32_MAX, a bool, a float, text, None).

    Upstream: ``controller/mod.rs`` (``world_size must be > 0``); the u32 bound is the
    handshake's ``world_size`` field.
    """
    n = wire_int(world_size)
    if n == 0:
        raise protocol_error("controller.world_size_zero")
    if n is None or not 0 < n <= U32_MAX:
        raise protocol_error("controller.bad_argument", field="world_size", value=world_size,
                             reason=f"not a whole number in 1..{U32_MAX} (ranks are u32)")
    return n


def short_items(items: tuple[Any, ...], noun: str) -> str:
    """``items`` as a tuple's repr, or, past 8 of them, by the first 3 and last 2 and their
    count (``(0, 1, 2, ..., 8, 9) (10 ranks)``, ``noun`` the count's word): how a repr shows
    a tuple that a peer's bytes size (a shape's dims, a frame's tensors, a Hello's ranks and
    signatures), so that the repr stays short. Raises nothing.

    No upstream counterpart (Rust's ``{:?}`` writes every item)."""
    if len(items) <= 8:
        return repr(items)
    shown = ", ".join([*map(repr, items[:3]), "...", *map(repr, items[-2:])])
    return f"({shown}) ({len(items)} {noun})"

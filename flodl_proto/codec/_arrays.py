"""NumPy arrays as the element bytes of a wire payload: the checks and the cast behind
:meth:`flodl_proto.codec.round_frame.TensorPayload.from_array`.

Upstream: ``controller/round_frame.rs`` (``encode_payload``: a tensor's values as f32 or bf16
element bytes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .._bf16 import is_bf16
from ..errors import ProtocolError, protocol_error, shown_type
from ..spec import DTYPE_BF16, DTYPE_F32, ELEMENT_SIZE
from ._common import wire_int, wire_real

__all__ = ["as_array", "integer_error", "no_number", "real_array", "wire_dtype_tag",
           "wire_elements"]

#: the NumPy dtype kinds of real numbers: bool, signed and unsigned integer, float
_REAL_KINDS = frozenset(("b", "i", "u", "f"))


def as_array(array: npt.ArrayLike) -> npt.NDArray[Any]:
    """``np.asarray(array)``, with NumPy's refusal of what makes no array turned into the
    codec's local error.

    Raises:
        InvalidValue (local) ``frame.bad_type``: nested sequences NumPy makes no array of
            (ragged rows: ``[[1, 2], [3]]``), naming ``array``, the argument's type and NumPy's
            reason.
    """
    try:
        return np.asarray(array)
    except (ValueError, TypeError) as e:
        raise protocol_error("frame.bad_type", field="array", expected="an array of numbers",
                             got=f"{shown_type(array)} (NumPy makes no array of it: {e})") from None


def real_array(array: npt.ArrayLike) -> npt.NDArray[Any]:
    """``array`` as a NumPy array of real numbers (bool, integer, float or bfloat16 values).

    Raises:
        InvalidValue (local) ``frame.bad_field``: complex, text, object or date values, or
            nested sequences NumPy makes no array of (:func:`as_array`).
    """
    arr = as_array(array)
    if arr.dtype.kind not in _REAL_KINDS and not is_bf16(arr.dtype):
        raise protocol_error("frame.bad_field", field="array dtype", value=str(arr.dtype),
                             reason="only real numbers (f32, bf16, or a real dtype to cast) "
                                    "can ride as f32 / bf16")
    return arr


def no_number(value: object) -> bool:
    """Whether ``value`` is no number at all (text such as ``"f32"`` or ``"3"``, bytes, None, a
    list), as opposed to a number of the wrong kind (a bool, a float, an integer out of range):
    the first is an argument of the wrong type (``frame.bad_type``), the second a wrong value
    (``frame.bad_field``). Raises nothing.

    No upstream counterpart: upstream's API takes typed values.
    """
    return not isinstance(value, bool | np.bool_) and wire_real(value) is None


def integer_error(field: str, value: object, expected: str, reason: str) -> ProtocolError:
    """The local error for a caller's integer argument ``field`` that is ``value``, no integer
    (or, for ``reason``, an integer out of range): ``frame.bad_type`` naming ``field`` and the
    type of ``value`` when it is no number at all (:func:`no_number`: text such as ``"f32"``,
    bytes, None, a list; ``expected`` says what the argument is), else ``frame.bad_field``
    naming ``field``, the value and ``reason`` (a bool, ``2.0``, ``2.5``, an integer out of
    range).

    No upstream counterpart: upstream's dtype tags and dims are typed ``u8`` / ``u32``.
    """
    if no_number(value):
        return protocol_error("frame.bad_type", field=field, expected=expected,
                              got=shown_type(value))
    return protocol_error("frame.bad_field", field=field, value=value, reason=reason)


def wire_dtype_tag(dtype: object, arr: npt.NDArray[Any]) -> int:
    """The wire dtype tag ``arr`` rides as: ``dtype``, or by default bf16 for a bfloat16 array
    and f32 for any other.

    Raises:
        InvalidValue (local): ``dtype`` is no number (``frame.bad_type`` naming its type: text
            such as ``"f32"``), a number that is no integer (``frame.bad_field``: ``True`` and
            ``1.0`` are no tag) or no known tag (``payload.unknown_dtype``).
    """
    if dtype is None:
        return DTYPE_BF16 if is_bf16(arr.dtype) else DTYPE_F32
    tag = wire_int(dtype)
    if tag is None:
        raise integer_error("dtype", dtype, "an integer wire dtype tag (Dtype.F32, Dtype.BF16)",
                            "not an integer wire dtype tag (Dtype.F32, Dtype.BF16)")
    if tag not in ELEMENT_SIZE:
        raise protocol_error("payload.unknown_dtype", dtype=dtype)
    return tag


def wire_elements(arr: npt.NDArray[Any], target: np.dtype[Any], name: str) -> memoryview:
    """The C-contiguous element bytes of ``arr`` as ``target`` values, flat, as unsigned bytes
    (no copy when ``arr`` already is such an array; a 0-d array gives one element).

    Args:
        arr: real values (:func:`real_array`), any shape.
        target: the wire dtype's NumPy dtype (``<f4`` or ``ml_dtypes.bfloat16``).
        name: the wire dtype's name for messages (``f32``, ``bf16``).

    Raises:
        InvalidValue (local) ``frame.bad_field``: a finite value the cast would make infinite
            (beyond ``target``'s range), naming its flat index and the value.
    """
    if arr.dtype != target:
        with np.errstate(over="ignore"):  # a finite value beyond the range: refused below
            cast = arr.astype(target)
        if arr.dtype.kind == "f":  # no integer reaches an infinity in f32 or bf16
            beyond = np.flatnonzero(np.isinf(cast) & np.isfinite(arr))
            if beyond.size:
                i = int(beyond[0])
                v = arr.flat[i]  # a long double beyond f64 shows as its own text
                raise protocol_error(
                    "frame.bad_field", field=f"array (flat index {i})",
                    value=float(v) if np.isfinite(np.float64(v)) else str(v),
                    reason=f"finite, but beyond the {name} range: it would ride as an infinity")
        arr = cast
    return np.ascontiguousarray(arr).ravel().view(np.uint8).data

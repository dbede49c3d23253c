"""The bf16 NumPy dtype (``ml_dtypes.bfloat16``), loaded on first use.

Importing ml_dtypes registers the casts of each of its many dtypes with NumPy: about a second
of CPU per process (ml_dtypes 0.7, NumPy 2.4), which a process that only moves f32 values (the
demo's controller, relays and ranks by default, most commands) never needs. The codec, the
reduce kernels and the rank client take the dtype from here when a bf16 value is actually
made or viewed. An array of bf16 values exists only once ml_dtypes has been imported (by this
module or by the caller), so :func:`is_bf16` answers without importing it, and
:func:`loaded_bf16` gives the dtype only to a process that has it already (the small-run
encoder takes ml_dtypes' one-call cast there and integer ops elsewhere, for the same bits).

No upstream counterpart (upstream's bf16 is the ``half`` crate's type).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["bf16", "is_bf16", "loaded_bf16"]

_dtype: np.dtype[Any] | None = None


def bf16() -> np.dtype[Any]:
    """``np.dtype(ml_dtypes.bfloat16)``, importing ml_dtypes the first time. Raises nothing
    but ml_dtypes' own ImportError."""
    global _dtype
    if _dtype is None:
        import ml_dtypes

        _dtype = np.dtype(ml_dtypes.bfloat16)
    return _dtype


def loaded_bf16() -> np.dtype[Any] | None:
    """``np.dtype(ml_dtypes.bfloat16)`` when ml_dtypes has been imported in this process (by
    :func:`bf16` or by anyone), else None, never importing it. Raises nothing."""
    if _dtype is None and "ml_dtypes" not in sys.modules:
        return None
    return bf16()


def is_bf16(dtype: object) -> bool:
    """Whether ``dtype`` (a NumPy dtype) is ``ml_dtypes.bfloat16``; False without importing
    ml_dtypes when nothing has imported it (then no value of that dtype exists)."""
    if _dtype is None:
        if "ml_dtypes" not in sys.modules:
            return False
        bf16()
    return bool(dtype == _dtype)

"""NumPy's float-warning context (``np.errstate(all="ignore")``) entered and left without
building the context manager: the folds enter it once per round (the relay's fold once per
deposit, the controller's remembered small plan once per fold), where ``np.errstate``'s object,
``__enter__`` and ``__exit__`` cost about a microsecond more per use.

The private names used (``numpy._core._multiarray_umath._make_extobj`` and
``numpy._core._ufunc_config._extobj_contextvar``, which ``np.errstate`` itself uses) are checked
once, at import, through the public ``np.geterr``; a NumPy without them, or whose names do
something else, gets ``np.errstate`` itself.

Upstream: none (upstream's Rust arithmetic has no warning state to silence).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

__all__ = ["quiet_enter", "quiet_exit"]

try:  # NumPy's warning context itself (what ``np.errstate`` sets), without its object
    _make_extobj: Any = importlib.import_module("numpy._core._multiarray_umath")._make_extobj
    _extobj_var: Any = importlib.import_module("numpy._core._ufunc_config")._extobj_contextvar
except (ImportError, AttributeError):  # pragma: no cover - a NumPy without them: np.errstate
    _make_extobj = None


def _private_context_works() -> bool:
    """Whether NumPy's private context names above do what ``np.errstate(all="ignore")``
    does here: every float error ignored while set, the caller's state back after the reset
    (checked once, at import, through the public ``np.geterr``; a NumPy whose private names
    changed their meaning gets ``np.errstate`` itself)."""
    if _make_extobj is None:  # pragma: no cover - see the import
        return False
    before = np.geterr()
    try:
        token = _extobj_var.set(_make_extobj(all="ignore"))
        try:
            inside = np.geterr()
        finally:
            _extobj_var.reset(token)
    except Exception:  # pragma: no cover - another signature or type
        return False
    return set(inside.values()) == {"ignore"} and np.geterr() == before


if not _private_context_works():  # pragma: no cover - a NumPy whose private names differ
    _make_extobj = None


def quiet_enter() -> Any:
    """Enter ``np.errstate(all="ignore")`` (every float warning off) for the calling thread
    and context; returns the token :func:`quiet_exit` takes to leave it. What ``np.errstate``'s
    ``__enter__`` does (the current context with every error ignored, set in NumPy's context
    variable), without building the context manager.

    Raises nothing of its own. Upstream: none (see the module doc)."""
    if _make_extobj is None:  # pragma: no cover - see the import
        state = np.errstate(all="ignore")
        state.__enter__()
        return state
    return _extobj_var.set(_make_extobj(all="ignore"))


def quiet_exit(token: Any) -> None:
    """Leave the context :func:`quiet_enter` entered (``np.errstate``'s ``__exit__``), given
    the token it returned; contexts entered later in the same thread must be left first.

    Raises:
        ValueError: ``token`` was made in another context, or already used (NumPy's
            ``ContextVar.reset``). Upstream: none (see the module doc)."""
    if _make_extobj is None:  # pragma: no cover - see the import
        token.__exit__(None, None, None)
    else:
        _extobj_var.reset(token)

"""Public names whose code lives in a private module.

A class or function defined in a private module (``codec/_common.py``, ``reduce/_kernels.py``,
...) and exported by a public one is given the public module as its ``__module__``, so
``help()``, pydoc, Sphinx and pickle name the module users import it from. No upstream
counterpart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["adopt"]


def adopt(module: str, *objects: Any) -> None:
    """Set ``__module__`` of each of ``objects`` to ``module`` (a module's ``__name__``).

    Called once per public module at import; costs nothing afterwards.

    Raises:
        AttributeError: an object whose ``__module__`` cannot be set (a built-in).
    """
    for obj in objects:
        obj.__module__ = module

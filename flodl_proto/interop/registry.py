"""Registry of vector-case handlers, one per ``op`` of the shared vector schema.

A handler takes ``(case, version)`` — the case's JSON object and the protocol version of its
file — and returns normally when this implementation reproduces the case, or raises
:class:`VectorMismatch` naming what differs. Handlers live in ``ops_*.py`` modules of this package
and register themselves with :func:`op`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["OPS", "Handler", "NotImplementedOp", "VectorMismatch", "op"]

#: handler signature: (case JSON object, protocol version of its file) -> None
Handler = Callable[[dict[str, Any], int], None]

#: op name -> handler
OPS: dict[str, Handler] = {}


class VectorMismatch(AssertionError):
    """This implementation's result differs from the vector's (the message says how)."""


class NotImplementedOp(Exception):
    """No handler is registered for the case's ``op``."""


def op(*names: str) -> Callable[[Handler], Handler]:
    """Decorator registering a handler for the vector ``op`` names given."""

    def deco(fn: Handler) -> Handler:
        for n in names:
            OPS[n] = fn
        return fn

    return deco

"""Registry of vector-case handlers, one per ``op`` of the shared vector schema.

A handler takes ``(case, version)`` — the case's JSON object and the protocol version of its
file — and returns normally when this implementation reproduces the case, or raises
:class:`VectorMismatch` naming what differs. Handlers live in ``ops_*.py`` modules of this package
and register themselves with :func:`op`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["EXPECTS", "EXPECT_VALUES", "OPS", "Handler", "NotImplementedOp", "VectorMismatch", "op"]

#: handler signature: (case JSON object, protocol version of its file) -> None
Handler = Callable[[dict[str, Any], int], None]

#: op name -> handler
OPS: dict[str, Handler] = {}

#: the values of a case's ``expect`` in the shared schema: the operation succeeds (``ok``), fails
#: with the case's error (``error``) or finds the input ends before a whole unit (``eof``)
EXPECT_VALUES: tuple[str, ...] = ("ok", "error", "eof")

#: op name -> the ``expect`` values its handler judges (a case expecting another outcome is a
#: mismatch: e.g. a write that succeeds cannot be a case expecting an error)
EXPECTS: dict[str, frozenset[str]] = {}


class VectorMismatch(AssertionError):
    """This implementation's result differs from the vector's (the message says how)."""


class NotImplementedOp(Exception):
    """No handler is registered for the case's ``op``."""


def op(*names: str, expects: tuple[str, ...] = ("ok",)) -> Callable[[Handler], Handler]:
    """Decorator registering a handler for the vector ``op`` names given; ``expects``: the
    ``expect`` values it judges (values of :data:`EXPECT_VALUES`; default: success only)."""
    unknown = set(expects) - set(EXPECT_VALUES)
    if unknown:
        raise ValueError(f"expects: {sorted(unknown)} not in {EXPECT_VALUES}")

    def deco(fn: Handler) -> Handler:
        for n in names:
            OPS[n] = fn
            EXPECTS[n] = frozenset(expects)
        return fn

    return deco

"""Registry of vector-case handlers, one per ``op`` of the shared vector schema.

A handler takes ``(case, version)`` — the case's JSON object and the protocol version of its
file — and returns normally when this implementation reproduces the case, or raises
:class:`VectorMismatch` naming what differs. Handlers live in ``ops_*.py`` modules of this package
and register themselves with :func:`op`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import shown

__all__ = ["EXPECTS", "EXPECT_VALUES", "FIELDS", "OPS", "Handler", "NotImplementedOp",
           "VectorMismatch", "field_problem", "json_name", "kind_problem", "op"]

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

#: the JSON kinds of a case's fields, each a test and the words a problem is told in: ``int`` a
#: whole number (not a boolean), ``string``, ``hex`` a string of whole bytes in hex digits,
#: ``bits`` a string of hex digits (an integer, ``0x`` allowed), ``object``, ``array``
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "string": (lambda v: isinstance(v, str), "a string"),
    "hex": (lambda v: isinstance(v, str) and _is_hex(v), "a string of bytes in hex digits"),
    "bits": (lambda v: isinstance(v, str) and _is_bits(v), "a string of hex digits"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "array": (lambda v: isinstance(v, list), "an array"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
}

#: the objects a case holds whose fields a handler reads (object name -> field name -> kind: a
#: kind of :data:`_KINDS`, an object name of this table, or ``array of KIND``), checked inside
#: as the case's own fields are (``field 'frame.tensors[0].dtype' is missing``); a *Frame*
#: (:func:`~flodl_proto.interop.jsonio.frame_from_json`, ``compare_frame``) and its tensors, a
#: reduction's output, a controller session's outcome, steps and closing reads
OBJECTS: dict[str, dict[str, str]] = {
    "frame": {"kind": "string", "kind_byte": "int", "weight_bits": "bits",
              "tensors": "array of tensor"},
    "tensor": {"dtype": "int", "shape": "array", "nbytes": "int", "elided": "boolean",
               "data": "hex"},
    "output": {"bytes": "hex", "frame": "frame"},
    "controller": {"result": "string"},
    "step": {"conn": "int", "action": "string"},
    "after": {"conn": "int", "bytes": "hex", "closed_by_controller": "boolean"},
}

#: what every error case needs: the error kind and the start of the message it expects
_ERROR_FIELDS: dict[str, str] = {"error_kind": "string", "error_prefix": "string"}

#: op name -> expect value -> the fields (name -> kind of :data:`_KINDS`) its handler reads from
#: a case expecting that outcome; checked before any case runs, so a case without one is a
#: file outside the schema, not a failed case. Objects and arrays are checked as such (those
#: of :data:`OBJECTS` inside too).
FIELDS: dict[str, dict[str, dict[str, str]]] = {}


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def _is_bits(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def field_problem(case: Mapping[str, Any]) -> str | None:
    """Why ``case`` (an object whose ``op`` and ``expect`` are known good) lacks a field its
    op's handler reads, or has one of another JSON kind (``field 'bytes' is missing``, ``field
    'frame' is the string '00', not an object``), or None (also for an op no handler is
    registered for: that case is reported as not implemented)."""
    need = FIELDS.get(case["op"], {}).get(case["expect"], {})
    for name, kind in need.items():
        problem = kind_problem(case, name, kind)
        if problem is not None:
            return problem
    return None


def kind_problem(case: Mapping[str, Any], name: str, kind: str) -> str | None:
    """Why ``case`` lacks the field ``name`` or holds one of another JSON kind than ``kind`` (a
    kind of :func:`op`'s ``fields``), in the words of :func:`field_problem` (``field 'op' is
    missing``, ``field 'op' is the number 3, not a string``), or None."""
    if name not in case:
        return f"field {name!r} is missing"
    return _value_problem(case[name], name, kind)


def _value_problem(value: Any, path: str, kind: str) -> str | None:
    """Why the JSON ``value`` of the field ``path`` (``frame.tensors[0]``) is not of ``kind``
    (a kind of :data:`_KINDS`, an object of :data:`OBJECTS`, checked field by field, or
    ``array of KIND``, checked item by item), or None."""
    if kind.startswith("array of "):
        if not isinstance(value, list):
            return f"field {path!r} is {_shown(value)}, not an array"
        for i, item in enumerate(value):
            problem = _value_problem(item, f"{path}[{i}]", kind[len("array of "):])
            if problem is not None:
                return problem
        return None
    if kind in OBJECTS:
        if not isinstance(value, dict):
            return f"field {path!r} is {_shown(value)}, not an object"
        for name, inner in OBJECTS[kind].items():
            if name not in value:
                return f"field {f'{path}.{name}'!r} is missing"
            problem = _value_problem(value[name], f"{path}.{name}", inner)
            if problem is not None:
                return problem
        return None
    test, words = _KINDS[kind]
    if not test(value):
        return f"field {path!r} is {_shown(value)}, not {words}"
    return None


def _known_kind(kind: str) -> bool:
    """Is ``kind`` a kind :func:`op`'s ``fields`` may name?"""
    while kind.startswith("array of "):
        kind = kind[len("array of "):]
    return kind in _KINDS or kind in OBJECTS


def _shown(value: Any) -> str:
    """A JSON value in a problem's words: ``the string '12zz'``, ``the number 3``, ``an
    array``, ``an object``, ``true``, ``null``; a long string or a number of many digits as
    :func:`~flodl_proto.errors.shown` shows it (by its ends and length, by its size)."""
    if isinstance(value, str):
        return f"the string {shown(value)}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {shown(value)}"
    name = json_name(value)
    return f"an {name}" if isinstance(value, list | dict) else name


#: the JSON name of each kind of value :func:`json.loads` returns
_JSON_NAMES: dict[type, str] = {list: "array", dict: "object", str: "string", int: "number",
                                float: "number", bool: "boolean", type(None): "null"}


def json_name(value: Any) -> str:
    """The JSON name of ``value``'s kind (``array``, ``object``, ``string``, ``number``,
    ``boolean``, ``null``; ``value`` for anything :func:`json.loads` does not return)."""
    return _JSON_NAMES.get(type(value), "value")


class VectorMismatch(AssertionError):
    """This implementation's result differs from the vector's (the message says how)."""


class NotImplementedOp(Exception):
    """No handler is registered for the case's ``op``."""


def op(*names: str, expects: tuple[str, ...] = ("ok",), fields: Mapping[str, str] | None = None,
       ok_fields: Mapping[str, str] | None = None) -> Callable[[Handler], Handler]:
    """Decorator registering a handler for the vector ``op`` names given.

    Args:
        expects: the ``expect`` values it judges (values of :data:`EXPECT_VALUES`; default:
            success only).
        fields: the fields (name -> kind: ``int``, ``string``, ``hex``, ``bits``, ``object``,
            ``array``, ``boolean``, an object of :data:`OBJECTS` such as ``frame``, checked
            inside, or ``array of KIND``) it reads from every case; an error case's
            ``error_kind`` and
            ``error_prefix`` are added.
        ok_fields: the fields it reads from a case expecting success only.

    Raises:
        ValueError: an ``expect`` value or a field kind outside the schema (a programming error
            of a handler module).
    """
    unknown = set(expects) - set(EXPECT_VALUES)
    if unknown:
        raise ValueError(f"expects: {sorted(unknown)} not in {EXPECT_VALUES}")
    common, ok_only = dict(fields or {}), dict(ok_fields or {})
    bad = {k for k in (*common.values(), *ok_only.values()) if not _known_kind(k)}
    if bad:
        raise ValueError(f"field kinds {sorted(bad)} not in {sorted(_KINDS)} or "
                         f"{sorted(OBJECTS)}")
    need = {e: {**common, **(ok_only if e == "ok" else {}),
                **(_ERROR_FIELDS if e == "error" else {})} for e in expects}

    def deco(fn: Handler) -> Handler:
        for n in names:
            OPS[n] = fn
            EXPECTS[n] = frozenset(expects)
            FIELDS[n] = need
        return fn

    return deco

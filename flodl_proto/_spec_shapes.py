"""The shapes of the spec files: one table per file (``wire.yaml``, ``lifecycle.yaml``,
``conformance.yaml``) giving every key a section, an entry, a field, a state, a transition or a
conformance case may hold, which of them are required and each value's type, and the one walker
that checks a parsed file against its table.

Split from :mod:`flodl_proto.spec` along the seam between what a spec file may hold (these
tables, checked once per load) and what the package reads from it (the catalogue, the constants,
the lifecycles). Its errors are :class:`ShapeError`; :mod:`flodl_proto.spec` raises them as its
``SpecError``, the conformance catalogue's loader (:mod:`flodl_proto.conform.catalogue`) as its
``CatalogueError``. No upstream counterpart (upstream's protocol constants and layouts are code).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

__all__ = ["CONFORMANCE_ACTIONS", "CONSTANT_TYPES", "LIFECYCLE_KEYS", "LIFECYCLE_SHAPE",
           "WIRE_KEYS", "WIRE_SHAPE", "ShapeError", "check_constant_types", "check_sections",
           "check_shape", "check_top_level", "conformance_shape", "kind_name"]


class ShapeError(ValueError):
    """A spec file's value has another shape than its table gives: one line naming the file and
    the value's path (:mod:`flodl_proto.spec` raises it as ``SpecError``)."""


# -- the shapes of the spec files, one table per file ------------------------------------------
# A shape is a leaf type (``int``: an integer, not a bool; ``float``: a number, integer or not;
# ``str``; ``bool``; ``None``: null; ``object``: any value, whose shape its reader checks), a
# tuple of shapes (any one of them), or one of the three containers below; :func:`check_shape`
# walks a document against it.


class _Rec(NamedTuple):
    """A mapping of fixed keys: every ``required`` one, any of the ``optional`` ones, no other
    (a misspelt key would be read as nothing)."""

    required: Mapping[Any, Any]
    optional: Mapping[Any, Any] = {}


class _Map(NamedTuple):
    """A mapping of names of the file's choosing (constants, errors, states...) to ``values``;
    each name of type ``keys`` (a string, unless the names are numbers: versions)."""

    values: Any
    keys: Any = str


class _List(NamedTuple):
    """A list of ``items``."""

    items: Any


class _Ref(NamedTuple):
    """The shape named ``name`` in :data:`_NAMED_SHAPES` (a state holds states)."""

    name: str


_TEXTS: Final = _List(str)
#: a message field (``messages.*.fields``, ``messages.*.parts[].fields``)
_FIELD: Final = _Rec({"name": str, "type": str, "size": (int, str), "doc": str},
                     {"offset": int, "const": str, "enum": str, "condition": str})
_DEPARTURE: Final = _Rec({"id": str, "ours": str, "upstream": str})

#: the shape of ``wire.yaml`` (schema ``flodl-proto-spec/1``): every top-level section is required
WIRE_SHAPE: Final = _Rec({
    "schema": str,
    "title": str,
    "upstream": _Rec({"repository": str, "mirror": str, "base_path": str}),
    "versions": _Rec({"default": int, "supported": _List(int)}, {"notes": _Map(str, int)}),
    "types": _Map(_Rec({"doc": str, "size": (int, None)})),
    "constants": _Map(_Rec({"value": int, "type": str, "doc": str, "source": str})),
    "timeouts": _Map(_Rec({"doc": str, "source": str}, {
        "seconds": float, "scaled": bool, "attempts": int, "probes": int, "option": str,
        "env": str, "default": float, "minimum": float, "maximum": float})),
    "enums": _Map(_Rec({"doc": str, "source": str, "values": _Map(_Rec(
        {"code": int}, {"constant": str, "direction": str, "doc": str, "element_size": int}))})),
    "messages": _Map(_Rec(
        {"title": str, "leg": str, "direction": str, "auth": str, "source": str},
        {"doc": str, "struct": str, "size": int, "fields": _List(_FIELD),
         "parts": _List(_Rec({"name": str, "repeat": str, "fields": _List(_FIELD)},
                             {"struct": str})),
         "kinds": _Map(_Rec({"payload": str, "on_data_channel": str})),
         "encoding": _Rec({"name": str, "rules": _TEXTS, "markers": _Rec(
             {"single_byte_max": int, "u16": int, "u32": int, "u64": int, "u128": int})}),
         "variants": _List(_Rec({
             "name": str, "index": int,
             "fields": _List(_Rec({"name": str, "type": str, "doc": str,
                                   "versions": _List(int)})),
             "example": _Map(_Rec({"value": str, "bytes": str}), (int, str))}))})),
    "auth": _Rec({"algorithm": str, "printed_as": str, "coverage": _Map(str),
                  "notes": _TEXTS}),
    "end_of_stream": _List(_Rec({"where": str, "rule": str}, {"source": str})),
    "leniencies": _List(_Rec({"id": str, "field": str, "rule": str, "checked_at": str,
                              "message": str})),
    "version_differences": _List(_Rec({"aspect": str, "v2": str, "v3": str})),
    "departures": _List(_DEPARTURE),
    "topology": _Rec({
        "doc": str, "diagram": str, "conventions": _TEXTS,
        "roles": _List(_Rec({"name": str, "doc": str, "source": str})),
        "legs": _List(_Rec({"name": str, "between": str, "transport": str, "source": str,
                            "messages": _TEXTS, "sequence": _TEXTS}))}),
    "examples": _Map(_Rec(
        {"title": str, "message": str, "version": (int, str), "salt": (str, None),
         "vector": str,
         "fields": _List(_Rec({"field": str, "bytes": str, "value": str})),
         "tags": _List(_Rec({"field": str, "covers": _List(_List(int)), "hmac": str}))},
        {"doc": str, "steps": _TEXTS})),
    "errors": _Map(_Rec({"kind": str, "side": str, "template": str}, {"source": str})),
    "semantics": _Map(_Rec(
        {"title": str, "doc": str, "rules": _TEXTS, "source": str},
        {"example": _Rec({
            "title": str, "frames": _List(_Rec({"weight": float, "values": _List(float)})),
            "sum": _List(float), "sum_hex": str, "weight": float, "inv_hex": str,
            "consensus_hex": str})})),
})

#: the words a constant's ``type`` (``constants.*.type`` of ``wire.yaml``) may be: ``u32`` the
#: value of a u32 field (a magic, a version), ``size`` a fixed length in bytes, ``count`` a bound
#: on a number of things, ``bytes`` a bound or step in bytes, ``port`` a TCP port or an offset
#: added to one. The reference writes a ``u32`` above 0xFFFF in hex with its bytes, a ``bytes``
#: one with its size in KiB/MiB/GiB, and lists the ``count`` and ``bytes`` ones among the limits
CONSTANT_TYPES: Final = frozenset({"u32", "size", "count", "bytes", "port"})

#: one or several callback or guard names (python-statemachine takes either)
_NAMES: Final = (str, _List(str))
#: a transition of python-statemachine's definition format
_TRANSITION: Final = _Rec({}, {
    "target": (str, None), "event": (str, None), "internal": bool, "initial": bool,
    "validators": _NAMES, "cond": _NAMES, "unless": _NAMES, "on": _NAMES, "before": _NAMES,
    "after": _NAMES})
#: the shapes :class:`_Ref` names
_NAMED_SHAPES: Final[Mapping[str, Any]] = {
    # a state of python-statemachine's definition format; YAML 1.1 reads an unquoted `on` key
    # as True, and both spellings are read (lifecycle_transitions)
    "state": _Rec({}, {
        "name": str, "initial": bool, "final": bool, "parallel": bool, "enter": _NAMES,
        "exit": _NAMES, "states": _Map(_Ref("state")), "on": _Map(_List(_TRANSITION)),
        True: _Map(_List(_TRANSITION)), "transitions": _List(_TRANSITION)}),
}

#: the shape of ``lifecycle.yaml`` (schema :data:`flodl_proto.spec.LIFECYCLE_SCHEMA`): a
#: machine's descriptive keys (``x-docs-keys``), its python-statemachine class options and its
#: states
LIFECYCLE_SHAPE: Final = _Rec({}, {
    "schema": str,
    "x-docs-keys": _TEXTS,
    "machines": _Map(_Rec({"states": _Map(_Ref("state"))}, {
        "machine": str, "doc": str, "guards": _Map(str), "events": _Map(str),
        "outcomes": _Map(str), "departures": _List(_DEPARTURE),
        "allow_event_without_transition": bool, "catch_errors_as_events": bool})),
})

#: the actions of a conformance case's step (a step is a mapping of exactly one of them to its
#: argument, whose shape the kit's player and builders check, naming the case and the step)
CONFORMANCE_ACTIONS: Final = (
    "connect", "accept", "send", "expect", "expect_hello", "expect_close", "expect_silence",
    "expect_no_reply", "close", "stop_reading", "sleep", "signal", "expect_exit")
_STEPS: Final = _List(_Rec({}, dict.fromkeys(CONFORMANCE_ACTIONS, object)))


@functools.cache
def conformance_shape(versions: tuple[int, ...]) -> _Rec:
    """The shape of ``conformance.yaml`` (schema ``flodl-proto-conformance/1``) for a package
    that speaks the protocol ``versions``: its ``vector_cases`` groups (a vector file, an id
    prefix, and a catalogue entry per vector case), its ``cases`` (their keys and types, a step
    per list item, ``steps_vN`` for each version N) and nothing else. The values (a level, a
    need, a version, an error id) are the loader's to check.

    No upstream counterpart: upstream has no conformance kit.
    """
    return _Rec({"schema": str}, {
        "vector_cases": _List(_Rec(
            {"file": str, "id_prefix": str, "cases": _Map(_Rec(
                {"section": str},
                {"title": str, "error": (str, None), "level": str, "needs": _List(str)}))},
            {"role": str, "level": str})),
        "cases": _List(_Rec(
            {"id": str, "title": str, "section": str, "level": str, "steps": _STEPS},
            {"error": (str, None), "versions": _List(int), "needs": _List(str),
             "world_size": int, "ranks": _List(int),
             **{f"steps_v{v}": _STEPS for v in versions}})),
    })


#: the top-level keys of a ``wire.yaml`` of schema ``flodl-proto-spec/1``
WIRE_KEYS: Final = frozenset(WIRE_SHAPE.required)

#: the top-level keys of a ``lifecycle.yaml`` of schema :data:`flodl_proto.spec.LIFECYCLE_SCHEMA`
LIFECYCLE_KEYS: Final = frozenset(LIFECYCLE_SHAPE.optional)

#: how an error line names what a shape expects
_LEAF_NAMES: Final[Mapping[Any, str]] = {
    int: "an integer", float: "a number", str: "a string", bool: "true or false",
    None: "null", object: "any value"}


def _expected(shape: Any) -> str:
    """What ``shape`` expects, as an error line says it (``an integer``, ``a mapping``, ``an
    integer or null``)."""
    if type(shape) is tuple:  # a union (the containers are tuples of their own type)
        return " or ".join(dict.fromkeys(_expected(s) for s in shape))
    if isinstance(shape, _Ref):
        return _expected(_NAMED_SHAPES[shape.name])
    if isinstance(shape, _Rec | _Map):
        return "a mapping"
    if isinstance(shape, _List):
        return "a list"
    return _LEAF_NAMES[shape]


def _fits(value: Any, shape: Any) -> bool:
    """Is ``value`` of ``shape``'s kind (its own type; not what it holds)?"""
    if type(shape) is tuple:
        return any(_fits(value, s) for s in shape)
    if isinstance(shape, _Ref):
        return _fits(value, _NAMED_SHAPES[shape.name])
    if isinstance(shape, _Rec | _Map):
        return isinstance(value, dict)
    if isinstance(shape, _List):
        return isinstance(value, list)
    if shape is None:
        return value is None
    if shape is object:
        return True
    if shape is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, shape) and (shape is bool or not isinstance(value, bool))


def _inner(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def check_shape(value: Any, shape: Any, name: str, path: str) -> None:
    """Refuse ``value``, found at ``path`` of the spec file ``name``, unless it has ``shape``
    (one of the shape tables' entries, ``WIRE_SHAPE``, ``LIFECYCLE_SHAPE`` or
    :func:`conformance_shape`'s), all the way down.

    Raises:
        ShapeError: one line naming the file and the path of the first value that does not fit:
            ``wire.yaml: types.u8.size is the string 'one', not an integer``, ``wire.yaml:
            messages.handshake: unknown key 'bogus' (known: auth, ...)``, ``wire.yaml:
            constants.AUTH_TAG_LEN: missing key 'value'``.

    No upstream counterpart (upstream's protocol constants and layouts are code).
    """
    if isinstance(shape, _Ref):
        shape = _NAMED_SHAPES[shape.name]
    if not _fits(value, shape):
        raise ShapeError(f"{name}: {path} is {kind_name(value)}, not {_expected(shape)}")
    if type(shape) is tuple:
        shape = next(s for s in shape if _fits(value, s))
    if isinstance(shape, _Rec):
        for key in value:
            if key not in shape.required and key not in shape.optional:
                known = ", ".join(sorted(k for k in [*shape.required, *shape.optional]
                                         if isinstance(k, str)))  # not YAML 1.1's `on`
                raise ShapeError(f"{name}: {path}: unknown key {key!r} (known: {known})")
        for key in shape.required:
            if key not in value:
                raise ShapeError(f"{name}: {path}: missing key {key!r}")
        for key, item in value.items():
            inner = shape.required[key] if key in shape.required else shape.optional[key]
            check_shape(item, inner, name, _inner(path, key))
    elif isinstance(shape, _Map):
        for key, item in value.items():
            if not _fits(key, shape.keys):  # 1 and '1' are two keys the docs both show as 1
                raise ShapeError(f"{name}: {path}: a key is {kind_name(key)}, not "
                                 f"{_expected(shape.keys)}")
            check_shape(item, shape.values, name, _inner(path, key))
    elif isinstance(shape, _List):
        for i, item in enumerate(value):
            check_shape(item, shape.items, name, f"{path}[{i}]")


def check_top_level(doc: Mapping[Any, Any], name: str, known: frozenset[str]) -> None:
    """Refuse a top-level key of the spec file ``name`` that is none of ``known`` (a section's
    name misspelt would be read as nothing).

    Raises:
        ShapeError: one line naming the file, the first unknown key and the known ones.
    """
    for key in doc:
        if key not in known:
            raise ShapeError(f"{name}: unknown top-level key {key!r} (known: "
                            f"{', '.join(sorted(known))})")


_KIND_NAMES: Final[Mapping[type, str]] = {str: "a string", dict: "a mapping", list: "a list"}


def kind_name(value: object) -> str:
    """How a spec value reads in an error line: ``null``, ``a list``, ``the string 'x'``...; a
    value of another Python type (YAML's ``!!binary``, ``!!set``, a date) by its type's name,
    ``a value of type bytes``, which reads right whatever the name sounds like."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, bool | int | float):
        return f"the number {value!r}" if not isinstance(value, bool) else f"{value!r}"
    return _KIND_NAMES.get(type(value), f"a value of type {type(value).__name__}")


def check_sections(raw: Mapping[str, Any]) -> None:
    """Refuse a ``wire.yaml`` whose top-level section is missing or holds another kind of
    value than ``WIRE_SHAPE`` gives (the docs would leave a chapter out, or stop on it with a
    traceback); what the sections hold is checked next (:func:`check_shape`).

    Raises:
        ShapeError: one line naming the first such section and what it holds.
    """
    for name, shape in WIRE_SHAPE.required.items():
        if name not in raw:
            raise ShapeError(f"wire.yaml: missing section {name!r}")
        if not _fits(raw[name], shape):
            raise ShapeError(f"wire.yaml: section {name!r} is {kind_name(raw[name])}, not "
                            f"{_expected(shape)}")


def check_constant_types(constants: Mapping[str, Any]) -> None:
    """Refuse a constant of ``wire.yaml`` (``constants``, already of its shape) whose ``type``
    is none of :data:`CONSTANT_TYPES` (a misspelt ``bytes`` or ``count`` would drop it from the
    reference's limits, a ``u32`` lose its hex form), or whose ``value`` is out of its type's
    range: a ``u32`` in 0..4294967295, a ``port`` in 0..65535, the others a whole number >= 0
    (a u32 above the range stopped the reference's byte rendering with a traceback, and a
    negative one was documented as is).

    Raises:
        ShapeError: one line naming the first such constant, its word and the known ones:
            ``wire.yaml: constant MUX_HEADER_LEN: type 'sise' is not a constant's type (bytes,
            count, port, size, u32)``; or its value and its type's range: ``wire.yaml:
            constant MUX_RECORD_MAGIC: value -1 is not a u32 (0..4294967295)``.
    """
    for name, entry in constants.items():
        kind = entry["type"]
        if kind not in CONSTANT_TYPES:
            raise ShapeError(f"wire.yaml: constant {name}: type {kind!r} is not a "
                             f"constant's type ({', '.join(sorted(CONSTANT_TYPES))})")
        top, bound = _CONSTANT_RANGES.get(kind, (None, "a whole number >= 0"))
        value = entry["value"]
        if value < 0 or (top is not None and value > top):
            raise ShapeError(f"wire.yaml: constant {name}: value {value} is not a {kind} "
                             f"({bound})")


#: the largest value of a constant's type and how its range reads, where it has a largest value
_CONSTANT_RANGES: Final[Mapping[str, tuple[int, str]]] = {
    "u32": (0xFFFF_FFFF, "0..4294967295"), "port": (0xFFFF, "0..65535")}

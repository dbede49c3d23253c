"""Registry of vector-case handlers, one per ``op`` of the shared vector schema.

A handler takes ``(case, version)`` — the case's JSON object and the protocol version of its
file — and returns normally when this implementation reproduces the case, or raises
:class:`VectorMismatch` naming what differs. Handlers live in ``ops_*.py`` modules of this package
and register themselves with :func:`op`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ..codec.mux import RecordKind
from ..codec.round_frame import RoundKind
from ..errors import shown

__all__ = ["CHECKS", "EXPECTS", "EXPECT_VALUES", "FIELDS", "OBJECTS", "OPS", "VARIANTS", "Handler",
           "NotImplementedOp", "VectorMismatch", "field_problem", "json_name", "kind_problem",
           "op", "shown_value"]

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

def _bits_test(width: int) -> Callable[[Any], bool]:
    """The test of a ``width``-bit pattern written as the vectors write it (:func:`_is_bits`)."""
    return lambda v: isinstance(v, str) and _is_bits(v, width)


#: the JSON kinds of a case's fields, each a test and the words a problem is told in: ``int`` a
#: whole number (not a boolean), ``number`` any number (not a boolean), ``u8`` / ``u32`` a
#: whole number a wire field of that width holds, ``round_kind`` / ``record_kind`` a round
#: frame's / mux record's kind byte, ``string``, ``hex`` a string of whole bytes in lowercase
#: hex digits (two a byte, nothing between them: the schema's way of writing bytes; not
#: ``AB``, ``ab cd`` or ``abc``), ``bits`` ``0x`` and lowercase hex digits (an
#: integer), ``bits16`` / ``bits32`` / ``bits64`` ``0x`` and exactly 4 / 8 / 16 of them (the
#: bit pattern of a bf16, f32, f64, as the vectors README writes it), ``object``, ``array``,
#: ``boolean``
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: _is_int(v), "a whole number"),
    "number": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "u8": (lambda v: _is_int(v) and 0 <= v <= 0xFF, "a whole number from 0 to 255"),
    "u32": (lambda v: _is_int(v) and 0 <= v <= 0xFFFF_FFFF,
            "a whole number from 0 to 4294967295"),
    "round_kind": (lambda v: _is_int(v) and v in set(RoundKind),
                   "a round kind byte (" + ", ".join(f"{int(k)} {k.name.lower()}"
                                                     for k in RoundKind) + ")"),
    "record_kind": (lambda v: _is_int(v) and v in set(RecordKind),
                    "a record kind byte (" + ", ".join(f"{int(k)} {k.name.lower()}"
                                                       for k in RecordKind) + ")"),
    "string": (lambda v: isinstance(v, str), "a string"),
    "hex": (lambda v: isinstance(v, str) and _is_hex(v),
            "a string of bytes in lowercase hex digits"),
    "bits": (lambda v: isinstance(v, str) and _is_bits(v),
             "a string of '0x' and lowercase hex digits"),
    **{f"bits{n}": (_bits_test(n), f"a string of '0x' and {n // 4} lowercase hex digits (a "
                    f"{n}-bit pattern)")
       for n in (16, 32, 64)},
    "object": (lambda v: isinstance(v, dict), "an object"),
    "array": (lambda v: isinstance(v, list), "an array"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
}

#: the kinds of :data:`_KINDS` that are some values of another (kind -> that kind): a value
#: not even of the other is told in its words (``the string '4', not a whole number``, ``the
#: number -1, not a whole number from 0 to 255``)
_BASE_KINDS: dict[str, str] = {"u8": "int", "u32": "int", "round_kind": "int",
                               "record_kind": "int", "bits16": "bits", "bits32": "bits",
                               "bits64": "bits"}

#: the objects a case holds whose fields a handler reads (object name -> field name -> kind: a
#: kind of :data:`_KINDS`, an object name of this table, ``array of KIND`` or ``null or KIND``;
#: a name ending in ``?`` is a field checked only when present), checked inside as the case's
#: own fields are (``field 'frame.tensors[0].dtype' is missing``); a *Frame*
#: (:func:`~flodl_proto.interop.jsonio.frame_from_json`, ``compare_frame``) and its tensors, a
#: *Record* and its control message (``record_from_json``), a reduction's inputs and output, a
#: controller session's outcome, steps and closing reads, a relay fold's steps and records, a
#: dead-rank ledger's steps
OBJECTS: dict[str, dict[str, str]] = {
    "frame": {"kind": "string", "kind_byte": "round_kind", "weight_bits": "bits64",
              "weight?": "null or number", "tensors": "array of tensor"},
    "tensor": {"dtype": "u8", "shape": "array of u32", "nbytes": "int", "elided": "boolean",
               "data": "hex", "values?": "array of number"},
    "record": {"kind_byte": "record_kind"},
    "control": {"variant": "string"},
    "input": {"bytes": "hex", "frame?": "frame"},
    "output": {"bytes": "hex", "frame": "frame"},
    "controller": {"result": "string", "exited_before_client_close?": "boolean",
                   "error_prefix?": "string", "error_kind?": "string", "error?": "string"},
    # a session expecting an error: the start of the controller's error is read
    "controller_error": {"result": "string", "exited_before_client_close?": "boolean",
                         "error_prefix": "string", "error_kind?": "string", "error?": "string"},
    # a connection's number is a label only: any whole number
    "step": {"conn": "int", "action": "string"},
    "after": {"conn": "int", "bytes": "hex", "closed_by_controller": "boolean"},
    "fold_step": {"step": "string"},
    "fold_record": {"kind_byte": "int", "payload": "hex", "frame?": "frame",
                    "record_bytes?": "hex"},
    "ledger_step": {"call": "string"},
}

#: the objects of :data:`OBJECTS` whose further fields depend on the value of one of theirs
#: (object name -> (that field, each value it may hold -> the further fields)); a value not
#: listed is a problem (``field 'steps[3].action' is the string 'jump', not one of 'connect',
#: ...``)
VARIANTS: dict[str, tuple[str, dict[Any, dict[str, str]]]] = {
    "record": ("kind_byte", {int(RecordKind.DATA): {"rank": "u32", "payload": "hex"},
                             int(RecordKind.CONTROL): {"control": "control"},
                             int(RecordKind.HOST_FRAME): {"rank?": "u32", "payload": "hex"},
                             int(RecordKind.BROADCAST): {"rank?": "u32", "payload": "hex"}}),
    "control": ("variant", {"Hello": {"host": "string", "ranks": "array of u32",
                                      "model_sigs?": "array of hex"},
                            "HelloAck": {}, "RankExit": {"rank": "u32"},
                            "DeclareDead": {"rank": "u32"}}),
    "step": ("action", {"connect": {}, "send": {"bytes": "hex"}, "recv": {"bytes": "hex"},
                        "close": {}}),
    # any whole number: the last step of an error case may be a rank the fold refuses
    "fold_step": ("step", {"deposit": {"rank": "int", "blob": "hex"},
                           "declare_dead": {"rank": "int"}}),
    # a query's expected answer (``result``) is of the kind the ledger answers it in
    "ledger_step": ("call", {"declare_dead": {"rank": "u32"},
                             "is_dead": {"rank": "u32", "result?": "boolean"},
                             "dead_count": {"result?": "int"},
                             "world_size": {"result?": "int"}}),
}

#: what every error case needs: the error kind and the start of the message it expects (and
#: may hold: the whole message, a description shown when no error came)
_ERROR_FIELDS: dict[str, str] = {"error_kind": "string", "error_prefix": "string",
                                 "error?": "string"}

#: op name -> expect value -> the fields (name -> kind of :data:`_KINDS`) its handler reads from
#: a case expecting that outcome; checked before any case runs, so a case without one is a
#: file outside the schema, not a failed case. Objects and arrays are checked as such (those
#: of :data:`OBJECTS` inside too).
FIELDS: dict[str, dict[str, dict[str, str]]] = {}

#: op name -> a check of a case beyond its fields' kinds (a count its handler bounds, a field
#: an outcome needs), run after those of :data:`FIELDS`: the problem in their words, or None
CHECKS: dict[str, Callable[[Mapping[str, Any]], str | None]] = {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: whole bytes in lowercase hex digits, as the shared schema writes bytes (``bytes.fromhex``
#: would also take upper case digits and white space between bytes)
_HEX_BYTES = re.compile(r"(?:[0-9a-f]{2})*")


def _is_hex(text: str) -> bool:
    """Is ``text`` whole bytes in lowercase hex digits, two a byte and nothing else (the empty
    string: no byte)?"""
    return _HEX_BYTES.fullmatch(text) is not None


#: an integer as the vectors write bit patterns: ``0x`` and lowercase hex digits (``int(text,
#: 16)`` would also take no prefix, upper case, ``_`` and blanks)
_HEX_BITS = re.compile(r"0x([0-9a-f]+)")


def _is_bits(text: str, width: int | None = None) -> bool:
    """Is ``text`` ``0x`` and lowercase hex digits (exactly ``width / 4`` of them when ``width``
    is given: the README's f64 / f32 / bf16 bit patterns of 16 / 8 / 4 digits)?"""
    m = _HEX_BITS.fullmatch(text)
    return m is not None and (width is None or len(m.group(1)) == width // 4)


#: the bit-pattern kinds of :data:`_KINDS` -> their width in bits (None: any number of digits)
_BIT_WIDTHS: dict[str, int | None] = {"bits": None, "bits16": 16, "bits32": 32, "bits64": 64}

#: at most this many offending characters are named by :func:`_bits_flaws`
_FLAW_CHARS = 3


def _named_chars(chars: list[str]) -> str:
    """The distinct characters ``chars``, each quoted as :func:`~flodl_proto.errors.shown`
    quotes a value, joined by commas; past :data:`_FLAW_CHARS` of them, ``...`` ends the list."""
    named = ", ".join(shown(c) for c in chars[:_FLAW_CHARS])
    return named + (", ..." if len(chars) > _FLAW_CHARS else "")


def _bits_flaws(text: str, width: int | None) -> str:
    """What keeps ``text`` (a string that is not a bit pattern as :func:`_is_bits` reads one,
    ``width`` bits wide or any width when None) from being one, each flaw named, joined by
    ``; ``: a prefix other than ``0x`` (``its prefix is '0X', not '0x'``, ``it has no '0x'
    prefix``), upper-case digits (``its digit 'F' is upper case``), characters that are no hex
    digit (``' ' is not a hex digit``), the count of digits (``it has 17 digits``, ``it has no
    digits``). The digits are what follows ``0x`` or ``0X``, or the whole text without either.

    No upstream counterpart (the vectors README describes the format; the generator writes it)."""
    flaws = []
    if text[:2] == "0x":
        digits = text[2:]
    elif text[:2] == "0X":
        flaws.append("its prefix is '0X', not '0x'")
        digits = text[2:]
    else:
        flaws.append("it has no '0x' prefix")
        digits = text
    flaws.extend(_digit_flaws(digits))
    if not digits:
        flaws.append("it has no digits")
    elif (width is not None and len(digits) != width // 4
          and not any(c not in _HEX_DIGITS for c in digits)):
        flaws.append(f"it has {len(digits)} digit{'' if len(digits) == 1 else 's'}")
    return "; ".join(flaws)


#: the characters that are hex digits, either case
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _digit_flaws(digits: str) -> list[str]:
    """The flaws of the characters of ``digits`` (the digits of a bit pattern or of bytes):
    upper-case hex digits (``its digit 'F' is upper case``, ``its digits 'A', 'B' are upper
    case``) and characters that are no hex digit (``' ' is not a hex digit``), each named as
    :func:`_named_chars` names them; an empty list when every character is a lowercase hex
    digit. Shared by :func:`_bits_flaws` and :func:`_hex_flaws`."""
    flaws = []
    upper = list(dict.fromkeys(c for c in digits if c in "ABCDEF"))
    other = list(dict.fromkeys(c for c in digits if c not in _HEX_DIGITS))
    if len(upper) == 1:
        flaws.append(f"its digit {_named_chars(upper)} is upper case")
    elif upper:
        flaws.append(f"its digits {_named_chars(upper)} are upper case")
    if len(other) == 1:
        flaws.append(f"{_named_chars(other)} is not a hex digit")
    elif other:
        flaws.append(f"{_named_chars(other)} are not hex digits")
    return flaws


def _hex_flaws(text: str) -> str:
    """What keeps ``text`` (a string that is not whole bytes as :func:`_is_hex` reads them)
    from being bytes as the vectors write them, each flaw named, joined by ``; ``: a ``0x`` or
    ``0X`` prefix (``it has a '0x' prefix (bytes take none)``), upper-case digits (``its digit
    'C' is upper case``), characters that are no hex digit (``' ' is not a hex digit``), an odd
    count of digits (``it has an odd number of digits (31)``, told only when every character
    is a hex digit). The digits are what follows the prefix, or the whole text without one.

    No upstream counterpart (the vectors README describes the format; the generator writes it)."""
    flaws = []
    digits = text
    if text[:2] in ("0x", "0X"):
        flaws.append(f"it has a {shown(text[:2])} prefix (bytes take none)")
        digits = text[2:]
    flaws.extend(_digit_flaws(digits))
    if not any(c not in _HEX_DIGITS for c in digits) and len(digits) % 2:
        flaws.append(f"it has an odd number of digits ({len(digits)})")
    return "; ".join(flaws)


def field_problem(case: Mapping[str, Any]) -> str | None:
    """Why ``case`` (an object whose ``op`` and ``expect`` are known good) lacks a field its
    op's handler reads, or has one of another JSON kind, at any depth (``field 'bytes' is
    missing``, ``field 'frame' is the string '00', not an object``, ``field 'steps[1].action' is
    the string 'jump', not one of 'connect', ...``), or fails its op's further check
    (:data:`CHECKS`: ``field 'steps' holds 100000 steps, more than the 1000 a case may hold``),
    or None (also for an op no handler is registered for: that case is reported as not
    implemented).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    need = FIELDS.get(case["op"], {}).get(case["expect"], {})
    problem = _fields_problem(case, need, "")
    if problem is None and case["op"] in CHECKS:
        problem = CHECKS[case["op"]](case)
    return problem


def kind_problem(case: Mapping[str, Any], name: str, kind: str) -> str | None:
    """Why ``case`` lacks the field ``name`` or holds one of another JSON kind than ``kind`` (a
    kind of :func:`op`'s ``fields``), in the words of :func:`field_problem` (``field 'op' is
    missing``, ``field 'op' is the number 3, not a string``), or None.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    if name not in case:
        return f"field {name!r} is missing"
    return _value_problem(case[name], name, kind)


def _value_problem(value: Any, path: str, kind: str) -> str | None:
    """Why the JSON ``value`` of the field ``path`` (``frame.tensors[0]``) is not of ``kind``
    (a kind of :data:`_KINDS`, an object of :data:`OBJECTS`, checked field by field, or
    ``array of KIND``, checked item by item), or None."""
    if kind.startswith("array of "):
        if not isinstance(value, list):
            return f"field {path!r} is {shown_value(value)}, not an array"
        for i, item in enumerate(value):
            problem = _value_problem(item, f"{path}[{i}]", kind[len("array of "):])
            if problem is not None:
                return problem
        return None
    if kind.startswith("null or "):
        if value is None:
            return None
        inner = kind[len("null or "):]
        if inner in OBJECTS and not isinstance(value, dict):
            return f"field {path!r} is {shown_value(value)}, not an object or null"
        if inner in _KINDS and not _KINDS[inner][0](value):
            return f"field {path!r} is {shown_value(value)}, not {_KINDS[inner][1]} or null"
        return _value_problem(value, path, inner)
    if kind in OBJECTS:
        if not isinstance(value, dict):
            return f"field {path!r} is {shown_value(value)}, not an object"
        problem = _fields_problem(value, OBJECTS[kind], f"{path}.")
        if problem is not None or kind not in VARIANTS:
            return problem
        tag, further = VARIANTS[kind]
        if value[tag] not in further or isinstance(value[tag], bool):
            return (f"field {f'{path}.{tag}'!r} is {shown_value(value[tag])}, not one of "
                    + ", ".join(shown(v) for v in further))
        return _fields_problem(value, further[value[tag]], f"{path}.")
    test, words = _KINDS[kind]
    base = _BASE_KINDS.get(kind)
    if base is not None and not _KINDS[base][0](value):  # not even a number: told as such
        words = _KINDS[base][1]
    if not test(value):
        if kind in _BIT_WIDTHS and isinstance(value, str):  # told what is wrong with it
            return (f"field {path!r} is {shown_value(value)}, not {_KINDS[kind][1]}: "
                    f"{_bits_flaws(value, _BIT_WIDTHS[kind])}")
        if kind == "hex" and isinstance(value, str):  # likewise
            return f"field {path!r} is {shown_value(value)}, not {words}: {_hex_flaws(value)}"
        return f"field {path!r} is {shown_value(value)}, not {words}"
    return None


def _fields_problem(obj: Mapping[str, Any], fields: Mapping[str, str], prefix: str) -> str | None:
    """Why the object ``obj`` (a case, or one at the path ``prefix``, ``frame.``) lacks one of
    ``fields`` (name -> kind; a name ending in ``?`` may be absent) or holds one of another
    kind, or None."""
    for name, kind in fields.items():
        optional = name.endswith("?")
        name = name.rstrip("?")
        if name not in obj:
            if optional:
                continue
            return f"field {f'{prefix}{name}'!r} is missing"
        problem = _value_problem(obj[name], f"{prefix}{name}", kind)
        if problem is not None:
            return problem
    return None


def _known_kind(kind: str) -> bool:
    """Is ``kind`` a kind :func:`op`'s ``fields`` may name?"""
    while kind.startswith(("array of ", "null or ")):
        kind = kind.split(" ", 2)[2]
    return kind in _KINDS or kind in OBJECTS


def shown_value(value: Any) -> str:
    """A JSON value in a problem's words: ``the string '12zz'``, ``the number 3``, ``an
    array``, ``an object``, ``true``, ``null``; a long string or a number of many digits as
    :func:`~flodl_proto.errors.shown` shows it (by its ends and length, by its size).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
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
    ``boolean``, ``null``; ``value`` for anything :func:`json.loads` does not return).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    return _JSON_NAMES.get(type(value), "value")


class VectorMismatch(AssertionError):
    """This implementation's result differs from the vector's (the message says how).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """


class NotImplementedOp(Exception):
    """No handler is registered for the case's ``op``.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """


def op(*names: str, expects: tuple[str, ...] = ("ok",), fields: Mapping[str, str] | None = None,
       ok_fields: Mapping[str, str] | None = None, error_fields: Mapping[str, str] | None = None,
       check: Callable[[Mapping[str, Any]], str | None] | None = None,
       ) -> Callable[[Handler], Handler]:
    """Decorator registering a handler for the vector ``op`` names given.

    Args:
        expects: the ``expect`` values it judges (values of :data:`EXPECT_VALUES`; default:
            success only).
        fields: the fields (name -> kind: a kind of :data:`_KINDS` such as ``int``, ``u32``,
            ``hex``, ``bits``, an object of :data:`OBJECTS` such as ``frame``, checked inside,
            ``array of KIND`` or ``null or KIND``; a name ending in ``?`` is checked only when
            present) it reads from every case; an error case's ``error_kind`` and
            ``error_prefix`` are added.
        ok_fields: the fields it reads from a case expecting success only (they replace a
            field of ``fields`` of the same name).
        error_fields: the fields it reads from a case expecting an error only (likewise).
        check: a further check of a case whose fields are of their kinds (:data:`CHECKS`).

    Raises:
        ValueError: an ``expect`` value or a field kind outside the schema (a programming error
            of a handler module).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    unknown = set(expects) - set(EXPECT_VALUES)
    if unknown:
        raise ValueError(f"expects: {sorted(unknown)} not in {EXPECT_VALUES}")
    common, ok_only = dict(fields or {}), dict(ok_fields or {})
    error_only = dict(error_fields or {})
    bad = {k for k in (*common.values(), *ok_only.values(), *error_only.values())
           if not _known_kind(k)}
    if bad:
        raise ValueError(f"field kinds {sorted(bad)} not in {sorted(_KINDS)} or "
                         f"{sorted(OBJECTS)}")
    need = {e: {**common, **(ok_only if e == "ok" else {}),
                **(_ERROR_FIELDS | error_only if e == "error" else {})} for e in expects}

    def deco(fn: Handler) -> Handler:
        for n in names:
            OPS[n] = fn
            EXPECTS[n] = frozenset(expects)
            FIELDS[n] = need
            if check is not None:
                CHECKS[n] = check
        return fn

    return deco

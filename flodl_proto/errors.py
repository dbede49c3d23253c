"""Protocol errors: one class per error kind, raised as remote or local.

Every error the package raises for protocol reasons is a :class:`ProtocolError`. Two orthogonal
axes classify it:

* **kind** (``error.kind``): the coarse category the golden vectors use — ``auth``, ``limit``,
  ``truncated``, ``version``, ``magic``, ``sequence``, ``schema``, ``value``. One class per kind:
  :class:`AuthenticationError`, :class:`LimitExceeded`, :class:`TruncatedInput`,
  :class:`VersionMismatch`, :class:`BadMagic`, :class:`SequenceError`, :class:`SchemaMismatch`,
  :class:`InvalidValue`.
* **side**: :class:`RemoteProtocolError` when the peer's bytes are at fault,
  :class:`LocalProtocolError` when the caller misused the API.

Both axes work with ``except``: ``except AuthenticationError`` catches a MAC failure from either
side, ``except RemoteProtocolError`` catches every peer fault. Constructing a kind class directly
(``TruncatedInput("...")``) gives the remote variant; pass ``remote=False`` for the local one.

Messages come from the error catalogue in ``spec/wire.yaml`` (:func:`protocol_error`), start with
upstream's wording (so operators can grep for e.g. "HMAC verification failed") and name the field,
the value and the limit.

Upstream: errors are ``TensorError::new(format!(..))`` strings throughout
``flodl/src/distributed/{controller,relay,wire.rs,cpu_reduce.rs}``; the kinds are this project's.
"""

from __future__ import annotations

import numbers
import os
import re
import string
from collections.abc import Mapping
from typing import Any, ClassVar

from .spec import SPEC

__all__ = [
    "KIND_CLASSES",
    "AuthenticationError",
    "BadMagic",
    "InvalidValue",
    "LimitExceeded",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "SchemaMismatch",
    "SequenceError",
    "TruncatedInput",
    "VersionMismatch",
    "protocol_error",
    "shown",
    "shown_file",
    "shown_name",
    "shown_type",
]


class ProtocolError(Exception):
    """Base of every protocol error.

    Attributes:
        kind: the error kind (``"auth"``, ``"limit"``, ... as in the vectors' ``error_kind``).
        remote: True when the peer's bytes are at fault, False for local API misuse.
        error_id: the catalogue id (``spec/wire.yaml`` ``errors``) or ``None`` for ad-hoc errors.
        fields: the values the message was formatted from (field name, value, limit, offset).

    No upstream counterpart: upstream raises every error as an untyped ``TensorError`` string; the
    class hierarchy (base, local/remote) is this package's.
    """

    kind: ClassVar[str] = "protocol"
    remote: bool
    error_id: str | None
    fields: Mapping[str, Any]

    def __new__(
        cls,
        message: str = "",
        *,
        remote: bool = True,
        error_id: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> ProtocolError:
        concrete = _CONCRETE.get((cls, remote), cls)
        return super().__new__(concrete, message)

    def __init__(
        self,
        message: str = "",
        *,
        remote: bool = True,
        error_id: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.remote = remote
        self.error_id = error_id
        self.fields = dict(fields or {})

    @property
    def message(self) -> str:
        """The full human-readable message (also ``str(error)``)."""
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        base = _BASE_OF.get(type(self), type(self))
        return (_rebuild, (base, self.message, self.remote, self.error_id, dict(self.fields)))


def _rebuild(
    base: type[ProtocolError],
    message: str,
    remote: bool,
    error_id: str | None,
    fields: dict[str, Any],
) -> ProtocolError:
    return base(message, remote=remote, error_id=error_id, fields=fields)


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that violate the protocol (bad MAC, truncated frame, wrong magic...).

    No upstream counterpart: upstream raises every error as an untyped ``TensorError`` string; the
    class hierarchy (base, local/remote) is this package's.
    """


class LocalProtocolError(ProtocolError):
    """The caller misused the API (bad argument, event not allowed in the current state...).

    No upstream counterpart: upstream raises every error as an untyped ``TensorError`` string; the
    class hierarchy (base, local/remote) is this package's.
    """


class AuthenticationError(ProtocolError):
    """An auth tag (HMAC-SHA256 truncated to 8 bytes) did not verify. Kind ``auth``.

    Upstream: the "HMAC verification failed" errors of ``controller/round_frame.rs`` (RoundFrame)
    and ``relay/mux.rs`` (MuxRecord); the class is this package's.
    """

    kind = "auth"


class LimitExceeded(ProtocolError):
    """A count or length is over its limit (frame ceiling, tensor-count cap). Kind ``limit``.

    Upstream: the tensor-count cap and frame-ceiling errors of ``controller/round_frame.rs`` and
    ``relay/mux.rs`` (ceiling from ``wire.rs``); the class is this package's.
    """

    kind = "limit"


class TruncatedInput(ProtocolError):
    """Input ended early, or a length prefix and body disagree. Kind ``truncated``.

    Upstream: the "read failed" and "peer closed mid-frame" errors of ``controller/mod.rs``,
    ``controller/round_frame.rs``, ``relay/mux.rs`` and ``cpu_reduce.rs``; the class is this
    package's.
    """

    kind = "truncated"


class VersionMismatch(ProtocolError):
    """A protocol version field differs from the one this side speaks. Kind ``version``.

    Upstream: "handshake protocol_version X != Y" (``controller/mod.rs``), "controller
    protocol_version X != our version Y" (``cpu_reduce.rs``), "record version V != 1"
    (``relay/mux.rs``); the class is this package's.
    """

    kind = "version"


class BadMagic(ProtocolError):
    """A magic number (handshake, frame, record, channel) is wrong. Kind ``magic``.

    Upstream: the "magic 0x... != 0x..." errors of ``controller/mod.rs`` (handshake),
    ``cpu_reduce.rs`` (ack), ``controller/round_frame.rs`` (frame), ``relay/mux.rs`` (record) and
    ``wire.rs`` (``expect_channel_magic``); the class is this package's.
    """

    kind = "magic"


class SequenceError(ProtocolError):
    """A valid message where another was required, or a call with nothing to do. Kind
    ``sequence``.

    Upstream: errors such as "expected relay Hello, got ..." (``controller/mod.rs``) and
    "sum_frames called with no frames" (``controller/round_frame.rs``); the class is this
    package's.
    """

    kind = "sequence"


class SchemaMismatch(ProtocolError):
    """Frames of one round disagree, or a payload's byte count disagrees with its shape. Kind
    ``schema``.

    Upstream: the schema errors of ``sum_frames`` and the reduce in ``controller/round_frame.rs``
    and of the relay fold in ``relay/agent.rs``; the class is this package's.
    """

    kind = "schema"


class InvalidValue(ProtocolError):
    """A field outside its domain (unknown kind/dtype/variant, bad weight, rank out of range...).
    Kind ``value``.

    Upstream: errors such as "unknown RoundKind wire byte" (``controller/round_frame.rs``),
    "unknown record kind" (``relay/mux.rs``) and "relay announced rank R >= world_size W"
    (``controller/mod.rs``); the class is this package's.
    """

    kind = "value"


#: kind name -> kind class
KIND_CLASSES: dict[str, type[ProtocolError]] = {
    c.kind: c
    for c in (
        AuthenticationError,
        LimitExceeded,
        TruncatedInput,
        VersionMismatch,
        BadMagic,
        SequenceError,
        SchemaMismatch,
        InvalidValue,
    )
}

_CONCRETE: dict[tuple[type[ProtocolError], bool], type[ProtocolError]] = {}
_BASE_OF: dict[type[ProtocolError], type[ProtocolError]] = {}
for _kind_cls in KIND_CLASSES.values():
    for _remote, _side in ((True, RemoteProtocolError), (False, LocalProtocolError)):
        _name = ("Remote" if _remote else "Local") + _kind_cls.__name__
        _concrete = type(_name, (_kind_cls, _side), {"__module__": __name__})
        _CONCRETE[(_kind_cls, _remote)] = _concrete
        _BASE_OF[_concrete] = _kind_cls
        # a concrete class constructs itself whatever `remote` says
        _CONCRETE[(_concrete, True)] = _concrete
        _CONCRETE[(_concrete, False)] = _concrete


class _WideInt(int):
    """An integer of more decimal digits than :data:`SHOWN_CHARS` (Python refuses to print one
    of more than ``sys.int_max_str_digits``, 4300), as a message shows it: by its size."""

    def __repr__(self) -> str:
        return f"<{'a negative' if self < 0 else 'an'} integer of {self.bit_length()} bits>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)


class _WideFraction:
    """A fraction (:class:`fractions.Fraction`, any non-integer :class:`numbers.Rational`) whose
    numerator or denominator has more decimal digits than :data:`SHOWN_CHARS`, as a message
    shows it (with or without ``!r``): by the sizes of the two, as :class:`_WideInt` shows an
    integer, ``<a Fraction of 1329 bits over 1 bit>`` for ``Fraction(10**400)``."""

    def __init__(self, value: numbers.Rational) -> None:
        num, den = int(value.numerator), int(value.denominator)
        name = type(value).__name__
        article = "a negative" if num < 0 else "an" if name[:1] in "AEIOUaeiou" else "a"
        self._text = f"<{article} {name} of {_bits(num)} over {_bits(den)}>"

    def __repr__(self) -> str:
        return self._text

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self._text


def _bits(n: int) -> str:
    """``n``'s size as :class:`_WideFraction` names it: ``1329 bits``, ``1 bit``."""
    size = abs(n).bit_length()
    return f"{size} bit{'' if size == 1 else 's'}"


#: the most characters of a text value a message quotes whole, and the most decimal digits of an
#: integer it prints whole; a longer text is shown by its start, its end and its length, a wider
#: integer by its size (:func:`shown`)
SHOWN_CHARS = 80
_SHOWN_HEAD = 40
_SHOWN_TAIL = 20


class _LongText(str):
    """A text value longer than :data:`SHOWN_CHARS`, as a message quotes it (``{value!r}``):
    its first 40 and last 20 characters and its length, ``'aaa...a:99' (5000 characters)``.
    Formatted without ``!r`` it is the whole text (a message's prose, such as a reason)."""

    def __repr__(self) -> str:
        text = str.__str__(self)
        return (f"{text[:_SHOWN_HEAD] + '...' + text[-_SHOWN_TAIL:]!r} "
                f"({len(text)} characters)")


class _LongRepr:
    """A list, tuple, dict, set or bytes value whose ``repr`` is longer than
    :data:`SHOWN_CHARS` characters, as a message shows it (with or without ``!r``, whatever the
    format spec): the first 40 and last 20 characters of its ``repr`` and their count,
    ``[0, 1, 2, ...99998, 99999] (588890 characters)``."""

    def __init__(self, text: str) -> None:
        self._text = (f"{text[:_SHOWN_HEAD]}...{text[-_SHOWN_TAIL:]} "
                      f"({len(text)} characters)")

    def __repr__(self) -> str:
        return self._text

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self._text


#: the containers whose ``str`` is their ``repr``, shown by the ends of it when it is long
_CONTAINERS = (list, tuple, dict, set, frozenset, bytes, bytearray)


def _too_wide(value: int) -> bool:
    """Has ``value`` more than :data:`SHOWN_CHARS` decimal digits? (Without printing it.)"""
    return value.bit_length() > 265 and abs(value) >= 10**SHOWN_CHARS


def _long_integer(sign: str, digits: str) -> int:
    """The integer of ``sign`` and the ASCII ``digits`` (any number of them: ``int()`` takes at
    most 4300), as a :class:`_WideInt` (shown by its size) when it has more
    than :data:`SHOWN_CHARS` digits."""
    digits = digits.lstrip("0") or "0"
    value = 0
    for start in range(0, len(digits), 4000):
        chunk = digits[start:start + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    value = -value if sign == "-" else value
    return _WideInt(value) if len(digits) > SHOWN_CHARS else value


def _printable(value: Any) -> Any:
    """``value`` as a message shows it: every text longer than :data:`SHOWN_CHARS` (also
    inside a tuple or list) quoted by its ends (a :class:`_LongText`), every integer of more
    than :data:`SHOWN_CHARS` digits replaced by a :class:`_WideInt` of it, every fraction
    with a numerator or denominator that wide by a :class:`_WideFraction`, and a container
    (:data:`_CONTAINERS`) whose ``repr`` is still longer than :data:`SHOWN_CHARS` by the ends
    of it (a :class:`_LongRepr`), but a pair (``(host, port)``), whose items are shown so
    already; anything else is ``value`` itself."""
    if isinstance(value, int) and not isinstance(value, bool) and _too_wide(value):
        return _WideInt(value)
    if (isinstance(value, numbers.Rational) and not isinstance(value, numbers.Integral)
            and (_too_wide(int(value.numerator)) or _too_wide(int(value.denominator)))):
        return _WideFraction(value)
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return _LongText(value)
    if type(value) in (tuple, list):
        value = type(value)(_printable(v) for v in value)
    if isinstance(value, _CONTAINERS):
        text = repr(value)
        if len(text) > SHOWN_CHARS and not (type(value) in (tuple, list) and len(value) <= 2):
            return _LongRepr(text)
    return value


def shown(value: Any) -> str:
    """How an error message quotes a bad value: its ``repr``, but a text of more than
    :data:`SHOWN_CHARS` characters by its first 40 and last 20 characters and its length
    (``'999...999' (5000 characters)``), an integer of more than :data:`SHOWN_CHARS` digits by
    its size (``<an integer of 16610 bits>``), a fraction (``fractions.Fraction``) whose
    numerator or denominator has more by their sizes (``<a Fraction of 1329 bits over 1
    bit>`` for ``Fraction(10**400)``), and a list, tuple, dict, set or bytes value whose
    ``repr`` is longer than :data:`SHOWN_CHARS` by the ends of it (``[0, 1, ...99999] (588890
    characters)``), so that a huge value (from a command line, a file) is never echoed whole.
    :func:`protocol_error` quotes its fields so; the command line's own messages use this.

    No upstream counterpart (upstream's messages print their values whole)."""
    return repr(_printable(value))


def shown_name(text: str) -> str:
    """A name a line gives as it is (a path, a vector case's id): ``text`` itself, unless it is
    empty, longer than :data:`SHOWN_CHARS` characters, holds a character that is not printable
    (a line break, an escape) or starts or ends with white space; then quoted as :func:`shown`
    quotes a text (``''``, ``'a\\nb'``, ``'/tmp/aaa...aaa/v2' (5000 characters)``), so that the
    line stays one line and still shows where the name ends.

    No upstream counterpart."""
    if not text or len(text) > SHOWN_CHARS or not text.isprintable() or text != text.strip():
        return shown(text)
    return text


def shown_file(filename: object) -> str:
    """How a line names a file it is about (a path, or the ``filename`` an ``OSError`` gives),
    as every line about a path quotes one (:func:`shown`: ``'my vectors/x.json': Permission
    denied``, as ``argument FILE: 'x.bin': No such file or directory``): a name in bytes
    decoded as the file system encodes names, a path object by its text, any other value (a
    descriptor) by its ``str``. Raises nothing.

    No upstream counterpart."""
    if isinstance(filename, str | bytes | os.PathLike):
        return shown(os.fsdecode(filename))
    return shown(str(filename))


def shown_type(value: Any) -> str:
    """How a message names the type of a value it refuses, after "got": ``None`` for None, else
    the type's name as it is, with no article (``int``, ``str``, ``bytes``, ``object``,
    ``OrderedDict``, ``ndarray``, ``uint8``), as Python's own messages name a type (``must be
    str, not int``), so that ``got {got}`` reads right whatever the name sounds like: ``got
    int``, ``got bytes``, ``got None``. The catalogue's type errors take it
    (``capture.bad_type``, ``salt.not_bytes``, ``codec.not_bytes_like``, ...).

    No upstream counterpart (upstream's API takes typed values)."""
    if value is None:
        return "None"
    return type(value).__name__


#: a noun of a template marked to agree with the number before it: ``byte(s)``
_PLURAL_NOUN = re.compile(r"(\w+)\(s\)")
_FORMATTER = string.Formatter()


def _agreed(template: str, values: Mapping[str, Any]) -> str:
    """``template`` filled from ``values`` as ``str.format`` fills it, each noun marked
    ``word(s)`` written ``word`` when the field before it reads ``1`` in the message and
    ``words`` otherwise (``{need} more byte(s) needed``: ``1 more byte needed``, ``2 more bytes
    needed``; ``1.0``, ``True`` or ``'1'`` take ``words``): the catalogue's one plural rule."""
    out = []
    one = False
    for literal, name, spec, conversion in _FORMATTER.parse(template):
        out.append(_PLURAL_NOUN.sub(r"\1" if one else r"\1s", literal))
        if name is not None:
            number, _ = _FORMATTER.get_field(name, (), values)
            value = _FORMATTER.convert_field(number, conversion)
            text = _FORMATTER.format_field(value, _FORMATTER.vformat(spec or "", (), values))
            one = text == "1"
            out.append(text)
    return "".join(out)


def protocol_error(error_id: str, *, remote: bool | None = None, **fields: Any) -> ProtocolError:
    """Build the catalogued error ``error_id`` (``spec/wire.yaml`` ``errors``).

    Args:
        error_id: catalogue id, e.g. ``"frame.bad_magic"``.
        remote: override the catalogue's default side (True: the peer's fault).
        **fields: values for the message template (field names, values, limits, offsets); a
            text of more than :data:`SHOWN_CHARS` characters is quoted (``!r``) by its ends and
            length, an integer of more than :data:`SHOWN_CHARS` digits by its size (a
            fraction of such a numerator or denominator by their sizes), a long list or bytes
            value by the ends of its ``repr`` (:func:`shown`). A noun the template marks
            ``word(s)`` agrees with the field before it (``1 more byte needed``).

    Returns:
        The exception (of the catalogue entry's kind class), ready to ``raise``.

    Raises:
        KeyError: ``error_id`` is not in the catalogue (a programming error).

    No upstream counterpart: it builds an error from this package's catalogue (``spec/wire.yaml``
    ``errors``); upstream formats each message where it fails, and the catalogue's texts start with
    that wording.
    """
    entry = SPEC.errors[error_id]
    side = entry.remote if remote is None else remote
    # a long value is shown by its ends or its size (:func:`shown`); ``fields`` keeps it whole
    values = {k: _printable(v) for k, v in fields.items()}
    template = entry.template
    message = template.format(**values) if "(s)" not in template else _agreed(template, values)
    return KIND_CLASSES[entry.kind](message, remote=side, error_id=error_id, fields=fields)

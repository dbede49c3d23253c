"""The command line's integer, number and port option types (argparse ``type=``), one rule for
every ``flodl-proto`` command: ASCII digits without ``_``
(:func:`flodl_proto._numbers.plain_number`), a number too long to quote read as an integer that
messages show by its size, a float beyond the float range refused by name.

The commands import them from :mod:`flodl_proto.commands.relay`, which re-exports them.

No upstream counterpart: upstream's binaries take no such options.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from .._numbers import not_plain_note, plain_number
from ..addr import PORT_MAX, port_not_in_range
from ..errors import SHOWN_CHARS, _long_integer, shown

__all__ = ["RealNumber", "listen_port", "read_whole_number", "real_number", "shown_as_typed",
           "tcp_port", "whole_number"]


def tcp_port(text: str) -> int:
    """argparse ``type=`` for a TCP port option (``dissector --port``, ``decode --port``): a
    whole number in 1..65535.

    Raises:
        argparse.ArgumentTypeError: not a number (``not a port number: '7x'``; text ``int()``
            would read, ``７０００`` or ``5_5``, with the reason of
            :func:`flodl_proto._numbers.not_plain_note`), or out of range (``port 70000 is not
            in 1..65535``, :func:`flodl_proto.addr.port_not_in_range`); argparse names the
            option (``argument --port: ...``).

    No upstream counterpart: upstream's binaries take no port options.
    """
    return _port(text, 1)


def listen_port(text: str) -> int:
    """argparse ``type=`` for a port to listen on (``relay --listen-port``): a whole number in
    0..65535 (0: any free port), read as :func:`tcp_port` reads one.

    Raises:
        argparse.ArgumentTypeError: not a number (``not a port number: '7x'``), or out of range
            (``port 70000 is not in 0..65535``); argparse names the option (``argument
            --listen-port: ...``).

    No upstream counterpart: upstream's relay binds the controller's port + 4.
    """
    return _port(text, 0)


def _port(text: str, minimum: int) -> int:
    """A port option's value: :func:`whole_number`'s integer in ``minimum``..65535."""
    try:
        value = whole_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a port number: {shown(text)}"
                                         f"{not_plain_note(text)}") from None
    if not minimum <= value <= PORT_MAX:
        raise argparse.ArgumentTypeError(port_not_in_range(value, minimum))
    return value


def whole_number(text: str) -> int:
    """argparse ``type=`` of every integer option of the command line (``--world-size``,
    ``--rank``, ``--rounds``, ``--jobs``, ``--protocol-version``, ...; the port options through
    :func:`tcp_port` and :func:`listen_port`): the
    integer ``int()`` reads from ``text`` when it is written in ASCII digits (an optional sign,
    blanks around it), so every such value taken before is taken as it was; the digits of other
    scripts (``１２``, ``١٢``) and ``_`` (``1_000``), which ``int()`` reads too, are refused
    (:func:`flodl_proto._numbers.plain_number`, as upstream's Rust parse). A
    number of more digits than a message quotes whole (:data:`~flodl_proto.errors.SHOWN_CHARS`,
    80; ``int()`` refuses more than 4300) is read too, as an integer that messages show by its
    size (``<an integer of 16610 bits>``), so the command's own range check refuses it as any
    value out of range, in one line, where argparse echoed the digits whole.

    Raises:
        argparse.ArgumentTypeError: not an integer in ASCII digits (``invalid int value:
            'x'``, as argparse's, the text quoted by :func:`~flodl_proto.errors.shown`; for
            text ``int()`` would read, followed by the reason of
            :func:`flodl_proto._numbers.not_plain_note`: ``(a number is written in ASCII
            digits, without '_')``, or for a non-ASCII blank around ASCII digits ``(a
            non-ASCII blank, U+00A0: ...)``).

    No upstream counterpart: upstream's binaries take no such options.
    """
    value = read_whole_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"invalid int value: {shown(text)}{not_plain_note(text)}")
    return value


def read_whole_number(text: str) -> int | None:
    """The integer ``text`` is written as under the command line's rule, or None: ASCII blanks
    around it, an optional sign (``+`` or ``-``) and ASCII digits, nothing else (no ``_``, no
    digit of another script, no blank between digits). The rule of :func:`whole_number` and of
    each rank of ``relay --ranks`` (:func:`flodl_proto.commands.relay.parse_ranks`).

    Args:
        text: an option's value, or one item of it.

    Returns:
        The ``int``; one of more than :data:`~flodl_proto.errors.SHOWN_CHARS` (80) digits as an
        integer that messages show by its size (``int()`` refuses more than 4300 digits); None
        when ``text`` is not written so. Raises nothing.

    Upstream: Rust's ``str::parse::<u32>`` (ASCII digits, an optional ``+``); the blanks around
    the number are taken as ``int()`` takes them.
    """
    match = _INTEGER_TEXT.fullmatch(text)
    if match is None:
        return None
    if len(match[2]) > SHOWN_CHARS:
        return _long_integer(match[1], match[2])
    return int(match[1] + match[2])


#: an integer as :func:`whole_number` reads a long one: an optional sign and ASCII digits
_INTEGER_TEXT = re.compile(r"\s*([-+]?)([0-9]+)\s*", re.ASCII)


class RealNumber(float):
    """A number option's value (a ``float``) that keeps the text it was written as, ``text``
    (``'-1'``, ``' 1e3'``), so a range check shows the value as typed, not as ``float`` prints
    it (``-1.0``). Arithmetic on it gives plain floats. Made by :func:`real_number`.

    No upstream counterpart: upstream's binaries take no such options.
    """

    text: str

    def __new__(cls, value: float, text: str) -> RealNumber:
        number = super().__new__(cls, value)
        number.text = text
        return number

    def __getnewargs__(self) -> tuple[float, str]:  # type: ignore[override]
        return float(self), self.text


def shown_as_typed(value: float) -> str:
    """A number option's value for a message, quoted (:func:`~flodl_proto.errors.shown`): the
    text it was written as for a :class:`RealNumber` (``'-1'``), else ``repr`` of the float
    (``'-1.0'``, a default or a value given by a caller). Raises nothing. No upstream
    counterpart."""
    return shown(value.text if isinstance(value, RealNumber) else repr(value))


def real_number(text: str) -> float:
    """argparse ``type=`` of a number option (``--payload-mib``, ``--interval``): the float
    ``float()`` reads from ``text`` written in ASCII without ``_``
    (:func:`flodl_proto._numbers.plain_number`), as a :class:`RealNumber` that keeps ``text``
    for the messages; its range is the command's check.

    Raises:
        argparse.ArgumentTypeError: not a number (``invalid float value: 'x'``, as argparse's;
            ``１.５`` and ``1_0`` with the reason of
            :func:`flodl_proto._numbers.not_plain_note`: ``(a number is written in ASCII
            digits, without '_')``),
            or a finite number beyond the float range (``1e400``, 400 nines), which ``float()``
            reads as an infinity (the command then said ``got inf``): the message says it is out
            of range, names the largest (or smallest) finite number and quotes the text
            (:func:`~flodl_proto.errors.shown`). ``inf`` written as such is an infinity, for
            the command's range check to refuse.

    No upstream counterpart: upstream's binaries take no such options.
    """
    if not plain_number(text):
        raise argparse.ArgumentTypeError(f"invalid float value: {shown(text)}"
                                         f"{not_plain_note(text)}")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {shown(text)}") from None
    if math.isinf(value) and text.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        bound = (f"above the largest finite number, {sys.float_info.max:g}" if value > 0
                 else f"below the smallest finite number, {-sys.float_info.max:g}")
        raise argparse.ArgumentTypeError(f"{shown(text)} is out of range: {bound}")
    return RealNumber(value, text)

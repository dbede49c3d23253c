"""``relay --host NAME``: the host name a relay announces in Hello, as the command line takes it
(:func:`host_name`) and as its messages quote a refused one.

The command :mod:`flodl_proto.commands.relay` imports :func:`host_name` from here.

No upstream counterpart: upstream's relay announces the machine's host name.
"""

from __future__ import annotations

import argparse
import unicodedata
from typing import Final

from ..errors import shown
from ..spec import MAX_HELLO_HOST_LEN

__all__ = ["host_name"]


#: characters that show as nothing although Unicode does not class them as format characters:
#: the Hangul fillers
_INVISIBLE_FILLERS: Final = frozenset("\u115f\u1160\u3164\uffa0")


def _hidden(ch: str) -> bool:
    """Whether ``ch`` (one character) would not show as itself inside a quoted host name: a
    control, format, surrogate, private-use or unassigned character (category C), a combining
    mark (M: it would join the quote or the character before it), a line or paragraph
    separator, a space other than the ASCII space, a Hangul filler or a noncharacter: every
    character :func:`host_name` refuses, and the combining marks it takes after a letter."""
    kind = unicodedata.category(ch)
    code = ord(ch)
    return (kind[0] in "CM" or kind in ("Zl", "Zp") or (kind == "Zs" and ch != " ")
            or ch in _INVISIBLE_FILLERS or 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE)


def _shown_host(text: str) -> str:
    """How :func:`host_name`'s messages quote the refused value: as
    :func:`~flodl_proto.errors.shown` quotes it (a long text by its ends and length), with every
    character :func:`_hidden` holds that ``repr`` leaves as it is escaped as ``\\uXXXX`` or
    ``\\U000XXXXX`` (``'\\u3164'``, ``'\\u0301a'``), so that a filler does not read as empty
    quotes and a combining mark does not sit on the opening quote.

    No upstream counterpart."""
    return "".join((f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
                   if _hidden(ch) else ch for ch in shown(text))


def host_name(text: str) -> str:
    """argparse ``type=`` of ``relay --host``: the name announced in Hello, unless it is empty
    or only white space (``--host "$HOST"`` with the variable unset announced an empty name,
    and the relay's log lines read ``relay : ...``), holds a control character (the name is
    shown in the controller's and the relay's log lines, where a line feed or an escape
    sequence would forge or garble them), an invisible format or line-separator character
    (a bidirectional override, a zero-width mark, U+2028) or filler (U+115F, U+1160, U+3164,
    U+FFA0), a space character other than the ASCII space (U+00A0, U+3000: the ASCII space is
    taken), a noncharacter (U+FDD0..U+FDEF, U+FFFE and U+FFFF of every plane), or starts with a
    combining mark (Unicode category M), or is longer than a Hello carries
    (``MAX_HELLO_HOST_LEN``, 255 UTF-8 bytes; the relay's own check, ``relay.host_too_long``,
    does not name the option).

    Raises:
        argparse.ArgumentTypeError: one of those (argparse names the option: ``argument --host:
            ...``); the message shows the value (:func:`_shown_host`) and, for a
            refused character, its code point (and position).

    No upstream counterpart: upstream's relay announces the machine's host name.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{_shown_host(text)} is empty; give a host name, or "
                                         "leave the option out to announce this machine's host "
                                         "name")
    for i, ch in enumerate(text):
        kind = unicodedata.category(ch)
        if kind == "Cc":
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a control character (U+{ord(ch):04X} at character "
                f"{i + 1}); control characters are refused, as a host name is shown in log lines")
        # bidi overrides, zero-width marks, line separators; the Hangul fillers, which show as
        # nothing
        if kind in ("Cf", "Zl", "Zp") or ch in _INVISIBLE_FILLERS:
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds an invisible format, filler or line-separator "
                f"character (U+{ord(ch):04X} at character {i + 1}); such characters are "
                "refused, as a host name is shown in log lines, where one would reorder, hide or "
                "break the text")
        if kind == "Zs" and ch != " ":  # U+00A0, U+3000: look like a space, are not one
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a space character other than the ASCII space "
                f"(U+{ord(ch):04X} at character {i + 1}); such characters are refused, as a host "
                "name is shown in log lines, where one would pass for a plain space")
        if 0xFDD0 <= ord(ch) <= 0xFDEF or ord(ch) & 0xFFFE == 0xFFFE:
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a noncharacter (U+{ord(ch):04X} at character "
                f"{i + 1}); noncharacters are refused, as they are not for text interchange")
        if i == 0 and kind.startswith("M"):
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} starts with a combining mark (U+{ord(ch):04X}); a host "
                "name cannot start with one, as it would join the text shown before it")
        if kind == "Cs":  # a byte of the command line that is not UTF-8 (surrogateescape)
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a byte that is not UTF-8 (character {i + 1}); a host "
                "name is UTF-8 text")
    length = len(text.encode("utf-8"))
    if length > MAX_HELLO_HOST_LEN:
        raise argparse.ArgumentTypeError(f"{_shown_host(text)} is {length} bytes (UTF-8), more "
                                         f"than the {MAX_HELLO_HOST_LEN} a Hello may carry")
    return text

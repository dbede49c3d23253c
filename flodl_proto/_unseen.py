"""Characters that do not show as themselves in a line of text, and how messages show them: one
list for the command line's refusal of a host name (``relay --host``,
:mod:`flodl_proto.commands._host_name`) and for the lines that quote a host name a peer
announced (the controller's relay labels and ``relay R joined`` lines); and the one escape of
the characters a terminal acts on (:func:`terminal_text`) for another process's output shown on
the console (``conform``'s target output, the ``demo`` members' log lines).

A leaf module: it imports nothing of this package. No upstream counterpart: upstream prints
host names as they are.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["escape_hidden", "hidden", "invisible", "noncharacter", "quoted", "terminal_text"]

#: Unicode's Default_Ignorable_Code_Point property (DerivedCoreProperties.txt; these ranges from
#: Unicode 14.0, where U+180F joined them, on), as (first, last) code points: characters a text
#: shows as nothing. Most are format characters (Cf); the rest are the Hangul fillers (Lo),
#: marks that show nothing (U+034F COMBINING GRAPHEME JOINER, U+17B4..U+17B5, the Mongolian
#: free variation selectors, the variation selectors U+FE00..U+FE0F and U+E0100..U+E01EF) and
#: unassigned code points kept for more of them (U+2065, U+FFF0..U+FFF8, the rest of
#: U+E0000..U+E0FFF)
DEFAULT_IGNORABLE: Final = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
#: characters that show as a blank although they are neither spaces (Zs) nor default ignorable:
#: U+2800 BRAILLE PATTERN BLANK (a symbol, So)
BLANK_SYMBOLS: Final = frozenset("\u2800")


def invisible(ch: str) -> bool:
    """Whether ``ch`` (one character) shows as nothing, or as a blank, though it is no space: a
    default-ignorable code point (:data:`DEFAULT_IGNORABLE`) or a blank symbol
    (:data:`BLANK_SYMBOLS`)."""
    code = ord(ch)
    return ch in BLANK_SYMBOLS or any(first <= code <= last for first, last in DEFAULT_IGNORABLE)


def noncharacter(ch: str) -> bool:
    """Whether ``ch`` is a noncharacter: U+FDD0..U+FDEF, and U+FFFE and U+FFFF of every plane."""
    code = ord(ch)
    return 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE


def hidden(ch: str) -> bool:
    """Whether ``ch`` (one character) would not show as itself inside a quoted text: a control,
    format, surrogate, private-use or unassigned character (category C), a combining mark (M:
    it would join the quote or the character before it), a line or paragraph separator, a space
    other than the ASCII space, an invisible character (:func:`invisible`) or a noncharacter."""
    kind = unicodedata.category(ch)
    return (kind[0] in "CM" or kind in ("Zl", "Zp") or (kind == "Zs" and ch != " ")
            or invisible(ch) or noncharacter(ch))


def escape_hidden(text: str) -> str:
    """``text`` with every :func:`hidden` character escaped as ``\\uXXXX`` or ``\\U000XXXXX``
    (``'\\u3164'``, ``'\\u0301a'``); apply it to a quoted text (``repr``), whose quotes and
    backslashes it leaves as they are."""
    return "".join((f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
                   if hidden(ch) else ch for ch in text)


def quoted(text: str) -> str:
    """``repr(text)`` with the :func:`hidden` characters ``repr`` leaves as they are (a
    combining mark, a variation selector, a filler) escaped too: a peer's text (a relay's host
    name) quoted in a log line, where it can neither break nor colour the line, nor hide or
    fake a character. E.g. ``quoted('h\\u034f1') == "'h\\\\u034f1'"``."""
    return escape_hidden(repr(text))


#: the characters a terminal acts on rather than shows: the C0 controls but tab (ESC starts a
#: colour, a cursor move or a window-title sequence; CR returns to the start of the line), DEL,
#: the C1 controls (U+009B is a CSI on its own), and Unicode's Bidi_Control characters (U+061C,
#: U+200E, U+200F, U+202A..U+202E, U+2066..U+2069), which reorder the text shown after them
#: (U+202E RIGHT-TO-LEFT OVERRIDE shows ``txt.exe`` for ``exe.txt``)
_TERMINAL_CONTROL = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _hex_code(m: re.Match[str]) -> str:
    return f"#x{ord(m.group()):02X}"


def terminal_text(text: str) -> str:
    """``text`` as the console shows it: each character a terminal would act on (the C0
    controls but tab, DEL, the C1 controls) or that reorders the text after it (a
    Bidi_Control character: U+202E RIGHT-TO-LEFT OVERRIDE, U+2066..U+2069, U+200E, U+200F,
    ...) written as ``#xNN`` with its code point in upper-case hex, as ``conform``'s JUnit
    report writes the characters XML cannot hold (``\\x1b[31mred`` is shown ``#x1B[31mred``,
    U+202E ``#x202E``); the other characters as they are. For another process's output
    printed to a terminal: ``conform``'s lines of a target's output and what it sent, the
    ``demo``'s log lines of its members. Raises nothing.

    No upstream counterpart: upstream prints its peers' text as it is.
    """
    return _TERMINAL_CONTROL.sub(_hex_code, text)

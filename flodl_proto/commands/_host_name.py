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


#: Unicode's Default_Ignorable_Code_Point property (DerivedCoreProperties.txt; these ranges from
#: Unicode 14.0, where U+180F joined them, on), as (first, last) code points: characters a text
#: shows as nothing. Most are format characters (Cf, refused as such); the rest are the Hangul
#: fillers (Lo), marks that show nothing (U+034F COMBINING GRAPHEME JOINER, U+17B4..U+17B5, the
#: Mongolian free variation selectors, the variation selectors U+FE00..U+FE0F and
#: U+E0100..U+E01EF) and unassigned code points kept for more of them (U+2065, U+FFF0..U+FFF8,
#: the rest of U+E0000..U+E0FFF)
_DEFAULT_IGNORABLE: Final = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
#: characters that show as a blank although they are neither spaces (Zs) nor default ignorable:
#: U+2800 BRAILLE PATTERN BLANK (a symbol, So)
_BLANK_SYMBOLS: Final = frozenset("\u2800")


def _invisible(ch: str) -> bool:
    """Whether ``ch`` (one character) shows as nothing, or as a blank, though it is no space: a
    default-ignorable code point (:data:`_DEFAULT_IGNORABLE`) or a blank symbol
    (:data:`_BLANK_SYMBOLS`). The one list both :func:`host_name` (which refuses them) and
    :func:`_hidden` (which escapes them in its messages) read."""
    code = ord(ch)
    return ch in _BLANK_SYMBOLS or any(first <= code <= last for first, last in _DEFAULT_IGNORABLE)


def _noncharacter(ch: str) -> bool:
    """Whether ``ch`` is a noncharacter: U+FDD0..U+FDEF, and U+FFFE and U+FFFF of every plane."""
    code = ord(ch)
    return 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE


def _hidden(ch: str) -> bool:
    """Whether ``ch`` (one character) would not show as itself inside a quoted host name: a
    control, format, surrogate, private-use or unassigned character (category C), a combining
    mark (M: it would join the quote or the character before it), a line or paragraph
    separator, a space other than the ASCII space, an invisible character (:func:`_invisible`)
    or a noncharacter: every character :func:`host_name` refuses, and the combining marks it
    takes after a letter."""
    kind = unicodedata.category(ch)
    return (kind[0] in "CM" or kind in ("Zl", "Zp") or (kind == "Zs" and ch != " ")
            or _invisible(ch) or _noncharacter(ch))


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
    taken), a noncharacter (U+FDD0..U+FDEF, U+FFFE and U+FFFF of every plane), another
    invisible character anywhere in it (:func:`_invisible`: the rest of Unicode's
    default-ignorable code points, such as U+034F and the variation selectors, and U+2800
    BRAILLE PATTERN BLANK), or starts with a combining mark (Unicode category M: a
    default-ignorable mark there is named as such), or is longer than a Hello carries
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
        # nothing (the letters among the default-ignorable code points)
        if kind in ("Cf", "Zl", "Zp") or (kind == "Lo" and _invisible(ch)):
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
        if _noncharacter(ch):
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a noncharacter (U+{ord(ch):04X} at character "
                f"{i + 1}); noncharacters are refused, as they are not for text interchange")
        if i == 0 and kind.startswith("M"):
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} starts with a combining mark (U+{ord(ch):04X}); a host "
                "name cannot start with one, as it would join the text shown before it")
        if _invisible(ch):  # a variation selector, U+034F, an unassigned one, U+2800
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds an invisible character (U+{ord(ch):04X} at character "
                f"{i + 1}); such characters are refused, as a host name is shown in log lines, "
                "where one would pass unseen")
        if kind == "Cs":  # a byte of the command line that is not UTF-8 (surrogateescape)
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a byte that is not UTF-8 (character {i + 1}); a host "
                "name is UTF-8 text")
    length = len(text.encode("utf-8"))
    if length > MAX_HELLO_HOST_LEN:
        raise argparse.ArgumentTypeError(f"{_shown_host(text)} is {length} bytes (UTF-8), more "
                                         f"than the {MAX_HELLO_HOST_LEN} a Hello may carry")
    return text

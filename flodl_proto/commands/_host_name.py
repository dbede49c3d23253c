"""``relay --host NAME``: the host name a relay announces in Hello, as the command line takes it
(:func:`host_name`) and as its messages quote a refused one.

The command :mod:`flodl_proto.commands.relay` imports :func:`host_name` from here.

No upstream counterpart: upstream's relay announces the machine's host name.
"""

from __future__ import annotations

import argparse
import unicodedata

from .._unseen import escape_hidden, invisible, noncharacter
from ..errors import shown
from ..spec import MAX_HELLO_HOST_LEN

__all__ = ["host_name"]


def _shown_host(text: str) -> str:
    """How :func:`host_name`'s messages quote the refused value: as
    :func:`~flodl_proto.errors.shown` quotes it (a long text by its ends and length), with every
    character :func:`~flodl_proto._unseen.hidden` holds that ``repr`` leaves as it is escaped
    (:func:`~flodl_proto._unseen.escape_hidden`), so that a filler does not read as empty
    quotes and a combining mark does not sit on the opening quote.

    No upstream counterpart."""
    return escape_hidden(shown(text))


def host_name(text: str) -> str:
    """argparse ``type=`` of ``relay --host``: the name announced in Hello, unless it is empty
    or only white space (``--host "$HOST"`` with the variable unset announced an empty name,
    and the relay's log lines read ``relay : ...``), holds a control character (the name is
    shown in the controller's and the relay's log lines, where a line feed or an escape
    sequence would forge or garble them), an invisible format or line-separator character
    (a bidirectional override, a zero-width mark, U+2028) or filler (U+115F, U+1160, U+3164,
    U+FFA0), a space character other than the ASCII space (U+00A0, U+3000: the ASCII space is
    taken), a noncharacter (U+FDD0..U+FDEF, U+FFFE and U+FFFF of every plane), another
    invisible character anywhere in it (:func:`~flodl_proto._unseen.invisible`: the rest of
    Unicode's default-ignorable code points, such as U+034F and the variation selectors, and U+2800
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
        if kind in ("Cf", "Zl", "Zp") or (kind == "Lo" and invisible(ch)):
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
        if noncharacter(ch):
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} holds a noncharacter (U+{ord(ch):04X} at character "
                f"{i + 1}); noncharacters are refused, as they are not for text interchange")
        if i == 0 and kind.startswith("M"):
            raise argparse.ArgumentTypeError(
                f"{_shown_host(text)} starts with a combining mark (U+{ord(ch):04X}); a host "
                "name cannot start with one, as it would join the text shown before it")
        if invisible(ch):  # a variation selector, U+034F, an unassigned one, U+2800
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

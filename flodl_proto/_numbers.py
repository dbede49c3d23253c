"""How a number is written on the command line: the rule every numeric option, positional and
environment value of ``flodl-proto`` shares.

Python's ``int()`` and ``float()`` read more than a number as a user types one: the digits of
any script (full-width ``１２``, Arabic-Indic ``١٢``) and ``_`` between digits (``1_000``).
Upstream's Rust ``str::parse`` reads ASCII digits only, without separators; so does this
package's command line. Blanks around a number stay as ``int()`` and ``float()`` take them.
This module imports nothing (:mod:`flodl_proto.spec` and the command line's first steps use it).

Upstream: ``str::parse::<u32>`` / ``str::parse::<f64>`` of Rust's standard library, as
upstream's launcher reads its numbers.
"""

from __future__ import annotations

from typing import Final

__all__ = ["NOT_PLAIN", "not_plain_note", "plain_number"]

#: what a message adds to say why a number ``int()`` or ``float()`` would read is refused
NOT_PLAIN: Final = "a number is written in ASCII digits, without '_'"


def plain_number(text: str) -> bool:
    """Whether ``text`` is written as a number may be on the command line: ASCII characters
    only and no ``_`` (whether it is a number at all is ``int()``'s or ``float()``'s to say).

    Args:
        text: an option's value, a positional or an environment variable, as given.

    Returns:
        False for text with a non-ASCII character (a digit of another script, a full-width
        digit, a non-ASCII blank) or an underscore; True otherwise. Raises nothing.

    Upstream: Rust's ``str::parse`` of a number, which takes ASCII digits only.
    """
    return text.isascii() and "_" not in text


def not_plain_note(text: str) -> str:
    """Why ``text`` is refused as a number when :func:`plain_number` refuses it: the note a
    message about a number option's value ends with, in parentheses after a blank.

    Args:
        text: the value refused, as given.

    Returns:
        ``""`` for text :func:`plain_number` takes (a message about it says why by itself);
        `` (a non-ASCII blank, U+00A0: a number and the blanks around it are written in
        ASCII)`` when every non-ASCII character of ``text`` is a blank (``, without '_'`` added
        when it has an underscore too); else `` (a number is written in ASCII digits, without
        '_')`` (:data:`NOT_PLAIN`). Raises nothing.

    Upstream: none (Rust's ``str::parse`` gives no reason).
    """
    if plain_number(text):
        return ""
    wide = [c for c in text if not c.isascii()]
    if wide and all(c.isspace() for c in wide):
        underscore = ", without '_'" if "_" in text else ""
        return (f" (a non-ASCII blank, U+{ord(wide[0]):04X}: a number and the blanks around it "
                f"are written in ASCII{underscore})")
    return f" ({NOT_PLAIN})"

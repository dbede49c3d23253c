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

__all__ = ["NOT_PLAIN", "plain_number"]

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

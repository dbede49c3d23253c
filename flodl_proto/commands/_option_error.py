"""The one wording of an option value that a command refuses itself: ``argument --X: MESSAGE``,
as argparse words the values its ``type=`` callables and ``choices`` refuse
(``argparse.ArgumentError``), so that every refused value of the command line reads alike
whichever of the two checked it, and the command prints it as argparse does, after ``PROG:
error:`` (exit 2).

Every command builds that prefix here: :class:`OptionError` for a check that raises,
:func:`option_message` for a line built in place, :func:`option_field` for a library message
that starts with the name of what it checks (:func:`flodl_proto.addr.parse_addr`'s ``field``),
and :func:`option_conflict` for two options that cannot be given together (argparse's words
for a mutually exclusive group).

No upstream counterpart: upstream's binaries take no such options.
"""

from __future__ import annotations

__all__ = ["OptionError", "option_conflict", "option_field", "option_message"]


def option_field(option: str) -> str:
    """The name of the option ``option`` (``"--listen"``) as argparse's error line starts it:
    ``argument --listen:``, the colon included (``str(argparse.ArgumentError(action, ...))``
    for the option's action). Raises nothing.

    No upstream counterpart: upstream's binaries take no such options.
    """
    return f"argument {option}:"


def option_message(option: str, message: str) -> str:
    """``message`` (what is wrong with the value) as argparse words a refused value of
    ``option``: ``argument --jobs: must be in 1..1024, got 0``. Raises nothing.

    No upstream counterpart: upstream's binaries take no such options.
    """
    return f"{option_field(option)} {message}"


def option_conflict(option: str, other: str, why: str = "") -> str:
    """``option`` refused because ``other`` is given too, as argparse words the second option
    of a mutually exclusive group: ``argument --junit: not allowed with argument --list``,
    then `` (WHY)`` when ``why`` is given. Raises nothing.

    No upstream counterpart: upstream's binaries take no such options.
    """
    return (option_message(option, f"not allowed with {option_field(other).removesuffix(':')}")
            + (f" ({why})" if why else ""))


class OptionError(ValueError):
    """A value of the option ``option`` that the command refuses (a bad command line, exit 2):
    its text is :func:`option_message` of ``option`` and ``message``. A ``ValueError``, so the
    commands' checks that raise one keep their callers' handling.

    Attributes:
        option: the option named (``"--ranks"``).
        reason: ``message``, without the option's name.

    No upstream counterpart: upstream's binaries take no such options.
    """

    def __init__(self, option: str, message: str) -> None:
        super().__init__(option_message(option, message))
        self.option = option
        self.reason = message

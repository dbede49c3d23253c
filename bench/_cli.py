"""Command-line helpers shared by the benchmark scripts (``python bench/X.py``: this folder is on
``sys.path``).

The ``type=`` functions raise ``argparse.ArgumentTypeError``, so a bad value is argparse's usage
line and one ``error: argument --X: ...`` line on stderr, exit 2, before anything is measured.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

T = TypeVar("T")


def whole(minimum: int) -> Callable[[str], int]:
    """``type=`` of a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def number(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    """``type=`` of a finite number >= ``minimum`` (``inclusive``) or > ``minimum``."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number {bound}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value

    return parse


def listed(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """``type=`` of a comma-separated list, each item parsed by ``item`` (a ``type=`` function
    of this module, whose error names the item)."""

    def parse(text: str) -> list[T]:
        return [item(part.strip()) for part in text.split(",")]

    return parse


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """``type=`` of one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


class _Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so ``main``'s cleanup (``finally`` blocks, the
    network lab's ``__exit__``) runs, as for Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def run(main: Callable[[], int], name: str) -> NoReturn:
    """Exit with ``main()``'s code; Ctrl-C (after ``main``'s own cleanup has run) is one line
    ``NAME: interrupted`` on stderr and exit 130, SIGTERM (``timeout``, a cancelled job: often
    sent to the whole process group) ``NAME: terminated`` and exit 143, not a traceback nor a
    death that skips the cleanup (the network lab's namespaces were left behind)."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        code = 130
    except _Terminated:
        print(f"{name}: terminated", file=sys.stderr, flush=True)
        code = 143
    sys.exit(code)

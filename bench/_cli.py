"""Command-line helpers shared by the benchmark scripts (``python bench/X.py``: this folder is on
``sys.path``).

The ``type=`` functions raise ``argparse.ArgumentTypeError``, so a bad value is argparse's usage
line and one ``error: argument --X: ...`` line on stderr, exit 2, before anything is measured. A
value is quoted as the package's error lines quote it (``flodl_proto.errors.shown``: a long one
by its ends and length, an integer of more than 80 digits by its size). Sizes have upper bounds
of this machine: :func:`mib_max` (its physical memory) and :func:`world_max` (a process per
rank).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # the checkout's package when none is installed (appended: an
    sys.path.append(_ROOT)  # installed one comes first)

from flodl_proto.commands.relay import whole_number  # noqa: E402
from flodl_proto.errors import shown  # noqa: E402

T = TypeVar("T")

MiB = 1 << 20
#: memory of one rank's process in the cluster benchmarks (an interpreter with NumPy and the
#: codec, small frames), for :func:`world_max`
RANK_PROCESS_BYTES = 64 * MiB
#: :func:`world_max` when the physical memory cannot be read
WORLD_MAX_UNKNOWN = 1024


def physical_memory() -> int | None:
    """This machine's physical memory, bytes (``os.sysconf``), or None when it cannot be read."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def mib_max() -> int | None:
    """The largest payload a benchmark takes, MiB: this machine's physical memory (None: not
    known, no bound). A larger one ended in NumPy's memory or size error, with a traceback."""
    memory = physical_memory()
    return None if memory is None else memory // MiB


def world_max() -> int:
    """The largest world size a benchmark takes: as many rank processes of
    :data:`RANK_PROCESS_BYTES` as this machine's physical memory holds (at least 2;
    :data:`WORLD_MAX_UNKNOWN` when it cannot be read)."""
    memory = physical_memory()
    return WORLD_MAX_UNKNOWN if memory is None else max(2, memory // RANK_PROCESS_BYTES)


#: what the bounds of :func:`mib_max` and :func:`world_max` are, for the messages
MIB_WHY = " (this machine's physical memory, MiB)"
WORLD_WHY = (f" (a process of about {RANK_PROCESS_BYTES // MiB} MiB per rank in this machine's "
             "physical memory)")


def whole(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """``type=`` of a whole number >= ``minimum`` and, when given, <= ``maximum`` (``why``
    says what the bound is, in the message). A number of thousands of digits is out of range,
    shown by its size, not echoed."""

    def parse(text: str) -> int:
        try:
            value = whole_number(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {minimum}, got {shown(text)}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}{why}, got {value}")
        return value

    return parse


def number(minimum: float, *, inclusive: bool, maximum: float | None = None,
           why: str = "") -> Callable[[str], float]:
    """``type=`` of a finite number >= ``minimum`` (``inclusive``) or > ``minimum`` and, when
    given, <= ``maximum`` (``why`` says what that bound is)."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number {bound}, got {shown(text)}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got "
                                             f"{shown(text)}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}{why}, got "
                                             f"{shown(text)}")
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
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(choices)}, got {shown(text)}")
        return text

    return parse


class BenchFailed(Exception):
    """A process of the measured cluster failed or fell silent: :func:`run` prints the message
    as the one line ``NAME: error: MESSAGE`` and exits 1."""


#: the most characters of a process's last stderr line :func:`exited` repeats as it is
EXITED_LINE_CHARS = 300


def exited(what: str, code: int | None, stderr: str) -> BenchFailed:
    """The failure of a process that ended: ``WHAT exited with CODE``, then the last line it
    wrote on stderr (its own error line, when it wrote one): as it is up to
    :data:`EXITED_LINE_CHARS` characters, quoted as the package quotes a long value
    (``flodl_proto.errors.shown``: by its ends and its length) when longer or when it holds a
    character that is not printable (an escape sequence)."""
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if len(last) > EXITED_LINE_CHARS or not last.isprintable():
        last = shown(last)
    return BenchFailed(f"{what} exited with {code}" + (f": {last}" if last else ""))


class _Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so ``main``'s cleanup (``finally`` blocks, the
    network lab's ``__exit__``) runs, as for Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def run(main: Callable[[], int], name: str) -> NoReturn:
    """Exit with ``main()``'s code; Ctrl-C (after ``main``'s own cleanup has run) is one line
    ``NAME: interrupted`` on stderr and exit 130, SIGTERM (``timeout``, a cancelled job: often
    sent to the whole process group) ``NAME: terminated`` and exit 143, not a traceback nor a
    death that skips the cleanup (the network lab's namespaces were left behind); a
    :class:`BenchFailed` is ``NAME: error: MESSAGE`` and exit 1."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        code = 130
    except _Terminated:
        print(f"{name}: terminated", file=sys.stderr, flush=True)
        code = 143
    except BenchFailed as e:
        print(f"{name}: error: {e}", file=sys.stderr, flush=True)
        code = 1
    sys.exit(code)

"""Command-line helpers shared by the benchmark scripts (``python bench/X.py``: this folder is on
``sys.path``).

Every script's parser is a :class:`Parser`: a usage error is one line on stderr, ``bench/X.py:
error: MESSAGE``, exit 2, without argparse's usage text (``--help`` shows it), as the package's
command line reports one. The ``type=`` functions raise ``argparse.ArgumentTypeError``, so a bad
value is one ``bench/X.py: error: argument --X: ...`` line, before anything is measured. While a
script imports NumPy and the codec (:func:`loading`), Ctrl-C is one ``bench/X.py: interrupted``
line and exit 130, not a traceback. A value is quoted as it was typed, as the package's error
lines quote it (``flodl_proto.errors.shown``: a long one by its ends and length). Sizes have upper
bounds of this machine: :func:`mib_max` (its physical memory) and :func:`world_max` (a process
per rank).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

#: the signals a Ctrl-C or SIGTERM that arrived while a script starts (:func:`loading`)
_held: list[int] = []


def _hold(signum: int, frame: object) -> None:
    _held.append(signum)


def _started_as_script() -> bool:
    """Whether this process runs a script of this folder (``python bench/X.py``, its
    ``__main__``), not a program that imports one (a test)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return isinstance(path, str) and Path(path).resolve().parent == Path(__file__).resolve().parent


#: SIGINT's handler before this module held it (a script's start: Python's default handler), or
#: None when it does not hold it; :func:`loading` ends the hold
_sigint_before = (signal.signal(signal.SIGINT, _hold) if _started_as_script()
                  and signal.getsignal(signal.SIGINT) is signal.default_int_handler else None)

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # the checkout's package when none is installed (appended: an
    sys.path.append(_ROOT)  # installed one comes first)



def _spec_failed(exc: RuntimeError) -> NoReturn:
    """A spec that fails to load as a script starts: one line on stderr and exit 2 when
    ``FLODL_PROTO_SPEC_DIR`` names it (a bad environment value), else 1, as the commands end;
    imported by a program (a test), the error is raised as it is."""
    if type(exc).__name__ != "SpecError" or not _started_as_script():
        raise exc
    name = Path(getattr(sys.modules["__main__"], "__file__", "bench")).name
    print(f"bench/{name}: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(2 if os.environ.get("FLODL_PROTO_SPEC_DIR") else 1)


try:  # the first import of the package loads its spec
    import flodl_proto.spec  # noqa: F401
except RuntimeError as _exc:
    _spec_failed(_exc)

# a name of the package the scripts import from here (``from _cli import shown``) is imported
# ``as`` itself: a re-export, as mypy --strict reads one
from flodl_proto._numbers import plain_number  # noqa: E402
from flodl_proto.cli import _Parser  # noqa: E402  (standard library and the spec only)
from flodl_proto.commands._demo_report import exit_words  # noqa: E402
from flodl_proto.commands._option_error import option_message as option_message  # noqa: E402
from flodl_proto.commands._waits import get_item  # noqa: E402
from flodl_proto.commands._waits import join_thread as join_thread  # noqa: E402
from flodl_proto.commands.relay import env_salt  # noqa: E402
from flodl_proto.commands.relay import whole_number as whole_number  # noqa: E402
from flodl_proto.errors import shown as shown  # noqa: E402
from flodl_proto.spec import SESSION_SALT_BYTES  # noqa: E402

T = TypeVar("T")

MiB = 1 << 20
#: tensors in each frame of the cluster benchmarks (bench/round.py's ranks, bench/hops.py's
#: records of the same lengths)
TENSORS = 4
#: memory of one rank's process in the cluster benchmarks (an interpreter with NumPy and the
#: codec, small frames), for :func:`world_max`
RANK_PROCESS_BYTES = 64 * MiB
#: :func:`world_max` when the physical memory cannot be read
WORLD_MAX_UNKNOWN = 1024


class Parser(_Parser):
    """The parser of a benchmark script: the package's command-line parser
    (``flodl_proto.cli``), whose usage error is the one line ``PROG: error: MESSAGE`` on stderr
    and exit 2, without argparse's usage text before it (a value of the command line it quotes
    is shown as the package's error lines show it, a line break escaped); ``--help`` is
    argparse's."""


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


def whole(minimum: int, maximum: int | None = None, why: str = "", *,
          minimum_why: str = "") -> Callable[[str], int]:
    """``type=`` of a whole number >= ``minimum`` and, when given, <= ``maximum`` (``why`` and
    ``minimum_why`` say what each bound is, in the message: ``must be >= 4 (...), got '2'``).
    A value out of range is named as typed, quoted
    (``got '00'``, as :func:`number` names one), not as the integer it was read as (``got 0``);
    a number of thousands of digits by its ends and its length, not echoed."""

    def parse(text: str) -> int:
        try:
            value = whole_number(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {minimum}, got {shown(text)}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{minimum_why}, got "
                                             f"{shown(text)}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}{why}, got "
                                             f"{shown(text)}")
        return value

    return parse


def number(minimum: float, *, inclusive: bool, maximum: float | None = None,
           why: str = "", problem: Callable[[float], str | None] | None = None,
           below: bool = False) -> Callable[[str], float]:
    """``type=`` of a finite number >= ``minimum`` (``inclusive``) or > ``minimum`` and, when
    given, <= ``maximum`` (< ``maximum`` with ``below``: ``must be below 100 (...), got
    '100'``; ``why`` says what that bound is); ``problem``, when given, says what else is wrong
    with a number in those bounds (None: nothing), after the number as typed.
    The number is written as the package's options write one (ASCII, no ``_``: ``1_0`` and
    a digit of another script are none, as :func:`whole` has them)."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"

    def parse(text: str) -> float:
        try:
            if not plain_number(text):
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number {bound}, got {shown(text)}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got "
                                             f"{shown(text)}")
        if maximum is not None and below and value >= maximum:
            raise argparse.ArgumentTypeError(f"must be below {maximum:g}{why}, got "
                                             f"{shown(text)}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}{why}, got "
                                             f"{shown(text)}")
        if problem is not None and (wrong := problem(value)) is not None:
            raise argparse.ArgumentTypeError(f"{shown(text)}: {wrong}")
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


def one_line(text: str) -> str:
    """``type=`` of a free text a script writes into ``bench/RESULTS.md`` (round.py's
    ``--note``, through :func:`results_note`): text that ``str.isprintable`` accepts, so no line
    break, tab or other control character (one would end the paragraph, or start a table row or
    a section, in the Markdown file), refused with the first such character named and the text
    quoted."""
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(
            f"expected one line of printable text, got {shown(text)} (holds {bad!r})")
    return text


#: a line Markdown reads as a heading (up to 3 spaces, 1 to 6 ``#``, then a space or the end)
_HEADING = re.compile(r" {0,3}#{1,6}(?= |$)")
#: a line that opens a fenced code block (up to 3 spaces, 3 or more backticks with no backtick
#: after them, or 3 or more tildes)
_FENCE = re.compile(r" {0,3}(?:`{3,}(?!.*`)|~{3,})")
#: the lines that open an HTML block a blank line does not end (CommonMark's kinds 1 to 5: a
#: ``<script``/``<pre``/``<style``/``<textarea`` tag, a comment, a processing instruction, a
#: declaration, a CDATA section), each with what ends it: a note that opens one and does not
#: end it on its own line would hold the rest of the file
_HTML_BLOCK = (
    (re.compile(r" {0,3}<(?:script|pre|style|textarea)(?=[ >]|$)", re.IGNORECASE),
     re.compile(r"</(?:script|pre|style|textarea)>", re.IGNORECASE)),
    (re.compile(r" {0,3}<!--"), re.compile(r"-->")),
    (re.compile(r" {0,3}<\?"), re.compile(r"\?>")),
    (re.compile(r" {0,3}<![A-Za-z]"), re.compile(r">")),
    (re.compile(r" {0,3}<!\[CDATA\["), re.compile(r"\]\]>")),
)


def results_note(text: str) -> str:
    """``type=`` of round.py's ``--note``, the sentence ``--write`` puts on a line of its own in
    its ``bench/RESULTS.md`` section: one line of printable text (:func:`one_line`) that Markdown
    reads as a paragraph. A note that would be a heading (``## x``: it split the section, and
    the next ``--write`` took it for the start of the following one) or would open a code block
    (a fence that held the rest of the file), or an HTML block that it does not end itself
    (``<!-- x``, ``<pre>``: hidden or shown as it is up to the ``-->`` or ``</pre>`` of a later
    section, or to the end of the file) is refused, naming what it starts with: ``'## x' would
    be a heading in bench/RESULTS.md, not a note (it starts with '##')``. ``#1 fastest`` (no
    space after the ``#``) is a paragraph, and taken."""
    one_line(text)
    for pattern, what in ((_HEADING, "be a heading"), (_FENCE, "open a code block")):
        m = pattern.match(text)
        if m is not None:
            raise argparse.ArgumentTypeError(
                f"{shown(text)} would {what} in bench/RESULTS.md, not a note (it starts with "
                f"{m.group(0)!r})")
    for start, end in _HTML_BLOCK:
        m = start.match(text)
        if m is not None and end.search(text) is None:
            raise argparse.ArgumentTypeError(
                f"{shown(text)} would open an HTML block in bench/RESULTS.md, not a note (it "
                f"starts with {m.group(0)!r})")
    return text


def config(fields: dict[str, type | tuple[type, ...]]) -> Callable[[str], dict[str, object]]:
    """``type=`` of a script's internal option that passes a child process its configuration as
    a JSON object (``--worker``): an object with at least the keys of ``fields``, each of the
    type given (a whole number >= 0 for ``int``; a number for ``float``). A malformed one (not
    JSON, not an object, a key missing, a value of another type) is a usage error naming the
    key and the value, where the child ended in a traceback."""

    def parse(text: str) -> dict[str, object]:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"expected a JSON object, got {shown(text)}")
        for key, kind in fields.items():
            if key not in value:
                raise argparse.ArgumentTypeError(f"no {key!r} in {shown(text)}")
            item = value[key]
            kinds = kind if isinstance(kind, tuple) else (kind,)
            if (isinstance(item, bool) or not isinstance(item, kinds)
                    or (isinstance(item, int) and item < 0)
                    or (isinstance(item, float) and not math.isfinite(item))):
                what = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
                raise argparse.ArgumentTypeError(
                    f"{key!r}: expected {what}, got {shown(json.dumps(item))}")
        return value

    return parse


def worker_salt(parser: argparse.ArgumentParser) -> bytes:
    """The session salt of a script's ``--worker`` process (16 bytes): ``$FLODL_SESSION_SALT``,
    32 hex digits (spaces between bytes and around them allowed), which the script sets for the
    processes it starts. Unset, empty, or not 16 bytes of hex (a worker run by hand), it is a
    usage error, ``parser.error``: the one line ``bench/X.py: error: ...`` naming the variable
    and what is wrong, exit 2, where the worker ended in a KeyError's or a ValueError's
    traceback. A salt is a secret: the message says what is wrong with it (its length, the
    first character that is not a hex digit) without its digits, in the words of the package's
    ``flodl_proto.commands.relay.env_salt``.

    No upstream counterpart (a benchmark's own worker)."""
    try:
        return env_salt("--worker", missing=f"--worker needs the session salt as "
                        f"{2 * SESSION_SALT_BYTES} hex digits (the benchmark sets it for the "
                        "processes it starts)")
    except ValueError as e:  # the package's words, without the digits
        parser.error(str(e))


#: how :func:`config`'s errors name a type
_KIND_NAMES: dict[type, str] = {int: "a whole number >= 0", float: "a finite number",
                                str: "a string"}


class BenchFailed(Exception):
    """A process of the measured cluster failed or fell silent: :func:`run` prints the message
    as the one line ``NAME: error: MESSAGE`` and exits 1."""


#: the most characters of a process's last stderr line :func:`exited` repeats as it is
EXITED_LINE_CHARS = 300


def exited(what: str, code: int | None, stderr: str) -> BenchFailed:
    """The failure of a process that ended: ``WHAT`` and how it ended in the demo's words
    (``flodl_proto.commands._demo_report.exit_words`` of ``code``, its
    ``subprocess.Popen.returncode``: ``exited with status 1``, ``was killed by SIGKILL`` for
    -9; ``ended`` alone for None, a status not read), then the last line it wrote on stderr
    (its own error line, when it wrote one): as it is up to :data:`EXITED_LINE_CHARS`
    characters, quoted as the package quotes a long value (``flodl_proto.errors.shown``: by its
    ends and its length) when longer or when it holds a character that is not printable (an
    escape sequence)."""
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if len(last) > EXITED_LINE_CHARS or not last.isprintable():
        last = shown(last)
    how = exit_words(code) if code is not None else "ended"
    return BenchFailed(f"{what} {how}" + (f": {last}" if last else ""))


@contextlib.contextmanager
def loading(name: str, active: bool) -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) and SIGTERM while a script imports NumPy, ml_dtypes and the codec
    (the script's first second; Ctrl-C is held from this module's import on, when a script of
    this folder runs): when ``active`` (the script runs as ``__main__``), one that arrived is,
    once the imports are done, the line ``NAME: interrupted`` (exit 130) or ``NAME:
    terminated`` (exit 143) on stderr, as :func:`run` ends, where it was a KeyboardInterrupt
    traceback (an extension module whose import is interrupted even prints its own traceback
    and raises an ImportError); a KeyboardInterrupt raised in the block is the same. A signal
    ignored when the block starts stays ignored. Not ``active`` (the script imported as a
    module, a process that keeps SIGTERM's default): nothing more is held, and a Ctrl-C held
    since this module's import is delivered to the handler before it."""
    global _sigint_before
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    early, _sigint_before = _sigint_before, None
    if early is not None:
        previous[signal.SIGINT] = early
    if not active:
        if early is not None:
            signal.signal(signal.SIGINT, early)
            if _held:
                _held.clear()
                signal.raise_signal(signal.SIGINT)
        yield
        return
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, _hold)
    try:
        yield
    except KeyboardInterrupt:
        _held.append(signal.SIGINT)
    finally:
        for s, handler in previous.items():  # None: not set from Python, the default
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
    if _held:
        word, code = (("interrupted", 130) if signal.SIGINT in _held else ("terminated", 143))
        print(f"{name}: {word}", file=sys.stderr, flush=True)
        sys.exit(code)


def interrupted_lock(exc: BaseException) -> bool:
    """Whether ``exc`` is the ``RuntimeError: release unlocked lock`` CPython raises when Ctrl-C
    interrupts a wait on a condition (``queue.Queue.get``, ``threading.Event.wait``) as it takes
    its lock back: the KeyboardInterrupt left the lock unheld, and the ``with`` block around
    the wait failed to release it. It is a Ctrl-C (the KeyboardInterrupt is its context)."""
    return isinstance(exc, RuntimeError) and isinstance(exc.__context__, KeyboardInterrupt)


def queue_get(q: queue.Queue[T], timeout: float) -> T:
    """``q.get(timeout=timeout)`` (``queue.Empty`` after ``timeout`` seconds), waited for in
    steps of 0.1 s (``flodl_proto.commands._waits.get_item``: a Ctrl-C or SIGTERM the kernel
    gave another thread, such as the reader of a child's output, runs its handler within a
    step, where it waited for the line, up to an hour), where a Ctrl-C is always a
    KeyboardInterrupt, also when it interrupts the queue's wait as it takes its lock back
    (:func:`interrupted_lock`)."""
    try:
        return get_item(q, timeout)
    except RuntimeError as e:
        if interrupted_lock(e):
            raise KeyboardInterrupt from None
        raise


class _Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so ``main``'s cleanup (``finally`` blocks, the
    network lab's ``__exit__``) runs, as for Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def run(main: Callable[[], int], name: str) -> NoReturn:
    """Exit with ``main()``'s code; Ctrl-C (after ``main``'s own cleanup has run) is one line
    ``NAME: interrupted`` on stderr and exit 130 (also when it interrupted a wait on a lock:
    :func:`interrupted_lock`), SIGTERM (``timeout``, a cancelled job: often
    sent to the whole process group) ``NAME: terminated`` and exit 143, not a traceback nor a
    death that skips the cleanup (the network lab's namespaces were left behind); a
    :class:`BenchFailed` is ``NAME: error: MESSAGE`` and exit 1."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = main()
    except (KeyboardInterrupt, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not interrupted_lock(e):
            raise
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        code = 130
    except _Terminated:
        print(f"{name}: terminated", file=sys.stderr, flush=True)
        code = 143
    except BenchFailed as e:
        print(f"{name}: error: {e}", file=sys.stderr, flush=True)
        code = 1
    sys.exit(code)

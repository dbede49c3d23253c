"""``flodl-proto`` command line (argparse); ``python -m flodl_proto`` runs the same.

Each subcommand lives in a module of :mod:`flodl_proto.commands` exposing
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int`` (the exit code).

Whatever the command, Ctrl-C (SIGINT) ends it with one line on stderr (``flodl-proto COMMAND:
interrupted``) and exit 130, also while the command's modules are still being imported (commands
that stop cleanly on a signal, such as ``controller`` and ``relay``, handle it themselves once
running). A command started with SIGINT ignored (a shell's background job, ``flodl-proto demo &`` in
a script; the demo's cluster members) keeps it ignored from start to exit, as shells and Python
itself do. ``conform`` and ``demo`` stop on SIGTERM as on Ctrl-C (they stop their targets or their
cluster first), with a line of their own (``flodl-proto COMMAND: terminated``) and exit 143 (128 +
SIGTERM), from the start of :func:`main` (before the parser and the command's modules are
imported) until the command handles it itself, and again once it has restored the previous
handler; ``controller`` stops cleanly on it from the start too (:func:`stopped_early`). For the
other commands SIGTERM keeps its default until they handle it, if they do (``relay`` handles it
as ``conform`` does while it looks its controller's host name up: :func:`sigterm_as_ctrl_c`).
``demo`` stops so on a closed terminal's SIGHUP too (``hung up``, exit 129, 128 + SIGHUP),
unless it was ignored when it started (``nohup``). While NumPy and the codec load, every command
holds Ctrl-C and SIGTERM (:func:`interrupts_held`) and acts on them as soon as they have loaded.
Once a command has its exit code (its output written), a Ctrl-C or SIGTERM while the interpreter
exits ends the process with that code (:func:`entry`). Output piped into a reader that stops early
(``flodl-proto decode cap.bin | head -1``) ends the command quietly with exit 141 (128 +
SIGPIPE, as a shell reports ``git log | head``). A stdout that cannot be written
(``> /dev/full``) is one line on stderr (``flodl-proto COMMAND: error: cannot write output:
...``) and exit 1, for ``--help`` and ``--version`` too.
Before the command line is parsed, the interrupted (or terminated) line names the command as it
does after (read from the command line: ``flodl-proto conform controller: interrupted``); an
error line before the command line is parsed (a usage error of the top-level parser, a
``--help`` that cannot be written) has the prefix ``flodl-proto``.

Start-up stays cheap: this module and the command modules import only the standard library and the
spec at module level; a command imports NumPy, the codec and the runners when it runs, so
``--help``, ``--version`` and a usage error do not wait for them.

A command's parser may set ``stopped_before_run(args) -> None`` beside ``func``: called when
Ctrl-C (or a signal that stops it as Ctrl-C) arrives once the command line is parsed but before
``func`` runs (while ``FLODL_PROTO_KERNELS`` is checked, NumPy and the codec loading), before
the ``interrupted`` (or ``terminated``) line is printed (``conform`` writes its reports there).

Every command reports a failure as one line on stderr in argparse's format, ``flodl-proto COMMAND:
error: MESSAGE`` (a rank adds its id: ``flodl-proto rank 0: error: ...``; ``conform`` and
``vectors`` their role or action, as argparse does: ``flodl-proto vectors check: error: ...``); a
usage error exits 2.
A command's own warnings and notes use the same program prefix (``flodl-proto relay: warning:
...``); the runners' log records (``--log-level``, e.g. a relay's ``rank 0 loopback stream
failed``) keep the logging format, ``DATE TIME LEVEL LOGGER: MESSAGE``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import pkgutil
import re
import select
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from . import __version__
from ._numbers import plain_number
from ._oserr import failed_import, os_reason
from ._threads import import_on_a_blocking_thread

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_HUNG_UP", "EXIT_INTERRUPTED", "EXIT_TERMINATED",
           "QUIET_LOGGERS", "AnyCase", "build_parser", "configure_logging", "entry",
           "interrupts_held", "main", "named_by_spec_dir", "note_stop", "sigterm_as_ctrl_c",
           "stop_outcome", "stopped_early"]

#: exit code after Ctrl-C (128 + SIGINT)
EXIT_INTERRUPTED = 130
#: exit code after SIGTERM (128 + SIGTERM) of a command that ends on it with a line of its own
#: (``conform``, ``demo``: :data:`_SIGTERM_AS_CTRL_C`)
EXIT_TERMINATED = 143
#: exit code after a closed terminal's SIGHUP (128 + SIGHUP) of a command that ends on it with a
#: line of its own (``demo``: :data:`_SIGHUP_AS_CTRL_C`)
EXIT_HUNG_UP = 129
#: exit code when the reader of stdout went away (128 + SIGPIPE)
EXIT_BROKEN_PIPE = 141
#: the commands that stop on SIGTERM as on Ctrl-C, with one line (``terminated``) and exit 143
#: (``conform``, ``demo``): SIGTERM raises KeyboardInterrupt for them from the start (see
#: :func:`main`)
_SIGTERM_AS_CTRL_C = frozenset({"conform", "demo"})
#: the signals that stopped the running command, in the order their handlers noted them
#: (:func:`note_stop`); emptied as :func:`main` starts
_STOPS: list[int] = []
#: the commands for which a closed terminal's SIGHUP stops the run as Ctrl-C does, as SIGTERM
#: (``demo``: it stops its cluster and removes its temporary folder), with one line (``hung up``)
#: and exit 129, unless it is ignored (``nohup``)
_SIGHUP_AS_CTRL_C = frozenset({"demo"})


class _Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose ``--help``, ``--version`` and usage text on
    stdout is flushed and whose write errors are raised (argparse ignores them, so ``--help >
    /dev/full`` exited 0 having written nothing): :func:`main` turns them into one line and exit
    1, or exit 141 for a reader that went away. Writes to stderr stay best-effort. Subparsers are
    of this class too (``add_subparsers`` uses the parent's class)."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if not message or file is None:  # None: stdout (or stderr) closed, ``>&-``: discarded,
            return  # as print() does (argparse wrote --help to stderr then)
        if file is sys.stdout:
            file.write(message)
            file.flush()
            return
        super()._print_message(message, file)

    #: set on every command's parser (nested ones too) by :func:`build_parser`
    _is_command = False
    #: the arguments this parser was last given (:meth:`parse_known_args`), for :meth:`error`
    _given: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        """Write one line on stderr, ``PROG: error: MESSAGE``, and exit 2: argparse's error line
        without the usage text argparse wrote before it (the command line's rule: one line per
        error; ``--help`` shows the usage). A value of more than
        :data:`~flodl_proto.errors.SHOWN_CHARS` characters from the command line that
        ``message`` quotes (``invalid choice: 'xxx...'``, ``ignored explicit argument``,
        ``invalid int value``) or includes whole (``unrecognized arguments: ...``, ``ambiguous
        option: ...``) is shown as :func:`~flodl_proto.errors.shown` shows it, by its ends and
        its length, where argparse echoed it whole, and one holding a line break or another
        character that is not printable is quoted (``'a\\nb'``)
        (:func:`_long_arguments_shown`); a line break left in the message is escaped
        (:func:`_one_line`), so the error is one line whatever it says."""
        line = _one_line(_long_arguments_shown(message, self._given))
        self.exit(2, f"{self.prog}: error: {line}\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but the unknown arguments are listed as :func:`_unrecognized` lists
        them (the first few, then how many more; each as :func:`_long_arguments_shown` shows
        it)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(_unrecognized(extras))
        return namespace

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but a command's parser reports the arguments it does not know as its
        own usage error (``flodl-proto vectors check: error: unrecognized arguments: ...``, exit
        2), where argparse left them to the top-level parser, whose error line named no
        command. The top-level parser still reports those given before
        the command.

        Those are reported before a missing required argument: argparse checks the required
        ones first, before it returns the unknown ones, so ``flodl-proto conform --bogus`` said
        that ROLE is required. A parser with required arguments first parses with none required,
        to find the unknown ones, then as argparse does. A missing ROLE or ACTION (a required
        subcommand) is named with its choices: ``flodl-proto vectors: error: the following
        arguments are required: ACTION (choose from 'check', 'compare', 'export')``, as
        argparse names them for an invalid choice."""
        if args is None:
            args = sys.argv[1:]
        self._given = tuple(a for a in args if isinstance(a, str))
        if not self._is_command:
            return super().parse_known_args(args, namespace)
        required = [a for a in self._actions if a.required]
        if required:
            first = None if namespace is None else argparse.Namespace(**vars(namespace))
            for action in required:
                action.required = False
            try:
                first, extras = super().parse_known_args(args, first)
            finally:
                for action in required:
                    action.required = True
            if extras:
                self.error(_unrecognized(extras))
            for action in required:
                if (isinstance(action, argparse._SubParsersAction) and action.dest
                        and action.dest is not argparse.SUPPRESS
                        and getattr(first, action.dest, None) is None):
                    choices = ", ".join(map(repr, action.choices or ()))  # as argparse's
                    self.error(f"the following arguments are required: "
                               f"{action.metavar or action.dest} (choose from {choices})")
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(_unrecognized(extras))
        return namespace, extras


#: the characters :meth:`str.splitlines` ends a line at
_LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def _one_line(message: str) -> str:
    """``message`` with every character that ends a line (:data:`_LINE_BREAKS`) escaped as
    ``repr`` writes it (``\\n``, ``\\x85``, ``\\u2028``)."""
    return _LINE_BREAKS.sub(lambda m: repr(m[0])[1:-1], message)


#: a text argparse quotes in a message: a Python string literal (its ``%r`` of a value)
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'" r'|"(?:[^"\\\n]|\\.)*"')


#: the most characters of the list of unknown arguments a usage error includes (at least the
#: first argument): the rest are counted (:func:`_unrecognized`)
_UNRECOGNIZED_CHARS = 160


def _unrecognized(extras: Sequence[str]) -> str:
    """The usage error for the unknown arguments ``extras``: argparse's ``unrecognized
    arguments: A B C``, but each argument of more than :data:`~flodl_proto.errors.SHOWN_CHARS`
    characters, with a character that is not printable (a line break, an escape), empty or
    padded quoted (:func:`_argument_shown`), and only the first ones that fit in
    :data:`_UNRECOGNIZED_CHARS` characters (at least one), then ``... (N more)``: a command line
    of thousands of unknown words made a line of thousands of characters."""
    listed: list[str] = []
    size = 0
    for argument in extras:
        text = _argument_shown(argument)
        if listed and size + 1 + len(text) > _UNRECOGNIZED_CHARS:
            break
        listed.append(text)
        size += len(text) + (1 if size else 0)
    more = len(extras) - len(listed)
    return (f"unrecognized arguments: {' '.join(listed)}"
            + (f" ... ({more} more)" if more else ""))


def _argument_shown(argument: str) -> str:
    """A command-line argument as a usage error includes it: as it is, or as
    :func:`~flodl_proto.errors.shown` quotes it when it has more than
    :data:`~flodl_proto.errors.SHOWN_CHARS` characters or a character that is not printable,
    is empty or starts or ends with white space (:func:`~flodl_proto.errors.shown_name`)."""
    from .errors import shown_name

    return shown_name(argument)


def _long_arguments_shown(message: str, given: Sequence[str]) -> str:
    """``message`` of argparse (or of :meth:`_Parser.parse_known_args`) with every value from
    the arguments ``given`` that is longer than :data:`~flodl_proto.errors.SHOWN_CHARS` shown
    by :func:`~flodl_proto.errors.shown`: a quoted text (``%r``) that is one of them or the end
    of one (``--log-level=VALUE``, ``-hVALUE``), then one included whole. A value holding a
    character that is not printable (a line break, an escape; argparse quotes it with ``%r``
    or includes it whole, ``ambiguous option: --s=a<newline>b``) is quoted so where it is
    included whole. Other values, and everything else in the message, are left as they are."""
    import ast

    from .errors import SHOWN_CHARS, shown

    long = sorted({a for a in given if len(a) > SHOWN_CHARS or not a.isprintable()},
                  key=len, reverse=True)
    if not long:
        return message

    def requote(match: re.Match[str]) -> str:
        if len(match[0]) <= SHOWN_CHARS + 2:
            return match[0]
        try:
            value = ast.literal_eval(match[0])
        except (SyntaxError, ValueError):
            return match[0]
        if isinstance(value, str) and any(a.endswith(value) for a in long):
            return shown(value)
        return match[0]

    message = _QUOTED.sub(requote, message)
    for argument in long:
        message = message.replace(argument, _argument_shown(argument))
    return message


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand of :mod:`flodl_proto.commands`.

    No upstream counterpart (the command line is this package's own).
    """
    from . import commands
    from .spec import DEFAULT_VERSION, SUPPORTED_VERSIONS

    parser = _Parser(
        prog="flodl-proto",
        description="flodl cluster data-channel protocol: codec, reference controller, relay, "
        "rank client, interop vectors, docs.",
    )
    _add_log_level(parser, "WARNING")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} (data-channel protocol versions "
                                f"{', '.join(map(str, SUPPORTED_VERSIONS))}; default "
                                f"{DEFAULT_VERSION})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        mod.register(sub)
    _log_level_everywhere(sub)
    return parser


class AnyCase(tuple[str, ...]):
    """argparse ``choices=`` that take a choice in any case (``--log-level debug``); argparse
    checks the value as typed against them, so a bad one is echoed as the user typed it
    (``invalid choice: 'bogus'``), where a ``type=str.upper`` echoed it upper-cased. The value
    stored is the one typed: its reader normalizes the case.

    No upstream counterpart: a helper of this package's argparse command line."""

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and any(value.upper() == c.upper() for c in self)


def _add_log_level(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--log-level", default=default,
                        choices=AnyCase(("DEBUG", "INFO", "WARNING", "ERROR")),
                        help="logging level (default WARNING; before or after the command)")


def _log_level_everywhere(sub: argparse._SubParsersAction[Any]) -> None:
    """Give every subcommand (nested ones too) ``--log-level`` as well, so it may follow the
    command (``flodl-proto relay ... --log-level INFO``); its default there is no value, so a
    level given before the command stands unless the command's own overrides it. Each is marked
    as a command's parser (see :meth:`_Parser.parse_known_args`)."""
    for command in set(sub.choices.values()):
        _add_log_level(command, argparse.SUPPRESS)
        if isinstance(command, _Parser):
            command._is_command = True
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _log_level_everywhere(action)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``flodl-proto`` command line ``argv`` (None: ``sys.argv[1:]``) in this process;
    returns the exit code. The console script and ``python -m flodl_proto`` run :func:`entry`.

    For the commands of :data:`_SIGTERM_AS_CTRL_C` (``conform``, ``demo``), found in ``argv``
    before anything is imported, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so a SIGTERM
    that arrives while the parser and the command's modules load (about a second, before the
    command installs its own handler) is one line, ``COMMAND: terminated``, and exit 143, not a
    silent death by the signal (Ctrl-C: ``COMMAND: interrupted``, exit 130); the command
    restores this handler when it removes its own. For ``demo``
    (:data:`_SIGHUP_AS_CTRL_C`) SIGHUP too (``COMMAND: hung up``, exit 129), unless it is
    ignored (``nohup``): a closed terminal ended it by the signal, leaving its temporary
    folder. :func:`main` puts the previous handlers back when it returns (a program or a test
    runs commands in-process).

    No upstream counterpart (the command line is this package's own)."""
    return _run(argv, exits=False)


def entry() -> int:
    """What the ``flodl-proto`` console script and ``python -m flodl_proto`` run (through
    :mod:`flodl_proto._console`, which imports this module): :func:`main` of this process's
    command line, whose interpreter exits next with the returned code. The run is over, its
    output written, so from then on Ctrl-C and SIGTERM end the process at once with that code
    (after flushing stdout and stderr), and once the interpreter runs its exit functions they
    are ignored. Put back to their defaults there, they ended a
    finished run (``conform --help``, its reports written) with a silent death by the signal;
    ignored from the start of the exit, they could not stop an exit that waits for a thread.

    No upstream counterpart (the command line is this package's own)."""
    return _run(None, exits=True)


def _run(argv: Sequence[str] | None, *, exits: bool) -> int:
    """:func:`main` (``exits`` False) or :func:`entry` (True)."""
    command = _command_word(sys.argv[1:] if argv is None else argv)
    _STOPS.clear()  # a run of its own (main runs in-process again)
    # ignored when the process started (a background job): it stays so, also while it exits
    kept = (signal.SIGINT,) if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else ()
    signums: list[int] = [signal.SIGTERM] if command in _SIGTERM_AS_CTRL_C else []
    if command in _SIGHUP_AS_CTRL_C and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signums.append(signal.SIGHUP)
    previous: dict[int, Any] = {}
    try:
        for signum in signums:
            previous[signum] = signal.signal(signum, _sigterm_as_ctrl_c)
        if command == "controller" and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            # it stops cleanly on SIGTERM once it runs: one before is noted (stopped_early)
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, note_stop)
    except ValueError:  # not the main thread: no signal handlers there
        pass
    code: object = 1
    try:
        code = status = _main_one_line(argv, tuple(previous))
        return status
    except SystemExit as exc:  # argparse's --help, --version, usage error
        code = exc.code
        raise
    finally:
        if exits:
            _late_signals_end_with(code, tuple(previous), kept)
        else:
            for signum, handler in previous.items():  # None: not set from Python, the default
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _main_one_line(argv: Sequence[str] | None, as_ctrl_c: tuple[int, ...]) -> int:
    """:func:`_main`, with Ctrl-C (and the signals ``as_ctrl_c``), a failed write to stdout and
    a ``MemoryError`` no command turned into a line of its own as one line (or none)."""
    prog = ["flodl-proto"]  # the command's, once the command line is parsed
    try:  # everything beyond the standard library is imported in here, so Ctrl-C is one line
        return _main(argv, prog)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot interrupt this
        for signum in as_ctrl_c:
            signal.signal(signum, signal.SIG_IGN)  # nor a second SIGTERM (or SIGHUP)
        _stdout_gone()
        if prog[0] == "flodl-proto":  # not parsed yet: as it will be, from the command line
            prog[0] = _argv_prog(sys.argv[1:] if argv is None else argv)
        word, code = stop_outcome()
        print(f"{prog[0]}: {word}", file=sys.stderr, flush=True)
        return code
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # e.g. stdout is a full disk (``> /dev/full``): one line, not a trace
        _flush_or_quiet_stdout()
        if prog[0] == "flodl-proto":  # not parsed yet (``--help`` writes while parsing)
            prog[0] = _argv_prog(sys.argv[1:] if argv is None else argv)
        from .errors import shown_file  # loaded with the commands, before any of them ran
        what = f"{shown_file(exc.filename)}: " if exc.filename else "cannot write output: "
        print(f"{prog[0]}: error: {what}{os_reason(exc)}", file=sys.stderr, flush=True)
        return 1
    except RuntimeError as exc:  # the spec failed to load, when the parser first imported it
        if type(exc).__name__ != "SpecError" or type(exc).__module__ != "flodl_proto.spec":
            raise
        return _spec_failure(exc, prog[0] if prog[0] != "flodl-proto" else _argv_prog(
            sys.argv[1:] if argv is None else argv))
    except MemoryError:  # where a command has no more precise line of its own: one line
        _flush_or_quiet_stdout()
        print(f"{prog[0]}: error: out of memory", file=sys.stderr, flush=True)
        return 1
    except ImportError as exc:  # a dependency that fails to load (a broken NumPy): one line
        _flush_or_quiet_stdout()
        print(f"{_argv_prog(sys.argv[1:] if argv is None else argv)}: error: cannot import "
              f"{failed_import(exc)}: {_one_line(str(exc))}", file=sys.stderr, flush=True)
        return 1


def _spec_failure(exc: RuntimeError, prog: str) -> int:
    """One line for a spec that fails to load (``SpecError``; the failed import leaves it
    unimportable by name): named by ``$FLODL_PROTO_SPEC_DIR`` and its folder when that is set
    (exit 2, as a bad ``FLODL_NET_TIMEOUT_SCALE``), else by the package's own spec folder
    (``spec folder DIR: lifecycle.yaml: ...``; exit 1: a packaging defect, or an edit)."""
    folder = os.environ.get("FLODL_PROTO_SPEC_DIR")
    text = named_by_spec_dir(str(exc))
    if not folder:  # the package's own spec (an edited checkout's): named by its folder
        with contextlib.suppress(Exception):  # its wire.yaml failed: the text names it already
            from .spec import SPEC, in_spec_folder
            text = in_spec_folder(SPEC.path, text)
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    return 2 if folder else 1


def named_by_spec_dir(text: str) -> str:
    """``text``, a problem of the spec folder in use, after ``FLODL_PROTO_SPEC_DIR=FOLDER: ``
    when that variable names the folder (the folder shown as typed, quoted when it holds blanks
    at either end or a character that does not print) and ``text`` does not start so already;
    else ``text`` as it is. Raises nothing.

    Upstream: none (upstream's spec is its code)."""
    folder = os.environ.get("FLODL_PROTO_SPEC_DIR")
    if not folder or text.startswith("FLODL_PROTO_SPEC_DIR="):
        return text
    shown = folder if folder.isprintable() and folder == folder.strip() else repr(folder)
    return f"FLODL_PROTO_SPEC_DIR={shown}: {text}"


def _late_signals_end_with(code: object, also: tuple[int, ...],
                           ignored: tuple[int, ...] = ()) -> None:
    """After :func:`main` ran this process's command line, with exit code (or ``SystemExit``
    code) ``code``: Ctrl-C, SIGTERM and the signals ``also`` end the process with it at once,
    and are ignored from the interpreter's exit functions on (the interpreter puts Python
    handlers back to the default after them). The signals ``ignored`` (ignored when the process
    started) are left as they are."""
    signums = tuple(s for s in dict.fromkeys((signal.SIGINT, signal.SIGTERM, *also))
                    if s not in ignored)
    status = code if isinstance(code, int) else 0 if code is None else 1

    def end(signum: int, frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        os._exit(status)

    try:
        for signum in signums:
            signal.signal(signum, end)
    except ValueError:  # not the main thread
        return
    atexit.register(_ignore, signums)


def _ignore(signums: tuple[int, ...]) -> None:
    """Ignore the signals ``signums`` (the interpreter is exiting)."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) and SIGTERM (and SIGHUP when Python handles it: the demo's, see
    :func:`main`) while the block runs, then deliver them to the handlers in place before it
    (for ``conform`` and ``demo`` they raise KeyboardInterrupt; a SIGTERM still at its default
    ends the process, as for the other commands before they set their own handler). For the
    imports of NumPy and the codec, by every command that runs them: an extension module whose
    import is interrupted prints the traceback itself and raises an ImportError (ml_dtypes:
    ``numpy._core.multiarray failed to import``), where Ctrl-C should be one line. Nothing is
    held outside the main thread (no signal handler runs there). NumPy, when not loaded yet,
    loads first, on a thread that blocks the stop signals
    (:func:`~flodl_proto._threads.import_on_a_blocking_thread`), so the worker threads OpenBLAS
    starts then block them as the package's own threads do.

    The held signals are delivered in the order they arrived, so the first decides the stop
    (:func:`stop_outcome`: a SIGTERM then a Ctrl-C is ``terminated``): CPython runs the
    handlers of signals that arrive while C code runs (an extension module's import) in
    signal-number order, SIGINT's before SIGTERM's, so the order is read from a wakeup fd
    (:func:`signal.set_wakeup_fd`), to which the interpreter writes each signal's number as it
    arrives; the wakeup fd in place before is put back, and given the other signals' numbers.

    No upstream counterpart: upstream's binaries are compiled, with no imports to interrupt."""
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    wakeup: tuple[int, int] | None = None  # the pipe's read and write ends
    previous_fd = -1
    try:
        previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
        if callable(signal.getsignal(signal.SIGHUP)):  # the demo's (:func:`main`)
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hold)
    except ValueError:  # not the main thread
        previous = {}
    if previous:
        try:
            wakeup = os.pipe()
            for fd in wakeup:
                os.set_blocking(fd, False)
            previous_fd = signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
        except (OSError, ValueError):  # no file descriptor left: the order the handlers ran
            if wakeup is not None:
                for fd in wakeup:
                    os.close(fd)
            wakeup = None
    try:
        import_on_a_blocking_thread("numpy")  # OpenBLAS's threads block the stop signals
        yield
    finally:
        arrived = b""
        if wakeup is not None:
            signal.set_wakeup_fd(previous_fd)
            with contextlib.suppress(OSError):  # BlockingIOError: none arrived
                arrived = os.read(wakeup[0], 4096)
            for fd in wakeup:
                os.close(fd)
        for s, handler in previous.items():  # None: not set from Python, taken as the default
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        others = bytes(b for b in arrived if b not in previous)
        if others and previous_fd >= 0:  # the previous wakeup fd's reader gets its signals
            with contextlib.suppress(OSError):
                os.write(previous_fd, others)
        order = [b for b in arrived if b in held] + held  # held: those the wakeup fd missed
        for signum in dict.fromkeys(order):
            signal.raise_signal(signum)


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM stops the running command as Ctrl-C does: the signal is noted
    (:func:`note_stop`) and raised as KeyboardInterrupt, so :func:`main` ends the command with
    one line, ``COMMAND: terminated``, and exit 143 (:data:`EXIT_TERMINATED`), where a SIGTERM
    still at its default ended the process by the signal, with no line. For a wait of a command
    that handles neither signal yet and may last long: ``relay``'s start-up lookup of its
    controller's host name (up to 10 s x ``FLODL_NET_TIMEOUT_SCALE``), before it sets its own
    handlers. A SIGTERM ignored when the block starts stays ignored; outside the main thread
    (no signal handler runs there) the block runs unchanged. The handler in place before is put
    back after the block. Ctrl-C is left as it is. Raises nothing itself.

    No upstream counterpart (the command line is this package's own)."""
    installed, previous = False, None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            previous = signal.signal(signal.SIGTERM, _sigterm_as_ctrl_c)
            installed = True
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        if installed:  # None: not set from Python, taken as the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _sigterm_as_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM handler of :func:`main` for ``conform`` and ``demo`` (and SIGHUP's for ``demo``):
    as Ctrl-C, the signal noted (:func:`note_stop`)."""
    note_stop(signum)
    raise KeyboardInterrupt


def stopped_early() -> bool:
    """Whether a SIGTERM was noted (:func:`note_stop`) before the running command set its own
    handler: ``controller`` then stops as once it runs, before it binds its port. Raises
    nothing. No upstream counterpart (the command line is this package's own)."""
    return signal.SIGTERM in _STOPS


def note_stop(signum: int, frame: object = None) -> None:
    """Note that the signal ``signum`` (SIGINT, SIGTERM, SIGHUP) stops the running command:
    called by the signal handlers that stop a command (:func:`main`'s for ``conform`` and
    ``demo``, and those commands' own); :func:`main`'s SIGTERM handler for ``controller``. The
    first signal noted in a run decides the line and the exit code of the stop
    (:func:`stop_outcome`). Raises nothing; safe in a signal handler.

    No upstream counterpart (the command line is this package's own)."""
    _STOPS.append(signum)


def stop_outcome() -> tuple[str, int]:
    """The word and the exit code of a command stopped by a signal (its line is ``COMMAND:
    WORD``), after the first signal :func:`note_stop` noted in this run: ``("terminated",
    143)`` (:data:`EXIT_TERMINATED`, 128 + SIGTERM) for SIGTERM, ``("hung up", 129)``
    (:data:`EXIT_HUNG_UP`, 128 + SIGHUP) for the demo's SIGHUP (a closed terminal), else
    ``("interrupted", 130)`` (:data:`EXIT_INTERRUPTED`, 128 + SIGINT): a Ctrl-C (Python's own
    handler raises KeyboardInterrupt without noting it). This is the one table of the stop
    words and codes. Raises nothing.

    No upstream counterpart (the command line is this package's own)."""
    first = _STOPS[0] if _STOPS else None
    if first == signal.SIGTERM:
        return "terminated", EXIT_TERMINATED
    if first == signal.SIGHUP:
        return "hung up", EXIT_HUNG_UP
    return "interrupted", EXIT_INTERRUPTED


def _command_word(args: Sequence[str]) -> str | None:
    """The command named in ``args``, found before the parser is built: the first word that is
    neither an option nor the value of the top-level ``--log-level`` (or of an abbreviation of
    it, as argparse takes); None when there is none."""
    words = iter(args)
    for word in words:
        if word == "--":
            return next(words, None)
        if not word.startswith("-"):
            return word
        if "=" not in word and len(word) > 2 and "--log-level".startswith(word):
            next(words, None)  # its value
    return None


def _argv_prog(args: Sequence[str]) -> str:
    """The prefix :func:`_command_prog` gives once ``args`` are parsed, found in them before:
    the command word (:func:`_command_word`) when it names a command, with the next such word
    for ``conform`` and ``vectors`` (their role or action, as typed) and the value of ``--rank``
    for ``rank``; ``flodl-proto`` when there is no command."""
    from . import commands

    command = _command_word(args)
    if command is None or command.startswith("_") or command not in {
            m.name for m in pkgutil.iter_modules(commands.__path__)}:
        return "flodl-proto"
    rest = list(args)[list(args).index(command) + 1:]
    word: object = None
    if command in ("conform", "vectors"):
        word = _command_word(rest)
    elif command == "rank":
        for arg, value in zip(rest, [*rest[1:], None], strict=True):
            if arg.startswith("--rank="):
                value = arg[len("--rank="):]
            elif arg != "--rank" or value is None:
                continue
            with contextlib.suppress(ValueError):  # as --rank's type, whole_number, reads it
                word = int(value) if plain_number(value) else None
    return f"flodl-proto {command}" + (f" {word}" if word is not None else "")


def _stdout_gone() -> bool:
    """True when stdout is a pipe whose reader has gone; then point stdout at /dev/null so the
    interpreter's final flush cannot fail again."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return gone


def _flush_or_quiet_stdout() -> None:
    """Flush stdout; when that fails too (the failed write was stdout's), point stdout at
    /dev/null, so the output still waiting there and the interpreter's final flush cannot fail
    again."""
    try:
        sys.stdout.flush()
        return
    except (AttributeError, OSError, ValueError):
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass


#: loggers of other packages held at WARNING whatever ``--log-level`` says (python-statemachine
#: logs every event it processes at DEBUG)
QUIET_LOGGERS: tuple[str, ...] = ("statemachine",)


def configure_logging(level: str) -> None:
    """Send log records to stderr in the format ``DATE TIME LEVEL LOGGER: MESSAGE`` at ``level``
    (a ``--log-level`` name, any case; an unknown one is WARNING); the loggers of
    :data:`QUIET_LOGGERS` stay at WARNING, or at ``level`` when that is higher. The command line
    and the demo's rank processes call it once at start.

    No upstream counterpart: the logging set-up of this package's command line."""
    value = getattr(logging, str(level).upper(), None)
    value = value if isinstance(value, int) else logging.WARNING
    logging.basicConfig(level=value, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(value, logging.WARNING))


def _command_prog(args: argparse.Namespace) -> str:
    """The prefix of the command's own error lines: ``flodl-proto decode``, ``flodl-proto rank
    0`` (a rank adds its id), ``flodl-proto conform controller`` and ``flodl-proto vectors check``
    (as argparse's own lines), or ``flodl-proto`` when no command was given."""
    command = getattr(args, "command", None)
    if not command:
        return "flodl-proto"
    extra = {"rank": "rank", "conform": "role", "vectors": "vectors_command"}.get(command)
    word = getattr(args, extra, None) if extra else None  # as argparse's own prefix
    return f"flodl-proto {command}" + (f" {word}" if word is not None else "")


def _check_kernels(parser: argparse.ArgumentParser, prog: str) -> None:
    """Check the kernel choice ``FLODL_PROTO_KERNELS`` (unset or empty: auto, nothing to check)
    and set the numba backend it names, so a bad choice is a usage error now, not at the first
    bf16 reduce of every process: one line on stderr prefixed with ``prog``, the command's
    prefix (:func:`_command_prog`: ``flodl-proto demo: error: ...``, as every other error line of
    the command), and exit 2 (``parser.exit``, which raises ``SystemExit``).

    No upstream counterpart: flodl has no such environment variable."""
    from .spec import KERNELS_ENV

    kernels = os.environ.get(KERNELS_ENV, "")
    if not kernels.strip():  # NumPy not imported
        return
    with interrupts_held():  # NumPy and the codec load: Ctrl-C after, as one line
        from .errors import LocalProtocolError
        from .reduce._kernels import check_backend_name, set_kernel_backend

    try:
        if check_backend_name(kernels, origin=KERNELS_ENV) == "numba":
            set_kernel_backend()
    except LocalProtocolError as exc:
        parser.exit(2, f"{prog}: error: {_one_line(str(exc))}\n")


def _main(argv: Sequence[str] | None, prog: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        prog[0] = _command_prog(args)
        _check_kernels(parser, prog[0])
        configure_logging(getattr(args, "log_level", "WARNING"))
    except KeyboardInterrupt:  # before the command runs: its hook, if it has one
        stopped = getattr(args, "stopped_before_run", None)
        if stopped is not None:
            stopped(args)
        raise
    func = getattr(args, "func", None)
    if func is None:  # no command: a usage error naming the commands, as for a missing ACTION
        commands_ = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser.error(f"the following arguments are required: COMMAND (choose from "
                     f"{', '.join(map(repr, commands_.choices or ()))})")
    code = int(func(args))
    if sys.stdout is not None:  # None: started with stdout closed (``>&-``)
        sys.stdout.flush()  # a reader that went away is noticed here, not at interpreter exit
    return code


if __name__ == "__main__":  # pragma: no cover
    # ``python -m flodl_proto.cli``: run the entry point of the module the commands import
    # (``flodl_proto.cli``), not of this copy (``__main__``), so the stop signals their handlers
    # note (:func:`note_stop`) are those :func:`stop_outcome` reads
    from . import cli as _imported

    sys.exit(_imported.entry())

"""``flodl-proto docs [--out PATH] [--spec DIR] [--check]``: generate the protocol reference from
the spec.

Writes the checkout's ``docs/protocol.md`` (or ``--out``) from ``wire.yaml`` and ``lifecycle.yaml``
(the checkout the current folder is in, found from it up, so a run from a subfolder writes no second
file there; outside a checkout, ``docs/protocol.md`` from the current folder); with ``--check``
writes nothing and exits 1 when the file is missing or differs from what the spec generates (for
CI). The spec read is ``--spec DIR``'s; without it, the one of the checkout the output belongs to:
the nearest ``spec/wire.yaml`` found walking up from the output's folder (so an installed package
run inside a source checkout documents that checkout's spec, not the copy installed with it); else
the one the package loads (``$FLODL_PROTO_SPEC_DIR``'s when it is set). Inside a checkout the
checkout's spec is documented with the variable set too (the file written is the checkout's, which
its ``--check`` compares with its spec), and the result line says so: ``'docs/protocol.md': written
(N bytes) (spec: spec/wire.yaml, the checkout's, not FLODL_PROTO_SPEC_DIR's: give --spec DIR to
document that one)``; with ``--out -`` (the current folder's checkout) stdout holds the document
alone and a note on stderr says so: ``flodl-proto docs: note: written to stdout (spec:
spec/wire.yaml, the checkout's, not FLODL_PROTO_SPEC_DIR's: ...)``. ``--check`` of the spec the
codec runs on (the package's, or ``$FLODL_PROTO_SPEC_DIR``'s) checks its worked examples against
the codec first (:mod:`flodl_proto.commands._docs_examples`: an example the codec refuses or
writes otherwise is a spec that cannot be loaded); without ``--check`` the command loads neither
NumPy nor the codec. The spec file read is named on every result line, and a failed
``--check`` names the command that regenerates the file (with the ``--spec DIR`` it was given).
Exit codes: 0 written or up to date, 1 out of date (``--check``), the output cannot be written,
or the checkout's or the package's own spec cannot be loaded (either file: ``spec folder DIR:
lifecycle.yaml: ...``), 2 for a bad command line (``--check`` with ``--out -``; a PATH that
names a folder or has a file, or a loop of symbolic links, where a folder of it should be, or
is such a loop; a ``--spec`` DIR that is a file or a loop of symbolic links, or has one where a
folder of it should be), a spec the user named that cannot be loaded (``--spec`` DIR's, or
``$FLODL_PROTO_SPEC_DIR``'s), or (``--check``) a PATH that cannot be read (one line naming it
and the OS error; a PATH that does not exist is ``missing``, exit 1). A PATH that is not UTF-8
text is out of date (rewritten without ``--check``). A refused ``--out`` or ``--spec`` reads as
argparse words a refused value, ``argument --spec: ...``, a spec DIR holds that cannot be
loaded with DIR first, ``argument --spec: DIR: wire.yaml: ...``, as
``FLODL_PROTO_SPEC_DIR=DIR: wire.yaml: ...`` names its folder.
"""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

from .._files import make_folders, replace_file
from .._oserr import os_reason
from ..docs import DEFAULT_OUT, render_protocol_doc
from ..errors import shown, shown_name
from ..spec import (
    SPEC,
    SPEC_DIR_ENV,
    Spec,
    SpecError,
    check_lifecycle,
    in_given_folder,
    in_spec_folder,
)
from ._option_error import option_message
from ._paths import file_in_the_way, names_a_folder, output_path

__all__ = [
    "check_generated",
    "checkout_file",
    "read_for_check",
    "register",
    "spec_dir_for",
    "stdout_check",
    "write_generated",
    "write_output",
]

_PROG = "flodl-proto docs"


def _spec_folder(text: str) -> Path:
    """argparse ``type=`` of ``--spec``: a folder path, not empty (an empty path is the current
    folder: ``--spec ''`` read "cannot load wire.yaml").

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty, or is a file (a FIFO, a device) or has
            one where a folder of it should be (:func:`~._paths.file_in_the_way`: ``'a-file/':
            Not a directory (a-file is a file, not a folder)``; it read ``cannot load
            a-file/wire.yaml: Not a directory``), or is a loop of symbolic links or has one
            there (``'loop1': Too many levels of symbolic links (loop1 is a loop of symbolic
            links)``; it ended the command with a traceback).
    """
    if not text:
        raise argparse.ArgumentTypeError("is empty; give the folder holding wire.yaml")
    path = Path(text)
    if (why := file_in_the_way(text, path)) is not None:
        raise argparse.ArgumentTypeError(why)
    return path


def checkout_file(relative: Path) -> Path:
    """The default output ``relative`` (e.g. ``docs/protocol.md``) of a generator: that path in
    the source checkout the current folder is in (the nearest folder at or above it holding
    ``spec/wire.yaml``), so a command run from a subfolder of a checkout writes the checkout's
    file, not a new one beside it; ``relative`` itself (from the current folder) outside a
    checkout.

    No upstream counterpart: upstream ships no generator commands.
    """
    here = Path.cwd()
    root = _checkout_root(here)
    return relative if root is None else Path(os.path.relpath(root / relative, here))


def _checkout_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``spec/wire.yaml`` (a source checkout),
    or None."""
    for folder in (start, *start.parents):
        if (folder / "spec" / "wire.yaml").is_file():
            return folder
    return None


def register(sub: Any) -> None:
    """Add the ``docs`` subcommand to the CLI's subparsers.

    No upstream counterpart: upstream ships no generator commands (its protocol is documented
    by its source, not generated from a spec).
    """
    p = sub.add_parser(
        "docs", help="generate docs/protocol.md from the spec",
        description="Write the protocol reference (message layouts, constants, limits, "
        "lifecycles, worked examples) generated from spec/wire.yaml and spec/lifecycle.yaml, "
        "or with --check tell whether the written file is up to date.")
    p.add_argument("--out", type=output_path, default=None, metavar="PATH",
                   help=f"output file (default: the checkout's {DEFAULT_OUT}, found from the "
                   "current folder up, else that path here; '-' writes to stdout); missing "
                   "parent folders are created")
    p.add_argument("--spec", type=_spec_folder, default=None, metavar="DIR",
                   help="folder holding wire.yaml and lifecycle.yaml (default: the spec/ of the "
                   "checkout PATH is in, even with FLODL_PROTO_SPEC_DIR set, else the one the "
                   "package loads, FLODL_PROTO_SPEC_DIR's when set)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if PATH is missing or out of date, 2 if it "
                   "cannot be read")
    p.set_defaults(func=_run)


def read_for_check(path: Path) -> bytes | None:
    """The bytes of the generated file ``path`` that a ``--check`` compares, or None when there
    is none: no such path (a dangling link included), or a device or pipe rather than a file
    (never read, so a check cannot block on it).

    Raises:
        OSError: ``path`` cannot be read (a folder, a link loop, a file where a folder of the path
            should be, no permission); ``strerror`` says why.

    No upstream counterpart: upstream ships no generated files to check.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        return None
    return path.read_bytes()


def _special_file(path: Path) -> str | None:
    """What ``path`` is when it exists and is neither a file nor a folder (``a FIFO``, ``a
    character device``, ``a block device``, ``a socket``), else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def check_generated(out: Path, text: str, prog: str, regenerate: str, source: str = "") -> int:
    """The ``--check`` of a generated file: compare ``out`` with ``text`` and say so in one line.

    Args:
        out: the generated file (the check's input path).
        text: what the generator writes there now.
        prog: the program name that prefixes an error line.
        regenerate: the command line that rewrites ``out``, named when it differs.
        source: words added after the path (e.g. the spec it was generated from).

    Returns:
        0 when ``out`` holds exactly ``text`` (``'PATH': up to date`` on stdout); 1 when it is
        missing or differs: one line on stderr, ``PROG: error: 'PATH': missing`` (or ``out of
        date``, the path quoted as every line naming a path of the command line quotes it), then
        ``source`` and the ``regenerate`` command to run, in the form of every other failure line of
        the command; 2 when it cannot be read, as any input path (:func:`read_for_check`), or is a
        FIFO, a device or a socket (never read): one line in argparse's words for the option,
        ``PROG: error: argument --out: cannot read 'PATH': REASON`` or ``argument --out: 'PATH' is a
        FIFO, not a file (never read: ...)``.

    No upstream counterpart: upstream ships no generated files to check.
    """
    try:
        found = read_for_check(out)
        special = None if found is not None else _special_file(out)
    except OSError as e:
        why = option_message("--out", f"cannot read {shown(str(out))}: {os_reason(e)}")
        print(f"{prog}: error: {why}", file=sys.stderr)
        return 2
    if special is not None:  # it exists: an input path that is no file, not a missing one
        why = option_message("--out", f"{shown(str(out))} is {special}, not a file (never read: "
                                      "a check compares a file)")
        print(f"{prog}: error: {why}", file=sys.stderr)
        return 2
    tail = f" {source}" if source else ""
    if found == text.encode("utf-8"):
        print(f"{shown(str(out))}: up to date{tail}")
        return 0
    state = "missing" if found is None else "out of date"
    run = f"`{regenerate}`" if regenerate.isprintable() else shown(regenerate)  # one line
    print(f"{prog}: error: {shown(str(out))}: {state}{tail}; run {run}", file=sys.stderr)
    return 1


def write_output(out: Path, data: bytes, prog: str, source: str = "") -> int:
    """Write ``data`` to the output file ``out`` of a generator command; say so in one line.

    The one write of every generator (``docs``, ``conform docs``, ``dissector``): missing parent
    folders are created, then ``out`` is replaced whole, atomically
    (:func:`flodl_proto._files.replace_file`): a failed write (a full disk, a crash) leaves the
    previous file as it was and no temporary file behind.

    Args:
        out: the output file; missing parent folders are created.
        data: the bytes written (the generated text, UTF-8, ``\\n`` line ends).
        prog: the program name that prefixes an error line (``flodl-proto docs``).
        source: words added after the path on the success line (e.g. the spec it came from).

    Returns:
        0 when ``out`` was written: ``'PATH': written (N bytes)`` on stdout (N in bytes), unless
        ``out`` is stdout itself (``/dev/stdout``), which then holds the document alone, as with
        ``--out -``; 1 when it cannot be written, one line on stderr ``PROG: error: cannot write
        'PATH': WHY``, the path quoted as on every line naming a path of the command line (a folder
        made since the command line was read, in the words :func:`~._paths.output_path` refuses one
        with: ``argument --out: 'out' names a folder (an existing one); ...``; a file where a folder
        of the path should be: ``Not a directory`` at whichever level, no
        permission), with the step that failed for a reason of a folder
        (:func:`flodl_proto._files.make_folders`: ``creating the folder a-file/sub: Not a
        directory (a-file is not a folder)``; :func:`flodl_proto._files.replacing`). No
        traceback.

    No upstream counterpart: upstream ships no generator commands (its protocol is documented
    by its source, not generated from a spec).
    """
    try:
        if out.is_dir():  # inside the try: a name too long raises here, not False
            # a folder made after the command line was read (output_path refuses one before)
            why = names_a_folder(str(out), "an existing one")
            print(f"{prog}: error: {option_message('--out', why)}", file=sys.stderr)
            return 1
        make_folders(out.parent)
        replace_file(out, data)
    except OSError as e:
        print(f"{prog}: error: cannot write {shown(str(out))}: {os_reason(e)}",
              file=sys.stderr)
        return 1
    if _is_stdout(out):  # e.g. /dev/stdout: the document is stdout, as with --out -
        return 0
    tail = f" {source}" if source else ""
    print(f"{shown(str(out))}: written ({len(data)} bytes){tail}")
    return 0


def _is_stdout(out: Path) -> bool:
    """Whether ``out`` (through its links) is the file open as this process's stdout: a
    ``/dev/stdout`` or ``/proc/self/fd/1`` path, or the stdout's own file by name. False when
    either cannot be looked at."""
    try:
        here, there = os.stat(out), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no stdout, or one with no descriptor
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def write_generated(out: Path, text: str, prog: str, source: str = "") -> int:
    """Write the generated file ``out`` unless it already holds ``text``; say so in one line.

    Args:
        out: the generated file; missing parent folders are created.
        text: what the generator writes there (UTF-8, ``\\n`` line ends).
        prog: the program name that prefixes an error line.
        source: words added after the path (e.g. the spec it was generated from).

    Returns:
        0 when ``out`` already held ``text`` (``'PATH': up to date`` on stdout; a file that is not
        UTF-8 text is out of date and rewritten), else what :func:`write_output` returns.

    No upstream counterpart: upstream ships no generator commands (its protocol is documented
    by its source, not generated from a spec).
    """
    data = text.encode("utf-8")
    try:
        current = read_for_check(out)
    except OSError:  # unreadable: write_output says why it cannot be replaced either
        current = None
    if current == data:
        tail = f" {source}" if source else ""
        print(f"{shown(str(out))}: up to date{tail}")
        return 0
    return write_output(out, data, prog, source)


def stdout_check(prog: str) -> int:
    """``--check --out -``: stdout is no file to compare; one line on stderr, exit 2 (a bad
    command line), so a check never passes by printing the text instead.

    No upstream counterpart: upstream ships no generated files to check.
    """
    why = option_message("--out", "'-': stdout is no file to compare (--check compares a file)")
    print(f"{prog}: error: {why}", file=sys.stderr)
    return 2


def spec_dir_for(out: Path | None) -> Path:
    """The spec folder documenting ``out``: the nearest ``spec/`` holding ``wire.yaml`` at or
    above ``out``'s folder (``None`` or ``-``: the current folder), else the package's spec.

    No upstream counterpart: upstream has no spec files (its protocol lives in its source).
    """
    if out is None or str(out) == "-":
        start = Path.cwd()
    else:
        try:
            start = out.resolve().parent
        except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13)
            start = out.absolute().parent
    root = _checkout_root(start)
    return SPEC.path if root is None else root / "spec"


def _shown(path: Path) -> str:
    """How a result line names the spec file ``path`` it read, after ``spec:``: relative to
    the current folder when it is under it, as it is otherwise, and quoted only when it must
    be (:func:`~flodl_proto.errors.shown_name`: a line break, an escape), as a line names a
    path in parentheses."""
    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(path)
    return shown_name(text)


def _variable_passed_over(spec_dir: Path) -> str:
    """What the result line adds after the spec file when ``docs`` documented ``spec_dir``,
    the spec of the checkout its output is in, while ``$FLODL_PROTO_SPEC_DIR`` names another,
    as its precedence has it (``--spec DIR``, then the output's checkout, then the spec the
    package loads, the variable's): ``, the checkout's, not FLODL_PROTO_SPEC_DIR's: give
    --spec DIR to document that one`` (DIR the variable's folder, quoted for a shell); nothing
    without the variable, or when its folder is ``spec_dir``."""
    folder = os.environ.get(SPEC_DIR_ENV)
    if not folder:
        return ""
    try:
        if Path(folder).resolve() == spec_dir.resolve():
            return ""
    except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13)
        pass
    named = shlex.quote(folder) if folder.isprintable() else "DIR"
    return f", the checkout's, not {SPEC_DIR_ENV}'s: give --spec {named} to document that one"


def _spec_problem(given: Path | None, spec_dir: Path, text: str) -> tuple[str, int]:
    """The line and the exit code of the spec in ``spec_dir`` that fails to load (``text``):
    a spec the user named is a bad command line, exit 2, the ``--spec`` DIR ``given`` (the
    option's value, named so with its folder: ``argument --spec: DIR: wire.yaml: ...``) or
    ``$FLODL_PROTO_SPEC_DIR``'s (``FLODL_PROTO_SPEC_DIR=DIR: lifecycle.yaml: ...``); the
    package's own or the checkout's (``spec folder DIR: lifecycle.yaml: ...``) is a runtime
    failure, exit 1, whichever of its files fails, as every other command ends on it."""
    if given is not None:
        return option_message("--spec", in_given_folder(given, text)), 2
    if spec_dir.resolve() != SPEC.path.resolve():  # a checkout's, not the one loaded
        return in_spec_folder(spec_dir, text), 1
    from ..cli import named_by_spec_dir

    return (in_spec_folder(spec_dir, named_by_spec_dir(text)),
            2 if os.environ.get(SPEC_DIR_ENV) else 1)


def _run(args: argparse.Namespace) -> int:
    out: Path = args.out if args.out is not None else checkout_file(DEFAULT_OUT)
    spec_dir = args.spec if args.spec is not None else spec_dir_for(out)
    try:
        spec = SPEC if spec_dir.resolve() == SPEC.path.resolve() else Spec(spec_dir)
        lifecycle = spec.lifecycle()  # the document's lifecycle section: required
        check_lifecycle(lifecycle)
        if args.check and str(out) != "-" and spec is SPEC:  # the spec the codec runs on
            from ..cli import interrupts_held

            with interrupts_held():  # NumPy and the codec load: Ctrl-C after, as one line
                from ._docs_examples import check_examples
            check_examples(spec.raw["examples"], spec.default_version)
    except SpecError as e:
        why, code = _spec_problem(args.spec, spec_dir, str(e))
        print(f"{_PROG}: error: {why}", file=sys.stderr)
        return code
    text = render_protocol_doc(spec, lifecycle)
    passed_over = _variable_passed_over(spec_dir) if args.spec is None and spec is not SPEC else ""
    source = f"(spec: {_shown(spec_dir / 'wire.yaml')}{passed_over})"
    if str(out) == "-":
        if args.check:
            return stdout_check(_PROG)
        print(text, end="")  # a closed stdout (None) takes nothing
        if passed_over:  # stdout holds the document alone: whose spec it is goes to stderr
            print(f"{_PROG}: note: written to stdout {source}", file=sys.stderr)
        return 0
    if args.check:  # PATH is the input: one that cannot be read is exit 2, as any input path
        # the spec given is named too: without it the command regenerates from the checkout's
        again = f" --spec {shlex.quote(str(args.spec))}" if args.spec is not None else ""
        return check_generated(out, text, _PROG,
                               f"flodl-proto docs --out {shlex.quote(str(out))}{again}", source)
    return write_generated(out, text, _PROG, source)

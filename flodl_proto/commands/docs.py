"""``flodl-proto docs [--out PATH] [--spec DIR] [--check]``: generate the protocol reference from
the spec.

Writes ``docs/protocol.md`` (or ``--out``) from ``wire.yaml`` and ``lifecycle.yaml``; with
``--check`` writes nothing and exits 1 when the file is missing or differs from what the spec
generates (for CI). The spec read is the one of the checkout the output belongs to: the nearest
``spec/wire.yaml`` found walking up from the output's folder (so an installed package run inside
a source checkout documents that checkout's spec, not the copy installed with it); else ``--spec
DIR``'s; else the one the package loads. The spec file read is named on every result line.
Exit codes: 0 written or up to date, 1 out of date (``--check``) or the output cannot be written,
2 for a bad command line, an unreadable spec, or (``--check``) a PATH that cannot be read (one
line naming it and the OS error; a PATH that does not exist is ``missing``, exit 1).
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any

from ..docs import DEFAULT_OUT, render_protocol_doc
from ..spec import SPEC, Spec, SpecError

__all__ = ["read_for_check", "register", "spec_dir_for"]

_PROG = "flodl-proto docs"


def register(sub: Any) -> None:
    """Add the ``docs`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "docs", help="generate docs/protocol.md from the spec",
        description="Write the protocol reference (message layouts, constants, limits, "
        "lifecycles, worked examples) generated from spec/wire.yaml and spec/lifecycle.yaml, "
        "or with --check tell whether the written file is up to date.")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="PATH",
                   help=f"output file (default: {DEFAULT_OUT}; '-' writes to stdout); missing "
                   "parent folders are created")
    p.add_argument("--spec", type=Path, default=None, metavar="DIR",
                   help="folder holding wire.yaml and lifecycle.yaml (default: the spec/ of the "
                   "checkout PATH is in, else the package's)")
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


def check_generated(out: Path, text: str, prog: str, regenerate: str, source: str = "") -> int:
    """The ``--check`` of a generated file: compare ``out`` with ``text`` and say so in one line.

    Args:
        out: the generated file (the check's input path).
        text: what the generator writes there now.
        prog: the program name that prefixes an error line.
        regenerate: the command line that rewrites ``out``, named when it differs.
        source: words added after the path (e.g. the spec it was generated from).

    Returns:
        0 when ``out`` holds exactly ``text`` ("up to date" on stdout); 1 when it is missing or
        differs (on stderr, with ``regenerate``); 2 when it cannot be read, as any input path
        (:func:`read_for_check`).
    """
    try:
        found = read_for_check(out)
    except OSError as e:
        print(f"{prog}: error: cannot read {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    tail = f" {source}" if source else ""
    if found == text.encode("utf-8"):
        print(f"{out}: up to date{tail}")
        return 0
    state = "missing" if found is None else "out of date"
    print(f"{out}: {state}{tail}; run `{regenerate}`", file=sys.stderr)
    return 1


def spec_dir_for(out: Path | None) -> Path:
    """The spec folder documenting ``out``: the nearest ``spec/`` holding ``wire.yaml`` at or
    above ``out``'s folder (``None`` or ``-``: the current folder), else the package's spec."""
    if out is None or str(out) == "-":
        start = Path.cwd()
    else:
        try:
            start = out.resolve().parent
        except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13)
            start = out.absolute().parent
    for folder in (start, *start.parents):
        if (folder / "spec" / "wire.yaml").is_file():
            return folder / "spec"
    return SPEC.path


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _run(args: argparse.Namespace) -> int:
    out: Path = args.out
    spec_dir = args.spec if args.spec is not None else spec_dir_for(out)
    try:
        spec = SPEC if spec_dir.resolve() == SPEC.path.resolve() else Spec(spec_dir)
    except SpecError as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    text = render_protocol_doc(spec)
    source = f"(spec: {_shown(spec_dir / 'wire.yaml')})"
    if str(out) == "-":
        print(text, end="")  # a closed stdout (None) takes nothing
        return 0
    if args.check:  # PATH is the input: one that cannot be read is exit 2, as any input path
        return check_generated(out, text, _PROG, f"flodl-proto docs --out {out}", source)
    if out.is_dir():
        print(f"{_PROG}: error: --out {out} is a directory; give a file path", file=sys.stderr)
        return 1
    try:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
    except (OSError, UnicodeDecodeError) as e:
        print(f"{_PROG}: error: cannot read {out}: {e}", file=sys.stderr)
        return 1
    if current == text:
        print(f"{out}: up to date {source}")
        return 0
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8", newline="\n")
    except FileExistsError:  # a file where a folder of the path should be
        print(f"{_PROG}: error: cannot write {out}: Not a directory", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{_PROG}: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{out}: written ({len(text.encode('utf-8'))} bytes) {source}")
    return 0

"""``flodl-proto vectors check [PATH ...]``: run golden vector folders (or single vector files)
against this package; ``flodl-proto vectors compare DIR``: is DIR byte for byte the bundled copy?

With no DIR, ``check`` checks the copy of the shared vectors bundled in the package
(``flodl_proto/_vectors``), so any installation can run the interop self-check.
"""

from __future__ import annotations

import argparse
import collections
import filecmp
import stat
import sys
from pathlib import Path
from typing import Any

from .._oserr import os_reason
from ..cli import interrupts_held
from ..errors import shown, shown_file, shown_name
from ._option_error import option_message
from ._paths import file_in_the_way, input_path_problem

__all__ = ["BUNDLED_VECTORS", "check_folders", "compare_folders", "register"]

#: the shared vectors shipped inside the package
BUNDLED_VECTORS = Path(__file__).resolve().parent.parent / "_vectors"


def register(sub: Any) -> None:
    """Add the ``vectors`` subcommand.

    No upstream counterpart (the command line is this package's own).
    """
    p = sub.add_parser("vectors",
                       help="check, compare and export golden vector folders (interop self-check)")
    vsub = p.add_subparsers(dest="vectors_command", metavar="ACTION", required=True)
    c = vsub.add_parser("check", help="run every case of the given folders and their v2/, or "
                        "of the given vector files",
                        description="Run every case of the given vector folders and their v2/, "
                        "or of a single vector file (its count is the one the manifest.json "
                        "beside it declares for it). Exit 0 when every case passed and the "
                        "counts match the manifests, 1 when not, 2 when a path does not exist, "
                        "a folder holds no vectors, or a file is not a vector file (one line "
                        "naming it).")
    c.add_argument("dirs", nargs="*", type=_vector_path, metavar="PATH",
                   help="vector folders or vector files (default: the bundled copy of the "
                   "shared vectors)")
    c.add_argument("-v", "--verbose", action="store_true", help="print every failing case")
    c.set_defaults(func=_check)
    m = vsub.add_parser("compare", help="compare a vector folder with the bundled copy, file by "
                        "file (exit 0 identical, 1 different)")
    m.add_argument("dir", type=_folder, metavar="DIR", help="vector folder, e.g. a shared checkout")
    m.add_argument("--bundled", type=_folder, default=BUNDLED_VECTORS, metavar="DIR",
                   help="the folder to compare with (default: the bundled copy)")
    m.set_defaults(func=_compare)
    e = vsub.add_parser("export", help="write this implementation's codec vectors (handshake, "
                        "channel_magic, round_frame, mux_record, len_framed; v3 in DIR, v2 in "
                        "DIR/v2) in the shared schema")
    e.add_argument("dir", type=_output_folder, metavar="DIR",
                   help="output folder, created with its missing parents if need be")
    e.set_defaults(func=_export)


def _folder(text: str) -> Path:
    """argparse ``type=`` of a vector folder: a path, not empty (``Path("")`` is the current
    folder: ``vectors export ""`` wrote into it).

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty.
    """
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a folder path (. for this one)")
    return Path(text)


def _output_folder(text: str) -> Path:
    """argparse ``type=`` of ``vectors export DIR``: :func:`_folder`'s path, refused with the
    command line, before any work, when it is a file (a FIFO, a device) or a loop of symbolic
    links, or has one where a folder of it should be, as every output path of the command line
    is (:func:`~flodl_proto.commands._paths.file_in_the_way`: ``'a-file/sub': Not a directory
    (a-file is a file, not a folder)``); it was found as the first file was written (exit 1).

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty, or such a path.
    """
    path = _folder(text)
    if (why := file_in_the_way(text, path)) is not None:
        raise argparse.ArgumentTypeError(why)
    return path


def _vector_path(text: str) -> Path:
    """argparse ``type=`` of ``vectors check``'s paths: a vector folder or a vector file, not
    empty (``Path("")`` is the current folder).

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty.
    """
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a vector folder or file (. for this "
                                         "folder)")
    return Path(text)


def _not_a_folder(path: Path) -> str | None:
    """Why ``path`` cannot be read as a vector folder, or None when it is a folder: a file (a
    FIFO, a device) at or above it in the words of every path option refused so
    (:func:`~flodl_proto.commands._paths.file_in_the_way`: ``'a-file': Not a directory (a-file
    is a file, not a folder)``), else ``... does not exist`` (``... not a directory`` when it
    exists but cannot be told apart; the reason when it cannot be looked up: a loop of symbolic
    links, a name too long)."""
    try:
        mode: int | None = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # or a file above it, a NUL
        mode = None
    except OSError as e:
        return input_path_problem(str(path), e)
    if mode is not None and stat.S_ISDIR(mode):
        return None
    if (why := file_in_the_way(str(path), path)) is not None:
        return why
    return f"{_given(path)}: {'not a directory' if mode is not None else 'does not exist'}"


def _named(path: Path | str) -> str:
    """``path`` as a line names it: as it is, or quoted by its ends and its length when it is
    longer than :data:`~flodl_proto.errors.SHOWN_CHARS` characters, quoted when it holds a line
    break (:func:`~flodl_proto.errors.shown_name`)."""
    return shown_name(str(path))


def _given(path: Path | str) -> str:
    """A path of the command line as a line about the path itself quotes it (``'x': does not
    exist``), as an output path's line and :func:`~._paths.input_path_problem` do."""
    return shown(str(path))


class _PathProblem(str):
    """A reason of :func:`_load_cases` that is about the path given itself (it does not exist,
    cannot be read, holds no vectors, is a manifest), not about a file's contents: the command
    line words it as an option's value (``argument PATH: ...``)."""

    __slots__ = ()


def _load_cases(root: Path) -> tuple[list[Any], int, list[str]] | str:
    """Every case of the folder ``root`` and its ``v2/`` (or of the vector file ``root``), the
    count its manifests declare and what is missing to check that count (``DIR/manifest.json``,
    or for a file the manifest's entry for it), or the one-line reason it holds no usable
    vectors (missing, no case, an unreadable or malformed case file or manifest; a
    :class:`_PathProblem` when it is about ``root`` itself)."""
    from ..interop.vectors import (
        VectorFileError,
        file_manifest_count,
        iter_cases,
        iter_file_cases,
        manifest_total,
        vector_folders,
    )

    try:
        root.stat()
    except (FileNotFoundError, NotADirectoryError, ValueError):  # or a file above it, a NUL
        return _PathProblem(f"{_given(root)}: does not exist")
    except OSError as e:  # a loop of symbolic links, a name too long: the reason, not 'missing'
        return _PathProblem(input_path_problem(str(root), e))
    folder = root.is_dir()
    if not folder and root.name == "manifest.json":
        return _PathProblem(f"{_given(root)}: a manifest, not a vector file: give its folder "
                            f"({_named(root.parent)}) or one of the vector files beside it")
    try:
        if folder:
            cases = list(iter_cases(root))
            expected = manifest_total(root)
            missing = [_named(f / "manifest.json") for f in vector_folders(root)
                       if not (f / "manifest.json").is_file()]
        else:
            cases = list(iter_file_cases(root))
            count = file_manifest_count(root)
            expected = count or 0
            manifest = root.parent / "manifest.json"
            missing = [] if count is not None else [
                f"entry for {_named(root.stem)} in {_named(manifest)}" if manifest.is_file()
                else _named(manifest)]
    except OSError as e:
        if e.filename in (None, str(root)):
            return _PathProblem(input_path_problem(str(root), e))
        return input_path_problem(str(e.filename), e)  # a file of the folder: quoted too
    except VectorFileError as e:
        return str(e)
    if not cases:
        return _PathProblem(f"{_given(root)}: no vectors found {'under' if folder else 'in'} it")
    return cases, expected, missing


def check_folders(dirs: list[Path], verbose: bool = False, out: Any = None, *,
                  given: bool = False) -> int:
    """Run every case of ``dirs`` (folders, and their ``v2/``, or single vector files), print a
    table per file; return the exit code: 0 only if every case ran and passed and the counts
    match the manifests (for a single file, the count the ``manifest.json`` beside it declares
    for it), else 1 with one line on stderr after the tables (``flodl-proto vectors check:
    error: 3 of 512 vectors failed``, how many are of an op not implemented, and what count
    differs from its manifests); 2 (one line on stderr, nothing run) when a path does not
    exist, a folder holds no vectors, or a case file cannot be read or is not a vector file;
    with ``given`` (``dirs`` are the command line's PATHs) a line about a PATH itself (it does
    not exist, cannot be read, holds no vectors) is in the options' form, ``argument PATH:
    ...`` (``argument PATH: 'x': does not exist``, the path quoted as an output path's line
    quotes it); one about a file's contents is as it is.

    No upstream counterpart: upstream ships no golden vectors or tools to check them.
    """
    with interrupts_held():  # NumPy and the codec load: Ctrl-C after, as one line
        from ..interop.registry import NotImplementedOp
        from ..interop.vectors import run_case, shown_id

    out = out or sys.stdout
    failed = unimplemented = ran = 0
    counts: list[str] = []  # why a folder's count of cases is not its manifests' count
    loaded = []
    for root in dirs:  # every folder is checked before any case runs
        got = _load_cases(root)
        if isinstance(got, str):
            line = option_message("PATH", got) if given and isinstance(got, _PathProblem) else got
            print(f"flodl-proto vectors check: error: {line}", file=sys.stderr)
            return 2
        loaded.append((root, *got))
    for root, cases, expected, unlisted in loaded:
        stats: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        folder = root.is_dir()
        declare = "manifests declare" if folder else "manifest declares"
        failures: list[str] = []
        total = 0
        for case in cases:
            total += 1
            key = ("v2/" if case.version == 2 and folder else "") + case.file
            try:
                run_case(case)
                stats[key]["pass"] += 1
            except NotImplementedOp as e:
                stats[key]["not implemented"] += 1
                failures.append(f"{shown_id(case.id)}: op {e} not implemented")
            except Exception as e:  # report every failure kind, keep going
                stats[key]["fail"] += 1
                failures.append(f"{shown_id(case.id)}: {type(e).__name__}: {e}")
        print(_named(root), file=out)
        print(f"  {'file':<28} {'pass':>5} {'fail':>5} {'n/i':>5}", file=out)
        for key in sorted(stats):
            s = stats[key]
            print(f"  {key:<28} {s['pass']:>5} {s['fail']:>5} {s['not implemented']:>5}",
                  file=out)
        passed = sum(s["pass"] for s in stats.values())
        print(f"  total: {passed}/{total} passed; {declare} {expected}", file=out)
        for manifest in unlisted:
            print(f"  no {manifest}: the count of its cases cannot be checked", file=out)
        if total != expected and not unlisted:
            print(f"  {total} cases found where the {declare} {expected}", file=out)
        if total != expected or total == 0:
            counts.append(f"{_given(root)}: {total} vectors found where its {declare} "
                          f"{expected}"
                          + (f" (no {', no '.join(unlisted)})" if unlisted else ""))
        if failures and verbose:
            for f in failures:
                print(f"  FAIL {f}", file=out)
        elif failures:
            print(f"  {len(failures)} not passing (first: {failures[0]}); -v lists all",
                  file=out)
        n_i = sum(c["not implemented"] for c in stats.values())
        failed += len(failures) - n_i
        unimplemented += n_i
        ran += total
    if not failed and not unimplemented and not counts:
        return 0
    why = [f"{failed} of {ran} vectors failed"] if failed else []
    if unimplemented:  # an op this package has no handler for: counted apart (n/i), not passed
        why.append(f"{unimplemented} of {ran} vectors of an op not implemented")
    print(f"flodl-proto vectors check: error: {'; '.join(why + counts)}", file=sys.stderr)
    return 1


def compare_folders(a: Path, b: Path) -> list[tuple[str, str]]:
    """The files that differ between folders ``a`` and ``b``, recursively: ``(how, relative
    path)`` with ``how`` one of ``only in A`` / ``only in B`` (``A``, ``B``: the folders as given),
    ``differs`` (different bytes, or not comparable: unreadable, or a file beside a folder); in
    path order, empty when the trees are identical.

    No upstream counterpart: upstream ships no golden vectors or tools to check them.
    """
    diffs: list[tuple[str, str]] = []

    def walk(rel: Path) -> None:
        cmp = filecmp.dircmp(a / rel, b / rel)
        _, mismatch, errors = filecmp.cmpfiles(a / rel, b / rel, cmp.common_files, shallow=False)
        found = [(f"only in {a}", n) for n in cmp.left_only] \
            + [(f"only in {b}", n) for n in cmp.right_only] \
            + [("differs", n) for n in cmp.common_funny + mismatch + errors]
        diffs.extend((how, str(rel / n)) for how, n in sorted(found, key=lambda d: d[1]))
        for sub in sorted(cmp.common_dirs):
            walk(rel / sub)

    walk(Path("."))
    return diffs


def _compare(args: argparse.Namespace) -> int:
    for d, given_as in ((args.dir, "DIR"), (args.bundled, "--bundled")):
        if (why := _not_a_folder(d)) is not None:  # named as argparse names a refused value
            print(f"flodl-proto vectors compare: error: {option_message(given_as, why)}",
                  file=sys.stderr)
            return 2
    diffs = compare_folders(args.dir, args.bundled)
    named = {f"only in {d}": f"only in {_named(d)}" for d in (args.dir, args.bundled)}
    for how, rel in diffs:
        print(f"{named.get(how, how)}: {_named(rel)}")
    print(f"{_given(args.dir)} {'differs from' if diffs else 'is identical to'} "
          f"{_given(args.bundled)}"
          + (f" ({len(diffs)} files)" if diffs else ""))
    return 1 if diffs else 0


def _check(args: argparse.Namespace) -> int:
    dirs = list(args.dirs) or [BUNDLED_VECTORS]
    return check_folders(dirs, verbose=args.verbose, given=bool(args.dirs))


def _export(args: argparse.Namespace) -> int:
    with interrupts_held():  # NumPy and the codec load: Ctrl-C after, as one line
        from ..interop.export import export_vectors

    try:
        counts = export_vectors(args.dir)
    except OSError as e:  # FileExistsError: a file where a folder of the path should be
        why = "Not a directory" if isinstance(e, FileExistsError) else os_reason(e)
        print(f"flodl-proto vectors export: error: cannot write "
              f"{shown_file(e.filename or args.dir)}: {why}", file=sys.stderr)
        return 1
    for version, n in sorted(counts.items(), reverse=True):
        where = args.dir if version == 3 else args.dir / "v2"
        print(f"{_given(where)}: {n} cases (protocol version {version})")
    return 0

"""The path checks every command shares, in one wording: an input path option's text
(:func:`path_text`), a generator's output path (:func:`output_path`), a file or a loop of
symbolic links where a folder of a path should be (:func:`file_in_the_way`), and an input path
that cannot be opened (:func:`input_path_problem`). A line about a path of the command line
itself quotes it (``'out.json/r.xml': Not a directory (out.json is a file, not a folder)``);
each refusal is a usage error that argparse puts after ``argument --X:``.

Used by ``docs``, ``conform``, ``dissector``, ``vectors``, ``decode``, ``demo``, ``controller``,
``relay`` and ``rank`` (the salt options), and by :mod:`flodl_proto.commands._salt`. A leaf of
the command line: it imports the standard library, :mod:`flodl_proto.errors` and
:mod:`flodl_proto._oserr` only, so a command loads it at start-up for nothing.

No upstream counterpart: upstream's binaries take no path options and ship no generator
commands.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
from pathlib import Path

from .._oserr import file_kind, os_reason
from ..errors import shown, shown_name

__all__ = [
    "file_in_the_way",
    "input_path_problem",
    "names_a_folder",
    "output_path",
    "path_text",
]


def path_text(text: str) -> str:
    """argparse ``type=`` of an input path option (``--salt-file``, ``--checkpoint-dir``,
    ``decode FILE``, ``docs --spec``): the text, unless it is empty (an empty path is the current
    folder to the operating system, so ``--salt-file ''`` read "Is a directory").

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty (argparse names the option).

    No upstream counterpart: upstream's binaries take no path options.
    """
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a path")
    return text


def output_path(text: str) -> Path:
    """argparse ``type=`` of every generator's output option (``--out``, ``--junit``, ...): the
    path of a file, or ``-`` for stdout.

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty, ends with ``/`` (a folder, which the
            command would otherwise have written as a file of that name), names a folder
            that exists (through links too; ``'out' names a folder (an existing one); give a
            file path in it``), or has a file where a folder of its path should be, at any
            level (``'out.json/r.xml': Not a directory (out.json is a file, not a folder)``),
            or a loop of symbolic links there or as the file itself (``'loop1/x': Too many
            levels of symbolic links (loop1 is a loop of symbolic links)``, ``'loop1': ...``,
            which the write refused with exit 1, ``cannot write 'loop1': ...``, and ``docs
            --check`` as a file it cannot read, ``cannot read 'loop1': ...``):
            a usage error each time, found before the command does any work, where the
            existing folder and the file in the path were found only as the file was written
            (exit 1; for ``conform --junit``/``--json``, once the catalogue was loaded). A
            folder or file made after the command line is read is refused as the file is
            written (:func:`write_output`).

    No upstream counterpart: upstream ships no generator commands.
    """
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a file path, or - for stdout")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(names_a_folder(text, "it ends with /"))
    path = Path(text)
    try:
        folder = text != "-" and path.is_dir()
    except (OSError, ValueError):  # a name too long, a NUL: writing it will say why
        folder = False
    if folder:
        raise argparse.ArgumentTypeError(names_a_folder(text, "an existing one"))
    if text != "-" and ((why := file_in_the_way(text, path.parent)) is not None
                        or (why := _loop_itself(text, path)) is not None):
        raise argparse.ArgumentTypeError(why)
    return path


def file_in_the_way(text: str, folder: Path) -> str | None:
    """Why the path ``text`` cannot be used when a file (not a folder) stands where ``folder``
    (its folder, or the path itself when it names a folder) or a folder above it should be:
    ``'out.json/r.xml': Not a directory (out.json is a file, not a folder)``, the file named
    for what it is (``a FIFO``, ``a character device``, ...); None when there is none, or it
    cannot be told (a folder that may not be looked into: the command's own step will say
    why). A ``..`` after a folder that does not exist yet goes back up as it will once the
    folders are made (``x/../a-file/s``: ``a-file`` stands in the way, found before ``x`` is
    made). A loop of symbolic links where a folder should be is named too (``'loop1/x':
    Too many levels of symbolic links (loop1 is a loop of symbolic links)``). The words of
    every path option refused so (the generators' output files, ``docs --spec``, ``vectors
    export DIR``, ``controller --checkpoint-dir``, the demo's new ``--salt-file``), for
    argparse to put after ``argument --X:``. Raises nothing.

    No upstream counterpart: upstream ships no generator commands.
    """
    found = _file_at_or_above(folder)
    if found is None:
        return None
    blocker, mode = found
    if mode is None:
        return _loop_words(text, blocker)
    return (f"{shown(text)}: {os.strerror(errno.ENOTDIR)} ({shown_name(str(blocker))} is "
            f"{_kind(mode)}, not a folder)")


def input_path_problem(text: str, e: OSError) -> str:
    """Why the input path ``text`` (a file or folder a command reads: ``decode FILE``,
    ``--salt-file``, ``vectors check PATH``, ``vectors compare DIR``) cannot be opened or
    looked up, for argparse to put after ``argument --X:``, in the words of an output path
    refused so: the path quoted (``'salt.hex': No such file or directory``), and a loop of
    symbolic links, as the path itself or where a folder of it should be, named as
    :func:`file_in_the_way` names one (``'loop1/x': Too many levels of symbolic links (loop1
    is a loop of symbolic links)``). Raises nothing.

    No upstream counterpart: upstream's binaries read no such path.
    """
    if e.errno == errno.ELOOP:
        path = Path(text)
        return file_in_the_way(text, path.parent) or _loop_words(text, path)
    return f"{shown(text)}: {os_reason(e)}"


def _loop_words(text: str, loop: Path) -> str:
    """Why the path ``text`` cannot be used when ``loop`` (the path itself, or a folder of it)
    is a loop of symbolic links: ``'loop1/x': Too many levels of symbolic links (loop1 is a
    loop of symbolic links)``."""
    return (f"{shown(text)}: {os.strerror(errno.ELOOP)} ({shown_name(str(loop))} is a loop of "
            "symbolic links)")


def _loop_itself(text: str, path: Path) -> str | None:
    """Why the output path ``text`` cannot be used when the file ``path`` itself is a loop of
    symbolic links (``'loop1': Too many levels of symbolic links (loop1 is a loop of symbolic
    links)``, as :func:`file_in_the_way` words one where a folder of it should be), else None
    (a path that cannot be looked up for another reason: the write will say why)."""
    try:
        path.stat()
    except OSError as e:
        return _loop_words(text, path) if e.errno == errno.ELOOP else None
    except ValueError:  # a NUL
        return None
    return None


def _kind(mode: int) -> str:
    """What the file standing in an output path is: ``a file`` (a regular one), else
    :func:`~flodl_proto._oserr.file_kind`'s words (``a FIFO``, ``a character device``, ...)."""
    if stat.S_ISREG(mode):
        return "a file"
    kind = file_kind(mode)
    return kind if kind.startswith("a ") else "a file of another kind"


def _file_at_or_above(path: Path) -> tuple[Path, int | None] | None:
    """The file (not a folder) that stands where the folder ``path`` or a folder above it
    should be (``out.json`` of ``out.json/sub``, at whichever level) and its ``st_mode``, or a
    loop of symbolic links there (``st_mode`` None), or None when there is none or it cannot be
    told (a folder that may not be looked into, a link to nothing: the command's own step will
    say why). The path is walked from its start as the folders will be made: a ``..`` after a
    folder that does not exist yet leaves that folder, not one of the file system."""
    found = Path(path.anchor)  # the folders that exist, as the path reaches them
    missing = 0  # the folders after them, to be made
    for part in path.parts[1 if path.anchor else 0:]:
        if missing:
            missing += -1 if part == ".." else 0 if part == "." else 1
            continue
        folder = found / part
        try:
            mode = folder.stat().st_mode  # through links, as the write goes
        except FileNotFoundError:  # made by the write, unless a link to nothing stands there
            if folder.is_symlink():
                return None
            missing = 1
            continue
        except OSError as e:  # a loop of links; no permission, a name too long
            return (folder, None) if e.errno == errno.ELOOP else None
        except ValueError:  # a NUL
            return None
        if not stat.S_ISDIR(mode):
            return folder, mode
        found = folder
    return None


def names_a_folder(text: str, how: str) -> str:
    """Why the output path ``text`` is refused when it names a folder, ``how`` it does (``it
    ends with /``, ``an existing one``): ``'out' names a folder (an existing one); give a file
    path in it``."""
    return f"{shown(text)} names a folder ({how}); give a file path in it"

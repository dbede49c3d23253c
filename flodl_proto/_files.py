"""Atomic replacement of an output file, shared by every command that writes one: ``docs``,
``conform docs``, ``dissector --out``, ``conform --junit`` / ``--json`` and ``vectors export``.

A reader of the file sees the old contents or the new ones, never part of them; a write that
fails midway (a full disk, a crash) leaves the old file and no temporary file behind.

No upstream counterpart: upstream ships no generator commands or report files.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["replace_file"]


def replace_file(out: Path, data: bytes) -> None:
    """Replace the file ``out`` with ``data`` atomically: write a temporary file in the same
    folder (``.NAME.XXXXXXXX.tmp``), flush it to disk, then ``os.replace`` it onto ``out``, so a
    reader sees the old file or the new one, never part of one. On any failure the temporary
    file is removed and ``out`` is left as it was.

    The new file gets the permission bits of the file it replaces, or those a plain ``open``
    would give (``0o666`` less the umask). A file this process may not write (read-only to it)
    is refused as ``open`` refuses it (``PermissionError``), not replaced by the rename.
    A symbolic link is followed: its target is replaced and the link stays. A path that exists
    but is not a regular file (``/dev/null``, a FIFO) is written in place, as ``open`` would,
    since it cannot be replaced by a file.

    Args:
        out: the file to replace; its folder must exist.
        data: the new contents, bytes.

    Raises:
        OSError: ``out`` exists and may not be written, the folder cannot take a new file, or
            the write or the rename failed (``strerror`` says why, e.g. ``No space left on
            device``; ``filename`` is ``out``, never the temporary file).

    No upstream counterpart: upstream ships no generated files.
    """
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    try:
        st_mode: int | None = target.stat().st_mode
    except FileNotFoundError:
        st_mode = None
    if st_mode is not None and not stat.S_ISREG(st_mode):
        target.write_bytes(data)
        return
    if st_mode is not None:
        # a file open() may not write (read-only, to this user) is refused as open() refuses
        # it: the rename alone, in a writable folder, would replace it
        os.close(os.open(target, os.O_WRONLY))
        mode = stat.S_IMODE(st_mode)
    else:  # the process's umask can only be read by setting it (a command runs one thread here)
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise _naming(e, out) from None
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _naming(e, out) from None
        raise


def _naming(e: OSError, out: Path) -> OSError:
    """``e`` naming ``out`` instead of the temporary file (or no file): the file the caller
    asked for is the one to report."""
    e.filename, e.filename2 = str(out), None
    return e


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

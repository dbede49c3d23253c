"""Atomic replacement of an output file, shared by every command that writes one: ``docs``,
``conform docs``, ``dissector --out``, ``conform --junit`` / ``--json``, ``vectors export``, and
by the controller's checkpoints; and the atomic creation of a new file that never replaces one
(:func:`create_file`: the salt file ``demo --salt-file`` writes).

A reader of the file sees the old contents or the new ones, never part of them; a write that
fails midway (a full disk, a crash) leaves the old file and no temporary file behind.

No upstream counterpart: upstream ships no generator commands or report files (its checkpoint
writer, ``checkpoint_forge.rs``, writes its own format).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["create_file", "make_folders", "replace_file", "replacing"]

_NAME_TRIES = 100  # temporary names tried before giving up (as tempfile.TMP_MAX, far fewer)


@contextlib.contextmanager
def replacing(out: Path, new_mode: int = 0o666) -> Iterator[BinaryIO]:
    """Replace the file ``out`` atomically with what the ``with`` body writes to the binary
    file object it is given (e.g. ``np.savez(f, ...)``).

    The object is open on a temporary file in the same folder (``.NAME.XXXXXXXX.tmp``). When
    the body ends normally, the file is flushed and synced to disk, renamed onto ``out``
    (``os.replace``) and the folder is synced (unless the process may not read it or its file
    system cannot sync it), so a reader sees the old file or the new one, never part of one,
    and the new one survives a crash.
    When the body (or any of these steps) raises, the temporary file is removed, ``out`` is
    left as it was, and the exception propagates.

    The new file gets the permission bits of the file it replaces, or ``new_mode`` less the umask
    (by default ``0o666``, those a plain ``open`` would give; applied by the system as the file is
    created, so no other thread sees a changed umask). A file this process may not write (read-only
    to it) is refused as ``open`` refuses it (``PermissionError``), not replaced by the rename. A
    symbolic link is followed: its target is replaced and the link stays. A path that exists but is
    not a regular file (``/dev/null``, a FIFO, ``/dev/stdout`` on a pipe or a terminal), through
    links or not, is written in place, as ``open`` would, since it cannot be replaced by a file; but
    a FIFO that no process has open for reading is refused (``OSError`` ``ENXIO``), where ``open``
    would wait for a reader, maybe for ever.

    Args:
        out: the file to replace; its folder must exist.
        new_mode: the permission bits of a file that does not exist yet, before the umask
            (``0o600`` for a secret); a file replaced keeps its own.

    Yields:
        A buffered binary file object, open for writing; closed when the body ends.

    Raises:
        OSError: ``out`` exists and may not be written (or is a FIFO with no reader), the
            folder cannot take a new file, or a write, the sync or the rename failed
            (``strerror`` says why, e.g. ``No space left on device``, after the step for the
            two steps that fail for a reason of the folder: ``creating a temporary file in
            /proc to replace it: No such file or directory (the folder takes no new file)``,
            ``creating a temporary file in ro to write it: Permission denied`` for a file that
            does not exist yet,
            ``renaming the temporary file onto it: Device or resource busy``; ``filename`` is
            ``out``,
            never the temporary file: an ``OSError`` the body raises naming no file or the
            temporary one is made to name ``out``).
        Whatever the body raises, unchanged otherwise.

    No upstream counterpart: upstream ships no generated files.
    """
    try:  # through every link, as open() follows it (/dev/stdout: a link the kernel resolves)
        st_mode: int | None = out.stat().st_mode
    except FileNotFoundError:
        st_mode = None
    if st_mode is not None and not stat.S_ISREG(st_mode):
        with os.fdopen(_open_in_place(out, st_mode), "wb") as f:
            yield f
        return
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    if st_mode is not None:
        # a file open() may not write (read-only, to this user) is refused as open() refuses
        # it: the rename alone, in a writable folder, would replace it
        os.close(os.open(target, os.O_WRONLY))
    try:
        # created private when it replaces a file (then given that file's bits), else with
        # new_mode as open() creates a file: the system applies the umask
        fd, tmp = _create_temporary(target, 0o600 if st_mode is not None else new_mode)
    except OSError as e:
        purpose = "to replace it" if st_mode is not None else "to write it"  # or a new file
        raise _temporary_refused(e, target, out, purpose) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if st_mode is not None:
                os.fchmod(fd, stat.S_IMODE(st_mode))
            os.fsync(fd)
        try:
            os.replace(tmp, target)
        except OSError as e:
            raise _at_step(e, "renaming the temporary file onto it") from None
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename in (None, tmp):
            raise _naming(e, out) from None
        raise
    _sync_folder(target.parent)


def replace_file(out: Path, data: bytes, new_mode: int = 0o666) -> None:
    """Replace the file ``out`` with ``data`` atomically: :func:`replacing` with a body that
    writes ``data``; every rule of :func:`replacing` holds (permission bits, links, devices,
    the cleanup on failure).

    Args:
        out: the file to replace; its folder must exist.
        data: the new contents, bytes.
        new_mode: the permission bits of a file that does not exist yet, before the umask, as
            :func:`replacing` takes them.

    Raises:
        OSError: as :func:`replacing` (``filename`` is ``out``).

    No upstream counterpart: upstream ships no generated files.
    """
    with replacing(out, new_mode) as f:
        _write_all(f.fileno(), data)  # straight to the file: nothing is in f's buffer


def create_file(out: Path, data: bytes, new_mode: int = 0o666) -> None:
    """Create the file ``out`` holding ``data``, atomically, and only if no file of that name
    exists when it appears: the data goes to a temporary file in the same folder
    (``.NAME.XXXXXXXX.tmp``, created with ``new_mode`` less the umask), is synced to disk, then
    the temporary file is hard-linked to ``out`` (``os.link``, which refuses a name that
    exists, a link to no file included, where a rename would replace it) and removed; the
    folder is synced (best effort). A reader never sees part of the data, and a file another
    process creates between a caller's check and this creation is never replaced. On a file
    system without hard links (``os.link`` refused with ``EPERM`` or ``EOPNOTSUPP``) ``out`` is
    created with ``O_CREAT | O_EXCL`` and written in place (still never over a file; a crash
    may leave part of the data there). A failure leaves no temporary file, and no ``out``.

    Args:
        out: the file to create; its folder must exist.
        data: its contents, bytes.
        new_mode: its permission bits before the umask (``0o600`` for a secret).

    Raises:
        FileExistsError: ``out`` exists (any kind of file, a link to no file included); it is
            left as it is. ``filename`` is ``out``. (Also, with ``strerror`` naming the
            temporary file's step, when 100 random temporary names in a row were taken.)
        OSError: the folder takes no new file, or a write or the sync failed (``strerror``
            names the step as :func:`replacing` does: ``creating a temporary file in /proc to
            write it: No such file or directory (the folder takes no new file)``); ``filename``
            is ``out``.

    No upstream counterpart: upstream's processes read the salt from the environment.
    """
    try:
        fd, tmp = _create_temporary(out, new_mode)
    except OSError as e:
        raise _temporary_refused(e, out, out, "to write it") from None
    try:
        _write_synced(fd, data)
        try:
            os.link(tmp, out)
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(out)) from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP):
                raise _at_step(e, "linking the new file to its name") from None
            _create_in_place(out, data, new_mode)  # a file system without hard links
    except OSError as e:
        if e.filename in (None, tmp):
            raise _naming(e, out) from None
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    _sync_folder(out.parent)


def _create_in_place(out: Path, data: bytes, mode: int) -> None:
    """Create ``out`` exclusively (``O_CREAT | O_EXCL``: ``FileExistsError`` when it exists)
    with ``mode`` less the umask, write ``data`` and sync it; a failure after the creation
    removes it."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        _write_synced(fd, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(out)
        raise


def make_folders(folder: Path) -> None:
    """Create ``folder`` and the folders above it that are missing (``mkdir -p``), for a file
    to be written in it; a folder that exists is left as it is.

    Args:
        folder: the folder of the file to write (``out.parent``).

    Raises:
        OSError: a folder of the path cannot be created. Its ``strerror`` names the step and
            the folder that failed before the reason, as :func:`replacing` names its steps
            (``creating the folder /sys/kernel/x: Operation not permitted``); for a file
            where a folder of the path should be, the reason is ``Not a directory``
            (``NotADirectoryError``, also where ``mkdir`` reports ``File exists``) and the file
            is named after it (``creating the folder a-file/sub: Not a directory (a-file is not
            a folder)``; ``creating the folder a-file: Not a directory (it exists and is not a
            folder)``); a symbolic link there that leads to no folder is named for what it is
            (``creating the folder link: No such file or directory (a symbolic link to
            nothing)``; a loop of links: ``Too many levels of symbolic links``), where a link
            to a file is a file; ``filename`` is the folder that failed.

    No upstream counterpart: upstream ships no generated files.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        # the folder mkdir failed at (a Path: mkdir passes one), maybe one above ``folder``
        failed = Path(os.fsdecode(e.filename)) if e.filename else folder
        hint = ""
        if isinstance(e, FileExistsError) and failed.is_symlink():  # a link to no folder
            try:
                failed.stat()
            except OSError as gone:  # to nothing (ENOENT) or a loop of links (ELOOP)
                e = OSError(gone.errno, gone.strerror, str(failed))
                hint = " (a symbolic link to nothing)" if gone.errno == errno.ENOENT else ""
        if isinstance(e, FileExistsError):  # the folder's own name is taken by a file
            e = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(failed))
        if e.errno == errno.ENOTDIR:
            blocker = next((f for f in (failed, *failed.parents) if f.exists() or f.is_symlink()),
                           None)
            if blocker == failed:
                hint = " (it exists and is not a folder)"
            elif blocker is not None and not blocker.is_dir():
                hint = f" ({_shown_path(blocker)} is not a folder)"
        elif e.errno == errno.ENOENT and not hint and failed.parent.is_dir():
            hint = f" ({_shown_path(failed.parent)} takes no new folder)"
        raise _at_step(e, f"creating the folder {_shown_path(failed)}", hint) from None


def _shown_path(path: Path) -> str:
    """``path`` as an error line shows it (:func:`flodl_proto.errors.shown_name`: as it is,
    unless it holds a character that is not printable)."""
    from .errors import shown_name

    return shown_name(str(path))


def _open_in_place(out: Path, st_mode: int) -> int:
    """Open ``out``, not a regular file, for writing as ``open(out, "wb")`` would (a device, a
    FIFO, a terminal), but without waiting: a FIFO that no process reads is refused at once
    (``ENXIO``) instead of blocking until one opens it. The descriptor returned blocks again,
    so a reader that is slow only slows the writes."""
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO and stat.S_ISFIFO(st_mode):
            raise OSError(errno.ENXIO, "a FIFO that no process reads (writing would wait for "
                          "one)", str(out)) from None
        raise
    try:
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_temporary(target: Path, mode: int) -> tuple[int, str]:
    """Create and open a new file ``.NAME.XXXXXXXX.tmp`` beside ``target`` with ``mode`` (less
    the umask); return its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # not inherited by children (os.open)
    for _ in range(_NAME_TRIES):
        tmp = str(target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "No usable temporary name found", str(target))


def _sync_folder(folder: Path) -> None:
    """Sync ``folder`` to disk, so that a rename in it survives a crash. Best effort: the new
    file is in place already, so a folder this process may not read (write-only to it) or a
    file system that cannot sync a folder leaves it as it is, with no error."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _at_step(e: OSError, step: str, hint: str = "") -> OSError:
    """``e`` with the step of the replacement that failed before its reason (``strerror``),
    and ``hint`` after it: the creation of the temporary file or the rename fails for a
    reason of the folder, which the reason alone would give as one of the file."""
    e.strerror = f"{step}: {e.strerror or os.strerror(e.errno or 0)}{hint}"
    return e


def _naming(e: OSError, out: Path) -> OSError:
    """``e`` naming ``out`` instead of the temporary file (or no file): the file the caller
    asked for is the one to report."""
    e.filename, e.filename2 = str(out), None
    return e


def _temporary_refused(e: OSError, target: Path, out: Path, purpose: str) -> OSError:
    """``e``, the failed creation of a temporary file beside ``target``, naming ``out`` and the
    step (``creating a temporary file in FOLDER to write it``), with a hint when the folder
    exists but takes no new file (``/proc``: ENOENT for a file that exists)."""
    hint = (" (the folder takes no new file)"
            if e.errno == errno.ENOENT and target.parent.is_dir() else "")
    return _naming(_at_step(e, f"creating a temporary file in {target.parent} {purpose}", hint),
                   out)


def _write_synced(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, sync it to disk and close ``fd`` (closed also
    when the write or the sync fails)."""
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

"""flodl_proto._files: the one atomic file replacement (``replacing`` streams into it,
``replace_file`` writes bytes through it) and the controller's checkpoints written with it.
The byte-level replace_file cases (a full disk, a refused rename, modes, links, devices) are in
test_docs.py, beside the commands that use it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flodl_proto._files import create_file, replace_file, replacing
from flodl_proto.errors import shown_name
from flodl_proto.fsm.events import CheckpointWindow
from flodl_proto.runner import checkpoint

from .cluster_util import frame


class _Boom(Exception):
    pass


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_replacing_streams_into_a_temporary_beside_the_target_then_renames(
        tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    out.chmod(0o640)
    with replacing(out) as f:
        f.write(b"new ")
        (tmp,) = set(_names(tmp_path)) - {"out.bin"}
        assert tmp.startswith(".out.bin.") and tmp.endswith(".tmp") and len(tmp) == 21
        assert out.read_bytes() == b"old"  # nothing is visible before the body ends
        f.write(b"contents")
    assert out.read_bytes() == b"new contents"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert _names(tmp_path) == ["out.bin"]


def test_a_new_file_takes_new_mode_and_a_replaced_one_keeps_its_bits(tmp_path: Path) -> None:
    """``new_mode`` (less the umask) is the mode of a file created; a file replaced keeps its
    own bits whatever ``new_mode`` says."""
    old_umask = os.umask(0o022)
    try:
        fresh, kept = tmp_path / "secret", tmp_path / "kept"
        replace_file(fresh, b"s\n", new_mode=0o600)
        kept.write_bytes(b"old")
        kept.chmod(0o640)
        replace_file(kept, b"new", new_mode=0o600)
        plain = tmp_path / "plain"
        replace_file(plain, b"p")
    finally:
        os.umask(old_umask)
    assert [(p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in (fresh, kept, plain)] == [
        (b"s\n", 0o600), (b"new", 0o640), (b"p", 0o644)]


@pytest.mark.parametrize("existing", [True, False])
def test_a_body_that_raises_midway_leaves_the_target_and_no_temporary(
        tmp_path: Path, existing: bool) -> None:
    """The writer fails after part of the contents (more than a buffer's worth, so some of it
    reached the temporary file): its exception propagates unchanged, the target is as it was
    (or still absent) and the folder holds nothing else."""
    out = tmp_path / "out.bin"
    if existing:
        out.write_bytes(b"old")
    boom = _Boom("writer failed")
    with pytest.raises(_Boom) as e, replacing(out) as f:
        f.write(b"x" * (1 << 20))
        raise boom
    assert e.value is boom
    assert _names(tmp_path) == (["out.bin"] if existing else [])
    if existing:
        assert out.read_bytes() == b"old"


def test_an_os_error_of_the_body_names_the_target(tmp_path: Path) -> None:
    """A write error (no file named) is reported against the file asked for; one naming
    another file is left as it is."""
    out = tmp_path / "out.bin"
    with pytest.raises(OSError) as e, replacing(out):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(out))
    other = str(tmp_path / "input")
    with pytest.raises(FileNotFoundError) as missing, replacing(out):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), other)
    assert missing.value.filename == other
    assert _names(tmp_path) == []


def test_a_failed_creation_or_rename_names_its_step(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that takes no new file (``/proc``) made the creation of the temporary file
    fail with ENOENT, reported as ``No such file or directory`` of a file that exists; the
    step that failed is named, and the old file is kept."""
    from flodl_proto import _files

    out = tmp_path / "out.bin"
    out.write_bytes(b"old")

    def no_create(target: Path, mode: int) -> tuple[int, str]:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                str(target.parent / ".out.bin.0.tmp"))

    monkeypatch.setattr(_files, "_create_temporary", no_create)
    with pytest.raises(FileNotFoundError) as e:
        replace_file(out, b"new")
    assert (e.value.errno, e.value.filename) == (errno.ENOENT, str(out))
    assert e.value.strerror == (f"creating a temporary file in {tmp_path} to replace it: No "
                                "such file or directory (the folder takes no new file)")
    monkeypatch.undo()

    def busy(src: str, dst: Any) -> None:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), src, str(dst))

    monkeypatch.setattr(_files.os, "replace", busy)
    with pytest.raises(OSError) as e:
        replace_file(out, b"new")
    assert (e.value.errno, e.value.filename, e.value.filename2) == (errno.EBUSY, str(out), None)
    assert e.value.strerror == ("renaming the temporary file onto it: Device or resource busy")
    assert out.read_bytes() == b"old" and _names(tmp_path) == ["out.bin"]


def test_a_failed_creation_for_a_new_file_names_its_step_as_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new file in a folder that takes none (read-only) was said to be replaced: ``creating a
    temporary file in FOLDER to replace it``, of a file that did not exist."""
    from flodl_proto import _files

    out = tmp_path / "s.hex"

    def no_create(target: Path, mode: int) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                              str(target.parent / ".s.hex.0.tmp"))

    monkeypatch.setattr(_files, "_create_temporary", no_create)
    with pytest.raises(PermissionError) as e:
        replace_file(out, b"new")
    assert (e.value.errno, e.value.filename) == (errno.EACCES, str(out))
    assert e.value.strerror == (f"creating a temporary file in {tmp_path} to write it: "
                                "Permission denied")
    assert _names(tmp_path) == []


def test_the_file_and_its_folder_are_synced_before_and_after_the_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto import _files

    out = tmp_path / "out.bin"
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), out.exists()))
        real_fsync(fd)

    monkeypatch.setattr(_files.os, "fsync", spy)
    replace_file(out, b"data")
    assert len(synced) == 2
    (file_path, renamed_then), (folder_path, renamed_at_last) = synced
    assert Path(file_path).parent == tmp_path and Path(file_path).name.startswith(".out.bin.")
    assert not renamed_then and (Path(folder_path), renamed_at_last) == (tmp_path, True)
    assert out.read_bytes() == b"data"


@pytest.mark.parametrize("refused", ["open", "fsync"])
def test_a_folder_that_cannot_be_synced_still_takes_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str) -> None:
    """The folder sync is best effort, once the file is in place: a folder this process may
    not read (opening it is refused) or a file system that cannot sync a folder (EINVAL) still
    gets the new file, with no error."""
    from flodl_proto import _files

    real_open, real_fsync = os.open, os.fsync

    def no_folder_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECTORY:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args)

    def no_folder_fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real_fsync(fd)

    if refused == "open":
        monkeypatch.setattr(_files.os, "open", no_folder_open)
    else:
        monkeypatch.setattr(_files.os, "fsync", no_folder_fsync)
    out = tmp_path / "out.bin"
    replace_file(out, b"data")
    assert out.read_bytes() == b"data" and _names(tmp_path) == ["out.bin"]


# -- checkpoints ---------------------------------------------------------------------------------
def _window() -> CheckpointWindow:
    return CheckpointWindow(3, frame([1.0, 2.0], [3.0]), frame([9.0]))


def test_checkpoint_content_after_success(tmp_path: Path) -> None:
    checkpoint.write_checkpoint(tmp_path, _window())
    assert _names(tmp_path) == ["consensus-000003.npz"]
    with np.load(tmp_path / "consensus-000003.npz") as z:
        assert sorted(z.files) == ["b0", "p0", "p1"]
        assert [z[k].dtype for k in ("p0", "p1", "b0")] == [np.float32] * 3
        assert (list(z["p0"]), list(z["p1"]), list(z["b0"])) == ([1.0, 2.0], [3.0], [9.0])


def test_a_checkpoint_that_fails_midway_leaves_no_temporary_and_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """np.savez fails after writing part of the archive (a full disk): the error names the
    checkpoint, an earlier file of that name is unchanged and no temporary file is left."""
    final = tmp_path / "consensus-000003.npz"
    final.write_bytes(b"the earlier checkpoint")
    real_savez = np.savez

    def savez_then_fill(f: Any, **arrays: Any) -> None:
        f.write(b"PK\x03\x04 part of an archive")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.np, "savez", savez_then_fill)
    with pytest.raises(OSError) as e:
        checkpoint.write_checkpoint(tmp_path, _window())
    assert _names(tmp_path) == ["consensus-000003.npz"]
    assert final.read_bytes() == b"the earlier checkpoint"
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(final))
    monkeypatch.setattr(checkpoint.np, "savez", real_savez)
    checkpoint.write_checkpoint(tmp_path, _window())
    with np.load(final) as z:
        assert list(z["p0"]) == [1.0, 2.0]


def test_a_checkpoint_is_synced_before_it_appears(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto import _files

    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(_files.os, "fsync", spy)
    checkpoint.write_checkpoint(tmp_path, _window())
    assert [Path(p).parent for p in synced] == [tmp_path, tmp_path.parent]
    assert Path(synced[0]).name.startswith(".consensus-000003.npz.")
    assert Path(synced[1]) == tmp_path


@pytest.mark.skipif(not os.path.exists("/dev/stdout"), reason="no /dev/stdout")
def test_dev_stdout_on_a_pipe_is_written_in_place() -> None:
    """``/dev/stdout`` is a link the kernel resolves to the process's fd 1; resolved by path
    (realpath) it named ``/proc/<pid>/fd/pipe:[N]``, which does not exist, and the write
    failed with 'No such file or directory'."""
    import subprocess
    import sys

    code = ("from pathlib import Path; from flodl_proto._files import replace_file; "
            "replace_file(Path('/dev/stdout'), b'data\\n')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"data\n", b"")


def test_a_link_to_a_device_is_written_in_place(tmp_path: Path) -> None:
    """Through the link, as open() would: nothing is created beside the link or the device."""
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    replace_file(link, b"data")
    assert _names(tmp_path) == ["null"] and link.is_symlink()


def test_make_folders_names_the_folder_it_failed_at(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of the output's path that cannot be created was reported by the reason alone
    (``Not a directory``, ``Operation not permitted``), as if of the file: the step names the
    folder that failed, and a file in the way is named."""
    from flodl_proto._files import make_folders

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError) as e:
        make_folders(blocker)
    assert (e.value.strerror, e.value.filename) == (
        f"creating the folder {shown_name(str(blocker))}: Not a directory (it exists and is not "
        "a folder)", str(blocker))
    with pytest.raises(NotADirectoryError) as e:
        make_folders(blocker / "a" / "b")
    assert e.value.strerror == (f"creating the folder {shown_name(str(blocker / 'a' / 'b'))}: Not "
                                f"a directory ({shown_name(str(blocker))} is not a folder)")
    real_mkdir = os.mkdir

    def not_permitted(path: Any, mode: int = 0o777) -> None:
        if Path(path) == tmp_path / "x":  # as /sys/kernel/x (mkdir of /sys/kernel/x/y: ENOENT)
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", not_permitted)
    with pytest.raises(PermissionError) as e:
        make_folders(tmp_path / "x" / "y")
    assert e.value.strerror == (f"creating the folder {shown_name(str(tmp_path / 'x'))}: "
                                "Operation not permitted")
    make_folders(tmp_path)  # a folder that exists: nothing to do
    make_folders(tmp_path / "new" / "sub")
    assert (tmp_path / "new" / "sub").is_dir()


def test_make_folders_names_a_link_to_no_folder_for_what_it_is(tmp_path: Path) -> None:
    """A symbolic link where a folder of the path should be, leading to nothing or to a loop
    of links, was 'Not a directory (it exists and is not a folder)' (mkdir's EEXIST): it is
    named for what it is (the demo's new --salt-file, docs --out, every output path)."""
    from flodl_proto._files import make_folders

    dangling, loop = tmp_path / "dangling", tmp_path / "loop1"
    dangling.symlink_to(tmp_path / "gone" / "dir")
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    with pytest.raises(FileNotFoundError) as e:
        make_folders(dangling / "sub")
    assert (e.value.strerror, e.value.filename) == (
        f"creating the folder {shown_name(str(dangling))}: No such file or directory (a "
        "symbolic link to nothing)", str(dangling))
    with pytest.raises(OSError) as e:
        make_folders(loop)
    assert (e.value.errno, e.value.strerror, e.value.filename) == (
        errno.ELOOP, f"creating the folder {shown_name(str(loop))}: Too many levels of symbolic "
        "links", str(loop))
    assert not (tmp_path / "gone").exists()


def test_create_file_makes_a_new_file_whole_and_never_replaces_one(tmp_path: Path) -> None:
    """A new file appears whole with ``new_mode`` less the umask and no temporary beside it; a
    name that exists (a file, a link to no file) is refused with ``FileExistsError`` naming it,
    and left as it was, nothing written where a link points."""
    out = tmp_path / "s.hex"
    create_file(out, b"new\n", new_mode=0o600)
    assert out.read_bytes() == b"new\n" and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["s.hex"]
    with pytest.raises(FileExistsError) as e:
        create_file(out, b"other\n")
    assert (e.value.filename, out.read_bytes()) == (str(out), b"new\n")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        create_file(link, b"other\n")
    assert sorted(os.listdir(tmp_path)) == ["link", "s.hex"]


def test_create_file_without_hard_links_still_refuses_an_existing_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system that refuses hard links, the file is created exclusively in place;
    one that exists by then is still refused, and no temporary is left."""
    def no_links(src: Any, dst: Any) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", no_links)
    out = tmp_path / "s.hex"
    create_file(out, b"new\n", new_mode=0o600)
    assert out.read_bytes() == b"new\n" and stat.S_IMODE(out.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        create_file(out, b"other\n")
    assert (out.read_bytes(), os.listdir(tmp_path)) == (b"new\n", ["s.hex"])


def test_create_file_that_fails_names_its_step_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link refused for another reason names the step and the file, and leaves neither the
    file nor the temporary."""
    def full(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", full)
    out = tmp_path / "s.hex"
    with pytest.raises(OSError) as e:
        create_file(out, b"new\n")
    assert (e.value.strerror, e.value.filename) == (
        "linking the new file to its name: No space left on device", str(out))
    assert os.listdir(tmp_path) == []

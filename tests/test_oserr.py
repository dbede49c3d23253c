"""flodl_proto._oserr: the reason of an error without its path or errno (``os_reason``), and
what kind of file a path is (``file_kind``)."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest
import yaml

from flodl_proto._oserr import file_kind, os_reason
from flodl_proto.errors import shown


def test_an_os_error_gives_its_strerror_without_the_path_or_errno(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(OSError) as e:
        missing.read_bytes()
    assert str(missing) in str(e.value) and "[Errno 2]" in str(e.value)
    assert os_reason(e.value) == "No such file or directory"
    assert os_reason(PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/x", None,
                                     "/y")) == "Permission denied"


@pytest.mark.parametrize(("e", "reason"), [
    (TimeoutError("timed out"), "timed out"),               # an OSError with no errno
    (OSError("a plain message"), "a plain message"),
    (ValueError("not a salt"), "not a salt"),                 # anything else: its text
    (OSError(), "OSError"),                                   # no text at all: the class
    (ConnectionResetError(), "ConnectionResetError"),
    (KeyError(), "KeyError"),
])
def test_without_a_strerror_the_text_then_the_class_name(e: BaseException, reason: str) -> None:
    assert os_reason(e) == reason


def test_a_yaml_error_gives_its_text() -> None:
    with pytest.raises(yaml.YAMLError) as e:
        yaml.safe_load("a: [unclosed")
    assert os_reason(e.value) == str(e.value) and os_reason(e.value)


# -- file_kind: what a path that held nothing is ---------------------------------------------------
def _block_device() -> Path | None:
    """A block device of this machine (``/dev/loop0``, ``/dev/sda``), or None when it has none."""
    try:
        entries = list(os.scandir("/dev"))
    except OSError:
        return None
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            if stat.S_ISBLK(entry.stat(follow_symlinks=False).st_mode):
                return Path(entry.path)
        except OSError:
            continue
    return None


def test_file_kind_of_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "salt.fifo"
    os.mkfifo(fifo)
    assert file_kind(os.stat(fifo).st_mode) == "a FIFO"


def test_file_kind_of_a_block_device() -> None:
    """A block device of this machine when it has one, else the mode ``stat`` gives one
    (``S_IFBLK`` with its permission bits): the same words either way."""
    device = _block_device()
    mode = os.stat(device).st_mode if device is not None else stat.S_IFBLK | 0o660
    assert stat.S_ISBLK(mode)
    assert file_kind(mode) == "a block device"


@pytest.mark.parametrize(("mode", "kind"), [
    (stat.S_IFREG | 0o644, "an empty file"),
    (stat.S_IFCHR | 0o666, "a character device"),
    (stat.S_IFIFO | 0o600, "a FIFO"),
    (stat.S_IFBLK | 0o660, "a block device"),
    (stat.S_IFDIR | 0o755, "not a regular file"),
    (stat.S_IFSOCK | 0o777, "not a regular file"),
    (stat.S_IFLNK | 0o777, "not a regular file"),
])
def test_file_kind_of_every_file_type(mode: int, kind: str) -> None:
    assert file_kind(mode) == kind


def test_a_salt_file_that_is_a_fifo_of_no_bytes_says_what_it_is(tmp_path: Path) -> None:
    """A FIFO whose writer closes it at once holds no byte: the line says it is a FIFO, not an
    empty file."""
    from flodl_proto.commands.relay import cli_salt

    fifo = tmp_path / "salt.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: os.close(os.open(fifo, os.O_WRONLY)))
    writer.start()  # its open waits for the reader's, then it closes: the reader reads no byte
    try:
        with pytest.raises(ValueError) as e:
            cli_salt(None, str(fifo))
    finally:
        writer.join()
    assert str(e.value) == (f"argument --salt-file: {shown(str(fifo))}: session salt must "
                            "be 16 bytes written as 32 hex digits, got 0 bytes (a FIFO)")

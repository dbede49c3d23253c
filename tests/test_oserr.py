"""flodl_proto._oserr.os_reason: the reason of an error without its path or errno."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import yaml

from flodl_proto._oserr import os_reason


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

"""Assertions the codec's unit tests share."""

from __future__ import annotations

import pytest

from flodl_proto import errors


def check(exc: pytest.ExceptionInfo[errors.ProtocolError], cls: type[errors.ProtocolError],
          remote: bool, error_id: str, message: str, **fields: object) -> None:
    """The error is ``cls`` on the given side, with this catalogue id, message and fields."""
    e = exc.value
    assert isinstance(e, cls)
    assert isinstance(e, errors.RemoteProtocolError if remote else errors.LocalProtocolError)
    assert not isinstance(e, errors.LocalProtocolError if remote else errors.RemoteProtocolError)
    assert e.remote is remote
    assert e.error_id == error_id
    assert str(e) == message
    assert dict(e.fields) == fields

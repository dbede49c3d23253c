"""Edges of the ``conform`` command line and of its reports."""

from __future__ import annotations

import pytest

from flodl_proto.cli import main

_PREFIX = "flodl-proto conform controller: error: "


# -- --timeout-scale shown as given ---------------------------------------------------------------
@pytest.mark.parametrize(("value", "problem"), [(" ", "is not a number"),
                                                ("", "is not a number"),
                                                (" 0.01 ", "is out of range"),
                                                ("\tnan", "is not finite")])
def test_an_invalid_timeout_scale_is_shown_as_given(
        value: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --timeout-scale ' ' was shown as ''
    assert main(["conform", "controller", "--launch", "x", "--timeout-scale", value]) == 2
    assert capsys.readouterr() == (
        "", f"{_PREFIX}--timeout-scale={value!r} {problem}; expected a finite scale factor "
        "from 0.1 to 1000\n")

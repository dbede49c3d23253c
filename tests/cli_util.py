"""The ``flodl-proto`` command line run in process, for the tests of its lines and exit codes."""

from __future__ import annotations

import pytest


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``flodl-proto ARGS`` run by :func:`flodl_proto.cli.main` in this process: its exit code
    (an argparse usage error's ``SystemExit`` included), stdout and stderr."""
    from flodl_proto.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse usage errors
        code = int(e.code or 0)
    got = capsys.readouterr()
    return code, got.out, got.err

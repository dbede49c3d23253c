"""The ``flodl-proto`` command line run in process, for the tests of its lines and exit codes."""

from __future__ import annotations

import os
import threading
from typing import IO, Any

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


def close_and_drain(writer: Any, read_end: int, out: IO[str]) -> str:
    """Close the LineWriter ``writer`` whose stream ``out`` writes into a pipe while a thread
    reads the pipe's ``read_end`` (so a writer blocked on a full pipe can finish), close both
    ends, and return everything the pipe carried."""
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(read_end, 1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    writer.close()
    out.close()
    reader.join()
    os.close(read_end)
    return got.decode()

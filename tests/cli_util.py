"""The ``flodl-proto`` command line run in process, for the tests of its lines and exit codes."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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


@dataclass
class PipeWrites:
    """What a pipe standing in for stdout carried (:func:`stdout_pipe_writes`): ``writes``,
    the bytes of each ``os.write`` to its write end, in order; ``got``, every byte read from it
    once its stream was closed (set as the ``with`` block ends)."""

    writes: list[bytes] = field(default_factory=list)
    got: bytes = b""


@contextmanager
def stdout_pipe_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[PipeWrites]:
    """Within the ``with`` block, ``sys.stdout`` is a text stream into a new pipe and every
    ``os.write`` to the pipe is recorded (a LineWriter writes its lines so); as the block ends
    the stream is closed and the pipe read to its end into ``got``. Nothing reads the pipe
    before then: the block writes no more than a pipe holds (64 KiB)."""
    read_end, write_end = os.pipe()
    recorded = PipeWrites()
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if fd == write_end:
            recorded.writes.append(bytes(data))
        return real_write(fd, data)

    try:
        out = os.fdopen(write_end, "w", encoding="utf-8")
        try:
            with monkeypatch.context() as m:
                m.setattr(sys, "stdout", out)
                m.setattr(os, "write", write)
                yield recorded
        finally:
            out.close()
        got = bytearray()
        while chunk := os.read(read_end, 1 << 16):
            got.extend(chunk)
        recorded.got = bytes(got)
    finally:
        os.close(read_end)

"""The ``flodl-proto`` command line run in process, for the tests of its lines and exit codes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import pytest

from flodl_proto.codec import encode_ack

from .cluster_util import recv_exact


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


#: the session salt of :func:`acked_rank`'s rank (hex)
RANK_SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"


@contextmanager
def acked_rank(*rank_args: str, preexec: Callable[[], None] | None = None,
               env: dict[str, str] | None = None
               ) -> Iterator[tuple[subprocess.Popen[str], socket.socket]]:
    """A ``flodl-proto rank`` subprocess (rank 0 of 1, ``rank_args`` added; ``preexec`` run in
    the child before it starts; ``env``: its environment, else the test's) whose relay is this
    test: its listener accepts the rank, reads the handshake and acks it (version 2). Yields
    the process (stdout and stderr piped, text) and the accepted connection; on exit the
    connection and the listener are closed and a process still running is killed."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(60)
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto", "rank", "--relay",
                          f"127.0.0.1:{lst.getsockname()[1]}", "--rank", "0", "--world-size",
                          "1", "--salt", RANK_SALT_HEX, *rank_args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=preexec, env=env)
    try:
        conn, _ = lst.accept()
        with conn:
            conn.settimeout(60)
            recv_exact(conn, 16)  # handshake
            conn.sendall(encode_ack(2))
            yield p, conn
    finally:
        lst.close()
        if p.poll() is None:
            p.kill()
            p.communicate()

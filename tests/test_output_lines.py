"""``commands._output.LineWriter`` with ``coalesce``: the lines put while the writer waits are
written with the line that woke it, in one write, in order; none is lost, ``close`` writes the
ones still waiting; without ``coalesce`` every line is its own write, as before."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from flodl_proto.commands import _output
from flodl_proto.commands._output import LineWriter


def _run(monkeypatch: pytest.MonkeyPatch, lines: list[str], coalesce: float,
         backlog: int = 256) -> tuple[list[bytes], int]:
    """Put ``lines`` before the writer starts, close it; the writes it made to a pipe."""
    read_end, write_end = os.pipe()
    writes: list[bytes] = []
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if fd == write_end:
            writes.append(bytes(data))
        return real_write(fd, data)

    out = os.fdopen(write_end, "w", encoding="utf-8")
    try:
        with monkeypatch.context() as m:
            m.setattr(sys, "stdout", out)
            m.setattr(_output.os, "write", write)
            w = LineWriter("stdout", backlog, coalesce=coalesce)
            for ln in lines:
                w.put(ln)
            w.start()
            w.close()
    finally:
        out.close()
    got = b""
    while chunk := os.read(read_end, 1 << 16):
        got += chunk
    os.close(read_end)
    assert got == b"".join(writes)
    return writes, w.dropped


def test_coalesced_lines_leave_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"round {i}: kind model weight 2 bytes 4202 ms 0.500" for i in range(100)]
    writes, dropped = _run(monkeypatch, lines, coalesce=0.01)
    assert dropped == 0
    assert writes == ["".join(f"{ln}\n" for ln in lines).encode()]


def test_without_coalesce_every_line_is_a_write(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = ["relay 0 joined: host 'h0' ranks [0, 1]", "round 1: kind model weight 2"]
    writes, dropped = _run(monkeypatch, lines, coalesce=0.0)
    assert (writes, dropped) == ([f"{ln}\n".encode() for ln in lines], 0)


def test_coalesced_lines_keep_the_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    writes, dropped = _run(monkeypatch, [str(i) for i in range(10)], coalesce=0.01, backlog=4)
    assert (writes, dropped) == ([b"0\n1\n2\n3\n"], 6)


def test_lines_put_while_the_writer_waits_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # lines put after start(), and close() while some may still wait: all written, in order
    read_end, write_end = os.pipe()
    out = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    w = LineWriter("stdout", 1000, coalesce=0.005)
    w.start()
    for i in range(300):
        w.put(f"line {i}")
    w.close()
    out.close()
    got = b""
    while chunk := os.read(read_end, 1 << 16):
        got += chunk
    os.close(read_end)
    assert got.decode().splitlines() == [f"line {i}" for i in range(300)]
    assert w.dropped == 0


def test_coalesced_lines_to_a_stream_without_a_descriptor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    buf = io.StringIO()  # fileno() raises: the lines go through write()
    monkeypatch.setattr(sys, "stdout", buf)
    w = LineWriter("stdout", 16, coalesce=0.01)
    for ln in ("a", "b", "c"):
        w.put(ln)
    w.start()
    w.close()
    assert (buf.getvalue(), w.dropped, w.broken) == ("a\nb\nc\n", 0, False)


def test_lines_dropped_from_several_threads_are_all_counted() -> None:
    # put() runs on every producing thread: the drop count is kept under the writer's lock
    w = LineWriter("stdout", 4)  # never started: the first 4 lines wait, the others are dropped
    go = threading.Barrier(4)

    def produce() -> None:
        go.wait()
        for i in range(500):
            w.put(str(i))

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert w.dropped == 4 * 500 - 4


def test_a_line_is_counted_as_dropped_under_the_writers_lock() -> None:
    w = LineWriter("stdout", 1)
    w.put("waits")
    counted = threading.Event()

    def drop_one() -> None:
        w.put("dropped")
        counted.set()

    with w._lock:  # a thread reading or counting the drops meanwhile waits for it
        t = threading.Thread(target=drop_one)
        t.start()
        assert not counted.wait(0.05)
    t.join()
    assert counted.is_set() and w.dropped == 1

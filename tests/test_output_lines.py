"""``commands._output.LineWriter`` with ``coalesce``: the lines put while the writer waits are
written with the line that woke it, in one write, in order; none is lost, ``close`` writes the
ones still waiting; without ``coalesce`` every line is its own write, as before."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from flodl_proto.commands._output import LineWriter

from .cli_util import close_and_drain, stdout_pipe_writes


def _run(monkeypatch: pytest.MonkeyPatch, lines: list[str], coalesce: float,
         backlog: int = 256) -> tuple[list[bytes], int]:
    """Put ``lines`` before the writer starts, close it; the writes it made to a pipe."""
    with stdout_pipe_writes(monkeypatch) as pipe:
        w = LineWriter("stdout", backlog, coalesce=coalesce)
        for ln in lines:
            w.put(ln)
        w.start()
        w.close()
    assert pipe.got == b"".join(pipe.writes)
    return pipe.writes, w.dropped


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
    with stdout_pipe_writes(monkeypatch) as pipe:
        w = LineWriter("stdout", 1000, coalesce=0.005)
        w.start()
        for i in range(300):
            w.put(f"line {i}")
        w.close()
    assert pipe.got.decode().splitlines() == [f"line {i}" for i in range(300)]
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


def test_a_line_put_while_the_writer_is_busy_wakes_no_thread() -> None:
    # the writer not waiting for a line (busy, gathering, or not started): put() appends the
    # line under the writer's lock and calls nothing of threading (no notify, no Event.set)
    w = LineWriter("stdout", 8, coalesce=0.05)
    called: list[str] = []

    def profile(frame: object, event: str, arg: object) -> None:
        if event in ("call", "c_call"):
            code = getattr(frame, "f_code", None)
            name = getattr(arg, "__qualname__", None) if event == "c_call" else \
                getattr(code, "co_qualname", None)
            called.append(str(name))

    sys.setprofile(profile)
    try:
        for i in range(10):
            w.put(f"line {i}")
    finally:
        sys.setprofile(None)
    assert [n for n in called if n.startswith(("Condition", "Event", "Queue"))] == []
    assert (list(w._lines), w.dropped) == ([f"line {i}" for i in range(8)], 2)


@pytest.mark.timeout(60)
def test_lines_put_while_the_writer_is_blocked_on_a_stalled_stdout_count_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a 4 KiB pipe nobody reads: the writer blocks on a line longer than the pipe, which it
    # holds (it counts in the backlog of 8): of 20 lines put then, exactly 7 wait and 13 are
    # dropped; once the pipe is read everything that waited is written, in order
    import fcntl

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
    out = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    w = LineWriter("stdout", 8, coalesce=0.01)
    long = "L" * 70000
    w.put(long)
    w.start()
    while not (w._held == 1 and w._lines.qsize() == 0):  # the writer took the long line
        threading.Event().wait(0.005)
    for i in range(20):
        w.put(f"line {i}")
    assert w.dropped == 13
    text = close_and_drain(w, read_end, out)
    assert text.splitlines() == [long] + [f"line {i}" for i in range(7)]
    assert (w.dropped, w.broken) == (13, False)


@pytest.mark.timeout(60)
def test_lines_written_leave_the_backlog_before_the_next_gathering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the lines of a finished write no longer count while the writer gathers the next ones:
    # a full backlog written, then as many lines again are all kept
    import io

    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    w = LineWriter("stdout", 4, coalesce=0.2)
    for i in range(4):
        w.put(f"a{i}")
    w.start()
    while buf.getvalue().count("\n") < 4:
        threading.Event().wait(0.005)
    for i in range(4):
        w.put(f"b{i}")
    dropped = w.dropped
    w.close()
    assert dropped == 0
    assert buf.getvalue() == "".join(f"a{i}\n" for i in range(4)) + "".join(
        f"b{i}\n" for i in range(4))


@pytest.mark.timeout(120)
def test_a_gathering_ends_once_half_the_backlog_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # lines put faster than the gathering lasts (a rank's or controller's rounds of a fraction
    # of a millisecond) while the stream keeps up: the line that fills half the backlog wakes
    # the writer, so no line is dropped for a gathering that held the backlog full
    import io

    from .cluster_util import wait_until

    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    w = LineWriter("stdout", 8, coalesce=3600.0)  # a gathering that outlasts any test
    w.start()
    for batch in range(5):
        for i in range(4):
            w.put(f"line {4 * batch + i}")
        wait_until(lambda: buf.getvalue().count("\n") == 4 * (batch + 1), timeout=30)  # noqa: B023
    assert w.dropped == 0
    w.close()  # ends the gathering under way too
    assert (buf.getvalue(), w.dropped, w._writer.is_alive()) == (
        "".join(f"line {i}\n" for i in range(20)), 0, False)

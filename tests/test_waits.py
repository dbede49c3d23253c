"""``commands._waits`` and the waits of a command's main thread that use it: a signal the kernel
gives another thread (as it may give a process's Ctrl-C or SIGTERM to any of its threads) runs
its Python handler on the main thread within a step of the wait, where an untimed
``Thread.join()``, ``Popen.wait()`` or a long ``Queue.get`` held it until the wait ended.

Each site's test waits on this (the main) thread for something only the test ends; another
thread, once the wait has begun, has the kernel give SIGUSR1 to a third thread. The handler
notes whether the wait was still held (nothing released yet); the test releases it once the
handler ran, or after :data:`_HOLD` seconds when it did not."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.commands import _waits
from flodl_proto.commands._output import LineWriter

from .cluster_util import wait_until

pytestmark = pytest.mark.timeout(120)

#: seconds a wait is held after the signal when its handler has not run (the failure's cost),
#: unless a test says otherwise
_HOLD = 10.0


class _Stopped(Exception):
    """Raised by the test's handler out of the wait it interrupts."""


def _handler_ran_in_the_wait(wait: Callable[[], object], waiting: Callable[[], bool],
                             release: Callable[[], None], hold: float = _HOLD) -> list[bool]:
    """Call ``wait()`` here while SIGUSR1 goes to another thread once ``waiting()`` holds (and
    0.3 s more); ``release()`` then ends what ``wait`` waits for, once the handler ran or after
    ``hold`` seconds (below the wait's own bound, for a timed one). Returns, per run of the
    handler, whether it ran before the release (it raises :class:`_Stopped` out of the wait
    then)."""
    released, handled, idle = threading.Event(), threading.Event(), threading.Event()
    ran: list[bool] = []

    def handler(signum: int, frame: object) -> None:
        ran.append(released.is_set())
        handled.set()
        if not released.is_set():
            raise _Stopped

    victim = threading.Thread(target=idle.wait, name="victim")  # the kernel's choice

    def send() -> None:
        try:
            wait_until(waiting, timeout=30)
            time.sleep(0.3)  # the main thread is in its wait by then
            signal.pthread_kill(victim.ident or 0, signal.SIGUSR1)
            handled.wait(hold)
        finally:
            released.set()
            release()

    sender = threading.Thread(target=send, name="sender")
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        victim.start()
        sender.start()
        try:
            wait()
        except _Stopped:
            pass
        sender.join()
        time.sleep(0.05)  # a handler left pending by the wait runs here
    finally:
        idle.set()
        victim.join()
        signal.signal(signal.SIGUSR1, old)
    return ran


def test_join_thread_and_wait_process_return_as_the_untimed_waits() -> None:
    t = threading.Thread(target=time.sleep, args=(0.3,))
    _waits.join_thread(t)  # never started: at once
    t.start()
    _waits.join_thread(t)
    assert not t.is_alive()
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.3); "
                             "sys.exit(3)"])
    assert _waits.wait_process(proc) == 3
    assert _waits.wait_process(proc) == 3  # reaped already: its status again


def test_get_item_returns_an_item_or_raises_empty_after_its_timeout() -> None:
    q: queue.Queue[int] = queue.Queue()
    threading.Timer(0.3, q.put, args=(7,)).start()
    assert _waits.get_item(q, 30.0) == 7
    began = time.monotonic()
    with pytest.raises(queue.Empty):
        _waits.get_item(q, 0.35)
    assert time.monotonic() - began >= 0.35
    with pytest.raises(queue.Empty):
        _waits.get_item(q, 0.0)
    q.put(8)
    assert _waits.get_item(q, 0.0) == 8


def test_the_timed_waits_end_at_their_timeout() -> None:
    go = threading.Event()
    t = threading.Thread(target=go.wait)
    t.start()
    began = time.monotonic()
    _waits.join_thread(t, 0.35)
    assert (t.is_alive(), time.monotonic() - began >= 0.35) == (True, True)
    _waits.join_thread(t, 0.0)
    assert t.is_alive()
    go.set()
    _waits.join_thread(t, 30.0)
    assert not t.is_alive()
    began = time.monotonic()
    _waits.sleep(0.35)
    assert time.monotonic() - began >= 0.35
    _waits.sleep(0.0)


def test_sleep_runs_a_handler_another_thread_got() -> None:
    # the rank's --interval pause; nothing ends a sleep early but the handler
    from flodl_proto.commands.rank import pause

    ran = _handler_ran_in_the_wait(lambda: pause(_HOLD * 3), lambda: True, lambda: None)
    assert ran == [False]


def test_join_thread_runs_a_handler_another_thread_got() -> None:
    go = threading.Event()
    t = threading.Thread(target=go.wait)
    t.start()
    ran = _handler_ran_in_the_wait(lambda: _waits.join_thread(t), lambda: True, go.set)
    t.join()
    assert ran == [False]


def test_wait_process_runs_a_handler_another_thread_got() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    assert proc.stdin is not None
    ran = _handler_ran_in_the_wait(lambda: _waits.wait_process(proc), lambda: True,
                                   proc.stdin.close)
    assert (ran, proc.wait(timeout=60)) == ([False], 0)


def test_a_line_writers_close_runs_a_handler_another_thread_got(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # close() waits for a pipe nobody reads to take a line longer than the pipe
    read_end, write_end = os.pipe()
    out = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    w = LineWriter("stdout", 8)
    w.put("L" * 70000)
    w.start()
    wait_until(lambda: not w._lines, timeout=30)  # the writer took the line
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(read_end, 1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    ran = _handler_ran_in_the_wait(w.close, lambda: w._closing, reader.start)
    w.close()  # the rest of the wait, after the handler's exception
    out.close()
    reader.join()
    os.close(read_end)
    assert ran == [False]
    assert (bytes(got), w.dropped, w._writer.is_alive()) == (b"L" * 70000 + b"\n", 0, False)


def _flag_wait(flag: Path) -> str:
    return f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.02)\n"


def test_the_demos_wait_for_a_member_that_closed_its_stdout_runs_a_handler(
        tmp_path: Path) -> None:
    # a member that closed its stdout before listening and has not exited: first_line reaps it
    from flodl_proto.commands.demo import _Cluster

    flag = tmp_path / "go"
    cluster = _Cluster("00" * 16)
    try:
        child = cluster.spawn("relay0", [], private=True, wrap=lambda argv: [
            sys.executable, "-c", "import os\nos.close(1)\n" + _flag_wait(flag)])
        ran = _handler_ran_in_the_wait(lambda: cluster.first_line(child, 60.0),
                                       lambda: not child.readers[0].is_alive(), flag.touch)
    finally:
        flag.touch()
        cluster.close()
    assert ran == [False]
    assert child.proc.returncode == 0


def test_the_demos_wait_for_a_members_first_line_runs_a_handler(tmp_path: Path) -> None:
    # a member silent for up to the demo's start timeout (60 s here)
    from flodl_proto.commands.demo import _Cluster

    flag = tmp_path / "go"
    cluster = _Cluster("00" * 16)
    try:
        child = cluster.spawn("relay0", [], private=True, wrap=lambda argv: [
            sys.executable, "-c", _flag_wait(flag) + "print('listening on 127.0.0.1:1')"])
        ran = _handler_ran_in_the_wait(lambda: cluster.first_line(child, 60.0),
                                       lambda: True, flag.touch)
    finally:
        flag.touch()
        cluster.close()
    assert ran == [False]


def test_the_demos_close_waiting_for_a_members_output_runs_a_handler(tmp_path: Path) -> None:
    # the member exited, but a process it started holds its stdout and stderr open: close()
    # joins the threads that read them
    from flodl_proto.commands.demo import _Cluster

    flag = tmp_path / "go"
    grandchild = _flag_wait(flag)
    cluster = _Cluster("00" * 16)
    child = cluster.spawn("relay0", [], private=True, wrap=lambda argv: [
        sys.executable, "-c", f"import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])"])
    try:
        wait_until(lambda: child.proc.poll() is not None, timeout=30)
        ran = _handler_ran_in_the_wait(lambda: cluster.close(grace=0.0),
                                       lambda: child.proc.returncode is not None, flag.touch)
    finally:
        flag.touch()
        cluster.close(grace=0.0)
    assert ran == [False]
    assert not any(t.is_alive() for t in child.readers)


def test_the_demos_wait_for_a_members_last_lines_runs_a_handler(tmp_path: Path) -> None:
    # read_last_lines waits up to its ``wait`` seconds for each line (30 s here)
    from flodl_proto.commands.demo import Result, _Cluster, read_last_lines

    flag = tmp_path / "go"
    cluster = _Cluster("00" * 16)
    res = Result()
    try:
        child = cluster.spawn("relay0", [], private=True, wrap=lambda argv: [
            sys.executable, "-c", _flag_wait(flag) + "print('relay finished: ok')"])
        ran = _handler_ran_in_the_wait(lambda: read_last_lines(child, res, 30.0),
                                       lambda: True, flag.touch)
    finally:
        flag.touch()
        cluster.close()
    assert ran == [False]


def test_the_round_benchs_wait_for_a_childs_first_line_runs_a_handler(tmp_path: Path) -> None:
    # bench/round.py waits up to 60 s for a member's listening line (and up to an hour for a
    # rank's next line) while threads of its own read the children's output
    from .test_bench import _load

    rb = _load("round")
    flag = tmp_path / "go"
    p = rb._Proc(["-c", _flag_wait(flag) + "print('listening on 127.0.0.1:1')"],
                 dict(os.environ))
    try:
        ran = _handler_ran_in_the_wait(lambda: p.address("controller", 60.0), lambda: True,
                                       flag.touch)
        assert p.address("controller", 60.0) == "127.0.0.1:1"
    finally:
        flag.touch()
        assert p.reap(60.0) == 0
    assert ran == [False]


def test_the_wan_benchs_wait_for_a_childs_line_runs_a_handler(tmp_path: Path) -> None:
    # bench/wan.py waits up to 120 s for a lab member's line, read by a thread of its own
    from .test_bench import _load

    wan = _load("wan")
    flag = tmp_path / "go"
    p = subprocess.Popen([sys.executable, "-c", _flag_wait(flag) + "print('listening')"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ran = _handler_ran_in_the_wait(lambda: wan._readline(p, "controller", 120.0),
                                       lambda: True, flag.touch)
    finally:
        flag.touch()
        p.communicate(timeout=60)
    assert (ran, p.returncode) == ([False], 0)


def _held(lock: Any) -> tuple[threading.Thread, threading.Event]:
    """A thread that holds ``lock`` until the event returned is set (as a fold in progress, or
    a core busy with a round, holds a runner's core lock)."""
    holding, go = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            go.wait()

    t = threading.Thread(target=hold, name="holder")
    t.start()
    holding.wait()
    return t, go


def test_the_controller_commands_shutdown_runs_a_handler() -> None:
    # the controller's teardown waits for its coordinator, held here by the core's lock (as
    # by a relay's writes, each up to the write-stall deadline)
    from flodl_proto.commands.controller import shut_down
    from flodl_proto.runner.controller import ReferenceController

    ctl = ReferenceController(1, bytes(16)).start()
    holder, go = _held(ctl._core_lock)
    try:
        ran = _handler_ran_in_the_wait(lambda: shut_down(ctl), lambda: True, go.set)
    finally:
        go.set()
        holder.join()
    outcome = shut_down(ctl)
    assert ran == [False]
    assert (outcome.clean, outcome.reason, outcome.detail) == (True, "stop", "shutdown()")


def test_the_relay_commands_shutdown_runs_a_handler() -> None:
    # the relay's shutdown takes the core's lock (held by a fold in progress), then joins its
    # threads
    from flodl_proto.commands.relay import shut_down
    from flodl_proto.runner.relay import Relay

    relay = Relay(("127.0.0.1", 1), [0], 1, bytes(16), listen_port=0).start()
    holder, go = _held(relay._core_lock)
    try:
        ran = _handler_ran_in_the_wait(lambda: shut_down(relay, "stopped by a signal"),
                                       lambda: True, go.set)
    finally:
        go.set()
        holder.join()
    assert shut_down(relay, "stopped by a signal") is None
    assert ran == [False]
    outcome = relay.core.outcome  # the handler's exception left the wait before the reason
    # was given: the relay ended by itself once its stop was set
    assert outcome is not None and (outcome.clean, outcome.detail) == (True, "relay shut down")


def test_the_round_benchs_reap_waiting_for_a_childs_output_runs_a_handler(
        tmp_path: Path) -> None:
    # the child exited, but a process it started holds its stdout and stderr open: reap waits
    # up to 5 s for each thread that reads them (held 2 s here)
    from .test_bench import _load

    rb = _load("round")
    flag = tmp_path / "go"
    grandchild = _flag_wait(flag)
    p = rb._Proc(["-c", f"import subprocess, sys\n"
                        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])"],
                 dict(os.environ))
    try:
        wait_until(lambda: os.waitid(os.P_PID, p.p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                   is not None, timeout=30)
        ran = _handler_ran_in_the_wait(lambda: p.reap(60.0), lambda: True, flag.touch,
                                       hold=2.0)
    finally:
        flag.touch()
    assert ran == [False]
    assert p.reap(60.0) == 0


def test_the_vector_replays_wait_for_the_controllers_end_runs_a_handler() -> None:
    # vectors check replays a controller case on the main thread and waits up to 5 s for the
    # controller's end (held 2 s here by its core's lock)
    from flodl_proto.interop.ops_controller import _ended
    from flodl_proto.runner.controller import ReferenceController

    ctl = ReferenceController(1, bytes(16)).start()
    holder, go = _held(ctl._core_lock)
    ctl.request_stop("test")
    try:
        ran = _handler_ran_in_the_wait(lambda: _ended(ctl, 5.0), lambda: True, go.set,
                                       hold=2.0)
    finally:
        go.set()
        holder.join()
    outcome = _ended(ctl, 30.0)
    assert ran == [False]
    assert outcome is not None and (outcome.clean, outcome.detail) == (True, "test")
    assert ctl.shutdown() is outcome


def test_the_vector_replays_ended_gives_none_at_its_deadline() -> None:
    from flodl_proto.interop.ops_controller import _ended
    from flodl_proto.runner.controller import ReferenceController

    ctl = ReferenceController(1, bytes(16)).start()
    try:
        assert (_ended(ctl, 0.3), _ended(ctl, 0.0)) == (None, None)
    finally:
        ctl.shutdown()


def test_the_vector_replays_read_runs_a_handler() -> None:
    # a recv step waits up to 5 s for its bytes (2 s here)
    import socket

    from flodl_proto.interop.ops_controller import _read

    a, b = socket.socketpair()
    with a, b:
        ran = _handler_ran_in_the_wait(lambda: _read(a, 4, time.monotonic() + 5.0),
                                       lambda: True, lambda: b.sendall(b"ab"), hold=2.0)
        b.sendall(b"cd")
        assert _read(a, 4, time.monotonic() + 30.0) == (b"abcd", False)
        assert _read(a, 4, time.monotonic() + 0.3) == (b"", False)
        b.close()
        assert _read(a, 4, time.monotonic() + 30.0) == (b"", True)
    assert ran == [False]

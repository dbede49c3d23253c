"""The conformance kit against hostile targets: a target that floods a connection, one that
leaves a process holding its output pipes, one that prints very long lines, a blank --launch.

Each target is a few lines of Python written here, launched by the kit as a real process."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import socket
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.conform import Case, KitSettings, load_catalogue
from flodl_proto.conform.player import CaseResult, free_port, play_case
from flodl_proto.conform.target import LaunchedTarget

CATALOGUE = load_catalogue()
SETTINGS = KitSettings(timeout_scale=0.1, ready_timeout=10.0, stop_bound=2.0)

#: a controller-role target: listens on {port}, prints its line, serves each connection with
#: ``serve(c)`` (defined by the test), and otherwise sleeps
_TARGET = """\
import os, socket, struct, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port)); s.listen()
print("listening on %s:%d" % (host, port), flush=True)
def serve(c):
{body}
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def _launch(body: str, tmp_path: Path) -> str:
    """A ``--launch`` command running ``_TARGET`` with ``body`` as its ``serve(c)``."""
    script = tmp_path / "target.py"
    script.write_text(_TARGET.replace("{body}", textwrap.indent(body, "    ")))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{host}} {{port}}"


def _case(steps: Sequence[Mapping[str, Any]]) -> Case:
    base = next(c for c in CATALOGUE if c.id == "controller.round.zero-mass")
    return dataclasses.replace(base, id="controller.test.hostile", versions=(3,),
                               steps={3: tuple(steps)})


def _play(steps: Sequence[Mapping[str, Any]], body: str, tmp_path: Path) -> CaseResult:
    launch = _launch(body, tmp_path)
    return play_case(_case(steps), 3, lambda: LaunchedTarget(launch), SETTINGS)


@pytest.fixture()
def peak_buffer(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The largest number of bytes a kit connection held at once, over the test."""
    from flodl_proto.conform import player

    peak = [0]
    fill = player._Conn.fill

    def watched(self: Any, *args: Any, **kwargs: Any) -> bool:
        got = fill(self, *args, **kwargs)
        peak[0] = max(peak[0], len(self.buf))
        return got

    monkeypatch.setattr(player._Conn, "fill", watched)
    return peak


# -- a flooding target: the kit keeps what a case can use, counts the rest -------------------------

#: 16 MiB sent on every connection, then the connection stays open
_FLOOD = """\
block = bytes.fromhex("d0170df1") + b"\\xff" * 65532
for _ in range(256):
    c.sendall(block)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_flood_before_an_expected_close_is_counted_not_kept(peak_buffer: list[int],
                                                            tmp_path: Path) -> None:
    # the step ends once more bytes than it allows arrived (it waited out its 30 s, counting
    # the whole 16 MiB): the count is what had arrived then, at most 1 MiB past the allowance
    # (what arrived without a wait) and one receive
    r = _play([{"connect": 0}, {"expect_close": {"conn": 0, "within": 30}}], _FLOOD, tmp_path)
    assert not r.passed and r.step == 1
    n = int(r.observed.rsplit("(", 1)[1].removesuffix(" B)"))
    assert 0 < n <= (1 << 20) + (1 << 16)
    assert r.message == (f"connection 0: expected a close with at most 0 bytes before it, "
                         f"observed {n} bytes so far, still open")
    assert r.observed.startswith("d0170df1ffff")
    assert r.seconds < 10.0
    assert 0 < peak_buffer[0] <= 1 << 17  # a bounded prefix, not what was counted


@pytest.mark.timeout(60)
def test_an_expected_close_fails_once_more_than_it_allows_arrived(tmp_path: Path) -> None:
    # four bytes allowed: the step goes on waiting for the close after the first four, and
    # ends when the next four come, not at the end of its 30 s
    r = _play([{"connect": 0}, {"expect_close": {"conn": 0, "allow": 4, "within": 30}}],
              _FOUR_BYTES_THEN_FOUR_MORE, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message == ("connection 0: expected a close with at most 4 bytes before it, "
                         "observed 8 bytes so far, still open")
    assert (r.expected, r.observed) == ("", "d0170df100000000")
    assert 0.3 <= r.seconds < 10.0


#: eight bytes and the close in one segment (TCP_CORK holds the bytes until the close)
_EIGHT_BYTES_AND_CLOSE = """\
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
c.sendall(bytes.fromhex("d0170df1") + bytes(4))
c.close()
"""


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="needs TCP_CORK (Linux)")
@pytest.mark.timeout(60)
def test_a_close_that_came_with_too_many_bytes_is_reported_as_a_close(tmp_path: Path) -> None:
    # once more than it allows arrived, the step still reads what is there without a wait:
    # the close that came with them, so the count is the whole and the failure a close's
    r = _play([{"connect": 0}, {"expect_close": {"conn": 0, "allow": 4, "within": 30}}],
              _EIGHT_BYTES_AND_CLOSE, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message == ("connection 0: expected a close with at most 4 bytes before it, "
                         "observed 8 bytes")
    assert r.observed == "d0170df100000000"


@pytest.mark.timeout(60)
def test_a_hello_header_announcing_a_huge_payload_is_refused_unread(
        peak_buffer: list[int], tmp_path: Path) -> None:
    from flodl_proto.codec.mux import _header_bytes

    head = _header_bytes(0, 0, (1 << 30) - 1, bytes(16)).hex()
    body = f'c.sendall(bytes.fromhex("{head}"))\n' + _FLOOD
    r = _play([{"connect": 0}, {"expect_hello": {"conn": 0, "ranks": [0]}}], body, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message.startswith("connection 0: not a valid Hello record: ")
    assert str((1 << 30) - 1) in r.message
    assert peak_buffer[0] <= 1 << 17


def test_running_out_of_memory_in_a_case_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.conform import player
    from flodl_proto.conform.inprocess import controller_target

    def no_memory(self: Any, i: int, s: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(player._Player, "step", no_memory)
    r = play_case(_case([{"connect": 0}]), 3, controller_target(), SETTINGS)
    assert (r.passed, r.started, r.step) == (False, True, 0)
    assert r.message == "the kit ran out of memory playing this step"
    assert r.exit is not None


# -- a target leaving a process that holds its output pipes ---------------------------------------

#: the target forks a process of its own session (out of reach of the kit's signals to the
#: target's group) that keeps the target's stdout and stderr open, and writes its pid to a file
_FORK = """\
import os, socket, sys, time
host, port, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port)); s.listen()
if os.fork() == 0:
    os.setsid()
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(30)
    os._exit(0)
print("listening on %s:%d" % (host, port), flush=True)
while True:
    s.accept()[0].close()
"""


def _fork_launch(tmp_path: Path) -> tuple[str, Path]:
    script, pidfile = tmp_path / "fork.py", tmp_path / "orphan.pid"
    script.write_text(_FORK)
    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{host}} {{port}} "
            f"{shlex.quote(str(pidfile))}"), pidfile


def _kill_orphan(pidfile: Path) -> None:
    import os
    import signal
    import time

    for _ in range(100):  # the orphan writes its pid as it starts
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    if pidfile.exists() and pidfile.read_text():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.mark.timeout(60)
def test_an_orphan_holding_the_output_pipes_does_not_keep_the_kit_waiting(
        tmp_path: Path) -> None:
    import time

    launch, pidfile = _fork_launch(tmp_path)
    t = LaunchedTarget(launch)
    try:
        from flodl_proto.conform.target import CaseContext

        port = free_port("127.0.0.1")
        t.start(CaseContext("controller", 3, 1, bytes(16), tmp_path / "salt", "127.0.0.1", port,
                            0, (), 0.1), 10.0)
        # the port listens before the target forks and prints: wait for the print
        deadline = time.monotonic() + 10.0
        while "listening on" not in t.output():
            assert time.monotonic() < deadline, "the target printed nothing"
            time.sleep(0.02)
        t0 = time.monotonic()
        ex = t.stop(5.0)
        assert ex is not None and ex.status == -15
        # the stop is a SIGTERM, then at most OUTPUT_DRAIN + 1 s of reading; waiting for the
        # orphan to close the pipes would take its 30 s, so 10 s still tells the two apart on a
        # loaded machine
        assert time.monotonic() - t0 < 10.0
        assert not any(r.is_alive() for r in t._readers)  # nothing left reading the pipes
        assert "listening on" in t.output()
    finally:
        _kill_orphan(pidfile)


@pytest.mark.timeout(60)
def test_the_kit_exits_while_an_orphan_of_its_target_holds_the_pipes(tmp_path: Path) -> None:
    import subprocess

    launch, pidfile = _fork_launch(tmp_path)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "flodl_proto.cli", "conform", "controller", "--version", "3",
             "--jobs", "1", "--timeout-scale", "0.1", "--cases", "controller.round.zero-mass",
             "--launch", launch], capture_output=True, text=True, timeout=20)
        assert res.returncode == 1, res.stderr
        assert "controller: 0 passed, 1 MUST failed" in res.stdout
    finally:
        _kill_orphan(pidfile)


# -- a blank --launch ---------------------------------------------------------------------------


@pytest.mark.parametrize("launch", ["  ", " ", "\\\n", "\t\n", "\\\n  \\\n"])
def test_a_blank_launch_is_a_usage_error(launch: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from flodl_proto.cli import main
    from flodl_proto.conform.target import fill_placeholders

    with pytest.raises(ValueError, match=r"^no command"):  # the command line names the option
        fill_placeholders(launch, {"port": "1"})
    assert main(["conform", "controller", "--launch", launch]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == ("flodl-proto conform controller: error: argument --launch: no command (the "
                       "value is blank)\n")


@pytest.mark.parametrize("launch,first", [("'' {port}", "''"), ('" " --port {port}', "' '"),
                                          ("\\  {port}", "' '")])
def test_a_launch_whose_program_word_is_blank_is_a_usage_error(
        launch: str, first: str, capsys: pytest.CaptureFixture[str]) -> None:
    from flodl_proto.cli import main

    assert main(["conform", "controller", "--launch", launch]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == ("flodl-proto conform controller: error: argument --launch: no program to "
                       f"run (the first word is {first})\n")


@pytest.mark.parametrize("word", ["{port.x}", "{port.__class__}", "{port[0]}", "{port!r}",
                                  "{port:>99999999999}", "x{port:>9}", "{salt:.0}", "{0}", "{}"])
def test_a_placeholder_that_is_not_a_name_alone_is_a_usage_error(
        word: str, capsys: pytest.CaptureFixture[str]) -> None:
    # an attribute was a traceback (AttributeError), a huge width "out of memory" (exit 1), a
    # conversion or an index a program named after the filled value
    from flodl_proto.cli import main

    assert main(["conform", "controller", "--launch", f"prog {word}"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == (f"flodl-proto conform controller: error: argument --launch: bad placeholder "
                       f"in {word!r}: a placeholder is {{name}} alone (no !conversion, :format, "
                       ".attribute or [index])\n")


@pytest.mark.parametrize("launch", ["a\0b {port}", "true \0 {port}", "true {port}\0"])
def test_a_launch_holding_a_nul_is_a_usage_error(launch: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # (only in-process: no command line holds one) every case failed with "target did not
    # start: embedded null byte", exit 1
    from flodl_proto.cli import main

    assert main(["conform", "controller", "--launch", launch, "--timeout-scale", "0.1",
                 "--cases", "controller.session.one-relay-one-round", "--version", "2"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == ("flodl-proto conform controller: error: argument --launch: the command "
                       "holds a NUL character (\\x00), which no program's argument can\n")


def test_literal_braces_and_plain_placeholders_are_filled() -> None:
    from flodl_proto.conform.target import fill_placeholders

    assert fill_placeholders("p a{{b}}{port} {port:} {salt}", {"port": "7", "salt": "ab"}) == [
        "p", "a{b}7", "7", "ab"]


# -- a target that crashes ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_target_that_ended_on_its_own_shows_its_last_output(tmp_path: Path) -> None:
    """A target that started, then crashed: its last lines (a traceback, most often) say why,
    as they do for a target that did not start."""
    from flodl_proto.conform.report import case_line

    body = ("c.recv(4)\n"
            "sys.stderr.write('Traceback (most recent call last):\\n')\n"
            "sys.stderr.write('RuntimeError: broken on purpose\\n'); sys.stderr.flush()\n"
            "os._exit(3)\n")
    r = _play([{"connect": 0}, {"send": {"conn": 0, "magic": "data"}},
               {"expect_exit": "success"}], body, tmp_path)
    assert (r.passed, r.started, r.step) == (False, True, 2)
    assert r.exit is not None and (r.exit.status, r.exit.by_itself) == (3, True)
    lines = case_line(r, "S")
    assert lines[:4] == [
        "FAIL controller.test.hostile v3 [MUST] (S)",
        "     step 2: expected the target to exit with status 0, observed 3",
        "     target: exit 3",
        "     target's last output:"]
    assert lines[4].startswith("       listening on 127.0.0.1:")
    assert lines[5:] == ["       stderr: Traceback (most recent call last):",
                         "       stderr: RuntimeError: broken on purpose"]


@pytest.mark.timeout(60)
def test_a_target_still_ending_after_its_close_is_given_time_to_exit(tmp_path: Path) -> None:
    """A target that closes the connection, then takes 0.2 s to end (a traceback printed as it
    shuts down): the case reports its own exit status and that output, not a SIGTERM the kit
    sent while it was ending."""
    from flodl_proto.conform.report import case_line

    body = ("c.recv(4)\n"
            "c.close()\n"
            "time.sleep(0.2)\n"
            "sys.stderr.write('RuntimeError: crashed on purpose\\n'); sys.stderr.flush()\n"
            "os._exit(1)\n")
    r = _play([{"connect": 0}, {"send": {"conn": 0, "magic": "data"}},
               {"send": {"conn": 0, "hello": {"ranks": [0]}}},
               {"expect": {"conn": 0, "hello_ack": {}}}], body, tmp_path)
    assert (r.passed, r.started, r.step) == (False, True, 3)
    assert r.message == ("connection 0: expected a Control(HelloAck) record (26 bytes), "
                         "observed 0 bytes (end of stream)")
    assert r.exit is not None and (r.exit.status, r.exit.by_itself, r.exit.killed) == \
        (1, True, False)
    lines = case_line(r, "S")
    assert "     target: exit 1" in lines
    assert lines[-3:] == ["     target's last output:", lines[-2],
                          "       stderr: RuntimeError: crashed on purpose"]
    assert lines[-2].startswith("       listening on 127.0.0.1:")


# -- long output lines --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_long_output_lines_are_shown_cut(tmp_path: Path) -> None:
    from flodl_proto.conform.report import case_line

    script = tmp_path / "long.py"
    script.write_text("import sys\n"
                      "for i in range(7):\n"
                      "    sys.stderr.write(str(i) * 10000 + '\\n')\n"
                      "sys.stderr.write('y' * 1000000)\n"  # no end of line
                      "sys.exit(2)\n")
    launch = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{port}}"
    r = play_case(_case([{"connect": 0}]), 3, lambda: LaunchedTarget(launch), SETTINGS)
    assert (r.passed, r.started) == (False, False)
    assert case_line(r, "S")[-5:] == [
        *(f"       stderr: {str(i) * 240} ... (9760 more characters cut)" for i in (3, 4, 5, 6)),
        f"       stderr: {'y' * 240} ... (999760 more characters cut)"]
    assert len(r.output) < 8 * 300


# -- a target announcing a port it does not listen on ---------------------------------------------


@pytest.mark.timeout(60)
def test_a_target_refusing_its_first_connection_did_not_start(tmp_path: Path) -> None:
    from flodl_proto.conform import run_cases, select_cases
    from flodl_proto.conform.report import TargetNeverStarted, case_line

    script = tmp_path / "liar.py"
    script.write_text("import sys, time\n"
                      "print('listening on %s:%s' % (sys.argv[1], sys.argv[2]), flush=True)\n"
                      "time.sleep(30)\n")
    launch = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{host}} {{port}}"
    runs, _ = select_cases(CATALOGUE, role="controller", versions=[3],
                           patterns=["controller.round.*"])
    assert len(runs) > 2
    with pytest.raises(TargetNeverStarted) as info:
        run_cases(runs, lambda: LaunchedTarget(launch), SETTINGS, jobs=1)
    (r,) = info.value.results
    assert (r.passed, r.started, r.step) == (False, False, None)
    assert r.message.startswith("target did not start: the connection to 127.0.0.1:")
    assert r.message.endswith(", where it said it listens, was refused (Connection refused)")
    assert case_line(r, "S")[-1].startswith("       listening on 127.0.0.1:")


@pytest.mark.timeout(60)
def test_a_target_that_announced_its_address_then_failed_to_listen_shows_its_own_exit(
        tmp_path: Path) -> None:
    # it prints its line before it binds, fails to bind and exits 1 a moment later: the kit's
    # first connection is refused while it is ending, and it gets the exit grace, so the case
    # shows its exit status and its error rather than the SIGTERM the kit would have sent
    script = tmp_path / "early.py"
    script.write_text("import sys, time\n"
                      "print('listening on %s:%s' % (sys.argv[1], sys.argv[2]), flush=True)\n"
                      "time.sleep(0.3)\n"
                      "sys.stderr.write('error: bind failed: address in use\\n')\n"
                      "sys.exit(1)\n")
    launch = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{host}} {{port}}"
    r = play_case(_case([{"connect": 0}]), 3, lambda: LaunchedTarget(launch), SETTINGS)
    assert (r.passed, r.started) == (False, False)
    assert r.exit is not None and (r.exit.status, r.exit.by_itself) == (1, True)
    assert r.output.splitlines()[-1] == "stderr: error: bind failed: address in use"


# -- a target that answers wrong, or not at all: how long the kit waits ---------------------------

#: four bytes on every connection, then the connection stays open
_FOUR_BYTES_THEN_SILENCE = """\
c.sendall(bytes.fromhex("d0170df1"))
time.sleep(60)
"""

#: four bytes, a pause, four more, then the connection stays open
_FOUR_BYTES_THEN_FOUR_MORE = """\
c.sendall(bytes.fromhex("d0170df1"))
time.sleep(0.3)
c.sendall(bytes(4))
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_an_expectation_ends_once_the_bytes_that_arrived_differ(tmp_path: Path) -> None:
    # 8 bytes expected, the first 4 arrive and differ: no later byte can make them equal, so
    # the step ends there rather than waiting out its 30 s
    r = _play([{"connect": 0}, {"expect": {"conn": 0, "hex": "f10d17e100000000", "within": 30}}],
              _FOUR_BYTES_THEN_SILENCE, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message == "connection 0: expected 8 bytes, observed 4 bytes (they already differ)"
    assert (r.expected, r.observed, r.offset) == ("f10d17e100000000", "d0170df1", 0)
    # while the bytes that arrived match the start of those expected, it waits for the rest:
    # until they come, or its time is out
    r = _play([{"connect": 0}, {"expect": {"conn": 0, "hex": "d0170df100000000", "within": 0.3}}],
              _FOUR_BYTES_THEN_SILENCE, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message == "connection 0: expected 8 bytes, observed 4 bytes (timed out after 0.3s)"
    assert (r.observed, r.offset) == ("d0170df1", 4)
    r = _play([{"connect": 0}, {"expect": {"conn": 0, "hex": "d0170df100000000", "within": 30}}],
              _FOUR_BYTES_THEN_FOUR_MORE, tmp_path)
    assert r.passed, r.message


@pytest.mark.timeout(60)
def test_the_default_wait_of_a_step_follows_the_timeout_scale(tmp_path: Path) -> None:
    # no within: 5 s x the kit's timeout scale (0.1 here), at least 2 s (the four bytes are
    # allowed: more would end the step at once)
    r = _play([{"connect": 0}, {"expect_close": {"conn": 0, "allow": 4}}],
              _FOUR_BYTES_THEN_SILENCE, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message == ("connection 0: expected the target to close it; still open after 2s "
                         "(4 bytes received)")


def test_the_default_wait_is_five_seconds_times_the_scale_and_at_least_two() -> None:
    from flodl_proto.conform.player import default_within

    assert [default_within(x) for x in (0.1, 0.2, 0.5, 1.0, 3.0)] == [2.0, 2.0, 2.5, 5.0, 15.0]


def test_a_target_that_failed_as_the_kit_stopped_it_shows_its_last_output() -> None:
    """A target that closed its connection as it failed and had not exited yet when the kit
    stopped it gives a failure status to the SIGTERM: its last lines say why, as a crash's do;
    one that exits 0 after SIGTERM, or dies of the signal, shows none."""
    from flodl_proto.conform.report import case_line
    from flodl_proto.conform.target import TargetExit

    case = load_catalogue()[0]
    output = "listening on 127.0.0.1:9\nstderr: error: HMAC verification failed"
    r = CaseResult(case, 2, step=3, message="connection 0: end of stream", started=True,
                   exit=TargetExit(1, by_itself=False), output=output)
    lines = case_line(r, "S")
    assert lines[2:] == ["     target: exit 1 after SIGTERM",
                         "     target's last output:",
                         "       listening on 127.0.0.1:9",
                         "       stderr: error: HMAC verification failed"]
    for stopped in (TargetExit(0, by_itself=False), TargetExit(-15, by_itself=False)):
        lines = case_line(dataclasses.replace(r, exit=stopped), "S")
        assert "     target's last output:" not in lines

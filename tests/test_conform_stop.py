"""The conformance kit's stops: the kit stopped (Ctrl-C, SIGTERM) while a case makes its target
and before the target's process starts (the target is not started, and the kit ends at once),
and the kit's own stop of a passing case's target in the reports."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flodl_proto.conform import load_catalogue
from flodl_proto.conform.player import CaseResult
from flodl_proto.conform.report import case_line, write_json, write_junit
from flodl_proto.conform.target import (
    CaseContext,
    InProcessHandle,
    InProcessTarget,
    LaunchedTarget,
    Target,
    TargetError,
    TargetExit,
)

SALT = bytes(range(16))

#: run in a fresh interpreter: the kit's command line, one case against a target that never
#: listens (a started one makes its case wait the whole 20 s start timeout), with SIGTERM given
#: to the kit by the case's own thread at the hook named by argv[1], once the kit's handler has
#: begun: ``made`` (between make_target() and the target's start) or ``before`` (before the
#: case calls make_target(): the handler's list of targets does not hold it)
_STOP_IN_THE_WINDOW = """
import os, signal, sys, threading, time
import flodl_proto.commands.conform as command
from flodl_proto.cli import main
from flodl_proto.conform import player
from flodl_proto.conform import target as tm

hook, argv = sys.argv[1], sys.argv[2:]
made, stopped_at = [], []
noted = threading.Event()
note_stop = command.note_stop

def noting(signum):  # the kit's handler has begun
    note_stop(signum)
    noted.set()

def stop_now():
    stopped_at.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGTERM)
    assert noted.wait(10)

command.note_stop = noting
start = tm.LaunchedTarget.start
def start_after_a_stop(self, ctx, ready_timeout):
    made.append(self)
    if hook == "made":
        stop_now()
    return start(self, ctx, ready_timeout)
tm.LaunchedTarget.start = start_after_a_stop
free_port = player.free_port
def port_after_a_stop(host):
    if hook == "before":
        stop_now()
    return free_port(host)
player.free_port = port_after_a_stop
code = main(argv)
print(code, [t._proc is not None for t in made], f"{time.monotonic() - stopped_at[0]:.1f}")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hook", ["made", "before"])
def test_a_stop_before_a_target_starts_ends_the_kit_at_once(hook: str, tmp_path: Path) -> None:
    """The kit's handler signals the targets it knows: one made but not started yet got nothing
    (it had no process), then started and its case waited for it to listen, the whole 20 s start
    timeout, before the kit ended; one made after the handler ran was not even in its list. Now
    such a target is not started, and the kit ends at once: ``terminated``, exit 143."""
    code = f"{sys.executable} -c 'import time; time.sleep(60)' {{port}}"
    res = subprocess.run(
        [sys.executable, "-c", _STOP_IN_THE_WINDOW, hook, "conform", "controller", "--version",
         "3", "--jobs", "2", "--cases", "controller.round.zero-mass", "--launch", code,
         "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=100)
    assert res.stderr == "flodl-proto conform controller: terminated\n"
    status, started, seconds = res.stdout.rsplit("\n", 2)[-2].split(" ", 2)
    # made and not started; or, the stop coming before the case's thread made its target, the
    # kit's run returned before that thread reached the start (with --jobs 2 the handler's
    # KeyboardInterrupt ends the main thread's run, which does not wait for it): no target
    # started either way
    assert (status, started) in (("143", "[False]"),
                                 *((("143", "[]"),) if hook == "before" else ())), res.stdout
    assert float(seconds) < 5.0, res.stdout
    doc = (tmp_path / "r.json").read_text()
    assert '"stop": "terminated"' in doc and '"results": []' in doc


def _ctx(tmp_path: Path) -> CaseContext:
    return CaseContext("controller", 3, 1, SALT, tmp_path / "salt", "127.0.0.1", 9, 0, (), 0.1)


@pytest.mark.parametrize("kind", ["launched", "in-process"])
def test_a_target_signalled_before_its_start_is_not_started(kind: str, tmp_path: Path) -> None:
    """A signal before the start was lost (launched: no process to send it to) or failed
    (in-process: an AssertionError); it is a stop now: the start is refused, nothing runs."""
    calls: list[CaseContext] = []

    def starter(ctx: CaseContext) -> InProcessHandle:
        calls.append(ctx)
        raise AssertionError("not to be started")

    t: Target = LaunchedTarget(f"{sys.executable} -c 'import sys; sys.exit(3)'") \
        if kind == "launched" else InProcessTarget(starter)
    t.send_signal(signal.SIGTERM)
    with pytest.raises(TargetError) as e:
        t.start(_ctx(tmp_path), 20.0)
    assert str(e.value) == "the kit stopped the target before it started"
    assert t.stop(1.0) is None  # never started
    assert calls == []


def test_a_stop_while_the_process_starts_on_the_same_thread_reaches_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's handler may run on the thread that is starting the target (``--jobs 1``: the
    main thread), inside ``Popen`` before the process is the target's: the stop is kept, and the
    process gets SIGTERM as soon as it exists, so its start fails at once (it would listen,
    and the case would run on)."""
    import flodl_proto.conform.target as tm

    real = subprocess.Popen
    t = LaunchedTarget(f"{sys.executable} -c 'import time; time.sleep(30)'")

    def popen_then_stop(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = real(*args, **kwargs)  # type: ignore[call-overload]
        t.send_signal(signal.SIGTERM)  # the handler, on this thread, before the assignment
        return proc

    monkeypatch.setattr(tm.subprocess, "Popen", popen_then_stop)
    with pytest.raises(TargetError) as e:
        t.start(_ctx(tmp_path), 20.0)
    assert str(e.value) == "the target exited (-15) before listening"
    ended = t.stop(1.0)
    assert ended is not None and ended.status == -signal.SIGTERM


@pytest.mark.parametrize("stopped", [TargetExit(0, by_itself=False),
                                     TargetExit(-15, by_itself=False),
                                     TargetExit(-9, by_itself=False, killed=True)])
def test_a_passing_case_shows_no_line_of_the_kits_stop_of_its_target(
        stopped: TargetExit, tmp_path: Path) -> None:
    """The kit stops a passing case's target too (SIGTERM, SIGKILL after the bound): the
    console shows the case's PASS line alone and the JUnit report no failure nor output, however
    the target ended; the JSON report keeps how (``exit_status``, ``exited_by_itself``)."""
    case = next(c for c in load_catalogue() if c.id == "controller.round.zero-mass")
    r = CaseResult(case, 3, passed=True, started=True, exit=stopped)
    assert case_line(r, "S") == ["PASS controller.round.zero-mass v3 [MUST] (S)"]
    write_junit(tmp_path / "r.xml", "controller", [r], [], lambda key: key)
    tc = ET.parse(tmp_path / "r.xml").getroot().find("testsuite/testcase")
    assert tc is not None and [e.tag for e in tc] == ["properties"]
    write_json(tmp_path / "r.json", "controller", [r], [], lambda key: key)
    got = json.loads((tmp_path / "r.json").read_text())["results"][0]
    assert (got["result"], got["exit_status"], got["exited_by_itself"]) == (
        "pass", stopped.status, False)


#: run in a fresh interpreter: the kit's command line, ``--jobs 1`` (the main thread starts the
#: targets), SIGTERM given to the kit inside ``Popen`` once the target's process exists (as the
#: kernel may give it while Popen waits for the exec); prints the exit code and whether that
#: process was still running once the kit had ended (then kills it)
_STOP_INSIDE_POPEN = """
import os, signal, subprocess, sys
import flodl_proto.conform.target as tm
from flodl_proto.cli import main

real, pids = subprocess.Popen, []
def popen(*args, **kwargs):
    proc = real(*args, **kwargs)
    pids.append(proc.pid)
    os.kill(os.getpid(), signal.SIGTERM)  # the kit's handler runs here, inside Popen
    return proc
tm.subprocess.Popen = popen
code = main(sys.argv[1:])
try:
    os.kill(pids[0], 0)
    left = True
    os.killpg(pids[0], signal.SIGKILL)
except ProcessLookupError:
    left = False
print(code, len(pids), "left running" if left else "ended")
"""


@pytest.mark.timeout(120)
def test_a_stop_inside_popen_on_the_main_thread_stops_the_process_started(
        tmp_path: Path) -> None:
    """The kit's handler raised KeyboardInterrupt inside ``Popen`` on the thread starting the
    target (``--jobs 1``): Popen was left with its process started, the target had no process
    to stop, and the process (in a session of its own) was left running after the kit ended.
    Now the handler does not raise there: the process gets SIGTERM as soon as it exists, the
    case ends and the kit with it (``terminated``, exit 143), the process stopped."""
    code = f"{sys.executable} -c 'import time; time.sleep(60)' {{port}}"
    res = subprocess.run(
        [sys.executable, "-c", _STOP_INSIDE_POPEN, "conform", "controller", "--version", "3",
         "--jobs", "1", "--cases", "controller.round.zero-mass", "--launch", code,
         "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=100)
    assert res.stderr == "flodl-proto conform controller: terminated\n"
    assert res.stdout.splitlines()[-1] == "143 1 ended", res.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (doc["stop"], doc["results"], len(doc["not_run"])) == ("terminated", [], 1)


#: run in a fresh interpreter: the kit's command line in a process started with SIGINT ignored
#: (a shell's background job), given SIGINT as it starts its first target; prints the exit code
#: and whether SIGINT was still ignored then
_SIGINT_IGNORED = """
import os, signal, sys
import flodl_proto.conform.target as tm
from flodl_proto.cli import main

signal.signal(signal.SIGINT, signal.SIG_IGN)
start, seen = tm.LaunchedTarget.start, []
def start_after_a_ctrl_c(self, ctx, ready_timeout):
    seen.append(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGINT)
    return start(self, ctx, ready_timeout)
tm.LaunchedTarget.start = start_after_a_ctrl_c
code = main(sys.argv[1:])
print(code, seen)
"""


@pytest.mark.timeout(120)
def test_a_kit_started_with_sigint_ignored_keeps_it_ignored(tmp_path: Path) -> None:
    """A command started with SIGINT ignored keeps it ignored from start to exit (a shell's
    background job; the demo and the relay do): the kit set its handler over it, so a SIGINT in
    its first moments was ignored and one once it ran its cases stopped it (exit 130). Now the
    run goes on, and its case passes."""
    launch = (f"{sys.executable} -m flodl_proto controller --listen {{host}}:{{port}} "
              "--world-size {world_size} --salt-file {salt_file} --protocol-version {version} "
              "--no-port-mux")
    res = subprocess.run(
        [sys.executable, "-c", _SIGINT_IGNORED, "conform", "controller", "--version", "3",
         "--jobs", "1", "--timeout-scale", "0.1", "--cases", "controller.round.zero-mass",
         "--launch", launch],
        capture_output=True, text=True, timeout=100)
    assert res.stderr == ""
    assert res.stdout.splitlines()[0] == "PASS controller.round.zero-mass v3 [MUST] (15.5 Zero " \
        "mass and elision (`zero_mass`))", res.stdout
    assert res.stdout.splitlines()[-1] == "0 [True]", res.stdout

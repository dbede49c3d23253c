"""SIGTERM of the commands that promise one line for it (``conform``, ``demo``: ``terminated``,
exit 143), from their start: while the parser and the command's modules load, before the command
installs its own handler (a SIGTERM then ended them by the signal with nothing on stderr), in
subprocesses; the other commands keep SIGTERM's default until they handle it themselves. Ctrl-C of
every command while NumPy and the codec load is one line and exit 130."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from flodl_proto import cli

pytestmark = pytest.mark.timeout(120)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"

#: run in a fresh interpreter: the installed ``flodl-proto`` console script's entry point, with an
#: import hook that sends the signal ``sys.argv[1]`` (``SIGTERM``, ``SIGINT``) to this process
#: when the module ``sys.argv[2]`` is first looked for (as a signal that arrives while it loads;
#: once: an import interrupted so is looked for again); the CLI's own arguments follow
_SIGNAL_AT_IMPORT = """
import importlib.abc, os, signal, sys
from importlib.metadata import entry_points

class Terminate(importlib.abc.MetaPathFinder):
    sent = False

    def find_spec(self, name, path=None, target=None):
        if name == TARGET and not self.sent:
            self.sent = True
            os.kill(os.getpid(), SIGNAL)
        return None

SIGNAL, TARGET = getattr(signal, sys.argv[1]), sys.argv[2]
sys.argv = ["flodl-proto", *sys.argv[3:]]
(ep,) = entry_points(group="console_scripts", name="flodl-proto")
sys.meta_path.insert(0, Terminate())
sys.exit(ep.load()())
"""

_CONFORM = ("conform", "controller", "--version", "2", "--cases", "controller.round.*")


def _conform_args(tmp_path: Path) -> tuple[str, ...]:
    target = tmp_path / "target.py"  # never listens: a case would wait for it
    target.write_text("import time\ntime.sleep(60)\n")
    return (*_CONFORM, "--launch", f"{sys.executable} {target} {{port}}",
            "--json", str(tmp_path / "r.json"))


def _targets_left(tmp_path: Path) -> list[str]:
    """The command lines of the processes still running a target of ``tmp_path``."""
    left = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"{tmp_path}/target.py" in cmdline and "--launch" not in cmdline:
            left.append(cmdline)
    return left


def _report(tmp_path: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((tmp_path / "r.json").read_text())
    return doc


@pytest.mark.parametrize(("module", "prog", "selected"), [
    ("flodl_proto.spec", "flodl-proto conform controller", None),  # while the parser is built
    # after the command line is parsed, while the command's first modules load
    ("flodl_proto.conform.catalogue", "flodl-proto conform controller", False),
    # the first reports written, while the codec loads; and while NumPy's extension loads
    # (under ml_dtypes': interrupted there, it printed a traceback and an ImportError)
    ("flodl_proto.codec", "flodl-proto conform controller", True),
    ("numpy._core.multiarray", "flodl-proto conform controller", True),
])
def test_sigterm_while_conform_loads_is_one_line_and_143(module: str, prog: str,
                                                         selected: bool | None,
                                                         tmp_path: Path) -> None:
    """SIGTERM is no Ctrl-C for the exit code and the line: it said ``interrupted`` and exited
    130; it says ``terminated`` and exits 143 (128 + SIGTERM), as the bench scripts do. The
    report says so too: ``stop`` is ``terminated``, and so is the reason of the cases not run
    (while the codec loaded, after the first reports were written, they said ``the kit was
    interrupted``)."""
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"interrupted": False, "passed": 95}))  # an earlier run's
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGTERM", module,
                          *_conform_args(tmp_path)], capture_output=True, text=True, timeout=90)
    assert (res.returncode, res.stdout, res.stderr) == (143, "", f"{prog}: terminated\n")
    assert _targets_left(tmp_path) == []
    if selected is None:  # the report's path was not known yet
        return
    doc = _report(tmp_path)  # the earlier run's report is gone
    assert (doc["interrupted"], doc["stop"], doc["results"], doc["passed"]) == (
        True, "terminated", [], 0)
    not_run = doc["not_run"]
    assert isinstance(not_run, list) and bool(not_run) is selected
    assert {r["reason"] for r in not_run} <= {"not run: the kit was terminated"}


def _stopped_reports(tmp_path: Path, word: str, selected: bool) -> None:
    """Both reports of :func:`_conform_args` (``r.json``, ``r.xml``) are those of a kit stopped
    by the stop ``word`` before any case ran: no result, the selected cases (when ``selected``:
    the catalogue was loaded) not run for the stop, and the stop named (JSON ``stop``; JUnit
    ``interrupted`` and ``stop`` on every suite, of which there is one)."""
    import xml.etree.ElementTree as ET

    from flodl_proto.conform.catalogue import load_catalogue, select_cases

    runs, skipped = select_cases(load_catalogue(), role="controller", versions=[2],
                                 patterns=["controller.round.*"])
    runs, skipped = (runs, skipped) if selected else ([], [])
    reason = f"not run: the kit was {word}"
    assert _report(tmp_path) == {
        "role": "controller", "interrupted": True, "stop": word, "passed": 0, "failed": 0,
        "must_failed": 0, "results": [],
        "not_selected": [{"id": c.id, "reason": why} for c, why in skipped],
        "not_run": [{"id": c.id, "version": 2, "reason": reason} for c, _ in runs]}
    suites = ET.parse(tmp_path / "r.xml").getroot().findall("testsuite")
    assert suites
    assert all([(p.get("name"), p.get("value")) for p in s.iter("property")][:2]
               == [("interrupted", "true"), ("stop", word)] for s in suites)
    assert [(tc.get("name"), [e.get("message") for e in tc.iter("skipped")])
            for tc in suites[0].iter("testcase")] == [(c.id, [reason]) for c, _ in runs]


@pytest.mark.parametrize(("signame", "word", "code"), [("SIGINT", "interrupted", 130),
                                                        ("SIGTERM", "terminated", 143)])
@pytest.mark.parametrize(("module", "kernels", "selected"), [
    # the cases selected, as the reports' writer loads for the first write
    ("flodl_proto.conform.report", "", True),
    ("xml.etree.ElementTree", "", True),
    # FLODL_PROTO_KERNELS checked, before the command runs: NumPy and the codec load
    ("numpy._core.multiarray", "numpy", False),
], ids=["report-writer", "xml", "kernel-choice"])
def test_a_kit_stopped_once_its_command_line_is_parsed_writes_both_reports(
        module: str, kernels: str, selected: bool, signame: str, word: str, code: int,
        tmp_path: Path) -> None:
    """Stopped once its command line was parsed but before its first reports were written
    (while their writer loaded, or while the kernel choice was checked), the kit wrote no
    report and left an earlier run's: now both say the kit was stopped, no case run."""
    for name in ("r.json", "r.xml"):
        (tmp_path / name).write_text("an earlier run's report")
    env = {**os.environ, "FLODL_PROTO_KERNELS": kernels}
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, signame, module,
                          *_conform_args(tmp_path), "--junit", str(tmp_path / "r.xml")],
                         capture_output=True, text=True, timeout=90, env=env)
    assert (res.returncode, res.stdout, res.stderr) == (
        code, "", f"flodl-proto conform controller: {word}\n")
    _stopped_reports(tmp_path, word, selected)


@pytest.mark.parametrize(("module", "prog"), [
    ("flodl_proto.spec", "flodl-proto demo"),  # while the parser is built
    ("rich", "flodl-proto demo"),  # once parsed, as the demo starts (before its cluster)
    ("numpy._core.multiarray", "flodl-proto demo"),  # NumPy and the codec load
])
def test_sigterm_while_the_demo_loads_is_one_line_and_143(module: str, prog: str) -> None:
    """As for ``conform``: ``terminated`` and exit 143, where it was ``interrupted``, 130."""
    # --bf16: a bf16 run loads what an f32 run does (its roundings need no ml_dtypes)
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGTERM", module, "demo",
                          "--no-progress", "--world-size", "1", "--hosts", "1", "--bf16"],
                         capture_output=True, text=True, timeout=90)
    assert (res.returncode, res.stderr) == (143, f"{prog}: terminated\n")
    assert res.stdout in ("", "session salt: random, not kept (--salt-file PATH keeps it for "
                              "decode --salt-file PATH)\n")  # printed before NumPy loads


_CONTROLLER = ("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX)


@pytest.mark.parametrize("module", [
    "flodl_proto.spec",  # while the parser is built
    "flodl_proto.runner.controller",  # while the controller's modules load
    "numpy._core.multiarray",  # while NumPy loads, signals held: delivered once it has
])
def test_sigterm_before_the_controller_listens_is_its_clean_stop(module: str,
                                                                 tmp_path: Path) -> None:
    """The controller stops cleanly on SIGTERM once it runs (``controller finished: clean
    (stop: signal)``, exit 0); one that arrived earlier, from the start of the command line,
    ended the process by the signal with no line (exit -15). It now stops the same way, before
    any port is bound (no ``listening on`` line)."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGTERM", module,
                          *_CONTROLLER, "--checkpoint-dir", str(tmp_path / "ck")],
                         capture_output=True, text=True, timeout=90, input="")
    assert (res.returncode, res.stdout, res.stderr) == (
        0, "controller finished: clean (stop: signal)\n", "")


def _sigterm_ignored() -> None:
    """In the child before it runs: SIGTERM ignored, SIGINT at its default (the test's own
    process may ignore it, as a background job)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_ignored_sigterm_before_the_controller_listens_stays_ignored() -> None:
    """A controller started with SIGTERM ignored keeps it so, also before it runs: the signal
    sent while its modules load is no stop, and the run goes on to listen."""
    proc = subprocess.Popen([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGTERM",
                             "flodl_proto.runner.controller", *_CONTROLLER],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigterm_ignored)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("listening on 127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out, err) == (0, "controller finished: clean (stop: signal)\n", "")


@pytest.mark.parametrize(("module", "args"), [
    ("flodl_proto.spec", ("relay", "--controller", "127.0.0.1:9", "--ranks", "0",
                          "--world-size", "1", "--salt", SALT_HEX)),
    ("flodl_proto.spec", ("rank", "--relay", "127.0.0.1:9", "--rank", "0", "--world-size", "1",
                          "--salt", SALT_HEX)),
    ("flodl_proto.spec", ("--log-level", "conform", "decode", "-")),  # conform: a level there
    # while NumPy loads, signals held: delivered once it has, to SIGTERM's default
    ("numpy._core.multiarray", ("relay", "--controller", "127.0.0.1:9", "--ranks", "0",
                                "--world-size", "1", "--salt", SALT_HEX)),
    ("numpy._core.multiarray", ("rank", "--relay", "127.0.0.1:9", "--rank", "0",
                                "--world-size", "1", "--salt", SALT_HEX)),
    ("numpy._core.multiarray", ("decode", "-")),
], ids=["relay", "rank", "decode", "relay-numpy", "rank-numpy", "decode-numpy"])
def test_other_commands_keep_sigterm_s_default_until_they_handle_it(
        module: str, args: tuple[str, ...]) -> None:
    """relay stops cleanly on SIGTERM once running, with its own handler; before it, and for
    the other commands but the controller, SIGTERM ends the process as it did (once NumPy and
    the codec have loaded, when it arrives while they load)."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGTERM", module, *args],
                         capture_output=True, text=True, timeout=90, input="")
    assert (res.returncode, res.stdout, res.stderr) == (-signal.SIGTERM, "", "")



@pytest.mark.parametrize("command", ["controller", "relay"])
def test_sighup_ends_the_controller_and_the_relay_by_the_signal(command: str) -> None:
    """The README's exit-code table: a closed terminal's SIGHUP ends ``controller`` and
    ``relay`` by the signal itself, once they run as well (they stop cleanly on SIGTERM and
    Ctrl-C only): no ``finished`` line, no error line."""
    args = {"controller": ("controller", "--listen", "127.0.0.1:0"),
            "relay": ("relay", "--controller", "127.0.0.1:9", "--ranks", "0", "--listen-port",
                      "0")}[command]
    proc = subprocess.Popen([sys.executable, "-m", "flodl_proto", *args, "--world-size", "1",
                             "--salt", SALT_HEX], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # at its default, as under a terminal (a run under nohup ignores it)
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("listening on 127.0.0.1:")
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out, err) == (-signal.SIGHUP, "", "")

def test_a_running_rank_is_ended_by_sigterm_itself_as_the_readme_says() -> None:
    """The exit-code table's 129 row said ``controller``, ``relay`` and ``rank`` all stop
    cleanly on SIGTERM and Ctrl-C; a rank waiting for its relay's handshake reply is ended by
    SIGTERM itself (no line, as the 143 row has it): the row names the controller and the relay
    for SIGTERM, the rank for Ctrl-C only."""
    import socket

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    [row] = [line for line in readme.splitlines() if line.startswith("| 129 |")]
    assert ("`controller` and `relay` stop cleanly on SIGTERM and Ctrl-C only, `rank` ends with "
            "a line on Ctrl-C only (SIGTERM ends it by the signal itself: see 143)") in row
    with socket.create_server(("127.0.0.1", 0)) as relay:  # accepts, never replies
        port = relay.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "flodl_proto", "rank", "--relay",
                                 f"127.0.0.1:{port}", "--rank", "0", "--world-size", "1",
                                 "--salt", SALT_HEX], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = relay.accept()  # the rank runs: it has dialed and sent its handshake
            with conn:
                conn.settimeout(60)
                assert len(conn.recv(64)) > 0
                proc.send_signal(signal.SIGTERM)
                out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert (proc.returncode, out, err) == (-signal.SIGTERM, "", "")


#: every command that imports NumPy and the codec when it runs, with arguments that get it there
#: (the relay and the rank dial nothing before the signal is delivered), and its prefix
_LOADING_NUMPY = {
    "controller": (("controller", "--listen", "127.0.0.1:0", "--world-size", "1",
                    "--salt", SALT_HEX), "flodl-proto controller"),
    "relay": (("relay", "--controller", "127.0.0.1:9", "--ranks", "0", "--world-size", "1",
               "--salt", SALT_HEX, "--listen-port", "0"), "flodl-proto relay"),
    "rank": (("rank", "--relay", "127.0.0.1:9", "--rank", "0", "--world-size", "1",
              "--salt", SALT_HEX), "flodl-proto rank 0"),
    "decode": (("decode", "-"), "flodl-proto decode"),
    # the worked examples of the package's spec checked against the codec
    "docs-check": (("docs", "--check", "--out", "{tmp}/p.md"), "flodl-proto docs"),
    "vectors-check": (("vectors", "check"), "flodl-proto vectors check"),
    "vectors-export": (("vectors", "export", "{tmp}/out"), "flodl-proto vectors export"),
    "conform": ((*_CONFORM, "--launch", "true {port}"), "flodl-proto conform controller"),
    "demo": (("demo", "--no-progress", "--world-size", "1", "--hosts", "1"), "flodl-proto demo"),
}


@pytest.mark.parametrize("module", ["numpy._core.multiarray", "flodl_proto.codec"])
@pytest.mark.parametrize("command", list(_LOADING_NUMPY))
def test_ctrl_c_while_numpy_and_the_codec_load_is_one_line_and_130(
        command: str, module: str, tmp_path: Path) -> None:
    """Interrupted while NumPy's extension loaded (under ml_dtypes', which printed a traceback
    and ``ImportError: numpy._core.multiarray failed to import``, exit 1), or the codec: Ctrl-C
    is held until they have loaded, then ends the command with one line and exit 130."""
    args, prog = _LOADING_NUMPY[command]
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGINT", module, *args],
                         capture_output=True, text=True, timeout=90, input="")
    assert (res.returncode, res.stderr) == (130, f"{prog}: interrupted\n")
    assert res.stdout in ("", "session salt: random, not kept (--salt-file PATH keeps it for "
                              "decode --salt-file PATH)\n")  # the demo's, before NumPy loads


def test_ctrl_c_while_the_kernel_choice_loads_numpy_is_one_line_and_130(tmp_path: Path) -> None:
    """``FLODL_PROTO_KERNELS`` is checked before any command runs, with NumPy and the codec."""
    env = {**os.environ, "FLODL_PROTO_KERNELS": "numpy"}
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGINT",
                          "numpy._core.multiarray", "docs", "--out", str(tmp_path / "p.md")],
                         capture_output=True, text=True, timeout=90, env=env)
    assert (res.returncode, res.stdout, res.stderr) == (130, "", "flodl-proto docs: interrupted\n")


@pytest.mark.parametrize("args", [("docs", "--out", "{tmp}/p.md"),
                                  ("dissector", "--out", "{tmp}/d.lua")], ids=lambda a: a[0])
def test_docs_and_dissector_load_no_numpy(args: tuple[str, ...], tmp_path: Path) -> None:
    """They import neither NumPy nor the codec (nothing for Ctrl-C to interrupt there): the
    signal, sent when NumPy's extension would load, is never sent."""
    env = {k: v for k, v in os.environ.items() if k != "FLODL_PROTO_KERNELS"}
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
    for module in ("numpy._core.multiarray", "flodl_proto.codec"):
        res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGINT", module, *args],
                             capture_output=True, text=True, timeout=90, env=env)
        assert (res.returncode, res.stderr) == (0, "")


#: run in a fresh interpreter: the CLI, saying on stderr when it starts to build its parser
#: (once :func:`flodl_proto.cli.main` has set its handlers)
_SAYS_WHEN_IT_PARSES = """
import os, sys
from flodl_proto import cli

build = cli.build_parser

def says_it_builds():
    os.write(2, b"building the parser\\n")
    return build()

cli.build_parser = says_it_builds
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
def test_sigterm_of_conform_at_any_time_is_one_line_and_143(delay: float,
                                                            tmp_path: Path) -> None:
    """Whenever it arrives (while the modules load, before the kit's handler is set, or while
    the first cases wait for their targets), SIGTERM ends the kit with one line, ``terminated``,
    and exit 143 (it said ``interrupted`` and exited 130, as for a Ctrl-C),
    leaves no target running and, once the command line is parsed, the report says: interrupted.
    """
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"interrupted": False, "passed": 95}))
    p = subprocess.Popen([sys.executable, "-c", _SAYS_WHEN_IT_PARSES, *_conform_args(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        assert p.stderr.readline() == "building the parser\n"
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert err == "flodl-proto conform controller: terminated\n"
    assert "PASS" not in out and "FAIL" not in out
    for _ in range(100):  # the kit signalled its targets; they end at once
        if not _targets_left(tmp_path):
            break
        time.sleep(0.05)
    assert _targets_left(tmp_path) == []
    if (tmp_path / "r.json").read_text() != json.dumps({"interrupted": False, "passed": 95}):
        assert _report(tmp_path)["interrupted"] is True  # once parsed: the report says so


#: run in a fresh interpreter: the installed ``flodl-proto`` console script's entry point, with an
#: import hook that, when the module ``sys.argv[1]`` is first looked for, has a helper process
#: send this process SIGTERM, then, once the SIGTERM is no longer pending here (delivered: its C
#: handler ran), Ctrl-C's SIGINT. Meanwhile this process waits in a read of a pipe made to
#: restart after a signal (``siginterrupt(False)``), so that no Python handler runs until both
#: have arrived, as in the C code of an extension module's import: CPython then runs the
#: handlers in signal-number order, SIGINT's first. The CLI's own arguments follow
_SIGTERM_THEN_CTRL_C_AT_IMPORT = """
import importlib.abc, os, signal, subprocess, sys
from importlib.metadata import entry_points

HELPER = '''
import os, signal, sys

pid, fd = int(sys.argv[1]), int(sys.argv[2])


def pending(signum):
    with open(f"/proc/{pid}/status") as status:
        return any(line.startswith(("SigPnd:", "ShdPnd:"))
                   and int(line.split()[1], 16) >> (signum - 1) & 1 for line in status)


os.kill(pid, signal.SIGTERM)
while pending(signal.SIGTERM):
    pass
os.kill(pid, signal.SIGINT)
while pending(signal.SIGINT):
    pass
os.write(fd, b"x")
'''


class Both(importlib.abc.MetaPathFinder):
    sent = False

    def find_spec(self, name, path=None, target=None):
        if name == TARGET and not self.sent:
            self.sent = True
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.siginterrupt(signum, False)
            r, w = os.pipe()
            helper = subprocess.Popen([sys.executable, "-c", HELPER, str(os.getpid()), str(w)],
                                      pass_fds=(w,))
            os.close(w)
            os.read(r, 1)
            helper.wait()
        return None

TARGET = sys.argv[1]
sys.argv = ["flodl-proto", *sys.argv[2:]]
(ep,) = entry_points(group="console_scripts", name="flodl-proto")
sys.meta_path.insert(0, Both())
sys.exit(ep.load()())
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_sigterm_then_ctrl_c_while_conform_loads_numpy_is_terminated(tmp_path: Path) -> None:
    """A SIGTERM, then a Ctrl-C before NumPy's extension had loaded: the held signals were
    delivered in signal-number order, Ctrl-C's first, and the kit said ``interrupted`` (130)
    for a run stopped by SIGTERM; the first to arrive decides, as once the kit runs."""
    res = subprocess.run([sys.executable, "-c", _SIGTERM_THEN_CTRL_C_AT_IMPORT,
                          "numpy._core.multiarray", *_conform_args(tmp_path)],
                         capture_output=True, text=True, timeout=90)
    assert (res.returncode, res.stdout, res.stderr) == (
        143, "", "flodl-proto conform controller: terminated\n")
    assert _report(tmp_path)["stop"] == "terminated"


#: run in a fresh interpreter: the installed ``flodl-proto`` console script's entry point, sending
#: the signal ``sys.argv[1]`` to this process once its ``main`` has returned (or raised
#: ``SystemExit``: ``--help``, a usage error), when ``sys.argv[2]`` is ``returned``, or from an
#: exit function of the interpreter (registered first: it runs last), when it is ``exiting``; the
#: CLI's own arguments follow
_SIGNAL_AFTER_MAIN = """
import atexit, os, signal, sys
from importlib.metadata import entry_points

SIGNAL, WHEN = getattr(signal, sys.argv[1]), sys.argv[2]
sys.argv = ["flodl-proto", *sys.argv[3:]]
(ep,) = entry_points(group="console_scripts", name="flodl-proto")
if WHEN == "exiting":
    atexit.register(os.kill, os.getpid(), SIGNAL)
try:
    code = ep.load()()
finally:
    if WHEN == "returned":
        os.kill(os.getpid(), SIGNAL)
sys.exit(code)
"""


@pytest.mark.parametrize("when", ["returned", "exiting"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(("args", "code"), [
    (("conform", "--help"), 0),  # argparse's SystemExit, SIGTERM as Ctrl-C until then
    (("demo", "--help"), 0),
    (("docs", "--out", "{tmp}/p.md"), 0),  # main returns its code
    (("decode", "--bogus"), 2),  # a usage error
], ids=["conform-help", "demo-help", "docs", "usage-error"])
def test_a_signal_once_the_run_is_over_keeps_its_exit_code(
        args: tuple[str, ...], code: int, signame: str, when: str, tmp_path: Path) -> None:
    """Once the command line's ``main`` has its exit code (its output written, its previous
    SIGTERM handler put back), Ctrl-C or SIGTERM, while the interpreter exits, ended the
    process by the signal with nothing said (exit 143 or 130 in a shell, or a traceback);
    now the process exits with that code."""
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER_MAIN, signame, when, *args],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "interrupted" not in res.stderr
    if args[-1] == "--help":
        assert res.stdout.startswith(f"usage: flodl-proto {args[0]} ")
        assert res.stderr == ""
    elif code == 2:
        assert res.stderr.endswith("flodl-proto decode: error: unrecognized arguments: --bogus\n")
    else:
        assert (tmp_path / "p.md").read_text()


def test_main_without_an_argv_leaves_the_handlers_as_they_were(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``main()`` run in-process reads ``sys.argv`` and puts the previous handlers back, as with
    an argv; only :func:`flodl_proto.cli.entry` (the console script) sets the handlers that end
    the exiting process with the command's code."""
    monkeypatch.setattr(sys, "argv", ["flodl-proto", "docs", "--out", str(tmp_path / "p.md")])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert cli.main() == 0
    assert (tmp_path / "p.md").read_text()
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_console_script_and_python_m_run_the_entry_point() -> None:
    (ep,) = entry_points(group="console_scripts", name="flodl-proto")
    assert ep.value == "flodl_proto._console:entry"
    text = (Path(cli.__file__).parent / "__main__.py").read_text(encoding="utf-8")
    assert "from ._console import entry\n\nsys.exit(entry())" in text


def test_what_runs_before_the_entry_point_handles_ctrl_c_imports_nothing_else() -> None:
    """The console script imports the package and :mod:`flodl_proto._console` before the entry
    point's Ctrl-C handling runs: a Ctrl-C there is Python's traceback. Those imports pull in no
    other module (``typing``, ``importlib.util`` and ``signal`` took about 10 ms of it)."""
    res = subprocess.run(
        [sys.executable, "-c", "import sys; before = set(sys.modules); "
         "import flodl_proto._console; print(sorted(set(sys.modules) - before))"],
        capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout == "['__future__', 'flodl_proto', 'flodl_proto._console']\n"


@pytest.mark.parametrize("module", ["flodl_proto.cli", "argparse", "logging", "pkgutil"])
@pytest.mark.parametrize(("args", "prog"), [
    (("conform", "--help"), "flodl-proto conform"),
    (("demo", "--world-size", "4"), "flodl-proto demo"),
    (("rank", "--rank", "5"), "flodl-proto rank 5"),
    (("--version",), "flodl-proto"),
], ids=["conform", "demo", "rank", "version"])
def test_ctrl_c_while_the_command_line_module_loads_is_one_line(
        module: str, args: tuple[str, ...], prog: str) -> None:
    """The console script imported :mod:`flodl_proto.cli` itself: a Ctrl-C in that import (the
    first tens of milliseconds of a run) printed a traceback ending in KeyboardInterrupt."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGINT", module, *args],
                         capture_output=True, text=True, timeout=90)
    assert (res.returncode, res.stdout, res.stderr) == (130, "", f"{prog}: interrupted\n")


@pytest.mark.parametrize(("args", "prog"), [
    (("conform", "controller", "--launch", "true {port}"), "flodl-proto conform controller"),
    (("--log-level", "info", "conform", "--log-level", "debug", "relay", "--launch",
      "true {port}"), "flodl-proto conform relay"),
    (("vectors", "check"), "flodl-proto vectors check"),
    (("rank", "--relay", "127.0.0.1:9", "--rank", "07", "--world-size", "8", "--salt", SALT_HEX),
     "flodl-proto rank 7"),
    (("rank", "--rank=3", "--relay", "127.0.0.1:9", "--world-size", "8", "--salt", SALT_HEX),
     "flodl-proto rank 3"),
    (("decode", "-"), "flodl-proto decode"),
    (("demo", "--no-progress"), "flodl-proto demo"),
    (("--version",), "flodl-proto"),
    (("bogus",), "flodl-proto"),  # no such command
], ids=["conform", "conform-levels", "vectors", "rank", "rank=", "decode", "demo", "version",
        "bogus"])
def test_ctrl_c_before_the_command_line_is_parsed_names_the_command(
        args: tuple[str, ...], prog: str) -> None:
    """Interrupted while the parser is built, a command's line names it as once parsed (it
    said ``flodl-proto: interrupted`` then, ``flodl-proto demo: interrupted`` after)."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGINT", "flodl_proto.spec",
                          *args], capture_output=True, text=True, timeout=90, input="")
    assert (res.returncode, res.stdout, res.stderr) == (130, "", f"{prog}: interrupted\n")


#: as :data:`_SIGNAL_AT_IMPORT`, for each module of the comma-separated list ``sys.argv[2]``
_SIGNAL_AT_IMPORTS = _SIGNAL_AT_IMPORT.replace(
    "name == TARGET and not self.sent", "name in TARGET and name not in self.sent").replace(
    "self.sent = True", "self.sent.add(name)").replace(
    "sent = False", "sent: set = set()").replace(
    "sys.argv[1]), sys.argv[2]", "sys.argv[1]), sys.argv[2].split(',')")

#: the demo on one host with one rank, long enough to be signalled while it trains
_DEMO_LONG = ("demo", "--no-progress", "--world-size", "1", "--hosts", "1", "--payload-mib", "0",
              "--rounds", "100000")


def _sighup_default() -> None:
    """A child's SIGHUP at the default whatever pytest runs with: under ``nohup pytest`` the
    children inherited it ignored, the demo rightly kept it so, and the tests' SIGHUP did
    nothing (the demo ran until the test's timeout)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _demo_dirs(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("flodl-demo-"))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_sighup_of_a_running_demo_stops_it_and_removes_its_folder(tmp_path: Path) -> None:
    """A closed terminal (SIGHUP) ended the demo by the signal, leaving its temporary folder
    (empty: the children write their stage traces at their exit); now it stops the cluster as
    for SIGTERM: one line, ``hung up``, exit 129 (128 + SIGHUP: it said ``interrupted`` and
    exited 130, as for a Ctrl-C), no folder and no process left."""
    marker = f"FLODL_DEMO_TEST_{os.getpid()}_{time.monotonic_ns()}"
    env = {**os.environ, "TMPDIR": str(tmp_path), marker: "1", "FLODL_NET_TIMEOUT_SCALE": "1.0"}
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto", *_DEMO_LONG], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_sighup_default)
    try:
        assert p.stdout is not None
        line = ""
        while not line.startswith("relay0 listening on "):  # the cluster runs: signals handled
            line = p.stdout.readline()
            assert line, p.communicate(timeout=60)
        assert _demo_dirs(tmp_path) != []
        p.send_signal(signal.SIGHUP)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 129, err
    assert err.splitlines()[-1].startswith("flodl-proto demo: hung up after "), err
    assert "Traceback" not in out + err
    assert _demo_dirs(tmp_path) == []
    left = []
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if f"{marker}=1".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                left.append(pid)
    assert left == []


@pytest.mark.parametrize("module", ["flodl_proto.spec", "rich", "numpy._core.multiarray"])
def test_sighup_while_the_demo_loads_is_one_line_and_129(module: str, tmp_path: Path) -> None:
    """While the parser is built, as the demo starts, while NumPy loads (held, then delivered;
    its temporary folder made by then is removed): a SIGHUP ended it by the signal, silently
    (then as a Ctrl-C: ``interrupted``, 130)."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, "SIGHUP", module, *_DEMO_LONG],
                         capture_output=True, text=True, timeout=90,
                         env={**os.environ, "TMPDIR": str(tmp_path)},
                         preexec_fn=_sighup_default)
    assert (res.returncode, res.stderr) == (129, "flodl-proto demo: hung up\n")
    assert _demo_dirs(tmp_path) == []


def test_an_ignored_sighup_stays_ignored_by_the_demo(tmp_path: Path) -> None:
    """Under ``nohup`` (SIGHUP ignored when it starts) the demo runs on through SIGHUPs sent
    while NumPy loads and once its cluster runs, and its children ignore it too."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORTS, "SIGHUP",
                          "numpy._core.multiarray,rich.progress", "demo", "--no-progress",
                          "--world-size", "1", "--hosts", "1", "--payload-mib", "0",
                          "--rounds", "2"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)},
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert res.returncode == 0, res.stderr
    assert "interrupted" not in res.stderr
    assert _demo_dirs(tmp_path) == []


@pytest.mark.parametrize(("stops", "outcome"), [
    ([], ("interrupted", 130)),  # Ctrl-C: Python's own handler notes nothing
    ([signal.SIGINT], ("interrupted", 130)),
    ([signal.SIGTERM, signal.SIGINT], ("terminated", 143)),
    ([signal.SIGHUP], ("hung up", 129)),  # was ("interrupted", 130)
    ([signal.SIGHUP, signal.SIGTERM], ("hung up", 129)),
    ([signal.SIGINT, signal.SIGHUP], ("interrupted", 130)),
])
def test_the_first_stop_noted_gives_the_word_and_the_code(
        stops: list[int], outcome: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_STOPS", [])
    for signum in stops:
        cli.note_stop(signum)
    assert cli.stop_outcome() == outcome


@pytest.mark.parametrize("name", ["interrupts_held", "AnyCase", "note_stop", "stop_outcome"])
def test_the_cli_helpers_say_they_have_no_upstream_counterpart(name: str) -> None:
    """As every public function of the package names the upstream source it mirrors or says
    there is none."""
    from flodl_proto import cli

    assert "No upstream counterpart" in (getattr(cli, name).__doc__ or "")


def test_sigterm_as_ctrl_c_stops_as_terminated_within_its_block_only() -> None:
    """In process: within the block SIGTERM is KeyboardInterrupt, noted as ``terminated``; the
    handler before is back after it; a SIGTERM ignored before stays ignored in it."""
    before = signal.getsignal(signal.SIGTERM)
    restore = signal.SIG_DFL if before is None else before
    cli._STOPS.clear()
    try:
        with pytest.raises(KeyboardInterrupt), cli.sigterm_as_ctrl_c():
            signal.raise_signal(signal.SIGTERM)
        assert cli.stop_outcome() == ("terminated", cli.EXIT_TERMINATED)
        assert signal.getsignal(signal.SIGTERM) == before
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with cli.sigterm_as_ctrl_c():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            signal.raise_signal(signal.SIGTERM)  # ignored: nothing happens
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, restore)
        cli._STOPS.clear()

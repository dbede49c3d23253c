"""The command line as a user meets it, in subprocesses: one line per failure and no traceback
(Ctrl-C, a reader that stops early, unusable paths), ``python -m flodl_proto``, the salt file,
``docs`` reading the spec of the checkout it writes into, ``fuzz/run.sh``'s usage errors and a
hand-run cluster as the README describes it."""

from __future__ import annotations

import errno
import io
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import ml_dtypes
import pytest

from flodl_proto.codec import encode_ack, encode_handshake
from flodl_proto.errors import shown, shown_name

from .cli_util import acked_rank
from .cli_util import run_main as _run_main
from .cluster_util import recv_exact
from .conftest import ROOT, closed_port

pytestmark = pytest.mark.timeout(120)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flodl_proto", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _one_error_line(stderr: str, *fragments: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Proc:
    """A CLI subprocess whose stdout and stderr lines arrive on a queue as they are printed."""

    def __init__(self, *args: str) -> None:
        # SIGINT at its default, as in a terminal: a test run started in the background by a
        # shell without job control inherits SIGINT ignored, and Python then never raises
        # KeyboardInterrupt in the child
        self.p = subprocess.Popen([sys.executable, "-m", "flodl_proto", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=_sigint_default)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._pump, args=(name, s), daemon=True)
                        for name, s in (("out", self.p.stdout), ("err", self.p.stderr))]
        for t in self.readers:
            t.start()

    def _pump(self, name: str, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            if name == "err":
                self.err.append(line)
            self.lines.put((name, line.rstrip("\n")))

    def wait_for(self, fragment: str, timeout: float = 60) -> str:
        while True:
            _, line = self.lines.get(timeout=timeout)
            if fragment in line:
                return line

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        rc = self.p.wait(timeout=timeout)
        for t in self.readers:
            t.join(timeout)
        return rc, "".join(self.err)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.finish()


@pytest.fixture
def procs() -> Iterator[list[_Proc]]:
    started: list[_Proc] = []
    yield started
    for p in started:
        p.kill()


# -- item: python -m flodl_proto --------------------------------------------------------------
def test_python_m_flodl_proto_is_the_cli() -> None:
    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("flodl-proto 0.1.0 ")
    res = _cli("vectors", "check")
    assert res.returncode == 0 and res.stdout.splitlines()[0].endswith("_vectors")


# -- item: output piped into a reader that stops early -----------------------------------------
def _closed_reader(*args: str, stdin: bytes | None = None) -> tuple[int, str]:
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the first line (``| head -0``)
    if stdin is not None:
        assert p.stdin is not None
        p.stdin.write(stdin)
        p.stdin.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=90), err


@pytest.mark.parametrize("args", [("vectors", "check"), ("docs", "--out", "-"),
                                  ("decode", "--leg", "mux", "--hex", "-"),
                                  ("demo", "--rounds", "2", "--payload-mib", "0")],
                         ids=["vectors", "docs", "decode", "demo"])
def test_a_reader_that_stops_early_ends_the_command_quietly(args: tuple[str, ...]) -> None:
    stdin = None
    if args[0] == "decode":
        from flodl_proto.codec import (
            MuxRecord,
            RankExit,
            encode_channel_magic,
            encode_mux_record_bytes,
        )
        rec = encode_mux_record_bytes(MuxRecord.control_msg(RankExit(1)), bytes.fromhex(SALT_HEX))
        stdin = (encode_channel_magic() + rec * 2000).hex().encode()
    rc, err = _closed_reader(*args, stdin=stdin)
    assert (rc, err) == (141, "")


def _echo_rounds(conn: socket.socket, rounds: int) -> int:
    """Play a relay of one rank for up to ``rounds`` rounds: its own frame is the consensus.
    Stops early when the rank closes its connection (it left the run); returns the number of
    rounds echoed."""
    for k in range(rounds):
        head = recv_exact(conn, 4)
        if len(head) < 4:
            return k
        frame = recv_exact(conn, int.from_bytes(head, "little"))
        conn.sendall(head + frame)
    return rounds


def test_a_rank_whose_stdout_reader_stops_early_ends_quietly() -> None:
    """``flodl-proto rank ... | head -0``: the first digest line meets a closed pipe; the rank
    ends with 141 and nothing on stderr, as every command does (not a connection failure)."""
    with acked_rank("--rounds", "3") as (p, conn):
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()  # the reader is gone before the first line (it needs a reply)
        # a relay that answers every round the rank plays: the rank leaves once its first line
        # has met the closed pipe (a relay that never answered held it until its read timeout)
        assert _echo_rounds(conn, 3) >= 1
        err = p.stderr.read()
        rc = p.wait(timeout=60)
    assert (rc, err) == (141, "")


@pytest.mark.parametrize(("option", "value", "shown"),
                         [("--payload-mib", "inf", "'inf'"), ("--payload-mib", "nan", "'nan'"),
                          ("--payload-mib", "-1", "'-1'"), ("--interval", "inf", "'inf'"),
                          ("--interval", "nan", "'nan'"), ("--interval", "-1.50", "'-1.50'")])
def test_rank_payload_and_interval_must_be_finite(option: str, value: str, shown: str) -> None:
    res = _cli("rank", "--relay", f"127.0.0.1:{closed_port()}", "--rank", "0",
               "--world-size", "1", "--salt", SALT_HEX, option, value)
    assert res.returncode == 2
    assert res.stderr == (f"flodl-proto rank: error: argument {option}: must be a finite number >= "
                          f"0, got {shown}\n")


@pytest.mark.parametrize(("args", "wire", "ceiling"), [
    (("--payload-mib", "1e12"), 1048576000000001241, 1073741824),
    (("--payload-mib", "1500"), 1572865241, 1073741824),
    (("--payload-mib", "4", "--frame-ceiling", "4194304"), 4195545, 4194304),
])
def test_rank_payload_above_the_frame_ceiling_is_a_usage_error(
        args: tuple[str, ...], wire: int, ceiling: int) -> None:
    # the rank dialled its relay and built a tensor of up to 1e12 MiB before the ceiling or the
    # allocation failed; the frame's length is now known from the options alone
    res = _cli("rank", "--relay", f"127.0.0.1:{closed_port()}", "--rank", "0",
               "--world-size", "1", "--salt", SALT_HEX, *args)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == (f"flodl-proto rank: error: argument --payload-mib: {args[1]!r} makes a "
                          f"{wire}-byte frame, above the frame ceiling {ceiling} "
                          "(--frame-ceiling)\n")


def test_the_synthetic_frame_length_is_the_encoded_frames() -> None:
    from flodl_proto.codec import TensorPayload, encode_round_frame_bytes
    from flodl_proto.codec.round_frame import RoundFrame, RoundKind
    from flodl_proto.commands.rank import synthetic_frame_len, synthetic_tensors

    for mib, bf16 in ((0.0, False), (0.01, False), (0.01, True), (1.0, True)):
        tensors = [TensorPayload.from_array(a.astype(ml_dtypes.bfloat16) if bf16 else a)
                   for a in synthetic_tensors(3, 7, mib)]
        frame = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, tensors), b"s" * 16)
        assert synthetic_frame_len(mib, bf16) == len(frame), (mib, bf16)


def test_rank_payload_too_large_to_allocate_is_one_line() -> None:
    """Within the ceiling but above this process's memory (its address space held to 1 GiB):
    the relay acks; the rank cannot build its 2000 MiB tensor: one line, exit 1."""
    def held() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    with acked_rank("--payload-mib", "2000", "--frame-ceiling", "4294967295",
                     preexec=held) as (p, _):
        out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (1, "")
    assert err == "flodl-proto rank 0: error: cannot allocate the --payload-mib 2000.0 tensor\n"


# -- item: Ctrl-C ------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["before", "after"])
def test_ctrl_c_of_a_rank_retrying_its_connection(procs: list[_Proc], where: str) -> None:
    # --log-level may follow the command too: its DEBUG line below shows it took effect
    command = ["rank", "--relay", f"127.0.0.1:{closed_port()}", "--rank", "0",
               "--world-size", "2", "--salt", SALT_HEX]
    level = ["--log-level", "DEBUG"]
    p = _Proc(*(level + command if where == "before" else command + level))
    procs.append(p)
    p.wait_for("connect attempt 1/")
    p.p.send_signal(signal.SIGINT)
    rc, err = p.finish()
    assert rc == 130
    assert "Traceback" not in err and err.splitlines()[-1] == "flodl-proto rank 0: interrupted"


# -- item: a peer that is not there yet is retried, and stderr says so once ------------------
def test_rank_says_once_it_waits_for_the_relay_then_gives_up(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.runner import _netio

    monkeypatch.setattr(_netio, "connect_attempts", lambda: 3)  # 1 s of retries, not 30
    port = closed_port()
    code, out, err = _run_main(capsys, "rank", "--relay", f"127.0.0.1:{port}", "--rank", "0",
                               "--world-size", "1", "--salt", SALT_HEX)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"flodl-proto rank 0: waiting for the relay: connect to 127.0.0.1:{port} failed: "
        "Connection refused; retrying every 0.5s, giving up after ~1.5s (3 attempts)",
        f"flodl-proto rank 0: error: cpu_reduce: connect to 127.0.0.1:{port} failed after 3 "
        "attempts (~1.5s): Connection refused"]


def test_relay_says_once_it_waits_for_the_controller_then_gives_up(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.runner import _netio

    monkeypatch.setattr(_netio, "connect_attempts", lambda: 3)  # 1 s of retries, not 30
    port, rport = closed_port(), closed_port()
    acked: list[bytes] = []

    def one_rank() -> None:  # once the ranks are in, the relay dials the controller
        for _ in range(600):
            try:
                rank = socket.create_connection(("127.0.0.1", rport), timeout=60)
                break
            except OSError:
                threading.Event().wait(0.05)  # the relay is not listening yet
        with rank:
            rank.sendall(encode_handshake(0, 1))
            acked.append(recv_exact(rank, 8))
            rank.recv(1)  # held open until the relay ends

    t = threading.Thread(target=one_rank, daemon=True)
    t.start()
    code, out, err = _run_main(capsys, "relay", "--controller", f"127.0.0.1:{port}", "--ranks",
                               "0", "--world-size", "1", "--salt", SALT_HEX, "--listen-port",
                               str(rport))
    t.join(60)
    assert (code, acked) == (1, [encode_ack(2)])
    assert out.splitlines()[0] == f"listening on 127.0.0.1:{rport}"
    assert err.splitlines() == [
        f"flodl-proto relay: waiting for the controller: connect to 127.0.0.1:{port} failed: "
        "Connection refused; retrying every 0.5s, giving up after ~1.5s (3 attempts)",
        f"flodl-proto relay: error: relay upstream: connect to 127.0.0.1:{port} failed after "
        "3 attempts (~1.5s): Connection refused"]


def test_ctrl_c_of_a_rank_mid_run(procs: list[_Proc]) -> None:
    """The relay acks and takes the first frame, then stays silent: the rank waits for its
    reply when Ctrl-C arrives."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(60)
    try:
        p = _Proc("rank", "--relay", f"127.0.0.1:{lst.getsockname()[1]}", "--rank", "0",
                  "--world-size", "2", "--salt", SALT_HEX, "--rounds", "3")
        procs.append(p)
        conn, _ = lst.accept()
        with conn:
            conn.settimeout(60)
            recv_exact(conn, 16)  # handshake
            conn.sendall(encode_ack(2))
            n = int.from_bytes(recv_exact(conn, 4), "little")
            assert len(recv_exact(conn, n)) == n  # the rank's first frame: it now awaits a reply
            p.p.send_signal(signal.SIGINT)
            rc, err = p.finish()
    finally:
        lst.close()
    assert rc == 130
    assert "Traceback" not in err and err.strip() == "flodl-proto rank 0: interrupted"


def test_ctrl_c_while_the_demo_computes_its_summary(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The summary runs after the cluster is gone: a KeyboardInterrupt there is one line, 130."""
    from flodl_proto import cli
    from flodl_proto.commands import demo

    def no_cluster(*args: object) -> None:
        return None

    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_drive", no_cluster)
    monkeypatch.setattr(demo, "report", interrupted)
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["demo", "--no-progress", "--rounds", "10"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip() == "flodl-proto demo: interrupted"


def _demo_in_process(monkeypatch: pytest.MonkeyPatch, drive: Any, report: Any) -> int:
    """``cli.main(["demo", ...])`` with ``_drive`` and ``report`` replaced (no cluster), the
    process's SIGINT and SIGTERM handlers put back after it."""
    from flodl_proto import cli
    from flodl_proto.commands import demo

    monkeypatch.setattr(demo, "_drive", drive)
    monkeypatch.setattr(demo, "report", report)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return cli.main(["demo", "--no-progress", "--rounds", "10"])
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_sigterm_while_the_demo_computes_its_summary(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A SIGTERM once the cluster is gone (the demo's own handler put back) was taken as a
    Ctrl-C: ``interrupted``, exit 130; it is ``terminated``, exit 143 (128 + SIGTERM)."""
    def terminated(*args: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises first
        return 0

    assert _demo_in_process(monkeypatch, lambda *args: None, terminated) == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip() == "flodl-proto demo: terminated"


def test_the_first_signal_that_stops_the_demo_decides_its_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """While the cluster runs, SIGTERM then an impatient Ctrl-C: the demo stops for the
    SIGTERM, and says so (``terminated``, exit 143), where every stop said ``interrupted``
    and exited 130."""
    def drive(*args: Any) -> None:
        stop: threading.Event = args[-1]
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(30)

    assert _demo_in_process(monkeypatch, drive, lambda *args: 0) == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == ("flodl-proto demo: terminated after 0 of 10 rounds; the "
                                    "cluster was stopped")


#: run in a fresh interpreter: the installed ``flodl-proto`` console script's entry point, with an
#: import hook that raises KeyboardInterrupt (as Ctrl-C would) when the module ``sys.argv[1]`` is
#: first imported; the CLI's own arguments follow
_INTERRUPTED_IMPORT = """
import importlib.abc, sys
from importlib.metadata import entry_points

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == TARGET:
            raise KeyboardInterrupt
        return None

TARGET = sys.argv[1]
sys.argv = ["flodl-proto", *sys.argv[2:]]
(ep,) = entry_points(group="console_scripts", name="flodl-proto")
sys.meta_path.insert(0, Interrupt())
rc = ep.load()()
print("imported" if TARGET in sys.modules else "never imported", file=sys.stderr)
sys.exit(rc)
"""


@pytest.mark.parametrize(("module", "args", "prog"), [
    ("flodl_proto.spec", ("--help",), "flodl-proto"),  # while the parser is built
    ("flodl_proto.runner.controller",  # while the command's modules are imported
     ("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX),
     "flodl-proto controller"),
    # a rank, f32 or bf16, imports NumPy while Ctrl-C is held (never ml_dtypes: see below)
    ("numpy._core.multiarray", ("rank", "--relay", "127.0.0.1:9", "--rank", "0",
                                "--world-size", "1", "--bf16", "--salt", SALT_HEX),
     "flodl-proto rank 0"),
    ("numpy._core.multiarray", ("rank", "--relay", "127.0.0.1:9", "--rank", "0",
                                "--world-size", "1", "--salt", SALT_HEX), "flodl-proto rank 0"),
])
def test_ctrl_c_while_the_cli_imports_is_one_line(module: str, args: tuple[str, ...],
                                                  prog: str) -> None:
    res = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT, module, *args],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 130, res.stderr
    assert res.stdout == ""
    assert res.stderr.splitlines() == [f"{prog}: interrupted", "never imported"]


#: run in a fresh interpreter: the CLI with the arguments given, then the heavy modules it
#: imported (none expected for help, version and usage errors)
_IMPORTED_BY = """
import sys
from flodl_proto.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = ("numpy", "ml_dtypes", "rich", "numba", "flodl_proto.codec", "flodl_proto.fsm",
         "flodl_proto.reduce", "flodl_proto.runner")
print(code, *sorted(m for m in heavy if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize(("args", "code"), [
    (("--help",), 0),
    (("--version",), 0),
    ((), 2),
    (("controller", "--help"), 0),
    (("demo", "--help"), 0),
    (("relay", "--ranks", "0"), 2),  # argparse: required options missing
    (("controller", "--listen", "nowhere", "--world-size", "1", "--salt", SALT_HEX), 2),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "x", "--world-size", "1",
      "--salt", SALT_HEX), 2),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1"), 2),  # no salt
    (("demo", "--rounds", "0"), 2),
])
def test_help_and_usage_errors_do_not_import_numpy(args: tuple[str, ...], code: int) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLODL_PROTO_KERNELS", "FLODL_SESSION_SALT")}
    res = subprocess.run([sys.executable, "-c", _IMPORTED_BY, *args], capture_output=True,
                         text=True, timeout=90, env=env)
    assert res.stderr.splitlines()[-1] == str(code), res.stderr


def test_a_bf16_rank_never_imports_ml_dtypes() -> None:
    """``rank --bf16`` ships f32 tensors on a bf16 wire: its roundings and widenings are integer
    ops, so ml_dtypes (about a second of CPU to import) is never loaded; it loaded it at start.
    The relay is unreachable: the rank gives up after its (scaled) retries, exit 1."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLODL_PROTO_KERNELS", "FLODL_SESSION_SALT")}
    env["FLODL_NET_TIMEOUT_SCALE"] = "0.1"
    res = subprocess.run([sys.executable, "-c", _IMPORTED_BY, "rank", "--relay", "127.0.0.1:1",
                          "--rank", "0", "--world-size", "1", "--bf16", "--salt", SALT_HEX],
                         capture_output=True, text=True, timeout=90, env=env)
    code, *imported = res.stderr.splitlines()[-1].split()
    assert code == "1", res.stderr
    assert "numpy" in imported and "flodl_proto.runner" in imported
    assert "ml_dtypes" not in imported


# -- item: unusable paths ----------------------------------------------------------------------
def test_docs_out_a_directory_or_an_unwritable_path(tmp_path: Path) -> None:
    res = _cli("docs", "--out", str(tmp_path))
    assert res.returncode == 2
    _one_error_line(res.stderr, f"argument --out: {shown(str(tmp_path))} names a folder (an "
                                "existing one)")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    # a file where a folder of the path should be: the command line's, found before any work
    res = _cli("docs", "--out", str(blocker / "protocol.md"))
    assert res.returncode == 2
    _one_error_line(res.stderr, f"error: argument --out: {shown(str(blocker / 'protocol.md'))}: "
                                f"Not a directory ({shown_name(str(blocker))} is a file, "
                                "not a folder)")
    # one that is no regular file is named for what it is
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    for stand_in, kind in ((fifo, "a FIFO"), (Path("/dev/null"), "a character device")):
        res = _cli("docs", "--out", str(stand_in / "protocol.md"))
        assert res.returncode == 2
        _one_error_line(res.stderr, f"error: argument --out: "
                                    f"{shown(str(stand_in / 'protocol.md'))}: "
                                    f"Not a directory ({shown_name(str(stand_in))} is {kind}, "
                                    "not a folder)")


@pytest.mark.parametrize("cmd", [("docs",), ("conform", "docs")], ids=" ".join)
def test_docs_check_an_unreadable_out_is_exit_2(cmd: tuple[str, ...], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # with --check, PATH is an input: one that cannot be read is a usage error (2), one line
    # naming it and the OS error; a PATH that does not exist is "missing" (a failed check, 1)
    prog = f"flodl-proto {' '.join(cmd)}"
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    out = blocker / "protocol.md"  # refused with the command line, as for a write
    assert _run_main(capsys, *cmd, "--check", "--out", str(out)) == (
        2, "", f"{prog}: error: argument --out: {shown(str(out))}: Not a directory "
        f"({shown_name(str(blocker))} is a file, not a folder)\n")
    assert _run_main(capsys, *cmd, "--check", "--out", str(loop)) == (  # with the command line
        2, "", f"{prog}: error: argument --out: {shown(str(loop))}: Too many levels of symbolic "
        f"links ({shown_name(str(loop))} is a loop of symbolic links)\n")
    assert _run_main(capsys, *cmd, "--check", "--out", str(tmp_path)) == (  # with the command line
        2, "", f"{prog}: error: argument --out: {shown(str(tmp_path))} names a folder (an existing "
        "one); give a file path in it\n")
    code, out_text, err = _run_main(capsys, *cmd, "--check", "--out", str(tmp_path / "none.md"))
    assert (code, out_text) == (1, "")
    assert err.startswith(f"{prog}: error: {shown(str(tmp_path / 'none.md'))}: missing")
    assert err.endswith(f"; run `flodl-proto {' '.join(cmd)} --out {tmp_path / 'none.md'}`\n")
    code, out_text, err = _run_main(capsys, *cmd, "--check", "--out", str(blocker))
    assert (code, out_text) == (1, "") and err.startswith(
        f"{prog}: error: {shown(str(blocker))}: out of date")


def test_checkpoint_dir_that_cannot_be_used(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    # a file where a folder of DIR should be, or DIR itself: in the words of every path option
    for where in (blocker, blocker / "sub"):
        res = _cli("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt",
                   SALT_HEX, "--checkpoint-dir", str(where))
        assert res.returncode == 2 and res.stdout == ""
        _one_error_line(res.stderr, f"argument --checkpoint-dir: {shown(str(where))}: Not a "
                                    f"directory ({shown_name(str(blocker))} is a file, not a "
                                    "folder)")
        assert "listen" not in res.stderr


def test_checkpoint_dir_that_cannot_be_created_is_quoted_as_the_other_path_errors(
        tmp_path: Path) -> None:
    """A folder that cannot be created, or a link to nothing in its place, is named as a file in
    its way is (``'a-file/sub': Not a directory ...``), quoted: it was named as typed
    (``/proc/ck: cannot create it: ...``). A link to nothing, as the folder or a folder above
    it, is named as such with its target, where it read ``exists and is not a directory``."""
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nothing")
    (tmp_path / "rel").symlink_to("gone/ck")
    link = f"a symbolic link to {shown(str(tmp_path / 'nothing'))}, which does not exist"
    for where, why in (("/proc/ck", "cannot create it: No such file or directory"),
                       (str(dangling), f"is {link}"),
                       (str(dangling / "sub"), f"cannot create it: {dangling} is {link}"),
                       (str(tmp_path / "rel"), "is a symbolic link to 'gone/ck', which does not "
                                               "exist")):
        res = _cli("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt",
                   SALT_HEX, "--checkpoint-dir", where)
        assert (res.returncode, res.stdout, res.stderr) == (
            2, "", f"flodl-proto controller: error: argument --checkpoint-dir: {shown(where)}: "
                   f"{why}\n")


@pytest.mark.parametrize(("cmd", "option"), [
    (("docs",), "--out"), (("dissector",), "--out"), (("conform", "docs"), "--out"),
    (("conform", "controller", "--list"), "--junit"), (("conform", "relay", "--list"), "--json"),
    (("vectors", "export"), "DIR"), (("docs",), "--spec"),
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX),
     "--checkpoint-dir")], ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_a_path_option_through_a_loop_of_symbolic_links_is_a_usage_error(
        cmd: tuple[str, ...], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A loop of symbolic links where a folder of the path should be, or as the path itself,
    is refused with the command line (exit 2), in the words of the demo's ``--salt-file``,
    before anything is made: an output path was a write failure (exit 1: ``cannot write
    loop1/x: creating the folder loop1: Too many levels of symbolic links``; ``cannot write
    loop1: ...`` for the file itself, after ``conform``'s cases had run), ``docs --spec`` a
    traceback, and ``--checkpoint-dir`` said ``cannot create it``."""
    monkeypatch.chdir(tmp_path)
    Path("loop1").symlink_to("loop2")
    Path("loop2").symlink_to("loop1")
    prog = "flodl-proto " + " ".join(w for w in cmd[:2] if not w.startswith("-"))
    words = "'{0}': Too many levels of symbolic links ({1} is a loop of symbolic links)"
    for path, loop in (("loop1/x", "loop1"), ("x/../loop2/sub/r", "loop2"), ("loop1", "loop1")):
        argv = (*cmd, path) if option == "DIR" else (*cmd, option, path)
        line = f"{prog}: error: argument {option}: {words.format(path, loop)}\n"
        if cmd[0] == "controller":  # it installs signal handlers: in a process of its own
            res = _cli(*argv)
            assert (res.returncode, res.stdout, res.stderr) == (2, "", line)
        else:
            assert _run_main(capsys, *argv) == (2, "", line)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["loop1", "loop2"]


@pytest.mark.parametrize(("cmd", "option"), [
    (("decode",), "FILE"), (("decode", "--salt-file"), "--salt-file"),
    (("vectors", "check"), "PATH"), (("vectors", "compare"), "DIR"),
    (("vectors", "compare", "."), "--bundled"), (("demo", "--no-progress"), "--salt-file"),
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "1"), "--salt-file"),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1"),
     "--salt-file"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1"), "--salt-file")],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_an_input_path_through_a_loop_of_symbolic_links_is_quoted_as_an_output_path_is(
        cmd: tuple[str, ...], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A path a command reads that is a loop of symbolic links, or has one where a folder of
    it should be, is refused (exit 2) in the words of an output path refused so, the path
    quoted and the loop named, where it read ``argument FILE: loop1: Too many levels of
    symbolic links`` (the path as typed, the loop not named)."""
    monkeypatch.chdir(tmp_path)
    Path("loop1").symlink_to("loop2")
    Path("loop2").symlink_to("loop1")
    monkeypatch.delenv("FLODL_SESSION_SALT", raising=False)
    prog = "flodl-proto " + " ".join(w for w in cmd[:2] if not w.startswith("-"))
    for path in ("loop1", "loop1/x"):
        argv = (*cmd, path) if option.isupper() else (*cmd, option, path)
        if cmd == ("decode", "--salt-file"):
            argv = ("decode", "--salt-file", path, "/dev/null")
        line = (f"{prog}: error: argument {option}: '{path}': Too many levels of symbolic links "
                "(loop1 is a loop of symbolic links)\n")
        if cmd[0] in ("controller", "relay", "rank"):  # signal handlers: a process of its own
            res = _cli(*argv, cwd=tmp_path)
            assert (res.returncode, res.stdout, res.stderr) == (2, "", line)
        else:
            assert _run_main(capsys, *argv) == (2, "", line)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["loop1", "loop2"]


@pytest.mark.parametrize(("cmd", "option"), [(("docs",), "--out"),
                                             (("conform", "controller", "--list"), "--junit")])
def test_an_output_path_through_a_folder_to_be_made_and_back_checks_before_making_it(
        cmd: tuple[str, ...], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``x/../a-file/p.md``: the file in the way was found only once ``x`` was made (exit 1,
    ``x`` left behind); it is found first, with the command line (exit 2), and nothing is
    made."""
    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("x")
    prog = "flodl-proto " + " ".join(cmd[:2])
    assert _run_main(capsys, *cmd, option, "x/../a-file/p.md") == (
        2, "", f"{prog}: error: argument {option}: 'x/../a-file/p.md': Not a directory (a-file "
               "is a file, not a folder)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def _controller_stderr(checkpoint_dir: Path) -> str:
    """The stderr of a controller started with ``--checkpoint-dir checkpoint_dir`` and stopped
    by SIGTERM once it listens (a clean stop: exit 0)."""
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto", "controller", "--listen",
                          "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX,
                          "--checkpoint-dir", str(checkpoint_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("listening on 127.0.0.1:")
        p.terminate()
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    return err


def test_checkpoint_dir_with_an_earlier_run_s_checkpoints_is_a_warning(tmp_path: Path) -> None:
    """A controller started again with the folder of an earlier run overwrote its checkpoints
    without a word: it says at start how many the folder holds (files of another name, and a
    new or empty folder, are not counted)."""
    folder = tmp_path / "ckpt"
    assert _controller_stderr(folder) == ""  # created
    (folder / "notes.txt").write_text("x")
    (folder / "consensus-00001.npz").write_text("x")  # not a name the controller writes
    assert _controller_stderr(folder) == ""
    (folder / "consensus-000000.npz").write_bytes(b"")
    warning = ("flodl-proto controller: warning: --checkpoint-dir {!r}: already holds {} "
               "(consensus-<window>.npz), which this run overwrites as it writes the same "
               "windows\n")
    assert _controller_stderr(folder) == warning.format(str(folder), "1 checkpoint file")
    (folder / "consensus-000001.npz").write_bytes(b"")
    (folder / "consensus-1000000.npz").write_bytes(b"")
    assert _controller_stderr(folder) == warning.format(str(folder), "3 checkpoint files")


# -- item: docs reads the spec of the checkout it writes into ----------------------------------
def test_docs_check_reads_the_spec_of_the_checkout(tmp_path: Path) -> None:
    """As after ``pip install .``: the package's own spec is not the checkout's; editing the
    checkout's spec makes ``docs --check`` there report the document out of date."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "spec", checkout / "spec")
    shutil.copytree(ROOT / "docs", checkout / "docs")
    res = _cli("docs", "--check", cwd=checkout)
    assert res.returncode == 0
    assert res.stdout.strip() == "'docs/protocol.md': up to date (spec: spec/wire.yaml)"
    wire = checkout / "spec" / "wire.yaml"
    text = wire.read_text(encoding="utf-8")
    assert "\ntitle: " in text
    wire.write_text(text.replace("\ntitle: ", "\ntitle: edited ", 1), encoding="utf-8")
    res = _cli("docs", "--check", cwd=checkout)
    assert res.returncode == 1 and res.stdout == ""
    _one_error_line(res.stderr, "flodl-proto docs: error: 'docs/protocol.md': out of date (spec: "
                    "spec/wire.yaml)")
    res = _cli("docs", cwd=checkout)
    assert res.returncode == 0 and "written" in res.stdout
    assert "edited " in (checkout / "docs" / "protocol.md").read_text(encoding="utf-8")
    # the package's spec is untouched, and --spec picks a spec explicitly
    res = _cli("docs", "--check", "--spec", str(ROOT / "spec"), cwd=checkout)
    assert res.returncode == 1


def _checkout_and_another_spec(tmp_path: Path) -> tuple[Path, Path]:
    """``tmp_path/checkout`` (a checkout's ``spec/``) and ``tmp_path/variable``, a spec whose
    title differs (so its document differs), for ``FLODL_PROTO_SPEC_DIR`` to name."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "spec", checkout / "spec")
    variable = tmp_path / "variable"
    shutil.copytree(ROOT / "spec", variable)
    wire = variable / "wire.yaml"
    wire.write_text(wire.read_text(encoding="utf-8").replace("\ntitle: ", "\ntitle: other ", 1),
                    encoding="utf-8")
    return checkout, variable


def test_docs_in_a_checkout_says_it_documents_the_checkouts_spec_not_the_variables(
        tmp_path: Path) -> None:
    """Inside a checkout ``docs`` documents the checkout's spec, as its docstring and the
    README say (``--spec DIR``, then the output's checkout, then the spec the package loads):
    with ``FLODL_PROTO_SPEC_DIR`` naming another spec, the result line read ``(spec:
    spec/wire.yaml)`` alone, as if the variable had been read; it now says whose spec it is
    and how to document the variable's."""
    checkout, variable = _checkout_and_another_spec(tmp_path)
    shutil.copytree(ROOT / "docs", checkout / "docs")
    env = {"FLODL_PROTO_SPEC_DIR": str(variable)}
    note = (f", the checkout's, not FLODL_PROTO_SPEC_DIR's: give --spec {variable} to document "
            "that one")
    res = _cli("docs", "--check", cwd=checkout, env=env)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == f"'docs/protocol.md': up to date (spec: spec/wire.yaml{note})\n"
    doc = checkout / "docs" / "protocol.md"
    doc.write_text("stale\n", encoding="utf-8")
    res = _cli("docs", cwd=checkout, env=env)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (f"'docs/protocol.md': written ({doc.stat().st_size} bytes) (spec: "
                          f"spec/wire.yaml{note})\n")
    assert doc.read_bytes() == (ROOT / "docs" / "protocol.md").read_bytes()
    res = _cli("docs", "--check", "--spec", str(variable), cwd=checkout, env=env)
    assert res.returncode == 1 and res.stdout == ""
    # the spec's path as a line gives a name (quoted when long: by its ends and length)
    _one_error_line(res.stderr, f"flodl-proto docs: error: 'docs/protocol.md': out of date (spec: "
                    f"{shown_name(str(variable / 'wire.yaml'))}); run `flodl-proto docs --out "
                    f"docs/protocol.md --spec {variable}`")
    res = _cli("docs", "--check", cwd=checkout,
               env={"FLODL_PROTO_SPEC_DIR": str(checkout / "spec")})
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == "'docs/protocol.md': up to date (spec: spec/wire.yaml)\n"


def test_docs_to_stdout_in_a_checkout_notes_whose_spec_it_is_on_stderr(tmp_path: Path) -> None:
    """``docs --out -`` in a checkout with ``FLODL_PROTO_SPEC_DIR`` naming another spec printed
    the checkout's document and said nothing of the spec it passed over (the note is on the
    result line, which stdout has none of); the note now goes to stderr, stdout holding the
    document alone. Without the variable stderr stays empty; a file's result line keeps it."""
    checkout, variable = _checkout_and_another_spec(tmp_path)
    env = {"FLODL_PROTO_SPEC_DIR": str(variable)}
    document = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    res = _cli("docs", "--out", "-", cwd=checkout, env=env)
    assert (res.returncode, res.stdout) == (0, document)
    assert res.stderr == ("flodl-proto docs: note: written to stdout (spec: spec/wire.yaml, the "
                          f"checkout's, not FLODL_PROTO_SPEC_DIR's: give --spec {variable} to "
                          "document that one)\n")
    res = _cli("docs", "--out", "-", cwd=checkout)
    assert (res.returncode, res.stdout, res.stderr) == (0, document, "")
    res = _cli("docs", "--out", "p.md", cwd=checkout, env=env)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (f"'p.md': written ({len(document.encode())} bytes) (spec: "
                          f"spec/wire.yaml, the checkout's, not FLODL_PROTO_SPEC_DIR's: give "
                          f"--spec {variable} to document that one)\n")


# -- item: fuzz/run.sh -------------------------------------------------------------------------
def _fuzz(*args: str, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def _pasted(path: Path | str) -> str:
    """``path`` as ``fuzz/run.sh`` names a path to paste back into a shell: as is when every
    character is one a shell takes literally, else in single quotes (printable ASCII without a
    quote, as the tests' paths are)."""
    text = str(path)
    return text if re.fullmatch(r"[A-Za-z0-9_./:@%+,=-]+", text) else f"'{text}'"


def _stopped_fuzz_run(args: list[str], env: dict[str, str], *,
                      started: Callable[[subprocess.Popen[str]], bool],
                      stop: Callable[[subprocess.Popen[str]], None], not_started: str,
                      timeout: float, word: str = "interrupted") -> tuple[int, str, str, float]:
    """Run ``fuzz/run.sh ARGS`` in a session of its own, poll ``started`` (up to 60 s, failing
    with ``not_started``), then ``stop`` it and wait ``timeout`` s for it to end; a run still
    going then is killed, its whole group. Asserts the run ended as a stopped run does (exit
    130 and ``fuzz/run.sh: interrupted`` last on stderr, or, for the ``word`` ``terminated``,
    143 and ``fuzz/run.sh: terminated``). Returns the script's process id (its
    session's id), stdout, stderr and the seconds from ``stop`` to the end."""
    import time

    proc = subprocess.Popen(["bash", str(ROOT / "fuzz" / "run.sh"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 60
        while not started(proc):
            assert time.monotonic() < deadline, not_started
            time.sleep(0.1)
        sent = time.monotonic()
        stop(proc)
        out, err = proc.communicate(timeout=timeout)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == {"interrupted": 130, "terminated": 143}[word], err
    assert err.splitlines()[-1] == f"fuzz/run.sh: {word}"
    return proc.pid, out, err, took


@pytest.mark.parametrize("args", [("round_frame", "abc"), ("all", "1.5"), ("all", "0"),
                                  ("round_frame", "")])
def test_fuzz_duration_must_be_whole_seconds(args: tuple[str, ...]) -> None:
    res = _fuzz(*args)
    assert res.returncode == 2 and res.stdout == ""
    _one_error_line(res.stderr, "fuzz/run.sh: SECONDS must be")


@pytest.mark.parametrize("args", [("nosuch", "5"), ("replay", "nosuch", "x.bin"),
                                  ("minimize", "nosuch", "x.bin")])
def test_fuzz_unknown_target_is_one_prefixed_line(args: tuple[str, ...]) -> None:
    res = _fuzz(*args)
    assert res.returncode == 2 and res.stdout == ""
    _one_error_line(res.stderr, "fuzz/run.sh: unknown target nosuch; targets: handshake ")


@pytest.mark.parametrize(("args", "line"), [
    (("hand\nshake", "5"), "fuzz/run.sh: unknown target $'hand\\nshake'; targets: handshake "),
    (("replay", "x\x1b[2J", "x.bin"),
     "fuzz/run.sh: unknown target $'x\\E[2J'; targets: handshake "),
    (("handshake", "5\n"), "fuzz/run.sh: SECONDS must be a whole number of seconds, got $'5\\n'"),
    (("handshake", "9" * 200), f"fuzz/run.sh: SECONDS must be at most 999999999, got "
                               f"'{'9' * 40}...{'9' * 20}' (200 characters)"),
    (("minimize", "handshake", "no\nsuch.bin"),
     "fuzz/run.sh: minimize: cannot read $'no\\nsuch.bin': No such file or directory"),
])
def test_fuzz_a_value_with_a_line_break_stays_on_one_line(args: tuple[str, ...],
                                                          line: str) -> None:
    # a target or file name with a line break or an escape printed raw (two lines, or a
    # terminal escape); a long SECONDS printed whole
    res = _fuzz(*args)
    assert res.returncode == 2 and res.stdout == ""
    _one_error_line(res.stderr, line)


@pytest.mark.parametrize(("args", "env", "line"), [
    (("ab\u202ecd", "5"), {},
     "fuzz/run.sh: unknown target $'ab\\342\\200\\256cd'; targets: handshake "),
    (("replay", "x\u200b", "x.bin"), {},
     "fuzz/run.sh: unknown target $'x\\342\\200\\213'; targets: "),
    (("handshake", "5\u2066"), {},
     "fuzz/run.sh: SECONDS must be a whole number of seconds, got $'5\\342\\201\\246'"),
    (("handshake", "\uff15"), {},
     "fuzz/run.sh: SECONDS must be a whole number of seconds, got $'\\357\\274\\225'"),
    (("all", "1"), {"FLODL_FUZZ_JOBS": "1\u202e"},
     "fuzz/run.sh: FLODL_FUZZ_JOBS must be a whole number >= 1, got $'1\\342\\200\\256'"),
    (("ci",), {"FLODL_FUZZ_CI_RUNS": "\u200b"},
     "fuzz/run.sh: FLODL_FUZZ_CI_RUNS must be a whole number >= 1, got $'\\342\\200\\213'"),
    (("replay", "control", "a\u202eb\nc"), {},
     "fuzz/run.sh: replay: cannot read $'a\\342\\200\\256b\\nc': No such file or directory"),
    (("handshake", "\u00e9" * 90), {},
     "fuzz/run.sh: SECONDS must be a whole number of seconds, got $'" + "\\303\\251" * 40 + "..."
     + "\\303\\251" * 20 + "' (90 characters)"),
])
def test_fuzz_a_value_not_plain_ascii_is_shell_quoted(args: tuple[str, ...], env: dict[str, str],
                                                      line: str) -> None:
    # in a UTF-8 locale [:print:] passes a bidi override (U+202E), a zero-width space or an
    # isolate: they were echoed raw and reordered or hid the rest of the line
    res = _fuzz(*args, env={"LC_ALL": "C.UTF-8", **env})
    assert res.returncode == 2 and res.stdout == ""
    _one_error_line(res.stderr, line)
    assert res.stderr.isascii()


@pytest.mark.parametrize(("args", "line"), [
    (("ci", "extra"), "ci takes no arguments, got 1 argument"),
    (("list", "extra", "more"), "list takes no arguments, got 2 arguments"),
])
def test_fuzz_ci_and_list_take_no_argument(args: tuple[str, ...], line: str) -> None:
    # an extra argument was ignored: `ci extra` started the whole ci run
    res = _fuzz(*args)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", f"fuzz/run.sh: {line}; see {_pasted(ROOT / 'fuzz' / 'run.sh')} --help\n")


_TARGETS = ("handshake channel_magic round_frame control mux_record len_framed stream_round_frame "
            "stream_len_framed mux_stream loopback_stream decode_stream host_fold controller_core "
            "relay_core")


@pytest.mark.parametrize(("args", "line"), [
    ((), "no mode given (a target, all, ci, minimize, replay or list)"),
    (("all",), "all takes SECONDS, got 0 arguments"),
    (("all", "5", "6"), "all takes SECONDS, got 2 arguments"),
    (("minimize", "handshake"), "minimize takes TARGET FILE, got 1 argument"),
    (("replay", "handshake"), "replay takes TARGET FILE..., got 1 argument"),
    (("handshake",), "handshake takes SECONDS, got 0 arguments"),
    (("handshake", "5", "6"), "handshake takes SECONDS, got 2 arguments"),
    (("nosuch",), "unknown mode or target nosuch; modes: all ci minimize replay list; targets: "
                  + _TARGETS),
    (("a\nb", "5", "6"), "unknown mode or target $'a\\nb'; modes: all ci minimize replay list; "
                         "targets: " + _TARGETS),
    (("-x",), "unknown option -x"),
    (("--verbose", "all", "5"), "unknown option --verbose"),
    (("-x", "5"), "unknown option -x"),
], ids=["nothing", "all-none", "all-two", "minimize", "replay", "target-none", "target-two",
        "unknown", "unknown-line-break", "option", "option-first", "option-and-seconds"])
def test_fuzz_usage_error_is_one_line_naming_what_is_wrong(args: tuple[str, ...],
                                                          line: str) -> None:
    """A command line the script does not take printed the whole help text (over 30 lines, on
    stdout), whatever was wrong: one line on stderr now, saying what, and where the help is."""
    res = _fuzz(*args)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", f"fuzz/run.sh: {line}; see {_pasted(ROOT / 'fuzz' / 'run.sh')} --help\n")


@pytest.mark.parametrize(("run", "where", "named"), [
    (["bash", "run.sh"], "fuzz", "run.sh"),
    (["./run.sh"], "fuzz", "./run.sh"),
    (["bash", "{root}/fuzz/run.sh"], "elsewhere", "{root}/fuzz/run.sh"),
    (["bash", "my fuzz/run.sh"], "elsewhere", "my fuzz/run.sh"),  # a link to fuzz/: quoted
], ids=["bash-in-fuzz", "dot-slash", "absolute", "with-a-space"])
def test_fuzz_usage_error_hint_names_the_script_as_it_was_run(run: list[str], where: str,
                                                               named: str,
                                                               tmp_path: Path) -> None:
    """The hint said ``see fuzz/run.sh --help`` whatever path the script was run by (a command
    that does not run from ``fuzz/``); it names the script as it was run, quoted to be pasted
    back. The prefix stays the script's name."""
    (tmp_path / "my fuzz").symlink_to(ROOT / "fuzz")
    cwd = {"fuzz": ROOT / "fuzz", "elsewhere": tmp_path}[where]
    argv = [a.replace("{root}", str(ROOT)) for a in run]
    res = subprocess.run([*argv, "-x"], capture_output=True, text=True, timeout=60, cwd=cwd,
                         env={**os.environ, "PYTHON": sys.executable})
    hint = _pasted(named.replace("{root}", str(ROOT)))
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", f"fuzz/run.sh: unknown option -x; see {hint} --help\n")


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_fuzz_help_is_the_help_text_and_exit_0(flag: str) -> None:
    """``-h`` was read as an unknown target without SECONDS: the help text, exit 2."""
    res = _fuzz(flag)
    assert (res.returncode, res.stderr) == (0, "")
    lines = res.stdout.splitlines()
    assert lines[0] == ("Fuzz flodl-proto's parsers and state machines with atheris (see "
                        "fuzz/README.md).")
    assert "  fuzz/run.sh -h | --help         this text (exit 0)" in lines
    assert lines[-1] == ("fuzz/corpus/TARGET is only read); findings go to "
                         "$FLODL_FUZZ_WORK/findings/TARGET.")


def test_fuzz_without_atheris_says_to_install_the_extra(tmp_path: Path) -> None:
    shadow = tmp_path / "atheris"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('atheris hidden for this test')\n")
    res = _fuzz("round_frame", "5", env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 2 and res.stdout == ""
    _one_error_line(res.stderr, "atheris is not installed", "pip install -e '.[fuzz]'")
    assert "FINDING" not in res.stderr


def test_fuzz_replay_reads_files_from_the_callers_folder(tmp_path: Path) -> None:
    # a missing FILE was a Python traceback; a relative one was looked up in the checkout
    seed = next((ROOT / "fuzz" / "corpus" / "control").iterdir())
    (tmp_path / "seed.bin").write_bytes(seed.read_bytes())
    res = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), "replay", "control", "seed.bin"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHON": sys.executable})
    assert (res.returncode, res.stdout, res.stderr) == (0, "seed.bin: ok\n", "")
    res = _fuzz("replay", "control", str(tmp_path / "seed.bin"), str(tmp_path / "missing.bin"))
    assert (res.returncode, res.stdout) == (2, "")  # nothing is run before every file is read
    _one_error_line(res.stderr, f"fuzz/run.sh: replay: cannot read "
                    f"{_pasted(tmp_path / 'missing.bin')}: No such file or directory")


def test_fuzz_usage_and_minimize_name_files_from_the_callers_folder(tmp_path: Path) -> None:
    """Called by a relative path from another folder, the usage text was "sed: can't read
    x/fuzz/run.sh"; minimize looked a relative FILE up in the checkout (libFuzzer's "required
    directory does not exist", exit 1)."""
    rel = os.path.relpath(ROOT / "fuzz" / "run.sh", tmp_path)
    env = {**os.environ, "PYTHON": sys.executable}
    res = subprocess.run(["bash", rel, "--help"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=env)
    assert res.returncode == 0 and res.stderr == ""
    assert "fuzz/run.sh minimize TARGET FILE" in res.stdout
    res = subprocess.run(["bash", rel, "minimize", "handshake", "missing.bin"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, "fuzz/run.sh: minimize: cannot read missing.bin: No such file or "
                                "directory")


_LONG_NAME = "n" * 60 + "-" * 39 + ".bin"  # 103 characters


@pytest.mark.parametrize("mode", ["replay", "minimize"])
@pytest.mark.parametrize(("name", "shown"), [
    ("missing.bin", "missing.bin"),
    (_LONG_NAME, _LONG_NAME),
    ("a b.bin", "'a b.bin'"),
    ("a\nb", "$'a\\nb'"),
    ("it's\\\t\x1b\x7f\x01\u202e", "$'it\\'s\\\\\\t\\E\\177\\001\\342\\200\\256'"),
], ids=["plain", "long", "space", "line-break", "escapes"])
def test_fuzz_replay_and_minimize_say_a_missing_file_alike(mode: str, name: str, shown: str,
                                                          tmp_path: Path) -> None:
    """Both modes name a file whole, as a shell reads it back (in single quotes, or bash's
    ``printf %q`` in the C locale for a name that is not printable ASCII), and say why it cannot
    be read in the system's words. replay (its Python part) showed a line break, a tab or an
    escape as octal (``$'a\\012b'``); minimize said ``no such file``; both showed a name of more
    than 80 characters by its ends and length, which could not be copied back."""
    res = _fuzz(mode, "control", name, env={"LC_ALL": "C.UTF-8"}, cwd=tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", f"fuzz/run.sh: {mode}: cannot read {shown}: No such file or directory\n")


@pytest.mark.parametrize("mode", ["replay", "minimize"])
def test_fuzz_replay_and_minimize_say_a_folder_alike(mode: str, tmp_path: Path) -> None:
    """minimize said ``a folder``, replay ``Is a directory``."""
    (tmp_path / "a\tdir").mkdir()
    res = _fuzz(mode, "control", "a\tdir", cwd=tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", "fuzz/run.sh: " + mode + ": cannot read $'a\\tdir': Is a directory\n")


def test_fuzz_replay_names_each_file_as_the_script_does(tmp_path: Path) -> None:
    """Each ``ok`` line names its file whole (a long name too), a line break as ``$'a\\nb'``
    (it showed it as ``\\012``)."""
    seed = next((ROOT / "fuzz" / "corpus" / "control").iterdir()).read_bytes()
    for name in (_LONG_NAME, "a\nb", "plain.bin"):
        (tmp_path / name).write_bytes(seed)
    res = _fuzz("replay", "control", _LONG_NAME, "a\nb", "plain.bin", cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (f"{_LONG_NAME}: ok\n"
                          "$'a\\nb': ok\n"
                          "plain.bin: ok\n")


def test_fuzz_replay_without_a_dependency_says_what_to_install(tmp_path: Path) -> None:
    """Without NumPy (here a stand-in package whose import fails as a missing one's does) replay
    printed the ``ModuleNotFoundError`` traceback of the harness's import, exit 1 as a finding;
    now one line naming the module and the README's install line, exit 2 as minimize without
    atheris, before any input is read or run."""
    stub = tmp_path / "stub" / "numpy"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    seed = next((ROOT / "fuzz" / "corpus" / "control").iterdir())
    res = _fuzz("replay", "control", str(seed), str(tmp_path / "missing.bin"),
                env={"PYTHONPATH": str(tmp_path / "stub")})
    assert (res.returncode, res.stdout, res.stderr) == (2, "", (
        f"fuzz/run.sh: replay: numpy is not installed for {sys.executable}: install the package "
        "with its extras (pip install -e '.[test,fuzz]')\n"))


def test_fuzz_replay_without_a_dependency_quotes_the_interpreter(tmp_path: Path) -> None:
    """The interpreter was named as it is, as ``atheris is not installed`` named it: a path with
    a space could not be pasted back."""
    stub = tmp_path / "stub" / "numpy"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    python = tmp_path / "py thon"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    seed = next((ROOT / "fuzz" / "corpus" / "control").iterdir())
    res = _fuzz("replay", "control", str(seed),
                env={"PYTHON": str(python), "PYTHONPATH": str(tmp_path / "stub")})
    assert (res.returncode, res.stdout, res.stderr) == (2, "", (
        f"fuzz/run.sh: replay: numpy is not installed for '{python}': install the package "
        "with its extras (pip install -e '.[test,fuzz]')\n"))


#: a ``sitecustomize`` that makes the handshake harness run ``{action}`` on an input holding
#: ``{trigger}``, as a harness does on a finding (the committed corpus holds none that still
#: fails), wherever the harness is imported: replay's ``importlib.import_module`` and the
#: driver's
_STAND_IN = """import importlib

_import_module = importlib.import_module


def _import_with_a_finding(name, package=None):
    module = _import_module(name, package)
    if name == "fuzz.harnesses.handshake" and not hasattr(module, "real_test_one_input"):
        module.real_test_one_input = module.test_one_input

        def test_one_input(data):
            if {trigger!r} in data:
                {action}
            module.real_test_one_input(data)

        module.test_one_input = test_one_input
    return module


importlib.import_module = _import_with_a_finding
"""
#: an input holding ``FINDING`` raises
_STAND_IN_FINDING = _STAND_IN.format(trigger=b"FINDING",
                                     action='raise RuntimeError("stand-in finding")')


def _stand_in_site(tmp_path: Path, text: str) -> dict[str, str]:
    """The environment for ``fuzz/run.sh`` whose ``sitecustomize`` is ``text``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(text)
    return {"PYTHONPATH": str(site)}


def _stand_in_finding(tmp_path: Path) -> dict[str, str]:
    """The environment for ``fuzz/run.sh`` under which an input holding ``FINDING`` is a
    finding of the handshake harness (:data:`_STAND_IN_FINDING`)."""
    return _stand_in_site(tmp_path, _STAND_IN_FINDING)


def test_fuzz_replay_names_the_file_of_a_finding(tmp_path: Path) -> None:
    """A finding's traceback did not say which FILE raised it (the ``ok`` lines of the files
    before it were the only hint): a line naming it, as the script names a file, comes first."""
    seed = next((ROOT / "fuzz" / "corpus" / "handshake").iterdir()).read_bytes()
    (tmp_path / "good.bin").write_bytes(seed)
    (tmp_path / "a b\n.bin").write_bytes(seed + b"FINDING")
    (tmp_path / "later.bin").write_bytes(seed)
    res = _fuzz("replay", "handshake", "good.bin", "a b\n.bin", "later.bin", cwd=tmp_path,
                env=_stand_in_finding(tmp_path))
    assert (res.returncode, res.stdout) == (1, "good.bin: ok\n")
    lines = res.stderr.splitlines()
    assert lines[0] == "fuzz/run.sh: replay: $'a b\\n.bin': finding: the handshake harness raised"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: stand-in finding"


def test_fuzz_replay_names_a_long_finding_path_whole(tmp_path: Path) -> None:
    """A finding's path of more than 80 characters (a libFuzzer crash file under a findings
    folder) is named whole in the finding line and the ``ok`` lines, as a shell reads it back:
    it was shortened (``.../findings/round_f...1b8fafba26c4b191913a (91 characters)``), so
    the line could not be copied into the replay command again."""
    seed = next((ROOT / "fuzz" / "corpus" / "handshake").iterdir()).read_bytes()
    folder = tmp_path / "work dir" / "findings" / "handshake"
    folder.mkdir(parents=True)
    good, crash = folder / ("seed-" + "0" * 40), folder / ("crash-" + "1b8fafba26c4b191913a" * 2)
    good.write_bytes(seed)
    crash.write_bytes(seed + b"FINDING")
    assert len(str(crash)) > 80
    res = _fuzz("replay", "handshake", str(good), str(crash), env=_stand_in_finding(tmp_path))
    assert (res.returncode, res.stdout) == (1, f"'{good}': ok\n")
    line = res.stderr.splitlines()[0]
    assert line == f"fuzz/run.sh: replay: '{crash}': finding: the handshake harness raised"
    printed = line.removeprefix("fuzz/run.sh: replay: ").removesuffix(": finding: the handshake "
                                                                         "harness raised")
    assert shlex.split(printed) == [str(crash)]


def _stand_in_python(tmp_path: Path) -> str:
    """An interpreter for ``fuzz/run.sh`` (``PYTHON``) whose ``fuzz/driver.py`` finds something
    at once, without atheris: a fuzzing run exits 1 having written ``crash-0`` (as libFuzzer
    says it, in its log), a minimize writes the input's first 3 bytes as the minimized input.
    Everything else (atheris' check: there; the targets, replay) is run by this interpreter."""
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
if [ "$1" = fuzz/driver.py ]; then
  prefix= out= last=
  for a; do
    case "$a" in
      -artifact_prefix=*) prefix=${{a#-artifact_prefix=}} ;;
      -exact_artifact_path=*) out=${{a#-exact_artifact_path=}} ;;
    esac
    last=$a
  done
  if [ -n "$out" ]; then head -c 3 "$last" > "$out"; exit 0; fi
  echo "Test unit written to ${{prefix}}crash-0"; exit 1
fi
case "$2" in 'import atheris') exit 0 ;; esac
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return str(python)


@pytest.mark.parametrize(("folder", "pasted"), [
    ("work dir", "'{}'"),
    ("it's", "{}"),
], ids=["space", "quote"])
def test_fuzz_work_folder_paths_are_printed_as_a_shell_reads_them(folder: str, pasted: str,
                                                                 tmp_path: Path) -> None:
    """The logs and findings a run names were printed as they are: a work folder with a space
    or a quote in its name could not be pasted into a shell. They are quoted now (single
    quotes; ``printf %q`` for a name with a quote, as the script quotes any name)."""
    work = tmp_path / folder

    def shown(path: Path) -> str:
        text = str(path)
        return pasted.format(text.replace("'", "\\'") if "'" in text else text)

    env = {"PYTHON": _stand_in_python(tmp_path), "FLODL_FUZZ_WORK": str(work)}
    res = _fuzz("all", "1", env=env)
    assert res.returncode == 1, res.stderr
    crash = shown(work / "findings" / "handshake" / "crash-0")
    assert res.stdout.splitlines()[0].endswith(f" FINDING (exit 1, {crash})"), res.stdout
    lines = res.stderr.splitlines()
    log = shown(work / "logs" / "handshake.log")
    assert lines[0] == f"fuzz/run.sh: handshake: last lines of {log}:"
    assert lines[-1] == f"fuzz/run.sh: findings (see {shown(work / 'findings')})"
    res = _fuzz("ci", env=env)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines()[-1] == (
        f"fuzz/run.sh: ci: findings in {shown(work / 'findings' / 'ci')}")


def test_fuzz_default_work_folder_is_named_by_absolute_path(tmp_path: Path) -> None:
    """With the default work folder (``fuzz/.work`` of the checkout) the findings and logs a run
    names were relative to the checkout (``fuzz/.work/logs/handshake.log``): from the caller's
    folder they named nothing. They are named by absolute path, quoted as any path the script
    prints. (A copy of the script in a folder of its own: the run writes into its checkout.)"""
    tree = tmp_path / "check out"
    (tree / "fuzz").mkdir(parents=True)
    for name in ("run.sh", "__init__.py"):
        shutil.copy(ROOT / "fuzz" / name, tree / "fuzz" / name)
    (tree / "fuzz" / "harnesses").symlink_to(ROOT / "fuzz" / "harnesses")
    caller = tmp_path / "caller"
    caller.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLODL_FUZZ_WORK"}
    res = subprocess.run(["bash", os.path.join("..", "check out", "fuzz", "run.sh"), "all", "1"],
                         capture_output=True, text=True, timeout=60, cwd=caller,
                         env={**env, "PYTHON": _stand_in_python(tmp_path)})
    assert res.returncode == 1, res.stderr
    work = tree / "fuzz" / ".work"
    assert res.stdout.splitlines()[0].endswith(
        f" FINDING (exit 1, '{work / 'findings' / 'handshake' / 'crash-0'}')"), res.stdout
    lines = res.stderr.splitlines()
    assert lines[0] == f"fuzz/run.sh: handshake: last lines of '{work / 'logs' / 'handshake.log'}':"
    assert lines[-1] == f"fuzz/run.sh: findings (see '{work / 'findings'}')"
    assert (work / "logs" / "handshake.log").is_file()
    assert sorted(p.name for p in caller.iterdir()) == []


def test_fuzz_ci_names_a_log_and_a_finding_that_outlive_the_run(tmp_path: Path) -> None:
    """``ci`` wrote each target's log and findings to a temporary folder removed on exit, and
    its lines named them there (``last lines of /tmp/tmp.X/handshake.log``, ``FINDING (exit 1,
    /tmp/tmp.X/findings/handshake/crash-0)``): paths that no longer existed. They go to the work
    folder now, where the lines point."""
    work = tmp_path / "work"
    res = _fuzz("ci", env={"PYTHON": _stand_in_python(tmp_path), "FLODL_FUZZ_WORK": str(work)})
    assert res.returncode == 1, res.stderr
    log = work / "logs" / "ci" / "handshake.log"
    assert f"fuzz/run.sh: handshake: last lines of {log}:" in res.stderr.splitlines()
    assert log.read_text() == (
        f"Test unit written to {work / 'findings' / 'ci' / 'handshake'}/crash-0\n")
    assert res.stdout.splitlines()[0].endswith(
        f" FINDING (exit 1, {work / 'findings' / 'ci' / 'handshake' / 'crash-0'})"), res.stdout


def test_fuzz_without_atheris_quotes_the_interpreter(tmp_path: Path) -> None:
    """The interpreter was named as it is: a path with a space could not be pasted back."""
    shadow = tmp_path / "shadow" / "atheris"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('atheris hidden for this test')\n")
    python = tmp_path / "py thon"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    res = _fuzz("round_frame", "5", env={"PYTHON": str(python),
                                         "PYTHONPATH": str(tmp_path / "shadow")})
    assert (res.returncode, res.stdout, res.stderr) == (2, "", (
        f"fuzz/run.sh: atheris is not installed for '{python}': install the fuzz extra "
        "(pip install -e '.[fuzz]')\n"))


def test_fuzz_minimize_quotes_the_file_it_writes(tmp_path: Path) -> None:
    """``FILE.min`` was named as it is: ``wrote a b.bin.min``, which a shell reads as two
    words."""
    (tmp_path / "a b.bin").write_bytes(b"abcdef")
    work = tmp_path / "work"
    res = _fuzz("minimize", "handshake", "a b.bin", cwd=tmp_path,
                env={"PYTHON": _stand_in_python(tmp_path), "FLODL_FUZZ_WORK": str(work)})
    log = work / "logs" / "handshake.minimize.log"
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == f"fuzz/run.sh: minimize: wrote 'a b.bin.min' (3 bytes; driver log {log})\n"
    assert (tmp_path / "a b.bin.min").read_bytes() == b"abc"


def _minimize_a_pipe(data: bytes, env: dict[str, str],
                     cwd: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """``fuzz/run.sh minimize handshake <(printf ...)`` of ``data``, from the folder ``cwd``:
    the run and the name bash gave the pipe (``/dev/fd/63``) as its stdout line says it."""
    import re

    script = 'exec bash "$0" minimize handshake <(printf "$1")'
    octal = "".join(f"\\{b:03o}" for b in data)
    res = subprocess.run(["bash", "-c", script, str(ROOT / "fuzz" / "run.sh"), octal],
                         capture_output=True, text=True, timeout=120, cwd=cwd,
                         env={**os.environ, **env})
    m = re.search(r"; (/dev/fd/\d+) is not a regular file;", res.stdout)
    return res, m.group(1) if m else ""


def test_fuzz_minimize_of_a_pipe_writes_into_the_work_folder(tmp_path: Path) -> None:
    """An input given as a pipe (``<(...)``) was minimized, then copying the result to
    ``/dev/fd/63.min`` failed (cp's own line, exit 1) and the result was lost. It goes to the
    work folder's findings now, named by its SHA-1, and the line names it in full."""
    import hashlib

    work = tmp_path / "work dir"
    res, pipe = _minimize_a_pipe(b"abcdef", {"PYTHON": _stand_in_python(tmp_path),
                                             "FLODL_FUZZ_WORK": str(work)}, tmp_path)
    out = work / "findings" / "handshake" / f"minimized-{hashlib.sha1(b'abc').hexdigest()}"
    log = work / "logs" / "handshake.minimize.log"
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (f"fuzz/run.sh: minimize: wrote '{out}' (3 bytes; {pipe} is not a "
                          f"regular file; driver log '{log}')\n")
    assert out.read_bytes() == b"abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python", "work dir"]


@pytest.mark.atheris
def test_fuzz_minimize_of_a_crashing_pipe(tmp_path: Path) -> None:
    """A real minimize of a pipe: the handshake harness with a stand-in finding (an input
    holding ``FINDING``) shrinks a seed followed by ``FINDING`` to ``FINDING``."""
    import hashlib

    # the smallest seed: each byte libFuzzer erases costs a driver start or two
    seed = min((p.read_bytes() for p in (ROOT / "fuzz" / "corpus" / "handshake").iterdir()),
               key=lambda b: (len(b), b))
    assert seed and b"FINDING" not in seed
    work = tmp_path / "work"
    res, pipe = _minimize_a_pipe(seed + b"FINDING", {
        "PYTHON": sys.executable, "FLODL_FUZZ_WORK": str(work), **_stand_in_finding(tmp_path)},
        tmp_path)
    out = work / "findings" / "handshake" / f"minimized-{hashlib.sha1(b'FINDING').hexdigest()}"
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (f"fuzz/run.sh: minimize: wrote {out} (7 bytes; {pipe} is not a "
                          f"regular file; driver log {work / 'logs' / 'handshake.minimize.log'})"
                          "\n")
    assert out.read_bytes() == b"FINDING"


def test_fuzz_huge_seconds_and_bad_ci_runs_are_usage_errors(tmp_path: Path) -> None:
    # 20 digits: bash's "integer expression expected", then "must be > 0"; CI_RUNS=abc: every
    # target ran a few hundred inputs (libFuzzer's reading of a bad -runs) and ci passed
    res = _fuzz("handshake", "99999999999999999999")
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, "fuzz/run.sh: SECONDS must be at most 999999999, got "
                                "'99999999999999999999'")
    res = _fuzz("ci", env={"FLODL_FUZZ_CI_RUNS": "abc"})
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, "fuzz/run.sh: FLODL_FUZZ_CI_RUNS must be a whole number >= 1, got "
                                "'abc'")
    res = _fuzz("minimize", "handshake", str(tmp_path))
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, f"fuzz/run.sh: minimize: cannot read {_pasted(tmp_path)}: "
                                "Is a directory")


@pytest.mark.parametrize("jobs", ["x", "0", "-1", "1.5"])
def test_fuzz_jobs_must_be_a_whole_number(jobs: str) -> None:
    # 'x' ran every target at once ("integer expression expected"), then exited 0
    res = _fuzz("all", "1", env={"FLODL_FUZZ_JOBS": jobs})
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, f"fuzz/run.sh: FLODL_FUZZ_JOBS must be a whole number >= 1, got "
                                f"'{jobs}'")


@pytest.mark.parametrize("args", [("replay", "handshake", "x.bin"), ("handshake", "1"),
                                  ("all", "1"), ("ci",), ("minimize", "handshake", "x.bin")])
@pytest.mark.parametrize("grace", ["x", "0", "1.5", "1234567890"])
def test_fuzz_kill_after_must_be_a_whole_number_of_seconds(args: tuple[str, ...],
                                                           grace: str) -> None:
    # checked before anything runs, by every mode that runs a driver
    res = _fuzz(*args, env={"FLODL_FUZZ_KILL_AFTER": grace})
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, "fuzz/run.sh: FLODL_FUZZ_KILL_AFTER must be a whole number of "
                                f"seconds from 1 to 999999999, got '{grace}'")


@pytest.mark.parametrize("args", [("replay", "handshake", "x.bin"), ("handshake", "1"),
                                  ("all", "1"), ("ci",), ("minimize", "handshake", "x.bin")])
@pytest.mark.parametrize("slack", ["x", "-1", "1.5", " 1", "1234567890"])
def test_fuzz_as_slack_must_be_a_whole_number_of_mib(args: tuple[str, ...], slack: str) -> None:
    # a driver read it with int() and failed with a traceback, which the script reported as a
    # FINDING of the target (exit 1); checked before anything runs, by every mode that runs one
    res = _fuzz(*args, env={"FLODL_FUZZ_AS_SLACK_MB": slack})
    assert (res.returncode, res.stdout) == (2, "")
    _one_error_line(res.stderr, "fuzz/run.sh: FLODL_FUZZ_AS_SLACK_MB must be a whole number of "
                                f"MiB from 0 to 999999999, got '{slack}'")


@pytest.mark.parametrize("slack", ["x", "-1", "1.5", " 1", "1234567890", "\u00b2"])
def test_the_fuzz_driver_run_directly_refuses_a_bad_as_slack_in_one_line(
        slack: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # fuzz/driver.py run by hand (the README's merge recipe does) read the value with int():
    # a ValueError traceback; the refusal comes before any limit is set
    sys.path.insert(0, str(ROOT))
    try:
        from fuzz.driver import limit_address_space
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setenv("FLODL_FUZZ_AS_SLACK_MB", slack)
    with pytest.raises(SystemExit) as e:
        limit_address_space()
    assert e.value.code == 2
    assert capsys.readouterr() == ("", "fuzz/driver.py: FLODL_FUZZ_AS_SLACK_MB must be a whole "
                                   f"number of MiB from 0 to 999999999, got {slack!r}\n")


#: an input holding ``HOG`` allocates 1 GiB, sized from the input, beyond the driver's 512 MiB
#: slack
_STAND_IN_MEMORY_FINDING = _STAND_IN.format(trigger=b"HOG", action="bytes(1 << 30)")


def test_fuzz_replay_reproduces_a_memory_finding_under_the_driver_s_cap(tmp_path: Path) -> None:
    """The driver caps the address space (start-up size + FLODL_FUZZ_AS_SLACK_MB), so an
    allocation sized from a hostile claim is a MemoryError finding; replay ran without the cap
    and said ``ok``, exit 0, for the finding it was to reproduce. 0 lifts the cap, as for the
    driver."""
    env = _stand_in_site(tmp_path, _STAND_IN_MEMORY_FINDING)
    seed = next((ROOT / "fuzz" / "corpus" / "handshake").iterdir()).read_bytes()
    (tmp_path / "hog.bin").write_bytes(seed + b"HOG")
    res = _fuzz("replay", "handshake", "hog.bin", cwd=tmp_path, env=env)
    assert (res.returncode, res.stdout) == (1, ""), res.stdout
    lines = res.stderr.splitlines()
    assert lines[0] == "fuzz/run.sh: replay: hog.bin: finding: the handshake harness raised"
    assert lines[-1] == "MemoryError"
    res = _fuzz("replay", "handshake", "hog.bin", cwd=tmp_path,
                env={**env, "FLODL_FUZZ_AS_SLACK_MB": "0"})
    assert (res.returncode, res.stdout, res.stderr) == (0, "hog.bin: ok\n", "")


@pytest.mark.atheris
def test_fuzz_a_finding_exits_1(tmp_path: Path) -> None:
    """A single target's finding passed libFuzzer's code through (77 for a crash, 71 for an
    out-of-memory), where the script says 1. A memory limit below the interpreter's own is a
    finding at once."""
    res = _fuzz("handshake", "5", env={"FLODL_FUZZ_ARGS": "-rss_limit_mb=1",
                                       "FLODL_FUZZ_WORK": str(tmp_path)})
    assert res.returncode == 1, res.stderr
    assert "FINDING (exit 71, " in res.stdout
    assert "fuzz/run.sh: handshake: last lines of " in res.stderr


@pytest.mark.atheris
def test_fuzz_readme_s_log_command_shows_what_its_comment_names(tmp_path: Path) -> None:
    """fuzz/README.md's deep-campaign block reads each target's log with a command whose comment
    names runs, exec/s, cov, ft and peak RSS; `tail -n 3` showed the last three final stats only
    (new units, slowest unit, peak RSS), and `tail -n 7` lost the DONE line whenever libFuzzer
    printed a recommended dictionary after it (a block of a few lines, in some runs only): the
    command picks the lines by what they are."""
    block = (ROOT / "fuzz" / "README.md").read_text().split("## Deep campaigns", 1)[1]
    command = next(line for line in block.splitlines() if "fuzz/.work/logs/" in line
                   and not line.startswith("#"))
    res = _fuzz("handshake", "1", env={"FLODL_FUZZ_WORK": str(tmp_path / "fuzz" / ".work")})
    assert res.returncode == 0, res.stderr
    shown = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30,
                           cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    done = [line for line in lines if re.search(r"\sDONE\s", line)]
    assert len(done) == 1 and re.search(r"^#\d+\s+DONE\s+cov: \d+ ft: \d+ .*exec/s: \d+ "
                                        r"rss: \d+Mb$", done[0]), lines
    for stat in ("number_of_executed_units", "average_exec_per_sec", "peak_rss_mb"):
        assert any(re.fullmatch(rf"stat::{stat}: *\d+", line) for line in lines), (stat, lines)


def test_fuzz_readme_s_log_command_keeps_the_done_line_before_a_recommended_dictionary(
        tmp_path: Path) -> None:
    """libFuzzer prints a recommended dictionary after its DONE line in some runs (the run of
    this test's atheris sibling did so in one CI run of many): the README's command still shows
    the DONE line and the final stats, where `tail -n 7` showed the dictionary's end and the
    stats only. A log in libFuzzer's words, without atheris."""
    block = (ROOT / "fuzz" / "README.md").read_text().split("## Deep campaigns", 1)[1]
    command = next(line for line in block.splitlines() if "fuzz/.work/logs/" in line
                   and not line.startswith("#"))
    logs = tmp_path / "fuzz" / ".work" / "logs"
    logs.mkdir(parents=True)
    done = "#50264\tDONE   cov: 412 ft: 1290 corp: 61/2417b lim: 4096 exec/s: 25132 rss: 61Mb"
    stats = ["stat::number_of_executed_units: 50264", "stat::average_exec_per_sec:     25132",
             "stat::new_units_added:          11", "stat::slowest_unit_time_sec:    0",
             "stat::peak_rss_mb:              61"]
    (logs / "handshake.log").write_text("\n".join([
        "#49152\tpulse  cov: 412 ft: 1290 corp: 61/2417b lim: 4096 exec/s: 24576 rss: 61Mb",
        done, "###### Recommended dictionary. ######", '"\\x01\\x00" # Uses: 7',
        '"\\xd0\\x17\\x0d\\xf1" # Uses: 3', "###### End of recommended dictionary. ######",
        "Done 50264 runs in 2 second(s)", *stats]) + "\n")
    shown = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30,
                           cwd=tmp_path)
    assert (shown.returncode, shown.stderr) == (0, "")
    assert shown.stdout.splitlines() == [done, *stats]


@pytest.mark.atheris
def test_fuzz_a_run_of_under_a_second_shows_its_rate_as_above_its_runs(tmp_path: Path) -> None:
    """libFuzzer's exec/s divides by whole seconds: a run of under a second printed 0."""
    import re

    res = _fuzz("handshake", "30", env={"FLODL_FUZZ_ARGS": "-runs=50",
                                        "FLODL_FUZZ_WORK": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    m = re.match(r"handshake +runs=(\d+) +exec/s=(\S+) ", res.stdout)
    assert m is not None, res.stdout
    assert m.group(2) == f">{m.group(1)}" and int(m.group(1)) >= 50


@pytest.mark.atheris
def test_fuzz_minimize_of_an_input_that_does_not_crash_says_so(tmp_path: Path) -> None:
    """One line, naming the driver's log: about 30 lines of atheris INFO, libFuzzer CRASH_MIN
    and WARNING output came before it."""
    seed = next((ROOT / "fuzz" / "corpus" / "handshake").iterdir())
    (tmp_path / "seed.bin").write_bytes(seed.read_bytes())
    work = tmp_path / "work"
    res = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), "minimize", "handshake",
                          "seed.bin"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHON": sys.executable,
                              "FLODL_FUZZ_WORK": str(work)})
    log = work / "logs" / "handshake.minimize.log"
    assert (res.returncode, res.stdout, res.stderr) == (1, "", (
        "fuzz/run.sh: minimize: seed.bin does not crash the handshake harness: nothing to "
        f"minimize (driver log {log})\n"))
    text = log.read_text()
    assert "INFO: Using built-in libfuzzer" in text and "CRASH_MIN: executing: " in text
    assert "did not crash" in text
    # the minimizing driver only runs itself again: it does not load (instrument) the target
    assert "INFO: Instrumenting" not in text
    assert not (tmp_path / "seed.bin.min").exists()


@pytest.mark.parametrize(("flags", "expected"), [
    (["-minimize_crash=1", "-runs=20000", "input"], True),
    (["-runs=20000", "-minimize_crash=1"], True),
    (["-minimize_crash=0", "input"], False),
    (["-minimize_crash=1", "-minimize_crash=0"], False),
    (["-minimize_crash=1", "-minimize_crash_internal_step=1", "input"], True),
    (["-minimize_crash_internal_step=1", "input"], False),
    (["-runs=20000", "input"], False),
    (["-minimize_crash=x"], False),
    ([], False),
])
def test_fuzz_driver_knows_a_minimizing_run(flags: list[str], expected: bool) -> None:
    """A driver asked to minimize (``-minimize_crash=1``) skips loading the target: libFuzzer
    only runs the driver again per try; a try (``-minimize_crash_internal_step``) loads it."""
    from fuzz.driver import minimizing

    assert minimizing(flags) is expected


@pytest.mark.atheris
@pytest.mark.parametrize("name", ["in sp.bin", "a;touch PWNED;b", "$(touch PWNED)"])
def test_fuzz_minimize_takes_any_file_name(name: str, tmp_path: Path) -> None:
    """libFuzzer's minimize runs itself again through ``sh -c`` with the input's path pasted
    into the command line: a name with a space was not found (and the run printed 25 lines of
    its log), one with ``;`` or ``$(...)`` ran as a command. The driver now gets a copy under a
    plain name: the input is judged as any other, and nothing else runs."""
    seed = next((ROOT / "fuzz" / "corpus" / "handshake").iterdir())
    (tmp_path / name).write_bytes(seed.read_bytes())
    work = tmp_path / "work"
    res = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), "minimize", "handshake",
                          name], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHON": sys.executable,
                              "FLODL_FUZZ_WORK": str(work)})
    log = work / "logs" / "handshake.minimize.log"
    assert (res.returncode, res.stdout, res.stderr) == (1, "", (
        f"fuzz/run.sh: minimize: {_pasted(name)} does not crash the handshake harness: nothing "
        f"to minimize (driver log {log})\n"))
    assert not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "work"])


@pytest.mark.atheris
@pytest.mark.parametrize(("jobs", "how"), [("1", "ctrl-c"), ("2", "ctrl-c"), ("1", "kill"),
                                           ("2", "kill")])
def test_fuzz_ctrl_c_stops_the_whole_run(jobs: str, how: str, tmp_path: Path) -> None:
    """Ctrl-C stopped the running target only, reported as a finding ("FINDING (exit 130)");
    every later target then ran its full time, and the run exited 1. With FLODL_FUZZ_JOBS=2 the
    targets' drivers ran on after the script ended (a target's subshell died of Ctrl-C's SIGINT
    while its driver, still starting and ignoring SIGINT, ran on). A SIGTERM to the script's
    process alone (``kill PID``) was acted on only when the running target ended its 60 s, and
    ended the run as a Ctrl-C did (``interrupted``, exit 130): ``terminated``, exit 143."""
    log = tmp_path / "logs" / "handshake.log"

    def fuzzing(_: subprocess.Popen[str]) -> bool:
        return "cov:" in (log.read_text() if log.exists() else "")

    def stop(proc: subprocess.Popen[str]) -> None:
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        else:
            os.kill(proc.pid, signal.SIGTERM)  # the script alone, not its driver

    word = "interrupted" if how == "ctrl-c" else "terminated"
    _, out, err, _ = _stopped_fuzz_run(
        ["all", "60"], {"PYTHON": sys.executable, "FLODL_FUZZ_JOBS": jobs,
                        "FLODL_FUZZ_WORK": str(tmp_path)},
        started=fuzzing, stop=stop, not_started="the first target did not start", timeout=30,
        word=word)
    assert "FINDING" not in out + err and " ok" not in out
    # each stopped target says so in its line (the background ones of FLODL_FUZZ_JOBS=2 said
    # nothing); the first had started, a later one may not have
    lines = out.splitlines()
    assert lines and all(line.endswith(f" {word}") for line in lines), out
    assert any(line.startswith("handshake ") for line in lines), out
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout == ""  # no driver runs on


def test_fuzz_a_driver_that_does_not_end_on_sigterm_is_killed(tmp_path: Path) -> None:
    """A stopped run waited for its driver to end after SIGTERM, and one that never ended (a
    driver stopped inside the allocator can hang in libFuzzer's handler, which prints) held the
    script for good; FLODL_FUZZ_KILL_AFTER s (default 10) after the first SIGTERM the driver is
    killed. The driver here is a stand-in that ignores SIGTERM (atheris is not needed: the
    stand-in says it is there), given 1 s."""
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
if [ "$1" = fuzz/driver.py ]; then trap '' TERM; exec sleep 300; fi
case "$2" in 'import atheris') exit 0 ;; esac
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    session, out, _, took = _stopped_fuzz_run(
        ["handshake", "60"], {"PYTHON": str(python), "FLODL_FUZZ_WORK": str(tmp_path / "work"),
                              "FLODL_FUZZ_KILL_AFTER": "1"},
        started=lambda proc: subprocess.run(["pgrep", "-s", str(proc.pid), "-x", "sleep"],
                                            capture_output=True).returncode == 0,
        stop=lambda proc: os.kill(proc.pid, signal.SIGTERM),
        not_started="the stand-in driver did not start", timeout=40, word="terminated")
    assert out.split()[0] == "handshake" and out.rstrip().endswith(" terminated")
    # the 1 s grace, neither the default 10 s nor the stand-in's 300 s
    assert 1 < took < 9, took
    left = subprocess.run(["pgrep", "-s", str(session)], capture_output=True, text=True)
    assert left.stdout == ""


def test_fuzz_help_says_all_n_is_per_target() -> None:
    res = _fuzz("--help")
    assert res.returncode == 0
    assert "every target in turn, SECONDS seconds EACH" in res.stdout


# -- item: --salt-file and the README's hand-run cluster ---------------------------------------
@pytest.mark.parametrize("command", ["relay", "rank"])
def test_salt_file_errors_are_one_line(command: str, tmp_path: Path) -> None:
    where = ["--controller", "127.0.0.1:1", "--ranks", "0"] if command == "relay" \
        else ["--relay", "127.0.0.1:1", "--rank", "0"]
    res = _cli(command, *where, "--world-size", "1", "--salt-file", str(tmp_path / "missing"))
    assert res.returncode == 2
    _one_error_line(res.stderr, "No such file or directory")
    bad = tmp_path / "bad.hex"
    bad.write_text("not a salt\n")
    res = _cli(command, *where, "--world-size", "1", "--salt-file", str(bad))
    assert res.returncode == 2
    _one_error_line(res.stderr, "32 hex digits")
    res = _cli(command, *where, "--world-size", "1", "--salt-file", str(bad), "--salt", SALT_HEX)
    assert res.returncode == 2 and "not allowed with argument" in res.stderr


def test_hand_run_cluster_with_salt_files(tmp_path: Path, procs: list[_Proc]) -> None:
    """The README's cluster by hand: controller, relay, two ranks, all with --salt-file; the
    ranks pace their rounds (--interval) so GET /status shows the run in progress."""
    salt = tmp_path / "salt.hex"
    salt.write_text(SALT_HEX + "\n")
    s = ["--world-size", "2", "--salt-file", str(salt)]
    ctl = _Proc("controller", "--listen", "127.0.0.1:0", *s)
    procs.append(ctl)
    addr = ctl.wait_for("listening on ").split()[-1]
    relay = _Proc("relay", "--controller", addr, "--ranks", "0,1", "--listen-port", "0", *s)
    procs.append(relay)
    raddr = relay.wait_for("listening on ").split()[-1]
    ranks = [_Proc("rank", "--relay", raddr, "--rank", str(r), *s, "--rounds", "4",
                   "--interval", "0.3") for r in (0, 1)]
    procs.extend(ranks)
    first = [r.wait_for("round 1 digest") for r in ranks]
    with urllib.request.urlopen(f"http://{addr}/status", timeout=30) as resp:
        status = resp.read().decode()
    assert '"ranks_covered": 2' in status and '"world_size": 2' in status
    last = [r.wait_for("round 4 digest") for r in ranks]
    assert first[0] == first[1] and last[0] == last[1]
    for p in ranks:
        rc, err = p.finish()
        assert (rc, err) == (0, "")
    assert relay.finish()[0] == 0
    assert ctl.finish()[0] == 0


# -- item: demo --rounds N and what the demo prints for a capture ------------------------------
@pytest.mark.timeout(420)  # three demo runs of up to 150 s, 150 s and 90 s: the module's 120 s
def test_demo_short_runs_pass_and_print_ports_and_salt_file(tmp_path: Path) -> None:
    """Any --rounds the parser accepts finishes with 0 on a healthy cluster (the target is what
    that many rounds reach); the demo names its controller and relay addresses and its salt
    file, written on the first run and read on the next. Two ranks, one per relay: both
    relay lines, two rank processes fewer to start."""
    salt = tmp_path / "demo-salt.hex"
    env = {"COLUMNS": "200"}
    for rounds, note in (("1", f"session salt: written to {shown(str(salt))}"),
                         ("2", f"session salt: read from {shown(str(salt))}")):
        res = _cli("demo", "--no-progress", "--payload-mib", "0", "--rounds", rounds,
                   "--world-size", "2", "--salt-file", str(salt), env=env, timeout=150)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        assert lines[0] == note
        assert any(ln.startswith("controller listening on 127.0.0.1:") for ln in lines)
        relays = [ln for ln in lines if ln.startswith("relay") and " listening on " in ln]
        assert [r.split()[0] for r in relays] == ["relay0", "relay1"]
        assert f"{rounds} of {rounds} completed" in res.stdout
        assert "OK: every round completed" in res.stdout
    text = salt.read_text()
    assert len(text.strip()) == 32 and int(text, 16) >= 0
    assert salt.stat().st_mode & 0o777 == 0o600
    res = _cli("demo", "--rounds", "0")
    assert res.returncode == 2
    _one_error_line(res.stderr, "argument --rounds: must be in 1..1000000 for the demo")


def test_demo_reference_loss_is_the_target_for_short_runs() -> None:
    from flodl_proto.commands import _demo_worker as worker
    x, y = worker.make_dataset(7)
    _, l_opt = worker.optimum(x, y)
    short = worker.reference_loss(7, 4, 2)
    long = worker.reference_loss(7, 4, 40)
    assert short > l_opt * 1.5  # two rounds are far from the optimum
    assert l_opt <= long <= l_opt * 1.01  # forty rounds reach it within the tolerance
    assert worker.reference_loss(7, 4, 2, bf16=True) == pytest.approx(short, rel=1e-2)


# -- item: messages name the option and carry one prefix ----------------------------------------
def test_relay_error_has_one_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", "0,5",
                             "--world-size", "2", "--salt", SALT_HEX)
    assert code == 2
    assert err == ("flodl-proto relay: error: argument --ranks: '0,5': every rank must be < "
                   "--world-size 2, got rank 5\n")


@pytest.mark.parametrize(("args", "message"), [
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "0", "--salt", SALT_HEX),
     "argument --world-size: must be in 1..4294967295 (the handshake's u32 field), got 0"),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "x", "--world-size", "2",
      "--salt", SALT_HEX), "argument --ranks: expected a list of ranks like 0,1 or 0-3, got 'x'"),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1",
      "--salt", "abc"),
     "argument --salt: session salt must be 16 bytes written as 32 hex digits, got 3 characters"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt", SALT_HEX,
      "--rounds", "-1"), "argument --rounds: must be in 1..1000000, got -1"),
    (("decode", "--pcap", "-"), "argument --pcap: needs --port N"),
    (("decode", "--port", "5", "-"), "argument --port: only meaningful with --pcap"),
    (("demo", "--rounds", "0"), "argument --rounds: must be in 1..1000000 for the demo (it also "
                                "trains "
     "that many rounds in this process, for the reference loss), got 0"),
    (("vectors", "check", "/nonexistent-flodl-vectors"),
     "argument PATH: '/nonexistent-flodl-vectors': does not exist"),
])
def test_every_command_s_usage_error_is_one_line_with_the_error_prefix(
        args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """As argparse's own usage errors and the controller's: ``flodl-proto CMD: error: ...``,
    one line on stderr, exit 2 (relay, rank, decode, demo and vectors printed the message
    without ``error:``, decode even without ``flodl-proto``)."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(args[:2]) if args[0] in ("vectors", "conform") else args[0]  # as argparse's
    assert (code, out, err) == (2, "", f"flodl-proto {prog}: error: {message}\n")


@pytest.mark.parametrize(("args", "command", "unknown"), [
    (("vectors", "check", "--bogus"), ("vectors", "check"), "--bogus"),
    (("vectors", "--bogus", "check"), ("vectors",), "--bogus"),
    (("conform", "controller", "--list", "--bogus", "x"), ("conform", "controller"), "--bogus x"),
    (("conform", "docs", "--check", "--bogus"), ("conform", "docs"), "--bogus"),
    (("decode", "-", "extra"), ("decode",), "extra"),
    (("demo", "--bogus", "--log-level", "INFO"), ("demo",), "--bogus"),
    (("--bogus", "decode", "-"), (), "--bogus"),
    (("--log-level", "INFO", "--bogus", "vectors", "check"), (), "--bogus"),
    # before a missing required argument (argparse named that one: ROLE, DIR, --relay ...)
    (("conform", "--bogus"), ("conform",), "--bogus"),
    (("conform", "--bogus", "controller", "--list"), ("conform",), "--bogus"),
    (("vectors", "compare", "--bogus"), ("vectors", "compare"), "--bogus"),
    (("rank", "--rank", "0", "--bogus"), ("rank",), "--bogus"),
])
def test_an_unknown_argument_is_the_usage_error_of_the_command_it_follows(
        args: tuple[str, ...], command: tuple[str, ...], unknown: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An argument after a command (or its action) that the command does not know is that
    command's usage error, one line with its prefix (argparse left it to the top-level
    parser: ``flodl-proto: error: unrecognized arguments: --bogus`` and the top-level usage);
    one before the command stays the top level's. It is reported before a required argument
    that is missing."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    assert (code, out, err) == (
        2, "", f"{prog}: error: unrecognized arguments: {unknown}\n")


@pytest.mark.parametrize(("value", "message"), [
    (None, "no session salt: give --salt HEX, --salt-file PATH or set FLODL_SESSION_SALT"),
    ("", "no session salt: give --salt HEX, --salt-file PATH or set FLODL_SESSION_SALT"),
    ("  \n", "no session salt: give --salt HEX, --salt-file PATH or set FLODL_SESSION_SALT"),
    ("zz", "$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex digits, got 2 "
           "characters, character 1 ('z') not a hex digit"),
])
@pytest.mark.parametrize("command", [
    ("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1"),
    ("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1"),
    ("controller", "--listen", "127.0.0.1:0", "--world-size", "1"),
], ids=lambda c: c[0])
def test_a_salt_error_names_its_source(command: tuple[str, ...], value: str | None,
                                       message: str, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed salt says whether it came from ``--salt`` (above) or the environment; an
    empty or blank ``$FLODL_SESSION_SALT`` is no salt, as an unset one (it read "got 0
    characters")."""
    if value is None:
        monkeypatch.delenv("FLODL_SESSION_SALT", raising=False)
    else:
        monkeypatch.setenv("FLODL_SESSION_SALT", value)
    code, out, err = _run_main(capsys, *command)
    assert (code, out, err) == (2, "", f"flodl-proto {command[0]}: error: {message}\n")


def test_rank_interval_longer_than_one_sleep_takes_is_slept_in_slices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.sleep`` refuses a wait whose end the clock cannot represent (``OverflowError``
    above ``threading.TIMEOUT_MAX``, ``OSError`` EINVAL below it): ``rank --interval 1e308``
    ran its first round, then ended with a traceback. The pause is slept in steps of 0.1 s
    (``commands._waits.sleep``), to its end on the monotonic clock."""
    from flodl_proto.commands import _waits, rank

    slept: list[float] = []
    clock = [1000.0]

    class _Enough(Exception):
        pass

    def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds
        if len(slept) == 3:
            raise _Enough

    monkeypatch.setattr(_waits.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_waits.time, "sleep", fake_sleep)
    with pytest.raises(_Enough):
        rank.pause(1e308)
    assert slept == [0.1, 0.1, 0.1]
    monkeypatch.setattr(_waits.time, "sleep", lambda s: (slept.append(s), clock.__setitem__(
        0, clock[0] + s)))
    slept.clear()
    clock[0] = 1000.0
    rank.pause(0.25)
    assert slept == [0.1, 0.1, 1000.25 - 1000.2]
    slept.clear()
    rank.pause(0.0)
    assert slept == []


@pytest.mark.parametrize("ranks", ["0,,1", "0,1,", ",0", "0, ,1"])
def test_relay_ranks_with_an_empty_item_is_a_usage_error(
        ranks: str, capsys: pytest.CaptureFixture[str]) -> None:
    # "0,,1" was taken as 0,1: a rank left out by mistake went unnoticed
    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", ranks,
                               "--world-size", "2", "--salt", SALT_HEX)
    assert (code, out) == (2, "")
    assert err == (f"flodl-proto relay: error: argument --ranks: expected a list of ranks like 0,1 "
                   f"or 0-3, got {ranks!r} (an empty item)\n")


@pytest.mark.parametrize(("command", "where", "prefix"), [
    ("controller", ["--listen", "127.0.0.1:0"], "flodl-proto controller: error: "),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"], "flodl-proto relay: error: "),
    ("rank", ["--relay", "127.0.0.1:1", "--rank", "0"], "flodl-proto rank: error: "),
])
def test_salt_file_errors_name_the_option(command: str, where: list[str], prefix: str,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.hex"
    code, _, err = _run_main(capsys, command, *where, "--world-size", "1",
                             "--salt-file", str(missing))
    assert code == 2
    assert err == (f"{prefix}argument --salt-file: {shown(str(missing))}: No such file or "
                   "directory\n")
    bad = tmp_path / "bad.hex"
    bad.write_text("not a salt\n")
    code, _, err = _run_main(capsys, command, *where, "--world-size", "1",
                             "--salt-file", str(bad))
    assert code == 2
    assert err.startswith(f"{prefix}argument --salt-file: {shown(str(bad))}: ")
    assert "32 hex digits" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(("content", "problem"), [
    (b"d5c6a1f0e9b8c7d6a5f4e3d2c1b0a9f8X\n", "33 characters, character 33 ('X') not a hex digit"),
    (b"d5c6a1f0e9b8c7d6a5f4e3d2c1b0a9\n", "30 characters"),
    (bytes(range(200, 256)) * 18, "1008 bytes, byte 1 (0xc8) not ASCII (a raw salt file holds "
                                  "exactly 16 bytes)"),
])
def test_a_salt_file_error_never_shows_the_file_s_digits(
        content: bytes, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # a near-miss salt is a secret: the error printed the file's whole text (up to 4096 bytes)
    path = tmp_path / "salt.hex"
    path.write_bytes(content)
    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", "0",
                               "--world-size", "1", "--salt-file", str(path))
    assert (code, out) == (2, "")
    assert err == (f"flodl-proto relay: error: argument --salt-file: {shown(str(path))}: "
                   f"session salt must be 16 bytes written as 32 hex digits, got {problem}\n")
    assert "d5c6" not in err


@pytest.mark.parametrize(("command", "where", "option"), [
    ("controller", ["--listen", "127.0.0.1:0"], "--round-timeout"),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"], "--rank-timeout"),
])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon", "1e999"])
def test_timeouts_are_checked_as_cli_options(command: str, where: list[str], option: str,
                                             value: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The line states the whole rule: ``1e999`` is positive, but not finite."""
    code, _, err = _run_main(capsys, command, *where, "--world-size", "1", "--salt", SALT_HEX,
                             option, value)
    assert code == 2
    assert err.splitlines()[-1] == (f"flodl-proto {command}: error: argument {option}: must be "
                                    "a finite number of seconds above 0, at most 864000 s once "
                                    f"scaled by FLODL_NET_TIMEOUT_SCALE, got '{value}'")


@pytest.mark.parametrize(("command", "where", "option"), [
    ("controller", ["--listen", "127.0.0.1:0"], "--round-timeout"),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"], "--rank-timeout"),
])
def test_a_timeout_of_5000_digits_is_not_finite(command: str, where: list[str], option: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_main(capsys, command, *where, "--world-size", "1", "--salt", SALT_HEX,
                             option, "9" * 5000)
    assert code == 2
    assert err.splitlines()[-1] == (f"flodl-proto {command}: error: argument {option}: must be "
                                    "a finite number of seconds above 0, at most 864000 s once "
                                    f"scaled by FLODL_NET_TIMEOUT_SCALE, got '{'9' * 40}..."
                                    f"{'9' * 20}' (5000 characters)")


@pytest.mark.parametrize(("command", "option"), [("controller", "--round-timeout"),
                                                 ("relay", "--rank-timeout")])
def test_timeout_help_states_the_maximum(command: str, option: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_main(capsys, command, "--help")
    assert code == 0
    help_text = " ".join(out.split())
    assert ("(a finite number of seconds above 0, at most 864000 s once scaled by "
            "FLODL_NET_TIMEOUT_SCALE; default: no deadline, as upstream)") in help_text


# -- item: --frame-ceiling BYTES of controller, relay and rank ------------------------------------
_CEILING_COMMANDS = [
    ("controller", ["--listen", "127.0.0.1:0"]),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"]),
    ("rank", ["--relay", "127.0.0.1:1", "--rank", "0"]),
]


@pytest.mark.parametrize(("command", "where"), _CEILING_COMMANDS)
@pytest.mark.parametrize("value", ["0", "-5", "1", "24"])
def test_frame_ceiling_below_the_smallest_round_frame_is_a_usage_error(
        command: str, where: list[str], value: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every frame, HostFrame and Broadcast is at least a RoundFrame with no tensor (25 bytes),
    and every handshake record is shorter: a smaller ceiling is refused before anything starts,
    one line naming the option, the value and the minimum (a controller started with 5 refused
    the relays' 6-byte Hello, and the relays blamed the version or the salt)."""
    code, out, err = _run_main(capsys, command, *where, "--world-size", "1", "--salt", SALT_HEX,
                               "--frame-ceiling", value)
    assert (code, out, err) == (2, "", f"flodl-proto {command}: error: argument --frame-ceiling: "
                                       "must be at least 25 bytes (the smallest RoundFrame: no "
                                       f"tensor), got {value}\n")


@pytest.mark.parametrize(("command", "where"), _CEILING_COMMANDS)
@pytest.mark.parametrize(("value", "why"), [
    ("4G", "expected a number of bytes, got '4G'"),
    ("1.5", "expected a number of bytes, got '1.5'"),
    ("4294967296", "must be at most 4294967295 bytes (the u32 length prefix and mux "
                   "payload_len), got '4294967296'"),
])
def test_frame_ceiling_that_is_no_u32_byte_count_is_a_usage_error(
        command: str, where: list[str], value: str, why: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, command, *where, "--world-size", "1", "--salt", SALT_HEX,
                               "--frame-ceiling", value)
    assert (code, out, err) == (2, "", f"flodl-proto {command}: error: argument --frame-ceiling: "
                                       f"{why}\n")


@pytest.mark.parametrize(("value", "why"), [
    (" 12", ""), ("12 ", ""), ("+5", ""), ("0x10", ""), ("1e3", ""), ("", ""),
    # text int() reads says why it is refused
    ("1_000", " (a number is written in ASCII digits, without '_')"),
    ("\u0661\u0662", " (a number is written in ASCII digits, without '_')"),
    ("\uff11\uff12", " (a number is written in ASCII digits, without '_')"),
    ("12\u3000", " (a non-ASCII blank, U+3000: a number and the blanks around it are written "
                 "in ASCII)"),
])
def test_frame_ceiling_is_ascii_digits_only(value: str, why: str) -> None:
    # int() takes blanks, a sign, underscores and any script's digits: a size is none of these
    from flodl_proto.commands.relay import byte_count, frame_ceiling

    with pytest.raises(ValueError) as e:
        frame_ceiling(value)
    assert str(e.value) == (f"argument --frame-ceiling: expected a number of bytes, got "
                            f"{value!r}{why}")
    with pytest.raises(ValueError, match="expected a number of bytes"):
        byte_count(value)


def test_a_byte_count_of_more_digits_than_int_reads_is_out_of_range() -> None:
    """A count of more digits than int() reads (4300) was "expected a number of bytes", its
    digits echoed whole; it is read, and the upper bound refuses it, quoting it by its ends."""
    from flodl_proto.commands.relay import byte_count, frame_ceiling

    assert byte_count("9" * 5000) == 10**5000 - 1
    assert byte_count("0" * 5000 + "7") == 7
    with pytest.raises(ValueError) as e:
        frame_ceiling("9" * 5000)
    assert str(e.value) == ("argument --frame-ceiling: must be at most 4294967295 bytes (the u32 "
                            f"length prefix and mux payload_len), got '{'9' * 40}...{'9' * 20}' "
                            "(5000 characters)")


def test_max_input_is_ascii_digits_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "decode", "--max-input", "\u0661\u0662", "-")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == ("flodl-proto decode: error: argument --max-input: expected a "
                                    "number of bytes, got '\u0661\u0662' (a number is written "
                                    "in ASCII digits, without '_')")


def test_frame_ceiling_parser_bounds() -> None:
    from flodl_proto.commands.relay import frame_ceiling
    from flodl_proto.spec import DEFAULT_FRAME_CEILING, U32_MAX

    assert frame_ceiling(None) == DEFAULT_FRAME_CEILING == 1 << 30
    assert frame_ceiling("25") == 25
    assert frame_ceiling(str(U32_MAX)) == U32_MAX == 4294967295


@pytest.mark.parametrize(("command", "what"), [
    ("controller", "largest payload_len of a relay's record (and of a Broadcast) accepted"),
    ("relay", "largest length prefix of a rank's frame and payload_len of a controller's record "
              "accepted"),
    ("rank", "largest length prefix of a reply (and of this rank's own frame, headers included) "
             "accepted"),
])
def test_frame_ceiling_in_the_help(command: str, what: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_main(capsys, command, "--help")
    assert code == 0
    assert (f"--frame-ceiling BYTES {what}, in bytes, 25..4294967295 (at least the smallest "
            "RoundFrame: no tensor); default 1073741824, 1 GiB" in " ".join(out.split()))


@pytest.mark.parametrize(("command", "where", "runner", "attr"), [
    ("controller", ["--listen", "127.0.0.1:0"], "flodl_proto.runner.controller",
     "ReferenceController"),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"], "flodl_proto.runner.relay",
     "Relay"),
    ("rank", ["--relay", "127.0.0.1:1", "--rank", "0"], "flodl_proto.runner.rank",
     "RankClient"),
])
@pytest.mark.parametrize("given", [None, "4096", "25"])
def test_the_cluster_commands_pass_the_frame_ceiling_to_their_runner(
        command: str, where: list[str], runner: str, attr: str, given: str | None,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The runner gets the option's value (the smallest RoundFrame, 25, included), or the
    spec's 1 GiB when it is not given (caught where the runner is built: no socket is
    opened)."""
    import importlib

    seen: list[int] = []

    class _Stop(Exception):
        pass

    def built(*args: Any, ceiling: int, **kwargs: Any) -> Any:
        seen.append(ceiling)
        raise _Stop

    module = importlib.import_module(runner)
    if attr != "RankClient":
        monkeypatch.setattr(module, attr, built)
    else:
        monkeypatch.setattr(module.RankClient, "connect", built)
    extra = [] if given is None else ["--frame-ceiling", given]
    if command == "rank" and given == "25":  # the rank's own frame cannot fit: refused first
        code, _, err = _run_main(capsys, command, *where, "--world-size", "1", "--salt",
                                 SALT_HEX, *extra)
        assert (code, seen) == (2, [])
        assert err.endswith("-byte frame, above the frame ceiling 25 (--frame-ceiling)\n")
        return
    with pytest.raises(_Stop):
        _run_main(capsys, command, *where, "--world-size", "1", "--salt", SALT_HEX, *extra)
    assert seen == [1 << 30 if given is None else int(given)]


@pytest.mark.parametrize("ceiling", [1063, 1062])
def test_controller_frame_ceiling_refuses_a_record_above_it(ceiling: int,
                                                             procs: list[_Proc]) -> None:
    """A HostFrame of 256 f32 is a record of payload_len 1063: a controller started with
    ``--frame-ceiling 1063`` reduces it; one with 1062 refuses it before reading its payload,
    closes the relay's connection and fails the run with one line naming both numbers."""
    import numpy as np

    from .fake_relay import SALT, FakeRelay, frame

    ctl = _Proc("controller", "--listen", "127.0.0.1:0", "--world-size", "1",
                "--salt", SALT.hex(), "--frame-ceiling", str(ceiling))
    procs.append(ctl)
    port = int(ctl.wait_for("listening on").rsplit(":", 1)[1])
    with FakeRelay(port, [0]) as relay:
        relay.expect_hello_ack()
        relay.send_host_frame(frame(np.arange(256, dtype=np.float32)))
        if ceiling == 1063:
            assert relay.read_broadcast().tensors[0].nbytes == 1024
            relay.rank_exit(0)
        assert relay.at_eof()
    code, err = ctl.finish()
    if ceiling == 1063:
        assert (code, err) == (0, "")
    else:
        assert (code, err) == (1, "flodl-proto controller: error: reading relay fake (ranks 0): "
                                  "relay_mux: record payload_len 1063 exceeds the frame ceiling "
                                  "1062 (kind=0x03, rank=0); corrupt or hostile peer, or a model "
                                  "that has outgrown the frame ceiling\n")


def test_docs_and_rank_help_describe_their_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_main(capsys, "docs", "--help")
    assert code == 0
    assert "Write the protocol reference" in " ".join(out.split())
    code, out, _ = _run_main(capsys, "rank", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "--rank R this rank's global id, 0 <= R < N" in flat
    assert "--world-size N number of ranks in the whole run (every host)" in flat


# -- item: a stdout that cannot be written (``> /dev/full``, ``>&-``) ---------------------------
_UNWRITABLE_STDOUT_ARGS = [
    ("vectors", "check"),
    ("decode", "--leg", "mux", "--hex", "-"),
    ("dissector", "--out", "-"),
    ("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX),
]


def _decode_input() -> bytes:
    from flodl_proto.codec import MuxRecord, RankExit, encode_channel_magic, encode_mux_record_bytes
    rec = encode_mux_record_bytes(MuxRecord.control_msg(RankExit(1)), bytes.fromhex(SALT_HEX))
    return (encode_channel_magic() + rec * 3).hex().encode()


@pytest.mark.parametrize("args", _UNWRITABLE_STDOUT_ARGS, ids=lambda a: a[0])
def test_a_full_stdout_is_one_line_and_exit_1(args: tuple[str, ...]) -> None:
    with open("/dev/full", "wb") as full:
        res = subprocess.run([sys.executable, "-m", "flodl_proto", *args], stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=90,
                             input=_decode_input().decode() if args[0] == "decode" else "")
    assert res.returncode == 1, res.stderr
    prog = " ".join(args[:2]) if args[0] in ("vectors", "conform") else args[0]  # as argparse's
    _one_error_line(res.stderr,
                    f"flodl-proto {prog}: error: cannot write output: No space left on device")


class _FullDisk(io.RawIOBase):
    """A stdout whose every write fails as ``/dev/full`` does (ENOSPC)."""

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("decode", "--help"),
                                  ("vectors", "check", "--help")], ids=" ".join)
def test_help_and_version_on_a_full_stdout_are_one_line_and_exit_1(
        args: tuple[str, ...], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # argparse ignores its write errors: ``--help > /dev/full`` used to exit 0, writing nothing
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(_FullDisk())))
    code, _, err = _run_main(capsys, *args)
    # help is printed while parsing, before the command is known: its prefix is read from the
    # command line, as the one of a Ctrl-C then (it was "flodl-proto" for every command)
    prog = " ".join(["flodl-proto", *args[:-1]])
    assert (code, err) == (1, f"{prog}: error: cannot write output: No space left on device\n")


@pytest.mark.parametrize("filename", ["my vectors/x.json", b"my vectors/x.json",
                                      Path("my vectors/x.json")], ids=["str", "bytes", "path"])
def test_an_os_error_no_command_words_names_its_file_quoted(
        filename: str | bytes | Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``OSError`` naming a file that no command turned into a line of its own read
    ``my vectors/x.json: Permission denied``, the path bare where every other line about a path
    quotes it (``argument FILE: 'x.bin': No such file or directory``); a name in bytes read
    ``b'my vectors/x.json': ...``, a path object as its text."""
    from flodl_proto.commands import vectors

    def refused(args: Any) -> int:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), filename)

    monkeypatch.setattr(vectors, "_compare", refused)  # registered as each run builds its parser
    assert _run_main(capsys, "vectors", "compare", ".") == (
        1, "", "flodl-proto vectors compare: error: 'my vectors/x.json': Permission denied\n")


def _close_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("args", [*_UNWRITABLE_STDOUT_ARGS[:3], ("docs", "--out", "-"),
                                  ("conform", "docs", "--out", "-"), ("--help",),
                                  ("decode", "--help"), ("--version",)],
                         ids=" ".join)  # --help wrote its text to stderr
def test_a_closed_stdout_is_no_traceback(args: tuple[str, ...]) -> None:
    # started with ``>&-``: Python has no sys.stdout and print() writes nothing
    res = subprocess.run([sys.executable, "-m", "flodl_proto", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, timeout=90, preexec_fn=_close_stdout,
                         input=_decode_input().decode() if args[0] == "decode" else "")
    assert (res.returncode, res.stderr) == (0, "")


def test_controller_progress_lines_with_no_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    # ``flodl-proto controller ... >&-``: sys.stdout is None; the writer thread takes the lines
    from flodl_proto.commands._output import LineWriter

    failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    monkeypatch.setattr(sys, "stdout", None)
    lines = LineWriter("stdout", backlog=4)
    lines.put("relay 0 joined: host 'h0' ranks [0]")
    lines.start()
    lines.put("round 1: kind Model weight 1 bytes 8 ms 0.100")
    lines.close()
    assert (failures, lines.dropped, lines.broken) == ([], 0, False)


def test_a_rank_started_with_a_closed_stdout_runs_its_rounds() -> None:
    """``flodl-proto rank ... >&-``: the digest lines are taken, as print() takes them; the
    closed stdout was taken for a reader gone away and ended in a BrokenPipeError traceback."""
    with acked_rank("--rounds", "2", preexec=_close_stdout) as (p, conn):
        assert p.stderr is not None
        assert _echo_rounds(conn, 2) == 2
        err = p.stderr.read()
        rc = p.wait(timeout=60)
    assert (rc, err) == (0, "")


@pytest.mark.timeout(60)
def test_log_records_never_wait_for_an_unread_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    # a warning logged mid-round (the coordinator's round timeout, a rank's runner) while nobody
    # reads stderr (a full 4 KiB pipe): queued or dropped and counted, never blocking the caller;
    # on exit the waiting records are written once stderr is read, and the handler is restored
    import fcntl
    import logging

    from flodl_proto.commands._output import STDOUT_BACKLOG, LogLines, queued_stderr_logging

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    stderr = os.fdopen(write_end, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stderr", stderr)
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(
        lambda: os.read(read_end, 65536), b"")))
    n = 1000
    try:
        with queued_stderr_logging() as log_lines:
            try:
                assert handler not in root.handlers
                for i in range(n):  # returns without anyone reading stderr
                    logging.getLogger("flodl_proto.test").warning("round %d: relay late", i)
                assert log_lines.dropped > 0
            finally:
                reader.start()  # now stderr is read: the exit can write what waits
        assert handler in root.handlers
        assert not any(isinstance(h, LogLines) for h in root.handlers)
    finally:
        root.removeHandler(handler)
        stderr.close()
        reader.join(30)
        os.close(read_end)
    lines = b"".join(chunks).decode().splitlines()
    assert lines[0] == "WARNING flodl_proto.test: round 0: relay late"
    got = [int(ln.split()[3].rstrip(":")) for ln in lines]
    assert got == sorted(got) and len(got) + log_lines.dropped == n
    assert len(got) <= STDOUT_BACKLOG + 1 + 4096 // len(lines[0])


# -- item: --world-size beyond the handshake's u32 field, a non-finite --outer -----------------
@pytest.mark.parametrize("command,where", [
    ("controller", ["--listen", "127.0.0.1:0"]),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"]),
    ("rank", ["--relay", "127.0.0.1:1", "--rank", "0"]),
])
@pytest.mark.parametrize("world_size", ["0", "4294967296", "99999999999"])
def test_world_size_out_of_the_u32_range_is_a_usage_error(command: str, where: list[str],
                                                          world_size: str) -> None:
    res = _cli(command, *where, "--world-size", world_size, "--salt", SALT_HEX, timeout=30)
    assert res.returncode == 2, res.stderr
    _one_error_line(res.stderr, f"argument --world-size: must be in 1..4294967295 (the handshake's "
                                f"u32 field), got {world_size}")


@pytest.mark.parametrize(("outer", "field", "number"), [("nesterov:nan,0.9", "LR", "nan"),
                                                     ("slow-momentum:0.5,inf", "MU", "inf")])
def test_outer_with_a_non_finite_number_is_a_usage_error(outer: str, field: str,
                                                         number: str) -> None:
    res = _cli("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX,
               "--outer", outer, timeout=30)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    name = outer.partition(":")[0]
    assert res.stderr == (f"flodl-proto controller: error: argument --outer: {outer!r}: {field} "
                          f"{number!r} is not a finite number; expected {name}:LR,MU (two finite "
                          f"numbers)\n")


@pytest.mark.parametrize(("outer", "field", "number", "why"), [
    # Python's float() reads 10; the message says why it is refused
    ("nesterov:1_0,0.9", "LR", "1_0", " (a number is written in ASCII digits, without '_')"),
    # an Arabic-Indic zero: float() reads 0.9
    ("nesterov:0.5,\u0660.9", "MU", "\u0660.9",
     " (a number is written in ASCII digits, without '_')"),
    ("slow-momentum:0.5,", "MU", "", ""),
    ("slow-momentum:x,0.9", "LR", "x", ""),
])
def test_parse_outer_reads_numbers_as_upstream_does(outer: str, field: str, number: str,
                                                    why: str) -> None:
    from flodl_proto.commands.controller import parse_outer

    with pytest.raises(ValueError) as ei:
        parse_outer(outer)
    name = outer.partition(":")[0]
    assert str(ei.value) == (f"argument --outer: {outer!r}: {field} {number!r} is not a finite "
                             f"number{why}; expected {name}:LR,MU (two finite numbers)")


def test_parse_outer_accepts_plain_numbers_with_blanks_around_them() -> None:
    from flodl_proto.commands.controller import parse_outer
    from flodl_proto.reduce import NesterovMomentum, OuterAvg, SlowMomentum

    got = parse_outer(" nesterov: 1e-3 , .9 ")
    assert isinstance(got, NesterovMomentum) and (got.lr, got.mu) == (1e-3, 0.9)
    got = parse_outer("Slow-Momentum:+0.5,-1")
    assert isinstance(got, SlowMomentum) and (got.lr, got.mu) == (0.5, -1.0)
    assert isinstance(parse_outer("avg"), OuterAvg) and parse_outer(None) is None
    for bad in ("nesterov:1", "nesterov:1,2,3", "avg:1", "adam:1,2"):
        with pytest.raises(ValueError, match=r"^argument --outer: "):
            parse_outer(bad)


# -- item: a salt file is read no further than a salt could be (``--salt-file /dev/zero``) -------
@pytest.mark.parametrize("command,where,prefix", [
    ("controller", ["--listen", "127.0.0.1:0", "--world-size", "1"],
     "flodl-proto controller: error: "),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1"],
     "flodl-proto relay: error: "),
    ("rank", ["--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1"],
     "flodl-proto rank: error: "),
    ("decode", ["-"], "flodl-proto decode: error: "),
])
@pytest.mark.parametrize("big", ["file", "dev-zero"])
def test_a_salt_file_longer_than_a_salt_is_a_usage_error(command: str, where: list[str],
                                                         prefix: str, big: str,
                                                         tmp_path: Path) -> None:
    from flodl_proto.commands.relay import SALT_FILE_MAX_BYTES

    path = tmp_path / "salt.hex"
    path.write_text(SALT_HEX * 200)
    salt_file = str(path) if big == "file" else "/dev/zero"
    res = _cli(command, *where, "--salt-file", salt_file, timeout=30)
    assert res.returncode == 2, res.stderr
    assert res.stderr == (f"{prefix}argument --salt-file: {shown(salt_file)}: longer than "
                          f"{SALT_FILE_MAX_BYTES} bytes: not a session salt (32 hex digits, or 16 "
                          f"raw bytes)\n")


# -- item: FLODL_NET_TIMEOUT_SCALE (``1e308`` overflowed the controller's accept loop) -----------
@pytest.mark.parametrize("command,where", [
    ("controller", ["--listen", "127.0.0.1:0"]),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"]),
    ("rank", ["--relay", "127.0.0.1:1", "--rank", "0"]),
    ("demo", ["--no-progress"]),
])
@pytest.mark.parametrize("value,problem", [("1e308", "is out of range"),
                                           ("0.01", "is out of range"),
                                           ("nan", "is not finite"),
                                           ("soon", "is not a number")])
def test_an_invalid_net_timeout_scale_is_a_usage_error(command: str, where: list[str],
                                                       value: str, problem: str) -> None:
    """Checked before anything starts (the library alone would warn and use 1.0); checked
    first, so ``--world-size 0`` is not the error reported."""
    res = _cli(command, *where, "--world-size", "0", "--salt", SALT_HEX, timeout=30,
               env={"FLODL_NET_TIMEOUT_SCALE": value})
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert res.stderr == (f"flodl-proto {command}: error: FLODL_NET_TIMEOUT_SCALE={value!r} "
                          f"{problem}; expected a finite scale factor from 0.1 to 1000\n")


@pytest.mark.parametrize(("text", "problem"), [("1e308", "is out of range"),
                                               ("soon", "is not a number"),
                                               ("-inf", "is not finite")])
def test_check_net_timeout_scale_is_a_local_invalid_value(
        text: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.commands.relay import check_net_timeout_scale
    from flodl_proto.errors import InvalidValue, LocalProtocolError

    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", text)
    for call, field in ((lambda: check_net_timeout_scale(), "FLODL_NET_TIMEOUT_SCALE"),
                        (lambda: check_net_timeout_scale(text, field="-s"), "-s")):
        with pytest.raises(InvalidValue) as ei:
            call()
        e = ei.value
        assert isinstance(e, LocalProtocolError) and e.error_id == "timeout_scale.invalid"
        assert str(e) == (f"{field}={text!r} {problem}; expected a finite scale factor from 0.1 "
                          "to 1000")
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", " 2.5 ")
    assert check_net_timeout_scale() == 2.5
    assert check_net_timeout_scale("1000", field="-s") == 1000.0
    monkeypatch.delenv("FLODL_NET_TIMEOUT_SCALE")
    assert check_net_timeout_scale() == 1.0


@pytest.mark.parametrize("value,problem", [("1e308", "is out of range"),
                                           ("inf", "is not finite"),
                                           ("0", "is out of range"),
                                           ("x", "is not a number")])
def test_conform_timeout_scale_is_checked_as_the_variable_it_sets(
        value: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "conform", "controller", "--launch", "true {port}",
                               "--cases", "nothing.*", "--timeout-scale", value)
    assert (code, out) == (2, "")
    assert err == (f"flodl-proto conform controller: error: argument --timeout-scale: {value!r} "
                   f"{problem}; expected a finite scale factor from 0.1 to 1000\n")


# -- item: ``docs --out /dev/stdout`` printed its "written" line after the document ------------
@pytest.mark.skipif(not os.path.exists("/dev/stdout"), reason="no /dev/stdout")
@pytest.mark.parametrize("args", [("docs",), ("dissector",)])
def test_out_dev_stdout_holds_the_document_alone_as_out_dash(args: tuple[str, ...],
                                                             tmp_path: Path) -> None:
    dash = _cli(*args, "--out", "-", cwd=tmp_path)
    dev = _cli(*args, "--out", "/dev/stdout", cwd=tmp_path)
    assert (dev.returncode, dev.stderr) == (0, ""), dev.stderr
    assert dash.returncode == 0 and dash.stdout.startswith(("#", "--"))
    assert dev.stdout == dash.stdout


def test_a_file_out_still_says_written(tmp_path: Path) -> None:
    res = _cli("docs", "--out", str(tmp_path / "p.md"), cwd=tmp_path)
    size = (tmp_path / "p.md").stat().st_size
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout.startswith(f"{shown(str(tmp_path / 'p.md'))}: written ({size} bytes)")


@pytest.mark.parametrize("args", [("vectors", "export", ""), ("vectors", "check", ""),
                                  ("vectors", "compare", ""),
                                  ("vectors", "compare", ".", "--bundled", "")],
                         ids=["export", "check", "compare", "compare-bundled"])
def test_an_empty_vector_folder_is_a_usage_error(args: tuple[str, ...], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``Path("")`` is the current folder: ``vectors export ""`` wrote its files there."""
    monkeypatch.chdir(tmp_path)
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    if args[1] == "check":  # a folder or a file
        assert err.splitlines()[-1] == ("flodl-proto vectors check: error: argument PATH: is "
                                        "empty; give a vector folder or file (. for this folder)")
    else:
        assert err.splitlines()[-1] == (f"flodl-proto vectors {args[1]}: error: argument "
                                        f"{'--bundled' if '--bundled' in args else 'DIR'}: is "
                                        "empty; give a folder path (. for this one)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("host", ["", " ", "\t"])
def test_an_empty_relay_host_name_is_a_usage_error(host: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``relay --host "$HOST"`` with the variable unset announced an empty host name."""
    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", "0",
                               "--world-size", "1", "--salt", SALT_HEX, "--host", host)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (f"flodl-proto relay: error: argument --host: {host!r} is "
                                    "empty; give a host name, or leave the option out to "
                                    "announce this machine's host name")


@pytest.mark.parametrize(("args", "option", "hint"), [
    (("demo", "--salt-file", ""), "--salt-file", "give a path"),
    (("decode", ""), "FILE", "give a path"),
    (("decode", "--salt-file", "", "-"), "--salt-file", "give a path"),
    (("docs", "--spec", ""), "--spec", "give the folder holding wire.yaml"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt-file", ""),
     "--salt-file", "give a path"),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1",
      "--salt-file", ""), "--salt-file", "give a path"),
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX,
      "--checkpoint-dir", ""), "--checkpoint-dir", "give a path"),
], ids=lambda a: a[0] if isinstance(a, tuple) else None)
def test_an_empty_input_path_is_a_usage_error(args: tuple[str, ...], option: str, hint: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An empty path is the current folder to the OS: ``demo --salt-file ''`` said "Is a
    directory", ``docs --spec ''`` "cannot load wire.yaml"."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (f"flodl-proto {args[0]}: error: argument {option}: is empty; "
                                    f"{hint}")


# -- item: a salt file of raw bytes that is not 16 of them (counted as characters of Latin-1) ----
@pytest.mark.parametrize(("content", "got"), [
    (bytes([0xB5]) * 17, "17 bytes, byte 1 (0xb5) not ASCII (a raw salt file holds exactly 16 "
                         "bytes)"),
    (b"00" * 7 + b"\xff" * 3, "17 bytes, byte 15 (0xff) not ASCII (a raw salt file holds "
                              "exactly 16 bytes)"),
    (b"zz" * 16, "32 characters, character 1 ('z') not a hex digit"),  # text: as before
    # whitespace alone (16 raw line ends and one more; it said "got 0 characters"): its bytes
    (b"\n" * 17, "17 bytes, all whitespace (a raw salt file holds exactly 16 bytes)"),
    (b" \t\x1c\n", "4 bytes, all whitespace (a raw salt file holds exactly 16 bytes)"),
    (b"\n", "1 byte, all whitespace (a raw salt file holds exactly 16 bytes)"),
    (b"", "0 bytes (an empty file)"),
])
def test_a_salt_file_that_is_neither_hex_nor_16_raw_bytes_says_which_byte(
        content: bytes, got: str, tmp_path: Path) -> None:
    from flodl_proto.commands.relay import cli_salt

    path = tmp_path / "salt.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError) as e:
        cli_salt(None, str(path))
    assert str(e.value) == (f"argument --salt-file: {shown(str(path))}: session salt must be "
                            f"16 bytes written as 32 hex digits, got {got}")
    raw = bytes(range(240, 256))  # 16 raw bytes, none of them ASCII: the salt itself
    path.write_bytes(raw)
    assert cli_salt(None, str(path)) == raw


@pytest.mark.skipif(not Path("/dev/null").is_char_device(), reason="needs /dev/null")
def test_a_salt_file_that_is_a_device_of_no_bytes_says_what_it_is() -> None:
    """``--salt-file /dev/null`` was called an empty file: it is a character device."""
    from flodl_proto.commands.relay import cli_salt

    with pytest.raises(ValueError) as e:
        cli_salt(None, "/dev/null")
    assert str(e.value) == ("argument --salt-file: '/dev/null': session salt must be 16 bytes "
                            "written as 32 hex digits, got 0 bytes (a character device)")


def _ctrl_c_python(tmp_path: Path, step: str, signame: str = "INT") -> str:
    """An interpreter for ``fuzz/run.sh`` (``PYTHON``) that, when it runs the script's ``step``
    (``atheris``: the check that atheris is there; ``targets``: the listing of the targets),
    does what Ctrl-C does to it: SIGINT to its whole process group (the script's), then dies
    of it (or so with the signal ``signame``, ``TERM``: a SIGTERM to the group). Before the
    ``targets`` step, the check for atheris passes whether atheris is installed or not.
    Anything else is run by this interpreter."""
    pattern = {"atheris": "'import atheris'", "targets": "*'import TARGETS'*"}[step]
    atheris = ("" if step == "atheris" else
               "case \"$1 $2\" in -c\\ 'import atheris') exit 0 ;; esac\n")
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
{atheris}case "$1 $2" in -c\\ {pattern}) kill -{signame} 0; sleep 5; exit 1 ;; esac
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return str(python)


@pytest.mark.parametrize(("step", "args"), [
    ("atheris", ("handshake", "5")),
    ("atheris", ("all", "5")),
    ("atheris", ("ci",)),
    ("targets", ("handshake", "5")),
    ("targets", ("all", "5")),
    ("targets", ("ci",)),
    ("targets", ("replay", "handshake", "x.bin")),
    ("targets", ("minimize", "handshake", "x.bin")),
    ("targets", ("list",)),
])
def test_fuzz_ctrl_c_while_the_script_starts_is_an_interruption(step: str, args: tuple[str, ...],
                                                                tmp_path: Path) -> None:
    """Ctrl-C while the script checked for atheris said ``atheris is not installed`` (exit 2);
    while it listed the targets, ``all`` and ``ci`` ran no target and exited 0, a single target,
    replay and minimize said ``unknown target handshake`` (exit 2); ``list`` exited 130 without
    a line. Each is an interruption."""
    proc = _fuzz_stopped_at(step, args, tmp_path, "INT")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "fuzz/run.sh: interrupted\n")


def _fuzz_stopped_at(step: str, args: tuple[str, ...], tmp_path: Path,
                     sig: str) -> subprocess.CompletedProcess[str]:
    """``fuzz/run.sh ARGS`` (in a session of its own, from ``tmp_path``, beside an ``x.bin``)
    whose interpreter sends SIG to the script's process group at ``step`` (see
    :func:`_ctrl_c_python`)."""
    (tmp_path / "x.bin").write_bytes(b"x")
    return subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), *args], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, start_new_session=True,
                          env={**os.environ, "PYTHON": _ctrl_c_python(tmp_path, step, sig),
                               "FLODL_FUZZ_WORK": str(tmp_path / "work")})


@pytest.mark.parametrize(("step", "args"), [
    ("atheris", ("handshake", "5")),
    ("atheris", ("all", "5")),
    ("targets", ("ci",)),
    ("targets", ("replay", "handshake", "x.bin")),
    ("targets", ("minimize", "handshake", "x.bin")),
    ("targets", ("list",)),
])
def test_fuzz_sigterm_while_the_script_starts_is_terminated(step: str, args: tuple[str, ...],
                                                           tmp_path: Path) -> None:
    """A SIGTERM to the script's process group ended it as a Ctrl-C did (``interrupted``, exit
    130): it says ``terminated`` and exits 143 (128 + SIGTERM)."""
    proc = _fuzz_stopped_at(step, args, tmp_path, "TERM")
    assert (proc.returncode, proc.stdout, proc.stderr) == (143, "", "fuzz/run.sh: terminated\n")


#: a ``sitecustomize`` under which the interpreter, as it imports the fuzz targets, does what
#: Ctrl-C does to it: SIGINT to its whole process group (the script's), then waits for it
_CTRL_C_AT_TARGETS = """import os, signal, sys, time


class _CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "fuzz.harnesses":
            os.killpg(0, signal.SIGINT)
            time.sleep(5)
        return None


sys.meta_path.insert(0, _CtrlC())
"""


@pytest.mark.parametrize("args", [("list",), ("handshake", "5")])
def test_fuzz_ctrl_c_while_the_targets_load_prints_no_traceback(args: tuple[str, ...],
                                                                tmp_path: Path) -> None:
    """A Ctrl-C while the interpreter listed the targets (importing them takes about a second)
    was its ``KeyboardInterrupt`` traceback, then the script's line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_CTRL_C_AT_TARGETS)
    proc = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), *args], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, start_new_session=True,
                          env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(site),
                               "FLODL_FUZZ_WORK": str(tmp_path / "work")})
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "fuzz/run.sh: interrupted\n")


#: a ``sitecustomize`` under which the interpreter, as it opens the file ``$CTRL_C_AT_OPEN``,
#: does what Ctrl-C does to it: SIGINT to its whole process group (the script's), then waits
#: (or so with the signal ``$CTRL_C_SIGNAL``, ``SIGTERM``: a SIGTERM to the group)
_CTRL_C_AT_OPEN = """import os, signal, sys, time


def _ctrl_c(event, args):
    if event == "open" and args and args[0] == os.environ["CTRL_C_AT_OPEN"]:
        os.killpg(0, getattr(signal, os.environ.get("CTRL_C_SIGNAL", "SIGINT")))
        time.sleep(5)


sys.addaudithook(_ctrl_c)
"""


def test_fuzz_ctrl_c_while_minimize_reads_its_file_prints_no_traceback(tmp_path: Path) -> None:
    """A Ctrl-C while minimize looked whether FILE can be read was the interpreter's
    ``KeyboardInterrupt`` traceback, and the script ended with it, without its line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_CTRL_C_AT_OPEN)
    (tmp_path / "x.bin").write_bytes(b"x")
    proc = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), "minimize", "handshake",
                           "x.bin"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          start_new_session=True,
                          env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(site),
                               "CTRL_C_AT_OPEN": str(tmp_path / "x.bin"),
                               "FLODL_FUZZ_WORK": str(tmp_path / "work")})
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "fuzz/run.sh: interrupted\n")


@pytest.mark.parametrize(("signame", "code", "word"), [("SIGINT", 130, "interrupted"),
                                                     ("SIGTERM", 143, "terminated")])
def test_fuzz_a_stop_while_replay_runs_is_the_scripts_line(signame: str, code: int, word: str,
                                                           tmp_path: Path) -> None:
    """A Ctrl-C while replay read or ran its inputs was the interpreter's KeyboardInterrupt
    traceback, a SIGTERM the shell's ``Terminated``, and the script ended without its line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_CTRL_C_AT_OPEN)
    (tmp_path / "x.bin").write_bytes(b"x")
    proc = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), "replay", "handshake",
                           "x.bin"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          start_new_session=True,
                          env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(site),
                               "CTRL_C_AT_OPEN": str(tmp_path / "x.bin"),
                               "CTRL_C_SIGNAL": signame})
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, "", f"fuzz/run.sh: {word}\n")


@pytest.mark.parametrize("mode", [("handshake", "1"), ("all", "1"), ("ci",)],
                         ids=["target", "all", "ci"])
@pytest.mark.parametrize(("make", "reason"), [
    ("file", "File exists"),
    ("under_file", "Not a directory"),
], ids=["a-file", "under-a-file"])
def test_fuzz_work_folder_that_cannot_be_made_is_a_usage_error(
        mode: tuple[str, ...], make: str, reason: str, tmp_path: Path) -> None:
    """A work folder that cannot be created (a file in its place, or a path under a file) made
    every target's run a pile of ``mkdir``, redirection and ``grep`` errors and a ``FINDING
    (exit 1)`` (``ci`` found something in every target): nothing had run. It is one line
    naming the folder and the system's reason, exit 2, before any target runs."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    work = blocker if make == "file" else blocker / "work"
    res = _fuzz(*mode, env={"PYTHON": _stand_in_python(tmp_path), "FLODL_FUZZ_WORK": str(work)})
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", f"fuzz/run.sh: the work folder {work} cannot be used: {reason}\n")


@pytest.mark.parametrize("args", [("list",), ("--help",)], ids=["list", "help"])
def test_fuzz_output_that_cannot_be_written_is_one_line(args: tuple[str, ...]) -> None:
    """``list`` to a full disk ended in the interpreter's OSError traceback, ``--help`` in awk's
    own ``close failed`` line and exit 2 (a usage error). Either is one line, ``fuzz/run.sh:
    cannot write output: REASON``, exit 1, as the package's commands say it."""
    with open("/dev/full", "w") as full:
        res = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), *args], stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=60,
                             env={**os.environ, "PYTHON": sys.executable})
    assert (res.returncode, res.stderr) == (
        1, "fuzz/run.sh: cannot write output: No space left on device\n")


def test_fuzz_list_into_a_closed_pipe_is_quiet() -> None:
    """``fuzz/run.sh list | true`` printed the interpreter's BrokenPipeError traceback and
    exited 1; a reader that went away ends it quietly with 141 (128 + SIGPIPE), as a shell
    reports ``git log | true``."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the script writes
    try:
        res = subprocess.run(["bash", str(ROOT / "fuzz" / "run.sh"), "list"], stdout=write,
                             stderr=subprocess.PIPE, text=True, timeout=60,
                             env={**os.environ, "PYTHON": sys.executable})
    finally:
        os.close(write)
    assert (res.returncode, res.stderr) == (141, "")


@pytest.mark.parametrize(("salt", "got"), [
    ("0011223344556677 8899aabbccddeef", "got 32 characters, 31 hex digits"),
    ("0 0112233445566778899aabbccddeeff",
     "got 33 characters, 32 hex digits, a space inside a byte"),
    ("00 11 22", "got 8 characters, 6 hex digits"),
    ("abc", "got 3 characters"),
])
def test_salt_of_hex_digits_and_spaces_says_how_many_digits(
        salt: str, got: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A salt of hex digits and spaces only, not 16 bytes, was told by its character count
    alone: 31 digits and a space were ``got 32 characters`` against the 32 hex digits asked
    for, and 32 digits with a space inside a byte ``got 33 characters``. The count of hex
    digits follows (the digits themselves stay unsaid), and a space inside a byte is named."""
    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", "0",
                               "--world-size", "1", "--salt", salt)
    assert (code, out, err) == (2, "", "flodl-proto relay: error: argument --salt: session salt "
                                f"must be 16 bytes written as 32 hex digits, {got}\n")


@pytest.mark.parametrize("args", [
    ("controller", "--world-size", "1", "--listen", "127.0.0.1:0", "--salt", "00" * 16),
    ("vectors", "check"),
    ("decode", "--hex", os.devnull),
])
@pytest.mark.parametrize(("init", "reason"), [
    ("raise ImportError('numpy is broken here')\n", "cannot import numpy: numpy is broken here"),
    # a module NumPy imports is missing: NumPy, the dependency, is named, and the reason names
    # the missing module (it was named alone, a module the user never asked for)
    ("import numpy_part_that_is_missing\n",
     "cannot import numpy: No module named 'numpy_part_that_is_missing'"),
])
def test_a_numpy_that_fails_to_import_is_one_line(tmp_path: Path, args: tuple[str, ...],
                                                  init: str, reason: str) -> None:
    """A NumPy that fails to import (a broken package shadowing it on PYTHONPATH) ends the
    command with one line naming the module and the reason, exit 1, where it was Python's
    traceback."""
    shadow = tmp_path / "shadow" / "numpy"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(init)
    res = _cli(*args, env={"PYTHONPATH": str(tmp_path / "shadow")})
    prog = "flodl-proto " + " ".join(args[:2] if args[0] == "vectors" else args[:1])
    assert (res.returncode, res.stdout, res.stderr) == (1, "", f"{prog}: error: {reason}\n")

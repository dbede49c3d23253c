"""A command started with SIGINT ignored (a shell's background job: ``flodl-proto demo &`` in a
script, whose asynchronous commands get SIGINT ignored) keeps it ignored, as shells and Python
itself do: ``controller`` and ``relay`` run on through a SIGINT and still stop cleanly on SIGTERM
(they installed their own SIGINT handler anyway), and a demo runs all its rounds through SIGINTs
sent to its whole process group (the demo stopped on them, and so did its controller and relays,
whose terminal Ctrl-C the demo sets ignored)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from .cluster_util import FakeController
from .demo_procs import marked_demo, members

pytestmark = pytest.mark.timeout(180)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"


def _sigint_ignored() -> None:
    """Child setup: SIGINT ignored when the program starts, as a shell starts a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["controller", "relay"])
def test_controller_and_relay_started_with_sigint_ignored_keep_it_ignored(command: str) -> None:
    """SIGINT ignored at start: a SIGINT once the command runs changes nothing (it stopped the
    run cleanly, as a Ctrl-C), SIGTERM still stops it cleanly, exit 0, nothing on stderr."""
    with FakeController() as ctrl:  # the relay dials it only once its ranks have connected
        args = {"controller": ["--listen", "127.0.0.1:0", "--world-size", "2"],
                "relay": ["--controller", f"127.0.0.1:{ctrl.port}", "--ranks", "0",
                          "--world-size", "1", "--listen-port", "0"]}[command]
        proc = subprocess.Popen(
            [sys.executable, "-m", "flodl_proto.cli", command, *args, "--salt", SALT_HEX],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_sigint_ignored)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("listening on 127.0.0.1:")
            proc.send_signal(signal.SIGINT)
            with pytest.raises(subprocess.TimeoutExpired):  # stopped within 0.1 s before
                proc.wait(timeout=3.0)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert (proc.returncode, err) == (0, "")
    last = {"controller": "controller finished: clean (stop: signal)",
            "relay": "relay finished: clean (stop: stopped by a signal)"}[command]
    assert out.splitlines()[-1] == last


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_demo_started_with_sigint_ignored_runs_through_sigints_to_its_group() -> None:
    """SIGINT to the demo's whole process group, every 0.2 s from when its cluster runs to its
    end: the demo and its cluster go on, every round completes, exit 0, the usual verdict."""
    sent = 0
    with marked_demo("--world-size", "1", "--hosts", "1", "--payload-mib", "0", "--rounds", "150",
                     env={"FLODL_NET_TIMEOUT_SCALE": "1.0", "COLUMNS": "120"},
                     preexec_fn=_sigint_ignored) as (proc, marker):
        deadline = time.monotonic() + 120
        while len(members(marker)) < 3 and proc.poll() is None:  # controller, relay, rank
            assert time.monotonic() < deadline, "the cluster did not start"
            time.sleep(0.05)
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
                sent += 1
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    assert sent >= 1
    assert proc.returncode == 0, (out, err)
    assert "150 of 150 completed" in out
    assert out.splitlines()[-1].startswith("OK: every round completed"), out
    assert "interrupted" not in err and "Traceback" not in out + err

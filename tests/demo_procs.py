"""The demo run as a process of its own, in a session of its own, and its cluster's processes
found by a marker in their environment (``/proc``): the interrupt and failure tests start it
with :func:`marked_demo`, which leaves no process behind whatever the test body does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

_MEMBER_COMMANDS = (b"flodl_proto.cli\0controller\0", b"flodl_proto.cli\0relay\0",
                    b"flodl_proto.commands._demo_worker\0")


def marked(marker: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment carries ``marker``."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if marker.encode() in env and state != "Z":
                pids.append(int(d))
    return pids


def members(marker: str) -> list[int]:
    """Pids of the demo's cluster members (controller, relays, ranks) that have started their
    own program. A marked process is not enough: between ``fork`` and ``exec`` a child is a copy
    of the demo (its command line and environment), and while the kernel loads the new program
    its ``/proc/PID/environ`` reads empty, so a marked count can rise to 8 and drop back."""
    pids = []
    for pid in marked(marker):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if any(command in cmdline for command in _MEMBER_COMMANDS):
                pids.append(pid)
    return pids


def wait_for_members(proc: subprocess.Popen[str], marker: str, count: int,
                     within: float) -> list[int]:
    """The demo's running cluster members (:func:`members`) once ``count`` of them run, or what
    runs when the demo ends or ``within`` seconds pass first."""
    deadline = time.monotonic() + within
    while len(running := members(marker)) < count and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    return running


@contextlib.contextmanager
def marked_demo(*args: str, env: dict[str, str] | None = None,
                preexec_fn: Callable[[], None] | None = None
                ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``flodl-proto demo --no-progress ARGS`` in a session of its own (a signal to its process
    group reaches the demo and its cluster, as a terminal's Ctrl-C does), its stdout and stderr
    piped, ``env`` added to this environment with a fresh marker: yields the process and the
    marker. On leaving, a demo still running is killed and every marked process is SIGKILLed."""
    marker = f"FLODL_DEMO_TEST_{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flodl_proto.cli", "demo", "--no-progress", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, marker: "1", **(env or {})}, start_new_session=True,
        preexec_fn=preexec_fn)
    try:
        yield proc, marker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in marked(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

"""``flodl_proto._threads``: the threads the package starts block the stop signals (SIGINT,
SIGTERM, SIGHUP), so the kernel gives a process-directed stop signal to the main thread, where
CPython runs the Python handler; a main thread blocked in a system call is then interrupted at
once. Checked on the function itself and on the threads of running ``rank``, ``relay`` and
``controller`` processes (``SigBlk`` of ``/proc/PID/task/TID/status``), which still stop on
the signals as the README says."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flodl_proto._threads import STOP_SIGNALS, start_thread

from .cli_util import acked_rank
from .cluster_util import recv_exact, wait_until

pytestmark = pytest.mark.timeout(120)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"
_STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
#: the variables that set how many worker threads NumPy's OpenBLAS starts as it loads (one per
#: further core when none is set): left out of the processes' environment, so they start theirs
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")
#: the processes' environment: no read deadline ends a wait within the test (1200 s at scale
#: 10), OpenBLAS's worker threads as it starts them by default
_ENV = {**{k: v for k, v in os.environ.items() if k not in _BLAS_THREADS},
        "FLODL_NET_TIMEOUT_SCALE": "10"}


def _blocked(pid: int, tid: int) -> set[int]:
    """The stop signals thread ``tid`` of process ``pid`` blocks (its ``SigBlk`` mask)."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    (mask,) = (int(line.split()[1], 16) for line in status.splitlines()
               if line.startswith("SigBlk:"))
    return {s for s in _STOPS if mask >> (s - 1) & 1}


def _threads(pid: int) -> dict[int, set[int]]:
    """Every thread of ``pid`` but its main one, with the stop signals it blocks."""
    return {int(t): _blocked(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")
            if int(t) != pid}


def _asleep(pid: int) -> bool:
    """The main thread of ``pid`` waits in a system call (state S)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "S"


def _sigint_default() -> None:
    """In the child: SIGINT at its default, as in a terminal (a test run in the background of
    a shell without job control inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_start_thread_blocks_the_stop_signals_in_the_thread_only() -> None:
    assert STOP_SIGNALS == _STOPS
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen: dict[str, set[int]] = {}

    def inner() -> None:
        seen["inner"] = set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & _STOPS

    def outer() -> None:
        seen["outer"] = set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & _STOPS
        t = threading.Thread(target=inner)
        start_thread(t)  # from a thread that blocks them already: the same mask
        t.join()
        seen["outer after"] = set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & _STOPS

    t = threading.Thread(target=outer)
    start_thread(t)
    t.join()
    assert seen == {"outer": _STOPS, "inner": _STOPS, "outer after": _STOPS}
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    with pytest.raises(RuntimeError, match="threads can only be started once"):
        start_thread(t)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_a_signal_that_arrives_while_a_thread_starts_runs_its_handler_after() -> None:
    """The mask is set on the starting thread for the start: a SIGINT of that moment waits,
    pending, and its handler runs on this thread once the mask is put back."""
    ran: list[str] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: ran.append(
        threading.current_thread().name))
    try:
        t = threading.Thread(target=lambda: os.kill(os.getpid(), signal.SIGINT))
        start_thread(t)
        t.join()
        wait_until(lambda: ran, timeout=10)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ran == ["MainThread"]


#: run in a fresh interpreter: NumPy loaded by the statements ``sys.argv[1]``, noting the stop
#: signals blocked in the thread that loads its extension module (OpenBLAS's threads start there
#: and inherit its mask); prints those, the main thread's after, and those of every other thread
#: of the process
_NUMPY_AS_A_COMMAND_LOADS_IT = """
import importlib.abc, os, signal, sys
from pathlib import Path

STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
seen = []


def blocked():
    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []) if s in STOPS)


class Note(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy._core.multiarray":
            seen.append(blocked())
        return None


sys.meta_path.insert(0, Note())
exec(sys.argv[1])
others = set()
for tid in os.listdir("/proc/self/task"):
    if int(tid) != os.getpid():
        status = Path(f"/proc/self/task/{tid}/status").read_text()
        (mask,) = (int(x.split()[1], 16) for x in status.splitlines() if x.startswith("SigBlk:"))
        others.add(tuple(sorted(s for s in (1, 2, 15) if mask >> (s - 1) & 1)))
print(seen, blocked(), sorted(others))
"""


@pytest.mark.parametrize("load", [
    "from flodl_proto.cli import interrupts_held\nwith interrupts_held():\n    import numpy",
    "import flodl_proto.commands._demo_worker"], ids=["command", "demo-rank"])
def test_numpy_loads_for_a_command_with_the_stop_signals_blocked_on_its_thread(
        load: str) -> None:
    """OpenBLAS starts its worker threads (one per further core) as NumPy loads, on the thread
    that loads it: a command (in :func:`flodl_proto.cli.interrupts_held`) and a rank process
    of the demo load it on a thread that blocks the stop signals, so those threads block them
    too, and the main thread's mask is as before (none blocked)."""
    res = subprocess.run([sys.executable, "-c", _NUMPY_AS_A_COMMAND_LOADS_IT, load],
                         capture_output=True, text=True, env=_ENV, timeout=60,
                         preexec_fn=_sigint_default)
    others = "[]" if (os.cpu_count() or 1) == 1 else "[(1, 2, 15)]"
    assert (res.returncode, res.stdout, res.stderr) == (
        0, f"[[1, 2, 15]] [] {others}\n", "")


#: a process that loads NumPy (OpenBLAS kept to one thread, so it starts none), then the
#: compiled bf16 kernels, and runs each: prints its thread count before and after
_NUMBA_KERNELS_RUN = """
import os
import numpy as np
before = len(os.listdir("/proc/self/task"))
from flodl_proto.reduce import _kernels as K
assert K.set_kernel_backend("numba", min_elems=0) == "numba"
from flodl_proto.reduce import _jit as J
acc = np.zeros(1 << 16, np.float32)
bits = np.full(1 << 16, 0x3F80, np.uint16)
out = np.empty(1 << 16, np.uint16)
J.bf16_widen_first(acc, bits)
J.bf16_accumulate(acc, bits)
J.bf16_encode(acc, out)
J.bf16_finish(acc, out, np.float32(0.5), True)
J.bf16_scale(bits, out, np.float32(2.0))
print(before, len(os.listdir("/proc/self/task")), int(out[0]))
"""


def test_the_compiled_kernels_start_no_thread() -> None:
    """The numba kernels are compiled without ``parallel`` (no threading layer): loading and
    running them starts no thread, so there is no thread whose stop-signal mask the package
    would have to set (those it starts block them, :func:`start_thread`)."""
    env = {**_ENV, "OPENBLAS_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _NUMBA_KERNELS_RUN], capture_output=True,
                         text=True, env=env, timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, "1 1 16384\n", "")


@contextlib.contextmanager
def _waiting_rank(*args: str) -> Iterator[subprocess.Popen[str]]:
    """A ``flodl-proto rank`` (rank 0 of 1) whose relay is this test: it acks the handshake,
    reads the rank's first frame and never answers, so the rank waits for its consensus (the
    read deadline is 1200 s at scale 10). Yields the process once its main thread waits."""
    with acked_rank(*args, preexec=_sigint_default, env=_ENV) as (p, conn):
        n = int.from_bytes(recv_exact(conn, 4), "little")
        recv_exact(conn, n)  # round 1's frame: no consensus will come
        wait_until(lambda: _asleep(p.pid), timeout=30)
        yield p


@pytest.mark.parametrize(("signum", "code", "stderr"), [
    (signal.SIGINT, 130, "flodl-proto rank 0: interrupted\n"), (signal.SIGTERM, -15, "")])
def test_a_rank_waiting_for_its_consensus_takes_a_stop_on_its_main_thread(
        signum: int, code: int, stderr: str) -> None:
    """The rank's stdout and log writers let the kernel give them a process's Ctrl-C, which
    then waited for the consensus read to end (up to 120 s x scale: 12 s at scale 0.1, as an
    operator saw, SIGINT sent to the writer thread); they block it, so it interrupts the read
    on the main thread."""
    with _waiting_rank("--rounds", "3") as p:
        threads = _threads(p.pid)
        assert threads, "the rank has its writer threads"
        assert threads == dict.fromkeys(threads, _STOPS)
        p.send_signal(signum)
        out, err = p.communicate(timeout=30)
    assert (p.returncode, out, err) == (code, "", stderr)


def _listening(proc: subprocess.Popen[str]) -> str:
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("listening on "), line
    return line.split()[-1]


def test_a_cluster_s_threads_block_the_stop_signals_and_each_role_stops_as_documented(
        tmp_path: Path) -> None:
    """A controller, a relay and two ranks run rounds; every thread but the main one of each
    process blocks the stop signals. Then SIGTERM stops the controller cleanly (exit 0, its
    line), and Ctrl-C a second relay's run the same way."""
    salt = tmp_path / "salt.hex"
    salt.write_text(SALT_HEX + "\n")
    env = _ENV
    cmd = [sys.executable, "-m", "flodl_proto"]
    common = ["--world-size", "2", "--salt-file", str(salt)]
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([*cmd, *args, *common], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=_sigint_default)
        procs.append(p)
        return p

    try:
        for stop in (signal.SIGTERM, signal.SIGINT):
            procs.clear()
            ctl = start("controller", "--listen", "127.0.0.1:0")
            relay = start("relay", "--controller", _listening(ctl), "--ranks", "0,1",
                          "--host", "h0")
            port = _listening(relay)
            ranks = [start("rank", "--relay", port, "--rank", str(r), "--rounds", "100000",
                           "--interval", "0.05") for r in (0, 1)]
            for r in ranks:
                assert r.stdout is not None
                assert r.stdout.readline().startswith("round 1 digest ")
            for p in procs:
                threads = _threads(p.pid)
                assert threads and threads == dict.fromkeys(threads, _STOPS), p.args
            target = ctl if stop == signal.SIGTERM else relay
            target.send_signal(stop)
            out, err = target.communicate(timeout=60)
            assert target.returncode == 0, err
            if target is ctl:
                assert out.splitlines()[-1] == "controller finished: clean (stop: signal)"
            else:
                assert out.splitlines()[-1] == "relay finished: clean (stop: stopped by a " \
                                               "signal)"
            for p in procs:
                p.communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

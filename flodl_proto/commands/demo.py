"""``flodl-proto demo``: a real local cluster that trains a model through the protocol.

::

    flodl-proto demo [--world-size 4] [--hosts 2] [--rounds 40] [--payload-mib 1] [--bf16]
                     [--protocol-version 2|3] [--outer SPEC] [--kill-rank R@ROUND] [--seed S]
                     [--netns]

It starts the reference controller (port mux, port 0), one relay per host (port 0) and one process
per rank, all separate OS processes talking real TCP on loopback with real HMACs under a random
session salt, and trains a linear least-squares model whose optimum is known in closed form. Every
rank runs local SGD on its own shard; ranks take different numbers of local steps per round (so
realized-work weights differ, and some rounds have an idle rank), and each round the parameters are
averaged through the protocol (optionally through an outer optimizer at the controller). A progress
bar runs while it trains; then a summary table: rounds, median and 95th percentile round time, the
stage breakdown of the median Model reduce of the rounds completed (every process records its
stages, :mod:`flodl_proto.runner.stages`: rank send, relay deposits to HostFrame, controller last
HostFrame to Broadcast, relay fan-out, rank reply parsed, and the wire and wake-up gaps between
them; a rank the demo stops after a failure writes its records first, and a summary without a
breakdown says why), bytes moved on every leg, loss at start and end against the optimum, and the
consensus digest of every rank. A bf16 run too short for the compiled bf16 kernels to pay back their
loading in each process (the default one: :func:`~flodl_proto.commands._demo_sizes.cluster_kernels`)
runs its cluster on the NumPy kernels (``FLODL_PROTO_KERNELS=numpy``, the same bytes); a
``FLODL_PROTO_KERNELS`` set where the demo runs is passed on as it is.

Exit 0 only if every round completed, every rank holds the identical final consensus, and the
final loss is within the printed tolerance (1 %) of the target: the optimum's loss, or, when that
is higher, the loss the same number of rounds of the same schedule reaches computed in one
process without the network (:func:`~flodl_proto.commands._demo_worker.reference_loss`), so any
``--rounds`` >= 1 passes on a healthy cluster; a final loss above the start loss, or no number,
fails, also after a ``--kill-rank`` (the target comes from the same schedule, so a diverging
outer step would meet it). ``--outer`` takes ``avg``, ``slow-momentum:LR,MU`` or
``nesterov:LR,MU`` with LR > 0 and MU in [0, 1), each as a 32-bit float (the outer step's
precision) (:func:`~flodl_proto.commands._demo_sizes.check_outer`). With ``--kill-rank R@ROUND``
rank R's process is killed at round ROUND: its relay reports RankExit and the controller ends the
run cleanly; the demo then checks that every surviving rank holds the identical consensus of the
last completed round, reports it, and exits 0. When the controller or a relay exits with a
failure while ranks run (one killed before round 1 leaves its ranks, or the relays, retrying
its address for 30 s x ``FLODL_NET_TIMEOUT_SCALE``), one line says so and the demo stops its
cluster at once: the summary names that member first, and the members it stopped are not
counted as failures of their own. A controller or relay stopped by a signal the demo did not
send exits 0, as on a Ctrl-C of its own: its ``finished`` line names the stop, the demo stops
its cluster at once for it as for a failure (:func:`failed_members`), and a run that failed
names that member first. A member (the controller, a relay or a rank) stopped by SIGSTOP or
SIGTSTP (state ``T`` in /proc) for 5 s while ranks ran holds every round: one line says so and
the demo stops its cluster as for a failure (:class:`FrozenWatch`), where it waited 60 s
without an event before giving up; its stop sends SIGCONT after SIGTERM, so a stopped member
handles the SIGTERM too. A run that completed no round shows no target (``n/a``) and
no loss verdict. Exit 1 when a check fails, or before anything
starts when the cluster's expected peak memory (:func:`memory_need`) is above the machine's
available memory or a new ``--salt-file`` cannot be written (``cannot write the salt file
'PATH': WHY``, as the other commands' output files); 2 for a bad command line (a file where a
folder of a new ``--salt-file``'s path should be included, as the other output paths), 130 when
interrupted (Ctrl-C; the line says ``interrupted``), 143 when terminated (SIGTERM; the line
says ``terminated``) and 129 when hung up (a closed terminal's SIGHUP; the line says ``hung
up``): either way the demo sends SIGTERM to every process of its cluster at once and waits for
them first. A signal ignored when the demo started stays ignored, by the demo and its
cluster: SIGINT in a background job (``flodl-proto demo &`` in a script), SIGHUP under
``nohup``. The cluster's processes ignore
the terminal's Ctrl-C and hangup whatever the demo's start (the demo stops them itself). No child
process outlives the demo. Every process runs at the demo's ``--log-level``; at INFO or DEBUG
their log lines are copied to stderr as they come, each prefixed ``[NAME]``
(:mod:`flodl_proto.commands._demo_logs`).

With ``--netns`` the cluster runs in the network lab (:mod:`flodl_proto.netlab`): the controller in
a network namespace of its own at 198.18.0.1, each host's relay and ranks in one namespace per host
(198.18.0.10, .11, ...), joined by a bridge; relays reach the controller over real interfaces, ranks
reach their relay on the host's loopback. A line says when the lab starts (a few seconds before the
first member); the summary shows every host's address. This needs root and ``ip`` (iproute2: the
demo sets no ``tc`` or nftables rule); when the lab cannot run here the demo says why in one line
and how to run without it, and exits 1 (``flodl-proto demo: error: the network lab needs root
(network namespaces, veth); run without --netns to train the same cluster on loopback``): the
machine lacks it, the command line is not at fault. The namespaces are removed on every exit path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .._oserr import os_reason
from .._threads import start_thread
from ..cli import interrupts_held, note_stop, stop_outcome
from ..errors import ProtocolError, shown
from ..netlab import NetLab, unavailable_reason
from ..spec import DEFAULT_VERSION, KERNELS_ENV, SUPPORTED_VERSIONS
from . import _demo_logs
from ._demo_report import (
    SIGNAL_STOPS,
    TOLERANCE,
    Result,
    exit_words,
    member_name,
    model_rounds,
    report,
    stage_lines,
)
from ._demo_sizes import (
    DEMO_ROUNDS_MAX,
    DEMO_WORLD_MAX,
    SEED_MAX,
    check_memory,
    check_outer,
    check_payload_mib,
    cluster_kernels,
    memory_need,
    parse_kill,
    partition,
    payload_mib_max,
    payload_values,
    rank_frame_len,
)
from ._demo_watch import (
    _FROZEN,
    _FROZEN_LOOK,
    _STALL,
    FrozenWatch,
    StallClock,
    process_state,
)
from ._option_error import OptionError, option_message
from ._output import rich_console
from ._paths import input_path_problem, path_text
from ._salt import SaltNotWritten, SaltPathInTheWay, demo_salt
from ._waits import get_item, join_thread, wait_process
from .relay import (
    check_net_timeout_scale,
    real_number,
    whole_number,
)

if TYPE_CHECKING:  # NumPy, rich and the runners are imported when the demo runs
    from rich.console import Console


__all__ = ["TOLERANCE", "FrozenWatch", "StallClock", "failed_members", "interrupted_line",
           "memory_need", "model_rounds", "partition", "payload_mib_max", "payload_values",
           "process_state", "rank_frame_len", "read_last_lines", "register", "rounds_through",
           "stage_lines"]

#: seconds a member may take to start and print its listening line (the interpreter and NumPy
#: imports alone took over 30 s on a heavily loaded machine)
_START = 60.0
#: the network lab's tools for --netns: namespaces and veths (no rate cap, loss or partition)
_LAB_TOOLS = ("ip",)


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand.

    No upstream counterpart: upstream flodl has no demo.
    """
    p = sub.add_parser(
        "demo", help="train a model on a real local cluster (controller, relays, ranks)",
        description="Start a controller, H relays and W ranks as separate processes on "
        "loopback and train a least-squares model through the protocol.",
    )
    p.add_argument("--world-size", type=whole_number, default=4, metavar="W",
                   help=f"ranks (default 4, at most {DEMO_WORLD_MAX})")
    p.add_argument("--hosts", type=whole_number, default=2, metavar="H", help="relays (default 2)")
    p.add_argument("--rounds", type=whole_number, default=40,
                   help=f"training rounds (default 40, at most {DEMO_ROUNDS_MAX})")
    p.add_argument("--payload-mib", type=real_number, default=1.0, metavar="M",
                   help="extra f32 tensor of M MiB in every parameter frame (default 1)")
    p.add_argument("--bf16", action="store_true", help="parameters ride the wire as bf16")
    p.add_argument("--protocol-version", type=whole_number, choices=SUPPORTED_VERSIONS,
                   default=DEFAULT_VERSION, help="data-channel protocol version (default 2)")
    p.add_argument("--outer", default=None, metavar="SPEC",
                   help="outer optimizer at the controller: avg, slow-momentum:LR,MU or "
                   "nesterov:LR,MU (LR > 0, MU in [0, 1))")
    p.add_argument("--kill-rank", default=None, metavar="R@ROUND",
                   help="kill rank R's process at round ROUND (the run then ends cleanly; "
                   "needs --world-size 2 or more)")
    p.add_argument("--seed", type=whole_number, default=7,
                   help=f"dataset seed (default 7, at most {SEED_MAX})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--salt-file", default=None, metavar="PATH", type=path_text,
                   help="session salt file: read it when it exists, else write a random salt "
                   "there (mode 0600; missing folders created; exit 1 when it cannot be "
                   "written) and keep it, to decode captured traffic with tags checked")
    p.add_argument("--netns", action="store_true",
                   help="run the controller and every host in network namespaces of their own "
                   "joined by a bridge (198.18.0.0/15 addresses; needs root and ip)")
    p.set_defaults(func=run)


# -- child processes -----------------------------------------------------------------------------
def _preexec() -> None:  # pragma: no cover - runs in the child
    """Die with the demo: ask Linux to SIGKILL the child when its parent goes away; ignore the
    terminal's Ctrl-C and hangup (the demo handles them and stops its children itself, with
    SIGTERM: :meth:`_Cluster.stop`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[str]
    lines: queue.Queue[tuple[str, str | None]]
    readers: list[threading.Thread] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    #: its stdout ended, and every line of it was read from ``lines`` (:func:`read_last_lines`)
    out_ended: bool = False


class _Cluster:
    """The demo's child processes; :meth:`close` leaves none behind."""

    def __init__(self, salt_hex: str, trace: Path | None = None, echo: bool = False) -> None:
        from ..runner import stages

        self.echo = echo  # copy the children's stderr lines to ours (--log-level INFO, DEBUG)
        self.children: list[_Child] = []
        self.stopping = False  # set by :meth:`stop`: no child is started from then on
        self.events: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.env = dict(os.environ, FLODL_SESSION_SALT=salt_hex, PYTHONUNBUFFERED="1")
        self.env.pop(stages.ENV, None)
        if trace is not None:  # every child records its round stages there at exit
            self.env[stages.ENV] = str(trace)

    def spawn(self, name: str, args: Sequence[str], *, private: bool = False,
              stdin: bool = False, wrap: Callable[[list[str]], list[str]] | None = None
              ) -> _Child:
        """Start ``python -m <args>`` (passed through ``wrap`` when given, e.g. to run it in a
        network namespace); stdout lines go to a private queue (``private``) or the shared event
        queue, tagged with ``name``.

        Raises:
            RuntimeError: the cluster is stopping (:meth:`stop`).
        """
        if self.stopping:
            raise RuntimeError("interrupted")
        argv = [sys.executable, "-m", *args]
        proc = subprocess.Popen(
            wrap(argv) if wrap is not None else argv, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True, env=self.env,
            preexec_fn=_preexec if sys.platform.startswith("linux") else None,
        )
        q: queue.Queue[tuple[str, str | None]] = queue.Queue() if private else self.events
        child = _Child(name, proc, q)
        assert proc.stdout is not None and proc.stderr is not None
        child.readers = [
            threading.Thread(target=self._pump, args=(name, proc.stdout, q, private),
                             daemon=False, name=f"demo-out-{name}"),
            threading.Thread(target=self._collect, args=(name, proc.stderr, child.stderr,
                                                         self.echo),
                             daemon=False, name=f"demo-err-{name}"),
        ]
        for t in child.readers:
            start_thread(t)
        self.children.append(child)
        if self.stopping:  # stop() ran while it started, before it was listed
            self._terminate(child)
        return child

    @staticmethod
    def _pump(name: str, stream: IO[str], q: queue.Queue[tuple[str, str | None]],
              private: bool) -> None:
        # a private queue (the controller's, a relay's) is read at the start and the end
        # only: it takes the first line and the last lines the demo reads (a line per round
        # of the controller would pile up there, a million rounds' worth in a long run)
        first = True
        for line in stream:
            if not private or first or line.startswith(_LAST_LINES):
                q.put((name, line.rstrip("\n")))
            first = False
        q.put((name, None))

    @staticmethod
    def _collect(name: str, stream: IO[str], sink: list[str], echo: bool) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))
            del sink[:-50]
            if echo:
                _demo_logs.show(name, sink[-1])

    @staticmethod
    def first_line(child: _Child, timeout: float) -> str:
        """The child's first stdout line (its ``listening on ...``), waited for in steps of
        :data:`._waits.WAIT_STEP` seconds (as its exit when it ends before it: a signal's
        handler runs at once, whichever thread the kernel gave the signal to).

        Raises:
            RuntimeError: it exited or stayed silent for ``timeout`` seconds.
        """
        try:
            _, line = get_item(child.lines, timeout)
        except queue.Empty:
            raise RuntimeError(f"{child.name} printed nothing within {timeout:g}s") from None
        if line is None:  # its exit status is reported with the others' (:func:`_exited`)
            wait_process(child.proc)
            err = "\n".join(child.stderr[-5:])
            raise RuntimeError(f"{child.name} exited before listening" + (f": {err}" if err
                                                                          else ""))
        return line

    def kill(self, child: _Child) -> None:
        """SIGKILL one child."""
        with contextlib.suppress(ProcessLookupError):
            child.proc.kill()

    def stop(self) -> None:
        """Send SIGTERM to every child still running and start no other (:meth:`spawn` raises):
        the demo was interrupted. The controller and relays stop cleanly on it, as on a Ctrl-C
        of their own (they ignore the terminal's, :func:`_preexec`), and the ranks end by it.
        Safe in a signal handler (only signals are sent); :meth:`close` still reaps them."""
        self.stopping = True
        for c in list(self.children):
            self._terminate(c)

    @staticmethod
    def _terminate(child: _Child) -> None:
        """SIGTERM, then SIGCONT: a child stopped by a signal (SIGSTOP, SIGTSTP) handles the
        SIGTERM too, where it waited for :meth:`close`'s SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            child.proc.terminate()
            child.proc.send_signal(signal.SIGCONT)

    def close(self, grace: float = 5.0) -> None:
        """Wait ``grace`` seconds for children to exit, then terminate / kill the rest; join
        the reader threads. Every wait is timed or in steps of :data:`._waits.WAIT_STEP`
        seconds, so the demo's handler of a signal the kernel gave another thread runs at
        once."""
        deadline = time.monotonic() + grace
        for c in self.children:
            left = max(0.0, deadline - time.monotonic())
            try:
                c.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                c.proc.terminate()
        for c in self.children:
            try:
                c.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                wait_process(c.proc)
            if c.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    c.proc.stdin.close()
        for c in self.children:
            for t in c.readers:
                join_thread(t)
            for s in (c.proc.stdout, c.proc.stderr):
                if s is not None:
                    s.close()


def _addr_of(line: str, what: str) -> str:
    prefix = "listening on "
    if not line.startswith(prefix):
        raise RuntimeError(f"{what}: expected '{prefix}HOST:PORT', got {line!r}")
    return line[len(prefix):].strip()


# -- the run -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Run the demo; return the exit code."""
    try:
        check_net_timeout_scale()  # the cluster's processes inherit it
        kill = parse_kill(args.kill_rank)
        if not 1 <= args.world_size <= DEMO_WORLD_MAX:
            raise OptionError("--world-size", f"must be in 1..{DEMO_WORLD_MAX} for the demo "
                             f"(a process per rank on this machine), got {args.world_size}")
        if not 1 <= args.hosts <= args.world_size:
            raise OptionError("--hosts", f"must be in 1..{args.world_size} (at most "
                             f"--world-size), got {args.hosts}")
        if not 1 <= args.rounds <= DEMO_ROUNDS_MAX:
            raise OptionError("--rounds", f"must be in 1..{DEMO_ROUNDS_MAX} for the demo (it "
                             f"also trains that many rounds in this process, for the reference "
                             f"loss), got {args.rounds}")
        check_payload_mib(args.payload_mib, args.bf16)
        if not 0 <= args.seed <= SEED_MAX:  # NumPy's generators take no negative seed
            raise OptionError("--seed", f"must be in 0..{SEED_MAX} (a 128-bit seed), got "
                             f"{args.seed}")
        check_outer(args.outer)
        if kill is not None and not (0 <= kill[0] < args.world_size
                                     and 1 <= kill[1] <= args.rounds):
            bad = (f"rank {kill[0]}" if not 0 <= kill[0] < args.world_size
                   else f"round {kill[1]}")
            raise OptionError("--kill-rank", f"{shown(args.kill_rank)}: R must be in "
                             f"0..{args.world_size - 1} (a rank of --world-size {args.world_size}) "
                             f"and ROUND in 1..{args.rounds} (--rounds), got {bad}")
        if kill is not None and args.world_size == 1:  # the summary compares the survivors'
            # consensus: with none, it ended in an IndexError traceback
            raise OptionError("--kill-rank", f"{shown(args.kill_rank)}: --world-size 1 leaves "
                             "no rank to survive the kill (the demo checks that the survivors "
                             "hold one consensus); give --world-size 2 or more")
    except (ValueError, ProtocolError) as e:
        print(f"flodl-proto demo: error: {e}", file=sys.stderr)
        return 2
    try:
        check_memory(args.payload_mib, args.world_size, args.hosts)
    except MemoryError as e:
        print(f"flodl-proto demo: error: {e}", file=sys.stderr)
        return 1
    if args.netns:
        reason = unavailable_reason(_LAB_TOOLS)
        if reason is not None:  # this machine, not the command line: exit 1, as the README says
            print(f"flodl-proto demo: error: {reason}; run without --netns to train the same "
                  "cluster on loopback", file=sys.stderr)
            return 1
    try:
        salt_hex, salt_note = demo_salt(args.salt_file)
    except SaltPathInTheWay as e:
        print(f"flodl-proto demo: error: {option_message('--salt-file', e.why)}",
              file=sys.stderr)
        return 2
    except SaltNotWritten as e:  # as the other commands' output files: exit 1
        print(f"flodl-proto demo: error: cannot write the salt file "
              f"{shown(args.salt_file)}: {os_reason(e.error)}", file=sys.stderr)
        return 1
    except (OSError, ProtocolError) as e:  # the path quoted, as every input path's line
        why = (input_path_problem(args.salt_file, e) if isinstance(e, OSError)
               else f"{shown(args.salt_file)}: {e}")
        print(f"flodl-proto demo: error: {option_message('--salt-file', why)}",
              file=sys.stderr)
        return 2
    console = rich_console()  # here: usage errors skip rich
    console.print(salt_note, markup=False, highlight=False, soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="flodl-demo-") as tmp:
        trace = Path(tmp) / "stages.tsv"
        with interrupts_held():  # NumPy and the codec load here: Ctrl-C after, as one line
            groups = partition(args.world_size, args.hosts)
            cluster = _Cluster(salt_hex, trace, _demo_logs.echoes(args.log_level))  # none started
            # the summary's module (the dataset, the in-process reference: the codec and the
            # reduce with it; a bf16 run's roundings are integer ops, without ml_dtypes)
            from . import _demo_worker  # noqa: F401
            kernels = cluster_kernels(args.bf16, args.payload_mib, args.rounds)
            if kernels is not None and not os.environ.get(KERNELS_ENV):
                cluster.env[KERNELS_ENV] = kernels
        return _run_cluster(args, console, groups, kill, cluster, trace)


def interrupted_line(done: int, rounds: int, word: str = "interrupted") -> str:
    """The line a demo stopped by a signal prints: ``word`` (``interrupted`` after Ctrl-C,
    ``terminated`` after SIGTERM, ``hung up`` after a closed terminal's SIGHUP:
    :func:`~flodl_proto.cli.stop_outcome`)
    and how many of its ``rounds`` the whole world completed (``done``), or that all of them
    had, when the signal came between the last round and the report. Raises nothing.

    Upstream: none (the demo is this package's).
    """
    when = (f"after all {rounds} rounds, before its report" if done >= rounds
            else f"after {done} of {rounds} rounds")
    return f"flodl-proto demo: {word} {when}; the cluster was stopped"


def _run_cluster(args: argparse.Namespace, console: Console, groups: list[list[int]],
                 kill: tuple[int, int] | None, cluster: _Cluster, trace: Path) -> int:
    """Run the cluster, read the stage trace its processes wrote to ``trace``, report."""
    from ..runner import stages

    res = Result()
    stop = threading.Event()
    # Ctrl-C, SIGTERM and a closed terminal, each unless ignored when the demo started (SIGINT
    # in a background job, SIGHUP under nohup): it stays so, for the demo and its cluster
    signums = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(s) is not signal.SIG_IGN]

    def interrupted(signum: int, frame: object) -> None:
        note_stop(signum)  # SIGTERM: "terminated", 143; SIGHUP: "hung up", 129; Ctrl-C: 130
        stop.set()
        cluster.stop()  # the cluster ends now, wherever the demo waits

    old = {s: signal.signal(s, interrupted) for s in signums} \
        if threading.current_thread() is threading.main_thread() else {}
    t_start = time.perf_counter()
    try:
        if args.netns:  # a few seconds (more on a busy machine) before the first member
            console.print(f"starting the network lab: {args.hosts + 1} network namespaces and "
                          "a bridge", markup=False, highlight=False, soft_wrap=True)
            res.lab = NetLab(args.hosts, _LAB_TOOLS).start()
        _drive(args, console, cluster, groups, kill, res, stop)
    except RuntimeError as e:  # LabError included
        res.problems.append(str(e))
        if res.exited_first is None:  # what exits from now on is stopped by the demo
            res.exited_first = _exited(cluster)
    finally:
        cluster.close(grace=0.0 if res.problems or stop.is_set() else 10.0)
        if res.lab is not None:
            res.lab.close()
        for s, h in old.items():
            signal.signal(s, h)
        res.wall = time.perf_counter() - t_start
    try:  # written by every child at its exit (a rank also when the demo stops it)
        records = stages.read_trace(trace) if trace.exists() else []
        res.traced_roles = {r.role for r in records}
        res.stages = stages.breakdown(records)
    except (OSError, ValueError) as e:
        res.problems.append(f"stage trace unreadable: {os_reason(e)}")
    if stop.is_set():
        done = sum(1 for k in res.rounds if len(res.rounds[k]) == args.world_size)
        word, code = stop_outcome()
        print(interrupted_line(done, args.rounds, word), file=sys.stderr, flush=True)
        return code
    for c in cluster.children:
        rc = c.proc.returncode
        if res.exited_first is not None:  # the demo stopped the rest: their status is its stop
            if c.name not in res.exited_first:
                continue
            rc = res.exited_first[c.name]
        if c.name.startswith("relay"):
            res.relay_rc[c.name] = rc
        elif c.name == "controller":
            res.controller_rc = rc
    return report(args, console, groups, kill, res, cluster)


def rounds_through(rounds: dict[int, dict[int, Any]], ranks: int, since: int,
                   total: int) -> int:
    """The last round ``k`` such that every round from 1 to ``k`` has at least ``ranks``
    reports in ``rounds`` (the demo's ``round`` events, by round then rank), given that every
    round up to ``since`` has (it stays so: reports are only added, and the count of running
    ranks only falls); at most ``total``. Only the rounds after ``since`` are read, so a run's
    bookkeeping costs the same at round 10 as at round 100000 (a scan from round 1 at every
    event made the demo fall behind a fast cluster, by 20 s after a thousand rounds). Raises
    nothing. Upstream: none (the demo is this package's)."""
    k = since
    while k < total and len(rounds.get(k + 1, ())) >= ranks:
        k += 1
    return k


def _exited(cluster: _Cluster) -> dict[str, int]:
    """The exit status of every controller and relay of ``cluster`` that has exited, by name
    (the ranks are not included). Raises nothing."""
    out = {}
    for c in cluster.children:
        if c.name == "controller" or c.name.startswith("relay"):
            rc = c.proc.poll()
            if rc is not None:
                out[c.name] = rc
    return out


#: the lines of the controller and the relays read after their first (:func:`read_last_lines`):
#: a relay's stats, and how each ended
_LAST_LINES = ("relay stats ", "relay finished: ", "controller finished: ")


def read_last_lines(child: _Child, res: Result, wait: float) -> bool:
    """Read the lines a controller or relay ``child`` printed after its ``listening on`` line
    into ``res``: a relay's stats (``res.relay_stats``) and how it ended (its ``finished:``
    line, ``res.finished``); other lines (the controller's round lines) are passed over. Waits
    up to ``wait`` seconds for each line (0: only the lines already read from the process).
    Returns whether its stdout ended (at once when an earlier call read its end). Raises
    nothing. Upstream: none (the demo is this package's)."""
    while not child.out_ended:
        try:
            _, line = get_item(child.lines, wait) if wait > 0 else child.lines.get_nowait()
        except queue.Empty:
            return False
        if line is None:
            child.out_ended = True
            break
        if line.startswith(_LAST_LINES[0]):
            res.relay_stats[child.name] = {
                k: int(v) for k, v in (p.split("=") for p in line.split()[2:])}
        elif line.startswith(_LAST_LINES[1:]):
            res.finished[child.name] = line.split(": ", 1)[1]
    return True


def failed_members(cluster: _Cluster, res: Result) -> list[str]:
    """The controller and relays of ``cluster`` that have exited with a failure status, or
    with 0 after a stop by a signal (their ``finished:`` line, read here into ``res`` as it
    comes: one stopped so before the ranks connected leaves them, or the relays, retrying its
    address for 30 s), by name in start order. Raises nothing. Upstream: none."""
    out = []
    for c in cluster.children:
        if c.name != "controller" and not c.name.startswith("relay"):
            continue
        rc = c.proc.poll()
        if rc is None:
            continue
        read_last_lines(c, res, 0.0)
        if rc != 0 or res.finished.get(c.name, "").endswith(SIGNAL_STOPS):
            out.append(c.name)
    return out


def _drive(args: argparse.Namespace, console: Console, cluster: _Cluster,
           groups: list[list[int]], kill: tuple[int, int] | None, res: Result,
           stop: threading.Event) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    w = args.world_size
    lab = res.lab

    def place(node: int | None) -> Callable[[list[str]], list[str]] | None:
        """Run in the lab's controller namespace (None) or host ``node``'s; no lab: as is."""
        if lab is None:
            return None
        where = lab.controller if node is None else lab.hosts[node]
        return lambda argv: lab.argv(where, argv)

    listen = f"{lab.controller.address}:0" if lab is not None else "127.0.0.1:0"
    level = _demo_logs.level_name(args.log_level)  # every process's level
    ctrl_args = ["flodl_proto.cli", "controller", "--listen", listen, "--world-size", str(w),
                 "--protocol-version", str(args.protocol_version), "--log-level", level]
    if args.outer:
        ctrl_args += ["--outer", args.outer]
    ctrl = cluster.spawn("controller", ctrl_args, private=True, wrap=place(None))
    ctrl_addr = _addr_of(cluster.first_line(ctrl, _START), "controller")
    relay_addr: dict[int, str] = {}
    relays = []
    for h, ranks in enumerate(groups):
        r = cluster.spawn(f"relay{h}", [
            "flodl_proto.cli", "relay", "--controller", ctrl_addr, "--ranks",
            ",".join(map(str, ranks)), "--world-size", str(w), "--listen-port", "0",
            "--protocol-version", str(args.protocol_version), "--host", f"demo-host{h}",
            "--log-level", level,
        ], private=True, wrap=place(h))
        relays.append(r)
    for h, (r, ranks) in enumerate(zip(relays, groups, strict=True)):
        addr = _addr_of(cluster.first_line(r, _START), f"relay{h}")
        for rank in ranks:
            relay_addr[rank] = addr
    console.print(f"controller listening on {ctrl_addr} (relay <-> controller traffic: decode "
                  "--leg mux)", markup=False, highlight=False, soft_wrap=True)
    for h, ranks in enumerate(groups):
        console.print(f"relay{h} listening on {relay_addr[ranks[0]]} for ranks "
                      f"{','.join(map(str, ranks))} (rank <-> relay traffic: decode --leg "
                      "loopback)", markup=False, highlight=False, soft_wrap=True)
    host_of = {rank: h for h, ranks in enumerate(groups) for rank in ranks}
    workers = {}
    for rank in range(w):
        cfg = {"rank": rank, "world_size": w, "seed": args.seed, "rounds": args.rounds,
               "relay": relay_addr[rank], "version": args.protocol_version, "bf16": args.bf16,
               "payload_values": payload_values(args.payload_mib), "log_level": level,
               "kill_round": kill[1] if kill and kill[0] == rank else None}
        workers[rank] = cluster.spawn(f"rank{rank}", [
            "flodl_proto.commands._demo_worker", json.dumps(cfg)], stdin=True,
            wrap=place(host_of[rank]))

    alive = set(range(w))
    progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        console=console, disable=args.no_progress, transient=False)
    with progress:
        task = progress.add_task("rounds", total=args.rounds, info="")
        done_min = 0
        stall = StallClock(time.monotonic())
        next_watch = 0.0
        frozen = FrozenWatch(_FROZEN)
        next_look = 0.0
        while alive:
            if stop.is_set():
                raise RuntimeError("interrupted")
            if (res.exited_first is None and not cluster.stopping
                    and time.monotonic() >= next_watch):
                # the controller or a relay that fails leaves ranks waiting for it (a rank
                # retries its relay's address for 30 s x FLODL_NET_TIMEOUT_SCALE, a relay the
                # controller's): stop the cluster now, the summary names that member first
                next_watch = time.monotonic() + 0.2
                failed = failed_members(cluster, res)
                if failed:
                    exited = res.exited_first = _exited(cluster)
                    res.stopped_ranks = set(alive)
                    cluster.stop()
                    rc = exited[failed[0]]
                    how = exit_words(rc) if rc else "was stopped by a signal"
                    progress.console.print(
                        f"{failed[0]} {how} while ranks ran: stopping the cluster",
                        markup=False, highlight=False, soft_wrap=True)
                elif time.monotonic() >= next_look:
                    # a member stopped by a signal holds every round without exiting: stop the
                    # cluster once it stayed so for _FROZEN s, not after _STALL s without events
                    next_look = time.monotonic() + _FROZEN_LOOK
                    held = frozen.look({c.name: process_state(c.proc.pid)
                                        for c in cluster.children if c.proc.poll() is None},
                                       time.monotonic())
                    if held is not None:
                        why = (f"{member_name(held)} was frozen (stopped by SIGSTOP or SIGTSTP, "
                               f"process state T) for {_FROZEN:g}s while ranks ran")
                        res.problems.append(why)
                        res.frozen = held
                        res.exited_first = _exited(cluster)
                        res.stopped_ranks = set(alive)
                        cluster.stop()
                        progress.console.print(f"{why}: stopping the cluster", markup=False,
                                               highlight=False, soft_wrap=True)
            try:
                name, line = cluster.events.get(timeout=0.2)
            except queue.Empty:
                if stall.stalled(time.monotonic()):
                    raise RuntimeError(f"no progress for {_STALL:g}s; giving up") from None
                continue
            stall.event(time.monotonic())
            rank = int(name[4:])
            if line is None:
                alive.discard(rank)
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = ev.get("ev")
            if kind == "round":
                res.rounds.setdefault(int(ev["round"]), {})[rank] = ev
                through = rounds_through(res.rounds, len(alive), done_min, args.rounds)
                if through > done_min:
                    done_min = through
                    r0 = res.rounds[done_min]
                    loss = next(iter(r0.values()))["loss"]
                    progress.update(task, completed=done_min, info=f"loss {loss:.5f}")
            elif kind == "kill-me":
                cluster.kill(workers[rank])
                res.killed = rank
                progress.console.print(f"killed rank {rank} at round {ev['round']}")
            elif kind in ("done", "ended"):
                res.final[rank] = ev
            elif kind == "error":
                raise RuntimeError(f"rank {rank} failed: {ev.get('error')}")
    # every rank is gone: the relays and the controller end on their own
    for c in [*relays, ctrl]:
        try:
            c.proc.wait(timeout=15.0)
        except subprocess.TimeoutExpired:
            res.problems.append(f"{c.name} did not exit after the ranks left")
    # what they printed last: the relays' stats, and how each ended (the controller's round
    # lines before its own are passed over)
    for c in [*relays, ctrl]:
        read_last_lines(c, res, 2.0)

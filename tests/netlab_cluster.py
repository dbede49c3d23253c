"""A cluster in the network lab for tests: the controller in the lab's controller namespace,
one relay per host namespace, the ranks (:mod:`tests.netlab_worker`) beside their relay; and the
consensus every round must produce, computed independently in this process."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from flodl_proto.codec import Dtype, RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.netlab import NetLab, Node
from flodl_proto.reduce import bf16_from_f32, reduce_realized_work, sum_frames

from .netlab_worker import lab_arrays, lab_mass

ROOT = Path(__file__).resolve().parent.parent
SALT = bytes.fromhex("9e3779b97f4a7c15f39cc0605cedc834")
#: seconds a test waits for one event of the cluster before it fails
EVENT_TIMEOUT = 60.0


def sent_frame(rank: int, k: int, version: int, bf16: bool, elems: int) -> RoundFrame:
    """The frame rank ``rank`` sends in round ``k`` (as :class:`RankClient` builds it)."""
    mass = lab_mass(rank, k)
    wire = Dtype.BF16 if bf16 else Dtype.F32
    ts = []
    for a in lab_arrays(rank, k, elems):
        if mass == 0.0 and version >= 3:
            ts.append(TensorPayload.elide(wire, a.shape))
        else:
            scaled = a * np.float32(mass)
            data = bf16_from_f32(scaled).tobytes() if bf16 else scaled.tobytes()
            ts.append(TensorPayload(wire, a.shape, data))
    return RoundFrame(RoundKind.MODEL, mass, ts)


def expected_round(groups: Sequence[Sequence[int]], k: int, version: int, bf16: bool,
                   elems: int) -> tuple[str, float]:
    """``(sha256 of the consensus frame, weight)`` of round ``k`` when the ranks of ``groups``
    (one list per host still expected; empty lists are skipped) take part."""
    folds = [sum_frames([sent_frame(r, k, version, bf16, elems) for r in g], version=version)
             for g in groups if g]
    consensus = reduce_realized_work(folds, version=version)
    raw = encode_round_frame_bytes(consensus, SALT)
    return hashlib.sha256(raw).hexdigest(), consensus.weight


@dataclass
class Proc:
    """One process of the cluster and what it printed (lines with their arrival time)."""

    name: str
    popen: subprocess.Popen[str]
    out: queue.Queue[tuple[float, str | None]] = field(default_factory=queue.Queue)
    lines: list[tuple[float, str]] = field(default_factory=list)
    err: list[tuple[float, str]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    eof: bool = False

    def next_line(self, timeout: float = EVENT_TIMEOUT) -> str | None:
        """The next stdout line (None at end of stream).

        Raises:
            TimeoutError: nothing within ``timeout`` seconds.
        """
        if self.eof:
            return None
        try:
            t, line = self.out.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no output within {timeout:g}s; stderr: "
                               f"{self.stderr()[-800:]}") from None
        if line is None:
            self.eof = True
        else:
            self.lines.append((t, line))
        return line

    def stdout(self, timeout: float = EVENT_TIMEOUT) -> str:
        """Everything printed on stdout, once the stream has closed (waits for the end)."""
        while self.next_line(timeout) is not None:
            pass
        return "\n".join(line for _, line in self.lines)

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.err)

    def wait(self, timeout: float = EVENT_TIMEOUT) -> int:
        return self.popen.wait(timeout=timeout)


class LabCluster:
    """Controller + relays + ranks of one run in ``lab``.

    Args:
        lab: a started :class:`NetLab` with at least ``len(groups)`` hosts.
        groups: the ranks of each host (host ``i`` runs relay ``i``).
        version, bf16, rounds, elems: the ranks' protocol version, wire dtype, rounds and
            large-tensor elements.
        gate: ranks wait for :meth:`go` before each round.
        scale: ``FLODL_NET_TIMEOUT_SCALE`` of every process (default: this process's, else 0.1).
        controller_args, relay_args: extra command-line arguments.
    """

    def __init__(self, lab: NetLab, groups: list[list[int]], *, version: int = 2,
                 bf16: bool = False, rounds: int = 3, elems: int = 1 << 12, gate: bool = False,
                 controller_args: Sequence[str] = (), relay_args: Sequence[str] = (),
                 scale: float | None = None) -> None:
        self.lab = lab
        self.groups = groups
        self.world = sum(len(g) for g in groups)
        self.version, self.bf16, self.rounds, self.elems = version, bf16, rounds, elems
        self.gate = gate
        self.controller_args = list(controller_args)
        self.relay_args = list(relay_args)
        self.procs: dict[str, Proc] = {}
        self.port = 0
        self.env = dict(os.environ, FLODL_SESSION_SALT=SALT.hex(), PYTHONUNBUFFERED="1",
                        PYTHONPATH=str(ROOT))
        self.env.setdefault("FLODL_NET_TIMEOUT_SCALE", "0.1")
        # the NumPy kernels (the compiled ones give the same bytes): no compile or cache load
        # stretches a round on a loaded machine; these tests are about the network
        self.env["FLODL_PROTO_KERNELS"] = "numpy"
        if scale is not None:
            self.env["FLODL_NET_TIMEOUT_SCALE"] = str(scale)

    # -- processes -------------------------------------------------------------------------------
    def _spawn(self, name: str, node: Node, argv: list[str], stdin: bool = False) -> Proc:
        p = self.lab.popen(node, [sys.executable, *argv], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE,
                           stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                           text=True, env=self.env, cwd=str(ROOT))
        proc = Proc(name, p)
        assert p.stdout is not None and p.stderr is not None
        proc.threads = [
            threading.Thread(target=_pump, args=(p.stdout, proc.out), name=f"lab-out-{name}"),
            threading.Thread(target=_collect, args=(p.stderr, proc.err), name=f"lab-err-{name}"),
        ]
        for t in proc.threads:
            t.start()
        self.procs[name] = proc
        return proc

    def start(self) -> LabCluster:
        """Start the controller, the relays, then the ranks; returns once every rank is ready.

        Raises:
            AssertionError / TimeoutError: a process did not come up.
        """
        ctl = self._spawn("controller", self.lab.controller, [
            "-m", "flodl_proto.cli", "--log-level", "INFO", "controller", "--listen",
            f"{self.lab.controller.address}:0", "--world-size", str(self.world),
            "--protocol-version", str(self.version), *self.controller_args])
        line = ctl.next_line()
        assert line and line.startswith("listening on "), (line, ctl.stderr())
        self.port = int(line.rsplit(":", 1)[1])
        relays = [self._spawn(f"relay{h}", self.lab.hosts[h], [
            "-m", "flodl_proto.cli", "--log-level", "INFO", "relay", "--controller",
            f"{self.lab.controller.address}:{self.port}", "--ranks", ",".join(map(str, ranks)),
            "--world-size", str(self.world), "--listen-port", "0", "--protocol-version",
            str(self.version), "--host", f"h{h}", *self.relay_args])
            for h, ranks in enumerate(self.groups)]
        relay_ports = []
        for r in relays:
            line = r.next_line()
            assert line and line.startswith("listening on 127.0.0.1:"), (line, r.stderr())
            relay_ports.append(int(line.rsplit(":", 1)[1]))
        for h, ranks in enumerate(self.groups):
            for rank in ranks:
                cfg = {"rank": rank, "world": self.world, "relay": f"127.0.0.1:{relay_ports[h]}",
                       "version": self.version, "bf16": self.bf16, "rounds": self.rounds,
                       "elems": self.elems, "gate": self.gate}
                self._spawn(f"rank{rank}", self.lab.hosts[h],
                            ["-m", "tests.netlab_worker", json.dumps(cfg)], stdin=self.gate)
        for rank in range(self.world):
            ev = self.event(rank)
            assert ev["ev"] == "ready", ev
        return self

    def rank(self, rank: int) -> Proc:
        return self.procs[f"rank{rank}"]

    def event(self, rank: int, timeout: float = EVENT_TIMEOUT) -> dict[str, Any]:
        """The next JSON event of ``rank`` (``{"ev": "eof"}`` once its stdout closed)."""
        line = self.rank(rank).next_line(timeout)
        if line is None:
            return {"ev": "eof"}
        return dict(json.loads(line))

    def go(self, ranks: Sequence[int]) -> None:
        """Let ``ranks`` start their next round (``gate`` mode)."""
        for r in ranks:
            stdin = self.rank(r).popen.stdin
            assert stdin is not None
            with contextlib.suppress(OSError):
                stdin.write("go\n")
                stdin.flush()

    def rounds_of(self, ranks: Sequence[int], upto: int) -> dict[int, list[dict[str, Any]]]:
        """Read ``upto`` round events of each of ``ranks``.

        Raises:
            AssertionError: a rank reported something else first.
        """
        out: dict[int, list[dict[str, Any]]] = {}
        for r in ranks:
            got = []
            while len(got) < upto:
                ev = self.event(r)
                assert ev["ev"] == "round", (r, ev, self.procs["controller"].stderr()[-1500:])
                got.append(ev)
            out[r] = got
        return out

    def check_rounds(self, ranks: Sequence[int], first: int, count: int,
                     groups: Sequence[Sequence[int]] | None = None) -> None:
        """Read ``count`` rounds (``first``, ``first + 1``, ...) of each of ``ranks`` and check
        each consensus against :func:`expected_round` of ``groups`` (default: every host)."""
        groups = self.groups if groups is None else groups
        got = self.rounds_of(ranks, count)
        for i in range(count):
            k = first + i
            digest, weight = expected_round(groups, k, self.version, self.bf16, self.elems)
            for r in ranks:
                ev = got[r][i]
                assert ev["round"] == k, ev
                assert ev["digest"] == digest, (r, k, ev)
                assert ev["weight"] == weight, (r, k, ev)

    def finish(self, timeout: float = EVENT_TIMEOUT) -> dict[str, int]:
        """Wait for every process to exit; return the exit codes by name."""
        return {name: p.wait(timeout) for name, p in self.procs.items()}

    def close(self) -> None:
        """Kill what is still running, reap it and join the output threads."""
        for p in self.procs.values():
            if p.popen.poll() is None:
                p.popen.kill()
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                p.popen.wait(timeout=10)
            if p.popen.stdin is not None:
                with contextlib.suppress(OSError):
                    p.popen.stdin.close()
            for t in p.threads:
                t.join(timeout=10)

    def __enter__(self) -> LabCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pump(stream: IO[str], q: queue.Queue[tuple[float, str | None]]) -> None:
    for line in stream:
        q.put((time.monotonic(), line.rstrip("\n")))
    q.put((time.monotonic(), None))
    stream.close()


def _collect(stream: IO[str], sink: list[tuple[float, str]]) -> None:
    for line in stream:
        sink.append((time.monotonic(), line.rstrip("\n")))
    stream.close()


def record_figure(scenario: str, **values: Any) -> None:
    """Append one JSON line of measured figures to ``$FLODL_NETLAB_FIGURES`` when it is set
    (the numbers docs/reliability.md reports); a no-op otherwise."""
    path = os.environ.get("FLODL_NETLAB_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"scenario": scenario, **values}) + "\n")


def wait_for(pred: Callable[[], bool], timeout: float = EVENT_TIMEOUT, what: str = "") -> None:
    """Poll ``pred`` every 50 ms until it is true.

    Raises:
        AssertionError: still false after ``timeout`` seconds.
    """
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what or pred}"
        time.sleep(0.05)

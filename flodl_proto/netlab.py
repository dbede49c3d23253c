"""A network lab on one Linux machine: hosts in network namespaces behind a bridge, with link
faults (rate caps, packet loss, blackhole partitions, link down) and process kills.

Topology of one :class:`NetLab` (every name carries the run's unique tag)::

    <tag>-br   bridge namespace: bridge ``br0`` and one port per node (``vctl``, ``vh0``, ...)
    <tag>-ctl  the controller's namespace: ``eth0`` = 198.18.0.1/24
    <tag>-h0   host 0's namespace:        ``eth0`` = 198.18.0.10/24, host 1 .11, ...

Each node is joined to the bridge by a veth pair created inside the bridge namespace, so the
machine's own namespace gets no interface, address, route or rule. Addresses come only from
198.18.0.0/15 (RFC 2544's benchmarking range, never routed) and exist only inside the lab's
namespaces; every node also has its own loopback (a host's ranks reach their relay there).

Per-link controls (a link is a node's veth pair):

* :meth:`NetLab.set_rate` — a rate cap in both directions (``tc`` token bucket, ``tbf``, on both
  ends of the pair);
* :meth:`NetLab.set_loss` — random packet loss in both directions (an nftables ``numgen random``
  drop rule in the bridge namespace's ``bridge`` family forward hook, so the loss happens on the
  wire: neither end's stack sees a local error; while a loss rule is on, every node sends
  MTU-sized packets, so a rule drops single packets rather than 64 KiB GSO bundles);
* :meth:`NetLab.partition` / :meth:`NetLab.heal` — a blackhole: every frame to or from the node is
  dropped on the bridge (no FIN, no RST, no ICMP), and healing removes the rule;
* :meth:`NetLab.link_down` / :meth:`NetLab.link_up` — the bridge port goes down (the node's
  ``eth0`` loses its carrier), as when a cable is pulled;
* :meth:`NetLab.kill` — SIGKILL every process in the node's namespace.

Clean-up: :meth:`NetLab.close` kills every process left in the lab's namespaces and deletes the
namespaces (their veths, qdiscs and nftables rules go with them). It runs on ``close()``/``with``
exit, from an ``atexit`` hook, and from a SIGTERM/SIGHUP handler installed while a lab is open
(the previous handler then runs). A lab whose process was SIGKILLed is swept by the next lab
started on the machine (namespace names carry the owner's pid). :func:`leftovers` lists what
remains of a tag.

Requires Linux, root, ``ip`` and ``tc`` (iproute2) and ``nft`` (nftables); a lab built with
``tools=("ip",)`` (no rate caps, loss or partitions, as the demo's) needs ``ip`` only.
:func:`unavailable_reason` says in one line why the lab cannot run here. The kernel needs no
``netem``; there is no delay control.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import itertools
import math
import numbers
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, TypeVar

from .errors import shown

__all__ = [
    "LAB_NETWORK",
    "LAB_TOOLS",
    "LabError",
    "NetLab",
    "Node",
    "leftovers",
    "sweep_stale",
    "unavailable_reason",
]

#: the only addresses the lab assigns (RFC 2544 benchmarking range)
LAB_NETWORK = ipaddress.ip_network("198.18.0.0/15")
_SUBNET_PREFIX = 24
_CONTROLLER_ADDRESS = "198.18.0.1"
_FIRST_HOST = 10
_MAX_HOSTS = 200
_NAME_PREFIX = "flodl-lab-"
_NAME_RE = re.compile(r"^flodl-lab-(\d+)-(\d+)-")
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/var/run/netns"
#: every tool the lab can use: ``ip`` (namespaces, veth, bridge, link down), ``tc`` (rate caps)
#: and ``nft`` (loss, partitions); a lab needs ``ip``, and ``tc`` and ``nft`` only if it uses them
LAB_TOOLS = ("ip", "tc", "nft")
#: seconds each ``ip``/``tc``/``nft`` call may take
_CMD_TIMEOUT = 20.0

T = TypeVar("T")


class LabError(RuntimeError):
    """A lab command failed (the message names the command and its stderr).

    No upstream counterpart: a network-namespace test lab of this package.
    """


@dataclass(frozen=True, slots=True)
class Node:
    """One namespace of the lab joined to its bridge.

    Attributes:
        name: ``"ctl"`` or ``"h<i>"``.
        netns: the namespace's name (``<tag>-<name>``).
        address: its IPv4 address in 198.18.0.0/15.
        port: the bridge-side veth's name (in the bridge namespace).

    No upstream counterpart: a network-namespace test lab of this package.
    """

    name: str
    netns: str
    address: str
    port: str


def _run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True
         ) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                             timeout=_CMD_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LabError(f"{' '.join(argv)}: {e}") from None
    if check and res.returncode != 0:
        err = (res.stderr or res.stdout).strip().splitlines()
        raise LabError(f"{' '.join(argv)}: {err[-1] if err else f'exit {res.returncode}'}")
    return res


def _netns_list() -> list[str]:
    res = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _netns_pids(netns: str) -> list[int]:
    res = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_and_delete(netns: str) -> None:
    """SIGKILL every process of ``netns`` (until none is left, at most ~5 s), then delete it."""
    for _ in range(50):
        pids = [p for p in _netns_pids(netns) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    _run(["ip", "netns", "delete", netns], check=False)


_REASON: dict[tuple[str, ...], str | None] = {}


def _tool_set(tools: Sequence[str]) -> tuple[str, ...]:
    """``tools`` in :data:`LAB_TOOLS` order.

    Raises:
        ValueError: ``tools`` lacks ``ip`` or names a tool not in :data:`LAB_TOOLS`.
    """
    if isinstance(tools, str) or "ip" not in tools or not set(tools) <= set(LAB_TOOLS):
        raise ValueError(f"tools must name ip and only {', '.join(LAB_TOOLS)}, got {tools!r}")
    return tuple(t for t in LAB_TOOLS if t in tools)


def unavailable_reason(tools: Sequence[str] = LAB_TOOLS) -> str | None:
    """None when a lab using ``tools`` (``ip``, and ``tc``/``nft`` if it uses them: see
    :data:`LAB_TOOLS`) can run here, else one line saying why not (not Linux, not root, a
    missing tool, no network namespaces, no nftables bridge family). Probes once per process and
    set of tools (creates and deletes a scratch namespace).

    Raises:
        ValueError: ``tools`` lacks ``ip`` or names a tool not in :data:`LAB_TOOLS`.

    No upstream counterpart: a network-namespace test lab of this package.
    """
    key = _tool_set(tools)
    if key not in _REASON:
        _REASON[key] = _probe(key)
    return _REASON[key]


def _probe(tools: tuple[str, ...]) -> str | None:
    if not sys.platform.startswith("linux"):
        return f"the network lab needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        uses = ["network namespaces", "veth"] + [{"tc": "tc", "nft": "nftables"}[t]
                                                  for t in tools if t != "ip"]
        return f"the network lab needs root ({', '.join(uses)})"
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        packages = ["iproute2"] + (["nftables"] if "nft" in tools else [])
        return (f"the network lab needs {' and '.join(packages)}: {', '.join(missing)} not "
                f"found (apt-get install {' '.join(packages)})")
    probe = f"{_NAME_PREFIX}{os.getpid()}-0-probe"
    try:
        _run(["ip", "netns", "add", probe])
        try:
            _run(["ip", "-n", probe, "link", "add", "b0", "type", "bridge"])
            _run(["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
            if "nft" in tools:
                _run(["ip", "netns", "exec", probe, "nft", "-f", "-"],
                     stdin="table bridge probe {\n chain c {\n"
                           "  type filter hook forward priority 0;\n"
                           "  numgen random mod 100 < 1 drop\n }\n}\n")
            if "tc" in tools:
                _run(["tc", "-n", probe, "qdisc", "add", "dev", "v0", "root", "tbf", "rate",
                      "100mbit", "burst", "64kb", "latency", "50ms"])
        finally:
            _run(["ip", "netns", "delete", probe], check=False)
    except LabError as e:
        return f"the network lab cannot run here: {e}"
    return None


def leftovers(tag: str) -> list[str]:
    """What remains of the lab ``tag`` on this machine: its namespaces (``netns:<name>``) and
    the processes still inside them (``pid:<pid>``). Empty once the lab is closed.

    No upstream counterpart: a network-namespace test lab of this package.
    """
    out: list[str] = []
    for ns in _netns_list():
        if ns.startswith(tag + "-"):
            out.append(f"netns:{ns}")
            out.extend(f"pid:{p}" for p in _netns_pids(ns))
    return out


def sweep_stale() -> list[str]:
    """Delete the namespaces of labs whose owning process is gone (a lab SIGKILLed before its
    clean-up); return their names.

    No upstream counterpart: a network-namespace test lab of this package.
    """
    swept = []
    for ns in _netns_list():
        m = _NAME_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_and_delete(ns)
            swept.append(ns)
    return swept


# -- clean-up on every exit path -----------------------------------------------------------------
_LIVE: dict[str, NetLab] = {}
_LIVE_LOCK = threading.Lock()
_SEQ = itertools.count(1)
_HANDLED = (signal.SIGTERM, signal.SIGHUP)
_PREVIOUS: dict[int, Any] = {}


def _close_all() -> None:
    with _LIVE_LOCK:
        labs = list(_LIVE.values())
    for lab in labs:
        with contextlib.suppress(Exception):
            lab.close()


atexit.register(_close_all)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    prev = _PREVIOUS.get(signum, signal.SIG_DFL)  # first: closing the last lab forgets it
    _close_all()
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def _install_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # atexit and the next lab's sweep still clean up
    for s in _HANDLED:
        current = signal.getsignal(s)
        if current is not _on_signal:
            _PREVIOUS[s] = current
            signal.signal(s, _on_signal)


def _restore_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for s, prev in list(_PREVIOUS.items()):
        if signal.getsignal(s) is _on_signal:
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        del _PREVIOUS[s]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Child setup: SIGKILL when the spawning thread's process goes away; leave the terminal's
    Ctrl-C to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class NetLab:
    """A controller namespace and ``hosts`` host namespaces joined by a bridge.

    Args:
        hosts: number of host namespaces (1..200).
        tools: the tools the lab may use (:data:`LAB_TOOLS`, the default: every one). Without
            ``tc`` :meth:`set_rate` is refused, without ``nft`` :meth:`set_loss`,
            :meth:`partition` and :meth:`heal` are, and no nftables table is made; check such a
            lab with ``unavailable_reason(tools)``.

    Use as a context manager, or call :meth:`start` then :meth:`close` (idempotent; also run on
    exit and on SIGTERM/SIGHUP).

    Raises:
        ValueError: ``hosts`` out of range, or ``tools`` lacks ``ip`` or names another tool.
        LabError: a command failed while building the lab (what was built is removed).

    No upstream counterpart: a network-namespace test lab of this package.
    """

    def __init__(self, hosts: int, tools: Sequence[str] = LAB_TOOLS) -> None:
        if not 1 <= hosts <= _MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{_MAX_HOSTS}, got {hosts}")
        self.tools = _tool_set(tools)
        self.tag = f"{_NAME_PREFIX}{os.getpid()}-{next(_SEQ)}"
        self.bridge_netns = f"{self.tag}-br"
        self.controller = Node("ctl", f"{self.tag}-ctl", _CONTROLLER_ADDRESS, "vctl")
        self.hosts = [Node(f"h{i}", f"{self.tag}-h{i}", f"198.18.0.{_FIRST_HOST + i}", f"vh{i}")
                      for i in range(hosts)]
        for n in self.nodes:
            assert ipaddress.ip_address(n.address) in LAB_NETWORK
        self._procs: list[subprocess.Popen[Any]] = []
        self._loss: dict[str, float] = {}
        self._cut: set[str] = set()
        self._small_packets = False
        self._started = False
        self._closed = False
        self._lock = threading.Lock()

    @property
    def nodes(self) -> list[Node]:
        """The controller's node, then every host's."""
        return [self.controller, *self.hosts]

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the lab (bridge first)."""
        return [self.bridge_netns, *(n.netns for n in self.nodes)]

    def node(self, name: str) -> Node:
        """The node called ``name`` (``"ctl"``, ``"h0"``, ...).

        Raises:
            KeyError: no such node.
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> NetLab:
        """Sweep stale labs, then build the namespaces, bridge and links; returns ``self``.

        Raises:
            LabError: a command failed (everything built so far is removed).
            RuntimeError: already started.
        """
        if self._started:
            raise RuntimeError("lab already started")
        self._started = True
        sweep_stale()
        with _LIVE_LOCK:
            _LIVE[self.tag] = self
            _install_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        br = self.bridge_netns
        _run(["ip", "netns", "add", br])
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        _run(["ip", "-n", br, "link", "set", "lo", "up"])
        for n in self.nodes:
            _run(["ip", "netns", "add", n.netns])
            _run(["ip", "-n", br, "link", "add", n.port, "type", "veth", "peer", "name", "eth0",
                  "netns", n.netns])
            _run(["ip", "-n", br, "link", "set", n.port, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", n.port, "up"])
            _run(["ip", "-n", n.netns, "link", "set", "lo", "up"])
            _run(["ip", "-n", n.netns, "addr", "add", f"{n.address}/{_SUBNET_PREFIX}", "dev",
                  "eth0"])
            _run(["ip", "-n", n.netns, "link", "set", "eth0", "up"])
        if "nft" in self.tools:
            self._apply_rules()

    def _needs(self, tool: str) -> None:
        """Raise :class:`LabError` unless ``tool`` is one of this lab's tools."""
        if tool not in self.tools:
            raise LabError(f"this lab was built without {tool} (its tools: "
                           f"{', '.join(self.tools)})")

    def close(self) -> None:
        """Kill every process in the lab, delete its namespaces (links, qdiscs and rules go with
        them) and reap the processes it started. Idempotent; never raises for a missing piece."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            for ns in reversed(self.namespaces):
                _kill_and_delete(ns)
            for p in self._procs:
                with contextlib.suppress(Exception):
                    p.kill()
                with contextlib.suppress(Exception):
                    p.wait(timeout=5.0)
        finally:
            with _LIVE_LOCK:
                _LIVE.pop(self.tag, None)
                if not _LIVE:
                    _restore_handlers()

    def __enter__(self) -> NetLab:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- processes -------------------------------------------------------------------------------
    def argv(self, node: Node, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside ``node``'s namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", node.netns, *argv]

    def popen(self, node: Node, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``node``'s namespace (``subprocess.Popen`` keyword arguments
        pass through). The child ignores SIGINT and is SIGKILLed if this process dies; the lab
        kills it at :meth:`close` at the latest.

        Raises:
            RuntimeError: the lab is not running.
        """
        if not self._started or self._closed:
            raise RuntimeError("lab is not running")
        kwargs.setdefault("preexec_fn", _die_with_parent)
        p: subprocess.Popen[Any] = subprocess.Popen(self.argv(node, argv), **kwargs)
        self._procs.append(p)
        return p

    def pids(self, node: Node) -> list[int]:
        """Pids of every process in ``node``'s namespace."""
        return _netns_pids(node.netns)

    def kill(self, node: Node) -> list[int]:
        """SIGKILL every process in ``node``'s namespace; return their pids."""
        pids = self.pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def call_in(self, node: Node, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn()`` on a fresh thread that has joined ``node``'s network namespace (sockets
        it opens live there); return its result or raise its exception.

        Raises:
            LabError: the namespace could not be entered.
            TimeoutError: ``fn`` ran longer than ``timeout`` seconds.
        """
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                fd = os.open(os.path.join(_NETNS_DIR, node.netns), os.O_RDONLY)
                try:
                    libc = ctypes.CDLL("libc.so.6", use_errno=True)
                    if libc.setns(fd, _CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise LabError(f"setns({node.netns}): {os.strerror(err)}")
                finally:
                    os.close(fd)
                box["result"] = fn()
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=body, name=f"netlab-{node.name}")
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"call in {node.netns} still running after {timeout:g}s")
        if "error" in box:
            raise box["error"]
        return box["result"]  # type: ignore[no-any-return]

    # -- link controls ---------------------------------------------------------------------------
    def set_rate(self, node: Node, mbit: float | None) -> None:
        """Cap ``node``'s link at ``mbit`` Mbit/s in each direction (tbf on both veth ends), or
        remove the cap (None).

        Raises:
            TypeError: ``mbit`` is neither None nor a real number (text, a bool: ``True`` is no
                1 Mbit/s), named with its type and value (``mbit must be a number of Mbit/s or
                None, got str '5'``).
            ValueError: ``mbit`` is not a finite number of at least 0.001 (1 kbit/s, the unit
                the cap is given to tc in), or a number too large for a float (an integer, a
                ``Fraction``, named by its size as :func:`~flodl_proto.errors.shown` names it:
                ``<an integer of 1329 bits>``).
            LabError: ``tc`` failed, or is not one of the lab's tools.
        """
        if mbit is not None and (isinstance(mbit, bool) or not isinstance(mbit, numbers.Real)):
            raise TypeError(f"mbit must be a number of Mbit/s or None, got "
                            f"{type(mbit).__name__} {mbit!r}")
        self._needs("tc")
        ends = [(node.netns, "eth0"), (self.bridge_netns, node.port)]
        if mbit is None:
            for ns, dev in ends:
                _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            return
        try:
            finite = math.isfinite(mbit)
        except OverflowError:  # a number past a float's range: no cap tc can take
            raise ValueError("mbit must be a finite number from 0.001 Mbit/s (1 kbit/s), got "
                             f"{shown(mbit)}") from None  # by its size, as any message shows it
        if not (finite and mbit >= 0.001):
            raise ValueError(
                f"mbit must be a finite number from 0.001 Mbit/s (1 kbit/s), got {mbit}")
        rate_bytes = mbit * 1e6 / 8
        burst = max(64 * 1024, int(rate_bytes * 0.002))  # >= 2 ms of traffic, >= 64 KiB
        for ns, dev in ends:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                  f"{int(mbit * 1000)}kbit", "burst", str(burst), "latency", "100ms"])

    def set_loss(self, node: Node, percent: float) -> None:
        """Drop ``percent`` % of the frames to and from ``node`` at random (0 removes the rule);
        resolution 0.01 %.

        Raises:
            ValueError: ``percent`` outside 0..100.
            LabError: ``nft`` failed, or is not one of the lab's tools.
        """
        if not 0 <= percent <= 100:
            raise ValueError(f"loss must be in 0..100 %, got {percent}")
        self._needs("nft")
        if percent:
            self._loss[node.port] = percent
        else:
            self._loss.pop(node.port, None)
        self._segment(bool(self._loss))
        self._apply_rules()

    def dropped(self, node: Node) -> int:
        """Frames to or from ``node`` dropped so far by its loss rule (0 without one)."""
        total = 0
        for line in self.rules().splitlines():
            if f'"{node.port}" numgen' in line:
                m = re.search(r"counter packets (\d+)", line)
                total += int(m.group(1)) if m else 0
        return total

    def _segment(self, small: bool) -> None:
        """Make every node send MTU-sized packets (no GSO bundles) while any loss rule is on, so
        a loss rule drops single packets, not 64 KiB bundles of them."""
        if small == self._small_packets:
            return
        size = "1500" if small else "65536"
        for n in self.nodes:
            _run(["ip", "-n", n.netns, "link", "set", "dev", "eth0", "gso_max_size", size])
        self._small_packets = small

    def partition(self, node: Node) -> None:
        """Blackhole ``node``: drop every frame to or from it on the bridge (no FIN, no RST).

        Raises:
            LabError: ``nft`` failed, or is not one of the lab's tools.
        """
        self._needs("nft")
        self._cut.add(node.port)
        self._apply_rules()

    def heal(self, node: Node) -> None:
        """Undo :meth:`partition` for ``node``.

        Raises:
            LabError: ``nft`` failed, or is not one of the lab's tools.
        """
        self._needs("nft")
        self._cut.discard(node.port)
        self._apply_rules()

    def link_down(self, node: Node) -> None:
        """Set ``node``'s bridge port down (``eth0`` in the node loses its carrier).

        Raises:
            LabError: ``ip`` failed.
        """
        _run(["ip", "-n", self.bridge_netns, "link", "set", node.port, "down"])

    def link_up(self, node: Node) -> None:
        """Undo :meth:`link_down`.

        Raises:
            LabError: ``ip`` failed.
        """
        _run(["ip", "-n", self.bridge_netns, "link", "set", node.port, "up"])

    def rules(self) -> str:
        """The bridge namespace's nftables ruleset (for diagnostics)."""
        return _run(["ip", "netns", "exec", self.bridge_netns, "nft", "list", "ruleset"],
                    check=False).stdout

    def _apply_rules(self) -> None:
        """Replace the bridge's ``flodl_lab`` table atomically with the current loss and
        partition rules."""
        rules = []
        for port in sorted(self._cut):
            rules += [f'iifname "{port}" drop', f'oifname "{port}" drop']
        for port, pct in sorted(self._loss.items()):
            threshold = round(pct * 100)
            rules += [f'iifname "{port}" numgen random mod 10000 < {threshold} counter drop',
                      f'oifname "{port}" numgen random mod 10000 < {threshold} counter drop']
        body = "".join(f"    {r}\n" for r in rules)
        script = ("table bridge flodl_lab\ndelete table bridge flodl_lab\n"
                  "table bridge flodl_lab {\n  chain links {\n"
                  "    type filter hook forward priority 0; policy accept;\n"
                  f"{body}  }}\n}}\n")
        _run(["ip", "netns", "exec", self.bridge_netns, "nft", "-f", "-"], stdin=script)

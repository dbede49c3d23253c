"""Play one conformance case against a target: launch it, run the steps, stop it.

Steps (each a mapping with one action key):

* ``connect: C`` or ``{conn: C, rcvbuf: N, may_fail: true}`` — open connection ``C`` to the
  target (controller role: its listener; relay role: the relay's loopback port, as a rank);
  ``rcvbuf`` shrinks the kit's receive buffer first (a relay that stops reading);
* ``accept: C`` — relay role: accept the relay's upstream connection on the kit's controller
  listener;
* ``send: {conn: C, <builder>: ...}`` — write bytes (:mod:`.builders`);
* ``expect: {conn: C, <builder>: ..., within: s, within_scaled: s}`` — read exactly those bytes;
* ``expect_hello: {conn: C, ranks: [..]}`` — read a relay's ``Control(Hello)`` record (any host
  name), check its tag and its ranks;
* ``expect_close: {conn: C, allow: N}`` — the target closes the connection (at most ``N`` bytes
  before the end of stream; default none); the step fails as soon as more than ``N`` arrived;
* ``expect_silence: {conn: C, for: s}`` — nothing arrives and the connection stays open;
* ``expect_no_reply: {conn: C, for: s}`` — nothing arrives (a close is fine);
* ``close: C`` — close connection ``C``;
* ``sleep: s``;
* ``signal: TERM`` — send the target SIGTERM;
* ``expect_exit: success|failure`` or ``{status: .., within: s, within_scaled: s}`` — the
  target exits by itself with status 0 (success) or non-zero (failure).

``within`` is in seconds; ``within_scaled`` is multiplied by the kit's timeout scale (the same
scale the target runs with), for waits that follow one of the target's own timeouts. A step
that gives neither waits ``DEFAULT_WITHIN`` x the timeout scale, at least
``DEFAULT_WITHIN_FLOOR`` (:func:`default_within`). An ``expect`` ends as soon as the bytes that
arrived differ from the expected ones (no later byte can make them equal).
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .._oserr import os_reason
from ..codec.mux import Hello, decode_mux_record, max_hello_payload, parse_mux_header
from ..errors import ProtocolError
from ..spec import (
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_HEADER_LEN,
    MUX_RECORD_MAGIC,
    SESSION_SALT_BYTES,
)
from ._defaults import EXIT_GRACE, READY_TIMEOUT, STOP_BOUND, default_within
from .builders import BuildContext, build
from .catalogue import Case, CatalogueError
from .fields import expected_message, field_at, field_value_pair, observed_message
from .target import CaseContext, Target, TargetError, TargetExit, TargetLaunchError

__all__ = ["CaseResult", "KitSettings", "default_within", "free_port", "play_case"]

#: default duration of an expected silence (seconds)
DEFAULT_SILENCE: Final = 0.3
_EXCERPT: Final = 16
#: bytes one receive takes at most
_CHUNK: Final = 1 << 16
#: bytes of a connection kept beyond what a step reads (``expect_close``: the start of what
#: arrived before the end of stream, for the failure's ``observed``); the rest is counted, not
#: kept, so a target that floods a connection cannot exhaust the kit's memory
_KEEP: Final = 4096
#: bytes ``expect_close`` still reads, without waiting, once more than it allows arrived (what
#: the target sent before its close, and the close, are most often there already)
_OVER_READ: Final = 1 << 20
_MUX_MAGIC_LE: Final = MUX_RECORD_MAGIC.to_bytes(4, "little")


@dataclass(frozen=True, slots=True)
class KitSettings:
    """How the kit runs cases.

    Attributes:
        timeout_scale: exported to the target as ``FLODL_NET_TIMEOUT_SCALE``; scales the kit's
            ``within_scaled`` waits and its default wait (:func:`default_within`) too.
        ready_timeout: seconds a target may take to listen (:data:`._defaults.READY_TIMEOUT`,
            ``--start-timeout``'s default too).
        stop_bound: seconds between SIGTERM and SIGKILL. Not scaled by ``timeout_scale``, as
            ``exit_grace``: it waits for a process to end (the kit has closed the case's
            connections before it sends SIGTERM), not for one of the target's protocol
            timeouts; this package's controller takes up to about half a second to exit on
            SIGTERM at any scale, so a bound scaled to 0.5 s at scale 0.1 would kill a target
            still exiting.
        exit_grace: seconds a target of a failing case that closed a connection (the kit saw
            its end of stream) may take to exit by itself before the kit sends SIGTERM, so that
            a target ending on its own (a crash: a traceback printed as it shuts down) is
            reported with its own exit status and its output. Not scaled by
            ``timeout_scale``: it waits for a process to end, not for one of the target's
            protocol timeouts.
        host: address the controller target binds.

    No upstream counterpart: upstream has no conformance kit.
    """

    timeout_scale: float = 1.0
    ready_timeout: float = READY_TIMEOUT
    stop_bound: float = STOP_BOUND
    exit_grace: float = EXIT_GRACE
    host: str = "127.0.0.1"


@dataclass(slots=True)
class CaseResult:
    """The outcome of one case at one version.

    Attributes:
        case: the case.
        version: the protocol version it ran at.
        passed: every step held.
        step: index of the failing step (None when passed, or the target did not start).
        message: what went wrong (empty when passed).
        expected: expected bytes (hex) of a failing byte expectation, else "".
        observed: observed bytes (hex), else "".
        offset: first differing byte offset of a failing byte expectation, else None.
        payload_offset: for a mux record whose tag differs, the first differing byte after the
            25-byte header (the bytes that made the tags differ), else None.
        tag_only: the records differ in their auth tag alone: the bytes it covers are the same,
            so the tags were computed with another salt or another MAC.
        differing_field: the field of the expected bytes holding the first differing byte
            reported (``payload_offset`` when set, else ``offset``), in docs/protocol.md's
            names (``payload.tensor[0].data, element 1``), when the target sent a byte there;
            else "".
        differing_values: that field's two values (``expected 4.0, observed 3.0``) when it has
            one (an integer, a weight, a tensor element) and the target sent all its bytes;
            else "".
        expected_value: the expected one of those two values alone (``4.0``), else "".
        observed_value: the observed one (``3.0``), else "".
        seconds: wall time of the case.
        exit: how the target ended.
        output: the target's last output lines (failing cases only).
        started: the target started and listened (False: the case failed before its first
            step, or the case's first connection to the target was refused: "target did not
            start").

    No upstream counterpart: upstream has no conformance kit.
    """

    case: Case
    version: int
    passed: bool = False
    step: int | None = None
    message: str = ""
    expected: str = ""
    observed: str = ""
    offset: int | None = None
    payload_offset: int | None = None
    tag_only: bool = False
    differing_field: str = ""
    differing_values: str = ""
    seconds: float = 0.0
    exit: TargetExit | None = None
    output: str = field(default="", repr=False)
    started: bool = False
    expected_value: str = ""
    observed_value: str = ""


class _NotListening(Exception):
    """The case's first connection to the target was refused: it does not listen where it said
    (a target that has not started)."""


class StepFailed(Exception):
    """A step did not hold (carries expected/observed bytes when it compared bytes)."""

    def __init__(self, message: str, expected: bytes | None = None,
                 observed: bytes | None = None, observed_total: int | None = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.observed = observed
        #: bytes observed in all, when ``observed`` holds only their start
        self.observed_total = observed_total


#: the lowest port the kit hands out for a target to listen on
_LISTEN_PORT_FLOOR: Final = 10000
#: ports handed out lately, not handed out again while a case may still hold them
_RECENT_PORTS: Final[collections.deque[int]] = collections.deque(maxlen=256)
_PORTS_LOCK: Final = threading.Lock()


def _ephemeral_range() -> tuple[int, int] | None:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return None


def free_port(host: str) -> int:
    """A port on ``host`` nothing is bound to now, for a target to listen on.

    The target binds it only later (a launched command starts first), so the port is taken
    below the system's ephemeral range where there is room (``ip_local_port_range``; Linux
    gives outgoing connections their local ports from that range, so neither the kit's nor a
    target's connections can take it meanwhile), and never one handed out for the last 256
    cases (cases run side by side under ``--jobs``). Elsewhere, a port the kernel picks.

    Returns:
        The port (1..65535).

    Raises:
        OSError: ``host`` cannot be bound at all.

    No upstream counterpart: upstream has no conformance kit.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    span = _ephemeral_range()
    with _PORTS_LOCK:
        if span is not None and span[0] - _LISTEN_PORT_FLOOR >= 1024:
            for _ in range(64):
                port = secrets.choice(range(_LISTEN_PORT_FLOOR, span[0]))
                if port in _RECENT_PORTS:
                    continue
                with socket.socket(family) as s:
                    try:
                        s.bind((host, port))
                    except OSError:
                        continue
                _RECENT_PORTS.append(port)
                return port
        with contextlib.ExitStack() as held:  # held open, so the kernel picks another
            for _ in range(64):
                s = held.enter_context(socket.socket(family))
                s.bind((host, 0))
                port = int(s.getsockname()[1])
                if port not in _RECENT_PORTS:
                    break
        _RECENT_PORTS.append(port)
        return port


def first_difference(expected: bytes, observed: bytes) -> int | None:
    """Offset of the first byte where ``observed`` differs from ``expected`` (a shorter or
    longer ``observed`` differs at the shorter length), or None when equal."""
    n = min(len(expected), len(observed))
    for i in range(n):
        if expected[i] != observed[i]:
            return i
    return None if len(expected) == len(observed) else n


class _Conn:
    """A kit-side connection with a buffer of bytes received but not consumed yet.

    The buffer grows only as a step asks: by at most one receive (``_CHUNK`` bytes) past what
    the step reads, whatever the target sends.
    """

    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.eof = sock is None
        #: the target closed (or reset) its end; the kit's own close does not set it
        self.peer_closed = False

    def fill(self, deadline: float | None) -> bool:
        """Receive once (at most ``_CHUNK`` bytes) before ``deadline`` (None: only what has
        arrived, no wait); False on timeout."""
        if self.eof or self.sock is None:
            return False
        left = 0.0 if deadline is None else deadline - time.monotonic()
        if left <= 0 and deadline is not None:
            return False
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(_CHUNK)
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:  # reset / aborted: the peer is gone
            self.eof = self.peer_closed = True
            return True
        if not chunk:
            self.eof = self.peer_closed = True
        self.buf += chunk
        return True

    def read(self, n: int, deadline: float, want: bytes | None = None) -> bytes:
        """Up to ``n`` bytes: fewer only at end of stream, the deadline, or (given ``want``,
        the expected bytes) as soon as those that arrived differ from the start of ``want``."""
        while (len(self.buf) < n and not self.eof
               and (want is None or self.buf == want[:len(self.buf)])
               and self.fill(deadline)):
            pass
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_to_end(self, deadline: float, keep: int,
                    limit: int | None = None) -> tuple[bytes, int, bool]:
        """Read until end of stream or the deadline: ``(the first keep bytes, the number of
        bytes read, True at end of stream)``; the bytes past ``keep`` are counted, not kept.
        Once more than ``limit`` bytes were read, it no longer waits: it reads what has
        arrived (at most ``_OVER_READ`` bytes more) and returns."""
        total = len(self.buf)
        del self.buf[keep:]
        while not self.eof:
            before = len(self.buf)
            until: float | None = deadline
            if limit is not None and total > limit:  # no wait: what has arrived
                if total > limit + _OVER_READ:
                    break
                until = None
            if not self.fill(until):
                break
            total += len(self.buf) - before
            del self.buf[keep:]
        out = bytes(self.buf)
        self.buf.clear()
        return out, total, self.eof

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.eof = True


def _payload_difference(expected: bytes, observed: bytes, offset: int | None) -> int | None:
    """Where two mux records differing first in their auth tag differ after the header."""
    if (offset is None or not expected.startswith(_MUX_MAGIC_LE)
            or not MUX_AUTH_COVERED_HEADER_LEN <= offset < MUX_HEADER_LEN):
        return None
    rest = first_difference(expected[MUX_HEADER_LEN:], observed[MUX_HEADER_LEN:])
    return None if rest is None else MUX_HEADER_LEN + rest


def _tag_only(expected: bytes, observed: bytes, offset: int | None) -> bool:
    """Two mux records of one length that differ in their 8-byte auth tag and nowhere else."""
    return (offset is not None and expected.startswith(_MUX_MAGIC_LE)
            and MUX_AUTH_COVERED_HEADER_LEN <= offset < MUX_HEADER_LEN
            and len(expected) == len(observed)
            and expected[MUX_HEADER_LEN:] == observed[MUX_HEADER_LEN:])


def _hex(b: bytes, around: int | None = None, total: int | None = None) -> str:
    """``b`` as hex, or an excerpt around offset ``around`` and the length; ``total`` is the
    length when ``b`` is only the start of what was observed."""
    n = len(b) if total is None else max(total, len(b))
    if around is None or len(b) <= 2 * _EXCERPT + 8:
        if len(b) <= 4 * _EXCERPT and n == len(b):
            return b.hex()
        return f"{b[:2 * _EXCERPT].hex()}... ({n} B)"
    lo = max(0, around - _EXCERPT)
    hi = min(len(b), around + _EXCERPT)
    return (("..." if lo else "") + b[lo:hi].hex() + ("..." if hi < n else "")
            + f" ({n} B)")


class _Player:
    def __init__(self, case: Case, version: int, target: Target, settings: KitSettings,
                 ctx: CaseContext, listener: socket.socket | None) -> None:
        self.case = case
        self.version = version
        self.target = target
        self.settings = settings
        self.ctx = ctx
        self.listener = listener
        self.address: tuple[str, int] = ("", 0)
        self.conns: dict[str, _Conn] = {}
        self.build_ctx = BuildContext(ctx.salt, version, ctx.world_size)
        self.exit_status: int | None = None
        #: a connection to the target succeeded in this case
        self.connected = False
        #: the case's first connection was refused at the address the target announced
        self.refused = False

    # -- helpers ---------------------------------------------------------------------------------
    def within(self, p: Any, default: float | None = None) -> float:
        if default is None:
            default = default_within(self.settings.timeout_scale)
        if not isinstance(p, Mapping):
            return default
        base = float(p.get("within", default if "within_scaled" not in p else 0.0))
        return base + float(p.get("within_scaled", 0.0)) * self.settings.timeout_scale

    def conn(self, p: Any) -> tuple[str, _Conn]:
        name = str(p["conn"] if isinstance(p, Mapping) else p)
        if name not in self.conns:
            raise CatalogueError(f"{self.case.id}: connection {name} used before it was opened")
        return name, self.conns[name]

    # -- actions ---------------------------------------------------------------------------------
    def do_connect(self, p: Any) -> None:
        opts = p if isinstance(p, Mapping) else {"conn": p}
        name = str(opts["conn"])
        host, port = self.address
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        if "rcvbuf" in opts:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(opts["rcvbuf"]))
        s.settimeout(self.within(opts))
        try:
            s.connect((host, port))
        except OSError as e:
            s.close()
            if not opts.get("may_fail"):
                if isinstance(e, ConnectionRefusedError) and not self.connected:
                    self.refused = True
                    raise _NotListening(f"the connection to {host}:{port}, where it said it "
                                        f"listens, was refused ({os_reason(e)})") from None
                raise StepFailed(f"connect to {host}:{port} failed: {e}") from None
            self.conns[name] = _Conn(None)
            return
        self.connected = True
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns[name] = _Conn(s)

    def do_accept(self, p: Any) -> None:
        opts = p if isinstance(p, Mapping) else {"conn": p}
        if self.listener is None:
            raise CatalogueError(f"{self.case.id}: accept is for relay cases")
        self.listener.settimeout(self.within(opts, default_within(self.settings.timeout_scale)
                                             + 1.0 * self.settings.timeout_scale))
        try:
            s, _ = self.listener.accept()
        except TimeoutError:
            raise StepFailed("the relay did not connect to the controller") from None
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns[str(opts["conn"])] = _Conn(s)

    def do_send(self, p: Mapping[str, Any], where: str) -> None:
        _, c = self.conn(p)
        data = build(p, self.build_ctx, where)
        if c.sock is None:
            return
        c.sock.settimeout(self.within(p, 30.0))
        # the target may already have closed the connection (a failing case): not our failure
        try:
            c.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            c.peer_closed = True
        except OSError:
            pass

    def do_expect(self, p: Mapping[str, Any], where: str) -> None:
        name, c = self.conn(p)
        want = build(p, self.build_ctx, where)
        wait = self.within(p)
        got = c.read(len(want), time.monotonic() + wait, want)
        if got != want:
            why = "they differ" if len(got) == len(want) else (
                "they already differ" if got != want[:len(got)]
                else "end of stream" if c.eof else f"timed out after {wait:g}s")
            what = expected_message(p)
            size = f"{what} ({len(want)} bytes)" if what else f"{len(want)} bytes"
            got_n = f"{len(got)} byte{'' if len(got) == 1 else 's'}"
            raise StepFailed(f"connection {name}: expected {size}, observed {got_n} ({why})",
                             want, got)

    def do_expect_hello(self, p: Mapping[str, Any]) -> None:
        name, c = self.conn(p)
        deadline = time.monotonic() + self.within(p)
        head = c.read(MUX_HEADER_LEN, deadline)
        if len(head) < MUX_HEADER_LEN:
            raise StepFailed(f"connection {name}: expected a Hello record, observed "
                             f"{len(head)} bytes ({'end of stream' if c.eof else 'timed out'})",
                             None, head)
        try:
            # a header announcing more than the largest legal Hello fails before any read
            ceiling = max_hello_payload(self.ctx.world_size)
            hdr = parse_mux_header(head, ceiling=ceiling)
            body = c.read(hdr.payload_len, deadline)
            res = decode_mux_record(head + body, self.ctx.salt, version=self.version,
                                    ceiling=ceiling)
        except ProtocolError as e:
            raise StepFailed(f"connection {name}: not a valid Hello record: {e}", None,
                             head) from None
        msg = res[0].control
        if not isinstance(msg, Hello):
            raise StepFailed(f"connection {name}: expected Control(Hello), observed "
                             f"{type(msg).__name__ if msg is not None else 'another record'}",
                             None, head + body)
        want = tuple(int(r) for r in p["ranks"])
        if msg.ranks != want:
            raise StepFailed(f"connection {name}: Hello ranks {list(msg.ranks)}, expected "
                             f"{list(want)} (ascending)")

    def do_expect_close(self, p: Any) -> None:
        name, c = self.conn(p)
        allow = int(p.get("allow", 0)) if isinstance(p, Mapping) else 0
        got, n, eof = c.read_to_end(time.monotonic() + self.within(p), max(allow + 1, _KEEP),
                                    allow)
        what = observed_message(got)
        start = f" (starting with {what})" if what else ""
        if not eof and n > allow:  # ended as soon as more than it allows arrived
            raise StepFailed(f"connection {name}: expected a close with at most {allow} bytes "
                             f"before it, observed {n} bytes so far{start}, still open", b"",
                             got, n)
        if not eof:
            raise StepFailed(f"connection {name}: expected the target to close it; still open "
                             f"after {self.within(p):g}s" + (f" ({n} bytes received{start})"
                                                              if n else ""), b"", got, n)
        if n > allow:
            raise StepFailed(f"connection {name}: expected a close with at most {allow} bytes "
                             f"before it, observed {n} bytes{start}", b"", got, n)

    def do_silence(self, p: Any, close_ok: bool) -> None:
        name, c = self.conn(p)
        dur = float(p.get("for", DEFAULT_SILENCE)) if isinstance(p, Mapping) else DEFAULT_SILENCE
        deadline = time.monotonic() + dur
        while time.monotonic() < deadline and not c.buf and not c.eof:
            c.fill(deadline)
        if c.buf:
            what = observed_message(bytes(c.buf))
            raise StepFailed(f"connection {name}: expected nothing for {dur:g}s, observed "
                             f"{len(c.buf)} bytes" + (f" (starting with {what})" if what else ""),
                             b"", bytes(c.buf))
        if c.eof and not close_ok:
            raise StepFailed(f"connection {name}: expected it to stay open for {dur:g}s; the "
                             f"target closed it")

    def do_expect_exit(self, p: Any) -> None:
        want = p if isinstance(p, str) else str(p.get("status", "any"))
        wait = self.within(p)
        status = self.target.wait_exit(wait)
        if status is None:
            raise StepFailed(f"expected the target to exit ({want}); still running after "
                             f"{wait:g}s")
        self.exit_status = status
        if want == "success" and status != 0:
            raise StepFailed(f"expected the target to exit with status 0, observed {status}")
        if want == "failure" and status == 0:
            raise StepFailed("expected the target to exit with a failure status, observed 0")

    def step(self, i: int, s: Mapping[str, Any]) -> None:
        where = f"{self.case.id} v{self.version} step {i}"
        if "connect" in s:
            self.do_connect(s["connect"])
        elif "accept" in s:
            self.do_accept(s["accept"])
        elif "send" in s:
            self.do_send(s["send"], where)
        elif "expect" in s:
            self.do_expect(s["expect"], where)
        elif "expect_hello" in s:
            self.do_expect_hello(s["expect_hello"])
        elif "expect_close" in s:
            self.do_expect_close(s["expect_close"])
        elif "expect_silence" in s:
            self.do_silence(s["expect_silence"], close_ok=False)
        elif "expect_no_reply" in s:
            self.do_silence(s["expect_no_reply"], close_ok=True)
        elif "close" in s:
            _, c = self.conn(s["close"])
            c.close()
        elif "sleep" in s:
            time.sleep(float(s["sleep"]))
        elif "signal" in s:
            self.target.send_signal(int(getattr(signal, f"SIG{str(s['signal']).upper()}")))
        elif "expect_exit" in s:
            self.do_expect_exit(s["expect_exit"])
        else:  # pragma: no cover - the catalogue loader rejects unknown actions
            raise CatalogueError(f"{where}: unknown action {sorted(s)}")

    def close_all(self) -> None:
        for c in self.conns.values():
            c.close()

    def peer_closed(self) -> bool:
        """The target closed (or reset) one of the case's connections."""
        return any(c.peer_closed for c in self.conns.values())


def case_salt(case: Case) -> bytes:
    """The session salt a run of ``case`` uses: the case's own (a vector case's fixed salt),
    else a fresh random one of the spec's ``SESSION_SALT_BYTES`` bytes.

    No upstream counterpart: upstream has no conformance kit.
    """
    return case.salt if case.salt is not None else secrets.token_bytes(SESSION_SALT_BYTES)


def play_case(case: Case, version: int, make_target: Callable[[], Target],
              settings: KitSettings) -> CaseResult:
    """Run ``case`` at ``version`` against a fresh target.

    Picks free ports and a fresh salt (a vector case keeps its own), writes the salt file, opens
    the kit's controller listener (relay role), starts the target, plays the steps and stops the
    target (SIGTERM, then SIGKILL after ``settings.stop_bound``), recording its exit status. A
    target of a failing case that closed one of the case's connections, or refused the case's
    first connection at the address it announced, first gets ``settings.exit_grace`` seconds to
    exit by itself (a crashing target is still shutting down when the kit sees its end of
    stream; one that announced its address before it failed to listen there is exiting): then
    its own exit status is recorded and its output shown, not a SIGTERM the kit sent while it
    was ending.

    Returns:
        The result; a failing step, a target that exits or never listens (or refuses the case's
        first connection to the address it announced: ``started`` False), a malformed step and
        a ``MemoryError`` in the kit all give a failed result. The kit keeps a bounded part of
        what a target sends (a flood is counted, not kept).

    Raises:
        TargetLaunchError: the target's command could not be executed (every case would fail the
            same way; the caller stops the run).

    No upstream counterpart: upstream has no conformance kit.
    """
    t0 = time.monotonic()
    result = CaseResult(case, version)
    salt = case_salt(case)
    fd, salt_path = tempfile.mkstemp(prefix="flodl-conform-", suffix=".salt")
    with os.fdopen(fd, "w") as f:
        f.write(salt.hex() + "\n")
    listener: socket.socket | None = None
    target: Target | None = None
    player: _Player | None = None
    try:
        host = settings.host
        if case.role == "relay":
            listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, 0))
            listener.listen(8)
            port, listen_port = int(listener.getsockname()[1]), free_port("127.0.0.1")
        else:
            port, listen_port = free_port(host), 0
        ctx = CaseContext(case.role, version, case.world_size, salt, Path(salt_path), host, port,
                          listen_port, case.ranks, settings.timeout_scale)
        target = make_target()
        player = _Player(case, version, target, settings, ctx, listener)
        try:
            player.address = target.start(ctx, settings.ready_timeout)
        except TargetLaunchError:
            raise
        except (TargetError, ValueError) as e:
            result.message = f"target did not start: {e}"
            return result
        result.started = True
        for i, s in enumerate(case.steps[version]):
            result.step = i
            try:
                player.step(i, s)
            except _NotListening as e:  # as a target that never listened
                result.message, result.started, result.step = f"target did not start: {e}", \
                    False, None
                return result
            except StepFailed as e:
                result.message = str(e)
                if e.expected is not None or e.observed is not None:
                    exp, obs = e.expected or b"", e.observed or b""
                    result.offset = first_difference(exp, obs) if e.expected is not None else None
                    result.payload_offset = _payload_difference(exp, obs, result.offset)
                    result.tag_only = _tag_only(exp, obs, result.offset)
                    at = result.payload_offset if result.payload_offset is not None \
                        else result.offset
                    if at is not None and at < len(obs):
                        result.differing_field = field_at(exp, at) or ""
                        if (pair := field_value_pair(exp, obs, at)) is not None:
                            result.expected_value, result.observed_value = pair
                            result.differing_values = f"expected {pair[0]}, observed {pair[1]}"
                    result.expected = _hex(exp, at)
                    result.observed = _hex(obs, at, e.observed_total)
                return result
            except CatalogueError as e:
                result.message = f"catalogue error: {e}"
                return result
            except MemoryError:  # the case fails; the next one runs
                result.message = "the kit ran out of memory playing this step"
                return result
        result.passed, result.step = True, None
        return result
    except MemoryError:  # starting the target, or a step's report: the case fails all the same
        result.passed = False
        result.message = "the kit ran out of memory" + (" playing this step" if result.started
                                                        else " starting the target")
        return result
    finally:
        if player is not None:
            player.close_all()
            if target is not None and not result.passed and (player.peer_closed()
                                                             or player.refused):
                target.wait_exit(settings.exit_grace)
        if target is not None:
            result.exit = target.stop(settings.stop_bound)
            if not result.passed:
                result.output = target.output()
        if listener is not None:
            listener.close()
        with contextlib.suppress(OSError):
            os.unlink(salt_path)
        result.seconds = time.monotonic() - t0

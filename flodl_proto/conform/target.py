"""Targets of the conformance kit: the implementation under test, launched once per case.

:class:`LaunchedTarget` runs a command line (``--launch CMD``) with the case's placeholders
filled, waits until it listens, and stops it with SIGTERM, then SIGKILL after a bound, recording
its exit status. :class:`InProcessTarget` runs this package's own controller or relay in the
kit's process (fast self-checks and tests); it reports the exit status the command line would.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import select
import shlex
import signal
import socket
import string
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Protocol

from .._oserr import os_reason
from .._threads import start_thread
from ..errors import shown
from ._defaults import OUTPUT_DRAIN

__all__ = ["CaseContext", "InProcessHandle", "InProcessTarget", "LaunchedTarget", "Target",
           "TargetError", "TargetExit", "TargetLaunchError", "fill_placeholders",
           "port_listening"]

#: ``listening on HOST:PORT`` (the first line our controller and relay print)
_LISTENING: Final = re.compile(r"listening on \[?([0-9A-Za-z.:-]*?)\]?:(\d+)\s*$")
_OUTPUT_LINES: Final = 200
#: characters of an output line kept (the rest is cut, and the line says how many)
_LINE_WIDTH: Final = 240
#: seconds between two looks of an output reader at whether the target has ended
_POLL: Final = 0.1
#: why a target given a signal before its start was not started
_STOPPED_EARLY: Final = "the kit stopped the target before it started"


class TargetError(RuntimeError):
    """The target could not be started, or never became ready (the message says why).

    No upstream counterpart: upstream has no conformance kit.
    """


#: the operating system's reasons for not starting a program that are the machine's state, not
#: the program named: no process, memory or file descriptor (the output pipes) to be had now
_NO_PROCESS: Final = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


class TargetLaunchError(TargetError):
    """The target's command could not be executed at all (no such program, not executable, no
    process could be created): every case would fail the same way, so the kit stops.

    The message is ``cannot start the target 'PROGRAM': REASON``, the program word quoted as
    every message quotes a value (:func:`~flodl_proto.errors.shown`): one longer than 80
    characters by its first 40 and last 20 and its length (``'/tmp/xxx...xxx' (204800
    characters)``), not all of it.

    Attributes:
        command: the program named by ``--launch`` (its first word, placeholders filled), whole.
        reason: the operating system's error text (``No such file or directory``).
        errno: the operating system's error number (``errno.ENOENT``), None when unknown.
        no_process: True when the reason is the machine's state rather than the program named
            (no process, memory or file descriptor to be had now: ``EAGAIN``, ``ENOMEM``,
            ``EMFILE``, ``ENFILE``), so the same command may start later.

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, command: str, reason: str, errno: int | None = None) -> None:
        super().__init__(f"cannot start the target {shown(command)}: {reason}")
        self.command = command
        self.reason = reason
        self.errno = errno
        self.no_process = errno in _NO_PROCESS


def _launch_reason(program: str, e: OSError) -> str:
    """Why ``program`` (the first word of ``--launch``) could not be executed: ``it is a
    directory, not a program`` for a path to a directory (the system's own reason, EACCES, read
    ``Permission denied``), else the system's reason."""
    if os.sep in program and os.path.isdir(program):
        return "it is a directory, not a program"
    return os_reason(e)


@dataclass(frozen=True, slots=True)
class CaseContext:
    """Everything a target is launched with for one case.

    Attributes:
        role: ``controller`` or ``relay``.
        version: protocol version (2 or 3).
        world_size: the cluster's world size.
        salt: the 16-byte session salt.
        salt_file: a file holding the salt as 32 hex digits and a newline.
        host: the address the controller target binds (``127.0.0.1``).
        port: controller role: the port a launched target binds; relay role: the kit
            controller's port.
        listen_port: relay role: the loopback port a launched relay binds for its ranks.
            (An in-process target binds a port of the kernel's choosing instead.)
        ranks: relay role: the relay's ranks.
        timeout_scale: exported to the target as ``FLODL_NET_TIMEOUT_SCALE``.

    No upstream counterpart: upstream has no conformance kit.
    """

    role: str
    version: int
    world_size: int
    salt: bytes
    salt_file: Path
    host: str
    port: int
    listen_port: int
    ranks: tuple[int, ...]
    timeout_scale: float

    def placeholders(self) -> dict[str, str]:
        """The values of the ``--launch`` placeholders for this case."""
        common = {"world_size": str(self.world_size), "salt": self.salt.hex(),
                  "salt_file": str(self.salt_file), "version": str(self.version)}
        if self.role == "controller":
            return {"host": self.host, "port": str(self.port), **common}
        return {"controller": f"{self.host}:{self.port}",
                "ranks": ",".join(str(r) for r in self.ranks),
                "listen_port": str(self.listen_port), **common}


@dataclass(frozen=True, slots=True)
class TargetExit:
    """How a target ended.

    Attributes:
        status: the exit code (negative: killed by that signal), or None (could not be reaped).
        by_itself: True when it exited before the kit stopped it.
        killed: True when SIGTERM did not stop it within the bound and SIGKILL was sent.

    No upstream counterpart: upstream has no conformance kit.
    """

    status: int | None
    by_itself: bool
    killed: bool = False

    def describe(self) -> str:
        """``exit 0``, ``exit 0 after SIGTERM``, ``ended by SIGTERM (no handler)``,
        ``killed by SIGKILL (SIGTERM ignored)`` ..."""
        if self.status is None:
            return "not reaped"
        if self.killed:
            return "killed by SIGKILL (SIGTERM ignored)"
        if self.status < 0:
            name = signal.Signals(-self.status).name
            return f"ended by {name}" + ("" if self.by_itself else " (no handler)")
        return f"exit {self.status}" + ("" if self.by_itself else " after SIGTERM")


class Target(Protocol):
    """The implementation under test, for one case.

    No upstream counterpart: upstream has no conformance kit.
    """

    def start(self, ctx: CaseContext, ready_timeout: float) -> tuple[str, int]:
        """Start it and wait until it listens; return the address it listens on."""

    def wait_exit(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for it to exit by itself; its exit status, or None."""

    def send_signal(self, sig: int) -> None:
        """Deliver ``sig`` (SIGTERM: the stop request); before :meth:`start`, a stop: the
        start is refused (the kit stopped while the case was making its target)."""

    def stop(self, bound: float) -> TargetExit | None:
        """Stop it (SIGTERM, then SIGKILL after ``bound`` s) and return how it ended; None when
        it never started."""

    def output(self) -> str:
        """The last lines it printed (stdout and stderr)."""


#: a backslash that ends a line: the command goes on on the next line
_LINE_JOIN: Final = re.compile(r"\\\r?\n")


def fill_placeholders(template: str, values: Mapping[str, str]) -> list[str]:
    """Split ``template`` like a shell and fill ``{name}`` placeholders in every word.

    A backslash at the end of a line joins it to the next, as a shell script's line
    continuation, wherever it stands: a ``--launch '...'`` written over several lines of a shell
    (the quotes keep the backslash and the newline) is one command, not a command with a
    newline word.

    A placeholder is ``{name}`` alone (``{{`` and ``}}`` are literal braces): a conversion
    (``{port!r}``), a format spec (``{port:>99999}``: a word of any size), an attribute or an
    index (``{port.x}``, ``{port[0]}``) is refused.

    Raises:
        ValueError: an unknown placeholder, a malformed template (a quote left open, a
            backslash ending it: the message quotes the template, then shlex's words), a
            placeholder that is not
            ``{name}`` alone, a blank template (no word: no program to run), one whose first
            word is blank (``'' {port}``), or one holding a NUL character (no program's
            argument can) (the message names it; it names no option: the command line puts
            ``argument --launch:`` before it,
            :func:`flodl_proto.commands._option_error.option_message`).

    No upstream counterpart: upstream has no conformance kit.
    """
    if "\0" in template:
        raise ValueError("the command holds a NUL character (\\x00), which no program's "
                         "argument can")
    try:
        words = shlex.split(_LINE_JOIN.sub("", template))
    except ValueError as e:  # shlex names no text: "No closing quotation", "No escaped
        # character" (a backslash ending the command)
        raise ValueError(f"{shown(template)}: {e} (it is split as a shell splits a command "
                         "line)") from None
    if not words:
        raise ValueError("no command (the value is blank)")
    out = [_fill_word(w, values) for w in words]
    if not out[0].strip():
        raise ValueError(f"no program to run (the first word is {words[0]!r})")
    return out


def _fill_word(word: str, values: Mapping[str, str]) -> str:
    """One word of :func:`fill_placeholders`, its ``{name}`` placeholders filled from
    ``values``.

    Raises:
        ValueError: a malformed placeholder, one that is not ``{name}`` alone, or an unknown
            name (the message names the word or the placeholder).
    """
    try:
        parts = list(string.Formatter().parse(word))
    except ValueError as e:
        raise ValueError(f"bad placeholder in {word!r}: {e}") from None
    filled = []
    for literal, name, spec, conversion in parts:
        filled.append(literal)
        if name is None:
            continue
        if name in values and not spec and conversion is None:
            filled.append(values[name])
            continue
        if name.isidentifier() and not spec and conversion is None:
            raise ValueError(f"unknown placeholder {{{name}}} (this role has "
                             f"{', '.join('{' + k + '}' for k in sorted(values))})")
        raise ValueError(f"bad placeholder in {word!r}: a placeholder is {{name}} alone (no "
                         f"!conversion, :format, .attribute or [index])")
    return "".join(filled)


def port_listening(port: int) -> bool | None:
    """Whether some socket on this machine listens on TCP ``port`` (Linux ``/proc/net``), or
    None when that cannot be told without connecting.

    No upstream counterpart: upstream has no conformance kit.
    """
    found = False
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False if found else None


def _probe(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=0.2):
            return True
    except OSError:
        return False


class LaunchedTarget:
    """A target started from a command line (``--launch CMD``).

    Args:
        template: the command, with placeholders (see :meth:`CaseContext.placeholders`).
        env: extra environment variables.

    The kit waits for the target's ``listening on HOST:PORT`` line, or (without one) until the
    expected port is listening, read from ``/proc/net/tcp`` so that no probe connection reaches
    the target; where there is no ``/proc/net`` it polls the port by connecting (a target that
    takes that probe for a peer should print the line).

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, template: str, env: Mapping[str, str] | None = None) -> None:
        self.template = template
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: deque[str] = deque(maxlen=_OUTPUT_LINES)
        self._listening: tuple[str, int] | None = None
        self._seen = threading.Condition()
        self._readers: list[threading.Thread] = []
        #: monotonic time the output readers stop at (set once the target has ended)
        self._drain_until: float | None = None
        #: held while the process starts and while a signal is sent: a signal that comes as
        #: it starts reaches it once started (reentrant: the kit's signal handler runs in the
        #: thread that may be starting it)
        self._start_lock = threading.RLock()
        #: a signal came before the start: the start is refused
        self._stopped_early = False
        #: the thread starting the process, from before Popen until the process is ``_proc``
        self._starting: int | None = None

    def _line(self, line: str, cut: int, tag: str) -> None:
        """Keep one line of output (``tag``: "" for stdout; ``cut``: characters cut off its
        end) and notice ``listening on``."""
        line = f"{line} ... ({cut} more characters cut)" if cut else line.removesuffix("\r")
        with self._seen:
            self._lines.append(f"{tag}{line}")
            m = _LISTENING.search(line) if tag == "" else None
            if m is not None and self._listening is None:
                self._listening = (m.group(1) or "127.0.0.1", int(m.group(2)))
            self._seen.notify_all()

    def _pump(self, stream: IO[bytes], tag: str) -> None:
        """Read ``stream`` (the target's stdout or stderr) line by line until its end, or until
        ``_drain_until`` once the target has ended (then close it); a line longer than
        ``_LINE_WIDTH`` characters is cut (what is cut is counted, not kept)."""
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial, cut = "", 0  # the line read so far (at most _LINE_WIDTH characters)

        def add(piece: str) -> None:
            nonlocal partial, cut
            room = _LINE_WIDTH - len(partial)
            if len(piece) > room:
                partial, cut = partial + piece[:room], cut + len(piece) - room
            else:
                partial += piece

        try:
            while True:
                until = self._drain_until
                left = _POLL if until is None else min(_POLL, until - time.monotonic())
                if left <= 0:
                    break
                if not poller.poll(left * 1000):
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    add(decoder.decode(b"", final=True))
                    break
                *lines, rest = decoder.decode(data).split("\n")
                for line in lines:
                    add(line.removesuffix("\r"))
                    self._line(partial, cut, tag)
                    partial, cut = "", 0
                add(rest)
        except OSError:  # a pipe that cannot be read any more: its end
            pass
        finally:
            if partial or cut:
                self._line(partial, cut, tag)
            stream.close()
            with self._seen:
                self._seen.notify_all()

    def start(self, ctx: CaseContext, ready_timeout: float) -> tuple[str, int]:
        """Fill the placeholders, start the command in its own session and wait until it
        listens.

        Raises:
            ValueError: a bad template. TargetLaunchError: the command could not be executed.
                TargetError: it exited, or did not listen within ``ready_timeout`` s, or a
                signal came before the start (:meth:`send_signal`: the kit is stopping; no
                process is started).
        """
        argv = fill_placeholders(self.template, ctx.placeholders())
        env = {**os.environ, **self.env, "FLODL_NET_TIMEOUT_SCALE": f"{ctx.timeout_scale:g}"}
        with self._start_lock:
            if self._stopped_early:
                raise TargetError(_STOPPED_EARLY)
            self._starting = threading.get_ident()
            try:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              env=env, start_new_session=True)
            except OSError as e:
                raise TargetLaunchError(argv[0], _launch_reason(argv[0], e), e.errno) from None
            finally:
                self._starting = None
            if self._stopped_early:  # the kit's handler ran on this thread, inside Popen
                self._signal_group(signal.SIGTERM)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        for stream, tag in ((self._proc.stdout, ""), (self._proc.stderr, "stderr: ")):
            t = threading.Thread(target=self._pump, args=(stream, tag), name="conform-target-io")
            start_thread(t)
            self._readers.append(t)
        expect = ctx.port if ctx.role == "controller" else ctx.listen_port
        deadline = time.monotonic() + ready_timeout
        with self._seen:
            while True:
                if self._listening is not None:
                    return self._listening
                if self._proc.poll() is not None:
                    raise TargetError(f"the target exited ({self._proc.returncode}) before "
                                      f"listening")
                addr = (ctx.host if ctx.role == "controller" else "127.0.0.1", expect)
                listening = port_listening(expect)
                if listening is None:  # no /proc/net: poll by connecting (the probe is a peer)
                    listening = _probe(addr)
                if listening:
                    return addr
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TargetError(f"the target did not listen on port {expect} within "
                                      f"{ready_timeout:g}s")
                self._seen.wait(min(left, 0.02))

    def wait_exit(self, timeout: float) -> int | None:
        """Exit status once it exited by itself within ``timeout`` s, else None."""
        assert self._proc is not None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _signal_group(self, sig: int) -> None:
        if self._proc is None:  # not started yet
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def starting_here(self) -> bool:
        """Whether the calling thread is starting the target's process (inside ``Popen``, until
        the process is the target's). A signal handler running there must not raise: an
        exception out of ``Popen`` once it has forked leaves the process running with no one to
        stop it; :meth:`send_signal` keeps the stop, and the start gives the process SIGTERM as
        soon as it exists."""
        return self._starting == threading.get_ident()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the target's process group. Before :meth:`start`, it is a stop: no
        signal, and the start is refused (a signal that comes while the process starts waits
        for it and reaches it)."""
        with self._start_lock:
            if self._proc is None:
                self._stopped_early = True
                return
            self._signal_group(sig)

    def stop(self, bound: float) -> TargetExit | None:
        """SIGTERM to its process group, SIGKILL after ``bound`` s; then read what is left of
        its output for at most ``OUTPUT_DRAIN`` s (a process it left behind may hold the pipes
        open) and close the pipes. None when it never started."""
        if self._proc is None:
            return None
        by_itself = self._proc.poll() is not None
        killed = False
        if not by_itself:
            self._signal_group(signal.SIGTERM)
            try:
                self._proc.wait(bound)
            except subprocess.TimeoutExpired:
                killed = True
                self._signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(bound)
        # a process left behind (a SIGKILLed group's grandchild, another session's process) may
        # hold the pipes open: read what is there for a short while, then close them
        self._drain_until = time.monotonic() + OUTPUT_DRAIN
        for t in self._readers:
            t.join(OUTPUT_DRAIN + 1.0)
        return TargetExit(self._proc.returncode, by_itself, killed)

    def output(self) -> str:
        """The last lines printed (stderr lines prefixed ``stderr: ``; a line longer than 240
        characters cut, ending ``... (N more characters cut)``)."""
        with self._seen:
            return "\n".join(self._lines)


class InProcessHandle(Protocol):
    """A controller or relay running in the kit's process (see :mod:`.inprocess`).

    No upstream counterpart: upstream has no conformance kit.
    """

    address: tuple[str, int]

    def wait_exit(self, timeout: float) -> int | None:
        """Exit status (0 clean, 1 failed) once it ended within ``timeout`` s, else None."""

    def terminate(self, bound: float) -> int | None:
        """Stop it as SIGTERM would; its exit status."""


class InProcessTarget:
    """A target running in the kit's own process, started by ``starter(ctx)``.

    Used by the test suite and by the deliberately broken targets; exit statuses are those the
    command line would return (0 clean, 1 failed).

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, starter: Callable[[CaseContext], InProcessHandle]) -> None:
        self._starter = starter
        self._handle: InProcessHandle | None = None
        self._exit: int | None = None
        self._by_itself = False
        self._start_lock = threading.RLock()
        self._stopped_early = False

    def start(self, ctx: CaseContext, ready_timeout: float) -> tuple[str, int]:
        """Start it (listening once ``starter`` returns).

        Raises:
            TargetError: the starter failed, or a signal came before the start
                (:meth:`send_signal`; the starter is not called).
        """
        with self._start_lock:
            if self._stopped_early:
                raise TargetError(_STOPPED_EARLY)
            return self._start(ctx)

    def _start(self, ctx: CaseContext) -> tuple[str, int]:
        try:
            self._handle = self._starter(ctx)
        except (OSError, ValueError) as e:
            raise TargetError(f"cannot start the in-process target: {e}") from None
        return self._handle.address

    def wait_exit(self, timeout: float) -> int | None:
        """Exit status once it ended within ``timeout`` s, else None."""
        assert self._handle is not None
        status = self._handle.wait_exit(timeout)
        if status is not None and self._exit is None:
            self._exit, self._by_itself = status, True
        return status

    def send_signal(self, sig: int) -> None:
        """SIGTERM / SIGINT: stop it as the command line's signal handler would. Before
        :meth:`start`, any signal is a stop: the start is refused."""
        with self._start_lock:
            if self._handle is None:
                self._stopped_early = True
                return
        if sig in (signal.SIGTERM, signal.SIGINT):
            status = self._handle.terminate(10.0)
            if self._exit is None:
                self._exit, self._by_itself = status, True

    def stop(self, bound: float) -> TargetExit | None:
        """Stop it if still running; how it ended (None when it never started)."""
        if self._handle is None:
            return None
        if self._exit is None:
            status = self._handle.wait_exit(0)
            if status is not None:
                return TargetExit(status, True)
            return TargetExit(self._handle.terminate(bound), False)
        return TargetExit(self._exit, self._by_itself)

    def output(self) -> str:
        """Nothing: an in-process target logs through :mod:`logging`."""
        return ""

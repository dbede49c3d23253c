"""Vector handler for ``controller_session.json`` (op ``controller_session``).

Replays each case's steps over real loopback sockets against a
:class:`~flodl_proto.runner.controller.ReferenceController` in direct mode (``port_mux=False``,
bound to ``127.0.0.1`` port 0), then checks the bytes received per ``recv`` step, the
controller's outcome (clean, or an error with the case's prefix and kind), and that every
connection marked ``closed_by_controller: true`` was closed by the controller.

Purely data-driven: any case of the same schema runs. Every wait has a deadline of a few seconds,
so a failing case fails fast instead of hanging.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Mapping
from typing import Any, Final

from ..commands._waits import WAIT_STEP
from ..errors import shown
from ..fsm.lifecycle import Outcome
from ..runner.controller import ReferenceController
from .jsonio import require
from .registry import VectorMismatch, op, shown_value

__all__: list[str] = []

_HOST: Final = "127.0.0.1"
_RECV_DEADLINE: Final = 5.0  # seconds a recv step waits for its bytes
_END_DEADLINE: Final = 5.0  # seconds the replay waits for the controller's loop to end
_AFTER_DEADLINE: Final = 3.0  # seconds to read what arrives on a connection after the end

#: the most steps a case may hold (the shared cases hold at most 13)
MAX_STEPS: Final = 20000
#: the most connections a case may open (``connect`` steps) and read after the end (``after``
#: entries; the shared cases open at most 2): each is a socket held open until the case ends
MAX_CONNECTIONS: Final = 256


def _read(sock: socket.socket, n: int | None, deadline: float) -> tuple[bytes, bool]:
    """Read ``n`` bytes (None: until end of stream) before ``deadline``; return (bytes, eof).
    Waited for in steps of :data:`~flodl_proto.commands._waits.WAIT_STEP` seconds, as
    :func:`_ended` waits."""
    out = bytearray()
    while n is None or len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), False
        sock.settimeout(min(left, WAIT_STEP))  # in steps: see :func:`_ended`
        try:
            chunk = sock.recv(65536 if n is None else n - len(out))
        except TimeoutError:
            continue  # the deadline is checked above
        except (ConnectionResetError, ConnectionAbortedError):
            return bytes(out), True
        if not chunk:
            return bytes(out), True
        out += chunk
    return bytes(out), False


def _check_outcome(case: dict[str, Any], outcome: Outcome) -> None:
    want = case["controller"]
    require(want["result"] == case["expect"],
            f"the case expects {case['expect']!r} and its controller result is "
            f"{want['result']!r}")
    if want["result"] == "ok":
        require(outcome.clean, f"controller ended with {outcome}, want a clean exit")
        return
    require(not outcome.clean and outcome.error is not None,
            f"controller ended with {outcome}, want an error starting with "
            f"{want['error_prefix']!r}")
    assert outcome.error is not None
    msg = str(outcome.error)
    require(msg.startswith(want["error_prefix"]),
            f"controller error {msg!r} does not start with {want['error_prefix']!r}")
    if "error_kind" in want:
        kind = getattr(outcome.error, "kind", type(outcome.error).__name__)
        require(kind == want["error_kind"],
                f"controller error kind {kind!r}, want {want['error_kind']!r}")


def _session_problem(case: Mapping[str, Any]) -> str | None:
    """Why a session (its fields of their kinds) holds more steps, connections or closing
    reads than a case may (:data:`MAX_STEPS`, :data:`MAX_CONNECTIONS`: a case of 100000
    connect steps opened 100000 sockets and failed in the words of the first refused), or
    reads after the end on a connection no step opens (it passed, unread), or None."""
    steps = case["steps"]
    connects = sum(step["action"] == "connect" for step in steps)
    if len(steps) > MAX_STEPS:
        return f"field 'steps' holds {len(steps)} steps, more than the {MAX_STEPS} a case may hold"
    if connects > MAX_CONNECTIONS:
        return (f"field 'steps' opens {connects} connections, more than the {MAX_CONNECTIONS} "
                "a case may open")
    if len(case["after"]) > MAX_CONNECTIONS:
        return (f"field 'after' holds {len(case['after'])} entries, more than the "
                f"{MAX_CONNECTIONS} a case may hold")
    opened = {step["conn"] for step in steps if step["action"] == "connect"}
    for k, after in enumerate(case["after"]):
        if after["conn"] not in opened:
            return (f"field 'after[{k}].conn' is {shown_value(after['conn'])}, not a connection "
                    "a connect step opens")
    return None


def _ended(ctl: ReferenceController, timeout: float) -> Outcome | None:
    """``ctl.wait(timeout)`` (seconds): the run's outcome once it is over, None while it still
    runs after ``timeout``; waited for in steps of :data:`~flodl_proto.commands._waits.WAIT_STEP`
    seconds, so the handler of a Ctrl-C the kernel gave one of the controller's threads runs at
    once on the replaying (main) thread of ``flodl-proto vectors check``, where it waited for
    the whole deadline of a case that fails."""
    deadline = time.monotonic() + timeout
    while (outcome := ctl.wait(min(WAIT_STEP, max(0.0, deadline - time.monotonic())))) is None:
        if time.monotonic() >= deadline:
            return None
    return outcome


@op("controller_session", expects=("ok", "error"),
    fields={"world_size": "u32", "salt": "hex", "steps": "array of step",
            "controller": "controller", "after": "array of after"},
    error_fields={"controller": "controller_error"}, check=_session_problem)
def _controller_session(case: dict[str, Any], version: int) -> None:
    ctl = ReferenceController(case["world_size"], bytes.fromhex(case["salt"]), host=_HOST,
                              port=0, version=version, port_mux=False)
    socks: dict[int, socket.socket] = {}
    started = False
    try:
        ctl.start()
        started = True
        for n, step in enumerate(case["steps"]):
            i, action = step["conn"], step["action"]
            where = f"step {n} ({action} on connection {shown(i)})"
            if action == "connect":
                socks[i] = socket.create_connection((_HOST, ctl.port), timeout=_RECV_DEADLINE)
            elif action in ("send", "recv", "close") and i not in socks:
                raise VectorMismatch(f"{where}: connection {shown(i)} is not open (no connect "
                                     "step before, or closed)")
            elif action == "send":
                # the controller may already have closed the connection (a failed run)
                with contextlib.suppress(OSError):
                    socks[i].sendall(bytes.fromhex(step["bytes"]))
            elif action == "recv":
                want = bytes.fromhex(step["bytes"])
                got, eof = _read(socks[i], len(want), time.monotonic() + _RECV_DEADLINE)
                require(got == want, f"{where}: received {got.hex()} "
                                     f"({'end of stream' if eof else 'timed out'}), "
                                     f"want {want.hex()}")
            elif action == "close":
                socks.pop(i).close()
            else:
                raise VectorMismatch(f"{where}: unknown action")
        if not case["controller"].get("exited_before_client_close", True):
            for s in socks.values():
                s.close()
            socks.clear()
        outcome = _ended(ctl, _END_DEADLINE)
        require(outcome is not None,
                f"controller still running {_END_DEADLINE:g}s after the last step")
        assert outcome is not None
        _check_outcome(case, outcome)
        for after in case["after"]:
            i = after["conn"]
            if i not in socks:
                continue
            want = bytes.fromhex(after["bytes"])
            got, eof = _read(socks[i], None, time.monotonic() + _AFTER_DEADLINE)
            require(got == want, f"connection {shown(i)} received {got.hex()} after the end, "
                                 f"want {want.hex()}")
            if after["closed_by_controller"]:
                require(eof, f"connection {shown(i)} was not closed by the controller")
    finally:
        for s in socks.values():
            s.close()
        if started and _ended(ctl, 0.0) is None:
            ctl.request_stop("shutdown()")
            _ended(ctl, _END_DEADLINE * 2)
        ctl.shutdown(timeout=0.0)  # TimeoutError: still running after the deadline

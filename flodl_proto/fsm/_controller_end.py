"""The controller core's outputs and the run's end: the queue of actions an input returns
(:class:`SendTo`, :class:`CloseConnection`), the lifecycle's read-only state, and the end of the
run (a failure or a clean end: every connection closed, a final checkpoint window, one
:class:`Finished`). Internal to :mod:`flodl_proto.fsm.controller_core`, whose
:class:`~flodl_proto.fsm.controller_core.ControllerCore` builds on :class:`_ControllerEnd`.

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``run_reduce_thread``'s exits and the
connections it closes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..codec._common import BytesLike
from ..errors import ProtocolError
from ._controller_state import _Conn, _Relay, _Windows
from .events import Action, CloseConnection, Finished, SendKind, SendTo
from .lifecycle import Lifecycle, LifecycleEvent, Outcome

__all__: list[str] = []

#: the core's logger: its records name the controller core, as before the core was split
log = logging.getLogger("flodl_proto.fsm.controller_core")

#: how a clean end reads, whatever ended it: upstream ends the run cleanly there too
_CLEAN_END = "run ends cleanly, as flodl does"


class _ControllerEnd:
    """The core's action queue, lifecycle state and end of the run (the attributes are
    :class:`~flodl_proto.fsm.controller_core.ControllerCore`'s, set by its constructor)."""

    lifecycle: Lifecycle
    bytes_out: int
    _conns: dict[int, _Conn]
    _relays: list[_Relay]
    _actions: list[Action]
    _checkpoint: bool
    _windows: _Windows

    # -- read-only state -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """Lifecycle state id: ``idle``, ``accepting``, ``reducing`` or ``shutdown``."""
        return self.lifecycle.state

    @property
    def finished(self) -> bool:
        """True once the run is over (Shutdown)."""
        return self.lifecycle.is_final

    @property
    def outcome(self) -> Outcome | None:
        """The run's outcome once finished."""
        return self.lifecycle.outcome

    # -- plumbing --------------------------------------------------------------------------------
    def _send(self, c: _Conn, buffers: Sequence[BytesLike], kind: SendKind) -> None:
        """Queue one :class:`SendTo` of ``buffers`` on ``c`` (no round: the Broadcast of a round
        is queued by ``_round`` itself) and count its bytes in ``bytes_out``."""
        bufs = buffers if isinstance(buffers, tuple) else tuple(buffers)
        n = sum(memoryview(b).nbytes for b in bufs)
        self.bytes_out += n
        self._actions.append(SendTo(c.id, bufs, kind, n))

    def _close(self, c: _Conn, reason: str, *, drain: bool = False) -> None:
        if not c.closed:
            c.closed = True
            self._actions.append(CloseConnection(c.id, reason, drain))

    def _fail(self, error: ProtocolError, where: str = "") -> None:
        """The run fails with ``error``; ``where`` (the outcome's detail) names the relay and
        ranks, or the connection, involved."""
        log.info("controller: run failed%s: %s", f" ({where})" if where else "", error)
        self._finish(LifecycleEvent.FAIL, error=error, detail=where)

    def _finish(self, event: LifecycleEvent, *, error: Exception | None = None,
                detail: str = "") -> None:
        if self.finished:
            return
        if event is LifecycleEvent.FAIL:
            self.lifecycle.fire(LifecycleEvent.FAIL, error=error, detail=detail)
        else:
            self.lifecycle.fire(event, detail=detail)
        if self._checkpoint:
            self._actions += self._windows.flush()
        for c in self._conns.values():
            self._close(c, "controller finished")
        for r in self._relays:
            r.frame = None
        outcome = self.outcome
        assert outcome is not None
        log.info("controller: finished: %s", outcome)
        self._actions.append(Finished(outcome))

    def _flush(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

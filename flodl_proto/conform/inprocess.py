"""This package's own controller and relay as in-process conformance targets.

They start exactly what ``flodl-proto controller --no-port-mux`` (or with the mux) and
``flodl-proto relay`` start, minus the process: the same :class:`ReferenceController` and
:class:`Relay` objects, and the exit status the command line would return (0 after a clean end
or a stop request, 1 after an error). The kit's self-check and the test suite use them; a
subclass or factory may be given to run a modified implementation (the broken targets of the
tests).

An in-process target binds a port of the kernel's choosing (``ctx.port`` of the controller role
and ``ctx.listen_port`` of the relay role are not used) and reports the address it listens on,
so no other connection can take its port between the kit's pick and the bind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runner.controller import ReferenceController
from ..runner.relay import Relay
from .target import CaseContext, InProcessTarget

__all__ = ["ControllerHandle", "RelayHandle", "controller_target", "relay_target"]


class ControllerHandle:
    """A started :class:`ReferenceController` seen as a target.

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, ctl: ReferenceController) -> None:
        self.ctl = ctl
        self.address = ctl.address

    def wait_exit(self, timeout: float) -> int | None:
        """0 / 1 once the controller's run ended within ``timeout`` s, else None."""
        outcome = self.ctl.wait(timeout)
        if outcome is None:
            return None
        self.ctl.shutdown()
        return 0 if outcome.clean else 1

    def terminate(self, bound: float) -> int | None:
        """Stop request (as on SIGTERM), then shut down; the exit status."""
        if self.ctl.wait(0) is None:
            self.ctl.request_stop("signal")
        outcome = self.ctl.shutdown(timeout=bound)
        return 0 if outcome.clean else 1


class RelayHandle:
    """A started :class:`Relay` seen as a target.

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.address = relay.address

    def wait_exit(self, timeout: float) -> int | None:
        """0 / 1 once the relay ended within ``timeout`` s, else None."""
        try:
            err = self.relay.wait(timeout)
        except TimeoutError:
            return None
        return 0 if err is None else 1

    def terminate(self, bound: float) -> int | None:
        """Shut down (as on SIGTERM); the exit status."""
        try:
            err = self.relay.shutdown(timeout=bound)
        except TimeoutError:
            return None
        return 0 if err is None else 1


def controller_target(*, port_mux: bool = False,
                      cls: Callable[..., ReferenceController] = ReferenceController,
                      **kwargs: Any) -> Callable[[], InProcessTarget]:
    """A target factory running ``cls`` (default :class:`ReferenceController`) in process.

    No upstream counterpart: upstream has no conformance kit.
    """

    def start(ctx: CaseContext) -> ControllerHandle:
        ctl = cls(ctx.world_size, ctx.salt, host=ctx.host, port=0, version=ctx.version,
                  port_mux=port_mux, **kwargs)
        ctl.start()
        return ControllerHandle(ctl)

    return lambda: InProcessTarget(start)


def relay_target(*, cls: Callable[..., Relay] = Relay,
                 **kwargs: Any) -> Callable[[], InProcessTarget]:
    """A target factory running ``cls`` (default :class:`Relay`) in process.

    No upstream counterpart: upstream has no conformance kit.
    """

    def start(ctx: CaseContext) -> RelayHandle:
        relay = cls((ctx.host, ctx.port), ctx.ranks, ctx.world_size, ctx.salt,
                    version=ctx.version, listen_port=0, host="conform", **kwargs)
        relay.start()
        return RelayHandle(relay)

    return lambda: InProcessTarget(start)

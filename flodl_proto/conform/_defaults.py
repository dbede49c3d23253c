"""The conformance kit's defaults that the command line shows before the kit loads: a leaf
module (the standard library's ``typing`` alone), so ``flodl-proto conform``'s parser, its help
and ``conform docs`` read them without importing the player, the codec or NumPy.

No upstream counterpart: upstream has no conformance kit.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_WITHIN", "DEFAULT_WITHIN_FLOOR", "EXIT_GRACE", "OUTPUT_DRAIN",
           "READY_TIMEOUT", "STOP_BOUND", "default_within"]

# each wait below is also a figure ``docs/conformance.md`` states: :mod:`flodl_proto.conform.doc`
# reads it as it renders

#: seconds a target may take to listen, whatever ``--timeout-scale``: ``--start-timeout``'s
#: default and :class:`~flodl_proto.conform.player.KitSettings`' ``ready_timeout``
READY_TIMEOUT: Final = 20.0
#: seconds between the SIGTERM that stops a target and SIGKILL, whatever ``--timeout-scale``
#: (``KitSettings.stop_bound``'s default)
STOP_BOUND: Final = 5.0
#: seconds a target of a failing case that closed a connection may take to exit by itself
#: before the kit sends SIGTERM, whatever ``--timeout-scale`` (``KitSettings.exit_grace``'s
#: default)
EXIT_GRACE: Final = 1.0
#: seconds the kit goes on reading a target's output once the target has ended: a process it
#: left behind (one of another session, out of reach of the stop signals) that holds its stdout
#: or stderr open is not waited for longer
OUTPUT_DRAIN: Final = 0.5
#: default wait of an expectation at timeout scale 1 (seconds; a conforming target answers at
#: once, so only a failing one waits this long): room for a slow target, multiplied by the
#: timeout scale as the target's own timeouts are
DEFAULT_WITHIN: Final = 5.0
#: the least default wait of an expectation (seconds), whatever the scale: twenty periods of the
#: unscaled 100 ms polls a target answers on (upstream's REDUCE_POLL and relay POLL_TIMEOUT),
#: room for a target on a loaded machine
DEFAULT_WITHIN_FLOOR: Final = 2.0


def default_within(timeout_scale: float) -> float:
    """The wait of a step that gives no ``within`` nor ``within_scaled``, in seconds:
    ``DEFAULT_WITHIN`` (5 s) x ``timeout_scale``, at least ``DEFAULT_WITHIN_FLOOR`` (2 s); 5 s
    at scale 1, 2 s at 0.1.

    A conforming target meets an expectation at once (the wait ends with its bytes, its close
    or its exit); the wait is how long a failing one takes to fail.

    No upstream counterpart: upstream has no conformance kit.
    """
    return max(DEFAULT_WITHIN * timeout_scale, DEFAULT_WITHIN_FLOOR)

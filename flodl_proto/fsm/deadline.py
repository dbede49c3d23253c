"""Round deadlines (an addition to upstream): the decision when a silent peer's share of a round
is given up. Sans-IO: the clock is passed in.

A :class:`RoundDeadline` starts at the round's first deposit (the first HostFrame at the
controller, the first local rank's frame at a relay) and expires ``timeout`` seconds later; the
core that owns it then declares the peers that have not deposited dead and completes the round
with the others. Departures ``round_timeout`` and ``rank_timeout`` in ``spec/wire.yaml``; the
timeouts are off unless configured (upstream leaves failure detection to its coordinator).
"""

from __future__ import annotations

import math
import numbers

from ..errors import protocol_error
from ..spec import SPEC, net_timeout_scale

__all__ = ["RoundDeadline", "check_timeout"]

#: the largest scaled round or rank timeout, seconds
_MAXIMUM = SPEC.timeout("TIMEOUT_OPTION_MAXIMUM")


def check_timeout(name: str, seconds: float | None, *,
                  scale: float | None = None) -> float | None:
    """``seconds`` as a float when it is a positive finite number whose scaled value is at most
    ``TIMEOUT_OPTION_MAXIMUM`` (864000 s, 10 days), None when None.

    Args:
        name: the option, for the error (``"round_timeout"``, ``"rank_timeout"``).
        seconds: the timeout before scaling, or None (no deadline).
        scale: the factor it will be multiplied by (default: ``FLODL_NET_TIMEOUT_SCALE``, as
            :func:`flodl_proto.spec.net_timeout_scale` reads it; 1.0 for a timeout already
            scaled).

    Returns:
        ``seconds`` as a float (not scaled), or None.

    Raises:
        InvalidValue (local): zero, negative, NaN, infinite, or no real number (text, a
            bool, a list: ``deadline.bad_timeout``, naming ``name`` and the value); above
            the maximum once scaled (``deadline.too_long``, naming ``name``, the value, the scale
            and the maximum).

    No upstream counterpart: spec departures ``round_timeout`` and ``rank_timeout``.
    """
    if seconds is None:
        return None
    if not isinstance(seconds, numbers.Real) or isinstance(seconds, bool):
        raise protocol_error("deadline.bad_timeout", name=name, value=seconds)
    try:
        value = float(seconds)
    except OverflowError:  # an int beyond any float: not finite either
        value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise protocol_error("deadline.bad_timeout", name=name, value=seconds)
    factor = net_timeout_scale() if scale is None else scale
    if value * factor > _MAXIMUM:
        raise protocol_error("deadline.too_long", name=name, value=seconds, scale=factor,
                             scaled=value * factor, maximum=_MAXIMUM)
    return value


class RoundDeadline:
    """The deadline of the current round.

    Args:
        timeout: seconds from the round's first deposit, scaled already (None: never expires).
        name: the option, for the error.

    Raises:
        InvalidValue (local): ``timeout`` is not positive and finite (``deadline.bad_timeout``),
            or above ``TIMEOUT_OPTION_MAXIMUM`` (``deadline.too_long``).

    No upstream counterpart: spec departures ``round_timeout`` and ``rank_timeout``.
    """

    __slots__ = ("started", "timeout")

    def __init__(self, timeout: float | None, name: str = "round_timeout") -> None:
        self.timeout = check_timeout(name, timeout, scale=1.0)
        #: time of the current round's first deposit (None: no deposit yet)
        self.started: float | None = None

    def deposit(self, now: float) -> None:
        """A deposit arrived at ``now`` (seconds, any monotonic clock): the first one of the
        round starts the clock."""
        if self.started is None:
            self.started = now

    def due(self) -> float | None:
        """When the deadline expires (None: disabled, or no deposit yet this round)."""
        if self.timeout is None or self.started is None:
            return None
        return self.started + self.timeout

    def expired(self, now: float) -> bool:
        """True when the deadline has passed at ``now``."""
        due = self.due()
        return due is not None and now >= due

    def waited(self, now: float) -> float:
        """Seconds since the round's first deposit (0.0 before it)."""
        return 0.0 if self.started is None else max(0.0, now - self.started)

    def reset(self) -> None:
        """The round completed: the next deposit starts the next round's clock."""
        self.started = None

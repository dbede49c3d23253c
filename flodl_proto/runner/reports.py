"""What the controller runner reports to its caller about each scattered round."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundReport"]


@dataclass(frozen=True, slots=True)
class RoundReport:
    """One scattered round, as the runner saw it (passed to ``on_notice``).

    Attributes:
        round: round number (1-based: the first round is round 1, in every role's messages).
        kind: ``"model"`` or ``"control"``.
        weight: consensus weight (accepted realized-work mass).
        nbytes: Broadcast record length in bytes.
        relays: relays the Broadcast was written to.
        ms: milliseconds from the event that completed the round to the end of its scatter.
        at: wall-clock time of the end of the scatter (seconds since the epoch).

    No upstream counterpart: what this package's controller runner tells its caller; the round it
    describes is that of ``controller/mod.rs`` ``average_and_scatter``.
    """

    round: int
    kind: str
    weight: float
    nbytes: int
    relays: int
    ms: float
    at: float

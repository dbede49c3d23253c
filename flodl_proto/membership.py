"""The dead-rank ledger shared by the coordinator and the controller.

A fixed roster of ``world_size`` ranks, all alive at creation. A rank declared dead stays dead
for the rest of the run (there is no revive). Declaring a rank outside ``0..world_size`` is a
no-op and such a rank reads as alive; a world size of 0 is allowed (every declare is then a
no-op). Thread-safe.

Upstream: ``flodl/src/distributed/controller/dead_ranks.rs`` (``DeadRanks``: a vector of atomic
booleans).
"""

from __future__ import annotations

import threading

from .errors import protocol_error

__all__ = ["DeadRanks"]


class DeadRanks:
    """Which ranks of a fixed world are dead.

    Args:
        world_size: number of ranks (0 allowed).

    Raises:
        InvalidValue (local): ``world_size`` is negative.

    Upstream: ``controller/dead_ranks.rs`` ``DeadRanks::new``.
    """

    __slots__ = ("_dead", "_lock", "_order")

    def __init__(self, world_size: int) -> None:
        n = int(world_size)
        if n < 0:
            raise protocol_error("membership.bad_world_size", world_size=world_size)
        self._dead = [False] * n
        self._order: list[int] = []
        self._lock = threading.Lock()

    def declare_dead(self, rank: int) -> bool:
        """Mark ``rank`` dead for good.

        Returns:
            True when this call changed the ledger (the rank was alive and in range); False when
            it was already dead or out of range (a no-op).

        Upstream: ``controller/dead_ranks.rs`` ``declare_dead``.
        """
        r = int(rank)
        with self._lock:
            if not 0 <= r < len(self._dead) or self._dead[r]:
                return False
            self._dead[r] = True
            self._order.append(r)
            return True

    def is_dead(self, rank: int) -> bool:
        """True when ``rank`` was declared dead (False for any out-of-range rank).

        Upstream: ``controller/dead_ranks.rs`` ``is_dead``.
        """
        r = int(rank)
        with self._lock:
            return 0 <= r < len(self._dead) and self._dead[r]

    def dead_count(self) -> int:
        """Number of dead ranks.

        Upstream: ``controller/dead_ranks.rs`` ``dead_count``.
        """
        with self._lock:
            return len(self._order)

    def world_size(self) -> int:
        """The roster size given at creation.

        Upstream: ``controller/dead_ranks.rs`` ``world_size``.
        """
        return len(self._dead)

    def dead_ranks(self) -> list[int]:
        """The dead ranks, ascending."""
        with self._lock:
            return sorted(self._order)

    def alive_ranks(self) -> list[int]:
        """The ranks not declared dead, ascending."""
        with self._lock:
            return [r for r, d in enumerate(self._dead) if not d]

    def __repr__(self) -> str:
        return f"DeadRanks(world_size={self.world_size()}, dead={self.dead_ranks()})"

"""The dead-rank ledger shared by the coordinator and the controller.

A fixed roster of ``world_size`` ranks, all alive at creation. A rank declared dead stays dead
for the rest of the run (there is no revive). Declaring a rank outside ``0..world_size`` is a
no-op and such a rank reads as alive; a world size of 0 is allowed (every declare is then a
no-op). Thread-safe.

The ledger is sparse: it stores the world size and the set of dead ranks, so its memory grows with
the deaths declared, not with the world size (a world of ``2**32 - 1`` ranks, the largest the
handshake's u32 field carries, costs a few hundred bytes until ranks die).

Upstream: ``flodl/src/distributed/controller/dead_ranks.rs`` (``DeadRanks``: one atomic boolean
per rank, allocated and written at creation, so about 4 GiB for a world of ``u32::MAX`` ranks, and
``dead_count`` scans the whole roster). We differ on purpose: Python would need about 8 bytes per
rank for a list of booleans (32 GiB at ``2**32 - 1``), which a controller started with a large
``--world-size`` must not allocate before any relay has arrived; the answers are the same.
"""

from __future__ import annotations

import itertools
import threading

from .codec._common import wire_int
from .errors import protocol_error

__all__ = ["DeadRanks"]


class DeadRanks:
    """Which ranks of a fixed world are dead.

    Memory: O(number of dead ranks), whatever ``world_size`` is.

    Args:
        world_size: number of ranks (0 allowed).

    Raises:
        InvalidValue (local): ``world_size`` is negative, or is not an integer
            (``controller.bad_argument``: a bool, a float or text is refused, never truncated or
            parsed; NumPy integers are taken). A rank given to :meth:`declare_dead` or
            :meth:`is_dead` follows the same rule.

    Upstream: ``controller/dead_ranks.rs`` ``DeadRanks::new`` (a vector of ``world_size`` flags;
    this ledger keeps the set of dead ranks instead, see the module docstring).
    """

    __slots__ = ("_dead", "_lock", "_world_size")

    def __init__(self, world_size: int) -> None:
        n = _whole("world_size", world_size)
        if n < 0:
            raise protocol_error("membership.bad_world_size", world_size=world_size)
        self._world_size = n
        self._dead: set[int] = set()
        self._lock = threading.Lock()

    def declare_dead(self, rank: int) -> bool:
        """Mark ``rank`` dead for good.

        Returns:
            True when this call changed the ledger (the rank was alive and in range); False when
            it was already dead or out of range (a no-op).

        Upstream: ``controller/dead_ranks.rs`` ``declare_dead``.
        """
        r = rank if type(rank) is int else _whole("rank", rank)
        with self._lock:
            if not 0 <= r < self._world_size or r in self._dead:
                return False
            self._dead.add(r)
            return True

    def is_dead(self, rank: int) -> bool:
        """True when ``rank`` was declared dead (False for any out-of-range rank).

        Upstream: ``controller/dead_ranks.rs`` ``is_dead``.
        """
        r = rank if type(rank) is int else _whole("rank", rank)
        with self._lock:
            return r in self._dead

    def dead_count(self) -> int:
        """Number of dead ranks.

        Upstream: ``controller/dead_ranks.rs`` ``dead_count`` (which counts the flags; this is the
        size of the set: one atomic read, so no lock is taken; the controller asks it several
        times per record).
        """
        return len(self._dead)

    def world_size(self) -> int:
        """The roster size given at creation.

        Upstream: ``controller/dead_ranks.rs`` ``world_size``.
        """
        return self._world_size

    def dead_ranks(self) -> list[int]:
        """The dead ranks, ascending (as many as were declared dead)."""
        with self._lock:
            return sorted(self._dead)

    def alive_ranks(self, limit: int | None = None) -> list[int]:
        """The ranks not declared dead, ascending: the first ``limit`` of them, or all of them
        when ``limit`` is None (then ``world_size - dead_count`` ints: pass a limit when the world
        size is not known to be small). Takes at most ``limit + dead_count`` steps. A negative
        limit lists none.
        """
        with self._lock:
            dead = set(self._dead)
        alive = (r for r in range(self._world_size) if r not in dead)
        return list(alive if limit is None else itertools.islice(alive, max(0, limit)))

    def __repr__(self) -> str:
        return f"DeadRanks(world_size={self.world_size()}, dead={self.dead_ranks()})"


def _whole(field: str, value: object) -> int:
    """``value`` as an ``int`` by the codec's integer rule (NumPy integers are taken; a bool, a
    float or text is refused, never truncated or parsed).

    Raises:
        InvalidValue (local): ``controller.bad_argument`` naming ``field`` and the value.
    """
    n = wire_int(value)
    if n is None:
        raise protocol_error("controller.bad_argument", field=field, value=value,
                             reason="not an integer")
    return n

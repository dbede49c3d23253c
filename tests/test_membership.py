"""DeadRanks: the dead-rank ledger."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

from flodl_proto.errors import InvalidValue, LocalProtocolError
from flodl_proto.membership import DeadRanks


def test_starts_all_alive_and_never_revives() -> None:
    d = DeadRanks(4)
    assert d.world_size() == 4
    assert d.dead_count() == 0
    assert not any(d.is_dead(r) for r in range(4))
    assert d.declare_dead(2) is True
    assert d.declare_dead(2) is False  # idempotent
    assert d.is_dead(2) and not d.is_dead(1)
    assert d.dead_count() == 1
    assert d.dead_ranks() == [2]
    assert d.alive_ranks() == [0, 1, 3]


def test_out_of_range_is_a_no_op_and_reads_alive() -> None:
    d = DeadRanks(2)
    assert d.declare_dead(2) is False
    assert d.declare_dead(-1) is False
    assert not d.is_dead(2) and not d.is_dead(-1)
    assert d.dead_count() == 0


def test_empty_world_is_allowed() -> None:
    d = DeadRanks(0)
    d.declare_dead(0)
    assert not d.is_dead(0)
    assert d.dead_count() == 0
    assert d.world_size() == 0


def test_negative_world_size_is_refused() -> None:
    with pytest.raises(InvalidValue) as ei:
        DeadRanks(-1)
    assert str(ei.value) == "dead_ranks: world_size -1 must not be negative"


def test_concurrent_declares_count_once() -> None:
    d = DeadRanks(64)
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        for r in range(64):
            d.declare_dead(r)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.dead_count() == 64
    assert d.dead_ranks() == list(range(64))


def test_alive_ranks_lists_the_lowest_up_to_a_limit() -> None:
    d = DeadRanks(6)
    d.declare_dead(1)
    d.declare_dead(2)
    assert d.alive_ranks() == [0, 3, 4, 5] == d.alive_ranks(10)
    assert d.alive_ranks(2) == [0, 3]
    assert d.alive_ranks(0) == [] and d.alive_ranks(-1) == []


@pytest.mark.parametrize("world", [0, 1, 2, 5])
def test_answers_match_a_per_rank_list(world: int) -> None:
    # the sparse ledger answers exactly as one flag per rank would (upstream's layout)
    d = DeadRanks(world)
    flags = [False] * world
    for rank in [world, 0, -1, world - 1, 0, world + 3, 1]:
        changed = 0 <= rank < world and not flags[rank]
        if changed:
            flags[rank] = True
        assert d.declare_dead(rank) is changed
        for r in range(-2, world + 2):
            assert d.is_dead(r) is (0 <= r < world and flags[r])
        assert d.dead_count() == sum(flags)
        assert d.dead_ranks() == [r for r in range(world) if flags[r]]
        assert d.alive_ranks() == [r for r in range(world) if not flags[r]]
        assert repr(d) == f"DeadRanks(world_size={world}, dead={d.dead_ranks()})"
    assert d.world_size() == world


def test_the_largest_world_is_sparse() -> None:
    # 2**32 - 1 ranks (the handshake's u32 maximum): memory follows the deaths, not the world
    world = 2**32 - 1
    tracemalloc.start()
    try:
        d = DeadRanks(world)
        assert d.declare_dead(world - 1) is True
        assert d.declare_dead(world) is False
        assert d.declare_dead(0) is True
        alive = d.alive_ranks(3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert d.world_size() == world
    assert d.is_dead(world - 1) and d.is_dead(0) and not d.is_dead(1) and not d.is_dead(world)
    assert d.dead_count() == 2
    assert d.dead_ranks() == [0, world - 1]
    assert alive == [1, 2, 3]
    assert repr(d) == f"DeadRanks(world_size={world}, dead=[0, {world - 1}])"


@pytest.mark.parametrize("bad", ["4", 1.5, True, None])
def test_a_world_size_or_rank_that_is_not_an_integer_is_refused(bad: object) -> None:
    """``DeadRanks("4")`` had world size 4, ``DeadRanks(1.5)`` 1, ``DeadRanks(True)`` 1 (int()
    of anything); the same of a rank given to declare_dead / is_dead."""
    with pytest.raises(InvalidValue) as ei:
        DeadRanks(bad)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == (f"cluster_controller: world_size = {bad!r} is invalid: not an "
                             "integer")
    ledger = DeadRanks(4)
    for call in (ledger.declare_dead, ledger.is_dead):
        with pytest.raises(InvalidValue) as ei:
            call(bad)  # type: ignore[arg-type]
        assert str(ei.value) == f"cluster_controller: rank = {bad!r} is invalid: not an integer"
    assert ledger.dead_ranks() == []
    assert DeadRanks(np.int64(3)).world_size() == 3 and ledger.declare_dead(np.int32(2))

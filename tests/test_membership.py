"""DeadRanks: the dead-rank ledger."""

from __future__ import annotations

import threading

import pytest

from flodl_proto.errors import InvalidValue
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
    with pytest.raises(InvalidValue):
        DeadRanks(-1)


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

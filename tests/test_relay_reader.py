"""``runner.relay_reader.BufferPool``: a record buffer is handed out again only when no view of
it is alive (frames decoded from a record are views of its buffer), and at most
``POOL_PER_CONN`` buffers are kept."""

from __future__ import annotations

from flodl_proto.runner.relay_reader import POOL_PER_CONN, BufferPool
from flodl_proto.spec import MUX_HEADER_LEN


def test_a_free_buffer_is_reused_with_its_bytes_and_a_held_one_is_not() -> None:
    pool = BufferPool()
    first = pool.acquire()
    assert first == bytearray(MUX_HEADER_LEN)
    first[:] = b"\x05" * 40  # the reader grew it for a record
    assert pool.acquire() is first
    assert first == b"\x05" * 40  # the probe left the record's bytes and length as they were
    view = memoryview(first)[3:7]  # a decoded frame still holds part of the record
    second = pool.acquire()
    assert second is not first
    assert second == bytearray(MUX_HEADER_LEN)
    assert first == b"\x05" * 40
    del view
    assert pool.acquire() is first


def test_the_pool_keeps_at_most_pool_per_conn_buffers() -> None:
    pool = BufferPool()
    held = [memoryview(pool.acquire()) for _ in range(POOL_PER_CONN + 2)]
    bufs = [v.obj for v in held]
    assert len({id(b) for b in bufs}) == POOL_PER_CONN + 2
    del held
    # the first POOL_PER_CONN were kept; the others were handed out once and dropped
    assert [pool.acquire() is bufs[0] for _ in range(2)] == [True, True]
    views = [memoryview(pool.acquire()) for _ in range(POOL_PER_CONN)]
    assert [v.obj for v in views] == bufs[:POOL_PER_CONN]
    extra = pool.acquire()
    assert all(extra is not b for b in bufs)

"""HostFold edges written out exactly: the death that completes a round returns its HostFrame
payload, a seed whose payload disagrees with its shape names every field."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import HostFold
from flodl_proto.reduce.payload import encode_payload

SALT = bytes(range(16))


def _blob(*values: float) -> bytes:
    return encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.asarray(values, np.float32))]), SALT)


def test_the_death_that_completes_a_round_returns_its_payload() -> None:
    f = HostFold([0, 1], SALT)
    assert f.deposit(0, _blob(1.0, 2.0)) is None
    out = f.declare_dead(1)
    assert isinstance(out, bytes) and out == _blob(1.0, 2.0)  # one depositor: verbatim
    assert f.declare_dead(1) is None  # idempotent


def test_a_seed_whose_payload_disagrees_with_its_shape() -> None:
    bad = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload(0, (3,), bytes(8))]), SALT)
    f = HostFold([0, 1], SALT)
    with pytest.raises(ProtocolError) as ei:
        f.deposit(0, bad)
        f.deposit(1, bad)
    assert ei.value.error_id == "fold.seed_promotion"
    assert dict(ei.value.fields) == {"got": 8, "numel": 3, "element_size": 4}


def test_encode_payload_of_plain_floats() -> None:
    assert encode_payload(0, [1.5, -2.0]) == np.asarray([1.5, -2.0], np.float32).tobytes()
    assert encode_payload(1, [[1.0], [3.0]]) == np.asarray([0x3F80, 0x4040], np.uint16).tobytes()


@pytest.mark.parametrize(("ceiling", "refused"), [(500, True), (799, True), (800, False)])
def test_an_elided_seed_counts_every_tensor_against_the_ceiling(ceiling: int,
                                                                refused: bool) -> None:
    elided = TensorPayload(0, (100,), b"")
    full = TensorPayload.from_array(np.ones(100, np.float32))
    seed = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 0.0, [elided, elided]), SALT)
    part = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [full, elided]), SALT)
    f = HostFold([0, 1], SALT, version=3, ceiling=ceiling)
    f.deposit(0, seed)
    if not refused:
        assert f.deposit(1, part) is not None
        return
    with pytest.raises(ProtocolError) as ei:
        f.deposit(1, part)
    assert ei.value.error_id == "fold.elided_too_large"
    assert dict(ei.value.fields) == {"nbytes": 800, "ceiling": ceiling}


def test_a_deposit_with_more_tensors_than_the_seed() -> None:
    f = HostFold([0, 1], SALT)
    f.deposit(0, _blob(1.0))
    two = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.ones(1, np.float32))] * 2), SALT)
    with pytest.raises(ProtocolError) as ei:
        f.deposit(1, two)
    assert ei.value.error_id == "fold.more_tensors"
    assert dict(ei.value.fields) == {"rank": 1, "expected": 1}


def test_the_array_pool_keeps_two_rounds_and_reuses_free_arrays() -> None:
    """An array not handed out in the round just closed or the one before is dropped; a free
    array of the same size and dtype is handed out again, one still referenced is not."""
    from flodl_proto.reduce.host_fold import _ArrayPool

    f32 = np.dtype("<f4")
    pool = _ArrayPool()
    first = pool.acquire(4, f32)
    assert pool.acquire(4, f32) is not first  # still referenced here: a second array
    assert len(pool) == 2
    first_id = id(first)
    del first
    pool.end_round()  # round 0 closed: both were handed out in it
    assert len(pool) == 2
    again = pool.acquire(4, f32)  # round 1: the free array of round 0 again
    assert id(again) == first_id
    del again
    assert pool.acquire(5, f32).shape == (5,) and len(pool) == 3  # another size: a new array
    pool.end_round()  # round 1 closed: rounds 0 and 1 are kept
    assert len(pool) == 3
    pool.end_round()  # round 2 closed: the array last handed out in round 0 goes
    assert len(pool) == 2
    pool.end_round()  # round 3 closed: nothing was handed out in rounds 2 and 3
    assert len(pool) == 0
    pool.acquire(4, f32)  # round 4
    pool.end_round()
    pool.end_round()
    assert len(pool) == 1
    pool.end_round()
    assert len(pool) == 0

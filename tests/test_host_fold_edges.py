"""HostFold edges written out exactly: the death that completes a round returns its HostFrame
payload, a seed whose payload disagrees with its shape names every field."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.errors import InvalidValue, LocalProtocolError, ProtocolError
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
        TensorPayload(0, (3,), bytes(8))], check_nbytes=False), SALT)
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


# -- every fold error names its fields exactly; the fold stays failed -----------------------------

def _frame(*tensors: TensorPayload, weight: float = 1.0,
           kind: RoundKind = RoundKind.MODEL) -> bytes:
    return encode_round_frame_bytes(RoundFrame(kind, weight, list(tensors), check_nbytes=False),
                                    SALT)


def _f32(*values: float) -> TensorPayload:
    return TensorPayload.from_array(np.asarray(values, np.float32))


def _bf16(*values: float) -> TensorPayload:
    """bf16 payload of values exact in bf16 (the top 16 bits of their f32 patterns)."""
    bits = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2")
    return TensorPayload(1, (len(values),), bits.tobytes())


def _fails(fold: HostFold, rank: int, blob: bytes, error_id: str,
           fields: dict[str, object]) -> None:
    with pytest.raises(ProtocolError) as ei:
        fold.deposit(rank, blob)
    assert ei.value.error_id == error_id
    assert dict(ei.value.fields) == fields
    assert fold.error is ei.value
    with pytest.raises(ProtocolError) as again:  # fatal: every later call raises it again
        fold.declare_dead(rank)
    assert again.value is ei.value


def _seeded(blob: bytes, ranks: tuple[int, ...] = (0, 1), **kw: int) -> HostFold:
    f = HostFold(ranks, SALT, **kw)
    assert f.deposit(ranks[0], blob) is None
    return f


def test_fold_errors_name_their_fields() -> None:
    one = _frame(_f32(1.0))
    f = HostFold([0, 1], SALT)
    with pytest.raises(ProtocolError) as ei:
        f.deposit(7, one)
    assert ei.value.error_id == "fold.unknown_rank"
    assert dict(ei.value.fields) == {"rank": 7, "ranks": [0, 1]}
    assert f.error is None  # local misuse is not fatal
    _fails(HostFold([0, 1], SALT), 0, b"", "fold.truncated", {"rank": 0})
    _fails(_seeded(one), 1, b"", "fold.truncated", {"rank": 1})
    _fails(_seeded(one), 0, one, "fold.double_deposit", {"rank": 0})
    _fails(_seeded(one), 1, _frame(_f32(1.0), kind=RoundKind.CONTROL), "fold.kind_mismatch",
           {"rank": 1, "got": "Control", "expected": "Model"})
    _fails(_seeded(_frame(_f32(1.0), _f32(2.0))), 1, one, "fold.fewer_tensors",
           {"rank": 1, "got": 1, "expected": 2})
    _fails(_seeded(one), 1, _frame(_f32(1.0), _f32(2.0)), "fold.more_tensors",
           {"rank": 1, "expected": 1})
    _fails(_seeded(one), 1, _frame(_bf16(1.0)), "fold.dtype_mismatch",
           {"rank": 1, "index": 0, "got": 1, "expected": 0})
    _fails(_seeded(one), 1, _frame(_f32(1.0, 2.0)), "fold.shape_mismatch",
           {"rank": 1, "index": 0, "got": [2], "expected": [1]})
    _fails(_seeded(_frame(_f32(1.0, 2.0)), version=2), 1,
           _frame(TensorPayload(0, (2,), b""), weight=0.0), "fold.accumulate_nbytes",
           {"rank": 1, "index": 0, "got": 0, "numel": 2, "element_size": 4})
    _fails(_seeded(_frame(TensorPayload(9, (1,), bytes(4)))), 1,
           _frame(TensorPayload(9, (1,), bytes(4))), "fold.unknown_dtype", {"dtype": 9})
    _fails(_seeded(_frame(_f32(1.0), weight=1.5e308)), 1, _frame(_f32(1.0), weight=1.5e308),
           "fold.weight_overflow", {"rank": 1, "weight": 1.5e308, "total": float("inf")})


def test_a_later_deposit_is_checked_tensor_by_tensor_up_to_a_reader_error() -> None:
    """The reader fails at tensor 1 (past the ceiling: 64 + 4 bytes > 64): tensor 0 was
    delivered first and its schema error wins; with tensor 0 matching, the reader's error."""
    seed = _frame(TensorPayload.from_array(np.arange(16, dtype=np.float32)))
    over = _frame(TensorPayload.from_array(np.arange(16, dtype=np.float32)), _f32(1.0))
    _fails(_seeded(seed, ceiling=64), 1, over, "frame.past_ceiling",
           {"index": 1, "ceiling": 64, "nbytes": 4, "total": 68})
    wrong0 = _frame(TensorPayload.from_array(np.arange(8, dtype=np.float32)), _f32(*range(9)))
    _fails(_seeded(seed, ceiling=64), 1, wrong0, "fold.shape_mismatch",
           {"rank": 1, "index": 0, "got": [8], "expected": [16]})
    _fails(HostFold([0, 1], SALT, ceiling=60), 0, seed, "frame.past_ceiling",
           {"index": 0, "ceiling": 60, "nbytes": 64, "total": 64})
    bad_magic = b"\x00" + one_frame()[1:]
    _fails(_seeded(one_frame()), 1, bad_magic, "frame.bad_magic",
           {"got": 0xF10D1700, "expected": 0xF10D17F1})


def one_frame() -> bytes:
    return _frame(_f32(1.0))


def test_the_fold_trusts_the_premac_it_is_handed() -> None:
    """A premac is the MAC of the bytes as they arrived: the fold compares the frame's tag with
    it and does not hash the bytes again, so a premac of other bytes (here a frame of the same
    size with other values) fails a frame whose own tag is right, as the seed and later."""
    from flodl_proto.codec.auth import Premac, new_mac

    good, other = _frame(_f32(1.0, 2.0)), _frame(_f32(3.0, 4.0))
    assert len(good) == len(other)
    mac = new_mac(SALT)
    mac.update(other[:-8])
    wrong = Premac(len(other) - 8, mac.digest())
    f = HostFold([0, 1], SALT)
    with pytest.raises(ProtocolError) as ei:
        f.deposit(0, good, premac=wrong)
    assert ei.value.error_id == "frame.auth_failed"
    f = _seeded(good)
    with pytest.raises(ProtocolError) as ei:
        f.deposit(1, good, premac=wrong)
    assert ei.value.error_id == "frame.auth_failed"
    right = new_mac(SALT)
    right.update(other[:-8])  # the premac of the bytes handed over: accepted
    f = _seeded(good)
    out = f.deposit(1, other, premac=Premac(len(other) - 8, right.digest()))
    assert out == _frame(_f32(4.0, 6.0), weight=2.0)


@pytest.mark.parametrize("dtype", [0, 1])
@pytest.mark.parametrize("dies", [0, 2])
def test_a_death_mid_round_does_not_make_an_early_deposit_the_last(dtype: int, dies: int) -> None:
    """Three ranks; rank ``dies`` is declared dead after rank 0's seed (its own seed stays in
    the round) or before depositing. The round completes on the last live deposit and sums
    every deposit made: 1 + 2 (+ 4) per element, weights likewise."""
    make = _f32 if dtype == 0 else _bf16
    f = HostFold([0, 1, 2], SALT)
    assert f.deposit(0, _frame(make(1.0, 10.0), weight=1.0)) is None
    assert f.declare_dead(dies) is None
    out = f.deposit(1, _frame(make(2.0, 20.0), weight=2.0))
    if dies == 0:
        assert out is None
        out = f.deposit(2, _frame(make(4.0, 40.0), weight=4.0))
        assert out == _frame(make(7.0, 70.0), weight=7.0)
    else:
        assert out == _frame(make(3.0, 30.0), weight=3.0)
    assert f.rounds_completed == 1


def test_rounds_completed_counts_every_host_frame() -> None:
    f = HostFold([0, 1], SALT)
    for k in range(3):
        assert f.rounds_completed == k
        f.deposit(0, _frame(_f32(1.0)))
        assert f.deposit(1, _frame(_f32(2.0))) == _frame(_f32(3.0), weight=2.0)
    assert f.rounds_completed == 3
    f.deposit(0, _frame(_f32(1.0)))
    assert f.declare_dead(1) == _frame(_f32(1.0))  # a lone deposit: verbatim
    assert f.rounds_completed == 4


@pytest.mark.parametrize("dtype", [0, 1])
def test_a_promoted_round_ships_a_tensor_elided_by_every_deposit_as_zeros(dtype: int) -> None:
    """Version 3: the seed elides both tensors, the last deposit carries tensor 0 only. The
    round was promoted, so tensor 1 (never merged) ships as zeros, not elided."""
    make = _f32 if dtype == 0 else _bf16
    elided = TensorPayload(dtype, (2,), b"")
    f = _seeded(_frame(elided, elided, weight=0.0), version=3)
    out = f.deposit(1, _frame(make(1.0, 2.0), elided, weight=1.0))
    assert out == _frame(make(1.0, 2.0), make(0.0, 0.0), weight=1.0)


def test_overflow_and_nan_arithmetic_emits_no_warning() -> None:
    """inf and NaN results are the protocol's arithmetic, not errors: neither the relay's fold
    nor the controller's reduce lets NumPy warn about them (warnings are errors here)."""
    import warnings

    from flodl_proto.reduce import reduce_realized_work, sum_frames
    from flodl_proto.reduce._kernels import SMALL_ELEMS

    big = 3e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for make in (_f32, _bf16):
            f = HostFold([0, 1, 2], SALT)
            f.deposit(0, _frame(make(big, float("inf"))))
            f.deposit(1, _frame(make(big, float("-inf"))))  # sums materialised: inf, NaN
            out = f.deposit(2, _frame(make(big, 1.0)))
            assert out is not None
            frames = [RoundFrame(RoundKind.MODEL, 1.0, [make(big, float("inf"))]),
                      RoundFrame(RoundKind.MODEL, 1.0, [make(big, float("-inf"))])]
            summed = sum_frames(frames)
            assert np.isinf(summed.tensors[0].array()[0])
            assert np.isnan(summed.tensors[0].array()[1])
            reduced = reduce_realized_work(frames)
            assert np.isinf(reduced.tensors[0].array()[0])
        many = np.full(SMALL_ELEMS, big, np.float32)  # the general (chunked) path
        frames = [RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(many)])] * 2
        assert np.isinf(sum_frames(frames).tensors[0].array()).all()
        f = HostFold([0, 1], SALT)
        f.deposit(0, encode_round_frame_bytes(frames[0], SALT))
        f.deposit(1, encode_round_frame_bytes(frames[1], SALT))
        f2 = HostFold([0, 1, 2], SALT)
        f2.deposit(0, _frame(_f32(big)))
        f2.deposit(1, _frame(_f32(big)))
        assert f2.declare_dead(2) == _frame(_f32(float("inf")), weight=2.0)
        f3 = HostFold([0, 1], SALT)  # the completing deposit's own add overflows
        f3.deposit(0, _frame(_f32(big)))
        assert f3.deposit(1, _frame(_f32(big))) == _frame(_f32(float("inf")), weight=2.0)
        f4 = HostFold([0, 1, 2], SALT)  # a death completes the round: NaN sums encoded
        f4.deposit(0, _frame(_bf16(float("inf"))))
        f4.deposit(1, _frame(_bf16(float("-inf"))))
        out4 = f4.declare_dead_frame(2)
        assert isinstance(out4, RoundFrame) and np.isnan(out4.tensors[0].array()[0])


def test_a_small_bf16_round_sums_tensors_of_different_sizes() -> None:
    """The small path's one workspace serves every tensor of the round (sizes 1, 5 and 3)."""
    from flodl_proto.reduce import reduce_realized_work, sum_frames

    a = RoundFrame(RoundKind.MODEL, 1.0, [_bf16(1.0), _bf16(1.0, 2.0, 3.0, 4.0, 5.0),
                                          _bf16(0.5, 0.25, 8.0)])
    b = RoundFrame(RoundKind.MODEL, 3.0, [_bf16(2.0), _bf16(4.0, 4.0, 4.0, 4.0, 4.0),
                                          _bf16(0.5, 0.75, -8.0)])
    out = sum_frames([a, b])
    assert [t.array().tolist() for t in out.tensors] == [[3.0], [5.0, 6.0, 7.0, 8.0, 9.0],
                                                         [1.0, 1.0, 0.0]]
    avg = reduce_realized_work([a, b])
    assert [t.array().tolist() for t in avg.tensors] == [[0.75], [1.25, 1.5, 1.75, 2.0, 2.25],
                                                         [0.25, 0.25, 0.0]]
    assert out.weight == avg.weight == 4.0


@pytest.mark.parametrize("dtype", [0, 1])
def test_a_zero_element_tensor_beside_a_large_one(dtype: int) -> None:
    """A round with one tensor of SMALL_ELEMS elements (the chunked path) and one of zero
    elements: the large one sums element-wise, the empty one stays empty, in the controller's
    reduce (one thread) and the relay's fold."""
    from flodl_proto.reduce import reduce_realized_work, sum_frames
    from flodl_proto.reduce._kernels import SMALL_ELEMS

    make = _f32 if dtype == 0 else _bf16
    ones = [1.0] * SMALL_ELEMS
    empty = TensorPayload(dtype, (0,), b"")
    a = RoundFrame(RoundKind.MODEL, 1.0, [make(*ones), empty])
    b = RoundFrame(RoundKind.MODEL, 1.0, [make(*[2.0] * SMALL_ELEMS), empty])
    want = RoundFrame(RoundKind.MODEL, 2.0, [make(*[3.0] * SMALL_ELEMS), empty])
    assert sum_frames([a, b], threads=1) == want
    assert reduce_realized_work([a, b], threads=1) == RoundFrame(
        RoundKind.MODEL, 2.0, [make(*[1.5] * SMALL_ELEMS), empty])
    f = HostFold([0, 1], SALT)
    f.deposit(0, encode_round_frame_bytes(a, SALT))
    assert f.deposit(1, encode_round_frame_bytes(b, SALT)) == encode_round_frame_bytes(want, SALT)


@pytest.mark.parametrize("version", [2, 3])
def test_a_byte_count_error_on_the_per_tensor_path_names_every_field(version: int) -> None:
    """``fold.accumulate_nbytes`` from the per-tensor merge (``HostFold._merge_tensor``), which
    a two-rank round of small tensors no longer reaches (its completion checks byte counts
    itself): a deposit that does not complete the round (three ranks), and a completing
    deposit whose tensor has ``SMALL_ELEMS`` elements (too large for the batched completion)."""
    from flodl_proto.errors import SchemaMismatch
    from flodl_proto.reduce._kernels import SMALL_ELEMS

    seed = _frame(_f32(1.0, 2.0), _bf16(1.0, 2.0, 3.0))
    short = _frame(_f32(3.0, 4.0), TensorPayload(1, (3,), bytes(4)))
    f = _seeded(seed, ranks=(0, 1, 2), version=version)
    _fails(f, 2, short, "fold.accumulate_nbytes",
           {"rank": 2, "index": 1, "got": 4, "numel": 3, "element_size": 2})
    assert isinstance(f.error, SchemaMismatch) and f.error.remote
    assert str(f.error) == ("relay fold: rank 2 tensor[1]: payload byte count 4 != "
                            "accumulator numel 3 x element size 2")

    large = _f32(*[1.0] * SMALL_ELEMS)
    f = _seeded(_frame(_f32(1.0), large), version=version)
    _fails(f, 1, _frame(_f32(2.0), TensorPayload(0, (SMALL_ELEMS,), bytes(12))),
           "fold.accumulate_nbytes",
           {"rank": 1, "index": 1, "got": 12, "numel": SMALL_ELEMS, "element_size": 4})


@pytest.mark.parametrize("ceiling", [-1, None, 1.5, True, "1024"])
def test_a_bad_ceiling_is_refused_when_the_fold_is_built(ceiling: object) -> None:
    with pytest.raises(InvalidValue) as ei:
        HostFold([0], SALT, ceiling=ceiling)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "ceiling.invalid"
    assert ei.value.fields == {"value": ceiling}


def test_a_numpy_integer_ceiling_and_ranks_are_taken() -> None:
    fold = HostFold([np.int64(1), np.uint32(0)], SALT, ceiling=np.int64(1 << 20))
    assert fold.local_ranks == (0, 1)
    assert all(type(r) is int for r in fold.local_ranks)
    assert fold.deposit(np.int64(0), _blob(1.0)) is None
    assert fold.deposited == frozenset({0})


@pytest.mark.parametrize(("ranks", "field", "value"), [
    ([1.9, "2"], "local_ranks[0]", 1.9),
    ([0, "2"], "local_ranks[1]", "2"),
    ([-1], "local_ranks[0]", -1),
    ([1 << 32], "local_ranks[0]", 1 << 32),
    ([None], "local_ranks[0]", None),
    ([True], "local_ranks[0]", True),
    ("01", "local_ranks", "01"),
    (None, "local_ranks", None),
    (3, "local_ranks", 3),
])
def test_a_roster_of_non_rank_ids_is_refused(ranks: object, field: str, value: object) -> None:
    with pytest.raises(InvalidValue) as ei:
        HostFold(ranks, SALT)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "fold.bad_argument"
    assert ei.value.fields["field"] == field
    assert ei.value.fields["value"] == value
    assert f"relay fold: {field} = {value!r} is invalid" in str(ei.value)


@pytest.mark.parametrize("rank", [True, 0.0, np.float64(1.0), "0", None, np.bool_(True)])
def test_a_deposit_for_a_non_rank_id_is_refused_and_not_fatal(rank: object) -> None:
    fold = HostFold([0, 1], SALT)
    with pytest.raises(InvalidValue) as ei:
        fold.deposit(rank, _blob(1.0))  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "fold.bad_argument"
    assert ei.value.fields["field"] == "rank"
    assert ei.value.fields["value"] is rank
    assert f"rank = {rank!r} is invalid" in str(ei.value)
    assert fold.error is None
    assert fold.deposited == frozenset()
    assert fold.deposit(0, _blob(1.0)) is None  # the fold goes on


@pytest.mark.parametrize("query", ["is_alive", "has_deposited"])
def test_the_rank_queries_take_the_integer_rule(query: str) -> None:
    """``is_alive(True)`` and ``is_alive(0.0)`` answered as for rank 1 and 0, and a 0-d array
    raised TypeError (unhashable)."""
    fold = HostFold([0, 1], SALT)
    assert fold.deposit(0, _blob(1.0)) is None
    ask = getattr(fold, query)
    assert ask(0) is True and ask(np.array(0)) is True and ask(np.int64(0)) is True
    assert ask(5) is False
    for rank in (True, 0.0, "0", None, np.array([0])):
        with pytest.raises(InvalidValue) as ei:
            ask(rank)
        assert isinstance(ei.value, LocalProtocolError)
        assert ei.value.error_id == "fold.bad_argument"
        assert ei.value.fields["field"] == "rank" and ei.value.fields["value"] is rank


@pytest.mark.parametrize("rank", [None, "x", "0", 1.0, True, -1, 1 << 32])
def test_declare_dead_refuses_a_non_rank_id(rank: object) -> None:
    fold = HostFold([0], SALT)
    with pytest.raises(InvalidValue) as ei:
        fold.declare_dead(rank)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "fold.bad_argument"
    assert ei.value.fields["field"] == "rank"
    assert fold.dead_ranks == frozenset()
    assert fold.error is None


def test_declare_dead_takes_any_rank_id() -> None:
    fold = HostFold([0], SALT)
    assert fold.declare_dead(7) is None  # not a local rank: accepted (upstream's mark_dead)
    assert fold.declare_dead(np.int32(9)) is None
    assert fold.dead_ranks == frozenset({7, 9})


def test_a_roster_that_is_a_0d_array_is_refused() -> None:
    # an Iterable whose iteration raises: it was numpy's "TypeError: iteration over a 0-d array"
    with pytest.raises(InvalidValue) as ei:
        HostFold(np.array(3), SALT)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == ("relay fold: local_ranks = array(3) is invalid: not an iterable of "
                             "rank ids")
    assert HostFold(np.array([1, 0]), SALT).local_ranks == (0, 1)

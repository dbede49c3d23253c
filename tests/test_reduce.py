"""Reduce engine: sum_frames, reduce_realized_work, HostFold, mass policies, outer optimizers.

Named after the upstream tests they mirror (``controller_tests.rs``, ``relay/agent_tests.rs``,
``realized_work.rs``, ``outer_optimizer.rs``), plus Hypothesis properties.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flodl_proto.codec.round_frame import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame_or_eos,
    encode_round_frame_bytes,
)
from flodl_proto.errors import (
    AuthenticationError,
    InvalidValue,
    LimitExceeded,
    ProtocolError,
    SchemaMismatch,
    SequenceError,
    TruncatedInput,
)
from flodl_proto.reduce import (
    HostFold,
    NesterovMomentum,
    OuterAvg,
    OuterStepper,
    SlowMomentum,
    decode_payload,
    encode_payload,
    gamma_mass,
    is_realized,
    mover_mass,
    reduce_realized_work,
    sum_frames,
)

SALT = bytes(16)
SALT_B = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
MODEL, CONTROL = RoundKind.MODEL, RoundKind.CONTROL
F32, BF16 = int(Dtype.F32), int(Dtype.BF16)


def tensor(values: Sequence[float] | npt.NDArray[np.float32], dtype: int = F32,
           shape: Sequence[int] | None = None) -> TensorPayload:
    arr = np.asarray(values, dtype=np.float32)
    return TensorPayload(dtype, arr.shape if shape is None else shape,
                         encode_payload(dtype, arr))


def elided(shape: Sequence[int], dtype: int = F32) -> TensorPayload:
    return TensorPayload(dtype, shape, b"")


def frame(*tensors: TensorPayload, weight: float = 1.0, kind: RoundKind = MODEL) -> RoundFrame:
    return RoundFrame(kind, weight, tensors, check_nbytes=False)  # the folds' bad inputs too


def values(t: TensorPayload) -> list[float]:
    return [float(x) for x in decode_payload(t.dtype, t.data)]


def wire(f: RoundFrame, salt: bytes = SALT) -> bytes:
    return encode_round_frame_bytes(f, salt)


def read(data: bytes, salt: bytes = SALT) -> RoundFrame:
    res = decode_round_frame_or_eos(data, salt)
    assert isinstance(res, tuple)
    return res[0]


def f64_bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


# -- controller reduce (controller_tests.rs) ---------------------------------------------------
@pytest.mark.parametrize("version", [2, 3])
def test_reduce_realized_work_normalizes_by_accepted_mass_only(version: int) -> None:
    a = frame(tensor([3.0, 6.0]), weight=3.0)  # 3 x [1, 2], pre-scaled
    b = frame(tensor([5.0, 10.0]), weight=1.0)
    out = reduce_realized_work([a, None, b], version=version)
    assert values(out.tensors[0]) == [2.0, 4.0]
    assert out.weight == 4.0 and out.kind is MODEL


@pytest.mark.parametrize("version", [2, 3])
def test_reduce_realized_work_control_is_pure_sum(version: int) -> None:
    a = frame(tensor([3.0, 0.0]), weight=0.0, kind=CONTROL)
    b = frame(tensor([0.0, 5.0]), weight=0.0, kind=CONTROL)
    out = reduce_realized_work([a, b], version=version)
    assert values(out.tensors[0]) == [3.0, 5.0] and out.kind is CONTROL
    # weight is ignored for scaling on Control, even when positive
    c = frame(tensor([3.0, 0.0]), weight=2.0, kind=CONTROL)
    assert values(reduce_realized_work([c, b], version=version).tensors[0]) == [3.0, 5.0]


@pytest.mark.parametrize("version", [2, 3])
def test_reduce_realized_work_zero_mass_returns_untouched_sum(version: int) -> None:
    a = frame(tensor([0.0, 0.0]), weight=0.0)
    b = frame(tensor([1.0, -2.0]), weight=0.0)
    out = reduce_realized_work([a, b], version=version)
    assert out.weight == 0.0 and values(out.tensors[0]) == [1.0, -2.0]


def test_reduce_realized_work_rejects_all_dead() -> None:
    with pytest.raises(SequenceError, match="no accepted frames"):
        reduce_realized_work([None, None])
    with pytest.raises(SequenceError, match="sum_frames called with no frames"):
        sum_frames([])


def test_sum_frames_is_a_pure_sum_with_summed_mass() -> None:
    out = sum_frames([frame(tensor([3.0, 6.0]), weight=3.0), frame(tensor([5.0, 10.0]))])
    assert values(out.tensors[0]) == [8.0, 16.0]
    assert out.weight == 4.0 and out.kind is MODEL


def test_sum_frames_rejects_kind_mismatch() -> None:
    with pytest.raises(SchemaMismatch, match="kind"):
        sum_frames([frame(tensor([1.0])), frame(tensor([1.0]), kind=CONTROL)])


def test_rejects_shape_mismatch_and_unknown_dtype() -> None:
    with pytest.raises(SchemaMismatch, match="shape"):
        reduce_realized_work([frame(tensor([1.0, 2.0])), frame(tensor([1.0, 2.0, 3.0]))])
    t7 = TensorPayload(7, [2], bytes(8))
    with pytest.raises(InvalidValue, match="dtype tag 7"):
        reduce_realized_work([frame(t7), frame(t7)])


def test_sum_frames_bf16_accumulates_in_f32() -> None:
    frames = [frame(tensor([1.0], BF16)) for _ in range(512)]
    out = sum_frames(frames)
    assert out.tensors[0].dtype == BF16
    assert values(out.tensors[0]) == [512.0]  # a bf16 accumulator would stick at 256
    assert out.weight == 512.0


def test_sum_frames_rejects_dtype_mix() -> None:
    with pytest.raises(SchemaMismatch, match="dtype"):
        sum_frames([frame(tensor([1.0], BF16)), frame(tensor([1.0], F32))])


def test_reduce_realized_work_bf16_normalizes() -> None:
    out = reduce_realized_work([frame(tensor([6.0, 12.0], BF16), weight=3.0),
                                frame(tensor([4.0, 8.0], BF16), weight=1.0)])
    assert out.tensors[0].dtype == BF16
    assert values(out.tensors[0]) == [2.5, 5.0] and out.weight == 4.0


def test_divides_once_by_multiplying_with_the_f32_reciprocal() -> None:
    out = reduce_realized_work([frame(tensor([4.0]), weight=1.0), frame(tensor([6.0]), weight=2.0)])
    got = np.frombuffer(out.tensors[0].data, "<u4")[0]
    assert got == 0x40555556  # 10 * f32(1/3); 10 / 3 would be 0x40555555


def test_tiny_mass_gives_an_infinite_reciprocal() -> None:
    out = reduce_realized_work([frame(tensor([1.0, 0.0, -2.0]), weight=1e-300)])
    v = decode_payload(F32, out.tensors[0].data)
    assert v[0] == np.inf and math.isnan(v[1]) and v[2] == -np.inf


def test_weights_sum_from_negative_zero() -> None:
    out = reduce_realized_work([frame(tensor([1.0]), weight=-0.0),
                                frame(tensor([2.0]), weight=-0.0)])
    assert f64_bits(out.weight) == 0x8000000000000000  # -0.0: zero mass, no scaling
    assert values(out.tensors[0]) == [3.0]


def test_a_lone_negative_zero_becomes_positive_zero() -> None:
    out = sum_frames([frame(tensor([-0.0, 1.0]))])
    assert np.frombuffer(out.tensors[0].data, "<u4")[0] == 0


def test_sizes_are_checked_before_allocating() -> None:
    huge = [0xFFFFFFFF, 0xFFFFFFFF]  # 2**64 elements: any allocation would fail loudly
    a = frame(elided(huge))
    b = frame(TensorPayload(F32, huge, bytes(8)))
    with pytest.raises(SchemaMismatch, match="payload byte count 8 != accumulator numel"):
        reduce_realized_work([a, b], version=3)
    out = reduce_realized_work([a, a], version=3)  # all elided: nothing allocated, stays elided
    assert out.tensors[0].elided and out.tensors[0].shape == tuple(huge)


# -- zero-elision (v3) and its rejection (v2) --------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_an_elided_frame_folds_identically_to_a_zeros_model(dtype: int) -> None:
    full = frame(tensor([1.5, -2.0, 3.25], dtype), weight=2.0)
    zeros = frame(tensor([0.0, 0.0, 0.0], dtype), weight=0.0)
    idle = frame(elided([3], dtype), weight=0.0)
    for pair_z, pair_e in (([full, zeros], [full, idle]), ([zeros, full], [idle, full])):
        want = wire(reduce_realized_work(pair_z, version=3))
        assert wire(reduce_realized_work(pair_e, version=3)) == want
        assert wire(sum_frames(pair_e, version=3)) == wire(sum_frames(pair_z, version=3))


def test_an_all_elided_round_sums_to_an_elided_frame() -> None:
    idle = frame(elided([64, 128]), elided([512], BF16), weight=0.0)
    out = sum_frames([idle, idle], version=3)
    assert all(t.elided for t in out.tensors)
    assert [t.shape for t in out.tensors] == [(64, 128), (512,)]
    assert out.weight == 0.0
    assert len(wire(out)) == 57


def test_version_2_rejects_elided_payloads() -> None:
    full = frame(tensor([1.0, 2.0]))
    idle = frame(elided([2]), weight=0.0)
    with pytest.raises(SchemaMismatch, match="nbytes 0 != frame 0 nbytes 8"):
        reduce_realized_work([full, idle], version=2)
    with pytest.raises(SchemaMismatch, match=r"numel\*element_size 8 != nbytes 0"):
        reduce_realized_work([idle], version=2)
    with pytest.raises(SchemaMismatch, match=r"numel\*element_size 8 != nbytes 0"):
        reduce_realized_work([idle, idle], version=2)


def test_zero_numel_tensors_are_legal_in_both_versions() -> None:
    for version in (2, 3):
        out = sum_frames([frame(elided([0, 3])), frame(elided([0, 3]))], version=version)
        assert out.tensors[0].nbytes == 0


# -- relay host fold (relay/agent_tests.rs) ----------------------------------------------------
def test_fold_sums_local_ranks_into_one_host_frame() -> None:
    fold = HostFold([0, 1], SALT, version=3)
    assert fold.deposit(0, wire(frame(tensor([1.0, 2.0]), weight=3.0))) is None
    out = fold.deposit(1, wire(frame(tensor([10.0, 20.0]), weight=1.0)))
    assert out is not None
    f = read(out)
    assert values(f.tensors[0]) == [11.0, 22.0] and f.weight == 4.0
    assert fold.rounds_completed == 1 and fold.deposited == frozenset()


def test_fold_rank_exit_folds_the_remainder_and_dead_stays_dead() -> None:
    fold = HostFold([0, 1, 2], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]), weight=0.5)))
    fold.deposit(2, wire(frame(tensor([3.0]), weight=1.0)))
    out = fold.declare_dead(1)
    assert out is not None and values(read(out).tensors[0]) == [4.0]
    assert read(out).weight == 1.5
    # next round: the dead rank is no longer waited for, and its late frames are dropped
    assert fold.deposit(1, wire(frame(tensor([100.0])))) is None
    fold.deposit(0, wire(frame(tensor([1.0]))))
    out2 = fold.deposit(2, wire(frame(tensor([2.0]))))
    assert out2 is not None and values(read(out2).tensors[0]) == [3.0]
    assert fold.alive_ranks == (0, 2) and fold.dead_ranks == frozenset({1})


def test_fold_declare_dead_unblocks_the_barrier_only_with_a_deposit() -> None:
    fold = HostFold([0, 1], SALT)
    assert fold.declare_dead(1) is None  # nothing deposited: nothing to ship
    out = fold.deposit(0, wire(frame(tensor([9.0]), weight=2.0)))
    assert out is not None and values(read(out).tensors[0]) == [9.0]


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_incremental_fold_matches_sum_frames(dtype: int) -> None:
    rng = np.random.default_rng(dtype)
    frames = [frame(tensor(rng.standard_normal(37, dtype=np.float32), dtype),
                    tensor(rng.standard_normal((3, 4), dtype=np.float32), dtype),
                    weight=float(i + 1)) for i in range(4)]
    fold = HostFold(range(4), SALT_B)
    outs = [fold.deposit(r, wire(f, SALT_B)) for r, f in enumerate(frames)]
    assert outs[:3] == [None, None, None]
    assert outs[3] == wire(sum_frames(frames), SALT_B)
    single = HostFold([5], SALT_B)
    assert single.deposit(5, wire(frames[0], SALT_B)) == wire(sum_frames(frames[:1]), SALT_B)


def test_a_single_deposit_ships_verbatim_and_ignores_trailing_bytes() -> None:
    f = frame(tensor([-0.0, 1.0]))
    fold = HostFold([3], SALT)
    out = fold.deposit(3, wire(f) + b"trailing")
    assert out == wire(f)  # -0.0 survives: the seed is not re-summed


def test_an_all_elided_round_ships_elided_through_the_fold() -> None:
    idle = frame(elided([5]), elided([], BF16), weight=0.0)
    fold = HostFold([0, 1, 2], SALT, version=3)
    fold.deposit(0, wire(idle))
    fold.deposit(1, wire(idle))
    out = fold.deposit(2, wire(idle))
    assert out == wire(idle)


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (1, 2, 0), (2, 1, 0)])
def test_elided_deposits_merge_with_full_ones_in_any_order(order: tuple[int, ...]) -> None:
    frames = {0: frame(tensor([1.0, 2.0]), weight=1.0),
              1: frame(elided([2]), weight=0.0),
              2: frame(tensor([3.0, -4.0]), weight=1.0)}
    fold = HostFold([0, 1, 2], SALT, version=3)
    outs = [fold.deposit(r, wire(frames[r])) for r in order]
    assert outs[-1] is not None
    f = read(outs[-1])
    assert values(f.tensors[0]) == [4.0, -2.0] and f.weight == 2.0


def test_incremental_fold_rejects_dtype_mix_loudly() -> None:
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]))))
    with pytest.raises(SchemaMismatch, match=r"dtype.*bf16_wire"):
        fold.deposit(1, wire(frame(tensor([1.0], BF16))))
    # fatal: the same error again, whatever comes next
    with pytest.raises(SchemaMismatch, match="bf16_wire"):
        fold.declare_dead(1)
    assert isinstance(fold.error, SchemaMismatch)


def test_incremental_fold_rejects_double_deposit() -> None:
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]))))
    with pytest.raises(SequenceError, match="deposited twice"):
        fold.deposit(0, wire(frame(tensor([1.0]))))


def test_fold_errors_follow_the_streamed_read_order() -> None:
    # a later deposit whose tensor 0 has the wrong dtype AND whose MAC is wrong: upstream checks
    # each tensor as it is read, before the footer, so the schema error wins
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]))))
    with pytest.raises(SchemaMismatch, match="dtype 1 != the round's dtype 0"):
        fold.deposit(1, wire(frame(tensor([1.0], BF16)), SALT_B))
    # with a matching schema, the MAC error is reported
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]))))
    with pytest.raises(AuthenticationError, match="HMAC verification failed"):
        fold.deposit(1, wire(frame(tensor([1.0])), SALT_B))
    # a frame truncated inside tensor 1: tensor 0 is checked first
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]), tensor([2.0]))))
    blob = wire(frame(tensor([1.0, 2.0]), tensor([2.0])))
    with pytest.raises(SchemaMismatch, match=r"shape \[2\] != the round's shape \[1\]"):
        fold.deposit(1, blob[:-12])
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]), tensor([2.0]))))
    with pytest.raises(TruncatedInput):
        fold.deposit(1, wire(frame(tensor([1.0]), tensor([2.0])))[:-12])


def test_fold_kind_and_count_checks() -> None:
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]))))
    with pytest.raises(SchemaMismatch, match="frame kind Control != the round's kind Model"):
        fold.deposit(1, wire(frame(tensor([1.0]), kind=CONTROL)))
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.0]), tensor([1.0]))))
    with pytest.raises(SchemaMismatch,
                       match="carries 1 tensors; the round's first deposit carried 2"):
        fold.deposit(1, wire(frame(tensor([1.0]))))


def test_fold_empty_blob_and_unknown_rank() -> None:
    fold = HostFold([0, 1], SALT)
    with pytest.raises(InvalidValue, match="not one of this host's ranks"):
        fold.deposit(7, wire(frame(tensor([1.0]))))
    assert fold.error is None  # API misuse is not fatal
    with pytest.raises(TruncatedInput, match="truncated RoundFrame from rank 0"):
        fold.deposit(0, b"")


def test_fold_version_2_rejects_elided_on_merge() -> None:
    fold = HostFold([0, 1], SALT, version=2)
    fold.deposit(0, wire(frame(tensor([1.0, 2.0]))))
    with pytest.raises(SchemaMismatch, match="payload byte count 0 != accumulator numel 2"):
        fold.deposit(1, wire(frame(elided([2]), weight=0.0)))
    fold = HostFold([0, 1], SALT, version=2)
    fold.deposit(0, wire(frame(elided([2]), weight=0.0)))
    with pytest.raises(SchemaMismatch, match="seed promotion: payload byte count 0"):
        fold.deposit(1, wire(frame(tensor([1.0, 2.0]))))
    # a lone elided deposit ships as received (the controller rejects it)
    lone = HostFold([0], SALT, version=2)
    assert lone.deposit(0, wire(frame(elided([2]), weight=0.0))) == wire(frame(elided([2]),
                                                                                weight=0.0))


def test_fold_refuses_to_materialise_beyond_the_ceiling() -> None:
    huge = [1 << 20, 1 << 12]  # 16 GiB of f32 zeros if materialised
    fold = HostFold([0, 1], SALT, version=3)
    fold.deposit(0, wire(frame(tensor([1.0]), elided(huge), weight=0.0)))
    with pytest.raises(LimitExceeded, match="above the frame ceiling"):
        fold.deposit(1, wire(frame(tensor([2.0]), elided(huge))))


def test_fold_bf16_seed_promotion_and_unknown_dtype() -> None:
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(tensor([1.5, -2.0], BF16))))
    out = fold.deposit(1, wire(frame(tensor([0.25, 4.0], BF16))))
    assert out is not None and values(read(out).tensors[0]) == [1.75, 2.0]
    t9 = TensorPayload(9, [1], bytes(4))
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(frame(t9)))
    with pytest.raises(InvalidValue, match="seed promotion: unsupported wire dtype tag 9"):
        fold.deposit(1, wire(frame(t9)))


# -- realized-work mass policies (realized_work.rs) --------------------------------------------
def test_gamma_mass_policies() -> None:
    assert gamma_mass(4.0, 1.0) == 4.0 and gamma_mass(2.0, 1.0) == 2.0
    assert gamma_mass(4.0, 0.0) == 1.0 and gamma_mass(2.0, 0.0) == 1.0
    assert abs(gamma_mass(4.0, -1.0) - 0.25) < 1e-12
    assert abs(gamma_mass(2.0, -1.0) - 0.5) < 1e-12
    for gamma in (1.0, 0.5, 0.0, -0.5, -1.0):
        assert gamma_mass(0.0, gamma) == 0.0  # the idle guard
    cohort = sum(gamma_mass(n, 0.5) for n in (2.0, 4.0, 0.0))
    assert abs(cohort - (math.sqrt(2.0) + 2.0)) < 1e-12


def test_mover_mass_is_zero_one_and_zero_mass_is_not_realized() -> None:
    assert (mover_mass(3.0), mover_mass(1.0), mover_mass(0.0)) == (1.0, 1.0, 0.0)
    assert not is_realized(0.0) and not is_realized(-1.0) and not is_realized(-0.0)
    assert is_realized(2.2250738585072014e-308) and is_realized(6.0)


# -- outer optimizers (outer_optimizer.rs) -----------------------------------------------------
def arr(*v: float) -> npt.NDArray[np.float32]:
    return np.array(v, dtype=np.float32)


def test_outer_avg_is_identity_and_ignores_prev_global() -> None:
    opt = OuterAvg()
    out = opt.outer_step([arr(1, 2, 3), arr(4, 5)], [arr(10, 20, 30), arr(40, 50)])
    assert [o.tolist() for o in out] == [[10, 20, 30], [40, 50]]
    assert opt.outer_step([arr(0, 0)], [arr(7, 8)])[0].tolist() == [7, 8]
    assert opt.checkpoint_state() is None and not opt.resets_inner


def test_slow_momentum_heavy_ball_math() -> None:
    opt = SlowMomentum(0.5, 0.9)
    assert opt.outer_step([arr(1, 2)], [arr(1, 2)])[0].tolist() == [1.0, 2.0]
    w2 = opt.outer_step([arr(1, 2)], [arr(0.5, 1.0)])[0]
    assert np.allclose(w2, [0.75, 1.5], atol=1e-6)
    w3 = opt.outer_step([arr(0.75, 1.5)], [arr(0.7, 1.4)])[0]
    assert np.allclose(w3, [0.5, 1.0], atol=1e-6)
    assert not opt.resets_inner


def test_nesterov_look_ahead_math() -> None:
    opt = NesterovMomentum(0.5, 0.9)
    assert opt.outer_step([arr(1, 2)], [arr(1, 2)])[0].tolist() == [1.0, 2.0]
    w2 = opt.outer_step([arr(1, 2)], [arr(0.5, 1.0)])[0]
    assert np.allclose(w2, [0.525, 1.05], atol=1e-6)
    w3 = opt.outer_step([arr(0.525, 1.05)], [arr(0.5, 1.0)])[0]
    assert np.allclose(w3, [0.29875, 0.5975], atol=1e-5)
    assert opt.resets_inner


@pytest.mark.parametrize("cls", [SlowMomentum, NesterovMomentum])
def test_momentum_checkpoint_round_trip_is_faithful(
    cls: type[SlowMomentum] | type[NesterovMomentum],
) -> None:
    warm = cls(0.5, 0.9)
    assert warm.checkpoint_state() is None
    warm.outer_step([arr(1, 2)], [arr(1, 2)])
    warm.outer_step([arr(1, 2)], [arr(0.5, 1.0)])
    saved = warm.checkpoint_state()
    assert saved is not None
    resumed = cls(0.5, 0.9)
    resumed.load_checkpoint_state(saved)
    prev, cons = [arr(0.75, 1.5)], [arr(0.7, 1.4)]
    a = warm.outer_step(prev, cons)[0]
    b = resumed.outer_step(prev, cons)[0]
    assert np.array_equal(a, b)
    c = cls(0.5, 0.9).outer_step(prev, cons)[0]
    assert not np.allclose(a, c)


def test_stepper_with_outer_avg_is_byte_identical() -> None:
    params = frame(tensor([1.25, -2.5, 3.75]), tensor([4.0, 5.0]), weight=1.0)
    buffers = frame(tensor([9.0, 8.0]), weight=1.0)
    control = frame(tensor([1.25, -2.5, 3.75]), kind=CONTROL, weight=0.0)
    st_ = OuterStepper(OuterAvg())
    for _ in range(2):
        assert st_.process_frame(control) is control
        assert wire(st_.process_frame(params)) == wire(params)
        assert st_.process_frame(buffers) is buffers
    bf = frame(tensor([1.25, -2.5, 3.75], BF16), weight=1.0)
    out = OuterStepper().process_frame(bf)
    assert wire(out) == wire(bf) and out.tensors[0].dtype == BF16


def test_stepper_slow_momentum_steps_params_only() -> None:
    control = frame(tensor([0.0]), kind=CONTROL, weight=0.0)
    buffers = frame(tensor([9.0, 8.0]), weight=1.0)
    stp = OuterStepper(SlowMomentum(0.5, 0.9))
    stp.process_frame(control)
    p1 = frame(tensor([2.0, 4.0]), weight=1.0)
    assert wire(stp.process_frame(p1)) == wire(p1)
    assert stp.process_frame(buffers) is buffers
    stp.process_frame(control)
    zero_mass = frame(tensor([7.0, 7.0]), weight=0.0)
    assert stp.process_frame(zero_mass) is zero_mass  # not stepped, does not open the window
    out = stp.process_frame(frame(tensor([1.0, 2.0]), weight=3.0))
    assert np.allclose(values(out.tensors[0]), [1.5, 3.0]) and out.weight == 3.0
    assert stp.process_frame(buffers) is buffers
    state = stp.checkpoint_state()
    assert state is not None and np.allclose(state[0], [1.0, 2.0])


def test_stepper_refuses_a_changed_parameter_schema() -> None:
    stp = OuterStepper(SlowMomentum(0.5, 0.9))
    stp.process_frame(frame(tensor([1.0, 2.0])))
    stp.process_frame(frame(tensor([0.0]), kind=CONTROL))
    with pytest.raises(SchemaMismatch):
        stp.process_frame(frame(tensor([1.0, 2.0, 3.0])))


# -- Hypothesis properties ---------------------------------------------------------------------
BOUND_U = {F32: 2.0 ** -24, BF16: 2.0 ** -8}


@st.composite
def cohorts(draw: st.DrawFn, version: int) -> tuple[list[RoundFrame], int, list[tuple[int, ...]]]:
    dtype = draw(st.sampled_from([F32, BF16]))
    shapes = draw(st.lists(st.lists(st.integers(0, 5), max_size=3).map(tuple),
                           min_size=1, max_size=3))
    n = draw(st.integers(1, 16))
    frames = []
    for _ in range(n):
        idle = draw(st.booleans()) and draw(st.booleans())
        weight = 0.0 if idle else draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 0.1, 7.25]))
        tensors = []
        for shape in shapes:
            numel = math.prod(shape)
            if idle and version >= 3:
                tensors.append(elided(shape, dtype))
                continue
            vals = draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=numel,
                                 max_size=numel))
            tensors.append(tensor(np.array(vals, np.float32) * np.float32(weight), dtype,
                                  shape))
        frames.append(frame(*tensors, weight=weight))
    return frames, dtype, shapes


def _reference(frames: list[RoundFrame], ti: int) -> tuple[npt.NDArray[np.float64],
                                                           npt.NDArray[np.float64]]:
    total = None
    mag = None
    for f in frames:
        t = f.tensors[ti]
        v = (np.zeros(t.numel) if t.elided else
             decode_payload(t.dtype, t.data).astype(np.float64))
        total = v if total is None else total + v
        mag = np.abs(v) if mag is None else mag + np.abs(v)
    assert total is not None and mag is not None
    return total, mag


@pytest.mark.parametrize("version", [2, 3])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reduce_matches_a_float64_reference(version: int, data: st.DataObject) -> None:
    frames, dtype, shapes = data.draw(cohorts(version))
    out = reduce_realized_work(frames, version=version)
    w = 0.0
    for f in frames:
        w += f.weight
    assert out.weight == w
    n = len(frames)
    u = BOUND_U[dtype]
    for ti, shape in enumerate(shapes):
        t = out.tensors[ti]
        assert t.shape == shape and t.dtype == dtype
        total, mag = _reference(frames, ti)
        if version >= 3 and all(f.tensors[ti].elided for f in frames):
            assert t.elided
            continue
        got = decode_payload(dtype, t.data).astype(np.float64)
        scale = 1.0 / w if w > 0 else 1.0
        exact = total * scale
        # f32 accumulation error, then (bf16) two roundings, then the f32 reciprocal
        tol = (n * 2.0 ** -24 * mag + 2 * u * np.abs(total) + 2 * u * mag) * scale * 1.01 + 1e-30
        assert np.all(np.abs(got - exact) <= tol), (got, exact, tol)


@st.composite
def integer_cohorts(draw: st.DrawFn, version: int) -> tuple[list[RoundFrame], list[int]]:
    dtype = draw(st.sampled_from([F32, BF16]))
    shapes = draw(st.lists(st.lists(st.integers(1, 4), max_size=2).map(tuple),
                           min_size=1, max_size=2))
    n = draw(st.integers(1, 16))
    frames = []
    for _ in range(n):
        idle = draw(st.integers(0, 3)) == 0
        weight = 0.0 if idle else float(draw(st.integers(1, 4)))
        tensors = []
        for shape in shapes:
            if idle and version >= 3:
                tensors.append(elided(shape, dtype))
                continue
            vals = draw(st.lists(st.integers(-16, 16), min_size=math.prod(shape),
                                 max_size=math.prod(shape)))
            base = np.array(vals, np.float32) * np.float32(weight)
            tensors.append(tensor(base, dtype, shape))
        frames.append(frame(*tensors, weight=weight))
    hosts = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return frames, hosts


@pytest.mark.parametrize("version", [2, 3])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_host_grouping_gives_the_identical_consensus(version: int,
                                                         data: st.DataObject) -> None:
    frames, hosts = data.draw(integer_cohorts(version))
    flat = wire(reduce_realized_work(frames, version=version), SALT_B)
    host_frames: list[RoundFrame | None] = []
    for h in sorted(set(hosts)):
        ranks = [r for r, hh in enumerate(hosts) if hh == h]
        order = data.draw(st.permutations(ranks))
        fold = HostFold(ranks, SALT_B, version=version)
        shipped = [fold.deposit(r, wire(frames[r], SALT_B)) for r in order]
        assert shipped[:-1] == [None] * (len(shipped) - 1) and shipped[-1] is not None
        host_frames.append(read(shipped[-1], SALT_B))
    via_hosts = wire(reduce_realized_work(host_frames, version=version), SALT_B)
    assert via_hosts == flat


def test_host_fold_then_reduce_matches_flat_reduce() -> None:
    frames = [frame(tensor([1.0, 2.0, 3.0]), weight=1.0),
              frame(tensor([3.0, 6.0, 9.0]), weight=3.0),
              frame(tensor([2.0, 2.0, 2.0]), weight=2.0)]
    fold_a = HostFold([0, 1], SALT)
    fold_a.deposit(0, wire(frames[0]))
    host_a = fold_a.deposit(1, wire(frames[1]))
    host_b = HostFold([2], SALT).deposit(2, wire(frames[2]))
    assert host_a is not None and host_b is not None
    via = reduce_realized_work([read(host_a), read(host_b)])
    assert wire(via) == wire(reduce_realized_work(frames))
    expected = np.array([6.0, 10.0, 14.0], np.float32) * np.float32(1.0 / 6.0)
    assert values(via.tensors[0]) == expected.tolist()
    assert via.weight == 6.0


def test_errors_are_protocol_errors_with_kinds() -> None:
    try:
        sum_frames([frame(tensor([1.0])), frame(tensor([1.0, 2.0]))])
    except ProtocolError as e:
        assert e.kind == "schema" and e.error_id == "reduce.shape_mismatch"
    else:  # pragma: no cover
        raise AssertionError("no error")


# -- kernels against a direct transcription of upstream's arithmetic ---------------------------
def _upstream_bf16(bits: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint16]:
    b = bits.astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    rne = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return np.where(nan, (b >> 16) | 0x0040, rne).astype(np.uint16)


def _widen(b16: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    return (b16.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("weight", [3.0, 1e-300, 7e44, 0.0])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_kernel_matches_upstream_arithmetic_bit_for_bit(weight: float, threads: int) -> None:
    rng = np.random.default_rng(int(weight != 0) + threads)
    numel = (2 << 20) + 12345 if threads > 1 else 3 * (1 << 16) + 17
    raw = [rng.integers(0, 1 << 16, numel, dtype=np.uint32).astype(np.uint16) for _ in range(3)]
    raw[1][::97] = 0x7F80  # +inf here and there, to meet -inf and make default NaNs
    raw[2][::89] = 0xFF80
    frames = [frame(TensorPayload(BF16, [numel], r.tobytes()), weight=weight / 3) for r in raw]
    out = reduce_realized_work(frames, version=3, threads=threads)
    with np.errstate(all="ignore"):
        acc = np.zeros(numel, np.float32)
        for r in raw:
            acc = acc + _widen(r)
        summed = _upstream_bf16(acc.view(np.uint32))
        w = -0.0
        for f in frames:
            w += f.weight
        if w > 0:
            scaled = _widen(summed) * np.float32(1.0 / w)
            summed = _upstream_bf16(scaled.view(np.uint32))
    got = np.frombuffer(out.tensors[0].data, "<u2")
    assert np.array_equal(got, summed)


@pytest.mark.parametrize("threads", [1, 2])
def test_f32_kernel_matches_sequential_numpy(threads: int) -> None:
    rng = np.random.default_rng(5)
    numel = (2 << 20) + 3 if threads > 1 else (1 << 16) + 3
    raw = [rng.integers(0, 1 << 32, numel, dtype=np.uint64).astype(np.uint32) for _ in range(3)]
    frames = [frame(TensorPayload(F32, [numel], r.tobytes()), weight=1.0) for r in raw]
    out = reduce_realized_work(frames, version=2, threads=threads)
    with np.errstate(all="ignore"):
        acc = np.float32(0.0) + raw[0].view(np.float32)
        for r in raw[1:]:
            acc = acc + r.view(np.float32)
        acc = acc * np.float32(1.0 / 3.0)
    got = np.frombuffer(out.tensors[0].data, "<f4")
    assert np.array_equal(got.view(np.uint32), acc.view(np.uint32))


def test_weights_summing_past_f64_are_a_remote_error() -> None:
    big = frame(tensor([1.0, 2.0]), weight=1.6e308)
    with pytest.raises(InvalidValue, match="not a finite realized-work mass") as err:
        reduce_realized_work([big, big])
    assert err.value.remote and err.value.error_id == "reduce.weight_overflow"
    fold = HostFold([0, 1], SALT)
    fold.deposit(0, wire(big))
    with pytest.raises(InvalidValue, match="takes the round's summed weight to inf") as err2:
        fold.deposit(1, wire(big))
    assert err2.value.remote and fold.error is err2.value


# -- the small-tensor path (every tensor under K.SMALL_ELEMS elements) ----------------------------
def test_sum_small_f32_exact_values() -> None:
    from flodl_proto.reduce import _kernels as K

    a = np.array([-0.0, 1.0, 3e38, 0.5], np.float32)
    b = np.array([-0.0, 2.0, 3e38, -0.5], np.float32)
    ws = K.Workspace(4)
    with np.errstate(all="ignore"):
        plain = K.sum_small([a], F32, 4, None, ws)
        two = K.sum_small([a, b], F32, 4, None, ws)
        scaled = K.sum_small([a, b], F32, 4, np.float32(1 / 3), ws)
    # 0.0 + -0.0 is +0.0: a lone -0.0 becomes +0.0, as in the general path
    assert plain.view(np.uint32).tolist() == [0, 0x3F800000, 0x7F61B1E6, 0x3F000000]
    assert two.tolist() == [0.0, 3.0, float("inf"), 0.0]
    assert two.view(np.uint32)[0] == 0 and two.view(np.uint32)[3] == 0
    assert scaled.view(np.uint32).tolist() == [0, 0x3F800000, 0x7F800000, 0]
    assert plain is not a and plain.dtype == np.float32 and a[0] == 0.0  # inputs untouched
    assert a.view(np.uint32)[0] == 0x80000000


def test_sum_small_bf16_exact_values() -> None:
    from flodl_proto.reduce import _kernels as K

    a = np.array([0x3F80, 0x3F81, 0x8000, 0x7FA1], np.uint16)  # 1, 1.0078125, -0, NaN
    b = np.array([0x3BC0, 0x3B80, 0x8000, 0x3F80], np.uint16)
    ws = K.Workspace(4)
    with np.errstate(all="ignore"):
        pure = K.sum_small([a, b], BF16, 4, None, ws)
        scaled = K.sum_small([a, b], BF16, 4, np.float32(1 / 3), ws)
    # 1 + 3 * 2**-9 rounds up; the tie goes to even; 0 + -0 + -0 = +0; the NaN keeps its bits
    assert pure.tolist() == [0x3F81, 0x3F82, 0x0000, 0x7FE1]
    # the sum is rounded to bf16 first, then scaled and rounded again (two roundings)
    assert scaled.tolist() == [0x3EAC, 0x3EAD, 0x0000, 0x7FE1]
    assert pure.dtype == np.uint16 and pure.shape == (4,)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("normalise", [False, True])
def test_small_fold_matches_the_general_path(dtype: int, normalise: bool) -> None:
    """A round whose tensors are all under SMALL_ELEMS goes through the small path; the same
    tensors padded past the threshold go through the general one: same leading bytes."""
    from flodl_proto.reduce import _kernels as K

    rng = np.random.default_rng(7 + dtype)
    n = 257
    vals = [rng.standard_normal(n).astype(np.float32) * 100 for _ in range(3)]
    vals[1][:4] = [np.inf, -np.inf, np.nan, -0.0]
    big_n = K.SMALL_ELEMS + 5

    def frames(size: int) -> list[RoundFrame]:
        out = []
        for k, v in enumerate(vals):
            full = np.zeros(size, np.float32)
            full[:n] = v
            out.append(frame(tensor(full[:n] if size == n else full, dtype),
                             tensor(full[:3] * 2, dtype), weight=float(k + 1)))
        return out

    fn = reduce_realized_work if normalise else sum_frames
    small, large = fn(frames(n)), fn(frames(big_n))
    es = 4 if dtype == F32 else 2
    assert bytes(small.tensors[0].data) == bytes(large.tensors[0].data)[: n * es]
    assert bytes(small.tensors[1].data) == bytes(large.tensors[1].data)
    assert small.weight == large.weight == 6.0
    assert small.tensors[0].shape == (n,) and small.tensors[1].shape == (3,)


def test_small_fold_exact_values_and_elided_tensors() -> None:
    f1 = frame(tensor([1.0, 2.0]), elided([3]), tensor([-0.0]), weight=1.0)
    f2 = frame(tensor([3.0, -0.0]), elided([3]), tensor([-0.0]), weight=3.0)
    out = reduce_realized_work([f1, f2], version=3)
    assert values(out.tensors[0]) == [1.0, 0.5]
    assert out.tensors[1].elided and out.tensors[1].shape == (3,)
    assert out.tensors[2].data.tobytes() == b"\x00\x00\x00\x00"  # +0.0
    assert out.weight == 4.0 and out.kind is MODEL
    c = sum_frames([frame(tensor([1.5]), kind=CONTROL, weight=0.0),
                    frame(tensor([2.0]), kind=CONTROL, weight=0.0)])
    assert values(c.tensors[0]) == [3.5] and c.kind is CONTROL
    assert f64_bits(c.weight) == 0  # -0.0 + 0.0 + 0.0 = +0.0
    empty = sum_frames([frame(weight=2.0), frame(weight=0.5)])
    assert empty.tensors == () and empty.weight == 2.5


@pytest.mark.parametrize("with_acc", [False, True])
def test_fold_small_exact_values(with_acc: bool) -> None:
    from flodl_proto.reduce import _kernels as K

    ws = K.Workspace(4)
    seed = np.array([1.0, -0.0, 2.0, 0.5], np.float32)
    x = np.array([2.0, -0.0, -2.0, 0.25], np.float32)
    acc = (seed + np.float32(0.0)) if with_acc else None
    views = [x] if with_acc else [seed, x]
    out = np.full(4, 7.0, np.float32)
    K.fold_small(out, acc, views, F32, ws)
    assert out.view(np.uint32).tolist() == [0x40400000, 0, 0, 0x3F400000]  # 3, +0, +0, 0.75
    if acc is not None:
        assert acc.tolist() == [3.0, 0.0, 0.0, 0.75]  # the running sums are updated
        same = acc.copy()
        K.fold_small(same, same, [x], F32, ws)  # f32: the output may be the sums themselves
        assert same.tolist() == [5.0, 0.0, -2.0, 1.0]
    a16 = np.array([0x3F80, 0x3F81, 0x8000, 0x7FA1], np.uint16)
    b16 = np.array([0x3BC0, 0x3B80, 0x8000, 0x3F80], np.uint16)
    out16 = np.zeros(4, np.uint16)
    acc16 = None
    if with_acc:
        acc16 = np.zeros(4, np.float32)
        K.promote_into(acc16, a16, BF16, ws)
    with np.errstate(all="ignore"):
        K.fold_small(out16, acc16, [b16] if with_acc else [a16, b16], BF16, ws)
    assert out16.tolist() == [0x3F81, 0x3F82, 0x0000, 0x7FE1]
    zeros = np.full(3, 9, np.uint16)
    K.fold_small(zeros, None, [], BF16, ws)
    assert zeros.tolist() == [0, 0, 0]


def test_host_fold_small_and_large_tensors_agree() -> None:
    """The relay's fold takes K.fold_small below SMALL_ELEMS and the chunked kernels from there
    on: the same leading bytes either way, f32 and bf16, two and three ranks."""
    from flodl_proto.reduce import _kernels as K

    rng = np.random.default_rng(3)
    for dtype in (F32, BF16):
        for ranks in (2, 3):
            out = []
            small = [rng.standard_normal(100).astype(np.float32) for _ in range(ranks)]
            padded = [np.concatenate([b, np.zeros(K.SMALL_ELEMS + 1 - 100, np.float32)])
                      for b in small]
            for base in (small, padded):
                fold = HostFold(range(ranks), SALT)
                res = None
                for r in range(ranks):
                    res = fold.deposit_frame(r, wire(frame(tensor(base[r], dtype))))
                assert isinstance(res, RoundFrame)
                out.append(bytes(res.tensors[0].data)[: 100 * (4 if dtype == F32 else 2)])
            assert out[0] == out[1]
    dead = HostFold([0, 1, 2], SALT)
    dead.deposit_frame(0, wire(frame(tensor([1.0, 2.0]))))
    dead.deposit_frame(1, wire(frame(tensor([0.5, -3.0]), weight=2.0)))
    shipped = dead.declare_dead_frame(2)  # completes the round: the sums encoded as they stand
    assert isinstance(shipped, RoundFrame)
    assert values(shipped.tensors[0]) == [1.5, -1.0] and shipped.weight == 3.0

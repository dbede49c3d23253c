"""The small-round batches: several small tensors of one dtype summed in one pass
(``K.sum_small_batch``) give, tensor by tensor, the bytes of the per-tensor kernels, in the
controller's reduce and in the relay's fold; a batch stops at a dtype change, at a tensor some
frame elides and at ``K.CHUNK_ELEMS`` elements; the relay's batched completion raises the
per-tensor path's errors in its order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import HostFold, reduce_realized_work, sum_frames
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce._batch import batch_runs

SALT = bytes(range(16))
F32, BF16 = 0, 1

#: f32 bit patterns the arithmetic treats specially: NaNs with payloads (quiet and signalling),
#: infinities, signed zeros, subnormals, the largest finite, rounding ties of bf16
_SPECIAL = np.array([0x7FC12345, 0xFF812345, 0x7F800001, 0x7F800000, 0xFF800000, 0x00000000,
                     0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x3F808000, 0x3F818000,
                     0x3F80FFFF, 0xBF808001], np.uint32)


def _elements(rng: np.random.Generator, n: int, dtype: int, nan_lanes: bool) -> np.ndarray:
    """``n`` elements (``<f4`` or ``<u2`` bf16 bits): random values, special patterns at the
    front (their NaNs only when ``nan_lanes``)."""
    vals = (rng.standard_normal(n) * 3).astype(np.float32).view(np.uint32)
    special = _SPECIAL if nan_lanes else _SPECIAL[~np.isnan(_SPECIAL.view(np.float32))]
    k = min(n, special.shape[0])
    vals[:k] = special[:k]
    if dtype == F32:
        return vals.view(np.float32)
    return (vals >> 16).astype(np.uint16)


def _contribs(lengths: list[int], dtype: int, frames: int, seed: int) -> list[list[np.ndarray]]:
    """``frames`` contributions of tensors of ``lengths``; NaNs only in the first one, so no
    two NaNs meet (which payload survives then is left to the platform)."""
    rng = np.random.default_rng(seed)
    return [[_elements(rng, n, dtype, k == 0) for n in lengths] for k in range(frames)]


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("frames", [1, 2, 3])
@pytest.mark.parametrize("scale", [None, 1.0 / 3.0, 0.0, float("inf"), 1e-30])
def test_a_batch_gives_the_per_tensor_bytes(dtype: int, frames: int, scale: float | None) -> None:
    lengths = [0, 1, 14, 37, 0, 300, 5]
    contribs = _contribs(lengths, dtype, frames, seed=frames)
    s = None if scale is None else np.float32(scale)
    total = sum(lengths)
    with np.errstate(all="ignore"):
        got = K.sum_small_batch(contribs, dtype, total, s, K.Workspace(total))
        want = [K.sum_small([c[i] for c in contribs], dtype, n, s, K.Workspace(max(n, 1)))
                for i, n in enumerate(lengths)]
    assert got.dtype == (K.F32 if dtype == F32 else K.U16) and got.shape == (total,)
    assert got.tobytes() == b"".join(w.tobytes() for w in want)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_a_batch_of_empty_tensors_is_empty(dtype: int) -> None:
    empty = np.empty(0, K.F32 if dtype == F32 else K.U16)
    got = K.sum_small_batch([[empty, empty], [empty, empty]], dtype, 0, np.float32(0.5),
                            K.Workspace(0))
    assert got.shape == (0,) and got.dtype == empty.dtype


def test_batch_runs_group_one_key_up_to_a_chunk() -> None:
    c = K.CHUNK_ELEMS
    # a key change, a None (alone, even between equal keys), the chunk filled exactly, a first
    # tensor over the chunk taken alone, runs restarting after each break
    keys = [F32, F32, BF16, BF16, None, BF16, F32, F32, F32, F32, F32]
    numels = [3, 4, 5, 0, 6, 7, c - 8, 8, 1, c + 1, 2]
    assert list(batch_runs(keys, numels)) == [
        (0, 2, 7), (2, 4, 5), (4, 5, 6), (5, 6, 7), (6, 8, c), (8, 9, 1), (9, 10, c + 1),
        (10, 11, 2)]
    assert list(batch_runs([None, None], [1, 2])) == [(0, 1, 1), (1, 2, 2)]
    assert list(batch_runs([], [])) == []


def test_a_nan_made_by_the_scale_is_encoded_as_upstream_does() -> None:
    """A zero sum times an infinite scale is the default NaN, encoded 0xFFC0 (the scan for
    NaN lanes runs although the sum held none)."""
    zeros = np.zeros(3, np.uint16)
    with np.errstate(all="ignore"):
        got = K.sum_small_batch([[zeros], [zeros]], BF16, 3, np.float32("inf"), K.Workspace(3))
    assert got.tolist() == [0xFFC0] * 3


def _payload(arr: np.ndarray, dtype: int, shape: tuple[int, ...]) -> TensorPayload:
    return TensorPayload(dtype, shape, arr.view(np.uint8).data)


def _frame(tensors: list[TensorPayload], weight: float = 1.0) -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, weight, tensors, check_nbytes=False)  # bad inputs too


def _reference(frames: list[RoundFrame], scale: np.float32 | None) -> list[bytes]:
    """Each tensor summed on its own by the general (chunked) kernel; b"" when every frame
    elides it."""
    out = []
    for ti, t0 in enumerate(frames[0].tensors):
        views = [np.frombuffer(f.tensors[ti].data, K.F32 if t0.dtype == F32 else K.U16)
                 for f in frames if f.tensors[ti].nbytes]
        if not views:
            out.append(b"")
            continue
        out.append(K.sum_contributions(views, t0.dtype, t0.numel, scale, K.Workspace()).tobytes())
    return out


def _owners(frame: RoundFrame) -> list[Any]:
    """The array each payload's bytes belong to (one per batch)."""
    roots = []
    for t in frame.tensors:
        x: Any = t.data.obj
        while isinstance(x, np.ndarray) and isinstance(x.base, np.ndarray):
            x = x.base
        roots.append(x)
    return roots


def test_the_controller_batches_runs_of_one_dtype_up_to_a_chunk() -> None:
    """Tensors: f32 x 3 (a batch), bf16 x 2 (a batch), f32 of 16,383 elements x 5 (the fifth
    would pass CHUNK_ELEMS: two batches), f32 x 1 elided by frame 1 (alone), f32 x 1 elided by
    every frame (empty), f32 x 1, bf16 x 1 elided by frame 0 (alone). Version 3, two frames of
    weights 1 and 2."""
    big = K.SMALL_ELEMS - 1
    spec = ([(F32, (2, 3))] * 3 + [(BF16, (7,))] * 2 + [(F32, (big,))] * 5
            + [(F32, (40,)), (F32, (3,)), (F32, (5,)), (BF16, (30,))])
    rng = np.random.default_rng(7)
    frames = []
    for k in range(2):
        ts = []
        for i, (dtype, shape) in enumerate(spec):
            n = int(np.prod(shape))
            if (i == 10 and k == 1) or i == 11 or (i == 13 and k == 0):
                ts.append(TensorPayload(dtype, shape, b""))
            else:
                ts.append(_payload(_elements(rng, n, dtype, k == 0), dtype, shape))
        frames.append(_frame(ts, weight=1.0 + k))
    for normalise in (False, True):
        out = (reduce_realized_work(frames, version=3) if normalise
               else sum_frames(frames, version=3))
        scale = np.float32(1.0 / 3.0) if normalise else None
        assert [t.data.tobytes() for t in out.tensors] == _reference(frames, scale)
        assert [(t.dtype, t.shape) for t in out.tensors] == spec
        assert all(t.data.format == "B" and t.data.ndim == 1 for t in out.tensors)
        o = _owners(out)
        assert o[0] is o[1] is o[2] and o[3] is o[4] and o[2] is not o[3]
        assert o[5] is o[6] is o[7] is o[8] and o[9] is not o[8] and o[4] is not o[5]
        assert o[10] is not o[12] and o[9] is not o[12] and out.tensors[11].nbytes == 0
        assert o[13] is not o[12]


def test_a_small_fold_that_overflows_or_makes_nan_warns_nothing() -> None:
    """The controller's small-tensor sums run with NumPy's float warnings off (an overflow to
    inf, inf - inf = NaN are values the protocol carries, not errors): no RuntimeWarning."""
    import warnings

    big = np.array([3e38, np.inf, 1.0], np.float32)
    frames = [_frame([_payload(big, F32, (3,)), _payload(big, F32, (3,))], weight=1.0),
              _frame([_payload(big, F32, (3,)), _payload(-big, F32, (3,))], weight=2.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sum_frames(frames)
        normalised = reduce_realized_work(frames)
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    for got, want in ((out, [[inf, inf, 2.0], [0.0, nan, 0.0]]),
                      (normalised, [[inf, inf, np.float32(2.0) * np.float32(1.0 / 3.0)],
                                    [0.0, nan, 0.0]])):
        arrays = [np.frombuffer(t.data, np.float32) for t in got.tensors]
        np.testing.assert_array_equal(arrays, np.array(want, np.float32))



def test_a_small_fold_with_some_elided_payloads_warns_nothing() -> None:
    """As above, for version 3 frames that elide a tensor in some frames only (their schemas
    differ, so the fold judges them afresh instead of taking a remembered plan)."""
    import warnings

    big = np.array([3e38, np.inf, 1.0], np.float32)
    elided = TensorPayload(F32, (3,), b"")
    frames = [_frame([_payload(big, F32, (3,)), _payload(big, F32, (3,))], weight=1.0),
              _frame([_payload(big, F32, (3,)), elided], weight=2.0),
              _frame([_payload(-big, F32, (3,)), _payload(-big, F32, (3,))], weight=1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sum_frames(frames, version=3)
        normalised = reduce_realized_work(frames, version=3)
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    quarter = np.float32(0.25)
    for got, want in ((out, [[inf, nan, 1.0], [0.0, nan, 0.0]]),
                      (normalised, [[inf, nan, quarter], [0.0, nan, 0.0]])):
        arrays = [np.frombuffer(t.data, np.float32) for t in got.tensors]
        np.testing.assert_array_equal(arrays, np.array(want, np.float32))


@pytest.mark.parametrize("version", [2, 3])
def test_the_remembered_plan_sums_every_run_of_a_schema(version: int) -> None:
    """Frames of one schema (the remembered plan's path): f32 x 3 (a batch), bf16 x 2 (a
    batch), f32 of 16,383 elements x 5 (the fifth starts a second batch, which the next f32
    tensor joins), f32 x 40 (version 2: in that batch too; version 3: zero bytes in every
    frame, so elided, and it stays elided), bf16 x 30. Each tensor's bytes are the general
    kernel's, each batch's payloads slices of one array; a second round of the same schema
    with other values (the plan then comes from the fold's memory) likewise."""
    big = K.SMALL_ELEMS - 1
    spec = ([(F32, (2, 3))] * 3 + [(BF16, (7,))] * 2 + [(F32, (big,))] * 5
            + [(F32, (3,)), (F32, (40,)), (BF16, (30,))])
    for rnd in range(2):
        rng = np.random.default_rng(17 + rnd)
        frames = []
        for k in range(3):
            ts = []
            for i, (dtype, shape) in enumerate(spec):
                if version == 3 and i == 11:
                    ts.append(TensorPayload(dtype, shape, b""))
                    continue
                n = int(np.prod(shape))
                ts.append(_payload(_elements(rng, n, dtype, k == 0), dtype, shape))
            frames.append(_frame(ts, weight=1.0 + k))
        for normalise in (False, True):
            out = (reduce_realized_work(frames, version=version) if normalise
                   else sum_frames(frames, version=version))
            assert out.weight == 6.0 and out.kind is RoundKind.MODEL
            scale = np.float32(1.0 / 6.0) if normalise else None
            assert [t.data.tobytes() for t in out.tensors] == _reference(frames, scale)
            assert [(t.dtype, t.shape) for t in out.tensors] == spec
            o = _owners(out)
            assert o[0] is o[1] is o[2] and o[3] is o[4] and o[2] is not o[3]
            assert o[5] is o[6] is o[7] is o[8] and o[9] is not o[8] and o[4] is not o[5]
            assert o[10] is o[9] and o[12] is not o[10]
            if version == 2:
                assert o[11] is o[10] and out.tensors[11].nbytes == 160
            else:
                assert out.tensors[11].nbytes == 0


@pytest.mark.parametrize("version", [2, 3])
def test_frames_without_tensors_sum_to_a_frame_without_tensors(version: int) -> None:
    frames = [_frame([], weight=1.0), _frame([], weight=3.0)]
    for out in (sum_frames(frames, version=version),
                reduce_realized_work(frames, version=version)):
        assert out.tensors == () and out.weight == 4.0 and out.kind is RoundKind.MODEL


def test_a_batch_may_fill_a_chunk_exactly() -> None:
    """Eight f32 tensors of CHUNK_ELEMS / 8 elements: one batch of exactly CHUNK_ELEMS."""
    n = K.CHUNK_ELEMS // 8
    rng = np.random.default_rng(3)
    frames = [_frame([_payload(_elements(rng, n, F32, False), F32, (n,)) for _ in range(8)])
              for _ in range(2)]
    out = sum_frames(frames)
    assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)
    assert len({id(x) for x in _owners(out)}) == 1


def _blob(frame: RoundFrame) -> bytes:
    return encode_round_frame_bytes(frame, SALT)


@pytest.mark.parametrize("version", [2, 3])
def test_the_relay_folds_a_small_completing_deposit_in_batches(version: int) -> None:
    """Version 2 batches a zero-element tensor with its neighbours; version 3 reads it as
    elided, so the round there has none."""
    spec = [(F32, (3,)), (F32, (2, 2)), (BF16, (9,)), (BF16, (1,)), (F32, (0,)), (F32, (6,))]
    if version == 3:
        del spec[4]
    rng = np.random.default_rng(11)
    frames = [_frame([_payload(_elements(rng, int(np.prod(s)), d, k == 0), d, s)
                      for d, s in spec], weight=0.5 + k) for k in range(2)]
    fold = HostFold([0, 1], SALT, version=version)
    assert fold.deposit_frame(0, _blob(frames[0])) is None
    out = fold.deposit_frame(1, _blob(frames[1]))
    assert isinstance(out, RoundFrame) and out.weight == 2.0 and out.kind is RoundKind.MODEL
    assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)
    assert [(t.dtype, t.shape) for t in out.tensors] == spec
    o = _owners(out)
    assert o[0] is o[1] and o[2] is o[3] and o[1] is not o[2]
    assert o[3] is not o[4] and (version == 3 or o[4] is o[5])


def test_the_relay_batches_stop_at_a_chunk() -> None:
    n = K.SMALL_ELEMS - 1
    rng = np.random.default_rng(5)
    frames = [_frame([_payload(_elements(rng, n, BF16, k == 0), BF16, (n,)) for _ in range(5)])
              for k in range(2)]
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(frames[0]))
    out = fold.deposit_frame(1, _blob(frames[1]))
    assert isinstance(out, RoundFrame)
    assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)
    o = _owners(out)
    assert o[0] is o[1] is o[2] is o[3] and o[4] is not o[3]


def test_a_larger_or_elided_completing_deposit_takes_the_per_tensor_path() -> None:
    """A tensor of SMALL_ELEMS elements, or (version 3) an elided payload: the batches are not
    used and the sums are those of the per-tensor path."""
    n = K.SMALL_ELEMS
    rng = np.random.default_rng(9)
    for version, elide in ((2, False), (3, True)):
        frames = [_frame([_payload(_elements(rng, 4, F32, False), F32, (4,)),
                          _payload(_elements(rng, n, F32, False), F32, (n,))]),
                  _frame([_payload(_elements(rng, 4, F32, False), F32, (4,)),
                          TensorPayload(F32, (n,), b"") if elide
                          else _payload(_elements(rng, n, F32, False), F32, (n,))])]
        fold = HostFold([0, 1], SALT, version=version)
        fold.deposit_frame(0, _blob(frames[0]))
        out = fold.deposit_frame(1, _blob(frames[1]))
        assert isinstance(out, RoundFrame)
        assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)
        o = _owners(out)
        assert o[0] is not o[1]


def test_the_batched_completion_raises_the_first_tensors_byte_count_error() -> None:
    """Tensor 1 of the completing deposit carries 8 bytes for 3 f32 elements, tensor 2 too:
    the error names tensor 1, as the per-tensor path does."""
    good = _payload(np.ones(3, np.float32), F32, (3,))
    seed = _frame([good, good, good])
    bad = TensorPayload(F32, (3,), bytes(8))
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(seed))
    with pytest.raises(ProtocolError) as exc:
        fold.deposit_frame(1, _blob(_frame([good, bad, bad])))
    assert exc.value.error_id == "fold.accumulate_nbytes"
    assert exc.value.fields == {"rank": 1, "index": 1, "got": 8, "numel": 3, "element_size": 4}


def test_the_batched_completion_checks_the_seed_first() -> None:
    """A seed whose tensor 0 disagrees with its shape, and a deposit whose tensor 1 does too:
    the seed's promotion error comes first."""
    good = _payload(np.ones(3, np.float32), F32, (3,))
    short = TensorPayload(F32, (3,), bytes(4))
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(_frame([short, good])))
    with pytest.raises(ProtocolError) as exc:
        fold.deposit_frame(1, _blob(_frame([good, short])))
    assert exc.value.error_id == "fold.seed_promotion"
    assert exc.value.fields == {"got": 4, "numel": 3, "element_size": 4}


def test_a_dtype_mismatch_in_a_small_completing_deposit_is_the_per_tensor_error() -> None:
    good = _payload(np.ones(3, np.float32), F32, (3,))
    other = TensorPayload(BF16, (3,), bytes(6))
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(_frame([good, good])))
    with pytest.raises(ProtocolError) as exc:
        fold.deposit_frame(1, _blob(_frame([good, other])))
    assert exc.value.error_id == "fold.dtype_mismatch"
    assert exc.value.fields == {"rank": 1, "index": 1, "got": BF16, "expected": F32}


@pytest.mark.parametrize("version", [2, 3])
def test_a_round_without_tensors_ships_the_summed_weight(version: int) -> None:
    # nothing to promote: the seed's (no) tensors under the summed weight, as upstream's fold
    # re-serializes its seed with the round's weight; the seed's bytes only when the sum is its
    seed = _blob(_frame([], weight=1.0))
    fold = HostFold([0, 1], SALT, version=version)
    fold.deposit_frame(0, seed)
    out = fold.deposit_frame(1, _blob(_frame([], weight=2.0)))
    assert isinstance(out, RoundFrame)
    assert (out.kind, out.weight, out.tensors) == (RoundKind.MODEL, 3.0, ())
    fold.deposit_frame(0, seed)
    out = fold.deposit_frame(1, _blob(_frame([], weight=0.0)))
    assert isinstance(out, memoryview) and bytes(out) == seed


def test_a_relay_batch_may_fill_a_chunk_exactly() -> None:
    n = K.CHUNK_ELEMS // 8
    rng = np.random.default_rng(13)
    frames = [_frame([_payload(_elements(rng, n, F32, False), F32, (n,)) for _ in range(8)])
              for _ in range(2)]
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(frames[0]))
    out = fold.deposit_frame(1, _blob(frames[1]))
    assert isinstance(out, RoundFrame)
    assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)
    assert len({id(x) for x in _owners(out)}) == 1


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_three_ranks_complete_on_the_per_tensor_path(dtype: int) -> None:
    """The second deposit promotes the seed to running sums: the third, which completes the
    round, adds to them tensor by tensor (no batch), and the result is the three-way sum."""
    spec = [(dtype, (5,)), (dtype, (2, 3))]
    rng = np.random.default_rng(17)
    frames = [_frame([_payload(_elements(rng, int(np.prod(s)), d, False), d, s)
                      for d, s in spec]) for _ in range(3)]
    fold = HostFold([0, 1, 2], SALT)
    assert fold.deposit_frame(0, _blob(frames[0])) is None
    assert fold.deposit_frame(1, _blob(frames[1])) is None
    out = fold.deposit_frame(2, _blob(frames[2]))
    assert isinstance(out, RoundFrame) and out.weight == 3.0
    assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)


def test_a_small_completing_deposit_with_more_tensors_than_the_seed() -> None:
    good = _payload(np.ones(3, np.float32), F32, (3,))
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(_frame([good])))
    with pytest.raises(ProtocolError) as exc:
        fold.deposit_frame(1, _blob(_frame([good, good])))
    assert exc.value.error_id == "fold.more_tensors"
    assert exc.value.fields == {"rank": 1, "expected": 1}


@pytest.mark.parametrize("elided_by", ["seed", "deposit"])
def test_version_3_small_elided_payloads_add_nothing(elided_by: str) -> None:
    """A small tensor elided by the seed or by the completing deposit: the sum is the other
    frame's payload (plus 0.0), the other tensors are summed as usual."""
    rng = np.random.default_rng(19)
    a = [_payload(_elements(rng, 6, F32, False), F32, (6,)) for _ in range(2)]
    b = [_payload(_elements(rng, 6, F32, False), F32, (6,)) for _ in range(2)]
    elided = TensorPayload(F32, (6,), b"")
    if elided_by == "seed":
        frames = [_frame([a[0], elided]), _frame([b[0], b[1]])]
    else:
        frames = [_frame([a[0], a[1]]), _frame([b[0], elided])]
    fold = HostFold([0, 1], SALT, version=3)
    fold.deposit_frame(0, _blob(frames[0]))
    out = fold.deposit_frame(1, _blob(frames[1]))
    assert isinstance(out, RoundFrame)
    assert [t.data.tobytes() for t in out.tensors] == _reference(frames, None)


def test_one_workspace_across_runs_of_every_form_gives_the_per_tensor_bytes() -> None:
    """A workspace reused run after run, the runs growing and shrinking (its zero-low lanes
    made again, longer, when a run needs more), contributions as one flat array, several, or
    rows of a 2-D array, with and without a scale, other kernels writing the same workspace in
    between: every run's bytes are the per-tensor kernels' (special patterns, NaN payloads,
    signed zeros, infinities, rounding ties in every run)."""
    ws = K.Workspace(K.CHUNK_ELEMS)
    rng = np.random.default_rng(11)
    cases = [([5], 2, None), ([40, 260], 3, np.float32(1 / 3)), ([2], 2, None),
             ([700, 700, 700], 4, None), ([1, 1], 2, np.float32(0.0)),
             ([2048], 2, np.float32(1e-30)), ([300] * 3, 2, np.float32(np.inf)),
             ([14], 1, np.float32(0.25))]
    for step, (lengths, frames, scale) in enumerate(cases):
        contribs = _contribs(lengths, BF16, frames, seed=100 + step)
        total = sum(lengths)
        forms: list[Any] = [contribs]
        if len(set(lengths)) == 1:
            forms.append([np.stack(c) for c in contribs])
        with np.errstate(all="ignore"):
            want = b"".join(
                K.sum_small([c[i] for c in contribs], BF16, n, scale,
                            K.Workspace(max(n, 1))).tobytes()
                for i, n in enumerate(lengths))
            for form in forms:
                assert K.sum_small_batch(form, BF16, total, scale, ws).tobytes() == want, step
            # other kernels scribble on the workspace's scratch between runs
            junk = rng.standard_normal(K.CHUNK_ELEMS).astype(np.float32)
            K.round_bf16_small(junk[:3000].copy(), ws, True)
            K.encode_bf16(junk, np.empty(K.CHUNK_ELEMS, np.uint16), ws)

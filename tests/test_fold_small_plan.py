"""The controller reduce's remembered small-round plan (``fold._small_plan``): a round whose
frames all carry one schema (kind; per tensor dtype, shape and byte count) is summed from the
plan of an earlier round of that schema, without judging the schema again. The planned path and
the general path give the same bytes for the same frames, and every frame set the plan does not
cover (differing schemas, an error, a large tensor) goes through the general path, which raises
its usual errors in its order."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce import fold, reduce_realized_work, sum_frames

SALT = bytes(range(16))
F32, BF16 = 0, 1


def _payload(rng: np.random.Generator, shape: tuple[int, ...], dtype: int) -> TensorPayload:
    vals = (rng.standard_normal(int(np.prod(shape, dtype=np.int64))) * 3).astype(np.float32)
    if vals.size:
        vals[0] = np.float32("nan") if rng.random() < 0.3 else vals[0]
    return TensorPayload.from_array(vals.reshape(shape), dtype)


def _frames(spec: list[tuple[tuple[int, ...], int]], count: int, *, seed: int,
            kind: RoundKind = RoundKind.MODEL, weights: list[float] | None = None,
            elide: set[tuple[int, int]] = frozenset()) -> list[RoundFrame]:
    """``count`` frames of tensors ``spec`` (shape, dtype); ``elide``: (frame, tensor) pairs
    carried with no bytes."""
    rng = np.random.default_rng(seed)
    ws = weights if weights is not None else [1.0 + k for k in range(count)]
    out = []
    for k in range(count):
        ts = [TensorPayload.elide(d, s) if (k, i) in elide else _payload(rng, s, d)
              for i, (s, d) in enumerate(spec)]
        out.append(RoundFrame(kind, ws[k], ts))
    return out


def _general(monkeypatch: pytest.MonkeyPatch, call: Any, *args: Any, **kw: Any) -> Any:
    """``_outcome`` of ``call(*args, **kw)`` with the remembered plans switched off (the general
    path only)."""
    with monkeypatch.context() as m:
        m.setattr(fold, "_small_plan", lambda frames, v3: None)
        return _outcome(call, *args, **kw)


def _outcome(call: Any, *args: Any, **kw: Any) -> tuple[str, Any]:
    try:
        f = call(*args, **kw)
    except ProtocolError as e:
        return "error", (type(e), e.remote, str(e))
    return "frame", (encode_round_frame_bytes(f, SALT), struct.pack("<d", f.weight))


def _not_called(*args: Any) -> None:
    raise AssertionError("the planned path judged the schema again")


_SPECS = {
    "f32": [((256,), F32)] * 4,
    "bf16": [((512,), BF16)] * 4,
    "mixed": [((3, 5), F32), ((7,), BF16), ((), F32), ((0,), F32), ((2, 0, 3), BF16),
              ((300,), BF16), ((1,), F32)],
    "runs past a chunk": [((K.SMALL_ELEMS - 1,), F32)] * 5 + [((10,), BF16)],
    "empty frame": [],
}


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("name", list(_SPECS))
@pytest.mark.parametrize("kind", [RoundKind.MODEL, RoundKind.CONTROL])
def test_the_plan_gives_the_general_bytes(monkeypatch: pytest.MonkeyPatch, version: int,
                                          count: int, name: str, kind: RoundKind) -> None:
    frames = _frames(_SPECS[name], count, seed=count, kind=kind)
    want = _general(monkeypatch, reduce_realized_work, frames, version=version)
    fold._small_plans.clear()
    first = _outcome(reduce_realized_work, frames, version=version)  # makes the plan
    with monkeypatch.context() as m:  # the schema is not judged again
        m.setattr(fold, "_check_schema", _not_called)
        m.setattr(fold, "_plan", _not_called)
        again = _outcome(reduce_realized_work, frames, version=version)  # uses it
    assert want[0] == "frame"
    assert first == again == want
    assert isinstance(fold._small_plans[(version >= 3, *fold._schema(frames[0]))],
                      fold._SmallPlan)
    summed = _outcome(sum_frames, frames, version=version)
    assert summed == _general(monkeypatch, sum_frames, frames, version=version)


@pytest.mark.parametrize("weights", [[0.0, -0.0], [-0.0, -0.0], [1e-300, 0.0], [1e308, 1e308],
                                     [3.0, 7.0]])
def test_weights_and_scales_as_the_general_path(monkeypatch: pytest.MonkeyPatch,
                                                weights: list[float]) -> None:
    for spec in (_SPECS["f32"], _SPECS["bf16"]):
        frames = _frames(spec, 2, seed=5, weights=weights)
        want = _general(monkeypatch, reduce_realized_work, frames)
        assert _outcome(reduce_realized_work, frames) == want
        assert _outcome(reduce_realized_work, frames) == want


def test_version_3_elided_everywhere_is_planned_elided_somewhere_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = [((4,), F32), ((6,), BF16), ((5,), F32)]
    everywhere = _frames(spec, 2, seed=1, elide={(0, 1), (1, 1)})
    somewhere = _frames(spec, 2, seed=1, elide={(1, 0)})
    for frames, planned in ((everywhere, True), (somewhere, False)):
        fold._small_plans.clear()
        want = _general(monkeypatch, reduce_realized_work, frames, version=3)
        assert want[0] == "frame"
        assert _outcome(reduce_realized_work, frames, version=3) == want
        assert (fold._small_plan(frames, True) is not None) is planned
    got = reduce_realized_work(everywhere, version=3)
    assert [t.nbytes for t in got.tensors] == [16, 0, 20]
    # version 2 rejects the elided payloads, with or without a plan
    want = _general(monkeypatch, reduce_realized_work, everywhere)
    assert want[0] == "error"
    assert _outcome(reduce_realized_work, everywhere) == want


def _bad_sets() -> dict[str, list[RoundFrame]]:
    good = _frames(_SPECS["mixed"], 2, seed=9)
    a, b = good
    other_shape = RoundFrame(b.kind, b.weight, [*b.tensors[:1],
                                                TensorPayload(BF16, (1, 7), b.tensors[1].data),
                                                *b.tensors[2:]])
    other_dtype = RoundFrame(b.kind, b.weight, [TensorPayload(BF16, (3, 5),
                                                              bytes(30)), *b.tensors[1:]])
    short = RoundFrame(a.kind, a.weight, [TensorPayload(F32, (3, 5), bytes(56)), *a.tensors[1:]],
                       check_nbytes=False)
    unknown = RoundFrame(a.kind, a.weight, [TensorPayload(7, (3,), bytes(12))])
    return {
        "kind": [a, RoundFrame(RoundKind.CONTROL, b.weight, b.tensors)],
        "count": [a, RoundFrame(b.kind, b.weight, b.tensors[:-1])],
        "shape": [a, other_shape],
        "dtype": [a, other_dtype],
        "seed nbytes, every frame": [short, short],
        "seed nbytes, one frame": [short, b],
        "unknown dtype": [unknown, unknown],
        "weight overflow": [RoundFrame(a.kind, 1.5e308, a.tensors),
                            RoundFrame(b.kind, 1.5e308, b.tensors)],
    }


@pytest.mark.parametrize("name", list(_bad_sets()))
def test_errors_as_the_general_path(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    frames = _bad_sets()[name]
    want = _general(monkeypatch, reduce_realized_work, frames)
    assert want[0] == "error"
    fold._small_plans.clear()
    assert _outcome(reduce_realized_work, frames) == want
    assert _outcome(reduce_realized_work, frames) == want
    # a schema that fails is remembered as "no plan"; frames 0's own schema may be fine
    if name in ("seed nbytes, every frame", "unknown dtype"):
        assert fold._small_plans[(False, *fold._schema(frames[0]))] is None


def test_a_large_tensor_gets_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    frames = _frames([((K.SMALL_ELEMS,), F32), ((3,), F32)], 2, seed=2)
    fold._small_plans.clear()
    want = _general(monkeypatch, reduce_realized_work, frames)
    assert _outcome(reduce_realized_work, frames) == want
    assert fold._small_plans[(False, *fold._schema(frames[0]))] is None


def test_the_remembered_plans_are_bounded() -> None:
    fold._small_plans.clear()
    for n in range(1, 3 * fold._SMALL_PLANS_MAX):
        reduce_realized_work(_frames([((n,), F32)], 1, seed=n))
        assert 1 <= len(fold._small_plans) <= fold._SMALL_PLANS_MAX


def _overflowing() -> list[RoundFrame]:
    """Two frames whose sum overflows f32 (an infinity, and inf - inf: a NaN)."""
    big = np.float32(3e38)
    return [RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.array([big, np.inf, 1.0], np.float32), F32)]),
        RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload.from_array(
            np.array([big, -np.inf, 2.0], np.float32), F32)])]


def test_the_planned_fold_builds_no_errstate(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold from a remembered plan enters NumPy's warning context without building an
    ``np.errstate`` object (``reduce._quiet``); its bytes are the general path's."""
    frames = _overflowing()
    fold._small_plans.clear()
    want = _general(monkeypatch, reduce_realized_work, frames)
    assert _outcome(reduce_realized_work, frames) == want  # the plan is made here

    def refused(*args: Any, **kw: Any) -> Any:
        raise AssertionError("np.errstate built on the planned path")

    with monkeypatch.context() as m:
        m.setattr(np, "errstate", refused)
        got = _outcome(reduce_realized_work, frames)
    assert got == want
    out = np.frombuffer(reduce_realized_work(frames).tensors[0].data, np.float32)
    assert np.isinf(out[0]) and np.isnan(out[1]) and out[2] == np.float32(1.0)


@pytest.mark.parametrize("fail", [False, True])
def test_the_planned_fold_is_quiet_and_leaves_the_callers_state(
        monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    """As under ``np.errstate(all="ignore")``: no float warning inside the planned fold, and the
    caller's own warning state back afterwards, also when the fold raises."""
    import warnings

    frames = _overflowing()
    fold._small_plans.clear()
    reduce_realized_work(frames)  # the plan is made here
    if fail:
        def boom(*args: Any, **kw: Any) -> Any:
            np.add(np.array([3e38], np.float32), np.array([3e38], np.float32))
            raise KeyError("kernel")

        monkeypatch.setattr(K, "sum_small_batch", boom)
    with np.errstate(all="raise"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = np.geterr()
        try:
            reduce_realized_work(frames)
        except KeyError:
            assert fail
        else:
            assert not fail
        after = np.geterr()
        with pytest.raises(FloatingPointError):
            np.add(np.array([3e38], np.float32), np.array([3e38], np.float32))
    assert [str(w.message) for w in seen] == []
    assert after == before == {"divide": "raise", "over": "raise", "under": "raise",
                               "invalid": "raise"}

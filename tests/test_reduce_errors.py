"""Every error of the fold monoid and the controller's reduce, with its id and every field it
carries written out here (a reduce that raised the right class with the wrong frame index,
count or id would pass a class check), plus the mass policies' edge values."""

from __future__ import annotations

import math
from fractions import Fraction as F
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload
from flodl_proto.errors import InvalidValue, LocalProtocolError, ProtocolError
from flodl_proto.reduce import (
    OutputPool,
    gamma_mass,
    is_realized,
    mover_mass,
    reduce_realized_work,
    sum_frames,
)


def _f(*tensors: TensorPayload, weight: float = 1.0,
       kind: RoundKind = RoundKind.MODEL) -> RoundFrame:
    return RoundFrame(kind, weight, list(tensors), check_nbytes=False)  # the folds' bad inputs


def _t(dtype: int = 0, shape: tuple[int, ...] = (2,), nbytes: int | None = None) -> TensorPayload:
    es = {0: 4, 1: 2}.get(dtype, 4)
    n = es * (shape[0] if shape else 1) if nbytes is None else nbytes
    return TensorPayload(dtype, shape, bytes(n))


CASES: list[tuple[str, list[RoundFrame], int, str, dict[str, Any]]] = [
    ("kind", [_f(_t()), _f(_t()), _f(_t(), kind=RoundKind.CONTROL)], 3,
     "reduce.kind_mismatch", {"frame": 2, "got": "Control", "expected": "Model"}),
    ("count", [_f(_t(), _t()), _f(_t(), _t()), _f(_t())], 3,
     "reduce.count_mismatch", {"frame": 2, "got": 1, "expected": 2}),
    ("dtype", [_f(_t(), _t()), _f(_t(), _t(1))], 3,
     "reduce.dtype_mismatch", {"frame": 1, "index": 1, "got": 1, "expected": 0}),
    ("shape", [_f(_t(), _t()), _f(_t(), _t(0, (3,)))], 3,
     "reduce.shape_mismatch", {"frame": 1, "index": 1, "got": [3], "expected": [2]}),
    ("nbytes", [_f(_t(), _t()), _f(_t(), _t(nbytes=4))], 3,
     "reduce.nbytes_mismatch", {"frame": 1, "index": 1, "got": 4, "expected": 8}),
    ("unknown dtype", [_f(_t(), _t(7)), _f(_t(), _t(7))], 3,
     "reduce.unknown_dtype", {"index": 1, "dtype": 7}),
    ("seed nbytes", [_f(_t(), _t(nbytes=4)), _f(_t(), _t(nbytes=4))], 3,
     "reduce.seed_nbytes", {"index": 1, "shape": [2], "expected": 8, "got": 4}),
    ("elided at v2", [_f(_t(), _t()), _f(_t(), _t(nbytes=0))], 2,
     "reduce.nbytes_mismatch", {"frame": 1, "index": 1, "got": 0, "expected": 8}),
    ("accumulate nbytes", [_f(_t(), _t(nbytes=0)), _f(_t(), _t(nbytes=4))], 3,
     "reduce.accumulate_nbytes", {"got": 4, "numel": 2, "element_size": 4}),
    ("weight overflow", [_f(_t(), weight=1.6e308), _f(_t(), weight=1.6e308)], 3,
     "reduce.weight_overflow", {"count": 2, "weight": float("inf")}),
    # frames of different schemas (a tensor elided by one frame only): judged afresh
    ("weight overflow, elided in one frame",
     [_f(_t(), _t(), weight=1.6e308), _f(_t(), _t(nbytes=0), weight=1.0),
      _f(_t(), _t(), weight=1.6e308)], 3,
     "reduce.weight_overflow", {"count": 3, "weight": float("inf")}),
]


@pytest.mark.parametrize("fn", [sum_frames, reduce_realized_work])
@pytest.mark.parametrize(("what", "frames", "version", "error_id", "fields"), CASES,
                         ids=[c[0] for c in CASES])
def test_errors_name_their_fields(fn: Any, what: str, frames: list[RoundFrame], version: int,
                                  error_id: str, fields: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as ei:
        fn(frames, version=version)
    assert ei.value.error_id == error_id, what
    assert ei.value.remote
    assert dict(ei.value.fields) == fields, what


def test_no_frames() -> None:
    with pytest.raises(ProtocolError) as ei:
        sum_frames([])
    assert ei.value.error_id == "reduce.no_frames" and not ei.value.remote
    with pytest.raises(ProtocolError) as ei:
        reduce_realized_work([None, None])
    assert ei.value.error_id == "reduce.no_accepted" and not ei.value.remote


def test_gamma_mass_edges() -> None:
    assert gamma_mass(0.5, 2.0) == 0.25  # below one step: still n ** gamma
    assert gamma_mass(0.0, 0.0) == 0.0 and gamma_mass(-1.0, -1.0) == 0.0
    assert gamma_mass(3.0, 1.0) == 3.0 and gamma_mass(4.0, 0.5) == 2.0
    assert gamma_mass(1.0, 0.0) == 1.0 and gamma_mass(2.0, -1.0) == 0.5


_NOT_FRAMES: list[tuple[str, Any, str, str, str]] = [
    # (what, frames, field, value shown, reason)
    ("None", None, "frames", "None", "not an iterable of RoundFrame"),
    ("a number", 3, "frames", repr(int), "not an iterable of RoundFrame"),
    ("a frame", _f(_t()), "frames", repr(RoundFrame),
     "not an iterable of RoundFrame (one frame: pass [frame])"),
    ("an array", [np.ones(2)], "frames[0]", repr(np.ndarray), "not a RoundFrame"),
    ("wire bytes", [_f(_t()), b"abc"], "frames[1]", repr(bytes), "not a RoundFrame"),
]


@pytest.mark.parametrize(("what", "frames", "field", "shown", "reason"), _NOT_FRAMES,
                         ids=[c[0] for c in _NOT_FRAMES])
@pytest.mark.parametrize("fn", [sum_frames, reduce_realized_work])
def test_frames_that_are_not_frames_are_local_errors_naming_them(
        fn: Any, what: str, frames: Any, field: str, shown: str, reason: str) -> None:
    # an AttributeError ('weight'), a bare TypeError, or "called with no frames" for None
    if fn is reduce_realized_work and "RoundFrame" in reason and field != "frames":
        reason = "not a RoundFrame or None"
    if fn is reduce_realized_work and field == "frames":
        reason = reason.replace("of RoundFrame", "of RoundFrame or None")
    with pytest.raises(InvalidValue) as ei:
        fn(frames)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "controller.bad_argument", what
    assert str(ei.value) == f"cluster_controller: {field} = {shown} is invalid: {reason}", what
    assert ei.value.fields["field"] == field


def test_sum_frames_refuses_a_none_frame() -> None:
    with pytest.raises(InvalidValue) as ei:
        sum_frames([_f(_t()), None])  # type: ignore[list-item]
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == ("cluster_controller: frames[1] = None is invalid: not a RoundFrame "
                             "(None is reduce_realized_work's, a connection with no frame)")


@pytest.mark.parametrize("fn", [sum_frames, reduce_realized_work])
def test_frames_may_be_any_iterable(fn: Any) -> None:
    frames = [_f(TensorPayload(0, (2,), np.ones(2, np.float32).tobytes()), weight=w)
              for w in (1.0, 2.0)]
    got = fn(f for f in frames)  # a generator: 'generator' object is not subscriptable
    want = fn(frames)
    assert got.weight == want.weight == 3.0
    assert [bytes(t.data) for t in got.tensors] == [bytes(t.data) for t in want.tensors]
    with pytest.raises(ProtocolError) as ei:
        fn(iter([]))
    assert ei.value.error_id in ("reduce.no_frames", "reduce.no_accepted")


@pytest.mark.parametrize("fn", [sum_frames, reduce_realized_work])
@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2", None])
def test_threads_is_a_whole_number_of_at_least_one(fn: Any, threads: Any) -> None:
    # 0 and -1 were taken as 1
    frames = [_f(TensorPayload(0, (2,), np.ones(2, np.float32).tobytes()))]
    with pytest.raises(InvalidValue) as ei:
        fn(frames, threads=threads)
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == (f"cluster_controller: threads = {threads!r} is invalid: not a whole "
                             "number >= 1")
    assert fn(frames, threads=np.int64(2)).weight == 1.0


@pytest.mark.parametrize(("fn", "args", "field", "value"), [
    (gamma_mass, ("2", 2.0), "n", "2"),
    (gamma_mass, (2, "x"), "gamma", "x"),
    (gamma_mass, (None, 1.0), "n", None),
    (gamma_mass, (True, 1.0), "n", True),
    (gamma_mass, (2.0, np.bool_(True)), "gamma", np.bool_(True)),
    (mover_mass, (None,), "n", None),
    (mover_mass, ("1",), "n", "1"),
    (is_realized, (None,), "mass", None),
    (is_realized, ("1.0",), "mass", "1.0"),
])
def test_mass_policies_refuse_what_is_no_real_number(fn: Any, args: tuple[Any, ...], field: str,
                                                     value: Any) -> None:
    with pytest.raises(InvalidValue) as ei:
        fn(*args)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "controller.bad_argument"
    assert ei.value.fields == {"field": field, "value": value, "reason": "not a real number"}
    assert str(ei.value) == f"cluster_controller: {field} = {value!r} is invalid: not a real number"


@pytest.mark.parametrize(("fn", "args", "field", "value", "text", "rounded"), [
    (is_realized, (F(1, 10**400),), "mass", F(1, 10**400),
     "<a Fraction of 1 bit over 1329 bits>", "0.0"),
    (mover_mass, (F(1, 2**1075),), "n", F(1, 2**1075), "<a Fraction of 1 bit over 1076 bits>",
     "0.0"),
    (gamma_mass, (F(1, 10**400), 1.0), "n", F(1, 10**400),
     "<a Fraction of 1 bit over 1329 bits>", "0.0"),
    (gamma_mass, (2.0, F(-1, 10**400)), "gamma", F(-1, 10**400),
     "<a negative Fraction of 1 bit over 1329 bits>", "-0.0"),
], ids=["is_realized", "mover_mass", "gamma_mass-n", "gamma_mass-gamma"])
def test_mass_policies_refuse_a_nonzero_exact_value_that_rounds_to_zero(
        fn: Any, args: tuple[Any, ...], field: str, value: F, text: str, rounded: str) -> None:
    """is_realized(Fraction(1, 10**400)) was False and mover_mass of it 0.0: a mass that is
    above zero was taken as no realized work. A nonzero int or Fraction whose f64 is a zero is
    refused, named as given; a float is taken as it is."""
    reason = f"nonzero, but rounds to {rounded} in f64"
    with pytest.raises(InvalidValue) as ei:
        fn(*args)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "controller.bad_argument"
    assert ei.value.fields == {"field": field, "value": value, "reason": reason}
    assert str(ei.value) == f"cluster_controller: {field} = {text} is invalid: {reason}"
    assert is_realized(F(3, 2**1076)) and not is_realized(F(0)) and not is_realized(1e-400)
    assert mover_mass(F(3, 2**1076)) == 1.0 and gamma_mass(2.0, F(0)) == 1.0


def test_a_fraction_past_the_f64_range_is_taken_as_the_int_of_its_size() -> None:
    """The real-number rule takes an int past the f64 range as an infinity of its sign (as
    Rust's ``as f64`` saturates), and a Fraction the same."""
    for big in (10**400, -(10**400)):
        assert is_realized(F(big)) is is_realized(big) is (big > 0)
        assert mover_mass(F(big)) == mover_mass(big)
        assert gamma_mass(F(big), 1.0) == gamma_mass(big, 1.0) == (math.inf if big > 0 else 0.0)


def test_mass_policies_follow_f64_arithmetic() -> None:
    assert gamma_mass(1e308, 2.0) == math.inf  # f64 powf saturates (was an OverflowError)
    assert gamma_mass(2**2000, 0.5) == math.inf  # an int beyond f64 is +inf, as `as f64`
    assert gamma_mass(1e-300, 2.0) == 0.0
    assert gamma_mass(np.int64(4), np.float32(0.5)) == 2.0
    assert math.isnan(gamma_mass(2.0, math.nan))
    assert mover_mass(np.int32(3)) == 1.0 and mover_mass(0) == 0.0
    assert is_realized(np.float32(0.5)) and not is_realized(0) and not is_realized(math.nan)


@pytest.mark.parametrize("pool", ["x", object(), [1]])
def test_a_pool_that_is_no_output_pool_is_refused(pool: Any) -> None:
    with pytest.raises(InvalidValue) as ei:
        reduce_realized_work([_f(_t()), _f(_t())], pool=pool)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "controller.bad_argument"
    assert ei.value.fields == {"field": "pool", "value": type(pool),
                               "reason": "not an OutputPool or None"}
    assert reduce_realized_work([_f(_t()), _f(_t())], pool=OutputPool()).weight == 2.0

"""Every error of the fold monoid and the controller's reduce, with its id and every field it
carries written out here (a reduce that raised the right class with the wrong frame index,
count or id would pass a class check), plus the mass policies' edge values."""

from __future__ import annotations

from typing import Any

import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload
from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import gamma_mass, reduce_realized_work, sum_frames


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

"""The outer optimizer stepper's edges: its errors with every field, frames without tensors or
with elided tensors, state restored from plain lists, and copies kept apart from the frames it
was given (a reused receive buffer must not change the next window's step)."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload
from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import OuterStepper, SlowMomentum

CONTROL = RoundFrame(RoundKind.CONTROL, 0.0, [])


def _model(*values: list[float], weight: float = 1.0) -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, weight,
                      [TensorPayload.from_array(np.asarray(v, np.float32)) for v in values])


def _values(frame: RoundFrame) -> list[list[float]]:
    return [t.array().tolist() for t in frame.tensors]


def test_count_and_schema_changes_name_their_fields() -> None:
    s = OuterStepper(SlowMomentum(0.5, 0.9))
    s.process_frame(_model([1.0, 2.0], [3.0]))
    s.process_frame(CONTROL)
    with pytest.raises(ProtocolError) as ei:
        s.process_frame(_model([1.0, 2.0]))
    assert ei.value.error_id == "outer.count_changed" and ei.value.remote
    assert dict(ei.value.fields) == {"got": 1, "expected": 2}
    with pytest.raises(ProtocolError) as ei:
        s.process_frame(_model([1.0, 2.0], [3.0, 4.0]))
    assert ei.value.error_id == "outer.schema_changed"
    assert dict(ei.value.fields) == {"index": 1, "got": [2], "expected": [1]}


def test_a_parameters_frame_without_tensors() -> None:
    s = OuterStepper()
    assert s.seen_params_this_window is False
    out = s.process_frame(_model())
    assert s.seen_params_this_window is True
    s.process_frame(CONTROL)
    assert s.seen_params_this_window is False
    assert out.kind is RoundKind.MODEL and out.weight == 1.0 and list(out.tensors) == []


def test_elided_parameters_step_as_zeros() -> None:
    s = OuterStepper(SlowMomentum(0.5, 0.0))
    s.process_frame(_model([2.0, 4.0]))
    s.process_frame(CONTROL)
    elided = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, (2,), b"")])
    # g = prev - consensus = [2, 4]; new = prev - 0.5 * g = [1, 2]
    assert _values(s.process_frame(elided)) == [[1.0, 2.0]]


def test_the_previous_global_is_a_copy_of_the_frame() -> None:
    s = OuterStepper(SlowMomentum(0.5, 0.0))
    buf = bytearray(np.asarray([2.0, 4.0], np.float32).tobytes())
    s.process_frame(RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, (2,), buf)]))
    buf[:] = np.asarray([100.0, 100.0], np.float32).tobytes()  # the receive buffer is reused
    s.process_frame(CONTROL)
    # prev is still [2, 4]: g = [2, 4] - [0, 0], new = [2, 4] - 0.5 * g = [1, 2]
    assert _values(s.process_frame(_model([0.0, 0.0]))) == [[1.0, 2.0]]


def test_momentum_restored_from_plain_lists_is_f32() -> None:
    s = OuterStepper(SlowMomentum(1.0, 0.5))
    s.load_checkpoint_state([[0.1, 2.0]])
    state = s.checkpoint_state()
    assert state is not None and state[0].dtype == np.float32
    assert state[0].tolist() == [np.float32(0.1), 2.0]
    s.process_frame(_model([1.0, 1.0]))  # first window: g = 0, v = 0.5 * v + 0
    state = s.checkpoint_state()
    assert state is not None
    assert state[0].tolist() == [np.float32(np.float32(0.1) * np.float32(0.5)), 1.0]


def test_restored_momentum_is_a_copy() -> None:
    s = OuterStepper(SlowMomentum(1.0, 0.5))
    saved = np.asarray([1.0, 2.0], np.float32)
    s.load_checkpoint_state([saved])
    saved[:] = 99.0  # the caller reuses its array
    state = s.checkpoint_state()
    assert state is not None and state[0].tolist() == [1.0, 2.0]

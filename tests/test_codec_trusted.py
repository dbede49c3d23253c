"""The unchecked constructors the frame reader and the folds use on every round
(``TensorPayload.trusted``, ``RoundFrame.trusted``): for in-range fields they build exactly what
the checking constructors build, and the reader's frames are built with them."""

from __future__ import annotations

import numpy as np

from flodl_proto.codec.round_frame import (
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    delivered_tensors,
    encode_round_frame_bytes,
    parse_round_frame,
)

SALT = bytes(range(16))


def test_trusted_payload_equals_the_checked_one() -> None:
    data = np.arange(6, dtype=np.float32).view(np.uint8).data
    t = TensorPayload.trusted(0, (2, 3), data)
    c = TensorPayload(0, [2, 3], data)
    assert t == c
    assert (t.dtype, t.shape, t.nbytes, t.numel, t.ndim) == (0, (2, 3), 24, 6, 2)
    assert t.data is data  # kept as given, no copy and no re-cast
    assert t.array().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    odd = TensorPayload.trusted(255, (), memoryview(b""))
    assert (odd.dtype, odd.shape, odd.numel, odd.elided) == (255, (), 1, True)
    assert repr(odd) == "TensorPayload(dtype=255, shape=(), nbytes=0)"
    assert type(t) is TensorPayload


def test_trusted_frame_equals_the_checked_one() -> None:
    p = TensorPayload(1, (2,), b"\x80\x3f\x00\x40")
    f = RoundFrame.trusted(RoundKind.CONTROL, -0.0, (p,))
    assert f == RoundFrame(RoundKind.CONTROL, -0.0, [p])
    assert f != RoundFrame(RoundKind.CONTROL, 0.0, [p])  # the weight's sign is kept
    assert f.kind is RoundKind.CONTROL and f.tensors == (p,) and f.tensors[0] is p
    assert f.wire_len == 25 + 2 + 4 + 8 + 4
    assert type(f) is RoundFrame
    empty = RoundFrame.trusted(RoundKind.MODEL, 2.5, ())
    assert (empty.kind, empty.weight, empty.tensors) == (RoundKind.MODEL, 2.5, ())


def test_reader_builds_frames_with_the_kind_enum_and_tuples() -> None:
    src = RoundFrame(RoundKind.CONTROL, 1.5, [TensorPayload(0, (2,), b"\x00" * 8),
                                             TensorPayload(1, (1, 1), b"\x80\x3f"),
                                             TensorPayload(0, (), b"")])
    wire = encode_round_frame_bytes(src, SALT)
    frame, consumed = decode_round_frame(wire, SALT)
    assert consumed == len(wire) and frame == src
    assert frame.kind is RoundKind.CONTROL and isinstance(frame.tensors, tuple)
    assert [t.shape for t in frame.tensors] == [(2,), (1, 1), ()]
    assert all(type(t.shape) is tuple for t in frame.tensors)
    assert bytes(frame.tensors[1].data) == b"\x80\x3f"
    model = decode_round_frame(encode_round_frame_bytes(
        RoundFrame(RoundKind.MODEL, 0.0, []), SALT), SALT)[0]
    assert model.kind is RoundKind.MODEL and model.tensors == ()
    parsed, n, tag = parse_round_frame(wire)
    assert parsed == src and n == len(wire) and tag == wire[-8:]
    got = delivered_tensors(wire, 2)
    assert got == list(src.tensors[:2]) and [t.shape for t in got] == [(2,), (1, 1)]

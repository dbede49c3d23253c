"""A RoundFrame refuses to frame a payload whose byte count disagrees with its shape and dtype.

Layout (``spec/wire.yaml`` ``messages.round_frame``): per tensor ``dtype u8 | ndim u8 | ndim x
u32 dims | nbytes u64 | data``, where a known dtype's payload is ``numel * element_size`` bytes
(f32 4, bf16 2), or 0 at protocol version 3 for a zero-elided payload (all zeros; version 2
folds reject it). The frame carries no version, so a frame with an elided tensor is built and
written at both versions. Upstream's writer writes any byte count and its readers accept it
(departure ``payload_nbytes_on_write``): ``check_nbytes=False`` and a decoded frame keep that.
Expected bytes, fields and messages are written out here from the spec and the catalogue.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import numpy as np
import pytest

from flodl_proto import errors
from flodl_proto.codec import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    encode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.reduce import reduce_realized_work

ZERO_SALT = bytes(16)
GOOD = TensorPayload(0, [2], struct.pack("<2f", 1.5, -2.0))
ELIDED = TensorPayload.elide(1, [64, 128])


def signed(body: bytes, salt: bytes = ZERO_SALT) -> bytes:
    return body + hmac.new(salt, body, hashlib.sha256).digest()[:8]


@pytest.mark.parametrize(("dtype", "shape", "nbytes", "es", "expected"), [
    (0, [3], 8, 4, 12),             # one element short
    (0, [3], 16, 4, 12),            # one element too many
    (0, [3], 13, 4, 12),            # not whole elements
    (1, [2, 3], 24, 2, 12),         # f32's byte count under a bf16 tag
    (1, [2, 3], 1, 2, 12),
    (0, [], 2, 4, 4),               # a scalar (ndim 0: one element)
    (0, [0], 4, 4, 0),              # no elements, yet bytes
    (1, [5, 0, 7], 2, 2, 0),
    (0, [1 << 16, 1 << 16], 8, 4, 1 << 34),  # the expected count is not materialised
])
def test_a_frame_refuses_a_payload_whose_byte_count_disagrees(
        dtype: int, shape: list[int], nbytes: int, es: int, expected: int) -> None:
    bad = TensorPayload(dtype, shape, bytes(nbytes))
    with pytest.raises(errors.SchemaMismatch) as ei:
        RoundFrame(RoundKind.MODEL, 1.0, [GOOD, ELIDED, bad, GOOD])
    err = ei.value
    assert isinstance(err, errors.LocalProtocolError)
    assert not isinstance(err, errors.RemoteProtocolError)
    assert err.remote is False
    assert err.error_id == "frame.payload_nbytes_local"
    assert dict(err.fields) == {"index": 2, "shape": shape, "dtype": dtype, "element_size": es,
                                "expected": expected, "got": nbytes}
    assert str(err) == (
        f"round_frame: tensor[2] shape {shape} dtype {dtype} ({es} bytes per element) needs "
        f"numel*element_size {expected} payload bytes (or 0, zero-elided), got {nbytes}")


def test_the_first_disagreeing_tensor_is_named() -> None:
    short = TensorPayload(0, [4], bytes(12))
    with pytest.raises(errors.SchemaMismatch) as ei:
        RoundFrame(RoundKind.CONTROL, 0.0, [GOOD, short, TensorPayload(1, [1], bytes(4)), short])
    assert ei.value.fields["index"] == 1
    assert ei.value.fields["got"] == 12
    assert str(ei.value).startswith("round_frame: tensor[1] shape [4] dtype 0 ")


@pytest.mark.parametrize("tensor", [
    TensorPayload(0, [3], bytes(12)),
    TensorPayload(1, [2, 3], bytes(12)),
    TensorPayload(0, [], bytes(4)),
    TensorPayload(0, [0], b""),
    TensorPayload.elide(0, [3]),                 # zero-elided
    TensorPayload.elide(1, [1 << 20, 1 << 12]),  # zero-elided, 8 GiB of zeros never made
    TensorPayload(7, [3], b"\x01\x02\x03"),      # unknown dtype: no element size to compare
    TensorPayload(255, [2], bytes(11)),
], ids=["f32", "bf16", "scalar", "no-elements", "elided", "elided-huge", "dtype-7", "dtype-255"])
def test_a_frame_takes_a_payload_whose_byte_count_agrees_or_is_elided(
        tensor: TensorPayload) -> None:
    frame = RoundFrame(RoundKind.MODEL, 1.0, [tensor])
    assert frame.tensors[0] is tensor  # nothing is copied or rebuilt
    pieces = encode_round_frame(frame, ZERO_SALT)
    if tensor.nbytes:
        assert pieces[1] is tensor.data  # the payload view itself goes on the wire


@pytest.mark.parametrize("version", [2, 3])
def test_an_elided_tensor_is_framed_at_both_versions_and_the_fold_decides(version: int) -> None:
    """Version 3: elided = all zeros. Version 2: not legal, rejected by the fold (not by the
    frame, which carries no version), with upstream's byte-count errors."""
    elided = RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload.elide(Dtype.F32, [4]), GOOD])
    full = RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.arange(4, dtype=np.float32)), GOOD])
    wire = encode_round_frame_bytes(elided, ZERO_SALT)
    assert wire == signed(struct.pack("<IIBd", 0xF10D17F1, 2, 0, 0.0)
                          + struct.pack("<BBIQ", 0, 1, 4, 0)
                          + struct.pack("<BBIQ", 0, 1, 2, 8) + struct.pack("<2f", 1.5, -2.0))
    got, used = decode_round_frame(wire, ZERO_SALT)
    assert used == len(wire) and got == elided and got.tensors[0].elided
    if version == 3:
        out = reduce_realized_work([got, full], version=3)
        assert out.weight == 1.0
        assert out.tensors[0].array().tolist() == [0.0, 1.0, 2.0, 3.0]
        assert out.tensors[1].array().tolist() == [3.0, -4.0]
        return
    with pytest.raises(errors.SchemaMismatch) as ei:
        reduce_realized_work([got, full], version=2)
    assert isinstance(ei.value, errors.RemoteProtocolError)
    assert ei.value.error_id == "reduce.nbytes_mismatch"
    assert str(ei.value) == "cluster_controller: frame 1 tensor[0] nbytes 16 != frame 0 nbytes 0"
    with pytest.raises(errors.SchemaMismatch) as ei:
        reduce_realized_work([got], version=2)
    assert ei.value.error_id == "reduce.seed_nbytes"
    assert str(ei.value) == (
        "cluster_controller: tensor[0] shape [4] numel*element_size 16 != nbytes 0")


# the golden vector round_frame/roundtrip/nbytes-shape-mismatch-accepted/salt-b: f32 [3]
# carrying 8 bytes, Model, weight 1.0, signed with salt b
SALT_B = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
MISMATCH_WIRE = (struct.pack("<IIBd", 0xF10D17F1, 1, 0, 1.0) + struct.pack("<BBIQ", 0, 1, 3, 8)
                 + struct.pack("<2f", 1.0, 2.0) + bytes.fromhex("a4f99de35140b590"))


def test_check_nbytes_false_frames_the_payload_as_given() -> None:
    """What upstream's writer writes and every reader accepts (the golden vectors pin it)."""
    t = TensorPayload(0, [3], struct.pack("<2f", 1.0, 2.0))
    frame = RoundFrame(RoundKind.MODEL, 1.0, [t], check_nbytes=False)
    assert encode_round_frame_bytes(frame, SALT_B) == MISMATCH_WIRE
    with pytest.raises(errors.SchemaMismatch):
        RoundFrame(RoundKind.MODEL, 1.0, [t])


def test_a_decoded_frame_is_written_as_it_came() -> None:
    """The reader accepts any byte count; writing the decoded frame gives the same bytes."""
    got, _ = decode_round_frame(MISMATCH_WIRE, SALT_B)
    assert got.tensors[0].nbytes == 8 and got.tensors[0].shape == (3,)
    assert encode_round_frame_bytes(got, SALT_B) == MISMATCH_WIRE
    with pytest.raises(errors.SchemaMismatch) as ei:  # re-framed by the caller: refused
        RoundFrame(got.kind, got.weight, got.tensors)
    assert isinstance(ei.value, errors.LocalProtocolError)


"""Codec properties: round trips of every record type, hostile input, zero copy."""

from __future__ import annotations

import math
import struct
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flodl_proto import errors
from flodl_proto.codec import (
    END_OF_STREAM,
    DeclareDead,
    Dtype,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_ack,
    decode_control,
    decode_framed_round,
    decode_framed_round_or_eos,
    decode_handshake,
    decode_len_framed,
    decode_len_framed_or_eos,
    decode_mux_record,
    decode_mux_record_or_eos,
    decode_round_frame,
    decode_round_frame_or_eos,
    encode_ack,
    encode_control,
    encode_frame_record,
    encode_framed_round,
    encode_handshake,
    encode_len_framed,
    encode_mux_record_bytes,
    encode_round_frame,
    encode_round_frame_bytes,
    round_frame_extent,
)
from flodl_proto.codec._common import NeedData
from flodl_proto.spec import DEFAULT_FRAME_CEILING, READ_CHUNK

salts = st.binary(min_size=16, max_size=16)
versions = st.sampled_from([2, 3])
u32 = st.integers(0, 2**32 - 1)


@st.composite
def tensors(draw: st.DrawFn) -> TensorPayload:
    dtype = draw(st.sampled_from([0, 1, 2, 255]))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    numel = math.prod(shape)
    es = {0: 4, 1: 2}.get(dtype, 3)
    mode = draw(st.sampled_from(["full", "elided", "odd"]))
    n = {"full": numel * es, "elided": 0, "odd": draw(st.integers(0, 17))}[mode]
    return TensorPayload(dtype, shape, draw(st.binary(min_size=n, max_size=n)))


@st.composite
def frames(draw: st.DrawFn) -> RoundFrame:
    weight = draw(st.one_of(st.floats(0, 1e300, allow_nan=False, allow_infinity=False),
                            st.just(-0.0)))
    return RoundFrame(draw(st.sampled_from(list(RoundKind))), weight,
                      draw(st.lists(tensors(), max_size=5)), check_nbytes=False)


control_msgs = st.one_of(
    st.builds(Hello, st.text(max_size=12), st.lists(u32, max_size=6)),
    st.just(HelloAck()),
    st.builds(RankExit, u32),
    st.builds(DeclareDead, u32),
)


@given(frames(), salts)
def test_round_frame_roundtrip(frame: RoundFrame, salt: bytes) -> None:
    wire = encode_round_frame_bytes(frame, salt)
    assert len(wire) == frame.wire_len
    res = decode_round_frame(wire + b"tail", salt)
    got, n = res
    assert n == len(wire)
    assert got == frame
    assert round_frame_extent(wire) == len(wire)


@given(frames(), salts, st.integers(0, 200))
def test_round_frame_any_cut_is_eof_or_truncated(frame: RoundFrame, salt: bytes, cut: int) -> None:
    wire = encode_round_frame_bytes(frame, salt)
    cut = min(cut, len(wire) - 1)
    if cut < 8:
        assert decode_round_frame_or_eos(wire[:cut], salt) is END_OF_STREAM
        with pytest.raises(errors.TruncatedInput) as ei:
            decode_round_frame(wire[:cut], salt)
        assert ei.value.error_id == "frame.header_read_failed"
        assert ei.value.fields == {"got": cut, "need": 8}
    else:
        with pytest.raises(errors.TruncatedInput):
            decode_round_frame_or_eos(wire[:cut], salt)
        assert isinstance(round_frame_extent(wire[:cut]), NeedData)


@given(control_msgs, versions, salts)
def test_control_record_roundtrip(msg: object, version: int, salt: bytes) -> None:
    rec = MuxRecord.control_msg(msg, version)  # type: ignore[arg-type]
    wire = encode_mux_record_bytes(rec, salt)
    res = decode_mux_record(wire, salt, version=version)
    got, n = res
    assert n == len(wire) and got == rec and got.control == msg


@given(st.sampled_from([RecordKind.DATA, RecordKind.HOST_FRAME, RecordKind.BROADCAST]), u32,
       st.binary(max_size=64), salts, versions)
def test_opaque_record_roundtrip(kind: RecordKind, rank: int, payload: bytes, salt: bytes,
                                 version: int) -> None:
    rec = (MuxRecord.data(rank, payload) if kind is RecordKind.DATA
           else MuxRecord(kind, 0, memoryview(payload)))
    wire = encode_mux_record_bytes(rec, salt)
    res = decode_mux_record(wire, salt, version=version)
    assert res[0] == rec and res[1] == len(wire)


@given(frames(), salts, st.sampled_from([RecordKind.HOST_FRAME, RecordKind.BROADCAST]))
def test_frame_record_wraps_frame_twice_signed(frame: RoundFrame, salt: bytes,
                                               kind: RecordKind) -> None:
    wire = b"".join(encode_frame_record(kind, frame, salt))
    res = decode_mux_record(wire, salt)
    assert res[0].kind is kind and res[0].frame(salt) == frame


@given(u32, u32, versions)
def test_handshake_roundtrip(rank: int, world: int, version: int) -> None:
    hs, n = decode_handshake(encode_handshake(rank, world, version), world, version)
    assert (hs.rank, hs.world_size, hs.version, n) == (rank, world, version, 16)
    assert decode_ack(encode_ack(version), version) == 8


@given(versions)
def test_handshake_other_version_rejected(version: int) -> None:
    other = 5 - version
    with pytest.raises(errors.VersionMismatch):
        decode_handshake(encode_handshake(0, 1, other), 1, version)
    with pytest.raises(errors.VersionMismatch):
        decode_ack(encode_ack(other), version)


@given(st.binary(max_size=300))
def test_len_framed_roundtrip(blob: bytes) -> None:
    wire = b"".join(encode_len_framed(blob))
    res = decode_len_framed(wire)
    assert bytes(res[0]) == blob and res[1] == len(wire)


@given(frames(), salts)
def test_framed_round_roundtrip(frame: RoundFrame, salt: bytes) -> None:
    wire = b"".join(encode_framed_round(frame, salt))
    res = decode_framed_round(wire, salt)
    assert res[0] == frame


def test_v3_hello_accepted_by_v2_reader_and_not_reverse() -> None:
    v3 = encode_control(Hello("h0", [0, 1], [bytes(range(32))]), 3)
    assert decode_control(v3, 2) == Hello("h0", [0, 1])
    v2 = encode_control(Hello("h0", [0, 1]), 2)
    with pytest.raises(errors.TruncatedInput):
        decode_control(v2, 3)
    with pytest.raises(errors.VersionMismatch) as ei:
        encode_control(Hello("h0", [0], [bytes(32)]), 2)
    assert isinstance(ei.value, errors.LocalProtocolError)


@pytest.mark.parametrize("marker,kind", [(b"\xfd", errors.InvalidValue),
                                         (b"\xfe", errors.InvalidValue),
                                         (b"\xff", errors.InvalidValue)])
def test_varint_marker_wider_than_u32_rejected(marker: bytes, kind: type) -> None:
    with pytest.raises(kind) as ei:
        decode_control(b"\x02" + marker + bytes(16), 2)
    assert "invalid integer type" in str(ei.value)
    assert decode_control(b"\x02\xfb\x03\x00", 2) == RankExit(3)  # non-minimal accepted


# -- arbitrary bytes: a record, END_OF_STREAM or a RemoteProtocolError, nothing else --------
def _oracle(fn: object, data: bytes) -> None:
    try:
        fn(data)  # type: ignore[operator]
    except errors.RemoteProtocolError:
        pass


@given(st.binary(max_size=400), versions)
def test_arbitrary_bytes_never_crash(data: bytes, version: int) -> None:
    salt = bytes(16)
    _oracle(lambda d: decode_round_frame_or_eos(d, salt), data)
    _oracle(lambda d: decode_mux_record_or_eos(d, salt, version=version), data)
    _oracle(lambda d: decode_len_framed_or_eos(d), data)
    _oracle(lambda d: decode_framed_round_or_eos(d, salt), data)
    _oracle(lambda d: decode_handshake(d, 4, version), data)
    _oracle(lambda d: decode_ack(d, version), data)
    _oracle(lambda d: decode_control(d, version), data)


@given(st.binary(max_size=64), st.sampled_from([2, 3]))
def test_prefixed_magic_bytes_never_crash(tail: bytes, version: int) -> None:
    salt = bytes(16)
    for head in (b"\xf1\x17\x0d\xf1", b"\xd0\x17\x0d\xf1\x01\x00\x00\x00"):
        _oracle(lambda d: decode_round_frame_or_eos(d, salt), head + tail)
        _oracle(lambda d: decode_mux_record_or_eos(d, salt, version=version), head + tail)


def _peak_alloc(fn: object) -> tuple[int, str]:
    """Peak traced allocation of ``fn()`` and its outcome: the error id of the
    RemoteProtocolError it raised, or ``"eos"`` for END_OF_STREAM (anything else fails)."""
    tracemalloc.start()
    try:
        res = fn()  # type: ignore[operator]
    except errors.RemoteProtocolError as e:
        outcome = str(e.error_id)
    else:
        assert res is END_OF_STREAM, res
        outcome = "eos"
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, outcome


@pytest.mark.parametrize(("data", "outcomes"), [
    (b"\xd0\x17\x0d\xf1\x01\x00\x00\x00\x01\x00\x00\x00\x00" + b"\xff\xff\xff\xff" + bytes(8),
     ("mux.payload_too_large", "frame.bad_magic", "len.too_large")),
    (b"\xd0\x17\x0d\xf1\x01\x00\x00\x00\x01\x00\x00\x00\x00" + b"\x00\x00\x00\x40" + bytes(8),
     ("mux.truncated", "frame.bad_magic", "len.too_large")),
    (b"\xf1\x17\x0d\xf1\x01\x00\x00\x00\x00" + bytes(8) + b"\x00\x01\x04\x00\x00\x00"
     + struct.pack("<Q", 2**40), ("mux.bad_magic", "frame.past_ceiling", "len.too_large")),
    (b"\xf1\x17\x0d\xf1\x01\x00\x01\x00", ("eos", "frame.too_many_tensors", "len.too_large")),
    (b"\x00\x00\x00\x40", ("eos", "eos", "len.body_read_failed")),
], ids=["mux-4GiB", "mux-1GiB", "frame-1TiB-nbytes", "frame-65537-tensors", "len-1GiB"])
def test_hostile_length_claims_allocate_nothing(data: bytes, outcomes: tuple[str, ...]) -> None:
    """Each decoder refuses the claim (or sees a clean end) with its own error, allocating
    nothing near the claimed size."""
    salt = bytes(16)
    got = []
    for fn in (lambda: decode_mux_record_or_eos(data, salt),
               lambda: decode_round_frame_or_eos(data, salt),
               lambda: decode_len_framed_or_eos(data)):
        peak, outcome = _peak_alloc(fn)
        assert peak < 1 << 20
        got.append(outcome)
    assert tuple(got) == outcomes
    assert READ_CHUNK <= DEFAULT_FRAME_CEILING


def test_decode_is_zero_copy() -> None:
    arr = np.arange(1 << 16, dtype=np.float32)
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(arr)])
    wire = bytearray(encode_round_frame_bytes(frame, bytes(16)))
    res = decode_round_frame(wire, bytes(16))
    view = res[0].tensors[0].array()
    assert np.shares_memory(view, np.frombuffer(wire, dtype=np.uint8))
    assert not view.flags.writeable
    np.testing.assert_array_equal(view, arr)


def test_encode_does_not_copy_payloads() -> None:
    arr = np.ones(1024, dtype=np.float32)
    t = TensorPayload.from_array(arr)
    pieces = encode_round_frame(RoundFrame(RoundKind.MODEL, 1.0, [t]), bytes(16))
    assert any(isinstance(p, memoryview) and p.obj is t.data.obj for p in pieces)


def test_tensor_payload_array_checks() -> None:
    bf = TensorPayload.from_array(np.array([1.5, -3.0], dtype=ml_dtypes.bfloat16))
    assert bf.dtype == Dtype.BF16 and bf.nbytes == 4
    assert bf.array().dtype == np.dtype(ml_dtypes.bfloat16)
    with pytest.raises(errors.InvalidValue):
        TensorPayload(7, [2], bytes(8)).array()
    with pytest.raises(errors.SchemaMismatch):
        TensorPayload(0, [3], bytes(8)).array()
    el = TensorPayload.elide(Dtype.F32, [2, 3])
    assert el.elided and el.numel == 6
    np.testing.assert_array_equal(el.array(materialize_elided=True), np.zeros((2, 3)))
    with pytest.raises(errors.LimitExceeded):
        TensorPayload.elide(Dtype.F32, [2**31, 4]).array(materialize_elided=True)


def test_frame_validation_is_local() -> None:
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(errors.InvalidValue) as ei:
            RoundFrame(RoundKind.MODEL, bad, [])
        assert isinstance(ei.value, errors.LocalProtocolError)
    with pytest.raises(errors.InvalidValue):
        TensorPayload(0, [1] * 256, b"")
    with pytest.raises(errors.InvalidValue):
        TensorPayload(0, [2**32], b"")
    with pytest.raises(errors.InvalidValue):
        encode_round_frame_bytes(RoundFrame(), b"short")


def test_wrong_salt_names_both_tags() -> None:
    wire = encode_round_frame_bytes(RoundFrame(RoundKind.CONTROL, 0.0, []), bytes(16))
    with pytest.raises(errors.AuthenticationError) as ei:
        decode_round_frame_or_eos(wire, b"\x01" * 16)
    assert "HMAC verification failed (computed 0x" in str(ei.value)
    assert ei.value.fields["carried"] == int.from_bytes(wire[-8:], "little")


def test_from_array_keeps_scalar_shape() -> None:
    t = TensorPayload.from_array(np.float32(2.5))
    assert t.shape == () and t.nbytes == 4 and float(t.array()) == 2.5
    assert TensorPayload.from_array(np.zeros((2, 0), np.float32)).shape == (2, 0)


@pytest.mark.parametrize("call,fragment", [
    (lambda: encode_round_frame_bytes(RoundFrame(), "00" * 16), "bytes.fromhex"),  # type: ignore[arg-type]
    (lambda: encode_handshake(-1, 2), "handshake: rank = -1"),
    (lambda: MuxRecord.data(-1, b""), "relay_mux: rank = -1"),
    (lambda: encode_frame_record(RecordKind.CONTROL, RoundFrame(), bytes(16)), "kind"),
    (lambda: RoundFrame(RoundKind.MODEL, "1", []), "weight = '1'"),  # type: ignore[arg-type]
    (lambda: TensorPayload.from_array(np.array([1j])), "complex128"),
    (lambda: encode_round_frame_bytes(RoundFrame(), b"short"), "16 bytes, got 5"),
], ids=["hex-salt", "negative-rank", "mux-rank", "frame-in-control", "str-weight", "complex",
        "short-salt"])
def test_api_misuse_is_a_local_error_naming_the_field(call: object, fragment: str) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        call()  # type: ignore[operator]
    assert fragment in str(ei.value)


@pytest.mark.parametrize("ceiling", [-1, 1.5, "1"])
def test_bad_ceiling_is_a_local_error(ceiling: object) -> None:
    from flodl_proto.codec import MuxStream
    for call in (lambda: decode_round_frame_or_eos(b"", bytes(16), ceiling=ceiling),  # type: ignore[arg-type]
                 lambda: decode_mux_record_or_eos(b"", bytes(16), ceiling=ceiling),  # type: ignore[arg-type]
                 lambda: decode_len_framed_or_eos(b"", ceiling=ceiling),  # type: ignore[arg-type]
                 lambda: MuxStream(bytes(16), ceiling=ceiling)):  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidValue) as ei:
            call()
        assert isinstance(ei.value, errors.LocalProtocolError) and "ceiling" in str(ei.value)


# -- whole-buffer decoders raise where the *_or_eos stream forms report END_OF_STREAM ------------
_FRAME = RoundFrame(RoundKind.MODEL, 2.0,
                    [TensorPayload.from_array(np.arange(3, dtype=np.float32))])


@pytest.mark.parametrize(
    ("whole", "or_eos", "wire", "header", "error_id"),
    [
        (lambda d: decode_round_frame(d, bytes(16)),
         lambda d: decode_round_frame_or_eos(d, bytes(16)),
         encode_round_frame_bytes(_FRAME, bytes(16)), 8, "frame.header_read_failed"),
        (lambda d: decode_mux_record(d, bytes(16), version=2),
         lambda d: decode_mux_record_or_eos(d, bytes(16), version=2),
         encode_mux_record_bytes(MuxRecord.control_msg(RankExit(3)), bytes(16)), 25,
         "mux.header_read_failed"),
        (lambda d: decode_len_framed(d), lambda d: decode_len_framed_or_eos(d),
         b"".join(encode_len_framed(b"abc")), 4, "len.prefix_read_failed"),
        (lambda d: decode_framed_round(d, bytes(16)),
         lambda d: decode_framed_round_or_eos(d, bytes(16)),
         b"".join(bytes(b) for b in encode_framed_round(_FRAME, bytes(16))), 4,
         "len.prefix_read_failed"),
    ],
    ids=["round_frame", "mux_record", "len_framed", "framed_round"],
)
def test_whole_buffer_decoders_raise_on_a_short_header(
        whole: object, or_eos: object, wire: bytes, header: int, error_id: str) -> None:
    assert callable(whole) and callable(or_eos)
    for cut in range(header):
        assert or_eos(wire[:cut]) is END_OF_STREAM
        with pytest.raises(errors.TruncatedInput) as ei:
            whole(wire[:cut])
        assert ei.value.remote
        assert (ei.value.error_id, ei.value.fields) == (error_id, {"got": cut, "need": header})
        assert f"({cut} of {header} bytes" in str(ei.value)
    # complete input: both forms give the same result
    assert whole(wire) == or_eos(wire)
    assert whole(wire)[1] == len(wire)


def test_parse_mux_header_whole_and_stream_forms() -> None:
    from flodl_proto.codec import parse_mux_header, parse_mux_header_or_eos
    wire = encode_mux_record_bytes(MuxRecord.control_msg(RankExit(3)), bytes(16))
    assert parse_mux_header(wire) == parse_mux_header_or_eos(wire)
    assert parse_mux_header(wire).payload_len == len(wire) - 25
    assert parse_mux_header_or_eos(wire[:24]) is END_OF_STREAM
    with pytest.raises(errors.TruncatedInput, match=r"\(24 of 25 bytes"):
        parse_mux_header(wire[:24])


def test_tags_equal_rejects_tags_of_the_wrong_length() -> None:
    from flodl_proto.codec.auth import tags_equal
    tag = bytes(range(8))
    assert tags_equal(tag, bytearray(tag)) and tags_equal(memoryview(tag), tag)
    assert not tags_equal(b"", b"")
    assert not tags_equal(tag + b"\0", tag + b"\0")
    assert not tags_equal(tag[:7], tag[:7])
    assert not tags_equal(tag, tag[:7]) and not tags_equal(tag[:7], tag)
    assert not tags_equal(tag, bytes(8))

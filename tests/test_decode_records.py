"""``decode_stream``'s records field by field: tensor summaries, frame and mux-record fields,
the loopback leg's own errors and leniencies, the ends of a stream cut inside a header.

Exact dicts, ids and messages, so that a renamed key, a dropped field or a moved boundary shows.
"""

from __future__ import annotations

import struct
import warnings
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import (
    Dtype,
    Hello,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_ack,
    encode_channel_magic,
    encode_control,
    encode_handshake,
    encode_mux_record_bytes,
    encode_mux_record_parts,
    encode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.decode import (
    EXIT_CAPTURE_ENDED,
    EXIT_ERROR,
    EXIT_OK,
    Leg,
    decode_stream,
    detect_leg,
)
from flodl_proto.decode import parse_round_frame as parse_frame_untagged
from flodl_proto.errors import ProtocolError, protocol_error
from flodl_proto.spec import MUX_RECORD_MAGIC, ROUND_FRAME_MAGIC

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
OTHER = bytes(16)


def _odd_frame() -> RoundFrame:
    """A frame of every tensor the summary treats apart (the reader accepts them all)."""
    return RoundFrame.trusted(RoundKind.MODEL, 0.5, (
        TensorPayload.trusted(99, (2,), memoryview(b"\x01\x02\x03")),
        TensorPayload.trusted(0, (3,), memoryview(bytes(8))),
        TensorPayload.from_array(np.array([np.inf, -np.inf], np.float32)),
        TensorPayload.from_array(np.array([0.25, -2.0, 0.0], np.float32)),
        TensorPayload(Dtype.F32, [0], b""),
        TensorPayload(Dtype.F32, [1], b""),
        TensorPayload(Dtype.F32, [1] * 65, bytes(4)),
    ))


def _tensors(version: int, values: bool) -> list[dict[str, Any]]:
    def f32(shape: list[int], nbytes: int, elided: bool = False) -> dict[str, Any]:
        return {"dtype": "f32", "dtype_byte": 0, "shape": shape, "nbytes": nbytes,
                "elided": elided}

    out = [
        {"dtype": "unknown(99)", "dtype_byte": 99, "shape": [2], "nbytes": 3, "elided": False,
         "note": "unknown dtype tag (accepted by the reader, rejected by the fold)"},
        {**f32([3], 8), "note": "nbytes does not match the shape (expected 12); accepted by the "
                                "reader, rejected by the fold"},
        {**f32([2], 8), "min": "-inf", "max": "inf", "mean": "NaN"},
        {**f32([3], 12), "min": -2.0, "max": 0.25, "mean": (0.25 - 2.0) / 3},
        f32([0], 0),
        f32([1], 0, elided=True),
        {**f32([1] * 65, 4), "note": "TensorPayload.array: tensor has 65 dimensions; NumPy "
                                     "arrays carry at most 64 (use the raw payload bytes)"},
    ]
    if version == 2:
        out[5]["note"] = "elided payload: not legal at protocol version 2 (the fold rejects it)"
    if values:
        out[0]["data"] = "010203"
        out[1]["data"] = "0000000000000000"
        out[2]["values"] = ["inf", "-inf"]
        out[3]["values"] = [0.25, -2.0, 0.0]
        out[6]["data"] = "00000000"
    return out


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("values", [False, True])
def test_a_frame_record_names_every_field_and_summarises_every_kind_of_tensor(
        version: int, values: bool) -> None:
    data = encode_round_frame_bytes(_odd_frame(), SALT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf - inf in the mean: no NumPy warning escapes
        rep = decode_stream(data, "frame", salt=SALT, version=version, values=values)
    assert rep.records == [{
        "offset": 0, "length": 414, "type": "round_frame", "frame": {
            "kind": "model", "kind_byte": 0, "weight": 0.5, "weight_bits": "0x3fe0000000000000",
            "num_tensors": 7, "wire_len": 414, "tag": data[-8:].hex(), "tag_status": "ok",
            "tensors": _tensors(version, values)}}]
    assert rep.size == 414 and rep.end == 414 and rep.count == 1
    assert rep.final_record() == {"type": "end", "offset": 414, "records": 1, "bad_tags": 0}


def test_non_finite_weights_and_values_are_json_strings() -> None:
    f = RoundFrame.trusted(RoundKind.CONTROL, 2.0, (
        TensorPayload.from_array(np.array([np.nan, 0.5], np.float32)),
        TensorPayload.from_array(np.array([-np.inf], np.float32)),))
    rep = decode_stream(encode_round_frame_bytes(f, SALT), "frame", values=True)
    fj = rep.records[0]["frame"]
    assert (fj["kind"], fj["kind_byte"], fj["weight"]) == ("control", 1, 2.0)
    assert fj["weight_bits"] == "0x4000000000000000"
    assert fj["tensors"][0]["values"] == ["NaN", 0.5]
    assert [fj["tensors"][1][k] for k in ("min", "max", "mean", "values")] == [
        "-inf", "-inf", "-inf", ["-inf"]]


@pytest.mark.parametrize("values", [False, True])
def test_a_signalling_nan_is_summarised_without_a_numpy_warning(values: bool) -> None:
    # widening an f32 signalling NaN to f64 warned "invalid value encountered in cast" on stderr
    snan = np.frombuffer(bytes.fromhex("0100807f"), np.float32)  # quiet bit clear
    f = RoundFrame.trusted(RoundKind.MODEL, 1.0, (TensorPayload.from_array(snan),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = decode_stream(encode_round_frame_bytes(f, SALT), "frame", values=values)
    tj = rep.records[0]["frame"]["tensors"][0]
    assert [tj[k] for k in ("min", "max", "mean")] == ["NaN"] * 3
    assert tj.get("values") == (["NaN"] if values else None)


def test_every_bad_tag_is_counted() -> None:
    frames = b"".join(encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, float(i), []), OTHER)
                      for i in range(3))
    rep = decode_stream(frames, "frame", salt=SALT)
    assert rep.bad_tags == 3 and [r["frame"]["tag_status"] for r in rep.records] == ["bad"] * 3
    assert [r["offset"] for r in rep.records] == [0, 25, 50]


# -------------------------------------------------------------------------------------------------
# mux leg
# -------------------------------------------------------------------------------------------------
def test_data_records_show_64_payload_bytes_unless_values_are_asked_for() -> None:
    short = MuxRecord.data(5, bytes(range(64)))
    long = MuxRecord.data(6, bytes(range(65)))
    data = encode_channel_magic("data") + encode_mux_record_bytes(short, SALT) + \
        encode_mux_record_bytes(long, SALT)
    rep = decode_stream(data, "mux", salt=SALT)
    a, b, c = rep.records
    assert a == {"offset": 0, "length": 4, "type": "channel_magic", "channel": "data",
                 "magic": f"0x{struct.unpack('<I', data[:4])[0]:08x}"}
    assert b == {"offset": 4, "length": 89, "type": "mux_record", "kind": "data",
                 "kind_byte": int(RecordKind.DATA), "rank": 5, "payload_len": 64,
                 "tag": data[4 + 17:4 + 25].hex(), "tag_status": "ok",
                 "payload": bytes(range(64)).hex()}
    assert c == {"offset": 93, "length": 90, "type": "mux_record", "kind": "data",
                 "kind_byte": int(RecordKind.DATA), "rank": 6, "payload_len": 65,
                 "tag": data[93 + 17:93 + 25].hex(), "tag_status": "ok",
                 "payload": bytes(range(64)).hex(), "payload_truncated": True}
    rep = decode_stream(data, "mux", salt=SALT, values=True)
    assert rep.records[2]["payload"] == bytes(range(65)).hex()
    assert "payload_truncated" not in rep.records[2]


def test_a_stream_of_the_channel_magic_alone_is_one_record() -> None:
    rep = decode_stream(encode_channel_magic("data"), "mux")
    assert [r["type"] for r in rep.records] == ["channel_magic"] and rep.exit_code == EXIT_OK


def test_a_hostframe_without_trailing_bytes_says_none() -> None:
    f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [1], bytes(4))])
    rec = b"".join(encode_mux_record_parts(RecordKind.HOST_FRAME, 0,
                                           encode_round_frame(f, SALT), SALT))
    rep = decode_stream(rec, "mux", salt=SALT)
    assert "trailing_bytes" not in rep.records[0]["frame"]
    assert "wire_rank" not in rep.records[0]


def test_a_control_record_with_trailing_bytes_is_no_hello_at_version_2() -> None:
    payload = encode_control(RankExit(2), 2) + b"\x00\x00"
    rec = b"".join(encode_mux_record_parts(RecordKind.CONTROL, 0, [payload], SALT))
    r = decode_stream(rec, "mux", salt=SALT).records[0]
    assert r["trailing_bytes"] == 2 and "note" not in r
    hello = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0]), 3), SALT)
    r = decode_stream(hello, "mux", salt=SALT, version=3).records[0]
    assert "trailing_bytes" not in r and "note" not in r


def test_a_bad_inner_frame_is_reported_at_its_record() -> None:
    first = encode_mux_record_bytes(MuxRecord.data(0, b"x"), SALT)
    inner = bytearray(encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, []), SALT))
    inner[0] ^= 0xFF
    second = b"".join(encode_mux_record_parts(RecordKind.HOST_FRAME, 0, [bytes(inner)], SALT))
    rep = decode_stream(first + second, "mux", salt=SALT)
    assert rep.failure is not None
    assert (rep.failure.offset, rep.failure.error_id) == (len(first), "frame.bad_magic")


def test_the_ceiling_reaches_the_mux_reader_and_the_failed_record_s_tag() -> None:
    rec = encode_mux_record_bytes(MuxRecord.data(0, bytes(100)), SALT)
    rep = decode_stream(rec, "mux", salt=OTHER, ceiling=50)
    assert rep.failure is not None and rep.failure.kind == "limit"
    assert rep.bad_tags == 0  # refused in its header: no tag step
    assert decode_stream(rec, "mux", salt=SALT, ceiling=100).exit_code == EXIT_OK


def test_a_mux_cut_of_exactly_four_bytes_is_checked_for_the_magic() -> None:
    rec = encode_mux_record_bytes(MuxRecord.data(0, b"x"), SALT)
    rep = decode_stream(rec + b"abcd", "mux")
    assert rep.failure is not None and rep.exit_code == EXIT_ERROR
    assert (rep.failure.offset, rep.failure.error_id) == (len(rec), "mux.bad_magic")
    rep = decode_stream(rec + struct.pack("<I", MUX_RECORD_MAGIC), "mux")
    assert rep.failure is not None and rep.failure.error_id == "mux.header_read_failed"
    assert rep.exit_code == EXIT_CAPTURE_ENDED


def test_a_frame_cut_inside_its_header_names_the_bytes_present() -> None:
    frame = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, []), SALT)
    rep = decode_stream(frame + struct.pack("<I", ROUND_FRAME_MAGIC) + b"\x00", "frame")
    assert rep.exit_code == EXIT_CAPTURE_ENDED
    assert rep.final_record() == {
        "type": "capture_ended", "offset": 25, "error_id": "frame.header_read_failed",
        "error": "capture ended inside a record at offset 25 (a reader would report: RoundFrame "
                 "header read failed: input ended inside the 8-byte header (5 of 8 bytes; a "
                 "stream reader takes this as a clean end of stream))"}


# -------------------------------------------------------------------------------------------------
# loopback leg
# -------------------------------------------------------------------------------------------------
def _framed(f: RoundFrame, extra: bytes = b"") -> bytes:
    body = encode_round_frame_bytes(f, SALT) + extra
    return struct.pack("<I", len(body)) + body


def _frame(weight: float = 1.0) -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, weight, [TensorPayload(Dtype.F32, [1], bytes(4))])


def test_length_framed_frames_without_a_handshake_decode_from_byte_0() -> None:
    data = _framed(_frame()) + _framed(_frame(2.0))
    rep = decode_stream(data, "loopback", salt=SALT)
    assert rep.exit_code == EXIT_OK
    assert [(r["offset"], r["length"], r["type"], r["body_len"]) for r in rep.records] == [
        (0, 47, "len_framed", 43), (47, 47, "len_framed", 43)]


def test_a_rank_s_blob_ending_inside_the_frame_header_is_fold_truncated() -> None:
    data = encode_handshake(3, 4, 2) + struct.pack("<I", 5) + b"\xf1\x17\x0d\xf1\x00"
    rep = decode_stream(data, "loopback")
    assert rep.failure is not None and rep.exit_code == EXIT_ERROR
    assert (rep.failure.offset, rep.failure.error_id) == (16, "fold.truncated")
    assert rep.failure.message == str(protocol_error("fold.truncated", rank=3))


def test_a_relay_s_blob_ending_inside_the_frame_header_is_body_ended() -> None:
    blob = struct.pack("<I", 5) + b"\xf1\x17\x0d\xf1\x00"
    for head in (encode_ack(2), b""):  # the relay's direction, and a stream of no known direction
        rep = decode_stream(head + blob, "loopback")
        assert rep.failure is not None
        assert (rep.failure.offset, rep.failure.error_id) == (len(head), "framed_round.body_ended")
        assert rep.failure.message == str(
            protocol_error("framed_round.body_ended", length=5, got=5))


def test_a_relay_s_blob_longer_than_its_frame_is_an_underrun() -> None:
    data = encode_ack(2) + _framed(_frame(), b"\xaa\xbb\xcc")
    rep = decode_stream(data, "loopback")
    assert rep.failure is not None
    assert (rep.failure.offset, rep.failure.error_id) == (8, "framed_round.underrun")
    assert rep.failure.message == str(protocol_error("framed_round.underrun", short=3, length=46))


def test_a_rank_s_blob_longer_than_its_frame_has_trailing_bytes() -> None:
    data = encode_handshake(0, 1, 2) + _framed(_frame(), b"\xaa\xbb\xcc")
    rep = decode_stream(data, "loopback", salt=SALT)
    assert rep.exit_code == EXIT_OK
    r = rep.records[1]
    assert (r["offset"], r["length"], r["body_len"]) == (16, 50, 46)
    assert r["frame"]["trailing_bytes"] == 3 and r["frame"]["wire_len"] == 43
    assert "trailing_bytes" not in decode_stream(
        encode_handshake(0, 1, 2) + _framed(_frame()), "loopback").records[1]["frame"]


def test_a_handshake_or_ack_cut_inside_its_magic_is_truncated() -> None:
    for head, error_id in ((encode_handshake(0, 1, 2), "handshake.read_failed"),
                           (encode_ack(2), "ack.read_failed")):
        for n in (1, 3):
            rep = decode_stream(head[:n], "loopback")
            assert rep.failure is not None and rep.failure.error_id == error_id
            assert rep.exit_code == EXIT_CAPTURE_ENDED


def test_a_handshake_whose_rank_is_not_below_the_world_size_says_so() -> None:
    note = "rank >= world_size (accepted by the reader; the relay checks its rank set)"
    for rank, ws, want in ((2, 2, note), (3, 2, note), (1, 2, None)):
        r = decode_stream(encode_handshake(rank, ws, 2), "loopback").records[0]
        assert r.get("note") == want
        assert r == {"offset": 0, "length": 16, "type": "handshake", "rank": rank,
                     "world_size": ws, "version": 2, **({"note": want} if want else {})}


def test_an_ack_alone_sets_the_version() -> None:
    rep = decode_stream(encode_ack(3), "loopback")
    assert rep.version == 3
    assert rep.records == [{"offset": 0, "length": 8, "type": "handshake_ack", "version": 3}]


def test_the_loopback_ceiling_reaches_the_length_prefix() -> None:
    data = _framed(_frame())
    rep = decode_stream(data, "loopback", ceiling=42)
    assert rep.failure is not None and rep.failure.kind == "limit"
    assert decode_stream(data, "loopback", ceiling=43).exit_code == EXIT_OK


def test_a_loopback_cut_inside_a_length_prefix_names_the_bytes_present() -> None:
    rep = decode_stream(_framed(_frame()) + b"\x01\x02\x03", "loopback")
    assert rep.final_record() == {
        "type": "capture_ended", "offset": 47, "error_id": "len.prefix_read_failed",
        "error": "capture ended inside a record at offset 47 (a reader would report: "
                 + str(protocol_error("len.prefix_read_failed", got=3, need=4)) + ")"}


# -------------------------------------------------------------------------------------------------
# leg detection, the untagged parser
# -------------------------------------------------------------------------------------------------
def test_leg_detection_of_short_inputs() -> None:
    assert detect_leg(b"\x01\x02\x03") == ("mux", "too short to tell")
    prefixed = struct.pack("<II", 30, ROUND_FRAME_MAGIC)
    assert detect_leg(prefixed) == ("loopback", "a length prefix and a RoundFrame")
    assert detect_leg(prefixed[:7]) == ("mux", "too short to tell")


def test_the_untagged_parser_holds_the_frame_to_the_ceiling() -> None:
    data = encode_round_frame_bytes(_frame(), SALT)
    assert parse_frame_untagged(data, ceiling=4).length == 43
    with pytest.raises(ProtocolError) as e:
        parse_frame_untagged(data, ceiling=3)
    assert e.value.kind == "limit"


def _claiming_1_5_gib() -> bytes:
    """A frame whose one tensor claims 1.5 GiB (more than the default 1 GiB ceiling), of which
    16 bytes follow."""
    f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [25], bytes(100))])
    b = bytearray(encode_round_frame_bytes(f, SALT))
    at = b.index(struct.pack("<IQ", 25, 100))  # the dim and the tensor's byte count
    struct.pack_into("<IQ", b, at, 3 << 27, 3 << 29)
    return bytes(b[:at + 12 + 16])


def test_a_ceiling_above_the_default_reaches_every_frame_parse() -> None:
    big = _claiming_1_5_gib()
    legs: dict[Leg, bytes] = {"frame": big,
                              "mux": b"".join(encode_mux_record_parts(
                                  RecordKind.HOST_FRAME, 0, [big], SALT)),
                              "loopback": struct.pack("<I", len(big)) + big}
    for leg, data in legs.items():
        rep = decode_stream(data, leg, ceiling=1 << 31)
        assert rep.failure is not None and rep.failure.error_id == "frame.data_read_failed", leg
        assert rep.failure.capture_ended is (leg == "frame")
        rep = decode_stream(data, leg)
        assert rep.failure is not None and rep.failure.error_id == "frame.past_ceiling", leg


def test_a_cut_frame_over_the_ceiling_is_an_error_not_a_capture_that_ended() -> None:
    f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [25], bytes(100))])
    rep = decode_stream(encode_round_frame_bytes(f, SALT)[:-1], "frame", ceiling=50)
    assert rep.failure is not None and rep.exit_code == EXIT_ERROR
    assert (rep.failure.error_id, rep.failure.capture_ended) == ("frame.past_ceiling", False)


def test_another_channel_s_magic_alone_is_refused() -> None:
    rep = decode_stream(encode_channel_magic("control"), "mux")
    assert rep.failure is not None and rep.failure.error_id == "channel.bad_magic"


def test_a_record_failing_after_its_tag_step_has_its_tag_checked() -> None:
    rec = b"".join(encode_mux_record_parts(RecordKind.CONTROL, 0, [b"\x63\x00\x00\x00"], SALT))
    for salt, bad in ((SALT, 0), (OTHER, 1)):
        rep = decode_stream(rec, "mux", salt=salt)
        assert rep.failure is not None and rep.failure.error_id == "bincode.invalid_variant"
        assert rep.bad_tags == bad


def test_loopback_streams_of_four_bytes_or_fewer() -> None:
    for data, error_id in ((encode_channel_magic("data"), "handshake.read_failed"),
                           (b"\x07\x00", "len.prefix_read_failed")):
        rep = decode_stream(data, "loopback")
        assert rep.failure is not None and rep.failure.offset == 0
        assert (rep.failure.error_id, rep.exit_code) == (error_id, EXIT_CAPTURE_ENDED)

"""``flodl-proto decode``: captured streams decode to the records that were sent.

Streams are built with the codec for both legs and both protocol versions; corrupted copies must
stop at the offset of the record that was damaged (exit 1), a wrong salt must give exit 3, and
hex, stdin and pcap input must give the same records. The tag-agnostic parser must agree with
the codec's verifying readers on every golden vector.
"""

from __future__ import annotations

import io
import json
import re
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto._hexdump import HexDump, HexDumpTooLarge, read_hex_dump
from flodl_proto.cli import main
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
    decode_mux_record_or_eos,
    decode_round_frame,
    encode_ack,
    encode_channel_magic,
    encode_frame_record,
    encode_framed_round,
    encode_handshake,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from flodl_proto.codec.handshake import http_stream
from flodl_proto.decode import (
    EXIT_BAD_TAG,
    EXIT_CAPTURE_ENDED,
    EXIT_ERROR,
    EXIT_OK,
    DecodeReport,
    Leg,
    UnknownLeg,
    decode_stream,
    detect_leg,
    format_table,
    parse_hex_dump,
    parse_round_frame,
    table_end,
    table_line,
    tag_status,
)
from flodl_proto.errors import (
    AuthenticationError,
    InvalidValue,
    LocalProtocolError,
    ProtocolError,
    shown,
)
from flodl_proto.interop.jsonio import control_to_json
from flodl_proto.pcap import CaptureTruncated, read_tcp_streams
from flodl_proto.spec import CHANNEL_MAGIC_DATA, MUX_RECORD_MAGIC, ROUND_FRAME_MAGIC

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "flodl_proto" / "_vectors"
SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
OTHER = bytes(16)
#: protocol.md's worked example 5.3: a Model RoundFrame, one f32 tensor, salt of zeros
FRAME_55 = bytes.fromhex("f1170df10100000000000000000000f03f00010400000010000000000000000000803f"
                         "000020c0000000000000504039a58785a03c12d1")


def _frames(version: int) -> list[RoundFrame]:
    out = [
        RoundFrame(RoundKind.MODEL, 3.0, [TensorPayload.from_array(
            np.array([3.0, 6.0, -1.5], np.float32))]),
        RoundFrame(RoundKind.CONTROL, 0.0, [TensorPayload.from_array(
            np.array([0.0, 2.0, 0.0, 0.0], np.float32))]),
        RoundFrame(RoundKind.MODEL, 0.5, [
            TensorPayload.from_array(np.arange(6, dtype=np.float32).reshape(2, 3)),
            TensorPayload.from_array(np.array([1.0, -0.5], dtype=ml_dtypes.bfloat16)),
        ]),
    ]
    if version == 3:
        out.append(RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(Dtype.F32, [8, 8], b"")]))
    return out


@dataclass
class Sent:
    """A stream and the records written into it, with their offsets."""

    data: bytes
    offsets: list[int]
    records: list[Any]


def _mux_up(version: int, salt: bytes = SALT) -> Sent:
    """relay -> controller: channel magic, Hello, one HostFrame per frame, RankExit."""
    parts: list[bytes] = [encode_channel_magic("data")]
    records: list[Any] = ["magic"]
    hello = Hello("host-a", [0, 1, 2])
    parts.append(encode_mux_record_bytes(MuxRecord.control_msg(hello, version), salt))
    records.append(hello)
    for f in _frames(version):
        parts.append(b"".join(encode_frame_record(RecordKind.HOST_FRAME, f, salt)))
        records.append(f)
    parts.append(encode_mux_record_bytes(MuxRecord.control_msg(RankExit(2), version), salt))
    records.append(RankExit(2))
    return _sent(parts, records)


def _mux_down(version: int, salt: bytes = SALT) -> Sent:
    """controller -> relay: HelloAck, one Broadcast per frame, DeclareDead."""
    parts = [encode_mux_record_bytes(MuxRecord.control_msg(HelloAck(), version), salt)]
    records: list[Any] = [HelloAck()]
    for f in _frames(version):
        parts.append(b"".join(encode_frame_record(RecordKind.BROADCAST, f, salt)))
        records.append(f)
    parts.append(encode_mux_record_bytes(MuxRecord.control_msg(DeclareDead(300), version), salt))
    records.append(DeclareDead(300))
    return _sent(parts, records)


def _loop_up(version: int, salt: bytes = SALT) -> Sent:
    """rank -> relay: handshake, then one length-framed frame per round."""
    parts = [encode_handshake(1, 4, version)]
    records: list[Any] = ["handshake"]
    for f in _frames(version):
        parts.append(b"".join(encode_framed_round(f, salt)))
        records.append(f)
    return _sent(parts, records)


def _loop_down(version: int, salt: bytes = SALT) -> Sent:
    """relay -> rank: ack, then one length-framed consensus per round."""
    parts = [encode_ack(version)]
    records: list[Any] = ["ack"]
    for f in _frames(version):
        parts.append(b"".join(encode_framed_round(f, salt)))
        records.append(f)
    return _sent(parts, records)


def _sent(parts: list[bytes], records: list[Any]) -> Sent:
    offsets, pos = [], 0
    for p in parts:
        offsets.append(pos)
        pos += len(p)
    return Sent(b"".join(parts), offsets, records)


BUILDERS: dict[str, tuple[str, Callable[..., Sent]]] = {
    "mux-up": ("mux", _mux_up),
    "mux-down": ("mux", _mux_down),
    "loopback-up": ("loopback", _loop_up),
    "loopback-down": ("loopback", _loop_down),
}
STREAMS = [(name, v) for name in BUILDERS for v in (2, 3)]


def _check_frame(got: dict[str, Any], want: RoundFrame, values: bool) -> None:
    assert got["kind"] == want.kind.name.lower()
    assert struct.pack("<d", got["weight"]) == struct.pack("<d", want.weight)
    assert len(got["tensors"]) == len(want.tensors)
    for gt, wt in zip(got["tensors"], want.tensors, strict=True):
        assert gt["shape"] == list(wt.shape) and gt["nbytes"] == wt.nbytes
        assert gt["dtype_byte"] == wt.dtype
        if wt.nbytes == 0 and wt.numel > 0:
            assert gt["elided"] is True
            continue
        arr = wt.array().astype(np.float64).reshape(-1)
        assert gt["min"] == arr.min() and gt["max"] == arr.max()
        assert gt["mean"] == pytest.approx(arr.mean())
        if values:
            assert gt["values"] == arr.tolist()
        else:
            assert "values" not in gt


def _check_records(got: list[dict[str, Any]], sent: Sent, version: int, values: bool) -> None:
    assert [r["offset"] for r in got] == sent.offsets
    for rec, want in zip(got, sent.records, strict=True):
        if want == "magic":
            assert rec["type"] == "channel_magic" and rec["channel"] == "data"
        elif want == "handshake":
            assert rec["type"] == "handshake" and (rec["rank"], rec["world_size"]) == (1, 4)
            assert rec["version"] == version
        elif want == "ack":
            assert rec["type"] == "handshake_ack" and rec["version"] == version
        elif isinstance(want, RoundFrame):
            _check_frame(rec["frame"], want, values)
        else:
            assert rec["type"] == "mux_record" and rec["kind"] == "control"
            assert rec["control"] == control_to_json(want, version)


@pytest.mark.parametrize(("name", "version"), STREAMS)
@pytest.mark.parametrize("values", [False, True])
def test_streams_decode_to_the_records_sent(name: str, version: int, values: bool) -> None:
    leg, build = BUILDERS[name]
    sent = build(version)
    rep = decode_stream(sent.data, leg, salt=SALT, version=version, values=values)
    assert rep.failure is None and rep.exit_code == EXIT_OK
    assert rep.end == len(sent.data) and rep.bad_tags == 0
    _check_records(rep.records, sent, version, values)
    tags = [r.get("tag_status") for r in rep.records] + [
        r["frame"]["tag_status"] for r in rep.records if "frame" in r]
    assert "bad" not in tags and "ok" in tags
    assert rep.final_record() == {"type": "end", "offset": len(sent.data),
                                  "records": len(sent.offsets), "bad_tags": 0}


@pytest.mark.parametrize(("name", "version"), STREAMS)
def test_without_salt_tags_are_unchecked(name: str, version: int) -> None:
    leg, build = BUILDERS[name]
    sent = build(version, OTHER)
    rep = decode_stream(sent.data, leg, version=version)
    assert rep.exit_code == EXIT_OK
    statuses = {r.get("tag_status") for r in rep.records} | {
        r["frame"]["tag_status"] for r in rep.records if "frame" in r}
    assert statuses <= {None, "unchecked"}
    _check_records(rep.records, sent, version, False)


@pytest.mark.parametrize(("name", "version"), STREAMS)
def test_wrong_salt_reports_bad_tags_and_exit_3(name: str, version: int) -> None:
    leg, build = BUILDERS[name]
    sent = build(version)
    rep = decode_stream(sent.data, leg, salt=OTHER, version=version)
    assert rep.failure is None, "a bad tag must not stop decoding"
    assert len(rep.records) == len(sent.offsets)
    assert rep.bad_tags > 0 and rep.exit_code == EXIT_BAD_TAG


@pytest.mark.parametrize(("name", "version"), STREAMS)
def test_corrupted_copies_stop_at_the_damaged_record(name: str, version: int) -> None:
    leg, build = BUILDERS[name]
    sent = build(version)
    ends = [*sent.offsets[1:], len(sent.data)]
    for i, (start, end) in enumerate(zip(sent.offsets, ends, strict=True)):
        # a wrong magic in record i (after the length prefix of a loopback blob: a damaged
        # prefix only moves the frame boundary, which the relay's reader tolerates)
        magic_at = start + 4 if leg == "loopback" and i > 0 else start
        bad = bytearray(sent.data)
        bad[magic_at] ^= 0x55
        rep = decode_stream(bytes(bad), leg, salt=SALT, version=version)
        assert rep.failure is not None, f"record {i}: corruption not detected"
        assert rep.failure.offset == start and rep.exit_code == EXIT_ERROR
        assert len(rep.records) == i
        assert rep.final_record()["type"] == "error"
        # record i cut short past its clean-end-of-stream prefix
        cut = sent.data[:end - 1]
        rep = decode_stream(cut, leg, salt=SALT, version=version)
        assert rep.failure is not None and rep.failure.offset == start
        assert rep.failure.kind == "truncated"
        assert len(rep.records) == i


@pytest.mark.parametrize("version", [2, 3])
def test_a_cut_inside_a_header_is_a_capture_that_ended(version: int) -> None:
    """One rule for every leg: only a record boundary is a clean end; a cut inside the next
    record's header is ``capture_ended`` (exit 4), as a cut inside its body is."""
    sent = _mux_down(version)
    data = sent.data + sent.data[:10]  # ten bytes of a next header
    rep = decode_stream(data, "mux", salt=SALT, version=version)
    assert rep.exit_code == EXIT_CAPTURE_ENDED and len(rep.records) == len(sent.offsets)
    n = len(sent.data)
    assert rep.final_record() == {
        "type": "capture_ended", "offset": n, "error_id": "mux.header_read_failed",
        "error": f"capture ended inside a record at offset {n} (a reader would report: "
                 "relay_mux: record header read failed: input ended inside the 25-byte header "
                 "(10 of 25 bytes; a stream reader takes this as a clean end of stream))"}
    loop = _loop_down(version)
    rep = decode_stream(loop.data + b"\x07\x00", "loopback", salt=SALT)
    n = len(loop.data)
    assert rep.exit_code == EXIT_CAPTURE_ENDED
    assert (rep.final_record()["offset"], rep.final_record()["error_id"]) == (
        n, "len.prefix_read_failed")
    frames = b"".join(encode_round_frame_bytes(f, SALT) for f in _frames(version))
    for cut in (3, 4, 7):  # inside the next frame's 8-byte header, its magic whole or not
        rep = decode_stream(frames + frames[:cut], "frame", salt=SALT)
        assert rep.exit_code == EXIT_CAPTURE_ENDED
        assert (rep.final_record()["offset"], rep.final_record()["error_id"]) == (
            len(frames), "frame.header_read_failed")
    assert decode_stream(frames, "frame", salt=SALT).final_record()["type"] == "end"


@pytest.mark.parametrize("n", [0, 5, 7])
def test_a_hostframe_payload_inside_the_frame_header_is_named_so(n: int) -> None:
    """A whole HostFrame record whose payload ends inside the 8-byte frame header read "frame
    kind read failed ... (offset 5)", though the kind byte is at offset 8."""
    rec = encode_mux_record_bytes(MuxRecord.host_frame(b"\xf1\x17\x0d\xf1\x02\x00\x00"[:n]),
                                  SALT)
    rep = decode_stream(rec, "mux", salt=SALT)
    assert rep.exit_code == EXIT_ERROR
    fin = rep.final_record()
    assert (fin["type"], fin["offset"], fin["error_id"]) == ("error", 0, "frame.header_read_failed")
    assert fin["error"].startswith(f"RoundFrame header read failed: input ended inside the "
                                   f"8-byte header ({n} of 8 bytes;")


@pytest.mark.parametrize(("leg", "error_id"), [("mux", "mux.bad_magic"),
                                               ("frame", "frame.bad_magic")])
def test_a_cut_header_with_a_wrong_magic_is_a_protocol_error(leg: Leg, error_id: str) -> None:
    """The bytes of a cut header are checked as far as they go: 4 of them not being the record's
    magic is no capture that ended (exit 1)."""
    rep = decode_stream(b"garbage", leg)
    assert rep.exit_code == EXIT_ERROR
    fin = rep.final_record()
    assert (fin["type"], fin["offset"], fin["error_id"]) == ("error", 0, error_id)
    assert fin["error"].endswith("magic 0x62726167 != 0x" + (
        f"{MUX_RECORD_MAGIC:08x}" if leg == "mux" else f"{ROUND_FRAME_MAGIC:08x}"))


def test_inner_frame_tag_is_checked_separately() -> None:
    sent = _mux_up(3)
    bad = bytearray(sent.data)
    # the last byte of the first HostFrame is its inner frame's tag; re-sign the record
    start, end = sent.offsets[2], sent.offsets[3]
    bad[end - 1] ^= 0x01
    with pytest.raises(AuthenticationError):  # the record tag covers the inner tag too
        decode_mux_record_or_eos(bytes(bad[start:end]), SALT, version=3)
    rep = decode_stream(bytes(bad), "mux", salt=SALT, version=3)
    assert rep.failure is None and rep.exit_code == EXIT_BAD_TAG
    hf = rep.records[2]
    assert hf["tag_status"] == "bad" and hf["frame"]["tag_status"] == "bad"


def test_version_mismatch_and_auto_version() -> None:
    v3 = _loop_up(3)
    assert decode_stream(v3.data, "loopback", salt=SALT).version == 3
    rep = decode_stream(v3.data, "loopback", salt=SALT, version=2)
    assert rep.failure is not None and rep.failure.kind == "version" and rep.failure.offset == 0
    v2_hello = _mux_up(2)
    rep = decode_stream(v2_hello.data, "mux", salt=SALT, version=3)
    assert rep.failure is not None and rep.failure.offset == v2_hello.offsets[1]
    assert rep.failure.message.startswith("relay_mux: bincode decode failed: ")


def test_leniencies_are_reported() -> None:
    f = _frames(2)[0]
    from flodl_proto.codec import encode_mux_record_parts, encode_round_frame

    payload = [*encode_round_frame(f, SALT), b"\xaa\xbb"]
    rec = b"".join(encode_mux_record_parts(RecordKind.HOST_FRAME, 9, payload, SALT))
    rep = decode_stream(rec, "mux", salt=SALT)
    assert rep.exit_code == EXIT_OK
    r = rep.records[0]
    assert r["rank"] == 0 and r["wire_rank"] == 9 and r["frame"]["trailing_bytes"] == 2
    elided = RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(Dtype.F32, [4], b"")])
    data = encode_handshake(0, 1, 2) + b"".join(encode_framed_round(elided, SALT))
    rep = decode_stream(data, "loopback", salt=SALT)
    t = rep.records[1]["frame"]["tensors"][0]
    assert t["elided"] and "version 2" in t["note"]


def test_a_version_3_hello_read_as_version_2_says_so() -> None:
    # a v3 Hello read as v2 (given so) was decoded without a word: the Hello's model_sigs count
    # is a byte the v2 reader ignores, as upstream's does
    hello = Hello("host-a", [0, 1, 2])
    data = encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(hello, 3), SALT) + encode_mux_record_bytes(
        MuxRecord.control_msg(RankExit(2), 3), SALT)
    rep = decode_stream(data, "mux", salt=SALT, version=2)
    assert rep.exit_code == EXIT_OK and rep.version == 2
    rec = rep.records[1]
    assert rec["control"] == {"variant": "Hello", "variant_index": 0, "host": "host-a",
                              "ranks": [0, 1, 2]}
    assert rec["trailing_bytes"] == 1
    assert rec["note"] == ("ignored by a version 2 reader; a version 3 Hello? "
                           "--protocol-version 3")
    assert "trailing_bytes" not in rep.records[2]
    line = [ln for ln in format_table(rep) if "control Hello" in ln]
    assert len(line) == 1 and line[0].endswith(
        "host=host-a ranks=[0, 1, 2]; +1 trailing bytes (ignored by a version 2 reader; a "
        "version 3 Hello? --protocol-version 3)")
    rep = decode_stream(data, "mux", salt=SALT, version=3)
    assert "trailing_bytes" not in rep.records[1] and "note" not in rep.records[1]
    assert rep.records[1]["control"]["model_sigs"] == []


@pytest.mark.parametrize("version", [2, 3])
def test_a_mux_stream_s_version_is_detected_from_its_hello(version: int) -> None:
    """Without a version, a mux stream (no handshake carries one) was read at 2: a version 3
    Hello as a version 2 one with a trailing byte. The version is now detected as the
    dissector detects it, from the Hello (the highest version that decodes it whole), and the
    records after it are read at that version; a given version is used as given."""
    sigs = [bytes(range(32))] if version == 3 else []
    up = _mux_up(version)
    rep = decode_stream(up.data, "mux", salt=SALT)
    assert rep.exit_code == EXIT_OK and rep.version == version
    _check_records(rep.records, up, version, False)
    assert all("trailing_bytes" not in r and "note" not in r for r in rep.records)
    data = encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(Hello("h", [0], sigs), version), SALT)
    rep = decode_stream(data, "mux", salt=SALT)
    assert rep.version == version
    assert rep.records[1]["control"] == control_to_json(Hello("h", [0], sigs), version)
    before = encode_mux_record_bytes(MuxRecord.control_msg(RankExit(0), version), SALT)
    rep = decode_stream(before, "mux", salt=SALT)  # a RankExit reads alike at 2 and 3
    assert rep.version == 2
    # the first Hello tells the version: a later Hello of the other version is read at it
    other = encode_mux_record_bytes(MuxRecord.control_msg(Hello("g", [1]), 5 - version), SALT)
    rep = decode_stream(data + other, "mux", salt=SALT)
    assert rep.version == version
    if version == 3:  # a version 2 Hello lacks the model_sigs a version 3 reader wants
        assert rep.failure is not None and rep.failure.offset == len(data)
        assert rep.failure.message.startswith("relay_mux: bincode decode failed: ")
    else:
        assert rep.failure is None and rep.records[2]["trailing_bytes"] == 1


def test_cli_pcap_detects_the_version_of_a_mux_stream(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``decode --pcap`` without --protocol-version read a version 3 Hello as version 2 with one
    trailing byte; the relay -> controller stream's Hello now tells its version."""
    up, down = _mux_up(3), _mux_down(3)
    cap = tmp_path / "cap.pcap"
    cap.write_bytes(_capture(up.data, down.data, 1337))
    assert main(["decode", "--pcap", str(cap), "--port", "1337", "--salt", SALT.hex()]) == EXIT_OK
    lines = _json_lines(capsys.readouterr().out)
    first = [r for r in lines if r["stream"] == "10.0.0.2:40001 -> 10.0.0.1:1337"]
    _check_records(first[:-1], up, 3, False)
    assert all("trailing_bytes" not in r for r in first)


def test_bad_channel_magic_and_handshake() -> None:
    ctl = encode_channel_magic("control") + _mux_down(2).data
    rep = decode_stream(ctl, "mux")
    assert rep.failure is not None and rep.failure.error_id == "channel.bad_magic"
    rep = decode_stream(encode_channel_magic("data")[:2], "mux")
    assert rep.failure is not None and rep.failure.error_id == "channel.read_failed"
    rep = decode_stream(encode_handshake(0, 2, 2)[:9], "loopback")
    assert rep.failure is not None and rep.failure.error_id == "handshake.read_failed"
    rep = decode_stream(b"", "mux")
    assert rep.exit_code == EXIT_OK and rep.records == []


# -------------------------------------------------------------------------------------------------
# CLI: files, hex, stdin, table, exit codes
# -------------------------------------------------------------------------------------------------
def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_cli_file_hex_and_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _mux_up(2)
    raw = tmp_path / "mux.bin"
    raw.write_bytes(sent.data)
    assert main(["decode", "--leg", "mux", "--salt", SALT.hex(), str(raw)]) == EXIT_OK
    from_file = _json_lines(capsys.readouterr().out)
    assert from_file[-1]["type"] == "end"
    _check_records(from_file[:-1], sent, 2, False)

    h = sent.data.hex()
    hex_text = "\n".join(" ".join(h[i:i + 2] for i in range(j, min(j + 64, len(h)), 2))
                         for j in range(0, len(h), 64)) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(hex_text.encode())))
    assert main(["decode", "--leg", "mux", "--hex", "--salt", SALT.hex(), "-"]) == EXIT_OK
    assert _json_lines(capsys.readouterr().out) == from_file

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(sent.data)))
    assert main(["decode", "--salt", OTHER.hex()]) == EXIT_BAD_TAG
    out = _json_lines(capsys.readouterr().out)
    assert out[-1]["bad_tags"] > 0

    bad = bytearray(sent.data)
    bad[sent.offsets[3] + 1] ^= 0xFF
    raw.write_bytes(bytes(bad))
    assert main(["decode", "--salt", SALT.hex(), str(raw)]) == EXIT_ERROR
    last = _json_lines(capsys.readouterr().out)[-1]
    assert last["type"] == "error" and last["offset"] == sent.offsets[3]
    assert last["error"].startswith("relay_mux: record magic")


def _bad_type(fn: Any, arg: Any) -> str:
    """The message of the local ``capture.bad_type`` error ``fn(arg)`` raises."""
    with pytest.raises(InvalidValue) as ei:
        fn(arg)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "capture.bad_type"
    return str(ei.value)


@pytest.mark.parametrize(("report", "got"), [("x", "str"), (None, "None"),
                                             ([{"type": "end"}], "list")])
def test_format_table_of_no_report_is_a_local_error_naming_it(report: Any, got: str) -> None:
    # "x" met an AttributeError ('str' object has no attribute 'records') at the first line
    for fn in (format_table, table_end):
        assert _bad_type(fn, report) == ("report must be a DecodeReport (what decode_stream "
                                         f"returns), got {got}")


@pytest.mark.parametrize(("records", "got"), [("ab", "str"), (None, "None"), ((), "tuple")])
def test_format_table_of_a_report_whose_records_are_no_list_names_them(records: Any,
                                                                       got: str) -> None:
    """A DecodeReport whose records is no list is named by that part; it read 'report must be
    a DecodeReport ..., got DecodeReport'."""
    report = DecodeReport(records=records)
    assert _bad_type(format_table, report) == (
        f"report.records must be a list of records (decode_stream's), got {got}")


@pytest.mark.parametrize(("rec", "message"), [
    ({}, "got dict without 'type'"),
    ({"type": "handshake", "offset": 0, "length": 12, "rank": 0, "world_size": 2},
     "got dict without 'version'"),
    ("x", "got str"),
    (None, "got None"),
    (5, "got int"),
])
def test_table_line_of_no_record_is_a_local_error_naming_it(rec: Any, message: str) -> None:
    # {} met a KeyError: 'type'; "x" a TypeError
    assert _bad_type(table_line, rec) == ("rec must be a record decode_stream made (a dict "
                                          f"with its type, offset, length and fields), {message}")
    # a record decode_stream made is a line
    first = decode_stream(_loop_down(3).data, "loopback", salt=SALT).records[0]
    assert table_line(first).split()[:3] == ["0", "8", "handshake_ack"]


def _frame_rec(**frame: Any) -> dict[str, Any]:
    """A round_frame record whose frame holds ``frame`` over a well-formed one."""
    whole = {"tag_status": "ok", "kind": "Model", "weight": 1.0, "num_tensors": 1,
             "tensors": [{"dtype": "f32", "shape": [1], "nbytes": 4, "values": [1.0]}]}
    return {"type": "round_frame", "offset": 0, "length": 41, "frame": {**whole, **frame}}


@pytest.mark.parametrize(("rec", "message"), [
    ({"type": "round_frame", "offset": 0, "length": 41, "frame": 5},
     "rec['frame'] must be a mapping of the frame's fields, got int (5)"),
    ({"type": "mux_record", "offset": 0, "length": 26, "kind": "Control", "tag_status": "ok",
      "control": None},
     "rec['control'] must be a mapping of the control message's fields, got None"),
    ({"type": "mux_record", "offset": 0, "length": 26, "kind": None, "tag_status": "ok"},
     "rec['kind'] must be a record kind's name (a str), got None"),
    ({"type": "mux_record", "offset": 0, "length": 26, "kind": "Data", "tag_status": ["ok"]},
     "rec['tag_status'] must be a tag status (a str: 'ok', 'bad' or 'unchecked'), got list "
     "(['ok'])"),
    (_frame_rec(tensors=7),
     "rec['frame']['tensors'] must be a list of the frame's tensors (mappings), got int (7)"),
    (_frame_rec(tensors=["t"]),
     "rec['frame']['tensors'][0] must be a mapping of the tensor's fields, got str ('t')"),
    (_frame_rec(tensors=[{"dtype": "f32", "shape": [1], "nbytes": 4, "values": 3}]),
     "rec['frame']['tensors'][0]['values'] must be a list of the tensor's values, got int "
     "(3)"),
    (_frame_rec(tag_status={}), "rec['frame']['tag_status'] must be a tag status (a str: 'ok', "
                                "'bad' or 'unchecked'), got dict ({})"),
    ({**_frame_rec(), "offset": None}, "rec['offset'] must be a byte offset (an int), got "
                                       "None"),
    ({**_frame_rec(), "length": [41]}, "rec['length'] must be a byte count (an int), got list "
                                       "([41])"),
])
def test_table_line_of_a_record_part_of_another_type_names_the_part(rec: Any, message: str
                                                                     ) -> None:
    """A record whose part has another type than decode_stream's (a frame that is no mapping,
    an offset that is no int) raised a bare TypeError from the formatting."""
    assert _bad_type(table_line, rec) == message
    assert table_line(_frame_rec()).split()[:4] == ["0", "41", "round_frame", "ok"]


class _Ended:
    """A report of no records whose closing record is ``fin``."""

    def __init__(self, fin: Any) -> None:
        self.records: list[dict[str, Any]] = []
        self.fin = fin

    def final_record(self) -> Any:
        return self.fin


_FIN = "report.final_record()"


@pytest.mark.parametrize(("fin", "message"), [
    ("x", f"{_FIN} must be a closing record (a dict with its type, offset and fields), got "
          "str"),
    (None, f"{_FIN} must be a closing record (a dict with its type, offset and fields), got "
           "None"),
    ({"type": "end"}, f"{_FIN} must be a closing record (a dict with its type, offset and "
                      "fields), got dict without 'offset'"),
    ({"type": "error", "offset": 3}, f"{_FIN} must be a closing record (a dict with its type, "
                                     "offset and fields), got dict without 'error'"),
    ({"type": "end", "offset": None},
     f"{_FIN}['offset'] must be a byte offset (an int), got None"),
    ({"type": "error", "offset": [1], "error": "e"},
     f"{_FIN}['offset'] must be a byte offset (an int), got list ([1])"),
    ({"type": 5, "offset": 0}, f"{_FIN}['type'] must be a record type's name (a str), got "
                               "int (5)"),
    ({"type": "capture_ended", "offset": 0, "error": None},
     f"{_FIN}['error'] must be an error message (a str), got None"),
    ({"type": "end", "offset": 0, "bad_tags": [1]},
     f"{_FIN}['bad_tags'] must be a count of bad tags (an int), got list ([1])"),
])
def test_table_end_of_a_closing_record_of_another_type_names_it(fin: Any, message: str
                                                                ) -> None:
    """A closing record that is no mapping, or whose part has another type than
    decode_stream's, raised a bare TypeError (or KeyError) from the formatting."""
    assert _bad_type(table_end, _Ended(fin)) == message
    assert table_end(_Ended({"type": "end", "offset": 7, "bad_tags": 2})).split() == [
        "7", "END", "clean", "end", "of", "stream;", "2", "bad", "tags"]
    assert table_end(_Ended({"type": "error", "offset": 7, "error": "e"})).split() == [
        "7", "ERROR", "e"]


@pytest.mark.parametrize(("failure", "got"), [("x", "str"), (3, "int")])
def test_table_end_of_a_report_whose_failure_is_no_decode_failure_names_it(failure: Any,
                                                                           got: str) -> None:
    """A DecodeReport whose failure is neither None nor a DecodeFailure raised a bare
    AttributeError from final_record()."""
    assert _bad_type(table_end, DecodeReport(failure=failure)) == (
        f"report.failure must be None or a DecodeFailure (decode_stream's), got {got}")


def test_cli_table_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sent = _loop_down(3)
    raw = tmp_path / "loop.hex"
    raw.write_text(sent.data.hex(), encoding="ascii")
    assert main(["decode", "--leg", "loopback", "--hex", "--format", "table", "--values",
                 "--salt", SALT.hex(), str(raw)]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["offset", "length", "record", "tag"]
    assert "handshake_ack" in out[1] and "version=3" in out[1]
    assert "values=[3.0, 6.0, -1.5]" in out[2] and " ok " in out[2]
    assert out[-1].split()[1] == "END"
    rep = decode_stream(sent.data, "loopback", salt=SALT, values=True)
    assert list(format_table(rep)) == out


def test_the_table_writes_numbers_that_read_back_exactly() -> None:
    """The table wrote a weight and an element to 6 significant digits (weight=0.333333, the bf16
    0.1 as 0.100098, the f32 1/3 as 0.333333, which reads back as another f32) and -0.0 as -0;
    it now writes the fewest digits that read back as the same f64 (the weight, the mean) or
    the same element of the tensor's dtype (its values, min and max), -0.0 as -0.0, as the
    dissector writes them."""
    f32 = np.array([0.1, -0.0, 1 / 3, 3.4028235e38, 1e-45, -2.5], np.float32)
    bf16 = np.array([0.1, 1 / 3, -0.0, 256.0], ml_dtypes.bfloat16)
    frame = RoundFrame(RoundKind.MODEL, 1 / 3, [TensorPayload.from_array(f32),
                                                TensorPayload.from_array(bf16)])
    rep = decode_stream(encode_round_frame_bytes(frame, SALT), "frame", values=True)
    row = list(format_table(rep))[1]
    assert row.split(None, 4)[4] == (
        "model weight=0.3333333333333333 tensors=2; f32[6] 24B min=-2.5 max=3.4028235e+38 "
        "mean=5.671372443975481e+37 values=[0.1, -0.0, 0.33333334, 3.4028235e+38, 1e-45, -2.5]; "
        "bf16[4] 8B min=-0.0 max=256.0 mean=64.1085205078125 values=[0.1, 0.334, -0.0, 256.0]")
    shown = re.findall(r"values=\[([^]]*)\]", row)
    back = np.array(shown[0].split(", "), np.float32)  # the same bits, -0.0's sign included
    assert back.tobytes() == f32.tobytes()
    assert np.array([float(v) for v in shown[1].split(", ")]).astype(ml_dtypes.bfloat16
                                                                     ).tobytes() == bf16.tobytes()
    assert float(row.split("weight=")[1].split()[0]) == 1 / 3


def test_the_table_writes_each_value_as_the_dissector_does() -> None:
    """Every bf16 bit pattern, f32 powers of two with their neighbours and random f32 and f64
    values: the table's digits are the dissector's reference (the fewest that read back)."""
    from flodl_proto._decode_table import _num

    from .test_dissector_values import element_text, shortest

    bits = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # the signalling NaNs
        bf16 = (bits << 16).astype("<u4").view("<f4").astype(np.float64)
    wrong = [(hex(b), _num(float(v), "bf16")) for b, v in zip(bits, bf16, strict=True)
             if _num(float(v), "bf16") != element_text(float(v), "bf16")]
    assert not wrong, wrong[:10]
    rng = np.random.default_rng(5)
    p2 = np.array([2.0 ** e for e in range(-149, 128)], np.float32)
    f32 = np.concatenate([p2, np.nextafter(p2, np.float32(np.inf)), np.nextafter(p2, np.float32(0)),
                          rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32)
                          .view(np.float32)])
    with np.errstate(invalid="ignore"):
        f32_wide = f32.astype(np.float64)
    wrong = [(float(v), _num(float(v), "f32")) for v in f32_wide
             if _num(float(v), "f32") != element_text(float(v), "f32")]
    assert not wrong, wrong[:10]
    f64 = rng.integers(0, 2 ** 63, 3000, dtype=np.uint64).view(np.float64)
    wrong = [(float(v), _num(float(v))) for v in f64 if _num(float(v)) != shortest(float(v))]
    assert not wrong, wrong[:10]


# the f32 values (bits) whose shortest decimal lies exactly on the midpoint to the neighbour
# below, and reads back as them only by the tie rule (ties to the even bits, as a parser rounds):
# 0x5a5f8476 is 15728640536870912, 0x5a5f8475 below it 15728639463129088, the decimal
# 1.572864e+16 their midpoint (test_the_only_elements_written_on_a_midpoint_are_four_f32 finds
# them)
_ON_A_MIDPOINT = [
    (0x5A5F8476, "1.572864e+16", "1.5728639e+16"),
    (0x5ADF8476, "3.145728e+16", "3.1457279e+16"),
    (0x5B5F8476, "6.291456e+16", "6.2914558e+16"),
    (0x5BDF8476, "1.2582912e+17", "1.25829116e+17"),
]


@pytest.mark.parametrize(("bits", "even", "odd"), _ON_A_MIDPOINT,
                         ids=[hex(b) for b, _, _ in _ON_A_MIDPOINT])
def test_an_f32_on_a_midpoint_tie_is_written_in_its_fewest_digits(bits: int, even: str,
                                                                   odd: str) -> None:
    from flodl_proto._decode_table import _num

    a = struct.unpack("<f", struct.pack("<I", bits))[0]
    below = struct.unpack("<f", struct.pack("<I", bits - 1))[0]
    assert Fraction(even) == (Fraction(a) + Fraction(below)) / 2  # exactly on the midpoint
    assert (_num(a, "f32"), _num(-a, "f32"), _num(below, "f32")) == (even, "-" + even, odd)
    # each reads back as its own bits (a parser rounds the tie to the even bits)
    assert np.array([even, odd], "<f4").view("<u4").tolist() == [bits, bits - 1]


def _short_midpoints(frac_bits: int) -> Iterator[tuple[int, int]]:
    """Every midpoint between adjacent finite values of a binary format of ``frac_bits``
    fraction bits (f32 23, bf16 7) from 2**53 up that has at most 9 significant digits, with
    the half step to its neighbours: an odd multiple of 2**(E - frac_bits - 1) in the binade
    [2**E, 2**(E + 1)), and a multiple of 10**j, j its digits less 9. Below 2**53 a midpoint
    has more fraction digits than both its neighbours, or is a whole number below 1e16, which
    the table writes with .0 and never searches."""
    for e in range(53, 128):
        t = e - frac_bits - 1
        j = len(str(2 ** e)) - 9
        if t - j < 0:
            continue
        step = 2 ** (t - j)  # k * 10**j has exactly t factors of 2: k / step is odd
        k = -(-(2 ** e) // 10 ** j // step) * step
        while k * 10 ** j < 2 ** (e + 1):
            if (k // step) % 2 and len(str(k * 10 ** j).rstrip("0")) <= 9:
                yield k * 10 ** j, 2 ** t
            k += step


def test_the_only_elements_written_on_a_midpoint_are_four_f32() -> None:
    """The table's search for an element's fewest digits tries only decimals of at most 9
    digits: every one that lies exactly on a midpoint between two f32 values (104) is tried
    with both its neighbours, whose texts are the dissector's reference; the four f32 of
    _ON_A_MIDPOINT are the only values written on a midpoint, which reads back as them by the
    tie rule. A bf16 midpoint from 2**53 up is an odd number below 512 times a power of two,
    never a multiple of 10**8 as a decimal of 9 digits that large is: there is none."""
    from flodl_proto._decode_table import _num

    from .test_dissector_values import element_text

    on_midpoint = []
    counts = []
    for dtype, frac_bits in (("f32", 23), ("bf16", 7)):
        mids = list(_short_midpoints(frac_bits))
        counts.append(len(mids))
        for mid, half in mids:
            for a in (float(mid - half), float(mid + half)):
                if a > 3.4028234663852886e38:
                    continue
                text = _num(a, dtype)
                assert text == element_text(a, dtype), (dtype, a)
                if Fraction(text) == mid:
                    on_midpoint.append((dtype, text))
    assert counts == [104, 0]
    assert on_midpoint == [("f32", even) for _, even, _ in _ON_A_MIDPOINT]


def test_the_table_writes_a_weight_as_python_repr_and_the_json() -> None:
    """A whole weight from 1e15 up to 1e16 was written 1e+15 where the JSON (Python's repr) has
    1000000000000000.0, a 17-digit one from 1e16 without its exponent and 2**-1017 in 17 digits
    where repr needs 16: the table writes an f64 as repr does; an element at a power of two in
    its fewest digits (the f32 2**-96 as 1.2621775e-29, not 1.26217745e-29)."""
    from flodl_proto._decode_table import _num

    from .test_dissector_values import REPR_EDGES

    assert [_num(v) for v in REPR_EDGES] == [repr(v) for v in REPR_EDGES]
    assert _num(1e15) == "1000000000000000.0" and _num(9.99e-5) == "9.99e-05"
    assert _num(1.2345678901234568e16) == "1.2345678901234568e+16"
    assert _num(float(np.float32(2.0 ** -96)), "f32") == "1.2621775e-29"
    assert _num(float(np.float32(-(2.0 ** -96))), "f32") == "-1.2621775e-29"
    assert _num(float(np.float32(2.0 ** 50)), "f32") == "1125899906842624.0"
    assert _num(2.0 ** -119, "bf16") == "1.51e-36"  # bf16 0x0400
    frame = RoundFrame(RoundKind.MODEL, 1e15, [TensorPayload.from_array(
        np.array([1.0], np.float32))])
    rep = decode_stream(encode_round_frame_bytes(frame, SALT), "frame")
    assert "weight=1000000000000000.0 " in list(format_table(rep))[1]
    assert json.dumps(rep.records[0]["frame"]["weight"]) == "1000000000000000.0"


def test_values_help_says_the_summary_stays(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # the help said "instead of a summary", but a record keeps its summary beside the values
    raw = tmp_path / "frame.bin"
    raw.write_bytes(FRAME_55)
    assert main(["decode", "--leg", "frame", "--format", "table", "--values", str(raw)]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert "min=-2.5 max=3.25 mean=0.4375 values=[1.0, -2.5, 0.0, 3.25]" in row
    with pytest.raises(SystemExit):
        main(["decode", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--values print every tensor element too, after its summary (min, max, mean)" in text


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["decode", "--salt", "abcd"])
    assert e.value.code == 2
    assert main(["decode", "--pcap", str(tmp_path / "x")]) == 2
    assert main(["decode", "--port", "5", str(tmp_path / "x")]) == 2
    capsys.readouterr()
    # an input that cannot be opened or read is a bad command line, as a --salt-file is
    missing = tmp_path / "missing"
    assert main(["decode", str(missing)]) == 2
    assert capsys.readouterr() == ("", f"flodl-proto decode: error: argument FILE: "
                                       f"{shown(str(missing))}: No such file or directory\n")
    assert main(["decode", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"flodl-proto decode: error: argument FILE: "
                                       f"{shown(str(tmp_path))}: Is a directory\n")


def test_cli_closed_stdin_is_one_line(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # started with ``<&-``
    assert main(["decode"]) == 2
    assert capsys.readouterr() == ("", "flodl-proto decode: error: cannot read input stdin: it is "
                                       "closed\n")


def test_cli_hex_input_that_is_not_hex(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.hex"
    bad.write_bytes(b"0011\n22\xd0\x01")
    assert main(["decode", "--hex", str(bad)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: input is not hex: byte 0xd0 at "
                                       "offset 7 (--hex takes hex text)\n")
    bad.write_text("00 11\nzz 22\n", encoding="ascii")
    assert main(["decode", "--hex", str(bad)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: input is not hex: line 2: "
                                       "'zz 22' (--hex takes hex text)\n")


def test_cli_input_ending_inside_a_header(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Both paths follow one rule: bytes that contradict the record's magic are a protocol error
    (exit 1); a header cut short with nothing wrong in it is a capture that ended (exit 4)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"garbage")))
    assert main(["decode"]) == EXIT_ERROR
    got = capsys.readouterr()
    assert got.err == "flodl-proto decode: mux leg (too short to tell; --leg to choose)\n"
    assert _json_lines(got.out) == [{
        "type": "error", "offset": 0, "error_kind": "magic", "error_id": "mux.bad_magic",
        "error": f"relay_mux: record magic 0x62726167 != 0x{MUX_RECORD_MAGIC:08x}"}]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"00112233")))
    assert main(["decode", "--hex", "--leg", "frame"]) == EXIT_ERROR
    assert _json_lines(capsys.readouterr().out)[-1]["error_id"] == "frame.bad_magic"
    head = struct.pack("<I", ROUND_FRAME_MAGIC)[:3].hex()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(head.encode())))
    assert main(["decode", "--hex", "--leg", "frame"]) == EXIT_CAPTURE_ENDED
    assert _json_lines(capsys.readouterr().out) == [{
        "type": "capture_ended", "offset": 0, "error_id": "frame.header_read_failed",
        "error": "capture ended inside a record at offset 0 (a reader would report: RoundFrame "
                 "header read failed: input ended inside the 8-byte header (3 of 8 bytes; a "
                 "stream reader takes this as a clean end of stream))"}]


class _Endless(io.RawIOBase):
    """A stdin that never ends (``/dev/zero``): counts the bytes handed out."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = len(b)
        b[:n] = bytes(n)
        self.given += n
        return n


def test_cli_input_is_bounded_by_max_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    endless = _Endless()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(endless)))
    assert main(["decode", "--leg", "mux", "--max-input", "5000", "-"]) == EXIT_ERROR
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err == ("flodl-proto decode: error: the input is longer than --max-input 5000 "
                       "bytes; give a larger --max-input to decode it\n")
    assert endless.given <= 5001 + io.DEFAULT_BUFFER_SIZE  # read up to the limit, not to the end

    sent = _mux_up(2)
    raw = tmp_path / "mux.bin"
    raw.write_bytes(sent.data)
    n = len(sent.data)
    assert main(["decode", "--max-input", str(n), "--salt", SALT.hex(), str(raw)]) == EXIT_OK
    assert _json_lines(capsys.readouterr().out)[-1]["type"] == "end"
    assert main(["decode", "--max-input", str(n - 1), str(raw)]) == EXIT_ERROR
    assert capsys.readouterr().err == (f"flodl-proto decode: error: the input is longer than "
                                       f"--max-input {n - 1} "
                                       "bytes; give a larger --max-input to decode it\n")
    raw.write_text(sent.data.hex(), encoding="ascii")  # the limit counts the bytes read
    assert main(["decode", "--hex", "--max-input", str(2 * n - 1), str(raw)]) == EXIT_ERROR
    assert "--max-input" in capsys.readouterr().err
    for bad, why in (("0", "must be at least 1 byte, got 0"),
                     ("4G", "expected a number of bytes, got '4G'")):
        with pytest.raises(SystemExit) as e:
            main(["decode", "--max-input", bad, str(raw)])
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"flodl-proto decode: error: argument --max-input: {why}")


@pytest.mark.parametrize("mode", [[], ["--hex"], ["--pcap", "--port", "1337"]])
def test_cli_max_input_is_checked_before_the_first_bytes_are_judged(
        mode: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `head -c 100 /dev/zero | decode --max-input 10` said the first bytes start no leg (and
    # --hex, --pcap: not hex, not a capture): the input is longer than --max-input, whatever
    # its first bytes are
    raw = tmp_path / "zeros.bin"
    raw.write_bytes(bytes(100))
    assert main(["decode", *mode, "--max-input", "10", str(raw)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: the input is longer than "
                                       "--max-input 10 bytes; give a larger --max-input to "
                                       "decode it\n")


# -------------------------------------------------------------------------------------------------
# pcap: a capture written here, byte by byte
# -------------------------------------------------------------------------------------------------
def _tcp_packet(src: tuple[str, int], dst: tuple[str, int], seq: int, flags: int,
                payload: bytes = b"") -> bytes:
    def ip4(a: str) -> bytes:
        return bytes(int(x) for x in a.split("."))

    tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq & 0xFFFFFFFF, 0, 5 << 4, flags,
                      65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0,
                     ip4(src[0]), ip4(dst[0])) + tcp
    eth = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    return eth + ip


def _pcap(packets: list[bytes]) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for i, p in enumerate(packets):
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(p), len(p)) + p
    return out


def _segments(data: bytes, sizes: list[int]) -> list[tuple[int, bytes]]:
    out, pos, k = [], 0, 0
    while pos < len(data):
        n = sizes[k % len(sizes)]
        out.append((pos, data[pos:pos + n]))
        pos += n
        k += 1
    return out


SYN, ACK, PSH = 0x02, 0x10, 0x08


def _capture(up: bytes, down: bytes, port: int, *, gap: bool = False,
             noise: bytes = b"noise") -> bytes:
    relay, ctrl = ("10.0.0.2", 40001), ("10.0.0.1", port)
    isn_up, isn_down = 0xFFFFFF00, 1000  # the relay's sequence numbers wrap around 2^32
    pk = [_tcp_packet(relay, ctrl, isn_up, SYN), _tcp_packet(ctrl, relay, isn_down, SYN | ACK),
          _tcp_packet(("10.0.0.9", 5555), ("10.0.0.1", 80), 7, PSH | ACK, noise)]
    ups = _segments(up, [7, 40, 3])
    downs = _segments(down, [50, 1])
    order = list(range(len(ups)))
    order[1], order[2] = order[2], order[1]  # one pair out of order
    for n, i in enumerate(order):
        off, seg = ups[i]
        if gap and i == 3:
            continue
        pk.append(_tcp_packet(relay, ctrl, isn_up + 1 + off, PSH | ACK, seg))
        if n == 4:  # a retransmission
            pk.append(_tcp_packet(relay, ctrl, isn_up + 1 + off, PSH | ACK, seg))
        if n < len(downs):
            doff, dseg = downs[n]
            pk.append(_tcp_packet(ctrl, relay, isn_down + 1 + doff, PSH | ACK, dseg))
    for doff, dseg in downs[len(order):]:
        pk.append(_tcp_packet(ctrl, relay, isn_down + 1 + doff, PSH | ACK, dseg))
    return _pcap(pk)


def test_pcap_reassembly() -> None:
    up, down = _mux_up(3).data, _mux_down(3).data
    streams = read_tcp_streams(_capture(up, down, 1337), 1337)
    assert [(s.src, s.dst) for s in streams] == [("10.0.0.2:40001", "10.0.0.1:1337"),
                                                  ("10.0.0.1:1337", "10.0.0.2:40001")]
    assert streams[0].data == up and streams[1].data == down
    assert all(s.syn_seen and not s.gap for s in streams)
    cut = read_tcp_streams(_capture(up, down, 1337, gap=True), 1337)
    assert cut[0].gap and up.startswith(cut[0].data) and len(cut[0].data) < len(up)
    assert read_tcp_streams(_capture(up, down, 1337), 9999) == []


def test_cli_pcap_without_the_extra_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cap = tmp_path / "cap.pcap"
    cap.write_bytes(_capture(_mux_up(2).data, _mux_down(2).data, 1337))
    monkeypatch.setitem(sys.modules, "dpkt", None)  # ``import dpkt`` fails: no pcap extra
    assert main(["decode", "--pcap", "--port", "1337", str(cap)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: reading captures needs dpkt, "
                                       "the pcap extra: "
                                       "pip install 'flodl-proto[pcap]'\n")


def test_cli_pcap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    up, down = _mux_up(3), _mux_down(3)
    cap = tmp_path / "cap.pcap"
    cap.write_bytes(_capture(up.data, down.data, 1337))
    rc = main(["decode", "--pcap", str(cap), "--port", "1337", "--salt", SALT.hex(),
               "--protocol-version", "3"])
    assert rc == EXIT_OK
    lines = _json_lines(capsys.readouterr().out)
    first = [r for r in lines if r["stream"] == "10.0.0.2:40001 -> 10.0.0.1:1337"]
    second = [r for r in lines if r["stream"] == "10.0.0.1:1337 -> 10.0.0.2:40001"]
    assert len(first) + len(second) == len(lines)
    _check_records(first[:-1], up, 3, False)
    _check_records(second[:-1], down, 3, False)
    assert first[-1]["type"] == second[-1]["type"] == "end"

    cap.write_bytes(_capture(up.data, down.data, 1337, gap=True))
    assert main(["decode", "--pcap", str(cap), "--port", "1337", "--salt", SALT.hex(),
                 "--protocol-version", "3"]) == EXIT_CAPTURE_ENDED
    captured = capsys.readouterr()
    assert "bytes missing from the capture" in captured.err
    assert _json_lines(captured.out)[-1]["type"] == "capture_ended"
    assert main(["decode", "--pcap", str(cap), "--port", "4242"]) == EXIT_ERROR
    cap.write_bytes(b"not a capture")
    assert main(["decode", "--pcap", str(cap), "--port", "1337"]) == EXIT_ERROR
    capsys.readouterr()


def test_cli_pcap_skips_the_status_responder_s_http_streams(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the controller serves GET /status on its port: a capture of a run with one poll failed
    # with "cannot tell the leg" for the HTTP streams, exit 1, though every flodl stream decoded
    up, down = _mux_up(3), _mux_down(3)
    client, ctrl = ("10.0.0.3", 40002), ("10.0.0.1", 1337)
    request, reply = b"GET /status HTTP/1.1\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n{}"
    cap = _capture(up.data, down.data, 1337)
    http = _pcap([_tcp_packet(client, ctrl, 5, SYN), _tcp_packet(ctrl, client, 9, SYN | ACK),
                  _tcp_packet(client, ctrl, 6, PSH | ACK, request),
                  _tcp_packet(ctrl, client, 10, PSH | ACK, reply)])
    path = tmp_path / "cap.pcap"
    path.write_bytes(cap + http[24:])  # the HTTP connection's packets after the flodl ones
    rc = main(["decode", "--pcap", str(path), "--port", "1337", "--salt", SALT.hex(),
               "--protocol-version", "3"])
    out, err = capsys.readouterr()
    assert rc == EXIT_OK, err
    for stream in ("10.0.0.3:40002 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.3:40002"):
        assert (f"flodl-proto decode: {stream}: HTTP (the controller's status responder), not "
                f"a flodl leg; skipped\n") in err
    lines = _json_lines(out)
    assert {r["stream"] for r in lines} == {"10.0.0.2:40001 -> 10.0.0.1:1337",
                                            "10.0.0.1:1337 -> 10.0.0.2:40001"}


def _connection(client: tuple[str, int], server: tuple[str, int], up: bytes,
                down: bytes) -> list[bytes]:
    """One TCP connection's packets: SYN, SYN-ACK, then each direction's bytes in one segment."""
    return [_tcp_packet(client, server, 100, SYN), _tcp_packet(server, client, 500, SYN | ACK),
            _tcp_packet(client, server, 101, PSH | ACK, up),
            _tcp_packet(server, client, 501, PSH | ACK, down)]


def _several_ports_capture(tmp_path: Path) -> Path:
    """A capture file of a controller (port 1337), a relay (port 7001) and a rank: the relay's
    connection to the controller (from port 40001), the rank's to the relay, one from the
    relay's own port to the controller, and one on neither port."""
    up, down = _mux_up(3).data, _mux_down(3).data
    ctrl, relay, rank, other = (("10.0.0.1", 1337), ("10.0.0.2", 7001), ("10.0.0.3", 50000),
                                ("10.0.0.9", 9999))
    relay_out = ("10.0.0.2", 40001)
    path = tmp_path / "cap.pcap"
    path.write_bytes(_pcap(_connection(relay_out, ctrl, up, down)
                           + _connection(rank, relay, up, down)
                           + _connection(relay, ctrl, up, down)  # from the relay's own port
                           + _connection(other, ("10.0.0.1", 80), up, down)))
    return path


def test_cli_pcap_takes_several_ports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a demo prints its controller's port and each relay's: one --port each, in one run (it took
    # one run per port); a connection between two of the ports is decoded once, under the first
    path = _several_ports_capture(tmp_path)
    rc = main(["decode", "--pcap", str(path), "--port", "7001", "--port", "1337", "--port",
               "7001", "--salt", SALT.hex(), "--protocol-version", "3"])
    out, err = capsys.readouterr()
    assert rc == EXIT_OK, err
    order = list(dict.fromkeys(r["stream"] for r in _json_lines(out)))
    assert order == ["10.0.0.3:50000 -> 10.0.0.2:7001", "10.0.0.2:7001 -> 10.0.0.3:50000",
                     "10.0.0.2:7001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:7001",
                     "10.0.0.2:40001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:40001"]
    ends = [r for r in _json_lines(out) if r["type"] == "end"]
    assert len(ends) == 6
    assert main(["decode", "--pcap", str(path), "--port", "4242", "--port", "4243"]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: no TCP stream to or from "
                                       "ports 4242, 4243 in the capture\n")
    assert main(["decode", "--pcap", str(path), "--port", "4242"]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: no TCP stream to or from "
                                       "port 4242 in the capture\n")


def test_cli_pcap_names_a_port_without_a_stream(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # a port with no stream beside one with streams: its streams are decoded and a warning
    # names the other (it was not mentioned); many ports: the line names 8, then counts
    path = _several_ports_capture(tmp_path)
    assert main(["decode", "--pcap", str(path), "--port", "4242", "--port", "7001", "--salt",
                 SALT.hex(), "--protocol-version", "3"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == ("flodl-proto decode: warning: no TCP stream to or from port "
                                   "4242 in the capture")
    assert len([r for r in _json_lines(out) if r["type"] == "end"]) == 4, err
    ports = [str(p) for p in range(2000, 2300)]
    assert main(["decode", "--pcap", str(path), *[a for p in ports for a in ("--port", p)]]) \
        == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: no TCP stream to or from "
                                       "ports 2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007, "
                                       "... (292 more) in the capture\n")


def test_cli_pcap_reads_the_capture_once_for_all_its_ports(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], capture_reads: list[int]) -> None:
    # each --port parsed and reassembled the whole capture again (three passes here)
    path = _several_ports_capture(tmp_path)
    assert main(["decode", "--pcap", str(path), "--port", "7001", "--port", "1337", "--port",
                 "80", "--salt", SALT.hex(), "--protocol-version", "3"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert capture_reads == [path.stat().st_size]
    assert list(dict.fromkeys(r["stream"] for r in _json_lines(out))) == [
        "10.0.0.3:50000 -> 10.0.0.2:7001", "10.0.0.2:7001 -> 10.0.0.3:50000",
        "10.0.0.2:7001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:7001",
        "10.0.0.2:40001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:40001",
        "10.0.0.9:9999 -> 10.0.0.1:80", "10.0.0.1:80 -> 10.0.0.9:9999"]
    assert len([r for r in _json_lines(out) if r["type"] == "end"]) == 8, err


def test_http_stream_tells_a_status_request_and_reply_from_a_flodl_leg() -> None:
    assert http_stream(b"GET /status HTTP/1.1") and http_stream(b"POST /x HTTP/1.1")
    assert http_stream(b"HTTP/1.1 200 OK")
    assert not http_stream(b"GET") and not http_stream(b"HTTP 1.1")
    assert not http_stream(_mux_up(3).data) and not http_stream(_mux_down(3).data)


def _record_starts(cap: bytes) -> list[int]:
    """Byte offsets of every packet record of a libpcap file written by :func:`_pcap`."""
    out, pos = [], 24
    while pos < len(cap):
        out.append(pos)
        pos += 16 + struct.unpack_from("<I", cap, pos + 8)[0]
    assert pos == len(cap)
    return out


def test_a_truncated_capture_is_reported_with_the_streams_before_the_cut() -> None:
    up, down = _mux_up(3).data, _mux_down(3).data
    cap = _capture(up, down, 1337)
    starts = _record_starts(cap)
    for cut in (1, 10, 23):  # inside the file header
        with pytest.raises(CaptureTruncated) as ei:
            read_tcp_streams(cap[:cut], 1337)
        assert (ei.value.size, ei.value.complete, ei.value.streams) == (cut, 0, [])
        assert str(ei.value) == (f"the capture is truncated: it ends at byte {cut}, inside its "
                                 "file header")
    for k in (0, 1, 5, len(starts) - 1):
        start = starts[k]
        end = starts[k + 1] if k + 1 < len(starts) else len(cap)
        whole = read_tcp_streams(cap[:start], 1337)  # a cut between records is a whole capture
        for cut in (start + 1, start + 15, start + 16, start + 30, end - 1):  # header, data
            with pytest.raises(CaptureTruncated) as ei:
                read_tcp_streams(cap[:cut], 1337)
            assert (ei.value.size, ei.value.complete) == (cut, start)
            assert ei.value.streams == whole
            assert str(ei.value) == (f"the capture is truncated: it ends at byte {cut}, inside "
                                     f"the packet record that starts at byte {start}")


def test_a_record_claiming_more_than_the_snaplen_is_corrupt_not_cut(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a damaged record header (its length a huge number) was reported as a capture cut short
    from flodl_proto.pcap import PcapError

    cap = bytearray(_capture(_mux_up(3).data, _mux_down(3).data, 1337))
    starts = _record_starts(bytes(cap))
    at = starts[3]
    struct.pack_into("<I", cap, at + 8, 0x7FFF0000)  # incl_len, with 65535 the snaplen
    with pytest.raises(PcapError) as ei:
        read_tcp_streams(bytes(cap), 1337)
    assert type(ei.value) is PcapError
    assert str(ei.value) == (f"capture is corrupt: the packet record at byte {at} claims "
                             f"{0x7FFF0000} bytes, more than the capture's snaplen 65535")
    path = tmp_path / "cap.pcap"
    path.write_bytes(cap)
    assert main(["decode", "--pcap", str(path), "--port", "1337"]) == EXIT_ERROR
    assert capsys.readouterr() == ("", f"flodl-proto decode: error: {ei.value}\n")
    struct.pack_into("<I", cap, at + 8, 65535)  # a length the snaplen allows: a cut capture
    with pytest.raises(CaptureTruncated):
        read_tcp_streams(bytes(cap[:at + 16 + 100]), 1337)


def test_a_truncated_pcapng_capture_is_reported() -> None:
    import dpkt

    buf = io.BytesIO()
    writer = dpkt.pcapng.Writer(buf, linktype=1)
    writer.writepkt(_tcp_packet(("10.0.0.2", 40001), ("10.0.0.1", 1337), 5, SYN), ts=1)
    first = len(buf.getvalue())
    writer.writepkt(_tcp_packet(("10.0.0.1", 1337), ("10.0.0.2", 40001), 9, SYN | ACK), ts=2)
    ng = buf.getvalue()
    assert [st.label for st in read_tcp_streams(ng, 1337)] == [
        "10.0.0.2:40001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:40001"]
    for cut in (first + 4, first + 20, len(ng) - 1):  # block header, block body
        with pytest.raises(CaptureTruncated) as ei:
            read_tcp_streams(ng[:cut], 1337)
        assert (ei.value.size, ei.value.complete) == (cut, first)
        assert [st.label for st in ei.value.streams] == ["10.0.0.2:40001 -> 10.0.0.1:1337"]
    with pytest.raises(CaptureTruncated) as ei:
        read_tcp_streams(ng[:30], 1337)
    assert ei.value.complete == 0


def test_a_pcapng_block_of_an_impossible_length_is_corrupt_not_cut() -> None:
    # a damaged block length (huge, short, or not a multiple of 4) was reported as a cut capture
    # or with dpkt's own words; a length a block can have, running past the end, is a cut
    import dpkt

    from flodl_proto.pcap import PcapError

    for order in "<>":
        buf = io.BytesIO()
        writer = dpkt.pcapng.Writer(buf, linktype=1)
        writer.writepkt(_tcp_packet(("10.0.0.2", 40001), ("10.0.0.1", 1337), 5, SYN), ts=1)
        first = len(buf.getvalue())
        writer.writepkt(_tcp_packet(("10.0.0.1", 1337), ("10.0.0.2", 40001), 9, SYN | ACK), ts=2)
        ng = bytearray(buf.getvalue())
        if order == ">":  # the same blocks as a big-endian writer lays them out
            ng = _pcapng_big_endian(ng)
        assert struct.unpack_from(order + "I", ng, 8)[0] == 0x1A2B3C4D  # the byte-order magic
        assert [st.label for st in read_tcp_streams(bytes(ng), 1337)] == [
            "10.0.0.2:40001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:40001"]
        for length in (0x7FFF0000, 393252, 13, 8, 0):
            cap = bytearray(ng)
            struct.pack_into(order + "I", cap, first + 4, length)
            with pytest.raises(PcapError) as ei:
                read_tcp_streams(bytes(cap), 1337)
            assert type(ei.value) is PcapError
            assert str(ei.value) == (
                f"capture is corrupt: the block at byte {first} claims a total length of "
                f"{length} bytes (a block is 12 to 393248 bytes, a multiple of 4)")
        for length in (393248, 1000):  # possible lengths, past the end: the capture was cut
            cap = bytearray(ng)
            struct.pack_into(order + "I", cap, first + 4, length)
            with pytest.raises(CaptureTruncated) as ei:
                read_tcp_streams(bytes(cap), 1337)
            assert (ei.value.size, ei.value.complete) == (len(cap), first)


def test_a_pcapng_ending_in_a_statistics_block_is_whole() -> None:
    # dumpcap (tshark -w) ends a capture with an interface statistics block, which the packet
    # reader skips: a capture ending right after it was reported as truncated (decode exit 4)
    import dpkt

    buf = io.BytesIO()
    writer = dpkt.pcapng.Writer(buf, linktype=1)
    writer.writepkt(_tcp_packet(("10.0.0.2", 40001), ("10.0.0.1", 1337), 5, SYN), ts=1)
    writer.writepkt(_tcp_packet(("10.0.0.1", 1337), ("10.0.0.2", 40001), 9, SYN | ACK), ts=2)
    packets = buf.getvalue()
    isb = struct.pack("<IIIII", 5, 24, 0, 0, 0) + struct.pack("<I", 24)  # no options
    labels = ["10.0.0.2:40001 -> 10.0.0.1:1337", "10.0.0.1:1337 -> 10.0.0.2:40001"]
    for tail in (isb, isb + isb):
        ng = packets + tail
        assert [st.label for st in read_tcp_streams(ng, 1337)] == labels
        for cut in (len(ng) - 1, len(ng) - 16, len(ng) - 20):  # inside the last block
            with pytest.raises(CaptureTruncated) as ei:
                read_tcp_streams(ng[:cut], 1337)
            assert ei.value.size == cut
            assert [st.label for st in ei.value.streams] == labels


def _pcapng_big_endian(ng: bytearray) -> bytearray:
    """The little-endian pcapng ``ng`` (dpkt's writer: a section header, an interface block,
    enhanced packet blocks) rewritten in big-endian byte order, block by block."""
    out = bytearray()
    at = 0
    while at < len(ng):
        kind, length = struct.unpack_from("<II", ng, at)
        block = ng[at:at + length]
        words = {0x0A0D0D0A: "<IIIHHq", 1: "<IIHHI", 6: "<IIIIIII"}[kind]
        head = struct.unpack_from(words, block, 0)
        fixed = struct.calcsize(words)
        body = bytearray(block[fixed:length - 4])
        opt = 0  # options: code and length u16 each, then the value padded to 4 bytes
        if kind == 6:  # the packet data (captured length, padded) comes before them
            opt = (head[5] + 3) // 4 * 4
        while opt + 4 <= len(body):
            code, olen = struct.unpack_from("<HH", body, opt)
            struct.pack_into(">HH", body, opt, code, olen)
            opt += 4 + (olen + 3) // 4 * 4
            if code == 0:
                break
        out += struct.pack(">" + words[1:], *head) + body + struct.pack(">I", length)
        at += length
    return out


def test_cli_truncated_capture_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    up, down = _mux_up(3), _mux_down(3)
    full = _capture(up.data, down.data, 1337)
    starts = _record_starts(full)
    cap = tmp_path / "cap.pcap"
    args = ["decode", "--pcap", str(cap), "--port", "1337", "--salt", SALT.hex(),
            "--protocol-version", "3"]
    cap.write_bytes(full[:100])  # the SYN, the SYN-ACK, then the cut
    assert main(args) == EXIT_CAPTURE_ENDED
    got = capsys.readouterr()
    assert got.err.splitlines()[0] == ("flodl-proto decode: warning: the capture is truncated: it "
                                       "ends at byte 100, "
                                       f"inside the packet record that starts at byte "
                                       f"{starts[1]}; the streams stop before it")
    # the connection's one direction before the cut carried no byte: skipped
    assert got.err.splitlines()[1].endswith(": no bytes in this direction; skipped")
    assert _json_lines(got.out) == []
    cut = starts[-1] + 20  # inside the last packet's data: every earlier record decodes
    cap.write_bytes(full[:cut])
    assert main(args) == EXIT_CAPTURE_ENDED
    got = capsys.readouterr()
    assert got.err.splitlines()[0] == (f"flodl-proto decode: warning: the capture is truncated: it "
                                       f"ends at byte {cut}, "
                                       f"inside the packet record that starts at byte "
                                       f"{starts[-1]}; the streams stop before it")
    lines = _json_lines(got.out)
    first = [r for r in lines if r["stream"] == "10.0.0.2:40001 -> 10.0.0.1:1337"]
    second = [r for r in lines if r["stream"] == "10.0.0.1:1337 -> 10.0.0.2:40001"]
    _check_records(second[:-1], down, 3, False)  # the last packet is the relay's last segment
    assert [r["offset"] for r in first[:-1]] == up.offsets[:-1]
    # the relay's stream lost the start of its last record with the cut packet: a cut inside
    # that record's header is a capture that ended too
    assert (first[-1]["type"], first[-1]["offset"]) == ("capture_ended", up.offsets[-1])
    # the other direction ends at a record boundary before the cut, but what it carried after
    # the cut is not in the file: not a clean end either (it said "end")
    assert second[-1] == {
        "stream": "10.0.0.1:1337 -> 10.0.0.2:40001", "type": "capture_ended",
        "offset": second[-2]["offset"] + second[-2]["length"], "error_id": None,
        "error": f"the capture file is cut short (at byte {cut}); the stream may go on after "
                 f"offset {second[-2]['offset'] + second[-2]['length']}"}


def test_cli_a_capture_cut_before_its_first_whole_packet_holds_no_tcp_stream(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A capture cut inside its first packet record gave only the truncation warning, exit 4
    (one cut inside its file header an error line, exit 4), where one holding just its file
    header gave 'no TCP stream' and exit 1: a cut capture with no whole packet holds no TCP
    stream either, and 1 comes before 4; its one line names the cut."""
    full = _capture(_mux_up(3).data, _mux_down(3).data, 1337)
    starts = _record_starts(full)
    cap = tmp_path / "cap.pcap"
    args = ["decode", "--pcap", str(cap), "--port", "1337"]
    no_stream = "flodl-proto decode: error: no TCP stream to or from port {} in the capture"
    cap.write_bytes(full[:24])  # the file header alone: a whole capture of no packet
    assert main(args) == EXIT_ERROR
    assert capsys.readouterr() == ("", no_stream.format(1337) + "\n")
    for cut, where in ((10, "inside its file header"),
                       (30, "inside the packet record that starts at byte 24"),
                       (starts[1] - 1, "inside the packet record that starts at byte 24")):
        cap.write_bytes(full[:cut])
        assert main(args) == EXIT_ERROR
        assert capsys.readouterr() == ("", no_stream.format(1337) + "; the capture is "
                                       f"truncated: it ends at byte {cut}, {where}\n")
    # whole packets of other ports' streams before the cut, none of the port asked for: the
    # same (it was the truncation warning alone, exit 4)
    cut = starts[-1] + 20
    cap.write_bytes(full[:cut])
    assert main([*args[:-1], "4242"]) == EXIT_ERROR
    assert capsys.readouterr() == ("", no_stream.format(4242) + "; the capture is truncated: "
                                   f"it ends at byte {cut}, inside the packet record that "
                                   f"starts at byte {starts[-1]}\n")


# -------------------------------------------------------------------------------------------------
# The tag-agnostic parser agrees with the codec's verifying readers on every golden vector
# -------------------------------------------------------------------------------------------------
def _vector_cases(file: str, ops: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for folder, version in ((BUNDLED, 3), (BUNDLED / "v2", 2)):
        doc = json.loads((folder / f"{file}.json").read_text(encoding="utf-8"))
        out += [(version, c) for c in doc["cases"] if c["op"] in ops]
    return out


FRAME_CASES = _vector_cases("round_frame", ("round_frame.read", "round_frame.roundtrip"))
MUX_CASES = _vector_cases("mux_record", ("mux_record.read", "mux_record.roundtrip"))


@pytest.mark.parametrize(("version", "case"), FRAME_CASES, ids=[c["id"] for _, c in FRAME_CASES])
def test_parser_agrees_with_codec_on_frames(version: int, case: dict[str, Any]) -> None:
    data, salt = bytes.fromhex(case["bytes"]), bytes.fromhex(case["salt"])
    try:
        want: object = decode_round_frame(data, salt)
    except ProtocolError as e:
        want = e
    try:
        pf = parse_round_frame(data)
    except ProtocolError as e:
        assert isinstance(want, ProtocolError) and not isinstance(want, AuthenticationError)
        assert (e.error_id, str(e)) == (want.error_id, str(want))
        return
    status = tag_status(salt, [data[:pf.covered]], pf.tag)
    if isinstance(want, AuthenticationError):
        assert status == "bad"
        return
    assert not isinstance(want, ProtocolError)
    assert status == "ok" and want == (pf.frame, pf.length)


@pytest.mark.parametrize(("version", "case"), MUX_CASES, ids=[c["id"] for _, c in MUX_CASES])
def test_decode_agrees_with_codec_on_mux_records(version: int, case: dict[str, Any]) -> None:
    data, salt = bytes.fromhex(case["bytes"]), bytes.fromhex(case["salt"])
    try:
        want: object = decode_mux_record_or_eos(data, salt, version=version)
    except ProtocolError as e:
        want = e
    rep = decode_stream(data, "mux", salt=salt, version=version)
    first = rep.records[0] if rep.records else None
    if want is END_OF_STREAM:
        assert first is None and rep.failure is None
    elif isinstance(want, AuthenticationError):
        assert rep.bad_tags == 1  # counted before any later check can stop decoding
        if rep.failure is None:  # the record is shown with its bad tag, and decoding goes on
            assert first is not None and first["tag_status"] == "bad"
            assert first["length"] == len(data)
        else:  # only a record whose payload does not parse either stops decoding, at its error
            assert first is None and rep.failure.offset == 0
            assert rep.failure.error_id is not None
            assert not rep.failure.error_id.endswith(".auth_failed")
    elif isinstance(want, ProtocolError):
        assert rep.failure is not None and rep.failure.offset == 0
        assert rep.failure.message == str(want)
    else:
        assert isinstance(want, tuple)
        rec, n = want
        if rec.kind in (RecordKind.HOST_FRAME, RecordKind.BROADCAST):
            try:
                parse_round_frame(rec.payload)
            except ProtocolError:  # a valid record whose payload is not a frame: decoding stops
                assert rep.failure is not None and rep.failure.offset == 0 and not rep.records
                return
        assert first is not None and first["length"] == n and first["tag_status"] == "ok"
        assert first["kind_byte"] == int(rec.kind) and first["rank"] == rec.rank
        if rec.control is not None:
            assert first["control"] == control_to_json(rec.control, version)


# -- leg detection, bare RoundFrames, hex dumps, captures that end mid-record ---------------------
@pytest.mark.parametrize(("name", "version"), STREAMS)
def test_the_leg_is_told_from_the_first_bytes(name: str, version: int) -> None:
    leg, build = BUILDERS[name]
    sent = build(version)
    assert detect_leg(sent.data)[0] == leg
    if name.startswith("loopback"):  # without its handshake / ack: a length-prefixed frame
        rest = sent.data[sent.offsets[1]:]
        assert detect_leg(rest) == ("loopback", "a length prefix and a RoundFrame")
    if name == "mux-up":  # without the channel magic: a mux record header
        assert detect_leg(sent.data[4:]) == ("mux", "a mux record header")


def test_leg_detection_names_what_it_saw_or_refuses() -> None:
    wire = encode_round_frame_bytes(_frames(2)[0], SALT)
    assert detect_leg(wire) == ("frame", "a bare RoundFrame")
    assert detect_leg(encode_handshake(1, 4, 2)) == ("loopback", "the rank handshake")
    assert detect_leg(encode_ack(3)) == ("loopback", "the relay's handshake ack")
    assert detect_leg(encode_channel_magic("data")) == ("mux", "channel magic 0xf10d17e1")
    # the library's words name the library's argument and reader, not the command's options
    with pytest.raises(UnknownLeg) as no_leg:
        detect_leg(bytes.fromhex("0011223344556677"))
    assert isinstance(no_leg.value, ValueError)
    assert (no_leg.value.head, no_leg.value.http, no_leg.value.hex_text) == \
        (bytes.fromhex("0011223344556677"), False, False)
    assert str(no_leg.value) == (
        "cannot tell the leg from the first bytes (0011223344556677): not a channel magic, "
        "handshake, ack, RoundFrame, mux record or length-prefixed frame; name it with "
        "decode_stream's leg= (mux, loopback or frame)")
    # hex text: said so, with the function that reads it
    with pytest.raises(UnknownLeg, match=r"\(6330203137203064\): .*; name it with "
                                         r"decode_stream's leg= \(mux, loopback or frame\); "
                                         r"they read as hex text: decode it with "
                                         r"parse_hex_dump$") as hex_text:
        detect_leg(b"c0 17 0d f1 02 00 00 00\n")
    assert hex_text.value.hex_text
    with pytest.raises(UnknownLeg, match=r"name it with decode_stream's leg= \(mux, loopback "
                                         r"or frame\)$"):
        detect_leg(b"c0 1g 0d f1 02 00 00 00\n")  # a 'g': not hex text
    # the controller's port mux serves GET /status on the data channel's port: said so
    for http in (b"GET /status HTTP/1.1\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n{}"):
        with pytest.raises(ValueError) as ei:
            detect_leg(http)
        assert str(ei.value) == (
            f"cannot tell the leg from the first bytes ({http[:8].hex()}): they are HTTP (a GET "
            "/status to the controller's port mux, or its reply), not a flodl leg")


def test_bare_round_frames_decode_with_tags(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    frames = _frames(3)
    wires = [encode_round_frame_bytes(f, SALT) for f in frames]
    data = b"".join(wires)
    rep = decode_stream(data, "frame", salt=SALT, version=3)
    assert rep.exit_code == EXIT_OK and len(rep.records) == len(frames)
    pos = 0
    for rec, f, w in zip(rep.records, frames, wires, strict=True):
        assert (rec["type"], rec["offset"], rec["length"]) == ("round_frame", pos, len(w))
        assert rec["frame"]["tag_status"] == "ok"
        _check_frame(rec["frame"], f, False)
        pos += len(w)
    assert decode_stream(data, "frame", salt=OTHER, version=3).exit_code == EXIT_BAD_TAG
    raw = tmp_path / "frame.bin"
    raw.write_bytes(wires[0])
    assert main(["decode", "--salt", SALT.hex(), str(raw)]) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.err.strip() == ("flodl-proto decode: frame leg (a bare RoundFrame; --leg "
                                    "to choose)")
    out = _json_lines(captured.out)
    assert [r["type"] for r in out] == ["round_frame", "end"]


def _xxd(data: bytes) -> str:
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        groups = " ".join(chunk[i:i + 2].hex() for i in range(0, len(chunk), 2))
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}: {groups:<39}  {text}")
    return "\n".join(lines) + "\n"


def _hexdump_c(data: bytes) -> str:
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        left = " ".join(f"{b:02x}" for b in chunk[:8])
        right = " ".join(f"{b:02x}" for b in chunk[8:])
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {left:<23}  {right:<23}  |{text}|")
    return "\n".join(lines) + f"\n{len(data):08x}\n"


def _od_z(data: bytes) -> str:
    """``od -Ax -tx1z -v`` output: 6-digit offsets, the bytes, and the ``>text<`` column."""
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:06x} " + f"{' '.join(f'{b:02x}' for b in chunk):<47}" + f"  >{text}<")
    return "\n".join(lines) + f"\n{len(data):06x}\n"


def test_hex_dumps_in_every_usual_form() -> None:
    data = _mux_up(2).data
    forms = {
        "plain": data.hex(),
        "plain, spaced and wrapped": "\n".join(
            " ".join(data[i:i + 8].hex(" ").split()) for i in range(0, len(data), 8)),
        "xxd": _xxd(data),
        "xxd -p": "\n".join(data[i:i + 30].hex() for i in range(0, len(data), 30)),
        "hexdump -C": _hexdump_c(data),
        "docs": "\n".join(f"{i:04x}  {data[i:i + 16].hex(' ')}" for i in range(0, len(data), 16)),
        "od -Ax -tx1z": _od_z(data),
    }
    for name, text in forms.items():
        assert parse_hex_dump(text) == data, name
    # a leading token is an offset only when it counts the bytes so far
    assert parse_hex_dump("c0170df1  02000000") == bytes.fromhex("c0170df102000000")
    with pytest.raises(ValueError, match=r"line 2: not hex"):
        parse_hex_dump("00 01\nzz\n")


@pytest.mark.parametrize("fn", [parse_hex_dump, read_hex_dump])
def test_hex_text_that_is_not_text_is_a_local_error_naming_it(fn: Any) -> None:
    # bytes gave a bare TypeError naming no argument
    with pytest.raises(InvalidValue) as ei:
        fn(b"00 01")
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == ("text must be hex text (a str), got bytes: decode it first, e.g. "
                             "data.decode('ascii')")
    assert ei.value.error_id == "capture.bad_type"
    assert ei.value.fields == {"field": "text", "expected": "hex text (a str)", "got": "bytes",
                               "hint": ": decode it first, e.g. data.decode('ascii')"}
    with pytest.raises(InvalidValue, match=r"^text must be hex text \(a str\), got None$"):
        fn(None)


@pytest.mark.parametrize("fn", [parse_hex_dump, read_hex_dump])
@pytest.mark.parametrize("limit", [-1, 2.5, 4.0, True, "8", None])
def test_a_hex_limit_that_is_no_byte_count_is_a_local_error_naming_it(fn: Any,
                                                                     limit: Any) -> None:
    # -1 read as "more than the -1 allowed"; 2.5 was taken as a limit
    with pytest.raises(InvalidValue) as ei:
        fn("00 01 02", limit)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "capture.bad_limit"
    assert ei.value.fields == {"field": "limit", "value": limit}
    assert str(ei.value) == (f"limit = {limit!r} is invalid: not a byte count (a whole number "
                             ">= 0)")
    # a whole number, a NumPy one too, is a limit
    assert parse_hex_dump("00 01 02", np.int64(3)) == b"\x00\x01\x02"
    assert parse_hex_dump("", 0) == b""


def test_a_dump_copied_from_the_protocol_doc_with_its_code_fence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the fence lines were taken for hex: "line 1: not hex"
    doc = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text("utf-8")
    blocks = re.findall(r"^```text\n(0000  [^`]*?)^```$", doc, flags=re.M)
    assert blocks, "no hex dump in docs/protocol.md"
    inner = max(blocks, key=len)  # the longest: several lines
    data = parse_hex_dump(inner)
    assert len(data) > 32
    for fenced in (f"```text\n{inner}```\n", f"```\n{inner}```", f"  ~~~\n{inner}~~~\n"):
        assert parse_hex_dump(fenced) == data
    path = tmp_path / "example.md"
    path.write_text(f"```text\n{inner}```\n", encoding="utf-8")
    assert main(["decode", "--hex", str(path)]) == EXIT_OK
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["type"] == "end"
    with pytest.raises(ValueError, match=r"line 1: not hex"):  # a fence opens a line only
        parse_hex_dump("00 ```\n")


def _od(data: bytes, start: int = 0) -> str:
    """``od -Ax -tx1`` output: 6-digit offsets, single spaces, the closing offset, and ``*`` for
    lines equal to the one before (as od prints without ``-v``)."""
    lines, before = [], None
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        if chunk == before and len(chunk) == 16:
            if lines[-1] != "*":
                lines.append("*")
            continue
        lines.append(f"{start + off:06x} " + " ".join(f"{b:02x}" for b in chunk))
        before = chunk
    return "\n".join([*lines, f"{start + len(data):06x}"]) + "\n"


def test_od_dumps_repeated_lines_and_dumps_from_past_byte_0() -> None:
    # od's offsets were read as data bytes; `xxd -s N` was "not hex"; the '*' that hexdump -C
    # and od print for repeated lines (a tensor of zeros) was "not hex"
    data = _mux_up(2).data
    assert parse_hex_dump(_od(data)) == data
    zeros = data[:16] + bytes(80) + data[16:]  # five lines of zeros: one printed, then '*'
    assert "*" in _od(zeros).splitlines() and parse_hex_dump(_od(zeros)) == zeros
    hexdump = _hexdump_c(zeros).splitlines()
    folded = [ln for i, ln in enumerate(hexdump) if not 2 <= i <= 5]
    folded.insert(2, "*")
    assert parse_hex_dump("\n".join(folded)) == zeros
    xxd = _xxd(data).splitlines()
    shifted = [f"{int(ln[:8], 16) + 4:08x}{ln[8:]}" for ln in xxd]  # as `xxd -s 4` prints them
    assert read_hex_dump("\n".join(shifted)) == HexDump(4, data)
    past = [f"{int(ln[:8], 16) + 4:08x}{ln[8:]}" for ln in _hexdump_c(data).splitlines()[:-1]]
    assert read_hex_dump("\n".join(past)) == HexDump(4, data)
    assert read_hex_dump(data.hex()) == HexDump(0, data)
    # forms plain hex can take are offsets only when they count from 0
    assert read_hex_dump(_od(data, 4)) == HexDump(4, data)  # od -j 4
    assert parse_hex_dump("0004 c0 17") == bytes.fromhex("0004c017")
    assert parse_hex_dump("c0170df1  02000000") == bytes.fromhex("c0170df102000000")
    with pytest.raises(ValueError, match=r"^line 1: '\*' repeats no dump line before it$"):
        parse_hex_dump("*\n0010  00")
    with pytest.raises(ValueError, match=r"^line 2: '\*' repeats no dump line before it$"):
        parse_hex_dump("00 01 02 03\n*\n")  # plain hex has no dump line to repeat
    with pytest.raises(ValueError, match=r"^line 3: a dump line without its offset after the "
                                         r"'\*' of line 2$"):
        parse_hex_dump("000000 00 01\n*\n02 03")


def test_cli_decodes_what_od_prints_from_past_the_channel_magic(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    sent = _mux_up(2)
    raw = tmp_path / "mux.bin"
    raw.write_bytes(sent.data)
    whole = tmp_path / "whole.txt"  # the real od (coreutils), not a model of its output
    whole.write_text(subprocess.run(["od", "-Ax", "-tx1", str(raw)], capture_output=True,
                                    text=True, check=True).stdout)
    assert main(["decode", "--hex", "--salt", SALT.hex(), str(whole)]) == EXIT_OK
    full = _json_lines(capsys.readouterr().out)
    assert [r["offset"] for r in full[1:-1]] == sent.offsets[1:]
    past = tmp_path / "past.txt"  # after the 4-byte channel magic: records only
    past.write_text(subprocess.run(["od", "-Ax", "-tx1", "-j", "4", str(raw)],
                                   capture_output=True, text=True, check=True).stdout)
    assert main(["decode", "--hex", "--leg", "mux", "--salt", SALT.hex(), str(past)]) == EXIT_OK
    got = capsys.readouterr()
    assert got.err == ("flodl-proto decode: the hex dump starts at byte 4 of its stream (0x4); "
                       "the offsets below count from the dump's first byte\n")
    records = _json_lines(got.out)
    assert [r["offset"] for r in records[:-1]] == [o - 4 for o in sent.offsets[1:]]
    assert [r["type"] for r in records[:-1]] == [r["type"] for r in full[1:-1]]


def test_a_dump_whose_offsets_skip_or_restart_is_refused_naming_the_line() -> None:
    # a line left out, or two docs dumps pasted one after the other: the next line's offset was
    # taken as two data bytes, and the decode failed later with a misleading magic error
    data = _mux_up(2).data
    docs = [f"{i:04x}  {data[i:i + 16].hex(' ')}" for i in range(0, len(data), 16)]
    with pytest.raises(ValueError, match=r"^line 3: offset 0000 where 0020 was expected \(a line "
                                         r"left out, or two dumps one after the other\)$"):
        parse_hex_dump("\n".join(docs[:2] + docs))
    with pytest.raises(ValueError, match=r"^line 2: offset 0020 where 0010 was expected"):
        parse_hex_dump("\n".join(docs[:1] + docs[2:]))
    xxd = _xxd(data).splitlines()
    with pytest.raises(ValueError, match=r"^line 2: offset 00000020 where 00000010 was expected"):
        parse_hex_dump("\n".join(xxd[:1] + xxd[2:]))
    hexdump = _hexdump_c(data).splitlines()
    with pytest.raises(ValueError, match=r"^line 2: offset 00000020 where 00000010 was expected"):
        parse_hex_dump("\n".join(hexdump[:1] + hexdump[2:]))


_ZEROS_LINE = "00000000  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|"


def test_a_star_line_is_expanded_only_within_the_limit() -> None:
    """A '*' line then a far offset (230 bytes of text) stood for up to 4 GiB, allocated whole
    whatever ``--max-input`` said; the bytes it stands for are now counted before it expands."""
    ones = "01 " * 16
    dump = f"{_ZEROS_LINE}\n*\n00000100  {ones.strip()}  |................|\n"
    assert parse_hex_dump(dump, limit=272) == bytes(256) + b"\x01" * 16
    with pytest.raises(HexDumpTooLarge, match=r"^line 3: the '\*' of line 2 repeats the line "
                                              r"before it up to offset 100: 256 bytes, more than "
                                              r"the 255 allowed$"):
        parse_hex_dump(dump, limit=255)
    with pytest.raises(HexDumpTooLarge, match=r"^line 3: 272 bytes, more than the 271 allowed$"):
        parse_hex_dump(dump, limit=271)
    # the '*' fills up to exactly the limit: it expands, and the next line is what goes over
    with pytest.raises(HexDumpTooLarge, match=r"^line 3: 272 bytes, more than the 256 allowed$"):
        parse_hex_dump(dump, limit=256)
    far = f"{_ZEROS_LINE}\n*\nfffffffffffffff0  {ones.strip()}  |................|\n"
    with pytest.raises(HexDumpTooLarge, match=r"up to offset fffffffffffffff0: "
                                              r"18446744073709551600 bytes, more than the "
                                              r"4294967296 allowed$"):
        parse_hex_dump(far)  # the default limit: 4 GiB


def test_an_offset_wider_than_64_bits_is_refused_naming_the_line() -> None:
    """An ``xxd`` line whose offset had 5000 digits was read; ``decode --hex`` then failed with
    a traceback printing it in decimal (more digits than int-to-str converts)."""
    with pytest.raises(ValueError, match=r"^line 1: an offset of 5000 hex digits, wider than a "
                                         r"64-bit one \(16\)$"):
        parse_hex_dump("9" * 5000 + ": 0011 2233")
    with pytest.raises(ValueError, match=r"^line 2: an offset of 17 hex digits"):
        parse_hex_dump(f"{_ZEROS_LINE}\n1{'0' * 16}  00 01\n")
    # 17 digits that are not a dump's offset stay plain hex; leading zeros are no width
    assert parse_hex_dump("1" + "0" * 17 + "  00 01") == bytes.fromhex("1" + "0" * 17 + "0001")
    assert read_hex_dump("0" * 20 + "4: c017") == HexDump(4, b"\xc0\x17")


def test_cli_refuses_a_dump_standing_for_more_than_max_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "bomb.hd"
    bomb.write_text(f"{_ZEROS_LINE}\n*\n40000000  {'01 ' * 16}|................|\n")
    assert main(["decode", "--hex", "--leg", "frame", "--max-input", "100000", str(bomb)]) == 1
    assert capsys.readouterr() == ("", (
        "flodl-proto decode: error: the hex dump stands for more bytes than --max-input: line 3: "
        "the '*' of line 2 repeats the line before it up to offset 40000000: 1073741824 bytes, "
        "more than the 100000 allowed; give a larger --max-input to decode it\n"))
    wide = tmp_path / "wide.hex"
    wide.write_text("9" * 5000 + ": 0011 2233\n")
    assert main(["decode", "--hex", str(wide)]) == 1
    assert capsys.readouterr() == ("", "flodl-proto decode: error: not a hex dump: line 1: an "
                                       "offset of 5000 hex digits, wider than a 64-bit one (16)\n")


def test_cli_names_a_dump_whose_offsets_skip_without_calling_it_not_hex(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _mux_up(2).data
    docs = [f"{i:04x}  {data[i:i + 16].hex(' ')}" for i in range(0, len(data), 16)]
    dump = tmp_path / "skip.hex"
    dump.write_text("\n".join(docs[:1] + docs[2:]), encoding="ascii")
    assert main(["decode", "--hex", str(dump)]) == EXIT_ERROR
    assert capsys.readouterr() == (
        "", "flodl-proto decode: error: the hex dump's offsets do not follow on: line 2: offset "
            "0020 where 0010 was expected (a line left out, or two dumps one after the other)\n")


def test_the_docs_worked_example_decodes(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    m = re.search(r"### 5\.1 Rank handshake.*?```text\n(.*?)```", doc, re.S)
    assert m is not None
    dump = tmp_path / "hs.txt"
    dump.write_text(m.group(1), encoding="ascii")
    assert main(["decode", "--hex", str(dump)]) == EXIT_OK
    captured = capsys.readouterr()
    assert "loopback leg (the rank handshake" in captured.err
    first = _json_lines(captured.out)[0]
    assert (first["type"], first["rank"], first["world_size"], first["version"]) == (
        "handshake", 3, 4, 2)


@pytest.mark.parametrize(("name", "version"), STREAMS)
def test_a_capture_that_ends_mid_record_says_so(name: str, version: int) -> None:
    leg, build = BUILDERS[name]
    sent = build(version)
    last = sent.offsets[-2]  # a frame record; the capture stops just past its header
    cut = last + (25 if leg == "mux" else 4) + 1
    rep = decode_stream(sent.data[:cut], leg, salt=SALT, version=version)
    fin = rep.final_record()
    assert rep.exit_code == EXIT_CAPTURE_ENDED and fin["type"] == "capture_ended"
    assert fin["offset"] == last
    assert fin["error"].startswith(f"capture ended inside a record at offset {last} ")
    assert len(rep.records) == len(sent.offsets) - 2
    table = list(format_table(rep))
    assert "CAPTURE ENDED" in table[-1]


def test_a_damaged_record_is_still_a_protocol_error() -> None:
    sent = _mux_down(2)
    bad = bytearray(sent.data)
    bad[sent.offsets[1]] ^= 0x55  # the magic of the first Broadcast
    rep = decode_stream(bytes(bad[:-3]), "mux", salt=SALT, version=2)
    assert rep.exit_code == EXIT_ERROR and rep.final_record()["type"] == "error"


def test_decode_salt_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    salt = tmp_path / "salt.hex"
    salt.write_text(SALT.hex() + "\n", encoding="ascii")
    raw = tmp_path / "mux.bin"
    raw.write_bytes(_mux_up(2).data)
    assert main(["decode", "--salt-file", str(salt), str(raw)]) == EXIT_OK
    assert _json_lines(capsys.readouterr().out)[-1]["bad_tags"] == 0
    # a salt file that cannot be read is a bad command line, as a malformed --salt is (exit 2)
    assert main(["decode", "--salt-file", str(tmp_path / "none"), str(raw)]) == 2
    assert capsys.readouterr().err == (f"flodl-proto decode: error: argument --salt-file: "
                                       f"{shown(str(tmp_path / 'none'))}: "
                                       "No such file or directory\n")


@pytest.mark.parametrize("port", ["0", "-1", "65536", "http"])
def test_decode_port_outside_the_tcp_range_is_a_usage_error(
        port: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--port`` selects the TCP streams of a capture: 1..65535, as ``dissector --port``
    (70000 or -1 was taken, and the capture's error was reported instead, exit 1)."""
    capture = tmp_path / "empty.pcap"
    capture.write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        main(["decode", "--pcap", "--port", port, str(capture)])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    why = f"not a port number: {port!r}" if port == "http" else f"port {port} is not in 1..65535"
    assert err == f"flodl-proto decode: error: argument --port: {why}"


def test_cli_frame_ceiling_reaches_the_decoder(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    # runs with a ceiling above 1 GiB (controller, relay and rank take --frame-ceiling) made
    # captures decode could not read past a large record
    import flodl_proto.decode as decode_mod

    seen: list[int] = []
    real = decode_mod.decode_stream

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["ceiling"])
        return real(*args, **kwargs)

    monkeypatch.setattr(decode_mod, "decode_stream", spy)
    path = tmp_path / "in.bin"
    path.write_bytes(_mux_up(3).data)
    assert main(["decode", "--frame-ceiling", "4294967295", "--protocol-version", "3",
                 str(path)]) == EXIT_OK
    assert main(["decode", "--protocol-version", "3", str(path)]) == EXIT_OK
    # the first chunk's look (does it end at an error?), then the decode, with the ceiling given
    assert seen == [4294967295, 4294967295, 1 << 30, 1 << 30]
    capsys.readouterr()
    assert main(["decode", "--frame-ceiling", "4294967296", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flodl-proto decode: error: argument --frame-ceiling: ")
    assert "4294967296" in err
    assert len(err.splitlines()) == 1


def test_an_input_no_leg_starts_is_refused_after_its_first_chunk(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `decode /dev/zero` read 4 GiB (the default --max-input) before saying the first bytes are
    # no leg; the input is now judged on its first chunk: here the length limit is never reached
    path = tmp_path / "zeros.bin"
    path.write_bytes(bytes(8 << 20))
    assert main(["decode", "--max-input", str(4 << 20), str(path)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", (
        "flodl-proto decode: error: cannot tell the leg from the first bytes (0000000000000000): "
        "not a channel magic, handshake, ack, RoundFrame, mux record or length-prefixed frame; "
        "name it with --leg\n"))


_NO_LEG = ("flodl-proto decode: error: {label}cannot tell the leg from the first bytes "
           "(6330203137203064): not a channel magic, handshake, ack, RoundFrame, mux record or "
           "length-prefixed frame; name it with --leg")


def test_the_command_names_its_options_where_the_library_names_its_arguments(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # detect_leg's refusal says decode_stream's leg= and parse_hex_dump; the command says --leg
    # and --hex, and --hex only where it applies (not to --hex input, nor to a capture's stream)
    text = b"c0 17 0d f1 02 00 00 00\n"
    raw = tmp_path / "hex.txt"
    raw.write_bytes(text)
    assert main(["decode", str(raw)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", _NO_LEG.format(label="")
                                   + "; they read as hex text: decode it with --hex\n")
    twice = tmp_path / "hex-of-hex.txt"
    twice.write_text(text.hex())
    assert main(["decode", "--hex", str(twice)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", _NO_LEG.format(label="") + "\n")
    cap = tmp_path / "cap.pcap"
    cap.write_bytes(_pcap(_connection(("10.0.0.2", 40001), ("10.0.0.1", 1337), text, b"")))
    assert main(["decode", "--pcap", str(cap), "--port", "1337"]) == EXIT_ERROR
    err = capsys.readouterr().err.splitlines()
    assert _NO_LEG.format(label="10.0.0.2:40001 -> 10.0.0.1:1337: ") in err


@pytest.mark.parametrize(("leg", "error_id"), [("mux", "mux.bad_magic"),
                                               ("frame", "frame.bad_magic"),
                                               ("auto", "mux.bad_magic")])
def test_an_input_that_fails_in_its_first_chunk_is_not_read_further(
        leg: str, error_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `decode --leg frame < /dev/zero` read 4 GiB (the default --max-input) before reporting the
    # bad magic at byte 0: decoding stops at the first error, so the first chunk decides
    path = tmp_path / "bad.bin"
    bad = encode_channel_magic() + bytes(64) if leg == "auto" else bytes(64)
    path.write_bytes(bad + bytes(8 << 20))
    assert main(["decode", "--leg", leg, "--max-input", str(4 << 20), str(path)]) == EXIT_ERROR
    out, err = capsys.readouterr()
    assert err == ("" if leg != "auto" else
                   "flodl-proto decode: mux leg (channel magic 0xf10d17e1; --leg to choose)\n")
    final = json.loads(out.splitlines()[-1])
    assert (final["type"], final["offset"], final["error_id"]) == (
        "error", 4 if leg == "auto" else 0, error_id)  # after the 4-byte channel magic
    # an input whose first chunk ends inside a record is read on: here, past --max-input
    record = _mux_header_announcing(1 << 30)
    path.write_bytes(encode_channel_magic() + record + bytes(8 << 20))
    assert main(["decode", "--leg", "mux", "--max-input", str(4 << 20), str(path)]) == EXIT_ERROR
    assert "longer than --max-input" in capsys.readouterr().err


def _mux_header_announcing(payload_len: int) -> bytes:
    """A HostFrame mux record header announcing ``payload_len`` payload bytes (a zero tag),
    without the payload: an input of it and zeros ends inside a record until that length."""
    from flodl_proto.spec import MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC

    return struct.pack("<LLBLL8s", MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION,
                       int(RecordKind.HOST_FRAME), 0, payload_len, bytes(8))


# -------------------------------------------------------------------------------------------------
# memory: the input is held once, and an input this machine cannot hold is one error line
# -------------------------------------------------------------------------------------------------
_PEAK_RSS = """
import sys
from flodl_proto.cli import main
try:
    code = main(sys.argv[1:])
finally:  # the peak RSS of this program (VmHWM starts afresh at exec; ru_maxrss does not)
    with open("/proc/self/status") as f:
        peak = next(ln.split()[1] for ln in f if ln.startswith("VmHWM:"))
    print(f"peak-rss-kib {peak}", file=sys.stderr)
sys.exit(code)
"""


def _decode_child(args: list[str], cwd: Path,
                  preexec: Callable[[], None] | None = None) -> tuple[int, str, int]:
    """Run ``flodl-proto decode ARGS`` (this checkout) in a process of its own; return its exit
    code, its stderr and its peak resident set size in bytes."""
    import os
    import subprocess

    p = subprocess.run([sys.executable, "-B", "-c", _PEAK_RSS, "decode", *args], cwd=cwd,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=preexec)
    *err, last = p.stderr.splitlines(keepends=True)
    assert last.startswith("peak-rss-kib "), p.stderr
    return p.returncode, "".join(err), int(last.split()[1]) * 1024


def test_a_file_is_held_once_in_memory(tmp_path: Path) -> None:
    # the input was read in chunks and joined: twice its size at the peak
    size = 128 << 20
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    # a record announcing nearly all of the file: its first chunk decides nothing, so the
    # whole file is read
    head = encode_channel_magic() + _mux_header_announcing(size - 33)
    small.write_bytes(head)
    with big.open("wb") as f:
        f.write(head)
        f.truncate(size)  # sparse: written at no cost
    code, _err, base = _decode_child(["--leg", "mux", str(small)], tmp_path)
    assert code == EXIT_CAPTURE_ENDED
    code, _err, peak = _decode_child(["--leg", "mux", str(big)], tmp_path)
    assert code == EXIT_ERROR  # zeros are no HostFrame
    assert 0.75 * size < peak - base < 1.25 * size, (peak - base) / size  # read once, held once


def test_an_input_larger_than_memory_is_one_error_line(tmp_path: Path) -> None:
    # a process held to 1.5 GiB of address space is given a 4 GiB file (under --max-input): the
    # buffer of the file's size cannot be allocated; that was a MemoryError traceback
    def held() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))

    big = tmp_path / "big.bin"
    with big.open("wb") as f:  # a record its first chunk does not end: the file must be read
        f.write(encode_channel_magic() + _mux_header_announcing(1 << 30))
        f.truncate((4 << 30) - 1)
    code, err, _peak = _decode_child(["--leg", "mux", str(big)], tmp_path, held)
    assert (code, err) == (EXIT_ERROR, (
        "flodl-proto decode: error: not enough memory to read and decode the input; decode a "
        "shorter capture, or cap what is read with --max-input\n"))


def test_a_regular_file_over_max_input_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from flodl_proto.commands import decode as command

    class Counted(io.FileIO):
        given = 0

        def read(self, size: int = -1, /) -> bytes:
            got = super().read(size)
            Counted.given += len(got)
            return got

        def readinto(self, buf: Any, /) -> int:
            n = super().readinto(buf)
            Counted.given += n or 0
            return n or 0

    path = tmp_path / "in.bin"
    path.write_bytes(bytes(range(256)) * (12 << 12))  # 12 MiB
    with Counted(path, "rb") as f, pytest.raises(command._InputTooLarge):
        command._read_limited(f, 8 << 20)
    assert Counted.given == command._CHUNK  # the first chunk only, not the 8 MiB allowed
    Counted.given = 0
    with Counted(path, "rb") as f:
        got = command._read_limited(f, 12 << 20)
    assert got == path.read_bytes() and Counted.given == 12 << 20


def test_an_unknown_leg_is_local_misuse() -> None:
    # it was a bare ValueError: not a protocol library error, and not told from a peer's
    from flodl_proto.errors import InvalidValue, LocalProtocolError

    with pytest.raises(LocalProtocolError) as info:
        decode_stream(b"", "bogus")  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidValue) and not info.value.remote
    assert info.value.error_id == "stream.unknown_leg"
    assert str(info.value) == ("unknown leg 'bogus': mux, loopback or frame (detect_leg tells it "
                               "from the first bytes)")


@pytest.mark.parametrize(("leg", "data"), [
    ("frame", b""), ("frame", FRAME_55), ("loopback", b""),
    ("loopback", encode_handshake(0, 2, 2)), ("mux", b""), ("mux", bytes.fromhex("e1170df1")),
])
@pytest.mark.parametrize("ceiling", [-5, 1.5e9, True, "1024"])
def test_a_bad_ceiling_is_local_misuse(leg: Leg, data: bytes, ceiling: Any) -> None:
    # the frame and loopback legs took it as the stream's failure at offset 0, and as no
    # failure at all for an empty input (the mux leg's reader refused it)
    from flodl_proto.errors import InvalidValue, LocalProtocolError

    with pytest.raises(LocalProtocolError) as info:
        decode_stream(data, leg, ceiling=ceiling)
    assert isinstance(info.value, InvalidValue) and not info.value.remote
    assert info.value.error_id == "ceiling.invalid"
    assert str(info.value) == ("frame ceiling must be a non-negative number of bytes, got "
                               f"{ceiling!r}")


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_a_capture_file_without_pcap_says_to_read_it_with_pcap(
        fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flodl_proto.pcap import capture_format

    from .pcap_writer import Capture

    cap = Capture()
    c = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(c, True, encode_handshake(0, 2, 2))
    # pcapng: a section header block's first bytes (the leg is judged on them only)
    data = cap.pcap() if fmt == "pcap" else bytes.fromhex("0a0d0d0a1c0000004d3c2b1a") + bytes(64)
    assert capture_format(data) == fmt
    path = tmp_path / f"c.{fmt}"
    path.write_bytes(data)
    assert main(["decode", str(path)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", (
        f"flodl-proto decode: error: the input is a {fmt} capture file, not the bytes of a leg: "
        "read it with --pcap --port N (N: the flodl connections' TCP port)\n"))
    assert capture_format(encode_handshake(0, 2, 2)) is None
    assert capture_format(b"\xd4\xc3") is None


@pytest.mark.parametrize(("args", "message"), [
    (("--hex",), "input is not hex: byte 0x00 at offset 0 (--hex takes hex text)"),
    (("--pcap", "--port", "1"),
     "not a libpcap or pcapng capture: it starts with 00000000, no capture file's magic"),
])
def test_hex_and_pcap_input_is_refused_on_its_first_chunk(
        args: tuple[str, ...], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # `decode --hex /dev/zero` and `decode --pcap ... /dev/zero` read 4 GiB (the default
    # --max-input) before saying so: here the input is over --max-input, which is never reached
    path = tmp_path / "zeros.bin"
    path.write_bytes(bytes(8 << 20))
    assert main(["decode", *args, "--max-input", str(4 << 20), str(path)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", f"flodl-proto decode: error: {message}\n")


def test_an_empty_pcap_file_is_no_capture(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # a capture file nothing was written to (tcpdump killed before its first write)
    path = tmp_path / "empty.pcap"
    path.write_bytes(b"")
    assert main(["decode", "--pcap", "--port", "1", str(path)]) == EXIT_ERROR
    assert capsys.readouterr() == (
        "", "flodl-proto decode: error: not a libpcap or pcapng capture: it is empty\n")


def test_hex_text_with_a_control_byte_names_its_offset(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    # past the first chunk too: the whole text is checked the same way
    path = tmp_path / "dump.txt"
    path.write_bytes(b"00 01\n" * (300_000) + b"02\x07\n")
    assert main(["decode", "--hex", str(path)]) == EXIT_ERROR
    assert capsys.readouterr().err == (
        f"flodl-proto decode: error: input is not hex: byte 0x07 at offset {6 * 300_000 + 2} "
        "(--hex takes hex text)\n")


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_stream_with_bytes_missing_is_a_capture_that_ended_not_a_clean_end(
        fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a hole in the capture right after a record: the warning was printed, but the table said
    # "END clean end of stream" and the exit code was 0
    from .pcap_writer import ACK, PSH, SYN, pcap_file, tcp_packet

    relay, ctrl = ("10.0.0.2", 40001), ("10.0.0.1", 35863)
    magic = struct.pack("<I", CHANNEL_MAGIC_DATA)
    packets = [tcp_packet(relay, ctrl, 1000, 0, SYN),
               tcp_packet(relay, ctrl, 1001, 0, PSH | ACK, magic)]
    packets += [tcp_packet(relay, ctrl, 1005 + (1 << 30) + 100 * i, 0, PSH | ACK, bytes(100))
                for i in range(2)]
    path = tmp_path / "hole.pcap"
    path.write_bytes(pcap_file(packets))
    assert main(["decode", "--pcap", "--port", "35863", "--format", fmt, str(path)]) == (
        EXIT_CAPTURE_ENDED)
    out, err = capsys.readouterr()
    label = "10.0.0.2:40001 -> 10.0.0.1:35863"
    assert err.splitlines()[0] == (f"flodl-proto decode: warning: {label}: bytes missing from "
                                   "the capture after stream offset 4; decoding stops there")
    why = "bytes missing from the capture after offset 4; decoding stops there"
    if fmt == "table":
        assert "clean" not in out
        assert out.splitlines()[-1] == f"       4            {'CAPTURE ENDED':<20} {'':<9} {why}"
    else:
        assert _json_lines(out)[-1] == {"stream": label, "type": "capture_ended", "offset": 4,
                                        "error_id": None, "error": why}


def test_packets_cut_short_with_caplen_equal_to_len_are_a_capture_that_ended(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 60-byte packets whose IP header claims more (a cut copy that records caplen == len): both
    # directions said "no bytes in this direction; skipped", no warning, exit 0
    from .pcap_writer import ACK, PSH, SYN, pcap_file, tcp_packet

    relay, ctrl = ("10.0.0.2", 40001), ("10.0.0.1", 35863)

    def cut(src: tuple[str, int], dst: tuple[str, int], seq: int, payload: bytes) -> bytes:
        whole = bytearray(tcp_packet(src, dst, seq, 0, PSH | ACK, bytes(12) + payload))
        whole[14 + 20 + 12] = 8 << 4  # a 32-byte TCP header: 12 bytes of options
        return bytes(whole[:60])

    packets = [tcp_packet(relay, ctrl, 1000, 0, SYN), tcp_packet(ctrl, relay, 5000, 0, SYN | ACK),
               cut(relay, ctrl, 1001, struct.pack("<I", CHANNEL_MAGIC_DATA) + bytes(200)),
               cut(ctrl, relay, 5001, bytes(300))]
    path = tmp_path / "snap60.pcap"
    path.write_bytes(pcap_file(packets))
    assert main(["decode", "--pcap", "--port", "35863", str(path)]) == EXIT_CAPTURE_ENDED
    out, err = capsys.readouterr()
    assert out == ""
    for a, b in ((relay, ctrl), (ctrl, relay)):
        label = f"{a[0]}:{a[1]} -> {b[0]}:{b[1]}"
        assert (f"flodl-proto decode: warning: {label}: bytes missing from the capture after "
                "stream offset 0; decoding stops there") in err.splitlines()


def test_a_direction_that_carried_no_byte_is_skipped_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a refused connection (SYN, then RST) was listed as two streams "mux leg (too short to
    # tell)" with a clean end each
    from .pcap_writer import Capture

    cap = Capture()
    refused = cap.connect(("127.0.0.1", 40001), ("127.0.0.1", 23460))
    cap.close(refused)
    c = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(c, True, encode_handshake(0, 2, 2))
    cap.close(c)
    path = tmp_path / "c.pcap"
    path.write_bytes(cap.pcap())
    assert main(["decode", "--pcap", "--port", "23460", str(path)]) == EXIT_OK
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "flodl-proto decode: 127.0.0.1:40001 -> 127.0.0.1:23460: no bytes in this direction; "
        "skipped",
        "flodl-proto decode: 127.0.0.1:23460 -> 127.0.0.1:40001: no bytes in this direction; "
        "skipped",
        "flodl-proto decode: 127.0.0.1:40002 -> 127.0.0.1:23460: loopback leg (the rank "
        "handshake; --leg to choose)",
        "flodl-proto decode: 127.0.0.1:23460 -> 127.0.0.1:40002: no bytes in this direction; "
        "skipped"]
    assert {json.loads(line)["stream"] for line in out.splitlines()} == {
        "127.0.0.1:40002 -> 127.0.0.1:23460"}


def _many_frames(n: int) -> bytes:
    frame = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.array([1.0, -2.5, 3.25, 0.0], np.float32))]), SALT)
    return frame * n


def test_records_handed_on_are_not_kept_and_match_the_kept_ones() -> None:
    data = _many_frames(5) + b"\x01\x02"  # five frames, then a cut
    kept = decode_stream(data, "frame", salt=SALT)
    seen: list[dict[str, Any]] = []
    handed = decode_stream(data, "frame", salt=SALT, on_record=seen.append)
    assert handed.records == [] and seen == kept.records and len(seen) == 5
    assert (handed.count, kept.count) == (5, 5)
    assert handed.final_record() == kept.final_record()
    assert handed.exit_code == kept.exit_code == EXIT_CAPTURE_ENDED
    clean = decode_stream(_many_frames(3), "frame", on_record=lambda rec: None)
    assert clean.final_record() == {"type": "end", "offset": 3 * len(_many_frames(1)),
                                    "records": 3}


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_cli_prints_what_the_report_holds(fmt: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from flodl_proto.decode import format_table

    data = _many_frames(4) + b"\x01"
    path = tmp_path / "frames.bin"
    path.write_bytes(data)
    assert main(["decode", "--leg", "frame", "--format", fmt, "--salt", SALT.hex(),
                 str(path)]) == EXIT_CAPTURE_ENDED
    report = decode_stream(data, "frame", salt=SALT)
    want = (list(format_table(report)) if fmt == "table" else
            [json.dumps(r) for r in [*report.records, report.final_record()]])
    assert capsys.readouterr().out.splitlines() == want


def test_a_long_stream_is_decoded_in_flat_memory(tmp_path: Path) -> None:
    # every record was kept until the end: 100,000 frames of 42 bytes peaked at over 100 MB more
    # than 10,000 did (and nothing was printed before the last was decoded); kept records cost
    # over 1 KiB each, so 45,000 more frames peak some 60 MB higher where the bound is 10 MB
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(_many_frames(5_000))
    big.write_bytes(_many_frames(50_000))
    grown = big.stat().st_size - small.stat().st_size
    code, _err, base = _decode_child(["--leg", "frame", str(small)], tmp_path)
    assert code == EXIT_OK
    code, _err, peak = _decode_child(["--leg", "frame", str(big)], tmp_path)
    assert code == EXIT_OK
    assert peak - base < 4 * grown, (peak - base, grown)  # the input held once, records not


_NOT_A_LEG = ("cannot tell the leg from the first bytes ({head}): not a channel magic, handshake, "
              "ack, RoundFrame, mux record or length-prefixed frame; name it with {leg}")


@pytest.mark.parametrize("text", [b"{}\n" + bytes(8), b"  \n\t[1, 2, 3]\n",
                                  b"\xef\xbb\xbf{\"cases\": []}", b"        {\"a\": 1}"])
def test_a_json_stream_is_said_to_look_like_json(text: bytes) -> None:
    # a vector file given to decode read only "cannot tell the leg from the first bytes
    # (7b0a...)": JSON (an object or an array, after blanks) is named, with what reads vectors
    with pytest.raises(UnknownLeg) as ei:
        detect_leg(text)
    assert (ei.value.json, ei.value.hex_text, ei.value.http) == (True, False, False)
    assert str(ei.value) == _NOT_A_LEG.format(
        head=text[:8].hex(), leg="decode_stream's leg= (mux, loopback or frame)") + (
        "; they look like JSON (a vector file? flodl_proto.interop.vectors.iter_file_cases "
        "reads those)")
    # bytes that are no JSON's start get no such words
    with pytest.raises(UnknownLeg) as not_json:
        detect_leg(b"  x{\"a\": 1}")
    assert not not_json.value.json and "JSON" not in str(not_json.value)


def test_decode_of_a_vector_file_names_the_vectors_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = BUNDLED / "v2" / "round_frame.json"
    head = path.read_bytes()[:8].hex()
    assert head.startswith("7b")  # '{'
    assert main(["decode", str(path)]) == EXIT_ERROR
    line = _NOT_A_LEG.format(head=head, leg="--leg")
    assert capsys.readouterr() == ("", (
        f"flodl-proto decode: error: {line}; they look like JSON (a vector file? "
        "'flodl-proto vectors check FILE' reads those)\n"))
    # the command it names reads the file
    assert main(["vectors", "check", str(path)]) == EXIT_OK
    capsys.readouterr()
    # --hex input is text already: its bytes get neither the hex nor the JSON words
    text = tmp_path / "json.hex"
    text.write_text(b"[1, 2, 3, 4]".hex())
    assert main(["decode", "--hex", str(text)]) == EXIT_ERROR
    assert capsys.readouterr() == ("", "flodl-proto decode: error: " + _NOT_A_LEG.format(
        head=b"[1, 2, 3, 4]"[:8].hex(), leg="--leg") + "\n")


#: (the stream, the leg it is, what detect_leg says of its first bytes)
_LEG_STARTS: dict[str, tuple[Callable[[], bytes], Leg, str]] = {
    "mux up": (lambda: _mux_up(2).data, "mux", "channel magic 0xf10d17e1"),
    "mux down": (lambda: _mux_down(2).data, "mux", "a mux record header"),
    "loopback up": (lambda: _loop_up(2).data, "loopback", "the rank handshake"),
    "loopback down": (lambda: _loop_down(2).data, "loopback", "the relay's handshake ack"),
    "loopback blobs": (lambda: b"".join(encode_framed_round(_frames(2)[0], SALT)), "loopback",
                       "a length prefix and a RoundFrame"),
    "frames": (lambda: encode_round_frame_bytes(_frames(2)[0], SALT), "frame",
               "a bare RoundFrame"),
}


@pytest.mark.parametrize("name", list(_LEG_STARTS))
@pytest.mark.parametrize("leg", ["mux", "loopback", "frame"])
def test_a_wrong_leg_names_the_leg_the_first_bytes_start(name: str, leg: Leg) -> None:
    # decode --leg frame on a mux capture stopped at a bare "frame magic 0xf10d17d0 !=
    # 0xf10d17f1": the leg the first bytes start is said after the reader's words
    make, real, why = _LEG_STARTS[name]
    data = make()
    report = decode_stream(data, leg)
    if leg == real:
        assert report.failure is None
        return
    assert report.failure is not None
    fin = report.final_record()
    first = struct.unpack_from("<I", data)[0]
    reader = {"mux": f"relay_mux: record magic 0x{first:08x} != 0x{MUX_RECORD_MAGIC:08x}",
              "frame": f"cluster_controller: frame magic 0x{first:08x} != "
                       f"0x{ROUND_FRAME_MAGIC:08x}",
              "loopback": f"cluster_controller: handshake magic 0x{first:08x} != 0xf10d17c0"}
    assert (fin["type"], fin["offset"], fin["error_kind"]) == ("error", 0, "magic")
    assert fin["error"] == f"{reader[leg]}; the first bytes look like the {real} leg ({why}), " \
                           f"not the {leg} leg"


def test_a_wrong_leg_on_the_command_line(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mux.bin"
    path.write_bytes(_mux_down(2).data)
    assert main(["decode", "--leg", "frame", str(path)]) == EXIT_ERROR
    assert _json_lines(capsys.readouterr().out) == [{
        "type": "error", "offset": 0, "error_kind": "magic", "error_id": "frame.bad_magic",
        "error": f"cluster_controller: frame magic 0x{MUX_RECORD_MAGIC:08x} != "
                 f"0x{ROUND_FRAME_MAGIC:08x}; the first bytes look like the mux leg (a mux "
                 "record header), not the frame leg"}]
    assert main(["decode", "--leg", "mux", "--format", "table", str(path)]) == EXIT_OK
    capsys.readouterr()
    # bytes no leg starts, and a failure past the first record, keep the reader's words alone
    assert decode_stream(b"garbage!", "frame").final_record()["error"] == (
        f"cluster_controller: frame magic 0x62726167 != 0x{ROUND_FRAME_MAGIC:08x}")
    # the handshake reader reads 16 bytes before it checks their magic: 6 bytes of a mux
    # record's are a capture that ended there, which names no leg
    short = decode_stream(struct.pack("<I", MUX_RECORD_MAGIC) + b"ab", "loopback")
    fin = short.final_record()
    assert (fin["type"], fin["error_id"]) == ("capture_ended", "handshake.read_failed")
    assert fin["error"] == ("capture ended inside a record at offset 0 (a reader would report: "
                            "cluster_controller: handshake read failed: failed to fill whole "
                            "buffer (6 of 16 bytes))")
    frame = encode_round_frame_bytes(_frames(2)[0], SALT)
    later = decode_stream(frame + _mux_down(2).data, "frame").final_record()
    assert (later["offset"], later["error"]) == (len(frame), (
        f"cluster_controller: frame magic 0x{MUX_RECORD_MAGIC:08x} != "
        f"0x{ROUND_FRAME_MAGIC:08x}"))

"""How :mod:`flodl_proto.decode` tells a stream's protocol version: the loopback handshake's and
ack's version field read through the codec's layout, the mux Control messages that tell it
named by the spec, each Control record decoded once at the version told, and the two
directions of a ``--pcap`` connection read at the version of its Hello."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flodl_proto.decode as decode_mod
from flodl_proto.cli import main
from flodl_proto.codec import (
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
    encode_ack,
    encode_channel_magic,
    encode_frame_record,
    encode_handshake,
    encode_mux_record_bytes,
)
from flodl_proto.decode import EXIT_OK, decode_stream
from flodl_proto.errors import ProtocolError
from flodl_proto.interop.jsonio import control_to_json
from flodl_proto.spec import SPEC, SUPPORTED_VERSIONS

from .pcap_writer import Capture

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")


class _Spy:
    """A codec struct whose ``parse`` calls are recorded (the bytes each was given)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.parsed: list[bytes] = []

    def parse(self, data: Any) -> Any:
        self.parsed.append(bytes(data))
        return self.real.parse(data)


@pytest.mark.parametrize("version", [2, 3])
def test_the_handshake_and_ack_versions_are_read_through_the_codec_s_layout(
        version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loopback leg's first bytes were read at raw offsets (the magic at 0, the version at
    4); they are now the fields of the codec's HANDSHAKE and HANDSHAKE_ACK structs."""
    hs, ack = _Spy(decode_mod.HANDSHAKE), _Spy(decode_mod.HANDSHAKE_ACK)
    monkeypatch.setattr(decode_mod, "HANDSHAKE", hs)
    monkeypatch.setattr(decode_mod, "HANDSHAKE_ACK", ack)
    data = encode_handshake(1, 4, version)
    rep = decode_stream(data, "loopback")
    assert rep.exit_code == EXIT_OK and rep.version == version
    assert rep.records == [{"offset": 0, "length": 16, "type": "handshake", "rank": 1,
                            "world_size": 4, "version": version}]
    assert hs.parsed == [data] and ack.parsed == []
    rep = decode_stream(encode_ack(version), "loopback")
    assert rep.exit_code == EXIT_OK and rep.version == version
    assert rep.records == [{"offset": 0, "length": 8, "type": "handshake_ack",
                            "version": version}]
    assert hs.parsed == [data] and ack.parsed == [encode_ack(version)]


def _variants() -> list[dict[str, Any]]:
    return copy.deepcopy(SPEC.message("relay_control_msg")["variants"])


def test_the_control_messages_that_tell_the_version_come_from_the_spec() -> None:
    """Version detection named Hello by hand as the one message whose fields differ by
    version; the messages are now the spec's variants with a field some version lacks."""
    variants = _variants()
    assert decode_mod._version_telling(variants, SUPPORTED_VERSIONS) == {"Hello"}
    assert decode_mod._VERSION_TELLING == {"Hello"}
    dead = next(v for v in variants if v["name"] == "DeclareDead")
    dead["fields"].append({"name": "cause", "type": "u32", "versions": [3]})
    assert decode_mod._version_telling(variants, SUPPORTED_VERSIONS) == {"Hello", "DeclareDead"}
    hello = next(v for v in variants if v["name"] == "Hello")
    for f in hello["fields"]:
        f.pop("versions", None)  # a field without versions is in every one
    assert decode_mod._version_telling(variants, SUPPORTED_VERSIONS) == {"DeclareDead"}
    assert decode_mod._version_telling(variants, [3]) == set()


def test_the_version_is_told_by_the_messages_the_spec_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A v3 Hello told the version because decode named Hello; it is told by the spec's set:
    without Hello in it, a v3 Hello is read at the default 2 (one trailing byte); with RankExit
    in it, a RankExit (whole at 3, the highest version) tells 3."""
    hello = MuxRecord.control_msg(Hello("h", [0, 1]), 3)
    data = encode_channel_magic("data") + encode_mux_record_bytes(hello, SALT)
    rep = decode_stream(data, "mux")
    assert rep.version == 3 and "trailing_bytes" not in rep.records[1]
    monkeypatch.setattr(decode_mod, "_VERSION_TELLING", frozenset())
    rep = decode_stream(data, "mux")
    assert rep.version == 2 and rep.records[1]["trailing_bytes"] == 1
    exit_rec = encode_mux_record_bytes(MuxRecord.control_msg(RankExit(5), 2), SALT)
    assert decode_stream(exit_rec, "mux").version == 2
    monkeypatch.setattr(decode_mod, "_VERSION_TELLING", frozenset({"Hello", "RankExit"}))
    rep = decode_stream(exit_rec, "mux")
    assert rep.version == 3 and rep.records[0]["control"] == {
        "variant": "RankExit", "variant_index": 2, "rank": 5}


def _count_control_decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every Control payload the codec decodes, as (message, version), whoever calls it (the
    stream's record reader or the decoder)."""
    import flodl_proto.codec.mux as mux_mod

    real = mux_mod.decode_control
    calls: list[tuple[str, int]] = []

    def counted(data: Any, version: int = 2) -> Any:
        try:
            msg = real(data, version)
        except ProtocolError:
            calls.append(("failed", version))
            raise
        calls.append((type(msg).__name__, version))
        return msg

    monkeypatch.setattr(mux_mod, "decode_control", counted)
    monkeypatch.setattr(decode_mod, "decode_control", counted)
    return calls


def _v_stream(version: int) -> bytes:
    """relay -> controller at ``version``: the magic, a Hello, a HostFrame, a RankExit."""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.array([1.0, 2.0], np.float32))])
    return (encode_channel_magic("data")
            + encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0, 1]), version), SALT)
            + b"".join(encode_frame_record(RecordKind.HOST_FRAME, frame, SALT))
            + encode_mux_record_bytes(MuxRecord.control_msg(RankExit(1), version), SALT))


@pytest.mark.parametrize("version", [2, 3])
def test_each_control_record_is_decoded_once_at_each_version_tried(
        version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version 3 stream's Hello was decoded three times (by the stream at 2, to tell the
    version at 3, again at 3 to show it) and each later Control record twice (at 2, then at 3);
    a version 2 Hello twice at 2. The Hello is now decoded once at each version tried and the
    records after it once, at the version it told."""
    calls = _count_control_decodes(monkeypatch)
    rep = decode_stream(_v_stream(version), "mux", salt=SALT)
    assert rep.exit_code == EXIT_OK and rep.version == version and rep.bad_tags == 0
    assert [r["type"] for r in rep.records] == ["channel_magic", "mux_record", "mux_record",
                                                "mux_record"]
    assert rep.records[1]["control"] == control_to_json(Hello("h", [0, 1]), version)
    assert rep.records[3]["control"] == {"variant": "RankExit", "variant_index": 2, "rank": 1}
    if version == 3:  # the stream reads the Hello at 2 (with a trailing byte), then 3 tells it
        assert calls == [("Hello", 2), ("Hello", 3), ("RankExit", 3)]
    else:  # at 3 the Hello lacks model_sigs, at 2 it is the one the stream read
        assert calls == [("Hello", 2), ("failed", 3), ("RankExit", 2)]
    calls.clear()
    rep = decode_stream(_v_stream(version), "mux", salt=SALT, version=version)
    assert rep.version == version and calls == [("Hello", version), ("RankExit", version)]


def _elided_broadcast() -> bytes:
    """A Broadcast whose one tensor is elided (legal at version 3 only)."""
    frame = RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(Dtype.F32, [8, 8], b"")])
    return b"".join(encode_frame_record(RecordKind.BROADCAST, frame, SALT))


def _down(version: int) -> bytes:
    """controller -> relay: HelloAck, an elided Broadcast, DeclareDead (no Hello)."""
    return (encode_mux_record_bytes(MuxRecord.control_msg(HelloAck(), version), SALT)
            + _elided_broadcast()
            + encode_mux_record_bytes(MuxRecord.control_msg(DeclareDead(3), version), SALT))


#: the elided tensor read at 3, and at 2 (where the note says the fold rejects it)
ELIDED_3 = {"dtype": "f32", "dtype_byte": 0, "shape": [8, 8], "nbytes": 0, "elided": True}
ELIDED_2 = {**ELIDED_3,
            "note": "elided payload: not legal at protocol version 2 (the fold rejects it)"}


def _pcap_lines(tmp_path: Path, cap: Capture, capsys: pytest.CaptureFixture[str],
                *extra: str) -> tuple[int, dict[str, list[dict[str, Any]]]]:
    path = tmp_path / "cap.pcap"
    path.write_bytes(cap.pcap())
    rc = main(["decode", "--pcap", str(path), "--port", "1337", "--salt", SALT.hex(), *extra])
    by: dict[str, list[dict[str, Any]]] = {}
    for line in capsys.readouterr().out.splitlines():
        rec = json.loads(line)
        by.setdefault(rec.pop("stream"), []).append(rec)
    return rc, by


def test_pcap_reads_the_controller_s_direction_at_the_version_of_the_relay_s_hello(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``decode --pcap`` read the controller -> relay direction, which carries no Hello, at
    version 2 whatever the relay's Hello said; it is now read at the version the Hello of the
    connection's other direction told: a version 3 connection's elided Broadcast is legal, a
    version 2 connection's is not, each connection read at its own."""
    cap = Capture()
    relay_a, relay_b, ctrl = ("10.0.0.2", 40001), ("10.0.0.3", 40002), ("10.0.0.1", 1337)
    a, b = cap.connect(relay_a, ctrl), cap.connect(relay_b, ctrl)
    for conn, version in ((a, 3), (b, 2)):
        cap.send(conn, True, encode_channel_magic("data") + encode_mux_record_bytes(
            MuxRecord.control_msg(Hello("h", [0, 1]), version), SALT), (20, 9))
    cap.send(a, False, _down(3), (30,))
    cap.send(b, False, _down(2), (30,))
    rc, by = _pcap_lines(tmp_path, cap, capsys)
    assert rc == EXIT_OK
    assert list(by) == [a.label(True), a.label(False), b.label(True), b.label(False)]
    assert by[a.label(True)][1]["control"] == control_to_json(Hello("h", [0, 1]), 3)
    assert by[b.label(True)][1]["control"] == control_to_json(Hello("h", [0, 1]), 2)
    down_a, down_b = by[a.label(False)], by[b.label(False)]
    assert [r["type"] for r in down_a] == ["mux_record"] * 3 + ["end"]
    assert down_a[0]["control"] == {"variant": "HelloAck", "variant_index": 1}
    assert down_a[1]["frame"]["tensors"] == [ELIDED_3]
    assert down_a[2]["control"] == {"variant": "DeclareDead", "variant_index": 3, "rank": 3}
    assert down_a[3] == {"type": "end", "offset": len(_down(3)), "records": 3, "bad_tags": 0}
    assert down_b[1]["frame"]["tensors"] == [ELIDED_2]
    # a version given is used for both directions, as before
    rc, by = _pcap_lines(tmp_path, cap, capsys, "--protocol-version", "2")
    assert by[a.label(False)][1]["frame"]["tensors"] == [ELIDED_2]


def test_pcap_of_one_direction_reads_it_as_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the relay's direction (no Hello captured) the controller's is read at 2, and
    the relay's alone at the version of its Hello, as before."""
    cap = Capture()
    conn = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 1337))
    cap.send(conn, False, _down(3), (30,))
    rc, by = _pcap_lines(tmp_path, cap, capsys)
    assert rc == EXIT_OK and list(by) == [conn.label(False)]
    assert by[conn.label(False)][1]["frame"]["tensors"] == [ELIDED_2]
    cap = Capture()
    conn = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 1337))
    cap.send(conn, True, encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(Hello("h", [0], [bytes(32)]), 3), SALT) + _elided_broadcast())
    rc, by = _pcap_lines(tmp_path, cap, capsys)
    assert rc == EXIT_OK and list(by) == [conn.label(True)]
    up = by[conn.label(True)]
    assert up[1]["control"] == control_to_json(Hello("h", [0], [bytes(32)]), 3)
    assert up[2]["frame"]["tensors"] == [ELIDED_3]


def test_pcap_of_a_loopback_connection_reads_each_direction_at_its_own_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rank's handshake and the relay's ack each carry a version, which each direction is
    read at (a version 3 handshake beside a version 2 ack: two streams that decode cleanly);
    only the mux leg's controller -> relay direction takes its connection's version."""
    cap = Capture()
    conn = cap.connect(("127.0.0.1", 50001), ("127.0.0.1", 1337))
    cap.send(conn, True, encode_handshake(0, 2, 3))
    cap.send(conn, False, encode_ack(2))
    rc, by = _pcap_lines(tmp_path, cap, capsys)
    assert rc == EXIT_OK
    assert by[conn.label(True)] == [
        {"offset": 0, "length": 16, "type": "handshake", "rank": 0, "world_size": 2,
         "version": 3},
        {"type": "end", "offset": 16, "records": 1, "bad_tags": 0}]
    assert by[conn.label(False)] == [
        {"offset": 0, "length": 8, "type": "handshake_ack", "version": 2},
        {"type": "end", "offset": 8, "records": 1, "bad_tags": 0}]

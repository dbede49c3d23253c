"""How :mod:`flodl_proto.decode` tells a stream's protocol version: the loopback handshake's and
ack's version field read through the codec's layout, the mux Control messages that tell it
named by the spec, each Control record decoded once at the version told, and the two
directions of a ``--pcap`` connection read at the version of its Hello."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import flodl_proto.decode as decode_mod
from flodl_proto.codec import (
    Hello,
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

"""How :mod:`flodl_proto.decode` tells a stream's protocol version: the loopback handshake's and
ack's version field read through the codec's layout, the mux Control messages that tell it
named by the spec, each Control record decoded once at the version told, and the two
directions of a ``--pcap`` connection read at the version of its Hello."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import flodl_proto.decode as decode_mod
from flodl_proto.codec import (
    Hello,
    MuxRecord,
    RankExit,
    encode_ack,
    encode_channel_magic,
    encode_handshake,
    encode_mux_record_bytes,
)
from flodl_proto.decode import EXIT_OK, decode_stream
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

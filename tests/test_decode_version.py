"""How :mod:`flodl_proto.decode` tells a stream's protocol version: the loopback handshake's and
ack's version field read through the codec's layout, the mux Control messages that tell it
named by the spec, each Control record decoded once at the version told, and the two
directions of a ``--pcap`` connection read at the version of its Hello."""

from __future__ import annotations

from typing import Any

import pytest

import flodl_proto.decode as decode_mod
from flodl_proto.codec import encode_ack, encode_handshake
from flodl_proto.decode import EXIT_OK, decode_stream


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

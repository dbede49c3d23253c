"""Set-up shared by the tests that drive a RelayCore directly: a record as the runner hands it
over, and a core whose ranks and controller link are up."""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import (
    END_OF_STREAM,
    HelloAck,
    MuxRecord,
    decode_mux_record,
    encode_handshake,
    encode_mux_record_bytes,
)
from flodl_proto.fsm.events import AckRank, RankConnected, SendUpstream, UpstreamKind
from flodl_proto.fsm.lifecycle import RelayState
from flodl_proto.fsm.relay_core import RelayCore


def signed_record(rec: MuxRecord, version: int, salt: bytes) -> MuxRecord:
    """``rec`` as the relay runner hands it to the core: decoded from its signed bytes."""
    res = decode_mux_record(encode_mux_record_bytes(rec, salt), salt, version=version)
    assert res is not END_OF_STREAM
    return res[0]


def connected_core(ranks: tuple[int, ...], world: int, version: int, salt: bytes,
                   **options: Any) -> RelayCore:
    """A RelayCore (host ``h0``, ``options`` passed on) whose ``ranks`` have hand-shaken and
    whose controller link is up (Hello sent, HelloAck received): folding."""
    core = RelayCore(ranks, world, salt, version=version, host="h0", **options)
    for r in ranks:
        acts = core.rank_handshake(encode_handshake(r, world, version))
        assert [type(a) for a in acts] == [AckRank, RankConnected]
    assert core.state == RelayState.DIALING
    (hello,) = core.dialed()
    assert isinstance(hello, SendUpstream) and hello.kind is UpstreamKind.HELLO
    ack = signed_record(MuxRecord.control_msg(HelloAck(), version), version, salt)
    assert core.upstream_record(ack) == []
    assert core.state == RelayState.FOLDING
    return core

"""codec.loopback_stream: the rank <-> relay leg as events (handshake or ack, then
length-prefixed RoundFrames), fed whole, byte by byte and in any split, against the bundled
golden vectors and hand-built streams."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flodl_proto.codec import (
    AckReceived,
    FrameReceived,
    HandshakeReceived,
    LoopbackEvent,
    LoopbackStream,
    StreamEnded,
    StreamFailed,
    encode_ack,
    encode_handshake,
)
from flodl_proto.errors import (
    AuthenticationError,
    BadMagic,
    InvalidValue,
    LimitExceeded,
    LocalProtocolError,
    RemoteProtocolError,
    TruncatedInput,
)

from .conftest import BUNDLED_VECTORS

FRAME_MAGIC = 0xF10D17F1
SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")


def frame_bytes(salt: bytes, values: tuple[float, ...] = (1.0, -2.5, 0.0, 3.25)) -> bytes:
    """A RoundFrame with one f32 tensor of shape [len(values)], signed with ``salt``."""
    data = struct.pack(f"<{len(values)}f", *values)
    body = (struct.pack("<IIBd", FRAME_MAGIC, 1, 0, 1.0) + bytes([0, 1])
            + struct.pack("<IQ", len(values), len(data)) + data)
    return body + hmac.new(salt, body, hashlib.sha256).digest()[:8]


def blob(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def summary(events: Sequence[LoopbackEvent]) -> list[tuple[Any, ...]]:
    """Events as comparable tuples (a frame by its kind, weight and tensor bytes)."""
    out: list[tuple[Any, ...]] = []
    for ev in events:
        if isinstance(ev, FrameReceived):
            out.append(("frame", ev.frame.kind.name, ev.frame.weight,
                        [bytes(t.data) for t in ev.frame.tensors], ev.nbytes, ev.trailing))
        elif isinstance(ev, StreamFailed):
            out.append(("failed", type(ev.error).__name__, ev.error.error_id, str(ev.error),
                        ev.hint))
        else:
            out.append((type(ev).__name__, ev))
    return out


def run(direction: str, data: bytes, chunks: Sequence[int] | None = None,
        **kw: Any) -> list[LoopbackEvent]:
    """All events of ``data`` fed in pieces of the given sizes (whole when None), then EOF."""
    stream = LoopbackStream(direction, kw.pop("salt", SALT), **kw)  # type: ignore[arg-type]
    events: list[LoopbackEvent] = []
    pos = 0
    for n in chunks or [len(data)]:
        events += stream.feed(data[pos:pos + n])
        pos += n
    events += stream.feed(data[pos:])
    events += stream.feed_eof()
    assert stream.done and stream.buffered == 0
    return events


def byte_by_byte(direction: str, data: bytes, **kw: Any) -> list[LoopbackEvent]:
    return run(direction, data, [1] * len(data), **kw)


# -- the bundled vectors -----------------------------------------------------------------------
def _cases(name: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for folder in (BUNDLED_VECTORS, BUNDLED_VECTORS / "v2"):
        doc = json.loads(Path(folder, f"{name}.json").read_text())
        out += [(int(doc["protocol_version"]), c) for c in doc["cases"]]
    return out


HANDSHAKE_CASES = [(v, c) for v, c in _cases("handshake")
                   if c["op"] in ("handshake.read", "handshake.rank_write")]
ACK_CASES = [(v, c) for v, c in _cases("handshake")
             if c["op"] in ("handshake.ack_read", "handshake.ack_write")]
FRAMED_CASES = [(v, c) for v, c in _cases("len_framed")
                if c["op"] in ("framed_round.read", "framed_round.roundtrip")]


def test_the_vectors_are_found() -> None:
    assert (len(HANDSHAKE_CASES), len(ACK_CASES), len(FRAMED_CASES)) == (18, 8, 8)


def _check(events: list[LoopbackEvent], case: dict[str, Any], first: type) -> None:
    if case["expect"] == "error":
        assert len(events) == 1 and isinstance(events[0], StreamFailed), events
        assert isinstance(events[0].error, RemoteProtocolError)
        assert str(events[0].error).startswith(case["error_prefix"]), events[0].error
    else:
        assert [type(e) for e in events] == [first, StreamEnded], events


@pytest.mark.parametrize(("version", "case"), HANDSHAKE_CASES,
                         ids=[f"v{v}-{c['id']}" for v, c in HANDSHAKE_CASES])
def test_handshake_vectors(version: int, case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["bytes"])
    ws = case.get("expected_world_size", case.get("world_size"))
    kw: dict[str, Any] = {"version": version, "world_size": None if ws is None else int(ws)}
    whole = run("rank_to_relay", data, **kw)
    _check(whole, case, HandshakeReceived)
    if case["expect"] == "ok":
        hs = whole[0].handshake  # type: ignore[union-attr]
        assert (hs.rank, hs.world_size, hs.version) == (
            int(case["rank_id"]), int(ws), version)  # type: ignore[arg-type]
    assert summary(byte_by_byte("rank_to_relay", data, **kw)) == summary(whole)


@pytest.mark.parametrize(("version", "case"), ACK_CASES,
                         ids=[f"v{v}-{c['id']}" for v, c in ACK_CASES])
def test_ack_vectors(version: int, case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["bytes"])
    whole = run("relay_to_rank", data, version=version)
    _check(whole, case, AckReceived)
    assert summary(byte_by_byte("relay_to_rank", data, version=version)) == summary(whole)


@pytest.mark.parametrize(("version", "case"), FRAMED_CASES,
                         ids=[f"v{v}-{c['id']}" for v, c in FRAMED_CASES])
def test_framed_round_vectors_after_the_ack(version: int, case: dict[str, Any]) -> None:
    salt = bytes.fromhex(case["salt"])
    data = encode_ack(version) + bytes.fromhex(case["bytes"])
    whole = run("relay_to_rank", data, version=version, salt=salt)
    assert isinstance(whole[0], AckReceived) and whole[0].version == version
    rest = whole[1:]
    if case["expect"] == "error":
        assert len(rest) == 1 and isinstance(rest[0], StreamFailed), rest
        assert str(rest[0].error).startswith(case["error_prefix"]), rest[0].error
    elif case["expect"] == "eof":
        assert rest == [StreamEnded()]
    else:
        assert [type(e) for e in rest] == [FrameReceived, StreamEnded]
        frame = rest[0].frame  # type: ignore[union-attr]
        assert [bytes(t.data).hex() for t in frame.tensors] == [
            t["data"] for t in case["frame"]["tensors"]]
        assert rest[0].nbytes == len(data) - 8  # type: ignore[union-attr]
    assert summary(byte_by_byte("relay_to_rank", data, version=version, salt=salt)) == \
        summary(whole)


# -- whole, byte by byte and any split give the same events --------------------------------------
R2R = (encode_handshake(1, 4) + blob(frame_bytes(SALT)) + blob(frame_bytes(SALT, (7.0,)))
       + blob(frame_bytes(SALT) + b"\x00\x01\x02"))
TO_RANK = encode_ack() + blob(frame_bytes(SALT, (0.5, 0.25))) + blob(frame_bytes(SALT))


def test_rank_to_relay_events() -> None:
    events = run("rank_to_relay", R2R, world_size=4)
    f4 = [struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)]
    assert (len(frame_bytes(SALT)), len(frame_bytes(SALT, (7.0,)))) == (55, 43)
    assert summary(events)[1:] == [
        ("frame", "MODEL", 1.0, f4, 4 + 55, 0),
        ("frame", "MODEL", 1.0, [struct.pack("<f", 7.0)], 4 + 43, 0),
        ("frame", "MODEL", 1.0, f4, 4 + 55 + 3, 3),  # leniency loopback_trailing
        ("StreamEnded", StreamEnded()),
    ]
    hs = events[0]
    assert isinstance(hs, HandshakeReceived) and hs.nbytes == 16
    assert (hs.handshake.rank, hs.handshake.world_size, hs.handshake.version) == (1, 4, 2)


@given(st.lists(st.integers(min_value=0, max_value=60), max_size=12),
       st.sampled_from([("rank_to_relay", R2R), ("relay_to_rank", TO_RANK)]))
def test_any_split_gives_the_same_events(cuts: list[int], leg: tuple[str, bytes]) -> None:
    direction, data = leg
    assert summary(run(direction, data, cuts)) == summary(run(direction, data))
    assert summary(run(direction, data, cuts)) == summary(byte_by_byte(direction, data))


def test_buffering_is_bounded_by_one_item() -> None:
    stream = LoopbackStream("rank_to_relay", SALT)
    assert stream.feed(R2R[:15]) == [] and stream.buffered == 15
    stream.feed(R2R[15:16 + 4 + 10])
    assert stream.buffered == 14  # the first blob's prefix and 10 of its 55 body bytes
    assert len(stream.feed(R2R[30:])) == 3 and stream.buffered == 0
    assert stream.bytes_in == len(R2R)


# -- errors: exact ids and messages ---------------------------------------------------------------
def failure(events: Sequence[LoopbackEvent]) -> StreamFailed:
    assert isinstance(events[-1], StreamFailed), events
    assert not any(isinstance(e, StreamFailed) for e in events[:-1])
    return events[-1]


def test_bad_tag() -> None:
    bad = bytearray(frame_bytes(SALT))
    bad[-1] ^= 1
    for direction, head in (("rank_to_relay", encode_handshake(0, 1)),
                            ("relay_to_rank", encode_ack())):
        f = failure(run(direction, head + blob(bytes(bad))))
        assert isinstance(f.error, AuthenticationError) and f.error.error_id == "frame.auth_failed"
        assert str(f.error) == (
            "cluster_controller: RoundFrame HMAC verification failed (computed "
            "0x6a70b60a6cc95b3f, wire carried 0x6b70b60a6cc95b3f); session salt disagreement, "
            "tampered frame, or payload corruption")


def test_bad_handshake_magic_and_the_other_directions_hint() -> None:
    f = failure(run("rank_to_relay", struct.pack("<IIII", 0xF10D17C2, 2, 0, 2)))
    assert isinstance(f.error, BadMagic) and f.error.error_id == "handshake.bad_magic"
    assert (str(f.error), f.hint) == (
        "cluster_controller: handshake magic 0xf10d17c2 != 0xf10d17c0", "")
    f = failure(run("rank_to_relay", encode_ack() + encode_ack()))
    assert f.hint == ("the stream starts with a handshake ack: it is the relay -> rank "
                      "direction (direction='relay_to_rank')")
    f = failure(run("relay_to_rank", encode_handshake(0, 2)))
    assert (f.error.error_id, str(f.error), f.hint) == (
        "ack.bad_magic", "cpu_reduce: handshake ack magic 0xf10d17c0 != 0xf10d17c1",
        "the stream starts with a rank handshake: it is the rank -> relay direction "
        "(direction='rank_to_relay')")


def test_world_size_mismatch_and_unchecked() -> None:
    f = failure(run("rank_to_relay", encode_handshake(0, 3), world_size=4))
    assert (f.error.error_id, str(f.error)) == (
        "handshake.world_size_mismatch",
        "cluster_controller: handshake world_size 3 != expected 4")
    assert isinstance(run("rank_to_relay", encode_handshake(0, 3))[0], HandshakeReceived)


def test_prefix_over_the_ceiling_fails_before_its_payload() -> None:
    stream = LoopbackStream("rank_to_relay", SALT, ceiling=46)
    assert [type(e) for e in stream.feed(encode_handshake(0, 1))] == [HandshakeReceived]
    assert stream.feed(struct.pack("<I", 47)[:3]) == [] and stream.buffered == 3
    f = failure(stream.feed(struct.pack("<I", 47)[3:]))
    assert isinstance(f.error, LimitExceeded) and f.error.error_id == "len.too_large"
    assert str(f.error) == ("relay_mux: len-framed blob length 47 exceeds the frame ceiling 46; "
                            "corrupt or hostile peer")
    assert (stream.done, stream.buffered, stream.feed(b"x" * 47), stream.feed_eof()) == (
        True, 0, [], [])


def test_a_cut_stream_at_the_end() -> None:
    whole = encode_handshake(0, 1) + blob(frame_bytes(SALT))
    f = failure(run("rank_to_relay", whole[:-5]))
    assert isinstance(f.error, TruncatedInput) and (f.error.error_id, str(f.error)) == (
        "len.body_read_failed",
        "relay_mux: len-framed body read failed: failed to fill whole buffer (50 of 55 bytes)")
    f = failure(run("relay_to_rank", encode_ack() + blob(frame_bytes(SALT))[:-5]))
    assert isinstance(f.error, TruncatedInput) and (f.error.error_id, str(f.error)) == (
        "frame.footer_read_failed",
        "cluster_controller: frame HMAC footer read failed: failed to fill whole buffer (sender "
        "at PROTOCOL_VERSION < 2, or stream truncated mid-frame) (offset 47)")
    for direction, head in (("rank_to_relay", encode_handshake(0, 1)),
                            ("relay_to_rank", encode_ack())):
        for kept in range(4):  # inside the prefix: a clean end
            assert run(direction, head + b"\x2f\x00\x00"[:kept])[-1] == StreamEnded()
    f = failure(run("rank_to_relay", b""))
    assert (f.error.error_id, str(f.error)) == (
        "handshake.read_failed",
        "cluster_controller: handshake read failed: failed to fill whole buffer (0 of 16 bytes)")
    f = failure(run("relay_to_rank", encode_ack()[:7]))
    assert f.error.error_id == "ack.read_failed"


def test_a_blob_too_short_for_its_frame() -> None:
    f = failure(run("rank_to_relay", encode_handshake(5, 8) + blob(b"\xf1\x17")))
    assert (f.error.error_id, str(f.error)) == (
        "fold.truncated", "relay fold: truncated RoundFrame from rank 5")
    f = failure(run("relay_to_rank", encode_ack() + blob(b"")))
    assert (f.error.error_id, str(f.error)) == (
        "framed_round.body_ended",
        "cpu_reduce: stream ended inside a len-framed RoundFrame body (peer died mid-frame, or "
        "a zero-length prefix) (prefix 0, 0 body bytes)")
    f = failure(run("relay_to_rank", encode_ack() + blob(frame_bytes(SALT) + b"\x00")))
    assert f.error.error_id == "framed_round.underrun"


def test_local_misuse() -> None:
    with pytest.raises(InvalidValue) as e:
        LoopbackStream("up", SALT)  # type: ignore[arg-type]
    assert isinstance(e.value, LocalProtocolError) and str(e.value) == (
        "handshake: direction = 'up' is invalid: not 'rank_to_relay' (the 16-byte handshake "
        "first) or 'relay_to_rank' (the 8-byte ack first)")
    with pytest.raises(InvalidValue) as e:
        LoopbackStream("rank_to_relay", SALT, world_size=-1)
    assert str(e.value) == "handshake: world_size = -1 is invalid: not a u32"
    stream = LoopbackStream("relay_to_rank", SALT)
    with pytest.raises(InvalidValue) as e:
        stream.feed("text")  # type: ignore[arg-type]
    assert e.value.error_id == "codec.not_bytes_like"
    assert (stream.bytes_in, stream.direction) == (0, "relay_to_rank")

"""The incremental stream decoders (``codec.stream``) driven directly with hand-built bytes.

Every record here is built with :mod:`struct` from the layouts of ``spec/wire.yaml`` (RoundFrame:
magic, tensor count, kind, weight, per tensor dtype/ndim/dims/nbytes/data, 8-byte tag; mux record:
magic, version, kind, rank, payload_len, tag, payload; loopback blob: u32 length prefix), and
every tag with :mod:`hmac` over the spec's covered bytes. The tests state the exact events,
``NeedData`` counts, byte counters and errors (class, catalogue id, fields) of the decoders'
truncation, failure and end-of-stream paths, which the split-anything state machine in
``test_stream_stateful.py`` only reaches at random.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import struct
from collections.abc import Sequence

import pytest

from flodl_proto.codec import (
    END_OF_STREAM,
    Hello,
    NeedData,
    RankExit,
    RecordKind,
    RoundFrame,
    decode_round_frame,
)
from flodl_proto.codec import stream as stream_module
from flodl_proto.codec.auth import Premac
from flodl_proto.codec.mux import parse_mux_header
from flodl_proto.codec.stream import (
    LenFramedDecoder,
    MagicReceived,
    MuxStream,
    RecordReceived,
    RoundFrameDecoder,
    StreamEnded,
    StreamEvent,
    StreamFailed,
    other_version_hello,
)
from flodl_proto.errors import (
    AuthenticationError,
    BadMagic,
    InvalidValue,
    LimitExceeded,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    SequenceError,
    TruncatedInput,
    protocol_error,
)

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
ZERO = bytes(16)
FRAME_MAGIC = 0xF10D17F1
MUX_MAGIC = 0xF10D17D0
DATA_MAGIC = struct.pack("<I", 0xF10D17E1)
CONTROL_MAGIC = 0xF10D17E2
GiB = 1 << 30

#: RelayControlMsg payloads (bincode, spec b.8)
V2_HELLO = bytes.fromhex("00026830020001")  # Hello{host: "h0", ranks: [0, 1]}
V3_HELLO = V2_HELLO + b"\x00"  # the same with model_sigs: []
HELLO_ACK = b"\x01"
RANK_EXIT_3 = b"\x02\x03"

V2_HINT_AT_V3 = ("the relay sent a protocol-version-2 Hello to this version-3 controller: the "
                 "protocol versions differ (set the same --protocol-version on both sides)")
V3_HINT_AT_V2 = ("the relay sent a protocol-version-3 Hello to this version-2 controller: the "
                 "protocol versions differ (set the same --protocol-version on both sides)")


def tag(salt: bytes, *parts: bytes) -> bytes:
    """First 8 bytes of HMAC-SHA256(key = salt, msg = parts)."""
    return hmac.new(salt, b"".join(parts), hashlib.sha256).digest()[:8]


def frame_bytes(salt: bytes, values: tuple[float, ...] = (1.0, -2.5, 0.0, 3.25), *,
                weight: float = 1.0, kind: int = 0) -> bytes:
    """A RoundFrame with one f32 tensor of shape [len(values)], signed with ``salt``."""
    data = struct.pack(f"<{len(values)}f", *values)
    body = (struct.pack("<IIBd", FRAME_MAGIC, 1, kind, weight) + bytes([0, 1])
            + struct.pack("<IQ", len(values), len(data)) + data)
    return body + tag(salt, body)


def mux(salt: bytes, kind: int, payload: bytes, rank: int = 0, *,
        claimed: int | None = None) -> bytes:
    """A mux record; ``claimed`` overrides the header's payload_len (the tag then covers it)."""
    head = struct.pack("<IIBII", MUX_MAGIC, 1, kind, rank,
                       len(payload) if claimed is None else claimed)
    return head + tag(salt, head, payload) + payload


def blob(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def premac(salt: bytes, covered: bytes) -> Premac:
    return Premac(len(covered), hmac.new(salt, covered, hashlib.sha256).digest())


def remote(e: BaseException, cls: type[ProtocolError], error_id: str) -> ProtocolError:
    assert isinstance(e, cls) and isinstance(e, RemoteProtocolError), e
    assert e.error_id == error_id
    return e


def failed(events: Sequence[object]) -> StreamFailed:
    assert len(events) == 1 and isinstance(events[0], StreamFailed), events
    return events[0]


# -- the worked example of the spec (b.4) ---------------------------------------------------------
def test_frame_builder_matches_the_spec_example() -> None:
    wire = frame_bytes(ZERO)
    assert len(wire) == 55
    assert wire[:17].hex() == "f1170df1" "01000000" "00" "000000000000f03f"
    assert wire[-8:].hex() == "39a58785a03c12d1"


# -- LenFramedDecoder -----------------------------------------------------------------------------
def test_len_framed_blobs_and_counters() -> None:
    dec = LenFramedDecoder()
    assert (dec.ceiling, dec.buffered, dec.consumed) == (GiB, 0, 0)
    assert dec.next_event() == NeedData(4)
    dec.feed(blob(b"hello") + blob(b"") + blob(b"xy")[:3])
    assert dec.buffered == 9 + 4 + 3
    first = dec.next_event()
    assert isinstance(first, memoryview) and bytes(first) == b"hello"
    assert (dec.consumed, dec.buffered) == (9, 7)
    second = dec.next_event()
    assert isinstance(second, memoryview) and bytes(second) == b""
    assert (dec.consumed, dec.buffered) == (13, 3)
    assert dec.next_event() == NeedData(1)  # inside the prefix
    dec.feed(b"\x00")
    assert dec.next_event() == NeedData(2)  # the prefix says 2, none arrived
    dec.feed(b"x")
    assert dec.next_event() == NeedData(1)
    dec.feed(b"y")
    third = dec.next_event()
    assert isinstance(third, memoryview) and bytes(third) == b"xy"
    assert (dec.consumed, dec.buffered) == (19, 0)
    dec.feed_eof()
    assert dec.next_event() is END_OF_STREAM
    assert dec.next_event() is END_OF_STREAM


@pytest.mark.parametrize("kept", [0, 1, 3])
def test_len_framed_eof_inside_the_prefix_is_a_clean_end(kept: int) -> None:
    dec = LenFramedDecoder()
    dec.feed(blob(b"abc")[:kept])
    dec.feed_eof()
    assert dec.next_event() is END_OF_STREAM
    assert dec.consumed == 0


@pytest.mark.parametrize("kept, got", [(4, 0), (6, 2)])
def test_len_framed_eof_inside_the_body(kept: int, got: int) -> None:
    dec = LenFramedDecoder()
    dec.feed(blob(b"abcde")[:kept])
    assert dec.next_event() == NeedData(9 - kept)
    dec.feed_eof()
    with pytest.raises(TruncatedInput) as ei:
        dec.next_event()
    e = remote(ei.value, TruncatedInput, "len.body_read_failed")
    assert e.fields == {"got": got, "need": 5}
    assert f"({got} of 5 bytes)" in str(e)
    with pytest.raises(TruncatedInput) as again:  # sticky
        dec.next_event()
    assert again.value is e


def test_len_framed_truncation_is_judged_with_the_decoders_ceiling() -> None:
    # a prefix above the default ceiling but under this decoder's: the body's truncation is
    # reported, not the default ceiling
    dec = LenFramedDecoder(ceiling=2 * GiB)
    dec.feed(struct.pack("<I", GiB + 5) + b"abc")
    assert dec.next_event() == NeedData(GiB + 2)
    dec.feed_eof()
    with pytest.raises(TruncatedInput) as ei:
        dec.next_event()
    assert remote(ei.value, TruncatedInput, "len.body_read_failed").fields == {
        "got": 3, "need": GiB + 5}


def test_len_framed_prefix_over_the_ceiling_before_the_body() -> None:
    dec = LenFramedDecoder(ceiling=8)
    assert dec.ceiling == 8
    dec.feed(blob(b"12345678"))
    assert bytes(dec.next_event()) == b"12345678"  # type: ignore[arg-type]
    dec.feed(struct.pack("<I", 9))  # no body byte yet
    with pytest.raises(LimitExceeded) as ei:
        dec.next_event()
    e = remote(ei.value, LimitExceeded, "len.too_large")
    assert e.fields == {"length": 9, "ceiling": 8}
    assert "blob length 9 exceeds the frame ceiling 8" in str(e)
    dec.feed(b"abcdefghi")  # ignored: the stream is dead
    assert dec.buffered == 4
    with pytest.raises(LimitExceeded) as again:
        dec.next_event()
    assert again.value is e
    assert dec.consumed == 12


def test_feed_after_eof_is_a_local_sequence_error() -> None:
    dec = LenFramedDecoder()
    dec.feed_eof()
    with pytest.raises(SequenceError) as ei:
        dec.feed(b"abc")
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "stream.fed_after_eof"
    assert ei.value.fields == {"nbytes": 3}
    assert str(ei.value) == "stream decoder: 3 bytes fed after the end of stream was signalled"
    assert dec.buffered == 0
    with pytest.raises(SequenceError) as ei:
        dec.feed(b"a")
    assert str(ei.value) == "stream decoder: 1 byte fed after the end of stream was signalled"


def test_feed_while_a_view_of_the_buffer_is_held() -> None:
    # a caller holding a view of the decoder's buffer cannot resize it: the decoder moves on to
    # a new buffer rather than fail
    dec = LenFramedDecoder()
    dec.feed(blob(b"ab")[:3])
    held = memoryview(dec._buf)
    dec.feed(blob(b"ab")[3:] + blob(b"cd"))
    assert bytes(held) == blob(b"ab")[:3]
    assert dec.buffered == 3 + 3 + 6
    assert bytes(dec.next_event()) == b"ab"  # type: ignore[arg-type]
    held.release()
    assert bytes(dec.next_event()) == b"cd"  # type: ignore[arg-type]
    assert dec.consumed == 12


def test_consume_while_a_view_of_the_buffer_is_held() -> None:
    dec = LenFramedDecoder()
    dec.feed(blob(b"ab") + blob(b"cde"))
    held = memoryview(dec._buf)
    assert bytes(dec.next_event()) == b"ab"  # type: ignore[arg-type]
    assert dec.buffered == 7
    assert bytes(held[:6]) == blob(b"ab")  # the old buffer is left as it was
    assert bytes(dec.next_event()) == b"cde"  # type: ignore[arg-type]
    held.release()
    assert (dec.buffered, dec.consumed) == (0, 13)


@pytest.mark.parametrize("ceiling, error", [(-1, InvalidValue), (1.5, InvalidValue)])
def test_bad_ceiling_is_a_local_error(ceiling: object, error: type[ProtocolError]) -> None:
    with pytest.raises(error) as ei:
        LenFramedDecoder(ceiling=ceiling)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError) and ei.value.error_id == "ceiling.invalid"


# -- RoundFrameDecoder ----------------------------------------------------------------------------
#: the byte counts at which the reader's next field is complete: header 8, kind 9, weight 17,
#: meta 19, dim 23, nbytes 31, data 47, tag 55
MILESTONES = (8, 9, 17, 19, 23, 31, 47, 55)


def test_round_frame_byte_by_byte() -> None:
    wire = frame_bytes(SALT)
    dec = RoundFrameDecoder(SALT)
    for i in range(len(wire)):
        want = next(m for m in MILESTONES if m > i)
        assert dec.next_event() == NeedData(want - i), i
        dec.feed(wire[i:i + 1])
    frame = dec.next_event()
    assert isinstance(frame, RoundFrame)
    assert (frame.kind, frame.weight) == (0, 1.0)
    [t] = frame.tensors
    assert (t.dtype, tuple(t.shape), bytes(t.data)) == (
        0, (4,), struct.pack("<4f", 1.0, -2.5, 0.0, 3.25))
    assert (dec.consumed, dec.buffered) == (55, 0)
    assert dec.next_event() == NeedData(8)


def test_round_frame_milestones_exactly() -> None:
    # each field arrives exactly: the walk resumes as soon as the bytes it waited for are there
    wire = frame_bytes(SALT)
    dec = RoundFrameDecoder(SALT)
    at = 0
    for m, nxt in itertools.pairwise(MILESTONES):
        dec.feed(wire[at:m])
        at = m
        assert dec.next_event() == NeedData(nxt - m), m
    dec.feed(wire[at:])
    assert isinstance(dec.next_event(), RoundFrame)


def test_round_frames_back_to_back() -> None:
    one = frame_bytes(SALT, (1.0, 2.0), weight=2.0)  # 47 bytes
    two = frame_bytes(SALT, (5.0, 6.0, 7.0, 8.0), weight=0.5, kind=1)  # 55 bytes
    dec = RoundFrameDecoder(SALT)
    dec.feed(one + two[:20])
    a = dec.next_event()
    assert isinstance(a, RoundFrame) and (a.kind, a.weight) == (0, 2.0)
    assert bytes(a.tensors[0].data) == struct.pack("<2f", 1.0, 2.0)
    assert (dec.consumed, dec.buffered) == (47, 20)
    assert dec.next_event() == NeedData(3)  # the second frame's dim ends at byte 23
    dec.feed(two[20:40])
    assert dec.next_event() == NeedData(7)  # its data ends at byte 47
    dec.feed(two[40:])
    b = dec.next_event()
    assert isinstance(b, RoundFrame) and (b.kind, b.weight) == (1, 0.5)
    assert bytes(b.tensors[0].data) == struct.pack("<4f", 5.0, 6.0, 7.0, 8.0)
    assert (dec.consumed, dec.buffered) == (47 + 55, 0)
    dec.feed_eof()
    assert dec.next_event() is END_OF_STREAM


@pytest.mark.parametrize("kept", [0, 1, 7])
def test_round_frame_eof_inside_the_header_is_a_clean_end(kept: int) -> None:
    dec = RoundFrameDecoder(SALT)
    dec.feed(frame_bytes(SALT)[:kept])
    assert dec.next_event() == NeedData(8 - kept)
    dec.feed_eof()
    assert dec.next_event() is END_OF_STREAM


@pytest.mark.parametrize("kept, error_id, fields", [
    (8, "frame.kind_read_failed", {"offset": 8}),
    (12, "frame.weight_read_failed", {"offset": 9}),
    (18, "frame.meta_read_failed", {"index": 0, "offset": 17}),
    (20, "frame.shape_read_failed", {"index": 0, "offset": 19}),
    (30, "frame.nbytes_read_failed", {"index": 0, "offset": 23}),
    (40, "frame.data_read_failed", {"index": 0, "offset": 31, "got": 9, "need": 16}),
    (50, "frame.footer_read_failed", {"offset": 47}),
])
def test_round_frame_eof_mid_frame(kept: int, error_id: str, fields: dict[str, int]) -> None:
    dec = RoundFrameDecoder(SALT)
    dec.feed(frame_bytes(SALT)[:kept])
    assert isinstance(dec.next_event(), NeedData)
    dec.feed_eof()
    with pytest.raises(TruncatedInput) as ei:
        dec.next_event()
    assert remote(ei.value, TruncatedInput, error_id).fields == fields
    assert f"offset {fields['offset']}" in str(ei.value)
    with pytest.raises(TruncatedInput) as again:
        dec.next_event()
    assert again.value is ei.value
    assert dec.consumed == 0


def _flipped(wire: bytes, at: int) -> bytes:
    out = bytearray(wire)
    out[at] ^= 1
    return bytes(out)


@pytest.mark.parametrize("chunk", [None, 1], ids=["one chunk", "byte by byte"])
@pytest.mark.parametrize("third, message", [
    (frame_bytes(SALT)[:12],
     "cluster_controller: frame weight read failed: failed to fill whole buffer (offset 9)"),
    (_flipped(frame_bytes(SALT), 0), "cluster_controller: frame magic 0xf10d17f0 != 0xf10d17f1"),
    (_flipped(frame_bytes(SALT), 54),
     "cluster_controller: RoundFrame HMAC verification failed (computed 0x6a70b60a6cc95b3f, wire "
     "carried 0x6b70b60a6cc95b3f); session salt disagreement, tampered frame, or payload "
     "corruption"),
], ids=["cut", "magic", "tag"])
def test_round_frame_error_in_the_third_frame(chunk: int | None, third: bytes,
                                              message: str) -> None:
    # the error is the one-shot reader's, word for word, whatever the split: its offsets count
    # from the frame's first byte (as MuxStream's and LoopbackStream's count from the record's),
    # and the frame starts where ``consumed`` stood before the call that raised
    one = frame_bytes(SALT)
    wire = one + one + third
    with pytest.raises(ProtocolError) as alone:
        decode_round_frame(third, SALT)
    assert str(alone.value) == message
    dec = RoundFrameDecoder(SALT)
    frames: list[RoundFrame] = []
    before = 0
    pieces = [wire] if chunk is None else [wire[i:i + chunk] for i in range(len(wire))]
    with pytest.raises(RemoteProtocolError) as ei:
        for piece in [*pieces, None]:
            if piece is None:
                dec.feed_eof()
            else:
                dec.feed(piece)
            while True:
                before = dec.consumed
                ev = dec.next_event()
                if isinstance(ev, NeedData):
                    break
                assert isinstance(ev, RoundFrame)
                frames.append(ev)
    assert str(ei.value) == message
    assert type(ei.value) is type(alone.value)
    assert (len(frames), before) == (2, 2 * len(one))


def test_round_frame_truncation_is_judged_with_the_decoders_ceiling() -> None:
    # a tensor above the default ceiling but under this decoder's: the data's truncation is
    # reported, not the default ceiling
    body = (struct.pack("<IIBd", FRAME_MAGIC, 1, 0, 1.0) + bytes([1, 1])
            + struct.pack("<IQ", GiB // 2 + 1, GiB + 2) + b"\x00\x00")
    dec = RoundFrameDecoder(SALT, ceiling=2 * GiB)
    dec.feed(body)
    assert dec.next_event() == NeedData(GiB)
    dec.feed_eof()
    with pytest.raises(TruncatedInput) as ei:
        dec.next_event()
    assert remote(ei.value, TruncatedInput, "frame.data_read_failed").fields == {
        "index": 0, "offset": 31, "got": 2, "need": GiB + 2}


def test_round_frame_ceiling_before_the_data() -> None:
    dec = RoundFrameDecoder(SALT, ceiling=15)
    assert dec.ceiling == 15
    dec.feed(frame_bytes(SALT)[:31])
    with pytest.raises(LimitExceeded) as ei:
        dec.next_event()
    e = remote(ei.value, LimitExceeded, "frame.past_ceiling")
    assert e.fields == {"index": 0, "ceiling": 15, "nbytes": 16, "total": 16}
    # the same frame passes a ceiling of exactly its payload
    ok = RoundFrameDecoder(SALT, ceiling=16)
    ok.feed(frame_bytes(SALT))
    assert isinstance(ok.next_event(), RoundFrame)


def test_round_frame_bad_tag_and_salt() -> None:
    wire = bytearray(frame_bytes(SALT))
    wire[-1] ^= 1
    dec = RoundFrameDecoder(SALT)
    dec.feed(wire)
    with pytest.raises(AuthenticationError) as ei:
        dec.next_event()
    e = remote(ei.value, AuthenticationError, "frame.auth_failed")
    assert e.fields["carried"] == int.from_bytes(bytes(wire[-8:]), "little")
    assert e.fields["computed"] == int.from_bytes(tag(SALT, bytes(wire[:-8])), "little")
    assert dec.consumed == 55  # framed completely, then rejected
    with pytest.raises(AuthenticationError) as again:
        dec.next_event()
    assert again.value is e
    other = RoundFrameDecoder(ZERO)  # the zero salt signs the spec's example, not this frame
    other.feed(frame_bytes(SALT))
    with pytest.raises(AuthenticationError):
        other.next_event()
    with pytest.raises(InvalidValue) as bad:
        RoundFrameDecoder(b"short")
    assert isinstance(bad.value, LocalProtocolError)


def test_round_frame_bad_magic_is_reported_from_the_header() -> None:
    dec = RoundFrameDecoder(SALT)
    dec.feed(struct.pack("<II", 0xF10D17F0, 1))
    with pytest.raises(BadMagic) as ei:
        dec.next_event()
    assert remote(ei.value, BadMagic, "frame.bad_magic").fields == {
        "got": 0xF10D17F0, "expected": FRAME_MAGIC}


# -- MuxStream ------------------------------------------------------------------------------------
def test_mux_stream_defaults() -> None:
    stream = MuxStream(SALT)
    assert (stream.done, stream.buffered, stream.bytes_in, stream.payload_limit) == (
        False, 0, 0, GiB)
    # the default expects the data-channel magic, then records of protocol version 2 (a
    # version-2 Hello, which version 3 refuses)
    events = stream.feed(DATA_MAGIC + mux(SALT, 2, V2_HELLO))
    assert isinstance(events[0], MagicReceived) and events[0].nbytes == 4
    [rec] = events[1:]
    assert isinstance(rec, RecordReceived)
    assert isinstance(rec.record.control, Hello) and rec.record.control.ranks == (0, 1)
    assert stream.bytes_in == 4 + 25 + 7
    assert stream.feed_eof() == [StreamEnded()]
    assert stream.done


def test_mux_stream_magic_then_records_in_any_split() -> None:
    data = mux(SALT, 1, b"abc", rank=7)
    host = mux(SALT, 3, frame_bytes(SALT))
    wire = DATA_MAGIC + data + host
    for cut in (0, 2, 4, 10, 29, 32, 40, 60, len(wire) - 1, len(wire)):
        stream = MuxStream(SALT)
        events = stream.feed(wire[:cut])
        assert stream.bytes_in == cut
        events += stream.feed(wire[cut:])
        assert stream.bytes_in == len(wire)
        assert isinstance(events[0], MagicReceived), cut
        d, h = events[1:]
        assert isinstance(d, RecordReceived) and isinstance(h, RecordReceived)
        assert (d.record.kind, d.record.rank, bytes(d.record.payload), d.nbytes) == (
            RecordKind.DATA, 7, b"abc", 28)
        assert d.frame is None
        assert (d.header.kind, d.header.rank, d.header.payload_len, d.header.auth_tag) == (
            1, 7, 3, data[17:25])
        assert (h.record.kind, h.nbytes, h.header.payload_len) == (RecordKind.HOST_FRAME, 80, 55)
        assert isinstance(h.frame, RoundFrame) and h.frame.weight == 1.0
        assert bytes(h.frame.tensors[0].data) == struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
        assert stream.buffered == 0
        assert stream.feed_eof() == [StreamEnded()]


def test_mux_stream_buffers_a_split_record_and_copies_it() -> None:
    one = mux(SALT, 1, b"first", rank=1)  # 30 bytes
    two = mux(SALT, 1, b"second!", rank=2)  # 32 bytes
    stream = MuxStream(SALT, expect_magic=None)
    chunk = bytearray(one + two[:10])
    [a] = stream.feed(chunk)
    assert isinstance(a, RecordReceived) and a.record.payload.obj is chunk  # in place
    assert stream.buffered == 10
    assert stream.feed(two[10:24]) == []  # still inside the header
    assert stream.buffered == 24
    tail = bytearray(two[24:] + one)
    b, c = stream.feed(tail)
    assert isinstance(b, RecordReceived) and isinstance(c, RecordReceived)
    assert (b.record.rank, bytes(b.record.payload), b.nbytes) == (2, b"second!", 32)
    assert (c.record.rank, bytes(c.record.payload), c.nbytes) == (1, b"first", 30)
    assert b.record.payload.obj is not tail and c.record.payload.obj is not tail  # copies
    assert stream.buffered == 0
    assert stream.bytes_in == 30 + 32 + 30


def test_mux_stream_copy_decodes_every_record_from_a_copy() -> None:
    two = mux(SALT, 1, b"x", rank=1) + mux(SALT, 1, b"yz", rank=2)
    chunk = bytearray(two)
    a, b = MuxStream(SALT, expect_magic=None, copy=True).feed(chunk)
    assert isinstance(a, RecordReceived) and isinstance(b, RecordReceived)
    assert a.record.payload.obj is not chunk and b.record.payload.obj is not chunk
    chunk[:] = bytes(len(chunk))
    assert (bytes(a.record.payload), bytes(b.record.payload)) == (b"x", b"yz")
    c, d = MuxStream(SALT, expect_magic=None).feed(chunk := bytearray(two))
    assert isinstance(c, RecordReceived) and isinstance(d, RecordReceived)
    assert c.record.payload.obj is chunk and d.record.payload.obj is chunk


def test_mux_stream_record_of_exactly_the_chunk_is_decoded_in_place() -> None:
    chunk = bytearray(mux(SALT, 1, b"payload", rank=3))
    [ev] = MuxStream(SALT, expect_magic=None).feed(chunk)
    assert isinstance(ev, RecordReceived) and ev.record.payload.obj is chunk


@pytest.mark.parametrize("magic, error", [
    (struct.pack("<I", 0xF10D17E2), BadMagic),
    (b"GET ", BadMagic),
])
def test_mux_stream_wrong_channel_magic(magic: bytes, error: type[ProtocolError]) -> None:
    stream = MuxStream(SALT)
    f = failed(stream.feed(magic + mux(SALT, 2, V3_HELLO)))
    e = remote(f.error, error, "channel.bad_magic")
    got = struct.unpack("<I", magic)[0]
    assert e.fields == {"what": "cluster_controller", "got": got, "expected": 0xF10D17E1}
    assert str(e) == (f"cluster_controller: channel magic 0x{got:08x} != 0xf10d17e1 "
                      "(connection routed to the wrong channel?)")
    assert f.hint == ""
    assert (stream.done, stream.buffered) == (True, 0)
    assert stream.feed(mux(SALT, 2, V3_HELLO)) == []
    assert stream.feed_eof() == []
    assert stream.fail(e) == []


#: the hints of a stream of the other direction: no channel magic, or one where none belongs
NO_MAGIC_HINT = ("the stream starts with a mux record, not a channel magic (the controller -> "
                 "relay direction carries none)")


def test_mux_stream_of_the_other_direction_says_so_in_its_hint() -> None:
    # a stream without the channel magic (the controller's records) read as a relay's
    record = mux(SALT, 2, V3_HELLO)
    for chunks in ([record], [record[:3], record[3:]]):
        stream = MuxStream(SALT)
        f = failed([ev for c in chunks for ev in stream.feed(c)])
        e = remote(f.error, BadMagic, "channel.bad_magic")
        assert str(e) == ("cluster_controller: channel magic 0xf10d17d0 != 0xf10d17e1 "
                          "(connection routed to the wrong channel?)")
        assert f.hint == NO_MAGIC_HINT
    # a relay's stream, the channel magic first, read as the controller's; any channel's magic
    for name, magic in (("data", 0xF10D17E1), ("control", CONTROL_MAGIC)):
        f = failed(MuxStream(None, expect_magic=None).feed(struct.pack("<I", magic) + record))
        e = remote(f.error, BadMagic, "mux.bad_magic")
        assert str(e) == f"relay_mux: record magic 0x{magic:08x} != 0xf10d17d0"
        assert f.hint == (f"the stream starts with the {name} channel magic, not a mux record "
                          "(the relay -> controller direction starts with it)")
    # a magic after the first record is no direction's: no hint
    stream = MuxStream(SALT, expect_magic=None)
    events = stream.feed(record + struct.pack("<I", 0xF10D17E1) + record)
    assert isinstance(events[0], RecordReceived)
    f = failed(events[1:])
    assert f.error.error_id == "mux.bad_magic" and f.hint == ""


def test_mux_stream_other_channel_magic() -> None:
    stream = MuxStream(SALT, expect_magic=CONTROL_MAGIC)
    events = stream.feed(struct.pack("<I", CONTROL_MAGIC)[:3])
    assert events == [] and stream.buffered == 3
    [ev] = stream.feed(struct.pack("<I", CONTROL_MAGIC)[3:])
    assert ev == MagicReceived(4)
    f = failed(MuxStream(SALT, expect_magic=CONTROL_MAGIC).feed(DATA_MAGIC))
    assert remote(f.error, BadMagic, "channel.bad_magic").fields == {
        "what": "cluster_controller", "got": 0xF10D17E1, "expected": CONTROL_MAGIC}


@pytest.mark.parametrize("kept", [0, 1, 3])
def test_mux_stream_eof_inside_the_magic_fails(kept: int) -> None:
    stream = MuxStream(SALT)
    assert stream.feed(DATA_MAGIC[:kept]) == []
    f = failed(stream.feed_eof())
    e = remote(f.error, TruncatedInput, "channel.read_failed")
    assert e.fields == {"what": "cluster_controller", "got": kept}
    assert str(e) == ("cluster_controller: reading channel magic failed: failed to fill whole "
                      f"buffer ({kept} of 4 bytes)")
    assert f.hint == ""
    assert (stream.done, stream.buffered) == (True, 0)
    assert stream.feed_eof() == []
    assert stream.feed(DATA_MAGIC) == []


@pytest.mark.parametrize("kept", [0, 4, 5, 24])
def test_mux_stream_eof_inside_a_header_is_a_clean_end(kept: int) -> None:
    stream = MuxStream(SALT)
    stream.feed(DATA_MAGIC + mux(SALT, 1, b"abc")[:kept])
    assert stream.buffered == kept
    assert stream.feed_eof() == [StreamEnded()]
    assert (stream.done, stream.buffered) == (True, 0)
    assert stream.feed(b"more") == []
    assert stream.feed_eof() == []


@pytest.mark.parametrize("kept", [25, 27])
def test_mux_stream_eof_after_the_header_is_a_truncation(kept: int) -> None:
    stream = MuxStream(SALT, expect_magic=None)
    assert stream.feed(mux(SALT, 1, b"abc")[:kept]) == []
    f = failed(stream.feed_eof())
    e = remote(f.error, TruncatedInput, "mux.truncated")
    assert e.fields == {"got": kept, "need": 28}
    assert str(e) == ("relay_mux: peer closed mid-frame (committed read hit EOF) "
                      f"({kept} of 28 bytes)")
    assert (stream.done, stream.buffered) == (True, 0)


def test_mux_stream_eof_truncation_is_judged_with_the_streams_ceiling() -> None:
    stream = MuxStream(SALT, expect_magic=None, ceiling=2 * GiB)
    head = mux(SALT, 3, b"", claimed=GiB + 1)
    assert stream.feed(head + b"ab") == []
    f = failed(stream.feed_eof())
    assert remote(f.error, TruncatedInput, "mux.truncated").fields == {
        "got": 27, "need": 25 + GiB + 1}


def test_mux_stream_payload_over_the_ceiling_from_the_header() -> None:
    stream = MuxStream(SALT, expect_magic=None, ceiling=10)
    assert stream.payload_limit == 10
    [ok] = stream.feed(mux(SALT, 1, b"0123456789"))
    assert isinstance(ok, RecordReceived)
    f = failed(stream.feed(mux(SALT, 1, b"", rank=4, claimed=11)))  # the header alone
    e = remote(f.error, LimitExceeded, "mux.payload_too_large")
    assert e.fields == {"length": 11, "ceiling": 10, "kind": 1, "rank": 4}
    assert stream.done


def test_mux_stream_hello_limit_bounds_the_first_record_only() -> None:
    stream = MuxStream(SALT, expect_magic=None, ceiling=100, hello_limit=8)
    assert stream.payload_limit == 8
    [first] = stream.feed(mux(SALT, 2, V3_HELLO))  # exactly the limit
    assert isinstance(first, RecordReceived)
    assert stream.payload_limit == 100
    [second] = stream.feed(mux(SALT, 1, bytes(50)))
    assert isinstance(second, RecordReceived) and second.nbytes == 75
    assert MuxStream(SALT, ceiling=5, hello_limit=8).payload_limit == 5

    over = MuxStream(SALT, expect_magic=None, hello_limit=8)
    f = failed(over.feed(mux(SALT, 2, V3_HELLO + b"\x00")[:25]))  # the header alone
    e = remote(f.error, LimitExceeded, "controller.hello_too_long")
    assert e.fields == {"length": 9, "limit": 8, "kind": 2}
    assert "first record claims payload_len 9 (> 8 bytes" in str(e)
    assert (over.done, over.buffered) == (True, 0)


def test_mux_stream_hello_limit_in_the_buffered_path() -> None:
    stream = MuxStream(SALT, hello_limit=7)
    assert stream.feed(DATA_MAGIC + mux(SALT, 2, V3_HELLO)[:20]) == [MagicReceived()]
    f = failed(stream.feed(mux(SALT, 2, V3_HELLO)[20:]))
    assert remote(f.error, LimitExceeded, "controller.hello_too_long").fields == {
        "length": 8, "limit": 7, "kind": 2}


# a RankExit(3) padded to 10 bytes (bincode ignores the bytes after the message)
RANK_EXIT_10 = b"\x02\x03" + bytes(8)


def test_mux_stream_control_limit_bounds_every_control_record_after_the_first() -> None:
    """Departure control_bound: a Control record after the first claiming more than
    ``control_limit`` fails from its header alone (a rank list of up to one entry per byte was
    read and decoded up to the frame ceiling); one at the limit is decoded, and another kind's
    record is bounded by the ceiling only."""
    stream = MuxStream(SALT, expect_magic=None, ceiling=100, hello_limit=8, control_limit=10)
    assert (stream.limit_for(2), stream.limit_for(1)) == (8, 8)  # the first record: the Hello's
    [first] = stream.feed(mux(SALT, 2, V3_HELLO))
    assert isinstance(first, RecordReceived)
    assert (stream.limit_for(2), stream.limit_for(1), stream.limit_for(3)) == (10, 100, 100)
    [at] = stream.feed(mux(SALT, 2, RANK_EXIT_10))
    assert isinstance(at, RecordReceived) and at.record.control == RankExit(3)
    [data] = stream.feed(mux(SALT, 1, bytes(50)))
    assert isinstance(data, RecordReceived) and data.nbytes == 75
    f = failed(stream.feed(mux(SALT, 2, RANK_EXIT_10 + b"\x00")[:25]))  # the header alone
    e = remote(f.error, LimitExceeded, "controller.control_too_long")
    assert e.fields == {"length": 11, "limit": 10}
    assert str(e) == ("cluster_controller: a Control record after the Hello claims payload_len "
                      "11 (> 10 bytes, the longest legal control message for the world size); "
                      "corrupt or hostile peer")
    assert (stream.done, stream.buffered) == (True, 0)


def _fed_by(path: str, stream: MuxStream, wire: bytes, upto: int | None = None
            ) -> list[StreamEvent]:
    """The events of ``stream`` fed ``wire``: whole in one chunk (``"whole"``), whole with the
    runner's header hint (``"header hint"``), or a byte at a time (``"bytes one by one"``, its
    first ``upto`` bytes when given)."""
    if path == "whole":
        return stream.feed(wire)
    if path == "header hint":
        return stream.feed(wire, header=parse_mux_header(wire[:25]))
    events: list[StreamEvent] = []
    for i in range(len(wire) if upto is None else upto):
        events += stream.feed(wire[i:i + 1])
    return events


@pytest.mark.parametrize("path", ["whole", "header hint", "bytes one by one"])
def test_mux_stream_control_limit_in_every_feed_path(path: str) -> None:
    """The bound holds whichever way the record arrives: whole in one chunk, whole with the
    runner's header hint (the fast path), or a byte at a time (the buffered path, which fails
    at the 25th byte, before any payload byte)."""
    stream = MuxStream(SALT, expect_magic=None, hello_limit=8, control_limit=10)
    stream.feed(mux(SALT, 2, V3_HELLO))
    events = _fed_by(path, stream, mux(SALT, 2, RANK_EXIT_10 + bytes(20)), upto=25)
    assert remote(failed(events).error, LimitExceeded, "controller.control_too_long").fields == {
        "length": 30, "limit": 10}


@pytest.mark.parametrize("path", ["whole", "header hint", "bytes one by one"])
def test_mux_stream_control_limit_alone_leaves_the_first_record_to_the_ceiling(
        path: str) -> None:
    """Without a ``hello_limit``, ``control_limit`` still bounds only the Control records after
    the first, as its doc says: a first Control record longer than it is decoded (it was refused
    as 'a Control record after the Hello', naming a Hello the stream had not seen), and
    :meth:`MuxStream.limit_for` gives the ceiling for it."""
    stream = MuxStream(SALT, expect_magic=None, ceiling=100, control_limit=10)
    assert (stream.limit_for(2), stream.limit_for(1)) == (100, 100)
    wire = mux(SALT, 2, RANK_EXIT_10 + bytes(20))
    [first] = _fed_by(path, stream, wire)
    assert isinstance(first, RecordReceived) and first.record.control == RankExit(3)
    assert (stream.limit_for(2), stream.limit_for(1)) == (10, 100)
    f = failed(stream.feed(wire[:25]))
    assert remote(f.error, LimitExceeded, "controller.control_too_long").fields == {
        "length": 30, "limit": 10}


def test_mux_stream_control_limit_above_the_ceiling_is_the_ceiling() -> None:
    stream = MuxStream(SALT, expect_magic=None, ceiling=20, control_limit=1000)
    assert (stream.limit_for(2), stream.limit_for(1)) == (20, 20)
    f = failed(stream.feed(mux(SALT, 2, bytes(21))[:25]))
    assert remote(f.error, LimitExceeded, "mux.payload_too_large").fields["ceiling"] == 20


def test_mux_stream_bad_tag_fails_with_no_hint() -> None:
    wire = bytearray(mux(SALT, 1, b"abc", rank=2))
    wire[-1] ^= 0x80
    stream = MuxStream(SALT, expect_magic=None)
    f = failed(stream.feed(wire))
    e = remote(f.error, AuthenticationError, "mux.auth_failed")
    assert e.fields["computed"] == int.from_bytes(tag(SALT, bytes(wire[:17]), bytes(wire[25:])),
                                                  "little")
    assert e.fields["carried"] == int.from_bytes(bytes(wire[17:25]), "little")
    assert (e.fields["kind"], e.fields["rank"], e.fields["length"]) == (1, 2, 3)
    assert f.hint == ""
    assert (stream.done, stream.buffered) == (True, 0)


def test_mux_stream_failure_mid_chunk_drops_the_rest() -> None:
    bad = mux(ZERO, 1, b"b", rank=2)  # signed with another salt
    stream = MuxStream(SALT, expect_magic=None)
    events = stream.feed(mux(SALT, 1, b"a", rank=1) + bad + mux(SALT, 1, b"c", rank=3))
    assert isinstance(events[0], RecordReceived) and bytes(events[0].record.payload) == b"a"
    f = failed(events[1:])
    remote(f.error, AuthenticationError, "mux.auth_failed")
    assert f.hint == ""  # not the first record
    assert (stream.done, stream.buffered) == (True, 0)
    # the same in the buffered path
    stream = MuxStream(SALT, expect_magic=None)
    assert stream.feed(bad[:3]) == []
    f = failed(stream.feed(bad[3:] + mux(SALT, 1, b"c", rank=3)))
    remote(f.error, AuthenticationError, "mux.auth_failed")
    assert (stream.done, stream.buffered) == (True, 0)


def test_mux_stream_bad_header_fields() -> None:
    head = struct.pack("<IIBII", MUX_MAGIC, 2, 1, 0, 0)
    f = failed(MuxStream(SALT, expect_magic=None).feed(head + tag(SALT, head)))
    assert remote(f.error, ProtocolError, "mux.bad_version").fields == {"got": 2, "expected": 1}
    head = struct.pack("<IIBII", MUX_MAGIC + 1, 1, 1, 0, 0)
    f = failed(MuxStream(SALT, expect_magic=None).feed(head + tag(SALT, head)))
    assert remote(f.error, BadMagic, "mux.bad_magic").fields == {
        "got": MUX_MAGIC + 1, "expected": MUX_MAGIC}
    f = failed(MuxStream(SALT, expect_magic=None).feed(mux(SALT, 9, b"")))
    assert remote(f.error, InvalidValue, "mux.unknown_kind").fields == {"kind": 9}


# -- the hint for a Hello of the other protocol version ----------------------------------------
def test_first_record_a_hello_of_the_other_version_gives_a_hint() -> None:
    stream = MuxStream(SALT, version=3)
    events = stream.feed(DATA_MAGIC + mux(SALT, 2, V2_HELLO))
    assert isinstance(events[0], MagicReceived)
    f = failed(events[1:])
    remote(f.error, TruncatedInput, "bincode.unexpected_end")
    assert f.hint == V2_HINT_AT_V3
    # split: the same hint from the buffered path
    stream = MuxStream(SALT, version=3, expect_magic=None)
    assert stream.feed(mux(SALT, 2, V2_HELLO)[:30]) == []
    assert failed(stream.feed(mux(SALT, 2, V2_HELLO)[30:])).hint == V2_HINT_AT_V3


def test_no_hint_after_the_first_record_or_without_a_salt() -> None:
    stream = MuxStream(SALT, version=3, expect_magic=None)
    [ack] = stream.feed(mux(SALT, 2, HELLO_ACK))
    assert isinstance(ack, RecordReceived)
    f = failed(stream.feed(mux(SALT, 2, V2_HELLO)))
    remote(f.error, TruncatedInput, "bincode.unexpected_end")
    assert f.hint == ""
    f = failed(MuxStream(None, version=3, expect_magic=None).feed(mux(SALT, 2, V2_HELLO)))
    remote(f.error, TruncatedInput, "bincode.unexpected_end")
    assert f.hint == ""


def test_a_version_3_hello_read_at_version_2() -> None:
    # it decodes (bincode ignores the unread model_sigs): a record, no failure
    [rec] = MuxStream(SALT, version=2, expect_magic=None).feed(mux(SALT, 2, V3_HELLO))
    assert isinstance(rec, RecordReceived) and isinstance(rec.record.control, Hello)
    assert (rec.record.control.host, list(rec.record.control.ranks)) == ("h0", [0, 1])


@pytest.mark.parametrize("salt", [SALT, ZERO])
def test_other_version_hello(salt: bytes) -> None:
    v2, v3 = mux(salt, 2, V2_HELLO), mux(salt, 2, V3_HELLO)
    assert other_version_hello(v2, salt, 3) == V2_HINT_AT_V3
    assert other_version_hello(bytearray(v2), salt, 3) == V2_HINT_AT_V3
    assert other_version_hello(v3, salt, 2) == V3_HINT_AT_V2
    sig = bytes(range(32))
    assert other_version_hello(mux(salt, 2, V2_HELLO + b"\x01" + sig), salt, 2) == V3_HINT_AT_V2
    assert other_version_hello(v2, salt, 2) == ""  # a version-2 Hello: nothing unread at 2
    # not decodable at version 3 either: a count of 5 signatures with none there, and a
    # version-2 Hello with a non-minimal varint (the host name's length as 0xfb + u16)
    assert other_version_hello(mux(salt, 2, V2_HELLO + b"\x05"), salt, 2) == ""
    non_minimal = mux(salt, 2, bytes.fromhex("00fb02006830020001"))
    assert other_version_hello(non_minimal, salt, 2) == ""
    for payload in (HELLO_ACK, RANK_EXIT_3, b"\x03\x05"):  # other control messages
        assert other_version_hello(mux(salt, 2, payload), salt, 3) == ""
        assert other_version_hello(mux(salt, 2, payload), salt, 2) == ""
    assert other_version_hello(mux(salt, 1, V2_HELLO), salt, 3) == ""  # a Data record
    other = ZERO if salt == SALT else SALT
    assert other_version_hello(v2, other, 3) == ""  # a tag that does not verify
    assert other_version_hello(v2[:30], salt, 3) == ""  # truncated
    assert other_version_hello(b"", salt, 3) == ""  # no record at all


# -- HostFrame records: the inner RoundFrame ---------------------------------------------------
def test_host_frame_inner_frame_outcomes() -> None:
    good = frame_bytes(SALT)
    bad_tag = bytearray(good)
    bad_tag[-2] ^= 1
    stream = MuxStream(SALT, expect_magic=None)
    a, b, c, d = stream.feed(mux(SALT, 3, good) + mux(SALT, 3, bytes(bad_tag))
                             + mux(SALT, 3, good[:7]) + mux(SALT, 4, good))
    assert isinstance(a, RecordReceived) and isinstance(a.frame, RoundFrame)
    assert (a.frame.kind, a.frame.weight, a.nbytes) == (0, 1.0, 80)
    assert isinstance(b, RecordReceived) and isinstance(b.frame, AuthenticationError)
    assert b.frame.error_id == "frame.auth_failed"
    assert isinstance(c, RecordReceived) and c.frame is END_OF_STREAM  # inside the header
    assert isinstance(d, RecordReceived) and d.record.kind is RecordKind.BROADCAST
    assert d.frame is None  # only a HostFrame's payload is parsed
    assert not stream.done


def test_host_frame_without_a_salt_parses_the_inner_frame_without_its_tag() -> None:
    good = frame_bytes(SALT)
    bad_tag = bytearray(good)
    bad_tag[-2] ^= 1
    stream = MuxStream(None, expect_magic=None)
    a, b, c = stream.feed(mux(ZERO, 3, bytes(bad_tag)) + mux(ZERO, 3, good[:5])
                          + mux(ZERO, 3, good[:30]))
    assert isinstance(a, RecordReceived) and isinstance(a.frame, RoundFrame)
    assert bytes(a.frame.tensors[0].data) == struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
    assert isinstance(b, RecordReceived) and b.frame is END_OF_STREAM
    assert isinstance(c, RecordReceived) and isinstance(c.frame, TruncatedInput)
    assert c.frame.error_id == "frame.nbytes_read_failed"


# -- the MACs a runner computed as the bytes arrived (Premac) ---------------------------------
def test_premac_is_used_for_exactly_one_whole_record() -> None:
    rec = mux(SALT, 1, b"abc", rank=5)
    covered = rec[:17] + rec[25:]
    [ok] = MuxStream(SALT, expect_magic=None).feed(rec, premac=premac(SALT, covered))
    assert isinstance(ok, RecordReceived) and bytes(ok.record.payload) == b"abc"
    # a digest over other bytes is trusted (the decoder does not hash again): the tag fails
    wrong = premac(SALT, covered[:-1] + b"x")
    f = failed(MuxStream(SALT, expect_magic=None).feed(rec, premac=wrong))
    e = remote(f.error, AuthenticationError, "mux.auth_failed")
    assert e.fields["computed"] == int.from_bytes(wrong.digest[:8], "little")


def test_premac_is_ignored_unless_the_chunk_is_one_whole_record() -> None:
    rec = mux(SALT, 1, b"abc", rank=5)
    wrong = Premac(17 + 3, bytes(32))
    two = MuxStream(SALT, expect_magic=None).feed(rec + rec, premac=wrong)
    assert [type(ev) for ev in two] == [RecordReceived, RecordReceived]
    with_magic = MuxStream(SALT).feed(DATA_MAGIC + rec, premac=wrong)
    assert [type(ev) for ev in with_magic] == [MagicReceived, RecordReceived]
    stream = MuxStream(SALT, expect_magic=None)
    assert stream.feed(rec[:10]) == []
    [split] = stream.feed(rec[10:], premac=wrong)
    assert isinstance(split, RecordReceived)
    stream = MuxStream(SALT)
    assert stream.feed(DATA_MAGIC) == [MagicReceived()]
    [after_magic] = stream.feed(rec, premac=premac(SALT, rec[:17] + rec[25:]))
    assert isinstance(after_magic, RecordReceived)
    [copied] = MuxStream(SALT, expect_magic=None, copy=True).feed(rec, premac=wrong)
    assert isinstance(copied, StreamFailed)  # copy=True still takes the premac


def test_frame_premac_of_a_host_frame() -> None:
    fr = frame_bytes(SALT)
    rec = mux(SALT, 3, fr)
    rec_mac = premac(SALT, rec[:17] + rec[25:])
    [ok] = MuxStream(SALT, expect_magic=None).feed(rec, premac=rec_mac,
                                                   frame_premac=premac(SALT, fr[:-8]))
    assert isinstance(ok, RecordReceived) and isinstance(ok.frame, RoundFrame)
    wrong = premac(SALT, b"\x00" + fr[1:-8])
    [ev] = MuxStream(SALT, expect_magic=None).feed(rec, premac=rec_mac, frame_premac=wrong)
    assert isinstance(ev, RecordReceived) and isinstance(ev.frame, AuthenticationError)
    assert ev.frame.fields["computed"] == int.from_bytes(wrong.digest[:8], "little")
    # not one whole record: ignored
    a, b = MuxStream(SALT, expect_magic=None).feed(rec + rec, frame_premac=wrong)
    assert isinstance(a, RecordReceived) and isinstance(a.frame, RoundFrame)
    assert isinstance(b, RecordReceived) and isinstance(b.frame, RoundFrame)


# -- a failure reported by the runner ---------------------------------------------------------
def test_fail_reports_once_and_ends_the_stream() -> None:
    stream = MuxStream(SALT, expect_magic=None)
    assert stream.feed(mux(SALT, 1, b"abc")[:20]) == []
    err = protocol_error("mux.starved", seconds=60, got=20, need=28)
    assert stream.fail(err) == [StreamFailed(err, "")]
    assert (stream.done, stream.buffered) == (True, 0)
    assert stream.fail(err) == []
    assert stream.feed(mux(SALT, 1, b"abc")) == []
    assert stream.feed_eof() == []
    ended = MuxStream(SALT, expect_magic=None)
    assert ended.feed_eof() == [StreamEnded()]
    assert ended.fail(err) == []


# -- the leg's ceiling reaches the whole-record decoders --------------------------------------
def test_whole_record_decoders_get_the_streams_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model-derived ceiling may exceed the 1 GiB default; a frame larger than the default is
    too big to build in a test, so this checks the ceiling each whole-record decoder is handed
    (the header walk has checked the same bytes against it already)."""
    seen: list[tuple[str, object]] = []

    def spy(name: str) -> None:
        real = getattr(stream_module, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            seen.append((name, kwargs.get("ceiling")))
            return real(*args, **kwargs)

        monkeypatch.setattr(stream_module, name, wrapper)

    for name in ("decode_round_frame", "decode_round_frame_or_eos", "parse_round_frame_or_eos",
                 "read_mux_record_or_eos"):
        spy(name)
    ceiling = 3 * GiB
    dec = RoundFrameDecoder(SALT, ceiling=ceiling)
    dec.feed(frame_bytes(SALT))
    assert isinstance(dec.next_event(), RoundFrame)
    [signed] = MuxStream(SALT, expect_magic=None, ceiling=ceiling).feed(mux(SALT, 3,
                                                                            frame_bytes(SALT)))
    [unsigned] = MuxStream(None, expect_magic=None, ceiling=ceiling).feed(mux(ZERO, 3,
                                                                             frame_bytes(SALT)))
    assert isinstance(signed, RecordReceived) and isinstance(signed.frame, RoundFrame)
    assert isinstance(unsigned, RecordReceived) and isinstance(unsigned.frame, RoundFrame)
    assert seen == [("decode_round_frame", ceiling),
                    ("read_mux_record_or_eos", ceiling), ("decode_round_frame_or_eos", ceiling),
                    ("read_mux_record_or_eos", ceiling), ("parse_round_frame_or_eos", ceiling)]

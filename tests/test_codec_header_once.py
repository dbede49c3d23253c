"""A mux header is parsed once per record: a reader that parsed it before reading the payload
hands it to ``MuxStream.feed`` or ``decode_mux_record`` (``header=``), which then take the
record's length and fields from it, and give the events and errors they give without it."""

from __future__ import annotations

from typing import Any

import pytest

from flodl_proto.codec import (
    END_OF_STREAM,
    MuxRecord,
    RoundFrame,
    TensorPayload,
    encode_channel_magic,
    encode_frame_record,
    encode_mux_record_bytes,
)
from flodl_proto.codec import mux as mux_mod
from flodl_proto.codec import stream as stream_mod
from flodl_proto.codec.mux import (
    Hello,
    RecordKind,
    decode_mux_record,
    decode_mux_record_or_eos,
    parse_mux_header,
    read_mux_record_or_eos,
)
from flodl_proto.codec.stream import MuxStream, RecordReceived, StreamFailed
from flodl_proto.errors import ProtocolError

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
FRAME = RoundFrame(0, 2.0, [TensorPayload(0, (2,), bytes(range(8)))])


@pytest.fixture
def header_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the header parses of the stream and the record decoder."""
    calls: list[int] = []
    real = mux_mod.parse_mux_header_or_eos

    def counted(data: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(data, **kw)

    monkeypatch.setattr(mux_mod, "parse_mux_header_or_eos", counted)
    monkeypatch.setattr(stream_mod, "parse_mux_header_or_eos", counted)
    return calls


def _host_frame() -> bytes:
    return b"".join(bytes(p) for p in encode_frame_record(RecordKind.HOST_FRAME, FRAME, SALT))


def test_a_record_fed_with_its_header_is_not_parsed_again(header_parses: list[int]) -> None:
    wire = _host_frame()
    hdr = parse_mux_header(wire)
    header_parses.clear()
    [ev] = MuxStream(SALT, expect_magic=None).feed(wire, header=hdr)
    assert header_parses == []
    assert isinstance(ev, RecordReceived) and ev.header is hdr and ev.nbytes == len(wire)
    assert ev.frame == FRAME and bytes(ev.record.payload) == wire[25:]


def test_a_record_fed_alone_is_parsed_twice(header_parses: list[int]) -> None:
    """Without a header: once for its length, once by the decoder (not once more for the
    empty rest of the chunk)."""
    wire = _host_frame()
    [ev] = MuxStream(SALT, expect_magic=None).feed(wire)
    assert isinstance(ev, RecordReceived) and ev.frame == FRAME
    assert len(header_parses) == 2


def test_the_header_gives_the_same_events_as_the_bytes() -> None:
    records = [_host_frame(), encode_mux_record_bytes(MuxRecord.data(3, b"xyz"), SALT),
               encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0, 1])), SALT)]
    for wire in records:
        [a] = MuxStream(SALT, expect_magic=None).feed(wire)
        [b] = MuxStream(SALT, expect_magic=None).feed(wire, header=parse_mux_header(wire))
        assert isinstance(a, RecordReceived) and isinstance(b, RecordReceived)
        assert (a.record.kind, a.record.rank, bytes(a.record.payload), a.record.control,
                a.frame, a.nbytes, a.header) == (b.record.kind, b.record.rank,
                                                 bytes(b.record.payload), b.record.control,
                                                 b.frame, b.nbytes, b.header)


def test_a_header_past_the_hello_bound_is_reported_from_the_bytes() -> None:
    wire = encode_mux_record_bytes(MuxRecord.data(3, bytes(40)), SALT)
    hdr = parse_mux_header(wire)
    [ev] = MuxStream(SALT, expect_magic=None, hello_limit=39).feed(wire, header=hdr)
    assert isinstance(ev, StreamFailed) and ev.error.error_id == "controller.hello_too_long"
    assert ev.error.fields == {"length": 40, "limit": 39, "kind": 1}


def test_a_header_at_the_hello_bound_is_used(header_parses: list[int]) -> None:
    wire = encode_mux_record_bytes(MuxRecord.data(3, bytes(40)), SALT)
    hdr = parse_mux_header(wire)
    header_parses.clear()
    [ev] = MuxStream(SALT, expect_magic=None, hello_limit=40).feed(wire, header=hdr)
    assert isinstance(ev, RecordReceived) and bytes(ev.record.payload) == bytes(40)
    assert header_parses == []


def test_a_header_is_ignored_while_the_magic_is_awaited() -> None:
    """The chunk then starts with the channel magic, not with the record the header heads."""
    wire = _host_frame()
    magic = encode_channel_magic("data")
    stream = MuxStream(SALT)
    events = stream.feed(magic + wire, header=parse_mux_header(wire))
    assert len(events) == 2 and isinstance(events[1], RecordReceived)
    assert events[1].frame == FRAME


def test_a_header_is_ignored_when_bytes_are_buffered() -> None:
    wire = _host_frame()
    stream = MuxStream(SALT, expect_magic=None)
    assert stream.feed(wire[:10]) == []
    [ev] = stream.feed(wire[10:], header=parse_mux_header(wire))
    assert isinstance(ev, RecordReceived) and ev.frame == FRAME


def test_a_header_with_part_of_the_next_record_after_its_own() -> None:
    """The chunk holds the record the header heads and the start of the next one: the record
    is decoded, the rest is kept and completed by the next chunk."""
    wire = _host_frame()
    stream = MuxStream(SALT, expect_magic=None)
    [ev] = stream.feed(wire + wire[:10], header=parse_mux_header(wire))
    assert isinstance(ev, RecordReceived) and ev.frame == FRAME and ev.nbytes == len(wire)
    assert stream.buffered == 10
    [ev2] = stream.feed(wire[10:])
    assert isinstance(ev2, RecordReceived) and ev2.frame == FRAME and stream.buffered == 0


def test_a_whole_record_with_its_header_and_a_bad_tag_fails_the_stream() -> None:
    wire = bytearray(_host_frame())
    wire[30] ^= 0x01  # a payload byte: the record tag no longer matches
    stream = MuxStream(SALT, expect_magic=None)
    [ev] = stream.feed(bytes(wire), header=parse_mux_header(wire))
    assert isinstance(ev, StreamFailed) and ev.error.error_id == "mux.auth_failed"
    assert stream.done and stream.feed(_host_frame()) == []


def test_a_whole_record_with_its_header_is_copied_when_asked() -> None:
    """``copy=True``: the record does not view the chunk, even one the header vouches for."""
    wire = _host_frame()
    chunk = bytearray(wire)
    [ev] = MuxStream(SALT, expect_magic=None, copy=True).feed(chunk,
                                                              header=parse_mux_header(wire))
    chunk[30:] = bytes(len(chunk) - 30)
    assert isinstance(ev, RecordReceived) and bytes(ev.record.payload) == wire[25:]
    assert ev.frame == FRAME


def test_the_decoder_takes_the_header_it_is_handed(header_parses: list[int]) -> None:
    wire = encode_mux_record_bytes(MuxRecord.data(5, b"abc"), SALT)
    hdr = parse_mux_header(wire)
    header_parses.clear()
    rec, n = decode_mux_record(wire, SALT, header=hdr)
    assert (rec.rank, bytes(rec.payload), n) == (5, b"abc", len(wire))
    res = decode_mux_record_or_eos(wire, SALT, header=hdr)
    assert res != END_OF_STREAM and res[1] == len(wire)
    got = read_mux_record_or_eos(wire, SALT, header=hdr)
    assert got != END_OF_STREAM and got[1] is hdr
    assert header_parses == []


def test_a_truncated_record_with_its_header_is_still_truncated() -> None:
    wire = encode_mux_record_bytes(MuxRecord.data(5, b"abcdef"), SALT)
    with pytest.raises(ProtocolError) as exc:
        decode_mux_record(wire[:-2], SALT, header=parse_mux_header(wire))
    assert exc.value.error_id == "mux.truncated"
    assert exc.value.fields == {"got": len(wire) - 2, "need": len(wire)}


def test_a_tampered_record_with_its_header_fails_its_tag() -> None:
    wire = bytearray(encode_mux_record_bytes(MuxRecord.data(5, b"abcdef"), SALT))
    hdr = parse_mux_header(wire)
    wire[-1] ^= 1
    with pytest.raises(ProtocolError) as exc:
        decode_mux_record(wire, SALT, header=hdr)
    assert exc.value.error_id == "mux.auth_failed"

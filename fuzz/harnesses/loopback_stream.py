"""Target ``loopback_stream``: :class:`~flodl_proto.codec.loopback_stream.LoopbackStream`, one
direction of a rank <-> relay stream (the handshake or its ack, then length-prefixed
RoundFrames), fed in fuzzer-chosen chunks and compared with the one-shot readers (layout:
:mod:`fuzz.harnesses.streams`).

Flags: bit 0 protocol version (0: 2, 1: 3), bit 1 re-sign the frame of every blob, bit 2 salt,
bits 3-4 frame ceiling (1 GiB, 64 MiB, 1 KiB, 0), bit 5 direction (0: ``rank_to_relay``, the
16-byte handshake first; 1: ``relay_to_rank``, the 8-byte ack first), bit 6 the world size
checked (4; default: not checked).

Oracle: the events are ``HandshakeReceived`` or ``AckReceived`` (first), one ``FrameReceived``
per blob the one-shot readers accept (the relay's: ``decode_len_framed_or_eos``, then
``decode_round_frame_or_eos`` of the body, END_OF_STREAM there being ``fold.truncated``; the
rank's: ``decode_framed_round_or_eos``; same frame, same length, same trailing bytes), then
exactly one of ``StreamEnded`` (the one-shot reader reached a clean end) or ``StreamFailed``
with the one-shot reader's error; nothing after that, and no exception out of ``feed``. After each
chunk the stream holds at most one item's bytes (16, or 4 + the ceiling): a prefix above the
ceiling fails before its body is buffered.
"""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import (
    END_OF_STREAM,
    decode_ack,
    decode_framed_round_or_eos,
    decode_handshake,
    decode_len_framed_or_eos,
    decode_round_frame_or_eos,
)
from flodl_proto.codec.loopback_stream import (
    AckReceived,
    FrameReceived,
    HandshakeReceived,
    LoopbackStream,
)
from flodl_proto.codec.stream import StreamEnded, StreamFailed
from flodl_proto.errors import protocol_error
from flodl_proto.spec import HANDSHAKE_ACK_LEN, HANDSHAKE_LEN

from .common import CEILINGS, SALTS, check, chunks, outcome_of, remote, resign_len_framed
from .streams import split_input


def _frame(frame: Any) -> Any:
    return (frame.kind, frame.weight, [(t.dtype, t.shape, bytes(t.data)) for t in frame.tensors])


def _reference(payload: bytes, to_rank: bool, salt: bytes, version: int,
               world_size: int | None, ceiling: int) -> tuple[list[Any], Any]:
    """The one-shot readers' events and end for ``payload``."""
    want: list[Any] = []
    if to_rank:
        _, err = remote(decode_ack, payload, version)
        if err is not None:
            return want, ("failed", outcome_of(err))
        want.append(("ack", version))
        pos = HANDSHAKE_ACK_LEN
    else:
        hs, err = remote(decode_handshake, payload, world_size, version)
        if err is not None or hs is None:
            return want, ("failed", outcome_of(err))
        want.append(("handshake", hs[0]))
        rank = hs[0].rank
        pos = HANDSHAKE_LEN
    while True:
        if to_rank:
            res, err = remote(decode_framed_round_or_eos, payload[pos:], salt, ceiling=ceiling)
            if err is not None:
                return want, ("failed", outcome_of(err))
            if res is END_OF_STREAM or res is None:
                return want, ("ended",)
            want.append(("frame", _frame(res[0]), res[1], 0))
            pos += res[1]
            continue
        blob, err = remote(decode_len_framed_or_eos, payload[pos:], ceiling=ceiling)
        if err is not None:
            return want, ("failed", outcome_of(err))
        if blob is END_OF_STREAM or blob is None:
            return want, ("ended",)
        body, n = blob
        got, err = remote(decode_round_frame_or_eos, body, salt, ceiling=ceiling)
        if err is not None:
            return want, ("failed", outcome_of(err))
        if got is END_OF_STREAM or got is None:
            return want, ("failed", outcome_of(protocol_error("fold.truncated", rank=rank)))
        want.append(("frame", _frame(got[0]), n, body.nbytes - got[1]))
        pos += n


def test_one_input(data: bytes) -> None:
    """Stream ``data`` through a LoopbackStream and compare with the one-shot readers."""
    flags, sizes, payload = split_input(data)
    version = 3 if flags & 1 else 2
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    to_rank = bool(flags & 0x20)
    world_size = 4 if flags & 0x40 else None
    if flags & 2:
        head = HANDSHAKE_ACK_LEN if to_rank else HANDSHAKE_LEN
        tail = bytearray(payload[head:])
        resign_len_framed(tail, salt, ceiling)
        payload = payload[:head] + bytes(tail)

    want, end = _reference(payload, to_rank, salt, version, world_size, ceiling)

    stream = LoopbackStream("relay_to_rank" if to_rank else "rank_to_relay", salt,
                            version=version, world_size=world_size, ceiling=ceiling)
    events: list[Any] = []
    for chunk in chunks(payload, sizes):
        events += stream.feed(chunk)
        check(stream.buffered <= max(HANDSHAKE_LEN, 4 + ceiling),
              f"{stream.buffered} bytes buffered, more than one item of the ceiling {ceiling}")
    events += stream.feed_eof()
    check(stream.done and stream.buffered == 0, "stream not done after feed_eof")
    check(stream.feed(b"\0") == [] and stream.feed_eof() == [], "events after the stream ended")
    summary: list[Any] = []
    final: Any = None
    for ev in events:
        check(final is None, f"event {ev!r} after the stream ended")
        if isinstance(ev, HandshakeReceived):
            summary.append(("handshake", ev.handshake))
        elif isinstance(ev, AckReceived):
            summary.append(("ack", ev.version))
        elif isinstance(ev, FrameReceived):
            summary.append(("frame", _frame(ev.frame), ev.nbytes, ev.trailing))
        elif isinstance(ev, StreamEnded):
            final = ("ended",)
        elif isinstance(ev, StreamFailed):
            final = ("failed", outcome_of(ev.error))
        else:
            check(False, f"unknown event {ev!r}")
    check(summary == want, f"LoopbackStream gave {summary!r}\none-shot readers gave {want!r}")
    check(final == end, f"LoopbackStream ended with {final!r}, one-shot readers with {end!r}")

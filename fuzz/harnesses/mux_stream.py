"""Target ``mux_stream``: the one mux parser, :class:`~flodl_proto.codec.stream.MuxStream`
(the controller's, the decode CLI's and the tools'), fed a relay <-> controller stream in
fuzzer-chosen chunks and compared with the one-shot readers (layout:
:mod:`fuzz.harnesses.streams`).

Flags: bit 0 protocol version (0: 2, 1: 3), bit 1 re-sign every record, bit 2 salt, bits 3-4
frame ceiling (1 GiB, 64 MiB, 1 KiB, 0), bit 5 no channel magic expected (default: the data
channel's, the relay -> controller direction), bit 6 ``copy=True`` (each chunk is fed from a
buffer that is overwritten after the feed, so a record that still viewed it would differ from the
reference), bit 7 no tag checks (``salt=None``, as the decode CLI reads).

Oracle: the events are ``MagicReceived`` (first, when a magic is expected), one
``RecordReceived`` per record the one-shot reader accepts (same record, same length, same
header; for a HostFrame, the frame the one-shot frame reader gives, or its END_OF_STREAM, or its
error), then exactly one of ``StreamEnded`` (the one-shot reader reached a clean end) or
``StreamFailed`` with the one-shot reader's error; nothing after that, and no exception out of
``feed``.
"""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import (
    END_OF_STREAM,
    RecordKind,
    decode_round_frame_or_eos,
    expect_channel_magic,
)
from flodl_proto.codec.mux import read_mux_record_or_eos
from flodl_proto.codec.round_frame import parse_round_frame_or_eos
from flodl_proto.codec.stream import (
    MagicReceived,
    MuxStream,
    RecordReceived,
    StreamEnded,
    StreamFailed,
)
from flodl_proto.errors import ProtocolError
from flodl_proto.spec import CHANNEL_MAGIC_DATA

from .common import CEILINGS, SALTS, check, chunks, outcome_of, remote, resign_mux_records
from .streams import split_input


def _frame_outcome(frame: Any) -> Any:
    if frame is None or frame is END_OF_STREAM:
        return frame
    if isinstance(frame, ProtocolError):
        return outcome_of(frame)
    return ("frame", frame.kind, frame.weight, frame.tensors)


def test_one_input(data: bytes) -> None:
    """Stream ``data`` through a MuxStream and compare with the one-shot readers."""
    flags, sizes, payload = split_input(data)
    version = 3 if flags & 1 else 2
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    magic = None if flags & 0x20 else CHANNEL_MAGIC_DATA
    copy = bool(flags & 0x40)
    key = None if flags & 0x80 else salt
    if flags & 2:
        buf = bytearray(payload)
        resign_mux_records(buf, salt, ceiling, 0 if magic is None else 4)
        payload = bytes(buf)

    # one-shot reference
    want: list[Any] = []
    pos = 0
    end: Any = None
    if magic is not None:
        _, err = remote(expect_channel_magic, payload, magic, "cluster_controller")
        if err is not None:
            end = ("failed", outcome_of(err))
        else:
            want.append(("magic",))
            pos = 4
    while end is None:
        res, err = remote(read_mux_record_or_eos, payload[pos:], key, version=version,
                          ceiling=ceiling)
        if err is not None:
            end = ("failed", outcome_of(err))
        elif res is END_OF_STREAM or res is None:
            end = ("ended",)
        else:
            rec, hdr, n = res
            frame: Any = None
            if rec.kind is RecordKind.HOST_FRAME:
                if key is None:
                    fres, ferr = remote(parse_round_frame_or_eos, rec.payload, ceiling=ceiling)
                else:
                    fres, ferr = remote(decode_round_frame_or_eos, rec.payload, key,
                                        ceiling=ceiling)
                frame = ferr if ferr is not None else (
                    fres if fres is END_OF_STREAM or fres is None else fres[0])
            want.append(("record", rec.kind, rec.rank, bytes(rec.payload), rec.control, n, hdr,
                         _frame_outcome(frame)))
            pos += n

    stream = MuxStream(key, version=version, ceiling=ceiling, expect_magic=magic, copy=copy)
    events: list[Any] = []
    for chunk in chunks(payload, sizes):
        if copy:
            scratch = bytearray(chunk)
            events += stream.feed(scratch)
            scratch[:] = b"\xa5" * len(scratch)  # same length: allowed while views exist
        else:
            events += stream.feed(chunk)
    events += stream.feed_eof()
    check(stream.done, "stream not done after feed_eof")
    check(stream.feed(b"\0") == [] and stream.feed_eof() == [], "events after the stream ended")
    summary: list[Any] = []
    final: Any = None
    for ev in events:
        check(final is None, f"event {ev!r} after the stream ended")
        if isinstance(ev, MagicReceived):
            summary.append(("magic",))
        elif isinstance(ev, RecordReceived):
            rec = ev.record
            summary.append(("record", rec.kind, rec.rank, bytes(rec.payload), rec.control,
                            ev.nbytes, ev.header, _frame_outcome(ev.frame)))
        elif isinstance(ev, StreamEnded):
            final = ("ended",)
        elif isinstance(ev, StreamFailed):
            final = ("failed", outcome_of(ev.error))
        else:
            check(False, f"unknown event {ev!r}")
    check(summary == want, f"MuxStream gave {summary!r}\none-shot readers gave {want!r}")
    check(final == end, f"MuxStream ended with {final!r}, one-shot readers with {end!r}")

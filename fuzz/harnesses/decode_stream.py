"""Target ``decode_stream``: the capture decoder (``flodl_proto.decode``: ``detect_leg``,
``decode_stream``, ``format_table``), which ``flodl-proto decode`` runs on captured bytes.

Input layout: ``flags u8 | options u8 | wire bytes``. Flags: bits 0-1 the leg (0: told by
``detect_leg``, as ``--leg auto``; 1 ``mux``; 2 ``loopback``; 3 ``frame``), bit 2 verify tags
(with a salt), bit 3 the salt (the vectors' ``zero`` or ``b``), bits 4-5 the frame ceiling
(``CEILINGS``), bit 6 values (``--values``), bit 7 re-sign (the tags of the structurally valid
records of a ``mux`` or ``frame`` stream are rewritten first, with the salt of bit 3, so the
agreement check below sees clean streams). Options: bits 0-1 the version (0: none given, the
handshake's or 2; 1: 2; 2: 3; 3: 2).

Oracle (docs/decode.md): no input raises (``detect_leg`` only its ``UnknownLeg``); the records
follow each other from byte 0 (each record's ``offset`` is the end of the one before, its
``length`` above 0) and keep within the ceiling (a mux record's ``payload_len``, a length
prefix's ``body_len``, a bare frame's ``length``); ``end`` is the last record's end, ``size``
the input's length; a clean end has ``end == size``, a stopped one names ``end`` as its offset;
``count`` is the records'; every record and the final record are strict JSON
(``allow_nan=False``); a tag is ``unchecked`` exactly when no salt was given, and ``bad_tags``
counts the records' bad tags (and at most one more: the record that stopped decoding after its
tag step); ``on_record`` receives the same records; ``format_table`` renders the report. With a
salt, the mux and frame legs agree with the codec's salted one-shot readers
(``decode_mux_record_or_eos`` after the channel magic, then ``MuxRecord.frame`` for a HostFrame
or Broadcast; ``decode_round_frame_or_eos``): a report with a clean end and no bad tag is a
stream the readers read to its end, with the same number of records, and on the mux leg the
other way round.
"""

from __future__ import annotations

import json
from typing import Any

from flodl_proto.codec import (
    END_OF_STREAM,
    RecordKind,
    decode_mux_record_or_eos,
    decode_round_frame_or_eos,
    expect_channel_magic,
)
from flodl_proto.decode import Leg, UnknownLeg, decode_stream, detect_leg, format_table
from flodl_proto.errors import ProtocolError
from flodl_proto.spec import CHANNEL_MAGIC_LEN, CHANNELS

from .common import (
    CEILINGS,
    SALTS,
    Params,
    check,
    resign_mux_records,
    resign_round_frames,
)

_LEGS: tuple[Leg | None, ...] = (None, "mux", "loopback", "frame")
_VERSIONS = (None, 2, 3, 2)
_FRAMED = (RecordKind.HOST_FRAME, RecordKind.BROADCAST)
#: the field the frame ceiling bounds, per record type (decode_stream's ``ceiling``)
_BOUNDED = {"mux_record": "payload_len", "len_framed": "body_len", "round_frame": "length"}
_TYPES = {
    "mux": {"channel_magic", "mux_record"},
    "loopback": {"handshake", "handshake_ack", "len_framed"},
    "frame": {"round_frame"},
}


def _tags(rec: dict[str, Any]) -> list[str]:
    """The tag statuses a record shows: its own (mux) and its frame's."""
    out = [rec["tag_status"]] if "tag_status" in rec else []
    frame = rec.get("frame")
    if isinstance(frame, dict) and "tag_status" in frame:
        out.append(frame["tag_status"])
    return out


def _codec_reads(wire: bytes, leg: Leg, salt: bytes, version: int, ceiling: int
                 ) -> tuple[int, bool]:
    """Read ``wire`` with the codec's salted one-shot readers: ``(records, read to the end)``
    (the channel magic of a mux stream counts as a record, as the report lists it)."""
    mv = memoryview(wire)
    pos = count = 0
    try:
        if leg == "mux" and len(mv) >= CHANNEL_MAGIC_LEN and \
                int.from_bytes(mv[:CHANNEL_MAGIC_LEN], "little") in CHANNELS.values():
            pos = expect_channel_magic(mv, "data")
            count = 1
        while True:
            if leg == "mux":
                res: Any = decode_mux_record_or_eos(mv[pos:], salt, version=version,
                                                    ceiling=ceiling)
                if res is not END_OF_STREAM and res[0].kind in _FRAMED:
                    res[0].frame(salt, ceiling=ceiling)  # the frame a HostFrame carries
            else:
                res = decode_round_frame_or_eos(mv[pos:], salt, ceiling=ceiling)
            if res is END_OF_STREAM:
                return count, pos == len(mv)
            pos += res[1]
            count += 1
    except ProtocolError:
        return count, False


def test_one_input(data: bytes) -> None:
    """Decode ``data`` as a captured stream (layout in the module docstring) and check it."""
    p = Params(data)
    flags, options = p.u8(), p.u8()
    wire = bytearray(p.rest())
    salt_used = SALTS[flags >> 3 & 1]
    salt = salt_used if flags & 4 else None
    ceiling = CEILINGS[flags >> 4 & 3]
    values = bool(flags & 0x40)
    version = _VERSIONS[options & 3]
    leg = _LEGS[flags & 3]
    if leg is None:
        try:
            leg, why = detect_leg(bytes(wire))
        except UnknownLeg as e:
            check(len(wire) >= 8 and e.head == bytes(wire[:8]),
                  f"UnknownLeg for {len(wire)} bytes names {e.head.hex()}")
            return
        check(leg in _TYPES and bool(why), f"detect_leg gave {leg!r}, {why!r}")
    if flags & 0x80 and leg == "mux":
        start = CHANNEL_MAGIC_LEN if len(wire) >= CHANNEL_MAGIC_LEN and \
            int.from_bytes(wire[:CHANNEL_MAGIC_LEN], "little") in CHANNELS.values() else 0
        resign_mux_records(wire, salt_used, ceiling, start)
    elif flags & 0x80 and leg == "frame":
        resign_round_frames(wire, salt_used, ceiling)
    stream = bytes(wire)

    report = decode_stream(stream, leg, salt=salt, version=version, values=values,
                           ceiling=ceiling)
    records = report.records
    check(report.size == len(stream), f"size {report.size} for {len(stream)} bytes")
    check(report.count == len(records), f"count {report.count}, {len(records)} records")
    pos = 0
    shown_bad = 0
    for i, rec in enumerate(records):
        check(rec["offset"] == pos and rec["length"] > 0,
              f"record {i} at {rec['offset']}, {rec['length']} bytes; the one before ended "
              f"at {pos}")
        check(rec["type"] in _TYPES[leg], f"record {i} of the {leg} leg is a {rec['type']}")
        bounded = _BOUNDED.get(rec["type"])
        if bounded is not None:
            check(rec[bounded] <= ceiling, f"record {i}: a {rec['type']} of {bounded} "
                  f"{rec[bounded]} above the ceiling {ceiling}")
        pos += rec["length"]
        for status in _tags(rec):
            check(status == "unchecked" if salt is None else status in ("ok", "bad"),
                  f"record {i}: tag {status!r} with salt {salt is not None}")
            shown_bad += status == "bad"
        json.dumps(rec, allow_nan=False)
    check(report.end == pos and pos <= len(stream),
          f"end {report.end}, the records end at {pos} of {len(stream)}")
    final = report.final_record()
    json.dumps(final, allow_nan=False)
    failure = report.failure
    if failure is None:
        check(pos == len(stream), f"clean end at {pos} of {len(stream)} bytes")
        check(report.bad_tags == shown_bad, f"bad_tags {report.bad_tags}, {shown_bad} shown")
    else:
        check(failure.offset == pos, f"stopped at {failure.offset}, the records end at {pos}")
        check(0 <= report.bad_tags - shown_bad <= 1,
              f"bad_tags {report.bad_tags}, {shown_bad} shown, stopped at {failure.offset}")
        check(bool(failure.message) and "\n" not in failure.message,
              f"failure message {failure.message!r}")
    handed: list[dict[str, Any]] = []
    again = decode_stream(stream, leg, salt=salt, version=version, values=values,
                          ceiling=ceiling, on_record=handed.append)
    check(handed == records and not again.records and again.count == report.count
          and again.failure == failure and again.bad_tags == report.bad_tags,
          "on_record saw another decoding than the report's")
    for line in format_table(report):
        check(isinstance(line, str), f"format_table gave {line!r}")

    if salt is not None and leg in ("mux", "frame"):
        n, whole = _codec_reads(stream, leg, salt, report.version, ceiling)
        clean = failure is None and report.bad_tags == 0
        if clean:
            check(whole and n == report.count, f"{leg} leg: a clean report of {report.count} "
                  f"records; the codec read {n} and {'all' if whole else 'not all'} bytes")
        elif leg == "mux":
            # (a bare frame longer than the ceiling stops the report, not the reader: the
            # decoder bounds a frame's whole length, the codec its tensor bytes)
            check(not whole, f"mux leg: the codec read all {n} records; the report stopped "
                  f"({failure}, {report.bad_tags} bad tags)")

"""Target ``mux_record``: one relay <-> controller mux record read by ``decode_mux_record_or_eos``,
with the bincode control message of Control records and the RoundFrame of HostFrame / Broadcast
records.

Input layout: ``flags u8 | wire bytes``. Flags: bit 0 protocol version (0: 2, 1: 3; decides the
``Hello`` shape), bit 1 re-sign the record (inner frame tag first, then the record tag) so the
fuzzer reaches the kind and payload checks, bit 2 salt, bits 3-4 frame ceiling (1 GiB, 64 MiB,
1 KiB, 0).

Oracle: fewer than 25 bytes is END_OF_STREAM; the header checks agree with ``parse_mux_header``;
after the header the error is the first failing step of the spec's order (payload present, tag —
recomputed here with :mod:`hmac` — kind, bincode). An accepted record reports rank 0 unless it is
Data (leniency ``mux_rank_ignored``), re-encodes to the same bytes (with the wire's rank field),
fails under the other salt and one byte short; its control message obeys the ``control`` oracle and
its frame (HostFrame / Broadcast) the ``round_frame`` one, trailing bytes after the frame allowed
(leniency ``hostframe_trailing``).
"""

from __future__ import annotations

import hashlib
import hmac

from flodl_proto.codec import (
    END_OF_STREAM,
    MuxHeader,
    RecordKind,
    decode_control,
    decode_mux_record_or_eos,
    encode_mux_record_bytes,
    encode_mux_record_parts,
    parse_mux_header_or_eos,
)
from flodl_proto.errors import AuthenticationError, InvalidValue, TruncatedInput
from flodl_proto.spec import MUX_HEADER_LEN

from .common import (
    CEILINGS,
    SALTS,
    Params,
    check,
    check_frame_reencodes,
    exercise_views,
    outcome_of,
    remote,
    resign_mux_records,
)
from .control import check_control


def check_record_bytes(wire: bytes, salt: bytes, version: int, ceiling: int) -> None:
    """Decode one record from ``wire`` and apply the oracle (shared with the stream target)."""
    res, err = remote(decode_mux_record_or_eos, wire, salt, version=version, ceiling=ceiling)
    hdr, herr = remote(parse_mux_header_or_eos, wire, ceiling=ceiling)
    if len(wire) < MUX_HEADER_LEN:
        check(res is END_OF_STREAM and hdr is END_OF_STREAM,
              f"{len(wire)} bytes (inside the header) gave {res!r} / {err!r}")
        return
    check(res is not END_OF_STREAM, f"END_OF_STREAM after {len(wire)} bytes")
    if herr is not None:
        check(outcome_of(err) == outcome_of(herr), f"header check {herr!r} vs decoder {err!r}")
        return
    assert isinstance(hdr, MuxHeader)
    end = MUX_HEADER_LEN + hdr.payload_len
    if len(wire) < end:
        check(isinstance(err, TruncatedInput), f"short record gave {res!r} / {err!r}")
        return
    payload = wire[MUX_HEADER_LEN:end]
    tag = hmac.new(salt, wire[:17] + payload, hashlib.sha256).digest()[:8]
    if tag != wire[17:25]:
        check(isinstance(err, AuthenticationError), f"bad tag gave {res!r} / {err!r}")
        return
    if hdr.kind not in (1, 2, 3, 4):
        check(isinstance(err, InvalidValue) and err.error_id == "mux.unknown_kind",
              f"kind 0x{hdr.kind:02x} gave {res!r} / {err!r}")
        return
    if hdr.kind == RecordKind.CONTROL:
        _, cerr = remote(decode_control, payload, version)
        check(outcome_of(err) == outcome_of(cerr), f"control record {err!r} vs payload {cerr!r}")
        check_control(payload, version)
        if err is not None:
            return
    check(err is None and res is not None, f"valid record rejected: {err!r}")
    assert res is not None and res is not END_OF_STREAM
    rec, n = res
    check(n == end, f"consumed {n}, header says {end}")
    check(int(rec.kind) == hdr.kind and bytes(rec.payload) == payload, f"decoded {rec!r}")
    check(rec.rank == (hdr.rank if rec.kind is RecordKind.DATA else 0), f"rank {rec.rank}")
    again = b"".join(encode_mux_record_parts(hdr.kind, hdr.rank, [payload], salt,
                                             ceiling=ceiling))
    check(again == wire[:end], f"re-encoded {again.hex()} != {wire[:end].hex()}")
    if rec.kind is RecordKind.DATA:
        check(encode_mux_record_bytes(rec, salt) == wire[:end], "Data record re-encodes")
    other = SALTS[1] if salt == SALTS[0] else SALTS[0]
    _, err2 = remote(decode_mux_record_or_eos, wire[:end], other, version=version, ceiling=ceiling)
    check(isinstance(err2, AuthenticationError), f"record verified under the other salt: {err2!r}")
    short, err3 = remote(decode_mux_record_or_eos, wire[:end - 1], salt, version=version,
                         ceiling=ceiling)
    if end - 1 < MUX_HEADER_LEN:
        check(short is END_OF_STREAM, f"empty-payload record one byte short gave {short!r}")
    else:
        check(isinstance(err3, TruncatedInput), f"record one byte short gave {err3!r}")
    if rec.kind in (RecordKind.HOST_FRAME, RecordKind.BROADCAST):
        frame, ferr = remote(rec.frame, salt, ceiling=ceiling)
        if ferr is None:
            assert frame is not None
            check_frame_reencodes(frame, salt, payload[:frame.wire_len], "mux frame")
            exercise_views(frame, version)


def test_one_input(data: bytes) -> None:
    """Decode one mux record from ``data`` (layout in the module docstring) and check it."""
    p = Params(data)
    flags = p.u8()
    wire = p.rest()
    version = 3 if flags & 1 else 2
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    if flags & 2:
        buf = bytearray(wire)
        resign_mux_records(buf, salt, ceiling)
        wire = bytes(buf)
    check_record_bytes(wire, salt, version, ceiling)

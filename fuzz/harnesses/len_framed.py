"""Target ``len_framed``: loopback length-prefixed blobs (``decode_len_framed_or_eos``, what a relay
reads from a rank) and the rank-side prefixed reply frame (``decode_framed_round_or_eos``).

Input layout: ``flags u8 | wire bytes``. Flags: bit 0 mode (0: blob, 1: framed round), bit 1
re-sign the frame inside each blob, bit 2 salt, bits 3-4 frame ceiling (1 GiB, 64 MiB, 1 KiB, 0),
bit 5 protocol version for the tensor views (0: 2, 1: 3).

Oracle: fewer than 4 bytes is END_OF_STREAM; a prefix above the ceiling is LimitExceeded; a short
body is TruncatedInput; an accepted blob re-encodes to the same bytes and the frame a relay reads
from it obeys the ``round_frame`` oracle with trailing bytes allowed (leniency
``loopback_trailing``). A framed round must fill its prefix exactly: its outcome is the frame
reader's on the body, a truncation error when the body ends in the frame header or the frame leaves
bytes over, and an accepted one re-encodes to the same bytes.
"""

from __future__ import annotations

from flodl_proto.codec import (
    END_OF_STREAM,
    decode_framed_round_or_eos,
    decode_len_framed_or_eos,
    decode_round_frame_or_eos,
    encode_framed_round,
    encode_len_framed,
)
from flodl_proto.errors import LimitExceeded, TruncatedInput

from .common import (
    CEILINGS,
    SALTS,
    Params,
    check,
    check_frame_reencodes,
    exercise_views,
    outcome_of,
    remote,
    resign_len_framed,
)


def test_one_input(data: bytes) -> None:
    """Decode one blob or framed round from ``data`` (layout in the module docstring)."""
    p = Params(data)
    flags = p.u8()
    wire = p.rest()
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    version = 3 if flags & 0x20 else 2
    if flags & 2:
        buf = bytearray(wire)
        resign_len_framed(buf, salt, ceiling)
        wire = bytes(buf)
    framed = bool(flags & 1)
    if framed:
        res, err = remote(decode_framed_round_or_eos, wire, salt, ceiling=ceiling)
    else:
        res, err = remote(decode_len_framed_or_eos, wire, ceiling=ceiling)
    if len(wire) < 4:
        check(res is END_OF_STREAM, f"{len(wire)} bytes (inside the prefix) gave {res!r}/{err!r}")
        return
    check(res is not END_OF_STREAM, f"END_OF_STREAM after {len(wire)} bytes")
    length = int.from_bytes(wire[:4], "little")
    if length > ceiling:
        check(isinstance(err, LimitExceeded), f"prefix {length} > {ceiling} gave {res!r}/{err!r}")
        return
    body = wire[4:4 + length]
    if not framed:
        if len(body) < length:
            check(isinstance(err, TruncatedInput), f"short body gave {res!r}/{err!r}")
            return
        check(err is None and res is not None, f"complete blob rejected: {err!r}")
        assert res is not None and res is not END_OF_STREAM
        blob, n = res
        check(n == 4 + length and bytes(blob) == body, f"blob {bytes(blob).hex()}, {n}")
        check(b"".join(encode_len_framed(blob, ceiling=ceiling)) == wire[:n], "blob re-encodes")
        fres, ferr = remote(decode_round_frame_or_eos, blob, salt, ceiling=ceiling)
        if ferr is None and fres is not END_OF_STREAM:
            assert fres is not None
            check_frame_reencodes(fres[0], salt, body[:fres[1]], "deposited frame")
            exercise_views(fres[0], version)
        return
    fres, ferr = remote(decode_round_frame_or_eos, body, salt, ceiling=ceiling)
    if ferr is not None:
        check(outcome_of(err) == outcome_of(ferr), f"framed round {err!r}, frame reader {ferr!r}")
        return
    if fres is END_OF_STREAM or (fres is not None and fres[1] != length):
        check(isinstance(err, TruncatedInput), f"frame does not fill its prefix: {res!r}/{err!r}")
        return
    check(err is None and res is not None, f"exact framed round rejected: {err!r}")
    assert res is not None and res is not END_OF_STREAM
    frame, n = res
    check(n == 4 + length, f"consumed {n}")
    again = b"".join(encode_framed_round(frame, salt, ceiling=ceiling))
    check(again == wire[:n], f"framed round re-encodes to {again.hex()}")
    exercise_views(frame, version)

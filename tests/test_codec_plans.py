"""The MAC plans of ``codec.plans`` against HMACs computed here over the spec's byte ranges.

``spec/wire.yaml`` ``auth.coverage``: a RoundFrame's tag is the first 8 bytes of
HMAC-SHA256(key = session salt) over every byte before its last 8; a mux record's tag covers
header bytes 0..17 followed by the payload. The plans name the ranges an I/O reader feeds to its
streaming MACs; these tests feed exactly the ranges a plan names from hand-built records and
compare the digests with :mod:`hmac` over the ranges the spec names, computed independently.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest

from flodl_proto.codec import RoundFrame, decode_round_frame
from flodl_proto.codec.auth import Premac
from flodl_proto.codec.mux import parse_mux_header
from flodl_proto.codec.plans import (
    FrameMacs,
    RecordMacs,
    frame_macs,
    record_macs,
    signed_frame_batches,
)
from flodl_proto.codec.round_frame import TensorPayload, round_frame_pieces

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
ZERO = bytes(16)
MUX_MAGIC = 0xF10D17D0


def mac(salt: bytes, data: bytes) -> bytes:
    return hmac.new(salt, data, hashlib.sha256).digest()


def mux_header(kind: int, rank: int, payload: bytes, salt: bytes = SALT) -> bytes:
    head = struct.pack("<IIBII", MUX_MAGIC, 1, kind, rank, len(payload))
    return head + mac(salt, head + payload)[:8]


def frame_wire(salt: bytes, values: tuple[float, ...]) -> bytes:
    data = struct.pack(f"<{len(values)}f", *values)
    body = (struct.pack("<IIBd", 0xF10D17F1, 1, 0, 1.0) + bytes([0, 1])
            + struct.pack("<IQ", len(values), len(data)) + data)
    return body + mac(salt, body)[:8]


def feed(ranges: list[tuple[object, int, int]], buf: bytes) -> None:
    for m, start, stop in ranges:
        m.update(buf[start:stop])  # type: ignore[attr-defined]


# -- frame_macs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 8])
def test_frame_macs_too_short_for_a_tag(n: int) -> None:
    plan = frame_macs(n, SALT)
    assert plan == FrameMacs(None, 0, 0)
    assert plan.premac() is None
    assert plan.ranges() == [] and plan.ranges(100) == []


@pytest.mark.parametrize("n", [9, 55])
def test_frame_macs_cover_all_but_the_tag(n: int) -> None:
    buf = bytes(range(7, 7 + n))
    plan = frame_macs(n, SALT)
    assert (plan.start, plan.stop) == (0, n - 8)
    [(m, start, stop)] = plan.ranges()
    assert m is plan.mac and (start, stop) == (0, n - 8)
    [(m2, start2, stop2)] = plan.ranges(4)
    assert m2 is plan.mac and (start2, stop2) == (4, n - 4)
    feed(plan.ranges(), buf)
    assert plan.premac() == Premac(n - 8, mac(SALT, buf[:n - 8]))


def test_frame_macs_premac_authenticates_the_spec_example() -> None:
    wire = frame_wire(ZERO, (1.0, -2.5, 0.0, 3.25))
    assert wire[-8:].hex() == "39a58785a03c12d1"  # spec b.4
    plan = frame_macs(len(wire), ZERO)
    framed = struct.pack("<I", len(wire)) + wire  # as a reader holds it after the prefix
    feed(plan.ranges(4), framed)
    pm = plan.premac()
    assert pm is not None and pm.digest[:8] == wire[-8:]
    frame, n = decode_round_frame(wire, ZERO, premac=pm)
    assert n == 55 and frame.weight == 1.0
    assert frame_macs(len(wire), SALT).mac.digest() != mac(ZERO, b"")  # keyed with the salt
    assert frame_macs(9, SALT).mac.digest() == mac(SALT, b"")


def test_frame_macs_premac_counts_the_covered_range() -> None:
    # a plan over buffer[3:10] (the attributes name the range; frame_macs starts at 0)
    buf = bytes(range(20))
    plan = FrameMacs(hmac.new(SALT, digestmod="sha256"), 3, 10)
    assert plan.ranges(2) == [(plan.mac, 5, 12)]
    feed(plan.ranges(), buf)
    assert plan.premac() == Premac(7, mac(SALT, buf[3:10]))


# -- record_macs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, rank", [(1, 7), (2, 0), (4, 0)])
def test_record_macs_cover_the_header_prefix_and_the_payload(kind: int, rank: int) -> None:
    payload = bytes(range(40))
    record = mux_header(kind, rank, payload) + payload
    plan = record_macs(record[:25], parse_mux_header(record[:25]), SALT, inner_frame=True)
    assert (plan.size, plan.record_start, plan.record_stop) == (65, 25, 65)
    assert (plan.frame, plan.frame_start, plan.frame_stop) == (None, 0, 0)  # not a HostFrame
    assert plan.ranges() == [(plan.record, 25, 65)]
    assert plan.frame_premac() is None
    feed(plan.ranges(), record)
    pm = plan.premac()
    assert pm == Premac(17 + 40, mac(SALT, record[:17] + payload))
    assert pm.digest[:8] == record[17:25]  # the tag the header carries


def test_record_macs_header_may_be_the_whole_record() -> None:
    payload = b"abc"
    record = mux_header(1, 2, payload) + payload
    plan = record_macs(record, parse_mux_header(record), SALT)
    assert plan.size == 28
    feed(plan.ranges(), record)
    assert plan.premac() == Premac(20, mac(SALT, record[:17] + payload))


def test_record_macs_partial_payload() -> None:
    payload = bytes(range(30))
    record = mux_header(1, 0, payload) + payload
    plan = record_macs(record[:25], parse_mux_header(record[:25]), SALT)
    plan.record.update(record[25:35])
    assert plan.premac(10) == Premac(27, mac(SALT, record[:17] + payload[:10]))
    plan.record.update(record[35:])
    assert plan.premac() == Premac(47, mac(SALT, record[:17] + payload))
    assert plan.premac(0).covered == 17


def test_record_macs_host_frame_inner_frame() -> None:
    fr = frame_wire(SALT, (3.0, 6.0, -1.5))  # 51 bytes
    record = mux_header(3, 0, fr) + fr
    hdr = parse_mux_header(record[:25])
    plan = record_macs(record[:25], hdr, SALT, inner_frame=True)
    assert (plan.size, plan.record_start, plan.record_stop) == (76, 25, 76)
    assert (plan.frame_start, plan.frame_stop) == (25, 68)
    assert plan.ranges() == [(plan.record, 25, 76), (plan.frame, 25, 68)]
    assert plan.frame is not plan.record
    feed(plan.ranges(), record)
    assert plan.premac() == Premac(17 + 51, mac(SALT, record[:17] + fr))
    assert plan.frame_premac() == Premac(43, mac(SALT, fr[:-8]))
    fpm = plan.frame_premac()
    assert fpm is not None and fpm.digest[:8] == fr[-8:]
    frame, _ = decode_round_frame(fr, SALT, premac=fpm)
    assert isinstance(frame, RoundFrame) and frame.weight == 1.0

    without = record_macs(record[:25], hdr, SALT)  # inner frame not asked for
    assert (without.frame, without.frame_start, without.frame_stop) == (None, 0, 0)
    assert without.ranges() == [(without.record, 25, 76)]


@pytest.mark.parametrize("payload_len, planned", [(0, False), (8, False), (9, True)])
def test_record_macs_inner_frame_needs_more_than_a_tag(payload_len: int, planned: bool) -> None:
    payload = bytes(range(payload_len))
    record = mux_header(3, 0, payload) + payload
    plan = record_macs(record[:25], parse_mux_header(record[:25]), SALT, inner_frame=True)
    if planned:
        assert (plan.frame_start, plan.frame_stop) == (25, 25 + payload_len - 8)
        feed(plan.ranges(), record)
        assert plan.frame_premac() == Premac(payload_len - 8, mac(SALT, payload[:-8]))
    else:
        assert (plan.frame, plan.frame_start, plan.frame_stop) == (None, 0, 0)
        assert plan.frame_premac() is None


def test_record_macs_is_keyed_with_the_salt() -> None:
    record = mux_header(1, 0, b"", salt=ZERO)
    plan = record_macs(record, parse_mux_header(record), ZERO)
    assert plan.premac() == Premac(17, mac(ZERO, record[:17]))
    assert plan.premac().digest[:8] == record[17:25]
    assert record_macs(record, parse_mux_header(record), SALT).premac().digest != mac(
        ZERO, record[:17])


def test_record_macs_dataclass_defaults() -> None:
    plan = RecordMacs(30, None, 25, 30)
    assert (plan.frame, plan.frame_start, plan.frame_stop) == (None, 0, 0)


# -- signed_frame_batches ------------------------------------------------------------------------
def _batches(prefix: bytes, pieces: list[bytes], step: int) -> list[list[bytes]]:
    return [[bytes(b) for b in batch]
            for batch in signed_frame_batches(prefix, pieces, SALT, step)]


def test_signed_frame_batches_cut_and_sign() -> None:
    pieces = [b"abcdefg", b"hi"]
    t = mac(SALT, b"abcdefghi")[:8]  # the prefix is not covered
    assert _batches(b"PFX", pieces, 4) == [[b"PFX", b"abcd"], [b"efg", b"hi"], [t]]
    assert _batches(b"PFX", pieces, 5) == [[b"PFX", b"abcde"], [b"fg", b"hi", t]]
    assert _batches(b"PFX", pieces, 100) == [[b"PFX", b"abcdefg", b"hi", t]]
    assert _batches(b"", pieces, 3) == [[b"", b"abc"], [b"def"], [b"g", b"hi"], [t]]
    assert _batches(b"", [b"abcd"], 4) == [[b"", b"abcd"], [mac(SALT, b"abcd")[:8]]]
    assert _batches(b"PFX", [b"a"], 4) == [[b"PFX", b"a"], [mac(SALT, b"a")[:8]]]
    assert _batches(b"PF", [b"a"], 4) == [[b"PF", b"a", mac(SALT, b"a")[:8]]]
    assert _batches(b"PFX", [], 4) == [[b"PFX", mac(SALT, b"")[:8]]]
    assert _batches(b"PFX", [b"", b"ab"], 8) == [[b"PFX", b"ab", mac(SALT, b"ab")[:8]]]


def test_signed_frame_batches_copy_nothing() -> None:
    big = bytearray(range(10))
    batches = list(signed_frame_batches(b"P", [big], SALT, 4))
    views = [b for batch in batches for b in batch[:]]
    assert views[0] == b"P"
    parts = views[1:-1]
    assert [bytes(p) for p in parts] == [bytes(range(4)), bytes(range(4, 8)), bytes(range(8, 10))]
    assert all(isinstance(p, memoryview) and p.obj is big for p in parts)
    assert isinstance(views[-1], bytes) and views[-1] == mac(SALT, bytes(big))[:8]


def test_signed_frame_batches_write_a_signed_frame() -> None:
    frame = RoundFrame(0, 1.0, [TensorPayload(0, (4,), struct.pack("<4f", 1.0, -2.5, 0.0,
                                                                      3.25))])
    prefix = struct.pack("<I", 55)
    wire = b"".join(bytes(b) for batch in signed_frame_batches(
        prefix, round_frame_pieces(frame), ZERO, 16) for b in batch)
    assert wire == prefix + frame_wire(ZERO, (1.0, -2.5, 0.0, 3.25))
    assert wire[-8:].hex() == "39a58785a03c12d1"  # spec b.4

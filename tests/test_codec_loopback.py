"""Length-framed loopback blobs and the rank-side prefixed RoundFrame, against bytes built by hand.

Expected bytes come from ``spec/wire.yaml`` (``len_framed``: a little-endian u32 length, then the
body; ``round_frame``: magic, num_tensors, kind, f64 weight, per tensor dtype, ndim, u32 dims, u64
nbytes and data, then the 8-byte tag over every byte from the magic through the last payload byte)
with :func:`struct.pack` and :mod:`hmac`. Expected errors name the catalogue id, the side, the
fields and the exact message of the catalogue template, written out here as literals.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import struct

import numpy as np
import pytest

from flodl_proto import errors
from flodl_proto.codec import END_OF_STREAM, RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec import loopback as lb
from flodl_proto.codec.auth import Premac

from .codec_util import check

FRAME_MAGIC = 0xF10D17F1
ZERO_SALT = bytes(16)
SALT = bytes(range(1, 17))
GIB = 1 << 30
U32_MAX = 2**32 - 1


def mac(salt: bytes, covered: bytes) -> bytes:
    return hmac.new(salt, covered, hashlib.sha256).digest()


def frame_wire(salt: bytes, kind: int, weight: float,
               tensors: list[tuple[int, tuple[int, ...], bytes]], *,
               nbytes: list[int] | None = None) -> bytes:
    """A RoundFrame built field by field; ``nbytes`` overrides the declared payload sizes."""
    out = struct.pack("<IIBd", FRAME_MAGIC, len(tensors), kind, weight)
    for i, (dtype, shape, data) in enumerate(tensors):
        n = len(data) if nbytes is None else nbytes[i]
        out += struct.pack(f"<BB{len(shape)}IQ", dtype, len(shape), *shape, n) + data
    return out + mac(salt, out)[:8]


#: spec/wire.yaml examples.framed_round: Model, weight 1.0, f32 [2] = [0.5, -0.5], zero salt
SPEC_FRAMED_ROUND = bytes.fromhex(
    "2f000000" "f1170df1" "01000000" "00" "000000000000f03f" "00" "01" "02000000"
    "0800000000000000" "0000003f000000bf" "258a7fbb3b5825c6")
HALVES = struct.pack("<2f", 0.5, -0.5)


def spec_frame() -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, (2,), HALVES)])


def joined(pieces: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(memoryview(p)) for p in pieces)


def test_hand_builder_matches_the_spec_example() -> None:
    assert frame_wire(ZERO_SALT, 0, 1.0, [(0, (2,), HALVES)]) == SPEC_FRAMED_ROUND[4:]
    assert mac(ZERO_SALT, SPEC_FRAMED_ROUND[4:43]).hex() == (
        "258a7fbb3b5825c63e575e34799b84dcd5fb8eddc04f43eea77c67c8ff32ca36")


# -- encode_len_prefix --------------------------------------------------------------------------
@pytest.mark.parametrize(("length", "ceiling", "wire"), [
    (0, GIB, "00000000"),
    (1, GIB, "01000000"),
    (47, 47, "2f000000"),
    (0x01020304, GIB, "04030201"),
    (GIB, GIB, "00000040"),
    (U32_MAX, U32_MAX, "ffffffff"),
    (U32_MAX, 1 << 40, "ffffffff"),
    (0, 0, "00000000"),
])
def test_encode_len_prefix(length: int, ceiling: int, wire: str) -> None:
    got = lb.encode_len_prefix(length, ceiling=ceiling)
    assert isinstance(got, bytes)
    assert got == bytes.fromhex(wire) == struct.pack("<I", length)


def test_encode_len_prefix_default_ceiling_is_1_gib() -> None:
    assert lb.encode_len_prefix(GIB) == struct.pack("<I", GIB)
    with pytest.raises(errors.LimitExceeded) as exc:
        lb.encode_len_prefix(GIB + 1)
    check(exc, errors.LimitExceeded, False, "len.write_too_large",
          f"relay_mux: len-framed blob length {GIB + 1} exceeds the frame ceiling {GIB}; model "
          "has outgrown the frame ceiling (see wire::frame_ceiling)",
          length=GIB + 1, ceiling=GIB)


@pytest.mark.parametrize(("length", "ceiling"), [
    (48, 47),
    (1, 0),
    (11, 10),
    (U32_MAX + 1, U32_MAX),
    (1 << 41, 1 << 40),  # past both: the ceiling is checked first, as upstream's writer does
])
def test_encode_len_prefix_rejects(length: int, ceiling: int) -> None:
    with pytest.raises(errors.LimitExceeded) as exc:
        lb.encode_len_prefix(length, ceiling=ceiling)
    check(exc, errors.LimitExceeded, False, "len.write_too_large",
          f"relay_mux: len-framed blob length {length} exceeds the frame ceiling {ceiling}; "
          "model has outgrown the frame ceiling (see wire::frame_ceiling)",
          length=length, ceiling=ceiling)


@pytest.mark.parametrize("length", [U32_MAX + 1, 1 << 40])
def test_encode_len_prefix_past_u32_within_the_ceiling(length: int) -> None:
    # a ceiling above u32 lets the length past the prefix's width: upstream's second check
    with pytest.raises(errors.LimitExceeded) as exc:
        lb.encode_len_prefix(length, ceiling=1 << 40)
    check(exc, errors.LimitExceeded, False, "len.write_past_u32",
          f"relay_mux: len-framed blob too large: {length} bytes (max 4294967295)",
          length=length, max=U32_MAX)


@pytest.mark.parametrize("length", [True, False, 1.0, 2.5, "1", None])
def test_encode_len_prefix_refuses_a_length_that_is_no_integer(length: object) -> None:
    """The codec's integer rule: ``True`` was written as 1, ``1.0`` packed as 1. The error is
    the length prefix's own, not a mux record's (it said "relay_mux: ...")."""
    with pytest.raises(errors.InvalidValue) as exc:
        lb.encode_len_prefix(length)  # type: ignore[arg-type]
    check(exc, errors.InvalidValue, False, "len.bad_field",
          f"len-framed prefix: length = {length!r} is invalid: not an integer",
          field="length", value=length, reason="not an integer")


@pytest.mark.parametrize(("length", "ceiling"), [
    (-1, GIB), (-1, 1 << 40), (-(1 << 40), GIB), (np.int64(-5), GIB),
])
def test_encode_len_prefix_refuses_a_negative_length(length: int, ceiling: int) -> None:
    """A negative length is a bad value, not one that "exceeds the frame ceiling"."""
    with pytest.raises(errors.InvalidValue) as exc:
        lb.encode_len_prefix(length, ceiling=ceiling)
    n = int(length)
    check(exc, errors.InvalidValue, False, "len.bad_field",
          f"len-framed prefix: length = {n!r} is invalid: negative",
          field="length", value=n, reason="negative")


def test_encode_len_prefix_takes_a_numpy_integer() -> None:
    assert lb.encode_len_prefix(np.uint32(47), ceiling=47) == b"\x2f\x00\x00\x00"
    assert lb.encode_len_prefix(np.int64(0)) == bytes(4)


@pytest.mark.parametrize("ceiling", [-1, True, 1.5])
def test_encode_len_prefix_rejects_a_bad_ceiling(ceiling: object) -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        lb.encode_len_prefix(0, ceiling=ceiling)  # type: ignore[arg-type]
    check(exc, errors.InvalidValue, False, "ceiling.invalid",
          f"frame ceiling must be a non-negative number of bytes, got {ceiling!r}",
          value=ceiling)


# -- encode_len_framed --------------------------------------------------------------------------
@pytest.mark.parametrize("blob", [b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_encode_len_framed_one_buffer(blob: bytes | bytearray | memoryview) -> None:
    out = lb.encode_len_framed(blob)
    assert len(out) == 2
    assert out[0] == b"\x03\x00\x00\x00"
    assert out[1] is blob  # the body is not copied


def test_encode_len_framed_pieces_in_order_uncopied() -> None:
    a, b, c = b"12", bytearray(b"345"), memoryview(b"")
    out = lb.encode_len_framed([a, b, c])
    assert out[0] == struct.pack("<I", 5)
    assert out[1] is a and out[2] is b and out[3] is c and len(out) == 4
    assert lb.encode_len_framed((a, b)) == [struct.pack("<I", 5), a, b]
    assert lb.encode_len_framed([]) == [b"\x00\x00\x00\x00"]


def test_encode_len_framed_counts_bytes_not_items() -> None:
    words = memoryview(array.array("I", [1, 2, 3]))  # 3 items of 4 bytes
    out = lb.encode_len_framed(words)
    assert out[0] == struct.pack("<I", 12)
    assert lb.encode_len_framed([words, b"x"])[0] == struct.pack("<I", 13)


def test_encode_len_framed_ceiling() -> None:
    assert lb.encode_len_framed(b"abcd", ceiling=4) == [b"\x04\x00\x00\x00", b"abcd"]
    with pytest.raises(errors.LimitExceeded) as exc:
        lb.encode_len_framed([b"ab", b"cde"], ceiling=4)
    check(exc, errors.LimitExceeded, False, "len.write_too_large",
          "relay_mux: len-framed blob length 5 exceeds the frame ceiling 4; model has outgrown "
          "the frame ceiling (see wire::frame_ceiling)", length=5, ceiling=4)


# -- encode_framed_round ------------------------------------------------------------------------
def test_encode_framed_round_spec_example() -> None:
    out = lb.encode_framed_round(spec_frame(), ZERO_SALT)
    assert bytes(out[0]) == b"\x2f\x00\x00\x00"
    assert joined(out) == SPEC_FRAMED_ROUND


def test_encode_framed_round_salt_and_fields() -> None:
    data = struct.pack("<3f", 1.0, 2.0, 3.0)
    frame = RoundFrame(RoundKind.CONTROL, 2.5, [TensorPayload(0, (3, 1), data)])
    body = frame_wire(SALT, 1, 2.5, [(0, (3, 1), data)])
    assert joined(lb.encode_framed_round(frame, SALT)) == struct.pack("<I", len(body)) + body


def test_encode_framed_round_ceiling() -> None:
    assert joined(lb.encode_framed_round(spec_frame(), ZERO_SALT, ceiling=47)) == (
        SPEC_FRAMED_ROUND)
    with pytest.raises(errors.LimitExceeded) as exc:
        lb.encode_framed_round(spec_frame(), ZERO_SALT, ceiling=46)
    check(exc, errors.LimitExceeded, False, "len.write_too_large",
          "relay_mux: len-framed blob length 47 exceeds the frame ceiling 46; model has "
          "outgrown the frame ceiling (see wire::frame_ceiling)", length=47, ceiling=46)


def test_encode_framed_round_bad_salt() -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        lb.encode_framed_round(spec_frame(), bytes(15))
    check(exc, errors.InvalidValue, False, "salt.bad_length",
          "session salt must be 16 bytes, got 15", expected=16, got=15)


# -- decode_len_prefix(_or_eos) -----------------------------------------------------------------
@pytest.mark.parametrize(("wire", "ceiling", "length"), [
    ("00000000", GIB, 0),
    ("2f000000", 47, 47),
    ("04030201", GIB, 0x01020304),
    ("00000040", GIB, GIB),
    ("ffffffff", U32_MAX, U32_MAX),
    ("05000000" "ffffffff", 5, 5),  # bytes after the prefix are not read
])
def test_decode_len_prefix(wire: str, ceiling: int, length: int) -> None:
    data = bytes.fromhex(wire)
    for f in (lb.decode_len_prefix, lb.decode_len_prefix_or_eos):
        got = f(data, ceiling=ceiling)
        assert got == length and type(got) is int
        assert f(memoryview(bytearray(data)), ceiling=ceiling) == length


def test_decode_len_prefix_default_ceiling_is_1_gib() -> None:
    assert lb.decode_len_prefix(struct.pack("<I", GIB)) == GIB
    assert lb.decode_len_prefix_or_eos(struct.pack("<I", GIB)) == GIB
    for f in (lb.decode_len_prefix, lb.decode_len_prefix_or_eos):
        with pytest.raises(errors.LimitExceeded) as exc:
            f(struct.pack("<I", GIB + 1))
        check(exc, errors.LimitExceeded, True, "len.too_large",
              f"relay_mux: len-framed blob length {GIB + 1} exceeds the frame ceiling {GIB}; "
              "corrupt or hostile peer", length=GIB + 1, ceiling=GIB)


@pytest.mark.parametrize(("length", "ceiling"), [(48, 47), (1, 0), (U32_MAX, GIB)])
def test_decode_len_prefix_above_ceiling(length: int, ceiling: int) -> None:
    for f in (lb.decode_len_prefix, lb.decode_len_prefix_or_eos):
        with pytest.raises(errors.LimitExceeded) as exc:
            f(struct.pack("<I", length) + b"body", ceiling=ceiling)
        check(exc, errors.LimitExceeded, True, "len.too_large",
              f"relay_mux: len-framed blob length {length} exceeds the frame ceiling {ceiling}; "
              "corrupt or hostile peer", length=length, ceiling=ceiling)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_decode_len_prefix_short_input(n: int) -> None:
    data = b"\x05\x00\x00"[:n]
    assert lb.decode_len_prefix_or_eos(data) is END_OF_STREAM
    with pytest.raises(errors.TruncatedInput) as exc:
        lb.decode_len_prefix(data)
    check(exc, errors.TruncatedInput, True, "len.prefix_read_failed",
          "relay_mux: len-framed prefix read failed: input ended inside the 4-byte prefix "
          f"({n} of 4 bytes; a stream reader takes this as a clean end of stream)",
          got=n, need=4)


@pytest.mark.parametrize("ceiling", [-1, False])
def test_decode_len_prefix_rejects_a_bad_ceiling(ceiling: int) -> None:
    for f in (lb.decode_len_prefix, lb.decode_len_prefix_or_eos, lb.decode_len_framed,
              lb.decode_len_framed_or_eos):
        with pytest.raises(errors.InvalidValue) as exc:
            f(b"\x00\x00\x00\x00", ceiling=ceiling)
        check(exc, errors.InvalidValue, False, "ceiling.invalid",
              f"frame ceiling must be a non-negative number of bytes, got {ceiling!r}",
              value=ceiling)


# -- decode_len_framed(_or_eos) -----------------------------------------------------------------
@pytest.mark.parametrize(("wire", "body", "used"), [
    ("00000000", "", 4),
    ("03000000616263", "616263", 7),
    ("02000000616263", "6162", 6),  # a following blob's bytes are left alone
    ("01000000ff" "01000000ee", "ff", 5),
])
def test_decode_len_framed(wire: str, body: str, used: int) -> None:
    data = bytearray.fromhex(wire)
    for f in (lb.decode_len_framed, lb.decode_len_framed_or_eos):
        res = f(data)
        assert res is not END_OF_STREAM
        view, consumed = res
        assert isinstance(view, memoryview)
        assert bytes(view) == bytes.fromhex(body) and consumed == used
        if view.nbytes:
            data[4] ^= 0xFF  # the body is a view into the input, not a copy
            assert view[0] == data[4]
            data[4] ^= 0xFF


def test_decode_len_framed_ceiling() -> None:
    data = b"\x04\x00\x00\x00abcd"
    for f in (lb.decode_len_framed, lb.decode_len_framed_or_eos):
        res = f(data, ceiling=4)
        assert res is not END_OF_STREAM and (bytes(res[0]), res[1]) == (b"abcd", 8)
        with pytest.raises(errors.LimitExceeded) as exc:
            f(data, ceiling=3)
        check(exc, errors.LimitExceeded, True, "len.too_large",
              "relay_mux: len-framed blob length 4 exceeds the frame ceiling 3; "
              "corrupt or hostile peer", length=4, ceiling=3)


@pytest.mark.parametrize(("wire", "got", "need"), [
    ("05000000", 0, 5),
    ("05000000" "61626364", 4, 5),
    ("01000000", 0, 1),
])
def test_decode_len_framed_short_body(wire: str, got: int, need: int) -> None:
    for f in (lb.decode_len_framed, lb.decode_len_framed_or_eos):
        with pytest.raises(errors.TruncatedInput) as exc:
            f(bytes.fromhex(wire))
        check(exc, errors.TruncatedInput, True, "len.body_read_failed",
              "relay_mux: len-framed body read failed: failed to fill whole buffer "
              f"({got} of {need} bytes)", got=got, need=need)


@pytest.mark.parametrize("n", [0, 2, 3])
def test_decode_len_framed_short_prefix(n: int) -> None:
    data = memoryview(b"\x00\x00\x00")[:n]
    assert lb.decode_len_framed_or_eos(data) is END_OF_STREAM
    with pytest.raises(errors.TruncatedInput) as exc:
        lb.decode_len_framed(data)
    check(exc, errors.TruncatedInput, True, "len.prefix_read_failed",
          "relay_mux: len-framed prefix read failed: input ended inside the 4-byte prefix "
          f"({n} of 4 bytes; a stream reader takes this as a clean end of stream)",
          got=n, need=4)


# -- decode_framed_round(_or_eos) ---------------------------------------------------------------
def both_round_decoders() -> list[object]:
    return [lb.decode_framed_round, lb.decode_framed_round_or_eos]


@pytest.mark.parametrize("decode", both_round_decoders())
def test_decode_framed_round_spec_example(decode: object) -> None:
    res = decode(SPEC_FRAMED_ROUND + b"\x99" * 5, ZERO_SALT)  # type: ignore[operator]
    assert res is not END_OF_STREAM
    frame, used = res
    assert used == 51
    assert frame.kind is RoundKind.MODEL and frame.weight == 1.0
    assert len(frame.tensors) == 1
    t = frame.tensors[0]
    assert (t.dtype, t.shape, bytes(t.data)) == (0, (2,), HALVES)
    assert frame == spec_frame()


@pytest.mark.parametrize("decode", both_round_decoders())
def test_decode_framed_round_fields_and_salt(decode: object) -> None:
    d0, d1 = struct.pack("<4e", 1, 2, 3, 4)[:6], b""
    body = frame_wire(SALT, 1, 0.25, [(1, (3,), d0), (0, (0, 7), d1)])
    res = decode(struct.pack("<I", len(body)) + body, SALT)  # type: ignore[operator]
    assert res is not END_OF_STREAM
    frame, used = res
    assert used == 4 + len(body)
    assert frame == RoundFrame(RoundKind.CONTROL, 0.25,
                               [TensorPayload(1, (3,), d0), TensorPayload(0, (0, 7), d1)])
    with pytest.raises(errors.AuthenticationError) as exc:
        decode(struct.pack("<I", len(body)) + body, ZERO_SALT)  # type: ignore[operator]
    assert exc.value.remote and exc.value.error_id == "frame.auth_failed"


@pytest.mark.parametrize("decode", both_round_decoders())
def test_decode_framed_round_uses_the_premac(decode: object) -> None:
    covered = SPEC_FRAMED_ROUND[4:43]
    good = Premac(39, mac(ZERO_SALT, covered))
    res = decode(SPEC_FRAMED_ROUND, ZERO_SALT, premac=good)  # type: ignore[operator]
    assert res is not END_OF_STREAM and res[0] == spec_frame() and res[1] == 51
    # a premac over other bytes is trusted (it is the caller's): the frame fails its tag
    wrong = mac(ZERO_SALT, b"other bytes")
    with pytest.raises(errors.AuthenticationError) as exc:
        decode(SPEC_FRAMED_ROUND, ZERO_SALT, premac=Premac(39, wrong))  # type: ignore[operator]
    e = exc.value
    assert e.remote and e.error_id == "frame.auth_failed"
    assert dict(e.fields) == {"computed": int.from_bytes(wrong[:8], "little"),
                              "carried": int.from_bytes(bytes.fromhex("258a7fbb3b5825c6"),
                                                        "little")}


@pytest.mark.parametrize("decode", both_round_decoders())
def test_decode_framed_round_ceiling(decode: object) -> None:
    res = decode(SPEC_FRAMED_ROUND, ZERO_SALT, ceiling=47)  # type: ignore[operator]
    assert res is not END_OF_STREAM and res[1] == 51
    with pytest.raises(errors.LimitExceeded) as exc:
        decode(SPEC_FRAMED_ROUND, ZERO_SALT, ceiling=46)  # type: ignore[operator]
    check(exc, errors.LimitExceeded, True, "len.too_large",
          "relay_mux: len-framed blob length 47 exceeds the frame ceiling 46; "
          "corrupt or hostile peer", length=47, ceiling=46)


@pytest.mark.parametrize("decode", both_round_decoders())
def test_decode_framed_round_passes_the_ceiling_to_the_frame_reader(decode: object) -> None:
    # the prefix (39) is under the ceiling (60), but the tensor declares 100 payload bytes: the
    # frame reader rejects that against the same ceiling before looking for the bytes
    body = frame_wire(ZERO_SALT, 0, 1.0, [(0, (25,), b"")], nbytes=[100])
    assert len(body) == 39
    data = struct.pack("<I", len(body)) + body + bytes(200)
    with pytest.raises(errors.LimitExceeded) as exc:
        decode(data, ZERO_SALT, ceiling=60)  # type: ignore[operator]
    e = exc.value
    assert e.remote and e.error_id == "frame.past_ceiling"
    assert e.fields["ceiling"] == 60 and e.fields["nbytes"] == 100


def test_decode_framed_round_default_ceiling_is_1_gib() -> None:
    for decode in (lb.decode_framed_round, lb.decode_framed_round_or_eos):
        with pytest.raises(errors.LimitExceeded) as exc:
            decode(struct.pack("<I", GIB + 1), ZERO_SALT)
        check(exc, errors.LimitExceeded, True, "len.too_large",
              f"relay_mux: len-framed blob length {GIB + 1} exceeds the frame ceiling {GIB}; "
              "corrupt or hostile peer", length=GIB + 1, ceiling=GIB)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_decode_framed_round_short_prefix(n: int) -> None:
    data = SPEC_FRAMED_ROUND[:n]
    assert lb.decode_framed_round_or_eos(data, ZERO_SALT) is END_OF_STREAM
    with pytest.raises(errors.TruncatedInput) as exc:
        lb.decode_framed_round(data, ZERO_SALT)
    check(exc, errors.TruncatedInput, True, "len.prefix_read_failed",
          "relay_mux: len-framed prefix read failed: input ended inside the 4-byte prefix "
          f"({n} of 4 bytes; a stream reader takes this as a clean end of stream)",
          got=n, need=4)


@pytest.mark.parametrize(("data", "length", "got", "body"), [
    (b"\x00\x00\x00\x00" + SPEC_FRAMED_ROUND[4:], 0, 0, "0 body bytes"),  # a zero prefix
    (b"\x05\x00\x00\x00" + SPEC_FRAMED_ROUND[4:], 5, 5, "5 body bytes"),  # inside the header
    (SPEC_FRAMED_ROUND[:10], 47, 6, "6 body bytes"),  # the stream ends inside the frame header
    (SPEC_FRAMED_ROUND[:4], 47, 0, "0 body bytes"),
    (SPEC_FRAMED_ROUND[:5], 47, 1, "1 body byte"),  # was '1 body bytes'
])
def test_decode_framed_round_body_ended(data: bytes, length: int, got: int, body: str) -> None:
    for decode in (lb.decode_framed_round, lb.decode_framed_round_or_eos):
        with pytest.raises(errors.TruncatedInput) as exc:
            decode(data, ZERO_SALT)
        check(exc, errors.TruncatedInput, True, "framed_round.body_ended",
              "cpu_reduce: stream ended inside a len-framed RoundFrame body (peer died "
              f"mid-frame, or a zero-length prefix) (prefix {length}, {body})",
              length=length, got=got)


@pytest.mark.parametrize("extra", [1, 3, 20])
def test_decode_framed_round_underrun(extra: int) -> None:
    # the prefix declares more bytes than the (valid) frame inside it
    length = 47 + extra
    data = struct.pack("<I", length) + SPEC_FRAMED_ROUND[4:] + bytes(extra)
    for decode in (lb.decode_framed_round, lb.decode_framed_round_or_eos):
        with pytest.raises(errors.TruncatedInput) as exc:
            decode(data, ZERO_SALT)
        check(exc, errors.TruncatedInput, True, "framed_round.underrun",
              f"cpu_reduce: RoundFrame consumed {extra} bytes fewer than its length prefix "
              f"declared; sender/reader wire drift — stream is desynced (prefix {length})",
              short=extra, length=length)


def test_decode_framed_round_prefix_shorter_than_the_frame() -> None:
    # the frame is read inside its prefix only: a prefix 8 bytes short cuts off the tag
    data = struct.pack("<I", 39) + SPEC_FRAMED_ROUND[4:]
    for decode in (lb.decode_framed_round, lb.decode_framed_round_or_eos):
        with pytest.raises(errors.TruncatedInput) as exc:
            decode(data, ZERO_SALT)
        assert exc.value.remote and exc.value.error_id == "frame.footer_read_failed"


@pytest.mark.parametrize(("blob", "field", "got"), [
    ([None], "blob[0]", "None"),
    ([b"a", "x"], "blob[1]", "str"),
    ((b"a", 3), "blob[1]", "int"),
    ([memoryview(b"abcd")[::2]], "blob[0]", "a non-contiguous memoryview"),  # sendmsg refused it
    (None, "blob", "None"),
    ("ab", "blob", "str"),
])
def test_encode_len_framed_names_the_piece_that_is_no_buffer(blob: object, field: str,
                                                             got: str) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        lb.encode_len_framed(blob)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == "codec.not_bytes_like"
    assert ei.value.fields == {"field": field, "got": got}
    assert str(ei.value).startswith(f"{field} must be a contiguous bytes-like object")


def test_encode_len_framed_takes_a_numpy_array_as_one_buffer() -> None:
    arr = np.arange(3, dtype=np.float32)
    parts = lb.encode_len_framed(arr)
    assert len(parts) == 2 and parts[1] is arr  # not one piece per element
    assert b"".join(parts) == struct.pack("<I", 12) + arr.tobytes()
    assert b"".join(lb.encode_len_framed(iter([b"ab", b"c"]))) == struct.pack("<I", 3) + b"abc"

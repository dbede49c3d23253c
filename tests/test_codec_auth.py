"""Auth tags against an independent computation, bad tags, and never-crash inputs that get past
the tags.

The expected tags are computed here with :mod:`hmac` / :mod:`hashlib` over the byte ranges the
spec names (``spec/wire.yaml`` ``auth.coverage``): a RoundFrame's tag covers every byte from the
magic through the last payload byte; a mux record's tag covers header bytes 0..17 (magic,
version, kind, rank, payload_len) followed by the payload. A round trip alone cannot see a
coverage bug shared by the encoder and the decoder; these tests can.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from flodl_proto import errors
from flodl_proto.codec import (
    END_OF_STREAM,
    MuxRecord,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    auth,
    decode_mux_record,
    decode_mux_record_or_eos,
    decode_round_frame,
    decode_round_frame_or_eos,
    encode_frame_record,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from fuzz.harnesses.common import resign_mux_records, resign_round_frames

from .test_codec import frames, salts

#: the mux record magic and version as the spec gives them (little-endian u32s)
MUX_MAGIC = 0xF10D17D0
MUX_VERSION = 1


def tag(salt: bytes, *parts: bytes) -> bytes:
    """The spec's auth tag: the first 8 bytes of HMAC-SHA256(key = salt, msg = parts)."""
    return hmac.new(salt, b"".join(parts), hashlib.sha256).digest()[:8]


def mux_record(salt: bytes, kind: int, rank: int, payload: bytes, *,
               tag_override: bytes | None = None) -> bytes:
    """A mux record built by hand: the 17 covered header bytes, the tag, the payload."""
    head = struct.pack("<IIBII", MUX_MAGIC, MUX_VERSION, kind, rank, len(payload))
    return head + (tag(salt, head, payload) if tag_override is None else tag_override) + payload


# -- the encoders sign exactly the spec's ranges -------------------------------------------------
@given(frames(), salts)
def test_round_frame_tag_covers_magic_through_last_payload_byte(frame: RoundFrame,
                                                                 salt: bytes) -> None:
    wire = encode_round_frame_bytes(frame, salt)
    assert wire[-8:] == tag(salt, wire[:-8])


@given(st.sampled_from([RecordKind.DATA, RecordKind.CONTROL]), st.integers(0, 2**32 - 1),
       st.binary(max_size=64), salts)
def test_mux_record_tag_covers_header_and_payload(kind: RecordKind, rank: int, payload: bytes,
                                                  salt: bytes) -> None:
    rec = MuxRecord(kind, rank if kind is RecordKind.DATA else 0, memoryview(payload))
    wire = encode_mux_record_bytes(rec, salt)
    assert wire[:17] == struct.pack("<IIBII", MUX_MAGIC, MUX_VERSION, int(kind), rec.rank,
                                    len(payload))
    assert wire[17:25] == tag(salt, wire[:17], wire[25:])
    assert wire == mux_record(salt, int(kind), rec.rank, payload)


@given(frames(), salts)
def test_host_frame_record_is_signed_twice(frame: RoundFrame, salt: bytes) -> None:
    wire = b"".join(bytes(memoryview(p)) for p in
                    encode_frame_record(RecordKind.HOST_FRAME, frame, salt))
    inner = wire[25:]
    assert inner[-8:] == tag(salt, inner[:-8])
    assert wire[17:25] == tag(salt, wire[:17], inner)


# -- the decoders verify exactly the spec's ranges -----------------------------------------------
@given(st.integers(0, 2**32 - 1), st.binary(max_size=64), salts)
def test_decoder_accepts_a_record_signed_over_the_spec_ranges(rank: int, payload: bytes,
                                                              salt: bytes) -> None:
    wire = mux_record(salt, int(RecordKind.DATA), rank, payload)
    rec, n = decode_mux_record(wire, salt)
    assert n == len(wire)
    assert (rec.kind, rec.rank, bytes(rec.payload)) == (RecordKind.DATA, rank, payload)


@pytest.mark.parametrize("offset", range(25 + 4))
def test_every_covered_mux_byte_is_verified(offset: int) -> None:
    """Changing any byte of a record signed over the spec's ranges is an error: a tag byte is an
    auth failure; a covered header or payload byte is an auth failure or (magic, version, kind,
    length) a parse error."""
    salt = bytes(range(16))
    payload = b"\x01\x02\x03\x04"
    good = bytearray(mux_record(salt, int(RecordKind.DATA), 7, payload))
    if 17 <= offset < 25:
        good[offset] ^= 0x01  # a wrong tag
        with pytest.raises(errors.AuthenticationError) as auth:
            decode_mux_record(bytes(good), salt)
        assert auth.value.error_id == "mux.auth_failed"
        return
    bad = bytearray(good)
    bad[offset] ^= 0x01
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_mux_record(bytes(bad), salt)
    if 9 <= offset < 13 or offset >= 25:  # rank and payload bytes: only the tag catches them
        assert ei.value.error_id == "mux.auth_failed"


@given(frames(), salts, st.floats(0, 1e300, allow_nan=False))
def test_decoder_verifies_the_whole_round_frame(frame: RoundFrame, salt: bytes,
                                                weight: float) -> None:
    """Re-sign an edited frame with the independent tag: the decoder accepts it (so it covers
    no more than the spec's range) and rejects the unsigned edit (so it covers the weight)."""
    before = encode_round_frame_bytes(frame, salt)
    edited = bytearray(before)
    struct.pack_into("<d", edited, _weight_offset(before), weight)
    if bytes(edited) != before:
        with pytest.raises(errors.AuthenticationError):
            decode_round_frame(bytes(edited), salt)
    edited[-8:] = tag(salt, bytes(edited[:-8]))
    got, n = decode_round_frame(bytes(edited), salt)
    assert n == len(edited)
    assert struct.pack("<d", got.weight) == struct.pack("<d", weight)


def _weight_offset(wire: bytes) -> int:
    """Where the f64 weight sits: found by encoding a probe frame with a marker weight."""
    probe = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1234.5, []), bytes(16))
    off = probe.index(struct.pack("<d", 1234.5))
    assert wire[:4] == probe[:4]
    return off


# -- bad tags ------------------------------------------------------------------------------------
def test_mux_record_with_a_bad_tag() -> None:
    salt = bytes(range(16))
    good = mux_record(salt, int(RecordKind.DATA), 3, b"payload")
    for bad_tag in (bytes(8), b"\xff" * 8, tag(bytes(16), good[:17], good[25:])):
        wire = mux_record(salt, int(RecordKind.DATA), 3, b"payload", tag_override=bad_tag)
        with pytest.raises(errors.AuthenticationError) as ei:
            decode_mux_record(wire, salt)
        assert ei.value.remote and ei.value.error_id == "mux.auth_failed"
        assert f"wire carried 0x{int.from_bytes(bad_tag, 'little'):016x}" in str(ei.value)
        computed = int.from_bytes(tag(salt, wire[:17], wire[25:]), "little")
        assert f"computed 0x{computed:016x}" in str(ei.value)


def test_unknown_record_kind_is_checked_after_the_tag() -> None:
    salt = bytes(range(16))
    signed = mux_record(salt, 0x7F, 0, b"x")
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_mux_record(signed, salt)
    assert ei.value.error_id == "mux.unknown_kind"
    unsigned = mux_record(salt, 0x7F, 0, b"x", tag_override=bytes(8))
    with pytest.raises(errors.AuthenticationError) as ei2:
        decode_mux_record(unsigned, salt)
    assert ei2.value.error_id == "mux.auth_failed"


def test_round_frame_with_a_bad_tag() -> None:
    salt = bytes(range(16))
    wire = bytearray(encode_round_frame_bytes(
        RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, (1,), b"\0\0\x80\x3f")]), salt))
    wire[-1] ^= 0x80
    with pytest.raises(errors.AuthenticationError) as ei:
        decode_round_frame(bytes(wire), salt)
    assert ei.value.remote and ei.value.error_id == "frame.auth_failed"


# -- never crash, past the tags ------------------------------------------------------------------
@given(frames(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       st.sampled_from([2, 3]))
def test_mutated_frames_past_the_tag_never_crash(frame: RoundFrame,
                                                 edits: list[tuple[int, int]],
                                                 version: int) -> None:
    """A valid frame and record with a few bytes changed, then re-signed: the decoders get
    past the tag checks to the structure checks, and give a record or a RemoteProtocolError."""
    salt = bytes(16)
    for wire in (encode_round_frame_bytes(frame, salt),
                 b"".join(bytes(memoryview(p)) for p in
                          encode_frame_record(RecordKind.HOST_FRAME, frame, salt))):
        buf = bytearray(wire)
        for pos, val in edits:
            buf[pos % len(buf)] = val
        if wire[:4] == buf[:4] and buf[:1] == b"\xf1":
            resign_round_frames(buf, salt, 1 << 30, once=True)
        else:
            resign_mux_records(buf, salt, 1 << 30)
        data = bytes(buf)
        try:
            res = (decode_round_frame_or_eos(data, salt) if data[:1] == b"\xf1"
                   else decode_mux_record_or_eos(data, salt, version=version))
        except errors.RemoteProtocolError as e:
            event(f"rejected: {e.error_id}")
            continue
        if res is END_OF_STREAM:
            event("end of stream")
            continue
        event("accepted")
        got, n = res
        if isinstance(got, RoundFrame):  # an accepted frame's encoding is unique
            assert encode_round_frame_bytes(got, salt) == data[:n]


def test_tags_of_the_wrong_length_never_match() -> None:
    from flodl_proto.codec.auth import tags_equal

    good = bytes(range(8))
    assert tags_equal(good, bytes(good))
    for a, b in ((good[:7], good), (good, good[:7]), (good[:7], good[:7]), (b"", b""),
                 (good + b"\0", good + b"\0")):
        assert not tags_equal(a, b), (a, b)


@pytest.mark.parametrize("openssl", [True, False], ids=["openssl", "hmac-module"])
def test_new_mac_follows_the_salt_asked_for(monkeypatch: pytest.MonkeyPatch,
                                            openssl: bool) -> None:
    # each MAC is a copy of one keyed MAC kept for the last salt: alternating salts (and a
    # salt given as a bytearray) re-key it every time, and the copies are independent
    if not openssl:
        monkeypatch.setattr(auth, "_openssl_hmac", None)
    monkeypatch.setattr(auth, "_keyed", (b"", None))
    first, other = bytes(range(16)), bytes(range(16, 32))
    for salt in (first, other, first, bytearray(other), other):
        mac = auth.new_mac(salt)  # type: ignore[arg-type]
        if not openssl:
            assert isinstance(mac, hmac.HMAC)
        mac.update(b"abc")
        second = auth.new_mac(salt)  # type: ignore[arg-type]
        second.update(b"xyz")
        assert mac.digest() == hmac.new(bytes(salt), b"abc", hashlib.sha256).digest()
        assert second.digest() == hmac.new(bytes(salt), b"xyz", hashlib.sha256).digest()
        assert auth._keyed[0] == bytes(salt) and type(auth._keyed[0]) is bytes
        kept = auth._keyed
        auth.new_mac(bytes(salt))
        assert auth._keyed is kept  # the same salt again: the keyed MAC is reused


_SALT = bytes(range(16))
_NOT_PIECES = "must be an iterable of bytes-like pieces (one buffer: pass [data]), got "
_NOT_A_BUFFER = "must be a contiguous bytes-like object (bytes, bytearray or memoryview), got "
_POINTERS = "a {} of Python objects (its buffer holds their addresses, not bytes to send)"


@pytest.mark.parametrize(("pieces", "error_id", "text"), [
    # a single buffer was iterated as ints: a bare TypeError
    (b"abc", "codec.not_pieces", "pieces " + _NOT_PIECES + "bytes"),
    (bytearray(b"abc"), "codec.not_pieces", "pieces " + _NOT_PIECES + "bytearray"),
    (memoryview(b"abc"), "codec.not_pieces", "pieces " + _NOT_PIECES + "memoryview"),
    ("abc", "codec.not_pieces", "pieces " + _NOT_PIECES + "str"),
    (5, "codec.not_pieces", "pieces " + _NOT_PIECES + "int"),
    ([b"a", "b"], "codec.not_bytes_like", "pieces[1] " + _NOT_A_BUFFER + "str"),  # TypeError
    ([b"a", b"b", 7], "codec.not_bytes_like", "pieces[2] " + _NOT_A_BUFFER + "int"),
    ([memoryview(b"abcdef")[::2]], "codec.not_bytes_like",  # a bare BufferError
     "pieces[0] " + _NOT_A_BUFFER + "a non-contiguous memoryview"),
    ([b"x", np.zeros(8, np.uint8)[::2]], "codec.not_bytes_like",  # a bare ValueError
     "pieces[1] " + _NOT_A_BUFFER + "a non-contiguous ndarray"),
    # a NumPy array is one buffer: each element was hashed as a piece (np.arange(3): the
    # 24 bytes of three int64), where bytes are refused so; NumPy text too
    (np.arange(3), "codec.not_pieces", "pieces " + _NOT_PIECES + "ndarray"),
    (np.zeros((2, 3), np.uint8), "codec.not_pieces", "pieces " + _NOT_PIECES + "ndarray"),
    (np.array(b"abc"), "codec.not_pieces", "pieces " + _NOT_PIECES + "ndarray"),
    (np.array(["ab"]), "codec.not_pieces", "pieces " + _NOT_PIECES + "ndarray"),
    # any other single buffer too: its items were taken as the pieces, and the first named
    # ('pieces[0] ... got int')
    (array.array("B", b"ab"), "codec.not_pieces", "pieces " + _NOT_PIECES + "array"),
    (array.array("d", [1.5]), "codec.not_pieces", "pieces " + _NOT_PIECES + "array"),
    # a list is no buffer: its first item that is none is named
    ([array.array("B", b"ab"), 5], "codec.not_bytes_like", "pieces[1] " + _NOT_A_BUFFER + "int"),
    # a str_ piece is refused by hashlib as text, named as NumPy text
    ([np.str_("ab")], "codec.not_bytes_like",
     "pieces[0] " + _NOT_A_BUFFER + "NumPy text (str_ of dtype <U2): encode it to bytes"),
    ([b"x", np.array(["ab"])], "codec.not_bytes_like",  # its UCS-4 characters were hashed
     "pieces[1] " + _NOT_A_BUFFER + "NumPy text (ndarray of dtype <U2): encode it to bytes"),
    ([b"x", np.array(["ab", "cde"])[::-1]], "codec.not_bytes_like",
     "pieces[1] " + _NOT_A_BUFFER + "NumPy text (ndarray of dtype <U3): encode it to bytes"),
    # a buffer of Python object pointers: their addresses were hashed, a tag that changed with
    # the objects' places in memory, where the encoders refuse it
    ([b"x", np.array([b"ab"], dtype=object)], "codec.not_bytes_like",
     "pieces[1] " + _NOT_A_BUFFER + _POINTERS.format("ndarray")),
    ([np.zeros(2, dtype=[("n", np.uint8), ("o", object)])], "codec.not_bytes_like",
     "pieces[0] " + _NOT_A_BUFFER + _POINTERS.format("ndarray")),
    ([memoryview(np.array([b"ab"], dtype=object))], "codec.not_bytes_like",
     "pieces[0] " + _NOT_A_BUFFER + _POINTERS.format("memoryview")),
])
def test_compute_tag_names_pieces_that_are_no_buffers(pieces: Any, error_id: str,
                                                      text: str) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        auth.compute_tag(_SALT, pieces)
    assert (ei.value.error_id, str(ei.value)) == (error_id, text)
    assert isinstance(ei.value, errors.InvalidValue) and ei.value.__cause__ is None


def test_compute_tag_takes_any_iterable_of_buffers() -> None:
    want = tag(_SALT, b"abcdef")
    assert auth.compute_tag(_SALT, [b"ab", bytearray(b"cd"), memoryview(b"ef")]) == want
    assert auth.compute_tag(_SALT, (p for p in [b"abc", b"def"])) == want
    assert auth.compute_tag(_SALT, iter([b"abcdef"])) == want
    assert auth.compute_tag(_SALT, [np.frombuffer(b"abcdef", np.uint8)]) == want

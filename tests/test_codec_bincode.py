"""bincode 2 ``standard()`` primitives against hand-written bytes.

Expected bytes come from the varint rules in ``spec/wire.yaml`` (``VARINT_*``) and the reference
table of ``RelayControlMsg`` encodings: a value up to 250 is one byte; above that a marker byte
(``0xFB`` u16, ``0xFC`` u32, ``0xFD`` u64, ``0xFE`` u128, ``0xFF`` reserved) and the value
little-endian. Every error is checked for its class (encoder misuse is local, bad input is
remote), its catalogue id and a message naming the field and the value.
"""

from __future__ import annotations

import struct

import pytest

from flodl_proto import errors
from flodl_proto.codec.bincode import (
    BincodeReader,
    encode_bytes_fixed,
    encode_string,
    encode_varint,
)


def reader(data: bytes) -> BincodeReader:
    return BincodeReader(memoryview(data))


# -- encode_varint -------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "bits", "wire"), [
    (0, 64, b"\x00"),
    (1, 16, b"\x01"),
    (250, 32, b"\xfa"),
    (251, 64, b"\xfb" + struct.pack("<H", 251)),
    (300, 16, b"\xfb\x2c\x01"),
    (0xFFFF, 16, b"\xfb\xff\xff"),
    (0x10000, 32, b"\xfc" + struct.pack("<I", 0x10000)),
    (70000, 32, b"\xfc\x70\x11\x01\x00"),
    (0xFFFF_FFFF, 32, b"\xfc\xff\xff\xff\xff"),
    (0x1_0000_0000, 64, b"\xfd" + struct.pack("<Q", 0x1_0000_0000)),
    (0x0102_0304_0506_0708, 64, b"\xfd\x08\x07\x06\x05\x04\x03\x02\x01"),
    (2**64 - 1, 64, b"\xfd" + b"\xff" * 8),
])
def test_encode_varint_minimal_form(value: int, bits: int, wire: bytes) -> None:
    out = encode_varint(value, bits)
    assert type(out) is bytes
    assert out == wire


def test_encode_varint_default_width_is_u64() -> None:
    assert encode_varint(2**64 - 1) == b"\xfd" + b"\xff" * 8
    with pytest.raises(errors.InvalidValue) as ei:
        encode_varint(2**64)
    assert ei.value.fields["type"] == "u64"
    assert ei.value.fields["field"] == "value"


def test_encode_varint_u128_marker() -> None:
    assert encode_varint(2**64, 128) == b"\xfe" + (2**64).to_bytes(16, "little")


@pytest.mark.parametrize(("value", "bits", "type_name"), [
    (-1, 64, "u64"),
    (-1, 16, "u16"),
    (0x10000, 16, "u16"),
    (0x1_0000_0000, 32, "u32"),
    (2**64, 64, "u64"),
])
def test_encode_varint_out_of_range_is_local_and_names_field(value: int, bits: int,
                                                             type_name: str) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_varint(value, bits, field="Hello.ranks")
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert not e.remote
    assert e.error_id == "bincode.value_out_of_range"
    assert e.fields == {"field": "Hello.ranks", "value": value, "type": type_name}
    assert str(e) == (f"relay_mux: bincode encode failed: Hello.ranks = {value} does not fit "
                      f"{type_name}")


# -- encode_string -------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "wire"), [
    ("", b"\x00"),
    ("h0", b"\x02h0"),
    ("\u00e9t\u00e9", b"\x05\xc3\xa9t\xc3\xa9"),  # the length counts UTF-8 bytes, not characters
    ("x" * 250, b"\xfa" + b"x" * 250),
    ("y" * 251, b"\xfb\xfb\x00" + b"y" * 251),
    ("z" * 70000, b"\xfc\x70\x11\x01\x00" + b"z" * 70000),
])
def test_encode_string(text: str, wire: bytes) -> None:
    out = encode_string(text)
    assert type(out) is bytes
    assert out == wire


def test_encode_string_rejects_unencodable_text() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_string("\ud800")  # a lone surrogate has no UTF-8 form


# -- encode_bytes_fixed --------------------------------------------------------------------------
def test_encode_bytes_fixed_is_the_raw_bytes() -> None:
    data = bytearray(range(32))
    out = encode_bytes_fixed(data, 32)
    assert type(out) is bytes
    assert out == bytes(range(32))
    assert encode_bytes_fixed(b"", 0) == b""
    assert encode_bytes_fixed(memoryview(b"abc"), 3, field="f") == b"abc"


@pytest.mark.parametrize(("data", "size"), [(b"\x01" * 31, 32), (b"\x01" * 33, 32), (b"", 1)])
def test_encode_bytes_fixed_wrong_length(data: bytes, size: int) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_bytes_fixed(data, size, field="Hello.model_sigs")
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "bincode.value_out_of_range"
    assert e.fields == {"field": "Hello.model_sigs", "value": len(data), "type": f"[u8; {size}]"}
    assert str(e) == (f"relay_mux: bincode encode failed: Hello.model_sigs = {len(data)} does "
                      f"not fit [u8; {size}]")


def test_encode_bytes_fixed_default_field_name() -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        encode_bytes_fixed(b"ab", 3)
    assert ei.value.fields["field"] == "array"
    assert str(ei.value) == "relay_mux: bincode encode failed: array = 2 does not fit [u8; 3]"


# -- BincodeReader.raw / u8 / remaining ---------------------------------------------------------
def test_reader_raw_and_u8_advance() -> None:
    rd = reader(b"\x07abcdef")
    assert rd.pos == 0
    assert rd.remaining == 7
    assert rd.u8("kind") == 7
    assert rd.pos == 1
    assert rd.remaining == 6
    chunk = rd.raw(4, "body")
    assert isinstance(chunk, memoryview)
    assert bytes(chunk) == b"abcd"
    assert (rd.pos, rd.remaining) == (5, 2)
    assert bytes(rd.raw(0, "empty")) == b""
    assert bytes(rd.raw(2, "tail")) == b"ef"
    assert (rd.pos, rd.remaining) == (7, 0)


def test_reader_raw_exact_end_then_past_it() -> None:
    rd = reader(b"abc")
    rd.raw(1, "a")
    with pytest.raises(errors.RemoteProtocolError) as ei:
        rd.raw(5, "Hello.model_sigs")
    e = ei.value
    assert isinstance(e, errors.TruncatedInput)
    assert e.remote
    assert e.error_id == "bincode.unexpected_end"
    assert e.fields == {"field": "Hello.model_sigs", "offset": 1, "need": 3}
    assert str(e) == ("relay_mux: bincode decode failed: io error: unexpected end of file "
                      "(reading Hello.model_sigs at offset 1, 3 more bytes needed)")
    assert rd.pos == 1  # nothing consumed
    assert bytes(rd.raw(2, "rest")) == b"bc"
    with pytest.raises(errors.TruncatedInput) as ei:
        reader(b"ab").raw(3, "Hello.model_sigs")
    assert str(ei.value) == ("relay_mux: bincode decode failed: io error: unexpected end of file "
                             "(reading Hello.model_sigs at offset 0, 1 more byte needed)")


def test_reader_u8_at_end() -> None:
    rd = reader(b"")
    with pytest.raises(errors.TruncatedInput) as ei:
        rd.u8("variant")
    assert ei.value.fields == {"field": "variant", "offset": 0, "need": 1}


# -- BincodeReader.varint ------------------------------------------------------------------------
@pytest.mark.parametrize(("wire", "bits", "value"), [
    (b"\x00", 32, 0),
    (b"\xfa", 16, 250),
    (b"\xfb\xfb\x00", 16, 251),
    (b"\xfb\x03\x00", 32, 3),  # non-minimal forms are accepted
    (b"\xfb\xff\xff", 64, 0xFFFF),
    (b"\xfc\x70\x11\x01\x00", 32, 70000),
    (b"\xfc\x05\x00\x00\x00", 64, 5),
    (b"\xfc\xff\xff\xff\xff", 32, 0xFFFF_FFFF),
    (b"\xfd\x08\x07\x06\x05\x04\x03\x02\x01", 64, 0x0102_0304_0506_0708),
    (b"\xfd\x00\x00\x00\x00\x00\x00\x00\x00", 64, 0),
])
def test_reader_varint(wire: bytes, bits: int, value: int) -> None:
    rd = reader(wire + b"\xee")
    assert rd.varint(bits, "n") == value
    assert rd.pos == len(wire)


@pytest.mark.parametrize(("wire", "bits", "expected", "found"), [
    (b"\xfc\x01\x00\x00\x00", 16, "U16", "U32"),
    (b"\xfd" + b"\x00" * 8, 16, "U16", "U64"),
    (b"\xfd" + b"\x00" * 8, 32, "U32", "U64"),
    (b"\xfe" + b"\x00" * 16, 32, "U32", "U128"),
    (b"\xfe" + b"\x00" * 16, 64, "U64", "U128"),
    (b"\xff" + b"\x00" * 16, 64, "U64", "Reserved"),
    (b"\xff", 16, "U16", "Reserved"),
])
def test_reader_varint_wider_marker_rejected(wire: bytes, bits: int, expected: str,
                                             found: str) -> None:
    rd = reader(b"\x09" + wire)
    rd.u8("lead")
    with pytest.raises(errors.RemoteProtocolError) as ei:
        rd.varint(bits, "RankExit.rank")
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "bincode.invalid_integer_type"
    assert e.fields == {"expected": expected, "found": found, "field": "RankExit.rank",
                        "offset": 1}
    assert str(e) == (f"relay_mux: bincode decode failed: invalid integer type, expected "
                      f"{expected}, found {found} (field RankExit.rank at offset 1)")
    assert rd.pos == 1  # the marker is not consumed


@pytest.mark.parametrize(("wire", "need"), [
    (b"\xfb", 2), (b"\xfb\x01", 1), (b"\xfc\x01\x02", 2), (b"\xfd", 8), (b"", 1),
])
def test_reader_varint_truncated(wire: bytes, need: int) -> None:
    rd = reader(wire)
    with pytest.raises(errors.TruncatedInput) as ei:
        rd.varint(64, "Hello.ranks")
    assert ei.value.remote
    assert ei.value.fields == {"field": "Hello.ranks", "offset": min(1, len(wire)), "need": need}


# -- BincodeReader.string / seq_len --------------------------------------------------------------
@pytest.mark.parametrize(("wire", "text"), [
    (b"\x00", ""),
    (b"\x02h0", "h0"),
    (b"\x05\xc3\xa9t\xc3\xa9", "\u00e9t\u00e9"),
    (b"\xfb\x03\x00abc", "abc"),
    (b"\xfb\xfb\x00" + b"q" * 251, "q" * 251),
])
def test_reader_string(wire: bytes, text: str) -> None:
    rd = reader(wire + b"\x01\x02")
    assert rd.string("Hello.host") == text
    assert rd.remaining == 2


def test_reader_string_invalid_utf8_names_field_and_offset() -> None:
    rd = reader(b"\x00\x04ab\xffc")
    rd.u8("lead")
    with pytest.raises(errors.RemoteProtocolError) as ei:
        rd.string("Hello.host")
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "bincode.invalid_utf8"
    assert e.fields == {"reason": "invalid start byte", "field": "Hello.host", "offset": 4}
    assert str(e) == ("relay_mux: bincode decode failed: string is not valid utf8: invalid start "
                      "byte (field Hello.host at offset 4)")


def test_reader_string_truncated_body_and_length() -> None:
    with pytest.raises(errors.TruncatedInput) as ei:
        reader(b"\x05abc").string("Hello.host")
    assert ei.value.fields == {"field": "Hello.host", "offset": 1, "need": 2}
    with pytest.raises(errors.TruncatedInput) as ei:
        reader(b"").string("Hello.host")
    assert ei.value.fields == {"field": "Hello.host length", "offset": 0, "need": 1}
    with pytest.raises(errors.TruncatedInput) as ei:
        reader(b"\xfd\x01").string("Hello.host")
    assert ei.value.fields == {"field": "Hello.host length", "offset": 1, "need": 7}


def test_reader_string_length_is_a_u64() -> None:
    rd = reader(b"\xfd\x02\x00\x00\x00\x00\x00\x00\x00ok")
    assert rd.string("s") == "ok"
    with pytest.raises(errors.InvalidValue) as ei:
        reader(b"\xfe" + b"\x00" * 16).string("Hello.host")
    assert ei.value.fields == {"expected": "U64", "found": "U128", "field": "Hello.host length",
                               "offset": 0}


@pytest.mark.parametrize(("wire", "n"), [
    (b"\x00", 0), (b"\x03", 3), (b"\xfb\x00\x01", 256),
    (b"\xfd\x01\x00\x00\x00\x00\x00\x00\x00", 1),
    (b"\xfd" + b"\xff" * 8, 2**64 - 1),
])
def test_reader_seq_len(wire: bytes, n: int) -> None:
    rd = reader(wire)
    assert rd.seq_len("Hello.ranks") == n
    assert rd.remaining == 0


def test_reader_seq_len_errors_name_the_length_field() -> None:
    with pytest.raises(errors.TruncatedInput) as ei:
        reader(b"").seq_len("Hello.ranks")
    assert ei.value.fields == {"field": "Hello.ranks length", "offset": 0, "need": 1}
    assert "reading Hello.ranks length at offset 0" in str(ei.value)
    with pytest.raises(errors.InvalidValue) as ei2:
        reader(b"\xfe" + b"\x00" * 16).seq_len("Hello.model_sigs")
    assert ei2.value.fields == {"expected": "U64", "found": "U128",
                                "field": "Hello.model_sigs length", "offset": 0}

"""Vector handlers for the codec files: handshake, channel_magic, round_frame, mux_record,
len_framed (ops ``handshake.*``, ``channel_magic.*``, ``round_frame.*``, ``mux_record.*``,
``len_framed.*``, ``framed_round.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..codec import handshake as hs
from ..codec import loopback
from ..codec._common import END_OF_STREAM
from ..codec.mux import decode_mux_record_or_eos, encode_mux_record_bytes, parse_mux_header
from ..codec.round_frame import decode_round_frame_or_eos, encode_round_frame_bytes
from ..errors import ProtocolError, shown
from ..spec import AUTH_TAG_LEN, MUX_AUTH_COVERED_HEADER_LEN, MUX_HEADER_LEN
from .jsonio import (
    compare_frame,
    expect_error,
    frame_from_json,
    record_from_json,
    record_to_json,
    require,
)
from .registry import op, shown_value


def _hex(case: dict[str, Any], key: str = "bytes") -> bytes:
    return bytes.fromhex(case[key])


def _eof(case: dict[str, Any], result: object) -> None:
    require(result is END_OF_STREAM, f"expected a clean end of stream, got {result!r}")


@op("handshake.rank_write", fields={"rank_id": "u32", "world_size": "u32", "bytes": "hex"})
def _handshake_rank_write(case: dict[str, Any], version: int) -> None:
    got = hs.encode_handshake(case["rank_id"], case["world_size"], version)
    require(got == _hex(case), f"bytes {got.hex()} != {case['bytes']}")
    h, n = hs.decode_handshake(got, case["world_size"], version)
    require(h.rank == case["rank_id"] and n == 16, f"read back rank {h.rank}")


@op("handshake.ack_write", fields={"bytes": "hex"})
def _handshake_ack_write(case: dict[str, Any], version: int) -> None:
    got = hs.encode_ack(version)
    require(got == _hex(case), f"bytes {got.hex()} != {case['bytes']}")
    require(hs.decode_ack(got, version) == 8, "ack not accepted")


@op("handshake.read", expects=("ok", "error"),
    fields={"bytes": "hex", "expected_world_size": "int"}, ok_fields={"rank_id": "int"})
def _handshake_read(case: dict[str, Any], version: int) -> None:
    data, ws = _hex(case), case["expected_world_size"]
    if case["expect"] == "error":
        expect_error(case, lambda: hs.decode_handshake(data, ws, version))
        return
    h, _ = hs.decode_handshake(data, ws, version)
    require(h.rank == case["rank_id"], f"rank {h.rank} != {case['rank_id']}")


@op("handshake.ack_read", expects=("ok", "error"), fields={"bytes": "hex"})
def _handshake_ack_read(case: dict[str, Any], version: int) -> None:
    data = _hex(case)
    if case["expect"] == "error":
        expect_error(case, lambda: hs.decode_ack(data, version))
        return
    require(hs.decode_ack(data, version) == 8, "ack not accepted")


@op("channel_magic.write", fields={"channel": "string", "bytes": "hex", "magic": "bits"})
def _channel_magic_write(case: dict[str, Any], version: int) -> None:
    got = hs.encode_channel_magic(case["channel"])
    require(got == _hex(case), f"bytes {got.hex()} != {case['bytes']}")
    require(hs.expect_channel_magic(got, int(case["magic"], 16)) == 4, "magic not accepted")


@op("channel_magic.expect", expects=("ok", "error"),
    fields={"bytes": "hex", "expected": "bits", "what": "string"})
def _channel_magic_expect(case: dict[str, Any], version: int) -> None:
    data, expected, what = _hex(case), int(case["expected"], 16), case["what"]
    if case["expect"] == "error":
        expect_error(case, lambda: hs.expect_channel_magic(data, expected, what))
        return
    require(hs.expect_channel_magic(data, expected, what) == 4, "magic not accepted")


def _first_difference(a: bytes, b: bytes) -> int:
    """The first offset where ``a`` and ``b`` differ (the shorter's length when one is the
    other's start)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def _bytes_differ(got: bytes, want: bytes, record: bool) -> str:
    """The message of an encoding that is not the case's ``bytes``: where the two first differ,
    named when that is an auth tag (a frame's last 8 bytes; a mux record's header bytes
    17..24, then where the bytes after the header differ), and both in hex."""
    at = _first_difference(got, want)
    where = f"first at byte {at}"
    if len(got) != len(want):
        where += f"; {len(got)} bytes, want {len(want)}"
    if record and MUX_AUTH_COVERED_HEADER_LEN <= at < MUX_HEADER_LEN:
        rest = got[MUX_HEADER_LEN:], want[MUX_HEADER_LEN:]
        where += (": the header's auth tag, the bytes after the header are the same"
                  if rest[0] == rest[1] else
                  f": the header's auth tag; after the header, first at byte "
                  f"{MUX_HEADER_LEN + _first_difference(*rest)}")
    elif not record and len(got) == len(want) and at >= len(want) - AUTH_TAG_LEN:
        where += ": the frame's auth tag, the bytes before it are the same"
    return f"encoded bytes differ ({where}):\n got {got.hex()}\nwant {want.hex()}"


@op("round_frame.roundtrip", fields={"salt": "hex", "bytes": "hex", "frame": "frame",
                                     "wire_len": "int", "mac": "hex"})
def _round_frame_roundtrip(case: dict[str, Any], version: int) -> None:
    salt, want = _hex(case, "salt"), _hex(case)
    frame = frame_from_json(case["frame"])
    got = encode_round_frame_bytes(frame, salt)
    require(got == want, _bytes_differ(got, want, record=False))
    require(frame.wire_len == case["wire_len"] == len(got), f"wire_len {frame.wire_len}")
    require(got[-8:].hex() == case["mac"], "mac differs")
    res = decode_round_frame_or_eos(want, salt)
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    dec, n = res
    require(n == len(want), f"consumed {n} of {len(want)}")
    compare_frame(dec, case["frame"])


@op("round_frame.read", expects=("ok", "error", "eof"), fields={"salt": "hex", "bytes": "hex"},
    ok_fields={"consumed": "int", "frame": "frame"})
def _round_frame_read(case: dict[str, Any], version: int) -> None:
    salt, data = _hex(case, "salt"), _hex(case)
    if case["expect"] == "error":
        expect_error(case, lambda: decode_round_frame_or_eos(data, salt))
        return
    res = decode_round_frame_or_eos(data, salt)
    if case["expect"] == "eof":
        _eof(case, res)
        return
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    dec, n = res
    require(n == case["consumed"], f"consumed {n} != {case['consumed']}")
    compare_frame(dec, case["frame"])


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


#: where a record header's auth tag starts (its last ``AUTH_TAG_LEN`` bytes)
_TAG_AT = MUX_HEADER_LEN - AUTH_TAG_LEN


def _mux_split_problem(case: Mapping[str, Any]) -> str | None:
    """Why a mux record round trip's ``header``, ``payload`` and ``auth_tag`` (strings of
    bytes in hex digits) are not the split of its ``bytes``: a header not of 25 bytes, one the
    codec's header check refuses (its magic, its version, its length), a payload not of the
    length the header gives, a ``bytes`` not of the header's and the payload's length (empty,
    shorter than a header), the header or payload not the bytes of ``bytes`` at its place, or an
    auth tag not of 8 bytes or not bytes 17..25 of ``bytes`` (the header's last 8); or None.
    (The split read ``VectorMismatch: split``, and the auth tag ``VectorMismatch: auth tag
    differs`` when run, naming neither the field nor the value.)"""
    header, payload = bytes.fromhex(case["header"]), bytes.fromhex(case["payload"])
    data = bytes.fromhex(case["bytes"])
    if len(header) != MUX_HEADER_LEN:
        return (f"field 'header' is {shown_value(case['header'])}, {_bytes(len(header))}, not "
                f"the {MUX_HEADER_LEN} of a record header")
    try:
        hdr = parse_mux_header(header)
    except ProtocolError as e:
        return f"field 'header' is {shown_value(case['header'])}, not a record header ({e})"
    if len(payload) != hdr.payload_len:
        return (f"field 'payload' is {shown_value(case['payload'])}, {_bytes(len(payload))}, "
                f"not the {hdr.payload_len} field 'header' gives its payload")
    if len(data) != MUX_HEADER_LEN + hdr.payload_len:
        return (f"field 'bytes' is {shown_value(case['bytes'])}, {_bytes(len(data))}, not the "
                f"{MUX_HEADER_LEN} + {hdr.payload_len} of field 'header' and its payload")
    if header != data[:MUX_HEADER_LEN]:
        return (f"field 'header' is {shown_value(case['header'])}, not the first "
                f"{MUX_HEADER_LEN} bytes of field 'bytes'")
    if payload != data[MUX_HEADER_LEN:]:
        return (f"field 'payload' is {shown_value(case['payload'])}, not the bytes of field "
                f"'bytes' after its {MUX_HEADER_LEN}-byte header")
    tag = bytes.fromhex(case["auth_tag"])
    if len(tag) != AUTH_TAG_LEN:
        return (f"field 'auth_tag' is {shown_value(case['auth_tag'])}, {_bytes(len(tag))}, not "
                f"the {AUTH_TAG_LEN} of a record's auth tag")
    if tag != data[_TAG_AT:MUX_HEADER_LEN]:
        return (f"field 'auth_tag' is {shown_value(case['auth_tag'])}, not bytes "
                f"{_TAG_AT}..{MUX_HEADER_LEN} of field 'bytes' (the header's auth tag)")
    return None


@op("mux_record.roundtrip", fields={"salt": "hex", "bytes": "hex", "record": "record",
                                    "header": "hex", "payload": "hex", "auth_tag": "hex",
                                    "bincode?": "hex"}, check=_mux_split_problem)
def _mux_roundtrip(case: dict[str, Any], version: int) -> None:
    salt, want = _hex(case, "salt"), _hex(case)
    rec = record_from_json(case["record"], version)
    got = encode_mux_record_bytes(rec, salt)
    require(got == want, _bytes_differ(got, want, record=True))
    for name, part in (("header", got[:MUX_HEADER_LEN]), ("payload", got[MUX_HEADER_LEN:])):
        require(part == bytes.fromhex(case[name]),
                f"field {name!r} is {shown_value(case[name])}, the record's {name} is "
                f"{shown(part.hex())}")
    require(got[_TAG_AT:MUX_HEADER_LEN].hex() == case["auth_tag"], "auth tag differs")
    if "bincode" in case:
        require(bytes(rec.payload).hex() == case["bincode"], "bincode differs")
    res = decode_mux_record_or_eos(want, salt, version=version)
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    dec, n = res
    require(n == len(want), f"consumed {n} of {len(want)}")
    got_json = record_to_json(dec, version)
    require(got_json == case["record"], f"decoded {got_json} != {case['record']}")


@op("mux_record.read", expects=("ok", "error", "eof"), fields={"salt": "hex", "bytes": "hex"},
    ok_fields={"consumed": "int", "record": "object"})
def _mux_read(case: dict[str, Any], version: int) -> None:
    salt, data = _hex(case, "salt"), _hex(case)
    if case["expect"] == "error":
        expect_error(case, lambda: decode_mux_record_or_eos(data, salt, version=version))
        return
    res = decode_mux_record_or_eos(data, salt, version=version)
    if case["expect"] == "eof":
        _eof(case, res)
        return
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    dec, n = res
    require(n == case["consumed"], f"consumed {n} != {case['consumed']}")
    got_json = record_to_json(dec, version)
    require(got_json == case["record"], f"decoded {got_json} != {case['record']}")


@op("len_framed.roundtrip", fields={"blob": "hex", "bytes": "hex"})
def _len_roundtrip(case: dict[str, Any], version: int) -> None:
    blob, want = _hex(case, "blob"), _hex(case)
    got = b"".join(loopback.encode_len_framed(blob))
    require(got == want, f"bytes {got.hex()} != {want.hex()}")
    res = loopback.decode_len_framed_or_eos(want)
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    require(bytes(res[0]) == blob and res[1] == len(want), "blob differs")


@op("len_framed.read", expects=("ok", "error", "eof"), fields={"bytes": "hex"},
    ok_fields={"blob": "hex"})
def _len_read(case: dict[str, Any], version: int) -> None:
    data = _hex(case)
    if case["expect"] == "error":
        expect_error(case, lambda: loopback.decode_len_framed_or_eos(data))
        return
    res = loopback.decode_len_framed_or_eos(data)
    if case["expect"] == "eof":
        _eof(case, res)
        return
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    require(bytes(res[0]).hex() == case["blob"], "blob differs")


@op("framed_round.roundtrip", fields={"salt": "hex", "bytes": "hex", "frame": "frame"})
def _framed_roundtrip(case: dict[str, Any], version: int) -> None:
    salt, want = _hex(case, "salt"), _hex(case)
    frame = frame_from_json(case["frame"])
    got = b"".join(loopback.encode_framed_round(frame, salt))
    require(got == want, f"bytes {got.hex()} != {want.hex()}")
    res = loopback.decode_framed_round_or_eos(want, salt)
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    compare_frame(res[0], case["frame"])


@op("framed_round.read", expects=("ok", "error", "eof"), fields={"salt": "hex", "bytes": "hex"},
    ok_fields={"frame": "frame"})
def _framed_read(case: dict[str, Any], version: int) -> None:
    salt, data = _hex(case, "salt"), _hex(case)
    if case["expect"] == "error":
        expect_error(case, lambda: loopback.decode_framed_round_or_eos(data, salt))
        return
    res = loopback.decode_framed_round_or_eos(data, salt)
    if case["expect"] == "eof":
        _eof(case, res)
        return
    require(res is not END_OF_STREAM, "decoder reported end of stream")
    assert res is not END_OF_STREAM
    compare_frame(res[0], case["frame"])

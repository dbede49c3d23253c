"""Mux records and ``RelayControlMsg`` control messages against hand-built bytes.

Every expected record is built here with :mod:`struct` from the layout in ``spec/wire.yaml``
(``messages.mux_record``: magic u32, version u32 = 1, kind u8, rank u32, payload_len u32, auth
tag 8, payload; little-endian) and tagged with :mod:`hmac` over header bytes 0..17 followed by
the payload. Control payloads are the bincode bytes of the reference table (``Hello`` = 0,
``HelloAck`` = 1, ``RankExit`` = 2, ``DeclareDead`` = 3; ``Hello{host, ranks}`` at version 2,
``{host, ranks, model_sigs}`` at version 3). A RoundFrame riding in a HostFrame or Broadcast is
also built by hand (magic, count, kind, weight, tensors, 8-byte tag). Each error is checked for
its class (peer bytes: remote; API misuse: local), catalogue id, fields and message.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from flodl_proto import errors
from flodl_proto.codec import (
    END_OF_STREAM,
    DeclareDead,
    Dtype,
    Hello,
    HelloAck,
    MuxHeader,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_control,
    decode_mux_record,
    decode_mux_record_or_eos,
    encode_control,
    encode_frame_record,
    encode_mux_record,
    encode_mux_record_bytes,
    encode_mux_record_parts,
    parse_mux_header,
    parse_mux_header_or_eos,
)
from flodl_proto.codec.auth import PARALLEL_MAC_MIN, Premac
from flodl_proto.codec.mux import (
    control_too_long,
    max_control_payload,
    max_hello_payload,
    ranks_str,
    read_mux_record_or_eos,
    rust_debug,
)
from flodl_proto.codec.round_frame import round_frame_pieces

MAGIC = 0xF10D17D0
FRAME_MAGIC = 0xF10D17F1
SALT_ZERO = bytes(16)
SALT_B = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
SIG_A = bytes(range(32))
SIG_B = bytes(range(100, 132))


def tag(salt: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256(key = salt, msg = parts)[:8]."""
    return hmac.new(salt, b"".join(parts), hashlib.sha256).digest()[:8]


def head(kind: int, rank: int, length: int, *, magic: int = MAGIC, version: int = 1) -> bytes:
    """The 17 header bytes the record tag covers."""
    return struct.pack("<IIBII", magic, version, kind, rank, length)


def record(salt: bytes, kind: int, rank: int, payload: bytes) -> bytes:
    h = head(kind, rank, len(payload))
    return h + tag(salt, h, payload) + payload


def frame_wire(salt: bytes, kind: int, weight: float,
               tensors: list[tuple[int, list[int], bytes]]) -> bytes:
    """A RoundFrame built from the layout, tag included."""
    out = struct.pack("<IIBd", FRAME_MAGIC, len(tensors), kind, weight)
    for dtype, shape, data in tensors:
        out += struct.pack(f"<BB{len(shape)}IQ", dtype, len(shape), *shape, len(data)) + data
    return out + tag(salt, out)


def joined(pieces: list[object]) -> bytes:
    return b"".join(bytes(memoryview(p)) for p in pieces)  # type: ignore[arg-type]


#: the reference facts' HostFrame example: Model, weight 3.0, f32 [3] = [3.0, 6.0, -1.5]
F32_3 = struct.pack("<3f", 3.0, 6.0, -1.5)
FRAME_B = frame_wire(SALT_B, 0, 3.0, [(0, [3], F32_3)])


def frame_b() -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, 3.0, [TensorPayload(Dtype.F32, [3], F32_3)])


# -- control messages: construction --------------------------------------------------------------
@pytest.mark.parametrize("cls", [RankExit, DeclareDead])
@pytest.mark.parametrize("rank", [-1, 2**32, 2**40, 2.5, 3.0, True, "3"])
def test_rank_messages_reject_non_u32(cls: type, rank: int) -> None:
    """Out of range, and not an integer: a float rank is never truncated, a bool is none."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        cls(rank)
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "mux.bad_field"
    assert e.fields == {"field": f"{cls.__name__}.rank", "value": rank, "reason": "not a u32"}
    assert str(e) == f"relay_mux: {cls.__name__}.rank = {rank!r} is invalid: not a u32"


@pytest.mark.parametrize("cls", [RankExit, DeclareDead])
@pytest.mark.parametrize("rank", [0, 1, 2**32 - 1])
def test_rank_messages_accept_u32(cls: type, rank: int) -> None:
    assert cls(rank).rank == rank


@pytest.mark.parametrize("cls", [RankExit, DeclareDead])
@pytest.mark.parametrize("rank", [np.int64(300), np.uint32(70000), np.array(2**32 - 1)])
def test_rank_messages_keep_a_numpy_integer_rank_as_an_int(cls: type, rank: Any) -> None:
    """A NumPy integer rank is accepted (as Hello's ranks are) and kept as an int: the varint
    writer took ``rank.to_bytes`` of it (AttributeError at 251 and above) and a 0-d array made
    the message unhashable."""
    m = cls(rank)
    assert type(m.rank) is int and m.rank == int(rank) and m == cls(int(rank))
    assert hash(m) == hash(cls(int(rank)))
    assert encode_control(m) == encode_control(cls(int(rank)))
    assert decode_control(encode_control(m)) == cls(int(rank))


def test_hello_normalises_and_checks_fields() -> None:
    h = Hello("h0", iter([0, 1]), [bytearray(SIG_A)])
    assert h.host == "h0"
    assert h.ranks == (0, 1)
    assert h.model_sigs == (SIG_A,)
    assert type(h.model_sigs[0]) is bytes
    assert Hello("h", [2**32 - 1]).ranks == (2**32 - 1,)
    with pytest.raises(errors.LocalProtocolError) as ei:
        Hello("h", [0, 2**32])
    assert ei.value.fields == {"field": "Hello.ranks[1]", "value": 2**32, "reason": "not a u32"}
    with pytest.raises(errors.InvalidValue) as ei2:
        Hello("h", [0], [SIG_A[:31]])
    assert ei2.value.error_id == "mux.bad_field"
    assert ei2.value.fields == {"field": "Hello.model_sigs[0]", "value": SIG_A[:31],
                                "reason": "31 bytes, not 32"}
    assert Hello("h", [0], [np.frombuffer(SIG_A, np.uint8)]).model_sigs == (SIG_A,)
    assert Hello("h", [0], [list(SIG_A)]).model_sigs == (SIG_A,)  # Rust's [u8; 32] as ints


@pytest.mark.parametrize(("sigs", "field", "reason"), [
    # one signature for the list: its first byte was shown ("= 120 does not fit [u8; 32]")
    (b"x" * 32, "Hello.model_sigs",
     "not an iterable of 32-byte signatures (one signature? pass it in a list)"),
    ("x" * 32, "Hello.model_sigs",
     "not an iterable of 32-byte signatures (one signature? pass it in a list)"),
    (5, "Hello.model_sigs", "not an iterable of 32-byte signatures"),
    ([SIG_A, 1], "Hello.model_sigs[1]",  # bytes(1) was one zero byte
     "not bytes (or a sequence of ints 0..255)"),
    ([SIG_A, "y" * 32], "Hello.model_sigs[1]", "not bytes (or a sequence of ints 0..255)"),
    ([list(range(250, 282))], "Hello.model_sigs[0]", "not bytes (or a sequence of ints 0..255)"),
    ([b"x"], "Hello.model_sigs[0]", "1 bytes, not 32"),
])
def test_hello_names_the_signature_at_fault(sigs: Any, field: str, reason: str) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        Hello("h", [0], sigs)
    assert ei.value.error_id == "mux.bad_field"
    assert (ei.value.fields["field"], ei.value.fields["reason"]) == (field, reason)
    assert str(ei.value).startswith(f"relay_mux: {field} = ")


@pytest.mark.parametrize("host", [b"h0", bytearray(b"h0"), 7, None])
def test_hello_refuses_a_host_that_is_not_text(host: object) -> None:
    """A non-str host was stored as its ``str()``: ``b"h0"`` became the text ``"b'h0'"``."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        Hello(host, [0])  # type: ignore[arg-type]
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "mux.bad_field"
    assert e.fields == {"field": "Hello.host", "value": host, "reason": "not text (str)"}
    assert str(e) == f"relay_mux: Hello.host = {host!r} is invalid: not text (str)"


def test_hello_repr_of_a_few_ranks_and_signatures() -> None:
    """A Hello of up to 8 ranks, up to 8 signatures and a host of up to 80 characters is shown
    whole, as the dataclass wrote it."""
    assert repr(Hello("h0", [0, 1])) == str(Hello("h0", [0, 1])) == (
        "Hello(host='h0', ranks=(0, 1), model_sigs=())")
    assert repr(Hello("h" * 80, range(8), [SIG_A])) == (
        f"Hello(host='{'h' * 80}', ranks=(0, 1, 2, 3, 4, 5, 6, 7), model_sigs=({SIG_A!r},))")
    sigs = [bytes([i]) * 32 for i in range(8)]
    assert repr(Hello("h", [], sigs)) == (
        f"Hello(host='h', ranks=(), model_sigs=({', '.join(map(repr, sigs))}))")


def test_hello_repr_of_many_ranks_a_long_host_and_many_signatures_is_short() -> None:
    """A Hello was shown with every rank, every signature and its whole host (688,928
    characters for 100,000 ranks; a decoded Hello holds as many as the world size the
    controller's bound allows): more than 8 ranks or signatures are shown by their first 3 and
    last 2 and their count, as a RoundFrame's tensors are, and a host of more than 80
    characters by its first 40 and last 20 characters and its length, as an error message
    quotes a long text."""
    sigs = [i.to_bytes(2, "little") * 16 for i in range(1000)]
    shown = [repr(sig) for sig in sigs]
    text = repr(Hello("a" * 40 + "b" * 99_940 + "c" * 20, range(100_000), sigs))
    assert text == (
        f"Hello(host='{'a' * 40}...{'c' * 20}' (100000 characters), "
        "ranks=(0, 1, 2, ..., 99998, 99999) (100000 ranks), "
        f"model_sigs=({', '.join(shown[:3])}, ..., {shown[998]}, {shown[999]}) "
        "(1000 signatures))")
    assert len(text) == 849
    assert repr(Hello("h", range(9))) == (
        "Hello(host='h', ranks=(0, 1, 2, ..., 7, 8) (9 ranks), model_sigs=())")
    assert repr(Hello("h" * 81, [])) == (
        f"Hello(host='{'h' * 40}...{'h' * 20}' (81 characters), ranks=(), model_sigs=())")
    assert repr(MuxRecord.control_msg(Hello("h", range(9)))).endswith(
        "control=Hello(host='h', ranks=(0, 1, 2, ..., 7, 8) (9 ranks), model_sigs=()))")


# -- control messages: encode --------------------------------------------------------------------
@pytest.mark.parametrize(("msg", "version", "wire"), [
    (Hello("h0", [0, 1]), 2, bytes.fromhex("00026830020001")),
    (Hello("h0", [0, 1]), 3, bytes.fromhex("0002683002000100")),
    (Hello("h0", [0, 1], [SIG_A]), 3, bytes.fromhex("0002683002000101") + SIG_A),
    (Hello("h0", [0, 1], [SIG_A, SIG_B]), 3,
     bytes.fromhex("0002683002000102") + SIG_A + SIG_B),
    (Hello("", []), 2, b"\x00\x00\x00"),
    (Hello("", [70000, 251]), 3, bytes.fromhex("000002fc70110100fbfb0000")),
    (HelloAck(), 2, b"\x01"),
    (HelloAck(), 3, b"\x01"),
    (RankExit(3), 2, b"\x02\x03"),
    (RankExit(251), 3, bytes.fromhex("02fbfb00")),
    (RankExit(2**32 - 1), 3, bytes.fromhex("02fcffffffff")),
    (DeclareDead(300), 2, bytes.fromhex("03fb2c01")),
    (DeclareDead(0), 3, b"\x03\x00"),
])
def test_encode_control(msg: object, version: int, wire: bytes) -> None:
    out = encode_control(msg, version)  # type: ignore[arg-type]
    assert type(out) is bytes
    assert out == wire


def test_encode_control_default_version_is_2() -> None:
    assert encode_control(Hello("h0", [0, 1])) == bytes.fromhex("00026830020001")


def test_encode_control_model_sigs_at_version_2_is_local() -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_control(Hello("h0", [0], [SIG_A, SIG_B]), 2)
    e = ei.value
    assert isinstance(e, errors.VersionMismatch)
    assert e.error_id == "control.model_sigs_v2"
    assert e.fields == {"count": 2}
    assert str(e) == ("relay_mux: Hello.model_sigs does not exist at protocol version 2 (got 2 "
                      "signatures)")
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_control(Hello("h0", [0], [SIG_A]), 2)
    assert str(ei.value) == ("relay_mux: Hello.model_sigs does not exist at protocol version 2 "
                             "(got 1 signature)")  # was 'got 1 signatures'


@pytest.mark.parametrize(("msg", "field"), [
    (RankExit(1), "RankExit.rank"), (DeclareDead(1), "DeclareDead.rank"),
    (Hello("h", [1]), "Hello.ranks"),
])
def test_encode_control_rechecks_rank_width(msg: object, field: str) -> None:
    """The encoder writes ranks as u32s itself: a rank forced past u32 after construction (the
    constructors refuse one) is refused again, naming the field."""
    if isinstance(msg, Hello):
        object.__setattr__(msg, "ranks", (0, 2**32))
    else:
        object.__setattr__(msg, "rank", 2**32)
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_control(msg, 3)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.fields == {"field": field, "value": 2**32, "type": "u32"}


@pytest.mark.parametrize("version", [1, 4])
def test_control_codec_rejects_unsupported_version(version: int) -> None:
    for call in (lambda: encode_control(HelloAck(), version),
                 lambda: decode_control(b"\x01", version)):
        with pytest.raises(errors.LocalProtocolError) as ei:
            call()
        assert isinstance(ei.value, errors.VersionMismatch)
        assert ei.value.fields == {"got": version, "supported": [2, 3]}


# -- control messages: decode --------------------------------------------------------------------
@pytest.mark.parametrize(("wire", "version", "msg"), [
    (bytes.fromhex("00026830020001"), 2, Hello("h0", [0, 1])),
    (bytes.fromhex("0002683002000100"), 3, Hello("h0", [0, 1])),
    (bytes.fromhex("0002683002000101") + SIG_A, 3, Hello("h0", [0, 1], [SIG_A])),
    (bytes.fromhex("0002683002000102") + SIG_A + SIG_B, 3,
     Hello("h0", [0, 1], [SIG_A, SIG_B])),
    # a version-2 reader ignores the signatures (bytes after the message)
    (bytes.fromhex("0002683002000102") + SIG_A + SIG_B, 2, Hello("h0", [0, 1])),
    (bytes.fromhex("000002fc70110100fbfb00"), 2, Hello("", [70000, 251])),
    (bytes.fromhex("00fb02006869fd0200000000000000fb0500fc06000000"), 2,
     Hello("hi", [5, 6])),  # non-minimal varints everywhere
    (b"\x01", 2, HelloAck()),
    (b"\x01\xff\xff", 3, HelloAck()),
    (b"\x02\x03", 2, RankExit(3)),
    (bytes.fromhex("02fcffffffff"), 3, RankExit(2**32 - 1)),
    (bytes.fromhex("03fb2c01"), 2, DeclareDead(300)),
    (bytes.fromhex("030700"), 3, DeclareDead(7)),
    (bytes.fromhex("fb0300fb2c01"), 2, DeclareDead(300)),  # non-minimal variant
])
def test_decode_control(wire: bytes, version: int, msg: object) -> None:
    out = decode_control(memoryview(wire), version)
    assert type(out) is type(msg)
    assert out == msg


def test_decode_control_default_version_is_2() -> None:
    # at version 3 this Hello lacks its model_sigs length; at the default (2) it is complete
    assert decode_control(bytes.fromhex("00026830020001")) == Hello("h0", [0, 1])
    with pytest.raises(errors.TruncatedInput) as ei:
        decode_control(bytes.fromhex("00026830020001"), 3)
    assert ei.value.fields == {"field": "Hello.model_sigs length", "offset": 7, "need": 1}


@pytest.mark.parametrize(("wire", "version", "fields"), [
    (b"", 2, {"field": "variant", "offset": 0, "need": 1}),
    (b"\x00", 2, {"field": "Hello.host length", "offset": 1, "need": 1}),
    (b"\x00\x03ab", 2, {"field": "Hello.host", "offset": 2, "need": 1}),
    (b"\x00\x00", 2, {"field": "Hello.ranks length", "offset": 2, "need": 1}),
    (b"\x00\x00\x02\x05", 2, {"field": "Hello.ranks", "offset": 4, "need": 1}),
    (b"\x00\x00\x01\xfc\x01", 2, {"field": "Hello.ranks", "offset": 4, "need": 3}),
    (b"\x00\x00\x00\x01" + SIG_A[:30], 3, {"field": "Hello.model_sigs", "offset": 4, "need": 2}),
    (b"\x00\x00\x00\x02" + SIG_A, 3, {"field": "Hello.model_sigs", "offset": 36, "need": 32}),
    (b"\x02", 2, {"field": "RankExit.rank", "offset": 1, "need": 1}),
    (b"\x03\xfb\x01", 3, {"field": "DeclareDead.rank", "offset": 2, "need": 1}),
])
def test_decode_control_truncated_names_field(wire: bytes, version: int,
                                              fields: dict[str, object]) -> None:
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_control(wire, version)
    assert isinstance(ei.value, errors.TruncatedInput)
    assert ei.value.error_id == "bincode.unexpected_end"
    assert ei.value.fields == fields


@pytest.mark.parametrize(("wire", "fields"), [
    (b"\xfd" + bytes(8), {"expected": "U32", "found": "U64", "field": "variant", "offset": 0}),
    (b"\x00\x00\x01\xfd" + bytes(8),
     {"expected": "U32", "found": "U64", "field": "Hello.ranks", "offset": 3}),
    (b"\x02\xfd" + bytes(8),
     {"expected": "U32", "found": "U64", "field": "RankExit.rank", "offset": 1}),
    (b"\x03\xff", {"expected": "U32", "found": "Reserved", "field": "DeclareDead.rank",
                   "offset": 1}),
])
def test_decode_control_wide_integer_names_field(wire: bytes, fields: dict[str, object]) -> None:
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_control(wire, 3)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.fields == fields


@pytest.mark.parametrize("variant", [4, 250, 251, 2**32 - 1])
def test_decode_control_unknown_variant(variant: int) -> None:
    wire = bytes([variant]) if variant <= 250 else (
        b"\xfb" + struct.pack("<H", variant) if variant < 2**16 else
        b"\xfc" + struct.pack("<I", variant))
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_control(wire + b"\x00", 2)
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "bincode.invalid_variant"
    assert e.fields == {"value": variant, "count": 4}
    assert str(e) == (f"relay_mux: bincode decode failed: invalid value: integer `{variant}`, "
                      f"expected variant index 0 <= i < 4")


def test_decode_control_host_bad_utf8() -> None:
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_control(b"\x00\x02h\xc3\x00", 2)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.fields["field"] == "Hello.host"
    assert ei.value.fields["offset"] == 3


# -- MuxRecord -----------------------------------------------------------------------------------
def test_record_constructors() -> None:
    d = MuxRecord.data(7, b"abc")
    assert (d.kind, d.rank, bytes(d.payload), d.control) == (RecordKind.DATA, 7, b"abc", None)
    assert isinstance(d.payload, memoryview)
    c = MuxRecord.control_msg(Hello("h0", [0, 1]), 3)
    assert (c.kind, c.rank, bytes(c.payload)) == (
        RecordKind.CONTROL, 0, bytes.fromhex("0002683002000100"))
    assert c.control == Hello("h0", [0, 1])
    c2 = MuxRecord.control_msg(Hello("h0", [0, 1]))
    assert bytes(c2.payload) == bytes.fromhex("00026830020001")
    h = MuxRecord.host_frame(bytearray(b"xy"))
    assert (h.kind, h.rank, bytes(h.payload), h.control) == (RecordKind.HOST_FRAME, 0, b"xy", None)
    b = MuxRecord.broadcast(b"z")
    assert (b.kind, b.rank, bytes(b.payload), b.control) == (RecordKind.BROADCAST, 0, b"z", None)
    with pytest.raises(errors.LocalProtocolError) as ei:
        MuxRecord.data(2**32, b"")
    assert ei.value.fields == {"field": "rank", "value": 2**32, "reason": "not a u32"}
    for rank in (1.5, False):
        with pytest.raises(errors.LocalProtocolError) as ei:
            MuxRecord.data(rank, b"")  # type: ignore[arg-type]
        assert ei.value.fields == {"field": "rank", "value": rank, "reason": "not a u32"}
    assert MuxRecord.data(2**32 - 1, b"").rank == 2**32 - 1


def test_record_equality() -> None:
    a = MuxRecord.data(1, b"ab")
    assert a == MuxRecord(RecordKind.DATA, 1, memoryview(bytearray(b"ab")))
    assert a != MuxRecord.data(2, b"ab")
    assert a != MuxRecord.data(1, b"ac")
    assert a != MuxRecord(RecordKind.CONTROL, 1, memoryview(b"ab"))
    assert a.__eq__("ab") is NotImplemented
    assert a != "ab"
    with pytest.raises(TypeError):
        hash(a)


def test_record_frame_decodes_the_round_frame() -> None:
    rec = MuxRecord.host_frame(FRAME_B + b"trailing")
    fr = rec.frame(SALT_B)
    assert fr == frame_b()
    assert fr.weight == 3.0
    assert bytes(fr.tensors[0].data) == F32_3


def test_record_frame_passes_salt_and_ceiling() -> None:
    rec = MuxRecord.broadcast(FRAME_B)
    with pytest.raises(errors.AuthenticationError):
        rec.frame(SALT_ZERO)
    assert rec.frame(SALT_B, ceiling=12) == frame_b()  # the tensor's 12 bytes fit
    with pytest.raises(errors.LimitExceeded) as ei:
        rec.frame(SALT_B, ceiling=11)
    assert ei.value.remote


@pytest.mark.parametrize("n", [0, 1, 7])
@pytest.mark.parametrize("make", [MuxRecord.host_frame, MuxRecord.broadcast])
def test_record_frame_short_payload(n: int, make: Any) -> None:
    """A payload that ends inside the 8-byte frame header: the header read failed (it read "frame
    kind read failed ... (offset 5)", though the kind byte is at offset 8)."""
    rec = make(FRAME_B[:n])
    with pytest.raises(errors.RemoteProtocolError) as ei:
        rec.frame(SALT_B)
    e = ei.value
    assert isinstance(e, errors.TruncatedInput)
    assert e.error_id == "frame.header_read_failed"
    assert e.fields == {"got": n, "need": 8}
    assert str(e).startswith(f"RoundFrame header read failed: input ended inside the 8-byte "
                             f"header ({n} of 8 bytes;")
    if n == 7:  # a frame cut right after its header still reads as the kind's failure
        with pytest.raises(errors.TruncatedInput, match=r"frame kind read failed.*\(offset 8\)"):
            make(FRAME_B[:8]).frame(SALT_B)


@pytest.mark.parametrize("rec", [MuxRecord.control_msg(HelloAck()), MuxRecord.data(1, b"\0" * 9)])
def test_record_frame_of_a_record_with_no_frame_is_local_misuse(rec: MuxRecord) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        rec.frame(SALT_B)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "mux.bad_field"
    assert str(ei.value) == (f"relay_mux: record kind = {rec.kind.name!r} is invalid: only "
                             "HostFrame and Broadcast records carry a RoundFrame")


@pytest.mark.parametrize(("rec", "text"), [
    (MuxRecord.data(3, b"abc"),
     "MuxRecord(kind=RecordKind.DATA, rank=3, payload=<3 bytes: 616263>, control=None)"),
    (MuxRecord.data(0, b""),
     "MuxRecord(kind=RecordKind.DATA, rank=0, payload=<0 bytes>, control=None)"),
    (MuxRecord.host_frame(b"\xff"),
     "MuxRecord(kind=RecordKind.HOST_FRAME, rank=0, payload=<1 byte: ff>, control=None)"),
    (MuxRecord.broadcast(bytes(range(16))),
     "MuxRecord(kind=RecordKind.BROADCAST, rank=0, payload=<16 bytes: "
     "000102030405060708090a0b0c0d0e0f>, control=None)"),
    (MuxRecord.data(4294967295, bytes(range(17))),
     "MuxRecord(kind=RecordKind.DATA, rank=4294967295, payload=<17 bytes: "
     "000102030405060708090a0b0c0d0e0f...>, control=None)"),
    (MuxRecord.control_msg(Hello("h0", [0, 1])),
     "MuxRecord(kind=RecordKind.CONTROL, rank=0, payload=<7 bytes: 00026830020001>, "
     "control=Hello(host='h0', ranks=(0, 1), model_sigs=()))"),
    (MuxRecord.control_msg(RankExit(4)),
     "MuxRecord(kind=RecordKind.CONTROL, rank=0, payload=<2 bytes: 0204>, "
     "control=RankExit(rank=4))"),
], ids=["data", "empty", "one-byte", "16-bytes", "17-bytes", "hello", "rank-exit"])
def test_record_repr(rec: MuxRecord, text: str) -> None:
    """The kind was shown as Python's enum repr ('kind=<RecordKind.DATA: 1>') and the payload
    as the memoryview's ('payload=<memory at 0x7f...>'), which says nothing of the bytes: the
    kind is named as the class and the member are, as a RoundFrame's kind is, and the payload
    by its length and its first 16 bytes in hex, '...' after them when there are more."""
    assert repr(rec) == str(rec) == text


def test_record_repr_of_a_64_mib_payload_is_short() -> None:
    """The payload is shown by its first 16 bytes whatever its size: a 64 MiB record's repr
    is 122 characters, 6 more than a 17-byte one's (the length's digits)."""
    payload = bytearray(64 << 20)
    payload[:3] = b"\x01\x02\x03"
    text = repr(MuxRecord.host_frame(payload))
    assert text == ("MuxRecord(kind=RecordKind.HOST_FRAME, rank=0, payload=<67108864 bytes: "
                    "01020300000000000000000000000000...>, control=None)")
    assert len(text) == 122
    assert len(repr(MuxRecord.host_frame(bytes(17)))) == 116


# -- encoding records ----------------------------------------------------------------------------
def test_reference_record_examples() -> None:
    helloack = encode_mux_record_bytes(MuxRecord.control_msg(HelloAck()), SALT_ZERO)
    assert helloack == bytes.fromhex(
        "d0170df1" "01000000" "02" "00000000" "01000000" "293d0ee4678e7fe9" "01")
    hello3 = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h0", [0, 1]), 3), SALT_ZERO)
    assert hello3 == bytes.fromhex(
        "d0170df1" "01000000" "02" "00000000" "08000000" "bfb0f531cb8c2c6a"
        "0002683002000100")
    hello2 = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h0", [0, 1]), 2), SALT_ZERO)
    assert hello2 == bytes.fromhex(
        "d0170df1" "01000000" "02" "00000000" "07000000" "8a2d9a3ccf46a58e" "00026830020001")


@pytest.mark.parametrize(("kind", "rank", "payload"), [
    (1, 0, b""), (1, 0x01020304, b"data"), (2, 0, b"\x01"), (3, 0, b"x" * 300), (4, 0, b"\xff"),
    (1, 2**32 - 1, bytes(range(256))),
])
def test_encode_mux_record_matches_layout(kind: int, rank: int, payload: bytes) -> None:
    rec = MuxRecord(RecordKind(kind), rank, memoryview(payload))
    parts = encode_mux_record(rec, SALT_B)
    assert len(parts) == 2
    assert bytes(parts[0]) == record(SALT_B, kind, rank, payload)[:25]
    assert bytes(memoryview(parts[1])) == payload
    assert encode_mux_record_bytes(rec, SALT_B) == record(SALT_B, kind, rank, payload)


def test_encode_parts_signs_every_piece_without_copying() -> None:
    a, b, c = b"abc", bytearray(b""), memoryview(b"defgh")
    parts = encode_mux_record_parts(1, 9, [a, b, c], SALT_B)
    assert parts[1] is a and parts[2] is b and parts[3] is c
    assert len(parts) == 4
    assert parts[0] == record(SALT_B, 1, 9, b"abcdefgh")[:25]
    assert type(parts[0]) is bytes


def test_encode_parts_ceiling() -> None:
    assert joined(encode_mux_record_parts(3, 0, [b"12345"], SALT_B, ceiling=5)) == record(
        SALT_B, 3, 0, b"12345")
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record_parts(3, 0, [b"123", b"456"], SALT_B, ceiling=5)
    e = ei.value
    assert isinstance(e, errors.LimitExceeded)
    assert e.error_id == "mux.payload_too_large_local"
    assert e.fields == {"length": 6, "ceiling": 5}
    assert str(e) == "relay_mux: record payload of 6 bytes exceeds the frame ceiling 5"
    with pytest.raises(errors.LimitExceeded):
        encode_mux_record(MuxRecord.data(0, b"12"), SALT_B, ceiling=1)
    assert joined(encode_mux_record(MuxRecord.data(0, b"12"), SALT_B, ceiling=2)) == record(
        SALT_B, 1, 0, b"12")


def test_encode_parts_payload_length_is_a_u32_whatever_the_ceiling() -> None:
    # 2**32 virtual bytes (a zero-stride view): rejected before any byte is hashed
    huge = np.broadcast_to(np.zeros(1, np.uint8), (2**32,))
    with pytest.raises(errors.LimitExceeded) as ei:
        encode_mux_record_parts(1, 0, [memoryview(huge)], SALT_B, ceiling=2**40)
    assert ei.value.fields == {"length": 2**32, "ceiling": 2**40}


def test_encode_parts_argument_errors_are_local() -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record_parts(1, 0, [b""], bytes(15))
    assert ei.value.error_id == "salt.bad_length"
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record_parts(1, -1, [b""], SALT_B)
    assert ei.value.fields == {"field": "rank", "value": -1, "reason": "not a u32"}
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record_parts(1, 0, [b""], SALT_B, ceiling=-1)
    assert ei.value.error_id == "ceiling.invalid"


@pytest.mark.parametrize("kind", [True, False, 2.0, 2.5, 256, -1, "x", np.float64(3.0)])
def test_encode_parts_refuses_a_kind_that_is_not_a_u8(kind: Any) -> None:
    """The record kind by the codec's integer rule: a bool was written as DATA or 0, a float,
    text or a value out of the byte's range raised a bare struct.error."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record_parts(kind, 0, [b"x"], SALT_B)
    assert isinstance(ei.value, errors.InvalidValue) and ei.value.error_id == "mux.bad_field"
    assert ei.value.fields == {"field": "kind", "value": kind, "reason": "not a u8"}


@pytest.mark.parametrize("kind", [np.uint8(3), np.int64(7), 0, 255])
def test_encode_parts_writes_any_integer_kind_byte(kind: Any) -> None:
    assert joined(encode_mux_record_parts(kind, np.int64(5), [b"x"], SALT_B)) == record(
        SALT_B, int(kind), 5, b"x")


# -- encode_frame_record -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [RecordKind.HOST_FRAME, RecordKind.BROADCAST])
def test_encode_frame_record_matches_layout(kind: RecordKind) -> None:
    parts = encode_frame_record(kind, frame_b(), SALT_B)
    wire = joined(parts)
    assert wire == record(SALT_B, int(kind), 0, FRAME_B)
    assert bytes(parts[0]) == record(SALT_B, int(kind), 0, FRAME_B)[:25]
    assert bytes(memoryview(parts[-1])) == FRAME_B[-8:]
    if kind is RecordKind.HOST_FRAME:  # the reference example's header
        assert bytes(parts[0]) == bytes.fromhex(
            "d0170df1" "01000000" "03" "00000000" "33000000" "cd8b1faf36f942a3")


def test_encode_frame_record_passes_tensor_buffers_through() -> None:
    data = np.arange(4, dtype="<f4")
    t = TensorPayload(Dtype.F32, [2, 2], memoryview(data))
    parts = encode_frame_record(RecordKind.BROADCAST, RoundFrame(RoundKind.CONTROL, 0.5, [t]),
                                SALT_ZERO)
    assert any(p is t.data for p in parts)
    body = frame_wire(SALT_ZERO, 1, 0.5, [(0, [2, 2], data.tobytes())])
    assert joined(parts) == record(SALT_ZERO, 4, 0, body)


def test_encode_frame_record_empty_frame() -> None:
    body = frame_wire(SALT_B, 0, 0.0, [])
    assert len(body) == 25
    assert joined(encode_frame_record(RecordKind.HOST_FRAME, RoundFrame(weight=0.0), SALT_B)) == \
        record(SALT_B, 3, 0, body)


@pytest.mark.parametrize("kind", [RecordKind.DATA, RecordKind.CONTROL, 3.0, np.float64(4.0),
                                  True, 7])
def test_encode_frame_record_rejects_other_kinds(kind: RecordKind) -> None:
    """Only HOST_FRAME and BROADCAST, as integers: 3.0 was taken as a HostFrame."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_frame_record(kind, frame_b(), SALT_B)
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "mux.bad_field"
    assert e.fields == {"field": "kind", "value": kind,
                        "reason": "a RoundFrame rides in a HostFrame or Broadcast record"}
    assert str(e).startswith(f"relay_mux: kind = {kind!r} is invalid: a RoundFrame rides in a")


def test_encode_frame_record_ceiling_counts_the_inner_tag() -> None:
    n = len(FRAME_B)  # 51: frame bytes including its tag
    assert joined(encode_frame_record(RecordKind.HOST_FRAME, frame_b(), SALT_B, ceiling=n)) == \
        record(SALT_B, 3, 0, FRAME_B)
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_frame_record(RecordKind.HOST_FRAME, frame_b(), SALT_B, ceiling=n - 1)
    e = ei.value
    assert isinstance(e, errors.LimitExceeded)
    assert e.error_id == "mux.payload_too_large_local"
    assert e.fields == {"length": n, "ceiling": n - 1}


def test_encode_frame_record_argument_errors() -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_frame_record(RecordKind.HOST_FRAME, frame_b(), bytes(17))
    assert ei.value.error_id == "salt.bad_length"
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_frame_record(RecordKind.HOST_FRAME, frame_b(), SALT_B, ceiling=-5)
    assert ei.value.error_id == "ceiling.invalid"


def test_encode_frame_record_with_executor_gives_the_same_bytes() -> None:
    big = np.arange(1 << 18, dtype="<f4")  # 1 MiB: the two MACs run concurrently
    frame = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload(Dtype.F32, [1 << 18], memoryview(big))])
    body = frame_wire(SALT_B, 0, 2.0, [(0, [1 << 18], big.tobytes())])
    with ThreadPoolExecutor(1) as ex:
        wire = joined(encode_frame_record(RecordKind.BROADCAST, frame, SALT_B, mac_executor=ex))
    assert wire == record(SALT_B, 4, 0, body)


# -- max_hello_payload ---------------------------------------------------------------------------
@pytest.mark.parametrize(("world", "bound"), [(1, 324), (2, 361), (8, 583), (1000, 37287)])
def test_max_hello_payload(world: int, bound: int) -> None:
    # variant u32 (5) + host (9 + 255) + ranks (9 + 5 per rank) + sigs (9 + 32 per rank)
    assert max_hello_payload(world) == 5 + 9 + 255 + 9 + 5 * world + 9 + 32 * world == bound


def test_max_hello_payload_holds_the_widest_hello() -> None:
    world = 3
    wire = (b"\xfc\x00\x00\x00\x00"                               # variant 0 as a u32
            + b"\xfd" + struct.pack("<Q", 255) + b"h" * 255       # host
            + b"\xfd" + struct.pack("<Q", world)                  # rank count
            + b"".join(b"\xfc" + struct.pack("<I", r) for r in range(world))
            + b"\xfd" + struct.pack("<Q", world) + SIG_A * world)  # model sigs
    assert len(wire) == max_hello_payload(world)
    assert decode_control(wire, 3) == Hello("h" * 255, range(world), [SIG_A] * world)


def test_max_hello_payload_rejects_a_world_size_of_zero_in_upstreams_words() -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        max_hello_payload(0)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "controller.world_size_zero"
    assert str(ei.value) == "cluster_controller: world_size must be > 0"


@pytest.mark.parametrize("world", [np.int64(4), np.uint32(4), np.array(4), 4])
def test_max_hello_payload_takes_a_numpy_integer_as_controller_core_does(world: object) -> None:
    """``np.int64(4)`` was refused (``world_size = np.int64(4) is invalid``), where
    ControllerCore, whose Hello bound it is, takes it."""
    assert max_hello_payload(world) == 287 + 37 * 4 == 435  # type: ignore[arg-type]
    assert type(max_hello_payload(world)) is int  # type: ignore[arg-type]
    from flodl_proto.fsm import ControllerCore
    assert ControllerCore(world, SALT_B).world_size == 4  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [np.int64(0), np.uint8(0)])
def test_max_hello_payload_of_a_numpy_zero_is_upstreams_words(world: object) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        max_hello_payload(world)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.InvalidValue)
    assert (ei.value.error_id, str(ei.value)) == ("controller.world_size_zero",
                                                  "cluster_controller: world_size must be > 0")


@pytest.mark.parametrize("bound", [max_hello_payload, max_control_payload])
@pytest.mark.parametrize("world", [-1, -(2**40), True, False, 1.0, 0.0, "3", None,
                                   np.True_, np.int64(-2), np.float64(4.0),
                                   2**32, 2**64, np.uint64(2**32)])
def test_max_hello_payload_names_any_other_bad_world_size(world: object, bound: Any) -> None:
    """Every bad value read ``world_size must be > 0``, never naming it (a negative one, text,
    None, a bool), where ControllerCore names it; a world size past u32 (2**32: ranks are u32
    on the wire) gave a bound (158_913_790_239 bytes for 2**32), where ControllerCore refuses
    it. Both bounds refuse it by ControllerCore's rule, in its words."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        bound(world)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "controller.bad_argument"
    assert ei.value.fields == {"field": "world_size", "value": world,
                               "reason": "not a whole number in 1..4294967295 (ranks are u32)"}
    assert str(ei.value) == (f"cluster_controller: world_size = {world!r} is invalid: not a "
                             "whole number in 1..4294967295 (ranks are u32)")
    from flodl_proto.fsm import ControllerCore
    with pytest.raises(errors.LocalProtocolError) as core:
        ControllerCore(world, SALT_B)  # type: ignore[arg-type]
    assert str(core.value) == str(ei.value)


def test_max_hello_payload_takes_the_largest_u32_world_size() -> None:
    assert max_hello_payload(2**32 - 1) == max_control_payload(2**32 - 1) \
        == 287 + 37 * (2**32 - 1) == 158_913_790_202


# -- control_too_long ----------------------------------------------------------------------------
@pytest.mark.parametrize(("reader", "text"), [
    ("controller", "cluster_controller: a Control record after the Hello claims payload_len 362 "
                   "(> 361 bytes, the longest legal control message for the world size); "
                   "corrupt or hostile peer"),
    ("relay", "relay: a Control record from the controller claims payload_len 362 (> 361 bytes, "
              "the longest legal control message for the world size); corrupt or hostile peer"),
])
def test_control_too_long_is_the_one_control_bound(reader: str, text: str) -> None:
    """The control bound's rule, which the controller's stream and the relay's reader each
    wrote out: a Control record claiming more than the limit is the reader's remote
    LimitExceeded; one at the limit, or a record of another kind of any length, is none."""
    limit = max_control_payload(2)
    err = control_too_long(RecordKind.CONTROL, limit + 1, limit, reader)
    assert isinstance(err, errors.LimitExceeded) and isinstance(err, errors.RemoteProtocolError)
    assert err.error_id == f"{reader}.control_too_long"
    assert err.fields == {"length": limit + 1, "limit": limit}
    assert str(err) == text
    assert control_too_long(RecordKind.CONTROL, limit, limit, reader) is None
    for kind in (RecordKind.DATA, RecordKind.HOST_FRAME, RecordKind.BROADCAST, 0x07):
        assert control_too_long(kind, 1 << 30, limit, reader) is None


def test_control_too_long_refuses_an_unknown_reader() -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        control_too_long(RecordKind.CONTROL, 5, 4, "rank")
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "mux.bad_field"
    assert str(ei.value) == ("relay_mux: reader = 'rank' is invalid: not 'controller' or "
                             "'relay'")


@pytest.mark.parametrize(("args", "text"), [
    ((RecordKind.CONTROL, 10, None), "limit = None is invalid: not a whole number >= 0 (bytes)"),
    ((RecordKind.CONTROL, 10, -1), "limit = -1 is invalid: not a whole number >= 0 (bytes)"),
    ((RecordKind.CONTROL, 10, 5.0), "limit = 5.0 is invalid: not a whole number >= 0 (bytes)"),
    ((RecordKind.CONTROL, "10", 5), "payload_len = '10' is invalid: not a u32"),
    ((RecordKind.CONTROL, -1, 5), "payload_len = -1 is invalid: not a u32"),
    ((RecordKind.DATA, 2**32, 5), "payload_len = 4294967296 is invalid: not a u32"),
    ((True, 10, 5), "kind = True is invalid: not a u8"),
    ((2.0, 10, 5), "kind = 2.0 is invalid: not a u8"),
    ((256, 10, 5), "kind = 256 is invalid: not a u8"),
])
def test_control_too_long_refuses_numbers_out_of_their_range(args: tuple[object, ...],
                                                             text: str) -> None:
    """A kind that is no u8, a payload length that is no u32 or a limit that is no count of
    bytes is the caller's mistake, named with its value, where a None limit or a text length
    was a TypeError and a limit of -1 refused every Control record ('> -1 bytes')."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        control_too_long(*args)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "mux.bad_field"
    assert str(ei.value) == f"relay_mux: {text}"


def test_control_too_long_takes_numpy_integers() -> None:
    err = control_too_long(np.uint8(2), np.uint32(10), np.int64(5), "relay")
    assert err is not None and err.fields == {"length": 10, "limit": 5}
    assert type(err.fields["length"]) is int and type(err.fields["limit"]) is int
    assert control_too_long(np.uint8(2), np.uint32(5), np.int64(5)) is None


# -- parse_mux_header ----------------------------------------------------------------------------
def test_parse_mux_header_fields() -> None:
    t = bytes(range(8))
    wire = struct.pack("<IIBII", MAGIC, 1, 0x07, 0x0A0B0C0D, 3) + t  # kind not checked here
    for form in (parse_mux_header, parse_mux_header_or_eos):
        hdr = form(wire + b"rest")
        assert hdr == MuxHeader(7, 0x0A0B0C0D, 3, t)
        assert type(hdr.auth_tag) is bytes


@pytest.mark.parametrize("n", [0, 1, 17, 24])
def test_parse_mux_header_short(n: int) -> None:
    wire = head(1, 0, 0) + bytes(8)
    assert parse_mux_header_or_eos(wire[:n]) is END_OF_STREAM
    with pytest.raises(errors.RemoteProtocolError) as ei:
        parse_mux_header(bytearray(wire[:n]))
    e = ei.value
    assert isinstance(e, errors.TruncatedInput)
    assert e.error_id == "mux.header_read_failed"
    assert e.fields == {"got": n, "need": 25}


def test_parse_mux_header_checks_in_order() -> None:
    bad_all = struct.pack("<IIBII", 0xF10D17D1, 2, 1, 5, 100) + bytes(8)
    with pytest.raises(errors.RemoteProtocolError) as ei:
        parse_mux_header(bad_all, ceiling=10)
    assert isinstance(ei.value, errors.BadMagic)
    assert ei.value.fields == {"got": 0xF10D17D1, "expected": MAGIC}
    assert str(ei.value) == "relay_mux: record magic 0xf10d17d1 != 0xf10d17d0"
    bad_version = struct.pack("<IIBII", MAGIC, 2, 1, 5, 100) + bytes(8)
    with pytest.raises(errors.RemoteProtocolError) as ei:
        parse_mux_header(bad_version, ceiling=10)
    assert isinstance(ei.value, errors.VersionMismatch)
    assert ei.value.fields == {"got": 2, "expected": 1}
    assert str(ei.value) == "relay_mux: record version 2 != 1"
    too_long = struct.pack("<IIBII", MAGIC, 1, 3, 5, 11) + bytes(8)
    with pytest.raises(errors.RemoteProtocolError) as ei:
        parse_mux_header_or_eos(too_long, ceiling=10)
    assert isinstance(ei.value, errors.LimitExceeded)
    assert ei.value.error_id == "mux.payload_too_large"
    assert ei.value.fields == {"length": 11, "ceiling": 10, "kind": 3, "rank": 5}
    assert str(ei.value).startswith(
        "relay_mux: record payload_len 11 exceeds the frame ceiling 10 (kind=0x03, rank=5)")
    with pytest.raises(errors.LimitExceeded):
        parse_mux_header(too_long, ceiling=10)
    assert parse_mux_header(too_long, ceiling=11).payload_len == 11


def test_parse_mux_header_default_ceiling_is_1_gib() -> None:
    at = struct.pack("<IIBII", MAGIC, 1, 3, 0, 1 << 30) + bytes(8)
    assert parse_mux_header(at).payload_len == 1 << 30
    over = struct.pack("<IIBII", MAGIC, 1, 3, 0, (1 << 30) + 1) + bytes(8)
    with pytest.raises(errors.LimitExceeded):
        parse_mux_header(over)
    with pytest.raises(errors.LimitExceeded):
        parse_mux_header_or_eos(over)


def test_parse_mux_header_bad_ceiling_is_local() -> None:
    for form in (parse_mux_header, parse_mux_header_or_eos):
        with pytest.raises(errors.LocalProtocolError) as ei:
            form(b"", ceiling=-1)
        assert ei.value.error_id == "ceiling.invalid"


# -- decoding records ----------------------------------------------------------------------------
def test_decode_data_record_keeps_rank_and_views_payload() -> None:
    wire = bytearray(record(SALT_B, 1, 0x01020304, b"payload") + b"next")
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        res = decode(wire, SALT_B)
        assert res is not END_OF_STREAM
        rec, n = res
        assert n == 25 + 7
        assert (rec.kind, rec.rank, bytes(rec.payload), rec.control) == (
            RecordKind.DATA, 0x01020304, b"payload", None)
        assert rec.payload.obj is wire  # a view, not a copy


@pytest.mark.parametrize("kind", [2, 3, 4])
def test_decode_ignores_rank_of_non_data_records(kind: int) -> None:
    payload = b"\x01" if kind == 2 else FRAME_B
    wire = record(SALT_B, kind, 77, payload)
    rec, hdr, n = read_mux_record_or_eos(wire, SALT_B)  # type: ignore[misc]
    assert (rec.kind, rec.rank, bytes(rec.payload)) == (RecordKind(kind), 0, payload)
    assert hdr == MuxHeader(kind, 77, len(payload), wire[17:25])
    assert n == len(wire)
    assert decode_mux_record(wire, SALT_B)[0].rank == 0


def test_decode_control_record_by_version() -> None:
    v3 = bytes.fromhex("0002683002000101") + SIG_A
    wire = record(SALT_B, 2, 0, v3)
    rec, n = decode_mux_record(wire, SALT_B, version=3)
    assert rec.control == Hello("h0", [0, 1], [SIG_A])
    assert n == len(wire)
    assert decode_mux_record(wire, SALT_B)[0].control == Hello("h0", [0, 1])  # default: version 2
    res = decode_mux_record_or_eos(wire, SALT_B, version=3)
    assert res is not END_OF_STREAM and res[0].control == Hello("h0", [0, 1], [SIG_A])
    short3 = record(SALT_B, 2, 0, bytes.fromhex("00026830020001"))
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        with pytest.raises(errors.TruncatedInput) as ei:
            decode(short3, SALT_B, version=3)
        assert ei.value.fields["field"] == "Hello.model_sigs length"
    with pytest.raises(errors.LocalProtocolError):
        decode_mux_record(wire, SALT_B, version=4)


@pytest.mark.parametrize(("payload", "msg"), [
    (b"\x01", HelloAck()), (b"\x02\x05", RankExit(5)), (bytes.fromhex("03fb2c01"),
                                                         DeclareDead(300)),
])
def test_decode_control_records(payload: bytes, msg: object) -> None:
    rec, n = decode_mux_record(record(SALT_ZERO, 2, 0, payload), SALT_ZERO)
    assert rec.kind is RecordKind.CONTROL
    assert rec.control == msg
    assert bytes(rec.payload) == payload
    assert n == 25 + len(payload)


def test_decode_passes_the_ceiling() -> None:
    wire = record(SALT_B, 1, 0, b"12345")
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        assert decode(wire, SALT_B, ceiling=5)[1] == 30  # type: ignore[index]
        with pytest.raises(errors.LimitExceeded) as ei:
            decode(wire, SALT_B, ceiling=4)
        assert ei.value.remote
        assert ei.value.fields == {"length": 5, "ceiling": 4, "kind": 1, "rank": 0}


def test_decode_bad_tag() -> None:
    good = record(SALT_B, 1, 3, b"abc")
    bad = good[:17] + bytes(8) + good[25:]
    computed = tag(SALT_B, good[:17], b"abc")
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        with pytest.raises(errors.RemoteProtocolError) as ei:
            decode(bad, SALT_B)
        e = ei.value
        assert isinstance(e, errors.AuthenticationError)
        assert e.error_id == "mux.auth_failed"
        assert e.fields == {"computed": int.from_bytes(computed, "little"), "carried": 0,
                            "kind": 1, "rank": 3, "length": 3}
        assert str(e).startswith(
            f"relay_mux: HMAC verification failed (computed 0x{computed[::-1].hex()}, wire "
            "carried 0x0000000000000000)")
    with pytest.raises(errors.AuthenticationError):
        decode_mux_record(good, SALT_ZERO)


def test_decode_wrong_salt_type_is_local() -> None:
    wire = record(SALT_B, 1, 0, b"")
    with pytest.raises(errors.LocalProtocolError) as ei:
        decode_mux_record_or_eos(wire, bytes(8))
    assert ei.value.error_id == "salt.bad_length"


@pytest.mark.parametrize("kind", [0, 5, 0xFF])
def test_decode_unknown_kind_after_a_good_tag(kind: int) -> None:
    wire = record(SALT_B, kind, 0, b"zz")
    with pytest.raises(errors.RemoteProtocolError) as ei:
        decode_mux_record(wire, SALT_B)
    e = ei.value
    assert isinstance(e, errors.InvalidValue)
    assert e.error_id == "mux.unknown_kind"
    assert e.fields == {"kind": kind}
    assert str(e) == f"relay_mux: unknown record kind 0x{kind:02x}"
    # with a bad tag, the tag is reported first
    with pytest.raises(errors.AuthenticationError):
        decode_mux_record(wire[:17] + bytes(8) + wire[25:], SALT_B)


@pytest.mark.parametrize("cut", [25, 26, 29])
def test_decode_truncated_payload(cut: int) -> None:
    wire = record(SALT_B, 1, 0, b"abcde")
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        with pytest.raises(errors.RemoteProtocolError) as ei:
            decode(wire[:cut], SALT_B)
        e = ei.value
        assert isinstance(e, errors.TruncatedInput)
        assert e.error_id == "mux.truncated"
        assert e.fields == {"got": cut, "need": 30}
        assert str(e) == (f"relay_mux: peer closed mid-frame (committed read hit EOF) ({cut} of "
                          "30 bytes)")


@pytest.mark.parametrize("cut", [0, 1, 24])
def test_decode_short_header(cut: int) -> None:
    wire = record(SALT_B, 1, 0, b"")
    assert decode_mux_record_or_eos(wire[:cut], SALT_B) is END_OF_STREAM
    assert read_mux_record_or_eos(wire[:cut], None) is END_OF_STREAM
    with pytest.raises(errors.TruncatedInput) as ei:
        decode_mux_record(memoryview(wire[:cut]), SALT_B)
    assert ei.value.error_id == "mux.header_read_failed"
    assert ei.value.fields == {"got": cut, "need": 25}


def test_decode_uses_a_premac_covering_the_record() -> None:
    wire = record(SALT_B, 1, 2, b"payload")
    other = hmac.new(SALT_B, b"something else", hashlib.sha256).digest()
    forged = wire[:17] + other[:8] + wire[25:]
    # a premac over 17 + 7 bytes is trusted (the decoder does not hash again)
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        res = decode(forged, SALT_B, premac=Premac(24, other))
        assert res is not END_OF_STREAM and bytes(res[0].payload) == b"payload"
    rec, _, n = read_mux_record_or_eos(forged, SALT_B, premac=Premac(24, other))  # type: ignore[misc]
    assert (bytes(rec.payload), n) == (b"payload", 32)
    # a premac over another length is ignored: the covered bytes are hashed
    for covered in (23, 25, 7, 17):
        with pytest.raises(errors.AuthenticationError):
            decode_mux_record(forged, SALT_B, premac=Premac(covered, other))
        assert decode_mux_record(wire, SALT_B, premac=Premac(covered, other))[1] == 32


def test_read_without_salt_skips_only_the_tag() -> None:
    wire = record(SALT_B, 1, 9, b"abc")
    untagged = wire[:17] + bytes(8) + wire[25:]
    res = read_mux_record_or_eos(untagged, None)
    assert res is not END_OF_STREAM
    rec, hdr, n = res
    assert (rec.kind, rec.rank, bytes(rec.payload)) == (RecordKind.DATA, 9, b"abc")
    assert hdr == MuxHeader(1, 9, 3, bytes(8))
    assert n == 28
    with pytest.raises(errors.AuthenticationError):
        read_mux_record_or_eos(untagged, SALT_B)
    ctrl = head(2, 0, 2) + bytes(8) + b"\x02\x05"
    res2 = read_mux_record_or_eos(ctrl, None, version=3)
    assert res2 is not END_OF_STREAM and res2[0].control == RankExit(5)
    with pytest.raises(errors.InvalidValue):
        read_mux_record_or_eos(head(6, 0, 0) + bytes(8), None)
    with pytest.raises(errors.LimitExceeded):
        read_mux_record_or_eos(head(1, 0, 3) + bytes(8) + b"abc", None, ceiling=2)
    with pytest.raises(errors.LocalProtocolError):
        read_mux_record_or_eos(ctrl, None, version=1)


# -- rust_debug / ranks_str ----------------------------------------------------------------------
@pytest.mark.parametrize(("rec", "text"), [
    (MuxRecord.data(3, b"\x00\x01\xff"), "Data { rank: 3, payload: [0, 1, 255] }"),
    (MuxRecord.data(0, b""), "Data { rank: 0, payload: [] }"),
    (MuxRecord.host_frame(b"\x07\x08"), "HostFrame { payload: [7, 8] }"),
    (MuxRecord.broadcast(b"\x09"), "Broadcast { payload: [9] }"),
    (MuxRecord.control_msg(HelloAck()), "Control(HelloAck)"),
    (MuxRecord.control_msg(RankExit(4)), "Control(RankExit { rank: 4 })"),
    (MuxRecord.control_msg(DeclareDead(300)), "Control(DeclareDead { rank: 300 })"),
    (MuxRecord.control_msg(Hello("h0", [0, 1])),
     'Control(Hello { host: "h0", ranks: [0, 1], model_sigs: [] })'),
    (MuxRecord.control_msg(Hello('a"b\\c', []), 3),
     'Control(Hello { host: "a\\"b\\\\c", ranks: [], model_sigs: [] })'),
    (MuxRecord.control_msg(Hello("h", [5], [bytes([1, 2] + [0] * 30), bytes([255] * 32)]), 3),
     'Control(Hello { host: "h", ranks: [5], model_sigs: [[1, 2'
     + ", 0" * 30 + "], [" + ", ".join(["255"] * 32) + "]] })"),
])
def test_rust_debug(rec: MuxRecord, text: str) -> None:
    assert rust_debug(rec) == text


def test_rust_debug_caps_payload_lists() -> None:
    rec = MuxRecord.data(1, bytes(range(10)))
    assert rust_debug(rec, limit=3) == "Data { rank: 1, payload: [0, 1, 2, ...] }"
    assert rust_debug(rec, limit=10) == ("Data { rank: 1, payload: [0, 1, 2, 3, 4, 5, 6, 7, 8, "
                                         "9] }")
    assert rust_debug(rec, limit=9) == ("Data { rank: 1, payload: [0, 1, 2, 3, 4, 5, 6, 7, 8, "
                                        "...] }")
    long = MuxRecord.broadcast(bytes(300))
    assert rust_debug(long) == "Broadcast { payload: [" + ", ".join(["0"] * 256) + ", ...] }"
    exact = MuxRecord.host_frame(bytes(256))
    assert rust_debug(exact) == "HostFrame { payload: [" + ", ".join(["0"] * 256) + "] }"


def test_rust_debug_bounds_a_large_hello() -> None:
    # a Hello of 100,000 ranks shows its first 256 ranks, one of 100,000 signatures the 8
    # whole signatures 256 bytes hold; each list ends ', ...' as a capped payload does
    many_ranks = MuxRecord.control_msg(Hello("h", range(100_000)), 3)
    ranks = ", ".join(str(r) for r in range(256))
    text = f'Control(Hello {{ host: "h", ranks: [{ranks}, ...], model_sigs: [] }})'
    assert rust_debug(many_ranks) == text
    assert len(text) == 1228
    sig = "[" + ", ".join(["7"] * 32) + "]"
    many_sigs = MuxRecord.control_msg(Hello("h", [0], [bytes([7] * 32)] * 100_000), 3)
    text = f'Control(Hello {{ host: "h", ranks: [0], model_sigs: [{", ".join([sig] * 8)}, ...] }})'
    assert rust_debug(many_sigs) == text
    assert len(text) == 843
    # the bounds follow `limit`: 3 ranks, and no whole signature in 3 bytes
    both = MuxRecord.control_msg(Hello("h", range(5), [bytes(32)] * 2), 3)
    assert rust_debug(both, limit=3) == ('Control(Hello { host: "h", ranks: [0, 1, 2, ...], '
                                         "model_sigs: [...] })")
    # at the bounds every item is shown, as upstream shows it
    full = MuxRecord.control_msg(Hello("h", range(256), [bytes(32)] * 8), 3)
    zeros = "[" + ", ".join(["0"] * 32) + "]"
    assert rust_debug(full) == (f'Control(Hello {{ host: "h", ranks: [{ranks}], '
                                f'model_sigs: [{", ".join([zeros] * 8)}] }})')


def test_rust_debug_of_an_empty_cap() -> None:
    # a limit of 0 (or below) shows no byte: '[...]', not '[, ...]'
    rec = MuxRecord.data(1, b"abc")
    assert rust_debug(rec, limit=0) == "Data { rank: 1, payload: [...] }"
    assert rust_debug(rec, limit=-5) == "Data { rank: 1, payload: [...] }"
    assert rust_debug(MuxRecord.data(1, b""), limit=0) == "Data { rank: 1, payload: [] }"


def test_rust_debug_of_a_decoded_record() -> None:
    rec, _ = decode_mux_record(record(SALT_B, 2, 0, bytes.fromhex("00026830020001")), SALT_B)
    assert rust_debug(rec) == 'Control(Hello { host: "h0", ranks: [0, 1], model_sigs: [] })'


@pytest.mark.parametrize(("ranks", "text"), [
    ([], "[]"), ([7], "[7]"), ([0, 1, 2], "[0, 1, 2]"), (range(3, 5), "[3, 4]"),
    ((2**32 - 1,), "[4294967295]"),
])
def test_ranks_str(ranks: object, text: str) -> None:
    assert ranks_str(ranks) == text  # type: ignore[arg-type]


class _CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.submitted += 1
        return super().submit(*args, **kwargs)


@pytest.mark.parametrize(("elems", "handed_off"), [(4, 0), (1 << 10, 0), (1 << 18, 1)])
def test_encode_frame_record_hands_off_only_a_large_frame(elems: int, handed_off: int) -> None:
    # the frame MAC goes to the executor when the frame (before its tag) has at least
    # PARALLEL_MAC_MIN bytes, as update_in_parallel decides; the bytes are the same either way
    data = np.arange(elems, dtype="<f4")
    frame = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload(Dtype.F32, [elems], memoryview(data))])
    body = frame_wire(SALT_B, 0, 2.0, [(0, [elems], data.tobytes())])
    with _CountingExecutor() as ex:
        wire = joined(encode_frame_record(RecordKind.BROADCAST, frame, SALT_B, mac_executor=ex))
    assert (wire, ex.submitted) == (record(SALT_B, 4, 0, body), handed_off)
    assert joined(encode_frame_record(RecordKind.BROADCAST, frame, SALT_B)) == wire


@pytest.mark.parametrize(("extra", "handed_off"), [(-1, 0), (0, 1)])
def test_encode_frame_record_hands_off_from_exactly_parallel_mac_min_bytes(
        extra: int, handed_off: int) -> None:
    # a frame (before its tag) of PARALLEL_MAC_MIN bytes is handed off, one byte fewer is not.
    # The frame of one one-dim tensor has 31 bytes besides its payload, and a payload whose
    # byte count disagrees with its shape is written as given, so any frame length is reachable
    # (with payloads of whole f32 or bf16 elements a frame's length is always odd).
    data = bytes(range(256)) * (PARALLEL_MAC_MIN // 256)
    data = data[:PARALLEL_MAC_MIN - 31 + extra]
    frame = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload(Dtype.F32, [1], data)],
                       check_nbytes=False)
    assert sum(memoryview(p).nbytes for p in round_frame_pieces(frame)) == PARALLEL_MAC_MIN + extra
    with _CountingExecutor() as ex:
        wire = joined(encode_frame_record(RecordKind.BROADCAST, frame, SALT_B, mac_executor=ex))
    assert ex.submitted == handed_off
    assert wire == joined(encode_frame_record(RecordKind.BROADCAST, frame, SALT_B))
    assert wire == record(SALT_B, 4, 0, frame_wire(SALT_B, 0, 2.0, [(0, [1], data)]))


def test_a_hello_host_without_utf8_form_is_refused_where_it_is_given() -> None:
    """A lone surrogate (``--host`` given an undecodable byte) passed the relay's constructor
    and ended its dial in a UnicodeEncodeError when the Hello was encoded."""
    from flodl_proto.errors import InvalidValue, LocalProtocolError
    from flodl_proto.fsm.relay_core import RelayCore

    for make in (lambda: Hello("\udcff", [0]), lambda: RelayCore([0], 1, bytes(16),
                                                                  host="h\udcff")):
        with pytest.raises(InvalidValue) as ei:
            make()
        assert isinstance(ei.value, LocalProtocolError)
        assert ei.value.error_id == "mux.bad_field"
        assert str(ei.value).endswith("is invalid: not UTF-8 text (a lone surrogate)")
    assert Hello("h\u00f6st", [0]).host == "h\u00f6st"


@pytest.mark.parametrize(("msg", "got"), [(None, "None"), (b"\x00", "bytes"), (3, "int"),
                                         ("Hello", "str")])
def test_encode_control_of_something_else_than_a_control_message_names_it(msg: object,
                                                                          got: str) -> None:
    # None raised KeyError: <class 'NoneType'>; then the message read "msg = 'NoneType'"
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_control(msg, version=2)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.InvalidValue) and ei.value.error_id == "mux.bad_type"
    assert str(ei.value) == ("relay_mux: msg must be a control message (Hello, HelloAck, "
                             f"RankExit or DeclareDead), got {got}")


def test_a_record_the_decoder_built_under_a_leniency_can_be_rebuilt() -> None:
    """The constructor checks a Control record's message against its payload as the decoder
    reads it: a version-3 Hello read at version 2 (trailing bytes) and a non-canonical varint
    decode to a message that re-encodes to other bytes, and rebuilding such a record failed."""
    import dataclasses

    v3 = encode_control(Hello("h0", [0, 1], [SIG_A]), 3)
    noncanonical = bytes.fromhex("00" "02" "6830" "02" "00" "fb0100")  # rank 1 as a u16 varint
    for payload in (v3, noncanonical):
        rec = decode_mux_record(encode_mux_record_bytes(
            MuxRecord(RecordKind.CONTROL, 0, memoryview(payload)), SALT_B), SALT_B, version=2)[0]
        assert rec.control == Hello("h0", [0, 1])
        assert dataclasses.replace(rec) == rec
        assert MuxRecord(rec.kind, rec.rank, rec.payload, rec.control) == rec
    with pytest.raises(errors.LocalProtocolError, match="does not decode to it"):
        MuxRecord(RecordKind.CONTROL, 0, memoryview(b"\x01"), RankExit(3))


def test_the_hello_errors_carry_the_value_given() -> None:
    """Each Hello refusal names the field and carries the value at fault, not only its reason."""
    cases: list[tuple[Any, dict[str, object]]] = [
        (lambda: Hello("\udcff", [0]),
         {"field": "Hello.host", "value": "\udcff",
          "reason": "not UTF-8 text (a lone surrogate)"}),
        (lambda: Hello("h", 5),  # type: ignore[arg-type]
         {"field": "Hello.ranks", "value": 5, "reason": "not an iterable of u32 ranks"}),
        # text iterated to its characters: the first, '0', was named as the rank at fault
        (lambda: Hello("h", "01"),  # type: ignore[arg-type]
         {"field": "Hello.ranks", "value": "01",
          "reason": "not an iterable of u32 ranks (text is none)"}),
        # bytes iterated to their byte values: b"\x00\x01" was taken as the ranks 0 and 1
        *[(lambda given=given: Hello("h", given),  # type: ignore[misc]
           {"field": "Hello.ranks", "value": b"\x00\x01",
            "reason": "not an iterable of u32 ranks (bytes are none: each byte would be taken "
                      "as a rank; pass a list of ints)"})
          for given in (b"\x00\x01", bytearray(b"\x00\x01"), memoryview(b"\x00\x01"))],
        # the rank at fault is named by its index, as a signature is
        (lambda: Hello("h", [0, 1, -1]),
         {"field": "Hello.ranks[2]", "value": -1, "reason": "not a u32"}),
        (lambda: Hello("h", [0], b"x" * 32),  # type: ignore[arg-type]
         {"field": "Hello.model_sigs", "value": b"x" * 32,
          "reason": "not an iterable of 32-byte signatures (one signature? pass it in a list)"}),
        (lambda: Hello("h", [0], [SIG_A, 1]),  # type: ignore[list-item]
         {"field": "Hello.model_sigs[1]", "value": 1,
          "reason": "not bytes (or a sequence of ints 0..255)"}),
    ]
    for make, fields in cases:
        with pytest.raises(errors.LocalProtocolError) as ei:
            make()
        assert isinstance(ei.value, errors.InvalidValue) and ei.value.error_id == "mux.bad_field"
        assert ei.value.fields == fields
        assert str(ei.value) == (f"relay_mux: {fields['field']} = {fields['value']!r} is invalid: "
                                 f"{fields['reason']}")


@pytest.mark.parametrize("make", [
    lambda p: MuxRecord.data(0, p), MuxRecord.host_frame, MuxRecord.broadcast,
])
@pytest.mark.parametrize(("payload", "got"), [("ab", "str"), (None, "None")])
def test_a_payload_that_is_no_buffer_is_named(make: Any, payload: object, got: str) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        make(payload)
    assert isinstance(ei.value, errors.InvalidValue)
    assert ei.value.error_id == "codec.not_bytes_like"
    assert ei.value.fields == {"field": "payload", "got": got}
    assert str(ei.value) == ("payload must be a contiguous bytes-like object (bytes, bytearray or "
                             f"memoryview), got {got}")


@pytest.mark.parametrize(("record", "got"), [(None, "None"), (5, "int"), (b"\x01", "bytes"),
                                            (object(), "object")])
def test_encode_mux_record_of_something_else_than_a_record_names_its_type(record: object,
                                                                          got: str) -> None:
    """The type is named after "got", with its article (it read "record = 'NoneType'")."""
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record(record, SALT_B)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.InvalidValue) and ei.value.error_id == "mux.bad_type"
    assert ei.value.fields == {"field": "record", "expected": "a MuxRecord", "got": got}
    assert str(ei.value) == f"relay_mux: record must be a MuxRecord, got {got}"


@pytest.mark.parametrize("kind", [0, 5, 7, True, 2.0, "x"])
def test_encode_mux_record_refuses_a_record_like_object_of_no_record_kind(kind: Any) -> None:
    """An object with a record's attributes but no record kind is refused before anything is
    written (the decoder would refuse the byte; encode_mux_record_parts writes any byte)."""
    from types import SimpleNamespace

    rec = SimpleNamespace(kind=kind, rank=0, payload=memoryview(b"x"))
    with pytest.raises(errors.LocalProtocolError) as ei:
        encode_mux_record(rec, SALT_B)  # type: ignore[arg-type]
    assert isinstance(ei.value, errors.InvalidValue) and ei.value.error_id == "mux.bad_field"
    reason = "not a record kind (1 DATA, 2 CONTROL, 3 HOST_FRAME, 4 BROADCAST)"
    assert ei.value.fields == {"field": "kind", "value": kind, "reason": reason}
    assert str(ei.value) == f"relay_mux: kind = {kind!r} is invalid: {reason}"
    ok = SimpleNamespace(kind=RecordKind.DATA, rank=3, payload=memoryview(b"x"))
    assert encode_mux_record_bytes(ok, SALT_B) == record(SALT_B, 1, 3, b"x")  # type: ignore[arg-type]


def test_a_control_record_of_a_version_3_hello_with_signatures_is_built() -> None:
    """The message is checked against the payload at every protocol version: a version-3 Hello
    carrying signatures decodes to itself only at version 3."""
    import dataclasses

    msg = Hello("h0", [0, 1], [SIG_A])
    payload = encode_control(msg, 3)
    rec = MuxRecord(RecordKind.CONTROL, 0, memoryview(payload), msg)
    assert (rec.kind, rec.rank, bytes(rec.payload), rec.control) == (
        RecordKind.CONTROL, 0, payload, msg)
    built = MuxRecord.control_msg(msg, 3)
    assert dataclasses.replace(built).control == msg


def test_encode_frame_record_refuses_what_is_no_round_frame() -> None:
    for frame in (None, "x", b""):
        with pytest.raises(errors.InvalidValue) as ei:
            encode_frame_record(RecordKind.HOST_FRAME, frame, SALT_ZERO)  # type: ignore[arg-type]
        assert isinstance(ei.value, errors.LocalProtocolError)
        assert ei.value.error_id == "frame.bad_type"
        got = {None: "None", "x": "str", b"": "bytes"}[frame]
        assert ei.value.fields == {"field": "frame", "expected": "a RoundFrame", "got": got}
        assert str(ei.value) == f"round_frame: frame must be a RoundFrame, got {got}"


@pytest.mark.parametrize("header", ["x", b"\x00" * 25, 0])
def test_a_header_that_is_no_mux_header_is_refused(header: Any) -> None:
    wire = encode_mux_record_bytes(MuxRecord.host_frame(b"abc"), SALT_ZERO)
    for decode in (decode_mux_record, decode_mux_record_or_eos):
        with pytest.raises(errors.InvalidValue) as ei:
            decode(wire, SALT_ZERO, header=header)
        assert isinstance(ei.value, errors.LocalProtocolError)
        assert ei.value.error_id == "mux.bad_type"
        assert ei.value.fields["field"] == "header"
        got = {"x": "str", 0: "int"}.get(header, "bytes")
        assert ei.value.fields["got"] == got
        assert str(ei.value) == ("relay_mux: header must be a MuxHeader (parse_mux_header's "
                                 f"result) or None, got {got}")
    hdr = parse_mux_header(wire)
    assert decode_mux_record(wire, SALT_ZERO, header=hdr)[0].payload == b"abc"


@pytest.mark.parametrize(("payload", "error_id", "field", "got"), [
    (b"ab", "codec.not_pieces", "payload", "bytes"),
    (bytearray(b"ab"), "codec.not_pieces", "payload", "bytearray"),
    ("ab", "codec.not_pieces", "payload", "str"),
    (None, "codec.not_pieces", "payload", "None"),
    (3, "codec.not_pieces", "payload", "int"),
    (["ab"], "codec.not_bytes_like", "payload[0]", "str"),
    ([b"a", None], "codec.not_bytes_like", "payload[1]", "None"),
    # a strided view: the MAC raised BufferError
    ([memoryview(b"abcd")[::2]], "codec.not_bytes_like", "payload[0]",
     "a non-contiguous memoryview"),
])
def test_encode_mux_record_parts_says_what_is_wrong_with_the_payload(
        payload: Any, error_id: str, field: str, got: str) -> None:
    with pytest.raises(errors.InvalidValue) as ei:
        encode_mux_record_parts(1, 0, payload, SALT_ZERO)
    assert isinstance(ei.value, errors.LocalProtocolError)
    assert ei.value.error_id == error_id
    assert ei.value.fields == {"field": field, "got": got}
    if error_id == "codec.not_pieces":
        assert str(ei.value) == (f"payload must be an iterable of bytes-like pieces (one buffer: "
                                 f"pass [data]), got {got}")


@pytest.mark.parametrize("make", [lambda: iter([b"he", b"llo"]),
                                  lambda: (p for p in [b"he", b"llo"])])
def test_encode_mux_record_parts_takes_an_iterator_of_pieces_once(make: Any) -> None:
    """An iterator was used up measuring the payload: the record said 5 bytes and carried none
    (a corrupt record, no error)."""
    parts = encode_mux_record_parts(1, 3, make(), SALT_ZERO)
    wire = b"".join(bytes(p) for p in parts)
    assert wire == encode_mux_record_bytes(MuxRecord.data(3, b"hello"), SALT_ZERO)

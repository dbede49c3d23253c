"""A caller's mistake with the public codec API is a local error naming the argument and the value:
never a remote error (the peer is not at fault), a bare TypeError or AttributeError from inside
the codec, or construct's FormatFieldError; and nothing wrong is encoded (a float version, a bool
channel, a kind the decoder refuses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flodl_proto.codec import (
    Handshake,
    Hello,
    HelloAck,
    LenFramedDecoder,
    MuxRecord,
    MuxStream,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundFrameDecoder,
    RoundKind,
    decode_ack,
    decode_handshake,
    decode_len_framed,
    decode_mux_record,
    decode_round_frame,
    encode_ack,
    encode_channel_magic,
    encode_handshake,
    encode_len_framed,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
    expect_channel_magic,
    parse_mux_header,
)
from flodl_proto.codec.stream import MagicReceived, StreamFailed
from flodl_proto.errors import InvalidValue, LocalProtocolError, VersionMismatch

SALT = bytes(range(16))
HANDSHAKE = encode_handshake(0, 4)
MAGIC = encode_channel_magic("data")
STRIDED = memoryview(bytes(64))[::2]
FRAME = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, []), SALT)
RECORD = encode_mux_record_bytes(MuxRecord.data(0, b"ab"), SALT)
BUFFER = ("must be a contiguous bytes-like object (bytes, bytearray or memoryview), got ")
#: what a RoundFrame given for bytes is told (MuxRecord.host_frame's docstring says so too)
ENCODE_IT = " (encode it first: encode_round_frame_bytes(frame, salt))"

# (call, error class, the message: exact)
CASES: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "decode_handshake expected bool": (
        lambda: decode_handshake(HANDSHAKE, True),
        InvalidValue, "handshake: expected_world_size = True is invalid: not a u32"),
    "decode_handshake expected negative": (
        lambda: decode_handshake(HANDSHAKE, -1),
        InvalidValue, "handshake: expected_world_size = -1 is invalid: not a u32"),
    "decode_handshake expected text": (
        lambda: decode_handshake(HANDSHAKE, "4"),  # type: ignore[arg-type]
        InvalidValue, "handshake: expected_world_size = '4' is invalid: not a u32"),
    "decode_handshake expected float": (
        lambda: decode_handshake(HANDSHAKE, 4.0),  # type: ignore[arg-type]
        InvalidValue, "handshake: expected_world_size = 4.0 is invalid: not a u32"),
    "decode_handshake data None": (
        lambda: decode_handshake(None, 4),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "None"),
    "expect_channel_magic negative": (
        lambda: expect_channel_magic(MAGIC, -1),
        InvalidValue, "channel magic: expected = -1 is invalid: not one of ['control', "
        "'data', 'join', 'rendezvous'] or a u32"),
    "expect_channel_magic None": (
        lambda: expect_channel_magic(MAGIC, None),  # type: ignore[arg-type]
        InvalidValue, "channel magic: expected = None is invalid: not one of ['control', "
        "'data', 'join', 'rendezvous'] or a u32"),
    "expect_channel_magic unknown name": (
        lambda: expect_channel_magic(MAGIC, "dta"),
        InvalidValue, "channel magic: expected = 'dta' is invalid: not one of ['control', "
        "'data', 'join', 'rendezvous'] or a u32"),
    "MuxStream hello_limit negative": (
        lambda: MuxStream(SALT, hello_limit=-1),
        InvalidValue, "relay_mux: hello_limit = -1 is invalid: not None or a number of bytes "
        ">= 0"),
    "MuxStream hello_limit float": (
        lambda: MuxStream(SALT, hello_limit=300.0),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: hello_limit = 300.0 is invalid: not None or a number of "
        "bytes >= 0"),
    "MuxStream control_limit negative": (
        lambda: MuxStream(SALT, control_limit=-1),
        InvalidValue, "relay_mux: control_limit = -1 is invalid: not None or a number of bytes "
        ">= 0"),
    "MuxStream control_limit text": (
        lambda: MuxStream(SALT, control_limit="300"),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: control_limit = '300' is invalid: not None or a number of "
        "bytes >= 0"),
    "MuxStream expect_magic above u32": (
        lambda: MuxStream(SALT, expect_magic=2**32),
        InvalidValue, "relay_mux: expect_magic = 4294967296 is invalid: not None, a channel name "
        "(control, data, join, rendezvous) or a u32"),
    "MuxStream expect_magic bytes": (
        lambda: MuxStream(SALT, expect_magic=b"data"),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: expect_magic = b'data' is invalid: not None, a channel name "
        "(control, data, join, rendezvous) or a u32"),
    "MuxStream expect_magic unknown name": (
        lambda: MuxStream(SALT, expect_magic="Data"),
        InvalidValue, "relay_mux: expect_magic = 'Data' is invalid: not None, a channel name "
        "(control, data, join, rendezvous) or a u32"),
    "encode_ack float version": (
        lambda: encode_ack(2.0),  # type: ignore[arg-type]
        VersionMismatch, "protocol version 2.0 is not supported (supported: [2, 3])"),
    "encode_handshake float version": (
        lambda: encode_handshake(0, 4, version=2.0),  # type: ignore[arg-type]
        VersionMismatch, "protocol version 2.0 is not supported (supported: [2, 3])"),
    "decode_ack float version": (
        lambda: decode_ack(encode_ack(2), 2.0),  # type: ignore[arg-type]
        VersionMismatch, "protocol version 2.0 is not supported (supported: [2, 3])"),
    "decode_ack bool version": (
        lambda: decode_ack(encode_ack(2), True),
        VersionMismatch, "protocol version True is not supported (supported: [2, 3])"),
    "encode_channel_magic float": (
        lambda: encode_channel_magic(1.5),  # type: ignore[arg-type]
        InvalidValue, "channel magic: channel = 1.5 is invalid: not one of ['control', 'data', "
        "'join', 'rendezvous'] or a u32"),
    "encode_channel_magic bool": (
        lambda: encode_channel_magic(True),
        InvalidValue, "channel magic: channel = True is invalid: not one of ['control', 'data', "
        "'join', 'rendezvous'] or a u32"),
    # the constructor refuses them now (it took any kind, and encode refused it)
    "a MuxRecord of an unknown kind": (
        lambda: MuxRecord(99, 0, memoryview(b"")),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: MuxRecord.kind = 99 is invalid: not a record kind (1 DATA, "
        "2 CONTROL, 3 HOST_FRAME, 4 BROADCAST)"),
    "a MuxRecord of kind None": (
        lambda: MuxRecord(None, 0, memoryview(b"")),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: MuxRecord.kind = None is invalid: not a record kind (1 DATA, "
        "2 CONTROL, 3 HOST_FRAME, 4 BROADCAST)"),
    "a MuxRecord of kind True": (
        lambda: MuxRecord(True, 0, memoryview(b"")),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: MuxRecord.kind = True is invalid: not a record kind (1 DATA, "
        "2 CONTROL, 3 HOST_FRAME, 4 BROADCAST)"),
    "a MuxRecord of rank -1": (
        lambda: MuxRecord(RecordKind.DATA, -1, memoryview(b"")),
        InvalidValue, "relay_mux: MuxRecord.rank = -1 is invalid: not a u32"),
    "a MuxRecord whose control message is not its payload": (
        lambda: MuxRecord(RecordKind.CONTROL, 0, memoryview(b"\x01"), RankExit(3)),
        InvalidValue, "relay_mux: MuxRecord.control = RankExit(rank=3) is invalid: the payload "
        "does not decode to it at any protocol version"),
    "a HostFrame MuxRecord with a control message": (
        lambda: MuxRecord(RecordKind.HOST_FRAME, 0, memoryview(b""), HelloAck()),
        InvalidValue, "relay_mux: MuxRecord.control = HelloAck() is invalid: only a Control "
        "record carries one"),
    "a MuxRecord of a text payload": (
        lambda: MuxRecord(RecordKind.DATA, 0, "ab"),  # type: ignore[arg-type]
        InvalidValue, "payload " + BUFFER + "str"),
    "encode_mux_record_bytes None": (
        lambda: encode_mux_record_bytes(None, SALT),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: record must be a MuxRecord, got None"),
    "decode_round_frame None": (
        lambda: decode_round_frame(None, SALT),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "None"),
    "decode_round_frame strided": (
        lambda: decode_round_frame(STRIDED, SALT),
        InvalidValue, "data " + BUFFER + "a non-contiguous memoryview"),
    "decode_round_frame premac text": (
        lambda: decode_round_frame(FRAME, SALT, premac="x"),  # type: ignore[arg-type]
        InvalidValue, "round_frame: premac must be a Premac (a MAC over the bytes being "
        "decoded) or None, got str"),
    "decode_mux_record premac number": (
        lambda: decode_mux_record(RECORD, SALT, premac=5),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: premac must be a Premac (a MAC over the bytes being "
        "decoded) or None, got int"),
    "decode_mux_record text": (
        lambda: decode_mux_record("d017", SALT),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "str"),
    "parse_mux_header None": (
        lambda: parse_mux_header(None),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "None"),
    "decode_len_framed list": (
        lambda: decode_len_framed([1, 2]),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "list"),
    "MuxStream.feed None": (
        lambda: MuxStream(SALT).feed(None),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "None"),
    "RoundFrameDecoder.feed None": (
        lambda: RoundFrameDecoder(SALT).feed(None),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "None"),
    "LenFramedDecoder.feed None": (
        lambda: LenFramedDecoder().feed(None),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "None"),
    "encode_len_framed None": (
        lambda: encode_len_framed(None),  # type: ignore[arg-type]
        InvalidValue, "blob " + BUFFER + "None"),
    "RoundFrame tensors None": (
        lambda: RoundFrame(RoundKind.MODEL, 1.0, None),  # type: ignore[arg-type]
        InvalidValue, "round_frame: tensors must be an iterable of TensorPayload, got None"),
    "RoundFrame tensors number": (
        lambda: RoundFrame(RoundKind.MODEL, 1.0, 5),  # type: ignore[arg-type]
        InvalidValue, "round_frame: tensors must be an iterable of TensorPayload, got int"),
    "Hello ranks None": (
        lambda: Hello("h", None),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: Hello.ranks = None is invalid: not an iterable of u32 ranks"),
    "Handshake rank text": (
        lambda: Handshake("a", 4, 2),  # type: ignore[arg-type]
        InvalidValue, "handshake: Handshake.rank = 'a' is invalid: not a u32"),
    "Handshake world size above u32": (
        lambda: Handshake(0, 2**32, 2),
        InvalidValue, "handshake: Handshake.world_size = 4294967296 is invalid: not a u32"),
    "Handshake version": (
        lambda: Handshake(0, 4, 7),
        VersionMismatch, "protocol version 7 is not supported (supported: [2, 3])"),
    "encode_handshake of a Handshake": (
        lambda: encode_handshake(Handshake(0, 4, 2), 4),  # type: ignore[arg-type]
        InvalidValue, "handshake: rank = Handshake(rank=0, world_size=4, version=2) is invalid: "
        "not a u32 (a Handshake: pass its fields, encode_handshake(h.rank, h.world_size, "
        "h.version))"),
    "Hello ranks mapping": (
        lambda: Hello("h", {0: 1, 2: 3}),
        InvalidValue, "relay_mux: Hello.ranks = {0: 1, 2: 3} is invalid: not an iterable of u32 "
        "ranks (a mapping is none: its keys would be taken as the ranks; pass a list of ints)"),
    "Hello model_sigs mapping": (
        lambda: Hello("h", [0], {b"sig": "model"}),
        InvalidValue, "relay_mux: Hello.model_sigs = {b'sig': 'model'} is invalid: not an "
        "iterable of 32-byte signatures (a mapping is none: its keys would be taken as the "
        "signatures; pass a list)"),
    "Hello model_sigs number": (
        lambda: Hello("h", [0], 5),  # type: ignore[arg-type]
        InvalidValue, "relay_mux: Hello.model_sigs = 5 is invalid: not an iterable of 32-byte "
        "signatures"),
    "MuxRecord.host_frame of a RoundFrame": (
        lambda: MuxRecord.host_frame(RoundFrame(RoundKind.MODEL, 1.0, [])),  # type: ignore[arg-type]
        InvalidValue, "payload " + BUFFER + "RoundFrame" + ENCODE_IT),
    "MuxRecord.broadcast of a RoundFrame": (
        lambda: MuxRecord.broadcast(RoundFrame(RoundKind.MODEL, 1.0, [])),  # type: ignore[arg-type]
        InvalidValue, "payload " + BUFFER + "RoundFrame" + ENCODE_IT),
    "encode_len_framed of a RoundFrame": (
        lambda: encode_len_framed(RoundFrame(RoundKind.MODEL, 1.0, [])),  # type: ignore[arg-type]
        InvalidValue, "blob " + BUFFER + "RoundFrame" + ENCODE_IT),
    "decode_round_frame of a RoundFrame": (
        lambda: decode_round_frame(RoundFrame(RoundKind.MODEL, 1.0, []), SALT),  # type: ignore[arg-type]
        InvalidValue, "data " + BUFFER + "RoundFrame" + ENCODE_IT),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_callers_mistake_is_a_local_error_naming_the_argument(name: str) -> None:
    call, cls, message = CASES[name]
    with pytest.raises(cls) as ei:
        call()
    err = ei.value
    assert isinstance(err, LocalProtocolError) and err.remote is False
    assert str(err) == message


def test_the_right_arguments_still_work() -> None:
    # the checks refuse only what is wrong: names, NumPy integers and views are taken
    import numpy as np

    assert expect_channel_magic(MAGIC, "data") == 4
    assert expect_channel_magic(MAGIC, np.uint32(0xF10D17E1)) == 4
    assert decode_handshake(HANDSHAKE, np.int64(4))[0].world_size == 4
    assert encode_ack(np.int32(3)) == encode_ack(3)
    assert MuxStream(SALT, hello_limit=np.uint16(300), expect_magic=None).payload_limit == 300
    # the bounds are taken: 0 and u32's largest
    assert MuxStream(SALT, hello_limit=0, expect_magic=0).payload_limit == 0
    assert MuxStream(SALT, expect_magic=2**32 - 1).feed(b"\xff\xff\xff\xff") == [
        MagicReceived(4)]
    # a channel name, as encode_channel_magic and expect_channel_magic take it
    assert MuxStream(SALT, expect_magic="data").feed(MAGIC) == [MagicReceived(4)]
    [failed] = MuxStream(SALT, expect_magic="control").feed(MAGIC)
    assert isinstance(failed, StreamFailed)
    assert str(failed.error) == ("cluster_controller: channel magic 0xf10d17e1 != 0xf10d17e2 "
                                 "(connection routed to the wrong channel?)")
    big = 287 + 37 * (2**32 - 1)  # the Hello bound of the largest world: above u32
    assert MuxStream(SALT, hello_limit=big, ceiling=2**40).payload_limit == big
    assert decode_len_framed(memoryview(encode_len_framed(b"abc")[0] + b"abc"))[0] == b"abc"
    as_2d = memoryview(bytearray(HANDSHAKE)).cast("B", (4, 4))  # contiguous, any shape
    assert decode_handshake(as_2d, 4)[0].world_size == 4


def test_a_bf16_array_is_a_buffer_as_an_f32_array_is() -> None:
    """NumPy exports no buffer for an ``ml_dtypes.bfloat16`` array: its memory is taken as
    any other array's (it was refused as "not bytes-like", where an f32 array was taken)."""
    import ml_dtypes
    import numpy as np

    from flodl_proto.codec import TensorPayload

    a = np.array([[1.0, -2.5], [3.0, 0.5]], ml_dtypes.bfloat16)
    t = TensorPayload(1, a.shape, a)
    assert bytes(t.data) == a.tobytes() == bytes(TensorPayload.from_array(a).data)
    assert t.array().tolist() == a.tolist()
    assert bytes(encode_len_framed(np.array(2.0, ml_dtypes.bfloat16))[1]) == b"\x00\x40"
    with pytest.raises(InvalidValue) as e:  # a strided view stays refused, named so
        TensorPayload(1, [2], a[:, 0])
    assert str(e.value) == ("data must be a contiguous bytes-like object (bytes, bytearray or "
                            "memoryview), got a non-contiguous ndarray")


def test_an_object_array_is_no_buffer_of_bytes() -> None:
    """A NumPy object array exports a buffer of its objects' addresses: it was taken as a
    payload, and those addresses went out as the payload's bytes."""
    import numpy as np

    from flodl_proto.codec import MuxRecord, TensorPayload, encode_mux_record_parts

    objects = np.array([None, None], dtype=object)
    why = ("must be a contiguous bytes-like object (bytes, bytearray or memoryview), got a "
           "ndarray of Python objects (its buffer holds their addresses, not bytes to send)")
    for field, call in (("data", lambda: TensorPayload(0, [4], objects)),
                        ("payload", lambda: MuxRecord.data(0, objects)),
                        ("blob", lambda: encode_len_framed(objects)),
                        ("blob[1]", lambda: encode_len_framed([b"a", objects])),
                        ("payload[0]", lambda: encode_mux_record_parts(3, 0, [objects], SALT))):
        with pytest.raises(InvalidValue) as e:
            call()
        assert not e.value.remote
        assert str(e.value) == f"{field} {why}"


def test_numpy_text_is_no_buffer_of_bytes() -> None:
    """NumPy text exports its characters as UCS-4: ``np.array(["ab"])`` was taken as the 8
    bytes ``a\\0\\0\\0b\\0\\0\\0`` by encode_len_framed, as a MAC piece, as a payload and as
    bytes to decode, where a strided one or a ``str_`` piece was named as NumPy text."""
    import numpy as np

    from flodl_proto.codec import TensorPayload, compute_tag, encode_mux_record_parts

    text = np.array(["ab"])
    one = np.str_("ab")
    why = ("must be a contiguous bytes-like object (bytes, bytearray or memoryview), got NumPy "
           "text ({} of dtype <U2): encode it to bytes")
    for field, value, call in (
            ("blob", text, lambda: encode_len_framed(text)),
            ("blob", one, lambda: encode_len_framed(one)),
            ("blob[1]", text, lambda: encode_len_framed([b"a", text])),
            ("pieces[1]", text, lambda: compute_tag(SALT, [b"a", text])),
            ("payload[0]", text, lambda: encode_mux_record_parts(3, 0, [text], SALT)),
            ("payload", text, lambda: MuxRecord.data(0, text)),
            ("data", text, lambda: TensorPayload(0, [2], text)),
            ("data", one, lambda: TensorPayload(0, [2], one)),
            ("data", text, lambda: decode_len_framed(text))):
        with pytest.raises(InvalidValue) as e:
            call()
        assert isinstance(e.value, LocalProtocolError) and e.value.__cause__ is None
        assert (e.value.error_id, str(e.value)) == (
            "codec.not_bytes_like", f"{field} {why.format(type(value).__name__)}")
    # a memoryview is taken as the bytes it asks for; a numeric array stays one buffer
    assert b"".join(encode_len_framed(memoryview(text))) == b"\x08\0\0\0a\0\0\0b\0\0\0"
    assert bytes(TensorPayload(0, [2], np.zeros(2, np.float32)).data) == bytes(8)


def test_numpy_text_is_no_salt_wherever_a_salt_is_taken() -> None:
    """``np.array(["abcd"])`` exports 16 bytes of UCS-4 characters, which every salt entry point
    took as the session salt: it is refused as NumPy text, as the codec names it where it takes
    bytes."""
    import numpy as np

    from flodl_proto.codec import (
        FrameTemplate,
        compute_tag,
        decode_framed_round,
        encode_frame_record,
        encode_framed_round,
    )
    from flodl_proto.reduce import HostFold

    text = np.array(["abcd"])
    frame = RoundFrame(RoundKind.MODEL, 1.0, [])
    calls: list[Callable[[], Any]] = [
        lambda: compute_tag(text, [b"x"]),
        lambda: encode_round_frame_bytes(frame, text),
        lambda: decode_round_frame(FRAME, text),
        lambda: encode_mux_record_bytes(MuxRecord.data(0, b"ab"), text),
        lambda: decode_mux_record(RECORD, text),
        lambda: encode_frame_record(RecordKind.HOST_FRAME, frame, text),
        lambda: encode_framed_round(frame, text),
        lambda: decode_framed_round(b"".join(encode_framed_round(frame, SALT)), text),
        lambda: RoundFrameDecoder(text),
        lambda: MuxStream(text),
        lambda: HostFold([0], text),
        lambda: FrameTemplate(RoundKind.MODEL, [(0, (2,))]).seal(1.0, text),
    ]
    for call in calls:
        with pytest.raises(InvalidValue) as e:
            call()
        assert isinstance(e.value, LocalProtocolError) and e.value.__cause__ is None
        assert (e.value.error_id, str(e.value)) == (
            "salt.not_bytes", "session salt must be 16 bytes, got NumPy text (ndarray of dtype "
            "<U4) (convert hex text with bytes.fromhex)")

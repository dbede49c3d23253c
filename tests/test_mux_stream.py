"""``codec.stream.MuxStream``, the one mux parser, in its three uses: zero copy by default (the
controller's reader feeds one buffer per record), ``copy=True`` for callers that reuse their
chunks, and ``salt=None`` (every check but the tag, as the decode CLI reads)."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec import (
    MuxRecord,
    RoundFrame,
    TensorPayload,
    encode_channel_magic,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from flodl_proto.codec.mux import MuxHeader, parse_mux_header
from flodl_proto.codec.stream import (
    MagicReceived,
    MuxStream,
    RecordReceived,
    StreamEnded,
    StreamFailed,
)
from flodl_proto.errors import AuthenticationError, InvalidValue, LocalProtocolError

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
OTHER = bytes(16)
FRAME = RoundFrame(0, 2.0, [TensorPayload(0, (2,), bytes(range(8)))])


def _records(events: list[object]) -> list[RecordReceived]:
    assert all(isinstance(ev, RecordReceived) for ev in events), events
    return [ev for ev in events if isinstance(ev, RecordReceived)]


def test_default_decodes_a_whole_record_in_place() -> None:
    wire = bytearray(encode_mux_record_bytes(MuxRecord.data(7, b"payload"), SALT))
    [ev] = _records(MuxStream(SALT, expect_magic=None).feed(wire))
    assert ev.record.payload.obj is wire  # a view of the fed buffer, no copy
    assert (ev.record.rank, bytes(ev.record.payload), ev.nbytes) == (7, b"payload", len(wire))
    assert ev.header == parse_mux_header(wire)


def test_copy_records_outlive_the_chunk() -> None:
    two = (encode_mux_record_bytes(MuxRecord.data(1, b"first"), SALT)
           + encode_mux_record_bytes(MuxRecord.data(2, b"second"), SALT))
    for cut in (len(two), 30, 50):  # whole, the first record split, the second split
        stream = MuxStream(SALT, expect_magic=None, copy=True)
        got = []
        for part in (two[:cut], two[cut:]):
            buf = bytearray(part)
            got += _records(stream.feed(buf))
            buf[:] = b"\xa5" * len(buf)  # the caller reuses its buffer
            assert all(ev.record.payload.obj is not buf for ev in got)
        assert [(ev.record.rank, bytes(ev.record.payload)) for ev in got] == [
            (1, b"first"), (2, b"second")]
        assert stream.feed_eof() == [StreamEnded()]


def test_without_salt_every_check_but_the_tag() -> None:
    wire = (encode_channel_magic("data")
            + encode_mux_record_bytes(MuxRecord.data(3, b"x"), OTHER)
            + encode_mux_record_bytes(MuxRecord.host_frame(encode_round_frame_bytes(FRAME, OTHER)),
                                      OTHER))
    checked = MuxStream(SALT).feed(wire)
    assert isinstance(checked[0], MagicReceived)
    assert isinstance(checked[1], StreamFailed)
    assert isinstance(checked[1].error, AuthenticationError)
    assert checked[1].error.error_id == "mux.auth_failed"

    events = MuxStream(None).feed(wire)
    assert isinstance(events[0], MagicReceived)
    data, host = _records(events[1:])
    assert (data.record.rank, bytes(data.record.payload)) == (3, b"x")
    assert data.header.auth_tag == wire[4 + 17:4 + 25]  # the carried tag, for the caller to check
    assert host.frame == FRAME  # the inner frame is parsed without its tag too

    unknown_kind = bytearray(encode_mux_record_bytes(MuxRecord.data(0, b""), OTHER))
    unknown_kind[8] = 9
    [failed] = MuxStream(None, expect_magic=None).feed(unknown_kind)
    assert isinstance(failed, StreamFailed) and failed.error.error_id == "mux.unknown_kind"


@pytest.mark.parametrize("ceiling", [-1, 1.5])
def test_bad_arguments_are_local_errors(ceiling: object) -> None:
    with pytest.raises(InvalidValue):
        MuxStream(SALT, ceiling=ceiling)  # type: ignore[arg-type]
    with pytest.raises(InvalidValue):
        MuxStream(b"short")


def test_every_assertion_a_public_method_raises_is_in_its_docstring() -> None:
    """feed_eof's internal-invariant AssertionError was not in its docstring, nor feed's, which
    reaches the one of ``_decode_one`` (through ``_parse_in_place`` and ``_drain_buffer``)."""
    import inspect
    import re

    methods = {name: fn for name, fn in vars(MuxStream).items() if callable(fn)}
    sources = {name: inspect.getsource(fn) for name, fn in methods.items()}

    def asserts(name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``name`` raises AssertionError itself or through a method it calls."""
        if "raise AssertionError" in sources[name]:
            return True
        called = set(re.findall(r"self\.(_\w+)\(", sources[name])) & methods.keys()
        return any(asserts(c, seen | {name}) for c in called - seen - {name})

    checked = []
    for name, fn in methods.items():
        if name.startswith("_") or not asserts(name):
            continue
        checked.append(name)
        raises = (fn.__doc__ or "").split("Raises:", 1)
        assert len(raises) == 2 and "AssertionError" in raises[1], name
    assert sorted(checked) == ["feed", "feed_eof"]


@pytest.mark.parametrize(("length", "chunk"), [
    (-5, 40),  # cut a 20-byte "record", read as a clean end of stream: an AssertionError
    (2.0, 27), ("2", 27), (None, 27),  # TypeErrors of the slicing or of 25 + length
    (True, 27), (np.bool_(True), 27), (np.array([2]), 27),  # no integer to the codec
    (np.int64(-5), 40), (np.uint64(2**32), 27),
])
def test_a_header_whose_length_is_no_u32_is_the_callers_error(length: object, chunk: int
                                                               ) -> None:
    """The ``header`` hint describes the record at the start of the chunk; one whose
    ``payload_len`` is no u32 comes from no reader and is refused before the bytes are taken."""
    wire = encode_mux_record_bytes(MuxRecord.data(7, b"xy"), SALT)
    good = parse_mux_header(wire)
    stream = MuxStream(SALT, expect_magic=None)
    bad = MuxHeader(good.kind, good.rank, length, good.auth_tag)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError) as ei:
        stream.feed(bytes(chunk), header=bad)
    assert isinstance(ei.value, InvalidValue) and ei.value.error_id == "mux.bad_field"
    assert str(ei.value) == (f"relay_mux: header.payload_len = {length!r} is invalid: not a "
                             "u32 (parse_mux_header's result holds the record's length)")
    assert (stream.done, stream.buffered, stream.bytes_in) == (False, 0, 0)
    [ev] = stream.feed(wire, header=good)  # the stream goes on
    assert isinstance(ev, RecordReceived) and bytes(ev.record.payload) == b"xy"


@pytest.mark.parametrize("length", [np.uint32(2), np.int64(2), np.array(2)],
                         ids=["uint32", "int64", "0-d"])
def test_a_header_whose_length_is_a_numpy_integer_is_taken(length: object) -> None:
    """The ``header`` hint's ``payload_len`` is an integer by the codec's rule (``wire_int``),
    as a rank or a dim is: a NumPy integer (a 0-d array of one too) is taken as its value,
    where it was refused as 'not a u32'."""
    wire = encode_mux_record_bytes(MuxRecord.data(7, b"xy"), SALT)
    good = parse_mux_header(wire)
    hint = MuxHeader(good.kind, good.rank, length, good.auth_tag)  # type: ignore[arg-type]
    stream = MuxStream(SALT, expect_magic=None)
    [ev] = stream.feed(wire, header=hint)
    assert isinstance(ev, RecordReceived) and bytes(ev.record.payload) == b"xy"
    assert ev.record.rank == 7 and (stream.buffered, stream.bytes_in) == (0, len(wire))
    empty = MuxHeader(0, 0, length, bytes(8))  # type: ignore[arg-type]
    assert MuxStream(bytes(16)).feed(b"", header=empty) == []

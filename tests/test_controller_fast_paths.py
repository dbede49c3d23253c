"""The fast forms on the controller's small-record path agree with the general ones they stand
for: ``mux.header_or_none`` with ``parse_mux_header`` (the header, or None exactly where that
raises), ``mux.read_headed_record`` with ``read_mux_record_or_eos`` (records and errors),
``MuxStream.feed`` with a parsed header with the same feed without one (events and errors), the
relay reader's one-step read of a small record (``relay_reader._read_small``) with its planned
read (events, errors and the stream's end), and the per-record and per-round builders of frozen
dataclasses with their constructors."""

from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flodl_proto.codec import stream as stream_mod
from flodl_proto.codec.auth import Premac, new_mac
from flodl_proto.codec.mux import (
    Hello,
    MuxHeader,
    MuxRecord,
    RecordKind,
    _header,
    decode_mux_record,
    encode_frame_record,
    encode_mux_record_bytes,
    header_or_none,
    parse_mux_header,
    read_headed_record,
    read_mux_record_or_eos,
)
from flodl_proto.codec.round_frame import RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec.stream import MuxStream, RecordReceived, StreamFailed
from flodl_proto.codec.structs import PACKED
from flodl_proto.errors import (
    InvalidValue,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    TruncatedInput,
)
from flodl_proto.fsm import controller_core
from flodl_proto.fsm.events import RoundScattered, SendKind, SendTo
from flodl_proto.runner import controller as runner_controller
from flodl_proto.runner import relay_reader
from flodl_proto.runner.reports import RoundReport
from flodl_proto.spec import MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
#: magic, version, kind, rank, payload_len, tag
_HEAD = PACKED["MUX_HEADER"]


def _frame() -> RoundFrame:
    rng = np.random.default_rng(7)
    return RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload.from_array(
        rng.standard_normal(n).astype(np.float32)) for n in (3, 5)])


def _host_frame() -> bytes:
    return b"".join(bytes(memoryview(p))
                    for p in encode_frame_record(RecordKind.HOST_FRAME, _frame(), SALT))


def _records() -> dict[str, bytes]:
    """Whole records, sound and broken, of each kind the controller reads."""
    hf = _host_frame()
    hello = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0, 1]), 2), SALT)
    data = encode_mux_record_bytes(MuxRecord.data(3, b"abc"), SALT)
    bad_tag = bytearray(hf)
    bad_tag[20] ^= 1
    bad_body = bytearray(hf)
    bad_body[-30] ^= 1  # the record tag no longer matches
    unknown = bytearray(data)
    unknown[8] = 9  # kind 9: the tag fails first (the kind byte is covered)
    return {"host_frame": hf, "hello": hello, "data": data, "bad_tag": bytes(bad_tag),
            "bad_body": bytes(bad_body), "unknown_kind": bytes(unknown)}


def _outcome(fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        res = fn(*args, **kw)
    except ProtocolError as e:
        return (type(e), e.error_id, str(e))
    rec, hdr, n = res
    return (rec.kind, rec.rank, bytes(rec.payload), rec.control, hdr, n)


# -- header_or_none ------------------------------------------------------------------------------
def _head(magic: int, version: int, kind: int, rank: int, length: int) -> bytes:
    return _HEAD.pack(magic, version, kind, rank, length, bytes(range(8)))


@settings(max_examples=300, deadline=None)
@given(magic=st.sampled_from([MUX_RECORD_MAGIC, MUX_RECORD_MAGIC ^ 1, 0]),
       version=st.sampled_from([MUX_PROTOCOL_VERSION, MUX_PROTOCOL_VERSION + 1, 0]),
       kind=st.integers(0, 255), rank=st.integers(0, 2**32 - 1),
       length=st.integers(0, 2**32 - 1), ceiling=st.integers(0, 2**32))
def test_header_or_none_is_parse_mux_header_or_none_where_it_raises(
        magic: int, version: int, kind: int, rank: int, length: int, ceiling: int) -> None:
    raw = bytearray(_head(magic, version, kind, rank, length) + b"tail")
    try:
        want: MuxHeader | None = parse_mux_header(raw, ceiling=ceiling)
    except ProtocolError:
        want = None
    assert header_or_none(memoryview(raw), ceiling) == want


@pytest.mark.parametrize("length,ceiling,accepted", [(10, 10, True), (11, 10, False),
                                                     (0, 0, True)])
def test_header_or_none_takes_the_ceiling_itself(length: int, ceiling: int,
                                                 accepted: bool) -> None:
    raw = _head(MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION, 2, 0, length)
    got = header_or_none(memoryview(raw), ceiling)
    assert (got is not None) is accepted
    if accepted:
        assert got == MuxHeader(2, 0, length, bytes(range(8)))


def test_header_or_none_refuses_a_bad_magic_and_a_bad_version() -> None:
    good = _head(MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION, 1, 0, 4)
    assert header_or_none(memoryview(good), 100) == MuxHeader(1, 0, 4, bytes(range(8)))
    for raw in (_head(MUX_RECORD_MAGIC + 1, MUX_PROTOCOL_VERSION, 1, 0, 4),
                _head(MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION + 1, 1, 0, 4)):
        assert header_or_none(memoryview(raw), 100) is None
        with pytest.raises(ProtocolError):
            parse_mux_header(raw, ceiling=100)


# -- read_headed_record --------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(_records()))
@pytest.mark.parametrize("premac", [False, True])
@pytest.mark.parametrize("cut", [0, 1])
def test_read_headed_record_is_read_mux_record_or_eos(name: str, premac: bool,
                                                      cut: int) -> None:
    wire = _records()[name]
    mv = memoryview(wire)[:len(wire) - cut]  # cut: a truncated record
    hdr = parse_mux_header(mv)
    pm = None
    if premac:
        mac = new_mac(SALT)
        mac.update(mv[:17])
        mac.update(mv[25:])
        pm = Premac(len(mv) - 8, mac.digest())
    fast = _outcome(read_headed_record, mv, SALT, 2, pm, hdr)
    general = _outcome(read_mux_record_or_eos, mv, SALT, version=2, premac=pm, header=hdr)
    assert fast == general
    unparsed = _outcome(read_mux_record_or_eos, mv, SALT, version=2, premac=pm)
    assert fast == unparsed
    if name in ("host_frame", "hello", "data") and not cut:
        assert not isinstance(fast[0], type) or not issubclass(fast[0], ProtocolError)
    else:
        assert issubclass(fast[0], ProtocolError)


def test_read_headed_record_without_a_salt_skips_the_tag_as_the_general_form() -> None:
    wire = _records()["bad_tag"]
    hdr = parse_mux_header(wire)
    fast = _outcome(read_headed_record, memoryview(wire), None, 2, None, hdr)
    assert fast == _outcome(read_mux_record_or_eos, wire, None, version=2, header=hdr)
    assert fast[0] is RecordKind.HOST_FRAME


# -- MuxStream.feed with a parsed header ----------------------------------------------------------
def _events(wire: bytes, with_header: bool) -> list[Any]:
    s = MuxStream(SALT, expect_magic=None)
    hdr = parse_mux_header(wire) if with_header else None
    out: list[Any] = []
    for ev in s.feed(memoryview(wire), header=hdr):
        if isinstance(ev, StreamFailed):
            out.append(("failed", type(ev.error), str(ev.error)))
        else:
            assert isinstance(ev, RecordReceived)
            f = ev.frame
            out.append((ev.record.kind, bytes(ev.record.payload), ev.record.control, ev.nbytes,
                        ev.header, f if not isinstance(f, ProtocolError) else str(f)))
    return out


@pytest.mark.parametrize("name", sorted(_records()))
def test_a_stream_gives_the_same_events_with_and_without_the_header(name: str) -> None:
    wire = _records()[name]
    assert _events(wire, True) == _events(wire, False)


def test_a_stream_with_a_header_reads_through_the_fast_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = read_headed_record

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(stream_mod, "read_headed_record", counted)
    wire = _records()["host_frame"]
    [ev] = MuxStream(SALT, expect_magic=None).feed(wire, header=parse_mux_header(wire))
    assert isinstance(ev, RecordReceived) and ev.frame == _frame()
    assert calls == [1]


def test_a_header_that_is_no_mux_header_is_refused_as_before() -> None:
    wire = _records()["host_frame"]
    hdr = parse_mux_header(wire)
    fake = type("Fake", (), {"payload_len": hdr.payload_len, "kind": hdr.kind,
                             "rank": hdr.rank, "auth_tag": hdr.auth_tag})()
    stream = MuxStream(SALT, expect_magic=None)
    with pytest.raises(LocalProtocolError) as ei:
        stream.feed(wire, header=fake)
    assert ei.value.error_id == "mux.bad_type" and ei.value.fields["field"] == "header"
    [ev] = stream.feed(wire, header=hdr)
    assert isinstance(ev, RecordReceived) and ev.frame == _frame()


@pytest.mark.parametrize(("record", "hint", "field", "got", "expected"), [
    # a header of no payload_len raised AttributeError; a frame_premac reached the HostFrame's
    # frame as its error, the record itself delivered
    ("data", {"header": "h"}, "header", "str",
     "a MuxHeader (parse_mux_header's result) or None"),
    ("host_frame", {"frame_premac": 3}, "frame_premac", "int",
     "a Premac (a MAC over the bytes being decoded) or None"),
    ("data", {"premac": b"mac"}, "premac", "bytes",
     "a Premac (a MAC over the bytes being decoded) or None"),
])
def test_a_hint_of_another_type_is_the_callers_error_and_the_stream_goes_on(
        record: str, hint: dict[str, Any], field: str, got: str, expected: str) -> None:
    """A hint of the wrong type is local misuse, raised as such: it used to end the stream with
    a StreamFailed event, as if the peer's bytes were at fault, and the record was lost. The
    stream is left as it was: nothing counted, nothing buffered, the same record read next."""
    stream = MuxStream(SALT, expect_magic=None)
    wire = _records()[record]
    with pytest.raises(LocalProtocolError) as ei:
        stream.feed(wire[:10] if field == "header" else wire, **hint)
    assert isinstance(ei.value, InvalidValue)
    assert ei.value.error_id == "mux.bad_type"
    assert ei.value.fields == {"field": field, "expected": expected, "got": got}
    assert str(ei.value) == f"relay_mux: {field} must be {expected}, got {got}"
    assert (stream.done, stream.buffered, stream.bytes_in) == (False, 0, 0)
    [ev] = stream.feed(wire)
    assert isinstance(ev, RecordReceived) and ev.record == decode_mux_record(wire, SALT)[0]
    assert (stream.done, stream.buffered, stream.bytes_in) == (False, 0, len(wire))


# -- builders ------------------------------------------------------------------------------------
def _fields(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


def test_the_codec_builders_equal_the_constructors() -> None:
    assert _header(2, 7, 40, b"12345678") == MuxHeader(2, 7, 40, b"12345678")
    rec = MuxRecord.data(1, b"x")
    hdr = MuxHeader(0, 1, 1, bytes(8))
    ev = stream_mod._received(rec, None, 26, hdr)
    assert type(ev) is RecordReceived
    assert _fields(ev) == _fields(RecordReceived(rec, None, 26, hdr))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.nbytes = 1  # type: ignore[misc]


def test_the_round_report_builder_equals_the_constructor() -> None:
    """The runner's report of every round is built without the frozen dataclass's
    ``__init__``: the same type, fields and frozenness as ``RoundReport(...)``."""
    args = (9, "model", 2.5, 4169, 2, 0.125, 1.7e9)
    built = runner_controller._round_report(*args)
    assert type(built) is RoundReport
    assert _fields(built) == _fields(RoundReport(*args)) == args
    assert built == RoundReport(*args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.round = 1  # type: ignore[misc]


def test_the_core_builders_equal_the_constructors() -> None:
    bufs = (b"abc",)
    built = controller_core._broadcast_to(3, bufs, 3, 9)
    made = SendTo(3, bufs, SendKind.BROADCAST, 3, 9)
    assert type(built) is SendTo and _fields(built) == _fields(made)
    assert (controller_core._scattered(9, "model", 2.5, 100, 2, 3)
            == RoundScattered(9, "model", 2.5, 100, 2, 3))


# -- the relay reader's one-step read of a small record ------------------------------------------
def _signed(kind: int, payload: bytes, rank: int = 0) -> bytes:
    """A record of any ``kind`` and ``payload`` with a sound record tag."""
    head = _HEAD.pack(MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION, kind, rank, len(payload), bytes(8))
    mac = new_mac(SALT)
    mac.update(head[:17])
    mac.update(payload)
    return head[:17] + mac.digest()[:8] + payload


def _read_events(wire: bytes, cut: int | None, planned: bool,
                 monkeypatch: pytest.MonkeyPatch, starve: float = 5.0) -> list[Any]:
    """The events (or the error) of the controller's reader on ``wire`` sent whole, or its
    first ``cut`` bytes then the end of the stream; ``planned``: the general read only."""
    a, b = socket.socketpair()
    stop = threading.Event()
    worker = relay_reader._LazyWorker("test-mac")
    def send() -> None:
        a.sendall(wire if cut is None else wire[:cut])
        if cut is not None and starve >= 1.0:
            a.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)  # a large record fills the socket's buffer
    try:
        b.settimeout(0.02)
        sender.start()
        with monkeypatch.context() as m:
            if planned:
                m.setattr(relay_reader, "_read_small", relay_reader._read_planned)
            stream = MuxStream(SALT, expect_magic=None)
            try:
                events = relay_reader._read_record(
                    b, stream, relay_reader.BufferPool(), starve,
                    relay_reader._Keyed(SALT, worker), stop, SALT, 1 << 30)
            except ProtocolError as e:
                return [("raised", type(e), e.error_id, str(e))]
        out: list[Any] = []
        for ev in events:
            if isinstance(ev, StreamFailed):
                out.append(("failed", type(ev.error), str(ev.error)))
            elif isinstance(ev, RecordReceived):
                f = ev.frame
                out.append((ev.record.kind, bytes(ev.record.payload), ev.record.control,
                            ev.nbytes, ev.header,
                            f if not isinstance(f, ProtocolError) else str(f)))
            else:
                out.append(type(ev).__name__)
        return out
    finally:
        sender.join()
        worker.close()
        a.close()
        b.close()


def _small_records() -> dict[str, bytes]:
    recs = dict(_records())
    bad_inner = bytearray(_host_frame())
    bad_inner[-3] ^= 1  # the inner frame's tag: the record tag re-signed over it
    recs["bad_inner_tag"] = _signed(int(RecordKind.HOST_FRAME), bytes(bad_inner[25:]))
    for n in (0, 1, 8, 9, 30):  # HostFrames too short for a frame, or for a tag
        recs[f"host_frame_{n}"] = _signed(int(RecordKind.HOST_FRAME), bytes(range(n)))
    return recs


@pytest.mark.parametrize("name", sorted(_small_records()))
def test_the_one_step_read_gives_the_planned_reads_events(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wire = _small_records()[name]
    for cut in (None, 25, 26, len(wire) - 9, len(wire) - 1):
        if cut is not None and not 25 <= cut < len(wire):
            continue
        fast = _read_events(wire, cut, False, monkeypatch)
        assert fast == _read_events(wire, cut, True, monkeypatch), (name, cut)
    whole = _read_events(wire, None, False, monkeypatch)
    if name == "host_frame":
        assert whole[0][5] == _frame()
    if name == "bad_inner_tag":
        assert "HMAC verification failed" in whole[0][5]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=0, max_size=4),
       flip=st.one_of(st.none(), st.integers(0, 10_000)), cut=st.one_of(st.none(),
                                                                        st.integers(25, 10_000)))
def test_the_one_step_read_is_the_planned_read_on_any_record(
        sizes: list[int], flip: int | None, cut: int | None) -> None:
    frame = RoundFrame(RoundKind.CONTROL, 1.5, [TensorPayload.from_array(
        np.arange(n, dtype=np.float32)) for n in sizes])
    wire = bytearray(b"".join(bytes(memoryview(p)) for p in encode_frame_record(
        RecordKind.HOST_FRAME, frame, SALT)))
    if flip is not None:
        wire[flip % len(wire)] ^= 0x10
    if cut is not None:
        cut = 25 + cut % (len(wire) - 25)
    with pytest.MonkeyPatch.context() as mp:
        assert (_read_events(bytes(wire), cut, False, mp)
                == _read_events(bytes(wire), cut, True, mp))


def test_a_starved_one_step_read_names_the_records_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wire = _host_frame()
    fast = _read_events(wire, 40, False, monkeypatch, starve=0.1)
    assert fast == _read_events(wire, 40, True, monkeypatch, starve=0.1)
    assert issubclass(fast[0][1], TruncatedInput) and issubclass(fast[0][1], RemoteProtocolError)
    assert fast == [("raised", fast[0][1], "mux.starved",
                     "relay_mux: committed read starved mid-frame for 0.1s "
                     f"(40 of {len(wire)} bytes)")]


def test_a_small_record_is_read_in_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small record takes the one-step read (no plan built), a large one the planned read."""
    calls: list[str] = []
    for name in ("_read_small", "_read_planned"):
        real = getattr(relay_reader, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(relay_reader, name, spy)
    with monkeypatch.context() as m:
        m.setattr(relay_reader, "record_macs", None)  # a plan built here fails the read
        events = _read_events(_host_frame(), None, False, monkeypatch)
    assert events[0][5] == _frame() and calls == ["_read_small"]
    big = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.zeros(relay_reader.PARALLEL_MAC_MIN // 4, np.float32))])
    wire = b"".join(bytes(memoryview(p)) for p in encode_frame_record(
        RecordKind.HOST_FRAME, big, SALT))
    assert _read_events(wire, None, False, monkeypatch)[0][5] == big
    assert calls == ["_read_small", "_read_planned"]

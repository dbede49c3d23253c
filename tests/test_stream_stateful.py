"""Stateful property of the incremental stream decoders: a stream of valid records, fed in any
split, yields exactly those records, each one as soon as its last byte arrives, then a clean end
of stream. One machine per leg (RoundFrame, mux records with and without the channel magic and
with copies, length-framed blobs) and a split-anything property over whole sequences.

The RoundFrame and length-framed legs are pull decoders (``next_event``: a record, ``NeedData``
or ``END_OF_STREAM``); the mux legs are the one mux parser, :class:`MuxStream`, which pushes
events from ``feed``. :class:`Leg` drives both the same way."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from flodl_proto.codec import (
    END_OF_STREAM,
    DeclareDead,
    Hello,
    HelloAck,
    LenFramedDecoder,
    MuxRecord,
    MuxStream,
    NeedData,
    RankExit,
    RoundFrame,
    RoundFrameDecoder,
    TensorPayload,
    encode_channel_magic,
    encode_len_framed,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from flodl_proto.codec.stream import MagicReceived, RecordReceived, StreamEnded, StreamFailed
from flodl_proto.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    TruncatedInput,
)

pytestmark = pytest.mark.stateful

SALTS = (bytes(16), bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493"))
LEGS = ("round_frame", "mux", "mux_magic", "mux_copy", "len_framed")
#: the bytes of a record's start an input may end inside and still end cleanly, per leg
CLEAN_PREFIX = {"round_frame": 8, "mux": 25, "mux_magic": 25, "mux_copy": 25, "len_framed": 4}

weights = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False) | st.just(-0.0)
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def tensors(draw: st.DrawFn) -> TensorPayload:
    """A tensor as a reader accepts it: any dtype byte and any byte count (leniencies)."""
    dtype = draw(st.sampled_from([0, 1]) | st.integers(0, 255))
    shape = draw(shapes)
    n = 1
    for d in shape:
        n *= d
    es = {0: 4, 1: 2}.get(dtype, 1)
    data = draw(st.binary(min_size=n * es, max_size=n * es) | st.binary(max_size=12))
    return TensorPayload(dtype, shape, data)


frames = st.builds(RoundFrame, st.sampled_from([0, 1]), weights, st.lists(tensors(), max_size=3),
                   check_nbytes=st.just(False))
u32 = st.integers(0, 2**32 - 1)
controls = st.one_of(
    st.builds(Hello, st.text(max_size=8), st.lists(u32, max_size=4)),
    st.just(HelloAck()),
    st.builds(RankExit, u32),
    st.builds(DeclareDead, u32),
)


def record_wire(leg: str, salt: bytes, version: int, data: st.DataObject) -> tuple[Any, bytes]:
    """Draw one valid record of ``leg``: ``(the record as the decoder returns it, its bytes)``."""
    if leg == "round_frame":
        frame = data.draw(frames)
        return frame, encode_round_frame_bytes(frame, salt)
    if leg == "len_framed":
        blob = data.draw(st.binary(max_size=40))
        return blob, b"".join(bytes(b) for b in encode_len_framed(blob))
    choice = data.draw(st.sampled_from(["data", "control", "host_frame", "broadcast"]))
    if choice == "data":
        rec = MuxRecord.data(data.draw(u32), data.draw(st.binary(max_size=24)))
    elif choice == "control":
        rec = MuxRecord.control_msg(data.draw(controls), version)
    else:
        payload = encode_round_frame_bytes(data.draw(frames), salt)
        rec = MuxRecord.host_frame(payload) if choice == "host_frame" else \
            MuxRecord.broadcast(payload)
    return rec, encode_mux_record_bytes(rec, salt)


class Leg:
    """One decoder of ``leg`` behind one interface: ``feed`` a chunk and get the records it
    completed, ``end`` the input and get the rest, ``consumed`` bytes in whole records (and the
    channel magic)."""

    def __init__(self, leg: str, salt: bytes, version: int) -> None:
        self.leg = leg
        self.consumed = 0
        self.ended = False
        self.error: ProtocolError | None = None  # a pull decoder's, once it failed
        self.pull: Any = None
        self.push: MuxStream | None = None
        self.magic = leg == "mux_magic"
        if leg == "round_frame":
            self.pull = RoundFrameDecoder(salt)
        elif leg == "len_framed":
            self.pull = LenFramedDecoder()
        else:
            self.push = MuxStream(salt, version=version,
                                  expect_magic=0xF10D17E1 if self.magic else None,
                                  copy=leg == "mux_copy")
        #: with copies, each chunk is fed from a buffer that is overwritten after the feed:
        #: records must not depend on it
        self.clobber = leg == "mux_copy"

    def feed(self, chunk: bytes) -> list[Any]:
        """Feed ``chunk``; return the records it completed."""
        if self.push is None:
            self.pull.feed(chunk)
            return self._drain()
        if not self.clobber:
            return self._records(self.push.feed(chunk))
        scratch = bytearray(chunk)
        out = self._records(self.push.feed(scratch))
        scratch[:] = b"\xa5" * len(scratch)
        return out

    def end(self) -> list[Any]:
        """End of input: the records still to come, then a clean end of stream."""
        self.ended = True
        if self.push is None:
            self.pull.feed_eof()
            out = self._drain()
            assert self.pull.next_event() is END_OF_STREAM
            return out
        events = self.push.feed_eof()
        assert len(events) == 1 and isinstance(events[0], StreamEnded), events
        assert self.push.done
        return []

    def cut(self) -> ProtocolError | None:
        """End of input where the feeding stopped (the records fed whole are out already):
        None for a clean end of stream, else the error the stream failed with."""
        self.ended = True
        if self.push is None:
            self.pull.feed_eof()
            try:
                ev = self.pull.next_event()
            except ProtocolError as e:
                self.error = e
                return e
            assert ev is END_OF_STREAM, ev
            return None
        events = self.push.feed_eof()
        assert len(events) == 1 and self.push.done, events
        if isinstance(events[0], StreamFailed):
            return events[0].error
        assert isinstance(events[0], StreamEnded), events
        return None

    def after_the_end(self) -> None:
        """Nothing happens after the end; a pull decoder refuses more bytes, and one that
        failed raises its error again."""
        if self.push is None and self.error is not None:
            with pytest.raises(type(self.error)) as e:
                self.pull.next_event()
            assert str(e.value) == str(self.error)
        elif self.push is None:
            assert self.pull.next_event() is END_OF_STREAM
            with pytest.raises(LocalProtocolError):
                self.pull.feed(b"\0")
        else:
            assert self.push.feed(b"\0") == [] and self.push.feed_eof() == []

    def _drain(self) -> list[Any]:
        got = []
        while True:
            ev = self.pull.next_event()
            if isinstance(ev, NeedData):
                assert not self.ended
                assert ev.nbytes >= 1
                break
            if ev is END_OF_STREAM:
                assert self.ended
                break
            got.append(ev)
        self.consumed = self.pull.consumed
        return got

    def _records(self, events: list[Any]) -> list[Any]:
        got = []
        for ev in events:
            if isinstance(ev, MagicReceived):
                assert self.magic and self.consumed == 0
            else:
                assert isinstance(ev, RecordReceived), ev
                got.append(ev.record)
            self.consumed += ev.nbytes
        return got


def same(leg: str, got: Any, want: Any) -> bool:
    """Record equality for ``leg`` (blobs compare by bytes, control messages too)."""
    if leg == "len_framed":
        return bytes(got) == want
    if leg.startswith("mux"):
        return bool(got == want and got.control == want.control)
    return bool(got == want)


class StreamSplitStateful(RuleBasedStateMachine):
    """Records are appended to a stream and the stream is fed in arbitrary chunks."""

    @initialize(leg=st.sampled_from(LEGS), salt=st.sampled_from(SALTS),
                version=st.sampled_from([2, 3]), cut=st.booleans())
    def setup(self, leg: str, salt: bytes, version: int, cut: bool) -> None:
        """A decoder of ``leg``; ``cut``: the example's input ends where the feeding stopped
        (:meth:`end_where_fed`), else after every record (:meth:`finish`)."""
        self.leg, self.salt, self.version, self.cut = leg, salt, version, cut
        self.dec = Leg(leg, salt, version)
        self.wire = bytearray(encode_channel_magic("data") if leg == "mux_magic" else b"")
        self.ends: list[int] = []  # end offset of each record in the stream
        self.expected: list[Any] = []
        self.got: list[Any] = []
        self.fed = 0
        self.eof = False

    @precondition(lambda self: not self.eof)
    @rule(data=st.data())
    def append_record(self, data: st.DataObject) -> None:
        rec, wire = record_wire(self.leg, self.salt, self.version, data)
        self.wire += wire
        self.ends.append(len(self.wire))
        self.expected.append(rec)

    @precondition(lambda self: not self.eof)
    @rule(n=st.integers(0, 80))
    def feed(self, n: int) -> None:
        chunk = bytes(self.wire[self.fed:self.fed + n])
        self.got += self.dec.feed(chunk)
        self.fed += len(chunk)

    @precondition(lambda self: not self.eof and self.cut and bool(self.ends)
                  and self.ends[-1] > self.fed)
    @rule(k=st.integers(0, 30))
    def end_inside_the_next_record(self, k: int) -> None:
        """Feed up to ``k`` bytes into the next record (the one after the record being fed, or
        the one that starts where the feeding stopped), then end there (:meth:`end_where_fed`):
        ends in and just past a clean-end prefix, where chunks of random sizes rarely stop."""
        start = min(b for b in [4 if self.leg == "mux_magic" else 0, *self.ends] if b >= self.fed)
        self.feed(min(start + k, len(self.wire)) - self.fed)
        self.end_where_fed()

    @precondition(lambda self: not self.eof and not self.cut)
    @rule()
    def finish(self) -> None:
        self.got += self.dec.feed(bytes(self.wire[self.fed:]))
        self.fed = len(self.wire)
        self.eof = True
        self.got += self.dec.end()
        assert self.dec.consumed == len(self.wire)

    @precondition(lambda self: not self.eof and self.cut)
    @rule()
    def end_where_fed(self) -> None:
        """The peer closes after the bytes fed so far, whole records or not: a clean end exactly
        at a record boundary or inside the next record's clean-end prefix (a RoundFrame's first
        8 bytes, a mux record's 25-byte header, a 4-byte length prefix), a remote TruncatedInput
        anywhere else, the channel magic included (a stream that ends before it was whole)."""
        self.eof = True
        error = self.dec.cut()
        magic = 4 if self.leg == "mux_magic" else 0
        start = max([b for b in [magic, *self.ends] if b <= self.fed], default=0)
        clean = self.fed >= magic and self.fed - start < CLEAN_PREFIX[self.leg]
        where = (f"{self.leg}: the input ended {self.fed - start} bytes into the record at "
                 f"{start}: {error!r}")
        if clean:
            assert error is None, where
        else:
            assert isinstance(error, TruncatedInput) and isinstance(error, RemoteProtocolError), \
                where
        event("stream: ended clean inside a header" if clean and self.fed > start else
              "stream: ended clean at a boundary" if clean else "stream: ended inside a record")

    @precondition(lambda self: self.eof)
    @rule()
    def after_the_end(self) -> None:
        self.dec.after_the_end()

    @invariant()
    def records_come_out_in_order_as_soon_as_complete(self) -> None:
        if not hasattr(self, "dec"):
            return
        complete = sum(1 for end in self.ends if end <= self.fed)
        assert len(self.got) == complete, (len(self.got), complete)
        for got, want in zip(self.got, self.expected, strict=False):
            assert same(self.leg, got, want)


StreamSplitStateful.TestCase.settings = settings(stateful_step_count=30)
TestStreamSplitStateful = StreamSplitStateful.TestCase


@given(leg=st.sampled_from(LEGS), salt=st.sampled_from(SALTS), version=st.sampled_from([2, 3]),
       data=st.data())
def test_stream_split_stateful_same_records_whatever_the_split(
        leg: str, salt: bytes, version: int, data: st.DataObject) -> None:
    """The whole sequence fed at once and fed in drawn splits give the same records."""
    records, wire = [], bytearray(encode_channel_magic("data") if leg == "mux_magic" else b"")
    for _ in range(data.draw(st.integers(0, 5))):
        rec, w = record_wire(leg, salt, version, data)
        records.append(rec)
        wire += w
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    outs = []
    for splits in ([], cuts):
        dec = Leg(leg, salt, version)
        got: list[Any] = []
        prev = 0
        for cut in [*splits, len(wire)]:
            got += dec.feed(bytes(wire[prev:cut]))
            prev = cut
        got += dec.end()
        assert dec.consumed == len(wire)
        outs.append(got)
    for got in outs:
        assert len(got) == len(records)
        assert all(same(leg, g, r) for g, r in zip(got, records, strict=True))


def test_stream_stateful_trailing_partial_header_is_a_clean_end() -> None:
    """A stream cut inside the clean-end prefix after whole records ends cleanly."""
    salt = SALTS[1]
    frame = RoundFrame(0, 1.0, [TensorPayload(0, (1,), struct.pack("<f", 2.0))])
    wire = encode_round_frame_bytes(frame, salt)
    dec = RoundFrameDecoder(salt)
    dec.feed(wire + wire[:5])
    assert dec.next_event() == frame
    assert isinstance(dec.next_event(), NeedData)
    dec.feed_eof()
    assert dec.next_event() is END_OF_STREAM


@given(leg=st.sampled_from(LEGS), salt=st.sampled_from(SALTS), version=st.sampled_from([2, 3]),
       data=st.data())
def test_stream_stateful_an_end_inside_a_record_fails_past_its_clean_prefix(
        leg: str, salt: bytes, version: int, data: st.DataObject) -> None:
    """A stream that ends anywhere, fed in drawn splits, ends cleanly exactly at a record
    boundary or inside the next record's clean-end prefix, and fails with a remote
    TruncatedInput anywhere else; the end is drawn next to a prefix's last byte, where an
    off-by-one shows (a whole 25-byte mux header, or 8-byte frame header, taken for a clean end),
    or anywhere."""
    magic = 4 if leg == "mux_magic" else 0
    wire = bytearray(encode_channel_magic("data") if magic else b"")
    bounds = [magic]  # where each record starts, then where the last one ends
    for _ in range(data.draw(st.integers(1, 3))):
        wire += record_wire(leg, salt, version, data)[1]
        bounds.append(len(wire))
    prefix_end = data.draw(st.sampled_from(bounds[:-1])) + CLEAN_PREFIX[leg]
    cut = min(len(wire), data.draw(st.sampled_from([prefix_end - 1, prefix_end, prefix_end + 1])
                                   | st.integers(0, len(wire))))
    dec = Leg(leg, salt, version)
    prev = 0
    for at in [*sorted(data.draw(st.lists(st.integers(0, cut), max_size=4))), cut]:
        dec.feed(bytes(wire[prev:at]))
        prev = at
    error = dec.cut()
    start = max([b for b in bounds if b <= cut], default=0)
    where = f"{leg}: the input ended {cut - start} bytes into the record at {start}: {error!r}"
    if cut >= magic and cut - start < CLEAN_PREFIX[leg]:
        assert error is None, where
    else:
        assert isinstance(error, TruncatedInput) and isinstance(error, RemoteProtocolError), where

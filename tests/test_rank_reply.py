"""RankClient's reply read, against a scripted peer: a reply that arrived whole is read with one
``recv`` into a buffer of its expected size; a reply of another size, one that arrives in
pieces, bytes sent after a reply, and a stream that ends or fails anywhere give exactly what
the prefix-then-body read gives."""

from __future__ import annotations

import errno
import itertools
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flodl_proto.codec import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_round_frame_bytes,
)
from flodl_proto.codec.auth import PARALLEL_MAC_MIN
from flodl_proto.errors import LimitExceeded, TruncatedInput
from flodl_proto.runner import _prefixed as prefixed_mod
from flodl_proto.runner.rank import RankClient
from flodl_proto.spec import DEFAULT_FRAME_CEILING

from .cluster_util import SALT, frame

pytestmark = pytest.mark.timeout(60)

Chunk = bytes | BaseException


class Peer:
    """The relay's side of the loopback, played from a script, as the client's socket.

    ``sendmsg`` takes every write whole (and keeps it); ``recv_into`` hands out the scripted
    chunks as a stream would: a chunk is what has arrived when the client reads, one call takes
    at most one chunk and at most the bytes it asks for (the rest stays for the next call);
    ``b""`` is the end of the stream; an exception is raised where it stands. ``asked`` keeps
    the byte count of every ``recv_into`` call.
    """

    def __init__(self, chunks: Sequence[Chunk] = ()) -> None:
        self.chunks: list[Chunk] = list(chunks)
        self.asked: list[int] = []
        self.sent: list[bytes] = []
        self.closed = False

    def sendmsg(self, buffers: Sequence[Any], ancdata: Any = (), flags: int = 0) -> int:
        data = b"".join(bytes(b) for b in buffers)
        self.sent.append(data)
        return len(data)

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        """A socket option's value (the write-stall deadline of a frame written in several
        steps saves SO_SNDTIMEO, then sets it): zeros, none set."""
        return bytes(size)

    def setsockopt(self, level: int, option: int, value: bytes) -> None:
        pass

    def recv_into(self, view: memoryview, n: int) -> int:
        self.asked.append(n)
        assert self.chunks, "the client read past the script (a real socket would block)"
        head = self.chunks[0]
        if isinstance(head, BaseException):
            self.chunks.pop(0)
            raise head
        take, rest = head[:n], head[n:]
        if rest:
            self.chunks[0] = rest
        else:
            self.chunks.pop(0)
        view[:len(take)] = take
        return len(take)

    def close(self) -> None:
        self.closed = True


def _client(peer: Peer, version: int = 2, bf16: bool = False) -> RankClient:
    return RankClient(peer, 0, 1, SALT, version=version,  # type: ignore[arg-type]
                      wire_dtype=Dtype.BF16 if bf16 else Dtype.F32,
                      ceiling=DEFAULT_FRAME_CEILING)


def _record(f: RoundFrame) -> bytes:
    body = encode_round_frame_bytes(f, SALT)
    return len(body).to_bytes(4, "little") + body


def _values(n: int, k: float) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 13) * np.float32(0.25) + np.float32(k)


def _no_stepped_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the reply reader's calls of the body readers (a reply read whole makes none)."""
    calls: list[int] = []
    for name, size_arg in (("read_record_into", 2), ("read_frame_into", 1)):
        real = getattr(prefixed_mod, name)

        def spy(*args: Any, _real: Any = real, _at: int = size_arg, **kwargs: Any) -> Any:
            arg = args[_at]
            calls.append(arg if isinstance(arg, int) else len(arg))
            return _real(*args, **kwargs)

        monkeypatch.setattr(prefixed_mod, name, spy)
    return calls


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16"])
def test_a_whole_reply_is_read_with_one_recv(monkeypatch: pytest.MonkeyPatch,
                                             bf16: bool) -> None:
    dtype = ml_dtypes.bfloat16 if bf16 else np.float32
    arrays = [_values(256, 1.0).astype(dtype), _values(7, 2.0).reshape(7, 1).astype(dtype)]
    wire = int(Dtype.BF16 if bf16 else Dtype.F32)
    replies = [frame(_values(256, 10.0 + k),
                     TensorPayload.from_array(_values(7, 20.0 + k).reshape(7, 1), wire),
                     weight=2.0, dtype=wire) for k in range(3)]
    records = [_record(r) for r in replies]
    peer = Peer(records)
    steps = _no_stepped_read(monkeypatch)
    c = _client(peer, bf16=bf16)
    for k in range(3):
        got = c.all_reduce_scaled(arrays, 0.5)
        assert got.adopted and bytes(got.raw) == records[k][4:]
        assert np.array_equal(arrays[0].astype(np.float32), _values(256, 10.0 + k)
                              .astype(dtype).astype(np.float32))
    size = len(peer.sent[0])  # the reply has the request's layout: its size was expected
    assert peer.asked == [size] * 3 and len(records[0]) == size
    assert steps == []
    assert c.bytes_received == sum(len(r) for r in records)
    c.close()


def _cuts(record: bytes) -> list[list[int]]:
    n = len(record)
    singles = [[k] for k in (1, 2, 3, 4, 5, 12, 20, n - 9, n - 8, n - 1)]
    return [*singles, [1, 3], [2, 4, 6], [4, n - 8], [3, 30, n - 2]]


def test_a_reply_in_pieces_is_the_same_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    # pieces split the prefix, the header, the payloads and the tag, at every kind of boundary
    reply = frame(_values(64, 3.0), _values(5, 4.0), weight=1.5)
    record = _record(reply)
    for cuts in _cuts(record):
        bounds = [0, *cuts, len(record)]
        peer = Peer([record[a:b] for a, b in itertools.pairwise(bounds)])
        steps = _no_stepped_read(monkeypatch)
        c = _client(peer)
        got = c.all_reduce(frame(_values(64, 0.0), _values(5, 0.0)))
        assert bytes(c.last_reply.raw) == record[4:]  # type: ignore[union-attr]
        assert [p.array().tolist() for p in got.tensors] == \
            [p.array().tolist() for p in reply.tensors]
        assert c.bytes_received == len(record) and peer.chunks == []
        assert peer.asked[0] == len(record)  # the first read asks for the whole reply
        # the first read goes on until the prefix is in: the reply is then whole, or the body
        # is read on from what came with the prefix
        assert (steps == []) == all(k < 4 for k in cuts)
        c.close()


@pytest.mark.parametrize("reply_floats", [1, 63, 65, 4096, (PARALLEL_MAC_MIN // 4) + 16],
                         ids=["much-shorter", "shorter", "longer", "much-longer", "stepped"])
def test_a_reply_of_another_size_than_expected(reply_floats: int) -> None:
    reply = frame(_values(reply_floats, 5.0), weight=3.0)
    record = _record(reply)
    peer = Peer([record])
    c = _client(peer)
    got = c.all_reduce(frame(_values(64, 0.0)))
    assert bytes(c.last_reply.raw) == record[4:]  # type: ignore[union-attr]
    assert got.tensors[0].array().tolist() == reply.tensors[0].array().tolist()
    assert c.bytes_received == len(record)
    sent = len(peer.sent[0])
    assert peer.asked[0] == sent  # one read of the expected size first
    if len(record) > sent:  # then the rest, read on from what came with the prefix
        assert len(peer.asked) > 1 and peer.chunks == []
    else:  # a shorter reply was in whole
        assert peer.asked == [sent]
    c.close()


def test_the_next_reply_is_expected_as_long_as_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # an idle rank at version 3 sends elided payloads: its frame is shorter than the consensus;
    # from the second round on the consensus's size is expected and read in one call, until the
    # frame's size changes
    replies = [frame(_values(300, k)) for k in range(3)] + [frame(_values(2, 9.0))]
    peer = Peer([_record(r) for r in replies])
    c = _client(peer, version=3)
    arrays = [np.zeros(300, np.float32)]
    c.all_reduce_scaled(arrays, 0.0, adopt=False)
    first_sent = len(peer.sent[0])
    assert peer.asked[0] == first_sent < len(_record(replies[0]))
    del peer.asked[:]
    c.all_reduce_scaled(arrays, 0.0, adopt=False)
    c.all_reduce_scaled(arrays, 0.0, adopt=False)
    assert peer.asked == [len(_record(replies[0]))] * 2
    del peer.asked[:]
    c.all_reduce_scaled([np.zeros(2, np.float32)], 1.0, adopt=False)  # another layout
    assert peer.asked == [len(peer.sent[-1])] == [len(_record(replies[3]))]
    assert c.rounds == 4
    c.close()


def test_replies_sent_together_are_read_one_a_round() -> None:
    # a peer that answers round 1 with six replies at once: each later round gets the next one,
    # read from what already arrived, as a read of the prefix and then the body would; the
    # client reads nothing more from the socket until they are used up
    tiny = [frame([float(k)], weight=float(k)) for k in range(1, 7)]
    burst = b"".join(_record(f) for f in tiny)
    after = frame(_values(32, 7.0))
    peer = Peer([burst, _record(after)])
    c = _client(peer)
    got = c.all_reduce(frame(_values(64, 0.0)))  # expects a 64-float reply, gets six tiny ones
    assert got.weight == 1.0
    asked_round1 = list(peer.asked)
    # another layout (32 floats): the expected size now takes in several tiny replies at once
    for k in range(2, 7):
        got = c.all_reduce(frame(_values(32, 0.0)))
        assert got.weight == float(k) and got.tensors[0].array().tolist() == [float(k)]
    assert peer.asked == asked_round1  # all five came out of the first read
    assert c.all_reduce(frame(_values(32, 0.0))).tensors[0].array().tolist() == \
        after.tensors[0].array().tolist()
    assert c.bytes_received == len(burst) + len(_record(after))
    assert peer.chunks == []
    c.close()


def test_kept_bytes_longer_than_the_expected_reply_are_all_used() -> None:
    # round 1's read takes in a tiny reply and the start of a longer one; round 2 expects a
    # reply as long as the tiny one (the same frame again): the longer reply starts with the
    # bytes kept, more of them than the expected size holds, and goes on from the socket
    tiny = frame([1.0], weight=1.0)
    big = frame(_values(64, 5.0), weight=2.0)
    peer = Peer([_record(tiny) + _record(big)])
    c = _client(peer)
    request = frame(_values(64, 0.0))
    assert c.all_reduce(request).weight == 1.0
    kept = peer.asked[0] - len(_record(tiny))
    assert kept > len(_record(tiny))  # more than the expected reply's size
    got = c.all_reduce(request)
    assert got.weight == 2.0
    assert got.tensors[0].array().tolist() == big.tensors[0].array().tolist()
    assert peer.chunks == []
    assert c.bytes_received == len(_record(tiny)) + len(_record(big))
    c.close()


def test_a_large_reply_begun_by_bytes_already_read() -> None:
    # round 1's read took in the start of a large second reply; round 2 expects a large reply
    # (its frame is 1 MiB): the read goes on from those bytes
    first = frame([1.0], weight=1.0)
    big = frame(_values((PARALLEL_MAC_MIN // 4) + 8, 2.0), weight=2.0)
    rec_big = _record(big)
    request = frame(_values(64, 0.0))
    expected = 4 + len(encode_round_frame_bytes(request, SALT))
    head = expected - len(_record(first))  # what of the second reply fits the first read
    peer = Peer([_record(first) + rec_big[:head], rec_big[head:]])
    c = _client(peer)
    assert c.all_reduce(request).weight == 1.0
    got = c.all_reduce(frame(_values((PARALLEL_MAC_MIN // 4) + 8, 0.0)))
    assert bytes(c.last_reply.raw) == rec_big[4:]  # type: ignore[union-attr]
    assert got.tensors[0].array().tolist() == big.tensors[0].array().tolist()
    assert c.bytes_received == len(_record(first)) + len(rec_big)
    c.close()


def test_a_large_reply_reads_its_prefix_first() -> None:
    big = frame(_values((PARALLEL_MAC_MIN // 4) + 8, 2.0))
    record = _record(big)
    peer = Peer([record])
    c = _client(peer)
    got = c.all_reduce(frame(_values((PARALLEL_MAC_MIN // 4) + 8, 0.0)))
    # the request, as long as the reply, was written in two steps (hash_step: 1 MiB, then the
    # rest and the tag)
    assert peer.asked[0] == 4 and len(record) == len(b"".join(peer.sent))
    assert [len(w) for w in peer.sent] == [(1 << 20) + 4 + 31, len(record) - (1 << 20) - 35]
    assert bytes(c.last_reply.raw) == record[4:]  # type: ignore[union-attr]
    assert got.tensors[0].array().tolist() == big.tensors[0].array().tolist()
    c.close()


_REPLY = frame(_values(64, 1.0))
_REC = _record(_REPLY)


@pytest.mark.parametrize(("chunks", "error", "message"), [
    ([b""], TruncatedInput, r"controller closed connection before sending averaged frame "
                            r"back \(round 1\)"),
    ([_REC[:2], b""], TruncatedInput, "controller closed connection before sending averaged"),
    ([ConnectionResetError()], TruncatedInput, "closed connection before sending averaged"),
    ([_REC[:100], b""], TruncatedInput, "stream ended inside a len-framed RoundFrame"),
    ([_REC[:3], _REC[3:100], b""], TruncatedInput, "stream ended inside a len-framed"),
    ([b"\0\0\0\0"], TruncatedInput, "stream ended inside a len-framed RoundFrame"),
    ([(DEFAULT_FRAME_CEILING + 1).to_bytes(4, "little") + _REC[4:]], LimitExceeded,
     "exceeds the frame ceiling"),
    ([TimeoutError()], TimeoutError, r"^cpu_reduce: no averaged frame within \d+s \(round 1\)$"),
    ([_REC[:2], TimeoutError()], TimeoutError, "no averaged frame within"),
    ([_REC[:40], TimeoutError()], TimeoutError,
     r"^cpu_reduce: averaged frame stalled after prefix \(round 1\)$"),
    ([OSError(errno.EBADF, "Bad file descriptor")], ConnectionError,
     r"^cpu_reduce: lost the relay while waiting for round 1's consensus \(bad file "
     r"descriptor\)$"),
    ([_REC[:40], OSError(errno.EBADF, "Bad file descriptor")], ConnectionError,
     r"^cpu_reduce: lost the relay while reading round 1's consensus \(bad file "
     r"descriptor\)$"),
], ids=["eof", "eof-in-prefix", "reset", "eof-in-body", "eof-in-body-after-pieces",
        "zero-prefix", "prefix-over-ceiling", "timeout", "timeout-in-prefix",
        "timeout-in-body", "error", "error-in-body"])
def test_a_reply_that_ends_or_fails_is_reported_as_before(
        chunks: list[Chunk], error: type[BaseException], message: str) -> None:
    peer = Peer(chunks)
    c = _client(peer)
    with pytest.raises(error, match=message):
        c.all_reduce(frame(_values(64, 0.0)))
    assert c.closed and peer.closed


def test_bytes_received_count_what_each_reply_used() -> None:
    # the prefix-then-body read counted a reply's bytes once they were read, a short body's too
    peer = Peer([_REC[:60], b""])
    c = _client(peer)
    with pytest.raises(TruncatedInput):
        c.all_reduce(frame(_values(64, 0.0)))
    assert c.bytes_received == 60
    peer = Peer([_REC[:3], b""])
    c = _client(peer)
    with pytest.raises(TruncatedInput):
        c.all_reduce(frame(_values(64, 0.0)))
    assert c.bytes_received == 0


def test_a_reply_with_a_bad_tag_read_in_one_call_is_refused() -> None:
    bad = bytearray(_REC)
    bad[-1] ^= 1
    peer = Peer([bytes(bad)])
    c = _client(peer)
    with pytest.raises(Exception, match="HMAC verification failed"):
        c.all_reduce(frame(_values(64, 0.0)))
    assert peer.asked == [len(_REC)]


def test_an_elided_reply_and_a_control_reply_in_one_call() -> None:
    elided = RoundFrame(RoundKind.CONTROL, 0.0, [TensorPayload.elide(0, (64,))])
    peer = Peer([_record(elided)])
    c = _client(peer, version=3)
    got = c.all_reduce(frame(_values(64, 0.0), kind=RoundKind.CONTROL))
    assert got.tensors[0].elided and c.rounds == 1
    c.close()


# -- any sequence of reply lengths, any split of the stream: as the prefix-then-body read ------

_BIG = (PARALLEL_MAC_MIN // 4) + 8  # floats: a reply above the one-read bound
_REQUESTS = {n: frame(_values(n, 0.0)) for n in (1, 3, 64, 300, _BIG)}
_REPLIES = [_record(f) for f in (
    frame([7.0], weight=1.0), frame(_values(3, 1.0), weight=2.0),
    frame(_values(64, 2.0), weight=3.0), frame(_values(65, 3.0), weight=4.0),
    frame(_values(300, 4.0), weight=5.0),
    RoundFrame(RoundKind.CONTROL, 6.0, [TensorPayload.elide(0, (64,))]),
    RoundFrame(RoundKind.MODEL, 7.0, []),
    frame(_values(_BIG, 5.0), weight=8.0))]
_SMALL_REPLIES = len(_REPLIES) - 1


class _EofPeer(Peer):
    """A :class:`Peer` whose stream ends (every later read gets 0 bytes) after the script."""

    def recv_into(self, view: memoryview, n: int) -> int:
        if not self.chunks:
            self.asked.append(n)
            return 0
        return super().recv_into(view, n)


@st.composite
def _reply_streams(draw: st.DrawFn) -> tuple[list[int], list[int], list[bytes], bytes, list[int]]:
    rounds = draw(st.integers(1, 7))
    big = draw(st.booleans())  # the large reply and request, in a few examples
    top = len(_REPLIES) - 1 if big else _SMALL_REPLIES - 1
    requests = draw(st.lists(st.sampled_from(sorted(_REQUESTS) if big else [1, 3, 64, 300]),
                             min_size=rounds, max_size=rounds))
    replies = draw(st.lists(st.integers(0, top), min_size=rounds, max_size=rounds))
    records = [_REPLIES[i] for i in replies]
    ending = draw(st.sampled_from(["none", "cut", "zero", "over"]))
    tail = b""
    if ending == "cut":
        rec = _REPLIES[draw(st.integers(0, _SMALL_REPLIES - 1))]
        tail = rec[:draw(st.integers(0, len(rec) - 1))]
    elif ending == "zero":
        tail = b"\0\0\0\0"
    elif ending == "over":
        tail = (DEFAULT_FRAME_CEILING + 1).to_bytes(4, "little") + _REPLIES[2][4:]
    stream = b"".join(records) + tail
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=8))))
    return requests, replies, records, tail, cuts


@given(_reply_streams())
def test_any_reply_lengths_and_splits_read_as_prefix_then_body(
        case: tuple[list[int], list[int], list[bytes], bytes, list[int]]) -> None:
    # the reference: each reply is the next prefix and the body it declares, whatever the
    # lengths of the frames sent, of the replies before it, and however the stream arrived
    requests, replies, records, tail, cuts = case
    stream = b"".join(records) + tail
    bounds = [0, *[k for k in cuts if 0 < k < len(stream)], len(stream)]
    chunks: list[Chunk] = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    ended = tail != b""
    peer = _EofPeer(chunks) if ended else Peer(chunks)
    c = _client(peer, version=3)
    for n, i, rec in zip(requests, replies, records, strict=True):
        got = c.all_reduce(_REQUESTS[n])
        assert bytes(c.last_reply.raw) == rec[4:]  # type: ignore[union-attr]
        assert got.weight == float(i + 1)
    assert c.bytes_received == sum(len(r) for r in records)
    if not ended:
        assert peer.chunks == [] and not c.closed
        return
    if len(tail) < 4:
        error, message = TruncatedInput, "controller closed connection before sending averaged"
    elif tail[:4] == b"\0\0\0\0" or int.from_bytes(tail[:4], "little") <= DEFAULT_FRAME_CEILING:
        error, message = TruncatedInput, "stream ended inside a len-framed RoundFrame"
    else:
        error, message = LimitExceeded, "exceeds the frame ceiling"
    with pytest.raises(error, match=message):
        c.all_reduce(_REQUESTS[requests[-1]])
    assert c.closed
    body = len(tail) if len(tail) >= 4 and error is TruncatedInput else 0
    assert c.bytes_received == sum(len(r) for r in records) + body

"""The relay's reader of a rank's loopback blobs (``runner.relay_ranks.RankBlobReader``): exact
bytes and MACs on every path (one read at the expected length, a blob of another length, bytes
of the next blob read early, splits at every boundary), one ``recv`` per blob of a steady
round, buffer reuse that never touches the frame the fold holds, and end of stream, starvation,
stop and the ceiling as before."""

from __future__ import annotations

import itertools
import socket
import struct
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.codec.auth import PARALLEL_MAC_MIN
from flodl_proto.codec.plans import frame_premac
from flodl_proto.errors import LimitExceeded, ProtocolError
from flodl_proto.runner import _prefixed as prefixed
from flodl_proto.runner._netio import Stopped
from flodl_proto.runner.relay_ranks import FRAME_OFFSET, RankBlobReader

SALT = bytes(range(16))


def _frame(n: int, seed: int) -> bytes:
    a = np.random.default_rng(seed).standard_normal(n).astype("<f4")
    return encode_round_frame_bytes(
        RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(0, (n,), a.tobytes())]), SALT)


def _blob(frame: bytes) -> bytes:
    return struct.pack("<I", len(frame)) + frame


class _Sock:
    """A socket that delivers ``chunks`` (one ``recv`` gets at most the rest of a chunk), then
    end of stream, or raises ``then`` (an exception instance) once the chunks are used up."""

    def __init__(self, chunks: list[bytes], then: BaseException | None = None,
                 stop_after: tuple[threading.Event, int] | None = None) -> None:
        self.chunks = [c for c in chunks if c]
        self.then = then
        self.stop_after = stop_after  # set this event after that many raises of ``then``
        self.calls = 0
        self.asked: list[int] = []

    def recv_into(self, view: memoryview, nbytes: int) -> int:
        self.calls += 1
        self.asked.append(nbytes)
        if not self.chunks:
            if self.then is not None:
                if self.stop_after is not None:
                    ev, left = self.stop_after
                    if left <= 0:
                        ev.set()
                    self.stop_after = (ev, left - 1)
                raise self.then
            return 0
        c = self.chunks[0]
        k = min(nbytes, len(c))
        view[:k] = c[:k]
        if k < len(c):
            self.chunks[0] = c[k:]
        else:
            self.chunks.pop(0)
        return k


class _Fold:
    """Holds the last frame while ``holding`` is set (as the fold holds a rank's deposit)."""

    def __init__(self) -> None:
        self.holding = False


def _reader(fold: _Fold | None = None, ceiling: int = 1 << 30,
            stop: threading.Event | None = None) -> RankBlobReader:
    f = fold if fold is not None else _Fold()
    return RankBlobReader(SALT, ceiling, stop if stop is not None else threading.Event(),
                          lambda: f.holding)


def _read_all(r: RankBlobReader, sock: Any) -> list[tuple[bytes, int, Any]]:
    out = []
    while True:
        res = r.read(sock, None)
        if res is None:
            return out
        frame, got, premac = res
        out.append((bytes(frame), got, premac))
        if got < len(frame):
            return out


def _check(results: list[tuple[bytes, int, Any]], frames: list[bytes]) -> None:
    assert [f for f, _, _ in results] == frames
    for (_, got, premac), want in zip(results, frames, strict=True):
        assert got == len(want)
        assert premac == frame_premac(want, SALT)


def test_a_steady_round_reads_each_blob_with_one_recv(monkeypatch: pytest.MonkeyPatch) -> None:
    frames = [_frame(64, i) for i in range(4)]  # one length: each blob arrives whole
    sock = _Sock([_blob(f) for f in frames])
    r = _reader()
    used: list[str] = []
    for name in ("read_frame_into", "read_record_into"):
        real = getattr(prefixed, name)
        monkeypatch.setattr(prefixed, name,
                            lambda *a, _n=name, _f=real, **k: used.append(_n) or _f(*a, **k))
    out = []
    for i in range(4):
        before = sock.calls
        res = r.read(sock, None)  # type: ignore[arg-type]
        assert res is not None
        out.append((bytes(res[0]), res[1], res[2]))
        # the first blob: its prefix, then its frame; then the prefix and frame in one call
        assert sock.calls - before == (2 if i == 0 else 1)
    _check(out, frames)
    # the first frame read after its prefix; the others hashed in one update where they lie
    assert used == ["read_frame_into"]
    assert sock.asked[2] == 4 + len(frames[0])  # asked for the prefix and the expected frame
    assert r.received == sum(4 + len(f) for f in frames)
    assert r.read(sock, None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("sizes", [[64, 16, 64, 64], [16, 64, 16], [64, 64, 3, 64], [8, 0, 8]])
def test_blobs_of_another_length_and_a_next_blob_read_early(sizes: list[int]) -> None:
    # every blob sent at once: a shorter blob than expected brings the start of the next
    frames = [_frame(n, i) for i, n in enumerate(sizes)]
    data = b"".join(_blob(f) for f in frames)
    r = _reader()
    sock = _Sock([data])
    _check(_read_all(r, sock), frames)
    assert r.received == len(data)


@pytest.mark.parametrize("longer", [1, 2, 3])
def test_kept_bytes_finish_a_blob_longer_than_the_expected_one(longer: int) -> None:
    # blobs of any bytes (the reader does not parse frames): a long blob sets the expected
    # length; the next three come in one chunk, so the one-read keeps bytes past the first of
    # them; the second is ``longer`` bytes longer than the first, and its last bytes are among
    # the kept ones, behind what the buffer of the expected length held
    rng = np.random.default_rng(longer)
    lengths = [200, 50, 50 + longer, 60]
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    data = [_blob(b) for b in blobs]
    r = _reader()
    sock = _Sock([data[0], b"".join(data[1:])])
    _check(_read_all(r, sock), blobs)
    assert r.received == sum(len(d) for d in data)


def test_every_split_of_the_stream_gives_the_same_blobs() -> None:
    frames = [_frame(n, i) for i, n in enumerate([12, 12, 4, 12, 20, 12])]
    data = b"".join(_blob(f) for f in frames)
    for cut in range(1, len(data)):
        for tail in (1, 7, len(data)):  # after the cut: bytes a call at most
            rest = data[cut:]
            chunks = [data[:cut]] + [rest[i:i + tail] for i in range(0, len(rest), tail)]
            r = _reader()
            _check(_read_all(r, _Sock(chunks)), frames)
            assert r.received == len(data)
    r = _reader()
    _check(_read_all(r, _Sock([bytes([b]) for b in data])), frames)


def test_end_of_stream_inside_a_prefix_or_a_frame() -> None:
    f = _frame(16, 1)
    blob = _blob(f)
    for cut in range(len(blob) + 1):
        for first in (None, _blob(f), _blob(_frame(4, 2))):  # the cut blob first, or second
            data = (first or b"") + blob[:cut]
            r = _reader()
            out = _read_all(r, _Sock([data]))
            assert r.received == len(data)
            done = out[:-1] if out and out[-1][1] < len(out[-1][0]) else out
            assert len(done) == (first is not None) + (cut == len(blob))
            if cut < 4:
                assert len(out) == len(done)  # inside the prefix: no blob
            elif cut < len(blob):
                frame, got, premac = out[-1]
                assert (len(frame), got, premac) == (len(f), cut - 4, None)
                assert frame[:got] == f[:got]


def test_a_reset_is_end_of_stream() -> None:
    f = _frame(16, 1)
    r = _reader()
    out = _read_all(r, _Sock([_blob(f), _blob(f)[:30]], then=ConnectionResetError()))
    assert out[0] == (f, len(f), frame_premac(f, SALT))
    assert (out[1][1], out[1][2]) == (26, None)


def test_a_prefix_above_the_ceiling_is_refused_on_either_path() -> None:
    f = _frame(16, 1)
    for data in (_blob(f) + struct.pack("<I", 1000), struct.pack("<I", 1000)):
        r = _reader(ceiling=999)
        sock = _Sock([data])
        if len(data) > 4:
            r.read(sock, None)  # type: ignore[arg-type]
        with pytest.raises(LimitExceeded, match="1000") as e:
            r.read(sock, None)  # type: ignore[arg-type]
        assert e.value.error_id == "len.too_large"


@pytest.mark.parametrize("split", [2, 4, 30])
def test_a_starved_frame_fails_as_before(split: int) -> None:
    f = _frame(16, 1)
    r = _reader()
    # second blob: prefix (and maybe some frame) arrive, then nothing: starvation 0 fails
    sock = _Sock([_blob(f), _blob(f)[:split]], then=TimeoutError("timed out"))
    assert r.read(sock, None) is not None  # type: ignore[arg-type]
    with pytest.raises(ProtocolError) as e:  # a unit begun (even inside its prefix) starves
        r.read(sock, 0.0)  # type: ignore[arg-type]
    assert e.value.error_id == "mux.starved"


def test_a_stop_while_waiting_for_a_blob() -> None:
    stop = threading.Event()
    stop.set()
    r = _reader(stop=stop)
    with pytest.raises(Stopped):
        r.read(_Sock([], then=TimeoutError("timed out")), None)  # type: ignore[arg-type]


def test_a_held_frame_is_never_read_into() -> None:
    fold = _Fold()
    frames = [_frame(32, i) for i in range(6)]
    r = _reader(fold)
    sock = _Sock([_blob(f) for f in frames])
    held = None
    views = []
    for i, f in enumerate(frames):
        fold.holding = i % 2 == 1  # the fold still holds the last frame every other read
        res = r.read(sock, None)  # type: ignore[arg-type]
        assert res is not None
        assert bytes(res[0]) == f
        if held is not None and fold.holding:
            assert bytes(held[0]) == held[1]  # the held frame is intact
            assert np.frombuffer(res[0], np.uint8).ctypes.data \
                != np.frombuffer(held[0], np.uint8).ctypes.data
        held = (res[0], f)
        views.append(np.frombuffer(res[0], np.uint8).ctypes.data)
        assert views[-1] % 16 == 0  # the frame keeps the buffer's alignment
    # a released frame's buffer is read into again: two buffers serve the six frames
    assert len(set(views)) == 2


def test_a_large_frame_reads_its_prefix_first_and_never_into_a_held_buffer() -> None:
    n = (PARALLEL_MAC_MIN // 4) + 16
    frames = [_frame(n, i) for i in range(3)]
    fold = _Fold()
    r = _reader(fold)
    sock = _Sock([_blob(f) for f in frames])
    res0 = r.read(sock, None)  # type: ignore[arg-type]
    assert res0 is not None and bytes(res0[0]) == frames[0]
    assert sock.asked[0] == 4  # the prefix alone
    fold.holding = True
    res1 = r.read(sock, None)  # type: ignore[arg-type]
    assert res1 is not None and bytes(res1[0]) == frames[1]
    assert bytes(res0[0]) == frames[0]  # the held frame is intact
    fold.holding = False
    res2 = r.read(sock, None)  # type: ignore[arg-type]
    assert res2 is not None and bytes(res2[0]) == frames[2]
    assert res2[2] == frame_premac(frames[2], SALT)
    # released: the last buffer is read into again
    assert np.frombuffer(res2[0], np.uint8).ctypes.data \
        == np.frombuffer(res1[0], np.uint8).ctypes.data


def test_over_a_real_socket_pair() -> None:
    a, b = socket.socketpair()
    try:
        frames = [_frame(n, i) for i, n in enumerate([256, 256, 64, 256, 1024])]
        data = b"".join(_blob(f) for f in frames)
        t = threading.Thread(target=a.sendall, args=(data,))
        t.start()
        r = _reader()
        out = []
        for _ in frames:
            res = r.read(b, 1.0)
            assert res is not None
            out.append((bytes(res[0]), res[1], res[2]))
        t.join()
        _check(out, frames)
        a.shutdown(socket.SHUT_WR)
        assert r.read(b, 1.0) is None
        assert FRAME_OFFSET % 16 == 0
    finally:
        a.close()
        b.close()


def test_a_shorter_blob_is_returned_while_the_peer_waits() -> None:
    # the rank waits for its consensus after a blob shorter than the last: the read must not
    # wait for the expected length (here the peer only times out until the relay stops)
    stop = threading.Event()
    f1, f2 = _frame(64, 1), _frame(8, 2)
    sock = _Sock([_blob(f1), _blob(f2)], then=TimeoutError("timed out"), stop_after=(stop, 3))
    r = _reader(stop=stop)
    out = []
    for _ in range(2):
        res = r.read(sock, None)  # type: ignore[arg-type]
        assert res is not None
        out.append((bytes(res[0]), res[1], res[2]))
    _check(out, [f1, f2])
    with pytest.raises(Stopped):
        r.read(sock, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("sizes", [[4, 4, 16, 16, 16, 4, 4], [16, 16, 4, 4, 4, 16, 16]])
def test_held_frames_and_length_changes_keep_every_frame_whole(sizes: list[int]) -> None:
    fold = _Fold()
    frames = [_frame(n, i) for i, n in enumerate(sizes)]
    r = _reader(fold)
    sock = _Sock([_blob(f) for f in frames])
    last: tuple[memoryview, bytes] | None = None
    for i, f in enumerate(frames):
        fold.holding = i % 2 == 1
        res = r.read(sock, None)  # type: ignore[arg-type]
        assert res is not None
        assert (bytes(res[0]), res[1], res[2]) == (f, len(f), frame_premac(f, SALT))
        if last is not None and fold.holding:
            assert bytes(last[0]) == last[1]
        last = (res[0], f)
    assert r.received == sum(4 + len(f) for f in frames)


def test_a_frame_of_a_new_length_gives_its_buffer_to_the_next_frame() -> None:
    frames = [_frame(16, 0), _frame(4, 1), _frame(4, 2)]
    r = _reader()
    sock = _Sock([_blob(f) for f in frames])
    addrs = []
    for f in frames:
        res = r.read(sock, None)  # type: ignore[arg-type]
        assert res is not None and bytes(res[0]) == f
        addrs.append(np.frombuffer(res[0], np.uint8).ctypes.data)
    assert addrs[2] == addrs[1] != addrs[0]


# -- any sequence of lengths, any split, any hold: as the prefix-then-body read ------------------

_OVERHEAD = len(_frame(0, 0))
_AT_BOUND = (PARALLEL_MAC_MIN - 4 - _OVERHEAD) // 4  # floats: 4 + frame just below the bound
_FLOATS = [0, 1, 2, 3, 16, 17, 64, _AT_BOUND, _AT_BOUND + 1, _AT_BOUND + 300]
_FRAMES = {n: _frame(n, n) for n in _FLOATS}
_EMPTY = b""  # a zero-length blob: its prefix alone


@st.composite
def _blob_streams(draw: st.DrawFn) -> tuple[list[bytes], bytes, list[int], list[bool]]:
    big = draw(st.integers(0, 3)) == 0  # frames around and above the one-read bound, at times
    pool = _FLOATS if big else _FLOATS[:7]
    frames = [_EMPTY if k < 0 else _FRAMES[k] for k in draw(st.lists(
        st.sampled_from([-1, *pool]), min_size=1, max_size=8))]
    last = _blob(_FRAMES[draw(st.sampled_from(_FLOATS[:7]))])
    tail = last[:draw(st.integers(0, len(last)))]  # end of stream inside a blob, or after it
    data = b"".join(_blob(f) for f in frames) + tail
    cuts = sorted(set(draw(st.lists(st.integers(1, len(data)), max_size=10))))
    holds = draw(st.lists(st.booleans(), min_size=len(frames) + 1, max_size=len(frames) + 1))
    return frames, tail, cuts, holds


@given(_blob_streams())
def test_any_blob_lengths_splits_and_holds_read_as_prefix_then_body(
        case: tuple[list[bytes], bytes, list[int], list[bool]]) -> None:
    frames, tail, cuts, holds = case
    data = b"".join(_blob(f) for f in frames) + tail
    bounds = [0, *cuts, len(data)]
    sock = _Sock([data[a:b] for a, b in itertools.pairwise(bounds)])
    fold = _Fold()
    r = _reader(fold)
    last: tuple[memoryview, bytes] | None = None
    for i, f in enumerate(frames):
        fold.holding = holds[i]  # the fold still holds the last frame (it was sent early)
        res = r.read(sock, None)  # type: ignore[arg-type]
        assert res is not None
        assert (bytes(res[0]), res[1]) == (f, len(f))
        assert res[2] == frame_premac(f, SALT)
        if last is not None and fold.holding:
            assert bytes(last[0]) == last[1]  # the frame the fold holds was not read into
        last = (res[0], f)
    fold.holding = holds[-1]
    res = r.read(sock, None)  # type: ignore[arg-type]
    if len(tail) < 4:
        assert res is None
    else:
        n = int.from_bytes(tail[:4], "little")
        got = len(tail) - 4
        assert res is not None and len(res[0]) == n
        assert res[1] == got and bytes(res[0][:got]) == tail[4:]
        assert res[2] == (frame_premac(bytes(res[0]), SALT) if got == n else None)
        if got == n:
            assert r.read(sock, None) is None  # type: ignore[arg-type]
    if last is not None and fold.holding:
        assert bytes(last[0]) == last[1]
    assert r.received == len(data)

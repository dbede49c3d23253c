"""Hot-path helpers: MACs computed as bytes arrive (Premac), parallel record signing, the
streaming socket reader, the relay fold's unencoded results."""

from __future__ import annotations

import hmac
import socket
import threading

import numpy as np
import pytest

from flodl_proto.codec import (
    RecordKind,
    RoundFrame,
    TensorPayload,
    decode_mux_record_or_eos,
    decode_round_frame_or_eos,
    encode_frame_record,
    encode_mux_record_parts,
    encode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.codec.auth import Premac, new_mac, update_in_parallel
from flodl_proto.codec.loopback import decode_framed_round_or_eos, encode_framed_round
from flodl_proto.codec.round_frame import round_frame_pieces
from flodl_proto.errors import AuthenticationError, LimitExceeded
from flodl_proto.reduce import HostFold
from flodl_proto.runner._macworker import MacWorker
from flodl_proto.runner._netio_recv import (
    HASH_STEP,
    HASH_STEP_MIN,
    MacRange,
    hash_step,
    read_record_into,
    recv_hashing_into,
)

SALT = bytes(range(16))


def _frame(n: int, value: float = 1.5, weight: float = 1.0) -> RoundFrame:
    a = np.full(n, value, dtype=np.float32)
    b = np.arange(n // 2 + 1, dtype=np.float32)
    return RoundFrame(0, weight, [TensorPayload.from_array(a), TensorPayload.from_array(b)])


def _mac(*pieces: bytes | memoryview) -> bytes:
    m = new_mac(SALT)
    for p in pieces:
        m.update(p)
    return bytes(m.digest())


@pytest.mark.parametrize("n", [3, 1 << 19])  # below and above the parallel threshold
def test_frame_record_equals_record_around_signed_frame(n: int) -> None:
    frame = _frame(n)
    got = b"".join(encode_frame_record(RecordKind.HOST_FRAME, frame, SALT))
    want = b"".join(encode_mux_record_parts(int(RecordKind.HOST_FRAME), 0,
                                            encode_round_frame(frame, SALT), SALT))
    assert got == want
    rec, used = decode_mux_record_or_eos(got, SALT)  # type: ignore[misc]
    assert used == len(got)
    assert decode_round_frame_or_eos(rec.payload, SALT)[0] == frame  # type: ignore[index]


def test_frame_record_ceiling() -> None:
    frame = _frame(64)
    with pytest.raises(LimitExceeded):
        encode_frame_record(RecordKind.BROADCAST, frame, SALT, ceiling=100)


def test_round_frame_pieces_are_the_frame_before_its_tag() -> None:
    frame = _frame(5)
    wire = encode_round_frame_bytes(frame, SALT)
    body = b"".join(bytes(p) for p in round_frame_pieces(frame))
    assert wire == body + _mac(body)[:8]


def test_update_in_parallel_matches_serial() -> None:
    data = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8).data
    a, b = new_mac(SALT), new_mac(SALT)
    b.update(b"head")
    update_in_parallel([(a, [data[:100], data[100:]]), (b, [data])])
    assert a.digest() == _mac(data)
    assert b.digest() == _mac(b"head", data)
    assert threading.active_count() == 1 or all(
        t.name != "flodl-mac" for t in threading.enumerate())


def test_premac_used_only_when_it_covers_the_frame() -> None:
    wire = encode_round_frame_bytes(_frame(8), SALT)
    covered = len(wire) - 8
    good = Premac(covered, _mac(wire[:covered]))
    assert decode_round_frame_or_eos(wire, SALT, premac=good)[1] == len(wire)  # type: ignore[index]
    # a MAC over other bytes makes the tag check fail: nothing is accepted on its word alone
    bad = Premac(covered, _mac(b"other bytes"))
    with pytest.raises(AuthenticationError):
        decode_round_frame_or_eos(wire, SALT, premac=bad)
    # a premac of another length is ignored (the decoder hashes the frame itself)
    other = Premac(covered - 1, _mac(b"other bytes"))
    assert decode_round_frame_or_eos(wire, SALT, premac=other)[1] == len(wire)  # type: ignore[index]
    framed = encode_framed_round(_frame(8), SALT)
    with pytest.raises(AuthenticationError):
        decode_framed_round_or_eos(b"".join(framed), SALT, premac=bad)


def test_premac_of_a_mux_record() -> None:
    wire = b"".join(encode_frame_record(RecordKind.BROADCAST, _frame(8), SALT))
    covered = wire[:17] + wire[25:]
    good = Premac(len(covered), _mac(covered))
    assert decode_mux_record_or_eos(wire, SALT, premac=good)[1] == len(wire)  # type: ignore[index]
    with pytest.raises(AuthenticationError):
        decode_mux_record_or_eos(wire, SALT, premac=Premac(len(covered), _mac(b"x")))
    assert decode_mux_record_or_eos(wire, SALT,  # type: ignore[index]
                             premac=Premac(len(covered) + 1, _mac(b"x")))[1] == len(wire)


@pytest.mark.parametrize("worker", [False, True])
def test_recv_hashing_into_feeds_each_range(worker: bool) -> None:
    data = np.random.default_rng(2).integers(0, 255, 2 * HASH_STEP + 12345, dtype=np.uint8)
    a, b = socket.socketpair()
    t = threading.Thread(target=lambda: (a.sendall(data.data), a.close()))
    t.start()
    buf = bytearray(len(data))
    view = memoryview(buf)
    first = new_mac(SALT)
    second = new_mac(SALT)
    w = MacWorker() if worker else None
    try:
        ranges = [MacRange(first, 0, len(data)), MacRange(second, 100, len(data) - 8, w)]
        got = recv_hashing_into(b, view[:HASH_STEP + 7], ranges)
        got += recv_hashing_into(b, view, ranges, start=got)
    finally:
        if w is not None:
            w.close()
        t.join()
        b.close()
    assert got == len(data) and bytes(buf) == data.tobytes()
    assert first.digest() == _mac(data.data)
    assert second.digest() == _mac(data.data[100:len(data) - 8])
    view.release()
    buf.append(0)  # nothing else holds a view of the buffer (a worker dropped its slices)


def test_recv_hashing_into_short_at_end_of_stream() -> None:
    a, b = socket.socketpair()
    a.sendall(b"abc")
    a.close()
    mac = new_mac(SALT)
    buf = bytearray(10)
    assert recv_hashing_into(b, memoryview(buf), [MacRange(mac, 0, 10)]) == 3
    b.close()
    assert mac.digest() == _mac(b"abc")


def test_hash_step_is_a_quarter_of_the_unit_within_its_bounds() -> None:
    assert (HASH_STEP_MIN, HASH_STEP) == (1 << 20, 4 << 20)
    assert [hash_step(n) for n in (0, 1, 1 << 20, 4 << 20, (4 << 20) + 3)] == [1 << 20] * 5
    assert hash_step((4 << 20) + 4) == (1 << 20) + 1
    assert hash_step((8 << 20) + 4) == (2 << 20) + 1
    assert [hash_step(n) for n in (16 << 20, (16 << 20) - 4, 64 << 20, 1 << 40)] == \
        [4 << 20, (4 << 20) - 1, 4 << 20, 4 << 20]


class _Updates:
    """A MAC that records the size of each update (and hashes nothing)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def update(self, data: memoryview) -> None:
        self.sizes.append(len(data))


@pytest.mark.parametrize(("size", "want"), [
    (4 << 20, [1 << 20] * 4),  # a frame of a few MiB: four steps, each overlapping a transfer
    ((8 << 20) + 4, [(2 << 20) + 1] * 4),
    (64 << 20, [4 << 20] * 16),  # a large one: steps of HASH_STEP
    ((1 << 20) - 1, [(1 << 20) - 1]),  # under PARALLEL_MAC_MIN: one read, one update
])
def test_read_record_into_hashes_in_steps_of_hash_step(size: int, want: list[int]) -> None:
    a, b = socket.socketpair()
    t = threading.Thread(target=lambda: (a.sendall(bytes(size)), a.close()))
    t.start()
    mac = _Updates()
    try:
        view, got = read_record_into(b, bytearray(size), size, [(mac, 0, size)])
    finally:
        t.join()
        b.close()
    assert got == size and view.nbytes == size
    assert mac.sizes == want


def test_host_fold_frame_results_match_bytes_results() -> None:
    f1, f2 = _frame(1000, 1.0, 1.0), _frame(1000, 2.0, 3.0)
    w1, w2 = encode_round_frame_bytes(f1, SALT), encode_round_frame_bytes(f2, SALT)
    a, b = HostFold([0, 1], SALT), HostFold([0, 1], SALT)
    assert a.deposit(0, w1) is None and b.deposit_frame(0, w1) is None
    want = a.deposit(1, w2)
    premac = Premac(len(w2) - 8, _mac(w2[:-8]))
    got = b.deposit_frame(1, w2, premac=premac)
    assert isinstance(got, RoundFrame)
    assert encode_round_frame_bytes(got, SALT) == want
    # a single deposit ships the seed verbatim, as a view of the blob
    c = HostFold([0, 1], SALT)
    c.deposit_frame(0, w1)
    seed = c.declare_dead_frame(1)
    assert isinstance(seed, memoryview) and bytes(seed) == w1


def test_host_fold_rejects_a_wrong_premac() -> None:
    w = encode_round_frame_bytes(_frame(10), SALT)
    fold = HostFold([0, 1], SALT)
    with pytest.raises(AuthenticationError):
        fold.deposit(0, w, premac=Premac(len(w) - 8, _mac(b"forged")))
    assert isinstance(fold.error, AuthenticationError)


def test_plain_hmac_agrees() -> None:
    assert _mac(b"x") == hmac.new(SALT, b"x", "sha256").digest()


@pytest.mark.parametrize("dtype", [0, 1])  # f32, bf16
def test_host_fold_split_accumulate_is_bit_identical(dtype: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.reduce import _host_sums

    rng = np.random.default_rng(3)
    n = (1 << 21) + 3
    blobs = []
    for r in range(3):
        a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
        a[r::7] = -0.0
        blobs.append(encode_round_frame_bytes(
            RoundFrame(0, 1.0, [TensorPayload.from_array(a, dtype=dtype)]), SALT))

    def fold() -> bytes | None:
        f = HostFold([0, 1, 2], SALT)
        out = None
        for r, b in enumerate(blobs):
            out = f.deposit(r, b)
        return out

    split = fold()
    monkeypatch.setattr(_host_sums, "_SPLIT_MIN_ELEMS", 1 << 62)
    assert split is not None and split == fold()


def test_update_in_parallel_uses_only_the_callers_executor() -> None:
    """Two MACs of a large frame run side by side on the executor the caller owns; small ones,
    or no executor, run on the calling thread (nothing is submitted, no thread is started)."""
    from concurrent.futures import ThreadPoolExecutor

    data = np.random.default_rng(2).integers(0, 255, 2 << 20, dtype=np.uint8).data
    submitted: list[int] = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
            submitted.append(1)
            return super().submit(fn, *args, **kwargs)

    with Counting(max_workers=1) as pool:
        a, b = new_mac(SALT), new_mac(SALT)
        update_in_parallel([(a, [data]), (b, [data])], pool)
        assert a.digest() == b.digest() == _mac(data)
        assert submitted == [1]
        small = data[:4096]
        c, d = new_mac(SALT), new_mac(SALT)
        update_in_parallel([(c, [small]), (d, [small])], pool)
        assert c.digest() == d.digest() == _mac(small) and submitted == [1]
    before = threading.active_count()
    e, f = new_mac(SALT), new_mac(SALT)
    update_in_parallel([(e, [data]), (f, [data])])
    assert e.digest() == _mac(data) and threading.active_count() == before

"""The relay fold's buffer reuse and one-pass last step against the plain kernel sequence.

HostFold pools its f32 accumulators and encoded outputs across rounds and folds the deposit that
completes a round straight into the output. Neither may change a byte: every round's HostFrame
must equal ``encode(0.0 + seed + x1 + ...)`` computed with :func:`K.promote`,
:func:`K.accumulate` and :func:`K.encode_sums` on fresh arrays, whatever the previous rounds held,
and a HostFrame the caller still holds must not be overwritten by a later round."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec.round_frame import (
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame_or_eos,
    encode_round_frame_bytes,
)
from flodl_proto.reduce import HostFold, _host_sums
from flodl_proto.reduce import _kernels as K

SALT = bytes(range(16))
#: element counts of the round's tensors: below one chunk, several chunks with a tail
SIZES = (1_000, 3 * 65_536 + 5)


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
    a[rng.integers(0, n, 5)] = -0.0
    a[rng.integers(0, n, 2)] = np.nan
    a[rng.integers(0, n, 2)] = np.inf
    return a


def _frames(rng: np.random.Generator, ranks: int, dtype: int, version: int,
            elide_p: float) -> list[RoundFrame]:
    frames = []
    for _ in range(ranks):
        tensors = []
        for n in SIZES:
            if version >= 3 and rng.random() < elide_p:
                tensors.append(TensorPayload.elide(dtype, [n]))
            else:
                tensors.append(TensorPayload.from_array(_values(rng, n), dtype=dtype))
        frames.append(RoundFrame(RoundKind.MODEL, float(rng.integers(1, 5)), tensors))
    return frames


def _view(p: TensorPayload) -> np.ndarray:
    return np.frombuffer(bytes(p.data), dtype="<f4" if p.dtype == 0 else "<u2")


def _expected(frames: list[RoundFrame], version: int) -> list[bytes] | None:
    """Per tensor, the HostFrame payload the plain kernel sequence gives; None when the round
    never promotes (the seed's tensors ship verbatim)."""
    v3 = version >= 3
    later = [p for f in frames[1:] for p in f.tensors if not (v3 and p.elided)]
    if not later:
        return None
    ws = K.Workspace()
    out = []
    for ti, seed in enumerate(frames[0].tensors):
        acc = K.promote(None if (v3 and seed.elided) else _view(seed), seed.dtype, seed.numel,
                        ws)
        for f in frames[1:]:
            p = f.tensors[ti]
            if not (v3 and p.elided):
                K.accumulate(acc, _view(p), p.dtype, ws)
        out.append(K.encode_sums(acc, seed.dtype, ws).tobytes())
    return out


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("dtype", [0, 1])  # f32, bf16
def test_rounds_with_reused_buffers_are_bit_identical(
        dtype: int, ranks: int, version: int, split: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if split:  # halves on two threads even for these small tensors
        monkeypatch.setattr(_host_sums, "_SPLIT_MIN_ELEMS", 512)
        monkeypatch.setattr(_host_sums.K, "default_threads", lambda: 2)
    rng = np.random.default_rng(100 * ranks + 10 * dtype + version)
    fold = HostFold(range(ranks), SALT, version=version)
    held: list[tuple[RoundFrame, bytes]] = []
    for rnd in range(6):
        frames = _frames(rng, ranks, dtype, version, elide_p=0.5 if rnd % 2 else 0.2)
        blobs = [encode_round_frame_bytes(f, SALT) for f in frames]
        order = list(rng.permutation(ranks))
        res = None
        for i, r in enumerate(order):
            res = fold.deposit_frame(int(r), blobs[i])
            assert (res is None) == (i < ranks - 1)
        assert res is not None
        want = _expected(frames, version)
        weight = sum(f.weight for f in frames)  # whole numbers: exact in any order
        if want is None:  # never promoted: the seed's tensors, under the summed weight
            assert weight != frames[0].weight and isinstance(res, RoundFrame)
            want = [bytes(t.data) for t in frames[0].tensors]
        assert isinstance(res, RoundFrame)
        assert [bytes(t.data) for t in res.tensors] == want
        assert res.weight == weight
        # the caller keeps this round's HostFrame: later rounds must not write into it
        held.append((res, b"".join(bytes(t.data) for t in res.tensors)))
        if len(held) > 2:
            held.pop(0)  # released: its buffers may be reused
        for frame, snap in held:
            assert b"".join(bytes(t.data) for t in frame.tensors) == snap
    # bounded: arrays of the last two rounds at most (sums and outputs per tensor)
    assert len(fold._pool) <= 2 * 2 * len(SIZES) + 2 * len(SIZES)


@pytest.mark.parametrize("dtype", [0, 1])
def test_completion_by_death_encodes_partial_sums(dtype: int) -> None:
    """Deposits that did not complete the round (sums in accumulators, a tensor never merged)
    and a death that completes it; then a round whose last deposit follows a death."""
    rng = np.random.default_rng(7 + dtype)
    fold = HostFold([0, 1, 2, 3], SALT, version=3)
    frames = _frames(rng, 3, dtype, 3, elide_p=0.0)
    frames[1] = RoundFrame(frames[1].kind, frames[1].weight,
                           [frames[1].tensors[0], TensorPayload.elide(dtype, [SIZES[1]])])
    frames[2] = RoundFrame(frames[2].kind, frames[2].weight,
                           [frames[2].tensors[0], TensorPayload.elide(dtype, [SIZES[1]])])
    for r in range(3):
        assert fold.deposit_frame(r, encode_round_frame_bytes(frames[r], SALT)) is None
    res = fold.declare_dead_frame(3)
    assert isinstance(res, RoundFrame)
    assert [bytes(t.data) for t in res.tensors] == _expected(frames, 3)
    # next round: rank 3 is dead, so rank 2's deposit completes it (the one-pass path)
    frames = _frames(rng, 3, dtype, 3, elide_p=0.0)
    for r in range(3):
        res = fold.deposit_frame(r, encode_round_frame_bytes(frames[r], SALT))
    assert isinstance(res, RoundFrame)
    assert [bytes(t.data) for t in res.tensors] == _expected(frames, 3)


def test_encoded_deposit_output_decodes_to_the_same_sums() -> None:
    """:meth:`HostFold.deposit` (signed bytes) over several rounds of one size."""
    rng = np.random.default_rng(3)
    fold = HostFold([0, 1], SALT, version=2)
    for _ in range(3):
        frames = _frames(rng, 2, 1, 2, elide_p=0.0)
        fold.deposit(0, encode_round_frame_bytes(frames[0], SALT))
        out = fold.deposit(1, encode_round_frame_bytes(frames[1], SALT))
        assert out is not None
        host, _ = decode_round_frame_or_eos(out, SALT)
        assert [bytes(t.data) for t in host.tensors] == _expected(frames, 2)


@pytest.mark.parametrize("dtype", [0, 1])
def test_released_output_is_reused(dtype: int) -> None:
    """Once the caller drops a HostFrame, the next round writes into the same output array (no
    fresh allocation per round), and the result is still the next round's own sums."""
    rng = np.random.default_rng(5)
    fold = HostFold([0, 1], SALT, version=2)
    addrs = []
    for _ in range(3):
        frames = _frames(rng, 2, dtype, 2, elide_p=0.0)
        fold.deposit_frame(0, encode_round_frame_bytes(frames[0], SALT))
        res = fold.deposit_frame(1, encode_round_frame_bytes(frames[1], SALT))
        assert isinstance(res, RoundFrame)
        assert [bytes(t.data) for t in res.tensors] == _expected(frames, 2)
        addrs.append(np.frombuffer(res.tensors[1].data, np.uint8).ctypes.data)
        del res
    assert addrs[0] == addrs[1] == addrs[2]

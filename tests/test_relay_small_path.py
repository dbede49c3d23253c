"""The relay's small-round path gives what the general path gives: the fold's planned completion
(``HostFold._fold_last_fast``) against the per-tensor path for the same deposits (bytes, errors,
bookkeeping), ``plans.frame_premac`` against ``plans.frame_macs``, and the runner's one-call
writes (``_send_at_once`` / ``_skip``) against the bytes they were given."""

from __future__ import annotations

import math
import socket
import struct
import threading
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import (
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.codec.auth import new_mac
from flodl_proto.codec.plans import frame_macs, frame_premac
from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import HostFold, bf16_from_f32, host_fold
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce.host_fold import _LayoutPlan, _SmallPlan
from flodl_proto.runner import _netio_recv, _netio_send

SALT = bytes(range(16))
F32, BF16 = 0, 1


def _t(dtype: int, shape: tuple[int, ...], seed: int, special: bool = False) -> TensorPayload:
    n = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    if special and n >= 4:
        a[:4] = [np.nan, -0.0, np.inf, -np.inf]
    if dtype == F32:
        return TensorPayload(F32, shape, a.astype("<f4").tobytes())
    return TensorPayload(BF16, shape, (a.view("<u4") >> 16).astype("<u2").tobytes())


def _blob(tensors: list[TensorPayload], weight: float = 1.0,
          kind: RoundKind = RoundKind.MODEL, salt: bytes = SALT) -> bytes:
    # as given: some cases carry a byte count that disagrees with the shape (the fold's test)
    return encode_round_frame_bytes(RoundFrame(kind, weight, tensors, check_nbytes=False), salt)


def _layout(spec: list[tuple[int, tuple[int, ...]]], seed: int,
            special: bool = False) -> list[TensorPayload]:
    return [_t(d, s, seed * 31 + i, special) for i, (d, s) in enumerate(spec)]


SMALL = [(F32, (256,)), (F32, (16, 16)), (BF16, (512,)), (BF16, (3,)), (F32, (5,))]
OTHER = [(BF16, (7,)), (F32, (2, 3))]


def _cases() -> dict[str, tuple[int, list[int], list[tuple[int, bytes]], bool]]:
    """name -> (version, ranks, deposits (rank, blob) in order, whether the planned path
    completes at least one round)."""
    a0, a1 = _blob(_layout(SMALL, 0, True)), _blob(_layout(SMALL, 1), 2.5)
    b0, b1 = _blob(_layout(OTHER, 2)), _blob(_layout(OTHER, 3), 0.0)
    zero = [(F32, (0,)), (F32, (4,))]
    z0, z1 = _blob(_layout(zero, 4)), _blob(_layout(zero, 5))
    bad_nbytes = _blob([TensorPayload(F32, (3,), bytes(8)), _t(F32, (2,), 6)])
    short = _blob([_t(F32, (256,), 7), TensorPayload(F32, (2,), bytes(4))])
    elided = _blob([_t(F32, (4,), 8), TensorPayload(F32, (3,), b"")])
    full = _blob([_t(F32, (4,), 9), _t(F32, (3,), 10)])
    forged = bytearray(a1)
    forged[-1] ^= 1
    return {
        "three rounds, two layouts": (2, [0, 1], [(0, a0), (1, a1), (1, b1), (0, b0),
                                                  (0, a1), (1, a0)], True),
        "version 3": (3, [0, 1], [(0, a0), (1, a1), (0, b0), (1, b1)], True),
        "a zero-element tensor, version 2": (2, [0, 1], [(0, z0), (1, z1)], True),
        "a zero-element tensor, version 3": (3, [0, 1], [(0, z0), (1, z1)], False),
        "kind differs": (2, [0, 1], [(0, a0), (1, _blob(_layout(SMALL, 1),
                                                         kind=RoundKind.CONTROL))], False),
        "shape differs": (2, [0, 1], [(0, b0), (1, _blob(_layout([(BF16, (7,)), (F32, (3, 2))],
                                                                 3)))], False),
        "fewer tensors": (2, [0, 1], [(0, a0), (1, _blob(_layout(SMALL[:-1], 1)))], False),
        "seed byte count": (2, [0, 1], [(0, bad_nbytes), (1, bad_nbytes)], False),
        "deposit byte count": (2, [0, 1], [(0, _blob([_t(F32, (256,), 7), _t(F32, (2,), 1)])),
                                           (1, short)], False),
        "weight overflow": (2, [0, 1], [(0, _blob(_layout(OTHER, 2), 1e308)),
                                        (1, _blob(_layout(OTHER, 3), 1e308))], False),
        "elided deposit, version 3": (3, [0, 1], [(0, full), (1, elided)], False),
        "elided seed, version 3": (3, [0, 1], [(0, elided), (1, full)], False),
        "forged tag": (2, [0, 1], [(0, a0), (1, bytes(forged))], False),
        "three ranks": (2, [0, 1, 2], [(0, a0), (2, a1), (1, a0), (1, b0), (0, b1),
                                       (2, b0)], True),
        "four ranks, held deposits": (2, [0, 1, 2, 3], [(3, a0), (1, a1), (0, a0), (2, a1),
                                                        (0, b1), (1, b0), (2, b1), (3, b0)],
                                      True),
        "held, then another layout": (2, [0, 1, 2], [(0, a0), (1, a1), (2, b0)], False),
        "held, then another kind": (2, [0, 1, 2], [(0, a0), (1, a1), (2, _blob(
            _layout(SMALL, 1), kind=RoundKind.CONTROL))], False),
        "held, then a forged tag": (2, [0, 1, 2], [(0, a0), (1, a1), (2, bytes(forged))], False),
        "held, then a weight overflow": (2, [0, 1, 2], [(0, _blob(_layout(SMALL, 6), 1e308)),
                                                        (1, _blob(_layout(SMALL, 7), 1e308)),
                                                        (2, a1)], False),
        "version 3, four ranks": (3, [0, 1, 2, 3], [(0, a0), (1, a1), (2, a0), (3, a1)], True),
        "unknown dtype": (2, [0, 1], [(0, _blob([TensorPayload(7, (2,), bytes(8))])),
                                      (1, _blob([TensorPayload(7, (2,), bytes(8))]))], False),
    }


def _outcome(fold: HostFold, rank: int, blob: bytes, premac: bool = False) -> Any:
    try:
        res = fold.deposit_frame(rank, blob, premac=frame_premac(blob, SALT) if premac else None)
    except ProtocolError as e:
        return ("error", type(e).__name__, e.error_id, dict(e.fields))
    if res is None:
        return None
    if isinstance(res, RoundFrame):
        return ("frame", encode_round_frame_bytes(res, SALT),
                [(t.dtype, t.shape, t.data.format, t.data.nbytes) for t in res.tensors])
    return ("verbatim", bytes(res))


def _run(version: int, ranks: list[int], deposits: list[tuple[int, bytes]],
         planned: bool, monkeypatch: pytest.MonkeyPatch,
         premac: bool = False, remembered: bool = True) -> tuple[list[Any], int]:
    taken = 0
    original = HostFold._fold_last_fast

    def spy(self: HostFold, *args: Any) -> Any:
        nonlocal taken
        res = original(self, *args) if planned else None
        taken += res is not None
        return res

    with monkeypatch.context() as m:
        m.setattr(HostFold, "_fold_last_fast", spy)
        if not planned:  # the per-tensor path throughout, every frame decoded in full: no
            # deposit is held either
            m.setattr(HostFold, "_hold", lambda self, *args: False)
            m.setattr(host_fold, "_read_known", lambda *args: None)
        if not remembered:  # every frame decoded in full: the planned path tensor by tensor
            m.setattr(host_fold, "_read_known", lambda *args: None)
        fold = HostFold(ranks, SALT, version=version)
        out = []
        for rank, blob in deposits:
            out.append(_outcome(fold, rank, blob, premac))
            out.append((fold.rounds_completed, fold.deposited, fold.alive_ranks,
                        None if fold.error is None else fold.error.error_id))
            if fold.error is not None:
                break
    return out, taken


@pytest.mark.parametrize("name", list(_cases()))
def test_the_planned_completion_gives_the_per_tensor_paths_results(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    version, ranks, deposits, used = _cases()[name]
    general, none_taken = _run(version, ranks, deposits, False, monkeypatch)
    planned, taken = _run(version, ranks, deposits, True, monkeypatch)
    assert none_taken == 0
    assert planned == general
    assert (taken > 0) is used


@pytest.mark.parametrize("name", list(_cases()))
def test_the_planned_completion_tensor_by_tensor_gives_the_per_tensor_paths_results(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above with every frame decoded in full (no frame is read at a remembered layout), so
    the planned completion compares the deposit with the seed tensor by tensor (its
    ``_SmallPlan`` worked out again whenever the seed's layout changes)."""
    version, ranks, deposits, _ = _cases()[name]
    general, _ = _run(version, ranks, deposits, False, monkeypatch)
    planned, _ = _run(version, ranks, deposits, True, monkeypatch, remembered=False)
    assert planned == general


@pytest.mark.parametrize("version", [2, 3])
def test_a_seed_read_at_a_remembered_layout_is_built_when_first_needed(version: int) -> None:
    """The seed's frame, not built when the seed is read at a remembered layout, is the frame
    the full decode gives (kind, weight, dtypes, shapes, payload bytes) when a path needs it."""
    seed = _blob(_layout(SMALL, 60, True), 0.375, RoundKind.CONTROL)
    fold = HostFold([0, 1], SALT, version=version)
    fold.deposit_frame(0, seed)
    assert fold.deposit_frame(1, seed) is not None  # one round: the layout is remembered
    fold.deposit_frame(0, seed)
    rnd = fold._round
    assert rnd is not None and rnd.seed_frame is None
    want = decode_round_frame(seed, SALT)[0]
    got = rnd.seed
    assert got == want and got.weight == 0.375 and got.kind is RoundKind.CONTROL
    assert [(t.dtype, t.shape, bytes(t.data)) for t in got.tensors] == [
        (t.dtype, t.shape, bytes(t.data)) for t in want.tensors]
    assert rnd.seed is got  # built once


def _resigned(data: bytearray) -> bytes:
    mac = new_mac(SALT)
    mac.update(bytes(data[:-8]))
    return bytes(data[:-8]) + mac.digest()[:8]


def _hostile() -> dict[str, bytes]:
    """Variants of a deposit at the SMALL layout, each differing from it in one field (signed
    again after the change, but for the tag's and the lengths' variants)."""
    good = _blob(_layout(SMALL, 1), 2.5)
    heads, at = [], 17  # per tensor: its dtype byte's offset, ndim, data offset, nbytes
    for dtype, shape in SMALL:
        nbytes = int(np.prod(shape)) * (4 if dtype == F32 else 2)
        heads.append((at, len(shape), at + 2 + 4 * len(shape) + 8, nbytes))
        at = heads[-1][2] + nbytes

    def changed(fn: Any) -> bytes:
        data = bytearray(good)
        fn(data)
        return _resigned(data)

    def weight(w: float) -> Any:
        return lambda d: struct.pack_into("<d", d, 9, w)

    out = {
        "payload byte": changed(lambda d: d.__setitem__(heads[0][2] + 5, d[heads[0][2] + 5] ^ 1)),
        "magic": changed(lambda d: d.__setitem__(0, d[0] ^ 1)),
        "count + 1": changed(lambda d: struct.pack_into("<I", d, 4, len(SMALL) + 1)),
        "count - 1": changed(lambda d: struct.pack_into("<I", d, 4, len(SMALL) - 1)),
        "kind control": changed(lambda d: d.__setitem__(8, int(RoundKind.CONTROL))),
        "kind 7": changed(lambda d: d.__setitem__(8, 7)),
        "tag": good[:-1] + bytes([good[-1] ^ 1]),
        "one byte short": good[:-1],
        "half": good[:len(good) // 2],
        "header only": good[:6],
        "empty": b"",
        "bytes after": good + b"\x00\x01\x02",
    }
    for name, w in [("-0.0", -0.0), ("0", 0.0), ("nan", math.nan), ("inf", math.inf),
                    ("-1", -1.0), ("max", 1.7976931348623157e308)]:
        out[f"weight {name}"] = changed(weight(w))
    for ti in (0, 2, 4):
        head, ndim, _, nbytes = heads[ti]
        out[f"dtype {ti}"] = changed(lambda d, h=head: d.__setitem__(h, d[h] ^ 1))
        out[f"ndim {ti}"] = changed(lambda d, h=head: d.__setitem__(h + 1, d[h + 1] + 1))
        out[f"dim {ti}"] = changed(lambda d, h=head: d.__setitem__(h + 2, d[h + 2] ^ 1))
        for delta in (-1, 1, -nbytes):
            out[f"nbytes {ti} {delta:+d}"] = changed(
                lambda d, h=head, n=ndim, b=nbytes, x=delta: struct.pack_into(
                    "<Q", d, h + 2 + 4 * n, b + x))
    return out


#: where the variant is deposited, after a round of good frames (the layout is remembered):
#: ranks and the second round's deposits in order (rank, whether it deposits the variant)
_PLACES: dict[str, tuple[list[int], list[tuple[int, bool]]]] = {
    "last of two": ([0, 1], [(0, False), (1, True)]),
    "seed": ([0, 1], [(0, True), (1, False)]),
    "held": ([0, 1, 2], [(0, False), (1, True), (2, False)]),
    "last after a held one": ([0, 1, 2], [(0, False), (2, False), (1, True)]),
}


@pytest.mark.parametrize("premac", [False, True], ids=["mac", "premac"])
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("place", list(_PLACES))
@pytest.mark.parametrize("variant", list(_hostile()))
def test_a_deposit_differing_from_the_remembered_layout_gets_the_per_tensor_paths_outcome(
        variant: str, place: str, version: int, premac: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame read at a remembered layout (``read_known_frame``) is held or folded at the
    layout's offsets; one differing from the layout in any field the reader checks (or in
    one it does not: a payload byte, bytes after the frame) is, as seed, held deposit or last,
    given the outcome (HostFrame bytes, error class, id and fields, bookkeeping) of the
    per-tensor path with every frame decoded in full."""
    ranks, order = _PLACES[place]
    hostile = _hostile()[variant]
    blobs = {r: _blob(_layout(SMALL, 30 + r, r == 0), 1.0 + r) for r in ranks}
    deposits = [(r, blobs[r]) for r in ranks] + [(r, hostile if h else blobs[r])
                                                  for r, h in order]
    read = [0]
    real = host_fold._read_known

    def counted(*args: Any) -> Any:
        res = real(*args)
        read[0] += res is not None
        return res

    general, _ = _run(version, ranks, deposits, False, monkeypatch, premac)
    with monkeypatch.context() as m:
        m.setattr(host_fold, "_read_known", counted)
        planned, _ = _run(version, ranks, deposits, True, monkeypatch, premac)
    assert planned == general
    assert read[0] >= len(ranks) - 1  # the first round's later deposits at least


def _spy_hold(m: pytest.MonkeyPatch, hold: bool) -> list[int]:
    """Replace ``HostFold._hold`` under ``m``; ``hold=False`` holds no deposit (the per-tensor
    path throughout). Returns a one-item list counting the deposits held."""
    held = [0]
    original = HostFold._hold

    def spy(self: HostFold, *args: Any) -> bool:
        res = original(self, *args) if hold else False
        held[0] += res
        return res

    m.setattr(HostFold, "_hold", spy)
    return held


_DEATHS = {
    # two deposits held (ranks 1 and 2), then the last rank's death completes the round
    "completed by a death": [("deposit", 0), ("deposit", 1), ("deposit", 2), ("dead", 3)],
    # one held, a death that does not complete, then the last deposit
    "a death mid-round": [("deposit", 0), ("deposit", 1), ("dead", 3), ("deposit", 2)],
    # a held deposit's rank dies after depositing: its deposit still counts
    "a held rank dies": [("deposit", 0), ("deposit", 1), ("dead", 1), ("deposit", 2),
                         ("deposit", 3)],
}


@pytest.mark.parametrize("name", list(_DEATHS))
def test_rounds_with_held_deposits_and_deaths_give_the_per_tensor_paths_results(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = [_blob(_layout(SMALL, 20 + r, r == 1), 1.0 + r) for r in range(4)]

    def run(hold: bool) -> tuple[list[Any], int]:
        with monkeypatch.context() as m:
            held = _spy_hold(m, hold)
            fold = HostFold([0, 1, 2, 3], SALT)
            out: list[Any] = []
            for what, r in _DEATHS[name]:
                if what == "deposit":
                    out.append(_outcome(fold, r, blobs[r]))
                else:
                    res = fold.declare_dead_frame(r)
                    out.append(None if res is None else encode_round_frame_bytes(res, SALT)
                               if isinstance(res, RoundFrame) else ("verbatim", bytes(res)))
                out.append((fold.rounds_completed, fold.deposited, fold.alive_ranks))
        return out, held[0]

    (held_out, held), (general, none_held) = run(True), run(False)
    assert none_held == 0 and held > 0
    assert held_out == general
    assert general[-1][0] == 1  # the round completed


def test_a_deposit_after_sums_were_accumulated_is_not_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # version 3: rank 1's frame elides a tensor (another layout, merged tensor by tensor, so
    # the round has running sums); rank 2's frame, at the seed's layout, then merges at once
    full = [_blob(_layout(SMALL, 50 + r, r == 0), 1.0 + r) for r in range(4)]
    part = _layout(SMALL, 51)
    part[1] = TensorPayload.elide(*SMALL[1])
    deposits = [*enumerate(full), (0, full[0]), (1, _blob(part)), (2, full[2]), (3, full[3])]

    def run(hold: bool) -> tuple[list[Any], list[int]]:
        with monkeypatch.context() as m:
            held = _spy_hold(m, hold)
            if not hold:
                m.setattr(host_fold, "_read_known", lambda *args: None)
            fold = HostFold([0, 1, 2, 3], SALT, version=3)
            out, counts = [], []
            for r, blob in deposits:
                out.append(_outcome(fold, r, blob))
                counts.append(held[0])
        return out, counts

    (held_out, counts), (general, _) = run(True), run(False)
    assert held_out == general and general[3][0] == general[7][0] == "frame"
    assert counts == [0, 1, 2, 2, 2, 2, 2, 2]


@pytest.mark.parametrize("ranks", [3, 4])
def test_a_deposit_at_a_layout_read_again_merges_the_held_deposits_first(
        ranks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the codec forgets the seed's layout after rank 1's deposit was held: rank 2's frame (same
    # metadata) is walked again into another layout object, so it is merged tensor by tensor,
    # after the held deposit, in deposit order (the sums' order decides their last bits)
    from flodl_proto.codec import _walk

    blobs = [_blob(_layout(SMALL, 40 + r, r == 2), 0.5 + r) for r in range(ranks)]

    def run(hold: bool) -> tuple[list[Any], int]:
        with monkeypatch.context() as m:
            held = _spy_hold(m, hold)
            fold = HostFold(list(range(ranks)), SALT)
            out = []
            for r in range(ranks):
                if r == 2:
                    m.setattr(_walk, "_layouts", ())
                out.append(_outcome(fold, r, blobs[r]))
        return out, held[0]

    (held_out, held), (general, none_held) = run(True), run(False)
    assert none_held == 0 and held == 1
    assert held_out == general
    assert general[-1][0] == "frame"


def test_the_planned_sums_are_the_reference_sums() -> None:
    """Element by element ``(0.0 + seed) + deposit`` in f32, encoded in the tensor's dtype."""
    seed, dep = _layout(SMALL, 0, True), _layout(SMALL, 1)
    fold = HostFold([0, 1], SALT)
    fold.deposit_frame(0, _blob(seed, 0.5))
    out = fold.deposit_frame(1, _blob(dep, 0.25))
    assert isinstance(out, RoundFrame) and out.weight == 0.75 and out.kind is RoundKind.MODEL
    for s, d, o in zip(seed, dep, out.tensors, strict=True):
        assert (o.dtype, o.shape) == (s.dtype, s.shape)
        if s.dtype == F32:
            with np.errstate(all="ignore"):
                ref = (np.float32(0.0) + np.frombuffer(s.data, "<f4")) + np.frombuffer(d.data,
                                                                                         "<f4")
            assert o.data.tobytes() == ref.astype("<f4").tobytes()
        else:
            def wide(p: TensorPayload) -> np.ndarray:
                return (np.frombuffer(p.data, "<u2").astype("<u4") << 16).view("<f4")
            with np.errstate(all="ignore"):
                total = (np.float32(0.0) + wide(s)) + wide(d)
            assert o.data.tobytes() == bf16_from_f32(total).astype("<u2").tobytes()


@pytest.mark.parametrize(("key", "version", "ceiling", "eligible"), [
    (((F32, (4,), 16), (BF16, (2, 3), 12)), 2, 1 << 30, True),
    (((F32, (4,), 16),), 2, 15, False),  # above the ceiling
    (((F32, (4,), 16),), 2, 16, True),  # exactly the ceiling
    (((F32, (4,), 16), (BF16, (2, 3), 12)), 2, 28, True),  # every tensor's bytes count
    (((F32, (4,), 16), (BF16, (2, 3), 12)), 2, 27, False),
    ((), 2, 1 << 30, False),  # no tensors: the seed ships verbatim
    (((F32, (0,), 0),), 2, 1 << 30, True),
    (((F32, (0,), 0),), 3, 1 << 30, False),  # version 3: read as elided
    (((F32, (4,), 8),), 2, 1 << 30, False),  # byte count disagrees
    (((7, (4,), 16),), 2, 1 << 30, False),  # unknown dtype
    (((F32, (K.SMALL_ELEMS,), 4 * K.SMALL_ELEMS),), 2, 1 << 30, False),  # not small
])
def test_the_small_plan_names_what_it_covers(key: Any, version: int, ceiling: int,
                                              eligible: bool) -> None:
    plan = _SmallPlan(key, version, ceiling)
    assert plan.eligible is eligible
    if eligible and key == ((F32, (4,), 16), (BF16, (2, 3), 12)):
        assert plan.runs == [(0, 1, 4, F32, K.F32, [((4,), 0, 16)]),
                             (1, 2, 6, BF16, K.U16, [((2, 3), 0, 12)])]
    if not eligible:
        assert plan.runs == []


def test_alive_and_deposited_questions() -> None:
    fold = HostFold([3, 1, 2], SALT)
    assert fold.alive_ranks == (1, 2, 3) and fold.is_alive(2) and not fold.is_alive(0)
    assert not fold.has_deposited(1)
    fold.deposit_frame(1, _blob(_layout(OTHER, 1)))
    assert fold.has_deposited(1) and not fold.has_deposited(2)
    fold.declare_dead_frame(2)
    assert fold.alive_ranks == (1, 3) and not fold.is_alive(2)
    fold.declare_dead_frame(9)  # any rank id is accepted
    assert fold.alive_ranks == (1, 3)
    assert fold.deposit_frame(3, _blob(_layout(OTHER, 3))) is not None
    assert not fold.has_deposited(1) and fold.rounds_completed == 1


UNIFORM = [(F32, (64,)), (F32, (8, 8)), (F32, (64,)), (BF16, (32,)), (BF16, (32,))]


@pytest.mark.parametrize("spec", [SMALL, OTHER, UNIFORM, [(BF16, (5,))] * 3],
                         ids=["mixed", "other", "uniform", "bf16"])
@pytest.mark.parametrize("version", [2, 3])
def test_rounds_at_a_remembered_layout_fold_at_its_offsets(
        spec: list[tuple[int, tuple[int, ...]]], version: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Round after round of one layout: every round after the first is folded from the two
    frames' buffers at the layout plan's offsets (``_LayoutPlan.views``), and every HostFrame is
    the one the tensor-by-tensor planned path gives (special values included)."""
    rounds = [(_blob(_layout(spec, 2 * k, True), 0.5 + k),
               _blob(_layout(spec, 2 * k + 1), 0.25)) for k in range(4)]

    def run(remembered: bool) -> tuple[list[bytes], int]:
        viewed = 0
        real = _LayoutPlan.views

        def counted(*args: Any) -> Any:
            nonlocal viewed
            viewed += 1
            return real(*args)

        with monkeypatch.context() as m:
            m.setattr(_LayoutPlan, "views", staticmethod(counted))
            if not remembered:
                m.setattr(host_fold, "_known_layout", lambda *a: None)
                m.setattr(host_fold, "_read_known", lambda *a: None)
            fold = HostFold([0, 1], SALT, version=version)
            out = []
            for a, b in rounds:
                assert fold.deposit_frame(0, a, premac=frame_premac(a, SALT)) is None
                res = fold.deposit_frame(1, b, premac=frame_premac(b, SALT))
                assert isinstance(res, RoundFrame)
                out.append(encode_round_frame_bytes(res, SALT))
        return out, viewed

    at_offsets, viewed = run(True)
    by_tensor, not_viewed = run(False)
    assert at_offsets == by_tensor and not_viewed == 0
    runs = len(_LayoutPlan(_Walked(spec), version, 1 << 30).runs)
    assert runs > 0 and viewed == 2 * runs * len(rounds)


class _Walked:
    """A remembered layout as ``_LayoutPlan`` reads it: kind and per tensor ``(dtype, shape,
    start, stop)`` (offsets as a frame of 17 header bytes and 1-D heads of 14 bytes has them)."""

    def __init__(self, spec: list[tuple[int, tuple[int, ...]]]) -> None:
        entries, at = [], 17
        for dtype, shape in spec:
            at += 2 + 4 * len(shape) + 8
            n = int(np.prod(shape)) * (4 if dtype == F32 else 2)
            entries.append((dtype, shape, at, at + n))
            at += n
        self.entries = tuple(entries)
        self.kind = int(RoundKind.MODEL)


def test_the_layout_plan_views_a_run_of_one_length_as_rows() -> None:
    lay = _Walked([(F32, (4,)), (F32, (4,)), (F32, (4,)), (BF16, (3,)), (BF16, (2,))])
    plan = _LayoutPlan(lay, 2, 1 << 30)
    (f32, _, total32, _, where32), (bf16, _, total16, _, where16) = plan.runs
    assert (f32, total32, where32) == (F32, 12, (31, 3, 4, 30))
    assert (bf16, total16, where16) == (BF16, 5, [(121, 3), (141, 2)])
    buf = memoryview(bytes(range(256)) * 2)
    rows = plan.views(buf, K.F32, where32)
    assert rows.shape == (3, 4)
    for r in range(3):
        assert rows[r].tobytes() == bytes(buf[31 + 30 * r:31 + 30 * r + 16])
    assert [v.tobytes() for v in plan.views(buf, K.U16, where16)] == [bytes(buf[121:127]),
                                                                       bytes(buf[141:145])]
    assert _LayoutPlan(_Walked([(F32, (0,)), (F32, (4,))]), 2, 1 << 30).runs == []


@pytest.mark.parametrize("n", [0, 1, 8, 9, 64, 4096])
def test_frame_premac_is_the_read_plans_digest(n: int) -> None:
    buf = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    plan = frame_macs(n, SALT)
    if plan.mac is not None:
        plan.mac.update(memoryview(buf)[plan.start:plan.stop])
    assert frame_premac(buf, SALT) == plan.premac()
    assert (frame_premac(buf, SALT) is None) is (n <= 8)


def test_skip_drops_exactly_the_bytes_sent() -> None:
    bufs: list[Any] = [b"abc", memoryview(b"defg"), bytearray(b""), np.arange(3, dtype="<u2")]
    whole = b"".join(bytes(memoryview(b).cast("B")) for b in bufs)
    for sent in range(len(whole) + 1):
        rest = _netio_send.skip_sent(bufs, sent)
        assert b"".join(bytes(r) for r in rest) == whole[sent:]
    assert _netio_send.skip_sent(bufs, 0) is bufs
    assert _netio_send.buffers_nbytes(bufs) == len(whole) == 13


def test_send_at_once_writes_whole_or_reports_what_it_wrote() -> None:
    a, b = socket.socketpair()
    try:
        bufs: list[Any] = [b"\x01\x02", memoryview(np.arange(100, dtype="<f4")).cast("B")]
        n = _netio_send.buffers_nbytes(bufs)
        assert _netio_send.send_at_once(a, bufs, n) == n
        got = b""
        while len(got) < n:
            got += b.recv(n - len(got))
        assert got == b"".join(bytes(x) for x in bufs)
        many: list[Any] = [b"x"] * (_netio_send.DIRECT_IOVECS + 1)
        assert _netio_send.send_at_once(a, many, len(many)) == 0  # left to the general write
        # a full send buffer: part (or nothing) now, the rest by send_all, bytes in order
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        big: list[Any] = [bytes(range(256)) * 4096]
        sent = _netio_send.send_at_once(a, big, len(big[0]))
        assert 0 <= sent < len(big[0])
        b.close()
        assert _netio_send.send_at_once(a, [b"more"], 4) == 0  # a failed socket: no raise
    finally:
        a.close()
        b.close()


def _drain(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


@pytest.mark.parametrize("size", [100, _netio_send.PARALLEL_FAN_OUT_MIN])
def test_write_to_each_writes_every_peer_and_reports_a_failed_one(size: int) -> None:
    """Below the parallel size one after the other, from it one thread per peer after the
    first: each live peer gets prefix + payload, a closed one is reported and counts nothing."""
    pairs = [socket.socketpair() for _ in range(3)]
    payload = memoryview(bytes(range(256)) * (size // 256 + 1))[:size]
    prefix = size.to_bytes(4, "little")
    pairs[1][1].close()  # peer 1 is gone
    failed: list[int] = []
    results: dict[int, bytes] = {}

    def reader(i: int) -> None:
        results[i] = _drain(pairs[i][1], 4 + size)

    readers = [threading.Thread(target=reader, args=(i,)) for i in (0, 2)]
    for t in readers:
        t.start()
    try:
        written = _netio_send.write_to_each([(i, pairs[i][0]) for i in range(3)], prefix, payload,
                                       lambda ident, err: failed.append(ident))
        for t in readers:
            t.join()
        assert failed == [1]
        assert written == 2 * (4 + size)
        assert results == {0: prefix + bytes(payload), 2: prefix + bytes(payload)}
    finally:
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.parametrize("n", [64, _netio_recv.PARALLEL_MAC_MIN])
def test_read_frame_into_gives_the_plans_premac(n: int) -> None:
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    a, b = socket.socketpair()
    try:
        t = threading.Thread(target=a.sendall, args=(data,))
        t.start()
        view = memoryview(bytearray(n))
        got, premac = _netio_recv.read_frame_into(b, view, SALT)
        t.join()
        assert got == n and bytes(view) == data
        assert premac == frame_premac(data, SALT)
        a.sendall(data[:10])
        a.close()
        got, _ = _netio_recv.read_frame_into(b, memoryview(bytearray(n)), SALT)
        assert got == 10  # cut short: the caller sees fewer bytes
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_sum_small_batch_of_rows_is_the_list_forms_sum(dtype: int) -> None:
    """Row-stacked contributions (a 2-D array a contribution) give the bytes of the same tensors
    handed over one by one, special values included."""
    rng = np.random.default_rng(dtype)
    a = rng.standard_normal((2, 3, 40)).astype(np.float32)
    a[0, 0, :4] = [np.nan, -0.0, np.inf, -np.inf]
    a[1, 0, 1] = -0.0
    if dtype == BF16:
        rows = [(x.view("<u4") >> 16).astype("<u2") for x in a]
    else:
        rows = list(a)
    ws = K.Workspace()
    with np.errstate(all="ignore"):
        listed = K.sum_small_batch([list(r) for r in rows], dtype, 120, None, ws).tobytes()
        stacked = K.sum_small_batch(rows, dtype, 120, None, ws).tobytes()
    assert stacked == listed

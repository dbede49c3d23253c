"""The relay fold's rule for version 3 rounds in which some deposits are elided, case by case
(protocol.md, "Relay fold barrier"): the round's first deposit is the seed, kept verbatim; the
first payload with bytes in a later deposit promotes the whole seed to f32 running sums
(``+0.0 + seed + ...``, an elided seed tensor adding nothing); a round that never promoted ships
the seed's tensors verbatim with the summed weight, a promoted one ships every tensor's sums
re-encoded (a tensor every deposit elided then ships as zero bytes).

The values tell the two apart: a verbatim seed keeps f32 ``-0.0`` and the bf16 signalling NaN
``0x7F81``; a re-encoded one turns them into ``+0.0`` and the quiet ``0x7FC1``."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec import (
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.fsm.events import SendUpstream, UpstreamKind
from flodl_proto.reduce import HostFold

from .relay_core_util import connected_core

SALT = bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0")

#: per dtype tag: the seed's full tensor S, a later full tensor L, the seed promoted
#: (+0.0 + S), S + L summed from +0.0, L alone summed from +0.0, and two zeros (hex payloads)
VALUES = {
    0: {"S": "00000080" "0000c03f",     # [-0.0, 1.5]
        "L": "00001040" "00000080",     # [2.25, -0.0]
        "0+S": "00000000" "0000c03f",   # [+0.0, 1.5]
        "S+L": "00001040" "0000c03f",   # [2.25, 1.5]
        "0+L": "00001040" "00000000",   # [2.25, +0.0]
        "zeros": "00000000" "00000000"},
    1: {"S": "0080" "817f",             # [-0.0, signalling NaN 0x7F81]
        "L": "1040" "0080",             # [2.25, -0.0]
        "0+S": "0000" "c17f",           # [+0.0, quiet NaN 0x7FC1]
        "S+L": "1040" "c17f",           # [2.25, quiet NaN 0x7FC1]
        "0+L": "1040" "0000",           # [2.25, +0.0]
        "zeros": "0000" "0000"},
}


def _payload(dtype: int, value: str | None) -> TensorPayload:
    """A 2-element tensor: ``value`` names a payload of VALUES, None an elided one."""
    data = b"" if value is None else bytes.fromhex(VALUES[dtype][value])
    return TensorPayload(dtype, (2,), data)


def _frame(dtype: int, weight: float, *values: str | None) -> bytes:
    return encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, weight, [
        _payload(dtype, v) for v in values]), SALT)


# Each case: deposits in arrival order (weight, one value per tensor: a VALUES key or None for
# elided), then the HostFrame's tensors and weight.
CASES = {
    # two ranks
    "full-then-elided": ([(1.0, ["S"]), (0.0, [None])], ["S"], 1.0),
    "full-then-elided-weighted": ([(1.0, ["S"]), (0.5, [None])], ["S"], 1.5),
    "elided-then-full": ([(0.0, [None]), (1.0, ["L"])], ["0+L"], 1.0),
    "elided-then-elided": ([(0.0, [None]), (0.0, [None])], [None], 0.0),
    "full-then-full": ([(1.0, ["S"]), (0.5, ["L"])], ["S+L"], 1.5),
    "seed-neg-zero-weight-then-elided": ([(-0.0, ["S"]), (0.0, [None])], ["S"], 0.0),
    # three ranks
    "full-elided-elided": ([(1.0, ["S"]), (0.25, [None]), (0.25, [None])], ["S"], 1.5),
    "elided-full-elided": ([(0.0, [None]), (1.0, ["S"]), (0.0, [None])], ["0+S"], 1.0),
    "elided-elided-full": ([(0.0, [None]), (0.0, [None]), (1.0, ["S"])], ["0+S"], 1.0),
    "full-elided-full": ([(1.0, ["S"]), (0.0, [None]), (1.0, ["L"])], ["S+L"], 2.0),
    "full-full-elided": ([(1.0, ["S"]), (1.0, ["L"]), (0.5, [None])], ["S+L"], 2.5),
    "elided-elided-elided": ([(0.0, [None]), (0.0, [None]), (0.0, [None])], [None], 0.0),
    # two tensors: elision is per tensor, promotion is the whole seed's
    "mixed-seed-then-elided": ([(1.0, ["S", None]), (0.0, [None, None])], ["S", None], 1.0),
    "mixed-seed-then-other-tensor": ([(1.0, ["S", None]), (1.0, [None, "L"])],
                                     ["0+S", "0+L"], 2.0),
    "elided-elided-then-one-tensor": ([(0.0, [None, None]), (0.0, [None, None]),
                                       (1.0, ["S", None])], ["0+S", "zeros"], 1.0),
}


def _expected(dtype: int, case: str) -> bytes:
    _, tensors, weight = CASES[case]
    return _frame(dtype, weight, *tensors)


@pytest.mark.parametrize("dtype", [0, 1], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_host_fold_ships_the_rule_of_its_deposits(case: str, dtype: int) -> None:
    deposits, tensors, weight = CASES[case]
    fold = HostFold(range(len(deposits)), SALT, version=3)
    outs = [fold.deposit(rank, _frame(dtype, w, *values))
            for rank, (w, values) in enumerate(deposits)]
    assert outs[:-1] == [None] * (len(deposits) - 1)
    assert outs[-1] == _expected(dtype, case)
    frame, _ = decode_round_frame(outs[-1], SALT)
    assert np.float64(frame.weight).tobytes() == np.float64(weight).tobytes()
    assert [bytes(t.data).hex() for t in frame.tensors] == [
        "" if v is None else VALUES[dtype][v] for v in tensors]


@pytest.mark.parametrize("dtype", [0, 1], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", ["full-then-elided", "full-then-elided-weighted",
                                  "seed-neg-zero-weight-then-elided", "full-elided-elided",
                                  "elided-elided-full", "mixed-seed-then-other-tensor"])
def test_the_relay_core_sends_that_host_frame_upstream(case: str, dtype: int) -> None:
    """The same HostFrame payload leaves the relay core, from blobs the runner reuses."""
    deposits, _, _ = CASES[case]
    ranks = tuple(range(len(deposits)))
    core = connected_core(ranks, len(ranks), 3, SALT)
    blobs = [bytearray(_frame(dtype, w, *values)) for w, values in deposits]
    sent = [a.buffers for rank, blob in enumerate(blobs) for a in core.rank_frame(rank, blob)
            if isinstance(a, SendUpstream) and a.kind is UpstreamKind.HOST_FRAME]
    for blob in blobs:  # the runner reads its next blobs into these buffers
        blob[:] = bytes(len(blob))
    (buffers,) = sent
    assert b"".join(bytes(b) for b in buffers)[25:] == _expected(dtype, case)


@pytest.mark.parametrize("version", [2, 3])
def test_a_round_of_frames_without_tensors_ships_the_summed_weight(version: int) -> None:
    """Nothing to promote, so the seed ships, under the weight every deposit added to."""
    fold = HostFold([0, 1, 2], SALT, version=version)
    for rank, weight in enumerate([1.0, 0.5]):
        assert fold.deposit(rank, encode_round_frame_bytes(
            RoundFrame(RoundKind.CONTROL, weight, []), SALT)) is None
    out = fold.deposit(2, encode_round_frame_bytes(RoundFrame(RoundKind.CONTROL, 0.25, []), SALT))
    assert out == encode_round_frame_bytes(RoundFrame(RoundKind.CONTROL, 1.75, []), SALT)

"""The tests' own reduce (``tests/reference.py``) against the golden ``reduce`` vectors, so the
expected values it gives the controller, relay and end-to-end tests are themselves pinned."""

from __future__ import annotations

import json
from pathlib import Path
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

from .reference import BF16_TAG, F32_TAG, bf16_bits, encode, mass, ref_reduce, ref_sum

BUNDLED = Path(__file__).resolve().parent.parent / "flodl_proto" / "_vectors"


def _ok_cases() -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for path, version in ((BUNDLED / "reduce.json", 3), (BUNDLED / "v2" / "reduce.json", 2)):
        doc = json.loads(path.read_text())
        assert doc["protocol_version"] == version
        out += [(c["id"], version, c) for c in doc["cases"] if c["expect"] == "ok"]
    return out


CASES = _ok_cases()


def test_every_ok_reduce_vector_is_checked() -> None:
    assert len(CASES) == 22


@pytest.mark.parametrize(("cid", "version", "case"), CASES, ids=[c[0] for c in CASES])
def test_reference_matches_the_reduce_vectors(cid: str, version: int,
                                              case: dict[str, Any]) -> None:
    salt = bytes.fromhex(case["salt"])
    frames: list[RoundFrame | None] = []
    for item in case["inputs"]:
        if item is None:
            frames.append(None)
            continue
        res = decode_round_frame(bytes.fromhex(item["bytes"]), salt)
        assert isinstance(res, tuple)
        frames.append(res[0])
    fn = ref_reduce if case["op"] == "reduce_realized_work" else ref_sum
    with np.errstate(all="ignore"):
        got = fn(frames, version=version)
    assert encode_round_frame_bytes(got, salt).hex() == case["output"]["bytes"], cid


def _f32(x: float) -> TensorPayload:
    return TensorPayload(F32_TAG, [1], encode([np.float32(x)], F32_TAG))


def test_reference_rounding_points() -> None:
    # bf16: round to nearest, ties to even (0x3F808000 is a tie between 0x3F80 and 0x3F81)
    assert bf16_bits(np.float32(np.frombuffer(bytes.fromhex("0080803f"), "<f4")[0])) == 0x3F80
    assert bf16_bits(np.float32(np.frombuffer(bytes.fromhex("0180803f"), "<f4")[0])) == 0x3F81
    assert bf16_bits(np.float32(np.frombuffer(bytes.fromhex("0080813f"), "<f4")[0])) == 0x3F82
    # the mass starts from -0.0 and the scale is f32(1/w), multiplied
    neg = RoundFrame(RoundKind.MODEL, -0.0, [_f32(1.0)])
    assert str(mass([neg, neg])) == "-0.0"
    thirds = ref_reduce([RoundFrame(RoundKind.MODEL, 3.0, [_f32(10.0)])])
    assert thirds.tensors[0].array().tolist() == [3.3333334922790527]  # 10 * f32(1/3)
    # a bf16 sum is re-encoded to nearest-even (1 + 2**-8 is a tie: 1.0)
    b = [RoundFrame(RoundKind.MODEL, w, [TensorPayload(BF16_TAG, [1],
                                                       encode([np.float32(x)], BF16_TAG))])
         for x, w in ((1.0, 1.0), (0.00390625, 0.0))]
    assert bytes(ref_reduce(b).tensors[0].data) == (0x3F80).to_bytes(2, "little")

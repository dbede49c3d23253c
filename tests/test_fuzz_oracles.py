"""The fuzz harnesses find bugs planted in the code they drive, from their committed seeds: each
case patches one check of the package the way an off-by-one would break it, then runs one seed
of ``fuzz/corpus/<target>/`` through the target's oracle, which must raise a ``Finding`` naming
what it saw (unpatched, every seed passes: ``test_fuzz_corpus.py``)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from fuzz.harnesses.common import Finding

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"


_NO_FINITENESS_CHECK = SimpleNamespace(isfinite=lambda x: True)


@pytest.mark.parametrize(("module", "name", "value", "target", "seed", "finding"), [
    # the tensor cap one too high: 65,537 tensors read on (the walker and the decoder share it)
    ("flodl_proto.codec._walk", "MAX_ROUND_FRAME_TENSORS", 65537, "round_frame",
     "seed-tensor-cap-plus-one",
     "header f1170df101000100 gave None / RemoteTruncatedInput('cluster_controller: frame kind "
     "read failed: failed to fill whole buffer (offset 8)'); the spec's header checks say "
     "frame.too_many_tensors"),
    # one too low: a frame of exactly 65,536 tensors refused
    ("flodl_proto.codec._walk", "MAX_ROUND_FRAME_TENSORS", 65535, "round_frame",
     "seed-tensor-cap-no-tensors",
     "header f1170df10000010000000000000000f03f gave None / RemoteLimitExceeded('cluster_"
     "controller: frame claims 65536 tensors (> 65535); corrupt or hostile peer'); the spec's "
     "header checks say no header error"),
    # no finiteness check: an infinite weight read on, up to the tag
    ("flodl_proto.codec._walk", "math", _NO_FINITENESS_CHECK, "round_frame",
     "vec-round_frame__read__weight-pos-inf",
     "header f1170df10200000000000000000000f07f gave (RoundFrame(kind=RoundKind.MODEL, "
     "weight=inf, tensors=(TensorPayload(dtype=f32, shape=(2, 2), nbytes=16), TensorPayload("
     "dtype=bf16, shape=(3,), nbytes=6))), 79) / None; the spec's header checks say "
     "frame.bad_weight"),
    # the loopback stream's prefix read without its ceiling: a prefix of 1,025 under a 1 KiB
    # ceiling waits for its body, which is then read as a frame
    ("flodl_proto.codec.loopback_stream", "whole_len_prefix",
     lambda mv, ceiling: int.from_bytes(mv[:4], "little"), "loopback_stream",
     "seed-prefix-over-1kib-byte-by-byte",
     "LoopbackStream ended with ('failed', ('RemoteBadMagic', 'cluster_controller: frame magic "
     "0x00000000 != 0xf10d17f1')), one-shot readers with ('failed', ('RemoteLimitExceeded', "
     "'relay_mux: len-framed blob length 1025 exceeds the frame ceiling 1024; corrupt or "
     "hostile peer'))"),
], ids=["tensor-cap-plus-one", "tensor-cap-minus-one", "weight-not-checked-finite",
        "loopback-prefix-ceiling-not-checked"])
def test_a_planted_bug_is_a_finding(monkeypatch: pytest.MonkeyPatch, module: str, name: str,
                                    value: object, target: str, seed: str,
                                    finding: str) -> None:
    monkeypatch.setattr(importlib.import_module(module), name, value)
    harness = importlib.import_module(f"fuzz.harnesses.{target}")
    with pytest.raises(Finding) as e:
        harness.test_one_input((CORPUS / target / seed).read_bytes())
    assert str(e.value) == finding

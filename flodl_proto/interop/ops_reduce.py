"""Vector handlers for the reduce engine: ``reduce.json`` (ops ``reduce_realized_work``,
``sum_frames``), ``relay_fold.json`` (``relay_fold``), ``bf16.json`` (``bf16.from_f32``,
``bf16.to_f32``, ``payload.encode``, ``payload.scale``) and ``dead_ranks.json``
(``dead_ranks``). Purely data-driven: every field comes from the case."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..codec.mux import MuxRecord, RecordKind, encode_mux_record_bytes
from ..codec.round_frame import RoundFrame, decode_round_frame_or_eos, encode_round_frame_bytes
from ..membership import DeadRanks
from ..reduce import (
    HostFold,
    bf16_bits_to_f32_bits,
    bf16_from_f32,
    bf16_to_f32,
    encode_payload,
    f32_bits_to_bf16_bits,
    reduce_realized_work,
    scale_payload,
    sum_frames,
)
from .jsonio import compare_frame, expect_error, require
from .registry import VectorMismatch, op


def _bits(text: str) -> int:
    return int(text, 16)


def _decode(data: bytes, salt: bytes, what: str) -> RoundFrame:
    res = decode_round_frame_or_eos(data, salt)
    if not isinstance(res, tuple):
        raise VectorMismatch(f"{what}: decoding reported end of stream")
    return res[0]


def _inputs(case: dict[str, Any], salt: bytes) -> list[RoundFrame | None]:
    out: list[RoundFrame | None] = []
    for i, entry in enumerate(case["inputs"]):
        if entry is None:
            out.append(None)
            continue
        frame = _decode(bytes.fromhex(entry["bytes"]), salt, f"inputs[{i}]")
        if "frame" in entry:
            compare_frame(frame, entry["frame"], f"inputs[{i}].frame")
        out.append(frame)
    return out


def _check_output(case: dict[str, Any], got: RoundFrame, salt: bytes) -> bytes:
    want = case["output"]
    data = encode_round_frame_bytes(got, salt)
    require(data.hex() == want["bytes"], f"output bytes {data.hex()} != {want['bytes']}")
    compare_frame(got, want["frame"], "output.frame")
    compare_frame(_decode(data, salt, "output"), want["frame"], "output (re-read)")
    return data


@op("reduce_realized_work", "sum_frames", expects=("ok", "error"),
    fields={"salt": "hex", "inputs": "array of null or input"},
    ok_fields={"output": "output", "broadcast_record?": "hex"})
def _reduce(case: dict[str, Any], version: int) -> None:
    salt = bytes.fromhex(case["salt"])
    fold_sum = case["op"] == "sum_frames"

    def run() -> RoundFrame:
        frames = _inputs(case, salt)
        if fold_sum:
            accepted = [f for f in frames if f is not None]
            require(len(accepted) == len(frames), "sum_frames inputs must not contain null")
            return sum_frames(accepted, version=version)
        return reduce_realized_work(frames, version=version)

    if case["expect"] == "error":
        expect_error(case, run)
        return
    data = _check_output(case, run(), salt)
    if "broadcast_record" in case:
        rec = encode_mux_record_bytes(MuxRecord.broadcast(data), salt)
        require(rec.hex() == case["broadcast_record"],
                f"broadcast_record {rec.hex()} != {case['broadcast_record']}")


def _fold_problem(case: Mapping[str, Any]) -> str | None:
    """Why a relay fold case (its fields of their kinds) cannot be run, or None: an error case
    without steps (its last step is the one that fails; it read ``IndexError: list index out of
    range``)."""
    if case["expect"] == "error" and not case["steps"]:
        return "field 'steps' is an empty array; an error case's last step is the one that fails"
    return None


@op("relay_fold", expects=("ok", "error"),
    fields={"salt": "hex", "local_ranks": "array of u32", "steps": "array of fold_step",
            "records?": "array of fold_record"}, check=_fold_problem)
def _relay_fold(case: dict[str, Any], version: int) -> None:
    salt = bytes.fromhex(case["salt"])
    fold = HostFold(case["local_ranks"], salt, version=version)
    steps = case["steps"]
    shipped: list[bytes] = []

    def step(s: dict[str, Any]) -> bytes | None:
        if s["step"] == "deposit":
            return fold.deposit(s["rank"], bytes.fromhex(s["blob"]))
        if s["step"] == "declare_dead":
            return fold.declare_dead(s["rank"])
        raise VectorMismatch(f"unknown relay_fold step {s['step']!r}")

    error_case = case["expect"] == "error"
    for s in steps[:-1] if error_case else steps:
        out = step(s)
        if out is not None:
            shipped.append(out)
    if error_case:
        expect_error(case, lambda: step(steps[-1]))
    want = case.get("records", [] if not error_case else None)
    if want is None:
        return
    require(len(shipped) == len(want), f"{len(shipped)} records shipped, want {len(want)}")
    for i, (payload, rec) in enumerate(zip(shipped, want, strict=True)):
        require(rec["kind_byte"] == RecordKind.HOST_FRAME,
                f"records[{i}].kind_byte {rec['kind_byte']} is not a HostFrame")
        require(payload.hex() == rec["payload"], f"records[{i}].payload {payload.hex()} != "
                                                 f"{rec['payload']}")
        if "frame" in rec:
            compare_frame(_decode(payload, salt, f"records[{i}]"), rec["frame"],
                          f"records[{i}].frame")
        if "record_bytes" in rec:
            got = encode_mux_record_bytes(MuxRecord.host_frame(payload), salt)
            require(got.hex() == rec["record_bytes"],
                    f"records[{i}].record_bytes {got.hex()} != {rec['record_bytes']}")


@op("bf16.from_f32", fields={"f32_bits": "bits32", "bf16_bits": "bits16",
                             "bf16_as_f32_bits?": "bits32"})
def _bf16_from_f32(case: dict[str, Any], version: int) -> None:
    f32 = _bits(case["f32_bits"])
    got = f32_bits_to_bf16_bits(f32)
    require(got == _bits(case["bf16_bits"]), f"bf16 0x{got:04x} != {case['bf16_bits']}")
    # the array path (the one the fold uses) must agree with the scalar path
    arr = bf16_from_f32(np.array([f32], dtype=np.uint32).view(np.float32))
    require(int(arr[0]) == got, f"array path gives 0x{int(arr[0]):04x}")
    if "bf16_as_f32_bits" in case:
        back = bf16_bits_to_f32_bits(got)
        require(back == _bits(case["bf16_as_f32_bits"]),
                f"widened 0x{back:08x} != {case['bf16_as_f32_bits']}")


@op("bf16.to_f32", fields={"bf16_bits": "bits16", "f32_bits": "bits32"})
def _bf16_to_f32(case: dict[str, Any], version: int) -> None:
    b = _bits(case["bf16_bits"])
    got = bf16_bits_to_f32_bits(b)
    require(got == _bits(case["f32_bits"]), f"f32 0x{got:08x} != {case['f32_bits']}")
    arr = bf16_to_f32(np.array([b], dtype=np.uint16)).view(np.uint32)
    require(int(arr[0]) == got, f"array path gives 0x{int(arr[0]):08x}")


@op("payload.encode", expects=("ok", "error"),
    fields={"f32_bits": "array of bits32", "dtype": "int"}, ok_fields={"bytes": "hex"})
def _payload_encode(case: dict[str, Any], version: int) -> None:
    values = np.array([_bits(b) for b in case["f32_bits"]], dtype=np.uint32).view(np.float32)
    if case["expect"] == "error":
        expect_error(case, lambda: encode_payload(case["dtype"], values))
        return
    got = encode_payload(case["dtype"], values)
    require(got.hex() == case["bytes"], f"bytes {got.hex()} != {case['bytes']}")


@op("payload.scale", expects=("ok", "error"),
    fields={"factor_f32_bits": "bits32", "bytes": "hex", "dtype": "int"},
    ok_fields={"out_bytes": "hex"})
def _payload_scale(case: dict[str, Any], version: int) -> None:
    factor = np.array([_bits(case["factor_f32_bits"])], dtype=np.uint32).view(np.float32)[0]
    data = bytes.fromhex(case["bytes"])
    if case["expect"] == "error":
        expect_error(case, lambda: scale_payload(case["dtype"], data, factor))
        return
    got = scale_payload(case["dtype"], data, factor)
    require(got.hex() == case["out_bytes"], f"out_bytes {got.hex()} != {case['out_bytes']}")


@op("dead_ranks", fields={"world_size": "u32", "steps": "array of ledger_step"})
def _dead_ranks(case: dict[str, Any], version: int) -> None:
    ledger = DeadRanks(case["world_size"])
    for i, s in enumerate(case["steps"]):
        call = s["call"]
        result: object
        if call == "declare_dead":
            ledger.declare_dead(s["rank"])
            continue
        if call == "is_dead":
            result = ledger.is_dead(s["rank"])
        elif call == "dead_count":
            result = ledger.dead_count()
        elif call == "world_size":
            result = ledger.world_size()
        else:
            raise VectorMismatch(f"steps[{i}]: unknown call {call!r}")
        if "result" in s:
            require(result == s["result"], f"steps[{i}] {call}: got {result!r}, "
                                           f"want {s['result']!r}")

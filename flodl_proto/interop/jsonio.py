"""Conversions between codec objects and the shared vector schema's JSON objects.

Schema: ``flodl-oracle-vectors/1`` (see the vector README): a *Frame* is ``{kind, kind_byte,
weight, weight_bits, tensors: [{dtype, shape, nbytes, elided, data, values?}]}``; a *Record* is
``{kind, kind_byte, rank, payload | control}``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ..codec.mux import (
    ControlMessage,
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
)
from ..codec.round_frame import Dtype, RoundFrame, RoundKind, TensorPayload
from ..errors import ProtocolError
from ..spec import CONTROL_VARIANTS, ELEMENT_SIZE
from .registry import VectorMismatch

__all__ = [
    "control_from_json",
    "control_to_json",
    "expect_error",
    "f64_bits",
    "frame_from_json",
    "frame_to_json",
    "record_from_json",
    "record_to_json",
    "require",
]

_RECORD_NAMES = {
    RecordKind.DATA: "data",
    RecordKind.CONTROL: "control",
    RecordKind.HOST_FRAME: "host_frame",
    RecordKind.BROADCAST: "broadcast",
}


def f64_bits(x: float) -> str:
    """``0x``-prefixed 16-digit hex of an f64's bit pattern.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    return "0x{:016x}".format(struct.unpack("<Q", struct.pack("<d", x))[0])


def _f64_from_bits(text: str) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", int(text, 16)))[0])


def frame_from_json(obj: dict[str, Any]) -> RoundFrame:
    """Build a :class:`RoundFrame` from a vector *Frame* (``weight_bits`` is authoritative).

    Payloads are taken as given, whatever their byte count (``check_nbytes=False``): vectors
    pin what upstream's writer writes and its readers accept, a count that disagrees with the
    shape included (``round_frame/roundtrip/nbytes-shape-mismatch-accepted``).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    tensors = [
        TensorPayload(t["dtype"], t["shape"], bytes.fromhex(t["data"])) for t in obj["tensors"]
    ]
    return RoundFrame(RoundKind(obj["kind_byte"]), _f64_from_bits(obj["weight_bits"]), tensors,
                      check_nbytes=False)


def _values(t: TensorPayload) -> list[float] | None:
    es = ELEMENT_SIZE.get(t.dtype)
    if es is None or t.nbytes != t.numel * es or t.nbytes == 0:
        return None
    flat = np.frombuffer(t.data, dtype=Dtype(t.dtype).numpy)
    vals = [float(v) for v in flat.astype(np.float32)]
    return vals if all(math.isfinite(v) for v in vals) else None


def frame_to_json(frame: RoundFrame) -> dict[str, Any]:
    """Render a :class:`RoundFrame` as a vector *Frame* object.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    tensors = []
    for t in frame.tensors:
        obj: dict[str, Any] = {
            "dtype": t.dtype, "shape": list(t.shape), "nbytes": t.nbytes,
            "elided": t.elided, "data": bytes(t.data).hex(),
        }
        vals = _values(t)
        if vals is not None:
            obj["values"] = vals
        tensors.append(obj)
    return {
        "kind": frame.kind.name.lower(), "kind_byte": int(frame.kind),
        "weight": frame.weight if math.isfinite(frame.weight) else None,
        "weight_bits": f64_bits(frame.weight), "tensors": tensors,
    }


def compare_frame(got: RoundFrame, want: dict[str, Any], what: str = "frame") -> None:
    """Raise :class:`VectorMismatch` unless ``got`` matches the vector *Frame* ``want``."""
    g = frame_to_json(got)
    for key in ("kind", "kind_byte", "weight_bits"):
        require(g[key] == want[key], f"{what}.{key}: got {g[key]!r}, want {want[key]!r}")
    if "weight" in want:  # the number the bits stand for (null: not finite)
        require(g["weight"] == want["weight"],
                f"{what}.weight: got {g['weight']!r}, want {want['weight']!r}")
    require(len(g["tensors"]) == len(want["tensors"]),
            f"{what}: {len(g['tensors'])} tensors, want {len(want['tensors'])}")
    for i, (gt, wt) in enumerate(zip(g["tensors"], want["tensors"], strict=True)):
        for key in ("dtype", "shape", "nbytes", "elided", "data"):
            require(gt[key] == wt[key], f"{what}.tensors[{i}].{key}: got {gt[key]!r}, "
                                        f"want {wt[key]!r}")
        if "values" in wt:
            require(gt.get("values") == wt["values"], f"{what}.tensors[{i}].values differ")


def control_to_json(msg: ControlMessage, version: int) -> dict[str, Any]:
    """Render a control message as the vector schema's ``control`` object.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    name = type(msg).__name__
    obj: dict[str, Any] = {"variant": name, "variant_index": CONTROL_VARIANTS[name]}
    if isinstance(msg, Hello):
        obj["host"] = msg.host
        obj["ranks"] = list(msg.ranks)
        if version >= 3:
            obj["model_sigs"] = [s.hex() for s in msg.model_sigs]
    elif isinstance(msg, RankExit | DeclareDead):
        obj["rank"] = msg.rank
    return obj


def control_from_json(obj: dict[str, Any]) -> ControlMessage:
    """Build a control message from the vector schema's ``control`` object.

    Raises:
        VectorMismatch: the object names no known variant (``Hello``, ``HelloAck``, ``RankExit``,
            ``DeclareDead``).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    v = obj["variant"]
    if v == "Hello":
        sigs = [bytes.fromhex(s) for s in obj.get("model_sigs", [])]
        return Hello(obj["host"], obj["ranks"], sigs)
    if v == "HelloAck":
        return HelloAck()
    if v == "RankExit":
        return RankExit(obj["rank"])
    if v == "DeclareDead":
        return DeclareDead(obj["rank"])
    raise VectorMismatch(f"unknown control variant {v!r}")


def record_from_json(obj: dict[str, Any], version: int) -> MuxRecord:
    """Build a :class:`MuxRecord` from a vector *Record* object.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    kind = RecordKind(obj["kind_byte"])
    if kind is RecordKind.CONTROL:
        return MuxRecord.control_msg(control_from_json(obj["control"]), version)
    payload = bytes.fromhex(obj["payload"])
    if kind is RecordKind.DATA:
        return MuxRecord.data(obj["rank"], payload)
    return MuxRecord(kind, obj.get("rank", 0), memoryview(payload))


def record_to_json(rec: MuxRecord, version: int) -> dict[str, Any]:
    """Render a :class:`MuxRecord` as a vector *Record* object.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    obj: dict[str, Any] = {"kind": _RECORD_NAMES[rec.kind], "kind_byte": int(rec.kind),
                           "rank": rec.rank}
    if rec.control is not None:
        obj["control"] = control_to_json(rec.control, version)
    else:
        obj["payload"] = bytes(rec.payload).hex()
    return obj


def require(cond: bool, message: str) -> None:
    """Raise :class:`VectorMismatch` with ``message`` unless ``cond``.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    if not cond:
        raise VectorMismatch(message)


def expect_error(case: dict[str, Any], fn: Callable[[], object]) -> None:
    """Run ``fn`` and require the ProtocolError the error case describes (kind and prefix).

    Raises:
        VectorMismatch: ``fn`` returned instead of raising, or raised a ProtocolError of another
            kind or whose message does not start with the case's ``error_prefix``.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    try:
        result = fn()
    except ProtocolError as e:
        require(e.kind == case["error_kind"],
                f"error kind {e.kind!r}, want {case['error_kind']!r} ({e})")
        require(str(e).startswith(case["error_prefix"]),
                f"error message {str(e)!r} does not start with {case['error_prefix']!r}")
        return
    want = case.get("error", case["error_prefix"] + "...")
    raise VectorMismatch(f"expected error {case['error_kind']} {want!r}, got result {result!r}")

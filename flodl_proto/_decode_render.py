"""The JSON of a decoded record's contents for :mod:`flodl_proto.decode`: a RoundFrame and its
tensors (summary, values, notes on what the reader accepts and the fold rejects) and a Control
message (its fields, the bytes after it a reader ignores). Pure functions of what the codec
decoded; the stream walk, the version detection and the tag checks stay in ``decode.py``. No
upstream counterpart (upstream has no decoder tool)."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from .codec.mux import ControlMessage, Hello, encode_control
from .codec.round_frame import Dtype, RoundFrame, TensorPayload
from .errors import ProtocolError
from .interop.jsonio import control_to_json, f64_bits
from .spec import ELEMENT_SIZE

__all__ = ["control_fields", "frame_json", "jfloat", "tensor_json"]


def jfloat(x: float) -> float | str:
    """A JSON-safe float: non-finite values become the strings ``NaN``, ``inf``, ``-inf``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def _dtype_name(code: int) -> str:
    try:
        return Dtype(code).name.lower()
    except ValueError:
        return f"unknown({code})"


def tensor_json(t: TensorPayload, version: int, values: bool) -> dict[str, Any]:
    """One tensor's summary: dtype, shape, ``nbytes``, elided, and ``min``/``max``/``mean`` of
    its elements (f64, JSON-safe), every element too with ``values`` (raw ``data`` hex where
    they cannot be decoded); a ``note`` where the reader accepts what the fold rejects."""
    obj: dict[str, Any] = {
        "dtype": _dtype_name(t.dtype), "dtype_byte": t.dtype, "shape": list(t.shape),
        "nbytes": t.nbytes, "elided": t.nbytes == 0 and t.numel > 0,
    }
    es = ELEMENT_SIZE.get(t.dtype)
    if es is None:
        obj["note"] = "unknown dtype tag (accepted by the reader, rejected by the fold)"
    elif obj["elided"]:
        if version < 3:
            obj["note"] = "elided payload: not legal at protocol version 2 (the fold rejects it)"
    elif t.nbytes != t.numel * es:
        obj["note"] = (f"nbytes does not match the shape (expected {t.numel * es}); accepted by "
                       "the reader, rejected by the fold")
    elif t.numel > 0:
        try:
            arr = t.array()
        except ProtocolError as e:  # e.g. more dimensions than NumPy supports
            obj["note"] = str(e)
        else:
            with np.errstate(invalid="ignore", over="ignore"):  # NaNs, signalling ones too
                wide = arr.astype(np.float64).reshape(-1)
                obj["min"] = jfloat(float(np.min(wide)))
                obj["max"] = jfloat(float(np.max(wide)))
                obj["mean"] = jfloat(float(np.mean(wide)))
            if values:
                obj["values"] = [jfloat(float(v)) for v in wide]
    if values and "values" not in obj and t.nbytes:
        obj["data"] = bytes(t.data).hex()
    return obj


def frame_json(f: RoundFrame, wire_len: int, tag: bytes,
               status: Literal["ok", "bad", "unchecked"], version: int, values: bool
               ) -> dict[str, Any]:
    """A RoundFrame's fields (``wire_len``: its bytes, tag included; ``status``: its tag's),
    each tensor's as :func:`tensor_json` gives them."""
    return {
        "kind": f.kind.name.lower(), "kind_byte": int(f.kind), "weight": jfloat(f.weight),
        "weight_bits": f64_bits(f.weight), "num_tensors": len(f.tensors), "wire_len": wire_len,
        "tag": tag.hex(), "tag_status": status,
        "tensors": [tensor_json(t, version, values) for t in f.tensors],
    }


def control_fields(control: ControlMessage, version: int, payload_len: int) -> dict[str, Any]:
    """A Control record's message (``control``) read at ``version``, and the bytes of its
    ``payload_len`` after the message (``trailing_bytes``: upstream's reader ignores them), with
    a ``note`` on a version 2 Hello that has some (a version 3 Hello read at 2)."""
    rec: dict[str, Any] = {"control": control_to_json(control, version)}
    extra = payload_len - len(encode_control(control, version))
    if extra > 0:  # upstream's reader ignores them (consumed count discarded)
        rec["trailing_bytes"] = extra
        if version == 2 and isinstance(control, Hello):
            rec["note"] = ("ignored by a version 2 reader; a version 3 Hello? "
                           "--protocol-version 3")
    return rec

"""Bytes the conformance kit sends or expects, built from a case step's parameters.

A step names one *builder* (``magic``, ``handshake``, ``ack``, ``hello``, ``hello_ack``,
``rank_exit``, ``declare_dead``, ``data``, ``record`` (any kind, a raw payload, signed),
``host_frame``, ``broadcast``, ``frame``, ``framed``, ``len_prefix``, ``mux_header`` (a raw
header, for hostile length claims) or raw ``hex``) with its parameters, and optionally tampers with
the result (``record_salt: wrong`` signs the mux record with another salt; ``record_rank: N``
writes ``N`` in a Control, HostFrame or Broadcast record's rank field, signed;
``trailing: "<hex>"`` appends those bytes to a HostFrame's or Broadcast's payload after its
frame, signed; ``flip: N`` flips the low bit of byte ``N``, negative from the end; ``cut: N``
drops the last ``N`` bytes). Records and
frames are signed with the case's session salt unless told otherwise; the kit's own codec
(:mod:`flodl_proto.codec`, checked against the golden vectors) does the encoding.

Frame parameters (``host_frame``, ``broadcast``, ``frame``, ``framed``)::

    {kind: model|control|<byte>, weight: <f64>, salt: wrong|zero|<32 hex>, cut_tag: <n>,
     tensors: [{dtype: f32|bf16|<byte>, shape: [..], values: [..] | hex: ".." | fill: x
                | elided: true}]}

``values`` must be exactly representable in the dtype (the catalogue states wire bytes, never
approximations); ``hex`` gives the payload bytes verbatim; ``fill`` repeats one value over the
shape (large frames for the write-stall cases).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import ml_dtypes
import numpy as np

from ..codec.handshake import encode_ack, encode_channel_magic, encode_handshake
from ..codec.loopback import encode_len_prefix
from ..codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    RankExit,
    RecordKind,
    encode_control,
    encode_mux_record_parts,
)
from ..codec.round_frame import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from ..spec import AUTH_TAG_LEN, SESSION_SALT_BYTES, SPEC
from .catalogue import CatalogueError

__all__ = ["BUILDERS", "TAMPERS", "BuildContext", "CatalogueError", "build", "frame_bytes",
           "other_salt"]

#: builder names a step may use
BUILDERS: Final = ("hex", "magic", "handshake", "ack", "hello", "hello_ack", "rank_exit",
                   "declare_dead", "data", "record", "host_frame", "broadcast", "frame", "framed",
                   "len_prefix", "mux_header")
#: tamper options applied after building
TAMPERS: Final = ("record_salt", "record_rank", "trailing", "flip", "cut")

_MUX_MAGIC: Final = SPEC.const("MUX_RECORD_MAGIC")
_MUX_VERSION: Final = SPEC.const("MUX_PROTOCOL_VERSION")
_HANDSHAKE_MAGIC: Final = SPEC.const("HANDSHAKE_MAGIC_RANK")
_DTYPES: Final = {"f32": 0, "bf16": 1}
_KINDS: Final = {"model": int(RoundKind.MODEL), "control": int(RoundKind.CONTROL)}
_RECORD_KINDS: Final = {k.name.lower(): int(k) for k in RecordKind}


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a builder needs from the case being run.

    Attributes:
        salt: the case's 16-byte session salt.
        version: the protocol version the case runs at (2 or 3).
        world_size: the world size the target was launched with.

    No upstream counterpart: upstream has no conformance kit.
    """

    salt: bytes
    version: int
    world_size: int


def other_salt(salt: bytes) -> bytes:
    """A salt that differs from ``salt`` in every byte (``wrong`` in a step).

    No upstream counterpart: upstream has no conformance kit.
    """
    return bytes(b ^ 0xFF for b in salt)


def _salt(spec: Any, ctx: BuildContext, where: str) -> bytes:
    if spec is None:
        return ctx.salt
    if spec == "wrong":
        return other_salt(ctx.salt)
    if spec == "zero":
        return bytes(SESSION_SALT_BYTES)
    try:
        raw = bytes.fromhex(str(spec))
    except ValueError:
        raw = b""
    if len(raw) != SESSION_SALT_BYTES:
        raise CatalogueError(f"{where}: salt must be wrong, zero or {2 * SESSION_SALT_BYTES} hex "
                             f"digits, got {spec!r}")
    return raw


def _tensor(t: Mapping[str, Any], where: str) -> TensorPayload:
    dtype_s = t.get("dtype", "f32")
    dtype = _DTYPES.get(dtype_s) if isinstance(dtype_s, str) else int(dtype_s)
    if dtype is None:
        raise CatalogueError(f"{where}: unknown dtype {dtype_s!r}")
    shape = [int(d) for d in t.get("shape", [])]
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if t.get("elided"):
        return TensorPayload.elide(dtype, shape)
    if "hex" in t:
        return TensorPayload(dtype, shape, bytes.fromhex(str(t["hex"]).replace(" ", "")))
    np_dtype = np.dtype(np.float32) if dtype == 0 else np.dtype(ml_dtypes.bfloat16)
    if "fill" in t:
        arr = np.full(numel, float(t["fill"]), dtype=np_dtype)
    elif "values" in t:
        vals = [float(v) for v in t["values"]]
        if len(vals) != numel:
            raise CatalogueError(f"{where}: {len(vals)} values for shape {shape}")
        arr = np.array(vals, dtype=np_dtype)
        exact = np.array(vals, dtype=np.float64)
        same = (arr.astype(np.float64) == exact) | (np.isnan(exact) & np.isnan(
            arr.astype(np.float64)))
        if not bool(np.all(same)):
            raise CatalogueError(f"{where}: values {vals} are not exact in {dtype_s}; give hex")
    else:
        raise CatalogueError(f"{where}: a tensor needs values, hex, fill or elided")
    if dtype not in (0, 1):
        raise CatalogueError(f"{where}: values for dtype {dtype} need hex")
    return TensorPayload(dtype, shape, arr.reshape(-1).view(np.uint8).tobytes())


def frame_bytes(p: Mapping[str, Any], ctx: BuildContext, where: str) -> bytes:
    """A RoundFrame's bytes from frame parameters (signed, then ``cut_tag`` applied).

    Raises:
        CatalogueError: ``p`` is not a mapping, its ``kind`` is unknown, a tensor's dtype is
            unknown, its ``salt`` is not ``wrong``, ``zero`` or 32 hex digits, or ``cut_tag`` is
            outside 0..8 (the message starts with ``where``).

    No upstream counterpart: upstream has no conformance kit.
    """
    if not isinstance(p, Mapping):
        raise CatalogueError(f"{where}: a frame must be a mapping")
    kind_s = p.get("kind", "model")
    kind = _KINDS.get(kind_s) if isinstance(kind_s, str) else int(kind_s)
    if kind is None:
        raise CatalogueError(f"{where}: unknown frame kind {kind_s!r}")
    tensors = [_tensor(t, f"{where} tensor[{i}]") for i, t in enumerate(p.get("tensors", []))]
    weight = float(p.get("weight", 1.0))
    salt = _salt(p.get("salt"), ctx, where)
    if kind in (0, 1) and weight >= 0.0 and np.isfinite(weight):
        # as given: a case may carry a byte count that disagrees with the shape (a fold's test)
        raw = encode_round_frame_bytes(RoundFrame(kind, weight, tensors, check_nbytes=False),
                                       salt)
    else:  # a value no writer accepts: lay the frame out by hand and sign it
        raw = _raw_frame(kind, weight, tensors, salt)
    cut = int(p.get("cut_tag", 0))
    if not 0 <= cut <= AUTH_TAG_LEN:
        raise CatalogueError(f"{where}: cut_tag must be 0..{AUTH_TAG_LEN}")
    return raw[:len(raw) - cut]


def _raw_frame(kind: int, weight: float, tensors: list[TensorPayload], salt: bytes) -> bytes:
    import hashlib
    import hmac

    body = bytearray(struct.pack("<IIBd", SPEC.const("ROUND_FRAME_MAGIC"), len(tensors), kind,
                                 weight))
    for t in tensors:
        body += struct.pack("<BB", t.dtype, len(t.shape))
        body += b"".join(struct.pack("<I", d) for d in t.shape)
        body += struct.pack("<Q", t.nbytes) + bytes(t.data)
    return bytes(body) + hmac.new(salt, bytes(body), hashlib.sha256).digest()[:AUTH_TAG_LEN]


def _record(kind: int, payload: bytes, salt: bytes, rank: int = 0) -> bytes:
    return b"".join(bytes(b) for b in encode_mux_record_parts(kind, rank, [payload], salt))


def build(step: Mapping[str, Any], ctx: BuildContext, where: str) -> bytes:
    """The bytes a ``send`` / ``expect`` step names (one builder key, optional tampers).

    Args:
        step: the step's mapping (its ``conn`` and timing keys are ignored here).
        ctx: salt, version and world size of the case.
        where: ``"case id step N"`` for error messages.

    Returns:
        The exact bytes.

    Raises:
        CatalogueError: no builder, two builders, or a malformed parameter.

    No upstream counterpart: upstream has no conformance kit.
    """
    names = [k for k in BUILDERS if k in step]
    if len(names) != 1:
        raise CatalogueError(f"{where}: exactly one of {', '.join(BUILDERS)} expected, "
                             f"got {names or 'none'}")
    name = names[0]
    p = step[name]
    rec_salt = _salt(step.get("record_salt"), ctx, where)
    try:
        rec_rank = int(step.get("record_rank", 0))
        trailing = bytes.fromhex(str(step.get("trailing", "")))
    except (TypeError, ValueError) as e:
        raise CatalogueError(f"{where}: bad record_rank or trailing: {e}") from None
    if not 0 <= rec_rank <= 0xFFFFFFFF:
        raise CatalogueError(f"{where}: record_rank must be a u32, got {rec_rank}")
    if trailing and name not in ("host_frame", "broadcast"):
        raise CatalogueError(f"{where}: trailing applies to host_frame and broadcast only")
    version = int(p.get("version", ctx.version)) if isinstance(p, Mapping) else ctx.version
    out: bytes
    try:
        if name == "hex":
            out = bytes.fromhex(str(p).replace(" ", ""))
        elif name == "magic":
            out = (encode_channel_magic(p) if p in ("data", "control")
                   else struct.pack("<I", int(str(p), 16)))
        elif name == "handshake":
            if "magic" in p or "version" in p:
                out = struct.pack("<IIII", int(p.get("magic", _HANDSHAKE_MAGIC)), version,
                                  int(p["rank"]), int(p.get("world_size", ctx.world_size)))
            else:
                out = encode_handshake(int(p["rank"]), int(p.get("world_size", ctx.world_size)),
                                       ctx.version)
        elif name == "ack":
            out = encode_ack(ctx.version)
        elif name in ("hello", "hello_ack", "rank_exit", "declare_dead"):
            msg: Hello | HelloAck | RankExit | DeclareDead
            if name == "hello":
                sigs = [bytes.fromhex(s) for s in p.get("model_sigs", [])]
                msg = Hello(str(p.get("host", "conform")), [int(r) for r in p["ranks"]], sigs)
            elif name == "hello_ack":
                msg = HelloAck()
            elif name == "rank_exit":
                msg = RankExit(int(p["rank"]))
            else:
                msg = DeclareDead(int(p["rank"]))
            payload = encode_control(msg, version)
            out = _record(int(RecordKind.CONTROL), payload, rec_salt, rank=rec_rank)
        elif name == "data":
            out = _record(int(RecordKind.DATA), bytes.fromhex(str(p.get("payload", ""))),
                          rec_salt, rank=int(p.get("rank", 0)))
        elif name == "record":  # any kind, raw payload, signed (hostile inner frames)
            out = _record(_RECORD_KINDS[str(p["kind"])], bytes.fromhex(str(p.get("payload", ""))),
                          rec_salt, rank=int(p.get("rank", 0)))
        elif name in ("host_frame", "broadcast"):
            kind = RecordKind.HOST_FRAME if name == "host_frame" else RecordKind.BROADCAST
            out = _record(int(kind), frame_bytes(p, ctx, where) + trailing, rec_salt,
                          rank=rec_rank)
        elif name == "frame":
            out = frame_bytes(p, ctx, where)
        elif name == "framed":
            body = frame_bytes(p, ctx, where)
            out = encode_len_prefix(len(body)) + body
        elif name == "len_prefix":
            out = struct.pack("<I", int(p))
        else:  # mux_header: a raw 25-byte header (hostile claims), tag zero unless given
            out = struct.pack("<IIBII", int(p.get("magic", _MUX_MAGIC)),
                              int(p.get("version", _MUX_VERSION)),
                              _RECORD_KINDS.get(str(p.get("kind", "host_frame")), 0)
                              if not isinstance(p.get("kind"), int) else int(p["kind"]),
                              int(p.get("rank", 0)), int(p["payload_len"]))
            out += bytes.fromhex(str(p.get("tag", "00" * AUTH_TAG_LEN)))
    except CatalogueError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CatalogueError(f"{where}: bad {name} parameters {p!r}: {e}") from None
    if "flip" in step:
        i = int(step["flip"])
        buf = bytearray(out)
        if not -len(buf) <= i < len(buf):
            raise CatalogueError(f"{where}: flip offset {i} outside {len(buf)} bytes")
        buf[i] ^= 0x01
        out = bytes(buf)
    if "cut" in step:
        out = out[:len(out) - int(step["cut"])]
    return out


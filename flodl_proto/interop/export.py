"""Export golden vectors of this implementation in the shared vector schema.

``flodl-proto vectors export DIR`` writes, for protocol version 3 into ``DIR`` and for version 2
into ``DIR/v2``, the files ``handshake.json``, ``channel_magic.json``, ``round_frame.json``,
``mux_record.json`` and ``len_framed.json`` plus a ``manifest.json`` (schema
``flodl-oracle-vectors/1``, the same ops and fields as the shared vectors), so another
implementation can check itself against this one; ``flodl-proto vectors check DIR`` reads them
back. Every expected value is what this package's codec produces: encoders give the ``bytes``,
readers give the decoded objects, the ``eof`` verdicts and the errors.

For error cases, ``error`` is this package's full message and ``error_prefix`` the portable part
of it: the message up to its first value that follows upstream's literal wording (the text before
the first template field is upstream's, by the spec's convention), cut before Rust's io-error
text ("failed to fill whole buffer"), after "bincode decode failed: " (the bincode library's own
wording follows), and before a parenthesis that the prefix leaves open (this package's extra
details). The output is deterministic: the same package writes the same bytes.

Upstream: the shared vectors were made from ``flodl/src/distributed/controller/mod.rs``,
``controller/round_frame.rs``, ``relay/mux.rs``, ``wire.rs`` and ``cpu_reduce.rs``; these mirror
their layout for the codec files.
"""

from __future__ import annotations

import json
import string
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .._files import make_folders, replace_file
from ..codec import handshake as hs
from ..codec import loopback
from ..codec.auth import compute_tag
from ..codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    decode_mux_record,
    decode_mux_record_or_eos,
    encode_control,
    encode_mux_record_bytes,
)
from ..codec.round_frame import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame_or_eos,
    encode_round_frame_bytes,
)
from ..errors import ProtocolError
from ..spec import (
    CHANNELS,
    CONTROL_HANDSHAKE_MAGIC_RANK,
    DEFAULT_FRAME_CEILING,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    MAX_ROUND_FRAME_TENSORS,
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_PROTOCOL_VERSION,
    MUX_RECORD_MAGIC,
    ROUND_FRAME_MAGIC,
    SPEC,
)
from .jsonio import frame_to_json, record_to_json

__all__ = ["EXPORTED_FILES", "SCHEMA", "export_vectors", "portable_prefix"]

#: the vector schema written
SCHEMA = "flodl-oracle-vectors/1"
#: the files written per version folder
EXPORTED_FILES = ("handshake", "channel_magic", "round_frame", "mux_record", "len_framed")

#: the coordinator control channel's rank handshake magic (outside the data-channel spec; used
#: only as a wrong magic)
_CONTROL_HANDSHAKE_MAGIC = CONTROL_HANDSHAKE_MAGIC_RANK
_SALTS = {"zero": bytes(16), "b": bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")}
_CUT_BEFORE = ("failed to fill whole buffer",)
_CUT_AFTER = ("bincode decode failed: ",)

Case = dict[str, Any]


# -------------------------------------------------------------------------------------------------
# Error prefix
# -------------------------------------------------------------------------------------------------
def portable_prefix(error: ProtocolError) -> str:
    """The leading part of ``error``'s message another implementation should reproduce.

    See the module docstring for the rule. Errors without a catalogue id give their whole message.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    message = str(error)
    entry = SPEC.errors.get(error.error_id or "")
    if entry is None:
        return message
    fmt = string.Formatter()
    out = ""
    for literal, name, spec, conv in fmt.parse(entry.template):
        out += literal
        if name is None:
            break
        if out.strip():
            break
        value = fmt.convert_field(error.fields.get(name, ""), conv)
        out += fmt.format_field(value, spec or "")
    for marker in _CUT_BEFORE:
        i = out.find(marker)
        if i >= 0:
            out = out[:i]
    for marker in _CUT_AFTER:
        i = out.find(marker)
        if i >= 0:
            out = out[:i + len(marker)]
    if out.count("(") > out.count(")"):
        out = out[:out.rfind(" (")] if " (" in out else out[:out.rfind("(")]
    if not message.startswith(out):  # pragma: no cover - a template / message mismatch
        return message
    return out


# -------------------------------------------------------------------------------------------------
# Case helpers
# -------------------------------------------------------------------------------------------------
class _File:
    """Cases of one vector file for one version."""

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version
        self.cases: list[Case] = []

    def _id(self, op: str, case: str, salt: str | None = None) -> str:
        prefix = "v2/" if self.version == 2 else ""
        sub = op.split(".", 1)[1] if op.startswith(self.name + ".") else op.replace(".", "_")
        tail = f"/salt-{salt}" if salt else ""
        return f"{prefix}{self.name}/{sub}/{case}{tail}"

    def ok(self, op: str, case: str, description: str, salt_name: str | None = None,
           **fields: Any) -> None:
        self.cases.append({"id": self._id(op, case, salt_name), "op": op, "expect": "ok",
                           "description": description, **fields})

    def eof(self, op: str, case: str, description: str, **fields: Any) -> None:
        self.cases.append({"id": self._id(op, case), "op": op, "expect": "eof",
                           "description": description, **fields})

    def error(self, op: str, case: str, description: str, run: Callable[[], object],
              **fields: Any) -> None:
        try:
            result = run()
        except ProtocolError as e:
            self.cases.append({
                "id": self._id(op, case), "op": op, "expect": "error",
                "description": description, **fields, "error": str(e),
                "error_prefix": portable_prefix(e), "error_kind": e.kind,
            })
            return
        raise AssertionError(f"export: {self._id(op, case)} was expected to fail, got {result!r}")

    def document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "protocol_version": self.version, "file": self.name,
            "set": "shared", "producer": "flodl-proto",
            "salts": {k: v.hex() for k, v in _SALTS.items()}, "cases": self.cases,
        }


def _f32(values: list[float], shape: list[int] | None = None) -> TensorPayload:
    arr = np.array(values, dtype="<f4")
    return TensorPayload.from_array(arr.reshape(shape) if shape is not None else arr)


def _bf16(values: list[float]) -> TensorPayload:
    return TensorPayload.from_array(np.array(values, dtype=ml_dtypes.bfloat16))


def _f64(x: float) -> bytes:
    return struct.pack("<d", x)


def _u32(x: int) -> bytes:
    return struct.pack("<I", x)


def _u64(x: int) -> bytes:
    return struct.pack("<Q", x)


# -------------------------------------------------------------------------------------------------
# handshake.json / channel_magic.json
# -------------------------------------------------------------------------------------------------
def _handshake(version: int) -> _File:
    f = _File("handshake", version)
    other = 5 - version
    for rank, ws in ((0, 1), (3, 4), (0, 65536), (4294967294, 4294967295)):
        f.ok("handshake.rank_write", f"r{rank}-ws{ws}",
             "rank -> relay data-channel handshake (16 bytes); read back with the same world size "
             "it yields rank_id", rank_id=rank, world_size=ws,
             bytes=hs.encode_handshake(rank, ws, version).hex())
    f.ok("handshake.ack_write", "only", "relay -> rank handshake ack (8 bytes)",
         bytes=hs.encode_ack(version).hex())
    f.ok("handshake.read", "rank-beyond-world-accepted",
         "the reader checks magic, version and world size only: rank 9 of 4 is returned as is",
         bytes=hs.encode_handshake(9, 4, version).hex(), expected_world_size=4, rank_id=9)
    good = hs.encode_handshake(1, 2, version)
    bad: list[tuple[str, str, bytes, int]] = [
        ("bad-magic-control-channel", "control-channel handshake magic on the data channel",
         _u32(_CONTROL_HANDSHAKE_MAGIC) + good[4:], 2),
        ("bad-magic-ack", "the ack magic where the handshake is expected",
         _u32(HANDSHAKE_MAGIC_CONTROLLER_ACK) + good[4:], 2),
        (f"bad-version-{other}", f"a version-{other} handshake offered to a version-{version} "
         "reader", hs.encode_handshake(1, 2, other), 2),
        ("bad-version-1", "a version-1 handshake", good[:4] + _u32(1) + good[8:], 2),
        ("world-size-mismatch", "world size 2 where 3 is expected", good, 3),
        ("truncated-10", "handshake cut after 10 bytes (not a clean end of stream)", good[:10], 2),
        ("empty", "no bytes at all: the handshake read fails", b"", 2),
    ]
    for case, desc, data, ws in bad:
        f.error("handshake.read", case, desc,
                partial(hs.decode_handshake, data, ws, version),
                bytes=data.hex(), expected_world_size=ws)
    ack = hs.encode_ack(version)
    f.ok("handshake.ack_read", "own-version", "the ack of this version is accepted",
         bytes=ack.hex())
    for case, desc, data in (
        ("bad-magic-rank", "the rank-handshake magic where the ack is expected",
         _u32(HANDSHAKE_MAGIC_RANK) + ack[4:]),
        (f"bad-version-{other}", f"a version-{other} ack", hs.encode_ack(other)),
        ("truncated-5", "ack cut after 5 bytes", ack[:5]),
        ("empty", "no bytes at all: the ack read fails", b""),
    ):
        f.error("handshake.ack_read", case, desc, partial(hs.decode_ack, data, version),
                bytes=data.hex())
    return f


def _channel_magic(version: int) -> _File:
    f = _File("channel_magic", version)
    for name, value in CHANNELS.items():
        f.ok("channel_magic.write", name, f"the 4 bytes a dialer writes first for the {name} "
             "channel; accepted by the matching check", channel=name, magic=f"0x{value:08x}",
             bytes=hs.encode_channel_magic(name).hex())
    data_magic = CHANNELS["data"]
    f.ok("channel_magic.expect", "data-on-data", "the data magic at the data-channel accept",
         bytes=hs.encode_channel_magic("data").hex(), expected=f"0x{data_magic:08x}",
         what="cluster_controller")
    for case, desc, data in (
        ("control-on-data", "control-channel magic at the data-channel accept",
         hs.encode_channel_magic("control")),
        ("join-on-data", "join-channel magic at the data-channel accept",
         hs.encode_channel_magic("join")),
        ("http-get-on-data", "an HTTP request at the data-channel accept", b"GET "),
        ("truncated-2", "only 2 bytes of the magic", hs.encode_channel_magic("data")[:2]),
        ("empty", "no bytes at all", b""),
    ):
        f.error("channel_magic.expect", case, desc,
                partial(hs.expect_channel_magic, data, data_magic, "cluster_controller"),
                bytes=data.hex(), expected=f"0x{data_magic:08x}", what="cluster_controller")
    return f


# -------------------------------------------------------------------------------------------------
# round_frame.json
# -------------------------------------------------------------------------------------------------
def _sample_frames(version: int) -> list[tuple[str, str, RoundFrame]]:
    frames = [
        ("f32-one-tensor", "one f32 tensor [4], Model, weight 1.0",
         RoundFrame(RoundKind.MODEL, 1.0, [_f32([1.0, -2.5, 0.0, 3.25])])),
        ("f32-multi-ndim", "f32 tensors of shapes [2, 3], [] (a scalar) and [1, 1, 2]",
         RoundFrame(RoundKind.MODEL, 2.0, [
             _f32([1, 2, 3, 4, 5, 6], [2, 3]), _f32([7.5], []), _f32([-1, 1], [1, 1, 2])])),
        ("bf16-tensors", "bf16 tensors (2 bytes per element)",
         RoundFrame(RoundKind.MODEL, 1.0, [_bf16([1.0, -2.0, 0.5, 256.0]), _bf16([3.0])])),
        ("mixed-dtype-frame", "an f32 and a bf16 tensor in one frame",
         RoundFrame(RoundKind.MODEL, 0.75, [_f32([0.25, 0.5]), _bf16([-1.5, 8.0])])),
        ("control-kind", "Control kind, weight 0.0 (a count gather)",
         RoundFrame(RoundKind.CONTROL, 0.0, [_f32([0.0, 3.0, 0.0, 0.0])])),
        ("weight-neg-zero", "weight -0.0 passes the reader's check",
         RoundFrame(RoundKind.MODEL, -0.0, [_f32([1.0])])),
        ("weight-1e-300", "a tiny positive weight",
         RoundFrame(RoundKind.MODEL, 1e-300, [_f32([1.0])])),
        ("weight-f64-max", "the largest finite weight",
         RoundFrame(RoundKind.MODEL, 1.7976931348623157e308, [_f32([1.0])])),
        ("zero-tensors", "a frame without tensors", RoundFrame(RoundKind.MODEL, 1.0, [])),
        ("zero-numel", "a tensor of shape [0] carries no bytes (legal in both versions)",
         RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [0], b"")])),
        ("unknown-dtype-accepted", "the reader accepts any dtype byte (checked at the fold)",
         RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(7, [3], b"\x01\x02\x03")])),
        ("nbytes-shape-mismatch-accepted", "the reader does not compare nbytes with the shape",
         RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [3], bytes(8))],
                    check_nbytes=False)),
        ("special-values", "NaN, infinities and -0.0 round-trip bit for bit",
         RoundFrame(RoundKind.MODEL, 1.0, [_f32([float("nan"), float("inf"), -float("inf"),
                                                 -0.0])])),
    ]
    if version >= 3:
        frames.append(("elided-mixed", "version 3: an elided f32 [64, 128] next to a full tensor",
                       RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(Dtype.F32, [64, 128], b""),
                                                         _f32([1.0, 2.0])])))
    return frames


def _round_frame(version: int) -> _File:
    f = _File("round_frame", version)
    for case, desc, frame in _sample_frames(version):
        for sname, salt in _SALTS.items():
            wire = encode_round_frame_bytes(frame, salt)
            f.ok("round_frame.roundtrip", case, desc + "; write(frame) == bytes and "
                 "read(bytes) == frame", salt_name=sname, salt=salt.hex(),
                 frame=frame_to_json(frame), bytes=wire.hex(), wire_len=len(wire),
                 mac=wire[-8:].hex())
    salt = _SALTS["b"]
    base = RoundFrame(RoundKind.MODEL, 1.0, [_f32([1.0, 2.0])])
    wire = encode_round_frame_bytes(base, salt)

    def read(data: bytes, s: bytes = salt) -> Callable[[], object]:
        return lambda: decode_round_frame_or_eos(data, s)

    f.ok("round_frame.read", "trailing-bytes-left",
         "the reader consumes exactly one frame; bytes after the tag are left alone",
         salt=salt.hex(), bytes=(wire + b"\xde\xad\xbe\xef").hex(), consumed=len(wire),
         frame=frame_to_json(base))
    if version == 2:
        elided = RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(Dtype.F32, [4], b"")])
        ew = encode_round_frame_bytes(elided, salt)
        f.ok("round_frame.read", "elided-not-checked-by-reader",
             "version 2: the reader still decodes an elided tensor (the fold rejects it)",
             salt=salt.hex(), bytes=ew.hex(), consumed=len(ew), frame=frame_to_json(elided))
    for case, desc, data in (
        ("empty", "no bytes at all (clean end of stream)", b""),
        ("partial-header-1", "input ends after 1 header byte (clean end of stream)", wire[:1]),
        ("partial-header-7", "input ends after 7 header bytes (clean end of stream)", wire[:7]),
    ):
        f.eof("round_frame.read", case, desc, salt=salt.hex(), bytes=data.hex())
    body = bytearray(wire)
    flipped_payload = bytearray(wire)
    flipped_payload[35] ^= 0x01
    flipped_tag = bytearray(wire)
    flipped_tag[-1] ^= 0x80
    errors: list[tuple[str, str, bytes, bytes]] = [
        ("bad-magic", "mux-record magic where a frame is expected",
         _u32(MUX_RECORD_MAGIC) + bytes(body[4:]), salt),
        ("too-many-tensors", "num_tensors one above the cap, nothing else",
         _u32(ROUND_FRAME_MAGIC) + _u32(MAX_ROUND_FRAME_TENSORS + 1), salt),
        ("unknown-kind-2", "kind byte 2", bytes(body[:8]) + b"\x02" + bytes(body[9:]), salt),
        ("weight-nan", "a NaN weight", bytes(body[:9]) + _f64(float("nan")) + bytes(body[17:]),
         salt),
        ("weight-negative", "weight -1.0", bytes(body[:9]) + _f64(-1.0) + bytes(body[17:]), salt),
        ("weight-inf", "weight +inf", bytes(body[:9]) + _f64(float("inf")) + bytes(body[17:]),
         salt),
        ("truncated-8", "cut after the header, before the kind byte", wire[:8], salt),
        ("truncated-12", "cut inside the weight", wire[:12], salt),
        ("truncated-18", "cut inside the first tensor's meta", wire[:18], salt),
        ("truncated-21", "cut inside the first tensor's shape", wire[:21], salt),
        ("truncated-27", "cut inside the first tensor's nbytes", wire[:27], salt),
        ("truncated-35", "cut inside the first tensor's data", wire[:35], salt),
        ("truncated-footer", "cut inside the tag", wire[:-3], salt),
        ("past-ceiling", "nbytes one above the 1 GiB frame ceiling",
         bytes(body[:23]) + _u64(DEFAULT_FRAME_CEILING + 1), salt),
        ("bad-tag", "the tag's last byte flipped", bytes(flipped_tag), salt),
        ("payload-flipped", "one payload bit flipped", bytes(flipped_payload), salt),
        ("wrong-salt", "signed with salt b, read with salt zero", wire, _SALTS["zero"]),
    ]
    for case, desc, data, s in errors:
        f.error("round_frame.read", case, desc, read(data, s), salt=s.hex(), bytes=data.hex())
    return f


# -------------------------------------------------------------------------------------------------
# mux_record.json
# -------------------------------------------------------------------------------------------------
def _record_bytes(kind: int, rank: int, payload: bytes, salt: bytes, *, magic: int =
                  MUX_RECORD_MAGIC, mux_version: int = MUX_PROTOCOL_VERSION,
                  length: int | None = None) -> bytes:
    """A record built field by field (for hostile inputs the encoder refuses to make)."""
    n = len(payload) if length is None else length
    covered = _u32(magic) + _u32(mux_version) + bytes([kind]) + _u32(rank) + _u32(n)
    assert len(covered) == MUX_AUTH_COVERED_HEADER_LEN
    return covered + compute_tag(salt, [covered, payload]) + payload


def _mux_record(version: int) -> _File:
    f = _File("mux_record", version)
    frame = RoundFrame(RoundKind.MODEL, 3.0, [_f32([3.0, 6.0, -1.5])])
    sigs = [bytes(range(32)), bytes(range(32, 64))] if version >= 3 else []
    records: list[tuple[str, str, Callable[[bytes], MuxRecord]]] = [
        ("data-rank7", "Data record, rank 7, opaque payload",
         lambda s: MuxRecord.data(7, b"opaque control-frame bytes")),
        ("data-rank0-empty", "Data record, rank 0, empty payload",
         lambda s: MuxRecord.data(0, b"")),
        ("data-rank-max", "Data record, rank 2^32-1", lambda s: MuxRecord.data(0xFFFFFFFF, b"x")),
        ("control-hello-h0", "Control Hello of host h0 with ranks 0 and 1",
         lambda s: MuxRecord.control_msg(Hello("h0", [0, 1]), version)),
        ("control-hello-big", "Control Hello with ranks needing every varint width"
         + (" and two model signatures" if sigs else ""),
         lambda s: MuxRecord.control_msg(Hello("host-big", [0, 250, 251, 65535, 70000], sigs),
                                         version)),
        ("control-hello-empty", "Control Hello with an empty host name and no ranks",
         lambda s: MuxRecord.control_msg(Hello("", []), version)),
        ("control-hello-utf8", "Control Hello with a non-ASCII host name",
         lambda s: MuxRecord.control_msg(Hello("nœud-ü", [3]), version)),
        ("control-helloack", "Control HelloAck",
         lambda s: MuxRecord.control_msg(HelloAck(), version)),
        ("control-rankexit-3", "Control RankExit rank 3",
         lambda s: MuxRecord.control_msg(RankExit(3), version)),
        ("control-rankexit-251", "Control RankExit rank 251 (first 3-byte varint)",
         lambda s: MuxRecord.control_msg(RankExit(251), version)),
        ("control-rankexit-max", "Control RankExit rank 2^32-1",
         lambda s: MuxRecord.control_msg(RankExit(0xFFFFFFFF), version)),
        ("control-declaredead-300", "Control DeclareDead rank 300",
         lambda s: MuxRecord.control_msg(DeclareDead(300), version)),
        ("hostframe", "HostFrame carrying a RoundFrame signed with the same salt",
         lambda s: MuxRecord.host_frame(encode_round_frame_bytes(frame, s))),
        ("broadcast", "Broadcast carrying a RoundFrame signed with the same salt",
         lambda s: MuxRecord.broadcast(encode_round_frame_bytes(frame, s))),
        ("broadcast-empty", "Broadcast with an empty payload (the mux layer does not parse it)",
         lambda s: MuxRecord.broadcast(b"")),
    ]
    for case, desc, build in records:
        for sname, salt in _SALTS.items():
            rec = build(salt)
            wire = encode_mux_record_bytes(rec, salt)
            extra: dict[str, Any] = {}
            if rec.kind is RecordKind.CONTROL:
                extra["bincode"] = bytes(rec.payload).hex()
            f.ok("mux_record.roundtrip", case, desc + "; write(record) == bytes and "
                 "read(bytes) == record", salt_name=sname, salt=salt.hex(),
                 record=record_to_json(rec, version), bytes=wire.hex(), header=wire[:25].hex(),
                 payload=wire[25:].hex(), auth_tag=wire[17:25].hex(), **extra)
    salt = _SALTS["b"]

    def read_ok(case: str, desc: str, data: bytes) -> None:
        res = decode_mux_record(data, salt, version=version)
        f.ok("mux_record.read", case, desc, salt=salt.hex(), bytes=data.hex(), consumed=res[1],
             record=record_to_json(res[0], version))

    inner = encode_round_frame_bytes(frame, salt)
    read_ok("hostframe-nonzero-rank", "HostFrame with rank field 5 and a valid tag: accepted, "
            "the rank field is ignored", _record_bytes(RecordKind.HOST_FRAME, 5, inner, salt))
    read_ok("control-noncanonical-varint", "RankExit 3 written as FB 03 00: accepted",
            _record_bytes(RecordKind.CONTROL, 0, b"\x02\xfb\x03\x00", salt))
    ack = encode_mux_record_bytes(MuxRecord.control_msg(HelloAck(), version), salt)
    read_ok("two-records-reads-first", "two records back to back: the reader consumes the first",
            ack + ack)
    read_ok("control-trailing-bytes", "bytes after a complete control message are ignored",
            _record_bytes(RecordKind.CONTROL, 0, b"\x01\xaa\xbb", salt))
    if version == 2:
        read_ok("control-hello-v3-shape", "a version-3 Hello read at version 2: the empty "
                "model_sigs length is ignored",
                _record_bytes(RecordKind.CONTROL, 0, encode_control(Hello("h0", [0, 1]), 3), salt))
    for case, desc, data in (
        ("empty", "no bytes (clean end of stream)", b""),
        ("partial-header-24", "input ends inside the 25-byte header (clean end of stream)",
         ack[:24]),
    ):
        f.eof("mux_record.read", case, desc, salt=salt.hex(), bytes=data.hex())

    def read(data: bytes, s: bytes = salt) -> Callable[[], object]:
        return lambda: decode_mux_record_or_eos(data, s, version=version)

    tampered = bytearray(ack)
    tampered[-1] ^= 0x01
    errors: list[tuple[str, str, bytes, bytes]] = [
        ("bad-magic", "RoundFrame magic where a record is expected",
         _record_bytes(RecordKind.CONTROL, 0, b"\x01", salt, magic=ROUND_FRAME_MAGIC), salt),
        ("bad-version-2", "mux version 2",
         _record_bytes(RecordKind.CONTROL, 0, b"\x01", salt, mux_version=2), salt),
        ("payload-too-large", "payload_len one above the 1 GiB frame ceiling",
         _record_bytes(RecordKind.DATA, 0, b"", salt, length=DEFAULT_FRAME_CEILING + 1)[:25],
         salt),
        ("truncated-payload", "full header, payload cut after 3 of 8 bytes",
         _record_bytes(RecordKind.DATA, 7, bytes(range(1, 9)), salt)[:28], salt),
        ("bad-tag", "one payload bit flipped", bytes(tampered), salt),
        ("wrong-salt", "signed with salt b, read with salt zero", ack, _SALTS["zero"]),
        ("unknown-kind-05", "kind 0x05 with a valid tag: rejected after the tag check",
         _record_bytes(5, 0, b"\x01", salt), salt),
        ("unknown-kind-00", "kind 0x00 with a valid tag", _record_bytes(0, 0, b"", salt), salt),
        ("bincode-bad-variant", "control variant index 4",
         _record_bytes(RecordKind.CONTROL, 0, b"\x04", salt), salt),
        ("bincode-empty", "a control record without payload",
         _record_bytes(RecordKind.CONTROL, 0, b"", salt), salt),
        ("bincode-u64-marker", "RankExit rank written with the u64 marker FD",
         _record_bytes(RecordKind.CONTROL, 0, b"\x02\xfd" + _u64(3), salt), salt),
        ("bincode-bad-utf8", "Hello host name that is not UTF-8",
         _record_bytes(RecordKind.CONTROL, 0, b"\x00\x02\xff\xfe\x00" + b"\x00" * (version - 2),
                       salt), salt),
    ]
    if version >= 3:
        errors.append(("control-hello-v2-shape", "a version-2 Hello read at version 3: the input "
                       "ends where model_sigs should start",
                       _record_bytes(RecordKind.CONTROL, 0, encode_control(Hello("h0", [0, 1]), 2),
                                     salt), salt))
    for case, desc, data, s in errors:
        f.error("mux_record.read", case, desc, read(data, s), salt=s.hex(), bytes=data.hex())
    return f


# -------------------------------------------------------------------------------------------------
# len_framed.json
# -------------------------------------------------------------------------------------------------
def _len_framed(version: int) -> _File:
    f = _File("len_framed", version)
    salt = _SALTS["b"]
    frame = RoundFrame(RoundKind.MODEL, 1.0, [_f32([0.5, -0.5])])
    fw = encode_round_frame_bytes(frame, salt)
    for case, blob in (("empty", b""), ("bytes", b"hello loopback"), ("round-frame", fw)):
        f.ok("len_framed.roundtrip", case, "rank<->relay loopback blob: u32 LE length + bytes",
             blob=blob.hex(), bytes=b"".join(loopback.encode_len_framed(blob)).hex())
    two = b"".join(loopback.encode_len_framed(b"ab")) * 2
    f.ok("len_framed.read", "two-blobs-reads-first", "the reader consumes one blob",
         bytes=two.hex(), blob=b"ab".hex())
    for case, desc, data in (
        ("empty", "no bytes (clean end of stream)", b""),
        ("partial-prefix-3", "input ends inside the prefix (clean end of stream)", b"\x05\x00\x00"),
    ):
        f.eof("len_framed.read", case, desc, bytes=data.hex())
    for case, desc, data in (
        ("too-large", "prefix one above the 1 GiB frame ceiling",
         _u32(DEFAULT_FRAME_CEILING + 1) + b"\x00"),
        ("body-truncated", "prefix says 5, 2 body bytes follow", b"\x05\x00\x00\x00\x01\x02"),
    ):
        f.error("len_framed.read", case, desc, partial(loopback.decode_len_framed_or_eos, data),
                bytes=data.hex())
    for sname, s in _SALTS.items():
        f.ok("framed_round.roundtrip", "frame", "rank -> relay: u32 LE prefix equal to the "
             "RoundFrame wire length, then the frame", salt_name=sname, salt=s.hex(),
             frame=frame_to_json(frame),
             bytes=b"".join(loopback.encode_framed_round(frame, s)).hex())
    framed = b"".join(loopback.encode_framed_round(frame, salt))
    f.ok("framed_round.read", "exact", "a reply frame that fills its prefix exactly",
         salt=salt.hex(), bytes=framed.hex(), frame=frame_to_json(frame))
    f.eof("framed_round.read", "eof", "no bytes before the prefix (clean end of stream)",
          salt=salt.hex(), bytes="")
    bad_tag = bytearray(framed)
    bad_tag[-1] ^= 0x01
    for case, desc, data in (
        ("zero-prefix", "prefix 0 followed by a frame", _u32(0) + fw),
        ("prefix-too-long", "the frame is one byte shorter than its prefix",
         _u32(len(fw) + 1) + fw + b"\x00"),
        ("body-ends-in-header", "prefix 4: the body ends inside the frame header",
         _u32(4) + fw[:4]),
        ("bad-tag", "the frame's tag does not verify", bytes(bad_tag)),
    ):
        f.error("framed_round.read", case, desc,
                partial(loopback.decode_framed_round_or_eos, data, salt), salt=salt.hex(),
                bytes=data.hex())
    return f


_BUILDERS: dict[str, Callable[[int], _File]] = {
    "handshake": _handshake,
    "channel_magic": _channel_magic,
    "round_frame": _round_frame,
    "mux_record": _mux_record,
    "len_framed": _len_framed,
}


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def export_vectors(root: Path | str) -> dict[int, int]:
    """Write this implementation's vectors: version 3 into ``root``, version 2 into ``root/v2``.

    Each folder gets one file per :data:`EXPORTED_FILES` entry and a ``manifest.json`` counting
    the cases per file (``cases``, ``ok``, ``not_ok``) with ``total_cases``. Existing files of the
    same names are replaced, each atomically (:func:`flodl_proto._files.replace_file`: a failed
    write leaves that file as it was and no temporary file); other files are left alone.

    Returns:
        ``{protocol version: number of cases written}``.

    Raises:
        OSError: a file cannot be written (``filename`` names it). The folders the call
            created are removed again, with what it wrote in them.

    Upstream: the files mirror the shared vectors made from ``controller/mod.rs``,
    ``controller/round_frame.rs``, ``relay/mux.rs``, ``wire.rs`` and ``cpu_reduce.rs``.
    """
    out: dict[int, int] = {}
    base = Path(root)
    created: list[Path] = []  # folders this call made, outermost first
    written: list[Path] = []
    try:
        for version, folder in ((3, base), (2, base / "v2")):
            missing = [p for p in (folder, *folder.parents) if not p.exists()]
            created.extend(reversed(missing))  # before: a mkdir that fails midway made some
            try:  # the folder that failed and why ('... (a symbolic link to nothing)')
                make_folders(folder)
            except OSError as e:
                e.filename, e.filename2 = str(base), None  # the DIR asked for, as docs --out
                raise
            files: dict[str, dict[str, int]] = {}
            for name, build in _BUILDERS.items():
                doc = build(version).document()
                cases = doc["cases"]
                ok = sum(1 for c in cases if c["expect"] == "ok")
                files[name] = {"cases": len(cases), "ok": ok, "not_ok": len(cases) - ok}
                written.append(folder / f"{name}.json")
                replace_file(written[-1], _dump(doc).encode("utf-8"))
            total = sum(v["cases"] for v in files.values())
            manifest = {"schema": SCHEMA, "protocol_version": version, "set": "shared",
                        "producer": "flodl-proto", "files": files, "total_cases": total}
            written.append(folder / "manifest.json")
            replace_file(written[-1], _dump(manifest).encode("utf-8"))
            out[version] = total
    except OSError:
        _undo(created, written)
        raise
    return out


def _undo(created: list[Path], written: list[Path]) -> None:
    """After a failed export: remove the files written into folders the export created, then
    those folders, innermost first, where empty. Files in folders that were there before are
    left (each was replaced whole, or not at all); nothing else is touched."""
    mine = set(created)
    for path in written:
        if path.parent in mine:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:  # not empty (something else was put there), or already gone
            pass

"""Regenerate the seed corpus (``fuzz/corpus/<target>/vec-*`` and ``seed-*``) from the shared
golden vectors and a few hand-made hostile inputs.

Usage::

    python fuzz/make_corpus.py [VECTORS_DIR]
    # default: $FLODL_VECTORS, else ../shared/vectors, else flodl_proto/_vectors

Files are named after the vector id they come from (``vec-<id>``, ``/`` spelled ``__``) or after
what they attack (``seed-<name>``); ``finding-*`` files (minimized fuzz findings) and ``cov-*``
files (coverage-increasing inputs merged from campaigns) are never touched. Each file is a
harness input: the parameter bytes the target's module docstring describes, followed by the wire
bytes of the vector.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SALT_BIT = {"00" * 16: 0, "5a17c0de429901fe3c88b70d6e21f493": 4}
CHANNEL_ORDER = [0xF10D17E0, 0xF10D17E1, 0xF10D17E2, 0xF10D17E3]  # the Channel enum by value
SIGN = 2
HANDSHAKE_MAGIC_RANK, HANDSHAKE_MAGIC_ACK = 0xF10D17C0, 0xF10D17C1


def _cases(root: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for folder in (root, root / "v2"):
        for path in sorted(folder.glob("*.json")):
            doc = json.loads(path.read_text())
            if path.name == "manifest.json":
                continue
            for case in doc["cases"]:
                yield int(doc["protocol_version"]), case


def _name(case_id: str, suffix: str = "") -> str:
    return "vec-" + case_id.replace("/", "__") + suffix


def _stream(flags: int, sizes: bytes, payload: bytes) -> bytes:
    return bytes((flags, len(sizes))) + sizes + payload


def _vbit(version: int) -> int:
    return 1 if version >= 3 else 0


def _loopback(head: bytes, version: int, sbit: int, sizes: bytes, payload: bytes,
              world_size: int | None = None) -> bytes:
    """A ``loopback_stream`` input: the direction that ``head`` (a handshake or an ack) opens,
    its world size checked when it is the target's 4."""
    to_rank = len(head) == 8
    flags = _vbit(version) | sbit | (0x20 if to_rank else 0) | (0x40 if world_size == 4 else 0)
    return _stream(flags, sizes, head + payload)


#: ``decode_stream``'s leg values (flags bits 0-1; 0 lets ``detect_leg`` tell)
DECODE_LEG = {"auto": 0, "mux": 1, "loopback": 2, "frame": 3}


def _decode_input(leg: str, sbit: int, version: int, wire: bytes, sign: bool = False) -> bytes:
    """A ``decode_stream`` input: ``leg``'s stream with tags checked under the salt of ``sbit``
    (a ``SALT_BIT`` value), the version given, re-signed when ``sign``."""
    flags = DECODE_LEG[leg] | 4 | sbit << 1 | (0x80 if sign else 0)
    return bytes((flags, 2 if version >= 3 else 1)) + wire


def _host_fold_input(c: dict[str, Any], version: int) -> bytes | None:
    """A ``host_fold`` input replaying a relay_fold vector (raw deposits and deaths)."""
    ranks = sorted(c["local_ranks"])
    if not ranks or ranks != list(range(ranks[0], ranks[0] + len(ranks))) or len(ranks) > 4 \
            or ranks[0] > 7:
        return None
    out = bytearray((_vbit(version) | SALT_BIT.get(c["salt"], 0) | SIGN,
                     (len(ranks) - 1) | ranks[0] << 2, 0))
    for step in c["steps"]:
        idx = ranks.index(step["rank"]) if step["rank"] in ranks else None
        if step["step"] == "deposit":
            blob = bytes.fromhex(step["blob"])
            if idx is None or len(blob) > 255:
                return None
            out += bytes((1 | idx << 2, len(blob))) + blob
        else:
            out += bytes((2 | (idx if idx is not None else min(step["rank"], 63)) << 2,))
    return bytes(out)


def _controller_input(c: dict[str, Any], version: int) -> bytes | None:
    """A ``controller_core`` input replaying a controller_session vector's client side."""
    if not 1 <= c["world_size"] <= 4:
        return None
    out = bytearray((_vbit(version) | SALT_BIT.get(c["salt"], 0), c["world_size"] - 1, 0))
    for step in c["steps"]:
        conn = step["conn"]
        if conn > 3:
            return None
        if step["action"] == "connect":
            out += bytes((conn << 3,))
        elif step["action"] == "send":
            raw = bytes.fromhex(step["bytes"])
            for i in range(0, len(raw), 255):
                piece = raw[i:i + 255]
                out += bytes((1 | conn << 3, len(piece))) + piece
        elif step["action"] == "close":
            out += bytes((3 | conn << 3,))
    return bytes(out)


def seeds_from_vectors(root: Path) -> dict[str, dict[str, bytes]]:
    """Map target -> file name -> harness input, for every vector whose bytes fit a target."""
    out: dict[str, dict[str, bytes]] = {}

    def put(target: str, name: str, data: bytes) -> None:
        out.setdefault(target, {})[name] = data

    frame_streams: dict[tuple[int, int], list[bytes]] = {}
    for version, c in _cases(root):
        op, cid = c["op"], c["id"]
        raw = bytes.fromhex(c["bytes"]) if isinstance(c.get("bytes"), str) else None
        sbit = SALT_BIT.get(c.get("salt", ""), 0)
        ok = c["expect"] == "ok"
        if op.startswith("handshake."):
            assert raw is not None
            ack = op.startswith("handshake.ack")
            ws = c.get("expected_world_size", c.get("world_size", 0))
            put("handshake", _name(cid),
                bytes((_vbit(version) | (2 if ack else 0),)) + struct.pack("<I", ws) + raw)
            put("decode_stream", _name(cid), _decode_input("loopback", 0, version, raw))
            put("loopback_stream", _name(cid), _stream(
                _vbit(version) | (0x20 if ack else 0) | (0x40 if ws == 4 else 0), b"\x03", raw))
        elif op.startswith("channel_magic."):
            assert raw is not None
            want = int(c.get("expected", c.get("magic")), 16)
            sel = CHANNEL_ORDER.index(want) | (0x80 if c.get("what") == "relay" else 0)
            put("channel_magic", _name(cid), bytes((sel,)) + raw)
            if "what" not in c:
                put("decode_stream", _name(cid), _decode_input("auto", 0, version, raw))
        elif op.startswith("round_frame."):
            assert raw is not None
            flags = _vbit(version) | sbit | (SIGN if ok else 0)
            put("round_frame", _name(cid), bytes((flags,)) + raw)
            put("stream_round_frame", _name(cid), _stream(flags, b"", raw))
            put("decode_stream", _name(cid), _decode_input("frame", sbit, version, raw, ok))
            if ok:
                frame_streams.setdefault((sbit, version), []).append(raw)
        elif op.startswith("mux_record."):
            assert raw is not None
            flags = _vbit(version) | sbit | (SIGN if ok else 0)
            put("mux_record", _name(cid), bytes((flags,)) + raw)
            put("mux_stream", _name(cid), _stream(flags | 0x20, b"", raw))
            put("decode_stream", _name(cid), _decode_input("mux", sbit, version, raw, ok))
            if not ok:  # the same bytes with the tag checks off (as the decode CLI reads)
                put("mux_stream", _name(cid, "-untagged"), _stream(flags | 0xA0, b"", raw))
            if "bincode" in c:
                put("control", _name(cid), bytes((_vbit(version),)) + bytes.fromhex(c["bincode"]))
        elif op.startswith("len_framed."):
            assert raw is not None
            put("len_framed", _name(cid), bytes((0x20 * _vbit(version),)) + raw)
            put("stream_len_framed", _name(cid), _stream(0, b"", raw))
            put("decode_stream", _name(cid), _decode_input("loopback", 0, version, raw))
        elif op.startswith("framed_round."):
            assert raw is not None
            flags = 1 | sbit | 0x20 * _vbit(version)
            put("len_framed", _name(cid), bytes((flags,)) + raw)
            ack = struct.pack("<II", HANDSHAKE_MAGIC_ACK, version)
            put("loopback_stream", _name(cid), _loopback(ack, version, sbit, b"\x07", raw))
        elif op == "relay_fold":
            fold_input = _host_fold_input(c, version)
            if fold_input is not None:
                put("host_fold", _name(cid), fold_input)
            blobs = [bytes.fromhex(s["blob"]) for s in c["steps"] if s["step"] == "deposit"]
            framed = b"".join(struct.pack("<I", len(b)) + b for b in blobs)
            put("stream_len_framed", _name(cid), _stream(0, b"\x01\x05", framed))
            ws = len(c["local_ranks"])
            hs = struct.pack("<IIII", HANDSHAKE_MAGIC_RANK, version, 0, ws)
            put("loopback_stream", _name(cid), _loopback(
                hs, version, SALT_BIT.get(c["salt"], 0), b"\x05\x1d", framed, ws))
            put("decode_stream", _name(cid), _decode_input("loopback", SALT_BIT.get(c["salt"], 0),
                                                           version, framed))
            for i, blob in enumerate(blobs[:2]):
                put("round_frame", _name(cid, f"-deposit{i}"),
                    bytes((_vbit(version) | sbit | SIGN,)) + blob)
            for i, rec in enumerate(c.get("records", [])[:1]):
                put("mux_record", _name(cid, f"-record{i}"),
                    bytes((_vbit(version) | sbit | SIGN,)) + bytes.fromhex(rec["record_bytes"]))
        elif op == "controller_session":
            core_input = _controller_input(c, version)
            if core_input is not None:
                put("controller_core", _name(cid), core_input)
            sbit = SALT_BIT.get(c["salt"], 0)
            sent: dict[int, bytes] = {}
            recv: dict[int, bytes] = {}
            for s in c["steps"]:
                if s["action"] == "send":
                    sent[s["conn"]] = sent.get(s["conn"], b"") + bytes.fromhex(s["bytes"])
                elif s["action"] == "recv":
                    recv[s["conn"]] = recv.get(s["conn"], b"") + bytes.fromhex(s["bytes"])
            for conn, stream in sorted(sent.items())[:2]:  # relay -> controller: the magic first
                flags = _vbit(version) | sbit | SIGN
                put("mux_stream", _name(cid, f"-send{conn}"), _stream(flags, b"\x05\x1d", stream))
                put("mux_stream", _name(cid, f"-send{conn}-copy"),
                    _stream(flags | 0x40, b"\x0b\x03", stream))
                put("decode_stream", _name(cid, f"-send{conn}"),
                    _decode_input("auto", sbit, version, stream))
            for conn, stream in sorted(recv.items())[:1]:  # controller -> relay: no magic
                flags = _vbit(version) | sbit | SIGN | 0x20
                put("mux_stream", _name(cid, f"-recv{conn}"), _stream(flags, b"\x19\x01", stream))
                put("decode_stream", _name(cid, f"-recv{conn}"),
                    _decode_input("mux", sbit, version, stream))
    for (sbit, version), frames in sorted(frame_streams.items()):
        flags = _vbit(version) | sbit | SIGN
        tag = f"v{version}-salt{sbit >> 2}"
        put("stream_round_frame", f"seed-three-frames-{tag}",
            _stream(flags, b"\x01", b"".join(frames[:3])))
        put("stream_round_frame", f"seed-frames-odd-chunks-{tag}",
            _stream(flags, b"\x07\x00\x03\x11", b"".join(frames[:5])))
        put("decode_stream", f"seed-three-frames-{tag}",
            _decode_input("auto", sbit, version, b"".join(frames[:3])))
    return out


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _host_fold_seeds() -> dict[str, bytes]:
    """Built-frame rounds for the fold: both versions, f32 and bf16, elided and dead ranks."""
    three = _f32(1.5, -2.0, 3e38)
    out: dict[str, bytes] = {}
    for version in (2, 3):
        v = _vbit(version)
        # two local ranks, schema: one tensor of shape (3,) (f32, then bf16)
        out[f"seed-two-ranks-f32-v{version}"] = bytes((v, 1, 1, 4, 0x00, 0x00)) + three + bytes(
            (0x04, 0x00)) + _f32(0.25, float("nan"), 3e38) + bytes((0x00, 0x02)) + three + bytes(
            (0x06,))
        out[f"seed-two-ranks-bf16-v{version}"] = bytes((v, 1, 1, 5, 0x00, 0x00)) + three[:6] \
            + bytes((0x04, 0x00)) + three[6:] + bytes((0x06, 0x0A))
        out[f"seed-elided-then-data-v{version}"] = bytes((v, 2, 2, 4, 3, 0x00, 0x10)) + bytes(
            (0x04, 0x00)) + three + b"\x80\x3f" + bytes((0x08, 0x10))
        out[f"seed-death-completes-v{version}"] = bytes((v, 3, 1, 2, 0x00, 0x02)) + _f32(7.0) \
            + bytes((0x06, 0x0A, 0x0E, 0x01, 0x00))
        out[f"seed-schema-mismatch-v{version}"] = bytes((v, 1, 1, 4, 0x00, 0x00)) + three + bytes(
            (0x04, 0x40)) + three
        out[f"seed-misuse-non-local-v{version}"] = bytes((v, 0, 0, 0x03, 0x00, 0x00, 0x02))
    return out


def _controller_seeds() -> dict[str, bytes]:
    """Built sessions for the controller: one round with two relays, then exits and failures."""
    vals = _f32(1.5, -2.0, 3.0)
    hello_round = bytes((0x02, 2, 0x22, 0, 1, 5, 0x0A, 0, 0x2A, 1, 2, 0x10, 0x42, 0)) + vals \
        + bytes((7, 0x4A, 0)) + vals + bytes((0x30,))
    out: dict[str, bytes] = {}
    for version in (2, 3):
        v = _vbit(version)
        head = bytes((v, 1, 1, 4))
        out[f"seed-round-then-rank-exit-v{version}"] = head + hello_round + bytes((0x62, 0, 3))
        out[f"seed-two-rounds-v{version}"] = head + hello_round + bytes((0x42, 2)) + vals \
            + bytes((1, 0x4A, 2)) + vals + bytes((9, 0x1B))
        out[f"seed-death-mid-round-v{version}"] = head + hello_round + bytes((0x42, 0)) + vals \
            + bytes((7, 0x0E, 0x05, 0x05))
        out[f"seed-broadcast-write-fails-v{version}"] = head + hello_round \
            + bytes((0x24, 0x42, 0)) + vals + bytes((7,))
        out[f"seed-handshake-timeout-v{version}"] = head + bytes((0x00, 0xFD, 0xFD))
        out[f"seed-data-record-v{version}"] = head + hello_round + bytes((0xAA, 3, 1, 2, 3, 9))
        # outer optimizer (bits 5-6) and checkpoint windows (bit 7): Control round, two Model
        # rounds, then a Model round whose frames drop their tensor (a schema change)
        for name, outer in (("avg", 0x20), ("slowmo", 0x40), ("nesterov", 0x60)):
            out[f"seed-outer-{name}-checkpoint-v{version}"] = bytes((v | outer | 0x80, 1, 1, 4)) \
                + hello_round.replace(bytes((0x42, 0)), bytes((0x42, 1))).replace(
                    bytes((0x4A, 0)), bytes((0x4A, 1))) \
                + bytes((0x42, 0)) + vals + bytes((3, 0x4A, 0)) + vals + bytes((9,)) \
                + bytes((0x42, 4)) + vals + bytes((3, 0x4A, 4)) + vals + bytes((9,)) \
                + bytes((0x42, 0x80)) + vals + bytes((3, 0x4A, 0x80)) + vals \
                + bytes((9, 0x62, 0, 3))
        # a single relay: its frame alone is the round (reaches the reduce's own checks)
        out[f"seed-single-relay-v{version}"] = bytes((v, 0, 1, 4, 0x02, 1, 0x22, 7, 1, 2)) \
            + bytes((0x42, 0)) \
            + vals + bytes((5, 0x42, 0x40)) + vals + bytes((5,))
    return out


def _relay_seeds() -> dict[str, bytes]:
    """Built relay sessions: handshakes, dial, HelloAck, rounds, Broadcast, deaths and the drain,
    then the ways the accept phase and the fold fail."""
    vals = _f32(1.5, -2.0, 3.0)
    accept = bytes((0x00, 0, 0x00, 1, 0x01, 0x02))  # ranks 0 and 1, dial, HelloAck
    out: dict[str, bytes] = {}
    for version in (2, 3):
        v = _vbit(version)
        head = bytes((v, 0x01, 1, 4))  # local ranks 0-1 of 2; one f32 tensor of shape (3,)
        out[f"seed-rounds-then-drain-v{version}"] = head + accept \
            + bytes((0x03, 0x00)) + vals + bytes((0x0B, 0x02)) + vals \
            + bytes((0x0A, 0x00)) + vals + bytes((0x03, 0x00)) + vals \
            + bytes((0x0C, 0x04, 0x05))
        out[f"seed-declare-dead-mid-round-v{version}"] = head + accept \
            + bytes((0x03, 0x00)) + vals + bytes((0x12, 1, 0x12, 5, 0x0A, 0x00)) + vals \
            + bytes((0x3A,))
        out[f"seed-elided-deposit-v{version}"] = head + accept \
            + bytes((0x03, 0x10, 0x0B, 0x00)) + vals + bytes((0x0B, 0x10, 0x03, 0x10))
        out[f"seed-double-deposit-v{version}"] = head + accept \
            + bytes((0x03, 0x00)) + vals + bytes((0x03, 0x00)) + vals
        out[f"seed-raw-blob-v{version}"] = head + accept + bytes((0x43, 5, 1, 2, 3, 4, 5))
        out[f"seed-bad-world-size-v{version}"] = head + bytes((0x10, 0))
        out[f"seed-duplicate-rank-v{version}"] = head + bytes((0x00, 0, 0x00, 0))
        out[f"seed-rank-not-in-host-v{version}"] = head + bytes((0x00, 2))
        out[f"seed-broadcast-before-helloack-v{version}"] = head + bytes((0x00, 0, 0x00, 1, 0x01,
                                                                          0x0A, 0x00)) + vals
        out[f"seed-eof-before-helloack-v{version}"] = head + bytes((0x00, 0, 0x00, 1, 0x01, 0x3A))
    return out


def hand_seeds() -> dict[str, dict[str, bytes]]:
    """Hostile length claims and edge cases that the vectors do not cover."""
    rf_magic = struct.pack("<I", 0xF10D17F1)
    mux = struct.pack("<II", 0xF10D17D0, 1)
    weight = struct.pack("<d", 1.0)

    def frame_of(size: int) -> bytes:
        """A bare frame of ``size`` bytes (at least 39): one tensor of an unknown dtype whose
        ``nbytes`` fills it (a reader's leniency), tag zero (``decode_stream`` re-signs it)."""
        n = size - 39
        return rf_magic + struct.pack("<I", 1) + b"\0" + weight + b"\x07\x01" \
            + struct.pack("<IQ", n, n) + bytes(n) + bytes(8)

    # decode_stream flags: the leg, tags checked (4), the 1 KiB ceiling (0x20), re-signed (0x80)
    at_kib = 4 | 0x20 | 0x80
    return {
        "decode_stream": {  # a record at the ceiling and one byte past it, for each bound
            "seed-frame-at-ceiling": bytes((DECODE_LEG["frame"] | at_kib, 1)) + frame_of(1024),
            "seed-frame-past-ceiling": bytes((DECODE_LEG["frame"] | at_kib, 1))
            + frame_of(1025),
            "seed-data-record-at-ceiling": bytes((DECODE_LEG["mux"] | at_kib, 1)) + mux + b"\1"
            + bytes(4) + struct.pack("<I", 1024) + bytes(8) + bytes(1024),
            "seed-data-record-past-ceiling": bytes((DECODE_LEG["mux"] | at_kib, 1)) + mux
            + b"\1" + bytes(4) + struct.pack("<I", 1025) + bytes(8) + bytes(1025),
            "seed-len-framed-at-ceiling": bytes((DECODE_LEG["loopback"] | at_kib, 1))
            + struct.pack("<I", 1024) + frame_of(1024),
            "seed-len-framed-past-ceiling": bytes((DECODE_LEG["loopback"] | at_kib, 1))
            + struct.pack("<I", 1025) + frame_of(1025),
        },
        "round_frame": {
            "seed-tensor-cap-plus-one": bytes((SIGN,)) + rf_magic + struct.pack("<I", 65537),
            "seed-tensor-cap-no-tensors": bytes((SIGN,)) + rf_magic
            + struct.pack("<I", 65536) + b"\0" + weight,
            "seed-nbytes-u64-max": bytes((SIGN,)) + rf_magic + struct.pack("<I", 1) + b"\0"
            + weight + b"\0\0" + b"\xff" * 8,
            "seed-nbytes-sum-past-ceiling": bytes((SIGN | 0x18,)) + rf_magic
            + struct.pack("<I", 2) + b"\1" + weight + b"\0\0" + struct.pack("<Q", 0)
            + b"\0\0" + struct.pack("<Q", 1),
            "seed-ndim-255": bytes((SIGN,)) + rf_magic + struct.pack("<I", 1) + b"\0" + weight
            + b"\1\xff" + b"\1\0\0\0" * 255 + struct.pack("<Q", 0) + bytes(8),
            "seed-elided-huge-v3": bytes((SIGN | 1,)) + rf_magic + struct.pack("<I", 1) + b"\0"
            + weight + b"\0\2" + b"\xff\xff\xff\xff" * 2 + struct.pack("<Q", 0) + bytes(8),
            "seed-negative-zero-weight": bytes((SIGN,)) + rf_magic + struct.pack("<I", 0) + b"\0"
            + struct.pack("<d", -0.0) + bytes(8),
            "seed-negative-weight": bytes((SIGN,)) + rf_magic + struct.pack("<I", 0) + b"\0"
            + struct.pack("<d", -0.5) + bytes(8),
        },
        "mux_record": {
            "seed-payload-len-4gib": bytes((SIGN,)) + mux + b"\3" + bytes(4)
            + b"\xff\xff\xff\xff" + bytes(8),
            "seed-payload-len-at-ceiling": bytes((SIGN,)) + mux + b"\3" + bytes(4)
            + struct.pack("<I", 1 << 30) + bytes(8),
            "seed-control-vec-len-u64-max": bytes((SIGN,)) + mux + b"\2" + bytes(4)
            + struct.pack("<I", 13) + bytes(8) + b"\0\0\xfd" + b"\xff" * 8 + b"\0\0",
        },
        "control": {
            "seed-host-len-u64-max": b"\1\0\xfd" + b"\xff" * 8,
            "seed-ranks-len-u64-max": b"\0\0\0\xfd" + b"\xff" * 8 + b"\1",
            "seed-model-sigs-len-u64-max": b"\1\0\0\0\xfd" + b"\xff" * 8,
            "seed-noncanonical-rank": b"\0\2\xfc\1\0\0\0",
            "seed-reserved-marker": b"\0\2\xff",
            "seed-u128-marker-for-u32": b"\0\2\xfe" + b"\0" * 16,
            "seed-bad-utf8-host": b"\0\0\2\xc3\x28\0",
            "seed-v3-hello-to-v2-reader": b"\0\0\2h0\2\0\1\1" + bytes(32),
        },
        "len_framed": {
            "seed-prefix-u32-max": b"\0\xff\xff\xff\xff",
            "seed-framed-prefix-u32-max": b"\1\xff\xff\xff\xff",
            "seed-framed-zero-prefix": b"\1\0\0\0\0",
        },
        "stream_round_frame": {
            "seed-cap-byte-by-byte": _stream(SIGN, b"\1", rf_magic + struct.pack("<I", 65537)),
            "seed-nbytes-at-ceiling-then-eof": _stream(
                SIGN, b"\3", rf_magic + struct.pack("<I", 1) + b"\0" + weight + b"\0\0"
                + struct.pack("<Q", 1 << 30)),
        },
        "mux_stream": {
            "seed-payload-len-4gib": _stream(SIGN | 0x20, b"\1", mux + b"\3" + bytes(4)
                                             + b"\xff\xff\xff\xff" + bytes(8)),
            "seed-magic-then-eof": _stream(0, b"\1", b"\xe1\x17\x0d"),
        },
        "host_fold": _host_fold_seeds(),
        "controller_core": _controller_seeds(),
        "relay_core": _relay_seeds(),
        "loopback_stream": {
            # flags 0x10: the 1 KiB ceiling; a prefix at it, and one past it with its body, fed
            # byte by byte
            "seed-prefix-at-1kib-byte-by-byte": _stream(
                0x10, b"\1", struct.pack("<IIII", HANDSHAKE_MAGIC_RANK, 2, 0, 1)
                + struct.pack("<I", 1024)),
            "seed-prefix-over-1kib-byte-by-byte": _stream(
                0x10, b"\1", struct.pack("<IIII", HANDSHAKE_MAGIC_RANK, 2, 0, 1)
                + struct.pack("<I", 1025) + bytes(1025)),
            "seed-zero-prefix-to-rank": _stream(
                0x20, b"", struct.pack("<II", HANDSHAKE_MAGIC_ACK, 2) + bytes(4)),
            "seed-zero-prefix-to-relay": _stream(
                0, b"", struct.pack("<IIII", HANDSHAKE_MAGIC_RANK, 2, 7, 4) + bytes(4)),
            "seed-ack-where-the-handshake-is": _stream(
                0, b"", struct.pack("<II", HANDSHAKE_MAGIC_ACK, 2)),
        },
        "stream_len_framed": {
            "seed-prefix-at-ceiling-then-eof": _stream(0, b"\1", struct.pack("<I", 1 << 30)),
            "seed-prefix-u32-max": _stream(0, b"", b"\xff\xff\xff\xff"),
            "seed-empty-blobs": _stream(0, b"\2\0", bytes(12)),
        },
    }


def write(seeds: dict[str, dict[str, bytes]]) -> int:
    """Replace the ``vec-*`` / ``seed-*`` files of each target with ``seeds``; return the count."""
    n = 0
    for target, files in sorted(seeds.items()):
        d = CORPUS / target
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            if old.name.startswith(("vec-", "seed-")):
                old.unlink()
        for name, data in sorted(files.items()):
            (d / name).write_bytes(data)
            n += 1
    return n


def main(argv: list[str]) -> int:
    """Entry point: regenerate the corpus from the vectors folder given or the default."""
    if len(argv) > 1:
        root = Path(argv[1])
    elif os.environ.get("FLODL_VECTORS"):
        root = Path(os.environ["FLODL_VECTORS"])
    else:  # the shared folder beside the checkout, else the copy bundled with the package
        root = HERE.parent.parent / "shared" / "vectors"
        if not root.is_dir():
            root = HERE.parent / "flodl_proto" / "_vectors"
    if not root.is_dir():
        print(f"vectors folder {root} not found", file=sys.stderr)
        return 2
    seeds = seeds_from_vectors(root)
    for target, files in hand_seeds().items():
        seeds.setdefault(target, {}).update(files)
    print(f"wrote {write(seeds)} corpus files under {CORPUS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Target ``handshake``: the 16-byte rank handshake and the 8-byte ack, versions 2 and 3.

Input layout: ``flags u8 | expected world size u32 LE | wire bytes``; flags bit 0 picks the
version (0: 2, 1: 3), bit 1 reads an ack instead of a handshake.

Oracle: besides "a value or a RemoteProtocolError", the error must be the one the spec names for
the first failing check (truncated, magic, version, world size, in that order), and an accepted
input re-encodes to its first 16 (8) bytes. ``rank >= world_size`` is accepted (leniency
``rank_beyond_world``).
"""

from __future__ import annotations

import struct

from flodl_proto.codec import decode_ack, decode_handshake, encode_ack, encode_handshake
from flodl_proto.errors import BadMagic, InvalidValue, TruncatedInput, VersionMismatch
from flodl_proto.spec import HANDSHAKE_MAGIC_CONTROLLER_ACK, HANDSHAKE_MAGIC_RANK

from .common import Params, check, remote


def _expected_error(wire: bytes, magic: int, version: int, ws: int | None) -> type | None:
    size = 16 if ws is not None else 8
    if len(wire) < size:
        return TruncatedInput
    got_magic, got_version = struct.unpack_from("<II", wire)
    if got_magic != magic:
        return BadMagic
    if got_version != version:
        return VersionMismatch
    if ws is not None and struct.unpack_from("<I", wire, 12)[0] != ws:
        return InvalidValue
    return None


def test_one_input(data: bytes) -> None:
    """Decode a handshake or an ack from ``data`` (layout in the module docstring) and check it."""
    p = Params(data)
    flags = p.u8()
    ws = p.u32()
    wire = p.rest()
    version = 3 if flags & 1 else 2
    if flags & 2:
        n, err = remote(decode_ack, wire, version)
        want = _expected_error(wire, HANDSHAKE_MAGIC_CONTROLLER_ACK, version, None)
        if err is None:
            check(want is None, f"ack {wire[:8].hex()} accepted; spec says {want}")
            check(n == 8, f"ack consumed {n}")
            check(encode_ack(version) == wire[:8], "ack re-encodes differently")
        else:
            check(want is not None and isinstance(err, want),
                  f"ack error {err!r}, spec says {want}")
        return
    res, err = remote(decode_handshake, wire, ws, version)
    want = _expected_error(wire, HANDSHAKE_MAGIC_RANK, version, ws)
    if err is not None:
        check(want is not None and isinstance(err, want),
              f"handshake error {err!r}, spec says {want}")
        return
    check(want is None and res is not None,
          f"handshake {wire[:16].hex()} accepted; spec says {want}")
    assert res is not None
    hs, n = res
    check(n == 16 and hs.world_size == ws and hs.version == version, f"decoded {hs}, {n}")
    again = encode_handshake(hs.rank, hs.world_size, hs.version)
    check(again == wire[:16], f"handshake re-encodes to {again.hex()}, not {wire[:16].hex()}")

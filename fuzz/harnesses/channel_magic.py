"""Target ``channel_magic``: the 4-byte channel-select magic every cross-host dial starts with.

Input layout: ``selector u8 | wire bytes``; the selector picks the expected channel (the spec's
``Channel`` enum, in code order) and, in bit 7, the subsystem name used in the error.

Oracle: fewer than 4 bytes is TruncatedInput (never a clean end of stream), a different magic is
BadMagic, the expected one is consumed (4 bytes) and re-encodes identically.
"""

from __future__ import annotations

from flodl_proto.codec import encode_channel_magic, expect_channel_magic
from flodl_proto.errors import BadMagic, TruncatedInput
from flodl_proto.spec import CHANNELS

from .common import Params, check, remote

_CHANNELS = sorted(CHANNELS.items(), key=lambda kv: kv[1])


def test_one_input(data: bytes) -> None:
    """Check the channel magic at the start of ``data`` (layout in the module docstring)."""
    p = Params(data)
    sel = p.u8()
    wire = p.rest()
    name, expected = _CHANNELS[(sel & 0x7F) % len(_CHANNELS)]
    what = "relay" if sel & 0x80 else "cluster_controller"
    n, err = remote(expect_channel_magic, wire, expected, what)
    if len(wire) < 4:
        check(isinstance(err, TruncatedInput), f"{len(wire)} bytes gave {n!r} / {err!r}")
    elif wire[:4] != encode_channel_magic(name):
        check(isinstance(err, BadMagic), f"magic {wire[:4].hex()} gave {n!r} / {err!r}")
    else:
        check(err is None and n == 4, f"good magic gave {n!r} / {err!r}")
        check(encode_channel_magic(expected) == wire[:4], "magic re-encodes differently")
    if err is not None:
        check(str(err).startswith(what + ":"), f"error does not name {what}: {err}")

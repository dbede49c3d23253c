"""Target ``control``: a bincode-2 ``RelayControlMsg`` read by ``decode_control`` (the payload of
a Control mux record, fuzzed directly so no record MAC stands in the way).

Input layout: ``flags u8 | bincode bytes``; flags bit 0 picks the version (0: 2, 1: 3), which
decides whether ``Hello`` carries ``model_sigs``.

Oracle: a message or a remote TruncatedInput / InvalidValue. An accepted message re-encodes to
the bytes it was read from when every varint in them is minimal (non-minimal varints and trailing
bytes are the spec's ``noncanonical_varint`` and ``bincode_trailing`` leniencies; then the
re-encoding is shorter and decodes to the same message). Whatever a version-3 reader accepts, a
version-2 reader accepts too, with the same message minus ``model_sigs``. The harness measures the
message with its own small bincode walker, independent of the package's.
"""

from __future__ import annotations

from flodl_proto.codec import Hello, decode_control, encode_control
from flodl_proto.errors import InvalidValue, TruncatedInput

from .common import Params, check, remote

_MARKERS = {0xFB: (2, 251), 0xFC: (4, 1 << 16), 0xFD: (8, 1 << 32)}


def measure_control(b: bytes, version: int) -> tuple[int, bool]:
    """Walk an already-accepted control message: ``(bytes it spans, every varint minimal)``."""
    pos = 0
    minimal = True

    def varint() -> int:
        nonlocal pos, minimal
        marker = b[pos]
        pos += 1
        if marker <= 250:
            return marker
        width, lowest = _MARKERS[marker]
        value = int.from_bytes(b[pos:pos + width], "little")
        pos += width
        if value < lowest:
            minimal = False
        return value

    variant = varint()
    if variant == 0:
        n = varint()
        pos += n  # host
        for _ in range(varint()):
            varint()  # ranks
        if version >= 3:
            n = varint()
            pos += 32 * n  # model_sigs
    elif variant in (2, 3):
        varint()
    return pos, minimal


def check_control(payload: bytes, version: int) -> None:
    """Decode ``payload`` as a control message at ``version`` and apply the oracle."""
    msg, err = remote(decode_control, payload, version)
    if err is not None:
        check(isinstance(err, TruncatedInput | InvalidValue), f"unexpected error kind {err!r}")
        check(str(err).startswith("relay_mux: bincode decode failed"), f"wording: {err}")
        return
    assert msg is not None
    used, minimal = measure_control(payload, version)
    check(used <= len(payload), f"walker measured {used} of {len(payload)} bytes")
    again = encode_control(msg, version)
    check(decode_control(again, version) == msg, f"{msg!r} does not survive re-encoding")
    if minimal:
        check(again == payload[:used],
              f"{msg!r}: re-encoded {again.hex()} != accepted {payload[:used].hex()}")
    else:
        check(len(again) < used, f"non-minimal input {payload[:used].hex()} -> {again.hex()}")
    if version >= 3:
        m2, err2 = remote(decode_control, payload, 2)
        check(err2 is None, f"v3 accepts {payload.hex()} but v2 rejects it: {err2!r}")
        want = Hello(msg.host, msg.ranks) if isinstance(msg, Hello) else msg
        check(m2 == want, f"v2 read {m2!r}, v3 read {msg!r}")


def test_one_input(data: bytes) -> None:
    """Decode one control message from ``data`` (layout in the module docstring)."""
    p = Params(data)
    version = 3 if p.u8() & 1 else 2
    check_control(p.rest(), version)

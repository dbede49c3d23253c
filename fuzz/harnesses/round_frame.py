"""Target ``round_frame``: one RoundFrame read by ``decode_round_frame_or_eos`` (and walked by
``round_frame_extent``).

Input layout: ``flags u8 | wire bytes``. Flags: bit 0 protocol version (0: 2, 1: 3; a frame
carries no version, it only decides how the tensors are used afterwards), bit 1 re-sign the frame's
tag before reading (so the fuzzer gets past the HMAC), bit 2 salt (``zero`` / ``b``), bits 3-4 the
frame ceiling (1 GiB, 64 MiB, 1 KiB, 0).

Oracle: fewer than 8 bytes is END_OF_STREAM; the structural walker and the decoder agree (same
pre-tag error, or a truncation error exactly when the walker needs data, or an auth error exactly
when the walk completes); an accepted frame is exactly what the walker measured, re-encodes to the
same bytes, fails with the other salt, fails one byte short, and its tensors can be viewed.
"""

from __future__ import annotations

from flodl_proto.codec import (
    END_OF_STREAM,
    NeedData,
    decode_round_frame_or_eos,
    round_frame_extent,
)
from flodl_proto.errors import AuthenticationError, TruncatedInput
from flodl_proto.spec import MAX_ROUND_FRAME_TENSORS, ROUND_FRAME_HEADER_LEN

from .common import (
    CEILINGS,
    SALTS,
    Params,
    check,
    check_frame_reencodes,
    exercise_views,
    outcome_of,
    remote,
    resign_round_frames,
)


def test_one_input(data: bytes) -> None:
    """Decode one RoundFrame from ``data`` (layout in the module docstring) and check it."""
    p = Params(data)
    flags = p.u8()
    wire = p.rest()
    version = 3 if flags & 1 else 2
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    if flags & 2:
        buf = bytearray(wire)
        resign_round_frames(buf, salt, ceiling, once=True)
        wire = bytes(buf)

    res, err = remote(decode_round_frame_or_eos, wire, salt, ceiling=ceiling)
    ext, ext_err = remote(round_frame_extent, wire, ceiling=ceiling)
    if len(wire) < ROUND_FRAME_HEADER_LEN:
        check(res is END_OF_STREAM, f"{len(wire)} bytes (inside the header) gave {res!r} / {err!r}")
        check(isinstance(ext, NeedData), f"walker on {len(wire)} bytes gave {ext!r}")
        return
    check(res is not END_OF_STREAM, f"END_OF_STREAM after {len(wire)} bytes")
    if ext_err is not None:
        check(outcome_of(err) == outcome_of(ext_err),
              f"walker raised {ext_err!r} but decoder gave {res!r} / {err!r}")
        return
    if isinstance(ext, NeedData):
        check(isinstance(err, TruncatedInput),
              f"walker needs data but decoder gave {res!r}/{err!r}")
        check(ext.nbytes >= 1, f"NeedData({ext.nbytes})")
        return
    if err is not None:
        check(isinstance(err, AuthenticationError), f"walk complete but decoder raised {err!r}")
        return
    assert res is not None and res is not END_OF_STREAM
    frame, n = res
    check(n == ext, f"decoder consumed {n}, walker measured {ext}")
    check(len(frame.tensors) <= MAX_ROUND_FRAME_TENSORS, "tensor cap")
    check(sum(t.nbytes for t in frame.tensors) <= ceiling, "ceiling")
    check_frame_reencodes(frame, salt, wire[:n], "round_frame")
    other = SALTS[1 - ((flags >> 2) & 1)]
    _, err2 = remote(decode_round_frame_or_eos, wire[:n], other, ceiling=ceiling)
    check(isinstance(err2, AuthenticationError),
          f"frame also verified under the other salt: {err2!r}")
    _, err3 = remote(decode_round_frame_or_eos, wire[:n - 1], salt, ceiling=ceiling)
    check(isinstance(err3, TruncatedInput), f"frame one byte short gave {err3!r}")
    exercise_views(frame, version)

"""Target ``round_frame``: one RoundFrame read by ``decode_round_frame_or_eos`` (and walked by
``round_frame_extent``).

Input layout: ``flags u8 | wire bytes``. Flags: bit 0 protocol version (0: 2, 1: 3; a frame
carries no version, it only decides how the tensors are used afterwards), bit 1 re-sign the frame's
tag before reading (so the fuzzer gets past the HMAC), bit 2 salt (``zero`` / ``b``), bits 3-4 the
frame ceiling (1 GiB, 64 MiB, 1 KiB, 0).

Oracle: fewer than 8 bytes is END_OF_STREAM; the header's value checks, read here from the bytes
(the walker and the decoder share theirs), fail first and in the spec's order: the magic, the
tensor count against ``MAX_ROUND_FRAME_TENSORS``, the kind byte (0 or 1), the weight (finite and
not below zero; -0.0 passes), and a header that passes them raises none of their errors; the
structural walker and the decoder agree (same
pre-tag error, or a truncation error exactly when the walker needs data, or an auth error exactly
when the walk completes); an accepted frame is exactly what the walker measured, re-encodes to the
same bytes, fails with the other salt, fails one byte short, and its tensors can be viewed.
"""

from __future__ import annotations

import math
import struct

from flodl_proto.codec import (
    END_OF_STREAM,
    NeedData,
    decode_round_frame_or_eos,
    round_frame_extent,
)
from flodl_proto.errors import AuthenticationError, TruncatedInput
from flodl_proto.spec import (
    MAX_ROUND_FRAME_TENSORS,
    ROUND_FRAME_HEADER_LEN,
    ROUND_FRAME_MAGIC,
    ROUND_KIND_CONTROL,
    ROUND_KIND_MODEL,
)

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

#: magic and tensor count, the frame's first 8 bytes, then the kind byte and the f64 weight
#: (read here, not by the codec's walker, which the decoder shares)
_HEADER = struct.Struct("<II")
_KIND_WEIGHT = struct.Struct("<Bd")
#: what the header checks raise (the value checks; truncations are checked by the walk below)
_HEADER_ERRORS = ("frame.bad_magic", "frame.too_many_tensors", "frame.unknown_kind",
                  "frame.bad_weight")


def _header_error(wire: bytes) -> str | None:
    """The error id of the first failing header check, in the spec's order (magic, tensor cap,
    kind, weight), for at least 8 bytes; None when they pass or the bytes end first."""
    magic, count = _HEADER.unpack_from(wire)
    if magic != ROUND_FRAME_MAGIC:
        return "frame.bad_magic"
    if count > MAX_ROUND_FRAME_TENSORS:
        return "frame.too_many_tensors"
    if len(wire) < 9:
        return None
    if wire[8] not in (ROUND_KIND_MODEL, ROUND_KIND_CONTROL):
        return "frame.unknown_kind"
    if len(wire) < 17:
        return None
    weight = _KIND_WEIGHT.unpack_from(wire, 8)[1]
    if not math.isfinite(weight) or weight < 0.0:  # -0.0 is a weight
        return "frame.bad_weight"
    return None


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
    want = _header_error(wire)
    got = None if err is None else err.error_id
    if want is not None or got in _HEADER_ERRORS:
        check(got == want, f"header {wire[:17].hex()} gave {res!r} / {err!r}; the spec's "
              f"header checks say {want or 'no header error'}")
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

"""Target ``stream_round_frame``: :class:`~flodl_proto.codec.RoundFrameDecoder` fed back-to-back
RoundFrames in fuzzer-chosen chunks (layout and oracle: :mod:`fuzz.harnesses.streams`).

Flags: bit 1 re-sign every frame, bit 2 salt, bits 3-4 frame ceiling (1 GiB, 64 MiB, 1 KiB, 0).
"""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import END_OF_STREAM, RoundFrameDecoder, decode_round_frame_or_eos
from flodl_proto.errors import ProtocolError

from .common import CEILINGS, SALTS, remote, resign_round_frames
from .streams import check_stream, split_input


def test_one_input(data: bytes) -> None:
    """Stream the frames of ``data`` through a RoundFrameDecoder and check it."""
    flags, sizes, payload = split_input(data)
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    if flags & 2:
        buf = bytearray(payload)
        resign_round_frames(buf, salt, ceiling)
        payload = bytes(buf)

    def reference(b: bytes) -> tuple[list[Any], ProtocolError | None, int]:
        out: list[Any] = []
        pos = 0
        while True:
            res, err = remote(decode_round_frame_or_eos, b[pos:], salt, ceiling=ceiling)
            if err is not None or res is END_OF_STREAM or res is None:
                return out, err, pos
            out.append(res[0])
            pos += res[1]

    check_stream(RoundFrameDecoder(salt, ceiling=ceiling), payload, sizes, reference)

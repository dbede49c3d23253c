"""Target ``stream_len_framed``: :class:`~flodl_proto.codec.LenFramedDecoder` fed loopback
length-prefixed blobs in fuzzer-chosen chunks (layout and oracle: :mod:`fuzz.harnesses.streams`).

Flags: bit 1 re-sign the frame inside each blob (only shapes the bytes: blobs are opaque here),
bit 2 salt, bits 3-4 frame ceiling (1 GiB, 64 MiB, 1 KiB, 0).
"""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import END_OF_STREAM, LenFramedDecoder, decode_len_framed_or_eos
from flodl_proto.errors import ProtocolError

from .common import CEILINGS, SALTS, remote, resign_len_framed
from .streams import check_stream, split_input


def test_one_input(data: bytes) -> None:
    """Stream the blobs of ``data`` through a LenFramedDecoder and check it."""
    flags, sizes, payload = split_input(data)
    ceiling = CEILINGS[(flags >> 3) & 3]
    if flags & 2:
        buf = bytearray(payload)
        resign_len_framed(buf, SALTS[(flags >> 2) & 1], ceiling)
        payload = bytes(buf)

    def reference(b: bytes) -> tuple[list[Any], ProtocolError | None, int]:
        out: list[Any] = []
        pos = 0
        while True:
            res, err = remote(decode_len_framed_or_eos, b[pos:], ceiling=ceiling)
            if err is not None or res is END_OF_STREAM or res is None:
                return out, err, pos
            out.append(bytes(res[0]))
            pos += res[1]

    def same(a: Any, b: Any) -> bool:
        return bytes(a) == b

    check_stream(LenFramedDecoder(ceiling=ceiling), payload, sizes, reference, same)

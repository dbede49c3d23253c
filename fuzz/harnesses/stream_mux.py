"""Target ``stream_mux``: :class:`~flodl_proto.codec.MuxRecordDecoder` fed mux records in
fuzzer-chosen chunks, optionally after the data-channel magic (layout and oracle:
:mod:`fuzz.harnesses.streams`).

Flags: bit 0 protocol version (0: 2, 1: 3), bit 1 re-sign every record, bit 2 salt, bits 3-4
frame ceiling (1 GiB, 64 MiB, 1 KiB, 0), bit 5 expect ``CHANNEL_MAGIC_DATA`` first.
"""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import (
    END_OF_STREAM,
    MuxRecordDecoder,
    decode_mux_record_or_eos,
    expect_channel_magic,
)
from flodl_proto.errors import ProtocolError
from flodl_proto.spec import CHANNEL_MAGIC_DATA

from .common import CEILINGS, SALTS, remote, resign_mux_records
from .streams import check_stream, split_input


def test_one_input(data: bytes) -> None:
    """Stream the records of ``data`` through a MuxRecordDecoder and check it."""
    flags, sizes, payload = split_input(data)
    version = 3 if flags & 1 else 2
    salt = SALTS[(flags >> 2) & 1]
    ceiling = CEILINGS[(flags >> 3) & 3]
    magic = CHANNEL_MAGIC_DATA if flags & 0x20 else None
    if flags & 2:
        buf = bytearray(payload)
        resign_mux_records(buf, salt, ceiling, 4 if magic is not None else 0)
        payload = bytes(buf)

    def reference(b: bytes) -> tuple[list[Any], ProtocolError | None, int]:
        out: list[Any] = []
        pos = 0
        if magic is not None:
            _, err = remote(expect_channel_magic, b, magic)
            if err is not None:
                return out, err, 0
            pos = 4
        while True:
            res, err = remote(decode_mux_record_or_eos, b[pos:], salt, version=version,
                              ceiling=ceiling)
            if err is not None or res is END_OF_STREAM or res is None:
                return out, err, pos
            out.append(res[0])
            pos += res[1]

    def same(a: Any, b: Any) -> bool:
        return bool(a == b and a.control == b.control)

    dec = MuxRecordDecoder(salt, version=version, ceiling=ceiling, expect_magic=magic)
    check_stream(dec, payload, sizes, reference, same)

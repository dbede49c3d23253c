"""FrameRecordImages: small HostFrame / Broadcast records encoded into a kept wire image.

The controller encodes one Broadcast a round, and round after round its consensus has the same
layout (kind, and every tensor's dtype, shape and byte count). For a small frame the general
encoder (:func:`~flodl_proto.codec.mux.encode_frame_record`) spends more time cutting the frame
into pieces and feeding both MACs piece by piece than hashing: about twenty MAC updates for a
frame of four tensors. Here the record of a layout is encoded once by that encoder (so every
check and every error is its own), its bytes are kept in one buffer, and a later frame of the
same layout is written into it: the payloads copied into their places, the weight written, then
the frame's MAC fed once and the record's MAC twice (the 17 covered header bytes, then the
frame and its tag). The bytes are those of the general encoder (tests compare them).

Upstream: ``flodl/src/distributed/relay/mux.rs`` ``write_record`` around
``controller/round_frame.rs`` ``write_round_frame_streamed`` (the same bytes).
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Final

from ..errors import ProtocolError
from ..spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_HEADER_LEN,
    ROUND_FRAME_HEADER_LEN,
)
from ._common import BytesLike, unviewed
from ._walk import _WEIGHT, _FrameWalk
from .auth import new_mac
from .mux import RecordKind, encode_frame_record
from .round_frame import RoundFrame

__all__ = ["IMAGES_KEPT", "IMAGE_MAX_METADATA", "IMAGE_MAX_PAYLOAD", "FrameRecordImages"]

#: frames whose payloads total at most this many bytes are written into a kept image; larger
#: ones take the general encoder (no copy; their MACs may run in parallel)
IMAGE_MAX_PAYLOAD: Final = 64 << 10
#: and whose other bytes (record header, frame and tensor metadata, tags) total at most this
#: many: a frame of many elided or tiny tensors of many dims (up to 65,536 x 1,030 bytes of
#: metadata) is not kept, nor its layout key
IMAGE_MAX_METADATA: Final = 64 << 10
#: layouts whose image is kept (the oldest is dropped for a new one)
IMAGES_KEPT: Final = 4

#: where the frame's weight sits in a record's image
_WEIGHT_AT: Final = MUX_HEADER_LEN + ROUND_FRAME_HEADER_LEN + 1


class _Image:
    """One record's bytes and where its payloads sit (found by the frame reader's own walk)."""

    __slots__ = ("buf", "frame_end", "mac", "spans")

    def __init__(self, parts: list[BytesLike], salt: bytes) -> None:
        self.buf = bytearray(b"".join(parts))
        #: a MAC keyed with the image's salt (part of its key), copied for each tag
        self.mac = new_mac(salt)
        mv = memoryview(self.buf)
        walk = _FrameWalk(len(self.buf))
        walk.advance(mv[MUX_HEADER_LEN:], partial=False)
        #: the end of the frame's body (its tag follows) in the image
        self.frame_end = MUX_HEADER_LEN + walk.pos
        #: per tensor with payload bytes, in frame order: its index and its span in the image
        self.spans = tuple([(i, MUX_HEADER_LEN + at, MUX_HEADER_LEN + at + n)
                            for i, (_, _, at, n) in enumerate(walk.entries) if n])

    def fill(self, frame: RoundFrame) -> memoryview:
        """Write ``frame``'s payloads, weight and both tags (keyed with the image's salt);
        return the whole record, read-only (a write through it would stay in the image: the
        next records of the layout would carry it, signed)."""
        mv = memoryview(self.buf)
        tensors = frame.tensors
        for i, a, b in self.spans:
            mv[a:b] = tensors[i].data
        _WEIGHT.pack_into(mv, _WEIGHT_AT, frame.weight)
        end = self.frame_end
        inner = self.mac.copy()
        inner.update(mv[MUX_HEADER_LEN:end])
        mv[end:] = inner.digest()[:AUTH_TAG_LEN]
        outer = self.mac.copy()
        outer.update(mv[:MUX_AUTH_COVERED_HEADER_LEN])
        outer.update(mv[MUX_HEADER_LEN:])
        mv[MUX_AUTH_COVERED_HEADER_LEN:MUX_HEADER_LEN] = outer.digest()[:AUTH_TAG_LEN]
        return mv.toreadonly()


class FrameRecordImages:
    """The wire images of the small frame records one sender encodes, one per layout.

    :meth:`encode` gives the bytes of :func:`~flodl_proto.codec.mux.encode_frame_record`. A
    frame whose payloads total at most :data:`IMAGE_MAX_PAYLOAD` bytes and its record's other
    bytes at most :data:`IMAGE_MAX_METADATA`, encoded with a :class:`RecordKind`, a salt of
    type ``bytes`` and an ``int`` ceiling, is written into the image kept for its record kind,
    salt, ceiling and layout (frame kind, and per tensor dtype, shape and byte count), when
    there is one and nothing still holds a view of it; anything else (the first frame of a
    layout, a held image, a larger frame, other argument types) is encoded by
    ``encode_frame_record`` itself, which checks and raises as always, and a small frame's
    record is then kept as its layout's image. The general encoder accepted that record kind,
    salt and ceiling and that layout, and its checks read nothing else (the weight and the
    payload bytes are written, not checked), so a frame written into the image needs no check.

    An image is rewritten only when no view of it is alive, so a record handed out stays intact
    while a writer holds it (a new image is built instead). Not thread-safe: one owner (the
    controller core or the relay core, each called under its runner's lock).

    Upstream: ``relay/mux.rs`` ``write_record`` around ``round_frame.rs``
    ``write_round_frame_streamed`` (the same bytes).
    """

    __slots__ = ("_images",)

    def __init__(self) -> None:
        self._images: dict[tuple[Any, ...], _Image] = {}

    def encode(self, kind: RecordKind, frame: RoundFrame, salt: BytesLike, *,
               ceiling: int = DEFAULT_FRAME_CEILING,
               mac_executor: Executor | None = None) -> list[BytesLike]:
        """Encode ``frame`` inside a HostFrame or Broadcast record.

        Args, errors: those of :func:`~flodl_proto.codec.mux.encode_frame_record`.

        Returns:
            The record as buffers for ``socket.sendmsg``: one read-only view of a kept image
            (valid while held: the image is not rewritten meanwhile), or
            ``encode_frame_record``'s buffers.
        """
        key: tuple[Any, ...] | None = None
        if type(salt) is bytes and type(ceiling) is int and type(kind) is RecordKind:
            key = (kind, salt, ceiling, frame.kind,
                   *[(t.dtype, t.shape, t.data.nbytes) for t in frame.tensors])
            image = self._images.get(key)
            if image is not None and unviewed(image.buf):
                return [image.fill(frame)]
        parts = encode_frame_record(kind, frame, salt, ceiling=ceiling,
                                    mac_executor=mac_executor)
        if (key is not None
                and (payload := sum([t.data.nbytes for t in frame.tensors])) <= IMAGE_MAX_PAYLOAD
                and sum([memoryview(p).nbytes for p in parts]) - payload <= IMAGE_MAX_METADATA):
            images = self._images
            if key not in images and len(images) >= IMAGES_KEPT:
                del images[next(iter(images))]
            try:
                image = _Image(parts, key[1])  # the salt, of type bytes
            except ProtocolError:  # pragma: no cover - the walk reads what the encoder wrote
                return parts
            images[key] = image
        return parts

"""Read and write plans: which bytes each auth tag covers, for I/O code that hashes as bytes move.

The socket runners compute MACs while a record or frame is still arriving (and a rank signs its
frame while writing it), then hand the digest to the decoder as a
:class:`~flodl_proto.codec.auth.Premac`.
The coverage rules (``spec/wire.yaml`` ``auth.coverage``) live here, beside the decoders that
check them, so the runners only move the byte ranges a plan names:

* :func:`frame_macs` — a RoundFrame of ``n`` bytes (a loopback blob, a rank's reply): its tag
  covers every byte before the last 8;
* :func:`record_macs` — a mux record from its 25-byte header: the record tag covers header bytes
  ``0..17`` and the payload; a HostFrame's inner frame tag covers the payload before its last 8
  bytes (computed when the frame fills the payload, else the decoder hashes it itself);
* :func:`signed_frame_batches` — a frame's buffers cut into write batches, the tag computed step
  by step as the batches are taken and appended last;
* :func:`frame_premac_for` / :func:`record_premac_for` — the digest of a whole small frame, or of
  a record read in one step, bound to the salt once for a reader's every unit.

Plans hold streaming HMAC objects (``hashlib``/``hmac``); they copy nothing and start no thread.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (frame HMAC over all but the tag),
``relay/mux.rs`` (record HMAC over ``header[0..17] || payload``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._slots import slot_builder
from ..spec import AUTH_TAG_LEN, MUX_AUTH_COVERED_HEADER_LEN, MUX_HEADER_LEN, REC_HOST_FRAME
from ._common import BytesLike, as_view
from .auth import Premac, new_mac
from .mux import MuxHeader

__all__ = [
    "FrameMacs",
    "RecordMacs",
    "frame_macs",
    "frame_premac",
    "frame_premac_for",
    "record_macs",
    "record_premac_for",
    "signed_frame_batches",
]

#: ``_premac(covered, digest)``: ``Premac(covered, digest)`` built without the frozen
#: dataclass's per-field ``object.__setattr__`` (a reader builds one per record or frame)
_premac: Callable[[int, bytes], Premac] = slot_builder(Premac)


@dataclass(slots=True)
class FrameMacs:
    """The MAC of an ``n``-byte RoundFrame buffer, fed as its bytes arrive.

    Attributes:
        mac: a streaming MAC to feed ``buffer[start:stop]``; None when the buffer is too short
            to carry a tag (the decoder then reports the truncation).
        start, stop: the covered byte range of the buffer (bytes).

    Upstream: the frame HMAC of ``controller/round_frame.rs`` (over every byte before the tag).
    """

    mac: Any
    start: int
    stop: int

    def premac(self) -> Premac | None:
        """The digest for the decoder, once every covered byte was fed (None without a MAC)."""
        if self.mac is None:
            return None
        return _premac(self.stop - self.start, self.mac.digest())

    def ranges(self, offset: int = 0) -> list[tuple[Any, int, int]]:
        """``(mac, start, stop)`` for an I/O reader: the covered range shifted by ``offset``
        (where the frame starts in the reader's buffer); empty without a MAC."""
        if self.mac is None:
            return []
        return [(self.mac, self.start + offset, self.stop + offset)]


def frame_macs(n: int, salt: bytes) -> FrameMacs:
    """The plan for a RoundFrame expected to fill an ``n``-byte buffer (``n`` from its length
    prefix): one MAC over ``buffer[0:n-8]``.

    Upstream: the frame HMAC of ``controller/round_frame.rs`` (over every byte before the tag).
    """
    if n <= AUTH_TAG_LEN:
        return FrameMacs(None, 0, 0)
    return FrameMacs(new_mac(salt), 0, n - AUTH_TAG_LEN)


def frame_premac(buffer: BytesLike, salt: bytes) -> Premac | None:
    """The :class:`~flodl_proto.codec.auth.Premac` of a RoundFrame that fills ``buffer``, all
    of whose bytes have arrived: what :func:`frame_macs` for ``len(buffer)`` gives once fed its
    whole covered range (every byte before the last 8), in one call. None when the buffer is
    too short to carry a tag (the decoder then reports the truncation).

    Upstream: the frame HMAC of ``controller/round_frame.rs`` (over every byte before the tag).
    """
    return _frame_digest(new_mac(salt), as_view(buffer))


def _frame_digest(mac: Any, frame: memoryview) -> Premac | None:
    """The Premac of a whole frame (a flat byte view) through ``mac``, a keyed MAC nothing was
    fed: every byte before the last 8 fed, or None when the frame is too short to carry a tag.
    The rule :func:`frame_premac` and :func:`frame_premac_for` share."""
    covered = frame.nbytes - AUTH_TAG_LEN
    if covered <= 0:
        return None
    mac.update(frame[:covered])
    return _premac(covered, mac.digest())


def frame_premac_for(salt: bytes) -> Callable[[memoryview], Premac | None]:
    """:func:`frame_premac` bound to ``salt`` (the checked 16-byte session salt), for a reader
    that computes it for every frame it reads: ``premac(frame)`` of a flat byte view (a
    ``memoryview`` of format ``B``, e.g. a slice of the reader's own buffer) gives
    ``frame_premac(frame, salt)``, with the keyed MAC set up once instead of per frame.

    Raises:
        Nothing of its own: ``salt`` is not checked here (the reader checked it), and a view
        too short for a tag gives None, as :func:`frame_premac`.

    Upstream: ``controller/round_frame.rs`` (the frame MAC its reader computes as it reads).
    """
    base = new_mac(salt)  # keyed, nothing fed: each frame's MAC is a copy of it
    copy = base.copy

    def premac(frame: memoryview) -> Premac | None:
        return _frame_digest(copy(), frame)

    return premac


def record_premac_for(salt: bytes) -> Callable[[memoryview, memoryview], Premac]:
    """The record digest of a mux record read whole, bound to ``salt`` (the checked 16-byte
    session salt), for a reader that computes it for every record it reads:
    ``premac(header, payload)``, of flat byte views of the record's header (at least its first
    17 bytes) and of the payload bytes that arrived, gives what :func:`record_macs` for that
    header, fed those payload bytes, gives as ``premac(len(payload))``, with the keyed MAC set
    up once instead of per record.

    Raises:
        Nothing of its own: ``salt`` and the views are not checked here (the reader checked
        them).

    Upstream: ``relay/mux.rs`` ``read_record`` (the record MAC over the header and payload).
    """
    base = new_mac(salt)  # keyed, nothing fed: each record's MAC is a copy of it
    copy = base.copy

    def premac(header: memoryview, payload: memoryview) -> Premac:
        mac = copy()
        mac.update(header[:MUX_AUTH_COVERED_HEADER_LEN])
        if payload.nbytes:
            mac.update(payload)
        return _premac(MUX_AUTH_COVERED_HEADER_LEN + payload.nbytes, mac.digest())

    return premac


@dataclass(slots=True)
class RecordMacs:
    """The MACs of one mux record, fed as its payload arrives (offsets into the record buffer,
    header included).

    Attributes:
        size: the record's length in bytes (25 + payload length).
        record: the record MAC, already fed the covered header bytes; feed it
            ``buffer[record_start:record_stop]``.
        record_start, record_stop: the payload's range.
        frame: a HostFrame's inner-frame MAC (None for other kinds, or when not asked for);
            feed it ``buffer[frame_start:frame_stop]``.
        frame_start, frame_stop: the inner frame's covered range.

    Upstream: the record HMAC of ``relay/mux.rs`` (over ``header[0..17] || payload``) and, for a
    frame payload, the frame HMAC of ``controller/round_frame.rs``.
    """

    size: int
    record: Any
    record_start: int
    record_stop: int
    frame: Any = None
    frame_start: int = 0
    frame_stop: int = 0

    def premac(self, payload_got: int | None = None) -> Premac:
        """The record digest for the decoder, after ``payload_got`` payload bytes were fed
        (default: all of them)."""
        got = self.record_stop - self.record_start if payload_got is None else payload_got
        return _premac(MUX_AUTH_COVERED_HEADER_LEN + got, self.record.digest())

    def ranges(self) -> list[tuple[Any, int, int]]:
        """``(mac, start, stop)`` for an I/O reader, offsets into the record buffer: the record
        MAC over the payload first, then the inner frame's MAC (when planned)."""
        out = [(self.record, self.record_start, self.record_stop)]
        if self.frame is not None:
            out.append((self.frame, self.frame_start, self.frame_stop))
        return out

    def frame_premac(self) -> Premac | None:
        """The inner frame's digest for the decoder (None when there is no inner-frame MAC)."""
        if self.frame is None:
            return None
        return _premac(self.frame_stop - self.frame_start, self.frame.digest())


def record_macs(header: BytesLike, parsed: MuxHeader, salt: bytes, *,
                inner_frame: bool = False) -> RecordMacs:
    """The plan for the mux record whose first 25 bytes are ``header``, already checked by
    :func:`~flodl_proto.codec.mux.parse_mux_header` (``parsed``).

    Args:
        header: the record's first bytes (at least the 17 the tag covers).
        parsed: the parsed header (kind, payload length).
        salt: the session salt.
        inner_frame: also plan the inner frame's MAC when the record is a HostFrame.

    Upstream: the record HMAC of ``relay/mux.rs`` (over ``header[0..17] || payload``) and, for a
    frame payload, the frame HMAC of ``controller/round_frame.rs``.
    """
    rec = new_mac(salt)
    rec.update(as_view(header)[:MUX_AUTH_COVERED_HEADER_LEN])
    size = MUX_HEADER_LEN + parsed.payload_len
    plan = RecordMacs(size, rec, MUX_HEADER_LEN, size)
    if inner_frame and parsed.kind == REC_HOST_FRAME and parsed.payload_len > AUTH_TAG_LEN:
        plan.frame = new_mac(salt)
        plan.frame_start, plan.frame_stop = MUX_HEADER_LEN, size - AUTH_TAG_LEN
    return plan


def signed_frame_batches(prefix: BytesLike, pieces: Sequence[BytesLike], salt: bytes,
                         step: int) -> Iterator[list[BytesLike]]:
    """Write batches of ``prefix``, a frame's unsigned ``pieces``
    (:func:`~flodl_proto.codec.round_frame.round_frame_pieces`) and its tag.

    The tag covers the pieces (not the prefix). Each piece is cut into ``step``-byte views that
    are hashed as the batch is built; a batch is yielded once it holds ``step`` bytes, so a
    writer sends batch ``k`` while the next one is hashed. The last batch ends with the 8-byte
    tag. Nothing is copied.

    Upstream: the streamed frame writer of ``controller/round_frame.rs`` (the tag after the bytes
    it covers) behind the loopback leg's u32 length prefix, as ``cpu_reduce.rs`` sends a frame.
    """
    mac = new_mac(salt)
    batch: list[BytesLike] = [prefix]
    size = as_view(prefix).nbytes
    for p in pieces:
        mv = as_view(p)
        for at in range(0, mv.nbytes, step):
            part = mv[at:at + step]
            mac.update(part)
            batch.append(part)
            size += part.nbytes
            if size >= step:
                yield batch
                batch, size = [], 0
    batch.append(bytes(mac.digest()[:AUTH_TAG_LEN]))
    yield batch

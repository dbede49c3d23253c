"""RoundFrame and TensorPayload: one reduce round's contribution or consensus.

Layout (``spec/wire.yaml`` ``messages.round_frame``; all little-endian)::

    magic u32 | num_tensors u32 | kind u8 | weight f64 |
    per tensor: dtype u8 | ndim u8 | ndim x u32 dims | nbytes u64 | nbytes data bytes |
    auth tag (8 bytes: HMAC-SHA256(salt, magic .. last data byte)[:8])

Decoding never copies payload bytes: each :class:`TensorPayload` holds a memoryview slice of the
input. Encoding returns a list of buffers (metadata pieces, the payload views themselves, the tag)
ready for ``socket.sendmsg``; :func:`encode_round_frame_bytes` joins them for convenience.

The reader accepts exactly what upstream's reader accepts: any dtype byte and any ``nbytes``
(checked later by the fold and by :meth:`TensorPayload.array`); it checks magic, the tensor-count
cap, the kind byte and the weight (finite, not below zero; ``-0.0`` passes) before the tag, and the
running byte total against the frame ceiling before reading each payload.

The values (:class:`RoundKind`, :class:`Dtype`, :class:`TensorPayload`, :class:`RoundFrame`,
:func:`round_frame_wire_len`) live in ``codec/_frame_model.py`` and are imported from here; this
module holds the encoder and the reader.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``RoundFrame``, ``TensorPayload``,
``read_round_frame_streamed``, ``write_round_frame_streamed``, ``round_frame_wire_len``).
"""

from __future__ import annotations

import functools
import math
import struct as _struct
from typing import Any, Final

from .._names import adopt
from ..errors import protocol_error, shown_type
from ..spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    ROUND_FRAME_HEADER_LEN,
    ROUND_FRAME_MAGIC,
)
from ._common import END_OF_STREAM, BytesLike, EndOfStream, NeedData, as_view
from ._frame_model import (
    _KINDS,
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    not_a_frame,
    round_frame_wire_len,
)
from ._frame_model import _NUMPY_DTYPE as _NUMPY_DTYPE  # these four: the template's checks
from ._frame_model import _NUMPY_MAX_NDIM as _NUMPY_MAX_NDIM
from ._frame_model import _checked_weight as _checked_weight
from ._frame_model import _numel as _numel
from ._walk import _WEIGHT_UNPACK, _known_layout, _remember
from ._walk import _FrameWalk as _FrameWalk  # the stream decoders resume it
from ._walk import _rust_f64 as _rust_f64
from ._walk import read_known_frame as _read_known_frame
from .auth import Premac, check_salt, new_mac, tag_as_u64, tags_equal
from .structs import PACKED, dims_packed

# the precompiled forms of the structs.py declarations (the hot path of every round)
_HEADER = PACKED["ROUND_FRAME_HEADER"]
_KIND = PACKED["ROUND_FRAME_KIND"]
_WEIGHT = PACKED["ROUND_FRAME_WEIGHT"]
_META = PACKED["TENSOR_META"]
_NBYTES = PACKED["TENSOR_NBYTES"]

__all__ = [
    "FRAME_TAG_TAIL",
    "Dtype",
    "RoundFrame",
    "RoundKind",
    "TensorPayload",
    "declared_tensor_count",
    "decode_round_frame",
    "decode_round_frame_or_eos",
    "delivered_tensors",
    "encode_round_frame",
    "encode_round_frame_bytes",
    "known_layout",
    "known_round_frame",
    "parse_round_frame",
    "parse_round_frame_or_eos",
    "read_known_frame",
    "round_frame_extent",
    "round_frame_pieces",
    "round_frame_wire_len",
]

#: the bytes that end every RoundFrame: its auth tag (``AUTH_TAG_LEN``), after everything it
#: covers, so no reader can accept a frame before these arrive (the relay holds them back
#: while it forwards a Broadcast it has not checked yet)
FRAME_TAG_TAIL: Final = AUTH_TAG_LEN

#: ``known_layout(mv, ceiling)``: the layout the frame reader remembers for a frame whose
#: metadata bytes (magic, tensor count, kind, each tensor's dtype, ndim, dims and nbytes) ``mv``
#: carries, read with the frame ceiling ``ceiling`` (bytes), when ``mv`` is long enough for that
#: frame and its tag: an opaque object, the same one (``is``) for every such frame while it is
#: remembered, so a caller can tell a frame of a layout it kept. None when no such layout is
#: remembered (not read yet, read with another ceiling, forgotten, or a frame of more tensors
#: than are remembered). It costs no parse: one unpack of the metadata bytes per remembered
#: layout, nothing checked (the weight, the tag) and no payload touched; a hit moves that layout
#: first. It is the reader's own lookup (``_walk._known_layout``), not a wrapper. No upstream
#: counterpart (upstream's reader remembers nothing).
known_layout: Final = _known_layout
#: ``read_known_frame(mv, salt, ceiling, premac)``: a frame of a layout ``known_layout`` finds,
#: given every check its decode makes without building it (``_walk.read_known_frame``).
read_known_frame: Final = _read_known_frame

# the frame's values live in codec/_frame_model.py and the two layout functions in
# codec/_walk.py; they are this module's names, so help(), pydoc, Sphinx and pickle name this
# module (set once, at import; nothing per call)
known_layout.__name__ = known_layout.__qualname__ = "known_layout"
adopt(__name__, RoundKind, Dtype, TensorPayload, RoundFrame, round_frame_wire_len, known_layout,
      read_known_frame)





def round_frame_pieces(frame: RoundFrame) -> list[BytesLike]:
    """The wire bytes of ``frame`` up to (not including) its 8-byte tag, as buffers.

    Small metadata ``bytes`` alternate with the payload buffers themselves (no payload copy);
    the tag is the first 8 bytes of HMAC-SHA256 over exactly these pieces, appended last. Use it
    to sign the frame while the pieces are hashed for another purpose too (a record MAC) or while
    they are sent; :func:`encode_round_frame` is the one-call form.

    Raises:
        InvalidValue (local) ``frame.bad_type``: ``frame`` is not a :class:`RoundFrame` (the
            message names its type).

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed`` (before the footer).
    """
    if not isinstance(frame, RoundFrame):
        raise not_a_frame("frame", frame)
    pieces: list[BytesLike] = []
    # the metadata before each payload is gathered in a list and joined once (``bytes +=``
    # copied the run so far for every tensor: quadratic in a run of elided tensors)
    heads = [_FRAME_HEAD.pack(ROUND_FRAME_MAGIC, len(frame.tensors), int(frame.kind),
                              frame.weight)]
    for t in frame.tensors:
        shape = t.shape
        nbytes = t.data.nbytes
        heads.append(_tensor_head(len(shape)).pack(t.dtype, len(shape), *shape, nbytes))
        if nbytes:
            pieces.append(b"".join(heads))
            pieces.append(t.data)
            heads = []
    if heads:
        pieces.append(b"".join(heads))
    return pieces


#: header, kind and weight, the first 17 bytes of a frame, as one struct (the declared structs'
#: little-endian formats, which have no padding, written one after the other)
_FRAME_HEAD: Final = _struct.Struct(
    "<" + "".join(p.format.lstrip("<") for p in (_HEADER, _KIND, _WEIGHT)))


@functools.cache
def _tensor_head(ndim: int) -> _struct.Struct:
    """A tensor's meta, ``ndim`` dims and nbytes as one struct (what precedes its data)."""
    return _struct.Struct(
        "<" + "".join(p.format.lstrip("<") for p in (_META, dims_packed(ndim), _NBYTES)))


def encode_round_frame(frame: RoundFrame, salt: BytesLike) -> list[BytesLike]:
    """Encode ``frame`` signed with ``salt`` as a list of buffers for ``socket.sendmsg``.

    The list alternates small metadata ``bytes`` with the payload memoryviews themselves (no
    payload copy) and ends with the 8-byte tag. ``b"".join(...)`` gives the wire bytes.

    Raises:
        InvalidValue (local): the salt is not 16 bytes, or ``frame`` is not a
            :class:`RoundFrame` (``frame.bad_type``).

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed``.
    """
    key = check_salt(salt)
    pieces = round_frame_pieces(frame)
    mac = new_mac(key)
    for p in pieces:
        mac.update(p)
    pieces.append(bytes(mac.digest()[:AUTH_TAG_LEN]))
    return pieces


def encode_round_frame_bytes(frame: RoundFrame, salt: BytesLike) -> bytes:
    """Encode ``frame`` signed with ``salt`` into one ``bytes`` (copies the payloads once).

    Raises:
        InvalidValue (local): as :func:`encode_round_frame`.

    Upstream: ``controller/round_frame.rs`` ``write_round_frame_streamed``.
    """
    return b"".join(encode_round_frame(frame, salt))




def round_frame_extent(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> int | NeedData:
    """Total length of the frame starting ``data`` if it is all present, else how much is needed.

    Applies every check upstream makes before the tag (magic, tensor cap, kind, weight, ceiling)
    so a stream can reject hostile input before buffering it; never verifies the tag.

    Returns:
        the frame's full length in bytes (tag included), or ``NeedData(n)``: at least ``n`` more
        bytes are needed before the structure can be walked further.

    Raises:
        BadMagic, LimitExceeded, InvalidValue (remote).

    Upstream: the checks ``controller/round_frame.rs`` ``read_round_frame_streamed`` makes before
    the tag.
    """
    mv = as_view(data)
    walk = _FrameWalk(ceiling)
    need = walk.advance(mv, partial=True)
    if need is not None:
        return NeedData(need - len(mv))
    return walk.pos + AUTH_TAG_LEN


def parse_round_frame_or_eos(
    data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING,
) -> tuple[RoundFrame, int, bytes] | EndOfStream:
    """Stream form of :func:`parse_round_frame`: :data:`END_OF_STREAM` instead of an error when
    ``data`` ends inside the 8-byte header (including empty input), as a stream reader at a frame
    boundary sees a clean close.

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput (remote).

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed`` (its ``None`` for a clean
    end), without its tag check.
    """
    mv = as_view(data)
    if type(ceiling) is int and (lay := _known_layout(mv, ceiling)) is not None:
        (weight,) = _WEIGHT_UNPACK(mv, ROUND_FRAME_HEADER_LEN + 1)
        if 0.0 <= weight < math.inf:  # else the walk below reports it
            pos = lay.body_end
            return (known_round_frame(lay, weight, mv), pos + AUTH_TAG_LEN,
                    mv[pos:pos + AUTH_TAG_LEN].tobytes())
    walk = _FrameWalk(ceiling)
    if walk.advance(mv, partial=False) is not None:
        return END_OF_STREAM
    pos = walk.pos
    tensors = tuple([TensorPayload.trusted(d, s, mv[start:start + n])
                     for d, s, start, n in walk.entries])
    frame = RoundFrame.trusted(_KINDS[walk.kind], walk.weight, tensors)
    _remember(mv, walk)
    return frame, pos + AUTH_TAG_LEN, bytes(mv[pos:pos + AUTH_TAG_LEN])


def known_round_frame(lay: Any, weight: float, mv: memoryview) -> RoundFrame:
    """The frame ``mv`` starts with, of the remembered layout ``lay`` and weight ``weight``, as
    :func:`~flodl_proto.codec._walk.read_known_frame` found them (payloads are views of ``mv``).

    No upstream counterpart: a fast path of this package (a remembered layout); the checks it keeps
    are those of ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """
    trusted = TensorPayload.trusted
    return RoundFrame.trusted(_KINDS[lay.kind], weight,
                              tuple([trusted(d, s, mv[a:b]) for d, s, a, b in lay.entries]))


def parse_round_frame(
    data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING,
) -> tuple[RoundFrame, int, bytes]:
    """Parse one complete RoundFrame WITHOUT verifying its auth tag (for inspection tools).

    Every other check of :func:`decode_round_frame` is applied, in the same order. Returns
    ``(frame, consumed, carried tag)``; the tag covers ``data[:consumed - 8]``. Never trust the
    values before verifying the tag (:func:`flodl_proto.codec.auth.compute_tag`).

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput (remote); ``data`` ending inside the
        8-byte header is TruncatedInput ``frame.header_read_failed`` (see
        :func:`parse_round_frame_or_eos` for the stream form).

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed``, without its tag check.
    """
    res = parse_round_frame_or_eos(data, ceiling=ceiling)
    if res is END_OF_STREAM:
        raise protocol_error("frame.header_read_failed", got=as_view(data).nbytes,
                             need=ROUND_FRAME_HEADER_LEN)
    return res


def decode_round_frame(
    data: BytesLike,
    salt: BytesLike,
    *,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
) -> tuple[RoundFrame, int]:
    """Decode and authenticate one complete RoundFrame from the start of ``data``.

    The whole-buffer form: ``data`` must hold the frame. Arguments, checks and errors are those
    of :func:`decode_round_frame_or_eos`, except that ``data`` ending inside the 8-byte header
    (including empty input) raises TruncatedInput ``frame.header_read_failed``.

    Returns:
        ``(frame, consumed)``: payloads are views into ``data``; bytes after the frame are left
        alone.

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput, AuthenticationError (remote);
        InvalidValue (local): a misused argument, as :func:`decode_round_frame_or_eos`.

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed`` (``Ok(None)`` is an
    error here).
    """
    res = decode_round_frame_or_eos(data, salt, ceiling=ceiling, premac=premac)
    if res is END_OF_STREAM:
        raise protocol_error("frame.header_read_failed", got=as_view(data).nbytes,
                             need=ROUND_FRAME_HEADER_LEN)
    return res


def decode_round_frame_or_eos(
    data: BytesLike,
    salt: BytesLike,
    *,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
) -> tuple[RoundFrame, int] | EndOfStream:
    """Stream form: decode and authenticate one RoundFrame from the start of ``data``, or
    report a clean end of stream.

    Args:
        data: bytes-like input; the payloads of the result are views into it (keep it alive and
            unmodified while the frame is in use).
        salt: the 16-byte session salt.
        ceiling: frame ceiling in bytes (running total of ``nbytes``); default 1 GiB.
        premac: the MAC the caller already computed over ``data[:n]`` (see
            :class:`~flodl_proto.codec.auth.Premac`); used when ``n`` is the frame's length
            minus its tag, else the covered bytes are hashed here.

    Returns:
        ``(frame, consumed)`` (bytes after the frame are left alone), or :data:`END_OF_STREAM` if
        ``data`` ends inside the 8-byte header (including empty input).

    Raises:
        BadMagic, LimitExceeded, InvalidValue, TruncatedInput, AuthenticationError (remote), in
        upstream's order: magic, tensor cap, kind, weight, per tensor (meta, shape, nbytes,
        ceiling, data), footer, tag.
        InvalidValue (local): the salt is not 16 bytes (``salt.*``), ``data`` is not a contiguous
        buffer (``codec.not_bytes_like``), ``ceiling`` is not a non-negative integer
        (``ceiling.invalid``), or ``premac`` is neither a :class:`Premac` nor None
        (``frame.bad_type``).

    Upstream: ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """
    key = check_salt(salt)
    if premac is not None and not isinstance(premac, Premac):
        raise protocol_error("frame.bad_type", field="premac",
                             expected="a Premac (a MAC over the bytes being decoded) or None",
                             got=shown_type(premac))
    mv = as_view(data)
    res = parse_round_frame_or_eos(mv, ceiling=ceiling)
    if res is END_OF_STREAM:
        return END_OF_STREAM
    frame, consumed, carried = res
    if premac is not None and premac.covered == consumed - AUTH_TAG_LEN:
        computed = premac.digest[:AUTH_TAG_LEN]
    else:
        mac = new_mac(key)
        mac.update(mv[0:consumed - AUTH_TAG_LEN])
        computed = mac.digest()[:AUTH_TAG_LEN]
    if not tags_equal(computed, carried):
        raise protocol_error("frame.auth_failed", computed=tag_as_u64(computed),
                             carried=tag_as_u64(carried))
    return frame, consumed


def delivered_tensors(data: BytesLike, count: int) -> list[TensorPayload]:
    """The first ``count`` tensors of a frame whose reader got past them before failing.

    For a consumer that folds tensors as a streamed reader delivers them (upstream's relay fold
    merges each tensor before the footer is read): given a reader error naming tensor ``count``
    (or, for an error after the last tensor, :func:`declared_tensor_count`), it returns the
    tensors the reader had already delivered. The structure up to them was checked by the reader
    that failed; nothing is checked again and nothing is copied (payloads are views of
    ``data``).

    No upstream counterpart: a helper of this package's streamed fold; the reader it follows is
    ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """
    mv = as_view(data)
    out: list[TensorPayload] = []
    pos = ROUND_FRAME_HEADER_LEN + 1 + 8  # after the header, the kind byte and the weight
    for _ in range(count):
        dtype, ndim = _META.unpack_from(mv, pos)
        pos += 2
        dims = dims_packed(ndim).unpack_from(mv, pos) if ndim else ()
        pos += 4 * ndim
        (nbytes,) = _NBYTES.unpack_from(mv, pos)
        pos += 8
        out.append(TensorPayload.trusted(dtype, dims, mv[pos:pos + nbytes]))
        pos += nbytes
    return out


def declared_tensor_count(data: BytesLike) -> int:
    """The tensor count a frame's header declares (the header was checked by its reader).

    Upstream: the ``num_tensors`` field that ``controller/round_frame.rs``
    ``read_round_frame_streamed`` reads.
    """
    return int(_HEADER.unpack_from(as_view(data)[:ROUND_FRAME_HEADER_LEN], 0)[1])

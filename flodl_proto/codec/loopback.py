"""Length-framed loopback blobs (rank <-> relay) and the rank-side prefixed RoundFrame.

Every blob on the loopback leg after the handshake is ``u32 LE length | body``; the body of a
rank's blob is one RoundFrame and the relay's reply is the Broadcast payload verbatim. Readers
reject a prefix above the frame ceiling before reading the body. Running out of input inside the
4-byte prefix (including at byte 0) is a clean end of stream.

Upstream: ``flodl/src/distributed/relay/mux.rs`` (``write_len_framed``, ``read_len_framed``,
``read_len_prefix``), ``cpu_reduce.rs`` (``write_len_prefix``, ``read_framed_round``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from ..errors import ProtocolError, protocol_error
from ..spec import DEFAULT_FRAME_CEILING, LEN_PREFIX_LEN, U32_MAX
from ._common import (
    END_OF_STREAM,
    BytesLike,
    EndOfStream,
    _array_bytes,
    as_view,
    check_ceiling,
    is_buffer,
    not_bytes_like,
    not_pieces,
    numpy_text,
    wire_int,
)
from .auth import Premac
from .round_frame import RoundFrame, decode_round_frame_or_eos, encode_round_frame
from .structs import PACKED

_LEN_PREFIX = PACKED["LEN_PREFIX"]  # the precompiled LEN_PREFIX declaration
_LEN_PREFIX_UNPACK = _LEN_PREFIX.unpack_from

__all__ = [
    "decode_framed_round",
    "decode_framed_round_or_eos",
    "decode_len_framed",
    "decode_len_framed_or_eos",
    "decode_len_prefix",
    "decode_len_prefix_or_eos",
    "encode_framed_round",
    "encode_len_framed",
    "encode_len_prefix",
    "whole_len_prefix",
]



def encode_len_prefix(length: int, *, ceiling: int = DEFAULT_FRAME_CEILING) -> bytes:
    """Encode the 4-byte prefix of a ``length``-byte blob.

    Args:
        length: the blob's length in bytes, an integer 0..u32 (a NumPy integer too).
        ceiling: frame ceiling in bytes; default 1 GiB.

    Raises:
        InvalidValue (local): ``len.bad_field`` naming ``length`` and the value when it is not an
            integer by the codec's rule (:func:`~flodl_proto.codec._common.wire_int`: a bool, a
            float or text is refused, never written as 1 or truncated), or when it is negative.
        LimitExceeded (local): ``len.write_too_large``: ``length`` above the frame ceiling
            (checked first); ``len.write_past_u32``: ``length`` within a ceiling set above u32
            but past the prefix's u32.

    Upstream: ``flodl/src/distributed/relay/mux.rs`` ``write_len_prefix`` (called by
    ``cpu_reduce.rs``).
    """
    check_ceiling(ceiling)
    n = wire_int(length)
    if n is None:
        raise protocol_error("len.bad_field", field="length", value=length,
                             reason="not an integer")
    if n < 0:
        raise protocol_error("len.bad_field", field="length", value=n, reason="negative")
    length = n
    if length > ceiling:
        raise protocol_error("len.write_too_large", length=length, ceiling=ceiling)
    if length > U32_MAX:
        raise protocol_error("len.write_past_u32", length=length, max=U32_MAX)
    return _LEN_PREFIX.pack(length)


def encode_len_framed(blob: Sequence[BytesLike] | BytesLike, *,
                      ceiling: int = DEFAULT_FRAME_CEILING) -> list[BytesLike]:
    """Return ``[prefix, *blob pieces]`` for a blob given as one buffer or a list of pieces.

    Args:
        blob: the body, opaque bytes: one buffer (``bytes``, ``bytearray``, ``memoryview``, or
            any other contiguous buffer such as a NumPy array; any shape, counted by ``nbytes``)
            or a list or tuple (or another iterable that is no buffer) of buffers sent back to
            back. Not copied.
        ceiling: frame ceiling in bytes; default 1 GiB.

    Returns:
        A buffer list for ``socket.sendmsg``, not one buffer: the 4-byte prefix (``bytes``, the
        body length as u32 little-endian), then the pieces of ``blob`` as given.
        ``b"".join(...)`` of it is the wire bytes that :func:`decode_len_framed` takes (given
        the list itself, the decoder raises ``InvalidValue`` saying to join it):

        >>> from flodl_proto import decode_len_framed, encode_len_framed
        >>> wire = b"".join(encode_len_framed(b"abc"))
        >>> wire
        b'\\x03\\x00\\x00\\x00abc'
        >>> blob, consumed = decode_len_framed(wire)
        >>> bytes(blob), consumed
        (b'abc', 7)

    Raises:
        LimitExceeded (local): the blob is longer than the frame ceiling (bytes) or than u32.
        InvalidValue (local): ``blob`` is not a buffer nor an iterable of buffers
            (``codec.not_bytes_like`` naming ``blob``, or ``blob[i]`` and the piece's type),
            or is NumPy text (``np.array(["ab"])``, a ``str_``: its buffer holds UCS-4
            characters, named as NumPy text with its dtype).

    Upstream: ``flodl/src/distributed/relay/mux.rs`` ``write_len_framed``.
    """
    pieces: list[BytesLike]
    if isinstance(blob, bytes | bytearray | memoryview):
        pieces = [blob]
    elif not isinstance(blob, list | tuple) and not is_buffer(blob) \
            and (raw := _array_bytes(blob)) is not None:
        pieces = [raw]  # an array whose dtype exports no buffer (bfloat16): its memory
    elif isinstance(blob, list | tuple) or not is_buffer(blob):
        if blob is None or isinstance(blob, str) or not isinstance(blob, Iterable):
            raise not_bytes_like("blob", blob)
        pieces = list(blob)
    else:  # one buffer of another type (a NumPy array): its elements are no pieces
        pieces = [cast("BytesLike", blob)]
    length = 0
    try:
        for p in pieces:
            view = memoryview(p)
            # sendmsg takes C-contiguous buffers only; object pointers are no bytes to send,
            # nor NumPy text's UCS-4 characters
            if not view.c_contiguous or "O" in view.format or (
                    view.format[-1:] == "w" and numpy_text(p)):
                raise BufferError
            length += view.nbytes
    except (TypeError, BufferError):  # a piece that is None, text, a number, a strided view
        raise (not_bytes_like("blob", blob) if len(pieces) == 1 and pieces[0] is blob
               else not_pieces("blob", pieces)) from None
    return [encode_len_prefix(length, ceiling=ceiling), *pieces]


def encode_framed_round(frame: RoundFrame, salt: BytesLike, *,
                        ceiling: int = DEFAULT_FRAME_CEILING) -> list[BytesLike]:
    """What a rank writes to its relay: the frame's wire length as prefix, then the frame.

    Returns:
        A buffer list for ``socket.sendmsg`` (:func:`encode_len_framed` of the frame's buffers);
        ``b"".join(...)`` of it is what :func:`decode_framed_round` takes.

    Raises:
        InvalidValue (local): the salt is not 16 bytes; LimitExceeded (local): the frame is
            longer than the frame ceiling.

    Upstream: ``cpu_reduce.rs`` ``write_len_prefix``, then ``controller/round_frame.rs``
    ``write_round_frame_streamed``.
    """
    return encode_len_framed(encode_round_frame(frame, salt), ceiling=ceiling)


def _no_prefix(data: BytesLike) -> ProtocolError:
    return protocol_error("len.prefix_read_failed", got=as_view(data).nbytes, need=LEN_PREFIX_LEN)


def decode_len_prefix(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> int:
    """Read the 4-byte prefix at the start of ``data`` (which must hold it).

    Raises:
        TruncatedInput (remote) ``len.prefix_read_failed``: fewer than 4 bytes.
        LimitExceeded (remote): the length exceeds the frame ceiling.

    Upstream: ``relay/mux.rs`` ``read_len_prefix``.
    """
    length = decode_len_prefix_or_eos(data, ceiling=ceiling)
    if length is END_OF_STREAM:
        raise _no_prefix(data)
    return length


def decode_len_framed(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING
                      ) -> tuple[memoryview, int]:
    """Read one complete length-framed blob: ``(blob view, consumed)``.

    Raises:
        TruncatedInput (remote): fewer than 4 bytes (``len.prefix_read_failed``) or a short body;
        LimitExceeded (remote): prefix above the ceiling.
        InvalidValue (local): ``data`` is not a contiguous buffer (``codec.not_bytes_like``), or
        ``ceiling`` is not a non-negative integer (``ceiling.invalid``).

    Upstream: ``relay/mux.rs`` ``read_len_framed``.
    """
    res = decode_len_framed_or_eos(data, ceiling=ceiling)
    if res is END_OF_STREAM:
        raise _no_prefix(data)
    return res


def decode_framed_round(data: BytesLike, salt: BytesLike, *,
                        ceiling: int = DEFAULT_FRAME_CEILING, premac: Premac | None = None,
                        ) -> tuple[RoundFrame, int]:
    """Whole-buffer form of :func:`decode_framed_round_or_eos`: ``(frame, 4 + prefix)``.

    Raises:
        TruncatedInput (remote) ``len.prefix_read_failed`` when ``data`` ends inside the prefix;
        every error of :func:`decode_framed_round_or_eos`.

    Upstream: ``cpu_reduce.rs`` ``read_framed_round``.
    """
    res = decode_framed_round_or_eos(data, salt, ceiling=ceiling, premac=premac)
    if res is END_OF_STREAM:
        raise _no_prefix(data)
    return res


def decode_len_prefix_or_eos(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING
                      ) -> int | EndOfStream:
    """Stream form: the 4-byte prefix, or :data:`END_OF_STREAM` if fewer than 4 bytes are present.

    Raises:
        LimitExceeded (remote): the length exceeds the frame ceiling.

    Upstream: ``relay/mux.rs`` ``read_len_prefix`` (``Ok(None)`` at a clean end).
    """
    check_ceiling(ceiling)
    mv = as_view(data)
    if len(mv) < LEN_PREFIX_LEN:
        return END_OF_STREAM
    return whole_len_prefix(mv, ceiling)


def whole_len_prefix(mv: memoryview, ceiling: int) -> int:
    """The length a whole prefix carries: :func:`decode_len_prefix_or_eos` of a flat byte view
    ``mv`` of at least 4 bytes and a valid ``ceiling`` (checked by the caller, e.g. once per
    stream), without re-checking either (a reader's per-blob call).

    Raises:
        LimitExceeded (remote): the length exceeds the frame ceiling (``len.too_large``).

    Upstream: ``relay/mux.rs`` ``read_len_prefix``.
    """
    length: int = _LEN_PREFIX_UNPACK(mv, 0)[0]
    if length > ceiling:
        raise protocol_error("len.too_large", length=length, ceiling=ceiling)
    return length


def decode_len_framed_or_eos(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING
                      ) -> tuple[memoryview, int] | EndOfStream:
    """Stream form: one length-framed blob, ``(blob view, consumed)``, or :data:`END_OF_STREAM`.

    Raises:
        LimitExceeded (remote): prefix above the ceiling; TruncatedInput (remote): short body.

    Upstream: ``relay/mux.rs`` ``read_len_framed`` (``Ok(None)`` at a clean end).
    """
    mv = as_view(data)
    length = decode_len_prefix_or_eos(mv, ceiling=ceiling)
    if length is END_OF_STREAM:
        return END_OF_STREAM
    end = LEN_PREFIX_LEN + length
    if len(mv) < end:
        raise protocol_error("len.body_read_failed", got=len(mv) - LEN_PREFIX_LEN, need=length)
    return mv[LEN_PREFIX_LEN:end], end


def decode_framed_round_or_eos(data: BytesLike, salt: BytesLike, *,
                        ceiling: int = DEFAULT_FRAME_CEILING, premac: Premac | None = None,
                        ) -> tuple[RoundFrame, int] | EndOfStream:
    """Stream form of the rank-side read of a prefixed reply frame (it must fill its prefix).

    ``premac`` is a MAC the caller already computed over the frame's first bytes (after the
    prefix), as :func:`~flodl_proto.codec.round_frame.decode_round_frame_or_eos` takes it.

    Returns:
        ``(frame, 4 + prefix)``, or :data:`END_OF_STREAM` when input ends inside the prefix.

    Raises:
        LimitExceeded (remote): prefix above the ceiling.
        TruncatedInput (remote): the body ends inside the frame header (also a zero prefix),
            or the frame is shorter than its prefix; any RoundFrame reader error inside the body.

    Upstream: ``cpu_reduce.rs`` ``read_framed_round`` (``Ok(None)`` at a clean end).
    """
    mv = as_view(data)
    length = decode_len_prefix_or_eos(mv, ceiling=ceiling)
    if length is END_OF_STREAM:
        return END_OF_STREAM
    body = mv[LEN_PREFIX_LEN:LEN_PREFIX_LEN + length]
    res = decode_round_frame_or_eos(body, salt, ceiling=ceiling, premac=premac)
    if res is END_OF_STREAM:
        raise protocol_error("framed_round.body_ended", length=length, got=len(body))
    frame, used = res
    if used != length:
        raise protocol_error("framed_round.underrun", short=length - used, length=length)
    return frame, LEN_PREFIX_LEN + length

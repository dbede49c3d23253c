"""Relay mux records (relay <-> controller) and the ``RelayControlMsg`` control messages.

Record layout (``spec/wire.yaml`` ``messages.mux_record``; little-endian)::

    magic u32 | version u32 (= 1) | kind u8 | rank u32 | payload_len u32 | auth tag 8 | payload

The tag is ``HMAC-SHA256(salt, header[0:17] || payload)[:8]``. Kinds: Data (opaque, rank-tagged),
Control (bincode ``RelayControlMsg``), HostFrame and Broadcast (one complete RoundFrame, with its
own tag). The reader checks magic, version and ``payload_len`` against the frame ceiling, then the
tag, and only then the kind and (for Control) the bincode payload; it ignores the rank field of
non-Data records (reported as 0) and bytes after a complete control message.

Control messages: :class:`Hello` (``{host, ranks}`` at version 2, ``{host, ranks, model_sigs}`` at
version 3), :class:`HelloAck`, :class:`RankExit`, :class:`DeclareDead`; they, their bincode
form and the Hello bound live in ``codec/_mux_control.py`` and are imported from here.

Upstream: ``flodl/src/distributed/relay/mux.rs`` (``MuxRecord``, ``RelayControlMsg``,
``write_record``, ``read_record``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final

from .._names import adopt
from .._slots import slot_builder
from ..errors import ProtocolError, protocol_error, shown_type
from ..spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    MODEL_SIG_LEN,
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_HEADER_LEN,
    MUX_PROTOCOL_VERSION,
    MUX_RECORD_MAGIC,
    REC_BROADCAST,
    REC_CONTROL,
    REC_DATA,
    REC_HOST_FRAME,
    ROUND_FRAME_HEADER_LEN,
    SUPPORTED_VERSIONS,
    U32_MAX,
)
from ._common import (
    END_OF_STREAM,
    BytesLike,
    EndOfStream,
    as_view,
    check_ceiling,
    check_version,
    is_buffer,
    not_pieces,
    numpy_text,
    wire_int,
)
from ._mux_control import (
    ControlMessage,
    DeclareDead,
    Hello,
    HelloAck,
    RankExit,
    _check_rank,
    control_too_long,
    decode_control,
    encode_control,
    max_control_payload,
    max_hello_payload,
    ranks_str,
)
from .auth import (
    PARALLEL_MAC_MIN,
    Premac,
    check_salt,
    new_mac,
    tag_as_u64,
    tags_equal,
    update_in_parallel,
)
from .round_frame import RoundFrame, decode_round_frame_or_eos, round_frame_pieces
from .structs import PACKED

_MUX_HEADER = PACKED["MUX_HEADER"]  # the precompiled MUX_HEADER declaration

__all__ = [
    "MODEL_SIG_LEN",
    "ControlMessage",
    "DeclareDead",
    "Hello",
    "HelloAck",
    "MuxHeader",
    "MuxRecord",
    "RankExit",
    "RecordKind",
    "control_too_long",
    "decode_control",
    "decode_mux_record",
    "decode_mux_record_or_eos",
    "encode_control",
    "encode_mux_record",
    "encode_mux_record_bytes",
    "encode_mux_record_parts",
    "max_control_payload",
    "max_hello_payload",
    "parse_mux_header",
    "parse_mux_header_or_eos",
    "ranks_str",
    "read_mux_record_or_eos",
    "rust_debug",
]

# the control messages' code lives in codec/_mux_control.py; they are this module's names, so
# help(), pydoc, Sphinx and pickle name this module (set once, at import; nothing per call)
adopt(__name__, Hello, HelloAck, RankExit, DeclareDead, encode_control, decode_control,
      control_too_long, max_control_payload, max_hello_payload, ranks_str)



class RecordKind(enum.IntEnum):
    """Mux record kind byte. Upstream: ``relay/mux.rs`` ``REC_*``."""

    DATA = REC_DATA
    CONTROL = REC_CONTROL
    HOST_FRAME = REC_HOST_FRAME
    BROADCAST = REC_BROADCAST


#: each kind byte's :class:`RecordKind` (a dict lookup per record read, not an enum call)
_KINDS: Final = {int(k): k for k in RecordKind}


# -- records ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class MuxRecord:
    """One relay <-> controller record.

    Attributes:
        kind: :class:`RecordKind`.
        rank: u32; meaningful for Data records, 0 for the other kinds.
        payload: the payload bytes as a memoryview (for Control: the bincode encoding).
        control: the decoded control message of a Control record, else None.

    Build with :meth:`data`, :meth:`control_msg`, :meth:`host_frame`, :meth:`broadcast`.

    Raises:
        InvalidValue (local) ``mux.bad_field`` naming the field and the value: a ``kind`` that
            is no :class:`RecordKind` (a bool included; another kind byte is written with
            :func:`encode_mux_record_parts`), a ``rank`` that is no u32, a ``payload`` that is
            no buffer (``codec.not_bytes_like``), a ``control`` on another kind than Control or
            one the payload does not decode to (at version 2 or 3, as the decoder reads it).

    Upstream: ``relay/mux.rs`` ``MuxRecord``.
    """

    kind: RecordKind
    rank: int
    payload: memoryview
    control: ControlMessage | None = None

    def __post_init__(self) -> None:
        kind = _KINDS.get(wire_int(self.kind))  # type: ignore[arg-type]
        if kind is None:
            raise protocol_error("mux.bad_field", field="MuxRecord.kind", value=self.kind,
                                 reason=f"not a record kind ({', '.join(_KIND_NAMES)})")
        _set_kind(self, kind)
        _set_rank(self, _check_rank(self.rank, "MuxRecord.rank"))
        _set_payload(self, as_view(self.payload, "payload"))
        msg = self.control
        if msg is not None and (kind is not RecordKind.CONTROL or all(
                _decoded_or_none(self.payload, v) != msg for v in SUPPORTED_VERSIONS)):
            why = ("only a Control record carries one" if kind is not RecordKind.CONTROL
                   else "the payload does not decode to it at any protocol version")
            raise protocol_error("mux.bad_field", field="MuxRecord.control", value=msg,
                                 reason=why)

    @classmethod
    def data(cls, rank: int, payload: BytesLike) -> MuxRecord:
        """A Data record (opaque ``payload`` tagged with ``rank``; control channel only).

        Raises:
            InvalidValue (local): ``rank`` is not a u32 (``mux.bad_field``), or ``payload`` is
                not a contiguous buffer (``codec.not_bytes_like``).
        """
        return _record(RecordKind.DATA, _check_rank(rank, "rank"), as_view(payload, "payload"))

    @classmethod
    def control_msg(cls, msg: ControlMessage, version: int = DEFAULT_VERSION) -> MuxRecord:
        """A Control record carrying ``msg`` encoded for protocol ``version``.

        Raises:
            InvalidValue (local) ``mux.bad_type``: ``msg`` is not a control message;
            VersionMismatch (local): ``version`` is not 2 or 3 (``version.unsupported``), or
                a Hello with model signatures at version 2 (``control.model_sigs_v2``).
        """
        return _record(RecordKind.CONTROL, 0, memoryview(encode_control(msg, version)), msg)

    @classmethod
    def host_frame(cls, payload: BytesLike) -> MuxRecord:
        """A HostFrame record: ``payload`` is one encoded RoundFrame (relay -> controller).

        Raises:
            InvalidValue (local) ``codec.not_bytes_like``: ``payload`` is not a contiguous
                buffer (a :class:`RoundFrame` included: encode it first).
        """
        return _record(RecordKind.HOST_FRAME, 0, as_view(payload, "payload"))

    @classmethod
    def broadcast(cls, payload: BytesLike) -> MuxRecord:
        """A Broadcast record: ``payload`` is the encoded consensus RoundFrame.

        Raises:
            InvalidValue (local) ``codec.not_bytes_like``: ``payload`` is not a contiguous
                buffer (a :class:`RoundFrame` included: encode it first).
        """
        return _record(RecordKind.BROADCAST, 0, as_view(payload, "payload"))

    def frame(self, salt: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> RoundFrame:
        """Decode the RoundFrame a HostFrame / Broadcast payload carries (bytes after it are
        ignored, as the controller does).

        Raises:
            InvalidValue (local) ``mux.bad_field``: the record is a Control or Data record,
                which carries no RoundFrame.
            TruncatedInput (remote) ``frame.header_read_failed``: the payload ends inside the
                8-byte frame header (the controller reports such a HostFrame as
                ``controller.truncated_hostframe``, naming the connection).
            any RoundFrame reader error (see :func:`decode_round_frame_or_eos`).
        """
        if self.kind not in (RecordKind.HOST_FRAME, RecordKind.BROADCAST):
            raise protocol_error("mux.bad_field", field="record kind", value=self.kind.name,
                                 reason="only HostFrame and Broadcast records carry a RoundFrame")
        res = decode_round_frame_or_eos(self.payload, salt, ceiling=ceiling)
        if res is END_OF_STREAM:
            raise protocol_error("frame.header_read_failed", got=self.payload.nbytes,
                                 need=ROUND_FRAME_HEADER_LEN)
        return res[0]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MuxRecord):
            return NotImplemented
        return (self.kind, self.rank) == (other.kind, other.rank) and self.payload == other.payload

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """``MuxRecord(kind=RecordKind.DATA, rank=3, payload=<3 bytes: 616263>,
        control=None)``: the kind by its class and member name (not Python's enum repr
        ``<RecordKind.DATA: 1>``), the payload by its length and its first
        :data:`_REPR_PAYLOAD_BYTES` (16) bytes in hex, ``...`` after them when there are more
        (``<67108864 bytes: 0102...>``), so that the repr stays short whatever the payload's
        size; the control message as it shows itself."""
        mv = self.payload
        n = mv.nbytes
        if n == 0:
            payload = "<0 bytes>"
        else:
            head = mv[:_REPR_PAYLOAD_BYTES].hex()
            more = "..." if n > _REPR_PAYLOAD_BYTES else ""
            payload = f"<{n} byte{'' if n == 1 else 's'}: {head}{more}>"
        kind = self.kind
        return (f"MuxRecord(kind={type(kind).__name__}.{kind.name}, rank={self.rank}, "
                f"payload={payload}, control={self.control!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied with its payload's bytes (a memoryview does not pickle): the
        constructor's arguments, ``payload`` as ``bytes``."""
        return (type(self), (self.kind, self.rank, bytes(self.payload), self.control))


#: the payload bytes a record's repr shows in hex (its length is shown whatever it is)
_REPR_PAYLOAD_BYTES: Final = 16

#: the slots' descriptors' setters ``__post_init__`` stores its normalised fields with
_set_kind, _set_rank, _set_payload = (
    MuxRecord.__dict__[f].__set__ for f in ("kind", "rank", "payload"))

#: ``_record(kind, rank, payload, control=None)``: a record of fields already checked (the
#: builders', the decoder's: a RecordKind, a u32 rank, a flat memoryview, the control message
#: the payload decodes to or None), built without ``__init__``/``__post_init__``
_record: Callable[..., MuxRecord] = slot_builder(MuxRecord, skip_post_init=True)


def _decoded_or_none(payload: memoryview, version: int) -> ControlMessage | None:
    try:  # as the decoder reads it (its leniencies included: a record it decoded passes)
        return decode_control(payload, version)
    except ProtocolError:
        return None


@dataclass(frozen=True, slots=True)
class MuxHeader:
    """The parsed 25-byte record header (before the payload is read).

    Attributes:
        kind: raw kind byte (validated only after the tag).
        rank: raw rank field.
        payload_len: payload length in bytes (already checked against the ceiling).
        auth_tag: the 8 tag bytes.

    Upstream: ``relay/mux.rs`` (the 25-byte record header ``read_record`` checks).
    """

    kind: int
    rank: int
    payload_len: int
    auth_tag: bytes


#: ``_header(kind, rank, payload_len, tag)``: ``MuxHeader(...)`` built without the frozen
#: dataclass's per-field ``object.__setattr__`` (a reader builds one per record)
_header: Callable[..., MuxHeader] = slot_builder(MuxHeader)


def _header_bytes(kind: int, rank: int, payload_len: int, tag: bytes) -> bytes:
    return _MUX_HEADER.pack(MUX_RECORD_MAGIC, MUX_PROTOCOL_VERSION, kind, rank, payload_len,
                            bytes(tag))


def encode_mux_record_parts(
    kind: int, rank: int, payload: Sequence[BytesLike], salt: BytesLike,
    *, ceiling: int = DEFAULT_FRAME_CEILING,
) -> list[BytesLike]:
    """Encode a record whose payload is the concatenation of ``payload`` pieces (not copied).

    Returns ``[header (25 bytes), *payload]`` for ``socket.sendmsg``; the tag covers header
    bytes 0..17 and every payload piece. Use it to wrap :func:`encode_round_frame` output in a
    HostFrame or Broadcast without copying tensor bytes.

    Raises:
        InvalidValue (local): bad salt or rank, or a ``kind`` that is not an integer 0..255
            (``mux.bad_field``: a bool, a float or text is refused, never truncated; an unknown
            kind byte is written); ``payload`` is one buffer (pass ``[data]``), text or no
            iterable (``codec.not_pieces``), or one of its pieces is no contiguous buffer or
            is NumPy text (``codec.not_bytes_like`` naming ``payload[i]``); LimitExceeded
            (local): payload above ``ceiling``.

    Upstream: ``relay/mux.rs`` ``write_record``.
    """
    key = check_salt(salt)
    check_ceiling(ceiling)
    r = _check_rank(rank, "rank")
    k = wire_int(kind)  # any kind byte may be written (a conformance case sends unknown ones)
    if k is None or not 0 <= k <= 0xFF:
        raise protocol_error("mux.bad_field", field="kind", value=kind, reason="not a u8")
    if type(payload) is not list and type(payload) is not tuple:
        # an iterator is read once, here: measuring it first left no piece to write
        if isinstance(payload, str) or is_buffer(payload):
            raise not_pieces("payload", payload)
        try:
            payload = list(payload)
        except TypeError:
            raise not_pieces("payload", payload) from None
    try:
        length = 0
        for p in payload:
            view = memoryview(p)
            # Python object pointers (a NumPy object array), NumPy text's UCS-4 characters:
            # no bytes
            if "O" in view.format or (view.format[-1:] == "w" and numpy_text(p)):
                raise BufferError
            length += view.nbytes
    except (TypeError, BufferError):  # None, text, a message object: no buffers
        raise not_pieces("payload", payload) from None
    if length > min(ceiling, U32_MAX):
        raise protocol_error("mux.payload_too_large_local", length=length, ceiling=ceiling)
    covered = _header_bytes(k, r, length, bytes(AUTH_TAG_LEN))[:MUX_AUTH_COVERED_HEADER_LEN]
    mac = new_mac(key)
    mac.update(covered)
    try:
        for p in payload:
            mac.update(p)
    except BufferError:  # a strided view: the MAC (and sendmsg) take C-contiguous buffers only
        raise not_pieces("payload", payload) from None
    tag = bytes(mac.digest()[:AUTH_TAG_LEN])
    return [covered + tag, *payload]


#: every record kind value, and their names, for :func:`encode_mux_record`'s check
_RECORD_KINDS = frozenset(int(k) for k in RecordKind)
_KIND_NAMES = [f"{int(k)} {k.name}" for k in RecordKind]


def encode_mux_record(record: MuxRecord, salt: BytesLike,
                      *, ceiling: int = DEFAULT_FRAME_CEILING) -> list[BytesLike]:
    """Encode ``record`` signed with ``salt`` as ``[header, payload]`` buffers.

    Raises:
        InvalidValue (local): ``record`` is not a :class:`MuxRecord`, or its kind is not a
            :class:`RecordKind` (the decoder refuses any other kind byte; a conformance test
            that needs one writes it with :func:`encode_mux_record_parts`), or the salt is not
            16 bytes; LimitExceeded (local): payload too large.

    Upstream: ``flodl/src/distributed/relay/mux.rs`` ``write_record``.
    """
    try:
        kind, rank, payload = record.kind, record.rank, record.payload
    except AttributeError:
        raise protocol_error("mux.bad_type", field="record", expected="a MuxRecord",
                             got=shown_type(record)) from None
    if wire_int(kind) not in _RECORD_KINDS:
        raise protocol_error("mux.bad_field", field="kind", value=kind,
                             reason=f"not a record kind ({', '.join(_KIND_NAMES)})")
    return encode_mux_record_parts(int(kind), rank, [payload], salt, ceiling=ceiling)


def encode_mux_record_bytes(record: MuxRecord, salt: BytesLike) -> bytes:
    """Encode ``record`` signed with ``salt`` into one ``bytes``.

    Raises:
        InvalidValue (local): as :func:`encode_mux_record`; LimitExceeded (local): payload
            above the frame ceiling.

    Upstream: ``flodl/src/distributed/relay/mux.rs`` ``write_record``.
    """
    return b"".join(encode_mux_record(record, salt))


def encode_frame_record(kind: RecordKind, frame: RoundFrame, salt: BytesLike,
                        *, ceiling: int = DEFAULT_FRAME_CEILING,
                        mac_executor: Executor | None = None) -> list[BytesLike]:
    """Encode ``frame`` inside a HostFrame or Broadcast record: ``[header, *frame buffers]``.

    The frame is signed (inner tag) and the record is signed (outer tag), both with ``salt``;
    tensor bytes are not copied. With ``mac_executor`` the two MACs run concurrently over the
    same bytes of a large frame (the record MAC takes the inner tag last), see
    :func:`~flodl_proto.codec.auth.update_in_parallel`; without one, both on the calling thread.

    Raises:
        InvalidValue (local): ``kind`` is not HOST_FRAME or BROADCAST (as an integer: ``3.0``
            is refused), or the salt is not 16 bytes, or ``ceiling`` is not a non-negative
            integer, or ``frame`` is not a :class:`RoundFrame` (``frame.bad_type``);
            LimitExceeded (local): the frame is above ``ceiling`` (default 1 GiB).

    Upstream: ``relay/mux.rs`` ``write_record`` around ``round_frame.rs``
    ``write_round_frame_streamed``.
    """
    # by the codec's integer rule: a float (3.0) or bool kind is refused, not taken as a kind
    if wire_int(kind) not in (REC_HOST_FRAME, REC_BROADCAST):
        raise protocol_error("mux.bad_field", field="kind", value=kind,
                             reason="a RoundFrame rides in a HostFrame or Broadcast record")
    key = check_salt(salt)
    check_ceiling(ceiling)
    body = round_frame_pieces(frame)
    length = sum([memoryview(p).nbytes for p in body]) + AUTH_TAG_LEN
    if length > min(ceiling, U32_MAX):
        raise protocol_error("mux.payload_too_large_local", length=length, ceiling=ceiling)
    covered = _header_bytes(int(kind), 0, length,
                            bytes(AUTH_TAG_LEN))[:MUX_AUTH_COVERED_HEADER_LEN]
    inner = new_mac(key)
    outer = new_mac(key)
    outer.update(covered)
    # both jobs hash the body: below PARALLEL_MAC_MIN bytes update_in_parallel runs them on
    # this thread whatever the executor, so it is not asked to measure the pieces again
    update_in_parallel([(inner, body), (outer, body)],
                       mac_executor if length - AUTH_TAG_LEN >= PARALLEL_MAC_MIN else None)
    inner_tag = bytes(inner.digest()[:AUTH_TAG_LEN])
    outer.update(inner_tag)
    return [covered + bytes(outer.digest()[:AUTH_TAG_LEN]), *body, inner_tag]




def parse_mux_header(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING) -> MuxHeader:
    """Parse and check the 25-byte header at the start of ``data`` (which must hold it).

    Raises:
        TruncatedInput (remote) ``mux.header_read_failed``: fewer than 25 bytes; then BadMagic,
        VersionMismatch, LimitExceeded (remote), in that order.

    Upstream: ``relay/mux.rs`` ``read_record`` (its header checks).
    """
    hdr = parse_mux_header_or_eos(data, ceiling=ceiling)
    if hdr is END_OF_STREAM:
        raise protocol_error("mux.header_read_failed", got=as_view(data).nbytes,
                             need=MUX_HEADER_LEN)
    return hdr


def parse_mux_header_or_eos(data: BytesLike, *, ceiling: int = DEFAULT_FRAME_CEILING
                            ) -> MuxHeader | EndOfStream:
    """Stream form of :func:`parse_mux_header`.

    Returns :data:`END_OF_STREAM` when ``data`` holds fewer than 25 bytes.

    Raises:
        BadMagic, VersionMismatch, LimitExceeded (remote), in that order.

    Upstream: ``relay/mux.rs`` ``try_read_from`` (its header checks; ``Ok(None)`` at a clean end).
    """
    check_ceiling(ceiling)
    mv = as_view(data)
    if len(mv) < MUX_HEADER_LEN:
        return END_OF_STREAM
    magic, version, kind, rank, payload_len, tag = _MUX_HEADER.unpack_from(mv, 0)
    if magic != MUX_RECORD_MAGIC:
        raise protocol_error("mux.bad_magic", got=magic, expected=MUX_RECORD_MAGIC)
    if version != MUX_PROTOCOL_VERSION:
        raise protocol_error("mux.bad_version", got=version, expected=MUX_PROTOCOL_VERSION)
    if payload_len > ceiling:
        raise protocol_error("mux.payload_too_large", length=payload_len, ceiling=ceiling,
                             kind=kind, rank=rank)
    return _header(kind, rank, payload_len, tag)


def decode_mux_record(
    data: BytesLike,
    salt: BytesLike,
    *,
    version: int = DEFAULT_VERSION,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
    header: MuxHeader | None = None,
) -> tuple[MuxRecord, int]:
    """Decode and authenticate one complete record from the start of ``data``.

    The whole-buffer form of :func:`decode_mux_record_or_eos` (same arguments and checks).

    Returns:
        ``(record, consumed)``; the record payload is a view into ``data``.

    Raises:
        TruncatedInput (remote) ``mux.header_read_failed`` when ``data`` ends inside the 25-byte
        header (including empty input); every error of :func:`decode_mux_record_or_eos`.

    Upstream: ``relay/mux.rs`` ``read_record`` (``Ok(None)`` is an error here).
    """
    res = decode_mux_record_or_eos(data, salt, version=version, ceiling=ceiling, premac=premac,
                                   header=header)
    if res is END_OF_STREAM:
        raise protocol_error("mux.header_read_failed", got=as_view(data).nbytes,
                             need=MUX_HEADER_LEN)
    return res


def decode_mux_record_or_eos(
    data: BytesLike,
    salt: BytesLike,
    *,
    version: int = DEFAULT_VERSION,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
    header: MuxHeader | None = None,
) -> tuple[MuxRecord, int] | EndOfStream:
    """Stream form: decode and authenticate one record from the start of ``data``, or report a
    clean end of stream.

    Args:
        data: bytes-like input; the record payload is a view into it.
        salt: 16-byte session salt.
        version: data-channel protocol version (decides the ``Hello`` shape).
        ceiling: frame ceiling for ``payload_len`` (bytes).
        premac: the MAC the caller already computed over header bytes 0..17 and the payload
            (see :class:`~flodl_proto.codec.auth.Premac`); used when it covers ``17 +
            payload_len`` bytes, else the covered bytes are hashed here.
        header: the header :func:`parse_mux_header` already returned for ``data``'s first 25
            bytes with this ``ceiling`` (a reader that checked it before reading the payload);
            it is then not parsed again. None: parsed here.

    Returns:
        ``(record, consumed)``, or :data:`END_OF_STREAM` when ``data`` ends inside the header.

    Raises:
        BadMagic, VersionMismatch, LimitExceeded, TruncatedInput, AuthenticationError,
        InvalidValue (remote), in upstream's order (magic, version, ceiling, payload, tag, kind,
        bincode).
        InvalidValue (local): bad salt, ``header`` or ``premac`` is neither a
            :class:`MuxHeader` / :class:`Premac` nor None (``mux.bad_type``), ``data`` is not
            a contiguous buffer (``codec.not_bytes_like``), or ``ceiling`` is not a
            non-negative integer (``ceiling.invalid``);
            VersionMismatch (local) ``version.unsupported``: ``version`` is not 2 or 3.

    Upstream: ``relay/mux.rs`` ``read_record``.
    """
    res = read_mux_record_or_eos(data, check_salt(salt), version=version, ceiling=ceiling,
                                 premac=premac, header=header)
    return res if res is END_OF_STREAM else (res[0], res[2])


def read_mux_record_or_eos(
    data: BytesLike,
    salt: bytes | None,
    *,
    version: int = DEFAULT_VERSION,
    ceiling: int = DEFAULT_FRAME_CEILING,
    premac: Premac | None = None,
    header: MuxHeader | None = None,
) -> tuple[MuxRecord, MuxHeader, int] | EndOfStream:
    """:func:`decode_mux_record_or_eos` that also returns the parsed header, and with
    ``salt=None`` skips the tag check (every other check in the same order), for tools that
    report tags instead of enforcing them.

    Args:
        data: bytes-like input; the record payload is a view into it.
        salt: the 16-byte session salt (checked by the caller), or None: the tag is not checked.
        version, ceiling, premac: as for :func:`decode_mux_record_or_eos`.
        header: the header :func:`parse_mux_header` already returned for ``data``'s first 25
            bytes with this ``ceiling`` (a reader that read and checked the header before the
            payload), so it is not parsed again; None: parsed here.

    Returns:
        ``(record, header, consumed)``, or :data:`END_OF_STREAM` when ``data`` ends inside the
        header. ``header.rank`` is the wire's rank field (the record's is 0 for non-Data kinds).

    Raises:
        every error of :func:`decode_mux_record_or_eos` (without ``salt``, no AuthenticationError).
        InvalidValue (local) ``mux.bad_type``: ``header`` is neither a :class:`MuxHeader` nor
            None, or ``premac`` neither a :class:`Premac` nor None.

    Upstream: ``relay/mux.rs`` ``read_record``.
    """
    check_version(version)
    if premac is not None and not isinstance(premac, Premac):
        raise protocol_error("mux.bad_type", field="premac",
                             expected="a Premac (a MAC over the bytes being decoded) or None",
                             got=shown_type(premac))
    mv = as_view(data)
    if header is None:
        parsed = parse_mux_header_or_eos(mv, ceiling=ceiling)
        if parsed is END_OF_STREAM:
            return END_OF_STREAM
        hdr = parsed
    elif isinstance(header, MuxHeader):
        hdr = header
    else:
        raise protocol_error("mux.bad_type", field="header",
                             expected="a MuxHeader (parse_mux_header's result) or None",
                             got=shown_type(header))
    return read_headed_record(mv, salt, version, premac, hdr)


def header_or_none(mv: memoryview, ceiling: int) -> MuxHeader | None:
    """The header at the start of ``mv``, which holds at least its 25 bytes, or None where
    :func:`parse_mux_header` would raise (bad magic, bad version, ``payload_len`` above
    ``ceiling``; which error is for the stream to tell): a reader's check of a header it has
    just read, before reading the payload.

    The fast form of :func:`parse_mux_header` for callers whose arguments are already right:
    ``mv`` a flat unsigned-byte memoryview of at least 25 bytes, ``ceiling`` a checked
    non-negative int (nothing of either is checked here). For such arguments it returns what
    :func:`parse_mux_header` returns, and None exactly when that raises.

    Upstream: ``relay/mux.rs`` ``read_record`` (its header checks).
    """
    magic, version, kind, rank, payload_len, tag = _MUX_HEADER.unpack_from(mv, 0)
    if magic != MUX_RECORD_MAGIC or version != MUX_PROTOCOL_VERSION or payload_len > ceiling:
        return None
    return _header(kind, rank, payload_len, tag)


def read_headed_record(mv: memoryview, salt: bytes | None, version: int,
                       premac: Premac | None, hdr: MuxHeader
                       ) -> tuple[MuxRecord, MuxHeader, int]:
    """The part of :func:`read_mux_record_or_eos` after its argument checks and header parse:
    the length, tag, kind and body checks of the record ``hdr`` heads at the start of ``mv``.

    For callers whose arguments are already right (a stream with a checked version, a
    flat unsigned-byte memoryview, a :class:`MuxHeader` from :func:`parse_mux_header` or
    :func:`header_or_none` for ``mv``'s first 25 bytes); :func:`read_mux_record_or_eos` runs it
    after checking them, so both give the same records and the same errors.

    Raises:
        TruncatedInput, AuthenticationError, InvalidValue (remote): as
        :func:`read_mux_record_or_eos`.

    Upstream: ``relay/mux.rs`` ``read_record`` (its length, tag and body checks).
    """
    end = MUX_HEADER_LEN + hdr.payload_len
    if len(mv) < end:
        raise protocol_error("mux.truncated", got=len(mv), need=end)
    payload = mv[MUX_HEADER_LEN:end]
    if salt is not None:
        if premac is not None and premac.covered == MUX_AUTH_COVERED_HEADER_LEN + hdr.payload_len:
            computed = premac.digest[:AUTH_TAG_LEN]
        else:
            mac = new_mac(salt)
            mac.update(mv[:MUX_AUTH_COVERED_HEADER_LEN])
            mac.update(payload)
            computed = mac.digest()[:AUTH_TAG_LEN]
        if not tags_equal(computed, hdr.auth_tag):
            raise protocol_error("mux.auth_failed", computed=tag_as_u64(computed),
                                 carried=tag_as_u64(hdr.auth_tag), kind=hdr.kind, rank=hdr.rank,
                                 length=hdr.payload_len)
    kind = _KINDS.get(hdr.kind)
    if kind is None:
        raise protocol_error("mux.unknown_kind", kind=hdr.kind)
    if kind is RecordKind.DATA:
        return _record(kind, hdr.rank, payload), hdr, end
    if kind is RecordKind.CONTROL:
        return _record(kind, 0, payload, decode_control(payload, version)), hdr, end
    return _record(kind, 0, payload), hdr, end


def rust_debug(record: MuxRecord, limit: int = 256) -> str:
    """Upstream's ``{:?}`` rendering of a mux record, for messages that quote a record as
    upstream's do, bounded: a payload byte list shows its first ``limit`` bytes, a Hello's rank
    list its first ``limit`` ranks, and its signature list as many whole signatures as
    ``limit`` bytes hold (8 of 32 bytes at the default 256), each list followed by ``, ...``
    when it has more (``ranks: [0, 1, 2, ...]``, ``model_sigs: [...]``), so that a record of
    any size (a Hello of 100,000 ranks) renders in a few kilobytes. A record within the
    bounds renders exactly as upstream's does. Raises nothing.

    Upstream: Rust's derived ``Debug`` for ``relay/mux.rs`` ``MuxRecord`` / ``RelayControlMsg``
    (which writes every item; the bound is this package's).
    """
    def capped(items: Sequence[Any], cap: int, item: Callable[[Any], str] = str) -> str:
        cap = max(cap, 0)
        text = ", ".join(item(x) for x in items[:cap])
        more = len(items) > cap
        return f"[{text}{', ' if text and more else ''}{'...' if more else ''}]"

    def blist(data: Sequence[int]) -> str:
        return capped(data, limit)

    if record.kind is RecordKind.DATA:
        return f"Data {{ rank: {record.rank}, payload: {blist(record.payload)} }}"
    if record.kind is RecordKind.HOST_FRAME:
        return f"HostFrame {{ payload: {blist(record.payload)} }}"
    if record.kind is RecordKind.BROADCAST:
        return f"Broadcast {{ payload: {blist(record.payload)} }}"
    msg = record.control
    if isinstance(msg, HelloAck):
        return "Control(HelloAck)"
    if isinstance(msg, RankExit | DeclareDead):
        return f"Control({type(msg).__name__} {{ rank: {msg.rank} }})"
    if isinstance(msg, Hello):
        sigs = capped(msg.model_sigs, limit // MODEL_SIG_LEN, blist)
        return (f"Control(Hello {{ host: {json.dumps(msg.host)}, ranks: "
                f"{capped(msg.ranks, limit)}, model_sigs: {sigs} }})")
    return f"Control({msg!r})"  # pragma: no cover - every variant is handled above

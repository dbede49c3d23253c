"""The ``RelayControlMsg`` control messages a Control mux record carries, and their bincode 2
``standard()`` form: :class:`Hello` (``{host, ranks}`` at version 2, ``{host, ranks,
model_sigs}`` at version 3), :class:`HelloAck`, :class:`RankExit`, :class:`DeclareDead`; the bound
on a legal Hello's payload; the rank list as upstream prints it. Every name is re-exported by
:mod:`flodl_proto.codec.mux`, the module to import them from.

Upstream: ``flodl/src/distributed/relay/mux.rs`` (``RelayControlMsg``, ``encode``, ``decode``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from ..errors import ProtocolError, protocol_error, shown, shown_type
from ..spec import (
    CONTROL_VARIANTS,
    DEFAULT_VERSION,
    MAX_HELLO_HOST_LEN,
    MODEL_SIG_LEN,
    REC_CONTROL,
    U32_MAX,
)
from ._common import (
    BytesLike,
    as_view,
    check_version,
    check_world_size,
    short_items,
    wire_int,
)
from .bincode import BincodeReader, encode_string, encode_varint

__all__: list[str] = []

# -- control messages ----------------------------------------------------------------------------
def _check_rank(rank: int, field: str) -> int:
    r = wire_int(rank)  # a bool or float rank is refused, never truncated
    if r is None or not 0 <= r <= U32_MAX:
        raise protocol_error("mux.bad_field", field=field, value=rank, reason="not a u32")
    return r


@dataclass(frozen=True, slots=True)
class Hello:
    """Relay -> controller, the first record of a connection: the host and the ranks it carries.

    Attributes:
        host: the relay's host name (diagnostic). Any length encodes; a controller bounds the
            whole Hello record (``max_hello_payload``), and
            :class:`~flodl_proto.fsm.relay_core.RelayCore` refuses a host longer than
            ``MAX_HELLO_HOST_LEN`` (255) UTF-8 bytes.
        ranks: the host's global ranks (u32 each; upstream sends them ascending).
        model_sigs: 32-byte model signatures (a sequence of bytes-like objects); version 3 only
            (empty on the data channel); must be empty to encode at version 2.

    Raises:
        InvalidValue (local): ``mux.bad_field`` naming the field and the value: ``Hello.host``
            when the host is not text (``str``: bytes such as ``b"h0"`` are refused, not stored
            as the text ``"b'h0'"``) or has no UTF-8 form (a lone surrogate), ``Hello.ranks``
            when it is no iterable of ranks (text and bytes-like objects included:
            ``b"\\x00\\x01"`` is refused, not taken as the ranks 0 and 1; a mapping too, whose
            keys would be), ``Hello.ranks[i]``
            when a rank does not fit u32 (or is no integer), ``Hello.model_sigs`` when it is no
            sequence of signatures (one ``bytes`` object or a mapping included),
            ``Hello.model_sigs[i]`` when
            a signature is not 32 bytes (a buffer, or a sequence of ints 0..255).

    Upstream: ``flodl/src/distributed/relay/mux.rs`` ``RelayControlMsg::Hello``.
    """

    host: str
    ranks: tuple[int, ...]
    model_sigs: tuple[bytes, ...] = ()

    def __init__(self, host: str, ranks: Iterable[int], model_sigs: Iterable[bytes] = ()) -> None:
        if not isinstance(host, str):  # str(b"h0") would be the text "b'h0'"
            raise protocol_error("mux.bad_field", field="Hello.host", value=host,
                                 reason="not text (str)")
        try:  # the wire carries UTF-8: a lone surrogate (an undecodable byte of argv) has none
            host.encode("utf-8")
        except UnicodeEncodeError:
            raise protocol_error("mux.bad_field", field="Hello.host", value=host,
                                 reason="not UTF-8 text (a lone surrogate)") from None
        object.__setattr__(self, "host", str(host))
        if isinstance(ranks, str):  # its characters would each be refused as the rank at fault
            raise protocol_error("mux.bad_field", field="Hello.ranks", value=ranks,
                                 reason="not an iterable of u32 ranks (text is none)")
        if isinstance(ranks, bytes | bytearray | memoryview):  # its bytes would be the ranks
            raise protocol_error("mux.bad_field", field="Hello.ranks", value=bytes(ranks),
                                 reason="not an iterable of u32 ranks (bytes are none: each "
                                        "byte would be taken as a rank; pass a list of ints)")
        if isinstance(ranks, Mapping):  # its keys would be taken as the ranks, its values lost
            raise protocol_error("mux.bad_field", field="Hello.ranks", value=ranks,
                                 reason="not an iterable of u32 ranks (a mapping is none: its "
                                        "keys would be taken as the ranks; pass a list of ints)")
        try:
            checked = tuple(_check_rank(r, f"Hello.ranks[{i}]") for i, r in enumerate(ranks))
        except TypeError:  # None, a number: no sequence of ranks
            raise protocol_error("mux.bad_field", field="Hello.ranks", value=ranks,
                                 reason="not an iterable of u32 ranks") from None
        object.__setattr__(self, "ranks", checked)
        object.__setattr__(self, "model_sigs", _model_sigs(model_sigs))

    def __repr__(self) -> str:
        """``Hello(host='h0', ranks=(0, 1), model_sigs=())``: more than 8 ranks or signatures by
        their first 3 and last 2 and their count (``ranks=(0, 1, 2, ..., 99998, 99999) (100000
        ranks)``, ``(1000 signatures)``), as a RoundFrame shows its tensors, and a host of more
        than 80 characters by its first 40 and last 20 and its length (``'aaa...ccc' (100000
        characters)``), as an error message quotes a long text, so that the repr stays short
        whatever the Hello holds."""
        return (f"Hello(host={shown(self.host)}, ranks={short_items(self.ranks, 'ranks')}, "
                f"model_sigs={short_items(self.model_sigs, 'signatures')})")


def _model_sigs(model_sigs: Iterable[bytes]) -> tuple[bytes, ...]:
    """``Hello.model_sigs`` as a tuple of 32-byte ``bytes``, or ``mux.bad_field`` naming the
    signature at fault (one ``bytes`` object given for the sequence showed its first byte)."""
    reason = "not an iterable of 32-byte signatures"
    if isinstance(model_sigs, bytes | bytearray | memoryview | str):
        raise protocol_error("mux.bad_field", field="Hello.model_sigs", value=model_sigs,
                             reason=f"{reason} (one signature? pass it in a list)")
    if isinstance(model_sigs, Mapping):  # its keys would be taken as the signatures
        raise protocol_error("mux.bad_field", field="Hello.model_sigs", value=model_sigs,
                             reason=f"{reason} (a mapping is none: its keys would be taken as "
                                    "the signatures; pass a list)")
    try:
        given = list(model_sigs)
    except TypeError:
        raise protocol_error("mux.bad_field", field="Hello.model_sigs", value=model_sigs,
                             reason=reason) from None
    sigs = []
    for i, sig in enumerate(given):
        try:  # a buffer, or 32 ints 0..255 (Rust's [u8; 32]); an int n is no n zero bytes
            if wire_int(sig) is not None or isinstance(sig, str):
                raise TypeError
            b = bytes(sig)
        except (TypeError, ValueError):
            raise protocol_error("mux.bad_field", field=f"Hello.model_sigs[{i}]", value=sig,
                                 reason="not bytes (or a sequence of ints 0..255)") from None
        if len(b) != MODEL_SIG_LEN:
            raise protocol_error("mux.bad_field", field=f"Hello.model_sigs[{i}]", value=b,
                                 reason=f"{len(b)} bytes, not {MODEL_SIG_LEN}")
        sigs.append(b)
    return tuple(sigs)


@dataclass(frozen=True, slots=True)
class HelloAck:
    """Controller -> relay: the reply to an accepted :class:`Hello`.

    Upstream: ``relay/mux.rs`` ``RelayControlMsg::HelloAck``.
    """


@dataclass(frozen=True, slots=True)
class RankExit:
    """Relay -> controller: local rank ``rank`` closed its connection (u32; an ``int`` or a
    NumPy integer, kept as an ``int``).

    Raises:
        InvalidValue (local) ``mux.bad_field`` naming ``RankExit.rank`` and the value: not an
            integer in 0..2**32-1 (a bool, a float or text included).

    Upstream: ``relay/mux.rs`` ``RelayControlMsg::RankExit``.
    """

    rank: int

    def __post_init__(self) -> None:
        # kept as the checked int: a NumPy integer would reach the varint writer as itself
        object.__setattr__(self, "rank", _check_rank(self.rank, "RankExit.rank"))


@dataclass(frozen=True, slots=True)
class DeclareDead:
    """Controller -> relay: drop rank ``rank`` (u32; an ``int`` or a NumPy integer, kept as an
    ``int``) from the fold barrier.

    Raises:
        InvalidValue (local) ``mux.bad_field`` naming ``DeclareDead.rank`` and the value: not
            an integer in 0..2**32-1 (a bool, a float or text included).

    Upstream: ``relay/mux.rs`` ``RelayControlMsg::DeclareDead``.
    """

    rank: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", _check_rank(self.rank, "DeclareDead.rank"))


ControlMessage: TypeAlias = Hello | HelloAck | RankExit | DeclareDead

_VARIANT_OF = {
    Hello: CONTROL_VARIANTS["Hello"],
    HelloAck: CONTROL_VARIANTS["HelloAck"],
    RankExit: CONTROL_VARIANTS["RankExit"],
    DeclareDead: CONTROL_VARIANTS["DeclareDead"],
}


def encode_control(msg: ControlMessage, version: int = DEFAULT_VERSION) -> bytes:
    """Encode a control message with bincode 2 ``standard()``.

    Args:
        msg: the message.
        version: data-channel protocol version: 2 (``Hello{host, ranks}``) or 3 (``Hello{host,
            ranks, model_sigs}``).

    Raises:
        VersionMismatch (local): unsupported version, or model signatures at version 2.
        InvalidValue (local): ``msg`` is not a control message (``mux.bad_type``), or a field
            does not fit its wire type.

    Upstream: ``relay/mux.rs`` ``encode`` (``RelayControlMsg``).
    """
    check_version(version)
    variant = _VARIANT_OF.get(type(msg))
    if variant is None:
        raise protocol_error(
            "mux.bad_type", field="msg",
            expected="a control message (Hello, HelloAck, RankExit or DeclareDead)",
            got=shown_type(msg))
    out = bytearray(encode_varint(variant, 32, field="variant"))
    if isinstance(msg, Hello):
        out += encode_string(msg.host)
        out += encode_varint(len(msg.ranks), 64, field="Hello.ranks length")
        for r in msg.ranks:
            out += encode_varint(r, 32, field="Hello.ranks")
        if version >= 3:
            out += encode_varint(len(msg.model_sigs), 64, field="Hello.model_sigs length")
            for s in msg.model_sigs:
                out += s
        elif msg.model_sigs:
            raise protocol_error("control.model_sigs_v2", count=len(msg.model_sigs))
    elif isinstance(msg, RankExit | DeclareDead):
        out += encode_varint(msg.rank, 32, field=f"{type(msg).__name__}.rank")
    return bytes(out)


def decode_control(data: BytesLike, version: int = DEFAULT_VERSION) -> ControlMessage:
    """Decode a bincode ``RelayControlMsg`` (bytes after the message are ignored).

    Raises:
        TruncatedInput, InvalidValue (remote): upstream's "relay_mux: bincode decode failed: ...".
        InvalidValue (local) ``codec.not_bytes_like``: ``data`` is not a contiguous buffer;
        VersionMismatch (local) ``version.unsupported``: ``version`` is not 2 or 3.

    Upstream: ``relay/mux.rs`` ``decode`` (``decode_from_slice``, consumed count discarded).
    """
    check_version(version)
    rd = BincodeReader(as_view(data))
    variant = rd.varint(32, "variant")
    if variant == CONTROL_VARIANTS["Hello"]:
        host = rd.string("Hello.host")
        ranks = [rd.varint(32, "Hello.ranks") for _ in range(rd.seq_len("Hello.ranks"))]
        sigs: list[bytes] = []
        if version >= 3:
            n = rd.seq_len("Hello.model_sigs")
            sigs = [bytes(rd.raw(MODEL_SIG_LEN, "Hello.model_sigs")) for _ in range(n)]
        return Hello(host, ranks, sigs)
    if variant == CONTROL_VARIANTS["HelloAck"]:
        return HelloAck()
    if variant == CONTROL_VARIANTS["RankExit"]:
        return RankExit(rd.varint(32, "RankExit.rank"))
    if variant == CONTROL_VARIANTS["DeclareDead"]:
        return DeclareDead(rd.varint(32, "DeclareDead.rank"))
    raise protocol_error("bincode.invalid_variant", value=variant, count=len(CONTROL_VARIANTS))



def max_hello_payload(world_size: int) -> int:
    """The largest payload, in bytes, of a legal ``Control(Hello)`` for ``world_size`` ranks:
    the bound on a relay's first record, checked from its header before any payload byte is
    read (``spec/wire.yaml`` departure ``hello_bound``: upstream reads that record up to the
    frame ceiling).

    Every varint is counted at its widest legal form (readers accept non-minimal varints): the
    variant (u32), the host name (u64 length + at most ``MAX_HELLO_HOST_LEN`` bytes), the ranks
    (u64 count + ``world_size`` u32s) and the model signatures (u64 count + at most one
    32-byte signature per rank; a version-2 reader ignores them but accepts them), so
    ``287 + 37 x world_size``.

    ``world_size`` is an integer by the codec's rule
    (:func:`~flodl_proto.codec._common.wire_int`: ``int``, a NumPy integer, whatever
    ``operator.index`` takes but a bool), as :class:`~flodl_proto.fsm.ControllerCore` takes it.

    Raises:
        InvalidValue (local): ``world_size`` is not a whole number in 1..U32_MAX (ranks are u32
            on the wire; :func:`~flodl_proto.codec._common.check_world_size`, the rule by which
            :class:`~flodl_proto.fsm.ControllerCore` refuses it): 0 (``np.int64(0)`` too) is
            ``controller.world_size_zero`` (upstream's words), any other such value (a negative
            one, 2**32 or more, a bool, a float, text, None) ``controller.bad_argument`` naming
            ``world_size`` and the value.

    Upstream: ``relay/mux.rs`` ``RelayControlMsg::Hello`` (the layout); the bound is ours.
    """
    n = check_world_size(world_size)  # ControllerCore's rule: a NumPy integer, not a bool
    u32, u64 = 1 + 4, 1 + 8  # marker byte + the widest value the field's type allows
    return (u32 + (u64 + MAX_HELLO_HOST_LEN) + (u64 + u32 * n)
            + (u64 + MODEL_SIG_LEN * n))


def max_control_payload(world_size: int) -> int:
    """The largest payload, in bytes, of any legal Control record for ``world_size`` ranks:
    :func:`max_hello_payload` (a ``Hello`` is the longest control message; ``HelloAck``,
    ``RankExit`` and ``DeclareDead`` take at most 10 bytes). The bound on a Control record
    after the first, checked from its header before its payload is read (``spec/wire.yaml``
    departure ``control_bound``: upstream reads and decodes any Control record up to the frame
    ceiling, a Hello's rank list at up to one entry per payload byte).

    Raises:
        InvalidValue (local): as :func:`max_hello_payload`.

    Upstream: ``relay/mux.rs`` ``RelayControlMsg`` (the layouts); the bound is ours.
    """
    return max_hello_payload(world_size)


#: the reader of a mux stream -> its error for a Control record past the control bound
_CONTROL_TOO_LONG = {"controller": "controller.control_too_long",
                     "relay": "relay.control_too_long"}


def control_too_long(kind: int, payload_len: int, limit: int,
                     reader: str = "controller") -> ProtocolError | None:
    """The control bound (``spec/wire.yaml`` departure ``control_bound``), the one rule both
    readers of a mux stream apply from a record's header, before its payload is read: a
    Control record (kind byte ``kind``) whose ``payload_len`` (bytes) is above ``limit``
    (bytes: :func:`max_control_payload` of the world size) is refused.

    Args:
        kind: the header's kind byte. payload_len: the header's payload length (bytes).
        limit: the largest Control payload the reader takes (bytes).
        reader: whose stream it is: ``"controller"`` (a relay's records; the
            :class:`~flodl_proto.codec.stream.MuxStream` applies it to the Control records
            after the Hello) or ``"relay"`` (the controller's records, read by the relay's
            runner).

    Returns:
        The error to raise, remote LimitExceeded ``controller.control_too_long`` or
        ``relay.control_too_long`` naming the length and the limit; None for a record within
        the bound or of another kind.

    Raises:
        InvalidValue (local) ``mux.bad_field``: ``reader`` is neither ``"controller"`` nor
            ``"relay"``; ``kind`` is not a u8, ``payload_len`` not a u32, or ``limit`` not a
            whole number >= 0 (integers by the codec's rule: a bool, a float or text is none).

    Upstream: none; upstream's ``relay/mux.rs`` ``read_record`` reads and decodes a Control
    record up to the frame ceiling (the bound is ours).
    """
    error_id = _CONTROL_TOO_LONG.get(reader) if isinstance(reader, str) else None
    if error_id is None:
        raise protocol_error("mux.bad_field", field="reader", value=reader,
                             reason="not 'controller' or 'relay'")
    if type(kind) is not int or type(payload_len) is not int or type(limit) is not int \
            or not 0 <= kind <= 0xFF or not 0 <= payload_len <= U32_MAX or limit < 0:
        kind, payload_len, limit = _bound_args(kind, payload_len, limit)
    if kind == REC_CONTROL and payload_len > limit:
        return protocol_error(error_id, length=payload_len, limit=limit)
    return None


def _bound_args(kind: object, payload_len: object, limit: object) -> tuple[int, int, int]:
    """:func:`control_too_long`'s numbers as ``int`` (an IntEnum kind, a NumPy integer), each
    refused (``mux.bad_field``) when it is not an integer in its range."""
    k, n, lim = wire_int(kind), wire_int(payload_len), wire_int(limit)
    if k is None or not 0 <= k <= 0xFF:
        raise protocol_error("mux.bad_field", field="kind", value=kind, reason="not a u8")
    if n is None or not 0 <= n <= U32_MAX:
        raise protocol_error("mux.bad_field", field="payload_len", value=payload_len,
                             reason="not a u32")
    if lim is None or lim < 0:
        raise protocol_error("mux.bad_field", field="limit", value=limit,
                             reason="not a whole number >= 0 (bytes)")
    return k, n, lim


def ranks_str(ranks: Iterable[int]) -> str:
    """A rank list as upstream's ``{:?}`` prints a ``Vec<u32>``: ``[0, 1, 2]``.

    Upstream: Rust's ``{:?}`` of a ``Vec<u32>``, as the messages of ``controller/mod.rs`` print it
    (alone, and inside a record's ``{:?}``).
    """
    return "[" + ", ".join(str(r) for r in ranks) + "]"

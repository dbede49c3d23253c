"""Rank data-channel handshake (16 bytes), its ack (8 bytes), and the channel-select magic.

Handshake (rank -> relay): ``magic u32 (HANDSHAKE_MAGIC_RANK) | version u32 | rank u32 |
world_size u32``. Ack (relay -> rank): ``magic u32 (HANDSHAKE_MAGIC_CONTROLLER_ACK) | version u32``.
Neither carries an auth tag. The handshake reader checks magic, version (exact) and world size,
in that order, and does NOT check ``rank < world_size`` (the relay checks its host rank set
instead). Running out of input anywhere
in a handshake, an ack or a channel magic is a :class:`~flodl_proto.errors.TruncatedInput` error,
never a clean end of stream.

Channel magic (relay -> controller, first 4 bytes of a cross-host connection): a little-endian
u32 naming the channel (``CHANNEL_MAGIC_DATA`` = ``e1 17 0d f1`` on the data channel).

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``read_handshake``,
``write_handshake_ack``), ``cpu_reduce.rs`` (``send_handshake``, ack check), ``wire.rs``
(``write_channel_magic``, ``expect_channel_magic``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import protocol_error
from ..spec import (
    CHANNEL_MAGIC_DATA,
    CHANNEL_MAGIC_HTTP_GET,
    CHANNEL_MAGIC_HTTP_POST,
    CHANNEL_MAGIC_LEN,
    CHANNELS,
    DEFAULT_VERSION,
    HANDSHAKE_ACK_LEN,
    HANDSHAKE_LEN,
    HANDSHAKE_MAGIC_CONTROLLER_ACK,
    HANDSHAKE_MAGIC_RANK,
    U32_MAX,
)
from ._common import BytesLike, as_view, check_version, wire_int
from .structs import CHANNEL_MAGIC, HANDSHAKE, HANDSHAKE_ACK

__all__ = [
    "Handshake",
    "channel_of",
    "decode_ack",
    "decode_handshake",
    "encode_ack",
    "encode_channel_magic",
    "encode_handshake",
    "expect_channel_magic",
    "http_stream",
]



@dataclass(frozen=True, slots=True)
class Handshake:
    """A decoded rank handshake (:func:`encode_handshake` takes its fields).

    Attributes:
        rank: the rank id as sent (u32; may be >= world_size, see the spec's leniencies).
        world_size: the rank's view of the world size (u32).
        version: the protocol version it carried (2 or 3).

    Raises:
        InvalidValue (local) ``handshake.bad_field``: ``rank`` or ``world_size`` is no u32 by
            the codec's integer rule (a bool, a float or text is refused), named
            ``Handshake.rank`` / ``Handshake.world_size`` with the value; VersionMismatch
            (local) ``version.unsupported``: ``version`` is not 2 or 3.

    Upstream: ``controller/mod.rs`` ``read_handshake``.
    """

    rank: int
    world_size: int
    version: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", _check_u32("Handshake.rank", self.rank))
        object.__setattr__(self, "world_size",
                           _check_u32("Handshake.world_size", self.world_size))
        object.__setattr__(self, "version", check_version(self.version))


def encode_handshake(rank: int, world_size: int, version: int = DEFAULT_VERSION) -> bytes:
    """Encode the 16-byte rank handshake.

    Raises:
        InvalidValue (local): rank or world size outside u32, or not an integer (the codec's
            integer rule, :func:`~flodl_proto.codec._common.wire_int`: a bool, a float or text is
            refused, never truncated or taken as 0 / 1); VersionMismatch (local): bad version.

    Upstream: ``flodl/src/distributed/cpu_reduce.rs`` ``send_handshake``.
    """
    version = check_version(version)
    fields = {"rank": _check_u32("rank", rank), "world_size": _check_u32("world_size", world_size)}
    return bytes(HANDSHAKE.build({"magic": HANDSHAKE_MAGIC_RANK, "version": version, **fields}))


def decode_handshake(data: BytesLike, expected_world_size: int | None,
                     version: int = DEFAULT_VERSION) -> tuple[Handshake, int]:
    """Read and check a rank handshake at the start of ``data``.

    Args:
        data: the received bytes (any contiguous buffer).
        expected_world_size: the world size this relay serves (u32); a handshake carrying
            another is refused. None: the world size is not checked (a capture tool that does
            not know it); the handshake's is in the result, every other check is made.
        version: the protocol version this relay speaks.

    Returns:
        ``(handshake, 16)``.

    Raises:
        TruncatedInput, BadMagic, VersionMismatch, InvalidValue (world size, unless
        ``expected_world_size`` is None) — remote, in that order; upstream's
        "cluster_controller: handshake ..." wording.
        InvalidValue (local): ``data`` is not a buffer, or ``expected_world_size`` is neither
        None nor a u32; VersionMismatch (local): bad ``version``.

    Upstream: ``flodl/src/distributed/controller/mod.rs`` ``read_handshake``.
    """
    version = check_version(version)
    if expected_world_size is not None:
        _check_u32("expected_world_size", expected_world_size)
    mv = as_view(data)
    if len(mv) < HANDSHAKE_LEN:
        raise protocol_error("handshake.read_failed", got=len(mv), need=HANDSHAKE_LEN)
    h = HANDSHAKE.parse(mv[:HANDSHAKE_LEN])
    if h.magic != HANDSHAKE_MAGIC_RANK:
        raise protocol_error("handshake.bad_magic", got=h.magic, expected=HANDSHAKE_MAGIC_RANK)
    if h.version != version:
        raise protocol_error("handshake.bad_version", got=h.version, expected=version)
    if expected_world_size is not None and h.world_size != expected_world_size:
        raise protocol_error("handshake.world_size_mismatch", got=h.world_size,
                             expected=expected_world_size)
    return Handshake(h.rank, h.world_size, h.version), HANDSHAKE_LEN


def encode_ack(version: int = DEFAULT_VERSION) -> bytes:
    """Encode the 8-byte handshake ack for protocol ``version``.

    Raises:
        VersionMismatch (local): ``version`` is not a supported version (an integer).

    Upstream: ``flodl/src/distributed/controller/mod.rs`` ``write_handshake_ack``.
    """
    version = check_version(version)
    return bytes(HANDSHAKE_ACK.build({"magic": HANDSHAKE_MAGIC_CONTROLLER_ACK,
                                      "version": version}))


def decode_ack(data: BytesLike, version: int = DEFAULT_VERSION) -> int:
    """Read and check a handshake ack at the start of ``data``; return the bytes consumed (8).

    Raises:
        TruncatedInput, BadMagic, VersionMismatch (remote), in that order; upstream's
        "cpu_reduce: ..." wording. InvalidValue (local): ``data`` is not a buffer;
        VersionMismatch (local): bad ``version``.

    Upstream: ``flodl/src/distributed/cpu_reduce.rs`` (the ack check after
    ``send_handshake``).
    """
    version = check_version(version)
    mv = as_view(data)
    if len(mv) < HANDSHAKE_ACK_LEN:
        raise protocol_error("ack.read_failed", got=len(mv), need=HANDSHAKE_ACK_LEN)
    a = HANDSHAKE_ACK.parse(mv[:HANDSHAKE_ACK_LEN])
    if a.magic != HANDSHAKE_MAGIC_CONTROLLER_ACK:
        raise protocol_error("ack.bad_magic", got=a.magic, expected=HANDSHAKE_MAGIC_CONTROLLER_ACK)
    if a.version != version:
        raise protocol_error("ack.bad_version", got=a.version, expected=version)
    return HANDSHAKE_ACK_LEN


def encode_channel_magic(channel: str | int = "data") -> bytes:
    """Encode the 4-byte channel-select magic of ``channel`` (a name of the spec's ``Channel``
    enum — ``data``, ``control``, ``rendezvous``, ``join`` — or a raw u32).

    Raises:
        InvalidValue (local) ``channel.bad_field``: unknown channel name (names are lower
            case), or a value that is not a u32 (a float or a bool included).

    Upstream: ``flodl/src/distributed/wire.rs`` ``write_channel_magic``.
    """
    value = CHANNELS.get(channel) if isinstance(channel, str) else wire_int(channel)
    if value is None or not 0 <= value <= U32_MAX:
        raise protocol_error("channel.bad_field", field="channel", value=channel,
                             reason=f"not one of {sorted(CHANNELS)} or a u32")
    return bytes(CHANNEL_MAGIC.build({"magic": value}))


def _check_u32(field: str, value: object) -> int:
    """``value`` as a u32, or the local error naming ``field`` (the codec's integer rule)."""
    n = wire_int(value)
    if n is None or not 0 <= n <= U32_MAX:
        raise protocol_error("handshake.bad_field", field=field, value=value,
                             reason="not a u32" + (
                                 " (a Handshake: pass its fields, encode_handshake(h.rank, "
                                 "h.world_size, h.version))" if isinstance(value, Handshake)
                                 else ""))
    return n


def expect_channel_magic(data: BytesLike, expected: int | str = CHANNEL_MAGIC_DATA,
                         what: str = "cluster_controller") -> int:
    """Consume and check the channel magic at the start of ``data``; return 4.

    Args:
        expected: the magic this subsystem serves: a u32, or a channel name (``"data"``, ...).
        what: subsystem name that prefixes the error (upstream: ``cluster_controller``).

    Raises:
        TruncatedInput, BadMagic (remote). InvalidValue (local): ``data`` is not a buffer, or
        ``expected`` is no channel name and not a u32.

    Upstream: ``flodl/src/distributed/wire.rs`` ``expect_channel_magic``.
    """
    if isinstance(expected, str) and expected in CHANNELS:
        expected = CHANNELS[expected]
    else:
        n = wire_int(expected)
        if n is None or not 0 <= n <= U32_MAX:
            raise protocol_error("channel.bad_field", field="expected", value=expected,
                                 reason=f"not one of {sorted(CHANNELS)} or a u32")
        expected = n
    mv = as_view(data)
    if len(mv) < CHANNEL_MAGIC_LEN:
        raise protocol_error("channel.read_failed", what=what, got=len(mv))
    got = CHANNEL_MAGIC.parse(mv[:CHANNEL_MAGIC_LEN]).magic
    if got != expected:
        raise protocol_error("channel.bad_magic", what=what, got=got, expected=expected)
    return CHANNEL_MAGIC_LEN


def channel_of(data: BytesLike) -> tuple[int, str | None]:
    """Read the channel-select magic at the start of ``data`` without judging it.

    Returns:
        ``(magic, name)``: the little-endian u32 and its name in the spec's ``Channel`` enum
        (``data``, ``control``, ``rendezvous``, ``join``), or None for any other value.

    Raises:
        TruncatedInput (remote): fewer than 4 bytes (``channel.read_failed``).

    Upstream: the 4-byte peek of ``port_mux.rs`` (``PortMux`` routes a connection by its magic
    without consuming it).
    """
    mv = as_view(data)
    if len(mv) < CHANNEL_MAGIC_LEN:
        raise protocol_error("channel.read_failed", what="channel select", got=len(mv))
    magic = int(CHANNEL_MAGIC.parse(mv[:CHANNEL_MAGIC_LEN]).magic)
    names = {v: k for k, v in CHANNELS.items()}
    return magic, names.get(magic)


def http_stream(data: BytesLike) -> bool:
    """Whether a stream of the controller's port is HTTP rather than a flodl channel: a request
    the port mux routes to the status responder (its first 4 bytes the ``GET `` or ``POST``
    channel magic) or that responder's reply (``HTTP/``); False for fewer than 4 bytes.

    Upstream: ``port_mux.rs`` (the HTTP channels).
    """
    mv = as_view(data)
    if len(mv) < CHANNEL_MAGIC_LEN:
        return False
    magic = int(CHANNEL_MAGIC.parse(mv[:CHANNEL_MAGIC_LEN]).magic)
    return magic in (CHANNEL_MAGIC_HTTP_GET, CHANNEL_MAGIC_HTTP_POST) \
        or bytes(mv[:5]) == b"HTTP/"

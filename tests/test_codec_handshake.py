"""The rank handshake, its ack and the channel-select magic, against bytes built by hand.

Expected bytes come from ``spec/wire.yaml`` (``handshake``, ``handshake_ack``, ``channel_magic``
and the ``Channel`` enum) with :func:`struct.pack`; expected errors name the catalogue id, the
side (remote: the peer's bytes; local: the caller's arguments), the fields and the exact message
of the catalogue template, written out here as literals.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from flodl_proto import errors
from flodl_proto.codec import handshake as hs

from .codec_util import check

#: spec constants, written out (little-endian u32s on the wire)
MAGIC_RANK = 0xF10D17C0
MAGIC_ACK = 0xF10D17C1
CONTROL_HELLO_MAGIC = 0xF10D17C2
CHANNEL = {"rendezvous": 0xF10D17E0, "data": 0xF10D17E1, "control": 0xF10D17E2,
           "join": 0xF10D17E3}
CHANNEL_NAMES = "['control', 'data', 'join', 'rendezvous']"
U32_MAX = 2**32 - 1


def handshake(magic: int, version: int, rank: int, world_size: int) -> bytes:
    return struct.pack("<IIII", magic, version, rank, world_size)


# -- encode_handshake ---------------------------------------------------------------------------
def test_encode_handshake_spec_example() -> None:
    # spec/wire.yaml examples.handshake: c0 17 0d f1 | 02 | 03 | 04
    assert hs.encode_handshake(3, 4, 2) == bytes.fromhex(
        "c0170df1" "02000000" "03000000" "04000000")


@pytest.mark.parametrize(("rank", "world", "version"), [
    (0, 1, 2), (3, 4, 3), (7, 2, 2), (U32_MAX, U32_MAX, 3), (0, 0, 2), (0x01020304, 0x0A0B0C0D, 3),
])
def test_encode_handshake_fields(rank: int, world: int, version: int) -> None:
    wire = hs.encode_handshake(rank, world, version)
    assert isinstance(wire, bytes)
    assert wire == handshake(MAGIC_RANK, version, rank, world)


def test_encode_handshake_default_version_is_2() -> None:
    assert hs.encode_handshake(1, 2) == handshake(MAGIC_RANK, 2, 1, 2)


@pytest.mark.parametrize(("rank", "world", "field", "value"), [
    (-1, 4, "rank", -1),
    (U32_MAX + 1, 4, "rank", U32_MAX + 1),
    (0, -1, "world_size", -1),
    (0, U32_MAX + 1, "world_size", U32_MAX + 1),
    (-5, U32_MAX + 1, "rank", -5),  # rank is checked first
    (True, 4, "rank", True),  # was written as rank 1
    (0, True, "world_size", True),
    (2.0, 4, "rank", 2.0),  # a float or text raised construct's or Python's own error
    (0, np.float64(4.0), "world_size", np.float64(4.0)),
    ("3", 4, "rank", "3"),
])
def test_encode_handshake_rejects_non_u32(rank: int, world: int, field: str, value: int) -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        hs.encode_handshake(rank, world, 2)
    check(exc, errors.InvalidValue, False, "handshake.bad_field",
          f"handshake: {field} = {value!r} is invalid: not a u32",
          field=field, value=value, reason="not a u32")


def test_encode_handshake_takes_numpy_integers() -> None:
    assert hs.encode_handshake(np.int64(3), np.uint32(4), 2) == hs.encode_handshake(3, 4, 2)


@pytest.mark.parametrize("version", [0, 1, 4])
def test_encode_handshake_rejects_unsupported_version(version: int) -> None:
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.encode_handshake(0, 1, version)
    check(exc, errors.VersionMismatch, False, "version.unsupported",
          f"protocol version {version} is not supported (supported: [2, 3])",
          got=version, supported=[2, 3])


# -- decode_handshake ---------------------------------------------------------------------------
@pytest.mark.parametrize(("rank", "world", "version"), [
    (3, 4, 2), (0, 1, 3), (9, 4, 2), (U32_MAX, U32_MAX, 3), (0x01020304, 0x0A0B0C0D, 2),
])
def test_decode_handshake_fields(rank: int, world: int, version: int) -> None:
    data = handshake(MAGIC_RANK, version, rank, world)
    hsk, used = hs.decode_handshake(data, world, version)
    assert used == 16
    assert hsk == hs.Handshake(rank=rank, world_size=world, version=version)
    assert (hsk.rank, hsk.world_size, hsk.version) == (rank, world, version)


def test_decode_handshake_reads_only_the_first_16_bytes() -> None:
    data = bytearray(handshake(MAGIC_RANK, 3, 5, 8) + b"\xff" * 7)
    hsk, used = hs.decode_handshake(memoryview(data), 8, 3)
    assert (hsk, used) == (hs.Handshake(5, 8, 3), 16)


def test_decode_handshake_default_version_is_2() -> None:
    assert hs.decode_handshake(handshake(MAGIC_RANK, 2, 1, 2), 2) == (hs.Handshake(1, 2, 2), 16)
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.decode_handshake(handshake(MAGIC_RANK, 3, 1, 2), 2)
    check(exc, errors.VersionMismatch, True, "handshake.bad_version",
          "cluster_controller: handshake protocol_version 3 != 2", got=3, expected=2)


@pytest.mark.parametrize("n", [0, 1, 4, 15])
def test_decode_handshake_truncated(n: int) -> None:
    data = handshake(MAGIC_RANK, 2, 0, 1)[:n]
    with pytest.raises(errors.TruncatedInput) as exc:
        hs.decode_handshake(data, 1, 2)
    check(exc, errors.TruncatedInput, True, "handshake.read_failed",
          "cluster_controller: handshake read failed: failed to fill whole buffer "
          f"({n} of 16 bytes)", got=n, need=16)


@pytest.mark.parametrize("magic", [MAGIC_ACK, CONTROL_HELLO_MAGIC, 0, 0xC0170DF1])
def test_decode_handshake_bad_magic(magic: int) -> None:
    # a bad version and world size too: the magic is checked first
    with pytest.raises(errors.BadMagic) as exc:
        hs.decode_handshake(handshake(magic, 9, 0, 5), 4, 2)
    check(exc, errors.BadMagic, True, "handshake.bad_magic",
          f"cluster_controller: handshake magic 0x{magic:08x} != 0xf10d17c0",
          got=magic, expected=MAGIC_RANK)


@pytest.mark.parametrize(("got", "want"), [(3, 2), (2, 3), (1, 2), (0xFFFFFFFF, 3)])
def test_decode_handshake_bad_version(got: int, want: int) -> None:
    # the world size is wrong too: the version is checked before it
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.decode_handshake(handshake(MAGIC_RANK, got, 0, 5), 4, want)
    check(exc, errors.VersionMismatch, True, "handshake.bad_version",
          f"cluster_controller: handshake protocol_version {got} != {want}",
          got=got, expected=want)


@pytest.mark.parametrize(("got", "want"), [(5, 4), (3, 4), (0, 1), (U32_MAX, 4)])
def test_decode_handshake_world_size_mismatch(got: int, want: int) -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        hs.decode_handshake(handshake(MAGIC_RANK, 2, 0, got), want, 2)
    check(exc, errors.InvalidValue, True, "handshake.world_size_mismatch",
          f"cluster_controller: handshake world_size {got} != expected {want}",
          got=got, expected=want)


@pytest.mark.parametrize("world", [1, 4, U32_MAX, 0])
def test_decode_handshake_without_an_expected_world_size_takes_any(world: int) -> None:
    """``expected_world_size=None`` (a capture tool that does not know W) was refused as
    'not a u32'; it skips the world-size check alone and the decoded world size is the
    handshake's."""
    assert hs.decode_handshake(handshake(MAGIC_RANK, 3, 7, world), None, 3) == (
        hs.Handshake(7, world, 3), 16)


def test_decode_handshake_without_an_expected_world_size_checks_the_rest() -> None:
    with pytest.raises(errors.TruncatedInput) as trunc:
        hs.decode_handshake(handshake(MAGIC_RANK, 2, 0, 1)[:15], None)
    assert trunc.value.error_id == "handshake.read_failed"
    with pytest.raises(errors.BadMagic) as magic:
        hs.decode_handshake(handshake(MAGIC_ACK, 2, 0, 1), None)
    assert magic.value.error_id == "handshake.bad_magic"
    with pytest.raises(errors.VersionMismatch) as version:
        hs.decode_handshake(handshake(MAGIC_RANK, 3, 0, 1), None, 2)
    check(version, errors.VersionMismatch, True, "handshake.bad_version",
          "cluster_controller: handshake protocol_version 3 != 2", got=3, expected=2)


def test_decode_handshake_does_not_check_rank_against_world_size() -> None:
    assert hs.decode_handshake(handshake(MAGIC_RANK, 2, 4, 4), 4, 2) == (hs.Handshake(4, 4, 2), 16)


def test_decode_handshake_rejects_unsupported_local_version() -> None:
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.decode_handshake(handshake(MAGIC_RANK, 2, 0, 1), 1, 1)
    check(exc, errors.VersionMismatch, False, "version.unsupported",
          "protocol version 1 is not supported (supported: [2, 3])", got=1, supported=[2, 3])


# -- encode_ack / decode_ack --------------------------------------------------------------------
def test_encode_ack_spec_example() -> None:
    assert hs.encode_ack(2) == bytes.fromhex("c1170df1" "02000000")
    assert hs.encode_ack() == struct.pack("<II", MAGIC_ACK, 2)
    assert hs.encode_ack(3) == struct.pack("<II", MAGIC_ACK, 3)


def test_encode_ack_rejects_unsupported_version() -> None:
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.encode_ack(4)
    check(exc, errors.VersionMismatch, False, "version.unsupported",
          "protocol version 4 is not supported (supported: [2, 3])", got=4, supported=[2, 3])


@pytest.mark.parametrize("version", [2, 3])
def test_decode_ack(version: int) -> None:
    assert hs.decode_ack(struct.pack("<II", MAGIC_ACK, version), version) == 8
    assert hs.decode_ack(bytearray(struct.pack("<II", MAGIC_ACK, version) + b"\x00" * 9),
                         version) == 8


def test_decode_ack_default_version_is_2() -> None:
    assert hs.decode_ack(struct.pack("<II", MAGIC_ACK, 2)) == 8
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.decode_ack(struct.pack("<II", MAGIC_ACK, 3))
    check(exc, errors.VersionMismatch, True, "ack.bad_version",
          "cpu_reduce: controller protocol_version 3 != our version 2", got=3, expected=2)


@pytest.mark.parametrize("n", [0, 1, 4, 7])
def test_decode_ack_truncated(n: int) -> None:
    with pytest.raises(errors.TruncatedInput) as exc:
        hs.decode_ack(struct.pack("<II", MAGIC_ACK, 2)[:n], 2)
    check(exc, errors.TruncatedInput, True, "ack.read_failed",
          "cpu_reduce: handshake ack read failed: failed to fill whole buffer "
          f"({n} of 8 bytes) (controller may have rejected our handshake)", got=n, need=8)


@pytest.mark.parametrize("magic", [MAGIC_RANK, 0, 0xC1170DF1])
def test_decode_ack_bad_magic(magic: int) -> None:
    with pytest.raises(errors.BadMagic) as exc:
        hs.decode_ack(struct.pack("<II", magic, 7), 2)  # bad version too: magic first
    check(exc, errors.BadMagic, True, "ack.bad_magic",
          f"cpu_reduce: handshake ack magic 0x{magic:08x} != 0xf10d17c1",
          got=magic, expected=MAGIC_ACK)


@pytest.mark.parametrize(("got", "want"), [(3, 2), (2, 3), (0, 2)])
def test_decode_ack_bad_version(got: int, want: int) -> None:
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.decode_ack(struct.pack("<II", MAGIC_ACK, got), want)
    check(exc, errors.VersionMismatch, True, "ack.bad_version",
          f"cpu_reduce: controller protocol_version {got} != our version {want}",
          got=got, expected=want)


def test_decode_ack_rejects_unsupported_local_version() -> None:
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.decode_ack(struct.pack("<II", MAGIC_ACK, 2), 5)
    check(exc, errors.VersionMismatch, False, "version.unsupported",
          "protocol version 5 is not supported (supported: [2, 3])", got=5, supported=[2, 3])


# -- channel magic ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CHANNEL))
def test_encode_channel_magic_by_name(name: str) -> None:
    wire = hs.encode_channel_magic(name)
    assert isinstance(wire, bytes)
    assert wire == struct.pack("<I", CHANNEL[name])


def test_encode_channel_magic_default_is_data() -> None:
    assert hs.encode_channel_magic() == bytes.fromhex("e1170df1")


@pytest.mark.parametrize("value", [0, 1, 0x20544547, CHANNEL["join"], U32_MAX])
def test_encode_channel_magic_raw_u32(value: int) -> None:
    assert hs.encode_channel_magic(value) == struct.pack("<I", value)


@pytest.mark.parametrize("channel", ["nope", "Data", "", -1, U32_MAX + 1])
def test_encode_channel_magic_rejects(channel: str | int) -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        hs.encode_channel_magic(channel)
    reason = f"not one of {CHANNEL_NAMES} or a u32"
    check(exc, errors.InvalidValue, False, "channel.bad_field",
          f"channel magic: channel = {channel!r} is invalid: {reason}",
          field="channel", value=channel, reason=reason)


@pytest.mark.parametrize("name", sorted(CHANNEL))
def test_expect_channel_magic_accepts(name: str) -> None:
    data = struct.pack("<I", CHANNEL[name]) + b"rest"
    assert hs.expect_channel_magic(data, CHANNEL[name], "x") == 4
    assert hs.expect_channel_magic(memoryview(bytearray(data))[:4], CHANNEL[name]) == 4


def test_expect_channel_magic_default_is_data_channel() -> None:
    assert hs.expect_channel_magic(bytes.fromhex("e1170df1")) == 4
    with pytest.raises(errors.BadMagic) as exc:
        hs.expect_channel_magic(bytes.fromhex("e2170df1"))
    check(exc, errors.BadMagic, True, "channel.bad_magic",
          "cluster_controller: channel magic 0xf10d17e2 != 0xf10d17e1 "
          "(connection routed to the wrong channel?)",
          what="cluster_controller", got=CHANNEL["control"], expected=CHANNEL["data"])


@pytest.mark.parametrize(("got", "expected", "what"), [
    (CHANNEL["control"], CHANNEL["data"], "cluster_controller"),
    (CHANNEL["data"], CHANNEL["join"], "membership"),
    (0x20544547, CHANNEL["rendezvous"], "rendezvous"),
    (0, 1, "x"),
])
def test_expect_channel_magic_bad(got: int, expected: int, what: str) -> None:
    with pytest.raises(errors.BadMagic) as exc:
        hs.expect_channel_magic(struct.pack("<I", got) + b"\x00", expected, what)
    check(exc, errors.BadMagic, True, "channel.bad_magic",
          f"{what}: channel magic 0x{got:08x} != 0x{expected:08x} "
          "(connection routed to the wrong channel?)", what=what, got=got, expected=expected)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_expect_channel_magic_truncated(n: int) -> None:
    data = bytes.fromhex("e1170df1")[:n]
    with pytest.raises(errors.TruncatedInput) as exc:
        hs.expect_channel_magic(data, CHANNEL["data"], "relay")
    check(exc, errors.TruncatedInput, True, "channel.read_failed",
          f"relay: reading channel magic failed: failed to fill whole buffer ({n} of 4 bytes)",
          what="relay", got=n)
    with pytest.raises(errors.TruncatedInput) as exc:
        hs.expect_channel_magic(data)
    check(exc, errors.TruncatedInput, True, "channel.read_failed",
          "cluster_controller: reading channel magic failed: failed to fill whole buffer "
          f"({n} of 4 bytes)", what="cluster_controller", got=n)


@pytest.mark.parametrize("name", sorted(CHANNEL))
def test_channel_of_names_every_channel(name: str) -> None:
    magic, got_name = hs.channel_of(struct.pack("<I", CHANNEL[name]) + b"\x01\x02")
    assert (magic, got_name) == (CHANNEL[name], name)
    assert type(magic) is int


@pytest.mark.parametrize("value", [0x20544547, 0x54534F50, MAGIC_RANK, 0, U32_MAX])
def test_channel_of_other_values(value: int) -> None:
    assert hs.channel_of(bytearray(struct.pack("<I", value))) == (value, None)


@pytest.mark.parametrize("n", [0, 2, 3])
def test_channel_of_truncated(n: int) -> None:
    with pytest.raises(errors.TruncatedInput) as exc:
        hs.channel_of(bytes.fromhex("e1170df1")[:n])
    check(exc, errors.TruncatedInput, True, "channel.read_failed",
          "channel select: reading channel magic failed: failed to fill whole buffer "
          f"({n} of 4 bytes)", what="channel select", got=n)


@pytest.mark.parametrize(("version", "shown"), [("2", "'2'"), (b"3", "b'3'"), (2.0, "2.0"),
                                                (True, "True")])
def test_a_version_that_is_no_integer_is_shown_as_given(version: Any, shown: str) -> None:
    """``encode_handshake(0, 8, '2')`` said "protocol version 2 is not supported (supported:
    [2, 3])": the text '2' looked like the integer it is not."""
    with pytest.raises(errors.VersionMismatch) as exc:
        hs.encode_handshake(0, 8, version)
    assert str(exc.value) == f"protocol version {shown} is not supported (supported: [2, 3])"
    assert not exc.value.remote

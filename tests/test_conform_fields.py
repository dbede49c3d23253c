"""The kit names what a failing step expected: the message its builder builds and the field of
the expected bytes where the target's bytes first differ, in docs/protocol.md's names."""

from __future__ import annotations

import dataclasses

import pytest

from flodl_proto.conform import KitSettings, fields, load_catalogue
from flodl_proto.conform.builders import BUILDERS, BuildContext, build
from flodl_proto.conform.fields import (
    expected_message,
    field_at,
    field_value_pair,
    observed_message,
)
from flodl_proto.conform.inprocess import controller_target
from flodl_proto.conform.player import CaseResult, play_case
from flodl_proto.conform.report import case_line

CTX = BuildContext(bytes(16), 3, 2)
#: a Broadcast of an f32 [2] and a bf16 [2, 1] tensor: header 25, frame header 17, tensor 0 at
#: 42 (meta 14, data 8), tensor 1 at 64 (meta 18, data 4), frame tag at 86
BROADCAST = build({"broadcast": {"weight": 2, "tensors": [
    {"shape": [2], "values": [1, 3]}, {"dtype": "bf16", "shape": [2, 1], "values": [1, 2]}]}},
    CTX, "test")


@pytest.mark.parametrize("offset,name", [
    (0, "magic"), (7, "version"), (8, "kind"), (9, "rank"), (16, "payload_len"),
    (17, "auth_tag"), (24, "auth_tag"), (25, "payload.magic"), (29, "payload.num_tensors"),
    (33, "payload.kind"), (34, "payload.weight"), (41, "payload.weight"),
    (42, "payload.tensor[0].dtype"), (43, "payload.tensor[0].ndim"),
    (44, "payload.tensor[0].dim[0]"), (48, "payload.tensor[0].nbytes"),
    (56, "payload.tensor[0].data, element 0"), (63, "payload.tensor[0].data, element 1"),
    (64, "payload.tensor[1].dtype"), (70, "payload.tensor[1].dim[1]"),
    (74, "payload.tensor[1].nbytes"), (82, "payload.tensor[1].data, element 0"),
    (85, "payload.tensor[1].data, element 1"), (86, "payload.auth_tag"),
    (93, "payload.auth_tag"), (94, None), (-1, None)])
def test_field_at_names_a_broadcasts_fields(offset: int, name: str | None) -> None:
    assert len(BROADCAST) == 94
    assert field_at(BROADCAST, offset) == name


def test_field_at_names_the_other_messages_fields() -> None:
    framed = build({"framed": {"weight": 1, "tensors": [{"shape": [1], "values": [1]}]}}, CTX,
                   "test")
    assert [field_at(framed, o) for o in (0, 4, 12, 21, 31, 35, 42, len(framed))] == [
        "length", "body.magic", "body.kind", "body.tensor[0].dtype", "body.tensor[0].nbytes",
        "body.tensor[0].data, element 0", "body.auth_tag", None]
    frame = build({"frame": {"weight": 1, "tensors": [{"dtype": 7, "hex": "0102"}]}}, CTX, "t")
    # no shape: the tensor's meta is dtype, ndim 0 and nbytes (10 bytes from 17)
    assert field_at(frame, 27) == "tensor[0].data"  # an unknown dtype has no element size
    hs = build({"handshake": {"rank": 1}}, CTX, "test")
    assert [field_at(hs, o) for o in (0, 4, 8, 12)] == ["magic", "version", "rank", "world_size"]
    ack = build({"ack": {}}, CTX, "test")
    assert [field_at(ack, o) for o in (0, 4)] == ["magic", "version"]
    hello_ack = build({"hello_ack": {}}, CTX, "test")
    assert [field_at(hello_ack, o) for o in (13, 25)] == ["payload_len", "payload"]
    assert field_at(bytes.fromhex("deadbeef"), 0) is None
    assert field_at(b"", 0) is None


def test_expected_message_names_every_builder_but_raw_bytes() -> None:
    assert expected_message({"conn": 0, "broadcast": {}}) == "a Broadcast record"
    assert expected_message({"conn": 0, "hello_ack": {}}) == "a Control(HelloAck) record"
    assert expected_message({"conn": 0, "hex": "00"}) is None
    assert all(expected_message({b: {}}) for b in BUILDERS if b != "hex")
    used = {k for c in load_catalogue() for steps in c.steps.values() for s in steps
            if "expect" in s for k in s["expect"] if k in BUILDERS}
    assert used and all(expected_message({k: {}}) for k in used - {"hex"})


def test_a_failure_line_names_the_field_of_a_plain_offset() -> None:
    case = next(c for c in load_catalogue() if c.id == "controller.round.two-rounds")
    r = CaseResult(case, 3, step=5, message="connection 0: expected a Broadcast record (94 "
                   "bytes), observed 94", expected="..", observed="..", offset=13,
                   differing_field="payload_len")
    assert "     first differing byte offset: 13 (payload_len)" in case_line(r, "15.3")
    r.differing_field = ""
    assert "     first differing byte offset: 13" in case_line(r, "15.3")


def test_observed_message_names_a_records_kind_and_control_variant() -> None:
    assert observed_message(BROADCAST) == "a Broadcast record"
    assert observed_message(build({"hello_ack": {}}, CTX, "t")) == "a Control(HelloAck) record"
    assert observed_message(build({"declare_dead": {"rank": 1}}, CTX, "t")) \
        == "a Control(DeclareDead) record"
    host_frame = build({"host_frame": {"weight": 1, "tensors": []}}, CTX, "t")
    assert observed_message(host_frame[:9]) == "a HostFrame record"  # the kind is enough
    assert observed_message(host_frame[:8]) is None
    assert observed_message(bytes.fromhex("d0170df1ffffffffff")) is None  # no such kind
    assert observed_message(build({"handshake": {"rank": 0}}, CTX, "t")) is None


@pytest.mark.timeout(60)
def test_an_expected_close_names_the_record_the_target_sent_instead() -> None:
    """A controller that answers a round it should have failed: the line says it sent a
    Broadcast, not only a byte count."""
    case = next(c for c in load_catalogue() if c.id == "controller.round.two-rounds")
    steps = list(case.steps[3])
    assert "broadcast" in steps[5]["expect"]
    steps[5] = {"expect_close": {"conn": 0}}
    bad = dataclasses.replace(case, steps={3: tuple(steps)})
    r = play_case(bad, 3, controller_target(), KitSettings(timeout_scale=0.1))
    assert not r.passed and r.step == 5
    n = int(r.observed.rsplit("(", 1)[1].removesuffix(" B)"))
    assert r.message == ("connection 0: expected a close with at most 0 bytes before it, "
                         f"observed {n} bytes so far (starting with a Broadcast record), "
                         "still open")


def test_field_value_pair_reads_the_differing_field_as_its_wire_type() -> None:
    """A failure line gives the two values of the field that differs, not only its bytes (the
    player words them ``expected 258.0, observed 256.0``)."""
    def hf(weight: float, dtype: str, values: list[float]) -> bytes:
        return build({"host_frame": {"weight": weight, "tensors": [
            {"dtype": dtype, "shape": [2], "values": values}]}}, CTX, "t")

    want, got = hf(3, "bf16", [258, -258]), hf(3, "bf16", [256, -256])
    assert (field_at(want, 56), field_value_pair(want, got, 56)) == (
        "payload.tensor[0].data, element 0", ("258.0", "256.0"))
    want, got = hf(-0.0, "f32", [1, 2]), hf(0.0, "f32", [1, 2])
    assert (field_at(want, 41), field_value_pair(want, got, 41)) == (
        "payload.weight", ("-0.0", "0.0"))
    other = bytes.fromhex("d1170df1") + want[4:]
    assert field_value_pair(want, other, 0) == ("0xf10d17d0", "0xf10d17d1")
    assert field_value_pair(want, got, 17) is None  # a tag has no value but its bytes
    assert field_value_pair(want, got[:40], 41) is None  # the observed bytes end inside the field
    hs = build({"handshake": {"rank": 0}}, CTX, "t")
    assert field_value_pair(hs, build({"handshake": {"rank": 0, "world_size": 3}}, CTX, "t"),
                            12) == ("2", "3")


def test_the_module_exports_what_the_kit_uses() -> None:
    """``field_values`` (the pair worded ``expected X, observed Y``) was exported though
    nothing called it: the player words the pair ``field_value_pair`` gives itself."""
    assert fields.__all__ == ["expected_message", "field_at", "field_value_pair",
                              "observed_message"]

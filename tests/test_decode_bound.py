"""``decode`` with the world size given applies the control bound (spec departure
``control_bound``) as the controller and the relay do, from a Control record's header: a record
past it is the decode's error, with the reader's error id and message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flodl_proto.cli import main
from flodl_proto.codec import Hello as HelloMsg
from flodl_proto.codec import (
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    encode_channel_magic,
    encode_control,
    encode_handshake,
    encode_mux_record_bytes,
    encode_mux_record_parts,
)
from flodl_proto.codec.mux import max_control_payload, max_hello_payload
from flodl_proto.codec.stream import MuxStream, StreamFailed
from flodl_proto.decode import EXIT_ERROR, EXIT_OK, decode_stream
from flodl_proto.errors import LocalProtocolError

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
#: the longest legal Control payload for one rank
LIMIT_1 = max_control_payload(1)
#: the longest legal first record's payload (a Hello) for one rank
HELLO_LIMIT_1 = max_hello_payload(1)


def _control(payload: bytes) -> bytes:
    return b"".join(encode_mux_record_parts(RecordKind.CONTROL, 0, [payload], SALT))


#: a RankExit padded past the bound for one rank (bytes after a message are ignored)
LONG_EXIT = _control(encode_control(RankExit(0)) + bytes(LIMIT_1))
HELLO = encode_mux_record_bytes(MuxRecord.control_msg(HelloMsg("h", [0]), 2), SALT)
UP = encode_channel_magic("data") + HELLO
CTL_MSG = ("cluster_controller: a Control record after the Hello claims payload_len "
           f"{LIMIT_1 + 2} (> {LIMIT_1} bytes, the longest legal control message for the world "
           "size); corrupt or hostile peer")
HELLO_MSG = ("cluster_controller: first record claims payload_len 325 (> 324 bytes, the largest "
             "legal Hello for the world size; kind=0x02); corrupt or hostile peer")
RELAY_MSG = ("relay: a Control record from the controller claims payload_len "
             f"{LIMIT_1 + 2} (> {LIMIT_1} bytes, the longest legal control message for the world "
             "size); corrupt or hostile peer")


def test_a_control_record_past_the_bound_is_the_controller_s_error() -> None:
    """decode bound a Control record by the ceiling only; with the world size the relay ->
    controller direction's records after the Hello are bound as the controller bounds them."""
    assert LIMIT_1 == 324
    rep = decode_stream(UP + LONG_EXIT, "mux", salt=SALT)
    assert rep.exit_code == EXIT_OK and rep.records[2]["trailing_bytes"] == LIMIT_1
    rep = decode_stream(UP + LONG_EXIT, "mux", salt=SALT, world_size=1)
    assert rep.exit_code == EXIT_ERROR and [r["type"] for r in rep.records] == [
        "channel_magic", "mux_record"]
    assert rep.final_record() == {"type": "error", "offset": len(UP), "error_kind": "limit",
                                  "error_id": "controller.control_too_long", "error": CTL_MSG}
    assert rep.bad_tags == 0  # no payload read: no tag step
    # one rank more: within the bound
    assert decode_stream(UP + LONG_EXIT, "mux", world_size=2).exit_code == EXIT_OK
    # the payload cut short: the header decides, before the payload is read
    rep = decode_stream(UP + LONG_EXIT[:-10], "mux", world_size=1)
    assert rep.failure is not None and not rep.failure.capture_ended
    assert rep.failure.error_id == "controller.control_too_long"
    assert decode_stream(UP + LONG_EXIT[:-10], "mux").failure.capture_ended  # type: ignore[union-attr]


def test_the_relay_s_first_record_is_bound_by_the_hello_bound_as_the_controller_s() -> None:
    """The relay -> controller direction's first record is bound as the controller bounds it
    (departure ``hello_bound``, ``controller.hello_too_long``, whatever its kind), where decode
    passed a first record the controller refuses (a Hello padded one byte past the bound
    decoded with exit 0)."""
    hello = encode_control(HelloMsg("h", [0]))
    pad = HELLO_LIMIT_1 - len(hello)  # a Hello of exactly the bound: read
    rep = decode_stream(encode_channel_magic("data") + _control(hello + bytes(pad)), "mux",
                        world_size=1)
    assert rep.exit_code == EXIT_OK and rep.records[1]["trailing_bytes"] == pad
    up = encode_channel_magic("data") + _control(hello + bytes(pad + 1))
    assert decode_stream(up, "mux").exit_code == EXIT_OK  # no world size: the ceiling only
    want = {"type": "error", "offset": 4, "error_kind": "limit",
            "error_id": "controller.hello_too_long", "error": HELLO_MSG}
    assert decode_stream(up, "mux", world_size=1).final_record() == want
    # the controller's reader refuses it with the same line
    events = MuxStream(None, expect_magic="data", hello_limit=HELLO_LIMIT_1).feed(up)
    assert isinstance(events[-1], StreamFailed) and str(events[-1].error) == HELLO_MSG
    # cut short inside its payload: the header decides, as the controller's reader does
    assert decode_stream(up[:-10], "mux", world_size=1).final_record() == want
    # the controller -> relay direction has no first-record bound but the control bound
    rep = decode_stream(_control(hello + bytes(pad + 1)), "mux", world_size=1)
    assert rep.final_record()["error_id"] == "relay.control_too_long"  # type: ignore[index]


def test_every_control_record_of_the_controller_is_the_relay_s_to_bound() -> None:
    """The controller -> relay direction (no channel magic): every Control record, the first
    included, as the relay's reader bounds them."""
    ack = encode_mux_record_bytes(MuxRecord.control_msg(HelloAck(), 2), SALT)
    for data, at in ((LONG_EXIT, 0), (ack + LONG_EXIT, len(ack))):
        rep = decode_stream(data, "mux", world_size=1)
        assert rep.final_record() == {"type": "error", "offset": at, "error_kind": "limit",
                                      "error_id": "relay.control_too_long",
                                      "error": RELAY_MSG}


def test_a_rank_handshake_of_another_world_size_is_the_relay_s_error() -> None:
    """On the loopback leg the world size given checks a rank's handshake as the relay's
    accept does; it was ignored there (every handshake world size was read)."""
    hs = encode_handshake(1, 4, 3)
    rep = decode_stream(hs, "loopback", world_size=2)
    assert rep.final_record() == {
        "type": "error", "offset": 0, "error_kind": "value",
        "error_id": "handshake.world_size_mismatch",
        "error": "cluster_controller: handshake world_size 4 != expected 2"}
    for given in (4, None):  # the world size it carries, or none given: read as it is
        rep = decode_stream(hs, "loopback", world_size=given)
        assert rep.records[0] == {"offset": 0, "length": 16, "type": "handshake", "rank": 1,
                                  "world_size": 4, "version": 3}
        assert rep.final_record() == {"type": "end", "offset": 16, "records": 1}


def test_a_world_size_that_is_no_count_of_ranks_is_refused() -> None:
    with pytest.raises(LocalProtocolError) as ei:
        decode_stream(UP, "mux", world_size=0)
    assert ei.value.error_id == "controller.world_size_zero"


def test_cli_world_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "up.bin"
    path.write_bytes(UP + LONG_EXIT)
    assert main(["decode", str(path), "--world-size", "1"]) == EXIT_ERROR
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert lines[-1] == {"type": "error", "offset": len(UP), "error_kind": "limit",
                         "error_id": "controller.control_too_long", "error": CTL_MSG}
    assert main(["decode", str(path), "--world-size", "1", "--format", "table"]) == EXIT_ERROR
    assert capsys.readouterr().out.splitlines()[-1].endswith(CTL_MSG)
    assert main(["decode", str(path)]) == EXIT_OK
    capsys.readouterr()
    assert main(["decode", str(path), "--world-size", "0"]) == 2
    assert capsys.readouterr().err == ("flodl-proto decode: error: argument --world-size: must "
                                       "be in 1..4294967295 (the handshake's u32 field), got 0\n")

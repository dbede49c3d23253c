"""The sans-IO controller core: upstream's rules driven with bytes and a fake clock, and a
Hypothesis state machine checking the core against a simple model."""

from __future__ import annotations

import tracemalloc
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from flodl_proto.codec.handshake import encode_channel_magic
from flodl_proto.codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    decode_mux_record_or_eos,
    encode_frame_record,
    encode_mux_record_bytes,
    max_control_payload,
    max_hello_payload,
)
from flodl_proto.codec.round_frame import RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec.stream import (
    MuxStream,
    RecordReceived,
    StreamEnded,
    StreamFailed,
)
from flodl_proto.codec.structs import MUX_HEADER
from flodl_proto.errors import (
    AuthenticationError,
    InvalidValue,
    LimitExceeded,
    LocalProtocolError,
    ProtocolError,
    TruncatedInput,
)
from flodl_proto.fsm.controller_core import (
    HANDSHAKE_TIMEOUT,
    REDUCE_POLL,
    ControllerCore,
)
from flodl_proto.fsm.events import (
    Action,
    CheckpointWindow,
    CloseConnection,
    Finished,
    RelayJoined,
    RoundScattered,
    SendKind,
    SendTo,
    StopAccepting,
)
from flodl_proto.membership import DeadRanks
from flodl_proto.reduce import OuterStepper, SlowMomentum
from flodl_proto.spec import (
    DEFAULT_FRAME_CEILING,
    MAX_HELLO_HOST_LEN,
    MUX_PROTOCOL_VERSION,
    MUX_RECORD_MAGIC,
)

from .reference import ref_reduce

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")


# -- helpers ---------------------------------------------------------------------------------------
def f32(*vals: float, weight: float = 1.0, kind: RoundKind = RoundKind.MODEL) -> RoundFrame:
    return RoundFrame(kind, weight, [TensorPayload.from_array(np.asarray(vals, np.float32))])


def hello_bytes(ranks: Sequence[int], version: int = 2, host: str = "h") -> bytes:
    return encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(Hello(host, list(ranks)), version), SALT)


def control_bytes(msg: Any, version: int = 2) -> bytes:
    return encode_mux_record_bytes(MuxRecord.control_msg(msg, version), SALT)


def host_frame_bytes(f: RoundFrame, salt: bytes = SALT) -> bytes:
    parts = encode_frame_record(RecordKind.HOST_FRAME, f, SALT)
    if salt != SALT:
        inner = b"".join(bytes(memoryview(p)) for p in
                         encode_frame_record(RecordKind.HOST_FRAME, f, salt)[1:])
        return encode_mux_record_bytes(MuxRecord.host_frame(inner), SALT)
    return b"".join(bytes(memoryview(p)) for p in parts)


def sent(actions: Sequence[Action], kind: SendKind | None = None) -> list[SendTo]:
    return [a for a in actions if isinstance(a, SendTo) and (kind is None or a.kind is kind)]


def record(send: SendTo, version: int = 2) -> MuxRecord:
    data = b"".join(bytes(memoryview(b)) for b in send.buffers)
    assert len(data) == send.nbytes
    res = decode_mux_record_or_eos(data, SALT, version=version)
    assert isinstance(res, tuple)
    rec, n = res
    assert n == len(data)
    return rec


def finished(actions: Sequence[Action]) -> Finished | None:
    out = [a for a in actions if isinstance(a, Finished)]
    assert len(out) <= 1
    return out[0] if out else None


def closed(actions: Sequence[Action]) -> set[int]:
    return {a.conn for a in actions if isinstance(a, CloseConnection)}


def join(core: ControllerCore, conn: int, ranks: Sequence[int], now: float = 0.0) -> list[Action]:
    acts = core.connection_opened(conn, now)
    return acts + core.receive_data(conn, hello_bytes(ranks, core.version))


def started(ws: int, **kw: Any) -> ControllerCore:
    core = ControllerCore(ws, SALT, **kw)
    assert core.start() == []
    return core


# -- accept phase ----------------------------------------------------------------------------------
def test_byte_by_byte_handshake_then_round() -> None:
    core = started(2)
    assert core.connection_opened(7, 0.0) == []
    data = hello_bytes([0, 1])
    for byte in data[:-1]:
        assert core.receive_data(7, bytes([byte])) == []
    acts = core.receive_data(7, data[-1:])
    acks = sent(acts, SendKind.HELLO_ACK)
    assert len(acks) == 1 and isinstance(record(acks[0]).control, HelloAck)
    assert RelayJoined(7, 0, "h", (0, 1)) in acts
    assert any(isinstance(a, StopAccepting) for a in acts)
    assert core.state == "reducing"
    hf = host_frame_bytes(f32(2.0, 4.0, weight=2.0))
    out: list[Action] = []
    for i in range(0, len(hf), 5):
        out += core.receive_data(7, hf[i:i + 5])
    [b] = sent(out, SendKind.BROADCAST)
    assert b.round == 1
    assert record(b).frame(SALT) == ref_reduce([f32(2.0, 4.0, weight=2.0)])
    [notice] = [a for a in out if isinstance(a, RoundScattered)]
    assert (notice.round, notice.kind, notice.weight, notice.relays) == (1, "model", 2.0, 1)
    assert core.rounds == 1 and core.bytes_in == len(data) + len(hf)


def test_hello_and_first_frame_in_one_chunk() -> None:
    core = started(1)
    core.connection_opened(0, 0.0)
    acts = core.receive_data(0, hello_bytes([0]) + host_frame_bytes(f32(1.0)))
    assert [s.kind for s in sent(acts)] == [SendKind.HELLO_ACK, SendKind.BROADCAST]


@pytest.mark.parametrize("payload,what", [(b"", "channel magic"), (b"\xe1\x17", "channel magic"),
                                          (encode_channel_magic("data"), "Hello")])
def test_handshake_deadline(payload: bytes, what: str) -> None:
    core = started(2)
    join(core, 0, [0])
    core.connection_opened(1, 1.0)
    core.receive_data(1, payload)
    assert core.tick(1.0 + HANDSHAKE_TIMEOUT - 0.01) == []
    acts = core.tick(1.0 + HANDSHAKE_TIMEOUT)
    fin = finished(acts)
    assert fin is not None and not fin.outcome.clean
    assert str(fin.outcome.error) == (f"cluster_controller: relay on connection 1 sent no "
                                      f"complete {what} within 10s")
    assert closed(acts) == {0, 1}  # departure: every connection is closed


def test_connection_after_coverage_is_closed() -> None:
    core = started(1)
    core.connection_opened(5, 0.0)  # still in its handshake when coverage completes
    acts = join(core, 0, [0])
    assert closed(acts) == {5}
    assert closed(core.connection_opened(9, 1.0)) == {9}
    assert core.receive_data(9, hello_bytes([0])) == []


@pytest.mark.parametrize("ranks,error", [
    ([0, 2], "cluster_controller: relay announced rank 2 >= world_size 2"),
    ([1, 1], "cluster_controller: rank 1 announced by two relays"),
])
def test_bad_hello_fails(ranks: list[int], error: str) -> None:
    core = started(2)
    fin = finished(join(core, 0, ranks))
    assert fin is not None and str(fin.outcome.error) == error
    assert isinstance(fin.outcome.error, InvalidValue)


def test_v2_core_accepts_a_v3_hello_with_model_sigs() -> None:
    core = started(1, version=2)
    core.connection_opened(0, 0.0)
    v3 = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0], [b"\x01" * 32]), 3), SALT)
    acts = core.receive_data(0, encode_channel_magic("data") + v3)
    assert len(sent(acts, SendKind.HELLO_ACK)) == 1


def test_v3_core_rejects_a_v2_hello() -> None:
    core = started(1, version=3)
    fin = finished(core.connection_opened(0, 0.0)
                   + core.receive_data(0, hello_bytes([0], version=2)))
    assert fin is not None
    assert str(fin.outcome.error).startswith("relay_mux: bincode decode failed")


def test_oversized_record_rejected_at_its_header() -> None:
    core = ControllerCore(1, SALT, ceiling=1024)
    core.start()
    join(core, 0, [0])
    big = host_frame_bytes(f32(*([0.0] * 300)))
    acts = core.receive_data(0, big[:25])  # only the header: rejected before any payload
    fin = finished(acts)
    assert fin is not None and isinstance(fin.outcome.error, LimitExceeded)


def test_eof_inside_header_is_clean_and_inside_payload_is_truncation() -> None:
    core = started(1)
    join(core, 0, [0])
    hf = host_frame_bytes(f32(1.0))
    core.receive_data(0, hf[:20])
    fin = finished(core.connection_closed(0))
    assert fin is not None and fin.outcome.clean and fin.outcome.reason == "relay_eof"
    core = started(1)
    join(core, 0, [0])
    core.receive_data(0, hf[:40])
    fin = finished(core.connection_closed(0))
    assert fin is not None and isinstance(fin.outcome.error, TruncatedInput)
    assert str(fin.outcome.error).startswith("relay_mux: peer closed mid-frame")


def test_relay_ends_during_accept_are_held_until_coverage() -> None:
    core = started(2)
    join(core, 0, [0])
    assert core.connection_closed(0) == []  # an alive relay left: held, the accept phase goes on
    acts = join(core, 1, [1])
    assert [s.kind for s in sent(acts)] == [SendKind.HELLO_ACK]  # the next relay is still acked
    fin = finished(acts)
    assert fin is not None and fin.outcome.clean and fin.outcome.reason == "relay_eof"
    assert closed(acts) == {0, 1}


def test_reader_error_during_accept_is_held_and_a_clean_request_wins() -> None:
    core = started(3)
    join(core, 0, [0])
    data = encode_mux_record_bytes(MuxRecord.data(0, b"x"), SALT)
    assert core.receive_data(0, data + control_bytes(RankExit(0))) == []  # reader exited
    fin = finished(join(core, 1, [1, 2]))
    assert fin is not None and "per-rank Data record" in str(fin.outcome.error)
    core = started(3)
    join(core, 0, [0])
    join(core, 1, [1])
    core.receive_data(0, data)
    core.receive_data(1, control_bytes(RankExit(1)))
    fin = finished(join(core, 2, [2]))
    assert fin is not None and fin.outcome.clean and fin.outcome.reason == "rank_exit"


# -- per-relay rules -------------------------------------------------------------------------------
def test_second_hostframe_overwrites_the_first() -> None:
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    core.receive_data(0, host_frame_bytes(f32(100.0)))
    core.receive_data(0, host_frame_bytes(f32(2.0)))
    acts = core.receive_data(1, host_frame_bytes(f32(4.0)))
    b = sent(acts, SendKind.BROADCAST)
    assert len(b) == 2 and b[0].buffers is b[1].buffers  # one serialization for all relays
    assert record(b[0]).frame(SALT) == ref_reduce([f32(2.0), f32(4.0)])


def test_rank_exit_rules() -> None:
    core = started(3)
    join(core, 0, [0, 1])
    join(core, 1, [2])
    core.declare_dead(1)
    assert finished(core.receive_data(0, control_bytes(RankExit(1)))) is None  # dead: ignored
    fin = finished(core.receive_data(0, control_bytes(RankExit(2))))  # not its rank
    assert fin is not None and isinstance(fin.outcome.error, InvalidValue)
    assert str(fin.outcome.error) == ("cluster_controller: relay on connection 0 (ranks [0, 1]) "
                                      "sent RankExit for rank 2, which it does not carry")
    core = started(2)
    join(core, 0, [0, 1])
    fin = finished(core.receive_data(0, control_bytes(RankExit(0))))
    assert fin is not None and fin.outcome.clean and fin.outcome.reason == "rank_exit"


def test_ignored_records_and_dead_relays() -> None:
    core = started(3)
    join(core, 0, [0])
    join(core, 1, [1, 2])
    bc = encode_mux_record_bytes(MuxRecord.broadcast(b"\x00"), SALT)
    assert core.receive_data(0, bc) == []  # a Broadcast from a relay is dropped
    assert core.receive_data(0, control_bytes(Hello("again", [0]))) == []
    assert core.receive_data(0, control_bytes(HelloAck())) == []
    assert core.receive_data(0, control_bytes(DeclareDead(0))) == []
    acts = core.declare_dead(0)
    [dd] = sent(acts, SendKind.DECLARE_DEAD)
    assert dd.conn == 0 and record(dd).control == DeclareDead(0)
    assert sent(core.declare_dead(0)) == []  # forwarded once
    # a fully-dead relay: HostFrames dropped unparsed, EOF ignored
    assert core.receive_data(0, host_frame_bytes(f32(1.0), salt=bytes(16))) == []
    assert closed(core.connection_closed(0)) == {0}
    assert not core.finished
    acts = core.receive_data(1, host_frame_bytes(f32(6.0, weight=2.0)))
    [b] = sent(acts, SendKind.BROADCAST)
    want = ref_reduce([None, f32(6.0, weight=2.0)])
    assert b.conn == 1 and record(b).frame(SALT) == want


def test_alive_relay_errors_fail_the_run() -> None:
    core = started(1)
    join(core, 0, [0])
    fin = finished(core.receive_data(0, host_frame_bytes(f32(1.0), salt=bytes(16))))
    assert fin is not None and isinstance(fin.outcome.error, AuthenticationError)
    core = started(1)
    join(core, 0, [0])
    fin = finished(core.receive_data(0, encode_mux_record_bytes(MuxRecord.data(3, b"x"), SALT)))
    assert fin is not None and "per-rank Data record (rank 3)" in str(fin.outcome.error)
    core = started(1)
    join(core, 0, [0])
    err = TruncatedInput("starved")
    fin = finished(core.connection_closed(0, err))
    assert fin is not None and fin.outcome.error is err


def test_dead_relay_read_error_is_ignored() -> None:
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    core.declare_dead(0)
    acts = core.receive_data(0, b"\x00" * 25)  # a bad record header
    assert finished(acts) is None and closed(acts) == {0}


def test_every_rank_dead_ends_cleanly() -> None:
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    core.declare_dead(0)
    fin = finished(core.declare_dead(1))
    assert fin is not None and fin.outcome.clean and fin.outcome.reason == "all_dead"


def test_deaths_during_accept_are_forwarded_once_reducing() -> None:
    core = started(2)
    join(core, 0, [0])
    assert sent(core.declare_dead(0)) == []  # still accepting: nothing forwarded yet
    acts = join(core, 1, [1])
    assert [s.kind for s in sent(acts)] == [SendKind.HELLO_ACK, SendKind.DECLARE_DEAD]
    assert sent(acts)[1].conn == 0


def test_write_failures() -> None:
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    acts = core.receive_data(1, host_frame_bytes(f32(3.0)))
    assert len(sent(acts, SendKind.BROADCAST)) == 2
    acts = core.write_failed(0, SendKind.BROADCAST, "stalled")
    assert closed(acts) == {0} and core.dead_ranks.is_dead(0) and not core.finished
    acts = core.receive_data(1, host_frame_bytes(f32(5.0)))
    [b] = sent(acts, SendKind.BROADCAST)
    assert b.conn == 1 and record(b).frame(SALT) == f32(5.0)
    assert core.write_failed(1, SendKind.DECLARE_DEAD) == []  # only logged
    fin = finished(core.write_failed(1, SendKind.BROADCAST))
    assert fin is not None and fin.outcome.reason == "all_dead"
    core = started(2)
    join(core, 0, [0])
    fin = finished(core.write_failed(0, SendKind.HELLO_ACK, "reset"))
    assert fin is not None and str(fin.outcome.error) == (
        "cluster_controller: HelloAck write to relay on connection 0 failed: reset")


def test_a_failed_broadcast_is_warned_about_once_per_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    # the records queued behind the one that stalled fail too; each is reported to the core
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    for v in (1.0, 2.0, 3.0):
        core.receive_data(0, host_frame_bytes(f32(v)))
        core.receive_data(1, host_frame_bytes(f32(v)))
    with caplog.at_level("DEBUG", logger="flodl_proto"):
        for _ in range(3):
            core.write_failed(0, SendKind.BROADCAST, "write stalled")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records
             if "consensus broadcast" in r.getMessage()]
    text = ("controller: consensus broadcast to relay h (ranks 0) failed (write stalled); "
            "declaring its ranks dead and continuing with survivors")
    assert lines == [("WARNING", text), ("DEBUG", text), ("DEBUG", text)]
    assert core.dead_ranks.is_dead(0) and not core.finished


@pytest.mark.parametrize(("host", "shown"), [
    ("h0\ncontroller finished: clean (stop: signal)\x1b[31m",
     "relay 'h0\\ncontroller finished: clean (stop: signal)\\x1b[31m' (ranks 0,1)"),
    ("h\x00", "relay 'h\\x00' (ranks 0,1)"),
    ("hôte 1", "relay hôte 1 (ranks 0,1)"),
    (" \n", "relay #0 (ranks 0,1)"),
    # printable, yet not shown as themselves: a mark that shows nothing, a variation selector,
    # a filler, a non-ASCII space (h0 would read as another relay's name)
    ("h\u034f0", "relay 'h\\u034f0' (ranks 0,1)"),
    ("h0\ufe0f", "relay 'h0\\ufe0f' (ranks 0,1)"),
    ("h\u31640", "relay 'h\\u31640' (ranks 0,1)"),
    ("h\u00a00", "relay 'h\\xa00' (ranks 0,1)"),
])
def test_a_host_name_from_the_peer_cannot_break_or_colour_a_line(host: str, shown: str) -> None:
    core = started(2)
    core.connection_opened(0, 0.0)
    core.receive_data(0, hello_bytes([0, 1], host=host))
    fin = finished(core.receive_data(0, control_bytes(RankExit(0))))
    assert fin is not None and fin.outcome.clean
    assert f"rank 0 of {shown} exited" in fin.outcome.detail
    assert "\n" not in fin.outcome.detail and "\x1b" not in fin.outcome.detail


@pytest.mark.parametrize("ceiling", [180, 181])
def test_a_broadcast_over_the_frame_ceiling_is_sent_to_no_relay_and_fails_the_run(
        ceiling: int) -> None:
    """Version 3: relay h0 carries tensor 0 and elides tensor 1, relay h1 the reverse; each
    HostFrame payload is 25 + (14 + 64) + 14 = 117 bytes, within the ceiling, while the
    consensus carries both tensors in full: 25 + 2 x (14 + 64) = 181 bytes. At the controller's
    own ceiling (not the codec's 1 GiB default) a record one byte over it is written to no relay
    and the run fails with a remote LimitExceeded naming the round, the length and the ceiling
    (departure ``broadcast_over_ceiling``); at exactly 181 it is sent."""
    full = TensorPayload.from_array(np.arange(16, dtype=np.float32))
    core = started(2, version=3, ceiling=ceiling)
    acts = join(core, 0, [0]) + join(core, 1, [1])
    assert len(sent(acts, SendKind.HELLO_ACK)) == 2
    frames = [RoundFrame(RoundKind.MODEL, 1.0, [full, TensorPayload.elide(0, (16,))]),
              RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.elide(0, (16,)), full])]
    assert [f.wire_len for f in frames] == [117, 117]
    assert core.receive_data(0, host_frame_bytes(frames[0])) == []
    acts = core.receive_data(1, host_frame_bytes(frames[1]))
    if ceiling == 181:
        b = sent(acts, SendKind.BROADCAST)
        assert [s.nbytes for s in b] == [25 + 181] * 2 and not core.finished
        consensus = record(b[0], 3).frame(SALT)
        assert consensus.wire_len == 181 and not any(t.elided for t in consensus.tensors)
        return
    assert sent(acts) == []
    fin = finished(acts)
    assert fin is not None and fin.outcome.reason != "all_dead" and core.finished
    err = fin.outcome.error
    assert isinstance(err, LimitExceeded) and not isinstance(err, LocalProtocolError)
    assert err.error_id == "controller.broadcast_too_large"
    assert dict(err.fields) == {"round": 1, "length": 181, "ceiling": 180}
    assert str(err).startswith("cluster_controller: round 1's consensus Broadcast record of 181 "
                               "bytes exceeds the frame ceiling 180; ")
    assert isinstance(err.__cause__, LocalProtocolError)
    assert err.__cause__.error_id == "mux.payload_too_large_local"
    assert fin.outcome.detail.startswith("reducing round 1 of relay h (ranks 0), relay h (ranks 1)")
    assert closed(acts) == {0, 1} and core.rounds == 0


def test_stop_and_inputs_after_finish() -> None:
    core = started(1)
    fin = finished(core.stop())
    assert fin is not None and fin.outcome.clean and core.state == "shutdown"
    assert core.stop() == [] and core.tick(99.0) == [] and core.declare_dead(0) == []
    assert closed(core.connection_opened(3, 0.0)) == {3}
    idle = ControllerCore(1, SALT)
    assert finished(idle.stop()) is not None
    with pytest.raises(LocalProtocolError):
        idle.start()


def test_local_misuse() -> None:
    with pytest.raises(InvalidValue, match="world_size must be > 0"):
        ControllerCore(0, SALT)
    with pytest.raises(LocalProtocolError) as ei:  # a negative world size named with its value
        ControllerCore(-1, SALT)
    assert ei.value.error_id == "controller.bad_argument"
    assert str(ei.value) == ("cluster_controller: world_size = -1 is invalid: not a whole number "
                             "in 1..4294967295 (ranks are u32)")
    with pytest.raises(InvalidValue, match=r"dead_ranks world_size \(3\) must match"):
        ControllerCore(2, SALT, dead_ranks=DeadRanks(3))
    core = ControllerCore(1, SALT)
    with pytest.raises(LocalProtocolError, match="not allowed in state Idle"):
        core.connection_opened(0, 0.0)
    core.start()
    with pytest.raises(LocalProtocolError, match="connection 4 is not open"):
        core.receive_data(4, b"x")
    core.connection_opened(0, 0.0)
    with pytest.raises(LocalProtocolError, match="already open"):
        core.connection_opened(0, 0.0)


def test_outer_optimizer_and_checkpoint_windows() -> None:
    core = started(1, outer=SlowMomentum(0.5, 0.9), checkpoint=True)
    ref = OuterStepper(SlowMomentum(0.5, 0.9))
    join(core, 0, [0])
    windows: list[CheckpointWindow] = []
    for params in ([1.0, 2.0], [0.5, 1.0]):
        for f in (f32(1.0, kind=RoundKind.CONTROL, weight=0.0), f32(*params), f32(7.0)):
            acts = core.receive_data(0, host_frame_bytes(f))
            [b] = sent(acts, SendKind.BROADCAST)
            assert record(b).frame(SALT) == ref.process_frame(ref_reduce([f]))
            windows += [a for a in acts if isinstance(a, CheckpointWindow)]
    acts = core.stop()
    windows += [a for a in acts if isinstance(a, CheckpointWindow)]
    assert [w.window for w in windows] == [0, 1]
    assert windows[1].params.tensors[0].array().tolist() == [0.75, 1.5]
    buffers = windows[1].buffers
    assert buffers is not None and buffers.tensors[0].array().tolist() == [7.0]


def test_status_snapshot() -> None:
    core = started(2)
    join(core, 0, [1, 0])
    st_ = core.status()
    assert st_["state"] == "Reducing" and st_["world_size"] == 2 and st_["ranks_covered"] == 2
    assert st_["relays"] == [{"relay": 0, "host": "h", "ranks": [1, 0], "alive_ranks": [1, 0],
                              "deposited": False, "open": True}]
    assert st_["rounds_reduced"] == 0 and st_["last_round"] is None and st_["outcome"] is None


def test_mux_stream_events() -> None:
    s = MuxStream(SALT)
    assert s.feed(b"\xe1\x17") == [] and s.buffered == 2
    [ev] = s.feed_eof()
    assert isinstance(ev, StreamFailed) and "reading channel magic failed" in str(ev.error)
    s = MuxStream(SALT)
    evs = s.feed(hello_bytes([0]))
    assert len(evs) == 2
    assert s.feed_eof() == [StreamEnded()] and s.done and s.feed(b"more") == []


def widest_hello_payload(world_size: int) -> bytes:
    """The largest legal Hello payload for ``world_size``: a 255-byte host name, every rank and
    one model signature per rank, each varint at its widest accepted marker."""
    def u32(v: int) -> bytes:
        return b"\xfc" + v.to_bytes(4, "little")

    def u64(v: int) -> bytes:
        return b"\xfd" + v.to_bytes(8, "little")

    host = b"h" * MAX_HELLO_HOST_LEN
    return (u32(0) + u64(len(host)) + host + u64(world_size)
            + b"".join(u32(r) for r in range(world_size))
            + u64(world_size) + bytes(32) * world_size)


@pytest.mark.parametrize("version", [2, 3])
def test_widest_hello_fits_the_first_record_bound(version: int) -> None:
    ws = 3
    payload = widest_hello_payload(ws)
    assert len(payload) == max_hello_payload(ws) == 287 + 37 * ws
    core = started(ws, version=version)
    core.connection_opened(0, 0.0)
    rec = encode_mux_record_bytes(MuxRecord(RecordKind.CONTROL, 0, payload), SALT)
    acts = core.receive_data(0, encode_channel_magic("data") + rec)
    assert RelayJoined(0, 0, "h" * MAX_HELLO_HOST_LEN, (0, 1, 2)) in acts
    assert core.state == "reducing" and finished(acts) is None


def _control_header(claim: int) -> bytes:
    """A Control record's 25-byte header claiming ``claim`` payload bytes (its tag not
    computed: a bound is checked before the tag)."""
    return bytes(MUX_HEADER.build({"magic": MUX_RECORD_MAGIC, "version": MUX_PROTOCOL_VERSION,
                                   "kind": RecordKind.CONTROL.value, "rank": 0,
                                   "payload_len": claim, "auth_tag": bytes(8)}))


@pytest.mark.parametrize("claim", [max_hello_payload(2) + 1, 1 << 30])
def test_first_record_larger_than_any_hello_fails_from_its_header(claim: int) -> None:
    core = started(2)
    core.connection_opened(0, 0.0)
    acts = core.receive_data(0, encode_channel_magic("data") + _control_header(claim))  # no
    # payload byte sent
    fin = finished(acts)
    assert fin is not None and not fin.outcome.clean
    err = fin.outcome.error
    assert isinstance(err, LimitExceeded) and err.error_id == "controller.hello_too_long"
    assert str(err) == (f"cluster_controller: first record claims payload_len {claim} "
                        f"(> {max_hello_payload(2)} bytes, the largest legal Hello for the world "
                        "size; kind=0x02); corrupt or hostile peer")
    assert core.stream(0).buffered == 0


def test_hello_bound_applies_to_the_first_record_only() -> None:
    s = MuxStream(SALT, hello_limit=max_hello_payload(1))
    assert s.payload_limit == max_hello_payload(1)
    assert len(s.feed(hello_bytes([0]))) == 2
    assert s.payload_limit == DEFAULT_FRAME_CEILING
    big = host_frame_bytes(f32(*([1.0] * 400)))
    assert len(big) - 25 > max_hello_payload(1)
    [ev] = s.feed(big)
    assert isinstance(ev, RecordReceived) and isinstance(ev.frame, RoundFrame)
    with pytest.raises(InvalidValue):
        max_hello_payload(0)


@pytest.mark.parametrize("claim", [max_control_payload(2) + 1, 1 << 30])
def test_a_later_control_record_longer_than_any_control_message_fails_from_its_header(
        claim: int) -> None:
    """Departure control_bound: after its Hello, a relay's Control record claiming more than
    the longest legal control message for the world size ends the run from its header, no
    payload byte read (it was read up to the frame ceiling and decoded whole: a Hello of a
    rank per byte is a list of a billion entries at 1 GiB)."""
    core = started(2)
    join(core, 0, [0, 1])
    fin = finished(core.receive_data(0, _control_header(claim)))
    assert fin is not None and not fin.outcome.clean
    err = fin.outcome.error
    assert isinstance(err, LimitExceeded) and err.error_id == "controller.control_too_long"
    assert str(err) == (f"cluster_controller: a Control record after the Hello claims "
                        f"payload_len {claim} (> {max_control_payload(2)} bytes, the longest "
                        "legal control message for the world size); corrupt or hostile peer")
    assert core.stream(0).buffered == 0
    assert max_control_payload(2) == max_hello_payload(2) == 287 + 37 * 2


def test_a_later_control_record_at_the_bound_is_read_as_before() -> None:
    """A RankExit padded to the bound (bincode ignores bytes after the message) is still the
    relay's RankExit: the bound refuses only what no legal message needs."""
    core = started(2)
    join(core, 0, [0, 1])
    payload = b"\x02\x01" + bytes(max_control_payload(2) - 2)
    acts = core.receive_data(0, encode_mux_record_bytes(
        MuxRecord(RecordKind.CONTROL, 0, payload), SALT))
    fin = finished(acts)
    assert fin is not None and fin.outcome.clean  # rank 1 left: the run ends cleanly


def test_runner_failure_fails_the_core_with_the_exception() -> None:
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    boom = RuntimeError("scatter exploded")
    acts = core.runner_failed(boom, "the coordinator")
    fin = finished(acts)
    assert fin is not None and core.state == "shutdown" and core.finished
    assert fin.outcome.clean is False and fin.outcome.reason == "fail"
    assert fin.outcome.error is boom and fin.outcome.detail == "in the coordinator"
    assert closed(acts) == {0, 1}
    assert core.status()["outcome"] == {"clean": False, "reason": "fail",
                                        "error": "scatter exploded"}
    assert core.runner_failed(ValueError("later"), "x") == [] and core.outcome is fin.outcome


# -- a model-checked state machine over the core ---------------------------------------------------
#: a flag that is rarely True (not at an integer boundary, which Hypothesis favours)
RARE = st.integers(0, 30).map(lambda x: x == 13)
#: a flag that is True about one time in five
SOMETIMES = st.integers(0, 4).map(lambda x: x == 2)
#: a flag that is True about one time in four
OFTEN = st.integers(0, 99).map(lambda x: 40 <= x < 65)
#: a flag that is True about one time in twenty
ONE_IN_TWENTY = st.integers(0, 99).map(lambda x: 40 <= x < 45)
#: the ways the controller machine's Hellos are refused (``ControllerCoreStateful._hello``)
HELLO_FAULTS = ("range", "another relay", "twice")


def _splits(data: Any, payload: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), max_size=3)))
    out, prev = [], 0
    for c in [*cuts, len(payload)]:
        out.append(payload[prev:c])
        prev = c
    return out


class ControllerCoreStateful(RuleBasedStateMachine):
    """Random relays, Hellos, HostFrames, deaths, EOFs, write failures and ticks, checked against
    a simple model: ranks are announced once, a round is scattered exactly when every expected
    relay deposited, its consensus is the reduce of the deposits, dead ranks stay dead, Shutdown
    is final."""

    @initialize(data=st.data(), ws=st.integers(1, 4), version=st.sampled_from([2, 3]),
                focus=st.sampled_from(["rounds", "eof", "fail", "deaths", "accept", "duplicate",
                                       "range"]),
                refused=st.sampled_from([(), HELLO_FAULTS]))
    def setup(self, data: Any, ws: int, version: int, focus: str,
              refused: tuple[str, ...]) -> None:
        """A started core and the example's focus, after (about one example in two) three cores
        whose runs a Hello of the :meth:`hello` rule's path ends, refused in each of the ways of
        :data:`HELLO_FAULTS` in turn (``refused``): the rule itself is drawn too rarely to reach
        each of them: it runs in ``accept`` examples only, and each ends at its first refused Hello.
        ``accept``: the accept phase is driven by the rules (Hellos, bad Hellos, silent
        connections); ``duplicate``: a relay announces some ranks, then another relay announces one
        of them again (the run fails); ``range``: a Hello names a rank not below the world size (the
        run fails); otherwise every rank is announced at once (a random partition into relays) and
        the run reduces rounds, with one run-ending input drawn more often (``eof``: a relay EOF,
        ``fail``: a bad record, ``deaths``: DeclareDead) or none (``rounds``)."""
        STATS["examples"] += 1
        self.ws, self.version = ws, version
        self.focus = focus
        STATS[f"focus {focus}"] += 1
        self.first_run = True  # a core ended by a refused Hello, before the focus's
        self._fresh_core()
        for fault in refused:
            self._hello(data, fault)
            assert self.state == "shutdown"
            self._fresh_core()
        self.first_run = False
        if focus == "duplicate":
            self.announce_a_rank_twice(data)
        elif focus == "range":
            self.announce_a_rank_beyond_the_world(data)
        elif focus != "accept":
            self.cover_the_rest(data)

    def _fresh_core(self) -> None:
        """A started core of the example's world size and version, and the model of it."""
        self.core = ControllerCore(self.ws, SALT, version=self.version)
        assert self.core.start() == []
        self.now = 0.0
        self.next_conn = 0
        self.state = "accepting"
        self.silent: dict[int, float] = {}  # conn -> opened at (no Hello yet)
        self.relays: list[tuple[int, tuple[int, ...]]] = []  # (conn, ranks)
        self.open: set[int] = set()  # open relay connections
        self.covered: set[int] = set()
        self.dead: set[int] = set()
        self.forwarded: set[int] = set()
        self.deposits: dict[int, RoundFrame] = {}
        self.rounds = 0
        self.expect_sends: list[tuple[int, SendKind, Any]] = []
        self.expect_end: tuple[bool, str] | None = None
        self.expect_error: str | None = None
        self.seen_dead: set[int] = set()
        self.deaf: set[int] = set()  # relays whose reader has exited (EOF or error)
        self.pending_exit: str | None = None  # held during the accept phase
        self.pending_error = False
        self.live_deaths = 0  # live ranks declared dead (DeclareDead or a failed write)

    # -- model -----------------------------------------------------------------------------------
    def _alive(self, i: int) -> bool:
        return any(r not in self.dead for r in self.relays[i][1])

    def _finish(self, clean: bool, reason: str) -> None:
        event(f"finished: {reason}")
        if not self.first_run:  # how the focus's run ended (a refused Hello ends the first ones)
            STATS[f"ended by {reason}"] += 1
        self.state = "shutdown"
        self.expect_end = (clean, reason)

    def _reader_exit(self, reason: str) -> None:
        if self.state == "reducing":
            self._finish(True, reason)
        elif self.pending_exit is None:
            self.pending_exit = reason

    def _reader_error(self) -> None:
        if self.state == "reducing":
            self._finish(False, "fail")
        else:
            self.pending_error = True

    def _evaluate(self) -> None:
        while self.state == "reducing":
            if self.pending_exit is not None:
                self._finish(True, self.pending_exit)
                return
            if self.pending_error:
                self._finish(False, "fail")
                return
            expected = [i for i in range(len(self.relays)) if self._alive(i)]
            if not expected:
                self._finish(True, "all_dead")
                return
            if not all(i in self.deposits for i in expected):
                for r in sorted(self.dead - self.forwarded):
                    self.forwarded.add(r)
                    owner = [i for i, (_, rs) in enumerate(self.relays) if r in rs]
                    if owner and self.relays[owner[0]][0] in self.open:
                        self.expect_sends.append((self.relays[owner[0]][0],
                                                  SendKind.DECLARE_DEAD, r))
                return
            frames = [self.deposits.get(i) if i in expected else None
                      for i in range(len(self.relays))]
            want = ref_reduce(frames, version=self.version)
            for i in expected:
                self.expect_sends.append((self.relays[i][0], SendKind.BROADCAST, want))
            self.deposits.clear()
            self.rounds += 1
            event(f"round scattered to {len(expected)} relay(s)")

    def _check(self, actions: list[Action]) -> None:
        got = sent(actions)
        assert [(s.conn, s.kind) for s in got] == [(c, k) for c, k, _ in self.expect_sends]
        broadcasts = [s for s in got if s.kind is SendKind.BROADCAST]
        if broadcasts:
            assert all(s.buffers is broadcasts[0].buffers for s in broadcasts)
        for s, (_, kind, extra) in zip(got, self.expect_sends, strict=True):
            rec = record(s, self.version)
            if kind is SendKind.BROADCAST:
                assert rec.frame(SALT) == extra
            elif kind is SendKind.DECLARE_DEAD:
                assert rec.control == DeclareDead(extra)
            else:
                assert isinstance(rec.control, HelloAck)
        self.expect_sends = []
        fin = finished(actions)
        if self.expect_end is not None:
            assert fin is not None, "the run should have ended"
            assert (fin.outcome.clean, fin.outcome.reason) == self.expect_end, fin.outcome
            if self.expect_error is not None:
                assert fin.outcome.error is not None
                assert fin.outcome.error.error_id == self.expect_error, fin.outcome.error
                self.expect_error = None
            if fin.outcome.error is not None:
                event(f"failed with {fin.outcome.error.error_id}")
                STATS[f"failed with {fin.outcome.error.error_id}"] += 1
            self.expect_end = None
        else:
            assert fin is None, fin

    # -- rules -----------------------------------------------------------------------------------
    # Run-ending inputs are gated by a draw so that runs live long enough to reduce rounds; after
    # Shutdown every rule stays enabled and checks that its input is a no-op.
    def _ended(self, acts: list[Action]) -> bool:
        if self.state != "shutdown":
            return False
        assert acts == [], acts
        return True

    def _go(self, data: Any, focus: str) -> bool:
        """Whether a run-ending input happens now: in an example focused on it, always once a
        round was reduced (before that, about one time in four); otherwise rarely (one time in
        twenty). Most examples reduce rounds and each ending is reached in many examples."""
        if self.focus == focus and self.rounds:
            return True
        return bool(data.draw(OFTEN if self.focus == focus else ONE_IN_TWENTY, label="go"))

    def _relay(self, data: Any) -> int:
        return int(data.draw(st.sampled_from([i for i, (c, _) in enumerate(self.relays)
                                              if c in self.open])))

    @precondition(lambda self: self.state == "accepting")
    @rule(data=st.data(), bad_hello=st.integers(0, 99).map(lambda x: 30 <= x < 70),
          how=st.sampled_from(HELLO_FAULTS))
    def hello(self, data: Any, bad_hello: bool, how: str) -> None:
        """A relay's Hello, cut into chunks: free ranks, or (``bad_hello``) a Hello the core
        refuses in the way ``how`` names (:meth:`_hello`)."""
        self._hello(data, how if bad_hello else "valid")

    def _hello(self, data: Any, bad: str) -> None:
        """A Hello of free ranks (``valid``), or one the core refuses: with the world size
        (``range``), with a rank an earlier relay announced (``another relay``: when none has,
        a relay first announces some ranks, not every one; in a world of one rank, one Hello
        names rank 0 twice) or with one rank twice (``twice``)."""
        free = sorted(set(range(self.ws)) - self.covered)  # never empty while accepting
        if bad == "another relay" and not self.covered:
            if len(free) == 1:
                bad = "twice"
            else:
                first = data.draw(st.lists(st.sampled_from(free), unique=True, min_size=1,
                                           max_size=len(free) - 1), label="a first relay")
                self._send_hello(data, first)
                free = sorted(set(free) - set(first))
        least = (data.draw(st.sampled_from([0, 1, 1, 1])) if bad == "valid"
                 else int(bad == "twice"))
        ranks = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=len(free),
                                   min_size=least))
        if bad == "range":
            ranks = [*ranks, self.ws]
        elif bad == "another relay":
            ranks = [*ranks, sorted(self.covered)[0]]
        elif bad == "twice":
            ranks = [*ranks, ranks[0]]
        self._send_hello(data, ranks)

    def _send_hello(self, data: Any, ranks: list[int]) -> str | None:
        """A new relay's Hello of ``ranks``, in chunks; the model says whether the core accepts
        it (HelloAck; the accept phase ends with the last rank) or ends the run, and why (the
        error id, returned; None: accepted). Counted by path: ``valid``, or refused for the
        world size (``range``), a rank an earlier relay announced (``another relay``) or one
        rank twice in this Hello (``twice``)."""
        conn = self.next_conn
        self.next_conn += 1
        acts = self.core.connection_opened(conn, self.now)
        for chunk in _splits(data, hello_bytes(ranks, self.version)):
            acts += self.core.receive_data(conn, chunk)
        seen, error, path = set(self.covered), None, "valid"
        for r in ranks:
            if r >= self.ws:
                error, path = "controller.rank_out_of_range", "range"
                break
            if r in seen:  # announced by an earlier relay, or twice in this Hello
                error = "controller.rank_twice"
                path = "another relay" if r in self.covered else "twice"
                break
            seen.add(r)
        STATS[f"Hello: {path}"] += 1
        event(f"Hello: {path}")
        if error is not None:
            self._finish(False, "fail")
            self.expect_error = error
            self._check(acts)
            return error
        self.expect_sends.append((conn, SendKind.HELLO_ACK, None))
        self.relays.append((conn, tuple(ranks)))
        self.open.add(conn)
        self.covered |= set(ranks)
        if len(self.covered) == self.ws:
            self.state = "reducing"
            assert any(isinstance(a, StopAccepting) for a in acts)
            assert set(self.silent) <= closed(acts)
            self.silent.clear()
            self._evaluate()
        self._check(acts)
        return None

    def announce_a_rank_twice(self, data: Any) -> None:
        """A relay announces ranks; another relay then announces one of them (``rank_twice``).
        With a world of one rank, one Hello carries rank 0 twice."""
        if self.ws == 1:
            assert self._send_hello(data, [0, 0]) == "controller.rank_twice"
            return
        k = data.draw(st.integers(1, self.ws - 1), label="ranks of the first relay")
        assert self._send_hello(data, list(range(k))) is None
        dup = data.draw(st.integers(0, k - 1), label="the rank announced again")
        # k < ws: a new rank first
        assert self._send_hello(data, [k, dup]) == "controller.rank_twice"

    def announce_a_rank_beyond_the_world(self, data: Any) -> None:
        """A relay may announce some ranks; another relay's Hello then names some of the rest and
        the world size, the first rank the spec refuses (each must be below it; a larger one
        meets the same check), where an off-by-one shows: the run fails with
        ``controller.rank_out_of_range``."""
        k = data.draw(st.integers(0, self.ws - 1), label="ranks of a first relay")
        if k:
            assert self._send_hello(data, list(range(k))) is None
        n = data.draw(st.integers(0, self.ws - k), label="valid ranks before the world size")
        assert (self._send_hello(data, [*range(k, k + n), self.ws])
                == "controller.rank_out_of_range")

    @precondition(lambda self: self.state == "accepting")
    @rule(data=st.data())
    def cover_the_rest(self, data: Any) -> None:
        """Relays announcing every uncovered rank (random partition), ending the accept phase."""
        free = sorted(set(range(self.ws)) - self.covered)
        while free and self.state == "accepting":
            k = data.draw(st.integers(1, len(free)))
            ranks, free = free[:k], free[k:]
            conn = self.next_conn
            self.next_conn += 1
            acts = self.core.connection_opened(conn, self.now)
            acts += self.core.receive_data(conn, hello_bytes(ranks, self.version))
            self.expect_sends.append((conn, SendKind.HELLO_ACK, None))
            self.relays.append((conn, tuple(ranks)))
            self.open.add(conn)
            self.covered |= set(ranks)
            if not free:
                self.state = "reducing"
                self.silent.clear()
                self._evaluate()
            self._check(acts)

    @precondition(lambda self: self.state == "reducing" and bool(self.open))
    @rule(data=st.data(), weights=st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=4,
                                           max_size=4))
    def every_relay_deposits(self, data: Any, weights: list[float]) -> None:
        """Every open relay deposits (in a random order): a round, unless someone is dead."""
        order = data.draw(st.permutations([i for i, (c, _) in enumerate(self.relays)
                                           if c in self.open]))
        acts: list[Action] = []
        for n, i in enumerate(order):
            f = f32(float(n), -0.5 * i, weight=weights[n % 4])
            acts += self.core.receive_data(self.relays[i][0], host_frame_bytes(f))
            if self._alive(i) and i not in self.deaf and self.state == "reducing":
                self.deposits[i] = f
                self._evaluate()
        self._check(acts)

    @rule(magic=st.booleans(), go=RARE)
    def silent_connection(self, magic: bool, go: bool) -> None:
        if not go and self.state == "accepting":
            return  # a silent connection ends the run at its deadline: drawn rarely
        conn = self.next_conn
        self.next_conn += 1
        acts = self.core.connection_opened(conn, self.now)
        if magic:
            acts += self.core.receive_data(conn, encode_channel_magic("data"))
        if self.state != "accepting":
            assert closed(acts) == {conn}
            assert sent(acts) == [] and finished(acts) is None
            return
        self.silent[conn] = self.now
        self._check(acts)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data(), weight=st.sampled_from([0.0, 1.0, 2.5]),
          vals=st.lists(st.sampled_from([-1.5, 0.0, 0.25, 3.0]), min_size=2, max_size=2))
    def deposit(self, data: Any, weight: float, vals: list[float]) -> None:
        i = self._relay(data)
        f = f32(*vals, weight=weight)
        acts: list[Action] = []
        for chunk in _splits(data, host_frame_bytes(f)):
            acts += self.core.receive_data(self.relays[i][0], chunk)
        if self._ended(acts):
            return
        if self._alive(i) and i not in self.deaf:
            self.deposits[i] = f
            self._evaluate()
        self._check(acts)

    @rule(data=st.data())
    def declare_dead(self, data: Any) -> None:
        if not self._go(data, "deaths") and self.state != "shutdown":
            return
        rank = data.draw(st.integers(0, self.ws))  # ws itself: out of range, a no-op
        acts = self.core.declare_dead(rank)
        if self._ended(acts):
            return
        if rank < self.ws:
            if rank not in self.dead and self.state == "reducing":
                self.live_deaths += 1
                event("a live rank declared dead while reducing")
            self.dead.add(rank)
        self._evaluate()
        self._check(acts)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def relay_eof(self, data: Any) -> None:
        i = self._relay(data)
        if not self._go(data, "eof") and self._alive(i) and self.state != "shutdown":
            return  # ending the run: drawn rarely
        conn = self.relays[i][0]
        acts = self.core.connection_closed(conn)
        if self._ended(acts):
            return
        if i in self.deaf:
            pass
        elif self._alive(i):
            self._reader_exit("relay_eof")
        else:
            self.open.discard(conn)
            assert closed(acts) == {conn}
        self.deaf.add(i)
        self._check(acts)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data(), go=RARE)
    def rank_exit(self, data: Any, go: bool) -> None:
        i = self._relay(data)
        conn, ranks = self.relays[i]
        rank = data.draw(st.sampled_from([*ranks, self.ws + 1]))
        ends = rank not in ranks or rank not in self.dead
        if not go and ends and self.state != "shutdown":
            return
        acts = self.core.receive_data(conn, control_bytes(RankExit(rank), self.version))
        if self._ended(acts):
            return
        if i in self.deaf:
            pass
        elif rank not in ranks:
            self.deaf.add(i)
            self._reader_error()
        elif rank not in self.dead:
            self._reader_exit("rank_exit")
        self._check(acts)

    @precondition(lambda self: self.state != "accepting" and bool(self.open))
    @rule(data=st.data(), go=SOMETIMES)
    def broadcast_write_failed(self, data: Any, go: bool) -> None:
        if not go and self.state != "shutdown":
            return
        i = self._relay(data)
        conn, ranks = self.relays[i]
        acts = self.core.write_failed(conn, SendKind.BROADCAST, "test")
        if self._ended(acts):
            return
        if set(ranks) - self.dead:
            self.live_deaths += 1
            event("a relay with live ranks lost to a failed write")
        self.dead |= set(ranks)
        self.deposits.pop(i, None)
        self.open.discard(conn)
        self._evaluate()
        self._check(acts)

    @precondition(lambda self: self.state != "shutdown" and bool(self.open))
    @rule(data=st.data(), how=st.sampled_from(["salt", "data"]))
    def relay_sends_a_bad_record(self, data: Any, how: str) -> None:
        """Rarely: a live relay's reader fails (a HostFrame signed with another salt, or a
        per-rank Data record on the controller's channel); the run fails (held during accept)."""
        i = self._relay(data)
        if not self._go(data, "fail") or i in self.deaf or not self._alive(i):
            return
        bad = (host_frame_bytes(f32(1.0), salt=bytes(16)) if how == "salt" else
               encode_mux_record_bytes(MuxRecord.data(self.relays[i][1][0], b"x"), SALT))
        acts = self.core.receive_data(self.relays[i][0], bad)
        self.deaf.add(i)
        self._reader_error()
        self._check(acts)

    @rule(dt=st.sampled_from([0.1] * 10 + [4.0, 10.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        acts = self.core.tick(self.now)
        if self._ended(acts):
            return
        if self.state == "accepting" and any(self.now >= t + HANDSHAKE_TIMEOUT
                                             for t in self.silent.values()):
            self._finish(False, "fail")
        self._evaluate()
        self._check(acts)

    @rule(go=RARE)
    def stop(self, go: bool) -> None:
        if not go and self.state != "shutdown":
            return
        acts = self.core.stop()
        if self._ended(acts):
            return
        self._finish(True, "stop")
        self._check(acts)

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def lifecycle_state(self) -> None:
        if hasattr(self, "core"):
            assert self.core.state == self.state
            assert self.core.finished == (self.state == "shutdown")
            assert self.core.rounds == self.rounds

    @invariant()
    def one_relay_per_rank(self) -> None:
        if hasattr(self, "core"):
            seen: list[int] = []
            for r in self.core.relays():
                seen += r.ranks
            assert len(seen) == len(set(seen))
            assert all(0 <= x < self.ws for x in seen)

    @invariant()
    def dead_ranks_never_come_back(self) -> None:
        if hasattr(self, "core"):
            now = set(self.core.dead_ranks.dead_ranks())
            assert self.seen_dead <= now
            assert now == self.dead
            self.seen_dead = now


    def teardown(self) -> None:
        if not hasattr(self, "core"):
            return
        if self.rounds:
            STATS["examples with reduced rounds"] += 1
        if self.live_deaths:
            STATS["examples with deaths"] += 1
        STATS["rounds"] += self.rounds
        target(float(self.rounds), label="rounds reduced")
        target(float(len(self.dead)), label="dead ranks")


#: what the last run of the machine reached (reset by :func:`test_controller_core_state_machine`)
STATS: Counter[str] = Counter()


@pytest.mark.stateful
def test_controller_core_state_machine() -> None:
    """Run the machine under the loaded profile, then check what it reached: rounds reduced in
    most examples, a run ended by a relay EOF, runs ended by a failure (a rank another relay
    announced and a rank not below the world size among them), live ranks declared dead.

    The ``ci`` profile is derandomized: the run, and so these figures, change only when the
    machine's rules or strategies change. The machine steers toward them (each example has a
    focus; see ``setup``) rather than relying on luck."""
    STATS.clear()
    run_state_machine_as_test(ControllerCoreStateful, settings=settings(stateful_step_count=40))
    print(dict(STATS))
    examples = STATS["examples"]
    assert examples >= settings().max_examples, STATS
    assert STATS["examples with reduced rounds"] > examples / 2, STATS
    assert STATS["ended by relay_eof"] >= 1, STATS
    assert STATS["ended by fail"] >= 1, STATS
    for path in HELLO_FAULTS:  # every way a Hello is refused, a few times
        assert STATS[f"Hello: {path}"] >= 3, (path, STATS)
    assert STATS["failed with controller.rank_twice"] >= 1, STATS
    assert STATS["failed with controller.rank_out_of_range"] >= 1, STATS
    assert STATS["examples with deaths"] >= 1, STATS


def test_errors_are_protocol_errors() -> None:
    assert issubclass(LimitExceeded, ProtocolError)


# -- round deadline (an addition to upstream, off by default) --------------------------------------
def test_round_deadline_declares_the_silent_relay_dead_and_the_round_goes_on() -> None:
    core = started(4, round_timeout=2.5)
    join(core, 10, [0, 1])
    join(core, 11, [2, 3])
    assert core.next_round_deadline() is None  # no HostFrame yet: the clock has not started
    acts = core.receive_data(10, host_frame_bytes(f32(2.0, 4.0, weight=2.0)), now=100.0)
    assert acts == [] and core.next_round_deadline() == 102.5
    assert core.tick(102.4) == []  # not yet
    acts = core.tick(102.5)
    dd = sent(acts, SendKind.DECLARE_DEAD)
    assert [(s.conn, record(s).control) for s in dd] == [(11, DeclareDead(2)),
                                                         (11, DeclareDead(3))]
    closes = [a for a in acts if isinstance(a, CloseConnection)]
    assert closes == [CloseConnection(11, "round timeout: its ranks were declared dead", True)]
    assert acts.index(dd[-1]) < acts.index(closes[0])  # DeclareDead first, then FIN
    bc = sent(acts, SendKind.BROADCAST)
    assert [s.conn for s in bc] == [10]
    consensus = record(bc[0]).frame(SALT)
    assert consensus is not None and consensus.weight == 2.0
    assert consensus.tensors[0].array().tolist() == [1.0, 2.0]
    assert core.dead_ranks.dead_ranks() == [2, 3]
    assert core.status()["round_timeouts"] == [
        {"round": 1, "relay": 1, "host": "h", "ranks": [2, 3], "waited": 2.5}]
    assert core.status()["round_timeout"] == 2.5
    # the next round waits for relay 0 only; its clock starts at its first HostFrame again
    assert core.next_round_deadline() is None
    acts = core.receive_data(10, host_frame_bytes(f32(1.0, 1.0, weight=2.0)), now=200.0)
    assert [s.conn for s in sent(acts, SendKind.BROADCAST)] == [10]
    # whatever the given-up relay still sends is never read into a round
    assert core.receive_data(11, host_frame_bytes(f32(9.0, 9.0)), now=201.0) == []
    assert core.round_timeouts[0]["ranks"] == [2, 3] and core.rounds == 2


def test_round_deadline_is_off_by_default_and_a_complete_round_resets_it() -> None:
    core = started(4)
    join(core, 1, [0, 1])
    join(core, 2, [2, 3])
    core.receive_data(1, host_frame_bytes(f32(1.0)), now=0.0)
    assert core.next_round_deadline() is None and core.tick(1e9) == []
    assert core.dead_ranks.dead_ranks() == []
    timed = started(4, round_timeout=1.0)
    join(timed, 1, [0, 1])
    join(timed, 2, [2, 3])
    timed.receive_data(1, host_frame_bytes(f32(1.0)), now=0.0)
    acts = timed.receive_data(2, host_frame_bytes(f32(3.0)), now=0.9)
    assert len(sent(acts, SendKind.BROADCAST)) == 2
    assert timed.next_round_deadline() is None and timed.tick(5.0) == []
    assert timed.round_timeouts == [] and timed.dead_ranks.dead_ranks() == []


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_round_deadline_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(LocalProtocolError,
                       match="round_timeout must be a finite number of seconds above 0"):
        ControllerCore(2, SALT, round_timeout=bad)


def test_status_after_a_round_and_a_clean_stop() -> None:
    core = started(1, round_timeout=2.5)
    hello = hello_bytes([0])
    frame = host_frame_bytes(f32(1.0, 2.0, weight=3.0))
    acts = core.connection_opened(0, 0.0) + core.receive_data(0, hello)
    acts += core.receive_data(0, frame)
    [bcast] = sent(acts, SendKind.BROADCAST)
    assert core.status() == {
        "state": "Reducing", "world_size": 1, "protocol_version": 2,
        "relays": [{"relay": 0, "host": "h", "ranks": [0], "alive_ranks": [0],
                    "deposited": False, "open": True}],
        "ranks_covered": 1, "dead_ranks": [], "rounds_reduced": 1, "round_timeout": 2.5,
        "round_timeouts": [], "bytes_in": len(hello) + len(frame),
        "bytes_out": sum(s.nbytes for s in sent(acts)),
        "last_round": {"round": 1, "kind": "model", "weight": 3.0, "bytes": bcast.nbytes,
                       "relays": 1},
        "outcome": None,
    }
    core.stop()
    st_ = core.status()
    assert st_["state"] == "Shutdown" and st_["rounds_reduced"] == 1
    assert st_["outcome"] == {"clean": True, "reason": "stop", "error": None}


def test_round_deadline_is_none_once_stopped() -> None:
    core = started(2, round_timeout=2.5)
    join(core, 0, [0], now=1.0)
    join(core, 1, [1], now=1.0)
    core.receive_data(0, host_frame_bytes(f32(1.0)), now=4.0)
    assert core.next_round_deadline() == 6.5
    core.stop()
    assert core.next_round_deadline() is None  # not reducing any more


def test_runner_failure_without_a_place() -> None:
    core = started(1)
    join(core, 0, [0])
    fin = finished(core.runner_failed(RuntimeError("x")))
    assert fin is not None and fin.outcome.detail == ""


def test_checkpoint_windows_without_control_rounds() -> None:
    core = started(1, checkpoint=True)
    join(core, 0, [0])
    windows: list[CheckpointWindow] = []
    for v, kind in [(1.0, RoundKind.MODEL), (2.0, RoundKind.MODEL), (0.0, RoundKind.CONTROL),
                    (3.0, RoundKind.MODEL), (4.0, RoundKind.MODEL), (5.0, RoundKind.MODEL)]:
        f = f32(v, kind=kind, weight=0.0 if kind is RoundKind.CONTROL else 1.0)
        acts = core.receive_data(0, host_frame_bytes(f))
        windows += [a for a in acts if isinstance(a, CheckpointWindow)]
    windows += [a for a in core.stop() if isinstance(a, CheckpointWindow)]
    # Control closes window 0 (1.0, 2.0); a third Model consensus closes window 1 (3.0, 4.0)
    # and opens window 2 with 5.0 as its parameters, flushed without buffers at the stop
    got = [(w.window, w.params.tensors[0].array().tolist(),
            None if w.buffers is None else w.buffers.tensors[0].array().tolist())
           for w in windows]
    assert got == [(0, [1.0], [2.0]), (1, [3.0], [4.0]), (2, [5.0], None)]


def test_uncovered_ranks_limit_and_count() -> None:
    core = ControllerCore(4, SALT)
    assert core.uncovered_count() == 4
    assert core.uncovered_ranks(0) == [] and core.uncovered_ranks(-3) == []
    assert core.uncovered_ranks(3) == [0, 1, 2]
    assert core.uncovered_ranks(9) == [0, 1, 2, 3] == core.uncovered_ranks()
    core.start()
    join(core, 5, [0, 2])
    assert core.uncovered_count() == 2
    assert core.uncovered_ranks(1) == [1] and core.uncovered_ranks(2) == [1, 3]
    join(core, 6, [3, 1])
    assert core.state == "reducing"
    assert core.uncovered_count() == 0 and core.uncovered_ranks(1) == []
    # a run that ends during the accept phase lists none, though ranks were never announced
    stopped = started(3)
    join(stopped, 5, [1])
    stopped.stop()
    assert stopped.state == "shutdown"
    assert stopped.uncovered_count() == 0 and stopped.uncovered_ranks() == []


def test_the_largest_world_costs_memory_by_relays_and_deaths_not_by_ranks() -> None:
    # 2**32 - 1 ranks, the most the handshake's u32 field carries: the core starts, accepts a
    # relay, lists the lowest uncovered ranks, takes deaths and reports its status, all in a
    # small, world-size-independent amount of memory (a per-rank list would need 32 GiB)
    world = 2**32 - 1
    tracemalloc.start()
    try:
        core = started(world)
        acts = join(core, 5, [world - 1, 0])
        assert [record(a).control for a in sent(acts)] == [HelloAck()]
        assert core.uncovered_count() == world - 2
        assert core.uncovered_ranks(3) == [1, 2, 3]
        assert core.declare_dead(world - 1) == [] and core.declare_dead(7) == []
        assert core.declare_dead(world) == []  # out of range: a no-op
        status = core.status()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    assert core.state == "accepting"
    assert core.dead_ranks.dead_ranks() == [7, world - 1]
    assert status["world_size"] == world and status["ranks_covered"] == 2
    assert status["dead_ranks"] == [7, world - 1]
    assert status["relays"] == [{"relay": 0, "host": "h", "ranks": [world - 1, 0],
                                 "alive_ranks": [0], "deposited": False, "open": True}]


def test_relay_snapshots_and_uncovered_ranks() -> None:
    core = ControllerCore(3, SALT)
    assert core.uncovered_ranks() == [0, 1, 2]
    core.start()
    join(core, 5, [2])
    assert core.uncovered_ranks() == [0, 1]
    join(core, 9, [1, 0])
    assert core.uncovered_ranks() == []  # accept phase over
    assert [(r.relay, r.conn, r.ranks, r.alive_ranks, r.deposited, r.open)
            for r in core.relays()] == [(0, 5, (2,), (2,), False, True),
                                        (1, 9, (1, 0), (1, 0), False, True)]
    core.receive_data(5, host_frame_bytes(f32(1.0)))
    assert [r.deposited for r in core.relays()] == [True, False]
    core.receive_data(9, host_frame_bytes(f32(2.0)))
    acts = core.write_failed(5, SendKind.BROADCAST, "stalled")
    assert CloseConnection(5, "broadcast write failed", False) in acts
    assert [(r.alive_ranks, r.deposited, r.open) for r in core.relays()] == [
        ((), False, False), ((1, 0), False, True)]


def test_hello_ack_write_failure_without_a_reason() -> None:
    core = started(2)
    join(core, 0, [0], now=0.0)
    fin = finished(core.write_failed(0, SendKind.HELLO_ACK))
    assert fin is not None and str(fin.outcome.error) == (
        "cluster_controller: HelloAck write to relay on connection 0 failed: write error")
    assert fin.outcome.detail == "relay h (ranks 0)"


def test_next_deadline_is_the_earlier_of_the_poll_and_the_round_deadline() -> None:
    core = started(2, round_timeout=2.5)
    join(core, 0, [0])
    join(core, 1, [1])
    assert core.next_deadline(1.0) == 1.0 + REDUCE_POLL  # no deposit yet: the poll only
    core.receive_data(0, host_frame_bytes(f32(1.0)), now=4.0)  # the round expires at 6.5
    assert core.next_deadline(4.0) == min(4.0 + REDUCE_POLL, 6.5)
    late = 6.5 - REDUCE_POLL / 2
    assert core.next_deadline(late) == 6.5


def test_round_deadline_records_the_wait_to_the_millisecond() -> None:
    core = started(2, round_timeout=2.5)
    join(core, 10, [0])
    join(core, 11, [1])
    core.receive_data(10, host_frame_bytes(f32(2.0)), now=100.0)
    core.tick(102.56789)
    assert core.round_timeouts == [
        {"round": 1, "relay": 1, "host": "h", "ranks": [1], "waited": 2.568}]


# -- how each run ends: the outcome's error id and detail, and every close with its reason --------
def _opened(ws: int, conn: int = 3) -> ControllerCore:
    core = started(ws)
    core.connection_opened(conn, 0.0)
    return core


def _two_relays() -> ControllerCore:
    core = started(2)
    join(core, 0, [0])
    join(core, 1, [1])
    return core


def _end_closed_before_hello() -> list[Action]:
    core = _opened(2)
    return core.receive_data(3, encode_channel_magic("data")) + core.connection_closed(3)


def _end_expected_hello() -> list[Action]:
    return _opened(2).receive_data(3, encode_channel_magic("data") + control_bytes(HelloAck()))


def _end_wrong_version_hello() -> list[Action]:
    core = started(1, version=3)
    return core.connection_opened(0, 0.0) + core.receive_data(0, hello_bytes([0], version=2))


def _end_duplicate_rank() -> list[Action]:
    core = started(2)
    join(core, 0, [1])
    return join(core, 1, [1])


def _end_rank_exit() -> list[Action]:
    core = started(2)
    join(core, 0, [0, 1])
    return core.receive_data(0, control_bytes(RankExit(0)))


def _end_all_dead() -> list[Action]:
    core = _two_relays()
    core.declare_dead(0)
    return core.declare_dead(1)


def _end_empty_hostframe() -> list[Action]:
    core = started(1)
    join(core, 0, [0])
    return core.receive_data(0, encode_mux_record_bytes(MuxRecord.host_frame(b""), SALT))


def _end_reduce_failure() -> list[Action]:
    core = _two_relays()
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    return core.receive_data(1, host_frame_bytes(f32(1.0, 2.0)))


_BEFORE_HELLO = "connection 3 (before its Hello)"
_CLEAN = "run ends cleanly, as flodl does"


@pytest.mark.parametrize(("scenario", "outcome", "closes"), [
    (_end_closed_before_hello,
     (False, "fail", "controller.closed_before_hello", _BEFORE_HELLO), {3}),
    (_end_expected_hello,
     (False, "fail", "controller.expected_hello", _BEFORE_HELLO), {3}),
    (lambda: _opened(2).receive_data(3, b"\x00\x00\x00\x00"),
     (False, "fail", "channel.bad_magic", _BEFORE_HELLO), {3}),
    (_end_wrong_version_hello,
     (False, "fail", "bincode.unexpected_end",
      "connection 0 (before its Hello); the relay sent a protocol-version-2 Hello to this "
      "version-3 controller: the protocol versions differ (set the same --protocol-version on "
      "both sides)"), {0}),
    (lambda: _opened(2, 4).tick(HANDSHAKE_TIMEOUT),
     (False, "fail", "controller.handshake_timeout", "connection 4 (before its Hello)"), {4}),
    (lambda: join(started(2), 0, [0, 2]),
     (False, "fail", "controller.rank_out_of_range", "connection 0 (host 'h', ranks [0, 2])"),
     {0}),
    (_end_duplicate_rank,
     (False, "fail", "controller.rank_twice",
      "connection 1 (host 'h', ranks [1]); relay h (ranks 1) announced it first"), {0, 1}),
    (lambda: _two_relays().connection_closed(0),
     (True, "relay_eof", None, f"relay h (ranks 0) closed its connection: {_CLEAN}"), {0, 1}),
    (_end_rank_exit,
     (True, "rank_exit", None, f"rank 0 of relay h (ranks 0,1) exited: {_CLEAN}"), {0}),
    (_end_all_dead,
     (True, "all_dead", None, f"no relay carries an alive rank (dead ranks 0,1): {_CLEAN}"),
     {0, 1}),
    (_end_empty_hostframe,
     (False, "fail", "controller.truncated_hostframe", "reading relay h (ranks 0)"), {0}),
    (_end_reduce_failure,
     (False, "fail", "reduce.shape_mismatch",
      "reducing round 1 of relay h (ranks 0), relay h (ranks 1)"), {0, 1}),
    (lambda: _two_relays().stop(), (True, "stop", None, "shutdown requested"), {0, 1}),
])
def test_how_the_run_ends(scenario: Any, outcome: tuple[Any, ...], closes: set[int]) -> None:
    acts = scenario()
    fin = finished(acts)
    assert fin is not None
    o = fin.outcome
    assert (o.clean, o.reason, getattr(o.error, "error_id", None), o.detail) == outcome
    assert (o.error is None) == o.clean
    assert [a for a in acts if isinstance(a, CloseConnection)] == [
        CloseConnection(c, "controller finished", False) for c in sorted(closes)]


def test_closes_that_do_not_end_the_run() -> None:
    core = started(1)
    core.connection_opened(5, 0.0)
    assert [a for a in join(core, 0, [0]) if isinstance(a, CloseConnection)] == [
        CloseConnection(5, "every rank is already covered", False)]
    core.stop()
    assert core.connection_opened(9, 1.0) == [CloseConnection(9, "controller finished")]
    core = _two_relays()
    core.declare_dead(0)
    assert core.connection_closed(0) == [CloseConnection(0, "relay with no alive rank closed")]
    assert not core.finished
    core = _two_relays()
    core.declare_dead(0)
    acts = core.receive_data(0, b"\x00" * 25)
    assert acts == [CloseConnection(0, "read error on a relay with no alive rank")]
    assert core.receive_data(0, b"\x00" * 25) == []  # no longer read


def test_misuse_names_the_event_and_the_connection() -> None:
    with pytest.raises(LocalProtocolError) as ei:
        ControllerCore(1, SALT).connection_opened(0, 0.0)
    assert str(ei.value) == "controller: event 'connection_opened' is not allowed in state Idle"
    with pytest.raises(LocalProtocolError) as ei:
        started(1).receive_data(7, b"x")
    assert ei.value.error_id == "controller.unknown_connection"
    assert str(ei.value) == "controller: connection 7 is not open"


def test_a_frame_deposited_before_its_relay_died_is_left_out() -> None:
    core = _two_relays()
    core.receive_data(0, host_frame_bytes(f32(100.0)))
    core.declare_dead(0)
    acts = core.receive_data(1, host_frame_bytes(f32(4.0, weight=2.0)))
    [b] = sent(acts, SendKind.BROADCAST)
    assert record(b).frame(SALT) == ref_reduce([None, f32(4.0, weight=2.0)])


def test_a_round_counts_the_relays_it_was_sent_to_and_forgets_deposits_at_the_end() -> None:
    core = _two_relays()
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    acts = core.receive_data(1, host_frame_bytes(f32(3.0)))
    assert all(isinstance(s.buffers, tuple) for s in sent(acts))
    notice = [a for a in acts if isinstance(a, RoundScattered)]
    assert [(n.round, n.relays) for n in notice] == [(1, 2)]
    assert core.status()["last_round"]["relays"] == 2
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    assert [r.deposited for r in core.relays()] == [True, False]
    core.stop()
    assert [r.deposited for r in core.relays()] == [False, False]


def test_a_version_3_core_folds_an_elided_host_frame() -> None:
    core = started(2, version=3)
    join(core, 0, [0])
    join(core, 1, [1])
    idle = RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(0, (2,), b"")])  # f32, elided
    core.receive_data(0, host_frame_bytes(idle))
    acts = core.receive_data(1, host_frame_bytes(f32(1.0, 3.0, weight=2.0)))
    [b, _] = sent(acts, SendKind.BROADCAST)
    assert record(b, 3).frame(SALT) == ref_reduce([None, f32(1.0, 3.0, weight=2.0)])


def test_only_a_host_frame_starts_the_round_clock() -> None:
    core = started(2, round_timeout=2.5)
    join(core, 0, [0])
    join(core, 1, [1])
    core.receive_data(0, control_bytes(HelloAck()), now=5.0)  # ignored: no deposit
    assert core.next_round_deadline() is None


def test_deaths_are_forwarded_past_ranks_already_forwarded() -> None:
    core = started(3)
    join(core, 0, [0])
    join(core, 1, [1, 2])
    assert [record(s).control for s in sent(core.declare_dead(0))] == [DeclareDead(0)]
    acts = core.declare_dead(2)
    assert [(s.conn, record(s).control) for s in sent(acts)] == [(1, DeclareDead(2))]


def test_deaths_are_forwarded_past_a_closed_relay() -> None:
    core = started(3)
    join(core, 0, [0])
    join(core, 1, [1])
    core.declare_dead(0)
    assert closed(core.connection_closed(0)) == {0}  # no alive rank: closed, accept goes on
    core.declare_dead(1)
    acts = join(core, 2, [2])  # coverage: the deaths so far are forwarded
    assert [(s.conn, s.kind) for s in sent(acts)] == [(2, SendKind.HELLO_ACK),
                                                      (1, SendKind.DECLARE_DEAD)]


_V3_HINT = ("the relay sent a protocol-version-3 Hello to this version-2 controller: the protocol "
            "versions differ (set the same --protocol-version on both sides)")


def _v3_hello(ranks: list[int]) -> bytes:
    return encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(Hello("h", ranks, [b"\x01" * 32]), 3), SALT)


def test_a_version_3_hello_at_a_version_2_controller_is_named_in_later_errors() -> None:
    core = started(2, version=2)
    core.connection_opened(0, 0.0)
    core.receive_data(0, _v3_hello([0]))  # decodes at version 2, its model_sigs unread
    join(core, 1, [1])
    fin = finished(core.receive_data(0, host_frame_bytes(f32(1.0), salt=bytes(16))))
    assert fin is not None and fin.outcome.detail == f"reading relay h (ranks 0); {_V3_HINT}"
    core = started(2, version=2)
    core.connection_opened(0, 0.0)
    core.receive_data(0, _v3_hello([0]))
    join(core, 1, [1])
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    fin = finished(core.receive_data(1, host_frame_bytes(f32(1.0, 2.0))))
    assert fin is not None and fin.outcome.detail == (
        f"reducing round 1 of relay h (ranks 0), relay h (ranks 1); relay h (ranks 0): "
        f"{_V3_HINT}")


def test_other_version_hello() -> None:
    from flodl_proto.codec.stream import other_version_hello
    v3 = _v3_hello([0])[4:]
    assert other_version_hello(v3, SALT, 2) == _V3_HINT
    v3_no_sigs = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0]), 3), SALT)
    assert other_version_hello(v3_no_sigs, SALT, 2) == _V3_HINT  # its empty list unread
    assert other_version_hello(hello_bytes([0])[4:], SALT, 2) == ""  # a version-2 Hello
    assert other_version_hello(control_bytes(RankExit(0)), SALT, 2) == ""


def test_an_empty_host_frame_names_the_connection_and_ranks() -> None:
    core = started(3)
    join(core, 0, [2, 0])
    join(core, 1, [1])
    fin = finished(core.receive_data(0, encode_mux_record_bytes(MuxRecord.host_frame(b""), SALT)))
    assert fin is not None
    err = fin.outcome.error
    assert isinstance(err, ProtocolError) and dict(err.fields) == {"conn": 0, "ranks": "[2, 0]"}


def test_a_round_notice_counts_contributors() -> None:
    core = _two_relays()
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    acts = core.receive_data(1, host_frame_bytes(f32(3.0)))
    [notice] = [a for a in acts if isinstance(a, RoundScattered)]
    assert (notice.relays, notice.contributors) == (2, 2)


def test_more_exact_messages_and_details() -> None:
    core = started(2)
    core.connection_opened(3, 0.0)
    with pytest.raises(LocalProtocolError) as ei:
        core.connection_opened(3, 0.0)
    assert str(ei.value) == "controller: connection 3 is already open"
    assert dict(ei.value.fields) == {"conn": 3, "problem": "already open"}
    with pytest.raises(InvalidValue) as ei:
        ControllerCore(2, SALT, dead_ranks=DeadRanks(3))
    assert dict(ei.value.fields) == {"ledger": 3, "world_size": 2}
    fin = finished(join(started(2), 0, [1, 1]))  # a rank twice in one Hello: no first relay
    assert fin is not None and fin.outcome.detail == "connection 0 (host 'h', ranks [1, 1])"
    core = _opened(2)
    fin = finished(core.receive_data(3, encode_channel_magic("data") + control_bytes(HelloAck())))
    assert fin is not None
    assert str(fin.outcome.error) == (
        "cluster_controller: expected relay Hello, got Control(HelloAck)")


def test_a_held_relay_end_keeps_its_detail() -> None:
    core = started(2)
    join(core, 0, [0])
    core.connection_closed(0)
    fin = finished(join(core, 1, [1]))
    assert fin is not None and fin.outcome.detail == (
        "relay h (ranks 0) closed its connection: run ends cleanly, as flodl does")


def test_records_after_the_end_in_one_chunk_are_not_read() -> None:
    core = started(1)
    join(core, 0, [0])
    data = encode_mux_record_bytes(MuxRecord.data(0, b"x"), SALT)
    acts = core.receive_data(0, data + control_bytes(RankExit(0)))
    fin = finished(acts)
    assert fin is not None
    assert fin.outcome.error.error_id == "controller.data_record"  # type: ignore[union-attr]


def test_connections_after_coverage_and_sends_are_tuples() -> None:
    core = started(1)
    acts = join(core, 0, [0])
    assert all(isinstance(s.buffers, tuple) for s in sent(acts))
    assert core.connection_opened(7, 1.0) == [
        CloseConnection(7, "every rank is already covered")]


def test_no_checkpoint_windows_unless_asked_and_no_outer_step_unless_given() -> None:
    core = started(1)
    join(core, 0, [0])
    f = RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.asarray([1.0], np.float32)),
        TensorPayload(1, (1,), np.asarray([0x3F80], np.uint16).tobytes())])  # f32, then bf16
    acts = core.receive_data(0, host_frame_bytes(f)) + core.stop()
    assert not any(isinstance(a, CheckpointWindow) for a in acts)
    [b] = sent(acts, SendKind.BROADCAST)
    got = record(b).frame(SALT)
    assert got is not None and [t.dtype for t in got.tensors] == [0, 1]  # dtypes kept


@pytest.mark.parametrize(("first", "error_id"), [
    (encode_mux_record_bytes(MuxRecord.host_frame(b""), SALT), "controller.truncated_hostframe"),
    (control_bytes(RankExit(2)), "controller.foreign_rank_exit"),
])
def test_a_held_reader_error_stops_reading_that_relay(first: bytes, error_id: str) -> None:
    core = started(2)
    join(core, 0, [0])
    assert core.receive_data(0, first + control_bytes(RankExit(0))) == []  # held, not read on
    fin = finished(join(core, 1, [1]))
    assert fin is not None and not fin.outcome.clean
    assert fin.outcome.error.error_id == error_id  # type: ignore[union-attr]


def test_reader_errors_of_a_version_3_core_carry_no_hint() -> None:
    core = started(1, version=3)
    join(core, 0, [0])
    fin = finished(core.receive_data(0, host_frame_bytes(f32(1.0), salt=bytes(16))))
    assert fin is not None and fin.outcome.detail == "reading relay h (ranks 0)"


def test_a_reduce_failure_lists_every_relays_hint() -> None:
    core = started(2, version=2)
    for conn in (0, 1):
        core.connection_opened(conn, 0.0)
        core.receive_data(conn, _v3_hello([conn]))
    core.receive_data(0, host_frame_bytes(f32(1.0)))
    fin = finished(core.receive_data(1, host_frame_bytes(f32(1.0, 2.0))))
    assert fin is not None and fin.outcome.detail == (
        f"reducing round 1 of relay h (ranks 0), relay h (ranks 1); relay h (ranks 0): "
        f"{_V3_HINT}; relay h (ranks 1): {_V3_HINT}")


def test_deaths_in_a_shared_ledger_between_inputs_are_seen_by_the_next_input() -> None:
    """The core keeps its alive relays between inputs; a death written straight into a shared
    ledger (not through the core) changes the next input's decisions all the same."""
    ledger = DeadRanks(4)
    core = started(4, dead_ranks=ledger)
    join(core, 0, [0, 1])
    join(core, 1, [2, 3])
    # round 1: both relays expected
    assert sent(core.receive_data(0, host_frame_bytes(f32(1.0))), SendKind.BROADCAST) == []
    [b0, b1] = sent(core.receive_data(1, host_frame_bytes(f32(3.0))), SendKind.BROADCAST)
    assert (b0.conn, b1.conn) == (0, 1)
    # relay 1 loses one rank: still expected; nothing forwarded until an input comes
    assert ledger.declare_dead(2)
    acts = core.receive_data(0, host_frame_bytes(f32(5.0)))
    [fwd] = sent(acts, SendKind.DECLARE_DEAD)
    assert fwd.conn == 1 and record(fwd).control == DeclareDead(2)
    assert sent(acts, SendKind.BROADCAST) == []  # relay 1 still has rank 3
    # relay 1 loses its last rank: round 2 completes on relay 0's HostFrame alone
    assert ledger.declare_dead(3)
    acts = core.tick(1.0)
    assert [record(s).control for s in sent(acts, SendKind.DECLARE_DEAD)] == [DeclareDead(3)]
    [b] = sent(acts, SendKind.BROADCAST)
    assert b.conn == 0 and b.round == 2
    assert record(b).frame(SALT) == ref_reduce([f32(5.0)])
    # its HostFrame is now a dead relay's: dropped; nothing more is forwarded
    acts = core.receive_data(1, host_frame_bytes(f32(7.0)))
    assert sent(acts) == [] and core.rounds == 2
    [b] = sent(core.receive_data(0, host_frame_bytes(f32(9.0))), SendKind.BROADCAST)
    assert b.conn == 0 and b.round == 3 and record(b).frame(SALT) == ref_reduce([f32(9.0)])


@pytest.mark.parametrize(("field", "kwargs", "value", "reason"), [
    ("world_size", {"world_size": 2**33}, 2**33,
     "not a whole number in 1..4294967295 (ranks are u32)"),
    ("world_size", {"world_size": 2.0}, 2.0,
     "not a whole number in 1..4294967295 (ranks are u32)"),
    ("world_size", {"world_size": True}, True,
     "not a whole number in 1..4294967295 (ranks are u32)"),
    ("reduce_threads", {"world_size": 2, "reduce_threads": -3}, -3, "not a whole number >= 1"),
    ("reduce_threads", {"world_size": 2, "reduce_threads": 0}, 0, "not a whole number >= 1"),
    ("reduce_threads", {"world_size": 2, "reduce_threads": 2.0}, 2.0, "not a whole number >= 1"),
])
def test_core_arguments_follow_the_codec_integer_rule(field: str, kwargs: dict[str, Any],
                                                      value: Any, reason: str) -> None:
    """``ControllerCore(2**33)`` waited for ranks no Hello can carry, ``2.0`` and ``True`` were
    taken, and ``reduce_threads=-3`` was silently 1."""
    with pytest.raises(InvalidValue) as ei:
        ControllerCore(salt=SALT, **kwargs)
    assert not ei.value.remote and ei.value.error_id == "controller.bad_argument"
    assert str(ei.value) == f"cluster_controller: {field} = {value!r} is invalid: {reason}"
    assert ControllerCore(2, SALT, reduce_threads=np.int64(3)).world_size == 2


def test_bytes_out_adds_up_every_send() -> None:
    # HelloAcks, a forwarded DeclareDead and a Broadcast to two relays: bytes_out is their sum,
    # the Broadcast counted once per relay it went to
    core = started(4)
    acts = join(core, 0, [0, 1]) + join(core, 1, [2, 3])
    acks = sent(acts, SendKind.HELLO_ACK)
    assert len(acks) == 2 and core.bytes_out == acks[0].nbytes + acks[1].nbytes
    [dd] = sent(core.declare_dead(3), SendKind.DECLARE_DEAD)
    assert core.bytes_out == acks[0].nbytes + acks[1].nbytes + dd.nbytes
    core.receive_data(0, host_frame_bytes(f32(1.0, 2.0)))
    bcasts = sent(core.receive_data(1, host_frame_bytes(f32(3.0, 4.0))), SendKind.BROADCAST)
    assert len(bcasts) == 2 and bcasts[0].nbytes == bcasts[1].nbytes
    total = acks[0].nbytes + acks[1].nbytes + dd.nbytes + 2 * bcasts[0].nbytes
    assert core.bytes_out == total and type(core.bytes_out) is int
    assert core.status()["bytes_out"] == total


def test_the_end_keeps_the_actions_queued_before_it_with_checkpoints() -> None:
    # one input queues a HelloAck, RelayJoined and StopAccepting, then fails the run: with
    # checkpoint windows on, the end adds the last window to the actions, it does not replace them
    core = started(1, checkpoint=True)
    core.connection_opened(0, 0.0)
    acts = core.receive_data(0, hello_bytes([0]) + b"\x00" * 64)
    assert [type(a) for a in acts] == [SendTo, RelayJoined, StopAccepting, CloseConnection,
                                       Finished]
    assert acts[0].kind is SendKind.HELLO_ACK
    fin = finished(acts)
    assert fin is not None and not fin.outcome.clean


@pytest.mark.parametrize(("host", "shown"), [
    ("h0", "'h0'"),
    ("h\n0", "'h\\n0'"),
    ("h\u034f0", "'h\\u034f0'"),
    ("h0\U000e0100", "'h0\\U000e0100'"),
])
def test_the_relay_joined_line_quotes_a_host_name_as_the_labels_do(host: str,
                                                                   shown: str) -> None:
    """The controller command's stdout line of a relay that joined quotes the peer's host name
    with every character that does not show as itself escaped, as the relay labels of its log
    lines do (``repr`` left a combining mark or a variation selector as it is)."""
    from flodl_proto.commands.controller import notice_line
    from flodl_proto.fsm.events import RelayJoined

    assert notice_line(RelayJoined(0, 0, host, [0, 1])) == (
        f"relay 0 joined: host {shown} ranks [0, 1]")

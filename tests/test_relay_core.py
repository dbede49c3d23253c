"""The sans-IO relay core (:class:`~flodl_proto.fsm.relay_core.RelayCore`): the accept phase's
rules one by one, and a Hypothesis state machine over the fold phase.

The state machine builds deposits that are valid for the round by default (the round's schema,
kind and a weight from a small exact set; small integer values, exact in f32 and bf16, so every
sum is exact too; an elided deposit is an idle rank's, weight 0.0 as upstream sends it);
faults (a bad tag, a second deposit in one round, a schema change) are a separate rule that
fires rarely. Every HostFrame the core ships is checked against a plainly
written reference kept in this test: the element-wise integer sum of the round's deposits (an
elided deposit adds zeros), the sum of their weights, the first deposit's kind, and an elided
tensor exactly when every deposit of the round was elided. ``test_relay_core_state_machine``
runs it and checks, with the counts its rules record (also reported as ``hypothesis.event``),
that the ``ci`` profile reaches multi-deposit summed rounds, deaths mid-round, RankExit and
elided deposits (version 3).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from flodl_proto.codec import (
    END_OF_STREAM,
    DeclareDead,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_len_prefix,
    decode_mux_record,
    decode_round_frame,
    encode_frame_record,
    encode_handshake,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
    expect_channel_magic,
)
from flodl_proto.codec.auth import Premac, new_mac
from flodl_proto.errors import (
    AuthenticationError,
    InvalidValue,
    LimitExceeded,
    LocalProtocolError,
    RemoteProtocolError,
    SchemaMismatch,
    SequenceError,
    TruncatedInput,
)
from flodl_proto.fsm.events import (
    AckRank,
    CloseRank,
    DrainUpstream,
    FanOut,
    Finished,
    RankConnected,
    SendUpstream,
    UpstreamKind,
)
from flodl_proto.fsm.lifecycle import RelayState
from flodl_proto.fsm.relay_core import RelayCore
from flodl_proto.reduce import sum_frames
from flodl_proto.spec import CHANNEL_MAGIC_DATA

from .relay_core_util import connected_core, signed_record

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
WEIGHTS = (0.25, 0.5, 1.0, 2.0)
SHAPES = ((1,), (3,), (2, 2))

#: how often the state machine reached each path (reset by the test that runs it)
REACHED: Counter[str] = Counter()


def _reach(name: str) -> None:
    event(name)
    REACHED[name] += 1


def _record(rec: MuxRecord, version: int) -> MuxRecord:
    """``rec`` as the runner hands it over: decoded from its signed bytes."""
    return signed_record(rec, version, SALT)


def _upstream(actions: list[Any], kind: UpstreamKind) -> list[MuxRecord]:
    out = []
    for a in actions:
        if isinstance(a, SendUpstream) and a.kind is kind:
            wire = b"".join(bytes(b) for b in a.buffers)
            res = decode_mux_record(wire, SALT, version=3, ceiling=1 << 40)
            assert res is not END_OF_STREAM and res[1] == len(wire)
            out.append(res[0])
    return out


def _connected_core(ranks: tuple[int, ...], world: int, version: int) -> RelayCore:
    return connected_core(ranks, world, version, SALT)


# -- accept phase and dial ----------------------------------------------------------------------
def test_accept_dial_and_hello() -> None:
    core = RelayCore([3, 1], 4, SALT, version=3, host="h7")
    assert core.ranks == (1, 3) and core.missing_ranks() == [1, 3]
    acts = core.rank_handshake(encode_handshake(3, 4, 3))
    assert isinstance(acts[0], AckRank) and acts[0].rank == 3 and len(acts[0].ack) == 8
    assert acts[1:] == [RankConnected(3)] and core.missing_ranks() == [1]
    assert core.state == RelayState.ACCEPTING_RANKS
    core.rank_handshake(encode_handshake(1, 4, 3))
    assert core.state == RelayState.DIALING and core.missing_ranks() == []
    (send,) = core.dialed()
    assert isinstance(send, SendUpstream) and send.kind is UpstreamKind.HELLO
    wire = b"".join(bytes(b) for b in send.buffers)
    assert expect_channel_magic(wire, CHANNEL_MAGIC_DATA, "relay") == 4
    res = decode_mux_record(wire[4:], SALT, version=3)
    assert res is not END_OF_STREAM
    hello = res[0].control
    assert hello is not None and hello.host == "h7" and list(hello.ranks) == [1, 3]
    assert list(hello.model_sigs) == []
    assert core.state == RelayState.AWAITING_HELLO_ACK


@pytest.mark.parametrize(("hs", "error", "acked"), [
    (encode_handshake(0, 5, 2), InvalidValue, False),       # world size 5, not 4
    (encode_handshake(0, 4, 2)[:9], TruncatedInput, False),
    (encode_handshake(2, 4, 2), InvalidValue, True),         # not one of this host's ranks
])
def test_bad_handshake_fails_the_relay(hs: bytes, error: type[Exception], acked: bool) -> None:
    core = RelayCore([0, 1], 4, SALT, version=2)
    acts = core.rank_handshake(hs)
    assert [type(a) for a in acts] == ([AckRank, Finished] if acked else [Finished])
    fin = acts[-1]
    assert isinstance(fin, Finished) and isinstance(fin.outcome.error, error)
    assert isinstance(fin.outcome.error, RemoteProtocolError)
    assert core.finished and core.state == RelayState.DONE
    assert core.rank_handshake(encode_handshake(1, 4, 2)) == []


def test_duplicate_rank_is_acked_then_fails() -> None:
    core = RelayCore([0, 1], 2, SALT)
    core.rank_handshake(encode_handshake(0, 2, 2))
    acts = core.rank_handshake(encode_handshake(0, 2, 2))
    assert [type(a) for a in acts] == [AckRank, Finished]
    fin = acts[1]
    assert isinstance(fin, Finished)
    assert str(fin.outcome.error) == "relay: duplicate rank 0 connected on loopback"


@pytest.mark.parametrize(("rec", "message"), [
    (None, "relay: controller closed connection before HelloAck; it may have refused this "
           "relay's Hello (a 4-byte payload) for another protocol version or salt, a rank "
           "outside the controller's world size, or a frame ceiling below 4 bytes"),
    (MuxRecord.broadcast(b"x"), "relay: expected HelloAck from controller, got BROADCAST"),
    (MuxRecord.control_msg(DeclareDead(0)), "relay: expected HelloAck from controller, got "
                                            "DeclareDead"),
])
def test_anything_but_hello_ack_fails(rec: MuxRecord | None, message: str) -> None:
    core = RelayCore([0], 1, SALT)
    core.rank_handshake(encode_handshake(0, 1, 2))
    core.dialed()
    (fin,) = core.upstream_record(rec)
    assert isinstance(fin, Finished) and not fin.outcome.clean
    assert str(fin.outcome.error) == message


@pytest.mark.parametrize(("ranks", "world"), [([], 2), ([0, 0], 2), ([2], 2), ([0], 0)])
def test_bad_rank_set_is_a_local_error(ranks: list[int], world: int) -> None:
    with pytest.raises(InvalidValue) as ei:
        RelayCore(ranks, world, SALT)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "relay.bad_rank_set"


@pytest.mark.parametrize(("host", "length"), [("h" * 256, 256), ("\u00e9" * 128, 256),
                                              ("\U0001f600" * 70, 280)])
def test_a_host_name_longer_than_a_hello_carries_is_a_local_error(host: str,
                                                                   length: int) -> None:
    """The host name is counted in UTF-8 bytes, at most ``MAX_HELLO_HOST_LEN`` (255)."""
    with pytest.raises(InvalidValue) as ei:
        RelayCore([0], 1, SALT, host=host)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "relay.host_too_long"
    assert dict(ei.value.fields) == {"length": length, "max": 255}
    assert str(ei.value) == (f"relay: host name is {length} bytes (UTF-8), more than the 255 "
                             "a Hello may carry")


@pytest.mark.parametrize("host", ["h" * 255, "\u00e9" * 127 + "h", ""])
def test_a_host_name_of_up_to_255_utf8_bytes_is_announced(host: str) -> None:
    assert RelayCore([0], 1, SALT, host=host).host == host


def test_inputs_out_of_phase_are_local_errors() -> None:
    core = RelayCore([0], 1, SALT)
    with pytest.raises(SequenceError) as ei:
        core.dialed()
    assert ei.value.error_id == "relay.bad_event"
    with pytest.raises(LocalProtocolError):
        core.upstream_record(None)
    with pytest.raises(LocalProtocolError):
        core.controller_closed()
    core = _connected_core((0,), 1, 2)
    with pytest.raises(LocalProtocolError):
        core.rank_handshake(encode_handshake(0, 1, 2))


def test_last_rank_leaving_drains_then_finishes_cleanly() -> None:
    core = _connected_core((0, 1), 2, 2)
    acts = core.rank_left(1)
    (exit_rec,) = _upstream(acts, UpstreamKind.RANK_EXIT)
    assert exit_rec.control == RankExit(1) and not any(isinstance(a, DrainUpstream)
                                                       for a in acts)
    assert core.rank_left(1) == []  # a repeat is a no-op
    acts = core.rank_left(0)
    assert isinstance(acts[-1], DrainUpstream) and core.state == RelayState.DRAINING
    (fin,) = core.drained()
    assert isinstance(fin, Finished) and fin.outcome.clean and fin.outcome.reason == "drained"


def test_single_rank_host_ships_each_frame_verbatim() -> None:
    """A one-rank host (left out of the state machine, whose hosts have 2-4 ranks): every
    deposit completes its round and goes upstream byte for byte."""
    core = _connected_core((5,), 6, 3)
    for weight in (1.0, 0.5):
        frame = RoundFrame(RoundKind.MODEL, weight, [TensorPayload.from_array(
            np.asarray([1.5, -2.0], np.float32))])
        blob = encode_round_frame_bytes(frame, SALT)
        (rec,) = _upstream(core.rank_frame(5, blob), UpstreamKind.HOST_FRAME)
        assert bytes(rec.payload) == blob
    assert core.fold.rounds_completed == 2


# -- the fold phase as a state machine ----------------------------------------------------------
class RelayCoreMachine(RuleBasedStateMachine):
    """A RelayCore in its fold phase and a plainly written model of the round."""

    @initialize(version=st.sampled_from([2, 3]), n=st.integers(2, 4), first=st.integers(0, 3),
                 extra=st.integers(0, 2),
                 schema=st.lists(st.tuples(st.sampled_from(["f32", "bf16"]),
                                           st.sampled_from(SHAPES)), min_size=1, max_size=2))
    def setup(self, version: int, n: int, first: int, extra: int,
              schema: list[tuple[str, tuple[int, ...]]]) -> None:
        self.version = version
        self.ranks = tuple(range(first, first + n))
        self.schema = schema
        self.core = _connected_core(self.ranks, first + n + extra, version)
        self.dead: set[int] = set()      # dead in the fold (left, or declared dead)
        self.declared: set[int] = set()  # declared dead by the controller
        self.gone: set[int] = set()      # left: their reader is over
        self.finished = False
        self._new_round()

    # -- the model -------------------------------------------------------------------------------
    def _new_round(self) -> None:
        self.deposits: dict[int, tuple[list[list[int]] | None, float, RoundKind]] = {}

    def _expected_complete(self) -> bool:
        return bool(self.deposits) and all(r in self.deposits or r in self.dead
                                           for r in self.ranks)

    def _check_host_frame(self, actions: list[Any]) -> None:
        frames = _upstream(actions, UpstreamKind.HOST_FRAME)
        if not self._expected_complete():
            assert frames == []
            return
        assert len(frames) == 1, actions
        res = decode_round_frame(frames[0].payload, SALT)
        assert res is not END_OF_STREAM
        frame = res[0]
        contributions = list(self.deposits.values())
        assert frame.kind is contributions[0][2]
        assert frame.weight == sum(w for _, w, _ in contributions)
        assert len(frame.tensors) == len(self.schema)
        all_elided = all(vals is None for vals, _, _ in contributions)
        for ti, (dtype, shape) in enumerate(self.schema):
            t = frame.tensors[ti]
            assert t.dtype == (0 if dtype == "f32" else 1) and tuple(t.shape) == shape
            expected = [0] * _numel(shape)
            for vals, _, _ in contributions:
                if vals is not None:
                    expected = [a + b for a, b in zip(expected, vals[ti], strict=True)]
            if all_elided:
                assert t.elided
            else:
                assert not t.elided
                got = [float(x) for x in np.asarray(t.array(), dtype=np.float32).ravel()]
                assert got == [float(x) for x in expected]
        summed = sum(vals is not None for vals, _, _ in contributions)
        _reach("round completed")
        if summed >= 2:
            _reach("multi-deposit summed round")
        self._new_round()

    def _frame(self, values: list[list[int]] | None, weight: float, kind: RoundKind,
               schema: list[tuple[str, tuple[int, ...]]]) -> bytes:
        tensors = []
        for ti, (dtype, shape) in enumerate(schema):
            if values is None:
                tensors.append(TensorPayload(0 if dtype == "f32" else 1, shape, b""))
                continue
            npd = np.float32 if dtype == "f32" else ml_dtypes.bfloat16
            tensors.append(TensorPayload.from_array(np.asarray(values[ti], np.float32)
                                                    .astype(npd).reshape(shape)))
        return encode_round_frame_bytes(RoundFrame(kind, weight, tensors), SALT)

    def _round_kind(self, control: bool) -> RoundKind:
        if self.deposits:
            return next(iter(self.deposits.values()))[2]
        return RoundKind.CONTROL if control else RoundKind.MODEL

    def _finish_expected(self, actions: list[Any], error: type[Exception] | None) -> None:
        fin = [a for a in actions if isinstance(a, Finished)]
        assert len(fin) == 1 and actions[-1] is fin[0], actions
        if error is None:
            assert fin[0].outcome.clean
        else:
            assert isinstance(fin[0].outcome.error, error)
            assert isinstance(fin[0].outcome.error, RemoteProtocolError)
        self.finished = True

    # -- valid inputs (the default) --------------------------------------------------------------
    def _deposit(self, data: st.DataObject, rank: int, weight: float, control: bool,
                 elide: int) -> None:
        values: list[list[int]] | None = [
            data.draw(st.lists(st.integers(-8, 8), min_size=_numel(s), max_size=_numel(s)))
            for _, s in self.schema
        ]
        if self.version == 3 and elide == 0:
            values, weight = None, 0.0  # an idle rank: weight 0.0, every payload elided
        kind = self._round_kind(control)
        blob = self._frame(values, weight, kind, self.schema)
        actions = self.core.rank_frame(rank, memoryview(blob))
        if rank in self.dead:  # declared dead by the controller: its frames are dropped
            assert actions == []
            _reach("frame from a dead rank dropped")
            return
        if values is None:
            _reach("elided deposit (v3)")
        self.deposits[rank] = (values, weight, kind)
        assert not any(isinstance(a, Finished) for a in actions), actions
        self._check_host_frame(actions)

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), weight=st.sampled_from(WEIGHTS), control=st.booleans(),
          elide=st.integers(0, 5))
    def deposit(self, data: st.DataObject, weight: float, control: bool, elide: int) -> None:
        """A valid frame for the round from an alive local rank that has not deposited yet."""
        waiting = [r for r in self.ranks if r not in self.deposits and r not in self.dead]
        if waiting:
            self._deposit(data, data.draw(st.sampled_from(waiting)), weight, control, elide)

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), weight=st.sampled_from(WEIGHTS), control=st.booleans(),
          elide=st.integers(0, 5))
    def another_deposit(self, data: st.DataObject, weight: float, control: bool,
                        elide: int) -> None:
        """Deposits are most of the traffic: the same rule again doubles their weight."""
        self.deposit(data, weight, control, elide)

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), gate=st.integers(0, 3))
    def late_frame_from_a_dead_rank(self, data: st.DataObject, gate: int) -> None:
        """A rank the controller declared dead still sends a frame: dropped."""
        late = [r for r in self.ranks if r in self.dead and r not in self.gone]
        if late and not gate:
            self._deposit(data, data.draw(st.sampled_from(late)), 1.0, False, 1)

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), gate=st.integers(0, 1))
    def rank_leaves(self, data: st.DataObject, gate: int) -> None:
        """Now and then a local rank's stream ends: out of the barrier, RankExit, and the
        drain after the last one."""
        if gate:
            return
        present = [r for r in self.ranks if r not in self.gone]
        rank = data.draw(st.sampled_from(present))
        if self.deposits and not self._expected_complete() and rank not in self.dead:
            _reach("death mid-round")
        self.dead.add(rank)
        self.gone.add(rank)
        actions = self.core.rank_left(rank)
        exits = _upstream(actions, UpstreamKind.RANK_EXIT)
        assert [e.control for e in exits] == [RankExit(rank)]
        _reach("RankExit")
        self._check_host_frame(actions)
        if len(self.gone) == len(self.ranks):
            assert isinstance(actions[-1], DrainUpstream)
            assert self.core.state == RelayState.DRAINING
            self._finish_expected(self.core.drained(), None)
        else:
            assert not any(isinstance(a, DrainUpstream) for a in actions)

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), foreign=st.integers(0, 5))
    def controller_declares_dead(self, data: st.DataObject, foreign: int) -> None:
        """Now and then DeclareDead from the controller: a local rank leaves the barrier (no
        RankExit); a rank of another host is ignored."""
        if foreign > 1:
            return
        if foreign == 0:
            rank = self.ranks[-1] + 1
            actions = self.core.upstream_record(
                _record(MuxRecord.control_msg(DeclareDead(rank), self.version), self.version))
            assert actions == []
            return
        rank = data.draw(st.sampled_from(self.ranks))
        if self.deposits and not self._expected_complete() and rank not in self.dead:
            _reach("death mid-round")
        self.dead.add(rank)
        self.declared.add(rank)
        actions = self.core.upstream_record(
            _record(MuxRecord.control_msg(DeclareDead(rank), self.version), self.version))
        assert _upstream(actions, UpstreamKind.RANK_EXIT) == []
        self._check_host_frame(actions)

    @precondition(lambda self: not self.finished)
    @rule(payload=st.binary(max_size=40))
    def broadcast(self, payload: bytes) -> None:
        """A Broadcast goes verbatim to the alive local ranks."""
        actions = self.core.upstream_record(_record(MuxRecord.broadcast(payload), self.version))
        assert len(actions) == 1 and isinstance(actions[0], FanOut)
        fan = actions[0]
        assert bytes(fan.payload) == payload
        assert decode_len_prefix(fan.prefix) == len(payload)
        assert fan.ranks == tuple(r for r in self.ranks if r not in self.dead)

    @precondition(lambda self: not self.finished)
    @rule(which=st.sampled_from(["rank_exit", "data", "host_frame", "hello_ack"]),
          gate=st.integers(0, 2))
    def other_controller_records_are_ignored(self, which: str, gate: int) -> None:
        if gate:
            return
        rec = {"rank_exit": MuxRecord.control_msg(RankExit(0), self.version),
               "data": MuxRecord.data(0, b"abc"), "host_frame": MuxRecord.host_frame(b"x"),
               "hello_ack": MuxRecord.control_msg(HelloAck(), self.version)}[which]
        assert self.core.upstream_record(_record(rec, self.version)) == []

    @precondition(lambda self: not self.finished)
    @rule(gate=st.integers(0, 19), how=st.sampled_from(["eof", "write", "stop"]))
    def controller_goes_away(self, gate: int, how: str) -> None:
        """Rarely: the controller closes (or the relay is stopped): a clean end, but a failure
        when the controller had declared every local rank dead."""
        if gate:
            return
        if how == "eof":
            actions = self.core.upstream_record(None)
        elif how == "write":
            actions = self.core.controller_closed("write failed")
        else:
            actions = self.core.stop()
        dropped = how != "stop" and self.declared >= set(self.ranks)
        if dropped:
            _reach("closed after every local rank was declared dead")
        self._finish_expected(actions, SequenceError if dropped else None)

    # -- faults (a separate, rare rule) ----------------------------------------------------------
    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), gate=st.integers(0, 11))
    def deposit_with_a_bad_tag(self, data: st.DataObject, gate: int) -> None:
        """Rarely: a frame whose auth tag does not match."""
        if not gate:
            self._faulty_deposit(data, "tag")

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), gate=st.integers(0, 11))
    def second_deposit_in_a_round(self, data: st.DataObject, gate: int) -> None:
        """Rarely: a rank deposits twice in one round."""
        if not gate:
            self._faulty_deposit(data, "double")

    @precondition(lambda self: not self.finished)
    @rule(data=st.data(), gate=st.integers(0, 11))
    def deposit_of_another_schema(self, data: st.DataObject, gate: int) -> None:
        """Rarely: a frame with one tensor more than the round's."""
        if not gate:
            self._faulty_deposit(data, "schema")

    def _faulty_deposit(self, data: st.DataObject, fault: str) -> None:
        """A deposit the fold must reject, which ends the relay with that error."""
        alive = [r for r in self.ranks if r not in self.dead]
        if not alive:
            return
        kind = self._round_kind(False)
        values = [[1] * _numel(s) for _, s in self.schema]
        if fault == "double":
            done = [r for r in alive if r in self.deposits]
            if not done:
                return
            rank, error = done[0], SequenceError
            blob = self._frame(values, 1.0, kind, self.schema)
        elif fault == "schema":
            if not self.deposits:
                return
            rank = data.draw(st.sampled_from([r for r in alive if r not in self.deposits]))
            schema = [*self.schema, ("f32", (1,))]
            blob, error = self._frame([*values, [1]], 1.0, kind, schema), SchemaMismatch
        else:
            waiting = [r for r in alive if r not in self.deposits]
            if not waiting:
                return
            rank = data.draw(st.sampled_from(waiting))
            raw = bytearray(self._frame(values, 1.0, kind, self.schema))
            raw[-1] ^= 0x01
            blob, error = bytes(raw), AuthenticationError
        _reach(f"fault: {fault}")
        self._finish_expected(self.core.rank_frame(rank, blob), error)

    # -- after the end every input is a no-op ----------------------------------------------------
    @precondition(lambda self: self.finished)
    @rule()
    def inputs_after_the_end_do_nothing(self) -> None:
        assert self.core.rank_frame(self.ranks[0], b"\x00") == []
        assert self.core.rank_left(self.ranks[0]) == []
        assert self.core.upstream_record(None) == []
        assert self.core.stop() == []

    @invariant()
    def lifecycle_agrees(self) -> None:
        if not hasattr(self, "core"):
            return
        assert self.core.finished == self.finished
        if not self.finished:
            want = (RelayState.DRAINING if len(self.gone) == len(self.ranks)
                    else RelayState.FOLDING)
            assert self.core.state == want
            assert self.core.fold.alive_ranks == tuple(r for r in self.ranks
                                                       if r not in self.dead)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@pytest.mark.stateful
def test_relay_core_state_machine() -> None:
    """Runs the machine with the loaded profile (``ci`` by default), then checks that it reached
    the paths worth testing: most completed rounds summed two or more deposits, and deaths
    mid-round, RankExit and elided deposits occurred."""
    REACHED.clear()
    run_state_machine_as_test(RelayCoreMachine, settings=settings(stateful_step_count=40))
    rounds = REACHED["round completed"]
    assert rounds >= 20, dict(REACHED)
    assert REACHED["multi-deposit summed round"] * 2 > rounds, dict(REACHED)
    for path in ("death mid-round", "RankExit", "elided deposit (v3)", "fault: tag",
                 "fault: double", "fault: schema"):
        assert REACHED[path] >= 1, (path, dict(REACHED))


# -- additions to upstream: the rank deadline, a host declared dead --------------------------------
def _blob(value: float, weight: float = 1.0) -> bytes:
    return encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, weight, [
        TensorPayload.from_array(np.asarray([value, 2 * value], np.float32))]), SALT)


def _timed_core(timeout: float | None) -> RelayCore:
    core = RelayCore((0, 1, 2), 3, SALT, version=2, host="h0", rank_timeout=timeout)
    for r in (0, 1, 2):
        core.rank_handshake(encode_handshake(r, 3, 2))
    core.dialed()
    core.upstream_record(_record(MuxRecord.control_msg(HelloAck(), 2), 2))
    return core


def test_rank_deadline_declares_the_silent_rank_dead_and_ships_the_others() -> None:
    core = _timed_core(1.5)
    assert core.next_deadline() is None
    assert core.rank_frame(0, _blob(1.0), now=10.0) == []
    assert core.next_deadline() == 11.5
    assert core.rank_frame(2, _blob(3.0), now=10.5) == []
    assert core.tick(11.4) == []
    acts = core.tick(11.5)
    (host_frame,) = _upstream(acts, UpstreamKind.HOST_FRAME)
    frame = decode_round_frame(host_frame.payload, SALT)[0]
    assert frame.weight == 2.0 and frame.tensors[0].array().tolist() == [4.0, 8.0]
    assert CloseRank(1, "rank timeout") in acts
    assert _upstream(acts, UpstreamKind.RANK_EXIT) == []  # no RankExit: that ends the run
    assert core.rank_timeouts == [{"round": 1, "rank": 1, "waited": 1.5}]
    assert core.fold.alive_ranks == (0, 2) and core.next_deadline() is None
    # its stream ends afterwards: still no RankExit; the others fold on
    assert core.rank_left(1) == []
    core.rank_frame(0, _blob(1.0), now=20.0)
    (rec,) = _upstream(core.rank_frame(2, _blob(1.0), now=20.1), UpstreamKind.HOST_FRAME)
    assert decode_round_frame(rec.payload, SALT)[0].weight == 2.0
    assert not core.finished


def test_rank_deadline_is_off_by_default_and_validated() -> None:
    core = _timed_core(None)
    core.rank_frame(0, _blob(1.0), now=0.0)
    assert core.next_deadline() is None and core.tick(1e9) == []
    assert core.fold.alive_ranks == (0, 1, 2)
    for bad in (0.0, -2.0, float("nan")):
        with pytest.raises(InvalidValue,
                           match="rank_timeout must be a finite number of seconds above 0"):
            RelayCore((0,), 1, SALT, rank_timeout=bad)


@pytest.mark.parametrize("end", ["end of stream", "failed write"])
def test_every_rank_declared_dead_then_closed_fails_the_relay_with_a_clear_message(
        end: str, caplog: pytest.LogCaptureFixture) -> None:
    def close(core: RelayCore) -> list[Any]:
        # the runner meets the closed connection by its reader or by a write, whichever first
        return (core.upstream_record(None) if end == "end of stream"
                else core.controller_closed("connection closed while writing: Broken pipe"))

    core = _connected_core((2, 3), 4, 3)
    for r in (2, 3):
        assert _upstream(core.upstream_record(_record(
            MuxRecord.control_msg(DeclareDead(r), 3), 3)), UpstreamKind.RANK_EXIT) == []
    (fin,) = close(core)
    assert isinstance(fin, Finished) and not fin.outcome.clean
    assert isinstance(fin.outcome.error, SequenceError)
    assert str(fin.outcome.error) == (
        "the controller declared every rank of this host dead (ranks [2, 3]) and closed the "
        "connection; the run goes on without this host")
    # only some ranks declared dead: the closed connection is the usual clean end
    core = _connected_core((2, 3), 4, 3)
    core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(2), 3), 3))
    with caplog.at_level(logging.INFO, logger="flodl_proto.fsm.relay_core"):
        caplog.clear()
        (fin,) = close(core)
    assert isinstance(fin, Finished) and fin.outcome.clean
    # the core notes an end of stream; a failed write is the runner's to report (it names it)
    notes = [r.getMessage() for r in caplog.records
             if r.getMessage() == "relay h0: controller closed the connection"]
    assert len(notes) == (1 if end == "end of stream" else 0), caplog.records


def test_rank_deadline_records_the_wait_to_the_millisecond_and_stops_when_finished() -> None:
    core = _timed_core(1.5)
    core.rank_frame(0, _blob(1.0), now=10.0)
    core.tick(11.56789)
    assert core.rank_timeouts == [{"round": 1, "rank": 1, "waited": 1.568},
                                  {"round": 1, "rank": 2, "waited": 1.568}]
    core = _timed_core(1.5)
    core.rank_frame(0, _blob(1.0), now=10.0)
    assert core.next_deadline() == 11.5
    core.stop()
    assert core.finished and core.next_deadline() is None


def test_fail_ends_the_relay_with_the_error_once() -> None:
    core = _timed_core(None)
    err = RemoteProtocolError("boom")
    (fin,) = [a for a in core.fail(err) if isinstance(a, Finished)]
    assert not fin.outcome.clean and fin.outcome.error is err and fin.outcome.reason == "fail"
    assert core.fail(RemoteProtocolError("later")) == [] and core.outcome is fin.outcome


def test_clean_ends_carry_their_detail() -> None:
    core = _connected_core((0,), 1, 2)
    core.rank_left(0)
    (fin,) = core.drained()
    assert isinstance(fin, Finished) and fin.outcome.detail == "every local rank left"
    core = _connected_core((0,), 1, 2)
    (fin,) = [a for a in core.controller_closed() if isinstance(a, Finished)]
    assert fin.outcome.clean and fin.outcome.reason == "controller_closed"
    assert fin.outcome.detail == "the controller closed the connection"
    core = _connected_core((0,), 1, 2)
    (fin,) = [a for a in core.controller_closed("write failed") if isinstance(a, Finished)]
    assert fin.outcome.detail == "write failed"
    core = _connected_core((0,), 1, 2)
    (fin,) = [a for a in core.upstream_record(None) if isinstance(a, Finished)]
    assert fin.outcome.clean and fin.outcome.reason == "controller_closed"
    assert fin.outcome.detail == "the controller closed the connection"


@pytest.mark.parametrize(("ranks", "world", "reason"), [
    ([], 1, "no ranks"), ([0, 0], 2, "a rank is listed twice"),
    ([0], 0, "world_size must be > 0"),
    # the rank out of range is named, and why
    ([3], 2, "rank 3 is not below world_size 2 (the ranks of a world of 2 are 0..1)"),
    ([0, -1], 4, "rank -1 is negative (the ranks of a world of 4 are 0..3)"),
    # a bool, a float or text was truncated or taken as 0 / 1; a world size beyond u32 taken
    ([True], 2, "every rank must be a whole number (not a bool, a float or text)"),
    ([0, 1.0], 2, "every rank must be a whole number (not a bool, a float or text)"),
    ([0], 2.0, "world_size must be a whole number in 1..4294967295"),
    ([0], True, "world_size must be a whole number in 1..4294967295"),
    ([0], 2**33, "world_size must be a whole number in 1..4294967295"),
    # text is quoted: world_size '2', not world_size 2 beside "must be a whole number"
    ([0], "2", "world_size must be a whole number in 1..4294967295")])
def test_a_bad_rank_set_names_its_reason(ranks: list[int], world: int, reason: str) -> None:
    with pytest.raises(InvalidValue) as ei:
        RelayCore(ranks, world, SALT)
    assert dict(ei.value.fields) == {"ranks": ranks, "world_size": world, "reason": reason}
    assert str(ei.value) == (f"relay: rank set {ranks} is invalid for world_size {world!r}: "
                             f"{reason}")


@pytest.mark.parametrize(("ranks", "shown", "got"), [
    (b"\x00\x01", "b'\\x00\\x01'", "bytes"),
    (bytearray(b"\x00\x01"), "bytearray(b'\\x00\\x01')", "bytearray"),
    (memoryview(b"\x00\x01"), "b'\\x00\\x01'", "memoryview"),
    ("01", "'01'", "str")])
def test_a_rank_set_of_bytes_or_text_is_refused(ranks: Any, shown: str, got: str) -> None:
    """Bytes were iterated to their byte values (b"\\x00\\x01" was the ranks 0 and 1); text
    was refused by its characters (rank set ['0', '1'])."""
    reason = (f"ranks must be an iterable of whole numbers, got {got} (each of its items would "
              "be taken as a rank; pass a list of ints)")
    with pytest.raises(InvalidValue) as ei:
        RelayCore(ranks, 2, SALT)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "relay.bad_rank_set"
    assert ei.value.fields["reason"] == reason
    assert str(ei.value) == f"relay: rank set {shown} is invalid for world_size 2: {reason}"
    assert RelayCore([0, 1], 2, SALT).ranks == (0, 1)


def test_a_rank_set_given_as_a_mapping_is_refused() -> None:
    """A dict's keys were taken as the ranks (its values silently dropped); a set is a rank
    set."""
    reason = ("ranks must be an iterable of whole numbers, got dict (its keys would be taken "
              "as the ranks; pass a list of ints)")
    with pytest.raises(LocalProtocolError) as ei:
        RelayCore({0: 1}, 4, SALT)
    assert ei.value.error_id == "relay.bad_rank_set"
    assert str(ei.value) == f"relay: rank set {{0: 1}} is invalid for world_size 4: {reason}"
    assert RelayCore({1, 0}, 4, SALT).ranks == (0, 1)


@pytest.mark.parametrize(("ranks", "got"), [(None, "None"), (5, "int")])
def test_a_rank_set_that_is_no_iterable_is_refused(ranks: Any, got: str) -> None:
    """None or a number raised a bare TypeError ('NoneType' object is not iterable)."""
    with pytest.raises(InvalidValue) as ei:
        RelayCore(ranks, 2, SALT)
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == (f"relay: rank set {ranks} is invalid for world_size 2: ranks must "
                             f"be an iterable of whole numbers, got {got}")


def test_out_of_phase_inputs_name_the_event_and_state() -> None:
    core = _connected_core((0,), 1, 2)
    with pytest.raises(SequenceError) as ei:
        core.rank_handshake(encode_handshake(0, 1, 2))
    assert dict(ei.value.fields) == {"event": "rank_handshake", "state": "Folding"}
    with pytest.raises(SequenceError) as ei:
        RelayCore([0], 1, SALT).upstream_record(None)
    assert dict(ei.value.fields) == {"event": "upstream_record", "state": "AcceptingRanks"}


def test_a_rank_of_another_host_fails_the_relay_with_its_fields() -> None:
    core = RelayCore([0, 1], 3, SALT)
    (fin,) = [a for a in core.rank_handshake(encode_handshake(2, 3, 2)) if isinstance(a, Finished)]
    assert fin.outcome.error.error_id == "relay.rank_not_in_host"  # type: ignore[union-attr]
    assert dict(fin.outcome.error.fields) == {"rank": 2, "ranks": [0, 1]}  # type: ignore[union-attr]


def test_default_host_name_and_stop_and_fail_details() -> None:
    core = RelayCore([0], 1, SALT)
    core.rank_handshake(encode_handshake(0, 1, 2))
    (hello,) = core.dialed()
    wire = b"".join(bytes(b) for b in hello.buffers)
    assert expect_channel_magic(wire[:4], CHANNEL_MAGIC_DATA) == 4
    rec = decode_mux_record(wire[4:], SALT, version=2)
    assert rec is not END_OF_STREAM and rec[0].control.host == ""  # type: ignore[union-attr]
    core = _connected_core((0,), 1, 2)
    (fin,) = [a for a in core.stop() if isinstance(a, Finished)]
    assert fin.outcome.detail == "shutdown requested"
    core = _connected_core((0,), 1, 2)
    (fin,) = [a for a in core.stop("by request") if isinstance(a, Finished)]
    assert fin.outcome.detail == "by request"
    core = _connected_core((0,), 1, 2)
    (fin,) = [a for a in core.fail(RemoteProtocolError("x")) if isinstance(a, Finished)]
    assert fin.outcome.detail == ""


def test_other_control_records_while_folding_are_ignored() -> None:
    core = _connected_core((0, 1), 2, 2)
    assert core.upstream_record(_record(MuxRecord.control_msg(HelloAck(), 2), 2)) == []
    assert core.upstream_record(_record(MuxRecord.control_msg(RankExit(0), 2), 2)) == []
    assert not core.finished


def test_broadcast_fans_out_with_its_length_prefix_to_alive_ranks() -> None:
    core = _connected_core((0, 1, 2), 3, 2)
    core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(1), 2), 2))
    payload = _blob(3.0)
    (fan,) = core.upstream_record(_record(MuxRecord.broadcast(payload), 2))
    assert isinstance(fan, FanOut)
    assert bytes(fan.prefix) == len(payload).to_bytes(4, "little")
    assert bytes(fan.payload) == payload and fan.ranks == (0, 2)


def test_every_broadcast_gets_its_own_length_prefix_the_first_one_too() -> None:
    """The prefix kept for the last Broadcast length starts as no length at all: a first
    Broadcast of 1 byte, or of none, gets its own prefix, not the kept one (the relay forwards
    a Broadcast's payload as it came; the ranks check it)."""
    core = _connected_core((0, 1), 2, 2)
    for payload in (b"\x07", b"", b"\x07", bytes(3), bytes(3)):
        (fan,) = core.upstream_record(_record(MuxRecord.broadcast(payload), 2))
        assert isinstance(fan, FanOut)
        assert bytes(fan.prefix) == len(payload).to_bytes(4, "little")
        assert bytes(fan.payload) == payload


def test_a_shipped_host_frame_is_a_rank_0_record() -> None:
    core = _connected_core((0,), 1, 2)
    (rec,) = _upstream(core.rank_frame(0, _blob(1.0)), UpstreamKind.HOST_FRAME)
    assert rec.rank == 0 and bytes(rec.payload) == _blob(1.0)


def test_a_version_3_relay_folds_an_elided_deposit() -> None:
    core = _connected_core((0, 1), 2, 3)
    idle = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 0.0,
                                               [TensorPayload(0, (2,), b"")]), SALT)
    core.rank_frame(0, idle)
    (rec,) = _upstream(core.rank_frame(1, _blob(1.0)), UpstreamKind.HOST_FRAME)
    frame = decode_round_frame(rec.payload, SALT)[0]
    assert frame.weight == 1.0 and frame.tensors[0].array().tolist() == [1.0, 2.0]


def test_a_deposit_over_the_ceiling_fails_the_relay() -> None:
    core = RelayCore((0,), 1, SALT, ceiling=64)
    core.rank_handshake(encode_handshake(0, 1, 2))
    core.dialed()
    core.upstream_record(_record(MuxRecord.control_msg(HelloAck(), 2), 2))
    big = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.zeros(64, np.float32))]), SALT)
    (fin,) = [a for a in core.rank_frame(0, big) if isinstance(a, Finished)]
    assert not fin.outcome.clean
    assert fin.outcome.error.error_id == "frame.past_ceiling"  # type: ignore[union-attr]


def test_the_seed_shipped_verbatim_is_a_rank_0_host_frame_record() -> None:
    core = _connected_core((0,), 1, 2)
    (up,) = [a for a in core.rank_frame(0, _blob(1.0)) if isinstance(a, SendUpstream)]
    assert b"".join(bytes(b) for b in up.buffers) == encode_mux_record_bytes(
        MuxRecord.host_frame(_blob(1.0)), SALT)


def test_a_rank_leaving_completes_the_round() -> None:
    core = _connected_core((0, 1), 2, 2)
    core.rank_frame(0, _blob(2.0))
    (rec,) = _upstream(core.rank_left(1), UpstreamKind.HOST_FRAME)
    assert bytes(rec.payload) == _blob(2.0)


def test_a_dead_ranks_frame_does_not_start_the_clock() -> None:
    core = _timed_core(1.5)
    core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(1), 2), 2))
    core.rank_frame(1, _blob(1.0), now=10.0)
    assert core.next_deadline() is None


@pytest.mark.parametrize(("ceiling", "fanned_out"), [(25, True), (24, False)])
def test_a_broadcast_over_the_ceiling_fails_the_relay(ceiling: int, fanned_out: bool) -> None:
    """A Broadcast whose payload is at the relay's frame ceiling is fanned out with its length
    prefix; one byte over (a caller that read the record with a larger ceiling) ends the relay
    with the remote error the runner's reader raises for such a record, and nothing is fanned
    out. The payload is a frame without tensors: 25 bytes."""
    core = RelayCore((0, 1), 2, SALT, ceiling=ceiling)
    for r in (0, 1):
        core.rank_handshake(encode_handshake(r, 2, 2))
    core.dialed()
    core.upstream_record(_record(MuxRecord.control_msg(HelloAck(), 2), 2))
    payload = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, []), SALT)
    assert len(payload) == 25
    acts = core.upstream_record(_record(MuxRecord.broadcast(payload), 2))
    if fanned_out:
        (fan,) = acts
        assert isinstance(fan, FanOut) and fan.ranks == (0, 1)
        assert bytes(fan.prefix) == (25).to_bytes(4, "little")
        assert bytes(fan.payload) == payload
        assert not core.finished
        return
    (fin,) = acts
    assert isinstance(fin, Finished) and core.finished
    err = fin.outcome.error
    assert isinstance(err, RemoteProtocolError) and isinstance(err, LimitExceeded)
    assert err.error_id == "mux.payload_too_large"
    assert dict(err.fields) == {"length": 25, "ceiling": 24, "kind": 4, "rank": 0}
    assert str(err).startswith("relay_mux: record payload_len 25 exceeds the frame ceiling 24 "
                               "(kind=0x04, rank=0)")


@pytest.mark.parametrize("ranks", [(0,), (0, 1)])
def test_a_host_frame_record_over_the_ceiling_fails_the_relay(ranks: tuple[int, ...]) -> None:
    """The ceiling bounds a deposit's tensor bytes (16 f32 = 64 bytes: accepted at ceiling 64)
    and the whole HostFrame record payload: the frame's 8-byte header, kind (1), weight (8),
    the tensor's dtype and ndim (2), one dim (4), nbytes (8), 64 data bytes and the 8-byte tag,
    103 bytes, so shipping fails the relay, both for a seed shipped verbatim (one rank) and
    for merged sums (two ranks). The ranks' bytes caused it, so the error is a remote one
    (departure ``host_frame_over_ceiling``: upstream ships the record and its controller rejects
    it), with the encoder's local error as its cause."""
    core = RelayCore(ranks, len(ranks), SALT, ceiling=64)
    for r in ranks:
        core.rank_handshake(encode_handshake(r, len(ranks), 2))
    core.dialed()
    core.upstream_record(_record(MuxRecord.control_msg(HelloAck(), 2), 2))
    deposit = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.arange(16, dtype=np.float32))]), SALT)
    assert len(deposit) == 103
    for r in ranks[:-1]:
        assert core.rank_frame(r, deposit) == []
    acts = core.rank_frame(ranks[-1], deposit)
    assert not [a for a in acts if isinstance(a, SendUpstream)]
    (fin,) = [a for a in acts if isinstance(a, Finished)]
    err = fin.outcome.error
    assert isinstance(err, RemoteProtocolError) and isinstance(err, LimitExceeded)
    assert err.error_id == "relay.host_frame_too_large"
    assert dict(err.fields) == {"length": 103, "ceiling": 64}
    assert str(err).startswith("relay: the host's HostFrame record of 103 bytes exceeds the "
                               "frame ceiling 64; ")
    assert isinstance(err.__cause__, LocalProtocolError)
    assert err.__cause__.error_id == "mux.payload_too_large_local"


@pytest.mark.parametrize("completion", ["rank_left", "declare_dead", "rank_deadline"])
def test_a_round_completed_by_a_death_fails_the_relay_when_its_record_is_over_the_ceiling(
        completion: str) -> None:
    """As above, with the round completed by rank 1's death (its stream ending, the
    controller's DeclareDead, or the rank deadline): the relay fails with the same remote error."""
    core = RelayCore((0, 1), 2, SALT, ceiling=64, rank_timeout=1.0)
    for r in (0, 1):
        core.rank_handshake(encode_handshake(r, 2, 2))
    core.dialed()
    core.upstream_record(_record(MuxRecord.control_msg(HelloAck(), 2), 2))
    deposit = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, [
        TensorPayload.from_array(np.arange(16, dtype=np.float32))]), SALT)
    assert core.rank_frame(0, deposit, now=10.0) == []
    if completion == "rank_left":
        acts = core.rank_left(1)
    elif completion == "declare_dead":
        acts = core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(1), 2), 2))
    else:
        acts = core.tick(11.5)
    assert not [a for a in acts if isinstance(a, SendUpstream)]
    (fin,) = [a for a in acts if isinstance(a, Finished)]
    err = fin.outcome.error
    assert isinstance(err, RemoteProtocolError) and isinstance(err, LimitExceeded)
    assert err.error_id == "relay.host_frame_too_large"
    assert dict(err.fields) == {"length": 103, "ceiling": 64}
    assert str(err).startswith("relay: the host's HostFrame record of 103 bytes exceeds the "
                               "frame ceiling 64; ")
    assert isinstance(err.__cause__, LocalProtocolError)
    assert err.__cause__.error_id == "mux.payload_too_large_local"
    assert core.finished


def _layout_blob(layout: int, value: float, weight: float) -> bytes:
    """A deposit of one of three layouts: 0 one f32 (2,), 1 one f32 (3,) beside a bf16 (2, 2),
    2 a Control frame of one f32 (2,)."""
    if layout == 0:
        tensors = [TensorPayload.from_array(np.asarray([value, -value], np.float32))]
    elif layout == 1:
        tensors = [TensorPayload.from_array(np.asarray([value, 0.5, -0.0], np.float32)),
                   TensorPayload.from_array(
                       np.full((2, 2), value, np.float32).astype(ml_dtypes.bfloat16))]
    else:
        tensors = [TensorPayload.from_array(np.asarray([value, np.inf], np.float32))]
    kind = RoundKind.CONTROL if layout == 2 else RoundKind.MODEL
    return encode_round_frame_bytes(RoundFrame(kind, weight, tensors), SALT)


def test_merged_host_frames_of_a_repeated_layout_are_the_general_encoders_bytes() -> None:
    """A two-rank host's merged HostFrame record, round after round, layouts repeating and
    changing: every record is byte for byte the general encoder's record of the deposits' sum
    (``sum_frames``, the fold's arithmetic); from the second round of a layout on, the record
    is the layout's kept wire image (one buffer) rewritten with the round's sums and weight."""
    core = _connected_core((0, 1), 2, 2)
    seen: set[int] = set()
    for rnd, layout in enumerate([0, 0, 1, 1, 0, 2, 2, 1, 0]):
        a = _layout_blob(layout, 1.5 + rnd, 1.0 + rnd)
        b = _layout_blob(layout, -0.25 * rnd, 0.5)
        assert _upstream(core.rank_frame(0, a), UpstreamKind.HOST_FRAME) == []
        (up,) = [x for x in core.rank_frame(1, b)
                 if isinstance(x, SendUpstream) and x.kind is UpstreamKind.HOST_FRAME]
        merged = sum_frames([decode_round_frame(a, SALT)[0], decode_round_frame(b, SALT)[0]],
                            version=2)
        expected = b"".join(bytes(p) for p in encode_frame_record(
            RecordKind.HOST_FRAME, merged, SALT))
        assert b"".join(bytes(p) for p in up.buffers) == expected, (rnd, layout)
        assert (len(up.buffers) == 1) == (layout in seen), (rnd, layout, len(up.buffers))
        seen.add(layout)
        del up  # the record's image is free for the next round of its layout


# -- the cut-through route of a large Broadcast ---------------------------------------------------

def test_a_broadcast_route_names_the_prefix_the_alive_ranks_and_the_held_tag() -> None:
    core = _connected_core((0, 1, 2), 3, 2)
    route = core.broadcast_route(int(RecordKind.BROADCAST), 5 << 20)
    assert route is not None
    assert (route.prefix, route.ranks, route.hold) == ((5 << 20).to_bytes(4, "little"),
                                                       (0, 1, 2), 8)
    core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(1), 2), 2))
    route = core.broadcast_route(int(RecordKind.BROADCAST), 9)
    assert route is not None and route.ranks == (0, 2) and route.prefix == b"\x09\0\0\0"
    assert core.state == RelayState.FOLDING  # a question: nothing changed
    assert not core.finished


@pytest.mark.parametrize(("kind", "length"), [
    (int(RecordKind.CONTROL), 1 << 20),  # only a Broadcast goes to the ranks
    (int(RecordKind.HOST_FRAME), 1 << 20),
    (int(RecordKind.BROADCAST), 8),  # no byte before the held-back tag
    (int(RecordKind.BROADCAST), 0),
    (int(RecordKind.BROADCAST), (1 << 20) + 1),  # above this core's ceiling
])
def test_no_route_for_another_kind_a_tag_only_payload_or_one_over_the_ceiling(
        kind: int, length: int) -> None:
    core = connected_core((0, 1), 2, 2, SALT, ceiling=1 << 20)
    assert core.broadcast_route(kind, length) is None
    assert core.broadcast_route(int(RecordKind.BROADCAST), 1 << 20) is not None


def test_no_route_before_the_hello_ack_after_the_end_or_without_an_alive_rank() -> None:
    core = RelayCore([0], 1, SALT)
    core.rank_handshake(encode_handshake(0, 1, 2))
    core.dialed()
    assert core.state == RelayState.AWAITING_HELLO_ACK
    assert core.broadcast_route(int(RecordKind.BROADCAST), 1 << 20) is None
    core = _connected_core((0, 1), 2, 2)
    core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(0), 2), 2))
    core.upstream_record(_record(MuxRecord.control_msg(DeclareDead(1), 2), 2))
    assert core.broadcast_route(int(RecordKind.BROADCAST), 1 << 20) is None  # nobody alive
    core = _connected_core((0, 1), 2, 2)
    core.rank_left(1)
    core.rank_left(0)
    assert core.state == RelayState.DRAINING
    assert core.broadcast_route(int(RecordKind.BROADCAST), 1 << 20) is None  # nobody alive
    core = _connected_core((0, 1), 2, 2)
    core.rank_left(1)
    route = core.broadcast_route(int(RecordKind.BROADCAST), 1 << 20)
    assert route is not None and route.ranks == (0,)
    core.stop()
    assert core.finished and core.broadcast_route(int(RecordKind.BROADCAST), 1 << 20) is None


@pytest.mark.parametrize("host", [b"h0", bytearray(b"h0"), 7, None])
def test_a_host_that_is_not_text_is_the_hellos_local_error(host: object) -> None:
    with pytest.raises(InvalidValue) as ei:
        RelayCore([0], 1, SALT, host=host)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError) and ei.value.error_id == "mux.bad_field"
    assert str(ei.value) == f"relay_mux: Hello.host = {host!r} is invalid: not text (str)"


def test_a_route_above_the_default_ceiling_uses_the_cores_own() -> None:
    """A core whose ceiling is 3 GiB routes a 2 GiB Broadcast: its prefix is encoded against
    the core's ceiling, not the codec's 1 GiB default."""
    core = connected_core((0,), 1, 2, SALT, ceiling=3 << 30)
    route = core.broadcast_route(int(RecordKind.BROADCAST), 2 << 30)
    assert route is not None and route.prefix == (2 << 30).to_bytes(4, "little")


@pytest.mark.parametrize(("call", "rank", "blob"), [
    ("rank_frame", 7, True), ("rank_frame", True, True), ("rank_frame", 1.0, True),
    ("rank_left", 7, False), ("rank_left", "0", False)])
def test_a_rank_that_is_not_local_is_caller_misuse(call: str, rank: Any, blob: bool) -> None:
    """``rank_frame(7, ...)`` ended the run with a local error inside ``Finished``,
    ``rank_frame(True, ...)`` was rank 1's frame, and ``rank_left(7)`` did nothing: caller
    misuse is raised, and the run goes on."""
    core = _connected_core((0, 1), 2, 2)
    args = (rank, encode_round_frame_bytes(RoundFrame(0, 1.0, []), SALT)) if blob else (rank,)
    with pytest.raises(InvalidValue) as ei:
        getattr(core, call)(*args)
    assert not ei.value.remote and ei.value.error_id == "relay.not_local_rank"
    assert str(ei.value) == f"relay: {call}: rank {rank!r} is not one of this host's ranks [0, 1]"
    assert not core.finished
    assert not [a for a in core.rank_frame(0, encode_round_frame_bytes(RoundFrame(0, 1.0, []),
                                                                       SALT))
                if isinstance(a, Finished)]


def test_a_blob_that_is_no_buffer_is_caller_misuse() -> None:
    core = _connected_core((0, 1), 2, 2)
    with pytest.raises(InvalidValue) as ei:
        core.rank_frame(0, "abc")  # type: ignore[arg-type]
    assert not ei.value.remote and ei.value.error_id == "codec.not_bytes_like"
    assert not core.finished


@pytest.mark.parametrize("call", ["rank_frame", "rank_left"])
def test_a_numpy_integer_rank_is_that_rank(call: str) -> None:
    """An integer of another type (NumPy's) names the rank of its value: a local one is taken
    as that rank, another is refused as a plain ``int`` would be."""
    blob = encode_round_frame_bytes(RoundFrame(0, 1.0, []), SALT)
    args = (blob,) if call == "rank_frame" else ()
    core, twin = _connected_core((0, 1), 2, 2), _connected_core((0, 1), 2, 2)

    def sent(actions: list[Any]) -> list[tuple[Any, bytes]]:
        return [(a.kind, b"".join(bytes(b) for b in a.buffers)) for a in actions]

    got, want = getattr(core, call)(np.int64(1), *args), getattr(twin, call)(1, *args)
    assert all(isinstance(a, SendUpstream) for a in got + want)
    assert sent(got) == sent(want) and len(want) == (1 if call == "rank_left" else 0)
    assert core.state == twin.state
    with pytest.raises(InvalidValue) as ei:
        getattr(core, call)(np.uint32(7), *args)
    assert ei.value.error_id == "relay.not_local_rank" and not ei.value.remote
    assert str(ei.value) == f"relay: {call}: rank 7 is not one of this host's ranks [0, 1]"


def test_a_blob_that_is_no_buffer_is_named() -> None:
    core = _connected_core((0, 1), 2, 2)
    with pytest.raises(InvalidValue) as ei:
        core.rank_frame(0, "abc")  # type: ignore[arg-type]
    assert str(ei.value) == ("blob must be a contiguous bytes-like object (bytes, bytearray or "
                             "memoryview), got str")


def test_a_deposit_is_checked_against_the_premac_it_comes_with() -> None:
    """The runner hashes a rank's frame as it arrives and hands the MAC over (``premac``): the
    core compares the frame's tag with it and does not hash the bytes again. A premac that does
    not match the tag fails the frame, although its bytes are intact."""
    blob = encode_round_frame_bytes(RoundFrame(0, 1.0, [TensorPayload.from_array(
        np.arange(4, dtype=np.float32))]), SALT)
    mac = new_mac(SALT)
    mac.update(blob[:-8])
    good = Premac(len(blob) - 8, mac.digest())
    bad = Premac(len(blob) - 8, bytes(32))
    core = _connected_core((0, 1), 2, 2)
    assert not [a for a in core.rank_frame(0, blob, premac=good) if isinstance(a, Finished)]
    core = _connected_core((0, 1), 2, 2)
    ends = [a for a in core.rank_frame(0, blob, premac=bad) if isinstance(a, Finished)]
    assert len(ends) == 1 and isinstance(ends[0].outcome.error, AuthenticationError)


def test_the_largest_world_size_is_accepted() -> None:
    """A world size is a u32 on the wire: 2**32 - 1 is the largest, 2**32 is refused."""
    assert RelayCore([0], 2**32 - 1, SALT).world_size == 2**32 - 1
    with pytest.raises(InvalidValue):
        RelayCore([0], 2**32, SALT)


def test_a_handshake_deadline_fails_the_relay_as_a_short_handshake_does() -> None:
    core = RelayCore([0, 1], 2, SALT)
    core.rank_handshake(encode_handshake(0, 2, 2))
    (fin,) = core.rank_handshake_expired(7, 10.0)
    assert isinstance(fin, Finished) and isinstance(fin.outcome.error, TruncatedInput)
    assert isinstance(fin.outcome.error, RemoteProtocolError)
    assert str(fin.outcome.error) == ("cluster_controller: handshake read failed: no complete "
                                      "handshake within 10s (7 of 16 bytes)")
    assert core.finished and core.state == RelayState.DONE
    assert core.rank_handshake_expired(0, 10.0) == []


def test_a_handshake_deadline_outside_the_accept_phase_is_misuse() -> None:
    core = RelayCore([0], 1, SALT)
    core.rank_handshake(encode_handshake(0, 1, 2))
    assert core.state == RelayState.DIALING
    with pytest.raises(LocalProtocolError, match="rank_handshake_expired"):
        core.rank_handshake_expired(3, 10.0)

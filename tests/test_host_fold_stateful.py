"""Stateful test of the relay's fold barrier (:class:`~flodl_proto.reduce.HostFold`) against a
model: deposits valid for the round by default (the round's kind and schema, random values,
elided payloads at version 3), deaths of local and foreign ranks mid-round, and, as a separate
rarely drawn rule, deposits broken in one way (a malformed frame, a raw blob, a second deposit
from the same rank), which are fatal.

The model is the fuzz target's (``fuzz/harnesses/host_fold.py``): completion exactly when every
local rank deposited or is dead, an unpromoted round shipped its seed's tensors verbatim under
the summed weight, otherwise the f32 sums in deposit order (computed there element by element,
not by the fold's kernels) with the weights summed, errors fatal and sticky.

The machine runs once, in :func:`test_host_fold_state_machine`, which then checks that the run
reached what it claims to test: most completed rounds summed several deposits (and had their
sums and weight checked), ranks died mid-round, elided payloads were deposited.
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

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

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.errors import LocalProtocolError, ProtocolError
from flodl_proto.reduce import HostFold
from fuzz.harnesses.builders import SHAPES, build_frame
from fuzz.harnesses.common import SALTS, Params, check
from fuzz.harnesses.host_fold import FOLD_CEILINGS, Model, _completion, do_deposit

pytestmark = pytest.mark.stateful

#: f32 element values a valid deposit carries (inexact sums, large and tiny magnitudes, -0.0)
F32_VALUES = (0.0, -0.0, 1.0, -2.5, 0.1, 3.0e38, 1.0e-40, 7.25)
#: bf16 element bit patterns (1.0, -2.5, 0.1 rounded, 1e38-ish, a subnormal, 0, -0)
BF16_BITS = (0x3F80, 0xC020, 0x3DCD, 0x7E96, 0x0001, 0x0000, 0x8000)
#: weights of a valid deposit (finite, not negative)
VALID_WEIGHTS = (1.0, 0.5, 0.0, 2.0, 1e-30, 3.0)
#: a flag that is True about one time in twelve (not at an integer boundary)
RARE = st.integers(0, 11).map(lambda x: x == 7)
#: a flag that is True about one time in three
SOMETIMES = st.integers(0, 2).map(lambda x: x == 1)

#: round schemas with at least one tensor that has elements (zero-element tensors carry no bytes,
#: so a round of nothing else is never summed)
schemas = st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from(SHAPES)),
                   min_size=1, max_size=3).filter(lambda s: any(0 not in sh for _, sh in s))

#: what the last run of the machine reached (reset by :func:`test_host_fold_state_machine`)
STATS: Counter[str] = Counter()


class CountingModel(Model):
    """The fuzz target's model, counting the rounds whose output it checks."""

    def check_output(self, out: bytes) -> None:
        merged = [f for _, f in self.deposits]
        if self.promoted:
            STATS["summed rounds"] += 1
            event("round summed", payload=len(merged))
            if len(merged) >= 2:
                STATS["multi-deposit summed rounds"] += 1
        else:
            STATS["verbatim rounds"] += 1
        STATS["completed rounds"] += 1
        super().check_output(out)


class HostFoldStateful(RuleBasedStateMachine):
    """A HostFold and its model, driven by the same events."""

    @initialize(version=st.sampled_from([2, 3]), salt=st.sampled_from(SALTS),
                first=st.integers(0, 6), n=st.integers(2, 4), schema=schemas,
                kind=st.sampled_from([RoundKind.MODEL, RoundKind.CONTROL]),
                ceiling=st.sampled_from(FOLD_CEILINGS[:2]))
    def setup(self, version: int, salt: bytes, first: int, n: int,
              schema: list[tuple[int, tuple[int, ...]]], kind: RoundKind, ceiling: int) -> None:
        STATS["examples"] += 1
        self.example: Counter[str] = Counter()  # first: teardown reads it once a fold exists
        self.ranks = tuple(range(first, first + n))
        self.schema = schema
        self.kind = kind
        self.salt = salt
        self.version = version
        self.fold = HostFold(self.ranks, salt, version=version, ceiling=ceiling)
        self.model = CountingModel(self.ranks, version, salt, ceiling)

    def _deposit(self, rank: int, blob: bytes) -> None:
        do_deposit(self.fold, self.model, rank, blob)

    def _valid_frame(self, data: Any) -> tuple[RoundFrame, bool]:
        tensors = []
        elided_any = False
        for dtype, shape in self.schema:
            numel = 1
            for d in shape:
                numel *= d
            if self.version >= 3 and numel and data.draw(SOMETIMES, label="elide"):
                tensors.append(TensorPayload.elide(dtype, shape))
                elided_any = True
                continue
            if dtype == 0:
                vals = data.draw(st.lists(st.sampled_from(F32_VALUES), min_size=numel,
                                          max_size=numel), label="f32 values")
                raw = struct.pack(f"<{numel}f", *vals)
            else:
                bits = data.draw(st.lists(st.sampled_from(BF16_BITS), min_size=numel,
                                          max_size=numel), label="bf16 bits")
                raw = struct.pack(f"<{numel}H", *bits)
            tensors.append(TensorPayload(dtype, shape, raw))
        weight = data.draw(st.sampled_from(VALID_WEIGHTS), label="weight")
        return RoundFrame(self.kind, weight, tensors), elided_any

    def _alive_undeposited(self) -> list[int]:
        got = {r for r, _ in self.model.deposits}
        return [r for r in self.ranks if r not in self.model.dead and r not in got]

    @precondition(lambda self: self.model.fatal is None and bool(self._alive_undeposited()))
    @rule(data=st.data(), trailing=st.booleans())
    def deposit_valid_frame(self, data: Any, trailing: bool) -> None:
        """A frame valid for the round from a live rank that has not deposited yet."""
        rank = data.draw(st.sampled_from(self._alive_undeposited()), label="rank")
        frame, elided = self._valid_frame(data)
        blob = encode_round_frame_bytes(frame, self.salt) + (b"\x5a" * 3 if trailing else b"")
        if elided:
            STATS["elided deposits"] += 1
            self.example["elided deposits"] += 1
            event("deposit with an elided payload")
        self._deposit(rank, blob)
        self.example["deposits"] += 1

    @precondition(lambda self: self.model.fatal is None)
    @rule(data=st.data(), go=RARE,
          how=st.sampled_from(["built", "raw", "again", "dead", "overflow"]))
    def deposit_faulty(self, data: Any, go: bool, how: str) -> None:
        """Rarely: a deposit broken in one way (the model says whether it is fatal)."""
        if not go:
            return
        rank = self.ranks[data.draw(st.integers(0, len(self.ranks) - 1), label="rank")]
        if how == "built":  # a frame of the schema, maybe broken by its control byte
            blob = encode_round_frame_bytes(
                build_frame(Params(data.draw(st.binary(max_size=64))), self.schema), self.salt)
        elif how == "raw":
            blob = data.draw(st.binary(max_size=40), label="raw blob")
        elif how == "overflow":  # a weight past the f64 range once summed
            frame, _ = self._valid_frame(data)
            blob = encode_round_frame_bytes(RoundFrame(frame.kind, 1.6e308, frame.tensors),
                                            self.salt)
        else:  # a second deposit from a rank that deposited ("again") or a dead one ("dead")
            # a dead one of its own: a rank it does not carry is caller misuse, not a peer's
            # deposit (declare_dead takes any rank id, so model.dead may hold foreign ones)
            pool = ([r for r, _ in self.model.deposits] if how == "again"
                    else sorted(self.model.dead.intersection(self.ranks)))
            if not pool:
                return
            rank = data.draw(st.sampled_from(pool), label="rank")
            blob = encode_round_frame_bytes(self._valid_frame(data)[0], self.salt)
        self._deposit(rank, blob)
        if self.model.fatal is not None:
            STATS["fatal errors"] += 1
            event(f"fatal: {self.model.fatal.error_id}")

    def _declare_dead(self, rank: int, mid_round: bool) -> None:
        try:
            res, err = self.fold.declare_dead(rank), None
        except ProtocolError as e:
            res, err = None, e
        if self.model.fatal is not None:
            assert err is self.model.fatal
            return
        assert err is None, err
        if mid_round:
            STATS["deaths mid-round"] += 1
            event("a local rank died mid-round")
        self.model.dead.add(rank)
        _completion(self.model, res, "declare_dead")

    @precondition(lambda self: self.model.fatal is None and bool(self.model.deposits)
                  and len(set(self.ranks) - self.model.dead) >= 3)
    @rule(data=st.data(), go=SOMETIMES)
    def rank_dies_mid_round(self, data: Any, go: bool) -> None:
        """A live local rank dies while the round has deposits (its merged part stays)."""
        if go:
            alive = [r for r in self.ranks if r not in self.model.dead]
            self._declare_dead(data.draw(st.sampled_from(alive), label="rank"), True)

    @rule(i=st.integers(0, 3), go=RARE, foreign=st.booleans())
    def declare_dead(self, i: int, go: bool, foreign: bool) -> None:
        """Rarely: any local rank, dead or not, or a rank the relay does not carry, leaves."""
        if go:
            rank = self.ranks[-1] + 1 + i if foreign else self.ranks[i % len(self.ranks)]
            self._declare_dead(rank, bool(self.model.deposits) and not foreign
                               and rank not in self.model.dead)

    @precondition(lambda self: self.model.fatal is None)
    @rule(extra=st.integers(1, 5))
    def deposit_from_a_rank_it_does_not_carry(self, extra: int) -> None:
        """Caller misuse: a LocalProtocolError that is not fatal."""
        with pytest.raises(LocalProtocolError):
            self.fold.deposit(self.ranks[-1] + extra, b"")

    @invariant()
    def fold_agrees_with_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        if self.model.fatal is not None:
            check(self.fold.error is self.model.fatal, "fatal error not kept")
            return
        assert self.fold.alive_ranks == tuple(r for r in self.ranks if r not in self.model.dead)
        assert self.fold.deposited == {r for r, _ in self.model.deposits}

    def teardown(self) -> None:
        if hasattr(self, "fold"):
            target(float(self.fold.rounds_completed), label="rounds completed")
            target(float(self.example["deposits"]), label="valid deposits")


def test_host_fold_state_machine() -> None:
    """Run the machine under the loaded profile, then check what it reached.

    Under the ``ci`` profile (60 examples of up to 25 steps) most completed rounds are summed
    from several deposits and checked against the model's sums and weight; ranks die mid-round,
    elided payloads are deposited and a fault is drawn (each at least once; the derandomized run
    also draws on constants Hypothesis collects from the project's source, so an unrelated code
    change can move these counts, and the floors are kept low for that reason).
    """
    STATS.clear()
    run_state_machine_as_test(HostFoldStateful,
                              settings=settings(stateful_step_count=25))
    print(dict(STATS))
    examples = STATS["examples"]
    assert examples >= settings().max_examples, STATS
    completed = STATS["completed rounds"]
    assert completed >= examples, STATS
    assert STATS["multi-deposit summed rounds"] > completed / 2, STATS
    assert STATS["deaths mid-round"] >= 1, STATS
    assert STATS["elided deposits"] >= 1, STATS
    assert STATS["fatal errors"] >= 1, STATS

"""Stateful test of the relay's fold barrier (:class:`~flodl_proto.reduce.HostFold`) against a
model: random deposits (well-formed frames of the round's schema, frames broken in one way,
raw blobs), deaths of local and foreign ranks, and deposits from ranks the relay does not carry.

The model is the fuzz target's (``fuzz/harnesses/host_fold.py``): completion exactly when every
local rank deposited or is dead, an unpromoted round shipped verbatim, otherwise the f32 sums in
deposit order with the weights summed, errors fatal and sticky.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flodl_proto.codec import encode_round_frame_bytes
from flodl_proto.errors import LocalProtocolError, ProtocolError
from flodl_proto.reduce import HostFold
from fuzz.harnesses.builders import SHAPES, build_frame
from fuzz.harnesses.common import SALTS, Params, check
from fuzz.harnesses.host_fold import FOLD_CEILINGS, Model, _completion, do_deposit

pytestmark = pytest.mark.stateful

schemas = st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from(SHAPES)), max_size=3)


class HostFoldStateful(RuleBasedStateMachine):
    """A HostFold and its model, driven by the same events."""

    @initialize(version=st.sampled_from([2, 3]), salt=st.sampled_from(SALTS),
                first=st.integers(0, 6), n=st.integers(1, 4), schema=schemas,
                ceiling=st.sampled_from(FOLD_CEILINGS[:2]))
    def setup(self, version: int, salt: bytes, first: int, n: int,
              schema: list[tuple[int, tuple[int, ...]]], ceiling: int) -> None:
        self.ranks = tuple(range(first, first + n))
        self.schema = schema
        self.salt = salt
        self.fold = HostFold(self.ranks, salt, version=version, ceiling=ceiling)
        self.model = Model(self.ranks, version, salt, ceiling)

    @rule(i=st.integers(0, 3), frame_bytes=st.binary(max_size=64), trailing=st.booleans())
    def deposit_built_frame(self, i: int, frame_bytes: bytes, trailing: bool) -> None:
        """A frame of the round's schema (its first byte may break it in one way)."""
        frame = build_frame(Params(frame_bytes), self.schema)
        blob = encode_round_frame_bytes(frame, self.salt) + (b"\x5a" * 3 if trailing else b"")
        do_deposit(self.fold, self.model, self.ranks[i % len(self.ranks)], blob)

    @rule(i=st.integers(0, 3), blob=st.binary(max_size=40))
    def deposit_raw_blob(self, i: int, blob: bytes) -> None:
        """Bytes that are almost never a signed frame."""
        do_deposit(self.fold, self.model, self.ranks[i % len(self.ranks)], blob)

    @rule(i=st.integers(0, 3), foreign=st.booleans())
    def declare_dead(self, i: int, foreign: bool) -> None:
        """A local rank (or a rank the relay does not carry) leaves the barrier for good."""
        rank = self.ranks[-1] + 1 + i if foreign else self.ranks[i % len(self.ranks)]
        try:
            res, err = self.fold.declare_dead(rank), None
        except ProtocolError as e:
            res, err = None, e
        if self.model.fatal is not None:
            assert err is self.model.fatal
            return
        assert err is None, err
        self.model.dead.add(rank)
        _completion(self.model, res, "declare_dead")

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


HostFoldStateful.TestCase.settings = settings(stateful_step_count=25)
TestHostFoldStateful = HostFoldStateful.TestCase

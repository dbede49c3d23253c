"""The relay's incremental per-round fold of its host's rank frames (the fold barrier).

Each local rank deposits one loopback blob per round (a signed RoundFrame; bytes after its footer
are ignored). The first deposit of a round is kept verbatim as the *seed* and pins the schema
(kind, tensor count, per tensor dtype and shape); its weight starts the round's mass. The first
later payload that carries bytes (version 3: elided payloads merge nothing; version 2: every
payload merges) *promotes* the seed to f32 running sums, and every later payload is added in
deposit order. The round completes when every local rank has deposited or is dead and at least
one deposit exists; the completing call returns the HostFrame payload:

* a round that never promoted (a single deposit, or version 3 later deposits that were all
  elided) ships the seed's tensors verbatim (so a lone ``-0.0`` or a bf16 signalling NaN
  survives and an all-elided round ships elided) under the summed weight: the seed frame's
  bytes when that weight is the seed's, bit for bit, else the seed's tensors re-signed with it;
* otherwise the f32 sums of every tensor re-encoded in its dtype (a tensor every deposit elided
  ships as zero bytes), signed with the salt, weight = the summed weights, kind = the seed's.

Any protocol error (parse, MAC, schema, double deposit) is fatal for the fold: it is raised, and
raised again by every later call (the relay tears its data channel down). A frame from a rank that
is already dead is dropped. A dead rank's already-merged contribution stays in the round.

How the sums are computed does not change them (each element is ``0.0 + seed + x1 + ...`` in
f32, in deposit order, encoded once): a tensor's seed is widened into an f32 accumulator only
when a deposit that does not complete the round merges into it; the deposit that completes the
round adds into (and the completion encodes) each tensor in one pass straight to the output, so
a two-rank host writes no f32 array at all. Accumulators and outputs are pooled arrays reused
from round to round (no page faults on the fold's critical path), and a large tensor is split in
halves across two threads. A round of small tensors whose frames carry the layout the codec's
reader remembers (every round of a run after the first) is folded from the frames' buffers at the
layout's offsets (``_host_plan._LayoutPlan``): the deposits between the seed and the last are held
unmerged, and the last sums them all in one pass per run of tensors. Such a frame is checked by
the codec's ``read_known_frame`` (every check its full decode makes of a frame of that layout:
the metadata bytes, the weight, the tag) and no frame object is built for it unless a path
needs its tensors.

Error order follows upstream's streamed parse: a later deposit's tensors are checked and merged
one at a time as the reader reaches them, before its footer is verified, so a schema error in an
early tensor is reported before a truncation or MAC error further on; the frame's kind and tensor
count are compared after the whole frame has been read.

Departures (fail-safe, same wire bytes otherwise): before promotion materialises the seed's
elided tensors as zeros, the payload size is checked against the frame ceiling
(``fold.elided_too_large``; upstream allocates, then ships a HostFrame the controller rejects);
a deposit whose weight takes the round's sum past the f64 range is refused
(``fold.weight_overflow``; upstream ships weight inf, which the controller rejects).

This module reads and checks each deposit, keeps the barrier and completes the round; the
merge and the sums are :mod:`flodl_proto.reduce._host_sums`' (:class:`HostFold` builds on it).

Upstream: ``flodl/src/distributed/relay/agent.rs`` (``FoldCtx``, ``HostFold::accumulate``,
``take_if_complete``, ``fold_and_ship``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..codec._common import END_OF_STREAM, BytesLike, as_view, check_version, wire_int
from ..codec.auth import Premac, check_salt
from ..codec.ceiling import frame_ceiling_int
from ..codec.plans import frame_macs
from ..codec.round_frame import (
    RoundFrame,
    TensorPayload,
    declared_tensor_count,
    decode_round_frame_or_eos,
    delivered_tensors,
    encode_round_frame_bytes,
    known_round_frame,
    parse_round_frame_or_eos,
)
from ..codec.round_frame import known_layout as _known_layout
from ..codec.round_frame import read_known_frame as _read_known
from ..errors import ProtocolError, protocol_error
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    U32_MAX,
)
from . import _kernels as K
from ._host_plan import _ArrayPool as _ArrayPool  # moved there; tests import it from here
from ._host_plan import _LayoutPlan, _Round, _SmallPlan
from ._host_sums import _HostSums
from ._quiet import quiet_enter as _quiet_enter
from ._quiet import quiet_exit as _quiet_exit

__all__ = ["HostFold"]


#: reader errors raised while tensor ``index`` is being read: tensors before it were delivered
_PER_TENSOR_ERRORS = frozenset({
    "frame.meta_read_failed", "frame.shape_read_failed", "frame.nbytes_read_failed",
    "frame.past_ceiling", "frame.data_read_failed",
})
#: reader errors raised after every tensor was delivered
_AFTER_TENSOR_ERRORS = frozenset({"frame.footer_read_failed", "frame.auth_failed"})


class HostFold(_HostSums):
    """One relay's fold barrier over its local ranks, round after round.

    Args:
        local_ranks: the global rank ids this relay serves (the barrier's roster): an iterable
            of u32 integers (``int`` or NumPy integers).
        salt: the 16-byte session salt (verifies deposits, signs merged HostFrames).
        version: data-channel protocol version (2 or 3).
        ceiling: frame ceiling in bytes used to read deposits (default 1 GiB), a non-negative
            integer.

    Thread-safe: a runner may call :meth:`deposit` from per-rank reader threads and
    :meth:`declare_dead` from its upstream reader; calls are serialised by an internal lock (the
    merge runs under it, as upstream's does). A deposit's MAC is computed before the lock is
    taken (or handed in as a :class:`~flodl_proto.codec.auth.Premac` by a reader that hashed the
    bytes as they arrived), so concurrent deposits verify in parallel; the verdict is applied
    under the lock, at the point of upstream's streamed read (after the tensors were checked).

    Raises:
        InvalidValue (local): bad salt; ``local_ranks`` not an iterable of rank ids, or one of
            them not a u32 integer (``fold.bad_argument`` naming ``local_ranks[i]`` and the
            value: the codec's integer rule, a bool, a float or text is refused, never
            truncated); ``ceiling`` not a non-negative integer (``ceiling.invalid``).
        VersionMismatch (local): unsupported version.

    Upstream: ``relay/agent.rs`` ``FoldCtx`` / ``HostFold``.
    """

    def __init__(
        self,
        local_ranks: Iterable[int],
        salt: BytesLike,
        *,
        version: int = DEFAULT_VERSION,
        ceiling: int = DEFAULT_FRAME_CEILING,
    ) -> None:
        self._ranks: tuple[int, ...] = _roster(local_ranks)
        self._salt = check_salt(salt)
        self._version = check_version(version)
        self._ceiling = frame_ceiling_int(ceiling)
        self._lock = threading.Lock()
        self._dead: set[int] = set()
        self._alive: tuple[int, ...] = self._ranks  # replaced whole when a rank dies
        self._round: _Round | None = None
        self._error: ProtocolError | None = None
        self._rounds = 0
        self._ws: K.Workspace | None = None
        self._ws2: K.Workspace | None = None
        self._pool = _ArrayPool()
        self._plan: _SmallPlan | None = None  # the last seed layout's (see _fold_last_fast)
        #: per layout the codec's reader remembers, its plan (see _fold_last_fast)
        self._layout_plans: dict[Any, _LayoutPlan] = {}

    # -- introspection -------------------------------------------------------------------------
    @property
    def local_ranks(self) -> tuple[int, ...]:
        """The roster, ascending."""
        return self._ranks

    @property
    def version(self) -> int:
        """The protocol version the fold applies (2 or 3)."""
        return self._version

    @property
    def dead_ranks(self) -> frozenset[int]:
        """Ranks out of the barrier (never revived)."""
        with self._lock:
            return frozenset(self._dead)

    @property
    def alive_ranks(self) -> tuple[int, ...]:
        """Local ranks not dead, ascending (the ranks a Broadcast is fanned out to)."""
        return self._alive

    def is_alive(self, rank: int) -> bool:
        """Whether ``rank`` is a local rank not dead (``rank in alive_ranks``, without building
        the tuple). Raises InvalidValue (local, ``fold.bad_argument``) for a rank that is no
        integer by the codec's rule, as :meth:`deposit` does (``True`` was rank 1)."""
        if type(rank) is not int:
            rank = _rank_arg(rank, "rank")
        return rank in self._ranks and rank not in self._dead

    def has_deposited(self, rank: int) -> bool:
        """Whether ``rank`` has deposited in the current (incomplete) round
        (``rank in deposited``, without building the set); a rank that is no integer is
        refused as by :meth:`is_alive`."""
        if type(rank) is not int:
            rank = _rank_arg(rank, "rank")
        rnd = self._round
        return rnd is not None and rank in rnd.deposited

    @property
    def deposited(self) -> frozenset[int]:
        """Ranks that have deposited in the current (incomplete) round."""
        with self._lock:
            return frozenset(self._round.deposited) if self._round else frozenset()

    @property
    def rounds_completed(self) -> int:
        """Number of HostFrames produced so far."""
        return self._rounds

    @property
    def error(self) -> ProtocolError | None:
        """The fatal error, once one happened (every later call raises it)."""
        return self._error

    # -- events --------------------------------------------------------------------------------
    def deposit(self, rank: int, blob: BytesLike, *,
                premac: Premac | None = None) -> bytes | None:
        """Merge ``rank``'s loopback blob into the current round.

        Args:
            rank: a local rank.
            blob: the loopback blob: one RoundFrame signed with the salt; bytes after its footer
                are ignored. The seed keeps views into it until the round completes: do not
                modify the buffer before then.
            premac: the MAC of the blob's frame (its bytes before the tag) the caller computed
                as they arrived; without it the MAC is computed here, before the fold's lock.

        Returns:
            The HostFrame payload (one signed RoundFrame) when this deposit completes the round
            (the fold then starts the next round), else None. None too when ``rank`` is dead
            (its frame is dropped).

        Raises:
            InvalidValue (local): ``rank`` is not an integer (``fold.bad_argument``: the codec's
                integer rule, a bool, a float or text is refused), or not a local rank
                (``fold.unknown_rank``); neither is fatal.
            TruncatedInput (remote): empty blob or one ending inside the frame header
                (``fold.truncated``), or any truncation the frame reader reports.
            SequenceError (remote): ``rank`` already deposited this round.
            SchemaMismatch (remote): kind, tensor count, dtype, shape or byte count disagrees
                with the round's first deposit.
            AuthenticationError, BadMagic, LimitExceeded, InvalidValue (remote): frame reader
                errors.
            LimitExceeded (remote): materialising the seed's elided tensors would exceed the
                ceiling (``fold.elided_too_large``).
            InvalidValue (remote): the summed weight overflows f64 (``fold.weight_overflow``).
            Any of these is fatal: the same error is raised by every later call.

        Upstream: ``relay/agent.rs`` ``FoldCtx::deposit``.
        """
        res = self.deposit_frame(rank, blob, premac=premac)
        if res is None:
            return None
        if isinstance(res, RoundFrame):
            return encode_round_frame_bytes(res, self._salt)
        return bytes(res)

    def deposit_frame(self, rank: int, blob: BytesLike, *,
                      premac: Premac | None = None) -> RoundFrame | memoryview | None:
        """:meth:`deposit`, returning the completed round's HostFrame payload unencoded.

        Returns:
            None while the round is incomplete (or ``rank`` is dead); when this deposit completes
            it, either the merged frame (f32 sums re-encoded in each tensor's dtype, summed
            weight, the seed's kind; its payloads are the fold's buffers, reused by a later
            round only once nothing references them any more; or, for a round that never
            promoted whose later deposits changed the weight, copies of the seed's tensors) to
            be signed by the caller, e.g. with
            :func:`~flodl_proto.codec.mux.encode_frame_record`, or a memoryview of the seed
            frame's bytes (tag included; a view into the seed's blob, which the caller must not
            modify while using it) to ship verbatim.

        Raises:
            as :meth:`deposit`.
        """
        return self.deposit_view(rank, as_view(blob), premac)

    def deposit_view(self, rank: int, mv: memoryview,
                     premac: Premac | None) -> RoundFrame | memoryview | None:
        """:meth:`deposit_frame` of a blob already given as a flat byte view (what
        :func:`~flodl_proto.codec._common.as_view` returns, e.g. the relay core's checked
        argument), without checking it again.

        Raises:
            as :meth:`deposit`.
        """
        if premac is None and self._error is None:
            premac = self._frame_mac(mv)
        with self._lock:
            if self._error is not None:
                raise self._error
            if type(rank) is not int:  # the common case costs this one test
                rank = _rank_arg(rank, "rank")
            if rank not in self._ranks:
                raise protocol_error("fold.unknown_rank", rank=rank, ranks=list(self._ranks))
            if rank in self._dead:
                return None
            try:
                rnd = self._round
                if rnd is None:  # the seed: no arithmetic, so no warning context
                    self._merge(rank, mv, premac)
                    if len(self._ranks) > 1 + len(self._dead):  # others still to deposit
                        return None
                    return self._complete()
                if rank in rnd.deposited:
                    raise protocol_error("fold.double_deposit", rank=rank)
                quiet = _quiet_enter()  # the kernels' own context, once per deposit
                try:
                    done = self._merge(rank, mv, premac)
                    return done if done is not None else self._complete()
                finally:
                    _quiet_exit(quiet)
            except ProtocolError as e:
                self._error = e
                raise

    def declare_dead(self, rank: int) -> bytes | None:
        """Take ``rank`` out of the barrier for good (loopback EOF or the controller's
        DeclareDead). Idempotent; any rank id (a u32 integer) is accepted, a local rank or not.

        Returns:
            The HostFrame payload when this death completes the round, else None.

        Raises:
            InvalidValue (local): ``rank`` is not a u32 integer (``fold.bad_argument``: the
                codec's integer rule; not fatal).
            the fold's fatal error, if it has one; LimitExceeded / SchemaMismatch... never
            (completion only encodes what was already merged).

        Upstream: ``relay/agent.rs`` ``FoldCtx::mark_dead``.
        """
        res = self.declare_dead_frame(rank)
        if res is None:
            return None
        if isinstance(res, RoundFrame):
            return encode_round_frame_bytes(res, self._salt)
        return bytes(res)

    def declare_dead_frame(self, rank: int) -> RoundFrame | memoryview | None:
        """:meth:`declare_dead`, returning the completed round's HostFrame payload unencoded
        (as :meth:`deposit_frame` does).

        Raises:
            as :meth:`declare_dead`.
        """
        if type(rank) is not int or not 0 <= rank <= U32_MAX:
            rank = _rank_arg(rank, "rank")
        with self._lock, np.errstate(all="ignore"):  # the kernels' context (see deposit_frame)
            self._check_alive()
            self._dead.add(rank)
            self._alive = tuple([r for r in self._ranks if r not in self._dead])
            return self._complete()

    # -- internals -----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._error is not None:
            raise self._error

    def _frame_mac(self, mv: memoryview) -> Premac | None:
        """The MAC of the frame at the start of ``mv`` (None when it does not parse: the
        locked decode then reports the error in upstream's order)."""
        try:
            res = parse_round_frame_or_eos(mv, ceiling=self._ceiling)
        except ProtocolError:
            return None
        if res is END_OF_STREAM:
            return None
        plan = frame_macs(res[1], self._salt)
        if plan.mac is not None:
            plan.mac.update(mv[plan.start:plan.stop])
        return plan.premac()

    def _merge(self, rank: int, mv: memoryview, premac: Premac | None) -> RoundFrame | None:
        """Merge ``rank``'s deposit; returns the completed round's merged frame when
        :meth:`_fold_last_fast` completed the round (else None: :meth:`_complete` decides).

        A frame the codec reads at a remembered layout (``read_known_frame``: the checks its
        full decode makes, without building the frame) is built only when a path needs its
        tensors: a seed's when first used (:attr:`_Round.seed`), a later deposit's at the
        seed's layout never when it is held or completes the round at the layout's offsets."""
        known = _read_known(mv, self._salt, self._ceiling, premac)
        if self._round is None:
            if known is not None:
                lay, weight, consumed = known
                lp = self._layout_plan(lay)
                self._round = _Round(kind=lp.kind, weight=weight, seed_frame=None,
                                     seed_bytes=mv[:consumed], seed_weight=weight, layout=lay,
                                     deposited={rank}, schema=lp.schema)
                return None
            res = decode_round_frame_or_eos(mv, self._salt, ceiling=self._ceiling, premac=premac)
            if res is END_OF_STREAM:
                raise protocol_error("fold.truncated", rank=rank)
            seed, consumed = res
            self._round = _Round(
                kind=seed.kind, weight=seed.weight, seed_frame=seed, seed_bytes=mv[:consumed],
                seed_weight=seed.weight, layout=_known_layout(mv, self._ceiling),
                deposited={rank}, schema=[(t.dtype, t.shape) for t in seed.tensors],
            )
            return None
        rnd = self._round
        # the deposit that completes the round folds its tensors straight into the output
        dead, deposited = self._dead, rnd.deposited
        last = True
        for r in self._ranks:
            if r != rank and r not in dead and r not in deposited:
                last = False
                break
        reader_error: ProtocolError | None = None
        frame: RoundFrame | None = None
        if known is not None:
            lay, weight, _ = known
            if lay is rnd.layout:  # the seed's layout: its tensor count, dtypes, shapes, kind
                if not last:
                    if self._hold(rnd, rank, mv, weight):
                        return None
                elif rnd.sums is None or not any(a is not None for a in rnd.sums):
                    done = self._fold_last_fast(rnd, rank, None, mv, weight)
                    if done is not None:
                        return done
            frame = known_round_frame(lay, weight, mv)
            delivered = list(frame.tensors)
        else:
            try:
                res = decode_round_frame_or_eos(mv, self._salt, ceiling=self._ceiling,
                                                premac=premac)
            except ProtocolError as e:
                reader_error = e
                if e.error_id in _PER_TENSOR_ERRORS:
                    delivered = delivered_tensors(mv, int(e.fields["index"]))
                elif e.error_id in _AFTER_TENSOR_ERRORS:
                    delivered = delivered_tensors(mv, declared_tensor_count(mv))
                else:
                    delivered = []
            else:
                if res is END_OF_STREAM:
                    raise protocol_error("fold.truncated", rank=rank)
                frame = res[0]
                delivered = list(frame.tensors)
        expected = len(rnd.schema)
        if last and frame is not None and rnd.held == [] and (rnd.sums is None or not any(
                a is not None for a in rnd.sums)):
            done = self._fold_last_fast(rnd, rank, frame, mv, frame.weight)
            if done is not None:
                return done
        if rnd.held:
            self._merge_held(rnd)
        if not (last and frame is not None and self._fold_last_small(rnd, rank, delivered)):
            for ti, p in enumerate(delivered):
                self._merge_tensor(rnd, rank, ti, p, expected, last)
        if reader_error is not None:
            raise reader_error
        assert frame is not None
        if frame.kind != rnd.kind:
            raise protocol_error("fold.kind_mismatch", rank=rank, got=frame.kind.label,
                                 expected=rnd.kind.label)
        if len(frame.tensors) != expected:
            raise protocol_error("fold.fewer_tensors", rank=rank, got=len(frame.tensors),
                                 expected=expected)
        total = rnd.weight + frame.weight
        if not math.isfinite(total):  # departure: upstream ships weight inf, the controller fails
            raise protocol_error("fold.weight_overflow", rank=rank, weight=frame.weight,
                                 total=total)
        rnd.weight = total
        rnd.deposited.add(rank)
        return None

    def _complete(self) -> RoundFrame | memoryview | None:
        try:
            return self._take_if_complete()
        except ProtocolError as e:  # pragma: no cover - encoding merged sums cannot fail
            self._error = e
            raise

    def _take_if_complete(self) -> RoundFrame | memoryview | None:
        rnd = self._round
        if rnd is None:
            return None
        dead, deposited = self._dead, rnd.deposited
        for r in self._ranks:
            if r not in dead and r not in deposited:
                return None
        self._round = None
        self._rounds += 1
        if rnd.held:  # completed by a death: the held deposits merge as they would have
            self._merge_held(rnd)
        if rnd.sums is None:
            self._pool.end_round()
            if _same_bits(rnd.weight, rnd.seed_weight):
                return rnd.seed_bytes
            # later deposits, all elided, changed the weight: the seed's tensors (copied, as
            # the caller reuses the blob) under the summed weight
            return RoundFrame.trusted(rnd.kind, rnd.weight, tuple(
                TensorPayload.trusted(t.dtype, t.shape, memoryview(bytes(t.data)))
                for t in rnd.seed.tensors))
        tensors = []
        for ti, ((dtype, shape), acc) in enumerate(zip(rnd.schema, rnd.sums, strict=True)):
            out = rnd.outs.get(ti)
            if out is None:  # not merged by the last deposit: encode the sums as they stand
                out = self._fold_out(rnd, ti, acc, None)
            tensors.append(TensorPayload.trusted(dtype, shape, out.view(np.uint8).data))
        self._pool.end_round()
        return RoundFrame.trusted(rnd.kind, rnd.weight, tuple(tensors))


def _same_bits(a: float, b: float) -> bool:
    """Whether the f64 weights ``a`` and ``b`` have the same bits (``-0.0`` is not ``0.0``)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _rank_arg(value: Any, field: str) -> int:
    """``value`` as a rank id (a plain ``int``): a u32 integer by the codec's integer rule
    (:func:`~flodl_proto.codec._common.wire_int`: NumPy integers are taken; a bool, a float or
    text is refused, never truncated).

    Raises:
        InvalidValue (local): ``fold.bad_argument`` naming ``field`` and the value.
    """
    n = wire_int(value)
    if n is None or not 0 <= n <= U32_MAX:
        raise protocol_error("fold.bad_argument", field=field, value=value,
                             reason="not a rank id (an integer in 0..2**32-1)")
    return n


def _roster(local_ranks: Iterable[int]) -> tuple[int, ...]:
    """The checked roster of :class:`HostFold`: ``local_ranks`` deduplicated, ascending."""
    try:  # a 0-d NumPy array is an Iterable whose iteration raises TypeError
        if isinstance(local_ranks, str | bytes):
            raise TypeError
        ranks = list(local_ranks)
    except TypeError:
        raise protocol_error("fold.bad_argument", field="local_ranks", value=local_ranks,
                             reason="not an iterable of rank ids") from None
    return tuple(sorted({_rank_arg(r, f"local_ranks[{i}]") for i, r in enumerate(ranks)}))

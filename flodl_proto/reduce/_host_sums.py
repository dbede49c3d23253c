"""The arithmetic of the relay's fold (:class:`~flodl_proto.reduce.HostFold`): how a deposit's
tensors are summed into the round once its frame has been read and checked.

:class:`~flodl_proto.reduce.HostFold` builds on :class:`_HostSums`, which holds the per-tensor
merge (schema checks, the seed's promotion to f32 running sums, accumulation), the completing
deposit's one-pass folds straight to the output (a run of small tensors in one batch
(:meth:`_HostSums._fold_last_small`), two frames at a remembered layout, or the seed's
:class:`~flodl_proto.reduce._host_plan._SmallPlan`, with nothing left to check
(:meth:`_HostSums._fold_last_fast`)), the deposits held unmerged until the round's last one
(:meth:`_HostSums._hold`), and a large tensor's kernels split in halves across two threads.
The deposit's read and checks, the barrier's bookkeeping and the completion are in
:mod:`flodl_proto.reduce.host_fold` (the attributes are
:class:`~flodl_proto.reduce.HostFold`'s, set by its constructor).

Upstream: ``flodl/src/distributed/relay/agent.rs`` (``HostFold::accumulate``,
``fold_and_ship``; folded tensor by tensor there).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from .._threads import start_thread
from ..codec.round_frame import RoundFrame, TensorPayload, known_round_frame
from ..errors import protocol_error
from ..spec import DTYPE_F32, ELEMENT_SIZE
from . import _kernels as K
from ._batch import batch_runs
from ._host_plan import LAYOUT_PLANS_KEPT, _ArrayPool, _LayoutPlan, _Round, _SmallPlan

__all__: list[str] = []

#: a tensor of at least this many elements is promoted, accumulated and encoded by two threads
#: (2**21)
_SPLIT_MIN_ELEMS = 1 << 21


class _HostSums:
    """The fold's merge and sums (the attributes are :class:`~flodl_proto.reduce.HostFold`'s,
    set by its constructor)."""

    _version: int
    _ceiling: int
    _round: _Round | None
    _rounds: int
    _ws: K.Workspace | None
    _ws2: K.Workspace | None
    _pool: _ArrayPool
    _plan: _SmallPlan | None
    _layout_plans: dict[Any, _LayoutPlan]

    def _workspace(self) -> K.Workspace:
        if self._ws is None:
            self._ws = K.Workspace()
        return self._ws

    def _hold(self, rnd: _Round, rank: int, buf: memoryview, weight: float) -> bool:
        """Hold a deposit that does not complete the round unmerged, when nothing can fail
        merging it: nothing was accumulated yet, its buffer ``buf`` carries the seed's
        remembered layout (the caller checked: so the seed's kind, tensor count, dtypes, shapes
        and byte counts) and the layout's :class:`_LayoutPlan` has runs, and the summed weight
        (``weight`` is the deposit's) is finite.
        The round's last deposit then sums the seed, the held deposits and itself in one pass
        per run (:meth:`_fold_last_fast`), in deposit order, as the per-tensor path would;
        any other path merges the held deposits first (:meth:`_merge_held`). Returns False,
        having changed nothing, when the deposit must merge now."""
        if rnd.sums is not None or not self._layout_plan(rnd.layout).runs:
            return False
        total = rnd.weight + weight
        if not math.isfinite(total):
            return False
        rnd.held.append((rank, buf, weight))
        rnd.weight = total
        rnd.deposited.add(rank)
        return True

    def _merge_held(self, rnd: _Round) -> None:
        """Merge the deposits :meth:`_hold` held, in deposit order, through the per-tensor
        path (every check of which they pass): the sums are then as if each had merged when it
        arrived."""
        held, rnd.held = rnd.held, []
        expected = len(rnd.schema)
        lay = rnd.layout  # its tensors all carry bytes: the first one merged promotes the seed
        for rank, buf, weight in held:
            for ti, p in enumerate(known_round_frame(lay, weight, buf).tensors):
                self._merge_tensor(rnd, rank, ti, p, expected, False)

    def _fold_last_fast(self, rnd: _Round, rank: int, frame: RoundFrame | None,
                        buf: memoryview, weight: float) -> RoundFrame | None:
        """The completing deposit of a round whose seed is the only earlier deposit merged
        (two ranks a host, more with deaths, or with deposits :meth:`_hold` held), when nothing
        can fail: folded with the seed and the round completed at once. Returns the merged
        frame, or None having changed nothing (the general path then runs and raises whatever
        it raises). ``weight``: the deposit's.

        ``frame`` None: the deposit's buffer ``buf`` carries the metadata bytes of the layout
        the codec's reader remembers for the seed (the caller checked: every round of a run
        after the first), so its kind, tensor count and per tensor dtype, shape and byte count
        are the seed's; taken when that layout's :class:`_LayoutPlan` has runs and the summed
        weight is finite: each run's elements are viewed in the seed's, the held deposits' and
        this buffer at the plan's offsets (a run of tensors of one length as one 2-D view,
        summed in one add per contribution).

        Else (nothing held): taken when the seed layout's :class:`_SmallPlan` is eligible, the
        deposit carries the seed's kind, tensor count, and per tensor its dtype, shape and
        byte count, and the summed weight is finite, tensor by tensor.

        Either way every check of :meth:`_merge` and :meth:`_fold_last_small` passes, and the
        result is theirs: the same ``K.sum_small_batch`` over the same elements, the payloads
        the same bytes (slices of each run's output), the same weight, kind and completion
        bookkeeping."""
        if frame is not None and frame.kind is not rnd.kind:
            return None
        weight = rnd.weight + weight
        if not math.isfinite(weight):
            return None
        ws = self._ws if self._ws is not None else self._workspace()
        trusted = TensorPayload.trusted
        out_tensors: list[TensorPayload] = []
        if frame is None:
            lp = self._layout_plan(rnd.layout)
            if not lp.runs:
                return None
            views = lp.views
            held = rnd.held
            bufs = ([rnd.seed_bytes, *[b for _, b, _ in held], buf] if held
                    else [rnd.seed_bytes, buf])
            for dtype, np_dtype, total, segs, where in lp.runs:
                out = K.sum_small_batch([views(b, np_dtype, where) for b in bufs], dtype, total,
                                        None, ws)
                data = out.view(np.uint8).data
                for shape, lo, hi in segs:
                    out_tensors.append(trusted(dtype, shape, data[lo:hi]))
        else:
            seed = rnd.seed.tensors
            key = tuple([(t.dtype, t.shape, t.data.nbytes) for t in seed])
            plan = self._plan
            if plan is None or plan.key != key:
                plan = self._plan = _SmallPlan(key, self._version, self._ceiling)
            tensors = frame.tensors
            if not plan.eligible or tuple([(t.dtype, t.shape, t.data.nbytes)
                                           for t in tensors]) != key:
                return None
            frombuffer = np.frombuffer
            for i, j, total, dtype, np_dtype, segs in plan.runs:
                out = K.sum_small_batch(
                    [[frombuffer(seed[t].data, np_dtype) for t in range(i, j)],
                     [frombuffer(tensors[t].data, np_dtype) for t in range(i, j)]],
                    dtype, total, None, ws)
                data = out.view(np.uint8).data
                for shape, lo, hi in segs:
                    out_tensors.append(trusted(dtype, shape, data[lo:hi]))
        rnd.weight = weight
        rnd.deposited.add(rank)
        self._round = None
        self._rounds += 1
        self._pool.end_round()
        return RoundFrame.trusted(rnd.kind, weight, tuple(out_tensors))

    def _layout_plan(self, lay: Any) -> _LayoutPlan:
        """The :class:`_LayoutPlan` of a remembered layout (built at its first use)."""
        plans = self._layout_plans
        lp = plans.get(lay)
        if lp is None:
            if len(plans) >= LAYOUT_PLANS_KEPT:
                plans.clear()
            lp = plans[lay] = _LayoutPlan(lay, self._version, self._ceiling)
        return lp

    def _merge_tensor(
        self, rnd: _Round, rank: int, ti: int, p: TensorPayload, expected: int, last: bool
    ) -> None:
        if ti >= expected:
            raise protocol_error("fold.more_tensors", rank=rank, expected=expected)
        want_dtype, want_shape = rnd.schema[ti]
        if p.dtype != want_dtype:
            raise protocol_error("fold.dtype_mismatch", rank=rank, index=ti, got=p.dtype,
                                 expected=want_dtype)
        if p.shape != want_shape:
            raise protocol_error("fold.shape_mismatch", rank=rank, index=ti, got=list(p.shape),
                                 expected=list(want_shape))
        if self._version >= 3 and p.elided:
            return
        if rnd.sums is None:
            rnd.sums = self._promote(rnd)
        numel = rnd.seed.tensors[ti].numel
        es = ELEMENT_SIZE[p.dtype]  # known: promotion validated every seed dtype
        if p.nbytes != numel * es:
            raise protocol_error("fold.accumulate_nbytes", rank=rank, index=ti, got=p.nbytes,
                                 numel=numel, element_size=es)
        acc = rnd.sums[ti]
        if last:  # no later deposit reads the sums: sum and encode in one pass
            rnd.outs[ti] = self._fold_out(rnd, ti, acc, _view(p))
            return
        if acc is None:
            acc = rnd.sums[ti] = self._materialise(rnd, ti)
        self._accumulate(acc, _view(p), p.dtype)

    def _fold_last_small(self, rnd: _Round, rank: int, tensors: list[TensorPayload]) -> bool:
        """The completing deposit of a round whose tensors are all small, folded with the seed
        in batches (``K.sum_small_batch``: one widening, add and encode per run of consecutive
        tensors of one dtype, at most ``K.CHUNK_ELEMS`` elements, as ``batch_runs`` groups
        them; each tensor's payload a slice of its batch's array), bit-identical to
        :meth:`_merge_tensor` tensor by tensor.

        Taken only when nothing was accumulated yet (the seed is the only earlier deposit),
        the round has tensors, every tensor of the seed has fewer than ``K.SMALL_ELEMS``
        elements, the deposit has the seed's tensor count, dtypes and shapes, and (version 3)
        no payload of either is elided;
        then the remaining checks raise the per-tensor path's errors in its order (the seed's
        promotion checks, then each tensor's byte count). Returns False, having changed
        nothing, when the per-tensor path must run."""
        if not tensors or len(tensors) != len(rnd.schema) or (
                rnd.sums is not None and any(a is not None for a in rnd.sums)):
            return False  # a round without tensors never promotes: its seed's (none) ship
        seed = rnd.seed.tensors
        numels = [t.numel for t in seed]
        v3 = self._version >= 3
        for ti, p in enumerate(tensors):
            want_dtype, want_shape = rnd.schema[ti]
            if p.dtype != want_dtype or p.shape != want_shape \
                    or numels[ti] >= K.SMALL_ELEMS or (v3 and (p.elided or seed[ti].elided)):
                return False
        if rnd.sums is None:
            rnd.sums = self._promote(rnd)
        for ti, p in enumerate(tensors):
            numel = numels[ti]
            es = ELEMENT_SIZE[p.dtype]  # known: promotion validated every seed dtype
            if p.nbytes != numel * es:
                raise protocol_error("fold.accumulate_nbytes", rank=rank, index=ti,
                                     got=p.nbytes, numel=numel, element_size=es)
        ws = self._workspace()
        for i, j, total in batch_runs([p.dtype for p in tensors], numels):
            out = K.sum_small_batch([[_view(t) for t in seed[i:j]],
                                     [_view(t) for t in tensors[i:j]]], tensors[i].dtype, total,
                                    None, ws)
            at = 0
            for ti in range(i, j):
                stop = at + numels[ti]
                rnd.outs[ti] = out[at:stop]
                at = stop
        return True

    def _seed_view(self, rnd: _Round, ti: int) -> npt.NDArray[Any] | None:
        """The seed's tensor ``ti`` as elements, or None for an elided one (zeros)."""
        t = rnd.seed.tensors[ti]
        return None if (self._version >= 3 and t.elided) else _view(t)

    def _materialise(self, rnd: _Round, ti: int) -> npt.NDArray[np.float32]:
        """Tensor ``ti``'s running sums: a pooled f32 array holding ``0.0 + seed``."""
        t = rnd.seed.tensors[ti]
        acc = self._pool.acquire(t.numel, K.F32)
        view = self._seed_view(rnd, ti)
        dtype = t.dtype
        self._split(t.numel, lambda lo, hi, ws: K.promote_into(
            acc[lo:hi], None if view is None else view[lo:hi], dtype, ws))
        return acc

    def _fold_out(self, rnd: _Round, ti: int, acc: npt.NDArray[np.float32] | None,
                  view: npt.NDArray[Any] | None) -> npt.NDArray[Any]:
        """Tensor ``ti``'s payload: its sums (``acc``, or ``0.0 + seed`` when None) plus
        ``view`` (None: nothing more), encoded in its dtype, in one pass (``K.fold_into``)."""
        dtype, _ = rnd.schema[ti]
        numel = rnd.seed.tensors[ti].numel
        if dtype == DTYPE_F32 and acc is not None:
            if view is None:
                return acc  # f32 sums are their own encoding
            out = acc
        else:
            out = self._pool.acquire(numel, K.F32 if dtype == DTYPE_F32 else K.U16)
        views = [] if acc is not None else [self._seed_view(rnd, ti)]
        views.append(view)
        present = [v for v in views if v is not None]
        if numel < K.SMALL_ELEMS:  # under deposit_frame's warning context: no set-up per call
            K.fold_small(out, acc, present, dtype, self._workspace())
            return out
        self._split(numel, lambda lo, hi, ws: K.fold_into(
            out[lo:hi], None if acc is None else acc[lo:hi], [v[lo:hi] for v in present],
            dtype, ws))
        return out

    def _accumulate(self, acc: npt.NDArray[np.float32], view: npt.NDArray[Any], dtype: int) -> None:
        """``K.accumulate`` (split in halves across two threads for a large tensor)."""
        self._split(acc.shape[0],
                    lambda lo, hi, ws: K.accumulate(acc[lo:hi], view[lo:hi], dtype, ws))

    def _split(self, n: int, body: Any) -> None:
        """``body(lo, hi, workspace)`` over ``[0, n)``: in one call for a small tensor, else in
        halves on two threads (the kernels are element-wise, so the halves are independent and
        the result is bit-identical; the second thread is joined here, its error re-raised)."""
        if n < _SPLIT_MIN_ELEMS or K.default_threads() < 2:
            body(0, n, self._workspace())
            return
        half = n // 2
        if self._ws2 is None:
            self._ws2 = K.Workspace()
        ws2 = self._ws2
        errors: list[BaseException] = []

        def second() -> None:
            try:
                body(half, n, ws2)
            except BaseException as e:  # pragma: no cover - re-raised below
                errors.append(e)

        t = threading.Thread(target=second, name="flodl-fold")
        start_thread(t)
        try:
            body(0, half, self._workspace())
        finally:
            t.join()
        if errors:  # pragma: no cover - the kernel raises nothing on validated input
            raise errors[0]

    def _promote(self, rnd: _Round) -> list[npt.NDArray[np.float32] | None]:
        v3 = self._version >= 3
        total = 0
        for t in rnd.seed.tensors:  # every check first, in upstream's order, then allocate
            es = ELEMENT_SIZE.get(t.dtype)
            if es is None:
                raise protocol_error("fold.unknown_dtype", dtype=t.dtype)
            if (not v3 or not t.elided) and t.nbytes != t.numel * es:
                raise protocol_error("fold.seed_promotion", got=t.nbytes, numel=t.numel,
                                     element_size=es)
            total += t.numel * es
        if total > self._ceiling:
            raise protocol_error("fold.elided_too_large", nbytes=total, ceiling=self._ceiling)
        # the seed's tensors are materialised (or folded into the output) when first needed;
        # the seed's blob stays referenced until the round completes
        return [None] * len(rnd.seed.tensors)


def _view(p: TensorPayload) -> npt.NDArray[Any]:
    return np.frombuffer(p.data, dtype=K.F32 if p.dtype == DTYPE_F32 else K.U16)

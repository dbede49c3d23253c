"""What the relay's fold (:class:`~flodl_proto.reduce.HostFold`) keeps: the state of the round
in progress (:class:`_Round`) and, from round to round, the pooled arrays (:class:`_ArrayPool`),
the checks a seed layout allows the completing deposit of a two-deposit round
(:class:`_SmallPlan`), and, per frame layout the codec's reader remembers, where each tensor's
elements sit in a frame of that layout (:class:`_LayoutPlan`), so two frames of that layout are
folded run by run from their buffers (a run of tensors of one length as one 2-D view each).

Upstream: none (``flodl/src/distributed/relay/agent.rs`` folds tensor by tensor).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..codec.round_frame import RoundFrame, RoundKind, known_round_frame
from ..spec import DTYPE_F32, ELEMENT_SIZE
from . import _kernels as K
from ._batch import batch_runs

__all__ = ["LAYOUT_PLANS_KEPT"]

#: layouts whose :class:`_LayoutPlan` is kept (all are dropped when a new one would exceed it)
LAYOUT_PLANS_KEPT = 8


@dataclass(slots=True)
class _Round:
    kind: RoundKind
    weight: float
    #: the seed's frame, or None until first needed (see :attr:`seed`)
    seed_frame: RoundFrame | None
    seed_bytes: memoryview
    seed_weight: float
    #: the layout the codec's reader remembers for the seed's frame (``_known_layout``), or None
    layout: Any
    deposited: set[int] = field(default_factory=set)
    #: per-tensor (dtype, shape) pinned by the seed
    schema: Sequence[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    #: once promoted: per tensor, its f32 running sums, or None while the seed's tensor has not
    #: been materialised (it is folded straight into the output when the round's last deposit
    #: merges into it, or at completion)
    sums: list[npt.NDArray[np.float32] | None] | None = None
    #: per tensor index, the encoded payload the round's last deposit produced
    outs: dict[int, npt.NDArray[Any]] = field(default_factory=dict)
    #: deposits after the seed held unmerged, in deposit order: ``(rank, buffer, weight)`` of a
    #: frame at the seed's remembered layout (see :meth:`HostFold._hold`)
    held: list[tuple[int, memoryview, float]] = field(default_factory=list)

    @property
    def seed(self) -> RoundFrame:
        """The seed's frame (a seed read at a remembered layout is built at its first use)."""
        frame = self.seed_frame
        if frame is None:
            frame = self.seed_frame = known_round_frame(self.layout, self.seed_weight,
                                                        self.seed_bytes)
        return frame


class _ArrayPool:
    """Flat arrays (f32 running sums, bf16 encodings) reused from round to round.

    A fresh multi-MiB array costs a page fault per 4 KiB page on first touch, on the fold's
    critical path; a pooled one is already mapped. An array is handed out only when nothing but
    the pool references it (no view, memoryview or frame of a finished round holds it), and every
    user overwrites all of its elements, so no round sees another round's data. Arrays not handed
    out in the current or the previous round are dropped (:meth:`end_round`), so the pool holds
    at most two rounds' working sets.
    """

    __slots__ = ("_entries", "_round")

    #: references to a pooled array that nobody else holds: the entry list, the loop variable
    #: and getrefcount's argument
    _FREE_REFS = 3

    def __init__(self) -> None:
        self._entries: list[list[Any]] = []  # [array, last round it was handed out]
        self._round = 0

    def acquire(self, numel: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        """A flat ``numel``-element array of ``dtype`` (contents unspecified)."""
        for entry in self._entries:
            arr = entry[0]
            if (arr.shape[0] == numel and arr.dtype == dtype
                    and sys.getrefcount(arr) <= self._FREE_REFS):
                entry[1] = self._round
                return arr  # type: ignore[no-any-return]
        arr = np.empty(numel, dtype)
        self._entries.append([arr, self._round])
        return arr

    def end_round(self) -> None:
        """Close a round: drop the arrays not handed out in it or in the one before."""
        self._entries = [e for e in self._entries if e[1] >= self._round - 1]
        self._round += 1

    def __len__(self) -> int:
        return len(self._entries)


class _SmallPlan:
    """What a seed layout allows the completing deposit of a two-deposit round
    (:meth:`HostFold._fold_last_fast`), worked out once per layout instead of every round.

    ``key``: per tensor of the seed, ``(dtype, shape, nbytes)``. ``eligible``: the round has
    tensors, every dtype is f32 or bf16, every tensor has fewer than ``K.SMALL_ELEMS``
    elements and carries exactly ``numel x element size`` bytes (at version 3 also more than
    none: no elided payload, zero-element tensors included, as ``_fold_last_small`` requires),
    and those bytes add up to no more than the ceiling: the seed's promotion and every
    tensor's dtype, shape and byte count checks then pass for a deposit with the same key.
    ``runs``: ``batch_runs`` over the tensors, each with its dtype, the NumPy dtype of its
    elements and, per tensor, its shape and byte range in the run's output."""

    __slots__ = ("eligible", "key", "runs")

    def __init__(self, key: tuple[tuple[int, tuple[int, ...], int], ...], version: int,
                 ceiling: int) -> None:
        self.key = key
        self.runs: list[tuple[int, int, int, int, np.dtype[Any],
                              list[tuple[tuple[int, ...], int, int]]]] = []
        numels = []
        total_bytes = 0
        eligible = bool(key)
        for dtype, shape, nbytes in key:
            es = ELEMENT_SIZE.get(dtype)
            numel = 1
            for d in shape:
                numel *= d
            numels.append(numel)
            if es is None or nbytes != numel * es or numel >= K.SMALL_ELEMS \
                    or (version >= 3 and nbytes == 0):
                eligible = False
                break
            total_bytes += nbytes
        self.eligible = eligible and total_bytes <= ceiling
        if not self.eligible:
            return
        dtypes = [d for d, _, _ in key]
        for i, j, total in batch_runs(dtypes, numels):
            dtype = dtypes[i]
            es = ELEMENT_SIZE[dtype]
            segs = []
            at = 0
            for ti in range(i, j):
                segs.append((key[ti][1], at, at + numels[ti] * es))
                at += numels[ti] * es
            self.runs.append((i, j, total, dtype, K.F32 if dtype == DTYPE_F32 else K.U16, segs))


class _LayoutPlan:
    """A remembered frame layout's plan: the frame's ``kind``, its ``schema`` (per tensor
    ``(dtype, shape)``, as the fold pins a seed's), its :class:`_SmallPlan` and, when that is
    eligible and every tensor has elements, per run of the plan where its elements sit in a
    frame of the layout (``runs``: the run's dtype, element NumPy dtype, element count, the
    plan's per-tensor ``(shape, lo, hi)`` in the run's output, and how to view a frame's
    elements: ``(start, rows, numel, row stride)`` when the run's tensors have one length and
    are evenly spaced (one 2-D view), else ``(start, numel)`` per tensor)."""

    __slots__ = ("kind", "plan", "runs", "schema")

    def __init__(self, lay: Any, version: int, ceiling: int) -> None:
        entries = lay.entries
        self.kind = RoundKind(lay.kind)
        self.schema = tuple([(d, s) for d, s, _, _ in entries])
        self.plan = _SmallPlan(tuple([(d, s, b - a) for d, s, a, b in entries]), version,
                               ceiling)
        self.runs: list[tuple[int, np.dtype[Any], int, list[tuple[tuple[int, ...], int, int]],
                              Any]] = []
        if not self.plan.eligible or any(a == b for _, _, a, b in entries):
            return
        for i, j, total, dtype, np_dtype, segs in self.plan.runs:
            es = ELEMENT_SIZE[dtype]
            spans = [(entries[t][2], (entries[t][3] - entries[t][2]) // es) for t in range(i, j)]
            step = spans[1][0] - spans[0][0] if j - i > 1 else 0
            even = all(n == spans[0][1] and a == spans[0][0] + k * step
                       for k, (a, n) in enumerate(spans))
            self.runs.append((dtype, np_dtype, total, segs,
                              (spans[0][0], j - i, spans[0][1], step) if even else spans))

    @staticmethod
    def views(buf: memoryview, np_dtype: np.dtype[Any], where: Any) -> Any:
        """A frame's elements of one run (see the class doc): one 2-D view (a row a tensor)
        or a list of 1-D views."""
        if type(where) is tuple:
            start, rows, numel, step = where
            return np.ndarray((rows, numel), np_dtype, buf, start,
                              (step, np_dtype.itemsize))
        return [np.frombuffer(buf, np_dtype, n, a) for a, n in where]

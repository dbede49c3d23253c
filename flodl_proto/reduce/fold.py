"""The fold monoid and the controller's realized-work reduce.

:func:`sum_frames` is the element-wise sum shared by every fold tier (relay and controller): it
never divides. :func:`reduce_realized_work` is the controller's reduce: the sum of the accepted
frames, then (Model rounds with a positive mass only) multiplied once by the f32 reciprocal of
the summed mass. The mass policies of the senders (:func:`gamma_mass`, :func:`mover_mass`) and
the zero-mass rule (:func:`is_realized`) live here too.

Byte exactness (pinned by the ``reduce`` vectors):

* the sum is accumulated in f32 from ``+0.0`` in list order, bf16 widened exactly, and
  re-encoded in the frame's dtype (bf16: round-to-nearest-even with upstream's NaN rule);
* the weight sum starts from ``-0.0`` (Rust's f64 ``Sum``), so two ``-0.0`` weights sum to
  ``-0.0`` and the round is zero-mass;
* normalisation multiplies by ``np.float32(1.0 / w)`` (a reciprocal computed in f64, rounded to
  f32), it does not divide: ``10 * f32(1/3) = 3.3333335``; a mass of ``1e-300`` gives ``+inf``;
* bf16 consensus is rounded twice (sum -> bf16, then scaled -> bf16);
* version 3: elided payloads add nothing; a tensor elided in every frame stays elided.
  Version 2: elided payloads are rejected with upstream's byte-count errors.

Every size is checked before anything is allocated (the accumulator included); the errors and
their order are upstream's.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` (``sum_frames``,
``reduce_realized_work``), ``flodl/src/distributed/realized_work.rs``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .._names import adopt
from ..codec._common import check_version, underflow_reason, wire_int, wire_real
from ..codec.round_frame import RoundFrame, RoundKind, TensorPayload
from ..errors import ProtocolError, protocol_error
from ..spec import DEFAULT_VERSION, DTYPE_F32, ELEMENT_SIZE
from . import _kernels as K
from ._batch import batch_runs
from ._pool import OutputPool
from ._quiet import quiet_enter, quiet_exit

__all__ = [
    "OutputPool",
    "gamma_mass",
    "is_realized",
    "mover_mass",
    "reduce_realized_work",
    "sum_frames",
]

# its code lives in reduce/_pool.py; it is this module's name, so help(), pydoc and pickle name
# it (set once, at import)
adopt(__name__, OutputPool)


def gamma_mass(n: float, gamma: float) -> float:
    """Realized-work mass of a params contribution: ``n ** gamma`` with the idle guard.

    Args:
        n: the unit's optimizer steps since the last sync.
        gamma: the allocation exponent (1.0 plain work weighting, 0.0 unweighted over movers,
            -1.0 per-step equal).

    Both are f64 values upstream: any real number is taken (``int``, ``float``, NumPy integer
    and floating scalars; an ``int`` beyond the f64 range as an infinity of its sign).

    Returns:
        0.0 when ``n <= 0`` (for any ``gamma``: no ``0 ** 0 = 1`` vote, no ``0 ** -1 = inf``);
        ``n`` when ``gamma == 1.0``; else ``n ** gamma`` (f64 ``pow``). As upstream's f64
        ``powf``, a power beyond the f64 range is ``inf`` (``gamma_mass(1e308, 2.0)``), one
        below it ``0.0``, and a NaN argument gives NaN (``n`` NaN: NaN for any ``gamma``).

    Raises:
        InvalidValue (local): ``n`` or ``gamma`` is not a real number (``None``, text such as
            ``"2"``, a bool): ``controller.bad_argument`` naming it and the value.

    Upstream: ``realized_work.rs`` ``gamma_mass``.
    """
    x = _real("n", n)
    g = _real("gamma", gamma)
    if x <= 0.0:
        return 0.0
    if g == 1.0:
        return x
    try:
        return math.pow(x, g)
    except OverflowError:  # f64 powf saturates: x > 0, so the power is +inf
        return math.inf


def mover_mass(n: float) -> float:
    """Realized-work mass of a buffers contribution: 1.0 if ``n > 0`` else 0.0.

    Raises:
        InvalidValue (local): ``n`` is not a real number (``controller.bad_argument``, as
            :func:`gamma_mass`).

    Upstream: ``realized_work.rs`` ``mover_mass``.
    """
    return 1.0 if _real("n", n) > 0.0 else 0.0


def is_realized(mass: float) -> bool:
    """The zero-mass round rule: True when ``mass > 0.0`` (a round of mass 0, -0.0 or below
    realized nothing, and so did NaN; receivers keep their local state).

    Raises:
        InvalidValue (local): ``mass`` is not a real number (``controller.bad_argument``, as
            :func:`gamma_mass`).

    Upstream: ``realized_work.rs`` ``is_realized``.
    """
    if type(mass) is not float:  # a frame's weight always is: one type test
        mass = _real("mass", mass)
    return mass > 0.0


def _real(field: str, value: Any) -> float:
    """``value`` as a float by the real-number rule (:func:`~flodl_proto.codec._common.wire_real`).

    Raises:
        InvalidValue (local): ``controller.bad_argument`` naming ``field`` and the value: no
            real number, or a nonzero ``Fraction`` whose f64 is a zero
            (:func:`~flodl_proto.codec._common.underflow_reason`).
    """
    x = wire_real(value)
    if x is None:
        raise protocol_error("controller.bad_argument", field=field, value=value,
                             reason="not a real number")
    if x == 0.0 and (tiny := underflow_reason(value, x)) is not None:
        raise protocol_error("controller.bad_argument", field=field, value=value, reason=tiny)
    return x


def _view(p: TensorPayload) -> npt.NDArray[Any]:
    return np.frombuffer(p.data, dtype=K.F32 if p.dtype == DTYPE_F32 else K.U16)


def _check_schema(frames: Sequence[RoundFrame], v3: bool) -> None:
    ref = frames[0]
    for i in range(1, len(frames)):
        f = frames[i]
        if f.kind != ref.kind:
            raise protocol_error("reduce.kind_mismatch", frame=i, got=f.kind.label,
                                 expected=ref.kind.label)
        if len(f.tensors) != len(ref.tensors):
            raise protocol_error("reduce.count_mismatch", frame=i, got=len(f.tensors),
                                 expected=len(ref.tensors))
        for ti, (a, b) in enumerate(zip(ref.tensors, f.tensors, strict=True)):
            if a.dtype != b.dtype:
                raise protocol_error("reduce.dtype_mismatch", frame=i, index=ti, got=b.dtype,
                                     expected=a.dtype)
            if a.shape != b.shape:
                raise protocol_error("reduce.shape_mismatch", frame=i, index=ti,
                                     got=list(b.shape), expected=list(a.shape))
            compare = not (a.elided or b.elided) if v3 else True
            if compare and a.nbytes != b.nbytes:
                raise protocol_error("reduce.nbytes_mismatch", frame=i, index=ti, got=b.nbytes,
                                     expected=a.nbytes)


def _plan(frames: Sequence[RoundFrame], v3: bool) -> list[list[TensorPayload] | None]:
    """Per tensor: the payloads to add (None: elided in every frame). Raises upstream's per-tensor
    errors in upstream's order, before anything is allocated."""
    ref = frames[0]
    plan: list[list[TensorPayload] | None] = []
    for ti, t0 in enumerate(ref.tensors):
        es = ELEMENT_SIZE.get(t0.dtype)
        if es is None:
            raise protocol_error("reduce.unknown_dtype", index=ti, dtype=t0.dtype)
        expected = t0.numel * es
        if (not v3 or not t0.elided) and t0.nbytes != expected:
            raise protocol_error("reduce.seed_nbytes", index=ti, shape=list(t0.shape),
                                 expected=expected, got=t0.nbytes)
        if v3 and all(f.tensors[ti].elided for f in frames):
            plan.append(None)
            continue
        contribs: list[TensorPayload] = []
        for f in frames:
            p = f.tensors[ti]
            if v3 and p.elided:
                continue
            if p.nbytes != expected:
                raise protocol_error("reduce.accumulate_nbytes", got=p.nbytes, numel=t0.numel,
                                     element_size=es)
            contribs.append(p)
        plan.append(contribs)
    return plan


def _fold(
    frames: Sequence[RoundFrame], version: int, normalise: bool, threads: int,
    pool: OutputPool | None = None,
) -> RoundFrame:
    check_version(version)
    workers = max(1, int(threads))
    if not frames:
        raise protocol_error("reduce.no_frames")
    v3 = version >= 3
    ref = frames[0]
    weight = -0.0
    for f in frames:
        weight += f.weight
    small = _small_plan(frames, v3)
    if small is not None:  # the schema and the plan are the ones of an earlier round
        if not math.isfinite(weight):
            raise protocol_error("reduce.weight_overflow", count=len(frames), weight=weight)
        return RoundFrame.trusted(ref.kind, weight,
                                  _sum_small_planned(small, frames, normalise, weight))
    _check_schema(frames, v3)
    plan = _plan(frames, v3)
    if not math.isfinite(weight):  # departure: refused here rather than scattered
        raise protocol_error("reduce.weight_overflow", count=len(frames), weight=weight)
    scale: np.float32 | None = None
    if normalise and ref.kind is RoundKind.MODEL and is_realized(weight):
        with np.errstate(over="ignore"):
            scale = np.float32(1.0 / weight)
    numels = [t.numel for t in ref.tensors]
    if max(numels, default=0) < K.SMALL_ELEMS:
        return RoundFrame.trusted(ref.kind, weight,
                                  tuple(_sum_small_tensors(ref, numels, plan, scale)))
    ws = K.Workspace()
    out: list[TensorPayload] = []
    for i, (t0, contribs) in enumerate(zip(ref.tensors, plan, strict=True)):
        if contribs is None:
            out.append(TensorPayload(t0.dtype, t0.shape, b""))
            continue
        dest = None if pool is None else pool.take(
            i, K.F32 if t0.dtype == DTYPE_F32 else K.U16, t0.numel)
        arr = K.sum_contributions([_view(p) for p in contribs], t0.dtype, t0.numel, scale, ws,
                                  workers, dest)
        out.append(TensorPayload(t0.dtype, t0.shape, arr.view(np.uint8).data))
    return RoundFrame(ref.kind, weight, out)


def _sum_small_tensors(ref: RoundFrame, numels: list[int],
                       plan: list[list[TensorPayload] | None],
                       scale: np.float32 | None) -> list[TensorPayload]:
    """The summed tensors of a fold whose every tensor has fewer than ``K.SMALL_ELEMS``
    elements, under one warning context: consecutive tensors of one dtype that every frame
    carries are summed together by :func:`K.sum_small_batch` (the runs of
    :func:`._batch.batch_runs`: at most ``K.CHUNK_ELEMS`` elements a batch; their payloads are
    slices of one array), any other tensor by
    :func:`K.sum_small` (bit-identical to the general path; the per-tensor set-up is what a
    small round's reduce spends its time on). ``numels``: each tensor's element count."""
    full = max([len(c) for c in plan if c is not None], default=0)
    ws = K.Workspace(min(K.CHUNK_ELEMS, sum(numels)))
    # batchable: a tensor every frame carries (version 3: elided in none); keyed by its dtype
    keys = [t.dtype if c is not None and len(c) == full else None
            for t, c in zip(ref.tensors, plan, strict=True)]
    out: list[TensorPayload] = []
    with np.errstate(all="ignore"):
        for i, j, total in batch_runs(keys, numels):
            t0 = ref.tensors[i]
            contribs = plan[i]
            if contribs is None:
                out.append(TensorPayload(t0.dtype, t0.shape, b""))
            elif keys[i] is None:  # version 3: elided in some frames, summed on its own
                arr = K.sum_small([_view(p) for p in contribs], t0.dtype, numels[i], scale, ws)
                out.append(TensorPayload.trusted(t0.dtype, t0.shape, arr.view(np.uint8).data))
            else:  # the batch: tensors i .. j-1
                dtype = t0.dtype
                batch = plan[i:j]
                views = [[_view(c[k]) for c in batch] for k in range(full)]  # type: ignore[index]
                data = K.sum_small_batch(views, dtype, total, scale, ws).view(np.uint8).data
                es = ELEMENT_SIZE[dtype]
                at = 0
                for k in range(i, j):
                    stop = at + numels[k] * es
                    out.append(TensorPayload.trusted(dtype, ref.tensors[k].shape,
                                                     data[at:stop]))
                    at = stop
    return out


class _SmallPlan:
    """What :func:`_fold` decides for a round of small tensors from the frames' schema alone
    (kind; per tensor dtype, shape and byte count; the version's elision rule), kept for the
    next round of the same schema: the runs of :func:`_sum_small_tensors` and the tensors
    elided in every frame. Only a schema for which :func:`_check_schema` and :func:`_plan`
    raise nothing and every tensor has fewer than ``K.SMALL_ELEMS`` elements gets one."""

    __slots__ = ("runs", "ws_elems")

    def __init__(self, ref: RoundFrame, v3: bool) -> None:
        numels = [t.numel for t in ref.tensors]
        # batchable: a tensor every frame carries; elided (version 3) in one frame means elided
        # in every frame here, as every frame has the same byte counts
        keys = [None if v3 and t.elided else t.dtype for t in ref.tensors]
        #: per run: dtype (None: one tensor elided in every frame), tensors i .. j-1, total
        #: elements, and per tensor its shape and byte range in the run's output
        self.runs: list[tuple[int | None, int, int, int, list[tuple[tuple[int, ...], int, int]]]]
        self.runs = []
        bf16 = False
        for i, j, total in batch_runs(keys, numels):
            dtype = keys[i]
            if dtype is None:
                self.runs.append((None, i, j, 0, [(ref.tensors[i].shape, 0, 0)]))
                continue
            es = ELEMENT_SIZE[dtype]
            at = 0
            spans = []
            for k in range(i, j):
                stop = at + numels[k] * es
                spans.append((ref.tensors[k].shape, at, stop))
                at = stop
            bf16 = bf16 or dtype != DTYPE_F32
            self.runs.append((dtype, i, j, total, spans))
        #: the bf16 runs' workspace size in elements (0: no bf16 run, no workspace)
        self.ws_elems = min(K.CHUNK_ELEMS, sum(numels)) if bf16 else 0


#: schema -> its plan (None: the general path decides); cleared when it holds too many
_small_plans: dict[tuple[Any, ...], _SmallPlan | None] = {}
_SMALL_PLANS_MAX = 16


def _schema(frame: RoundFrame) -> tuple[Any, ...]:
    return (frame.kind, *[(t.dtype, t.shape, t.data.nbytes) for t in frame.tensors])


def _small_plan(frames: Sequence[RoundFrame], v3: bool) -> _SmallPlan | None:
    """The remembered plan when every frame has frame 0's schema, else None (then
    :func:`_check_schema` and :func:`_plan` decide, and raise any error, as for any frame).

    With equal schemas :func:`_check_schema` has nothing to report, and :func:`_plan`'s outcome
    depends on the schema alone; a schema seen for the first time is judged by running them on
    frame 0 (which raises nothing then, or the schema gets no plan)."""
    key = _schema(frames[0])
    for i in range(1, len(frames)):
        if _schema(frames[i]) != key:
            return None
    key = (v3, *key)
    try:
        return _small_plans[key]
    except KeyError:
        pass
    ref = frames[0]
    plan: _SmallPlan | None = None
    try:
        _plan([ref], v3)
    except ProtocolError:
        pass
    else:
        if max([t.numel for t in ref.tensors], default=0) < K.SMALL_ELEMS:
            plan = _SmallPlan(ref, v3)
    if len(_small_plans) >= _SMALL_PLANS_MAX:
        _small_plans.clear()
    _small_plans[key] = plan
    return plan


def _sum_small_planned(plan: _SmallPlan, frames: Sequence[RoundFrame], normalise: bool,
                       weight: float) -> tuple[TensorPayload, ...]:
    """:func:`_sum_small_tensors` of ``frames`` from their remembered plan: the same runs,
    kernels and payloads, without judging the schema again."""
    ws = K.Workspace(plan.ws_elems) if plan.ws_elems else _NO_WORKSPACE
    out: list[TensorPayload] = []
    trusted = TensorPayload.trusted
    frombuffer = np.frombuffer
    quiet = quiet_enter()  # np.errstate(all="ignore"), without its object: once per fold
    try:
        scale: np.float32 | None = None
        if normalise and frames[0].kind is RoundKind.MODEL and is_realized(weight):
            scale = np.float32(1.0 / weight)
        for dtype, i, j, total, spans in plan.runs:
            if dtype is None:
                t0 = frames[0].tensors[i]
                out.append(TensorPayload(t0.dtype, t0.shape, b""))
                continue
            np_dtype = K.F32 if dtype == DTYPE_F32 else K.U16
            views = [[frombuffer(t.data, dtype=np_dtype) for t in f.tensors[i:j]]
                     for f in frames]
            data = K.sum_small_batch(views, dtype, total, scale, ws).view(np.uint8).data
            for shape, a, b in spans:
                out.append(trusted(dtype, shape, data[a:b]))
    finally:
        quiet_exit(quiet)
    return tuple(out)


_NO_WORKSPACE = K.Workspace(0)


def _checked_args(frames: Iterable[RoundFrame | None], threads: object, none_ok: bool
                  ) -> tuple[Sequence[RoundFrame | None], int]:
    """The public folds' ``frames`` (as a list or tuple: another iterable, a generator, is
    materialised, its frames referenced, never copied) and ``threads``, checked once per frame
    (``isinstance``): a frame that is no :class:`RoundFrame` (``None`` too unless ``none_ok``)
    and ``threads`` that is no whole number >= 1 (a bool, a float or text is refused, never
    truncated) are local errors naming the argument.

    Raises:
        InvalidValue (local): ``controller.bad_argument`` naming ``frames``, ``frames[i]`` (with
            the type of what is there) or ``threads`` and the value.
    """
    n = wire_int(threads)
    if n is None or n < 1:
        raise protocol_error("controller.bad_argument", field="threads", value=threads,
                             reason="not a whole number >= 1")
    if not isinstance(frames, list | tuple):
        if frames is None or isinstance(frames, RoundFrame) or not isinstance(frames, Iterable):
            what = "RoundFrame or None" if none_ok else "RoundFrame"
            one = " (one frame: pass [frame])" if isinstance(frames, RoundFrame) else ""
            raise protocol_error("controller.bad_argument", field="frames",
                                 value=None if frames is None else type(frames),
                                 reason=f"not an iterable of {what}{one}")
        frames = list(frames)
    for i, f in enumerate(frames):
        if not isinstance(f, RoundFrame):
            if f is None and none_ok:
                continue
            reason = ("not a RoundFrame or None" if none_ok else
                      "not a RoundFrame (None is reduce_realized_work's, a connection with no "
                      "frame)" if f is None else "not a RoundFrame")
            raise protocol_error("controller.bad_argument", field=f"frames[{i}]",
                                 value=None if f is None else type(f), reason=reason)
    return frames, n


def sum_frames(
    frames: Iterable[RoundFrame], *, version: int = DEFAULT_VERSION, threads: int = 1
) -> RoundFrame:
    """Element-wise sum of ``frames``, masses summed, kind kept: the fold monoid. Never divides.

    Args:
        frames: one round's frames (at least one), summed in their order: a list or tuple, or
            any other iterable (a generator), which is read once into a list. Every frame must
            carry the same kind, tensor count, and per tensor the same dtype (f32 or bf16), shape
            and byte length (version 3: byte lengths are compared between non-elided payloads
            only).
        version: data-channel protocol version (2 or 3).
        threads: worker threads for tensors of at least 2**20 elements per thread, a whole
            number >= 1 (default 1; more helps the compute-bound bf16 path on hosts with idle
            physical cores; the result does not depend on it).

    Returns:
        A frame of frame 0's kind whose weight is the f64 sum of the weights (from ``-0.0``) and
        whose tensors are the f32 sums re-encoded in each tensor's dtype (payloads are fresh
        NumPy-backed buffers; version 3: a tensor elided in every frame stays elided).

    Raises:
        SequenceError (local): no frames (``reduce.no_frames``).
        InvalidValue (local): ``frames`` is no iterable (``None``, a single frame), an entry is
            no :class:`RoundFrame` (``None``, an array, wire bytes), or ``threads`` is no whole
            number >= 1 (``controller.bad_argument``, naming the argument, ``frames[i]`` with
            the entry's type, and the value).
        SchemaMismatch (remote): kind, tensor count, dtype, shape or byte-length disagreement, or
            a payload whose byte count is not ``numel * element_size`` (version 2: any elided
            payload with elements).
        InvalidValue (remote): an unknown dtype tag in frame 0, or weights whose sum overflows
            f64 (``reduce.weight_overflow``; upstream would scatter a frame of weight inf that
            every reader rejects).
        VersionMismatch (local): unsupported ``version``.

    Upstream: ``controller/round_frame.rs`` ``sum_frames``.
    """
    checked, n = _checked_args(frames, threads, none_ok=False)
    return _fold(cast("Sequence[RoundFrame]", checked), version, normalise=False, threads=n)


def reduce_realized_work(
    frames: Iterable[RoundFrame | None],
    *,
    version: int = DEFAULT_VERSION,
    threads: int = 1,
    pool: OutputPool | None = None,
) -> RoundFrame:
    """The controller's reduce: the realized-work consensus of the accepted frames.

    Args:
        frames: one entry per connection in connection order; ``None`` = nothing accepted from
            it this round (it enters neither the sum nor the mass). Any iterable (a list, a
            generator), read once.
        version: data-channel protocol version (2 or 3).
        threads: worker threads for large tensors, a whole number >= 1 (as :func:`sum_frames`).
        pool: where the payload arrays of large tensors come from, reused from round to round
            once nobody holds them (:class:`OutputPool`); None: fresh arrays. The result does
            not depend on it.

    Returns:
        ``sum_frames`` of the accepted frames; for a Model round whose summed weight ``w`` is
        above zero, every non-elided payload is then multiplied element-wise by
        ``np.float32(1.0 / w)`` in f32 and re-encoded (bf16: a second rounding). Control rounds and
        zero-mass Model rounds are the pure sum. The weight is ``w`` (the accepted mass).

    Raises:
        SequenceError (local): no accepted frame (``reduce.no_accepted``).
        InvalidValue (local): ``frames`` is no iterable, an entry is neither a
            :class:`RoundFrame` nor ``None``, or ``threads`` is no whole number >= 1
            (``controller.bad_argument``, as :func:`sum_frames`).
        InvalidValue (local): ``pool`` is neither an :class:`OutputPool` nor None
            (``controller.bad_argument`` naming ``pool`` and its type).
        SchemaMismatch, InvalidValue (remote), VersionMismatch (local): as :func:`sum_frames`.

    Upstream: ``controller/round_frame.rs`` ``reduce_realized_work``.
    """
    if pool is not None and not isinstance(pool, OutputPool):
        raise protocol_error("controller.bad_argument", field="pool", value=type(pool),
                             reason="not an OutputPool or None")
    checked, n = _checked_args(frames, threads, none_ok=True)
    accepted = [f for f in checked if f is not None]
    if not accepted:
        raise protocol_error("reduce.no_accepted")
    return _fold(accepted, version, normalise=True, threads=n, pool=pool)

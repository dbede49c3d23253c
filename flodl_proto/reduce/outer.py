"""Outer optimizers: a step applied by the controller to the parameters consensus before scatter.

The outer gradient is ``g = prev_global - consensus`` (f32, element-wise). Variants:

* :class:`OuterAvg` — ``new = consensus`` (identity; stateless).
* :class:`SlowMomentum` (SlowMo, heavy ball) — ``v = mu * v + g`` (``v = g`` when fresh),
  ``new = prev - lr * v``.
* :class:`NesterovMomentum` (DiLoCo) — ``v = mu * v + g`` (fresh: ``v = g``),
  ``new = prev - lr * (mu * v + g)``; the ranks reset their inner optimizer every window.

All arithmetic is f32 (``lr`` and ``mu`` are rounded to f32, as a libtorch ``mul_scalar`` on an f32
tensor does). :class:`OuterStepper` drives a variant over the reduce stream with upstream's window
rules. Momentum is exported and restored with ``checkpoint_state`` / ``load_checkpoint_state``.

Upstream: ``flodl/src/distributed/outer_optimizer.rs`` (``OuterOptimizer``, ``OuterAvg``,
``SlowMomentum``, ``NesterovMomentum``, ``OuterStepper``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..codec.round_frame import RoundFrame, RoundKind, TensorPayload
from ..errors import protocol_error
from ..spec import DTYPE_BF16, DTYPE_F32
from .fold import is_realized
from .payload import bf16_to_f32, encode_payload

__all__ = ["NesterovMomentum", "OuterAvg", "OuterOptimizer", "OuterStepper", "SlowMomentum"]

F32Array = npt.NDArray[np.float32]


def _f32_list(tensors: Sequence[npt.ArrayLike]) -> list[F32Array]:
    return [np.array(t, dtype=np.float32, copy=True) for t in tensors]


def _consensus_f32(t: TensorPayload) -> F32Array:
    """The f32 values of a consensus tensor. A bf16 payload of its shape's byte count is widened
    from its bit patterns (exact, the values ``t.array()`` gives), so the controller's first
    outer step on a bf16 consensus does not import ml_dtypes (half a second or more on the
    coordinating thread, inside round 1's scatter); any other payload, and one of more
    dimensions than NumPy carries, goes through ``t.array`` and its errors."""
    if t.dtype == DTYPE_BF16 and t.numel and t.nbytes == 2 * t.numel:
        wide = bf16_to_f32(np.frombuffer(t.data, dtype="<u2"))
        with contextlib.suppress(ValueError):  # more dimensions than NumPy carries
            return wide.reshape(t.shape)
    return np.asarray(t.array(materialize_elided=True), dtype=np.float32)


class OuterOptimizer(abc.ABC):
    """A transform of the parameters consensus into the new global parameters.

    Upstream: ``outer_optimizer.rs`` ``OuterOptimizer`` (trait).
    """

    @abc.abstractmethod
    def outer_step(
        self, prev_global: Sequence[F32Array], consensus: Sequence[F32Array]
    ) -> list[F32Array]:
        """Return the new global parameters.

        Args:
            prev_global: the global adopted at the end of the previous window (on the first
                window: the consensus itself), one f32 array per parameter.
            consensus: this window's consensus, parallel to ``prev_global`` (same count, same
                shapes).

        Returns:
            New f32 arrays, one per parameter, same shapes.
        """

    def checkpoint_state(self) -> list[F32Array] | None:
        """Copies of the checkpointable momentum (one f32 array per parameter), or None when the
        variant is stateless or has not stepped yet."""
        return None

    def load_checkpoint_state(self, state: Sequence[npt.ArrayLike]) -> None:  # noqa: B027
        """Restore the momentum saved by :meth:`checkpoint_state` (stateless variants ignore
        it)."""

    @property
    def resets_inner(self) -> bool:
        """True when ranks must reset their inner optimizer every window (DiLoCo)."""
        return False


class OuterAvg(OuterOptimizer):
    """Identity: ``new = consensus``. Stateless; the default.

    Upstream: ``outer_optimizer.rs`` ``OuterAvg``.
    """

    def outer_step(
        self, prev_global: Sequence[F32Array], consensus: Sequence[F32Array]
    ) -> list[F32Array]:
        """Return copies of ``consensus`` (``prev_global`` is ignored)."""
        return _f32_list(consensus)


class _Momentum(OuterOptimizer):
    def __init__(self, lr: float, mu: float) -> None:
        self.lr = float(lr)
        self.mu = float(mu)
        self._velocity: list[F32Array] = []

    def _velocity_step(
        self, prev_global: Sequence[F32Array], consensus: Sequence[F32Array]
    ) -> tuple[list[F32Array], list[F32Array]]:
        n = len(consensus)
        fresh = len(self._velocity) != n
        mu = np.float32(self.mu)
        gs: list[F32Array] = []
        vs: list[F32Array] = []
        for i in range(n):
            g = np.subtract(prev_global[i], consensus[i], dtype=np.float32)
            v = g.copy() if fresh else np.add(self._velocity[i] * mu, g, dtype=np.float32)
            gs.append(g)
            vs.append(v)
        self._velocity = vs
        return gs, vs

    def checkpoint_state(self) -> list[F32Array] | None:
        """Copies of the momentum, or None before the first step."""
        return _f32_list(self._velocity) if self._velocity else None

    def load_checkpoint_state(self, state: Sequence[npt.ArrayLike]) -> None:
        """Restore the momentum (the next step accumulates on it)."""
        self._velocity = _f32_list(state)


class SlowMomentum(_Momentum):
    """SlowMo heavy-ball outer momentum: ``v = mu * v + g``, ``new = prev - lr * v``.

    Args:
        lr: outer learning rate (typically about 1.0).
        mu: outer momentum (typically about 0.9).

    Upstream: ``outer_optimizer.rs`` ``SlowMomentum``.
    """

    def outer_step(
        self, prev_global: Sequence[F32Array], consensus: Sequence[F32Array]
    ) -> list[F32Array]:
        """One SlowMo step (momentum restarts from ``g`` when the parameter count changed)."""
        lr = np.float32(self.lr)
        _, vs = self._velocity_step(prev_global, consensus)
        return [
            np.subtract(prev_global[i], vs[i] * lr, dtype=np.float32) for i in range(len(vs))
        ]


class NesterovMomentum(_Momentum):
    """DiLoCo Nesterov outer momentum: ``v = mu * v + g``, ``new = prev - lr * (mu * v + g)``.

    Args:
        lr: outer learning rate (DiLoCo: about 0.7).
        mu: outer momentum (about 0.9).

    Upstream: ``outer_optimizer.rs`` ``NesterovMomentum``.
    """

    def outer_step(
        self, prev_global: Sequence[F32Array], consensus: Sequence[F32Array]
    ) -> list[F32Array]:
        """One Nesterov look-ahead step."""
        lr = np.float32(self.lr)
        mu = np.float32(self.mu)
        gs, vs = self._velocity_step(prev_global, consensus)
        out: list[F32Array] = []
        for i in range(len(vs)):
            look_ahead = np.add(vs[i] * mu, gs[i], dtype=np.float32)
            out.append(np.subtract(prev_global[i], look_ahead * lr, dtype=np.float32))
        return out

    @property
    def resets_inner(self) -> bool:
        """True: DiLoCo restarts the inner optimizer every window."""
        return True


class OuterStepper:
    """Applies an outer optimizer to the controller's consensus stream, parameters only.

    A sync window is: a Control count-gather, then the Model parameters reduce, then (optionally)
    the Model buffers reduce. A Control frame resets the window and passes through. The first
    Model frame of a window with weight > 0 is the parameters frame: decoded to f32 (elided
    tensors as zeros), stepped, and re-encoded with every tensor in the dtype of its first tensor
    (f32 when there is none), kind Model, weight kept. A first Model frame with weight <= 0
    passes through and does not open the window; later Model frames (buffers) pass through.
    ``prev_global`` is the previous step's output (the consensus itself on the first window).

    Args:
        optimizer: the variant (default :class:`OuterAvg`).

    Upstream: ``outer_optimizer.rs`` ``OuterStepper``.
    """

    def __init__(self, optimizer: OuterOptimizer | None = None) -> None:
        self.optimizer: OuterOptimizer = optimizer if optimizer is not None else OuterAvg()
        self._prev_global: list[F32Array] | None = None
        self._seen_params = False

    @property
    def seen_params_this_window(self) -> bool:
        """True once the current window's parameters frame was stepped."""
        return self._seen_params

    def process_frame(self, frame: RoundFrame) -> RoundFrame:
        """Return the frame to scatter for ``frame`` (a consensus from the reduce).

        Raises:
            InvalidValue (remote): a parameters tensor with an unknown dtype tag.
            SchemaMismatch (remote): a parameters payload whose byte count disagrees with its
                shape, or a parameter count or shape that differs from the previous global's
                (``outer.count_changed``, ``outer.schema_changed``).
        """
        if frame.kind is RoundKind.CONTROL:
            self._seen_params = False
            return frame
        if self._seen_params or not is_realized(frame.weight):
            return frame
        wire_dtype = frame.tensors[0].dtype if frame.tensors else DTYPE_F32
        consensus = [_consensus_f32(t) for t in frame.tensors]
        prev = self._prev_global
        if prev is None:
            prev = _f32_list(consensus)
        else:
            if len(prev) != len(consensus):
                raise protocol_error("outer.count_changed", got=len(consensus),
                                     expected=len(prev))
            for i, (p, c) in enumerate(zip(prev, consensus, strict=True)):
                if p.shape != c.shape:
                    raise protocol_error("outer.schema_changed", index=i, got=list(c.shape),
                                         expected=list(p.shape))
        self._seen_params = True
        new_global = self.optimizer.outer_step(prev, consensus)
        self._prev_global = _f32_list(new_global)
        tensors = [
            TensorPayload(wire_dtype, g.shape, encode_payload(wire_dtype, g)) for g in new_global
        ]
        return RoundFrame(RoundKind.MODEL, frame.weight, tensors)

    def checkpoint_state(self) -> list[F32Array] | None:
        """The optimizer's momentum (None for stateless variants or before the first step)."""
        return self.optimizer.checkpoint_state()

    def load_checkpoint_state(self, state: Sequence[npt.ArrayLike]) -> None:
        """Restore the momentum on resume; ``prev_global`` re-anchors on the next window's
        consensus."""
        self.optimizer.load_checkpoint_state(state)

"""The reduce engine: the fold monoid, the realized-work reduce, the relay's host fold, the bf16
payload codec and the outer optimizers.

* :func:`sum_frames` / :func:`reduce_realized_work` — controller side (``fold``);
* :class:`HostFold` — the relay's incremental per-round fold (``host_fold``);
* :func:`encode_payload`, :func:`decode_payload`, :func:`scale_payload`, :func:`bf16_from_f32`,
  :func:`bf16_to_f32`, :func:`scale_to_bf16` — payload bytes (``payload``);
* :func:`gamma_mass`, :func:`mover_mass`, :func:`is_realized` — realized-work mass policies;
* :func:`kernel_backend`, :func:`set_kernel_backend` — NumPy or compiled bf16 kernels
  (``_kernels``);
* :class:`OuterAvg`, :class:`SlowMomentum`, :class:`NesterovMomentum`, :class:`OuterStepper` —
  outer optimizers (``outer``).

Upstream: ``flodl/src/distributed/controller/round_frame.rs``, ``relay/agent.rs``,
``realized_work.rs``, ``outer_optimizer.rs``.
"""

from __future__ import annotations

from .._names import adopt
from ._kernels import kernel_backend, set_kernel_backend
from .fold import (
    OutputPool,
    gamma_mass,
    is_realized,
    mover_mass,
    reduce_realized_work,
    sum_frames,
)
from .host_fold import HostFold
from .outer import NesterovMomentum, OuterAvg, OuterOptimizer, OuterStepper, SlowMomentum
from .payload import (
    bf16_bits_to_f32_bits,
    bf16_from_f32,
    bf16_to_f32,
    decode_payload,
    encode_payload,
    f32_bits_to_bf16_bits,
    payload_element_size,
    scale_payload,
    scale_to_bf16,
)

__all__ = [
    "HostFold",
    "NesterovMomentum",
    "OuterAvg",
    "OuterOptimizer",
    "OuterStepper",
    "OutputPool",
    "SlowMomentum",
    "bf16_bits_to_f32_bits",
    "bf16_from_f32",
    "bf16_to_f32",
    "decode_payload",
    "encode_payload",
    "f32_bits_to_bf16_bits",
    "gamma_mass",
    "is_realized",
    "kernel_backend",
    "mover_mass",
    "payload_element_size",
    "reduce_realized_work",
    "scale_payload",
    "scale_to_bf16",
    "set_kernel_backend",
    "sum_frames",
]

# their code lives in reduce/_kernels.py; they are this package's names, so help(), pydoc and
# pickle name it (set once, at import)
adopt(__name__, kernel_backend, set_kernel_backend)

"""One training rank of ``flodl-proto demo`` (run as ``python -m
flodl_proto.commands._demo_worker CONFIG_JSON``; not a CLI subcommand).

The task is linear least squares with a known optimum: every rank regenerates the same dataset
from the seed, trains on its own shard (rows ``rank::world_size``) with minibatch SGD, and each
round syncs through the protocol:

1. a Control count-gather of the local steps taken this round (the realized work);
2. unless the whole cohort was idle, a Model reduce of the parameters (plus an optional extra
   tensor that loads the wire), pre-scaled by the rank's realized-work mass ``gamma_mass(steps,
   1.0)`` — an idle rank ships weight 0 (elided at version 3, real zeros at version 2) — and the
   consensus is adopted in place.

Events go to stdout as one JSON object per line: ``ready``, ``round`` (per completed round),
``kill-me`` (the rank to be killed stops there and waits to be killed), ``done`` or ``ended``
(the stream ended: the run was stopped elsewhere; with the error and the protocol round it
happened in, numbered from 1 as the error's text numbers it: each demo round is two protocol
rounds, the summary words them as demo rounds,
:func:`~flodl_proto.commands._demo_report.rank_error`). Log records (at the demo's ``--log-level``)
go to stderr.

Upstream: the ``cluster_worker`` sync window (``sumcount_reduce``) and ``realized_work.rs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from .._threads import import_on_a_blocking_thread

# a rank process of the demo loads NumPy as the commands do: OpenBLAS's threads block the stop
# signals (the demo stops its ranks with SIGTERM; a no-op where NumPy is loaded already)
import_on_a_blocking_thread("numpy")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from ..cli import configure_logging  # noqa: E402
from ..errors import ProtocolError  # noqa: E402
from ..reduce import OuterOptimizer, bf16_from_f32, bf16_to_f32, gamma_mass  # noqa: E402
from ..runner import stages  # noqa: E402
from ..runner.rank import RankClient  # noqa: E402
from .relay import env_salt  # noqa: E402

__all__ = [
    "BATCH",
    "FEATURES",
    "SAMPLES",
    "full_loss",
    "keep_stages_on_sigterm",
    "local_steps",
    "lr_at",
    "main",
    "make_dataset",
    "optimum",
    "reference_loss",
    "steps_table",
]

#: features of the regression (a bias column is appended)
FEATURES = 16
#: samples in the whole dataset (shared out round-robin between the ranks)
SAMPLES = 4096
#: minibatch size of a local SGD step
BATCH = 128
#: label noise standard deviation
NOISE = 0.5
_LR0 = 0.2
_DECAY = 8.0
#: local steps per round are drawn from these, with these probabilities (0 = idle)
_STEP_CHOICES = (0, 1, 2, 3, 4)
_STEP_P = (0.15, 0.2, 0.25, 0.2, 0.2)

F32Array = npt.NDArray[np.float32]


def make_dataset(seed: int) -> tuple[F32Array, F32Array]:
    """The full dataset: ``X`` (``SAMPLES x (FEATURES + 1)`` f32, last column ones) and ``y``
    (``SAMPLES`` f32) = ``X @ w_true + NOISE * e``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SAMPLES, FEATURES), dtype=np.float32)
    x = np.hstack([x, np.ones((SAMPLES, 1), np.float32)])
    w_true = rng.standard_normal(FEATURES + 1, dtype=np.float32)
    y = (x @ w_true + NOISE * rng.standard_normal(SAMPLES, dtype=np.float32)).astype(np.float32)
    return x, y


def full_loss(x: F32Array, y: F32Array, w: npt.NDArray[Any]) -> float:
    """Mean squared error / 2 of weights ``w`` over the whole dataset (computed in float64)."""
    r = x.astype(np.float64) @ np.asarray(w, dtype=np.float64) - y.astype(np.float64)
    return float(np.mean(r * r) / 2.0)


def optimum(x: F32Array, y: F32Array) -> tuple[npt.NDArray[np.float64], float]:
    """Closed-form least-squares optimum ``(w*, loss(w*))`` (float64)."""
    w, *_ = np.linalg.lstsq(x.astype(np.float64), y.astype(np.float64), rcond=None)
    return w, full_loss(x, y, w)


def steps_table(seed: int, world_size: int, rounds: int) -> npt.NDArray[np.int64]:
    """Local steps of every rank in every round, ``rounds x world_size``; some entries are 0
    (idle ranks), never a whole row (one rank of an all-idle row is given one step)."""
    rng = np.random.default_rng([seed, 99])
    t = rng.choice(np.array(_STEP_CHOICES), size=(rounds, world_size), p=np.array(_STEP_P))
    for k in range(rounds):
        if not t[k].any():
            t[k, k % world_size] = 1
    return t.astype(np.int64)


def lr_at(round_index: int) -> np.float32:
    """Learning rate of round ``round_index`` (0-based): ``0.2 / (1 + k / 8)``."""
    return np.float32(_LR0 / (1.0 + round_index / _DECAY))


def local_steps(w: F32Array, xs: F32Array, ys: F32Array, n: int, lr: np.float32,
                seed: int, rank: int, round_: int) -> None:
    """Run rank ``rank``'s ``n`` minibatch SGD steps of round ``round_`` (1-based) on its shard
    ``xs``/``ys``, updating ``w`` in place (f32)."""
    brng = np.random.default_rng([seed, rank, round_])
    for _ in range(n):
        idx = brng.integers(0, ys.shape[0], BATCH)
        xb, yb = xs[idx], ys[idx]
        g = xb.T @ (xb @ w - yb) / np.float32(BATCH)
        w -= lr * g.astype(np.float32)


def reference_loss(seed: int, world_size: int, rounds: int, *, bf16: bool = False,
                   outer: OuterOptimizer | None = None,
                   hosts: list[list[int]] | None = None) -> float:
    """The full-dataset loss after ``rounds`` rounds of this training, computed in one process
    without the network: the same local steps, the parameters averaged by realized work, then
    the outer optimizer when given. What a healthy cluster reaches in that many rounds, up to
    f32 rounding (the demo's tolerance is taken from it, so a short run is not held to the
    optimum).

    With ``bf16`` the average is rounded where the protocol rounds it: each rank's parameters
    pre-scaled by its mass in f32 and rounded to bf16, each host's sum (``hosts``: the ranks of
    each relay; default one host) rounded, the hosts' sum rounded, multiplied by the f32
    reciprocal of the summed mass, rounded again (the double rounding of
    ``reduce_realized_work``): rounding each rank's parameters alone misses up to 2 % of the
    loss (world size 5, 8 rounds). The outer optimizer, when given, steps that bf16 consensus
    (as the controller's ``OuterStepper`` steps the reduce's output) and its result is rounded
    once more as the controller encodes it; stepping the consensus before its second rounding
    missed 1.7 % (``--bf16 --outer nesterov:0.5,0.9``, 40 rounds). Each rounding is
    upstream's integer rule (:func:`~flodl_proto.reduce.bf16_from_f32`), so the demo never
    loads ml_dtypes.

    Upstream: none (the demo's own check; the rounding points are those of ``cpu_reduce.rs``,
    the pre-scale, of ``controller/round_frame.rs``, ``sum_frames`` and
    ``reduce_realized_work``, and of ``outer_optimizer.rs`` ``OuterStepper``)."""
    x, y = make_dataset(seed)
    table = steps_table(seed, world_size, rounds)
    ws = [np.zeros(FEATURES + 1, np.float32) for _ in range(world_size)]
    prev: list[F32Array] | None = None

    def wire(a: F32Array) -> F32Array:
        return bf16_to_f32(bf16_from_f32(a)) if bf16 else a

    for k in range(1, rounds + 1):
        for r in range(world_size):
            local_steps(ws[r], x[r::world_size], y[r::world_size], int(table[k - 1, r]),
                        lr_at(k - 1), seed, r, k)
        n = table[k - 1].astype(np.float64)
        if n.sum() <= 0:
            continue
        if bf16:
            zero = np.zeros(FEATURES + 1, np.float32)
            sums = [wire(sum((wire(ws[r] * np.float32(n[r])) for r in g), zero))
                    for g in (hosts or [list(range(world_size))])]
            avg = wire(wire(sum(sums, zero)) * np.float32(1.0 / n.sum()))
        else:
            avg = (sum(n[r] * ws[r].astype(np.float64) for r in range(world_size))
                   / n.sum()).astype(np.float32)
        if outer is not None:
            new = outer.outer_step(prev if prev is not None else [avg], [avg])[0]
            prev = [np.asarray(new, np.float32)]
            avg = prev[0]
        avg = wire(avg)
        ws = [avg.copy() for _ in range(world_size)]
    return full_loss(x, y, ws[0])


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _train(cfg: dict[str, Any], salt: bytes) -> int:
    rank = int(cfg["rank"])
    world = int(cfg["world_size"])
    seed = int(cfg["seed"])
    rounds = int(cfg["rounds"])
    kill_round = cfg.get("kill_round")
    x, y = make_dataset(seed)
    xs, ys = x[rank::world], y[rank::world]
    table = steps_table(seed, world, rounds)
    w = np.zeros(FEATURES + 1, np.float32)
    n_extra = int(cfg.get("payload_values", 0))  # sized and checked by the demo
    extra = np.full(n_extra, np.float32(rank), np.float32)
    client = RankClient.connect(cfg["relay"], rank, world, salt, int(cfg["version"]),
                                bf16=bool(cfg.get("bf16")))
    _emit({"ev": "ready", "rank": rank})
    try:
        for k in range(1, rounds + 1):
            if kill_round is not None and k == int(kill_round):
                _emit({"ev": "kill-me", "rank": rank, "round": k})
                sys.stdin.read()  # the demo kills this process now
            t0 = time.perf_counter()
            n = int(table[k - 1, rank])
            local_steps(w, xs, ys, n, lr_at(k - 1), seed, rank, k)
            t1 = time.perf_counter()
            counts = client.gather_counts(float(n))
            weight = 0.0
            digest = client.last_reply.digest() if client.last_reply else ""
            if counts.sum() > 0:
                mass = gamma_mass(float(n), 1.0)
                arrays = [w, extra] if n_extra else [w]
                rep = client.all_reduce_scaled(arrays, mass, weight=mass)
                weight = rep.weight
                digest = rep.digest()
            t2 = time.perf_counter()
            _emit({
                "ev": "round", "rank": rank, "round": k, "steps": n,
                "counts": [int(c) for c in counts], "weight": weight, "digest": digest,
                "loss": full_loss(x, y, w), "t_round": t2 - t0, "t_sync": t2 - t1,
                "bytes": client.bytes_sent + client.bytes_received,
            })
    except (ProtocolError, OSError) as e:  # the protocol round it names, for the summary's words
        _emit({"ev": "ended", "rank": rank, "error": f"{type(e).__name__}: {e}",
               "protocol_round": client.rounds + 1})
        client.close()
        return 0
    client.close()
    _emit({"ev": "done", "rank": rank, "w": [float(v) for v in w]})
    return 0


def _end_by_signal(signum: int, frame: object) -> None:  # pragma: no cover - in the child
    """Write the stage records held (:func:`flodl_proto.runner.stages.flush`), then end by
    the signal itself, as without this handler (the demo reads the exit status)."""
    with contextlib.suppress(OSError):
        stages.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def keep_stages_on_sigterm() -> None:
    """Have a SIGTERM write this process's stage records before it ends the process: the
    demo stops its ranks with SIGTERM after a member's failure, and the records, written at
    exit (``atexit``, which a signal's end skips), were lost with them, so its summary had
    no stage breakdown of the rounds the run completed. The process still ends by SIGTERM
    (exit status -15). Nothing is done while tracing is off or when SIGTERM is not at its
    default (ignored since the process started). Raises nothing.

    No upstream counterpart: upstream has no demo or stage trace."""
    if stages.is_enabled() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _end_by_signal)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``argv[0]`` is the JSON config (rank, world_size, seed, rounds, relay,
    version, bf16, payload_values: the f32 values of the --payload-mib tensor, kill_round,
    log_level: the demo's ``--log-level``, WARNING when absent); the salt comes from
    ``$FLODL_SESSION_SALT`` (32 hex digits, read as the commands read ``--salt``:
    :func:`~flodl_proto.commands.relay.env_salt`). Log records go to stderr as the command line
    writes them.

    Returns the exit code: 0 after ``done`` or ``ended``; 1 after an ``error`` event (the
    training failed); 2 when ``$FLODL_SESSION_SALT`` is unset, empty or not 16 bytes of hex:
    one ``error`` event whose ``error`` is the one line naming the variable and what is wrong
    (``$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex digits, got ...``),
    before any connection."""
    args = sys.argv[1:] if argv is None else argv
    cfg = json.loads(args[0])
    configure_logging(str(cfg.get("log_level") or "WARNING"))
    keep_stages_on_sigterm()  # a stop by the demo keeps the rounds traced until then
    try:
        salt = env_salt("the demo's rank worker")
    except ValueError as e:
        _emit({"ev": "error", "rank": cfg.get("rank"), "error": str(e)})
        return 2
    try:
        return _train(cfg, salt)
    except Exception as e:
        _emit({"ev": "error", "rank": cfg.get("rank"), "error": f"{type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

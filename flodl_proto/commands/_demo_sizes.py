"""The demo's sizes and limits: how its ranks are split over hosts, the frame a rank sends for
a ``--payload-mib``, the memory its cluster needs, the bf16 kernels its run is worth, and the
bounds of its options (the ``demo`` command, :mod:`flodl_proto.commands.demo`, checks its
arguments with them).

No upstream counterpart: upstream flodl has no demo.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Final

from .._numbers import not_plain_note
from ..errors import shown
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DTYPE_BF16,
    DTYPE_F32,
    ELEMENT_SIZE,
    ROUND_FRAME_FIXED_OVERHEAD,
)
from ._number_args import shown_as_typed
from ._option_error import OptionError, option_message
from .controller import parse_outer

if TYPE_CHECKING:
    from ..reduce import OuterOptimizer

__all__ = ["DEMO_ROUNDS_MAX", "DEMO_WORLD_MAX", "JIT_WORTH", "SEED_MAX", "check_memory",
           "check_outer", "check_payload_mib", "cluster_kernels", "memory_need", "parse_kill",
           "partition", "payload_mib_max", "payload_values", "rank_frame_len"]


def partition(world_size: int, hosts: int) -> list[list[int]]:
    """Split ranks ``0..world_size-1`` into ``hosts`` contiguous, as-even-as-possible groups.

    No upstream counterpart: upstream flodl has no demo.
    """
    import numpy as np

    return [list(map(int, g)) for g in np.array_split(np.arange(world_size), hosts)]


#: values of the model's parameter tensor (``_demo_worker.FEATURES`` weights and a bias)
_PARAMETERS = 17
#: wire bytes of a one-dimensional tensor besides its payload: dtype 2, one dim 4, nbytes 8
_TENSOR_HEADER = 2 + 4 + 8


def payload_values(payload_mib: float) -> int:
    """Values of the f32 tensor of ``--payload-mib`` MiB that every demo rank adds to its
    parameters frame (``int(M x 2**20) // 4``; 0: no such tensor).

    No upstream counterpart: upstream flodl has no demo.
    """
    return int(payload_mib * (1 << 20)) // 4


#: bf16 element-rounds (the ``--payload-mib`` tensor's values times ``--rounds``) from which the
#: compiled bf16 kernels (numba, when installed) are worth loading in the demo's processes: loading
#: them (numba's import and the first kernel from the disk cache) costs each process about 0.6 s of
#: CPU, and they save about 1 to 3 ns per element and call against the NumPy kernels (measured
#: at 256 Ki and 4 Mi elements, a rank's encode, a relay's and the controller's sums), each
#: process making one to two such calls a round
JIT_WORTH: Final = 1 << 28


def cluster_kernels(bf16: bool, payload_mib: float, rounds: int) -> str | None:
    """The bf16 kernel backend the demo gives its cluster (``FLODL_PROTO_KERNELS``, when that
    is not set where the demo runs): ``"numpy"`` for a bf16 run of fewer than :data:`JIT_WORTH`
    element-rounds (the default demo: 256 Ki values, 40 rounds), where loading the compiled
    kernels would cost every process more than they save; None (the usual choice: ``auto``)
    otherwise, and for an f32 run (no bf16 kernel runs). The backends give the same bytes but
    for which NaN's payload survives when two NaNs meet (upstream leaves it to the platform).
    Raises nothing.

    No upstream counterpart (the demo's own choice)."""
    if bf16 and payload_values(payload_mib) * rounds < JIT_WORTH:
        return "numpy"
    return None


def rank_frame_len(payload_mib: float, bf16: bool) -> int:
    """Wire length (bytes) of the largest frame a demo rank sends: the Model frame of its
    parameters (17 values) and of the ``--payload-mib`` tensor (``int(M x 2**20) // 4`` values,
    no tensor when that is 0), f32, or bf16 with ``--bf16`` (``round_frame_wire_len``: 25 + per
    tensor 14 + its bytes). The relay's HostFrame and the controller's Broadcast are as long.

    No upstream counterpart: upstream flodl has no demo.
    """
    size = ELEMENT_SIZE[DTYPE_BF16 if bf16 else DTYPE_F32]
    n = payload_values(payload_mib)
    return (ROUND_FRAME_FIXED_OVERHEAD + _TENSOR_HEADER + _PARAMETERS * size
            + (_TENSOR_HEADER + n * size if n else 0))


def payload_mib_max(bf16: bool) -> float:
    """The largest ``--payload-mib``, to two decimals (rounded down), whose
    :func:`rank_frame_len` is within the frame ceiling every member of the demo's cluster reads
    with (``DEFAULT_FRAME_CEILING``, 1 GiB).

    No upstream counterpart: upstream flodl has no demo.
    """
    size = ELEMENT_SIZE[DTYPE_BF16 if bf16 else DTYPE_F32]
    values = (DEFAULT_FRAME_CEILING - rank_frame_len(0.0, bf16) - _TENSOR_HEADER) // size
    return math.floor(values * 4 / (1 << 20) * 100) / 100


def check_payload_mib(payload_mib: float, bf16: bool) -> None:
    """Refuse a ``--payload-mib`` (MiB) that is negative, not finite, or whose rank frame
    (:func:`rank_frame_len`, bytes) is above the frame ceiling (``DEFAULT_FRAME_CEILING``).

    Raises:
        OptionError (a ValueError): naming the option, the value and the bound (a usage
            error, exit 2).
    """
    if not 0 <= payload_mib < math.inf:  # nan too: no tensor of that size
        raise OptionError("--payload-mib", f"must be a finite number >= 0, got "
                         f"{shown_as_typed(payload_mib)}")
    if (frame := rank_frame_len(payload_mib, bf16)) > DEFAULT_FRAME_CEILING:
        length = f" {frame} bytes," if frame < 1 << 64 else ""  # 1e300: not 300 digits
        raise OptionError(
            "--payload-mib", f"must be at most "
            f"{payload_mib_max(bf16):.2f}{' with --bf16' if bf16 else ''}, got "
            f"{shown_as_typed(payload_mib)}: a rank's frame would be{length} above the frame "
            f"ceiling of {DEFAULT_FRAME_CEILING} bytes")


#: peak resident memory of a demo process besides its frames (interpreter, NumPy), bytes
_PROCESS_BASE = 64 << 20


def memory_need(payload_mib: float, world_size: int, hosts: int) -> int:
    """Bytes of memory the demo's cluster is expected to hold at its peak, all processes
    together: about 4.5 payloads per rank, ``ranks on its host + 2.5`` per relay and
    ``hosts + 3.5`` for the controller (measured peak RSS, f32; bf16 needs less), plus
    :data:`_PROCESS_BASE` per process. No upstream counterpart (upstream has no demo)."""
    payload = payload_values(payload_mib) * 4
    frames = 4.5 * world_size + (world_size + 2.5 * hosts) + (hosts + 3.5)
    return int(frames * payload) + (world_size + hosts + 1) * _PROCESS_BASE


def _available_memory() -> int | None:
    """What this process may still allocate (:func:`flodl_proto._memory.available_memory`)."""
    from .._memory import available_memory

    return available_memory()


def check_memory(payload_mib: float, world_size: int, hosts: int) -> None:
    """Refuse a ``--payload-mib`` whose cluster would not fit in the memory this process may
    still take (it would swap, or be killed, long after it started).

    Raises:
        MemoryError: naming the option as argparse does, its value, the need and what is
            available, in GiB (``argument --payload-mib: 1024: needs about 32.9 GiB ...``;
            exit 1: the value is fine, this machine's memory is short).
    """
    need, have = memory_need(payload_mib, world_size, hosts), _available_memory()
    if have is not None and need > have:
        gib = 1 << 30
        raise MemoryError(option_message(
            "--payload-mib",
            f"{payload_mib:g}: needs about {need / gib:.1f} GiB of memory for "
            f"{world_size} rank(s), {hosts} relay(s) and the controller (each holds a few "
            f"frames of the payload's size), and this machine has {have / gib:.1f} GiB "
            f"available (its memory cgroup's limit included); give a smaller --payload-mib, "
            f"--world-size or --hosts"))


def parse_kill(text: str | None) -> tuple[int, int] | None:
    """``--kill-rank R@ROUND`` as ``(rank, round)``, or None when not given.

    Raises:
        OptionError (a ValueError): the text is not two whole numbers joined by ``@`` (a usage
            error); for ``1@٢`` or ``1_0@2`` with the reason of
            :func:`flodl_proto._numbers.not_plain_note`.
    """
    if text is None:
        return None
    r, sep, k = text.partition("@")
    if len(text) > 40 or not (sep and r.isascii() and r.isdigit() and k.isascii()
                              and k.lstrip("-").isdigit()):  # 40: int() of 4301 digits raises
        raise OptionError("--kill-rank", f"expected R@ROUND (two whole numbers), got "
                         f"{shown(text)}{not_plain_note(text)}")
    return int(r), int(k)


def check_outer(text: str | None) -> OuterOptimizer | None:
    """``--outer`` as the demo's controller runs it (:func:`~flodl_proto.commands.controller.\
parse_outer`), or None when not given; for ``slow-momentum:LR,MU`` and ``nesterov:LR,MU`` the
    learning rate LR must be > 0 and the momentum MU in [0, 1), each as a 32-bit float (the
    outer step's precision: LR in :data:`F32_LEAST`..:data:`F32_MOST`). Outside those bounds the
    in-process reference diverges as the cluster does, so a run held to it would pass while its
    loss grows (``nesterov:-1,5``: 3.6e14 after 10 rounds). The controller itself takes any
    finite values, as upstream's does.

    Raises:
        OptionError (a ValueError): the text does not parse, or a value is out of its bounds;
            one line naming the option, its value and the bound (a usage error).
    """
    outer = parse_outer(text)
    lr, mu = getattr(outer, "lr", None), getattr(outer, "mu", None)
    if lr is not None and not lr > 0:
        raise OptionError("--outer", f"{shown(text)}: LR must be > 0 (a learning rate), got "
                         f"{lr:g}")
    if mu is not None and not 0 <= mu < 1:
        raise OptionError("--outer", f"{shown(text)}: MU must be in [0, 1) (a momentum), got "
                         f"{mu:g}")
    # the outer step runs in 32-bit floats: a learning rate beyond their range overflowed to
    # infinity (NumPy warnings, a loss of nan), one below it became 0 (no outer step at all)
    if lr is not None and not 0 < _as_f32(lr) < math.inf:
        raise OptionError("--outer", f"{shown(text)}: LR {lr!r} is "
                         f"{'0' if lr < 1 else 'infinite'} as a 32-bit float (the outer step's "
                         f"precision); a learning rate must be in {F32_LEAST:g}..{F32_MOST:g}")
    if mu is not None and not _as_f32(mu) < 1:
        raise OptionError("--outer", f"{shown(text)}: MU {mu!r} is 1 as a 32-bit float (the "
                         f"outer step's precision); a momentum must be below 1")
    return outer


#: the least and the most a 32-bit float holds above 0 (the outer step's precision)
F32_LEAST: Final = struct.unpack("<f", struct.pack("<I", 1))[0]
F32_MOST: Final = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


def _as_f32(x: float) -> float:
    """``x`` rounded to a 32-bit float (infinity beyond its range)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


#: the demo's largest ``--seed`` (128 bits: it is passed to every rank process as text)
SEED_MAX: Final = (1 << 128) - 1

#: the demo's largest ``--rounds`` (it keeps every round's results and, for the reference loss,
#: trains as many rounds again in its own process)
DEMO_ROUNDS_MAX: Final = 1_000_000

#: the demo's largest world size: it starts a process per rank (about 60 MiB each) on one machine
DEMO_WORLD_MAX: Final = 64

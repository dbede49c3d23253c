"""The controller's consensus buffers, reused from round to round once nobody holds them.

Every round, the controller's reduce writes each tensor's consensus into a fresh array, which
goes out in the Broadcast (its bytes are not copied) and is dropped once written. For a large
tensor a fresh array is a fresh mapping: its pages are faulted in and zeroed by the kernel while
the reduce writes them (at 64 MiB about as long as the add itself), and unmapped again when it is
dropped. :class:`OutputPool` keeps one array per tensor position and hands it out again once
nothing but the pool refers to it (no frame, view, memoryview or record buffer of an earlier
round is alive: each of those holds a reference to the array); while one is held it hands out a
fresh array instead, so a consumer that keeps a consensus (a checkpoint, the outer optimizer)
never sees it change. The reduce writes every element it hands out, so a reused array's old
contents never show.

Small tensors are not pooled: the allocator reuses their memory already.

No upstream counterpart (``controller/round_frame.rs`` allocates its accumulators per round).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from .._threads import start_thread

__all__ = ["POOLED_MIN_BYTES", "OutputPool"]

#: tensors of at least this many bytes have their consensus array pooled
POOLED_MIN_BYTES = 1 << 20


def _measure_unheld() -> int:
    kept = {0: np.empty(0)}
    arr = kept[0]
    return sys.getrefcount(arr)


def _refs_when_unheld() -> int:
    """What ``sys.getrefcount`` reports, in :meth:`OutputPool.take`, for a kept array nobody
    else holds: the pool's dict, the local name and the call's argument (an ``int``, 3 on
    CPython 3.11).

    Measured with no trace or profile function: one that reads a frame's locals (a debugger,
    some profilers) adds a reference to each local while it is active, and a count taken then
    would let :meth:`OutputPool.take` hand out an array someone still holds. While ``take``
    itself is traced the count can only be higher, and the array is not reused.

    The count is taken on a short-lived thread of its own, which switches off its own trace and
    profile functions (those ``threading.settrace`` / ``threading.setprofile`` give every new
    thread): both are per thread, so the calling thread's are left untouched. A profiler
    installed in C (``cProfile``, ``yappi``) cannot be switched off and put back from Python:
    ``sys.setprofile`` would install a Python-level call of the object ``sys.getprofile``
    returned (for ``cProfile`` a ``Profile``, which is not callable: importing the package
    under ``cProfile`` raised ``TypeError``), or nothing where it returned None.

    Raises:
        RuntimeError: the thread cannot be started.
        MemoryError: the probe array cannot be allocated (raised again here, from the thread).

    Upstream: none (``controller/round_frame.rs`` allocates its accumulators per round).
    """
    outcome: list[int | BaseException] = []

    def measure() -> None:
        sys.settrace(None)  # this thread's only: the hooks threading gave it
        sys.setprofile(None)
        try:
            outcome.append(_measure_unheld())
        except BaseException as e:  # handed to the importing thread, raised there
            outcome.append(e)

    t = threading.Thread(target=measure, name="flodl-pool-refcount")
    start_thread(t)
    t.join()
    if isinstance(result := outcome[0], BaseException):
        raise result
    return result


_UNHELD_REFS = _refs_when_unheld()


class OutputPool:
    """One reusable output array per tensor position (see the module doc). Not thread-safe: the
    controller core reduces one round at a time.

    Attributes:
        reused: arrays handed out again (rounds times tensors), for tests and stats.

    Upstream: none (``controller/round_frame.rs`` allocates its accumulators per round).
    """

    __slots__ = ("_kept", "reused")

    def __init__(self) -> None:
        self._kept: dict[int, npt.NDArray[Any]] = {}
        self.reused = 0

    def take(self, position: int, dtype: np.dtype[Any], numel: int) -> npt.NDArray[Any]:
        """A 1-D array of ``numel`` elements of ``dtype`` for tensor ``position`` of the round's
        frame: the one kept for that position when it has this dtype and length and nobody holds
        it any more, else a new one (``np.empty``: every element must be written), kept in its
        place. Arrays below :data:`POOLED_MIN_BYTES` are always new and never kept."""
        if numel * dtype.itemsize < POOLED_MIN_BYTES:
            return np.empty(numel, dtype)
        arr = self._kept.get(position)
        if (arr is not None and arr.dtype == dtype and arr.shape[0] == numel
                and sys.getrefcount(arr) <= _UNHELD_REFS):
            self.reused += 1
            return arr
        arr = np.empty(numel, dtype)
        self._kept[position] = arr
        return arr

    def clear(self) -> None:
        """Drop every kept array (their memory goes once nobody else holds them)."""
        self._kept.clear()

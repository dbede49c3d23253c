"""Grouping the small tensors of a round into the runs :func:`._kernels.sum_small_batch` sums in
one pass; used by the controller's reduce (``fold._sum_small_tensors``) and the relay's fold
(``HostFold._fold_last_small``). Upstream: none (upstream sums tensor by tensor)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ._kernels import CHUNK_ELEMS

__all__ = ["batch_runs"]


def batch_runs(keys: Sequence[object | None], numels: Sequence[int]
               ) -> Iterator[tuple[int, int, int]]:
    """The runs of consecutive tensors that :func:`._kernels.sum_small_batch` sums together, in
    order.

    Args:
        keys: per tensor, what a run's tensors must share (their dtype), or None when the tensor
            cannot be batched (it then makes a run of its own).
        numels: per tensor, its element count.

    Yields:
        ``(i, j, total)``: tensors ``i .. j-1`` (covering every tensor once, in order), their
        element count. A run starts at the first tensor no earlier run took and takes the next
        ones while their key equals its first's (never None) and ``total`` stays within
        :data:`CHUNK_ELEMS`; its first tensor is always taken, whatever its size.

    Upstream: none (upstream sums tensor by tensor).
    """
    count = len(keys)
    i = 0
    while i < count:
        key = keys[i]
        total = numels[i]
        j = i + 1
        if key is not None:
            while j < count and keys[j] == key and total + numels[j] <= CHUNK_ELEMS:
                total += numels[j]
                j += 1
        yield i, j, total
        i = j

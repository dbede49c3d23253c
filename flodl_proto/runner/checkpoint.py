"""The controller's consensus checkpoints: one ``.npz`` per sync window, written off the hot path.

Upstream: ``flodl/src/distributed/checkpoint_forge.rs``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._files import replacing
from ..fsm.events import CheckpointWindow

__all__ = ["write_checkpoint"]

log = logging.getLogger("flodl_proto.runner.controller")


def write_checkpoint(directory: Path, w: CheckpointWindow) -> None:
    """Write window ``w`` as ``directory/consensus-<window, 6 digits>.npz``: ``p<i>`` from its
    parameters frame, ``b<j>`` from its buffers frame, all float32 (elided payloads as zeros).
    The file appears atomically and durably (:func:`flodl_proto._files.replacing`: written to a
    temporary file in ``directory``, synced, then renamed); a write that fails leaves no
    temporary file and any earlier file of that name as it was.

    Raises:
        OSError: the file cannot be written (``filename`` is the ``.npz``). ValueError /
            ProtocolError: a tensor cannot be viewed (unknown dtype, byte count not matching
            the shape).

    Upstream: ``flodl/src/distributed/checkpoint_forge.rs`` (keys ``p{i}`` / ``b{j}``, f32, temp
    file and rename); upstream writes ``.fdl`` files, this package ``.npz``.
    """
    arrays: dict[str, npt.NDArray[Any]] = {}
    for prefix, frame in (("p", w.params), ("b", w.buffers)):
        if frame is None:
            continue
        for i, t in enumerate(frame.tensors):
            arrays[f"{prefix}{i}"] = np.asarray(t.array(materialize_elided=True),
                                                dtype=np.float32)
    final = directory / f"consensus-{w.window:06d}.npz"
    with replacing(final) as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    log.info("controller: checkpoint %s written (%d tensors)", final, len(arrays))

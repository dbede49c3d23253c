"""The controller's consensus checkpoints: one ``.npz`` per sync window, written off the hot path.

Upstream: ``flodl/src/distributed/controller/checkpoint_forge.rs``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..fsm.events import CheckpointWindow

__all__ = ["write_checkpoint"]

log = logging.getLogger("flodl_proto.runner.controller")


def write_checkpoint(directory: Path, w: CheckpointWindow) -> None:
    """Write window ``w`` as ``directory/consensus-<window, 6 digits>.npz``: ``p<i>`` from its
    parameters frame, ``b<j>`` from its buffers frame, all float32 (elided payloads as zeros).
    The file appears atomically (written to a temporary name, then renamed).

    Raises:
        OSError: the file cannot be written. ValueError / ProtocolError: a tensor cannot be
            viewed (unknown dtype, byte count not matching the shape).
    """
    arrays: dict[str, npt.NDArray[Any]] = {}
    for prefix, frame in (("p", w.params), ("b", w.buffers)):
        if frame is None:
            continue
        for i, t in enumerate(frame.tensors):
            arrays[f"{prefix}{i}"] = np.asarray(t.array(materialize_elided=True),
                                                dtype=np.float32)
    final = directory / f"consensus-{w.window:06d}.npz"
    tmp = directory / f".{final.name}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, final)
    log.info("controller: checkpoint %s written (%d tensors)", final, len(arrays))

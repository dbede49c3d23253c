"""One rank of the network-lab tests, run as a process inside a host's namespace::

    python -m tests.netlab_worker CONFIG_JSON

CONFIG_JSON: ``rank``, ``world``, ``relay`` (``HOST:PORT``, the relay's loopback port),
``version``, ``bf16``, ``rounds``, ``elems`` (elements of the large tensor), ``gate`` (read one
stdin line before each round). The salt comes from ``$FLODL_SESSION_SALT``.

Round ``k`` (1-based) sends :func:`lab_arrays` pre-scaled by :func:`lab_mass` (an idle rank
sends weight 0: elided at version 3). Every value is a small integer, so every sum in the relays'
folds and the controller's reduce is exact in f32 and in bf16 whatever the arrival order, and the
consensus can be computed independently (:func:`tests.netlab_cluster.expected_round`).

Events on stdout, one JSON object per line: ``ready``, ``round`` (``round``, ``digest`` = SHA-256
of the consensus frame's bytes, ``weight``), then ``done``, or ``ended`` with the error that
ended the stream; or only ``error`` (exit 2) when the salt is missing or malformed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import numpy.typing as npt


def lab_arrays(rank: int, k: int, elems: int) -> list[npt.NDArray[np.float32]]:
    """Rank ``rank``'s f32 tensors of round ``k``: a 4-vector, a 2x3 matrix, and ``elems``
    elements of ``(i mod 13) - 6 + rank mod 4`` (all small integers)."""
    small = np.array([rank + 1, -(k + 1), 2, k % 5], np.float32)
    mat = np.array([[1, rank % 3, -2], [k % 4, 3, -1]], np.float32)
    big = ((np.arange(elems, dtype=np.int64) % 13) - 6 + rank % 4).astype(np.float32)
    return [small, mat, big]


def lab_mass(rank: int, k: int) -> float:
    """Realized-work mass of ``rank`` in round ``k``: ``(rank + k) % 3`` (0 = idle)."""
    return float((rank + k) % 3)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(cfg: dict[str, Any]) -> int:
    """Run the rank; exit 0 after reporting (``done`` or ``ended``), or 2 after one ``error``
    event when ``$FLODL_SESSION_SALT`` is unset, empty or not 16 bytes of hex (the line of
    :func:`flodl_proto.commands.relay.env_salt`, naming the variable and what is wrong)."""
    from flodl_proto.commands.relay import env_salt
    from flodl_proto.errors import ProtocolError
    from flodl_proto.runner.rank import RankClient

    rank, world = int(cfg["rank"]), int(cfg["world"])
    try:
        salt = env_salt("a network-lab rank")
    except ValueError as e:
        _emit({"ev": "error", "error": str(e)})
        return 2
    try:
        client = RankClient.connect(cfg["relay"], rank, world, salt, int(cfg["version"]),
                                    bf16=bool(cfg["bf16"]))
    except (ProtocolError, OSError) as e:
        _emit({"ev": "ended", "round": 0, "error": f"{type(e).__name__}: {e}"})
        return 0
    _emit({"ev": "ready"})
    k = 0
    try:
        for k in range(1, int(cfg["rounds"]) + 1):
            if cfg.get("gate"):
                if not sys.stdin.readline():
                    break
            mass = lab_mass(rank, k)
            rep = client.all_reduce_scaled(lab_arrays(rank, k, int(cfg["elems"])), mass,
                                           adopt=False)
            _emit({"ev": "round", "round": k, "digest": rep.digest(), "weight": rep.weight})
    except (ProtocolError, OSError) as e:
        _emit({"ev": "ended", "round": k, "error": f"{type(e).__name__}: {e}"})
        client.close()
        return 0
    client.close()
    _emit({"ev": "done"})
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(json.loads(sys.argv[1])))

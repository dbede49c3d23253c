"""Socket runners: the only part of the package with sockets, threads and timeouts.

* :class:`ReferenceController` — the cluster controller (``runner/controller.py``);
* :class:`Relay` — a host's relay (``runner/relay.py``);
* :class:`RankClient` — a rank's data-channel client (``runner/rank.py``).
"""

from __future__ import annotations

from .controller import ReferenceController, RoundReport
from .rank import RankClient, ReduceReply, decode_into
from .relay import Relay, RelayStats, default_relay_port

__all__ = [
    "RankClient",
    "ReduceReply",
    "ReferenceController",
    "Relay",
    "RelayStats",
    "RoundReport",
    "decode_into",
    "default_relay_port",
]

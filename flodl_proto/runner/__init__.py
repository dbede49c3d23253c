"""Socket runners: the only part of the package with sockets, threads and timeouts.

* :class:`ReferenceController` — the cluster controller (``runner/controller.py``);
* :class:`Relay` — a host's relay (``runner/relay.py``);
* :class:`RankClient` — a rank's data-channel client (``runner/rank.py``).

Each name (and each submodule) is imported the first time it is used: a rank's process loads
neither the controller nor the lifecycle machines (python-statemachine) it never runs.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
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

#: the module each name of :data:`__all__` is imported from on first use
_HOMES = {
    **dict.fromkeys(("ReferenceController", "RoundReport"), "controller"),
    **dict.fromkeys(("RankClient", "ReduceReply", "decode_into"), "rank"),
    **dict.fromkeys(("Relay", "RelayStats", "default_relay_port"), "relay"),
}


def __getattr__(name: str) -> object:
    """A name of :data:`__all__`, imported from its module on first use, or a public submodule
    (``flodl_proto.runner.stages``) reached as an attribute.

    Raises:
        AttributeError: ``name`` is neither (as for any module attribute).
    """
    from .._lazy import load_attribute

    return load_attribute(__name__, globals(), name, _HOMES.get(name))


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""The controller and relay lifecycles, generated from ``spec/lifecycle.yaml``.

Controller: states ``idle`` (initial) -> ``accepting`` -> ``reducing`` -> ``shutdown`` (final);
events ``start``, ``hello_accepted``, ``all_covered``, ``round_scattered``, the clean exits
``rank_exit``, ``relay_eof``, ``all_dead``, ``stop``, and ``fail``. Guards
(``every_rank_covered``, ``round_complete``, ``no_relay_alive``) are boolean attributes of the
machine's *model* (the controller core, or any object with those attributes).

Relay: ``accepting_ranks`` (initial) -> ``dialing`` -> ``awaiting_hello_ack`` -> ``folding`` ->
``draining`` -> ``done`` (final); guards ``every_local_rank_connected``,
``every_local_rank_gone``.

Entering the final state records an :class:`Outcome` (clean, or the error given to ``fail`` as
``error=``). State ids and event names are the :class:`LifecycleState` / :class:`LifecycleEvent`
(controller) and :class:`RelayState` / :class:`RelayEvent` enums, checked against the spec when
this module loads, so a core never names a state or an event by a free string.

Each class is built once with python-statemachine 3.x
(``statemachine.io.create_machine_class_from_definition``) from a deep copy of the spec, after
the descriptive keys (``x-docs-keys``) are stripped. Two library defaults are overridden by the
spec: an event that has no transition from the current state (unknown event, guard false, or any
event after the final state) raises instead of being ignored, and callback errors propagate. Here
that surfaces as :class:`~flodl_proto.errors.LocalProtocolError` (``SequenceError``, catalogue id
``controller.bad_event`` / ``relay.bad_event``), never as the library's exception.

The machines are for lifecycle and round events only (a transition costs a few hundred
microseconds), never per byte or per tensor.

Upstream: ``flodl/src/distributed/controller/mod.rs`` (the module doc's state machine, and the
control flow of ``run_reduce_thread``, ``ReduceSlots::wait_for_round`` and ``reduce_reader``);
``flodl/src/distributed/relay/agent.rs`` (``RelayChannel``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Protocol

from statemachine import StateChart
from statemachine.exceptions import TransitionNotAllowed
from statemachine.io import create_machine_class_from_definition

from ..errors import protocol_error
from ..spec import LIFECYCLE_SCHEMA, SPEC, SpecError, machine_transitions

__all__ = [
    "CLEAN_EXIT_EVENTS",
    "EVENTS",
    "GUARDS",
    "MACHINES",
    "STATES",
    "Lifecycle",
    "LifecycleEvent",
    "LifecycleModel",
    "LifecycleState",
    "Outcome",
    "RelayEvent",
    "RelayLifecycleModel",
    "RelayState",
    "lifecycle_class",
    "lifecycle_definition",
    "lifecycle_spec",
    "transitions",
]

log = logging.getLogger(__name__)

#: the machines of ``spec/lifecycle.yaml``, by key
MACHINES: Final = ("controller", "relay")


class LifecycleState(enum.StrEnum):
    """The controller lifecycle's state ids (``spec/lifecycle.yaml`` ``machines.controller``).

    Upstream: the controller lifecycle of ``controller/mod.rs`` (the module doc's state machine,
    ``run_reduce_thread``); the machine built from ``spec/lifecycle.yaml`` is this package's.
    """

    IDLE = "idle"
    ACCEPTING = "accepting"
    REDUCING = "reducing"
    SHUTDOWN = "shutdown"


class LifecycleEvent(enum.StrEnum):
    """The controller lifecycle's events (``spec/lifecycle.yaml`` ``machines.controller``).

    Upstream: the controller lifecycle of ``controller/mod.rs`` (the module doc's state machine,
    ``run_reduce_thread``); the machine built from ``spec/lifecycle.yaml`` is this package's.
    """

    START = "start"
    STOP = "stop"
    FAIL = "fail"
    HELLO_ACCEPTED = "hello_accepted"
    ALL_COVERED = "all_covered"
    ROUND_SCATTERED = "round_scattered"
    RANK_EXIT = "rank_exit"
    RELAY_EOF = "relay_eof"
    ALL_DEAD = "all_dead"


class RelayState(enum.StrEnum):
    """The relay lifecycle's state ids (``spec/lifecycle.yaml`` ``machines.relay``).

    Upstream: the relay lifecycle of ``relay/agent.rs`` (``RelayChannel``); the machine built from
    ``spec/lifecycle.yaml`` is this package's.
    """

    ACCEPTING_RANKS = "accepting_ranks"
    DIALING = "dialing"
    AWAITING_HELLO_ACK = "awaiting_hello_ack"
    FOLDING = "folding"
    DRAINING = "draining"
    DONE = "done"


class RelayEvent(enum.StrEnum):
    """The relay lifecycle's events (``spec/lifecycle.yaml`` ``machines.relay``).

    Upstream: the relay lifecycle of ``relay/agent.rs`` (``RelayChannel``); the machine built from
    ``spec/lifecycle.yaml`` is this package's.
    """

    RANK_CONNECTED = "rank_connected"
    ALL_CONNECTED = "all_connected"
    STOP = "stop"
    FAIL = "fail"
    HELLO_SENT = "hello_sent"
    HELLO_ACKED = "hello_acked"
    RANK_LEFT = "rank_left"
    LAST_RANK_LEFT = "last_rank_left"
    CONTROLLER_CLOSED = "controller_closed"
    DRAINED = "drained"


_ENUMS: Final[Mapping[str, tuple[type[enum.StrEnum], type[enum.StrEnum]]]] = {
    "controller": (LifecycleState, LifecycleEvent),
    "relay": (RelayState, RelayEvent),
}

#: the catalogue error for an event a machine does not allow in its state
_BAD_EVENT: Final = {"controller": "controller.bad_event", "relay": "relay.bad_event"}

# kept for callers that name the controller's states as constants
IDLE: Final = LifecycleState.IDLE
ACCEPTING: Final = LifecycleState.ACCEPTING
REDUCING: Final = LifecycleState.REDUCING
SHUTDOWN: Final = LifecycleState.SHUTDOWN


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended (recorded on entering the final state: ``shutdown``, ``done``).

    Attributes:
        clean: True for a clean end (controller: RankExit of an alive rank, EOF of a relay with
            an alive rank, every rank dead, external stop; relay: drained, controller closed,
            external stop); False when the run failed.
        reason: the lifecycle event that ended the run (an ``outcomes`` key of the machine:
            ``rank_exit``, ``relay_eof``, ``all_dead``, ``drained``, ``controller_closed``,
            ``stop`` or ``fail``).
        error: the failure when not clean: a :class:`~flodl_proto.errors.ProtocolError`, or
            the unexpected exception a runner hit (a bug or an environment failure outside the
            protocol, e.g. inside the controller's scatter), carried as is.
        detail: a human-readable note (which relay, which rank), may be empty.

    Upstream: the result ``controller/mod.rs`` ``shutdown()`` returns (``Ok`` or the loop's first
    error) and the end of ``relay/agent.rs`` ``RelayChannel``.
    """

    clean: bool
    reason: str
    error: Exception | None = None
    detail: str = ""

    def __str__(self) -> str:
        if self.clean:
            return f"clean ({self.reason}{': ' + self.detail if self.detail else ''})"
        return f"error: {self.error}" + (f" [{self.detail}]" if self.detail else "")


class LifecycleModel(Protocol):
    """What the controller lifecycle's guards read from the machine's model (booleans,
    evaluated on demand).

    Attributes:
        every_rank_covered: every rank ``0..world_size-1`` was announced by an accepted relay.
        round_complete: at least one relay is expected and every expected relay deposited.
        no_relay_alive: no accepted relay carries a rank that is not dead.

    Upstream: the controller lifecycle of ``controller/mod.rs`` (the module doc's state machine,
    ``run_reduce_thread``); the machine built from ``spec/lifecycle.yaml`` is this package's.
    """

    @property
    def every_rank_covered(self) -> bool:
        """True once every rank ``0..world_size-1`` was announced by an accepted relay's Hello
        (each exactly once: a Hello naming a rank ``>= world_size`` or one already announced
        fails the run instead). Read on ``hello_accepted`` and ``all_covered`` in ``accepting``:
        ``all_covered`` moves to ``reducing`` only when it is True, ``hello_accepted`` stays in
        ``accepting`` only while it is False (``spec/lifecycle.yaml`` ``guards``).

        Upstream: ``controller/mod.rs`` ``ClusterController::start_from_source`` (the accept
        loop ends when the announced ranks cover the world).
        """
        ...

    @property
    def round_complete(self) -> bool:
        """True when at least one relay is expected this round (one carrying a rank that is not
        dead) and every expected relay deposited its HostFrame. Read on ``round_scattered`` in
        ``reducing``, which is allowed only when it is True (``spec/lifecycle.yaml``
        ``guards``).

        Upstream: ``controller/mod.rs`` ``run_reduce_thread`` (a round is reduced once every
        live relay's frame is in).
        """
        ...

    @property
    def no_relay_alive(self) -> bool:
        """True when every accepted relay's ranks are all dead, so nothing is left to reduce.
        Read on ``all_dead`` in ``reducing``, which ends the run (``shutdown``) only when it is
        True (``spec/lifecycle.yaml`` ``guards``).

        Upstream: ``controller/mod.rs`` ``run_reduce_thread`` (the reduce loop ends when no
        relay is left to wait for).
        """
        ...


class RelayLifecycleModel(Protocol):
    """What the relay lifecycle's guards read from the machine's model.

    Attributes:
        every_local_rank_connected: every rank of the host's set completed its handshake.
        every_local_rank_gone: every local rank has left.

    Upstream: the relay lifecycle of ``relay/agent.rs`` (``RelayChannel``); the machine built from
    ``spec/lifecycle.yaml`` is this package's.
    """

    @property
    def every_local_rank_connected(self) -> bool:
        """True once every rank of the host's set completed its loopback handshake (each
        exactly once). Read on ``rank_connected`` and ``all_connected`` in
        ``accepting_ranks``: ``all_connected`` moves to ``dialing`` only when it is True,
        ``rank_connected`` stays in ``accepting_ranks`` only while it is False
        (``spec/lifecycle.yaml`` ``guards``).

        Upstream: ``relay/agent.rs`` (the relay dials its controller once every local rank has
        connected).
        """
        ...

    @property
    def every_local_rank_gone(self) -> bool:
        """True once every local rank has left (its loopback stream ended or broke). Read on
        ``rank_left`` and ``last_rank_left`` in ``folding``: ``last_rank_left`` moves to
        ``draining`` only when it is True, ``rank_left`` stays in ``folding`` only while it is
        False (``spec/lifecycle.yaml`` ``guards``).

        Upstream: ``relay/agent.rs`` ``RelayChannel`` (the relay ends once its last rank is
        gone).
        """
        ...


def lifecycle_spec(machine: str = "controller") -> dict[str, Any]:
    """Return a deep copy of one machine of ``spec/lifecycle.yaml`` (descriptive keys included).

    Args:
        machine: ``"controller"`` or ``"relay"``.

    Raises:
        SpecError: the file is missing or malformed, or has no such machine.

    No upstream counterpart: upstream writes its lifecycle in code (``controller/mod.rs``,
    ``relay/agent.rs``); reading it from ``spec/lifecycle.yaml`` is this package's.
    """
    doc = SPEC.lifecycle()
    machines = doc.get("machines")
    if (doc.get("schema") != LIFECYCLE_SCHEMA or not isinstance(machines, dict)
            or not isinstance(machines.get(machine), dict) or "states" not in machines[machine]):
        raise SpecError(f"lifecycle.yaml: missing or unknown 'schema', or no machine {machine!r} "
                        "with 'states'")
    spec: dict[str, Any] = machines[machine]
    spec["x-docs-keys"] = list(doc.get("x-docs-keys", []))
    return spec


def lifecycle_definition(machine: str = "controller") -> dict[str, Any]:
    """Return one machine's python-statemachine definition: a deep copy of its spec without the
    keys listed in ``x-docs-keys`` (``states`` and the class options remain).

    No upstream counterpart: upstream writes its lifecycle in code (``controller/mod.rs``,
    ``relay/agent.rs``); reading it from ``spec/lifecycle.yaml`` is this package's.
    """
    spec = lifecycle_spec(machine)
    for key in [*spec.pop("x-docs-keys"), "x-docs-keys"]:
        spec.pop(key, None)
    return spec


def transitions(machine: str = "controller") -> list[tuple[str, str, str, str | None, str | None]]:
    """Every transition of one machine as ``(source, event, target, cond, unless)`` state ids,
    in document order (the oracle the tests compare the generated class with), from the
    transition rows :func:`flodl_proto.spec.machine_transitions` reads for the docs too.

    No upstream counterpart: upstream writes its lifecycle in code (``controller/mod.rs``,
    ``relay/agent.rs``); reading it from ``spec/lifecycle.yaml`` is this package's.
    """
    return [(t.source, t.event, t.target or t.source, t.cond[0] if t.cond else None,
             t.unless[0] if t.unless else None)
            for t in machine_transitions(lifecycle_definition(machine))]


def _check_spec(machine: str, spec: Mapping[str, Any]) -> None:
    states = spec["states"]
    state_enum, event_enum = _ENUMS[machine]
    initial = [s for s, d in states.items() if d.get("initial")]
    finals = [s for s, d in states.items() if d.get("final")]
    if len(initial) != 1 or len(finals) != 1:
        raise SpecError(f"lifecycle.yaml: {machine} needs one initial and one final state")
    rows = transitions(machine)
    if list(states) != [s.value for s in state_enum]:
        raise SpecError(f"lifecycle.yaml: {machine} states {list(states)} != "
                        f"{state_enum.__name__} {[s.value for s in state_enum]}")
    events = {e for _, e, _, _, _ in rows}
    known = {e.value for e in event_enum}
    if events != known:  # the one that differs named: the lists are long
        raise SpecError(f"lifecycle.yaml: {machine} events {sorted(events)} != "
                        f"{event_enum.__name__} {sorted(known)} (not in the package: "
                        f"{sorted(events - known)}; missing: {sorted(known - events)})")
    used = {g for _, _, _, c, u in rows for g in (c, u) if g}
    declared = set(spec.get("guards", {}))
    if used != declared:
        raise SpecError(f"lifecycle.yaml: {machine} guards used {sorted(used)} != declared "
                        f"{sorted(declared)}")
    if events != set(spec.get("events", {})) or not set(spec["outcomes"]) <= events:
        raise SpecError(f"lifecycle.yaml: {machine} events / outcomes tables do not match the "
                        "transitions")


_SPECS: Final = {m: lifecycle_spec(m) for m in MACHINES}
for _m in MACHINES:
    _check_spec(_m, _SPECS[_m])
_SPEC: Final = _SPECS["controller"]

#: controller state ids in document order
STATES: Final[tuple[str, ...]] = tuple(_SPEC["states"])
#: controller event names in first-use order
EVENTS: Final[tuple[str, ...]] = tuple(dict.fromkeys(e for _, e, _, _, _ in transitions()))
#: controller guard name -> description
GUARDS: Final[Mapping[str, str]] = dict(_SPEC["guards"])
#: machine -> event name -> "clean" / "error", for the events that end the run
_OUTCOMES: Final[Mapping[str, Mapping[str, str]]] = {
    m: dict(_SPECS[m]["outcomes"]) for m in MACHINES
}
#: controller: event name -> "clean" / "error", for the events that end the run
OUTCOMES: Final[Mapping[str, str]] = _OUTCOMES["controller"]
#: the events that end a controller run cleanly
CLEAN_EXIT_EVENTS: Final = frozenset(e for e, o in OUTCOMES.items() if o == "clean")
_FINAL: Final = {
    m: next(s for s, d in _SPECS[m]["states"].items() if d.get("final")) for m in MACHINES
}


_Guards = tuple[tuple[str, bool], ...]


def _internal_shortcuts(spec: Mapping[str, Any]) -> dict[tuple[str, str], _Guards]:
    """``(state, event) -> guards`` for each event whose only transition from ``state`` is an
    internal self-transition with nothing but guards (``cond`` / ``unless``): firing it changes
    nothing but may raise, so :meth:`Lifecycle.fire` checks the guards itself (``(name, wanted
    value)`` pairs) instead of running the library's macrostep (a few hundred microseconds,
    once per round for ``round_scattered``)."""
    out: dict[tuple[str, str], _Guards] = {}
    for state, body in spec["states"].items():
        for event, rows in (body.get("on") or {}).items():
            if not isinstance(rows, list) or len(rows) != 1:
                continue
            row = rows[0]
            if (row.get("target") != state or row.get("internal") is not True
                    or not set(row) <= {"target", "internal", "cond", "unless"}):
                continue
            guards = [(str(row[k]), k == "cond") for k in ("cond", "unless") if k in row]
            if all(isinstance(row[k], str) for k in ("cond", "unless") if k in row):
                out[(str(state), str(event))] = tuple(guards)
    return out


_SHORTCUTS: Final = {m: _internal_shortcuts(_SPECS[m]) for m in MACHINES}


def _outcome_recorder(machine: str) -> Any:
    outcomes = _OUTCOMES[machine]

    def record_outcome(self: Any, event: Any = None, error: Exception | None = None,
                       detail: str = "") -> None:
        name = str(event) if event is not None else "fail"
        clean = outcomes.get(name) == "clean"
        self.outcome = Outcome(clean, name, None if clean else error, detail)
        log.debug("lifecycle: %s final (%s)", machine, self.outcome)

    return record_outcome


def _state_names(machine: Any) -> str:
    return ", ".join(str(s.name) for s in machine.configuration) or "(none)"


def _sender(machine: str) -> Any:
    error_id = _BAD_EVENT[machine]

    def send(self: Any, event: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return StateChart.send(self, event, *args, **kwargs)
        except TransitionNotAllowed:
            raise protocol_error(error_id, event=str(event),
                                 state=_state_names(self)) from None

    return send


@cache
def lifecycle_class(machine: str = "controller") -> Any:
    """Return the python-statemachine class generated from one machine of the spec (built once).

    Instances take the guard model as ``model=`` (see :class:`LifecycleModel`,
    :class:`RelayLifecycleModel`); ``send(event, **kwargs)`` raises ``LocalProtocolError``
    (``controller.bad_event`` / ``relay.bad_event``) for an event not allowed in the current
    state; after the final state the instance's ``outcome`` is an :class:`Outcome`.

    Raises:
        SpecError: the spec is malformed; ``statemachine`` errors for an invalid definition.
    """
    definition = lifecycle_definition(machine)  # a deep copy: the library consumes it
    cls = create_machine_class_from_definition(
        str(_SPECS[machine].get("machine", machine)),
        record_outcome=_outcome_recorder(machine),
        send=_sender(machine),
        outcome=None,
        **definition,
    )
    return cls


class Lifecycle:
    """A typed handle on one instance of the generated lifecycle class.

    Args:
        model: the guard model (:class:`LifecycleModel` for the controller,
            :class:`RelayLifecycleModel` for the relay), read whenever a guarded event fires.
        machine: ``"controller"`` (default) or ``"relay"``.

    Raises:
        statemachine.exceptions.InvalidDefinition: ``model`` lacks a guard attribute.
        KeyError: unknown ``machine``.

    Upstream: the lifecycles of ``controller/mod.rs`` (the module doc's state machine,
    ``run_reduce_thread``) and ``relay/agent.rs`` (``RelayChannel``); the machine built from
    ``spec/lifecycle.yaml`` is this package's.
    """

    __slots__ = ("_final", "_is_final", "_model", "_shortcuts", "_state", "kind", "machine")

    def __init__(self, model: LifecycleModel | RelayLifecycleModel,
                 machine: str = "controller") -> None:
        self._final = str(_FINAL[machine])
        #: which machine: ``"controller"`` or ``"relay"``
        self.kind = machine
        self.machine: Any = lifecycle_class(machine)(model=model)
        self._model = model
        self._shortcuts = _SHORTCUTS[machine]
        self._state = self._read_state()
        self._is_final = self._state == self._final

    def _read_state(self) -> str:
        return str(next(iter(self.machine.configuration_values)))

    @property
    def state(self) -> str:
        """Current state id (a :class:`LifecycleState` or :class:`RelayState` value; read from
        the machine after each :meth:`fire`, as the library's lookup is slow for a per-round
        question)."""
        return self._state

    @property
    def state_name(self) -> str:
        """Current state's display name (``Idle``, ``Accepting``, ...)."""
        return _state_names(self.machine)

    @property
    def is_final(self) -> bool:
        """True once the final state (``shutdown``, ``done``) was entered (no event is allowed
        any more)."""
        return self._is_final

    @property
    def outcome(self) -> Outcome | None:
        """The recorded :class:`Outcome` once final, else None."""
        out = self.machine.outcome
        return out if isinstance(out, Outcome) else None

    def fire(self, event: str, **kwargs: Any) -> None:
        """Fire ``event`` (``error=`` for ``fail``; ``detail=`` optional for any run-ending event).

        Raises:
            LocalProtocolError (SequenceError, ``controller.bad_event`` / ``relay.bad_event``):
                ``event`` is unknown, has no transition from the current state, or its guard is
                false.
        """
        if not kwargs:
            # a str event (an enum member hashes and compares as its value) is its own key
            guards = self._shortcuts.get((self._state,
                                          event if isinstance(event, str) else str(event)))
            if guards is not None:
                for name, wanted in guards:
                    if self._guard(name) is not wanted:
                        break
                else:
                    return  # an internal self-transition whose guards hold: nothing changes
        try:
            self.machine.send(event, **kwargs)
        finally:
            self._state = self._read_state()
            self._is_final = self._state == self._final

    def _guard(self, name: str) -> bool:
        value = getattr(self._model, name)
        return bool(value() if callable(value) else value)

    def allowed_events(self) -> list[str]:
        """Events with a transition from the current state, ignoring guards."""
        return [str(e.id) for e in self.machine.allowed_events]

    def enabled_events(self) -> list[str]:
        """Events that would fire from the current state (guards evaluated on the model)."""
        return [str(e.id) for e in self.machine.enabled_events()]

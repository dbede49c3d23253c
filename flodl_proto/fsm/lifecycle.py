"""The controller lifecycle, generated from ``spec/lifecycle.yaml``.

States ``idle`` (initial) -> ``accepting`` -> ``reducing`` -> ``shutdown`` (final); events
``start``, ``hello_accepted``, ``all_covered``, ``round_scattered``, the clean exits
``rank_exit``, ``relay_eof``, ``all_dead``, ``stop``, and ``fail``. Guards (``every_rank_covered``,
``round_complete``, ``no_relay_alive``) are boolean attributes of the machine's *model* (the
controller core, or any object with those attributes). Entering ``shutdown`` records an
:class:`Outcome` (clean, or the error given to ``fail`` as ``error=``).

The class is built once with python-statemachine 3.x
(``statemachine.io.create_machine_class_from_definition``) from a deep copy of the spec, after
the descriptive keys (``x-docs-keys``) are stripped. Two library defaults are overridden by the
spec: an event that has no transition from the current state (unknown event, guard false, or any
event after ``shutdown``) raises instead of being ignored, and callback errors propagate. Here that
surfaces as :class:`~flodl_proto.errors.LocalProtocolError` (``SequenceError``, catalogue id
``controller.bad_event``), never as the library's exception.

The machine is for lifecycle and round events only (a transition costs a few hundred
microseconds), never per byte or per tensor.

Upstream: ``flodl/src/distributed/controller/mod.rs`` (the module doc's state machine, and the
control flow of ``run_reduce_thread``, ``ReduceSlots::wait_for_round`` and ``reduce_reader``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Protocol

from statemachine import StateChart
from statemachine.exceptions import TransitionNotAllowed
from statemachine.io import create_machine_class_from_definition

from ..errors import ProtocolError, protocol_error
from ..spec import SPEC, SpecError

__all__ = [
    "CLEAN_EXIT_EVENTS",
    "EVENTS",
    "GUARDS",
    "STATES",
    "Lifecycle",
    "LifecycleModel",
    "Outcome",
    "lifecycle_class",
    "lifecycle_definition",
    "lifecycle_spec",
    "mermaid",
    "transitions",
]

log = logging.getLogger(__name__)

IDLE: Final = "idle"
ACCEPTING: Final = "accepting"
REDUCING: Final = "reducing"
SHUTDOWN: Final = "shutdown"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a controller run ended (recorded on entering ``shutdown``).

    Attributes:
        clean: True for a clean end (RankExit of an alive rank, EOF of a relay with an alive rank,
            every rank dead, external stop); False when the run failed.
        reason: the lifecycle event that ended the run (``rank_exit``, ``relay_eof``,
            ``all_dead``, ``stop`` or ``fail``).
        error: the failure (a :class:`~flodl_proto.errors.ProtocolError`) when not clean.
        detail: a human-readable note (which relay, which rank), may be empty.
    """

    clean: bool
    reason: str
    error: ProtocolError | None = None
    detail: str = ""

    def __str__(self) -> str:
        if self.clean:
            return f"clean ({self.reason}{': ' + self.detail if self.detail else ''})"
        return f"error: {self.error}"


class LifecycleModel(Protocol):
    """What the lifecycle's guards read from the machine's model (booleans, evaluated on demand).

    Attributes:
        every_rank_covered: every rank ``0..world_size-1`` was announced by an accepted relay.
        round_complete: at least one relay is expected and every expected relay deposited.
        no_relay_alive: no accepted relay carries a rank that is not dead.
    """

    @property
    def every_rank_covered(self) -> bool: ...

    @property
    def round_complete(self) -> bool: ...

    @property
    def no_relay_alive(self) -> bool: ...


def lifecycle_spec() -> dict[str, Any]:
    """Return a deep copy of the whole ``spec/lifecycle.yaml`` (descriptive keys included).

    Raises:
        SpecError: the file is missing or malformed.
    """
    spec = SPEC.lifecycle()
    if spec.get("schema") != "flodl-proto-lifecycle/1" or "states" not in spec:
        raise SpecError("lifecycle.yaml: missing or unknown 'schema', or no 'states'")
    return spec


def lifecycle_definition() -> dict[str, Any]:
    """Return the python-statemachine definition: a deep copy of the spec without the keys listed
    in its ``x-docs-keys`` (``states`` and the class options remain)."""
    spec = lifecycle_spec()
    for key in list(spec.get("x-docs-keys", [])):
        spec.pop(key, None)
    return spec


def transitions() -> list[tuple[str, str, str, str | None, str | None]]:
    """Every transition of the spec as ``(source, event, target, cond, unless)`` state ids,
    in document order (the oracle the tests compare the generated class with)."""
    out: list[tuple[str, str, str, str | None, str | None]] = []
    for sid, sdef in lifecycle_definition()["states"].items():
        for event, tlist in (sdef.get("on") or {}).items():
            for t in tlist:
                out.append((sid, str(event), str(t["target"]), t.get("cond"), t.get("unless")))
    return out


def _check_spec(spec: Mapping[str, Any]) -> None:
    states = spec["states"]
    initial = [s for s, d in states.items() if d.get("initial")]
    if initial != [IDLE] or not states.get(SHUTDOWN, {}).get("final"):
        raise SpecError("lifecycle.yaml: idle must be the only initial state, shutdown final")
    used = {g for _, _, _, c, u in transitions() for g in (c, u) if g}
    declared = set(spec.get("guards", {}))
    if used != declared:
        raise SpecError(f"lifecycle.yaml: guards used {sorted(used)} != declared "
                        f"{sorted(declared)}")
    events = {e for _, e, _, _, _ in transitions()}
    if events != set(spec.get("events", {})) or not set(spec["outcomes"]) <= events:
        raise SpecError("lifecycle.yaml: events / outcomes tables do not match the transitions")


_SPEC: Final = lifecycle_spec()
_check_spec(_SPEC)

#: state ids in document order
STATES: Final[tuple[str, ...]] = tuple(_SPEC["states"])
#: event names in first-use order
EVENTS: Final[tuple[str, ...]] = tuple(dict.fromkeys(e for _, e, _, _, _ in transitions()))
#: guard name -> description
GUARDS: Final[Mapping[str, str]] = dict(_SPEC["guards"])
#: event name -> "clean" / "error", for the events that end the run
OUTCOMES: Final[Mapping[str, str]] = dict(_SPEC["outcomes"])
#: the events that end a run cleanly
CLEAN_EXIT_EVENTS: Final = frozenset(e for e, o in OUTCOMES.items() if o == "clean")


def _record_outcome(self: Any, event: Any = None, error: ProtocolError | None = None,
                    detail: str = "") -> None:
    name = str(event) if event is not None else "fail"
    clean = OUTCOMES.get(name) == "clean"
    self.outcome = Outcome(clean, name, None if clean else error, detail)
    log.debug("lifecycle: shutdown (%s)", self.outcome)


def _state_names(machine: Any) -> str:
    return ", ".join(str(s.name) for s in machine.configuration) or "(none)"


def _send(self: Any, event: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return StateChart.send(self, event, *args, **kwargs)
    except TransitionNotAllowed:
        raise protocol_error("controller.bad_event", event=event,
                             state=_state_names(self)) from None


@cache
def lifecycle_class() -> Any:
    """Return the python-statemachine class generated from the spec (built once).

    Instances take the guard model as ``model=`` (see :class:`LifecycleModel`); ``send(event,
    **kwargs)`` raises ``LocalProtocolError`` (``controller.bad_event``) for an event not allowed
    in the current state; after ``shutdown`` the instance's ``outcome`` is an :class:`Outcome`.

    Raises:
        SpecError: the spec is malformed; ``statemachine`` errors for an invalid definition.
    """
    definition = lifecycle_definition()  # a deep copy: the library consumes it
    cls = create_machine_class_from_definition(
        str(_SPEC.get("machine", "ControllerLifecycle")),
        record_outcome=_record_outcome,
        send=_send,
        outcome=None,
        **definition,
    )
    return cls


class Lifecycle:
    """A typed handle on one instance of the generated lifecycle class.

    Args:
        model: the guard model (:class:`LifecycleModel`), read whenever a guarded event fires.

    Raises:
        statemachine.exceptions.InvalidDefinition: ``model`` lacks a guard attribute.
    """

    __slots__ = ("machine",)

    def __init__(self, model: LifecycleModel) -> None:
        self.machine: Any = lifecycle_class()(model=model)

    @property
    def state(self) -> str:
        """Current state id (``idle``, ``accepting``, ``reducing``, ``shutdown``)."""
        return str(next(iter(self.machine.configuration_values)))

    @property
    def state_name(self) -> str:
        """Current state's display name (``Idle``, ``Accepting``, ...)."""
        return _state_names(self.machine)

    @property
    def is_final(self) -> bool:
        """True once ``shutdown`` was entered (no event is allowed any more)."""
        return self.state == SHUTDOWN

    @property
    def outcome(self) -> Outcome | None:
        """The recorded :class:`Outcome` once final, else None."""
        out = self.machine.outcome
        return out if isinstance(out, Outcome) else None

    def fire(self, event: str, **kwargs: Any) -> None:
        """Fire ``event`` (``error=`` for ``fail``; ``detail=`` optional for any run-ending event).

        Raises:
            LocalProtocolError (SequenceError, ``controller.bad_event``): ``event`` is unknown, has
                no transition from the current state, or its guard is false.
        """
        self.machine.send(event, **kwargs)

    def allowed_events(self) -> list[str]:
        """Events with a transition from the current state, ignoring guards."""
        return [str(e.id) for e in self.machine.allowed_events]

    def enabled_events(self) -> list[str]:
        """Events that would fire from the current state (guards evaluated on the model)."""
        return [str(e.id) for e in self.machine.enabled_events()]


def mermaid() -> str:
    """Render the lifecycle as a Mermaid ``stateDiagram-v2`` (guards in brackets)."""
    names = {sid: d.get("name", sid) for sid, d in lifecycle_definition()["states"].items()}
    lines = ["stateDiagram-v2", f"    [*] --> {names[IDLE]}"]
    for src, event, dst, cond, unless in transitions():
        guard = f" [{cond}]" if cond else (f" [not {unless}]" if unless else "")
        lines.append(f"    {names[src]} --> {names[dst]}: {event}{guard}")
    lines.append(f"    {names[SHUTDOWN]} --> [*]")
    return "\n".join(lines) + "\n"

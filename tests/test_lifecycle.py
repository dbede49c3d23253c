"""The controller and relay lifecycle classes generated from spec/lifecycle.yaml, checked against
the spec."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flodl_proto.docs import mermaid_state_diagram
from flodl_proto.errors import LocalProtocolError, SequenceError, protocol_error
from flodl_proto.fsm import lifecycle as L
from flodl_proto.spec import SPEC, SpecError


class Guards:
    """A guard model whose answers the test sets directly."""

    def __init__(self) -> None:
        self.every_rank_covered = False
        self.round_complete = False
        self.no_relay_alive = False
        self.state: Any = None


def _oracle(state: str, event: str, g: Guards) -> str | None:
    """The target state the spec gives ``event`` from ``state`` under the guards, or None."""
    for src, ev, dst, cond, unless in L.transitions():
        if src != state or ev != event:
            continue
        if cond is not None and not getattr(g, cond):
            continue
        if unless is not None and getattr(g, unless):
            continue
        return dst
    return None


def test_generated_class_matches_the_spec() -> None:
    cls = L.lifecycle_class()
    assert cls is L.lifecycle_class()  # built once
    spec_states = L.lifecycle_definition()["states"]
    assert [s.id for s in cls.states] == list(spec_states)
    assert cls.initial_state.id == "idle"
    assert [s.id for s in cls.final_states] == ["shutdown"]
    generated = set()
    for s in cls.states:
        for t in s.transitions:
            for ev in t.events:
                generated.add((s.id, str(ev), t.target.id))
    assert generated == {(src, ev, dst) for src, ev, dst, _, _ in L.transitions()}
    assert L.STATES == ("idle", "accepting", "reducing", "shutdown")
    assert L.CLEAN_EXIT_EVENTS == {"rank_exit", "relay_eof", "all_dead", "stop"}


def test_definition_is_a_deep_copy_without_docs_keys() -> None:
    d = L.lifecycle_definition()
    assert set(d) == {"allow_event_without_transition", "catch_errors_as_events", "states"}
    d["states"].clear()
    assert L.lifecycle_definition()["states"]
    assert SPEC.lifecycle()["machines"]["controller"]["states"]
    assert "guards" in L.lifecycle_spec()


def test_happy_path_records_a_clean_outcome() -> None:
    g = Guards()
    lc = L.Lifecycle(g)
    assert lc.state == "idle" and lc.state_name == "Idle" and lc.outcome is None
    lc.fire("start")
    lc.fire("hello_accepted")
    g.every_rank_covered = True
    lc.fire("all_covered")
    g.round_complete = True
    lc.fire("round_scattered")
    lc.fire("round_scattered")
    assert lc.state == "reducing"
    lc.fire("rank_exit", detail="rank 3 left")
    assert lc.is_final
    out = lc.outcome
    assert out is not None and out.clean and out.reason == "rank_exit" and out.error is None
    assert "rank 3 left" in str(out)


def test_fail_records_the_error() -> None:
    lc = L.Lifecycle(Guards())
    lc.fire("start")
    err = protocol_error("controller.closed_before_hello")
    lc.fire("fail", error=err)
    out = lc.outcome
    assert out is not None and not out.clean and out.error is err and out.reason == "fail"
    assert str(out).startswith("error: cluster_controller: relay closed")


@pytest.mark.parametrize("event", ["round_scattered", "all_covered", "hello_accepted",
                                   "rank_exit", "nonsense"])
def test_event_not_allowed_in_idle_raises_local_protocol_error(event: str) -> None:
    lc = L.Lifecycle(Guards())
    with pytest.raises(SequenceError) as ei:
        lc.fire(event)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "controller.bad_event"
    assert str(ei.value) == f"controller: event {event!r} is not allowed in state Idle"
    assert lc.state == "idle"


def test_guards_are_enforced() -> None:
    g = Guards()
    lc = L.Lifecycle(g)
    lc.fire("start")
    with pytest.raises(LocalProtocolError):
        lc.fire("all_covered")  # not every rank covered
    g.every_rank_covered = True
    with pytest.raises(LocalProtocolError):
        lc.fire("hello_accepted")  # no relay joins after coverage
    lc.fire("all_covered")
    with pytest.raises(LocalProtocolError):
        lc.fire("round_scattered")
    with pytest.raises(LocalProtocolError):
        lc.fire("all_dead")
    g.no_relay_alive = True
    lc.fire("all_dead")
    assert lc.is_final


@pytest.mark.parametrize("event", L.EVENTS)
def test_shutdown_is_final(event: str) -> None:
    g = Guards()
    g.every_rank_covered = g.round_complete = g.no_relay_alive = True
    lc = L.Lifecycle(g)
    lc.fire("stop")
    assert lc.allowed_events() == [] and lc.enabled_events() == []
    with pytest.raises(LocalProtocolError):
        lc.fire(event)
    assert lc.state == "shutdown"


def test_send_on_the_machine_raises_too() -> None:
    sm = L.lifecycle_class()(model=Guards())
    with pytest.raises(LocalProtocolError):
        sm.send("round_scattered")


def test_mermaid_lists_every_transition() -> None:
    lines = mermaid_state_diagram(L.lifecycle_spec())
    assert lines[:3] == ["stateDiagram-v2", '    state "Idle" as idle', "    [*] --> idle"]
    text = "\n".join(lines)
    for _, ev, _, _, _ in L.transitions():
        assert f": {ev}" in text
    assert "    reducing --> reducing: round_scattered [round_complete]" in lines


@pytest.mark.parametrize(("machine", "states", "events"), [
    ("controller", L.LifecycleState, L.LifecycleEvent),
    ("relay", L.RelayState, L.RelayEvent),
])
def test_enums_name_every_state_and_event_of_the_spec(machine: str, states: Any,
                                                      events: Any) -> None:
    spec = SPEC.lifecycle()["machines"][machine]
    assert [s.value for s in states] == list(spec["states"])
    assert {e.value for e in events} == set(spec["events"])
    assert {e for _, e, _, _, _ in L.transitions(machine)} == set(spec["events"])


class RelayGuards:
    def __init__(self) -> None:
        self.every_local_rank_connected = False
        self.every_local_rank_gone = False
        self.state: Any = None


def test_relay_class_matches_the_spec() -> None:
    cls = L.lifecycle_class("relay")
    assert cls is L.lifecycle_class("relay") and cls is not L.lifecycle_class()
    assert [s.id for s in cls.states] == [s.value for s in L.RelayState]
    assert cls.initial_state.id == "accepting_ranks"
    assert [s.id for s in cls.final_states] == ["done"]
    generated = {(s.id, str(ev), t.target.id) for s in cls.states for t in s.transitions
                 for ev in t.events}
    assert generated == {(src, ev, dst) for src, ev, dst, _, _ in L.transitions("relay")}


def test_relay_happy_path_and_drain() -> None:
    g = RelayGuards()
    lc = L.Lifecycle(g, "relay")
    assert lc.state == L.RelayState.ACCEPTING_RANKS and lc.state_name == "AcceptingRanks"
    lc.fire(L.RelayEvent.RANK_CONNECTED)
    with pytest.raises(SequenceError) as ei:
        lc.fire(L.RelayEvent.ALL_CONNECTED)  # a rank is still missing
    assert ei.value.error_id == "relay.bad_event"
    assert str(ei.value) == "relay: event 'all_connected' is not allowed in state AcceptingRanks"
    g.every_local_rank_connected = True
    lc.fire(L.RelayEvent.ALL_CONNECTED)
    lc.fire(L.RelayEvent.HELLO_SENT)
    assert lc.state == L.RelayState.AWAITING_HELLO_ACK
    lc.fire(L.RelayEvent.HELLO_ACKED)
    lc.fire(L.RelayEvent.RANK_LEFT)
    with pytest.raises(LocalProtocolError):
        lc.fire(L.RelayEvent.LAST_RANK_LEFT)
    g.every_local_rank_gone = True
    with pytest.raises(LocalProtocolError):
        lc.fire(L.RelayEvent.RANK_LEFT)
    lc.fire(L.RelayEvent.LAST_RANK_LEFT)
    assert lc.state == L.RelayState.DRAINING
    lc.fire(L.RelayEvent.DRAINED, detail="flushed")
    assert lc.is_final and lc.allowed_events() == []
    out = lc.outcome
    assert out is not None and out.clean and out.reason == "drained" and out.detail == "flushed"


def test_relay_fail_records_the_error() -> None:
    lc = L.Lifecycle(RelayGuards(), "relay")
    err = protocol_error("relay.closed_before_helloack", hello_bytes=4)
    lc.fire(L.RelayEvent.FAIL, error=err)
    out = lc.outcome
    assert lc.state == L.RelayState.DONE
    assert out is not None and not out.clean and out.error is err and out.reason == "fail"


class LifecycleStateful(RuleBasedStateMachine):
    """Fires any event (and unknown ones) at the generated class; the spec is the oracle."""

    def __init__(self) -> None:
        super().__init__()
        self.g = Guards()
        self.lc = L.Lifecycle(self.g)
        self.state = "idle"

    @rule(covered=st.booleans(), complete=st.booleans(), none_alive=st.booleans())
    def set_guards(self, covered: bool, complete: bool, none_alive: bool) -> None:
        self.g.every_rank_covered = covered
        self.g.round_complete = complete
        self.g.no_relay_alive = none_alive

    @rule(event=st.sampled_from([*L.EVENTS, "bogus", "error.execution"]))
    def fire(self, event: str) -> None:
        target = _oracle(self.state, event, self.g)
        kwargs: dict[str, Any] = {}
        if event == "fail":
            kwargs["error"] = protocol_error("controller.data_record", rank=0)
        if target is None:
            with pytest.raises(LocalProtocolError):
                self.lc.fire(event, **kwargs)
        else:
            self.lc.fire(event, **kwargs)
            self.state = target
            if target == "shutdown":
                out = self.lc.outcome
                assert out is not None and out.reason == event
                assert out.clean == (event in L.CLEAN_EXIT_EVENTS)

    @invariant()
    def state_matches_the_spec(self) -> None:
        assert self.lc.state == self.state
        assert self.lc.is_final == (self.state == "shutdown")
        if self.state != "shutdown":
            assert self.lc.outcome is None

    @invariant()
    def enabled_events_match_the_spec(self) -> None:
        want = {e for e in L.EVENTS if _oracle(self.state, e, self.g) is not None}
        assert set(self.lc.enabled_events()) == want
        allowed = {ev for src, ev, _, _, _ in L.transitions() if src == self.state}
        if self.state == "shutdown":
            allowed = set()
        assert set(self.lc.allowed_events()) == allowed


TestLifecycleStateful = LifecycleStateful.TestCase
TestLifecycleStateful.settings = settings(stateful_step_count=25)
TestLifecycleStateful.pytestmark = [pytest.mark.stateful]


@pytest.mark.parametrize("machine", L.MACHINES)
def test_internal_shortcuts_are_guarded_self_transitions_of_the_spec(machine: str) -> None:
    """Lifecycle.fire skips the library only for an internal self-transition that carries
    nothing but guards (round_scattered once per round): each such entry is one in the spec."""
    rows = L._SHORTCUTS[machine]
    assert rows  # hello_accepted / round_scattered (controller), rank_connected / rank_left
    spec_states = L.lifecycle_spec(machine)["states"]
    for (state, event), guards in rows.items():
        (row,) = spec_states[state]["on"][event]
        assert row["target"] == state and row["internal"] is True
        assert {(row[k], k == "cond") for k in ("cond", "unless") if k in row} == set(guards)


def test_round_scattered_shortcut_still_enforces_its_guard() -> None:
    g = Guards()
    lc = L.Lifecycle(g)
    lc.fire("start")
    g.every_rank_covered = True
    lc.fire("all_covered")
    g.round_complete = True
    lc.fire("round_scattered")
    g.round_complete = False
    with pytest.raises(SequenceError):
        lc.fire("round_scattered")
    assert lc.state == "reducing"
# -- the checks and callbacks built when the module loads ------------------------------------------
# _check_spec, _outcome_recorder and _sender run once at import (or when a class is first built),
# so the tests above exercise them only indirectly; these call them directly with exact results.
def _spec(machine: str = "controller") -> dict[str, Any]:
    return L.lifecycle_spec(machine)


@pytest.mark.parametrize("machine", L.MACHINES)
def test_check_spec_accepts_the_spec(machine: str) -> None:
    assert L._check_spec(machine, _spec(machine)) is None


def _spec_error(machine: str, spec: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as ei:
        L._check_spec(machine, spec)
    return str(ei.value)


@pytest.mark.parametrize(("initial", "final"), [([], ["shutdown"]), (["idle", "accepting"],
                                                                      ["shutdown"]),
                                                 (["idle"], []), (["idle"], ["reducing",
                                                                             "shutdown"])])
def test_check_spec_needs_one_initial_and_one_final_state(initial: list[str],
                                                          final: list[str]) -> None:
    spec = _spec()
    for name, d in spec["states"].items():
        d.pop("initial", None)
        d.pop("final", None)
        if name in initial:
            d["initial"] = True
        if name in final:
            d["final"] = True
    assert _spec_error("controller", spec) == (
        "lifecycle.yaml: controller needs one initial and one final state")


def test_check_spec_states_follow_the_enum() -> None:
    spec = _spec()
    states = spec["states"]
    spec["states"] = {k: states[k] for k in ("accepting", "idle", "reducing", "shutdown")}
    assert _spec_error("controller", spec) == (
        "lifecycle.yaml: controller states ['accepting', 'idle', 'reducing', 'shutdown'] != "
        "LifecycleState ['idle', 'accepting', 'reducing', 'shutdown']")


def test_check_spec_events_follow_the_enum(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = L.transitions("relay")
    monkeypatch.setattr(L, "transitions", lambda machine: [*rows, ("done", "x", "done", None,
                                                                   None)])
    known = sorted({r[1] for r in rows})
    assert _spec_error("relay", _spec("relay")) == (
        f"lifecycle.yaml: relay events {sorted([*known, 'x'])} != RelayEvent {known} (not in "
        "the package: ['x']; missing: [])")


def test_check_spec_guards_used_and_declared() -> None:
    spec = _spec()
    spec["guards"]["spare"] = "never used"
    assert _spec_error("controller", spec) == (
        "lifecycle.yaml: controller guards used ['every_rank_covered', 'no_relay_alive', "
        "'round_complete'] != declared ['every_rank_covered', 'no_relay_alive', "
        "'round_complete', 'spare']")
    del spec["guards"]
    assert _spec_error("controller", spec).startswith(
        "lifecycle.yaml: controller guards used ['every_rank_covered', 'no_relay_alive', "
        "'round_complete'] != declared []")


def test_check_spec_events_and_outcomes_tables() -> None:
    msg = "lifecycle.yaml: controller events / outcomes tables do not match the transitions"
    spec = _spec()
    del spec["events"]["stop"]
    assert _spec_error("controller", spec) == msg
    spec = _spec()
    del spec["events"]
    assert _spec_error("controller", spec) == msg
    spec = _spec()
    spec["outcomes"]["nonsense"] = "clean"
    assert _spec_error("controller", spec) == msg
    spec = _spec()  # an outcome for every event is allowed
    spec["outcomes"] = {e.value: "error" for e in L.LifecycleEvent}
    assert L._check_spec("controller", spec) is None


@pytest.mark.parametrize("machine", L.MACHINES)
def test_outcome_recorder(machine: str) -> None:
    record = L._outcome_recorder(machine)
    clean_event = "stop"
    obj = SimpleNamespace()
    err = protocol_error("controller.closed_before_hello")
    record(obj, clean_event, error=err, detail="why")
    assert obj.outcome == L.Outcome(True, "stop", None, "why")
    record(obj, L.LifecycleEvent.STOP)
    assert obj.outcome == L.Outcome(True, "stop", None, "")
    record(obj, "fail", error=err, detail="d")
    assert obj.outcome == L.Outcome(False, "fail", err, "d")
    record(obj)
    assert obj.outcome == L.Outcome(False, "fail", None, "")
    record(obj, None, err)
    assert obj.outcome == L.Outcome(False, "fail", err, "")


def test_outcome_recorder_uses_each_machines_outcomes() -> None:
    obj = SimpleNamespace()
    L._outcome_recorder("relay")(obj, "drained")
    assert obj.outcome == L.Outcome(True, "drained", None, "")
    L._outcome_recorder("controller")(obj, "drained")  # not a controller outcome
    assert obj.outcome == L.Outcome(False, "drained", None, "")
    L._outcome_recorder("controller")(obj, "rank_exit")
    assert obj.outcome == L.Outcome(True, "rank_exit", None, "")


def test_sender_forwards_and_names_the_machine() -> None:
    send = L._sender("relay")
    sm = L.lifecycle_class("relay")(model=RelayGuards())
    err = protocol_error("relay.closed_before_helloack", hello_bytes=4)
    assert send(sm, L.RelayEvent.FAIL, error=err, detail="d") is None
    assert sm.outcome == L.Outcome(False, "fail", err, "d")
    with pytest.raises(SequenceError) as ei:
        send(sm, "stop")
    assert ei.value.error_id == "relay.bad_event"
    assert str(ei.value) == "relay: event 'stop' is not allowed in state Done"
    send = L._sender("controller")
    sm = L.lifecycle_class()(model=Guards())
    with pytest.raises(SequenceError) as ei:
        send(sm, L.LifecycleEvent.ALL_DEAD)
    assert ei.value.error_id == "controller.bad_event"
    assert str(ei.value) == "controller: event 'all_dead' is not allowed in state Idle"


def test_outcome_text() -> None:
    err = protocol_error("controller.closed_before_hello")
    assert str(L.Outcome(True, "stop")) == "clean (stop)"
    assert str(L.Outcome(True, "stop", None, "by request")) == "clean (stop: by request)"
    assert str(L.Outcome(False, "fail", err)) == f"error: {err}"
    assert str(L.Outcome(False, "fail", err, "relay 2")) == f"error: {err} [relay 2]"


def test_state_names_join_the_configuration() -> None:
    assert L._state_names(SimpleNamespace(configuration=[])) == "(none)"
    two = [SimpleNamespace(name="Idle"), SimpleNamespace(name="Accepting")]
    assert L._state_names(SimpleNamespace(configuration=two)) == "Idle, Accepting"


def test_allowed_and_enabled_events_are_event_names() -> None:
    lc = L.Lifecycle(Guards())
    assert lc.allowed_events() == ["start", "stop", "fail"]
    assert lc.enabled_events() == ["start", "stop", "fail"]


def test_lifecycle_spec_without_docs_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = SPEC.lifecycle()
    doc.pop("x-docs-keys", None)
    monkeypatch.setattr(SPEC, "lifecycle", lambda: doc)
    assert L.lifecycle_spec("relay")["x-docs-keys"] == []


def test_internal_shortcuts_of_the_spec() -> None:
    # built once at import: called here so its rules are tested directly
    assert L._internal_shortcuts(_spec()) == {
        ("accepting", "hello_accepted"): (("every_rank_covered", False),),
        ("reducing", "round_scattered"): (("round_complete", True),)}
    assert L._internal_shortcuts(_spec("relay")) == {
        ("accepting_ranks", "rank_connected"): (("every_local_rank_connected", False),),
        ("folding", "rank_left"): (("every_local_rank_gone", False),)}


@pytest.mark.parametrize(("rows", "want"), [
    ([{"target": "s", "internal": True}], ()),
    ([{"target": "s", "internal": True, "cond": "a", "unless": "b"}], (("a", True),
                                                                      ("b", False))),
    ([{"target": "s", "internal": True, "unless": "b"}], (("b", False),)),
    ([{"target": "t", "internal": True}], None),  # leaves the state
    ([{"target": "s"}], None),  # not internal
    ([{"target": "s", "internal": "yes"}], None),
    ([{"target": "s", "internal": True, "on": "x"}], None),  # a callback: not guards only
    ([{"target": "s", "internal": True, "cond": ["a", "b"]}], None),  # a guard list
    ([{"target": "s", "internal": True}, {"target": "t"}], None),  # two rows
    ({"target": "s", "internal": True}, None),  # not a list of rows
])
def test_internal_shortcuts_take_only_guard_only_self_transitions(rows: Any,
                                                                  want: Any) -> None:
    spec = {"states": {"s": {"on": {"e": rows, "f": [{"target": "s", "internal": True}]}},
                       "t": {}, "u": {"on": None}}}
    got = L._internal_shortcuts(spec)
    assert got.pop(("s", "f")) == ()  # an event after the one under test is still seen
    assert got == ({} if want is None else {("s", "e"): want})


def test_transitions_carry_unless_guards() -> None:
    assert ("accepting", "hello_accepted", "accepting", None, "every_rank_covered") in (
        L.transitions())


@pytest.mark.parametrize("doc", [
    {"schema": "flodl-proto-lifecycle/1", "machines": {"relay": {"states": {}}}},
    {"schema": "flodl-proto-lifecycle/2", "machines": [{"states": {}}]},
    {"schema": "flodl-proto-lifecycle/2", "machines": {"relay": ["states"]}},
    {"schema": "flodl-proto-lifecycle/2", "machines": {"relay": {"initial": "x"}}},
    {"schema": "flodl-proto-lifecycle/2", "machines": {"controller": {"states": {}}}},
])
def test_lifecycle_spec_refuses_a_malformed_document(monkeypatch: pytest.MonkeyPatch,
                                                     doc: dict[str, Any]) -> None:
    monkeypatch.setattr(SPEC, "lifecycle", lambda: doc)
    with pytest.raises(SpecError) as ei:
        L.lifecycle_spec("relay")
    assert str(ei.value) == ("lifecycle.yaml: missing or unknown 'schema', or no machine "
                             "'relay' with 'states'")


def test_guards_may_be_methods_and_the_kind_is_kept() -> None:
    class MethodGuards:
        def __init__(self) -> None:
            self.complete = False

        def every_rank_covered(self) -> bool:
            return True

        def round_complete(self) -> bool:
            return self.complete

        def no_relay_alive(self) -> bool:
            return False

    g = MethodGuards()
    lc = L.Lifecycle(g)
    assert lc.kind == "controller" and L.Lifecycle(RelayGuards(), "relay").kind == "relay"
    lc.fire("start")
    lc.fire("all_covered")
    with pytest.raises(SequenceError):
        lc.fire("round_scattered")  # the method answers False: not a truthy bound method
    g.complete = True
    lc.fire("round_scattered")
    assert lc.state == "reducing"


def test_internal_shortcuts_refuse_an_unless_list() -> None:
    spec = {"states": {"s": {"on": {"e": [{"target": "s", "internal": True,
                                           "unless": ["a", "b"]}]}}}}
    assert L._internal_shortcuts(spec) == {}


@pytest.mark.parametrize(("machine", "model"), [("controller", L.LifecycleModel),
                                                ("relay", L.RelayLifecycleModel)])
def test_every_guard_of_the_model_has_a_docstring_of_its_own(machine: str, model: type) -> None:
    """Each guard the spec lists is a property of the machine's model protocol, documented on
    its own (what makes it true, the transitions that read it, its upstream), not only in the
    class's summary."""
    guards = L.lifecycle_spec(machine)["guards"]
    assert guards
    for name in guards:
        prop = vars(model)[name]
        assert isinstance(prop, property), name
        doc = prop.__doc__ or ""
        assert doc.startswith("True "), name
        assert "spec/lifecycle.yaml" in doc and "Upstream:" in doc, name
        # the transitions it guards are named
        for _source, event, _target, cond, unless in L.transitions(machine):
            if name in (cond, unless):
                assert f"``{event}``" in doc, (name, event)

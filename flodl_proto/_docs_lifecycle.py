"""The lifecycle section of the generated protocol reference: one mermaid ``stateDiagram-v2``,
a state table and a transition table per machine of ``spec/lifecycle.yaml`` (the transition rows
come from :mod:`flodl_proto.spec`, which the state machines read too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._markdown import _table, _text
from .spec import as_name_list, lifecycle_machines, lifecycle_transitions, walk_lifecycle_states

__all__ = ["mermaid_state_diagram"]


# -------------------------------------------------------------------------------------------------
# Lifecycle
# -------------------------------------------------------------------------------------------------
_MACHINE_OPTIONS_SKIP = {"states", "name"}


def _mermaid_id(sid: str) -> str:
    return re.sub(r"\W", "_", sid)


def mermaid_state_diagram(machine: Mapping[str, Any]) -> list[str]:
    """Render a python-statemachine definition as a mermaid ``stateDiagram-v2`` (lines).

    States are declared with their display ``name``; ``[*] -->`` marks initial states and
    ``--> [*]`` final ones; each transition is labelled ``event [guard]`` (``cond`` as is,
    ``unless`` as ``not ...``), eventless transitions are unlabelled but for their guard; nested
    ``states`` become composite states. The rendering uses only the definition mapping, so the
    output is stable across library versions.

    No upstream counterpart: a drawing helper of the generated docs.
    """
    acc: list[tuple[str, str | None, Mapping[Any, Any]]] = []
    states = machine.get("states", {})
    walk_lifecycle_states(states if isinstance(states, Mapping) else {}, None, acc)
    lines = ["stateDiagram-v2"]

    def declare(parent: str | None, indent: str) -> None:
        for sid, par, sdef in acc:
            if par != parent:
                continue
            mid = _mermaid_id(sid)
            children = isinstance(sdef.get("states"), Mapping) and sdef.get("states")
            label = str(sdef.get("name") or sid).replace('"', "'")
            if children:
                lines.append(f'{indent}state "{label}" as {mid} {{')
                declare(sid, indent + "    ")
                lines.append(f"{indent}}}")
            else:
                lines.append(f'{indent}state "{label}" as {mid}')
            if sdef.get("initial"):
                lines.append(f"{indent}[*] --> {mid}")
            if sdef.get("final"):
                lines.append(f"{indent}{mid} --> [*]")

    declare(None, "    ")
    for t in lifecycle_transitions(acc):
        label = t.event
        if t.guard:
            label = f"{label} [{t.guard}]".strip()
        target = _mermaid_id(t.target) if t.target else _mermaid_id(t.source)
        arrow = f"    {_mermaid_id(t.source)} --> {target}"
        lines.append(f"{arrow}: {label}" if label else arrow)
    return lines


def _render_mapping_table(title: str, value: Any) -> list[str]:
    """Render a descriptive lifecycle key generically (mapping, list of mappings, scalar)."""
    out = [f"**{title}**", ""]
    if isinstance(value, Mapping):
        out += _table(["name", "meaning"], [(f"`{k}`", _text(v)) for k, v in value.items()])
    elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
        keys: list[str] = []
        for v in value:
            for k in v:
                if str(k) not in keys:
                    keys.append(str(k))
        out += _table(keys, [[_text(v.get(k, "")) for k in keys] for v in value])
    elif isinstance(value, list):
        out += [f"- {_text(v)}" for v in value]
    else:
        out.append(_text(value))
    out.append("")
    return out


def _render_lifecycle(doc: Mapping[str, Any] | None, number: int) -> list[str]:
    out = [f"## {number}. Lifecycle", ""]
    if doc is None:
        return [*out, "The lifecycle spec (`spec/lifecycle.yaml`) is not available; "
                "regenerate these docs once it exists.", ""]
    machines = lifecycle_machines(doc)
    if not machines:
        return [*out, "`spec/lifecycle.yaml` declares no state machine.", ""]
    docs_keys = set(as_name_list(doc.get("x-docs-keys")))
    for mname, m in machines:
        out += [f"### {mname}", ""]
        if m.get("doc"):
            out += [_text(m["doc"]), ""]
        acc: list[tuple[str, str | None, Mapping[Any, Any]]] = []
        states = m.get("states", {})
        walk_lifecycle_states(states if isinstance(states, Mapping) else {}, None, acc)
        out += ["```mermaid", *mermaid_state_diagram(m), "```", ""]
        out += ["States:", ""]
        srows = []
        for sid, parent, sdef in acc:
            flags = [f for f in ("initial", "final", "parallel") if sdef.get(f)]
            srows.append((f"`{sid}`", _text(sdef.get("name", "")), ", ".join(flags),
                          _text(parent or ""),
                          ", ".join(f"`{a}`" for a in as_name_list(sdef.get("enter"))),
                          ", ".join(f"`{a}`" for a in as_name_list(sdef.get("exit")))))
        out += _table(["state", "name", "flags", "inside", "on enter", "on exit"], srows)
        out.append("")
        out += ["Transitions (an event not listed for a state is not allowed in it):", ""]
        events = m.get("events") if isinstance(m.get("events"), Mapping) else {}
        trows = []
        for t in lifecycle_transitions(acc):
            trows.append((f"`{t.source}`", f"`{t.event}`" if t.event else "(eventless)",
                          _text(t.guard), f"`{t.target or t.source}`",
                          "internal" if t.internal else "", _text(t.actions),
                          _text(events.get(t.event, "")) if isinstance(events, Mapping) else ""))
        out += _table(["from", "event", "guard", "to", "kind", "actions", "event meaning"], trows)
        out.append("")
        options = [
            (k, v) for k, v in m.items()
            if k not in _MACHINE_OPTIONS_SKIP and k not in docs_keys and not isinstance(v, Mapping)
            and not isinstance(v, list) and k != "machine"
        ]
        if options:
            out += ["Machine options:", ""]
            out += _table(["option", "value"],
                          [(f"`{k}`", f"`{str(v).lower() if isinstance(v, bool) else v}`")
                           for k, v in options])
            out.append("")
        for key in m:
            if key in ("states", "doc", "machine", "name", "schema", "x-docs-keys", "events"):
                continue
            if key in dict(options):
                continue
            out += _render_mapping_table(str(key), m[key])
    return out

"""The spec's tables read across entries, and the checks that need them: the lifecycle
machines and their transition rows (read by the state machines and the docs), the checks of a
parsed ``lifecycle.yaml`` (its shape, every transition's target, every state reached, every
event and guard given a meaning) and of a ``wire.yaml`` message's byte layout (field types,
sizes, names, offsets, the length constants of its structs).

Split from :mod:`flodl_proto.spec`, which re-exports the public names and raises these checks'
:class:`~flodl_proto._spec_shapes.ShapeError` as its ``SpecError``; it imports nothing of the
package but the leaf :mod:`flodl_proto._spec_shapes`. No upstream counterpart: upstream writes
its constants, layouts and lifecycles in code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._spec_shapes import (
    LIFECYCLE_KEYS,
    LIFECYCLE_SHAPE,
    ShapeError,
    check_shape,
    check_top_level,
)

__all__ = [
    "DERIVED_SIZES",
    "LENIENCY_WORDS",
    "LIFECYCLE_SCHEMA",
    "LifecycleTransition",
    "as_name_list",
    "check_enum_codes",
    "check_layout",
    "check_layout_lengths",
    "check_leniency_fields",
    "check_lifecycle_doc",
    "lifecycle_machines",
    "lifecycle_transitions",
    "machine_transitions",
    "message_fields",
    "struct_layouts",
    "walk_lifecycle_states",
]


# -- lifecycle tables (spec/lifecycle.yaml), read once for the state machines and the docs --
def lifecycle_machines(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Find the state machine definitions in a parsed ``lifecycle.yaml``.

    Accepts one machine at the top level (a ``states`` mapping, named by ``machine`` or ``name``)
    or several under any top-level key whose value holds a ``states`` mapping (one level of
    nesting, e.g. ``machines: {controller: {...}, relay: {...}}``).

    Returns:
        ``[(machine name, definition mapping), ...]`` in file order; empty if none is found.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """
    if isinstance(doc.get("states"), Mapping):
        name = doc.get("machine") or doc.get("name") or "lifecycle"
        return [(str(name), doc)]
    found: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in doc.items():
        if not isinstance(value, Mapping):
            continue
        if isinstance(value.get("states"), Mapping):
            found.append((str(value.get("machine") or value.get("name") or key), value))
            continue
        for k2, v2 in value.items():
            if isinstance(v2, Mapping) and isinstance(v2.get("states"), Mapping):
                found.append((str(v2.get("machine") or v2.get("name") or k2), v2))
    return found


@dataclass(frozen=True, slots=True)
class LifecycleTransition:
    """One transition row of a lifecycle definition.

    Attributes:
        source: the source state id.
        event: the event name ("" for an eventless transition).
        target: the target state id (None: a targetless, self transition).
        guard: the guard as text (``cond`` as is, ``unless`` as ``not ...``, joined by "and").
        internal: an internal transition (no exit/enter of the source).
        actions: ``before``/``on``/``after`` callbacks as text.
        cond: the ``cond`` guard names.
        unless: the ``unless`` guard names.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """

    source: str
    event: str
    target: str | None
    guard: str
    internal: bool
    actions: str
    cond: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()


def as_name_list(value: Any) -> list[str]:
    """A definition value that may be one name or a list of names, as a list of strings.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence):
        return [str(v) for v in value]
    return [str(value)]


def _guard_text(t: Mapping[str, Any]) -> str:
    parts = [*as_name_list(t.get("cond")), *(f"not {u}" for u in as_name_list(t.get("unless")))]
    parts += [f"valid {v}" for v in as_name_list(t.get("validators"))]
    return " and ".join(parts)


def walk_lifecycle_states(states: Mapping[Any, Any], parent: str | None,
                          acc: list[tuple[str, str | None, Mapping[Any, Any]]]) -> None:
    """Append ``(state id, parent id, definition)`` for ``states`` and their nested states to
    ``acc``, depth first in document order.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """
    for sid, sdef in states.items():
        sdef = sdef if isinstance(sdef, Mapping) else {}
        acc.append((str(sid), parent, sdef))
        inner = sdef.get("states")
        if isinstance(inner, Mapping):
            walk_lifecycle_states(inner, str(sid), acc)


def lifecycle_transitions(
    states: list[tuple[str, str | None, Mapping[Any, Any]]],
) -> list[LifecycleTransition]:
    """Every transition of the walked ``states`` (:func:`walk_lifecycle_states`), in document
    order: one row per target of each ``on`` entry (and each eventless ``transitions`` entry).
    YAML 1.1 reads an unquoted ``on`` key as True; both spellings are read.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """
    out: list[LifecycleTransition] = []
    for sid, _parent, sdef in states:
        on = sdef.get("on")
        if on is None:
            on = sdef.get(True)  # YAML 1.1 reads an unquoted `on` key as True
        groups: list[tuple[str, Any]] = []
        if isinstance(on, Mapping):
            groups += [(str(ev), tl) for ev, tl in on.items()]
        if sdef.get("transitions"):
            groups.append(("", sdef["transitions"]))
        for ev, tl in groups:
            for t in tl if isinstance(tl, list) else [tl]:
                if not isinstance(t, Mapping):
                    continue
                event = ev
                if t.get("event"):
                    event = f"{ev} {t['event']}".strip()
                actions = []
                for key in ("before", "on", "after"):
                    for a in as_name_list(t.get(key)):
                        actions.append(f"{key}: {a}")
                targets = str(t["target"]).split() if t.get("target") else [None]
                for target in targets:
                    out.append(LifecycleTransition(
                        sid, event, target, _guard_text(t), bool(t.get("internal")),
                        "; ".join(actions), tuple(as_name_list(t.get("cond"))),
                        tuple(as_name_list(t.get("unless")))))
    return out


def machine_transitions(machine: Mapping[str, Any]) -> list[LifecycleTransition]:
    """The transition rows of one machine definition (see :func:`lifecycle_transitions`).

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """
    acc: list[tuple[str, str | None, Mapping[Any, Any]]] = []
    states = machine.get("states", {})
    walk_lifecycle_states(states if isinstance(states, Mapping) else {}, None, acc)
    return lifecycle_transitions(acc)


#: the ``schema`` of the lifecycle document this package reads
LIFECYCLE_SCHEMA: Final = "flodl-proto-lifecycle/2"


def check_lifecycle_doc(doc: Mapping[str, Any]) -> None:
    """Check a parsed ``lifecycle.yaml`` (the loader does, once per file): its ``schema``, its
    top-level keys (``schema``, ``x-docs-keys``, ``machines``: :data:`LIFECYCLE_KEYS`), the
    shape of everything below them (``_spec_shapes.LIFECYCLE_SHAPE``: a machine's keys and their
    types, a state's, a transition's, as python-statemachine's definition format and the docs read
    them), at least one machine with ``states``, every transition's target among its
    machine's states, every state reached from the initial one (the library that builds the
    classes refuses the others; the docs would draw them), and every event and guard of a
    transition in the machine's ``events`` and ``guards`` tables when it has them (the docs
    show its meaning from there).

    Raises:
        ShapeError: one line naming what is wrong (an unknown top-level key; the path of a value
            of another shape, ``machines.relay.states.idle.initial``; the machine, the
            transition and the target).

    :func:`flodl_proto.spec.check_lifecycle` raises it as ``SpecError``. No upstream
    counterpart (upstream's lifecycles are code).
    """
    if doc.get("schema") != LIFECYCLE_SCHEMA:
        raise ShapeError(f"lifecycle.yaml: missing or unknown 'schema' (not {LIFECYCLE_SCHEMA})")
    check_top_level(doc, "lifecycle.yaml", LIFECYCLE_KEYS)
    for key, value in doc.items():
        check_shape(value, LIFECYCLE_SHAPE.optional[key], "lifecycle.yaml", str(key))
    machines = lifecycle_machines(doc)
    if not machines:
        raise ShapeError("lifecycle.yaml: no machine with 'states'")
    for name, machine in machines:
        acc: list[tuple[str, str | None, Mapping[Any, Any]]] = []
        walk_lifecycle_states(machine["states"], None, acc)
        known = {sid for sid, _parent, _sdef in acc}
        rows = lifecycle_transitions(acc)
        for t in rows:
            if t.target is not None and t.target not in known:
                raise ShapeError(f"lifecycle.yaml: {name}: the transition {t.source} "
                                f"--{t.event or '(eventless)'}--> {t.target!r} targets no state "
                                f"of the machine ({', '.join(sorted(known))})")
        _check_reachable(name, acc, rows)
        for key, used in (("events", [t.event for t in rows if t.event]),
                          ("guards", [g for t in rows for g in (*t.cond, *t.unless)])):
            told = machine.get(key)  # a table of meanings the docs show beside each row
            for word in (w for w in used if isinstance(told, Mapping) and w not in told):
                raise ShapeError(f"lifecycle.yaml: {name}: {key[:-1]} {word!r} of a transition "
                                f"has no entry in {key!r} (its meaning)")


def _check_reachable(name: str, acc: Sequence[tuple[str, str | None, Mapping[Any, Any]]],
                     rows: Sequence[LifecycleTransition]) -> None:
    """Refuse a state of machine ``name`` that no transition reaches from its initial state (a
    state entered enters its children and is inside its parent), as python-statemachine refuses
    a disconnected state when it builds the class; the docs drew it."""
    initial = [sid for sid, parent, sdef in acc if parent is None and sdef.get("initial")]
    reached, grown = set(initial), True
    while grown:
        size = len(reached)
        reached |= {t.target for t in rows if t.source in reached and t.target is not None}
        reached |= {s for s, parent, _ in acc if parent in reached}
        reached |= {parent for s, parent, _ in acc if s in reached and parent is not None}
        grown = len(reached) > size
    for sid, _parent, _sdef in acc:
        if initial and sid not in reached:
            raise ShapeError(f"lifecycle.yaml: {name}: state {sid!r} is reached by no transition "
                            f"from the initial state {initial[0]} (the library refuses a "
                            "disconnected state)")


def message_fields(msg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A message's field entries: its own ``fields``, and those of its ``parts`` and
    ``variants`` (entries that are no mapping are left out)."""
    groups = [msg.get("fields")]
    groups += [p.get("fields") for key in ("parts", "variants")
               for p in (msg.get(key) or []) if isinstance(p, dict)]
    return [f for g in groups if isinstance(g, list) for f in g if isinstance(f, dict)]


def check_layout(mname: str, msg: Mapping[str, Any], types: Mapping[str, Any]) -> None:
    """Refuse (:class:`ShapeError`) a byte-layout field of message ``mname`` (its ``fields``
    and its ``parts``'; not the bincode ``variants``) whose ``type`` is not in ``types``, whose
    integer ``size`` is not its type's, whose name an earlier field of the message has, or
    whose integer ``offset`` is not where the field before it ends, in one line naming the
    message, the field and the value (the docs drew such a table as written). The offsets run
    on across the ``parts`` (a RoundFrame's kind at 8, after its header's 8 bytes), from 0 at
    the message's first field."""
    names: set[Any] = set()
    groups = [msg.get("fields")] + [p.get("fields") for p in (msg.get("parts") or [])
                                    if isinstance(p, dict)]
    end: int | None = 0  # where the field before ends (its offset and size known)
    for group in (g for g in groups if isinstance(g, list)):
        for f in (f for f in group if isinstance(f, dict)):
            where = f"wire.yaml: message {mname} field {f.get('name')}"
            kind = types.get(str(f.get("type")))
            if not isinstance(kind, Mapping):
                raise ShapeError(f"{where}: type {f.get('type')!r} is not in the 'types' section")
            size, offset = f.get("size"), f.get("offset")
            if isinstance(size, int) and kind.get("size") is not None and size != kind["size"]:
                raise ShapeError(f"{where}: size {size} is not the size of type {f['type']!r} "
                                f"({kind['size']})")
            if f.get("name") in names:
                raise ShapeError(f"{where}: a second field of that name")
            names.add(f.get("name"))
            if isinstance(offset, int) and isinstance(end, int) and offset != end:
                raise ShapeError(f"{where}: offset {offset} is not where the field before it "
                                f"ends ({end})" if len(names) > 1 else
                                f"{where}: offset {offset} is not 0 (the message's first field)")
            end = offset + size if isinstance(offset, int) and isinstance(size, int) else None


def check_enum_codes(enums: Mapping[str, Any], messages: Mapping[str, Any],
                     types: Mapping[str, Any]) -> None:
    """Refuse (:class:`ShapeError`) an enum of ``wire.yaml`` (its ``enums``, already of their
    shape, and the ``messages`` whose fields name them) with a code that is negative, above a
    u32 (an enum's code is a u8 or u32 field, or a bincode u32 varint), that an earlier value of
    the enum has, or that a fixed-size field naming the enum cannot carry (a u8 ``dtype`` of
    256); the reference documented each as written.

    Raises:
        ShapeError: one line naming the enum, the value and its code, and what is wrong:
            ``wire.yaml: enum RoundKind: CONTROL has code 0, which MODEL has``.
    """
    for ename, enum in enums.items():
        seen: dict[int, str] = {}
        for vname, value in enum["values"].items():
            code = value["code"]
            why = ("not a whole number >= 0" if code < 0 else
                   "above a u32 (0..4294967295)" if code > 0xFFFF_FFFF else
                   f"which {seen[code]} has" if code in seen else None)
            if why is not None:
                raise ShapeError(f"wire.yaml: enum {ename}: {vname} has code {code}, {why}")
            seen[code] = vname
    for mname, msg in messages.items():
        for f in message_fields(msg):
            named, ftype = f.get("enum"), f.get("type")
            entry = types.get(ftype) if isinstance(ftype, str) else None
            size = entry.get("size") if isinstance(entry, dict) else None
            if not isinstance(named, str) or named not in enums or not isinstance(size, int):
                continue
            top = (1 << 8 * size) - 1
            for vname, value in enums[named]["values"].items():
                if value["code"] > top:
                    raise ShapeError(
                        f"wire.yaml: enum {named}: {vname} has code {value['code']}, which "
                        f"field {f.get('name')} of message {mname} cannot carry "
                        f"({f['type']}: 0..{top})")


def struct_layouts(messages: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """The construct structs the messages of ``wire.yaml`` name (a message's ``struct`` and
    its parts'), each as ``(struct, what it lays out, its size in bytes)``: ``("HANDSHAKE",
    "message handshake", 16)``, ``("ROUND_FRAME_HEADER", "part header of message round_frame",
    8)``. A struct's size is the sum of the fixed sizes of its fields (a message's fields of a
    size another field gives, a mux record's ``payload``, follow its struct)."""
    found: list[tuple[str, str, int]] = []
    for mname, msg in messages.items():
        owners = [(msg, f"message {mname}")]
        owners += [(p, f"part {p.get('name')} of message {mname}")
                   for p in (msg.get("parts") or []) if isinstance(p, dict)]
        for owner, what in owners:
            fields = owner.get("fields")
            if isinstance(owner.get("struct"), str) and isinstance(fields, list):
                size = sum(f["size"] for f in fields
                           if isinstance(f, dict) and isinstance(f.get("size"), int))
                found.append((owner["struct"], what, size))
    return found


def _before_tag(msg: Mapping[str, Any]) -> tuple[int, list[str]] | None:
    """The size of ``msg``'s own fields before its first auth tag (a field of type ``tag8``)
    and their names; None when it has no such tag or a field before it has no fixed size."""
    size, names = 0, list[str]()
    for f in msg.get("fields") or []:
        if not isinstance(f, dict):
            continue
        if f.get("type") == "tag8":
            return size, names
        if not isinstance(f.get("size"), int):
            return None
        size, names = size + f["size"], [*names, str(f.get("name"))]
    return None


def _once_parts(msg: Mapping[str, Any]) -> tuple[int, list[str]] | None:
    """The size of the fields of ``msg``'s parts sent once (``repeat: once``) and those parts'
    names; None when it has no such part or a field of one has no fixed size."""
    size, names = 0, list[str]()
    for part in msg.get("parts") or []:
        if not isinstance(part, dict) or part.get("repeat") != "once":
            continue
        for f in part.get("fields") or []:
            if not isinstance(f, dict) or not isinstance(f.get("size"), int):
                return None
            size += f["size"]
        names.append(str(part.get("name")))
    return (size, names) if names else None


#: the size constants of ``wire.yaml`` derived from a message's field table other than a
#: struct's length (``STRUCT_LEN``, :func:`check_layout_lengths`): constant -> (message, the
#: layout in words, how its size and the names of what it sums are found). Declared here
#: only; :func:`check_layout_lengths` refuses a constant of another value.
DERIVED_SIZES: Final = {
    "MUX_AUTH_COVERED_HEADER_LEN": ("mux_record", "the fields of message mux_record before "
                                    "its auth tag", _before_tag),
    "ROUND_FRAME_FIXED_OVERHEAD": ("round_frame", "the parts of message round_frame sent "
                                   "once", _once_parts),
}


def check_layout_lengths(constants: Mapping[str, int], messages: Mapping[str, Any]) -> None:
    """Refuse (:class:`ShapeError`) a length constant that is not the size of the layout it
    names, and a message's ``size`` that is not the size of its fields. A constant
    ``STRUCT_LEN`` (``HANDSHAKE_LEN``, ``HANDSHAKE_ACK_LEN``, ``CHANNEL_MAGIC_LEN``,
    ``LEN_PREFIX_LEN``, ``MUX_HEADER_LEN``, ``ROUND_FRAME_HEADER_LEN``, ``AUTH_TAG_LEN``) is
    the length of the struct ``STRUCT`` a message or a part names (:func:`struct_layouts`):
    the codec reads and writes that many bytes for it, and the docs give both, so
    ``HANDSHAKE_LEN: 0`` beside a 16-byte handshake table was loaded and documented. A
    constant of :data:`DERIVED_SIZES` is the size it derives from its message's table:
    ``MUX_AUTH_COVERED_HEADER_LEN``, the mux record's fields before its tag (17), and
    ``ROUND_FRAME_FIXED_OVERHEAD``, the RoundFrame's parts sent once (25), which the codec
    reads and writes by and the docs gave beside tables of other sums.

    Raises:
        ShapeError: one line naming the constant, its value and the layout's size:
            ``wire.yaml: constant HANDSHAKE_LEN is 0, but its layout, message handshake
            (struct HANDSHAKE), is 16 bytes``; ``wire.yaml: constant
            ROUND_FRAME_FIXED_OVERHEAD is 26, but its layout, the parts of message round_frame
            sent once (header, kind, weight, footer), is 25 bytes``; ``wire.yaml: message
            handshake: size 15 is not the size of its fields (16)``.
    """
    for struct, what, size in struct_layouts(messages):
        value = constants.get(f"{struct}_LEN")
        if value is not None and value != size:
            raise ShapeError(f"wire.yaml: constant {struct}_LEN is {value}, but its layout, "
                             f"{what} (struct {struct}), is {size} bytes")
    for name, (mname, what, derive) in DERIVED_SIZES.items():
        msg, value = messages.get(mname), constants.get(name)
        found = derive(msg) if isinstance(msg, Mapping) and value is not None else None
        if found is not None and value != found[0]:
            raise ShapeError(f"wire.yaml: constant {name} is {value}, but its layout, {what} "
                             f"({', '.join(found[1])}), is {found[0]} bytes")
    for mname, msg in messages.items():
        fields = msg.get("fields")
        if not isinstance(msg.get("size"), int) or not isinstance(fields, list):
            continue
        sizes = [f.get("size") for f in fields if isinstance(f, dict)]
        total = sum(s for s in sizes if isinstance(s, int))
        if len(sizes) == len(fields) and all(isinstance(s, int) for s in sizes) \
                and total != msg["size"]:
            raise ShapeError(f"wire.yaml: message {mname}: size {msg['size']} is not the size "
                             f"of its fields ({total})")


def _variable_size(msg: Mapping[str, Any]) -> bool:
    """Whether message ``msg`` has a field of no fixed size (:func:`message_fields`: a size
    another field gives, a bincode variant's field): a payload of a variable length."""
    return any(not isinstance(f.get("size"), int) for f in message_fields(msg))


def _bincode(msg: Mapping[str, Any]) -> bool:
    """Whether message ``msg`` has bincode ``variants``, whose index, integers and lengths are
    varints."""
    return any(isinstance(v, dict) for v in msg.get("variants") or [])


#: the words a leniency's ``field`` (``wire.yaml`` ``leniencies``) may give beside its
#: message's field names, for a leniency of no one field, each with what its message must
#: have for it to mean something, read from the message's field tables: ``payload``, the
#: message's bytes as a whole (bytes after a complete one: ``bincode_trailing``), for a
#: message with a field of a variable size; ``varint``, any varint of a bincode message
#: (``noncanonical_varint``), for a message with bincode variants. Declared here only: the
#: loader refuses any other word, and a word for a message without what it needs
#: (:func:`check_leniency_fields`).
LENIENCY_WORDS: Final = {
    "payload": (_variable_size, "field of a variable size"),
    "varint": (_bincode, "bincode variants"),
}


def check_leniency_fields(leniencies: Sequence[Mapping[str, Any]],
                          messages: Mapping[str, Any]) -> None:
    """Refuse (:class:`ShapeError`) a leniency whose ``field`` is neither a field of its
    message (:func:`message_fields`: its fields, its parts' and its variants') nor one of
    :data:`LENIENCY_WORDS` that means something for that message (``payload`` for a message
    with a field of a variable size, ``varint`` for one with bincode variants): the docs
    documented ``dtyp`` as written, and the dissector's "lenient" mark of the field it meant
    was lost; ``payload`` of a handshake (16 bytes, all fixed) was documented as well.
    Leniencies naming a message the file lacks are left to the caller.

    Raises:
        ShapeError: one line naming the leniency, the field and the known names:
            ``wire.yaml: leniencies[0] (dtype_any): field 'dtyp' is not a field of message
            round_frame (known: magic, num_tensors, ...; or, for no one field, payload)``;
            ``wire.yaml: leniencies[3] (rank_beyond_world): field 'payload' means nothing for
            message handshake, which has no field of a variable size (known: magic, version,
            rank, world_size)``.
    """
    for i, entry in enumerate(leniencies):
        msg = messages.get(entry["message"])
        if not isinstance(msg, Mapping):
            continue
        names = list(dict.fromkeys(str(f.get("name")) for f in message_fields(msg)))
        field = entry["field"]
        if field in names:
            continue
        words = [w for w, (means, _needs) in LENIENCY_WORDS.items() if means(msg)]
        if field in words:
            continue
        known = f"known: {', '.join(names)}" + (
            f"; or, for no one field, {', '.join(words)}" if words else "")
        where = f"wire.yaml: leniencies[{i}] ({entry['id']}): field {field!r}"
        if field in LENIENCY_WORDS:
            raise ShapeError(f"{where} means nothing for message {entry['message']}, which has "
                             f"no {LENIENCY_WORDS[field][1]} ({known})")
        raise ShapeError(f"{where} is not a field of message {entry['message']} ({known})")

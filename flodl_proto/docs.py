"""Generate the protocol reference (``docs/protocol.md``) from the spec alone.

Everything in the generated Markdown comes from ``spec/wire.yaml`` and ``spec/lifecycle.yaml``
(through :data:`flodl_proto.spec.SPEC`): topology and legs, one section per message with a field
table and an RFC-style byte diagram, auth tag coverage, worked examples, constants, enumerations,
timeouts and limits, end-of-stream rules, leniencies, version differences, departures, the
controller lifecycle (a mermaid ``stateDiagram-v2`` rendered here, plus a transitions table) and
the error catalogue. The output is deterministic: no dates, versions, hostnames or file system
paths, and every mapping is rendered in the order the spec writes it, so regenerating the file
from an unchanged spec reproduces it byte for byte.

>>> from flodl_proto.docs import byte_diagram, DiagramItem
>>> print("\\n".join(byte_diagram([DiagramItem("magic", 4)])[2:5]))
+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
|                             magic                             |
+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Upstream: the layouts documented are those of ``flodl/src/distributed/controller/mod.rs``,
``controller/round_frame.rs``, ``relay/mux.rs`` and ``wire.rs`` (fab2s/floDl), as the spec
records them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._docs_lifecycle import _render_lifecycle, mermaid_state_diagram
from ._markdown import (
    DiagramItem,
    _anchor,
    _code,
    _hex_bytes_le,
    _human_bytes,
    _table,
    _text,
    byte_diagram,
)
from .spec import SPEC, Spec, SpecError, lifecycle_machines

__all__ = [
    "DEFAULT_OUT",
    "DiagramItem",
    "byte_diagram",
    "lifecycle_machines",
    "mermaid_state_diagram",
    "render_protocol_doc",
    "render_semantics",
    "write_protocol_doc",
]

#: where ``flodl-proto docs`` writes by default (relative to the working directory)
DEFAULT_OUT = Path("docs/protocol.md")

_MESSAGES_SECTION = 3  # Overview, Conventions, Messages
_VERSIONS_SENTINEL = "\0versions-anchor\0"


# -------------------------------------------------------------------------------------------------
# Message layouts
# -------------------------------------------------------------------------------------------------
_REPEAT_TIMES = re.compile(r"^(\w+) times\b")


def _type_size(spec: Spec, type_name: str) -> int | None:
    t = spec.raw.get("types", {}).get(type_name)
    if isinstance(t, dict) and isinstance(t.get("size"), int):
        return int(t["size"])
    return None


def _constraint(spec: Spec, f: Mapping[str, Any]) -> str:
    parts: list[str] = []
    if "const" in f:
        name = str(f["const"])
        value = spec.constants.get(name)
        if value is not None and f.get("type") == "u32" and value > 0xFFFF:
            parts.append(f"= `{name}` (`0x{value:08X}`, bytes `{_hex_bytes_le(value, 4)}`)")
        else:
            parts.append(f"= `{name}` ({value})")
    if "enum" in f:
        enum = spec.raw.get("enums", {}).get(str(f["enum"]), {})
        vals = enum.get("values", {}) if isinstance(enum, dict) else {}
        listed = ", ".join(f"{k} = {_enum_code(v)}" for k, v in vals.items())
        parts.append(f"enum [{f['enum']}](#{_anchor('enum ' + str(f['enum']))}): {listed}")
    if "condition" in f:
        parts.append(_text(f["condition"]))
    return "; ".join(parts)


def _enum_code(v: Any) -> str:
    code = v.get("code") if isinstance(v, dict) else v
    if isinstance(code, int) and code > 0xFF:
        return f"0x{code:08X}"
    if isinstance(code, int) and code > 9:
        return f"0x{code:02X}"
    return str(code)


@dataclass(slots=True)
class _FieldRow:
    offset: str
    size: str
    type: str
    name: str
    repeat: str
    doc: str
    constraint: str


def _fmt_off(base: str | None, const: int, terms: Sequence[str]) -> str:
    out = base or ""
    if const or not out:
        out = f"{out}+{const}" if out else str(const)
    for t in terms:
        out = f"{out}+{t}"
    return out


def _message_rows(
    spec: Spec, msg: Mapping[str, Any]
) -> tuple[list[_FieldRow], list[tuple[str, list[DiagramItem]]], list[str]]:
    """Field rows, diagram groups (title, items) and legend lines of one message."""
    rows: list[_FieldRow] = []
    groups: list[tuple[str, list[DiagramItem]]] = []
    legend: list[str] = []
    parts = msg.get("parts")
    if parts is None:
        parts = [{"name": "", "repeat": "once", "fields": msg.get("fields", [])}]
    base: str | None = None
    const = 0
    terms: list[str] = []
    after_repeat = False
    # size of the trailing once-parts after the repeated ones (offsets from the end)
    trailing: list[Mapping[str, Any]] = []
    for p in reversed(parts):
        if p.get("repeat", "once") != "once":
            break
        trailing.insert(0, p)
    if len(trailing) == len(parts):
        trailing = []
    tail_size = sum(
        int(f.get("size", 0)) for p in trailing for f in p.get("fields", [])
        if isinstance(f.get("size"), int)
    )
    group_title = ""
    group_items: list[DiagramItem] = []
    group_kind = ""

    def close_group() -> None:
        nonlocal group_items
        if group_items:
            groups.append((group_title, group_items))
        group_items = []

    for p in parts:
        repeat = str(p.get("repeat", "once"))
        kind = "once" if repeat == "once" else "repeat"
        if kind == "repeat" and base is None and not after_repeat:
            close_group()
            base = "T"
            unit = repeat.split("per ", 1)[-1] if "per " in repeat else "entry"
            legend.append(f"`T` is the offset where a {unit}'s entry starts (the first at "
                          f"{const}); entries follow each other.")
            const, terms = 0, []
            group_title = f"each {unit} entry (offsets relative to `T`)"
            group_kind = "repeat"
        elif kind == "once" and base is not None:
            close_group()
            base, after_repeat = "L", True
            const, terms = -tail_size, []
            legend.append("`L` is the message's wire length.")
            group_title = "after the last entry (offsets relative to `L`)"
            group_kind = "tail"
        elif not group_kind:
            group_title = "fixed part" if msg.get("parts") else ""
            group_kind = "once"
        m = _REPEAT_TIMES.match(repeat)
        count = m.group(1) if m else None
        for f in p.get("fields", []):
            size = f.get("size")
            if count is not None and isinstance(size, int):
                off = _fmt_off(base, const, [*terms, f"{size}·i"])
                size_s = f"{size} each"
                item = DiagramItem(f"{f['name']} ({f.get('type')}) x {count}", None)
            elif isinstance(size, int):
                if base is None and "offset" in f:
                    const = int(f["offset"])
                off = _fmt_off(base, const, terms)
                size_s = str(size)
                item = DiagramItem(str(f["name"]), size)
            else:
                off = _fmt_off(base, const, terms)
                size_s = str(size)
                item = DiagramItem(f"{f['name']} ({size} bytes)", None)
            if base == "L":
                off = f"L{const}" if const else "L"
            rows.append(_FieldRow(
                off, size_s, str(f.get("type", "")), str(f["name"]),
                "" if repeat == "once" else repeat,
                _text(f.get("doc", "")), _constraint(spec, f),
            ))
            group_items.append(item)
            if count is not None and isinstance(size, int):
                terms.append(f"{size}·{count}")
            elif isinstance(size, int):
                const += size
            else:
                terms.append(str(size))
    close_group()
    return rows, groups, legend


def _render_message(spec: Spec, name: str, msg: Mapping[str, Any], number: str) -> list[str]:
    title = str(msg.get("title", name))
    out = [f"### {number} {title} (`{name}`)", ""]
    meta = [
        ("leg", _text(msg.get("leg"))),
        ("direction", _text(msg.get("direction"))),
        ("size", f"{msg['size']} bytes" if "size" in msg else "variable"),
        ("auth tag", _text(msg.get("auth"))),
        ("upstream", _code(msg["source"]) if msg.get("source") else ""),
    ]
    out += _table(["property", "value"], [(k, v) for k, v in meta if v])
    out.append("")
    if msg.get("doc"):
        out += [_text(msg["doc"]).replace("\\|", "|"), ""]
    if "fields" in msg or "parts" in msg:
        rows, groups, legend = _message_rows(spec, msg)
        has_repeat = any(r.repeat for r in rows)
        header = ["offset", "size", "type", "field"]
        if has_repeat:
            header.append("repeat")
        header += ["meaning", "constraints"]
        table_rows = []
        for r in rows:
            cells = [f"`{r.offset}`", r.size, f"`{r.type}`", f"**{r.name}**"]
            if has_repeat:
                cells.append(_text(r.repeat))
            cells += [r.doc, r.constraint]
            table_rows.append(cells)
        out += _table(header, table_rows)
        out.append("")
        for line in legend:
            out += [line, ""]
        for gtitle, items in groups:
            if gtitle:
                out += [f"Byte diagram, {gtitle}:", ""]
            else:
                out += ["Byte diagram:", ""]
            out += ["```text", *byte_diagram(items), "```", ""]
    if "kinds" in msg:
        out += ["Payload by record kind:", ""]
        kinds = msg["kinds"]
        codes = spec.enum("RecordKind") if "RecordKind" in spec.raw.get("enums", {}) else {}
        out += _table(
            ["kind", "code", "payload", "on the data channel"],
            [(f"`{k}`", _enum_code(codes.get(k, "")), _text(v.get("payload")),
              _text(v.get("on_data_channel"))) for k, v in kinds.items()],
        )
        out.append("")
    if "encoding" in msg:
        enc = msg["encoding"]
        out += [f"Encoding: **{_text(enc.get('name'))}**.", ""]
        for rule in enc.get("rules", []):
            out.append(f"- {_text(rule)}")
        out.append("")
        if "markers" in enc:  # marker byte, then the width it announces
            markers = dict(enc["markers"])
            single = markers.pop("single_byte_max", None)
            marker_rows: list[tuple[str, str]] = [] if single is None else [
                (f"none: a value up to {single} is its own single byte", "nothing")]
            marker_rows += [(f"`{_enum_code(v)}`", f"the value as a `{k}`, little-endian")
                            for k, v in markers.items()]
            out += _table(["marker byte", "followed by"], marker_rows)
            out.append("")
    if "variants" in msg:
        vrows = []
        for v in msg["variants"]:
            fields = v.get("fields", [])
            fdesc = "; ".join(
                f"`{f['name']}`: `{f['type']}`"
                + (f" (versions {', '.join(str(x) for x in f['versions'])})"
                   if "versions" in f else "")
                + (f": {_text(f['doc'])}" if f.get("doc") else "")
                for f in fields
            ) or "none"
            vrows.append((f"**{v['name']}**", str(v.get("index", "")), fdesc))
        out += _table(["variant", "index", "fields, in order"], vrows)
        out.append("")
        erows = []
        for v in msg["variants"]:
            for ver, ex in (v.get("example") or {}).items():
                erows.append((_text(ver), _code(ex.get("value", "")), _code(ex.get("bytes", ""))))
        if erows:
            out += ["Examples:", ""]
            out += _table(["version", "value", "bincode bytes"], erows)
            out.append("")
    return out


# -------------------------------------------------------------------------------------------------
# The whole document
# -------------------------------------------------------------------------------------------------
def _load_lifecycle(spec: Spec) -> Mapping[str, Any] | None:
    try:
        return spec.lifecycle()
    except SpecError:
        return None


@dataclass(frozen=True, slots=True)
class _DocInput:
    """What every section renders from: the spec, its raw document, the parsed lifecycle."""

    spec: Spec
    raw: Mapping[str, Any]
    lifecycle: Mapping[str, Any] | None

    @property
    def topology(self) -> Mapping[str, Any]:
        return self.raw.get("topology", {})  # type: ignore[no-any-return]


def _head(raw: Mapping[str, Any]) -> list[str]:
    """The title, the generated-file note and the upstream line."""
    title = str(raw.get("title", "protocol"))
    head = [
        f"# {title}: protocol reference",
        "",
        "<!-- Generated by `flodl-proto docs` from spec/wire.yaml and spec/lifecycle.yaml. "
        "Do not edit: change the spec and regenerate. -->",
        "",
    ]
    up = raw.get("upstream", {})
    if up:
        head += [
            f"Upstream: `{up.get('repository', '')}` (mirror `{up.get('mirror', '')}`); "
            f"every `source` below is relative to `{up.get('base_path', '')}/` unless it starts "
            "with `flodl/`.",
            "",
        ]
    return head


def _overview(d: _DocInput, number: int) -> list[str]:
    """Topology, roles, each leg's sequence, the protocol versions."""
    raw, topo = d.raw, d.topology
    body: list[str] = []
    if topo.get("doc"):
        body += [_text(topo["doc"]), ""]
    if topo.get("diagram"):
        body += ["```text", *str(topo["diagram"]).rstrip("\n").split("\n"), "```", ""]
    if topo.get("roles"):
        body += _table(["role", "what it does", "upstream"],
                       [(f"**{r['name']}**", _text(r.get("doc")), _code(r.get("source", "")))
                        for r in topo["roles"]])
        body.append("")
    for leg in topo.get("legs", []):
        body += [f"### Leg `{leg['name']}`: {_text(leg.get('between'))}", ""]
        body += [f"Transport: {_text(leg.get('transport'))}.", ""]
        msgs = ", ".join(f"[`{m}`](#{_anchor(_msg_heading(raw, m))})"
                         for m in leg.get("messages", []))
        if msgs:
            body += [f"Messages: {msgs}.", ""]
        for i, step in enumerate(leg.get("sequence", []), 1):
            body.append(f"{i}. {_text(step)}")
        body += ["", f"Upstream: {_code(leg.get('source', ''))}.", ""]
    versions = raw.get("versions", {})
    if versions:
        body += ["### Protocol versions", ""]
        body += _table(
            ["version", "what it is", "default"],
            [(str(v), _text(versions.get("notes", {}).get(v, "")),
              "yes" if v == versions.get("default") else "")
             for v in versions.get("supported", [])],
        )
        body += ["", "Section [Versions 2 and 3](#" + _VERSIONS_SENTINEL + ") lists every "
                 "difference.", ""]
    return body


def _conventions(d: _DocInput, number: int) -> list[str]:
    """The conventions list and the wire types."""
    body = [f"- {_text(c)}" for c in d.topology.get("conventions", [])]
    body.append("")
    body += ["Wire types:", ""]
    body += _table(["type", "size", "meaning"],
                   [(f"`{k}`", _text(v.get("size") if v.get("size") is not None else "variable"),
                     _text(v.get("doc"))) for k, v in d.raw.get("types", {}).items()])
    body.append("")
    return body


def _messages(d: _DocInput, number: int) -> list[str]:
    """One subsection per message: layout table, byte diagram, checks."""
    if number != _MESSAGES_SECTION:  # pragma: no cover - the section order is fixed below
        raise AssertionError(f"the messages section is numbered {number}")
    body: list[str] = []
    for i, (mname, msg) in enumerate(d.raw.get("messages", {}).items(), 1):
        body += _render_message(d.spec, mname, msg, f"{number}.{i}")
    return body


def _auth(d: _DocInput, number: int) -> list[str]:
    """The MAC algorithm and what each tag covers."""
    raw = d.raw
    msgs = raw.get("messages", {})
    auth = raw.get("auth", {})
    body = [f"Algorithm: {_text(auth.get('algorithm'))}.", ""]
    if auth.get("printed_as"):
        body += [f"In error messages a tag is printed as {_text(auth['printed_as'])}.", ""]
    body += _table(["message", "the tag covers"],
                   [(f"[`{k}`](#{_anchor(_msg_heading(raw, k))})"
                     if k in msgs else f"`{k}`", _text(v))
                    for k, v in auth.get("coverage", {}).items()])
    body.append("")
    body += [f"- {_text(x)}" for x in auth.get("notes", [])]
    body.append("")
    return body


def _examples(d: _DocInput, number: int) -> list[str]:
    """The worked examples, byte by byte."""
    body: list[str] = []
    tag_len = d.spec.constants.get("AUTH_TAG_LEN")
    for i, (ename, ex) in enumerate(d.raw.get("examples", {}).items(), 1):
        body += _render_example(d.raw, ename, ex, f"{number}.{i}", tag_len)
    return body


def _constants(d: _DocInput, number: int) -> list[str]:
    """Every constant with its value, type, meaning and upstream source."""
    body = _table(["name", "value", "type", "meaning", "upstream"],
                  [(f"`{k}`", _const_value(v), _text(v.get("type")), _text(v.get("doc")),
                    _code(v.get("source", ""))) for k, v in d.raw.get("constants", {}).items()])
    body.append("")
    return body


def _enums(d: _DocInput, number: int) -> list[str]:
    """One table per enumeration."""
    body: list[str] = []
    for ename, enum in d.raw.get("enums", {}).items():
        body += [f"### Enum {ename}", ""]
        if enum.get("doc"):
            body += [f"{_text(enum['doc'])} (upstream {_code(enum.get('source', ''))}).", ""]
        keys: list[str] = []
        for v in enum.get("values", {}).values():
            for k, kv in v.items():
                if k not in ("code", "doc") and k not in keys and kv is not None:
                    keys.append(k)
        body += _table(["member", "code", *keys, "meaning"],
                       [(f"`{m}`", f"`{_enum_code(v)}`",
                         *[_text(v.get(k, "")) for k in keys], _text(v.get("doc", "")))
                        for m, v in enum.get("values", {}).items()])
        body.append("")
    return body


def _timeouts_and_limits(d: _DocInput, number: int) -> list[str]:
    """The count and byte limits, then every timeout."""
    raw = d.raw
    body = ["### Limits", ""]
    body += _table(["name", "value", "meaning"],
                   [(f"`{k}`", _const_value(v), _text(v.get("doc")))
                    for k, v in raw.get("constants", {}).items()
                    if v.get("type") in ("count", "bytes")])
    body += ["", "### Timeouts", ""]
    trows = []
    for k, v in raw.get("timeouts", {}).items():
        if "env" in v:
            value = (f"env `{v['env']}`, default {v.get('default')}, minimum {v.get('minimum')}, "
                     f"maximum {v.get('maximum')}")
            scaled = ""
        elif "option" in v:
            value = f"off unless `{v['option']}`"
            scaled = "yes" if v.get("scaled") else "no"
        else:
            value = f"{_seconds(v.get('seconds'))}"
            if "attempts" in v:
                value += f" x {v['attempts']} attempts"
            scaled = "yes" if v.get("scaled") else "no"
        trows.append((f"`{k}`", value, scaled, _text(v.get("doc")), _code(v.get("source", ""))))
    body += _table(["name", "value", "scaled", "meaning", "upstream"], trows)
    body += ["", "`scaled` durations are multiplied by the net timeout scale "
             "(`ENV_NET_TIMEOUT_SCALE`).", ""]
    return body


def _end_of_stream(d: _DocInput, number: int) -> list[str]:
    """Where running out of input is a clean end of stream."""
    body = ["Where running out of input is a clean end of stream (no record, no error):", ""]
    body += _table(["where", "rule", "upstream"],
                   [(f"`{e.get('where')}`", _text(e.get("rule")), _code(e.get("source", ""))
                     if e.get("source") else "") for e in d.raw.get("end_of_stream", [])])
    body.append("")
    return body


def _leniencies(d: _DocInput, number: int) -> list[str]:
    """Values readers accept, as upstream's do, and where they are checked later."""
    body = ["Readers accept these values, as upstream's do; the value is checked later, where "
            "named.", ""]
    body += _table(["id", "where", "rule", "checked at"],
                   [(f"`{x.get('id')}`", f"`{x.get('message')}.{x.get('field')}`",
                     _text(x.get("rule")), _text(x.get("checked_at")))
                    for x in d.raw.get("leniencies", [])])
    body.append("")
    return body


def _versions(d: _DocInput, number: int) -> list[str]:
    """Every difference between protocol versions 2 and 3."""
    body = ["Everything not listed is identical in both versions.", ""]
    body += _table(["aspect", "version 2", "version 3"],
                   [(_text(x.get("aspect")), _text(x.get("v2")), _text(x.get("v3")))
                    for x in d.raw.get("version_differences", [])])
    body.append("")
    return body


def _departures(d: _DocInput, number: int) -> list[str]:
    """Where this implementation deliberately differs from upstream."""
    body = ["Where this implementation deliberately differs from upstream (the wire bytes and "
            "the error kinds stay the same):", ""]
    body += _table(["id", "flodl-proto", "upstream"],
                   [(f"`{x.get('id')}`", _text(x.get("ours")), _text(x.get("upstream")))
                    for x in d.raw.get("departures", [])])
    body.append("")
    return body


def _lifecycle(d: _DocInput, number: int) -> list[str]:
    """The lifecycle diagrams and transition tables (without their own section heading)."""
    return _render_lifecycle(d.lifecycle, number)[2:]


def _errors(d: _DocInput, number: int) -> list[str]:
    """The error catalogue, one table per id prefix."""
    body = ["Every error has a kind (the coarse category of the golden vectors) and a side: "
            "`remote` when the peer's bytes are at fault, `local` when the caller misused the "
            "API. Messages are Python `str.format` templates, with one addition: a noun written "
            "`word(s)` reads `word` after a field written `1` and `words` after any other "
            "value (`1 more byte needed`, `2 more bytes needed`, `1.0 bytes`); the text before "
            "the first field is upstream's wording.", ""]
    groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for eid, e in d.raw.get("errors", {}).items():
        groups.setdefault(eid.split(".", 1)[0], []).append((eid, e))
    for g, entries in groups.items():
        body += [f"### Errors `{g}.*`", ""]
        body += _table(["id", "kind", "side", "message template", "upstream"],
                       [(f"`{eid}`", _text(e.get("kind")), _text(e.get("side")),
                         _code(e.get("template", "")), _code(e.get("source", "")))
                        for eid, e in entries])
        body.append("")
    return body


def _semantics(d: _DocInput, number: int) -> list[str]:
    """The round semantics (fold, reduce, scatter)."""
    return render_semantics(d.raw, number)


_VERSIONS_TITLE = "Versions 2 and 3"

#: the document's sections in order: title, renderer of the body (given the section number)
_SECTIONS: tuple[tuple[str, Callable[[_DocInput, int], list[str]]], ...] = (
    ("Overview", _overview),
    ("Conventions", _conventions),
    ("Messages", _messages),
    ("Authentication tags", _auth),
    ("Worked examples", _examples),
    ("Constants", _constants),
    ("Enumerations", _enums),
    ("Timeouts and limits", _timeouts_and_limits),
    ("End of stream", _end_of_stream),
    ("Leniencies", _leniencies),
    (_VERSIONS_TITLE, _versions),
    ("Departures from upstream", _departures),
    ("Lifecycle", _lifecycle),
    ("Error catalogue", _errors),
    ("Round semantics", _semantics),
)


def render_protocol_doc(spec: Spec = SPEC, lifecycle: Mapping[str, Any] | None = None,
                        *, load_lifecycle: bool = True) -> str:
    """Render the protocol reference as Markdown.

    Args:
        spec: the loaded wire spec (default: the packaged one).
        lifecycle: a parsed ``lifecycle.yaml``; when ``None`` and ``load_lifecycle`` is set it is
            read from the spec directory (a missing file renders a note instead of the diagram).
        load_lifecycle: read ``lifecycle.yaml`` when ``lifecycle`` is not given.

    Returns:
        The whole document, ending with one newline. Depends on the spec only.

    Upstream: documents the behaviour of ``flodl/src/distributed/`` as the spec records it.
    """
    if lifecycle is None and load_lifecycle:
        lifecycle = _load_lifecycle(spec)
    d = _DocInput(spec, spec.raw, lifecycle)
    sections = [(f"{n}. {title}", render(d, n))
                for n, (title, render) in enumerate(_SECTIONS, 1)]
    versions_anchor = next(_anchor(t) for t, _ in sections if t.endswith(f". {_VERSIONS_TITLE}"))
    out = _head(d.raw)
    out += ["## Contents", ""]
    for stitle, _ in sections:
        out.append(f"- [{stitle}](#{_anchor(stitle)})")
    out.append("")
    for stitle, sbody in sections:
        out += [f"## {stitle}", ""]
        out += [line.replace(_VERSIONS_SENTINEL, versions_anchor) for line in sbody]
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
    return text


def render_semantics(raw: Mapping[str, Any], number: int) -> list[str]:
    """Render the ``semantics`` section of the spec: one subsection per entry (its paragraph,
    its rules as a numbered list, a worked example when it has one, the upstream source).

    Args:
        raw: the parsed ``wire.yaml``.
        number: the section's number (subsections are ``number.k``).

    Returns:
        The section's body lines (no section heading). Subsection headings end with the entry's
        id in backticks, which the conformance catalogue's ``semantics:<id>`` keys name.

    No upstream counterpart: upstream ships no generated protocol document; the semantics are those
    of ``controller/mod.rs``, ``controller/round_frame.rs``, ``relay/agent.rs`` and
    ``cpu_reduce.rs``, as the spec records them.
    """
    body = ["The computation and the rules behind a round, as the conformance kit checks them "
            "(see [conformance.md](conformance.md)). With these and the layouts above, a "
            "consensus can be reproduced byte for byte.", ""]
    for k, (sid, entry) in enumerate(raw.get("semantics", {}).items(), 1):
        body += [f"### {number}.{k} {entry.get('title', sid)} (`{sid}`)", ""]
        if entry.get("doc"):
            body += [_text(entry["doc"]), ""]
        body += [f"{i}. {_text(rule)}" for i, rule in enumerate(entry.get("rules", []), 1)]
        body.append("")
        ex = entry.get("example")
        if ex:
            body += [f"Worked example ({_text(ex.get('title', ''))}):", ""]
            for i, fr in enumerate(ex.get("frames", [])):
                vals = ", ".join(repr(float(v)) for v in fr["values"])
                body.append(f"- frame {i} (connection order): weight {float(fr['weight'])!r}, "
                            f"f32 payload [{vals}]")
            sums = ", ".join(repr(float(v)) for v in ex.get("sum", []))
            body += [
                f"- f32 sum from +0.0 in that order: [{sums}], bytes `{ex.get('sum_hex', '')}`",
                f"- summed mass W = {float(ex.get('weight', 0))!r}; inv = f32(1.0 / W), bytes "
                f"`{ex.get('inv_hex', '')}`",
                f"- consensus = sum x inv in f32, payload bytes `{ex.get('consensus_hex', '')}`, "
                f"weight {float(ex.get('weight', 0))!r}",
                "",
            ]
        if entry.get("source"):
            body += [f"Upstream: {_code(entry['source'])}.", ""]
    return body


def _msg_heading(raw: Mapping[str, Any], name: str) -> str:
    msgs = list(raw.get("messages", {}))
    msg = raw.get("messages", {}).get(name, {})
    idx = msgs.index(name) + 1 if name in msgs else 0
    return f"{_MESSAGES_SECTION}.{idx} {msg.get('title', name)} ({name})"


def _seconds(v: Any) -> str:
    x = float(v)
    if x < 1:
        return f"{round(x * 1000)} ms"
    return f"{x:g} s"


def _const_value(v: Mapping[str, Any]) -> str:
    value = v.get("value")
    t = v.get("type")
    if not isinstance(value, int):
        return _text(value)
    if t == "u32" and value > 0xFFFF:
        return f"`0x{value:08X}` (bytes `{_hex_bytes_le(value, 4)}`)"
    if t == "bytes":
        return f"{value} ({_human_bytes(value)})"
    return str(value)


def _render_example(raw: Mapping[str, Any], name: str, ex: Mapping[str, Any],
                    number: str, tag_len: int | None) -> list[str]:
    """One worked example: its heading and meta line, its steps, its bytes field by field and
    in wire order, then each auth tag as the first ``tag_len`` bytes of the HMAC it shows
    (``tag_len`` is the spec's ``AUTH_TAG_LEN``; without one, the byte count of the tag's own
    field in the example)."""
    out = [f"### {number} {_text(ex.get('title', name))}", ""]
    msg = str(ex.get("message", ""))
    ver = ex.get("version")
    meta = [f"Message [`{msg}`](#{_anchor(_msg_heading(raw, msg))})"]
    meta.append("any protocol version" if ver in (None, "any") else f"protocol version {ver}")
    salt = ex.get("salt")
    meta.append(f"session salt `{salt}`" if salt else "no auth tag")
    if ex.get("vector"):
        meta.append(f"golden vector `{ex['vector']}`")
    out += ["; ".join(meta) + ".", ""]
    if ex.get("doc"):
        out += [_text(ex["doc"]), ""]
    steps = ex.get("steps", [])
    if steps:
        out += ["How to encode it:", ""]
        out += [f"{i}. {_text(s)}" for i, s in enumerate(steps, 1)]
        out.append("")
    rows = []
    offset = 0
    all_bytes: list[str] = []
    for f in ex.get("fields", []):
        bs = str(f.get("bytes", "")).split()
        rows.append((str(offset), str(len(bs)), f"`{' '.join(bs)}`", f"`{f.get('field')}`",
                     _text(f.get("value", ""))))
        offset += len(bs)
        all_bytes += bs
    out += _table(["offset", "size", "bytes", "field", "value"], rows)
    out.append("")
    out += [f"All {len(all_bytes)} bytes, in wire order:", "", "```text"]
    for i in range(0, len(all_bytes), 16):
        out.append(f"{i:04x}  " + " ".join(all_bytes[i:i + 16]))
    out += ["```", ""]
    sizes = {str(f.get("field")): len(str(f.get("bytes", "")).split())
             for f in ex.get("fields", [])}
    for tag in ex.get("tags", []):
        covers = " followed by ".join(
            f"bytes {a} to {int(b) - 1} ({int(b) - int(a)} bytes)" for a, b in tag.get("covers", [])
        )
        first = tag_len if tag_len is not None else sizes.get(str(tag.get("field")), 0)
        out.append(f"- `{tag.get('field')}` = the first {first} bytes of HMAC-SHA256(key = the "
                   f"salt, message = {covers}); the full HMAC is `{tag.get('hmac')}`.")
    if ex.get("tags"):
        out.append("")
    return out


def write_protocol_doc(path: Path | str = DEFAULT_OUT, spec: Spec = SPEC) -> bool:
    """Render the docs and write them to ``path`` (parents created) when they differ.

    Returns:
        True when the file was written (absent or different), False when already current.

    Raises:
        OSError: the file cannot be written.

    No upstream counterpart: upstream ships no generated protocol document.
    """
    p = Path(path)
    text = render_protocol_doc(spec)
    if p.is_file() and p.read_text(encoding="utf-8") == text:
        return False
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8", newline="\n")
    return True

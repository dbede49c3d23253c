"""Generate a Wireshark Lua dissector for the data channel from ``spec/wire.yaml``.

The generated file has two parts:

* a ``SPEC`` table generated here from the spec: constants and limits, enums (codes, names,
  element sizes, directions), every message's field layout (name, filter field, wire type, size,
  the constant or enum it must match), the RoundFrame's parts with their repeat rules, the
  ``RelayControlMsg`` variants with the protocol versions each field exists in, the bincode varint
  markers, the error templates used as expert-info texts, the filter fields and the default ports;
* a fixed runtime (``_dissector_runtime.lua``, shipped with the package) that interprets those
  tables: TCP framing and reassembly, the walk of a layout, the RoundFrame tensor loop, bincode,
  version detection, expert info, columns. It holds no per-field code.

``flodl-proto dissector`` writes the file; :func:`filter_fields` lists the display-filter fields
(``docs/wireshark.md`` carries them as a table, checked by a test to be current).

Upstream: the layouts of ``flodl/src/distributed/relay/mux.rs``, ``controller/round_frame.rs``,
``controller/mod.rs`` and ``wire.rs`` (repository fab2s/floDl), through ``spec/wire.yaml``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from . import __version__
from .errors import shown
from .spec import SPEC, Spec

__all__ = [
    "PROTO_NAME",
    "FilterField",
    "default_ports",
    "filter_fields",
    "filter_fields_markdown",
    "render_dissector",
]

#: Wireshark protocol name: the display-filter prefix of every field.
PROTO_NAME = "flodl"

# Messages that travel on a TCP stream, in the order the runtime tries their magics.
_STREAM_MESSAGES = ("channel_magic", "handshake", "handshake_ack", "len_framed", "mux_record")
# The record names shown in the protocol column / flodl.kind for non-mux messages.
_ROLE_SHORT = {"rank": "rank", "relay": "relay", "controller": "ctl"}
# What a part's truncation is called in the catalogue when its name differs (header -> kind:
# the reader's first read after the 8-byte header is the kind).
_READ_ALIAS = {"dim": "shape", "header": "kind"}
_VERIFY_HINT = "not verified: check with flodl-proto decode --salt-file PATH"
# Payloads above this many bytes are shown without a field value (the preference's default).
_BYTES_FIELD_LIMIT = 1 << 16
# Catalogue id prefix of each message's errors (handshake_ack -> "ack.bad_magic", ...).
_ERROR_PREFIX = {"handshake_ack": "ack", "mux_record": "mux", "round_frame": "frame",
                 "channel_magic": "channel", "len_framed": "len"}
# How many tensor elements the tree shows for a payload (the "first values").
_PREVIEW_VALUES = 8
# Wire type -> (Wireshark ftype, display base).
_FTYPES: Mapping[str, tuple[str, str | None]] = {
    "u8": ("UINT8", "DEC"),
    "u32": ("UINT32", "DEC"),
    "u64": ("UINT64", "DEC"),
    "f64": ("DOUBLE", None),
    "tag8": ("BYTES", None),
    "bytes": ("BYTES", None),
    "String": ("STRING", None),
    "Vec<u32>": ("UINT32", "DEC"),
    "Vec<[u8; 32]>": ("BYTES", None),
}


@dataclass(frozen=True, slots=True)
class FilterField:
    """One display-filter field of the generated dissector.

    Attributes:
        abbrev: the filter name (``flodl.mux_record.kind``).
        ftype: the Wireshark field type (``UINT32``, ``STRING``, ...).
        base: the display base (``DEC``, ``HEX``) or None.
        enum: the spec enum whose names label the values, or None.
        label: the name shown in the packet tree.
        doc: what the field holds (from the spec, or the runtime's derived fields).

    No upstream counterpart: upstream ships no Wireshark dissector; the fields are the layouts of
    ``relay/mux.rs``, ``controller/round_frame.rs``, ``controller/mod.rs`` and ``wire.rs``.
    """

    abbrev: str
    ftype: str
    base: str | None
    enum: str | None
    label: str
    doc: str


# Fields the runtime derives (not wire fields): abbrev suffix, ftype, base, label, doc.
_DERIVED: tuple[tuple[str, str, str | None, str, str], ...] = (
    ("kind", "STRING", None, "Record",
     "record type: ChannelMagic, Handshake, HandshakeAck, LenFramed, or the mux record kind "
     "(Data, Control, HostFrame, Broadcast); Malformed for bytes that cannot be framed, Header "
     "for a record header cut by its segment's end (no reassembly) or by the capture (its "
     "snaplen), or for bytes out of sync too few to tell whether a record starts at them "
     "(no reassembly)"),
    ("direction", "STRING", None, "Direction",
     "who sends this record (rank→relay, relay→ctl, ...), from the spec or the connection"),
    ("rank", "UINT32", "DEC", "Rank",
     "every rank the record concerns: the handshake's rank, a Data record's rank, the ranks of "
     "a Hello, RankExit or DeclareDead, and for a HostFrame, Broadcast or loopback frame the "
     "ranks the connection's Hello or handshake announced"),
    ("version", "UINT8", "DEC", "Protocol version",
     "data-channel protocol version used to decode the record (preference, or detected from "
     "the handshake, the ack or a Hello's model_sigs)"),
    ("auth_status", "STRING", None, "Auth tag status",
     "always 'not verified': Wireshark cannot compute HMAC-SHA256; use flodl-proto decode with "
     "the session salt"),
    ("continuation", "STRING", None, "Continuation of",
     "the record type whose bytes open this segment: its header was in an earlier segment and "
     "TCP did not reassemble it (reassembly off, or a length above the frame ceiling)"),
    ("skipped", "UINT32", "DEC", "Skipped bytes",
     "bytes that start no record, skipped until a segment starts one: a direction's first "
     "bytes when the capture began inside a record, or the bytes after malformed ones"),
    ("uncaptured", "UINT32", "DEC", "Bytes not captured",
     "bytes of a segment past the end of its packet as captured (a packet longer than the "
     "capture's snaplen): the records they hold are incomplete or not shown"),
    ("control.variant", "UINT32", "DEC", "Variant",
     "RelayControlMsg variant index (bincode u32 varint)"),
    ("round_frame.tensor", "UINT32", "DEC", "Tensor", "tensor index inside the RoundFrame"),
    ("round_frame.shape", "STRING", None, "Shape", "the tensor's dims as [d0, d1, ...]"),
    ("round_frame.numel", "UINT64", "DEC", "Elements",
     "element count: the product of the dims (1 for ndim 0)"),
    ("round_frame.values", "STRING", None, "First values",
     f"the first {_PREVIEW_VALUES} elements of a payload whose dtype is known and whose nbytes "
     "matches the shape, each in the fewest digits that read back as the same f32 or bf16"),
    ("round_frame.elided", "UINT8", "DEC", "Elided",
     "1 when nbytes is 0 while the shape has elements (zero-elision, legal at version 3)"),
    ("round_frame.total_nbytes", "UINT64", "DEC", "Payload bytes", "sum of the tensors' nbytes"),
    ("round_frame.trailing", "UINT32", "DEC", "Trailing bytes",
     "bytes after the RoundFrame inside its record (ignored by the reader)"),
)

# Expert infos: id, group, severity, text (a spec error id's template or plain text).
_EXPERTS: tuple[tuple[str, str, str, str], ...] = (
    ("bad_magic", "MALFORMED", "ERROR", "bad magic"),
    ("too_large", "MALFORMED", "ERROR", "length above the frame ceiling or a limit"),
    ("truncated", "MALFORMED", "ERROR", "truncated record"),
    ("nbytes_shape", "MALFORMED", "WARN", "nbytes disagrees with the shape"),
    ("bad_value", "MALFORMED", "ERROR", "invalid field value"),
    ("lenient", "PROTOCOL", "WARN", "accepted by the reader, rejected later (at the fold)"),
    ("version", "PROTOCOL", "WARN", "protocol version"),
    ("trailing", "PROTOCOL", "NOTE", "bytes after a complete message"),
    ("continued", "REASSEMBLE", "NOTE", "record continues in the next segments (not reassembled)"),
    ("no_record_start", "SEQUENCE", "WARN",
     "no record starts here (the capture began inside a record?)"),
    ("snaplen", "UNDECODED", "WARN",
     "packet cut by the capture (snaplen): records incomplete; capture with -s 0"),
)
# Spec error ids whose templates become expert texts.
_ERROR_IDS = (
    "handshake.read_failed", "ack.read_failed", "channel.read_failed", "handshake.bad_magic",
    "ack.bad_magic", "handshake.bad_version",
    "ack.bad_version", "channel.bad_magic", "frame.bad_magic", "frame.too_many_tensors",
    "frame.kind_read_failed", "frame.unknown_kind", "frame.weight_read_failed", "frame.bad_weight",
    "frame.meta_read_failed", "frame.shape_read_failed", "frame.nbytes_read_failed",
    "frame.past_ceiling", "frame.data_read_failed", "frame.footer_read_failed",
    "tensor.nbytes_vs_shape", "tensor.unknown_dtype", "mux.bad_magic", "mux.bad_version",
    "mux.payload_too_large", "mux.truncated", "mux.unknown_kind", "bincode.unexpected_end",
    "bincode.invalid_variant", "bincode.invalid_utf8", "bincode.invalid_integer_type",
    "len.too_large", "len.body_read_failed",
)


# -------------------------------------------------------------------------------------------------
# Spec -> tables
# -------------------------------------------------------------------------------------------------
def _short_direction(text: str) -> str:
    """``"relay -> controller (first 4 bytes)"`` -> ``"relay→ctl"``; ``<->`` gives ``↔``."""
    head = text.split("(")[0].split(",")[0].strip()
    m = re.fullmatch(r"(\w+)\s*(<->|->)\s*(\w+)", head)
    if not m:
        return ""
    a, arrow, b = m.groups()
    sym = "↔" if arrow == "<->" else "→"
    return f"{_ROLE_SHORT.get(a, a)}{sym}{_ROLE_SHORT.get(b, b)}"


def _camel(name: str) -> str:
    """``HOST_FRAME`` / ``handshake_ack`` -> ``HostFrame`` / ``HandshakeAck``."""
    return "".join(p[:1].upper() + p[1:].lower() for p in name.split("_"))


def _field_size(f: Mapping[str, Any], spec: Spec) -> int | str:
    size = f.get("size")
    if isinstance(size, int):
        return size
    if isinstance(size, str):
        return size  # the name of an earlier field giving the byte count
    return int(spec.raw["types"][f["type"]]["size"])


def _layout(msg: str, fields: Iterable[Mapping[str, Any]], spec: Spec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    fields = list(fields)
    running: int | None = int(fields[0].get("offset", 0)) if fields else 0
    for f in fields:
        entry: dict[str, Any] = {
            "name": f["name"], "abbrev": f"{PROTO_NAME}.{msg}.{f['name']}", "type": f["type"],
            "size": _field_size(f, spec), "label": _label(f["name"]),
        }
        if "offset" in f and running is not None and int(f["offset"]) != running:
            raise ValueError(f"wire.yaml: {msg}.{f['name']} offset {f['offset']} is not "
                             f"contiguous (expected {running})")
        running = running + entry["size"] if isinstance(entry["size"], int) and \
            running is not None else None
        prefix = _ERROR_PREFIX.get(msg, msg)
        if "const" in f:
            entry["const"] = f["const"]
            entry["expert"] = "bad_magic" if f["name"] == "magic" else "bad_value"
            if f"{prefix}.bad_{f['name']}" in spec.errors:
                entry["error"] = f"{prefix}.bad_{f['name']}"
        if "enum" in f:
            entry["enum"] = f["enum"]
            if f"{prefix}.unknown_{f['name']}" in spec.errors:
                entry["enum_error"] = f"{prefix}.unknown_{f['name']}"
            if any(lz.get("message") == msg and lz.get("field") == f["name"]
                   for lz in spec.raw.get("leniencies", [])):
                entry["lenient"] = True  # the reader takes any value: no "malformed" mark
        if f["type"] == "tag8":
            entry["tag"] = True
        out.append(entry)
    return out


def _repeat(text: str) -> dict[str, Any]:
    """Spec repeat rule -> ``{group, times}``: ``once``; ``per tensor``; ``ndim times per
    tensor``."""
    if text == "once":
        return {"group": "once"}
    m = re.fullmatch(r"(?:(\w+) times )?per (\w+)", text)
    if not m:
        raise ValueError(f"wire.yaml: unknown repeat rule {text!r}")
    out: dict[str, Any] = {"group": m.group(2)}
    if m.group(1):
        out["times"] = m.group(1)
    return out


def _bincode_type(t: str) -> dict[str, Any]:
    """A RelayControlMsg field type -> a runtime type descriptor."""
    if t == "String":
        return {"kind": "string"}
    if t in ("u8", "u16", "u32", "u64"):
        return {"kind": "uint", "type": t}
    m = re.fullmatch(r"Vec<(.+)>", t)
    if m:
        return {"kind": "vec", "elem": _bincode_type(m.group(1))}
    m = re.fullmatch(r"\[u8; (\d+)\]", t)
    if m:
        return {"kind": "array", "len": int(m.group(1))}
    raise ValueError(f"wire.yaml: bincode type {t!r} is not understood by the dissector")


def filter_fields(spec: Spec = SPEC) -> list[FilterField]:
    """Every display-filter field of the generated dissector, in tree order.

    Returns:
        The wire fields of each stream message, the RoundFrame's parts and the RelayControlMsg
        variants (``flodl.<message>.<field>``), then the fields the runtime derives.

    Raises:
        ValueError: the spec uses a field type the dissector cannot map.

    No upstream counterpart: upstream ships no Wireshark dissector; the fields are the layouts of
    ``relay/mux.rs``, ``controller/round_frame.rs``, ``controller/mod.rs`` and ``wire.rs``.
    """
    seen: dict[str, FilterField] = {}

    def add(abbrev: str, ftype: str, base: str | None, enum: str | None, label: str,
            doc: str) -> None:
        if abbrev not in seen:
            seen[abbrev] = FilterField(abbrev, ftype, base, enum, label, doc)

    msgs = spec.raw["messages"]
    wire: list[tuple[str, Mapping[str, Any]]] = []
    for m in _STREAM_MESSAGES:
        wire += [(m, f) for f in msgs[m]["fields"]]
    for part in msgs["round_frame"]["parts"]:
        wire += [("round_frame", f) for f in part["fields"]]
    for m, f in wire:
        ftype, base = _FTYPES[f["type"]]
        if f.get("enum") == "Channel" or f["name"] == "magic":
            base = "HEX"
        elif "enum" in f:
            base = "HEX" if f["enum"] == "RecordKind" else "DEC"
        add(f"{PROTO_NAME}.{m}.{f['name']}", ftype, base, f.get("enum"), _label(f["name"]),
            _doc(f.get("doc", "")))
    for var in msgs["relay_control_msg"]["variants"]:
        for f in var["fields"]:
            _bincode_type(f["type"])
            ftype, base = _FTYPES.get(f["type"], ("UINT32", "DEC"))
            add(f"{PROTO_NAME}.relay_control_msg.{f['name']}", ftype, base, None,
                _label(f["name"]), _doc(f.get("doc", "")))
    for suffix, ftype, base, label, doc in _DERIVED:
        abbrev = f"{PROTO_NAME}.{suffix.replace('control.', 'relay_control_msg.')}"
        enum = "ControlVariant" if suffix == "control.variant" else None
        add(abbrev, ftype, base, enum, label, doc)
    return list(seen.values())


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def _doc(text: str) -> str:
    return " ".join(str(text).split())


def default_ports(spec: Spec = SPEC) -> list[int]:
    """The TCP ports registered by default: the controller port and its relay loopback port.

    No upstream counterpart: upstream ships no Wireshark dissector; the ports are upstream's
    defaults (controller port 1337, ``CHANGELOG.md``; relay loopback port + 4, ``relay/mod.rs``).
    """
    port = spec.const("DEFAULT_CONTROLLER_PORT")
    return [port, port + spec.const("RELAY_DATA_LOOPBACK_OFFSET")]


def _tables(spec: Spec, ports: Sequence[int]) -> dict[str, Any]:
    raw = spec.raw
    msgs = raw["messages"]
    enums: dict[str, Any] = {}
    for ename, enum in raw["enums"].items():
        names: dict[int, str] = {}
        extra: dict[str, dict[int, Any]] = {"element_size": {}, "direction": {}}
        for member, v in enum["values"].items():
            code = int(v["code"])
            if ename in ("RecordKind", "RoundKind"):
                names[code] = _camel(member)
            elif ename == "Dtype":
                names[code] = member.lower()
            else:
                names[code] = member
            if "element_size" in v:
                extra["element_size"][code] = int(v["element_size"])
            if "direction" in v:
                extra["direction"][code] = _short_direction(str(v["direction"]))
        entry: dict[str, Any] = {"names": names, "members": {
            int(v["code"]): m for m, v in enum["values"].items()}}
        entry.update({k: d for k, d in extra.items() if d})
        enums[ename] = entry
    layouts = {m: _layout(m, msgs[m]["fields"], spec) for m in _STREAM_MESSAGES}
    records = {m: {"kind": _camel(m), "direction": _short_direction(str(msgs[m]["direction"]))}
               for m in _STREAM_MESSAGES if m != "mux_record"}
    for m, rec in records.items():
        tid = f"{_ERROR_PREFIX.get(m, m)}.read_failed"
        if tid in spec.errors:
            rec["truncated_error"] = tid
    loop = msgs["len_framed"]["direction"].split("(")[0].strip()
    a, _, b = loop.partition("<->")
    records["len_framed"]["rank_to_relay"] = _short_direction(f"{a.strip()} -> {b.strip()}")
    records["len_framed"]["relay_to_rank"] = _short_direction(f"{b.strip()} -> {a.strip()}")
    parts: list[dict[str, Any]] = []
    once_fields: list[str] = []
    for part in msgs["round_frame"]["parts"]:
        entry = {"name": part["name"], **_repeat(str(part["repeat"])),
                 "fields": _layout("round_frame", part["fields"], spec)}
        if entry["group"] == "once":
            once_fields += [f["name"] for f in part["fields"]]
        else:
            count = f"num_{entry['group']}s"
            if count not in once_fields:
                raise ValueError(f"wire.yaml: round_frame part {part['name']} repeats per "
                                 f"{entry['group']} but no earlier field is named {count}")
            entry["count"] = count
        if any(f["type"] == "bytes" for f in part["fields"]):
            entry["data"] = True
        short = part["name"].removeprefix("tensor_")
        for cand in (f"frame.{short}_read_failed", f"frame.{_READ_ALIAS.get(short, short)}"
                     "_read_failed"):
            if cand in spec.errors:
                entry["truncated_error"] = cand
                break
        parts.append(entry)
    variants: dict[int, Any] = {}
    for var in msgs["relay_control_msg"]["variants"]:
        variants[int(var["index"])] = {
            "name": var["name"],
            "direction": _short_direction(
                str(raw["enums"]["ControlVariant"]["values"][var["name"]].get("direction", ""))),
            "fields": [{"name": f["name"],
                        "abbrev": f"{PROTO_NAME}.relay_control_msg.{f['name']}",
                        "type": _bincode_type(f["type"]),
                        "versions": [int(v) for v in f.get("versions", spec.supported_versions)]}
                       for f in var["fields"]],
        }
    errors = {eid: _lua_template(spec.errors[eid].template) for eid in _ERROR_IDS}
    return {
        "proto": {"name": PROTO_NAME, "description": str(raw["title"]),
                  "generator": f"flodl-proto {__version__}", "schema": str(raw["schema"])},
        "const": dict(spec.constants),
        "versions": {"default": spec.default_version,
                     "supported": list(spec.supported_versions)},
        "markers": {k: int(v) for k, v in msgs["relay_control_msg"]["encoding"]["markers"].items()},
        "enums": enums,
        "layouts": layouts,
        "records": records,
        "round_frame": parts,
        "round_frame_count": next(p["count"] for p in parts if "count" in p),
        "verify_hint": _VERIFY_HINT,
        "variants": variants,
        "errors": errors,
        "fields": [{"abbrev": f.abbrev, "ftype": f.ftype, "base": f.base, "enum": f.enum,
                    "label": f.label, "doc": f.doc} for f in filter_fields(spec)],
        "experts": [{"id": i, "abbrev": f"{PROTO_NAME}.expert.{i}", "group": g, "severity": s,
                     "text": t} for i, g, s, t in _EXPERTS],
        "ports": ",".join(str(p) for p in ports),
        "preview_values": _PREVIEW_VALUES,
        "bytes_field_limit": _BYTES_FIELD_LIMIT,
    }


def _lua_template(template: str) -> str:
    """Python ``str.format`` template -> the runtime's ``{name}`` / ``{name:08x}`` subset."""
    return template.replace("!r}", "}")


# -------------------------------------------------------------------------------------------------
# Lua serialisation
# -------------------------------------------------------------------------------------------------
_LUA_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LUA_KEYWORDS = frozenset(
    "and break do else elseif end false for function goto if in local nil not or repeat return "
    "then true until while".split())


def _lua_str(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20:
            out.append(f"\\{ord(ch):03d}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _lua(v: Any, indent: int = 0) -> str:
    pad = "  " * (indent + 1)
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"0x{v:X}" if v > 0xFFFF else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("non-finite float in the spec tables")
        return repr(v)
    if isinstance(v, str):
        return _lua_str(v)
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        items = []
        for k, x in v.items():
            if isinstance(k, str) and _LUA_IDENT.match(k) and k not in _LUA_KEYWORDS:
                key = k
            elif isinstance(k, int):
                key = f"[{k}]"
            else:
                key = f"[{_lua_str(str(k))}]"
            items.append(f"{pad}{key} = {_lua(x, indent + 1)},")
        return "{\n" + "\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(v, list | tuple):
        if not v:
            return "{}"
        simple = all(isinstance(x, int | str) for x in v)
        if simple:
            return "{" + ", ".join(_lua(x) for x in v) + "}"
        return "{\n" + "\n".join(f"{pad}{_lua(x, indent + 1)}," for x in v) + "\n" + \
            "  " * indent + "}"
    raise TypeError(f"cannot write {type(v).__name__} as Lua")


def render_dissector(ports: Sequence[int] | None = None, spec: Spec = SPEC) -> str:
    """Return the Lua source of the Wireshark dissector.

    Args:
        ports: TCP ports registered by default (the ``Ports`` preference); default: the
            controller port and the relay loopback port (:func:`default_ports`).
        spec: the loaded spec.

    Returns:
        The whole dissector as text: a generated ``SPEC`` table and the fixed runtime.

    Raises:
        ValueError: a port outside 1..65535, or a spec construct the dissector cannot map.

    No upstream counterpart: upstream ships no Wireshark dissector; the layouts it decodes are
    those of ``relay/mux.rs``, ``controller/round_frame.rs``, ``controller/mod.rs`` and
    ``wire.rs``.
    """
    chosen = list(ports) if ports else default_ports(spec)
    for p in chosen:
        if not 0 < p < 65536:
            raise ValueError(f"port {shown(p)} is not a TCP port (1..65535)")
    tables = _tables(spec, chosen)
    runtime = resources.files("flodl_proto").joinpath("_dissector_runtime.lua").read_text(
        encoding="utf-8")
    head = (
        f"-- Wireshark dissector for the {_raw_title(spec)}.\n"
        f"-- Generated by flodl-proto {__version__} (`flodl-proto dissector`) from spec/wire.yaml\n"
        f"-- ({spec.raw['schema']}); do not edit: regenerate instead.\n"
        "-- Install: copy into Wireshark's personal Lua plugins folder, or run\n"
        "--   tshark -X lua_script:flodl_proto.lua -r capture.pcap\n\n"
    )
    return head + "local SPEC = " + _lua(tables) + "\n\n" + runtime


def _raw_title(spec: Spec = SPEC) -> str:
    """The spec's title (the protocol's name as the dissector shows it)."""
    return str(spec.raw["title"])


def filter_fields_markdown(spec: Spec = SPEC) -> str:
    """The filter fields as a Markdown table (field, type, description), for docs/wireshark.md.

    No upstream counterpart: upstream ships no Wireshark dissector or its docs.
    """
    lines = ["| Field | Type | Description |", "| --- | --- | --- |"]
    for f in filter_fields(spec):
        kind = f.ftype.lower() + (f" ({f.enum})" if f.enum else "")
        doc = f.doc.replace("|", "\\|")
        lines.append(f"| `{f.abbrev}` | {kind} | {doc} |")
    return "\n".join(lines) + "\n"

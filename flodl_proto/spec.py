"""The packaged protocol specification, loaded and validated once.

``spec/wire.yaml`` is the single source of truth for every magic, version, size, kind code, limit,
message layout and error message; ``spec/lifecycle.yaml`` declares the controller lifecycle. This
module finds them (inside an installed wheel as ``flodl_proto/_spec/``, or beside the package in a
source checkout / editable install), validates their structure, and exposes typed values:

>>> from flodl_proto.spec import SPEC
>>> SPEC.const("MUX_HEADER_LEN")
25

Module-level names (``ROUND_FRAME_MAGIC``, ``DEFAULT_FRAME_CEILING``, ...) mirror the constants so
codec code can import them directly.

Upstream: the constants live in ``flodl/src/distributed/controller/mod.rs``, ``relay/mux.rs`` and
``wire.rs`` (repository fab2s/floDl).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from ._numbers import not_plain_note, plain_number
from ._oserr import file_kind, os_reason
from ._spec_checks import (
    LIFECYCLE_SCHEMA,
    LifecycleTransition,
    as_name_list,
    check_enum_codes,
    check_layout,
    check_layout_lengths,
    check_leniency_fields,
    check_lifecycle_doc,
    lifecycle_machines,
    lifecycle_transitions,
    machine_transitions,
    message_fields,
    walk_lifecycle_states,
)
from ._spec_shapes import (
    LIFECYCLE_KEYS,
    WIRE_KEYS,
    WIRE_SHAPE,
    ShapeError,
    check_constant_types,
    check_sections,
    check_shape,
    check_top_level,
)
from ._yaml_loader import YAML_LOADER

__all__ = [
    "KERNELS_ENV",
    "LIFECYCLE_KEYS",
    "LIFECYCLE_SCHEMA",
    "NET_TIMEOUT_SCALE_ENV",
    "SPEC",
    "SPEC_DIR_ENV",
    "WIRE_KEYS",
    "YAML_LOADER",
    "ErrorEntry",
    "LifecycleTransition",
    "Spec",
    "SpecError",
    "Version",
    "as_name_list",
    "check_lifecycle",
    "find_spec_dir",
    "frame_ceiling_floor",
    "in_given_folder",
    "in_spec_folder",
    "lifecycle_machines",
    "lifecycle_transitions",
    "load_reason",
    "machine_transitions",
    "net_timeout_scale",
    "read_net_timeout_scale",
    "walk_lifecycle_states",
]

log = logging.getLogger(__name__)

#: A data-channel protocol version this package speaks.
Version = Literal[2, 3]


_KINDS: Final = frozenset(
    {"auth", "limit", "truncated", "version", "magic", "sequence", "schema", "value"}
)


#: the environment variable naming a spec folder to load instead of the package's own
SPEC_DIR_ENV: Final = "FLODL_PROTO_SPEC_DIR"


class SpecError(RuntimeError):
    """The packaged spec is missing or malformed (a packaging defect, not a protocol error).

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """One catalogue entry of ``spec/wire.yaml`` ``errors``.

    Attributes:
        id: catalogue id (``"frame.bad_magic"``).
        kind: error kind (``"magic"``).
        remote: default side: True when the peer's bytes are at fault.
        template: ``str.format`` template of the message.
        source: upstream file the wording comes from.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """

    id: str
    kind: str
    remote: bool
    template: str
    source: str


def find_spec_dir() -> Path:
    """Return the directory holding ``wire.yaml`` and ``lifecycle.yaml``.

    Looks, in order, at ``$FLODL_PROTO_SPEC_DIR`` (when set, the only place: an edited spec
    elsewhere), ``flodl_proto/_spec`` (installed wheel) and ``spec/`` beside the package (source
    checkout, editable install).

    Raises:
        SpecError: ``$FLODL_PROTO_SPEC_DIR`` is set and names no folder (one line,
            ``FLODL_PROTO_SPEC_DIR=F: a file, not a folder (give the folder that holds
            wire.yaml)``; ``a FIFO``, ``a character device``... for another kind of file) or a
            folder that holds no ``wire.yaml`` (``FLODL_PROTO_SPEC_DIR=DIR: no wire.yaml in
            that folder (DIR/wire.yaml: REASON)``), or no candidate directory holds
            ``wire.yaml``.

    No upstream counterpart: upstream writes its constants and lifecycle in code
    (``controller/mod.rs``, ``relay/mux.rs``, ``wire.rs``); loading them from ``spec/`` is this
    package's.
    """
    here = Path(__file__).resolve().parent
    candidates = []
    env = os.environ.get(SPEC_DIR_ENV)
    if env:  # a folder named on purpose: never passed over for the package's own spec
        with contextlib.suppress(OSError, ValueError):  # missing, unreadable: the check below
            mode = os.stat(env).st_mode
            if not stat.S_ISDIR(mode):  # a symbolic link is followed
                kind = "a file" if stat.S_ISREG(mode) else file_kind(mode)
                raise SpecError(f"{SPEC_DIR_ENV}={_path_text(Path(env))}: {kind}, not a folder "
                                "(give the folder that holds wire.yaml)")
        wire = Path(env) / "wire.yaml"
        if wire.is_file():
            return Path(env)
        try:
            wire.stat()
            why = "not a file"
        except OSError as e:  # no such file, no permission to look inside, ...
            why = os_reason(e)
        raise SpecError(f"{SPEC_DIR_ENV}={_path_text(Path(env))}: no wire.yaml in that folder "
                        f"({_path_text(wire)}: {why})")
    candidates += [here / "_spec", here.parent / "spec"]
    for c in candidates:
        if (c / "wire.yaml").is_file():
            return c
    raise SpecError(f"spec/wire.yaml not found (looked in {', '.join(map(str, candidates))})")


class Spec:
    """The validated contents of ``spec/wire.yaml`` (and access to ``lifecycle.yaml``).

    Attributes:
        path: directory the spec was loaded from.
        raw: the parsed ``wire.yaml`` mapping (treat as read-only).
        constants: constant name -> integer value.
        errors: catalogue id -> :class:`ErrorEntry`.
        default_version: the default data-channel protocol version (2).
        supported_versions: the versions this package speaks (2, 3).

    Raises:
        SpecError: one line: ``wire.yaml`` cannot be read, is not YAML, is of another
            ``schema``, has a top-level key outside :data:`WIRE_KEYS`, a section is missing or
            holds another kind of value than its shape (``_spec_shapes.WIRE_SHAPE``), a value
            below the top level has another shape than the table gives (a key the table does not
            know, a key it requires missing, a value of another type:
            :func:`~flodl_proto._spec_shapes.check_shape`, naming the value's path,
            ``types.u8.size``), or the file is inconsistent (a constant's type none of
            :data:`~flodl_proto._spec_shapes.CONSTANT_TYPES` or a value out of its type's
            range, a negative size or a u32 above 0xFFFFFFFF; an error of an unknown kind or
            side, or without a template; a default version that is not supported; a message
            without fields, parts or variants; a field naming a constant or an enum the file
            lacks; an enum code that is negative, above a u32, shared by two of the enum's
            values or past a fixed-size field naming the enum, or naming a constant the file
            lacks or of another value; a topology leg, a leniency or a worked example naming a
            message the file lacks, a leniency naming a field its message lacks, other than
            the words :data:`~flodl_proto._spec_checks.LENIENCY_WORDS` for a message they
            mean something for (``payload``: one with a field of a variable size;
            ``varint``: one with bincode variants), an example of a version neither ``any``
            nor supported, or with a tag's ``covers`` entry other than a byte range ``[start,
            end]``, ``0 <= start <= end``; a
            byte-layout field
            whose type is not in ``types``, whose size is not its type's, or whose name an
            earlier field of its message has; a length constant ``STRUCT_LEN`` other than the
            size of the struct ``STRUCT`` a message or a part names, ``HANDSHAKE_LEN`` of the
            handshake's fields, a size constant of
            :data:`~flodl_proto._spec_checks.DERIVED_SIZES` other than the size it derives
            from its message's table (``MUX_AUTH_COVERED_HEADER_LEN``,
            ``ROUND_FRAME_FIXED_OVERHEAD``), or a message's ``size`` other than its fields':
            :func:`~flodl_proto._spec_checks.check_layout_lengths`).

    No upstream counterpart (upstream's constants are code).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = yaml.load((path / "wire.yaml").read_text(encoding="utf-8"), Loader=YAML_LOADER)
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:  # packaging, docs --spec DIR
            raise SpecError(f"cannot load {_path_text(path / 'wire.yaml')}: "
                           f"{load_reason(e)}") from e
        if not isinstance(raw, dict) or raw.get("schema") != "flodl-proto-spec/1":
            raise SpecError("wire.yaml: missing or unknown 'schema'")
        try:
            check_top_level(raw, "wire.yaml", WIRE_KEYS)
            check_sections(raw)
            for name, section in WIRE_SHAPE.required.items():
                check_shape(raw[name], section, "wire.yaml", name)
            check_constant_types(raw["constants"])
        except ShapeError as e:
            raise SpecError(str(e)) from None
        self.raw: Mapping[str, Any] = raw
        self.constants: dict[str, int] = {
            name: entry["value"] for name, entry in _section(raw, "constants").items()}
        self.errors: dict[str, ErrorEntry] = {}
        for eid, entry in _section(raw, "errors").items():
            kind = entry.get("kind")
            side = entry.get("side")
            template = entry.get("template")
            if kind not in _KINDS or side not in ("remote", "local"):
                raise SpecError(f"wire.yaml: error {eid} has a bad kind/side ({kind}/{side})")
            if not isinstance(template, str) or not template:
                raise SpecError(f"wire.yaml: error {eid} has no template")
            self.errors[eid] = ErrorEntry(
                eid, kind, side == "remote", template, str(entry.get("source", ""))
            )
        versions = _section(raw, "versions")
        self.default_version: int = versions["default"]
        self.supported_versions: tuple[int, ...] = tuple(versions["supported"])
        if self.default_version not in self.supported_versions:
            raise SpecError("wire.yaml: default version is not supported")
        enums = _section(raw, "enums")
        for mname, msg in _section(raw, "messages").items():
            if "fields" not in msg and "parts" not in msg and "variants" not in msg:
                raise SpecError(f"wire.yaml: message {mname} has no fields, parts or variants")
            try:
                check_layout(mname, msg, _section(raw, "types"))
            except ShapeError as e:
                raise SpecError(str(e)) from None
            for f in message_fields(msg):
                for key, known, section in (("const", self.constants, "constants"),
                                            ("enum", enums, "enums")):
                    if key in f and f[key] not in known:
                        raise SpecError(f"wire.yaml: message {mname} field {f.get('name')}: "
                                        f"{key} {f[key]!r} is not in the {section!r} section")
        try:
            check_enum_codes(enums, _section(raw, "messages"), _section(raw, "types"))
            check_layout_lengths(self.constants, _section(raw, "messages"))
        except ShapeError as e:
            raise SpecError(str(e)) from None
        messages = _section(raw, "messages")
        named = [(f"topology.legs[{i}]", m) for i, leg in enumerate(raw["topology"]["legs"])
                 for m in leg["messages"]]
        named += [(f"leniencies[{i}]", entry["message"])
                  for i, entry in enumerate(raw["leniencies"]) if "message" in entry]
        for where, m in named:
            if m not in messages:
                raise SpecError(f"wire.yaml: {where}: message {m!r} is not in the 'messages' "
                                "section")
        try:
            check_leniency_fields(raw["leniencies"], messages)
        except ShapeError as e:
            raise SpecError(str(e)) from None
        for ename, enum in enums.items():
            for vname, value in enum["values"].items():
                cname = value.get("constant")
                if cname is None:
                    continue
                if cname not in self.constants:
                    raise SpecError(f"wire.yaml: enum {ename}: {vname} names constant "
                                    f"{cname!r}, which is not in the 'constants' section")
                if self.constants[cname] != value["code"]:
                    raise SpecError(f"wire.yaml: enum {ename}: {vname} has code "
                                    f"0x{value['code']:08X}, but its constant {cname} is "
                                    f"0x{self.constants[cname]:08X}")
        for xname, ex in _section(raw, "examples").items():
            if ex["message"] not in messages:
                raise SpecError(f"wire.yaml: example {xname}: message {ex['message']!r} is not "
                                "in the 'messages' section")
            if ex["version"] != "any" and ex["version"] not in self.supported_versions:
                raise SpecError(f"wire.yaml: example {xname}: version {ex['version']!r} is "
                                "neither 'any' nor a supported version ("
                                f"{', '.join(map(str, self.supported_versions))})")
            for tag in ex["tags"]:
                for span in tag["covers"]:
                    if len(span) != 2 or not 0 <= span[0] <= span[1]:
                        raise SpecError(f"wire.yaml: example {xname}: tag {tag['field']}: "
                                        f"covers {span}, not a byte range [start, end] with "
                                        "0 <= start <= end")

    def const(self, name: str) -> int:
        """Return the integer value of constant ``name``.

        Raises:
            KeyError: no such constant.
        """
        return self.constants[name]

    def enum(self, name: str) -> dict[str, int]:
        """Return ``{member name: code}`` of enum ``name`` (e.g. ``"RecordKind"``)."""
        values = self.raw["enums"][name]["values"]
        return {k: int(v["code"]) for k, v in values.items()}

    def enum_entry(self, name: str) -> dict[str, Any]:
        """Return the raw member mapping of enum ``name`` (codes plus extra attributes)."""
        return dict(self.raw["enums"][name]["values"])

    def timeout(self, name: str) -> float:
        """Return the base duration (seconds) of timeout ``name``, before any scaling."""
        return float(self.raw["timeouts"][name]["seconds"])

    def timeout_scaled(self, name: str) -> bool:
        """Return True when timeout ``name`` is multiplied by ``FLODL_NET_TIMEOUT_SCALE``."""
        return bool(self.raw["timeouts"][name].get("scaled", False))

    def message(self, name: str) -> dict[str, Any]:
        """Return the raw message entry ``name`` of ``messages``."""
        return dict(self.raw["messages"][name])

    def lifecycle(self) -> dict[str, Any]:
        """Return a deep copy of ``lifecycle.yaml`` (callers may consume it).

        Raises:
            SpecError: the file is missing or malformed.
        """
        return copy.deepcopy(_load_lifecycle(self.path))


def _path_text(path: Path) -> str:
    """``path`` as a load error names it: as it is, or quoted as ``repr`` quotes a text when it
    holds a character that is not printable (an escape a terminal would act on, a line break)
    or starts or ends with white space, so the error stays one line that plays nothing on the
    terminal (``--spec`` is a command-line value). Raises nothing."""
    text = str(path)
    return text if text.isprintable() and text == text.strip() else repr(text)


def load_reason(e: OSError | yaml.YAMLError | UnicodeDecodeError) -> str:
    """Why a spec file could not be loaded, in one line without its path (the caller names it):
    the OS's reason, the byte that is not UTF-8, or the YAML problem and where it was found
    (PyYAML's own text spans lines and quotes ``<unicode string>``), e.g. ``not YAML: duplicate
    key 'title' (first at line 3) at line 3, column 90``.

    No upstream counterpart: upstream's spec is its code; the spec files are this package's."""
    if isinstance(e, OSError):
        return os_reason(e)
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not YAML: {problem}{where}"


@cache
def _load_lifecycle(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load((path / "lifecycle.yaml").read_text(encoding="utf-8"), Loader=YAML_LOADER)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot load {_path_text(path / 'lifecycle.yaml')}: "
                       f"{load_reason(e)}") from e
    if not isinstance(data, dict):
        raise SpecError("lifecycle.yaml: not a mapping")
    check_lifecycle(data)
    return data


def check_lifecycle(doc: Mapping[str, Any]) -> None:
    """Check a parsed ``lifecycle.yaml`` (the loader does, once per file): its ``schema``, its
    top-level keys (``schema``, ``x-docs-keys``, ``machines``: :data:`LIFECYCLE_KEYS`), the
    shape of everything below them, at least one machine with ``states``, every transition's
    target among its machine's states, every state reached from the initial one, and every
    event and guard of a transition in the machine's ``events`` and ``guards`` tables when it
    has them (:func:`flodl_proto._spec_checks.check_lifecycle_doc`).

    Raises:
        SpecError: one line naming what is wrong (an unknown top-level key; the path of a value
            of another shape, ``machines.relay.states.idle.initial``; the machine, the
            transition and the target).

    No upstream counterpart (upstream's lifecycles are code).
    """
    try:
        check_lifecycle_doc(doc)
    except ShapeError as e:
        raise SpecError(str(e)) from None


def _section(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    sec = raw.get(name)
    if not isinstance(sec, dict):
        raise SpecError(f"wire.yaml: missing section {name!r}")
    return sec


def _names_folder(folder: Path, text: str) -> bool:
    """Whether ``text``, a load error of the spec in ``folder``, starts with the words the
    loader gives a file of it it cannot load (``cannot load FOLDER/wire.yaml: ``, ``cannot
    load FOLDER/lifecycle.yaml: ``, the path written as the loader writes it): the folder
    exactly, not a text that holds its name elsewhere (a folder ``s`` and any line with an
    ``s`` in it)."""
    return text.startswith(tuple(f"cannot load {_path_text(folder / name)}: "
                                 for name in ("wire.yaml", "lifecycle.yaml")))


def in_spec_folder(folder: Path, text: str) -> str:
    """``text``, a load error of the spec in ``folder``, after ``spec folder FOLDER: `` unless
    it names the folder already: it starts with the loader's ``cannot load FOLDER/wire.yaml:
    `` or ``cannot load FOLDER/lifecycle.yaml: `` (that folder exactly, as the loader writes
    it), ``FLODL_PROTO_SPEC_DIR=`` or ``spec folder ``; a text that holds the folder's name
    elsewhere is named too (a folder ``s`` and a line with an ``s`` in it). An edited
    checkout's spec that fails to load is named by its folder, as one from
    ``$FLODL_PROTO_SPEC_DIR`` is by the variable. Raises nothing.

    Upstream: none (upstream's spec is its code)."""
    if _names_folder(folder, text) or text.startswith((f"{SPEC_DIR_ENV}=", "spec folder ")):
        return text
    return f"spec folder {_path_text(folder)}: {text}"


def in_given_folder(folder: Path, text: str) -> str:
    """``text``, a load error of the spec in ``folder``, a folder the user named (``docs
    --spec DIR``), after ``FOLDER: `` (quoted as a load error quotes a path that holds a
    character that does not print or white space at either end), as ``FLODL_PROTO_SPEC_DIR=
    FOLDER: `` names the variable's folder: ``/tmp/spec: wire.yaml: constants...``; ``text``
    as it is when it names the folder already (``cannot load FOLDER/wire.yaml: ...``,
    ``cannot load FOLDER/lifecycle.yaml: ...``). Raises nothing.

    Upstream: none (upstream's spec is its code)."""
    if _names_folder(folder, text):
        return text
    return f"{_path_text(folder)}: {text}"


def _load_own_spec() -> Spec:
    """The spec this package runs on: ``$FLODL_PROTO_SPEC_DIR``'s (whose errors the command line
    names by the variable), else its own, whose errors name its folder (:func:`in_spec_folder`).

    Raises:
        SpecError: the folder holds no spec, or one that cannot be loaded."""
    folder = find_spec_dir()
    try:
        return Spec(folder)
    except SpecError as e:
        if os.environ.get(SPEC_DIR_ENV):
            raise
        raise SpecError(in_spec_folder(folder, str(e))) from None


SPEC: Final = _load_own_spec()


def _missing(what: str) -> SpecError:
    """The error of a spec that lacks ``what`` (``constant 'HANDSHAKE_LEN'``, ``member 'MODEL'
    of enum 'RoundKind'``, ``timeout 'WRITE_STALL'``), which the package reads: one line
    ``wire.yaml: missing constant 'HANDSHAKE_LEN' (the package reads it)``, named by the
    command line through ``$FLODL_PROTO_SPEC_DIR`` when that gave the spec, else (an edited
    checkout's) by its folder, as :func:`_load_own_spec` names it; a ``KeyError`` traceback
    ended every command."""
    text = f"wire.yaml: missing {what} (the package reads it)"
    if not os.environ.get(SPEC_DIR_ENV):  # the package's own: named by its folder
        text = in_spec_folder(SPEC.path, text)
    return SpecError(text)


#: every timeout of ``wire.yaml`` the package reads (``SPEC.timeout(name)``, some only when a
#: run needs them): checked as the package is imported, so that a spec without one is refused
#: before any command runs, not in the middle of a run (a test compares it with the source)
PACKAGE_TIMEOUTS: Final = (
    "ACCEPT_POLL", "COMMITTED_READ_STARVATION", "CONNECT_BACKOFF", "HANDSHAKE_READ",
    "PORT_MUX_PEEK", "REDUCE_POLL", "REDUCE_READ_DEADLINE", "RELAY_POLL", "TCP_KEEPALIVE_IDLE",
    "TCP_KEEPALIVE_INTERVAL", "TIMEOUT_OPTION_MAXIMUM", "WRITE_STALL",
)
for _name in (*PACKAGE_TIMEOUTS, "ENV_NET_TIMEOUT_SCALE"):
    if _name not in SPEC.raw["timeouts"]:
        raise _missing(f"timeout {_name!r}")
#: the environment variable of the network timeout scale
NET_TIMEOUT_SCALE_ENV: Final = str(SPEC.raw["timeouts"]["ENV_NET_TIMEOUT_SCALE"]["env"])
#: the environment variable choosing this package's bf16 kernel backend (``auto``, ``numpy``,
#: ``numba``; no wire effect: the backends give the same bytes)
KERNELS_ENV: Final = "FLODL_PROTO_KERNELS"


def parse_f64(text: str) -> float | None:
    """``text`` as a float the way upstream's ``str::parse::<f64>`` reads it, or None when it is
    not one: ASCII only, no digit separators (Python's ``float`` also takes ``1_0`` and the
    digits of any script, ``\u0661`` being 1). Surrounding whitespace is not part of the number:
    callers strip it (or refuse it) first; ``inf`` and ``nan`` are numbers, as upstream's.

    Upstream: Rust's ``<f64 as FromStr>::from_str`` (the launcher's number options, ``wire.rs``
    ``parse_net_timeout_scale``).
    """
    if not plain_number(text):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_net_timeout_scale(text: str | None) -> tuple[float, dict[str, Any] | None]:
    """Read a network timeout scale (``FLODL_NET_TIMEOUT_SCALE``, or an option that sets it).

    ``None`` (unset) is the default, 1.0. Text is taken as upstream's ``str::parse::<f64>``
    takes it, after stripping surrounding whitespace (no digit separators, ASCII only); the
    value must be finite and within ``ENV_NET_TIMEOUT_SCALE``'s minimum (0.1) and maximum (1000,
    spec departure ``net_timeout_scale_maximum``), bounds included. Nothing is raised here (this
    module imports nothing of the package): the caller words an invalid value with the
    ``timeout_scale.invalid`` catalogue entry, whose fields are returned.

    Args:
        text: the value's text, or None when unset.

    Returns:
        ``(scale, None)`` for a valid (or unset) value; ``(1.0, fields)`` for an invalid one,
        ``fields`` being ``timeout_scale.invalid``'s but ``field``: ``value`` (the stripped
        text), ``problem`` (``"is not a number"``, followed for ``1_0`` or ``١`` by the reason
        of :func:`flodl_proto._numbers.not_plain_note`; ``"is not finite"`` for NaN and the
        infinities, or ``"is out of range"``), ``minimum`` and ``maximum``.

    Upstream: ``flodl/src/distributed/wire.rs`` ``parse_net_timeout_scale`` (no maximum).
    """
    entry = SPEC.raw["timeouts"]["ENV_NET_TIMEOUT_SCALE"]
    default = float(entry["default"])
    if text is None:
        return default, None
    trimmed = text.strip()
    minimum, maximum = float(entry["minimum"]), float(entry["maximum"])
    value = parse_f64(trimmed)
    if value is not None and minimum <= value <= maximum:  # NaN fails too
        return value, None
    problem = (f"is not a number{not_plain_note(trimmed)}" if value is None
               else "is out of range" if math.isfinite(value) else "is not finite")
    return default, {"value": trimmed, "minimum": minimum, "maximum": maximum,
                     "problem": problem}


#: :func:`net_timeout_scale` by the variable's text (None: unset); an invalid text is in it once
#: it has been warned about
_SCALES: Final[dict[str | None, float]] = {}


def net_timeout_scale() -> float:
    """Return ``FLODL_NET_TIMEOUT_SCALE`` (:func:`read_net_timeout_scale`; unset: 1.0).

    An invalid value falls back to the default, 1.0, as upstream's library does, with one
    warning per distinct value (logged, so on stderr unless logging is configured otherwise):
    ``FLODL_NET_TIMEOUT_SCALE='1e308' is out of range; expected ...; using default scale 1.0``
    (the cluster commands refuse it before anything starts, as upstream's launcher does). The
    variable is read at every call (a test or a launcher may change it); the reading is
    remembered per text.

    Upstream: ``flodl/src/distributed/wire.rs`` ``net_timeout_scale``.
    """
    text = os.environ.get(NET_TIMEOUT_SCALE_ENV)
    scale = _SCALES.get(text)
    if scale is None:
        scale, invalid = read_net_timeout_scale(text)
        if invalid is not None:
            message = SPEC.errors["timeout_scale.invalid"].template.format(
                field=NET_TIMEOUT_SCALE_ENV, **invalid)
            log.warning("%s; using default scale %s", message, scale)
        _SCALES[text] = scale
    return scale


def _c(name: str) -> int:
    """The constant ``name`` of the spec loaded, which the package reads as it is imported.

    Raises:
        SpecError: the spec has no such constant (one of ``$FLODL_PROTO_SPEC_DIR``, which the
            command line names by the variable, or an edited checkout's, named by its folder
            as :func:`_load_own_spec` names it): ``wire.yaml: missing constant
            'HANDSHAKE_LEN' (the package reads it)``, where a ``KeyError`` traceback ended
            every command.
    """
    if name not in SPEC.constants:
        raise _missing(f"constant {name!r}")
    return SPEC.const(name)


def _members(enum: str, *names: str) -> dict[str, Any]:
    """The raw member mapping of enum ``enum`` (:meth:`Spec.enum_entry`), holding at least
    ``names``, which the package reads as it is imported.

    Raises:
        SpecError: the spec lacks the enum or one of ``names`` (:func:`_missing`:
            ``wire.yaml: missing member 'MODEL' of enum 'RoundKind' (the package reads it)``).
    """
    if enum not in SPEC.raw["enums"]:
        raise _missing(f"enum {enum!r}")
    members = SPEC.enum_entry(enum)
    for n in names:
        if n not in members:
            raise _missing(f"member {n!r} of enum {enum!r}")
    return members


def _codes(enum: str, *names: str) -> dict[str, int]:
    """``{member name: code}`` of enum ``enum`` (:meth:`Spec.enum`), holding at least
    ``names``, which the package reads as it is imported: the enum and the members checked
    by :func:`_members`, so that a spec without one is refused in one place, in one line.

    Raises:
        SpecError: as :func:`_members` (``wire.yaml: missing member 'DATA' of enum
            'RecordKind' (the package reads it)``).
    """
    _members(enum, *names)
    return SPEC.enum(enum)


HANDSHAKE_MAGIC_RANK: Final = _c("HANDSHAKE_MAGIC_RANK")
HANDSHAKE_MAGIC_CONTROLLER_ACK: Final = _c("HANDSHAKE_MAGIC_CONTROLLER_ACK")
ROUND_FRAME_MAGIC: Final = _c("ROUND_FRAME_MAGIC")
MUX_RECORD_MAGIC: Final = _c("MUX_RECORD_MAGIC")
MUX_PROTOCOL_VERSION: Final = _c("MUX_PROTOCOL_VERSION")
MUX_HEADER_LEN: Final = _c("MUX_HEADER_LEN")
MUX_AUTH_COVERED_HEADER_LEN: Final = _c("MUX_AUTH_COVERED_HEADER_LEN")
HANDSHAKE_LEN: Final = _c("HANDSHAKE_LEN")
HANDSHAKE_ACK_LEN: Final = _c("HANDSHAKE_ACK_LEN")
CHANNEL_MAGIC_LEN: Final = _c("CHANNEL_MAGIC_LEN")
LEN_PREFIX_LEN: Final = _c("LEN_PREFIX_LEN")
ROUND_FRAME_HEADER_LEN: Final = _c("ROUND_FRAME_HEADER_LEN")
ROUND_FRAME_FIXED_OVERHEAD: Final = _c("ROUND_FRAME_FIXED_OVERHEAD")
AUTH_TAG_LEN: Final = _c("AUTH_TAG_LEN")
SESSION_SALT_BYTES: Final = _c("SESSION_SALT_BYTES")
MAX_ROUND_FRAME_TENSORS: Final = _c("MAX_ROUND_FRAME_TENSORS")
MAX_NDIM: Final = _c("MAX_NDIM")
DEFAULT_FRAME_CEILING: Final = _c("DEFAULT_FRAME_CEILING")
FRAME_CEILING_FLOOR: Final = _c("FRAME_CEILING_FLOOR")
READ_CHUNK: Final = _c("READ_CHUNK")
MAX_HELLO_HOST_LEN: Final = _c("MAX_HELLO_HOST_LEN")
CONTROL_HANDSHAKE_MAGIC_RANK: Final = _c("CONTROL_HANDSHAKE_MAGIC_RANK")
CHANNEL_MAGIC_RENDEZVOUS: Final = _c("CHANNEL_MAGIC_RENDEZVOUS")
CHANNEL_MAGIC_DATA: Final = _c("CHANNEL_MAGIC_DATA")
CHANNEL_MAGIC_CONTROL: Final = _c("CHANNEL_MAGIC_CONTROL")
CHANNEL_MAGIC_JOIN: Final = _c("CHANNEL_MAGIC_JOIN")
CHANNEL_MAGIC_HTTP_GET: Final = _c("CHANNEL_MAGIC_HTTP_GET")
CHANNEL_MAGIC_HTTP_POST: Final = _c("CHANNEL_MAGIC_HTTP_POST")
DEFAULT_CONTROLLER_PORT: Final = _c("DEFAULT_CONTROLLER_PORT")
RELAY_DATA_LOOPBACK_OFFSET: Final = _c("RELAY_DATA_LOOPBACK_OFFSET")
RELAY_OUTBOUND_QUEUE: Final = _c("RELAY_OUTBOUND_QUEUE")
CONTROLLER_BROADCAST_BACKLOG: Final = _c("CONTROLLER_BROADCAST_BACKLOG")
DEFAULT_VERSION: Final = SPEC.default_version
SUPPORTED_VERSIONS: Final = SPEC.supported_versions

_dtypes = _members("Dtype", "F32", "BF16")
DTYPE_F32: Final = int(_dtypes["F32"]["code"])
DTYPE_BF16: Final = int(_dtypes["BF16"]["code"])
#: wire dtype tag -> element size in bytes
ELEMENT_SIZE: Final[Mapping[int, int]] = {
    int(v["code"]): int(v["element_size"]) for v in _dtypes.values()
}
_kinds = _codes("RoundKind", "MODEL", "CONTROL")
ROUND_KIND_MODEL: Final = _kinds["MODEL"]
ROUND_KIND_CONTROL: Final = _kinds["CONTROL"]
_rk = _codes("RecordKind", "DATA", "CONTROL", "HOST_FRAME", "BROADCAST")
REC_DATA: Final = _rk["DATA"]
REC_CONTROL: Final = _rk["CONTROL"]
REC_HOST_FRAME: Final = _rk["HOST_FRAME"]
REC_BROADCAST: Final = _rk["BROADCAST"]
CONTROL_VARIANTS: Final[Mapping[str, int]] = _codes("ControlVariant", "Hello", "HelloAck",
                                                    "RankExit", "DeclareDead")
CHANNELS: Final[Mapping[str, int]] = _codes("Channel", "data")
#: the largest u32 (``types.u32``: 4 bytes)
U32_MAX: Final = (1 << (8 * int(SPEC.raw["types"]["u32"]["size"]))) - 1
_hello_fields = {f["name"]: f for f in next(
    v for v in SPEC.raw["messages"]["relay_control_msg"]["variants"] if v["name"] == "Hello"
)["fields"]}
#: bytes of one model signature in ``Hello.model_sigs`` (its type ``Vec<[u8; N]>``)
MODEL_SIG_LEN: Final = int(str(_hello_fields["model_sigs"]["type"]).rsplit(";", 1)[1]
                           .strip(" ]>"))
_markers = SPEC.raw["messages"]["relay_control_msg"]["encoding"]["markers"]
VARINT_SINGLE_BYTE_MAX: Final = int(_markers["single_byte_max"])
VARINT_U16: Final = int(_markers["u16"])
VARINT_U32: Final = int(_markers["u32"])
VARINT_U64: Final = int(_markers["u64"])
VARINT_U128: Final = int(_markers["u128"])


def frame_ceiling_floor() -> tuple[int, str]:
    """The smallest frame ceiling (bytes) a controller, relay or rank takes part in a run with,
    and what it is (spec departure ``ceiling_floor``): the smallest RoundFrame
    (``ROUND_FRAME_FIXED_OVERHEAD``: header, kind, weight and tag, no tensor). Every frame a rank
    sends, every HostFrame and every Broadcast is at least that; the handshake records are
    smaller (the smallest Hello is 4 bytes at version 2 and 5 at version 3, a HelloAck 1, a
    RankExit or DeclareDead at most 6), so with a smaller ceiling a run could not complete a
    round. It does not cover every Hello: a relay's grows with its host name and ranks
    (:func:`~flodl_proto.codec.mux.max_hello_payload`), and a controller ceiling below it still
    refuses that relay.

    Returns:
        ``(25, "the smallest RoundFrame: no tensor")``.

    Upstream: none; upstream's ceiling is 1 GiB, or derived from the model and never below
    ``FRAME_CEILING_FLOOR`` (``wire.rs``), and no option sets it.
    """
    return ROUND_FRAME_FIXED_OVERHEAD, "the smallest RoundFrame: no tensor"

"""The conformance kit's case catalogue: ``spec/conformance.yaml`` plus the scripted controller
sessions of the golden vectors, turned into :class:`Case` objects.

A case checks one rule of the protocol against a target (a controller or a relay): its ``id``
(``controller.hello.rank-out-of-range``), a title, the section of ``docs/protocol.md`` it checks
(a *doc key*: ``message:<name>``, ``semantics:<id>`` or ``section:<title>``), the error catalogue
id it provokes (or none), a level (``MUST``: flodl's behaviour as the golden vectors and upstream
pin it; ``SHOULD``: this package's stricter choices, listed as departures), the protocol versions
it applies to, what it needs (``port_mux``), the world size and a script of steps per version.

The ``controller_session`` vectors are not copied into the catalogue: ``vector_cases`` names the
vector file and gives each of its cases an id suffix, a section and an error id; the steps are
generated from the vector file of each version (bytes sent and expected verbatim, the vector's
salt and world size, then the connection closes and the target's exit status the vector pins).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

import yaml

from .._spec_shapes import (
    CONFORMANCE_ACTIONS,
    ShapeError,
    check_shape,
    check_top_level,
    conformance_shape,
)
from ..spec import SPEC, SUPPORTED_VERSIONS, YAML_LOADER, find_spec_dir, load_reason

__all__ = ["ACTIONS", "FILTERS", "LEVELS", "NEEDS", "ROLES", "Case", "CatalogueError",
           "left_out_by", "load_catalogue", "matching_cases", "select_cases", "vectors_dir"]

#: the schema tag of conformance.yaml
SCHEMA: Final = "flodl-proto-conformance/1"
ROLES: Final = ("controller", "relay")
LEVELS: Final = ("MUST", "SHOULD")
#: what a case needs from the target: its port mux on (``port_mux``) or off (``direct``)
NEEDS: Final = ("port_mux", "direct")
#: step actions (each step is a mapping with exactly one of these keys)
ACTIONS: Final = CONFORMANCE_ACTIONS

_ID_RE: Final = re.compile(r"^(controller|relay)\.[a-z0-9-]+\.[a-z0-9-]+$")


class CatalogueError(ValueError):
    """A case of the catalogue is malformed (the message names the case, step and field).

    Defined here, not with the builders that raise it too, so that loading the catalogue does
    not import the codec (NumPy, ml_dtypes).

    No upstream counterpart: upstream has no conformance kit.
    """


@dataclass(frozen=True, slots=True)
class Case:
    """One conformance case.

    Attributes:
        id: ``<role>.<group>.<name>``.
        title: one line saying what is checked.
        role: ``controller`` or ``relay`` (the kind of target).
        section: doc key of the ``docs/protocol.md`` section it checks.
        error: the error catalogue id the case provokes at the target, or None.
        level: ``MUST`` or ``SHOULD``.
        versions: protocol versions it applies to.
        needs: ``port_mux`` (runs only with ``--port-mux``) or ``direct`` (only without).
        world_size: world size the target is launched with.
        ranks: the relay's ranks (relay role; empty for the controller role).
        salt: a fixed session salt (vector cases), else None (a fresh one per run).
        steps: version -> the steps (read-only mappings) played at that version.
        source: ``conformance.yaml`` or the vector ids the steps come from.

    No upstream counterpart: upstream has no conformance kit.
    """

    id: str
    title: str
    role: str
    section: str
    error: str | None
    level: str
    versions: tuple[int, ...]
    needs: tuple[str, ...]
    world_size: int
    ranks: tuple[int, ...]
    salt: bytes | None
    steps: Mapping[int, tuple[Mapping[str, Any], ...]] = field(repr=False)
    source: str = "conformance.yaml"


def vectors_dir() -> Path:
    """The bundled golden vector folder (``flodl_proto/_vectors``).

    No upstream counterpart: upstream has no conformance kit.
    """
    return Path(__file__).resolve().parent.parent / "_vectors"


def _need(entry: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in entry:
        raise CatalogueError(f"{where}: missing {key!r}")
    return entry[key]


def _check_common(case_id: str, entry: Mapping[str, Any], where: str) -> None:
    if not _ID_RE.match(case_id):
        raise CatalogueError(f"{where}: id {case_id!r} is not <role>.<group>.<name>")
    if entry.get("level") not in LEVELS:
        raise CatalogueError(f"{where}: level must be one of {LEVELS}")
    err = entry.get("error")
    if err is not None and err not in SPEC.errors:
        raise CatalogueError(f"{where}: error {err!r} is not in the error catalogue")
    for v in entry.get("versions", SUPPORTED_VERSIONS):
        if v not in SUPPORTED_VERSIONS:
            raise CatalogueError(f"{where}: version {v} is not supported")
    for n in entry.get("needs", []):
        if n not in NEEDS:
            raise CatalogueError(f"{where}: unknown need {n!r}")


def _check_steps(steps: Sequence[Any], where: str) -> tuple[Mapping[str, Any], ...]:
    out = []
    for i, s in enumerate(steps):
        if not isinstance(s, Mapping):
            raise CatalogueError(f"{where} step {i}: not a mapping")
        acts = [a for a in ACTIONS if a in s]
        if len(acts) != 1:
            raise CatalogueError(f"{where} step {i}: exactly one action of {ACTIONS} expected, "
                                 f"got {sorted(s)}")
        out.append(s)
    return tuple(out)


def _vector_steps(vcase: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The kit's steps for one ``controller_session`` vector case."""
    steps: list[dict[str, Any]] = []
    open_conns: set[int] = set()
    for s in vcase["steps"]:
        conn, action = int(s["conn"]), s["action"]
        if action == "connect":
            steps.append({"connect": conn})
            open_conns.add(conn)
        elif action == "send":
            steps.append({"send": {"conn": conn, "hex": s["bytes"]}})
        elif action == "recv":
            steps.append({"expect": {"conn": conn, "hex": s["bytes"]}})
        elif action == "close":
            steps.append({"close": conn})
            open_conns.discard(conn)
        else:
            raise CatalogueError(f"vector {vcase['id']}: unknown action {action!r}")
    for after in vcase.get("after", []):
        conn = int(after["conn"])
        if conn not in open_conns or not after.get("closed_by_controller"):
            continue  # upstream leaving a connection open is not something to require
        if after.get("bytes"):
            steps.append({"expect": {"conn": conn, "hex": after["bytes"]}})
        steps.append({"expect_close": {"conn": conn}})
    result = vcase["controller"]["result"]
    steps.append({"expect_exit": "success" if result == "ok" else "failure"})
    return steps


def _load_vector_file(folder: Path, name: str) -> tuple[int, list[dict[str, Any]]]:
    path = folder / f"{name}.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    return int(doc["protocol_version"]), list(doc["cases"])


def _vector_cases(group: Mapping[str, Any], vdir: Path) -> list[Case]:
    where = f"vector_cases {group.get('file')}"
    fname = str(_need(group, "file", where))
    role = str(group.get("role", "controller"))
    prefix = str(_need(group, "id_prefix", where))
    level = str(group.get("level", "MUST"))
    mapping: Mapping[str, Mapping[str, Any]] = _need(group, "cases", where)
    per_version: dict[str, dict[int, Mapping[str, Any]]] = {}
    folders = [vdir] + ([vdir / "v2"] if (vdir / "v2").is_dir() else [])
    for folder in folders:
        if not (folder / f"{fname}.json").is_file():
            continue
        version, vcases = _load_vector_file(folder, fname)
        for vc in vcases:
            name = str(vc["id"]).rsplit("/", 1)[-1]
            if version in per_version.setdefault(name, {}):  # one would hide the other
                raise CatalogueError(f"{where}: two vector cases named {name!r} at version "
                                     f"{version}: {per_version[name][version]['id']}, {vc['id']}")
            per_version[name][version] = vc
    missing = sorted(set(per_version) - set(mapping))
    if missing:
        raise CatalogueError(f"{where}: vector cases without a catalogue entry: {missing}")
    out = []
    for name, meta in mapping.items():
        if name not in per_version:
            raise CatalogueError(f"{where}: {name!r} is not a case of the vector file")
        vcs = per_version[name]
        case_id = prefix + name
        entry = {"level": level, **meta}
        _check_common(case_id, entry, f"{where} {name}")
        salts = {vc["salt"] for vc in vcs.values()}
        worlds = {int(vc["world_size"]) for vc in vcs.values()}
        if len(worlds) != 1:
            raise CatalogueError(f"{where} {name}: world size differs across versions")
        steps = {v: _check_steps(_vector_steps(vc), f"{where} {name}") for v, vc in vcs.items()}
        first = next(iter(vcs.values()))
        out.append(Case(
            id=case_id, title=str(meta.get("title", first.get("description", name))),
            role=role, section=str(_need(meta, "section", f"{where} {name}")),
            error=meta.get("error"), level=str(entry["level"]),
            versions=tuple(sorted(vcs)), needs=tuple(meta.get("needs", [])),
            world_size=worlds.pop(), ranks=(),
            salt=bytes.fromhex(salts.pop()) if len(salts) == 1 else None, steps=steps,
            source=", ".join(str(vc["id"]) for _, vc in sorted(vcs.items())),
        ))
        if out[-1].salt is None:
            raise CatalogueError(f"{where} {name}: the salt differs across versions")
    return out


def _plain_case(entry: Mapping[str, Any], index: int) -> Case:
    where = f"cases[{index}] {entry.get('id', '?')}"
    case_id = str(_need(entry, "id", where))
    _check_common(case_id, entry, where)
    role = case_id.split(".", 1)[0]
    versions = tuple(int(v) for v in entry.get("versions", SUPPORTED_VERSIONS))
    base = _need(entry, "steps", where)
    steps: dict[int, tuple[Mapping[str, Any], ...]] = {}
    for v in versions:
        # per-version replacements: steps_v2 / steps_v3 override the common script
        steps[v] = _check_steps(entry.get(f"steps_v{v}", base), where)
    ranks = tuple(int(r) for r in entry.get("ranks", [0, 1] if role == "relay" else []))
    world = int(entry.get("world_size", len(ranks) if role == "relay" else 1))
    return Case(
        id=case_id, title=str(_need(entry, "title", where)), role=role,
        section=str(_need(entry, "section", where)), error=entry.get("error"),
        level=str(entry["level"]), versions=versions, needs=tuple(entry.get("needs", [])),
        world_size=world, ranks=ranks, salt=None, steps=steps,
    )


def load_catalogue(path: Path | None = None, vectors: Path | None = None) -> tuple[Case, ...]:
    """Load and validate the case catalogue.

    Args:
        path: a ``conformance.yaml`` (default: the packaged ``spec/conformance.yaml``).
        vectors: the vector folder the ``vector_cases`` come from (default: the bundled one).

    Returns:
        Every case, vector cases first, in catalogue order.

    Raises:
        CatalogueError: a malformed file: not YAML, another schema, a key the file's shape
            (:func:`~flodl_proto._spec_shapes.conformance_shape`) does not know or a value of
            another type than it gives (one line naming the file and the value's path:
            ``conformance.yaml: cases[3].world_size is the string 'two', not an integer``), an
            unknown error id, a duplicate id, a vector case left without an entry.
        OSError: the file cannot be read.

    No upstream counterpart: upstream has no conformance kit.
    """
    if path is None and vectors is None:
        return _default_catalogue()
    return _load(path or find_spec_dir() / "conformance.yaml", vectors or vectors_dir())


@cache
def _default_catalogue() -> tuple[Case, ...]:
    return _load(find_spec_dir() / "conformance.yaml", vectors_dir())


def _load(path: Path, vdir: Path) -> tuple[Case, ...]:
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=YAML_LOADER)
    except yaml.YAMLError as e:
        raise CatalogueError(f"{path.name}: {load_reason(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogueError(f"cannot load {path}: {load_reason(e)}") from None
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        raise CatalogueError(f"{path.name}: missing or unknown schema (want {SCHEMA})")
    shape = conformance_shape(tuple(SUPPORTED_VERSIONS))
    try:  # every key known and of its type, before any is read
        check_top_level(doc, path.name, frozenset(shape.required) | frozenset(shape.optional))
        for key, value in doc.items():
            check_shape(value, shape.required.get(key, shape.optional.get(key)), path.name,
                        str(key))
    except ShapeError as e:
        raise CatalogueError(str(e)) from None
    cases: list[Case] = []
    for group in doc.get("vector_cases", []):
        cases += _vector_cases(group, vdir)
    for i, entry in enumerate(doc.get("cases", [])):
        cases.append(_plain_case(entry, i))
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise CatalogueError(f"{path.name}: duplicate case id {c.id}")
        seen.add(c.id)
    return tuple(cases)


def matching_cases(cases: Iterable[Case], *, role: str,
                   patterns: Sequence[str] = ()) -> list[Case]:
    """The cases of ``role`` whose id matches one of the shell globs ``patterns`` (empty: every
    case of the role), in catalogue order: what :func:`select_cases` picks from.

    No upstream counterpart: upstream has no conformance kit.
    """
    return [c for c in cases if c.role == role
            and (not patterns or any(fnmatch.fnmatchcase(c.id, p) for p in patterns))]


#: the filters of :func:`select_cases`, in the order it applies them (see :func:`left_out_by`)
FILTERS: Final = ("level", "needs", "version")


def _missing_need(c: Case, port_mux: bool) -> str | None:
    """What the target lacks that ``c`` needs (``--port-mux``, ``a target without the port
    mux``), or None."""
    if "port_mux" in c.needs and not port_mux:
        return "--port-mux"
    if "direct" in c.needs and port_mux:
        return "a target without the port mux"
    return None


def left_out_by(case: Case, *, versions: Iterable[int], level: str | None = None,
                port_mux: bool = False) -> list[tuple[str, str]]:
    """Every filter of :func:`select_cases` that leaves ``case`` out, in the order it applies
    them (:data:`FILTERS`), each with what the case needs to pass it.

    Args:
        case: a case of the role and patterns asked for (:func:`matching_cases`).
        versions, level, port_mux: as :func:`select_cases`.

    Returns:
        ``(filter, need)`` pairs: ``("level", "--level must")``, ``("needs", "--port-mux")`` or
        ``("needs", "a target without the port mux")``, ``("version", "--version 2 or 3")``
        (every version of the case). Empty when the case runs at one version at least. Every
        need together brings the case back; any one alone does not when there are several.

    No upstream counterpart: upstream has no conformance kit.
    """
    out: list[tuple[str, str]] = []
    if level is not None and case.level != level.upper():
        out.append(("level", f"--level {case.level.lower()}"))
    need = _missing_need(case, port_mux)
    if need is not None:
        out.append(("needs", need))
    if not set(case.versions) & set(versions):
        out.append(("version", "--version " + " or ".join(map(str, case.versions))))
    return out


def select_cases(cases: Iterable[Case], *, role: str, versions: Iterable[int],
                 patterns: Sequence[str] = (), level: str | None = None,
                 port_mux: bool = False) -> tuple[list[tuple[Case, int]], list[tuple[Case, str]]]:
    """Pick the ``(case, version)`` runs for a kit invocation.

    Args:
        cases: the catalogue.
        role: ``controller`` or ``relay``.
        versions: versions to run.
        patterns: shell globs on the case id (any matches; empty: every case).
        level: ``MUST`` or ``SHOULD`` to keep one level only (None: both).
        port_mux: the target serves the port mux (cases that need it are selected).

    Returns:
        ``(runs, not_selected)``: the runs in catalogue order (each case at each of its versions
        that was asked for), and the cases of the role left out with the reason (a need the
        target lacks), so a report can list them as not selected.

    No upstream counterpart: upstream has no conformance kit.
    """
    runs: list[tuple[Case, int]] = []
    skipped: list[tuple[Case, str]] = []
    wanted = tuple(versions)
    for c in matching_cases(cases, role=role, patterns=patterns):
        if level is not None and c.level != level.upper():
            continue
        need = _missing_need(c, port_mux)
        if need is not None:
            skipped.append((c, f"needs {need}"))
            continue
        runs += [(c, v) for v in wanted if v in c.versions]
    return runs, skipped

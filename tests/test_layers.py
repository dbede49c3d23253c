"""The package's layering, checked on its source with the standard library's ``ast``:

* wire knowledge lives in the codec: ``runner/``, ``fsm/`` and ``reduce/`` never use ``struct``,
  ``int.from_bytes``, ``new_mac`` or an auth-length constant (which bytes a tag covers is the
  codec's ``plans`` module's business);
* there is no import cycle between the package's modules (function-local imports included);
* no module is longer than 800 lines;
* ``docs/architecture.md`` names every module of the package in its ``## Modules`` section (a
  line each), and nothing that is not one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "flodl_proto"

#: names that carry wire layout or MAC coverage, forbidden outside the codec
WIRE_NAMES = frozenset({"struct", "from_bytes", "new_mac", "AUTH_TAG_LEN",
                        "MUX_AUTH_COVERED_HEADER_LEN"})
NO_WIRE_LAYERS = ("runner", "fsm", "reduce")
MAX_LINES = 800


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def wire_knowledge(source: str) -> list[str]:
    """Every use of a :data:`WIRE_NAMES` name in ``source``: imports, names, attributes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in WIRE_NAMES]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in WIRE_NAMES and node.level == 0:
                found.append(str(node.module))
            found += [a.name for a in node.names if a.name in WIRE_NAMES]
        elif isinstance(node, ast.Name) and node.id in WIRE_NAMES:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in WIRE_NAMES:
            found.append(node.attr)
    return found


def test_the_wire_check_sees_each_kind_of_use() -> None:
    assert wire_knowledge("import struct\nstruct.pack('<I', 1)") == ["struct", "struct"]
    assert wire_knowledge("n = int.from_bytes(b, 'little')") == ["from_bytes"]
    assert wire_knowledge("from ..codec.auth import new_mac\nm = new_mac(s)") == ["new_mac",
                                                                                 "new_mac"]
    assert wire_knowledge("from ..spec import AUTH_TAG_LEN as T") == ["AUTH_TAG_LEN"]
    assert wire_knowledge("x = spec.MUX_AUTH_COVERED_HEADER_LEN") == [
        "MUX_AUTH_COVERED_HEADER_LEN"]
    assert wire_knowledge("from ..codec.plans import frame_macs\nframe_macs(n, s)") == []


@pytest.mark.parametrize("layer", NO_WIRE_LAYERS)
def test_no_wire_knowledge_outside_the_codec(layer: str) -> None:
    offenders = {}
    for path in sorted((PKG / layer).rglob("*.py")):
        uses = wire_knowledge(path.read_text(encoding="utf-8"))
        if uses:
            offenders[str(path.relative_to(PKG))] = sorted(set(uses))
    assert not offenders, f"wire layout or MAC coverage outside the codec: {offenders}"


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports, anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & known
            out |= subs
            if target in known and len(subs) < len(node.names):  # names defined in target
                out.add(target)
    out.discard(name)
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk of ``graph`` (one per back edge)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycles.append([*stack[stack.index(m):], m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return cycles


def test_the_cycle_check_finds_a_cycle() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    mods = dict(_modules())
    known = set(mods)
    graph = {name: _imports(name, path, known) for name, path in mods.items()}
    assert graph["flodl_proto.errors"] == {"flodl_proto.spec"}
    # spec.py imports nothing of ours but four leaves (the reason-in-words helper, the rule
    # of how a number is written, the shapes of the spec files and their YAML loader) and the
    # checks across the spec's tables, which import only the shapes
    assert graph["flodl_proto.spec"] == {"flodl_proto._oserr", "flodl_proto._numbers",
                                         "flodl_proto._spec_shapes", "flodl_proto._spec_checks",
                                         "flodl_proto._yaml_loader"}, (
        "spec.py imports only leaves and _spec_checks")
    assert graph["flodl_proto._spec_checks"] == {"flodl_proto._spec_shapes"}
    assert graph["flodl_proto._oserr"] == set(), "_oserr.py must be a leaf"
    assert graph["flodl_proto._numbers"] == set(), "_numbers.py must be a leaf"
    assert graph["flodl_proto._unseen"] == set(), "_unseen.py must be a leaf"
    assert graph["flodl_proto._spec_shapes"] == set(), "_spec_shapes.py must be a leaf"
    assert graph["flodl_proto._yaml_loader"] == set(), "_yaml_loader.py must be a leaf"
    assert import_cycles(graph) == []


def test_no_module_over_800_lines() -> None:
    long = {name: n for name, path in _modules()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


ARCHITECTURE = PKG.parent / "docs" / "architecture.md"
#: folders of the package that hold data, listed as a whole (``_spec`` is the spec's copy in a
#: wheel, not in a checkout)
DATA_DIRS = ("_vectors", "_spec")


def package_files() -> set[str]:
    """Every file of the package, as its path under ``flodl_proto/`` (``codec/stream.py``): the
    modules, the Lua runtime, ``py.typed``; a data folder as itself (``_vectors/``)."""
    found = set()
    for path in PKG.rglob("*"):
        rel = path.relative_to(PKG)
        if "__pycache__" in rel.parts or not path.is_file():
            continue
        found.add(f"{rel.parts[0]}/" if rel.parts[0] in DATA_DIRS else rel.as_posix())
    return found


def modules_listed(text: str) -> list[str]:
    """The first cell of each table row of the ``## Modules`` section of ``text``, the
    architecture document: ``| `codec/stream.py` | ... |`` gives ``codec/stream.py``."""
    _, found, rest = text.partition("\n## Modules\n")
    assert found, "docs/architecture.md has no '## Modules' section"
    section = rest.split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)


def unlisted(text: str) -> tuple[list[str], list[str], list[str]]:
    """What the ``## Modules`` section of ``text`` gets wrong: the package's files it does not
    name, the names that are no file of the package, and the names given twice."""
    listed = modules_listed(text)
    files = package_files()
    twice = sorted({m for m in listed if listed.count(m) > 1})
    return sorted(files - set(listed)), sorted(set(listed) - files), twice


def test_the_module_list_check_sees_a_missing_and_a_stale_line() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    row = "| `runner/_netio_recv.py` |"
    assert row in text
    without = "\n".join(line for line in text.splitlines() if not line.startswith(row))
    assert unlisted(without) == (["runner/_netio_recv.py"], [], [])
    stale = text.replace(row, "| `runner/_netio_gone.py` |", 1)
    assert unlisted(stale) == (["runner/_netio_recv.py"], ["runner/_netio_gone.py"], [])
    twice = text.replace("| `runner/_netio_send.py` |", row, 1)
    assert unlisted(twice) == (["runner/_netio_send.py"], [], ["runner/_netio_recv.py"])


def test_the_architecture_document_names_every_module_once() -> None:
    """A module added, renamed or removed without its line in ``docs/architecture.md``'s
    ``## Modules`` section fails here (the section had no line for a dozen modules)."""
    missing, stale, twice = unlisted(ARCHITECTURE.read_text(encoding="utf-8"))
    assert missing == [], f"modules with no line in docs/architecture.md '## Modules': {missing}"
    assert stale == [], f"lines of docs/architecture.md '## Modules' for no module: {stale}"
    assert twice == [], f"modules listed twice in docs/architecture.md '## Modules': {twice}"

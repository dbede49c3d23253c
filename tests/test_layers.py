"""The package's layering, checked on its source with the standard library's ``ast``:

* wire knowledge lives in the codec: ``runner/``, ``fsm/`` and ``reduce/`` never use ``struct``,
  ``int.from_bytes``, ``new_mac`` or an auth-length constant (which bytes a tag covers is the
  codec's ``plans`` module's business);
* there is no import cycle between the package's modules (function-local imports included);
* no module is longer than 800 lines.
"""

from __future__ import annotations

import ast
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
    # spec.py imports nothing of ours but two leaves: the reason-in-words helper and the rule
    # of how a number is written
    assert graph["flodl_proto.spec"] == {"flodl_proto._oserr", "flodl_proto._numbers"}, (
        "spec.py imports only leaves")
    assert graph["flodl_proto._oserr"] == set(), "_oserr.py must be a leaf"
    assert graph["flodl_proto._numbers"] == set(), "_numbers.py must be a leaf"
    assert graph["flodl_proto._unseen"] == set(), "_unseen.py must be a leaf"
    assert import_cycles(graph) == []


def test_no_module_over_800_lines() -> None:
    long = {name: n for name, path in _modules()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"

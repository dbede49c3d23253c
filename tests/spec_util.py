"""A copy of the checkout's spec with one constant changed, for the tests that run the package
under ``FLODL_PROTO_SPEC_DIR`` to show that a figure comes from the spec."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spec_with_constant(tmp_path: Path, name: str, old: int, new: int) -> Path:
    """The folder ``tmp_path/spec``: the checkout's ``spec/`` with the constant ``name``'s
    ``value: old`` in ``wire.yaml`` made ``value: new`` (the text must stand there once, so a
    spec that moved it fails here, not in the test's own assertions)."""
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "spec", spec_dir)
    wire = spec_dir / "wire.yaml"
    text = wire.read_text(encoding="utf-8")
    entry = f"  {name}:\n    value: {old}\n"
    assert text.count(entry) == 1, entry
    wire.write_text(text.replace(entry, f"  {name}:\n    value: {new}\n"), encoding="utf-8")
    return spec_dir

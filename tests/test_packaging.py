"""Packaging: the wheel carries the spec and the bundled vectors, and loads them."""

from __future__ import annotations

import filecmp
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flodl_proto.commands.vectors import BUNDLED_VECTORS

from .conftest import ROOT, vectors_root


def _same_tree(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b)
    diffs = [f"{a}/{n}" for n in cmp.left_only + cmp.right_only + cmp.diff_files]
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    diffs += [f"{a}/{n}" for n in mismatch + errors]
    for sub in cmp.common_dirs:
        diffs += _same_tree(a / sub, b / sub)
    return diffs


def test_bundled_vectors_equal_shared_vectors() -> None:
    shared = ROOT.parent / "shared" / "vectors"
    if not shared.is_dir():
        pytest.skip("../shared/vectors is not present beside this checkout")
    assert _same_tree(BUNDLED_VECTORS, shared) == []


def test_vectors_root_default() -> None:
    assert vectors_root().name == "vectors"


@pytest.mark.timeout(300)
def test_wheel_carries_spec_and_loads_it(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        check=True,
    )
    (wheel,) = out.glob("flodl_proto-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    assert "flodl_proto/_spec/wire.yaml" in names
    assert "flodl_proto/_spec/lifecycle.yaml" in names
    assert "flodl_proto/_vectors/manifest.json" in names
    assert "flodl_proto/py.typed" in names
    probe = (
        "import flodl_proto.spec as s, sys; "
        "print(s.SPEC.path); print(s.ROUND_FRAME_MAGIC)"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
    )
    spec_dir, magic = res.stdout.split()
    assert Path(spec_dir) == tmp_path / "site" / "flodl_proto" / "_spec"
    assert int(magic) == 0xF10D17F1

"""Packaging: the wheel carries the spec and the bundled vectors, and loads them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flodl_proto.commands.vectors import BUNDLED_VECTORS
from flodl_proto.errors import shown, shown_name

from .conftest import ROOT, vectors_root


def test_vectors_root_default_is_the_bundled_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing outside the checkout is read: a bare clone runs the vector tests on the copy
    bundled in the package."""
    monkeypatch.delenv("FLODL_VECTORS", raising=False)
    assert vectors_root() == ROOT / "flodl_proto" / "_vectors" == BUNDLED_VECTORS
    monkeypatch.setenv("FLODL_VECTORS", "/elsewhere")
    assert vectors_root() == Path("/elsewhere")


def _vectors_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flodl_proto.cli", "vectors", *args],
                          capture_output=True, text=True, timeout=120)


def test_vectors_compare(tmp_path: Path) -> None:
    """``vectors compare DIR`` (what CI runs on the shared vectors): 0 for an identical tree,
    1 naming each differing file, 2 for a missing folder."""
    copy = tmp_path / "v"
    shutil.copytree(BUNDLED_VECTORS, copy)
    res = _vectors_cli("compare", str(copy))
    assert (res.returncode, res.stdout.splitlines()[-1]) == (
        0, f"{shown(str(copy))} is identical to {shown(str(BUNDLED_VECTORS))}")
    (copy / "v2" / "handshake.json").write_text("{}", encoding="utf-8")
    (copy / "extra.json").write_text("{}", encoding="utf-8")
    res = _vectors_cli("compare", str(copy))
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        f"only in {shown_name(str(copy))}: extra.json", "differs: v2/handshake.json",
        f"{shown(str(copy))} differs from {shown(str(BUNDLED_VECTORS))} (2 files)"]
    (copy / "extra.json").unlink()
    (copy / "bf16.json").unlink()  # a file missing from DIR was listed as "differs" too
    res = _vectors_cli("compare", str(copy))
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        f"only in {shown_name(str(BUNDLED_VECTORS))}: bf16.json", "differs: v2/handshake.json",
        f"{shown(str(copy))} differs from {shown(str(BUNDLED_VECTORS))} (2 files)"]
    res = _vectors_cli("compare", str(tmp_path / "absent"))
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", "flodl-proto vectors compare: error: argument DIR: "
              f"{shown(str(tmp_path / 'absent'))}: does not exist\n")


def test_vectors_check_unusable_folder_is_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``vectors check`` on a folder or file it cannot use: one line naming it, exit 2 (as the
    other input paths), nothing run and nothing on stdout, even after a good folder."""
    from flodl_proto.cli import main

    empty = tmp_path / "empty"
    (empty / "v2").mkdir(parents=True)
    (empty / "manifest.json").write_text('{"total_cases": 0}', encoding="utf-8")
    a_file = tmp_path / "a-file"
    a_file.write_text("", encoding="utf-8")
    bad = tmp_path / "bad"
    bad.mkdir()
    for path, why in ((empty, f"argument PATH: {shown(str(empty))}: no vectors found under "
                              "it"),
                      (tmp_path / "absent",
                       f"argument PATH: {shown(str(tmp_path / 'absent'))}: does not exist"),
                      (a_file, f"{shown(str(a_file))}: not a vector file (Expecting "
                               "value: line 1 column 1 (char 0))"),
                      (bad, f"{shown(str(bad / 'x.json'))}: not a vector file (no key "
                            "'protocol_version')")):
        (bad / "x.json").write_text("{}", encoding="utf-8")
        assert main(["vectors", "check", str(BUNDLED_VECTORS), str(path)]) == 2
        assert capsys.readouterr() == ("", f"flodl-proto vectors check: error: {why}\n")


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
    # installed from the wheel, run in a checkout whose spec was edited afterwards: docs --check
    # reads that checkout's spec and says the document is out of date
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "spec", checkout / "spec")
    shutil.copytree(ROOT / "docs", checkout / "docs")
    wire = checkout / "spec" / "wire.yaml"
    wire.write_text(wire.read_text(encoding="utf-8").replace("\ntitle: ", "\ntitle: edited ", 1),
                    encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "flodl_proto", "docs", "--check"], capture_output=True,
        text=True, cwd=checkout,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 1 and "up to date" not in res.stdout + res.stderr
    assert res.stderr.startswith(
        "flodl-proto docs: error: 'docs/protocol.md': out of date (spec: spec/wire.yaml)")


#: what the tools and the usual set-ups leave in a checkout: virtual environments under their
#: usual names, fuzz/run.sh's default work folder, mutmut's, coverage's, the tools' caches
_LEFT_IN_A_CHECKOUT = (
    ".venv/bin/python", ".ci/.venv/bin/python", ".venv-3.12/bin/python", "venv/bin/python",
    "env/bin/python", "ENV/bin/python", "fuzz/.work/corpus/handshake/x", "mutants/x.py",
    ".coverage", ".coverage.host.1234.567", "coverage.xml", "htmlcov/index.html",
    ".hypothesis/examples/x", ".pytest_cache/v/x", ".mypy_cache/x", ".ruff_cache/x",
    "flodl_proto/__pycache__/cli.cpython-311.pyc", "flodl_proto.egg-info/PKG-INFO",
    "build/lib/x", "dist/x.whl", "fuzz/crash-0a1b",
)


def test_what_the_tools_leave_in_a_checkout_is_ignored() -> None:
    """A venv named ``venv``, ``env`` or ``.venv-3.12`` (only ``.venv`` was ignored), the fuzz
    work folder and the coverage files showed as untracked files; ``tools/mutate.sh`` copies a
    checkout's untracked files, a whole venv included."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout, or no git")
    res = subprocess.run([git, "check-ignore", "--no-index", "--verbose", "--non-matching",
                          *_LEFT_IN_A_CHECKOUT], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    not_ignored = [line.split("\t")[1] for line in res.stdout.splitlines()
                   if line.startswith("::")]
    assert not_ignored == []
    assert res.returncode == 0
    # a package folder of that name is not a venv: only the top-level env/ and ENV/ are ignored
    res = subprocess.run([git, "check-ignore", "--no-index", "flodl_proto/env/x.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (1, "")

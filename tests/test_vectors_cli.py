"""``flodl-proto vectors check``: a failed check ends with one error line on stderr (how many
vectors failed of how many, which count differs from its manifests) and exit 1; a passed one
writes nothing on stderr."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flodl_proto.commands.vectors import BUNDLED_VECTORS
from flodl_proto.errors import shown, shown_name
from flodl_proto.interop.vectors import iter_cases

from .cli_util import run_main

_PROG = "flodl-proto vectors check"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the bundled vectors."""
    shutil.copytree(BUNDLED_VECTORS, tmp_path / "vectors")
    return tmp_path / "vectors"


def _break(path: Path, case_id: str) -> None:
    """Make case ``case_id`` of the vector file ``path`` expect bytes no encoder writes."""
    doc = json.loads(path.read_text())
    (case,) = [c for c in doc["cases"] if c["id"] == case_id]
    case["bytes"] = "00000000"
    path.write_text(json.dumps(doc))


def _declare(folder: Path, extra: int) -> None:
    """Add ``extra`` to the case count the top-level manifest of ``folder`` declares."""
    manifest = folder / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["total_cases"] += extra
    manifest.write_text(json.dumps(doc))


def _count(folder: Path) -> int:
    return sum(1 for _ in iter_cases(folder))


def test_a_passed_check_writes_nothing_on_stderr(capsys: pytest.CaptureFixture[str],
                                                 folder: Path) -> None:
    code, out, err = run_main(capsys, "vectors", "check", str(folder))
    assert (code, err) == (0, "")
    assert f"total: {_count(folder)}/{_count(folder)} passed" in out


def test_failed_vectors_are_one_error_line_with_how_many_of_how_many(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    _break(folder / "channel_magic.json", "channel_magic/write/data")
    _break(folder / "v2" / "channel_magic.json", "v2/channel_magic/write/data")
    n = _count(folder)
    code, out, err = run_main(capsys, "vectors", "check", str(folder))
    assert code == 1
    assert err == f"{_PROG}: error: 2 of {n} vectors failed\n"
    assert f"  total: {n - 2}/{n} passed; manifests declare {n}" in out.splitlines()


def test_a_case_of_an_op_not_implemented_is_counted_apart_from_failures(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """Its table row said ``fail 0  n/i 1`` and the line under it "1 failing", the error line
    "1 of N vectors failed"."""
    path = folder / "channel_magic.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["cases"][0]["op"] = "channel_magic.zz"
    case_id = doc["cases"][0]["id"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    n = _count(folder)
    code, out, err = run_main(capsys, "vectors", "check", str(folder))
    assert code == 1
    assert err == f"{_PROG}: error: 1 of {n} vectors of an op not implemented\n"
    assert (f"  1 not passing (first: {case_id}: op channel_magic.zz not implemented); -v lists "
            "all") in out.splitlines()
    _break(folder / "v2" / "channel_magic.json", "v2/channel_magic/write/data")
    code, out, err = run_main(capsys, "vectors", "check", str(folder))
    assert err == (f"{_PROG}: error: 1 of {n} vectors failed; 1 of {n} vectors of an op not "
                   "implemented\n")


@pytest.mark.parametrize(("case_id", "shown"), [
    ("", "''"),
    ("i" * 3000, f"'{'i' * 40}...{'i' * 20}' (3000 characters)"),
], ids=["empty", "long"])
def test_a_failed_case_s_line_quotes_an_id_that_is_not_plain(
        capsys: pytest.CaptureFixture[str], folder: Path, case_id: str, shown: str) -> None:
    """``FAIL ID: ...`` printed an empty id as ``FAIL : ...`` and a long one whole; each is
    quoted as ``vectors check`` quotes an id elsewhere."""
    path = folder / "channel_magic.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["cases"][0]["op"] = "channel_magic.zz"
    doc["cases"][0]["id"] = case_id
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, out, _ = run_main(capsys, "vectors", "check", "-v", str(folder))
    assert code == 1
    assert f"  FAIL {shown}: op channel_magic.zz not implemented" in out.splitlines()


def test_the_line_counts_the_vectors_of_every_folder(capsys: pytest.CaptureFixture[str],
                                                     folder: Path, tmp_path: Path) -> None:
    shutil.copytree(folder, tmp_path / "good")
    _break(folder / "channel_magic.json", "channel_magic/write/join")
    n = _count(folder) + _count(tmp_path / "good")
    code, _, err = run_main(capsys, "vectors", "check", str(tmp_path / "good"), str(folder))
    assert (code, err) == (1, f"{_PROG}: error: 1 of {n} vectors failed\n")


def test_a_count_that_differs_from_the_manifests_is_named(capsys: pytest.CaptureFixture[str],
                                                          folder: Path) -> None:
    n = _count(folder)
    _declare(folder, 1)
    code, _, err = run_main(capsys, "vectors", "check", str(folder))
    assert (code, err) == (1, f"{_PROG}: error: {shown(str(folder))}: {n} vectors found "
                              f"where its manifests declare {n + 1}\n")
    _break(folder / "channel_magic.json", "channel_magic/write/data")
    code, _, err = run_main(capsys, "vectors", "check", str(folder))
    assert (code, err) == (1, f"{_PROG}: error: 1 of {n} vectors failed; "
                              f"{shown(str(folder))}: {n} vectors found where its "
                              f"manifests declare {n + 1}\n")


def test_a_count_that_differs_names_the_folder_quoted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``PATH: N vectors found where its manifests declare M`` showed the folder bare unless
    it held a line break or an escape (``it's here: 370 vectors found ...``); it is quoted as
    on every line naming a path of the command line (``argument PATH: 'x': does not exist``),
    while the table's heading on stdout keeps the name as it is."""
    shutil.copytree(BUNDLED_VECTORS, tmp_path / "it's here")
    monkeypatch.chdir(tmp_path)
    folder = Path("it's here")
    n = _count(folder)
    _declare(folder, 1)
    code, out, err = run_main(capsys, "vectors", "check", "it's here")
    assert out.splitlines()[0] == "it's here"
    assert (code, err) == (1, f"{_PROG}: error: \"it's here\": {n} vectors found where its "
                              f"manifests declare {n + 1}\n")


def test_a_missing_manifest_is_named_in_the_line(capsys: pytest.CaptureFixture[str],
                                                 folder: Path) -> None:
    n = _count(folder)
    declared = json.loads((folder / "manifest.json").read_text())["total_cases"]
    (folder / "v2" / "manifest.json").unlink()
    code, _, err = run_main(capsys, "vectors", "check", str(folder))
    assert (code, err) == (1, f"{_PROG}: error: {shown(str(folder))}: {n} vectors found "
                              f"where its manifests declare {declared} (no "
                              f"{shown_name(str(folder / 'v2' / 'manifest.json'))})\n")


@pytest.mark.parametrize(("name", "shown"), [
    ("d" * 200, f"'{'d' * 40}...{'d' * 20}' (200 characters)"),
    ("a\nb", "'a\\nb'"),
], ids=["long", "line-break"])
def test_a_folder_path_is_named_in_one_bounded_line(
        capsys: pytest.CaptureFixture[str], name: str, shown: str) -> None:
    """A folder path of thousands of characters (or one with a line break) was printed whole
    (raw) in ``vectors check``'s error line; it is quoted as a long value is, by its ends and
    its length (a line break escaped)."""
    code, out, err = run_main(capsys, "vectors", "check", name)
    assert (code, out, err) == (2, "", f"{_PROG}: error: argument PATH: {shown}: does not exist\n")
    code, out, err = run_main(capsys, "vectors", "compare", name)
    assert (code, out, err) == (2, "", f"flodl-proto vectors compare: error: argument DIR: "
                                       f"{shown}: does not exist\n")


def test_the_bundled_folder_unusable_is_not_named_as_a_path_of_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With no PATH, the bundled copy is checked: a copy that is missing (a broken install) is
    not an ``argument PATH:`` error, no PATH having been given."""
    from flodl_proto.commands import vectors

    monkeypatch.setattr(vectors, "BUNDLED_VECTORS", tmp_path / "gone")
    code, out, err = run_main(capsys, "vectors", "check")
    assert (code, out, err) == (
        2, "", f"{_PROG}: error: {shown(str(tmp_path / 'gone'))}: does not exist\n")


def test_a_long_folder_path_is_named_by_its_ends_in_every_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder of a path of more than 80 characters was printed whole in the table's heading
    and in the error lines naming it or a file of it; it is quoted by its ends and length."""
    folder = tmp_path / ("v" * 100)
    shutil.copytree(BUNDLED_VECTORS, folder)
    n = _count(folder)
    text = str(folder)
    named = f"'{text[:40]}...{'v' * 20}' ({len(text)} characters)"
    _declare(folder, 1)
    code, out, err = run_main(capsys, "vectors", "check", str(folder))
    assert out.splitlines()[0] == named
    assert (code, err) == (1, f"{_PROG}: error: {named}: {n} vectors found where its manifests "
                              f"declare {n + 1}\n")
    (folder / "bf16.json").write_text("[]")
    code, out, err = run_main(capsys, "vectors", "check", str(folder))
    file_named = f"'{text[:40]}...{'v' * 10}/bf16.json' ({len(text) + 10} characters)"
    assert (code, out, err) == (2, "", f"{_PROG}: error: {file_named}: not a vector file (a JSON "
                                       "array, not an object)\n")


# -- a single vector file -------------------------------------------------------------------------


def _declared(manifest: Path, stem: str) -> int:
    return int(json.loads(manifest.read_text())["files"][stem]["cases"])


def test_a_single_vector_file_is_checked_against_its_manifest_entry(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """``vectors check FILE.json`` refused the file ("not a directory"); it runs that file's
    cases, its count checked against the entry the manifest beside it has for it."""
    path = folder / "v2" / "handshake.json"
    n = sum(1 for _ in json.loads(path.read_text())["cases"])
    assert n == _declared(folder / "v2" / "manifest.json", "handshake")
    code, out, err = run_main(capsys, "vectors", "check", str(path))
    assert (code, err) == (0, "")
    assert out.splitlines() == [shown_name(str(path)),
                                f"  {'file':<28} {'pass':>5} {'fail':>5} {'n/i':>5}",
                                f"  {'handshake':<28} {n:>5} {0:>5} {0:>5}",
                                f"  total: {n}/{n} passed; manifest declares {n}"]
    _break(folder / "channel_magic.json", "channel_magic/write/data")
    m = _declared(folder / "manifest.json", "channel_magic")
    code, _, err = run_main(capsys, "vectors", "check", str(path),
                            str(folder / "channel_magic.json"))
    assert (code, err) == (1, f"{_PROG}: error: 1 of {n + m} vectors failed\n")


def test_a_single_file_whose_count_cannot_be_checked_is_named(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    path = folder / "bf16.json"
    n = _declared(folder / "manifest.json", "bf16")
    manifest = folder / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["files"]["bf16"]["cases"] = n + 1
    manifest.write_text(json.dumps(doc))
    code, _, err = run_main(capsys, "vectors", "check", str(path))
    assert (code, err) == (1, f"{_PROG}: error: {shown(str(path))}: {n} vectors found "
                              f"where its manifest declares {n + 1}\n")
    del doc["files"]["bf16"]
    manifest.write_text(json.dumps(doc))
    code, out, err = run_main(capsys, "vectors", "check", str(path))
    why = f"no entry for bf16 in {shown_name(str(manifest))}"
    assert f"  {why}: the count of its cases cannot be checked" in out.splitlines()
    assert (code, err) == (1, f"{_PROG}: error: {shown(str(path))}: {n} vectors found "
                              f"where its manifest declares 0 ({why})\n")
    manifest.unlink()
    code, _, err = run_main(capsys, "vectors", "check", str(path))
    assert (code, err) == (1, f"{_PROG}: error: {shown(str(path))}: {n} vectors found "
                              f"where its manifest declares 0 (no {shown_name(str(manifest))})\n")


def test_a_manifest_given_alone_names_its_folder(capsys: pytest.CaptureFixture[str],
                                                 folder: Path) -> None:
    manifest = folder / "v2" / "manifest.json"
    code, out, err = run_main(capsys, "vectors", "check", str(manifest))
    assert (code, out, err) == (2, "", f"{_PROG}: error: argument PATH: "
                                       f"{shown(str(manifest))}: a manifest, "
                                       "not a vector file: give its folder "
                                       f"({shown_name(str(folder / 'v2'))}) or one of the "
                                       "vector files beside it\n")


# -- a line about a file itself quotes it, as every line about a path of the command line ---------
def test_a_file_that_is_not_a_vector_file_is_named_quoted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``vectors check`` of a file that is no vector file named it bare (``bad.json: not a
    vector file (...)``) where ``argument PATH: 'x': does not exist`` and ``decode FILE`` quote
    the path; a file of a folder given, and a manifest, are named quoted too."""
    monkeypatch.chdir(tmp_path)
    Path("bad.json").write_text("{}", encoding="utf-8")
    assert run_main(capsys, "vectors", "check", "bad.json") == (
        2, "", f"{_PROG}: error: 'bad.json': not a vector file (no key 'protocol_version')\n")
    Path("my vectors").mkdir()
    Path("my vectors/x.json").write_text("[]", encoding="utf-8")
    assert run_main(capsys, "vectors", "check", "my vectors") == (
        2, "", f"{_PROG}: error: 'my vectors/x.json': not a vector file (a JSON array, not an "
               "object)\n")
    shutil.copytree(BUNDLED_VECTORS, "v")
    Path("v/v2/manifest.json").write_text('{"total_cases": "9"}', encoding="utf-8")
    assert run_main(capsys, "vectors", "check", "v") == (
        2, "", f"{_PROG}: error: 'v/v2/manifest.json': not a manifest (total_cases '9' is not a "
               "whole number >= 0)\n")


def test_a_file_of_a_folder_that_cannot_be_read_is_named_quoted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A vector file of a folder given that cannot be opened (here a loop of symbolic links)
    read ``vl/x.json: Too many levels of symbolic links``, bare; it reads as ``decode FILE``'s
    line for such a path, quoted and the loop named."""
    monkeypatch.chdir(tmp_path)
    Path("vl").mkdir()
    Path("vl/x.json").symlink_to("x.json")
    assert run_main(capsys, "vectors", "check", "vl") == (
        2, "", f"{_PROG}: error: 'vl/x.json': Too many levels of symbolic links (vl/x.json is a "
               "loop of symbolic links)\n")

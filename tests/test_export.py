"""``flodl-proto vectors export``: this implementation's vectors, in the shared schema, pass
``vectors check``; they are deterministic; their error prefixes are portable."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.cli import main
from flodl_proto.codec import handshake as hs
from flodl_proto.codec import loopback
from flodl_proto.codec.mux import decode_mux_record_or_eos
from flodl_proto.codec.round_frame import decode_round_frame_or_eos
from flodl_proto.commands.vectors import check_folders
from flodl_proto.errors import ProtocolError, shown, shown_name
from flodl_proto.interop.export import EXPORTED_FILES, SCHEMA, export_vectors, portable_prefix
from flodl_proto.interop.vectors import iter_cases, manifest_total

from .cli_util import run_main
from .conftest import vectors_root


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    export_vectors(root)
    return root


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def test_layout_and_manifests(exported: Path) -> None:
    for folder, version in ((exported, 3), (exported / "v2", 2)):
        names = sorted(p.stem for p in folder.glob("*.json"))
        assert names == sorted([*EXPORTED_FILES, "manifest"])
        manifest = _load(folder / "manifest.json")
        assert manifest["schema"] == SCHEMA and manifest["protocol_version"] == version
        total = 0
        for name in EXPORTED_FILES:
            doc = _load(folder / f"{name}.json")
            assert doc["schema"] == SCHEMA and doc["file"] == name
            assert doc["protocol_version"] == version
            counts = manifest["files"][name]
            assert counts["cases"] == len(doc["cases"])
            assert counts["ok"] == sum(c["expect"] == "ok" for c in doc["cases"])
            assert counts["ok"] + counts["not_ok"] == counts["cases"]
            total += counts["cases"]
            for c in doc["cases"]:
                assert c["id"].startswith("v2/" if version == 2 else name + "/")
                assert c["expect"] in ("ok", "error", "eof")
                if c["expect"] == "error":
                    assert c["error"].startswith(c["error_prefix"]) and c["error_prefix"]
        assert manifest["total_cases"] == total


def test_ids_unique_and_all_verdicts_present(exported: Path) -> None:
    ids: list[str] = []
    verdicts: set[tuple[str, str]] = set()
    for folder in (exported, exported / "v2"):
        for name in EXPORTED_FILES:
            for c in _load(folder / f"{name}.json")["cases"]:
                ids.append(c["id"])
                verdicts.add((name, c["expect"]))
    assert len(ids) == len(set(ids))
    for name in EXPORTED_FILES:
        assert (name, "ok") in verdicts and (name, "error") in verdicts
    for name in ("round_frame", "mux_record", "len_framed"):
        assert (name, "eof") in verdicts


def test_vectors_check_passes_on_export(exported: Path) -> None:
    out = io.StringIO()
    assert check_folders([exported], verbose=True, out=out) == 0, out.getvalue()
    assert "FAIL" not in out.getvalue()


def test_cli_export_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vectors", "export", str(tmp_path)]) == 0
    assert main(["vectors", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "manifests declare" in out


def test_a_missing_manifest_or_a_wrong_count_says_why_the_check_failed(
        exported: Path, tmp_path: Path) -> None:
    # a folder without its manifest.json failed with only "manifests declare 0" to go on
    folder = tmp_path / "vectors"
    shutil.copytree(exported, folder)
    (folder / "v2" / "manifest.json").unlink()
    out = io.StringIO()
    assert check_folders([folder], out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[-1] == (f"  no {shown_name(str(folder / 'v2' / 'manifest.json'))}: the count "
                         "of its cases cannot be checked")
    assert not any("cases found where" in line for line in lines)
    shutil.copy(exported / "v2" / "manifest.json", folder / "v2" / "manifest.json")
    assert check_folders([folder], out=io.StringIO()) == 0
    (folder / "v2" / "handshake.json").unlink()  # its cases are gone, the manifest counts them
    out = io.StringIO()
    assert check_folders([folder], out=out) == 1
    found, declared = sum(1 for _ in iter_cases(folder)), manifest_total(folder)
    assert found < declared
    assert out.getvalue().splitlines()[-1] == (
        f"  {found} cases found where the manifests declare {declared}")


def test_cli_export_creates_missing_parents(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out" / "vectors"
    assert main(["vectors", "export", str(target)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"{shown(str(target))}: ")
    assert (target / "v2").is_dir()


def test_cli_export_under_a_file_is_a_usage_error_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file where a folder of ``DIR`` should be is refused with the command line, as every
    other output path is (exit 2, ``argument DIR: ...``); it was found as the first file was
    written (exit 1, ``cannot write DIR: Not a directory``)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / "vectors"
    assert run_main(capsys, "vectors", "export", str(target)) == (
        2, "", f"flodl-proto vectors export: error: argument DIR: {shown(str(target))}: Not a "
               f"directory ({blocker} is a file, not a folder)\n")
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("below", ["", "vectors"])
def test_cli_export_through_a_link_to_nothing_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], below: str) -> None:
    """A symbolic link to nothing where a folder of ``DIR`` should be is named for what it
    is, as docs --out names it; the line read 'cannot write LINK: Not a directory' (mkdir's
    'File exists' taken for a file in the way). The link is left as it was."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    target = link / below if below else link
    assert run_main(capsys, "vectors", "export", str(target)) == (
        1, "", f"flodl-proto vectors export: error: cannot write {shown(str(target))}: creating "
               f"the folder {link}: No such file or directory (a symbolic link to nothing)\n")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_export_is_deterministic(exported: Path, tmp_path: Path) -> None:
    export_vectors(tmp_path)
    for rel in sorted(p.relative_to(exported) for p in exported.rglob("*.json")):
        assert (tmp_path / rel).read_bytes() == (exported / rel).read_bytes(), rel


def test_version_specific_content(exported: Path) -> None:
    v3 = {c["id"]: c for c in _load(exported / "mux_record.json")["cases"]}
    v2 = {c["id"]: c for c in _load(exported / "v2" / "mux_record.json")["cases"]}
    h3 = v3["mux_record/roundtrip/control-hello-h0/salt-zero"]
    h2 = v2["v2/mux_record/roundtrip/control-hello-h0/salt-zero"]
    assert h3["bincode"] == "0002683002000100" and h2["bincode"] == "00026830020001"
    assert "model_sigs" in h3["record"]["control"]
    assert "model_sigs" not in h2["record"]["control"]
    hs3 = {c["id"]: c for c in _load(exported / "handshake.json")["cases"]}
    assert hs3["handshake/rank_write/r3-ws4"]["bytes"] == "c0170df1030000000300000004000000"
    rf2 = _load(exported / "v2" / "round_frame.json")["cases"]
    for c in rf2:  # no elided tensor with elements in a positive version-2 roundtrip
        if c["op"] == "round_frame.roundtrip":
            for t in c["frame"]["tensors"]:
                assert not (t["elided"] and 0 not in t["shape"] and t["shape"] != [])


def _run_error(case: dict[str, Any], version: int) -> ProtocolError | None:
    b = bytes.fromhex(case.get("bytes", ""))
    salt = bytes.fromhex(case["salt"]) if "salt" in case else b""
    op = case["op"]
    try:
        if op == "handshake.read":
            hs.decode_handshake(b, case["expected_world_size"], version)
        elif op == "handshake.ack_read":
            hs.decode_ack(b, version)
        elif op == "channel_magic.expect":
            hs.expect_channel_magic(b, int(case["expected"], 16), case["what"])
        elif op == "round_frame.read":
            decode_round_frame_or_eos(b, salt)
        elif op == "mux_record.read":
            decode_mux_record_or_eos(b, salt, version=version)
        elif op == "len_framed.read":
            loopback.decode_len_framed_or_eos(b)
        elif op == "framed_round.read":
            loopback.decode_framed_round_or_eos(b, salt)
        else:
            return None
    except ProtocolError as e:
        return e
    return None


def _shared_error_cases() -> list[tuple[int, dict[str, Any]]]:
    root = vectors_root()
    if not root.is_dir():  # the copy of the shared vectors bundled in the package
        root = Path(__file__).resolve().parent.parent / "flodl_proto" / "_vectors"
    out: list[tuple[int, dict[str, Any]]] = []
    for folder, version in ((root, 3), (root / "v2", 2)):
        for name in EXPORTED_FILES:
            path = folder / f"{name}.json"
            if path.is_file():
                out += [(version, c) for c in _load(path)["cases"] if c["expect"] == "error"]
    return out


SHARED_ERRORS = _shared_error_cases()


@pytest.mark.parametrize(("version", "case"), SHARED_ERRORS,
                         ids=[c["id"] for _, c in SHARED_ERRORS])
def test_portable_prefix_is_a_prefix_of_upstreams_message(version: int,
                                                          case: dict[str, Any]) -> None:
    """The prefix this package exports for an error is a prefix of upstream's full message
    for the same input (the shared vectors carry upstream's messages)."""
    err = _run_error(case, version)
    assert err is not None, f"{case['id']}: no error raised"
    prefix = portable_prefix(err)
    assert prefix and case["error"].startswith(prefix), (prefix, case["error"])


def test_export_write_that_fails_midway_leaves_the_old_file(tmp_path: Path) -> None:
    """``vectors export`` over a folder of older vectors, in a process that cannot write more
    than 4 KiB to a file (as a full disk): ``handshake.json``, the first file written, fails
    partway. It must be as it was, with no temporary file beside it; one line, exit 1."""
    from .conftest import run_with_file_size_limit

    old = b"the previous handshake.json\n"
    (tmp_path / "handshake.json").write_bytes(old)
    res = run_with_file_size_limit(["vectors", "export", str(tmp_path)], 4096)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == f"flodl-proto vectors export: error: cannot write " \
                         f"{shown(str(tmp_path / 'handshake.json'))}: File too large\n"
    assert (tmp_path / "handshake.json").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["handshake.json"]


def test_export_into_a_file_is_not_a_directory(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """DIR that is a file: ``Not a directory`` (it said ``File exists``), as a file in the
    path's folders, refused with the command line (exit 2)."""
    target = tmp_path / "a-file"
    target.write_text("not a folder")
    assert run_main(capsys, "vectors", "export", str(target)) == (
        2, "", f"flodl-proto vectors export: error: argument DIR: {shown(str(target))}: Not a "
               f"directory ({target} is a file, not a folder)\n")


def test_a_failed_export_removes_the_folders_it_created(tmp_path: Path) -> None:
    """A full disk (a 4 KiB file size limit) at the first file of a new ``DIR``: the folders
    the export made (``DIR`` and its missing parents) are gone again; one line, exit 1."""
    from .conftest import run_with_file_size_limit

    target = tmp_path / "new" / "vectors"
    res = run_with_file_size_limit(["vectors", "export", str(target)], 4096)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == f"flodl-proto vectors export: error: cannot write " \
                         f"{shown(str(target / 'handshake.json'))}: File too large\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("named", "shown_as"), [
    (True, "\"it's here/handshake.json\""),  # the file the error names
    (False, "\"it's here\""),  # none named: DIR
])
def test_export_that_cannot_be_written_names_the_path_quoted(
        named: bool, shown_as: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``cannot write PATH: WHY`` showed the path bare unless it held a line break or an escape
    (``cannot write it's here/handshake.json: ...``); it is quoted as on every line naming a
    path of the command line (``argument DIR: 'PATH': ...``), the file the error names (a path
    object or bytes, as the file system names it) or else DIR."""
    import errno
    import os

    from flodl_proto.interop import export

    def no_space(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([path] if named else []))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(export, "replace_file", no_space)
    assert run_main(capsys, "vectors", "export", "it's here") == (
        1, "", f"flodl-proto vectors export: error: cannot write {shown_as}: No space left on "
               "device\n")


def test_export_and_compare_result_lines_name_the_folder_quoted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``vectors export``'s ``DIR: N cases (protocol version V)`` and ``vectors compare``'s
    ``DIR differs from BUNDLED`` showed a path with a space and a quote as it is (``it's here:
    ...``); they quote it as on every line naming a path of the command line."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "vectors", "export", "it's here")
    v2 = sum(1 for _ in iter_cases(Path("it's here/v2")))
    v3 = sum(1 for _ in iter_cases(Path("it's here"))) - v2  # the folder's cases and its v2/'s
    assert (code, err) == (0, "")
    assert out == (f"\"it's here\": {v3} cases (protocol version 3)\n"
                   f"\"it's here/v2\": {v2} cases (protocol version 2)\n")
    Path("bundled copy").mkdir()
    code, out, err = run_main(capsys, "vectors", "compare", "--bundled", "bundled copy",
                              "it's here")
    assert (code, out.splitlines()[-1], err) == (
        1, f"\"it's here\" differs from 'bundled copy' ({len(out.splitlines()) - 1} files)", "")


@pytest.mark.parametrize("existing", [False, True])
def test_a_failure_in_v2_undoes_only_what_the_export_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool) -> None:
    """The v2 manifest, the last file, fails. A ``DIR`` the export created goes with the
    version 3 files written into it; in a ``DIR`` that was there, those files stay (each
    replaced whole) beside what was there before, and only the new ``v2`` folder goes."""
    from flodl_proto.interop import export as export_mod

    real = export_mod.replace_file

    def failing(path: Path, data: bytes) -> None:
        if path.parent.name == "v2" and path.name == "manifest.json":
            raise OSError(28, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(export_mod, "replace_file", failing)
    target = tmp_path / "out"
    if existing:
        target.mkdir()
        (target / "mine.txt").write_text("kept")
    with pytest.raises(OSError) as ei:
        export_vectors(target)
    assert ei.value.filename == str(target / "v2" / "manifest.json")
    if existing:
        names = sorted(p.name for p in target.iterdir())
        assert names == sorted(["mine.txt", "manifest.json", *(f"{n}.json" for n in
                                                                 EXPORTED_FILES)])
        assert (target / "mine.txt").read_text() == "kept"
    else:
        assert list(tmp_path.iterdir()) == []


def test_a_mkdir_that_fails_midway_leaves_no_folder(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``mkdir(parents=True)`` makes the outer folders, then fails on ``DIR`` itself: those
    outer folders go too."""
    real = Path.mkdir

    def failing(self: Path, mode: int = 0o777, parents: bool = False,
                exist_ok: bool = False) -> None:
        if self.name == "vectors":  # its parents made, as mkdir(parents=True) does first
            real(self.parent, parents=True, exist_ok=True)
            raise PermissionError(13, "Permission denied", str(self))
        real(self, mode, parents, exist_ok)

    monkeypatch.setattr(Path, "mkdir", failing)
    with pytest.raises(PermissionError):
        export_vectors(tmp_path / "a" / "b" / "vectors")
    assert list(tmp_path.iterdir()) == []

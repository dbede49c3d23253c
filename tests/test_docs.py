"""docs/protocol.md is generated from the spec and can never drift from it.

The committed file must equal a fresh rendering; every message, constant, timeout, enum, error
id and lifecycle state/event of the spec appears in it; the worked examples in the spec are
byte-exact (they match the golden vectors and their tags verify); and the HostFrame layout the
docs describe is enough to encode the worked example from scratch.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from flodl_proto._spec_checks import DERIVED_SIZES, struct_layouts
from flodl_proto.cli import main
from flodl_proto.codec.mux import decode_mux_record
from flodl_proto.commands.docs import spec_dir_for
from flodl_proto.docs import (
    DiagramItem,
    byte_diagram,
    lifecycle_machines,
    mermaid_state_diagram,
    render_protocol_doc,
)
from flodl_proto.errors import shown, shown_name
from flodl_proto.spec import SPEC, Spec, SpecError

from .conftest import run_with_file_size_limit

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
BUNDLED = ROOT / "flodl_proto" / "_vectors"


@pytest.fixture(scope="module")
def rendered() -> str:
    return render_protocol_doc()


def test_committed_docs_are_current(rendered: str) -> None:
    assert DOC.is_file(), "docs/protocol.md is missing: run `flodl-proto docs`"
    assert DOC.read_text(encoding="utf-8") == rendered, (
        "docs/protocol.md is out of date: run `flodl-proto docs` and commit the result"
    )


def test_cli_reproduces_committed_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    out = tmp_path / "p.md"
    assert main(["docs", "--out", str(out)]) == 0
    assert out.read_bytes() == DOC.read_bytes()
    assert main(["docs", "--out", str(out), "--check"]) == 0
    out.write_text("stale\n", encoding="utf-8")
    assert main(["docs", "--out", str(out), "--check"]) == 1
    capsys.readouterr()


def test_cli_creates_missing_parents(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     rendered: str) -> None:
    out = tmp_path / "site" / "ref" / "protocol.md"
    assert main(["docs", "--out", str(out), "--spec", str(SPEC.path)]) == 0
    assert out.read_text(encoding="utf-8") == rendered
    assert capsys.readouterr().out.startswith(f"{shown(str(out))}: written (")


def test_rendering_is_deterministic_and_path_free(rendered: str) -> None:
    assert render_protocol_doc() == rendered
    assert rendered.endswith("\n") and not rendered.endswith("\n\n")
    for leak in (str(ROOT), str(Path.home()), "/tmp/", str(SPEC.path)):
        assert leak not in rendered
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", rendered), "a date leaked into the docs"


def test_every_spec_item_appears(rendered: str) -> None:
    raw = SPEC.raw
    for name in raw["messages"]:
        assert f"(`{name}`)" in rendered, f"message {name} has no section"
    for name in raw["constants"]:
        assert f"| `{name}` |" in rendered, f"constant {name} missing"
    for name in raw["timeouts"]:
        assert f"| `{name}` |" in rendered, f"timeout {name} missing"
    for name in raw["enums"]:
        assert f"### Enum {name}" in rendered, f"enum {name} missing"
    for eid in SPEC.errors:
        assert f"| `{eid}` |" in rendered, f"error {eid} missing"
    for x in raw["leniencies"]:
        assert f"`{x['id']}`" in rendered
    for x in raw["departures"]:
        assert f"`{x['id']}`" in rendered
    for x in raw["version_differences"]:
        assert x["aspect"].replace("|", "\\|") in rendered
    for leg in raw["topology"]["legs"]:
        assert f"### Leg `{leg['name']}`" in rendered
    for ex in raw["examples"].values():
        assert ex["title"] in rendered
    for section in ("## 1. Overview", "Authentication tags", "Timeouts and limits",
                    "End of stream", "Leniencies", "Versions 2 and 3",
                    "Departures from upstream", "Lifecycle", "Error catalogue"):
        assert section in rendered


def test_byte_order_and_tag_coverage_are_stated(rendered: str) -> None:
    assert "little-endian: least significant byte first" in rendered
    for message, coverage in SPEC.raw["auth"]["coverage"].items():
        assert f"`{message}`" in rendered and coverage in rendered


def test_lifecycle_is_rendered(rendered: str) -> None:
    lc = SPEC.lifecycle()
    machines = lifecycle_machines(lc)
    assert machines, "spec/lifecycle.yaml declares no machine"
    assert "```mermaid\nstateDiagram-v2" in rendered
    for _name, m in machines:
        for sid, sdef in m["states"].items():
            assert f" as {sid}" in rendered
            on = sdef.get("on") or {}
            for event in on:
                assert f"| `{sid}` | `{event}` |" in rendered


def test_missing_lifecycle_renders_a_note() -> None:
    text = render_protocol_doc(lifecycle=None, load_lifecycle=False)
    assert "not available" in text and "```mermaid" not in text


def test_mermaid_renderer_handles_the_definition_format() -> None:
    machine = {
        "states": {
            "a": {"initial": True, "name": "A", "on": {"go": [{"target": "b", "cond": "ready"}],
                                                        "back": [{"target": "a", "internal": True,
                                                                  "unless": "busy"}]}},
            "b": {"states": {"b1": {"initial": True, "transitions": [{"target": "b2"}]},
                             "b2": {"final": True}},
                  True: {"done": [{"target": "c"}]}},  # an unquoted YAML `on` key
            "c": {"final": True, "name": 'The "end"'},
        }
    }
    lines = mermaid_state_diagram(machine)
    assert lines[0] == "stateDiagram-v2"
    text = "\n".join(lines)
    assert '    state "A" as a' in text and "    [*] --> a" in text
    assert "    a --> b: go [ready]" in text
    assert "    a --> a: back [not busy]" in text
    assert '    state "b" as b {' in text and "        [*] --> b1" in text
    assert "    b1 --> b2" in lines and "    b --> c: done" in text
    assert "    c --> [*]" in text and "The 'end'" in text
    assert mermaid_state_diagram(machine) == lines


def test_byte_diagram_geometry() -> None:
    lines = byte_diagram([DiagramItem("magic", 4), DiagramItem("kind", 1),
                          DiagramItem("rank", 4), DiagramItem("tag", 8),
                          DiagramItem("payload", None)])
    assert lines[0].startswith(" 0") and lines[1].startswith(" 0 1 2 3")
    body = lines[2:]
    assert all(len(line) <= 65 for line in lines)
    assert body[0] == "+" + "-+" * 32
    assert all(line[0] in "+|/" for line in body)
    assert any("payload" in line and line.endswith("/") for line in body)
    assert sum(1 for line in body if "magic" in line) == 1


def _bundled_case(vector_id: str) -> dict[str, Any]:
    folder = BUNDLED / "v2" if vector_id.startswith("v2/") else BUNDLED
    file = vector_id.removeprefix("v2/").split("/", 1)[0]
    doc = json.loads((folder / f"{file}.json").read_text(encoding="utf-8"))
    for case in doc["cases"]:
        if case["id"] == vector_id:
            return dict(case)
    raise AssertionError(f"vector {vector_id} not found")


@pytest.mark.parametrize("name", list(SPEC.raw["examples"]))
def test_spec_examples_are_byte_exact(name: str) -> None:
    ex = SPEC.raw["examples"][name]
    data = bytes.fromhex("".join(f["bytes"] for f in ex["fields"]).replace(" ", ""))
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for f in ex["fields"]:
        n = len(bytes.fromhex(f["bytes"]))
        offsets[f["field"]] = (pos, pos + n)
        pos += n
    assert data == bytes.fromhex(_bundled_case(ex["vector"])["bytes"])
    for tag in ex["tags"]:
        salt = bytes.fromhex(ex["salt"])
        msg = b"".join(data[a:b] for a, b in tag["covers"])
        mac = hmac.new(salt, msg, hashlib.sha256).digest()
        assert mac.hex() == tag["hmac"]
        a, b = offsets[tag["field"]]
        assert data[a:b] == mac[:8]
    if ex["message"] == "mux_record":
        version = 3 if ex["version"] == "any" else int(ex["version"])
        res = decode_mux_record(data, bytes.fromhex(ex["salt"]), version=version)
        assert res[1] == len(data)


def test_the_worked_examples_tag_length_is_the_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worked example's tag line states the tag's length from the spec's ``AUTH_TAG_LEN`` as
    the document is rendered, where the generator wrote "the first 8 bytes" by hand; a spec
    without the constant (a ``--spec`` folder's) states the byte count of the tag's own field
    in the example."""
    tagged = [n for n, ex in SPEC.raw["examples"].items() if ex["tags"]]
    lines = sum(len(SPEC.raw["examples"][n]["tags"]) for n in tagged)
    assert len(tagged) >= 3 and lines >= 4
    written = render_protocol_doc()
    assert written.count("= the first 8 bytes of HMAC-SHA256(key = the salt, message = ") == lines
    monkeypatch.setitem(SPEC.constants, "AUTH_TAG_LEN", 12)
    doc = render_protocol_doc()
    assert doc.count("= the first 12 bytes of HMAC-SHA256(key = the salt, message = ") == lines
    assert "the first 8 bytes of HMAC-SHA256(key" not in doc
    monkeypatch.delitem(SPEC.constants, "AUTH_TAG_LEN")
    assert render_protocol_doc() == written  # each tag field of the examples holds 8 bytes


def _doc_constant(text: str, name: str) -> int:
    m = re.search(rf"^\| `{name}` \| `0x([0-9A-F]{{8}})`", text, re.M)
    if m:
        return int(m.group(1), 16)
    m = re.search(rf"^\| `{name}` \| (\d+)", text, re.M)
    assert m, f"constant {name} not found in the docs"
    return int(m.group(1))


def test_hostframe_encoder_from_the_docs_alone() -> None:
    """Encode the worked HostFrame from what docs/protocol.md states, and compare."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("Mux record HostFrame carrying"):]
    salt = bytes.fromhex(re.search(r"session salt `([0-9a-f]{32})`", section).group(1))  # type: ignore[union-attr]
    dump = section[section.index("```text") + 8:section.index("```", section.index("```text") + 8)]
    expected = bytes.fromhex("".join(line[6:] for line in dump.splitlines()).replace(" ", ""))
    # the frame: magic, num_tensors, kind, weight, per tensor (dtype, ndim, dims, nbytes, data)
    data = struct.pack("<3f", 3.0, 6.0, -1.5)
    body = struct.pack("<IIBd", _doc_constant(text, "ROUND_FRAME_MAGIC"), 1, 0, 3.0)
    body += struct.pack("<BBIQ", 0, 1, 3, len(data)) + data
    frame = body + hmac.new(salt, body, hashlib.sha256).digest()[:8]
    covered = struct.pack("<IIBII", _doc_constant(text, "MUX_RECORD_MAGIC"),
                          _doc_constant(text, "MUX_PROTOCOL_VERSION"), 0x03, 0, len(frame))
    record = covered + hmac.new(salt, covered + frame, hashlib.sha256).digest()[:8] + frame
    assert record == expected


@pytest.mark.parametrize("cmd", [["docs"], ["conform", "docs"]])
def test_generated_file_commands_share_their_writes_and_refuse_a_check_of_stdout(
        cmd: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``docs`` and ``conform docs`` write through one helper: a file that is not UTF-8 text is
    out of date (rewritten, not a traceback or 'cannot read'), a file where a folder of the path
    should be is 'Not a directory' whichever level it is at, with the file in the way named
    (with the command line, exit 2; at the step that creates the folder for one put there
    after the command line was read, exit 1); ``--check --out -`` is a bad
    command line (exit 2, one line), never a check that passes by printing the text."""
    prog = "flodl-proto " + " ".join(cmd)  # the error lines' program name
    out = tmp_path / "gen.md"
    out.write_bytes(b"\xff\xfe not text")
    assert main([*cmd, "--out", str(out), "--check"]) == 1
    capsys.readouterr()
    assert main([*cmd, "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{shown(str(out))}: written (")
    assert main([*cmd, "--out", str(out), "--check"]) == 0
    capsys.readouterr()
    for under in (out / "x.md", out / "sub" / "x.md"):  # refused with the command line
        with pytest.raises(SystemExit) as stop:
            main([*cmd, "--out", str(under)])
        assert stop.value.code == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err == (
            f"{prog}: error: argument --out: {shown(str(under))}: Not a directory "
            f"({shown_name(str(out))} is a file, not a folder)\n")
    # a file put there after the command line was read: the write's own words, exit 1
    from flodl_proto.commands.docs import write_output

    for under, step in (
            (out / "x.md", f"creating the folder {shown_name(str(out))}: Not a directory (it "
                           "exists and is not a folder)"),
            (out / "sub" / "x.md", f"creating the folder {shown_name(str(out / 'sub'))}: Not a "
                                   f"directory ({shown_name(str(out))} is not a folder)")):
        assert write_output(under, b"text", prog) == 1
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err == (
            f"{prog}: error: cannot write {shown(str(under))}: {step}\n")
    assert main([*cmd, "--out", "-", "--check"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == (
        f"{prog}: error: argument --out: '-': stdout is no file to compare (--check compares "
        "a file)\n")
    long = tmp_path / ("n" * 300)  # above NAME_MAX: is_dir() raised, the CLI's catch-all said it
    assert main([*cmd, "--out", str(long)]) == 1
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == (f"{prog}: error: cannot write {shown(str(long))}: "
                                         "File name too long\n")


@pytest.mark.parametrize("cmd", [["docs"], ["conform", "docs"]])
def test_a_failed_check_is_an_error_line_of_the_command(
        cmd: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``--check`` that finds the file missing or stale is a failure (exit 1) reported as the
    command's other failure lines are, ``flodl-proto COMMAND: error: ...``; the line read
    ``PATH: out of date ...`` with no program name nor ``error:``."""
    prog = "flodl-proto " + " ".join(cmd)
    out = tmp_path / "gen.md"
    for state in ("missing", "out of date"):
        assert main([*cmd, "--out", str(out), "--check"]) == 1
        cap = capsys.readouterr()
        assert cap.out == "" and len(cap.err.splitlines()) == 1
        # docs adds (spec: ...)
        assert cap.err.startswith(f"{prog}: error: {shown(str(out))}: {state}")
        assert cap.err.endswith(f"; run `{prog} --out {out}`\n")
        out.write_text("stale\n", encoding="utf-8")


@pytest.mark.parametrize("cmd", [["docs"], ["conform", "docs"], ["dissector"]])
def test_an_output_that_cannot_be_written_is_named_quoted(
        cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``cannot write PATH: WHY`` showed the path bare unless it held a line break or an escape:
    a path with a space and a quote read ``cannot write it's here/x.md: ...``; it is quoted as
    on every line naming a path of the command line (``argument --out: 'PATH': ...``)."""
    from flodl_proto.commands import docs as docs_command

    def no_space(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(docs_command, "replace_file", no_space)
    assert main([*cmd, "--out", "it's here/x.md"]) == 1
    assert capsys.readouterr() == (
        "", f"flodl-proto {' '.join(cmd)}: error: cannot write \"it's here/x.md\": No space "
            "left on device\n")


@pytest.mark.parametrize("cmd", [["docs"], ["conform", "docs"]])
def test_a_failed_check_names_the_file_quoted(
        cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--check``'s ``PATH: missing`` and ``PATH: out of date`` showed the path bare unless it
    held a line break or an escape (``it's here/x.md: missing``); it is quoted as on every line
    naming a path of the command line, the command to run quoted for a shell as before."""
    monkeypatch.chdir(tmp_path)
    prog = "flodl-proto " + " ".join(cmd)
    spec = f" (spec: {spec_dir_for(None) / 'wire.yaml'})" if cmd == ["docs"] else ""
    run = f"`{prog} --out 'it'\"'\"'s here/x.md'`"
    for state in ("missing", "out of date"):
        assert main([*cmd, "--check", "--out", "it's here/x.md"]) == 1
        assert capsys.readouterr() == (
            "", f"{prog}: error: \"it's here/x.md\": {state}{spec}; run {run}\n")
        Path("it's here").mkdir(exist_ok=True)
        Path("it's here/x.md").write_text("stale\n", encoding="utf-8")


@pytest.mark.parametrize("cmd", [["docs"], ["conform", "docs"], ["dissector"]])
def test_a_result_line_names_the_file_quoted(
        cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``PATH: written (N bytes)`` and ``PATH: up to date`` showed the path as given, a line
    break splitting the line (``it's here/x.md: written (...)``); it is quoted as on every line
    naming a path of the command line, and ``docs``'s spec file after ``spec:`` quoted when it
    holds a line break (``--spec`` DIR ``s\\np``: ``(spec: 's\\np/wire.yaml')``)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(spec_dir_for(None), "s\np")
    spec = ["--spec", "s\np"] if cmd == ["docs"] else []
    tail = " (spec: 's\\np/wire.yaml')" if spec else ""
    assert main([*cmd, *spec, "--out", "it's here/x.md"]) == 0
    size = Path("it's here/x.md").stat().st_size
    assert capsys.readouterr() == (f"\"it's here/x.md\": written ({size} bytes){tail}\n", "")
    if cmd != ["dissector"]:  # it writes the file each time
        assert main([*cmd, *spec, "--out", "it's here/x.md"]) == 0
        assert capsys.readouterr() == (f"\"it's here/x.md\": up to date{tail}\n", "")


@pytest.mark.parametrize("cmd", [["docs"], ["conform", "docs"]])
@pytest.mark.parametrize(("make", "what"), [("fifo", "a FIFO"), ("null", "a character device")])
def test_a_check_of_a_fifo_or_a_device_is_an_unreadable_input_not_a_missing_file(
        cmd: list[str], make: str, what: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--check --out FIFO`` said ``FIFO: missing`` (exit 1) though the path exists; it is an
    input path that is no file, as the README's exit table puts one that cannot be read (2),
    refused in argparse's words for the option (it read ``cannot read FIFO: ...``)."""
    import os

    if make == "fifo":
        out = tmp_path / "gen.md"
        os.mkfifo(out)
    else:
        out = Path(os.devnull)
    prog = "flodl-proto " + " ".join(cmd)
    assert main([*cmd, "--out", str(out), "--check"]) == 2
    assert capsys.readouterr() == ("", f"{prog}: error: argument --out: {shown(str(out))} is "
                                       f"{what}, not a file (never read: a check compares a "
                                       "file)\n")


# -- the generators' write is atomic: a failed write leaves the old file -------------------------
def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """``docs --out`` over an existing file, in a process that cannot write more than 4 KiB to a
    file: the write fails partway (protocol.md is far larger). The old file must be as it was
    (the write used to truncate it and leave the first 4 KiB of the new text) and the folder
    must hold nothing else."""
    out = tmp_path / "protocol.md"
    old = b"the previous protocol.md\n"
    out.write_bytes(old)
    res = run_with_file_size_limit(["docs", "--out", str(out)], 4096)
    assert (res.returncode, res.stdout, res.stderr) == (
        1, "", f"flodl-proto docs: error: cannot write {shown(str(out))}: File too large\n")
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["protocol.md"]


def test_replace_file_cleans_up_after_any_failure(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after part of the data was written (here the disk fills at the second write)
    and one at the rename both leave the old file and remove the temporary file."""
    import errno
    import os

    from flodl_proto import _files

    out = tmp_path / "gen.lua"
    out.write_bytes(b"old")
    real_write = os.write
    calls: list[int] = []

    def write_then_fill(fd: int, data: Any) -> int:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, bytes(data)[:3])

    monkeypatch.setattr(_files.os, "write", write_then_fill)
    with pytest.raises(OSError) as e:
        _files.replace_file(out, b"new contents")
    assert e.value.errno == errno.ENOSPC and len(calls) == 2
    assert e.value.filename == str(out)  # the file asked for, not the temporary one
    monkeypatch.setattr(_files.os, "write", real_write)

    def no_rename(src: str, dst: Any) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), src)

    monkeypatch.setattr(_files.os, "replace", no_rename)
    with pytest.raises(PermissionError) as denied:
        _files.replace_file(out, b"new contents")
    assert (denied.value.filename, denied.value.filename2) == (str(out), None)
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.lua"]


def test_replace_file_keeps_the_mode_follows_a_link_and_writes_devices_in_place(
        tmp_path: Path) -> None:
    import os
    import stat

    from flodl_proto._files import replace_file

    kept = tmp_path / "kept.md"
    kept.write_bytes(b"old")
    kept.chmod(0o640)
    replace_file(kept, b"new")
    assert (kept.read_bytes(), stat.S_IMODE(kept.stat().st_mode)) == (b"new", 0o640)
    umask = os.umask(0o027)
    try:
        fresh = tmp_path / "fresh.md"
        replace_file(fresh, b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640  # 0o666 less the umask, not mkstemp's 0o600
    link = tmp_path / "link.md"
    link.symlink_to(kept)
    replace_file(link, b"through the link")
    assert link.is_symlink() and kept.read_bytes() == b"through the link"
    replace_file(Path(os.devnull), b"discarded")
    assert stat.S_ISCHR(Path(os.devnull).stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.md", "kept.md", "link.md"]


def test_every_public_helper_of_the_docs_command_names_its_upstream() -> None:
    """Each says what upstream it mirrors, or that it has no upstream counterpart."""
    from flodl_proto.commands import docs as docs_cmd

    for name in docs_cmd.__all__:
        text = " ".join((getattr(docs_cmd, name).__doc__ or "").split())
        assert "Upstream:" in text or "No upstream counterpart:" in text, name


def test_a_read_only_file_is_not_replaced(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A file its owner made read-only is refused, as ``open`` refuses it; the rename alone
    (the folder is writable) would replace it. Run as an unprivileged user: root writes any
    file."""
    import contextlib
    import os
    import tempfile

    from flodl_proto.commands.docs import write_output

    root = os.geteuid() == 0
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "out"
        folder.mkdir()
        out = folder / "protocol.md"
        out.write_bytes(b"kept")
        out.chmod(0o444)
        if root:  # the folder and the file belong to nobody, who may write the folder only
            os.chmod(d, 0o755)
            os.chown(folder, 65534, 65534)
            os.chown(out, 65534, 65534)
        with contextlib.ExitStack() as stack:
            if root:
                os.setresgid(-1, 65534, -1)
                os.setresuid(-1, 65534, -1)
                stack.callback(os.setresgid, -1, 0, -1)
                stack.callback(os.setresuid, -1, 0, -1)  # runs first: back to root
            code = write_output(out, b"new", "flodl-proto docs")
        assert (code, out.read_bytes()) == (1, b"kept")
        assert capsys.readouterr().err == ("flodl-proto docs: error: cannot write "
                                           f"{shown(str(out))}: Permission denied\n")
        assert [p.name for p in folder.iterdir()] == ["protocol.md"]


def test_a_spec_folder_without_the_spec_is_one_line_without_errno(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``docs --spec DIR`` whose DIR holds no wire.yaml: the path once and why (it said
    ``[Errno 2] No such file or directory: 'DIR/wire.yaml'`` after it again), named as the
    option's value."""
    spec_dir = tmp_path / "nothing-here"
    code = main(["docs", "--spec", str(spec_dir), "--out", str(tmp_path / "protocol.md")])
    assert code == 2
    assert capsys.readouterr() == (
        "", f"flodl-proto docs: error: argument --spec: cannot load {spec_dir / 'wire.yaml'}: No "
            "such file or directory\n")


@pytest.mark.parametrize(("given", "named"), [
    ("s", "s"), ("./s/", "s"), ("/ABS/s", "/ABS/s"), ("my spec ", "'my spec '"),
    ("s\x1b[31m", "'s\\x1b[31m'"),
], ids=["relative", "dotted", "absolute", "blank-at-end", "escape"])
def test_a_spec_folder_that_fails_to_load_is_named_after_the_option(
        given: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``docs --spec DIR`` whose wire.yaml or lifecycle.yaml is refused named the file and not
    the folder (``argument --spec: wire.yaml: ...``), where ``FLODL_PROTO_SPEC_DIR=DIR:
    wire.yaml: ...`` names its own: the folder comes first, as given (as a path reads it, quoted
    when it holds a character that does not print or a blank at either end)."""
    monkeypatch.chdir(tmp_path)
    given = given.replace("/ABS", str(tmp_path))
    named = named.replace("/ABS", str(tmp_path))
    folder = Path(given)
    folder.mkdir()
    shutil.copy(ROOT / "spec" / "lifecycle.yaml", folder / "lifecycle.yaml")
    wire = (ROOT / "spec" / "wire.yaml").read_text(encoding="utf-8")
    (folder / "wire.yaml").write_text(wire.replace("    value: 65536\n", "    value: lots\n", 1),
                                      encoding="utf-8")
    assert main(["docs", "--spec", given, "--out", "p.md"]) == 2
    assert capsys.readouterr() == ("", (
        f"flodl-proto docs: error: argument --spec: {named}: wire.yaml: "
        "constants.MAX_ROUND_FRAME_TENSORS.value is the string 'lots', not an integer\n"))
    (folder / "wire.yaml").write_text(wire, encoding="utf-8")
    (folder / "lifecycle.yaml").write_text("schema: flodl-proto-lifecycle/9\n", encoding="utf-8")
    assert main(["docs", "--spec", given, "--out", "p.md"]) == 2
    assert capsys.readouterr() == ("", (
        f"flodl-proto docs: error: argument --spec: {named}: lifecycle.yaml: missing or unknown "
        "'schema' (not flodl-proto-lifecycle/2)\n"))
    assert not Path("p.md").exists()


@pytest.mark.parametrize(("wire", "lifecycle", "bad", "why"), [
    (None, "x: [\n", "lifecycle.yaml", "not YAML: did not find expected node content at line 2, "
                                        "column 1"),
    (None, None, "lifecycle.yaml", "No such file or directory"),
    ("x: [\n", None, "wire.yaml", "not YAML: did not find expected node content at line 2, "
                                  "column 1"),
    (None, b"\xff", "lifecycle.yaml", "not UTF-8 (byte 0xff at offset 0)"),
    (b"a: 1\n\xfe", None, "wire.yaml", "not UTF-8 (byte 0xfe at offset 5)"),
])
def test_a_spec_folder_with_a_bad_or_missing_file_is_one_line_and_writes_nothing(
        wire: str | bytes | None, lifecycle: str | bytes | None, bad: str, why: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``docs --spec DIR`` with a malformed or missing lifecycle.yaml wrote the document with a
    placeholder for the lifecycle section and exit 0; a malformed file's YAML error took three
    lines; a file that is not UTF-8 was a UnicodeDecodeError traceback."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    wire_bytes = (wire.encode() if isinstance(wire, str) else wire if wire is not None
                  else (ROOT / "spec" / "wire.yaml").read_bytes())
    (spec_dir / "wire.yaml").write_bytes(wire_bytes)
    if lifecycle is not None:
        (spec_dir / "lifecycle.yaml").write_bytes(
            lifecycle.encode() if isinstance(lifecycle, str) else lifecycle)
    elif bad == "wire.yaml":
        shutil.copy(ROOT / "spec" / "lifecycle.yaml", spec_dir / "lifecycle.yaml")
    out = tmp_path / "protocol.md"
    code = main(["docs", "--spec", str(spec_dir), "--out", str(out)])
    assert (code, out.exists()) == (2, False)
    assert capsys.readouterr() == (
        "", f"flodl-proto docs: error: argument --spec: cannot load {spec_dir / bad}: {why}\n")


@pytest.mark.parametrize(("old", "new", "line"), [
    ("  ROUND_FRAME_MAGIC:\n", "  ROUND_FRAME_MAGICX:\n",
     "message round_frame field magic: const 'ROUND_FRAME_MAGIC' is not in the 'constants' "
     "section"),
    ("enum: RecordKind,", "enum: RecordKnd,",
     "message mux_record field kind: enum 'RecordKnd' is not in the 'enums' section"),
    ("{name: version, type: u32, size: 4, offset: 4, condition: \"== the data",
     "{name: version, type: u33, size: 4, offset: 4, condition: \"== the data",
     "message handshake field version: type 'u33' is not in the 'types' section"),
    ("{name: rank, type: u32, size: 4, offset: 8,", "{name: rank, type: u32, size: 5, offset: 8,",
     "message handshake field rank: size 5 is not the size of type 'u32' (4)"),
    ("{name: rank, type: u32, size: 4, offset: 8,",
     "{name: version, type: u32, size: 4, offset: 8,",
     "message handshake field version: a second field of that name"),
    ("{name: rank, type: u32, size: 4, offset: 8,", "{name: rank, type: u32, size: 4, offset: 9,",
     "message handshake field rank: offset 9 is not where the field before it ends (8)"),
    # the offsets run on across a message's parts (a RoundFrame's kind after its 8-byte header;
    # bytes 8 and 9 were left out of the table with exit 0), from 0 at its first field
    ("{name: kind, type: u8, size: 1, offset: 8,", "{name: kind, type: u8, size: 1, offset: 10,",
     "message round_frame field kind: offset 10 is not where the field before it ends (8)"),
    ("{name: weight, type: f64, size: 8, offset: 9,",
     "{name: weight, type: f64, size: 8, offset: 12,",
     "message round_frame field weight: offset 12 is not where the field before it ends (9)"),
    ("{name: magic, type: u32, size: 4, offset: 0, enum: Channel,",
     "{name: magic, type: u32, size: 4, offset: 2, enum: Channel,",
     "message channel_magic field magic: offset 2 is not 0 (the message's first field)"),
])
def test_a_field_naming_no_constant_or_enum_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A spec whose field names a constant or an enum it does not define (a constant renamed,
    a typo) was documented with exit 0: ``(None)`` for the constant, no values for the enum."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize(("name", "old", "new", "line"), [
    ("wire.yaml", "\nconstants:\n", "\nconstantz: {}\nconstants:\n",
     "wire.yaml: unknown top-level key 'constantz' (known: "),
    ("wire.yaml", "\nerrors:\n", "\nx-notes: text\nerrors:\n",
     "wire.yaml: unknown top-level key 'x-notes' (known: "),
    ("lifecycle.yaml", "\nmachines:\n", "\nmachinez: {}\nmachines:\n",
     "lifecycle.yaml: unknown top-level key 'machinez' (known: machines, schema, x-docs-keys)"),
])
def test_a_stray_top_level_key_is_one_line_and_writes_nothing(
        name: str, old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A top-level key the package reads nothing from (a typo of a section's name) was
    ignored, and the document written with exit 0."""
    _docs_of_a_changed_spec(name, old, new, tmp_path)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(_refused(tmp_path, line)[1].removesuffix("\n"))
    assert err.count("\n") == 1 and err.endswith(")\n")


@pytest.mark.parametrize(("name", "old", "new", "line"), [
    ("wire.yaml", "\nconstants:\n",
     "\nconstants:\n  '1': {value: 5, type: u32, doc: d, source: s}\n"
     "  1: {value: 6, type: u32, doc: d, source: s}\n",
     "wire.yaml: constants: a key is the number 1, not a string"),
    ("wire.yaml", "\nerrors:\n", "\nerrors:\n  true: {kind: value, side: local, template: t}\n",
     "wire.yaml: errors: a key is True, not a string"),
    ("lifecycle.yaml", "\n    guards:\n", "\n    guards:\n      7: the seventh\n",
     "lifecycle.yaml: machines.controller.guards: a key is the number 7, not a string"),
])
def test_a_name_that_is_no_string_is_one_line_and_writes_nothing(
        name: str, old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A name of a table of the spec's own names written as a number (or ``true``) was taken:
    ``1`` beside ``'1'`` (two keys to YAML) gave two constants the reference showed as ``1``."""
    _docs_of_a_changed_spec(name, old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, line)


@pytest.mark.parametrize(("old", "new", "line"), [
    ("  MUX_HEADER_LEN:\n    value: 25\n    type: size\n",
     "  MUX_HEADER_LEN:\n    value: 25\n    type: sise\n",
     "constant MUX_HEADER_LEN: type 'sise' is not a constant's type (bytes, count, port, size, "
     "u32)"),
    ("    value: 65536\n    type: count\n", "    value: 65536\n    type: u64\n",
     "constant MAX_ROUND_FRAME_TENSORS: type 'u64' is not a constant's type (bytes, count, port, "
     "size, u32)"),
], ids=["misspelt", "a-wire-type"])
def test_a_constant_of_an_unknown_type_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A constant's ``type`` word was not checked: a misspelt ``bytes`` or ``count`` dropped the
    constant from the reference's limits with exit 0, and a ``u32`` one lost its hex form."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize(("old", "new", "line"), [
    ("    value: 0xF10D17D0\n    type: u32\n", "    value: 0x1F10D17D0\n    type: u32\n",
     "constant MUX_RECORD_MAGIC: value 8339134416 is not a u32 (0..4294967295)"),
    ("    value: 0xF10D17D0\n    type: u32\n", "    value: -1\n    type: u32\n",
     "constant MUX_RECORD_MAGIC: value -1 is not a u32 (0..4294967295)"),
    ("    value: 1337\n    type: port\n", "    value: 70000\n    type: port\n",
     "constant DEFAULT_CONTROLLER_PORT: value 70000 is not a port (0..65535)"),
    ("    value: 65536\n    type: count\n", "    value: -5\n    type: count\n",
     "constant MAX_ROUND_FRAME_TENSORS: value -5 is not a count (a whole number >= 0)"),
    ("  MUX_HEADER_LEN:\n    value: 25\n", "  MUX_HEADER_LEN:\n    value: -25\n",
     "constant MUX_HEADER_LEN: value -25 is not a size (a whole number >= 0)"),
], ids=["u32-above", "u32-negative", "port-above", "count-negative", "size-negative"])
def test_a_constant_out_of_its_types_range_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A constant's value was not checked against its ``type``: a u32 magic above 0xFFFFFFFF
    ended ``docs`` with a traceback (``OverflowError: int too big to convert``), and a
    negative magic, port or limit was documented with exit 0 (``= `MUX_RECORD_MAGIC` (-1)``)."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


#: (constant, its value in the spec, what its layout is, that layout's struct): every length
#: constant named after a struct of the spec's field tables (STRUCT_LEN)
LAYOUT_LENGTHS = [
    ("HANDSHAKE_LEN", 16, "message handshake", "HANDSHAKE"),
    ("HANDSHAKE_ACK_LEN", 8, "message handshake_ack", "HANDSHAKE_ACK"),
    ("CHANNEL_MAGIC_LEN", 4, "message channel_magic", "CHANNEL_MAGIC"),
    ("LEN_PREFIX_LEN", 4, "message len_framed", "LEN_PREFIX"),
    ("MUX_HEADER_LEN", 25, "message mux_record", "MUX_HEADER"),
    ("ROUND_FRAME_HEADER_LEN", 8, "part header of message round_frame", "ROUND_FRAME_HEADER"),
    ("AUTH_TAG_LEN", 8, "part footer of message round_frame", "AUTH_TAG"),
]


@pytest.mark.parametrize("bad", [0, 1])
@pytest.mark.parametrize(("name", "value", "layout", "struct_name"), LAYOUT_LENGTHS,
                         ids=[c[0] for c in LAYOUT_LENGTHS])
def test_a_length_constant_other_than_its_layouts_size_is_one_line_and_writes_nothing(
        name: str, value: int, layout: str, struct_name: str, bad: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A length constant was not compared with the field table it is the length of:
    ``HANDSHAKE_LEN: 0`` beside the 16-byte handshake table was loaded and documented with
    exit 0 (and the codec would read a handshake of 0 bytes)."""
    _docs_of_a_changed_spec("wire.yaml", f"  {name}:\n    value: {value}\n",
                            f"  {name}:\n    value: {bad}\n", tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, (
        f"wire.yaml: constant {name} is {bad}, but its layout, {layout} (struct {struct_name}), "
        f"is {value} bytes"))


def test_the_length_constants_are_those_of_the_spec_layouts() -> None:
    """Every struct of the spec's field tables with a ``STRUCT_LEN`` constant is one of
    :data:`LAYOUT_LENGTHS`, of the size the spec gives, so the test above covers each."""
    linked = [(f"{s}_LEN", SPEC.constants[f"{s}_LEN"], what, s)
              for s, what, _size in struct_layouts(SPEC.raw["messages"])
              if f"{s}_LEN" in SPEC.constants]
    assert sorted(linked) == sorted(LAYOUT_LENGTHS)


#: (constant, its value in the spec, the layout it derives from, what it sums): every size
#: constant of _spec_checks.DERIVED_SIZES
DERIVED = [
    ("MUX_AUTH_COVERED_HEADER_LEN", 17, "the fields of message mux_record before its auth tag",
     "magic, version, kind, rank, payload_len"),
    ("ROUND_FRAME_FIXED_OVERHEAD", 25, "the parts of message round_frame sent once",
     "header, kind, weight, footer"),
]


@pytest.mark.parametrize("delta", [1, -1])
@pytest.mark.parametrize(("name", "value", "layout", "parts"), DERIVED,
                         ids=[c[0] for c in DERIVED])
def test_a_derived_size_constant_other_than_its_layouts_is_one_line_and_writes_nothing(
        name: str, value: int, layout: str, parts: str, delta: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A size constant summed from a field table but named after no struct was not compared
    with it: ``MUX_AUTH_COVERED_HEADER_LEN: 18`` (the bytes the mux tag covers) and
    ``ROUND_FRAME_FIXED_OVERHEAD: 24`` (the smallest frame) were loaded and documented with
    exit 0."""
    bad = value + delta
    _docs_of_a_changed_spec("wire.yaml", f"  {name}:\n    value: {value}\n",
                            f"  {name}:\n    value: {bad}\n", tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, (
        f"wire.yaml: constant {name} is {bad}, but its layout, {layout} ({parts}), is {value} "
        "bytes"))


def test_the_derived_size_constants_are_those_of_the_checks_table() -> None:
    """:data:`DERIVED` covers every constant of ``DERIVED_SIZES``, of the value the spec gives
    and the size its layout derives, so the test above covers each."""
    found = [(name, SPEC.constants[name], what, ", ".join(derive(SPEC.raw["messages"][m])[1]))
             for name, (m, what, derive) in DERIVED_SIZES.items()]
    assert found == DERIVED
    assert [derive(SPEC.raw["messages"][m])[0] for m, _w, derive in DERIVED_SIZES.values()] \
        == [17, 25]


@pytest.mark.parametrize(("old", "new", "line"), [
    ("    struct: HANDSHAKE\n    size: 16\n", "    struct: HANDSHAKE\n    size: 15\n",
     "message handshake: size 15 is not the size of its fields (16)"),
    ("    struct: CHANNEL_MAGIC\n    size: 4\n", "    struct: CHANNEL_MAGIC\n    size: 0\n",
     "message channel_magic: size 0 is not the size of its fields (4)"),
], ids=["handshake", "channel_magic"])
def test_a_message_size_other_than_its_fields_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A message's ``size`` was documented as written (``size: 15 bytes`` above a table of 16
    bytes), with exit 0."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize(("old", "new", "line"), [
    ('CONTROL: {code: 1, doc: "bookkeeping', 'CONTROL: {code: 0, doc: "bookkeeping',
     "enum RoundKind: CONTROL has code 0, which MODEL has"),
    ("F32: {code: 0, element_size: 4", "F32: {code: 256, element_size: 4",
     "enum Dtype: F32 has code 256, which field dtype of message round_frame cannot carry "
     "(u8: 0..255)"),
    ("F32: {code: 0, element_size: 4", "F32: {code: -3, element_size: 4",
     "enum Dtype: F32 has code -3, not a whole number >= 0"),
    ("Hello: {code: 0, direction:", "Hello: {code: 0x100000000, direction:",
     "enum ControlVariant: Hello has code 4294967296, above a u32 (0..4294967295)"),
], ids=["shared", "past-its-field", "negative", "past-u32"])
def test_an_enum_code_shared_or_out_of_range_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An enum's codes were not checked: two values of one code, a code its u8 field cannot
    carry and a negative code were documented with exit 0."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize(("old", "new", "line"), [
    ("    message: handshake\n    version: 2\n", "    message: handshak\n    version: 2\n",
     "example handshake_v2: message 'handshak' is not in the 'messages' section"),
    ("    message: handshake\n    version: 2\n", "    message: handshake\n    version: seven\n",
     "example handshake_v2: version 'seven' is neither 'any' nor a supported version (2, 3)"),
    ("    message: handshake\n    version: 2\n", "    message: handshake\n    version: 4\n",
     "example handshake_v2: version 4 is neither 'any' nor a supported version (2, 3)"),
    ("      messages: [handshake, handshake_ack, len_framed, round_frame]\n",
     "      messages: [handshake, handshake_akc, len_framed, round_frame]\n",
     "topology.legs[0]: message 'handshake_akc' is not in the 'messages' section"),
    ("  - {id: dtype_any, message: round_frame,", "  - {id: dtype_any, message: round_fram,",
     "leniencies[0]: message 'round_fram' is not in the 'messages' section"),
    ("{code: 0xF10D17E1, constant: CHANNEL_MAGIC_DATA}",
     "{code: 0xF10D17E1, constant: CHANNEL_MAGIC_DAT}",
     "enum Channel: data names constant 'CHANNEL_MAGIC_DAT', which is not in the 'constants' "
     "section"),
    ("{code: 0xF10D17E1, constant: CHANNEL_MAGIC_DATA}",
     "{code: 0xF10D17E5, constant: CHANNEL_MAGIC_DATA}",
     "enum Channel: data has code 0xF10D17E5, but its constant CHANNEL_MAGIC_DATA is "
     "0xF10D17E1"),
], ids=["unknown-message", "version-text", "version-unsupported", "leg-unknown-message",
        "leniency-unknown-message", "enum-unknown-constant", "enum-other-constant"])
def test_an_example_or_a_leg_of_no_message_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A worked example naming a message the spec lacks was documented with exit 0 and a link
    to a section 3.0 that does not exist (``#30-handshak-handshak``); one of a version that is
    neither ``any`` nor supported read 'protocol version seven'. A topology leg naming a message
    the spec lacks linked to that section 3.0 as well; a leniency's message and an enum value's
    constant were not looked up either (an enum code other than its constant's was drawn so)."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize(("covers", "shown"), [
    ("[[0]]", "[0]"), ("[[0, 47, 50]]", "[0, 47, 50]"), ("[[47, 0]]", "[47, 0]"),
    ("[[-1, 47]]", "[-1, 47]"), ("[[0, 17], []]", "[]"),
], ids=["one-offset", "three-offsets", "reversed", "negative", "empty"])
def test_an_example_tag_covering_no_byte_range_is_one_line_and_writes_nothing(
        covers: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tag's ``covers`` entry is a byte range ``[start, end]``: ``[[0]]`` ended ``docs``
    (and ``docs --check``'s example check) with a traceback (``ValueError: not enough values
    to unpack``), and ``[[47, 0]]`` was documented as 'bytes 47 to -1 (-47 bytes)'."""
    old = "{field: auth_tag, covers: [[0, 47]],"
    _docs_of_a_changed_spec("wire.yaml", old, f"{{field: auth_tag, covers: {covers},", tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, (
        f"wire.yaml: example round_frame_f32: tag auth_tag: covers {shown}, not a byte range "
        "[start, end] with 0 <= start <= end"))


@pytest.mark.parametrize(("old", "new", "line"), [
    ("{id: dtype_any, message: round_frame, field: dtype,",
     "{id: dtype_any, message: round_frame, field: dtyp,",
     "leniencies[0] (dtype_any): field 'dtyp' is not a field of message round_frame (known: "
     "magic, num_tensors, kind, weight, dtype, ndim, dim, nbytes, data, auth_tag; or, for no "
     "one field, payload)"),
    ("{id: rank_beyond_world, message: handshake, field: rank,",
     "{id: rank_beyond_world, message: handshake, field: rank_id,",
     "leniencies[3] (rank_beyond_world): field 'rank_id' is not a field of message handshake "
     "(known: magic, version, rank, world_size)"),
    ("{id: noncanonical_varint, message: relay_control_msg, field: varint,",
     "{id: noncanonical_varint, message: relay_control_msg, field: varints,",
     "leniencies[4] (noncanonical_varint): field 'varints' is not a field of message "
     "relay_control_msg (known: host, ranks, model_sigs, rank; or, for no one field, payload, "
     "varint)"),
], ids=["frame-field", "handshake-field", "word"])
def test_a_leniency_of_no_field_of_its_message_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A leniency's ``field`` was not looked up: ``dtyp`` was documented as written with exit
    0 (and the dissector lost its "lenient" mark of ``dtype``). A field of the message, of one
    of its parts or variants, or a word of ``LENIENCY_WORDS`` is taken."""
    _docs_of_a_changed_spec("wire.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize("field", ["ranks", "model_sigs", "payload"])
def test_a_leniency_of_a_variant_field_or_a_word_is_taken(field: str, tmp_path: Path) -> None:
    """The names a leniency's ``field`` may give beside its message's byte-layout fields: a
    bincode variant's field (``ranks`` of Hello, ``model_sigs`` of version 3 alone) and the
    words for no one field (``payload``, as the shipped spec's ``bincode_trailing``)."""
    spec_dir = _spec_copy(tmp_path, "wire.yaml",
                          lambda d: _set(d, ["leniencies", 4, "field"], field))
    assert Spec(spec_dir).raw["leniencies"][4]["field"] == field


#: (index of a leniency of the shipped spec, its id, its message): one per message kind
LENIENCY_OF = {
    "handshake": (3, "rank_beyond_world"), "round_frame": (0, "dtype_any"),
    "len_framed": (7, "loopback_trailing"), "mux_record": (6, "hostframe_trailing"),
    "relay_control_msg": (4, "noncanonical_varint"),
}


@pytest.mark.parametrize(("message", "word"), [
    ("round_frame", "payload"), ("len_framed", "payload"), ("relay_control_msg", "payload"),
    ("relay_control_msg", "varint")])
def test_a_leniency_word_is_taken_for_a_message_it_means_something_for(
        message: str, word: str, tmp_path: Path) -> None:
    """``payload`` is taken for a message with a field of a variable size (a frame's data, a
    loopback blob's body, a bincode message), ``varint`` for one with bincode variants."""
    index, _lid = LENIENCY_OF[message]
    spec_dir = _spec_copy(tmp_path, "wire.yaml",
                          lambda d: _set(d, ["leniencies", index, "field"], word))
    assert Spec(spec_dir).raw["leniencies"][index]["field"] == word


@pytest.mark.parametrize(("message", "word", "line"), [
    ("handshake", "payload", "has no field of a variable size (known: magic, version, rank, "
     "world_size)"),
    ("handshake", "varint", "has no bincode variants (known: magic, version, rank, "
     "world_size)"),
    ("round_frame", "varint", "has no bincode variants (known: magic, num_tensors, kind, "
     "weight, dtype, ndim, dim, nbytes, data, auth_tag; or, for no one field, payload)"),
    ("len_framed", "varint", "has no bincode variants (known: length, body; or, for no one "
     "field, payload)"),
    ("mux_record", "varint", "has no bincode variants (known: magic, version, kind, rank, "
     "payload_len, auth_tag, payload; or, for no one field, payload)"),
], ids=["handshake-payload", "handshake-varint", "round_frame-varint", "len_framed-varint",
        "mux_record-varint"])
def test_a_leniency_word_for_a_message_it_means_nothing_for_is_one_line_and_writes_nothing(
        message: str, word: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The words for no one field were taken for any message: ``field: payload`` of a
    handshake (16 bytes of fixed fields) and ``field: varint`` of a RoundFrame (no bincode in
    it) were documented with exit 0."""
    index, lid = LENIENCY_OF[message]
    old = f"{{id: {lid}, message: {message}, field: "
    text = (ROOT / "spec" / "wire.yaml").read_text(encoding="utf-8")
    field = text.split(old, 1)[1].split(",", 1)[0]
    _docs_of_a_changed_spec("wire.yaml", f"{old}{field},", f"{old}{word},", tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, (
        f"wire.yaml: leniencies[{index}] ({lid}): field {word!r} means nothing for message "
        f"{message}, which {line}"))


def _drop(doc: dict[str, Any], key: str) -> None:
    del doc[key]


@pytest.mark.parametrize(("change", "line"), [
    (lambda d: _drop(d, "semantics"), "missing section 'semantics'"),
    (lambda d: d.update(timeouts=5), "section 'timeouts' is the number 5, not a mapping"),
    (lambda d: d.update(departures={}), "section 'departures' is a mapping, not a list"),
    (lambda d: d["versions"].update(default="x"),
     "versions.default is the string 'x', not an integer"),
    (lambda d: d["versions"].update(supported=["2", 3]),
     "versions.supported[0] is the string '2', not an integer"),
    (lambda d: d["errors"].update({"handshake.read_failed": "x"}),
     "errors.handshake.read_failed is the string 'x', not a mapping"),
    (lambda d: d["enums"].update(RoundKind="x"),
     "enums.RoundKind is the string 'x', not a mapping"),
], ids=["no-semantics", "timeouts-number", "departures-mapping", "default-text",
        "supported-text", "error-text", "enum-text"])
def test_a_missing_section_or_a_value_of_another_kind_is_one_line_and_writes_nothing(
        change: Any, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wire.yaml without a section the docs render (the chapter was left out, exit 0), with
    a section or an entry of another kind (a traceback), or with a version that is no integer
    (``supported: ['2']`` was documented as a row ``| 2 |  |  |``)."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    doc = yaml.safe_load((ROOT / "spec" / "wire.yaml").read_text(encoding="utf-8"))
    change(doc)
    (spec_dir / "wire.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    shutil.copy(ROOT / "spec" / "lifecycle.yaml", spec_dir / "lifecycle.yaml")
    out = tmp_path / "protocol.md"
    assert main(["docs", "--spec", str(spec_dir), "--out", str(out)]) == 2
    assert not out.exists()
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


def _set(doc: Any, path: list[Any], value: Any) -> None:
    """Set the value at ``path`` (keys and list indices) of ``doc``."""
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _spec_copy(tmp_path: Path, name: str, change: Any) -> Path:
    """A spec folder: the checkout's two files, ``name`` parsed, changed by ``change`` and
    written back."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    for f in ("wire.yaml", "lifecycle.yaml"):
        shutil.copy(ROOT / "spec" / f, spec_dir / f)
    doc = yaml.safe_load((ROOT / "spec" / name).read_text(encoding="utf-8"))
    change(doc)
    (spec_dir / name).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return spec_dir


@pytest.mark.parametrize(("change", "line"), [
    (lambda d: _set(d, ["types", "u8", "size"], "one"),
     "types.u8.size is the string 'one', not an integer or null"),
    (lambda d: _set(d, ["messages", "handshake", "bogus"], 1),
     "messages.handshake: unknown key 'bogus' (known: auth, direction, doc, encoding, fields, "
     "kinds, leg, parts, size, source, struct, title, variants)"),
    (lambda d: _set(d, ["messages", "handshake", "fields", 0, "sise"], 4),
     "messages.handshake.fields[0]: unknown key 'sise' (known: condition, const, doc, enum, "
     "name, offset, size, type)"),
    (lambda d: d["constants"]["AUTH_TAG_LEN"].pop("value"),
     "constants.AUTH_TAG_LEN: missing key 'value'"),
    (lambda d: _set(d, ["constants", "AUTH_TAG_LEN", "value"], True),
     "constants.AUTH_TAG_LEN.value is True, not an integer"),
    (lambda d: _set(d, ["timeouts", "HANDSHAKE_READ", "scaled"], "yes"),
     "timeouts.HANDSHAKE_READ.scaled is the string 'yes', not true or false"),
    (lambda d: _set(d, ["enums", "Dtype", "values", "F32", "code"], "0"),
     "enums.Dtype.values.F32.code is the string '0', not an integer"),
    (lambda d: _set(d, ["messages", "relay_control_msg", "variants", 0, "fields", 0, "versions"],
                    [2, "3"]),
     "messages.relay_control_msg.variants[0].fields[0].versions[1] is the string '3', not an "
     "integer"),
    (lambda d: _set(d, ["examples", "handshake_v2", "tags"], {}),
     "examples.handshake_v2.tags is a mapping, not a list"),
    (lambda d: _set(d, ["semantics", "divide_once", "example", "frames", 0, "values", 1], None),
     "semantics.divide_once.example.frames[0].values[1] is null, not a number"),
    (lambda d: _set(d, ["errors", "frame.bad_magic", "templat"], "x"),
     "errors.frame.bad_magic: unknown key 'templat' (known: kind, side, source, template)"),
], ids=["type-size-text", "message-key", "field-key", "constant-no-value", "constant-bool",
        "scaled-text", "enum-code-text", "versions-text", "tags-mapping", "values-null",
        "error-key"])
def test_a_value_below_the_top_level_of_another_shape_is_one_line_naming_its_path(
        change: Any, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wire.yaml whose value below the top level has another shape than the spec's (a
    size that is no integer, a stray key in a message or a field) was loaded, and documented
    with exit 0."""
    spec_dir = _spec_copy(tmp_path, "wire.yaml", change)
    with pytest.raises(SpecError) as ei:
        Spec(spec_dir)
    assert str(ei.value) == f"wire.yaml: {line}"
    out = tmp_path / "protocol.md"
    assert main(["docs", "--spec", str(spec_dir), "--out", str(out)]) == 2
    assert not out.exists()
    assert capsys.readouterr() == _refused(tmp_path, f"wire.yaml: {line}")


@pytest.mark.parametrize(("change", "line"), [
    (lambda d: _set(d, ["machines", "controller", "states", "idle", "initial"], "yes"),
     "machines.controller.states.idle.initial is the string 'yes', not true or false"),
    (lambda d: _set(d, ["machines", "controller", "states", "idle", "entr"], "log"),
     "machines.controller.states.idle: unknown key 'entr' (known: enter, exit, final, "
     "initial, name, on, parallel, states, transitions)"),
    (lambda d: _set(d, ["machines", "relay", "states", "accepting_ranks", "on", "rank_connected",
                        0, "taget"], "x"),
     "machines.relay.states.accepting_ranks.on.rank_connected[0]: unknown key 'taget' (known: "
     "after, before, cond, event, initial, internal, on, target, unless, validators)"),
    (lambda d: _set(d, ["machines", "controller", "guards"], ["every_rank_covered"]),
     "machines.controller.guards is a list, not a mapping"),
    (lambda d: _set(d, ["machines", "relay", "catch_errors_as_events"], "no"),
     "machines.relay.catch_errors_as_events is the string 'no', not true or false"),
], ids=["initial-text", "state-key", "transition-key", "guards-list", "option-text"])
def test_a_lifecycle_value_of_another_shape_is_one_line_naming_its_path(
        change: Any, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lifecycle.yaml whose state, transition or machine holds a stray key or a value of
    another type was documented with exit 0 (the stray key drawn as nothing)."""
    spec_dir = _spec_copy(tmp_path, "lifecycle.yaml", change)
    with pytest.raises(SpecError) as ei:
        Spec(spec_dir).lifecycle()
    assert str(ei.value) == f"lifecycle.yaml: {line}"
    out = tmp_path / "protocol.md"
    assert main(["docs", "--spec", str(spec_dir), "--out", str(out)]) == 2
    assert not out.exists()
    assert capsys.readouterr() == _refused(tmp_path, f"lifecycle.yaml: {line}")


def _refused(tmp_path: Path, line: str) -> tuple[str, str]:
    """What ``docs --spec DIR`` prints (stdout, stderr) for the spec folder ``DIR`` =
    ``tmp_path/spec`` refused with ``line``: the option's value named, then its folder, as
    ``FLODL_PROTO_SPEC_DIR=DIR: ...`` names its own (the line read ``argument --spec: wire.yaml:
    ...``, naming no folder)."""
    return "", f"flodl-proto docs: error: argument --spec: {tmp_path / 'spec'}: {line}\n"


def _docs_of_a_changed_spec(name: str, old: str, new: str, tmp_path: Path) -> None:
    """Run ``docs --spec`` over a copy of the checkout's spec whose file ``name`` has ``old``
    replaced by ``new`` (which must occur in it); assert it exits 2 and writes no ``--out``
    file."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    for f in ("wire.yaml", "lifecycle.yaml"):
        text = (ROOT / "spec" / f).read_text(encoding="utf-8")
        assert f != name or old in text
        (spec_dir / f).write_text(text.replace(old, new) if f == name else text,
                                  encoding="utf-8")
    out = tmp_path / "protocol.md"
    assert main(["docs", "--spec", str(spec_dir), "--out", str(out)]) == 2
    assert not out.exists()


@pytest.mark.parametrize(("old", "new", "line"), [
    ("          all_covered:\n            - target: reducing\n",
     "          all_covered:\n            - target: reducingX\n",
     "ControllerLifecycle: the transition accepting --all_covered--> 'reducingX' targets no "
     "state of the machine (accepting, idle, reducing, shutdown)"),
    ("      shutdown:\n        name: Shutdown", "      orphan:\n        name: Orphan\n"
     "      shutdown:\n        name: Shutdown", "ControllerLifecycle: state 'orphan' is reached "
     "by no transition from the initial state idle (the library refuses a disconnected state)"),
    ("          relay_eof:\n            - target: shutdown\n", "          relay_eof:\n"
     "            - target: shutdown\n          pause:\n            - target: accepting\n",
     "ControllerLifecycle: event 'pause' of a transition has no entry in 'events' (its meaning)"),
    ("            - target: shutdown\n              cond: no_relay_alive\n",
     "            - target: shutdown\n              cond: no_relay_alivee\n",
     "ControllerLifecycle: guard 'no_relay_alivee' of a transition has no entry in 'guards' (its "
     "meaning)"),
    ("schema: flodl-proto-lifecycle/2\n", "schema: flodl-proto-lifecycle/9\n",
     "missing or unknown 'schema' (not flodl-proto-lifecycle/2)"),
    ("    states:\n", "    statez:\n",  # both machines: the first is named
     "machines.controller: unknown key 'statez' (known: allow_event_without_transition, "
     "catch_errors_as_events, departures, doc, events, guards, machine, outcomes, states)"),
])
def test_a_lifecycle_the_docs_cannot_draw_is_one_line_and_writes_nothing(
        old: str, new: str, line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A transition to a state its machine lacks was drawn in the diagram and the table, and a
    lifecycle of another schema documented, with exit 0."""
    _docs_of_a_changed_spec("lifecycle.yaml", old, new, tmp_path)
    assert capsys.readouterr() == _refused(tmp_path, f"lifecycle.yaml: {line}")


def test_the_timeout_scale_row_shows_its_bounds(rendered: str) -> None:
    row = next(line for line in rendered.splitlines()
               if line.startswith("| `ENV_NET_TIMEOUT_SCALE` |"))
    assert row.startswith("| `ENV_NET_TIMEOUT_SCALE` | env `FLODL_NET_TIMEOUT_SCALE`, default 1.0, "
                          "minimum 0.1, maximum 1000.0 |")


# -------------------------------------------------------------------------------------------------
# output paths: a folder or nothing is refused; the default is the checkout's file
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("prog", "command"), [
    ("docs", ["docs", "--out"]), ("dissector", ["dissector", "--out"]),
    ("conform docs", ["conform", "docs", "--out"]),
    ("conform controller", ["conform", "controller", "--list", "--junit"]),
    ("conform relay", ["conform", "relay", "--list", "--json"]),
])
@pytest.mark.parametrize(("value", "why"), [
    ("out/", "'out/' names a folder (it ends with /); give a file path in it"),
    ("", "is empty; give a file path, or - for stdout"),
])
def test_an_output_option_naming_a_folder_or_nothing_is_a_usage_error(
        prog: str, command: list[str], value: str, why: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # `--out dir/` wrote a file named `dir`, `--out ''` named the current folder
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([*command, value])
    if value == "" and command[-1] in ("--junit", "--json"):  # a report cannot be - either
        why = "is empty; give a file path"
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"flodl-proto {prog}: error: argument {command[-1]}: {why}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("command", "relative"), [
    (["docs"], "docs/protocol.md"), (["conform", "docs"], "docs/conformance.md"),
])
def test_a_generator_run_from_a_subfolder_writes_the_checkouts_file(
        command: list[str], relative: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # run from the checkout's tests/ folder, `docs` wrote a second tests/docs/protocol.md
    checkout = tmp_path / "checkout"
    shutil.copytree(SPEC.path, checkout / "spec")
    (checkout / "tests").mkdir()
    monkeypatch.chdir(checkout / "tests")
    assert main(command) == 0
    assert capsys.readouterr().out.startswith(f"'../{relative}': written (")
    assert (checkout / relative).is_file()
    assert list((checkout / "tests").iterdir()) == []
    # outside a checkout, the path is taken from the current folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(command) == 0
    assert capsys.readouterr().out.startswith(f"'{relative}': written (")
    assert (elsewhere / relative).is_file()
    # the README said where they write in a checkout only: an installed package's user running
    # them in a folder of their own found a docs/ folder made there
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ("and outside a checkout (an installed package) `docs/protocol.md` or "
            "`docs/conformance.md` under the current folder, `docs` from the package's spec"
            ) in readme

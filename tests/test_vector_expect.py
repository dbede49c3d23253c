"""A vector case's ``expect`` is judged: a value outside the schema makes the file no vector file,
and an outcome its op does not have (a write or a round trip expecting an error) fails the case.
``vectors check`` passed every such edited case."""

from __future__ import annotations

import collections
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flodl_proto.cli import main
from flodl_proto.errors import shown, shown_name
from flodl_proto.interop.registry import EXPECTS, FIELDS, VectorMismatch
from flodl_proto.interop.vectors import Case, VectorFileError, iter_cases, run_case

BUNDLED = Path(__file__).resolve().parent.parent / "flodl_proto" / "_vectors"
T = TypeVar("T")


def _first(op: str, expect: str) -> Case:
    for case in iter_cases(BUNDLED):
        if case.data["op"] == op and case.data["expect"] == expect:
            return case
    raise LookupError(f"no bundled {op} case expecting {expect}")


def _edited(case: Case, **changes: Any) -> Case:
    return Case(case.file, case.version, {**case.data, **changes})


@pytest.mark.parametrize("op", ["handshake.rank_write", "round_frame.roundtrip",
                                "mux_record.roundtrip", "bf16.from_f32", "dead_ranks"])
def test_a_case_of_an_op_that_always_succeeds_cannot_expect_an_error(op: str) -> None:
    case = _first(op, "ok")
    run_case(case)
    for other in ("error", "eof"):
        with pytest.raises(VectorMismatch, match=rf"expect '{other}': a {op} case expects 'ok'"):
            run_case(_edited(case, expect=other))


def test_a_reader_case_cannot_expect_an_outcome_its_reader_does_not_give() -> None:
    case = _first("handshake.read", "error")
    with pytest.raises(VectorMismatch, match=r"expect 'eof': a handshake.read case expects "
                                             r"'ok', 'error'"):
        run_case(_edited(case, expect="eof"))


def test_a_controller_session_s_expect_must_agree_with_its_result() -> None:
    case = _first("controller_session", "ok")
    with pytest.raises(VectorMismatch, match="the case expects 'error' and its controller "
                                             "result is 'ok'"):
        run_case(_edited(case, expect="error"))


def test_every_op_judges_the_outcomes_its_bundled_cases_expect() -> None:
    for case in iter_cases(BUNDLED):
        assert case.data["expect"] in EXPECTS[case.data["op"]], case.id


def _refused(root: Path, path: Path, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``root`` is refused: loading it raises ``'PATH': not a vector file (WHY)`` and ``vectors
    check`` prints that one line (no output, nothing run) and exits 2."""
    with pytest.raises(VectorFileError) as e:
        list(iter_cases(root))
    assert str(e.value) == f"{shown(str(path))}: not a vector file ({why})"
    assert main(["vectors", "check", str(root)]) == 2
    assert capsys.readouterr() == ("", f"flodl-proto vectors check: error: "
                                       f"{shown(str(path))}: not a vector file ({why})\n")


def _copy_edited(tmp_path: Path, edit: Callable[[dict[str, Any]], T],
                 file: str = "handshake.json") -> tuple[Path, Path, T]:
    """A copy of the bundled folder (``tmp_path/vec``) whose ``file`` is the bundled one as
    ``edit`` changed its document (in place); the folder, that file and what ``edit``
    returned."""
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / file
    doc = json.loads(path.read_text(encoding="utf-8"))
    got = edit(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return root, path, got


_MISSING = object()  # a change that removes the key


@pytest.mark.parametrize(("change", "problem"), [
    ({"expect": "bogus"}, "expect 'bogus' is not one of 'ok', 'error', 'eof'"),
    ({"expect": None}, "expect None is not one of 'ok', 'error', 'eof'"),
    ({"op": 3}, "field 'op' is the number 3, not a string"),
    ({"op": None}, "field 'op' is null, not a string"),
    ({"op": ["handshake.read"]}, "field 'op' is an array, not a string"),
    ({"op": _MISSING}, "field 'op' is missing"),
    ({"id": _MISSING}, "field 'id' is missing"),
    ({"id": 7}, "field 'id' is the number 7, not a string"),
    # it read "expect None is not one of ...", as for an expect of null
    ({"expect": _MISSING}, "field 'expect' is missing"),
    ({"expect": "e" * 300}, f"expect '{'e' * 40}...{'e' * 20}' (300 characters) is not one of "
                            "'ok', 'error', 'eof'"),
    # an array of 100000 numbers was quoted whole, a line of 688890 characters
    ({"expect": list(range(100000))}, "expect [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1...99997, "
                                      "99998, 99999] (688890 characters) is not one of 'ok', "
                                      "'error', 'eof'"),
    ({"expect": {"k": "v" * 100}}, f"expect {{'k': '{'v' * 33}...{'v' * 18}'}} (109 characters) "
                                   "is not one of 'ok', 'error', 'eof'"),
    # a number of 100 digits was printed whole
    ({"op": 10**99}, "field 'op' is the number <an integer of 329 bits>, not a string"),
])
def test_a_case_outside_the_schema_makes_the_file_no_vector_file(
        change: dict[str, Any], problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A case without an ``op`` read ``op None is not a string`` (as one whose op is null), and
    an op of another kind was shown in Python's words (``op 3``); both now read as every other
    field's problem, after the case's id."""
    def edit(doc: dict[str, Any]) -> str:
        for key, value in change.items():
            if value is _MISSING:
                del doc["cases"][0][key]
            else:
                doc["cases"][0][key] = value
        return str(doc["cases"][0].get("id"))

    root, path, case_id = _copy_edited(tmp_path, edit)
    prefix = "" if "id" in change else f"{case_id}: "
    _refused(root, path, f"case 0: {prefix}{problem}", capsys)


@pytest.mark.parametrize(("file", "dup", "of"), [("handshake.json", 5, 2),
                                                 ("v2/controller_session.json", 1, 0)])
def test_a_file_with_two_cases_of_one_id_is_no_vector_file(
        file: str, dup: int, of: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two cases of one id both ran, and a failure line (``FAIL ID: ...``, which names a case by
    its id only) could not say which of them failed."""
    def edit(doc: dict[str, Any]) -> str:
        case_id = doc["cases"][dup]["id"] = doc["cases"][of]["id"]
        return str(case_id)

    root, path, case_id = _copy_edited(tmp_path, edit, file)
    _refused(root, path, f"case {dup}: {case_id}: duplicate id, first at case {of}", capsys)


def _duplicate_id(doc: dict[str, Any], case_id: str) -> str:
    doc["cases"][1]["id"] = doc["cases"][3]["id"] = case_id
    return "case 3: {shown}: duplicate id, first at case 1"


def _id_of_a_case_without_op(doc: dict[str, Any], case_id: str) -> str:
    doc["cases"][2]["id"] = case_id
    del doc["cases"][2]["op"]
    return "case 2: {shown}: field 'op' is missing"


@pytest.mark.parametrize("problem", [_duplicate_id, _id_of_a_case_without_op],
                         ids=["duplicate", "outside-the-schema"])
@pytest.mark.parametrize(("case_id", "shown"), [
    ("", "''"),
    ("i" * 3000, f"'{'i' * 40}...{'i' * 20}' (3000 characters)"),
    ("two\nlines", "'two\\nlines'"),
    (" padded ", "' padded '"),
    ("handshake.read: a plain id", "handshake.read: a plain id"),
], ids=["empty", "long", "newline", "padded", "plain"])
def test_an_id_that_is_not_plain_is_quoted_in_the_refusal(
        problem: Callable[[dict[str, Any], str], str], case_id: str, shown: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A duplicate id was printed as it is: an empty one as ``case 3: : duplicate id``, one of
    thousands of characters whole, one with a line break over two lines. Such an id is quoted
    by its ends and its length (:func:`flodl_proto.errors.shown`); a plain one is as it was.
    ``case N: ID: problem`` of a case outside the schema quotes the id likewise."""
    root, path, why = _copy_edited(tmp_path, lambda doc: problem(doc, case_id))
    _refused(root, path, why.format(shown=shown), capsys)


def test_an_id_of_a_case_of_another_file_is_a_duplicate_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ids are unique across the files of a folder (the shared schema); one of an earlier file's
    cases was taken again, and a failure line could not say which case failed."""
    earlier = json.loads((BUNDLED / "bf16.json").read_text(encoding="utf-8"))
    # handshake.json is read after bf16.json (files in name order)
    root, path, _ = _copy_edited(tmp_path, lambda doc: doc["cases"][2].update(
        id=earlier["cases"][1]["id"]))
    _refused(root, path, f"case 2: {earlier['cases'][1]['id']}: duplicate id, first at case 1 of "
             f"{shown_name(str(root / 'bf16.json'))}", capsys)


def _edit_first(root: Path, file: str, op: str, expect: str, **changes: Any) -> tuple[Path, str]:
    """Apply ``changes`` (None: remove the key) to the first ``op`` case of ``root/file``
    expecting ``expect``; return the file and the case's index and id as ``"i: id"``."""
    path = root / file
    doc = json.loads(path.read_text(encoding="utf-8"))
    i, case = next((i, c) for i, c in enumerate(doc["cases"])
                   if c["op"] == op and c["expect"] == expect)
    for key, value in changes.items():
        if value is None:
            del case[key]
        else:
            case[key] = value
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path, f"{i}: {case['id']}"


@pytest.mark.parametrize(("file", "op", "expect", "change", "problem"), [
    ("handshake.json", "handshake.read", "error", {"bytes": None}, "field 'bytes' is missing"),
    ("handshake.json", "handshake.read", "ok", {"rank_id": None}, "field 'rank_id' is missing"),
    ("handshake.json", "handshake.read", "error", {"expected_world_size": "4"},
     "field 'expected_world_size' is the string '4', not a whole number"),
    ("handshake.json", "handshake.read", "error", {"error_prefix": None},
     "field 'error_prefix' is missing"),
    ("round_frame.json", "round_frame.roundtrip", "ok", {"frame": "00"},
     "field 'frame' is the string '00', not an object"),
    ("round_frame.json", "round_frame.read", "error", {"salt": "not-a-salt"},
     "field 'salt' is the string 'not-a-salt', not a string of bytes in lowercase hex digits: "
     "'n', 'o', 't', ... are not hex digits"),
    # was cut at 40 characters, without its length: 'zzz...z'...
    ("round_frame.json", "round_frame.read", "error", {"salt": "z" * 300},
     f"field 'salt' is the string '{'z' * 40}...{'z' * 20}' (300 characters), not a string of "
     "bytes in lowercase hex digits: 'z' is not a hex digit"),
    ("bf16.json", "bf16.from_f32", "ok", {"f32_bits": 1065353216},
     "field 'f32_bits' is the number 1065353216, not a string of '0x' and lowercase hex digits"),
    ("reduce.json", "reduce_realized_work", "ok", {"inputs": {}},
     "field 'inputs' is an object, not an array"),
    ("dead_ranks.json", "dead_ranks", "ok", {"world_size": True},
     "field 'world_size' is true, not a whole number"),
    ("controller_session.json", "controller_session", "ok", {"after": None},
     "field 'after' is missing"),
])
def test_a_case_without_a_field_its_op_reads_makes_the_file_no_vector_file(
        file: str, op: str, expect: str, change: dict[str, Any], problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Such a case ran and failed with Python's words for it ("FAIL ...: KeyError: 'bytes'",
    exit 1), or passed: nothing checked a case's fields but ``id``, ``op`` and ``expect``."""
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path, where = _edit_first(root, file, op, expect, **change)
    _refused(root, path, f"case {where}: {problem}", capsys)


def test_the_fields_an_op_declares_are_every_field_its_handler_needs() -> None:
    """Every bundled case, cut down to ``id``, ``op``, ``expect`` and its op's declared fields,
    still passes: a case that passes the load-time field check never meets a handler's missing
    key. Kept besides: a relay fold's ``records`` (optional: none means the fold ships none)."""
    cut: collections.Counter[str] = collections.Counter()
    for case in iter_cases(BUNDLED):
        declared = FIELDS[case.data["op"]][case.data["expect"]]
        keep = {"id", "op", "expect", "records", *declared}
        data = {k: v for k, v in case.data.items() if k in keep}
        cut.update(set(case.data) - keep)
        run_case(Case(case.file, case.version, data))
    # the optional fields, checked only when present, were cut and the cases still pass
    assert set(cut) == {"description", "error", "bincode", "broadcast_record",
                        "bf16_as_f32_bits"}


@pytest.mark.parametrize(("version", "shown"), [(9, "9"), (1, "1"), ("3", "'3'"), (3.0, "3.0"),
                                                (True, "True"), (None, "None")])
def test_a_file_of_a_protocol_version_not_spoken_is_no_vector_file(
        version: Any, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``protocol_version`` 9 ran its cases as version 9 (those the codec does not tell apart
    passed); ``"3"`` and ``3.7`` were read as 3."""
    root, path, _ = _copy_edited(tmp_path, lambda doc: doc.update(protocol_version=version))
    why = f"protocol_version {shown} is not one this implementation speaks: 2, 3"
    _refused(root, path, why, capsys)


@pytest.mark.parametrize(("doc", "why"), [
    ({"protocol_version": 3}, "no key 'cases'"),
    ({"cases": []}, "no key 'protocol_version'"),
    ({"protocol_version": 3, "cases": {}}, "cases is a JSON object, not an array"),
    ({"protocol_version": 3, "cases": "x"}, "cases is a JSON string, not an array"),
    ({"protocol_version": 3, "cases": [7]}, "case 0: not an object but a JSON number"),
])
def test_a_file_without_its_cases_is_no_vector_file(
        doc: dict[str, Any], why: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / "handshake.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    _refused(root, path, why, capsys)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "too-large", "list", "not-utf8", "folder",
                                  "deep", "null"])
def test_a_file_that_cannot_be_a_vector_file_is_refused_before_it_is_read_whole(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A link to /dev/zero was read until memory ran out (24 GB, then the OOM killer); a FIFO
    blocked the check forever; ``[]`` and ``null`` were reported in Python's words; a folder
    named ``*.json`` was named by its descriptor ("3: Is a directory"); JSON nested deeper
    than the decoder recurses was a RecursionError traceback."""
    import os

    from flodl_proto.interop import vectors

    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / "handshake.json"
    path.unlink()
    limit = max(f.stat().st_size for f in root.rglob("*.json"))  # every other file fits
    why = {"dev-zero": "not a regular file", "fifo": "not a regular file",
           "too-large": f"larger than {limit} bytes", "list": "a JSON array, not an object",
           "not-utf8": "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
           "folder": "a folder", "deep": "JSON nested too deeply to read",
           "null": "a JSON null, not an object"}
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "too-large":
        monkeypatch.setattr(vectors, "MAX_VECTOR_FILE_BYTES", limit)
        path.write_text(json.dumps({"protocol_version": 3, "cases": [], "pad": "x" * limit}))
    elif kind == "list":
        path.write_text("[]")
    elif kind == "folder":
        path.mkdir()
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "null":
        path.write_text("null")
    else:
        path.write_bytes(b"\xff{}")
    _refused(root, path, why[kind], capsys)


@pytest.mark.parametrize(("manifest", "count"), [("[]", "None"), ('{"total_cases": "9"}', "'9'"),
                                               ("{}", "None"), ('{"total_cases": -1}', "-1")])
def test_a_malformed_manifest_is_one_line_not_a_traceback(
        manifest: str, count: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    (root / "v2" / "manifest.json").write_text(manifest)
    assert main(["vectors", "check", str(root)]) == 2
    assert capsys.readouterr() == ("", (
        f"flodl-proto vectors check: error: {shown(str(root / 'v2' / 'manifest.json'))}: "
        "not a manifest "
        f"(total_cases {count} is not a whole number >= 0)\n"))


def test_vectors_check_fails_a_write_case_edited_to_expect_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _, _ = _copy_edited(tmp_path, lambda doc: next(
        c for c in doc["cases"] if c["op"] == "handshake.rank_write").update(expect="error"))
    assert main(["vectors", "check", str(root)]) == 1
    out = capsys.readouterr().out
    assert "total: 369/370 passed" in out


@pytest.mark.parametrize("weight", [7.0, None])
def test_a_frame_whose_weight_contradicts_its_bits_fails(weight: Any) -> None:
    """``weight`` 7.0 beside ``weight_bits`` 0x3ff0000000000000 (1.0) passed: only the bits were
    compared. The number is now compared too (null stands for a weight that is not finite)."""
    case = _first("round_frame.roundtrip", "ok")
    run_case(case)
    frame = {**case.data["frame"], "weight": weight}
    assert frame["weight_bits"] == "0x3ff0000000000000"
    with pytest.raises(VectorMismatch, match=rf"frame.weight: got 1.0, want {weight!r}"):
        run_case(_edited(case, frame=frame))


def test_a_number_too_long_to_read_is_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # it was Python's "Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()"
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / "handshake.json"
    path.write_text('{"protocol_version": 3, "cases": [], "n": ' + "9" * 5000 + "}")
    _refused(root, path, "a number of more than 4300 digits", capsys)


_NESTED_GONE = object()  # a nested change that removes the key


@pytest.mark.parametrize(("file", "op", "expect", "where", "value", "problem"), [
    ("round_frame.json", "round_frame.roundtrip", "ok", ("frame", "tensors"), 5,
     "field 'frame.tensors' is the number 5, not an array"),
    ("round_frame.json", "round_frame.roundtrip", "ok", ("frame", "tensors", 0), 5,
     "field 'frame.tensors[0]' is the number 5, not an object"),
    ("round_frame.json", "round_frame.roundtrip", "ok", ("frame", "tensors", 0, "data"), "zz",
     "field 'frame.tensors[0].data' is the string 'zz', not a string of bytes in lowercase "
     "hex digits: 'z' is not a hex digit"),
    ("round_frame.json", "round_frame.read", "ok", ("frame", "kind_byte"), _NESTED_GONE,
     "field 'frame.kind_byte' is missing"),
    ("reduce.json", "reduce_realized_work", "ok", ("output", "frame", "weight_bits"), 1,
     "field 'output.frame.weight_bits' is the number 1, not a string of '0x' and lowercase hex "
     "digits"),
    ("controller_session.json", "controller_session", "ok", ("steps", 0, "conn"), "x",
     "field 'steps[0].conn' is the string 'x', not a whole number"),
    ("controller_session.json", "controller_session", "ok", ("controller", "result"),
     _NESTED_GONE, "field 'controller.result' is missing"),
    ("controller_session.json", "controller_session", "ok", ("after", 0, "closed_by_controller"),
     "yes", "field 'after[0].closed_by_controller' is the string 'yes', not true or false"),
], ids=["tensors-number", "tensor-number", "tensor-data", "kind-byte-missing", "output-frame",
        "step-conn", "controller-result", "after-closed"])
def test_a_malformed_nested_field_makes_the_file_no_vector_file(
        file: str, op: str, expect: str, where: tuple[str | int, ...], value: Any, problem: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A nested field of another kind or missing (a frame's ``tensors``, a step's ``conn``) was
    not checked ahead: the case ran and failed in Python's words (``FAIL ...: TypeError: 'int'
    object is not iterable``, ``KeyError: 'result'``), or passed. It is checked with the case's
    own fields and named by its path."""
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / file
    doc = json.loads(path.read_text(encoding="utf-8"))
    i, case = next((i, c) for i, c in enumerate(doc["cases"])
                   if c["op"] == op and c["expect"] == expect)
    parent = case
    for key in where[:-1]:
        parent = parent[key]
    if value is _NESTED_GONE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    path.write_text(json.dumps(doc), encoding="utf-8")
    _refused(root, path, f"case {i}: {case['id']}: {problem}", capsys)


def test_a_step_on_a_connection_not_open_fails_in_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A controller session whose first step (the connect) is removed failed with ``KeyError:
    0``; it names the step and the connection."""
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / "controller_session.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    case = next(c for c in doc["cases"] if c["op"] == "controller_session")
    assert case["steps"][0]["action"] == "connect"
    conn = case["steps"][0]["conn"]
    del case["steps"][0]
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(VectorMismatch) as e:
        run_case(Case("controller_session", 3, case))
    step = case["steps"][0]
    assert str(e.value) == (f"step 0 ({step['action']} on connection {step['conn']}): connection "
                            f"{step['conn']} is not open (no connect step before, or closed)")
    assert step["conn"] == conn


def _flip(hex_text: str, at: int) -> str:
    b = bytearray.fromhex(hex_text)
    b[at] ^= 0x01
    return b.hex()


def test_an_encoding_that_differs_names_where_and_the_auth_tag() -> None:
    """A case whose bytes another implementation wrote: the mismatch says at which byte the
    encodings part, and when that is an auth tag over the same bytes (another salt or MAC)."""
    rf = _first("round_frame.roundtrip", "ok")
    n = len(rf.data["bytes"]) // 2
    with pytest.raises(VectorMismatch) as e:
        run_case(_edited(rf, bytes=_flip(rf.data["bytes"], n - 1)))
    assert str(e.value).splitlines()[0] == (
        f"encoded bytes differ (first at byte {n - 1}: the frame's auth tag, the bytes before "
        "it are the same):")
    with pytest.raises(VectorMismatch) as e:
        run_case(_edited(rf, bytes=rf.data["bytes"][:-2]))
    assert str(e.value).splitlines()[0] == (
        f"encoded bytes differ (first at byte {n - 1}; {n} bytes, want {n - 1}):")
    mux = _first("mux_record.roundtrip", "ok")
    wire = _flip(mux.data["bytes"], 24)
    with pytest.raises(VectorMismatch) as e:
        run_case(_edited(mux, bytes=wire, header=wire[:50], auth_tag=wire[34:50]))
    assert str(e.value).splitlines()[0] == (
        "encoded bytes differ (first at byte 24: the header's auth tag, the bytes after the "
        "header are the same):")

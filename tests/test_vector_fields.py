"""A vector case's fields below its own (a step's bytes, a reduction's inputs, a record's
control message, a controller session's outcome) and its counts are checked before any case
runs: a malformed one makes its file no vector file, told in one line naming the case, the
field by its path and the value, never in Python's words for what went wrong with it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.cli import main
from flodl_proto.errors import shown
from flodl_proto.interop.registry import VectorMismatch
from flodl_proto.interop.vectors import VectorFileError, iter_cases, run_case

BUNDLED = Path(__file__).resolve().parent.parent / "flodl_proto" / "_vectors"

_GONE = object()  # a change that removes the key


def _refused_edit(tmp_path: Path, capsys: pytest.CaptureFixture[str], file: str, op: str,
                  expect: str, where: tuple[str | int, ...], value: Any, problem: str,
                  pick: Callable[[dict[str, Any]], bool] = lambda c: True) -> None:
    """Set the field at ``where`` (``_GONE``: remove it; a callable: what it returns of the
    case) of the first ``op`` case of the bundled ``file`` expecting ``expect`` (and ``pick``
    holds of); the copied folder is refused in one line, ``'PATH': not a vector file (case I:
    ID: PROBLEM)``, by loading and by ``vectors check`` (exit 2, nothing run)."""
    root = tmp_path / "vec"
    shutil.copytree(BUNDLED, root)
    path = root / file
    doc = json.loads(path.read_text(encoding="utf-8"))
    i, case = next((i, c) for i, c in enumerate(doc["cases"])
                   if c["op"] == op and c["expect"] == expect and pick(c))
    parent = case
    for key in where[:-1]:
        parent = parent[key]
    if value is _GONE:
        del parent[where[-1]]
    elif callable(value):
        parent[where[-1]] = value(case)
    else:
        parent[where[-1]] = value
    path.write_text(json.dumps(doc), encoding="utf-8")
    line = f"{shown(str(path))}: not a vector file (case {i}: {case['id']}: {problem})"
    with pytest.raises(VectorFileError) as e:
        list(iter_cases(root))
    assert str(e.value) == line
    assert main(["vectors", "check", str(root)]) == 2
    assert capsys.readouterr() == ("", f"flodl-proto vectors check: error: {line}\n")


_CS = "controller_session.json"
_HEX = "not a string of bytes in lowercase hex digits"
_Z = ": 'z' is not a hex digit"


@pytest.mark.parametrize(("expect", "where", "value", "problem"), [
    # each read "FAIL ...: ValueError: non-hexadecimal number found in fromhex() arg at
    # position 0", "TypeError: fromhex() argument must be str, not int", "KeyError: 'bytes'"
    ("ok", ("steps", 1, "bytes"), "zz", f"field 'steps[1].bytes' is the string 'zz', {_HEX}{_Z}"),
    ("ok", ("steps", 1, "bytes"), 7, f"field 'steps[1].bytes' is the number 7, {_HEX}"),
    ("ok", ("steps", 1, "bytes"), _GONE, "field 'steps[1].bytes' is missing"),
    ("ok", ("steps", 3, "bytes"), None, f"field 'steps[3].bytes' is null, {_HEX}"),
    # ran until the step and failed with "step 1 (jump on connection 0): unknown action"
    ("ok", ("steps", 1, "action"), "jump",
     "field 'steps[1].action' is the string 'jump', not one of 'connect', 'send', 'recv', "
     "'close'"),
    ("ok", ("world_size", ), -2, "field 'world_size' is the number -2, not a whole number "
                                 "from 0 to 4294967295"),
    # "KeyError: 'error_prefix'"
    ("error", ("controller", "error_prefix"), _GONE, "field 'controller.error_prefix' is missing"),
    ("error", ("controller", "error_prefix"), 3,
     "field 'controller.error_prefix' is the number 3, not a string"),
    ("error", ("controller", "error_kind"), ["magic"],
     "field 'controller.error_kind' is an array, not a string"),
    # passed: a string was true
    ("ok", ("controller", "exited_before_client_close"), "no",
     "field 'controller.exited_before_client_close' is the string 'no', not true or false"),
    ("error", ("error", ), 3, "field 'error' is the number 3, not a string"),
    # passed: a connection no step opens was skipped, unread
    ("ok", ("after", 0, "conn"), 5,
     "field 'after[0].conn' is the number 5, not a connection a connect step opens"),
    ("error", ("after", 0, "conn"), 10**400,
     "field 'after[0].conn' is the number <an integer of 1329 bits>, not a connection a "
     "connect step opens"),
], ids=["bytes-not-hex", "bytes-number", "bytes-missing", "recv-bytes-null", "action-unknown",
        "world-size-negative", "error-prefix-missing", "error-prefix-number",
        "error-kind-array", "exited-string", "error-number", "after-not-opened",
        "after-huge"])
def test_a_malformed_controller_session_field_is_one_line(
        expect: str, where: tuple[str | int, ...], value: Any, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _refused_edit(tmp_path, capsys, _CS, "controller_session", expect, where, value, problem)


def test_a_controller_session_without_the_whole_expected_error_runs() -> None:
    """``controller.error`` (the whole message, beside its ``error_prefix``) is a description:
    a session without it failed with ``KeyError: 'error'`` (read for the message of a failure
    even when none happened); it passes, and a failure names the prefix it wanted."""
    case = next(c for c in iter_cases(BUNDLED)
                if c.data["op"] == "controller_session" and c.data["expect"] == "error")
    del case.data["controller"]["error"]
    run_case(case)


def test_a_connection_number_of_many_digits_is_shown_by_its_size() -> None:
    """A step on a connection of a 401-digit number not open printed the number whole."""
    case = next(c for c in iter_cases(BUNDLED)
                if c.data["op"] == "controller_session" and c.data["expect"] == "ok")
    case.data["steps"][1]["conn"] = 10**400
    with pytest.raises(VectorMismatch) as e:
        run_case(case)
    assert str(e.value) == ("step 1 (send on connection <an integer of 1329 bits>): connection "
                            "<an integer of 1329 bits> is not open (no connect step before, or "
                            "closed)")


def _connects(n: int) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    return lambda case: [{"conn": i, "action": "connect"} for i in range(n)]


@pytest.mark.parametrize(("where", "value", "problem"), [
    # opened 100000 connections and failed with "ConnectionRefusedError: [Errno 111] ..."
    (("steps", ), _connects(100000),
     "field 'steps' holds 100000 steps, more than the 20000 a case may hold"),
    (("steps", ), _connects(257),
     "field 'steps' opens 257 connections, more than the 256 a case may open"),
    (("after", ), lambda case: case["after"] * 257,
     "field 'after' holds 257 entries, more than the 256 a case may hold"),
], ids=["steps", "connections", "after"])
def test_a_controller_session_of_too_many_steps_is_refused_ahead(
        where: tuple[str | int, ...], value: Any, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _refused_edit(tmp_path, capsys, _CS, "controller_session", "ok", where, value, problem)


def test_the_bounds_of_a_session_are_well_above_the_shared_cases() -> None:
    from flodl_proto.interop.ops_controller import MAX_CONNECTIONS, MAX_STEPS

    sessions = [c.data for c in iter_cases(BUNDLED) if c.data["op"] == "controller_session"]
    assert max(len(c["steps"]) for c in sessions) * 10 <= MAX_STEPS
    most = max(sum(s["action"] == "connect" for s in c["steps"]) for c in sessions)
    assert most * 10 <= MAX_CONNECTIONS
    assert max(len(c["after"]) for c in sessions) * 10 <= MAX_CONNECTIONS


@pytest.mark.parametrize(("op", "expect", "where", "value", "problem"), [
    # "ValueError: non-hexadecimal number found in fromhex() arg at position 0"
    ("reduce_realized_work", "ok", ("inputs", 0, "bytes"), "zz",
     f"field 'inputs[0].bytes' is the string 'zz', {_HEX}{_Z}"),
    # "TypeError: string indices must be integers, not 'str'"
    ("reduce_realized_work", "ok", ("inputs", 1), "x",
     "field 'inputs[1]' is the string 'x', not an object or null"),
    ("reduce_realized_work", "error", ("inputs", 0, "bytes"), _GONE,
     "field 'inputs[0].bytes' is missing"),
    # "ValueError: 7 is not a valid RoundKind" (a dtype of -1: "LocalInvalidValue: ...")
    ("reduce_realized_work", "error", ("inputs", 1, "frame", "kind_byte"), 7,
     "field 'inputs[1].frame.kind_byte' is the number 7, not a round kind byte (0 model, "
     "1 control)"),
    ("sum_frames", "ok", ("inputs", 0, "frame", "tensors", 0, "dtype"), -1,
     "field 'inputs[0].frame.tensors[0].dtype' is the number -1, not a whole number from 0 to "
     "255"),
    ("reduce_realized_work", "ok", ("broadcast_record", ), 5,
     f"field 'broadcast_record' is the number 5, {_HEX}"),
    # passed: true == 1.0
    ("reduce_realized_work", "ok", ("inputs", 1, "frame", "weight"), True,
     "field 'inputs[1].frame.weight' is true, not a number or null"),
], ids=["input-bytes", "input-string", "input-bytes-missing", "input-kind-byte",
        "input-dtype", "broadcast-record", "weight-true"])
def test_a_malformed_reduce_input_is_one_line(
        op: str, expect: str, where: tuple[str | int, ...], value: Any, problem: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused_edit(tmp_path, capsys, "reduce.json", op, expect, where, value, problem)


@pytest.mark.parametrize(("expect", "where", "value", "problem"), [
    ("ok", ("steps", 0, "step"), _GONE, "field 'steps[0].step' is missing"),  # KeyError: 'step'
    # "TypeError: 'int' object is not subscriptable"
    ("ok", ("steps", 0), 3, "field 'steps[0]' is the number 3, not an object"),
    ("error", ("steps", 1, "blob"), 5, f"field 'steps[1].blob' is the number 5, {_HEX}"),
    ("error", ("steps", 0, "rank"), "x",
     "field 'steps[0].rank' is the string 'x', not a whole number"),
    ("ok", ("steps", 0, "rank"), _GONE, "field 'steps[0].rank' is missing"),
    ("ok", ("steps", 0, "step"), "fold",
     "field 'steps[0].step' is the string 'fold', not one of 'deposit', 'declare_dead'"),
    # "IndexError: list index out of range"
    ("error", ("steps", ), [],
     "field 'steps' is an empty array; an error case's last step is the one that fails"),
    ("ok", ("local_ranks", 0), -1,
     "field 'local_ranks[0]' is the number -1, not a whole number from 0 to 4294967295"),
    # "TypeError: string indices must be integers, not 'str'"
    ("ok", ("records", 0), "r", "field 'records[0]' is the string 'r', not an object"),
    ("ok", ("records", 0, "payload"), _GONE, "field 'records[0].payload' is missing"),
], ids=["step-missing", "step-number", "blob-number", "rank-string", "rank-missing",
        "step-unknown", "no-steps", "local-rank-negative", "record-string", "record-payload"])
def test_a_malformed_relay_fold_step_is_one_line(
        expect: str, where: tuple[str | int, ...], value: Any, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _refused_edit(tmp_path, capsys, "relay_fold.json", "relay_fold", expect, where, value,
                  problem)


def _control(case: dict[str, Any]) -> bool:
    return bool(case["record"]["kind_byte"] == 2)


@pytest.mark.parametrize(("file", "op", "where", "value", "problem", "pick"), [
    # "LocalInvalidValue: handshake: rank = -1 is invalid: not a u32"
    ("handshake.json", "handshake.rank_write", ("rank_id", ), -1,
     "field 'rank_id' is the number -1, not a whole number from 0 to 4294967295", None),
    ("handshake.json", "handshake.rank_write", ("world_size", ), 10**400,
     "field 'world_size' is the number <an integer of 1329 bits>, not a whole number from 0 "
     "to 4294967295", None),
    # "LocalInvalidValue: round_frame: tensor dim[0] = -1 doesn't fit in u32"
    ("round_frame.json", "round_frame.roundtrip", ("frame", "tensors", 0, "shape", 0), -1,
     "field 'frame.tensors[0].shape[0]' is the number -1, not a whole number from 0 to "
     "4294967295", None),
    ("round_frame.json", "round_frame.roundtrip", ("frame", "weight_bits"), "0x" + "f" * 17,
     "field 'frame.weight_bits' is the string '0xfffffffffffffffff', not a string of '0x' and "
     "16 lowercase hex digits (a 64-bit pattern): it has 17 digits", None),
    ("round_frame.json", "round_frame.roundtrip", ("frame", "weight_bits"), "0x3FF0000000000000",
     "field 'frame.weight_bits' is the string '0x3FF0000000000000', not a string of '0x' and "
     "16 lowercase hex digits (a 64-bit pattern): its digit 'F' is upper case", None),
    ("round_frame.json", "round_frame.roundtrip", ("frame", "weight_bits"), "3ff0000000000000",
     "field 'frame.weight_bits' is the string '3ff0000000000000', not a string of '0x' and "
     "16 lowercase hex digits (a 64-bit pattern): it has no '0x' prefix", None),
    # "KeyError: 'kind_byte'", "ValueError: 9 is not a valid RecordKind"
    ("mux_record.json", "mux_record.roundtrip", ("record", ), {},
     "field 'record.kind_byte' is missing", None),
    ("mux_record.json", "mux_record.roundtrip", ("record", "kind_byte"), 9,
     "field 'record.kind_byte' is the number 9, not a record kind byte (1 data, 2 control, "
     "3 host_frame, 4 broadcast)", None),
    ("mux_record.json", "mux_record.roundtrip", ("record", "payload"), "zz",
     f"field 'record.payload' is the string 'zz', {_HEX}{_Z}", None),
    ("mux_record.json", "mux_record.roundtrip", ("record", "rank"), _GONE,
     "field 'record.rank' is missing", None),
    # "VectorMismatch: unknown control variant 'Bye'", "KeyError: 'host'"
    ("mux_record.json", "mux_record.roundtrip", ("record", "control", "variant"), "Bye",
     "field 'record.control.variant' is the string 'Bye', not one of 'Hello', 'HelloAck', "
     "'RankExit', 'DeclareDead'", _control),
    ("mux_record.json", "mux_record.roundtrip", ("record", "control", "host"), _GONE,
     "field 'record.control.host' is missing", _control),
    # "TypeError: int() can't convert non-string with explicit base"
    ("bf16.json", "payload.encode", ("f32_bits", 0), 5,
     "field 'f32_bits[0]' is the number 5, not a string of '0x' and lowercase hex digits", None),
    # "OverflowError: Python int too large to convert to C unsigned short"
    ("bf16.json", "bf16.to_f32", ("bf16_bits", ), "0x10000",
     "field 'bf16_bits' is the string '0x10000', not a string of '0x' and 4 lowercase hex "
     "digits (a 16-bit pattern): it has 5 digits", None),
    ("bf16.json", "bf16.to_f32", ("bf16_bits", ), "0x3f8",
     "field 'bf16_bits' is the string '0x3f8', not a string of '0x' and 4 lowercase hex "
     "digits (a 16-bit pattern): it has 3 digits", None),
    ("channel_magic.json", "channel_magic.write", ("magic", ), "0x f10d17e1",
     "field 'magic' is the string '0x f10d17e1', not a string of '0x' and lowercase hex "
     "digits: ' ' is not a hex digit", None),
    ("bf16.json", "bf16.from_f32", ("bf16_as_f32_bits", ), "zz",
     "field 'bf16_as_f32_bits' is the string 'zz', not a string of '0x' and 8 lowercase hex "
     "digits (a 32-bit pattern): it has no '0x' prefix; 'z' is not a hex digit", None),
    # "KeyError: 'call'", "LocalInvalidValue: cluster_controller: rank = 'x' is invalid: ..."
    ("dead_ranks.json", "dead_ranks", ("steps", 0, "call"), _GONE,
     "field 'steps[0].call' is missing", None),
    ("dead_ranks.json", "dead_ranks", ("steps", 0, "rank"), "x",
     "field 'steps[0].rank' is the string 'x', not a whole number", None),
    ("dead_ranks.json", "dead_ranks", ("steps", 0, "call"), "revive",
     "field 'steps[0].call' is the string 'revive', not one of 'declare_dead', 'is_dead', "
     "'dead_count', 'world_size'", None),
    ("dead_ranks.json", "dead_ranks", ("world_size", ), -1,
     "field 'world_size' is the number -1, not a whole number from 0 to 4294967295", None),
], ids=["rank-negative", "world-size-huge", "shape-negative", "weight-bits-wide",
        "weight-bits-upper", "weight-bits-no-prefix",
        "record-empty", "record-kind", "record-payload", "record-rank", "control-variant",
        "control-host", "f32-bits-number", "bf16-bits-wide", "bf16-bits-short", "magic-blank",
        "bf16-as-f32", "call-missing",
        "ledger-rank", "call-unknown", "ledger-world-size"])
def test_another_malformed_field_is_one_line(
        file: str, op: str, where: tuple[str | int, ...], value: Any, problem: str,
        pick: Callable[[dict[str, Any]], bool] | None, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _refused_edit(tmp_path, capsys, file, op, "ok", where, value, problem,
                  pick or (lambda c: True))


_F64 = "not a string of '0x' and 16 lowercase hex digits (a 64-bit pattern)"
_F32 = "not a string of '0x' and 8 lowercase hex digits (a 32-bit pattern)"
_BF16 = "not a string of '0x' and 4 lowercase hex digits (a 16-bit pattern)"
_ANY = "not a string of '0x' and lowercase hex digits"


@pytest.mark.parametrize(("file", "op", "where", "value", "problem"), [
    ("round_frame.json", "round_frame.roundtrip", ("frame", "weight_bits"), "0X3ff0000000000000",
     f"field 'frame.weight_bits' is the string '0X3ff0000000000000', {_F64}: its prefix is "
     "'0X', not '0x'"),
    ("round_frame.json", "round_frame.roundtrip", ("frame", "weight_bits"), "0x3ff000000000000A",
     f"field 'frame.weight_bits' is the string '0x3ff000000000000A', {_F64}: its digit 'A' is "
     "upper case"),
    ("round_frame.json", "round_frame.roundtrip", ("frame", "weight_bits"), "0XABCDEF0000000000",
     f"field 'frame.weight_bits' is the string '0XABCDEF0000000000', {_F64}: its prefix is "
     "'0X', not '0x'; its digits 'A', 'B', 'C', ... are upper case"),
    ("bf16.json", "bf16.to_f32", ("f32_bits", ), "3F800000",
     f"field 'f32_bits' is the string '3F800000', {_F32}: it has no '0x' prefix; its digit 'F' "
     "is upper case"),
    ("bf16.json", "bf16.to_f32", ("bf16_bits", ), "0X3F8",
     f"field 'bf16_bits' is the string '0X3F8', {_BF16}: its prefix is '0X', not '0x'; its "
     "digit 'F' is upper case; it has 3 digits"),
    ("bf16.json", "bf16.to_f32", ("bf16_bits", ), "0x",
     f"field 'bf16_bits' is the string '0x', {_BF16}: it has no digits"),
    ("bf16.json", "bf16.to_f32", ("bf16_bits", ), "0x3f_8",
     f"field 'bf16_bits' is the string '0x3f_8', {_BF16}: '_' is not a hex digit"),
    ("channel_magic.json", "channel_magic.write", ("magic", ), "0XF10D17E1",
     f"field 'magic' is the string '0XF10D17E1', {_ANY}: its prefix is '0X', not '0x'; its "
     "digits 'F', 'D', 'E' are upper case"),
    ("channel_magic.json", "channel_magic.write", ("magic", ), "f10d17e1",
     f"field 'magic' is the string 'f10d17e1', {_ANY}: it has no '0x' prefix"),
    ("channel_magic.json", "channel_magic.write", ("magic", ), "0xf10d\n17e1",
     f"field 'magic' is the string '0xf10d\\n17e1', {_ANY}: '\\n' is not a hex digit"),
], ids=["f64-prefix-upper-x", "f64-upper-digit", "f64-prefix-and-upper-digits",
        "f32-no-prefix-upper", "bf16-everything", "bf16-no-digits", "bf16-underscore",
        "magic-prefix-upper", "magic-no-prefix", "magic-line-break"])
def test_a_bit_pattern_says_what_is_wrong_with_it(
        file: str, op: str, where: tuple[str | int, ...], value: str, problem: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bit pattern with an upper-case ``0X``, no prefix or upper-case digits was told only
    "not a string of '0x' and lowercase hex digits" (without its width, which a wrong digit
    count alone named): the line now names the width and each flaw, with the offending
    characters; the values refused are the same."""
    _refused_edit(tmp_path, capsys, file, op, "ok", where, value, problem)


_SALT_B = "5a17c0de429901fe3c88b70d6e21f493"


@pytest.mark.parametrize(("where", "value", "problem"), [
    (("salt", ), _SALT_B[:3] + "C" + _SALT_B[4:],
     f"field 'salt' is the string '5a1{'C' + _SALT_B[4:]}', {_HEX}: its digit 'C' is upper "
     "case"),
    (("salt", ), _SALT_B[:8] + " " + _SALT_B[8:],
     f"field 'salt' is the string '5a17c0de {_SALT_B[8:]}', {_HEX}: ' ' is not a hex digit"),
    (("salt", ), _SALT_B[:-1], f"field 'salt' is the string '{_SALT_B[:-1]}', {_HEX}: it has "
                               "an odd number of digits (31)"),
    (("salt", ), _SALT_B + "\n", f"field 'salt' is the string '{_SALT_B}\\n', {_HEX}: '\\n' is "
                                "not a hex digit"),
    (("bytes", ), "AB" * 200,
     f"field 'bytes' is the string '{'AB' * 20}...{'AB' * 10}' (400 characters), {_HEX}: its "
     "digits 'A', 'B' are upper case"),
    (("frame", "tensors", 0, "data"), "0000803F",
     f"field 'frame.tensors[0].data' is the string '0000803F', {_HEX}: its digit 'F' is upper "
     "case"),
], ids=["upper-case-digit", "space", "odd-length", "line-break", "long-upper-case", "nested"])
def test_hex_not_of_lowercase_digit_pairs_is_one_line(
        where: tuple[str | int, ...], value: str, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The schema writes bytes in lowercase hex digits, two a byte; ``bytes.fromhex`` also
    took upper case digits and white space between bytes, so such a field loaded (and the case
    ran)."""
    _refused_edit(tmp_path, capsys, "round_frame.json", "round_frame.read", "ok", where, value,
                  problem)


_MAC = "0123456789abcdef"


@pytest.mark.parametrize(("where", "value", "problem"), [
    (("mac", ), "0x" + _MAC,
     f"field 'mac' is the string '0x{_MAC}', {_HEX}: it has a '0x' prefix (bytes take none)"),
    (("mac", ), "0X" + _MAC.upper(),
     f"field 'mac' is the string '0X{_MAC.upper()}', {_HEX}: it has a '0X' prefix (bytes take "
     "none); its digits 'A', 'B', 'C', ... are upper case"),
    (("mac", ), _MAC[:-1], f"field 'mac' is the string '{_MAC[:-1]}', {_HEX}: it has an odd "
                           "number of digits (15)"),
    (("mac", ), "0x" + _MAC[:-1],
     f"field 'mac' is the string '0x{_MAC[:-1]}', {_HEX}: it has a '0x' prefix (bytes take "
     "none); it has an odd number of digits (15)"),
    (("mac", ), "01 23 45 67 89 ab cd ef",
     f"field 'mac' is the string '01 23 45 67 89 ab cd ef', {_HEX}: ' ' is not a hex digit"),
    (("mac", ), "0123456789abcdeg",
     f"field 'mac' is the string '0123456789abcdeg', {_HEX}: 'g' is not a hex digit"),
    (("mac", ), "01:23_45-67", f"field 'mac' is the string '01:23_45-67', {_HEX}: ':', '_', '-' "
                               "are not hex digits"),
    (("frame", "tensors", 0, "data"), "0000803f0",
     f"field 'frame.tensors[0].data' is the string '0000803f0', {_HEX}: it has an odd number of "
     "digits (9)"),
    (("frame", "tensors", 0, "data"), "0x0000803F",
     f"field 'frame.tensors[0].data' is the string '0x0000803F', {_HEX}: it has a '0x' prefix "
     "(bytes take none); its digit 'F' is upper case"),
    (("salt", ), "0x", f"field 'salt' is the string '0x', {_HEX}: it has a '0x' prefix (bytes "
                       "take none)"),
], ids=["mac-prefix", "mac-prefix-upper", "mac-odd", "mac-prefix-odd", "mac-spaced",
        "mac-not-a-digit", "mac-separators", "data-odd", "data-prefix-upper", "salt-prefix-only"])
def test_bytes_say_what_is_wrong_with_them(
        where: tuple[str | int, ...], value: str, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes (a mac, a tensor's data, a salt) with a ``0x`` prefix, an odd number of digits,
    upper-case digits or characters that are no hex digit were told only "not a string of bytes
    in lowercase hex digits": the line now names each flaw, with the offending characters, as
    a bit pattern's does; the values refused are the same."""
    _refused_edit(tmp_path, capsys, "round_frame.json", "round_frame.roundtrip", "ok", where,
                  value, problem)


@pytest.mark.parametrize(("op", "expect", "changes"), [
    ("channel_magic.expect", "error", {"expected": "0x1ffffffff"}),
    ("handshake.read", "error", {"expected_world_size": -1}),
    ("controller_session", "ok", {"after": []}),
])
def test_a_value_inside_the_call_an_error_case_expects_to_fail_is_not_refused_ahead(
        op: str, expect: str, changes: dict[str, Any]) -> None:
    """Only what a case's handler cannot run is refused ahead: a value the call under test
    refuses (an expected magic or world size it takes for no u32) may be the case itself; a
    bit pattern is still written as the vectors write one (``0x`` and lowercase digits)."""
    from flodl_proto.interop.registry import field_problem

    case = next(c for c in iter_cases(BUNDLED)
                if c.data["op"] == op and c.data["expect"] == expect)
    assert field_problem({**case.data, **changes}) is None


def _mux(case: dict[str, Any]) -> bool:
    return bool(case["id"] == "mux_record/roundtrip/data-rank7/salt-zero")


def _last_byte_changed(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda case: case[name][:-2] + ("01" if case[name][-2:] != "01" else "02")


_HEADER7 = "d0170df10100000001070000001a000000cb68e62143428d8b"
#: how a line shows the string of 1200 characters "abab...ab"
_LONG_AB = f"'{'ab' * 20}...{'ab' * 10}' (1200 characters)"
_PAYLOAD7 = "6f706171756520636f6e74726f6c2d6672616d65206279746573"


@pytest.mark.parametrize(("where", "value", "problem"), [
    # each read "VectorMismatch: split"
    (("header", ), "zz", f"field 'header' is the string 'zz', {_HEX}{_Z}"),
    (("payload", ), 5, f"field 'payload' is the number 5, {_HEX}"),
    (("header", ), lambda case: case["header"][:-2],
     f"field 'header' is the string {_HEADER7[:-2]!r}, 24 bytes, not the 25 of a record header"),
    (("header", ), "ab" * 600,
     f"field 'header' is the string {_LONG_AB}, 600 bytes, not the 25 of a record header"),
    (("header", ), "00" * 25,
     f"field 'header' is the string {'00' * 25!r}, not a record header (relay_mux: record "
     "magic 0x00000000 != 0xf10d17d0)"),
    (("payload", ), "00",
     "field 'payload' is the string '00', 1 byte, not the 26 field 'header' gives its payload"),
    (("header", ), _last_byte_changed("header"),
     f"field 'header' is the string {_HEADER7[:-2] + '01'!r}, not the first 25 bytes of "
     "field 'bytes'"),
    (("payload", ), _last_byte_changed("payload"),
     f"field 'payload' is the string {_PAYLOAD7[:-2] + '01'!r}, not the bytes of field "
     "'bytes' after its 25-byte header"),
    # "field 'header' is ..., not the first 25 bytes of field 'bytes'"
    (("bytes", ), "", "field 'bytes' is the string '', 0 bytes, not the 25 + 26 of field "
                      "'header' and its payload"),
    (("bytes", ), _HEADER7[:20], f"field 'bytes' is the string {_HEADER7[:20]!r}, 10 bytes, not "
                                 "the 25 + 26 of field 'header' and its payload"),
    # "VectorMismatch: auth tag differs", "TypeError: ... 'NoneType'" / "bincode differs"
    (("auth_tag", ), "x", f"field 'auth_tag' is the string 'x', {_HEX}: 'x' is not a hex "
                         "digit"),
    (("auth_tag", ), "00", "field 'auth_tag' is the string '00', 1 byte, not the 8 of a "
                           "record's auth tag"),
    (("auth_tag", ), _last_byte_changed("auth_tag"),
     f"field 'auth_tag' is the string {_HEADER7[-16:-2] + '01'!r}, not bytes 17..25 of field "
     "'bytes' (the header's auth tag)"),
    (("bincode", ), None, f"field 'bincode' is null, {_HEX}"),
], ids=["header-not-hex", "payload-number", "header-short", "header-long", "header-magic",
        "payload-short", "header-not-bytes", "payload-not-bytes", "bytes-empty", "bytes-short",
        "auth-tag", "auth-tag-short", "auth-tag-not-bytes", "bincode"])
def test_a_malformed_mux_record_split_is_one_line(
        where: tuple[str | int, ...], value: Any, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A round trip's ``header``, ``payload`` and ``auth_tag`` describe the split of its
    ``bytes``: one that is not (bad hex, a length not the header's, a header the codec refuses,
    other bytes), or a ``bytes`` too short for them, is refused at load naming the field and its
    value, shortened when long."""
    pick = _mux if where != ("bincode", ) else (lambda c: "bincode" in c)
    _refused_edit(tmp_path, capsys, "mux_record.json", "mux_record.roundtrip", "ok", where,
                  value, problem, pick)


@pytest.mark.parametrize("name", ["header", "payload"])
def test_a_mux_record_split_unlike_the_record_names_the_field(name: str) -> None:
    """Run without the load's check (as a caller of the handler may), a round trip whose
    ``header`` or ``payload`` is not the record's read ``VectorMismatch: split``."""
    case = next(c for c in iter_cases(BUNDLED) if _mux(c.data))
    case.data[name] = "ab" * 600
    with pytest.raises(VectorMismatch) as e:
        run_case(case)
    want = _HEADER7 if name == "header" else _PAYLOAD7
    assert str(e.value) == (
        f"field {name!r} is the string {_LONG_AB}, the record's {name} is {want!r}")


@pytest.mark.parametrize(("file", "op", "pick", "where", "value", "problem"), [
    # each was run and failed ("steps[0] is_dead: got False, want None"; a count of true
    # passed: True == 1)
    ("dead_ranks.json", "dead_ranks", None, ("steps", 0, "result"), None,
     "field 'steps[0].result' is null, not true or false"),
    ("dead_ranks.json", "dead_ranks", None, ("steps", 0, "result"), 0,
     "field 'steps[0].result' is the number 0, not true or false"),
    ("dead_ranks.json", "dead_ranks", None, ("steps", 4, "result"), True,
     "field 'steps[4].result' is true, not a whole number"),
    ("dead_ranks.json", "dead_ranks", None, ("steps", 5, "result"), "4",
     "field 'steps[5].result' is the string '4', not a whole number"),
    ("round_frame.json", "round_frame.roundtrip", None, ("mac", ), "zz",
     f"field 'mac' is the string 'zz', {_HEX}{_Z}"),
    ("round_frame.json", "round_frame.roundtrip", lambda c: "values" in c["frame"]["tensors"][0],
     ("frame", "tensors", 0, "values", 0), "1",
     "field 'frame.tensors[0].values[0]' is the string '1', not a number"),
    ("bf16.json", "payload.encode", None, ("bytes", ), 0, f"field 'bytes' is the number 0, {_HEX}"),
    ("bf16.json", "payload.scale", None, ("out_bytes", ), "zz",
     f"field 'out_bytes' is the string 'zz', {_HEX}{_Z}"),
], ids=["is-dead-null", "is-dead-number", "dead-count-true", "world-size-string", "mac",
        "values", "encode-bytes", "scale-out-bytes"])
def test_an_expected_value_of_another_kind_is_one_line(
        file: str, op: str, pick: Callable[[dict[str, Any]], bool] | None,
        where: tuple[str | int, ...], value: Any, problem: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An expected value (a ledger query's ``result``, a frame's mac, a tensor's values, an
    expected blob or payload) of another JSON kind was a failed case (or passed), not a file
    outside the schema."""
    _refused_edit(tmp_path, capsys, file, op, "ok", where, value, problem,
                  pick or (lambda c: True))


def test_an_expected_blob_of_another_kind_is_refused_ahead() -> None:
    """A ``len_framed.read`` case expecting a blob (the shared files hold none) whose blob is
    no hex failed as ``blob differs``."""
    from flodl_proto.interop.registry import field_problem

    case = next(c for c in iter_cases(BUNDLED)
                if c.data["op"] == "len_framed.read" and c.data["expect"] == "eof")
    assert field_problem({**case.data, "expect": "ok", "blob": None}) == (
        f"field 'blob' is null, {_HEX}")


def test_a_bit_pattern_of_one_digit_says_digit(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A bit pattern of one digit was told ``it has 1 digits``."""
    _refused_edit(tmp_path, capsys, "bf16.json", "bf16.to_f32", "ok", ("bf16_bits", ), "0x0",
                  f"field 'bf16_bits' is the string '0x0', {_BF16}: it has 1 digit")

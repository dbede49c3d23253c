"""Every option value a command refuses reads as argparse words it, ``argument --X: MESSAGE``,
built in one place (:mod:`flodl_proto.commands._option_error`): the exact line of each refused
value across the commands, the helper's words against argparse's own, and no other module
spelling the prefix itself."""

from __future__ import annotations

import argparse
import ast
import errno
import re
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest

import flodl_proto
from flodl_proto.errors import shown

from .cli_util import run_main

S = "00112233445566778899aabbccddeeff"
CTL = ["controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", S]
RELAY = ["relay", "--controller", "127.0.0.1:7000"]
RANK = ["rank", "--relay", "127.0.0.1:7004", "--rank", "0", "--world-size", "1", "--salt", S]
KIT = ["conform", "controller", "--version", "2", "--jobs", "1", "--timeout-scale", "0.1"]
E_CTL = "flodl-proto controller: error: argument "
E_RELAY = "flodl-proto relay: error: argument "
E_RANK = "flodl-proto rank: error: argument "
E_KIT = "flodl-proto conform controller: error: argument "
E_DECODE = "flodl-proto decode: error: argument "
SALT_RULE = "session salt must be 16 bytes written as 32 hex digits, got 2 characters"
RANKS_RULE = "expected a list of ranks like 0,1 or 0-3, got"

#: (command line, its one stderr line); ``{tmp}`` is the test's folder (holding ``bad.salt``,
#: ``good.salt`` and the regular file ``a-file``), named ``.``: the test runs in it
REFUSED: list[tuple[list[str], str]] = [
    (["controller", "--listen", "nohostport", "--world-size", "1", "--salt", S],
     E_CTL + "--listen: 'nohostport': not a HOST:PORT address: no port"),
    (["controller", "--listen", "127.0.0.1:0", "--world-size", "0", "--salt", S],
     E_CTL + "--world-size: must be in 1..4294967295 (the handshake's u32 field), got 0"),
    ([*CTL, "--outer", "bogus"],
     E_CTL + "--outer: 'bogus': expected avg, slow-momentum:LR,MU or nesterov:LR,MU"),
    ([*CTL, "--outer", "slow-momentum:1"],
     E_CTL + "--outer: 'slow-momentum:1': expected slow-momentum:LR,MU (two finite numbers)"),
    ([*CTL, "--outer", "nesterov:x,0.9"],
     E_CTL + "--outer: 'nesterov:x,0.9': LR 'x' is not a finite number; expected "
     "nesterov:LR,MU (two finite numbers)"),
    (["controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", "12"],
     E_CTL + "--salt: " + SALT_RULE),
    (["controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt-file",
      "/nonexistent/salt"],
     E_CTL + "--salt-file: '/nonexistent/salt': No such file or directory"),
    (["controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt-file",
      "{tmp}/bad.salt"],
     E_CTL + "--salt-file: '{tmp}/bad.salt': " + SALT_RULE + ", character 1 ('z') not a hex "
     "digit"),
    ([*CTL, "--frame-ceiling", "4G"],
     E_CTL + "--frame-ceiling: expected a number of bytes, got '4G'"),
    ([*CTL, "--frame-ceiling", "10"],
     E_CTL + "--frame-ceiling: must be at least 25 bytes (the smallest RoundFrame: no tensor), "
     "got 10"),
    ([*CTL, "--frame-ceiling", "5000000000"],
     E_CTL + "--frame-ceiling: must be at most 4294967295 bytes (the u32 length prefix and mux "
     "payload_len), got '5000000000'"),
    ([*CTL, "--round-timeout", "0"],
     E_CTL + "--round-timeout: must be a finite number of seconds above 0, at most 864000 s "
     "once scaled by FLODL_NET_TIMEOUT_SCALE, got '0'"),
    ([*RELAY, "--ranks", "0,,1", "--world-size", "1", "--salt", S],
     E_RELAY + f"--ranks: {RANKS_RULE} '0,,1' (an empty item)"),
    ([*RELAY, "--ranks", "x", "--world-size", "1", "--salt", S],
     E_RELAY + f"--ranks: {RANKS_RULE} 'x'"),
    ([*RELAY, "--ranks", "3-1", "--world-size", "1", "--salt", S],
     E_RELAY + f"--ranks: {RANKS_RULE} '3-1'"),
    ([*RELAY, "--ranks", "0,5", "--world-size", "2", "--salt", S],
     E_RELAY + "--ranks: '0,5': every rank must be < --world-size 2, got rank 5"),
    ([*RELAY, "--ranks", "0-4000000000", "--world-size", "4294967295", "--salt", S],
     E_RELAY + "--ranks: '0-4000000000': 4000000001 ranks need as many loopback connections, "
     "more than this process may open (1024)"),
    ([*RELAY, "--ranks", "0,1,1", "--world-size", "2", "--salt", S],
     E_RELAY + "--ranks: '0,1,1': rank 1 is listed twice"),
    (["relay", "--controller", "nohostport", "--ranks", "0", "--world-size", "1", "--salt", S],
     E_RELAY + "--controller: 'nohostport': not a HOST:PORT address: no port"),
    (["relay", "--controller", "127.0.0.1:65533", "--ranks", "0", "--world-size", "1",
      "--salt", S],
     E_RELAY + "--controller: '127.0.0.1:65533': port 65537 is not in 0..65535 (the default "
     "--listen-port: the controller's port + 4); give --listen-port"),
    ([*RELAY, "--ranks", "0", "--world-size", "0", "--salt", S],
     E_RELAY + "--world-size: must be in 1..4294967295 (the handshake's u32 field), got 0"),
    ([*RELAY, "--ranks", "0", "--world-size", "1", "--salt", S, "--host", ""],
     E_RELAY + "--host: '' is empty; give a host name, or leave the option out to announce "
     "this machine's host name"),
    ([*RELAY, "--ranks", "0", "--world-size", "1", "--salt", S, "--listen-port", "70000"],
     E_RELAY + "--listen-port: port 70000 is not in 0..65535"),
    (["rank", "--relay", "127.0.0.1:7004", "--rank", "5", "--world-size", "2", "--salt", S],
     E_RANK + "--rank: must be in 0..1 (below --world-size), got 5"),
    (["rank", "--relay", "nohostport", "--rank", "0", "--world-size", "1", "--salt", S],
     E_RANK + "--relay: 'nohostport': not a HOST:PORT address: no port"),
    ([*RANK, "--rounds", "0"], E_RANK + "--rounds: must be in 1..1000000, got 0"),
    ([*RANK, "--payload-mib", "-1"],
     E_RANK + "--payload-mib: must be a finite number >= 0, got '-1'"),
    ([*RANK, "--interval", "nan"],
     E_RANK + "--interval: must be a finite number >= 0, got 'nan'"),
    ([*RANK, "--payload-mib", "2", "--frame-ceiling", "1000"],
     E_RANK + "--payload-mib: '2' makes a 2098393-byte frame, above the frame ceiling 1000 "
     "(--frame-ceiling)"),
    ([*KIT, "--timeout-scale", "0", "--launch", "x"],
     E_KIT + "--timeout-scale: '0' is out of range; expected a finite scale factor from 0.1 to "
     "1000"),
    ([*KIT, "--jobs", "0", "--launch", "x"], E_KIT + "--jobs: must be in 1..1024, got 0"),
    ([*KIT, "--cases", "", "--launch", "x"], E_KIT + "--cases: no pattern (the value is empty)"),
    ([*KIT, "--cases", " ", "--list"], E_KIT + "--cases: no pattern (the value is blank)"),
    ([*KIT, "--launch", ""], E_KIT + "--launch: no command (the value is empty)"),
    ([*KIT, "--launch", " "], E_KIT + "--launch: no command (the value is blank)"),
    ([*KIT, "--launch", "a\x00b"],
     E_KIT + "--launch: the command holds a NUL character (\\x00), which no program's argument "
     "can"),
    ([*KIT, "--launch", 'a "b'],
     E_KIT + "--launch: 'a \"b': No closing quotation (it is split as a shell splits a command "
     "line)"),
    ([*KIT, "--launch", "'' {port}"],
     E_KIT + "--launch: no program to run (the first word is '')"),
    ([*KIT, "--launch", "x {port!r}"],
     E_KIT + "--launch: bad placeholder in '{port!r}': a placeholder is {name} alone (no "
     "!conversion, :format, .attribute or [index])"),
    ([*KIT, "--launch", "x {nope}"],
     E_KIT + "--launch: unknown placeholder {nope} (this role has {host}, {port}, {salt}, "
     "{salt_file}, {version}, {world_size})"),
    ([*KIT, "--launch", "x {"],
     E_KIT + "--launch: bad placeholder in '{': Single '{' encountered in format string"),
    ([*KIT, "--launch", "{tmp}/nonexistent {port}"],
     E_KIT + "--launch: cannot start the target '{tmp}/nonexistent': No such file or directory"),
    # a salt file named with a trailing slash: refused as the OS refuses it, not read
    (["controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt-file",
      "{tmp}/good.salt/"],
     E_CTL + "--salt-file: '{tmp}/good.salt/': Not a directory"),
    ([*RELAY, "--ranks", "0", "--world-size", "1", "--salt-file", "{tmp}/good.salt/"],
     E_RELAY + "--salt-file: '{tmp}/good.salt/': Not a directory"),
    (["decode", "--salt-file", "{tmp}/good.salt/", "/dev/null"],
     E_DECODE + "--salt-file: '{tmp}/good.salt/': Not a directory"),
    (["decode", "--salt-file", "/nonexistent/salt", "/dev/null"],
     E_DECODE + "--salt-file: '/nonexistent/salt': No such file or directory"),
    (["decode", "--salt", "12", "/dev/null"], E_DECODE + "--salt: " + SALT_RULE),
    (["decode", "--frame-ceiling", "10", "/dev/null"],
     E_DECODE + "--frame-ceiling: must be at least 25 bytes (the smallest RoundFrame: no "
     "tensor), got 10"),
    (["decode", "--max-input", "0", "/dev/null"],
     E_DECODE + "--max-input: must be at least 1 byte, got 0"),
    (["demo", "--salt-file", "{tmp}/bad.salt"],
     "flodl-proto demo: error: argument --salt-file: '{tmp}/bad.salt': " + SALT_RULE
     + ", character 1 ('z') not a hex digit"),
    (["dissector", "--port", "0"],
     "flodl-proto dissector: error: argument --port: port 0 is not in 1..65535"),
    (["dissector", "--out", "x/"],
     "flodl-proto dissector: error: argument --out: 'x/' names a folder (it ends with /); give "
     "a file path in it"),
    # docs --spec: a file where the folder, or a folder above it, should be; a folder without
    # the spec; docs --check --out of a device (it read "cannot read ...", "cannot load ...")
    (["docs", "--spec", "a-file/", "--out", "{tmp}/p.md"],
     "flodl-proto docs: error: argument --spec: 'a-file/': Not a directory (a-file "
     "is a file, not a folder)"),
    (["docs", "--spec", "a-file/sub", "--out", "{tmp}/p.md"],
     "flodl-proto docs: error: argument --spec: 'a-file/sub': Not a directory "
     "(a-file is a file, not a folder)"),
    (["docs", "--spec", "/dev/null", "--out", "{tmp}/p.md"],
     "flodl-proto docs: error: argument --spec: '/dev/null': Not a directory (/dev/null is a "
     "character device, not a folder)"),
    (["docs", "--spec", "none", "--out", "{tmp}/p.md"],
     "flodl-proto docs: error: argument --spec: cannot load none/wire.yaml: No such file "
     "or directory"),
    (["docs", "--check", "--out", "/dev/null"],
     "flodl-proto docs: error: argument --out: '/dev/null' is a character device, not a file "
     "(never read: a check compares a file)"),
    (["conform", "docs", "--check", "--out", "/dev/null"],
     "flodl-proto conform docs: error: argument --out: '/dev/null' is a character device, not a "
     "file (never read: a check compares a file)"),
    # vectors export DIR: a file where DIR, or a folder above it, should be (it was found as
    # the first file was written: exit 1)
    (["vectors", "export", "a-file"],
     "flodl-proto vectors export: error: argument DIR: 'a-file': Not a directory "
     "(a-file is a file, not a folder)"),
    (["vectors", "export", "a-file/sub"],
     "flodl-proto vectors export: error: argument DIR: 'a-file/sub': Not a directory "
     "(a-file is a file, not a folder)"),
    # vectors compare: a folder that is none names the argument it was given as, a file (or
    # one where a folder of its path should be) in the words of docs --spec and vectors
    # export (it read 'a-file: not a directory', and 'a-file/sub: does not exist')
    (["vectors", "compare", "{tmp}", "--bundled", "a-file"],
     "flodl-proto vectors compare: error: argument --bundled: 'a-file': Not a directory "
     "(a-file is a file, not a folder)"),
    (["vectors", "compare", "{tmp}", "--bundled", "a-file/sub"],
     "flodl-proto vectors compare: error: argument --bundled: 'a-file/sub': Not a directory "
     "(a-file is a file, not a folder)"),
    (["vectors", "compare", "a-file"],
     "flodl-proto vectors compare: error: argument DIR: 'a-file': Not a directory "
     "(a-file is a file, not a folder)"),
    (["vectors", "compare", "/dev/null"],
     "flodl-proto vectors compare: error: argument DIR: '/dev/null': Not a directory "
     "(/dev/null is a character device, not a folder)"),
    (["vectors", "compare", "{tmp}", "--bundled", "none"],
     "flodl-proto vectors compare: error: argument --bundled: 'none': does not exist"),
    (["vectors", "compare", "none"],
     "flodl-proto vectors compare: error: argument DIR: 'none': does not exist"),
    (["vectors", "export", "/dev/null/v"],
     "flodl-proto vectors export: error: argument DIR: '/dev/null/v': Not a directory "
     "(/dev/null is a character device, not a folder)"),
]


@pytest.mark.parametrize(("argv", "line"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_every_refused_value_is_one_line_in_argparse_words(
        argv: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The lines as they read before their prefix had one home, byte for byte: exit 2, nothing
    on stdout, one stderr line. The test's files are named from its folder as the working
    directory (``./bad.salt``), so that no line holds a path long enough to be shown by its
    ends, whatever the temporary folder's length."""
    monkeypatch.delenv("FLODL_SESSION_SALT", raising=False)
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.1")
    monkeypatch.setattr("flodl_proto.commands.relay._max_open_files", lambda: 1024)
    (tmp_path / "bad.salt").write_text("zz\n")
    (tmp_path / "good.salt").write_text(S + "\n")
    (tmp_path / "a-file").write_text("not a folder\n")
    monkeypatch.chdir(tmp_path)
    tmp = "."
    code, out, err = run_main(capsys, *(a.replace("{tmp}", tmp) for a in argv))
    assert (code, out, err) == (2, "", line.replace("{tmp}", tmp) + "\n")


LONG = "a" * 300
SHOWN_LONG = f"'{'a' * 40}...{'a' * 20}' (300 characters)"


@pytest.mark.parametrize(("argv", "line"), [
    (["vectors", "check", "loop1"],
     "flodl-proto vectors check: error: argument PATH: 'loop1': Too many levels of symbolic "
     "links (loop1 is a loop of symbolic links)"),
    (["vectors", "check", "loop1/v"],
     "flodl-proto vectors check: error: argument PATH: 'loop1/v': Too many levels of symbolic "
     "links (loop1 is a loop of symbolic links)"),
    (["vectors", "check", LONG],
     f"flodl-proto vectors check: error: argument PATH: {SHOWN_LONG}: File name too long"),
    (["vectors", "compare", "loop1"],
     "flodl-proto vectors compare: error: argument DIR: 'loop1': Too many levels of symbolic "
     "links (loop1 is a loop of symbolic links)"),
    (["vectors", "compare", ".", "--bundled", "loop1"],
     "flodl-proto vectors compare: error: argument --bundled: 'loop1': Too many levels of "
     "symbolic links (loop1 is a loop of symbolic links)"),
    (["vectors", "compare", LONG],
     f"flodl-proto vectors compare: error: argument DIR: {SHOWN_LONG}: File name too long"),
])
def test_a_path_that_cannot_be_looked_up_is_refused_for_its_reason(
        argv: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A loop of symbolic links read 'does not exist', and a name too long for the file
    system was exit 1 with the name whole ('flodl-proto vectors check: error: aaa...aaa: File
    name too long'): both are the PATH's problem, said as the OS says it, exit 2; the path is
    quoted and the loop named as an output path's are (it read 'loop1: Too many levels of
    symbolic links')."""
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    monkeypatch.chdir(tmp_path)
    assert run_main(capsys, *argv) == (2, "", line + "\n")


def test_a_cases_pattern_given_twice_is_named_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The patterns that matched no case id are each named once, in the order given ('x' or
    'x' or 'y' read so)."""
    assert run_main(capsys, "conform", "relay", "--launch", "true", "--cases", "x", "--cases",
                    "x", "--cases", "y") == (
        2, "", "flodl-proto conform relay: error: argument --cases: no relay case id matches "
               "'x' or 'y'; 'flodl-proto conform relay --list' without --cases lists the ids\n")


def test_the_prefix_is_argparse_s_own() -> None:
    """argparse's ArgumentError of the option's action words it the same."""
    from flodl_proto.commands._option_error import OptionError, option_field, option_message

    parser = argparse.ArgumentParser()
    action = parser.add_argument("--jobs")
    assert option_field("--jobs") == "argument --jobs:"
    assert option_message("--jobs", "must be in 1..1024, got 0") == str(
        argparse.ArgumentError(action, "must be in 1..1024, got 0"))
    e = OptionError("--ranks", "'0,1,1': rank 1 is listed twice")
    assert isinstance(e, ValueError)
    assert (str(e), e.option, e.reason) == (
        "argument --ranks: '0,1,1': rank 1 is listed twice", "--ranks",
        "'0,1,1': rank 1 is listed twice")


#: the modules whose option errors take their prefix from the helper
_PACKAGE = Path(flodl_proto.__file__).parent
#: every module of the package but the helper itself, and the bench scripts
_MODULES = sorted([str(p.relative_to(_PACKAGE)) for p in _PACKAGE.rglob("*.py")
                   if p.name != "_option_error.py"]
                  + [f"../bench/{p.name}" for p in (_PACKAGE.parent / "bench").glob("*.py")])


@pytest.mark.parametrize("module", _MODULES)
def test_no_module_spells_the_prefix_itself(module: str) -> None:
    """No string of code (docstrings aside) holds ``argument --``: the prefix is the helper's."""
    tree = ast.parse((_PACKAGE / module).read_text(encoding="utf-8"))
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                  and (body := node.body) and isinstance(body[0], ast.Expr)}
    spelled = [node.lineno for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and "argument --" in node.value and id(node) not in docstrings]
    assert spelled == []


#: the calls that print or raise an error line (``_usage``, ``print``, ``parser.error``, ...)
_ERROR_CALLS = frozenset({"_usage", "_usage_error", "error", "print", "ValueError",
                          "ArgumentTypeError", "OSError", "MemoryError"})


def _text_of(node: ast.expr) -> str | None:
    """The text of a string constant or f-string, each replacement field as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


@pytest.mark.parametrize("module", _MODULES)
def test_no_error_line_starts_with_a_bare_option(module: str) -> None:
    """No error line names an option in words of its own (``--pcap needs --port N``,
    ``error: --listen 'x': ...``): an option the command refuses reads ``argument --X: ...``,
    built by the helper."""
    tree = ast.parse((_PACKAGE / module).read_text(encoding="utf-8"))
    bare = re.compile(r"(^|error: )--[a-z]")
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        text = _text_of(node.args[0])
        if name in _ERROR_CALLS and text is not None and bare.search(text):
            found.append((node.lineno, text))
    assert found == []


def test_two_options_that_cannot_go_together_read_as_argparse_s_exclusive_group(
        capsys: pytest.CaptureFixture[str]) -> None:
    """:func:`option_conflict` words the refusal as argparse words the second option of a
    mutually exclusive group."""
    from flodl_proto.commands._option_error import option_conflict

    parser = argparse.ArgumentParser(prog="p")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true")
    group.add_argument("--junit")
    with pytest.raises(SystemExit):
        parser.parse_args(["--list", "--junit", "r.xml"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "p: error: " + option_conflict("--junit", "--list"))
    assert option_conflict("--junit", "--list", "a listing writes no report") == (
        "argument --junit: not allowed with argument --list (a listing writes no report)")


def test_an_output_folder_made_after_the_command_line_is_read_is_named_as_the_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The generators' write refuses a folder made since ``--out`` was checked in the words
    the option's check uses; the run has begun, so exit 1, nothing written."""
    from flodl_proto.commands.docs import write_output

    folder = tmp_path / "out.md"
    folder.mkdir()
    assert write_output(folder, b"text", "flodl-proto docs") == 1
    assert capsys.readouterr() == ("", "flodl-proto docs: error: argument --out: "
                                       f"{shown(str(folder))} names a folder (an existing one); "
                                       "give a file path in it\n")
    assert list(folder.iterdir()) == []


def test_a_launch_the_machine_cannot_start_now_is_a_failed_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """No process to be had (EAGAIN, out of memory or file descriptors) is the machine's state,
    not the command line's: exit 1, the line without ``argument --launch:``; a program that
    does not exist stays a usage error (the table above)."""
    from flodl_proto.conform import target

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(target, "subprocess", types.SimpleNamespace(
        Popen=no_process, DEVNULL=subprocess.DEVNULL, PIPE=subprocess.PIPE))
    report = tmp_path / "r.json"
    code, out, err = run_main(capsys, *KIT, "--launch", "prog {port}", "--json", str(report))
    assert (code, out, err) == (1, "", "flodl-proto conform controller: error: cannot start the "
                                       "target 'prog': Resource temporarily unavailable\n")
    assert "not run: the --launch command cannot be started" in report.read_text()


# -- a sweep: every option of every command given a value of every kind --------------------------
#: the values tried for every option: ``{tmp}`` is the test's folder, the current one
_SWEEP_VALUES = {"empty": "", "negative": "-1", "zero": "0", "huge": "9" * 20, "word": "x",
                 "file": "{tmp}/a-file", "folder": "{tmp}/a-folder", "fifo": "{tmp}/a-fifo",
                 "device": "/dev/null", "no-parent": "{tmp}/none/x",
                 "under-a-file": "{tmp}/a-file/x"}
#: each command's other arguments: taken, so that the option swept is what may be refused (a
#: value taken would then end at once: a port in use, ``{busy}``; a salt file under a file)
_SWEEP_BASE = {
    "controller": ["--listen", "127.0.0.1:{busy}", "--world-size", "1", "--salt", S],
    "relay": ["--controller", "127.0.0.1:{busy}", "--ranks", "0", "--world-size", "1", "--salt",
              S, "--listen-port", "{busy}"],
    "rank": ["--relay", "127.0.0.1:{busy}", "--rank", "0", "--world-size", "1", "--salt", S],
    "demo": ["--no-progress", "--salt-file", "{tmp}/a-file/salt"],
    "conform controller": ["--list"], "conform relay": ["--list"],
    "conform docs": ["--out", "{tmp}/c.md"], "decode": ["/dev/null"],
    "dissector": ["--out", "{tmp}/d.lua"], "docs": ["--out", "{tmp}/p.md"],
    "vectors compare": ["{tmp}/a-folder"],
}
_ALL_KINDS = frozenset(_SWEEP_VALUES) - {"empty"}
#: the values each option takes (not swept: the command would run), by kind
_SWEEP_TAKEN: dict[tuple[str, str], frozenset[str]] = {
    ("conform controller", "--launch"): _ALL_KINDS, ("conform relay", "--launch"): _ALL_KINDS,
    ("conform controller", "--cases"): _ALL_KINDS, ("conform relay", "--cases"): _ALL_KINDS,
    ("relay", "--host"): _ALL_KINDS,
    ("conform docs", "--out"): _ALL_KINDS - {"folder", "under-a-file"},
    ("dissector", "--out"): _ALL_KINDS - {"folder", "under-a-file"},
    ("docs", "--out"): _ALL_KINDS - {"folder", "under-a-file"},
    # a FIFO's reader waits for its writer, as ``cat`` does (``--salt-file <(...)``)
    ("controller", "--salt-file"): frozenset({"fifo"}),
    ("relay", "--salt-file"): frozenset({"fifo"}),
    ("rank", "--salt-file"): frozenset({"fifo"}),
    ("decode", "--salt-file"): frozenset({"fifo"}),
    # a new salt file is written and the demo runs (a FIFO: read)
    ("demo", "--salt-file"): frozenset({"negative", "zero", "huge", "word", "no-parent",
                                        "under-a-file", "fifo"}),
    # a folder, made where there is none
    ("controller", "--checkpoint-dir"): frozenset({"negative", "zero", "huge", "word", "folder",
                                                   "no-parent"}),
    ("decode", "--max-input"): frozenset({"huge"}),
    ("demo", "--payload-mib"): frozenset({"zero"}), ("demo", "--seed"): frozenset({"zero", "huge"}),
    ("rank", "--rank"): frozenset({"zero"}), ("rank", "--payload-mib"): frozenset({"zero"}),
    ("rank", "--interval"): frozenset({"zero", "huge"}), ("relay", "--ranks"): frozenset({"zero"}),
    ("relay", "--listen-port"): frozenset({"zero"}),
    ("vectors compare", "--bundled"): frozenset({"folder"}),
}


def _swept_options() -> list[tuple[str, str]]:
    """Every option of every command that takes a value of its own (no flag, no ``choices``:
    argparse words those), as (command, option)."""
    from flodl_proto.cli import build_parser

    found: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif (path and action.option_strings and action.nargs != 0
                  and action.choices is None):
                found.append((" ".join(path), action.option_strings[-1]))

    walk(build_parser(), [])
    return found


_SWEPT = [(command, option, kind) for command, option in _swept_options()
          for kind in _SWEEP_VALUES
          if kind not in _SWEEP_TAKEN.get((command, option), frozenset())]


def test_the_sweep_covers_every_command() -> None:
    assert {c for c, _, _ in _SWEPT} == {
        "conform controller", "conform relay", "conform docs", "controller", "decode", "demo",
        "dissector", "docs", "rank", "relay", "vectors compare"}
    assert len(_SWEPT) > 450


@pytest.mark.parametrize(("command", "option", "kind"), _SWEPT,
                         ids=[f"{c} {o} {k}" for c, o, k in _SWEPT])
def test_every_refused_option_value_reads_as_argparse_words_it(
        command: str, option: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each option given an empty value, a negative, a huge number, a word, a file, a folder, a
    FIFO, a device, a path with no parent or under a file (the values it takes left out) is
    refused with the command line: exit 2, nothing on stdout, one line ``argument --X: ...``
    naming that option (or argparse's own lines), no traceback."""
    import os
    import socket

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLODL_SESSION_SALT", raising=False)
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.1")
    (tmp_path / "a-file").write_text("x\n")
    (tmp_path / "a-folder").mkdir()
    os.mkfifo(tmp_path / "a-fifo")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        fill = {"tmp": str(tmp_path), "busy": str(busy.getsockname()[1])}
        base = [a.format(**fill) for a in _SWEEP_BASE.get(command, [])]
        if option in base:  # the base's own value of the option swept goes
            at = base.index(option)
            del base[at:at + 2]
        if option == "--salt-file" and "--salt" in base:
            at = base.index("--salt")
            del base[at:at + 2]
        if command.startswith("conform ") and option == "--launch":
            base = []
        value = _SWEEP_VALUES[kind].format(**fill)
        code, out, err = run_main(capsys, *command.split(), *base, option, value)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"flodl-proto {command}: error: argument {option}: "), err

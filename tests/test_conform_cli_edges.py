"""Edges of the ``conform`` command line and of its reports."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flodl_proto._files import replace_file
from flodl_proto.cli import build_parser, main
from flodl_proto.conform.player import KitSettings
from flodl_proto.conform.target import TargetLaunchError
from flodl_proto.errors import shown

_PREFIX = "flodl-proto conform controller: error: "
_RUN = ["conform", "controller", "--launch", "true {port}", "--timeout-scale", "0.1",
        "--cases", "controller.session.one-relay-one-round", "--version", "2"]


# -- --start-timeout, --launch given twice ---------------------------------------------------------
def test_start_timeout_bounds_the_wait_for_a_target_to_listen(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The 20 s a target had to listen could not be set: --start-timeout sets it (a target that
    never listens fails its case after it, whatever --timeout-scale)."""
    run = [*_RUN, "--jobs", "1"]
    run[run.index("--launch") + 1] = "sleep 30 {port}"
    assert main([*run, "--start-timeout", "0.5"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [re.sub(r"port [0-9]+ ", "port N ", line) for line in out[:2]] == [
        "FAIL controller.session.one-relay-one-round v2 [MUST] (15.9 Clean-exit rules "
        "(`clean_exit`))",
        "     target did not start: the target did not listen on port N within 0.5s"]
    args = build_parser().parse_args(["conform", "controller", "--list"])
    assert args.start_timeout == KitSettings().ready_timeout == 20.0


#: run in a fresh interpreter: parse a conform command line, then whether its --start-timeout
#: default is the kit's one constant, and the heavy modules the parse imported
_PARSED = """
import sys
from flodl_proto.cli import build_parser
args = build_parser().parse_args(["conform", "controller", "--list"])
from flodl_proto.conform import _defaults
print(args.start_timeout is _defaults.READY_TIMEOUT,
      [m for m in ("numpy", "ml_dtypes", "flodl_proto.codec", "flodl_proto.conform.player")
       if m in sys.modules])
"""


def test_the_start_timeout_default_has_one_home_that_loads_no_numpy() -> None:
    """``--start-timeout``'s default and ``KitSettings.ready_timeout`` were two literals of
    20.0 (the parser's own, so that parsing loads no NumPy), pinned equal by a test; both are
    now ``conform._defaults.READY_TIMEOUT``, which the parser reads without the kit's player,
    the codec or NumPy."""
    from flodl_proto.conform import _defaults

    assert KitSettings.__dataclass_fields__["ready_timeout"].default is _defaults.READY_TIMEOUT
    res = subprocess.run([sys.executable, "-c", _PARSED], capture_output=True, text=True,
                         timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (0, "True []\n", "")


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "x", "", "864000.5", "1e999"])
def test_start_timeout_is_a_finite_number_of_seconds_above_0(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*_RUN, f"--start-timeout={value}"])
    assert (e.value.code, capsys.readouterr()) == (2, (
        "", f"{_PREFIX}argument --start-timeout: must be a finite number of seconds above 0, "
            f"at most 864000, got '{value}'\n"))


def test_start_timeout_written_as_the_other_number_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*_RUN, "--start-timeout", "1_0"])
    assert (e.value.code, capsys.readouterr()) == (2, (
        "", f"{_PREFIX}argument --start-timeout: must be a finite number of seconds above 0, "
            "at most 864000, got '1_0' (a number is written in ASCII digits, without '_')\n"))
    assert build_parser().parse_args([*_RUN, "--start-timeout", "864000"]).start_timeout == 864000


@pytest.mark.parametrize("second", [["--launch", "true {port}"], ["--launch=false"],
                                    ["--launch", ""]])
def test_launch_given_twice_is_refused(second: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``--launch`` given twice ran the last command alone, silently."""
    with pytest.raises(SystemExit) as e:
        main([*_RUN, *second])
    assert (e.value.code, capsys.readouterr()) == (2, (
        "", f"{_PREFIX}argument --launch: given twice; the kit starts one command (quote a "
            "command of several words as one value)\n"))


# -- an empty --junit / --json --------------------------------------------------------------------
@pytest.mark.parametrize("option", ["--junit", "--json"])
def test_an_empty_report_path_names_the_option_and_offers_no_dash(
        option: str, capsys: pytest.CaptureFixture[str]) -> None:
    # it said "give a file path, or - for stdout", and - is refused for a report
    with pytest.raises(SystemExit) as e:
        main([*_RUN, option, ""])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == [
        f"{_PREFIX}argument {option}: is empty; give a file path"]


# -- a FIFO as the report path --------------------------------------------------------------------
_NO_READER = "a FIFO that no process reads (writing would wait for one)"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")


@needs_fifo
def test_replace_file_refuses_a_fifo_no_process_reads(tmp_path: Path) -> None:
    # it waited for a reader for ever; run apart, so the old wait fails the test, not hangs it
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = ("import sys; from pathlib import Path; from flodl_proto._files import replace_file\n"
            "try:\n"
            "    replace_file(Path(sys.argv[1]), b'x')\n"
            "except OSError as e:\n"
            "    print(e.errno, e.strerror, e.filename, sep='|')\n")
    res = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                         text=True, timeout=30, check=True)
    assert res.stdout == f"{errno.ENXIO}|{_NO_READER}|{fifo}\n"


@needs_fifo
def test_replace_file_writes_a_fifo_a_process_reads(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        replace_file(fifo, b"report\n")
        assert os.read(reader, 100) == b"report\n"
    finally:
        os.close(reader)
    assert fifo.is_fifo()


@needs_fifo
@pytest.mark.parametrize("option", ["--junit", "--json"])
def test_a_report_fifo_no_process_reads_is_exit_1_not_a_wait(option: str,
                                                             tmp_path: Path) -> None:
    fifo = tmp_path / "report"
    os.mkfifo(fifo)
    res = subprocess.run([sys.executable, "-m", "flodl_proto", *_RUN, option, str(fifo)],
                         capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert (res.returncode, res.stdout) == (1, ""), res.stderr
    assert res.stderr == f"{_PREFIX}cannot write the report {shown(str(fifo))}: {_NO_READER}\n"


@pytest.mark.parametrize(("option", "writer"), [("--junit", "write_junit"),
                                                ("--json", "write_json")])
def test_a_report_that_cannot_be_written_is_named_quoted(
        option: str, writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # the line showed the path bare: cannot write the report it's here/r: ...; it is quoted
    # as on every line naming a path of the command line (argument --json: 'PATH': ...)
    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(f"flodl_proto.conform.report.{writer}", no_space)
    assert main([*_RUN, option, "it's here/r"]) == 1
    assert capsys.readouterr() == (
        "", f"{_PREFIX}cannot write the report \"it's here/r\": No space left on device\n")


# -- Ctrl-C during the first report: written once -------------------------------------------------
def test_ctrl_c_during_the_first_report_does_not_write_it_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the interrupted write was started again (a FIFO with no reader: a second wait)
    writes: list[Path] = []

    def interrupted_write(path: Path, *args: object, **kwargs: object) -> None:
        writes.append(path)
        raise KeyboardInterrupt

    monkeypatch.setattr("flodl_proto.conform.report.write_json", interrupted_write)
    out = tmp_path / "r.json"
    assert main([*_RUN, "--json", str(out)]) == 130
    assert writes == [out]
    assert capsys.readouterr() == ("", "flodl-proto conform controller: interrupted\n")


@pytest.mark.parametrize(("cut", "signum", "word"), [
    ("write_junit", None, "interrupted"),  # Ctrl-C (Python's handler notes nothing)
    ("write_json", "SIGTERM", "terminated"),
])
def test_a_stop_during_the_first_report_still_writes_the_other(
        cut: str, signum: str | None, word: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # the stop ended the kit with the other report not written (an earlier run's left), or
    # written before the stop as a Ctrl-C's (``interrupted``) for a SIGTERM
    import json
    import signal
    import xml.etree.ElementTree as ET

    from flodl_proto import cli
    from flodl_proto.conform import report

    paths = {"write_junit": tmp_path / "r.xml", "write_json": tmp_path / "r.json"}
    for path in paths.values():
        path.write_text("an earlier run's report")
    writes: list[Path] = []

    def recording(name: str) -> object:
        real = getattr(report, name)

        def write(path: Path, *args: object, **kwargs: object) -> None:
            writes.append(path)
            if name == cut and writes.count(path) == 1:  # the first write of this report
                if signum is not None:
                    cli.note_stop(getattr(signal, signum))
                raise KeyboardInterrupt
            real(path, *args, **kwargs)
        return write

    for name in paths:
        monkeypatch.setattr(report, name, recording(name))
    code = 143 if signum else 130
    assert main([*_RUN, "--junit", str(paths["write_junit"]),
                 "--json", str(paths["write_json"])]) == code
    assert capsys.readouterr() == ("", f"flodl-proto conform controller: {word}\n")
    # the report cut short is not written again; the other says who stopped the kit
    other = paths["write_json" if cut == "write_junit" else "write_junit"]
    assert writes.count(paths[cut]) == 1
    assert paths[cut].read_text() == "an earlier run's report"
    reason = f"not run: the kit was {word}"
    if other.suffix == ".json":
        doc = json.loads(other.read_text())
        assert (doc["interrupted"], doc["stop"], doc["results"]) == (True, word, [])
        assert doc["not_run"] == [{"id": "controller.session.one-relay-one-round",
                                   "version": 2, "reason": reason}]
    else:
        (suite,) = ET.parse(other).getroot().findall("testsuite")
        assert [(p.get("name"), p.get("value")) for p in suite.iter("property")] == [
            ("interrupted", "true"), ("stop", word)]
        assert [(tc.get("name"), [e.get("message") for e in tc.iter("skipped")])
                for tc in suite.iter("testcase")] == [
            ("controller.session.one-relay-one-round", [reason])]


# -- a long --launch program word -----------------------------------------------------------------
def test_a_long_program_word_is_cut_in_the_launch_error() -> None:
    word = "/no/such/" + "x" * 200_000
    e = TargetLaunchError(word, "File name too long")
    assert str(e) == (f"cannot start the target '{word[:40]}...{'x' * 20}' ({len(word)} "
                      "characters): File name too long")
    assert e.command == word  # whole, for a caller that wants it
    short = "/no/such/program"
    assert str(TargetLaunchError(short, "No such file or directory")) == (
        f"cannot start the target {short!r}: No such file or directory")


def test_a_long_program_word_is_not_repeated_whole_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    word = str(tmp_path / ("x" * 200_000))
    run = ["conform", "controller", "--timeout-scale", "0.1", "--version", "2", "--jobs", "1",
           "--launch", f"{word} {{port}}"]
    assert main(run) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{_PREFIX}argument --launch: cannot start the target "
                          f"'{word[:40]}...{'x' * 20}' ({len(word)} characters): ")
    assert err.count("\n") == 1 and len(err) < 300


# -- --list with a report option ------------------------------------------------------------------
@pytest.mark.parametrize("options", [["--junit", "r.xml"], ["--json", "r.json"],
                                     ["--junit", "r.xml", "--json", "r.json"]])
def test_list_with_a_report_option_is_a_usage_error(
        options: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the report options were ignored in silence
    monkeypatch.chdir(tmp_path)
    assert main(["conform", "controller", "--list", *options]) == 2
    assert capsys.readouterr() == (
        "", f"{_PREFIX}argument {options[0]}: not allowed with argument --list (a listing "
            "writes no report)\n")
    assert list(tmp_path.iterdir()) == []


# -- --timeout-scale shown as given ---------------------------------------------------------------
@pytest.mark.parametrize(("value", "problem"), [(" ", "is not a number"),
                                                ("", "is not a number"),
                                                (" 0.01 ", "is out of range"),
                                                ("\tnan", "is not finite")])
def test_an_invalid_timeout_scale_is_shown_as_given(
        value: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --timeout-scale ' ' was shown as ''
    assert main(["conform", "controller", "--launch", "x", "--timeout-scale", value]) == 2
    assert capsys.readouterr() == (
        "", f"{_PREFIX}argument --timeout-scale: {value!r} {problem}; expected a finite scale "
            f"factor "
        "from 0.1 to 1000\n")

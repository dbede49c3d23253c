"""Usage errors of the command line, in process: each is one line on stderr in argparse's format
(``PROG: error: MESSAGE``, without argparse's usage text), exit 2, nothing on stdout."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from .cli_util import run_main as _run_main


def _parser_of(*command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (``()``: the top level's)."""
    from flodl_proto.cli import build_parser

    parser = build_parser()
    for word in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _refusal(parse: Any, text: str) -> str:
    """The message an option type (``whole_number``, ``real_number``, ...) refuses ``text``
    with."""
    with pytest.raises(argparse.ArgumentTypeError) as ei:
        parse(text)
    return str(ei.value)


def _invalid_choice(action: argparse.Action, value: object) -> str:
    """argparse's own message for ``value`` not among ``action``'s choices (its quoting of the
    choices differs between Python versions)."""
    parser = argparse.ArgumentParser()
    try:
        parser._check_value(action, value)
    except argparse.ArgumentError as e:
        return e.message
    raise AssertionError(f"{value!r} accepted")


@pytest.mark.parametrize(("args", "command", "option", "value", "choices"), [
    (("--log-level", "bogus", "vectors", "check"), (), "--log-level", "bogus",
     ("DEBUG", "INFO", "WARNING", "ERROR")),
    (("vectors", "check", "--log-level", "Bogus"), ("vectors", "check"), "--log-level", "Bogus",
     ("DEBUG", "INFO", "WARNING", "ERROR")),
    (("conform", "controller", "--list", "--level", "MUSTY"), ("conform", "controller"),
     "--level", "MUSTY", ("must", "should")),
], ids=["log-level-before-the-command", "log-level-after-it", "conform-level"])
def test_an_invalid_choice_is_echoed_as_typed(
        args: tuple[str, ...], command: tuple[str, ...], option: str, value: str,
        choices: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-level bogus`` said ``invalid choice: 'BOGUS'`` (and ``conform --level MUSTY``
    ``'musty'``): the value was upper- (lower-) cased before argparse checked it."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    message = _invalid_choice(argparse.Action([option], "x", choices=choices), value)
    assert f"invalid choice: {value!r}" in message
    assert (code, out, err) == (
        2, "", f"{prog}: error: argument {option}: "
               f"{message}\n")


@pytest.mark.parametrize(("log_level", "level"),
                         [("debug", "must"), ("Info", "Should"), ("WARNING", "MUST")])
def test_a_choice_is_taken_in_any_case(log_level: str, level: str,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from flodl_proto.cli import build_parser

    args = build_parser().parse_args(["--log-level", log_level, "conform", "controller",
                                      "--level", level])
    assert (args.log_level, args.level) == (log_level, level)  # as typed: read in any case
    configured: list[object] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: configured.append(kw["level"]))
    code, out, err = _run_main(capsys, "--log-level", log_level, "conform", "controller",
                               "--level", level, "--list")
    assert (code, err) == (0, "")
    assert configured == [getattr(logging, log_level.upper())]
    listed = [line.split()[1] for line in out.splitlines()[:-1] if "not selected" not in line]
    assert listed and set(listed) == {level.upper()}


_COMMANDS = ("COMMAND (choose from 'conform', 'controller', 'decode', 'demo', 'dissector', "
             "'docs', 'rank', 'relay', 'vectors')")


@pytest.mark.parametrize(("args", "command", "missing"), [
    (("conform",), ("conform",), "ROLE (choose from 'controller', 'relay', 'docs')"),
    (("conform", "--log-level", "INFO"), ("conform",),
     "ROLE (choose from 'controller', 'relay', 'docs')"),
    # it printed its help on stdout and exited 2
    (("vectors",), ("vectors",), "ACTION (choose from 'check', 'compare', 'export')"),
    (("vectors", "--log-level", "INFO"), ("vectors",),
     "ACTION (choose from 'check', 'compare', 'export')"),
    (("vectors", "compare"), ("vectors", "compare"), "DIR"),
    (("rank", "--rank", "0"), ("rank",), "--relay, --world-size"),
    # no command printed the help on stdout and exited 2
    ((), (), _COMMANDS), (("--log-level", "INFO"), (), _COMMANDS),
], ids=["conform", "conform-log-level", "vectors", "vectors-log-level", "vectors-compare",
        "rank", "no-command", "no-command-log-level"])
def test_a_missing_required_argument_is_argparse_s_error(
        args: tuple[str, ...], command: tuple[str, ...], missing: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With no unknown argument, a missing required one is argparse's error; a missing ROLE or
    ACTION names its choices, as argparse's error for an invalid one does."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    assert (code, out, err) == (
        2, "", f"{prog}: error: the following arguments "
               f"are required: {missing}\n")


_PROTOCOL_VERSION = argparse.Action(["--protocol-version"], "x", choices=(2, 3))
_COMMAND = argparse.Action([], "command", choices=(
    "conform", "controller", "decode", "demo", "dissector", "docs", "rank", "relay", "vectors"))


@pytest.mark.parametrize(("args", "line"), [
    (("relay", "--world-size", "abc"),
     "flodl-proto relay: error: argument --world-size: invalid int value: 'abc'"),
    (("relay", "--bogus"), "flodl-proto relay: error: unrecognized arguments: --bogus"),
    (("decode", "--bogus", "-"), "flodl-proto decode: error: unrecognized arguments: --bogus"),
    (("relay",), "flodl-proto relay: error: the following arguments are required: "
                 "--controller, --ranks, --world-size"),
    (("vectors", "compare"),
     "flodl-proto vectors compare: error: the following arguments are required: DIR"),
    (("decode", "--protocol-version", "9", "-"),
     "flodl-proto decode: error: argument --protocol-version: "
     + _invalid_choice(_PROTOCOL_VERSION, 9)),
    (("bogus",), "flodl-proto: error: argument COMMAND: " + _invalid_choice(_COMMAND, "bogus")),
    (("--bogus", "decode", "-"), "flodl-proto: error: unrecognized arguments: --bogus"),
], ids=["bad-int", "unknown-option", "unknown-option-decode", "missing-required",
        "missing-positional", "invalid-choice", "unknown-command", "top-level-unknown-option"])
def test_a_usage_error_is_exactly_one_line(args: tuple[str, ...], line: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error argparse finds was its usage text (several lines), then the error line;
    it is the error line alone, as every other error of the command line, exit 2."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out, err) == (2, "", line + "\n")


def test_a_usage_error_from_the_console_script_is_one_line() -> None:
    """The same through ``python -m flodl_proto`` (the console script's entry): one line on
    stderr, nothing on stdout, exit 2; ``--help`` still shows the usage, on stdout."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "flodl_proto", "relay", "--world-size", "abc"],
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", "flodl-proto relay: error: argument --world-size: invalid int value: 'abc'\n")
    res = subprocess.run([sys.executable, "-m", "flodl_proto", "relay", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout.startswith("usage: flodl-proto relay [-h] [--controller HOST:PORT]")


def test_a_line_break_in_a_usage_error_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever a usage error says, it stays one line: a line break left in the message (none
    of argparse's or the package's messages holds one today) is escaped as ``repr`` writes
    it."""
    from flodl_proto.cli import build_parser

    with pytest.raises(SystemExit) as ei:
        build_parser().error("a\nb\r\u2028c")
    assert ei.value.code == 2
    assert capsys.readouterr() == ("", "flodl-proto: error: a\\nb\\r\\u2028c\n")


@pytest.mark.parametrize(("args", "option"), [
    (("controller", "--listen", "a" * 3000 + ":99", "--world-size", "1", "--salt", "0" * 32),
     "--listen"),
    (("rank", "--relay", "b" * 3000 + ":99", "--rank", "0", "--world-size", "1", "--salt",
      "0" * 32), "--relay"),
    (("relay", "--controller", "c" * 3000 + ":99", "--ranks", "0", "--world-size", "1",
      "--salt", "0" * 32), "--controller"),
])
def test_a_long_address_is_not_echoed_whole(capsys: pytest.CaptureFixture[str],
                                            args: tuple[str, ...], option: str) -> None:
    """An address of thousands of characters was echoed whole in the error line (and its host
    again in the reason); each is quoted by its ends and its length."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert f"argument {option}: '" in err and "' (3003 characters): not a HOST:PORT address" in err
    assert "(3000 characters) is not a valid host name" in err
    assert len(err) < 400


_BIG = "9" * 5000
_SALT = "0" * 32


@pytest.mark.parametrize(("args", "message"), [
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt", _SALT,
      "--rounds", "-" + _BIG), "argument --rounds: must be in 1..1000000, got <a negative integer "
                               "of 16610 "
     "bits>"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", _BIG, "--world-size", "1", "--salt", _SALT),
     "argument --rank: must be in 0..0 (below --world-size), got <an integer of 16610 bits>"),
    (("controller", "--listen", "127.0.0.1:0", "--world-size", _BIG, "--salt", _SALT),
     "argument --world-size: must be in 1..4294967295 (the handshake's u32 field), got <an integer "
     "of 16610 bits>"),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1", "--salt",
      _SALT, "--listen-port", _BIG), "argument --listen-port: port <an integer of 16610 bits> "
     "is not in 0..65535"),
    (("conform", "controller", "--launch", "true", "--jobs", "-" + _BIG),
     "argument --jobs: must be in 1..1024, got <a negative integer of 16610 bits>"),
    (("decode", "--protocol-version", _BIG), "argument --protocol-version: invalid choice: "
     "<an integer of 16610 bits> (choose from 2, 3)"),
    (("decode", "--pcap", "--port", _BIG), "argument --port: port <an integer of 16610 bits> "
     "is not in 1..65535"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "x" + _BIG, "--world-size", "1"),
     f"argument --rank: invalid int value: 'x{'9' * 39}...{'9' * 20}' (5001 characters)"),
])
def test_an_integer_of_thousands_of_digits_is_out_of_range(
        capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str) -> None:
    """An integer option of more digits than int() reads (4300) was argparse's "invalid int
    value: '999...'", its digits echoed whole; it is read, the command's range check refuses it
    as any value out of range, and the line shows it by its size (text that is no integer, by
    its ends)."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].endswith(f": error: {message}")
    assert len(err.splitlines()[-1]) < 300


_RANK = ("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt", _SALT)


@pytest.mark.parametrize(("args", "message"), [
    ((*_RANK, "--rounds", "0"), "argument --rounds: must be in 1..1000000, got 0"),
    ((*_RANK, "--rounds", "1000001"), "argument --rounds: must be in 1..1000000, got 1000001"),
    ((*_RANK, "--rounds", _BIG), "argument --rounds: must be in 1..1000000, got <an integer of "
                                 "16610 bits>"),
    # the largest is taken: the next check speaks
    ((*_RANK, "--rounds", "1000000", "--payload-mib", "-1"),
     "argument --payload-mib: must be a finite number >= 0, got '-1'"),
    (("conform", "controller", "--list", "--jobs", "0"), "argument --jobs: must be in 1..1024, got "
                                                         "0"),
    (("conform", "controller", "--list", "--jobs", "1025"), "argument --jobs: must be in 1..1024, "
                                                            "got 1025"),
    (("conform", "controller", "--list", "--jobs", _BIG),
     "argument --jobs: must be in 1..1024, got <an integer of 16610 bits>"),
], ids=["rounds-0", "rounds-above", "rounds-huge", "rounds-max", "jobs-0", "jobs-above",
        "jobs-huge"])
def test_rank_rounds_and_conform_jobs_are_bounded(
        capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str) -> None:
    """``rank --rounds`` and ``conform --jobs`` took any number above 0: a rank of 10^5000
    rounds, a kit of 10^5000 jobs. They are in 1..1000000 (as ``demo --rounds``) and 1..1024,
    as their help says."""
    code, out, err = _run_main(capsys, *args)
    prog = "flodl-proto rank" if args[0] == "rank" else "flodl-proto conform controller"
    assert (code, out, err) == (2, "", f"{prog}: error: {message}\n")


def test_conform_takes_1024_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "conform", "controller", "--list", "--jobs", "1024")
    assert (code, err) == (0, "")
    assert out


@pytest.mark.parametrize(("command", "words"), [
    (("rank",), "rounds to run, 1 to 1000000 (default 5)"),
    (("conform", "controller"), "each against its own target, 1 to 1024 (default"),
])
def test_the_help_states_the_bounds(
        command: tuple[str, ...], words: str) -> None:
    assert words in " ".join(_parser_of(*command).format_help().split())


_NINES = "9" * 400
_TOO_LARGE = (f"'{'9' * 40}...{'9' * 20}' (400 characters) is out of range: above the largest "
              "finite number, 1.79769e+308")


@pytest.mark.parametrize(("args", "message"), [
    (("demo", "--payload-mib", _NINES), f"argument --payload-mib: {_TOO_LARGE}"),
    (("demo", "--payload-mib", "-" + _NINES), f"argument --payload-mib: '-{'9' * 39}..."
     f"{'9' * 20}' (401 characters) is out of range: below the smallest finite number, "
     "-1.79769e+308"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt", _SALT,
      "--payload-mib", _NINES), f"argument --payload-mib: {_TOO_LARGE}"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt", _SALT,
      "--interval", "1e400"), "argument --interval: '1e400' is out of range: above the largest "
     "finite number, 1.79769e+308"),
    # written as such, an infinity is the command's range error, as before
    (("demo", "--payload-mib", "inf"), "argument --payload-mib: must be a finite number >= 0, got "
                                       "'inf'"),
    # far above the limit: the frame's length (hundreds of digits) is left out
    (("demo", "--payload-mib", "1e300"), "argument --payload-mib: must be at most 1023.99, got "
     "'1e300': a rank's frame would be above the frame ceiling of 1073741824 bytes"),
    (("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "1", "--salt", _SALT,
      "--payload-mib", "1e300"), "argument --payload-mib: '1e300' makes a frame above the frame "
     "ceiling 1073741824 (--frame-ceiling)"),
])
def test_a_number_beyond_the_float_range_is_out_of_range(
        capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str) -> None:
    """``--payload-mib`` of 400 nines was read as infinity and refused with "got inf", as if
    ``inf`` had been given; it is out of range, the line quoting the text by its ends."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].endswith(f": error: {message}")


_X = "x" * 3000
_X_SHOWN = f"'{'x' * 40}...{'x' * 20}' (3000 characters)"


@pytest.mark.parametrize(("args", "command", "message"), [
    (("demo", "--bogus", _BIG), ("demo",),
     f"unrecognized arguments: --bogus '{'9' * 40}...{'9' * 20}' (5000 characters)"),
    (("--bogus=" + _X, "demo"), (),
     f"unrecognized arguments: '--bogus={'x' * 32}...{'x' * 20}' (3008 characters)"),
    (("demo", "--bogus", _X, "y"), ("demo",), f"unrecognized arguments: --bogus {_X_SHOWN} y"),
    (("demo", "--bf16=" + _X), ("demo",),
     f"argument --bf16: ignored explicit argument {_X_SHOWN}"),
    (("vectors", "check", "-v" + _X), ("vectors", "check"),
     f"argument -v/--verbose: ignored explicit argument {_X_SHOWN}"),
    (("demo", "--s=" + _X), ("demo",),
     f"ambiguous option: '--s={'x' * 36}...{'x' * 20}' (3004 characters) could match --seed, "
     "--salt-file"),
], ids=["unrecognized", "unrecognized-before-the-command", "unrecognized-short-and-long",
        "ignored-explicit-argument", "ignored-explicit-argument-short", "ambiguous-option"])
def test_argparse_shows_a_long_value_by_its_ends(
        args: tuple[str, ...], command: tuple[str, ...], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own messages echoed a value of thousands of characters whole (``unrecognized
    arguments``, ``ignored explicit argument``, ``ambiguous option``); it is quoted by its ends
    and its length, as the package's own messages quote a value, and a short one next to it as
    before."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    assert (code, out, err) == (
        2, "", f"{prog}: error: {message}\n")


@pytest.mark.parametrize(("args", "command", "option", "value", "shown"), [
    (("demo", "--log-level", _X), ("demo",), "--log-level", _X, _X_SHOWN),
    (("--log-level=" + _X, "demo"), (), "--log-level", _X, _X_SHOWN),
    (("demo", "--log-level", _X + "'"), ("demo",), "--log-level", _X + "'",
     f"\"{'x' * 40}...{'x' * 19}'\" (3001 characters)"),
    ((_BIG,), (), "COMMAND", _BIG, f"'{'9' * 40}...{'9' * 20}' (5000 characters)"),
    (("conform", _X), ("conform",), "ROLE", _X, _X_SHOWN),
    (("vectors", _X), ("vectors",), "ACTION", _X, _X_SHOWN),
], ids=["log-level", "log-level-equals", "log-level-quote", "command", "role", "action"])
def test_an_invalid_choice_shows_a_long_value_by_its_ends(
        args: tuple[str, ...], command: tuple[str, ...], option: str, value: str, shown: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``invalid choice: 'xxx...'`` echoed a value of thousands of characters whole (an unknown
    command, role or action too); it is quoted by its ends and its length."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    parser = _parser_of(*command)
    action = next(a for a in parser._actions
                  if option in a.option_strings or a.metavar == option)
    message = _invalid_choice(action, value)
    assert message.count(repr(value)) == 1
    assert (code, out, err) == (
        2, "", f"{prog}: error: argument {option}: "
               f"{message.replace(repr(value), shown)}\n")


def test_the_conformance_doc_states_the_jobs_bound() -> None:
    from flodl_proto.commands.conform import JOBS_MAX
    from flodl_proto.conform.doc import render_conformance_doc

    assert f"`--jobs N` (cases in parallel, 1 to {JOBS_MAX}, each" in render_conformance_doc()


@pytest.mark.parametrize(("args", "command", "message"), [
    (("demo", "x", "a\nb", "c d"), ("demo",), "unrecognized arguments: x 'a\\nb' c d"),
    (("demo", "x", "", " y"), ("demo",), "unrecognized arguments: x '' ' y'"),
    (("--bogus\x1b[31m", "demo"), (), "unrecognized arguments: '--bogus\\x1b[31m'"),
    (("demo", "--s=a\nb"), ("demo",), "ambiguous option: '--s=a\\nb' could match --seed, "
                                      "--salt-file"),
    (("demo", "--bf16=a\tb"), ("demo",), "argument --bf16: ignored explicit argument 'a\\tb'"),
], ids=["unrecognized", "unrecognized-empty-or-padded", "unrecognized-before-the-command",
        "ambiguous-option", "ignored-explicit-argument"])
def test_argparse_quotes_a_value_with_a_line_break(
        args: tuple[str, ...], command: tuple[str, ...], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A short value holding a line break or an escape character was included raw in
    ``unrecognized arguments`` and ``ambiguous option``, breaking the error line in two (or
    colouring the terminal); it is quoted, as argparse quotes it in its other messages."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    assert (code, out, err) == (
        2, "", f"{prog}: error: {message}\n")


_WORDS = tuple(f"--w{i}" for i in range(2000))


@pytest.mark.parametrize(("args", "command"), [(("demo", *_WORDS), ("demo",)),
                                               ((*_WORDS, "demo"), ())],
                         ids=["after-the-command", "before-the-command"])
def test_thousands_of_unknown_arguments_make_one_bounded_line(
        args: tuple[str, ...], command: tuple[str, ...],
        capsys: pytest.CaptureFixture[str]) -> None:
    """2000 unknown words (each short) made an ``unrecognized arguments`` line of 8900
    characters; it lists the first ones (up to 160 characters) and counts the rest."""
    code, out, err = _run_main(capsys, *args)
    prog = " ".join(("flodl-proto", *command))
    listed = " ".join(_WORDS[:28])
    assert len(listed) <= 160 < len(listed) + len(" --w28")
    assert (code, out, err) == (
        2, "", f"{prog}: error: unrecognized arguments: "
               f"{listed} ... (1972 more)\n")


# -- numbers: ASCII digits only, as upstream's Rust parse ----------------------------------------
_NOT_PLAIN = "(a number is written in ASCII digits, without '_')"


_NON_ASCII_BLANK = ("(a non-ASCII blank, U+00A0: a number and the blanks around it are written "
                    "in ASCII)")


@pytest.mark.parametrize("text", ["\uff11\uff12", "\u0661\u0662", "1_000", "\u0967", "1\uff10",
                                  "\u0661\u00a0"])
def test_integer_options_take_ascii_digits_only(text: str) -> None:
    """``int()`` reads full-width and other scripts' digits, ``_`` between digits and non-ASCII
    blanks around them: every integer option took ``１２`` as 12 and ``1_000`` as 1000."""
    from flodl_proto.commands.relay import whole_number
    from flodl_proto.errors import shown

    assert _refusal(whole_number, text) == f"invalid int value: {shown(text)} {_NOT_PLAIN}"


@pytest.mark.parametrize(("text", "why"), [
    ("4\u00a0", _NON_ASCII_BLANK), ("\u00a012", _NON_ASCII_BLANK),
    ("1_0\u00a0", _NON_ASCII_BLANK[:-1] + ", without '_')"),
    ("\u20034", "(a non-ASCII blank, U+2003: a number and the blanks around it are written in "
               "ASCII)"),
])
def test_a_non_ascii_blank_around_ascii_digits_is_named_as_such(text: str, why: str) -> None:
    """``--world-size $'4\\u00a0'`` was refused as not written in ASCII digits: its digits are;
    the blank is not."""
    from flodl_proto.commands.relay import real_number, whole_number
    from flodl_proto.errors import shown

    assert _refusal(whole_number, text) == f"invalid int value: {shown(text)} {why}"
    assert _refusal(real_number, text) == f"invalid float value: {shown(text)} {why}"


def test_integer_options_read_plain_ascii_as_before() -> None:
    from flodl_proto.commands.relay import whole_number

    for text, value in ((" 12 ", 12), ("+5", 5), ("-3", -3), ("007", 7), ("\t4\n", 4)):
        assert whole_number(text) == value
        assert type(whole_number(text)) is int
    with pytest.raises(argparse.ArgumentTypeError, match=r"^invalid int value: 'x'$"):
        whole_number("x")


@pytest.mark.parametrize("text", ["\uff11.5", "\u0661", "1_0.5", "1e1_0", "0.\u0665"])
def test_number_and_timeout_options_take_ascii_digits_only(text: str) -> None:
    from flodl_proto.commands.relay import TIMEOUT_RULE, positive_seconds, real_number
    from flodl_proto.errors import shown

    assert _refusal(real_number, text) == f"invalid float value: {shown(text)} {_NOT_PLAIN}"
    assert _refusal(positive_seconds, text) == (f"must be {TIMEOUT_RULE}, got {shown(text)} "
                                                f"{_NOT_PLAIN}")


def test_number_options_read_plain_ascii_as_before() -> None:
    from flodl_proto.commands.relay import positive_seconds, real_number

    for text, value in ((" 1.5 ", 1.5), ("+2", 2.0), ("1e3", 1000.0), ("inf", float("inf"))):
        assert real_number(text) == value
    assert positive_seconds(" 2.5 ") == 2.5


# (each ends on a mistake the command finds after parsing: a value taken by mistake does not
# start a cluster member)
_RELAY = ("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1", "--salt",
          _SALT, "--frame-ceiling", "4G")
_CONTROLLER = ("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", _SALT,
               "--frame-ceiling", "4G")


@pytest.mark.parametrize(("args", "message"), [
    ((*_RELAY, "--world-size", "\uff12"), f"argument --world-size: invalid int value: '\uff12' "
                                          f"{_NOT_PLAIN}"),
    ((*_RELAY, "--listen-port", "5_000"), f"argument --listen-port: not a port number: '5_000' "
                                          f"{_NOT_PLAIN}"),
    ((*_RELAY, "--rank-timeout", "\uff15"), "argument --rank-timeout: must be a finite number of "
                                            "seconds above 0"),
    ((*_CONTROLLER, "--world-size", "\u0661"), f"argument --world-size: invalid int value: "
                                               f"'\u0661' {_NOT_PLAIN}"),
    ((*_CONTROLLER, "--round-timeout", "1_0"), "argument --round-timeout: must be a finite "
                                               "number of seconds above 0"),
    ((*_RANK, "--rounds", "0", "--rank", "\uff10"), f"argument --rank: invalid int value: "
                                                    f"'\uff10' {_NOT_PLAIN}"),
    ((*_RANK, "--rounds", "0", "--interval", "\uff11"), f"argument --interval: invalid float "
                                                        f"value: '\uff11' {_NOT_PLAIN}"),
    ((*_RANK, "--rounds", "0", "--payload-mib", "1_0"), f"argument --payload-mib: invalid float "
                                                        f"value: '1_0' {_NOT_PLAIN}"),
    (("decode", "--pcap", "--port", "5_5", "/nonexistent/x.pcap"),
     f"argument --port: not a port number: '5_5' {_NOT_PLAIN}"),
])
def test_numeric_options_name_the_option_and_the_value(
        capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str) -> None:
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    assert "Traceback" not in err
    assert err.splitlines()[-1].split(": error: ", 1)[1].startswith(message)


@pytest.mark.parametrize(("ranks", "why"), [
    ("\u0661", f" {_NOT_PLAIN}"), ("0,\uff11", f" {_NOT_PLAIN}"), ("0-\u0663", f" {_NOT_PLAIN}"),
    ("1_0", f" {_NOT_PLAIN}"), ("0,\u00a01", f" {_NON_ASCII_BLANK}"),
    # a blank inside a number: "0 1" was read as rank 1 ("01"), "1 2" as rank 12
    ("0 1", " (a blank inside a number)"), ("1 2", " (a blank inside a number)"),
    ("0,1 2-3", " (a blank inside a number)"), ("0-1\t2", " (a blank inside a number)"),
    ("-1", ""), ("3-1", ""), ("1--2", ""), ("0-", ""), ("x", ""),
])
def test_relay_ranks_take_ascii_digits_only(ranks: str, why: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from flodl_proto.errors import shown

    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", ranks,
                               "--world-size", "20", "--salt", _SALT, "--frame-ceiling", "4G")
    assert (code, out) == (2, "")
    assert err == (f"flodl-proto relay: error: argument --ranks: expected a list of ranks like 0,1 "
                   f"or 0-3, got {shown(ranks)}{why}\n")


@pytest.mark.parametrize(("ranks", "expected"), [
    ("+1", [1]), ("0,\t1", [0, 1]), (" 0 , +1 ", [0, 1]), ("+0-+2", [0, 1, 2]),
    ("\t1 - 3\n", [1, 2, 3]), ("007,8", [7, 8]),
])
def test_relay_ranks_are_written_as_every_integer_option(ranks: str, expected: list[int]) -> None:
    """Each rank and each end of a range follows ``whole_number``'s rule (blanks around it, an
    optional ``+``, ASCII digits), as ``--rank +1`` and ``--world-size $'\\t4'`` do; ``+1`` and
    ``0,\\t1`` were refused."""
    from flodl_proto.commands.relay import parse_ranks

    assert parse_ranks(ranks, 10) == expected


@pytest.mark.parametrize(("ranks", "rank"), [("0,1,1", "1"), ("0-2,1", "1"), ("3,0-3", "3"),
                                             ("+2,2", "2")])
def test_relay_ranks_listed_twice_name_the_option(ranks: str, rank: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The relay's core refused them in its words (``rank set [0, 1, 1] is invalid for
    world_size 4: a rank is listed twice``), naming no option."""
    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", ranks,
                               "--world-size", "4", "--salt", _SALT, "--frame-ceiling", "4G")
    assert (code, out) == (2, "")
    assert err == (f"flodl-proto relay: error: argument --ranks: '{ranks}': rank {rank} is listed "
                   f"twice\n")


@pytest.mark.parametrize(("args", "message"), [
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", _SALT,
      "--round-timeout", "1_0"), "argument --round-timeout: must be a finite number of seconds "
     "above 0, at most 864000 s once scaled by FLODL_NET_TIMEOUT_SCALE, got '1_0' "
     f"{_NOT_PLAIN}"),
    ((*_RELAY, "--frame-ceiling", "\uff11\uff10\uff12\uff14"),
     "argument --frame-ceiling: expected a number of bytes, got "
     f"'\uff11\uff10\uff12\uff14' {_NOT_PLAIN}"),
    (("decode", "--max-input", "1_000", "/nonexistent/x.bin"),
     f"argument --max-input: expected a number of bytes, got '1_000' {_NOT_PLAIN}"),
    (("demo", "--no-progress", "--kill-rank", "1@\u0662"),
     f"argument --kill-rank: expected R@ROUND (two whole numbers), got '1@\u0662' {_NOT_PLAIN}"),
    (("dissector", "--port", "\uff17\uff10\uff10\uff10"),
     f"argument --port: not a port number: '\uff17\uff10\uff10\uff10' {_NOT_PLAIN}"),
    (("decode", "--pcap", "--port", "5_5", "/nonexistent/x.pcap"),
     f"argument --port: not a port number: '5_5' {_NOT_PLAIN}"),
    ((*_RANK[:2], "127.0.0.1:\uff17\uff10\uff10\uff10", *_RANK[3:]),
     f"argument --relay: '127.0.0.1:\uff17\uff10\uff10\uff10': not a HOST:PORT address: port "
     f"'\uff17\uff10\uff10\uff10' is not a decimal number {_NOT_PLAIN}"),
    (("conform", "relay", "--timeout-scale", "1_0", "--launch", "x"),
     f"argument --timeout-scale: '1_0' is not a number {_NOT_PLAIN}; expected a finite scale "
     f"factor from 0.1 to 1000"),
    ((*_RELAY[:-1], "4G", "--world-size", "4\u00a0"),
     f"argument --world-size: invalid int value: '4\\xa0' {_NON_ASCII_BLANK}"),
])
def test_number_options_say_why_text_int_reads_is_refused(
        capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str) -> None:
    """Only the integer and number option types said why ``1_0`` or ``７０００`` is refused; the
    timeouts, byte counts, ports, ``--kill-rank`` and an address's port said nothing."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out) == (2, "")
    assert "Traceback" not in err and err.count(": error: ") == 1 and err.count("\n") == 1
    assert err.splitlines()[-1].split(": error: ", 1)[1] == message


@pytest.mark.parametrize(("ranks", "world", "message"), [
    ("0,99999999999999999999", "1", "argument --ranks: '0,99999999999999999999': every rank must "
                                    "be < --world-size 1, got rank 99999999999999999999"),
    ("3", "2", "argument --ranks: '3': every rank must be < --world-size 2, got rank 3"),
    ("0," + _BIG, "4294967295", f"argument --ranks: '0,{'9' * 38}...{'9' * 20}' (5002 characters): "
                                f"every rank must be < --world-size 4294967295, got rank <an "
                                f"integer of 16610 bits>"),
    (",".join(["0"] * 10**6), "4", f"argument --ranks: '{'0,' * 20}...{',0' * 10}' (1999999 "
                                   f"characters): 1000000 ranks need as many loopback connections, "
                                   f"more than this process may open ("),
])
def test_relay_ranks_out_of_range_name_the_option_and_the_value(
        ranks: str, world: str, message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A single rank (not a range) of 20 digits was refused by the relay's core in its words
    (``rank set [0, 99999999999999999999] is invalid for world_size 1``), naming no option, and
    one of 5000 digits as a list that does not parse."""
    from flodl_proto.commands import relay

    monkeypatch.setattr(relay, "_max_open_files", lambda: 1024)
    code, out, err = _run_main(capsys, "relay", "--controller", "127.0.0.1:1", "--ranks", ranks,
                               "--world-size", world, "--salt", _SALT)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"flodl-proto relay: error: {message}")


def test_the_rank_prefix_found_before_parsing_reads_rank_as_the_option_does() -> None:
    """The prefix of a line written before the arguments are parsed (an interruption) named
    ``--rank ３`` as rank 3, a value the option refuses."""
    from flodl_proto.cli import _argv_prog

    assert _argv_prog(["rank", "--rank", "\uff13"]) == "flodl-proto rank"
    assert _argv_prog(["rank", "--rank=1_0"]) == "flodl-proto rank"
    assert _argv_prog(["rank", "--rank", " 3 "]) == "flodl-proto rank 3"

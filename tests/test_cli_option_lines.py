"""One clear line and a conventional exit code for option mistakes of the command line
(``decode``, ``controller``, ``relay``, ``conform``): each test pins the exact line."""

from __future__ import annotations

from pathlib import Path

import pytest

from .cli_util import run_main as _run_main

SALT_HEX = "00112233445566778899aabbccddeeff"
#: docs/protocol.md section 5.3: a 55-byte RoundFrame (Model, weight 1.0, one f32 tensor [4])
ROUND_FRAME_DUMP = """\
0000  f1 17 0d f1 01 00 00 00 00 00 00 00 00 00 00 f0
0010  3f 00 01 04 00 00 00 10 00 00 00 00 00 00 00 00
0020  00 80 3f 00 00 20 c0 00 00 00 00 00 00 50 40 39
0030  a5 87 85 a0 3c 12 d1
"""


# -- decode --frame-ceiling on the bare frame leg -------------------------------------------------
@pytest.fixture
def frame_dump(tmp_path: Path) -> Path:
    path = tmp_path / "frame.hex"
    path.write_text(ROUND_FRAME_DUMP)
    return path


@pytest.mark.parametrize("leg", ["frame", "auto"])
def test_decode_frame_ceiling_bounds_a_bare_frame(frame_dump: Path, leg: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_main(capsys, "decode", "--hex", "--frame-ceiling", "30", "--leg", leg,
                             str(frame_dump))
    assert code == 1
    assert out == ('{"type": "error", "offset": 0, "error_kind": "limit", "error_id": '
                   '"stream.frame_over_ceiling", "error": "bare RoundFrame of 55 bytes (tag '
                   'included) exceeds the frame ceiling 30"}\n')


def test_decode_frame_ceiling_bounds_a_cut_bare_frame(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A frame cut short is refused once the bytes it needs are known to pass the ceiling."""
    path = tmp_path / "cut.bin"
    path.write_bytes(bytes.fromhex("".join(line[6:] for line in ROUND_FRAME_DUMP.splitlines()))
                     [:40])
    code, out, _ = _run_main(capsys, "decode", "--frame-ceiling", "30", "--leg", "frame",
                             str(path))
    assert code == 1
    assert out.endswith('"error": "bare RoundFrame of at least 47 bytes (tag included) exceeds '
                        'the frame ceiling 30"}\n')


def test_decode_a_bare_frame_at_the_ceiling_decodes(frame_dump: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_main(capsys, "decode", "--hex", "--frame-ceiling", "55", "--leg",
                             "frame", str(frame_dump))
    assert code == 0
    assert out.splitlines()[-1] == '{"type": "end", "offset": 55, "records": 1}'


# -- decode: --hex with --pcap --------------------------------------------------------------------
@pytest.mark.parametrize(("args", "line"), [
    (["--pcap", "--hex"], "argument --hex: not allowed with argument --pcap"),
    (["--hex", "--pcap"], "argument --pcap: not allowed with argument --hex"),
])
def test_decode_hex_and_pcap_is_a_usage_error(frame_dump: Path, args: list[str], line: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "decode", *args, str(frame_dump), "--port", "5")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"flodl-proto decode: error: {line}"


# -- --salt: one wording for every command --------------------------------------------------------
@pytest.mark.parametrize(("value", "got"), [
    ("12", "2 characters"),
    ("abc", "3 characters"),
    ("00" * 17, "34 characters"),
    ("zz" * 16, "32 characters, character 1 ('z') not a hex digit"),
])
def test_decode_salt_error_is_the_cluster_commands_wording(
        value: str, got: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "decode", "--salt", value, "f")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == ("flodl-proto decode: error: argument --salt: session salt "
                                    f"must be 16 bytes written as 32 hex digits, got {got}")
    code, out, err = _run_main(capsys, "controller", "--listen", "127.0.0.1:0", "--world-size",
                               "1", "--salt", value)
    assert (code, out) == (2, "")
    assert err == ("flodl-proto controller: error: argument --salt: session salt must be 16 bytes "
                   f"written as 32 hex digits, got {got}\n")


# -- controller/relay: --listen, --frame-ceiling, --host ------------------------------------------
def test_listen_not_an_address_reads_as_the_other_option_lines(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "controller", "--listen", "127.0.0.1:99999",
                               "--world-size", "1", "--salt", SALT_HEX)
    assert (code, out) == (2, "")
    assert err == ("flodl-proto controller: error: argument --listen: '127.0.0.1:99999': not a "
                   "HOST:PORT address: port 99999 is not in 0..65535\n")


_RELAY_OF = ("relay", "--ranks", "0", "--world-size", "1", "--salt", SALT_HEX)


@pytest.mark.parametrize(("args", "line"), [
    ((*_RELAY_OF, "--controller", "127.0.0.1:1", "--listen-port", "70000"),
     "flodl-proto relay: error: argument --listen-port: port 70000 is not in 0..65535"),
    ((*_RELAY_OF, "--controller", "127.0.0.1:1", "--listen-port", "-1"),
     "flodl-proto relay: error: argument --listen-port: port -1 is not in 0..65535"),
    ((*_RELAY_OF, "--controller", "127.0.0.1:1", "--listen-port", "7x"),
     "flodl-proto relay: error: argument --listen-port: not a port number: '7x'"),
    # not given: the controller's port + 4, named by the option it came from and the one to give
    ((*_RELAY_OF, "--controller", "127.0.0.1:65532"),
     "flodl-proto relay: error: argument --controller: '127.0.0.1:65532': port 65536 is not in "
     "0..65535 (the default --listen-port: the controller's port + 4); give --listen-port"),
    ((*_RELAY_OF, "--controller", "127.0.0.1:70000"),
     "flodl-proto relay: error: argument --controller: '127.0.0.1:70000': not a HOST:PORT address: "
     "port 70000 is not in 1..65535"),
    (("rank", "--rank", "0", "--world-size", "1", "--salt", SALT_HEX, "--relay",
      "127.0.0.1:70000"),
     "flodl-proto rank: error: argument --relay: '127.0.0.1:70000': not a HOST:PORT address: port "
     "70000 is not in 1..65535"),
    (("controller", "--world-size", "1", "--salt", SALT_HEX, "--listen", "127.0.0.1:70000"),
     "flodl-proto controller: error: argument --listen: '127.0.0.1:70000': not a HOST:PORT "
     "address: port 70000 is not in 0..65535"),
    (("decode", "--pcap", "--port", "70000", "x.pcap"),
     "flodl-proto decode: error: argument --port: port 70000 is not in 1..65535"),
], ids=["listen-port-above", "listen-port-negative", "listen-port-not-a-number",
        "listen-port-default", "controller", "relay", "listen", "decode-port"])
def test_a_port_out_of_range_names_its_option(args: tuple[str, ...], line: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``relay --listen-port 70000`` said ``listen port 70000 is out of range 0..65535``, and
    ``--controller H:65532`` the same of port 65536, naming no option; every port out of range
    names its option (or the address's) in one wording, ``port N is not in MIN..65535``."""
    code, out, err = _run_main(capsys, *args)
    assert (code, out, err) == (2, "", line + "\n")


@pytest.mark.parametrize(("value", "why"), [
    ("10", "must be at least 25 bytes (the smallest RoundFrame: no tensor), got 10"),
    ("4G", "expected a number of bytes, got '4G'"),
])
def test_frame_ceiling_shows_its_value_once(value: str, why: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "controller", "--listen", "127.0.0.1:0", "--world-size",
                               "1", "--salt", SALT_HEX, "--frame-ceiling", value)
    assert (code, out) == (2, "")
    assert err == f"flodl-proto controller: error: argument --frame-ceiling: {why}\n"


_RELAY = ["relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1", "--salt",
          SALT_HEX]


@pytest.mark.parametrize(("host", "why"), [
    ("", "'' is empty; give a host name, or leave the option out to announce this machine's "
         "host name"),
    ("bad\nname", "'bad\\nname' holds a control character (U+000A at character 4); control "
                  "characters are refused, as a host name is shown in log lines"),
    ("h\x1b[2Jx", "'h\\x1b[2Jx' holds a control character (U+001B at character 2); control "
                  "characters are refused, as a host name is shown in log lines"),
    ("h\x7f", "'h\\x7f' holds a control character (U+007F at character 2); control characters "
              "are refused, as a host name is shown in log lines"),
    ("ab\u202ecd", "'ab\\u202ecd' holds an invisible format, filler or line-separator "
                   "character (U+202E at character 3); such characters are refused, as a host "
                   "name is shown in log lines, where one would reorder, hide or break the text"),
    ("h\u2028x", "'h\\u2028x' holds an invisible format, filler or line-separator "
                 "character (U+2028 at character 2); such characters are refused, as a host "
                 "name is shown in log lines, where one would reorder, hide or break the text"),
    ("h\udcff", "'h\\udcff' holds a byte that is not UTF-8 (character 2); a host name is UTF-8 "
                "text"),
    ("h" * 100000, f"'{'h' * 40}...{'h' * 20}' (100000 characters) is 100000 bytes (UTF-8), more "
                   "than the 255 a Hello may carry"),
    ("\u00e9" * 128, f"'{chr(0xe9) * 40}...{chr(0xe9) * 20}' (128 characters) is 256 bytes "
                     "(UTF-8), more than the 255 a Hello may carry"),
])
def test_relay_host_is_refused_naming_the_option(host: str, why: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, *_RELAY, "--host", host)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"flodl-proto relay: error: argument --host: {why}"


_INVISIBLE = ("such characters are refused, as a host name is shown in log lines, where one "
              "would reorder, hide or break the text")
_SPACE = ("such characters are refused, as a host name is shown in log lines, where one would "
          "pass for a plain space")
_NONCHARACTER = "noncharacters are refused, as they are not for text interchange"


@pytest.mark.parametrize(("host", "why"), [
    ("h\uffff", f"'h\\uffff' holds a noncharacter (U+FFFF at character 2); {_NONCHARACTER}"),
    ("\ufdd0x", f"'\\ufdd0x' holds a noncharacter (U+FDD0 at character 1); {_NONCHARACTER}"),
    ("h\ufdef", f"'h\\ufdef' holds a noncharacter (U+FDEF at character 2); {_NONCHARACTER}"),
    ("h\ufffe", f"'h\\ufffe' holds a noncharacter (U+FFFE at character 2); {_NONCHARACTER}"),
    ("h\U0010ffff", f"'h\\U0010ffff' holds a noncharacter (U+10FFFF at character 2); "
                     f"{_NONCHARACTER}"),
    ("h\u115fx", f"'h\\u115fx' holds an invisible format, filler or line-separator character "
                 f"(U+115F at character 2); {_INVISIBLE}"),
    ("h\u1160x", f"'h\\u1160x' holds an invisible format, filler or line-separator character "
                 f"(U+1160 at character 2); {_INVISIBLE}"),
    ("\u3164", f"'\\u3164' holds an invisible format, filler or line-separator character "
               f"(U+3164 at character 1); {_INVISIBLE}"),
    ("h\uffa0", f"'h\\uffa0' holds an invisible format, filler or line-separator character "
                f"(U+FFA0 at character 2); {_INVISIBLE}"),
    ("a\u00a0b", f"'a\\xa0b' holds a space character other than the ASCII space (U+00A0 at "
                 f"character 2); {_SPACE}"),
    ("a\u3000b", f"'a\\u3000b' holds a space character other than the ASCII space (U+3000 at "
                 f"character 2); {_SPACE}"),
    ("\u0301ab", "'\\u0301ab' starts with a combining mark (U+0301); a host name cannot start "
                 "with one, as it would join the text shown before it"),
    ("\u20dd", "'\\u20dd' starts with a combining mark (U+20DD); a host name cannot start with "
               "one, as it would join the text shown before it"),
    # (a filler, a grapheme joiner, a variation selector: shown escaped, not as empty quotes or
    # a mark on the opening quote; a mark after a letter in a refused name too)
    ("\u034fa", "'\\u034fa' starts with a combining mark (U+034F); a host name cannot start "
                "with one, as it would join the text shown before it"),
    ("\U000e0100a", "'\\U000e0100a' starts with a combining mark (U+E0100); a host name cannot "
                    "start with one, as it would join the text shown before it"),
    ("no\u0301de\u3164", f"'no\\u0301de\\u3164' holds an invisible format, filler or "
                         f"line-separator character (U+3164 at character 6); {_INVISIBLE}"),
    ("\u3164" * 100, "'" + "\\u3164" * 40 + "..." + "\\u3164" * 20 + "' (100 characters) "
                     "holds an invisible format, filler or line-separator character (U+3164 at "
                     f"character 1); {_INVISIBLE}"),
])
def test_relay_host_refuses_noncharacters_fillers_odd_spaces_and_a_leading_mark(
        host: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    # (--frame-ceiling 4G: a host name taken is then refused too, and the relay does not start)
    code, out, err = _run_main(capsys, *_RELAY, "--frame-ceiling", "4G", "--host", host)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"flodl-proto relay: error: argument --host: {why}"


def test_relay_host_of_255_bytes_and_non_ascii_letters_is_taken() -> None:
    from flodl_proto.commands.relay import host_name

    assert host_name("h" * 255) == "h" * 255
    assert host_name("n\u00f6de-1") == "n\u00f6de-1"
    # the ASCII space (inside or around the name), a combining mark after a letter
    assert host_name("rack 1 node") == "rack 1 node"
    assert host_name(" node ") == " node "
    assert host_name("no\u0301de") == "no\u0301de"
    assert host_name("n\u2801de") == "n\u2801de"  # a braille pattern with a dot shows


# -- conform: --cases matching nothing, --launch of a directory or of nothing ---------------------
@pytest.mark.parametrize("extra", [["--list"], ["--launch", "true"]])
def test_conform_cases_matching_no_id_names_the_patterns(
        extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "conform", "controller", "--cases",
                               "controller.handshake*", "--cases", "x", *extra)
    assert (code, out) == (2, "")
    assert err == ("flodl-proto conform controller: error: argument --cases: no controller case "
                   "id matches 'controller.handshake*' or 'x'; 'flodl-proto conform "
                   "controller --list' without --cases lists the ids\n")


def test_conform_launch_of_a_directory_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # named from its parent as the working directory: a path short enough to be shown whole
    (tmp_path / "a-dir").mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = _run_main(capsys, "conform", "controller", "--launch", "./a-dir",
                               "--cases", "controller.session.one-relay-one-round",
                               "--version", "2", "--jobs", "1")
    assert code == 2
    assert err.splitlines()[-1] == ("flodl-proto conform controller: error: argument --launch: "
                                    "cannot start the target './a-dir': it is a directory, not "
                                    "a program")


@pytest.mark.parametrize(("launch", "what"), [("", "empty"), ("   ", "blank")])
def test_conform_launch_given_empty_says_it_is_empty(launch: str, what: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, "conform", "controller", "--launch", launch)
    assert (code, out) == (2, "")
    assert err == ("flodl-proto conform controller: error: argument --launch: no command (the "
                   f"value is {what})\n")


@pytest.mark.parametrize(("launch", "line"), [
    ('ctl --listen {host}:{port} "--world-size', "'ctl --listen {host}:{port} \"--world-size': No "
     "closing quotation"),
    ("ctl --salt-file {salt_file} \\", "'ctl --salt-file {salt_file} \\\\': No escaped character"),
])
def test_conform_launch_that_is_no_shell_command_line_is_quoted(
        launch: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """shlex's error named no value (``argument --launch: No closing quotation``): the line now
    quotes the command it could not split."""
    code, out, err = _run_main(capsys, "conform", "controller", "--launch", launch)
    assert (code, out) == (2, "")
    assert err == ("flodl-proto conform controller: error: argument --launch: " + line
                   + " (it is split as a shell splits a command line)\n")


def test_conform_launch_left_out_is_still_required(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_main(capsys, "conform", "controller")
    assert code == 2
    assert err == ("flodl-proto conform controller: error: argument --launch: is required, "
                   "unless --list is given\n")


# -- a path with a line break or an escape: still one line ---------------------------------------
@pytest.mark.parametrize("odd", ["\n", "\x1b[31m"])
@pytest.mark.parametrize(("args", "code", "line"), [
    (["demo", "--no-progress", "--salt-file", "{path}"], 2,
     "flodl-proto demo: error: argument --salt-file: {shown}: Not a directory (gone is a file, "
     "not a folder)"),
    (["controller", "--listen", "127.0.0.1:0", "--world-size", "2", "--salt-file", "{path}"], 2,
     "flodl-proto controller: error: argument --salt-file: {shown}: No such file or directory"),
    (["relay", "--controller", "127.0.0.1:9", "--ranks", "0", "--world-size", "1",
      "--salt-file", "{path}"], 2,
     "flodl-proto relay: error: argument --salt-file: {shown}: No such file or directory"),
    (["decode", "{path}"], 2,
     "flodl-proto decode: error: argument FILE: {shown}: No such file or directory"),
    (["docs", "--check", "--out", "{path}"], 1,
     "flodl-proto docs: error: {shown}: missing (spec: ...); run {command}"),
])
def test_a_path_with_a_line_break_or_an_escape_is_quoted_in_one_line(
        args: list[str], code: int, line: str, odd: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The path was printed as given: a line break split the error in two, an escape sequence
    reached the terminal (``--salt-file``, ``decode``'s input, ``docs --out`` and the command
    it names)."""
    monkeypatch.chdir(tmp_path)
    path = f"gone/no{odd}pe"  # in no folder: the demo writes a salt file where none is
    if args[0] == "demo":  # and makes its missing folders: a file where one should be
        Path("gone").write_text("")
    got = _run_main(capsys, *[a.replace("{path}", path) for a in args])
    want = line.format(shown=repr(path), command=repr(f"flodl-proto docs --out '{path}'"))
    assert got[0] == code
    assert got[2].count("\n") == 1 and "\x1b" not in got[2], got[2]
    head, _, tail = want.partition("(spec: ...)")
    assert got[2].startswith(head) and got[2].endswith(tail + "\n"), got[2]


# -- every option value the package checks itself reads as argparse's: argument --X: ... -------
_CTL = ("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX)
_RLY = ("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "2", "--salt",
        SALT_HEX)
_RNK = ("rank", "--relay", "127.0.0.1:1", "--rank", "0", "--world-size", "2", "--salt", SALT_HEX)


@pytest.mark.parametrize(("args", "line"), [
    (("controller", "--listen", "x", "--world-size", "1", "--salt", SALT_HEX),
     "flodl-proto controller: error: argument --listen: 'x': not a HOST:PORT address: no port"),
    (("relay", "--controller", "x", "--ranks", "0", "--world-size", "1", "--salt", SALT_HEX),
     "flodl-proto relay: error: argument --controller: 'x': not a HOST:PORT address: no port"),
    (("relay", "--controller", "127.0.0.1:65532", "--ranks", "0", "--world-size", "1", "--salt",
      SALT_HEX),
     "flodl-proto relay: error: argument --controller: '127.0.0.1:65532': port 65536 is not in "
     "0..65535 (the default --listen-port: the controller's port + 4); give --listen-port"),
    (("rank", "--relay", "x", "--rank", "0", "--world-size", "1", "--salt", SALT_HEX),
     "flodl-proto rank: error: argument --relay: 'x': not a HOST:PORT address: no port"),
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "0", "--salt", SALT_HEX),
     "flodl-proto controller: error: argument --world-size: must be in 1..4294967295 (the "
     "handshake's u32 field), got 0"),
    (("relay", "--controller", "127.0.0.1:1", "--ranks", "0,2", "--world-size", "2", "--salt",
      SALT_HEX),
     "flodl-proto relay: error: argument --ranks: '0,2': every rank must be < --world-size 2, got "
     "rank 2"),
    ((*_RLY[:3], "--ranks", "x", *_RLY[5:]),
     "flodl-proto relay: error: argument --ranks: expected a list of ranks like 0,1 or 0-3, got "
     "'x'"),
    ((*_RNK[:3], "--rank", "2", *_RNK[5:]),
     "flodl-proto rank: error: argument --rank: must be in 0..1 (below --world-size), got 2"),
    ((*_RNK, "--rounds", "0"),
     "flodl-proto rank: error: argument --rounds: must be in 1..1000000, got 0"),
    ((*_RNK, "--interval", "-1"),
     "flodl-proto rank: error: argument --interval: must be a finite number >= 0, got '-1'"),
    ((*_RNK, "--payload-mib", "-1"),
     "flodl-proto rank: error: argument --payload-mib: must be a finite number >= 0, got '-1'"),
    ((*_RNK, "--payload-mib", "1", "--frame-ceiling", "1000"),
     "flodl-proto rank: error: argument --payload-mib: '1' makes a 1049817-byte frame, above the "
     "frame ceiling 1000 (--frame-ceiling)"),
    ((*_CTL, "--outer", "foo"),
     "flodl-proto controller: error: argument --outer: 'foo': expected avg, slow-momentum:LR,MU or "
     "nesterov:LR,MU"),
    (("controller", "--listen", "127.0.0.1:0", "--world-size", "1", "--salt-file", "nonexist"),
     "flodl-proto controller: error: argument --salt-file: 'nonexist': No such file or directory"),
    (("conform", "controller", "--list", "--jobs", "0"),
     "flodl-proto conform controller: error: argument --jobs: must be in 1..1024, got 0"),
    (("conform", "controller", "--list", "--timeout-scale", "0"),
     "flodl-proto conform controller: error: argument --timeout-scale: '0' is out of range; "
     "expected a finite scale factor from 0.1 to 1000"),
    (("demo", "--no-progress", "--hosts", "5"),
     "flodl-proto demo: error: argument --hosts: must be in 1..4 (at most --world-size), got 5"),
    (("demo", "--no-progress", "--seed", "-1"),
     f"flodl-proto demo: error: argument --seed: must be in 0..{2**128 - 1} (a 128-bit seed), got "
     f"-1"),
    (("demo", "--no-progress", "--kill-rank", "x"),
     "flodl-proto demo: error: argument --kill-rank: expected R@ROUND (two whole numbers), got "
     "'x'"),
    (("demo", "--no-progress", "--kill-rank", "9@3"),
     "flodl-proto demo: error: argument --kill-rank: '9@3': R must be in 0..3 (a rank of "
     "--world-size 4) and ROUND in 1..40 (--rounds), got rank 9"),
], ids=["listen", "controller", "controller-default-listen-port", "relay", "world-size",
        "ranks-vs-world-size", "ranks", "rank", "rounds", "interval", "payload-mib",
        "payload-mib-over-frame-ceiling", "outer",
        "salt-file", "jobs", "timeout-scale", "hosts", "seed", "kill-rank", "kill-rank-range"])
def test_an_option_value_refused_reads_as_argparse_words_it(
        args: tuple[str, ...], line: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A value the command checks itself is refused in argparse's words for an option
    (``argument --X: ...``), with exit 2, as one line: the option whose value is wrong, then the
    value as given (quoted) and the reason."""
    monkeypatch.chdir(tmp_path)  # salt-file: a path that is not there
    assert _run_main(capsys, *args) == (2, "", line + "\n")

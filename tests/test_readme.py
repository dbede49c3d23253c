"""The README's library tour runs as written and passes ``mypy --strict``; its cluster by hand
waits for its controller as long as the demo waits for one."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, closed_port


def _tour() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Library tour\n+```python\n(.*?)^```$", text, re.S | re.M)
    assert m is not None, "README.md has no python block under '## Library tour'"
    return m.group(1)


def test_tour_shows_codec_decode_and_pcap() -> None:
    tour = _tour()
    for needle in ("decode_round_frame(", "decode_round_frame_or_eos(", "decode_mux_record(",
                   "from flodl_proto.decode import", "from flodl_proto.pcap import"):
        assert needle in tour


def test_tour_shows_the_bundled_vectors_and_a_stream_fed_in_pieces() -> None:
    """A library user finds the golden vectors inside the installed package (the README named
    only the repository's folder) and an incremental decoder fed bytes in pieces (the README
    only named them)."""
    tour = _tour()
    assert 'files("flodl_proto") / "_vectors" / "v2"' in tour
    assert "mux = MuxStream(" in tour and "mux.feed(" in tour and "mux.feed_eof()" in tour
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ('in an installed package, `importlib.resources.files("flodl_proto") / "_vectors"`'
            in text)


def test_tour_pairs_the_len_framed_encoder_and_decoder_through_a_join() -> None:
    """``encode_len_framed`` returns a buffer list (for ``socket.sendmsg``), not bytes: the tour
    shows the ``b"".join`` that makes its output what ``decode_len_framed`` takes (a reader
    pairing them as the README listed them passed a list to the decoder)."""
    tour = _tour()
    assert re.search(r"^\w+ = b\"\"\.join\(encode_len_framed\(", tour, re.M), tour
    assert "decode_len_framed(" in tour


def test_tour_runs(tmp_path: Path) -> None:
    from .test_decode import _capture, _loop_down, _mux_up

    script = tmp_path / "tour.py"
    script.write_text(_tour(), encoding="utf-8")
    # the tour's capture file: one mux connection to port 5555 (its tags under another salt),
    # and a GET /status, which the controller's port mux serves on the same port
    (tmp_path / "run.pcap").write_bytes(_capture(_mux_up(2).data, _loop_down(2).data, 5555,
                                                 noise=b"GET /status HTTP/1.1\r\n\r\n"))
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "[ 1.   -2.5   0.    3.25] 55"
    assert lines[1] == "frame.header_read_failed"
    assert lines[2].startswith("CONTROL Hello(host='h0', ranks=(0, 1)")
    assert lines[3] == "True"  # the frame is the bundled vector's bytes
    assert lines[4] == "Hello(host='h0', ranks=(0, 1), model_sigs=())"  # fed 3 bytes at a time
    assert lines[-4] == "0"
    assert lines[-3:] == ["10.0.0.2:40001 -> 10.0.0.1:5555 mux 3",  # tags of another salt
                          "10.0.0.1:5555 -> 10.0.0.2:40001 loopback 3",
                          "10.0.0.9:5555 -> 10.0.0.1:80 skipped: cannot tell the leg from "
                          "the first bytes (474554202f737461): they are HTTP (a GET /status "
                          "to the controller's port mux, or its reply), not a flodl leg"]


def test_tour_takes_a_hole_in_the_capture_for_no_clean_end(tmp_path: Path) -> None:
    """A stream the capture lost bytes of (``TcpStream.gap``) that decodes to a record boundary
    where the hole starts is no clean end: the tour says 4, as ``decode --pcap`` does, where it
    printed 0."""
    from flodl_proto.codec import Hello, MuxRecord, RankExit, encode_channel_magic
    from flodl_proto.codec import encode_mux_record_bytes as rec

    from .test_decode import _capture, _loop_down

    salt = bytes(16)  # the tour's
    # the capture drops the relay's segment at byte 50, where its Hello ends (4 + 25 + 21)
    up = (encode_channel_magic("data") + rec(MuxRecord.control_msg(Hello("a" * 17, [0])), salt)
          + rec(MuxRecord.control_msg(RankExit(0)), salt) * 4)
    assert len(up) > 57 and up[4:8] == b"\xd0\x17\x0d\xf1" and up[50:54] == up[4:8]
    script = tmp_path / "tour.py"
    script.write_text(_tour(), encoding="utf-8")
    # (the capture loses the segment of the other direction sent with it too: mid-record, 4)
    (tmp_path / "run.pcap").write_bytes(_capture(up, _loop_down(2, salt).data, 5555, gap=True,
                                                 noise=b"GET /status HTTP/1.1\r\n\r\n"))
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-3:-1] == ["10.0.0.2:40001 -> 10.0.0.1:5555 mux 4",
                                              "10.0.0.1:5555 -> 10.0.0.2:40001 loopback 4"]


@pytest.mark.timeout(300)
def test_tour_passes_mypy_strict(tmp_path: Path) -> None:
    script = tmp_path / "tour.py"
    script.write_text(_tour(), encoding="utf-8")
    cache = tmp_path / "mypy-cache"
    # a copy of the checkout's cache (``mypy --strict flodl_proto`` writes it, as CI does before
    # the tests): the package and numpy are not analysed afresh, and mypy checks again whatever
    # changed since; without one (or when it cannot be copied whole) the run starts cold
    with contextlib.suppress(OSError, shutil.Error):
        if (ROOT / ".mypy_cache").is_dir():
            shutil.copytree(ROOT / ".mypy_cache", cache)
    res = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache),
         "--config-file", str(ROOT / "pyproject.toml"), str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found in 1 source file" in res.stdout


def _long_options(parser: object, name: str) -> dict[str, list[str]]:
    """Every command's long options (``--help`` and ``--log-level``, which every command takes,
    aside; the program's own ``--version`` too), by command name."""
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                found.update(_long_options(subparser, f"{name} {sub}"))
        else:
            found.setdefault(name, []).extend(
                o for o in action.option_strings
                if o.startswith("--") and o not in ("--help", "--log-level")
                and not (name == "flodl-proto" and o == "--version"))
    return found


def _rows_by_command(rows: list[str]) -> dict[str, str]:
    """Each command's row of the table: the words after ``flodl-proto`` up to the first option
    or placeholder name the command (``controller\\|relay`` names two); a command the row's
    text names as ```conform docs [...]``` is that row's too."""
    by: dict[str, str] = {}
    for row in rows:
        names: list[list[str]] = [[]]
        for word in row.split("`")[1].split()[1:]:
            if word.startswith(("[", "-")) or not word[:1].islower():
                break
            names = [[*n, alt] for n in names for alt in word.split("\\|")]
        for n in names:
            by[" ".join(["flodl-proto", *n])] = row
        for m in re.finditer(r"`(conform docs|vectors \w+) ", row):
            by.setdefault(f"flodl-proto {m[1]}", row)
    return by


def test_command_table_lists_every_option() -> None:
    """The README's command table names every long option of its command, in that command's own
    row, as a whole word (the table lacked ``demo --seed``, ``decode --format``, ``relay
    --rank-timeout`` and ten others; ``--salt`` passed as part of ``--salt-file``)."""
    from flodl_proto.cli import build_parser

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = _rows_by_command([line for line in text.splitlines()
                             if line.startswith("| `flodl-proto ")])
    missing = {}
    for command, opts in _long_options(build_parser(), "flodl-proto").items():
        if command == "flodl-proto" or command in ("flodl-proto conform", "flodl-proto vectors"):
            continue  # the program and the groups: no options of their own beyond the above
        assert command in rows, f"no README row for {command}"
        lacking = [o for o in opts
                   if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", rows[command])]
        if lacking:
            missing[command] = lacking
    assert missing == {}


def _field_kinds() -> dict[str, set[str]]:
    """Every field name a vector handler reads (a case's own and those inside its objects) ->
    the kinds it is checked as."""
    import flodl_proto.interop.vectors  # noqa: F401  (registers the handlers)
    from flodl_proto.interop.registry import FIELDS, OBJECTS, VARIANTS

    tables = [t for per_op in FIELDS.values() for t in per_op.values()]
    tables += list(OBJECTS.values())
    tables += [t for _, further in VARIANTS.values() for t in further.values()]
    kinds: dict[str, set[str]] = {}
    for table in tables:
        for name, kind in table.items():
            while kind.startswith(("array of ", "null or ")):
                kind = kind.split(" ", 2)[2]
            kinds.setdefault(name.rstrip("?"), set()).add(kind)
    return kinds


def _spelling(text: str, lead: str) -> tuple[list[str], list[str], list[str]]:
    """The clause of the README's vector-format paragraph that starts with ``lead`` (``a
    magic``): the field names in its parenthesis, the JSON strings it gives as written right
    and the spellings it gives as wrong (``(`"0xf10d17e1"`; not `f10d17e1` or `0x`)``)."""
    flat = " ".join(text.split())
    m = re.search(rf"{re.escape(lead)} \(([^)]*)\) (?:is|are) ([^;]*?)\(([^;()]*); not ([^)]*)\)",
                  flat)
    assert m is not None, f"README.md has no clause '{lead} (...) is ...'"
    names = [n for n in re.findall(r"`([\w.]+)`", m[1]) if "." not in n]
    right = [json.loads(s) for s in re.findall(r"`(\"[^`]*\")`", m[3])]
    wrong = re.findall(r"`([^`]*)`", m[4])
    return names, right, wrong


def test_vector_spellings_are_those_the_check_accepts() -> None:
    """The README's paragraph on how vectors write bytes, bit patterns and magics names each
    field with the kind ``vectors check`` checks it as, and its examples are accepted or
    refused as it says (it listed ``magic`` with the bit patterns of exactly 16, 8 or 4
    digits, while the check takes a magic of any number of digits)."""
    from flodl_proto.interop.registry import kind_problem

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    kinds = _field_kinds()
    for lead, allowed, kind in (("Bytes", {"hex"}, "hex"),
                                ("a bit pattern", {"bits16", "bits32", "bits64"}, None),
                                ("a magic", {"bits"}, "bits")):
        names, right, wrong = _spelling(text, lead)
        assert names, lead
        for name in names:
            assert kinds.get(name, set()) <= allowed and kinds.get(name), (lead, name,
                                                                           kinds.get(name))
        if kind is None:
            continue
        for value in right:
            assert kind_problem({"f": value}, "f", kind) is None, (lead, value)
        for value in wrong:
            assert kind_problem({"f": value}, "f", kind) is not None, (lead, value)


def test_hand_run_cluster_waits_for_its_controller_as_long_as_the_demo() -> None:
    """The hand-run cluster's ``curl`` retries a refused connection for as long as the demo
    gives a member to start (60 s; a loaded machine took over 30 s to import the interpreter
    and NumPy): ten retries a second apart gave up first."""
    from flodl_proto.commands.demo import _START

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^(curl .*?(?:\\\n.*?)*)$", text, re.M)
    assert m is not None, "README.md has no curl line"
    words = shlex.split(m.group(1).replace("\\\n", " "))
    opts = dict(zip(words, [*words[1:], ""], strict=True))
    assert "--retry-connrefused" in words or "--retry-all-errors" in words, words
    budget = int(opts["--retry"]) * float(opts.get("--retry-delay", "1"))
    budget = min(budget, float(opts.get("--retry-max-time", "inf")))
    assert budget >= _START, words
    assert words[-1] == "http://127.0.0.1:7000/status"


def _shown_line(templates: list[str], line: str) -> str:
    """The one template of ``templates`` (code spans of a README row) that ``line`` fits: its
    upper-case words (``K``, ``WHY``) stand for any text, the rest is as written."""
    def fits(template: str) -> bool:
        parts = re.split(r"\b[A-Z]+\b", template)
        return re.fullmatch(r".+?".join(re.escape(p) for p in parts), line) is not None
    (shown,) = [t for t in templates if fits(t)] or [f"no template for {line!r}"]
    return shown


def test_command_table_shows_the_lines_the_cluster_commands_print(tmp_path: Path) -> None:
    """The controller's row shows the lines it prints as relays join and rounds end and its
    last line, and its warning for a ``--checkpoint-dir`` of an earlier run, the relay's its two
    last lines, as the commands print them (the table named only their first line,
    ``listening on ...``)."""
    from flodl_proto.commands.controller import checkpoints_overwritten, notice_line
    from flodl_proto.fsm.events import RelayJoined
    from flodl_proto.runner.reports import RoundReport

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = _rows_by_command([line for line in text.splitlines()
                             if line.startswith("| `flodl-proto ")])
    shown = {c: re.findall(r"`([^`]*)`", rows[f"flodl-proto {c}"]) for c in ("controller",
                                                                           "relay")}
    joined = notice_line(RelayJoined(conn=0, relay=0, host="h0", ranks=(0, 1)))
    rounds = [notice_line(RoundReport(round=k, kind=kind, weight=w, nbytes=1252, relays=1,
                                      ms=0.335, at=0.0))
              for k, kind, w in ((1, "model", 3.0), (2, "control", 2.5))]
    for window in (0, 1):
        (tmp_path / f"consensus-{window:06d}.npz").write_bytes(b"")
    warning = f"flodl-proto controller: warning: {checkpoints_overwritten(tmp_path, 'ckpt')}"
    lines = [joined, *rounds, "controller finished: clean (stop: signal)", warning]
    assert [_shown_line(shown["controller"], str(line)) for line in lines] == [
        "relay R joined: host 'H' ranks [0, 1]", "round K: kind KIND weight W bytes B ms T",
        "round K: kind KIND weight W bytes B ms T", "controller finished: clean (WHY)",
        "flodl-proto controller: warning: --checkpoint-dir 'DIR': already holds N checkpoint "
        "files (consensus-<window>.npz), which this run overwrites as it writes the same "
        "windows"]

    relay = subprocess.Popen([sys.executable, "-m", "flodl_proto", "relay", "--controller",
                              f"127.0.0.1:{closed_port()}", "--ranks", "0", "--world-size", "1",
                              "--salt", "00" * 16, "--listen-port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None
        assert relay.stdout.readline().startswith("listening on 127.0.0.1:")
        relay.terminate()
        out, err = relay.communicate(timeout=60)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    assert (relay.returncode, err) == (0, "")
    assert [_shown_line(shown["relay"], line) for line in out.splitlines()] == [
        "relay stats from_ranks=B to_ranks=B upstream_out=B upstream_in=B host_frames=N "
        "broadcasts=N", "relay finished: clean (WHY)"]


def test_controller_row_says_it_waits_for_its_relays_and_logs_what_it_waits_for(
        caplog: pytest.LogCaptureFixture) -> None:
    """A controller whose relay never dials (one that failed on a rank's handshake) waits for it
    without a deadline, as upstream does, and logs the ranks still unannounced every 10 s: the
    README said so of the relay's wait for its ranks only, and a user took the controller for
    hung. Its row shows the warning as the controller logs it."""
    import logging
    from types import SimpleNamespace

    from flodl_proto.runner import controller

    core = SimpleNamespace(uncovered_count=lambda: 2, world_size=2,
                           uncovered_ranks=lambda n: [0, 1][:n])
    with caplog.at_level(logging.WARNING, logger="flodl_proto.runner.controller"):
        controller.ReferenceController._note_waiting(SimpleNamespace(_core=core))  # type: ignore[arg-type]
    (record,) = caplog.records
    logged = f"{record.levelname} {record.name}: {record.getMessage()}"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    row = _rows_by_command([line for line in text.splitlines()
                            if line.startswith("| `flodl-proto ")])["flodl-proto controller"]
    assert logged == ("WARNING flodl_proto.runner.controller: controller: still waiting for "
                      "relays to announce 2 of 2 rank(s): 0, 1")
    assert f"`... {logged}`" in row
    assert (controller._WAITING_NOTE_PERIOD, controller._WAITING_SHOWN) == (10.0, 16)
    assert "without a deadline" in row and "every 10 s" in row and "the lowest 16" in row


def _parsers(parser: object, name: str) -> dict[str, object]:
    """Every command's parser, by command name (``flodl-proto decode``)."""
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    found: dict[str, object] = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                found.update(_parsers(subparser, f"{name} {sub}"))
    return found


def test_command_table_writes_an_options_default_choice_first() -> None:
    """Where the command table writes an option's choices (``--leg auto\\|mux\\|...``,
    ``--protocol-version 2\\|3``) the first is the default, as a reader takes it: ``decode
    [--format table\\|json]`` wrote the table first, and ``decode`` printed JSON lines."""
    import argparse

    from flodl_proto.cli import build_parser

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = _rows_by_command([line for line in text.splitlines()
                             if line.startswith("| `flodl-proto ")])
    checked, wrong = 0, {}
    for command, parser in _parsers(build_parser(), "flodl-proto").items():
        assert isinstance(parser, argparse.ArgumentParser)
        if command not in rows:
            continue
        usage = rows[command].split("`")[1]
        for action in parser._actions:
            if not action.choices or action.default is None or not action.option_strings:
                continue
            for opt in action.option_strings:
                m = re.search(rf"(?<![\w-]){re.escape(opt)} ([\w.-]+(?:\\\|[\w.-]+)+)", usage)
                if m is None:
                    continue
                checked += 1
                first = m[1].split("\\|")[0]
                if first != str(action.default):
                    wrong[f"{command} {opt}"] = (first, str(action.default))
    assert checked >= 6 and wrong == {}


def test_readme_gives_the_demo_s_world_size_and_hosts_ranges() -> None:
    """The demo refuses a ``--world-size`` above 64 (``must be in 1..64 for the demo``) and
    more ``--hosts`` than ranks, which its ``--help`` said and the README's row, which gave the
    ranges of ``--rounds`` and ``--seed``, did not."""
    from flodl_proto.commands.demo import DEMO_WORLD_MAX

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (f"`--world-size` is 1 to {DEMO_WORLD_MAX} (a process per rank on this machine), "
            "`--hosts` 1 to `--world-size`, `--rounds` 1 to 1000000") in text

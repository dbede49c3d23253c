"""docs/conformance.md tells a target's author what the kit gives it and what the case tables
mean: every ``--launch`` placeholder of each role with the form of its value (as a launched
target receives it), the time a target has to listen, and what the ``error`` column is."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from flodl_proto.conform import KitSettings, load_catalogue, select_cases
from flodl_proto.conform.doc import render_conformance_doc
from flodl_proto.conform.player import play_case
from flodl_proto.conform.target import LaunchedTarget

CATALOGUE = load_catalogue()
DOC = render_conformance_doc(CATALOGUE)
#: what a placeholder's value looks like, by the doc's own words
FORMS = {
    "host": r"127\.0\.0\.1",
    "port": r"[1-9][0-9]*",
    "controller": r"127\.0\.0\.1:[1-9][0-9]*",
    "ranks": r"[0-9]+(,[0-9]+)*",
    "listen_port": r"[1-9][0-9]*",
    "world_size": r"[1-9][0-9]*",
    "version": r"[23]",
    "salt": r"[0-9a-f]{32}",
}


def _placeholder_rows() -> dict[str, tuple[str, str]]:
    rows = re.findall(r"^\| `\{(\w+)\}` \| (controller|relay|both) \| (.+) \|$", DOC, re.M)
    return {name: (role, value) for name, role, value in rows}


# the values a launched target receives: it writes them, and the salt file, then says it
# listens on a port nothing listens on (the case then ends at once: the target did not start)
_RECORDER = """\
import json, sys
args = dict(a.split("=", 1) for a in sys.argv[2:])
args["salt_file_text"] = open(args["salt_file"]).read()
open(sys.argv[1], "w").write(json.dumps(args))
print("listening on 127.0.0.1:1", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("role,case_id", [("controller", "controller.round.f32-weighted"),
                                          ("relay", "relay.fold.two-ranks")])
def test_every_placeholder_is_documented_with_the_form_of_its_value(
        role: str, case_id: str, tmp_path: Path) -> None:
    documented = {n for n, (r, _) in _placeholder_rows().items() if r in (role, "both")}
    case = select_cases(CATALOGUE, role=role, versions=[3], patterns=[case_id])[0][0][0]
    out = tmp_path / "args.json"
    script = tmp_path / "recorder.py"
    script.write_text(_RECORDER)
    args = " ".join(f"{n}={{{n}}}" for n in sorted(documented))
    target = LaunchedTarget(f"{shlex.quote(sys.executable)} {script} {out} {args}")
    result = play_case(case, 3, lambda: target, KitSettings(timeout_scale=0.1))
    assert result.started is False  # it only recorded its arguments
    got = json.loads(out.read_text())
    for name in documented - {"salt_file"}:
        assert re.fullmatch(FORMS[name], got[name]), (name, got[name])
    assert got["salt_file_text"] == got["salt"] + "\n"
    assert got["world_size"] == str(case.world_size)
    if role == "relay":
        assert got["ranks"] == ",".join(str(r) for r in case.ranks) == "0,1"


def test_the_placeholder_table_names_exactly_the_placeholders_of_each_role() -> None:
    rows = _placeholder_rows()
    assert {n for n, (r, _) in rows.items() if r in ("controller", "both")} == {
        "host", "port", "salt", "salt_file", "world_size", "version"}
    assert {n for n, (r, _) in rows.items() if r in ("relay", "both")} == {
        "controller", "ranks", "listen_port", "salt", "salt_file", "world_size", "version"}
    assert rows["salt_file"][1] == "the path of a file holding those 32 digits and a newline"
    assert rows["ranks"][1] == "the relay's ranks, ascending, comma-separated, no spaces: `0,1`"


def test_the_doc_says_how_long_a_target_has_to_listen() -> None:
    assert KitSettings().ready_timeout == 20.0
    assert ("A target has 20 s to listen, whatever `--timeout-scale`\n(`--start-timeout SECONDS` "
            "sets it: a finite number above 0, at most 864000)") in DOC


def test_the_doc_s_start_up_wait_is_generated_from_the_kit_s_default_and_the_spec(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up wait's default (``READY_TIMEOUT``) and its bound (the spec's
    ``TIMEOUT_OPTION_MAXIMUM``) are read as the doc is rendered, where the doc wrote 20 and
    864000 by hand: a default changed in ``conform/_defaults.py`` alone left the doc stale."""
    from flodl_proto.conform import _defaults
    from flodl_proto.spec import SPEC

    monkeypatch.setattr(_defaults, "READY_TIMEOUT", 7.5)
    monkeypatch.setitem(SPEC.raw["timeouts"]["TIMEOUT_OPTION_MAXIMUM"], "seconds", 1234.0)
    doc = render_conformance_doc(CATALOGUE)
    assert ("A target has 7.5 s to listen, whatever `--timeout-scale`\n(`--start-timeout SECONDS` "
            "sets it: a finite number above 0, at most 1234); one\nthat has not by then fails "
            "its case (`target did not start: the target did not listen on port\nN within "
            "7.5s`).") in doc
    assert "20" not in doc.split("A target has", 1)[1].split("\n\n", 1)[0]


def test_the_doc_s_salt_length_is_generated_from_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """The salt's length the doc states, in bytes and in hex digits (the placeholder table and
    the salt file of a flodl build's target), is the spec's ``SESSION_SALT_BYTES`` read as the
    doc is rendered, where the doc wrote 16 and 32 by hand."""
    from flodl_proto.spec import SPEC

    assert SPEC.const("SESSION_SALT_BYTES") == 16
    words = ("| `{salt}` | both | the {n}-byte session salt as {hex} lowercase hex digits |\n"
             "| `{salt_file}` | both | the path of a file holding those {hex} digits and a "
             "newline |\n", "read the salt from\n`{salt_file}` ({hex} hex digits), run")
    for w in words:
        assert DOC.count(w.format(n=16, hex=32, salt="{salt}", salt_file="{salt_file}")) == 1
    monkeypatch.setitem(SPEC.constants, "SESSION_SALT_BYTES", 24)
    doc = render_conformance_doc(CATALOGUE)
    for w in words:
        assert doc.count(w.format(n=24, hex=48, salt="{salt}", salt_file="{salt_file}")) == 1
    intro = doc.split("## Reading the case tables", 1)[0]
    assert "16-byte" not in intro and "32 " not in intro


def test_the_doc_s_stop_and_expectation_waits_are_generated_from_the_kit_s_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits of the kit the doc states (SIGTERM to SIGKILL, a closing target's grace, the
    output read after an exit, an expectation's default wait and its floor, with the two
    examples of it) are read from ``conform/_defaults.py`` as the doc is rendered, where the
    doc wrote 5 s, a second, half a second and 5 s x scale, at least 2 s by hand; the kit's
    settings take the same constants."""
    from flodl_proto.conform import _defaults

    for name, value in (("STOP_BOUND", 9.0), ("EXIT_GRACE", 1.5), ("OUTPUT_DRAIN", 0.25),
                        ("DEFAULT_WITHIN", 6.0), ("DEFAULT_WITHIN_FLOOR", 3.0)):
        monkeypatch.setattr(_defaults, name, value)
    doc = render_conformance_doc(CATALOGUE)
    for words in ("stops the target (SIGTERM, then\nSIGKILL after 9 s).",
                  "first gets up to 1.5 s to exit by itself:",
                  "says, or by default 6 s x `--timeout-scale`, at least 3 s (6 s at scale 1, 3 s "
                  "at 0.1): a\n",
                  "what is left of its output for at most 0.25 s: a process"):
        assert words in doc
    assert [DOC.count(w) for w in ("SIGKILL after 5 s).", "up to a second to exit",
                                   "5 s x `--timeout-scale`, at least 2 s (5 s at scale 1, 2 s "
                                   "at 0.1)", "for at most half a second:")] == [1, 1, 1, 1]
    from flodl_proto.conform.player import default_within

    assert (default_within(1.0), default_within(0.1)) == (6.0, 3.0)  # the kit's own wait
    monkeypatch.undo()
    assert (KitSettings().stop_bound, KitSettings().exit_grace) == (
        _defaults.STOP_BOUND, _defaults.EXIT_GRACE) == (5.0, 1.0)


def test_the_doc_says_the_error_column_is_not_checked_against_the_targets_message() -> None:
    assert "## Reading the case tables" in DOC
    assert ("the kit sees only the target's bytes, its closes and its exit\nstatus, so a target "
            "passes such a case by what it does") in DOC

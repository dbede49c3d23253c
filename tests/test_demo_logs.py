"""The demo's copy of its members' log lines to its stderr (``--log-level INFO``)."""

from __future__ import annotations

import pytest

from flodl_proto.commands import _demo_logs


def test_a_members_line_reaches_the_terminal_with_its_controls_escaped(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A member's log line was written to the terminal as it was: its colour codes, a bell, a
    window-title sequence and a direction override played there. They are shown as ``#xNN``,
    as ``conform`` shows a target's output."""
    _demo_logs.show("rank1", "\x1b]0;title\x07\x1b[31mred\x1b[0m \u202eexe.txt\u2066x\u2069"
                    "\u200e\u200f\x9bend\r")
    err = capsys.readouterr().err
    assert err == ("[rank1] #x1B]0;title#x07#x1B[31mred#x1B[0m #x202Eexe.txt#x2066x#x2069"
                   "#x200E#x200F#x9Bend#x0D\n")


def test_a_members_round_numbers_are_labelled_as_the_protocols(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The controller's live lines counted protocol rounds (``round 5`` for demo round 3's
    count-gather) beside a progress bar and a summary that count demo rounds, with nothing to
    tell them apart: the copy labels them ``protocol round N``."""
    _demo_logs.show("controller", "2026-01-01 12:00:00,000 INFO flodl_proto.runner.controller: "
                    "controller: round 5 control weight 0, 80 bytes to 2 relay(s) in 0.22 ms")
    assert capsys.readouterr().err == (
        "[controller] 2026-01-01 12:00:00,000 INFO flodl_proto.runner.controller: controller: "
        "protocol round 5 control weight 0, 80 bytes to 2 relay(s) in 0.22 ms\n")
    assert _demo_logs.protocol_rounds(
        "round 1: x (round 12) round 3's consensus; rounds 4 round 5x pre-round 6 "
        "protocol round 7 around 8") == (
        "protocol round 1: x (protocol round 12) protocol round 3's consensus; rounds 4 round 5x "
        "pre-round 6 protocol round 7 around 8")

"""The conformance kit against hostile targets: a target that floods a connection, one that
leaves a process holding its output pipes, one that prints very long lines, a blank --launch.

Each target is a few lines of Python written here, launched by the kit as a real process."""

from __future__ import annotations

import dataclasses
import shlex
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.conform import Case, KitSettings, load_catalogue
from flodl_proto.conform.player import CaseResult, play_case
from flodl_proto.conform.target import LaunchedTarget

CATALOGUE = load_catalogue()
SETTINGS = KitSettings(timeout_scale=0.1, ready_timeout=10.0, stop_bound=2.0)

#: a controller-role target: listens on {port}, prints its line, serves each connection with
#: ``serve(c)`` (defined by the test), and otherwise sleeps
_TARGET = """\
import os, socket, struct, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port)); s.listen()
print("listening on %s:%d" % (host, port), flush=True)
def serve(c):
{body}
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def _launch(body: str, tmp_path: Path) -> str:
    """A ``--launch`` command running ``_TARGET`` with ``body`` as its ``serve(c)``."""
    script = tmp_path / "target.py"
    script.write_text(_TARGET.replace("{body}", textwrap.indent(body, "    ")))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{host}} {{port}}"


def _case(steps: Sequence[Mapping[str, Any]]) -> Case:
    base = next(c for c in CATALOGUE if c.id == "controller.round.zero-mass")
    return dataclasses.replace(base, id="controller.test.hostile", versions=(3,),
                               steps={3: tuple(steps)})


def _play(steps: Sequence[Mapping[str, Any]], body: str, tmp_path: Path) -> CaseResult:
    launch = _launch(body, tmp_path)
    return play_case(_case(steps), 3, lambda: LaunchedTarget(launch), SETTINGS)


@pytest.fixture()
def peak_buffer(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The largest number of bytes a kit connection held at once, over the test."""
    from flodl_proto.conform import player

    peak = [0]
    fill = player._Conn.fill

    def watched(self: Any, *args: Any, **kwargs: Any) -> bool:
        got = fill(self, *args, **kwargs)
        peak[0] = max(peak[0], len(self.buf))
        return got

    monkeypatch.setattr(player._Conn, "fill", watched)
    return peak


# -- a flooding target: the kit keeps what a case can use, counts the rest -------------------------

#: 16 MiB sent on every connection, then the connection stays open
_FLOOD = """\
block = bytes.fromhex("d0170df1") + b"\\xff" * 65532
for _ in range(256):
    c.sendall(block)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_flood_before_an_expected_close_is_counted_not_kept(peak_buffer: list[int],
                                                            tmp_path: Path) -> None:
    r = _play([{"connect": 0}, {"expect_close": {"conn": 0, "within": 3}}], _FLOOD, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message == ("connection 0: expected the target to close it; still open after 3s "
                         "(16777216 bytes received)")
    assert r.observed.startswith("d0170df1ffff") and r.observed.endswith("(16777216 B)")
    assert 0 < peak_buffer[0] <= 1 << 17  # a bounded prefix, not the 16 MiB


@pytest.mark.timeout(60)
def test_a_hello_header_announcing_a_huge_payload_is_refused_unread(
        peak_buffer: list[int], tmp_path: Path) -> None:
    from flodl_proto.codec.mux import _header_bytes

    head = _header_bytes(0, 0, (1 << 30) - 1, bytes(16)).hex()
    body = f'c.sendall(bytes.fromhex("{head}"))\n' + _FLOOD
    r = _play([{"connect": 0}, {"expect_hello": {"conn": 0, "ranks": [0]}}], body, tmp_path)
    assert not r.passed and r.step == 1
    assert r.message.startswith("connection 0: not a valid Hello record: ")
    assert str((1 << 30) - 1) in r.message
    assert peak_buffer[0] <= 1 << 17


def test_running_out_of_memory_in_a_case_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.conform import player
    from flodl_proto.conform.inprocess import controller_target

    def no_memory(self: Any, i: int, s: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(player._Player, "step", no_memory)
    r = play_case(_case([{"connect": 0}]), 3, controller_target(), SETTINGS)
    assert (r.passed, r.started, r.step) == (False, True, 0)
    assert r.message == "the kit ran out of memory playing this step"
    assert r.exit is not None

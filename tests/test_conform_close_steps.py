"""A case's ``close`` step is a close, not a reset: the kit has read, on that connection, every
byte the target sends it before the close, so a target sees the end of stream whatever the
timing.

A socket closed with unread bytes in its receive buffer sends a TCP reset instead of a FIN.
A controller that takes a reset for a read error (as a Rust reader's ``ConnectionReset`` is)
then fails a case that checks a clean end, or passes it, depending on whether its last write
arrived before the kit's close: the verdict of such a case is a race.
"""

from __future__ import annotations

import select
import socket
from typing import Any

import pytest

from flodl_proto.conform import KitSettings, load_catalogue, run_cases
from flodl_proto.conform import player as player_mod
from flodl_proto.conform.inprocess import controller_target, relay_target
from flodl_proto.conform.report import case_line

CATALOGUE = load_catalogue()
SETTINGS = KitSettings(timeout_scale=0.1)
#: how long a close step waits for bytes still on their way before it closes
SETTLE = 0.5


def _closing_runs(role: str) -> list[tuple[Any, int]]:
    return [(c, v) for c in CATALOGUE if c.role == role and not c.needs
            for v in c.versions if any("close" in s for s in c.steps[v])]


def test_the_catalogue_has_close_steps_of_both_roles() -> None:
    assert {c.id for c, _ in _closing_runs("controller")} >= {
        "controller.lifecycle.eof-with-alive-ranks", "controller.session.eof-after-hello"}
    assert {c.id for c, _ in _closing_runs("relay")} >= {
        "relay.fold.rank-exit", "relay.lifecycle.controller-eof"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["controller", "relay"])
def test_no_close_step_leaves_bytes_unread(role: str, monkeypatch: pytest.MonkeyPatch) -> None:
    unread: list[str] = []
    step = player_mod._Player.step

    def checked_step(self: Any, i: int, s: Any) -> None:
        if "close" in s:
            name, c = self.conn(s["close"])
            sock = c.sock
            if sock is not None and select.select([sock], [], [], SETTLE)[0]:
                try:
                    pending = sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except OSError:
                    pending = b""
                if pending or c.buf:
                    unread.append(f"{self.case.id} v{self.version} step {i}: connection "
                                  f"{name} closed with {len(pending) + len(c.buf)} bytes unread")
        step(self, i, s)

    monkeypatch.setattr(player_mod._Player, "step", checked_step)
    runs = _closing_runs(role)
    factory = controller_target() if role == "controller" else relay_target()
    results = run_cases(runs, factory, SETTINGS, jobs=4)
    failed = [line for r in results if not r.passed for line in case_line(r, r.case.section)]
    assert not failed, "\n".join(failed)
    assert unread == []

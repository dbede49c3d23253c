"""``--log-level`` on the command line: the demo's processes run at the demo's level and, at INFO
or DEBUG, their log lines reach the demo's stderr prefixed with the process's name; other
packages' loggers (python-statemachine's) stay at WARNING."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

#: one copied log line: ``[NAME] DATE TIME,MS LEVEL LOGGER: MESSAGE``
_LINE = re.compile(r"^\[(controller|relay0|rank0|rank1)\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
                   r"(DEBUG|INFO|WARNING|ERROR) ([\w.]+): (.*)$")


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    """A two-rank, one-relay, two-round demo (a few seconds), ``args`` added to its line."""
    return subprocess.run(
        [sys.executable, "-m", "flodl_proto.cli", *args, "--no-progress", "--world-size", "2",
         "--hosts", "1", "--rounds", "2", "--payload-mib", "0"],
        capture_output=True, text=True, timeout=150,
        env={**os.environ, "COLUMNS": "120"})


def _records(stderr: str) -> list[tuple[str, str, str, str]]:
    """Every stderr line parsed as ``(name, level, logger, message)``; fails on any other."""
    out = []
    for line in stderr.splitlines():
        m = _LINE.match(line)
        assert m, f"not a prefixed log line: {line!r}"
        out.append((m[1], m[2], m[3], m[4]))
    return out


@pytest.mark.parametrize("where", ["before", "after"])
def test_demo_at_debug_shows_every_process_log_lines_prefixed_with_its_name(where: str) -> None:
    args = ("--log-level", "debug", "demo") if where == "before" else ("demo", "--log-level",
                                                                       "DEBUG")
    res = _demo(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1].startswith("OK: every round completed")
    records = _records(res.stderr)
    names = {name for name, *_ in records}
    assert names == {"controller", "relay0", "rank0", "rank1"}
    messages = {(name, level, logger, msg) for name, level, logger, msg in records}
    assert any(r[:3] == ("controller", "INFO", "flodl_proto.runner.controller")
               and r[3].startswith("controller: listening on 127.0.0.1:") for r in messages)
    assert any(r[:3] == ("relay0", "DEBUG", "flodl_proto.runner.relay")
               and r[3].startswith("relay demo-host0: rank 1 connected from ") for r in messages)
    for rank in (0, 1):  # a rank's DEBUG line: its level reached the rank's process
        assert any(r[:3] == (f"rank{rank}", "DEBUG", "flodl_proto.runner.rank")
                   and r[3].startswith(f"rank {rank} connected to ") for r in messages)
    assert ("relay0", "INFO", "flodl_proto.runner.relay", "relay demo-host0 finished") \
        in messages
    # python-statemachine's DEBUG lines (every event it processes) are not shown
    assert not [r for r in records if r[2].startswith("statemachine")]


def test_demo_at_info_shows_info_lines_and_no_debug_line() -> None:
    res = _demo("demo", "--log-level", "INFO")
    assert res.returncode == 0, res.stdout + res.stderr
    records = _records(res.stderr)
    assert {level for _, level, *_ in records} == {"INFO"}
    assert ("relay0", "INFO", "flodl_proto.runner.relay", "relay demo-host0 finished") \
        in records


@pytest.mark.parametrize("args", [("demo",), ("--log-level", "WARNING", "demo"),
                                  ("demo", "--log-level", "ERROR")], ids=" ".join)
def test_demo_at_warning_or_above_writes_nothing_on_stderr(args: tuple[str, ...]) -> None:
    res = _demo(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr == ""
    assert res.stdout.splitlines()[-1].startswith("OK: every round completed")


_STATEMACHINE_PROBE = textwrap.dedent("""
    import logging
    import sys

    from flodl_proto.cli import main
    from flodl_proto.fsm.lifecycle import Lifecycle

    class Guards:
        every_rank_covered = round_complete = no_relay_alive = False

    folder = sys.argv[1]
    code = main(["--log-level", "DEBUG", "vectors", "compare", folder, "--bundled", folder])
    Lifecycle(Guards())  # python-statemachine logs entering the initial state at DEBUG
    logging.getLogger("statemachine.engines.base").info("statemachine info")
    logging.getLogger("statemachine.engines.base").warning("statemachine warning")
    logging.getLogger("flodl_proto.probe").debug("own debug")
    print(code, logging.getLogger("statemachine.engines.base").getEffectiveLevel())
""")


def test_debug_keeps_python_statemachine_at_warning(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", _STATEMACHINE_PROBE, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "0 30"
    lines = [line.split(" ", 2)[2] for line in res.stderr.splitlines()]  # without the time
    assert lines == ["WARNING statemachine.engines.base: statemachine warning",
                     "DEBUG flodl_proto.probe: own debug"]


@pytest.mark.parametrize("level", ["ERROR", "error"])
def test_error_holds_python_statemachine_at_error(level: str) -> None:
    """A level above WARNING holds the quieted loggers there too, not down at WARNING."""
    probe = ("import logging\nfrom flodl_proto.cli import configure_logging\n"
             f"configure_logging({level!r})\n"
             "logging.getLogger('statemachine').warning('hidden')\n"
             "logging.getLogger('statemachine').error('shown')\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert [line.split(" ", 2)[2] for line in res.stderr.splitlines()] == [
        "ERROR statemachine: shown"]

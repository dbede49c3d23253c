"""The stage trace (runner/stages.py): off by default and then recording nothing; on, one record
per mark with the role, process, round and stage; the trace file's format, written at exit by
every process that traced; and the per-round breakdown computed from fixed timestamps (nothing
here asserts on a duration it measured)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flodl_proto.runner import stages
from flodl_proto.runner.stages import Record


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    """Every test starts with tracing off and an empty buffer, and leaves it so."""
    was, path, held = stages._on, stages._path, list(stages._buffer)
    stages._on, stages._path = False, None
    stages._buffer.clear()
    yield
    stages._on, stages._path = was, path
    stages._buffer[:] = held


def test_off_mark_records_nothing() -> None:
    assert not stages.is_enabled()
    stages.mark("rank", 0, "send_start")
    assert stages.records() == []
    assert stages.disable() == []


def test_on_in_memory_records_each_mark_in_order() -> None:
    stages.enable()
    assert stages.is_enabled()
    stages.mark("rank", 3, "send_start")
    stages.mark("relay", 3, "deposits_done")
    got = stages.records()
    assert [(r.role, r.pid, r.round, r.stage) for r in got] == [
        ("rank", os.getpid(), 3, "send_start"), ("relay", os.getpid(), 3, "deposits_done")]
    assert got[0].ns <= got[1].ns
    # no file: flush keeps the records; disable returns them, stops recording, empties the buffer
    stages.flush()
    assert stages.records() == got
    assert stages.disable() == got
    stages.mark("rank", 4, "send_start")
    assert stages.records() == []


def test_flush_appends_the_file_format(tmp_path: Path) -> None:
    path = tmp_path / "trace.tsv"
    path.write_text("controller\t7\t0\tbroadcast_sent\t5\n", encoding="utf-8")
    stages.enable(path)
    stages._buffer.append(Record("rank", 42, 1, "send_done", 123456789))
    stages.flush()
    assert stages.records() == []
    assert path.read_text(encoding="utf-8") == (
        "controller\t7\t0\tbroadcast_sent\t5\n" "rank\t42\t1\tsend_done\t123456789\n")
    assert stages.read_trace(path) == [Record("controller", 7, 0, "broadcast_sent", 5),
                                       Record("rank", 42, 1, "send_done", 123456789)]


def test_env_var_traces_every_process_to_one_file_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "trace.tsv"
    code = ("from flodl_proto.runner import stages as s; import os, sys; "
            "s.mark(sys.argv[1], 5, 'send_start'); s.mark(sys.argv[1], 6, 'reply_parsed'); "
            "print(os.getpid())")
    pids = {}
    for role in ("rank", "relay"):
        res = subprocess.run([sys.executable, "-c", code, role], capture_output=True, text=True,
                             env={**os.environ, stages.ENV: str(path)}, timeout=60, check=True)
        pids[role] = int(res.stdout)
    recs = stages.read_trace(path)
    assert [(r.role, r.pid, r.round, r.stage) for r in recs] == [
        ("rank", pids["rank"], 5, "send_start"), ("rank", pids["rank"], 6, "reply_parsed"),
        ("relay", pids["relay"], 5, "send_start"), ("relay", pids["relay"], 6, "reply_parsed")]
    assert recs[0].ns <= recs[1].ns <= recs[2].ns <= recs[3].ns  # one system-wide clock
    # without the variable a process records nothing
    env = {k: v for k, v in os.environ.items() if k != stages.ENV}
    off = subprocess.run([sys.executable, "-c", "from flodl_proto.runner import stages as s; "
                          "s.mark('rank', 0, 'send_start'); print(s.is_enabled(), s.records())"],
                         env=env, timeout=60, check=True, capture_output=True, text=True)
    assert off.stdout == "False []\n"


@pytest.mark.parametrize(("line", "why"), [
    ("rank\t1\t2\tsend_start", "4 fields"),
    ("rank\t1\tx\tsend_start\t9", "invalid literal"),
])
def test_read_trace_names_the_bad_line(tmp_path: Path, line: str, why: str) -> None:
    path = tmp_path / "t.tsv"
    path.write_text("rank\t1\t0\tsend_start\t9\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"stage trace line 2: .*{why}"):
        stages.read_trace(path)


def _round(rnd: int, base: int, scale: int = 1) -> list[Record]:
    """A round of W = 2 on one relay, at fixed nanosecond offsets from ``base``."""
    t = {"send_start": 0, "send_done": 100, "deposits_done": 300, "hostframe_sent": 400,
         "hostframes_done": 600, "broadcast_sent": 700, "broadcast_read": 900,
         "fanout_done": 1000, "reply_parsed": 1200}
    role_of = {stage: role for role, stage in stages.STAGES}
    recs = []
    for stage, off in t.items():
        role = role_of[stage]
        recs.append(Record(role, 10, rnd, stage, base + off * scale))
        if role == "rank":  # the other rank, 50 ns earlier: the latest counts
            recs.append(Record(role, 11, rnd, stage, base + off * scale - 50))
    return recs


def test_breakdown_takes_each_stage_latest_and_the_median_round() -> None:
    recs = _round(0, 10**9, 9) + _round(1, 2 * 10**9, 1) + _round(2, 3 * 10**9, 3)
    recs += [Record("rank", 10, 3, "send_start", 4 * 10**9)]  # an unfinished round is left out
    rounds = stages.breakdown(recs)
    assert [r.round for r in rounds] == [0, 1, 2]
    assert [r.total for r in rounds] == [1200 * 9 / 1e9, 1200 / 1e9, 1200 * 3 / 1e9]
    med = stages.median_round(rounds)
    assert med is not None and med.round == 2
    assert [(label, round(sec * 1e9), gap) for label, sec, gap in med.parts] == [
        ("rank send", 300, False),
        ("rank -> relay (wire, wake-up)", 600, True),
        ("relay deposits -> HostFrame sent", 300, False),
        ("relay -> controller (wire, wake-up)", 600, True),
        ("controller last HostFrame -> Broadcast sent", 300, False),
        ("controller -> relay (wire, wake-up)", 600, True),
        ("relay Broadcast -> fan-out done", 300, False),
        ("relay -> rank, reply parsed", 600, True),
    ]
    assert [r.round for r in stages.breakdown(recs, skip=1)] == [1, 2]
    assert stages.median_round([]) is None


def test_the_demo_is_the_one_breakdown_printer() -> None:
    """The module prints nothing: a second formatter labelled rounds by the protocol's count
    from 0 while the demo counts from 1. The demo's ``stage_lines`` (rounds as the demo counts
    them, tested in test_demo) and ``bench/round.py`` print the median round."""
    assert not hasattr(stages, "format_breakdown")
    assert not [name for name in stages.__all__ if name.startswith("format")]
    assert "stage_lines" in (stages.__doc__ or "")


@pytest.mark.timeout(60)
def test_the_runners_mark_rounds_from_0() -> None:
    """Two rounds through the real controller, one relay and two ranks (threads of this
    process): every stage of the table is marked for rounds 0 and 1 (once per party, and the
    relay's deposits_done once per deposit: the breakdown takes its latest), although the
    controller core numbers these rounds 1 and 2 (RoundScattered.round)."""
    import numpy as np

    from flodl_proto.runner.controller import ReferenceController
    from flodl_proto.runner.rank import RankClient
    from flodl_proto.runner.relay import Relay

    from .cluster_util import SALT, in_thread

    stages.enable()
    ctrl = ReferenceController(2, SALT).start()
    relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0).start()
    try:
        def rank_main(rank: int) -> None:
            with RankClient.connect(relay.address, rank, 2, SALT) as c:
                for _ in range(2):
                    c.all_reduce_scaled([np.ones(4, dtype=np.float32)], 1.0)

        jobs = [in_thread(rank_main, r) for r in (0, 1)]
        for t, res in jobs:
            t.join()
            assert "error" not in res, res.get("error")
        assert relay.wait(20) is None
        outcome = ctrl.wait(20)
        assert outcome is not None and outcome.clean, outcome
    finally:
        relay.shutdown()
        ctrl.shutdown()
    got = stages.disable()
    per_stage: dict[tuple[str, str], list[int]] = {}
    for r in got:
        per_stage.setdefault((r.role, r.stage), []).append(r.round)
    ranks_twice = [0, 0, 1, 1]  # two ranks mark each of their stages in every round
    assert {k: sorted(v) for k, v in per_stage.items()} == {
        ("rank", "send_start"): ranks_twice, ("rank", "send_done"): ranks_twice,
        ("relay", "deposits_done"): ranks_twice, ("relay", "hostframe_sent"): [0, 1],
        ("controller", "hostframes_done"): [0, 1], ("controller", "broadcast_sent"): [0, 1],
        ("relay", "broadcast_read"): [0, 1], ("relay", "fanout_done"): [0, 1],
        ("rank", "reply_parsed"): ranks_twice}

"""``flodl-proto demo`` in a subprocess: a real local cluster trains to the optimum; a killed rank
ends the run cleanly; no child process outlives the demo."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.commands.demo import (
    interrupted_line,
    model_rounds,
    payload_mib_max,
    payload_values,
    rank_frame_len,
    stage_lines,
)
from flodl_proto.errors import shown
from flodl_proto.runner.stages import SEGMENTS, RoundStages

from .cluster_util import skip_deep_unless_selected
from .conftest import ROOT
from .demo_procs import marked, marked_demo, members, wait_for_members
from .spec_util import spec_with_constant

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _deep(request: pytest.FixtureRequest) -> None:
    skip_deep_unless_selected(request)

_DIGEST = re.compile(r"^ rank (\d+)\s+[│|] ([0-9a-f]{64})", re.M)


def _demo(*args: str, env: dict[str, str] | None = None,
          timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flodl_proto.cli", "demo", "--no-progress", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "120", **(env or {})})


def test_demo_trains_to_the_optimum_with_identical_consensus() -> None:
    res = _demo("--payload-mib", "0.25")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "40 of 40 completed" in res.stdout
    digests = dict(_DIGEST.findall(res.stdout))
    assert sorted(digests) == ["0", "1", "2", "3"] and len(set(digests.values())) == 1
    assert "OK: every round completed" in res.stdout
    assert "end within 1% of it: ok" in res.stdout
    # the stage breakdown of the median traced round: its total, then every part with its share
    m = re.search(r"stages\s+[│|] round (\d+)'s Model reduce, the median of (\d+) traced: "
                  r"\d+\.\d{3} ms *\n\s+[│|] from the last rank's send to its reply "
                  r"parsed", res.stdout)
    assert m, res.stdout
    assert 1 <= int(m[1]) <= 40 and 1 <= int(m[2]) <= 40
    for label, _, _, gap in SEGMENTS:  # a time, or "overlaps" (the next stage came first)
        part = r"\d+\.\d{3} ms\s*\d+%" + (" gap" if gap else "")
        assert re.search(re.escape(label) + rf"\s+({part}|overlaps) *$", res.stdout, re.M), \
            (label, res.stdout)


def test_demo_kill_rank_ends_cleanly_with_identical_survivors() -> None:
    # 80 columns, as rich takes when stdout is no terminal: the verdict lines stay whole (they
    # wrapped at 80 and a grep for them failed)
    res = _demo("--kill-rank", "1@3", "--payload-mib", "0", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "killed at round 3" in res.stdout
    digests = dict(_DIGEST.findall(res.stdout))
    assert sorted(digests) == ["0", "2", "3"] and len(set(digests.values())) == 1
    lines = res.stdout.splitlines()
    assert lines[-2] == ("rank 1 was killed at round 3; the run ended cleanly; the 3 survivors "
                         "hold the identical consensus of round 2: " + digests["0"])
    assert lines[-1] == ("OK: the run ended cleanly after the kill and every survivor holds "
                         "the identical consensus")


def test_demo_kill_of_one_of_two_ranks_names_one_survivor() -> None:
    # the line read "the 1 survivors hold the identical consensus of round 2"
    res = _demo("--world-size", "2", "--hosts", "2", "--kill-rank", "1@3", "--rounds", "3",
                "--payload-mib", "0", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stdout + res.stderr
    digests = dict(_DIGEST.findall(res.stdout))
    assert sorted(digests) == ["0"]
    assert res.stdout.splitlines()[-2] == ("rank 1 was killed at round 3; the run ended cleanly; "
                                           "the survivor holds the consensus of round 2: "
                                           + digests["0"])


def test_demo_kill_in_the_first_round_claims_no_consensus() -> None:
    # the summary said "the 3 survivors hold the identical consensus of round 0: n/a", "end nan"
    # and "+nan %" when no round completed
    res = _demo("--kill-rank", "0@1", "--rounds", "3", "--payload-mib", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())  # the table and the lines wrap at the console's width
    assert "killed at round 1" in out
    assert "0 of 3 completed" in out
    assert "no round completed, so there is no consensus to compare" in out
    assert "OK: the run ended cleanly after the kill, before any round completed" in out
    assert "round 0" not in out and "nan" not in out
    assert "identical consensus" not in out


@pytest.mark.deep
def test_demo_six_ranks_three_hosts_bf16_v3() -> None:
    res = _demo("--world-size", "6", "--hosts", "3", "--bf16", "--protocol-version", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(set(dict(_DIGEST.findall(res.stdout)).values())) == 1


def test_demo_bf16_target_rounds_where_the_protocol_rounds() -> None:
    # the in-process target rounded only each rank's parameters to bf16, not the pre-scaled
    # contributions, the host sums and the consensus: this run ended 1-2 % above it and failed
    res = _demo("--world-size", "5", "--hosts", "3", "--bf16", "--rounds", "8",
                "--payload-mib", "0", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"loss +│ start [0-9.]+, end ([0-9.]+)", res.stdout)
    t = re.search(r"target +│ ([0-9.]+) = max\(optimum, in-process ([0-9.]+)\)", res.stdout)
    assert m and t, res.stdout
    assert m[1] == t[1] == t[2], res.stdout  # the same rounding, the same loss to 6 digits
    assert "end within 1% of it: ok" in res.stdout


def test_demo_bf16_target_steps_the_outer_optimizer_on_the_rounded_consensus() -> None:
    # the in-process target stepped the outer optimizer on the consensus before its second
    # bf16 rounding, where the controller steps the reduce's bf16 output: this run ended at
    # 0.545662 against a target of 0.535622 and failed (40 rounds: 0.129684 against 0.127531)
    res = _demo("--bf16", "--outer", "nesterov:0.5,0.9", "--rounds", "6", "--payload-mib", "0",
                env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"loss +│ start [0-9.]+, end ([0-9.]+)", res.stdout)
    t = re.search(r"target +│ ([0-9.]+) = max\(optimum, in-process ([0-9.]+)\)", res.stdout)
    assert m and t, res.stdout
    assert m[1] == t[1] == t[2] == "0.545662", res.stdout
    assert "end within 1% of it: ok" in res.stdout


def test_demo_rejects_bad_arguments() -> None:
    for args in (["--kill-rank", "9@3"], ["--hosts", "5"], ["--outer", "bogus"]):
        res = _demo(*args, timeout=60)
        assert res.returncode == 2, (args, res.stdout, res.stderr)


#: ``--rounds``'s range message past its bounds
_ROUNDS_MAX = ("1000000 for the demo (it also trains that many rounds in this process, for "
               "the reference loss)")


@pytest.mark.parametrize(("args", "message"), [
    # the demo's own range: the handshake's u32 range said 1..4294967295 for 0
    (["--world-size", "0"], "argument --world-size: must be in 1..64 for the demo (a process per "
                            "rank on this machine), got 0"),
    (["--world-size", "-2", "--hosts", "1"], "argument --world-size: must be in 1..64 for the demo "
                                             "(a process per rank on this machine), got -2"),
    (["--world-size", "4294967296"], "argument --world-size: must be in 1..64 for the demo (a "
                                     "process per rank on this machine), got 4294967296"),
    (["--world-size", "65"], "argument --world-size: must be in 1..64 for the demo (a process per "
                             "rank on this machine), got 65"),
    (["--hosts", "0"], "argument --hosts: must be in 1..4 (at most --world-size), got 0"),
    (["--hosts", "5"], "argument --hosts: must be in 1..4 (at most --world-size), got 5"),
    (["--rounds", "0"], f"argument --rounds: must be in 1..{_ROUNDS_MAX}, got 0"),
    # no upper bound: a huge count started the cluster and failed in it with a traceback
    (["--rounds", "1000001"], f"argument --rounds: must be in 1..{_ROUNDS_MAX}, got 1000001"),
    # more digits than int() reads: argparse echoed them whole ("invalid int value: '999...")
    (["--rounds", "9" * 5000], f"argument --rounds: must be in 1..{_ROUNDS_MAX}, got <an integer "
                               f"of 16610 bits>"),
    (["--seed", "9" * 5000], f"argument --seed: must be in 0..{2**128 - 1} (a 128-bit seed), got "
                             f"<an integer of 16610 bits>"),
    (["--world-size", "-" + "9" * 100], "argument --world-size: must be in 1..64 for the demo (a "
                                        "process per rank on this machine), got <a negative "
                                        "integer of 333 bits>"),
    (["--payload-mib", "-1"], "argument --payload-mib: must be a finite number >= 0, got '-1'"),
    (["--payload-mib", "nan"], "argument --payload-mib: must be a finite number >= 0, got 'nan'"),
    (["--payload-mib", "inf"], "argument --payload-mib: must be a finite number >= 0, got 'inf'"),
    (["--payload-mib", "1e12"], "argument --payload-mib: must be at most 1023.99, got '1e12': a "
                                "rank's frame would be 1048576000000000121 bytes, above the frame "
                                "ceiling of 1073741824 bytes"),
    (["--payload-mib", "1024"], "argument --payload-mib: must be at most 1023.99, got '1024': a "
                                "rank's frame would be 1073741945 bytes, above the frame ceiling "
                                "of 1073741824 bytes"),
    (["--payload-mib", "2048", "--bf16"], "argument --payload-mib: must be at most 2047.99 with "
                                          "--bf16, got '2048': a rank's frame would be 1073741911 "
                                          "bytes, above the frame ceiling of 1073741824 bytes"),
    (["--seed", "-1"], f"argument --seed: must be in 0..{2**128 - 1} (a 128-bit seed), got -1"),
    # a negative learning rate or a momentum of 1 or more diverges: the in-process reference
    # diverged with it, and nesterov:-1,5 passed at a loss of 3.6e14
    (["--outer", "nesterov:-1,5"], "argument --outer: 'nesterov:-1,5': LR must be > 0 (a learning "
                                   "rate), got -1"),
    (["--outer", "slow-momentum:0,0.9"], "argument --outer: 'slow-momentum:0,0.9': LR must be > 0 "
                                         "(a learning rate), got 0"),
    (["--outer", "nesterov:0.7,1"], "argument --outer: 'nesterov:0.7,1': MU must be in [0, 1) (a "
                                    "momentum), got 1"),
    (["--outer", "slow-momentum:1,-0.5"], "argument --outer: 'slow-momentum:1,-0.5': MU must be in "
                                          "[0, 1) (a momentum), got -0.5"),
    # the outer step runs in 32-bit floats: 1e308 overflowed (NumPy warnings, a nan loss) and
    # 1e-320 was 0 (no step at all); a momentum that rounds to 1 is 1
    (["--outer", "nesterov:1e308,0"], "argument --outer: 'nesterov:1e308,0': LR 1e+308 is infinite "
                                      "as a 32-bit float (the outer step's precision); a learning "
                                      "rate must be in 1.4013e-45..3.40282e+38"),
    (["--outer", "slow-momentum:1e-320,0.5"], "argument --outer: 'slow-momentum:1e-320,0.5': LR "
                                              "1e-320 is 0 as a 32-bit float (the outer step's "
                                              "precision); a learning rate must be in "
                                              "1.4013e-45..3.40282e+38"),
    (["--outer", "nesterov:1,0.999999999"], "argument --outer: 'nesterov:1,0.999999999': MU "
                                            "0.999999999 is 1 as a 32-bit float (the outer step's "
                                            "precision); a momentum must be below 1"),
    (["--outer", "nesterov:x,0.9"], "argument --outer: 'nesterov:x,0.9': LR 'x' is not a finite "
                                    "number; expected nesterov:LR,MU (two finite numbers)"),
    (["--kill-rank", "x@1"], "argument --kill-rank: expected R@ROUND (two whole numbers), got "
                             "'x@1'"),
    (["--kill-rank", "1@"], "argument --kill-rank: expected R@ROUND (two whole numbers), got '1@'"),
    (["--kill-rank", "1"], "argument --kill-rank: expected R@ROUND (two whole numbers), got '1'"),
    # more digits than int() converts: was "Exceeds the limit (4300 digits) ..."
    (["--kill-rank", "1@" + "9" * 4301], f"argument --kill-rank: expected R@ROUND (two whole "
                                         f"numbers), got '1@{'9' * 38}...{'9' * 20}' (4303 "
                                         f"characters)"),
    (["--kill-rank", "9@3"], "argument --kill-rank: '9@3': R must be in 0..3 (a rank of "
                             "--world-size 4) and ROUND in 1..40 (--rounds), got rank 9"),
    (["--kill-rank", "1@41"], "argument --kill-rank: '1@41': R must be in 0..3 (a rank of "
                              "--world-size 4) and ROUND in 1..40 (--rounds), got round 41"),
    # the only rank killed: the summary took the first survivor's loss, an IndexError traceback
    (["--world-size", "1", "--hosts", "1", "--kill-rank", "0@2"],
     "argument --kill-rank: '0@2': --world-size 1 leaves no rank to survive the kill (the demo "
     "checks that the survivors hold one consensus); give --world-size 2 or more"),
])
def test_demo_usage_errors_name_the_option_and_the_value(
        args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One line naming the option and the value, exit 2, nothing started (``--world-size 0``
    named the hosts constraint; ``--payload-mib nan`` and ``--seed -1`` started the cluster and
    failed in the ranks with a traceback)."""
    from flodl_proto.cli import main

    assert main(["demo", "--no-progress", *args]) == 2
    assert capsys.readouterr() == ("", f"flodl-proto demo: error: {message}\n")


def test_demo_refuses_a_payload_this_machine_cannot_hold(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--payload-mib 1023.99`` passed the checks, then swapped for minutes and ended in "no
    progress for 60s". A cluster whose expected peak memory is above what this process may still
    take (``MemAvailable``, bounded by its memory cgroup) is refused
    before anything starts: one line naming the need and what is available, exit 1."""
    from flodl_proto.cli import main
    from flodl_proto.commands import _demo_sizes, demo

    need = demo.memory_need(1023.99, 4, 2)
    # 4.5 payloads per rank, ranks + 2.5 per relay, hosts + 3.5 for the controller, 64 MiB each
    payload = (int(1023.99 * (1 << 20)) // 4) * 4
    assert need == int((4.5 * 4 + (4 + 2.5 * 2) + (2 + 3.5)) * payload) + 7 * (64 << 20)
    monkeypatch.setattr(_demo_sizes, "_available_memory", lambda: need - 1)
    assert main(["demo", "--no-progress", "--payload-mib", "1023.99"]) == 1
    assert capsys.readouterr() == ("", (
        "flodl-proto demo: error: argument --payload-mib: 1023.99: needs about 32.9 GiB of "
        "memory for 4 "
        "rank(s), 2 relay(s) and the controller (each holds a few frames of the payload's "
        f"size), and this machine has {(need - 1) / (1 << 30):.1f} GiB available (its memory "
        "cgroup's limit included); give a "
        "smaller --payload-mib, --world-size or --hosts\n"))


def test_demo_memory_need_bounds_the_measured_peaks() -> None:
    """The estimate is above the peak RSS measured for every process of a demo at 128 MiB (W = 4
    / 2: 568 MiB each; W = 8 / 2: ranks 570, relays 824, controller 696 MiB) and within 1.3 times
    their sum, so it refuses no cluster that fits by much."""
    from flodl_proto.commands.demo import memory_need

    mib = 1 << 20
    for (w, hosts), measured in {(4, 2): 7 * 568, (8, 2): 8 * 570 + 2 * 824 + 696}.items():
        need = memory_need(128, w, hosts) / mib
        assert measured < need < 1.3 * measured, (w, hosts, need)
    assert memory_need(1, 4, 2) < 1 << 30  # the default demo needs little


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("payload_mib", [0.0, 0.001, 1.0, 3.3])
def test_rank_frame_len_is_the_length_of_the_frame_a_demo_rank_sends(
        payload_mib: float, bf16: bool) -> None:
    """The frame the worker builds (its parameters and the --payload-mib tensor), encoded as the
    rank client sends it, is as long as ``rank_frame_len`` says; the largest ``--payload-mib``
    accepted fits the 1 GiB frame ceiling and 0.01 more does not."""
    import numpy as np

    from flodl_proto.codec import Dtype
    from flodl_proto.commands import _demo_worker as worker
    from flodl_proto.spec import DEFAULT_FRAME_CEILING

    from .cluster_util import frame

    n = payload_values(payload_mib)
    assert n == int(payload_mib * (1 << 20)) // 4
    arrays = [np.zeros(worker.FEATURES + 1, np.float32)] + ([np.ones(n, np.float32)] if n else [])
    want = frame(*arrays, dtype=Dtype.BF16 if bf16 else Dtype.F32).wire_len
    assert rank_frame_len(payload_mib, bf16) == want
    top = payload_mib_max(bf16)
    assert top == (2047.99 if bf16 else 1023.99)
    assert rank_frame_len(top, bf16) <= DEFAULT_FRAME_CEILING < rank_frame_len(top + 0.01, bf16)


@pytest.mark.parametrize(("where", "why"), [
    (".", "Is a directory"),
    ("new/", "names a folder (it ends with /); give a file path in it"),
    ("a-file/", "names a folder (it ends with /); give a file path in it")])
def test_demo_salt_file_that_cannot_be_used_is_one_line_without_errno(
        where: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """As the cluster commands' ``--salt-file``: ``argument --salt-file: 'PATH': why`` (it said
    ``[Errno 2] No such file or directory: 'PATH'``, the path twice), exit 2; a folder of the
    path that cannot be created is named, with why; a path ending with / names a folder (a
    new salt was written as a file of the folder's name) and nothing is written."""
    from flodl_proto.cli import main

    monkeypatch.chdir(tmp_path)  # short paths: a long one is shown cut
    Path("a-file").write_text("not a folder\n")
    assert main(["demo", "--no-progress", "--salt-file", where]) == 2
    assert capsys.readouterr() == (
        "", f"flodl-proto demo: error: argument --salt-file: {where!r}: {why}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert Path("a-file").read_text() == "not a folder\n"


@pytest.mark.parametrize("where", ["a-file/salt.hex", "a-file/sub/salt.hex",
                                   "./a-file/salt.hex", "x/../a-file/salt.hex",
                                   "x/y/../../a-file/sub/salt.hex"])
def test_demo_salt_file_with_a_file_in_its_path_is_a_usage_error_as_the_other_output_paths(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A new salt file whose path has a file where a folder should be was exit 1 (``cannot
    write the salt file a-file/salt.hex: creating the folder a-file: Not a directory``), where
    ``docs --out`` and ``vectors export`` name the option and exit 2 for the same path: it is
    ``argument --salt-file:`` with their words, exit 2, nothing written: no folder made
    either, where ``x/../a-file/salt.hex`` made ``x`` before it was refused."""
    from flodl_proto.cli import main

    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("not a folder\n")
    assert main(["demo", "--no-progress", "--salt-file", where]) == 2
    assert capsys.readouterr() == (
        "", f"flodl-proto demo: error: argument --salt-file: '{where}': Not a directory (a-file "
            "is a file, not a folder)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert Path("a-file").read_text() == "not a folder\n"


@pytest.mark.parametrize(("where", "why"), [
    ("/proc/salt.hex", "creating a temporary file in /proc to write it: No such file or "
                       "directory (the folder takes no new file)"),
    ("ro/salt.hex", "creating a temporary file in ro to write it: Permission denied")])
def test_demo_salt_file_that_cannot_be_written_is_exit_1_as_the_other_output_files(
        where: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A new salt file that cannot be written was a usage error, ``argument --salt-file: ...``
    and exit 2, where ``docs --out`` and the other commands' output files that cannot be
    written are exit 1: ``cannot write the salt file 'PATH': WHY``, exit 1, nothing written. A
    read-only folder is one the creation of the temporary file is refused in (as root, whom
    no mode stops, it is refused here by a stand-in for ``os.open``)."""
    from flodl_proto import _files
    from flodl_proto.cli import main

    if where == "/proc/salt.hex" and not os.path.isdir("/proc"):
        pytest.skip("needs /proc")
    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("not a folder\n")
    Path("ro").mkdir()
    real_open = os.open

    def refused_in_ro(path: Any, flags: int, mode: int = 0o777) -> int:
        if Path(path).parent.name == "ro" and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(_files.os, "open", refused_in_ro)
    assert main(["demo", "--no-progress", "--salt-file", where]) == 1
    assert capsys.readouterr() == (
        "", f"flodl-proto demo: error: cannot write the salt file {where!r}: {why}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "ro"]
    assert list(Path("ro").iterdir()) == []


def test_demo_salt_file_that_cannot_be_written_is_named_quoted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``cannot write the salt file PATH: WHY`` showed the path bare unless it held a line
    break or an escape (``cannot write the salt file it's here/s.hex: ...``); it is quoted as
    on every line naming a path of the command line (``argument --salt-file: 'PATH': ...``)."""
    from flodl_proto.cli import main
    from flodl_proto.commands import _salt

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_salt, "create_file", no_space)
    assert main(["demo", "--no-progress", "--salt-file", "it's here/s.hex"]) == 1
    assert capsys.readouterr() == (
        "", "flodl-proto demo: error: cannot write the salt file \"it's here/s.hex\": No space "
            "left on device\n")


def test_demo_salt_file_note_names_it_quoted(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``session salt: written to PATH`` and ``read from PATH`` showed the path as given (a line
    break split the line); it is quoted as on every line naming a path of the command line."""
    from flodl_proto.commands._salt import demo_salt

    monkeypatch.chdir(tmp_path)
    salt, note = demo_salt("it's here/s.hex")
    assert note == "session salt: written to \"it's here/s.hex\""
    assert demo_salt("it's here/s.hex") == (salt, "session salt: read from \"it's here/s.hex\"")


def test_demo_salt_file_created_by_another_process_meanwhile_is_read_not_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process creates the salt file between the demo's check that it does not exist
    and its write (simulated: right after the temporary file is made): the demo replaced it
    with a salt of its own, so the two used different salts. The file is left as it is and
    its salt is read."""
    from flodl_proto import _files
    from flodl_proto.commands._salt import demo_salt

    path = tmp_path / "s.hex"
    theirs = "0123456789abcdef" * 2
    real = _files._create_temporary

    def racing(target: Path, mode: int) -> tuple[int, str]:
        made = real(target, mode)
        path.write_text(theirs + "\n", encoding="ascii")  # the other process, meanwhile
        return made

    monkeypatch.setattr(_files, "_create_temporary", racing)
    assert demo_salt(str(path)) == (theirs, f"session salt: read from {shown(str(path))}")
    assert path.read_text(encoding="ascii") == theirs + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.hex"]  # no temporary left


def _race_salt_file(monkeypatch: pytest.MonkeyPatch, path: Path, first: bytes,
                    rest: bytes | None) -> list[float]:
    """Another process creates ``path`` while the demo creates it, and has written ``first``
    of it when the demo reads it; it writes ``rest`` during the demo's first wait (None:
    never). A clock of the waits alone stands for time. The seconds of each wait."""
    from flodl_proto import _files
    from flodl_proto.commands import _salt

    real = _files._create_temporary
    waits: list[float] = []

    def racing(target: Path, mode: int) -> tuple[int, str]:
        made = real(target, mode)
        path.write_bytes(first)  # the other process, meanwhile
        return made

    def wait(seconds: float) -> None:
        if rest is not None and not waits:
            with path.open("ab") as f:
                f.write(rest)
        waits.append(seconds)

    monkeypatch.setattr(_files, "_create_temporary", racing)
    monkeypatch.setattr(_salt, "sleep", wait)
    monkeypatch.setattr(_salt, "monotonic", lambda: sum(waits))
    return waits


_HEX_SALT = b"0123456789abcdef" * 2 + b"\n"
_RAW_SALT = bytes(range(0xe0, 0xf0))
#: a salt written with a space between its bytes (47 bytes, a salt file's words take it)
_SPACED_SALT = b" ".join(b"%02x" % b for b in range(0x10, 0x20)) + b"\n"


@pytest.mark.parametrize(("theirs", "written", "salt"), [
    (_HEX_SALT, 0, _HEX_SALT[:32].decode()), (_HEX_SALT, 16, _HEX_SALT[:32].decode()),
    (_HEX_SALT, 31, _HEX_SALT[:32].decode()), (_HEX_SALT, 32, _HEX_SALT[:32].decode()),
    (_RAW_SALT, 8, _RAW_SALT.hex()),
    # spaced hex digits: 16 bytes of them ('10 11 12 13 14 1') were taken for a raw salt, 33
    # bytes and more short of the 32 digits refused at once
    (_SPACED_SALT, 16, bytes(range(0x10, 0x20)).hex()),
    (_SPACED_SALT, 33, bytes(range(0x10, 0x20)).hex()),
    (_SPACED_SALT, 46, bytes(range(0x10, 0x20)).hex()),
    (_SPACED_SALT, 47, bytes(range(0x10, 0x20)).hex())])
def test_demo_salt_file_another_process_is_still_writing_is_read_once_whole(
        theirs: bytes, written: int, salt: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The other process created the file but had not written it whole when the demo read it:
    an empty file, part of its hex digits or of a raw salt, was refused (exit 2), and 16 hex
    digits (or 16 bytes of digits with spaces between bytes) were read as a raw salt (a salt
    of neither). The demo reads it again until it is whole; 32 digits without a line end are
    a salt already."""
    from flodl_proto.commands._salt import demo_salt

    path = tmp_path / "s.hex"
    waits = _race_salt_file(monkeypatch, path, theirs[:written], theirs[written:])
    assert demo_salt(str(path)) == (salt, f"session salt: read from {shown(str(path))}")
    whole = sum(c in b"0123456789abcdef" for c in theirs[:written]) == 32  # its 32 digits
    assert waits == ([] if whole else [0.02])
    assert path.read_bytes() == (theirs[:written] if whole else theirs)


def test_demo_salt_file_another_process_left_partial_is_refused_after_a_second(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A file the other process leaves empty is refused as before, once the wait is over."""
    from flodl_proto.cli import main

    monkeypatch.chdir(tmp_path)
    waits = _race_salt_file(monkeypatch, tmp_path / "s.hex", b"", None)
    assert main(["demo", "--no-progress", "--salt-file", "s.hex"]) == 2
    assert capsys.readouterr() == (
        "", "flodl-proto demo: error: argument --salt-file: 's.hex': session salt must be 16 "
            "bytes written as 32 hex digits, got 0 bytes (an empty file)\n")
    assert waits == [0.02] * 50


def test_demo_salt_file_in_missing_folders_is_written_there(tmp_path: Path) -> None:
    """A salt file whose folders do not exist yet: the folders are made and the salt written
    (32 hex digits and a line end, mode 0600), then read back as it was by the next run."""
    from flodl_proto.commands._salt import demo_salt

    path = tmp_path / "new" / "dir" / "s.hex"
    salt, note = demo_salt(str(path))
    assert (len(salt), int(salt, 16) >= 0) == (32, True)
    assert note == f"session salt: written to {shown(str(path))}"
    assert path.read_text(encoding="ascii") == salt + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["s.hex"]  # no temporary left
    assert demo_salt(str(path)) == (salt, f"session salt: read from {shown(str(path))}")
    # the README's demo row said "else creates it", not that the folders are made too
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ("(reads the file when it exists, else creates it, and the missing folders of its "
            "path, atomically") in readme


def test_demo_salts_take_their_length_from_the_spec(tmp_path: Path) -> None:
    """The demo's salts are ``SESSION_SALT_BYTES`` long, where it drew 16 bytes by hand: under
    a spec whose salt is 24 bytes (``FLODL_PROTO_SPEC_DIR``) the random salt of a run without
    ``--salt-file`` and the one a new ``--salt-file`` is written with are 48 hex digits, and
    the file is read back as the same salt."""
    spec_dir = spec_with_constant(tmp_path, "SESSION_SALT_BYTES", 16, 24)
    path = tmp_path / "s.hex"
    code = (
        "import sys\n"
        "from flodl_proto.commands._salt import demo_salt\n"
        "salt, note = demo_salt(None)\n"
        "print(len(salt), int(salt, 16) >= 0, note)\n"
        "salt, note = demo_salt(sys.argv[1])\n"
        "print(len(salt), note)\n"
        "print(demo_salt(sys.argv[1]) == (salt, note.replace('written to', 'read from')))\n"
        "print(open(sys.argv[1]).read() == salt + '\\n')\n")
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "FLODL_PROTO_SPEC_DIR": str(spec_dir)})
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (
        "48 True session salt: random, not kept (--salt-file PATH keeps it for decode "
        "--salt-file PATH)\n"
        f"48 session salt: written to {shown(str(path))}\n"
        "True\n"
        "True\n")


@pytest.mark.parametrize(("where", "why"), [
    ("loop1", "'loop1': Too many levels of symbolic links (loop1 is a loop of symbolic links)"),
    ("loop1/salt.hex", "'loop1/salt.hex': Too many levels of symbolic links (loop1 is a loop of "
                       "symbolic links)"),
    ("x/../loop2/sub/salt.hex", "'x/../loop2/sub/salt.hex': Too many levels of symbolic links "
                                "(loop2 is a loop of symbolic links)")])
def test_demo_salt_file_through_a_loop_of_links_is_a_usage_error_whatever_its_place(
        where: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A loop of links as the salt file was exit 2 (a --salt-file that cannot be read) but
    exit 1 as a folder of a new one (``cannot write the salt file loop1/salt.hex: creating the
    folder loop1: ...``): exit 2 both, with the same words; nothing is made."""
    from flodl_proto.cli import main

    monkeypatch.chdir(tmp_path)
    Path("loop1").symlink_to("loop2")
    Path("loop2").symlink_to("loop1")
    assert main(["demo", "--no-progress", "--salt-file", where]) == 2
    assert capsys.readouterr() == ("", f"flodl-proto demo: error: argument --salt-file: {why}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop1", "loop2"]


def test_demo_salt_file_that_is_a_link_to_no_file_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A link whose target does not exist is refused as a salt file that cannot be read (exit
    2), as the exclusive create refused it; no file appears where it points."""
    from flodl_proto.cli import main

    monkeypatch.chdir(tmp_path)
    Path("s.hex").symlink_to(tmp_path / "elsewhere.hex")
    assert main(["demo", "--no-progress", "--salt-file", "s.hex"]) == 2
    assert capsys.readouterr() == (
        "", "flodl-proto demo: error: argument --salt-file: 's.hex': No such file or directory\n")
    assert not (tmp_path / "elsewhere.hex").exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
@pytest.mark.timeout(330)
@pytest.mark.parametrize("how", ["sigterm-to-demo", "ctrl-c-to-process-group"])
def test_interrupted_demo_leaves_no_process_behind(how: str) -> None:
    """SIGTERM to the demo, or a terminal's Ctrl-C (SIGINT to the whole process group): the
    cluster is stopped, one line says so, no traceback, no process left; exit 143 and
    ``terminated`` after SIGTERM (it was 130 and ``interrupted``, as for Ctrl-C), 130 and
    ``interrupted`` after Ctrl-C."""
    # the network deadlines at their full length: under the tests' 0.1 scale a busy machine
    # can take a member past one (its relay then drops it) before the signal is sent
    with marked_demo("--rounds", "100000", "--payload-mib", "0",
                     env={"FLODL_NET_TIMEOUT_SCALE": "1.0"}) as (proc, marker):
        # eight interpreters importing numpy: on a busy 2-core machine that alone can take a minute
        started = time.monotonic()
        if (running := len(wait_for_members(proc, marker, 7, 180.0))) < 7:  # 1 + 2 + 4
            exited = proc.poll()  # say why: the demo's own account of it
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"{running} of 7 cluster members running after "
                        f"{time.monotonic() - started:.0f} s (demo exit status "
                        f"{exited})\n{out}\n{err}")
        time.sleep(0.5)
        sent = time.monotonic()
        if how == "sigterm-to-demo":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        # about 1 s here (the controller and relays stop as on a Ctrl-C of their own)
        assert time.monotonic() - sent < 15.0, (out, err)
        word, code = (("terminated", 143) if how == "sigterm-to-demo" else ("interrupted", 130))
        assert proc.returncode == code, (out, err)
        assert err.splitlines()[-1].startswith(f"flodl-proto demo: {word} after "), err
        assert err.splitlines()[-1].endswith(" rounds; the cluster was stopped"), err
        assert "interrupted" not in out and "terminated" not in out
        assert "Traceback" not in out + err
        deadline = time.monotonic() + 10
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked(marker) == []


@pytest.mark.parametrize(("done", "rounds", "line"), [
    (0, 100000, "interrupted after 0 of 100000 rounds; the cluster was stopped"),
    (2, 3, "interrupted after 2 of 3 rounds; the cluster was stopped"),
    # a signal between the last round and the report: not "after 3 of 3 rounds"
    (3, 3, "interrupted after all 3 rounds, before its report; the cluster was stopped"),
])
def test_the_interrupted_line_says_whether_every_round_completed(done: int, rounds: int,
                                                                 line: str) -> None:
    assert interrupted_line(done, rounds) == f"flodl-proto demo: {line}"


def test_the_line_of_a_terminated_demo_says_terminated() -> None:
    """After SIGTERM the line says ``terminated`` (exit 143), not ``interrupted``."""
    assert interrupted_line(2, 3, "terminated") == (
        "flodl-proto demo: terminated after 2 of 3 rounds; the cluster was stopped")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_ctrl_c_while_the_cluster_starts_stops_it_at_once() -> None:
    """Ctrl-C (SIGINT to the whole process group) once the controller's process runs, before it
    listens: the controller ignores the terminal's Ctrl-C (the demo stops its cluster itself), so
    the demo waited for it to listen, then started the relays and ranks, and only then stopped
    them all (seconds on a busy machine); now it sends its controller SIGTERM at once and starts
    no other member: one line, exit 130, no process left."""
    with marked_demo("--rounds", "100000", "--payload-mib", "0",
                     env={"FLODL_NET_TIMEOUT_SCALE": "1.0"}) as (proc, marker):
        first = wait_for_members(proc, marker, 1, 180.0)  # the controller
        assert len(first) == 1, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        started = set()
        while proc.poll() is None:
            started |= set(members(marker)) - set(first)
            time.sleep(0.01)
        out, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 10  # before marked_demo's sweep: the demo left none
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked(marker) == []
    assert started == set(), (out, err)  # no relay or rank after the Ctrl-C
    assert proc.returncode == 130, (out, err)
    assert err.splitlines()[-1] == ("flodl-proto demo: interrupted after 0 of 100000 rounds; "
                                    "the cluster was stopped"), err
    assert "Traceback" not in out + err


def test_a_killed_relay_is_named_first_and_the_logs_are_shown_unwrapped() -> None:
    """A relay killed mid-run: its exit came last, after the noise it caused (ranks that did not
    finish, the final loss), and the controller's log lines were wrapped at the terminal's
    width, their second halves without the indent."""
    # --log-level INFO: the controller logs lines, one per round among them; the relay is
    # killed once the controller has logged a round (killed before its ranks connected, they
    # retried their connection for 7.5 s at this scale)
    with marked_demo("--rounds", "100000", "--payload-mib", "0", "--log-level", "INFO",
                     env={"COLUMNS": "40", "FLODL_NET_TIMEOUT_SCALE": "0.25"}) as (proc, marker):
        assert proc.stderr is not None
        for line in proc.stderr:  # every member runs: the run is under way
            if line.startswith("[controller] ") and " controller: protocol round " in line:
                break
        relays: list[int] = []
        running = wait_for_members(proc, marker, 7, 180.0)
        assert len(running) == 7, proc.communicate()
        for pid in running:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"flodl_proto.cli\0relay\0" in f.read():
                    relays.append(pid)
        assert len(relays) == 2
        os.kill(min(relays), signal.SIGKILL)  # relay0: started first
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    failed = [line for line in out.splitlines() if line.startswith("FAILED: ")]
    assert failed and failed[0] == "FAILED: relay0 was killed by SIGKILL", (out, err)
    assert "controller stderr:\n" in out, (out, err)
    block = out.split("controller stderr:\n", 1)[1].splitlines()
    assert block and all(line.startswith("    20") for line in block), out  # one timed line each


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
@pytest.mark.parametrize(("member", "command"), [("relay0", b"flodl_proto.cli\0relay\0"),
                                                 ("controller", b"flodl_proto.cli\0controller\0")],
                         ids=["relay", "controller"])
def test_a_member_killed_before_round_1_stops_the_cluster_at_once(member: str,
                                                                  command: bytes) -> None:
    """A relay killed before round 1 left its rank retrying the relay's address for 30 s (x
    FLODL_NET_TIMEOUT_SCALE), a controller killed so left both relays retrying its own, and
    the demo printed nothing until they gave up (``rank 0 failed: ConnectionError: ... failed
    after 60 attempts``, 32 s). The demo sees the exit and stops its cluster then: the summary
    names the dead member first, and no rank or relay ran out its retries."""
    # the network deadlines unscaled: the retries would take 30 s, far longer than the stop
    with marked_demo("--world-size", "2", "--hosts", "2", "--rounds", "50", "--payload-mib", "0",
                     env={"FLODL_NET_TIMEOUT_SCALE": "1.0", "COLUMNS": "200"}) as (proc, marker):
        running = wait_for_members(proc, marker, 5, 180.0)  # 1 + 2 + 2: the ranks just started
        assert len(running) == 5, proc.communicate()
        victims = []
        for pid in running:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if command in f.read():
                    victims.append(pid)
        os.kill(min(victims), signal.SIGKILL)  # relay0 started before relay1
        killed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - killed
    assert proc.returncode == 1, (out, err)
    lines = out.splitlines()
    stopped = f"{member} was killed by SIGKILL while ranks ran: stopping the cluster"
    assert stopped in lines, (out, err)
    title = next(i for i, line in enumerate(lines) if line.strip() == "flodl-proto demo")
    assert lines.index(stopped) < title, out  # said as it happened, before the summary
    failed = [line for line in lines if line.startswith("FAILED: ")]
    assert failed[0] == f"FAILED: {member} was killed by SIGKILL", (out, err)
    assert "attempts" not in out + err, (out, err)  # no retry ran out
    assert took < 25.0, (took, out, err)  # within the 30 s of the retries, whatever the load


def _main_keeping_signals(argv: list[str]) -> int:
    """``cli.main(argv)`` in this process, its stop-signal handlers put back after it."""
    from flodl_proto import cli

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return cli.main(argv)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _member(code: str) -> Callable[[list[str]], list[str]]:
    """A ``wrap`` for :meth:`_Cluster.spawn` that runs ``python -c CODE`` instead."""
    return lambda argv: [sys.executable, "-c", code]


_DIES = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def test_a_member_that_exits_before_listening_is_named_once() -> None:
    """A relay killed before it listened read ``relay0 exited (-9): `` (an empty stderr tail),
    below ``relay0 was killed by SIGKILL``."""
    from flodl_proto.commands.demo import _Cluster

    cluster = _Cluster("00" * 16)
    try:
        child = cluster.spawn("relay0", [], private=True, wrap=_member(_DIES))
        with pytest.raises(RuntimeError) as e:
            cluster.first_line(child, 60.0)
    finally:
        cluster.close()
    assert str(e.value) == "relay0 exited before listening"


def test_the_members_the_demo_stops_after_a_failure_are_not_failures_of_their_own(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A relay that died before it listened ended the run, and the demo stopped the other relay
    with SIGTERM: the summary listed ``relay1 was killed by SIGTERM`` as a failure too."""
    from flodl_proto.commands import demo

    seen: list[dict[str, int | None]] = []

    def drive(args: object, console: object, cluster: demo._Cluster, *rest: object) -> None:
        cluster.spawn("relay1", [], private=True, wrap=_member("import time; time.sleep(60)"))
        dead = cluster.spawn("relay0", [], private=True, wrap=_member(_DIES))
        dead.proc.wait()
        raise RuntimeError("relay0 exited before listening")

    def report(*args: Any) -> int:
        seen.append(args[4].relay_rc)
        return 1

    monkeypatch.setattr(demo, "_drive", drive)
    monkeypatch.setattr(demo, "report", report)
    assert _main_keeping_signals(["demo", "--no-progress", "--rounds", "10",
                                  "--payload-mib", "0"]) == 1
    capsys.readouterr()
    assert seen == [{"relay0": -9}]


def test_an_unreadable_stage_trace_is_a_problem_said_in_words(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary's problem gave Python's text of the error ('[Errno 5] Input/output error:
    '/tmp/flodl-demo-.../stages.tsv'', a path that is gone once the demo ends): now the reason
    in words."""
    from flodl_proto.commands import demo
    from flodl_proto.runner import stages

    seen: list[list[str]] = []

    def drive(args: object, console: object, cluster: demo._Cluster, *rest: object) -> None:
        Path(cluster.env[stages.ENV]).write_text("")  # the trace exists: it is read

    def unreadable(path: object) -> list[stages.Record]:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    def report(*args: Any) -> int:
        seen.append(list(args[4].problems))
        return 1

    monkeypatch.setattr(demo, "_drive", drive)
    monkeypatch.setattr(demo, "report", report)
    monkeypatch.setattr(stages, "read_trace", unreadable)
    assert _main_keeping_signals(["demo", "--no-progress", "--rounds", "10",
                                  "--payload-mib", "0"]) == 1
    capsys.readouterr()
    assert seen == [["stage trace unreadable: Input/output error"]]


@pytest.mark.netlab
def test_demo_in_network_namespaces_shows_every_host_address_and_leaves_nothing() -> None:
    res = _demo("--netns", "--hosts", "3", "--world-size", "6", "--payload-mib", "0",
                timeout=170, env={"COLUMNS": "80"})  # the widest label beside a whole digest
    assert res.returncode == 0, res.stdout + res.stderr
    assert "network namespaces + bridge" in res.stdout
    # said before the lab's start, which took seconds in silence
    lines = res.stdout.splitlines()
    started = lines.index("starting the network lab: 4 network namespaces and a bridge")
    assert started < next(i for i, line in enumerate(lines)
                          if line.startswith("controller listening on "))
    for address in ("198.18.0.1 ", "198.18.0.10 ", "198.18.0.11 ", "198.18.0.12 "):
        assert address in res.stdout, res.stdout
    digests = dict(_DIGEST.findall(res.stdout))
    assert sorted(digests) == [str(r) for r in range(6)] and len(set(digests.values())) == 1
    tags = set(re.findall(r"netns (flodl-lab-\d+-\d+)-", res.stdout))
    assert len(tags) == 1
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tags.pop() not in listed


@pytest.mark.netlab
def test_demo_in_network_namespaces_needs_ip_only(tmp_path: Path) -> None:
    """The demo sets no ``tc`` or nftables rule, so it runs with ``ip`` the only tool on PATH
    (it was refused: "needs iproute2 and nftables: tc, nft not found")."""
    ip = shutil.which("ip")
    assert ip is not None
    (tmp_path / "ip").symlink_to(ip)
    res = _demo("--netns", "--hosts", "1", "--world-size", "2", "--rounds", "3",
                "--payload-mib", "0", env={"PATH": str(tmp_path)})
    assert (res.returncode, res.stderr) == (0, ""), res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == ("OK: every round completed, every rank holds the "
                                           "identical consensus, final loss within tolerance of "
                                           "the target")
    tag = re.search(r"netns (flodl-lab-\d+-\d+)-ctl", res.stdout)
    assert tag is not None, res.stdout
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag.group(1) not in listed


def test_demo_netns_without_the_lab_says_why_in_one_line_and_exits_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A machine without the network lab (no root, no ``ip``) is no fault of the command line:
    it read ``argument --netns: the network lab needs root (...)``, exit 2, a usage error; it is
    exit 1, as the README's table has a run that cannot start for a reason outside the command
    line, and the line says how to run the demo without the lab."""
    from flodl_proto import cli
    from flodl_proto.commands import demo

    asked: list[tuple[str, ...]] = []

    def reason(tools: tuple[str, ...]) -> str:
        asked.append(tools)
        return "the network lab needs root (network namespaces, veth)"

    monkeypatch.setattr(demo, "unavailable_reason", reason)
    assert cli.main(["demo", "--netns", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("flodl-proto demo: error: the network lab needs root (network namespaces, "
                   "veth); run without --netns to train the same cluster on loopback\n")
    assert asked == [("ip",)]  # the demo sets no tc or nftables rule


def _ev(counts: list[int]) -> dict[int, dict[str, object]]:
    return {0: {"counts": counts}, 1: {"counts": counts}}


def test_model_rounds_number_the_reduces_as_the_demo_counts_its_rounds() -> None:
    """Each demo round is a Control gather (protocol round 2k-2 when none was skipped), then a
    Model reduce unless every rank was idle; the map stops at the first missing round."""
    rounds = {1: _ev([1, 2]), 2: _ev([0, 0]), 3: _ev([0, 3]), 5: _ev([1, 1])}
    assert model_rounds(rounds) == {1: 1, 4: 3}
    assert model_rounds({}) == {}
    assert model_rounds({k: _ev([1, 1]) for k in range(1, 6)}) == {1: 1, 3: 2, 5: 3, 7: 4, 9: 5}


class _ReadLog(dict[int, dict[int, object]]):
    """The demo's rounds, noting every round looked up."""

    def __init__(self, rounds: dict[int, dict[int, object]]) -> None:
        super().__init__(rounds)
        self.read: list[int] = []

    def get(self, key: int, default: object = None) -> object:  # type: ignore[override]
        self.read.append(key)
        return super().get(key, default)

    def __getitem__(self, key: int) -> dict[int, object]:
        self.read.append(key)
        return super().__getitem__(key)


def test_rounds_through_reads_only_the_rounds_after_those_already_complete() -> None:
    """The demo's progress scanned every round from 1 at each ``round`` event: after a thousand
    rounds it fell 20 s behind its cluster, and a relay killed then was reported that late."""
    from flodl_proto.commands.demo import rounds_through

    both = {0: {}, 1: {}}
    rounds = _ReadLog({k: dict(both) for k in range(1, 1001)} | {1001: {0: {}}})
    assert rounds_through(rounds, 2, 998, 100000) == 1000
    assert rounds.read == [999, 1000, 1001]
    assert rounds_through(_ReadLog({}), 2, 0, 10) == 0
    assert rounds_through(_ReadLog({1: {0: {}}, 2: {0: {}}}), 1, 0, 10) == 2  # one rank left
    assert rounds_through(_ReadLog({k: dict(both) for k in range(1, 4)}), 2, 1, 3) == 3


def test_stage_lines_name_the_demo_round_and_fit_80_columns() -> None:
    parts = tuple((label, (11.801 if gap else -0.201) / 1e3, gap) for label, *_, gap in SEGMENTS)
    traced = [RoundStages(r, t / 1e3, parts) for r, t in ((1, 50.0), (3, 39.363), (5, 20.0),
                                                          (7, 39.363), (9, 60.0))]
    lines = stage_lines(traced, {1: 1, 3: 2, 5: 3, 7: 4, 9: 5})
    assert lines[:4] == [
        "round 2's Model reduce, the median of 5 traced: 39.363 ms",
        "from the last rank's send to its reply parsed",
        "rank send" + " " * 34 + "   overlaps",  # no negative time: the stages overlapped
        "rank -> relay (wire, wake-up)" + " " * 14 + "  11.801 ms  30% gap",
    ]
    assert len(lines) == 2 + len(SEGMENTS)
    assert max(len(ln) for ln in lines) == 63  # + the table's frame and first column: <= 80
    assert stage_lines(traced, {}) == []  # no round completed: none is measured
    assert stage_lines([], {}) == []


def test_stage_lines_of_a_stage_of_10_s_and_more_keep_their_columns() -> None:
    """A stage of 12.3 s was ``12300.000 ms``, a character wider than the column: its line
    grew past 63 characters and its ``ms``, share and ``gap`` stood one column right of the
    others'. Its milliseconds keep the column's 8 characters, with fewer decimals."""
    parts = (("rank send", 12.3, False), ("rank -> relay (wire, wake-up)", 0.0125, True),
             ("relay deposits -> HostFrame sent", -0.001, False),
             ("relay -> controller (wire, wake-up)", 1234.5678, True))
    lines = stage_lines([RoundStages(1, 1246.8803, parts)], {1: 1})
    pad = " " * 43
    assert lines == [
        "round 1's Model reduce, the median of 1 traced: 1246880.300 ms",
        "from the last rank's send to its reply parsed",
        ("rank send" + pad)[:43] + "12300.00 ms   1%",
        ("rank -> relay (wire, wake-up)" + pad)[:43] + "  12.500 ms   0% gap",
        ("relay deposits -> HostFrame sent" + pad)[:43] + "   overlaps",
        ("relay -> controller (wire, wake-up)" + pad)[:43] + " 1234568 ms  99% gap"]
    assert {line.index(" ms") for line in lines[2:] if " ms" in line} == {51}
    assert max(len(ln) for ln in lines) <= 63


@pytest.mark.parametrize(("rounds", "first", "lines"), [
    (99_999, 1, ["round 1's Model reduce, the median of 99999 traced: 39.363 ms"]),
    (123_456, 876_544, ["round 876544's Model reduce,",  # 6 digits: 67 characters in one line
                        "the median of 123456 traced: 39.363 ms"]),
    (1_000_000, 8_999_999, ["round 8999999's Model reduce,",
                            "the median of 1000000 traced: 39.363 ms"]),
])
def test_stage_lines_of_round_numbers_of_6_and_7_digits_fit_80_columns(
        rounds: int, first: int, lines: list[str]) -> None:
    """The first line grew past 63 characters with round numbers and counts of 6 digits: it is
    cut after ``Model reduce,`` when it does not fit."""
    parts = (("rank send", 0.010, False),)
    traced = [RoundStages(r, 0.039363, parts) for r in range(rounds)]  # the median: the first
    got = stage_lines(traced, {r: first + r for r in range(rounds)})
    assert got == [*lines, "from the last rank's send to its reply parsed",
                   "rank send" + " " * 34 + "  10.000 ms  25%"]
    assert max(len(ln) for ln in got) <= 63


def test_stage_lines_count_only_the_model_reduces_of_the_rounds_completed() -> None:
    """A run that failed in its demo round 4 after some ranks had parsed that round's Model
    reduce: the trace holds it, and the line read "the median of 4 traced" beside "3 of ...
    completed", its median picked among a round whose times stop at the ranks that got that
    far. The traced rounds of rounds not completed are left out of the median and the count."""
    parts = (("rank send", 0.001, False),)
    traced = [RoundStages(r, t / 1e3, parts) for r, t in ((1, 10.0), (3, 30.0), (5, 20.0),
                                                          (7, 15.0))]
    lines = stage_lines(traced, {1: 1, 3: 2, 5: 3})
    assert lines[0] == "round 3's Model reduce, the median of 3 traced: 20.000 ms"
    rc, lines = _summary(rounds=3, asked=10, partial={4: [0, 2]}, stages=traced,
                         traced={"rank", "relay", "controller"})
    assert rc == 1
    assert " rounds  │ 3 of 10 completed (0 with an idle rank)" in lines
    assert " stages  │ round 3's Model reduce, the median of 3 traced: 20.000 ms" in lines
    # only the Model reduce of the round not completed was traced: said so
    rc, lines = _summary(rounds=3, asked=10, partial={4: [0, 2]}, stages=traced[3:],
                         traced={"rank", "relay", "controller"})
    assert " stages  │ none: no completed round's Model reduce was traced" in lines


def test_demo_accepts_the_outer_optimizers_the_docs_name() -> None:
    """The bounds of ``--outer`` leave the documented values (SlowMo about 1.0 and 0.9, DiLoCo
    about 0.7 and 0.9) and the parser's own examples valid."""
    from flodl_proto.commands._demo_sizes import check_outer
    from flodl_proto.reduce import NesterovMomentum, OuterAvg, SlowMomentum

    assert check_outer(None) is None
    assert isinstance(check_outer("avg"), OuterAvg)
    for text, kind, lr, mu in (("slow-momentum:1.0,0.9", SlowMomentum, 1.0, 0.9),
                               ("nesterov:0.7,0.9", NesterovMomentum, 0.7, 0.9),
                               (" nesterov: 1e-3 , .9 ", NesterovMomentum, 1e-3, 0.9),
                               # the least and the most a 32-bit float holds, as the outer
                               # step runs: 5e-324 (a double's least) is 0 there
                               ("slow-momentum:1.5e-45,0", SlowMomentum, 1.5e-45, 0.0),
                               ("nesterov:3.4e38,0.99", NesterovMomentum, 3.4e38, 0.99)):
        got = check_outer(text)
        assert type(got) is kind and (got.lr, got.mu) == (lr, mu), text


def _summary(*, rounds: int = 3, outer: str | None = None, loss: float = 0.5,
             lab: object = None, kill: tuple[int, int] | None = None,
             asked: int | None = None, final: dict[int, dict[str, str]] | None = None,
             stopped: set[int] | frozenset[int] = frozenset(), started: int = 4,
             relay_rc: dict[str, int | None] | None = None,
             partial: dict[int, list[int]] | None = None,
             finished: dict[str, str] | None = None,
             exited_first: dict[str, int] | None = None,
             rank_rc: dict[int, int] | None = None, hosts: int = 2,
             rank_stderr: dict[int, list[str]] | None = None,
             frozen: str | None = None, problems: list[str] | None = None,
             traced: set[str] | None = None,
             stages: list[RoundStages] | None = None) -> tuple[int, list[str]]:
    """The demo's summary (exit code, lines without trailing blanks) for a healthy run of 4
    ranks on 2 hosts, seed 7, ``rounds`` rounds completed of ``asked`` (default: of
    ``rounds``), every round at ``loss``, every rank the same digest, rendered at 80 columns
    (what rich takes when stdout is no terminal). ``final``: the ranks' last events (default:
    every rank ``done``); ``stopped``: the ranks the demo stopped; ``started``: how many rank
    processes were started (ranks 0..started-1); ``relay_rc``: the relays' exit statuses;
    ``partial``: rounds after those completed that only the ranks listed reported;
    ``finished``: the controller's and relays' ``finished:`` lines; ``exited_first``: the
    members that had exited when the demo stopped its cluster after a failure; ``rank_rc``:
    the exit status of rank processes that did not exit 0; ``hosts``: 2 (ranks 0,1 and 2,3)
    or 1 (all four on one relay); ``rank_stderr``: the stderr lines rank processes left;
    ``frozen``: the member the demo found frozen; ``problems``: the problems the run found;
    ``traced``: the roles that wrote stage records (None: no trace read); ``stages``: the
    rounds traced (default: none)."""
    import argparse
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from flodl_proto.commands import demo

    args = argparse.Namespace(world_size=4, hosts=hosts,
                              rounds=rounds if asked is None else asked,
                              seed=7, bf16=False, outer=outer, protocol_version=2)
    res = demo.Result(controller_rc=0, wall=1.25, lab=lab)  # type: ignore[arg-type]
    res.killed = kill[0] if kill is not None else None
    for k in range(1, rounds + 1):
        res.rounds[k] = {r: {"loss": loss, "digest": "ab" * 32, "t_round": 0.01,
                             "t_sync": 0.005, "steps": 1, "counts": [1] * 4} for r in range(4)}
    for k, ranks in (partial or {}).items():
        res.rounds[k] = {r: dict(res.rounds[1][r]) for r in ranks}
    res.final = {r: {"ev": "done"} for r in range(4)} if final is None else final
    res.stopped_ranks = set(stopped)
    res.relay_rc = dict(relay_rc or {})
    res.finished = dict(finished or {})
    res.exited_first = exited_first
    res.frozen = frozen
    res.traced_roles = traced
    res.stages = list(stages or [])
    res.problems = list(problems or [])
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None, force_terminal=False)
    children = [SimpleNamespace(name=f"rank{r}", stderr=(rank_stderr or {}).get(r, []),
                                proc=SimpleNamespace(returncode=(rank_rc or {}).get(r, 0)))
                for r in range(started)]
    groups = [[0, 1], [2, 3]] if hosts == 2 else [[0, 1, 2, 3]]
    rc = demo.report(args, console, groups, kill, res,
                      SimpleNamespace(children=children))  # type: ignore[arg-type]
    return rc, [line.rstrip() for line in out.getvalue().splitlines()]


def test_demo_summary_rows_are_padded_and_the_target_is_a_line_per_phrase() -> None:
    """Every cell has a blank either side (the first column had none: ``│cluster │``), the
    target row breaks between its phrases (a wrap at the column's width split ``reached│ by 10
    rounds``), and each relay's ranks read as text (the Python list ``[[0, 1], [2, 3]]`` was
    printed)."""
    rc, lines = _summary()
    digest = "ab" * 32
    assert rc == 0
    assert lines == [
        " " * 32 + "flodl-proto demo",
        "         ┃ value",
        "━━━━━━━━━╇" + "━" * 70,
        " cluster │ controller + 2 relays (ranks 0,1; 2,3) + 4 ranks (processes,",
        "         │ loopback TCP, HMAC, protocol v2, f32 wire)",
        " rounds  │ 3 of 3 completed (0 with an idle rank)",
        " round   │ median 10.0 ms, p95 10.0 ms (sync 5.0 / 5.0 ms)",
        " stages  │ not traced",
        " bytes   │ n/a",
        " loss    │ start 11.261441, end 0.500000",
        " optimum │ 0.124941 (closed form); end is +300.189 %",
        " target  │ 0.884165 = max(optimum, in-process 0.884165)",
        "         │ (in-process: the same 3 rounds without the network)",
        "         │ end within 1% of it: ok",
        *(f" rank {r}  │ {digest}" for r in range(4)),
        " wall    │ 1.2 s",
        "OK: every round completed, every rank holds the identical consensus, final loss within "
        "tolerance of the target",
    ]


def test_a_run_that_stopped_early_is_held_to_the_in_process_loss_of_its_completed_rounds() -> None:
    """A run that completed 3 of 100000 rounds takes its target from 3 rounds in-process (the
    loss a healthy cluster has there), not from the 100000 asked for, which were computed after
    the failure for a minute."""
    rc, lines = _summary(asked=100000)
    assert rc == 1
    assert " rounds  │ 3 of 100000 completed (0 with an idle rank)" in lines
    at = lines.index(" target  │ 0.884165 = max(optimum, in-process 0.884165)")
    assert lines[at + 1:at + 3] == [
        "         │ (in-process: the same 3 rounds without the network)",
        "         │ end within 1% of it: ok"]
    assert "FAILED: only 3 of 100000 rounds completed" in lines


def test_a_summary_of_no_round_says_so_without_a_target_or_a_nan_verdict() -> None:
    """A run that completed no round (a relay killed before round 1) showed a target computed
    from 0 rounds (``max(optimum, in-process 11.261441)``: the start loss), ``(in-process: the
    same 0 rounds ...)``, ``end within 1% of it: not met`` and ``FAILED: final loss nan is not
    within 1% of the target``, beside ``end n/a (no round completed)``; and the ranks that did
    not finish as a Python dict."""
    rc, lines = _summary(rounds=0, asked=50, final={}, stopped={0, 1}, relay_rc={"relay0": -9})
    assert rc == 1
    table = lines[lines.index(" rounds  │ 0 of 50 completed (0 with an idle rank)"):]
    assert table[:10] == [
        " rounds  │ 0 of 50 completed (0 with an idle rank)",
        " round   │ n/a",
        " stages  │ not traced",
        " bytes   │ n/a",
        " loss    │ start 11.261441, end n/a (no round completed)",
        " optimum │ 0.124941 (closed form)",
        " target  │ n/a (no round completed)",
        *(f" rank {r}  │ n/a" for r in range(3)),
    ]
    assert [line for line in lines if line.startswith("FAILED: ")] == [
        "FAILED: relay0 was killed by SIGKILL",
        "FAILED: no round completed (0 of 50)",
        "FAILED: ranks that did not finish: rank 0 (stopped by the demo), rank 1 (stopped by "
        "the demo), rank 2 (no report), rank 3 (no report)",
    ]
    assert not any("nan" in line or "in-process" in line for line in lines), lines


def test_the_ranks_that_did_not_finish_read_as_text_with_their_reasons() -> None:
    """Every run that failed, not only one of no round: ``rank R (why)`` in rank order (it was
    ``{0: 'no report', ...}``), the rank's own error when it sent one, ``not started`` for a
    rank whose process the demo never started."""
    final: dict[int, dict[str, str]] = {
        0: {"ev": "done"}, 1: {"ev": "ended", "error": "RemoteTruncatedInput: relay closed"}}
    rc, lines = _summary(rounds=2, asked=10, final=final, started=3)
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED: ")] == [
        "FAILED: only 2 of 10 rounds completed",
        "FAILED: ranks that did not finish: rank 1 (RemoteTruncatedInput: relay closed), rank 2 "
        "(no report), rank 3 (not started)",
    ]


def test_a_member_stopped_by_a_signal_from_elsewhere_is_named_first() -> None:
    """A relay or controller stopped by a SIGTERM the demo did not send exits 0, as on a Ctrl-C
    of its own: the summary named only the rounds missing and the ranks' errors (``controller
    closed connection``), not the member that ended the run. One the demo stopped itself after
    another member's failure is not named, and one stopped after the last round fails nothing."""
    final: dict[int, dict[str, str]] = {
        r: {"ev": "ended", "error": "RemoteTruncatedInput: controller closed connection"}
        for r in range(4)}
    finished = {"relay0": "clean (relay_eof)", "relay1": "clean (stop: stopped by a signal)",
                "controller": "clean (stop: signal)"}
    rc, lines = _summary(rounds=2, asked=10, final=final, finished=finished)
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED: ")][:3] == [
        "FAILED: relay1 was stopped by a signal that the demo did not send (relay1 finished: "
        "clean (stop: stopped by a signal))",
        "FAILED: controller was stopped by a signal that the demo did not send (controller "
        "finished: clean (stop: signal))",
        "FAILED: only 2 of 10 rounds completed",
    ]
    rc, lines = _summary(rounds=2, asked=10, final=final, finished=finished,
                         relay_rc={"relay0": 1}, exited_first={"relay0": 1})
    assert [line for line in lines if line.startswith("FAILED: ")][:2] == [
        "FAILED: relay0 exited with status 1", "FAILED: only 2 of 10 rounds completed"]
    # stopped so after the last round, every rank done: nothing failed
    rc, lines = _summary(rounds=2, finished=finished)
    assert rc == 0 and not [line for line in lines if line.startswith("FAILED: ")]


def test_a_rank_that_died_on_its_own_is_named_with_its_exit_status() -> None:
    """A rank process killed from elsewhere (not ``--kill-rank``) read ``rank 1 (no report)``,
    after the generic lines and among the other ranks' errors that came of it; its status
    names it first. A rank the demo stopped after another failure is not named so."""
    final: dict[int, dict[str, str]] = {
        r: {"ev": "ended", "error": "RemoteTruncatedInput: controller closed connection"}
        for r in (0, 2, 3)}
    rc, lines = _summary(rounds=2, asked=10, final=final, rank_rc={1: -9})
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED: ")] == [
        "FAILED: rank 1 was killed by SIGKILL before its last report",
        "FAILED: only 2 of 10 rounds completed",
        "FAILED: ranks that did not finish: rank 0 (RemoteTruncatedInput: controller closed "
        "connection), rank 1 (killed by SIGKILL), rank 2 (RemoteTruncatedInput: controller "
        "closed connection), rank 3 (RemoteTruncatedInput: controller closed connection)",
    ]
    rc, lines = _summary(rounds=2, asked=10, final=final, rank_rc={1: -15},
                         relay_rc={"relay0": 1}, exited_first={"relay0": 1})
    assert [line for line in lines if line.startswith("FAILED: ")][:2] == [
        "FAILED: relay0 exited with status 1", "FAILED: only 2 of 10 rounds completed"]


def test_demo_summary_fits_the_widest_label_beside_a_whole_digest_in_80_columns() -> None:
    from types import SimpleNamespace

    node = SimpleNamespace
    lab = node(controller=node(address="198.18.0.1", netns="flodl-lab-1-2-c"),
               hosts=[node(address=f"198.18.0.1{h}", netns=f"flodl-lab-1-2-h{h}")
                      for h in range(2)])
    rc, lines = _summary(lab=lab)
    assert rc == 0
    assert " controller │ 198.18.0.1 (netns flodl-lab-1-2-c)" in lines
    assert [line for line in lines if line.startswith(" host ")] == [
        f" host {h}     │ 198.18.0.1{h} (netns flodl-lab-1-2-h{h}): relay + ranks {ranks} on the"
        for h, ranks in enumerate(("0,1", "2,3"))]
    assert [line for line in lines if line.startswith(" rank ")] == [
        f" rank {r}     │ {'ab' * 32}" for r in range(4)]
    assert max(map(len, lines[:-1])) <= 80


def test_demo_fails_a_run_whose_loss_grew_though_the_reference_grew_alike() -> None:
    """An outer step within the bounds can still diverge (``nesterov:5,0.9``: 14.8 after 10
    rounds from 11.26); the target is the same schedule computed in one process, so the run
    matched it and passed: a final loss above the start loss is a failure of its own."""
    from flodl_proto.commands import _demo_worker as worker
    from flodl_proto.commands.controller import parse_outer

    ref = worker.reference_loss(7, 4, 10, outer=parse_outer("nesterov:5,0.9"))
    rc, lines = _summary(rounds=10, outer="nesterov:5,0.9", loss=ref)
    assert rc == 1
    assert f" loss    │ start 11.261441, end {ref:.6f} (above the start: diverged)" in lines
    assert "         │ end within 1% of it: ok" in lines
    assert lines[-1] == (f"FAILED: final loss {ref:.6f} is above the start loss 11.261441: the "
                         "training diverged")


@pytest.mark.parametrize(("loss", "kill", "last"), [
    # an outer step that overflows: the loss is nan, which compared as not above the start
    (float("nan"), None, "FAILED: final loss nan is not a number: the training diverged"),
    # a rank killed: the survivors train on, and their loss grew unchecked (the run passed)
    (20.0, (3, 2), "FAILED: final loss 20.000000 is above the start loss 11.261441: the "
                   "training diverged"),
])
def test_demo_fails_a_diverged_run_whose_loss_is_nan_or_that_lost_a_rank(
        loss: float, kill: tuple[int, int] | None, last: str) -> None:
    rc, lines = _summary(loss=loss, kill=kill)
    assert (rc, lines[-1]) == (1, last)


@pytest.mark.parametrize("columns", ["0", "00", "-5", "abc", "", "４０"])
def test_a_columns_that_is_no_width_is_ignored(columns: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """rich took ``COLUMNS=0`` as a width of 0 columns: the demo printed nothing at all, not
    even its verdict; a ``COLUMNS`` that is no whole number above 0 is now ignored, as by a
    terminal (80 columns when the output is no terminal)."""
    import io

    from flodl_proto.commands._output import rich_console

    monkeypatch.setenv("COLUMNS", columns)
    out = io.StringIO()
    console = rich_console(file=out)
    console.print("OK: the verdict")
    assert (console.width, out.getvalue()) == (80, "OK: the verdict\n")


def test_a_columns_that_is_a_width_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from flodl_proto.commands._output import rich_console

    monkeypatch.setenv("COLUMNS", "40")
    assert rich_console(file=io.StringIO()).width == 40


def test_cluster_kernels_take_numpy_for_a_bf16_run_too_short_for_the_compiled_ones() -> None:
    from flodl_proto.commands._demo_sizes import JIT_WORTH, cluster_kernels, payload_values

    assert JIT_WORTH == 1 << 28 and payload_values(1.0) == 1 << 18
    assert cluster_kernels(True, 1.0, 40) == "numpy"  # the default bf16 demo
    assert cluster_kernels(True, 1.0, 1023) == "numpy"  # 2**28 - 2**18 element-rounds
    assert cluster_kernels(True, 1.0, 1024) is None  # 2**28: worth loading
    assert cluster_kernels(True, 64.0, 40) is None
    assert cluster_kernels(True, 0.0, 1_000_000) == "numpy"  # the parameters alone
    assert cluster_kernels(False, 1.0, 40) is None  # f32: no bf16 kernel runs
    assert cluster_kernels(False, 4096.0, 1_000_000) is None


#: a sitecustomize that records, at each process's exit, its kernel variable and whether it
#: loaded numba or ml_dtypes
_RECORD_AT_EXIT = """
import atexit, os, sys
def _record():
    with open(os.environ["DEMO_TEST_RECORD"], "a") as f:
        f.write(repr((sys.argv[1:3], os.environ.get("FLODL_PROTO_KERNELS"),
                      "numba" in sys.modules, "ml_dtypes" in sys.modules)) + "\\n")
atexit.register(_record)
"""


@pytest.mark.parametrize("given", [None, "auto"])
def test_a_short_bf16_demo_runs_its_cluster_on_the_numpy_kernels(
        given: str | None, tmp_path: Path) -> None:
    """The default bf16 demo's controller, relay and rank run the NumPy bf16 kernels, so none
    loads numba (nor ml_dtypes): each spent about a second of CPU more than an f32 run's for
    them. A FLODL_PROTO_KERNELS set where the demo runs reaches its cluster as it is."""
    import ast

    (tmp_path / "sitecustomize.py").write_text(_RECORD_AT_EXIT)
    record = tmp_path / "record.txt"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                       os.environ.get("PYTHONPATH")])),
           "DEMO_TEST_RECORD": str(record)}
    env["FLODL_PROTO_KERNELS"] = given or ""  # empty: not set (auto)
    res = _demo("--bf16", "--world-size", "1", "--hosts", "1", "--rounds", "2", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [ast.literal_eval(line) for line in record.read_text().splitlines()]
    children = [r for r in rows if r[0][:1] != ["demo"]]
    assert len(rows) == 4 and len(children) == 3, rows  # the demo, controller, relay, rank
    for _, kernels, numba, ml_dtypes in children:
        assert (kernels, ml_dtypes) == (given or "numpy", False), rows
        if given is None:
            assert not numba, rows


def test_survivors_past_the_last_complete_round_are_named_as_text() -> None:
    """After a kill, survivors that reported rounds past the last one every survivor completed
    are a failure naming them as text (it printed the Python list ``[0, 2]``)."""
    rc, lines = _summary(rounds=2, asked=5, kill=(1, 2), partial={3: [0, 2], 4: [2]})
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED")] == [
        "FAILED: ranks 0, 2 completed rounds past 2"]


def test_a_member_stopped_by_a_signal_stops_the_cluster_as_one_that_failed() -> None:
    """The watch of the controller and relays took only a failure status as a failure: a
    controller stopped by a SIGTERM from elsewhere after its listening line exits 0, and its
    relays retried its address for 30 s before the summary came. Its ``finished:`` line, read
    as it exits, makes it a failed member; a relay that ended cleanly otherwise is not one, and
    its stats are kept for the summary."""
    import queue
    from types import SimpleNamespace

    from flodl_proto.commands import demo

    def member(name: str, rc: int | None, *lines: str) -> SimpleNamespace:
        q: queue.Queue[tuple[str, str | None]] = queue.Queue()
        for line in lines:
            q.put((name, line))
        if rc is not None:
            q.put((name, None))
        return SimpleNamespace(name=name, proc=SimpleNamespace(poll=lambda: rc), lines=q,
                               out_ended=False)

    cluster = SimpleNamespace(children=[
        member("controller", 0, "round 1 ...", "controller finished: clean (stop: signal)"),
        member("relay0", 0, "relay stats from_ranks=1 to_ranks=2 upstream_out=3 upstream_in=4 "
               "host_frames=5 broadcasts=6", "relay finished: clean (relay_eof)"),
        member("relay1", None),
        member("relay2", 1),
        member("rank0", 1),
    ])
    res = demo.Result()
    assert demo.failed_members(cluster, res) == ["controller", "relay2"]  # type: ignore[arg-type]
    assert res.finished == {"controller": "clean (stop: signal)", "relay0": "clean (relay_eof)"}
    assert res.relay_stats == {"relay0": {"from_ranks": 1, "to_ranks": 2, "upstream_out": 3,
                                          "upstream_in": 4, "host_frames": 5, "broadcasts": 6}}
    # the summary's read after the ranks left: a member whose end was read returns at once,
    # where it waited its 2 s for a line that would not come
    relay0 = cluster.children[1]
    assert relay0.out_ended
    assert demo.read_last_lines(relay0, res, 0.0)  # type: ignore[arg-type]


def test_a_private_members_stdout_keeps_only_its_first_and_last_lines() -> None:
    """The controller's stdout (a line per round) goes to a queue the demo reads at the start
    and the end only: the queue takes its first line and the lines read at the end (a relay's
    stats, a ``finished:`` line), so a long run's round lines do not pile up in memory; a
    shared queue (the ranks') takes every line."""
    import io
    import queue

    from flodl_proto.commands.demo import _Cluster

    text = ("listening on 127.0.0.1:7000\n"
            + "".join(f"round {k} done\n" for k in range(1, 1001))
            + "relay stats from_ranks=1\ncontroller finished: clean (stop: signal)\n")
    for private, want in ((True, ["listening on 127.0.0.1:7000", "relay stats from_ranks=1",
                                  "controller finished: clean (stop: signal)", None]),
                          (False, [*text.splitlines(), None])):
        q: queue.Queue[tuple[str, str | None]] = queue.Queue()
        _Cluster._pump("controller", io.StringIO(text), q, private)
        got = []
        while not q.empty():
            got.append(q.get_nowait()[1])
        assert got == want, private


def test_the_cluster_row_of_one_relay_says_relay() -> None:
    """One relay reads ``1 relay`` (it read ``1 relays``)."""
    rc, lines = _summary(hosts=1)
    assert rc == 0
    assert lines[3] == (" cluster │ controller + 1 relay (ranks 0,1,2,3) + 4 ranks (processes, "
                        "loopback")


class _FakeProc:
    """A member's process as :func:`~flodl_proto.commands.demo._drive` reads it: ``status`` is
    what ``poll`` returns (None: running)."""

    def __init__(self, status: int | None = None, pid: int = 0) -> None:
        self.status = status
        self.pid = pid

    def poll(self) -> int | None:
        return self.status

    def wait(self, timeout: float | None = None) -> int | None:
        return self.status


class _FakeCluster:
    """A cluster whose members are never started: every member listens at once, and the
    ranks' events are the ones the test puts on :attr:`events`."""

    def __init__(self) -> None:
        import queue

        self.children: list[Any] = []
        self.stopping = False
        self.stops = 0
        self.events: queue.Queue[tuple[str, str | None]] = queue.Queue()

    def spawn(self, name: str, args: list[str], **kw: object) -> Any:
        import queue
        from types import SimpleNamespace

        lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        if not name.startswith("rank"):
            lines.put((name, "listening on 127.0.0.1:1"))
        child = SimpleNamespace(name=name, proc=_FakeProc(pid=-1 - len(self.children)),
                                lines=lines, out_ended=False, stderr=[])
        self.children.append(child)
        return child

    @staticmethod
    def first_line(child: Any, timeout: float) -> str:
        return str(child.lines.get_nowait()[1])

    def member(self, name: str) -> Any:
        return next(c for c in self.children if c.name == name)

    def exit(self, name: str, status: int) -> None:
        """Member ``name`` exits with ``status``; its stdout ends."""
        c = self.member(name)
        c.proc.status = status
        c.lines.put((name, None))

    def stop(self) -> None:
        """SIGTERM to every member still running: a rank ends by it (-15), the controller and
        a relay stop cleanly (0)."""
        self.stopping = True
        self.stops += 1
        for c in self.children:
            if c.proc.status is not None:
                continue
            if c.name.startswith("rank"):
                c.proc.status = -15
                self.events.put((c.name, None))
            else:
                self.exit(c.name, 0)

    def kill(self, child: Any) -> None:
        raise AssertionError("no rank is killed here")


def _drive_fake(cluster: _FakeCluster, stop: Any) -> tuple[Any, str]:
    """Run the demo's :func:`_drive` (2 ranks, 2 relays) against ``cluster`` until it returns
    or raises; the result it collected and what it printed."""
    import argparse
    import io

    from rich.console import Console

    from flodl_proto.commands import demo

    args = argparse.Namespace(world_size=2, hosts=2, rounds=10, seed=7, bf16=False, outer=None,
                              protocol_version=2, payload_mib=0.0, log_level="WARNING",
                              no_progress=True)
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None, force_terminal=False)
    res = demo.Result()
    with contextlib.suppress(RuntimeError):
        demo._drive(args, console, cluster, [[0], [1]], None, res, stop)  # type: ignore[arg-type]
    return res, out.getvalue()


class _OnFirstCheck(threading.Event):
    """The demo's stop flag; ``then`` runs right after the loop's first check of it (what
    happened to the cluster between that check and the watch)."""

    def __init__(self, then: Callable[[], None]) -> None:
        super().__init__()
        self.then = then
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        was = super().is_set()
        if self.checks == 1:
            self.then()
        return was


def test_a_member_killed_while_ranks_run_is_named_with_its_signal() -> None:
    """The watch's line gave the exit status as Python reports it, ``relay0 exited with -9
    while ranks ran``: it names the signal, and a plain failure's status as a status."""
    for status, how in ((-9, "was killed by SIGKILL"), (3, "exited with status 3")):
        cluster = _FakeCluster()
        cluster.events.put(("rank0", '{"ev": "ready"}'))
        res, out = _drive_fake(cluster, _OnFirstCheck(
            lambda c=cluster, rc=status: c.exit("relay0", rc)))
        assert out.splitlines() == [
            "controller listening on 127.0.0.1:1 (relay <-> controller traffic: decode --leg mux)",
            "relay0 listening on 127.0.0.1:1 for ranks 0 (rank <-> relay traffic: decode --leg "
            "loopback)",
            "relay1 listening on 127.0.0.1:1 for ranks 1 (rank <-> relay traffic: decode --leg "
            "loopback)",
            f"relay0 {how} while ranks ran: stopping the cluster"]
        assert res.exited_first == {"relay0": status}
        assert res.stopped_ranks == {0, 1} and cluster.stops == 1


def test_the_watch_stands_down_once_a_signal_stop_has_begun() -> None:
    """A signal that stops the demo sets its stop flag and sends SIGTERM to every member; a
    member that exited from it between the loop's check of the flag and its watch was taken for
    a failure: ``relay0 ... while ranks ran: stopping the cluster`` came before the interrupted
    line. The signal arrives here right after the loop's first check of the flag."""
    cluster = _FakeCluster()

    def handler() -> None:  # the demo's: note the stop, then stop the cluster
        stop.set()
        cluster.exit("relay0", -15)  # ended by the SIGTERM before it could handle it
        cluster.stop()

    stop = _OnFirstCheck(handler)
    res, out = _drive_fake(cluster, stop)
    assert stop.checks == 2  # the loop came round once more and saw the stop
    assert "while ranks ran" not in out, out
    assert res.exited_first is None and res.stopped_ranks == set()
    assert cluster.stops == 1  # the handler's stop only


def test_exit_words_name_the_signal_or_the_status() -> None:
    """A member's exit status read as Python gives it (``exited with -9``): a signal is named,
    a status is called one."""
    from flodl_proto.commands._demo_report import exit_words

    assert exit_words(-9) == "was killed by SIGKILL"
    assert exit_words(-15) == "was killed by SIGTERM"
    assert exit_words(-signal.SIGRTMIN - 1) == f"was killed by signal {signal.SIGRTMIN + 1}"
    assert exit_words(3) == "exited with status 3"
    assert exit_words(0) == "exited with status 0"


def test_exit_reason_and_member_name_word_a_member_as_the_summary_does() -> None:
    """In parentheses after a rank the words read ``(was killed by SIGKILL)``; a rank's
    process name read ``rank2`` where the summary says ``rank 2``."""
    from flodl_proto.commands._demo_report import exit_reason, member_name

    assert exit_reason(-9) == "killed by SIGKILL"
    assert exit_reason(3) == "exited with status 3"
    assert [member_name(n) for n in ("rank2", "rank10", "relay0", "controller", "ranks")] == [
        "rank 2", "rank 10", "relay0", "controller", "ranks"]


def test_protocol_places_map_every_protocol_round_to_its_demo_round_and_step() -> None:
    """Two protocol rounds a demo round (one when the whole cohort was idle), and the demo
    round no rank reported, where a rank that failed was."""
    from flodl_proto.commands._demo_report import GATHER, MODEL, protocol_places

    assert protocol_places({1: _ev([1, 2]), 2: _ev([0, 0]), 3: _ev([0, 3]), 5: _ev([1, 1])}) == {
        1: (1, GATHER), 2: (1, MODEL), 3: (2, GATHER), 4: (3, GATHER), 5: (3, MODEL),
        6: (4, GATHER), 7: (4, MODEL)}
    assert protocol_places({}) == {1: (1, GATHER), 2: (1, MODEL)}


def test_a_ranks_error_counts_the_demo_rounds_as_the_summary_does() -> None:
    """The ranks' errors counted protocol rounds, two a demo round, where the summary counts
    demo rounds: ``only 2 of 10 rounds completed`` above ``no averaged frame within 60s (round
    6)``. They name the demo round and its step; a text that names no round, or an event
    without its protocol round, is kept as it is."""
    from flodl_proto.commands._demo_report import protocol_places, rank_error

    timeout = "TimeoutError: cpu_reduce: no averaged frame within 60s (round {})"
    final: dict[int, dict[str, Any]] = {
        0: {"ev": "ended", "error": timeout.format(6), "protocol_round": 6},
        1: {"ev": "ended", "error": "ConnectionError: cpu_reduce: lost the relay while waiting "
            "for round 5's consensus (reset)", "protocol_round": 5},
        2: {"ev": "ended", "error": "RemoteTruncatedInput: relay closed", "protocol_round": 6},
        3: {"ev": "ended", "error": timeout.format(6)}}
    rc, lines = _summary(rounds=2, asked=10, final=final)  # type: ignore[arg-type]
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED: ")] == [
        "FAILED: only 2 of 10 rounds completed",
        "FAILED: ranks that did not finish: rank 0 (TimeoutError: cpu_reduce: no averaged frame "
        "within 60s (round 3's Model reduce)), rank 1 (ConnectionError: cpu_reduce: lost the "
        "relay while waiting for round 3's count-gather's consensus (reset)), rank 2 "
        "(RemoteTruncatedInput: relay closed), rank 3 (TimeoutError: cpu_reduce: no averaged "
        "frame within 60s (round 6))"]
    places = protocol_places({1: _ev([1, 1])})
    assert rank_error({"error": "round 3 failed: round 30, round 3x", "protocol_round": 3},
                      places) == "round 2's count-gather failed: round 30, round 3x"
    assert rank_error({"error": "(round 9)", "protocol_round": 9}, places) == "(round 9)"


def test_the_stderr_tails_say_their_rounds_are_the_protocols() -> None:
    """The processes' log lines number protocol rounds, below a summary that counts demo
    rounds: a line above them says so."""
    rc, lines = _summary(rounds=2, asked=10, rank_rc={1: 1},
                         rank_stderr={1: ["2026-01-01 WARNING x: round 5 failed"]})
    assert rc == 1
    i = lines.index("rank 1 stderr:")
    assert lines[i - 1:i + 2] == [
        "the last log lines of the processes (their round numbers count protocol rounds: two "
        "per demo round, its count-gather then its Model reduce):",
        "rank 1 stderr:", "    2026-01-01 WARNING x: round 5 failed"]


def test_a_members_output_in_the_summary_is_shown_not_played_on_the_terminal() -> None:
    """The stderr tails and the problems quoting a member's text were printed as they were:
    a colour code, a bell or a direction override played on the terminal, and a ``[...]`` in
    a rank's error was read as markup (``[/red]`` failed the summary). They are shown as
    ``#xNN``, as ``conform`` shows a target's output, and the brackets as they are."""
    final: dict[int, dict[str, str]] = {
        r: {"ev": "ended", "error": "OSError: [/red] \x1b[2J\u202eboom"} for r in range(4)}
    rc, lines = _summary(rounds=2, asked=10, rank_rc={1: 1}, final=final,
                         rank_stderr={1: ["\x1b[31mred\x07 \u2066x\u2069 \u200f[bold]"]})
    assert rc == 1
    assert not any(c in line for line in lines for c in "\x1b\x07\u202e\u2066\u2069\u200f")
    i = lines.index("rank 1 stderr:")
    assert lines[i + 1] == "    #x1B[31mred#x07 #x2066x#x2069 #x200F[bold]"
    assert lines[lines.index("FAILED: only 2 of 10 rounds completed") + 1] == (
        "FAILED: ranks that did not finish: rank 0 (OSError: [/red] #x1B[2J#x202Eboom), rank 1 "
        "(OSError: [/red] #x1B[2J#x202Eboom), rank 2 (OSError: [/red] #x1B[2J#x202Eboom), rank 3 "
        "(OSError: [/red] #x1B[2J#x202Eboom)")


def test_a_rank_that_fails_reports_the_protocol_round_it_was_in(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The rank's ``ended`` event carries the protocol round its error's text names (the
    client's rounds done, plus one), for the summary to word it as a demo round."""
    import json

    import numpy as np

    from flodl_proto.commands import _demo_worker as worker

    class Client:
        """Round 1's count-gather passes; its Model reduce times out."""

        rounds = 0
        last_reply = None
        bytes_sent = bytes_received = 0

        @classmethod
        def connect(cls, *args: object, **kw: object) -> Client:
            return cls()

        def gather_counts(self, n: float) -> Any:
            self.rounds += 1
            return np.array([1.0, 1.0])

        def all_reduce_scaled(self, *args: object, **kw: object) -> Any:
            raise TimeoutError(f"cpu_reduce: no averaged frame within 60s (round "
                               f"{self.rounds + 1})")

        def close(self) -> None:
            pass

    monkeypatch.setattr(worker, "RankClient", Client)
    cfg = {"rank": 1, "world_size": 2, "seed": 7, "rounds": 3, "relay": "127.0.0.1:1",
           "version": 2}
    assert worker._train(cfg, bytes(16)) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events == [{"ev": "ready", "rank": 1}, {
        "ev": "ended", "rank": 1, "protocol_round": 2,
        "error": "TimeoutError: cpu_reduce: no averaged frame within 60s (round 2)"}]


def test_a_frozen_rank_is_named_as_every_other_line_names_a_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch's line named a frozen rank by its process name, ``rank1 was frozen``, where
    every other line says ``rank 1``; the result keeps which member it was."""
    from flodl_proto.commands import demo

    cluster = _FakeCluster()
    cluster.events.put(("rank0", '{"ev": "ready"}'))
    monkeypatch.setattr(demo, "_FROZEN", 0.0)
    rank1 = -5  # the fake pid of the fifth member started (controller, 2 relays, 2 ranks)
    monkeypatch.setattr(demo, "process_state", lambda pid: "T" if pid == rank1 else "S")
    res, out = _drive_fake(cluster, threading.Event())
    why = ("rank 1 was frozen (stopped by SIGSTOP or SIGTSTP, process state T) for 0s while "
           "ranks ran")
    assert cluster.member("rank1").proc.pid == rank1
    assert out.splitlines()[-1] == f"{why}: stopping the cluster"
    assert res.problems == [why] and res.frozen == "rank1"


def test_a_frozen_rank_is_named_among_the_ranks_that_did_not_finish() -> None:
    """A rank frozen while the others waited for it read ``stopped by the demo`` like them,
    and a run with ``--kill-rank`` had no line for the ranks the demo stopped at all; the
    frozen rank's reason says it was frozen."""
    why = ("rank 2 was frozen (stopped by SIGSTOP or SIGTSTP, process state T) for 5s while "
           "ranks ran")
    rc, lines = _summary(rounds=2, asked=10, final={}, stopped={0, 1, 2, 3}, frozen="rank2",
                         problems=[why], exited_first={})
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED: ")] == [
        f"FAILED: {why}",
        "FAILED: only 2 of 10 rounds completed",
        "FAILED: ranks that did not finish: rank 0 (stopped by the demo), rank 1 (stopped by "
        "the demo), rank 2 (frozen, then stopped by the demo), rank 3 (stopped by the demo)"]
    rc, lines = _summary(rounds=2, asked=10, final={}, stopped={0, 2, 3}, frozen="rank2",
                         problems=[why], exited_first={}, kill=(1, 2))
    assert rc == 1
    assert [line for line in lines if line.startswith("FAILED: ")] == [
        f"FAILED: {why}",
        "FAILED: ranks that did not finish: rank 0 (stopped by the demo), rank 2 (frozen, then "
        "stopped by the demo), rank 3 (stopped by the demo)"]


def test_a_summary_without_a_stage_breakdown_says_why() -> None:
    """A run the demo stopped for a failure read ``stages  not traced``, though every process
    traced its rounds: it says the run stopped before a measured round, or that the ranks'
    records were lost, whichever is true."""
    def stages_row(lines: list[str]) -> list[str]:
        i = next(i for i, line in enumerate(lines) if line.startswith(" stages  │"))
        return [lines[i], *(line for line in lines[i + 1:i + 3] if line.startswith("    "))]

    _, lines = _summary(rounds=0, asked=50, final={}, stopped={0, 1, 2, 3},
                         traced={"relay", "controller"})
    assert stages_row(lines) == [" stages  │ none: the run stopped before a measured round"]
    _, lines = _summary(rounds=3, asked=50, final={}, stopped={0, 1, 2, 3},
                         traced={"relay", "controller"})
    assert stages_row(lines) == [" stages  │ none: the ranks' stage records were lost",
                                 "         │ (a rank writes them as it ends; a SIGKILL skips "
                                 "that)"]
    _, lines = _summary(rounds=3, traced={"rank", "relay", "controller"})
    assert stages_row(lines) == [
        " stages  │ none: no round was traced from a rank's send to its reply"]
    _, lines = _summary(rounds=3)  # no trace read (it was unreadable: a problem says so)
    assert stages_row(lines) == [" stages  │ not traced"]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_rank_stopped_by_sigterm_writes_its_stage_records_first(tmp_path: Path) -> None:
    """The demo stops its ranks with SIGTERM after a failure; a rank's stage records, written
    at its exit, were lost with it. They are written, and the rank still ends by SIGTERM."""
    trace = tmp_path / "stages.tsv"
    code = ("import time\n"
            "from flodl_proto.commands import _demo_worker as w\n"
            "from flodl_proto.runner import stages\n"
            "w.keep_stages_on_sigterm()\n"
            "stages.mark('rank', 0, 'send_start')\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "FLODL_STAGE_TRACE": str(trace)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.terminate()
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    from flodl_proto.runner.stages import read_trace

    assert [(r.role, r.pid, r.round, r.stage) for r in read_trace(trace)] == [
        ("rank", proc.pid, 0, "send_start")]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_run_stopped_for_a_failure_shows_the_stages_it_traced() -> None:
    """The controller frozen mid-run: the demo stops its cluster with SIGTERM, and its summary
    read ``stages  not traced`` after hundreds of rounds, the ranks' records lost with them
    (every rank waited for the controller). It shows the breakdown of the rounds traced until
    the stop."""
    with marked_demo("--rounds", "100000", "--payload-mib", "0", "--log-level", "INFO",
                     env={"COLUMNS": "200"}) as (proc, marker):
        assert proc.stderr is not None
        for line in proc.stderr:  # protocol round 3 scattered: every rank sent its part,
            # so every rank completed demo round 1 (its rounds 1 and 2, or 1 alone if idle)
            if line.startswith("[controller] ") and " controller: protocol round 3 " in line:
                break
        running = wait_for_members(proc, marker, 7, 180.0)
        assert len(running) == 7, proc.communicate()
        for pid in running:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"flodl_proto.cli\0controller\0" in f.read():
                    os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert "FAILED: controller was frozen" in out, (out, err)
    row = next(line for line in out.splitlines() if line.startswith(" stages "))
    assert re.fullmatch(r" stages +│ round \d+'s Model reduce, the median of \d+ traced: "
                        r"[0-9.]+ ms *", row), (out, err)


def test_the_watch_counts_a_member_frozen_only_while_it_stays_stopped() -> None:
    """A member stopped by SIGSTOP held every round, and the demo gave up only after 60 s
    without an event. One seen stopped (``T``) at every look for the limit is frozen; a
    debugger's stop (``t``), a look that finds it running, or a pause of the demo itself
    between two looks (a Ctrl-Z stops it with its cluster) starts the count again."""
    from flodl_proto.commands.demo import FrozenWatch

    w = FrozenWatch(limit=1.0, gap=0.5)
    looks = [({"controller": "S", "relay0": "T", "relay1": "t"}, 0.0, None),
             ({"controller": "S", "relay0": "T", "relay1": "t"}, 0.4, None),
             ({"controller": "S", "relay0": "R", "relay1": "t"}, 0.8, None),  # ran: again
             ({"controller": "T", "relay0": "T", "relay1": "t"}, 1.2, None),
             ({"controller": "T", "relay0": "T", "relay1": "t"}, 1.6, None),
             ({"controller": "T", "relay0": "T", "relay1": "t"}, 2.0, None),
             ({"controller": "T", "relay0": "T", "relay1": "t"}, 2.2, "controller"),
             ({"relay0": "T", "relay1": None}, 2.4, "relay0")]
    for states, now, frozen in looks:
        assert w.look(states, now) == frozen, (states, now)
    w = FrozenWatch(limit=1.0, gap=0.5)
    assert w.look({"relay0": "T"}, 0.0) is None
    assert w.look({"relay0": "T"}, 0.4) is None
    assert w.look({"relay0": "T"}, 100.0) is None  # the demo was held up: its cluster too
    assert w.look({"relay0": "T"}, 100.4) is None
    assert w.look({"relay0": "T"}, 100.8) is None
    assert w.look({"relay0": "T"}, 101.0) == "relay0"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_process_state_reads_a_stopped_process_as_t() -> None:
    from flodl_proto.commands.demo import process_state

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_state(proc.pid) in ("R", "S", "D")
        os.kill(proc.pid, signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)  # returns once it has stopped
        assert process_state(proc.pid) == "T"
    finally:
        proc.kill()
        proc.wait()
    assert process_state(proc.pid) is None


def test_a_frozen_member_stops_the_cluster_before_the_no_progress_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch sees the member stopped and stops the cluster, naming it, where the demo
    waited out its 60 s without an event; the summary names it first."""
    from flodl_proto.commands import demo

    cluster = _FakeCluster()
    cluster.events.put(("rank0", '{"ev": "ready"}'))
    monkeypatch.setattr(demo, "_FROZEN", 0.0)
    relay0 = -2  # the fake pid of the second member started
    monkeypatch.setattr(demo, "process_state", lambda pid: "T" if pid == relay0 else "S")
    res, out = _drive_fake(cluster, threading.Event())
    why = ("relay0 was frozen (stopped by SIGSTOP or SIGTSTP, process state T) for 0s while "
           "ranks ran")
    assert out.splitlines()[-1] == f"{why}: stopping the cluster"
    assert cluster.member("relay0").proc.pid == relay0
    assert res.problems == [why] and res.exited_first == {}
    assert res.stopped_ranks == {0, 1} and cluster.stops == 1


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_the_demos_stop_ends_a_member_stopped_by_a_signal_with_its_sigterm() -> None:
    """A member stopped by SIGSTOP kept the demo's SIGTERM pending: it ended only by the
    SIGKILL of :meth:`_Cluster.close`, 2 s later (15 s more when the demo first waited for the
    relays to leave after the ranks). The stop sends SIGCONT after the SIGTERM."""
    from flodl_proto.commands.demo import _Cluster

    cluster = _Cluster("00" * 16)
    try:
        child = cluster.spawn("relay0", [], private=True,
                              wrap=_member("import time; time.sleep(60)"))
        os.kill(child.proc.pid, signal.SIGSTOP)
        os.waitpid(child.proc.pid, os.WUNTRACED)  # returns once it has stopped
        cluster.stop()
    finally:
        cluster.close(grace=0.0)
    assert child.proc.returncode == -signal.SIGTERM


def test_the_no_progress_rule_does_not_count_a_pause_of_the_demo_itself() -> None:
    """A Ctrl-Z stops the demo with its cluster while the monotonic clock runs on: after one
    of more than 60 s, the demo's first look at its clock after ``fg`` gave up (``no progress
    for 60s``) before any member had run again. A gap between two reads of the clock longer
    than the loop ever takes is not counted; a cluster silent while the demo runs still is."""
    from flodl_proto.commands.demo import StallClock

    clock = StallClock(0.0, limit=10.0, gap=1.0)
    assert not clock.stalled(0.5)
    assert not clock.stalled(100.5)  # held up for 100 s: not counted
    for k in range(1, 23):  # a read every 0.5 s, no event: 10 s counted at 110.0
        now = 100.5 + k * 0.5
        assert clock.stalled(now) == (now > 110.0), now
    clock = StallClock(0.0, limit=10.0, gap=1.0)
    for k in range(1, 21):
        assert not clock.stalled(k * 0.5)
    clock.event(10.0)
    assert not clock.stalled(30.0)  # held up 20 s after the event
    for k in range(1, 23):
        now = 30.0 + k * 0.5
        assert clock.stalled(now) == (now > 40.0), now
    clock = StallClock(0.0, limit=10.0, gap=1.0)  # a silent cluster, the demo running
    looks = [clock.stalled(k * 0.5) for k in range(1, 23)]  # a read every 0.5 s
    assert looks == [False] * 20 + [True, True]  # from 10.5 s

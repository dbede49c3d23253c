"""The benchmarks' verdicts: their exit code follows the verdict line (1 when a target is
missed), and ``--no-verdict`` exits 0 for exploration. Nothing here asserts on a duration: the
round bench's timing inputs are replaced by fixed figures, the codec bench runs tiny and only the
agreement between its verdict line and its exit code is checked."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the scripts import their shared helpers (bench/_cli.py) as run: ``python bench/X.py``
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


RATES = (1e9, 2e9, 1e9, 2e9, 1e9, 4e9)


def _fake(monkeypatch: pytest.MonkeyPatch, rb: ModuleType, times: Any,
          others: list[float] | None = None) -> list[tuple[int, int, str]]:
    """Replace everything round.py times or samples by fixed figures: rates, gloo, the quiet
    wait, the CPU samples (``others``: other processes' cores per run, in order; None: no
    /proc) and the cluster (``times(world, nbytes, dtype, floor)`` -> round times). Returns the
    list of configurations run."""
    rates = rb.Rates(*RATES)
    monkeypatch.setattr(rb, "measure_rates", lambda: rates)
    monkeypatch.setattr(rb, "gloo_round", lambda *a: None)
    monkeypatch.setattr(rb, "wait_quiet", lambda *a: None)
    monkeypatch.setattr(rb.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    runs: list[tuple[int, int, str]] = []
    busy = list(others or [])
    monkeypatch.setattr(rb, "cpu_sample", lambda: None)
    if others is not None:
        monkeypatch.setattr(rb, "others_cores", lambda a, b: busy.pop(0))

    def run_cluster(world: int, hosts: Any, nbytes: int, dtype: str, *a: Any) -> Any:
        runs.append((world, nbytes, dtype))
        floor, _ = rb.floor_seconds(world, hosts, nbytes, dtype, rates, 2)
        return rb.ClusterRun(list(times(world, nbytes, dtype, floor)), [],
                             {"controller": 40 << 10, "relay": 50 << 10, "rank": 60 << 10},
                             {"controller": 0.4e-3, "relay": 0.5e-3, "rank": 0.25e-3})

    monkeypatch.setattr(rb, "run_cluster", run_cluster)
    return runs


@pytest.mark.parametrize(("size", "ratio", "extra", "code", "verdict"), [
    ("64m", 1.2, [], 0, "target >= 64 MiB: median <= 1.25 x floor: met (1 of 1 rows; worst 1.20)"),
    ("256m", 1.25, [], 0,
     "target >= 64 MiB: median <= 1.25 x floor: met (1 of 1 rows; worst 1.25)"),
    ("64m", 1.3, [], 1,
     "target >= 64 MiB: median <= 1.25 x floor: NOT met (0 of 1 rows; worst 1.30)"),
    ("64m", 1.3, ["--no-verdict"], 0,
     "target >= 64 MiB: median <= 1.25 x floor: NOT met (0 of 1 rows; worst 1.30)"),
    ("4m", 1.35, [], 0, "target 4 MiB: median <= 1.35 x floor: met (1 of 1 rows; worst 1.35)"),
    ("4", 1.4, [], 1, "target 4 MiB: median <= 1.35 x floor: NOT met (0 of 1 rows; worst 1.40)"),
])
def test_round_bench_floor_targets_set_the_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        size: str, ratio: float, extra: list[str], code: int, verdict: str) -> None:
    rb = _load("round")
    _fake(monkeypatch, rb, lambda w, n, d, floor: [floor * ratio] * 3)
    assert rb.main(["--worlds", "2", "--sizes", size, "--dtypes", "f32", *extra]) == code
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [verdict, "targets met" if code == 0 and not extra else
                          "TARGETS MISSED"]
    # the chain floor of the row, and its range over the CPU floor before the targets
    rates, hosts, nbytes = rb.Rates(*RATES), rb._hosts(2), rb.parse_size(size)
    floor, _ = rb.floor_seconds(2, hosts, nbytes, "f32", rates, 2)
    chain, _ = rb.chain_floor_seconds(2, hosts, nbytes, "f32", rates, 2)
    row = next(line for line in lines if line.startswith("| 2 |"))
    assert f"| {rb._ms(chain)} | {floor * ratio / chain:.2f} |" in row
    assert lines[-3] == (f"chain floor at >= 4 MiB: {chain / floor:.2f} to {chain / floor:.2f} "
                         "x the CPU floor (no round can take less than its chain floor)")


@pytest.mark.parametrize(("world", "size", "times_ms", "verdict"), [
    # median at upstream's figure, p95 within 2 x median
    (2, "4k", [0.43] * 49 + [0.8], "met (1 of 1 rows; worst median 1.00 x upstream, worst p95 "
     "1.00 x median)"),
    # median above upstream's 1.10 ms at W = 4
    (4, "4k", [1.11] * 50, "NOT met (0 of 1 rows; worst median 1.01 x upstream, worst p95 "
     "1.00 x median)"),
    # median fine, but a tail: p95 = 2.5 x median
    (8, "64k", [2.0] * 45 + [5.0] * 5, "NOT met (0 of 1 rows; worst median 0.49 x upstream, "
     "worst p95 2.50 x median)"),
])
def test_round_bench_small_frames_against_upstream(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        world: int, size: str, times_ms: list[float], verdict: str) -> None:
    rb = _load("round")
    runs = _fake(monkeypatch, rb, lambda w, n, d, f: [t / 1e3 for t in times_ms])
    met = verdict.startswith("met")
    assert rb.main(["--worlds", str(world), "--sizes", size, "--dtypes", "bf16"]) == (
        0 if met else 1)
    assert runs == [(world, rb.parse_size(size), "bf16")]
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2:] == ["target 4 KiB and 64 KiB: median <= upstream and p95 <= 2 x median: "
                        + verdict, "targets met" if met else "TARGETS MISSED"]
    row = next(line for line in out if line.startswith(f"| {world} |"))
    up = rb.UPSTREAM[(world, rb.parse_size(size))]
    # each role's CPU over its share of the floor's work (a relay and a rank: the mean)
    shares = rb.role_floor_seconds(rb._hosts(world), rb.parse_size(size), "bf16",
                                   rb.Rates(*RATES))
    share = " / ".join(f"{cpu / shares[role]:.2f}" for role, cpu in
                       (("controller", 0.4e-3), ("relay", 0.5e-3), ("rank", 0.25e-3)))
    assert (f"| {rb._ms(up)} | {'ok' if met else 'MISS'} | n/a | 0.40 / 0.50 / 0.25 "
            f"| {share} | 40 / 50 / 60 | n/a |") in row


def test_round_bench_without_a_target_configuration_fails(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rb = _load("round")
    _fake(monkeypatch, rb, lambda *a: [0.001])
    assert rb.main(["--worlds", "2", "--sizes", "1m", "--dtypes", "f32"]) == 1
    assert capsys.readouterr().out.strip().endswith("no configuration with a target ran")
    # W = 3 has no upstream figure, so its 4 KiB row has no target either
    assert rb.main(["--worlds", "3", "--sizes", "4k", "--dtypes", "f32"]) == 1
    assert capsys.readouterr().out.strip().endswith("no configuration with a target ran")


def test_round_bench_full_runs_every_configuration_small_frames_first(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rb = _load("round")
    runs = _fake(monkeypatch, rb, lambda w, n, d, floor: [floor])
    assert rb.main(["--full", "--protocol-version", "3", "--no-verdict"]) == 0
    sizes = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20]
    assert runs == [(w, n, d) for n in sizes for w in (2, 4, 8) for d in ("f32", "bf16")]
    out = capsys.readouterr().out
    assert "protocol v3" in out.splitlines()[0]


def test_round_bench_reruns_a_disturbed_configuration(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rb = _load("round")
    # first configuration: disturbed once, then quiet; second: disturbed on all three runs
    runs = _fake(monkeypatch, rb, lambda w, n, d, floor: [floor], [0.5, 0.05, 0.3, 0.2, 0.4])
    assert rb.main(["--worlds", "2", "--sizes", "64m", "--dtypes", "f32,bf16", "--reruns",
                    "2"]) == 0  # a disturbed row is marked; the verdict is on its figures
    assert runs == [(2, 64 << 20, "f32")] * 2 + [(2, 64 << 20, "bf16")] * 3
    out = capsys.readouterr().out.strip().splitlines()
    rows = [line for line in out if line.startswith("| 2 |")]
    assert "| 0.05 (2 runs) |" in rows[0]
    assert "| 0.40 ! (3 runs) |" in rows[1]
    assert out[-3:] == [
        "target >= 64 MiB: median <= 1.25 x floor: met (2 of 2 rows; worst 1.00)",
        "1 row(s) disturbed by other processes (> 0.1 core) after every rerun: marked !",
        "targets met"]


def test_round_bench_write_replaces_its_section(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    rb = _load("round")
    runs = _fake(monkeypatch, rb, lambda w, n, d, floor: [floor])
    del runs
    (tmp_path / "bench").mkdir()
    results = tmp_path / "bench" / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Round (bench/round.py)\n\nformer figures\n\n"
                       "## Reduce (bench/reduce.py)\n\nkept\n", encoding="utf-8")
    monkeypatch.setattr(rb, "ROOT", tmp_path)
    for version in (2, 3):
        assert rb.main(["--worlds", "2", "--sizes", "4m", "--dtypes", "f32", "--write",
                        "--note", "A note.", "--protocol-version", str(version)]) == 0
    text = results.read_text(encoding="utf-8")
    assert "former figures" not in text and text.count("## Reduce (bench/reduce.py)\n\nkept\n") == 1
    v2 = text[text.index("## Round (bench/round.py)"):text.index("## Reduce")]
    v3 = text[text.index("## Round, protocol v3 (bench/round.py)"):]
    for sec, v in ((v2, 2), (v3, 3)):
        assert f"protocol v{v}, 2 cores" in sec and "A note.\n" in sec
        assert rb.TABLE_HEADER in sec and rb.STAGE_HEADER in sec
        assert "| 2 | 1 (2 ranks) | 4 MiB | f32 | 1 | 42.99 ms |" in sec
        assert "| 2 | 4 MiB | f32 | not traced |" in sec
        assert sec.rstrip().endswith("targets met\n```")


@pytest.mark.parametrize(("text", "nbytes", "label"), [
    ("4k", 4096, "4 KiB"), ("64K", 65536, "64 KiB"), ("1m", 1 << 20, "1 MiB"),
    ("4MiB", 4 << 20, "4 MiB"), ("256m", 256 << 20, "256 MiB"), ("64", 64 << 20, "64 MiB"),
    ("0.5m", 1 << 19, "512 KiB"), ("1g", 1 << 30, "1024 MiB"),
])
def test_parse_size(text: str, nbytes: int, label: str) -> None:
    rb = _load("round")
    assert rb.parse_size(text) == nbytes
    assert rb.size_label(nbytes) == label


@pytest.mark.parametrize("text", ["", "k", "4x", "-4k", "0", "0.001k", "1000b",
                                  "\uff14k", "\u0661\u0660k", "1_0k"])
def test_parse_size_rejects(text: str) -> None:
    rb = _load("round")
    with pytest.raises(ValueError, match=f"frame size {text!r}"):
        rb.parse_size(text)


def test_round_bench_rejects_a_bad_size_on_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    rb = _load("round")
    with pytest.raises(SystemExit) as e:
        rb.main(["--sizes", "4k,4x"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("bench/round.py: error: argument --sizes: frame size "
                                       "'4x': expected e.g. 4k, 64k, 1m, 256m\n")


def test_quiet_guard_arithmetic() -> None:
    rb = _load("round")
    # user + nice + system + steal (the 8th number): a hypervisor running another guest
    # delays the cluster as another process does
    assert rb.machine_busy("cpu  100 20 30 400 5 6 7 8 0 0\ncpu0 1 2 3 4\n") == 158
    assert rb.machine_busy("cpu  100 20 30 400 5 6 7\n") == 150  # a kernel without steal
    with pytest.raises(ValueError, match="/proc/stat"):
        rb.machine_busy("intr 1 2 3\n")
    # /proc/<pid>/stat: pid (comm) state ppid ... utime stime cutime cstime (fields 14-17)
    def stat(pid: int, ppid: int, ticks: tuple[int, int, int, int], comm: str = "py") -> str:
        return f"{pid} ({comm}) S {ppid} " + "0 " * 9 + " ".join(map(str, ticks)) + " 20 0"
    stats = {1: stat(1, 0, (1000, 0, 0, 0)), 10: stat(10, 1, (5, 1, 3, 1), "a) b"),
             11: stat(11, 10, (7, 2, 0, 0)), 12: stat(12, 11, (1, 1, 0, 0)),
             13: stat(13, 1, (50, 0, 0, 0))}
    assert rb.tree_ticks(10, stats) == 10 + 9 + 2
    assert rb.tree_ticks(13, stats) == 50
    tick = os.sysconf("SC_CLK_TCK")
    a = rb.CpuSample(10.0, 1000, 100)
    b = rb.CpuSample(12.0, 1000 + 3 * tick, 100 + 2 * tick)  # 3 s busy, 2 s ours, in 2 s
    assert rb.others_cores(a, b) == 0.5
    assert rb.others_cores(a, rb.CpuSample(12.0, 1000 + tick, 100 + 2 * tick)) == 0.0
    assert rb.others_cores(None, b) is None and rb.others_cores(b, a) is None
    assert isinstance(rb.cpu_sample(), rb.CpuSample) is Path("/proc/stat").exists()


def test_wait_quiet_stops_at_the_first_quiet_window_or_at_max_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rb = _load("round")
    tick = os.sysconf("SC_CLK_TCK")
    seq: list[tuple[int, int]] = []
    samples = iter([(0, 0), (tick, 0), (tick, 0), (tick + tick // 20, 0)])
    t = iter(range(100))

    def sample() -> Any:
        busy, own = next(samples)
        seq.append((busy, own))
        return rb.CpuSample(float(next(t)), busy, own)

    monkeypatch.setattr(rb, "cpu_sample", sample)
    monkeypatch.setattr(rb.time, "sleep", lambda s: None)
    assert rb.wait_quiet(3600.0) == 0.05  # a busy window (1 core), then a quiet one
    assert len(seq) == 4
    samples = iter([(0, 0), (tick, 0)])
    assert rb.wait_quiet(0.0) == 1.0  # no time to wait: the busy figure is returned


def test_format_stages_of_the_median_round() -> None:
    rb = _load("round")
    from flodl_proto.runner.stages import SEGMENTS, RoundStages

    def rnd(k: int, total: float) -> RoundStages:
        return RoundStages(k, total, tuple((label, total / 8, gap) for label, _, _, gap
                                           in SEGMENTS[:-1]))
    run = rb.ClusterRun([0.1, 0.2, 0.3], [rnd(0, 0.004), rnd(1, 0.008), rnd(2, 0.08)])
    row = rb.Row(2, [[0, 1]], 4096, "f32", run, 0.001)
    assert rb.format_stages(row) == (
        "| 2 | 4 KiB | f32 | 8.000 | " + " | ".join(["1.000"] * 7) + " | - |")
    assert rb.format_stages(rb.Row(2, [[0, 1]], 4096, "f32", rb.ClusterRun([0.1]), 0.001)) == (
        "| 2 | 4 KiB | f32 | not traced | " + " | ".join(["-"] * 8) + " |")


def test_round_bench_floor_scales_into_a_reused_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor's scale step writes into a buffer given once, as the rank's hot path does."""
    rb = _load("round")
    from flodl_proto.reduce import payload

    outs: list[Any] = []
    real = payload.scale_payload

    def spy(dtype: int, data: Any, factor: Any, *, out: Any = None) -> memoryview:
        outs.append(out)
        return real(dtype, data, factor, out=out)

    monkeypatch.setattr("flodl_proto.reduce.scale_payload", spy)
    monkeypatch.setattr(rb, "_best", lambda fn, repeat=3: (fn(), fn(), 1.0)[-1])
    rb.measure_rates(mib=1)
    assert len(outs) == 2 and outs[0] is not None and outs[0] is outs[1]


def test_codec_bench_exit_code_follows_the_verdict() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "codec.py"), "--mib", "1", "--tensors", "1",
           "--repeat", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    last = res.stdout.strip().splitlines()[-1]
    assert last in ("targets met", "TARGETS MISSED"), res.stdout
    assert res.returncode == (0 if last == "targets met" else 1), res.stderr
    res = subprocess.run([*cmd, "--no-verdict"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_cpu_cell_and_cpu_between() -> None:
    rb = _load("round")
    assert rb.cpu_cell({"controller": 0.4e-3, "relay": 12.34e-3, "rank": 0.0}) == \
        "0.40 / 12.3 / 0.00"
    assert rb.cpu_cell({"rank": 1e-3}) == "? / ? / 1.00"
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    # the threads' exact run time, within two ticks of the tick count
    assert rb.cpu_between((1_000_000_000, 100), (1_250_000_000, 100 + round(0.25 / tick))) \
        == 0.25
    # threads ended in between: the tick count is larger by more than two ticks, it wins
    assert rb.cpu_between((0, 0), (10_000_000, 100)) == pytest.approx(100 * tick)
    assert rb.cpu_between(None, (1, 1)) is None and rb.cpu_between((1, 1), None) is None
    own = rb.process_cpu_ns(os.getpid())
    assert own is not None and own[0] > 0 and own[1] >= 0
    assert rb.process_cpu_ns(2 ** 22 + 12345) is None  # no such process


@pytest.mark.parametrize(("world", "hosts"), [
    (2, [[0, 1]]), (4, [[0, 1], [2, 3]]), (3, [[0], [1, 2]]), (1, [[0]])])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_role_floor_shares_add_up_to_the_floor(world: int, hosts: list[list[int]],
                                               dtype: str) -> None:
    rb = _load("round")
    rates = rb.Rates(hash=1e9, add_f32=4e9, add_bf16=2e9, scale_f32=5e9, scale_bf16=2.5e9,
                     copy=8e9)
    nbytes = 4 << 20
    floor, _ = rb.floor_seconds(world, hosts, nbytes, dtype, rates, 2)
    shares = rb.role_floor_seconds(hosts, nbytes, dtype, rates)
    assert set(shares) == {"controller", "relay", "rank"}
    total = shares["controller"] + len(hosts) * shares["relay"] + world * shares["rank"]
    assert total == pytest.approx(2 * floor, rel=1e-12)
    # a rank: sign + verify, one pre-scale, three copies (send, receive, decode)
    scale = rates.scale_bf16 if dtype == "bf16" else rates.scale_f32
    assert shares["rank"] == pytest.approx(nbytes * (2 / 1e9 + 1 / scale + 3 / 8e9))


def test_share_cell() -> None:
    rb = _load("round")
    cpu = {"controller": 0.03, "relay": 0.05, "rank": 0.01}
    assert rb.share_cell(cpu, {"controller": 0.02, "relay": 0.04, "rank": 0.01}) == \
        "1.50 / 1.25 / 1.00"
    assert rb.share_cell({"rank": 0.01}, {"controller": 0.02, "relay": 0.04, "rank": 0.008}) \
        == "? / ? / 1.25"
    assert rb.share_cell(cpu, {}) == "? / ? / ?"


def test_the_tcp_floor_is_the_floor_when_a_leg_costs_two_copies() -> None:
    rb = _load("round")
    hosts = [[0, 1], [2, 3]]
    base = dict(hash=1e9, add_f32=4e9, add_bf16=2e9, scale_f32=5e9, scale_bf16=2.5e9, copy=8e9)
    floor, _ = rb.floor_seconds(4, hosts, 1 << 20, "f32", rb.Rates(**base), 2)
    assert rb.tcp_floor_seconds(4, hosts, 1 << 20, "f32", rb.Rates(**base), 2) is None
    # a leg at half the copy rate costs what two copies do: the same floor
    assert rb.tcp_floor_seconds(4, hosts, 1 << 20, "f32", rb.Rates(**base, tcp=4e9), 2) == \
        pytest.approx(floor, rel=1e-12)
    # a leg at a quarter of it: each of the 2W + 2H = 12 legs' bytes costs 1/8e9 s more per
    # byte, over 2 cores
    slow = rb.tcp_floor_seconds(4, hosts, 1 << 20, "f32", rb.Rates(**base, tcp=2e9), 2)
    assert slow == pytest.approx(floor + 12 * (1 << 20) * (1 / 2e9 - 1 / 4e9) / 2, rel=1e-12)


@pytest.mark.parametrize(("world", "hosts"), [(2, [[0, 1]]), (2, [[0], [1]]), (4, [[0, 1], [2, 3]]),
                                           (8, [[0, 1, 2, 3], [4, 5, 6, 7]]), (3, [[0], [1, 2]])])
@pytest.mark.parametrize("tcp", [0.0, 2e9])
def test_the_chain_floor_is_the_tcp_floor_on_one_core(world: int, hosts: list[list[int]],
                                                      tcp: float) -> None:
    # on one core every step's work is at least its chain: the steps add up to all the work
    rb = _load("round")
    base = dict(hash=1e9, add_f32=4e9, add_bf16=2e9, scale_f32=5e9, scale_bf16=2.5e9, copy=8e9)
    rates = rb.Rates(**base, tcp=tcp)
    for dtype in ("f32", "bf16"):
        chain, parts = rb.chain_floor_seconds(world, hosts, 1 << 20, dtype, rates, 1)
        assert tuple(parts) == rb.CHAIN_PHASES
        flat = (rb.tcp_floor_seconds(world, hosts, 1 << 20, dtype, rates, 1) if tcp
                else rb.floor_seconds(world, hosts, 1 << 20, dtype, rates, 1)[0])
        assert chain == pytest.approx(flat, rel=1e-12)
        # on more cores, never below the flat floor
        chain2, _ = rb.chain_floor_seconds(world, hosts, 1 << 20, dtype, rates, 2)
        flat2 = (rb.tcp_floor_seconds(world, hosts, 1 << 20, dtype, rates, 2) if tcp
                 else rb.floor_seconds(world, hosts, 1 << 20, dtype, rates, 2)[0])
        assert chain2 >= flat2 * (1 - 1e-12)


def test_the_chain_floor_takes_each_step_at_its_work_or_its_chain() -> None:
    rb = _load("round")
    # 1e9 bytes: a MAC 1 s, an accumulation 0.25 s, an encode 0.2 s, a copy 0.125 s, a TCP leg
    # 0.5 s; W = 2 on one 2-rank host, 2 cores
    rates = rb.Rates(hash=1e9, add_f32=4e9, add_bf16=2e9, scale_f32=5e9, scale_bf16=2.5e9,
                     copy=8e9, tcp=2e9)
    chain, parts = rb.chain_floor_seconds(2, [[0, 1]], 10**9, "f32", rates, 2)
    assert parts == pytest.approx({
        # 2 ranks x (encode + sign + verify + leg) = 5.4 s of work over 2 cores
        "deposit": 2.7,
        # work: 2 accumulations + encode + 2 MACs signed + leg + 2 MACs verified = 5.2 s (2.6 on
        # 2 cores); chain: the fold and encode (0.7), the signing, the verify: 2.7
        "host frame": 2.7,
        # work 2.65 s (1.325 on 2 cores); chain: accumulation, encode and normalise, one MAC
        "reduce": 1.65,
        # work: leg + relay verify, then 2 x (leg + rank verify + decode) = 4.75 s over 2
        "scatter": 2.375,
    }, rel=1e-12)
    assert chain == pytest.approx(9.425, rel=1e-12)


def test_loopback_tcp_rate_moves_every_byte() -> None:
    import numpy as np

    rb = _load("round")
    src = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8)
    dst = np.zeros(1 << 20, dtype=np.uint8)
    rate = rb.loopback_tcp_rate(src, dst, repeat=1)
    assert rate > 0 and rate != float("inf")
    assert dst.tobytes() == src.tobytes()


def test_loopback_tcp_rate_raises_when_the_sender_fails() -> None:
    """The sending thread's failure ends the measurement with that error; the receiver,
    waiting for bytes that never come, used to wait forever."""
    import threading

    import numpy as np

    rb = _load("round")

    class Unsendable:  # nbytes as an array's, data no socket takes
        nbytes = 1 << 16
        data = "not a buffer"

    dst = np.zeros(1 << 16, dtype=np.uint8)
    raised: list[BaseException] = []

    def measure() -> None:
        try:
            rb.loopback_tcp_rate(Unsendable(), dst, repeat=1)  # type: ignore[arg-type]
        except BaseException as e:  # the error is the result
            raised.append(e)

    t = threading.Thread(target=measure, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], TypeError)


def test_stage_parts_take_a_late_mark_at_the_next_stage() -> None:
    """A sender's mark after the receiver's (the controller descheduled after writing the
    Broadcast, which the relay read 0.05 ms before the controller's mark) used to print a
    negative gap; the mark is taken at the next stage's, and the parts still add up."""
    rb = _load("round")
    from flodl_proto.runner.stages import SEGMENTS, RoundStages

    ms = [0.02, 0.02, 0.07, 0.06, 0.17, -0.05, 0.05, 0.12]  # as traced: ctl -> relay < 0
    run = rb.ClusterRun([0.46e-3], [RoundStages(0, sum(ms) / 1e3, tuple(
        (label, m / 1e3, gap) for (label, _, _, gap), m in zip(SEGMENTS, ms, strict=True)))])
    row = rb.Row(2, [[0, 1]], 4096, "f32", run, 0.001)
    assert rb.format_stages(row) == ("| 2 | 4 KiB | f32 | 0.460 | 0.020 | 0.020 | 0.070 | "
                                     "0.060 | 0.120 | 0.000 | 0.050 | 0.120 |")
    parts = rb.ordered_parts(run.stages[0])
    assert min(parts.values()) >= 0.0
    assert sum(parts.values()) == pytest.approx(sum(ms) / 1e3, abs=1e-15)
    # two late marks in a row, and one before the round's start, are clamped the same way
    ms2 = [0.05, -0.08, 0.02, 0.3, -0.1, -0.1, 0.05, 0.2]
    st = RoundStages(1, sum(ms2) / 1e3, tuple(
        (label, m / 1e3, gap) for (label, _, _, gap), m in zip(SEGMENTS, ms2, strict=True)))
    got = [round(v * 1e3, 9) for v in rb.ordered_parts(st).values()]
    assert got == [0.0, 0.0, 0.0, 0.09, 0.0, 0.0, 0.05, 0.2]
    assert sum(got) == pytest.approx(sum(ms2))


def test_run_cluster_keeps_peak_rss_per_role_with_two_relays() -> None:
    """A real cluster of 4 ranks on 2 relays: the peak RSS is kept per role (the relays are
    named "relay 0" and "relay 1" as processes, both a relay's figure), so no column is '?'."""
    rb = _load("round")
    run = rb.run_cluster(4, [[0, 1], [2, 3]], 4096, "f32", 2, 1, 2, trace=False)
    assert set(run.rss_kib) == {"controller", "relay", "rank"}
    assert all(kib > 10_000 for kib in run.rss_kib.values())  # a Python with numpy loaded
    assert len(run.times) == 2


class _LockLeftUnheld:
    """A queue whose ``get`` fails as CPython's does when Ctrl-C interrupts its wait as the wait
    takes its lock back."""

    def get(self, timeout: float | None = None) -> str:
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("release unlocked lock")


@pytest.mark.parametrize("call", ["next_line", "address"])
def test_a_process_wait_interrupted_in_the_queue_s_lock_is_a_keyboard_interrupt(
        call: str) -> None:
    """``_Proc.next_line`` ended the script in ``RuntimeError: release unlocked lock`` when
    Ctrl-C arrived inside ``queue.get``: it is a KeyboardInterrupt, so the script's cleanup and
    its ``interrupted`` line follow."""
    rb = _load("round")
    proc = object.__new__(rb._Proc)
    proc.lines = proc.first = _LockLeftUnheld()
    with pytest.raises(KeyboardInterrupt):
        getattr(proc, call)("rank 0")


class _Lab:
    """The link controls of a :class:`flodl_proto.netlab.NetLab`, recorded."""

    def __init__(self) -> None:
        self.nodes = ["ctl", "h0", "h1"]
        self.calls: list[tuple[str, str, float]] = []

    def set_rate(self, node: str, mbit: float) -> None:
        self.calls.append(("rate", node, mbit))

    def set_loss(self, node: str, percent: float) -> None:
        self.calls.append(("loss", node, percent))


@pytest.mark.parametrize(("loss", "calls"), [
    (0.0, [("rate", "ctl", 100.0), ("rate", "h0", 100.0), ("rate", "h1", 100.0)]),
    (1.5, [("rate", "ctl", 100.0), ("loss", "ctl", 1.5), ("rate", "h0", 100.0),
           ("loss", "h0", 1.5), ("rate", "h1", 100.0), ("loss", "h1", 1.5)]),
])
def test_wan_bench_caps_and_loses_on_every_link(loss: float,
                                                calls: list[tuple[str, str, float]]) -> None:
    wb = _load("wan")
    lab = _Lab()
    wb.shape_links(lab, 100.0, loss)
    assert lab.calls == calls


_WAN_TARGET = "target round <= 1.2 x network floor at 100 Mbit/s"
_NOT_APPLIED = "not applied under {} % packet loss (the floor counts no retransmission; worst {})"


@pytest.mark.parametrize(("argv", "loss", "words", "code", "verdict"), [
    ([], 0.0, "no packet loss", 1, f"{_WAN_TARGET}: NOT met (worst 5.96)"),
    (["--loss", "1"], 1.0, "1 % packet loss on every link, each direction", 0,
     f"{_WAN_TARGET}: {_NOT_APPLIED.format(1, 5.96)}"),
    (["--loss", "0.25"], 0.25, "0.25 % packet loss on every link, each direction", 0,
     f"{_WAN_TARGET}: {_NOT_APPLIED.format(0.25, 5.96)}"),
    (["--loss", "99.99"], 99.99, "99.99 % packet loss on every link, each direction", 0,
     f"{_WAN_TARGET}: {_NOT_APPLIED.format(99.99, 5.96)}"),
    (["--loss", "0"], 0.0, "no packet loss", 1, f"{_WAN_TARGET}: NOT met (worst 5.96)"),
], ids=["default", "loss-1", "loss-0.25", "loss-99.99", "loss-0"])
def test_wan_bench_loss_reaches_the_lab_and_the_printed_configuration(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], loss: float, words: str, code: int, verdict: str) -> None:
    """``--loss`` goes to each configuration's run, the intro line names it, and each row
    counts the packets the loss rules dropped. Under loss the 1.2 x target is not applied
    (the floor counts no retransmission): the verdict line gives the worst ratio and says so,
    exit 0, where a lossy run was judged against the lossless floor and exited 1."""
    import flodl_proto.netlab

    wb = _load("wan")
    runs: list[tuple[Any, ...]] = []

    def run_config(*args: Any) -> Any:
        runs.append(args)
        return wb.Result(4, 2, "f32", 100.0, 1.5, 1 << 20, 2 << 20, 0.25, 0.0, 157)

    monkeypatch.setattr(flodl_proto.netlab, "unavailable_reason", lambda: None)
    monkeypatch.setattr(wb, "wait_quiet", lambda *a: (0.0, 0.0))
    monkeypatch.setattr(wb, "_cores", lambda: 2)
    monkeypatch.setattr(wb, "run_config", run_config)
    assert wb.main(["--worlds", "4", "--dtypes", "f32", "--caps", "100", "--mib", "2",
                    *argv]) == code
    assert runs == [(4, "f32", 100.0, 2.0, 3, loss)]
    assert capsys.readouterr().out.splitlines() == [
        "2 cores; 2 MiB frames (4 tensors), protocol v3, one host idle per round (elided), H "
        f"warm-up + 3 measured rounds; {words}; dropped = packets the loss rules dropped; other "
        "processes = cores other processes kept busy during the run",
        "| W | hosts | dtype | link cap | median round | network floor | ratio | in / out per "
        "round | dropped | other processes |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| 4 | 2 | f32 | 100 Mbit/s | 1.50 s | 0.25 s | 5.96 | 1.0 / 2.0 MiB | 157 | "
        "0.25 cores |",
        verdict]


def test_wan_bench_without_the_lab_is_a_failed_run_naming_what_is_missing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without root, or without a tool of the network lab, wan.py says what is missing in one
    ``bench/wan.py: error: ...`` line and exits 1, as a run that fails: it exited 2, the code
    of a bad command line, with no ``error:``."""
    import shutil

    import flodl_proto.netlab

    wb = _load("wan")
    which = shutil.which
    for uid, gone, why in (
            (1000, "", "the network lab needs root (network namespaces, veth, tc, nftables)"),
            (0, "nft", "the network lab needs iproute2 and nftables: nft not found (apt-get "
                       "install iproute2 nftables)"),
            (0, "tc", "the network lab needs iproute2 and nftables: tc not found (apt-get "
                      "install iproute2 nftables)")):
        monkeypatch.setattr(flodl_proto.netlab, "_REASON", {})  # probed once per process
        monkeypatch.setattr(flodl_proto.netlab.os, "geteuid", lambda uid=uid: uid)
        monkeypatch.setattr(flodl_proto.netlab.shutil, "which",
                            lambda t, gone=gone: None if t == gone else which(t) or f"/bin/{t}")
        assert wb.main(["--worlds", "4"]) == 1
        assert capsys.readouterr() == ("", f"bench/wan.py: error: {why}\n")


def _wan_row(wb: ModuleType, cap: float, median: float) -> Any:
    """A row of ``bench/wan.py`` at ``cap`` Mbit/s whose floor is 1.0 s (``median`` is its
    ratio)."""
    half = int(cap * 1e6 / 8 / 2)
    return wb.Result(4, 2, "f32", cap, median, half, half, 0.0, 0.0)


@pytest.mark.parametrize(("rows", "loss", "line", "ok"), [
    ([(100.0, 1.2)], 0.0, f"{_WAN_TARGET}: met (worst 1.20)", True),
    ([(100.0, 1.1), (100.0, 1.25), (1000.0, 4.0)], 0.0, f"{_WAN_TARGET}: NOT met (worst 1.25)",
     False),
    ([(1000.0, 4.0)], 0.0, "no 100 Mbit/s configuration run: no verdict", True),
    ([], 0.0, "no 100 Mbit/s configuration run: no verdict", True),
    # under loss the worst ratio is printed and the target not applied, above it or below
    ([(100.0, 1.1), (100.0, 1.27), (1000.0, 4.0)], 1.0,
     f"{_WAN_TARGET}: {_NOT_APPLIED.format(1, 1.27)}", True),
    ([(100.0, 1.1)], 0.01, f"{_WAN_TARGET}: {_NOT_APPLIED.format(0.01, '1.10')}", True),
    ([(1000.0, 4.0)], 1.0, "no 100 Mbit/s configuration run: no verdict", True),
], ids=["met", "not-met", "no-100-mbit", "no-rows", "loss-1", "loss-0.01", "loss-no-100-mbit"])
def test_wan_bench_verdict_is_not_applied_under_loss(
        rows: list[tuple[float, float]], loss: float, line: str, ok: bool) -> None:
    wb = _load("wan")
    results = [_wan_row(wb, cap, median) for cap, median in rows]
    assert [round(r.floor, 9) for r in results] == [1.0] * len(rows)
    assert wb.verdict_line(results, loss) == (line, ok)


@pytest.mark.parametrize(("host", "name", "value"), [
    (0, "upstream_out", 201326852),
    (1, "upstream_in", 402653400),
])
def test_wan_bench_reads_a_relays_byte_counters(host: int, name: str, value: int) -> None:
    wb = _load("wan")
    out = ("listening on 198.18.0.3:41234\nrelay stats from_ranks=1 to_ranks=2 "
           "upstream_out=201326852 upstream_in=402653400 host_frames=5 broadcasts=5\n")
    assert wb.relay_counter(out, name, host) == value


def test_wan_bench_a_relay_without_its_counters_fails_in_one_line() -> None:
    """A relay whose output holds no ``relay stats`` line (it died before printing it) ended
    the script in an AttributeError's traceback: it is a :class:`BenchFailed`, which
    :func:`_cli.run` prints as one line, exit 1."""
    wb = _load("wan")
    with pytest.raises(wb.BenchFailed) as caught:
        wb.relay_counter("listening on 198.18.0.3:41234\n", "upstream_in", 1)
    assert str(caught.value) == "relay1 printed no upstream_in count"

"""The benchmarks' verdicts: their exit code follows the verdict line (1 when a target is
missed), and ``--no-verdict`` exits 0 for exploration. Nothing here asserts on a duration: the
round bench's timing inputs are replaced by fixed figures, the codec bench runs tiny and only the
agreement between its verdict line and its exit code is checked."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("ratio", "extra", "code"), [
    (1.2, [], 0), (1.5, [], 0), (1.6, [], 1), (1.6, ["--no-verdict"], 0),
])
def test_round_bench_exit_code_follows_the_verdict(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        ratio: float, extra: list[str], code: int) -> None:
    rb = _load("round")
    rates = rb.Rates(1e9, 2e9, 1e9, 2e9, 1e9, 4e9)
    monkeypatch.setattr(rb, "measure_rates", lambda: rates)
    monkeypatch.setattr(rb, "gloo_round", lambda *a: None)

    def run_cluster(world: int, hosts: Any, mib: float, dtype: str, *a: Any) -> list[float]:
        floor, _ = rb.floor_seconds(world, hosts, int(mib * rb.MiB), dtype, rates, 2)
        return [floor * ratio] * 3

    monkeypatch.setattr(rb, "run_cluster", run_cluster)
    monkeypatch.setattr(rb.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    monkeypatch.setattr(sys, "argv", ["round.py", "--worlds", "2", "--sizes", "64",
                                      "--dtypes", "f32", *extra])
    assert rb.main() == code
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"target round <= 1.5 x floor at >= 64 MiB: "
                    f"{'met' if ratio <= 1.5 else 'NOT met'} (worst {ratio:.2f})")


def test_round_bench_without_a_large_configuration_fails(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rb = _load("round")
    rates = rb.Rates(1e9, 2e9, 1e9, 2e9, 1e9, 4e9)
    monkeypatch.setattr(rb, "measure_rates", lambda: rates)
    monkeypatch.setattr(rb, "gloo_round", lambda *a: None)
    monkeypatch.setattr(rb, "run_cluster", lambda *a: [0.001])
    monkeypatch.setattr(sys, "argv", ["round.py", "--worlds", "2", "--sizes", "4",
                                      "--dtypes", "f32"])
    assert rb.main() == 1
    assert capsys.readouterr().out.strip().endswith("no >= 64 MiB configuration run")


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

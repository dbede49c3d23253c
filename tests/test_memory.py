"""``flodl_proto._memory``: the memory a process may still take, from ``/proc/meminfo`` and its
memory cgroup (v1, v2, hybrid), on fake file trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from flodl_proto._memory import available_memory

GIB = 1 << 30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, cgroup: str, available_kib: int | None = 20 * (1 << 20)) -> Path:
    proc = tmp_path / "proc"
    if available_kib is not None:
        _write(proc / "meminfo",
               f"MemTotal:       99999999 kB\nMemAvailable:   {available_kib} kB\n")
    _write(proc / "self" / "cgroup", cgroup)
    return proc


def test_without_a_memory_cgroup_it_is_memavailable(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/\n")
    assert available_memory(proc, tmp_path / "sys") == 20 * GIB


def test_v2_limit_less_the_working_set_bounds_it(tmp_path: Path) -> None:
    """A container limited to 8 GiB on a 20 GiB machine: the demo was let through and would be
    OOM-killed. The working set is the usage less the inactive file cache."""
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "memory\n")
    d = root / "job" / "task"
    _write(d / "memory.max", f"{8 * GIB}\n")
    _write(d / "memory.current", f"{3 * GIB}\n")
    _write(d / "memory.stat", f"anon 1\ninactive_file {GIB}\n")
    _write(root / "job" / "memory.max", "max\n")  # the parent: no limit of its own
    _write(root / "job" / "memory.current", f"{3 * GIB}\n")
    proc = _proc(tmp_path, "0::/job/task\n")
    assert available_memory(proc, root) == 8 * GIB - 2 * GIB


def test_an_ancestors_tighter_limit_counts(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "memory\n")
    _write(root / "job" / "memory.max", f"{4 * GIB}\n")
    _write(root / "job" / "memory.current", f"{GIB}\n")
    _write(root / "job" / "task" / "memory.max", f"{8 * GIB}\n")
    _write(root / "job" / "task" / "memory.current", f"{GIB}\n")
    proc = _proc(tmp_path, "0::/job/task\n")
    assert available_memory(proc, root) == 3 * GIB


def test_v1_memory_controller_and_hybrid_v2(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    d = root / "memory" / "pod"
    _write(d / "memory.limit_in_bytes", f"{6 * GIB}\n")
    _write(d / "memory.usage_in_bytes", f"{2 * GIB}\n")
    _write(d / "memory.stat", f"cache 5\ntotal_inactive_file {GIB}\n")
    _write(root / "unified" / "memory.max", f"{GIB * 10}\n")  # hybrid: v2 under unified/
    _write(root / "unified" / "memory.current", "0\n")
    proc = _proc(tmp_path, "4:memory:/pod\n1:cpu:/\n0::/\n")
    assert available_memory(proc, root) == 5 * GIB


@pytest.mark.parametrize("limit", ["max", "9223372036854771712"])  # v2 and v1 "no limit"
def test_no_limit_leaves_memavailable(tmp_path: Path, limit: str) -> None:
    root = tmp_path / "cg"
    _write(root / "memory" / "memory.limit_in_bytes", f"{limit}\n")
    _write(root / "memory" / "memory.usage_in_bytes", "100\n")
    proc = _proc(tmp_path, "4:memory:/\n")
    assert available_memory(proc, root) == 20 * GIB


def test_nothing_readable_is_none(tmp_path: Path) -> None:
    assert available_memory(tmp_path / "none", tmp_path / "none") is None
    proc = _proc(tmp_path, "garbage\n", available_kib=None)
    assert available_memory(proc, tmp_path / "cg") is None

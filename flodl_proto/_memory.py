"""The memory this process may still take: the kernel's ``MemAvailable``, bounded by the
headroom of its memory cgroup (v1 or v2: the limit less the working set, which is the usage less
the reclaimable inactive file cache, as container runtimes count it), for the tightest of the
cgroup and its ancestors. The demo uses it to refuse a cluster that would not fit.

No upstream counterpart: upstream's binaries do not size a cluster.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["available_memory"]


def available_memory(proc: Path = Path("/proc"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process may still allocate, or None where neither ``/proc/meminfo`` nor a
    memory cgroup can be read (another OS).

    Args:
        proc: the proc file system's mount point.
        cgroup_root: the cgroup file system's mount point.

    Returns:
        Bytes: the least of ``MemAvailable`` and the memory cgroup's headroom; a file that cannot
        be read or parsed counts as absent (no error is raised).

    No upstream counterpart: upstream's binaries do not size a cluster.
    """
    found = [v for v in (_meminfo(proc / "meminfo"),
                         _cgroup_headroom(proc / "self" / "cgroup", cgroup_root)) if v is not None]
    return min(found) if found else None


def _meminfo(path: Path) -> int | None:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return None


def _number(path: Path) -> int | None:
    """A file's whole number (``max``, v2's "no limit", and an unreadable file: None)."""
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return 0


def _cgroup_headroom(cgroup_file: Path, root: Path) -> int | None:
    try:
        lines = cgroup_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    best: int | None = None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2 (unified; under unified/ when hybrid)
            base = root if (root / "cgroup.controllers").exists() else root / "unified"
            names = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1
            base = root / "memory"
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        d = base / path.lstrip("/")
        while True:  # the cgroup, then its ancestors up to the mount (a namespace shows less)
            limit, usage = _number(d / names[0]), _number(d / names[1])
            if limit is not None and usage is not None:
                working = max(0, usage - _stat(d / "memory.stat", names[2]))
                headroom = max(0, limit - working)
                best = headroom if best is None else min(best, headroom)
            if d == base or base not in d.parents:
                break
            d = d.parent
    return best

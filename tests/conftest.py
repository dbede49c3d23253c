"""Shared test configuration: Hypothesis profiles and the vector folder."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

#: every phase but ``explain``, in every profile: on Python < 3.12 that phase runs a failing
#: example again under a line tracer, which held a failing run of the HostFold machine past the
#: 300 s test timeout and one of the controller's for 176 s, then printed Hypothesis's
#: "Inconsistent data generation" in place of the shrunk steps (11 s and 87 s without it)
NO_EXPLAIN = tuple(phase for phase in Phase if phase is not Phase.explain)

# "ci": derandomized and bounded, used by default and by .ci/run; "deep": many examples.
settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None, phases=NO_EXPLAIN,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    # tools/mutate.sh: the same derandomized examples for every mutant, fewer of them, so a
    # surviving mutant's property tests stay short; exact-value unit tests do most of the killing
    "mutation", derandomize=True, max_examples=20, deadline=None, phases=NO_EXPLAIN,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep", max_examples=2000, deadline=None, phases=NO_EXPLAIN,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("FLODL_NET_TIMEOUT_SCALE", "0.1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_small_plans() -> None:
    """Each test starts with the controller's reduce remembering no small-round plan
    (``reduce.fold._small_plans``): which path a test's first fold of a schema takes (judged
    afresh, or a plan remembered from an earlier test) does not depend on the tests before it,
    and a mutation run's worker, forked from a process that ran the unmutated tests, does not
    reuse plans the unmutated code built."""
    from flodl_proto.reduce import fold

    fold._small_plans.clear()


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """Each test ends with the process's SIGINT, SIGTERM and SIGHUP handling as it began: a
    command run in process (``main([...])``) sets SIGINT to ignored once it is interrupted, and
    every later test's child process then started with Ctrl-C ignored (a script's trap on it,
    ``fuzz/run.sh``'s or ``tools/mutate.sh``'s, did nothing)."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in saved.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)


#: the copy of the shared golden vectors bundled in the package
BUNDLED_VECTORS = ROOT / "flodl_proto" / "_vectors"


def vectors_root() -> Path:
    """The vector folder under test: ``$FLODL_VECTORS`` when set, else the copy bundled in the
    package (``flodl_proto/_vectors``). Nothing outside the checkout is looked at: a bare clone
    runs every test."""
    env = os.environ.get("FLODL_VECTORS")
    return Path(env) if env else BUNDLED_VECTORS


def run_with_file_size_limit(args: list[str], limit: int) -> subprocess.CompletedProcess[str]:
    """Run ``python -m flodl_proto ARGS`` (this checkout's package) in a process whose writes to
    regular files beyond ``limit`` bytes fail with EFBIG, as a full disk fails them with ENOSPC
    (SIGXFSZ is ignored, so the write reports the error); stdout and stderr are captured."""
    import sys

    def limited() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-B", "-m", "flodl_proto", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=limited)


#: why the network-lab tests were deselected in this run (None: they ran, or none was collected)
_NETLAB_DESELECTED: list[str] = []


def closed_port() -> int:
    """A loopback port nothing listens on, below the ephemeral port range where there is room:
    no connection of the machine's gets it as its local port meanwhile, and a dial to it cannot
    connect to itself (a connect whose kernel-chosen local port equals the port it dials)."""
    from flodl_proto.conform.player import free_port

    return free_port("127.0.0.1")


def missing_tool(marker: str) -> str | None:
    """Why tests marked ``tshark``, ``capture`` or ``atheris`` cannot run here, or None when
    they can.

    ``tshark``: the tshark binary. ``capture``: tcpdump, unshare and ip, and root (the capture
    runs in a private network namespace so only the cluster's own traffic is recorded).
    """
    if marker == "tshark" and shutil.which("tshark") is None:
        return "tshark not found (apt-get install tshark)"
    if marker == "atheris" and importlib.util.find_spec("atheris") is None:
        return "atheris not installed (the fuzz extra: pip install -e '.[fuzz]')"
    if marker == "capture":
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return "capturing on a private loopback needs root"
        for tool in ("tcpdump", "unshare", "ip"):
            if shutil.which(tool) is None:
                return f"{tool} not found"
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True,
                               timeout=30, check=False)
        if probe.returncode != 0:
            return f"cannot create a network namespace: {probe.stderr.strip() or 'unshare -n'}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Tests send Ctrl-C (SIGINT) to the commands they start, which inherit this process's
    handling of it. A shell starts a background job (``pytest &``, ``nohup``) with SIGINT
    ignored, and the signal then did nothing: the commands ran on to the tests' timeouts. The
    session takes Python's default handling back."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``@pytest.mark.deep`` cases unless the run selects them (``-m deep``),
    ``@pytest.mark.netlab`` cases when the network lab cannot run here, and the ``tshark`` /
    ``capture`` cases whose tools are missing (the reasons are printed in the terminal summary,
    see :func:`pytest_terminal_summary`)."""
    markexpr = str(config.getoption("markexpr") or "")
    drop_deep = not ("deep" in markexpr and "not deep" not in markexpr)
    lab_items = [item for item in items if item.get_closest_marker("netlab")]
    reason = None
    if lab_items:
        from flodl_proto.netlab import unavailable_reason

        reason = unavailable_reason()
    keep, drop, drop_lab = [], [], []
    tools: dict[str, int] = {}
    for item in items:
        if drop_deep and item.get_closest_marker("deep"):
            drop.append(item)
            continue
        if reason is not None and item.get_closest_marker("netlab"):
            drop_lab.append(item)
            continue
        why = None
        for marker in ("tshark", "capture", "atheris"):
            if why is None and item.get_closest_marker(marker):
                why = missing_tool(marker)
        if why:
            tools[why] = tools.get(why, 0) + 1
            drop.append(item)
        else:
            keep.append(item)
    if drop_lab:
        _NETLAB_DESELECTED[:] = [f"{len(drop_lab)} network-lab test(s) deselected: {reason}"]
    _NETLAB_DESELECTED.extend(f"{n} test(s) deselected: {why}" for why, n in tools.items())
    if drop or drop_lab:
        config.hook.pytest_deselected(items=drop + drop_lab)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print why network-lab and tool-dependent tests were deselected (never a silent skip)."""
    for line in _NETLAB_DESELECTED:
        terminalreporter.write_line(line, yellow=True, bold=True)


@pytest.fixture
def compiled_kernels() -> Iterator[None]:
    """Send every bf16 tensor, however small, to the compiled (numba) kernels for one test."""
    from flodl_proto.reduce import _kernels as K

    before = K.kernel_backend()
    assert K.set_kernel_backend("numba", min_elems=0) == "numba"
    try:
        yield
    finally:
        K.set_kernel_backend(before)


@pytest.fixture
def numpy_kernels() -> Iterator[None]:
    """Use the NumPy kernels for every tensor for one test."""
    from flodl_proto.reduce import _kernels as K

    before = K.kernel_backend()
    assert K.set_kernel_backend("numpy") == "numpy"
    try:
        yield
    finally:
        K.set_kernel_backend(before)


@pytest.fixture
def capture_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length in bytes of each capture ``flodl_proto.pcap`` parses during one test, in
    order (its packet reader, ``_packets``, patched to note each call)."""
    from flodl_proto import pcap

    reads: list[int] = []
    packets = pcap._packets

    def counted(data: bytes | bytearray) -> Iterator[tuple[int, bytes]]:
        reads.append(len(data))
        return packets(data)

    monkeypatch.setattr(pcap, "_packets", counted)
    return reads

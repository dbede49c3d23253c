"""Shared test configuration: Hypothesis profiles and the vector folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# "ci": derandomized and bounded, used by default and by .ci/run; "deep": many examples.
settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep", max_examples=2000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("FLODL_NET_TIMEOUT_SCALE", "0.1")

ROOT = Path(__file__).resolve().parent.parent


#: the copy of the shared golden vectors bundled in the package
BUNDLED_VECTORS = ROOT / "flodl_proto" / "_vectors"


def vectors_root() -> Path:
    """The vector folder under test: ``$FLODL_VECTORS`` when set, else the copy bundled in the
    package (``flodl_proto/_vectors``). Nothing outside the checkout is looked at: a bare clone
    runs every test."""
    env = os.environ.get("FLODL_VECTORS")
    return Path(env) if env else BUNDLED_VECTORS


#: why the network-lab tests were deselected in this run (None: they ran, or none was collected)
_NETLAB_DESELECTED: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``@pytest.mark.deep`` cases unless the run selects them (``-m deep``), and
    ``@pytest.mark.netlab`` cases when the network lab cannot run here (the reason is printed in
    the terminal summary, see :func:`pytest_terminal_summary`)."""
    markexpr = str(config.getoption("markexpr") or "")
    drop_deep = not ("deep" in markexpr and "not deep" not in markexpr)
    lab_items = [item for item in items if item.get_closest_marker("netlab")]
    reason = None
    if lab_items:
        from flodl_proto.netlab import unavailable_reason

        reason = unavailable_reason()
    keep, drop, drop_lab = [], [], []
    for item in items:
        if drop_deep and item.get_closest_marker("deep"):
            drop.append(item)
        elif reason is not None and item.get_closest_marker("netlab"):
            drop_lab.append(item)
        else:
            keep.append(item)
    if drop_lab:
        _NETLAB_DESELECTED[:] = [f"{len(drop_lab)} network-lab test(s) deselected: {reason}"]
    if drop or drop_lab:
        config.hook.pytest_deselected(items=drop + drop_lab)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print why the network-lab tests were deselected (never a silent skip)."""
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

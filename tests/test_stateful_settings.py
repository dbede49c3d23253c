"""The Hypothesis settings the state machines run under: every profile of ``tests/conftest.py``
leaves out the explain phase, and each machine takes its settings from the loaded profile."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings

from . import (
    test_controller_core,
    test_host_fold_stateful,
    test_lifecycle,
    test_relay_core,
    test_stream_stateful,
)


@pytest.mark.parametrize("profile", ["ci", "mutation", "deep"])
def test_every_profile_leaves_out_the_explain_phase(profile: str) -> None:
    """A failing example is shrunk and printed, without the explain phase's rerun under a line
    tracer (minutes on Python 3.11, then "Inconsistent data generation" in place of the steps)."""
    phases = settings.get_profile(profile).phases
    assert Phase.explain not in phases
    assert phases == (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


class _Ran(Exception):
    """Stops a machine's test once the settings it passes have been seen."""


@pytest.mark.parametrize("module, test", [
    (test_controller_core, "test_controller_core_state_machine"),
    (test_relay_core, "test_relay_core_state_machine"),
    (test_host_fold_stateful, "test_host_fold_state_machine"),
])
def test_each_machine_run_by_a_test_has_the_profile_phases(
        monkeypatch: pytest.MonkeyPatch, module: Any, test: str) -> None:
    """The controller, relay and HostFold machines run with the loaded profile's phases."""
    seen: list[settings] = []

    def run(machine: Any, *, settings: settings) -> None:
        seen.append(settings)
        raise _Ran

    monkeypatch.setattr(module, "run_state_machine_as_test", run)
    with pytest.raises(_Ran):
        getattr(module, test)()
    assert seen[0].phases == settings().phases
    assert Phase.explain not in seen[0].phases


@pytest.mark.parametrize("case", [test_lifecycle.TestLifecycleStateful,
                                  test_stream_stateful.TestStreamSplitStateful])
def test_each_machine_test_case_has_the_profile_phases(case: Any) -> None:
    """The lifecycle and stream decoders' machines (pytest TestCases) run with the loaded
    profile's phases."""
    assert case.settings.phases == settings().phases
    assert Phase.explain not in case.settings.phases

"""The Hypothesis state machines: the settings they run under (every profile of
``tests/conftest.py`` leaves out the explain phase, and each machine takes its settings from the
loaded profile) and the docs that list them and the command that runs them."""

from __future__ import annotations

import fnmatch
import re
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
from .conftest import ROOT


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


# -- where the machines are listed -----------------------------------------------------------------


def machine_files() -> list[str]:
    """The test files that define a ``RuleBasedStateMachine`` subclass (``tests/test_x.py``)."""
    return sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
                  if re.search(r"^class \w+\(RuleBasedStateMachine\):", p.read_text(), re.M))


def test_there_are_five_machines() -> None:
    assert machine_files() == ["tests/test_controller_core.py", "tests/test_host_fold_stateful.py",
                               "tests/test_lifecycle.py", "tests/test_relay_core.py",
                               "tests/test_stream_stateful.py"]


@pytest.mark.parametrize("doc", ["docs/testing.md", "fuzz/README.md"])
def test_the_docs_list_every_machine(doc: str) -> None:
    """docs/testing.md's table of what each run reached and fuzz/README.md's table of the
    machines each have a row naming every file that defines one."""
    rows = [line for line in (ROOT / doc).read_text().splitlines() if line.startswith("| ")]
    for path in machine_files():
        assert any(f"`{path}`" in row for row in rows), (doc, path)


def test_the_stateful_command_runs_every_machine() -> None:
    """fuzz/README.md's two ``-m stateful`` commands (``ci`` and ``deep``) name every file that
    defines a machine, and docs/testing.md links there rather than giving a command of its own."""
    text = (ROOT / "fuzz" / "README.md").read_text()
    block = text[text.index("```bash\npython -m pytest -q -m stateful"):]
    block = block[:block.index("\n```\n")]
    commands = [c for c in block.replace("\\\n", " ").splitlines()[1:] if "pytest" in c]
    assert len(commands) == 2 and "HYPOTHESIS_PROFILE=deep" in commands[1]
    for command in commands:
        args = command.split("#")[0].split()
        for path in machine_files():
            assert any(fnmatch.fnmatch(path, a) for a in args), (command, path)
    testing = (ROOT / "docs" / "testing.md").read_text()
    assert "HYPOTHESIS_PROFILE=deep python" not in testing
    assert "(../fuzz/README.md#hypothesis-state-machines)" in testing

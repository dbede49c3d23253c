"""The conformance kit: check any controller or relay against the protocol, case by case.

* :mod:`.catalogue` — the case catalogue (``spec/conformance.yaml`` plus the controller-session
  vectors) and case selection;
* :mod:`.builders` — the bytes a step sends or expects;
* :mod:`.player` — playing one case against a target;
* :mod:`.target` — launched targets (``--launch CMD``) and in-process ones;
* :mod:`.inprocess` — this package's controller and relay as in-process targets;
* :mod:`.report` — running a selection, console lines, JUnit XML and JSON;
* :mod:`.doc` — ``docs/conformance.md``.

The command line is ``flodl-proto conform controller|relay --launch CMD``
(:mod:`flodl_proto.commands.conform`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .catalogue import Case, CatalogueError, load_catalogue, select_cases
    from .player import CaseResult, KitSettings, play_case
    from .report import run_cases
    from .target import CaseContext, InProcessTarget, LaunchedTarget, TargetExit

__all__ = [
    "Case",
    "CaseContext",
    "CaseResult",
    "CatalogueError",
    "InProcessTarget",
    "KitSettings",
    "LaunchedTarget",
    "TargetExit",
    "load_catalogue",
    "play_case",
    "run_cases",
    "select_cases",
]

#: the module of each name above: imported on first use, so that loading the catalogue and
#: writing the reports (``flodl-proto conform`` does both before its first case) do not import
#: the codec, NumPy and ml_dtypes, which the player and the builders need
_HOME = {
    "Case": "catalogue", "CatalogueError": "catalogue", "load_catalogue": "catalogue",
    "select_cases": "catalogue", "CaseResult": "player", "KitSettings": "player",
    "play_case": "player", "run_cases": "report", "CaseContext": "target",
    "InProcessTarget": "target", "LaunchedTarget": "target", "TargetExit": "target",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (``__all__``, imported or not yet) and the module's dunders: not the
    helpers of this module (``importlib``, ``Any``, ...) nor the submodules imported so far."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})

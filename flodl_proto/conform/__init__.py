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

from .builders import CatalogueError
from .catalogue import Case, load_catalogue, select_cases
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

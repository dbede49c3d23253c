"""``flodl_proto.conform`` as a package: what ``dir()`` lists, and that importing it (and asking
for its names) loads no codec, NumPy or ml_dtypes until a name that needs them is used."""

from __future__ import annotations

import json
import subprocess
import sys

#: run in a fresh interpreter: ``dir()`` of the package, its dunders, the heavy modules loaded
_DIR = """
import json, sys
import flodl_proto.conform as m
listed = dir(m)
heavy = [x for x in ("numpy", "ml_dtypes", "flodl_proto.codec") if x in sys.modules]
m.load_catalogue  # a name that needs no codec, imported on first use
from flodl_proto.conform import catalogue  # a submodule, now an attribute of the package
print(json.dumps({"dir": listed, "after": dir(m), "heavy": heavy,
                  "dunders": [n for n in vars(m) if n.startswith("__") and n.endswith("__")]}))
"""

PUBLIC = ["Case", "CaseContext", "CaseResult", "CatalogueError", "InProcessTarget",
          "KitSettings", "LaunchedTarget", "TargetExit", "load_catalogue", "play_case",
          "run_cases", "select_cases"]


def test_dir_lists_the_public_names_and_the_dunders_only() -> None:
    """``dir(flodl_proto.conform)`` listed the module's helpers too (``Any``, ``TYPE_CHECKING``,
    ``annotations``, ``importlib``, ``_HOME``) beside ``__all__``."""
    import flodl_proto.conform as conform

    assert sorted(conform.__all__) == PUBLIC
    res = subprocess.run([sys.executable, "-c", _DIR], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["heavy"] == []  # dir() imports nothing
    dunders = set(got["dunders"])
    assert {"__all__", "__name__", "__doc__", "__path__", "__getattr__", "__dir__"} <= dunders
    want = sorted({*PUBLIC, *dunders})
    assert got["dir"] == want
    assert got["after"] == want  # neither an imported name nor a loaded submodule changes it
    for helper in ("Any", "TYPE_CHECKING", "annotations", "importlib", "_HOME", "catalogue"):
        assert helper not in got["after"]

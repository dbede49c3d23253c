"""``tools/mutate.sh``'s command line: a missing or unknown package is a usage error (exit 2,
the usage on stderr), ``--help`` prints the usage on stdout. Nothing is mutated: these fail
before the checkout is copied."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USAGE = [
    'usage: tools/mutate.sh codec|reduce|fsm|decode|all [--files a.py,b.py] [--tests "a b"] '
    '[--mutants "m ..."] [--keep]',
    "       tools/mutate.sh sample",
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "tools" / "mutate.sh"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_no_package_is_a_usage_error() -> None:
    r = _run()
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == ["mutate.sh: no package given", *USAGE]


def test_an_unknown_package_is_named_with_the_usage() -> None:
    r = _run("bogus")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == ["mutate.sh: unknown package 'bogus'", *USAGE]


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_usage_on_stdout(flag: str) -> None:
    r = _run(flag)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == USAGE

"""The benchmark scripts' command lines: a usage error (a bad option value, an unknown option) is
one error line on stderr, without argparse's usage text, exit 2, nothing on stdout, before
anything is measured (no quiet-machine wait, no network lab); Ctrl-C is one ``interrupted`` line
and exit 130, not a traceback, also while a script imports NumPy; ``--help`` runs in a bare copy
of the checkout (nothing beside it, no package installed)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    ("codec", ["--tensors", "0"],
     "bench/codec.py: error: argument --tensors: must be >= 1, got '0'"),
    ("codec", ["--mib", "-1"], "bench/codec.py: error: argument --mib: must be >= 1, got '-1'"),
    ("codec", ["--mib", "0"], "bench/codec.py: error: argument --mib: must be >= 1, got '0'"),
    ("codec", ["--repeat", "0"], "bench/codec.py: error: argument --repeat: must be >= 1, got '0'"),
    ("codec", ["--mib", "x"],
     "bench/codec.py: error: argument --mib: expected a whole number >= 1, got 'x'"),
    ("codec", ["--mib", "1", "--tensors", "300000"],
     "bench/codec.py: error: argument --tensors: 300000: more tensors than the 262144 f32 "
     "elements of --mib 1"),
    ("reduce", ["--frames", "0", "--mib", "1"],
     "bench/reduce.py: error: argument --frames: must be >= 1, got '0'"),
    ("reduce", ["--mib", "0"], "bench/reduce.py: error: argument --mib: must be >= 1, got '0'"),
    ("reduce", ["--repeat", "0"],
     "bench/reduce.py: error: argument --repeat: must be >= 1, got '0'"),
    ("reduce", ["--threads", "0"],
     "bench/reduce.py: error: argument --threads: must be >= 1, got '0'"),
    # the internal option of the child process that measures one dtype, in the words of every
    # script's choices (it read argparse's "invalid choice: 'f16' (choose from 'f32', 'bf16')")
    ("reduce", ["--one", "f16"],
     "bench/reduce.py: error: argument --one: expected one of f32, bf16, got 'f16'"),
    # a flag given a value, an option without its value
    ("codec", ["--no-verdict=1"],
     "bench/codec.py: error: argument --no-verdict: ignored explicit argument '1'"),
    ("reduce", ["--no-verdict=x"],
     "bench/reduce.py: error: argument --no-verdict: ignored explicit argument 'x'"),
    ("round", ["--full=1"],
     "bench/round.py: error: argument --full: ignored explicit argument '1'"),
    ("wan", ["--write=1"], "bench/wan.py: error: argument --write: ignored explicit argument '1'"),
    ("codec", ["--mib"], "bench/codec.py: error: argument --mib: expected one argument"),
    ("reduce", ["--frames"], "bench/reduce.py: error: argument --frames: expected one argument"),
    ("round", ["--note"], "bench/round.py: error: argument --note: expected one argument"),
    ("hops", ["--worlds"], "bench/hops.py: error: argument --worlds: expected one argument"),
    ("wan", ["--loss"], "bench/wan.py: error: argument --loss: expected one argument"),
    ("round", ["--worlds", "x"],
     "bench/round.py: error: argument --worlds: expected a whole number >= 1, got 'x'"),
    ("round", ["--worlds", "0"], "bench/round.py: error: argument --worlds: must be >= 1, got '0'"),
    ("round", ["--worlds", "2,"],
     "bench/round.py: error: argument --worlds: expected a whole number >= 1, got ''"),
    ("round", ["--dtypes", "f16"],
     "bench/round.py: error: argument --dtypes: expected one of f32, bf16, got 'f16'"),
    ("round", ["--dtypes", "f32,f16"],
     "bench/round.py: error: argument --dtypes: expected one of f32, bf16, got 'f16'"),
    ("round", ["--sizes", "nan"],  # int(nan) raised Python's 'cannot convert float NaN'
     "bench/round.py: error: argument --sizes: frame size 'nan': expected e.g. 4k, 64k, 1m, "
     "256m"),
    ("round", ["--rounds", "0"], "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--warmup", "-1"],
     "bench/round.py: error: argument --warmup: must be >= 0, got '-1'"),
    ("round", ["--reruns", "-1"],
     "bench/round.py: error: argument --reruns: must be >= 0, got '-1'"),
    ("round", ["--max-wait", "-1"],
     "bench/round.py: error: argument --max-wait: must be a finite number >= 0, got '-1'"),
    ("round", ["--max-wait", "nan"],
     "bench/round.py: error: argument --max-wait: must be a finite number >= 0, got 'nan'"),
    # as the controller's and the relay's --protocol-version (int() took '３' and '0_3': the
    # --rounds 0 after them was the error)
    ("round", ["--protocol-version", "\uff13", "--rounds", "0"],
     "bench/round.py: error: argument --protocol-version: invalid int value: '\uff13' (a number "
     "is written in ASCII digits, without '_')"),
    ("round", ["--protocol-version", "0_3", "--rounds", "0"],
     "bench/round.py: error: argument --protocol-version: invalid int value: '0_3' (a number is "
     "written in ASCII digits, without '_')"),
    ("round", ["--protocol-version", "4"],
     "bench/round.py: error: argument --protocol-version: invalid choice: 4 (choose from 2, 3)"),
    # a note is written into bench/RESULTS.md: a line break or a tab broke its paragraph (a
    # table row or a section could start there); --rounds 0 after it was the error
    ("round", ["--note", "fast\n| 1 | 2 |", "--rounds", "0"],
     "bench/round.py: error: argument --note: expected one line of printable text, got "
     "'fast\\n| 1 | 2 |' (holds '\\n')"),
    ("round", ["--note", "a\tb", "--rounds", "0"],
     "bench/round.py: error: argument --note: expected one line of printable text, got "
     "'a\\tb' (holds '\\t')"),
    ("round", ["--note", "x\x1b[2J", "--rounds", "0"],
     "bench/round.py: error: argument --note: expected one line of printable text, got "
     "'x\\x1b[2J' (holds '\\x1b')"),
    # a note starts a line of bench/RESULTS.md: one read as a heading split the section (and
    # the next --write took '## x' for the start of the following section), a fence held the
    # rest of the file as code; '#1' (no space after it) and seven '#' are paragraphs, taken
    ("round", ["--note", "## x", "--rounds", "0"],
     "bench/round.py: error: argument --note: '## x' would be a heading in bench/RESULTS.md, "
     "not a note (it starts with '##')"),
    ("round", ["--note", "   # x", "--rounds", "0"],
     "bench/round.py: error: argument --note: '   # x' would be a heading in "
     "bench/RESULTS.md, not a note (it starts with '   #')"),
    ("round", ["--note", "#", "--rounds", "0"],
     "bench/round.py: error: argument --note: '#' would be a heading in bench/RESULTS.md, not "
     "a note (it starts with '#')"),
    ("round", ["--note", "```text", "--rounds", "0"],
     "bench/round.py: error: argument --note: '```text' would open a code block in "
     "bench/RESULTS.md, not a note (it starts with '```')"),
    ("round", ["--note", "~~~ x", "--rounds", "0"],
     "bench/round.py: error: argument --note: '~~~ x' would open a code block in "
     "bench/RESULTS.md, not a note (it starts with '~~~')"),
    ("round", ["--note", "#1 fastest", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--note", "####### seven", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--note", "```a`b", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    # an HTML block of a kind a blank line does not end, left open on the note's line, held
    # the rest of the file (a comment hid it); one the note ends itself, or a tag a blank line
    # ends ('<div>'), is taken
    ("round", ["--note", "<!-- draft", "--rounds", "0"],
     "bench/round.py: error: argument --note: '<!-- draft' would open an HTML block in "
     "bench/RESULTS.md, not a note (it starts with '<!--')"),
    ("round", ["--note", "  <PRE>", "--rounds", "0"],
     "bench/round.py: error: argument --note: '  <PRE>' would open an HTML block in "
     "bench/RESULTS.md, not a note (it starts with '  <PRE')"),
    ("round", ["--note", "<?php", "--rounds", "0"],
     "bench/round.py: error: argument --note: '<?php' would open an HTML block in "
     "bench/RESULTS.md, not a note (it starts with '<?')"),
    ("round", ["--note", "<!DOCTYPE", "--rounds", "0"],
     "bench/round.py: error: argument --note: '<!DOCTYPE' would open an HTML block in "
     "bench/RESULTS.md, not a note (it starts with '<!D')"),
    ("round", ["--note", "<![CDATA[x", "--rounds", "0"],
     "bench/round.py: error: argument --note: '<![CDATA[x' would open an HTML block in "
     "bench/RESULTS.md, not a note (it starts with '<![CDATA[')"),
    ("round", ["--note", "<!-- done --> and a note", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--note", "<pre>x</pre>", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--note", "<present> 2 < 3", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--note", "<div>", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--note", "    <!-- indented four: code", "--rounds", "0"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '0'"),
    ("round", ["--time-budget", "-1"],
     "bench/round.py: error: argument --time-budget: must be a finite number > 0, got '-1'"),
    ("round", ["--time-budget", "0"],
     "bench/round.py: error: argument --time-budget: must be a finite number > 0, got '0'"),
    ("hops", ["--worlds", "0"], "bench/hops.py: error: argument --worlds: must be >= 1, got '0'"),
    ("hops", ["--sizes", "nan"],
     "bench/hops.py: error: argument --sizes: frame size 'nan': expected e.g. 4k, 64k, 1m, 256m"),
    ("hops", ["--dtype", "f16"],
     "bench/hops.py: error: argument --dtype: expected one of f32, bf16, got 'f16'"),
    ("hops", ["--pairs", "0"], "bench/hops.py: error: argument --pairs: must be >= 1, got '0'"),
    ("hops", ["--rounds", "x"],
     "bench/hops.py: error: argument --rounds: expected a whole number >= 1, got 'x'"),
    ("hops", ["--max-wait", "-1"],
     "bench/hops.py: error: argument --max-wait: must be a finite number >= 0, got '-1'"),
    # the internal option of a bare-chain process
    ("hops", ["--role", "bogus"],
     "bench/hops.py: error: argument --role: expected one of controller, relay, rank, "
     "lean-controller, lean-relay, lean-rank, got 'bogus'"),
    ("wan", ["--worlds", "4", "--caps", "0"],
     "bench/wan.py: error: argument --caps: must be a finite number > 0, got '0'"),
    ("wan", ["--caps", "100,inf"],
     "bench/wan.py: error: argument --caps: must be a finite number > 0, got 'inf'"),
    # the least world size is 4, named as the first bound (it read '>= 2', and 2 was then
    # refused as one host)
    ("wan", ["--worlds", "x"],
     "bench/wan.py: error: argument --worlds: expected a whole number >= 4, got 'x'"),
    ("wan", ["--worlds", "0"],
     "bench/wan.py: error: argument --worlds: must be >= 4 (two ranks per host, two hosts: "
     "one is idle every round), got '0'"),
    ("wan", ["--worlds", "3"],
     "bench/wan.py: error: argument --worlds: must be >= 4 (two ranks per host, two hosts: "
     "one is idle every round), got '3'"),
    ("wan", ["--worlds", "4,5"],
     "bench/wan.py: error: argument --worlds: world size '5' is odd (two ranks per host)"),
    ("wan", ["--worlds", "2"],
     "bench/wan.py: error: argument --worlds: must be >= 4 (two ranks per host, two hosts: "
     "one is idle every round), got '2'"),
    # a world size is named as typed, not as the integer it was read as (it said got 0, world
    # size 5)
    ("round", ["--worlds", "2,00"],
     "bench/round.py: error: argument --worlds: must be >= 1, got '00'"),
    ("round", ["--worlds", "-0"],
     "bench/round.py: error: argument --worlds: must be >= 1, got '-0'"),
    ("hops", ["--worlds", "+0"], "bench/hops.py: error: argument --worlds: must be >= 1, got '+0'"),
    ("wan", ["--worlds", "4, 05"],
     "bench/wan.py: error: argument --worlds: world size '05' is odd (two ranks per host)"),
    ("wan", ["--worlds", "+2"],
     "bench/wan.py: error: argument --worlds: must be >= 4 (two ranks per host, two hosts: "
     "one is idle every round), got '+2'"),
    ("round", ["--rounds", "00"],
     "bench/round.py: error: argument --rounds: must be >= 1, got '00'"),
    ("wan", ["--dtypes", "f16"],
     "bench/wan.py: error: argument --dtypes: expected one of f32, bf16, got 'f16'"),
    ("wan", ["--mib", "0"],
     "bench/wan.py: error: argument --mib: must be a finite number > 0, got '0'"),
    ("wan", ["--mib", "1e-9"],
     "bench/wan.py: error: argument --mib: '1e-9': less than one f32 element per tensor (4 "
     "tensors)"),
    # a real number is written as a whole one is (ASCII, no '_'): float() took both
    ("wan", ["--mib", "1_0"], "bench/wan.py: error: argument --mib: expected a number > 0, got "
     "'1_0'"),
    ("wan", ["--quiet-wait", "\u0661"],
     "bench/wan.py: error: argument --quiet-wait: expected a number >= 0, got '\u0661'"),
    ("wan", ["--rounds", "0"], "bench/wan.py: error: argument --rounds: must be >= 1, got '0'"),
    ("wan", ["--quiet-cores", "0"],
     "bench/wan.py: error: argument --quiet-cores: must be a finite number > 0, got '0'"),
    ("wan", ["--quiet-wait", "-1"],
     "bench/wan.py: error: argument --quiet-wait: must be a finite number >= 0, got '-1'"),
    ("wan", ["--loss", "100"],
     "bench/wan.py: error: argument --loss: must be below 100 (100 % drops every packet), got "
     "'100'"),
    ("wan", ["--loss", "1e3"],
     "bench/wan.py: error: argument --loss: must be below 100 (100 % drops every packet), got "
     "'1e3'"),
    ("wan", ["--loss", "-0.5"],
     "bench/wan.py: error: argument --loss: must be a finite number >= 0, got '-0.5'"),
    ("wan", ["--loss", "nan"],
     "bench/wan.py: error: argument --loss: must be a finite number >= 0, got 'nan'"),
    ("wan", ["--loss", "1%"],
     "bench/wan.py: error: argument --loss: expected a number >= 0, got '1%'"),
    ("wan", ["--loss", "0.005"],
     "bench/wan.py: error: argument --loss: '0.005': finer than the network lab's loss steps "
     "of 0.01 %"),
    ("wan", ["--loss", "99.999"],
     "bench/wan.py: error: argument --loss: '99.999': finer than the network lab's loss steps "
     "of 0.01 %"),
]


@pytest.mark.parametrize(("script", "args", "error"), BAD,
                         ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD])
def test_a_bad_value_is_a_usage_error(script: str, args: list[str], error: str) -> None:
    res = subprocess.run([sys.executable, f"bench/{script}.py", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert res.stderr == f"{error}\n"


def _bench_cli() -> Any:
    """``bench/_cli.py``, loaded as the scripts load it, for the bounds of this machine."""
    spec = importlib.util.spec_from_file_location("bench_cli", ROOT / "bench" / "_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _beyond_the_machine() -> list[tuple[str, list[str], str]]:
    cli = _bench_cli()
    mib, world = cli.mib_max(), cli.world_max()
    assert mib is not None  # Linux: os.sysconf reads the physical memory
    big = "9" * 5000
    return [
        ("round", ["--worlds", "99999999999999999999"],
         f"bench/round.py: error: argument --worlds: must be at most {world}{cli.WORLD_WHY}, got "
         "'99999999999999999999'"),
        ("round", ["--worlds", f"2,{big}"],
         f"bench/round.py: error: argument --worlds: must be at most {world}{cli.WORLD_WHY}, got "
         f"'{'9' * 40}...{'9' * 20}' (5000 characters)"),
        ("round", ["--sizes", "99999999999999999999"],
         "bench/round.py: error: argument --sizes: frame size '99999999999999999999': must be "
         f"at most {mib} MiB (this machine's physical memory)"),
        ("codec", ["--mib", "99999999999"],
         f"bench/codec.py: error: argument --mib: must be at most {mib}{cli.MIB_WHY}, got "
         "'99999999999'"),
        ("codec", ["--mib", "x" + big],
         f"bench/codec.py: error: argument --mib: expected a whole number >= 1, got "
         f"'x{'9' * 39}...{'9' * 20}' (5001 characters)"),
        ("reduce", ["--mib", "99999999999"],
         f"bench/reduce.py: error: argument --mib: must be at most {mib}{cli.MIB_WHY}, got "
         "'99999999999'"),
        ("reduce", ["--frames", str(mib), "--mib", "1"],
         f"bench/reduce.py: error: argument --frames: {mib} with --mib 1: the reduce holds "
         f"(frames + 2) x 1 MiB, more than this machine's physical memory ({mib} MiB)"),
        ("wan", ["--mib", "99999999999"],
         f"bench/wan.py: error: argument --mib: must be at most {mib}{cli.MIB_WHY}, got "
         "'99999999999'"),
        ("wan", ["--worlds", f"4,{world + 2}"],
         f"bench/wan.py: error: argument --worlds: must be at most {world}{cli.WORLD_WHY}, got "
         f"'{world + 2}'"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_a_size_beyond_the_machine_is_a_usage_error(case: int) -> None:
    """Sizes had no upper bound: ``round.py --worlds 99999999999999999999`` and ``codec.py --mib
    99999999`` ended in NumPy's size or memory error with a traceback. A world size beyond the
    rank processes this machine's memory holds, and a payload beyond its physical memory, are
    usage errors before anything runs; a number of thousands of digits is shown as typed, by
    its ends and its length."""
    script, args, error = _beyond_the_machine()[case]
    res = subprocess.run([sys.executable, f"bench/{script}.py", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert res.stderr == f"{error}\n"


SCRIPTS = ["codec", "reduce", "round", "hops", "wan"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_option_is_one_line_without_the_usage_text(script: str) -> None:
    res = subprocess.run([sys.executable, f"bench/{script}.py", "--bogus", "x\ny"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == (f"bench/{script}.py: error: unrecognized arguments: --bogus "
                          "'x\\ny'\n")


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_still_shows_the_usage(script: str) -> None:
    res = subprocess.run([sys.executable, f"bench/{script}.py", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout.startswith(f"usage: bench/{script}.py [-h]")


#: run in a fresh interpreter, in a copy of the checkout (the current folder): the script
#: ``sys.argv[1]`` with ``--help`` as ``python bench/X.py --help`` runs it there, with no
#: installed package on the path (each folder of ``sys.path`` that holds a ``flodl_proto``
#: package is left out: the editable install's, the current folder); then the file the package
#: was imported from, on stderr
_BARE_HELP = """
import runpy, sys
from pathlib import Path
sys.path[:] = [p for p in sys.path
               if not (Path(p or ".") / "flodl_proto" / "__init__.py").is_file()]
sys.argv = [sys.argv[1], "--help"]
sys.path.insert(0, "bench")
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("package:", sys.modules["flodl_proto"].__file__, file=sys.stderr)
"""


def _bare_copy(where: Path) -> Path:
    """A copy of the checkout's bench scripts, package and spec in ``where / "x"``: nothing
    beside it (no ``../shared``), no package installed from it."""
    copy = where / "x"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("bench", "flodl_proto", "spec"):
        shutil.copytree(ROOT / name, copy / name, ignore=skip)
    return copy


@pytest.fixture(scope="module")
def bare_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bare_copy(tmp_path_factory.mktemp("bare"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs_in_a_bare_copy_without_an_installed_package(script: str,
                                                               bare_copy: Path) -> None:
    """``--help`` runs in a bare copy of the checkout, with no ``../shared`` beside it and no
    installed package: ``bench/_cli.py`` puts the copy's package on the path."""
    assert sorted(p.name for p in bare_copy.parent.iterdir()) == ["x"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "FLODL_PROTO_SPEC_DIR")}
    res = subprocess.run([sys.executable, "-c", _BARE_HELP, f"bench/{script}.py"],
                         cwd=bare_copy, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: bench/{script}.py [-h]")
    assert res.stderr == f"package: {bare_copy / 'flodl_proto' / '__init__.py'}\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_spec_that_fails_to_load_is_one_line(script: str, tmp_path: Path) -> None:
    """A broken spec named by ``FLODL_PROTO_SPEC_DIR`` ends a script with one line and exit 2,
    as it ends a command, where the script printed the SpecError's traceback."""
    for name in ("wire.yaml", "lifecycle.yaml"):
        (tmp_path / name).write_bytes((ROOT / "spec" / name).read_bytes())
    (tmp_path / "wire.yaml").write_text("constants: [\n")
    res = subprocess.run([sys.executable, f"bench/{script}.py", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLODL_PROTO_SPEC_DIR": str(tmp_path)})
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.startswith(f"bench/{script}.py: error: cannot load {tmp_path}/wire.yaml: "
                                 "not YAML: ")
    assert res.stderr.count("\n") == 1 and res.stderr.endswith("\n")


#: run in a fresh interpreter: the script ``sys.argv[3]`` as ``python bench/X.py`` runs it, with
#: its arguments, after an import hook that sends this process the signal ``sys.argv[1]`` (its
#: name) when the module ``sys.argv[2]`` is first imported, as a Ctrl-C in the script's first
#: second would
_SIGNAL_AT_IMPORT = """
import importlib.abc, runpy, signal, sys

class Signal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            signal.raise_signal(SIGNUM)
        return None

SIGNUM, MODULE = signal.Signals[sys.argv[1]], sys.argv[2]
sys.argv = sys.argv[3:]
sys.path.insert(0, "bench")
sys.meta_path.insert(0, Signal())
runpy.run_path(sys.argv[0], run_name="__main__")
print("ran on", file=sys.stderr)
"""


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(("sig", "module", "code", "word"), [
    ("SIGINT", "numpy", 130, "interrupted"),
    ("SIGINT", "flodl_proto.cli", 130, "interrupted"),  # while bench/_cli.py loads
    ("SIGTERM", "numpy", 143, "terminated"),
])
def test_a_signal_while_the_script_imports_is_one_line(script: str, sig: str, module: str,
                                                       code: int, word: str) -> None:
    """Ctrl-C in a script's first second (the package's spec, NumPy and ml_dtypes loading) was a
    KeyboardInterrupt traceback; SIGTERM a death without a line. Both are the line
    :func:`_cli.run` writes."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_AT_IMPORT, sig, module,
                          f"bench/{script}.py", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (code, "", f"bench/{script}.py: {word}\n")


def test_reduce_help_shows_defaults_targets_and_no_verdict() -> None:
    res = subprocess.run([sys.executable, "bench/reduce.py", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    for text in ("(default 4)", "(default 256)", "(default 3)", "(default 1)", "--no-verdict",
                 ">= 0.8x", ">= 0.5x", "(frames + 2) x frame + 64 MiB"):
        assert text in out, text


def _interrupt(argv: list[str], ready: str, name: str,
               running: Callable[[int], bool] = lambda pid: True,
               sig: signal.Signals = signal.SIGINT) -> int:
    """Start ``argv``, wait for a stdout line starting with ``ready``, a second, and until
    ``running(pid)``; send SIGINT to the process alone: it exits 130 saying only
    ``NAME: interrupted`` on stderr; or SIGTERM to its whole process group (what ``timeout``
    and a cancelled CI job send): 143 and ``NAME: terminated``. Returns its pid."""
    p = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith(ready):
                break
        time.sleep(1.0)
        deadline = time.monotonic() + 60
        while not running(p.pid):
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        if sig == signal.SIGINT:
            p.send_signal(signal.SIGINT)
        else:
            os.killpg(p.pid, sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    code, word = (130, "interrupted") if sig == signal.SIGINT else (143, "terminated")
    assert p.returncode == code, err
    assert err.splitlines() == [f"{name}: {word}"]
    return p.pid


def test_round_ctrl_c_is_one_line_and_130() -> None:
    _interrupt(["bench/round.py", "--worlds", "2", "--sizes", "4k", "--dtypes", "f32",
                "--max-wait", "0", "--reruns", "0", "--rounds", "100000"], "| W |",
               "bench/round.py")


def _children(pid: int) -> list[tuple[int, bytes]]:
    """``(pid, command line)`` of the live children of ``pid``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append((int(d), cmdline))
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("kill", "line", "after", "scale"), [
    (b"--worker", r"rank [01] (exited with status \d+|was killed by SIG[A-Z]+)(: .+)?", 2.0,
     None),
    # killed before the warm-up ended: the script waited for the other rank's warm-up line,
    # which failed 12 s later (no averaged frame), and named it ("rank exited with status 1: ...");
    # then it named the killed rank only once that line failed, at the other rank's read
    # deadline (120 s x FLODL_NET_TIMEOUT_SCALE, which is 1000 here: past the test's wait)
    (b"--worker", r"rank [01] was killed by SIGKILL", 0.0, "1000"),
    # the ranks fail after it: the relay is named, not the rank that noticed first (killed once
    # the ranks run: the script starts them after the relay's listening line, so a slow start
    # cannot end the run at that line instead)
    (b"relay\0--controller", r"relay 0 was killed by SIGKILL", 2.0, None),
])
def test_round_a_process_that_dies_is_one_error_line_and_exit_1(kill: bytes, line: str,
                                                                after: float,
                                                                scale: str | None) -> None:
    """A rank process killed mid-run ended the script in a RuntimeError traceback quoting up to
    2000 characters of its stderr."""
    import re

    p = subprocess.Popen([sys.executable, "bench/round.py", "--worlds", "2", "--sizes", "4k",
                          "--dtypes", "f32", "--max-wait", "0", "--reruns", "0", "--rounds",
                          "100000", "--no-verdict"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                              **({"FLODL_NET_TIMEOUT_SCALE": scale} if scale else {})})
    try:
        deadline = time.monotonic() + 120
        while not any(b"--worker" in cmd for _, cmd in _children(p.pid)):  # the ranks run
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(after)  # their rounds under way (or not yet)
        workers = [pid for pid, cmd in _children(p.pid) if kill in cmd]
        os.kill(workers[-1], signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 1, err
    assert "Traceback" not in err
    assert re.fullmatch(r"bench/round\.py: error: " + line, err.splitlines()[-1]), err


@pytest.mark.netlab
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_wan_ctrl_c_is_one_line_and_130_and_the_lab_is_gone(sig: signal.Signals) -> None:
    """A SIGTERM to the group (``timeout``'s) left the lab's namespaces behind: Python died at
    once, the lab's cleanup never ran."""
    from flodl_proto.netlab import leftovers

    def lab(pid: int) -> list[str]:  # a lab's tag starts with its owner's pid
        return leftovers(f"flodl-lab-{pid}")

    pid = _interrupt(["bench/wan.py", "--worlds", "4", "--dtypes", "f32", "--caps", "100",
                      "--mib", "1", "--rounds", "100000", "--quiet-wait", "0"], "| W |",
                     "bench/wan.py", lambda pid: any(x.startswith("pid:") for x in lab(pid)),
                     sig)
    assert lab(pid) == []


@pytest.mark.parametrize(("stderr", "line"), [
    ("x\nflodl-proto rank: error: boom\n\n",
     "rank 1 exited with status 1: flodl-proto rank: error: boom"),
    ("e" * 300, f"rank 1 exited with status 1: {'e' * 300}"),
    # cut at 297 characters and "...", without its length, where every other long value of a
    # line is quoted by its ends and its length
    ("e" * 5000, f"rank 1 exited with status 1: '{'e' * 40}...{'e' * 20}' (5000 characters)"),
    # an escape sequence was repeated raw (colouring the terminal)
    ("\x1b[31mred\x1b[0m", "rank 1 exited with status 1: '\\x1b[31mred\\x1b[0m'"),
    ("", "rank 1 exited with status 1"),
], ids=["error-line", "300-characters", "5000-characters", "escape", "nothing"])
def test_exited_repeats_the_last_line_as_a_long_value_is_shown(stderr: str, line: str) -> None:
    assert str(_bench_cli().exited("rank 1", 1, stderr)) == line


@pytest.mark.parametrize(("code", "line"), [
    (-9, "rank 1 was killed by SIGKILL: boom"), (-15, "rank 1 was killed by SIGTERM: boom"),
    (3, "rank 1 exited with status 3: boom"), (None, "rank 1 ended: boom")])
def test_exited_words_the_end_as_the_demo_does(code: int | None, line: str) -> None:
    """A signal by its name and a status as a status, as the demo's summary words a member's
    end (it said ``rank 1 exited with -9``)."""
    assert str(_bench_cli().exited("rank 1", code, "boom\n")) == line


_RANK = {"rank": 0, "world": 2, "relay": "127.0.0.1:1", "nbytes": 4096, "dtype": "f32",
         "version": 2, "warmup": 1, "rounds": 1}


@pytest.mark.parametrize(("script", "value", "error"), [
    ("round", "{", "expected a JSON object, got '{'"),
    ("round", "[1]", "expected a JSON object, got '[1]'"),
    ("round", '{"rank": 0}', "no 'world' in '{\"rank\": 0}'"),
    ("round", json.dumps({**_RANK, "rank": -1}), "'rank': expected a whole number >= 0, got '-1'"),
    ("round", json.dumps({**_RANK, "rounds": True}),
     "'rounds': expected a whole number >= 0, got 'true'"),
    ("round", json.dumps({**_RANK, "relay": 5}), "'relay': expected a string, got '5'"),
    ("wan", "{", "expected a JSON object, got '{'"),
], ids=["round-brace", "round-list", "round-missing", "round-negative", "round-bool",
        "round-relay", "wan-brace"])
def test_a_malformed_worker_is_one_usage_line(script: str, value: str, error: str) -> None:
    """``--worker '{'`` ended in a JSONDecodeError traceback, a missing key in a KeyError's."""
    res = subprocess.run([sys.executable, f"bench/{script}.py", "--worker", value], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == f"bench/{script}.py: error: argument --worker: {error}\n"


_WAN_RANK = {"rank": 0, "world": 4, "relay": "127.0.0.1:1", "mib": 1, "dtype": "f32",
             "warmup": 1, "rounds": 1, "host": 0, "hosts": 2}
_NOT_HEX = ("$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex digits, got "
            "32 characters, character 3 ('z') not a hex digit")


@pytest.mark.parametrize(("script", "salt", "error"), [
    ("round", None, "$FLODL_SESSION_SALT is not set: --worker needs the session salt as 32 hex "
                    "digits (the benchmark sets it for the processes it starts)"),
    ("round", " ", "$FLODL_SESSION_SALT is empty: --worker needs the session salt as 32 hex "
                   "digits (the benchmark sets it for the processes it starts)"),
    ("round", "5az7" + "0" * 28, _NOT_HEX),
    ("round", "0" * 30, "$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex "
                        "digits, got 30 characters"),
    ("round", "0" * 34, "$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex "
                        "digits, got 34 characters"),
    ("wan", None, "$FLODL_SESSION_SALT is not set: --worker needs the session salt as 32 hex "
                  "digits (the benchmark sets it for the processes it starts)"),
    ("wan", "5az7" + "0" * 28, _NOT_HEX),
], ids=["round-unset", "round-blank", "round-not-hex", "round-short", "round-long", "wan-unset",
        "wan-not-hex"])
def test_a_worker_without_a_usable_salt_is_one_usage_line(script: str, salt: str | None,
                                                          error: str) -> None:
    """A worker run by hand without ``$FLODL_SESSION_SALT`` ended in a KeyError's traceback, one
    with a salt that is not hex in a ValueError's; one of another length went on to connect. One
    line naming the variable now, without the salt's digits, exit 2, before any connection (the
    relay's address is a closed port)."""
    env = {k: v for k, v in os.environ.items() if k != "FLODL_SESSION_SALT"}
    if salt is not None:
        env["FLODL_SESSION_SALT"] = salt
    cfg = _RANK if script == "round" else _WAN_RANK
    res = subprocess.run([sys.executable, f"bench/{script}.py", "--worker", json.dumps(cfg)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", f"bench/{script}.py: error: {error}\n")


def test_ctrl_c_that_leaves_a_lock_unheld_is_the_interrupted_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C inside a queue's wait, as the wait takes its lock back, ended the script in
    ``RuntimeError: release unlocked lock`` (the KeyboardInterrupt its context)."""
    cli = _bench_cli()

    def main() -> int:
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("release unlocked lock")

    with pytest.raises(SystemExit) as e:
        cli.run(main, "bench/round.py")
    assert e.value.code == 130
    assert capsys.readouterr().err == "bench/round.py: interrupted\n"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # run's handler
    with pytest.raises(RuntimeError, match="other"):  # not a Ctrl-C: as it is
        cli.run(lambda: (_ for _ in ()).throw(RuntimeError("other")), "bench/round.py")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

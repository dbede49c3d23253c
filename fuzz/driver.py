"""atheris driver for one target: ``python fuzz/driver.py TARGET [libFuzzer flags] [corpus dirs]``.

The target's module (``fuzz/harnesses/TARGET.py``) and :mod:`flodl_proto` are imported inside
``atheris.instrument_imports`` so the fuzzer sees their coverage. Before fuzzing, the address
space is capped at what the process uses after start-up plus ``FLODL_FUZZ_AS_SLACK_MB``
(default 512 MiB): the largest input is a few KiB, so an allocation sized from a hostile length
claim (the 1 GiB ceiling, a 4 GiB ``payload_len``) fails with ``MemoryError`` and becomes a
finding instead of going unnoticed, while one 64 MiB read chunk still fits.

``fuzz/run.sh`` is the usual way in; see ``fuzz/README.md``.
"""

from __future__ import annotations

import importlib
import logging
import os
import resource
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _vm_size() -> int:
    """Current virtual memory size of this process in bytes (0 if unknown)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def limit_address_space() -> None:
    """Cap the address space at the current size plus ``FLODL_FUZZ_AS_SLACK_MB`` MiB (a whole
    number from 0 to 999999999, default 512; 0: no cap). A value that is none is one line on
    stderr and exit 2, as ``fuzz/run.sh`` refuses it (the driver may be run by hand)."""
    raw = os.environ.get("FLODL_FUZZ_AS_SLACK_MB") or "512"
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        print("fuzz/driver.py: FLODL_FUZZ_AS_SLACK_MB must be a whole number of MiB from 0 to "
              f"999999999, got {raw!r}", file=sys.stderr)
        raise SystemExit(2)
    slack_mb = int(raw)
    vm = _vm_size()
    if slack_mb <= 0 or vm == 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vm + (slack_mb << 20)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str]) -> None:
    """Instrument and import the target named by ``argv[1]``, then hand over to libFuzzer."""
    import atheris

    logging.disable(logging.CRITICAL)  # the controller logs every failed run it is fed

    from fuzz.harnesses import TARGETS

    # libFuzzer re-runs argv[0] with its own flags for -merge, -minimize_crash and -fork: the
    # target travels in the environment, argv[0] becomes a shell command running this file
    if len(argv) > 1 and argv[1] in TARGETS:
        target, rest = argv[1], argv[2:]
    else:
        target, rest = os.environ.get("FLODL_FUZZ_TARGET", ""), argv[1:]
    if target not in TARGETS:
        sys.exit(f"usage: {argv[0]} TARGET [libFuzzer args]; targets: {' '.join(TARGETS)}")
    os.environ["FLODL_FUZZ_TARGET"] = target
    argv0 = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))}"
    if minimizing(rest):
        # libFuzzer's -minimize_crash only runs argv[0] again, once per try, and never calls
        # the target itself: the target (NumPy, ml_dtypes, the instrumented package, seconds
        # to start) is loaded by those runs only
        atheris.Setup([argv0, *rest], _not_run)
        atheris.Fuzz()
    with atheris.instrument_imports(include=["flodl_proto", "fuzz"]):
        module = importlib.import_module(f"fuzz.harnesses.{target}")
    limit_address_space()
    atheris.Setup([argv0, *rest], module.test_one_input)
    atheris.Fuzz()


def minimizing(flags: list[str]) -> bool:
    """Whether libFuzzer's flags ask for a crash minimization (``-minimize_crash=N``, N not 0;
    the last of several decides, as libFuzzer reads them), not one of its steps."""
    on = False
    for flag in flags:
        if flag.startswith("-minimize_crash="):
            value = flag.split("=", 1)[1]
            on = value.lstrip("-").isdigit() and int(value) != 0
    return on


def _not_run(data: bytes) -> None:
    """The target of a driver that only minimizes: libFuzzer never calls it."""
    raise AssertionError("the minimizing driver ran an input itself")


if __name__ == "__main__":
    main(sys.argv)

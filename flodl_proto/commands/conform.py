"""``flodl-proto conform``: check any controller or relay against the protocol's case catalogue.

::

    flodl-proto conform controller --launch CMD [options]
    flodl-proto conform relay --launch CMD [options]
    flodl-proto conform controller|relay --list
    flodl-proto conform docs [--out PATH] [--check]

For each selected case and version the kit picks free ports, a fresh salt and the case's world
size, fills the placeholders of CMD (controller: ``{host} {port} {salt} {salt_file}
{world_size} {version}``; relay: ``{controller} {ranks} {world_size} {salt} {salt_file}
{version} {listen_port}``), starts the target with ``FLODL_NET_TIMEOUT_SCALE`` set to
``--timeout-scale``, waits until it listens, plays the case, then stops it (SIGTERM, SIGKILL
after a bound) and records its exit status. One line per case, a summary by doc section.
Exit codes: 0 when every selected MUST case passed, 1 when one failed or a ``--junit`` /
``--json`` report cannot be written (a path that names a folder or has a file, or a loop of
symbolic links, where a folder of it should be, or is such a loop, is a bad command line, found
before anything runs; first written once the command line is checked and the
catalogue loaded, before the codec is imported and the first case runs, as an interrupted run
of no case, or as the kit stops when Ctrl-C or SIGTERM arrives before that, so a kit stopped
once its command line is parsed leaves no earlier run's report; one stopped before, while the
parser is built, writes none; a report is never written twice for one stop, and a Ctrl-C
during a write stops it, the file left whole, old or new, the other report still written; a
FIFO that no process reads is a report that cannot be written, not a wait for a reader), 2 for
a bad command line (as ``--list`` with ``--junit`` or ``--json``: a listing writes no report;
``argument --junit: not allowed with argument --list``), a
``--launch`` command that cannot be started included (no such program, not executable: one line
naming it and the OS error, ``argument --launch: cannot start the target ...``, and no case runs;
one the machine cannot start now, with no process, memory or file descriptor to be had, is a
failed run, exit 1, the same line without ``argument --launch:``; ``--launch`` given twice is a
bad command line, ``argument --launch: given twice ...``). A target that does not start (it
exits, does not listen within ``--start-timeout`` seconds, 20 by default and not scaled by
``--timeout-scale``, or refuses the case's first connection on the
address it printed) fails its case, with its last lines of output;
when the first cases (as many as ``--jobs`` runs at once) all fail so, the others are not run:
one line says so, exit 1. Ctrl-C or SIGTERM stops the targets running (a case's target not
started yet is not started), removes their salt files and ends the kit with one line, also
while its modules load: ``interrupted`` and exit 130 after Ctrl-C, ``terminated`` and exit
143 after SIGTERM. The reports of a run that stopped early hold the cases that ended and list
the others as not run, with the reason (JUnit: skipped; JSON: ``not_run``). A kit stopped by
a signal says so in them, with the stop's word: JSON ``interrupted`` true and ``stop``
``"interrupted"`` (Ctrl-C) or ``"terminated"`` (SIGTERM), null for a run not stopped; JUnit the
properties ``interrupted=true`` and ``stop=WORD`` on every suite; and the reason of the cases not
run, ``not run: the kit was terminated``. CMD may span lines: a backslash at the end of a line joins
it to the next, as in a shell script. ``docs --check``: 0 up to date, 1 missing
or out of date, 2 when PATH cannot be read.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import shlex
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import make_folders
from .._numbers import not_plain_note, plain_number
from .._oserr import os_reason
from .._unseen import terminal_text
from ..cli import AnyCase, interrupts_held, named_by_spec_dir, note_stop, stop_outcome
from ..conform._defaults import DEFAULT_WITHIN, DEFAULT_WITHIN_FLOOR, READY_TIMEOUT
from ..errors import ProtocolError, shown
from ..spec import SUPPORTED_VERSIONS
from ._option_error import option_conflict, option_message
from ._output import rich_console
from ._paths import output_path
from .relay import TIMEOUT_MAXIMUM, check_net_timeout_scale, whole_number

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..conform.catalogue import Case
    from ..conform.player import CaseResult

__all__ = ["JOBS_MAX", "register"]

_PROG = "flodl-proto conform"
#: why the cases of an interrupted run were not run (the reports' reason): the first reports,
#: written before any case runs, say so until the kit replaces them
_INTERRUPTED = "not run: the kit was interrupted"
_EXIT_CODES = ("exit codes: 0 every selected MUST case passed; 1 a MUST case failed, the "
               "target did not start in the first cases (the others are not run), or a "
               "--junit/--json report cannot be written, or no process could be created for "
               "the target; 2 a bad command line, or a --launch command that cannot be "
               "started (no such program, not executable); 130 "
               "interrupted (Ctrl-C), 143 terminated (SIGTERM): the targets are stopped")
_PLACEHOLDERS = {
    "controller": "{host} {port} {salt} {salt_file} {world_size} {version}",
    "relay": "{controller} {ranks} {world_size} {salt} {salt_file} {version} {listen_port}",
}


#: the most cases ``--jobs`` runs at once, each with a target process and ports of its own
JOBS_MAX = 1024


def _default_jobs() -> int:
    # a case mostly waits (target start-up, silences, timeouts): two per CPU, at most 4
    return max(1, min(4, 2 * (os.cpu_count() or 1)))


def register(sub: Any) -> None:
    """Add the ``conform`` subcommand.

    No upstream counterpart (the command line is this package's own).
    """
    p = sub.add_parser(
        "conform", help="conformance kit: check a controller or relay against the spec",
        description="Run the conformance case catalogue against a controller or relay started "
        "from --launch CMD, one fresh target per case.",
    )
    roles = p.add_subparsers(dest="role", metavar="ROLE", required=True)
    for role in ("controller", "relay"):
        r = roles.add_parser(role, help=f"check a {role}",
                             description=f"Check a {role}. Placeholders of CMD: "
                             f"{_PLACEHOLDERS[role]}.", epilog=_EXIT_CODES)
        r.add_argument("--launch", metavar="CMD", action=_GivenOnce,
                       help=f"command starting the target; placeholders {_PLACEHOLDERS[role]} "
                            "(given once)")
        r.add_argument("--version", dest="versions", type=whole_number, action="append",
                       choices=SUPPORTED_VERSIONS, metavar="2|3",
                       help="protocol version to check (repeatable; default: both)")
        r.add_argument("--cases", action="append", default=[], metavar="GLOB",
                       help="only the case ids matching this shell glob (repeatable)")
        r.add_argument("--level", choices=AnyCase(("must", "should")),
                       help="only MUST or only SHOULD cases (default: both)")
        r.add_argument("--timeout-scale", default="1.0", metavar="X",
                       help="exported to the target as FLODL_NET_TIMEOUT_SCALE; scales the "
                            "kit's waits that follow the target's timeouts, and its default "
                            f"wait for an expectation ({DEFAULT_WITHIN:g} s x X, at least "
                            f"{DEFAULT_WITHIN_FLOOR:g} s) (0.1 to 1000; "
                            "default 1)")
        r.add_argument("--start-timeout", type=_start_timeout, default=READY_TIMEOUT,
                       metavar="SECONDS",
                       help="how long a target may take to listen, not scaled by "
                            f"--timeout-scale ({_START_RULE}; default {READY_TIMEOUT:g})")
        r.add_argument("--port-mux", action="store_true",
                       help="the target serves the port mux: run the cases that need it")
        r.add_argument("--jobs", type=whole_number, default=_default_jobs(), metavar="N",
                       help="cases run at the same time, each against its own target, 1 to "
                            f"{JOBS_MAX} (default {_default_jobs()}: two per CPU, at most 4)")
        r.add_argument("--junit", type=_report_path, metavar="PATH",
                       help="write JUnit XML to this file (missing parent folders are created; "
                            "not -: stdout carries the case lines)")
        r.add_argument("--json", type=_report_path, metavar="PATH",
                       help="write JSON results to this file (missing parent folders are "
                            "created; not -: stdout carries the case lines)")
        r.add_argument("--list", action="store_true",
                       help="list the selected cases (no target needed, no report written) and "
                            "exit")
        r.set_defaults(func=_run, stopped_before_run=_stopped_before_run)
    d = roles.add_parser("docs", help="generate docs/conformance.md from the catalogue")
    d.add_argument("--out", type=output_path, default=None, metavar="PATH",
                   help="output file (default: the checkout's docs/conformance.md, found from "
                   "the current folder up, else that path here; '-' writes to stdout); missing "
                   "parent folders are created")
    d.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if PATH is missing or out of date, 2 if it "
                   "cannot be read")
    d.set_defaults(func=_run_docs)


class _GivenOnce(argparse.Action):
    """argparse action of ``--launch``: stores its value, and refuses the option given a second
    time (``argument --launch: given twice ...``, exit 2), where argparse kept the last value
    and the kit ran a command the user may not have meant."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            raise argparse.ArgumentError(self, "given twice; the kit starts one command (quote "
                                               "a command of several words as one value)")
        setattr(namespace, self.dest, values)


#: the rule of ``--start-timeout``, as its help and its error state it
_START_RULE = f"a finite number of seconds above 0, at most {TIMEOUT_MAXIMUM:g}"


def _start_timeout(text: str) -> float:
    """argparse ``type=`` of ``--start-timeout``: a finite number of seconds above 0, at most
    ``TIMEOUT_OPTION_MAXIMUM`` (864000), written as the other number options
    (:func:`flodl_proto._numbers.plain_number`); not scaled by ``--timeout-scale``.

    Raises:
        argparse.ArgumentTypeError: any other text (``argument --start-timeout: must be ...,
            got '0'``).
    """
    try:
        value = float(text) if plain_number(text) else math.nan
    except ValueError:
        value = math.nan
    if not 0 < value <= TIMEOUT_MAXIMUM:
        raise argparse.ArgumentTypeError(f"must be {_START_RULE}, got {shown(text)}"
                                         f"{not_plain_note(text)}")
    return value


def _report_path(text: str) -> Path:
    """argparse ``type=`` of ``--junit`` and ``--json``: :func:`~._paths.output_path`, but not ``-``
    (stdout carries the case lines, which a report there would be mixed with).

    Raises:
        argparse.ArgumentTypeError: ``text`` is ``-``, empty, or ends with ``/``.
    """
    if not text:  # output_path's message offers -, which a report cannot be
        raise argparse.ArgumentTypeError("is empty; give a file path")
    if text == "-":
        raise argparse.ArgumentTypeError("cannot be - (stdout carries the case lines); give a "
                                         "file path")
    return output_path(text)


# the kit and rich are imported when the command runs: other commands do not pay for them


def _prog(args: argparse.Namespace) -> str:
    """The prefix of the kit's lines, as argparse's: ``flodl-proto conform controller``."""
    return f"{_PROG} {args.role}"


def _usage(message: str, args: argparse.Namespace) -> int:
    print(f"{_prog(args)}: error: {message}", file=sys.stderr, flush=True)
    return 2


def _title(key: str) -> str:
    from ..conform.sections import resolve_section

    try:
        return resolve_section(key).heading
    except KeyError:
        return key


def _list(runs: list[tuple[Case, int]], skipped: list[tuple[Case, str]]) -> int:
    seen: dict[str, list[int]] = {}
    cases: dict[str, Case] = {}
    for c, v in runs:
        seen.setdefault(c.id, []).append(v)
        cases[c.id] = c
    for cid, vs in seen.items():
        c = cases[cid]
        err = f" error {c.error}" if c.error else ""
        print(f"{cid}  {c.level}  v{','.join(map(str, vs))}  {_title(c.section)}{err}  "
              f"- {c.title}")
    for c, why in skipped:
        print(f"{c.id}  {c.level}  not selected ({why})  - {c.title}")
    print(f"{_counted(len(seen), 'case')}, {_counted(len(runs), 'run')} selected; "
          f"{len(skipped)} not selected")
    return 0


def _counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural but for one: ``1 case``, ``3 cases``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _run(args: argparse.Namespace) -> int:
    role = str(args.role)
    runs: list[tuple[Case, int]] = []
    skipped: list[tuple[Case, str]] = []
    cut_short: list[Path] = []  # the report whose first write a stop cut short
    written: list[bool] = []  # by _play, from a stop's reports or the final ones on
    try:
        prepared = _prepare(args, role, runs, skipped)
        if prepared is not None:
            return prepared
        # written now as an interrupted run of no case: a report that cannot be written is
        # found before any case runs, and a kit stopped from here on leaves no earlier run's
        # report
        if not _write_reports(args, role, [], skipped, runs, _INTERRUPTED, stop="interrupted",
                              writing=cut_short):
            return 1
        return _play(args, role, runs, skipped, written)
    except KeyboardInterrupt:
        # Ctrl-C, or SIGTERM (as Ctrl-C until _play sets its handler), before _play wrote
        # reports of its own: while the command line is checked, the catalogue or the reports'
        # writer loads, a first report is written, the player and the codec load. The reports
        # name the stop (``terminated``), not an earlier run; one whose write the stop cut
        # short is not started again (each report is replaced whole or not at all)
        if not written:
            _stopped_before_cases(args, role, skipped, runs, but=cut_short)
        raise


def _stopped_before_cases(args: argparse.Namespace, role: str,
                          skipped: list[tuple[Case, str]], runs: list[tuple[Case, int]],
                          but: Iterable[Path] = ()) -> None:
    """Write the reports asked for (not for ``--list``, which writes none) of a kit stopped
    before any case ended: the ``runs`` selected so far not run, for the stop's word; the
    reports ``but`` are left as they are."""
    if not args.list and (args.junit or args.json):
        _write_stopped_reports(args, role, [], skipped, runs, but=but)


def _stopped_before_run(args: argparse.Namespace) -> None:
    """The command line's hook for a stop (Ctrl-C, SIGTERM) that arrives once the command line
    is parsed but before :func:`_run` starts (while ``FLODL_PROTO_KERNELS`` is checked: NumPy
    and the codec load): the reports asked for, of a run of no case, name the stop."""
    _stopped_before_cases(args, str(args.role), [], [])


def _prepare(args: argparse.Namespace, role: str, runs: list[tuple[Case, int]],
             skipped: list[tuple[Case, str]]) -> int | None:
    """Check the command line, load the catalogue and select the cases into ``runs`` and
    ``skipped``; the exit code when the command ends here (a usage error, ``--list``), else
    None (the caller writes the first reports: an interrupted run of no case).
    """
    # the catalogue, the command's checks and the first reports import no codec: the slow
    # imports (the player and the codec with NumPy and ml_dtypes, rich's progress) come after
    # the first write, so a kit stopped while they load leaves no earlier run's report either
    from ..conform.catalogue import CatalogueError, load_catalogue, select_cases
    from ..conform.target import fill_placeholders

    if args.list and (args.junit is not None or args.json is not None):
        report = "--junit" if args.junit is not None else "--json"
        return _usage(option_conflict(report, "--list", "a listing writes no report"), args)
    try:
        check_net_timeout_scale(args.timeout_scale, field="--timeout-scale")
    except ProtocolError as e:  # the catalogue's message, in argparse's words for an
        # option's value: argument --timeout-scale: VALUE ..., where it reads FIELD=VALUE ...
        return _usage(option_message("--timeout-scale", str(e).removeprefix("--timeout-scale=")),
                      args)
    if not 1 <= args.jobs <= JOBS_MAX:
        return _usage(option_message("--jobs", f"must be in 1..{JOBS_MAX}, got {args.jobs}"), args)
    for pattern in args.cases:  # ``--cases "$IDS"`` with the variable unset matches no id
        if not pattern.strip():
            blank = "empty" if not pattern else "blank"
            return _usage(option_message("--cases", f"no pattern (the value is {blank})"), args)
    if args.junit is not None and args.json is not None and _same_report(args.junit, args.json):
        return _usage(option_message("--json", f"{shown(str(args.json))}: the same file as "
                                     f"--junit {shown(str(args.junit))} (one report would "
                                     "replace the other); give two paths"), args)
    try:
        catalogue = load_catalogue()
    except (CatalogueError, OSError) as e:
        return _usage(named_by_spec_dir(f"catalogue: {e}"), args)
    versions = sorted(set(args.versions or SUPPORTED_VERSIONS))
    level = args.level.upper() if args.level else None
    selected, not_selected = select_cases(catalogue, role=role, versions=versions,
                                          patterns=args.cases, level=level,
                                          port_mux=args.port_mux)
    runs[:], skipped[:] = selected, not_selected
    left_out = _left_out(catalogue, role, args, versions, level) if not runs else []
    if args.list:  # a selection of no case is the same usage error as for a run
        return _list(runs, skipped) if runs else _usage(_no_case(left_out, args), args)
    if args.launch is None:
        return _usage(option_message("--launch", "is required, unless --list is given"), args)
    if not args.launch:  # given, but ``--launch "$CMD"`` with the variable unset; a blank
        # value is fill_placeholders's "(the value is blank)"
        return _usage(option_message("--launch", "no command (the value is empty)"), args)
    probe = {k.strip("{}"): "x" for k in _PLACEHOLDERS[role].split()}
    try:
        fill_placeholders(args.launch, probe)
    except ValueError as e:
        return _usage(option_message("--launch", str(e)), args)
    if not runs:
        return _usage(_no_case(left_out, args), args)
    return None


def _left_out(catalogue: Iterable[Case], role: str, args: argparse.Namespace,
              versions: list[int], level: str | None) -> list[tuple[Case, str]]:
    """The cases of ``role`` that ``--cases`` matches, each with every need the selection left
    it out for (``needs --level must and --version 3``: all of them bring it back, where one
    alone would not), grouped by the first filter that leaves it out (the level, the target's
    needs, the version: the order :func:`~flodl_proto.conform.catalogue.select_cases` applies
    them), each group in catalogue order. For the error of a selection that runs no case."""
    from ..conform.catalogue import FILTERS, left_out_by, matching_cases

    why = [(c, left_out_by(c, versions=versions, level=level, port_mux=args.port_mux))
           for c in matching_cases(catalogue, role=role, patterns=args.cases)]
    why = sorted(((c, parts) for c, parts in why if parts),
                 key=lambda item: FILTERS.index(item[1][0][0]))
    return [(c, "needs " + " and ".join(need for _, need in parts)) for c, parts in why]


def _no_case(left_out: list[tuple[Case, str]], args: argparse.Namespace) -> str:
    """The usage error of a selection that runs no case, with what left out the cases it
    matched (``needs --level must: 2; needs --port-mux: 6; needs --port-mux and --version 3:
    1``), or, when ``--cases`` matched none, the patterns given and how to see the ids, as an
    error of ``--cases`` (``argument --cases: no relay case id matches 'x' or 'y'; ...``)."""
    if not left_out:
        if not args.cases:
            return "no case selected"
        given = " or ".join(shown(p) for p in dict.fromkeys(args.cases))  # each once
        return option_message("--cases", f"no {args.role} case id matches {given}; "
                              f"'flodl-proto conform {args.role} --list' without --cases "
                              "lists the ids")
    reasons = collections.Counter(why for _, why in left_out)
    n = len(left_out)
    return (f"no case selected: {n} {'case matches' if n == 1 else 'cases match'} but "
            f"{'is' if n == 1 else 'are'} left out ("
            + "; ".join(f"{why}: {k}" for why, k in reasons.items()) + ")")


def _play(args: argparse.Namespace, role: str, runs: list[tuple[Case, int]],
          skipped: list[tuple[Case, str]], written: list[bool]) -> int:
    """Run the selected cases (the first reports are written), print their lines and the
    summary, write the final reports; the exit code. ``written`` gets an item as the reports
    are written again (for a stop, or at the end): from then on a stop leaves them as they
    are."""
    timeout_scale = check_net_timeout_scale(args.timeout_scale, field="--timeout-scale")
    with interrupts_held():  # the codec's extension modules load: Ctrl-C after, as one line
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from ..conform.player import KitSettings
        from ..conform.report import (
            RunInterrupted,
            TargetNeverStarted,
            case_line,
            exit_code,
            run_cases,
            section_line,
            summary_by_section,
        )
        from ..conform.target import LaunchedTarget, TargetLaunchError

    settings = KitSettings(timeout_scale=timeout_scale, ready_timeout=args.start_timeout)
    console = rich_console(stderr=False, highlight=False, soft_wrap=True)
    lock = threading.Lock()
    progress = Progress(TextColumn("[bold]conform {task.fields[role]}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
                        TimeElapsedColumn(), console=console, transient=True,
                        disable=not console.is_interactive)  # else it ends with a blank line
    failed = 0
    live: list[LaunchedTarget] = []
    live_lock = threading.RLock()  # reentrant: the signal handler runs in the main thread
    stop = threading.Event()

    def make_target() -> LaunchedTarget:
        t = LaunchedTarget(args.launch)
        with live_lock:
            live.append(t)
            if stop.is_set():  # the handler ran before this case made its target (it set the
                # stop before taking the lock): the target is not started
                t.send_signal(signal.SIGTERM)
        return t

    def interrupted(signum: int, frame: object) -> None:
        # the targets run in sessions of their own (a terminal's Ctrl-C does not reach them):
        # stop them, so the cases in flight end now and remove their salt files; a target
        # made but not started yet is not started (LaunchedTarget.send_signal)
        note_stop(signum)  # SIGTERM: the kit says "terminated" and exits 143
        stop.set()
        with live_lock:
            targets = list(live)
        starting = False
        for t in targets:
            t.send_signal(signal.SIGTERM)
            starting = starting or t.starting_here()
        if starting:  # this thread is inside a target's Popen (--jobs 1): raising there would
            # leave its process running, unknown to the target; the start gives it SIGTERM, its
            # case ends, and the run with it (the stop is set)
            return
        raise KeyboardInterrupt

    def on_result(r: CaseResult) -> None:  # not called for a case cut short by a stop
        nonlocal failed
        with lock:
            failed += not r.passed
            for line in case_line(r, _title(r.case.section)):
                style = "green" if r.passed else "red" if line.startswith("FAIL") else None
                # a target's output and what it sent, its control characters shown, not
                # played on the user's terminal
                console.print(terminal_text(line), style=style, markup=False)
            progress.update(task, advance=1, failed=failed)

    gave_up: TargetNeverStarted | None = None
    # Ctrl-C and SIGTERM, each unless ignored when the kit started (SIGINT in a shell's
    # background job): it stays so, as for every command
    old = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)
           if signal.getsignal(sig) is not signal.SIG_IGN} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        with progress:
            task = progress.add_task("cases", total=len(runs), role=role, failed=0)
            results = run_cases(runs, make_target, settings, jobs=args.jobs,
                                on_result=on_result, stop=stop)
    except TargetLaunchError as e:  # every case would fail the same way
        written.append(True)
        _write_reports(args, role, [], skipped, runs, "not run: the --launch command cannot be "
                       "started")
        if e.no_process:  # the machine's state (no process to be had now), not the command
            # line's: a failed run, not a usage error
            print(f"{_prog(args)}: error: {e}", file=sys.stderr, flush=True)
            return 1
        return _usage(option_message("--launch", str(e)), args)  # no such program, ...
    except TargetNeverStarted as e:  # the others would most likely fail the same way
        results, gave_up = e.results, e
    except RunInterrupted as e:  # the reports hold the cases that ended; then exit 130 or 143
        written.append(True)
        _write_stopped_reports(args, role, e.results, skipped, runs)
        raise KeyboardInterrupt from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    console.print("")
    console.print("summary by section:", markup=False)
    for row in summary_by_section(results, _title):
        console.print(section_line(*row), markup=False)
    for c, why in skipped:
        console.print(f"  not selected: {c.id} ({why})", markup=False)
    n_pass = sum(r.passed for r in results)
    must_fail = sum(not r.passed and r.case.level == "MUST" for r in results)
    should_fail = sum(not r.passed and r.case.level == "SHOULD" for r in results)
    console.print(f"{role}: {n_pass} passed, {must_fail} MUST failed, {should_fail} SHOULD "
                  f"failed, {len(skipped)} not selected", markup=False)
    written.append(True)
    if not _write_reports(args, role, results, skipped, runs,
                          "not run: the target did not start in the first case(s)"):
        return 1
    if gave_up is not None:
        print(f"{_prog(args)}: error: {gave_up}", file=sys.stderr, flush=True)
        return 1
    return exit_code(results)


def _write_stopped_reports(args: argparse.Namespace, role: str, results: list[CaseResult],
                           skipped: list[tuple[Case, str]], runs: list[tuple[Case, int]],
                           but: Iterable[Path] = ()) -> bool:
    """:func:`_write_reports` of a kit stopped by a signal: the stop's word
    (:func:`~flodl_proto.cli.stop_outcome`: ``interrupted`` after Ctrl-C, ``terminated`` after
    SIGTERM) in the reports' ``stop`` and in the reason of the cases not run (``not run: the
    kit was terminated``); the reports ``but`` are not written."""
    word = stop_outcome()[0]
    return _write_reports(args, role, results, skipped, runs, f"not run: the kit was {word}",
                          stop=word, but=but)


def _write_reports(args: argparse.Namespace, role: str, results: list[CaseResult],
                   skipped: list[tuple[Case, str]], runs: list[tuple[Case, int]],
                   not_run_reason: str, *, stop: str | None = None, but: Iterable[Path] = (),
                   writing: list[Path] | None = None) -> bool:
    """Write the ``--junit`` / ``--json`` reports asked for, but not those of ``but``: the
    ``results``, the cases not selected, and the selected ``runs`` with no result (not run, for
    ``not_run_reason``); a run stopped by a signal names the ``stop`` (its word). ``writing``,
    when given, holds the path of the report being written while it is (a stop that cuts the
    write short leaves it there). False (the error line printed) when one cannot be written."""
    from ..conform.report import write_json, write_junit

    ran = {(r.case.id, r.version) for r in results}
    not_run = [(c, v) for c, v in runs if (c.id, v) not in ran]
    left = set(but)
    for path, write in ((args.junit, write_junit), (args.json, write_json)):
        if path is None or path in left:
            continue
        if writing is not None:
            writing.append(path)
        try:
            make_folders(path.parent)  # as the generators' outputs
            write(path, role, results, skipped, _title, not_run=not_run,
                  not_run_reason=not_run_reason, stop=stop)
        except OSError as e:  # an output file, as `docs --out`: exit 1 (2: a bad command line)
            _report_error(path, _os_reason(e), args)
            return False
        if writing is not None:
            writing.remove(path)
    return True


def _same_report(a: Path, b: Path) -> bool:
    """Whether reports written to ``a`` and ``b`` would be one file, the second replacing the
    first: the same path once links are followed, a regular file or none yet (not a device as
    ``/dev/null``, which takes both)."""
    if os.path.realpath(a) != os.path.realpath(b):
        return False
    try:
        return stat.S_ISREG(os.stat(a).st_mode)
    except OSError:  # none yet (or not to be looked at: writing it will tell)
        return True


def _os_reason(e: OSError) -> str:
    return "Not a directory" if isinstance(e, FileExistsError) else os_reason(e)


def _report_error(path: Path, why: str, args: argparse.Namespace) -> None:
    """One line on stderr: the report ``path`` (``--junit``/``--json``) cannot be written,
    the path quoted as every line naming a path of the command line quotes it (``cannot
    write the report 'out/r.xml': Permission denied``)."""
    print(f"{_prog(args)}: error: cannot write the report {shown(str(path))}: {why}",
          file=sys.stderr)


def _run_docs(args: argparse.Namespace) -> int:
    from ..conform.catalogue import CatalogueError
    from ..conform.doc import render_conformance_doc

    try:
        text = render_conformance_doc()
    except CatalogueError as e:
        return _usage(named_by_spec_dir(f"catalogue: {e}"), args)
    from .docs import check_generated, checkout_file, stdout_check, write_generated

    out: Path = args.out if args.out is not None else checkout_file(Path("docs/conformance.md"))

    if str(out) == "-":
        if args.check:
            return stdout_check(_prog(args))
        print(text, end="")  # a closed stdout (None) takes nothing
        return 0
    if args.check:  # PATH is the input: one that cannot be read is exit 2, as `docs --check`
        return check_generated(out, text, _prog(args),
                               f"flodl-proto conform docs --out {shlex.quote(str(out))}")
    return write_generated(out, text, _prog(args))

"""Running a selection of cases and reporting the results: console lines, a summary by doc
section, JUnit XML and JSON."""

from __future__ import annotations

import json
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import replace_file
from .catalogue import Case
from .target import Target

if TYPE_CHECKING:  # the player (and the codec) is imported when cases run: the reports, exit
    # code and lines need neither
    from .player import CaseResult, KitSettings

__all__ = ["RunInterrupted", "TargetNeverStarted", "case_line", "exit_code", "run_cases",
           "section_line", "section_order", "summary_by_section", "write_json", "write_junit"]

#: lines of a target's output a "did not start" failure shows
_OUTPUT_TAIL = 5


class TargetNeverStarted(Exception):
    """The target did not start in any of the first cases (as many as run at once): it most
    likely never will, so the other cases were not run.

    Attributes:
        results: the results of the cases that ran, in the order of ``runs``.
        not_run: how many cases were not run.

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, results: list[CaseResult], not_run: int) -> None:
        super().__init__(f"the target did not start in the first {len(results)} case(s); "
                         f"{not_run} other case(s) not run")
        self.results = results
        self.not_run = not_run


class RunInterrupted(KeyboardInterrupt):
    """The run was interrupted (``stop`` set, or Ctrl-C in the calling thread): no further case
    started, and the cases in flight were cut short.

    Attributes:
        results: the results of the cases that ended before the interruption, in the order of
            ``runs`` (a case cut short by it has none: its verdict would be on the
            interruption, not on the target).

    No upstream counterpart: upstream has no conformance kit.
    """

    def __init__(self, results: list[CaseResult]) -> None:
        super().__init__()
        self.results = results


def run_cases(runs: Sequence[tuple[Case, int]], make_target: Callable[[], Target],
              settings: KitSettings, *, jobs: int = 1,
              on_result: Callable[[CaseResult], None] | None = None,
              stop: threading.Event | None = None) -> list[CaseResult]:
    """Play every ``(case, version)`` run, ``jobs`` at a time (each against its own target).

    Once ``stop`` is set, no further case starts, and a case that ends after it is taken as cut
    short by the interruption: it gets no result.

    The first ``jobs`` cases (as many as run at once) tell whether the target starts at all:
    a further case starts only once one of them has ended with the target started (in a run
    whose target starts, the first to end has: no wait), or once all of them have ended, none
    with the target started (then the run gives up: no further case starts).

    Returns:
        The results in the order of ``runs``; ``on_result`` is called as each one completes
        (not for a case cut short).

    Raises:
        TargetLaunchError: the target's command could not be executed; the runs not started yet
            are cancelled.
        TargetNeverStarted: the first ``jobs`` cases (or every case, when fewer) all failed with
            "target did not start" and cases remained: the others were not run, whatever
            ``jobs``.
        RunInterrupted: ``stop`` was set, or a ``KeyboardInterrupt`` reached the calling thread;
            it holds the results of the cases that ended before.

    No upstream counterpart: upstream has no conformance kit.
    """
    from .player import play_case

    stop = stop if stop is not None else threading.Event()
    lock = threading.Lock()
    done: list[CaseResult] = []  # in the order they complete
    kept: dict[int, CaseResult] = {}  # by run index: the cases that ended before any stop
    first = max(1, min(jobs, len(runs)))
    gave_up = threading.Event()
    #: set once the first cases have shown whether the target starts (one of them started it,
    #: or all of them ended: ``gave_up`` when none did), or the run is ending (``halted``, a
    #: stop): the cases held behind them go on, or return at once
    known = threading.Event()
    halted = threading.Event()  # a case raised, or the caller's thread is leaving the run

    def one(i: int, held: bool = False) -> CaseResult | None:
        if held:
            known.wait()
        if stop.is_set() or gave_up.is_set() or halted.is_set():
            known.set()  # a stop before the first cases played: the held ones return too
            return None
        try:
            res = play_case(runs[i][0], runs[i][1], make_target, settings)
        except BaseException:
            halted.set()
            known.set()
            raise
        with lock:
            done.append(res)
            if len(done) == first and not any(r.started for r in done):
                gave_up.set()
            cut = stop.is_set()
            if res.started or len(done) >= first or cut:
                known.set()
            if not cut:
                kept[i] = res
        if on_result is not None and not cut:
            on_result(res)
        return None if cut else res

    try:
        if jobs <= 1:
            results = [one(i) for i in range(len(runs))]
        else:
            # the cases that wait longest start first, so their waits overlap the quick ones
            order = sorted(range(len(runs)), key=lambda i: -_expected_wait(*runs[i]))
            with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="conform") as pool:
                # the pool takes them in this order: the first ``first`` are the first batch,
                # the others held until it shows whether the target starts
                futures = {i: pool.submit(one, i, k >= first) for k, i in enumerate(order)}
                try:
                    results = [_result(futures[i]) for i in range(len(runs))]
                except BaseException:
                    halted.set()
                    known.set()
                    for f in futures.values():
                        f.cancel()
                    raise
    except KeyboardInterrupt:
        stop.set()
        with lock:
            raise RunInterrupted([kept[i] for i in sorted(kept)]) from None
    ran = [r for r in results if r is not None]
    if len(ran) == len(results):
        return ran
    if gave_up.is_set() and not stop.is_set():
        raise TargetNeverStarted(ran, len(results) - len(ran))
    raise RunInterrupted(ran)


#: seconds between the caller's looks at a case it waits for: a signal (Ctrl-C, SIGTERM) the
#: kernel gave another thread of the process runs its Python handler only once the caller's
#: thread runs again, which an untimed wait would leave for the case to end (a target's whole
#: start timeout)
_RESULT_POLL = 0.1


def _result(future: Future[CaseResult | None]) -> CaseResult | None:
    """``future``'s result, waited for in steps of :data:`_RESULT_POLL` seconds so the
    caller's thread runs the handler of a signal another thread received within that time."""
    while not wait_futures([future], timeout=_RESULT_POLL).done:
        pass
    return future.result()


def _expected_wait(case: Case, version: int) -> float:
    """A rough cost of the case: its explicit waits, silences and sleeps in seconds (the
    longest start first)."""
    total = 0.0
    for s in case.steps[version]:
        for p in s.values():
            if isinstance(p, Mapping):
                total += sum(float(p.get(k, 0)) for k in ("within", "for"))
                total += float(p.get("within_scaled", 0))
        if "sleep" in s:
            total += float(s["sleep"])
    return total


def exit_code(results: Iterable[CaseResult]) -> int:
    """0 when every MUST case passed, else 1.

    No upstream counterpart: upstream has no conformance kit.
    """
    return 0 if all(r.passed for r in results if r.case.level == "MUST") else 1


def case_line(r: CaseResult, section_title: str) -> list[str]:
    """One ``PASS``/``FAIL`` line for a result, and for a failure the detail lines.

    No upstream counterpart: upstream has no conformance kit.
    """
    tag = "PASS" if r.passed else "FAIL"
    head = f"{tag} {r.case.id} v{r.version} [{r.case.level}] ({section_title})"
    if r.passed:
        return [head]
    lines = [head]
    where = f"step {r.step}: " if r.step is not None else ""
    lines.append(f"     {where}{r.message}")
    if r.expected or r.observed:
        lines.append(f"     expected: {r.expected or '(nothing)'}")
        lines.append(f"     observed: {r.observed or '(nothing)'}")
    if r.offset is not None:
        field = r.differing_field + (f": {r.differing_values}" if r.differing_field
                                     and r.differing_values else "")
        note = f" ({field})" if field else ""
        if r.payload_offset is not None:
            note = (" (the record's auth tag; first differing byte after the header: "
                    f"{r.payload_offset}{', ' + field if field else ''})")
        elif r.tag_only:
            note = (" (the record's auth tag, and only it: the bytes it covers are the same, "
                    "so it was computed with another salt or another MAC)")
        lines.append(f"     first differing byte offset: {r.offset}{note}")
    if r.exit is not None:
        lines.append(f"     target: {r.exit.describe()}")
    # why it did not start, or why it failed (a crash), is most likely in its last lines: a
    # target that ended on its own with a failure, or that gave a failure status to the kit's
    # SIGTERM (one that failed as the kit stopped it: the kit sees the connection close before
    # the process has exited); a target the kit stopped cleanly said what it had to in the steps
    failed = r.exit is not None and r.exit.status is not None and r.exit.status != 0 and (
        r.exit.by_itself or r.exit.status > 0)
    if (not r.started or failed) and r.output:
        tail = r.output.splitlines()[-_OUTPUT_TAIL:]
        lines.append("     target's last output:")
        lines.extend(f"       {line}" for line in tail)
    return lines


#: a heading's section number: ``3.3 ...``, ``4. ...``, ``13. ...``
_SECTION_NUMBER = re.compile(r"(\d+)(?:\.(\d+))?\.?(?:\s|$)")


def section_order(title: str) -> tuple[int, int, int]:
    """The sort key of a section title by its number, compared as numbers: ``3.3`` < ``3.6`` <
    ``3.7`` < ``4.`` < ``4.1`` < ``13.`` < ``15.2``; a title without a number (a doc key no
    heading matched) after every numbered one (``(1, 0, 0)``).

    No upstream counterpart: upstream has no conformance kit.
    """
    m = _SECTION_NUMBER.match(title)
    if m is None:
        return (1, 0, 0)
    return (0, int(m.group(1)), int(m.group(2)) if m.group(2) is not None else -1)


def summary_by_section(results: Iterable[CaseResult],
                       title_of: Callable[[str], str]) -> list[tuple[str, int, int, int]]:
    """``(section title, passed, failed, of which MUST failed)`` per doc section, sorted by
    section number (:func:`section_order`); titles of equal rank (those without a number) in
    the order they first appear.

    No upstream counterpart: upstream has no conformance kit.
    """
    acc: dict[str, list[int]] = {}
    for r in results:
        row = acc.setdefault(title_of(r.case.section), [0, 0, 0])
        if r.passed:
            row[0] += 1
        else:
            row[1] += 1
            row[2] += r.case.level == "MUST"
    ordered = sorted(acc.items(), key=lambda kv: section_order(kv[0]))
    return [(k, v[0], v[1], v[2]) for k, v in ordered]


def section_line(title: str, passed: int, failed: int, must_failed: int) -> str:
    """The summary's line of one doc section (a row of :func:`summary_by_section`): ``FAIL``
    when a MUST case of it failed, else ``ok``, then its counts, the failures by level, so a
    section whose only failures are SHOULD cases does not read as failed::

          ok   15.9 Clean-exit rules: 3 passed, 0 failed
          ok   12. Departures from upstream: 0 passed, 1 SHOULD failed
          FAIL 15.2 Fold order: 1 passed, 2 MUST failed, 1 SHOULD failed

    No upstream counterpart: upstream has no conformance kit.
    """
    mark = "FAIL" if must_failed else "ok  "
    should_failed = failed - must_failed
    parts = [f"{must_failed} MUST failed"] if must_failed else []
    parts += [f"{should_failed} SHOULD failed"] if should_failed else []
    return f"  {mark} {title}: {passed} passed, " + (", ".join(parts) or "0 failed")


def _result_json(r: CaseResult, section_title: str) -> dict[str, Any]:
    return {
        "id": r.case.id, "version": r.version, "level": r.case.level,
        "section": r.case.section, "section_title": section_title, "error": r.case.error,
        "title": r.case.title, "result": "pass" if r.passed else "fail",
        "step": r.step, "message": r.message, "expected": r.expected, "observed": r.observed,
        "first_difference": r.offset, "first_payload_difference": r.payload_offset,
        "first_difference_field": r.differing_field or None,
        "first_difference_expected": r.expected_value or None,
        "first_difference_observed": r.observed_value or None,
        "seconds": round(r.seconds, 3),
        "exit_status": r.exit.status if r.exit is not None else None,
        "exited_by_itself": r.exit.by_itself if r.exit is not None else None,
    }


def _stop_word(interrupted: bool, stop: str | None) -> str | None:
    """The word of the stop the reports name: ``stop``, else ``interrupted`` for a run
    ``interrupted``, else None (a run not stopped)."""
    return stop if stop is not None else "interrupted" if interrupted else None


def write_json(path: Path, role: str, results: Sequence[CaseResult],
               not_selected: Sequence[tuple[Case, str]], title_of: Callable[[str], str], *,
               not_run: Sequence[tuple[Case, int]] = (), not_run_reason: str = "",
               interrupted: bool = False, stop: str | None = None) -> None:
    """Write the results as JSON: role, counts, every result, the cases not selected, the
    selected cases that were not run (``not_run``, each with ``not_run_reason``: the run was
    stopped, or the target never started), whether the run was stopped by a signal
    (``interrupted``, true for any stop, as the key has always said) and the word of the stop
    (``stop``: ``stop`` when given, such as ``"terminated"`` after SIGTERM, else
    ``"interrupted"`` for a run ``interrupted``; null for a run that was not stopped).
    A failing result's ``first_difference_expected`` and ``first_difference_observed`` are the
    two values of its ``first_difference_field`` the text line shows (``"4.0"``, ``"3.0"``:
    strings, as written there), null when that field has none.
    ``results`` and ``not_run`` are in the order of the runs (catalogue order, each case's
    versions ascending; whatever order ``--jobs`` completed them in), ``not_selected`` in
    catalogue order.

    A character XML 1.0 cannot hold (a control character of a target's output: an ANSI
    colour code's ESC, a NUL) is written as ``#xNN``, so the report stays well-formed.

    ``path`` is replaced atomically (:func:`flodl_proto._files.replace_file`): a failed write
    leaves the previous file and no temporary file.

    Raises:
        OSError: ``path`` cannot be written (its folder must exist).

    No upstream counterpart: upstream has no conformance kit.
    """
    word = _stop_word(interrupted, stop)
    doc = {
        "role": role,
        "interrupted": word is not None,
        "stop": word,
        "passed": sum(r.passed for r in results),
        "failed": sum(not r.passed for r in results),
        "must_failed": sum(not r.passed and r.case.level == "MUST" for r in results),
        "results": [_result_json(r, title_of(r.case.section)) for r in results],
        "not_selected": [{"id": c.id, "reason": why} for c, why in not_selected],
        "not_run": [{"id": c.id, "version": v, "reason": not_run_reason} for c, v in not_run],
    }
    replace_file(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


def write_junit(path: Path, role: str, results: Sequence[CaseResult],
                not_selected: Sequence[tuple[Case, str]], title_of: Callable[[str], str], *,
                not_run: Sequence[tuple[Case, int]] = (), not_run_reason: str = "",
                interrupted: bool = False, stop: str | None = None) -> None:
    """Write JUnit XML: one ``testsuite`` per role and version, one ``testcase`` per case
    (``failure`` with expected/observed; not-selected cases, and the selected cases that were
    not run, as ``skipped`` with the reason). A run stopped by a signal (``interrupted``, or
    ``stop`` given) has the properties ``interrupted=true`` and ``stop=WORD`` (``stop``, else
    ``interrupted``) on each of the root's suites; a run stopped before any case was selected,
    with no suite, gets an empty suite of cases not run to carry them. The suites of results
    come first, by version ascending, each with its cases in catalogue order; then the suite
    of cases not run, then the suite of cases not selected.

    ``path`` is replaced atomically (:func:`flodl_proto._files.replace_file`): a failed write
    leaves the previous file and no temporary file.

    Raises:
        OSError: ``path`` cannot be written (its folder must exist).

    No upstream counterpart: upstream has no conformance kit.
    """
    root = ET.Element("testsuites", name=f"flodl-proto conform {role}")
    versions = sorted({r.version for r in results})
    for v in versions:
        rs = [r for r in results if r.version == v]
        suite = ET.SubElement(root, "testsuite", name=f"{role} v{v}", tests=str(len(rs)),
                              failures=str(sum(not r.passed for r in rs)), errors="0",
                              skipped="0", time=f"{sum(r.seconds for r in rs):.3f}")
        for r in rs:
            tc = ET.SubElement(suite, "testcase", classname=f"{role}.v{v}", name=r.case.id,
                               time=f"{r.seconds:.3f}")
            ET.SubElement(tc, "properties").extend([
                ET.Element("property", name="level", value=r.case.level),
                ET.Element("property", name="section", value=title_of(r.case.section)),
                ET.Element("property", name="error", value=r.case.error or ""),
            ])
            if not r.passed:
                fail = ET.SubElement(tc, "failure", message=r.message,
                                     type=f"{r.case.level} failed")
                fail.text = "\n".join(case_line(r, title_of(r.case.section)))
            if r.output:
                ET.SubElement(tc, "system-out").text = r.output
    _skipped_suite(root, f"{role} not run",
                   [(f"{role}.v{v}", c.id, not_run_reason) for c, v in not_run])
    _skipped_suite(root, f"{role} not selected",
                   [(f"{role}.not_selected", c.id, why) for c, why in not_selected])
    word = _stop_word(interrupted, stop)
    if word is not None:
        if not len(root):  # stopped before any case was selected: a suite to say so
            ET.SubElement(root, "testsuite", name=f"{role} not run", tests="0", failures="0",
                          errors="0", skipped="0", time="0")
        for suite in root:
            props = ET.Element("properties")
            props.append(ET.Element("property", name="interrupted", value="true"))
            props.append(ET.Element("property", name="stop", value=word))
            suite.insert(0, props)
    for el in root.iter():  # a target's output may hold characters XML 1.0 cannot
        if el.text:
            el.text = _xml_text(el.text)
        for key, value in el.attrib.items():
            el.set(key, _xml_text(value))
    ET.indent(root)
    replace_file(path, ET.tostring(root, encoding="utf-8", xml_declaration=True))


#: the characters XML 1.0 cannot hold, escaped or not: the C0 controls but tab, newline and
#: carriage return, the surrogates, U+FFFE and U+FFFF (a target's output quoted in a report may
#: carry ANSI colour codes, a NUL or a bell)
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _hex_escaped(m: re.Match[str]) -> str:
    return f"#x{ord(m.group()):02X}"


def _xml_text(text: str) -> str:
    """``text`` with each character XML 1.0 cannot hold written as ``#xNN`` (``#x1B`` for
    ESC, ``#xFFFE``), as pytest's JUnit reports write them; the other characters as they
    are."""
    return _XML_INVALID.sub(_hex_escaped, text)


def _skipped_suite(root: ET.Element, name: str, cases: Sequence[tuple[str, str, str]]) -> None:
    """A ``testsuite`` of skipped ``(classname, name, reason)`` test cases (none: no suite)."""
    if not cases:
        return
    suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(cases)), failures="0",
                          errors="0", skipped=str(len(cases)), time="0")
    for classname, case_id, why in cases:
        tc = ET.SubElement(suite, "testcase", classname=classname, name=case_id, time="0")
        ET.SubElement(tc, "skipped", message=why)

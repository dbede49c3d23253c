"""The demo's summary: the stage breakdown of its median round, what a run collected
(:class:`Result`), and the table and verdict printed at its end (:func:`report`). The ``demo``
command (:mod:`flodl_proto.commands.demo`) drives the cluster and hands its result here.

No upstream counterpart: upstream flodl has no demo.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._unseen import terminal_text
from .controller import SIGNAL_STOP_DETAIL as CONTROLLER_SIGNAL_STOP
from .controller import parse_outer
from .relay import SIGNAL_STOP_DETAIL as RELAY_SIGNAL_STOP

if TYPE_CHECKING:  # NumPy, rich and the runners are imported when the summary is made
    from rich.console import Console

    from ..netlab import NetLab
    from ..runner import stages

__all__ = ["GATHER", "MODEL", "SIGNAL_STOPS", "STAGE_WIDTH", "TOLERANCE", "Cluster", "Member",
           "Result", "exit_reason", "exit_words", "member_name", "model_rounds",
           "protocol_places", "rank_error", "report", "stage_lines", "untraced_words"]

#: the final loss must be within this relative distance of the optimum's loss
TOLERANCE = 0.01

#: the most characters of a line of the summary's stage breakdown (:func:`stage_lines`): with
#: the table's frame and first column, 80 columns
STAGE_WIDTH = 63


class Member(Protocol):
    """A process of the demo's cluster as the summary reads it: its name (``controller``,
    ``relay0``, ``rank3``), the process, and the stderr lines it left."""

    @property
    def name(self) -> str: ...

    @property
    def proc(self) -> subprocess.Popen[str]: ...

    @property
    def stderr(self) -> list[str]: ...


class Cluster(Protocol):
    """The demo's cluster as the summary reads it: the processes started, in start order."""

    @property
    def children(self) -> Sequence[Member]: ...


def exit_words(returncode: int) -> str:
    """How a member of the cluster ended, from its :attr:`subprocess.Popen.returncode` (an
    ``int``: negative when a signal ended it), as the demo words it after the member's name:
    ``was killed by SIGKILL`` for -9 (the signal's name from :class:`signal.Signals`; ``signal
    N`` for a number that has none), ``exited with status 3`` for 3 (and 0). Every line of the
    demo that gives a controller's, relay's or rank's exit status takes its words from here,
    or from :func:`exit_reason` where the words stand in parentheses after the name.
    Raises nothing.

    No upstream counterpart: upstream flodl has no demo."""
    reason = exit_reason(returncode)
    return reason if returncode >= 0 else f"was {reason}"


def exit_reason(returncode: int) -> str:
    """:func:`exit_words` without its verb ``was``, for a reason in parentheses after a
    member's name (``rank 1 (killed by SIGKILL)``, ``rank 1 (exited with status 3)``):
    ``killed by SIGKILL`` for -9, ``exited with status 3`` for 3. Raises nothing.

    No upstream counterpart: upstream flodl has no demo."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


def member_name(name: str) -> str:
    """A member of the cluster as the demo's lines name it: a rank's process name ``rank2`` as
    ``rank 2`` (as the summary's rows and its other lines name ranks), the controller's and a
    relay's (``controller``, ``relay0``) as they are. Raises nothing.

    No upstream counterpart: upstream flodl has no demo."""
    number = name[4:]
    return f"rank {number}" if name.startswith("rank") and number.isdigit() else name


#: the protocol rounds of a demo round, in order: the Control count-gather of the local steps,
#: then the Model reduce of the parameters (none when the whole cohort was idle)
GATHER = "count-gather"
MODEL = "Model reduce"


def protocol_places(rounds: dict[int, dict[int, dict[str, Any]]]) -> dict[int, tuple[int, str]]:
    """Where every protocol round of a run is in the demo's rounds: protocol round ``p``
    (numbered from 1, as the controller's, relays' and ranks' messages number it) to its demo
    round (from 1, as the summary counts rounds) and its step, :data:`GATHER` or
    :data:`MODEL`. The one place the demo turns protocol rounds into its own: the stage
    breakdown (:func:`model_rounds`) and the ranks' errors (:func:`rank_error`) read it.

    ``rounds``: the demo's ``round`` events, by demo round then rank. Each demo round is one
    count-gather, then one Model reduce unless every count was 0. The map covers the demo
    rounds up to the first one no rank reported, and that one too: the protocol round after
    them is its count-gather, the next its Model reduce (where a rank that failed in it was;
    every rank runs the same protocol rounds, so the first missing demo round is the one
    each rank that did not report it failed in). Raises nothing.

    No upstream counterpart: upstream flodl has no demo."""
    out: dict[int, tuple[int, str]] = {}
    protocol = 0
    k = 1
    while rounds.get(k):
        protocol += 1
        out[protocol] = (k, GATHER)
        if sum(next(iter(rounds[k].values()))["counts"]) > 0:
            protocol += 1
            out[protocol] = (k, MODEL)
        k += 1
    out[protocol + 1] = (k, GATHER)
    out[protocol + 2] = (k, MODEL)
    return out


def model_rounds(rounds: dict[int, dict[int, dict[str, Any]]]) -> dict[int, int]:
    """Map the protocol's round count (from 0, as :func:`flodl_proto.runner.stages.mark` counts)
    of every Model reduce to the demo round (from 1) it belongs to, from
    :func:`protocol_places`.

    ``rounds``: the demo's ``round`` events, by demo round then rank. The map stops at the
    first demo round no rank reported. Raises nothing.

    No upstream counterpart: upstream flodl has no demo.
    """
    return {p - 1: k for p, (k, step) in protocol_places(rounds).items()
            if step == MODEL and k in rounds}


def rank_error(final: dict[str, Any], places: dict[int, tuple[int, str]]) -> str:
    """A rank's error as the summary shows it, its rounds counted as the demo counts them:
    ``final`` is the rank's last event (``error``: its text; ``protocol_round``: the protocol
    round it was in, as the text numbers it, when the rank knew one), ``places`` the map of
    :func:`protocol_places`. Every ``round P`` of the text for that protocol round reads
    ``round K's count-gather`` or ``round K's Model reduce`` (``no averaged frame within 60s
    (round 1754)`` of a run that completed 876 rounds: ``(round 877's Model reduce)``); a text
    without it, or an event without a protocol round, is shown as it is. Raises nothing.

    No upstream counterpart: upstream flodl has no demo."""
    text = str(final.get("error"))
    protocol = final.get("protocol_round")
    if isinstance(protocol, int) and protocol in places:
        k, step = places[protocol]
        text = re.sub(rf"(?<![\w-])round {protocol}(?!\w)", f"round {k}'s {step}", text)
    return text


def stage_lines(traced: list[stages.RoundStages], demo_round: dict[int, int]) -> list[str]:
    """The summary's stage breakdown: which round is the median of the Model reduces traced in
    the demo rounds completed, numbered as the demo counts its rounds, its total, then every
    part in ms with its share of the total, gaps marked ``gap``; a part that ended before it
    began (the next stage's party was first, e.g. a rank parsed its reply before its relay
    finished the fan-out to the others) reads ``overlaps``, no time. Lines are at most
    :data:`STAGE_WIDTH` (63) characters, so the summary table stays within 80 columns: a first
    line longer than that (round numbers and counts of 5 digits and more) is cut after
    ``Model reduce,`` (``round 1000000's Model reduce,`` then ``the median of 1000000 traced:
    39.363 ms``).

    ``traced``: the rounds :func:`flodl_proto.runner.stages.breakdown` found (only a Model
    reduce is traced to a rank's reply parsed; a count-gather is not); ``demo_round``: the
    protocol round (from 0) of the Model reduce of every demo round completed, to that demo
    round (:func:`model_rounds` of the completed rounds). A traced round ``demo_round`` does
    not hold is left out, of the median and of the count the line gives: the Model reduce of a
    round the run did not complete (a failure, a stop) that some ranks parsed, whose times
    stop at the ranks that got that far. An empty list when no round is left.

    No upstream counterpart: upstream flodl has no demo.
    """
    from ..runner import stages

    measured = [r for r in traced if r.round in demo_round]
    med = stages.median_round(measured)
    if med is None:
        return []
    which = f"round {demo_round[med.round]}'s Model reduce"
    head = f"{which}, the median of {len(measured)} traced: {med.total * 1e3:.3f} ms"
    lines = [head] if len(head) <= STAGE_WIDTH else [f"{which},", head[len(which) + 2:]]
    lines.append("from the last rank's send to its reply parsed")
    width = max(len(label) for label, *_ in stages.SEGMENTS)
    for label, sec, gap in med.parts:
        if sec < 0:  # the next party's stage came first (a rank parsed its reply before its
            lines.append(f"{label:<{width}}{'overlaps':>11}")  # relay finished the fan-out)
            continue
        share = 100.0 * sec / med.total if med.total > 0 else 0.0
        lines.append(f"{label:<{width}}{_ms(sec)} ms{share:4.0f}%" + (" gap" if gap else ""))
    return lines


#: the characters of the milliseconds column of :func:`stage_lines`
_MS_WIDTH = 8


def _ms(sec: float) -> str:
    """``sec`` seconds in milliseconds, :data:`_MS_WIDTH` characters wide whatever its size, so
    the columns of :func:`stage_lines` stay aligned and its lines within :data:`STAGE_WIDTH`:
    3 decimals below 10 s (``39.363``), fewer above (``12300.00`` for 12.3 s, ``1234568`` for
    20.6 minutes), and ``1.23e+08`` from 27.7 hours."""
    ms = sec * 1e3
    for decimals in (3, 2, 1, 0):
        text = f"{ms:{_MS_WIDTH}.{decimals}f}"
        if len(text) <= _MS_WIDTH:
            return text
    return f"{ms:{_MS_WIDTH}.2e}"


def untraced_words(res: Result) -> str:
    """Why the summary of ``res`` has no stage breakdown (its ``stages`` are empty), in lines
    of at most 63 characters as :func:`stage_lines`'s: ``not traced`` when no trace was read
    (its reading failed: a problem says why); the run stopped before a measured round, when
    no rank reported a round; the ranks' records were lost, when ranks reported rounds but no
    rank wrote its records (each writes them as it ends, which a SIGKILL skips); that no
    completed round's Model reduce was traced, when the rounds traced are all of rounds the
    run did not complete; else that no round was traced from a rank's send to its reply.
    Raises nothing.

    No upstream counterpart: upstream flodl has no demo."""
    if res.traced_roles is None:
        return "not traced"
    if not any(res.rounds.values()):
        return "none: the run stopped before a measured round"
    if "rank" not in res.traced_roles:
        return ("none: the ranks' stage records were lost\n(a rank writes them as it ends; "
                "a SIGKILL skips that)")
    if res.stages:  # the Model reduces of rounds not completed only (stage_lines)
        return "none: no completed round's Model reduce was traced"
    return "none: no round was traced from a rank's send to its reply"


@dataclass
class Result:
    """What the demo collected from its cluster: the rounds' events by demo round then rank,
    each rank's final event, the killed rank, the problems found, the relays' stats, the
    controller's and relays' exit codes, the wall time (seconds), the network lab, the traced
    rounds' stages. Raises nothing."""

    rounds: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    final: dict[int, dict[str, Any]] = field(default_factory=dict)
    killed: int | None = None
    problems: list[str] = field(default_factory=list)
    relay_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    controller_rc: int | None = None
    relay_rc: dict[str, int | None] = field(default_factory=dict)
    wall: float = 0.0
    lab: NetLab | None = None
    stages: list[stages.RoundStages] = field(default_factory=list)
    #: set when the demo stopped its cluster after a failure (a member that exited with a
    #: failure while ranks ran, a rank's error, no start): the exit status of every controller
    #: and relay that had exited by then, by name; the others were stopped by the demo
    exited_first: dict[str, int] | None = None
    #: the ranks still running when the demo stopped its cluster after a member's failure
    stopped_ranks: set[int] = field(default_factory=set)
    #: the roles (``rank``, ``relay``, ``controller``) whose processes wrote stage records to
    #: the run's trace; None when no trace was read
    traced_roles: set[str] | None = None
    #: the member (its process name: ``rank2``, ``relay0``, ``controller``) the demo found
    #: stopped by SIGSTOP or SIGTSTP while ranks ran, for which it stopped its cluster
    frozen: str | None = None
    #: how the controller and each relay that ended on its own said it ended, by name (their
    #: ``finished:`` line: ``clean (stop: signal)``, ``clean (relay_eof)``, ...)
    finished: dict[str, str] = field(default_factory=dict)


#: how the controller and a relay end their ``finished:`` line after a SIGTERM or Ctrl-C of
#: their own (a clean outcome's ``(stop: DETAIL)``)
SIGNAL_STOPS = (f"(stop: {CONTROLLER_SIGNAL_STOP})", f"(stop: {RELAY_SIGNAL_STOP})")


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def report(args: argparse.Namespace, console: Console, groups: list[list[int]],
           kill: tuple[int, int] | None, res: Result, cluster: Cluster) -> int:
    """Print the demo's summary table and verdict lines to ``console``, and return the exit code:
    0 when every round completed, every rank (every survivor, with ``kill``) holds the same
    consensus and the final loss is within :data:`TOLERANCE` of the target (the optimum's
    loss, or the in-process loss of the rounds completed when higher), else 1 with a
    ``FAILED`` line per problem and the stderr tails of the processes that failed.

    Rounds are the demo's (from 1; each is two protocol rounds) everywhere in the summary: a
    rank's error that names a protocol round names the demo round and its step instead
    (:func:`rank_error`); the processes' stderr tails are their log lines as written, and a
    line above them says their round numbers count protocol rounds.

    ``args``: the demo's options (world size, hosts, rounds, seed, bf16, outer, protocol
    version); ``groups``: the ranks of each host; ``kill``: the ``--kill-rank`` rank and round;
    ``res``: what the run collected; ``cluster``: its processes. A member's text in the
    summary (its stderr lines, an error it sent) is shown with the characters a terminal acts
    on escaped (:func:`~flodl_proto._unseen.terminal_text`). Raises nothing of its own.

    No upstream counterpart: upstream flodl has no demo.
    """
    import numpy as np
    from rich.markup import escape
    from rich.table import Table

    from . import _demo_worker as worker

    w = args.world_size
    x, y = worker.make_dataset(args.seed)
    _, l_opt = worker.optimum(x, y)
    l_start = worker.full_loss(x, y, np.zeros(worker.FEATURES + 1, np.float32))
    survivors = [r for r in range(w) if r != res.killed]
    complete = [k for k in sorted(res.rounds)
                if all(r in res.rounds[k] for r in survivors)]
    last = complete[-1] if complete else 0
    digests = {r: res.rounds[last][r]["digest"] for r in survivors} if last else {}
    # a member that a signal from elsewhere stopped (it exits 0, as on a Ctrl-C of its own; the
    # demo's own stop, after a failure, is not one): named first when the run failed, as what
    # the rest likely came of (one stopped after the last round fails nothing)
    signalled = [f"{name} was stopped by a signal that the demo did not send ({name} "
                 f"finished: {how})" for name, how in res.finished.items()
                 if how.endswith(SIGNAL_STOPS)
                 and (res.exited_first is None or name in res.exited_first)]
    # a cluster process that failed first: what follows is likely to come of it
    problems = [f"controller {exit_words(res.controller_rc)}"] \
        if res.controller_rc is not None and res.controller_rc != 0 else []
    problems += [f"{name} {exit_words(rc)}" for name, rc in res.relay_rc.items()
                 if rc is not None and rc != 0] + res.problems
    # a rank whose process ended with a failure before its last report, on its own (not the
    # --kill-rank rank, nor one the demo stopped after a failure: it stops none otherwise)
    rank_rc = {c.name: c.proc.returncode for c in cluster.children
               if c.name.startswith("rank")}
    places = protocol_places(res.rounds)  # the ranks' errors count the demo's rounds
    died = {r: rc for r in range(w)
            if r != res.killed and r not in res.final and res.exited_first is None
            and (rc := rank_rc.get(f"rank{r}")) is not None and rc != 0}
    problems += [f"rank {r} {exit_words(rc)} before its last report" for r, rc in died.items()]
    started = {c.name for c in cluster.children}

    def why(r: int) -> str:
        if f"rank{r}" == res.frozen:
            return "frozen, then stopped by the demo"
        if "error" in res.final.get(r, {}):
            return rank_error(res.final[r], places)
        if r in res.stopped_ranks:
            return "stopped by the demo"
        if r in died:
            return exit_reason(died[r])
        return "no report" if f"rank{r}" in started else "not started"

    def unfinished(ranks: list[int]) -> str:
        return "ranks that did not finish: " + ", ".join(f"rank {r} ({why(r)})" for r in ranks)

    if kill is None:
        if not last:
            problems.append(f"no round completed (0 of {args.rounds})")
        elif last != args.rounds:
            problems.append(f"only {last} of {args.rounds} rounds completed")
        missing = [r for r in range(w) if res.final.get(r, {}).get("ev") != "done"]
        if missing:
            problems.append(unfinished(missing))
    else:
        if res.killed is None:
            problems.append(f"rank {kill[0]} never reached round {kill[1]}")
        # the survivors of a kill end without a ``done`` of their own (the run ends at the
        # kill): those the demo stopped after a failure, or found frozen, are named
        stopped = [r for r in survivors if r in res.stopped_ranks or f"rank{r}" == res.frozen]
        if stopped:
            problems.append(unfinished(stopped))
        beyond = [r for r in survivors
                  if any(r in res.rounds.get(k, {}) for k in range(last + 1, args.rounds + 1))]
        if beyond:
            problems.append(f"ranks {', '.join(map(str, beyond))} completed rounds past {last}")
    if len(set(digests.values())) > 1:
        problems.append("ranks hold different consensus frames")
    l_end = res.rounds[last][survivors[0]]["loss"] if last else float("nan")
    # the target: the optimum, or what the rounds completed reach in-process with the same
    # schedule when that is further (a short run is held to what it can reach, not to the
    # optimum); a run that stopped early is compared over the rounds it completed, where a
    # reference of every round asked for took a minute after a failure at --rounds 100000
    # (no round completed: no target, the missing rounds are the failure)
    l_ref = worker.reference_loss(args.seed, w, last, bf16=args.bf16,
                                  outer=parse_outer(args.outer), hosts=groups) if last else l_start
    target = max(l_opt, l_ref)
    loss_ok = l_end <= target * (1.0 + TOLERANCE)
    if kill is None and last and not loss_ok:
        problems.append(f"final loss {l_end:.6f} is not within {TOLERANCE:.0%} of the target "
                        f"{target:.6f}")
    # the target comes from the same schedule: a run whose outer step diverges reaches its own
    # diverging target, so a loss that grew (or is no number) is a failure of its own, also in
    # a run with a rank killed (its survivors train on)
    diverged = bool(last) and not l_end <= l_start
    if diverged:
        problems.append(f"final loss {l_end:.6f} is above the start loss {l_start:.6f}: the "
                        "training diverged" if l_end > l_start else
                        f"final loss {l_end} is not a number: the training diverged")

    if problems:
        problems[:0] = signalled
    times = [max(ev["t_round"] for ev in res.rounds[k].values()) for k in complete]
    syncs = [max(ev["t_sync"] for ev in res.rounds[k].values()) for k in complete]
    idle_rounds = sum(1 for k in complete
                      if any(ev["steps"] == 0 for ev in res.rounds[k].values()))
    moved = sum(sum(v for k, v in s.items() if k not in ("host_frames", "broadcasts"))
                for s in res.relay_stats.values())
    # no outer border, every cell padded: a 64-digit digest beside the widest label
    # ("controller") fits 80 columns
    t = Table(title="flodl-proto demo", show_header=True, header_style="bold", show_edge=False)
    t.add_column("", style="cyan", no_wrap=True)
    t.add_column("value", overflow="fold")
    outer = f", outer {args.outer}" if args.outer else ""
    net = "network namespaces + bridge" if res.lab is not None else "loopback TCP"
    hosts_text = "; ".join(",".join(map(str, ranks)) for ranks in groups)
    relays = f"{args.hosts} relay" + ("s" if args.hosts != 1 else "")
    ranks = f"{w} rank" + ("s" if w != 1 else "")
    t.add_row("cluster", f"controller + {relays} (ranks {hosts_text}) + {ranks} "
              f"(processes, {net}, HMAC, protocol v{args.protocol_version}, "
              f"{'bf16' if args.bf16 else 'f32'} wire{outer})")
    if res.lab is not None:
        t.add_row("controller", f"{res.lab.controller.address} (netns {res.lab.controller.netns})")
        for h, node in enumerate(res.lab.hosts):
            t.add_row(f"host {h}", f"{node.address} (netns {node.netns}): relay + ranks "
                      f"{','.join(map(str, groups[h]))} on the host's loopback")
    t.add_row("rounds", f"{last} of {args.rounds} completed ({idle_rounds} with an idle rank)")
    t.add_row("round", (f"median {statistics.median(times) * 1e3:.1f} ms, p95 "
                        f"{_pct(times, 95) * 1e3:.1f} ms (sync {statistics.median(syncs) * 1e3:.1f}"
                        f" / {_pct(syncs, 95) * 1e3:.1f} ms)") if times else "n/a")
    measured = model_rounds({k: res.rounds[k] for k in complete})  # completed rounds only
    t.add_row("stages", "\n".join(stage_lines(res.stages, measured)) or untraced_words(res))
    t.add_row("bytes", f"{moved:,} moved ({moved / 2**20:.1f} MiB on all legs)" if moved
              else "n/a")
    t.add_row("loss", (f"start {l_start:.6f}, end {l_end:.6f}"
                       + (" (above the start: diverged)" if diverged else "")) if last
              else f"start {l_start:.6f}, end n/a (no round completed)")
    verdict = f"end within {TOLERANCE:.0%} of it: {'ok' if loss_ok else 'not met'}"
    if kill is not None:
        verdict = f"end not checked: the run was stopped after round {last}"
    t.add_row("optimum", f"{l_opt:.6f} (closed form); end is {(l_end / l_opt - 1) * 100:+.3f} %"
              if last else f"{l_opt:.6f} (closed form)")
    # a line per phrase: a wrap at the column's width split them anywhere
    t.add_row("target", f"{target:.6f} = max(optimum, in-process {l_ref:.6f})\n"
              f"(in-process: the same {last} rounds without the network)\n{verdict}" if last
              else "n/a (no round completed)")
    for r in range(w):
        if r == res.killed:
            t.add_row(f"rank {r}", f"killed at round {kill[1] if kill else '?'}")
        else:
            t.add_row(f"rank {r}", digests.get(r, "n/a"))
    t.add_row("wall", f"{res.wall:.1f} s")
    console.print(t)
    if kill is not None and not problems:
        holders = (f"the {len(survivors)} survivors hold the identical consensus"
                   if len(survivors) > 1 else "the survivor holds the consensus")
        held = (f"{holders} of round {last}: {next(iter(digests.values()), 'n/a')}" if last
                else "no round completed, so there is no consensus to compare")
        console.print(f"rank {kill[0]} was killed at round {kill[1]}; the run ended cleanly; "
                      f"{held}", soft_wrap=True)
    if problems:
        for p in problems:
            # a problem may quote a member's output (its error, its last lines): shown, not
            # played on the terminal, nor read as markup
            shown = "\n".join(terminal_text(line) for line in p.split("\n"))
            console.print(f"[red]FAILED[/red]: {escape(shown)}", soft_wrap=True)
        tails = [c for c in cluster.children
                 if c.stderr and (c.proc.returncode not in (0, None, -9) or c.name == "controller")]
        if tails:  # the processes' own log lines: their rounds are the protocol's
            console.print("the last log lines of the processes (their round numbers count "
                          "protocol rounds: two per demo round, its count-gather then its Model "
                          "reduce):", markup=False, highlight=False, soft_wrap=True)
        for c in tails:
            tail = "\n    ".join(terminal_text(line) for line in c.stderr[-5:])
            console.print(f"{member_name(c.name)} stderr:\n    {tail}", markup=False,
                          highlight=False, soft_wrap=True)  # log lines whole, however wide
        return 1
    if kill is None:
        console.print("[green]OK[/green]: every round completed, every rank holds the identical "
                      "consensus, final loss within tolerance of the target", soft_wrap=True)
    elif last:
        console.print("[green]OK[/green]: the run ended cleanly after the kill and every "
                      "survivor holds the identical consensus", soft_wrap=True)
    else:
        console.print("[green]OK[/green]: the run ended cleanly after the kill, before any "
                      "round completed", soft_wrap=True)
    return 0

"""Stage timestamps of a round: where a round's time goes, at no cost when not asked for.

The runners call :func:`mark` at fixed points of every round (the stage names below). Tracing is
off unless the environment variable ``FLODL_STAGE_TRACE`` names a file when this module is first
imported, or :func:`enable` is called; while it is off, :func:`mark` costs one function call and
one module-global check. While it is on, every call appends one :class:`Record` (role, process
id, round, stage, ``time.monotonic_ns()``) to an in-memory list; nothing is written on the hot
path. The records are appended to the trace file when the process exits (``atexit``) or when
:func:`flush` / :func:`disable` is called. ``CLOCK_MONOTONIC`` is system-wide on Linux, so times
taken by different processes of one machine compare directly.

Trace file format: UTF-8 text, one record per line, five tab-separated fields
``role pid round stage ns`` (``pid``, ``round`` and ``ns`` decimal integers), e.g.
``rank<TAB>4121<TAB>3<TAB>send_done<TAB>81234567890123``. Several processes append to one file;
each writes its whole buffer with ``O_APPEND`` writes of whole lines.

Stages (role: stage, in the order one round passes them):

========== =================== ===========================================================
role       stage               the moment
========== =================== ===========================================================
rank       ``send_start``      the rank starts sending its Data record
rank       ``send_done``       its last byte is handed to the kernel
relay      ``deposits_done``   every deposit of the host's ranks has arrived
relay      ``hostframe_sent``  the HostFrame record is handed to the kernel
controller ``hostframes_done`` the last relay's HostFrame of the round has arrived
controller ``broadcast_sent``  the Broadcast record is handed to the kernel (every relay)
relay      ``broadcast_read``  the relay has read the Broadcast record
relay      ``fanout_done``     the reply has been sent to every rank of the host
rank       ``reply_parsed``    the rank has parsed the reply into its arrays
========== =================== ===========================================================

``round`` is the party's own count of the session's rounds from 0 (a rank counts its
all-reduce calls, a relay its folded rounds and Broadcasts; the controller passes its core's round
number, which counts from 1, minus one); every party counts the same rounds, so one number names
one round everywhere.

:func:`breakdown` turns the records of many processes into per-round stage durations (with the
gaps between stages: wire and wake-up time), and :func:`median_round` picks the median round;
the demo's summary (:func:`flodl_proto.commands.demo.stage_lines`, rounds numbered from 1 as the
demo counts them) and ``bench/round.py`` print it. No upstream counterpart: upstream flodl
(``flodl/src/distributed``) has no stage trace.
"""

from __future__ import annotations

import atexit
import os
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "ENV", "SEGMENTS", "STAGES", "Record", "RoundStages", "breakdown", "disable", "enable",
    "flush", "is_enabled", "mark", "median_round", "read_trace", "records",
]

#: the environment variable naming the trace file
ENV = "FLODL_STAGE_TRACE"

#: (role, stage) of every mark, in the order one round passes them
STAGES: tuple[tuple[str, str], ...] = (
    ("rank", "send_start"), ("rank", "send_done"),
    ("relay", "deposits_done"), ("relay", "hostframe_sent"),
    ("controller", "hostframes_done"), ("controller", "broadcast_sent"),
    ("relay", "broadcast_read"), ("relay", "fanout_done"),
    ("rank", "reply_parsed"),
)

#: the parts of a round :func:`breakdown` reports: (label, from stage, to stage, is a gap between
#: parties, i.e. wire and wake-up time rather than one party's work)
SEGMENTS: tuple[tuple[str, str, str, bool], ...] = (
    ("rank send", "send_start", "send_done", False),
    ("rank -> relay (wire, wake-up)", "send_done", "deposits_done", True),
    ("relay deposits -> HostFrame sent", "deposits_done", "hostframe_sent", False),
    ("relay -> controller (wire, wake-up)", "hostframe_sent", "hostframes_done", True),
    ("controller last HostFrame -> Broadcast sent", "hostframes_done", "broadcast_sent", False),
    ("controller -> relay (wire, wake-up)", "broadcast_sent", "broadcast_read", True),
    ("relay Broadcast -> fan-out done", "broadcast_read", "fanout_done", False),
    ("relay -> rank, reply parsed", "fanout_done", "reply_parsed", True),
)


class Record(NamedTuple):
    """One mark: ``role`` (rank, relay, controller), process id, round, stage, and
    ``time.monotonic_ns()`` (integer nanoseconds, system-wide clock).

    No upstream counterpart: upstream flodl has no stage trace.
    """

    role: str
    pid: int
    round: int
    stage: str
    ns: int


_on = False
_buffer: list[Record] = []
_path: str | None = None


def mark(role: str, round: int, stage: str) -> None:
    """Record that ``role``'s process reached ``stage`` of ``round`` now (no-op when off).

    ``role``: ``"rank"``, ``"relay"`` or ``"controller"``; ``stage``: one of :data:`STAGES`;
    ``round``: the party's count of the session's rounds from 0 (the session's first round is
    0), i.e. one less than the round number the controller core reports and logs
    (``RoundScattered.round``, which counts from 1).
    Never raises; costs one global check while tracing is off.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    if _on:
        _buffer.append(Record(role, os.getpid(), round, stage, time.monotonic_ns()))


def is_enabled() -> bool:
    """Whether :func:`mark` records.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    return _on


def enable(path: str | os.PathLike[str] | None = None) -> None:
    """Start recording. ``path``: the trace file the records go to at :func:`flush` / exit
    (None: keep them in memory only, for :func:`records`, e.g. a process that runs every party
    on threads). Records already held are kept.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    global _on, _path
    _path = None if path is None else os.fspath(path)
    _on = True


def disable() -> list[Record]:
    """Stop recording; write the held records to the trace file (if one is set) and return
    them. The in-memory buffer is empty afterwards.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    global _on, _path
    _on = False
    out = list(_buffer)
    flush()
    _buffer.clear()
    _path = None
    return out


def records() -> list[Record]:
    """A copy of the records this process holds (not yet flushed).

    No upstream counterpart: upstream flodl has no stage trace.
    """
    return list(_buffer)


def flush() -> None:
    """Append the held records to the trace file and empty the buffer (no file set: nothing is
    written and the records stay held). Raises ``OSError`` when the file cannot be written.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    if _path is None or not _buffer:
        return
    held = list(_buffer)
    del _buffer[:len(held)]
    data = "".join(f"{r.role}\t{r.pid}\t{r.round}\t{r.stage}\t{r.ns}\n" for r in held).encode()
    fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _flush_at_exit() -> None:
    try:
        flush()
    except OSError:  # pragma: no cover - a vanished directory must not fail the exit
        pass


def _forget_in_child() -> None:
    _buffer.clear()


def read_trace(path: str | os.PathLike[str]) -> list[Record]:
    """Parse a trace file (format in the module docstring). Raises ``ValueError`` naming the
    line number and the line when a line does not have five fields with integer pid, round
    and ns; ``OSError`` when the file cannot be read.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    out = []
    for no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line:
            continue
        f = line.split("\t")
        try:
            if len(f) != 5:
                raise ValueError(f"{len(f)} fields")
            out.append(Record(f[0], int(f[1]), int(f[2]), f[3], int(f[4])))
        except ValueError as e:
            raise ValueError(f"stage trace line {no}: {line!r}: {e}") from None
    return out


class RoundStages(NamedTuple):
    """One round's path: ``total`` seconds from the last rank's ``send_start`` to the last rank's
    ``reply_parsed``, and ``parts``: (label, seconds, is a gap) for every :data:`SEGMENTS` entry
    whose two stages were both recorded in this round.

    No upstream counterpart: upstream flodl has no stage trace.
    """

    round: int
    total: float
    parts: tuple[tuple[str, float, bool], ...]


def breakdown(recs: Iterable[Record], skip: int = 0) -> list[RoundStages]:
    """Per-round stage durations, rounds in order, the first ``skip`` rounds (warm-up) dropped.

    For every round and stage the latest time any process recorded is taken (the round's
    critical path: the round waits for its last rank, relay, Broadcast). Rounds without both
    ``send_start`` and ``reply_parsed`` are left out. A part may be negative when a rank parses
    its reply before its relay has finished the fan-out to the other ranks.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    latest: dict[int, dict[str, int]] = {}
    for r in recs:
        st = latest.setdefault(r.round, {})
        if r.ns > st.get(r.stage, -1):
            st[r.stage] = r.ns
    out = []
    for rnd in sorted(latest)[skip:]:
        st = latest[rnd]
        if "send_start" not in st or "reply_parsed" not in st:
            continue
        parts = tuple((label, (st[b] - st[a]) / 1e9, gap) for label, a, b, gap in SEGMENTS
                      if a in st and b in st)
        out.append(RoundStages(rnd, (st["reply_parsed"] - st["send_start"]) / 1e9, parts))
    return out


def median_round(rounds: list[RoundStages]) -> RoundStages | None:
    """The round whose total is the (lower) median of ``rounds``; None when there is none.

    No upstream counterpart: upstream flodl has no stage trace.
    """
    if not rounds:
        return None
    med = statistics.median_low(r.total for r in rounds)
    return next(r for r in rounds if r.total == med)


atexit.register(_flush_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
if os.environ.get(ENV):
    enable(os.environ[ENV])

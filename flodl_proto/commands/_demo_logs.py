"""``--log-level`` for the processes of ``flodl-proto demo``.

The demo passes its level to every process it starts (the controller and relays as their
``--log-level``, the ranks in their configuration). At the default level (WARNING) or above, a
process's stderr is kept and shown only when the run fails, as before; at INFO or DEBUG every line
a process writes to stderr is also copied to the demo's stderr as it comes, prefixed with the
process's name: ``[relay0] 2026-01-01 12:00:00,000 INFO flodl_proto.runner.relay: ...``. The
processes number the protocol's rounds, two per demo round (its count-gather, then its Model
reduce unless the whole cohort was idle:
:func:`~flodl_proto.commands._demo_report.protocol_places`), where the demo's progress and
summary count demo rounds: in the copy, each ``round N`` of a line reads ``protocol round N``.

No upstream counterpart (upstream has no demo).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading

from .._unseen import terminal_text

__all__ = ["echoes", "level_name", "protocol_rounds", "show"]

_lock = threading.Lock()


def level_name(level: object) -> str:
    """The ``--log-level`` value ``level`` as the processes are given it: upper-cased, WARNING
    when it is none (the command line's default). No upstream counterpart."""
    return str(level).upper() if level else "WARNING"


def echoes(level: object) -> bool:
    """Whether the processes' stderr lines are copied to the demo's stderr as they come: the
    level is more verbose than WARNING (INFO, DEBUG). No upstream counterpart."""
    value = getattr(logging, level_name(level), None)
    return isinstance(value, int) and value < logging.WARNING


#: a round number in a process's line: ``round 5`` (``round 5's``, ``(round 5)``), not one
#: already labelled ``protocol round 5``, nor ``rounds 5`` or ``round 5x``
_ROUND = re.compile(r"(?<![\w-])(?<!protocol )round (\d+)(?!\w)")


def protocol_rounds(line: str) -> str:
    """``line`` (a process's log line) with each ``round N`` labelled with its unit,
    ``protocol round N``: the processes count the protocol's rounds, two per demo round, where
    the demo counts demo rounds (``controller: round 5 control weight 0`` is the count-gather
    of demo round 3 when no round before it was idle). Raises nothing. No upstream
    counterpart."""
    return _ROUND.sub(r"protocol round \1", line)


def show(name: str, line: str) -> None:
    """Write ``[NAME] LINE`` to the current ``sys.stderr`` (read at each call, so a progress bar
    that redirects stderr while it runs shows the line above it), one whole line at a time
    whatever the thread; its rounds labelled as the protocol's (:func:`protocol_rounds`), the
    characters of ``line`` a terminal acts on (an ESC, a bell, a direction override) shown
    escaped (:func:`~flodl_proto._unseen.terminal_text`). No upstream counterpart."""
    text = terminal_text(protocol_rounds(line))
    with _lock, contextlib.suppress(OSError, ValueError):  # stderr gone: the line is lost
        stream = sys.stderr
        if stream is not None:  # None: started with stderr closed
            stream.write(f"[{name}] {text}\n")
            stream.flush()

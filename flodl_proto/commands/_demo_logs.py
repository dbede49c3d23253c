"""``--log-level`` for the processes of ``flodl-proto demo``.

The demo passes its level to every process it starts (the controller and relays as their
``--log-level``, the ranks in their configuration). At the default level (WARNING) or above, a
process's stderr is kept and shown only when the run fails, as before; at INFO or DEBUG every line
a process writes to stderr is also copied to the demo's stderr as it comes, prefixed with the
process's name: ``[relay0] 2026-01-01 12:00:00,000 INFO flodl_proto.runner.relay: ...``.

No upstream counterpart (upstream has no demo).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading

from .._unseen import terminal_text

__all__ = ["echoes", "level_name", "show"]

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


def show(name: str, line: str) -> None:
    """Write ``[NAME] LINE`` to the current ``sys.stderr`` (read at each call, so a progress bar
    that redirects stderr while it runs shows the line above it), one whole line at a time
    whatever the thread; the characters of ``line`` a terminal acts on (an ESC, a bell, a
    direction override) are shown escaped (:func:`~flodl_proto._unseen.terminal_text`). No
    upstream counterpart."""
    text = terminal_text(line)
    with _lock, contextlib.suppress(OSError, ValueError):  # stderr gone: the line is lost
        stream = sys.stderr
        if stream is not None:  # None: started with stderr closed
            stream.write(f"[{name}] {text}\n")
            stream.flush()

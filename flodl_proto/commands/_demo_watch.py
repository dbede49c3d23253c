"""The demo's watch of its cluster's members: a member stopped by a signal (SIGSTOP, SIGTSTP)
for a few seconds, and the no-progress rule that does not count a pause of the demo itself.

Split from :mod:`flodl_proto.commands.demo` along the seam between running the cluster and
judging, from process states and the clock, when to give up on it: these hold no process, thread
or output of their own. No upstream counterpart: the demo is this package's own."""

from __future__ import annotations

import os

__all__ = ["FrozenWatch", "StallClock", "process_state"]

#: seconds without any event from the cluster before the demo gives up
_STALL = 60.0
#: seconds a member may stay stopped by a signal (SIGSTOP, SIGTSTP: state ``T`` in /proc) in
#: the watch's view before the demo gives up on it: no round completes without every member
_FROZEN = 5.0
#: seconds between two looks at the members' states (:func:`process_state`), at most
_FROZEN_LOOK = 1.0
#: a longer pause between two looks (the demo itself was held up, e.g. stopped with its
#: cluster by a Ctrl-Z) starts every frozen member's count again (:class:`FrozenWatch`)
_WATCH_GAP = 3.0

def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in ``/proc/PID/stat`` (``R``, ``S``, ``T`` stopped by
    a signal, ``t`` stopped by a debugger, ``Z``, ...), or None when it cannot be read (no
    /proc, the process is gone). Raises nothing.

    No upstream counterpart: the demo's own watch."""
    try:  # os.open: the demo reads every member's at each look of its watch
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    rest = stat.rpartition(b")")[2].split()  # after the command name, which may hold spaces
    return rest[0].decode("ascii", "replace") if rest else None


class FrozenWatch:
    """The members of the cluster that stay stopped by a signal (SIGSTOP, SIGTSTP: state ``T``)
    while ranks run: such a member holds every round, and the demo gave it up only after
    :data:`_STALL` seconds without an event. A member stopped by a debugger (``t``) is not one.

    :meth:`look` is called at each look of the demo's watch at the members (every
    :data:`_FROZEN_LOOK` seconds) with their states and the time (``time.monotonic`` seconds);
    a member counts as frozen once it was ``T`` at every look for ``limit`` seconds. A pause
    of more than ``gap`` seconds between two looks (the demo itself was held up: a Ctrl-Z
    stops it with its cluster, and the shell's ``fg`` resumes them all at once) starts every
    count again. Raises nothing.

    No upstream counterpart: the demo's own watch."""

    def __init__(self, limit: float = _FROZEN, gap: float = _WATCH_GAP) -> None:
        self.limit = limit
        self.gap = gap
        self._since: dict[str, float] = {}  # a member seen ``T`` at every look since then
        self._last: float | None = None

    def look(self, states: dict[str, str | None], now: float) -> str | None:
        """The first member of ``states`` (name to state letter, in start order) frozen for
        ``limit`` seconds by ``now``, or None."""
        if self._last is not None and now - self._last > self.gap:
            self._since.clear()
        self._last = now
        self._since = {name: self._since.get(name, now)
                       for name, state in states.items() if state == "T"}
        return next((name for name, t in self._since.items() if now - t >= self.limit), None)


class StallClock:
    """The demo's no-progress rule: more than ``limit`` seconds (:data:`_STALL`) without an
    event from the cluster, not counting a pause of the demo itself. Its loop reads the clock
    (``time.monotonic`` seconds) at least every few tenths of a second; a gap of more than
    ``gap`` seconds between two reads means the demo was held up (a Ctrl-Z stops it with its
    cluster, and the monotonic clock runs on while they are stopped), and that gap is not
    counted: after a Ctrl-Z of more than ``limit`` seconds, the ``fg`` gave up at once (``no
    progress for 60s``). ``now``: the time the clock starts. Raises nothing.

    No upstream counterpart: the demo's own watch."""

    def __init__(self, now: float, limit: float = _STALL, gap: float = _WATCH_GAP) -> None:
        self.limit = limit
        self.gap = gap
        self._last_event = now
        self._read = now

    def _held_up(self, now: float) -> None:
        if now - self._read > self.gap:  # the demo did not run: the cluster had no chance
            self._last_event += now - self._read
        self._read = now

    def event(self, now: float) -> None:
        """An event came from the cluster at ``now``."""
        self._held_up(now)
        self._last_event = now

    def stalled(self, now: float) -> bool:
        """Whether more than ``limit`` seconds passed without an event by ``now``."""
        self._held_up(now)
        return now - self._last_event > self.limit

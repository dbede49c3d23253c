"""The one way the package starts its threads: with the stop signals (SIGINT, SIGTERM, SIGHUP)
blocked in them, so the kernel gives a process-directed stop signal (``kill PID``, a terminal's
Ctrl-C) to the main thread, the one thread where CPython runs a Python signal handler.

A stop signal the kernel gives another thread runs CPython's C-level handler there, which only
notes it: the main thread runs the Python handler once it runs bytecode again, and a main thread
blocked in a system call (a rank's ``recv`` of its consensus, up to the reduce read deadline of
120 s x ``FLODL_NET_TIMEOUT_SCALE``) is not woken. Given to the main thread, the signal interrupts
that call (``EINTR``) and the handler runs at once. A thread inherits the signal mask of the
thread that starts it, so the mask is set around :meth:`threading.Thread.start` on the starting
thread and put back after: the new thread never runs a moment without it, and threads it starts
inherit it. A signal that arrives meanwhile waits, pending, until the mask is put back.

Not for a thread that starts processes: a child inherits the mask of the thread that forks it,
and would start with the stop signals blocked. Upstream: none (its binaries are Rust, with no
such interpreter rule).
"""

from __future__ import annotations

import signal
import threading
from typing import Final

__all__ = ["STOP_SIGNALS", "start_thread"]

#: the signals that stop a command, blocked in every thread :func:`start_thread` starts
STOP_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def start_thread(thread: threading.Thread) -> None:
    """Start ``thread`` (a :class:`threading.Thread` not started yet) with :data:`STOP_SIGNALS`
    blocked in it; the calling thread's signal mask is as before on return.

    Raises:
        RuntimeError: as :meth:`threading.Thread.start` (started twice, no thread left).
        what a signal handler raises when the mask is put back (a signal that arrived while it
        was set runs its handler then, on the main thread).

    Upstream: none (see the module doc).
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

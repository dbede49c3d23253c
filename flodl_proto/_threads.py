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

A library's own threads are the exception: OpenBLAS starts its worker threads (one per further
core) on the thread that loads NumPy, with that thread's mask. The command line loads NumPy with
:func:`import_on_a_blocking_thread`, so they block the stop signals too; a program that imports
the package loads NumPy as it chooses.

Not for a thread that starts processes: a child inherits the mask of the thread that forks it,
and would start with the stop signals blocked. Upstream: none (its binaries are Rust, with no
such interpreter rule).
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from typing import Final

__all__ = ["STOP_SIGNALS", "import_on_a_blocking_thread", "start_thread"]

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


def import_on_a_blocking_thread(name: str) -> None:
    """Import the module ``name`` (``"numpy"``), when it is not imported yet, on a thread
    :func:`start_thread` starts, and wait for it: the threads its import starts (OpenBLAS's
    workers, as NumPy loads) inherit :data:`STOP_SIGNALS` blocked, where they kept the main
    thread's mask, and the kernel could give them a process-directed stop signal that the main
    thread then waited for. The calling thread's mask is as before; a signal that arrives
    meanwhile runs its handler on the main thread, which waits (a Python handler there runs at
    once). Raises nothing, and the thread prints nothing: an import that fails here (whatever
    it raises, a ``KeyboardInterrupt`` of an import hook included) is undone, and fails again,
    with its error, where the caller imports the module itself.

    Upstream: none (see the module doc).
    """
    if name in sys.modules:
        return

    def load() -> None:
        with contextlib.suppress(BaseException):  # not a traceback of this thread
            importlib.import_module(name)

    thread = threading.Thread(target=load, name=f"import {name}")
    start_thread(thread)
    thread.join()

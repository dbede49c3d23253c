"""Waits of a command's main thread in short timed steps. CPython runs a Python signal handler
on the main thread only, once that thread runs bytecode again; the kernel may give a process's
signal (Ctrl-C, SIGTERM) to any of its threads, and an untimed ``Thread.join()`` or
``Popen.wait()`` then holds the main thread, and the handler, until the thread or the process
ends. Waited for in steps of :data:`WAIT_STEP` seconds, the handler runs within a step (as the
conformance kit waits on its cases: ``conform/report.py``). Upstream: none (its binaries are
Rust, with no such interpreter rule).
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from typing import Any, Final, TypeVar

__all__ = ["WAIT_STEP", "get_item", "join_thread", "sleep", "wait_process"]

_T = TypeVar("_T")

#: seconds of one step of a wait: the longest a signal given to another thread waits for its
#: handler
WAIT_STEP: Final = 0.1


def join_thread(thread: threading.Thread, timeout: float | None = None) -> None:
    """``thread.join(timeout)`` (``timeout`` in seconds, >= 0; None: until it ends), in steps
    of :data:`WAIT_STEP` seconds (a thread never started or already ended: returns at once).
    As ``join``, returns None either way: ``thread.is_alive()`` tells whether it ended. Raises
    what a signal handler raises meanwhile. Upstream: none."""
    if timeout is None:
        while thread.is_alive():
            thread.join(WAIT_STEP)
        return
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        thread.join(min(WAIT_STEP, left))


def wait_process(proc: subprocess.Popen[Any]) -> int:
    """``proc.wait()``, in steps of :data:`WAIT_STEP` seconds; returns its exit status
    (``-N``: ended by signal N). Raises what a signal handler raises meanwhile. (A timed
    ``proc.wait(timeout)`` needs no steps: on POSIX it polls in sleeps of at most 50 ms.)
    Upstream: none."""
    while True:
        try:
            return proc.wait(timeout=WAIT_STEP)
        except subprocess.TimeoutExpired:
            continue


def get_item(q: queue.Queue[_T], timeout: float) -> _T:
    """``q.get(timeout=timeout)`` (``timeout`` in seconds, >= 0), in steps of
    :data:`WAIT_STEP` seconds.

    Raises:
        queue.Empty: no item came within ``timeout``; what a signal handler raises meanwhile.

    Upstream: none.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return q.get(timeout=min(WAIT_STEP, max(left, 0.0)))
        except queue.Empty:
            if left <= WAIT_STEP:
                raise


def sleep(seconds: float) -> None:
    """``time.sleep(seconds)`` (finite, >= 0), in steps of :data:`WAIT_STEP` seconds: a sleep
    of the main thread is not cut short by a signal the kernel gave another thread either.
    Raises what a signal handler raises meanwhile. Upstream: none."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(WAIT_STEP, left))

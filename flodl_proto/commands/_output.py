"""Progress output that never holds up a run: lines (and log records) for stdout or stderr are
queued and written by a thread of their own, so a stream that is read slowly, or not at all (a
full pipe), never blocks the thread that produced them (the controller's coordinator mid-round, a
rank's round loop). At most ``backlog`` lines wait; later ones are dropped and counted, and the
command reports the count in one stderr line when it ends.

Used by ``flodl-proto controller`` (relay-joined and round lines, log records), ``flodl-proto
rank`` (digest lines, log records) and ``flodl-proto relay`` (log records). Upstream: none (the
upstream binaries print directly).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .._threads import start_thread
from ._waits import join_thread

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["LINE_COALESCE", "STDOUT_BACKLOG", "LineWriter", "LogLines", "queued_stderr_logging",
           "report_dropped", "rich_console"]

#: lines that may wait for their stream; more are dropped and counted
STDOUT_BACKLOG = 256
#: seconds a stdout writer of a line per round (the controller's round lines, a rank's digest
#: lines) gathers lines before one write: a line per round would otherwise wake it once per
#: round (about a third of a small round's CPU in the controller)
LINE_COALESCE = 0.05


class _Lines(collections.deque[str]):
    """The lines waiting for the writer, oldest first (a ``deque``; :meth:`qsize` is their
    number, as a queue's)."""

    def qsize(self) -> int:
        """Lines waiting."""
        return len(self)


class LineWriter:
    """Lines for ``sys.stdout`` or ``sys.stderr`` (``stream``), written by a thread of their own:
    :meth:`put` never blocks; when ``backlog`` lines are already waiting the line is dropped and
    counted in :attr:`dropped`.

    Args:
        stream: ``"stdout"`` or ``"stderr"``: the ``sys`` attribute written to, read when the
            writer starts.
        backlog: lines that may wait (> 0).
        name: the writer thread's name.
        coalesce: seconds the writer waits after a line wakes it, so the lines put meanwhile
            are written with it in one ``write`` (default 0: every line at once). A producer
            that puts a line per round (the controller, a rank: :data:`LINE_COALESCE`) then
            wakes the writer once per ``coalesce``, or per half backlog of lines when they come
            faster, instead of once per line; every line is still written, in order, at most
            ``coalesce`` seconds late (later while the stream is slow). The lines the writer
            holds for its write count in the backlog. A gathering ends early when half the
            backlog waits (lines put faster than the gathering lasts are not dropped while
            their stream keeps up) or on :meth:`close`.

    A line put while the writer is busy (writing, or gathering lines for ``coalesce``) is
    appended to the waiting lines under one short lock and wakes no thread; only a line put
    while the writer waits for work with no line left, or the line that fills half the backlog
    while the writer gathers, wakes it (one ``threading.Event``).
    """

    def __init__(self, stream: str = "stdout", backlog: int = STDOUT_BACKLOG,
                 name: str = "flodl-stdout", *, coalesce: float = 0.0) -> None:
        self._stream = stream
        self._coalesce = float(coalesce)
        self._backlog = backlog
        #: guards the waiting lines, ``_held``, ``_idle``, ``_closing`` and the drop count:
        #: put() runs on every producing thread (log records of any thread, the coordinator's
        #: lines); the writer holds it only to take lines, never while it writes
        self._lock = threading.Lock()
        self._lines = _Lines()
        self._held = 0  # lines the writer took for its current write (with coalesce)
        self._idle = False  # the writer waits on _wake for a line (set by the writer)
        self._gathering = False  # the writer waits on _wake for coalesce seconds (idem)
        #: waiting lines that end a gathering early: half the backlog (at least one)
        self._flush_at = max(1, backlog // 2)
        self._closing = False  # close(): write what waits, then stop
        self._wake = threading.Event()  # set for an idle writer: a line, or close()
        self._writer = threading.Thread(target=self._write, name=name, daemon=True)
        self._dropped = 0
        #: set once a write failed (the stream's reader went away): later lines are discarded
        self.broken = False

    @property
    def dropped(self) -> int:
        """Lines dropped so far for a full backlog (counted under the writer's lock, as
        :meth:`put` runs on any thread)."""
        with self._lock:
            return self._dropped

    def put(self, line: str | None) -> None:
        """Queue ``line`` (without its newline; None: nothing), or count it as dropped.
        Safe to call from several threads at once."""
        if line is None:
            return
        with self._lock:
            lines = self._lines
            if len(lines) + self._held >= self._backlog:  # waiting and being written: full
                self._dropped += 1
                return
            lines.append(line)
            if self._idle:
                self._idle = False
            elif self._gathering and len(lines) >= self._flush_at:  # half the backlog
                self._gathering = False
            else:  # the writer is busy: it takes this line when it next looks
                return
        self._wake.set()

    def start(self) -> None:
        """Start writing (lines queued before wait until now)."""
        start_thread(self._writer)

    def close(self) -> None:
        """Write the lines still waiting, then stop: waits for the stream to take them, in
        steps of :data:`~._waits.WAIT_STEP` seconds (a Ctrl-C or SIGTERM interrupts the wait,
        whichever thread the kernel gave it to). A writer never started is left as is."""
        if self._writer.is_alive():
            with self._lock:
                self._closing = True
            self._wake.set()
            join_thread(self._writer)  # in steps: a signal another thread got runs its handler

    def _take(self) -> list[str] | _Lines | None:
        """The writer's next lines to write, in order: one line, or with ``coalesce`` every line
        put during the ``coalesce`` seconds it waits first (:meth:`_gather`; counted in
        ``_held`` until its next call); with no line after that wait, it waits for one (a put()
        wakes it). None once close() asked and no line is left."""
        coalesce = self._coalesce
        with self._lock:
            self._held = 0  # the previous write is done
        while True:
            if coalesce > 0.0:
                with self._lock:
                    gather = not self._closing and len(self._lines) < self._flush_at
                    if gather:
                        self._gathering = True
                        self._wake.clear()  # under the lock: before a put() can set it
                if gather:
                    self._gather(coalesce)  # the lines put meanwhile wake no one (most)
            with self._lock:
                self._gathering = False
                lines = self._lines
                if lines:
                    if coalesce > 0.0:
                        self._lines = _Lines()
                        self._held = len(lines)
                        return lines
                    return [lines.popleft()]
                if self._closing:
                    return None
                self._idle = True  # no line: the next put() wakes the writer
                self._wake.clear()  # under the lock: before that put() can set it
            self._wake.wait()

    def _gather(self, seconds: float) -> None:
        """Wait ``seconds`` for lines to gather; woken early by the put() that fills half the
        backlog, or by close()."""
        self._wake.wait(seconds)

    def _write(self) -> None:
        # straight to the file descriptor: a write blocked on a full pipe then holds no lock of
        # the stream object, which the interpreter needs at exit (Ctrl-C while close() waits)
        out = getattr(sys, self._stream)
        try:
            fd: int | None = out.fileno()
            out.flush()
        except (AttributeError, OSError, ValueError):
            fd = None  # the stream replaced by an object without a descriptor, or None
        encoding = getattr(out, "encoding", None) or "utf-8"
        # the stream failed (its reader went away): take the lines, write none; a stream that is
        # None (started with ``>&-``) takes them too, as print() does, and is not broken
        broken = out is None
        while (batch := self._take()) is not None:
            try:
                self._write_batch(batch, out, fd, encoding, broken)
            except (AttributeError, OSError, ValueError):  # AttributeError: no write() method
                broken = self.broken = True

    @staticmethod
    def _write_batch(batch: Iterable[str], out: Any, fd: int | None, encoding: str,
                     broken: bool) -> None:
        if broken:
            return
        text = "\n".join(batch) + "\n"
        if fd is None:
            out.write(text)
            out.flush()
        else:
            view = memoryview(text.encode(encoding, "replace"))
            while view:
                view = view[os.write(fd, view):]


class LogLines(logging.Handler):
    """A logging handler that formats each record into one line and queues it on a
    :class:`LineWriter` (never blocking the logging thread; a full backlog drops the record)."""

    def __init__(self, writer: LineWriter, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        """Queue the formatted record."""
        try:
            text = self.format(record)
        except Exception:  # a record whose message cannot be formatted: as logging does
            self.handleError(record)
            return
        self.writer.put(text)


def _stderr_handlers(root: logging.Logger) -> list[logging.Handler]:
    return [h for h in root.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
            and h.stream is sys.stderr]


@contextlib.contextmanager
def queued_stderr_logging(backlog: int = STDOUT_BACKLOG) -> Iterator[LineWriter]:
    """For the body of the block, the root logger's handlers that write to ``sys.stderr`` are
    replaced by one :class:`LogLines` on a stderr :class:`LineWriter` with their formatter and
    level, so a warning logged mid-round never waits for an unread stderr. On exit the records
    still waiting are written (waiting for stderr to take them) and the handlers are restored.
    When no root handler writes to ``sys.stderr`` nothing is replaced; the writer still takes
    the command's own stderr lines (:meth:`LineWriter.put`).

    Yields:
        the writer (its :attr:`LineWriter.dropped` counts the records dropped).
    """
    root = logging.getLogger()
    old = _stderr_handlers(root)
    writer = LineWriter("stderr", backlog, name="flodl-stderr")
    handler = LogLines(writer, old[0].level if old else logging.NOTSET)
    if old:
        handler.setFormatter(old[0].formatter)
        for h in old:
            root.removeHandler(h)
        root.addHandler(handler)
    writer.start()
    try:
        yield writer
    finally:
        if old:
            root.removeHandler(handler)
            for h in old:
                root.addHandler(h)
        writer.close()


def report_dropped(prog: str, lines: LineWriter | None, log_lines: LineWriter) -> None:
    """Print, on stderr, one warning line per writer that dropped lines:
    ``PROG: warning: N progress lines dropped: stdout was not read fast enough`` and
    ``PROG: warning: N log lines dropped: stderr was not read fast enough`` (``lines`` None: a
    command whose stdout lines are not queued)."""
    if lines is not None and lines.dropped:
        print(f"{prog}: warning: {lines.dropped} progress lines dropped: stdout was not read "
              "fast enough", file=sys.stderr, flush=True)
    if log_lines.dropped:
        print(f"{prog}: warning: {log_lines.dropped} log lines dropped: stderr was not read "
              "fast enough", file=sys.stderr, flush=True)


def rich_console(**kwargs: Any) -> Console:
    """A ``rich.console.Console(**kwargs)`` whose write to a pipe whose reader went away raises
    ``BrokenPipeError``, which the command line ends with exit 141 (as for every other command),
    instead of rich's own ``SystemExit(1)`` with no message. A ``COLUMNS`` that is not a
    whole number above 0 is ignored, as by a terminal (rich took ``COLUMNS=0`` as a width of 0
    columns and printed nothing at all). rich is imported here, so a command that fails on its
    usage never imports it. Upstream: none (its binaries print directly)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, "the reader of stdout went away")

    columns = os.environ.get("COLUMNS")
    if columns is not None and "_environ" not in kwargs \
            and not (columns.isdecimal() and columns.isascii() and int(columns) > 0):
        kwargs["_environ"] = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return _Console(**kwargs)

"""A thread that runs MAC updates for a reader: a second core hashing the bytes the reader
has just received.

Upstream: none (the Rust runners hash on the reading thread; a Python reader hands one of two
MACs to this worker so that OpenSSL, which releases the GIL, hashes both at once).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from .._threads import start_thread

__all__ = ["MacWorker"]

log = logging.getLogger(__name__)


class MacWorker:
    """A thread that runs MAC updates handed to it, in order (a second core for a reader).

    OpenSSL hashing releases the GIL, so a reader that hands one of two MACs over the same bytes
    to a worker hashes both in about the time of one. Use as a context manager, or call
    :meth:`close`; the thread is joined on close.

    No upstream counterpart: upstream hashes on the reading thread (``wire.rs``).
    """

    def __init__(self, name: str = "flodl-mac") -> None:
        self._queue: queue.Queue[tuple[Any, memoryview] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name)
        start_thread(self._thread)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                item[0].update(item[1])
            except Exception:  # pragma: no cover - a wrong digest then fails the tag check
                log.exception("MAC update failed")
            finally:
                item = None  # hold no view of the reader's buffer (it may be resized)
                self._queue.task_done()

    def submit(self, mac: Any, view: memoryview) -> None:
        """Queue ``mac.update(view)`` (``view`` must stay unchanged until :meth:`drain`)."""
        self._queue.put((mac, view))

    def drain(self) -> None:
        """Wait until every queued update has run."""
        self._queue.join()

    def close(self) -> None:
        """Finish the queued updates and join the thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> MacWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

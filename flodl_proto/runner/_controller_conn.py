"""The controller runner's per-connection state and the messages its coordinator takes.

Internal to :mod:`flodl_proto.runner.controller`: a data connection (:class:`Conn`: socket,
parser, reader and writer threads, outbox), a scattered round whose Broadcast writes are not
all done (:class:`Scatter`), and the small typed messages of the coordinator's queue (the
inputs that do not come from a connection's reader).

Upstream: ``flodl/src/distributed/controller/mod.rs`` (``ClusterController``'s per-relay
reader and writer).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeAlias

from .._oserr import os_reason
from ..codec._common import BytesLike
from ..codec.stream import MuxStream
from ..fsm.events import RoundScattered, SendKind, SendTo
from ..spec import CONTROLLER_BROADCAST_BACKLOG
from . import stages
from ._netio import shutdown_quietly
from ._netio_send import DIRECT_WRITE_MAX, NOW_FLAGS, _advance, _flatten, send_all, send_now

log = logging.getLogger("flodl_proto.runner.controller")

__all__ = ["Conn", "Crashed", "DeadDeclared", "Drain", "Message", "OutItem", "Scatter",
           "StopRequested", "Wake", "Written"]


class Drain(str):
    """A close request (its reason) that sends FIN only: see ``CloseConnection.drain``."""

    __slots__ = ()


#: an item of a connection's outbox: a record to write, a close request (its reason) or None
#: (the writer exits)
OutItem: TypeAlias = SendTo | str | None


# -- what the coordinator's queue carries (everything else runs where it happens) -------------
@dataclass(frozen=True, slots=True)
class StopRequested:
    """:meth:`ReferenceController.request_stop` (thread- and signal-safe, hence queued)."""

    detail: str


@dataclass(frozen=True, slots=True)
class DeadDeclared:
    """:meth:`ReferenceController.declare_dead` from outside."""

    rank: int


@dataclass(frozen=True, slots=True)
class Written:
    """A connection's writer finished ``send`` (``error``: why it failed, else None)."""

    conn: int
    send: SendTo
    error: str | None


@dataclass(frozen=True, slots=True)
class Crashed:
    """An unexpected exception on a runner thread: the run fails."""

    where: str
    error: Exception


@dataclass(frozen=True, slots=True)
class Wake:
    """The core finished on another thread: the coordinator tears down."""


Message: TypeAlias = StopRequested | DeadDeclared | Written | Crashed | Wake


class Conn:
    """One data-channel connection: socket, parser, reader thread, writer thread and its outbox
    (records are written in order; a close request closes after the records queued before it).

    ``queued`` counts the outbox items not finished yet (under ``out_lock``): a record is
    written directly by the thread that produced it only when it is 0, so nothing overtakes a
    record still in the outbox. ``broadcasts`` counts the Broadcasts among them: at
    :data:`~flodl_proto.spec.CONTROLLER_BROADCAST_BACKLOG` no other is taken (:meth:`write_now`
    returns None)."""

    __slots__ = ("addr", "broadcasts", "closed", "id", "out_lock", "outbox", "queued", "reader",
                 "sock", "stream", "writer")

    def __init__(self, conn_id: int, sock: socket.socket, addr: str, stream: MuxStream) -> None:
        self.id = conn_id
        self.sock = sock
        self.addr = addr
        self.stream = stream
        self.reader: threading.Thread | None = None
        self.writer: threading.Thread | None = None
        self.outbox: queue.SimpleQueue[OutItem] = queue.SimpleQueue()
        self.out_lock = threading.Lock()
        self.queued = 0
        self.broadcasts = 0
        self.closed = False

    def write_now(self, send: SendTo) -> bool | None:
        """Write ``send`` with one non-blocking ``sendmsg`` when nothing is queued before it and
        it is at most :data:`~flodl_proto.runner._netio_send.DIRECT_WRITE_MAX` bytes; else queue it
        (or what that write left) for the writer. Returns True when it was written whole, False
        when it was queued, None when it is a Broadcast and the connection already has
        :data:`~flodl_proto.spec.CONTROLLER_BROADCAST_BACKLOG` Broadcasts unwritten (nothing
        written or queued: the caller reports the write failed)."""
        broadcast = send.kind is SendKind.BROADCAST
        with self.out_lock:
            if self.queued == 0 and send.nbytes <= DIRECT_WRITE_MAX:
                rest = _write_direct(self.sock, send.buffers, send.nbytes)
                if not rest:
                    return True
                send = replace(send, buffers=tuple(rest))
            elif broadcast and self.broadcasts >= CONTROLLER_BROADCAST_BACKLOG:
                return None
            self.queued += 1
            self.broadcasts += broadcast
            self.outbox.put(send)
        return False

    def queue_close(self, reason: str) -> None:
        """Close (a :class:`Drain`: FIN only) once the records queued before are written."""
        with self.out_lock:
            self.queued += 1
            self.outbox.put(reason)

    def write_loop(self, report: Callable[[Written], None]) -> None:
        """The connection's writer: its records in order, each under the write-stall deadline
        for the whole record; after a failure the records left are not written (each is
        reported failed). Every Broadcast and every failure is passed to ``report``."""
        failed: str | None = None
        while True:
            item = self.outbox.get()
            if item is None:
                return
            if isinstance(item, str):  # close, after the records queued before
                log.debug("controller: closing connection %d (%s): %s", self.id, self.addr,
                          item)
                shutdown_quietly(self.sock, socket.SHUT_WR if isinstance(item, Drain)
                                 else socket.SHUT_RDWR)
                failed = failed or "connection closed"
                with self.out_lock:
                    self.queued -= 1
                continue
            error = failed
            if error is None:
                try:
                    send_all(self.sock, item.buffers)
                except OSError as e:
                    error = failed = os_reason(e)
                    log.warning("controller: %s write to connection %d failed: %s",
                                item.kind.value, self.id, error)
            with self.out_lock:
                self.queued -= 1
                self.broadcasts -= item.kind is SendKind.BROADCAST
            if error is None and item.round is not None:
                stages.mark("controller", item.round - 1, "broadcast_sent")
            if error is not None or item.round is not None:
                report(Written(self.id, item, error))
            item = None  # hold no record buffers while waiting


#: a record of at most this many buffers is first offered to one ``sendmsg`` as it is
_DIRECT_BUFFERS = 64


def _write_direct(sock: socket.socket, buffers: tuple[BytesLike, ...],
                  nbytes: int) -> list[memoryview]:
    """:func:`~flodl_proto.runner._netio_send.send_now` of ``buffers`` (``nbytes`` in all): what is
    left (empty: everything was written). A record of a few buffers is first offered to one
    non-blocking ``sendmsg`` as it is (a small record leaves whole in it); only what that call
    left goes through ``send_now``'s buffer walk."""
    if len(buffers) > _DIRECT_BUFFERS:
        return send_now(sock, buffers)
    try:
        sent = sock.sendmsg(buffers, (), NOW_FLAGS)
    except OSError:  # full, interrupted or failed: send_now tries again, then the writer
        return send_now(sock, buffers)
    if sent == nbytes:
        return []
    bufs = _flatten(buffers)
    return send_now(sock, bufs[_advance(bufs, 0, sent):])


@dataclass(slots=True)
class Scatter:
    """A scattered round whose Broadcast writes are not all done yet."""

    notice: RoundScattered
    t0: float
    pending: int

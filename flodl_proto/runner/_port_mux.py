"""The controller's accept loop: :class:`PortMux` takes TCP connections on the controller's one
port and hands each to the channel it asks for.

With the **port mux** (the default, as flodl runs in production) it peeks each connection's
first 4 bytes (the channel magic, left in place for the reader) within :func:`peek_timeout`
seconds: the data channel goes to the controller, ``GET ``/``POST`` to the status responder, and
an unknown or unserved magic, an EOF, an error or a timeout before 4 bytes drops only that
connection (logged at INFO, except a rank's handshake magic: a rank given the controller's
address, which is logged as a warning naming where ranks dial). A connection that sent part of
its magic is peeked again every 5 ms. **Direct**
(``port_mux=False``) hands every connection to the data channel, which consumes the magic
itself; the listener is closed once the controller stops accepting data connections.

Upstream: ``flodl/src/distributed/port_mux.rs`` (``PortMux``, ``StreamSource``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

from ..codec.handshake import channel_of
from ..spec import (
    CHANNEL_MAGIC_DATA,
    CHANNEL_MAGIC_HTTP_GET,
    CHANNEL_MAGIC_HTTP_POST,
    CHANNEL_MAGIC_LEN,
    HANDSHAKE_MAGIC_RANK,
    RELAY_DATA_LOOPBACK_OFFSET,
    SPEC,
    net_timeout_scale,
)
from ._netio import format_addr

__all__ = ["PortMux", "peek_timeout"]

log = logging.getLogger("flodl_proto.runner.controller")

_ACCEPT_POLL: Final = SPEC.timeout("ACCEPT_POLL")
_PEEK_RETRY: Final = 0.005  # seconds between peeks of a connection that sent part of its magic


def peek_timeout() -> float:
    """Port-mux deadline for a connection's 4-byte channel magic, seconds:
    ``ceil(5 x FLODL_NET_TIMEOUT_SCALE)``, at least 1. Upstream: ``port_mux.rs``."""
    return float(max(1, math.ceil(SPEC.timeout("PORT_MUX_PEEK") * net_timeout_scale())))


class PortMux:
    """The accept loop of one listening socket (see the module doc); :meth:`run` returns once
    ``stop`` is set.

    Args:
        listener: the listening socket (non-blocking). In direct mode it is closed here once
            ``accepting_data()`` turns False.
        port_mux: peek each connection's channel magic (True) or hand every connection to the
            data channel (False).
        stop: the controller's stop flag, checked at least every 0.5 s.
        accepting_data: whether a data-channel connection is still taken (the accept phase);
            one that comes later is dropped.
        open_data: ``open_data(sock, addr)`` takes a data-channel connection (blocking, its
            magic unread); ``addr`` is ``host:port``.
        open_status: ``open_status(sock, addr)`` takes an HTTP connection (its request unread).

    Upstream: ``port_mux.rs`` ``PortMux``.
    """

    def __init__(self, listener: socket.socket, *, port_mux: bool, stop: threading.Event,
                 accepting_data: Callable[[], bool],
                 open_data: Callable[[socket.socket, str], None],
                 open_status: Callable[[socket.socket, str], None]) -> None:
        self._listener: socket.socket | None = listener
        self._port_mux, self._stop = port_mux, stop
        self._accepting_data, self._open_data, self._open_status = (accepting_data, open_data,
                                                                    open_status)
        self._sel = selectors.DefaultSelector()
        self._pending: dict[socket.socket, tuple[float, str]] = {}  # sock -> (deadline, addr)
        self._retry: dict[socket.socket, float] = {}  # partly-magic sockets, next peek time
        self._deadline = peek_timeout()

    def run(self) -> None:
        """Accept and hand out connections until ``stop`` is set; the connections still
        waiting for their magic are closed then."""
        lst = self._listener
        assert lst is not None
        sel, pending, retry = self._sel, self._pending, self._retry
        sel.register(lst, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                if lst is not None and not self._port_mux and not self._accepting_data():
                    sel.unregister(lst)  # direct mode: no connection after the accept phase
                    with contextlib.suppress(OSError):
                        lst.close()
                    lst = self._listener = None
                now = time.monotonic()
                for s, at in list(retry.items()):
                    if now >= at:
                        del retry[s]
                        sel.register(s, selectors.EVENT_READ)
                for s, (dl, addr) in list(pending.items()):
                    if now >= dl:
                        log.info("controller: %s sent no channel magic within %gs; dropping",
                                 addr, self._deadline)
                        self._drop(s)
                wait = _ACCEPT_POLL * 5
                if retry:
                    wait = min(wait, max(0.0, min(retry.values()) - now))
                for key, _ in sel.select(wait):
                    if lst is not None and key.fileobj is lst:
                        self._accept_ready(lst)
                    else:
                        peer = key.fileobj
                        assert isinstance(peer, socket.socket)
                        self._peek(peer)
        finally:
            for s in list(pending):
                with contextlib.suppress(OSError):
                    s.close()
            sel.close()

    def _accept_ready(self, lst: socket.socket) -> None:
        while True:
            try:
                sock, raddr = lst.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("controller: accept failed: %s", e)
                return
            addr = format_addr((str(raddr[0]), int(raddr[1])))
            if not self._port_mux:
                self._open_data(sock, addr)
                continue
            sock.setblocking(False)
            self._pending[sock] = (time.monotonic() + self._deadline, addr)
            self._sel.register(sock, selectors.EVENT_READ)

    def _drop(self, s: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(s)
        self._pending.pop(s, None)
        self._retry.pop(s, None)
        with contextlib.suppress(OSError):
            s.close()

    def _peek(self, s: socket.socket) -> None:
        addr = self._pending[s][1]
        try:
            head = s.recv(CHANNEL_MAGIC_LEN, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            log.info("controller: %s failed before its channel magic (%s); dropping", addr, e)
            self._drop(s)
            return
        if not head:
            log.info("controller: %s closed before its channel magic; dropping", addr)
            self._drop(s)
            return
        if len(head) < CHANNEL_MAGIC_LEN:
            self._sel.unregister(s)
            self._retry[s] = time.monotonic() + _PEEK_RETRY
            return
        self._sel.unregister(s)
        self._pending.pop(s, None)
        magic, channel = channel_of(head)
        s.setblocking(True)
        if magic == CHANNEL_MAGIC_DATA:
            if not self._accepting_data():
                log.info("controller: data-channel connection from %s after the accept phase; "
                         "dropping", addr)
                with contextlib.suppress(OSError):
                    s.close()
                return
            self._open_data(s, addr)
        elif magic in (CHANNEL_MAGIC_HTTP_GET, CHANNEL_MAGIC_HTTP_POST):
            self._open_status(s, addr)
        else:
            if channel is not None:
                log.info("controller: %s channel from %s is not served here; dropping", channel,
                         addr)
            elif magic == HANDSHAKE_MAGIC_RANK:  # a rank given the controller's address
                log.warning("controller: %s sent a rank's handshake (magic 0x%08x), not a "
                            "channel magic: a rank dials its relay's loopback port (relay "
                            "--listen-port, by default the controller's port + %d), not the "
                            "controller; dropping", addr, magic, RELAY_DATA_LOOPBACK_OFFSET)
            else:
                log.info("controller: unknown channel magic 0x%08x from %s; dropping", magic,
                         addr)
            with contextlib.suppress(OSError):
                s.close()

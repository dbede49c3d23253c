"""Socket settings shared by the relay, the controller and the rank client: timeouts, TCP
keepalive, the connect retry, and the errors a socket wait raises.

Every cluster socket here is a *blocking* Python socket whose timeouts are set at the OS level
(``SO_RCVTIMEO`` / ``SO_SNDTIMEO``), so one socket can have a short read poll and a long
write-stall ceiling at the same time (Python's own ``settimeout`` covers both directions and
puts the descriptor in non-blocking mode). A timed-out ``recv`` or ``send`` then raises
``BlockingIOError``, exactly like a Rust ``read``/``write`` with a timeout returns ``WouldBlock``.

``socket.shutdown(SHUT_RDWR)`` from another thread wakes a blocked ``recv``/``send``; the
runners use it to stop their threads before joining them.

The reads are in :mod:`flodl_proto.runner._netio_recv`, the writes and the fan-out in
:mod:`flodl_proto.runner._netio_send`.

Upstream: ``flodl/src/distributed/wire.rs`` (``connect_with_retry``, ``WRITE_STALL_TIMEOUT``,
``net_timeout_scale``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import math
import socket
import threading
import time
from collections.abc import Callable

from .._oserr import os_reason
from ..addr import format_addr, parse_addr
from ..spec import SPEC, net_timeout_scale

__all__ = [
    "PeerTimedOut",
    "ReadDeadlinePassed",
    "Stopped",
    "committed_read_starvation",
    "configure_socket",
    "connect_attempts",
    "connect_with_retry",
    "format_addr",
    "handshake_read_timeout",
    "keepalive_bound",
    "keepalive_settings",
    "parse_addr",
    "poll_interval",
    "reduce_read_deadline",
    "set_timeouts",
    "shutdown_quietly",
    "write_stall_timeout",
]

log = logging.getLogger(__name__)


class Stopped(Exception):
    """A blocking read was abandoned because its owner asked the thread to stop."""


class ReadDeadlinePassed(TimeoutError):
    """A read given a ``deadline``
    (:func:`~flodl_proto.runner._netio_recv.recv_exact_into`) was still short when it passed;
    ``got``: the bytes of the unit read by then (they are in the caller's buffer)."""

    def __init__(self, got: int) -> None:
        super().__init__(f"read deadline passed after {got} bytes")
        self.got = got


class PeerTimedOut(ConnectionError):
    """The kernel gave up on the connection (``ETIMEDOUT``): keepalive probes went unanswered,
    or sent data stayed unacknowledged, for :func:`keepalive_bound` seconds. The peer vanished
    without closing (power loss, a partition, a frozen host)."""


def keepalive_settings() -> tuple[int, int, int]:
    """``(idle, interval, probes)`` of the TCP keepalive of every data-channel socket: idle and
    interval in whole seconds (scaled by ``FLODL_NET_TIMEOUT_SCALE``, ceil, at least 1).

    A departure (addition) from upstream: ``tcp_keepalive`` in ``spec/wire.yaml``.
    """
    scale = net_timeout_scale()
    idle = max(1, math.ceil(SPEC.timeout("TCP_KEEPALIVE_IDLE") * scale))
    interval = max(1, math.ceil(SPEC.timeout("TCP_KEEPALIVE_INTERVAL") * scale))
    probes = int(SPEC.raw["timeouts"]["TCP_KEEPALIVE_INTERVAL"]["probes"])
    return idle, interval, probes


def keepalive_bound() -> float:
    """Seconds within which a silent peer's connection fails: idle + probes x interval of
    :func:`keepalive_settings` (also the socket's TCP_USER_TIMEOUT)."""
    idle, interval, probes = keepalive_settings()
    return float(idle + probes * interval)


def set_keepalive(sock: socket.socket) -> None:
    """Turn on TCP keepalive with :func:`keepalive_settings` and set TCP_USER_TIMEOUT to
    :func:`keepalive_bound` (options the platform lacks are skipped)."""
    idle, interval, probes = keepalive_settings()
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", probes),
                        ("TCP_USER_TIMEOUT", int(keepalive_bound() * 1000))):
        opt = getattr(socket, name, None)
        if opt is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)


def write_stall_timeout() -> float:
    """SO_SNDTIMEO of every cluster socket, seconds: 30 s x ``FLODL_NET_TIMEOUT_SCALE``."""
    return SPEC.timeout("WRITE_STALL") * net_timeout_scale()


def connect_attempts() -> int:
    """``connect_with_retry`` attempts: ``ceil(60 x scale)``, at least 1."""
    attempts = int(SPEC.raw["timeouts"]["CONNECT_BACKOFF"]["attempts"])
    return max(1, math.ceil(attempts * net_timeout_scale()))


def handshake_read_timeout() -> float:
    """Handshake wait, seconds (10 s, not scaled): a rank's for its ack, a relay's for a local
    rank's handshake."""
    return SPEC.timeout("HANDSHAKE_READ")


def reduce_read_deadline() -> float:
    """Rank-side per-read deadline after the handshake, seconds: ``ceil(120 x scale)``, >= 1."""
    return float(max(1, math.ceil(SPEC.timeout("REDUCE_READ_DEADLINE") * net_timeout_scale())))


def poll_interval() -> float:
    """Relay socket poll period, seconds (100 ms)."""
    return SPEC.timeout("RELAY_POLL")


def committed_read_starvation() -> float:
    """A read inside a started record/blob that makes no progress this long fails (60 s)."""
    return SPEC.timeout("COMMITTED_READ_STARVATION")


class _Timeval(ctypes.Structure):
    """The C ``struct timeval`` that ``SO_RCVTIMEO`` / ``SO_SNDTIMEO`` take (native longs)."""

    _fields_ = (("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long))


def _timeval(seconds: float | None) -> bytes:
    if seconds is None or seconds <= 0:
        return bytes(_Timeval(0, 0))  # 0 = no timeout
    sec = int(seconds)
    usec = round((seconds - sec) * 1_000_000)
    if sec == 0 and usec == 0:
        usec = 1
    return bytes(_Timeval(sec, usec))


def set_timeouts(sock: socket.socket, *, recv: float | None = None,
                 send: float | None = None) -> None:
    """Set the OS-level read / write timeouts (seconds; ``None`` = block forever).

    The socket is left in blocking mode; a timed-out call raises ``BlockingIOError``.
    """
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(recv))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(send))


def configure_socket(sock: socket.socket, *, recv: float | None = None,
                     send: float | None = None) -> None:
    """TCP_NODELAY, TCP keepalive (:func:`set_keepalive`) and :func:`set_timeouts` (``send``
    defaults to the write-stall ceiling)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    set_keepalive(sock)
    set_timeouts(sock, recv=recv, send=write_stall_timeout() if send is None else send)


def connect_with_retry(addr: tuple[str, int], what: str, *,
                       stop: threading.Event | None = None,
                       on_retry: Callable[[str], None] | None = None) -> socket.socket:
    """TCP connect with the cluster retry budget (``connect_attempts()`` x 500 ms).

    Args:
        addr: ``(host, port)``.
        what: names the dial in the error (``"relay upstream"``, ``"cpu_reduce"``).
        stop: abandon the retries when set.
        on_retry: called once, when the first attempt failed and more follow, with one line
            naming the address, the error, the retry period and the budget (``"connect to
            HOST:PORT failed: <error>; retrying every 0.5s, giving up after ~30s (60
            attempts)"``), so a command can say it is waiting instead of retrying silently.

    Returns:
        A connected blocking socket (no timeouts set yet).

    Raises:
        ConnectionError: every attempt failed (message in upstream's wording:
            ``"<what>: connect to HOST:PORT failed after N attempts (~Ss): <last error>"``).
        Stopped: ``stop`` was set.

    Upstream: ``wire.rs`` ``connect_with_retry``.
    """
    attempts = connect_attempts()
    backoff = SPEC.timeout("CONNECT_BACKOFF")
    last: OSError | None = None
    for i in range(attempts):
        if stop is not None and stop.is_set():
            raise Stopped(what)
        try:
            return socket.create_connection(addr, timeout=max(backoff, 10.0))
        except OSError as e:
            last = e
            log.debug("%s: connect attempt %d/%d to %s failed: %s", what, i + 1, attempts,
                      format_addr(addr), e)
            if i + 1 < attempts:
                if i == 0 and on_retry is not None:
                    on_retry(f"connect to {format_addr(addr)} failed: {os_reason(e)}; "
                             f"retrying every {backoff:g}s, giving up after "
                             f"~{attempts * backoff:g}s ({attempts} attempts)")
                if stop is not None:
                    if stop.wait(backoff):
                        raise Stopped(what) from None
                else:
                    time.sleep(backoff)
    raise ConnectionError(
        f"{what}: connect to {format_addr(addr)} failed after {attempts} attempts "
        f"(~{attempts * backoff:g}s): {os_reason(last) if last is not None else 'no attempt'}"
    )



def _timed_out(sock: socket.socket, what: str) -> PeerTimedOut:
    try:
        peer = f" to {format_addr(sock.getpeername())}"
    except OSError:  # already disconnected: the caller knows whom it talked to
        peer = ""
    return PeerTimedOut(errno.ETIMEDOUT,
                        f"{what} on the connection{peer} failed: the peer did not answer for "
                        f"{keepalive_bound():g}s (TCP keepalive / user timeout)")


def shutdown_quietly(sock: socket.socket | None, how: int = socket.SHUT_RDWR) -> None:
    """``sock.shutdown(how)``, ignoring errors (wakes threads blocked on the socket)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(how)

"""The per-host relay of the data channel: local ranks on loopback, one connection upstream.

A :class:`Relay` binds the loopback data port (upstream's default: the controller's port + 4),
accepts exactly its host's ranks and terminates their 16-byte handshakes itself (version, world
size, rank in the host's set, no duplicates), then dials the controller, sends the data channel
magic and ``Hello`` (ranks ascending; ``model_sigs`` empty at version 3, absent at version 2) and
requires ``HelloAck``. It then runs the fold barrier:

* one reader thread per local rank reads ``u32 length | RoundFrame`` blobs (prefix checked
  against the frame ceiling, then ``recv_into`` one buffer of exactly that length) and deposits
  them into the :class:`~flodl_proto.reduce.HostFold`; the deposit (or death) that completes a
  round queues one ``HostFrame`` record;
* one upstream reader (the sole writer of the rank sockets) fans every ``Broadcast`` payload out
  verbatim (``u32 length | payload``) to every alive local rank, ignoring write failures, and
  applies ``DeclareDead``;
* one outbound writer (the sole writer upstream) drains a bounded queue of 64 records.

A local rank that closes (or whose stream breaks) is marked dead in the fold (which may complete
the round) and reported upstream with ``RankExit``. The relay ends when the controller closes its
connection, when the last local rank has left (its records are flushed first, then the upstream
connection is closed), or on a fatal error (parse, MAC, schema, double deposit, an upstream
protocol error, a stalled upstream write), which :meth:`Relay.wait` reports.

Upstream: ``flodl/src/distributed/relay/agent.rs`` (``RelayChannel``, the fold barrier),
``relay/mod.rs`` (loopback port offsets), ``relay/mux.rs`` (records, len-framed blobs).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..codec._common import BytesLike, check_version
from ..codec.auth import Premac, check_salt, new_mac
from ..codec.handshake import decode_handshake, encode_ack, encode_channel_magic
from ..codec.loopback import decode_len_prefix, encode_len_prefix
from ..codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    decode_mux_record,
    encode_frame_record,
    encode_mux_record,
    encode_mux_record_parts,
    parse_mux_header,
)
from ..codec.round_frame import RoundFrame
from ..errors import ProtocolError, protocol_error
from ..reduce import HostFold
from ..spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_LEN,
    LEN_PREFIX_LEN,
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_HEADER_LEN,
    RELAY_DATA_LOOPBACK_OFFSET,
    RELAY_OUTBOUND_QUEUE,
)
from ._netio import (
    MacRange,
    PeerTimedOut,
    Stopped,
    committed_read_starvation,
    configure_socket,
    connect_with_retry,
    format_addr,
    parse_addr,
    poll_interval,
    recv_exact_into,
    recv_hashing_into,
    send_all,
    shutdown_quietly,
)

__all__ = ["Relay", "RelayStats", "default_relay_port"]

log = logging.getLogger(__name__)

#: period of the note naming the local ranks not connected yet (seconds)
_WAITING_NOTE_PERIOD = 10.0

#: Broadcast payloads from this size on are written to the local ranks concurrently (bytes)
_PARALLEL_FAN_OUT_MIN = 1 << 20

#: queued after the last rank reader exits: the writer flushes and closes upstream
_DRAINED = object()


def default_relay_port(controller_port: int) -> int:
    """Upstream's loopback data port of a host relay: the controller's port + 4.

    Upstream: ``relay/mod.rs`` ``RELAY_DATA_LOOPBACK_OFFSET``.
    """
    return controller_port + RELAY_DATA_LOOPBACK_OFFSET


@dataclass(slots=True)
class RelayStats:
    """Byte and round counters of a relay (bytes include prefixes and record headers).

    Attributes:
        from_ranks: bytes read from local ranks (handshakes included).
        to_ranks: bytes written to local ranks (acks and fanned-out consensus frames).
        upstream_out: bytes written to the controller (magic, Hello, HostFrames, RankExits).
        upstream_in: bytes read from the controller.
        host_frames: HostFrame records queued.
        broadcasts: Broadcast records received.
    """

    from_ranks: int = 0
    to_ranks: int = 0
    upstream_out: int = 0
    upstream_in: int = 0
    host_frames: int = 0
    broadcasts: int = 0


class Relay:
    """One host's data-channel relay.

    Args:
        controller: the controller's address, ``"HOST:PORT"`` or ``(host, port)``.
        ranks: the global rank ids of this host (non-empty, distinct, each < ``world_size``).
        world_size: the cluster's world size (every rank's handshake must carry it).
        salt: the 16-byte session salt.
        version: data-channel protocol version (2 default, or 3).
        listen_host: loopback address to bind (``127.0.0.1``).
        listen_port: the rank-facing port; ``None`` = the controller's port + 4 (upstream's
            default), ``0`` = any free port (read :attr:`port` after :meth:`start`).
        host: the host name announced in ``Hello`` (diagnostic; default the machine's name).
        ceiling: frame ceiling in bytes for every length read (default 1 GiB).

    Use as a context manager, or call :meth:`start`, then :meth:`wait` (or :meth:`shutdown`).

    Raises:
        InvalidValue (local): a bad rank set (``relay.bad_rank_set``) or salt.
        VersionMismatch (local): unsupported version.

    Upstream: ``relay/agent.rs`` ``RelayChannel`` (``ChannelKind::Data``).
    """

    def __init__(
        self,
        controller: str | tuple[str, int],
        ranks: Iterable[int],
        world_size: int,
        salt: BytesLike,
        *,
        version: int = DEFAULT_VERSION,
        listen_host: str = "127.0.0.1",
        listen_port: int | None = None,
        host: str | None = None,
        ceiling: int = DEFAULT_FRAME_CEILING,
    ) -> None:
        self._controller = (parse_addr(controller) if isinstance(controller, str)
                            else (controller[0], int(controller[1])))
        rank_list = [int(r) for r in ranks]
        self.ranks: tuple[int, ...] = tuple(sorted(rank_list))
        self.world_size = int(world_size)
        reason = None
        if not rank_list:
            reason = "no ranks"
        elif len(set(rank_list)) != len(rank_list):
            reason = "a rank is listed twice"
        elif self.world_size <= 0:
            reason = "world_size must be > 0"
        elif any(not 0 <= r < self.world_size for r in rank_list):
            reason = "every rank must be < world_size"
        if reason is not None:
            raise protocol_error("relay.bad_rank_set", ranks=list(self.ranks),
                                 world_size=world_size, reason=reason)
        self._salt = check_salt(salt)
        self.version = check_version(version)
        self._listen_host = listen_host
        self._listen_port = (default_relay_port(self._controller[1]) if listen_port is None
                             else int(listen_port))
        self.host = host if host is not None else socket.gethostname()
        self.ceiling = int(ceiling)
        self.stats = RelayStats()
        self._fold = HostFold(self.ranks, self._salt, version=self.version, ceiling=self.ceiling)

        self._listener: socket.socket | None = None
        self._port: int | None = None
        self._rank_socks: dict[int, socket.socket] = {}
        self._pending: list[socket.socket] = []
        self._upstream: socket.socket | None = None
        self._stop = threading.Event()
        self._fanout_lock = threading.RLock()
        self._done = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # bookkeeping: sockets, error, counters
        self._fold_lock = threading.Lock()  # a fold event and the records it queues are atomic
        self._main: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._queue: queue.Queue[object] = queue.Queue(maxsize=RELAY_OUTBOUND_QUEUE)
        self._active = len(self.ranks)
        self._blob_bufs: dict[int, npt.NDArray[np.uint8]] = {}
        self._record_buf: npt.NDArray[np.uint8] | None = None

    # -- public surface --------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound loopback data port (valid after :meth:`start`).

        Raises:
            RuntimeError: the relay was not started.
        """
        if self._port is None:
            raise RuntimeError("relay not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(listen_host, port)`` the ranks dial."""
        return self._listen_host, self.port

    @property
    def fold(self) -> HostFold:
        """The relay's fold barrier (read-only use: alive ranks, rounds completed)."""
        return self._fold

    @property
    def connected(self) -> bool:
        """True once every local rank has hand-shaken and the controller acknowledged Hello."""
        return self._ready.is_set()

    @property
    def done(self) -> bool:
        """True once the relay has finished (cleanly or not) and released its resources."""
        return self._done.is_set()

    @property
    def error(self) -> BaseException | None:
        """The error that ended the relay, or None (still running, or a clean end)."""
        return self._error

    def start(self) -> Relay:
        """Bind the loopback port and start the relay's supervisor thread; returns ``self``.

        The supervisor accepts the local ranks, dials the controller and runs the fold barrier;
        this call returns as soon as the port is bound.

        Raises:
            OSError: the port could not be bound.
            RuntimeError: already started.
        """
        if self._listener is not None or self._main is not None:
            raise RuntimeError("relay already started")
        lsock = socket.socket(socket.AF_INET6 if ":" in self._listen_host else socket.AF_INET)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((self._listen_host, self._listen_port))
            lsock.listen(max(8, len(self.ranks)))
            lsock.settimeout(poll_interval())
        except BaseException:
            lsock.close()
            raise
        self._listener = lsock
        self._port = int(lsock.getsockname()[1])
        log.info("relay %s: ranks %s listening on %s", self.host, list(self.ranks),
                 format_addr((self._listen_host, self._port)))
        self._main = threading.Thread(target=self._supervise, name=f"flodl-relay-{self._port}")
        self._main.start()
        return self

    def wait(self, timeout: float | None = None) -> BaseException | None:
        """Block until the relay has finished; return the error that ended it (None: clean).

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"relay still running after {timeout}s")
        if self._main is not None:
            self._main.join()
        return self._error

    def shutdown(self, timeout: float | None = None) -> BaseException | None:
        """Stop the relay (closing every connection), join its threads; return its error.

        Idempotent.
        """
        self._stop.set()
        self._wake_all()
        if self._main is None:
            self._release()
            self._done.set()
            return self._error
        return self.wait(timeout)

    def __enter__(self) -> Relay:
        if self._main is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    # -- supervisor ------------------------------------------------------------------------------
    def _fail(self, err: BaseException) -> None:
        self._stop.set()
        with self._lock:
            if self._error is None and not isinstance(err, Stopped):
                self._error = err
                log.info("relay %s (ranks %s) failed: %s", self.host, list(self.ranks), err)
        self._wake_all()

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def _wake_all(self) -> None:
        with self._lock:
            socks = [*self._rank_socks.values(), *self._pending]
            up = self._upstream
        shutdown_quietly(up)
        # a Broadcast already received is delivered whole before the rank sockets go down
        # (each rank write is bounded by the write-stall timeout), as upstream's relay does:
        # its upstream reader finishes a fan-out before it sees the shutdown flag
        with self._fanout_lock:
            for s in socks:
                shutdown_quietly(s)

    def _supervise(self) -> None:
        try:
            self._accept_ranks()
            self._dial_upstream()
            self._ready.set()
            self._spawn_workers()
            self._stop.wait()
        except BaseException as e:  # every failure ends the relay; reported by wait()
            self._fail(e)
        finally:
            self._stop.set()
            self._wake_all()
            for t in self._workers:
                t.join()
            self._release()
            self._done.set()
            log.info("relay %s finished%s", self.host,
                     f" with error: {self._error}" if self._error else "")

    def _release(self) -> None:
        with self._lock:
            socks = [*self._rank_socks.values(), *self._pending]
            self._rank_socks = {}
            self._pending = []
            up, self._upstream = self._upstream, None
            lsock, self._listener = self._listener, None
        for s in socks:
            s.close()
        if up is not None:
            up.close()
        if lsock is not None:
            lsock.close()

    # -- phase 1: local ranks --------------------------------------------------------------------
    def _accept_ranks(self) -> None:
        assert self._listener is not None
        next_note = time.monotonic() + _WAITING_NOTE_PERIOD
        while len(self._rank_socks) < len(self.ranks):
            if self._stop.is_set():
                raise Stopped("accept")
            if time.monotonic() >= next_note:  # upstream waits without a deadline; say for whom
                next_note = time.monotonic() + _WAITING_NOTE_PERIOD
                missing = [r for r in self.ranks if r not in self._rank_socks]
                log.warning("relay %s: still waiting for local rank(s) %s to connect to %s:%d",
                            self.host, missing, *self.address)
            try:
                conn, peer = self._listener.accept()
            except (TimeoutError, BlockingIOError):
                continue
            with self._lock:
                self._pending.append(conn)
            configure_socket(conn, recv=poll_interval())
            hs = bytearray(HANDSHAKE_LEN)
            got = recv_exact_into(conn, memoryview(hs), stop=self._stop)
            self._count("from_ranks", got)
            rank = decode_handshake(memoryview(hs)[:got], self.world_size, self.version)[0].rank
            ack = encode_ack(self.version)
            send_all(conn, ack)
            self._count("to_ranks", len(ack))
            if rank not in self.ranks:
                raise protocol_error("relay.rank_not_in_host", rank=rank, ranks=list(self.ranks))
            if rank in self._rank_socks:
                raise protocol_error("relay.duplicate_rank", rank=rank)
            with self._lock:
                self._pending.remove(conn)
                self._rank_socks[rank] = conn
            log.debug("relay %s: rank %d connected from %s", self.host, rank, peer)
        with self._lock:
            lsock, self._listener = self._listener, None
        if lsock is not None:
            lsock.close()

    # -- phase 2: upstream -----------------------------------------------------------------------
    def _dial_upstream(self) -> None:
        up = connect_with_retry(self._controller, "relay upstream", stop=self._stop)
        with self._lock:
            self._upstream = up
        if self._stop.is_set():
            raise Stopped("dial")
        configure_socket(up, recv=poll_interval())
        hello = MuxRecord.control_msg(Hello(self.host, self.ranks), self.version)
        out = [encode_channel_magic("data"), *encode_mux_record(hello, self._salt)]
        self._count("upstream_out", send_all(up, out))
        rec = self._read_record(up)
        if rec is None:
            raise protocol_error("relay.closed_before_helloack")
        if not isinstance(rec.control, HelloAck):
            got = type(rec.control).__name__ if rec.control is not None else rec.kind.name
            raise protocol_error("relay.expected_helloack", got=got)
        log.info("relay %s: controller %s acknowledged ranks %s", self.host,
                 format_addr(self._controller), list(self.ranks))

    def _read_record(self, sock: socket.socket) -> MuxRecord | None:
        """Read one mux record from the controller; None at EOF.

        Raises:
            PeerTimedOut: the connection died silently (keepalive), naming the controller.
            everything :meth:`_read_record_from` raises.
        """
        try:
            return self._read_record_from(sock)
        except PeerTimedOut as e:
            raise PeerTimedOut(e.errno, f"controller {format_addr(self._controller)}: "
                                        f"{e.strerror}") from None

    def _read_record_from(self, sock: socket.socket) -> MuxRecord | None:
        """Read one mux record: header first (poll), then exactly its payload; None at EOF."""
        header = bytearray(MUX_HEADER_LEN)
        hv = memoryview(header)
        got = recv_exact_into(sock, hv, stop=self._stop, starvation=committed_read_starvation())
        self._count("upstream_in", got)
        if got < MUX_HEADER_LEN:
            return None  # end of stream inside the header is a clean end
        hdr = parse_mux_header(hv, ceiling=self.ceiling)
        # the record is used synchronously (fan-out, control): its buffer is reused next time
        size = MUX_HEADER_LEN + hdr.payload_len
        if self._record_buf is None or self._record_buf.shape[0] != size:
            self._record_buf = np.empty(size, dtype=np.uint8)
        view = self._record_buf.data
        view[:MUX_HEADER_LEN] = hv
        # the record MAC is computed as the payload arrives (the tag is checked by the decode)
        mac = new_mac(self._salt)
        mac.update(hv[:MUX_AUTH_COVERED_HEADER_LEN])
        body = recv_hashing_into(sock, view[MUX_HEADER_LEN:], [MacRange(mac, 0, hdr.payload_len)],
                                 stop=self._stop, committed=True,
                                 starvation=committed_read_starvation())
        self._count("upstream_in", body)
        premac = Premac(MUX_AUTH_COVERED_HEADER_LEN + body, mac.digest())
        res = decode_mux_record(view[:MUX_HEADER_LEN + body], self._salt, version=self.version,
                                ceiling=self.ceiling, premac=premac)
        return res[0]

    # -- phase 3: the fold barrier ---------------------------------------------------------------
    def _spawn_workers(self) -> None:
        def spawn(target: Callable[..., None], name: str, *args: Any) -> None:
            t = threading.Thread(target=self._guard, args=(target, *args), name=name)
            self._workers.append(t)
            t.start()

        spawn(self._outbound_writer, "flodl-relay-out")
        spawn(self._upstream_reader, "flodl-relay-up")
        for rank in self.ranks:
            spawn(self._rank_reader, f"flodl-relay-r{rank}", rank)

    def _guard(self, target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        except Stopped:
            pass
        except BaseException as e:
            self._fail(e)

    def _enqueue(self, item: object) -> None:
        while True:
            if self._stop.is_set():
                raise Stopped("enqueue")
            try:
                self._queue.put(item, timeout=poll_interval())
                return
            except queue.Full:
                continue

    def _ship(self, payload: RoundFrame | memoryview | None) -> None:
        if payload is None:
            return
        if isinstance(payload, RoundFrame):  # merged sums: frame and record MACs in parallel
            parts = encode_frame_record(RecordKind.HOST_FRAME, payload, self._salt,
                                        ceiling=self.ceiling)
        else:  # the seed verbatim, copied: its blob buffer is reused for the rank's next frame
            parts = encode_mux_record_parts(int(RecordKind.HOST_FRAME), 0, [bytes(payload)],
                                            self._salt, ceiling=self.ceiling)
        self._count("host_frames", 1)
        self._enqueue(parts)

    def _rank_reader(self, rank: int) -> None:
        sock = self._rank_socks[rank]
        try:
            while not self._stop.is_set():
                got = self._read_blob(rank, sock)
                if got is None:
                    break
                blob, premac = got
                with self._fold_lock:
                    # the deposit and its HostFrame are queued in round order
                    self._ship(self._fold.deposit_frame(rank, blob, premac=premac))
            else:
                return
            # local end of stream (or a broken loopback stream): out of the barrier, tell upstream
            log.info("relay %s: rank %d left", self.host, rank)
            exit_rec = encode_mux_record(MuxRecord.control_msg(RankExit(rank), self.version),
                                         self._salt)
            with self._fold_lock:
                self._ship(self._fold.declare_dead_frame(rank))
                self._enqueue(list(exit_rec))
        finally:
            with self._lock:
                self._active -= 1
                last = self._active == 0
            if last and not self._stop.is_set():
                log.info("relay %s: last local rank left; closing upstream", self.host)
                try:
                    self._enqueue(_DRAINED)
                except Stopped:
                    pass

    def _read_blob(self, rank: int,
                   sock: socket.socket) -> tuple[memoryview, Premac | None] | None:
        """One loopback blob of ``rank`` and the MAC of its bytes before the last 8 (computed as
        they arrived: the frame's MAC when the frame fills the blob), or None when the rank is
        gone.

        End of stream, a reset, a prefix above the ceiling, a blob cut short or starved: the
        rank is treated as gone (upstream's rank reader turns every read error into RankExit).
        """
        prefix = bytearray(LEN_PREFIX_LEN)
        try:
            got = recv_exact_into(sock, memoryview(prefix), stop=self._stop,
                                  starvation=committed_read_starvation())
            self._count("from_ranks", got)
            if got < LEN_PREFIX_LEN:
                return None
            n = decode_len_prefix(prefix, ceiling=self.ceiling)
            view = self._blob_buffer(rank, n)
            mac = new_mac(self._salt) if n > AUTH_TAG_LEN else None
            ranges = [MacRange(mac, 0, n - AUTH_TAG_LEN)] if mac is not None else []
            body = recv_hashing_into(sock, view, ranges, stop=self._stop, committed=True,
                                     starvation=committed_read_starvation())
            self._count("from_ranks", body)
        except ProtocolError as e:
            log.warning("relay %s: rank %d loopback stream failed: %s", self.host, rank, e)
            return None
        except OSError as e:
            log.info("relay %s: rank %d loopback read failed: %s", self.host, rank, e)
            return None
        if body < n:
            log.warning("relay %s: rank %d closed inside a %d-byte blob (%d bytes read)",
                        self.host, rank, n, body)
            return None
        premac = Premac(n - AUTH_TAG_LEN, mac.digest()) if mac is not None else None
        return view, premac

    def _blob_buffer(self, rank: int, n: int) -> memoryview:
        """An ``n``-byte buffer for ``rank``'s next blob: last round's buffer when the fold no
        longer holds it (the rank's previous deposit was consumed by a completed round), else a
        fresh one (reusing spares the page faults of a fresh allocation every round)."""
        buf = self._blob_bufs.get(rank)
        if buf is None or buf.shape[0] != n or rank in self._fold.deposited:
            buf = np.empty(n, dtype=np.uint8)
            self._blob_bufs[rank] = buf
        return buf.data

    def _upstream_reader(self) -> None:
        up = self._upstream
        assert up is not None
        while not self._stop.is_set():
            rec = self._read_record(up)
            if rec is None:
                log.info("relay %s: controller closed the connection", self.host)
                self._stop.set()
                self._wake_all()
                return
            if rec.kind is RecordKind.BROADCAST:
                self._count("broadcasts", 1)
                self._fan_out(rec.payload)
            elif rec.kind is RecordKind.CONTROL and isinstance(rec.control, DeclareDead):
                rank = rec.control.rank
                if rank not in self.ranks:
                    log.warning("relay %s: DeclareDead for rank %d, not one of ours %s",
                                self.host, rank, list(self.ranks))
                    continue
                log.info("relay %s: controller declared rank %d dead", self.host, rank)
                with self._fold_lock:
                    self._ship(self._fold.declare_dead_frame(rank))
            else:
                log.warning("relay %s: ignoring unexpected %s record from the controller",
                            self.host, rec.kind.name)

    def _fan_out(self, payload: memoryview) -> None:
        with self._fanout_lock:
            self._fan_out_locked(payload)

    def _fan_out_locked(self, payload: memoryview) -> None:
        prefix = encode_len_prefix(payload.nbytes, ceiling=self.ceiling)
        targets = [(rank, sock) for rank in self._fold.alive_ranks
                   if (sock := self._rank_socks.get(rank)) is not None]
        if len(targets) < 2 or payload.nbytes < _PARALLEL_FAN_OUT_MIN:
            for rank, sock in targets:
                self._send_to_rank(rank, sock, prefix, payload)
            return
        # each rank reads (and verifies) at its own pace: write to every rank at once
        threads = [threading.Thread(target=self._send_to_rank, args=(rank, sock, prefix, payload),
                                    name=f"flodl-relay-fan-r{rank}")
                   for rank, sock in targets[1:]]
        for t in threads:
            t.start()
        try:
            self._send_to_rank(*targets[0], prefix, payload)
        finally:
            for t in threads:
                t.join()

    def _send_to_rank(self, rank: int, sock: socket.socket, prefix: bytes,
                      payload: memoryview) -> None:
        try:
            self._count("to_ranks", send_all(sock, [prefix, payload]))
        except OSError as e:  # the rank's reader will see the failure and report it
            log.info("relay %s: broadcast to rank %d failed: %s", self.host, rank, e)

    def _outbound_writer(self) -> None:
        up = self._upstream
        assert up is not None
        while True:
            try:
                item = self._queue.get(timeout=poll_interval())
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if item is _DRAINED:
                shutdown_quietly(up, socket.SHUT_WR)
                self._stop.set()
                self._wake_all()
                return
            if self._stop.is_set():
                return
            assert isinstance(item, list)
            try:
                n = send_all(up, item)
                # the record's buffers (the fold's pooled arrays) are free for its next round
                item = None
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
                log.info("relay %s: controller connection closed while writing: %s",
                         self.host, e)
                self._stop.set()
                self._wake_all()
                return
            self._count("upstream_out", n)


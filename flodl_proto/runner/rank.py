"""The rank-side client of the data channel: one rank talking to its host's relay.

A :class:`RankClient` connects to the relay's loopback data port, sends the 16-byte handshake,
checks the 8-byte ack, and then runs strictly alternating request/reply rounds: it writes
``u32 length | RoundFrame`` and reads ``u32 length | consensus RoundFrame`` back (the controller's
frame, forwarded verbatim by the relay). The reply must fill its length prefix exactly.

Production path (:meth:`RankClient.all_reduce_scaled`): every tensor is pre-scaled by the
rank's realized-work mass in f32 and rounded once into the wire dtype; an idle rank (scale 0.0)
sends elided payloads at protocol version 3 and real zeros (``0.0 x T``) at version 2. The
consensus is written back into the caller's arrays (``np.copyto`` from read-only views of the
reply buffer, bf16 widened when the destination is f32) unless the round realized no work.

Timeouts: connect with the cluster retry budget; 10 s for the ack; then ``ceil(120 s x
FLODL_NET_TIMEOUT_SCALE)`` per read; the write-stall ceiling on every write.

Upstream: ``flodl/src/distributed/cpu_reduce.rs`` (``CpuReduceClient``).
"""

from __future__ import annotations

import hashlib
import logging
import operator
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from .._bf16 import is_bf16
from .._names import adopt
from .._oserr import os_reason
from .._slots import slot_builder
from ..addr import format_addr
from ..codec._common import END_OF_STREAM, BytesLike, check_version
from ..codec.auth import check_salt
from ..codec.ceiling import check_frame_ceiling
from ..codec.handshake import decode_ack, encode_handshake
from ..codec.loopback import (
    decode_framed_round_or_eos,
    encode_len_prefix,
)
from ..codec.plans import signed_frame_batches
from ..codec.round_frame import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    known_round_frame,
    read_known_frame,
    round_frame_pieces,
)
from ..codec.template import FrameTemplate
from ..errors import ProtocolError, protocol_error
from ..reduce._quiet import quiet_enter, quiet_exit
from ..reduce.payload import Bf16Scaler
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    HANDSHAKE_ACK_LEN,
    LEN_PREFIX_LEN,
    SPEC,
)
from . import stages
from ._netio import (
    configure_socket,
    connect_with_retry,
    handshake_read_timeout,
    parse_addr,
    reduce_read_deadline,
    set_timeouts,
    write_stall_timeout,
)
from ._netio_recv import hash_step, recv_exact_into
from ._netio_send import send_all
from ._prefixed import PrefixedReader
from ._rank_payloads import (
    F32,
    SmallLayout,
    check_array,
    decode_into,
    fill_small,
    real_argument,
    scaled_payload,
)

__all__ = ["RankClient", "ReduceReply", "decode_into"]

# its code lives in runner/_rank_payloads.py; it is this module's name, so help(), pydoc and
# pickle name it (set once, at import)
adopt(__name__, decode_into)

log = logging.getLogger(__name__)

#: the catalogued errors whose upstream words name the controller as the peer, read from the
#: catalogue (``cluster_controller: ...``, ``cpu_reduce: controller ...``): those a rank reports
#: are about its relay, its one peer (the ack a relay sends, the reply it sends or not, a reply
#: the RoundFrame reader refuses: its magic, tensor count, kind, weight, a cut, its HMAC tag)
_NAMING_THE_CONTROLLER = frozenset(eid for eid, entry in SPEC.errors.items()
                                   if entry.remote and "controller" in entry.template)


def _name_the_relay(err: ProtocolError, relay: str | None) -> None:
    """Append to ``err``'s message, when it is one of :data:`_NAMING_THE_CONTROLLER`, which
    peer the rank has: ``; this rank's peer at HOST:PORT (expected its relay)`` (``relay``: the
    address the rank is connected to; None: unknown, the address left out). The catalogued
    text stays whole before it, so a match of its prefix still holds.

    The peer is named as the one the rank expects, not asserted to be its relay: a rank given
    the controller's address instead reads the same missing ack as one whose relay refused
    its handshake (the controller sends a rank nothing: its port mux drops the connection with
    a warning, its direct listener fails the run), so the rank cannot tell the two apart.

    No upstream counterpart (upstream's rank client reports the texts as they are)."""
    if err.error_id in _NAMING_THE_CONTROLLER:
        at = "" if relay is None else f" at {relay}"
        err.args = (f"{err.message}; this rank's peer{at} (expected its relay)", *err.args[1:])


def _peer_of(sock: socket.socket, dialed: tuple[str, int]) -> str:
    """The address (``HOST:PORT``) ``sock`` is connected to, or ``dialed`` when the socket
    no longer says (its peer reset it)."""
    try:
        return format_addr(sock.getpeername())
    except OSError:
        return format_addr(dialed)

#: a Model or Control frame whose payloads total at most this many bytes is written into a kept
#: :class:`~flodl_proto.codec.template.FrameTemplate` of its layout (each tensor pre-scaled
#: straight into its place, the tag computed over the one buffer, one ``sendmsg``); larger frames
#: are sent as pieces, hashed step by step as they are written. In a template the payloads sit
#: where the wire puts them, mostly unaligned for NumPy, which costs more than the per-round
#: objects saved once a tensor reaches tens of KiB.
TEMPLATE_MAX_PAYLOAD = 64 << 10
#: reply buffers a client keeps for reuse (the last reply is held, the next one is read)
_REPLY_BUFFERS = 2
#: references to a kept reply buffer that nobody else holds: the list, the loop variable and
#: getrefcount's argument
_FREE_REFS = 3


@dataclass(frozen=True, slots=True, eq=False)
class ReduceReply:
    """The consensus of one round as a rank received it.

    Attributes:
        frame: the decoded consensus RoundFrame; its payloads are read-only views into ``raw``.
        raw: the frame's wire bytes (tag included, length prefix excluded).
        adopted: True when the consensus was written into the caller's arrays.

    Upstream: the reply ``cpu_reduce.rs`` ``CpuReduceClient`` reads after a reduce (the consensus
    RoundFrame).
    """

    frame: RoundFrame
    raw: memoryview
    adopted: bool

    @property
    def weight(self) -> float:
        """The consensus weight: the accepted realized-work mass (0.0: nothing realized)."""
        return self.frame.weight

    def digest(self) -> str:
        """SHA-256 of the consensus frame's wire bytes, 64 lowercase hex digits."""
        return hashlib.sha256(self.raw).hexdigest()

    def arrays(self) -> list[npt.NDArray[np.float32]]:
        """Fresh f32 copies of every tensor (elided payloads give zeros), shaped as on the wire.

        Raises:
            InvalidValue, SchemaMismatch: a payload with an unknown dtype or a byte count that
                does not match its shape.
        """
        out = []
        for p in self.frame.tensors:
            a = p.array(materialize_elided=True)
            out.append(np.array(a, dtype=F32))
        return out


#: ``_new_reply(frame, raw, adopted)``: ``ReduceReply(frame, raw, adopted)`` without the
#: frozen dataclass's ``__init__`` (its fields are set through their slots, as that
#: ``__init__`` sets them with ``object.__setattr__``; nothing is checked there either): the
#: reply of every round
_new_reply: Callable[..., ReduceReply] = slot_builder(ReduceReply)


class RankClient:
    """A rank's data-channel connection to its host relay (or to anything speaking the
    relay's loopback side).

    Build with :meth:`connect`. Each reduce call is a blocking request/reply round; calls must
    not overlap (one client per thread).

    A round whose write or read fails or stops part-way (a connection error, a write stall, a
    read deadline, a reply that ends early or fails its checks, an interrupt) leaves the stream
    out of step, so the client closes itself: every later call raises ``SequenceError``
    (``LocalProtocolError``, ``client.closed``, naming the round that failed) at once and writes
    nothing. A local error found before anything is written (a bad dtype, a frame over the
    ceiling) leaves the client usable.

    Attributes:
        rank: this rank's id (``< world_size``).
        world_size: the cluster's world size.
        version: the data-channel protocol version (2 or 3).
        wire_dtype: the wire dtype of Model rounds (``Dtype.F32`` or ``Dtype.BF16``); Control
            rounds always ride f32.
        ceiling: frame ceiling in bytes for reading replies.
        rounds: completed rounds (messages number rounds from 1: round ``rounds + 1`` is the
            next).
        bytes_sent / bytes_received: loopback bytes, handshake included.
        last_reply: the last :class:`ReduceReply`, or None.
        relay: the address of the relay (``HOST:PORT``) the client is connected to, or None
            when not known (a client built on a socket-like object); a catalogued error in
            upstream's words naming the controller (the relay closed before the reply, a reply
            the RoundFrame reader refuses, ``cluster_controller: frame magic ...`` to its HMAC
            check, a missing or other-version ack) ends with it: ``; this rank's peer at
            127.0.0.1:5559 (expected its relay)``.

    Upstream: ``cpu_reduce.rs`` ``CpuReduceClient``.
    """

    def __init__(self, sock: socket.socket, rank: int, world_size: int, salt: bytes, *,
                 version: int, wire_dtype: Dtype, ceiling: int, relay: str | None = None
                 ) -> None:
        self._sock: socket.socket | None = sock
        self.relay = relay
        self.rank = rank
        self.world_size = world_size
        self._salt = salt
        self.version = version
        self.wire_dtype = wire_dtype
        self.ceiling = ceiling
        self.rounds = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.last_reply: ReduceReply | None = None
        #: per tensor index, the f32 buffer of the last pre-scaled payload (reused after its round)
        self._scratch: dict[int, npt.NDArray[np.float32]] = {}
        self._reply_bufs: list[npt.NDArray[np.uint8]] = []
        self._closed_why: str | None = None
        #: the last small layout's template and length prefix (key: kind, dtype, ceiling, shapes)
        self._template: SmallLayout | None = None
        #: the last frame's and its reply's lengths (bytes): the next reply's expected length
        self._sent_len = self._reply_len = -1
        #: the replies' reader (bytes a peer sent after a reply are kept for the next one)
        self._reader = PrefixedReader(self._salt, None, self._reply_view)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        addr: str | tuple[str, int],
        rank: int,
        world_size: int,
        salt: BytesLike,
        version: int = DEFAULT_VERSION,
        *,
        bf16: bool = False,
        ceiling: int = DEFAULT_FRAME_CEILING,
        on_retry: Callable[[str], None] | None = None,
    ) -> RankClient:
        """Connect to the relay at ``addr``, hand-shake, and return the ready client.

        Args:
            addr: ``"HOST:PORT"`` or ``(host, port)`` of the relay's loopback data port
                (upstream's default: ``127.0.0.1:controller_port + 4``).
            rank: this rank's id.
            world_size: the cluster's world size (the relay checks it equals its own).
            salt: the 16-byte session salt.
            version: data-channel protocol version (2 default, or 3).
            bf16: ship Model rounds as bf16 (``set_bf16_wire``); Control rounds stay f32.
            ceiling: frame ceiling for replies, bytes.
            on_retry: called once with one line when the first connect attempt failed and the
                retries begin (address, error, retry period, budget); see
                :func:`flodl_proto.runner._netio.connect_with_retry`.

        Raises:
            InvalidValue (local): ``world_size == 0`` (``client.world_size_zero``) or
                ``rank >= world_size`` (``client.rank_out_of_range``) or ``rank < 0``
                (``client.rank_negative``), or ``ceiling`` below the smallest RoundFrame
                (``ceiling.below_minimum``), checked before dialing; a bad salt or ``addr``.
            VersionMismatch (local): unsupported ``version``.
            ConnectionError: the relay could not be reached within the retry budget.
            TruncatedInput, BadMagic, VersionMismatch (remote): the ack was missing (the relay
                rejected the handshake and closed), or carried another magic or version.
            TimeoutError: no ack within 10 s.

        Upstream: ``cpu_reduce.rs`` ``CpuReduceClient::connect``.
        """
        key = check_salt(salt)
        check_version(version)
        if world_size <= 0:
            raise protocol_error("client.world_size_zero")
        if rank < 0:
            raise protocol_error("client.rank_negative", rank=rank)
        if rank >= world_size:
            raise protocol_error("client.rank_out_of_range", rank=rank, world_size=world_size)
        ceiling = check_frame_ceiling(ceiling, "rank")
        target = parse_addr(addr, field="addr", dial=True)
        sock = connect_with_retry(target, "cpu_reduce", on_retry=on_retry)
        relay = _peer_of(sock, target)
        try:
            configure_socket(sock, recv=handshake_read_timeout(), send=write_stall_timeout())
            hs = encode_handshake(rank, world_size, version)
            send_all(sock, hs)
            ack = bytearray(HANDSHAKE_ACK_LEN)
            try:
                got = recv_exact_into(sock, memoryview(ack))
            except TimeoutError:
                raise TimeoutError(
                    f"cpu_reduce: no handshake ack within {handshake_read_timeout():g}s"
                ) from None
            decode_ack(memoryview(ack)[:got], version)
            set_timeouts(sock, recv=reduce_read_deadline(), send=write_stall_timeout())
        except BaseException as e:
            sock.close()
            if isinstance(e, ProtocolError):
                _name_the_relay(e, relay)
            raise
        client = cls(sock, rank, world_size, key, version=version,
                     wire_dtype=Dtype.BF16 if bf16 else Dtype.F32, ceiling=ceiling, relay=relay)
        client.bytes_sent += len(hs)
        client.bytes_received += HANDSHAKE_ACK_LEN
        log.debug("rank %d connected to %s (world %d, v%d)", rank, target, world_size, version)
        return client

    # -- context manager ---------------------------------------------------------------------------
    def __enter__(self) -> RankClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the relay then reports RankExit). Idempotent."""
        self._abandon("closed by the caller")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran or a round failed part-way (see the class doc)."""
        return self._sock is None

    @property
    def closed_reason(self) -> str | None:
        """Why the client is closed (``"closed by the caller"``, ``"round N failed: ..."``), or
        None while it is open."""
        return self._closed_why

    def _abandon(self, why: str) -> None:
        sock, self._sock = self._sock, None
        if self._closed_why is None:
            self._closed_why = why
        if sock is not None:
            sock.close()

    def _open_socket(self) -> socket.socket:
        """The socket, or ``client.closed`` (SequenceError, local) once closed."""
        sock = self._sock
        if sock is None:
            raise protocol_error("client.closed", why=self._closed_why or "closed")
        return sock

    # -- the round trip ---------------------------------------------------------------------------
    def _exchange(self, frame: RoundFrame | FrameTemplate, weight: float = 0.0,
                  prefix_out: bytes | None = None) -> tuple[RoundFrame, memoryview]:
        """Send ``frame`` (or the template sealed with ``weight``, after its kept length prefix
        ``prefix_out``) and read the consensus; local errors are raised before any write."""
        sock = self._open_socket()
        if isinstance(frame, FrameTemplate):
            assert prefix_out is not None  # _template_for encoded it for the client's ceiling
            batches: Iterable[list[BytesLike]] = [[prefix_out, frame.seal(weight, self._salt)]]
        else:  # local errors: nothing written, the client stays
            prefix_out = encode_len_prefix(frame.wire_len, ceiling=self.ceiling)
            batches = signed_frame_batches(prefix_out, round_frame_pieces(frame), self._salt,
                                           hash_step(frame.wire_len))
        rnd = self.rounds + 1  # rounds are numbered from 1 in every role's messages
        try:
            return self._round_trip(sock, batches, frame.wire_len)
        except BaseException as e:  # the stream is out of step: close (see the class doc)
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            self._abandon(f"round {rnd} failed: {text}")
            raise

    def _round_trip(self, sock: socket.socket, batches: Iterable[list[BytesLike]], sent: int
                    ) -> tuple[RoundFrame, memoryview]:
        """Write the record, then read the reply; ``sent``: the frame's length (bytes)."""
        stages.mark("rank", self.rounds, "send_start")
        try:
            self.bytes_sent += _send_batches(sock, batches)
        except TimeoutError as e:
            raise TimeoutError(f"cpu_reduce: the relay stopped reading while round "
                               f"{self.rounds + 1} was being sent ({os_reason(e)})") from None
        except OSError as e:
            raise ConnectionError(f"cpu_reduce: lost the relay while sending round "
                                  f"{self.rounds + 1}: it closed the connection "
                                  f"({_os_reason(e)})") from e
        stages.mark("rank", self.rounds, "send_done")
        try:
            return self._read_reply(sock, sent)
        except ProtocolError as e:
            _name_the_relay(e, self.relay)
            raise

    def _read_reply(self, sock: socket.socket, sent: int) -> tuple[RoundFrame, memoryview]:
        """Read and decode the reply to a frame of ``sent`` bytes.

        The reply is expected to be as long as the last one when this frame is as long as the
        last frame, else as long as this frame (a consensus has its contributions' layout); the
        loopback streams' reader (:class:`~flodl_proto.runner._prefixed.PrefixedReader`) reads
        it: one ``recv`` for a small reply of the expected length, bytes a peer sent after a
        reply kept for the next one, a larger reply's prefix, then its body hashed in steps.

        A reply that came whole with its prefix, of a layout the frame reader remembers, is
        read by :func:`~flodl_proto.codec.round_frame.read_known_frame` (every check of the
        decode, without the parse) when it fills its prefix; any other reply, and one that
        fails a check there, goes through
        :func:`~flodl_proto.codec.loopback.decode_framed_round_or_eos`, which gives the same
        frame or the error (the shortcut must agree with it: tests/test_rank_fast_path.py).
        """
        expect = self._reply_len if sent == self._sent_len else sent
        reader = self._reader
        try:
            head = reader.head(sock, expect, self.ceiling)
        except TimeoutError:
            raise TimeoutError(
                f"cpu_reduce: no averaged frame within {reduce_read_deadline():g}s "
                f"(round {self.rounds + 1})"
            ) from None
        except OSError as e:
            raise ConnectionError(f"cpu_reduce: lost the relay while waiting for round "
                                  f"{self.rounds + 1}'s consensus ({_os_reason(e)})") from e
        if head is None:
            raise protocol_error("client.reply_closed", round=self.rounds + 1)
        blob, n, got = head
        self._sent_len, self._reply_len = sent, n
        size = LEN_PREFIX_LEN + n
        view = blob[:size]
        raw = view[LEN_PREFIX_LEN:]
        premac = None
        if got == size:  # the whole reply came with its prefix (a small reply: one recv)
            self.bytes_received += size
            # read_known_frame hashes the frame here, as the reader's body() would have; a
            # frame it does not vouch for, or one shorter than its prefix, goes through the
            # decode below, which hashes it again (only a failing reply: a reply of a layout
            # not remembered yet is not hashed here)
            known = read_known_frame(raw, self._salt, self.ceiling, None)
            if known is not None and known[2] == n:
                self.rounds += 1
                return known_round_frame(known[0], known[1], raw), raw
        else:
            try:
                _, body, premac = reader.body(sock, head)
            except TimeoutError:
                raise TimeoutError(
                    f"cpu_reduce: averaged frame stalled after prefix (round {self.rounds + 1})"
                ) from None
            except OSError as e:
                raise ConnectionError(f"cpu_reduce: lost the relay while reading round "
                                      f"{self.rounds + 1}'s consensus ({_os_reason(e)})") from e
            self.bytes_received += LEN_PREFIX_LEN + body
            if body < n:
                raise protocol_error("framed_round.body_ended", length=n, got=body)
        res = decode_framed_round_or_eos(view, self._salt, ceiling=self.ceiling, premac=premac)
        assert res is not END_OF_STREAM
        self.rounds += 1
        return res[0], raw

    def all_reduce(self, frame: RoundFrame) -> RoundFrame:
        """Send ``frame`` as this rank's contribution and return the consensus frame.

        Args:
            frame: the contribution, already pre-scaled (Model) or raw (Control).

        Returns:
            The consensus RoundFrame (payloads are views into a reply buffer no earlier
            reply still held by anyone uses);
            :attr:`last_reply` holds its wire bytes too.

        Raises:
            TruncatedInput (remote): the relay closed before the reply
                (``client.reply_closed``), or the reply ended inside / did not fill its prefix.
            LimitExceeded (remote): the reply's prefix exceeds the frame ceiling.
            AuthenticationError, BadMagic, InvalidValue (remote): frame reader errors.
            TimeoutError: the relay stopped reading the frame (write-stall deadline) or sent no
                reply within the read deadline.
            ConnectionError: the relay closed the connection (the message says so and names
                the round).
            SequenceError (local, ``client.closed``): the client is closed (by :meth:`close`,
                or because an earlier round failed part-way); nothing is written.
            After any of the errors above but the last, the client is closed.

        Upstream: ``cpu_reduce.rs`` ``all_reduce``.
        """
        reply, raw = self._exchange(frame)
        stages.mark("rank", self.rounds - 1, "reply_parsed")
        self.last_reply = ReduceReply(reply, raw, False)
        return reply

    def all_reduce_scaled(
        self,
        arrays: Sequence[npt.NDArray[Any]],
        scale: float,
        kind: RoundKind | int = RoundKind.MODEL,
        weight: float | None = None,
        wire_dtype: Dtype | int | None = None,
        *,
        adopt: bool = True,
    ) -> ReduceReply:
        """Pre-scale ``arrays`` by ``scale``, reduce, and (optionally) adopt the consensus.

        Args:
            arrays: f32 or ``ml_dtypes.bfloat16`` arrays, any shapes (each dim < 2**32).
            scale: the realized-work mass multiplied into every element in f32 before one
                rounding into the wire dtype. ``0.0`` marks an idle rank: elided payloads at
                protocol version 3, ``0.0 x T`` (so ``-0.0`` and NaN where T is negative or
                not finite) at version 2.
            kind: ``RoundKind.MODEL`` (default) or ``RoundKind.CONTROL``.
            weight: the frame's weight (f64 realized-work mass, finite, >= 0); default ``scale``.
            wire_dtype: Model rounds' wire dtype (default: the client's); Control rounds are
                always f32.
            adopt: write the consensus into ``arrays`` (in place) when the round realized work
                (reply weight > 0) or is a Control round; a zero-mass Model reply leaves them
                untouched.

        Returns:
            A :class:`ReduceReply` (``adopted`` says whether ``arrays`` were overwritten).

        Raises:
            InvalidValue (local): an array of another dtype (``client.bad_dtype``); with
                ``adopt``, a read-only array or something else than an array
                (``client.not_writable``); a ``kind``, ``wire_dtype``, ``scale`` or ``weight``
                that is not one (``client.bad_argument``); a weight that is not finite or is
                negative (``frame.bad_field``). Nothing is sent, the client stays usable.
            SchemaMismatch (local): the consensus does not fit ``arrays`` (count or shape).
            Everything :meth:`all_reduce` raises.

        Upstream: ``cpu_reduce.rs`` ``all_reduce_scaled`` (+ decode-into-request).
        """
        kept = self._template
        if (kept is not None and type(scale) is float and weight is None and wire_dtype is None
                and (scale != 0.0 or self.version < 3)
                and self._fits(kept.key, arrays, kind, adopt)):
            # the arguments are those of the last small round (see _fits): every check below
            # passes and the template branch is taken with these very values
            quiet = quiet_enter()  # np.errstate(all="ignore") without its object
            try:
                fill_small(kept, arrays, np.float32(scale))
            finally:
                quiet_exit(quiet)
            reply, raw = self._exchange(kept.template, scale, kept.prefix)
            arrs: Sequence[npt.NDArray[Any]] = arrays
        else:
            reply, raw, arrs = self._scaled_round(arrays, scale, kind, weight, wire_dtype, adopt)
        adopted = False
        if adopt and (reply.kind is RoundKind.CONTROL or reply.weight > 0.0):
            decode_into(reply, arrs)
            adopted = True
        stages.mark("rank", self.rounds - 1, "reply_parsed")
        self.last_reply = got = _new_reply(reply, raw, adopted)
        return got

    def _fits(self, key: tuple[Any, ...], arrays: Sequence[npt.NDArray[Any]],
              kind: RoundKind | int, adopt: bool) -> bool:
        """Whether a round of ``arrays``, ``kind`` and ``adopt`` (and a float scale, the default
        weight and wire dtype) takes the template branch of :meth:`_scaled_round` with the kept
        layout ``key`` without any check there failing: the client is open, ``kind`` is the
        layout's :class:`RoundKind`, the client's wire dtype and ceiling are the layout's, and
        ``arrays`` is a list or tuple of NumPy arrays (not a subclass) of the layout's shapes,
        f32 or bf16, writable when ``adopt``. Then :func:`check_array` would give each array
        back as it is, and nothing else of that method depends on the arguments. Any other
        round (False) goes through :meth:`_scaled_round`, which raises what it raises."""
        if (self._sock is None or kind is not key[0] or self.ceiling != key[2]
                or (kind is RoundKind.MODEL and self.wire_dtype is not key[1])
                or (type(arrays) is not list and type(arrays) is not tuple)
                or len(arrays) != len(key) - 3):
            return False
        for a, shape in zip(arrays, key[3:], strict=True):
            if (type(a) is not np.ndarray or (a.dtype is not F32 and not is_bf16(a.dtype))
                    or a.shape != shape or (adopt and not a.flags.writeable)):
                return False
        return True

    def _scaled_round(self, arrays: Sequence[npt.NDArray[Any]], scale: float,
                      kind: RoundKind | int, weight: float | None, wire_dtype: Dtype | int | None,
                      adopt: bool) -> tuple[RoundFrame, memoryview, list[npt.NDArray[Any]]]:
        """The round of :meth:`all_reduce_scaled` with every argument checked: the consensus,
        its wire bytes and the checked arrays."""
        self._open_socket()
        try:
            kind_e = kind if isinstance(kind, RoundKind) else RoundKind(kind)
        except ValueError:
            raise protocol_error("client.bad_argument", field="kind", value=kind,
                                 reason="not 0 (Model) or 1 (Control)") from None
        arrs = [check_array(i, a, adopt) for i, a in enumerate(arrays)]
        if kind_e is RoundKind.CONTROL:
            wire = Dtype.F32
        else:
            want = self.wire_dtype if wire_dtype is None else wire_dtype
            try:
                wire = want if isinstance(want, Dtype) else Dtype(want)
            except ValueError:
                raise protocol_error("client.bad_argument", field="wire_dtype", value=want,
                                     reason="not 0 (f32) or 1 (bf16)") from None
        scale = real_argument("scale", scale)
        w = scale if weight is None else real_argument("weight", weight)
        if scale == 0.0 and self.version >= 3:
            tensors = [TensorPayload.elide(int(wire), a.shape) for a in arrs]
            reply, raw = self._exchange(RoundFrame(kind_e, w, tensors))
        elif (kept := self._template_for(kind_e, wire, arrs)) is not None:
            quiet = quiet_enter()  # np.errstate(all="ignore") without its object
            try:
                fill_small(kept, arrs, np.float32(scale))
            finally:
                quiet_exit(quiet)
            reply, raw = self._exchange(kept.template, w, kept.prefix)
        else:
            f = float(scale)
            with np.errstate(all="ignore"):
                tensors = [scaled_payload(a, wire, f, self._scratch_for(i, a))
                           for i, a in enumerate(arrs)]
            reply, raw = self._exchange(RoundFrame(kind_e, w, tensors))
        return reply, raw, arrs

    def _template_for(self, kind: RoundKind, wire: Dtype, arrs: list[npt.NDArray[Any]]
                      ) -> SmallLayout | None:
        """The :class:`SmallLayout` kept for this round's layout and the client's ceiling
        (built when either changed), or None when the payloads total more than
        :data:`TEMPLATE_MAX_PAYLOAD` bytes. Raises ``len.write_too_large`` (LimitExceeded,
        local) for a frame over the ceiling, as :meth:`_exchange` does; nothing is kept."""
        key = (kind, wire, self.ceiling, *[a.shape for a in arrs])
        kept = self._template
        if kept is not None and kept.key == key:
            return kept
        size = wire.element_size
        if sum(a.size for a in arrs) * size > TEMPLATE_MAX_PAYLOAD:
            return None
        tpl = FrameTemplate(kind, [(int(wire), a.shape) for a in arrs])
        kept = SmallLayout(key, tpl, encode_len_prefix(tpl.wire_len, ceiling=self.ceiling),
                           Bf16Scaler(tpl.bits) if wire is Dtype.BF16 else None)
        self._template = kept
        return kept

    def _reply_view(self, size: int, _step: int) -> memoryview:
        """The reader's buffer callback: a view of :meth:`_reply_buffer` ``(size)``."""
        return self._reply_buffer(size).data

    def _reply_buffer(self, size: int) -> npt.NDArray[np.uint8]:
        """A ``size``-byte buffer for the next reply: an earlier reply's when nothing references
        it any more (its :class:`ReduceReply`, frame and payload views all dropped; the one in
        :attr:`last_reply` is still referenced), else a fresh one. At most
        :data:`_REPLY_BUFFERS` are kept; reusing spares a fresh multi-MiB buffer's page faults
        while the reply arrives."""
        for buf in self._reply_bufs:
            if buf.shape[0] == size and sys.getrefcount(buf) <= _FREE_REFS:
                return buf
        fresh = np.empty(size, dtype=np.uint8)
        if len(self._reply_bufs) < _REPLY_BUFFERS:
            self._reply_bufs.append(fresh)
        else:  # replace a buffer nobody holds (another size), if any
            for i, buf in enumerate(self._reply_bufs):
                if sys.getrefcount(buf) <= _FREE_REFS:
                    self._reply_bufs[i] = fresh
                    break
        return fresh

    def _scratch_for(self, index: int, arr: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        buf = self._scratch.get(index)
        if buf is None or buf.shape[0] != arr.size:
            buf = np.empty(arr.size, dtype=F32)
            self._scratch[index] = buf
        return buf

    def all_reduce_mean(self, arrays: Sequence[npt.NDArray[Any]]) -> ReduceReply:
        """Plain mean over the cohort: Model round, scale 1.0, weight 1.0; the mean is written
        into ``arrays``. Upstream: ``cpu_reduce.rs`` ``all_reduce_tensors``."""
        return self.all_reduce_scaled(arrays, 1.0, RoundKind.MODEL, 1.0)

    def broadcast_from_root(self, arrays: Sequence[npt.NDArray[Any]],
                            root: int = 0) -> ReduceReply:
        """Every rank ends with ``root``'s values in ``arrays``.

        The root sends its tensors unscaled; the others send an elided frame (version 3) or
        real zeros (``0.0 x T``, version 2); kind Control, weight 0.0, always f32. The Control
        sum is the root's values (``-0.0`` becomes ``+0.0``), written into ``arrays``.

        Raises:
            InvalidValue (local): ``root`` not an integer (``client.bad_argument``) or outside
                the world; as :meth:`all_reduce_scaled` with ``adopt`` (every rank adopts).

        Upstream: ``cpu_reduce.rs`` ``broadcast_from_root``.
        """
        self._open_socket()
        try:
            root = operator.index(root)
        except TypeError:
            raise protocol_error("client.bad_argument", field="root", value=root,
                                 reason="not an integer rank") from None
        if root < 0:
            raise protocol_error("client.rank_negative", rank=root)
        if root >= self.world_size:
            raise protocol_error("client.rank_out_of_range", rank=root,
                                 world_size=self.world_size)
        arrs = [check_array(i, a, True) for i, a in enumerate(arrays)]
        if self.rank == root:
            tensors = [scaled_payload(a, Dtype.F32, None) for a in arrs]
            reply, raw = self._exchange(RoundFrame(RoundKind.CONTROL, 0.0, tensors))
            decode_into(reply, arrs)
            self.last_reply = ReduceReply(reply, raw, True)
            return self.last_reply
        return self.all_reduce_scaled(arrs, 0.0, RoundKind.CONTROL, 0.0)

    def gather_counts(self, value: float) -> npt.NDArray[np.float64]:
        """Control count-gather: every rank contributes ``value`` at its own slot.

        Sends one f32 tensor of shape ``[world_size]`` holding ``float32(value)`` at index
        ``rank`` and zeros elsewhere (kind Control, weight 0.0, f32). Returns the element-wise
        sum (slots of ranks that contributed nothing stay 0) as float64.

        Raises:
            InvalidValue (local): ``value`` is not a real number (``client.bad_argument``);
                beyond the f32 range it becomes an infinity.
            LimitExceeded (local, ``len.write_too_large``): the tensor's ``4 x world_size`` bytes
                alone exceed the frame ceiling (checked before the tensor is allocated, so a
                world of up to ``2**32 - 1`` ranks costs nothing here; nothing is sent and the
                client stays usable).

        Upstream: ``cpu_reduce.rs`` ``all_reduce_per_rank_f64``.
        """
        self._open_socket()
        v = real_argument("value", value)
        nbytes = 4 * self.world_size
        if nbytes > self.ceiling:
            raise protocol_error("len.write_too_large", length=nbytes, ceiling=self.ceiling)
        slots = np.zeros(self.world_size, dtype=F32)
        with np.errstate(over="ignore"):  # beyond the f32 range: an infinity, as upstream's cast
            slots[self.rank] = np.float32(v)
        tensors = [TensorPayload(int(Dtype.F32), slots.shape, slots.view(np.uint8).data)]
        reply, raw = self._exchange(RoundFrame(RoundKind.CONTROL, 0.0, tensors))
        self.last_reply = ReduceReply(reply, raw, False)
        if len(reply.tensors) != 1:
            raise protocol_error("client.reply_schema", index=0, reason=(
                f"count gather expects 1 tensor, the consensus carries {len(reply.tensors)}"))
        out = reply.tensors[0].array(materialize_elided=True)
        return np.asarray(out, dtype=np.float64).reshape(-1)


def _os_reason(e: OSError) -> str:
    """A socket error in words ("broken pipe", "connection reset by peer"), without the
    errno prefix."""
    return os_reason(e).lower()


def _send_batches(sock: socket.socket, batches: Iterable[list[BytesLike]]) -> int:
    """Write a record given as batches of buffers: a template's one batch, or
    :func:`~flodl_proto.codec.plans.signed_frame_batches` of a frame's pieces, which hashes each
    step (:func:`~flodl_proto.runner._netio_recv.hash_step` bytes) just before it is written,
    so the reader verifies step ``k`` while this side hashes step ``k + 1``.

    Returns:
        Bytes written. Raises: as :func:`send_all` (the write-stall deadline covers the whole
        record, every step of it).
    """
    if type(batches) is list and len(batches) == 1:  # a template's record: send_all's deadline
        return send_all(sock, batches[0])
    started = time.monotonic()
    deadline: float | None = None  # one batch (a frame of one step): send_all's own
    total = 0
    for i, batch in enumerate(batches):
        if i == 1:
            deadline = started + write_stall_timeout()
        total += send_all(sock, batch, deadline=deadline)
    return total

"""Length-prefixed RoundFrames read from one loopback stream with the fewest ``recv`` calls: the
one reader of the relay's rank streams (:class:`~flodl_proto.runner.relay_ranks.RankBlobReader`)
and of the rank's replies (:class:`~flodl_proto.runner.rank.RankClient`).

A peer sends one frame at a time, most often as long as the one before it. When the expected
blob (4-byte prefix and frame) is below :data:`~flodl_proto.codec.auth.PARALLEL_MAC_MIN` bytes,
one ``recv`` asks for the whole of it and returns as soon as the prefix is in: a blob that has
arrived costs one call, and its frame's MAC is one update over the buffer. A blob of another
length is moved into a buffer of its own and read on from there; bytes that came after it (a
peer that sent more than one blob) are kept as the start of the next blob and read before the
socket, as they would have been from it. A large blob (or one of unknown length) reads its
prefix, then its frame, hashed as it arrives.

Upstream: ``flodl/src/distributed/relay/agent.rs`` and ``cpu_reduce.rs`` (``read_len_prefixed``:
the prefix, then exactly the frame).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Final, TypeAlias

from ..codec._common import END_OF_STREAM
from ..codec.auth import PARALLEL_MAC_MIN, Premac
from ..codec.loopback import decode_len_prefix_or_eos, whole_len_prefix
from ..codec.plans import frame_macs, frame_premac_for
from ..spec import LEN_PREFIX_LEN
from ._netio_recv import read_frame_into, read_record_into, recv_exact_into

__all__ = ["AFTER_PREFIX", "MOVING", "ONE_READ", "Head", "PrefixedReader"]

#: ``buffer``'s ``step``: the buffer of a one-read blob at its expected length
ONE_READ: Final = 0
#: ``buffer``'s ``step``: the blob's own buffer after a one-read that did not fit it (the
#: one-read buffer still holds bytes to move: it must not be the one handed out)
MOVING: Final = 1
#: ``buffer``'s ``step``: the blob's own buffer after its prefix was read alone
AFTER_PREFIX: Final = 2


#: a blob whose prefix is whole: ``(blob, n, got)``: ``blob`` a view of at least
#: ``LEN_PREFIX_LEN + n`` bytes (the prefix first), ``n`` the frame's length from the prefix
#: (bytes), ``got`` the blob's bytes in ``blob`` so far (prefix included, at most
#: ``LEN_PREFIX_LEN + n``)
Head: TypeAlias = tuple[memoryview, int, int]


class PrefixedReader:
    """Reads one stream's length-prefixed frames (see the module doc) in two calls a blob:
    :meth:`head` (until the prefix is whole) and :meth:`body` (the rest of the frame), so that
    a caller can tell a stream that ended or stalled before a blob from one that did inside it.

    Args:
        salt: the session salt (MAC key, 16 bytes).
        stop: polled by the reads (None: the socket's timeout ends a wait).
        buffer: ``buffer(size, step)``, a view of at least ``size`` bytes (a blob, prefix
            first) for the reader to fill; ``step`` is :data:`ONE_READ`, :data:`MOVING` or
            :data:`AFTER_PREFIX`.

    Attributes:
        received: bytes read from the socket so far (a blob's bytes that came with the one
            before it were counted then).

    Upstream: ``relay/agent.rs`` / ``cpu_reduce.rs`` (``read_len_prefixed``).
    """

    __slots__ = ("_buffer", "_carry", "_prefix", "_premac", "_salt", "_stop", "received")

    def __init__(self, salt: bytes, stop: threading.Event | None,
                 buffer: Callable[[int, int], memoryview]) -> None:
        self._salt, self._stop, self._buffer = salt, stop, buffer
        self._premac = frame_premac_for(salt)  # a whole small frame's MAC, keyed once
        self._prefix = memoryview(bytearray(LEN_PREFIX_LEN))
        self._carry = b""  # bytes of the next blob(s) read with the last one
        self.received = 0

    def head(self, sock: socket.socket, expect: int, ceiling: int,
             starvation: float | None = None) -> Head | None:
        """Read until the next blob's prefix is whole; None when the stream ended before.

        Args:
            expect: the frame's expected length (bytes; -1: unknown).
            ceiling: the frame ceiling (bytes): a larger prefix is an error.
            starvation: the committed-read bound (seconds), as :func:`~flodl_proto.runner.
                _netio_recv.recv_exact_into`.

        Raises:
            LimitExceeded (remote): the prefix exceeds ``ceiling``.
            everything :func:`~flodl_proto.runner._netio_recv.recv_exact_into` raises.
        """
        carry = self._carry
        one = 0 <= expect and LEN_PREFIX_LEN + expect < PARALLEL_MAC_MIN
        first = self._buffer(LEN_PREFIX_LEN + expect, ONE_READ) if one else self._prefix
        got = 0
        if carry:
            got = min(len(carry), len(first))
            first[:got] = carry[:got]
            self._carry = carry[got:]
        # (kept bytes that hold the prefix already ask for nothing here)
        r = recv_exact_into(sock, first[got:], stop=self._stop, starvation=starvation,
                            least=LEN_PREFIX_LEN - got)
        self.received += r
        got += r
        if got < LEN_PREFIX_LEN:
            return None
        if ceiling.__class__ is int and ceiling >= 0:  # a valid ceiling: the prefix alone
            n = whole_len_prefix(first, ceiling)
        else:  # the codec names the bad ceiling
            res = decode_len_prefix_or_eos(first, ceiling=ceiling)
            assert res is not END_OF_STREAM  # the prefix is whole
            n = res
        size = LEN_PREFIX_LEN + n
        if one and n == expect:
            return first, n, got
        blob = self._buffer(size, MOVING if one else AFTER_PREFIX)
        have = min(got, size)
        blob[:have] = first[:have]
        if got > size:  # the start of a next blob: read when that blob is
            self._carry = bytes(first[size:got]) + self._carry
        got = have
        carry = self._carry
        if carry and got < size:  # more of it was read early than ``first`` held
            take = min(len(carry), size - got)
            blob[got:got + take] = carry[:take]
            self._carry = carry[take:]
            got += take
        return blob, n, got

    def body(self, sock: socket.socket, head: Head,
             starvation: float | None = None) -> tuple[memoryview, int, Premac | None]:
        """Read the rest of ``head``'s frame: ``(frame, body, premac)``.

        ``frame`` is a view of the frame's ``n`` bytes, ``body`` the bytes of it that arrived
        (``body < n``: the stream ended inside it), ``premac`` the MAC of its bytes before the
        last 8, computed as they arrived: valid only when every byte arrived (``body == n``;
        otherwise it may be None or cover only what arrived, and the caller reports the
        truncation instead of using it).

        Raises:
            everything :func:`~flodl_proto.runner._netio_recv.recv_exact_into` raises.
        """
        blob, n, got = head
        size = LEN_PREFIX_LEN + n
        frame = blob[LEN_PREFIX_LEN:size]
        if got == size:
            return frame, n, self._premac(frame)
        if got == LEN_PREFIX_LEN:
            body, premac = read_frame_into(sock, frame, self._salt, stop=self._stop,
                                           starvation=starvation)
            self.received += body
            return frame, body, premac
        # part of the frame is in (it came with the prefix): hashed on from there
        plan = frame_macs(n, self._salt)
        ranges = plan.ranges(LEN_PREFIX_LEN)
        for mac, lo, hi in ranges:
            mac.update(blob[lo:min(got, hi)])
        _, end = read_record_into(sock, blob[:size], size, ranges, start=got, stop=self._stop,
                                  starvation=starvation)
        self.received += end - got
        return frame, end - LEN_PREFIX_LEN, plan.premac() if end == size else None

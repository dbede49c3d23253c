"""The relay's read side of one local rank's loopback stream: length-prefixed RoundFrames.

A rank sends one frame a round, of the same length every round while its layout holds, and
waits for the consensus before the next. :class:`RankBlobReader` reads a small frame (prefix
and frame below :data:`~flodl_proto.codec.auth.PARALLEL_MAC_MIN` bytes) with one ``recv`` asking
for the prefix and the frame at the last frame's length, into a buffer that already holds the
prefix before the frame; the frame's MAC is then one update over the buffer. A frame of another
length is moved into a buffer of its own and read on from there; bytes that came after it (a
peer that sent its next blob early) are kept as the start of the next blob, read as they would
have been from the socket. A large frame (or the first one) reads the prefix, then the frame,
hashed as it arrives (:func:`~flodl_proto.runner._netio.read_frame_into`).

Buffers are reused across rounds: a frame's buffer goes to the fold, which holds at most one
frame of a rank (its deposit in the current round, until the round completes). A small frame
is read before the reader knows whether that round has completed, so the reader keeps two
buffers and reads into the one the fold does not hold; a large frame's buffer is chosen after
its prefix (by then the fold has let go of the last one unless the rank sent early), and is a
fresh one when the fold still holds the last one (one large buffer kept per rank).

Upstream: ``flodl/src/distributed/relay/agent.rs`` (the rank reader: ``read_len_prefixed``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from ..codec._common import END_OF_STREAM
from ..codec.auth import PARALLEL_MAC_MIN, Premac
from ..codec.loopback import decode_len_prefix_or_eos
from ..codec.plans import frame_macs, frame_premac
from ..spec import LEN_PREFIX_LEN
from ._netio import read_frame_into, read_record_into, recv_exact_into

__all__ = ["FRAME_OFFSET", "RankBlobReader"]

#: where a frame starts in its buffer (bytes; the prefix is the 4 bytes before it): the frame
#: keeps the alignment of the buffer's start (numpy's allocation), as its tensor payloads do
FRAME_OFFSET: Final = 16


class RankBlobReader:
    """Reads one rank's loopback blobs (see the module doc).

    Args:
        salt: the session salt (MAC key, 16 bytes).
        ceiling: the frame ceiling (bytes): a larger prefix is an error.
        stop: the relay's stop flag (reads poll it).
        held: tells whether the fold holds the rank's last frame (its deposit in the current
            round): that frame's buffer is not read into.

    Attributes:
        received: bytes read from the socket so far (counted as they arrive; a blob's bytes
            that came with the one before it were counted then).

    Upstream: ``flodl/src/distributed/relay/agent.rs`` (``read_len_prefixed``, one blob a
    call, prefix then frame).
    """

    __slots__ = ("_bufs", "_carry", "_ceiling", "_expect", "_held", "_last", "_prefix",
                 "_salt", "_stop", "received")

    def __init__(self, salt: bytes, ceiling: int, stop: threading.Event,
                 held: Callable[[], bool]) -> None:
        self._salt, self._ceiling, self._stop, self._held = salt, ceiling, stop, held
        self._prefix = memoryview(bytearray(LEN_PREFIX_LEN))
        self._bufs: list[npt.NDArray[np.uint8] | None] = [None, None]
        self._last = 0  # the buffer of the last frame
        self._expect = -1  # the last frame's length (-1: none yet)
        self._carry = b""  # bytes of the next blob read with the last one
        self.received = 0

    def read(self, sock: socket.socket,
             starvation: float | None) -> tuple[memoryview, int, Premac | None] | None:
        """Read one blob: ``(frame, got, premac)``, or None when the stream ended before its
        prefix was whole.

        ``frame`` is a view of the frame's ``n`` bytes (``n`` from the prefix), ``got`` the
        bytes of it that arrived (``got < n``: the stream ended inside it), ``premac`` the MAC
        of its bytes before the last 8 (None unless every byte arrived and ``n > 8``; the
        decoder then reports the truncation). ``starvation``: the committed-read bound, as
        :func:`~flodl_proto.runner._netio.recv_exact_into`.

        Raises:
            LimitExceeded (remote): the prefix exceeds the ceiling.
            everything :func:`~flodl_proto.runner._netio.recv_exact_into` raises.
        """
        carry, expect = self._carry, self._expect
        # (bytes read early come only from a one-read blob, shorter than the one before it)
        one = 0 <= expect and LEN_PREFIX_LEN + expect < PARALLEL_MAC_MIN
        first = self._buffer(expect, spare=True) if one else self._prefix
        got = 0
        if carry:
            got = min(len(carry), len(first))
            first[:got] = carry[:got]
            self._carry = carry[got:]
        # (a carry that holds the prefix already asks for nothing here)
        r = recv_exact_into(sock, first[got:], stop=self._stop, starvation=starvation,
                            least=LEN_PREFIX_LEN - got)
        self.received += r
        got += r
        if got < LEN_PREFIX_LEN:
            return None
        n = decode_len_prefix_or_eos(first, ceiling=self._ceiling)
        assert n is not END_OF_STREAM  # the prefix is whole
        self._expect = n
        size = LEN_PREFIX_LEN + n
        if one and n == expect:
            whole = first
        else:  # the blob's own buffer, with what arrived of it
            if one:  # (in place of the buffer just read into: the fold does not hold it)
                buf = np.empty(FRAME_OFFSET + n, dtype=np.uint8)
                self._bufs[self._last] = buf
                whole = buf.data[FRAME_OFFSET - LEN_PREFIX_LEN:]
            else:
                whole = self._buffer(n, spare=False)
            have = min(got, size)
            whole[:have] = first[:have]
            if got > size:  # the start of a next blob: read when that blob is
                self._carry = bytes(first[size:got]) + self._carry
            got = have
            carry = self._carry
            if carry and got < size:  # more of it was read early than ``first`` held
                take = min(len(carry), size - got)
                whole[got:got + take] = carry[:take]
                self._carry = carry[take:]
                got += take
        frame = whole[LEN_PREFIX_LEN:size]
        if got == size:
            return frame, n, frame_premac(frame, self._salt)
        if got == LEN_PREFIX_LEN:
            body, premac = read_frame_into(sock, frame, self._salt, stop=self._stop,
                                           starvation=starvation)
            self.received += body
            return frame, body, premac
        # part of the frame is in (it came with the prefix): hashed on from there
        plan = frame_macs(n, self._salt)
        ranges = plan.ranges(LEN_PREFIX_LEN)
        for mac, lo, hi in ranges:
            mac.update(whole[lo:min(got, hi)])
        _, end = read_record_into(sock, whole[:size], size, ranges, start=got, stop=self._stop,
                                  starvation=starvation)
        self.received += end - got
        return frame, end - LEN_PREFIX_LEN, plan.premac() if end == size else None

    def _buffer(self, n: int, *, spare: bool) -> memoryview:
        """A view of a buffer for a blob of an ``n``-byte frame (prefix and frame, the frame at
        :data:`FRAME_OFFSET`): the last frame's buffer unless the fold holds it; then the other
        one (``spare``) or a fresh one (reusing spares the page faults of a fresh allocation)."""
        i = self._last
        if self._held():
            if spare:
                i ^= 1
            else:
                self._bufs[i] = None
        buf = self._bufs[i]
        if buf is None or buf.shape[0] != FRAME_OFFSET + n:
            buf = np.empty(FRAME_OFFSET + n, dtype=np.uint8)
            self._bufs[i] = buf
        self._last = i
        return buf.data[FRAME_OFFSET - LEN_PREFIX_LEN:]

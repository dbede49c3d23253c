"""The relay's read side of one local rank's loopback stream: length-prefixed RoundFrames.

A rank sends one frame a round, of the same length every round while its layout holds, and
waits for the consensus before the next. :class:`RankBlobReader` reads its blobs with the
loopback streams' one reader (:class:`~flodl_proto.runner._prefixed.PrefixedReader`: a small
frame of the last frame's length in one ``recv``, into a buffer that holds the prefix before the
frame; bytes a peer sent early kept for the next blob; a large frame hashed as it arrives).

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

from ..codec.auth import Premac
from ..spec import LEN_PREFIX_LEN
from ._prefixed import MOVING, ONE_READ, PrefixedReader

__all__ = ["FRAME_OFFSET", "RankBlobReader"]

#: where a frame starts in its buffer (bytes; the prefix is the 4 bytes before it): the frame
#: keeps the alignment of the buffer's start (numpy's allocation), as its tensor payloads do
FRAME_OFFSET: Final = 16


class RankBlobReader(PrefixedReader):
    """Reads one rank's loopback blobs (see the module doc): the loopback streams'
    :class:`~flodl_proto.runner._prefixed.PrefixedReader` with the relay's buffer policy
    (:meth:`_pick_buffer`) and the expected length of each blob (the last one's).

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

    __slots__ = ("_bufs", "_ceiling", "_expect", "_held", "_last")

    def __init__(self, salt: bytes, ceiling: int, stop: threading.Event,
                 held: Callable[[], bool]) -> None:
        self._ceiling, self._held = ceiling, held
        self._bufs: list[npt.NDArray[np.uint8] | None] = [None, None]
        self._last = 0  # the buffer of the last frame
        self._expect = -1  # the last frame's length (-1: none yet)
        super().__init__(salt, stop, self._pick_buffer)

    def read(self, sock: socket.socket,
             starvation: float | None) -> tuple[memoryview, int, Premac | None] | None:
        """Read one blob: ``(frame, got, premac)``, or None when the stream ended before its
        prefix was whole.

        ``frame`` is a view of the frame's ``n`` bytes (``n`` from the prefix), ``got`` the
        bytes of it that arrived (``got < n``: the stream ended inside it), ``premac`` the MAC
        of its bytes before the last 8 (None unless every byte arrived and ``n > 8``; the
        decoder then reports the truncation). ``starvation``: the committed-read bound, as
        :func:`~flodl_proto.runner._netio_recv.recv_exact_into`.

        Raises:
            LimitExceeded (remote): the prefix exceeds the ceiling.
            everything :func:`~flodl_proto.runner._netio_recv.recv_exact_into` raises.
        """
        head = self.head(sock, self._expect, self._ceiling, starvation)
        if head is None:
            return None
        self._expect = head[1]
        return self.body(sock, head, starvation)

    def _pick_buffer(self, size: int, step: int) -> memoryview:
        """The :class:`~flodl_proto.runner._prefixed.PrefixedReader`'s buffer for a blob of
        ``size`` bytes (a view from the prefix; the frame at :data:`FRAME_OFFSET` of its array):
        after a one-read that did not fit (``MOVING``), a fresh array in place of the one just
        read into; else the last frame's array unless the fold holds it, then the other one
        (a one-read, ``ONE_READ``) or a fresh one (reusing spares the page faults of a fresh
        allocation)."""
        i = self._last
        if step == MOVING:
            buf = None
        else:
            if self._held():
                if step == ONE_READ:
                    i ^= 1
                else:
                    self._bufs[i] = None
            buf = self._bufs[i]
        if buf is None or buf.shape[0] != FRAME_OFFSET - LEN_PREFIX_LEN + size:
            buf = np.empty(FRAME_OFFSET - LEN_PREFIX_LEN + size, dtype=np.uint8)
            self._bufs[i] = buf
        self._last = i
        return buf.data[FRAME_OFFSET - LEN_PREFIX_LEN:]

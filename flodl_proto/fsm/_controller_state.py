"""The controller core's internal per-relay and per-connection state, and its lifecycle guard
model (the guards read the core on demand). Internal to :mod:`flodl_proto.fsm.controller_core`.
"""

from __future__ import annotations

import itertools
from collections.abc import Container
from concurrent.futures import Executor
from typing import Any

from .._unseen import hidden, quoted
from ..codec._common import BytesLike, check_world_size, wire_int
from ..codec.mux import RecordKind
from ..codec.record_image import FrameRecordImages
from ..codec.round_frame import RoundFrame, RoundKind
from ..codec.stream import MuxStream
from ..errors import LimitExceeded, protocol_error
from ..membership import DeadRanks
from ..reduce import is_realized
from .events import CheckpointWindow

__all__: list[str] = []


def check_core_args(world_size: object, reduce_threads: object) -> tuple[int, int]:
    """``ControllerCore``'s ``world_size`` (a whole number in 1..U32_MAX: ranks are u32) and
    ``reduce_threads`` (a whole number >= 1), as plain ints; a bool, a float or text is refused,
    never truncated (the codec's integer rule, :func:`~flodl_proto.codec._common.wire_int`).

    Raises:
        InvalidValue (local): ``controller.world_size_zero`` for a world size of 0 (upstream's
            words), else ``controller.bad_argument`` naming the argument and the value (a
            negative world size included).
    """
    n = check_world_size(world_size)  # the codec's Hello bound reads the same rule
    threads = wire_int(reduce_threads)
    if threads is None or threads < 1:
        raise protocol_error("controller.bad_argument", field="reduce_threads",
                             value=reduce_threads, reason="not a whole number >= 1")
    return n, threads


class _Relay:
    __slots__ = ("conn", "frame", "hint", "host", "index", "ranks", "reading")

    def __init__(self, index: int, conn: int, host: str, ranks: tuple[int, ...]) -> None:
        self.index = index
        self.conn = conn
        self.host = host
        self.ranks = ranks
        self.frame: RoundFrame | None = None
        self.reading = True  # False once upstream's reader for it would have exited
        self.hint = ""  # a likely cause to add to an error on this relay's stream

    @property
    def name(self) -> str:
        """``relay h1 (ranks 2,3)``: how messages name it. A host name with a character that
        does not show as itself (a newline, an escape, a combining mark, a variation selector:
        :func:`~flodl_proto._unseen.hidden`) is shown quoted and escaped (``relay 'h\\n1'
        (ranks 2,3)``, ``relay 'h\\u034f1' (ranks 2,3)``): the name comes from the peer and must
        not start a line, colour a terminal or pass for another name; a blank one is shown as
        the relay's index (``relay #0 (ranks 0)``)."""
        host = self.host
        if not host.strip():
            label = f"#{self.index}"
        elif any(map(hidden, host)):
            label = quoted(host)
        else:
            label = host
        return f"relay {label} (ranks {','.join(map(str, self.ranks))})"


class _Conn:
    __slots__ = ("closed", "deadline", "id", "relay", "stream")

    def __init__(self, conn: int, stream: MuxStream, deadline: float) -> None:
        self.id = conn
        self.stream = stream
        self.deadline = deadline
        self.relay: _Relay | None = None
        self.closed = False


class _AliveRelays:
    """The relays that carry at least one alive rank, recomputed only when the dead-rank ledger
    or the relay list has grown: ranks never come back to life, so the ledger's size names its
    content (the round wait asks several times per input; each scan took a lock per rank)."""

    __slots__ = ("_dead", "_indexes", "_known", "_relays")

    def __init__(self) -> None:
        self._dead = -1  # the ledger's size and the relay count the lists were made for
        self._known = -1
        self._relays: list[_Relay] = []
        self._indexes: set[int] = set()

    def get(self, ledger: DeadRanks, relays: list[_Relay]) -> tuple[list[_Relay], set[int]]:
        """The alive relays in ``relays``' order, and their indexes (not to be modified)."""
        dead_count = ledger.dead_count()
        if dead_count != self._dead or len(relays) != self._known:
            # the count is read first: a death in between is in ``dead`` and changes the next
            # count
            dead = set(ledger.dead_ranks())
            self._relays = [r for r in relays if any(x not in dead for x in r.ranks)]
            self._indexes = {r.index for r in self._relays}
            self._dead = dead_count
            self._known = len(relays)
        return self._relays, self._indexes


class _Guards:
    """The lifecycle's guard model: reads the core's state on demand."""

    __slots__ = ("_core", "state")

    def __init__(self, core: Any) -> None:  # the ControllerCore (no import: no cycle)
        self._core = core
        self.state: Any = None  # written by the state machine library

    @property
    def every_rank_covered(self) -> bool:
        return bool(self._core.covered == self._core.world_size)

    @property
    def round_complete(self) -> bool:
        expected = self._core._expected()
        return bool(expected) and _all_deposited(expected)

    @property
    def no_relay_alive(self) -> bool:
        return not self._core._expected()


def _all_deposited(expected: list[_Relay]) -> bool:
    """Every relay of ``expected`` holds its HostFrame of the round."""
    for r in expected:
        if r.frame is None:
            return False
    return True


class _Windows:
    """The controller's checkpoint window being gathered: a window is a realized Model
    consensus (the parameters), optionally a second one (the buffers), closed by a Control
    round, a third Model consensus or the end of the run."""

    __slots__ = ("buffers", "params", "window")

    def __init__(self) -> None:
        self.window = 0
        self.params: RoundFrame | None = None
        self.buffers: RoundFrame | None = None

    def tap(self, frame: RoundFrame) -> list[CheckpointWindow]:
        """A round's consensus: the window it closes, if any."""
        out: list[CheckpointWindow] = []
        if frame.kind is RoundKind.CONTROL:
            out = self.flush()
        elif is_realized(frame.weight):
            if self.params is None:
                self.params = frame
            elif self.buffers is None:
                self.buffers = frame
            else:  # a third Model consensus without a Control round: a new window
                out = self.flush()
                self.params = frame
        return out

    def flush(self) -> list[CheckpointWindow]:
        """Close the window (the run ends, or a Control round): its checkpoint, if any."""
        out = []
        if self.params is not None:
            out.append(CheckpointWindow(self.window, self.params, self.buffers))
            self.window += 1
        self.params = None
        self.buffers = None
        return out


def lowest_not_in(world_size: int, taken: Container[int], limit: int | None) -> list[int]:
    """The ranks ``0 <= r < world_size`` not in ``taken``, ascending: the lowest ``limit`` of them
    (a negative limit: none), or all when ``limit`` is None (then up to ``world_size`` ints, which
    may be ``2**32 - 1``). Takes at most ``limit`` plus the number of taken ranks below the last
    one listed steps, whatever ``world_size`` is.

    Upstream: none (upstream waits for uncovered ranks without listing them).
    """
    ranks = (r for r in range(world_size) if r not in taken)
    return list(ranks if limit is None else itertools.islice(ranks, max(0, limit)))


def broadcast_record(images: FrameRecordImages, consensus: RoundFrame, salt: bytes, ceiling: int,
                     mac_executor: Executor | None, round_no: int) -> tuple[BytesLike, ...]:
    """Round ``round_no``'s consensus as one Broadcast record (buffers written to every relay),
    checked against the controller's frame ceiling (``ceiling`` bytes) before anything is sent.

    Every relay's HostFrame can be within the ceiling while the consensus is not: with v3
    zero-elision a tensor one relay elided and another carried in full is carried in full.
    A relay's reader would reject such a record from its header; the controller refuses to
    write it (spec departure ``broadcast_over_ceiling``).

    Raises:
        LimitExceeded (remote): ``controller.broadcast_too_large`` naming the round, the
            record's payload length and the ceiling (the relays' frames caused it), with the
            encoder's local ``mux.payload_too_large_local`` as its cause.
        Whatever :meth:`FrameRecordImages.encode` raises otherwise.

    Upstream: ``controller/mod.rs`` ``average_and_scatter`` (which writes the record whatever
    its size; ``relay/mux.rs`` ``write_to`` checks only ``u32::MAX``).
    """
    try:
        return tuple(images.encode(RecordKind.BROADCAST, consensus, salt, ceiling=ceiling,
                                   mac_executor=mac_executor))
    except LimitExceeded as e:
        if e.error_id != "mux.payload_too_large_local":  # pragma: no cover - the only one
            raise
        raise protocol_error("controller.broadcast_too_large", round=round_no,
                             length=e.fields["length"], ceiling=e.fields["ceiling"]) from e

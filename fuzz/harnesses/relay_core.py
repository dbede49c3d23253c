"""Target ``relay_core``: the sans-IO :class:`~flodl_proto.fsm.relay_core.RelayCore` driven by a
fuzzer-chosen sequence of rank handshakes, controller records, rank blobs, departures and stops.

Input layout: ``flags u8 | ranks u8 | schema (builders.read_schema) | ops``. Flags: bit 0 version
(0: 2, 1: 3), bit 1 salt, bits 2-3 frame ceiling (:data:`~fuzz.harnesses.host_fold.FOLD_CEILINGS`).
Ranks byte: ``n = 1 + (b & 3)`` local ranks from ``first = (b >> 2) & 3``; world size
``first + n + ((b >> 4) & 1)``. Each op byte: low 3 bits the op, the rest ``a`` (0-31). An op is
only fed in a state where the runner would feed it (otherwise it is skipped), so the harness never
misuses the API:

* 0 — (accepting ranks) a handshake: ``a & 3`` 0 well-formed for rank ``u8 % (world + 1)``, 1
  ``u8`` raw bytes, 2 the wrong world size, 3 cut short at ``u8 % 16`` bytes;
* 1 — (dialing) the controller connection is open;
* 2 — (awaiting HelloAck, folding, draining) a controller record, ``a & 7``: 0 HelloAck, 1
  Broadcast of a built frame, 2 ``DeclareDead(u8 % (world + 1))``, 3 RankExit, 4 Hello, 5 Data,
  6 HostFrame, 7 end of stream;
* 3 — (folding, draining) local rank ``a % n`` sends a signed built frame (``a & 8``: raw ``u8``
  bytes instead; ``a & 16``: 3 bytes after the frame);
* 4 — (folding) local rank ``a % n`` leaves;
* 5 — (draining, after DrainUpstream) the drain completed;
* 6 — (folding, draining) a write found the controller connection closed;
* 7 — ``a >= 28`` stop; ``24 <= a < 28`` a runner-side remote error.

Oracle: no input raises; every action is well-formed: an :class:`AckRank` answers the handshake
just fed and decodes as an ack; :class:`RankConnected` names a local rank not connected before;
the Hello is sent once, from ``dialed``, and carries the channel magic and ``Hello{host, ranks
ascending}``; a HostFrame record decodes with the salt and its frame too, one per completed fold
round; a RankExit names the rank that just left, once per rank; a FanOut's prefix gives the
payload length and its ranks are the fold's alive ranks; a Broadcast above the relay's ceiling
(records are read here without one) ends the relay with the reader's ``mux.payload_too_large``;
DrainUpstream comes once, when the last local rank left; ``Finished`` comes once, its error (if
any) a RemoteProtocolError; after it every input is a no-op. At the end ``stop()`` must finish a
relay still running.
"""

from __future__ import annotations

from typing import Any

from flodl_proto.codec import END_OF_STREAM as EOS
from flodl_proto.codec import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    decode_ack,
    decode_len_prefix,
    decode_mux_record,
    decode_round_frame,
    encode_frame_record,
    encode_handshake,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
    expect_channel_magic,
)
from flodl_proto.errors import LimitExceeded, RemoteProtocolError, protocol_error
from flodl_proto.fsm.events import (
    AckRank,
    DrainUpstream,
    FanOut,
    Finished,
    RankConnected,
    SendUpstream,
    UpstreamKind,
)
from flodl_proto.fsm.lifecycle import RelayState
from flodl_proto.fsm.relay_core import RelayCore
from flodl_proto.spec import CHANNEL_MAGIC_DATA, CHANNEL_MAGIC_LEN

from .builders import build_frame, read_schema
from .common import SALTS, Finding, Params, check
from .host_fold import FOLD_CEILINGS

MAX_OPS = 64


class Driver:
    """Feeds the core and checks every action it returns."""

    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.finished = False
        self.connected: set[int] = set()
        self.gone: set[int] = set()
        self.hello_sent = False
        self.drain_asked = False
        self.host_frames = 0

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``core.<name>(...)`` and check the actions (no exception is acceptable)."""
        was_finished = self.finished
        actions: list[Any] = getattr(self.core, name)(*args, **kwargs)
        if was_finished:
            check(actions == [], f"{name} after Finished gave {actions!r}")
            return actions
        for a in actions:
            self.check_action(name, a, args)
        if not self.finished:
            check(self.host_frames == self.core.fold.rounds_completed,
                  f"{self.host_frames} HostFrames for {self.core.fold.rounds_completed} rounds")
        return actions

    def check_action(self, name: str, a: Any, args: tuple[Any, ...]) -> None:
        """Check one action against the harness's view of the relay."""
        check(not self.finished, f"action {a!r} after Finished")
        core = self.core
        if isinstance(a, AckRank):
            check(name == "rank_handshake", f"AckRank from {name}")
            check(decode_ack(a.ack, core.version) == len(a.ack), "ack bytes")
        elif isinstance(a, RankConnected):
            check(name == "rank_handshake" and a.rank in core.ranks
                  and a.rank not in self.connected, f"RankConnected {a!r}")
            self.connected.add(a.rank)
        elif isinstance(a, SendUpstream):
            self.check_upstream(name, a, args)
        elif isinstance(a, FanOut):
            check(name == "upstream_record", f"FanOut from {name}")
            n = decode_len_prefix(a.prefix, ceiling=1 << 62)
            check(n == a.payload.nbytes, f"FanOut prefix {n} for {a.payload.nbytes} bytes")
            check(a.ranks == core.fold.alive_ranks, f"FanOut to {a.ranks}")
        elif isinstance(a, DrainUpstream):
            check(not self.drain_asked and self.gone == set(core.ranks), "DrainUpstream")
            self.drain_asked = True
        elif isinstance(a, Finished):
            self.finished = True
            err = a.outcome.error
            check(a.outcome.clean == (err is None), f"outcome {a.outcome!r}")
            if err is not None and not isinstance(err, RemoteProtocolError):
                raise Finding(f"the relay failed with a non-remote error: {err!r}")
            check(core.finished, "Finished while the lifecycle is not final")
        else:
            raise Finding(f"unknown action {a!r}")

    def check_upstream(self, name: str, a: SendUpstream, args: tuple[Any, ...]) -> None:
        """One well-formed record (the Hello after the channel magic)."""
        core = self.core
        wire = b"".join(bytes(b) for b in a.buffers)
        if a.kind is UpstreamKind.HELLO:
            check(name == "dialed" and not self.hello_sent, "Hello sent twice or not on dial")
            self.hello_sent = True
            expect_channel_magic(wire, CHANNEL_MAGIC_DATA, "relay")
            wire = wire[CHANNEL_MAGIC_LEN:]
        res = decode_mux_record(wire, core.salt, version=core.version, ceiling=1 << 62)
        check(res is not EOS, f"empty {a.kind} record")
        assert res is not EOS
        rec, n = res
        check(n == len(wire), f"{a.kind} carries {len(wire) - n} bytes after its record")
        if a.kind is UpstreamKind.HELLO:
            check(isinstance(rec.control, Hello) and tuple(rec.control.ranks) == core.ranks
                  and list(core.ranks) == sorted(core.ranks), f"Hello record {rec!r}")
        elif a.kind is UpstreamKind.RANK_EXIT:
            check(name == "rank_left" and isinstance(rec.control, RankExit)
                  and rec.control.rank == args[0] and args[0] not in self.gone,
                  f"RankExit record {rec!r} from {name}{args}")
            self.gone.add(args[0])
        else:
            check(rec.kind is RecordKind.HOST_FRAME, f"HostFrame send carries {rec!r}")
            fr = decode_round_frame(rec.payload, core.salt, ceiling=1 << 62)
            check(fr is not EOS, "HostFrame payload is not a frame")
            self.host_frames += 1


def check_broadcast_over_ceiling(acts: list[Any], rec: MuxRecord, ceiling: int) -> None:
    """A Broadcast above the relay's ceiling (the harness reads records with no ceiling) ends the
    relay with the reader's remote error, exactly as if the runner's reader had rejected it."""
    check(len(acts) == 1 and isinstance(acts[0], Finished), f"over-ceiling Broadcast gave {acts!r}")
    err = acts[0].outcome.error
    check(isinstance(err, LimitExceeded) and isinstance(err, RemoteProtocolError)
          and err.error_id == "mux.payload_too_large"
          and dict(err.fields) == {"length": rec.payload.nbytes, "ceiling": ceiling,
                                   "kind": int(RecordKind.BROADCAST), "rank": 0},
          f"over-ceiling Broadcast ended the relay with {err!r}")


def _handshake(p: Params, mode: int, core: RelayCore, world: int) -> bytes:
    if mode == 1:
        return p.take(p.u8() % 24)
    rank = p.u8() % (world + 1)
    ws = world + 1 if mode == 2 else world
    hs = encode_handshake(rank, ws, core.version)
    return hs[:p.u8() % 16] if mode == 3 else hs


def _record(p: Params, kind: int, core: RelayCore, schema: Any, world: int) -> MuxRecord | None:
    salt, version = core.salt, core.version
    if kind == 0:
        return MuxRecord.control_msg(HelloAck(), version)
    if kind == 1:
        wire = b"".join(bytes(b) for b in encode_frame_record(
            RecordKind.BROADCAST, build_frame(p, schema), salt))
    elif kind == 2:
        wire = encode_mux_record_bytes(
            MuxRecord.control_msg(DeclareDead(p.u8() % (world + 1)), version), salt)
    elif kind == 3:
        wire = encode_mux_record_bytes(MuxRecord.control_msg(RankExit(p.u8() % 6), version), salt)
    elif kind == 4:
        wire = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0]), version), salt)
    elif kind == 5:
        wire = encode_mux_record_bytes(MuxRecord.data(p.u8(), p.take(3)), salt)
    elif kind == 6:
        wire = encode_mux_record_bytes(MuxRecord.host_frame(p.take(p.u8() % 32)), salt)
    else:
        return None
    res = decode_mux_record(wire, salt, version=version, ceiling=1 << 62)
    assert res is not EOS
    return res[0]


def test_one_input(data: bytes) -> None:
    """Drive a RelayCore with the ops in ``data`` (layout in the module docstring)."""
    p = Params(data)
    flags = p.u8()
    rb = p.u8()
    n, first = 1 + (rb & 3), (rb >> 2) & 3
    world = first + n + ((rb >> 4) & 1)
    schema = read_schema(p)
    salt = SALTS[(flags >> 1) & 1]
    core = RelayCore(range(first, first + n), world, salt, version=3 if flags & 1 else 2,
                     host="fuzz", ceiling=FOLD_CEILINGS[(flags >> 2) & 3])
    d = Driver(core)
    for _ in range(MAX_OPS):
        if p.pos >= len(data):
            break
        op = p.u8()
        kind, a = op & 7, op >> 3
        state = core.state
        if kind == 0:
            hs = _handshake(p, a & 3, core, world)
            if state == RelayState.ACCEPTING_RANKS:
                d.call("rank_handshake", hs)
        elif kind == 1:
            if state == RelayState.DIALING:
                d.call("dialed")
        elif kind == 2:
            rec = _record(p, a & 7, core, schema, world)
            if state in (RelayState.AWAITING_HELLO_ACK, RelayState.FOLDING, RelayState.DRAINING):
                acts = d.call("upstream_record", rec)
                if (state != RelayState.AWAITING_HELLO_ACK and rec is not None
                        and rec.kind is RecordKind.BROADCAST and rec.payload.nbytes > core.ceiling):
                    check_broadcast_over_ceiling(acts, rec, core.ceiling)
        elif kind == 3:
            rank = core.ranks[a % n]
            blob = (p.take(p.u8()) if a & 8 else
                    encode_round_frame_bytes(build_frame(p, schema), salt)
                    + (b"\x5a" * 3 if a & 16 else b""))
            if state in (RelayState.FOLDING, RelayState.DRAINING) and rank not in d.gone:
                d.call("rank_frame", rank, blob)
        elif kind == 4:
            if state == RelayState.FOLDING:
                d.call("rank_left", core.ranks[a % n])
        elif kind == 5:
            if state == RelayState.DRAINING and d.drain_asked:
                d.call("drained")
        elif kind == 6:
            if state in (RelayState.FOLDING, RelayState.DRAINING):
                d.call("controller_closed", "fuzz")
        elif a >= 28:
            d.call("stop", "fuzz")
        elif a >= 24:
            d.call("fail", protocol_error("mux.starved", seconds=60, got=0, need=25))
    d.call("stop", "end of input")
    check(d.finished and core.finished, "stop() did not finish the relay")

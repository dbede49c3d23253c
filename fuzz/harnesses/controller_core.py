"""Target ``controller_core``: the sans-IO :class:`~flodl_proto.fsm.controller_core.ControllerCore`
driven by a fuzzer-chosen sequence of connection events, byte chunks and clock ticks.

Input layout: ``flags u8 | world u8 | schema (builders.read_schema) | ops``. Flags: bit 0 version
(0: 2, 1: 3), bit 2 salt, bits 3-4 frame ceiling (64 MiB, 1 MiB, 1 KiB, 0), bits 5-6 outer
optimizer (none, OuterAvg, SlowMomentum, NesterovMomentum), bit 7 checkpoint windows. World byte:
world size ``1 + (b & 3)``. Each op byte: low 3 bits the op, the rest ``a`` (0-31); ``conn = a & 3``
(connections open on first use, at the current time):

* 0 — open connection ``conn`` now (if not opened yet);
* 1 — ``u8`` raw bytes to ``conn``;
* 2 — a well-formed item to ``conn``, split in two chunks at a fuzzer-chosen point; item
  ``a >> 2``: 0 channel magic, 1 ``Hello`` (host, rank mask over 0-4), 2 HostFrame carrying a
  built frame, 3 ``RankExit``, 4 ``DeclareDead``, 5 Data, 6 Broadcast, 7 HostFrame carrying
  ``u8`` raw payload bytes (record correctly signed);
* 3 — ``conn`` closed: EOF, or (``a & 4``) a read failure;
* 4 — a write to ``conn`` failed (HelloAck, DeclareDead or Broadcast, by ``a >> 2``);
* 5 — the clock advances ``a / 2`` seconds (the 10 s handshake deadline is reachable);
* 6 — rank ``a % (world + 1)`` declared dead from outside;
* 7 — stop (only when ``a >= 28``; otherwise nothing).

Oracle: no input raises (the harness never misuses the API); every action is well-formed: a
``SendTo`` goes to an open connection, its buffers are one mux record signed with the salt, of
the kind announced (one HelloAck per ``RelayJoined``, in the same call; a ``DeclareDead`` for
a dead rank, a Broadcast whose RoundFrame decodes, for the round announced); a connection is closed
at most once; rounds count up from 0; ``Finished`` comes once, with every connection closed, and
its error (if any) is a RemoteProtocolError (peer bytes must never surface as a local error);
after it every input is a no-op; ``status()`` works in every state. At the end ``stop()`` must
finish a run still going.
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
    decode_mux_record_or_eos,
    decode_round_frame_or_eos,
    encode_channel_magic,
    encode_frame_record,
    encode_mux_record_bytes,
    encode_mux_record_parts,
)
from flodl_proto.errors import RemoteProtocolError, protocol_error
from flodl_proto.fsm.controller_core import ControllerCore
from flodl_proto.fsm.events import (
    CheckpointWindow,
    CloseConnection,
    Finished,
    RelayJoined,
    RoundScattered,
    SendKind,
    SendTo,
    StopAccepting,
)
from flodl_proto.reduce import NesterovMomentum, OuterAvg, SlowMomentum

from .builders import build_frame, read_schema
from .common import SALTS, Finding, Params, check
from .host_fold import FOLD_CEILINGS

MAX_OPS = 64
_SEND_KINDS = (SendKind.HELLO_ACK, SendKind.DECLARE_DEAD, SendKind.BROADCAST)


class Driver:
    """Feeds the core and checks every action it returns."""

    def __init__(self, core: ControllerCore) -> None:
        self.core = core
        self.now = 0.0
        self.opened: set[int] = set()
        self.rejected: set[int] = set()
        self.closed: set[int] = set()
        self.joined: set[int] = set()
        self.acked: set[int] = set()
        self.finished = False
        self.stopped_accepting = False
        self.rounds = 0  # rounds scattered so far (round numbers are 1-based)

    def call(self, name: str, *args: Any) -> None:
        """Call ``core.<name>(*args)`` and check the actions (no exception is acceptable)."""
        was_finished = self.finished
        actions = getattr(self.core, name)(*args)
        if was_finished:
            if name == "connection_opened":
                check(all(isinstance(a, CloseConnection) for a in actions),
                      f"connection_opened after Finished gave {actions!r}")
            else:
                check(actions == [], f"{name} after Finished gave {actions!r}")
            return
        for a in actions:
            self.check_action(a)
        check(self.acked == self.joined, f"HelloAcks to {sorted(self.acked)}, relays joined on "
              f"{sorted(self.joined)}")
        if name == "connection_opened" and self.stopped_accepting and not self.finished:
            check(args[0] in self.closed, "a connection opened after StopAccepting stayed open")

    def check_action(self, a: Any) -> None:
        """Check one action against the harness's view of the run."""
        check(not self.finished, f"action {a!r} after Finished")
        if isinstance(a, SendTo):
            self.check_send(a)
        elif isinstance(a, CloseConnection):
            check(a.conn in self.opened, f"close of unknown connection {a.conn}")
            check(a.conn not in self.closed, f"connection {a.conn} closed twice")
            self.closed.add(a.conn)
        elif isinstance(a, RelayJoined):
            check(a.conn in self.opened and a.conn not in self.joined, f"bad RelayJoined {a!r}")
            check(all(0 <= r < self.core.world_size for r in a.ranks), f"ranks of {a!r}")
            self.joined.add(a.conn)
        elif isinstance(a, StopAccepting):
            check(not self.stopped_accepting, "StopAccepting twice")
            self.stopped_accepting = True
        elif isinstance(a, RoundScattered):
            check(a.round == self.rounds + 1, f"round {a.round}, expected {self.rounds + 1}")
            self.rounds += 1
        elif isinstance(a, Finished):
            self.finished = True
            err = a.outcome.error
            check(a.outcome.clean == (err is None), f"outcome {a.outcome!r}")
            if err is not None and not isinstance(err, RemoteProtocolError):
                raise Finding(f"the run failed with a non-remote error: {err!r}")
            check(self.opened <= self.closed,
                  f"Finished with connections {sorted(self.opened - self.closed)} open")
        elif not isinstance(a, CheckpointWindow):
            raise Finding(f"unknown action {a!r}")

    def check_send(self, a: SendTo) -> None:
        """A SendTo goes to an open connection and carries one well-formed signed record."""
        check(a.conn in self.opened and a.conn not in self.closed, f"SendTo closed conn {a.conn}")
        wire = b"".join(bytes(b) for b in a.buffers)
        check(len(wire) == a.nbytes, f"SendTo nbytes {a.nbytes} != {len(wire)}")
        res = decode_mux_record_or_eos(wire, self.core.salt, version=self.core.version,
                                ceiling=1 << 62)
        check(res is not EOS, "SendTo of an empty record")
        assert res is not EOS
        rec, n = res
        check(n == len(wire), f"SendTo carries {len(wire) - n} bytes after its record")
        if a.kind is SendKind.HELLO_ACK:
            check(isinstance(rec.control, HelloAck), f"HelloAck send carries {rec!r}")
            check(a.conn not in self.acked, f"second HelloAck to connection {a.conn}")
            self.acked.add(a.conn)
        elif a.kind is SendKind.DECLARE_DEAD:
            msg = rec.control
            check(isinstance(msg, DeclareDead) and self.core.dead_ranks.is_dead(msg.rank),
                  f"DeclareDead send carries {rec!r}")
        else:
            check(rec.kind is RecordKind.BROADCAST, f"Broadcast send carries {rec!r}")
            check(a.round == self.rounds + 1,
                  f"Broadcast for round {a.round}, expected {self.rounds + 1}")
            fr = decode_round_frame_or_eos(rec.payload, self.core.salt, ceiling=1 << 62)
            check(fr is not EOS and fr[1] == rec.payload.nbytes, "Broadcast frame")

    def ensure_open(self, conn: int) -> bool:
        """Open ``conn`` at the current time unless it was opened already; False when the core
        never registered it (opened after the run finished: further calls would be misuse)."""
        if conn not in self.opened and conn not in self.rejected:
            if self.finished:
                self.rejected.add(conn)
            else:
                self.opened.add(conn)
            self.call("connection_opened", conn, self.now)
        return conn in self.opened


def _item(p: Params, kind: int, core: ControllerCore, schema: Any) -> bytes:
    salt, version = core.salt, core.version
    if kind == 0:
        return encode_channel_magic("data")
    if kind == 1:
        host = "h" + str(p.u8())
        mask = p.u8()
        msg: Any = Hello(host, [r for r in range(5) if mask >> r & 1])
    elif kind == 2:
        return b"".join(bytes(b) for b in encode_frame_record(
            RecordKind.HOST_FRAME, build_frame(p, schema), salt))
    elif kind == 3:
        msg = RankExit(p.u8() % 6)
    elif kind == 4:
        msg = DeclareDead(p.u8() % 6)
    elif kind == 5:
        return encode_mux_record_bytes(MuxRecord.data(p.u8(), p.take(3)), salt)
    elif kind == 6:
        return encode_mux_record_bytes(MuxRecord.broadcast(p.take(p.u8() % 64)), salt)
    else:
        return b"".join(bytes(b) for b in encode_mux_record_parts(
            int(RecordKind.HOST_FRAME), 0, [p.take(p.u8())], salt))
    return encode_mux_record_bytes(MuxRecord.control_msg(msg, version), salt)


def test_one_input(data: bytes) -> None:
    """Drive a ControllerCore with the ops in ``data`` (layout in the module docstring)."""
    p = Params(data)
    flags = p.u8()
    world = 1 + (p.u8() & 3)
    schema = read_schema(p)
    outer = (None, OuterAvg(), SlowMomentum(1.0, 0.9), NesterovMomentum(0.7, 0.9))[(flags >> 5) & 3]
    core = ControllerCore(world, SALTS[(flags >> 2) & 1], version=3 if flags & 1 else 2,
                          ceiling=FOLD_CEILINGS[(flags >> 3) & 3], outer=outer,
                          checkpoint=bool(flags & 0x80))
    d = Driver(core)
    d.call("start")
    for _ in range(MAX_OPS):
        if p.pos >= len(data):
            break
        op = p.u8()
        kind, a = op & 7, op >> 3
        conn = a & 3
        if kind == 0:
            d.ensure_open(conn)
        elif kind == 1:
            chunk = p.take(p.u8())
            if d.ensure_open(conn):
                d.call("receive_data", conn, chunk)
        elif kind == 2:
            item = _item(p, a >> 2, core, schema)
            cut = p.u8() % (len(item) + 1)
            if d.ensure_open(conn):
                d.call("receive_data", conn, item[:cut])
                d.call("receive_data", conn, item[cut:])
        elif kind == 3:
            err = protocol_error("mux.starved", seconds=60, got=0, need=25) if a & 4 else None
            if d.ensure_open(conn):
                d.call("connection_closed", conn, err)
        elif kind == 4:
            if d.ensure_open(conn):
                d.call("write_failed", conn, _SEND_KINDS[(a >> 2) % 3], "fuzz")
        elif kind == 5:
            d.now += a / 2
            d.call("tick", d.now)
        elif kind == 6:
            d.call("declare_dead", a % (world + 1))
        elif a >= 28:
            d.call("stop", "fuzz")
        status = core.status()
        check(status["ranks_covered"] <= world and status["rounds_reduced"] == d.rounds,
              f"status {status!r}")
    d.call("stop", "end of input")
    check(d.finished, "stop() did not finish the run")

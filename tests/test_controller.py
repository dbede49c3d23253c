"""The reference controller over real loopback sockets: ports of upstream's controller tests
(flodl/src/distributed/controller_tests.rs), the port mux, ``GET /status`` and the CLI.

Ephemeral ports only; ``FLODL_NET_TIMEOUT_SCALE=0.1`` (conftest); every wait has a deadline.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec.handshake import encode_channel_magic
from flodl_proto.codec.mux import (
    Hello,
    MuxRecord,
    RecordKind,
    encode_frame_record,
    max_hello_payload,
)
from flodl_proto.codec.round_frame import RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec.structs import MUX_HEADER
from flodl_proto.errors import InvalidValue, LocalProtocolError
from flodl_proto.fsm.events import SendKind, SendTo
from flodl_proto.runner import _controller_conn as conn_mod
from flodl_proto.runner.controller import ReferenceController
from flodl_proto.spec import MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC, READ_CHUNK

from .fake_relay import SALT, FakeRelay, frame, values
from .reference import ref_reduce
from .resolver_stub import PATCHED_CLI

END = 5.0  # seconds to wait for the controller to end


@pytest.fixture
def controller_factory() -> Iterator[object]:
    made: list[ReferenceController] = []

    def make(world_size: int, **kw: object) -> ReferenceController:
        kw.setdefault("port_mux", False)
        ctl = ReferenceController(world_size, SALT, **kw)  # type: ignore[arg-type]
        made.append(ctl)
        return ctl.start()

    yield make
    for ctl in made:
        ctl.shutdown(timeout=10)


def _error(ctl: ReferenceController) -> str:
    out = ctl.wait(END)
    assert out is not None, "controller still running"
    assert not out.clean, out
    return str(out.error)


@pytest.mark.timeout(30)
def test_two_rank_average_one_round(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0, 1]) as relay:
        relay.expect_hello_ack()
        # the relay folded ranks 0 ([1,2,3]) and 1 ([3,4,5]), weight 1 each
        relay.send_host_frame(frame([4.0, 6.0, 8.0], weight=2.0))
        got = relay.read_broadcast()
        assert values(got) == [2.0, 3.0, 4.0]
        assert got.weight == 2.0
        relay.rank_exit(0)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "rank_exit"


@pytest.mark.timeout(30)
def test_three_ranks_multi_round_multi_tensor(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(3, version=3)
    with FakeRelay(ctl.port, [0, 1], version=3) as a, FakeRelay(ctl.port, [2], version=3) as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        for rnd in range(2):
            fa = frame(np.arange(4) + rnd, np.array([[1.0, 2.0], [3.0, 4.0]]), weight=2.0)
            fb = frame(np.arange(4) * 3.0, np.array([[5.0, 6.0], [7.0, 8.0]]), weight=1.0)
            b.send_host_frame(fb)
            a.send_host_frame(fa)
            ga, gb = a.read_broadcast(), b.read_broadcast()
            assert ga == gb
            want = ref_reduce([fa, fb], version=3)
            assert ga == want
            assert values(ga, 1) == pytest.approx([2.0, 8.0 / 3.0, 10.0 / 3.0, 4.0])
            assert ga.tensors[1].shape == (2, 2)
        b.close()
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "relay_eof"
    assert ctl.status()["rounds_reduced"] == 2


@pytest.mark.timeout(30)
def test_rejects_non_hello_first_record(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, None) as relay:
        relay.send_record(MuxRecord.data(0, b"\x01\x02"))
        assert relay.at_eof()  # no HelloAck: dropped
    assert _error(ctl).startswith("cluster_controller: expected relay Hello, got Data")


@pytest.mark.timeout(30)
def test_rejects_rank_out_of_range(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0, 2]) as relay:
        assert relay.at_eof()
    assert _error(ctl) == "cluster_controller: relay announced rank 2 >= world_size 2"


@pytest.mark.timeout(30)
def test_rank_announced_twice_closes_every_connection(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(3)
    # the second relay connects only once the first is acknowledged: two connections' Hellos
    # have no defined order at the controller
    with FakeRelay(ctl.port, [0, 1]) as a:
        a.expect_hello_ack()
        with FakeRelay(ctl.port, [1, 2]) as b:
            assert b.at_eof()
            assert a.at_eof()  # departure: the earlier relay is closed too
    assert _error(ctl) == "cluster_controller: rank 1 announced by two relays"


@pytest.mark.timeout(30)
def test_relay_leaving_during_accept_ends_the_run_after_coverage(  # type: ignore[no-untyped-def]
        controller_factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flodl_proto.fsm.controller_core")
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0]) as a:
        a.expect_hello_ack()
    # the controller has seen the EOF (a sleep here proved nothing on a loaded machine: the
    # second relay's Hello could come first); as upstream, it waits for coverage
    seen = ("controller: relay fake (ranks 0) closed its connection: run ends cleanly, as "
            "flodl does during the accept phase; the run ends once every rank is covered")
    deadline = time.monotonic() + 20
    while seen not in caplog.messages and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen in caplog.messages, caplog.messages
    # a warning, as the command line shows by default: the run is over, though the wait goes on
    assert [r.levelname for r in caplog.records if r.getMessage() == seen] == ["WARNING"]
    assert ctl.wait(0) is None
    with FakeRelay(ctl.port, [1]) as b:
        b.expect_hello_ack()
        assert b.at_eof()
    out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "relay_eof"


@pytest.mark.timeout(30)
def test_a_relay_failing_during_accept_is_a_warning_and_fails_the_run_after_coverage(  # type: ignore[no-untyped-def]
        controller_factory, caplog: pytest.LogCaptureFixture) -> None:
    """A relay's stream that fails during the accept phase fails the run once every rank is
    covered, as upstream; the controller says so at once, at WARNING (it was an INFO record, so
    the command line, at its default level, showed nothing while it waited)."""
    caplog.set_level(logging.INFO, logger="flodl_proto.fsm.controller_core")
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0]) as a:
        a.expect_hello_ack()
        a.send_host_frame(frame([1.0]), frame_salt=bytes(16))
        deadline = time.monotonic() + 20
        while not any("during the accept phase" in m for m in caplog.messages) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        held = [(r.levelname, r.getMessage()) for r in caplog.records
                if "during the accept phase" in r.getMessage()]
        assert len(held) == 1 and held[0][0] == "WARNING", caplog.messages
        assert held[0][1].startswith("controller: reading relay fake (ranks 0): "), held
        assert held[0][1].endswith(" (during the accept phase; reported once every rank is "
                                   "covered)"), held
        assert "HMAC verification failed" in held[0][1], held
        assert ctl.wait(0) is None
        with FakeRelay(ctl.port, [1]) as b:
            b.expect_hello_ack()
            assert b.at_eof()
    assert "HMAC verification failed" in _error(ctl)


@pytest.mark.timeout(30)
def test_rejects_round_frame_with_wrong_inner_salt(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        relay.send_host_frame(frame([1.0]), frame_salt=bytes(16))
        assert "HMAC verification failed" in _error(ctl)
        assert relay.at_eof()


@pytest.mark.timeout(30)
def test_rejects_data_record_on_data_channel(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        relay.send_record(MuxRecord.data(0, b"x"))
        assert "HostFrame" in _error(ctl)


@pytest.mark.timeout(30)
def test_rejects_shape_mismatch_across_relays(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0]) as a, FakeRelay(ctl.port, [1]) as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        a.send_host_frame(frame([1.0, 2.0]))
        b.send_host_frame(frame([1.0, 2.0, 3.0]))
        err = _error(ctl)
        assert "shape" in err
        assert a.at_eof() and b.at_eof()  # no partial round scattered


@pytest.mark.timeout(30)
def test_rejects_non_f32_dtype_in_reduce(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        odd = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(7, [2], b"\0" * 8)])
        relay.send_host_frame(odd)
        assert "dtype tag 7" in _error(ctl)


@pytest.mark.timeout(60)
def test_elastic_scatter_declares_stalled_relay_dead_and_continues(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(2)
    n = 4 << 20  # 16 MiB of f32 per frame: more than the socket buffers hold
    with FakeRelay(ctl.port, [0], rcvbuf=4096) as stalled, FakeRelay(ctl.port, [1]) as live:
        stalled.expect_hello_ack()
        live.expect_hello_ack()
        stalled.send_host_frame(frame(np.full(n, 2.0), weight=1.0))
        live.send_host_frame(frame(np.full(n, 3.0), weight=3.0))  # pre-scaled: 3 x 1.0
        got = live.read_broadcast(timeout=20)  # the stalled write does not hold it back
        assert values(got)[:2] == [1.25, 1.25] and got.weight == 4.0
        # the stalled relay never reads: after the write stall its rank is declared dead
        deadline = time.monotonic() + 20
        while not ctl.dead_ranks.is_dead(0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ctl.dead_ranks.is_dead(0) and not ctl.dead_ranks.is_dead(1)
        live.send_host_frame(frame([3.0, 3.0], weight=3.0))
        got2 = live.read_broadcast()
        assert values(got2) == [1.0, 1.0] and got2.weight == 3.0
        live.rank_exit(1)
        out = ctl.wait(END)
    assert out is not None and out.clean


@pytest.mark.timeout(90)
def test_a_stalled_relay_delays_no_one(controller_factory,  # type: ignore[no-untyped-def]
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # relay S stops reading while its round-0 Broadcast (16 MiB) is being written, but keeps
    # sending. Round 1 completes as soon as both relays deposit: the live relay gets it at once,
    # with S's contribution in it (S is not dead yet); S's ranks are declared dead when its write
    # deadline passes (6 s here), and round 2 is the live relay's alone.
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.2")
    ctl = controller_factory(2)
    n = 4 << 20
    with FakeRelay(ctl.port, [0], rcvbuf=4096) as stalled, FakeRelay(ctl.port, [1]) as live:
        stalled.expect_hello_ack()
        live.expect_hello_ack()
        stalled.send_host_frame(frame(np.full(n, 2.0), weight=1.0))
        live.send_host_frame(frame(np.full(n, 3.0), weight=3.0))
        deadline = time.monotonic() + 20
        while ctl.status()["rounds_reduced"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        stalled.send_host_frame(frame([4.0], weight=1.0))  # round 1, before anyone reads
        live.send_host_frame(frame([6.0], weight=3.0))
        got0 = live.read_broadcast(timeout=20)
        assert values(got0)[:2] == [1.25, 1.25] and got0.weight == 4.0
        del got0
        got1 = live.read_broadcast(timeout=20)
        assert values(got1) == [2.5] and got1.weight == 4.0  # (4 + 6) / 4: both relays
        deadline = time.monotonic() + 30
        while not ctl.dead_ranks.is_dead(0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ctl.dead_ranks.is_dead(0) and not ctl.dead_ranks.is_dead(1)
        live.send_host_frame(frame([6.0], weight=3.0))
        got2 = live.read_broadcast()
        assert values(got2) == [2.0] and got2.weight == 3.0
        live.rank_exit(1)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "rank_exit"


@pytest.mark.timeout(90)
def test_a_relay_that_reads_slower_than_rounds_end_holds_no_more_broadcasts(  # type: ignore[no-untyped-def]
        controller_factory, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # relay S reads nothing but keeps sending: its round-0 Broadcast (16 MiB) stalls in the
    # writer and round 1's waits behind it (CONTROLLER_BROADCAST_BACKLOG = 2); round 2's would
    # be a third consensus held for S, so S's scatter fails at once, long before the 30 s write
    # stall, and round 3 is the live relay's alone
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "1")
    ctl = controller_factory(2)
    n = 4 << 20
    with FakeRelay(ctl.port, [0], rcvbuf=4096, host="h0") as stalled, \
            FakeRelay(ctl.port, [1]) as live:
        stalled.expect_hello_ack()
        live.expect_hello_ack()
        for i, big in enumerate((True, True, False)):
            vals = np.full(n, 2.0) if big else [2.0]
            with caplog.at_level(logging.WARNING, logger="flodl_proto"):
                stalled.send_host_frame(frame(vals, weight=1.0))
                live.send_host_frame(frame(np.asarray(vals) * 3.0, weight=3.0))
                got = live.read_broadcast(timeout=20)
            assert values(got)[:1] == [2.0] and got.weight == 4.0, i  # (2 + 6) / 4: both
            del got
        deadline = time.monotonic() + 20
        while not ctl.dead_ranks.is_dead(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ctl.dead_ranks.is_dead(0) and not ctl.dead_ranks.is_dead(1)
        assert [r.getMessage() for r in caplog.records if "consensus broadcast" in r.getMessage()] \
            == ["controller: consensus broadcast to relay h0 (ranks 0) failed (2 earlier "
                "Broadcasts not written yet: the relay reads slower than rounds end); declaring "
                "its ranks dead and continuing with survivors"]
        stalled.close()  # its writer, still inside round 0's Broadcast, fails at once
        live.send_host_frame(frame([6.0], weight=3.0))
        got3 = live.read_broadcast()
        assert values(got3) == [2.0] and got3.weight == 3.0
        live.rank_exit(1)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "rank_exit"


def _reset(relay: FakeRelay) -> None:
    """Close ``relay``'s connection with a reset (SO_LINGER on, 0 s) instead of a FIN."""
    relay.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    relay.close()


@pytest.mark.timeout(30)
def test_a_reset_at_a_record_boundary_is_a_clean_end(controller_factory) -> None:  # type: ignore[no-untyped-def]
    # spec end_of_stream connection_reset: a reset between records ends the stream like a close
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0], host="h0") as a, FakeRelay(ctl.port, [1], host="h1") as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        a.send_host_frame(frame([1.0], weight=1.0))
        b.send_host_frame(frame([3.0], weight=1.0))
        assert values(a.read_broadcast()) == [2.0] and values(b.read_broadcast()) == [2.0]
        _reset(b)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "relay_eof"
    assert out.detail == "relay h1 (ranks 1) closed its connection: run ends cleanly, as flodl does"


@pytest.mark.timeout(30)
def test_a_reset_inside_a_record_is_a_truncation(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0], host="h0") as a:
        a.expect_hello_ack()
        record = b"".join(bytes(memoryview(p)) for p in
                          encode_frame_record(RecordKind.HOST_FRAME, frame([1.0]), SALT))
        a.send_raw(record[:40])  # the header and part of the payload
        time.sleep(0.2)  # let the controller commit to the record before the reset
        _reset(a)
        err = _error(ctl)
    assert err == ("relay_mux: peer closed mid-frame (committed read hit EOF) "
                   f"(40 of {len(record)} bytes)")


@pytest.mark.timeout(30)
def test_every_end_names_the_relay_and_ranks(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(3)
    with FakeRelay(ctl.port, [0], host="h0") as a, FakeRelay(ctl.port, [1, 2], host="h1") as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        b.rank_exit(2)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "rank_exit"
    assert out.detail == "rank 2 of relay h1 (ranks 1,2) exited: run ends cleanly, as flodl does"
    # an error while reading a relay's stream names that relay
    ctl = controller_factory(2)
    with FakeRelay(ctl.port, [0], host="h0") as a, FakeRelay(ctl.port, [1], host="h1") as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        b.send_host_frame(frame([1.0]), frame_salt=bytes(16))
        out = ctl.wait(END)
    assert out is not None and not out.clean and out.detail == "reading relay h1 (ranks 1)"
    assert str(out.error).startswith("cluster_controller: RoundFrame HMAC verification failed")
    assert str(out).endswith(" [reading relay h1 (ranks 1)]")
    # the run ends cleanly when every rank is dead: the dead ranks are named
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0], host="h0") as a:
        a.expect_hello_ack()
        ctl.declare_dead(0)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "all_dead"
    assert out.detail == "no relay carries an alive rank (dead ranks 0): run ends cleanly, as " \
                         "flodl does"


@pytest.mark.timeout(30)
def test_a_hello_of_the_other_version_says_the_versions_differ(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1, version=3)
    with FakeRelay(ctl.port, [0], host="old", version=2):
        out = ctl.wait(END)
    assert out is not None and not out.clean
    assert str(out.error).startswith("relay_mux: bincode decode failed")
    assert out.detail == ("connection 0 (before its Hello); the relay sent a protocol-version-2 "
                          "Hello to this version-3 controller: the protocol versions differ "
                          "(set the same --protocol-version on both sides)")
    # the reverse: a version-2 controller accepts a version-3 Hello (upstream does) and says
    # the versions differ once the first elided payload fails the round
    ctl = controller_factory(1, version=2)
    with FakeRelay(ctl.port, [0], host="new", version=3) as relay:
        relay.expect_hello_ack()
        relay.send_host_frame(RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload.elide(0, [2])]))
        out = ctl.wait(END)
    assert out is not None and not out.clean
    assert out.detail.startswith("reducing round 1 of relay new (ranks 0); relay new (ranks 0): "
                                 "the relay sent a protocol-version-3 Hello to this version-2 "
                                 "controller: the protocol versions differ")


class _Boom(RuntimeError):
    pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["coordinator", "writer"])
def test_an_unexpected_exception_in_the_scatter_fails_the_run(
        controller_factory, monkeypatch: pytest.MonkeyPatch, where: str) -> None:  # type: ignore[no-untyped-def]
    boom = _Boom("scatter exploded")
    if where == "coordinator":  # writing the Broadcast or handing it to the writers
        real_send = ReferenceController._send

        def send(self: ReferenceController, send: SendTo, now: float) -> bool:
            if send.kind is SendKind.BROADCAST:
                raise boom
            return real_send(self, send, now)

        monkeypatch.setattr(ReferenceController, "_send", send)
    else:  # writing the Broadcast, on the connection's writer thread
        real_send_all = conn_mod.send_all
        # the socket takes nothing without waiting: every record goes to the writer
        monkeypatch.setattr(conn_mod, "_write_direct",
                            lambda sock, buffers, nbytes: [memoryview(b) for b in buffers])

        def send_all(sock: socket.socket, buffers: Any, **kw: Any) -> int:
            if bytes(memoryview(buffers[0])[8:9]) == bytes([RecordKind.BROADCAST.value]):
                raise boom
            return real_send_all(sock, buffers, **kw)

        monkeypatch.setattr(conn_mod, "send_all", send_all)
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        relay.send_host_frame(frame([1.0], weight=1.0))
        out = ctl.wait(END)
        assert out is not None and not out.clean and out.reason == "fail"
        assert out.error is boom
        assert ctl._core.state == "shutdown"
        assert ctl.status()["outcome"] == {"clean": False, "reason": "fail",
                                           "error": "scatter exploded"}
        assert relay.at_eof()


@pytest.mark.timeout(30)
def test_two_host_fold_average_one_round(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(3)
    with FakeRelay(ctl.port, [0, 1], host="h0") as a, FakeRelay(ctl.port, [2], host="h1") as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        a.send_host_frame(frame([3.0, 5.0], weight=2.0))  # ranks 0,1: [1,2] + [2,3]
        b.send_host_frame(frame([3.0, 4.0], weight=1.0))
        ga, gb = a.read_broadcast(), b.read_broadcast()
        assert ga == gb
        assert values(ga) == [2.0, 3.0] and ga.weight == 3.0


def test_zero_world_size_errors() -> None:
    with pytest.raises(InvalidValue) as ei:
        ReferenceController(0, SALT)
    assert isinstance(ei.value, LocalProtocolError)
    assert "world_size must be > 0" in str(ei.value)


@pytest.mark.parametrize("ceiling", [0, 5, 24])
def test_a_ceiling_below_the_smallest_round_frame_is_local_misuse(ceiling: int) -> None:
    """Every HostFrame is at least a RoundFrame with no tensor (25 bytes) and a relay's Hello
    may be as long: a smaller ceiling would refuse the relays (which then blame the version or
    the salt), so the constructor refuses it, naming the field, the value and the minimum."""
    with pytest.raises(InvalidValue) as ei:
        ReferenceController(1, SALT, ceiling=ceiling)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "ceiling.below_minimum"
    assert str(ei.value) == (f"controller: frame ceiling {ceiling} is below 25 bytes (the "
                             "smallest RoundFrame: no tensor); a record every run exchanges "
                             "would be refused")
    assert ReferenceController(1, SALT, ceiling=25).world_size == 1


@pytest.mark.parametrize("ceiling", [None, "25", 25.0, True])
def test_a_ceiling_that_is_no_whole_number_is_local_misuse(ceiling: Any) -> None:
    """The ceiling is checked before anything is built from it: None is ``ceiling.invalid``
    as it is for the relay and the rank, not the TypeError of ``int(None)``."""
    with pytest.raises(InvalidValue) as ei:
        ReferenceController(1, SALT, ceiling=ceiling)
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "ceiling.invalid"
    assert str(ei.value) == ("frame ceiling must be a non-negative number of bytes, got "
                             f"{ceiling!r}")


@pytest.mark.timeout(30)
def test_dead_diff_forwarding_releases_a_relay(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(3)
    with FakeRelay(ctl.port, [0]) as a, FakeRelay(ctl.port, [1, 2]) as b:
        a.expect_hello_ack()
        b.expect_hello_ack()
        a.send_host_frame(frame([3.0], weight=1.0))
        b.send_host_frame(frame([6.0], weight=2.0))
        assert values(a.read_broadcast()) == [3.0] and values(b.read_broadcast()) == [3.0]
        # relay b's rank 2 is wedged; the coordinator declares it dead
        a.send_host_frame(frame([5.0], weight=1.0))
        ctl.declare_dead(2)
        assert b.read_declare_dead() == 2  # the relay's fold is released
        b.send_host_frame(frame([7.0], weight=1.0))  # rank 1 alone
        assert values(a.read_broadcast()) == [6.0]
        assert values(b.read_broadcast()) == [6.0]
        b.rank_exit(2)  # a dead rank's exit is ignored
        a.send_host_frame(frame([1.0], weight=1.0))
        b.send_host_frame(frame([3.0], weight=1.0))
        assert values(a.read_broadcast()) == [2.0]
        ctl.declare_dead(0)
        ctl.declare_dead(1)
        out = ctl.wait(END)
    assert out is not None and out.clean and out.reason == "all_dead"


@pytest.mark.timeout(30)
def test_port_mux_drops_silent_and_unknown_connections(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(2, port_mux=True)
    silent = socket.create_connection(("127.0.0.1", ctl.port), timeout=END)
    unknown = socket.create_connection(("127.0.0.1", ctl.port), timeout=END)
    unknown.sendall(b"\xde\xad\xbe\xef" + b"junk")
    control = socket.create_connection(("127.0.0.1", ctl.port), timeout=END)
    control.sendall(b"\xe2\x17\x0d\xf1")  # control channel: not served here
    try:
        with FakeRelay(ctl.port, [0]) as a, FakeRelay(ctl.port, [1]) as b:
            a.expect_hello_ack()
            b.expect_hello_ack()
            for rnd in range(3):
                a.send_host_frame(frame([float(rnd)], weight=1.0))
                b.send_host_frame(frame([float(rnd + 2)], weight=1.0))
                assert values(a.read_broadcast()) == [rnd + 1.0]
                assert values(b.read_broadcast()) == [rnd + 1.0]
            assert _closed(unknown) and _closed(control)
            assert _closed(silent)  # dropped after the peek deadline
            a.rank_exit(0)
            out = ctl.wait(END)
        assert out is not None and out.clean
    finally:
        for s in (silent, unknown, control):
            s.close()


# -- memory under hostile length claims -----------------------------------------------------------
#: a controller in a child process that answers "mem" with its traced Python allocations (bytes
#: above the baseline taken once it listens: current, peak) and "wait" with its outcome
_MEMORY_PROBE = """
import json, sys, tracemalloc
from flodl_proto.runner.controller import ReferenceController
ctl = ReferenceController(int(sys.argv[1]), bytes.fromhex(sys.argv[2]), port_mux=True).start()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
print(ctl.port, flush=True)
for line in sys.stdin:
    if line.strip() == "mem":
        cur, peak = tracemalloc.get_traced_memory()
        print(json.dumps([cur - base, peak - base]), flush=True)
    elif line.strip() == "wait":
        out = ctl.wait(45)  # returns as soon as the run ends; a loaded machine is slow
        print(json.dumps(None if out is None else [out.clean, str(out.error)]), flush=True)
ctl.shutdown(timeout=10)
"""

_GIB = 1 << 30
_MIB = 1 << 20


class _MemoryProbe:
    def __init__(self, world_size: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _MEMORY_PROBE, str(world_size),
                                      SALT.hex()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.port = int(self._line())

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "memory probe exited"
        return line

    def ask(self, cmd: str) -> object:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _claim_header(kind: int, payload_len: int) -> bytes:
    return MUX_HEADER.build({"magic": MUX_RECORD_MAGIC, "version": MUX_PROTOCOL_VERSION,
                             "kind": kind, "rank": 0, "payload_len": payload_len,
                             "auth_tag": bytes(8)})


@pytest.mark.timeout(60)
def test_hostile_first_records_claiming_1gib_hold_no_memory() -> None:
    # 8 connections send the data magic and a record header claiming a 1 GiB payload, then stay
    # silent: a first record may only be a Hello, so the claim is rejected from its header
    probe = _MemoryProbe(4)
    socks: list[socket.socket] = []
    try:
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", probe.port), timeout=END)
            s.sendall(encode_channel_magic("data")
                      + _claim_header(RecordKind.CONTROL.value, _GIB))
            socks.append(s)
        outcome = probe.ask("wait")
        assert isinstance(outcome, list)
        clean, error = outcome
        assert not clean
        assert error == (f"cluster_controller: first record claims payload_len {_GIB} "
                         f"(> {max_hello_payload(4)} bytes, the largest legal Hello for the "
                         "world size; kind=0x02); corrupt or hostile peer")
        mem = probe.ask("mem")
        assert isinstance(mem, list)
        assert mem[1] < 4 * _MIB, f"peak {mem[1]} bytes above the baseline"
        assert all(_closed(s) for s in socks)
    finally:
        for s in socks:
            s.close()
        probe.close()


@pytest.mark.timeout(60)
def test_a_record_read_never_holds_two_read_chunks() -> None:
    # an accepted relay claims a 1 GiB HostFrame and sends 16 bytes of it: the reader holds one
    # READ_CHUNK for it, never a second (zero-filled) one beside it
    probe = _MemoryProbe(1)
    try:
        with FakeRelay(probe.port, [0]) as relay:
            relay.expect_hello_ack()
            relay.send_raw(_claim_header(RecordKind.HOST_FRAME.value, _GIB) + bytes(16))
            deadline = time.monotonic() + 20
            mem = probe.ask("mem")
            assert isinstance(mem, list)
            while mem[0] < READ_CHUNK and time.monotonic() < deadline:
                time.sleep(0.05)
                mem = probe.ask("mem")
                assert isinstance(mem, list)
            assert mem[0] >= READ_CHUNK, f"current {mem[0]} bytes: the chunk was never grown"
            assert mem[1] < READ_CHUNK + 8 * _MIB, f"peak {mem[1]} bytes above the baseline"
    finally:
        probe.close()


def _closed(sock: socket.socket) -> bool:
    """True when the peer closed ``sock`` (end of stream or reset) before the deadline."""
    sock.settimeout(END)
    try:
        return sock.recv(16) == b""
    except (ConnectionResetError, ConnectionAbortedError):
        return True
    except TimeoutError:
        return False


def _http_get_raw(port: int, path: str) -> bytes:
    """The whole HTTP response to ``GET path`` (the responder closes after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=END) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def _http_get(port: int, path: str) -> tuple[str, dict[str, object]]:
    head, _, body = _http_get_raw(port, path).partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


@pytest.mark.timeout(30)
def test_get_status_answers_during_a_run(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(2, port_mux=True)
    with FakeRelay(ctl.port, [0, 1], host="node-a") as relay:
        relay.expect_hello_ack()
        relay.send_host_frame(frame([2.0, 4.0], weight=2.0))
        relay.read_broadcast()
        line, st = _http_get(ctl.port, "/status")
        assert line == "HTTP/1.1 200 OK"
        assert st["state"] == "Reducing" and st["world_size"] == 2
        assert st["rounds_reduced"] == 1 and st["dead_ranks"] == []
        relays = st["relays"]
        assert isinstance(relays, list) and relays[0]["host"] == "node-a"
        assert relays[0]["ranks"] == [0, 1]
        assert isinstance(st["bytes_in"], int) and st["bytes_in"] > 0
        assert isinstance(st["bytes_out"], int) and st["bytes_out"] > 0
        last = st["last_round"]
        assert isinstance(last, dict) and last["round"] == 1 and "ms" in last
        line404, _ = _http_get(ctl.port, "/nope")
        assert line404.startswith("HTTP/1.1 404")
        raw = _http_get_raw(ctl.port, "/status")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert f"Content-Length: {len(body)}".encode() in head.split(b"\r\n")
        assert body.endswith(b"}\n") and body.count(b"\n") == 1  # one line, ended
        relay.rank_exit(1)
        assert ctl.wait(END) is not None


@pytest.mark.timeout(30)
def test_connection_after_coverage_is_closed(controller_factory) -> None:  # type: ignore[no-untyped-def]
    ctl = controller_factory(1, port_mux=True)
    with FakeRelay(ctl.port, [0]) as a:
        a.expect_hello_ack()
        try:
            late = FakeRelay(ctl.port, [0])
        except ConnectionError:  # dropped by the port mux before its Hello was written
            pass
        else:
            with late:
                assert late.at_eof()
        a.send_host_frame(frame([1.0]))
        assert values(a.read_broadcast()) == [1.0]


@pytest.mark.timeout(30)
def test_checkpoint_and_outer_optimizer(controller_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from flodl_proto.reduce import SlowMomentum

    ctl = controller_factory(1, outer=SlowMomentum(0.5, 0.9), checkpoint_dir=tmp_path)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        control = frame([1.0], kind=RoundKind.CONTROL, weight=0.0)
        stepped = []
        for params in ([1.0, 2.0], [0.5, 1.0]):
            relay.send_host_frame(control)
            relay.read_broadcast()
            relay.send_host_frame(frame(params, weight=1.0))
            stepped.append(values(relay.read_broadcast()))
            relay.send_host_frame(frame([9.0], weight=1.0))  # buffers pass through
            assert values(relay.read_broadcast()) == [9.0]
        # SlowMomentum(lr 0.5, mu 0.9): the first window anchors prev_global on the consensus;
        # then g = [1,2] - [0.5,1] = [0.5,1], v = g, new = [1,2] - 0.5 v
        assert stepped == [[1.0, 2.0], [0.75, 1.5]]
        relay.rank_exit(0)
        assert ctl.wait(END) is not None
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["consensus-000000.npz", "consensus-000001.npz"]
    with np.load(tmp_path / "consensus-000000.npz") as z:
        assert sorted(z.files) == ["b0", "p0"]
        assert z["p0"].dtype == np.float32 and list(z["p0"]) == [1.0, 2.0]
        assert list(z["b0"]) == [9.0]
    with np.load(tmp_path / "consensus-000001.npz") as z:
        assert list(z["p0"]) == [0.75, 1.5]  # the stepped global is what is checkpointed


# -- CLI ------------------------------------------------------------------------------------
SALT_HEX = SALT.hex()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    e = dict(os.environ)
    e.pop("FLODL_SESSION_SALT", None)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "flodl_proto.cli", "controller", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def _first_line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    return p.stdout.readline().rstrip("\n")


@pytest.mark.timeout(60)
def test_cli_first_line_rounds_and_clean_exit() -> None:
    p = _cli("--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX)
    try:
        line = _first_line(p)
        assert line.startswith("listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        assert port != 0
        with FakeRelay(port, [0], host="cli-host") as relay:
            relay.expect_hello_ack()
            relay.send_host_frame(frame([1.0, 3.0], weight=2.0))
            assert values(relay.read_broadcast()) == [0.5, 1.5]
            relay.rank_exit(0)
            out, err = p.communicate(timeout=20)
    finally:
        p.kill() if p.poll() is None else None
    assert p.returncode == 0, err
    assert "relay 0 joined: host 'cli-host' ranks [0]" in out
    assert out.splitlines()[-1] == ("controller finished: clean (rank_exit: rank 0 of relay "
                                    "cli-host (ranks 0) exited: run ends cleanly, as flodl does)")
    assert "round 1: kind model weight 2 bytes" in out


@pytest.mark.timeout(60)
def test_cli_sigterm_is_a_clean_exit_and_salt_from_env_and_file(tmp_path: Path) -> None:
    p = _cli("--listen", "127.0.0.1:0", "--world-size", "2",
             env={"FLODL_SESSION_SALT": SALT_HEX})
    try:
        assert _first_line(p).startswith("listening on 127.0.0.1:")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill() if p.poll() is None else None
    assert p.returncode == 0, err
    assert err == "" and out.splitlines()[-1] == "controller finished: clean (stop: signal)"
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT_HEX + "\n")
    q = _cli("--listen", "127.0.0.1:0", "--world-size", "2", "--salt-file", str(salt_file),
             "--no-port-mux")
    try:
        assert _first_line(q).startswith("listening on 127.0.0.1:")
        q.send_signal(signal.SIGINT)
        q.communicate(timeout=20)
    finally:
        q.kill() if q.poll() is None else None
    assert q.returncode == 0


@pytest.mark.timeout(60)
def test_cli_failure_exits_1() -> None:
    p = _cli("--listen", "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX, "--no-port-mux")
    try:
        port = int(_first_line(p).rsplit(":", 1)[1])
        with FakeRelay(port, [0], salt=bytes(16)):  # a Hello signed with another salt
            _, err = p.communicate(timeout=20)
    finally:
        p.kill() if p.poll() is None else None
    assert p.returncode == 1
    assert err.startswith("flodl-proto controller: error: connection 0 (before its Hello): "
                          "relay_mux: HMAC verification failed")
    assert err.count("\n") == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", [
    (["--world-size", "0", "--salt", SALT_HEX], "world-size"),
    (["--world-size", "2"], "no session salt"),
    (["--world-size", "2", "--salt", "abcd"], "32 hex digits"),
    (["--world-size", "2", "--salt", SALT_HEX, "--outer", "adam"], "--outer"),
], ids=["world-size-0", "missing-salt", "bad-salt", "bad-outer"])
def test_cli_usage_errors_exit_2(args: list[str], needle: str) -> None:
    p = _cli("--listen", "127.0.0.1:0", *args)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


_FAULTY_CLI = """
import sys
from flodl_proto.fsm.events import SendKind
from flodl_proto.runner.controller import ReferenceController
real = ReferenceController._send
def send(self, send, now):
    if send.kind is SendKind.BROADCAST:
        raise RuntimeError("scatter exploded")
    return real(self, send, now)
ReferenceController._send = send
from flodl_proto.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(60)
def test_cli_unexpected_failure_is_one_line_exit_1() -> None:
    p = subprocess.Popen([sys.executable, "-c", _FAULTY_CLI, "controller", "--listen",
                          "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(_first_line(p).rsplit(":", 1)[1])
        with FakeRelay(port, [0]) as relay:
            relay.expect_hello_ack()
            relay.send_host_frame(frame([1.0], weight=1.0))
            _, err = p.communicate(timeout=20)
    finally:
        p.kill() if p.poll() is None else None
    assert p.returncode == 1
    assert err == ("flodl-proto controller: error: the controller failed unexpectedly in the "
                   "coordinator: RuntimeError: scatter exploded\n")


@pytest.mark.timeout(60)
def test_cli_port_in_use_exits_1() -> None:
    """A port in use is the environment's failure (exit 1, as a failed run), not a usage error
    (2): the command line was right."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        p = _cli("--listen", f"127.0.0.1:{port}", "--world-size", "1", "--salt", SALT_HEX)
        out, err = p.communicate(timeout=20)
    assert p.returncode == 1 and out == ""
    # the option named, as the relay's line names --listen-port
    assert err == (f"flodl-proto controller: error: cannot listen on 127.0.0.1:{port} "
                   f"(--listen): {os.strerror(errno.EADDRINUSE)}\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "code", "error"), [
    ("noname", 2, "argument --listen: 'nosuch.invalid:7000': cannot resolve host "
                  "'nosuch.invalid': "
                  "Name or service not known"),
    ("again", 1, "cannot listen on nosuch.invalid:7000 (--listen): Temporary failure in name "
                 "resolution"),
])
def test_cli_listen_host_lookup_failure_is_usage_or_environment(mode: str, code: int,
                                                                error: str) -> None:
    """A ``--listen`` host name the resolver says does not exist is the command line's error
    (exit 2, as ``relay --controller``'s); a resolver that cannot answer now is the
    environment's (1), as an address that cannot be bound. The resolver is a stub."""
    p = subprocess.run([sys.executable, "-c", PATCHED_CLI, mode, "controller", "--listen",
                        "nosuch.invalid:7000", "--world-size", "1", "--salt", SALT_HEX],
                       capture_output=True, text=True, timeout=30)
    assert (p.returncode, p.stdout) == (code, "")
    assert p.stderr == f"flodl-proto controller: error: {error}\n"


#: the address-space limit the largest-world test runs the controller under: a per-rank list of
#: 2**32 - 1 entries (32 GiB) would not fit, Python with NumPy and the controller's threads does
_WORLD_TEST_AS_LIMIT = 2 << 30


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_WORLD_TEST_AS_LIMIT, _WORLD_TEST_AS_LIMIT))


@pytest.mark.timeout(90)
def test_cli_the_largest_world_starts_in_bounded_memory_and_stops_cleanly() -> None:
    """``--world-size 4294967295`` (the u32 maximum the CLI accepts) under a 2 GiB address-space
    limit: the controller starts, accepts a relay carrying the first and the last rank, waits for
    the others as for any world whose relays have not all arrived, and SIGTERM ends it cleanly."""
    world = 2**32 - 1
    e = {k: v for k, v in os.environ.items() if k != "FLODL_SESSION_SALT"}
    e["OPENBLAS_NUM_THREADS"] = "1"  # NumPy's BLAS threads reserve address space of their own
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto.cli", "controller", "--listen",
                          "127.0.0.1:0", "--world-size", str(world), "--salt", SALT_HEX],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                         preexec_fn=_limit_address_space)
    try:
        line = _first_line(p)
        assert line.startswith("listening on 127.0.0.1:"), p.communicate(timeout=20)
        port = int(line.rsplit(":", 1)[1])
        with FakeRelay(port, [0, world - 1], host="edge") as relay:
            relay.expect_hello_ack()
            assert p.stdout is not None
            assert p.stdout.readline() == f"relay 0 joined: host 'edge' ranks [0, {world - 1}]\n"
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
    finally:
        p.kill() if p.poll() is None else None
    assert p.returncode == 0, err
    assert out == "controller finished: clean (stop: signal)\n"
    # a loaded machine may reach the accept-phase note (every 10 s): it lists 16 ranks at most
    notes = {f"still waiting for relays to announce {world} of {world} rank(s): "
             + ", ".join(map(str, range(16))) + " ...",
             f"still waiting for relays to announce {world - 2} of {world} rank(s): "
             + ", ".join(map(str, range(1, 17))) + " ..."}
    for ln in err.splitlines():
        assert ln.split("controller: ", 2)[-1] in notes, err


#: rounds the unread-stdout test runs: far more lines than a 4 KiB pipe and the controller's
#: backlog hold together
_UNREAD_ROUNDS = 600


@pytest.mark.timeout(120)
def test_cli_rounds_go_on_while_nobody_reads_stdout() -> None:
    """A pipe nobody reads fills (here shrunk to one page, 4 KiB); the round lines then wait in
    the controller's bounded backlog or are dropped and counted, and every round still completes.
    Once the pipe is read, the controller ends cleanly: the lines written plus the ones the
    warning counts are one per relay joined and per round."""
    from flodl_proto.commands.controller import STDOUT_BACKLOG

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    e = {k: v for k, v in os.environ.items() if k != "FLODL_SESSION_SALT"}
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto.cli", "controller", "--listen",
                          "127.0.0.1:0", "--world-size", "1", "--salt", SALT_HEX],
                         stdout=write_end, stderr=subprocess.PIPE, text=True, env=e)
    os.close(write_end)
    with os.fdopen(read_end, "rb", buffering=0) as out:
        try:
            first = b""
            while not first.endswith(b"\n"):  # the first line only, byte by byte
                first += out.read(1)
            assert first.startswith(b"listening on 127.0.0.1:")
            port = int(first.decode().rsplit(":", 1)[1])
            with FakeRelay(port, [0]) as relay:
                relay.expect_hello_ack()
                for k in range(_UNREAD_ROUNDS):
                    relay.send_host_frame(frame([float(k)], weight=1.0))
                    assert values(relay.read_broadcast()) == [float(k)]
                relay.rank_exit(0)
                rest = out.read()  # now stdout is read: the controller can finish
                assert p.wait(timeout=60) == 0
            assert p.stderr is not None
            err = p.stderr.read()
        finally:
            p.kill() if p.poll() is None else None
    lines = rest.decode().splitlines()
    assert lines[-1].startswith("controller finished: clean")
    progress = lines[:-1]
    assert sum(ln.startswith("relay 0 joined") for ln in progress) <= 1
    assert all(ln.startswith(("relay 0 joined", "round ")) for ln in progress), progress[:3]
    warning = err.strip().splitlines()
    assert len(warning) == 1, err
    prefix = "flodl-proto controller: warning: "
    assert warning[0].startswith(prefix), err
    assert warning[0].endswith(" progress lines dropped: stdout was not read fast enough")
    dropped = int(warning[0][len(prefix):].split()[0])
    assert len(progress) + dropped == 1 + _UNREAD_ROUNDS
    # at most: the backlog, the line being written and what the pipe held
    assert len(progress) <= STDOUT_BACKLOG + 1 + 4096 // min(len(ln) + 1 for ln in progress)


def test_hello_model_is_used() -> None:
    # keeps the fake relay honest: a version-2 Hello has no model_sigs
    assert Hello("h", [0]).model_sigs == ()


@pytest.mark.timeout(30)
def test_shutdown_joins_every_thread_and_closes_every_socket() -> None:
    import threading

    before = {t.ident for t in threading.enumerate()}
    ctl = ReferenceController(2, SALT).start()  # port mux
    relay = FakeRelay(ctl.port, [0])
    relay.expect_hello_ack()
    _http_get(ctl.port, "/status")
    out = ctl.shutdown(timeout=10)
    assert out.clean and out.reason == "stop"
    assert relay.at_eof()
    relay.close()
    leftover = [t for t in threading.enumerate() if t.ident not in before]
    assert leftover == [], leftover
    assert not any(t.daemon for t in threading.enumerate() if t.name.startswith("flodl-"))
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ctl.port), timeout=1).close()
    assert ctl.shutdown() is out and ctl.wait(0) is out


@pytest.mark.timeout(30)
def test_a_small_round_starts_no_thread_and_skips_the_writer(
        controller_factory, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The small-frame path: the inner-frame MAC of a small HostFrame is computed on the reading
    thread (no MAC worker is started), and the Broadcast is written by the thread that completed
    the round, not handed to the connection's writer."""
    import threading

    writer_calls: list[int] = []
    real_send_all = conn_mod.send_all

    def send_all(sock: socket.socket, buffers: Any, **kw: Any) -> int:
        writer_calls.append(len(buffers))
        return real_send_all(sock, buffers, **kw)

    monkeypatch.setattr(conn_mod, "send_all", send_all)
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        for k in range(3):
            relay.send_host_frame(frame([float(k)], weight=1.0))
            assert values(relay.read_broadcast()) == [float(k)]
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith("flodl-controller-mac")], names
        assert writer_calls == []


@pytest.mark.timeout(30)
def test_a_thread_is_visible_to_teardown_only_once_started(
        controller_factory, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The accept loop can still open a connection while the coordinator tears down, and
    joining a thread that was never started raises: a connection's writer is published on the
    connection only after it starts, and a reader or status responder is added to the joined
    threads and started under one lock hold."""
    seen: list[tuple[str, bool]] = []
    ctl = None
    start = threading.Thread.start

    def watched_start(self: threading.Thread) -> None:
        if ctl is not None and self.name.startswith("flodl-controller-write"):
            seen.append(("writer", any(c.writer is self for c in list(ctl._conns.values()))))
        elif ctl is not None and self.name.startswith(("flodl-controller-relay",
                                                       "flodl-controller-status")):
            seen.append((self.name.split("-")[2].rstrip("0123456789"), ctl._lock.locked()))
        start(self)

    monkeypatch.setattr(threading.Thread, "start", watched_start)
    ctl = controller_factory(1, port_mux=True)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        assert _http_get(ctl.port, "/status")[0].startswith("HTTP/1.1 200")
        relay.rank_exit(0)
        out = ctl.wait(END)
    assert out is not None and out.clean
    assert sorted(seen) == [("relay", True), ("status", True), ("writer", False)]


@pytest.mark.parametrize(("request_line", "code", "error"), [
    ("GET /nope HTTP/1.1", "404 Not Found", "no such resource '/nope'; try GET /status"),
    ("GET /status", "200 OK", None),  # HTTP/0.9's form: no version
    # the path or method of a request head of up to 8 KiB was echoed whole
    ("GET /" + "a" * 5000 + " HTTP/1.1", "404 Not Found",
     f"no such resource '/{'a' * 39}...{'a' * 20}' (5001 characters); try GET /status"),
    ("POST /status HTTP/1.1", "405 Method Not Allowed", "'POST' is not served"),
    # a malformed request line read as a path: "no such resource 'HTTP/1.0'"
    ("GET  HTTP/1.0", "400 Bad Request",
     "malformed request line 'GET  HTTP/1.0': the path 'HTTP/1.0' does not start with /; try "
     "GET /status"),
    ("GET", "400 Bad Request", "malformed request line 'GET': no path; try GET /status"),
    ("", "400 Bad Request", "malformed request line '': no method; try GET /status"),
    ("GET /status FTP", "400 Bad Request",
     "malformed request line 'GET /status FTP': 'FTP' where the HTTP version goes; try GET "
     "/status"),
    ("POST  HTTP/1.1", "400 Bad Request",
     "malformed request line 'POST  HTTP/1.1': the path 'HTTP/1.1' does not start with /; try "
     "GET /status"),
    ("GET /status extra HTTP/1.1", "400 Bad Request",
     "malformed request line 'GET /status extra HTTP/1.1': 4 words, not METHOD PATH "
     "HTTP/VERSION; try GET /status"),
    ("GET /" + "a" * 5000 + " b HTTP/1.1", "400 Bad Request",
     f"malformed request line 'GET /{'a' * 35}...{'a' * 9} b HTTP/1.1' (5016 characters): 4 "
     "words, not METHOD PATH HTTP/VERSION; try GET /status"),
    # the asterisk-form is OPTIONS' only; an absolute URL is well formed, but not served
    ("GET * HTTP/1.1", "400 Bad Request",
     "malformed request line 'GET * HTTP/1.1': the path '*' does not start with /; try GET "
     "/status"),
    ("GET http://h/status HTTP/1.1", "404 Not Found",
     "no such resource 'http://h/status'; try GET /status"),
    # whitespace-delimited words (RFC 9112 3): a trailing or doubled space is taken
    ("GET /status HTTP/1.1 ", "200 OK", None),
    ("GET  /status HTTP/1.1", "200 OK", None),
    ("GET /status\tHTTP/1.1", "200 OK", None),
])
def test_status_responder_names_what_it_does_not_serve(
        request_line: str, code: str, error: str | None) -> None:
    from flodl_proto.runner.status_http import serve_status

    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(f"{request_line}\r\nHost: x\r\n\r\n".encode())
        serve_status(ours, "peer", lambda: {"state": "Reducing"})
        data = b""
        while chunk := theirs.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].decode() == f"HTTP/1.1 {code}"
    assert json.loads(body) == ({"state": "Reducing"} if error is None else {"error": error})


# -- error lines in words -------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_a_failed_broadcast_write_is_logged_in_words(
        controller_factory, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
        caplog: pytest.LogCaptureFixture) -> None:
    """A connection writer's failed write gave Python's text ('[Errno 32] Broken pipe') to its
    log line and to the core's, which declares the relay's ranks dead: now the reason only."""
    # the socket takes nothing without waiting: the Broadcast goes to the connection's writer
    monkeypatch.setattr(conn_mod, "_write_direct",
                        lambda sock, buffers, nbytes: [memoryview(b) for b in buffers])
    real_send_all = conn_mod.send_all

    def send_all(sock: socket.socket, buffers: Any, **kw: Any) -> int:
        if bytes(memoryview(buffers[0])[8:9]) == bytes([RecordKind.BROADCAST.value]):
            raise OSError(errno.EPIPE, os.strerror(errno.EPIPE))
        return real_send_all(sock, buffers, **kw)

    monkeypatch.setattr(conn_mod, "send_all", send_all)
    caplog.set_level(logging.WARNING, logger="flodl_proto")
    ctl = controller_factory(1)
    with FakeRelay(ctl.port, [0]) as relay:
        relay.expect_hello_ack()
        relay.send_host_frame(frame([1.0], weight=1.0))
        out = ctl.wait(END)
        assert out is not None and out.reason == "all_dead"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["controller: Broadcast write to connection 0 failed: Broken pipe",
                     "controller: consensus broadcast to relay fake (ranks 0) failed (Broken "
                     "pipe); declaring its ranks dead and continuing with survivors"]


def test_a_failed_checkpoint_is_logged_in_words(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The checkpoint writer's error line gave Python's text ('[Errno 28] No space left on
    device: '/ckpt/consensus-000003.npz.tmp''): now the folder and the reason in words."""
    from types import SimpleNamespace

    from flodl_proto.runner import controller as controller_mod

    def full(directory: Path, w: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                      str(directory / "consensus-000003.npz.tmp"))

    monkeypatch.setattr(controller_mod, "write_checkpoint", full)
    ctl = ReferenceController(1, SALT, checkpoint_dir=tmp_path)
    ctl._ckpt_queue.put(SimpleNamespace(window=3))  # type: ignore[arg-type]
    ctl._ckpt_queue.put(None)
    with caplog.at_level(logging.ERROR, logger="flodl_proto"):
        ctl._checkpoint_loop()
    assert [r.getMessage() for r in caplog.records] == [
        f"controller: checkpoint of window 3 in {tmp_path} failed: No space left on device"]


def test_a_start_that_fails_leaves_the_controller_as_never_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that raises (a port in use, a host that does not resolve, a checkpoint folder
    that cannot be made) leaves nothing open and the controller as if never started:
    ``shutdown`` returns the "never started" outcome at once, where it raised AssertionError
    after a failed bind and waited out its whole timeout (for ever without one) after a failed
    look-up, and ``start`` may be called again (it then runs)."""
    def resolve_nothing(*_a: Any, **_k: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        in_use = busy.getsockname()[1]
        blocker = tmp_path / "f"
        blocker.write_text("x")
        cases = [(ReferenceController(2, SALT, port=in_use), None, OSError),
                 (ReferenceController(2, SALT), resolve_nothing, socket.gaierror),
                 (ReferenceController(2, SALT, checkpoint_dir=blocker / "ck"), None,
                  NotADirectoryError)]
        for ctl, getaddrinfo, error in cases:
            with monkeypatch.context() as m:
                if getaddrinfo is not None:
                    m.setattr(socket, "getaddrinfo", getaddrinfo)
                with pytest.raises(error):
                    ctl.start()
            assert ctl.wait(0.0) is None
            t0 = time.monotonic()
            out = ctl.shutdown(5.0)
            assert time.monotonic() - t0 < 1.0
            assert (out.clean, out.reason, out.error, out.detail) == (True, "stop", None,
                                                                       "never started")
        # a start that failed can be made again once the cause is gone
        again = ReferenceController(2, SALT, port=in_use)
        with pytest.raises(OSError):
            again.start()
    again.start()  # the port is free now
    try:
        assert again.port == in_use and again.wait(0.0) is None
    finally:
        assert again.shutdown(5.0).clean

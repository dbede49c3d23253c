"""The Relay against a scripted controller: upstream's relay behaviours (relay/agent_tests.rs)
and its failure modes."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flodl_proto.codec import (
    DeclareDead,
    Dtype,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    TensorPayload,
    encode_channel_magic,
    encode_round_frame_bytes,
)
from flodl_proto.commands.relay import _why_failed
from flodl_proto.errors import (
    AuthenticationError,
    BadMagic,
    InvalidValue,
    SchemaMismatch,
    SequenceError,
    TruncatedInput,
    VersionMismatch,
)
from flodl_proto.fsm.lifecycle import Outcome
from flodl_proto.runner.controller import ReferenceController
from flodl_proto.runner.rank import RankClient
from flodl_proto.runner.relay import Relay, default_relay_port

from .cluster_util import (
    OTHER_SALT,
    SALT,
    ControllerConn,
    FakeController,
    RawRank,
    frame,
    in_thread,
    leak_guard,
    read_to_eof,
    values,
    wait_until,
)
from .spec_util import spec_with_constant

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    with leak_guard():
        yield


def _connect(relay: Relay, rank: int, world: int, version: int = 2,
             salt: bytes = SALT) -> RankClient:
    return RankClient.connect(relay.address, rank, world, salt, version)


def _start(ctrl: FakeController, ranks: list[int], world: int, version: int = 2,
           host: str = "h0") -> Relay:
    return Relay(ctrl.address, ranks, world, SALT, version=version, listen_port=0,
                 host=host).start()


def _connect_all(relay: Relay, ranks: list[int], world: int,
                 version: int = 2) -> list[RankClient]:
    """Connect every rank concurrently (the relay accepts them one after the other)."""
    jobs = [in_thread(_connect, relay, r, world, version) for r in ranks]
    out = []
    for t, res in jobs:
        t.join()
        if "error" in res:
            raise res["error"]
        out.append(res["result"])
    return out


def _run_to_the_end(ctl: ReferenceController, relay: Relay, ranks: list[int], world: int
                    ) -> tuple[BaseException | None, Outcome | None]:
    """Connect every rank of ``relay`` (``world``: the world size the ranks give), wait up to
    30 s for the relay's and the real controller's ends, then close and stop all three; the
    relay's error and the controller's outcome."""
    clients: list[RankClient] = []
    try:
        clients = _connect_all(relay, ranks, world)
        err = relay.wait(30)
        outcome = ctl.wait(30)
    finally:
        for c in clients:
            c.close()
        relay.shutdown()
        ctl.shutdown(timeout=10)
    return err, outcome


@contextmanager
def _relay_with_clients(ctrl: FakeController, ranks: list[int], world: int
                        ) -> Iterator[tuple[Relay, list[RankClient], ControllerConn]]:
    """A relay for ``ranks`` with every rank connected as a RankClient and the controller's
    side of the handshake done (its Hello checked); the relay is shut down on exit."""
    relay = _start(ctrl, ranks, world)
    try:
        t, res = in_thread(_connect_all, relay, ranks, world)
        conn = ctrl.accept()
        hello = conn.handshake()
        assert hello.control == Hello("h0", ranks)
        t.join()
        if "error" in res:
            raise res["error"]
        yield relay, res["result"], conn
    finally:
        relay.shutdown()


@pytest.mark.parametrize("version", [2, 3])
def test_data_channel_end_to_end_one_rank(version: int) -> None:
    """Magic, Hello (v2: {host, ranks}; v3: + empty model_sigs), a 1-rank fold is the identity
    (the HostFrame carries the rank's frame verbatim), the Broadcast reaches the rank verbatim."""
    with FakeController(version=version) as ctrl:
        relay = _start(ctrl, [0], 1, version)
        try:
            t, res = in_thread(_connect, relay, 0, 1, version)
            conn = ctrl.accept()
            assert conn.read_magic() == bytes.fromhex("e1170df1")
            raw = conn.read_raw_record()
            expected = MuxRecord.control_msg(Hello("h0", [0]), version)
            assert raw[25:] == bytes(expected.payload)
            assert raw[25:] == (b"\x00\x02h0\x01\x00" + (b"\x00" if version == 3 else b""))
            conn.send(MuxRecord.control_msg(HelloAck(), version))
            t.join()
            client = res["result"]
            mine = frame([1.0, -2.5, 3.25], weight=2.0)
            t2, res2 = in_thread(client.all_reduce, mine)
            rec = conn.read_record()
            assert rec is not None and rec.kind is RecordKind.HOST_FRAME
            assert bytes(rec.payload) == encode_round_frame_bytes(mine, SALT)
            consensus = frame([0.5, 1.5, 2.5], weight=2.0)
            payload = conn.broadcast(consensus)
            t2.join()
            assert res2["result"] == consensus
            assert bytes(client.last_reply.raw) == payload
            client.close()
            rec = conn.read_record()
            assert rec is not None and rec.control == RankExit(0)
            assert conn.read_record() is None  # last rank left: upstream closed
            assert relay.wait(10) is None
        finally:
            relay.shutdown()


def test_fold_sums_local_ranks_into_one_host_frame() -> None:
    """[1,2] w3 + [10,20] w1 -> one HostFrame [11,22] w4; the Broadcast reaches both ranks."""
    with FakeController() as ctrl, _relay_with_clients(ctrl, [0, 1], 2) as (relay, (c0, c1), conn):
        j0 = in_thread(c0.all_reduce, frame([1.0, 2.0], weight=3.0))
        j1 = in_thread(c1.all_reduce, frame([10.0, 20.0], weight=1.0))
        rec = conn.read_record()
        assert rec is not None and rec.kind is RecordKind.HOST_FRAME
        host = rec.frame(SALT)
        assert values(host) == [[11.0, 22.0]] and host.weight == 4.0
        payload = conn.broadcast(frame([2.75, 5.5], weight=4.0))
        for t_, r_ in (j0, j1):
            t_.join()
            assert values(r_["result"]) == [[2.75, 5.5]]
        assert bytes(c0.last_reply.raw) == payload == bytes(c1.last_reply.raw)
        c0.close()
        c1.close()
        assert relay.wait(10) is None
        assert relay.stats.host_frames == 1 and relay.stats.broadcasts == 1


def test_rank_exit_folds_the_remainder() -> None:
    """Rank 0 deposited [4] w1.5, rank 1 closes: the relay ships HostFrame [4] w1.5, then
    RankExit{1}; survivors keep flowing; the last rank leaving closes upstream."""
    with FakeController() as ctrl, _relay_with_clients(ctrl, [0, 1], 2) as (relay, (c0, c1), conn):
        j0 = in_thread(c0.all_reduce, frame([4.0], weight=1.5))
        wait_until(lambda: 0 in relay.fold.deposited)
        c1.close()
        first, second = conn.read_record(), conn.read_record()
        assert first is not None and first.kind is RecordKind.HOST_FRAME
        assert values(first.frame(SALT)) == [[4.0]] and first.frame(SALT).weight == 1.5
        assert second is not None and second.control == RankExit(1)
        conn.broadcast(frame([4.0], weight=1.5))
        j0[0].join()
        assert values(j0[1]["result"]) == [[4.0]]
        # the survivor keeps flowing on its own
        j0 = in_thread(c0.all_reduce, frame([7.0], weight=1.0))
        rec = conn.read_record()
        assert rec is not None and values(rec.frame(SALT)) == [[7.0]]
        conn.broadcast(frame([7.0]))
        j0[0].join()
        c0.close()
        rec = conn.read_record()
        assert rec is not None and rec.control == RankExit(0)
        assert conn.read_record() is None
        assert relay.wait(10) is None


def test_declare_dead_unblocks_the_barrier() -> None:
    """Rank 0 deposited [9] w2, rank 1 never does: DeclareDead{1} completes the round; the
    Broadcast goes to rank 0 only."""
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1], 2)
        try:
            t, res = in_thread(_connect, relay, 0, 2)
            raw1 = RawRank(("127.0.0.1", relay.port))
            assert raw1.handshake(1, 2) == bytes.fromhex("c1170df102000000")
            conn = ctrl.accept()
            conn.handshake()
            t.join()
            c0 = res["result"]
            j0 = in_thread(c0.all_reduce, frame([9.0], weight=2.0))
            wait_until(lambda: 0 in relay.fold.deposited)
            conn.declare_dead(1)
            rec = conn.read_record()
            assert rec is not None and rec.kind is RecordKind.HOST_FRAME
            assert values(rec.frame(SALT)) == [[9.0]] and rec.frame(SALT).weight == 2.0
            conn.broadcast(frame([9.0], weight=2.0))
            j0[0].join()
            assert values(j0[1]["result"]) == [[9.0]]
            # a frame from the dead rank is dropped (no HostFrame for it)
            raw1.send_frame(frame([100.0]))
            conn.close()  # controller gone: the relay ends and closes its ranks
            assert relay.wait(10) is None
            assert read_to_eof(raw1.sock) == b""  # rank 1 never got a broadcast
            raw1.close()
            c0.close()
        finally:
            relay.shutdown()


def test_shuts_down_on_upstream_eof() -> None:
    """The controller closing ends the relay cleanly; its ranks see end of stream."""
    with FakeController() as ctrl, _relay_with_clients(ctrl, [0, 1], 2) as (relay, (c0, c1), conn):
        j0 = in_thread(c0.all_reduce, frame([1.0]))
        conn.close()
        assert relay.wait(10) is None
        j0[0].join()
        err = j0[1]["error"]
        assert isinstance(err, TruncatedInput) and "closed connection before" in str(err)
        with pytest.raises(TruncatedInput):
            c1.all_reduce(frame([1.0]))
        c0.close()
        c1.close()


@pytest.mark.parametrize(("relay_version", "rank_version"), [(2, 3), (3, 2)])
def test_rank_speaking_the_other_version_is_rejected(relay_version: int,
                                                     rank_version: int) -> None:
    with FakeController(version=relay_version) as ctrl:
        relay = _start(ctrl, [0], 1, relay_version)
        try:
            with pytest.raises(TruncatedInput, match="handshake ack read failed"):
                _connect(relay, 0, 1, rank_version)
            err = relay.wait(10)
            assert isinstance(err, VersionMismatch)
            assert str(err).startswith(
                f"cluster_controller: handshake protocol_version {rank_version} != "
                f"{relay_version}")
        finally:
            relay.shutdown()


def test_world_size_disagreement_is_rejected_on_the_wire() -> None:
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1], 2)
        try:
            with pytest.raises(TruncatedInput, match="handshake ack read failed"):
                RankClient.connect(relay.address, 0, 3, SALT)
            err = relay.wait(10)
            assert isinstance(err, InvalidValue) and "world_size 3 != expected 2" in str(err)
        finally:
            relay.shutdown()
        # the CLI's line names the address the handshake came from (it did not)
        relay = _start(ctrl, [0, 1], 2)
        raw = RawRank(relay.address)
        try:
            host, port = raw.sock.getsockname()[:2]
            assert raw.handshake(0, 3) == b""
            err = relay.wait(10)
            assert err is not None and err.__notes__ == [
                f"the rank connecting from {host}:{port}"]
            assert _why_failed(err).endswith(
                f"world_size 3 != expected 2 (the rank connecting from {host}:{port})")
        finally:
            raw.close()
            relay.shutdown()


def test_a_relay_with_a_larger_world_size_than_the_controller_s_is_refused_by_both() -> None:
    """The relay's world size is not on the wire (Hello carries the host's ranks only): the
    controller sees the mismatch only as a rank at or beyond its own world size, and ends the
    run with upstream's error naming that rank and its world size; the relay, refused before
    HelloAck, names --world-size among the likely causes. (A mismatch whose ranks all fall
    inside the controller's world size cannot be seen by either side: a smaller relay world
    size leaves the controller waiting for the ranks it names, a larger one runs as upstream
    does.)"""
    ctl = ReferenceController(2, SALT).start()
    relay = Relay(ctl.address, [0, 1, 2], 3, SALT, listen_port=0, host="h0").start()
    err, outcome = _run_to_the_end(ctl, relay, [0, 1, 2], 3)  # 3: the relay's world size
    assert outcome is not None and not outcome.clean and isinstance(outcome.error, InvalidValue)
    assert str(outcome.error) == "cluster_controller: relay announced rank 2 >= world_size 2"
    assert isinstance(err, TruncatedInput) and err.error_id == "relay.closed_before_helloack"
    assert _why_failed(err).endswith(
        "a rank outside the controller's world size, or a frame ceiling below 8 bytes (check "
        "--protocol-version, --world-size and the salt on both sides, and the controller's "
        "--frame-ceiling)")


def test_rank_outside_the_host_set_is_rejected() -> None:
    """Upstream acks before checking the set; the relay then fails and closes the rank."""
    with FakeController() as ctrl:
        relay = _start(ctrl, [0], 2)
        try:
            client = _connect(relay, 1, 2)
            err = relay.wait(10)
            assert isinstance(err, InvalidValue)
            assert str(err).startswith("relay: rank 1 connected but is not in this host's rank")
            with pytest.raises(TruncatedInput):
                client.all_reduce(frame([1.0]))
            client.close()
        finally:
            relay.shutdown()


def test_duplicate_rank_is_rejected() -> None:
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1], 2)
        try:
            a = _connect(relay, 0, 2)
            b = _connect(relay, 0, 2)
            err = relay.wait(10)
            assert isinstance(err, InvalidValue)
            assert str(err) == "relay: duplicate rank 0 connected on loopback"
            a.close()
            b.close()
        finally:
            relay.shutdown()


def _two_rank_relay(ctrl: FakeController, version: int = 2
                    ) -> tuple[Relay, RawRank, RawRank, ControllerConn]:
    relay = _start(ctrl, [0, 1], 2, version)
    r0 = RawRank(("127.0.0.1", relay.port))
    r0.handshake(0, 2, version)
    r1 = RawRank(("127.0.0.1", relay.port))
    r1.handshake(1, 2, version)
    conn = ctrl.accept()
    conn.handshake()
    return relay, r0, r1, conn


def test_double_deposit_is_fatal() -> None:
    with FakeController() as ctrl:
        relay, r0, r1, _conn = _two_rank_relay(ctrl)
        try:
            r0.send_frame(frame([1.0]))
            r0.send_frame(frame([1.0]))
            err = relay.wait(10)
            assert isinstance(err, SequenceError) and "deposited twice" in str(err)
            assert r0.read_reply() is None and r1.read_reply() is None
        finally:
            relay.shutdown()
            r0.close()
            r1.close()


def test_dtype_mix_is_fatal() -> None:
    with FakeController() as ctrl:
        relay, r0, r1, _conn = _two_rank_relay(ctrl)
        try:
            r0.send_frame(frame([1.0, 2.0]))
            wait_until(lambda: 0 in relay.fold.deposited)
            r1.send_frame(frame([1.0, 2.0], dtype=Dtype.BF16))
            err = relay.wait(10)
            assert isinstance(err, SchemaMismatch)
            assert "dtype" in str(err) and "bf16_wire" in str(err)
        finally:
            relay.shutdown()
            r0.close()
            r1.close()


def test_frame_with_another_salt_is_fatal() -> None:
    with FakeController() as ctrl:
        relay, r0, r1, _conn = _two_rank_relay(ctrl)
        try:
            r0.send_frame(frame([1.0]), salt=OTHER_SALT)
            err = relay.wait(10)
            assert isinstance(err, AuthenticationError)
            assert "HMAC verification failed" in str(err)
            # the CLI's line says whose frame it was (it did not)
            assert err.__notes__ == ["local rank 0's frame"]
            assert _why_failed(err) == f"{str(err).splitlines()[0]} (local rank 0's frame)"
        finally:
            relay.shutdown()
            r0.close()
            r1.close()


def test_v2_fold_rejects_an_elided_deposit() -> None:
    """Version 2 has no elision: a second, elided deposit fails the byte-count check."""
    with FakeController() as ctrl:
        relay, r0, r1, _conn = _two_rank_relay(ctrl)
        try:
            r0.send_frame(frame([1.0, 2.0]))
            wait_until(lambda: 0 in relay.fold.deposited)
            r1.send_frame(frame(TensorPayload.elide(Dtype.F32, [2]), weight=0.0))
            err = relay.wait(10)
            assert isinstance(err, SchemaMismatch) and "payload byte count 0" in str(err)
        finally:
            relay.shutdown()
            r0.close()
            r1.close()


def test_upstream_record_with_another_salt_is_fatal() -> None:
    with FakeController() as ctrl:
        relay, r0, r1, conn = _two_rank_relay(ctrl)
        try:
            conn.broadcast(frame([1.0]), salt=OTHER_SALT)
            err = relay.wait(10)
            assert isinstance(err, AuthenticationError)
            assert str(err).startswith("relay_mux: HMAC verification failed")
        finally:
            relay.shutdown()
            r0.close()
            r1.close()


def test_controller_closing_before_helloack() -> None:
    with FakeController() as ctrl:
        relay = _start(ctrl, [0], 1)
        try:
            client = _connect(relay, 0, 1)
            conn = ctrl.accept()
            conn.read_magic()
            conn.read_record()
            conn.close()
            err = relay.wait(10)
            assert isinstance(err, TruncatedInput)
            assert str(err) == (
                "relay: controller closed connection before HelloAck; it may have refused this "
                "relay's Hello (a 6-byte payload) for another protocol version or salt, a "
                "rank outside the controller's world size, or a frame ceiling below 6 bytes")
            client.close()
        finally:
            relay.shutdown()


def test_a_controller_ceiling_below_the_hello_is_named_by_the_relay() -> None:
    """A real controller whose frame ceiling (44 bytes: above the 25-byte floor) is below the
    relay's Hello (a 40-byte host name and two ranks: a 45-byte payload) refuses the Hello and
    closes; the relay's error names the Hello's size, the number the controller's own error
    compares with its ceiling."""
    ctl = ReferenceController(2, SALT, ceiling=44).start()
    relay = Relay(ctl.address, [0, 1], 2, SALT, listen_port=0, host="h" * 40).start()
    err, outcome = _run_to_the_end(ctl, relay, [0, 1], 2)
    assert isinstance(err, TruncatedInput) and err.remote
    assert (err.error_id, err.fields) == ("relay.closed_before_helloack", {"hello_bytes": 45})
    assert str(err) == ("relay: controller closed connection before HelloAck; it may have "
                        "refused this relay's Hello (a 45-byte payload) for another protocol "
                        "version or salt, a rank outside the controller's world size, or a "
                        "frame ceiling below 45 bytes")
    assert outcome is not None and not outcome.clean
    assert outcome.error is not None and outcome.error.error_id == "mux.payload_too_large"
    assert (outcome.error.fields["length"], outcome.error.fields["ceiling"]) == (45, 44)


def test_controller_answering_something_else_than_helloack() -> None:
    with FakeController() as ctrl:
        relay = _start(ctrl, [0], 1)
        try:
            client = _connect(relay, 0, 1)
            conn = ctrl.accept()
            conn.read_magic()
            conn.read_record()
            conn.send(MuxRecord.control_msg(DeclareDead(0)))
            err = relay.wait(10)
            assert isinstance(err, SequenceError)
            assert str(err) == "relay: expected HelloAck from controller, got DeclareDead"
            client.close()
        finally:
            relay.shutdown()


def test_shutdown_while_waiting_for_ranks_and_bad_rank_sets() -> None:
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1], 2)
        assert relay.shutdown(10) is None and relay.done
    for ranks, world in (([], 2), ([0, 0], 2), ([2], 2), ([0], 0)):
        with pytest.raises(InvalidValue, match="relay: rank set"):
            Relay(("127.0.0.1", 1), ranks, world, SALT)
    assert default_relay_port(1337) == 1341


@pytest.mark.parametrize("reason", ["stopped by a signal", None])
def test_a_shutdown_mid_run_ends_with_its_reason(reason: str | None) -> None:
    # a relay stopped mid-run (a signal) ended as "controller_closed": closing its connections
    # made its reader see the controller's end before the stop was recorded
    with FakeController() as ctrl:
        relay, r0, r1, conn = _two_rank_relay(ctrl)
        try:
            r0.send_frame(frame([1.0, 2.0], weight=1.0))
            r1.send_frame(frame([3.0, 4.0], weight=1.0))
            rec = conn.read_record()
            assert rec is not None
            conn.broadcast(rec.frame(SALT))
            assert r0.read_reply() == r1.read_reply()
            r0.send_frame(frame([1.0, 2.0], weight=1.0))  # the next round has begun
            err = relay.shutdown(10) if reason is None else relay.shutdown(10, reason=reason)
            assert err is None
            outcome = relay.core.outcome
            assert outcome is not None
            assert str(outcome) == f"clean (stop: {reason or 'shutdown requested'})"
        finally:
            r0.close()
            r1.close()
            relay.shutdown()


def test_stats_and_idle_elided_deposit_v3() -> None:
    """Version 3: an idle rank's elided deposit merges nothing (the HostFrame equals the other
    rank's contribution); an all-elided round ships elided."""
    with FakeController(version=3) as ctrl:
        relay, r0, r1, conn = _two_rank_relay(ctrl, version=3)
        try:
            r0.send_frame(frame(TensorPayload.elide(Dtype.F32, [2]), weight=0.0))
            r1.send_frame(frame([2.0, 8.0], weight=3.0))
            rec = conn.read_record()
            assert rec is not None
            host = rec.frame(SALT)
            assert values(host) == [[2.0, 8.0]] and host.weight == 3.0
            conn.broadcast(host)
            assert r0.read_reply() == r1.read_reply() == bytes(rec.payload)
            idle = frame(TensorPayload.elide(Dtype.F32, [2]), weight=0.0)
            r0.send_frame(idle)
            r1.send_frame(idle)
            rec = conn.read_record()
            assert rec is not None and rec.frame(SALT).tensors[0].elided
            r0.close()
            r1.close()
            kinds = [conn.read_record() for _ in range(2)]
            assert {k.control for k in kinds if k} == {RankExit(0), RankExit(1)}
            assert conn.read_record() is None
            assert relay.wait(10) is None
            s = relay.stats
            assert s.host_frames == 2 and s.broadcasts == 1 and s.upstream_in > 0
        finally:
            relay.shutdown()


def test_relay_cli_prints_the_bound_port_and_stops_on_sigterm() -> None:
    with FakeController() as ctrl:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flodl_proto.cli", "relay", "--controller",
             f"127.0.0.1:{ctrl.port}", "--ranks", "0,1", "--world-size", "2", "--salt",
             SALT.hex(), "--listen-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().rstrip("\n")
            assert line.startswith("listening on 127.0.0.1:")
            port = int(line.rsplit(":", 1)[1])
            assert port > 0
            proc.terminate()
            out, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            assert out.startswith("relay stats ")
            assert out.splitlines()[-1] == "relay finished: clean (stop: stopped by a signal)"
            assert err == ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _relay_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flodl_proto.cli", "relay", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_relay_cli_sigint_is_a_clean_stop() -> None:
    with FakeController() as ctrl:
        proc = _relay_cli("--controller", f"127.0.0.1:{ctrl.port}", "--ranks", "0",
                          "--world-size", "1", "--salt", SALT.hex(), "--listen-port", "0")
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("listening on 127.0.0.1:")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0 and err == ""
    assert out.splitlines()[-1] == "relay finished: clean (stop: stopped by a signal)"


@pytest.mark.timeout(60)
def test_relay_cli_says_why_it_exits_when_the_controller_refuses_its_hello() -> None:
    # a version-2 relay dials a version-3 controller: the controller cannot read the Hello and
    # closes; each side says the protocol versions differ
    ctl = ReferenceController(1, SALT, version=3, port_mux=False).start()
    try:
        proc = _relay_cli("--controller", f"127.0.0.1:{ctl.port}", "--ranks", "0",
                          "--world-size", "1", "--salt", SALT.hex(), "--listen-port", "0",
                          "--host", "old", "--protocol-version", "2")
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().rstrip("\n").rsplit(":", 1)[1])
            with RankClient.connect(f"127.0.0.1:{port}", 0, 1, SALT, 2):
                _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        outcome = ctl.wait(10)
    finally:
        ctl.shutdown(timeout=10)
    assert proc.returncode == 1
    assert err == ("flodl-proto relay: error: relay: controller closed connection before "
                   "HelloAck; it may have refused this relay's Hello (a 7-byte payload) for "
                   "another protocol version or salt, a rank outside the controller's world "
                   "size, or a frame ceiling below 7 bytes (check --protocol-version, "
                   "--world-size and the salt on both sides, and the controller's "
                   "--frame-ceiling)\n")
    assert outcome is not None and "the protocol versions differ" in outcome.detail


#: DeclareDead records for a rank of another host the scripted controller sends per round: each
#: is a warning line on the relay's stderr, together far more than a 4 KiB pipe holds
_FOREIGN_DECLARE_DEAD = 60
_UNREAD_ROUNDS = 6


@pytest.mark.timeout(120)
def test_relay_cli_rounds_go_on_while_nobody_reads_stderr() -> None:
    """Warnings logged on the round path (here a DeclareDead naming another host's rank, sent by
    the controller between a HostFrame and its Broadcast) while nobody reads the relay's stderr
    (a pipe shrunk to one page, 4 KiB): they wait in the bounded backlog or are dropped and
    counted, and every round still completes. Once stderr is read the relay ends cleanly, and
    the lines written plus the ones the warning counts are one per DeclareDead."""
    import fcntl

    from flodl_proto.commands._output import STDOUT_BACKLOG

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    with FakeController() as ctrl:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flodl_proto.cli", "relay", "--controller",
             f"127.0.0.1:{ctrl.port}", "--ranks", "0", "--world-size", "8", "--salt",
             SALT.hex(), "--listen-port", "0", "--host", "h0"],
            stdout=subprocess.PIPE, stderr=write_end, text=True)
        os.close(write_end)
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().rstrip("\n").rsplit(":", 1)[1])
            t, res = in_thread(RankClient.connect, ("127.0.0.1", port), 0, 8, SALT, 2)
            conn = ctrl.accept()
            conn.handshake()
            t.join()
            rank = res["result"]
            for k in range(_UNREAD_ROUNDS):
                j = in_thread(rank.all_reduce, frame([float(k)]))
                rec = conn.read_record()
                assert rec is not None and rec.kind is RecordKind.HOST_FRAME
                for _ in range(_FOREIGN_DECLARE_DEAD):
                    conn.declare_dead(5)
                conn.broadcast(frame([float(k)]))
                j[0].join()
                assert "error" not in j[1], f"round {k + 1} stalled: {j[1]['error']!r}"
                assert values(j[1]["result"]) == [[float(k)]]
            rank.close()  # the last local rank leaves: the relay ends once stderr is read
            with os.fdopen(read_end, "rb") as err_pipe:
                err = err_pipe.read().decode()
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith("relay finished: clean ("), out
    lines = err.splitlines()
    prefix = "flodl-proto relay: warning: "
    assert lines[-1].startswith(prefix), err[-300:]
    assert lines[-1].endswith(" log lines dropped: stderr was not read fast enough")
    dropped = int(lines[-1][len(prefix):].split()[0])
    logged = lines[:-1]
    assert all(ln.endswith("relay h0: DeclareDead for rank 5, not one of ours [0]")
               for ln in logged), logged[:3]
    assert len(logged) + dropped == _FOREIGN_DECLARE_DEAD * _UNREAD_ROUNDS
    # at most: the backlog, the line being written and what the pipe held
    assert len(logged) <= STDOUT_BACKLOG + 1 + 4096 // min(len(ln) + 1 for ln in logged)


def test_relay_cli_bad_arguments() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "flodl_proto.cli", "relay", "--controller", "127.0.0.1:1",
         "--ranks", "0", "--world-size", "1", "--salt", "abcd"],
        capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "salt" in res.stderr and res.stdout == ""



def test_broadcast_fan_out_completes_when_the_run_ends_meanwhile() -> None:
    """A Broadcast already received reaches every local rank whole even when, during the
    fan-out, fast ranks leave, their RankExits hit the closed upstream and the relay winds down
    (the controller ends the run on the first RankExit; a slow rank must still get the round's
    consensus, as upstream's relay finishes a fan-out before it sees its shutdown flag)."""
    big = RoundFrame(0, 2.0, [TensorPayload(Dtype.F32, [1 << 22], bytes(16 << 20))])  # 16 MiB
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1, 2], 3)
        try:
            ranks = []
            for r in range(3):
                rr = RawRank(relay.address)
                assert len(rr.handshake(r, 3)) == 8
                ranks.append(rr)
            conn = ctrl.accept()
            conn.read_magic()
            conn.read_raw_record()
            conn.send(MuxRecord.control_msg(HelloAck(), 2))
            for r, rr in enumerate(ranks):
                rr.send_frame(frame([float(r)], weight=1.0))
            rec = conn.read_record()
            assert rec is not None and rec.kind is RecordKind.HOST_FRAME
            payload = conn.broadcast(big)
            conn.close()  # the run ended at the controller
            for rr in ranks[:2]:  # fast ranks: read, leave; their RankExits meet a closed socket
                assert rr.read_reply() == payload
                rr.close()
                time.sleep(0.2)
            # the relay has seen the broken upstream and winds down; waited for, not slept on:
            # rank 2's fan-out is all the while under one write-stall deadline (3 s at the
            # tests' timeout scale), which a fixed pause, added to the fast ranks' reads on a
            # loaded machine, could use up
            wait_until(relay._stop.is_set)
            assert ranks[2].read_reply() == payload  # the slow rank still gets the consensus
            ranks[2].close()
            relay.wait(10)
        finally:
            relay.shutdown()


def _two_rank_rounds(relay: Relay, c0: RankClient, c1: RankClient, conn: ControllerConn,
                     rounds: int, *, rank1_completes: bool = False) -> None:
    """``rounds`` rounds of ranks 0 and 1 (frames [1, k] and [2, 3] in round k) through
    ``relay`` to the controller's side ``conn``: each round's HostFrame holds their sum
    [3, 3 + k], and the consensus broadcast ([1.5, 1.5]) reaches both ranks.
    ``rank1_completes``: rank 1 sends only once rank 0's frame is deposited, so the same rank
    reader completes every round."""
    for k in range(rounds):
        j0 = in_thread(c0.all_reduce, frame([1.0, float(k)], weight=1.0))
        if rank1_completes:
            wait_until(lambda: relay.fold.has_deposited(0))
        j1 = in_thread(c1.all_reduce, frame([2.0, 3.0], weight=1.0))
        rec = conn.read_record()
        assert rec is not None and rec.kind is RecordKind.HOST_FRAME
        assert values(rec.frame(SALT)) == [[3.0, 3.0 + k]]
        conn.broadcast(frame([1.5, 1.5], weight=2.0))
        for t_, r_ in (j0, j1):
            t_.join()
            assert values(r_["result"]) == [[1.5, 1.5]]


def test_a_small_host_frame_is_written_by_the_thread_that_completed_the_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The small-frame path: the HostFrame goes upstream from the rank reader that completed
    the round (one non-blocking sendmsg), not through the outbound writer's send_all."""
    import socket as socket_mod

    from flodl_proto.runner import _relay_barrier

    upstream_writes: list[int] = []
    real_send_all = _relay_barrier.send_all

    def send_all(sock: socket_mod.socket, buffers: object, **kw: object) -> int:
        if sock is relay._upstream:
            upstream_writes.append(1)
        return real_send_all(sock, buffers, **kw)  # type: ignore[arg-type]

    with FakeController() as ctrl, _relay_with_clients(ctrl, [0, 1], 2) as (relay, (c0, c1), conn):
        monkeypatch.setattr(_relay_barrier, "send_all", send_all)  # the outbound writer's
        _two_rank_rounds(relay, c0, c1, conn, 3)
        assert upstream_writes == [] and relay.stats.host_frames == 3
        c0.close()
        c1.close()
        assert relay.wait(10) is None


def test_the_host_frame_image_is_reused_when_one_rank_completes_every_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The HostFrame's kept record image is written in place round after round, also when the
    same rank reader completes every round: nothing of a round's records outlives its core call
    (a live view of the image makes the core encode the next record afresh)."""
    from flodl_proto.codec import record_image

    encoded: list[int] = []
    real = record_image.encode_frame_record

    def counting(*args: object, **kw: object) -> object:
        encoded.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(record_image, "encode_frame_record", counting)
    with FakeController() as ctrl, _relay_with_clients(ctrl, [0, 1], 2) as (relay, (c0, c1), conn):
        _two_rank_rounds(relay, c0, c1, conn, 6, rank1_completes=True)
        assert encoded == [1]  # the first round's record only: then its image, rewritten
        c0.close()
        c1.close()
        assert relay.wait(10) is None


def test_a_listen_port_outside_the_port_range_is_a_typed_error() -> None:
    with pytest.raises(InvalidValue) as e:
        Relay(("127.0.0.1", 65533), [0], 1, SALT)
    assert str(e.value) == ("relay: listen port 65537 is out of range 0..65535 (the "
                            "controller's port + 4)")
    assert e.value.error_id == "relay.bad_listen_port" and not e.value.remote
    for port in (-1, 65536):
        with pytest.raises(InvalidValue) as e:
            Relay("127.0.0.1:1", [0], 1, SALT, listen_port=port)
        assert str(e.value) == f"relay: listen port {port} is out of range 0..65535"


@pytest.mark.parametrize("ceiling", [0, 1, 24])
def test_a_ceiling_below_the_smallest_round_frame_is_local_misuse(ceiling: int) -> None:
    """Every frame a rank sends and every Broadcast is at least a RoundFrame with no tensor
    (25 bytes): a smaller ceiling would refuse them all, so the constructor refuses it."""
    with pytest.raises(InvalidValue) as e:
        Relay("127.0.0.1:1", [0], 1, SALT, ceiling=ceiling)
    assert str(e.value) == (f"relay: frame ceiling {ceiling} is below 25 bytes (the smallest "
                            "RoundFrame: no tensor); a record every run exchanges would be "
                            "refused")
    assert e.value.error_id == "ceiling.below_minimum" and not e.value.remote
    assert Relay("127.0.0.1:1", [0], 1, SALT, ceiling=25).ceiling == 25


def test_relay_cli_listen_port_out_of_range_is_one_line_and_exit_2() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "flodl_proto.cli", "relay", "--controller", "127.0.0.1:1",
         "--ranks", "0", "--world-size", "1", "--salt", SALT.hex(), "--listen-port", "99999"],
        capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("flodl-proto relay: error: argument --listen-port: port 99999 is not "
                          "in 0..65535\n")


def test_relay_cli_port_in_use_is_one_line_and_exit_1() -> None:
    """A port in use is the environment's failure (exit 1, as a failed run), not a usage error
    (2): the command line was right."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "flodl_proto", "relay", "--controller", "127.0.0.1:1",
             "--ranks", "0", "--world-size", "1", "--salt", SALT.hex(), "--listen-port",
             str(port)], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"flodl-proto relay: error: cannot listen on 127.0.0.1:{port} "
                          f"(--listen-port): {os.strerror(errno.EADDRINUSE)}\n")


def test_relay_cli_default_port_in_use_names_where_the_port_came_from() -> None:
    """Without --listen-port the relay listens on the controller's port + 4: a failure to
    listen there says so, as the line would otherwise name a port the command line never
    gave."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        if port < 5:
            pytest.fail(f"the kernel gave port {port}")
        res = subprocess.run(
            [sys.executable, "-m", "flodl_proto", "relay", "--controller",
             f"127.0.0.1:{port - 4}", "--ranks", "0", "--world-size", "1", "--salt", SALT.hex()],
            capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (
        f"flodl-proto relay: error: cannot listen on 127.0.0.1:{port} (the default "
        f"--listen-port: the controller's port + 4): {os.strerror(errno.EADDRINUSE)}\n")


def test_the_relay_s_texts_take_the_loopback_offset_from_the_spec(tmp_path: Path) -> None:
    """The relay's help, its default port out of range and in use, and the runner's refusal of
    that port write the controller's port + ``RELAY_DATA_LOOPBACK_OFFSET`` from the spec, where
    they wrote + 4 by hand: with a spec whose offset is 7 (``FLODL_PROTO_SPEC_DIR``) each
    says + 7."""
    spec_dir = spec_with_constant(tmp_path, "RELAY_DATA_LOOPBACK_OFFSET", 4, 7)
    env = {**os.environ, "FLODL_PROTO_SPEC_DIR": str(spec_dir)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                              timeout=60)

    res = run("-m", "flodl_proto", "relay", "--help")
    assert res.returncode == 0, res.stderr
    assert ("--listen-port P loopback port for the ranks (default: controller port + 7; 0 = "
            "any)") in " ".join(res.stdout.split())
    relay_args = ("--ranks", "0", "--world-size", "1", "--salt", SALT.hex())
    res = run("-m", "flodl_proto", "relay", "--controller", "127.0.0.1:65530", *relay_args)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", "flodl-proto relay: error: argument --controller: '127.0.0.1:65530': port 65537 "
               "is not in 0..65535 (the default --listen-port: the controller's port + 7); give "
               "--listen-port\n")
    res = run("-c", "from flodl_proto.errors import InvalidValue\n"
                    "from flodl_proto.runner.relay import Relay\n"
                    "try:\n    Relay('127.0.0.1:65530', [0], 1, bytes(16))\n"
                    "except InvalidValue as e:\n    print(e)")
    assert (res.returncode, res.stdout, res.stderr) == (
        0, "relay: listen port 65537 is out of range 0..65535 (the controller's port + 7)\n", "")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        if port < 8:
            pytest.fail(f"the kernel gave port {port}")
        res = run("-m", "flodl_proto", "relay", "--controller", f"127.0.0.1:{port - 7}",
                  *relay_args)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (
        f"flodl-proto relay: error: cannot listen on 127.0.0.1:{port} (the default "
        f"--listen-port: the controller's port + 7): {os.strerror(errno.EADDRINUSE)}\n")


@pytest.mark.parametrize("sent", [0, 7])
def test_a_local_connection_without_a_whole_handshake_fails_the_relay_at_its_deadline(
        monkeypatch: pytest.MonkeyPatch, sent: int) -> None:
    """The handshakes are read one at a time: a connection that sends nothing, or part of a
    handshake, and stays open would hold every later rank (departure relay_handshake_deadline).
    It fails the relay at HANDSHAKE_READ as a short handshake does, naming its address."""
    monkeypatch.setattr("flodl_proto.runner.relay.handshake_read_timeout", lambda: 0.5)
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1], 2)
        silent = socket.create_connection(relay.address)
        try:
            silent.sendall(bytes(range(sent)))
            start = time.monotonic()
            err = relay.wait(10)
            waited = time.monotonic() - start
            assert isinstance(err, TruncatedInput)
            assert str(err) == ("cluster_controller: handshake read failed: no complete "
                                f"handshake within 0.5s ({sent} of 16 bytes)")
            local = "{}:{}".format(*silent.getsockname())
            assert err.__notes__ == [f"the rank connecting from {local}"]
            # the deadline is 0.5 s here; the bound tells it from the unpatched HANDSHAKE_READ
            # (10 s, when relay.wait gives up too): not widened, a wider one would come near it
            assert 0.4 <= waited < 5
            assert read_to_eof(silent) == b""  # the relay closed it, sending no ack
            assert relay.stats.from_ranks == sent
        finally:
            silent.close()
            relay.shutdown()


def test_the_controllers_acknowledgement_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """At INFO an operator sees one line for the HelloAck, naming the controller's address."""
    caplog.set_level(logging.INFO, logger="flodl_proto")
    with FakeController() as ctrl:
        relay, r0, r1, _conn = _two_rank_relay(ctrl)
        try:
            wait_until(lambda: relay.connected)
            acks = [r.getMessage() for r in caplog.records
                    if r.levelno >= logging.INFO and "acknowledged" in r.getMessage()]
            assert acks == [f"relay h0: controller {ctrl.address[0]}:{ctrl.address[1]} "
                            "acknowledged ranks [0, 1]"]
        finally:
            relay.shutdown()
            r0.close()
            r1.close()


def test_the_waiting_note_counts_the_missing_ranks_and_lists_the_lowest() -> None:
    """The accept phase's note printed the whole list of missing ranks (a relay of many ranks:
    a line of thousands of characters) and an IPv6 address without its brackets."""
    from flodl_proto.runner.relay import waiting_note

    assert waiting_note("node-a", [1, 3], 4, ("127.0.0.1", 7005)) == (
        "relay node-a: still waiting for 2 of 4 local rank(s) to connect to 127.0.0.1:7005: 1, 3")
    assert waiting_note("h", list(range(2, 5000)), 5000, ("::1", 7005)) == (
        "relay h: still waiting for 4998 of 5000 local rank(s) to connect to [::1]:7005: "
        + ", ".join(map(str, range(2, 18))) + " ...")


def test_a_controller_connection_closed_while_writing_is_said_in_words(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The outbound writer's broken pipe gave Python's text ('[Errno 32] Broken pipe') to its
    log line and to the relay's outcome: now the reason only."""
    from flodl_proto.runner import _relay_barrier

    def broken(sock: socket.socket, buffers: object, **kw: object) -> int:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    caplog.set_level(logging.INFO, logger="flodl_proto")
    with FakeController() as ctrl, _relay_with_clients(ctrl, [0], 1) as (relay, (c0,), _conn):
        # nothing leaves at once: the HostFrame goes to the outbound writer, whose write fails
        monkeypatch.setattr(_relay_barrier, "send_at_once", lambda sock, bufs, n: 0)
        monkeypatch.setattr(_relay_barrier, "send_now",
                            lambda sock, bufs: [memoryview(b) for b in bufs])
        monkeypatch.setattr(_relay_barrier, "send_all", broken)
        details: list[str] = []
        real_closed = relay.core.controller_closed

        def controller_closed(detail: str = "") -> list[object]:
            details.append(detail)
            return real_closed(detail)

        monkeypatch.setattr(relay.core, "controller_closed", controller_closed)
        t, _ = in_thread(c0.all_reduce, frame([1.0], weight=1.0))
        assert relay.wait(10) is None  # a clean end, as the end of the controller's stream
        t.join(10)
    assert details == ["connection closed while writing: Broken pipe"]
    assert "relay h0: controller connection closed while writing: Broken pipe" in [
        r.getMessage() for r in caplog.records]


def test_a_relay_dialing_this_relays_rank_port_is_named_as_such() -> None:
    """A relay given another relay's rank port as ``--controller`` (the rank port is the
    controller's + 4 by default, an easy slip) sends the data-channel magic where a rank's
    handshake goes: the relay read only 'handshake magic 0xf10d17e1 != 0xf10d17c0 (the rank
    connecting from ...)', of a rank that was a relay. The note says what the magic is."""
    with FakeController() as ctrl:
        relay = _start(ctrl, [0, 1], 2)
        stray = socket.create_connection(relay.address)
        try:
            local = "{}:{}".format(*stray.getsockname())
            stray.sendall(encode_channel_magic("data") + bytes(12))
            err = relay.wait(10)
            assert isinstance(err, BadMagic)
            assert err.__notes__ == [
                f"the rank connecting from {local}, which sent the data-channel magic a relay "
                "sends its controller: a relay was given this rank port as its --controller"]
            assert _why_failed(err) == (
                "cluster_controller: handshake magic 0xf10d17e1 != 0xf10d17c0 (the rank "
                f"connecting from {local}, which sent the data-channel magic a relay sends its "
                "controller: a relay was given this rank port as its --controller)")
        finally:
            stray.close()
            relay.shutdown()

"""End to end over loopback: ranks -> relays -> the reference controller -> back.

Every rank must receive the identical consensus, equal to the realized-work reduce of the
per-host folds of the frames sent (computed by the tests' own reference, ``tests/reference.py``),
in every round; and the faults end the run cleanly without a hang.
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import (
    Dtype,
    Hello,
    HelloAck,
    MuxRecord,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_channel_magic,
    encode_frame_record,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from flodl_proto.errors import AuthenticationError, SequenceError, TruncatedInput
from flodl_proto.runner.controller import ReferenceController
from flodl_proto.runner.rank import RankClient
from flodl_proto.runner.relay import Relay

from .cluster_util import (
    OTHER_SALT,
    SALT,
    ControllerConn,
    RawRank,
    frame,
    in_thread,
    leak_guard,
    skip_deep_unless_selected,
    values,
    wait_until,
)
from .reference import BF16_TAG, encode, ref_reduce, ref_sum

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    skip_deep_unless_selected(request)
    with leak_guard():
        yield


TOPOLOGIES = {
    "1x1": [[0]],
    "1x2": [[0, 1]],
    "2x2": [[0, 1], [2, 3]],
    "3-uneven": [[0, 1], [2], [3, 4, 5]],
}
#: the default matrix: every topology, both dtypes and both versions appear at least once
DEFAULT = [("1x1", "f32", 2), ("1x2", "bf16", 3), ("2x2", "bf16", 2), ("3-uneven", "f32", 3)]
DEEP = [c for c in itertools.product(TOPOLOGIES, ("f32", "bf16"), (2, 3)) if c not in DEFAULT]
ROUNDS = 3


def _arrays(rank: int, k: int) -> list[np.ndarray]:
    """Small integers: every sum is exact in f32 and bf16, whatever the arrival order."""
    return [np.array([rank + 1, -(k + 1), 2], np.float32),
            np.array([[1, rank], [k, 3]], np.float32)]


def _mass(rank: int, k: int) -> float:
    return float((rank + k) % 3)


def _sent(rank: int, k: int, version: int, wire: Dtype) -> RoundFrame:
    """The frame a RankClient builds for ``all_reduce_scaled(_arrays, _mass)``."""
    mass = _mass(rank, k)
    ts = []
    for a in _arrays(rank, k):
        if mass == 0.0 and version == 3:
            ts.append(TensorPayload.elide(wire, a.shape))
        elif wire is Dtype.BF16:
            scaled = [np.float32(x * np.float32(mass)) for x in a.reshape(-1)]
            ts.append(TensorPayload(wire, a.shape, encode(scaled, BF16_TAG)))
        else:
            ts.append(TensorPayload(wire, a.shape, (a * np.float32(mass)).tobytes()))
    return RoundFrame(RoundKind.MODEL, mass, ts)


def _start(hosts: list[list[int]], version: int, *, salt: bytes = SALT,
           relay_salt: bytes = SALT) -> tuple[ReferenceController, list[Relay], int]:
    world = sum(len(h) for h in hosts)
    ctrl = ReferenceController(world, salt, version=version).start()
    relays = [Relay(ctrl.address, h, world, relay_salt, version=version, listen_port=0,
                    host=f"host{i}").start() for i, h in enumerate(hosts)]
    return ctrl, relays, world


def _run_matrix(topology: str, dtype: str, version: int) -> None:
    hosts = TOPOLOGIES[topology]
    wire = Dtype.BF16 if dtype == "bf16" else Dtype.F32
    ctrl, relays, world = _start(hosts, version)
    try:
        def rank_main(rank: int, relay: Relay) -> list[tuple[bytes, list[list[float]]]]:
            out = []
            with RankClient.connect(relay.address, rank, world, SALT, version,
                                    bf16=wire is Dtype.BF16) as c:
                for k in range(ROUNDS):
                    arrays = _arrays(rank, k)
                    rep = c.all_reduce_scaled(arrays, _mass(rank, k))
                    out.append((bytes(rep.raw), [a.reshape(-1).tolist() for a in arrays]))
            return out

        jobs = {r: in_thread(rank_main, r, relays[h])
                for h, ranks in enumerate(hosts) for r in ranks}
        got = {}
        for r, (t, res) in jobs.items():
            t.join()
            assert "error" not in res, res.get("error")
            got[r] = res["result"]
        for k in range(ROUNDS):
            folds = [ref_sum([_sent(r, k, version, wire) for r in h], version=version)
                     for h in hosts]
            expected = ref_reduce(folds, version=version)
            want = encode_round_frame_bytes(expected, SALT)
            for r in range(world):
                raw, arrays = got[r][k]
                assert raw == want, f"rank {r} round {k}"
                if expected.weight > 0:
                    assert arrays == values(expected)
        for relay in relays:
            assert relay.wait(20) is None
        outcome = ctrl.wait(20)
        assert outcome is not None and outcome.clean, outcome
    finally:
        for relay in relays:
            relay.shutdown()
        ctrl.shutdown()


@pytest.mark.parametrize(("topology", "dtype", "version"), DEFAULT)
def test_every_rank_gets_the_reduce_of_the_host_folds(topology: str, dtype: str,
                                                       version: int) -> None:
    _run_matrix(topology, dtype, version)


@pytest.mark.deep
@pytest.mark.parametrize(("topology", "dtype", "version"), DEEP)
def test_every_rank_gets_the_reduce_of_the_host_folds_deep(topology: str, dtype: str,
                                                           version: int) -> None:
    _run_matrix(topology, dtype, version)


# -- faults --------------------------------------------------------------------------------------
def _clients(relays: list[Relay], hosts: list[list[int]], world: int,
             skip: tuple[int, ...] = ()) -> dict[int, RankClient]:
    jobs = {r: in_thread(RankClient.connect, relays[h].address, r, world, SALT)
            for h, ranks in enumerate(hosts) for r in ranks if r not in skip}
    out = {}
    for r, (t, res) in jobs.items():
        t.join()
        assert "error" not in res, res.get("error")
        out[r] = res["result"]
    return out


def _round(clients: dict[int, RankClient], k: int) -> dict[int, Any]:
    jobs = {r: in_thread(c.all_reduce, frame([float(r + k), 1.0])) for r, c in clients.items()}
    out = {}
    for r, (t, res) in jobs.items():
        t.join()
        out[r] = res.get("result", res.get("error"))
    return out


def test_rank_killed_mid_round_ends_the_run_cleanly() -> None:
    hosts = [[0, 1], [2, 3]]
    ctrl, relays, world = _start(hosts, 2)
    victim = RawRank(relays[0].address)
    try:
        assert victim.handshake(1, world) == bytes.fromhex("c1170df102000000")
        clients = _clients(relays, hosts, world, skip=(1,))
        jobs = {r: in_thread(c.all_reduce, frame([float(r), 1.0])) for r, c in clients.items()}
        victim.send_frame(frame([1.0, 1.0]))
        first = victim.read_reply()
        want = ref_reduce([ref_sum([frame([0.0, 1.0]), frame([1.0, 1.0])]),
                           ref_sum([frame([2.0, 1.0]), frame([3.0, 1.0])])])
        assert values(want) == [[1.5, 1.0]] and want.weight == 4.0  # (0+1+2+3)/4, 4/4
        for r, (t, res) in jobs.items():
            t.join()
            assert res.get("result") == want, (r, res)
        assert first == encode_round_frame_bytes(want, SALT)
        assert {bytes(c.last_reply.raw) for c in clients.values()} == {first}
        # round 2: the others send, the victim dies halfway through its frame
        jobs = {r: in_thread(c.all_reduce, frame([float(r), 2.0])) for r, c in clients.items()}
        body = encode_round_frame_bytes(frame([5.0, 5.0]), SALT)
        victim.sock.sendall(len(body).to_bytes(4, "little") + body[: len(body) // 2])
        victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        victim.close()
        outcomes = {}
        for r, (t, res) in jobs.items():
            t.join()
            outcomes[r] = res.get("result", res.get("error"))
        # survivors end consistently: the same round-2 consensus for all, or end of stream; a
        # round 2 that completed folded host A without the victim
        frames = [o for o in outcomes.values() if isinstance(o, RoundFrame)]
        errors = [o for o in outcomes.values() if not isinstance(o, RoundFrame)]
        assert all(isinstance(e, TruncatedInput) for e in errors), errors
        want2 = ref_reduce([frame([0.0, 2.0]), ref_sum([frame([2.0, 2.0]), frame([3.0, 2.0])])])
        assert values(want2) == [[1.6666667461395264, 2.0]]  # 5 * f32(1/3), 6 * f32(1/3)
        assert all(f == want2 for f in frames), frames
        assert len({bytes(clients[r].last_reply.raw) for r, o in outcomes.items()
                    if isinstance(o, RoundFrame)}) <= 1, frames
        outcome = ctrl.wait(30)
        assert outcome is not None and outcome.clean and outcome.reason == "rank_exit"
        assert [r.wait(30) for r in relays] == [None, None]
        for r, c in clients.items():  # everyone sees end of stream, nobody hangs
            with pytest.raises((TruncatedInput, SequenceError, OSError)) as ei:
                c.all_reduce(frame([0.0, 0.0]))
            if isinstance(ei.value, SequenceError):  # round 2 failed: the client closed itself
                assert ei.value.error_id == "client.closed" and isinstance(outcomes[r],
                                                                           TruncatedInput)
            c.close()
    finally:
        victim.close()
        for r in relays:
            r.shutdown()
        ctrl.shutdown()


def test_relay_process_killed_mid_round_ends_the_run_cleanly() -> None:
    hosts = [[0, 1], [2, 3]]
    world = 4
    ctrl = ReferenceController(world, SALT).start()
    relay_a = Relay(ctrl.address, hosts[0], world, SALT, listen_port=0).start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flodl_proto.cli", "relay", "--controller",
         f"127.0.0.1:{ctrl.port}", "--ranks", "2,3", "--world-size", "4", "--salt", SALT.hex(),
         "--listen-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients: dict[int, RankClient] = {}
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port_b = int(line.strip().rsplit(":", 1)[1])
        jobs = {r: in_thread(RankClient.connect, addr, r, world, SALT) for r, addr in
                [(0, relay_a.address), (1, relay_a.address), (2, ("127.0.0.1", port_b)),
                 (3, ("127.0.0.1", port_b))]}
        for r, (t, res) in jobs.items():
            t.join()
            clients[r] = res["result"]
        first = _round(clients, 0)
        want = ref_reduce([ref_sum([frame([0.0, 1.0]), frame([1.0, 1.0])]),
                           ref_sum([frame([2.0, 1.0]), frame([3.0, 1.0])])])
        assert values(want) == [[1.5, 1.0]]
        assert first == dict.fromkeys(range(4), want), first
        assert len({bytes(c.last_reply.raw) for c in clients.values()}) == 1, first
        # round 2 starts; rank 3 has not sent yet when its relay dies
        jobs = {r: in_thread(clients[r].all_reduce, frame([1.0, 1.0])) for r in (0, 1, 2)}
        wait_until(lambda: relay_a.stats.host_frames == 2)  # host A shipped round 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(20)
        for t, res in jobs.values():
            t.join()
            assert isinstance(res.get("error"), TruncatedInput), res
        with pytest.raises((TruncatedInput, OSError)):
            clients[3].all_reduce(frame([1.0, 1.0]))
        outcome = ctrl.wait(30)
        assert outcome is not None and outcome.clean and outcome.reason == "relay_eof", outcome
        assert relay_a.wait(30) is None
    finally:
        for c in clients.values():
            c.close()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        relay_a.shutdown()
        ctrl.shutdown()


def test_relay_that_stops_reading_is_declared_dead_and_the_other_host_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Host B's relay sends its HostFrames but never reads: the controller's Broadcast write
    stalls (write-stall timeout), rank 2 is declared dead, and host A keeps getting consensus."""
    # the stalled scatter may hold the controller for a few write-stall periods: give host A's
    # ranks a reply deadline well beyond them (the scaled default is 12 s)
    monkeypatch.setattr("flodl_proto.runner.rank.reduce_read_deadline", lambda: 120.0)
    world = 3
    n = 4 << 20  # 16 MiB of f32: far beyond what the socket buffers absorb
    ctrl = ReferenceController(world, SALT).start()
    relay_a = Relay(ctrl.address, [0, 1], world, SALT, listen_port=0).start()
    b = socket.socket()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    b.connect(ctrl.address)
    conn_b = ControllerConn(b, SALT, 2)
    clients: dict[int, RankClient] = {}
    try:
        b.sendall(encode_channel_magic("data") + encode_mux_record_bytes(
            MuxRecord.control_msg(Hello("stuck", [2])), SALT))
        ack = conn_b.read_record()
        assert ack is not None and ack.control == HelloAck()
        clients = _clients([relay_a], [[0, 1]], world)
        big = [np.full(n, r + 1.0, np.float32) for r in range(3)]
        jobs = {r: in_thread(clients[r].all_reduce_scaled, [big[r].copy()], 1.0)
                for r in (0, 1)}
        stuck = RoundFrame(RoundKind.MODEL, 1.0,
                           [TensorPayload(Dtype.F32, [n], big[2].tobytes())])
        b.sendall(b"".join(encode_frame_record(RecordKind.HOST_FRAME, stuck, SALT)))
        for t, res in jobs.values():
            t.join()
            rep = res["result"]
            assert rep.weight == 3.0  # round 1: all three ranks, (1 + 2 + 3) / 3 everywhere
            assert np.array_equal(rep.frame.tensors[0].array(), np.full(n, 2.0, np.float32))
        wait_until(lambda: ctrl.dead_ranks.is_dead(2), timeout=60)
        # round 2: only host A is expected now
        jobs = {r: in_thread(clients[r].all_reduce_scaled, [big[r].copy()], 1.0)
                for r in (0, 1)}
        for t, res in jobs.values():
            t.join()
            rep = res["result"]
            assert rep.weight == 2.0  # (1 + 2) / 2 everywhere
            assert np.array_equal(rep.frame.tensors[0].array(), np.full(n, 1.5, np.float32))
        for c in clients.values():
            c.close()
        outcome = ctrl.wait(30)
        assert outcome is not None and outcome.clean, outcome
        assert relay_a.wait(30) is None
    finally:
        for c in clients.values():
            c.close()
        b.close()
        relay_a.shutdown()
        ctrl.shutdown()


def test_relay_with_the_wrong_salt_is_refused() -> None:
    ctrl, relays, world = _start([[0]], 2, relay_salt=OTHER_SALT)
    try:
        client = RankClient.connect(relays[0].address, 0, world, OTHER_SALT)
        outcome = ctrl.wait(30)
        assert outcome is not None and not outcome.clean
        assert isinstance(outcome.error, AuthenticationError)
        err = relays[0].wait(30)
        assert isinstance(err, TruncatedInput) and "before HelloAck" in str(err)
        with pytest.raises(TruncatedInput):
            client.all_reduce(frame([1.0]))
        client.close()
    finally:
        for r in relays:
            r.shutdown()
        ctrl.shutdown()


def test_rank_with_the_other_version_is_refused_by_its_relay() -> None:
    ctrl, relays, world = _start([[0]], 3)
    try:
        with pytest.raises(TruncatedInput, match="handshake ack read failed"):
            RankClient.connect(relays[0].address, 0, world, SALT, version=2)
        err = relays[0].wait(30)
        assert err is not None and "handshake protocol_version 2 != 3" in str(err)
    finally:
        for r in relays:
            r.shutdown()
        ctrl.shutdown()

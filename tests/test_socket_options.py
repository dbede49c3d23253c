"""Socket options on the live data-channel sockets of a running cluster (controller, relay, two
ranks on loopback), read back from the kernel through duplicates of the process's own socket
descriptors, so the test sees what the runners set whatever object holds the socket.

Every established connection (rank -> relay, relay -> controller, and the accepted ends) must
have TCP_NODELAY on (small control records and frame headers are not delayed), TCP keepalive on
with the spec's timings scaled by ``FLODL_NET_TIMEOUT_SCALE`` and a matching TCP_USER_TIMEOUT,
and OS-level read and write timeouts (no read or write can block forever); a rank's socket
carries the reduce read deadline and the write-stall ceiling.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest

from flodl_proto.runner._netio import keepalive_settings, reduce_read_deadline, write_stall_timeout
from flodl_proto.runner.controller import ReferenceController
from flodl_proto.runner.rank import RankClient
from flodl_proto.runner.relay import Relay

from .cluster_util import SALT, frame, in_thread, leak_guard

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or not hasattr(socket, "TCP_KEEPIDLE"),
                       reason="needs Linux (/proc/self/fd and the TCP keepalive options)"),
]


def _timeval(raw: bytes) -> float:
    sec, usec = struct.unpack("<qq", raw)
    return sec + usec / 1e6


def _tcp_sockets() -> Iterator[socket.socket]:
    """Duplicates of this process's connected IPv4 TCP sockets (closed by the caller)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            dup = os.dup(fd)
        except OSError:
            continue
        s = socket.socket(fileno=dup)
        try:
            if s.family != socket.AF_INET or s.type != socket.SOCK_STREAM:
                s.close()
                continue
            s.getpeername()
        except OSError:  # not connected (a listener)
            s.close()
            continue
        yield s


@pytest.fixture
def cluster() -> Iterator[tuple[ReferenceController, Relay, dict[int, RankClient]]]:
    with leak_guard():
        ctrl = ReferenceController(2, SALT).start()
        relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0).start()
        clients: dict[int, RankClient] = {}
        try:
            jobs = {r: in_thread(RankClient.connect, relay.address, r, 2, SALT) for r in (0, 1)}
            for r, (t, res) in jobs.items():
                t.join()
                assert "error" not in res, res.get("error")
                clients[r] = res["result"]
            rounds = {r: in_thread(c.all_reduce, frame([float(r)])) for r, c in clients.items()}
            for t, res in rounds.values():
                t.join()
                assert "error" not in res, res.get("error")
            yield ctrl, relay, clients
        finally:
            for c in clients.values():
                c.close()
            relay.wait(20)
            relay.shutdown()
            ctrl.wait(20)
            ctrl.shutdown()


def test_live_data_channel_sockets_carry_the_options(
        cluster: tuple[ReferenceController, Relay, dict[int, RankClient]]) -> None:
    ctrl, relay, _clients = cluster
    relay_port, ctrl_port = relay.address[1], ctrl.address[1]
    idle, interval, probes = keepalive_settings()
    roles: dict[str, int] = {}
    for s in _tcp_sockets():
        with s:
            local, peer = s.getsockname()[1], s.getpeername()[1]
            if peer == relay_port:
                role = "rank"
            elif local == relay_port:
                role = "relay, rank side"
            elif peer == ctrl_port:
                role = "relay, controller side"
            elif local == ctrl_port:
                role = "controller"
            else:
                continue
            roles[role] = roles.get(role, 0) + 1
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, role
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1, role
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == idle, role
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == interval, role
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == probes, role
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == (
                (idle + interval * probes) * 1000), role
            recv = _timeval(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
            send = _timeval(s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16))
            assert recv > 0 and send > 0, (role, recv, send)
            if role == "rank":  # steady state after the handshake
                assert recv == pytest.approx(reduce_read_deadline(), abs=0.01)
                assert send == pytest.approx(write_stall_timeout(), abs=0.01)
    assert roles == {"rank": 2, "relay, rank side": 2, "relay, controller side": 1,
                     "controller": 1}, roles

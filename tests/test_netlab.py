"""The cluster on real interfaces: hosts in network namespaces behind a bridge, with link
faults (rate caps, packet loss, blackhole partitions, process kills).

Every test here needs the network lab (root, iproute2, nftables); without it they are deselected
and the reason is printed at the end of the run (``tests/conftest.py``). Each test checks that
nothing of its lab is left behind: no namespace, no process.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flodl_proto.netlab import LAB_NETWORK, NetLab, leftovers
from flodl_proto.runner._netio import keepalive_bound

from .netlab_cluster import ROOT, LabCluster, Proc, record_figure, wait_for

pytestmark = [pytest.mark.netlab, pytest.mark.timeout(240)]


def _addresses(netns: str | None) -> list[str]:
    """Every IPv4 address of a namespace (None: this process's own)."""
    argv = ["ip", "-4", "-o", "addr", "show"]
    if netns is not None:
        argv = ["ip", "-n", netns, "-4", "-o", "addr", "show"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[NetLab]:
    hosts = getattr(request, "param", 2)
    with NetLab(hosts) as lab:
        yield lab
    assert leftovers(lab.tag) == []


# -- the lab itself ------------------------------------------------------------------------------
def test_lab_addresses_come_from_the_benchmarking_range_and_nothing_is_left() -> None:
    before = _addresses(None)
    with NetLab(3) as lab:
        names = lab.namespaces
        assert len(set(names)) == 5 and all(n.startswith(lab.tag + "-") for n in names)
        for node in lab.nodes:
            got = _addresses(node.netns)
            assert sorted(got) == sorted(["127.0.0.1", node.address]), (node, got)
            assert ipaddress.ip_address(node.address) in LAB_NETWORK
        assert _addresses(lab.bridge_netns) == ["127.0.0.1"]
        # the machine's own namespace gets nothing
        assert _addresses(None) == before
        assert not any(ipaddress.ip_address(a) in LAB_NETWORK for a in _addresses(None))
        tag = lab.tag
        assert leftovers(tag)
    assert leftovers(tag) == []


def test_two_labs_get_distinct_names() -> None:
    with NetLab(1) as a, NetLab(1) as b:
        assert a.tag != b.tag
        assert not set(a.namespaces) & set(b.namespaces)
    assert leftovers(a.tag) == [] and leftovers(b.tag) == []


def test_a_failing_test_body_leaves_nothing_behind() -> None:
    with pytest.raises(RuntimeError, match="boom"), NetLab(2) as lab:
        sleeper = lab.popen(lab.hosts[0], ["sleep", "300"])
        wait_for(lambda: lab.pids(lab.hosts[0]) == [sleeper.pid], 10, "the sleeper")
        raise RuntimeError("boom")
    assert leftovers(lab.tag) == []
    assert sleeper.poll() is not None


# The owner starts from the signals' default actions: one started under ``nohup`` (SIGHUP
# ignored, which a child inherits) keeps an ignored SIGHUP ignored once its lab is removed.
_OWNER = textwrap.dedent("""
    import signal, sys, time
    from flodl_proto.netlab import NetLab
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lab = NetLab(2).start()
    lab.popen(lab.hosts[0], ["sleep", "300"])
    lab.popen(lab.controller, ["sleep", "300"])
    print(lab.tag, flush=True)
    time.sleep(300)
""")


def _owner() -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True,
                         cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout is not None
    tag = p.stdout.readline().strip()
    assert tag, "the lab owner printed no tag"
    assert any(x.startswith("pid:") for x in leftovers(tag))
    return p, tag


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_lab_owner_stopped_by_a_signal_removes_its_lab(sig: signal.Signals) -> None:
    p, tag = _owner()
    try:
        p.send_signal(sig)
        assert p.wait(30) == -sig
        assert leftovers(tag) == []
    finally:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_lab_owners_own_signal_handler_still_runs(sig: signal.Signals) -> None:
    """``demo --netns`` stops its cluster on SIGTERM: the lab's handler removed the lab, which
    forgot the demo's handler, and the signal's default action killed the demo (143, no line)."""
    code = textwrap.dedent(f"""
        import signal, sys, time
        from flodl_proto.netlab import NetLab
        stop = []
        signal.signal({int(sig)}, lambda *_: stop.append(1))
        lab = NetLab(2).start()
        print(lab.tag, flush=True)
        while not stop:
            time.sleep(0.05)
        print("handled", flush=True)
        sys.exit(7)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert p.stdout is not None
        tag = p.stdout.readline().strip()
        assert tag, "the lab owner printed no tag"
        p.send_signal(sig)
        assert p.wait(30) == 7
        assert p.stdout.read() == "handled\n"
        assert leftovers(tag) == []
    finally:
        p.kill()
        p.communicate()


def test_a_lab_owner_killed_outright_is_swept_by_the_next_lab() -> None:
    p, tag = _owner()
    p.kill()
    p.communicate()
    # SIGKILL runs no clean-up; the children die with their parent, the namespaces stay
    wait_for(lambda: not any(x.startswith("pid:") for x in leftovers(tag)), 10, "children")
    assert leftovers(tag)
    with NetLab(1) as lab:
        assert leftovers(tag) == []
    assert leftovers(lab.tag) == []


def test_link_controls_apply_and_heal(lab: NetLab) -> None:
    h0, h1 = lab.hosts
    lab.set_rate(h0, 100)
    qd = subprocess.run(["tc", "-n", h0.netns, "qdisc", "show", "dev", "eth0"],
                        capture_output=True, text=True, check=True).stdout
    assert "tbf" in qd and "rate 100Mbit" in qd
    lab.set_loss(h1, 1.0)
    lab.partition(h0)
    rules = lab.rules()
    assert 'iifname "vh0" drop' in rules and 'oifname "vh0" drop' in rules
    assert 'iifname "vh1" numgen random mod 10000 < 100' in rules
    lab.heal(h0)
    lab.set_loss(h1, 0)
    rules = lab.rules()
    assert "vh0" not in rules and "vh1" not in rules
    lab.set_rate(h0, None)
    qd = subprocess.run(["tc", "-n", h0.netns, "qdisc", "show", "dev", "eth0"],
                        capture_output=True, text=True, check=True).stdout
    assert "tbf" not in qd
    lab.link_down(h1)
    link = subprocess.run(["ip", "-n", h1.netns, "link", "show", "eth0"], capture_output=True,
                          text=True, check=True).stdout
    assert "NO-CARRIER" in link
    lab.link_up(h1)


# -- the cluster across namespaces ---------------------------------------------------------------
@pytest.mark.parametrize(("lab", "groups", "version", "bf16"), [
    (2, [[0, 1], [2, 3]], 2, False),
    (3, [[0, 1], [2], [3, 4, 5]], 3, True),
], indirect=["lab"], ids=["v2-f32-2hosts", "v3-bf16-3hosts"])
def test_rounds_across_namespaces_are_byte_exact(lab: NetLab, groups: list[list[int]],
                                                 version: int, bf16: bool) -> None:
    with LabCluster(lab, groups, version=version, bf16=bf16, rounds=4,
                    elems=1 << 16) as cl:
        cl.check_rounds(range(cl.world), 1, 4)
        for r in range(cl.world):
            assert cl.event(r)["ev"] == "done"
        codes = cl.finish()
        assert all(c == 0 for c in codes.values()), (codes, cl.procs["controller"].stderr())
        joined = cl.procs["controller"].stderr()
        for h in range(len(groups)):
            # the relays reached the controller from their own lab addresses
            assert f"from {lab.hosts[h].address}:" in joined
    record_figure("byte-exact", version=version, bf16=bf16, hosts=len(groups),
                  world=sum(map(len, groups)), rounds=4, byte_exact=True)


def test_rate_capped_run_is_byte_exact(lab: NetLab) -> None:
    for node in lab.nodes:
        lab.set_rate(node, 100)
    groups = [[0, 1], [2, 3]]
    with LabCluster(lab, groups, version=3, rounds=3, elems=1 << 20) as cl:
        cl.check_rounds(range(4), 1, 3)
        codes = cl.finish()
        assert all(c == 0 for c in codes.values()), codes
    # the frames went through the controller's capped link: its token bucket sent them
    stats = subprocess.run(["tc", "-s", "-n", lab.controller.netns, "qdisc", "show", "dev",
                            "eth0"], capture_output=True, text=True, check=True).stdout
    sent = int(stats.split("Sent ", 1)[1].split()[0])
    assert sent > 3 * 2 * (1 << 20) * 4, stats  # 3 rounds x 2 Broadcasts of >= 4 MiB
    record_figure("rate-100mbit", version=3, hosts=2, world=4, rounds=3, byte_exact=True,
                  controller_tbf_bytes=sent)


@pytest.mark.parametrize("lab", [3], indirect=True)
def test_one_percent_packet_loss_is_byte_exact(lab: NetLab) -> None:
    for node in lab.nodes:
        lab.set_loss(node, 1.0)
    groups = [[0, 1], [2, 3], [4, 5]]
    # Upstream's timeouts (scale 1): a relay whose SYN-ACK and then first segment are lost
    # sends its channel magic about 3.3 s after the controller accepted it (Linux retransmits
    # a first segment after 3 s when the handshake lost its SYN-ACK): past the port mux's 2 s
    # deadline for the magic at scale 0.3, within its 5 s at scale 1
    with LabCluster(lab, groups, version=2, bf16=True, rounds=4, elems=1 << 17,
                    scale=1.0) as cl:
        cl.check_rounds(range(6), 1, 4)
        codes = cl.finish()
        assert all(c == 0 for c in codes.values()), codes
    dropped = sum(lab.dropped(n) for n in lab.nodes)
    assert dropped > 0  # the loss was real
    record_figure("loss-1pct", version=2, bf16=True, hosts=3, world=6, rounds=4,
                  byte_exact=True, dropped_packets=dropped)


def test_sigkill_of_a_host_relay_ends_the_run_as_upstream_does(lab: NetLab) -> None:
    """Upstream: a relay connection that ends (EOF) while it carries alive ranks ends the run
    cleanly; the other host's ranks see their relay close; nothing hangs."""
    groups = [[0, 1], [2, 3]]
    with LabCluster(lab, groups, version=2, rounds=6, elems=1 << 14, gate=True) as cl:
        cl.go(range(4))
        cl.check_rounds(range(4), 1, 1)
        relay1 = cl.procs["relay1"].popen.pid
        killed = lab.kill(lab.hosts[1])
        assert relay1 in killed and len(killed) == 3  # the relay and its two ranks
        cl.go([0, 1])
        for r in (0, 1):
            ev = cl.event(r)
            assert ev["ev"] == "ended" and ev["round"] == 2, ev
        codes = cl.finish()
        assert codes["controller"] == 0 and codes["relay0"] == 0, codes
        assert codes["relay1"] == -signal.SIGKILL
        assert "relay_eof" in cl.procs["controller"].stdout(), cl.procs["controller"].stdout()
        assert lab.pids(lab.hosts[1]) == [] and lab.pids(lab.controller) == []
        record_figure("sigkill-relay", rounds_completed=1, controller_exit=codes["controller"],
                      outcome="relay_eof", survivors_ended_in_round=2)



def _first_err(proc: Proc, *needles: str) -> float | None:
    """Arrival time of the first stderr line of ``proc`` containing every one of ``needles``."""
    return next((t for t, line in proc.err if all(n in line for n in needles)), None)


#: slack on a detection bound: process scheduling on a loaded machine, the poll periods
DETECTION_MARGIN = 5.0


@pytest.mark.parametrize("lab", [3], indirect=True)
def test_partition_without_a_round_timeout_is_reported_by_keepalive(lab: NetLab) -> None:
    """Host 1 is blackholed between rounds; nothing closes. TCP keepalive (and the user timeout
    on the relay's unacknowledged HostFrame) reports the dead connection within the spec's
    bound on both sides; the controller then ends the run as upstream does when a relay's
    connection ends, and nothing hangs."""
    bound = keepalive_bound()
    groups = [[0, 1], [2, 3], [4, 5]]
    with LabCluster(lab, groups, version=3, rounds=4, elems=1 << 12, gate=True) as cl:
        cl.go(range(6))
        cl.check_rounds(range(6), 1, 1)
        t_cut = time.monotonic()
        lab.partition(lab.hosts[1])
        cl.go(range(6))
        for r in range(6):
            ev = cl.event(r, timeout=bound + 30)
            assert ev["ev"] == "ended" and ev["round"] == 2, (r, ev)
        codes = cl.finish()
        ctl, relay1 = cl.procs["controller"], cl.procs["relay1"]
        seen = _first_err(ctl, f"({lab.hosts[1].address}:", "is dead", "did not answer for")
        assert seen is not None, ctl.stderr()
        assert seen - t_cut <= bound + DETECTION_MARGIN, (seen - t_cut, bound)
        assert codes["controller"] == 0 and "relay_eof" in ctl.stdout(), codes
        # the partitioned relay's own connection failed the same way: a clear one-line error
        assert codes["relay1"] == 1, codes
        err = _first_err(relay1, "flodl-proto relay: ")
        assert err is not None, relay1.stderr()
        last = relay1.stderr().splitlines()[-1]
        assert last.startswith("flodl-proto relay: ") and (
            f"controller {lab.controller.address}:{cl.port}: read on the connection failed: the "
            "peer did not answer for") in last, relay1.stderr()
        assert err - t_cut <= bound + DETECTION_MARGIN, (err - t_cut, bound)
        assert codes["relay0"] == 0 and codes["relay2"] == 0, codes
        record_figure("partition-keepalive", bound=bound, controller_detect=seen - t_cut,
                      relay_detect=err - t_cut, rounds_completed=1)
    for node in lab.nodes:
        assert lab.pids(node) == []


def _status(lab: NetLab, port: int) -> dict[str, Any]:
    """``GET /status`` of the controller, from inside the controller's namespace."""
    def get() -> dict[str, Any]:
        with socket.create_connection((lab.controller.address, port), timeout=10) as s:
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return dict(json.loads(data.split(b"\r\n\r\n", 1)[1]))

    return lab.call_in(lab.controller, get)


@pytest.mark.parametrize("version", [2, 3])
def test_partition_with_a_round_timeout_goes_on_without_the_host(version: int) -> None:
    """Host 1 is blackholed between rounds; with --round-timeout its ranks are declared dead
    within the deadline (+ margin), the other hosts' rounds go on byte-exact, /status lists the
    event; after healing, host 1's relay learns it was declared dead and ends with a clear
    message; nothing is left behind.

    The partitioned relay's own keepalive bound (from its unacknowledged HostFrame) must not run
    out before the controller's DeclareDead, sent into the partition, reaches it: after the heal
    it arrives with the controller's next TCP retransmission, 0.2, 0.6, 1.4, 3.0, 6.2 s after it
    was sent. This cluster runs at FLODL_NET_TIMEOUT_SCALE 0.25 (round deadline 3.75 s,
    keepalive bound 14 s): a heal up to 6 s after the detection is in time (the retransmission
    at 6.2 s, about 10 s after the round started). At 0.2 (3 s, 9 s) only the one at 3.0 s was,
    and a heal 3.6 s after the detection turned the scenario into the keepalive one."""
    scale = 0.25
    timeout = 15.0 * scale  # --round-timeout 15, scaled
    groups = [[0, 1], [2, 3], [4, 5]]
    survivors = [[0, 1], [], [4, 5]]
    with NetLab(3) as lab, LabCluster(lab, groups, version=version, bf16=version == 3,
                                      rounds=5, elems=1 << 12, gate=True, scale=scale,
                                      controller_args=["--round-timeout", "15"]) as cl:
        for k in (1, 2):  # every relay folds (and loads its kernels) before the partition
            cl.go(range(6))
            cl.check_rounds(range(6), k, 1)
        lab.partition(lab.hosts[1])
        t_go = time.monotonic()
        cl.go(range(6))
        ctl = cl.procs["controller"]

        def detected() -> float | None:
            return _first_err(ctl, "('h1', ranks [2, 3]) sent no HostFrame within",
                              "round timeout")

        wait_for(lambda: detected() is not None, timeout + 30, "the round timeout")
        lab.heal(lab.hosts[1])
        seen = detected()
        assert seen is not None and seen - t_go <= timeout + DETECTION_MARGIN, \
            (seen, t_go, timeout)
        assert "('h0'" not in ctl.stderr() and "('h2'" not in ctl.stderr()
        cl.check_rounds([0, 1, 4, 5], 3, 1, groups=survivors)
        relay1 = cl.procs["relay1"]
        assert relay1.wait() == 1
        last = relay1.stderr().splitlines()[-1]
        assert last.startswith("flodl-proto relay: ") and last.endswith(
            "the controller declared every rank of this host dead (ranks [2, 3]) and closed the "
            "connection; the run goes on without this host"), relay1.stderr()
        for r in (2, 3):
            ev = cl.event(r)
            assert ev["ev"] == "ended" and ev["round"] == 3, ev
        st = _status(lab, cl.port)
        assert st["dead_ranks"] == [2, 3]
        assert [(t["round"], t["host"], t["ranks"]) for t in st["round_timeouts"]] == \
            [(3, "h1", [2, 3])]
        assert st["round_timeout"] == pytest.approx(timeout)
        # the survivors go on; host 1's late HostFrame never counted
        for k in (4, 5):
            cl.go([0, 1, 4, 5])
            cl.check_rounds([0, 1, 4, 5], k, 1, groups=survivors)
        for r in (0, 1, 4, 5):
            assert cl.event(r)["ev"] == "done"
        codes = cl.finish()
        assert codes["controller"] == 0 and codes["relay0"] == 0 and codes["relay2"] == 0, codes
        for node in lab.nodes:
            assert lab.pids(node) == []
        relay_end = next(t for t, line in relay1.err if "declared every rank" in line)
        record_figure("partition-round-timeout", version=version, bf16=version == 3,
                      timeout=timeout, detect=seen - t_go, relay_end_after_go=relay_end - t_go,
                      rounds_completed_by_survivors=5, byte_exact=True)
    assert leftovers(lab.tag) == []

"""The network lab's tools: a lab (and its check, :func:`~flodl_proto.netlab.unavailable_reason`)
asks only for the tools its user names (``ip`` always; ``tc`` and ``nft`` only for rate caps,
loss and partitions), so ``demo --netns``, which sets no ``tc`` or nftables rule, runs where
``tc`` and ``nft`` are missing. These tests need no root: they stand in for the machine."""

from __future__ import annotations

import fractions

import numpy as np
import pytest

from flodl_proto import netlab
from flodl_proto.netlab import LAB_TOOLS, LabError, NetLab, unavailable_reason


def _machine(monkeypatch: pytest.MonkeyPatch, *, euid: int,
             installed: tuple[str, ...]) -> list[list[str]]:
    """Linux, ``euid``, only the ``installed`` tools on PATH, and no command really run: the
    commands the probe runs are returned (each succeeds)."""
    ran: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> object:
        ran.append(list(argv))
        return None

    def which(tool: str) -> str | None:
        return f"/sbin/{tool}" if tool in installed else None

    monkeypatch.setattr(netlab, "_REASON", {})
    monkeypatch.setattr(netlab.sys, "platform", "linux")
    monkeypatch.setattr(netlab.os, "geteuid", lambda: euid)
    monkeypatch.setattr(netlab.shutil, "which", which)
    monkeypatch.setattr(netlab, "_run", run)
    return ran


@pytest.mark.parametrize(("tools", "installed", "reason"), [
    (LAB_TOOLS, ("ip",), "the network lab needs iproute2 and nftables: tc, nft not found "
                         "(apt-get install iproute2 nftables)"),
    (("ip",), (), "the network lab needs iproute2: ip not found (apt-get install iproute2)"),
    (("ip", "tc"), ("ip",), "the network lab needs iproute2: tc not found "
                            "(apt-get install iproute2)"),
    (("nft", "ip"), ("ip",), "the network lab needs iproute2 and nftables: nft not found "
                             "(apt-get install iproute2 nftables)"),
])
def test_a_missing_tool_is_named_only_when_the_lab_uses_it(
        monkeypatch: pytest.MonkeyPatch, tools: tuple[str, ...], installed: tuple[str, ...],
        reason: str) -> None:
    _machine(monkeypatch, euid=0, installed=installed)
    assert unavailable_reason(tools) == reason


def test_a_lab_of_ip_only_runs_where_tc_and_nft_are_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's scratch namespace gets no nftables table and no qdisc (``demo --netns`` was
    refused: "needs iproute2 and nftables: tc, nft not found")."""
    ran = _machine(monkeypatch, euid=0, installed=("ip",))
    assert unavailable_reason(("ip",)) is None
    probe = f"flodl-lab-{netlab.os.getpid()}-0-probe"
    assert ran == [["ip", "netns", "add", probe],
                   ["ip", "-n", probe, "link", "add", "b0", "type", "bridge"],
                   ["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                   ["ip", "netns", "delete", probe]]
    assert unavailable_reason() == ("the network lab needs iproute2 and nftables: tc, nft not "
                                    "found (apt-get install iproute2 nftables)")


@pytest.mark.parametrize(("tools", "reason"), [
    (LAB_TOOLS, "the network lab needs root (network namespaces, veth, tc, nftables)"),
    (("ip",), "the network lab needs root (network namespaces, veth)"),
    (("ip", "nft"), "the network lab needs root (network namespaces, veth, nftables)"),
])
def test_without_root_the_reason_names_what_the_lab_would_use(
        monkeypatch: pytest.MonkeyPatch, tools: tuple[str, ...], reason: str) -> None:
    _machine(monkeypatch, euid=1000, installed=LAB_TOOLS)
    assert unavailable_reason(tools) == reason


@pytest.mark.parametrize("tools", [(), ("tc", "nft"), ("ip", "tcpdump"), "ip"])
def test_tools_must_name_ip_and_only_the_lab_s(tools: tuple[str, ...]) -> None:
    message = f"tools must name ip and only ip, tc, nft, got {tools!r}"
    with pytest.raises(ValueError) as e:
        unavailable_reason(tools)
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        NetLab(1, tools)
    assert str(e.value) == message


def test_a_lab_without_tc_or_nft_refuses_the_controls_that_use_them() -> None:
    lab = NetLab(1, ("ip",))
    host = lab.hosts[0]
    assert lab.tools == ("ip",)
    for control, tool in ((lambda: lab.set_rate(host, 10.0), "tc"),
                          (lambda: lab.set_rate(host, None), "tc"),
                          (lambda: lab.set_loss(host, 1.0), "nft"),
                          (lambda: lab.partition(host), "nft"),
                          (lambda: lab.heal(host), "nft")):
        with pytest.raises(LabError) as e:
            control()
        assert str(e.value) == f"this lab was built without {tool} (its tools: ip)"
    assert NetLab(1).tools == LAB_TOOLS


@pytest.mark.parametrize(("mbit", "shown"), [
    (float("inf"), "inf"), (float("nan"), "nan"), (0.0, "0.0"), (-1.0, "-1.0"),
    (0.0005, "0.0005"),
])
def test_a_rate_cap_must_be_finite_and_at_least_one_kbit(mbit: float, shown: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # inf passed the "> 0" check and failed with OverflowError (int(inf)) before tc ran; below
    # 1 kbit/s the cap was written as "0kbit", which tc refused as a LabError
    _machine(monkeypatch, euid=0, installed=LAB_TOOLS)
    lab = NetLab(1)
    with pytest.raises(ValueError) as e:
        lab.set_rate(lab.hosts[0], mbit)
    assert str(e.value) == f"mbit must be a finite number from 0.001 Mbit/s (1 kbit/s), got {shown}"


@pytest.mark.parametrize(("mbit", "shown"), [
    (10**400, "<an integer of 1329 bits>"),  # was math.isfinite's OverflowError
    (-(10**400), "<a negative integer of 1329 bits>"),
    (10**5000, "<an integer of 16610 bits>"),  # was Python's 'Exceeds the limit (4300 digits)'
    (-(10**5000), "<a negative integer of 16610 bits>"),
    (fractions.Fraction(10**400, 3), "<a Fraction of 1329 bits over 2 bits>"),
], ids=["10**400", "-10**400", "10**5000", "-10**5000", "Fraction(10**400, 3)"])
def test_a_rate_cap_past_a_floats_range_is_named_by_its_size_whatever_its_size_or_type(
        mbit: object, shown: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An int too large for a float is the ValueError of any rate out of range, named by its
    size as every message names a wide number (errors.shown), before tc runs: 10**400 raised
    math.isfinite's OverflowError, which the docstring does not list, and an int of more than
    4300 digits, which Python refuses to write as text, Python's own ValueError about integer
    string conversion; a Fraction past a float's range by its numerator's and denominator's
    sizes (the lab had its own rule, 'an integer of 401 digits', without the sign)."""
    ran = _machine(monkeypatch, euid=0, installed=LAB_TOOLS)
    lab = NetLab(1)
    before = len(ran)
    with pytest.raises(ValueError) as e:
        lab.set_rate(lab.hosts[0], mbit)  # type: ignore[arg-type]
    assert str(e.value) == f"mbit must be a finite number from 0.001 Mbit/s (1 kbit/s), got {shown}"
    assert len(ran) == before  # no tc command


@pytest.mark.parametrize(("mbit", "shown"), [
    ("5", "str '5'"), (True, "bool True"), (False, "bool False"), (b"5", "bytes b'5'"),
    (1 + 0j, "complex (1+0j)"), (np.bool_(True), "bool np.True_"),
])
def test_a_rate_cap_that_is_no_number_is_refused_naming_mbit(
        mbit: object, shown: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Text was refused by math.isfinite's TypeError ('must be real number, not str'), naming
    neither the argument nor the value, and True was taken as a cap of 1 Mbit/s (tc ran); both
    are refused naming ``mbit`` and the value, before tc runs."""
    ran = _machine(monkeypatch, euid=0, installed=LAB_TOOLS)
    lab = NetLab(1)
    before = len(ran)
    with pytest.raises(TypeError) as e:
        lab.set_rate(lab.hosts[0], mbit)  # type: ignore[arg-type]
    assert str(e.value) == f"mbit must be a number of Mbit/s or None, got {shown}"
    assert len(ran) == before  # no tc command


@pytest.mark.parametrize("mbit", [2.5, np.float64(2.5), np.float32(2.5)])
def test_a_rate_cap_of_a_real_number_is_given_to_tc_in_kbit(
        mbit: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A float or a NumPy floating scalar is a cap (the check of a number's type refuses text
    and bools only): 2.5 Mbit/s is ``2500kbit`` on both ends of the host's link."""
    ran = _machine(monkeypatch, euid=0, installed=LAB_TOOLS)
    lab = NetLab(1)
    before = len(ran)
    lab.set_rate(lab.hosts[0], mbit)
    rates = [argv[argv.index("rate") + 1] for argv in ran[before:] if "tbf" in argv]
    assert rates == ["2500kbit", "2500kbit"]

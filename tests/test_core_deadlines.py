"""``ControllerCore.next_deadline``: the core names when it needs its clock (aioquic's
``get_timer``), and the reduce's parallelism is handed in by the runner."""

from __future__ import annotations

import numpy as np
import pytest

from flodl_proto.codec import (
    MuxRecord,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_channel_magic,
    encode_frame_record,
)
from flodl_proto.codec.mux import Hello, encode_mux_record_bytes
from flodl_proto.errors import InvalidValue
from flodl_proto.fsm.controller_core import HANDSHAKE_TIMEOUT, REDUCE_POLL, ControllerCore
from flodl_proto.fsm.deadline import RoundDeadline
from flodl_proto.fsm.events import RoundScattered

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")


def _hello(ranks: list[int]) -> bytes:
    return encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(Hello("h", ranks)), SALT)


def _frame(value: float) -> bytes:
    f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(np.asarray([value],
                                                                              np.float32))])
    return b"".join(bytes(b) for b in encode_frame_record(RecordKind.HOST_FRAME, f, SALT))


def test_next_deadline_follows_the_phases() -> None:
    core = ControllerCore(2, SALT)
    assert core.next_deadline(0.0) is None  # idle
    core.start()
    assert core.next_deadline(1.0) is None  # accepting, nobody connected
    core.connection_opened(7, 2.0)
    core.connection_opened(8, 3.0)
    assert core.next_deadline(4.0) == 2.0 + HANDSHAKE_TIMEOUT  # the earliest pending Hello
    core.receive_data(7, _hello([0]))
    assert core.next_deadline(4.0) == 3.0 + HANDSHAKE_TIMEOUT
    core.receive_data(8, _hello([1]))
    assert core.state == "reducing"
    assert core.next_deadline(5.0) == 5.0 + REDUCE_POLL  # a round waits
    core.receive_data(7, _frame(1.0))
    assert core.next_deadline(6.0) == 6.0 + REDUCE_POLL  # still waiting for relay 1
    acts = core.receive_data(8, _frame(2.0))
    assert any(isinstance(a, RoundScattered) for a in acts)
    assert core.next_deadline(7.0) == 7.0 + REDUCE_POLL  # the next round waits
    core.stop()
    assert core.next_deadline(8.0) is None


def test_reduce_threads_do_not_change_the_consensus() -> None:
    outs = []
    for threads in (1, 3):
        core = ControllerCore(1, SALT, reduce_threads=threads)
        core.start()
        core.connection_opened(0, 0.0)
        core.receive_data(0, _hello([0]))
        acts = core.receive_data(0, _frame(3.5))
        notice = [a for a in acts if isinstance(a, RoundScattered)]
        assert len(notice) == 1 and notice[0].weight == 1.0
        outs.append([bytes(b) for a in acts if hasattr(a, "buffers") for b in a.buffers])
    assert outs[0] == outs[1]


def test_round_deadline_waited_counts_from_the_first_deposit() -> None:
    d = RoundDeadline(1.5)
    assert d.waited(5.0) == 0.0 and d.due() is None and not d.expired(5.0)
    d.deposit(2.0)
    d.deposit(3.0)  # only the round's first deposit starts the clock
    assert d.waited(2.25) == 0.25 and d.waited(1.0) == 0.0  # an earlier clock reading: 0
    assert d.due() == 3.5 and not d.expired(3.25) and d.expired(3.5)
    d.reset()
    assert d.started is None and d.waited(9.0) == 0.0


@pytest.mark.parametrize("value", [-1.0, 0.0, float("inf"), float("nan")])
def test_a_bad_timeout_names_its_value(value: float) -> None:
    with pytest.raises(InvalidValue) as ei:
        RoundDeadline(value)
    assert ei.value.fields["name"] == "round_timeout"
    # inf is positive: the rule says finite
    assert str(ei.value) == (f"round_timeout must be a finite number of seconds above 0, got "
                             f"{value!r}")


@pytest.mark.parametrize(("value", "shown"), [("1", "'1'"), ("abc", "'abc'"), ([1], "[1]"),
                                              (True, "True"),
                                              (10**400, "<an integer of 1329 bits>")])
def test_a_timeout_of_another_type_is_the_local_bad_timeout(value: object, shown: str) -> None:
    """Text, a list, a bool or an int beyond any float is refused with the local
    deadline.bad_timeout naming the option and the value, as a negative one is (no bare
    ValueError, TypeError or OverflowError; "1" and True are not taken as 1 s)."""
    with pytest.raises(InvalidValue) as ei:
        RoundDeadline(value, "rank_timeout")  # type: ignore[arg-type]
    assert not ei.value.remote and ei.value.error_id == "deadline.bad_timeout"
    assert str(ei.value) == ("rank_timeout must be a finite number of seconds above 0, got "
                             f"{shown}")


def test_a_timeout_too_long_once_scaled_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is TIMEOUT_OPTION_MAXIMUM (864000 s) on the scaled value: a huge option times
    the scale overflowed the waits' arithmetic later (1e308 x 10 is inf)."""
    from flodl_proto.fsm.deadline import check_timeout
    from flodl_proto.spec import SPEC

    assert SPEC.timeout("TIMEOUT_OPTION_MAXIMUM") == 864000.0
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "10")
    assert check_timeout("round_timeout", 86400.0) == 86400.0  # at the bound
    with pytest.raises(InvalidValue) as ei:
        check_timeout("round_timeout", 86400.5)
    assert not ei.value.remote and ei.value.error_id == "deadline.too_long"
    assert str(ei.value) == ("round_timeout=86400.5 seconds times the net timeout scale 10 is "
                             "864005 s, above the maximum 864000 s")
    with pytest.raises(InvalidValue) as ei:
        check_timeout("rank_timeout", 1e308)
    assert ei.value.fields["scaled"] == float("inf")
    assert check_timeout("rank_timeout", 864000.0, scale=1.0) == 864000.0
    with pytest.raises(InvalidValue):
        RoundDeadline(864001.0, "rank_timeout")  # scaled already: the scale is not applied


def test_the_runners_refuse_a_timeout_too_long_once_scaled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from flodl_proto.runner.controller import ReferenceController
    from flodl_proto.runner.relay import Relay

    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "1000")
    with pytest.raises(InvalidValue) as ei:
        ReferenceController(1, SALT, round_timeout=865.0)
    assert ei.value.fields["name"] == "round_timeout" and ei.value.fields["value"] == 865.0
    with pytest.raises(InvalidValue) as ei:
        Relay("127.0.0.1:1", [0], 1, SALT, rank_timeout=1e300)
    assert ei.value.fields["name"] == "rank_timeout" and ei.value.fields["value"] == 1e300


@pytest.mark.parametrize(("command", "where", "option"), [
    ("controller", ["--listen", "127.0.0.1:0"], "--round-timeout"),
    ("relay", ["--controller", "127.0.0.1:1", "--ranks", "0"], "--rank-timeout"),
])
def test_cli_timeout_too_long_is_a_usage_error_naming_the_option(
        command: str, where: list[str], option: str) -> None:
    """The command's message names the option that gave the value, not the library's
    parameter (``round_timeout=`` / ``rank_timeout=``)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": "0.1"}
    r = subprocess.run([sys.executable, "-m", "flodl_proto", command, *where, "--world-size",
                        "1", "--salt", "00" * 16, option, "1e7"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == (
        f"flodl-proto {command}: error: argument {option}: must be a finite number of seconds "
        "above 0, at most 864000 s once scaled by FLODL_NET_TIMEOUT_SCALE (0.1), got '1e7' "
        "(1e+06 s scaled)")


def test_for_option_rewords_only_its_parameter_s_timeout_errors() -> None:
    from flodl_proto.commands.relay import for_option
    from flodl_proto.errors import protocol_error

    e = protocol_error("deadline.bad_timeout", name="rank_timeout", value=-1.0)
    got = for_option(e, "rank_timeout", "--rank-timeout")
    assert isinstance(got, ValueError)
    assert str(got) == ("argument --rank-timeout: must be a finite number of seconds above 0, at "
                        "most 864000 s once scaled by FLODL_NET_TIMEOUT_SCALE, got -1.0")
    long = protocol_error("deadline.too_long", name="rank_timeout", value=1e20, scale=1.0,
                          scaled=1e20, maximum=864000.0)
    assert str(for_option(long, "rank_timeout", "--rank-timeout")) == (
        "argument --rank-timeout: must be a finite number of seconds above 0, at most 864000 s "
        "once scaled by FLODL_NET_TIMEOUT_SCALE (1), got 1e+20 (1e+20 s scaled)")
    assert for_option(e, "round_timeout", "--round-timeout") is e  # another parameter's
    other = protocol_error("addr.invalid", field="--listen", value="x", reason="r")
    assert for_option(other, "rank_timeout", "--rank-timeout") is other
    plain = ValueError("rank_timeout")
    assert for_option(plain, "rank_timeout", "--rank-timeout") is plain

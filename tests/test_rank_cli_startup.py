"""``flodl-proto rank`` at start-up: the relay's host name is looked up once the command line is
checked, before the relay is dialled (commands/relay.py ``check_host_resolves``, as the relay's
``--controller``); a name that does not exist was dialled, as a relay not there yet, for about
30 s, then exit 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import closed_port
from .resolver_stub import PATCHED_CLI

pytestmark = pytest.mark.timeout(60)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"

#: the rank's command line up to the relay's address
RANK = [sys.executable, "-m", "flodl_proto.cli", "rank", "--rank", "0", "--world-size", "1",
        "--salt", SALT_HEX, "--relay"]


def _run(args: list[str], scale: str = "0.1") -> subprocess.CompletedProcess[str]:
    """``args`` run to their end; ``scale``: ``FLODL_NET_TIMEOUT_SCALE`` (0.1: a resolver wait
    of 1 s, and a relay not there is dialled for about 3 s)."""
    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": scale}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=30)


def test_a_relay_name_that_does_not_exist_is_a_usage_error_before_dialling() -> None:
    """A real lookup of an ``.invalid`` name (RFC 6761: never resolves; no network needed). A
    resolver that cannot answer here (no name server reachable) makes the rank go on with a
    warning: that is the other tests' subject, so this one is skipped then."""
    res = _run([*RANK, "nosuch.invalid:7004"])
    first = res.stderr.splitlines()[0] if res.stderr else ""
    if first.startswith("flodl-proto rank 0: warning: "):
        pytest.skip(f"this machine's resolver cannot answer: {first.strip()}")
    assert (res.returncode, res.stdout) == (2, "")
    prefix = ("flodl-proto rank: error: argument --relay: 'nosuch.invalid:7004': cannot "
              "resolve host 'nosuch.invalid': ")
    assert res.stderr.startswith(prefix) and res.stderr.count("\n") == 1
    assert len(res.stderr.strip()) > len(prefix)  # the resolver's reason follows


def test_the_resolver_saying_no_such_name_is_one_line_and_exit_2() -> None:
    res = _run([sys.executable, "-c", PATCHED_CLI, "noname", *RANK[3:], "nosuch.invalid:7004"])
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("flodl-proto rank: error: argument --relay: 'nosuch.invalid:7004': "
                          "cannot resolve host 'nosuch.invalid': Name or service not known\n")


@pytest.mark.parametrize(("change", "error"), [
    (("--salt", "abc"), "flodl-proto rank: error: argument --salt: "),
    (("--payload-mib", "1", "--frame-ceiling", "1000"),
     "flodl-proto rank: error: argument --payload-mib: '1' makes a "),
], ids=["salt", "frame-over-ceiling"])
def test_other_usage_errors_are_reported_without_a_lookup(change: tuple[str, ...],
                                                          error: str) -> None:
    """The lookup comes last: a bad salt, or a frame above the ceiling, is reported at once even
    when the resolver would never answer."""
    args = [*RANK[3:], "nosuch.invalid:7004"]
    if change[0] == "--salt":
        args[args.index(SALT_HEX)] = change[1]
    else:
        args += change
    res = _run([sys.executable, "-c", PATCHED_CLI, "slow", *args], scale="10")  # a wait of 100 s
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.startswith(error) and res.stderr.count("\n") == 1, res.stderr


@pytest.mark.parametrize(("mode", "why"), [
    ("again", "cannot resolve host 'nosuch.invalid' now (Temporary failure in name "
              "resolution)"),
    ("slow", "host 'nosuch.invalid' did not resolve within 1s"),
])
def test_a_resolver_that_cannot_answer_now_is_a_warning_and_the_rank_goes_on(
        mode: str, why: str) -> None:
    """A temporary failure, or no answer within 10 s x scale: the rank cannot tell a typo from a
    resolver that is down, so it warns and dials (looking the name up again, found here: the
    relay is not there, so the rank waits for it, then gives up)."""
    port = closed_port()
    relay = f"nosuch.invalid:{port}"
    res = _run([sys.executable, "-c", PATCHED_CLI, mode, *RANK[3:], relay])
    lines = res.stderr.splitlines()
    assert (res.returncode, res.stdout) == (1, ""), res.stderr
    assert lines[0] == (f"flodl-proto rank 0: warning: --relay '{relay}': {why}; going on (the "
                        "dial looks it up again)")
    assert lines[1].startswith(f"flodl-proto rank 0: waiting for the relay: connect to {relay} "
                               "failed: ")
    assert lines[-1].startswith("flodl-proto rank 0: error: ") and len(lines) == 3


def test_a_ctrl_c_the_lookups_thread_got_stops_the_rank_at_once() -> None:
    """The kernel may give a process's Ctrl-C to any of its threads: the stub sends it to the
    lookup's thread alone. The main thread waited for that thread in one untimed step of up to
    10 s x scale (100 s here), and the handler ran only once the wait ended (the rank was still
    running after 30 s); the wait goes in 0.1 s steps, so the stop is as the one the main
    thread gets: one line, exit 130."""
    res = _run([sys.executable, "-c", PATCHED_CLI, "sigint-thread", *RANK[3:],
                "nosuch.invalid:7004"], scale="10")
    assert (res.returncode, res.stdout, res.stderr) == (130, "", "flodl-proto rank 0: "
                                                                 "interrupted\n")


@pytest.mark.parametrize("rank", ["-1", "1"])
def test_a_rank_outside_the_world_is_a_usage_error_naming_the_option(rank: str) -> None:
    """It was the client's error under the prefix of the rank it names (``flodl-proto rank -1:
    error: cpu_reduce: rank_id -1 must be >= 0``), after the relay's address was dialled."""
    args = [*RANK, f"127.0.0.1:{closed_port()}"]
    args[args.index("--rank") + 1] = rank
    res = _run(args)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == (f"flodl-proto rank: error: argument --rank: must be in 0..0 (below "
                          f"--world-size), got {rank}\n")

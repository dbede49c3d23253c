"""``flodl-proto rank --rounds``: the relay's client runs at least one round (and at most
1000000). A rank that leaves ends the run for every rank (RankExit, as flodl), so ``--rounds 0``
(join, then leave at once) is refused before anything is dialed."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"


@pytest.mark.parametrize("rounds", ["0", "-1"])
def test_fewer_than_one_round_is_a_usage_error_and_nothing_is_dialed(rounds: str) -> None:
    with socket.socket() as relay:  # stands for the relay: it must see no connection
        relay.bind(("127.0.0.1", 0))
        relay.listen(4)
        port = relay.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "flodl_proto.cli", "rank", "--relay", f"127.0.0.1:{port}",
             "--rank", "0", "--world-size", "2", "--salt", SALT_HEX, "--rounds", rounds],
            capture_output=True, text=True, timeout=30)
        relay.setblocking(False)
        with pytest.raises(BlockingIOError):
            relay.accept()[0].close()  # a rank that joined, even for no round
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == (f"flodl-proto rank: error: argument --rounds: must be in 1..1000000, got "
                          f"{rounds}\n")


def test_the_help_says_at_least_one_round_and_why() -> None:
    res = subprocess.run([sys.executable, "-m", "flodl_proto.cli", "rank", "--help"],
                         capture_output=True, text=True, timeout=30,
                         env={"COLUMNS": "400", "PATH": ""})
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.lstrip().startswith("--rounds K"))
    assert ("rounds to run, 1 to 1000000 (default 5); then the rank leaves, which ends the run "
            "for every rank, as flodl does") in line

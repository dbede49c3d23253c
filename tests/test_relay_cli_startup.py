"""``flodl-proto relay`` at start-up: the controller's host name is looked up before the relay
binds its port and waits for its ranks (commands/relay.py ``check_host_resolves``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flodl_proto.commands.relay import check_host_resolves

from .resolver_stub import PATCHED_CLI

pytestmark = pytest.mark.timeout(60)

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"

#: the relay's command line up to the controller's address
RELAY = [sys.executable, "-m", "flodl_proto.cli", "relay", "--ranks", "0", "--world-size", "1",
         "--salt", SALT_HEX, "--listen-port", "0", "--controller"]


def _patched_relay(mode: str, controller: str) -> subprocess.Popen[str]:
    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": "0.1"}  # the resolver wait: 1 s
    return subprocess.Popen([sys.executable, "-c", PATCHED_CLI, mode, *RELAY[3:], controller],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen[str], timeout: float = 20) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the relay was still running after {timeout}s: stdout {out!r}, "
                    f"stderr {err!r}")


def test_a_controller_name_that_does_not_exist_is_a_usage_error_before_listening() -> None:
    """A real lookup of an ``.invalid`` name (RFC 6761: never resolves; no network needed). The
    relay used to bind its port and wait for its ranks, and reported the name only when it
    dialed. A resolver that cannot answer here (no name server reachable) makes the relay go on
    with a warning: that is the other test's subject, so this one is skipped then."""
    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": "0.1"}
    proc = subprocess.Popen([*RELAY, "nosuch.invalid:7999"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the error, or the warning of a resolver that cannot answer
    if first.startswith("flodl-proto relay: warning: "):
        proc.kill()
        proc.communicate()
        pytest.skip(f"this machine's resolver cannot answer: {first.strip()}")
    out, rest = _finish(proc)
    assert (proc.returncode, out, rest) == (2, "", "")
    assert first.startswith("flodl-proto relay: error: argument --controller: "
                            "'nosuch.invalid:7999': cannot resolve host 'nosuch.invalid': ")
    assert first.endswith("\n") and len(first.strip()) > len(
        "flodl-proto relay: error: argument --controller: 'nosuch.invalid:7999': cannot "
        "resolve host 'nosuch.invalid': ")  # the resolver's reason follows


def test_the_resolver_saying_no_such_name_is_one_line_and_exit_2() -> None:
    proc = _patched_relay("noname", "nosuch.invalid:7999")
    out, err = _finish(proc)
    assert (proc.returncode, out) == (2, "")
    assert err == ("flodl-proto relay: error: argument --controller: 'nosuch.invalid:7999': "
                   "cannot resolve host 'nosuch.invalid': Name or service not known\n")


def test_other_usage_errors_are_reported_without_a_lookup() -> None:
    """The lookup comes last: a bad salt is reported at once even when the resolver would never
    answer."""
    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": "10"}  # a resolver wait of 100 s
    args = [*RELAY[3:], "nosuch.invalid:7999"]
    args[args.index(SALT_HEX)] = "abc"
    res = subprocess.run([sys.executable, "-c", PATCHED_CLI, "slow", *args], capture_output=True,
                         text=True, env=env, timeout=30)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.startswith("flodl-proto relay: error: argument --salt: ")


@pytest.mark.parametrize(("mode", "why"), [
    ("again", "cannot resolve host 'nosuch.invalid' now (Temporary failure in name "
              "resolution)"),
    ("slow", "host 'nosuch.invalid' did not resolve within 1s"),
])
def test_a_resolver_that_cannot_answer_now_is_a_warning_and_the_relay_goes_on(
        mode: str, why: str) -> None:
    """A temporary failure, or no answer within 10 s x scale: the relay cannot tell a typo from
    a resolver that is down, so it warns and goes on (the dial looks the name up again)."""
    proc = _patched_relay(mode, "nosuch.invalid:7999")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stderr.readline() == (f"flodl-proto relay: warning: --controller "
                                          f"'nosuch.invalid:7999': {why}; going on (the dial "
                                          "looks it up again)\n")
        assert proc.stdout.readline().startswith("listening on 127.0.0.1:")
        proc.terminate()
        out, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "relay finished: clean (stop: stopped by a signal)"


def test_sigterm_while_the_controller_name_is_looked_up_is_one_line_and_exit_143() -> None:
    """SIGTERM arrives while the resolver is asked (the stub sends it as the lookup starts, and
    never answers; the wait, 100 s, is not reached). The relay sets its own handlers only after
    the lookup, so SIGTERM ended it by the signal, with no line, where Ctrl-C there was one line
    and exit 130: now it is one line too, ``terminated``, and exit 143, as demo and conform end
    on it; Ctrl-C there is as it was."""
    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": "10"}  # a resolver wait of 100 s
    for mode, code, word in (("sigterm", 143, "terminated"), ("sigint", 130, "interrupted")):
        proc = subprocess.Popen([sys.executable, "-c", PATCHED_CLI, mode, *RELAY[3:],
                                 "nosuch.invalid:7999"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        out, err = _finish(proc)
        assert (proc.returncode, out, err) == (code, "", f"flodl-proto relay: {word}\n"), mode


@pytest.mark.parametrize(("mode", "code", "word"), [
    ("sigterm-thread", 143, "terminated"), ("sigint-thread", 130, "interrupted")])
def test_a_signal_the_lookups_thread_got_stops_the_relay_at_once(mode: str, code: int,
                                                                 word: str) -> None:
    """The kernel may give a process's SIGTERM or Ctrl-C to any of its threads: the stub sends
    it to the lookup's thread alone. The main thread waited for that thread in one untimed
    step of up to 10 s x scale (100 s here), and the handler ran only once the wait ended (the
    relay was still running after 20 s); the wait goes in 0.1 s steps, so the stop is as the
    one the main thread gets."""
    env = {**os.environ, "FLODL_NET_TIMEOUT_SCALE": "10"}  # a resolver wait of 100 s
    proc = subprocess.Popen([sys.executable, "-c", PATCHED_CLI, mode, *RELAY[3:],
                             "nosuch.invalid:7999"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out, err = _finish(proc)
    assert (proc.returncode, out, err) == (code, "", f"flodl-proto relay: {word}\n")


def _resolver(monkeypatch: pytest.MonkeyPatch, answer: Callable[[str], Any]) -> list[str]:
    asked: list[str] = []

    def fake(host: str, *args: object, **kwargs: object) -> Any:
        asked.append(host)
        return answer(host)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return asked


def test_check_host_resolves_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    addr = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 7999))]
    asked = _resolver(monkeypatch, lambda host: addr)
    assert check_host_resolves("--controller", "ctl:7999", ("ctl", 7999), 5) is None
    assert asked == ["ctl"]

    def nodata(host: str) -> Any:
        raise socket.gaierror(socket.EAI_NODATA, "No address associated with hostname")

    _resolver(monkeypatch, nodata)
    with pytest.raises(ValueError) as e:
        check_host_resolves("--controller", " ctl:1 ", ("ctl", 1), 5)
    assert str(e.value) == ("argument --controller: ' ctl:1 ': cannot resolve host 'ctl': No "
                            "address associated with hostname")

    def fail(host: str) -> Any:
        raise socket.gaierror(socket.EAI_FAIL, "Non-recoverable failure in name resolution")

    _resolver(monkeypatch, fail)
    assert check_host_resolves("--controller", "ctl:1", ("ctl", 1), 5) == (
        "--controller 'ctl:1': cannot resolve host 'ctl' now (Non-recoverable failure in name "
        "resolution); going on (the dial looks it up again)")


def test_check_host_resolves_waits_at_most_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    _resolver(monkeypatch, lambda host: release.wait(30))
    try:
        line = check_host_resolves("--controller", "ctl:1", ("ctl", 1), 0.05)
    finally:
        release.set()
    assert line == ("--controller 'ctl:1': host 'ctl' did not resolve within 0.05s; going on "
                    "(the dial looks it up again)")

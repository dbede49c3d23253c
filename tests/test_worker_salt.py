"""The salt of the processes started with ``$FLODL_SESSION_SALT`` alone: the demo's rank worker
(:mod:`flodl_proto.commands._demo_worker`) and the network lab's rank (:mod:`tests.netlab_worker`)
read it with the commands' one salt parser (:func:`flodl_proto.commands.relay.env_salt`), so a
missing or malformed value is one ``error`` event naming the variable and what is wrong, exit 2,
before any connection."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flodl_proto.commands import _demo_worker
from flodl_proto.commands.relay import env_salt

from . import netlab_worker

SALT_HEX = "5a17c0de429901fe3c88b70d6e21f493"

#: the variable's value (None: unset) and the line that refuses it
REFUSED = [
    (None, "$FLODL_SESSION_SALT is not set: WHO takes the session salt from it, as 32 hex "
           "digits"),
    (" \t", "$FLODL_SESSION_SALT is empty: WHO takes the session salt from it, as 32 hex digits"),
    ("zz", "$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex digits, got 2 "
           "characters, character 1 ('z') not a hex digit"),
    ("0" * 30, "$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex digits, got "
               "30 characters"),
    ("0" * 34, "$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32 hex digits, got "
               "34 characters"),
]

#: a relay address where nothing listens: a worker that got past its salt would fail to connect
NOWHERE = "127.0.0.1:1"


def _set(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("FLODL_SESSION_SALT", raising=False)
    else:
        monkeypatch.setenv("FLODL_SESSION_SALT", value)


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize(("value", "line"), REFUSED)
def test_the_demo_worker_refuses_a_bad_salt_in_one_line(
        value: str | None, line: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """It ended with ``KeyError: 'FLODL_SESSION_SALT'``, ``ValueError: non-hexadecimal number
    found in fromhex() arg at position 0`` or, for hex of the wrong length, the rank client's
    ``LocalInvalidValue: session salt must be 16 bytes, got 15``, exit 1."""
    _set(monkeypatch, value)
    cfg = {"rank": 3, "world_size": 4, "seed": 7, "rounds": 1, "relay": NOWHERE, "version": 2}
    assert _demo_worker.main([json.dumps(cfg)]) == 2
    out, _ = capsys.readouterr()
    assert _events(out) == [{"ev": "error", "rank": 3,
                             "error": line.replace("WHO", "the demo's rank worker")}]


@pytest.mark.parametrize(("value", "line"), REFUSED)
def test_the_netlab_worker_refuses_a_bad_salt_in_one_line(
        value: str | None, line: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """It ended in a KeyError's or a ValueError's traceback, or, for hex of the wrong length,
    reported ``ended`` at round 0 and exit 0, as if its relay had closed."""
    _set(monkeypatch, value)
    cfg = {"rank": 0, "world": 1, "relay": NOWHERE, "version": 2, "bf16": False, "rounds": 1,
           "elems": 4}
    assert netlab_worker.main(cfg) == 2
    out, _ = capsys.readouterr()
    assert _events(out) == [{"ev": "error", "error": line.replace("WHO", "a network-lab rank")}]


@pytest.mark.parametrize("value", [SALT_HEX, f"  {SALT_HEX}\n", SALT_HEX.upper(),
                                   " ".join(SALT_HEX[i:i + 2] for i in range(0, 32, 2))])
def test_env_salt_takes_what_salt_takes(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLODL_SESSION_SALT", value)
    assert env_salt("x") == bytes.fromhex(SALT_HEX)


@pytest.mark.parametrize(("value", "line"), REFUSED[2:])
def test_a_command_and_a_worker_refuse_a_malformed_variable_in_one_wording(
        value: str, line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The salt's parsing has one home (:mod:`flodl_proto.commands._salt`): a command given the
    variable alone (:func:`~flodl_proto.commands.relay.cli_salt`) and a worker
    (:func:`env_salt`) read it with the same functions, and refuse it in the same line."""
    from flodl_proto.commands import _salt, relay

    assert (relay.env_salt, relay.cli_salt, relay.parse_salt, relay.resolve_salt) == (
        _salt.env_salt, _salt.cli_salt, _salt.parse_salt, _salt.resolve_salt)
    _set(monkeypatch, value)
    for read in (lambda: relay.cli_salt(None, None), lambda: env_salt("x")):
        with pytest.raises(ValueError) as e:
            read()
        assert str(e.value) == line


@pytest.mark.parametrize("value", [None, ""])
def test_a_worker_may_say_in_its_own_words_how_the_variable_is_given(
        value: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``missing`` replaces the words after ``is not set:`` (the benchmarks' workers say the
    benchmark sets it); a malformed value keeps the one wording."""
    _set(monkeypatch, value)
    with pytest.raises(ValueError) as e:
        env_salt("x", missing="--worker needs it")
    state = "not set" if value is None else "empty"
    assert str(e.value) == f"$FLODL_SESSION_SALT is {state}: --worker needs it"

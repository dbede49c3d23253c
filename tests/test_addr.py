"""``flodl_proto.addr``: HOST:PORT text to ``(host, port)`` and back; bad text is a local
InvalidValue naming the field and the value."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from flodl_proto.addr import PORT_MAX, format_addr, parse_addr
from flodl_proto.errors import InvalidValue, LocalProtocolError, shown
from flodl_proto.runner import _netio

_NEEDS_BRACKETS = "an IPv6 address needs brackets: [ADDRESS]:PORT, e.g. [::1]:5555"


@pytest.mark.parametrize(("text", "want"), [
    ("127.0.0.1:5555", ("127.0.0.1", 5555)),
    ("node-3:0", ("node-3", 0)),
    ("  localhost:65535\n", ("localhost", 65535)),
    ("[::1]:5555", ("::1", 5555)),
    ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
    ("h:007", ("h", 7)),
])
def test_parse_addr(text: str, want: tuple[str, int]) -> None:
    assert parse_addr(text) == want


@pytest.mark.parametrize(("addr", "want"), [
    (("127.0.0.1", 5555), "127.0.0.1:5555"),
    (("::1", 5555), "[::1]:5555"),
    (("::1", 80, 0, 0), "[::1]:80"),  # an IPv6 socket address's extra items are ignored
    (("node-3", 0), "node-3:0"),
])
def test_format_addr(addr: tuple[str, int], want: str) -> None:
    assert format_addr(addr) == want
    assert parse_addr(want) == (addr[0], addr[1])


@pytest.mark.parametrize(("addr", "reason"), [
    (("h", 70000), "port 70000 is not in 0..65535"),  # was 'h:70000', which no parse takes
    (("h", True), "port True is not an integer"),
    (("", 1), "no host"),
    ("h:1", "format_addr takes a (host, port) pair (parse_addr takes the text)"),
])
def test_format_addr_refuses_what_parse_addr_refuses(addr: Any, reason: str) -> None:
    with pytest.raises(InvalidValue) as ei:
        format_addr(addr)
    assert not ei.value.remote and ei.value.error_id == "addr.invalid"
    assert str(ei.value).endswith(f": not a HOST:PORT address: {reason}")


@pytest.mark.parametrize(("text", "reason"), [
    ("localhost", "no port"),
    ("", "no port"),
    ("[::1]", "no port"),  # a bracketed host alone: its colons are not a port's
    (" [fe80::2] ", "no port"),
    (":5555", "no host"),
    ("[]:5555", "no host"),
    ("[::1:5555", "unbalanced brackets around the host"),
    ("::1", _NEEDS_BRACKETS),  # not host ":" and port 1
    ("::1:5555", _NEEDS_BRACKETS),  # the address ::1:5555, or ::1 and port 5555?
    ("fe80::1%eth0:80", _NEEDS_BRACKETS),
    ("::1]:5555", "unbalanced brackets around the host"),
    ("host:", "port '' is not a decimal number"),
    ("host:http", "port 'http' is not a decimal number"),
    ("host:-1", "port '-1' is not a decimal number"),
    ("host:+80", "port '+80' is not a decimal number"),
    # text int() reads says why it is refused
    ("host:8_0", "port '8_0' is not a decimal number (a number is written in ASCII digits, "
                 "without '_')"),
    ("host:\u0665", "port '\u0665' is not a decimal number (a number is written in ASCII "
                     "digits, without '_')"),  # a non-ASCII digit
    ("host:\uff17\uff10\uff10\uff10", "port '\uff17\uff10\uff10\uff10' is not a decimal number (a "
                                "number is written in ASCII digits, without '_')"),
    ("host:65536", f"port 65536 is not in 0..{PORT_MAX}"),
    ("host:99999999999999999999", "port 99999999999999999999 is not in 0..65535"),
    # a port of more than 20 digits was cut at 20 ("99999999999999999999..."), where every
    # other integer of a message is whole up to 80 digits and shown by its size beyond
    ("host:999999999999999999991", "port 999999999999999999991 is not in 0..65535"),
    ("host:" + "9" * 80, f"port {'9' * 80} is not in 0..65535"),
    ("host:" + "9" * 81, "port <an integer of 270 bits> is not in 0..65535"),
    # more digits than int() converts (4300): was its ValueError, a traceback on the CLI
    ("host:" + "9" * 4301, "port <an integer of 14288 bits> is not in 0..65535"),
    ("host:" + "0" * 5000 + "65536", "port 65536 is not in 0..65535"),
])
def test_parse_addr_bad_text_names_field_and_value(text: str, reason: str) -> None:
    with pytest.raises(InvalidValue) as ei:
        parse_addr(text, field="--controller")
    e = ei.value
    assert isinstance(e, LocalProtocolError)
    assert e.error_id == "addr.invalid"
    assert e.fields == {"field": "--controller", "value": text, "reason": reason}
    assert str(e) == f"--controller {shown(text)}: not a HOST:PORT address: {reason}"


def test_a_long_address_is_quoted_by_its_ends() -> None:
    """An address of thousands of characters was quoted whole in the one error line, twice (the
    value, then its host in the reason); the line quotes at most 80 characters of each, by its
    first 40 and last 20 characters and its length. The error's fields keep the value whole."""
    text = "a" * 3000 + ":99"
    with pytest.raises(InvalidValue) as ei:
        parse_addr(text, field="--listen")
    assert str(ei.value).startswith(
        f"--listen '{'a' * 40}...{'a' * 17}:99' (3003 characters): not a HOST:PORT address: "
        f"host '{'a' * 40}...{'a' * 20}' (3000 characters) is not a valid host name (")
    assert len(str(ei.value)) < 300
    assert ei.value.fields["value"] == text
    # a host of a blank: the reason's quote is cut the same way
    with pytest.raises(InvalidValue) as ei:
        parse_addr("a " * 1000 + "b:1", field="--relay")
    assert f"host {shown(('a ' * 1000 + 'b').strip())} contains a blank" in str(ei.value)
    assert len(str(ei.value)) < 300


def test_parse_addr_takes_a_port_with_leading_zeros() -> None:
    assert parse_addr("h:" + "0" * 5000 + "8080") == ("h", 8080)


def test_parse_addr_not_a_string() -> None:
    with pytest.raises(InvalidValue) as ei:
        parse_addr(5555)  # type: ignore[arg-type]
    assert str(ei.value) == ("address 5555: not a HOST:PORT address: not a string or a "
                             "(host, port) pair")


@pytest.mark.parametrize(("text", "dial", "reason"), [
    ("h:65536", False, "port 65536 is not in 0..65535"),
    ("h:65536", True, "port 65536 is not in 1..65535"),
    ("h:" + "9" * 20, True, "port 99999999999999999999 is not in 1..65535"),
    (("h", 65536), True, "port 65536 is not in 1..65535"),
])
def test_a_port_out_of_range_is_worded_as_a_port_option_s(text: Any, dial: bool,
                                                          reason: str) -> None:
    """An address's port out of range reads as a port option's (``argument --port: port 70000
    is not in 1..65535``): the range it was refused from, 1..65535 for an address to dial."""
    from flodl_proto.addr import port_not_in_range

    with pytest.raises(InvalidValue) as ei:
        parse_addr(text, field="--relay", dial=dial)
    assert str(ei.value) == f"--relay {text!r}: not a HOST:PORT address: {reason}"
    assert port_not_in_range(70000) == "port 70000 is not in 0..65535"
    assert port_not_in_range(-1, 1) == "port -1 is not in 1..65535"


@pytest.mark.parametrize(("pair", "want"), [
    (("127.0.0.1", 5555), ("127.0.0.1", 5555)),
    (("::1", 80, 0, 0), ("::1", 80)),  # an IPv6 socket address: no brackets, extras ignored
    (("h", np.uint16(7)), ("h", 7)),  # any integral port
])
def test_parse_addr_takes_a_host_port_pair(pair: tuple[str, int], want: tuple[str, int]) -> None:
    got = parse_addr(pair, dial=True)
    assert got == want and type(got[1]) is int


@pytest.mark.parametrize(("pair", "reason"), [
    (("h", 0), "port 0 cannot be dialed (it asks a listener for any free port)"),
    (("h", -1), "port -1 is not in 1..65535"),  # dialed: 1 to 65535
    (("h", 65536), "port 65536 is not in 1..65535"),
    (("h", 80.0), "port 80.0 is not an integer"),
    (("h", "80"), "port '80' is not an integer"),
    (("h", True), "port True is not an integer"),
    (("", 80), "no host"),
    ((80, "h"), "not a string or a (host, port) pair"),
    (("h",), "not a string or a (host, port) pair"),
])
def test_parse_addr_bad_pair_names_field_and_value(pair: tuple[Any, ...], reason: str) -> None:
    with pytest.raises(InvalidValue) as ei:
        parse_addr(pair, field="controller", dial=True)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError) and ei.value.error_id == "addr.invalid"
    assert str(ei.value) == f"controller {pair!r}: not a HOST:PORT address: {reason}"


@pytest.mark.parametrize("addr", ["127.0.0.1:0", ("127.0.0.1", 0)])
def test_relay_and_rank_client_refuse_to_dial_port_0(addr: str | tuple[str, int]) -> None:
    """Before anything is bound or dialed (a relay waited for its ranks on port 4, a rank
    retried its connect for the whole budget)."""
    from flodl_proto.runner.rank import RankClient
    from flodl_proto.runner.relay import Relay

    salt = bytes(16)
    for field, make in (("controller", lambda: Relay(addr, [0], 1, salt)),
                        ("addr", lambda: RankClient.connect(addr, 0, 1, salt))):
        with pytest.raises(InvalidValue) as ei:
            make()
        assert isinstance(ei.value, LocalProtocolError) and ei.value.error_id == "addr.invalid"
        assert str(ei.value) == (f"{field} {addr!r}: not a HOST:PORT address: port 0 "
                                 "cannot be dialed (it asks a listener for any free port)")


def test_netio_reexports_the_same_functions() -> None:
    assert _netio.parse_addr is parse_addr
    assert _netio.format_addr is format_addr


@pytest.mark.parametrize(("role", "option"), [("controller", "--listen"),
                                              ("relay", "--controller"),
                                              ("rank", "--relay")])
def test_cli_bad_address_is_one_line(role: str, option: str) -> None:
    extra = {"controller": ["--world-size", "1"],
             "relay": ["--ranks", "0", "--world-size", "1"],
             "rank": ["--rank", "0", "--world-size", "1"]}[role]
    res = subprocess.run([sys.executable, "-m", "flodl_proto.cli", role, option, "nowhere",
                          "--salt", "00" * 16, *extra],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"argument {option}: 'nowhere': not a HOST:PORT address: no port" in lines[0]


def test_a_dialed_address_takes_no_port_0() -> None:
    """Port 0 asks a listener for any free port; nothing can be dialed there (a relay given
    ``--controller HOST:0`` waited for its ranks on port 4, a rank retried for 30 s)."""
    assert parse_addr("127.0.0.1:0") == ("127.0.0.1", 0)  # a listen address may
    with pytest.raises(InvalidValue) as ei:
        parse_addr("127.0.0.1:0", field="--relay", dial=True)
    assert ei.value.error_id == "addr.invalid" and not ei.value.remote
    assert str(ei.value) == ("--relay '127.0.0.1:0': not a HOST:PORT address: port 0 cannot "
                             "be dialed (it asks a listener for any free port)")
    assert parse_addr("[::1]:1", dial=True) == ("::1", 1)


@pytest.mark.parametrize(("role", "option"), [("relay", "--controller"), ("rank", "--relay")])
def test_cli_dialed_address_with_port_0_is_one_line(role: str, option: str) -> None:
    extra = {"relay": ["--ranks", "0", "--world-size", "1"],
             "rank": ["--rank", "0", "--world-size", "1"]}[role]
    res = subprocess.run([sys.executable, "-m", "flodl_proto.cli", role, option, "127.0.0.1:0",
                          "--salt", "00" * 16, *extra],
                         capture_output=True, text=True, timeout=30)
    assert (res.returncode, res.stdout) == (2, "")
    prog = "flodl-proto rank" if role == "rank" else "flodl-proto relay"
    assert res.stderr == (f"{prog}: error: argument {option}: '127.0.0.1:0': not a HOST:PORT "
                          f"address: port 0 cannot be dialed (it asks a listener for any free "
                          f"port)\n")


_ODD = "contains a blank, a control character or a bracket"


@pytest.mark.parametrize(("text", "reason"), [
    (" 127.0.0.1 :5555", f"host '127.0.0.1 ' {_ODD}"),  # a blank inside, not around
    ("a b:5555", f"host 'a b' {_ODD}"),
    ("x\x00y:5555", f"host 'x\\x00y' {_ODD}"),  # the socket calls raise ValueError for it
    ("\udcff:5555", f"host '\\udcff' {_ODD}"),  # a lone surrogate (undecodable argv byte)
    ("[[::1]]:5555", f"host '[::1]' {_ODD}"),
    ("[::1]]:5555", f"host '::1]' {_ODD}"),
    ("a..b:5555", "host 'a..b' is not a valid host name (label empty or too long)"),
    ("a" * 64 + ".com:1", f"host '{'a' * 64}.com' is not a valid host name (label empty or too "
     "long)"),
])
def test_parse_addr_refuses_a_host_the_socket_calls_cannot_take(text: str, reason: str) -> None:
    """The socket calls encode a host with the ``idna`` codec and raise UnicodeError (not
    OSError) for one it refuses: the controller command ended in a traceback."""
    with pytest.raises(InvalidValue) as ei:
        parse_addr(text, field="--listen")
    assert ei.value.error_id == "addr.invalid" and not ei.value.remote
    assert str(ei.value) == f"--listen {text!r}: not a HOST:PORT address: {reason}"


@pytest.mark.parametrize(("text", "want"), [
    ("h\u00f6st:5555", ("h\u00f6st", 5555)),  # encodable by idna
    ("a.b.:5555", ("a.b.", 5555)),  # a fully qualified name's trailing dot
    ("[127.0.0.1]:5555", ("127.0.0.1", 5555)),
    ("a" * 63 + ":1", ("a" * 63, 1)),
])
def test_parse_addr_takes_any_host_the_socket_calls_take(text: str, want: tuple[str, int]) -> None:
    assert parse_addr(text) == want


def test_a_pair_host_follows_the_same_rules() -> None:
    with pytest.raises(InvalidValue) as ei:
        parse_addr(("a..b", np.int64(80)), field="controller", dial=True)
    assert str(ei.value) == ("controller ('a..b', np.int64(80)): not a HOST:PORT address: "
                             "host 'a..b' is not a valid host name (label empty or too long)")


def test_the_controller_refuses_a_host_it_cannot_bind() -> None:
    from flodl_proto.runner.controller import ReferenceController

    with pytest.raises(InvalidValue) as ei:
        ReferenceController(1, bytes(16), host="a..b")
    assert ei.value.error_id == "addr.invalid"
    with pytest.raises(InvalidValue):
        ReferenceController(1, bytes(16), port=5555.5)  # type: ignore[arg-type]


def test_cli_unencodable_host_is_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "flodl_proto", "controller", "--listen",
                        "a..b:0", "--world-size", "1", "--salt", "00" * 16],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("flodl-proto controller: error: argument --listen: 'a..b:0': not a "
                        "HOST:PORT address: host 'a..b' is not a valid host name (label empty or "
                        "too long)\n")


@pytest.mark.parametrize(("port", "size"), [
    (10**80, "an integer of 266 bits"), (-(10**80), "a negative integer of 266 bits"),
    (10**5000, "an integer of 16610 bits"), (-(10**5000), "a negative integer of 16610 bits")],
    ids=["81-digits", "81-digits-negative", "5001-digits", "5001-digits-negative"])
def test_a_pair_s_port_of_many_digits_is_shown_by_its_size(port: int, size: str) -> None:
    """A ``(host, port)`` pair's port of 81 to 4300 digits was printed whole in the reason; of
    more, building the message raised Python's ``ValueError`` ("Exceeds the limit (4300
    digits) ..."), not :class:`InvalidValue`."""
    with pytest.raises(InvalidValue) as ei:
        parse_addr(("h", port), field="--listen")
    assert str(ei.value) == (f"--listen ('h', <{size}>): not a HOST:PORT address: port "
                             f"<{size}> is not in 0..65535")

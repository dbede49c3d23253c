"""``HOST:PORT`` addresses as the command line and the runners take them.

A TCP endpoint is written ``HOST:PORT``: ``127.0.0.1:5555``, ``node-3:5555``, or, for an IPv6
literal, ``[::1]:5555``: an IPv6 address without brackets is refused (``::1:5555`` could be
the address ``::1:5555`` or host ``::1`` with port 5555). :func:`parse_addr` reads that text into
``(host, port)``;
:func:`format_addr` writes it back, bracketing a host that contains a colon. Host names are not
resolved here (the socket calls do that).

Upstream: none for the text form, which is this package's command-line syntax; the runners dial
the result as ``flodl/src/distributed/wire.rs`` ``connect_with_retry`` dials its address.
"""

from __future__ import annotations

import operator
from typing import Any

from ._numbers import not_plain_note
from .errors import _long_integer, protocol_error, shown

__all__ = ["PORT_MAX", "format_addr", "parse_addr", "port_not_in_range"]

#: the largest TCP port number
PORT_MAX = 0xFFFF


def port_not_in_range(port: int, minimum: int = 0) -> str:
    """The words of every refusal of a port number outside the range a port takes, an
    address's (:func:`parse_addr`) as a port option's
    (:func:`flodl_proto.commands._number_args.tcp_port`): ``port 70000 is not in 0..65535``
    (``minimum`` 0, or 1 for a port to dial: port 0 asks a listener for any free port); the
    number as :func:`~flodl_proto.errors.shown` shows it (``<an integer of 16610 bits>``).
    Raises nothing.

    No upstream counterpart (the command line's wording)."""
    return f"port {shown(port)} is not in {minimum}..{PORT_MAX}"


def parse_addr(text: str | tuple[str, int], *, field: str = "address",
               dial: bool = False) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[v6]:PORT`` accepted) into ``(host, port)``, or check a
    ``(host, port)`` pair.

    Leading and trailing whitespace is ignored; the host is taken as the socket calls take it
    (any name they can encode, Unicode included; it is not resolved here); the port is decimal
    digits only (no sign, no underscores), 0 to 65535 (1 to 65535 for an address to dial); a
    host containing a colon (an IPv6 address) must be bracketed. A pair's host is a non-empty
    string taken as it is (no brackets, the same rules), its port an integer
    (``operator.index``; not a bool) in the same range.

    Args:
        text: the address text, or a ``(host, port)`` pair (a socket address: extra items,
            such as an IPv6 address's flow info and scope id, are ignored).
        field: what the text is, for the error message (e.g. ``"--listen"``).
        dial: the address is dialed, not listened on: port 0 (a listener's "any free port")
            is refused.

    Returns:
        ``(host, port)``: the host without brackets, the port as an int.

    Raises:
        InvalidValue (local) ``addr.invalid``: neither a string nor a ``(host, port)`` pair, no
        colon or no port after a bracketed host, no host, unbalanced brackets, a colon in a
        host without brackets (a bare IPv6 address), a host with a blank, a control character
        or a bracket in it, or one the socket calls cannot encode (``idna``: an empty label
        as in ``a..b``, a label over 63 characters), a port that is not decimal digits (a
        pair's: not an integer; ``７０００`` and ``5_5`` with the reason of
        :func:`flodl_proto._numbers.not_plain_note`) or above 65535 (:func:`port_not_in_range`:
        ``port 70000 is not in 0..65535``, ``1..65535`` with ``dial``), or 0 with ``dial``; the
        message names ``field`` and the value.

    Upstream: ``flodl/src/distributed/wire.rs`` ``connect_with_retry`` (the address it dials;
    Rust's socket-address parsing refuses the same bare IPv6 text).
    """
    if isinstance(text, tuple):
        return _check_pair(text, field, dial)
    if not isinstance(text, str):
        raise protocol_error("addr.invalid", field=field, value=text,
                             reason="not a string or a (host, port) pair")
    stripped = text.strip()
    host, sep, port_s = stripped.rpartition(":")
    if not sep or stripped.endswith("]"):  # "[::1]": the colons are the bracketed host's
        raise protocol_error("addr.invalid", field=field, value=text,
                             reason="no port")
    if host.startswith("[") != host.endswith("]"):
        raise protocol_error("addr.invalid", field=field, value=text,
                             reason="unbalanced brackets around the host")
    if host.startswith("["):
        host = host[1:-1]
    elif ":" in host:
        raise protocol_error("addr.invalid", field=field, value=text,
                             reason="an IPv6 address needs brackets: [ADDRESS]:PORT, e.g. "
                             "[::1]:5555")
    _check_host(host, text, field)
    if not (port_s.isascii() and port_s.isdigit()):
        raise protocol_error("addr.invalid", field=field, value=text,
                             reason=f"port {shown(port_s)} is not a decimal number"
                                    f"{not_plain_note(port_s)}")
    digits = port_s.lstrip("0") or "0"  # int() of over 4300 digits, zeros included, raises
    if len(digits) > len(str(PORT_MAX)):  # shown as any integer: whole up to 80 digits
        raise protocol_error("addr.invalid", field=field, value=text,
                             reason=port_not_in_range(_long_integer("", digits), int(dial)))
    return host, _check_port(int(digits), text, field, dial)


def _check_pair(pair: tuple[Any, ...], field: str, dial: bool) -> tuple[str, int]:
    host = pair[0] if len(pair) >= 2 else None
    if not isinstance(host, str):
        raise protocol_error("addr.invalid", field=field, value=pair,
                             reason="not a string or a (host, port) pair")
    _check_host(host, pair, field)
    try:
        if isinstance(pair[1], bool):
            raise TypeError
        port = operator.index(pair[1])
    except TypeError:
        raise protocol_error("addr.invalid", field=field, value=pair,
                             reason=f"port {shown(pair[1])} is not an integer") from None
    if port < 0:
        raise protocol_error("addr.invalid", field=field, value=pair,
                             reason=port_not_in_range(port, int(dial)))
    return host, _check_port(port, pair, field, dial)


def _check_host(host: str, value: object, field: str) -> None:
    """Refuse a host the socket calls cannot take: empty, with a blank, a control character or
    a bracket in it, or one the ``idna`` codec (which the socket calls encode a host with)
    refuses (an empty label, ``a..b``, or one over 63 characters)."""
    if not host:
        raise protocol_error("addr.invalid", field=field, value=value, reason="no host")
    if not host.isprintable() or any(c.isspace() or c in "[]" for c in host):
        raise protocol_error("addr.invalid", field=field, value=value,
                             reason=f"host {shown(host)} contains a blank, a control character or "
                             "a bracket")
    try:
        host.encode("idna")
    except UnicodeError as e:
        raise protocol_error("addr.invalid", field=field, value=value,
                             reason=f"host {shown(host)} is not a valid host name "
                             f"({e.__cause__ or e})") from None


def _check_port(port: int, value: object, field: str, dial: bool) -> int:
    if port > PORT_MAX:
        raise protocol_error("addr.invalid", field=field, value=value,
                             reason=port_not_in_range(port, int(dial)))
    if dial and port == 0:
        raise protocol_error("addr.invalid", field=field, value=value,
                             reason="port 0 cannot be dialed (it asks a listener for any free "
                             "port)")
    return port


def format_addr(addr: tuple[str, int]) -> str:
    """Format ``(host, port)`` as ``HOST:PORT``, the inverse of :func:`parse_addr`.

    A host containing a colon (an IPv6 literal) is bracketed: ``("::1", 5555)`` gives
    ``"[::1]:5555"``. Extra tuple items (an IPv6 socket address's flow info and scope id) are
    ignored.

    Args:
        addr: ``(host, port)``, e.g. a socket's ``getsockname()``.

    Returns:
        The address text.

    Raises:
        InvalidValue (local) ``addr.invalid``: ``addr`` is not a pair :func:`parse_addr` takes
            (a port above 65535 or no integer, a host it refuses), so the text always parses
            back.

    No upstream counterpart (Rust's ``SocketAddr`` display writes the same text).
    """
    if not isinstance(addr, tuple | list):
        raise protocol_error("addr.invalid", field="address", value=addr,
                             reason="format_addr takes a (host, port) pair (parse_addr takes "
                             "the text)")
    host, port = _check_pair(tuple(addr), "address", False)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

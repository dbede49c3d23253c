"""The controller's ``GET /status`` responder (on the port mux, beside the data channel).

One short-lived thread per request: read the request head (bounded in time and size), answer
``GET /status`` with the status JSON, ``400`` for a malformed request line, ``404`` for another
path, ``405`` for another method, then close (the body is one line of JSON and its line
break). The responder knows nothing of the controller: it is handed the status callable.

Upstream: ``flodl/src/distributed/controller/mod.rs`` (the port mux serving ``GET /status``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
from collections.abc import Callable
from typing import Any, Final

from ..errors import shown
from ._netio_send import NO_SIGPIPE

__all__ = ["serve_status"]

log = logging.getLogger("flodl_proto.runner.controller")

_STATUS_READ_TIMEOUT: Final = 2.0  # seconds a status client has to send its request line
_STATUS_MAX_REQUEST: Final = 8192  # bytes of an HTTP request head the responder reads at most


#: an absolute-form request target (RFC 9112 3.2.2): a scheme, then ``://``
_ABSOLUTE_FORM: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _request_line_problem(words: list[str]) -> str | None:
    """What is wrong with a request line split into whitespace-delimited words (``words``, as
    RFC 9112 3 lets a server parse it), which must be ``METHOD PATH HTTP/VERSION`` (or ``METHOD
    PATH``, HTTP/0.9's form): ``no method`` (an empty line), ``no path``, ``4 words, not METHOD
    PATH HTTP/VERSION``, ``'FOO' where the HTTP version goes``, ``the path 'HTTP/1.0' does not
    start with /`` (``GET  HTTP/1.0``: no path, its version read as one; ``GET *``); or None.
    An absolute URL (``http://h/status``, RFC 9112 3.2.2's absolute-form) is well formed: the
    caller answers it 404, as a resource this responder does not serve (it serves the
    origin-form ``/status`` only)."""
    if not words:
        return "no method"
    if len(words) > 3:
        return f"{len(words)} words, not METHOD PATH HTTP/VERSION"
    if len(words) < 2:
        return "no path"
    if len(words) == 3 and not words[2].startswith("HTTP/"):
        return f"{shown(words[2])} where the HTTP version goes"
    if not words[1].startswith("/") and not _ABSOLUTE_FORM.match(words[1]):
        return f"the path {shown(words[1])} does not start with /"
    return None


def serve_status(sock: socket.socket, addr: str, status: Callable[[], dict[str, Any]]) -> None:
    """Answer one HTTP request on ``sock`` (from ``addr``) and close it.

    Args:
        sock: the accepted connection (its first 4 bytes, ``GET `` or ``POST``, still unread).
        addr: the peer, for logs.
        status: returns the JSON-ready status.

    Answers (each body one line of JSON, an error as ``{"error": "..."}``): ``200`` the
    status, ``400`` a request line that is not ``METHOD PATH HTTP/VERSION`` once split into
    whitespace-delimited words (RFC 9112 3: a trailing or doubled space is taken), or whose path
    does not start with ``/`` (``malformed request line 'GET  HTTP/1.0': the path 'HTTP/1.0'
    does not start with /; try GET /status``; ``GET *``, the asterisk-form being OPTIONS'
    only), ``404`` another path, an absolute URL (``GET http://h/status``: well formed, RFC 9112
    3.2.2, but this responder is no proxy and serves the origin-form ``/status`` only),
    ``405`` another method. Socket errors are logged at debug level, never
    raised.

    Upstream: ``controller/mod.rs`` (the port mux's status leg); the 400 answer is this
    package's.
    """
    try:
        sock.settimeout(_STATUS_READ_TIMEOUT)
        head = b""
        while b"\r\n\r\n" not in head and b"\n\n" not in head \
                and len(head) < _STATUS_MAX_REQUEST:
            chunk = sock.recv(_STATUS_MAX_REQUEST - len(head))
            if not chunk:
                break
            head += chunk
        line = head.split(b"\n", 1)[0].decode("latin-1").strip()
        words = line.split()  # runs of white space, as RFC 9112 3 allows a server to parse
        problem = _request_line_problem(words)
        method = words[0] if words else ""
        path = words[1].split("?", 1)[0] if len(words) > 1 else ""
        if problem is not None:  # (a long line is shown by its ends, as a path or method is)
            code, body = "400 Bad Request", {"error": f"malformed request line {shown(line)}: "
                                                      f"{problem}; try GET /status"}
        elif method == "GET" and path in ("/status", "/status/"):
            code, body = "200 OK", status()
        elif method == "GET":
            code, body = "404 Not Found", {"error": f"no such resource {shown(path)}; "
                                                    "try GET /status"}
        else:  # (a request head of up to 8 KiB: a long path or method is shown by its ends)
            code, body = "405 Method Not Allowed", {"error": f"{shown(method)} is not served"}
        # one JSON line, ended: `curl` output does not run into the shell's next line
        payload = json.dumps(body, default=str).encode() + b"\n"
        resp = (f"HTTP/1.1 {code}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
        sock.sendall(resp + payload, NO_SIGPIPE)  # a client gone: EPIPE, logged
        log.debug("controller: status %s for %s (%s)", code, addr, line)
    except OSError as e:
        log.debug("controller: status request from %s failed: %s", addr, e)
    finally:
        with contextlib.suppress(OSError):
            sock.close()


"""``flodl-proto relay``: run one host's data-channel relay.

::

    flodl-proto relay --controller HOST:PORT --ranks 0,1 --world-size N
                      (--salt HEX | --salt-file PATH | env FLODL_SESSION_SALT)
                      [--listen-port P] [--protocol-version 2|3] [--host NAME]
                      [--rank-timeout SECONDS] [--frame-ceiling BYTES]

The first stdout line, flushed at once, is exactly ``listening on 127.0.0.1:<bound port>``; the
ranks of this host then connect there. When the relay ends it prints one ``relay stats ...`` line
(bytes per leg, HostFrames, Broadcasts). ``--rank-timeout SECONDS`` (an addition to upstream, off
by default; a finite number of seconds above 0, at most 864000 s once scaled by
``FLODL_NET_TIMEOUT_SCALE``): a local rank whose frame has not arrived that
long after the round's first local one is declared dead, its connection closed, and the host's
round goes on without it (a warning on stderr). The relay dials the controller once its ranks
have connected (it waits for them without a deadline, as upstream's relay agent does, logging a
warning every 10 s that names the ranks still missing; the retry time below starts only at the
dial); a controller that is not there yet is retried every 0.5 s for about 30 s (x
``FLODL_NET_TIMEOUT_SCALE``), which stderr says once (``waiting for the controller: connect to
HOST:PORT failed: ...; retrying every 0.5s, giving up after ~30s``). Exit codes: 0 after a
clean end (the controller closed, the last local rank left, SIGTERM, or SIGINT unless it was
ignored when the relay started: it then stays ignored; handled from just before the loopback port
is bound, so a stop from then on still prints the first line), 130 for a Ctrl-C before that
(while the command line is checked, the controller's host name looked up or the modules load:
``flodl-proto relay: interrupted``; a SIGTERM then ends the process by the signal, except while
the name is looked up: ``flodl-proto relay: terminated`` and 143), 1 when the relay
failed or could not start (the error on stderr, e.g. the controller declared every rank of this
host dead, the controller could not be reached in the retry time, or the loopback port cannot be
bound because it is in use), 2 for a bad command line (one line, ``flodl-proto relay: error:
...``). ``--frame-ceiling BYTES`` (default 1 GiB; 25, the smallest RoundFrame, to U32_MAX: spec
departure ``ceiling_floor``) bounds a rank's length prefix (a rank whose frame is above it is taken
as gone, as upstream) and a controller record's ``payload_len`` (above it the relay fails).

The controller's host name is looked up at start-up, before the loopback port is bound (upstream
looks it up only when it dials, once every local rank has connected, so a typo showed only then):
a name the resolver says does not exist (a typo, any ``.invalid`` name) is a bad command line,
exit 2 (``flodl-proto relay: error: argument --controller: 'nosuch.invalid:7999': cannot
resolve host 'nosuch.invalid': Name or service not known``). A resolver that cannot answer now
(a temporary failure, or no answer within 10 s x ``FLODL_NET_TIMEOUT_SCALE``) is one warning
line on stderr and the relay goes on. The address found is not kept: the dial looks the name
up again on each attempt, so a controller whose address changes between start-up and the dial
(a node rescheduled, a DNS record updated) is still found.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from .._numbers import not_plain_note, plain_number
from .._oserr import os_reason
from ..addr import parse_addr, port_not_in_range
from ..cli import interrupts_held, sigterm_as_ctrl_c
from ..errors import (
    SHOWN_CHARS,
    ProtocolError,
    _long_integer,
    protocol_error,
    shown,
)
from ..spec import (
    DEFAULT_FRAME_CEILING,
    DEFAULT_VERSION,
    NET_TIMEOUT_SCALE_ENV,
    RELAY_DATA_LOOPBACK_OFFSET,
    SPEC,
    SUPPORTED_VERSIONS,
    U32_MAX,
    frame_ceiling_floor,
    read_net_timeout_scale,
)
from ._host_name import host_name
from ._number_args import listen_port, read_whole_number, real_number, tcp_port, whole_number
from ._option_error import OptionError, option_field
from ._output import queued_stderr_logging, report_dropped
from ._paths import path_text
from ._salt import (
    SALT_ENV,
    SALT_FILE_MAX_BYTES,
    cli_salt,
    env_salt,
    parse_salt,
    resolve_salt,
)
from ._waits import WAIT_STEP, join_thread

if TYPE_CHECKING:  # imported when the command runs, so --help and usage errors skip NumPy
    from ..runner.relay import Relay

__all__ = [
    "NO_SUCH_NAME",
    "SALT_ENV",
    "SALT_FILE_MAX_BYTES",
    "SIGNAL_STOP_DETAIL",
    "TIMEOUT_MAXIMUM",
    "TIMEOUT_RULE",
    "add_frame_ceiling_option",
    "add_salt_options",
    "byte_count",
    "check_host_resolves",
    "check_net_timeout_scale",
    "cli_salt",
    "env_salt",
    "frame_ceiling",
    "parse_ranks",
    "parse_salt",
    "real_number",
    "register",
    "resolve_salt",
    "shut_down",
    "signals_stop",
    "tcp_port",
    "whole_number",
]

_PROG = "flodl-proto relay"
#: the detail of the clean end of a relay stopped by SIGTERM or Ctrl-C: its ``finished:`` line
#: ends ``(stop: stopped by a signal)`` (the demo reads it)
SIGNAL_STOP_DETAIL = "stopped by a signal"


def check_world_size(world_size: int) -> None:
    """Check ``--world-size``: 1 up to the largest value of the handshake's u32 field.

    Raises:
        OptionError: out of that range (a ``ValueError``; the message names the option and
            the value, ``argument --world-size: ...``).
    """
    if not 1 <= world_size <= U32_MAX:
        raise OptionError("--world-size", f"must be in 1..{U32_MAX} (the handshake's u32 field), "
                                          f"got {world_size}")


#: the largest round or rank timeout once scaled by ``FLODL_NET_TIMEOUT_SCALE``, seconds
TIMEOUT_MAXIMUM: Final = SPEC.timeout("TIMEOUT_OPTION_MAXIMUM")
#: the rule of a timeout option, as its help and its errors state it
TIMEOUT_RULE: Final = (f"a finite number of seconds above 0, at most {TIMEOUT_MAXIMUM:g} s once "
                       f"scaled by {NET_TIMEOUT_SCALE_ENV}")


def positive_seconds(text: str) -> float:
    """argparse ``type=`` for a timeout option (``controller --round-timeout``, ``relay
    --rank-timeout``): :data:`TIMEOUT_RULE`, a finite number of seconds above 0 whose value
    times ``FLODL_NET_TIMEOUT_SCALE`` is at most ``TIMEOUT_OPTION_MAXIMUM`` (864000 s), as the
    runners check it (:func:`flodl_proto.fsm.deadline.check_timeout`). An invalid scale is not
    applied here: the command refuses it before it starts (:func:`check_net_timeout_scale`).

    Raises:
        argparse.ArgumentTypeError: not a number (in ASCII, without ``_``:
            :func:`flodl_proto._numbers.plain_number`), not finite (``1e999`` and a number of 5000
            digits are infinite as floats), not above 0, or above the maximum once scaled; the
            message states the rule and the value as given (argparse names the option:
            ``argument --round-timeout: must be ...``), and for text ``float()`` would read
            (``1_0``) the reason of :func:`flodl_proto._numbers.not_plain_note`.

    No upstream counterpart: the timeouts are additions (spec departures ``round_timeout``,
    ``rank_timeout``).
    """
    try:
        value = float(text) if plain_number(text) else math.nan
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be {TIMEOUT_RULE}, got {shown(text)}"
                                         f"{not_plain_note(text)}")
    scale, invalid = read_net_timeout_scale(os.environ.get(NET_TIMEOUT_SCALE_ENV))
    if invalid is None and value * scale > TIMEOUT_MAXIMUM:
        raise argparse.ArgumentTypeError(
            f"must be {TIMEOUT_RULE} ({scale:g}), got {shown(text)} ({value * scale:g} s scaled)")
    return value


def for_option(e: BaseException, param: str, option: str) -> BaseException:
    """``e`` worded for the command line: a timeout error (``deadline.bad_timeout``,
    ``deadline.too_long``) about the library parameter ``param`` (``"round_timeout"``) is a
    ValueError in the words of :func:`positive_seconds` naming the option that gave its value
    (``argument --round-timeout: must be ...``); any other error is ``e`` itself. No upstream
    counterpart (the timeouts are additions)."""
    if (isinstance(e, ProtocolError) and e.error_id in ("deadline.bad_timeout", "deadline.too_long")
            and e.fields.get("name") == param):
        value = e.fields.get("value")
        if e.error_id == "deadline.too_long":
            return OptionError(option, f"must be {TIMEOUT_RULE} ({e.fields.get('scale'):g}), "
                                       f"got {value!r} ({e.fields.get('scaled'):g} s scaled)")
        return OptionError(option, f"must be {TIMEOUT_RULE}, got {value!r}")
    return e


def byte_count(text: str, minimum: int = 1, what: str = "") -> int:
    """Parse a size option's value: a whole number of bytes, at least ``minimum`` (default 1;
    ``--max-input``, ``--frame-ceiling``).

    Only ASCII digits, with an optional leading ``-`` (to say a negative count is below the
    minimum): ``int`` would also take blanks around them, a ``+``, ``_`` between digits and the
    digits of any script (``\u0661\u0662`` is 12), none of which is a size on a command line.

    Args:
        text: the option's value.
        minimum: the smallest count accepted, bytes.
        what: what the minimum is, named in parentheses after it in the message.

    Returns:
        The count; one of more than 80 digits (``int()`` reads at most 4300) is read too, and
        messages show it by its size (:func:`whole_number`), so a caller's upper bound refuses
        it as any count out of range.

    Raises:
        ValueError: not a whole number in ASCII digits (``4G``, ``1.5``, `` 12``, ``+5``,
            ``1_000``) or below ``minimum``; the message says which and shows the value (a long
            one by its ends, :func:`~flodl_proto.errors.shown`), and for ``1_000`` or ``１０``
            why (:func:`flodl_proto._numbers.not_plain_note`).

    No upstream counterpart: upstream's binaries take no size options.
    """
    digits = text.removeprefix("-")
    try:
        if not (digits.isascii() and digits.isdigit()):
            raise ValueError
        n = int(text) if len(digits) <= SHOWN_CHARS else _long_integer("-" * (text != digits),
                                                                        digits)
    except ValueError:
        raise ValueError(f"expected a number of bytes, got {shown(text)}"
                         f"{not_plain_note(text)}") from None
    if n < minimum:
        unit = "byte" if minimum == 1 else "bytes"
        raise ValueError(f"must be at least {minimum} {unit}{f' ({what})' if what else ''}, "
                         f"got {n}")
    return n


def check_net_timeout_scale(text: str | None = None, *, field: str | None = None) -> float:
    """Check the network timeout scale before a cluster command starts anything: ``text`` given
    as option ``field`` (``conform --timeout-scale``), or else ``FLODL_NET_TIMEOUT_SCALE``
    itself (controller, relay, rank, demo). The library would warn and use 1.0; a command
    refuses it, as upstream's launcher does.

    Returns:
        The scale (:func:`flodl_proto.spec.read_net_timeout_scale`).

    Raises:
        InvalidValue (local) ``timeout_scale.invalid``: not a number, not finite, below 0.1 or
            above 1000; the message names the variable or the option and the text as given
            (``--timeout-scale=' '``, not the stripped ``''``).

    Upstream: ``wire.rs`` ``parse_net_timeout_scale`` (the launcher's check).
    """
    if field is None:
        field, text = NET_TIMEOUT_SCALE_ENV, os.environ.get(NET_TIMEOUT_SCALE_ENV)
    scale, invalid = read_net_timeout_scale(text)
    if invalid is not None:
        raise protocol_error("timeout_scale.invalid", field=field, **{**invalid, "value": text})
    return scale


#: how long :func:`check_host_resolves` waits for the resolver, seconds (before
#: ``FLODL_NET_TIMEOUT_SCALE``): glibc's resolver gives one name server 5 s a try
RESOLVE_WAIT: Final = 10.0

#: resolver answers that say the name does not exist (as opposed to "cannot answer now")
NO_SUCH_NAME: Final = frozenset(
    getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name))


def check_host_resolves(option: str, text: str, addr: tuple[str, int],
                        wait: float | None = None) -> str | None:
    """Look up the host of an address to dial (``relay --controller``, ``rank --relay``) once,
    at start-up, so a name that does not exist is reported before anything else happens.

    The lookup runs in a thread of its own (a daemon: ``getaddrinfo`` cannot be interrupted, and
    a resolver that never answers must not hold the process at exit); the caller waits at most
    ``wait`` seconds for it, in steps of :data:`._waits.WAIT_STEP` seconds (a Ctrl-C or SIGTERM
    the kernel gave the lookup's thread runs its handler at once). The addresses found are not
    kept: the dial looks the name up again (its address may change before then).

    Args:
        option: the option that gave the address, named in the messages (``"--controller"``,
            ``"--relay"``).
        text: the option's value, as given.
        addr: ``(host, port)``, parsed from ``text``.
        wait: seconds to wait for the resolver; None is :data:`RESOLVE_WAIT` x
            ``FLODL_NET_TIMEOUT_SCALE``.

    Returns:
        None when the name resolves; else one line saying the lookup could not be done now (a
        temporary resolver failure, or no answer within ``wait``), for the caller to show as a
        warning before it goes on.

    Raises:
        OptionError: the resolver says the name does not exist (``EAI_NONAME``,
            ``EAI_NODATA``); a ``ValueError`` of one line naming ``option`` as argparse does,
            then ``text``, the host and the resolver's reason (``argument --controller:
            'nosuch.invalid:7999': cannot resolve host 'nosuch.invalid': Name or service not
            known``).

    No upstream counterpart: upstream looks the name up only when it dials.
    """
    if wait is None:
        wait = RESOLVE_WAIT * read_net_timeout_scale(os.environ.get(NET_TIMEOUT_SCALE_ENV))[0]
    host, port = addr[0], addr[1]
    outcome: list[BaseException | None] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            outcome.append(e)
        else:
            outcome.append(None)

    worker = threading.Thread(target=lookup, name="flodl-resolve", daemon=True)
    worker.start()
    join_thread(worker, wait)  # in steps: a signal another thread got runs its handler at once
    if not outcome:
        return (f"{option} {shown(text)}: host {shown(host)} did not resolve within {wait:g}s; "
                "going on (the dial looks it up again)")
    e = outcome[0]
    if e is None:
        return None
    if isinstance(e, socket.gaierror) and e.errno in NO_SUCH_NAME:
        raise OptionError(option, f"{shown(text)}: cannot resolve host {shown(host)}: "
                                  f"{os_reason(e)}")
    return (f"{option} {shown(text)}: cannot resolve host {shown(host)} now ({os_reason(e)}); "
            "going on (the dial looks it up again)")


def frame_ceiling(text: str | None) -> int:
    """Parse ``--frame-ceiling BYTES`` (controller, relay, rank): the largest length prefix, mux
    ``payload_len`` and frame (bytes) the command accepts; None (not given) is
    ``DEFAULT_FRAME_CEILING`` (1 GiB), as upstream before a model-derived ceiling (``wire.rs``).

    Raises:
        OptionError: a ``ValueError`` naming the option as argparse does, then the value once
            (``argument --frame-ceiling: must be at least 25 bytes (...), got 10``): not a
            whole number of bytes in ASCII digits (:func:`byte_count`), below the smallest
            RoundFrame (25 bytes, the message names it:
            :func:`flodl_proto.spec.frame_ceiling_floor`), or above
            ``U32_MAX`` (the u32 length prefix and ``payload_len`` cannot carry more, so a
            larger ceiling would bound nothing).

    Upstream: ``wire.rs`` (the frame ceiling; upstream's binaries take no option for it).
    """
    if text is None:
        return int(DEFAULT_FRAME_CEILING)
    try:
        n = byte_count(text, *frame_ceiling_floor())
    except ValueError as e:  # the message ends with the value (``got '4G'``): not shown twice
        raise OptionError("--frame-ceiling", str(e)) from None
    if n > U32_MAX:
        raise OptionError("--frame-ceiling", f"must be at most {U32_MAX} bytes (the u32 length "
                                             f"prefix and mux payload_len), got {shown(text)}")
    return n


def add_frame_ceiling_option(p: argparse.ArgumentParser, what: str) -> None:
    """Add ``--frame-ceiling BYTES`` to ``p`` (a string, checked by :func:`frame_ceiling` when
    the command runs, so a bad value is one line, not argparse's usage text); ``what`` says
    what it bounds, in the help. Raises nothing of its own (argparse's ``ArgumentError`` if
    ``p`` has the option already).

    No upstream counterpart: upstream's binaries take no option for the frame ceiling.
    """
    floor, why = frame_ceiling_floor()
    p.add_argument("--frame-ceiling", default=None, metavar="BYTES",
                   help=f"largest {what} accepted, in bytes, {floor}..{U32_MAX} (at least "
                   f"{why}); default {DEFAULT_FRAME_CEILING}, 1 GiB, as flodl before a "
                   "model-derived ceiling; a larger record or frame from a peer is refused")


def add_salt_options(p: argparse.ArgumentParser) -> None:
    """Add ``--salt HEX`` / ``--salt-file PATH`` (mutually exclusive; default
    ``$FLODL_SESSION_SALT``) to a cluster command's parser.

    No upstream counterpart: the command line is this package's own; the salt is the 16-byte
    ``SessionSalt`` of ``wire.rs``.
    """
    g = p.add_mutually_exclusive_group()
    g.add_argument("--salt", metavar="HEX",
                   help=f"16-byte session salt as 32 hex digits (default ${SALT_ENV}); visible "
                   "to other users in the process list, prefer --salt-file")
    g.add_argument("--salt-file", metavar="PATH", type=path_text,
                   help="file holding the salt (32 hex digits, or 16 raw bytes)")


def parse_ranks(text: str, world_size: int | None = None,
                max_ranks: int | None = None) -> list[int]:
    """Parse ``"0,1,3"`` (ranges ``"0-3"`` allowed) into a list of rank ids.

    Each rank, and each end of a range, is written as :func:`whole_number` reads an integer
    (:func:`~flodl_proto.commands._number_args.read_whole_number`): ASCII blanks around it, an
    optional ``+``, ASCII digits (``0, +1``, ``0,\t1`` and `` 0 - 3`` are taken).

    Args:
        text: the ``--ranks`` value.
        world_size: when given, a rank or a range reaching ``world_size`` or beyond is refused
            before any range is expanded (a typo such as ``0-99999999`` would otherwise build a
            list of 10**8 ints, gigabytes, only to be refused afterwards).
        max_ranks: when given, more ranks than this are refused before any range is expanded
            (a relay holds one loopback connection per rank: the process's open-file limit).

    Returns:
        The rank ids (ints), in the order given, ranges expanded.

    Raises:
        OptionError: (a ``ValueError``) not a comma-separated list of non-negative integers /
            ranges so written (``١`` and ``1_0`` are refused with the reason of
            :func:`flodl_proto._numbers.not_plain_note`, ``0 1`` as a blank inside a number),
            an empty item (``0,,1``, a leading or trailing comma), a rank not below
            ``world_size``, more than ``max_ranks`` ranks, or a rank listed twice (``0,1,1``,
            ``0-2,1``); one line naming ``--ranks`` and its value (a long one by its ends, a
            rank of more than 80 digits by its size: :func:`~flodl_proto.errors.shown`).

    No upstream counterpart: upstream's relay takes its ranks from the launcher.
    """
    parts = text.split(",")
    if any(not p.strip(_ASCII_BLANKS) for p in parts) and text.strip(_ASCII_BLANKS):
        # "0,,1": a rank left out by mistake
        raise OptionError("--ranks", f"expected a list of ranks like 0,1 or 0-3, got "
                                     f"{shown(text)} (an empty item)")
    spans: list[tuple[int, int]] = []
    for part in parts:
        lo, _, hi = part.partition("-") if "-" in part else (part, "", part)
        ends = (read_whole_number(lo), read_whole_number(hi))
        if ends[0] is None or ends[1] is None:
            inner = any(c in _ASCII_BLANKS for end in (lo, hi) for c in end.strip(_ASCII_BLANKS))
            why = " (a blank inside a number)" if inner else not_plain_note(text)
            raise OptionError("--ranks", f"expected a list of ranks like 0,1 or 0-3, got "
                                         f"{shown(text)}{why}")
        spans.append((ends[0], ends[1]))
    if any(lo < 0 or hi < lo for lo, hi in spans):
        raise OptionError("--ranks", f"expected a list of ranks like 0,1 or 0-3, got "
                                     f"{shown(text)}")
    if world_size is not None and any(hi >= world_size for lo, hi in spans):
        top = max(hi for lo, hi in spans)
        raise OptionError("--ranks", f"{shown(text)}: every rank must be < --world-size "
                                     f"{shown(world_size)}, got rank {shown(top)}")
    count = sum(hi - lo + 1 for lo, hi in spans)
    if max_ranks is not None and count > max_ranks:
        raise OptionError("--ranks", f"{shown(text)}: {shown(count)} ranks need as many loopback "
                                     f"connections, more than this process may open "
                                     f"({max_ranks})")
    ranks = [r for lo, hi in spans for r in range(lo, hi + 1)]
    seen: set[int] = set()
    for r in ranks:
        if r in seen:  # the relay's core refuses it too, in words that name no option
            raise OptionError("--ranks", f"{shown(text)}: rank {shown(r)} is listed twice")
        seen.add(r)
    return ranks


#: the blanks :func:`read_whole_number` takes around a number (``\s`` in ASCII)
_ASCII_BLANKS: Final = " \t\n\r\f\v"


def _max_open_files() -> int | None:
    """The process's open-file limit (soft RLIMIT_NOFILE), or None when unknown or unlimited."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - non-POSIX
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


@contextlib.contextmanager
def signals_stop(stop: threading.Event) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM set ``stop`` instead of killing the process
    (main thread only; elsewhere a no-op). A signal ignored when the block starts stays ignored:
    a program started with SIGINT ignored (a shell's background job, the demo's cluster members)
    keeps it so, as shells and Python itself do, and only SIGTERM stops it.

    No upstream counterpart (the command line is this package's own).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)
           if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def register(sub: Any) -> None:
    """Add the ``relay`` subcommand.

    No upstream counterpart (the command line is this package's own).
    """
    p = sub.add_parser(
        "relay", help="run a host's data-channel relay (local ranks <-> controller)",
        description="Accept this host's ranks on loopback, fold their frames and exchange one "
        "HostFrame / Broadcast per round with the controller.",
    )
    p.add_argument("--controller", required=True, metavar="HOST:PORT",
                   help="the controller's address (its host name is looked up at start-up)")
    p.add_argument("--ranks", required=True, metavar="R,R,...",
                   help="this host's global rank ids, e.g. 0,1")
    p.add_argument("--world-size", required=True, type=whole_number, metavar="N",
                   help="number of ranks in the whole run (every host)")
    add_salt_options(p)
    p.add_argument("--listen-port", type=listen_port, default=None, metavar="P",
                   help="loopback port for the ranks (default: controller port + "
                   f"{RELAY_DATA_LOOPBACK_OFFSET}; 0 = any)")
    p.add_argument("--protocol-version", type=whole_number, choices=SUPPORTED_VERSIONS,
                   default=DEFAULT_VERSION, help="data-channel protocol version (default 2)")
    p.add_argument("--host", type=host_name, default=None, metavar="NAME",
                   help="host name announced in Hello (default: this machine's)")
    p.add_argument("--rank-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                   help="declare a local rank dead when its frame has not arrived this long "
                   f"after the round's first local one ({TIMEOUT_RULE}; default: no deadline, "
                   "as upstream)")
    add_frame_ceiling_option(p, "length prefix of a rank's frame and payload_len of a "
                             "controller's record")
    p.set_defaults(func=run)


def _usage_error(e: BaseException) -> int:
    """One line ``flodl-proto relay: error: MESSAGE`` on stderr (the prefix of argparse's and
    every command's errors); return 2."""
    msg = str(e)  # the relay's own errors already start with "relay: "
    print(f"{_PROG}: error: {msg.removeprefix('relay: ')}", file=sys.stderr, flush=True)
    return 2


def _default_port_named(e: BaseException, controller: str) -> BaseException:
    """``e`` worded for the command line: the default loopback port out of range
    (``relay.bad_listen_port``; a ``--listen-port`` given is refused by its type,
    :func:`~._number_args.listen_port`) names the option its port came from and the option that
    sets it (``argument --controller: '127.0.0.1:65533': port 65537 is not in 0..65535 (the
    default --listen-port: the controller's port + 4); give --listen-port``, as argparse words
    an option's value); any other error is ``e`` itself."""
    if isinstance(e, ProtocolError) and e.error_id == "relay.bad_listen_port":
        return OptionError("--controller", f"{shown(controller)}: "
                           f"{port_not_in_range(e.fields['port'])} (the default --listen-port: "
                           f"the controller's port + {RELAY_DATA_LOOPBACK_OFFSET}); give "
                           "--listen-port")
    return e


def run(args: argparse.Namespace) -> int:
    """Run the relay until it ends; return the exit code.

    Log records (a rank declared dead mid-round, a record ignored) and the 'waiting for the
    controller' line go through a queued stderr writer (:mod:`._output`), so a stderr nobody
    reads never stalls a round; records dropped for a full backlog are counted in one warning
    line at the end."""
    try:
        check_net_timeout_scale()
        check_world_size(args.world_size)
        salt = cli_salt(args.salt, args.salt_file)
        ranks = parse_ranks(args.ranks, args.world_size, _max_open_files())
        controller = parse_addr(args.controller, field=option_field("--controller"), dial=True)
        ceiling = frame_ceiling(args.frame_ceiling)
        # last: every other mistake is reported without waiting for the resolver; a SIGTERM
        # while it is asked is one line and exit 143, as Ctrl-C's is one line and exit 130
        with sigterm_as_ctrl_c():
            unresolved = check_host_resolves("--controller", args.controller, controller)
    except (ValueError, ProtocolError, OSError) as e:
        return _usage_error(e)
    if unresolved is not None:
        print(f"{_PROG}: warning: {unresolved}", file=sys.stderr, flush=True)
    with interrupts_held():  # here: usage errors skip NumPy; Ctrl-C while it loads is one line
        from ..runner.relay import Relay, default_relay_port

    stop = threading.Event()
    # signal handlers installed before the port is announced
    with queued_stderr_logging() as log_lines, signals_stop(stop):
        try:
            relay = Relay(controller, ranks, args.world_size, salt,
                          version=args.protocol_version, listen_port=args.listen_port,
                          host=args.host, rank_timeout=args.rank_timeout, ceiling=ceiling,
                          on_retry=lambda line: log_lines.put(  # once: no controller yet
                              f"{_PROG}: waiting for the controller: {line}"))
        except (ValueError, ProtocolError, OSError) as e:
            return _usage_error(_default_port_named(
                for_option(e, "rank_timeout", "--rank-timeout"), args.controller))
        try:
            relay.start()
        except OSError as e:
            if args.listen_port is not None:
                port, whose = args.listen_port, "--listen-port"
            else:
                port = default_relay_port(controller[1])
                whose = ("the default --listen-port: the controller's port + "
                         f"{RELAY_DATA_LOOPBACK_OFFSET}")
            print(f"{_PROG}: error: cannot listen on 127.0.0.1:{port} ({whose}): "
                  f"{os_reason(e)}",
                  file=sys.stderr, flush=True)
            return 1  # the environment (e.g. the port is in use), not the command line
        host, port = relay.address
        print(f"listening on {host}:{port}", flush=True)
        try:
            while not relay.done and not stop.wait(0.1):
                pass
        finally:
            err = shut_down(relay, SIGNAL_STOP_DETAIL if stop.is_set() else "shutdown requested")
    report_dropped(_PROG, None, log_lines)
    s = relay.stats
    print(f"relay stats from_ranks={s.from_ranks} to_ranks={s.to_ranks} "
          f"upstream_out={s.upstream_out} upstream_in={s.upstream_in} "
          f"host_frames={s.host_frames} broadcasts={s.broadcasts}", flush=True)
    outcome = relay.core.outcome
    if err is not None:
        print(f"{_PROG}: error: {_why_failed(err)}", file=sys.stderr, flush=True)
        return 1
    why = str(outcome) if outcome is not None else "clean (stop: shutdown requested)"
    if stop.is_set() and (outcome is None or outcome.reason == "stop"):
        why = f"clean (stop: {SIGNAL_STOP_DETAIL})"
    print(f"relay finished: {why}", flush=True)
    return 0


def shut_down(relay: Relay, reason: str) -> BaseException | None:
    """``relay.shutdown(reason=reason)`` (a relay still running ends cleanly with ``reason``),
    waited for in steps of :data:`._waits.WAIT_STEP` seconds: joining its threads may take a
    write's stall deadline, and a signal's handler then runs at once, whichever thread the
    kernel gave the signal to. Returns the error that ended the relay (None: clean).
    Upstream: none (the relay's binary is Rust)."""
    try:
        return relay.shutdown(0.0, reason)
    except TimeoutError:  # still joining its threads
        pass
    while True:
        try:
            return relay.wait(WAIT_STEP)
        except TimeoutError:
            continue


def _why_failed(err: BaseException) -> str:
    """The relay's error in one line, with the likely cause where one is known."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    text += "".join(f" ({note})" for note in getattr(err, "__notes__", ()))  # e.g. which rank
    if isinstance(err, ProtocolError) and err.error_id == "relay.closed_before_helloack":
        text += (" (check --protocol-version, --world-size and the salt on both sides, and the "
                 "controller's --frame-ceiling)")
    elif not isinstance(err, ProtocolError | OSError):
        text = f"the relay failed unexpectedly: {type(err).__name__}: {text}"
    return text

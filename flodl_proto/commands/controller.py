"""``flodl-proto controller``: run the reference cluster controller.

::

    flodl-proto controller --listen HOST:PORT --world-size N
                           (--salt HEX | --salt-file PATH | env FLODL_SESSION_SALT)
                           [--protocol-version 2|3] [--no-port-mux]
                           [--outer avg|slow-momentum:LR,MU|nesterov:LR,MU]
                           [--checkpoint-dir DIR] [--round-timeout SECONDS]
                           [--frame-ceiling BYTES]

The first stdout line, flushed at once, is exactly ``listening on HOST:PORT`` with the bound port.
Then one line per relay that joins and one per round (round, kind, weight, bytes, milliseconds).
Those lines are written by a thread of their own, so a stdout that is read slowly, or not at all
(a full pipe), never holds up a round; it writes the lines of up to :data:`LINE_COALESCE` seconds
together: at most :data:`STDOUT_BACKLOG` lines wait, later ones are dropped, and the number
dropped is one warning line on stderr when the run ends. Log records (warnings such as a round
timeout) go to stderr the same way, through a backlog of their own.
Exit codes: 0 after a clean end (ranks left, every rank dead, SIGTERM, or SIGINT unless it was
ignored when the controller started: it then stays ignored; handled from just before the
listener is bound, so a stop from then on still prints the first line; a SIGTERM that arrives
earlier, from the start of the command line, stops it the same way before the listener is
bound: ``controller finished: clean (stop: signal)`` alone), 130 for a Ctrl-C before that
(while the command line is checked or the modules load: ``flodl-proto controller:
interrupted``), 1 when the run
failed or could not start (the error on stderr; e.g. the ``--listen`` address cannot be bound
because it is in use), 2 for a bad command line (a ``--listen`` host name that does not exist,
missing or malformed salt, world size 0, bad
``--outer``, a ``--checkpoint-dir`` that cannot be created or written, or has a file or a loop
of symbolic links where a folder of it should be, a ``--frame-ceiling`` that
is not a whole number of bytes from 25, the smallest RoundFrame (spec departure
``ceiling_floor``), to U32_MAX), with a one-line error
``flodl-proto controller: error: ...``.

``--frame-ceiling BYTES`` (default ``DEFAULT_FRAME_CEILING``, 1 GiB): a relay's record whose
``payload_len`` is above it fails the run (one line naming the length and the ceiling), and so
does a consensus Broadcast above it (spec departure ``broadcast_over_ceiling``).

``--checkpoint-dir DIR``: each window's consensus is written there as
``consensus-<window>.npz``, replacing a file of that name; a folder that already holds such files
(an earlier run's) is one warning line on stderr at start (``flodl-proto controller: warning:
--checkpoint-dir 'DIR': already holds N checkpoint files ...``, the folder quoted as the
option's errors quote it).

``--round-timeout SECONDS`` (an addition to upstream, off by default; a finite number of seconds
above 0, at most 864000 s once scaled by ``FLODL_NET_TIMEOUT_SCALE``): a relay whose HostFrame has
not arrived that long after the round's first one has its ranks declared dead, and the round
completes with the others (a warning on stderr; ``round_timeouts`` in ``GET /status``).

By default the controller serves flodl's single-port mux (data channel plus ``GET /status`` on the
same port); ``--no-port-mux`` makes every connection a data-channel connection.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._numbers import not_plain_note
from .._oserr import os_reason
from .._unseen import quoted
from ..addr import format_addr, parse_addr
from ..cli import interrupts_held, stopped_early
from ..errors import ProtocolError, shown, shown_name
from ..spec import DEFAULT_VERSION, SUPPORTED_VERSIONS, parse_f64
from ._option_error import OptionError, option_field, option_message
from ._output import (
    LINE_COALESCE,
    STDOUT_BACKLOG,
    LineWriter,
    queued_stderr_logging,
    report_dropped,
)
from ._paths import file_in_the_way, path_text
from ._waits import WAIT_STEP
from .relay import (
    NO_SUCH_NAME,
    TIMEOUT_RULE,
    add_frame_ceiling_option,
    add_salt_options,
    check_net_timeout_scale,
    check_world_size,
    cli_salt,
    for_option,
    frame_ceiling,
    positive_seconds,
    resolve_salt,
    signals_stop,
    whole_number,
)

if TYPE_CHECKING:  # imported when the command runs, so --help and usage errors skip NumPy
    from ..fsm.lifecycle import Outcome
    from ..reduce import OuterOptimizer
    from ..runner.controller import ControllerNotice, ReferenceController, RoundReport

__all__ = [
    "LINE_COALESCE",
    "SIGNAL_STOP_DETAIL",
    "STDOUT_BACKLOG",
    "checkpoint_dir_problem",
    "checkpoints_overwritten",
    "notice_line",
    "parse_outer",
    "register",
    "resolve_salt",
    "run",
    "shut_down",
]

_PROG = "flodl-proto controller"
#: the detail of the clean outcome of a run stopped by SIGTERM or Ctrl-C: its ``finished:``
#: line ends ``(stop: signal)`` (the demo reads it)
SIGNAL_STOP_DETAIL = "signal"


def parse_outer(text: str | None) -> OuterOptimizer | None:
    """Parse ``--outer``: ``avg``, ``slow-momentum:LR,MU`` or ``nesterov:LR,MU`` (None: none).

    LR and MU are numbers as upstream's command line reads them
    (:func:`flodl_proto.spec.parse_f64`: ASCII, no ``_`` separators), finite, with blanks around
    them allowed.

    Raises:
        OptionError: anything else (a ``ValueError``); the message names the option, its value
            and, for a number that is not one, that number's field (LR or MU), and for text
            ``float()`` would read (``1_0``) why (:func:`flodl_proto._numbers.not_plain_note`).

    Upstream: ``outer_optimizer.rs`` (``SlowMomentum::new``, ``NesterovMomentum::new``: no
    validation of the values).
    """
    if text is None:
        return None
    name, _, params = text.strip().partition(":")
    name = name.lower()
    from ..reduce import NesterovMomentum, OuterAvg, SlowMomentum

    if name == "avg" and not params:
        return OuterAvg()
    if name in ("slow-momentum", "nesterov"):
        parts = params.split(",")
        if len(parts) != 2:
            raise OptionError("--outer", f"{shown(text)}: expected {name}:LR,MU (two finite "
                                         "numbers)")
        values = []
        for field, part in zip(("LR", "MU"), parts, strict=True):
            value = parse_f64(part.strip())
            if value is None or not math.isfinite(value):
                raise OptionError("--outer", f"{shown(text)}: {field} {shown(part.strip())} is "
                                             f"not a finite number{not_plain_note(part.strip())}; "
                                             f"expected {name}:LR,MU (two finite numbers)")
            values.append(value)
        lr, mu = values
        return SlowMomentum(lr, mu) if name == "slow-momentum" else NesterovMomentum(lr, mu)
    raise OptionError("--outer", f"{shown(text)}: expected avg, slow-momentum:LR,MU or "
                                 "nesterov:LR,MU")


def checkpoint_dir_problem(path: Path) -> str | None:
    """Create ``path`` (with its parents) if needed; return why checkpoints cannot be written
    there, or None when they can: ``exists and is not a directory``, ``is a symbolic link to
    'gone', which does not exist`` (``path`` itself, or a folder of it: ``cannot create it:
    ck is a symbolic link to ...``; the target as the link holds it), ``cannot create it:
    REASON``, ``not writable``.

    No upstream counterpart: upstream's binaries take no checkpoint folder option.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return _dangling_link(path) or "exists and is not a directory"
    except OSError as e:
        return f"cannot create it: {os_reason(e)}"
    if not path.is_dir():
        return "exists and is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


def _dangling_link(path: Path) -> str | None:
    """Why ``path`` cannot be made a folder when it, or a folder of it, is a symbolic link to
    nothing (which ``mkdir`` refuses as a file that exists): ``is a symbolic link to 'gone',
    which does not exist`` for ``path``, ``cannot create it: ck is a symbolic link to 'gone',
    which does not exist`` for a folder of it; None when there is no such link."""
    for link in (path, *path.parents):
        try:
            if link.is_symlink() and not link.exists():
                words = f"a symbolic link to {shown(os.readlink(link))}, which does not exist"
                return (f"is {words}" if link == path
                        else f"cannot create it: {shown_name(str(link))} is {words}")
        except (OSError, ValueError):  # cannot be looked up: mkdir's own reason stands
            return None
    return None


#: the name of a checkpoint file the controller writes (``consensus-<window, 6 digits>.npz``:
#: :func:`flodl_proto.runner.checkpoint.write_checkpoint`)
_CHECKPOINT_NAME = re.compile(r"consensus-[0-9]{6,}\.npz")


def checkpoints_overwritten(path: Path, shown_as: str) -> str | None:
    """The warning (one line, without the program prefix) for a ``--checkpoint-dir`` folder
    ``path`` (named ``shown_as``, as typed) that already holds checkpoint files
    (``consensus-<window>.npz``, of an earlier run with that folder): how many, and that this
    run overwrites each one of a window it writes
    (:func:`~flodl_proto.runner.checkpoint.write_checkpoint` replaces a file of the same
    name); None when it holds none (or cannot be listed: a failure
    to write is reported when a checkpoint is written). Raises nothing.

    No upstream counterpart: upstream's binaries take no checkpoint folder option.
    """
    try:
        n = sum(1 for name in os.listdir(path) if _CHECKPOINT_NAME.fullmatch(name))
    except OSError:
        return None
    if n == 0:
        return None
    files = "file" if n == 1 else "files"
    return (f"--checkpoint-dir {shown(shown_as)}: already holds {n} checkpoint {files} "
            f"(consensus-<window>.npz), which this run overwrites as it writes the same windows")


def register(sub: Any) -> None:
    """Add the ``controller`` subcommand.

    No upstream counterpart (the command line is this package's own).
    """
    p = sub.add_parser(
        "controller", help="run the reference cluster controller (data channel)",
        description="Accept relay connections until every rank is covered, then reduce and "
        "scatter one consensus per round, byte-exact with flodl's ClusterController.",
    )
    p.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="address to bind (port 0: any free port)")
    p.add_argument("--world-size", required=True, type=whole_number, metavar="N",
                   help="number of ranks (> 0)")
    add_salt_options(p)
    p.add_argument("--protocol-version", type=whole_number, choices=SUPPORTED_VERSIONS,
                   default=DEFAULT_VERSION, help="data-channel protocol version (default 2)")
    p.add_argument("--no-port-mux", action="store_true",
                   help="every connection is a data-channel connection (no /status)")
    p.add_argument("--outer", default=None, metavar="SPEC",
                   help="outer optimizer: avg, slow-momentum:LR,MU or nesterov:LR,MU")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR", type=path_text,
                   help="write each window's consensus as consensus-<window>.npz here")
    p.add_argument("--round-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                   help="declare a relay's ranks dead when its HostFrame has not arrived this "
                   f"long after the round's first one ({TIMEOUT_RULE}; default: no deadline, "
                   "as upstream)")
    add_frame_ceiling_option(p, "payload_len of a relay's record (and of a Broadcast)")
    p.set_defaults(func=run)


def _usage_error(message: str) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr, flush=True)
    return 2


def notice_line(notice: ControllerNotice) -> str | None:
    """The stdout line of a controller notice: ``relay R joined: host 'H' ranks [0, 1]`` or
    ``round K: kind KIND weight W bytes B ms T``; None for any other notice.

    No upstream counterpart (the command line is this package's own).
    """
    from ..fsm.events import RelayJoined
    from ..runner.controller import RoundReport

    if isinstance(notice, RelayJoined):
        ranks = ", ".join(str(r) for r in notice.ranks)
        return f"relay {notice.relay} joined: host {quoted(notice.host)} ranks [{ranks}]"
    if isinstance(notice, RoundReport):
        return _round_line(notice)
    return None


def _round_line(r: RoundReport) -> str:
    return f"round {r.round}: kind {r.kind} weight {r.weight:g} bytes {r.nbytes} ms {r.ms:.3f}"


def run(args: argparse.Namespace) -> int:
    """Run the controller until the run ends; return the exit code (0, 1 or 2).

    No upstream counterpart (the command line is this package's own).
    """
    try:
        host, port = parse_addr(args.listen, field=option_field("--listen"))
    except ProtocolError as e:
        return _usage_error(str(e))
    try:
        check_net_timeout_scale()
        check_world_size(args.world_size)
        salt = cli_salt(args.salt, args.salt_file)
        outer = parse_outer(args.outer)
        ceiling = frame_ceiling(args.frame_ceiling)
    except (ProtocolError, ValueError, OSError) as e:
        return _usage_error(str(e))
    if args.checkpoint_dir is not None:
        # a file, or a loop of links, where a folder of DIR should be: in the words of every
        # path option (``'a-file/sub': Not a directory (a-file is a file, not a folder)``)
        problem = file_in_the_way(args.checkpoint_dir, Path(args.checkpoint_dir))
        if problem is None and (why := checkpoint_dir_problem(Path(args.checkpoint_dir))):
            problem = f"{shown(args.checkpoint_dir)}: {why}"
        if problem is not None:
            return _usage_error(option_message("--checkpoint-dir", problem))
        overwritten = checkpoints_overwritten(Path(args.checkpoint_dir), args.checkpoint_dir)
        if overwritten is not None:
            print(f"{_PROG}: warning: {overwritten}", file=sys.stderr, flush=True)
    with interrupts_held():  # here: usage errors skip NumPy; Ctrl-C while it loads is one line
        from ..runner.controller import ReferenceController, RoundReport

    def on_notice(notice: ControllerNotice) -> None:  # a round's line without the imports
        lines.put(_round_line(notice) if type(notice) is RoundReport else notice_line(notice))

    stop = threading.Event()
    lines = LineWriter("stdout", STDOUT_BACKLOG, name="flodl-controller-stdout",
                       coalesce=LINE_COALESCE)
    # signal handlers first: a SIGINT/SIGTERM right after the first line is a clean stop
    with queued_stderr_logging() as log_lines, signals_stop(stop):
        if stopped_early():  # a SIGTERM before signals_stop's handler: the same clean stop
            from ..fsm.lifecycle import Outcome

            print(f"controller finished: {Outcome(True, 'stop', detail=SIGNAL_STOP_DETAIL)}",
                  flush=True)
            return 0
        try:
            ctl = ReferenceController(
                args.world_size, salt, host=host, port=port, version=args.protocol_version,
                port_mux=not args.no_port_mux, outer=outer, checkpoint_dir=args.checkpoint_dir,
                on_notice=on_notice,
                round_timeout=args.round_timeout, ceiling=ceiling,
            )
            ctl.start()
        except ProtocolError as e:
            return _usage_error(str(for_option(e, "round_timeout", "--round-timeout")))
        except socket.gaierror as e:
            if e.errno not in NO_SUCH_NAME:  # the resolver cannot answer now: the environment
                print(f"{_PROG}: error: cannot listen on {args.listen} (--listen): "
                      f"{os_reason(e)}", file=sys.stderr, flush=True)
                return 1
            # a name that does not exist is the command line's, as relay --controller's
            return _usage_error(option_message("--listen", f"{shown(args.listen)}: cannot "
                                               f"resolve host {shown(host)}: {os_reason(e)}"))
        except OSError as e:  # e.g. the address is in use: the environment, not the command line
            print(f"{_PROG}: error: cannot listen on {args.listen} (--listen): "
                  f"{os_reason(e)}", file=sys.stderr, flush=True)
            return 1
        try:
            print(f"listening on {format_addr((host, ctl.port))}", flush=True)
            lines.start()  # after the first line, which stays first
            while ctl.wait(0.2) is None:
                if stop.is_set():
                    ctl.request_stop(SIGNAL_STOP_DETAIL)
        finally:
            outcome = shut_down(ctl)
    lines.close()  # outside signals_stop: Ctrl-C interrupts a wait for an unread stdout
    report_dropped(_PROG, lines, log_lines)
    if outcome.clean:
        print(f"controller finished: {outcome}", flush=True)
        return 0
    print(f"{_PROG}: error: {failure_line(outcome.error, outcome.detail)}", file=sys.stderr,
          flush=True)
    return 1


def shut_down(ctl: ReferenceController) -> Outcome:
    """``ctl.shutdown()`` (a run still going stops cleanly, ``shutdown()`` its detail), waited
    for in steps of :data:`._waits.WAIT_STEP` seconds: the teardown may wait for a relay's
    writes (each within its write-stall deadline, 30 s x ``FLODL_NET_TIMEOUT_SCALE``), and a
    signal's handler then runs at once, whichever thread the kernel gave the signal to. Returns
    the run's outcome. Upstream: ``controller/mod.rs`` ``ClusterController::shutdown``."""
    if ctl.wait(0) is None:
        ctl.request_stop("shutdown()")
    while ctl.wait(WAIT_STEP) is None:
        pass
    return ctl.shutdown()


def failure_line(error: BaseException | None, detail: str = "") -> str:
    """One line for a failed run: ``detail`` (the relay and ranks, or the connection, involved)
    then a protocol error's message; for an unexpected exception (a bug, or a failure outside
    the protocol) its type and first line, with ``detail`` saying where it happened."""
    if error is None:
        return detail or "the run failed"
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(error, ProtocolError):
        return f"{detail}: {first}" if detail else first or type(error).__name__
    return (f"the controller failed unexpectedly{' ' + detail if detail else ''}: "
            f"{type(error).__name__}" + (f": {first}" if first else ""))

"""``flodl-proto rank``: a synthetic rank that reduces deterministic tensors through its relay.

::

    flodl-proto rank --relay HOST:PORT --rank R --world-size N
                     (--salt HEX | --salt-file PATH | env FLODL_SESSION_SALT)
                     [--rounds K] [--interval SECONDS] [--payload-mib M] [--bf16]
                     [--protocol-version 2|3] [--frame-ceiling BYTES]

Round ``k`` (1-based) of rank ``r`` contributes :func:`synthetic_tensors` ``(r, k, M)`` with the
realized-work mass ``(r + k) % 4`` (so some rounds have an idle rank). After each round it prints
exactly ``round K digest <sha256 of the consensus frame's bytes>`` (64 lowercase hex digits), and
exits 0 after ``K`` rounds. Ranks of one run print identical digests. ``K`` is 1 to 1000000
(:data:`ROUNDS_MAX`, as ``demo --rounds``; ``--rounds 0`` is a bad command line, exit 2): a rank
that leaves ends the run for every rank, as flodl does, so a rank joining for no round would only
end the others' run. A relay that is not there yet is retried every 0.5 s for about 30 s (x
``FLODL_NET_TIMEOUT_SCALE``), which stderr says once (``waiting for the relay: connect to HOST:PORT
failed: ...; retrying every 0.5s, giving up after ~30s``). Exit 1 on a connection or protocol
failure (one line on stderr: the relay could not be reached in that time too), 2 for a bad command
line (one line, ``flodl-proto rank: error: ...``, e.g. a ``--frame-ceiling`` that is not a whole
number of bytes from 25, the smallest RoundFrame (spec departure ``ceiling_floor``), to U32_MAX; the
ceiling, default 1 GiB, bounds a reply's length prefix and the one this rank writes: its whole
frame, headers included, above it is refused before anything is sent, exit 1); output piped into a
reader that stops early (``| head -1``) ends the rank quietly with 141 (it leaves the run, as a
killed rank would).

The relay's host name is looked up at start-up, after the other checks of the command line and
before the relay is dialled (a name that does not exist would otherwise be retried as a relay
not there yet, for about 30 s, then exit 1): a name the resolver says does not exist (a typo,
any ``.invalid`` name) is a bad command line, exit 2 (``flodl-proto rank: error: argument
--relay: 'nosuch.invalid:7004': cannot resolve host 'nosuch.invalid': Name or service not
known``). A
resolver that cannot answer now (a temporary failure, or no answer within 10 s x
``FLODL_NET_TIMEOUT_SCALE``) is one warning line on stderr (``flodl-proto rank R: warning:
...``) and the rank goes on. The address found is not kept: each dial attempt looks the name up
again.

The digest lines are written by a thread of their own, so a stdout that is read slowly, or not at
all (a full pipe), never holds up a round (and with it the whole cluster); it writes the lines of
up to :data:`~flodl_proto.commands._output.LINE_COALESCE` seconds together, as the controller
does (a line per round would otherwise wake it every round): at most
:data:`~flodl_proto.commands._output.STDOUT_BACKLOG` lines wait, later ones are dropped, and the
number dropped is one warning line on stderr when the rank ends (before the error line, if any).
Log records go to stderr the same way. At the end the rank waits for stdout to take the lines
still waiting.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from ..addr import parse_addr
from ..cli import interrupts_held
from ..errors import ProtocolError
from ..spec import DEFAULT_VERSION, SUPPORTED_VERSIONS
from ._number_args import shown_as_typed
from ._option_error import OptionError, option_field, option_message
from ._output import (
    LINE_COALESCE,
    STDOUT_BACKLOG,
    LineWriter,
    queued_stderr_logging,
    report_dropped,
)
from ._waits import sleep
from .relay import (
    add_frame_ceiling_option,
    add_salt_options,
    check_host_resolves,
    check_net_timeout_scale,
    check_world_size,
    cli_salt,
    frame_ceiling,
    real_number,
    whole_number,
)

if TYPE_CHECKING:  # imported when the command runs, so --help and usage errors skip NumPy
    import numpy as np
    import numpy.typing as npt

__all__ = ["ROUNDS_MAX", "mass_of", "register", "synthetic_tensors"]

_MIB = 1 << 20
#: the most rounds ``--rounds`` takes (as ``demo --rounds``)
ROUNDS_MAX = 1_000_000


def synthetic_tensors(rank: int, round_: int, payload_mib: float = 0.0
                      ) -> list[npt.NDArray[np.float32]]:
    """Deterministic f32 tensors of ``rank`` for round ``round_``.

    Returns shapes ``[4, 8]``, ``[257]`` and ``[]`` (a scalar) drawn from a generator seeded by
    ``(rank, round_)``, plus, when ``payload_mib > 0``, one flat tensor of ``payload_mib`` MiB
    (``(i mod 1021) / 64 + rank + round_``).

    No upstream counterpart: upstream has no synthetic rank.
    """
    import numpy as np

    rng = np.random.default_rng([rank, round_])
    out = [
        rng.standard_normal((4, 8), dtype=np.float32),
        rng.standard_normal(257, dtype=np.float32),
        rng.standard_normal(1, dtype=np.float32).reshape(()),
    ]
    n = int(payload_mib * _MIB) // 4
    if n > 0:
        big = (np.arange(n, dtype=np.int64) % 1021).astype(np.float32)
        big *= np.float32(1.0 / 64.0)
        big += np.float32(rank + round_)
        out.append(big)
    return out


def synthetic_frame_len(payload_mib: float, bf16: bool = False) -> int:
    """Wire length in bytes of the frame a rank sends with :func:`synthetic_tensors` (every rank
    and round: the shapes are fixed), f32 or (``bf16``) bf16 elements, computed without building
    the ``payload_mib`` tensor.

    No upstream counterpart: upstream has no synthetic rank; the length is
    ``controller/round_frame.rs`` ``round_frame_wire_len``'s.
    """
    from ..codec import Dtype, TensorPayload, round_frame_wire_len

    shapes = [list(a.shape) for a in synthetic_tensors(0, 0)]
    n = int(payload_mib * _MIB) // 4
    if n > 0:
        shapes.append([n])
    dtype = Dtype.BF16 if bf16 else Dtype.F32
    # the layout's length with no payload bytes (elided tensors of the same ndim: a tensor's
    # header length depends on its ndim only), plus the payload bytes
    return (round_frame_wire_len(TensorPayload.elide(dtype, [1] * len(s)) for s in shapes)
            + dtype.element_size * sum(int(math.prod(s)) for s in shapes))


def mass_of(rank: int, round_: int) -> float:
    """Realized-work mass of ``rank`` in round ``round_``: ``(rank + round_) % 4`` (0 = idle).

    No upstream counterpart: upstream has no synthetic rank.
    """
    return float((rank + round_) % 4)


def register(sub: Any) -> None:
    """Add the ``rank`` subcommand.

    No upstream counterpart (the command line is this package's own).
    """
    p = sub.add_parser(
        "rank", help="run a synthetic rank against a relay and print each consensus digest",
        description="Connect to a relay's loopback data port and reduce deterministic "
        "synthetic tensors for K rounds, printing 'round K digest <sha256>' after each.",
    )
    p.add_argument("--relay", required=True, metavar="HOST:PORT",
                   help="the relay's loopback data address (its host name is looked up at "
                   "start-up)")
    p.add_argument("--rank", required=True, type=whole_number, metavar="R",
                   help="this rank's global id, 0 <= R < N (one of the relay's --ranks)")
    p.add_argument("--world-size", required=True, type=whole_number, metavar="N",
                   help="number of ranks in the whole run (every host)")
    add_salt_options(p)
    p.add_argument("--rounds", type=whole_number, default=5, metavar="K",
                   help=f"rounds to run, 1 to {ROUNDS_MAX} (default 5); then the rank leaves, "
                   "which ends the run for every rank, as flodl does")
    p.add_argument("--payload-mib", type=real_number, default=0.0, metavar="M",
                   help="add one f32 tensor of M MiB to every frame (default 0)")
    p.add_argument("--interval", type=real_number, default=0.0, metavar="SECONDS",
                   help="pause between rounds (default 0), to watch a run (GET /status)")
    p.add_argument("--bf16", action="store_true", help="ship Model rounds as bf16")
    p.add_argument("--protocol-version", type=whole_number, choices=SUPPORTED_VERSIONS,
                   default=DEFAULT_VERSION, help="data-channel protocol version (default 2)")
    add_frame_ceiling_option(p, "length prefix of a reply (and of this rank's own frame, "
                             "headers included)")
    p.set_defaults(func=run)


def pause(seconds: float) -> None:
    """Sleep ``seconds`` (finite, >= 0) in steps of :data:`._waits.WAIT_STEP` seconds
    (:func:`._waits.sleep`): a Ctrl-C the kernel gave another thread (the stdout writer's, the
    log writer's) ends the pause at once, where one ``time.sleep`` held the handler until the
    pause ended; and no step reaches the end the clock cannot represent (``time.sleep``
    refuses it: ``OverflowError`` above ``threading.TIMEOUT_MAX``, ``OSError`` EINVAL near it),
    so ``--interval 1e308`` waits instead of failing.

    No upstream counterpart: upstream has no synthetic rank.
    """
    sleep(seconds)


def run(args: argparse.Namespace) -> int:
    """Run the rank; return the exit code."""
    try:
        check_net_timeout_scale()
        check_world_size(args.world_size)
        if not 0 <= args.rank < args.world_size:  # the client checks it too, naming rank_id
            raise OptionError("--rank", f"must be in 0..{args.world_size - 1} (below "
                                         f"--world-size), got {args.rank}")
        salt = cli_salt(args.salt, args.salt_file)
        addr = parse_addr(args.relay, field=option_field("--relay"), dial=True)
        ceiling = frame_ceiling(args.frame_ceiling)
        if not 1 <= args.rounds <= ROUNDS_MAX:  # a rank that leaves ends the run: zero rounds
            # would only end the others'
            raise OptionError("--rounds", f"must be in 1..{ROUNDS_MAX}, got {args.rounds}")
        for option, value in (("--payload-mib", args.payload_mib), ("--interval", args.interval)):
            if not 0 <= value < math.inf:  # nan and inf too: no frame or pause of that size
                raise OptionError(option, f"must be a finite number >= 0, got "
                                          f"{shown_as_typed(value)}")
    except (ValueError, ProtocolError, OSError) as e:
        print(f"flodl-proto rank: error: {e}", file=sys.stderr, flush=True)
        return 2
    with interrupts_held():  # here: the errors above skip NumPy; Ctrl-C while it loads: one line
        from ..runner.rank import RankClient  # (--bf16 too: f32 tensors on a bf16 wire are
        # rounded and widened in integer ops, so ml_dtypes is never loaded)

    # the frame must fit the ceiling: checked before the tensor is built or the relay dialled
    if (wire := synthetic_frame_len(args.payload_mib, args.bf16)) > ceiling:
        frame = f"a {wire}-byte frame," if wire < 1 << 64 else "a frame"  # 1e300: 300 digits
        too_big = (f"{shown_as_typed(args.payload_mib)} makes {frame} above the frame ceiling "
                   f"{ceiling} (--frame-ceiling)")
        print(f"flodl-proto rank: error: {option_message('--payload-mib', too_big)}",
              file=sys.stderr, flush=True)
        return 2
    try:  # last: every other mistake is reported without waiting for the resolver
        unresolved = check_host_resolves("--relay", args.relay, addr)
    except ValueError as e:
        print(f"flodl-proto rank: error: {e}", file=sys.stderr, flush=True)
        return 2

    prog = f"flodl-proto rank {args.rank}"
    if unresolved is not None:
        print(f"{prog}: warning: {unresolved}", file=sys.stderr, flush=True)
    lines = LineWriter("stdout", STDOUT_BACKLOG, name="flodl-rank-stdout",
                       coalesce=LINE_COALESCE)
    lines.start()
    failure: tuple[int, str] | None = None
    stdout_gone = False
    try:
        with queued_stderr_logging() as log_lines:
            def waiting(line: str) -> None:  # once, before any round: the relay is not there yet
                log_lines.put(f"{prog}: waiting for the relay: {line}")

            try:
                with RankClient.connect(addr, args.rank, args.world_size, salt,
                                        args.protocol_version, bf16=args.bf16,
                                        ceiling=ceiling, on_retry=waiting) as client:
                    for k in range(1, args.rounds + 1):
                        arrays = synthetic_tensors(args.rank, k, args.payload_mib)
                        mass = mass_of(args.rank, k)
                        reply = client.all_reduce_scaled(arrays, mass, weight=mass)
                        if lines.broken:  # the reader of stdout went away (``| head -1``)
                            stdout_gone = True
                            raise BrokenPipeError("stdout")
                        lines.put(f"round {k} digest {reply.digest()}")
                        if args.interval > 0 and k < args.rounds:
                            pause(args.interval)
            except ProtocolError as e:
                failure = (2 if not e.remote and e.kind == "value" else 1, f"{prog}: error: {e}")
            except MemoryError:  # --payload-mib larger than this machine can hold
                failure = (1, f"{prog}: error: cannot allocate the --payload-mib "
                              f"{args.payload_mib} tensor")
            except OSError as e:
                if stdout_gone:
                    raise  # not a connection failure: the CLI ends quietly with 141
                failure = (1, f"{prog}: error: {e}")
    finally:
        lines.close()  # the digest lines still waiting: waits for stdout to take them
    if lines.broken:  # the reader of stdout went away: quietly 141, as every command
        raise BrokenPipeError("stdout")
    report_dropped(prog, lines, log_lines)
    if failure is not None:
        print(failure[1], file=sys.stderr, flush=True)
        return failure[0]
    return 0

"""Entry point of the ``flodl-proto`` console script and of ``python -m flodl_proto``.

It imports the command line (:mod:`flodl_proto.cli`, some tens of milliseconds) and runs
:func:`flodl_proto.cli.entry`. A Ctrl-C while that import runs is the line ``flodl-proto
COMMAND: interrupted`` and exit 130, as later in the run, not a traceback. (Before this module
runs, while the interpreter starts and imports the package, Python's own handling applies.)

No upstream counterpart (the command line is this package's own).
"""

from __future__ import annotations

import sys

__all__ = ["entry"]


def entry() -> int:
    """Import :mod:`flodl_proto.cli` and return :func:`flodl_proto.cli.entry`'s exit code; 130
    (one line on stderr) when a Ctrl-C interrupts the import. No upstream counterpart."""
    try:
        from . import cli
    except KeyboardInterrupt:
        import signal  # here, not above: the import before the try is kept short

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot interrupt this
        from . import cli  # again (an interrupted import is undone), for the command's name

        if sys.stderr is not None:
            print(f"{cli._argv_prog(sys.argv[1:])}: interrupted", file=sys.stderr, flush=True)
        return cli.EXIT_INTERRUPTED
    return cli.entry()

"""``flodl-proto dissector [--out PATH] [--port N ...]``: write the Wireshark Lua dissector.

The dissector is generated from ``spec/wire.yaml`` (see :mod:`flodl_proto.dissector`); ``--port``
sets the TCP ports registered by default (repeatable; default: the controller port and the relay
loopback port). Other ports are found by the dissector's heuristic on the magics, or set with
Wireshark's Decode As.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..dissector import default_ports, render_dissector
from ._paths import output_path
from .docs import write_output
from .relay import tcp_port

__all__ = ["register"]

DEFAULT_OUT = "flodl_proto.lua"
_PROG = "flodl-proto dissector"


def register(sub: Any) -> None:
    """Add the ``dissector`` subcommand to the CLI's subparsers.

    No upstream counterpart (the command line is this package's own).
    """
    ports = ", ".join(map(str, default_ports()))
    p = sub.add_parser(
        "dissector", help="write a Wireshark Lua dissector generated from the spec",
        description="Write a Wireshark Lua dissector for the data channel, generated from "
        "spec/wire.yaml. Install it in Wireshark's personal Lua plugins folder, or load it with "
        "`tshark -X lua_script:PATH`.",
    )
    p.add_argument("--out", type=output_path, default=Path(DEFAULT_OUT), metavar="PATH",
                   help=f"output file (default {DEFAULT_OUT}; '-' writes to stdout); missing "
                   "parent folders are created, e.g. Wireshark's personal plugins folder")
    p.add_argument("--port", type=tcp_port, action="append", metavar="N",
                   help=f"TCP port decoded as flodl by default (repeatable; default {ports})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the dissector; return 0, or 1 when the file cannot be written (one stderr line,
    ``flodl-proto dissector: error: cannot write 'PATH': WHY``, as the other generators). A
    ``--out`` that names a folder or runs through a file is refused before, with the command
    line (exit 2: :func:`~._paths.output_path`)."""
    text = render_dissector(args.port)
    if str(args.out) == "-":
        print(text, end="")  # a closed stdout (None) takes nothing
        return 0
    # as `docs --out`: missing parent folders are created (e.g. Wireshark's plugins folder)
    return write_output(args.out, text.encode("utf-8"), _PROG)

"""``flodl-proto docs [--out PATH] [--check]``: generate the protocol reference from the spec.

Writes ``docs/protocol.md`` (or ``--out``) from ``spec/wire.yaml`` and ``spec/lifecycle.yaml``;
with ``--check`` writes nothing and exits 1 when the file is missing or differs from what the spec
generates (for CI).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..docs import DEFAULT_OUT, render_protocol_doc

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``docs`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("docs", help="generate docs/protocol.md from the spec")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="PATH",
                   help=f"output file (default: {DEFAULT_OUT}; '-' writes to stdout)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if PATH is missing or out of date")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    text = render_protocol_doc()
    out: Path = args.out
    if str(out) == "-":
        sys.stdout.write(text)
        return 0
    current = out.read_text(encoding="utf-8") if out.is_file() else None
    if args.check:
        if current == text:
            print(f"{out}: up to date")
            return 0
        print(f"{out}: out of date; run `flodl-proto docs --out {out}`", file=sys.stderr)
        return 1
    if current != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8", newline="\n")
        print(f"{out}: written ({len(text.encode('utf-8'))} bytes)")
    else:
        print(f"{out}: up to date")
    return 0

"""``flodl-proto`` command line (argparse).

Each subcommand lives in a module of :mod:`flodl_proto.commands` exposing
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

from . import __version__, commands
from .errors import LocalProtocolError
from .reduce._kernels import check_backend_name, set_kernel_backend
from .spec import DEFAULT_VERSION, SUPPORTED_VERSIONS

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand of :mod:`flodl_proto.commands`."""
    parser = argparse.ArgumentParser(
        prog="flodl-proto",
        description="flodl cluster data-channel protocol: codec, reference controller, relay, "
        "rank client, interop vectors, docs.",
    )
    parser.add_argument("--log-level", default="WARNING", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default WARNING)")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} (data-channel protocol versions "
                                f"{', '.join(map(str, SUPPORTED_VERSIONS))}; default "
                                f"{DEFAULT_VERSION})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flodl-proto`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # a bad kernel choice is reported now, not at the first bf16 reduce of every process
        if check_backend_name(os.environ.get("FLODL_PROTO_KERNELS", ""),
                              origin="FLODL_PROTO_KERNELS") == "numba":
            set_kernel_backend()
    except LocalProtocolError as exc:
        parser.error(str(exc))
    level = getattr(args, "log_level", "WARNING")
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

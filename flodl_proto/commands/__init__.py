"""Subcommands of the ``flodl-proto`` CLI, one module each (``register(subparsers)``)."""

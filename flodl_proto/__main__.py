"""``python -m flodl_proto``: the ``flodl-proto`` command line."""

import sys

from .cli import entry

sys.exit(entry())

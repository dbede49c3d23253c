"""``python -m flodl_proto``: the ``flodl-proto`` command line."""

import sys

from ._console import entry

sys.exit(entry())

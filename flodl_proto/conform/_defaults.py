"""The conformance kit's defaults that the command line shows before the kit loads: a leaf
module (the standard library's ``typing`` alone), so ``flodl-proto conform``'s parser, its help
and ``conform docs`` read them without importing the player, the codec or NumPy.

No upstream counterpart: upstream has no conformance kit.
"""

from __future__ import annotations

from typing import Final

__all__ = ["READY_TIMEOUT"]

#: seconds a target may take to listen, whatever ``--timeout-scale``: ``--start-timeout``'s
#: default and :class:`~flodl_proto.conform.player.KitSettings`' ``ready_timeout``, and the
#: figure ``docs/conformance.md`` states (:mod:`flodl_proto.conform.doc` reads it as it renders)
READY_TIMEOUT: Final = 20.0

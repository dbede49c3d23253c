"""Protocol decisions without I/O: the controller lifecycle generated from ``spec/lifecycle.yaml``
(:mod:`flodl_proto.fsm.lifecycle`) and the sans-IO controller core
(:mod:`flodl_proto.fsm.controller_core`). Nothing here touches a socket, a thread or a clock."""

from __future__ import annotations

from .controller_core import ControllerCore
from .lifecycle import Lifecycle, Outcome, lifecycle_class

__all__ = ["ControllerCore", "Lifecycle", "Outcome", "lifecycle_class"]

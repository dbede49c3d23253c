"""Protocol decisions without I/O: the controller and relay lifecycles generated from
``spec/lifecycle.yaml`` (:mod:`flodl_proto.fsm.lifecycle`), the sans-IO controller core
(:mod:`flodl_proto.fsm.controller_core`), the sans-IO relay core
(:mod:`flodl_proto.fsm.relay_core`) and the actions they return (:mod:`flodl_proto.fsm.events`).
Nothing here touches a socket or a clock (time is passed in); the cores start no thread of their
own (the reduce's parallelism is passed in; a HostFrame or Broadcast record's two MACs are
computed on two threads by the codec's encoder)."""

from __future__ import annotations

from .controller_core import ControllerCore
from .lifecycle import Lifecycle, Outcome, lifecycle_class
from .relay_core import RelayCore

__all__ = ["ControllerCore", "Lifecycle", "Outcome", "RelayCore", "lifecycle_class"]

"""The frame ceiling a controller, relay or rank is given: checked once, where it is built.

A ceiling below the smallest RoundFrame would make a run fail at the peer, with a message that
cannot name the cause (a controller that refuses a relay's Hello closes the connection; the
relay can only guess at the version or the salt). The floor is
:func:`flodl_proto.spec.frame_ceiling_floor` (spec departure ``ceiling_floor``); a ceiling
above it can still be below a large relay's Hello.

No upstream counterpart: upstream takes no ceiling from its caller (``wire.rs`` derives it).
"""

from __future__ import annotations

from ..errors import protocol_error
from ..spec import frame_ceiling_floor
from ._common import check_ceiling

__all__ = ["check_frame_ceiling"]


def check_frame_ceiling(ceiling: int, role: str) -> int:
    """Check the frame ceiling (bytes) given to a ``role`` and return it.

    Args:
        ceiling: the ceiling, bytes.
        role: who takes it (``"controller"``, ``"relay"`` or ``"rank"``), named in the error.

    Raises:
        InvalidValue (local): ``ceiling`` is not a non-negative integer (``ceiling.invalid``),
            or it is below the role's floor (``ceiling.below_minimum``, naming the role, the
            value, the minimum and what the minimum is).

    No upstream counterpart: upstream takes no ceiling from its caller.
    """
    check_ceiling(ceiling)
    minimum, what = frame_ceiling_floor()
    if ceiling < minimum:
        raise protocol_error("ceiling.below_minimum", role=role, value=ceiling, minimum=minimum,
                             what=what)
    return ceiling

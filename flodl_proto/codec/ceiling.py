"""The frame ceiling a controller, relay or rank is given: checked once, where it is built.

A ceiling below the smallest RoundFrame would make a run fail at the peer, with a message that
cannot be sure of the cause: a controller that refuses a relay's Hello closes the connection
without a word, and the relay's error (``relay.closed_before_helloack``) can only list the
likely causes (the version, the salt, or a controller's ceiling below the Hello) beside the
Hello's size, for the operator to compare with the controller's ceiling. The floor is
:func:`flodl_proto.spec.frame_ceiling_floor` (spec departure ``ceiling_floor``); a ceiling
above it can still be below a large relay's Hello.

No upstream counterpart: upstream takes no ceiling from its caller (``wire.rs`` derives it).
"""

from __future__ import annotations

import operator

from ..errors import protocol_error
from ..spec import frame_ceiling_floor

__all__ = ["check_frame_ceiling", "frame_ceiling_int"]


def frame_ceiling_int(ceiling: int) -> int:
    """A frame ceiling (bytes) as a plain ``int``, refusing what is not a non-negative integer.

    Any integral value is taken (``operator.index``: an ``int``, a NumPy integer such as
    ``np.int64``); a bool, a float (even ``1024.0``: a ceiling is a byte count, and ``int()``
    would silently truncate ``1024.5``) or a string is refused. No floor is applied: that is
    :func:`check_frame_ceiling`'s, for a ceiling a caller gives.

    Args:
        ceiling: the ceiling, bytes.

    Returns:
        ``ceiling`` as an ``int``, so that the codec's ``type(ceiling) is int`` fast paths apply.

    Raises:
        InvalidValue (local) ``ceiling.invalid``: not a non-negative integer.

    No upstream counterpart: upstream takes no ceiling from its caller.
    """
    try:
        if isinstance(ceiling, bool):
            raise TypeError
        value = operator.index(ceiling)
    except TypeError:
        raise protocol_error("ceiling.invalid", value=ceiling) from None
    if value < 0:
        raise protocol_error("ceiling.invalid", value=ceiling)
    return value


def check_frame_ceiling(ceiling: int, role: str) -> int:
    """Check the frame ceiling (bytes) given to a ``role`` and return it as a plain ``int``.

    Any integral value is taken (``operator.index``: an ``int``, a NumPy integer such as
    ``np.int64``); the result is always of type ``int``, so a constructor that keeps it hits the
    codec's ``type(ceiling) is int`` fast paths.

    Args:
        ceiling: the ceiling, bytes.
        role: who takes it (``"controller"``, ``"relay"`` or ``"rank"``), named in the error.

    Returns:
        ``ceiling`` as an ``int``.

    Raises:
        InvalidValue (local): ``ceiling`` is not a non-negative integer (``ceiling.invalid``:
            a bool, a float or a string included), or it is below the role's floor
            (``ceiling.below_minimum``, naming the role, the value, the minimum and what the
            minimum is).

    No upstream counterpart: upstream takes no ceiling from its caller.
    """
    value = frame_ceiling_int(ceiling)
    minimum, what = frame_ceiling_floor()
    if value < minimum:
        raise protocol_error("ceiling.below_minimum", role=role, value=value, minimum=minimum,
                             what=what)
    return value

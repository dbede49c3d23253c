"""The frame ceiling a controller, relay or rank is given: its floor is the smallest RoundFrame
(spec departure ``ceiling_floor``), checked by ``codec.ceiling.check_frame_ceiling``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flodl_proto.codec.ceiling import check_frame_ceiling
from flodl_proto.codec.mux import DeclareDead, Hello, HelloAck, RankExit, encode_control
from flodl_proto.codec.round_frame import RoundFrame, RoundKind, encode_round_frame_bytes
from flodl_proto.errors import InvalidValue
from flodl_proto.spec import U32_MAX, frame_ceiling_floor

SALT = bytes(range(16))


def test_the_floor_is_the_smallest_round_frame_and_above_every_smallest_record() -> None:
    empty = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, []), SALT)
    assert frame_ceiling_floor() == (len(empty), "the smallest RoundFrame: no tensor")
    assert len(empty) == 25
    # the handshake and control records are shorter: none is refused by a ceiling at the floor
    assert len(encode_control(Hello("", [0]), version=2)) == 4
    assert len(encode_control(Hello("", [0]), version=3)) == 5
    assert len(encode_control(HelloAck())) == 1
    assert len(encode_control(RankExit(U32_MAX))) == len(encode_control(DeclareDead(U32_MAX))) == 6


@pytest.mark.parametrize("role", ["controller", "relay", "rank"])
def test_check_frame_ceiling_takes_the_floor_and_refuses_one_byte_less(role: str) -> None:
    assert check_frame_ceiling(25, role) == 25
    assert check_frame_ceiling(3 << 30, role) == 3 << 30  # no upper bound here
    for below in (24, 0):
        with pytest.raises(InvalidValue) as e:
            check_frame_ceiling(below, role)
        assert str(e.value) == (f"{role}: frame ceiling {below} is below 25 bytes (the smallest "
                                "RoundFrame: no tensor); a record every run exchanges would be "
                                "refused")
        assert e.value.error_id == "ceiling.below_minimum" and not e.value.remote
        assert dict(e.value.fields) == {"role": role, "value": below, "minimum": 25,
                                        "what": "the smallest RoundFrame: no tensor"}


@pytest.mark.parametrize("ceiling", [-1, True, 1.5, "64"])
def test_a_ceiling_that_is_no_byte_count_is_invalid(ceiling: object) -> None:
    with pytest.raises(InvalidValue) as e:
        check_frame_ceiling(ceiling, "relay")  # type: ignore[arg-type]
    assert e.value.error_id == "ceiling.invalid" and not e.value.remote
    assert str(e.value) == f"frame ceiling must be a non-negative number of bytes, got {ceiling!r}"


@pytest.mark.parametrize("ceiling", [np.int64(1 << 20), np.uint32(25), np.int8(100)])
def test_any_integral_ceiling_is_taken_as_a_plain_int(ceiling: Any) -> None:
    got = check_frame_ceiling(ceiling, "rank")
    assert got == int(ceiling) and type(got) is int  # the codec's fast paths test the type


@pytest.mark.parametrize(("ceiling", "error_id"), [
    (np.float64(64.0), "ceiling.invalid"), (64.0, "ceiling.invalid"),
    (np.bool_(True), "ceiling.invalid"), (np.int64(-1), "ceiling.invalid"),
    (np.int64(24), "ceiling.below_minimum"),
])
def test_a_numpy_value_that_is_no_byte_count_is_refused(ceiling: Any, error_id: str) -> None:
    with pytest.raises(InvalidValue) as e:
        check_frame_ceiling(ceiling, "relay")
    assert e.value.error_id == error_id and not e.value.remote


def test_the_controller_and_the_relay_take_a_numpy_ceiling() -> None:
    from flodl_proto.runner.controller import ReferenceController
    from flodl_proto.runner.relay import Relay

    relay = Relay("127.0.0.1:1", [0], 1, SALT, ceiling=np.int64(1 << 20))
    assert relay.ceiling == 1 << 20 and type(relay.ceiling) is int
    relay.shutdown()
    with ReferenceController(1, SALT, ceiling=np.int64(1 << 20)) as ctl:
        assert ctl.port > 0


@pytest.mark.parametrize("ceiling", [1024.5, 1024.0, np.float32(1024), "1024", True, -1])
def test_the_cores_refuse_a_ceiling_that_is_no_byte_count(ceiling: Any) -> None:
    """``int()`` truncated 1024.5 to 1024 silently."""
    from flodl_proto.fsm.controller_core import ControllerCore
    from flodl_proto.fsm.relay_core import RelayCore

    for make in (lambda: ControllerCore(1, SALT, ceiling=ceiling),
                 lambda: RelayCore((0,), 1, SALT, ceiling=ceiling)):
        with pytest.raises(InvalidValue) as e:
            make()
        assert e.value.error_id == "ceiling.invalid" and not e.value.remote
        assert str(e.value) == ("frame ceiling must be a non-negative number of bytes, got "
                                f"{ceiling!r}")


def test_the_cores_keep_an_integral_ceiling_as_a_plain_int() -> None:
    from flodl_proto.fsm.controller_core import ControllerCore
    from flodl_proto.fsm.relay_core import RelayCore

    for core in (ControllerCore(1, SALT, ceiling=np.int64(4096)),
                 RelayCore((0,), 1, SALT, ceiling=np.uint32(24))):  # no floor in the core
        assert type(core.ceiling) is int and core.ceiling in (4096, 24)

"""A 0-d NumPy array of a number is taken as that number by both of the package's rules: the
integer rule took ``np.array(5)`` (NumPy gives a 0-d integer array an ``__index__``), as a
frame ceiling, a bit pattern or a rank, while the real-number rule refused ``np.array(0.5)`` as
a weight, a mass or a scale. Arrays of one or more dimensions, and 0-d bool arrays, are refused
by both."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flodl_proto.codec._common import wire_int, wire_real
from flodl_proto.codec.ceiling import frame_ceiling_int
from flodl_proto.errors import InvalidValue
from flodl_proto.reduce.fold import gamma_mass, is_realized, mover_mass
from flodl_proto.reduce.payload import f32_bits_to_bf16_bits
from flodl_proto.runner._rank_payloads import real_argument


@pytest.mark.parametrize(("value", "real"), [
    (np.array(5), 5.0), (np.array(5, dtype=np.uint8), 5.0), (np.array(0.5), 0.5),
    (np.array(0.1, dtype=np.float32), float(np.float32(0.1))),
    (np.array(-np.inf), -np.inf),
])
def test_a_0d_array_of_a_number_is_a_real_number(value: Any, real: float) -> None:
    got = wire_real(value)
    assert type(got) is float and got == real
    assert real_argument("weight", value) == real
    if value.dtype.kind in "iu":
        assert wire_int(value) == int(real) and type(wire_int(value)) is int


@pytest.mark.parametrize("value", [np.array([5]), np.array([0.5]), np.array(True),
                                   np.array(1 + 2j), np.array("2"), np.zeros((1, 1))])
def test_other_arrays_are_refused_by_both_rules(value: Any) -> None:
    assert wire_int(value) is None
    assert wire_real(value) is None
    with pytest.raises(InvalidValue):
        real_argument("weight", value)


def test_the_library_takes_a_0d_array_where_it_takes_its_number() -> None:
    assert frame_ceiling_int(np.array(4096)) == 4096  # type: ignore[arg-type]
    assert f32_bits_to_bf16_bits(np.array(0x3F800000)) == 0x3F80  # type: ignore[arg-type]
    assert gamma_mass(np.array(4.0), np.array(0.5)) == 2.0  # type: ignore[arg-type]
    assert mover_mass(np.array(3)) == 1.0  # type: ignore[arg-type]
    assert is_realized(np.array(0.25)) is True  # type: ignore[arg-type]
    assert is_realized(np.array(0.0)) is False  # type: ignore[arg-type]

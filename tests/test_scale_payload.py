"""scale_payload's destination buffer rules and its silent saturation (upstream multiplies
without a floating-point warning; an overflow gives inf, as libtorch's mul_scalar)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from flodl_proto.reduce.payload import scale_payload


def test_an_out_buffer_of_exactly_the_payload_size_is_accepted() -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    out = np.zeros(8, np.uint8)
    got = scale_payload(0, data, 0.5, out=out)
    assert np.frombuffer(got, np.float32).tolist() == [0.5, -1.0]
    assert np.frombuffer(out, np.float32).tolist() == [0.5, -1.0]


def test_a_short_out_buffer_is_refused_with_the_size_needed() -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    with pytest.raises(ValueError) as ei:
        scale_payload(0, data, 0.5, out=np.zeros(7, np.uint8))
    assert str(ei.value) == "out must be a flat uint8 array of >= 8 bytes"


@pytest.mark.parametrize("dtype", [0, 1])
def test_overflow_saturates_without_a_warning(dtype: int) -> None:
    big = (np.asarray([3e38], np.float32).tobytes() if dtype == 0
           else np.asarray([0x7F7F], np.uint16).tobytes())  # bf16 max, about 3.39e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bytes(scale_payload(dtype, big, 4.0))
    inf = np.asarray([np.inf], np.float32).tobytes() if dtype == 0 else bytes.fromhex("807f")
    assert got == inf

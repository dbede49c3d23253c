"""scale_payload's destination buffer rules and its silent saturation (upstream multiplies
without a floating-point warning; an overflow gives inf, as libtorch's mul_scalar)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from flodl_proto.errors import ProtocolError
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce.payload import bf16_to_f32, decode_payload, scale_payload


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


# -- the payload helpers' and backend selection's exact results ------------------------------------
def test_decode_payload_gives_f32_and_names_a_bad_length() -> None:
    got = decode_payload(0, np.asarray([1.5], np.float32).tobytes())
    assert got.dtype == np.float32 and got.tolist() == [1.5]
    with pytest.raises(ProtocolError) as ei:
        decode_payload(1, b"\x00\x00\x00")
    assert ei.value.error_id == "payload.bad_length"
    assert dict(ei.value.fields) == {"got": 3, "element_size": 2}


def test_bf16_to_f32_takes_plain_integers() -> None:
    got = bf16_to_f32([0x3F80, 0xC000, 0x7F80])
    assert got.dtype == np.float32 and got.tolist() == [1.0, -2.0, float("inf")]


@pytest.mark.parametrize(("cpus", "want"), [(1, 1), (2, 2), (4, 4), (16, 4)])
def test_default_threads_follow_the_affinity_up_to_four(monkeypatch: pytest.MonkeyPatch,
                                                       cpus: int, want: int) -> None:
    monkeypatch.setattr(K.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert K.default_threads() == want


@pytest.mark.parametrize(("count", "want"), [(None, 1), (3, 3), (12, 4)])
def test_default_threads_without_affinity(monkeypatch: pytest.MonkeyPatch, count: int | None,
                                          want: int) -> None:
    monkeypatch.delattr(K.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(K.os, "cpu_count", lambda: count)
    assert K.default_threads() == want


def test_backend_selection_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = K.kernel_backend()
    try:
        monkeypatch.setenv("FLODL_PROTO_KERNELS", "numpy")
        assert K.set_kernel_backend() == "numpy" and K._backend["module"] is None
        monkeypatch.delenv("FLODL_PROTO_KERNELS")
        assert K.set_kernel_backend() in ("numpy", "numba")  # unset: auto
        with pytest.raises(ProtocolError) as ei:
            K.set_kernel_backend("numpy", min_elems=-1)
        assert ei.value.error_id == "kernels.bad_min_elems"
        assert dict(ei.value.fields) == {"value": -1}
    finally:
        K.set_kernel_backend(before)

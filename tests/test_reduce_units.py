"""The reduce package's plumbing written out exactly: how a large tensor is split across threads,
how a range is cut in chunks, which backend a range is handed to, and the few edges the
end-to-end reduce tests do not reach (a tensor elided by every frame before a large one, f64
input to the bf16 encoder, a fatal error raised by a completion).

Bodies and kernels are replaced by recorders here, so nothing large is allocated."""

from __future__ import annotations

import os
import threading
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.errors import LocalProtocolError, ProtocolError, protocol_error
from flodl_proto.reduce import HostFold, reduce_realized_work, sum_frames
from flodl_proto.reduce import _kernels as K
from flodl_proto.reduce.payload import bf16_from_f32, scale_payload

SALT = bytes(range(16))
MI = K.PARALLEL_MIN_ELEMS  # 2**20
CHUNK = K.CHUNK_ELEMS  # 2**16


class _Recorder:
    """A ``_run_split`` body that records each call: its range, thread name, workspace and
    NumPy's floating-point error state."""

    def __init__(self, fail_from: int | None = None) -> None:
        self.calls: list[tuple[int, int, str, bool, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.fail_from = fail_from
        self.ws = K.Workspace(1)

    def __call__(self, start: int, stop: int, ws: K.Workspace) -> None:
        with self.lock:
            self.calls.append((start, stop, threading.current_thread().name, ws is self.ws,
                               {k: str(v) for k, v in np.geterr().items()}))
        if self.fail_from is not None and start >= self.fail_from:
            raise ValueError(f"range {start}..{stop} failed")


@pytest.fixture
def counted_threads(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """``_run_split``'s threads, counted: a split that would start more than 8 fails at once."""
    created: list[threading.Thread] = []

    def thread(*args: Any, **kwargs: Any) -> threading.Thread:
        if len(created) >= 8:
            raise AssertionError("more threads than workers")
        t = threading.Thread(*args, **kwargs)
        created.append(t)
        return t

    monkeypatch.setattr(K, "threading", SimpleNamespace(Thread=thread))
    return created


IGNORE = {"divide": "ignore", "over": "ignore", "under": "ignore", "invalid": "ignore"}


@pytest.mark.parametrize(("numel", "threads", "ranges"), [
    # per worker: ceil(numel / workers), rounded up to a whole chunk
    (2 * MI + 5, 2, [(0, 17 * CHUNK), (17 * CHUNK, 2 * MI + 5)]),
    (2 * MI + 5, 3, [(0, 17 * CHUNK), (17 * CHUNK, 2 * MI + 5)]),  # at most numel // 2**20
    (4 * MI, 4, [(0, MI), (MI, 2 * MI), (2 * MI, 3 * MI), (3 * MI, 4 * MI)]),
    (3 * MI + 1, 4, [(0, 17 * CHUNK), (17 * CHUNK, 34 * CHUNK), (34 * CHUNK, 3 * MI + 1)]),
])
def test_a_large_tensor_is_split_in_chunk_aligned_ranges(
        numel: int, threads: int, ranges: list[tuple[int, int]],
        counted_threads: list[threading.Thread]) -> None:
    body = _Recorder()
    with np.errstate(all="ignore"):
        K._run_split(numel, threads, body, body.ws)
    calls = sorted(body.calls)
    assert [(s, e) for s, e, *_ in calls] == ranges
    me = threading.current_thread().name
    # the first range runs on the calling thread with its workspace, the others on named
    # worker threads with fresh workspaces and NumPy's float warnings off
    assert calls[0][2:4] == (me, True)
    for _, _, name, own_ws, err in calls[1:]:
        assert (name, own_ws, err) == ("flodl-reduce", False, IGNORE)
    assert len(counted_threads) == len(ranges) - 1
    assert not any(t.is_alive() for t in counted_threads)  # every worker joined


@pytest.mark.parametrize(("numel", "threads"), [(2 * MI - 1, 4), (8 * MI, 1), (0, 2)])
def test_a_small_tensor_or_one_thread_runs_on_the_calling_thread(
        numel: int, threads: int, counted_threads: list[threading.Thread]) -> None:
    body = _Recorder()
    K._run_split(numel, threads, body, body.ws)
    me = threading.current_thread().name
    assert [c[:4] for c in body.calls] == [(0, numel, me, True)]
    assert counted_threads == []


def test_a_worker_error_is_raised_once_every_range_has_run(
        counted_threads: list[threading.Thread]) -> None:
    body = _Recorder(fail_from=MI)
    with pytest.raises(ValueError, match=r"^range 1048576\.\.2097152 failed$"):
        K._run_split(2 * MI, 2, body, body.ws)
    assert sorted(c[:2] for c in body.calls) == [(0, MI), (MI, 2 * MI)]
    assert not counted_threads[0].is_alive()


def test_chunks_step_by_one_chunk_from_the_range_start() -> None:
    assert list(K._chunks(3, 3 + 2 * CHUNK + 1)) == [3, 3 + CHUNK, 3 + 2 * CHUNK]
    assert list(K._chunks(5, 5)) == []


class _CompiledCalled(Exception):
    pass


def _fake_compiled(monkeypatch: pytest.MonkeyPatch, min_elems: int) -> None:
    """A compiled backend that only reports being used, for ranges of at least ``min_elems``."""

    def used(*args: Any) -> None:
        raise _CompiledCalled

    fake = SimpleNamespace(bf16_widen_first=used, bf16_accumulate=used, bf16_finish=used,
                           bf16_encode=used, bf16_scale=used)
    monkeypatch.setitem(K._backend, "name", "numba")
    monkeypatch.setitem(K._backend, "module", fake)
    monkeypatch.setitem(K._backend, "min_elems", min_elems)


def test_a_range_takes_the_compiled_kernels_by_its_own_length(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread's range of a bf16 sum is handed to the compiled kernels when the range (not the
    tensor) has at least min_elems elements."""
    _fake_compiled(monkeypatch, min_elems=10)
    views = [np.arange(12, dtype=np.uint16) + np.uint16(0x3F80),
             np.full(12, 0x3F80, np.uint16)]  # 1 + k/128, and 1.0
    out = np.zeros(12, np.uint16)
    with np.errstate(all="ignore"):
        K._sum_bf16(views, 6, 12, out, None, K.Workspace(12))  # 6 elements: NumPy
        with pytest.raises(_CompiledCalled):
            K._sum_bf16(views, 0, 12, out, None, K.Workspace(12))
    # (1 + k/128) + 1 = 2 + k/128 rounds to even at bf16's precision (1/64 above 2)
    assert out[6:].tolist() == [0x4003, 0x4004, 0x4004, 0x4004, 0x4005, 0x4006]
    assert out[:6].tolist() == [0] * 6


def test_the_first_kernel_call_chooses_the_backend_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(K._backend, "name", None)
    monkeypatch.setitem(K._backend, "module", None)
    monkeypatch.setitem(K._backend, "min_elems", K.JIT_MIN_ELEMS)
    monkeypatch.setenv("FLODL_PROTO_KERNELS", "gpu")
    with pytest.raises(LocalProtocolError) as ei:
        K._jit_for(1 << 30)
    assert str(ei.value) == \
        "FLODL_PROTO_KERNELS must be one of auto, numpy, numba, got 'gpu'"
    assert K._backend["name"] is None
    monkeypatch.setenv("FLODL_PROTO_KERNELS", "numpy")
    assert K._jit_for(1 << 30) is None
    assert K._backend["name"] == "numpy"


def test_a_range_too_short_for_the_compiled_kernels_chooses_no_backend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Small ranges never choose the backend (so numba is not imported for them); the first
    range of JIT_MIN_ELEMS elements does."""
    monkeypatch.setitem(K._backend, "name", None)
    monkeypatch.setitem(K._backend, "module", None)
    monkeypatch.setitem(K._backend, "min_elems", K.JIT_MIN_ELEMS)
    monkeypatch.setenv("FLODL_PROTO_KERNELS", "gpu")  # an error only when the choice is made
    assert K._jit_for(K.JIT_MIN_ELEMS - 1) is None
    assert K._backend["name"] is None
    with pytest.raises(LocalProtocolError):
        K._jit_for(K.JIT_MIN_ELEMS)
    assert K._backend["name"] is None


_SMALL_BF16_ROUND = """
import sys
import numpy as np
from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload
from flodl_proto.reduce import bf16_from_f32, reduce_realized_work
t = TensorPayload(1, (2048,), bf16_from_f32(np.full(2048, 1.5, np.float32)).tobytes())
out = reduce_realized_work([RoundFrame(RoundKind.MODEL, 1.0, [t]),
                            RoundFrame(RoundKind.MODEL, 3.0, [t])])
print(out.tensors[0].data[:2].hex(), "numba" in sys.modules)
"""


def test_a_process_that_only_sums_small_bf16_tensors_never_imports_numba() -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FLODL_PROTO_KERNELS"}
    res = subprocess.run([sys.executable, "-c", _SMALL_BF16_ROUND], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    # contributions arrive pre-scaled: (1.5 + 1.5) / (1 + 3) = 0.75 = bf16 0x3f40 (LE 403f)
    assert res.stdout.split() == ["403f", "False"]


@pytest.mark.parametrize("dtype", [0, 1])
def test_a_tensor_elided_by_every_frame_before_a_large_one(dtype: int) -> None:
    """Version 3, the general (chunked) path: a tensor every frame elided stays elided and the
    tensors after it are still summed."""
    n = K.SMALL_ELEMS
    es = 4 if dtype == 0 else 2

    def full(value: float, count: int) -> TensorPayload:
        vals = np.full(count, value, np.float32)
        data = vals.tobytes() if dtype == 0 else bf16_from_f32(vals).tobytes()
        return TensorPayload(dtype, (count,), data)

    elided = TensorPayload(dtype, (3,), b"")
    a = RoundFrame(RoundKind.MODEL, 1.0, [elided, full(1.0, n), full(0.5, 2)])
    b = RoundFrame(RoundKind.MODEL, 3.0, [elided, full(2.0, n), full(0.25, 2)])
    summed = sum_frames([a, b], version=3)
    assert summed == RoundFrame(RoundKind.MODEL, 4.0, [elided, full(3.0, n), full(0.75, 2)])
    assert len(summed.tensors[1].data) == n * es
    reduced = reduce_realized_work([a, b], version=3)
    assert reduced == RoundFrame(RoundKind.MODEL, 4.0, [elided, full(0.75, n), full(0.1875, 2)])


def test_bf16_from_f32_rounds_other_floats_to_f32_first() -> None:
    """1 + 2**-8 + 2**-30 is 1 + 2**-8 in f32, a tie that rounds to even (1.0) in bf16; rounded
    straight from f64 it would be 1 + 2**-7."""
    x = 1 + 2**-8 + 2**-30
    assert bf16_from_f32([x, -x]).tolist() == [0x3F80, 0xBF80]
    many = np.full((2, K.SMALL_ELEMS), x)  # the integer path
    got = bf16_from_f32(many)
    assert got.shape == (2, K.SMALL_ELEMS) and got.dtype == np.uint16
    assert (got == 0x3F80).all()


@pytest.mark.parametrize("out", [np.zeros(8, np.int8), np.zeros((2, 4), np.uint8),
                                 np.zeros(4, np.uint16)], ids=["int8", "2-D", "uint16"])
def test_scale_payload_refuses_an_out_of_another_dtype_or_shape(out: np.ndarray) -> None:
    data = np.asarray([1.0, -2.0], np.float32).tobytes()
    with pytest.raises(ValueError) as ei:
        scale_payload(0, data, 0.5, out=out)
    assert str(ei.value) == "out must be a flat uint8 array of >= 8 bytes"
    assert not out.any()


def test_a_death_completing_a_round_encodes_a_signalling_nan_seed_without_warning() -> None:
    """Version 3: the seed's first tensor is never materialised (the second deposit elides it),
    so the death that completes the round folds it at completion: 0.0 + sNaN is the quiet NaN,
    under the fold's own warning context (warnings are errors here)."""
    snan = np.array([0x7F800001, 0x3F800000], np.uint32).view(np.float32)
    seed = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(snan),
                                             TensorPayload.from_array(np.ones(1, np.float32))])
    later = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload(0, (2,), b""),
                                              TensorPayload.from_array(np.ones(1, np.float32))])
    f = HostFold([0, 1, 2], SALT, version=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f.deposit(0, encode_round_frame_bytes(seed, SALT)) is None
        assert f.deposit(1, encode_round_frame_bytes(later, SALT)) is None
        out = f.declare_dead_frame(2)
    assert isinstance(out, RoundFrame) and out.weight == 3.0
    assert np.frombuffer(out.tensors[0].data, np.uint32).tolist() == [0x7FC00001, 0x3F800000]
    assert np.frombuffer(out.tensors[1].data, np.float32).tolist() == [2.0]


def test_an_error_raised_by_a_completion_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Completion encodes sums already checked, so it raises nothing today; if it did, the error
    would be the fold's fatal error like any other, raised again by every later call."""
    f = HostFold([0, 1], SALT)
    f.deposit(0, encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0, []), SALT))
    err = protocol_error("fold.truncated", rank=1)

    def fail() -> None:
        raise err

    monkeypatch.setattr(f, "_take_if_complete", fail)
    with pytest.raises(ProtocolError) as ei:
        f.declare_dead(1)
    assert ei.value is err and f.error is err
    with pytest.raises(ProtocolError) as ei2:
        f.declare_dead(0)
    assert ei2.value is err


@pytest.mark.parametrize(("n", "cpus", "ranges"), [
    (2 * MI, 2, [(0, MI), (MI, 2 * MI)]),
    (2 * MI + 3, 4, [(0, MI + 1), (MI + 1, 2 * MI + 3)]),  # halves, whatever the CPU count
    (2 * MI - 1, 2, [(0, 2 * MI - 1)]),  # below 2**21 elements: one call
    (10, 2, [(0, 10)]),
    (4 * MI, 1, [(0, 4 * MI)]),  # one CPU: one call
])
def test_the_relay_fold_splits_a_large_tensor_in_halves(
        monkeypatch: pytest.MonkeyPatch, n: int, cpus: int, ranges: list[tuple[int, int]]) -> None:
    """HostFold's split: the lower half on the calling thread with the fold's workspace, the
    upper half on a thread named ``flodl-fold`` with a second workspace kept for later rounds."""
    monkeypatch.setattr(K, "default_threads", lambda: cpus)
    f = HostFold([0], SALT)
    body = _Recorder()
    f._split(n, body)
    calls = sorted(body.calls)
    assert [(s, e) for s, e, *_ in calls] == ranges
    me = threading.current_thread().name
    assert calls[0][2] == me
    if len(calls) == 2:
        assert calls[1][2] == "flodl-fold"
        second = f._ws2
        assert second is not None and second is not f._workspace()
        f._split(n, body)  # the second workspace is reused
        assert f._ws2 is second


def test_the_relay_fold_raises_its_second_thread_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(K, "default_threads", lambda: 2)
    body = _Recorder(fail_from=MI)
    with pytest.raises(ValueError, match=r"^range 1048576\.\.2097152 failed$"):
        HostFold([0], SALT)._split(2 * MI, body)
    assert sorted(c[:2] for c in body.calls) == [(0, MI), (MI, 2 * MI)]


def test_a_tiny_mass_gives_an_infinite_scale_without_warning() -> None:
    """f32(1.0 / 1e-300) overflows to inf: the protocol's arithmetic, not an error (warnings are
    errors here)."""
    frame = RoundFrame(RoundKind.MODEL, 1e-300, [TensorPayload.from_array(
        np.asarray([1.0, 0.0, -2.0], np.float32))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = reduce_realized_work([frame])
    got = np.frombuffer(out.tensors[0].data, np.uint32).tolist()
    assert got[0::2] == [0x7F800000, 0xFF800000]  # inf, -inf
    assert got[1] & 0x7FFFFFFF == 0x7FC00000  # 0 * inf: the default NaN (its sign is the CPU's)
    assert out.weight == 1e-300


def test_a_tiny_mass_of_frames_eliding_a_tensor_gives_an_infinite_scale_without_warning() -> None:
    """As above, for version 3 frames of different schemas (frame 1 elides tensor 1), which
    the reduce judges afresh rather than from a remembered plan."""
    values = TensorPayload.from_array(np.asarray([1.0, 0.0, -2.0], np.float32))
    frames = [RoundFrame(RoundKind.MODEL, 5e-301, [values, values]),
              RoundFrame(RoundKind.MODEL, 5e-301, [values, TensorPayload(0, (3,), b"")])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = reduce_realized_work(frames, version=3)
    for t in out.tensors:
        got = np.frombuffer(t.data, np.uint32).tolist()
        assert got[0::2] == [0x7F800000, 0xFF800000]  # inf, -inf
        assert got[1] & 0x7FFFFFFF == 0x7FC00000  # 0 * inf: the default NaN
    assert out.weight == 1e-300


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_partial_last_chunk_touches_only_its_own_elements(backend: str) -> None:
    """A bf16 sum of CHUNK_ELEMS + 5 elements whose views and output are slices of larger
    arrays: the last (partial) chunk reads and writes its 5 elements only; what follows the
    output slice is left as it was."""
    n = CHUNK + 5
    parents = [np.full(2 * CHUNK, 0x3F80, np.uint16), np.full(2 * CHUNK, 0x4000, np.uint16)]
    out = np.full(2 * CHUNK, 0xABCD, np.uint16)
    before = K.kernel_backend()
    try:
        K.set_kernel_backend(backend)
        with np.errstate(all="ignore"):
            K._sum_bf16([p[:n] for p in parents], 0, n, out[:n], None, K.Workspace())
    finally:
        K.set_kernel_backend(before)
    assert (out[:n] == 0x4040).all()  # 1.0 + 2.0 = 3.0
    assert (out[n:] == 0xABCD).all()

"""The controller's consensus-array pool (:class:`~flodl_proto.reduce.OutputPool`): a large
tensor's array is handed out again only once nothing else holds it (a frame, a view, a
memoryview), a consensus kept by its consumer never changes under a later round, small tensors
are never kept, and the reduce gives the same bytes with the pool as without it."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import FrameType
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import Dtype, RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec.handshake import encode_channel_magic
from flodl_proto.codec.mux import (
    Hello,
    MuxRecord,
    RecordKind,
    encode_frame_record,
    encode_mux_record_bytes,
)
from flodl_proto.fsm.controller_core import ControllerCore
from flodl_proto.fsm.events import CheckpointWindow, SendKind, SendTo
from flodl_proto.reduce import NesterovMomentum, OutputPool, _pool, reduce_realized_work
from flodl_proto.reduce._pool import _UNHELD_REFS, POOLED_MIN_BYTES, _refs_when_unheld

F32 = np.dtype("<f4")
U16 = np.dtype("<u2")
BIG = POOLED_MIN_BYTES // 4
SALT = bytes(range(16))  # f32 elements of a pooled tensor


def test_a_large_array_comes_back_only_once_nothing_holds_it() -> None:
    pool = OutputPool()
    a = pool.take(0, F32, BIG)
    b = pool.take(0, F32, BIG)  # a is still held: a new one, kept in its place
    assert a is not b and not np.shares_memory(a, b) and pool.reused == 0
    del a
    c = pool.take(0, F32, BIG)
    assert c is not b and pool.reused == 0  # the kept one is b, still held
    del b
    view = c.view(np.uint8).data  # what a TensorPayload keeps: a memoryview of a view
    kept_id = id(c)
    del c
    d = pool.take(0, F32, BIG)
    assert id(d) != kept_id and pool.reused == 0  # the memoryview holds c
    del view, d
    e = pool.take(0, F32, BIG)
    assert pool.reused == 1 and e.shape == (BIG,) and e.dtype == F32
    kept_id = id(e)
    del e
    f = pool.take(0, F32, BIG)
    assert pool.reused == 2 and id(f) == kept_id  # counted each time, the same array again


def test_the_unheld_reference_count_is_measured_as_take_sees_it() -> None:
    """The pool's dict, take's local name and getrefcount's argument (3 on CPython 3.11)."""
    assert _refs_when_unheld() == _UNHELD_REFS >= 2


def test_positions_dtypes_and_lengths_are_kept_apart_and_clear_drops_everything() -> None:
    pool = OutputPool()
    a0, a1 = pool.take(0, F32, BIG), pool.take(1, F32, BIG)
    ids = id(a0), id(a1)
    del a0, a1
    b0 = pool.take(0, F32, BIG)
    b1 = pool.take(1, U16, 2 * BIG)  # same bytes, other dtype: a new one
    assert (id(b0), pool.reused) == (ids[0], 1) and id(b1) != ids[1] and b1.dtype == U16
    del b0, b1
    c0 = pool.take(0, F32, BIG + 1)  # another length: a new one
    assert c0.shape == (BIG + 1,) and pool.reused == 1
    del c0
    pool.clear()
    pool.take(0, F32, BIG + 1)
    assert pool.reused == 1


def test_small_arrays_are_never_kept() -> None:
    pool = OutputPool()
    n = POOLED_MIN_BYTES // 4 - 1
    a = pool.take(0, F32, n)
    del a
    b = pool.take(0, F32, n)
    assert b.shape == (n,) and pool.reused == 0
    assert not pool._kept


def test_the_unheld_count_is_measured_untraced_so_a_kept_array_is_never_handed_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace or profile function that reads each frame's locals (what a debugger or a
    profiler may do) adds a reference to every local while it runs. The count of an unheld
    array is measured with both switched off, so it is the untraced one; each is back
    afterwards; and with the count so measured, an array a consumer keeps is not handed out
    again."""
    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_locals  # noqa: B018 - the read that adds the references
        return tracer

    untraced = _pool._refs_when_unheld()
    old_trace, old_profile = sys.gettrace(), sys.getprofile()
    sys.settrace(tracer)
    try:
        traced = _pool._refs_when_unheld()
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(old_trace)
    sys.setprofile(tracer)  # a profile function sees the call of getrefcount itself
    try:
        profiled = _pool._refs_when_unheld()
        assert sys.getprofile() is tracer
    finally:
        sys.setprofile(old_profile)
    assert traced == profiled == untraced
    monkeypatch.setattr(_pool, "_UNHELD_REFS", traced)
    pool = OutputPool()
    kept = pool.take(0, F32, BIG)
    kept[:] = 1.0
    again = pool.take(0, F32, BIG)  # the consumer still holds the first one
    assert again is not kept and pool.reused == 0
    again[:] = 2.0
    assert float(kept.min()) == float(kept.max()) == 1.0


def test_hooks_threading_gives_new_threads_do_not_change_the_unheld_count() -> None:
    """The count is taken on a thread of its own: a trace or profile function that
    ``threading.settrace`` / ``threading.setprofile`` installs in every new thread (reading
    frame locals) is switched off there, so the count is still the untraced one."""
    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_locals  # noqa: B018 - the read that adds the references
        return tracer

    untraced = _pool._refs_when_unheld()
    old_trace, old_profile = threading.gettrace(), threading.getprofile()
    threading.settrace(tracer)
    try:
        traced = _pool._refs_when_unheld()
    finally:
        threading.settrace(old_trace)
    threading.setprofile(tracer)
    try:
        profiled = _pool._refs_when_unheld()
    finally:
        threading.setprofile(old_profile)
    assert traced == profiled == untraced == _UNHELD_REFS


def test_an_error_of_the_measuring_thread_is_raised_in_the_caller(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory() -> int:
        raise MemoryError("probe")

    monkeypatch.setattr(_pool, "_measure_unheld", no_memory)
    with pytest.raises(MemoryError, match=r"^probe$"):
        _pool._refs_when_unheld()


#: imports the pool under cProfile; prints whether the profiler is still the thread's and
#: still counts the calls made after the import
_PROFILED_IMPORT = """
import cProfile, pstats, sys
profiler = cProfile.Profile()
profiler.enable()
import flodl_proto.reduce._pool
still_set = sys.getprofile() is profiler
def called_after_the_import():
    return 1
called_after_the_import()
profiler.disable()
names = {func for (_, _, func) in pstats.Stats(profiler).stats}
print(still_set, "called_after_the_import" in names, sys.getprofile())
"""


def test_a_profiler_set_before_the_import_is_still_set_after_it() -> None:
    """``python -m cProfile`` (or ``cProfile.Profile().enable()``) before the package is
    imported: the import measures its reference count without touching the thread's profile
    function, which goes on profiling (it was replaced by a Python-level call of the
    ``Profile`` object, and the import failed with ``TypeError``)."""
    res = subprocess.run([sys.executable, "-c", _PROFILED_IMPORT], capture_output=True,
                         text=True, timeout=120)
    assert (res.returncode, res.stderr, res.stdout) == (0, "", "True True None\n")


def _frame(values: np.ndarray, weight: float, dtype: Dtype = Dtype.F32) -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, weight,
                      [TensorPayload(dtype, [values.size], values.tobytes()),
                       TensorPayload(dtype, [3], values[:3].tobytes())])


@pytest.mark.parametrize("dtype", [Dtype.F32, Dtype.BF16])
def test_the_reduce_gives_the_same_bytes_and_a_kept_consensus_never_changes(
        dtype: Dtype) -> None:
    rng = np.random.default_rng(7)
    n = BIG if dtype == Dtype.F32 else 2 * BIG
    host = np.float32 if dtype == Dtype.F32 else np.uint16
    rounds = [[rng.standard_normal(n).astype(np.float32) if dtype == Dtype.F32
               else rng.integers(0x3F00, 0x4100, n, dtype=np.uint16) for _ in range(2)]
              for _ in range(3)]
    pool = OutputPool()
    kept = None
    for i, (x, y) in enumerate(rounds):
        frames = [_frame(x.astype(host), 1.0, dtype), _frame(y.astype(host), 3.0, dtype)]
        plain = reduce_realized_work(frames)
        pooled = reduce_realized_work(frames, pool=pool)
        assert [bytes(t.data) for t in pooled.tensors] == [bytes(t.data)
                                                           for t in plain.tensors]
        assert pooled.weight == plain.weight == 4.0
        if i == 0:  # a consumer keeps round 1's consensus: later rounds must not touch it
            kept, kept_bytes = pooled, bytes(pooled.tensors[0].data)
        del pooled
    assert kept is not None and bytes(kept.tensors[0].data) == kept_bytes
    assert pool.reused == 1  # round 3 reused round 2's array; round 1's stayed with its holder


def _core_rounds(pooled: bool, version: int, outer: bool) -> tuple[list[bytes], list[bytes], int]:
    """Twelve rounds through a controller core with two relays and checkpoint windows (Control,
    parameters, buffers), large tensors whose layout changes between rounds (dtype, length,
    tensor count) every second window; at v3 one relay elides a tensor now and then; with the
    outer optimizer the parameters keep one layout. A consumer keeps the first checkpoint
    window; the others are dropped once their bytes are read. Returns every Broadcast's bytes,
    the checkpoint windows' tensor bytes (the first one's read after the last round), and the
    arrays the pool handed out again."""
    core = ControllerCore(2, SALT, version=version, checkpoint=True,
                          outer=NesterovMomentum(0.7, 0.9) if outer else None)
    if not pooled:
        core._pool = None  # type: ignore[assignment]
    core.start()
    for conn, rank in ((0, 0), (1, 1)):
        core.connection_opened(conn, 0.0)
        core.receive_data(conn, encode_channel_magic("data") + encode_mux_record_bytes(
            MuxRecord.control_msg(Hello("h", [rank]), version), SALT))
    layouts = [[(Dtype.F32, BIG), (Dtype.F32, 3)], [(Dtype.BF16, 2 * BIG), (Dtype.F32, 3)],
               [(Dtype.F32, 2 * BIG)], [(Dtype.F32, BIG), (Dtype.F32, BIG)]]
    rng = np.random.default_rng(11)
    sent: list[bytes] = []
    first_window: list[CheckpointWindow] = []
    kept: list[bytes] = []

    def read(windows: list[CheckpointWindow]) -> list[bytes]:
        return [bytes(t.data) for w in windows
                for f in (w.params, w.buffers) if f is not None for t in f.tensors]

    for rnd in range(12):
        kind = (RoundKind.CONTROL, RoundKind.MODEL, RoundKind.MODEL)[rnd % 3]
        layout = ([(Dtype.F32, BIG)] if kind is RoundKind.CONTROL
                  else layouts[0] if outer and rnd % 3 == 1 else layouts[rnd // 6 % 4])
        acts = []
        for conn in (0, 1):
            tensors = []
            for j, (dtype, n) in enumerate(layout):
                if version >= 3 and conn == 0 and j == 0 and rnd % 4 == 1:
                    data = b""  # elided
                elif dtype == Dtype.F32:
                    data = rng.standard_normal(n).astype("<f4").tobytes()
                else:
                    data = rng.integers(0x3F00, 0x4100, n, dtype=np.uint16).tobytes()
                tensors.append(TensorPayload(dtype, [n], data))
            frame = RoundFrame(kind, 0.0 if kind is RoundKind.CONTROL else 1.0 + conn, tensors)
            acts += core.receive_data(conn, b"".join(bytes(memoryview(p)) for p in
                                                     encode_frame_record(RecordKind.HOST_FRAME,
                                                                         frame, SALT)))
        [first, second] = [a for a in acts
                           if isinstance(a, SendTo) and a.kind is SendKind.BROADCAST]
        sent.append(b"".join(bytes(memoryview(b)) for b in first.buffers))
        windows = [a for a in acts if isinstance(a, CheckpointWindow)]
        if windows and not first_window:
            first_window = windows[:1]
            windows = windows[1:]
        kept += read(windows)
        assert second.buffers == first.buffers
        del acts, first, second, windows
    kept += read([a for a in core.stop() if isinstance(a, CheckpointWindow)])
    return sent, read(first_window) + kept, core._pool.reused if pooled else 0


@pytest.mark.parametrize("outer", [False, True], ids=["no outer", "nesterov"])
@pytest.mark.parametrize("version", [2, 3])
def test_a_controller_core_scatters_and_checkpoints_the_same_bytes_with_the_pool(
        version: int, outer: bool) -> None:
    """The pool reuses arrays once the checkpoint windows no longer hold them, yet every
    Broadcast and every checkpointed consensus (the kept first window read after the last
    round) is byte for byte the pool-less core's."""
    sent, kept, reused = _core_rounds(True, version, outer)
    assert (sent, kept) == _core_rounds(False, version, outer)[:2]
    assert len(sent) == 12 and len(kept) > 4 and reused > 0

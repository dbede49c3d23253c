"""Benchmark: the controller's realized-work reduce of W frames, f32 and bf16.

For each wire dtype, in a fresh subprocess (so peak-memory figures do not mix):

* builds W frames of one tensor each, ``--mib`` MiB of payload per frame (standard-normal values,
  rounded to bf16 for the bf16 wire), the payload a view at the odd offset a decoded RoundFrame
  gives it (31 bytes into the frame buffer);
* times ``reduce_realized_work`` (best of ``--repeat``) and reports the input consumed per second;
* times NumPy ``a += b`` over the same bytes in the same run (``a`` an f32 accumulator, ``b`` each
  frame's payload bytes viewed as f32, W times) — the physical-limit peer, against which the
  targets are judged — and prints the ratio; for information also against the same add over the
  same buffers viewed from an aligned offset (NumPy is faster on aligned data; wire payloads are
  not aligned), and (bf16) NumPy's own ``bfloat16`` ``a += b`` over the payloads (``ml_dtypes``;
  one bf16 rounding per add, so not the protocol's sum);
* reports peak RSS growth: from before the frames were built (so the W inputs count), against the
  bound (W + 2) x frame + 64 MiB, and the growth of the reduce alone. The kernels are loaded (and
  the compiled ones compiled) on a small frame before that baseline: a fixed per-process cost,
  not memory of the reduce.

Targets: f32 >= 0.8x the peer, bf16 >= 0.5x, peak growth within the bound, judged with the
kernel backend the installed package uses by default (the compiled kernels of the ``fast``
extra when ``numba`` is installed); the NumPy kernels' bf16 row is then printed too, for
information. ``FLODL_PROTO_KERNELS=numpy`` judges the NumPy kernels instead.

The last line is the verdict; the exit code is 0 when every judged target is met, 1 when one is
missed (``--no-verdict``: always 0, for exploration).

Usage: ``python bench/reduce.py [--frames 4] [--mib 256] [--repeat 3] [--threads N]
[--no-verdict]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from _cli import MIB_WHY, Parser, loading, mib_max, one_of, option_message, run, whole

with loading("bench/reduce.py", __name__ == "__main__"):  # Ctrl-C: one line, not a traceback
    import numpy as np

MiB = 1 << 20
PAYLOAD_OFFSET = 31  # header 17 + dtype/ndim 2 + one dim 4 + nbytes 8


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _run_one(dtype_name: str, frames: int, mib: int, repeat: int,
             threads: int) -> dict[str, Any]:
    from flodl_proto.codec.round_frame import RoundFrame, RoundKind, TensorPayload
    from flodl_proto.reduce import bf16_from_f32, reduce_realized_work
    from flodl_proto.reduce._kernels import JIT_MIN_ELEMS, kernel_backend

    dtype = {"f32": 0, "bf16": 1}[dtype_name]
    nbytes = mib * MiB
    elem = 4 if dtype == 0 else 2
    numel = nbytes // elem
    rng = np.random.default_rng(1)
    # load (and compile) the kernels before the baseline: a fixed per-process cost (about
    # 100 MiB of compiler state for the compiled kernels), not memory of the round
    warm = [bytearray(JIT_MIN_ELEMS * elem + 64) for _ in range(2)]
    warm_frames: list[RoundFrame | None] = [
        RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(
            dtype, [JIT_MIN_ELEMS],
            memoryview(b)[PAYLOAD_OFFSET:PAYLOAD_OFFSET + JIT_MIN_ELEMS * elem])])
        for b in warm]
    bf16_from_f32(np.zeros(JIT_MIN_ELEMS, np.float32))
    reduce_realized_work(warm_frames, version=3, threads=threads)
    del warm, warm_frames
    _reset_peak()
    rss_base = _status_kib("VmRSS")

    bufs: list[bytearray] = []
    frame_list: list[RoundFrame | None] = []
    for i in range(frames):
        buf = bytearray(nbytes + 64)
        view = memoryview(buf)[PAYLOAD_OFFSET:PAYLOAD_OFFSET + nbytes]
        if dtype == 0:
            arr = np.frombuffer(view, "<f4")
            step = 1 << 22
            for s in range(0, numel, step):
                arr[s:s + step] = rng.standard_normal(min(step, numel - s), dtype=np.float32)
        else:
            arr16 = np.frombuffer(view, "<u2")
            step = 1 << 22
            for s in range(0, numel, step):
                n = min(step, numel - s)
                # model-like values: standard normal, rounded to bf16
                arr16[s:s + n] = bf16_from_f32(rng.standard_normal(n, dtype=np.float32))
        bufs.append(buf)
        frame_list.append(RoundFrame(RoundKind.MODEL, float(i + 1),
                                     [TensorPayload(dtype, [numel], view)]))

    rss_inputs = _status_kib("VmRSS")
    reduce_times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = reduce_realized_work(frame_list, version=3, threads=threads)
        reduce_times.append(time.perf_counter() - t0)
        assert out.tensors[0].nbytes == nbytes
        del out
    peak_reduce = _status_kib("VmHWM")

    acc = np.zeros(nbytes // 4, np.float32)
    views = [np.frombuffer(memoryview(b)[PAYLOAD_OFFSET:PAYLOAD_OFFSET + nbytes], "<f4")
             for b in bufs]
    base_times = []
    with np.errstate(all="ignore"):
        for _ in range(repeat):
            t0 = time.perf_counter()
            for v in views:
                acc += v
            base_times.append(time.perf_counter() - t0)
    aligned = [np.frombuffer(memoryview(b)[32:32 + nbytes], "<f4") for b in bufs]
    aligned_times = []
    with np.errstate(all="ignore"):
        for _ in range(repeat):
            t0 = time.perf_counter()
            for v in aligned:
                acc += v
            aligned_times.append(time.perf_counter() - t0)

    native_times = []
    if dtype == 1:  # numpy's own bf16 add (ml_dtypes) over the same payloads
        import ml_dtypes

        del acc
        acc16 = np.zeros(numel, ml_dtypes.bfloat16)
        views16 = [np.frombuffer(memoryview(b)[PAYLOAD_OFFSET:PAYLOAD_OFFSET + nbytes],
                                 ml_dtypes.bfloat16) for b in bufs]
        with np.errstate(all="ignore"):
            for _ in range(repeat):
                t0 = time.perf_counter()
                for v16 in views16:
                    acc16 += v16
                native_times.append(time.perf_counter() - t0)
    consumed = frames * nbytes
    t_red, t_base, t_al = min(reduce_times), min(base_times), min(aligned_times)
    t_nat = min(native_times) if native_times else t_base
    return {
        "dtype": dtype_name, "frames": frames, "mib": mib,
        # f32 sums are NumPy with either backend
        "kernels": kernel_backend() if dtype == 1 else "numpy",
        "reduce_s": t_red, "reduce_gbs": consumed / t_red / 1e9,
        "numpy_gbs": consumed / t_base / 1e9, "numpy_aligned_gbs": consumed / t_al / 1e9,
        "ratio": t_base / t_red, "ratio_aligned": t_al / t_red,
        "native_gbs": consumed / t_nat / 1e9, "ratio_native": t_nat / t_red,
        "peak_growth_mib": (peak_reduce - rss_base) / 1024,
        "reduce_growth_mib": (peak_reduce - rss_inputs) / 1024,
        "bound_mib": (frames + 2) * mib + 64,
    }


def main() -> int:
    ap = Parser(
        prog="bench/reduce.py", description=__doc__.splitlines()[0],
        epilog="Targets: reduce >= 0.8x numpy's a += b over the same bytes for f32, >= 0.5x for "
        "bf16, peak RSS growth <= (frames + 2) x frame + 64 MiB; exit 1 when one is missed "
        "(see the module docstring).")
    ap.add_argument("--frames", type=whole(1), default=4,
                    help="W, the frames reduced together (default 4)")
    ap.add_argument("--mib", type=whole(1, mib_max(), MIB_WHY), default=256,
                    help="payload MiB per frame (default 256); (frames + 2) x MiB is at most "
                    "this machine's physical memory")
    ap.add_argument("--repeat", type=whole(1), default=3,
                    help="timed runs of each reduce; the best counts (default 3)")
    ap.add_argument("--threads", type=whole(1), default=1,
                    help="worker threads of the reduce (default 1)")
    ap.add_argument("--no-verdict", action="store_true",
                    help="exit 0 even when a target is missed (exploration)")
    ap.add_argument("--one", type=one_of(("f32", "bf16")), help=argparse.SUPPRESS)
    args = ap.parse_args()
    memory = mib_max()
    if memory is not None and (args.frames + 2) * args.mib > memory:
        ap.error(option_message("--frames", f"{args.frames} with --mib {args.mib}: the reduce "
                                f"holds (frames + 2) x {args.mib} MiB, more than this machine's "
                                f"physical memory ({memory} MiB)"))
    if args.one:
        print(json.dumps(_run_one(args.one, args.frames, args.mib, args.repeat, args.threads)))
        return 0

    targets = {"f32": 0.8, "bf16": 0.5}
    from flodl_proto.reduce._kernels import kernel_backend

    default = kernel_backend()
    # (dtype, kernel backend, judged): the installed default is judged; with the compiled
    # backend available, the NumPy kernels' bf16 figure is printed too, for information
    runs = [("f32", default, True), ("bf16", default, True)]
    if default != "numpy":
        runs.append(("bf16", "numpy", False))
    rows = []
    for name, backend, judged in runs:
        cmd = [sys.executable, __file__, "--one", name, "--frames", str(args.frames),
               "--mib", str(args.mib), "--repeat", str(args.repeat)]
        cmd += ["--threads", str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONHASHSEED": "0",
                                  "FLODL_PROTO_KERNELS": backend})
        if res.returncode != 0:  # the child's own error, then one line naming the run
            sys.stderr.write(res.stderr[-4000:])
            print(f"bench/reduce.py: the {name} run ({backend} kernels) failed with exit "
                  f"{res.returncode}", file=sys.stderr)
            return 1
        row = json.loads(res.stdout.strip().splitlines()[-1])
        row["judged"] = judged
        rows.append(row)

    threads = args.threads
    print(f"reduce_realized_work: W = {args.frames} frames x {args.mib} MiB, best of "
          f"{args.repeat}, {threads} thread(s); numpy {np.__version__}; peer = numpy `a += b` "
          f"over the same bytes (f32 view of each frame's payload), same run")
    print()
    print("| wire dtype | kernels | reduce GB/s (input) | numpy a+=b GB/s | ratio | target | "
          "aligned a+=b GB/s | ratio vs aligned | a+=b in payload dtype GB/s | ratio vs it | "
          "peak RSS growth MiB | bound MiB | reduce-only growth MiB | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok_all = True
    for r in rows:
        ok = r["ratio"] >= targets[r["dtype"]] and r["peak_growth_mib"] <= r["bound_mib"]
        if r["judged"]:
            ok_all &= ok
        verdict = ("yes" if ok else "NO") if r["judged"] else "(info)"
        print(f"| {r['dtype']} | {r['kernels']} | {r['reduce_gbs']:.2f} | {r['numpy_gbs']:.2f} | "
              f"{r['ratio']:.2f}x | >= {targets[r['dtype']]}x | {r['numpy_aligned_gbs']:.2f} | "
              f"{r['ratio_aligned']:.2f}x | {r['native_gbs']:.2f} | {r['ratio_native']:.2f}x | "
              f"{r['peak_growth_mib']:.0f} | {r['bound_mib']} | "
              f"{r['reduce_growth_mib']:.0f} | {verdict} |")
    print()
    print("targets met" if ok_all else "targets NOT met")
    return 0 if ok_all or args.no_verdict else 1


if __name__ == "__main__":
    run(main, "bench/reduce.py")

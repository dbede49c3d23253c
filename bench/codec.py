"""Codec benchmark: encode+sign and decode+verify of a 256 MiB RoundFrame (8 f32 tensors) and of
a HostFrame mux record wrapping it (two MACs: record and inner frame).

Prints GB/s, the ratio to plain ``hmac`` over every byte the message's MACs cover (measured in
the same run, same process), and the peak RSS growth of each decode beyond its input buffer.
Targets: every ratio >= 0.9; decode peak growth <= 64 MiB (zero copy). The last line is the
verdict; the exit code is 0 when every target is met, 1 when one is missed (``--no-verdict``:
always 0, for exploration).

    python bench/codec.py [--mib 256] [--tensors 8] [--repeat 5] [--no-verdict]
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence

from _cli import MIB_WHY, Parser, loading, mib_max, option_message, run, whole

with loading("bench/codec.py", __name__ == "__main__"):  # Ctrl-C: one line, not a traceback
    import numpy as np

    from flodl_proto.codec import (
        RecordKind,
        RoundFrame,
        RoundKind,
        TensorPayload,
        decode_mux_record_or_eos,
        decode_round_frame_or_eos,
        encode_frame_record,
        encode_round_frame,
    )

MiB = 1 << 20


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_growth(fn: Callable[[], object]) -> int:
    """Bytes by which the process's peak RSS exceeds its RSS before ``fn`` ran."""
    _reset_peak()
    before = _status("VmRSS")
    keep = fn()
    peak = _status("VmHWM")
    del keep
    return max(0, peak - before)


def best(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls, seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def plain_hmac(salt: bytes, pieces: Sequence[memoryview | bytes], passes: int) -> None:
    """HMAC-SHA256 over ``pieces``, ``passes`` times (the physical cost of the MACs)."""
    for _ in range(passes):
        m = hmac.new(salt, digestmod="sha256")
        for p in pieces:
            m.update(p)
        m.digest()


def main() -> int:
    """Run the benchmark, print the table and the verdict; the exit code (see the docstring)."""
    ap = Parser(prog="bench/codec.py", description=__doc__)
    ap.add_argument("--mib", type=whole(1, mib_max(), MIB_WHY), default=256,
                    help="payload MiB (default 256), at most this machine's physical memory")
    ap.add_argument("--tensors", type=whole(1), default=8, help="f32 tensors (default 8)")
    ap.add_argument("--repeat", type=whole(1), default=5,
                    help="timed runs of each operation; the best counts (default 5)")
    ap.add_argument("--no-verdict", action="store_true",
                    help="exit 0 even when a target is missed (exploration)")
    args = ap.parse_args()
    if args.tensors > args.mib * MiB // 4:
        ap.error(option_message("--tensors", f"{args.tensors}: more tensors than the "
                                f"{args.mib * MiB // 4} f32 elements of --mib {args.mib}"))
    salt = bytes(range(16))
    per = args.mib * MiB // args.tensors // 4
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(per, dtype=np.float32) for _ in range(args.tensors)]
    frame = RoundFrame(RoundKind.MODEL, 3.0, [TensorPayload.from_array(a) for a in arrays])
    payload_views = [t.data for t in frame.tensors]
    nbytes = frame.wire_len

    frame_wire = b"".join(encode_round_frame(frame, salt))
    record_wire = b"".join(encode_frame_record(RecordKind.HOST_FRAME, frame, salt))

    rows = []

    def row(name: str, ours: Callable[[], object], passes: int, growth: int | None) -> None:
        # interleave ours and the reference so machine noise hits both alike
        t_ours, t_ref = float("inf"), float("inf")
        for _ in range(args.repeat):
            t_ours = min(t_ours, best(ours, 1))
            t_ref = min(t_ref, best(lambda: plain_hmac(salt, payload_views, passes), 1))
        rows.append((name, nbytes / t_ours / 1e9, t_ref / t_ours, growth))

    row("RoundFrame encode+sign", lambda: encode_round_frame(frame, salt), 1, None)
    row("RoundFrame decode+verify", lambda: decode_round_frame_or_eos(frame_wire, salt), 1,
        peak_growth(lambda: decode_round_frame_or_eos(frame_wire, salt)))

    def host_decode() -> object:
        res = decode_mux_record_or_eos(record_wire, salt)
        assert not isinstance(res, type(None))
        rec = res[0]  # type: ignore[index]
        return rec.frame(salt)

    row("HostFrame encode+sign (2 MACs)",
        lambda: encode_frame_record(RecordKind.HOST_FRAME, frame, salt), 2, None)
    row("HostFrame decode+verify (2 MACs)", host_decode, 2, peak_growth(host_decode))

    print(f"payload {args.mib} MiB in {args.tensors} f32 tensors; frame {nbytes} bytes; "
          f"best of {args.repeat}")
    print()
    print("| operation | GB/s | ratio to plain hmac | decode peak RSS growth |")
    print("| --- | ---: | ---: | ---: |")
    ok = True
    for name, gbs, ratio, growth in rows:
        g = "-" if growth is None else f"{growth / MiB:.1f} MiB"
        print(f"| {name} | {gbs:.2f} | {ratio:.3f} | {g} |")
        ok &= ratio >= 0.9 and (growth is None or growth <= 64 * MiB)
    print()
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok or args.no_verdict else 1


if __name__ == "__main__":
    run(main, "bench/codec.py")

"""``bench/hops.py``: the bare chain's record lengths are the cluster's, and the bare chain runs
a round in the cluster's shape (one host, two hosts) and reports its rounds and CPU; the lean
chain's records are the codec's, and it runs rounds in the same shapes."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import RecordKind, RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec.loopback import decode_framed_round, encode_framed_round
from flodl_proto.codec.mux import read_mux_record_or_eos
from flodl_proto.spec import MUX_HEADER_LEN

ROOT = Path(__file__).resolve().parent.parent


def _hops() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_hops", ROOT / "bench" / "hops.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("nbytes", "dtype"), [(4096, "f32"), (4096, "bf16"), (65536, "f32")])
def test_record_lengths_are_those_of_the_cluster_frames(nbytes: int, dtype: str) -> None:
    hops = _hops()
    np_dtype = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    per = nbytes // 4 // np.dtype(np_dtype).itemsize
    frame = RoundFrame(RoundKind.MODEL, 1.0,
                       [TensorPayload.from_array(np.ones(per, dtype=np_dtype)) for _ in range(4)])
    blob = b"".join(bytes(b) for b in encode_framed_round(frame, bytes(16)))
    lengths = hops.record_lengths(nbytes, dtype)
    assert lengths == {"rank": len(blob), "host": MUX_HEADER_LEN + len(blob) - 4,
                       "broadcast": MUX_HEADER_LEN + len(blob) - 4}


@pytest.mark.parametrize("hosts", [[[0, 1]], [[0, 1], [2, 3]]], ids=["one host", "two hosts"])
def test_bare_chain_runs_rounds_in_the_cluster_shape(hosts: list[list[int]]) -> None:
    hops = _hops()
    times, cpu = hops.bare_chain(hosts, hops.record_lengths(4096, "f32"), 3, 40)
    assert len(times) == 40
    assert all(0.0 < t < 5.0 for t in times)
    assert sorted(cpu) == ["controller", "rank", "relay"]
    assert all(0.0 <= v < 1.0 for v in cpu.values())


def test_a_bare_chain_rank_whose_relay_closes_ends_in_one_line() -> None:
    """A bare-chain process whose peer goes away ends with one stderr line and exit 1 (the bench
    then names it), not a traceback or a wait."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "hops.py"), "--role", "rank",
                              str(port), "100", "0", "5"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        conn, _ = srv.accept()
        conn.recv(100)
        conn.close()
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert out == ""
    assert err == "bench/hops.py: bare-chain rank: the relay closed the connection\n"


def test_a_stop_while_the_bare_chain_starts_kills_every_process_it_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the second relay starts (its port line awaited): the first relay and its ranks,
    already running, are killed with the controller, not left to end on their own."""
    hops = _hops()
    started: list[subprocess.Popen[str]] = []
    spawn, line = hops._spawn, hops._line

    def spy(*args: object) -> subprocess.Popen[str]:
        started.append(spawn(*args))
        return started[-1]

    def stop_at_second_relay(p: subprocess.Popen[str]) -> str:
        if hops._role_of(p).startswith("relay") and p is not started[1]:
            raise KeyboardInterrupt
        return str(line(p))

    monkeypatch.setattr(hops, "_spawn", spy)
    monkeypatch.setattr(hops, "_line", stop_at_second_relay)
    with pytest.raises(KeyboardInterrupt):
        hops.bare_chain([[0, 1], [2]], hops.record_lengths(4096, "f32"), 2, 5)
    assert [hops._role_of(p).split(" ")[0] for p in started] == [
        "controller", "relay", "rank", "rank", "relay"]
    assert [p.wait(10) for p in started] == [-9] * 5


@pytest.mark.parametrize("role", [["relay", "1", "100", "100", "100"], ["rank", "100", "0", "5"]],
                         ids=["relay", "rank"])
def test_a_bare_chain_process_that_cannot_connect_ends_in_one_line(role: list[str]) -> None:
    """A relay that cannot reach its controller, a rank that cannot reach its relay (nothing
    listens on the port): one stderr line and exit 1, not a traceback."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
        port = str(closed.getsockname()[1])
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "hops.py"), "--role", role[0],
                            port, *role[1:]], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr == f"bench/hops.py: bare-chain {role[0]}: Connection refused\n"


def test_sigterm_ends_a_bare_chain_process_without_a_line() -> None:
    """SIGTERM sent to the process group reaches the bench's processes too: each ends without a
    line of its own (the bench writes the run's one ``terminated`` line)."""
    p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "hops.py"), "--role", "controller",
                          "1", "100", "100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip().isdigit()  # its port: it waits for its relay
    p.terminate()
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err) == (-15, "", "")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind", [None, "HOST_FRAME", "BROADCAST"])
def test_a_lean_chain_record_is_signed_and_read_as_the_codec_does(kind: str | None,
                                                                  dtype: str) -> None:
    """The lean chain's work is the protocol's: a record whose tensors it wrote and whose tags
    it signed is one the codec decodes, with those values; the codec's record checks as good
    there, and a changed byte does not."""
    hops = _hops()
    rec_kind = None if kind is None else getattr(RecordKind, kind)
    image = hops._Image(4096, dtype, rec_kind)
    assert len(image.buf) == hops.record_lengths(4096, dtype)["host" if kind else "rank"]
    values = [np.arange(t.size, dtype=np.float32) * (k + 1) / 8 for k, t in
              enumerate(image.tensors)]
    for v, t in zip(values, image.tensors, strict=True):
        np.copyto(t, v, casting="unsafe")
    image.weight = 2.5
    if rec_kind is None:
        image.sign_frame()
        frame, used = decode_framed_round(bytes(image.buf), hops.SALT)
        assert used == len(image.buf)
        assert image.frame_ok()
    else:
        image.sign_record()
        record, _, _ = read_mux_record_or_eos(bytes(image.buf), hops.SALT)
        assert record.kind is rec_kind
        frame = record.frame(hops.SALT)
        assert image.record_ok(rec_kind, True)
        assert not image.record_ok(RecordKind.BROADCAST if kind == "HOST_FRAME"
                                   else RecordKind.HOST_FRAME, True)
    wire = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    assert [t.array().astype(np.float32).tolist() for t in frame.tensors] == [
        v.astype(wire).astype(np.float32).tolist() for v in values]
    assert frame.weight == 2.5 == image.weight

    def ok() -> bool:
        return image.frame_ok() if rec_kind is None else image.record_ok(rec_kind, True)

    at = image.tensors[1].ctypes.data - np.frombuffer(image.buf, np.uint8).ctypes.data
    for where in (-1, at - 1, at - 9, image.lead + 2, 0):  # the tag, the second tensor's byte
        # count and shape, the frame's tensor count, the prefix or header
        image.buf[where] ^= 1
        assert not ok(), where
        image.buf[where] ^= 1
        assert ok(), where
    image.weight = -1.0  # a weight the protocol refuses (tag and all else good)
    if rec_kind is None:
        image.sign_frame()
    else:
        image.sign_record()
    assert not ok()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("hosts", [[[0, 1]], [[0, 1], [2, 3]], [[0], [1, 2]],
                                   [[0, 1, 2, 3], [4, 5, 6, 7]]],
                         ids=["one host", "two hosts", "a host of one rank", "8 ranks"])
def test_lean_chain_runs_rounds_in_the_cluster_shape(hosts: list[list[int]], dtype: str) -> None:
    hops = _hops()
    times, cpu = hops.bare_chain(hosts, hops.record_lengths(4096, dtype), 3, 40,
                                 lean=(4096, dtype))
    assert len(times) == 40
    assert all(0.0 < t < 5.0 for t in times)
    assert sorted(cpu) == ["controller", "rank", "relay"]
    assert all(0.0 <= v < 1.0 for v in cpu.values())


def test_a_lean_chain_controller_given_a_bad_tag_ends_in_one_line() -> None:
    """A HostFrame whose tag does not check ends the lean chain's controller: one stderr line
    naming the chain and the role, exit 1."""
    hops = _hops()
    image = hops._Image(4096, "f32", RecordKind.HOST_FRAME)
    image.buf[-1] ^= 1
    p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "hops.py"), "--role",
                          "lean-controller", "1", "4096", "f32"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    port = int(p.stdout.readline())
    with socket.create_connection(("127.0.0.1", port)) as relay:
        relay.sendall(image.buf)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert out == ""
    assert err == "bench/hops.py: lean-chain controller: a record failed its check\n"


@pytest.mark.parametrize(("role", "error"), [
    (["nonsense"], "expected one of controller, relay, rank, lean-controller, lean-relay, "
                   "lean-rank, got 'nonsense'"),
    (["{"], "expected one of controller, relay, rank, lean-controller, lean-relay, lean-rank, "
            "got '{'"),
    (["controller", "1"], "controller takes 3 values (RELAYS HOST BROADCAST), got 1"),
    (["controller", "x", "1", "1"], "controller RELAYS: expected a whole number, got 'x'"),
    (["rank", "1", "-5", "0", "5"], "rank SIZE: expected a whole number, got '-5'"),
    (["lean-rank", "1", "100", "f16", "0", "5"],
     "lean-rank DTYPE: expected f32 or bf16, got 'f16'"),
    (["lean-controller", "0", "4096", "f32"],
     "lean-controller RELAYS: expected a whole number >= 1, got '0'"),
    (["relay", "1", "0", "100", "100", "100"],
     "relay RANKS: expected a whole number >= 1, got '0'"),
], ids=["unknown", "brace", "too-few", "not-a-number", "negative", "dtype", "no relay", "no rank"])
def test_a_malformed_role_is_one_usage_line(role: list[str], error: str) -> None:
    """``--role nonsense`` ended in a KeyError traceback, ``--role controller 1`` in a
    TypeError's, ``--role rank 1 -5 0 5`` deep in a socket call."""
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "hops.py"), "--role", *role],
                       capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"bench/hops.py: error: argument --role: {error}\n"


#: run in a fresh interpreter: ``bench/hops.py --role controller 1 100 100`` as ``python
#: bench/hops.py`` runs it, after an import hook that sends this process SIGINT when NumPy is
#: first imported (a Ctrl-C to the bench's process group while the bare chain starts)
_SIGINT_AT_IMPORT = """
import importlib.abc, runpy, signal, sys

class Signal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            signal.raise_signal(signal.SIGINT)
        return None

sys.argv = ["bench/hops.py", "--role", "controller", "1", "100", "100"]
sys.path.insert(0, "bench")
sys.meta_path.insert(0, Signal())
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_bare_chain_process_ignores_ctrl_c_while_it_imports_numpy() -> None:
    """A Ctrl-C reaching a bare-chain process before it set SIGINT to ignored (while NumPy
    loads) was a KeyboardInterrupt traceback: it is ignored from the start, as after."""
    p = subprocess.Popen([sys.executable, "-c", _SIGINT_AT_IMPORT], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip().isdigit()  # its port: it waits for its relay
        p.terminate()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert (p.returncode, out, err) == (-15, "", "")


@pytest.mark.parametrize(("role", "killed", "ending"), [
    (["lean-relay", "{port}", "2", "4096", "f32"], False,
     "a lean-chain process ended early (it exited with status 1, its line above): lean-relay "
     "{port} 2 4096 f32"),
    (["relay", "{port}", "1", "100", "100", "100"], False,
     "a bare-chain process ended early (it exited with status 1, its line above): relay "
     "{port} 1 100 100 100"),
    (["lean-controller", "1", "4096", "f32"], True,
     "a lean-chain process ended early (it was killed by SIGTERM): lean-controller 1 4096 "
     "f32"),
], ids=["lean-exit", "bare-exit", "lean-sigterm"])
def test_a_process_that_ends_early_is_named_with_its_chain_and_end(
        role: list[str], killed: bool, ending: str) -> None:
    """A lean-chain process that ended before its line was told "a bare-chain process ended
    early (its line above)", and so was one killed by a signal, which writes no line: the
    bench names its chain and how it ended."""
    hops = _hops()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
        port = str(closed.getsockname()[1])
        p = hops._spawn(*(a.format(port=port) for a in role))
        try:
            if killed:
                assert hops._line(p).strip().isdigit()  # its port: it waits for its relay
                p.terminate()
            with pytest.raises(hops.BenchFailed) as e:
                hops._line(p)
        finally:
            p.kill()
            p.communicate()
    assert str(e.value) == ending.format(port=port)


def test_a_chain_process_does_without_the_cluster_bench_and_ml_dtypes() -> None:
    """A chain process (``--role``; a chain has up to a dozen) imported ``bench/round.py``,
    and with it ml_dtypes and the runner, which it never uses: over a second of CPU each before
    its first line. It imports NumPy and the codec only; the bench itself still has
    ``round``."""
    code = ("import runpy, sys\n"
            "sys.argv = ['bench/hops.py', '--role', 'lean-controller', 'x']\n"
            "try:\n"
            "    runpy.run_path('bench/hops.py', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    print(e.code, 'round' in sys.modules, 'ml_dtypes' in sys.modules,\n"
            "          'numpy' in sys.modules, 'flodl_proto.codec' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.stdout == "2 False False True True\n", res.stderr
    assert res.stderr.startswith("bench/hops.py: error: "), res.stderr
    assert _hops().cluster.TENSORS == 4

"""The conformance kit can fail: deliberately broken targets, each a small wrapper around this
package's controller or relay that breaks one rule, make exactly their expected cases fail.

Each broken target runs in the kit's process (the kit itself never decodes a controller's bytes,
and only the relay's Hello, which the broken relays do not touch), against the role's whole
catalogue at one version; the set of failing cases must equal the expected set.
"""

from __future__ import annotations

import math
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import mux as mux_codec
from flodl_proto.codec import round_frame as frame_codec
from flodl_proto.codec.handshake import decode_handshake, encode_handshake
from flodl_proto.codec.mux import (
    DeclareDead,
    Hello,
    RecordKind,
    encode_control,
    max_control_payload,
)
from flodl_proto.codec.round_frame import (
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    encode_round_frame_bytes,
    round_frame_wire_len,
)
from flodl_proto.codec.stream import RecordReceived, StreamFailed
from flodl_proto.conform import KitSettings, load_catalogue, run_cases, select_cases
from flodl_proto.conform.inprocess import controller_target, relay_target
from flodl_proto.conform.report import case_line
from flodl_proto.errors import ProtocolError, protocol_error
from flodl_proto.fsm import controller_core, relay_core
from flodl_proto.reduce import HostFold, reduce_realized_work, sum_frames
from flodl_proto.runner import _port_mux as port_mux
from flodl_proto.runner import relay as relay_runner
from flodl_proto.runner import relay_fanout
from flodl_proto.spec import CHANNEL_MAGIC_DATA, CHANNEL_MAGIC_HTTP_GET, CHANNEL_MAGIC_HTTP_POST

CATALOGUE = load_catalogue()
SETTINGS = KitSettings(timeout_scale=0.1)
#: waits that follow an unscaled 10 s timeout; no broken target here touches the handshake read
SLOW = {"controller.lifecycle.handshake-deadline"}


# -- the breaks -----------------------------------------------------------------------------------


def skip_tag_check(mp: pytest.MonkeyPatch) -> None:
    """Accept any auth tag (frames and records)."""
    mp.setattr(mux_codec, "tags_equal", lambda a, b: True)
    mp.setattr(frame_codec, "tags_equal", lambda a, b: True)


def divide_by_world_size(mp: pytest.MonkeyPatch) -> None:
    """Normalise a Model round by the world size instead of the summed mass."""
    def reduce(frames: Any, *, version: int, threads: int = 1, pool: Any = None) -> RoundFrame:
        world = sys._getframe(1).f_locals["self"].world_size  # the calling ControllerCore
        accepted = [f for f in frames if f is not None]
        summed = sum_frames(accepted, version=version)
        if summed.kind is not RoundKind.MODEL or not summed.weight > 0:
            return summed
        scaled = reduce_realized_work([RoundFrame(summed.kind, float(world), summed.tensors)],
                                      version=version)
        return RoundFrame(summed.kind, summed.weight, scaled.tensors)

    mp.setattr(controller_core, "reduce_realized_work", reduce)


def _bf16_reduce(bits: Callable[[Any], Any], twice: bool) -> Callable[..., RoundFrame]:
    """reduce_realized_work whose bf16 tensors (full in every frame) are summed in f32 and
    encoded by ``bits`` (f32 array -> bf16 bits), the sum rounded before the scale when
    ``twice``."""
    def reduce(frames: Any, *, version: int, threads: int = 1, pool: Any = None) -> RoundFrame:
        accepted = [f for f in frames if f is not None]
        real = reduce_realized_work(accepted, version=version)
        scale = real.kind is RoundKind.MODEL and real.weight > 0
        inv = np.float32(1.0 / real.weight) if scale else np.float32(1.0)
        tensors = list(real.tensors)
        for k, t in enumerate(tensors):
            parts = [f.tensors[k] for f in accepted]
            if t.dtype != 1 or any(len(p.data) != 2 * t.numel for p in parts):
                continue
            acc = np.zeros(t.numel, np.float32)
            with np.errstate(invalid="ignore"):  # a NaN lane (controller.round.bf16-nan)
                for p in parts:
                    wide = np.frombuffer(p.data, "<u2").astype(np.uint32) << np.uint32(16)
                    acc = acc + wide.view(np.float32)
                if scale:
                    if twice:
                        acc = (bits(acc).astype(np.uint32) << np.uint32(16)).view(np.float32)
                    acc = (acc * inv).astype(np.float32)
            tensors[k] = TensorPayload(1, t.shape, bits(acc).astype("<u2").tobytes())
        return RoundFrame(real.kind, real.weight, tuple(tensors))

    return reduce


def _bf16_nearest_even(a: Any) -> Any:
    b = a.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def truncate_bf16(mp: pytest.MonkeyPatch) -> None:
    """Round f32 to bf16 by dropping the low 16 bits (toward zero) instead of to nearest even,
    both in the fold and after the scale."""
    mp.setattr(controller_core, "reduce_realized_work",
               _bf16_reduce(lambda a: (a.view(np.uint32) >> 16).astype(np.uint16), True))


def round_bf16_ties_away(mp: pytest.MonkeyPatch) -> None:
    """Round f32 to the nearest bf16 with ties away from zero instead of to even."""
    mp.setattr(controller_core, "reduce_realized_work", _bf16_reduce(
        lambda a: ((a.view(np.uint32).astype(np.uint64) + 0x8000) >> 16).astype(np.uint16),
        True))


def round_bf16_once(mp: pytest.MonkeyPatch) -> None:
    """Scale the f32 sum of a bf16 tensor without first rounding it to bf16 (one rounding)."""
    mp.setattr(controller_core, "reduce_realized_work", _bf16_reduce(_bf16_nearest_even, False))


def cast_bf16_with_ml_dtypes(mp: pytest.MonkeyPatch) -> None:
    """Encode bf16 with ml_dtypes' cast, which rounds to nearest even but makes every NaN the
    default NaN (0x7fc0 / 0xffc0), where upstream keeps its payload."""
    mp.setattr(controller_core, "reduce_realized_work", _bf16_reduce(
        lambda a: a.astype(ml_dtypes.bfloat16).view(np.uint16), True))


def sum_weights_from_plus_zero(mp: pytest.MonkeyPatch) -> None:
    """Sum the weights from +0.0 instead of -0.0 (weights -0.0 and -0.0 give +0.0)."""
    def reduce(frames: Any, *, version: int, threads: int = 1, pool: Any = None) -> RoundFrame:
        real = reduce_realized_work([f for f in frames if f is not None], version=version)
        weight = 0.0
        for f in frames:
            if f is not None:
                weight += f.weight
        return RoundFrame(real.kind, weight, real.tensors)

    mp.setattr(controller_core, "reduce_realized_work", reduce)


def sum_f32_from_first_frame(mp: pytest.MonkeyPatch) -> None:
    """Start each f32 sum from the first frame's tensor instead of +0.0 (a lone -0.0, or -0.0
    and -0.0, stays -0.0)."""
    def reduce(frames: Any, *, version: int, threads: int = 1, pool: Any = None) -> RoundFrame:
        accepted = [f for f in frames if f is not None]
        real = reduce_realized_work(accepted, version=version)
        scale = real.kind is RoundKind.MODEL and real.weight > 0
        tensors = list(real.tensors)
        for k, t in enumerate(tensors):
            parts = [f.tensors[k] for f in accepted]
            if t.dtype != 0 or any(len(p.data) != 4 * t.numel for p in parts):
                continue
            acc = np.frombuffer(parts[0].data, "<f4").copy()
            for p in parts[1:]:
                acc = acc + np.frombuffer(p.data, "<f4")
            if scale:
                acc = acc * np.float32(1.0 / real.weight)
            tensors[k] = TensorPayload(0, t.shape, acc.astype("<f4").tobytes())
        return RoundFrame(real.kind, real.weight, tuple(tensors))

    mp.setattr(controller_core, "reduce_realized_work", reduce)


def _refuse_records(mp: pytest.MonkeyPatch,
                    bad: Callable[[RecordReceived, int], str | None]) -> None:
    """Fail the run on a record ``bad`` names a reason for (``bad(event, version)``), as a
    reader stricter than upstream's would, in the accept phase and the reduce loop alike."""
    for name in ("_handshake_event", "_relay_event"):
        orig = getattr(controller_core.ControllerCore, name)

        def event(self: Any, *args: Any, _orig: Any = orig) -> None:
            ev = args[-1]
            why = bad(ev, self.version) if isinstance(ev, RecordReceived) else None
            if why is not None:
                ev = StreamFailed(protocol_error("mux.bad_field", field="record", value=why,
                                                 reason="refused by a strict reader"))
            _orig(self, *args[:-1], ev)

        mp.setattr(controller_core.ControllerCore, name, event)


def check_record_rank(mp: pytest.MonkeyPatch) -> None:
    """Refuse a Control, HostFrame or Broadcast record whose rank field is not 0."""
    _refuse_records(mp, lambda ev, v: f"rank {ev.header.rank}" if ev.header.rank != 0
                    and ev.record.kind is not RecordKind.DATA else None)


def refuse_hostframe_trailing_bytes(mp: pytest.MonkeyPatch) -> None:
    """Refuse a HostFrame whose payload goes on after its RoundFrame."""
    _refuse_records(mp, lambda ev, v: "trailing bytes" if isinstance(ev.frame, RoundFrame)
                    and len(ev.record.payload) != round_frame_wire_len(ev.frame.tensors)
                    else None)


def refuse_noncanonical_varints(mp: pytest.MonkeyPatch) -> None:
    """Refuse a Control message whose bincode is not its shortest encoding (bytes after it, a
    version-3 Hello's model_sigs at version 2, still pass)."""
    def bad(ev: RecordReceived, version: int) -> str | None:
        msg = ev.record.control
        if msg is None:
            return None
        shortest = encode_control(msg, version)
        return None if bytes(ev.record.payload[:len(shortest)]) == shortest else "varints"

    _refuse_records(mp, bad)


def keep_first_host_frame(mp: pytest.MonkeyPatch) -> None:
    """Keep a relay's first HostFrame of a round and drop a second one, which upstream takes
    in its place."""
    orig = controller_core.ControllerCore._relay_event

    def event(self: Any, c: Any, relay: Any, ev: Any) -> None:
        if isinstance(ev, RecordReceived) and ev.record.kind is RecordKind.HOST_FRAME \
                and relay.frame is not None:
            return
        orig(self, c, relay, ev)

    mp.setattr(controller_core.ControllerCore, "_relay_event", event)


def broadcast_before_all_deposited(mp: pytest.MonkeyPatch) -> None:
    """Reduce and scatter as soon as one relay has deposited."""
    orig = controller_core.ControllerCore._expected

    def expected(self: Any) -> Any:
        alive = orig(self)
        return [r for r in alive if r.frame is not None] or alive

    mp.setattr(controller_core.ControllerCore, "_expected", expected)


def accept_duplicate_rank(mp: pytest.MonkeyPatch) -> None:
    """Accept a rank already announced (by this Hello or an earlier relay)."""
    orig = controller_core.ControllerCore._accept_hello

    def accept(self: Any, c: Any, hello: Hello, *rest: Any) -> None:
        for r in hello.ranks:
            self._rank_relay.pop(r, None)
        orig(self, c, Hello(hello.host, list(dict.fromkeys(hello.ranks)), hello.model_sigs),
             *rest)

    mp.setattr(controller_core.ControllerCore, "_accept_hello", accept)


def keep_bad_magic_open(mp: pytest.MonkeyPatch) -> None:
    """The port mux leaves a connection with an unknown magic open (and unserved)."""
    orig = port_mux.PortMux._peek
    leaked: list[Any] = []

    def peek(self: Any, s: Any) -> None:
        try:
            head = s.recv(4, socket.MSG_PEEK)
        except OSError:
            head = b""
        known = (CHANNEL_MAGIC_DATA, CHANNEL_MAGIC_HTTP_GET, CHANNEL_MAGIC_HTTP_POST)
        if len(head) == 4 and int.from_bytes(head, "little") not in known:
            self._sel.unregister(s)
            self._pending.pop(s, None)
            leaked.append(s)  # neither served nor closed
            return
        orig(self, s)

    mp.setattr(port_mux.PortMux, "_peek", peek)


def forget_declare_dead(mp: pytest.MonkeyPatch) -> None:
    """The relay never acts on DeclareDead from the controller."""
    orig = relay_core.RelayCore._controller_record

    def record(self: Any, rec: Any) -> None:
        if rec is not None and isinstance(rec.control, DeclareDead):
            return
        orig(self, rec)

    mp.setattr(relay_core.RelayCore, "_controller_record", record)


def relay_accepts_duplicate_rank(mp: pytest.MonkeyPatch) -> None:
    """The relay takes a second connection for a rank as one of its ranks not yet connected."""
    orig = relay_core.RelayCore.rank_handshake

    def handshake(self: Any, data: Any) -> Any:
        try:
            hs = decode_handshake(data, self.world_size, self.version)[0]
        except ProtocolError:
            return orig(self, data)
        free = [r for r in self.ranks if r not in self._connected]
        if hs.rank in self._connected and free:
            data = encode_handshake(free[0], hs.world_size, self.version)
        return orig(self, data)

    mp.setattr(relay_core.RelayCore, "rank_handshake", handshake)


def ship_seed_bytes(mp: pytest.MonkeyPatch) -> None:
    """The relay ships its first deposit's frame as it came for a round no later payload
    promoted, under that deposit's weight whatever the later (elided) deposits added."""
    from flodl_proto.reduce import host_fold

    mp.setattr(host_fold, "_same_bits", lambda a, b: True)


def relay_hello_in_connection_order(mp: pytest.MonkeyPatch) -> None:
    """The relay's Hello lists its ranks in the order they connected, not ascending."""
    orig = relay_core.RelayCore.rank_handshake

    def handshake(self: Any, data: Any) -> Any:
        before = set(self._connected)
        out = orig(self, data)
        self.__dict__.setdefault("_joined", []).extend(sorted(self._connected - before))
        return out

    mp.setattr(relay_core.RelayCore, "rank_handshake", handshake)
    mp.setattr(relay_core.RelayCore, "_hello", lambda self: mux_codec.MuxRecord.control_msg(
        Hello(self.host, tuple(self.__dict__.get("_joined", self.ranks))), self.version))


def _valid_frame(fold: Any, mv: memoryview) -> RoundFrame | None:
    """``mv``'s RoundFrame when it decodes with the fold's salt, else None (the fold's own
    deposit then raises its error)."""
    try:
        return decode_round_frame(bytes(mv), fold._salt)[0]
    except ProtocolError:
        return None


def relay_folds_in_rank_order(mp: pytest.MonkeyPatch) -> None:
    """The relay holds each valid deposit until the round can complete, then folds them in
    ascending rank order instead of arrival order."""
    deposit, dead = HostFold.deposit_view, HostFold.declare_dead_frame

    def flush(self: Any) -> Any:
        held, res = self.__dict__.pop("_held", {}), None
        for r in sorted(held):
            res = deposit(self, r, memoryview(held[r]), None)
        return res

    def complete(self: Any) -> bool:
        return set(self.__dict__.get("_held", {})) >= set(self.alive_ranks)

    def deposit_view(self: Any, rank: int, mv: memoryview, premac: Any) -> Any:
        held = self.__dict__.setdefault("_held", {})
        if rank in held or rank not in self.alive_ranks or _valid_frame(self, mv) is None:
            flush(self)  # a double deposit or a bad frame meets the fold's own checks
            return deposit(self, rank, mv, premac)
        held[rank] = bytes(mv)
        return flush(self) if complete(self) else None

    def declare_dead_frame(self: Any, rank: int) -> Any:
        res = dead(self, rank)
        return flush(self) if res is None and self.__dict__.get("_held") and complete(self) \
            else res

    mp.setattr(HostFold, "deposit_view", deposit_view)
    mp.setattr(HostFold, "declare_dead_frame", declare_dead_frame)


def _rework_merged(mp: pytest.MonkeyPatch,
                   rework: Callable[[RoundFrame, list[RoundFrame]], RoundFrame]) -> None:
    """Patch the relay's fold so that a merged HostFrame (two or more deposits) becomes
    ``rework(merged, the round's deposits in arrival order)``."""
    deposit, dead = HostFold.deposit_view, HostFold.declare_dead_frame

    def done(self: Any, res: Any) -> Any:
        frames = self.__dict__.pop("_frames", [])
        return rework(res, frames) if isinstance(res, RoundFrame) else res

    def deposit_view(self: Any, rank: int, mv: memoryview, premac: Any) -> Any:
        frame = _valid_frame(self, mv)
        res = deposit(self, rank, mv, premac)
        if frame is not None:
            self.__dict__.setdefault("_frames", []).append(frame)
        return None if res is None else done(self, res)

    def declare_dead_frame(self: Any, rank: int) -> Any:
        res = dead(self, rank)
        return None if res is None else done(self, res)

    mp.setattr(HostFold, "deposit_view", deposit_view)
    mp.setattr(HostFold, "declare_dead_frame", declare_dead_frame)


def relay_sums_bf16_in_bf16(mp: pytest.MonkeyPatch) -> None:
    """The relay sums bf16 deposits in bf16, rounding after every addition (256 + 1 = 256),
    instead of in f32 with one rounding."""
    def rework(merged: RoundFrame, frames: list[RoundFrame]) -> RoundFrame:
        tensors = list(merged.tensors)
        for k, t in enumerate(tensors):
            parts = [f.tensors[k].data for f in frames]
            if t.dtype != 1 or any(len(p) != 2 * t.numel for p in parts):
                continue
            acc = np.zeros(t.numel, ml_dtypes.bfloat16)
            for p in parts:
                acc = acc + np.frombuffer(p, "<u2").view(ml_dtypes.bfloat16)
            tensors[k] = TensorPayload(1, t.shape, acc.view(np.uint16).astype("<u2").tobytes())
        return RoundFrame(merged.kind, merged.weight, tuple(tensors))

    _rework_merged(mp, rework)


def relay_sums_weights_from_plus_zero(mp: pytest.MonkeyPatch) -> None:
    """The relay sums its deposits' weights from +0.0 instead of from the first deposit's
    weight (weights -0.0 and -0.0 give +0.0)."""
    def rework(merged: RoundFrame, frames: list[RoundFrame]) -> RoundFrame:
        weight = 0.0
        for f in frames:
            weight += f.weight
        return RoundFrame(merged.kind, weight, merged.tensors)

    _rework_merged(mp, rework)


def relay_promotes_tensor_by_tensor(mp: pytest.MonkeyPatch) -> None:
    """The relay promotes only the tensors a later deposit carries bytes for: a merged round
    ships the first deposit's tensor verbatim where every later deposit elided it (its -0.0
    kept, a tensor every deposit elided still elided), where the whole first deposit is
    promoted to sums from +0.0."""
    def rework(merged: RoundFrame, frames: list[RoundFrame]) -> RoundFrame:
        seed, later = frames[0], frames[1:]
        return RoundFrame(merged.kind, merged.weight, tuple(
            seed.tensors[k] if all(f.tensors[k].elided for f in later) else t
            for k, t in enumerate(merged.tensors)))

    _rework_merged(mp, rework)


def relay_lacks_the_control_bound(mp: pytest.MonkeyPatch) -> None:
    """The relay reads a Control record from the controller whatever its length (up to the
    frame ceiling), as upstream does, where it refuses one past the control bound from its
    header."""
    mp.setattr(relay_fanout, "control_too_long", lambda *args: None)


def relay_control_bound_one_byte_short(mp: pytest.MonkeyPatch) -> None:
    """The relay bounds a Control record from the controller at one byte less than the
    longest legal control message for its world size (287 + 37 x W - 1 bytes), refusing a
    record of exactly the bound."""
    mp.setattr(relay_runner, "max_control_payload", lambda w: max_control_payload(w) - 1)


def controller_lacks_the_control_bound(mp: pytest.MonkeyPatch) -> None:
    """The controller reads a relay's Control record after its Hello whatever its length (up
    to the frame ceiling), as upstream does, where it refuses one past the control bound from
    its header."""
    mp.setattr(controller_core, "max_control_payload", lambda w: None)


def controller_control_bound_one_byte_short(mp: pytest.MonkeyPatch) -> None:
    """The controller bounds a relay's Control record after its Hello at one byte less than
    the longest legal control message for the world size (287 + 37 x W - 1 bytes), refusing
    a record of exactly the bound."""
    mp.setattr(controller_core, "max_control_payload", lambda w: max_control_payload(w) - 1)


def relay_checks_byte_count_not_shape(mp: pytest.MonkeyPatch) -> None:
    """The relay compares a deposit's tensors with the round's first by element count, not
    shape: a [3, 2] tensor folds into a [2, 3] one."""
    deposit = HostFold.deposit_view

    def deposit_view(self: Any, rank: int, mv: memoryview, premac: Any) -> Any:
        frame, first = _valid_frame(self, mv), self.__dict__.get("_first")
        if frame is not None and first is not None and len(first) == len(frame.tensors):
            tensors = tuple(TensorPayload(t.dtype, s, t.data) if t.numel == math.prod(s) else t
                            for t, s in zip(frame.tensors, first, strict=True))
            mv = memoryview(encode_round_frame_bytes(
                RoundFrame(frame.kind, frame.weight, tensors), self._salt))
            premac = None
        elif frame is not None:
            self.__dict__["_first"] = [t.shape for t in frame.tensors]
        res = deposit(self, rank, mv, premac)
        if res is not None:
            self.__dict__.pop("_first", None)
        return res

    mp.setattr(HostFold, "deposit_view", deposit_view)


def _run(role: str, version: int, factory: Callable[[], Any], port_mux: bool = False,
         patterns: tuple[str, ...] = ()) -> tuple[set[str], str]:
    runs, _ = select_cases(CATALOGUE, role=role, versions=[version], port_mux=port_mux,
                           patterns=list(patterns))
    runs = [(c, v) for c, v in runs if c.id not in SLOW]
    # no case run would read as a target that passed them all
    assert runs, f"no {role} case at version {version} matches {patterns}"
    # a failing case waits out its expectation (5 s x the scale, at least 2 s): with 8 cases
    # side by side a target's failing cases wait together rather than in two turns
    results = run_cases(runs, factory, SETTINGS, jobs=8)
    failed = {r.case.id for r in results if not r.passed}
    text = "\n".join(line for r in results if not r.passed
                     for line in case_line(r, r.case.section))
    return failed, text


BROKEN: dict[str, tuple[str, int, Callable[[pytest.MonkeyPatch], None],
                        Callable[[], Any], bool, set[str]]] = {
    "controller-skips-tag-check": ("controller", 3, skip_tag_check, controller_target(), False, {
        "controller.session.hello-wrong-salt",
        "controller.auth.frame-wrong-salt",
        "controller.auth.record-wrong-salt",
        "controller.auth.flipped-payload-byte",
    }),
    # every case whose summed mass differs from its world size (mass 0 is never divided)
    "controller-divides-by-world-size": ("controller", 2, divide_by_world_size,
                                         controller_target(), False, {
        "controller.session.one-relay-one-round",  # mass 2, world 1
        "controller.session.bf16-round",  # mass 3, world 2
        "controller.session.two-relays-bf16",  # mass 4, world 2
        "controller.round.f32-weighted",  # mass 3, world 2
        "controller.round.bf16-weighted",  # mass 3, world 2
        "controller.round.bf16-nan",  # mass 3, world 2
        "controller.round.several-tensors",  # mass 4, world 1
        "controller.round.two-rounds",  # masses 2 and 0.5, world 1
        "controller.lifecycle.elastic-scatter",  # round 2: mass 1, world 2
    }),
    # every case in which two relays deposit in one round (a lone all-elided round scatters
    # the same bytes either way)
    "controller-broadcasts-early": ("controller", 3, broadcast_before_all_deposited,
                                    controller_target(), False, {
        "controller.session.two-relays-bf16",
        "controller.session.schema-mismatch-across-relays",
        "controller.round.f32-weighted",
        "controller.round.bf16-weighted",
        "controller.round.fold-order",
        "controller.round.second-hostframe-overwrites",
        "controller.round.signed-zeros",
        "controller.round.bf16-nan",
        "controller.round.zero-mass",
        "controller.round.control-pure-sum",
        "controller.round.elided-idle-relay",
        "controller.round.barrier",
        "controller.schema.count-mismatch",
        "controller.schema.dtype-mismatch",
        "controller.schema.kind-mismatch",
        "controller.lifecycle.eof-with-alive-ranks",
        "controller.lifecycle.elastic-scatter",
    }),
    "controller-truncates-bf16": ("controller", 3, truncate_bf16, controller_target(), False, {
        "controller.round.bf16-weighted",
        "controller.round.bf16-nan",  # its finite lanes 5/3 and -0.5/3
        "controller.session.two-relays-bf16",
    }),
    "controller-rounds-bf16-ties-away": ("controller", 3, round_bf16_ties_away,
                                         controller_target(), False, {
        "controller.round.bf16-weighted",
    }),
    "controller-rounds-bf16-once": ("controller", 2, round_bf16_once, controller_target(),
                                    False, {
        "controller.round.bf16-weighted",
    }),
    "controller-casts-bf16-nan-to-default": ("controller", 3, cast_bf16_with_ml_dtypes,
                                             controller_target(), False, {
        "controller.round.bf16-nan",
    }),
    "controller-sums-weights-from-plus-zero": ("controller", 2, sum_weights_from_plus_zero,
                                               controller_target(), False, {
        "controller.round.signed-zeros",
    }),
    "controller-sums-f32-from-first-frame": ("controller", 3, sum_f32_from_first_frame,
                                             controller_target(), False, {
        "controller.round.signed-zeros",
    }),
    "controller-checks-record-rank": ("controller", 3, check_record_rank, controller_target(),
                                      False, {"controller.leniency.record-rank-ignored"}),
    "controller-refuses-hostframe-trailing-bytes": ("controller", 2,
                                                    refuse_hostframe_trailing_bytes,
                                                    controller_target(), False,
                                                    {"controller.leniency.hostframe-trailing-bytes"}),
    "controller-refuses-noncanonical-varints": ("controller", 3, refuse_noncanonical_varints,
                                                controller_target(), False,
                                                {"controller.leniency.noncanonical-varint"}),
    "controller-keeps-first-host-frame": ("controller", 2, keep_first_host_frame,
                                          controller_target(), False,
                                          {"controller.round.second-hostframe-overwrites"}),
    "controller-accepts-duplicate-rank": ("controller", 3, accept_duplicate_rank,
                                          controller_target(), False, {
        "controller.hello.duplicate-across-relays",
        "controller.hello.duplicate-within-hello",
    }),
    "controller-lacks-the-control-bound": ("controller", 2, controller_lacks_the_control_bound,
                                           controller_target(), False,
                                           {"controller.limits.control-over-bound"}),
    "controller-control-bound-one-byte-short": ("controller", 3,
                                                controller_control_bound_one_byte_short,
                                                controller_target(), False,
                                                {"controller.limits.control-at-bound"}),
    "controller-mux-keeps-bad-magic-open": ("controller", 3, keep_bad_magic_open,
                                            controller_target(port_mux=True), True, {
        "controller.portmux.unknown-magic-dropped",
    }),
    # relay.limits.control-at-bound's record is a DeclareDead the round waits for
    "relay-forgets-declare-dead": ("relay", 3, forget_declare_dead, relay_target(), False,
                                   {"relay.fold.declare-dead", "relay.limits.control-at-bound"}),
    "relay-accepts-duplicate-rank": ("relay", 2, relay_accepts_duplicate_rank, relay_target(),
                                     False, {"relay.handshake.duplicate-rank"}),
    "relay-ships-the-seed-under-its-own-weight": ("relay", 3, ship_seed_bytes, relay_target(),
                                                  False, {"relay.fold.elided-after-seed"}),
    "relay-hello-in-connection-order": ("relay", 2, relay_hello_in_connection_order,
                                        relay_target(), False,
                                        {"relay.handshake.hello-ranks-ascending"}),
    "relay-folds-in-rank-order": ("relay", 3, relay_folds_in_rank_order, relay_target(), False,
                                  {"relay.fold.arrival-order"}),
    "relay-sums-bf16-in-bf16": ("relay", 2, relay_sums_bf16_in_bf16, relay_target(), False,
                                {"relay.fold.bf16-three-deposits"}),
    "relay-sums-weights-from-plus-zero": ("relay", 3, relay_sums_weights_from_plus_zero,
                                          relay_target(), False, {"relay.fold.signed-zeros"}),
    "relay-promotes-tensor-by-tensor": ("relay", 3, relay_promotes_tensor_by_tensor,
                                        relay_target(), False,
                                        {"relay.fold.promotion-is-whole"}),
    "relay-lacks-the-control-bound": ("relay", 2, relay_lacks_the_control_bound,
                                      relay_target(), False, {"relay.limits.control-over-bound"}),
    "relay-control-bound-one-byte-short": ("relay", 3, relay_control_bound_one_byte_short,
                                           relay_target(), False,
                                           {"relay.limits.control-at-bound"}),
    "relay-checks-byte-count-not-shape": ("relay", 2, relay_checks_byte_count_not_shape,
                                          relay_target(), False,
                                          {"relay.schema.transposed-shape"}),
    "relay-skips-tag-check": ("relay", 3, skip_tag_check, relay_target(), False, {
        "relay.auth.bad-tag-from-rank",
        "relay.auth.flipped-byte-from-rank",
        "relay.auth.broadcast-wrong-salt",
    }),
}


@pytest.fixture
def quiet_numpy() -> Iterator[None]:
    with np.errstate(all="ignore"):
        yield


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_target_fails_exactly_its_cases(name: str, monkeypatch: pytest.MonkeyPatch,
                                               quiet_numpy: None) -> None:
    role, version, brk, factory, port_mux, expected = BROKEN[name]
    brk(monkeypatch)
    failed, text = _run(role, version, factory, port_mux=port_mux)
    assert failed == expected, f"{name}: failed {sorted(failed)}\n{text}"


@pytest.mark.timeout(60)
def test_promotion_is_whole_fails_a_relay_promoting_tensor_by_tensor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """relay.fold.promotion-is-whole passes against this package's relay and fails against
    one that keeps the first deposit's tensors no later deposit carried bytes for."""
    case_id = "relay.fold.promotion-is-whole"
    assert _run("relay", 3, relay_target(), patterns=(case_id,)) == (set(), "")
    relay_promotes_tensor_by_tensor(monkeypatch)
    failed, text = _run("relay", 3, relay_target(), patterns=(case_id,))
    assert failed == {case_id}
    lines = text.splitlines()
    assert [ln for ln in lines if not ln.lstrip().startswith(("expected:", "observed:"))] == [
        f"FAIL {case_id} v3 [MUST] (semantics:relay_barrier)",
        "     step 12: connection up: expected a HostFrame record (120 bytes), observed 108 "
        "bytes (they already differ)",
        # tensor 2, elided by both deposits, ships elided (0 bytes) where 12 zero bytes belong
        "     first differing byte offset: 13 (payload_len: expected 95, observed 83)",
        "     target: exit 0 after SIGTERM"]


@pytest.mark.timeout(60)
def test_control_over_bound_fails_a_relay_without_the_control_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """relay.limits.control-over-bound passes against this package's relay and fails against
    one that reads the over-long Control record (a DeclareDead it then acts on) and goes on."""
    case_id = "relay.limits.control-over-bound"
    for version in (2, 3):
        assert _run("relay", version, relay_target(), patterns=(case_id,)) == (set(), "")
    relay_lacks_the_control_bound(monkeypatch)
    failed, text = _run("relay", 3, relay_target(), patterns=(case_id,))
    assert failed == {case_id}
    assert text.splitlines() == [
        f"FAIL {case_id} v3 [SHOULD] (section:Departures from upstream)",
        "     step 11: connection r0: expected the target to close it; still open after 2s",
        "     target: exit 0 after SIGTERM"]


@pytest.mark.timeout(60)
def test_control_over_bound_fails_a_controller_without_the_control_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """controller.limits.control-over-bound passes against this package's controller and fails
    against one that reads the over-long Control record (a RankExit it then ends the run on)."""
    case_id = "controller.limits.control-over-bound"
    assert [c.versions for c in CATALOGUE if c.id == case_id] == [(2, 3)]
    for version in (2, 3):
        assert _run("controller", version, controller_target(), patterns=(case_id,)) \
            == (set(), "")
    controller_lacks_the_control_bound(monkeypatch)
    failed, text = _run("controller", 3, controller_target(), patterns=(case_id,))
    assert failed == {case_id}
    assert text.splitlines() == [
        f"FAIL {case_id} v3 [SHOULD] (section:Departures from upstream)",
        # the record read and decoded: its RankExit ends the run cleanly
        "     step 6: expected the target to exit with a failure status, observed 0",
        "     target: exit 0"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("role", "factory", "short", "lines"), [
    # the record refused from its header: the run fails where the RankExit ends it cleanly
    ("controller", controller_target, controller_control_bound_one_byte_short, [
        "     step 6: expected the target to exit with status 0, observed 1",
        "     target: exit 1"]),
    # the relay fails and closes its connection where DeclareDead ships rank 0's round
    ("relay", relay_target, relay_control_bound_one_byte_short, [
        "     step 13: connection up: expected a HostFrame record (68 bytes), observed 0 bytes "
        "(end of stream)",
        "     expected: d0170df10100000003000000002b0000... (68 B)",
        "     observed: (nothing)",
        "     first differing byte offset: 0",
        "     target: exit 1"]),
])
def test_control_at_bound_fails_a_target_whose_bound_is_one_byte_short(
        role: str, factory: Callable[[], Any], short: Callable[[pytest.MonkeyPatch], None],
        lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """<role>.limits.control-at-bound (a Control record of exactly 287 + 37 x 2 = 361 bytes at
    world size 2) passes against this package's controller and relay, and fails against one
    whose bound is a byte short (360), which refuses the record from its header."""
    case_id = f"{role}.limits.control-at-bound"
    assert [c.versions for c in CATALOGUE if c.id == case_id] == [(2, 3)]
    for version in (2, 3):
        assert _run(role, version, factory(), patterns=(case_id,)) == (set(), "")
    short(monkeypatch)
    failed, text = _run(role, 3, factory(), patterns=(case_id,))
    assert failed == {case_id}
    assert text.splitlines() == [
        f"FAIL {case_id} v3 [MUST] (section:Departures from upstream)", *lines]

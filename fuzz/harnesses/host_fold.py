"""Target ``host_fold``: the relay's :class:`~flodl_proto.reduce.HostFold` fed a fuzzer-chosen
sequence of deposits (well-formed frames built from the input, or raw blobs) and deaths, checked
against a small model.

Input layout: ``flags u8 | roster u8 | schema (see builders.read_schema) | ops``. Flags: bit 0
version (0: 2, 1: 3), bit 1 re-sign raw blobs, bit 2 salt, bits 3-4 frame ceiling (64 MiB, 1 MiB,
1 KiB, 0 — never the 1 GiB default, whose elided seeds may legitimately promote to 1 GiB of
accumulators). Roster byte: ``1 + (b & 3)`` local ranks starting at ``(b >> 2) & 7``. Each op byte:
low 2 bits the op, the rest its argument ``a``:

* 0 — deposit a built frame (:func:`~fuzz.harnesses.builders.build_frame`) from local rank
  ``a % n``; bit 5 of ``a`` appends 3 trailing bytes (leniency ``loopback_trailing``);
* 1 — deposit a raw blob of ``u8`` bytes from local rank ``a % n``;
* 2 — declare dead local rank ``a % n`` (``a >= 32``: the rank id ``a``, maybe not local);
* 3 — deposit from a rank that is not local (a local API misuse: LocalProtocolError, not fatal).

Oracle: every call returns what the model says or raises a RemoteProtocolError the model
expects (including a weight sum past the f64 range); after one, every call raises that same
error object. A round completes exactly when each local rank has deposited or is dead and one
deposit exists. A round that never promoted ships the first deposit's tensors verbatim under the
summed weight (its frame verbatim when that weight is the seed's, bit for bit); otherwise
the HostFrame decodes under the salt with the seed's kind and schema, the weights summed in
deposit order, and per element the f32 sum of the merged contributions in deposit order
(re-encoded in the tensor's dtype; NaN payloads and the sign of zero not compared; at version 3
a tensor elided in every deposit ships as zeros, as upstream's promoted fold re-encodes every
tensor's sums).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from flodl_proto.codec import END_OF_STREAM, RoundFrame, decode_round_frame_or_eos
from flodl_proto.codec import encode_round_frame_bytes as encode_frame
from flodl_proto.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from flodl_proto.reduce import HostFold
from flodl_proto.spec import AUTH_TAG_LEN, FRAME_CEILING_FLOOR, ROUND_FRAME_HEADER_LEN

from .builders import ELEMENT_SIZE, build_frame, read_schema
from .common import SALTS, Finding, Params, check, resign_round_frames

#: ceilings the fold may run with (bounded so accumulators stay within the memory budget)
FOLD_CEILINGS: tuple[int, ...] = (FRAME_CEILING_FLOOR, 1 << 20, 1024, 0)
MAX_OPS = 48


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _widen(t: Any) -> np.ndarray[Any, Any]:
    raw = np.frombuffer(bytes(t.data), dtype=np.uint8)
    if t.dtype == 0:
        return raw.view("<f4").astype(np.float32)
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


@dataclass
class Model:
    """What the fold must do: one round's deposits in order, deaths, the fatal error."""

    ranks: tuple[int, ...]
    version: int
    salt: bytes
    ceiling: int
    dead: set[int] = field(default_factory=set)
    deposits: list[tuple[int, RoundFrame]] = field(default_factory=list)
    seed_bytes: bytes = b""
    promoted: bool = False
    fatal: ProtocolError | None = None

    def later_ok(self, frame: RoundFrame) -> bool:
        """Would a later deposit of ``frame`` merge (schema, promotion and byte counts)?"""
        seed = self.deposits[0][1]
        if frame.kind != seed.kind or len(frame.tensors) != len(seed.tensors):
            return False
        promoted = self.promoted
        for p, s in zip(frame.tensors, seed.tensors, strict=True):
            if (p.dtype, p.shape) != (s.dtype, s.shape):
                return False
            if self.version >= 3 and p.nbytes == 0:
                continue
            if not promoted:
                if not self.promotion_ok():
                    return False
                promoted = True
            if p.nbytes != _numel(p.shape) * ELEMENT_SIZE[p.dtype]:
                return False
        # the summed weight must stay a finite f64 (departure fold.weight_overflow)
        return not math.isinf(self.weight() + frame.weight)

    def promotion_ok(self) -> bool:
        """Can the seed become f32 accumulators (known dtypes, byte counts, ceiling)?"""
        total = 0
        for t in self.deposits[0][1].tensors:
            es = ELEMENT_SIZE.get(t.dtype)
            if es is None:
                return False
            if (self.version < 3 or t.nbytes) and t.nbytes != _numel(t.shape) * es:
                return False
            total += _numel(t.shape) * es
        return total <= self.ceiling

    def merges(self, frame: RoundFrame) -> bool:
        """Does a later deposit of ``frame`` promote the seed (carry bytes to merge)?"""
        return any(self.version < 3 or t.nbytes for t in frame.tensors)

    def weight(self) -> float:
        """The round's summed weight so far, in deposit order."""
        weight = self.deposits[0][1].weight if self.deposits else 0.0
        for _, f in self.deposits[1:]:
            weight += f.weight
        return weight

    def complete(self) -> bool:
        """Is the current round complete?"""
        got = {r for r, _ in self.deposits}
        return bool(self.deposits) and all(r in self.dead or r in got for r in self.ranks)

    def check_output(self, out: bytes) -> None:
        """Check a completed round's HostFrame payload, then start the next round."""
        seed = self.deposits[0][1]
        if not self.promoted:
            weight = self.weight()
            if struct.pack("<d", weight) == struct.pack("<d", seed.weight):
                check(out == self.seed_bytes, "an unpromoted round did not ship its seed verbatim")
            else:  # later deposits (nothing to merge) changed the weight: it is the sum's
                # the seed's bytes as they came (a payload of another byte count than its
                # shape's included: never promoted, never checked), under the summed weight and
                # signed again: its weight field after the header and the kind byte, its tag
                # the HMAC of everything before it
                body = bytearray(self.seed_bytes[:-AUTH_TAG_LEN])
                at = ROUND_FRAME_HEADER_LEN + 1
                body[at:at + 8] = struct.pack("<d", weight)
                want = bytes(body) + hmac.new(self.salt, body, hashlib.sha256).digest()[
                    :AUTH_TAG_LEN]
                check(out == want, "an unpromoted round did not ship its seed's tensors under "
                      f"the summed weight {weight!r}")
        else:
            res = decode_round_frame_or_eos(out, self.salt, ceiling=1 << 62)
            check(res is not END_OF_STREAM, "empty HostFrame")
            assert res is not END_OF_STREAM
            frame, n = res
            check(n == len(out), f"HostFrame has {len(out) - n} trailing bytes")
            check(frame.kind == seed.kind, f"kind {frame.kind} != seed {seed.kind}")
            weight = self.weight()
            check(struct.pack("<d", frame.weight) == struct.pack("<d", weight),
                  f"weight {frame.weight!r} != {weight!r}")
            check(len(frame.tensors) == len(seed.tensors), "tensor count")
            for i, (t, s) in enumerate(zip(frame.tensors, seed.tensors, strict=True)):
                check((t.dtype, t.shape) == (s.dtype, s.shape), f"tensor {i} schema")
                n_el = _numel(s.shape)
                # a promoted round ships every tensor whole: one elided in every deposit as zeros
                check(t.nbytes == n_el * ELEMENT_SIZE[s.dtype], f"tensor {i} has {t.nbytes} B")
                acc = np.zeros(n_el, np.float32)
                with np.errstate(all="ignore"):
                    for _, f in self.deposits:
                        p = f.tensors[i]
                        if self.version >= 3 and p.nbytes == 0:
                            continue
                        acc = (acc + _widen(p)).astype(np.float32)
                    if s.dtype == 0:
                        want = acc
                    else:
                        want = acc.astype(ml_dtypes.bfloat16).astype(np.float32)
                got = _widen(t)
                check(np.array_equal(got, want, equal_nan=True),
                      f"tensor {i}: fold gave {got!r}, model {want!r}")
        self.deposits = []
        self.seed_bytes = b""
        self.promoted = False


def _call(fold: HostFold, fn: str, *args: Any) -> tuple[Any, ProtocolError | None]:
    try:
        return getattr(fold, fn)(*args), None
    except RemoteProtocolError as e:
        return None, e
    except LocalProtocolError as e:
        return None, e


def _fatal_check(model: Model, res: Any, err: ProtocolError | None, what: str) -> bool:
    """After a fatal error every call re-raises it. True when the model is fatal."""
    if model.fatal is None:
        return False
    check(err is model.fatal, f"{what} after the fatal {model.fatal!r} gave {res!r} / {err!r}")
    return True


def do_deposit(fold: HostFold, model: Model, rank: int, blob: bytes) -> None:
    """Deposit ``blob`` from local rank ``rank`` in both the fold and the model."""
    res, err = _call(fold, "deposit", rank, blob)
    if _fatal_check(model, res, err, "deposit"):
        return
    if isinstance(err, LocalProtocolError):
        raise Finding(f"deposit by local rank {rank} raised {err!r}")
    if rank in model.dead:
        check(res is None and err is None, f"dead rank's deposit gave {res!r} / {err!r}")
        return
    expect_ok = True
    frame: RoundFrame | None = None
    consumed = 0
    try:
        dec = decode_round_frame_or_eos(blob, model.salt, ceiling=model.ceiling)
    except RemoteProtocolError:
        expect_ok = False
    else:
        if dec is END_OF_STREAM:
            expect_ok = False
        else:
            frame, consumed = dec
    if any(r == rank for r, _ in model.deposits):
        expect_ok = False
    elif expect_ok and model.deposits:
        assert frame is not None
        expect_ok = model.later_ok(frame)
    if not expect_ok:
        check(isinstance(err, RemoteProtocolError),
              f"deposit the model rejects gave {res!r} / {err!r}")
        assert err is not None
        model.fatal = err
        return
    check(err is None, f"deposit the model accepts raised {err!r}")
    assert frame is not None
    if not model.deposits:
        model.seed_bytes = bytes(blob[:consumed])
    elif model.merges(frame):
        model.promoted = True
    model.deposits.append((rank, frame))
    _completion(model, res, "deposit")


def _completion(model: Model, res: Any, what: str) -> None:
    if model.complete():
        check(isinstance(res, bytes), f"{what} completing the round returned {res!r}")
        model.check_output(res)
    else:
        check(res is None, f"{what} on an incomplete round returned {type(res).__name__}")


def test_one_input(data: bytes) -> None:
    """Drive a HostFold with the ops in ``data`` (layout in the module docstring)."""
    p = Params(data)
    flags = p.u8()
    roster = p.u8()
    version = 3 if flags & 1 else 2
    salt = SALTS[(flags >> 2) & 1]
    ceiling = FOLD_CEILINGS[(flags >> 3) & 3]
    first = (roster >> 2) & 7
    ranks = tuple(range(first, first + 1 + (roster & 3)))
    schema = read_schema(p)
    fold = HostFold(ranks, salt, version=version, ceiling=ceiling)
    model = Model(ranks, version, salt, ceiling)
    for _ in range(MAX_OPS):
        if p.pos >= len(data):
            break
        if model.fatal is None:
            check(fold.alive_ranks == tuple(r for r in ranks if r not in model.dead)
                  and fold.deposited == {r for r, _ in model.deposits},
                  f"fold reports alive {fold.alive_ranks}, deposited {set(fold.deposited)}")
        op = p.u8()
        kind, a = op & 3, op >> 2
        if kind == 0:
            blob = encode_frame(build_frame(p, schema), salt)
            if a & 0x20:
                blob += b"\x5a\x5a\x5a"
            do_deposit(fold, model, ranks[a % len(ranks)], blob)
        elif kind == 1:
            buf = bytearray(p.take(p.u8()))
            if flags & 2:
                resign_round_frames(buf, salt, ceiling, once=True)
            do_deposit(fold, model, ranks[a % len(ranks)], bytes(buf))
        elif kind == 2:
            rank = a if a >= 32 else ranks[a % len(ranks)]
            res, err = _call(fold, "declare_dead", rank)
            if _fatal_check(model, res, err, "declare_dead"):
                continue
            check(err is None, f"declare_dead({rank}) raised {err!r}")
            model.dead.add(rank)
            _completion(model, res, "declare_dead")
        else:
            rank = ranks[-1] + 1 + a
            res, err = _call(fold, "deposit", rank, b"")
            if _fatal_check(model, res, err, "deposit"):
                continue
            check(isinstance(err, LocalProtocolError) and err.error_id == "fold.unknown_rank",
                  f"deposit from non-local rank {rank} gave {res!r} / {err!r}")

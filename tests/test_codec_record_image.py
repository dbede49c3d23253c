"""FrameRecordImages: a small frame record written into its layout's kept image has the bytes
of the general encoder, round after round, for every layout, value and argument; anything
else is the general encoder's own output (or error)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec.auth import PARALLEL_MAC_MIN
from flodl_proto.codec.handshake import encode_channel_magic
from flodl_proto.codec.mux import (
    Hello,
    MuxRecord,
    RecordKind,
    encode_frame_record,
    encode_mux_record_bytes,
)
from flodl_proto.codec.record_image import (
    IMAGE_MAX_METADATA,
    IMAGE_MAX_PAYLOAD,
    IMAGES_KEPT,
    FrameRecordImages,
)
from flodl_proto.codec.round_frame import RoundFrame, RoundKind, TensorPayload
from flodl_proto.errors import ProtocolError
from flodl_proto.fsm.controller_core import ControllerCore
from flodl_proto.fsm.events import SendKind, SendTo
from flodl_proto.reduce import reduce_realized_work
from flodl_proto.spec import DEFAULT_FRAME_CEILING, MUX_HEADER_LEN

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
OTHER_SALT = bytes(range(16))
SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, 3.4e38, -1.5]


def wire(parts: Sequence[Any]) -> bytes:
    return b"".join(bytes(memoryview(p)) for p in parts)


def frame(rng: np.random.Generator, shapes: Sequence[tuple[int, ...]], dtype: int = 0, *,
          kind: RoundKind = RoundKind.MODEL, weight: float = 2.0,
          elided: Sequence[int] = (), special: bool = False) -> RoundFrame:
    tensors = []
    for i, shape in enumerate(shapes):
        if i in elided:
            tensors.append(TensorPayload.elide(dtype, shape))
            continue
        vals = rng.standard_normal(shape).astype(np.float32)
        if special and vals.size:
            flat = vals.reshape(-1)
            flat[:min(len(SPECIAL), flat.size)] = SPECIAL[:flat.size]
        arr = vals if dtype == 0 else vals.astype(ml_dtypes.bfloat16)
        tensors.append(TensorPayload.from_array(arr, dtype))
    return RoundFrame(kind, weight, tensors)


def check(images: FrameRecordImages, kind: RecordKind, f: RoundFrame, salt: Any = SALT,
          **kw: Any) -> list[Any]:
    """Encode ``f`` both ways; the bytes must be equal."""
    got = images.encode(kind, f, salt, **kw)
    assert wire(got) == wire(encode_frame_record(kind, f, salt, **kw))
    return got


SHAPES = [[(256,), (256,), (16, 16), (256,)], [(3, 5), (0,), (7,), ()], [(1,)], []]


@pytest.mark.parametrize("dtype", [0, 1])
@pytest.mark.parametrize("kind", [RecordKind.BROADCAST, RecordKind.HOST_FRAME])
@pytest.mark.parametrize("shapes", SHAPES)
def test_rounds_of_one_layout_have_the_general_bytes(dtype: int, kind: RecordKind,
                                                     shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(dtype)
    images = FrameRecordImages()
    first = check(images, kind, frame(rng, shapes, dtype))
    assert len(first) > 1  # the first frame of a layout: the general encoder's buffers
    del first
    for r in range(4):  # later rounds: the image, new values and weights each time
        f = frame(rng, shapes, dtype, weight=[0.5, -0.0, 0.0, 1e300][r], special=r == 2)
        got = check(images, kind, f)
        assert len(got) == 1 and isinstance(got[0], memoryview)
        del got


@pytest.mark.parametrize("dtype", [0, 1])
def test_version_3_elided_tensors_are_part_of_the_layout(dtype: int) -> None:
    rng = np.random.default_rng(3)
    shapes = [(64,), (32,), (8, 8)]
    images = FrameRecordImages()
    for elided in [(1,), (1,), (), (0, 2), (1,), (0, 1, 2), (0, 1, 2)]:
        got = check(images, RecordKind.BROADCAST, frame(rng, shapes, dtype, elided=elided))
        del got


def test_layout_changes_and_more_layouts_than_kept() -> None:
    rng = np.random.default_rng(4)
    layouts: list[list[tuple[int, ...]]] = [[(n,)] for n in range(1, IMAGES_KEPT + 3)]
    layouts += [[(2, 3)], [(3, 2)], [(6,)]]
    images = FrameRecordImages()
    for _ in range(3):
        for shapes in layouts:
            for kind in (RoundKind.MODEL, RoundKind.CONTROL):
                for dtype in (0, 1):
                    got = check(images, RecordKind.BROADCAST,
                                frame(rng, shapes, dtype, kind=kind))
                    del got
    assert len(images._images) == IMAGES_KEPT


def test_a_held_record_is_never_rewritten() -> None:
    rng = np.random.default_rng(5)
    images = FrameRecordImages()
    shapes = [(128,), (128,)]
    del images.encode(RecordKind.BROADCAST, frame(rng, shapes), SALT)[:]  # keeps the image
    f1 = frame(rng, shapes)
    held = check(images, RecordKind.BROADCAST, f1)
    want = wire(held)
    for _ in range(3):  # the image is held: these are encoded elsewhere
        f2 = frame(rng, shapes, special=True)
        other = check(images, RecordKind.BROADCAST, f2)
        assert wire(held) == want
        del other
    assert wire(held) == wire(encode_frame_record(RecordKind.BROADCAST, f1, SALT))


def test_a_record_handed_out_is_read_only() -> None:
    """A write through a record handed out would stay in the kept image: the header and frame
    metadata are written once, so every later record of the layout would carry it, signed
    (a caller zeroing a sent buffer, or reusing it for a read, corrupted every round after)."""
    rng = np.random.default_rng(11)
    images = FrameRecordImages()
    shapes = [(4,), (2, 2)]
    del images.encode(RecordKind.HOST_FRAME, frame(rng, shapes), SALT)[:]
    got = check(images, RecordKind.HOST_FRAME, frame(rng, shapes))
    assert len(got) == 1 and got[0].readonly
    with pytest.raises(TypeError):
        got[0][MUX_HEADER_LEN:MUX_HEADER_LEN + 4] = bytes(4)  # the frame's magic
    del got
    for _ in range(2):  # still the image (nothing holds it), still the general bytes
        got = check(images, RecordKind.HOST_FRAME, frame(rng, shapes))
        assert len(got) == 1
        del got


def test_other_salts_ceilings_and_argument_types() -> None:
    rng = np.random.default_rng(6)
    shapes = [(32,), (4, 4)]
    images = FrameRecordImages()
    for _ in range(2):
        for salt in (SALT, OTHER_SALT, bytearray(SALT), memoryview(OTHER_SALT)):
            for ceiling in (DEFAULT_FRAME_CEILING, 1000, 5000):
                got = check(images, RecordKind.BROADCAST, frame(rng, shapes), salt,
                            ceiling=ceiling)
                del got


def test_other_salt_types_keep_no_image() -> None:
    rng = np.random.default_rng(9)
    images = FrameRecordImages()
    for salt in (bytearray(SALT), memoryview(SALT)):
        for _ in range(2):
            got = check(images, RecordKind.BROADCAST, frame(rng, [(8,)]), salt)
            assert len(got) > 1
            del got
    assert images._images == {}


class _CountingExecutor(Executor):
    """Runs each job at once on the calling thread and counts them."""

    def __init__(self) -> None:
        self.jobs = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1
        fut: Future[Any] = Future()
        fut.set_result(fn(*args, **kwargs))
        return fut


def test_a_large_frame_hands_its_second_mac_to_the_executor() -> None:
    rng = np.random.default_rng(10)
    images = FrameRecordImages()
    ex = _CountingExecutor()
    f = frame(rng, [(PARALLEL_MAC_MIN // 4,)])
    for r in range(2):
        got = check(images, RecordKind.BROADCAST, f, mac_executor=ex)
        assert ex.jobs == 2 * (r + 1)  # check() encodes twice (both ways), one job each
        del got


def test_large_frames_take_the_general_encoder() -> None:
    rng = np.random.default_rng(7)
    images = FrameRecordImages()
    n = IMAGE_MAX_PAYLOAD // 4
    for shapes in ([(n,)], [(n + 1,)], [(n // 2,), (n // 2 + 1,)]):
        f = frame(rng, shapes)
        for r in range(2):
            got = check(images, RecordKind.BROADCAST, f)
            big = sum(t.nbytes for t in f.tensors) > IMAGE_MAX_PAYLOAD
            # above the limit the payloads pass through uncopied, as the general encoder's do;
            # at the limit the second round is written into the image
            assert (len(got) > 1) is (big or r == 0)
            if big:
                assert any(p is t.data for t in f.tensors for p in got)
            del got


@pytest.mark.parametrize("dims", [200, 255])
def test_a_frame_of_much_metadata_keeps_no_image(dims: int) -> None:
    """Tiny payloads, many dims: the record's metadata (tensor headers of up to 1,030 bytes,
    65,536 of them at the cap: 67 MB) counts too. 64 tensors of 255 dims, 63 of them elided
    (65,970 bytes besides the payload, above the limit) keep no image, nor their layout key
    with its shapes; 200 dims (51,890 bytes) are within it."""
    shape = (1,) * dims
    images = FrameRecordImages()
    for r in range(2):
        last = TensorPayload(0, shape, np.float32([r + 0.5]).tobytes())
        f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.elide(0, shape)] * 63 + [last])
        got = check(images, RecordKind.BROADCAST, f)
        meta = sum(memoryview(p).nbytes for p in got) - 4
        assert meta == 25 + 17 + 64 * (2 + 4 * dims + 8) + 8
        assert (meta > IMAGE_MAX_METADATA) is (dims == 255)
        assert (len(got) == 1) is (r == 1 and dims == 200)
        del got
    assert len(images._images) == (dims == 200)


@pytest.mark.parametrize("extra", [0, 4])
def test_a_record_of_exactly_image_max_metadata_other_bytes_keeps_its_image(extra: int) -> None:
    """The metadata bound is inclusive: 65 tensors (64 elided) of 16,209 dims in all give a
    record of exactly IMAGE_MAX_METADATA bytes besides its payload (50 + 65 x 10 + 4 x 16,209),
    whose image is kept; one dim more (4 bytes) keeps none."""
    dims = [255] * 63 + [72, 72 + extra // 4]
    images = FrameRecordImages()
    for r in range(2):
        last = TensorPayload(0, (1,) * dims[-1], np.float32([r + 0.5]).tobytes())
        f = RoundFrame(RoundKind.MODEL, 1.0,
                       [TensorPayload.elide(0, (1,) * n) for n in dims[:-1]] + [last])
        got = check(images, RecordKind.BROADCAST, f)
        assert sum(memoryview(p).nbytes for p in got) - 4 == IMAGE_MAX_METADATA + extra
        assert (len(got) == 1) is (r == 1 and extra == 0)
        del got
    assert len(images._images) == (extra == 0)


def _error(fn: Any) -> tuple[type, str | None, dict[str, Any]]:
    with pytest.raises(ProtocolError) as ei:
        fn()
    return type(ei.value), ei.value.error_id, dict(ei.value.fields)


@pytest.mark.parametrize("args", [
    (RecordKind.DATA, SALT, DEFAULT_FRAME_CEILING),
    (RecordKind.CONTROL, SALT, DEFAULT_FRAME_CEILING),
    (RecordKind.BROADCAST, SALT[:15], DEFAULT_FRAME_CEILING),
    (RecordKind.BROADCAST, SALT, 100),
    (RecordKind.BROADCAST, SALT, -1),
    (RecordKind.BROADCAST, SALT, np.int64(5000)),
    (RecordKind.BROADCAST, SALT, True),
    (4.0, SALT, DEFAULT_FRAME_CEILING),  # a float kind equal to BROADCAST: refused, image or not
    (np.float64(3.0), SALT, DEFAULT_FRAME_CEILING),
])
def test_errors_are_the_general_encoders(args: tuple[Any, Any, Any]) -> None:
    kind, salt, ceiling = args
    rng = np.random.default_rng(8)
    f = frame(rng, [(32,), (4,)])
    images = FrameRecordImages()
    for _ in range(2):  # with and without an image of the layout (its own arguments)
        want = _error(lambda: encode_frame_record(kind, f, salt, ceiling=ceiling))
        assert _error(lambda: images.encode(kind, f, salt, ceiling=ceiling)) == want
        del images.encode(RecordKind.BROADCAST, f, SALT)[:]


# -- the controller core's Broadcasts --------------------------------------------------------
def _host_frame(f: RoundFrame) -> bytes:
    return wire(encode_frame_record(RecordKind.HOST_FRAME, f, SALT))


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("relays", [1, 2])
def test_core_broadcasts_equal_the_general_encoding(version: int, relays: int) -> None:
    rng = np.random.default_rng(version * 10 + relays)
    core = ControllerCore(2 * relays, SALT, version=version)
    core.start()
    for c in range(relays):
        core.connection_opened(c, 0.0)
        core.receive_data(c, encode_channel_magic("data") + encode_mux_record_bytes(
            MuxRecord.control_msg(Hello(f"h{c}", [2 * c, 2 * c + 1]), version), SALT))
    plan: list[tuple[list[tuple[int, ...]], int, RoundKind, tuple[int, ...], bool]] = [
        ([(256,)] * 4, 0, RoundKind.MODEL, (), False),
        ([(256,)] * 4, 0, RoundKind.MODEL, (), True),
        ([(256,)] * 4, 0, RoundKind.CONTROL, (), False),
        ([(512,)] * 4, 1, RoundKind.MODEL, (), True),
        ([(512,)] * 4, 1, RoundKind.MODEL, (), False),
        ([(256,)] * 4, 0, RoundKind.MODEL, (), False),
        ([(8, 8), (3,)], 0, RoundKind.MODEL, (), False),
        ([(16384,)], 0, RoundKind.MODEL, (), False),  # 64 KiB: the image's largest
        ([(16385,)], 0, RoundKind.MODEL, (), False),  # above it: the general encoder
    ]
    if version == 3:
        plan += [([(64,), (32,)], 1, RoundKind.MODEL, (1,), False)] * 2
    held: list[tuple[bytes, tuple[Any, ...]]] = []
    for shapes, dtype, kind, elided, special in plan * 2:
        frames = [frame(rng, shapes, dtype, kind=kind, elided=elided if c == 0 else (),
                        special=special, weight=float(c + 1)) for c in range(relays)]
        acts: list[Any] = []
        for c, f in enumerate(frames):
            acts += core.receive_data(c, _host_frame(f))
        sends = [a for a in acts if isinstance(a, SendTo) and a.kind is SendKind.BROADCAST]
        assert len(sends) == relays
        want = wire(encode_frame_record(RecordKind.BROADCAST,
                                        reduce_realized_work(frames, version=version), SALT))
        for s in sends:
            assert wire(s.buffers) == want and s.nbytes == len(want)
        if special:  # a writer still holding a Broadcast: its bytes stay as they were
            held.append((want, sends[0].buffers))
        for w, bufs in held:
            assert wire(bufs) == w
    assert core.rounds == len(plan) * 2

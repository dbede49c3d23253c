"""The top-level package exports a narrow, documented surface: the message types, one encoder and
one decoder per wire message, the error classes and the protocol-version constants. Everything
else comes from its module (``flodl_proto.codec``, ``flodl_proto.spec``, ...)."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flodl_proto
from flodl_proto import codec, errors
from flodl_proto.spec import SPEC

README = Path(__file__).resolve().parent.parent / "README.md"

#: each message of spec/wire.yaml -> its top-level encoder and decoder
PER_MESSAGE = {
    "handshake": ("encode_handshake", "decode_handshake"),
    "handshake_ack": ("encode_ack", "decode_ack"),
    "channel_magic": ("encode_channel_magic", "expect_channel_magic"),
    "round_frame": ("encode_round_frame_bytes", "decode_round_frame"),
    "len_framed": ("encode_len_framed", "decode_len_framed"),
    "mux_record": ("encode_mux_record_bytes", "decode_mux_record"),
    "relay_control_msg": ("encode_control", "decode_control"),
}
MESSAGE_TYPES = {"ControlMessage", "DeclareDead", "Dtype", "Handshake", "Hello", "HelloAck",
                 "MuxRecord", "RankExit", "RecordKind", "RoundFrame", "RoundKind",
                 "TensorPayload"}
ERRORS = {"AuthenticationError", "BadMagic", "InvalidValue", "LimitExceeded",
          "LocalProtocolError", "ProtocolError", "RemoteProtocolError", "SchemaMismatch",
          "SequenceError", "TruncatedInput", "VersionMismatch"}
VERSIONS = {"DEFAULT_VERSION", "SUPPORTED_VERSIONS"}


def test_root_all_is_exactly_the_narrow_list() -> None:
    codecs = {name for pair in PER_MESSAGE.values() for name in pair}
    assert set(PER_MESSAGE) == set(SPEC.raw["messages"])
    assert set(flodl_proto.__all__) == MESSAGE_TYPES | codecs | ERRORS | VERSIONS | {
        "__version__"}
    assert len(flodl_proto.__all__) == len(set(flodl_proto.__all__))


def test_root_names_are_the_modules_objects() -> None:
    for name in MESSAGE_TYPES | {n for pair in PER_MESSAGE.values() for n in pair}:
        assert getattr(flodl_proto, name) is getattr(codec, name), name
    for name in ERRORS:
        assert getattr(flodl_proto, name) is getattr(errors, name), name
    assert flodl_proto.DEFAULT_VERSION in flodl_proto.SUPPORTED_VERSIONS


def test_the_rest_of_the_codec_is_not_at_the_top_level() -> None:
    for name in ("END_OF_STREAM", "NeedData", "MuxStream", "encode_round_frame",
                 "encode_frame_record", "decode_round_frame_or_eos", "parse_mux_header"):
        assert hasattr(codec, name), name
        assert not hasattr(flodl_proto, name), name


def test_the_mux_streams_events_come_from_the_codec() -> None:
    """``MuxStream.feed`` returns these events: a tool that tells them apart imports them
    where it imports the stream."""
    from flodl_proto.codec import stream

    for name in ("MagicReceived", "RecordReceived", "StreamEnded", "StreamFailed",
                 "StreamEvent"):
        assert name in codec.__all__, name
        assert getattr(codec, name) is getattr(stream, name), name
    events = codec.MuxStream(bytes(16)).feed(codec.encode_channel_magic("data"))
    assert isinstance(events[0], codec.MagicReceived)


def test_every_public_callable_has_a_docstring() -> None:
    for name in flodl_proto.__all__:
        obj = getattr(flodl_proto, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), name


def test_readme_lists_the_top_level() -> None:
    text = README.read_text()
    start = text.index("* `flodl_proto` — the narrow top level")
    bullet = text[start:text.index("\n* ", start + 1)]
    listed = set(re.findall(r"`([A-Za-z_]+)`", bullet)) - {"flodl_proto", "__all__"}
    assert listed == set(flodl_proto.__all__) - {"__version__"}


#: run in a fresh interpreter: what a bare ``import flodl_proto`` imports, then every name
_LAZY_ROOT = """
import sys
import flodl_proto
heavy = ("numpy", "ml_dtypes", "flodl_proto.codec", "flodl_proto.errors", "flodl_proto.spec")
print(*sorted(m for m in heavy if m in sys.modules))
print(sorted(set(flodl_proto.__all__) - set(dir(flodl_proto))))
print(flodl_proto.fsm.__name__, flodl_proto.runner.stages.__name__)
from flodl_proto import *
print(encode_ack.__module__, InvalidValue.__module__, DEFAULT_VERSION in SUPPORTED_VERSIONS)
try:
    flodl_proto.END_OF_STREAM
except AttributeError as e:
    print(e)
"""


def test_import_is_lazy_and_every_name_resolves() -> None:
    """``import flodl_proto`` imports neither NumPy nor the codec; a name of ``__all__`` (or a
    submodule reached as an attribute) is imported when first used, and ``import *`` gives them
    all."""
    res = subprocess.run([sys.executable, "-c", _LAZY_ROOT], capture_output=True, text=True,
                         timeout=120, check=True)
    assert res.stdout.splitlines() == [
        "",
        "[]",
        "flodl_proto.fsm flodl_proto.runner.stages",
        "flodl_proto.codec.handshake flodl_proto.errors True",
        "module 'flodl_proto' has no attribute 'END_OF_STREAM'",
    ]


#: run in a fresh interpreter: what a demo rank's process imports, then the runner's names
_LAZY_RUNNER = """
import sys
import flodl_proto.commands._demo_worker
import flodl_proto.runner as runner
heavy = ("statemachine", "flodl_proto.fsm", "flodl_proto.runner.controller",
         "flodl_proto.runner.relay", "flodl_proto.runner.rank", "ml_dtypes")
print(*sorted(m for m in heavy if m in sys.modules))
print(sorted(set(runner.__all__) - set(dir(runner))), runner.stages.__name__)
print(*sorted(getattr(runner, name).__module__ for name in runner.__all__))
"""


def test_a_rank_process_imports_no_controller_and_every_runner_name_resolves() -> None:
    """A demo rank imports the rank client only, not the controller, the relay and the lifecycle
    machines (python-statemachine) behind them; each name of ``flodl_proto.runner`` is imported
    from its module when first used, and its submodules are reached as attributes."""
    res = subprocess.run([sys.executable, "-c", _LAZY_RUNNER], capture_output=True, text=True,
                         timeout=120, check=True)
    assert res.stdout.splitlines() == [
        "flodl_proto.runner.rank",
        "[] flodl_proto.runner.stages",
        " ".join(["flodl_proto.runner.controller"] + ["flodl_proto.runner.rank"] * 3
                 + ["flodl_proto.runner.relay"] * 3 + ["flodl_proto.runner.reports"]),
    ]


@pytest.mark.parametrize("name", ["a.b", "codec.nothing", "no-such", "", "END_OF_STREAM"])
def test_a_name_that_is_no_attribute_is_attribute_error(name: str) -> None:
    # getattr/hasattr rely on AttributeError; a dotted name once raised ModuleNotFoundError
    assert not hasattr(flodl_proto, name)
    message = f"module 'flodl_proto' has no attribute {name!r}"
    with pytest.raises(AttributeError, match=re.escape(message)):
        getattr(flodl_proto, name)


@pytest.mark.parametrize("package", [
    "flodl_proto", "flodl_proto.codec", "flodl_proto.codec.mux", "flodl_proto.codec.round_frame",
    "flodl_proto.errors", "flodl_proto.fsm", "flodl_proto.reduce", "flodl_proto.reduce.fold",
    "flodl_proto.runner", "flodl_proto.runner.rank"])
def test_every_public_class_and_function_names_a_public_module(package: str) -> None:
    """``help()``, pydoc and pickle name a class or function by its ``__module__``: for every
    one of a public module's ``__all__``, that is a public module (no ``_private`` part), and
    the name is found there. Code moved into a private module (``codec/_common.py``,
    ``reduce/_kernels.py``, ``reduce/_pool.py``, ``runner/_rank_payloads.py``) named it."""
    mod = importlib.import_module(package)
    wrong = {}
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        home = obj.__module__
        if any(part.startswith("_") for part in home.split(".")) \
                or getattr(importlib.import_module(home), obj.__qualname__, None) is not obj:
            wrong[name] = home
    assert wrong == {}


def test_the_len_framed_pair_round_trips_as_the_readme_says() -> None:
    # encode_len_framed returns the buffer list for sendmsg; joined, it is the decoder's input
    pieces = flodl_proto.encode_len_framed(b"abc")
    assert [bytes(p) for p in pieces] == [b"\x03\x00\x00\x00", b"abc"]
    blob, used = flodl_proto.decode_len_framed(b"".join(pieces))
    assert (bytes(blob), used) == (b"abc", 7)
    # the list itself is refused with the hint to join it
    with pytest.raises(flodl_proto.LocalProtocolError) as ei:
        flodl_proto.decode_len_framed(pieces)  # type: ignore[arg-type]
    assert str(ei.value) == ("data must be a contiguous bytes-like object (bytes, bytearray or "
                             "memoryview), got list (join a buffer list, as the encoders for "
                             'sendmsg return, with b"".join)')
    assert ei.value.error_id == "codec.not_bytes_like"
    # where pieces are taken, a bad piece is named, with no such hint
    with pytest.raises(flodl_proto.LocalProtocolError,
                       match=r"^blob\[0\] must be .*, got None$"):
        flodl_proto.encode_len_framed([None])  # type: ignore[list-item]


def _raises_section(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    assert "Raises:" in doc, obj
    return doc.split("Raises:", 1)[1].split("Upstream:", 1)[0]


@pytest.mark.parametrize(("name", "call"), [
    ("decode_control", lambda: flodl_proto.decode_control("00")),
    ("decode_control", lambda: flodl_proto.decode_control(b"\x01", 9)),
    ("decode_len_framed", lambda: flodl_proto.decode_len_framed([0, 0, 0, 0])),
    ("decode_len_framed", lambda: flodl_proto.decode_len_framed(bytes(4), ceiling=-1)),
    ("RankExit", lambda: flodl_proto.RankExit(-1)),
    ("DeclareDead", lambda: flodl_proto.DeclareDead(2 ** 32)),
])
def test_a_local_misuse_is_in_the_raises_section(name: str, call: object) -> None:
    # help() on the name tells what a caller's mistake raises: its class and error id
    with pytest.raises(errors.LocalProtocolError) as ei:
        call()  # type: ignore[operator]
    section = _raises_section(getattr(flodl_proto, name))
    assert ei.value.error_id in section, (name, ei.value.error_id)
    assert "(local)" in section and type(ei.value).__mro__[1].__name__ in section


@pytest.mark.parametrize(("obj", "call"), [
    (codec.MuxRecord.data, lambda: codec.MuxRecord.data(-1, b"")),
    (codec.MuxRecord.data, lambda: codec.MuxRecord.data(0, "ab")),
    (codec.MuxRecord.control_msg, lambda: codec.MuxRecord.control_msg("Hello")),
    (codec.MuxRecord.control_msg, lambda: codec.MuxRecord.control_msg(codec.HelloAck(), 9)),
    (codec.MuxRecord.host_frame, lambda: codec.MuxRecord.host_frame(codec.RoundFrame())),
    (codec.MuxRecord.broadcast, lambda: codec.MuxRecord.broadcast(None)),
    (codec.TensorPayload.elide, lambda: codec.TensorPayload.elide(0, [-1])),
])
def test_a_builders_local_misuse_is_in_its_raises_section(obj: object, call: object) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        call()  # type: ignore[operator]
    section = _raises_section(obj)
    assert ei.value.error_id in section and "(local)" in section, (obj, ei.value.error_id)


@pytest.mark.parametrize(("obj", "call"), [
    (codec.LenFramedDecoder, lambda: codec.LenFramedDecoder(ceiling=-1)),
    (codec.RoundFrameDecoder, lambda: codec.RoundFrameDecoder(bytes(16), ceiling=1.5)),
    (codec.RoundFrameDecoder.feed, lambda: codec.RoundFrameDecoder(bytes(16)).feed([1, 2])),
    (codec.LenFramedDecoder.feed, lambda: codec.LenFramedDecoder().feed("ab")),
])
def test_a_stream_decoders_local_misuse_is_in_its_raises_section(obj: object,
                                                                 call: object) -> None:
    with pytest.raises(errors.LocalProtocolError) as ei:
        call()  # type: ignore[operator]
    section = _raises_section(obj)
    assert ei.value.error_id in section and "(local)" in section, (obj, ei.value.error_id)

"""The worked examples of the spec checked against the codec by ``flodl-proto docs``
(:mod:`flodl_proto.commands._docs_examples`): an example whose bytes the codec refuses, reads
in part, or writes otherwise, or whose tag is not the HMAC it states, is one line and no
document, where ``docs`` documented it with exit 0 (only the test suite compared the shipped
examples with the golden vectors)."""

from __future__ import annotations

import copy
import hashlib
import hmac
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.commands._docs_examples import check_examples
from flodl_proto.spec import SPEC, SpecError

ROOT = Path(__file__).resolve().parent.parent
ZERO = bytes(16)


def _examples() -> dict[str, Any]:
    return copy.deepcopy(dict(SPEC.raw["examples"]))


def _field(ex: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in ex["fields"] if f["field"] == name)


def _retag(ex: dict[str, Any]) -> None:
    """Write each tag of ``ex`` again over its bytes as they are now (salt: ``ex``'s)."""
    for tag in ex["tags"]:  # in order: a frame's tag before the record's that covers it
        data = bytes.fromhex("".join(f["bytes"] for f in ex["fields"]))
        mac = hmac.new(bytes.fromhex(ex["salt"]), b"".join(data[a:b] for a, b in tag["covers"]),
                       hashlib.sha256).digest()
        tag["hmac"] = mac.hex()
        _field(ex, tag["field"])["bytes"] = mac[:8].hex(" ")


def test_the_shipped_examples_pass() -> None:
    check_examples(SPEC.raw["examples"], SPEC.default_version)


def _data_byte(exs: dict[str, Any]) -> None:  # a byte changed, the tag left as it was
    _field(exs["round_frame_f32"], "tensor[0].data")["bytes"] = (
        "00 00 80 40 00 00 20 c0 00 00 00 00 00 00 50 40")


def _tag_bytes(exs: dict[str, Any]) -> None:  # the tag's bytes alone changed
    _field(exs["round_frame_f32"], "auth_tag")["bytes"] = "39 a5 87 85 a0 3c 12 d2"


def _magic(exs: dict[str, Any]) -> None:
    _field(exs["handshake_v2"], "magic")["bytes"] = "c0 17 0d f2"


def _trailing(exs: dict[str, Any]) -> None:
    exs["handshake_v2"]["fields"].append({"bytes": "00", "field": "extra", "value": "0"})


def _rank_of_control(exs: dict[str, Any]) -> None:  # a rank the reader ignores, retagged
    _field(exs["hello_v2"], "rank")["bytes"] = "05 00 00 00"
    _retag(exs["hello_v2"])


def _not_hex(exs: dict[str, Any]) -> None:
    _field(exs["handshake_ack_v2"], "version")["bytes"] = "02 00 00 0g"


def _tags_without_salt(exs: dict[str, Any]) -> None:  # its tag then checked with zero bytes
    exs["framed_round"]["salt"] = None


def _no_decoder(exs: dict[str, Any]) -> None:  # a message of a spec the codec does not know
    exs["handshake_v2"]["message"] = "handshake_v9"


def _inner_frame(exs: dict[str, Any]) -> None:  # the HostFrame's frame of no kind, retagged
    _field(exs["hostframe"], "payload.kind")["bytes"] = "07"
    _retag(exs["hostframe"])


def _salt_text(exs: dict[str, Any]) -> None:
    exs["handshake_v2"]["salt"] = "00"


CASES: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (_data_byte, "example round_frame_f32: tag auth_tag: the HMAC over bytes [[0, 47]] is "
     "7783ee273a18216abfa553f78724ffaec84faf546f50570349fad0fea0ead62e, not the example's "
     "39a58785a03c12d1235d28508149c966b1b51ab56159b333bef4e6749a46b25f"),
    (_tag_bytes, "example round_frame_f32: tag auth_tag: the field's bytes are 39 a5 87 85 a0 "
     "3c 12 d2, not the HMAC's first 8 (39 a5 87 85 a0 3c 12 d1)"),
    (_magic, "example handshake_v2: the codec refuses its bytes: cluster_controller: handshake "
     "magic 0xf20d17c0 != 0xf10d17c0"),
    (_trailing, "example handshake_v2: the codec reads one message of 16 bytes, not its 17 "
     "bytes"),
    (_rank_of_control, "example hello_v2: encoded again, byte 9 is 0x00, not the example's "
     "0x05 (the codec writes what it decodes so)"),
    (_not_hex, "example handshake_ack_v2: field version: bytes '02 00 00 0g' are not hex (two "
     "digits a byte)"),
    (_inner_frame, "example hostframe: the codec refuses its bytes: cluster_controller: unknown "
     "RoundKind wire byte 7"),
    (_salt_text, "example handshake_v2: salt '00' is not 16 bytes written as 32 hex digits"),
    (_no_decoder, "example handshake_v2: message 'handshake_v9' has no decoder in the codec"),
    (_tags_without_salt, "example framed_round: salt is null, which means a message without a "
     "tag, but it has tags (body.auth_tag)"),
]


@pytest.mark.parametrize(("change", "line"), CASES, ids=[c[0].__name__ for c in CASES])
def test_an_example_other_than_the_codec_is_one_line(
        change: Callable[[dict[str, Any]], None], line: str) -> None:
    exs = _examples()
    change(exs)
    with pytest.raises(SpecError) as info:
        check_examples(exs, SPEC.default_version)
    assert str(info.value) == f"wire.yaml: {line}"


BAD_MAGIC = ('      - {bytes: "c0 17 0d f1", field: magic, value: "0xF10D17C0 = '
             'HANDSHAKE_MAGIC_RANK"}\n      - {bytes: "02 00 00 00", field: version')
REFUSED = ("wire.yaml: example handshake_v2: the codec refuses its bytes: cluster_controller: "
           "handshake magic 0xf20d17c0 != 0xf10d17c0")


def _spec_with_a_bad_example(folder: Path) -> None:
    shutil.copytree(ROOT / "spec", folder)
    wire = folder / "wire.yaml"
    text = wire.read_text(encoding="utf-8")
    assert text.count(BAD_MAGIC) == 1
    wire.write_text(text.replace(BAD_MAGIC, BAD_MAGIC.replace("c0 17 0d f1", "c0 17 0d f2")),
                    encoding="utf-8")


@pytest.mark.parametrize("way", ["checkout", "variable", "option"])
def test_docs_refuses_an_example_the_codec_refuses(way: str, tmp_path: Path) -> None:
    """``docs --check`` of the spec the codec runs on (an editable checkout's, the package's,
    ``FLODL_PROTO_SPEC_DIR``'s) refuses an example the codec refuses, in the words and with the
    exit code of a spec that fails to load (1 for the checkout's, 2 for one the user named),
    where only the test suite compared the shipped examples with the golden vectors. One of
    ``--spec DIR``, which the codec does not run on (its constants may differ), is documented
    as written, as ``docs`` without ``--check`` documents any (it loads no codec)."""
    env = {k: v for k, v in os.environ.items() if k != "FLODL_PROTO_SPEC_DIR"}
    if way == "checkout":  # a copy of the checkout: its package runs on its spec
        root = tmp_path / "co"
        shutil.copytree(ROOT / "flodl_proto", root / "flodl_proto",
                        ignore=shutil.ignore_patterns("__pycache__"))
        _spec_with_a_bad_example(root / "spec")
        args, code, line = ["--check"], 1, f"spec folder {root / 'spec'}: {REFUSED}"
    else:
        root = tmp_path
        _spec_with_a_bad_example(tmp_path / "spec")
        if way == "variable":
            env["FLODL_PROTO_SPEC_DIR"] = str(tmp_path / "spec")
            args, code = ["--check"], 2
            line = f"FLODL_PROTO_SPEC_DIR={tmp_path / 'spec'}: {REFUSED}"
        else:
            args, code, line = ["--spec", str(tmp_path / "spec")], 0, ""
        env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "flodl_proto", "docs", "--out", "p.md", *args],
                          env=env, cwd=root, capture_output=True, text=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stderr) == (
        code, f"flodl-proto docs: error: {line}\n" if line else ""), done.stderr
    assert (root / "p.md").exists() == (code == 0)


def test_a_tag_is_the_hmacs_first_auth_tag_len_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check reads a tag's length from the spec (``AUTH_TAG_LEN``), as the codec does,
    where it wrote 8 by hand: under a spec of 4-byte tags the field holding the HMAC's first 4
    bytes is the tag, and a refused one is named by its first 4."""
    from flodl_proto.commands import _docs_examples

    monkeypatch.setattr(_docs_examples, "AUTH_TAG_LEN", 4)
    body = bytes(range(16))
    mac = hmac.new(ZERO, body, hashlib.sha256).digest()
    tag = {"field": "auth_tag", "covers": [[4, 20]], "hmac": mac.hex()}
    spans = {"auth_tag": range(0, 4)}
    _docs_examples._check_tag(tag, mac[:4] + body, spans, ZERO, "t")
    with pytest.raises(SpecError) as info:
        _docs_examples._check_tag(tag, bytes(4) + body, spans, ZERO, "t")
    assert str(info.value) == (f"t: the field's bytes are 00 00 00 00, not the HMAC's first 4 "
                               f"({mac[:4].hex(' ')})")

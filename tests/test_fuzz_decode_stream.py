"""The ``decode_stream`` fuzz target's oracle fails where it should: a decoder that loses a
record, misplaces its stop, or passes a bad tag as ``ok`` is a ``Finding`` naming what it saw
(the real decoder passes the same inputs; its corpus is replayed by ``test_fuzz_corpus.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flodl_proto import decode
from flodl_proto.codec import Hello, MuxRecord, encode_channel_magic, encode_mux_record_bytes
from fuzz.harnesses import decode_stream as harness
from fuzz.harnesses.common import SALTS, Finding

SALT = SALTS[0]
HELLO = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h0", [0, 1]), version=2), SALT)
#: flags: the mux leg (1), tags checked (4), the zero salt; options: version 2
MUX_V2 = bytes((0x05, 0x01))


def _bad_tag(record: bytes) -> bytes:
    """``record`` with the last byte of its tag (header bytes 17..24) flipped."""
    return record[:24] + bytes((record[24] ^ 1,)) + record[25:]


def _patched(monkeypatch: pytest.MonkeyPatch,
             edit: Callable[[decode.DecodeReport], None],
             edit_record: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Make the harness's ``decode_stream`` the real one with ``edit_record`` applied to each
    record (kept or handed to ``on_record``), then ``edit`` to the report."""
    real = decode.decode_stream

    def broken(*args: Any, on_record: Callable[[dict[str, Any]], None] | None = None,
               **kwargs: Any) -> decode.DecodeReport:
        def hand(rec: dict[str, Any]) -> None:
            if edit_record is not None:
                edit_record(rec)
            assert on_record is not None
            on_record(rec)

        report = real(*args, on_record=hand if on_record is not None else None, **kwargs)
        if edit_record is not None:
            for rec in report.records:
                edit_record(rec)
        edit(report)
        return report

    monkeypatch.setattr(harness, "decode_stream", broken)


@pytest.mark.parametrize("wire", [
    encode_channel_magic("data") + HELLO + HELLO,
    encode_channel_magic("data") + HELLO + _bad_tag(HELLO),
    HELLO + HELLO[:30],
])
def test_the_real_decoder_passes(wire: bytes) -> None:
    harness.test_one_input(MUX_V2 + wire)


def test_a_lost_record_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def lose_last(report: decode.DecodeReport) -> None:
        report.records.pop()
        report.count -= 1

    _patched(monkeypatch, lose_last)
    with pytest.raises(Finding) as e:
        harness.test_one_input(MUX_V2 + HELLO + HELLO)
    assert str(e.value) == f"end {2 * len(HELLO)}, the records end at {len(HELLO)} of " \
                           f"{2 * len(HELLO)}"


def test_a_stop_away_from_the_last_record_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop_early(report: decode.DecodeReport) -> None:
        assert report.failure is not None
        report.failure = decode.DecodeFailure(0, report.failure.message, report.failure.kind,
                                              report.failure.error_id, True)

    _patched(monkeypatch, stop_early)
    with pytest.raises(Finding) as e:
        harness.test_one_input(MUX_V2 + HELLO + HELLO[:30])
    assert str(e.value) == f"stopped at 0, the records end at {len(HELLO)}"


def test_a_bad_tag_shown_as_ok_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_bad_tag(report: decode.DecodeReport) -> None:
        report.bad_tags = 0

    def ok(rec: dict[str, Any]) -> None:
        rec["tag_status"] = "ok"

    _patched(monkeypatch, no_bad_tag, ok)
    with pytest.raises(Finding) as e:
        harness.test_one_input(MUX_V2 + HELLO + _bad_tag(HELLO))
    assert str(e.value) == ("mux leg: a clean report of 2 records; the codec read 1 and not "
                            "all bytes")


def test_unchecked_tags_with_a_salt_are_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def unchecked(report: decode.DecodeReport) -> None:
        report.records[0]["tag_status"] = "unchecked"

    _patched(monkeypatch, unchecked)
    with pytest.raises(Finding) as e:
        harness.test_one_input(MUX_V2 + HELLO)
    assert str(e.value) == "record 0: tag 'unchecked' with salt True"


def test_a_record_above_the_ceiling_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def huge(rec: dict[str, Any]) -> None:
        rec["payload_len"] = (1 << 30) + 1

    _patched(monkeypatch, lambda report: None, huge)
    with pytest.raises(Finding) as e:
        harness.test_one_input(MUX_V2 + HELLO)
    assert str(e.value) == ("record 0: a mux_record of payload_len 1073741825 above the ceiling "
                            "1073741824")

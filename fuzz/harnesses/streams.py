"""The oracle shared by the stream targets: drive an incremental decoder with chunks of
fuzzer-chosen sizes and compare it with the one-shot reader applied record after record.

Input layout of every stream target: ``flags u8 | n u8 | n chunk sizes (u8 each, n taken modulo
33; 0 feeds an empty chunk) | stream bytes``; no sizes feeds everything at once, the sizes
otherwise repeat until the bytes run out.

Oracle: the same records and the same final outcome (clean END_OF_STREAM, or the same
RemoteProtocolError with the same message) whatever the split; a record never completes before
the bytes a ``NeedData`` asked for have arrived; ``NeedData`` asks for at least one byte and never
comes after end of input; errors are sticky (the same object is raised again, and bytes fed
after one are accepted and ignored); END_OF_STREAM is repeated once reached; feeding after
``feed_eof`` is a LocalProtocolError (the caller's fault).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from flodl_proto.codec import END_OF_STREAM, NeedData
from flodl_proto.errors import LocalProtocolError, ProtocolError, RemoteProtocolError

from .common import Finding, Params, check, chunks, outcome_of


class Decoder(Protocol):
    """The incremental decoder interface the stream oracle drives."""

    consumed: int

    def feed(self, data: bytes) -> None:
        """Append bytes."""

    def feed_eof(self) -> None:
        """Signal end of input."""

    def next_event(self) -> Any:
        """Next record, NeedData or END_OF_STREAM."""


#: one-shot reference: bytes -> (records, final error or None, bytes consumed by whole records)
Reference = Callable[[bytes], tuple[list[Any], ProtocolError | None, int]]


def split_input(data: bytes) -> tuple[int, bytes, bytes]:
    """``(flags, chunk sizes, stream bytes)`` of a stream-target input."""
    p = Params(data)
    flags = p.u8()
    sizes = p.take(p.u8() % 33)
    return flags, sizes, p.rest()


def drive(dec: Decoder, payload: bytes, sizes: bytes) -> tuple[list[Any], ProtocolError | None]:
    """Feed ``payload`` in chunks, then end of input; return the records and the final error."""
    records: list[Any] = []
    state: dict[str, Any] = {"fed": 0, "earliest": 0, "eof": False, "error": None, "eos": False}

    def drain() -> None:
        while True:
            try:
                ev = dec.next_event()
            except RemoteProtocolError as e:
                state["error"] = e
                return
            except LocalProtocolError as e:
                raise Finding(f"next_event raised a LocalProtocolError: {e!r}") from e
            if isinstance(ev, NeedData):
                check(not state["eof"], f"NeedData({ev.nbytes}) after end of input")
                check(ev.nbytes >= 1, f"NeedData({ev.nbytes})")
                state["earliest"] = state["fed"] + ev.nbytes
                return
            if ev is END_OF_STREAM:
                check(state["eof"], "END_OF_STREAM before end of input")
                state["eos"] = True
                return
            check(state["fed"] >= state["earliest"],
                  f"a record completed after {state['fed']} bytes; NeedData promised "
                  f"{state['earliest']}")
            records.append(ev)

    for chunk in chunks(payload, sizes):
        if state["error"] is not None:
            # a sans-IO caller may still hand over bytes it received before it saw the error:
            # they are accepted (and ignored), the error stays
            dec.feed(chunk)
            break
        dec.feed(chunk)
        state["fed"] += len(chunk)
        drain()
    if state["error"] is None:
        dec.feed_eof()
        state["eof"] = True
        drain()
        check(state["error"] is not None or state["eos"], "no outcome after end of input")
    error = state["error"]
    if error is not None:
        try:
            dec.next_event()
        except ProtocolError as again:
            check(again is error, f"error not sticky: {error!r} then {again!r}")
        else:
            raise Finding(f"error not sticky: {error!r} then no error")
    else:
        check(dec.next_event() is END_OF_STREAM, "END_OF_STREAM not repeated")
    if state["eof"]:
        try:
            dec.feed(b"\0")
        except LocalProtocolError:
            pass
        else:
            raise Finding("feed after feed_eof was accepted")
    return records, error


def check_stream(dec: Decoder, payload: bytes, sizes: bytes, reference: Reference,
                 same: Callable[[Any, Any], bool] = lambda a, b: bool(a == b)) -> None:
    """Drive ``dec`` and compare records, outcome and consumed count with ``reference``."""
    records, error = drive(dec, payload, sizes)
    want, want_error, want_consumed = reference(payload)
    check(outcome_of(error) == outcome_of(want_error),
          f"stream ended with {error!r}, one-shot reader with {want_error!r}")
    check(len(records) == len(want) and all(same(a, b) for a, b in zip(records, want, strict=True)),
          f"stream gave {len(records)} records, one-shot reader {len(want)} (or they differ)")
    if error is None:  # after an error ``consumed`` may include the rejected record
        check(dec.consumed == want_consumed,
              f"stream consumed {dec.consumed}, one-shot reader {want_consumed}")

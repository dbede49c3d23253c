"""errors: how a message shows a value (:func:`flodl_proto.errors.shown`)."""

from __future__ import annotations

import fractions
from decimal import Decimal

import numpy as np
import pytest

from flodl_proto.errors import protocol_error, shown

F = fractions.Fraction


@pytest.mark.parametrize(("value", "text"), [
    (F(10**400), "<a Fraction of 1329 bits over 1 bit>"),
    (-F(10**400), "<a negative Fraction of 1329 bits over 1 bit>"),
    (F(10**400, 3), "<a Fraction of 1329 bits over 2 bits>"),
    (F(1, 10**400), "<a Fraction of 1 bit over 1329 bits>"),
    (F(10**5000 + 1, 10**5000), "<a Fraction of 16610 bits over 16610 bits>"),
], ids=["10**400", "-10**400", "10**400/3", "1/10**400", "5001-digits"])
def test_a_fraction_of_many_digits_is_shown_by_its_size(value: F, text: str) -> None:
    """A Fraction past the float range was shown whole (hundreds of digits), one of more than
    4300 digits raised Python's ValueError ('Exceeds the limit (4300 digits) ...'); it is
    shown by the sizes of its numerator and denominator, as a wide integer is by its size."""
    assert shown(value) == text
    err = protocol_error("controller.bad_argument", field="mass", value=value, reason="r")
    assert str(err) == f"cluster_controller: mass = {text} is invalid: r"
    assert err.fields["value"] == value


@pytest.mark.parametrize(("value", "text"), [
    (F(1, 3), "Fraction(1, 3)"),
    (F(10**80 - 1, 10**80 - 2), f"Fraction({10**80 - 1}, {10**80 - 2})"),  # 80 digits each
    (10**80 - 1, str(10**80 - 1)),
    (10**80, "<an integer of 266 bits>"),
])
def test_a_value_of_80_digits_or_fewer_is_shown_whole(value: object, text: str) -> None:
    assert shown(value) == text


@pytest.mark.parametrize(("nbytes", "text"), [
    (1, "1 byte"), (np.int64(1), "1 byte"), (F(1), "1 byte"), (Decimal(1), "1 byte"),
    ("1", "1 byte"), (True, "True bytes"), (np.bool_(True), "True bytes"),
    (1.0, "1.0 bytes"), (np.float64(1.0), "1.0 bytes"), (Decimal("1.0"), "1.0 bytes"),
])
def test_a_noun_is_singular_only_after_a_field_that_reads_1(nbytes: object, text: str) -> None:
    """The noun agrees with the number as the message writes it: a NumPy bool read 'True byte'
    (a Python bool was excluded, NumPy's was not), a float '1.0 byte' and a text '1 bytes'."""
    err = protocol_error("stream.fed_after_eof", nbytes=nbytes)
    assert str(err) == f"stream decoder: {text} fed after the end of stream was signalled"


@pytest.mark.parametrize(("need", "text"), [(0, "0 more bytes"), (1, "1 more byte"),
                                            (2, "2 more bytes"), (10**80, "<an integer of 266 "
                                                                          "bits> more bytes")])
def test_a_noun_marked_plural_agrees_with_the_number_before_it(need: int, text: str) -> None:
    """A template's 'byte(s)' is 'byte' after a field of 1, 'bytes' after any other value
    ('1 more bytes needed' was the message for one missing byte)."""
    err = protocol_error("bincode.unexpected_end", field="f", offset=3, need=need)
    assert str(err) == ("relay_mux: bincode decode failed: io error: unexpected end of file "
                        f"(reading f at offset 3, {text} needed)")
    assert err.fields == {"field": "f", "offset": 3, "need": need}

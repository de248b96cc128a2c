"""nndx.views.text.num: one way to print a number, and it never raises."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from nndx.views.text import num, value_text


def test_num_prints_non_finite_missing_and_booleans_one_way():
    assert [num(math.nan), num(math.inf), num(-math.inf), num(None), num(True), num(False)] == [
        "NaN", "inf", "-inf", "—", "yes", "no"]  # fmt: skip
    assert num(-0.0) == "0" and num(0) == "0"


def test_num_uses_four_significant_digits_and_a_short_exponent():
    assert num(0.000012345) == "1.234e-5"
    assert num(123456.0) == "1.235e5"
    assert num(1e308) == "1e308" and num(5e-324) == "4.941e-324"
    assert num(3.14159, digits=2) == "3.1"


def test_integers_print_exactly_until_they_are_too_long_to_read():
    assert num(10**16 - 1) == "9999999999999999"
    assert num(12345678901234567890) == "1.235e19"  # rounded like a float would be
    assert num(10**400) == "1e400" and num(-(10**400)) == "-1e400"
    assert num(99995 * 10**20) == "1e25"  # the rounding carries into a new digit
    assert num(10**5000 + 1) == "1e5000"  # beyond str()'s digit limit


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**500), 10**500)))
def test_num_never_raises_and_keeps_four_significant_digits(value):
    text = num(value)
    assert text and " " not in text
    if isinstance(value, int) and 10**16 <= abs(value) < 10**300:
        assert abs(float(text) - value) <= 5.001e-4 * abs(value)


def test_value_text_shortens_long_lists():
    assert value_text([1.0, math.nan, "a"]) == "[1, NaN, a]"
    assert value_text(list(range(10)), max_items=3) == "[0, 1, 2, … (10 values)]"

"""The Markdown building blocks: numbers, cells, fences, tables."""

from __future__ import annotations

import math

import pytest

from nndx.prompts.markdown import cell, fence, num, table, value_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2.3104, "2.31"),
        (0.004123, "0.004123"),
        (12345.678, "1.235e4"),
        (1e-5, "1e-5"),
        (-0.0, "0"),
        (200.0, "200"),
        (math.nan, "NaN"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (7, "7"),
        (True, "yes"),
        (None, "—"),
    ],
)
def test_num_is_compact_and_names_non_finite_values(value, text):
    assert num(value) == text


def test_value_text_shortens_long_lists():
    assert value_text([1.0, math.nan]) == "[1, NaN]"
    long = value_text(list(range(20)))
    assert long.startswith("[0, 1, 2") and "(20 values)" in long and "19" not in long


def test_cell_escapes_everything_that_could_leave_the_cell():
    text = cell("a|b`c\\d\ne\r\nf\u2028g<!--h")
    assert "\n" not in text and "\r" not in text and "\u2028" not in text
    assert text == "a\\|b\\`c\\\\d<br>e<br>f<br>g&lt;!--h"


def test_cell_truncates_very_long_text():
    assert len(cell("x" * 10_000)) == 200


def test_fence_is_longer_than_any_backtick_run_inside():
    body = "```\nclosing?\n`````\n"
    block = fence(body)
    opening = block.split("\n", 1)[0]
    assert opening == "``````text"
    lines = block.split("\n")
    assert lines[-1] == "``````"
    # no line inside is a fence at least as long as the opening one
    assert not any(line.strip().startswith("``````") for line in lines[1:-1])


def test_table_keeps_column_count_for_hostile_cells():
    md = table(["a", "b"], [["x|y|z", "line1\nline2"]])
    header, rule, row = md.split("\n")
    assert header.count(" | ") == row.count(" | ") == 1


def test_table_rejects_a_row_of_the_wrong_width():
    with pytest.raises(ValueError, match="2 cells"):
        table(["a"], [["x", "y"]])

"""Every row of both debugging tables is reachable: a report showing the row's symptom
fires one of the row's rules."""

from __future__ import annotations

import pytest

from nndx.rules import MASTER_TABLE, PYTORCH_BUGS, REGISTRY, diagnose

from .broken import BROKEN

ROWS = [("master", row) for row in MASTER_TABLE] + [("pytorch", row) for row in PYTORCH_BUGS]


def test_tables_cover_the_lesson():
    assert len(MASTER_TABLE) >= 10 and len(PYTORCH_BUGS) >= 12
    for _, row in ROWS:
        assert row.symptom and row.likely_cause and row.first_try and row.rule_ids
        assert set(row.rule_ids) <= set(REGISTRY), row.symptom


@pytest.mark.parametrize("table,row", ROWS, ids=[f"{t}:{r.symptom[:30]}" for t, r in ROWS])
def test_row_is_reachable(table, row):
    reached = [
        rule_id
        for rule_id in row.rule_ids
        if rule_id in {f.rule_id for f in diagnose(BROKEN[rule_id]()).findings}
    ]
    assert reached, f"no rule of row {row.symptom!r} fires on its report"

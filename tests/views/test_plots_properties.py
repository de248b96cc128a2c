"""Property tests: every report that validates gives figures, whatever it holds, and no
value is left off a figure."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nndx.report import DiagnosticReport, LossPoint
from nndx.views.plots import Scale, compare_figures, report_figures
from tests.views.strategies import floats, reports, steps

#: Reports are big examples to generate; 60 of them cover the extremes (see the last test).
REPORTS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST = settings(max_examples=150, deadline=None)


def refuse(constant: str) -> None:
    raise AssertionError(f"bare {constant} in a figure")


def check_figures(figures) -> None:
    for figure in figures.values():
        json.loads(figure.to_json(), parse_constant=refuse)  # finite numbers only
        assert figure.spec["data"], figure.id


@pytest.mark.slow
@REPORTS
@given(reports)
def test_every_report_that_validates_gives_figures(report):
    report = DiagnosticReport.model_validate_json(report.model_dump_json())  # what the service stores
    check_figures(report_figures(report))


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(reports, min_size=2, max_size=3))
def test_any_runs_can_be_compared(runs):
    check_figures(compare_figures([(f"run {i}", r) for i, r in enumerate(runs)]))


@FAST
@given(st.lists(st.tuples(steps, floats), min_size=1, max_size=30))
def test_no_loss_value_is_left_off(points):
    report = DiagnosticReport(loss_history={"train": [LossPoint(step=s, value=v) for s, v in points]})
    figure = report_figures(report)["loss"]
    (line,) = [t for t in figure.spec["data"] if t["name"] == "train"]
    assert len(line["x"]) == len(points)  # every point has its place on the line
    values = [v for _, v in points]
    marks = {t["name"]: len(t["x"]) for t in figure.spec["data"] if t["mode"] == "markers"}
    assert marks.get("NaN / ±inf (at the edge)", 0) == sum(not math.isfinite(v) for v in values)
    if figure.spec["layout"]["yaxis"]["type"] == "log":
        assert marks.get("zero or negative (at the log floor)", 0) == sum(math.isfinite(v) and v <= 0 for v in values)
    drawn = [y for y in line["y"] if y is not None]
    assert len(drawn) == sum(math.isfinite(v) for v in values)


@FAST
@given(st.lists(floats, max_size=20), st.one_of(st.none(), st.booleans()))
def test_a_scale_places_every_value_at_a_finite_position(values, log):
    scale = Scale.of(values, log=log)
    for value in values:
        position, why = scale.place(value)
        assert math.isfinite(position)
        assert why is not None or position == value
        if scale.log:
            assert position > 0


@pytest.mark.slow
def test_the_strategy_reaches_the_extremes():
    """The properties above are only as strong as the reports they see."""
    seen = {"nan": False, "huge": False, "tiny": False, "big step": False}

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(reports)
    def look(report):
        text = report.model_dump_json()
        seen["nan"] |= '"NaN"' in text
        seen["huge"] |= "e308" in text or "e+308" in text
        seen["tiny"] |= "5e-324" in text
        seen["big step"] |= any(p.step >= 10**300 for points in report.loss_history.values() for p in points)

    look()
    assert all(seen.values()), seen


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reports)
def test_every_figure_is_valid_plotly(report):
    go = pytest.importorskip("plotly.graph_objects")

    for figure in report_figures(report).values():
        go.Figure(figure.spec)

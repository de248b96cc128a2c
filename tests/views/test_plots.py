"""nndx.views.plots: the figures of a report, as plotly specs that show every value."""

from __future__ import annotations

import json
import math

import pytest

from nndx.report import (
    ActivationStats,
    CauseCode,
    DiagnosticReport,
    Finding,
    GradientStats,
    LayerStats,
    LiveFinding,
    LoopStats,
    LossPoint,
    LRRangeResult,
    ParameterStats,
    Probes,
    ScalarPoint,
)
from nndx.views.plots import (
    MAX_LINES,
    Figure,
    Scale,
    compare_figures,
    finding_target,
    labels,
    lr_range_figure,
    report_figures,
    write_html,
)

go = pytest.importorskip("plotly.graph_objects")


def traces(figure: Figure, name: str) -> list[dict]:
    return [t for t in figure.spec["data"] if t.get("name") == name]


def marked(figure: Figure, kind_name: str) -> int:
    return sum(len(t["x"]) for t in traces(figure, kind_name))


NONFINITE, FLOOR = "NaN / ±inf (at the edge)", "zero or negative (at the log floor)"


def dead_network(layers: int = 10, dead: int = 8) -> DiagnosticReport:
    """Gradients that are exactly zero in the first ``dead`` layers: the evidence itself."""
    return DiagnosticReport(layers=[
        LayerStats(name=f"encoder.block{i}.fc", type="Linear", step=0,
                   activation=ActivationStats(mean=0, std=0 if i < dead else 0.5, min=0, max=1, zero_fraction=1.0,
                                              dead_unit_fraction=1.0 if i < dead else 0.1),
                   gradient=GradientStats(abs_mean=0.0 if i < dead else 1e-4 * (i + 1), max=0.1,
                                          norm=0.0 if i < dead else 10.0 ** (i - layers + 1)))
        for i in range(layers)])  # fmt: skip


def test_scale_is_log_for_positive_values_spanning_decades_and_linear_otherwise():
    assert Scale.of([1e-6, 1e-2, 1.0]).log
    assert not Scale.of([0.5, 0.9, 2.0]).log  # less than three decades
    assert not Scale.of([-1.0, 1e-6, 1e3]).log  # a negative value cannot sit on a log axis
    assert Scale.of([0.0, 1e-6, 1e3]).log  # zeros go to the floor instead
    assert Scale.of([5e-324, 1e308]).log  # the extremes too
    assert Scale.of([2.0, 2.0]).constant


def test_scale_places_what_it_cannot_draw_and_says_why():
    log = Scale.of([1e-6, 1.0])
    assert log.place(0.0) == (log.floor, "floor") and 0 < log.floor < 1e-6
    assert log.place(-3.0)[1] == "floor"
    assert log.place(math.nan) == (log.top, "nonfinite") and log.top > 1.0
    assert log.place(1e-3) == (1e-3, None)
    linear = Scale.of([-1e308, 1e308])
    assert linear.place(1e308) == (1e290, "clipped") and linear.place(-math.inf) == (linear.bottom, "nonfinite")
    assert math.isfinite(linear.top - linear.bottom)  # plotly.js computes this span


def test_labels_are_escaped_unique_and_never_blank():
    out = labels(["<b>x</b>", "fc", "fc", "  ", "y" * 500])
    assert out[0] == "&lt;b&gt;x&lt;/b&gt;"
    assert out[1] == "fc" and out[2] == "fc #2"
    assert out[3] == "(blank)" and len(out[4]) <= 64


def test_to_json_is_strict_and_cannot_close_its_script_element():
    report = DiagnosticReport(loss_history={"</script><!--": [LossPoint(step=0, value=math.nan)]})
    text = report_figures(report)["loss"].to_json()
    assert "<" not in text and ">" not in text

    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in the figure JSON")

    json.loads(text, parse_constant=refuse)  # strict JSON: no NaN/Infinity literals


def test_dead_network_zeros_are_drawn_at_the_log_floor_with_layer_names():
    figure = report_figures(dead_network())["gradient_flow"]
    bars = [t for t in figure.spec["data"] if t["type"] == "bar"]
    assert {t["orientation"] for t in bars} == {"h"}
    axis = figure.spec["layout"]["yaxis"]
    assert axis["type"] == "category" and axis["categoryarray"][0] == "encoder.block0.fc"
    assert figure.spec["layout"]["xaxis"]["type"] == "log"
    assert marked(figure, FLOOR) == 16  # 8 zero norms and 8 zero |mean|s, none left off
    assert "16 zero or negative values drawn as ▼ at the floor of the log axis" in figure.notes
    # zero-length bars are not drawn as bars of the floor's length: the marker says 0
    assert bars[0]["x"][:8] == [None] * 8


def test_zero_on_a_linear_axis_is_written_beside_its_bar():
    figure = report_figures(dead_network())["activation_std"]
    (bar,) = [t for t in figure.spec["data"] if t["type"] == "bar"]
    assert bar["text"][0] == "0" and bar["textposition"] == "outside"


def test_many_layers_still_show_zero_without_labels():
    figure = report_figures(dead_network(layers=300, dead=250))["activation_std"]
    assert "textposition" in figure.spec["data"][0] and figure.spec["data"][0]["textposition"] == "none"
    assert marked(figure, "zero") == 250


def test_loss_curve_breaks_at_nan_and_marks_it_at_the_top_edge():
    values = [2.0, 1.5, math.nan, 1.0, math.inf, 0.8]
    report = DiagnosticReport(loss_history={"train": [LossPoint(step=s, value=v) for s, v in enumerate(values)]})
    figure = report_figures(report)["loss"]
    (line,) = traces(figure, "train")
    assert line["y"][2] is None and line["y"][4] is None and line["connectgaps"] is False
    assert marked(figure, NONFINITE) == 2 and "2 NaN/inf values drawn as ✕ at the edge" in figure.notes
    (marks,) = traces(figure, NONFINITE)
    assert all(y > 2.0 for y in marks["y"]) and "NaN" in marks["text"][0]


def test_extreme_values_become_finite_positions_with_their_true_value_in_the_hover():
    report = DiagnosticReport(loss_history={"train": [LossPoint(step=10**400, value=1e308),
                                                      LossPoint(step=1, value=-1e308), LossPoint(step=2, value=5e-324)]})  # fmt: skip
    figure = report_figures(report)["loss"]
    (line,) = traces(figure, "train")
    assert max(line["x"]) <= 1e290 and all(abs(y) <= 1e290 for y in line["y"])
    assert any("1e400" in text and "1e308" in text for text in line["text"])


def test_lr_figure_marks_suggestion_divergence_and_an_interval_when_there_is_one():
    lrs = [10 ** (k / 4 - 6) for k in range(24)]
    result = LRRangeResult(status="passed", lrs=lrs, losses=[2.3] * 20 + [1.0, 0.5, 3.0, math.inf],
                           smoothed=[2.3] * 24, suggested_lr=lrs[20], diverged_at_lr=lrs[23])  # fmt: skip
    figure = lr_range_figure(result)
    layout = figure.spec["layout"]
    assert layout["xaxis"]["type"] == "log"
    lines = {round(s["x0"], 12) for s in layout["shapes"] if s["type"] == "line"}
    assert round(lrs[20], 12) in lines and round(lrs[23], 12) in lines  # shapes take data values
    texts = [a["text"] for a in layout["annotations"]]
    assert any(t.startswith("suggested") for t in texts) and any(t.startswith("diverged") for t in texts)
    assert not any(s["type"] == "rect" for s in layout["shapes"])  # no interval in this result

    figure = lr_range_figure(result.model_copy(update={"interval_low_lr": lrs[18], "interval_high_lr": lrs[21]}))
    (rect,) = [s for s in figure.spec["layout"]["shapes"] if s["type"] == "rect"]
    assert rect["x0"] == pytest.approx(lrs[18]) and rect["x1"] == pytest.approx(lrs[21])


def test_live_alerts_are_marked_on_every_figure_over_steps():
    report = DiagnosticReport(
        loss_history={"train": [LossPoint(step=s, value=1.0 / (s + 1)) for s in range(50)]},
        loop=LoopStats(input_norm_history=[ScalarPoint(step=s, value=3.0) for s in range(50)],
                       live_findings=[LiveFinding(rule_id="NNDX201", code="DEAD_RELU", severity="error",
                                                  title="<i>dead</i>", step=30)]),  # fmt: skip
    )
    figures = report_figures(report)
    for fig_id in ("loss", "input_norm"):
        layout = figures[fig_id].spec["layout"]
        assert [s["x0"] for s in layout["shapes"]] == [30.0]
        (flag,) = layout["annotations"]
        assert "DEAD_RELU" in flag["hovertext"] and "&lt;i&gt;" in flag["hovertext"]
        assert figures[fig_id].steps


def test_per_layer_series_over_steps_are_lines_then_a_heatmap():
    def report(n: int) -> DiagnosticReport:
        return DiagnosticReport(parameters=[ParameterStats(name=f"p{i}", step=s, weight_norm=1.0, update_ratio=1e-3 * (i + 1))
                                            for i in range(n) for s in (0, 10, 20)])  # fmt: skip

    few = report_figures(report(MAX_LINES))["update_ratio_steps"]
    assert {t["type"] for t in few.spec["data"]} == {"scatter"} and len(few.spec["data"]) == MAX_LINES
    many = report_figures(report(MAX_LINES + 1))["update_ratio_steps"]
    (heatmap,) = many.spec["data"]
    assert heatmap["type"] == "heatmap" and len(heatmap["y"]) == MAX_LINES + 1 and len(heatmap["x"]) == 3


def test_one_recorded_step_gives_bars_but_no_series_over_steps():
    figures = report_figures(dead_network())
    assert "dead_units" in figures and "dead_units_steps" not in figures


def test_findings_point_at_the_figure_and_the_step_behind_them():
    report = dead_network()
    report.loop = LoopStats(live_findings=[LiveFinding(rule_id="NNDX201", code="DEAD_RELU", severity="error",
                                                       title="dead", step=40)])  # fmt: skip
    figures = report_figures(report)
    finding = Finding(rule_id="NNDX201", code=CauseCode.DEAD_RELU, severity="error", title="t", symptom="s", fix="f")
    assert finding_target(finding, figures, report) == ("dead_units", 40)
    missing = finding.model_copy(update={"code": CauseCode.DATA_LEAKAGE})
    assert finding_target(missing, figures, report) is None


def test_compare_overlays_runs_with_one_colour_each():
    a = DiagnosticReport(loss_history={"train": [LossPoint(step=s, value=1.0) for s in range(5)]})
    b = DiagnosticReport(loss_history={"train": [LossPoint(step=s, value=math.nan) for s in range(5)],
                                       "val": [LossPoint(step=4, value=2.0)]})  # fmt: skip
    figures = compare_figures([("run a", a), ("run b", b)])
    assert list(figures) == ["loss"]
    lines = [t for t in figures["loss"].spec["data"] if t["mode"] != "markers"]
    assert [t["name"] for t in lines] == ["run a · train", "run b · train", "run b · val"]
    assert lines[1]["line"]["color"] == lines[2]["line"]["color"] != lines[0]["line"]["color"]
    # run b's NaNs are marked in run b's colour
    (marks,) = [t for t in figures["loss"].spec["data"] if t["mode"] == "markers"]
    assert marks["marker"]["color"] == lines[1]["line"]["color"] and len(marks["x"]) == 5


def test_an_empty_report_has_no_figures():
    assert report_figures(DiagnosticReport()) == {}
    assert report_figures(DiagnosticReport(layers=[LayerStats(name="x", type="Linear")])) == {}
    assert report_figures(DiagnosticReport(loss_history={"train": []})) == {}


def test_every_figure_of_a_full_report_is_valid_plotly():
    from tests.api.conftest import make_report

    report = make_report(nan_at=3)
    report.probes = Probes(lr_range=report.probes.lr_range)
    report.parameters = [ParameterStats(name="w", step=s, weight_norm=1.0, update_ratio=10.0**-s) for s in range(4)]
    figures = report_figures(report)
    assert {"loss", "gradient_flow", "dead_units", "activation_std", "lr_range", "update_ratio",
            "update_ratio_steps"} <= set(figures)  # fmt: skip
    for figure in figures.values():
        go.Figure(figure.spec)  # raises on any attribute plotly does not know


def test_write_html_writes_an_offline_folder(tmp_path):
    index = write_html(report_figures(dead_network()), tmp_path / "plots", title="<run>")
    text = index.read_text()
    assert (tmp_path / "plots" / "plotly.min.js").stat().st_size > 1_000_000
    assert "<script src='plotly.min.js'></script>" in text and "&lt;run&gt;" in text
    assert "cdn" not in text.lower() and "https://" not in text
    assert text.count("Plotly.newPlot") == len(report_figures(dead_network())) == 3


def test_nndx_plot_writes_the_figures_and_says_why_when_it_cannot(tmp_path, capsys):
    from nndx.cli import main

    report = tmp_path / "report.json"
    report.write_text(dead_network().model_dump_json())
    assert main(["plot", str(report), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "index.html")
    assert "gradient_flow" in (tmp_path / "out" / "index.html").read_text()

    empty = tmp_path / "empty.json"
    empty.write_text(DiagnosticReport().model_dump_json())
    assert main(["plot", str(empty), "--out", str(tmp_path / "none")]) == 1
    assert main(["plot", str(report), "--out", str(report)]) == 2  # a file, not a folder
    assert main(["plot", str(tmp_path / "missing.json")]) == 2
    assert "nndx plot:" in capsys.readouterr().err


def test_views_import_without_torch():
    """The service draws figures without torch installed."""
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; import nndx.views.plots, nndx.views.text, nndx.api.routers.pages"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]

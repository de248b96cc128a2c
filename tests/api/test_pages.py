"""HTML pages and the SVG plotting module."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from nndx.api.plots import Series, line_chart, report_charts
from nndx.report import DiagnosticReport, LayerStats
from tests.api.conftest import make_report

JSON = {"content-type": "application/json"}
SVG = "{http://www.w3.org/2000/svg}"
EVIL = "<script>document.body.appendChild(document.createElement('pwned-marker'))</script>"


def post(client, report):
    response = client.post("/v1/reports", content=report.model_dump_json(), headers=JSON)
    assert response.status_code == 201
    return response.json()["id"]


def test_index_lists_recent_reports_with_their_top_cause(client):
    assert "No reports yet" in client.get("/").text
    post(client, make_report(name="dead_relu run"))
    post(client, make_report(name="healthy run"))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    rows = re.findall(r"<tr>.*?</tr>", page.text.split("<tbody>")[1], flags=re.S)
    assert len(rows) == 2
    assert "healthy run" in rows[0] and "DEAD_RELU" not in rows[0]
    assert "dead_relu run" in rows[1] and "<code>DEAD_RELU</code>" in rows[1]


def test_index_pages_back_through_older_reports(client, monkeypatch):
    import nndx.api.routers.pages as pages

    monkeypatch.setattr(pages, "INDEX_PAGE_SIZE", 2)
    names = [f"run-{i}" for i in range(3)]
    for name in names:
        post(client, make_report(name=name))
    first = client.get("/").text
    assert "run-2" in first and "run-1" in first and "run-0" not in first
    cursor = re.search(r'href="/\?cursor=([^"]+)"', first).group(1)
    second = client.get(f"/?cursor={cursor}").text
    assert "run-0" in second and "run-1" not in second and "older reports" not in second


def test_report_page_shows_findings_evidence_and_all_plots(client):
    report_id = post(client, make_report(name="dead_relu", nan_at=5))
    page = client.get(f"/reports/{report_id}").text
    assert "DEAD_RELU" in page and "fake fix" in page and "<code>value</code> = NaN" in page
    for plot_id in ("loss", "lr_range", "gradient_flow", "dead_units", "activation_std"):
        assert f'data-plot="{plot_id}"' in page, plot_id
    assert "1 non-finite value not plotted" in page
    # self-contained: no script, and no URL outside this service (SVG's xmlns is a name, not a fetch)
    assert "<script" not in page
    assert re.findall(r'(?:src|href)="(?!/)[^"]*"', page) == []


def test_layer_and_run_names_with_script_render_inert(client):
    report = make_report(name=EVIL)
    report.layers[0].name = EVIL
    report.layers[1].type = '"><img src=x onerror=alert(1)>'
    report_id = post(client, report)
    for page in (client.get(f"/reports/{report_id}").text, client.get("/").text):
        assert "<script>" not in page
        assert "<img" not in page
        assert "&lt;script&gt;" in page


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def test_line_chart_breaks_at_and_marks_non_finite_points():
    svg = line_chart([Series("train", [0, 1, 2, 3, 4], [1.0, 0.8, math.nan, 0.6, 0.5])],
                     title="Loss", x_label="step", y_label="loss")
    root = _parse(svg)
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2  # the NaN splits the line instead of being bridged
    assert [len(line.get("points").split()) for line in lines] == [2, 2]
    assert len(root.findall(f"{SVG}g[@class='nonfinite']")) == 1
    assert "1 non-finite value not plotted" in svg


def test_log_axis_leaves_out_non_positive_values_and_says_so():
    svg = line_chart([Series("g", [0, 1, 2], [1e-3, 0.0, 1e-1])], title="g", x_label="x", y_label="y", log_y=True)
    root = _parse(svg)
    assert len(root.findall(f"{SVG}circle")) == 2
    assert "1 non-positive value left off the log axis" in svg
    labels = [t.text for t in root.findall(f"{SVG}text")]
    assert "1e-3" in labels and "0.1" in labels


def test_points_are_placed_on_the_axes():
    svg = line_chart([Series("s", [1e-4, 1e-2], [0.0, 10.0])], title="t", x_label="x", y_label="y", log_x=True)
    circles = _parse(svg).findall(f"{SVG}circle")
    (x0, y0), (x1, y1) = [(float(c.get("cx")), float(c.get("cy"))) for c in circles]
    assert x1 > x0 and y1 < y0  # larger values right and up


def test_chart_with_nothing_drawable_says_so():
    svg = line_chart([Series("s", [0, 1], [math.nan, math.inf])], title="t", x_label="x", y_label="y")
    assert "no drawable values (2 non-finite)" in svg
    _parse(svg)


def test_series_text_is_escaped():
    svg = line_chart([Series("<b>&", [0, 1], [1, 2], ["</title><script>x</script>", "ok"])],
                     title="<t>", x_label="x", y_label="y")
    assert "<script>" not in svg and "<b>" not in svg
    _parse(svg)


def test_report_charts_use_the_latest_step_of_each_layer():
    report = make_report(layers=3)
    later = report.layers[0].model_copy(update={"step": 10})
    later.gradient = later.gradient.model_copy(update={"norm": 123.0})
    report.layers.append(later)
    svg = report_charts(report)["gradient_flow"]
    assert "0: blocks.0.fc: 123" in svg
    assert svg.count("blocks.0.fc") == 2  # norm and |mean| series, once each


def test_report_without_series_has_no_charts():
    assert report_charts(DiagnosticReport()) == {}
    only_layers = DiagnosticReport(layers=[LayerStats(name="x", type="Linear")])
    assert report_charts(only_layers) == {}


@pytest.mark.parametrize("bad", [([1, 2], [1]), ])
def test_series_refuses_mismatched_lengths(bad):
    with pytest.raises(ValueError, match="xs"):
        Series("s", *bad)

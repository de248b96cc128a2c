"""The HTML pages: the run list with its filters, one run, its prompt and checklist as
HTML, runs compared, and the assets they load — all from this service."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings

import nndx.api.routers.pages as pages
from nndx.report import LiveFinding, LoopStats
from tests.api.conftest import make_report
from tests.views.strategies import reports

JSON = {"content-type": "application/json"}
EVIL = "<script>document.body.appendChild(document.createElement('pwned-marker'))</script>"
needs_store_filters = pytest.mark.skipif(
    not {"search", "severity", "since", "until"} <= pages.STORE_FILTERS,
    reason="the store gains the run-name search, severity and date filters with the service branch",
)


def post(client, report):
    response = client.post("/v1/reports", content=report.model_dump_json(), headers=JSON)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def rows(page: str) -> list[str]:
    body = page.split("<tbody>")[1].split("</tbody>")[0]
    return re.findall(r"<tr>.*?</tr>", body, flags=re.S)


def scripts_are_files_or_data(page: str) -> None:
    """No inline script: every <script> loads a file from here or carries JSON data."""
    for tag in re.findall(r"<script[^>]*>", page):
        assert re.fullmatch(r'<script src="/[^"]+">', tag) or 'type="application/json"' in tag, tag
    assert re.findall(r'(?:src|href)="(?!/|#)[^"]*"', page) == []  # nothing outside this service
    assert " style=" not in page and "<style" not in page  # CSP style-src 'self' holds too


def test_index_lists_runs_with_their_top_cause(client):
    assert "No reports yet" in client.get("/").text
    post(client, make_report(name="dead_relu run"))
    post(client, make_report(name="healthy run"))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    first, second = rows(page.text)
    assert "healthy run" in first and "DEAD_RELU" not in first
    assert "dead_relu run" in second and "<code>DEAD_RELU</code>" in second
    assert 'name="id"' in first  # a box to tick for the comparison
    scripts_are_files_or_data(page.text)


def test_index_filters_by_project_and_cause_and_keeps_them_while_paging(client, monkeypatch):
    monkeypatch.setattr(pages, "INDEX_PAGE_SIZE", 2)
    for i in range(3):
        post(client, make_report(project="vision", name=f"dead_relu-{i}"))
    post(client, make_report(project="vision", name="healthy"))
    post(client, make_report(project="text", name="dead_relu-text"))

    page = client.get("/", params={"project": "vision", "cause": "DEAD_RELU"}).text
    assert [re.search(r'class="run-link"[^>]*>([^<]+)', r).group(1) for r in rows(page)] == ["dead_relu-2", "dead_relu-1"]
    older = re.search(r'id="older" href="/\?([^"]+)"', page).group(1).replace("&amp;", "&")
    assert "project=vision" in older and "cause=DEAD_RELU" in older
    second = client.get(f"/?{older}").text
    assert [re.search(r'class="run-link"[^>]*>([^<]+)', r).group(1) for r in rows(second)] == ["dead_relu-0"]
    assert 'id="older"' not in second and "← newest" in second
    assert "No run matches these filters" in client.get("/", params={"project": "audio"}).text


@needs_store_filters
def test_index_filters_by_name_severity_and_date(client):
    post(client, make_report(name="ResNet dead_relu"))
    post(client, make_report(name="resnet healthy"))
    post(client, make_report(name="vit healthy"))
    names = lambda page: [re.search(r'class="run-link"[^>]*>([^<]+)', r).group(1) for r in rows(page)]  # noqa: E731
    assert names(client.get("/", params={"q": "resnet"}).text) == ["resnet healthy", "ResNet dead_relu"]
    assert names(client.get("/", params={"severity": "error"}).text) == ["ResNet dead_relu"]
    assert len(names(client.get("/", params={"since": "2000-01-01", "until": "9999-12-30"}).text)) == 3
    assert "No run matches" in client.get("/", params={"until": "2000-01-01"}).text


@pytest.mark.parametrize("params", [
    {"severity": "fatal"}, {"cause": "NOT_A_CAUSE"}, {"since": "yesterday"}, {"until": "9999-12-31"},
    {"cursor": "garbage"}, {"q": "a\x00b"}, {"project": "p" * 5000},
])  # fmt: skip
def test_index_answers_bad_filters_with_a_page_that_says_what_is_wrong(client, params):
    post(client, make_report())
    page = client.get("/", params=params)
    assert page.status_code == 422 and page.headers["content-type"].startswith("text/html")
    assert 'id="problems"' in page.text and 'id="filters"' in page.text


def test_index_empty_form_fields_mean_no_filter(client):
    post(client, make_report())
    page = client.get("/?q=&project=&cause=&severity=&since=&until=")
    assert page.status_code == 200 and len(rows(page.text)) == 1


def test_report_page_draws_every_figure_and_links_findings_to_them(client):
    report = make_report(name="dead_relu", nan_at=5)
    report.loop = LoopStats(live_findings=[LiveFinding(rule_id="fake-dead_relu", code="DEAD_RELU", severity="error",
                                                       title="dead", step=7)])  # fmt: skip
    report_id = post(client, report)
    page = client.get(f"/reports/{report_id}").text
    for fig_id in ("loss", "lr_range", "gradient_flow", "dead_units", "activation_std"):
        assert f'id="plot-{fig_id}"' in page, fig_id
        spec = re.search(rf'<script type="application/json" id="spec-{fig_id}">(.*?)</script>', page, re.S).group(1)
        assert json.loads(spec)["data"], fig_id
    assert "1 NaN/inf value drawn as ✕ at the edge" in page
    # the finding links to the plot of its evidence, at the step its live alert fired
    link = re.search(r'<a class="goto" href="#fig-dead_units"[^>]*>', page).group(0)
    assert 'data-figure="dead_units"' in link and 'data-step="7"' in link
    assert "<code>value</code>" not in page and "NaN" in page
    assert 'id="lr-suggestion"' in page and 'id="probes-table"' in page
    assert '/reports/' + report_id + '/prompt"' in page and '/reports/' + report_id + '/checklist"' in page
    scripts_are_files_or_data(page)


def test_layer_and_run_names_with_markup_stay_text(client):
    report = make_report(name=EVIL)
    report.layers[0].name = EVIL
    report.layers[1].type = '"><img src=x onerror=alert(1)>'
    report_id = post(client, report)
    for page in (client.get(f"/reports/{report_id}").text, client.get("/").text):
        assert "<script>" not in page and "<img" not in page
        assert "&lt;script&gt;" in page
    # in a figure the name is escaped twice: for plotly's text, then for the script block
    spec = re.search(r'id="spec-gradient_flow">(.*?)</script>', client.get(f"/reports/{report_id}").text, re.S).group(1)
    assert "&lt;script&gt;" in json.loads(spec)["layout"]["yaxis"]["categoryarray"][0]


def test_prompt_and_checklist_render_as_inert_html_with_the_markdown_downloadable(client):
    report = make_report(name="![x](http://attacker.example/x.png) <img src=x onerror=alert(1)> [a](javascript:alert(1))")
    report_id = post(client, report)
    for kind, file_name in (("prompt", "prompt-nn-debugger.md"), ("checklist", "skill-debug-checklist.md")):
        page = client.get(f"/reports/{report_id}/{kind}")
        assert page.status_code == 200 and "<h1>" in page.text and ("<table>" in page.text or "<li>" in page.text)
        article = page.text.split('id="markdown">')[1]
        assert "<img" not in article and ("&lt;img src=x" in article or kind == "checklist")
        assert re.findall(r'href="(?!/|#)', article) == []  # no link leaves this service
        download = re.search(r'<a class="button" id="download" href="([^"]+)" download="([^"]+)"', page.text)
        assert download.groups() == (f"/v1/reports/{report_id}/{kind}", file_name)
        markdown = client.get(download.group(1))
        assert markdown.headers["content-type"].startswith("text/markdown")
        scripts_are_files_or_data(page.text)


def test_markdown_html_neutralises_raw_html_images_and_script_links():
    out = pages.markdown_html("# t\n\n<script>x</script> ![i](http://e/i.png) [l](javascript:alert(1)) [ok](https://e/)")
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "<img" not in out and "href=" not in out  # a link with a scheme stays text
    assert 'href="/reports/x"' in pages.markdown_html("[r](/reports/x) [h](//evil.example/)")
    assert "evil.example" not in pages.markdown_html("[h](//evil.example/)").split("href")[-1] or "href=\"//" not in pages.markdown_html("[h](//evil.example/)")


def test_compare_overlays_two_runs(client):
    a = post(client, make_report(name="dead_relu a"))
    b = post(client, make_report(name="healthy b", nan_at=2))
    page = client.get("/compare", params=[("id", a), ("id", b)])
    assert page.status_code == 200
    assert len(rows(page.text.split('id="compared"')[1])) == 2
    spec = json.loads(re.search(r'id="spec-loss">(.*?)</script>', page.text, re.S).group(1))
    names = [t["name"] for t in spec["data"] if t["mode"] != "markers"]
    assert any(n.startswith("dead_relu a") for n in names) and any(n.startswith("healthy b") for n in names)
    assert 'id="cause-matrix"' in page.text and "DEAD_RELU" in page.text
    scripts_are_files_or_data(page.text)


def test_compare_needs_two_known_runs(client):
    a = post(client, make_report())
    assert client.get("/compare", params={"id": a}).status_code == 422
    assert "choose 2 to" in client.get("/compare").text
    assert client.get("/compare", params=[("id", a), ("id", "nope")]).status_code == 404
    many = [("id", post(client, make_report())) for _ in range(pages.MAX_COMPARE + 1)]
    assert client.get("/compare", params=many).status_code == 422


def test_compare_never_shows_another_projects_run(make_app):
    from fastapi.testclient import TestClient

    client = TestClient(make_app(tokens={"tok-a": "a", "tok-b": "b"}))
    mine = client.post("/v1/reports", content=make_report(project="a").model_dump_json(),
                       headers={**JSON, "authorization": "Bearer tok-a"}).json()["id"]  # fmt: skip
    theirs = client.post("/v1/reports", content=make_report(project="b").model_dump_json(),
                         headers={**JSON, "authorization": "Bearer tok-b"}).json()["id"]  # fmt: skip
    page = client.get("/compare", params=[("id", mine), ("id", theirs)], headers={"authorization": "Bearer tok-a"})
    assert page.status_code == 404
    assert client.get("/compare", params=[("id", mine), ("id", theirs)]).status_code == 401


def test_plotly_and_its_css_are_served_from_here_versioned_and_compressed(client):
    bundle = pages.plotly_bundle()
    if bundle is None:
        pytest.skip("plotly is not installed")
    response = client.get(f"/vendor/{bundle.js_name}", headers={"accept-encoding": "gzip"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/javascript")
    assert response.headers["content-encoding"] == "gzip" and "immutable" in response.headers["cache-control"]
    raw = client.get(f"/vendor/{bundle.js_name}", headers={"accept-encoding": "identity"})
    assert raw.content[:200] == bundle.js[:200] and len(gzip.compress(bundle.js)) < len(bundle.js)
    css = client.get(f"/vendor/{bundle.css_name}").text
    assert ".js-plotly-plot .plotly .modebar{" in css and "X" not in css.split("{")[0]
    assert client.get("/vendor/plotly.min.js").status_code == 404
    assert client.get("/static/nndx.js").status_code == 200 and client.get("/static/nndx.css").status_code == 200


def test_plotly_css_reads_the_rules_out_of_the_bundle():
    bundle = '...var I={"X,X div":\'direction:ltr;font-family:"Open Sans";\',"X .a:hover":"color:red;",",Y b":"x:1;",Y:"z:2"};'
    assert pages.plotly_css(bundle).splitlines() == [
        '.js-plotly-plot .plotly,.js-plotly-plot .plotly div{direction:ltr;font-family:"Open Sans";}',
        ".js-plotly-plot .plotly .a:hover{color:red;}",
        " ,.plotly-notifier b{x:1;}",
        ".plotly-notifier{z:2}",  # a key the minifier left unquoted
    ]
    assert pages.plotly_css("no rules here") == ""


def test_pages_work_without_plotly_and_say_so(client, monkeypatch):
    monkeypatch.setattr(pages, "plotly_bundle", lambda: None)
    page = client.get(f"/reports/{post(client, make_report(name='dead_relu'))}").text
    assert "The plots need plotly" in page and "/vendor/" not in page and 'id="findings-table"' in page


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(reports)
def test_every_report_that_validates_renders_on_every_page(client, report):
    response = client.post("/v1/reports", content=report.model_dump_json(), headers=JSON)
    if response.status_code == 422:  # text a backend cannot store (a NUL character) is refused, by name
        assert response.json()["detail"][0]["loc"][0] == "body"
        return
    assert response.status_code == 201, response.text
    report_id = response.json()["id"]
    for path in (f"/reports/{report_id}", f"/reports/{report_id}/prompt", f"/reports/{report_id}/checklist", "/"):
        assert client.get(path).status_code == 200, path
    assert client.get("/compare", params=[("id", report_id), ("id", report_id), ("id", post(client, make_report()))]).status_code == 200


def test_a_finding_no_figure_shows_links_to_its_section(client):
    page = client.get(f"/reports/{post(client, make_report(name='data_leakage'))}").text
    row = re.search(r"<tr[^>]*>\s*<td><span class=\"badge sev-error\">.*?</tr>", page, re.S).group(0)
    assert "DATA_LEAKAGE" in row and '<a href="#data-checks">Data checks</a>' in row


def test_interventions_and_confirmed_findings_are_shown(client):
    from nndx.report import InterventionResult, Interventions

    report = make_report(name="dead_relu")
    report.interventions = Interventions(steps=30, baseline_initial_loss=2.3, baseline_final_loss=2.29, results=[
        InterventionResult(cause="DEAD_RELU", remedy="bias 0 <b>x</b>", status="confirmed", steps=30,
                           baseline_final_loss=2.29, remedied_final_loss=0.4)])  # fmt: skip
    page = client.get(f"/reports/{post(client, report)}").text
    table = page.split('id="interventions-table"')[1].split("</table>")[0]
    assert "DEAD_RELU" in table and "confirmed" in table and "2.29 → 0.4" in table and "&lt;b&gt;" in table

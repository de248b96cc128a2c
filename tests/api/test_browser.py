"""The pages in a real headless Chromium, driven by Playwright: the run list filters and
ticks runs for a comparison, every figure draws with its traces, a finding's link marks
its step on its plot, names holding markup stay text, no script runs that this service
did not serve — under the strictest Content-Security-Policy the pages are meant for.

Screenshots of every page are saved for a person to look at: under
``$NNDX_SCREENSHOTS`` if set, else pytest's temporary folder; the path is printed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from nndx.api.app import create_app
from nndx.api.settings import Settings
from tests.api.conftest import LiveServer, free_socket, make_report
from tests.views.runs import run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is a test extra: pip install -e '.[test]'")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it in CI)"),
]
EVIL = "<script>document.body.appendChild(document.createElement('pwned-marker'))</script>"
#: What the pages are built to run under: scripts and styles from this service only.
STRICT_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'report-sample'; img-src 'self'; "
              "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")  # fmt: skip
#: plotly.js's map module adds an inline <style> for map traces when it loads; nndx draws no map.
KNOWN_BLOCKED_STYLE = ".maplibregl-"


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("NNDX_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the pages: {folder}")
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A live service with the real rules, three realistic runs of one project, one of
    another, and the strict CSP on every answer that does not carry the service's own.
    One per module: starting a service and storing the runs is most of a test's time."""
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path_factory.mktemp('site') / 'nndx.sqlite3'}"))

    @app.middleware("http")
    async def csp(request, call_next):  # type: ignore[no-untyped-def]
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", STRICT_CSP)
        return response

    server = LiveServer(app, free_socket()).start()
    ids = {}
    evil_run = run("evil names", project="other", bug="dead_relu", seed=3)
    evil_run.layers[0].name = EVIL
    with httpx.Client(base_url=server.url, trust_env=False) as client:  # loopback: never a proxy
        for name, report in [("healthy", run("resnet-healthy", seed=1)),
                             ("dead_relu", run("resnet-dead-relu", bug="dead_relu", seed=2)),
                             ("lr_too_high", run("resnet-lr-10", bug="lr_too_high", seed=4)),
                             ("evil", evil_run), ("small", make_report(nan_at=4))]:  # fmt: skip
            response = client.post("/v1/reports", content=report.model_dump_json(),
                                   headers={"content-type": "application/json"})  # fmt: skip
            assert response.status_code == 201, response.text
            ids[name] = response.json()["id"]
    yield server.url, ids
    server.stop()
    app.state.store.close()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-extensions", "--no-proxy-server"],
        )  # fmt: skip
        yield browser
        browser.close()


class Page:
    """A browser tab that records page errors, console errors and CSP violations."""

    def __init__(self, browser, base: str) -> None:
        self.base = base
        self.tab = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.tab.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        self.tab.add_init_script(
            "window.__violations = [];"
            "document.addEventListener('securitypolicyviolation', e =>"
            " window.__violations.push(e.effectiveDirective + ' ' + e.blockedURI + ' ' + e.sample));"
        )

    def open(self, path: str) -> None:
        response = self.tab.goto(self.base + path)
        assert response is not None and response.status == 200, path

    def draw_all(self) -> int:
        """Scroll through the page, as a reader would, until every figure has drawn."""
        count = self.tab.evaluate("document.querySelectorAll('.plot-area').length")
        for index in range(count):
            self.tab.locator(".plot-area").nth(index).scroll_into_view_if_needed()
        self.tab.wait_for_function(
            "[...document.querySelectorAll('.plot-area')].every(el => el.getAttribute('data-ready'))", timeout=30_000
        )
        return count

    def traces(self) -> dict[str, int]:
        """Traces plotly drew, by figure id (from plotly's own state of each plot)."""
        return self.tab.evaluate(
            "Object.fromEntries([...document.querySelectorAll('.plot-area')]"
            ".map(el => [el.dataset.plot, (el.data || []).length]))"
        )

    def check_clean(self) -> None:
        violations = self.tab.evaluate("window.__violations")
        blocked = [v for v in violations if not (v.startswith("style-src-elem") and KNOWN_BLOCKED_STYLE in v)]
        assert blocked == [], blocked
        assert self.errors == []

    def shot(self, folder: Path, name: str) -> Path:
        path = folder / f"{name}.png"
        self.tab.evaluate("window.scrollTo(0, 0)")
        self.tab.screenshot(path=str(path), full_page=True)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return path


def test_run_list_filters_and_compares(site, browser, shots):
    base, ids = site
    page = Page(browser, base)
    page.open("/")
    rows = page.tab.locator("#reports tbody tr")
    assert rows.count() == 5
    page.shot(shots, "runs")

    page.tab.fill("#filters input[name=project]", "digits-cnn")
    page.tab.click("#filters button[type=submit]")
    page.tab.wait_for_url("**/?*project=digits-cnn*")
    assert rows.count() == 3 and "evil names" not in page.tab.inner_text("#reports")  # 'small' is 'vision'

    page.tab.select_option("#filters select[name=cause]", "DEAD_RELU")
    page.tab.click("#filters button[type=submit]")
    page.tab.wait_for_url("**cause=DEAD_RELU**")
    assert rows.count() == 1 and "resnet-dead-relu" in page.tab.inner_text("#reports")

    page.open("/?project=digits-cnn")
    for run_id in (ids["healthy"], ids["dead_relu"], ids["lr_too_high"]):
        page.tab.check(f"input[name=id][value='{run_id}']")
    page.tab.click("#compare-form button[type=submit]")
    page.tab.wait_for_url("**/compare?**")
    assert page.tab.locator("#compared tbody tr").count() == 3
    assert page.draw_all() == 3
    traces = page.traces()
    assert set(traces) == {"loss", "grad_norm", "lr"}
    assert traces["loss"] >= 6 and traces["grad_norm"] >= 3 and traces["lr"] == 3  # train+val per run, marks
    assert page.tab.locator("#cause-matrix").count() == 1
    page.check_clean()
    page.shot(shots, "compare")


@pytest.mark.parametrize("name", ["dead_relu", "lr_too_high", "healthy"])
def test_run_page_draws_every_figure_and_links_findings_to_their_step(site, browser, shots, name):
    base, ids = site
    page = Page(browser, base)
    page.open(f"/reports/{ids[name]}")
    assert page.draw_all() >= 12
    traces = page.traces()
    for figure in ("loss", "accuracy", "grad_norm", "lr", "input_norm", "update_ratio_steps", "dead_units_steps",
                   "gradient_flow", "dead_units", "activation_std", "update_ratio", "lr_range", "overfit",
                   "class_counts"):  # fmt: skip
        assert traces.get(figure, 0) >= 1, (figure, traces)
    # the layer names, not numbers, are on the per-layer axes
    ticks = page.tab.locator("#plot-gradient_flow .yaxislayer-above text").all_text_contents()
    assert "features.conv1" in ticks and "classifier.fc2" in ticks
    assert page.tab.locator("#probes-table tbody tr").count() == 2
    assert page.tab.locator("#data-table").count() == 1 and page.tab.locator("#lr-suggestion").count() == 1
    if name == "healthy":
        assert page.tab.locator("#healthy").count() == 1
    else:
        link = page.tab.locator("a.goto[data-step]").first
        figure, step = link.get_attribute("data-figure"), float(link.get_attribute("data-step"))
        link.click()
        page.tab.wait_for_function(
            f"(document.getElementById('plot-{figure}').layout.shapes || []).some(s => s.name === 'nndx-focus')"
        )
        marked = page.tab.evaluate(
            f"document.getElementById('plot-{figure}').layout.shapes.find(s => s.name === 'nndx-focus').x0"
        )
        assert marked == step
    if name == "lr_too_high":
        notes = page.tab.locator("#fig-loss .note").all_inner_texts()
        assert any("NaN/inf values drawn as ✕" in note for note in notes)
    page.check_clean()
    page.shot(shots, f"run-{name}")


def test_markup_in_names_stays_text_in_pages_and_figures(site, browser, shots):
    base, ids = site
    page = Page(browser, base)
    for path in ("/", f"/reports/{ids['evil']}"):
        page.open(path)
        if path != "/":
            page.draw_all()
            ticks = page.tab.locator("#plot-gradient_flow .yaxislayer-above text").all_text_contents()
            assert any(t.startswith("<script>document.body") for t in ticks)  # drawn as the text it is
        assert page.tab.locator("pwned-marker").count() == 0
    page.check_clean()


def test_prompt_and_checklist_pages(site, browser, shots):
    base, ids = site
    page = Page(browser, base)
    for kind in ("prompt", "checklist"):
        page.open(f"/reports/{ids['dead_relu']}/{kind}")
        assert page.tab.locator("#markdown h1").count() == 1
        assert page.tab.locator("#markdown img, #markdown script").count() == 0
        assert page.tab.get_attribute("#download", "download").endswith(".md")
        page.check_clean()
        page.shot(shots, kind)


def test_the_served_plotly_css_is_what_plotly_would_inject(site, browser):
    """plotly.js would add its rules in an inline <style>; the pages serve them as a file
    read out of the bundle. Both, parsed by the browser, must be the same rules."""
    from nndx.api.routers.pages import plotly_bundle

    base, _ = site
    bundle = plotly_bundle()
    tab = browser.new_page()
    tab.set_content("<!doctype html><html><head></head><body></body></html>")  # no CSP: plotly injects
    tab.add_script_tag(url=f"{base}/vendor/{bundle.js_name}")
    injected = tab.evaluate("[...document.getElementById('plotly.js-style-global').sheet.cssRules].map(r => r.cssText)")
    other = browser.new_page()
    other.set_content("<!doctype html><html><head></head><body></body></html>")
    style = other.add_style_tag(content=bundle.css.decode())
    served = style.evaluate("el => [...el.sheet.cssRules].map(r => r.cssText)")
    assert len(injected) > 40 and sorted(injected) == sorted(served)


def test_a_report_page_renders_for_the_conftest_report_too(site, browser):
    """The small report most API tests use: NaN in the loss, an LR sweep ending in inf."""
    base, ids = site
    page = Page(browser, base)
    page.open(f"/reports/{ids['small']}")
    assert page.draw_all() >= 5 and all(n >= 1 for n in page.traces().values())
    page.check_clean()

"""The report page in a real headless Chromium: it renders, the plots are there, and a
layer name holding a script stays text."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.api.conftest import make_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it in CI)"),
]
EVIL = "<script>document.body.appendChild(document.createElement('pwned-marker'))</script>"


def chromium(*args: str, profile) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--no-proxy-server",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_report_page_renders_with_plots_and_inert_names(live_server, tmp_path):
    server = live_server()
    report = make_report(name="dead_relu", nan_at=4)
    report.layers[0].name = EVIL
    response = httpx.post(f"{server.url}/v1/reports", content=report.model_dump_json(),
                          headers={"content-type": "application/json"})
    assert response.status_code == 201
    url = f"{server.url}/reports/{response.json()['id']}"

    result = chromium("--dump-dom", url, profile=tmp_path / "profile")
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<h2>Findings</h2>" in dom and "DEAD_RELU" in dom
    for plot_id in ("loss", "lr_range", "gradient_flow", "dead_units", "activation_std"):
        assert f'data-plot="{plot_id}"' in dom, plot_id
    assert dom.count("<polyline") >= 5
    # the browser parsed the name as text: no element was created by it
    assert "<pwned-marker" not in dom
    assert "&lt;script&gt;document.body.appendChild" in dom

    shot = tmp_path / "page.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1200,2400", url, profile=tmp_path / "profile2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

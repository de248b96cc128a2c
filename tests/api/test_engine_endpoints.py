"""The endpoints that compose the real rule engine and renderers (no stand-ins here)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from nndx.report import DataStats, DiagnosticReport, RunInfo, SplitStats
from tests.api.conftest import both_backends, make_report

database_url = both_backends  # every test here on SQLite and on PostgreSQL

JSON = {"content-type": "application/json"}


@pytest.fixture
def client(make_app, monkeypatch) -> TestClient:
    for name in ("NNDX_LLM_BASE_URL", "NNDX_LLM_MODEL", "NNDX_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return TestClient(make_app(fake_rules=False))


def nan_inputs() -> DiagnosticReport:
    return DiagnosticReport(
        run=RunInfo(name="nan-inputs", project="p"),
        data=DataStats(train=SplitStats(n_samples=100, input_nan_count=5)),
    )


def post(client, report):
    response = client.post("/v1/reports", content=report.model_dump_json(), headers=JSON)
    assert response.status_code == 201, response.text
    return response.json()


def test_post_diagnoses_with_the_rule_engine_and_indexes_the_cause(client):
    created = post(client, nan_inputs())
    assert created["diagnosis"]["findings"][0]["code"] == "NAN_IN_DATA"
    assert created["diagnosis"]["rules_run"] > 0
    healthy = post(client, make_report(name="healthy"))
    assert [f for f in healthy["diagnosis"]["findings"] if f["severity"] != "info"] == []
    listed = client.get("/v1/reports", params={"cause": "NAN_IN_DATA"}).json()["items"]
    assert [r["id"] for r in listed] == [created["id"]]
    assert listed[0]["top_cause"] == "NAN_IN_DATA" and listed[0]["severity_max"] == "error"


def test_stateless_diagnose_matches_the_stored_diagnosis(client):
    created = post(client, nan_inputs())
    stateless = client.post("/v1/diagnose", content=nan_inputs().model_dump_json(), headers=JSON)
    assert stateless.status_code == 200
    assert stateless.json() == client.get(f"/v1/reports/{created['id']}/diagnosis").json()


@pytest.mark.parametrize("path, marker", [("prompt", "NAN_IN_DATA"), ("checklist", "NaN")])
def test_prompt_and_checklist_are_markdown_from_the_renderer(client, path, marker):
    from nndx.prompts import render
    from nndx.rules import diagnose

    report_id = post(client, nan_inputs())["id"]
    response = client.get(f"/v1/reports/{report_id}/{path}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/markdown")
    name = "prompt-nn-debugger.md" if path == "prompt" else "skill-debug-checklist.md"
    stored = DiagnosticReport.model_validate_json(client.get(f"/v1/reports/{report_id}").text)
    assert response.text == render(report=stored, diagnosis=diagnose(stored))[name]
    assert marker in response.text


def test_explain_is_rule_only_offline_and_without_an_llm(client):
    report_id = post(client, nan_inputs())["id"]
    offline = client.post(f"/v1/reports/{report_id}/explain", params={"offline": "true"})
    assert offline.status_code == 200
    assert offline.json()["source"] == "rules" and "offline" in offline.json()["reason"]
    assert "NAN_IN_DATA" in offline.json()["text"]
    unconfigured = client.post(f"/v1/reports/{report_id}/explain").json()
    assert unconfigured["source"] == "rules" and "NNDX_LLM_BASE_URL" in unconfigured["reason"]


def test_report_page_shows_the_real_findings(client):
    report_id = post(client, make_report(name="diverged", nan_at=5))["id"]
    page = client.get(f"/reports/{report_id}").text
    assert "LR_TOO_HIGH" in page and 'data-plot="loss"' in page

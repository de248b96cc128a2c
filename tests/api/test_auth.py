"""Bearer tokens scoped to projects: no data without a valid token, no cross-project reads."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from nndx.api.settings import Settings, SettingsError
from tests.api.conftest import both_backends, make_report

database_url = both_backends  # every test here on SQLite and on PostgreSQL

TOKENS = {"token-a": "alpha", "token-b": "beta"}
JSON = {"content-type": "application/json"}


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def client(make_app) -> TestClient:
    return TestClient(make_app(tokens=TOKENS))


def post(client, report, token):
    return client.post("/v1/reports", content=report.model_dump_json(), headers=JSON | auth(token))


@pytest.mark.parametrize("headers", [{}, auth("wrong"), {"authorization": "Basic dG9rZW4tYTp4"}, auth("")])
def test_no_valid_token_gets_no_data(client, headers):
    report_id = post(client, make_report(project=None), "token-a").json()["id"]
    requests = [
        ("GET", "/v1/reports"), ("GET", f"/v1/reports/{report_id}"), ("GET", f"/v1/reports/{report_id}/diagnosis"),
        ("GET", f"/v1/reports/{report_id}/prompt"), ("GET", f"/v1/reports/{report_id}/checklist"),
        ("POST", f"/v1/reports/{report_id}/explain"), ("GET", "/"), ("GET", f"/reports/{report_id}"),
    ]
    for method, path in requests:
        response = client.request(method, path, headers=headers)
        assert response.status_code == 401, (method, path)
        assert report_id not in response.text
        assert response.headers["www-authenticate"] == "Bearer"
    body = make_report().model_dump_json()
    assert client.post("/v1/reports", content=body, headers=JSON | headers).status_code == 401
    assert client.post("/v1/diagnose", content=body, headers=JSON | headers).status_code == 401
    assert client.get("/healthz").status_code == 200  # liveness reveals nothing


def test_post_sets_the_project_from_the_token(client):
    created = post(client, make_report(project=None), "token-a").json()
    assert created["project"] == "alpha"
    stored = client.get(f"/v1/reports/{created['id']}", headers=auth("token-a")).json()
    assert stored["run"]["project"] == "alpha"
    no_run = make_report().model_copy(update={"run": None})
    assert post(client, no_run, "token-b").json()["project"] == "beta"


def test_post_for_another_project_is_refused(client):
    response = post(client, make_report(project="beta"), "token-a")
    assert response.status_code == 403
    assert client.get("/v1/reports", headers=auth("token-b")).json()["items"] == []


def test_a_token_never_reads_lists_or_explains_another_projects_reports(client):
    theirs = post(client, make_report(project="beta", name="dead_relu"), "token-b").json()["id"]
    mine = post(client, make_report(project="alpha", name="dead_relu"), "token-a").json()["id"]
    a = auth("token-a")
    for path in ("", "/diagnosis", "/prompt", "/checklist"):
        assert client.get(f"/v1/reports/{theirs}{path}", headers=a).status_code == 404
    assert client.post(f"/v1/reports/{theirs}/explain", headers=a).status_code == 404
    assert client.get(f"/reports/{theirs}", headers=a).status_code == 404
    # 404 for another project's report reads exactly like an id that does not exist
    assert client.get(f"/v1/reports/{theirs}", headers=a).json() == client.get(
        "/v1/reports/ffffffffffffffffffffffffffffffff", headers=a).json()
    for params in ({}, {"project": "beta"}, {"cause": "DEAD_RELU"}, {"run_name": "dead_relu"}):
        listed = client.get("/v1/reports", params=params, headers=a).json()
        assert theirs not in {r["id"] for r in listed["items"]}
    assert [r["id"] for r in client.get("/v1/reports", headers=a).json()["items"]] == [mine]
    assert theirs not in client.get("/", headers=a).text
    assert client.get(f"/v1/reports/{mine}", headers=a).status_code == 200


def test_tokens_from_environment_and_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# comment\nfile-token:gamma\n\n")
    settings = Settings.from_env({"NNDX_TOKENS": "t1:alpha, t2:beta", "NNDX_TOKENS_FILE": str(path)})
    assert dict(settings.tokens) == {"t1": "alpha", "t2": "beta", "file-token": "gamma"}
    assert not Settings.from_env({}).auth_enabled


@pytest.mark.parametrize("tokens", ["no-colon", ":project", "token:", "a:b,broken"])
def test_malformed_token_settings_are_refused_without_echoing_secrets(tokens):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"NNDX_TOKENS": tokens})
    assert "no-colon" not in str(info.value) and "broken" not in str(info.value)


def test_another_projects_idempotency_key_behaves_as_unused(client):
    """A key that project beta used tells alpha nothing: alpha's report is stored anew."""
    key = {"idempotency-key": "shared-key"}
    theirs = client.post("/v1/reports", content=make_report(project=None, name="b").model_dump_json(),
                         headers=JSON | auth("token-b") | key)
    mine = client.post("/v1/reports", content=make_report(project=None, name="a").model_dump_json(),
                       headers=JSON | auth("token-a") | key)
    assert (theirs.status_code, mine.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"] and mine.json()["project"] == "alpha"

"""The v1 JSON API over TestClient: status codes, bodies, NaN fidelity, bad input."""

from __future__ import annotations

import json

import pytest

from nndx.report import Diagnosis, DiagnosticReport
from tests.api.conftest import both_backends, make_report

database_url = both_backends  # every test here on SQLite and on PostgreSQL

JSON = {"content-type": "application/json"}


def post(client, report: DiagnosticReport, **headers):
    return client.post("/v1/reports", content=report.model_dump_json(), headers=JSON | headers)


def test_post_stores_and_answers_201_with_id_and_diagnosis(client):
    response = post(client, make_report(name="dead_relu"))
    assert response.status_code == 201
    body = response.json()
    assert body["url"] == f"/v1/reports/{body['id']}"
    diagnosis = Diagnosis.model_validate(body["diagnosis"])
    assert diagnosis.top().code.value == "DEAD_RELU"
    # NaN evidence reaches the client as the string "NaN", never null or a bare NaN
    assert '"value":"NaN"' in response.text
    assert client.get(body["url"]).status_code == 200


def test_get_returns_the_report_exactly_nan_and_infinity_included(client):
    report = make_report(nan_at=4)
    report_id = post(client, report).json()["id"]
    response = client.get(f"/v1/reports/{report_id}")
    assert response.headers["content-type"].startswith("application/json")
    back = DiagnosticReport.model_validate_json(response.text)
    assert back.model_dump_json() == report.model_dump_json()
    assert json.loads(response.text)["loss_history"]["train"][4]["value"] == "NaN"
    assert json.loads(response.text)["probes"]["lr_range"]["losses"][-1] == "Infinity"


def test_diagnosis_endpoint_returns_the_stored_diagnosis(client):
    created = post(client, make_report(name="overfitting")).json()
    response = client.get(f"/v1/reports/{created['id']}/diagnosis")
    assert response.status_code == 200
    assert response.json() == created["diagnosis"]


def test_list_filters_and_paginates(client):
    ids = {name: post(client, make_report(name=name, project=project)).json()["id"]
           for name, project in [("dead_relu-1", "a"), ("overfitting-2", "a"), ("dead_relu-3", "b")]}
    listed = client.get("/v1/reports", params={"cause": "DEAD_RELU"}).json()
    assert [r["id"] for r in listed["items"]] == [ids["dead_relu-3"], ids["dead_relu-1"]]
    assert listed["items"][0]["top_cause"] == "DEAD_RELU"
    assert [r["id"] for r in client.get("/v1/reports", params={"project": "a"}).json()["items"]] == [
        ids["overfitting-2"], ids["dead_relu-1"]]
    assert [r["id"] for r in client.get("/v1/reports", params={"run_name": "overfitting-2"}).json()["items"]] == [
        ids["overfitting-2"]]
    page = client.get("/v1/reports", params={"limit": 2}).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = client.get("/v1/reports", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [r["id"] for r in rest["items"]] == [ids["dead_relu-1"]] and rest["next_cursor"] is None


def test_list_filters_for_the_run_browser(client):
    """Project, cause, least severity, date range and run-name search, with pagination."""
    names = ["ResNet dead_relu", "resnet overfitting", "mlp lr_too_high", "MLP healthy", "resnet-b dead_relu"]
    ids = {name: post(client, make_report(name=name, project="a" if i < 3 else "b")).json()["id"]
           for i, name in enumerate(names)}

    def listed(**params):
        return [r["run_name"] for r in client.get("/v1/reports", params=params).json()["items"]]

    assert listed(q="RESNET") == ["resnet-b dead_relu", "resnet overfitting", "ResNet dead_relu"]
    assert listed(q="resnet", project="a", cause="DEAD_RELU") == ["ResNet dead_relu"]
    assert listed(severity="error", project="b") == ["resnet-b dead_relu"]
    assert "MLP healthy" not in listed(severity="info")
    created = client.get(f"/v1/reports/{ids['MLP healthy']}")
    assert created.status_code == 200
    assert listed(since="2000-01-01T00:00:00Z", until="2000-01-02T00:00:00+01:00") == []
    assert len(listed(since="2000-01-01T00:00:00Z")) == 5
    first = client.get("/v1/reports", params={"q": "resnet", "limit": 2}).json()
    rest = client.get("/v1/reports", params={"q": "resnet", "limit": 2, "cursor": first["next_cursor"]}).json()
    assert [r["run_name"] for r in first["items"] + rest["items"]] == listed(q="resnet")
    assert rest["next_cursor"] is None


@pytest.mark.parametrize(
    "params, field",
    [({"cause": "NOT_A_CAUSE"}, "cause"), ({"limit": 0}, "limit"), ({"limit": 10_000}, "limit"),
     ({"cursor": "garbage"}, "cursor"), ({"cursor": "djE6OTIyMzM3MjAzNjg1NDc3NTgwOA"}, "cursor"),  # v1:2**63
     ({"cursor": "djE6MjE0NzQ4MzY0OA"}, None),  # v1:2**31 is a valid position
     ({"severity": "fatal"}, "severity"), ({"since": "yesterday"}, "since"), ({"until": "99999-01-01"}, "until"),
     ({"project": "a\x00b"}, "project"), ({"q": "x\x00"}, "q"), ({"run_name": "r" * 501}, "run_name"),
     ({"project": "p" * 201}, "project")],
)
def test_bad_list_parameters_are_422_naming_the_parameter(client, params, field):
    response = client.get("/v1/reports", params=params)
    if field is None:
        assert response.status_code == 200 and response.json()["items"] == []
        return
    assert response.status_code == 422
    assert ["query", field] in [e["loc"] for e in response.json()["detail"]]


def test_unknown_report_is_404_on_every_report_endpoint(client):
    for path in ("", "/diagnosis", "/prompt", "/checklist"):
        assert client.get(f"/v1/reports/0123456789abcdef{path}").status_code == 404
    assert client.post("/v1/reports/0123456789abcdef/explain").status_code == 404
    assert client.get("/reports/0123456789abcdef").status_code == 404


def test_schema_violation_is_422_naming_the_field(client):
    bad = json.loads(make_report().model_dump_json())
    bad["layers"][1]["activation"]["dead_unit_fraction"] = 1.5
    response = client.post("/v1/reports", json=bad)
    assert response.status_code == 422
    locs = [e["loc"] for e in response.json()["detail"]]
    assert ["body", "layers", "1", "activation", "dead_unit_fraction"] in locs
    unknown = client.post("/v1/reports", json={"run": {"nmae": "typo"}})
    assert unknown.status_code == 422
    assert ["body", "run", "nmae"] in [e["loc"] for e in unknown.json()["detail"]]


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe\x00", b"", b"[1, 2", b'{"num_classes": NaN}'])
def test_malformed_json_is_422_not_5xx(client, body):
    response = client.post("/v1/reports", content=body, headers=JSON)
    assert response.status_code == 422
    assert response.json()["detail"]
    assert client.get("/v1/reports").json()["items"] == []


def test_body_over_the_limit_is_413_with_or_without_content_length(make_app):
    from fastapi.testclient import TestClient

    client = TestClient(make_app(max_body_bytes=2048))
    big = make_report(layers=40).model_dump_json().encode()
    assert len(big) > 2048
    assert client.post("/v1/reports", content=big, headers=JSON).status_code == 413

    def chunked():  # no Content-Length: the limit must still hold
        for start in range(0, len(big), 512):
            yield big[start:start + 512]

    response = client.post("/v1/reports", content=chunked(), headers=JSON)
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    small = make_report(layers=1, name=None).model_copy(update={"probes": None, "loss_history": {}})
    assert post(client, small).status_code == 201
    assert len(client.get("/v1/reports").json()["items"]) == 1


@pytest.mark.parametrize("run, loc", [
    ({"name": "nul\x00here"}, ["body", "run", "name"]), ({"project": "\x00"}, ["body", "run", "project"]),
    ({"name": "n" * 3000}, ["body", "run", "name"]), ({"project": "p" * 3000}, ["body", "run", "project"]),
])
def test_text_no_backend_can_index_is_422_naming_the_field(client, run, loc):
    response = client.post("/v1/reports", content=json.dumps({"run": run}), headers=JSON)
    assert response.status_code == 422
    assert loc in [e["loc"] for e in response.json()["detail"]]
    assert client.get("/v1/reports").json()["items"] == []


def test_nul_in_ids_and_filters_is_never_a_5xx(client):
    report_id = post(client, make_report(name="n")).json()["id"]
    assert client.get("/v1/reports/abc%00def").status_code == 404
    assert client.get(f"/v1/reports/{report_id}%00").status_code == 404
    assert client.get("/", params={"cursor": "\x00"}).status_code == 422


def test_stateless_diagnose_stores_nothing(client):
    response = client.post("/v1/diagnose", content=make_report(name="dead_relu").model_dump_json(), headers=JSON)
    assert response.status_code == 200
    assert Diagnosis.model_validate(response.json()).top().code.value == "DEAD_RELU"
    assert client.get("/v1/reports").json()["items"] == []


def test_idempotency_key_makes_a_retry_harmless(client):
    first = post(client, make_report(), **{"idempotency-key": "abc"})
    again = post(client, make_report(), **{"idempotency-key": "abc"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert len(client.get("/v1/reports").json()["items"]) == 1


def test_an_idempotency_key_reused_for_another_report_is_409_naming_it(client):
    assert post(client, make_report(name="one"), **{"idempotency-key": "key-1"}).status_code == 201
    response = post(client, make_report(name="two"), **{"idempotency-key": "key-1"})
    assert response.status_code == 409
    assert "key-1" in response.json()["detail"]
    assert len(client.get("/v1/reports").json()["items"]) == 1


def test_healthz(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_openapi_documents_every_endpoint_with_a_response_model(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    expected = {
        ("/v1/reports", "post"), ("/v1/reports", "get"), ("/v1/reports/{report_id}", "get"),
        ("/v1/reports/{report_id}/diagnosis", "get"), ("/v1/reports/{report_id}/prompt", "get"),
        ("/v1/reports/{report_id}/checklist", "get"), ("/v1/reports/{report_id}/explain", "post"),
        ("/v1/diagnose", "post"), ("/healthz", "get"),
    }
    for path, method in expected:
        operation = paths[path][method]
        success = operation["responses"].get("201") or operation["responses"]["200"]
        assert success.get("content"), (path, method)
    assert "text/markdown" in paths["/v1/reports/{report_id}/prompt"]["get"]["responses"]["200"]["content"]
    assert "404" in paths["/v1/reports/{report_id}"]["get"]["responses"]
    for path in ("/v1/reports", "/v1/diagnose"):  # bodies are validated from bytes, still documented
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/DiagnosticReport"}
        assert "422" in paths[path]["post"]["responses"]
    assert "DiagnosticReport" in spec["components"]["schemas"]


def test_a_rule_engine_failure_is_422_and_stores_nothing(make_app):
    from fastapi.testclient import TestClient

    from nndx.api.deps import get_diagnose

    app = make_app()

    def broken(report):
        raise ValueError("rule crashed")

    app.dependency_overrides[get_diagnose] = lambda: broken
    client = TestClient(app)
    for path in ("/v1/reports", "/v1/diagnose"):
        response = client.post(path, content=make_report().model_dump_json(), headers=JSON)
        assert response.status_code == 422
        assert "ValueError: rule crashed" in response.json()["detail"][0]["msg"]
    assert client.get("/v1/reports").json()["items"] == []


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_a_body_that_is_not_declared_json_is_415(client, content_type):
    """What a web page can send to a service on the user's machine without a CORS
    preflight (text/plain, a form) never stores a report."""
    headers = {"content-type": content_type} if content_type else {}
    for path in ("/v1/reports", "/v1/diagnose"):
        response = client.post(path, content=make_report().model_dump_json(), headers=headers)
        assert response.status_code == 415, (path, content_type)
    assert client.get("/v1/reports").json()["items"] == []
    assert post(client, make_report(), **{"content-type": "application/json; charset=utf-8"}).status_code == 201


def test_every_answer_carries_the_security_headers(client):
    from nndx.api.limits import CONTENT_SECURITY_POLICY

    report_id = post(client, make_report()).json()["id"]
    for path in ("/", f"/reports/{report_id}", "/v1/reports", "/healthz", "/nowhere"):
        headers = client.get(path).headers
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "script-src 'self';" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"


def test_a_store_that_cannot_answer_is_a_json_503_on_a_connection_kept_open(make_app, live_server):
    """The database stopped under the service: JSON 503 with Retry-After, not a reset
    connection; the same connection serves the next request."""
    import socket

    from sqlalchemy import create_engine

    app = make_app()
    server = live_server(app)
    app.state.store.engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    port = int(server.url.rsplit(":", 1)[1])
    body = make_report().model_dump_json().encode()
    requests = [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/reports HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body,
    ]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for request in requests:
            sock.sendall(request)
            status = reader.readline()
            headers = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            content = reader.read(int(headers["content-length"]))
            assert status.startswith(b"HTTP/1.1 503"), (request[:20], status, content)
            assert headers["retry-after"] == "5" and headers.get("connection") != "close"
            assert json.loads(content)["detail"].startswith("the report store is unavailable")

"""Property-based tests of every endpoint from the OpenAPI schema (schemathesis):
whatever the input, the service answers no 5xx and its answers match its schema."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a test extra: pip install -e '.[test]'")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from nndx.api.app import create_app  # noqa: E402
from nndx.api.settings import Settings  # noqa: E402
from tests.api.conftest import make_report  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _app():
    # schemathesis' lazy fixture loader does not work with this pytest, so the schema is
    # built at import, on a temporary database removed at exit. The real rule engine and
    # renderers run: a crash anywhere behind an endpoint must show.
    folder = Path(tempfile.mkdtemp(prefix="nndx-schemathesis-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    app = create_app(Settings(database_url=f"sqlite:///{folder / 'nndx.sqlite3'}"))
    client = TestClient(app)
    for name in ("dead_relu", "healthy"):  # stored reports, so some reads hit real ids
        client.post("/v1/reports", content=make_report(name=name, nan_at=2).model_dump_json(),
                    headers={"content-type": "application/json"})
    return app


APP = _app()
REPORT_BODY = {"name": ["POST /v1/reports", "POST /v1/diagnose"]}
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(**REPORT_BODY)
# For the two operations that take a DiagnosticReport body, schemathesis' coverage phase
# alone generates ~2,200 requests (every boundary of every field; ~30 s here), whatever
# max_examples says: they run the explicit-examples and fuzzing phases only.
report_schema = schemathesis.openapi.from_asgi("/openapi.json", APP).include(**REPORT_BODY)
report_schema.config.phases.update(phases=["examples", "fuzzing"])
BOUNDS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True, "database": None}


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=30, **BOUNDS)
def test_no_5xx_and_schema_conformant_answers(case):
    case.call_and_validate(checks=CHECKS)


@pytest.mark.slow
@report_schema.parametrize()
@settings(max_examples=30, **BOUNDS)
def test_report_bodies_no_5xx_and_schema_conformant_answers(case):
    case.call_and_validate(checks=CHECKS)

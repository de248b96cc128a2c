"""Property-based tests of every endpoint from the OpenAPI schema (schemathesis):
whatever the input, the service answers no 5xx and its answers match its schema."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
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
from tests.api.conftest import POSTGRES_ENV, make_report  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _app(database_url: str):
    # schemathesis' lazy fixture loader does not work with this pytest, so the schema is
    # built at import. The real rule engine and renderers run: a crash anywhere behind
    # an endpoint must show.
    app = create_app(Settings(database_url=database_url))
    client = TestClient(app)
    for name in ("dead_relu", "healthy"):  # stored reports, so some reads hit real ids
        client.post("/v1/reports", content=make_report(name=name, nan_at=2).model_dump_json(),
                    headers={"content-type": "application/json"})
    return app


def _sqlite_url() -> str:
    folder = Path(tempfile.mkdtemp(prefix="nndx-schemathesis-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return f"sqlite:///{folder / 'nndx.sqlite3'}"


def _postgres_url() -> tuple[str | None, str]:
    """A fresh schema on the test server (dropped at exit), or None and why not."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        return None, f"{POSTGRES_ENV} is not set: no PostgreSQL server for this run (.ci/run starts one)"
    try:
        import psycopg
        from sqlalchemy.engine import make_url

        base = make_url(url)
        plain = base.set(drivername="postgresql").render_as_string(hide_password=False)
        schema = f"nndx_schemathesis_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(plain, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except Exception as exc:  # noqa: BLE001 - any reason there is no server is a reason to skip
        return None, f"the PostgreSQL server at {POSTGRES_ENV} cannot be used: {type(exc).__name__}: {exc}"

    def drop() -> None:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    atexit.register(drop)
    return base.set(drivername="postgresql+psycopg").update_query_dict(
        {"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False), ""


APP = _app(_sqlite_url())
POSTGRES_URL, NO_POSTGRES = _postgres_url()
POSTGRES_APP = _app(POSTGRES_URL) if POSTGRES_URL else APP
REPORT_BODY = {"name": ["POST /v1/reports", "POST /v1/diagnose"]}


def schemas(app):
    """Every operation but the two taking a report body; those two alone. For those,
    schemathesis' coverage phase alone generates ~2,200 requests (every boundary of
    every field; ~30 s here), whatever max_examples says: they run the explicit-examples
    and fuzzing phases only."""
    everything = schemathesis.openapi.from_asgi("/openapi.json", app).exclude(**REPORT_BODY)
    reports = schemathesis.openapi.from_asgi("/openapi.json", app).include(**REPORT_BODY)
    reports.config.phases.update(phases=["examples", "fuzzing"])
    return everything, reports


schema, report_schema = schemas(APP)
postgres_schema, postgres_report_schema = schemas(POSTGRES_APP)
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


needs_postgres = pytest.mark.skipif(POSTGRES_URL is None, reason=f"PostgreSQL tests skipped: {NO_POSTGRES}")


@pytest.mark.slow
@needs_postgres
@postgres_schema.parametrize()
@settings(max_examples=30, **BOUNDS)
def test_postgres_no_5xx_and_schema_conformant_answers(case):
    case.call_and_validate(checks=CHECKS)


@pytest.mark.slow
@needs_postgres
@postgres_report_schema.parametrize()
@settings(max_examples=30, **BOUNDS)
def test_postgres_report_bodies_no_5xx_and_schema_conformant_answers(case):
    case.call_and_validate(checks=CHECKS)

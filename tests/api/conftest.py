"""Fixtures for the service tests: an app on a fresh store, a live server, reports.

The store is a fresh SQLite file by default. A module that sets
``database_url = both_backends`` runs each of its tests on SQLite and on PostgreSQL:
the server named by ``NNDX_TEST_POSTGRES_URL`` (``.ci/run`` starts one; so does
``.ci/postgres-server``), each test in a schema of its own. Without that variable, or
with the server unreachable, the PostgreSQL runs skip and say why.
"""

from __future__ import annotations

import os
import socket
import uuid
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from nndx.api.app import create_app
from nndx.api.deps import get_diagnose
from nndx.api.settings import Settings
from nndx.report import (
    ActivationStats,
    CauseCode,
    Diagnosis,
    DiagnosticReport,
    Finding,
    GradientStats,
    LayerStats,
    LossPoint,
    LRRangeResult,
    Probes,
    RunInfo,
)


@pytest.fixture(autouse=True)
def _direct_loopback(monkeypatch) -> None:
    """The live-server tests talk to 127.0.0.1: a proxy from the environment (CI) must
    not be asked to reach it. nndx.client itself honours proxies, as users expect."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def make_report(
    *, project: str | None = "vision", name: str | None = "run-1", layers: int = 4, nan_at: int | None = None
) -> DiagnosticReport:
    """A small report with a loss curve (NaN at ``nan_at``), an LR range test and layer stats."""
    losses = [2.3 - 0.1 * step for step in range(10)]
    if nan_at is not None:
        losses[nan_at] = float("nan")
    return DiagnosticReport(
        run=RunInfo(name=name, project=project),
        loss_history={
            "train": [LossPoint(step=s, value=v) for s, v in enumerate(losses)],
            "val": [LossPoint(step=s, value=v + 0.2) for s, v in enumerate(losses) if s % 3 == 0],
        },
        layers=[
            LayerStats(
                name=f"blocks.{i}.fc",
                type="Linear",
                step=0,
                activation=ActivationStats(
                    mean=0.1, std=0.5 / (i + 1), min=0.0, max=2.0, zero_fraction=0.5, dead_unit_fraction=min(1.0, 0.05 * i)
                ),
                gradient=GradientStats(abs_mean=1e-3 / (i + 1), max=0.1, norm=0.5 / (i + 1)),
            )
            for i in range(layers)
        ],
        probes=Probes(
            lr_range=LRRangeResult(
                status="passed",
                lrs=[1e-5 * 10 ** (k / 2) for k in range(10)],
                losses=[2.3, 2.3, 2.2, 2.0, 1.6, 1.2, 1.0, 1.4, 3.0, float("inf")],
            )
        ),
    )


def fake_diagnosis(report: DiagnosticReport) -> Diagnosis:
    """A controlled stand-in for the rule engine, for tests of storage/filtering/auth
    that must not depend on rule thresholds: the run name picks the causes."""
    name = (report.run.name if report.run else None) or ""
    codes = [code for code in CauseCode if code.value.lower() in name.lower()]
    return Diagnosis(
        findings=[
            Finding(
                rule_id=f"fake-{code.value.lower()}",
                code=code,
                severity="error" if i == 0 else "warning",
                title=f"{code.value} title",
                symptom="fake symptom",
                evidence={"value": float("nan"), "layer": "blocks.0.fc"},
                fix="fake fix",
            )
            for i, code in enumerate(codes)
        ],
        rules_run=1,
    )


POSTGRES_ENV = "NNDX_TEST_POSTGRES_URL"


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The PostgreSQL server of this test run, or a skip that says why there is none."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"PostgreSQL tests skipped: {POSTGRES_ENV} is not set, so no PostgreSQL server was "
                    "given to this run (.ci/run installs and starts one; locally: "
                    "export NNDX_TEST_POSTGRES_URL=$(.ci/postgres-server))")
    psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests skipped: psycopg is not installed "
                                  "(pip install -e '.[test]' installs nndx[postgres])")
    from sqlalchemy.engine import make_url

    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        psycopg.connect(plain, connect_timeout=5).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL tests skipped: the server at {POSTGRES_ENV} is unreachable: {exc}")
    return url


@pytest.fixture
def postgres_url(postgres_server_url) -> Iterator[str]:
    """A SQLAlchemy URL on the test server whose tables live in a fresh schema, dropped after."""
    import psycopg
    from sqlalchemy.engine import make_url

    schema = f"nndx_test_{uuid.uuid4().hex[:16]}"
    base = make_url(postgres_server_url)
    plain = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield base.set(drivername="postgresql+psycopg").update_query_dict(
            {"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def database_url(tmp_path) -> str:
    """The store of a test: a fresh SQLite file."""
    return f"sqlite:///{tmp_path / 'nndx.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgresql"], name="database_url")
def both_backends(request, tmp_path) -> str:
    """``database_url = both_backends`` in a module: each test on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'nndx.sqlite3'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def make_app(database_url) -> Callable[..., FastAPI]:
    """Build an app on the test's store; ``fake_rules=True`` swaps in :func:`fake_diagnosis`."""
    apps: list[FastAPI] = []

    def build(*, tokens: dict[str, str] | None = None, max_body_bytes: int = 4 * 1024 * 1024,
              fake_rules: bool = True, **settings_values) -> FastAPI:
        settings = Settings(
            database_url=database_url, tokens=tokens or {}, max_body_bytes=max_body_bytes, **settings_values
        )
        app = create_app(settings)
        if fake_rules:
            app.dependency_overrides[get_diagnose] = lambda: fake_diagnosis
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.state.store.close()


@pytest.fixture
def client(make_app) -> TestClient:
    return TestClient(make_app())


def free_socket() -> socket.socket:
    """A bound, not yet listening, loopback socket: connecting to it is refused until
    a server starts listening on it — a server that is down, then up."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LiveServer:
    """uvicorn serving ``app`` in a thread on ``sock``."""

    def __init__(self, app: FastAPI, sock: socket.socket) -> None:
        import uvicorn

        self.sock = sock
        self.url = "http://127.0.0.1:%d" % sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_server(make_app) -> Iterator[Callable[..., LiveServer]]:
    servers: list[LiveServer] = []

    def start(app: FastAPI | None = None, sock: socket.socket | None = None) -> LiveServer:
        server = LiveServer(app or make_app(), sock or free_socket()).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()

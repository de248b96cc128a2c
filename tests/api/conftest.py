"""Fixtures for the service tests: an app on a fresh SQLite file, a live server, reports."""

from __future__ import annotations

import socket
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


@pytest.fixture
def make_app(tmp_path) -> Callable[..., FastAPI]:
    """Build an app on a fresh SQLite file; ``fake_rules=True`` swaps in :func:`fake_diagnosis`."""
    apps: list[FastAPI] = []

    def build(*, tokens: dict[str, str] | None = None, max_body_bytes: int = 4 * 1024 * 1024,
              fake_rules: bool = True, database: str = "nndx.sqlite3") -> FastAPI:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / database}", tokens=tokens or {}, max_body_bytes=max_body_bytes
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

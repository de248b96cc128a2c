"""Fixtures of the prompts tests; the reports themselves are in prompts_reports.py."""

from __future__ import annotations

import pytest
from prompts_reports import make_broken_diagnosis, make_broken_report, make_healthy_diagnosis, make_healthy_report

from nndx.report import Diagnosis, DiagnosticReport


@pytest.fixture
def healthy_report() -> DiagnosticReport:
    return make_healthy_report()


@pytest.fixture
def healthy_diagnosis() -> Diagnosis:
    return make_healthy_diagnosis()


@pytest.fixture
def broken_report() -> DiagnosticReport:
    return make_broken_report()


@pytest.fixture
def broken_diagnosis() -> Diagnosis:
    return make_broken_diagnosis()


@pytest.fixture(autouse=True)
def no_proxy_for_loopback(monkeypatch):
    """httpx honours *_PROXY variables; the local test server must be reached directly."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

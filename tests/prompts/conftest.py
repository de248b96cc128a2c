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

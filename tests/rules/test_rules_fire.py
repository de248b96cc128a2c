"""Every rule fires on a broken report and stays silent on realistic healthy runs."""

from __future__ import annotations

import pytest

from nndx.report import SEVERITY_ORDER
from nndx.rules import REGISTRY, diagnose

from .broken import BROKEN
from .reports import healthy_reports

HEALTHY = healthy_reports()
# Info findings that are the honest description of a healthy run, never alarms.
EXPECTED_INFO = {
    "accumulation": {"NNDX302"},
    "frozen_backbone": {"NNDX305"},
    "noisy_task_plateau": {"NNDX108", "NNDX105"},
    "step_decay": {"NNDX602"},
    "adam_large_ratio": {"NNDX205"},
    "one_cycle": {"NNDX602"},  # its peak LR is 30x the range test's suggestion, and the loss falls
}


def test_every_rule_has_a_broken_report():
    assert set(BROKEN) == set(REGISTRY)


@pytest.mark.parametrize("rule_id", sorted(REGISTRY))
def test_rule_fires_on_its_broken_report(rule_id):
    findings = [f for f in diagnose(BROKEN[rule_id]()).findings if f.rule_id == rule_id]
    assert findings, f"{rule_id} did not fire"
    assert all(f.code == REGISTRY[rule_id].code for f in findings)
    assert all(f.evidence for f in findings)


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_run_has_no_warning(name):
    diagnosis = diagnose(HEALTHY[name])
    alarms = [(f.rule_id, f.symptom) for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= 1]
    assert alarms == [] and diagnosis.healthy
    assert {f.rule_id for f in diagnosis.findings} <= EXPECTED_INFO.get(name, set())


def test_broken_reports_are_not_healthy():
    healthy = {rule_id for rule_id, build in BROKEN.items() if diagnose(build()).healthy}
    # only the context rules (plateau, underfitting, a probe that could not run, stop-gradients that
    # are often the method) describe a broken report as info
    assert healthy == {"NNDX002", "NNDX105", "NNDX108", "NNDX618"}

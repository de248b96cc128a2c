"""Render reports that the real collector produced, diagnosed by the real rule engine.

tests/prompts/data/demo_*.json are ``nndx.demo.run_scenario`` reports (a 2-hidden-layer
MLP on Gaussian blobs, watched by the Monitor and probed). Regenerate them with::

    .venv/bin/python -c "from nndx.demo import SCENARIOS, run_scenario
    for s in SCENARIOS:
        if s.name in ('healthy', 'lr_too_high'):
            open(f'tests/prompts/data/demo_{s.name}.json', 'w').write(run_scenario(s)[0].model_dump_json())"
"""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_structure import check_structure

from nndx.prompts import render
from nndx.prompts.checklist import build_checklist
from nndx.report import DiagnosticReport
from nndx.rules import diagnose

DATA = Path(__file__).parent / "data"


def load(name: str) -> DiagnosticReport:
    return DiagnosticReport.model_validate_json((DATA / f"demo_{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["healthy", "lr_too_high"])
def test_real_reports_render_with_intact_structure(name):
    files = render(load(name))
    for text in files.values():
        check_structure(text)
    assert "### Activations and gradients per layer" in files["prompt-nn-debugger.md"]


def test_a_real_healthy_run_fails_no_checklist_item():
    report = load("healthy")
    items = build_checklist(report, diagnose(report))
    assert [item.key for item in items if item.status == "failed"] == []
    assert sum(item.status == "passed" for item in items) >= 10


def test_a_real_diverging_run_fails_the_nan_and_learning_rate_items():
    report = load("lr_too_high")
    items = {item.key: item for item in build_checklist(report, diagnose(report))}
    assert items["nonfinite"].status == "failed" and "train loss non-finite" in items["nonfinite"].detail
    assert items["lr_range"].status == "failed" and "LR_TOO_HIGH" in " ".join(items["lr_range"].findings)
    assert items["zero_grad"].status == "passed"  # the loop did call zero_grad

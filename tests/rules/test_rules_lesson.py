"""The lesson's three broken networks: the root cause ranks first, symptoms cite it."""

from __future__ import annotations

from nndx.report import CauseCode
from nndx.rules import diagnose

from . import lesson


def _by_rule(diagnosis):
    return {f.rule_id: f for f in diagnosis.findings}


def test_lr_10_root_cause_is_the_learning_rate():
    diagnosis = diagnose(lesson.lr_10())
    top = diagnosis.top()
    assert top.code is CauseCode.LR_TOO_HIGH and top.explained_by is None and top.severity == "error"
    found = _by_rule(diagnosis)
    # oscillation/divergence, exploding gradients and the NaN all cite the root
    for symptom in ("NNDX104", "NNDX204", "NNDX102"):
        assert found[symptom].explained_by == top.rule_id, symptom
    roots = [f for f in diagnosis.findings if f.explained_by is None]
    assert diagnosis.findings[: len(roots)] == roots


def test_dead_relu_from_negative_bias():
    diagnosis = diagnose(lesson.dead_relu_bias())
    top = diagnosis.top()
    assert top.code is CauseCode.DEAD_RELU and top.evidence["dead_unit_fraction"] == 1.0
    found = _by_rule(diagnosis)
    for symptom in ("NNDX106", "NNDX103", "NNDX203", "NNDX601"):
        assert found[symptom].explained_by == "NNDX201", symptom
    assert "NNDX207" not in found  # constant outputs downstream of dead units are not an init bug


def test_missing_zero_grad():
    diagnosis = diagnose(lesson.missing_zero_grad())
    assert diagnosis.top().code is CauseCode.MISSING_ZERO_GRAD
    found = _by_rule(diagnosis)
    assert found["NNDX205"].explained_by == "NNDX301"  # big updates are the accumulation's doing
    assert found["NNDX104"].explained_by == "NNDX301"

"""NNDX613/NNDX614 (the causality probe's rules): fire on unshifted targets and on a model
that sees later tokens; silent on passed, skipped and errored probes, including healthy
results that look suspicious (text repeating a token, a tagging task)."""

from __future__ import annotations

import pytest

from nndx.report import CausalityResult
from nndx.rules import diagnose

from .broken import BROKEN, probe

LEAK_RULES = {"NNDX613", "NNDX614"}


def fired(result: CausalityResult) -> set[str]:
    return {f.rule_id for f in diagnose(probe(causality=result)).findings} & LEAK_RULES


@pytest.mark.parametrize("rule_id,code", [("NNDX613", "LABELS_MISALIGNED"), ("NNDX614", "DATA_LEAKAGE")])
def test_rule_fires_as_the_root_with_its_evidence(rule_id, code):
    findings = diagnose(BROKEN[rule_id]()).findings
    assert findings[0].rule_id == rule_id and findings[0].code.value == code and findings[0].severity == "error"
    evidence = findings[0].evidence
    if rule_id == "NNDX613":
        assert evidence["copy_fraction"] == 1.0 and evidence["next_fraction"] < 0.5
    else:
        assert evidence["max_change"] > evidence["tolerance"] and evidence["changed_positions"] == 16


@pytest.mark.parametrize(
    "result",
    [
        # a causal LM on text that repeats one token: targets equal the inputs often, and the next ones always
        CausalityResult(status="passed", time_axis=1, scored_positions=256, copy_fraction=0.95, next_fraction=1.0,
                        unshifted=False, cut=15, changed_positions=0, max_change=0.0, tolerance=1e-5,
                        future_visible=False),
        # a bidirectional tagger: the probe skipped it, whatever it measured on the way
        CausalityResult(status="skipped", time_axis=None, scored_positions=256, copy_fraction=0.1,
                        next_fraction=0.1, unshifted=False, message="not next-token prediction"),
        CausalityResult(status="skipped", message="targets of shape [8]"),
        CausalityResult(status="error", message="RuntimeError: boom"),
        # a failed result that names neither cause (an older or hand-made report) is not evidence
        CausalityResult(status="failed", copy_fraction=0.5, next_fraction=0.5),
    ],
    ids=["repeating-text", "tagger", "classifier", "error", "no-cause"],
)
def test_silent_when_nothing_was_seen(result):
    assert fired(result) == set()

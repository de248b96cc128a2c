"""`make demo` is the product's first impression: each scenario must be diagnosed as it claims."""

import pytest

from nndx import demo

EXPECTED_TOP = {"lr_too_high": "LR_TOO_HIGH", "dead_relu": "DEAD_RELU", "no_zero_grad": "MISSING_ZERO_GRAD"}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", demo.SCENARIOS, ids=lambda s: s.name)
def test_demo_scenario_diagnosed_as_claimed(scenario):
    report, diagnosis = demo.run_scenario(scenario)
    if scenario.name == "healthy":
        assert diagnosis.healthy, [f.rule_id for f in diagnosis.findings]
    else:
        assert diagnosis.findings[0].code.value == EXPECTED_TOP[scenario.name]
        assert not diagnosis.healthy
    text = demo.format_diagnosis(scenario.name, scenario.description, diagnosis)
    assert text.startswith(f"== {scenario.name}")

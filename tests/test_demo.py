"""`make demo` is the product's first impression: each scenario must be diagnosed as it claims."""

import shutil
import subprocess
from pathlib import Path

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


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_the_library_alone_and_make_test_adds_the_test_extra(tmp_path):
    """`make demo` must not pay for Lightning, transformers, W&B...: only `make test` installs them."""
    root = Path(__file__).resolve().parent.parent

    def planned(target: str) -> str:
        done = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=root,
                              capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return done.stdout

    demo, test = planned("demo"), planned("test")
    assert "torch==" in demo and "-e ." in demo and "[test]" not in demo
    assert "-e \".[test]\"" in test and "pytest" in test

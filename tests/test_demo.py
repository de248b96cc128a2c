"""`make demo` is the product's first impression: each scenario must be diagnosed as it
claims, and the README must show what it prints."""

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
    # the README's demo output: each finding line it shows is printed, in the README's order
    printed = [line.strip() for line in text.splitlines()]
    shown = readme_demo_findings()[scenario.name]
    assert shown, f"the README shows nothing of {scenario.name}"
    at = 0
    for line in shown:
        assert line in printed[at:], f"README line not printed (in this order): {line!r}"
        at = printed.index(line, at) + 1


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


def readme_demo_findings() -> dict[str, list[str]]:
    """The finding lines of the README's demo output, by scenario."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    block = text.split("## What `make demo` prints (abridged)", 1)[1].split("```", 2)[1]
    shown: dict[str, list[str]] = {}
    for line in block.splitlines():
        if line.startswith("== "):
            scenario = line[3:].split(":")[0]
            shown[scenario] = []
        elif line.strip().startswith("[") or line.strip() == "no findings":
            shown[scenario].append(line.strip())
    return shown

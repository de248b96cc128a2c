"""Golden files: the rendered prompt, checklist and explanation of two reports.

A change to the templates or the formatting shows up here as a diff to review. To
accept it deliberately, regenerate the goldens and commit them with the change:

    NNDX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/prompts/test_prompts_golden.py

(the tests then rewrite tests/prompts/golden/ and report themselves as skipped, so an
update run can never pass silently).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prompts_reports import make_broken_diagnosis, make_broken_report, make_healthy_diagnosis, make_healthy_report

from nndx.prompts import render, render_explanation

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "generic": (lambda: None, lambda: None),
    "healthy": (make_healthy_report, make_healthy_diagnosis),
    "broken": (make_broken_report, make_broken_diagnosis),
}


def rendered(case: str) -> dict[str, str]:
    make_report, make_diagnosis = CASES[case]
    report, diagnosis = make_report(), make_diagnosis()
    files = render(report, diagnosis)
    if diagnosis is not None:
        files["explanation-offline.md"] = render_explanation(diagnosis, "offline mode was requested", report)
    return files


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_files_match_the_goldens(case):
    files = rendered(case)
    folder = GOLDEN / case
    if os.environ.get("NNDX_UPDATE_GOLDEN") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8", newline="\n")
        pytest.skip(f"golden files of {case!r} rewritten; review and commit them")
    assert sorted(files) == sorted(path.name for path in folder.iterdir())
    for name, text in files.items():
        path = folder / name
        assert text == path.read_text(encoding="utf-8"), f"{path} differs (NNDX_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_files_are_tidy_markdown(case):
    for name, text in rendered(case).items():
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        assert "\n\n\n" not in text, f"{name} has a double blank line"
        assert [line for line in text.split("\n") if line != line.rstrip()] == [], f"{name} has trailing spaces"

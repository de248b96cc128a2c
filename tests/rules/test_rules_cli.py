"""`nndx rules`, `nndx diagnose` and `nndx check`."""

from __future__ import annotations

import json

import pytest

from nndx.cli import main
from nndx.rules import rules

from . import lesson
from .reports import healthy_mlp


@pytest.fixture
def broken_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(lesson.lr_10().model_dump_json())
    return path


@pytest.fixture
def healthy_file(tmp_path):
    path = tmp_path / "healthy.json"
    path.write_text(healthy_mlp().model_dump_json())
    return path


def test_rules_lists_and_shows_one(capsys):
    assert main(["rules"]) == 0
    listing = capsys.readouterr().out
    assert "NNDX301" in listing and "MISSING_ZERO_GRAD" in listing
    assert main(["rules", "NNDX201"]) == 0
    docs = capsys.readouterr().out
    assert "dead_unit_fraction" in docs and "Why it matters" in docs
    assert main(["rules", "NNDX999"]) == 2
    assert "no rule" in capsys.readouterr().err
    assert main(["rules", "--markdown"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| id |") and sum(line.startswith("| NNDX") for line in table) == len(rules())


def test_diagnose_prints_ranked_findings_with_evidence(broken_file, capsys):
    assert main(["diagnose", str(broken_file)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1. [error]") and "LR_TOO_HIGH" in out and "median_update_ratio = 3" in out
    assert "explained by: NNDX205" in out


def test_diagnose_json_is_a_diagnosis(broken_file, capsys):
    from nndx.report import Diagnosis

    assert main(["diagnose", str(broken_file), "--json"]) == 0
    diagnosis = Diagnosis.model_validate_json(capsys.readouterr().out)
    assert diagnosis.findings[0].code.value == "LR_TOO_HIGH"


def test_check_exit_codes(broken_file, healthy_file, tmp_path, capsys):
    assert main(["check", str(broken_file), "--fail-on", "error"]) == 1
    assert "at or above error" in capsys.readouterr().out
    assert main(["check", str(healthy_file), "--fail-on", "warning"]) == 0
    assert main(["check", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"loop": {"steps": -3}}))
    assert main(["check", str(invalid)]) == 2
    assert "loop.steps" in capsys.readouterr().err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert main(["diagnose", str(garbage)]) == 2

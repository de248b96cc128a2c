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
    err = capsys.readouterr().err
    assert err.startswith("nndx rules: error: no rule or cause code 'NNDX999'") and err.count("\n") == 1
    assert main(["rules", "--markdown"]) == 0
    page = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("| [NNDX") for line in page) == len(rules())
    assert sum(line.startswith("## NNDX") for line in page) == len(rules())


@pytest.mark.parametrize("asked", ["DEAD_RELU", "dead_relu"])
def test_rules_of_a_cause_code_are_listed(capsys, asked):
    assert main(["rules", asked]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = [r.id for r in rules() if r.code.value == "DEAD_RELU"]
    assert expected and [line.split()[0] for line in lines] == expected
    assert all(" DEAD_RELU " in line for line in lines)


def test_a_rule_id_is_found_in_any_case(capsys):
    assert main(["rules", "nndx201"]) == 0
    assert capsys.readouterr().out.startswith("NNDX201 · DEAD_RELU")


def test_diagnose_and_check_wording_has_correct_plurals(tmp_path, capsys):
    from nndx.report import CauseCode, Diagnosis, Finding
    from nndx.rules.cli import format_diagnosis

    def finding(rule_id):
        return Finding(rule_id=rule_id, code=CauseCode.DEAD_RELU, severity="warning", title="t", symptom="s", fix="f")

    assert format_diagnosis(Diagnosis(findings=[], rules_run=1)) == "no findings (1 rule run)"
    one = format_diagnosis(Diagnosis(findings=[finding("NNDX201")], rules_run=66))
    assert one.endswith("1 finding, 66 rules run: problems found") and "docs: nndx rules NNDX201" in one
    two = format_diagnosis(Diagnosis(findings=[finding("NNDX201"), finding("NNDX202")], rules_run=66))
    assert two.endswith("2 findings, 66 rules run: problems found")


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
    assert "ok: no findings at or above warning" in capsys.readouterr().out


def test_check_fail_on_info_fails_on_context_findings(tmp_path, capsys):
    from .reports import healthy_reports

    reports = healthy_reports()
    with_info, without = tmp_path / "info.json", tmp_path / "none.json"
    with_info.write_text(reports["step_decay"].model_dump_json())  # NNDX602, info only
    without.write_text(reports["mlp"].model_dump_json())
    assert main(["check", str(with_info), "--fail-on", "warning"]) == 0
    assert "(1 finding below)" in capsys.readouterr().out
    assert main(["check", str(with_info), "--fail-on", "info"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("1 finding at or above info")
    assert main(["check", str(without), "--fail-on", "info"]) == 0
    assert main(["check", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"loop": {"steps": -3}}))
    assert main(["check", str(invalid)]) == 2
    assert "loop.steps" in capsys.readouterr().err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert main(["diagnose", str(garbage)]) == 2


def test_check_fails_when_nothing_was_measured(tmp_path, capsys):
    """An empty report is no evidence of health: the exit status follows the finding that says so."""
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["check", str(empty)]) == 1
    assert "NOTHING_MEASURED" in capsys.readouterr().out

"""`nndx render` and `nndx explain`, run in-process through nndx.cli.main."""

from __future__ import annotations

import json

import pytest
from fake_llm_server import FakeLLM, Reply, completion

from nndx.cli import main
from nndx.prompts import Explanation, render

LLM_VARS = ("NNDX_LLM_BASE_URL", "NNDX_LLM_MODEL", "NNDX_LLM_API_KEY", "NNDX_LLM_TIMEOUT", "NNDX_LLM_STREAM")


@pytest.fixture(autouse=True)
def no_llm_settings(monkeypatch):
    for name in LLM_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def report_file(tmp_path, broken_report):
    path = tmp_path / "report.json"
    path.write_text(broken_report.model_dump_json(), encoding="utf-8")
    return path


def test_render_without_a_report_writes_the_generic_files(tmp_path, capsys):
    out = tmp_path / "outputs"
    assert main(["render", "--out", str(out)]) == 0
    for name, text in render().items():
        assert (out / name).read_text(encoding="utf-8") == text
    assert str(out / "prompt-nn-debugger.md") in capsys.readouterr().out


def test_render_a_report_file_writes_what_render_returns(tmp_path, report_file, broken_report):
    out = tmp_path / "o"
    assert main(["render", str(report_file), "--out", str(out)]) == 0
    expected = render(broken_report)  # diagnosed by the rule engine
    assert {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()} == expected
    assert "## Rule findings" in expected["prompt-nn-debugger.md"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "not a valid DiagnosticReport"),
        ('{"run": {"seed": "seven"}}', "run.seed"),
        ('{"schema_version": "9.9"}', "schema_version"),
    ],
)
@pytest.mark.parametrize("command", ["render", "explain"])
def test_bad_report_files_exit_2_naming_the_problem(tmp_path, capsys, command, content, message):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    argv = [command, str(path)] + (["--out", str(tmp_path / "o")] if command == "render" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"nndx {command}: error:" in err and message in err and str(path) in err
    assert not (tmp_path / "o").exists()


def test_explain_offline_prints_the_rule_only_explanation(report_file, capsys):
    assert main(["explain", str(report_file), "--offline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Diagnosis (rule-only)")
    assert "The LLM was not used: offline mode was requested." in out


def test_explain_json_prints_an_explanation(report_file, capsys):
    assert main(["explain", str(report_file), "--json"]) == 0
    explanation = Explanation.model_validate_json(capsys.readouterr().out)
    assert explanation.source == "rules" and "NNDX_LLM_BASE_URL is not set" in explanation.reason


def test_explain_uses_the_endpoint_from_the_environment(report_file, capsys, monkeypatch):
    with FakeLLM() as llm:
        llm.script(Reply(body=completion("The root cause is LR_TOO_HIGH.")))
        monkeypatch.setenv("NNDX_LLM_BASE_URL", llm.url)
        monkeypatch.setenv("NNDX_LLM_MODEL", "cli-model")
        monkeypatch.setenv("NNDX_LLM_API_KEY", "sk-cli-secret")
        assert main(["explain", str(report_file)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "The root cause is LR_TOO_HIGH.\n"
    assert "asking cli-model" in captured.err and "sk-cli-secret" not in captured.err
    assert llm.received[0].body["model"] == "cli-model"
    assert json.dumps(llm.received[0].headers).count("sk-cli-secret") == 1


def test_explain_with_bad_settings_exits_2(report_file, capsys, monkeypatch):
    monkeypatch.setenv("NNDX_LLM_TIMEOUT", "forever")
    assert main(["explain", str(report_file)]) == 2
    assert "NNDX_LLM_TIMEOUT" in capsys.readouterr().err

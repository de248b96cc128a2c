import json
import math
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from nndx.cli import main
from nndx.report import (
    DiagnosticReport,
    Diagnosis,
    Finding,
    GradNormPoint,
    LayerStats,
    ActivationStats,
    LoopStats,
    LossPoint,
    Probes,
    LRRangeResult,
    flat_since,
)

NAN, INF = float("nan"), float("inf")


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_nonfinite_floats_round_trip_exactly():
    report = DiagnosticReport(
        loss_history={"train": [LossPoint(step=0, value=2.3), LossPoint(step=1, value=NAN), LossPoint(step=2, value=INF)]},
        layers=[LayerStats(name="fc1", type="Linear", activation=ActivationStats(
            mean=NAN, std=INF, min=-INF, max=INF, zero_fraction=0.5, dead_unit_fraction=0.0, nonfinite_count=3))],
        loop=LoopStats(grad_norm_history=[GradNormPoint(step=1, before_clip=-INF, after_clip=NAN)]),
        probes=Probes(lr_range=LRRangeResult(status="passed", lrs=[1e-5, 1.0], losses=[2.3, NAN])),
    )
    text = report.model_dump_json()
    json.loads(text)  # strict JSON: no bare NaN tokens
    assert "NaN" in text and "-Infinity" in text
    back = DiagnosticReport.model_validate_json(text)
    values = [p.value for p in back.loss_history["train"]]
    assert [_same(a, b) for a, b in zip(values, [2.3, NAN, INF])] == [True, True, True]
    act = back.layers[0].activation
    assert math.isnan(act.mean) and act.std == INF and act.min == -INF
    g = back.loop.grad_norm_history[0]
    assert g.before_clip == -INF and math.isnan(g.after_clip)
    assert math.isnan(back.probes.lr_range.losses[1])
    assert back.model_dump_json() == text


def test_empty_report_is_valid_and_versioned():
    report = DiagnosticReport.model_validate_json("{}")
    assert report.schema_version == "1.0" and report.loop is None


def test_invalid_report_names_the_field():
    with pytest.raises(ValidationError) as err:
        DiagnosticReport.model_validate({"loop": {"zero_grad_calls": "many"}})
    assert "loop.zero_grad_calls" in str(err.value)
    with pytest.raises(ValidationError) as err:
        DiagnosticReport.model_validate({"layers": [{"name": "fc", "type": "Linear", "activation": {"mean": 0}}]})
    assert "layers.0.activation.std" in str(err.value)
    with pytest.raises(ValidationError) as err:
        DiagnosticReport.model_validate({"lop": {}})
    assert "lop" in str(err.value)
    with pytest.raises(ValidationError):
        DiagnosticReport.model_validate({"schema_version": "0.1"})


def test_diagnosis_health_by_severity():
    info = Finding(rule_id="X1", code="FROZEN_PARAMETERS", severity="info", title="t", symptom="s", fix="f")
    warn = info.model_copy(update={"severity": "warning"})
    assert Diagnosis(findings=[info]).healthy
    assert not Diagnosis(findings=[info, warn]).healthy


def test_schema_command_prints_json_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "DiagnosticReport"
    loss_point = schema["$defs"]["LossPoint"]["properties"]["value"]
    assert {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]} in loss_point["anyOf"]


def test_import_nndx_and_report_do_not_load_torch():
    code = "import sys, nndx, nndx.report, nndx.cli; nndx.cli.build_parser(); assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_command_has_help(capsys):
    parser_actions = [a for a in __import__("nndx.cli").cli.build_parser()._actions if a.dest == "command"]
    names = list(parser_actions[0].choices)
    assert {"schema", "demo"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_plot_command_writes_the_charts_a_report_has_data_for(tmp_path, capsys):
    report = DiagnosticReport(
        loss_history={"train": [LossPoint(step=i, value=2.0 / (i + 1)) for i in range(5)]},
        layers=[LayerStats(name="fc", type="Linear", step=0,
                           activation=ActivationStats(mean=0, std=1, min=-1, max=1, zero_fraction=0, dead_unit_fraction=0))],
        probes=Probes(lr_range=LRRangeResult(status="passed", lrs=[1e-4, 1e-3, 1e-2], losses=[2.0, 1.5, NAN])),
    )
    path = tmp_path / "report.json"
    path.write_text(report.model_dump_json())
    assert main(["plot", str(path), "--out", str(tmp_path / "plots")]) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["index.html", "plotly.min.js"]
    page = (tmp_path / "plots" / "index.html").read_text()
    drawn = set(re.findall(r"<section id='([a-z_]+)'>", page))
    assert drawn == {"activation_std", "dead_units", "loss", "lr_range"}  # no gradients recorded
    bad = tmp_path / "bad.json"
    bad.write_text('{"loop": {"steps": -1}}')
    assert main(["plot", str(bad)]) == 2
    assert "loop.steps" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("losses", "start"),
    [([2.0, 1.0, 0.5], 2), ([2.0, 0.7, 0.7, 0.7], 1), ([0.7, 0.7, 0.7], 0), ([-3.0, -3.0000000001], 0)],
)
def test_flat_since_is_where_the_values_stop_moving(losses, start):
    assert flat_since(losses) == start

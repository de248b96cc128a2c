import math

import pytest
import torch
from _probe_models import (  # noqa: F401
    InplaceSigmoid,
    assert_untouched,
    batch,
    custom_backward_mlp,
    dead_relu_mlp,
    mlp,
    single_thread,
    snapshot,
)
from torch import nn

import nndx
from nndx.collector import probe as probe_module
from nndx.report import DiagnosticReport

FAST = {"overfit_one_batch": {"steps": 40}, "lr_range": {"steps": 30}}
ALL = ["hooks", "nan_origin", "eval_mode", "grad_check", "overfit_one_batch", "lr_range"]


def run(model, optimizer=None, **kw):
    options = {**FAST, **kw}
    return nndx.probe(model, batch(), nn.CrossEntropyLoss(), optimizer=optimizer, **options)


def test_healthy_model_full_report_and_state_untouched():
    model, (x, y) = mlp(), batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()
    before = snapshot(model, optimizer)
    report = run(model, optimizer)
    assert_untouched(before, model, optimizer)
    assert report.errors == []
    probes = report.probes
    assert {probes.nan_origin.status, probes.eval_mode.status, probes.grad_check.status, probes.lr_range.status} == {"passed"}
    assert probes.overfit_one_batch.status == "passed"
    assert report.layers and report.parameters and report.model.param_count == sum(p.numel() for p in model.parameters())
    assert report.task == "classification" and report.num_classes == 3
    assert report.run.torch_version == torch.__version__ and report.run.device == "cpu" and report.run.dtype == "float32"
    assert report.loop.params_not_in_optimizer == [] and report.loop.optimizer_params_not_in_model == 0
    again = DiagnosticReport.model_validate_json(report.model_dump_json())
    assert again == report


def test_probe_selection_and_option_errors():
    report = run(mlp(), probes=["grad_check", "nan_origin"])
    assert report.probes.grad_check and report.probes.nan_origin
    assert report.probes.overfit_one_batch is None and report.layers == []
    assert report.model is not None  # the static summary comes without the hook probe
    with pytest.raises(ValueError, match="unknown probes"):
        run(mlp(), probes=["overfit"])
    with pytest.raises(TypeError, match="unknown probe options"):
        nndx.probe(mlp(), batch(), nn.CrossEntropyLoss(), steps=3)
    with pytest.raises(TypeError, match=r"grad_check has no option\(s\) \['epsilon'\]"):
        nndx.probe(mlp(), batch(), nn.CrossEntropyLoss(), grad_check={"epsilon": 1e-6})
    with pytest.raises(TypeError, match="must be a dict"):
        nndx.probe(mlp(), batch(), nn.CrossEntropyLoss(), lr_range=5)
    assert list(probe_module.PROBES) == [*ALL, "label_alignment"]  # the data probe after the batch probes


def test_inplace_autograd_error_is_recorded_and_other_probes_go_on():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), InplaceSigmoid(), nn.Linear(8, 3))
    before = snapshot(model)
    report = run(model)
    assert_untouched(before, model)
    failed_sources = {e.source for e in report.errors}
    assert {"hooks", "nan_origin", "grad_check", "overfit_one_batch", "lr_range"} <= failed_sources
    assert all(e.type == "RuntimeError" and "inplace" in e.message for e in report.errors)
    assert report.probes.grad_check.status == "error" and "RuntimeError" in report.probes.grad_check.message
    assert report.probes.eval_mode.status == "passed"  # needs no backward


def test_dtype_error_everywhere_still_gives_a_report():
    x, y = batch()
    report = nndx.probe(mlp(), (x.long(), y), nn.CrossEntropyLoss(), **FAST)
    assert {e.source for e in report.errors} >= set(ALL)
    assert all(getattr(report.probes, n).status == "error" for n in ALL if n != "hooks")
    assert report.model is not None


def test_optimizer_over_another_models_parameters_is_noted_and_not_stepped():
    model, other = mlp(), mlp(seed=3)
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
    before, before_other = snapshot(model, optimizer), snapshot(other)
    report = run(model, optimizer, probes=["hooks", "lr_range"])
    assert report.loop.params_not_in_optimizer == [n for n, _ in model.named_parameters()]
    assert report.loop.optimizer_params_not_in_model == len(list(other.parameters()))
    assert_untouched(before, model, optimizer)
    assert_untouched(before_other, other)
    assert "fresh SGD" in report.probes.lr_range.message


def test_lr_10_shows_in_update_ratios():
    model = mlp()
    report = run(model, torch.optim.SGD(model.parameters(), lr=10.0), probes=["hooks"])
    assert max(p.update_ratio for p in report.parameters) > 0.3
    model = mlp()
    small = run(model, torch.optim.SGD(model.parameters(), lr=1e-2), probes=["hooks"])
    assert max(p.update_ratio for p in small.parameters) < 0.03


def test_dead_relu_and_wrong_backward_show_in_the_report():
    dead = run(dead_relu_mlp(), probes=["hooks", "overfit_one_batch"])
    assert {s.name: s for s in dead.layers}["1"].activation.dead_unit_fraction == 1.0
    assert dead.probes.overfit_one_batch.status == "failed"
    wrong = run(custom_backward_mlp("transposed"), probes=["grad_check"])
    assert wrong.probes.grad_check.status == "failed"
    assert [p.name for p in wrong.probes.grad_check.parameters if p.status == "bug"] == ["2.weight"]


def test_monitor_report_merged_and_monitor_not_polluted_by_probes():
    model, (x, y) = mlp(), batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with nndx.Monitor(model, optimizer) as monitor:
        for _ in range(3):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            monitor.log(loss)
        nn.functional.cross_entropy(model(x), y).backward()  # gradients the probes must not clear
        watched = monitor.report()
        before = snapshot(model, optimizer)
        report = run(model, optimizer, monitor=monitor)
        after = monitor.report()
        assert_untouched(before, model, optimizer)
    assert (after.loop.forward_calls, after.loop.steps, after.loop.zero_grad_calls) == (
        watched.loop.forward_calls, watched.loop.steps, watched.loop.zero_grad_calls)
    assert report.loop.steps == 3 and len(report.loss_history["train"]) == 3
    assert report.layers[: len(watched.layers)] == watched.layers
    probe_steps = {s.step for s in report.layers[len(watched.layers):]} | {p.step for p in report.parameters[len(watched.parameters):]}
    assert probe_steps == {3}  # after the monitor's steps 0-2, not colliding with them


class FakeMonitor:
    def __init__(self, fail=False):
        self.fail = fail

    def report(self):
        if self.fail:
            raise RuntimeError("monitor closed badly")
        return DiagnosticReport.model_validate({
            "loss_history": {"train": [{"step": 0, "value": "NaN"}]},
            "loop": {"steps": 7, "params_not_in_optimizer": ["x.weight"]},
        })


def test_monitor_merge_and_failure_through_the_public_method():
    model = mlp()
    report = run(model, torch.optim.SGD(model[0].parameters(), lr=0.1), monitor=FakeMonitor(), probes=["nan_origin"])
    assert report.loop.steps == 7 and math.isnan(report.loss_history["train"][0].value)
    assert report.loop.params_not_in_optimizer[0] == "x.weight" and "2.weight" in report.loop.params_not_in_optimizer
    broken = run(mlp(), monitor=FakeMonitor(fail=True), probes=["nan_origin"])
    assert broken.errors[0].source == "monitor" and broken.probes.nan_origin.status == "passed"


def test_data_checks_merged_and_bad_data_recorded():
    x, y = batch(n=40)
    report = run(mlp(), probes=["nan_origin"], data=(x, y, x[:10], y[:10]))
    assert report.data.train.n_samples == 40 and report.data.train_test_overlap == 10
    bad = run(mlp(), probes=["nan_origin"], data=(x,))
    assert bad.data is None and bad.errors[0].source == "data" and "X_train" in bad.errors[0].message


def test_progress_on_stderr(capsys):
    run(mlp(), probes=["nan_origin", "grad_check"], progress=True)
    err = capsys.readouterr().err
    assert "[1/2] nan_origin" in err and "[2/2] grad_check passed" in err


def test_loss_warnings_recorded_once_as_evidence():
    x, _ = batch()
    target = x.sum(dim=1)  # shape (16,), the model outputs (16, 1): MSELoss broadcasts to (16, 16)
    report = nndx.probe(mlp(out=1), (x, target), nn.MSELoss(), probes=["hooks", "overfit_one_batch"], **FAST)
    shape_warnings = [e for e in report.errors if "target size" in e.message]
    assert len(shape_warnings) == 1 and shape_warnings[0].type == "UserWarning"
    assert shape_warnings[0].source == "hooks"


@pytest.mark.filterwarnings("ignore:self.log")  # the summary forward runs outside the probes' capture
def test_warnings_of_other_code_are_not_evidence():
    import warnings

    class Chatty(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            warnings.warn("self.log() called outside a Trainer", UserWarning)  # e.g. a Lightning module
            return self.net(x)

    report = run(Chatty(), probes=["nan_origin", "grad_check"])
    assert report.errors == []


def test_probes_skip_a_model_whose_weights_are_already_nonfinite():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    batch = (torch.randn(16, 4), torch.randint(0, 2, (16,)))
    report = nndx.probe(model, batch, nn.CrossEntropyLoss())
    for name in ("eval_mode", "grad_check", "overfit_one_batch", "lr_range"):
        result = getattr(report.probes, name)
        assert result.status == "skipped", name
        assert "2.weight" in result.message
    assert report.probes.nan_origin.forward_module == "2"  # still names where the NaN appears
    assert report.layers  # the hook statistics still describe the diverged model


def test_label_alignment_runs_with_classification_data():
    from nndx.demo import make_data

    x, y = make_data(n=400)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
    aligned = nndx.probe(model, (x[:32], y[:32]), nn.CrossEntropyLoss(), probes=["nan_origin", "label_alignment"],
                         data=(x, y))  # fmt: skip
    assert aligned.probes.label_alignment.status == "passed"
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    misaligned = nndx.probe(model, (x[:32], shuffled[:32]), nn.CrossEntropyLoss(), data=(x, shuffled),
                            probes=["nan_origin", "label_alignment"])  # fmt: skip
    assert misaligned.probes.label_alignment.status == "failed"
    assert "LABELS_MISALIGNED" in [f.code.value for f in nndx.diagnose(misaligned).findings]


def test_every_probe_is_one_spec_and_one_result_field():
    from nndx.collector.probes import specs
    from nndx.report import Probes

    with_results = {spec.name: spec for spec in specs() if spec.result is not None}
    assert list(with_results) == [n for n in probe_module.PROBES if n in with_results]  # cheap first
    assert set(with_results) == set(Probes.model_fields)
    for name, result_type in Probes.result_types().items():
        spec = with_results[name]
        assert spec.result is result_type and spec.title == result_type.title
        assert result_type.checklist is not None, name
    assert [s.name for s in specs() if s.result is None] == ["hooks"]  # fills report.layers instead

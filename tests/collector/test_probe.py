import math
import threading

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
    train_under,
)
from torch import nn

import nndx
from nndx.collector import probe as probe_module
from nndx.errors import UsageError
from nndx.report import DiagnosticReport

FAST = {"overfit_one_batch": {"steps": 40}, "lr_range": {"steps": 30}}
ALL = [spec.name for spec in probe_module.PROBES.values() if spec.needs == "batch"]
# probes that do not apply to a classifier's batch (they say skipped there, with the reason)
NOT_FOR_CLASSIFIERS = {"causality"}


def classifier_statuses(report) -> dict[str, str]:
    """Status of every probe that applies to a classifier's batch; the others must have skipped."""
    results = report.probes.results()
    assert all(results[n].status == "skipped" for n in NOT_FOR_CLASSIFIERS if n in results), results
    return {name: r.status for name, r in results.items() if name not in NOT_FOR_CLASSIFIERS}


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
    cheap_first = ["hooks", "nan_origin", "eval_mode", "grad_check", "overfit_one_batch", "lr_range"]
    assert [name for name in probe_module.PROBES if name in cheap_first] == cheap_first
    # the batch probes, then the data probes; diagnosis by intervention last of all (the costliest)
    others = [s.needs for s in probe_module.PROBES.values() if s.name != "interventions"]
    assert others == sorted(others) and list(probe_module.PROBES)[-1] == "interventions"


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
    # the interventions probe records a setup that cannot train in its own result, not as a crash
    applies = [n for n in ALL if n not in NOT_FOR_CLASSIFIERS and n != "interventions"]
    assert {e.source for e in report.errors} >= set(applies)
    assert all(getattr(report.probes, n).status == "error" for n in applies if n != "hooks")
    assert report.probes.causality.status == "skipped"
    assert report.interventions.baseline_initial_loss is None
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
        train_under(monitor, model, optimizer, x, y)
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


def test_without_data_the_batch_gives_the_input_scale_and_nothing_it_cannot_judge():
    """No data= (a replay buffer, a stream): the probes' own batch still shows raw 0-255
    pixels (NNDX505, the same rule as the data checks), while [0, 1] pixels, token ids and
    a model that scales its inputs itself stay quiet. One batch says nothing about
    duplicates, classes or order: those stay unmeasured, and no "data" coverage is claimed."""
    torch.manual_seed(0)
    frames = torch.zeros(32, 1, 10, 8)
    frames[torch.arange(32), 0, torch.randint(0, 10, (32,)), torch.randint(0, 8, (32,))] = 255.0
    frames[:, 0, 9, 2:5] = 255.0  # the paddle, in every frame
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 6, 3))
    labels = torch.randint(0, 3, (32,))
    raw = nndx.probe(cnn, (frames, labels), nn.CrossEntropyLoss(), probes=["nan_origin"])
    assert raw.data.train is None and raw.data.test is None
    assert raw.data.batch.raw_range == "0-255" and raw.data.batch.n_samples == 32
    assert raw.data.batch.duplicate_count == 0 and raw.data.batch.class_counts == {}
    (finding,) = [f for f in nndx.diagnose(raw).findings if f.rule_id == "NNDX505"]
    assert finding.severity == "warning" and "batch" in finding.symptom
    # a BatchNorm right after the first convolution takes the inputs' scale out (pytorch/examples'
    # Siamese ResNet on uint8 pixels, a neural-style network's InstanceNorm): context, not an alarm
    stem_bn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 6, 3))
    absorbed = nndx.probe(stem_bn, (frames, labels), nn.CrossEntropyLoss(), probes=["nan_origin"])
    (finding,) = [f for f in nndx.diagnose(absorbed).findings if f.rule_id == "NNDX505"]
    assert finding.severity == "info" and "BatchNorm2d" in finding.symptom
    scaled = nndx.probe(cnn, (frames / 255, labels), nn.CrossEntropyLoss(), probes=["nan_origin"])
    assert scaled.data.batch.raw_range is None
    assert "NNDX505" not in {f.rule_id for f in nndx.diagnose(scaled).findings}

    class Standardising(nn.Module):  # stores the data's mean and std and applies them in forward
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.full((6,), 500.0))
            self.register_buffer("std", torch.full((6,), 100.0))
            self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(self, x):
            return self.net((x - self.mean) / self.std)

    prices = 500 + 100 * torch.randn(32, 6)
    own = nndx.probe(Standardising(), (prices, labels), nn.CrossEntropyLoss(), probes=["nan_origin"])
    assert "NNDX505" not in {f.rule_id for f in nndx.diagnose(own).findings}
    tokens = torch.randint(0, 50, (32, 7))
    lm = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(56, 3))
    assert "NNDX505" not in {f.rule_id for f in nndx.diagnose(
        nndx.probe(lm, (tokens, labels), nn.CrossEntropyLoss(), probes=["nan_origin"])).findings}


def test_progress_bar_on_stderr_when_asked_and_off_a_terminal_by_default(capsys):
    run(mlp(), probes=["nan_origin", "grad_check"], progress=True)
    captured = capsys.readouterr()
    assert "nndx probe" in captured.err and "2/2" in captured.err and captured.out == ""
    run(mlp(), probes=["nan_origin", "grad_check"])  # stderr is captured here: no terminal, no bar
    assert capsys.readouterr().err == ""


def test_loss_warnings_recorded_once_as_evidence():
    x, _ = batch()
    target = x.sum(dim=1)  # shape (16,), the model outputs (16, 1): MSELoss broadcasts to (16, 16)
    report = nndx.probe(mlp(out=1), (x, target), nn.MSELoss(), probes=["hooks", "overfit_one_batch"], **FAST)
    shape_warnings = [e for e in report.errors if "target size" in e.message]
    assert len(shape_warnings) == 1 and shape_warnings[0].type == "UserWarning"
    assert shape_warnings[0].source == "describe"  # the first loss call, before any probe


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
    # where a NaN came from cannot be read off weights that are NaN already: skipped, naming them
    for name in ("eval_mode", "grad_check", "overfit_one_batch", "lr_range", "nan_origin"):
        result = getattr(report.probes, name)
        assert result.status == "skipped", name
        assert "2.weight" in result.message
    assert report.layers  # the hook statistics still describe the diverged model


def test_label_alignment_runs_with_classification_data():
    from nndx.demo import make_data

    x, y = make_data(n=1200)  # enough held-out samples to call misaligned labels misaligned
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
    # they fill report.layers and report.interventions instead
    assert [s.name for s in specs() if s.result is None] == ["hooks", "interventions"]


# --------------------------------------------------------------------------- what people pass


def test_an_optimizer_whose_step_needs_a_closure_is_probed_with_one():
    """L-BFGS: step(closure) re-evaluates the loss; its copy also needs the parameter list
    it keeps beside its state (_params), which an optimizer's pickling leaves out."""
    model = mlp()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5)
    before = snapshot(model, optimizer)
    report = nndx.probe(model, batch(), nn.CrossEntropyLoss(), optimizer=optimizer, **FAST)
    assert_untouched(before, model, optimizer)
    assert report.errors == []
    assert report.probes.lr_range.status == "passed" and "LBFGS" in report.probes.lr_range.message
    assert report.parameters and all(p.update_ratio is not None for p in report.parameters)


def test_an_optimizer_that_asserts_a_closure_it_declares_optional_is_probed_with_one():
    """davda54/sam's SAM.step(closure=None) asserts that a closure was given: the hooks and LR
    range probes raised AssertionError on every run. A step that refuses to run without a closure
    gets one; SAM's own two passes then run on the copy."""
    from test_monitor_loops import SAM

    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    before = snapshot(model, optimizer)
    report = nndx.probe(model, batch(), nn.CrossEntropyLoss(), optimizer=optimizer, **FAST)
    assert_untouched(before, model, optimizer)
    assert report.errors == []
    assert report.probes.lr_range.status == "passed"
    assert report.parameters and all(p.update_ratio is not None for p in report.parameters)


def test_a_dataloader_gives_its_first_batch_and_the_report_says_so():
    from torch.utils.data import DataLoader, TensorDataset

    x, y = batch(n=64)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = mlp()
    before = snapshot(model)
    report = nndx.probe(model, loader, nn.CrossEntropyLoss(), **FAST)
    assert_untouched(before, model)  # the shuffling sampler's draw is put back too
    assert report.errors == [] and set(classifier_statuses(report).values()) == {"passed"}
    assert any("first batch of the DataLoader (16 samples)" in note for note in report.run.notes)
    assert report.loop.loss_calls[0].output_shape == [16, 3]
    # a loader with a generator of its own: its next epoch keeps its order
    own = DataLoader(TensorDataset(x, torch.arange(64) % 3), batch_size=16, shuffle=True,
                     generator=torch.Generator().manual_seed(3))  # fmt: skip
    state = own.generator.get_state()
    nndx.probe(model, own, nn.CrossEntropyLoss(), **FAST)
    assert torch.equal(own.generator.get_state(), state)


@pytest.mark.parametrize("keys", [("x", "y"), ("inputs", "targets"), ("features", "label")])
def test_dict_batches(keys):
    x, y = batch()
    report = nndx.probe(mlp(), {keys[0]: x, keys[1]: y}, nn.CrossEntropyLoss(), probes=["nan_origin", "grad_check"])
    assert report.errors == [] and report.probes.grad_check.status == "passed" and report.task == "classification"


class TinyTextClassifier(nn.Module):
    """Hugging Face shaped: keyword inputs, labels optional, a ModelOutput with .loss and .logits."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 3)

    def forward(self, input_ids, attention_mask, labels=None):
        from transformers.modeling_outputs import SequenceClassifierOutput

        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp_min(1)
        logits = self.head(torch.tanh(pooled))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def text_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (12, 9), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(0, 3, (12,), generator=g)}


@pytest.mark.parametrize("loss_fn", [None, nn.CrossEntropyLoss()])
def test_hugging_face_batch_and_output_with_and_without_a_loss_fn(loss_fn):
    pytest.importorskip("transformers")
    report = nndx.probe(TinyTextClassifier(), text_batch(), loss_fn, **FAST)
    assert report.errors == [], report.errors
    statuses = classifier_statuses(report)
    assert statuses == {name: "passed" for name in statuses}, statuses
    assert report.probes.sample_independence.batch_axis == 0 and report.task == "classification"
    if loss_fn is not None:  # the logits reached the loss: the loss-fit evidence is there
        assert report.loop.loss_calls[0].output_shape == [12, 3] and report.num_classes == 3


def test_what_nndx_cannot_use_is_a_usage_error_before_any_probe():
    x, y = batch()
    with pytest.raises(UsageError, match="length 3"):
        nndx.probe(mlp(), (x, y, y), nn.CrossEntropyLoss())
    with pytest.raises(UsageError, match="no .loss"):
        nndx.probe(mlp(), (x, y), None)  # the model returns logits, not its loss
    with pytest.raises(UsageError, match="yielded no batch"):
        nndx.probe(mlp(), torch.utils.data.DataLoader([]), nn.CrossEntropyLoss())
    with pytest.raises(UsageError, match="initial_state"):
        nndx.probe(mlp(), (x, y), nn.CrossEntropyLoss(), initial_state={"nope": torch.zeros(1)})


def test_amp_autocast_runs_every_probe():
    report = nndx.probe(mlp(), batch(), nn.CrossEntropyLoss(), amp=torch.bfloat16, **FAST)
    assert report.errors == []
    assert set(classifier_statuses(report).values()) == {"passed"}, report.probes
    assert any("autocast('cpu', bfloat16)" in note for note in report.run.notes)
    with pytest.raises(UsageError, match="amp"):
        nndx.probe(mlp(), batch(), nn.CrossEntropyLoss(), amp=torch.int8)


def test_float16_autocast_trains_the_probes_copy_with_loss_scaling():
    """float16 gradients under ~6e-8 are zero: unscaled, a small loss's gradients vanish
    and overfit-one-batch fails on a healthy model (WRONG_LOSS on a GPU's healthy
    GradScaler run, bench/gpu.py). Scaled as torch.amp.GradScaler does, it fits."""
    x, y = batch()

    def small_loss(output, target):
        return 1e-6 * nn.functional.cross_entropy(output, target)

    report = nndx.probe(mlp(), (x, y), small_loss, amp=torch.float16, probes=["overfit_one_batch"], progress=False)
    assert report.probes.overfit_one_batch.status == "passed", report.probes.overfit_one_batch.message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_moves_the_copy_and_the_batch():
    model = mlp()
    before = snapshot(model)
    report = nndx.probe(model, batch(), nn.CrossEntropyLoss(), device="cuda", **FAST)
    assert_untouched(before, model)
    assert report.errors == [] and report.run.device.startswith("cuda")
    assert set(classifier_statuses(report).values()) == {"passed"}


def test_users_hooks_do_not_fire_during_the_probes():
    model, fired = mlp(), []
    model[0].register_forward_hook(lambda *_: fired.append("forward"))
    model[0].weight.register_hook(lambda g: fired.append("grad"))
    before = snapshot(model)
    report = run(model)
    assert fired == [] and report.errors == []
    assert_untouched(before, model)  # and the user's hooks are still there


class HiddenLayerReader(nn.Module):
    """byol-pytorch's NetWrapper: a forward hook on the backbone's hidden layer, a method of the
    wrapper, registered lazily on the first forward, hands the wrapper what it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.hidden, self.registered = mlp(), {}, False

    def _hook(self, module, inputs, output):
        self.hidden[output.device] = output

    def forward(self, x):
        if not self.registered:
            self.net[1].register_forward_hook(self._hook)
            self.registered = True
        self.net(x)
        return self.hidden.pop(x.device)


def test_a_hook_that_is_a_method_of_the_model_is_part_of_its_forward_and_stays_on_the_copies():
    model, fired = HiddenLayerReader(), []
    model(batch()[0])  # the hook is registered on the first forward, as byol-pytorch does
    model.net[0].register_forward_hook(lambda *_: fired.append("forward"))  # the user's own: not on the copies
    report = nndx.probe(model, (batch()[0], torch.rand(16, 16)), nn.MSELoss(), progress=False)
    assert report.errors == [], report.errors
    assert fired == [] and report.layers and report.probes.grad_check.status == "passed"


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_every_dtype_is_measured_by_every_probe(dtype):
    x, y = batch()
    report = nndx.probe(mlp(dropout=0.2).to(dtype), (x.to(dtype), y), nn.CrossEntropyLoss(), **FAST)
    statuses = classifier_statuses(report)
    assert set(statuses.values()) <= {"passed", "failed"}, (statuses, report.errors)
    assert statuses["overfit_one_batch"] == statuses["grad_check"] == "passed", report.probes
    assert [f.code.value for f in nndx.diagnose(report).findings if f.severity != "info"] == []
    if dtype != torch.float64:  # float64 parameter norms: stats.parameter_stats (the Monitor's) is being fixed
        assert report.layers and report.errors == []


# --------------------------------------------------------------------------- from which state


def trained(model, steps=300):
    x, y = batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model, optimizer


class SteppedMonitor(FakeMonitor):
    def __init__(self, steps, initial=None):
        super().__init__()
        self.steps, self.initial = steps, initial

    def report(self):
        return DiagnosticReport.model_validate({"loop": {"steps": self.steps}})

    def initial_state(self, model=None):
        return self.initial


def test_trainability_probes_on_a_trained_model_say_skipped_not_passed():
    model, optimizer = trained(mlp())
    report = run(model, optimizer, monitor=SteppedMonitor(300))
    for name in ("overfit_one_batch", "lr_range", "grad_check"):
        result = getattr(report.probes, name)
        assert result.status == "skipped" and "300 optimizer steps" in result.message, name
    assert report.probes.nan_origin.status == "passed" and report.layers  # the model as it is


def test_trainability_probes_run_from_the_initial_state():
    fresh = mlp()
    initial = {k: v.clone() for k, v in fresh.state_dict().items()}
    model, optimizer = trained(fresh)
    for kwargs in ({"initial_state": initial}, {"monitor": SteppedMonitor(300, initial)}):
        report = run(model, optimizer, **kwargs)
        overfit = report.probes.overfit_one_batch
        assert overfit.status == "passed" and overfit.steps > 0
        assert overfit.initial_loss == pytest.approx(math.log(3), rel=0.2)  # an untrained classifier's loss
        assert any("from the initial state" in note for note in report.run.notes)
    without = run(model, optimizer)  # no Monitor, no snapshot: nndx cannot know it trained
    assert without.probes.overfit_one_batch.initial_loss < 0.05


def test_a_model_probed_under_a_monitor_of_several_starts_from_its_own_snapshot():
    """InfoGAN's loop: one Monitor over {"G", "D"}, then the discriminator probed with
    monitor=mon. Its own part of the snapshot is its initial state; the whole one is keyed
    "G."/"D." and fits neither."""
    x, y = batch()
    generator, discriminator = mlp(), mlp()
    fresh = {k: v.clone() for k, v in discriminator.state_dict().items()}
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.5)
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=0.5)
    with nndx.Monitor({"G": generator, "D": discriminator}, [opt_g, opt_d], every=5) as mon:
        for _ in range(60):
            for model, opt in ((generator, opt_g), (discriminator, opt_d)):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            mon.log(loss)
        report = nndx.probe(discriminator, (x, y), nn.CrossEntropyLoss(), optimizer=opt_d, monitor=mon,
                            probes=["overfit_one_batch"], progress=False)  # fmt: skip
    overfit = report.probes.overfit_one_batch
    assert overfit.status == "passed" and overfit.steps > 0, overfit.message
    assert any("from the initial state" in note for note in report.run.notes)
    assert all(torch.equal(v, discriminator.state_dict()[k]) is False for k, v in fresh.items() if "weight" in k)


def test_after_a_schedule_that_decayed_to_zero_the_initial_state_trains_at_the_peak_lr():
    """A linear schedule to 0 (transformers' get_scheduler default): the optimizer's LR at
    the end is 0, and probes from the initial state would train nothing (an intervention's
    twin 'did not learn', every remedy without a verdict)."""
    model = mlp()
    x, y = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / 40))
    mon = nndx.Monitor(model, optimizer, every=5)
    for _ in range(40):
        optimizer.zero_grad()
        mon.log(nn.functional.cross_entropy(model(x), y).backward() or 0.0)
        optimizer.step()
        schedule.step()
    mon.close()
    assert optimizer.param_groups[0]["lr"] == 0.0
    report = run(model, optimizer, monitor=mon, probes=["interventions"])
    assert any("peak learning rate" in note for note in report.run.notes), report.run.notes
    tried = report.interventions
    assert tried.baseline_final_loss < 0.9 * tried.baseline_initial_loss  # the twin trained at lr 0.5
    assert optimizer.param_groups[0]["lr"] == 0.0  # the user's optimizer untouched


# --------------------------------------------------------------------------- one observation path per fact


class Head(nn.Module):
    """An MLP whose forward ends in a functional op (or none), as user code writes it."""

    def __init__(self, end=None, out=3):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.end = nn.Linear(8, 16), nn.Linear(16, out), end

    def forward(self, x):
        logits = self.fc2(nn.functional.relu(self.fc1(x)))
        if self.end == "softmax":
            return nn.functional.softmax(logits, dim=1)
        if self.end == "sigmoid":
            return torch.sigmoid(logits)
        if self.end == "log_softmax":
            return torch.log_softmax(logits, dim=1)
        if self.end == "log_softmax_dim0":  # over the batch: each column a distribution
            return torch.log_softmax(logits, dim=0)
        return logits


LOSS_FIT = [  # (case, model end, loss, targets, the cause nndx must name from the probe alone)
    ("softmax before CrossEntropyLoss", "softmax", nn.CrossEntropyLoss(), "classes", "DOUBLE_SOFTMAX"),
    ("sigmoid before BCEWithLogitsLoss", "sigmoid", nn.BCEWithLogitsLoss(), "multi_hot", "DOUBLE_SOFTMAX"),
    ("NLLLoss on probabilities", "softmax", nn.NLLLoss(), "classes", "WRONG_LOSS"),
    ("log_softmax over the batch into NLLLoss", "log_softmax_dim0", nn.NLLLoss(), "classes", "WRONG_OUTPUT_ACTIVATION"),
    ("MSE output [N,1] vs target [N]", None, nn.MSELoss(), "values", "SHAPE_BROADCAST"),
]
HEALTHY_LOSS_FIT = [
    ("logits into CrossEntropyLoss", None, nn.CrossEntropyLoss(), "classes"),
    ("logits into BCEWithLogitsLoss", None, nn.BCEWithLogitsLoss(), "multi_hot"),
    ("log_softmax into NLLLoss", "log_softmax", nn.NLLLoss(), "classes"),
    ("MSE on equal shapes", None, nn.MSELoss(), "columns"),
]


def targets_for(kind):
    g = torch.Generator().manual_seed(0)
    return {"classes": torch.randint(0, 3, (16,), generator=g), "multi_hot": torch.randint(0, 2, (16, 3), generator=g).float(),
            "values": torch.randn(16, generator=g), "columns": torch.randn(16, 1, generator=g)}[kind]  # fmt: skip


@pytest.mark.parametrize("case, end, loss_fn, targets, cause", LOSS_FIT, ids=[c[0] for c in LOSS_FIT])
def test_loss_fit_causes_from_the_probe_alone(case, end, loss_fn, targets, cause):
    model = Head(end, out=1 if targets == "values" else 3)
    report = nndx.probe(model, (batch()[0], targets_for(targets)), loss_fn, probes=["nan_origin"])
    assert report.loop.loss_calls and report.loop.loss_calls[0].loss_type == type(loss_fn).__name__
    codes = [f.code.value for f in nndx.diagnose(report).findings if f.severity == "error"]
    assert cause in codes, (case, codes)


@pytest.mark.parametrize("case, end, loss_fn, targets", HEALTHY_LOSS_FIT, ids=[c[0] for c in HEALTHY_LOSS_FIT])
def test_fitting_losses_stay_silent(case, end, loss_fn, targets):
    model = Head(end, out=1 if targets == "columns" else 3)
    report = nndx.probe(model, (batch()[0], targets_for(targets)), loss_fn, probes=["nan_origin"])
    alarms = [(f.code.value, f.symptom) for f in nndx.diagnose(report).findings if f.severity != "info"]
    assert alarms == [], case


def test_loss_calls_from_the_monitor_and_the_probe_merge_once():
    model, (x, y) = Head("softmax"), batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with nndx.Monitor(model, optimizer) as monitor:
        for _ in range(2):  # the user's own loss call: the Monitor's wrapped loss never sees it
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), monitor=monitor, probes=["nan_origin"])
    assert [c.loss_type for c in report.loop.loss_calls] == ["CrossEntropyLoss"]
    assert "DOUBLE_SOFTMAX" in [f.code.value for f in nndx.diagnose(report).findings]


def test_functional_activations_are_layers_and_the_output_activation():
    report = nndx.probe(Head("sigmoid"), (batch()[0], targets_for("multi_hot")), nn.BCELoss(), probes=["hooks"])
    types = {layer.name: layer.type for layer in report.layers}
    assert types["forward:relu#0"] == "ReLU" and types["forward:sigmoid#0"] == "Sigmoid"
    assert list(types).index("forward:relu#0") < list(types).index("fc2")  # in forward order
    assert report.model.activations == ["ReLU", "Sigmoid"] and report.model.output_activation == "Sigmoid"
    sigmoid = {layer.name: layer for layer in report.layers}["forward:sigmoid#0"]
    assert sigmoid.activation.saturated_fraction is not None and sigmoid.gradient is not None


def test_dead_functional_relu_is_dead_relu_like_a_module():
    class DeadFunctional(Head):
        def forward(self, x):
            return self.fc2(nn.functional.relu(self.fc1(x) - 50.0))

    dead = nndx.probe(DeadFunctional(), batch(), nn.CrossEntropyLoss(), probes=["hooks"])
    assert {f.code.value for f in nndx.diagnose(dead).findings if f.severity == "error"} >= {"DEAD_RELU"}
    healthy = nndx.probe(Head(), batch(), nn.CrossEntropyLoss(), probes=["hooks"])
    assert [f.code.value for f in nndx.diagnose(healthy).findings if f.severity != "info"] == []


def _functional_relu_run(shift: float):
    """A Monitor over three steps of Head (F.relu inside forward), each step followed by a
    shift of fc1's bias (what an update far too large does to the units), then the final probe."""
    model, (x, y) = Head(), batch()
    with torch.no_grad():
        model.fc1.bias -= 0.0 if shift else 50.0  # shift 0: dead from the start instead
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    def kill():
        with torch.no_grad():
            model.fc1.bias -= shift

    with nndx.Monitor(model, optimizer) as monitor:
        train_under(monitor, model, optimizer, x, y, after=kill)
        report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), monitor=monitor, probes=["hooks"])
    relu = sorted((layer.step, layer.activation.dead_unit_fraction) for layer in report.layers
                  if layer.name == "forward:relu#0")  # fmt: skip
    first = [layer.name for layer in report.layers if layer.step == relu[0][0]]
    assert first.index("fc1") < first.index("forward:relu#0") < first.index("fc2")  # in forward order
    dead = [f for f in nndx.diagnose(report).findings if f.code.value == "DEAD_RELU"]
    return relu, dead


def test_functional_units_found_dead_after_training_are_compared_with_the_initial_state():
    """The Monitor's hooks see modules, not F.relu: the final probe measures a functional
    activation at the initial state too (the Monitor's snapshot, the same batch), so units
    that died in training are told from units dead since initialisation."""
    relu, dead = _functional_relu_run(shift=100.0)
    assert len(relu) == 2 and relu[0][0] < relu[1][0] and relu[0][1] < 0.5 and relu[1][1] == 1.0
    assert [f.rule_id for f in dead] == ["NNDX208"] and dead[0].evidence["dead_unit_fraction_at_start"] < 0.5
    relu, dead = _functional_relu_run(shift=0.0)
    assert len(relu) == 2 and relu[0][1] == 1.0
    assert [f.rule_id for f in dead] == ["NNDX201"]


def test_trainability_probes_train_a_model_left_in_eval_mode_in_train_mode():
    """After the user's evaluation the model is in eval mode; training happens in train mode.
    With BatchNorm's initial running statistics, eval mode passes raw 0-255 inputs through
    unnormalised and the sigmoid saturates: the probe would fail for a reason training never
    meets. The user's modes are left as they were."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid(), nn.Flatten(0))
    x = torch.randint(0, 256, (64, 16)).float()
    y = (x[:, 0] > 128).float()
    model.eval()
    report = nndx.probe(model, (x, y), nn.BCELoss(), probes=["overfit_one_batch"])
    assert report.probes.overfit_one_batch.status == "passed", report.probes.overfit_one_batch.message
    assert any("eval mode" in note for note in report.run.notes)
    assert not any(m.training for m in model.modules())
    model[1].train()  # one module in a mode of its own: kept
    nndx.probe(model, (x, y), nn.BCELoss(), probes=["overfit_one_batch"])
    assert [m.training for m in model.modules()] == [False, False, True, False, False, False, False]


class _RoundsInEval(nn.Module):
    """CompressAI's entropy bottleneck: uniform noise in training, rounding (no gradient) in eval."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x) - 0.5 if self.training else torch.round(x)


def test_layer_statistics_of_a_model_left_in_eval_mode_are_those_of_training():
    """Gradients only flow in training, which runs in train mode: measured in the eval mode the
    user's evaluation left behind, a layer that rounds in eval mode passes no gradient to the
    layers before it, and the encoder looks starved (VANISHING_GRADIENTS on a healthy model).
    The user's modes are left as they were."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), _RoundsInEval(), nn.Linear(4, 8))
    x = torch.randn(64, 8) * 3
    model.eval()
    report = nndx.probe(model, (x, x), nn.MSELoss(), probes=["hooks"])
    encoder = [p for p in report.parameters if p.name == "0.weight"][0]
    assert encoder.grad_norm is not None and encoder.grad_norm > 0
    assert not any(m.training for m in model.modules())
    assert not [f for f in nndx.diagnose(report).findings if f.severity.value != "info"]


def test_a_body_frozen_before_it_was_trained_is_named_from_the_probes_alone():
    """Fine-tuning code run on a model built from scratch: freeze everything but the head,
    with no weights loaded. A preflight (no Monitor, no loss history) names it."""
    model = mlp(hidden=32)
    model[0].requires_grad_(False)
    report = run(model, probes=["overfit_one_batch"])
    assert report.loop.frozen_at_init == ["0.weight"]
    assert nndx.diagnose(report).top().rule_id == "NNDX305"
    trained = mlp(hidden=32)
    with torch.no_grad():
        trained[0].weight.mul_(3.0)  # outside the default init's bound: weights from elsewhere
    trained[0].requires_grad_(False)
    report = run(trained, probes=["overfit_one_batch"])
    assert report.loop.frozen_at_init == []
    assert "NNDX305" not in {f.rule_id for f in nndx.diagnose(report).findings if f.severity != "info"}


def test_data_stored_by_class_is_no_alarm_when_the_batch_mixes_classes():
    """probe(..., data=) with arrays stored class by class (an ImageFolder's order): the
    batch the loader gave says whether training sees that order."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(300, 8, generator=g), torch.arange(300) // 100  # stored sorted: 100 of each class
    mixed = torch.randperm(300, generator=g)[:32]

    def unshuffled(batch) -> str | None:
        report = nndx.probe(mlp(), batch, nn.CrossEntropyLoss(), probes=["overfit_one_batch"], data=(x, y), **FAST)
        return next((f.severity for f in nndx.diagnose(report).findings if f.rule_id == "NNDX508"), None)

    assert unshuffled((x[mixed], y[mixed])) is None
    assert unshuffled((x[:32], y[:32])) == "warning"  # the first batch of an unshuffled loader: class 0 only


class Tagger(nn.Module):
    """The PyTorch LSTM tagger tutorial's shape: one sentence (T,) per step, the recurrent
    state kept on ``self.hidden`` (with the last forward's graph) and reset by the loop."""

    def __init__(self, log_dim: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding, self.lstm, self.out = nn.Embedding(20, 8), nn.LSTM(8, 16), nn.Linear(16, 5)
        self.log_dim = log_dim
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return torch.zeros(1, 1, 16), torch.zeros(1, 1, 16)

    def forward(self, sentence):
        out, self.hidden = self.lstm(self.embedding(sentence).view(len(sentence), 1, -1), self.hidden)
        return torch.log_softmax(self.out(out.view(len(sentence), -1)), dim=self.log_dim)


def _trained_tagger(log_dim: int = 1, steps: int = 20):
    model = Tagger(log_dim)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 20, (7,), generator=g), torch.randint(0, 5, (7,), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    with nndx.Monitor(model, optimizer) as mon:
        for _ in range(steps):
            model.zero_grad()
            model.hidden = model.init_hidden()
            loss = nn.functional.nll_loss(model(x), y)
            loss.backward()
            optimizer.step()
            mon.log(loss)
    return model, optimizer, mon, (x, y)


def test_a_model_keeping_its_state_with_a_graph_on_self_is_probed_and_left_as_it_was():
    model, optimizer, mon, batch_ = _trained_tagger()
    hidden, weights = model.hidden, {k: v.clone() for k, v in model.state_dict().items()}
    assert hidden[0].grad_fn is not None  # a plain deepcopy refuses this tensor
    report = nndx.probe(model, batch_, nn.NLLLoss(), optimizer=optimizer, monitor=mon, progress=False)
    assert model.hidden is hidden and all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert report.errors == []
    # the probes ran: 300 overfit steps through a state reset before each forward, as the loop resets it
    assert report.probes.overfit_one_batch.status == "passed"
    assert report.probes.sample_independence.status == "skipped"  # one sentence: time, not samples
    assert nndx.diagnose(report).healthy


def test_a_tagger_normalising_over_time_is_named_from_its_loss_call():
    model, optimizer, mon, batch_ = _trained_tagger(log_dim=0, steps=150)
    report = nndx.probe(model, batch_, nn.NLLLoss(), optimizer=optimizer, monitor=mon, progress=False)
    assert nndx.diagnose(report).top().code.value == "WRONG_OUTPUT_ACTIVATION"


class OwnTrain(nn.Sequential):
    """A layer whose class gives ``train`` its own meaning, as the forward-forward example's
    ``Layer.train(x_pos, x_neg)`` does: a probe's mode switch must not call it."""

    def train(self, x_pos, x_neg):  # noqa: D102 - the user's method, not nn.Module's
        raise AssertionError("the user's training method ran")


def test_a_model_whose_train_method_means_something_else_is_still_probed():
    torch.manual_seed(0)
    model = OwnTrain(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    plain.load_state_dict(model.state_dict())
    report = nndx.probe(model, batch(), nn.CrossEntropyLoss(), progress=False)
    assert report.errors == [], [e.message for e in report.errors]
    assert model.training  # as it was
    # every probe ran and read the model as it reads the same network without the override
    expected = nndx.probe(plain, batch(), nn.CrossEntropyLoss(), progress=False)
    for name in ("eval_mode", "sample_independence", "overfit_one_batch", "causality", "interventions"):
        ours, theirs = getattr(report.probes, name, None), getattr(expected.probes, name, None)
        assert (ours is None) == (theirs is None), name
        if ours is not None and hasattr(ours, "status"):
            assert ours.status == theirs.status, name


class Logged(nn.Module):
    """A model keeping objects deepcopy refuses: an open log file and a lock, as models
    that log their own activations or guard a cache do."""

    def __init__(self, log_path) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.log_file = open(log_path, "w")  # noqa: SIM115 - the model owns it
        self.body.lock = threading.Lock()

    def forward(self, x):
        return self.body(x)


def test_a_model_holding_an_open_file_and_a_lock_is_probed_with_them_shared(tmp_path):
    torch.manual_seed(0)
    model = Logged(tmp_path / "log.txt")
    log_file, lock, weights = model.log_file, model.body.lock, {k: v.clone() for k, v in model.state_dict().items()}
    report = nndx.probe(model, batch(), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        progress=False)  # fmt: skip
    model.log_file.close()
    assert report.errors == [], [e.message for e in report.errors]
    assert report.probes.overfit_one_batch.status == "passed"
    assert any("log_file" in n and "body.lock" in n for n in report.run.notes), report.run.notes
    assert model.log_file is log_file and model.body.lock is lock
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


class Flow(nn.Module):
    """An affine coupling layer with a logistic prior, as karpathy/pytorch-normalizing-flows
    builds it: TransformedDistribution(Uniform(0, 1), SigmoidTransform().inv)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.prior = torch.distributions.TransformedDistribution(
            torch.distributions.Uniform(torch.zeros(2), torch.ones(2)), torch.distributions.SigmoidTransform().inv)
        self.s, self.t = nn.Linear(1, 1), nn.Linear(1, 1)

    def forward(self, x):
        s = torch.tanh(self.s(x[:, :1]))
        z = torch.cat([x[:, :1], x[:, 1:] * torch.exp(s) + self.t(x[:, :1])], dim=1)
        return self.prior.log_prob(z).sum(1) + s.sum(1)  # log-likelihood per sample


def test_a_flows_prior_with_an_inverse_transform_survives_the_probes_copy():
    """deepcopy drops an inverse transform's link to its transform (Transform.__getstate__):
    every probe of the flow raised 'AssertionError: _inv must not be None'."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    model = Flow()
    report = nndx.probe(model, (x, None), lambda log_likelihood, _: -log_likelihood.mean(),
                        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), progress=False)  # fmt: skip
    assert not [e for e in report.errors if "_inv" in e.message], [e.message for e in report.errors]
    assert report.probes.overfit_one_batch.status in ("passed", "failed")
    assert model.prior.transforms[0]._inv is not None


def test_a_model_whose_hooks_cannot_be_copied_is_still_refused_with_a_clear_error():
    class Hook:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __call__(self, module, args, output) -> None:
            pass

    model = nn.Sequential(nn.Linear(8, 3))
    model.register_forward_hook(Hook())
    with pytest.raises(UsageError, match="cannot deep-copy the model"):
        nndx.probe(model, batch(), nn.CrossEntropyLoss(), progress=False)
    assert len(model._forward_hooks) == 1  # the user's hook stays


class _FunctionalLearner(nn.Module):
    """MAML-Pytorch's Learner: weights in a ParameterList, a functional forward that can take
    other weights, and ``parameters()`` / ``zero_grad()`` overridden without nn.Module's
    arguments (``recurse``, ``set_to_none``)."""

    def __init__(self):
        super().__init__()
        self.vars = nn.ParameterList([nn.Parameter(torch.randn(16, 8) * 0.3), nn.Parameter(torch.zeros(16)),
                                      nn.Parameter(torch.randn(3, 16) * 0.3), nn.Parameter(torch.zeros(3))])

    def forward(self, x, vars=None):
        w1, b1, w2, b2 = self.vars if vars is None else vars
        return nn.functional.linear(torch.relu(nn.functional.linear(x, w1, b1)), w2, b2)

    def parameters(self):  # noqa: D102 - the author's override, as written
        return self.vars

    def zero_grad(self, vars=None):  # noqa: D102
        for p in self.vars if vars is None else vars:
            if p.grad is not None:
                p.grad.zero_()


def test_a_model_that_overrides_parameters_and_zero_grad_is_measured():
    """Functional meta-learning code overrides nn.Module's methods with narrower ones; nndx
    calls nn.Module's own, so every probe and the Monitor still run."""
    torch.manual_seed(0)
    model = _FunctionalLearner()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    mon = nndx.Monitor(model, optimizer)
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log(loss)
    mon.close()
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, monitor=mon)
    assert report.errors == []
    assert report.loop.steps == 3 and report.model.trainable_param_count == 16 * 8 + 16 + 3 * 16 + 3
    assert report.probes.grad_check.status == "passed"


class _SkipGram(nn.Module):
    """word2vec's skip-gram with negative sampling: sparse embeddings (SparseAdam trains them)
    and a forward that returns the loss itself."""

    def __init__(self, words=50, dim=8):
        super().__init__()
        self.u, self.v = nn.Embedding(words, dim, sparse=True), nn.Embedding(words, dim, sparse=True)
        nn.init.uniform_(self.u.weight, -0.5, 0.5)
        nn.init.uniform_(self.v.weight, -0.5, 0.5)

    def forward(self, pos_u, pos_v, neg_v):
        u = self.u(pos_u)
        score = (u * self.v(pos_v)).sum(1)
        negative = torch.bmm(self.v(neg_v), u.unsqueeze(2)).squeeze(2)
        return (-nn.functional.logsigmoid(score) - nn.functional.logsigmoid(-negative).sum(1)).mean()


def test_sparse_gradients_are_measured_by_the_monitor_and_every_probe():
    torch.manual_seed(0)
    model = _SkipGram()
    optimizer = torch.optim.SparseAdam(list(model.parameters()), lr=0.01)
    batches = [(torch.randint(0, 50, (32,)), torch.randint(0, 50, (32,)), torch.randint(0, 50, (32, 5)))
               for _ in range(6)]  # fmt: skip
    mon = nndx.Monitor(model, optimizer)
    for batch in batches:
        optimizer.zero_grad()
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        mon.log(loss)
    mon.close()
    report = nndx.probe(model, (batches[0], torch.zeros(32)), lambda loss, _: loss, optimizer=optimizer, monitor=mon)
    assert report.errors == []
    assert len(report.loop.grad_norm_history) == 6 and all(p.before_clip > 0 for p in report.loop.grad_norm_history)
    assert all(p.grad_norm is not None and p.grad_norm > 0 for p in report.parameters)
    assert report.probes.overfit_one_batch.status in ("passed", "failed")
    assert report.probes.grad_check.status == "passed"
    assert model.u.sparse and model.v.sparse  # the probes' copies were made dense, not the model


def test_targets_of_both_kinds_say_no_task():
    """A PPO batch's targets: integer actions, float old log-probabilities and returns. The
    first being integers does not make it classification (its MSE value term then reads as the
    wrong loss)."""
    from nndx.collector._common import infer_task

    actions, returns = torch.randint(0, 2, (16,)), torch.randn(16)
    assert infer_task(None, (actions, torch.randn(16), returns)) is None
    assert infer_task(None, (actions, torch.randint(0, 5, (16,)))) == "classification"
    assert infer_task(None, returns) == "regression"


class GrowsOnFirstForward(nn.Module):
    """Registers a parameter on its first forward, as a weight-drop wrapper re-registers its
    weight: the Monitor's snapshot, taken when it attached, lacks it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        if not hasattr(self, "scale"):
            self.scale = nn.Parameter(torch.ones(3))
        return self.fc(x) * self.scale


def test_a_monitor_snapshot_that_no_longer_fits_the_model_skips_the_trainability_probes():
    model, (x, y) = GrowsOnFirstForward(), batch()
    optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    with nndx.Monitor(model, optimizer) as monitor:
        train_under(monitor, model, optimizer, x, y)
        report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), monitor=monitor,
                            probes=["overfit_one_batch", "hooks"])  # fmt: skip
    assert report.probes.overfit_one_batch.status == "skipped"
    assert any("snapshot of the initial state does not fit" in note for note in report.run.notes)
    assert report.layers  # the probes that measure the model as it is still ran
    with pytest.raises(UsageError, match="initial_state does not fit"):  # one the caller passed is a usage error
        nndx.probe(model, (x, y), nn.CrossEntropyLoss(), initial_state={"fc.weight": torch.zeros(3, 8)})


class MomentumQueue(nn.Module):
    """MoCo in miniature: a key encoder that starts as a copy of the query encoder, frozen and
    moved by a momentum update inside forward (``param.data = ...``), and a queue buffer the
    forward writes. Healthy by design."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(8, 4), nn.Linear(8, 4)
        self.k.load_state_dict(self.q.state_dict())
        for p in self.k.parameters():
            p.requires_grad = False
        self.register_buffer("queue", nn.functional.normalize(torch.randn(4, 16), dim=0))

    def forward(self, x):
        q = nn.functional.normalize(self.q(x), dim=1)
        with torch.no_grad():
            for pk, pq in zip(self.k.parameters(), self.q.parameters()):
                pk.data = pk.data * 0.999 + pq.data * 0.001
            k = nn.functional.normalize(self.k(x + 0.1), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().detach()], dim=1) / 0.07
        with torch.no_grad():
            self.queue[:, : x.shape[0]] = k.T
        return logits


def test_a_forward_that_writes_its_own_untrained_tensors_is_measured_from_the_same_state_each_time():
    """Each probe forward starts from the copy's state, so the queue does not fill and the key
    encoder does not drift across a probe's forwards: no samples "mix", the LR sweep does not
    "diverge" at 1e-7, the gradient check says skipped (a path around autograd by design), and
    the frozen key encoder, a copy of the trained one, is no forgotten freeze. The user's
    model is untouched."""
    model = MomentumQueue()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(12, 8, generator=torch.Generator().manual_seed(1)), torch.zeros(12, dtype=torch.long)
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), progress=False)
    assert report.probes.sample_independence.status == "passed", report.probes.sample_independence.message
    assert report.probes.lr_range.status == "passed", report.probes.lr_range.message
    check = report.probes.grad_check
    assert check.status == "skipped" and "writes the model's own untrained tensors" in check.message
    assert "k.weight" in check.message and "queue" in check.message
    assert report.loop.frozen_tracking == ["k.weight", "k.bias"]
    assert [f.code.value for f in nndx.diagnose(report).findings if f.severity != "info"] == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class LambdaBlock(nn.Module):
    """minGPT's Block keeps its MLP as ``self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))``:
    a function closing over the module dict, which deepcopy shares with the original."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, 16)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(16, 32), act=nn.GELU(), c_proj=nn.Linear(32, 16),
                                      dropout=nn.Dropout(0.3)))  # fmt: skip
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.head(h + self.mlpf(h))


def test_a_copy_runs_its_own_modules_behind_a_lambda():
    model = LambdaBlock()
    before = snapshot(model)
    report = run(model, probes=["eval_mode", "overfit_one_batch"])
    # the copy's eval() reaches the dropout behind the lambda (the user's model is in train mode:
    # the probe's own verdict on that mode is another matter)
    assert report.probes.eval_mode.ignores_eval is False and report.probes.eval_mode.eval_abs_diff == 0
    assert report.probes.overfit_one_batch.status == "passed"
    assert_untouched(before, model)
    assert all(p.grad is None for p in model.parameters())  # no probe's backward reached the user's weights


def _global_generator_loss(fake, real):  # a script's loss naming its global discriminator
    return _GAN["criterion"](DISCRIMINATOR(fake), torch.ones(fake.shape[0], 1)) + nn.functional.mse_loss(fake, real)


DISCRIMINATOR: nn.Module | None = None
_GAN: dict = {}


@pytest.mark.parametrize("reached", ["closure", "nested_function", "global"])
def test_a_discriminator_inside_the_generators_loss_is_probed_on_a_copy(reached, monkeypatch):
    """SRGAN's generator loss runs the discriminator (held in the function's closure); the
    relativistic GAN's calls a function whose closure holds it; a script's names it as a
    global. The probes must run a copy of it, or they move its batch-norm statistics, count in
    its Monitor as no-grad forwards in train mode (an EVAL_MODE_FORGOTTEN false alarm), and
    leave their gradients in its .grad for a loop that never zeroes them."""
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8))
    discriminator = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    optimizer_d = torch.optim.Adam(discriminator.parameters())
    criterion = nn.BCEWithLogitsLoss()
    monkeypatch.setitem(globals(), "DISCRIMINATOR", discriminator)
    monkeypatch.setitem(_GAN, "criterion", criterion)

    def generator_loss(fake, real):
        return criterion(discriminator(fake), torch.ones(fake.shape[0], 1)) + nn.functional.mse_loss(fake, real)

    def calls_it(fake, real):
        return generator_loss(fake, real)

    loss_fn = {"closure": generator_loss, "nested_function": calls_it, "global": _global_generator_loss}[reached]
    z, real = torch.randn(32, 4), torch.randn(32, 8)
    discriminator(torch.randn(32, 8)).sum().backward()  # gradients a loop without zero_grad would keep
    grads = [p.grad.clone() for p in discriminator.parameters()]
    before = snapshot(discriminator)
    with nndx.Monitor(discriminator, optimizer_d) as mon_d:
        nndx.probe(generator, (z, real), loss_fn, progress=False)
        forwards = mon_d.report().loop.forward_calls
    assert forwards == 0
    assert_untouched(before, discriminator)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, discriminator.parameters()))


class SpanHead(nn.Module):
    """run_qa's shape in miniature: a start and an end logit per input token."""

    def __init__(self, positions: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(30, 8), nn.Linear(8, 2 if positions else 5)
        self.positions = positions

    def forward(self, ids):
        h = self.head(self.embed(ids))  # (batch, tokens, 2)
        return tuple(h.unbind(-1)) if self.positions else h.mean(1)


def test_labels_that_point_at_input_positions_have_no_missing_classes():
    """An extractive QA model's answer starts index the tokens: positions no answer starts
    at (the question's) are no classes missing. A classifier's gap in its labels still is."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30, (64, 20), generator=g)
    starts = torch.tensor([6, 10, 11, 14, 15, 16])[torch.randint(0, 6, (64,), generator=g)]

    def span_loss(output, y):
        return nn.functional.cross_entropy(output[0], y)

    report = nndx.probe(SpanHead(), (ids[:8], starts[:8]), span_loss, data=(ids, starts), probes=[])
    assert report.data.train.missing_classes == [] and report.data.train.class_counts == {}
    assert "NNDX507" not in {f.rule_id for f in nndx.diagnose(report).findings}
    labels = torch.tensor([0, 1, 2, 4])[torch.randint(0, 4, (64,), generator=g)]
    classifier = nndx.probe(SpanHead(False), (ids[:8], labels[:8]), nn.functional.cross_entropy,
                            data=(ids, labels), probes=[])  # fmt: skip
    assert classifier.data.train.missing_classes == ["3"]
    # a Hugging Face QA model's output: its loss first, then the start and end logits
    report = nndx.probe(HFSpanHead(), {"input_ids": ids[:8], "start_positions": starts[:8]}, None,
                        data=(ids, starts), probes=[])  # fmt: skip
    assert report.data.train.missing_classes == [] and report.data.train.class_counts == {}


class HFSpanHead(SpanHead):
    def forward(self, input_ids, start_positions):
        start, end = super().forward(input_ids)
        return {"loss": nn.functional.cross_entropy(start, start_positions), "start_logits": start, "end_logits": end}


class TinyFCN(nn.Module):
    """torchvision's segmentation shape: a class score per pixel, (N, C, H, W)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))

    def forward(self, x):
        return self.body(x)


def test_segmentation_masks_are_counted_per_pixel_with_255_ignored():
    """A mask through ToTensor (divided by 255, cast back) keeps classes 0 and 1 of 4 (the
    255 border became 1): classes missing, as a per-sample label would say. A healthy mask's
    255 border is the ignore index, no class."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, 8, 8, generator=g)
    masks = torch.randint(0, 4, (32, 8, 8), generator=g)
    masks[:, 0] = 255  # the ignored border
    loss = nn.CrossEntropyLoss(ignore_index=255)

    def found(y):
        report = nndx.probe(TinyFCN(), (x[:8], y[:8]), loss, data=(x, y), probes=[])
        return report, {f.rule_id for f in nndx.diagnose(report).findings}

    healthy, healthy_rules = found(masks)
    assert healthy.data.train.missing_classes == [] and set(healthy.data.train.class_counts) == {"0", "1", "2", "3"}
    assert "NNDX507" not in healthy_rules and "NNDX504" not in healthy_rules
    collapsed, rules = found((masks == 255).long())  # classes / 255 -> 0, the border 255 / 255 -> 1
    assert collapsed.data.train.missing_classes == ["2", "3"] and "NNDX507" in rules


class AttributeVAE(nn.Module):
    """vgae_pytorch's and many VAEs' shape: the forward keeps its mean and log-std on the
    module, and the loss reads them from there (a closure over the model)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc, self.mu, self.log_std, self.dec = nn.Linear(6, 8), nn.Linear(8, 2), nn.Linear(8, 2), nn.Linear(2, 6)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        self.mean, self.logstd = self.mu(h), self.log_std(h)
        return self.dec(self.mean + torch.randn_like(self.mean) * self.logstd.exp())


def test_a_loss_that_reads_what_the_forward_kept_on_the_model_reads_the_probes_copy():
    model = AttributeVAE()
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(0))

    def vae_loss(out, target):
        kl = -0.5 * (1 + 2 * model.logstd - model.mean**2 - (2 * model.logstd).exp()).sum(1).mean()
        return nn.functional.mse_loss(out, target) + kl

    report = nndx.probe(model, (x, x), vae_loss)  # before the model ever ran: nothing kept on it yet
    assert report.errors == [], report.errors
    assert not hasattr(model, "mean")  # the probes' forwards kept theirs on their copies


class SquaredLossModule(nn.Module):
    def loss(self, y_hat, y):
        return ((y_hat - y) ** 2 / 2).mean()


class PenalisedLinear(SquaredLossModule):
    """d2l's WeightDecay: the loss is a method of the model that calls ``super().loss``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(20, 1)

    def forward(self, x):
        return self.net(x)

    def loss(self, y_hat, y):
        return super().loss(y_hat, y) + 0.01 * (self.net.weight**2).sum()


class LazyPenalisedLinear(SquaredLossModule):
    """d2l's concise WeightDecay: an ``nn.LazyLinear``, uninitialised until its first forward,
    and the loss a method of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.LazyLinear(1)

    def forward(self, x):
        return self.net(x)

    def loss(self, y_hat, y):
        return super().loss(y_hat, y) + 0.01 * (self.net.weight**2).sum()


def test_a_model_with_lazy_parameters_is_probed_on_a_copy_a_forward_initialised():
    torch.manual_seed(0)
    model = LazyPenalisedLinear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 20, generator=torch.Generator().manual_seed(0)), torch.randn(32, 1)
    rng = torch.get_rng_state()
    report = nndx.probe(model, (x, y), model.loss, optimizer=optimizer)
    assert report.errors == [], report.errors
    assert report.probes.overfit_one_batch.status in ("passed", "failed")
    assert any("lazy" in note for note in report.run.notes), report.run.notes
    assert torch.equal(torch.get_rng_state(), rng)
    assert nn.parameter.is_lazy(model.net.weight)  # the user's model is initialised by its own first forward
    model(x).sum().backward()  # and still trains with its own optimizer
    optimizer.step()


def test_a_loss_that_is_a_method_of_the_model_calling_super_runs_on_the_probes_copy():
    model = PenalisedLinear()
    x, y = torch.randn(32, 20, generator=torch.Generator().manual_seed(0)), torch.randn(32, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = nndx.probe(model, (x, y), model.loss, optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert report.errors == [], report.errors
    assert report.probes.overfit_one_batch.status in ("passed", "failed")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class ActorCritic(nn.Module):
    """pytorch-a2c-ppo-acktr's Policy: ``forward`` raises NotImplementedError, the loop calls
    ``act`` and ``evaluate_actions``."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Linear(4, 2)

    def forward(self, x):
        raise NotImplementedError

    def act(self, x):
        return self.actor(x).softmax(-1)


def test_a_model_without_a_forward_is_said_once_and_every_probe_skipped_with_the_reason():
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    report = nndx.probe(ActorCritic(), (x, y), nn.functional.cross_entropy)
    assert [e.source for e in report.errors] == ["describe"]
    statuses = {spec: getattr(report.probes, spec).status for spec in ("overfit_one_batch", "lr_range", "grad_check")}
    assert set(statuses.values()) == {"skipped"}
    assert "NotImplementedError" in report.probes.overfit_one_batch.message


def test_a_loss_that_computes_its_targets_from_the_output_is_told_from_one_that_reads_them():
    """DEC's target distribution (q^2 / f, normalised) and pseudo-labels from the argmax follow the
    output; targets read from the batch, or negatives drawn at random in the loss, do not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Softmax(dim=1))
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))

    def dec(q, _):
        p = q**2 / q.sum(0)
        return nn.functional.kl_div(q.log(), (p / p.sum(1, keepdim=True)).detach(), reduction="batchmean")

    def pseudo_labels(q, _):
        return nn.functional.nll_loss(q.log(), q.argmax(1).detach())

    def given(q, target):
        return nn.functional.nll_loss(q.log(), target)

    def random_negatives(q, target):
        wrong = (target + torch.randint(1, 4, target.shape)) % 4
        return nn.functional.nll_loss(q.log(), target) - 0.1 * nn.functional.nll_loss(q.log(), wrong)

    def verdict(loss_fn, targets):
        return nndx.probe(model, (x, targets), loss_fn, probes=[], progress=False).loop.loss_targets_from_output

    assert verdict(dec, None) is True and verdict(pseudo_labels, None) is True
    assert verdict(given, y) is False and verdict(random_negatives, y) is False
    assert verdict(nn.NLLLoss(), y) is None  # torch's own loss: its targets are the batch's


class WrappingOptimizer(torch.optim.Optimizer):
    """Opacus's DPOptimizer's shape: wraps an optimizer, never calls Optimizer.__init__, and
    reads its groups through the wrapped one. Deep-copying it runs Optimizer.__setstate__ on the
    copy, which patches ``step`` on the class before failing ('original_optimizer')."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.original_optimizer = optimizer

    @property
    def param_groups(self):
        return self.original_optimizer.param_groups

    @property
    def defaults(self):
        return self.original_optimizer.defaults

    @property
    def state(self):
        return self.original_optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none)

    def step(self, closure=None):
        return self.original_optimizer.step(closure)


def test_an_optimizer_that_wraps_another_without_its_init_still_steps_after_the_probes():
    model, data = mlp(), batch()
    optimizer = WrappingOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    step, before = vars(WrappingOptimizer)["step"], snapshot(model)
    report = nndx.probe(model, data, nn.CrossEntropyLoss(), optimizer=optimizer, probes=["overfit_one_batch", "lr_range"])
    assert_untouched(before, model)
    assert vars(WrappingOptimizer)["step"] is step  # no probe's copy patched the user's class
    assert report.probes.overfit_one_batch.status == "passed", report.probes.overfit_one_batch.message
    assert report.probes.lr_range.status != "error", report.probes.lr_range.message
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(model(data[0]), data[1]).backward()
    optimizer.step()  # the user's training goes on
    assert not torch.equal(model[0].weight, before["state"]["0.weight"])


def test_a_loss_cut_from_a_model_that_trains_is_evidence_and_a_frozen_model_measures_without_backward():
    """A loss computed from detached outputs cannot train the model: the hooks probe's
    backward raises, and that is the evidence. A model with nothing trainable (an image
    optimised through it) is measured forward only."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    def cut(out, target):
        return torch.nn.functional.mse_loss(out.detach(), target)

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    report = nndx.probe(model, (x, y), cut, probes=["hooks"])
    assert any(e.source == "hooks" and e.type == "RuntimeError" for e in report.errors)
    assert "NNDX707" in {f.rule_id for f in nndx.diagnose(report).findings}
    image = torch.zeros(16, 4, requires_grad=True)
    frozen = nndx.probe(model.requires_grad_(False), (x, y), torch.nn.MSELoss(), probes=["hooks"],
                        optimizer=torch.optim.Adam([image]))  # fmt: skip
    assert not frozen.errors and frozen.layers and all(layer.gradient is None for layer in frozen.layers)


class _HamiltonianField(nn.Module):
    """A Hamiltonian network's vector field: the symplectic gradient of a learned scalar H(q, p)
    by the input, so its forward needs autograd whatever mode the caller runs it in."""

    def __init__(self) -> None:
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)
        (dh,) = torch.autograd.grad(self.energy(x).sum(), x, create_graph=True)
        return torch.stack([dh[:, 1], -dh[:, 0]], dim=1)


def test_a_forward_that_differentiates_by_its_input_is_probed_not_called_detached():
    """The probes run their forwards under no_grad, where the field's autograd.grad has no
    graph: that is nndx's doing, not a loss detached from the parameters."""
    torch.manual_seed(0)
    model = _HamiltonianField()
    x = torch.randn(64, 2)
    y = torch.stack([2 * x[:, 1], -2 * x[:, 0]], dim=1)  # the spring's field, H = q^2 + p^2
    report = nndx.probe(model, (x, y), nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), 1e-3))
    assert report.errors == []
    assert report.probes.grad_check.status == "passed" and report.probes.eval_mode.status == "passed"
    assert not [f for f in nndx.diagnose(report).findings if f.severity != "info"]


def test_the_retried_forwards_outputs_come_back_detached_in_their_own_containers():
    from collections import namedtuple

    from nndx.collector._common import forward

    Out = namedtuple("Out", "field energy")

    class Named(_HamiltonianField):
        def forward(self, x):
            return Out(super().forward(x), {"h": self.energy(x)})

    with torch.no_grad():
        out = forward(Named(), torch.randn(8, 2))
    assert type(out) is Out and out.field.shape == (8, 2) and not out.field.requires_grad
    assert not out.energy["h"].requires_grad


class HeatmapNet(nn.Module):
    """CenterNet shaped: a conv body and two heads, returned as a dict."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.hm, self.wh = nn.Conv2d(8, 2, 1), nn.Conv2d(8, 2, 1)

    def forward(self, x):
        z = self.body(x)
        return {"hm": self.hm(z), "wh": self.wh(z)}


def centernet_loss(output, batch):
    """CenterNet's CtdetLoss: rewrites the output dict's heatmap with an in-place sigmoid_,
    clamped, then a focal loss on it and an L1 loss on the sizes."""
    output["hm"] = torch.clamp(output["hm"].sigmoid_(), min=1e-4, max=1 - 1e-4)
    pred, gt = output["hm"], batch["hm"]
    pos = gt.eq(1).float()
    neg = 1 - pos
    pos_loss = (torch.log(pred) * (1 - pred) ** 2 * pos).sum()
    neg_loss = (torch.log(1 - pred) * pred**2 * (1 - gt) ** 4 * neg).sum()
    focal = -(pos_loss + neg_loss) / pos.sum().clamp_min(1)
    return focal + 0.1 * nn.functional.l1_loss(output["wh"] * pos[:, :1], batch["wh"] * pos[:, :1])


def test_a_loss_that_rewrites_the_output_in_place_is_called_on_its_own_copy_of_it():
    """CenterNet's loss applies sigmoid_ to the model's output in place and stores the result back
    in the output dict, as its training loop allows (one loss call per forward). Every probe that
    calls the loss more than once on one forward (the overfit probe's loss floor, the gradient
    check, the loss-call observation) hands it its own copy, so nothing is modified under the
    backward nndx takes, and the healthy model gets no INPLACE_AUTOGRAD from nndx's own calls."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 8, 8, generator=g)
    hm = torch.rand(6, 2, 8, 8, generator=g) * 0.5
    hm[:, 0, 2, 3] = 1.0
    hm[:, 1, 5, 5] = 1.0
    targets = {"hm": hm, "wh": torch.rand(6, 2, 8, 8, generator=g)}
    report = nndx.probe(HeatmapNet(), (x, targets), centernet_loss, **FAST)
    assert report.errors == [], [(e.source, e.message[:200]) for e in report.errors]
    for name in ("overfit_one_batch", "lr_range", "grad_check"):
        assert getattr(report.probes, name).status in ("passed", "failed"), name
    assert not any(f.code.value == "INPLACE_AUTOGRAD" for f in nndx.diagnose(report).findings)


def test_a_diverged_model_is_described_from_its_initial_state():
    """After a run whose weights went NaN, every output is NaN: what reaches the loss (are
    these log-probabilities?) can only be read at the initial state. udacity's notebook with
    NLLLoss on raw scores lost its NNDX315 after training this way."""
    model = mlp()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model[0].weight.fill_(math.nan)
    x, y = batch()
    report = nndx.probe(model, (x, y), nn.NLLLoss(), probes=[], initial_state=initial, progress=False)
    call = report.loop.loss_calls[0]
    assert math.isfinite(call.output_max) and call.output_max > 0
    assert any("described from the initial state" in note for note in report.run.notes)
    assert "NNDX315" in {f.rule_id for f in nndx.diagnose(report).findings}
    blind = nndx.probe(model, (x, y), nn.NLLLoss(), probes=[], progress=False)  # no initial state: NaN is all there is
    assert math.isnan(blind.loop.loss_calls[0].output_max)
    assert torch.isnan(model[0].weight).all()  # the user's model untouched

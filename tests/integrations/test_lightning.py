"""NndxCallback with real, tiny PyTorch Lightning runs on CPU."""

from __future__ import annotations

import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nndx.integrations.lightning import NndxCallback
from nndx.report import Diagnosis, DiagnosticReport

pytestmark = pytest.mark.slow

SAMPLES, BATCH, EPOCHS = 64, 16, 2
STEPS = SAMPLES // BATCH * EPOCHS


class TinyClassifier(pl.LightningModule):
    def __init__(self, dead_relu: bool = False, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
        if dead_relu:  # every hidden unit's pre-activation is negative for every input
            with torch.no_grad():
                self.net[0].bias.fill_(-100.0)
        self.fail_at_step = fail_at_step
        self.train_losses: list[float] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.fail_at_step is not None and self.global_step == self.fail_at_step:
            raise RuntimeError("planted failure")
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.train_losses.append(loss.item())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 4, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    data = TensorDataset(x, y)
    return DataLoader(data, batch_size=BATCH, shuffle=True), DataLoader(data, batch_size=32)


def fit(module: pl.LightningModule, callback, root, max_epochs: int = EPOCHS, logger=False) -> pl.Trainer:
    trainer = pl.Trainer(
        max_epochs=max_epochs, accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
        callbacks=[callback], num_sanity_val_steps=1, log_every_n_steps=1,
    )  # fmt: skip
    train, val = loaders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's "few workers" / "small log interval" advice
        trainer.fit(module, train, val)
    return trainer


def saved(root) -> tuple[DiagnosticReport, Diagnosis]:
    report = DiagnosticReport.model_validate_json((root / "nndx-report.json").read_text())
    diagnosis = Diagnosis.model_validate_json((root / "nndx-diagnosis.json").read_text())
    return report, diagnosis


def fast_preflight() -> dict:
    return {"overfit_one_batch": {"steps": 60}, "lr_range": {"steps": 20}}


def test_callback_records_the_fit_and_saves_report_and_diagnosis(tmp_path):
    torch.manual_seed(0)
    module = TinyClassifier()
    callback = NndxCallback(every=2)
    fit(module, callback, tmp_path)
    report, diagnosis = saved(tmp_path)

    assert report.loop.steps == STEPS and report.loop.backward_calls == STEPS
    assert report.loop.zero_grad_calls >= STEPS  # Lightning resets gradients every step (and once more)
    train = report.loss_history["train"]
    assert [p.step for p in train] == list(range(STEPS))
    assert [p.value for p in train] == pytest.approx(module.train_losses)  # not the sanity check's
    assert len(report.loss_history["val"]) == EPOCHS  # sanity-check validation is left out
    assert {layer.step for layer in report.layers} == set(range(0, STEPS, 2))
    assert {p.name for p in report.parameters} == {n for n, _ in module.named_parameters()}
    assert report.run.name == "TinyClassifier"
    assert report.errors == []
    assert callback.report is not None
    assert [f.code.value for f in diagnosis.findings if f.severity != "info"] == []  # healthy: no alarm


def test_dead_relu_module_is_diagnosed(tmp_path):
    torch.manual_seed(0)
    fit(TinyClassifier(dead_relu=True), NndxCallback(), tmp_path, max_epochs=1)
    report, diagnosis = saved(tmp_path)

    relu = [layer for layer in report.layers if layer.type == "ReLU"]
    assert relu and all(layer.activation.dead_unit_fraction == 1.0 for layer in relu)
    assert "DEAD_RELU" in {f.code.value for f in diagnosis.findings if f.severity != "info"}


def test_preflight_runs_the_probes_and_leaves_training_unchanged(tmp_path):
    torch.manual_seed(0)
    plain = TinyClassifier()
    fit(plain, NndxCallback(), tmp_path / "plain", max_epochs=1)
    torch.manual_seed(0)
    probed = TinyClassifier()
    callback = NndxCallback(preflight=True, loss_fn=nn.CrossEntropyLoss(), preflight_options=fast_preflight())
    fit(probed, callback, tmp_path / "probed", max_epochs=1)
    report, _ = saved(tmp_path / "probed")

    # the probes ran on copies with the RNG restored: training is bit-for-bit the same
    assert probed.train_losses == plain.train_losses
    for (name, a), (_, b) in zip(plain.state_dict().items(), probed.state_dict().items()):
        assert torch.equal(a, b), name
    probes = report.probes
    assert probes.overfit_one_batch.status == "passed"
    assert probes.lr_range.status in ("passed", "failed") and len(probes.lr_range.lrs) > 0
    assert probes.grad_check.status == "passed"
    assert report.loop.steps == SAMPLES // BATCH  # the Monitor saw the training, not the probes
    assert report.errors == []


def test_preflight_without_loss_fn_uses_training_step(tmp_path):
    torch.manual_seed(0)
    module = TinyClassifier()
    # no loss_fn: no accuracy either, so overfitting is judged on the loss alone (1% of
    # its start), which takes the probe's default number of steps
    callback = NndxCallback(preflight=True, preflight_options={"lr_range": {"steps": 20}})
    fit(module, callback, tmp_path, max_epochs=1)
    report, _ = saved(tmp_path)

    assert report.probes.grad_check.status == "passed"
    # the view shares the module's dicts: parameter names are the module's own
    assert {p.name for p in report.probes.grad_check.parameters} <= {n for n, _ in module.named_parameters()}
    assert report.probes.overfit_one_batch.status == "passed", report.probes.overfit_one_batch.message
    # the data checks read the Trainer's loaders' inputs whatever the loss (raw inputs, leaks); with no
    # loss_fn the items' second part need not be the target (an autoencoder's digit labels): no classes
    assert report.data is not None and report.data.train.n_samples == SAMPLES and report.data.test is not None
    assert report.data.train.class_counts == {} and report.data.train.label_kind is None
    assert report.errors == []


def test_a_crashing_fit_still_saves_what_was_seen(tmp_path):
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="planted failure"):
        fit(TinyClassifier(fail_at_step=3), NndxCallback(), tmp_path)
    report, _ = saved(tmp_path)

    assert report.loop.steps == 3
    assert [(e.source, e.type, e.message) for e in report.errors] == [
        ("lightning.training", "RuntimeError", "planted failure")
    ]


def test_log_to_logger_writes_the_series_to_the_trainers_tensorboard(tmp_path):
    from pytorch_lightning.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing import event_accumulator

    torch.manual_seed(0)
    module = TinyClassifier()
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb")
    fit(module, NndxCallback(every=2, log_to_logger=True), tmp_path, max_epochs=1, logger=logger)

    run_dir = tmp_path / "tb" / "version_0"
    report, _ = saved(run_dir)  # trainer.log_dir is the logger's version directory
    events = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    nndx_loss = {e.step: e.value for e in events.Scalars("nndx/loss/train")}
    assert nndx_loss == {p.step: pytest.approx(p.value) for p in report.loss_history["train"]}
    assert len(nndx_loss) == SAMPLES // BATCH
    assert "train_loss" in events.Tags()["scalars"]  # next to Lightning's own series
    assert {e.step for e in events.Scalars("nndx/dead_unit_fraction/net.1")} == {0, 2}
    assert report.errors == []


def test_monitor_options_reach_the_monitor_live_tensorboard_export(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    module = TinyClassifier()
    writer = SummaryWriter(log_dir=str(tmp_path / "live"))
    fit(module, NndxCallback(tensorboard=writer), tmp_path, max_epochs=1)
    writer.close()

    events = event_accumulator.EventAccumulator(str(tmp_path / "live"), size_guidance={"scalars": 0})
    events.Reload()
    live_loss = [e.value for e in events.Scalars("nndx/loss/train")]
    assert live_loss == pytest.approx(module.train_losses)
    assert len(events.Scalars("nndx/grad_norm")) == SAMPLES // BATCH


def test_log_to_logger_without_a_logger_says_so(tmp_path):
    torch.manual_seed(0)
    fit(TinyClassifier(), NndxCallback(log_to_logger=True), tmp_path, max_epochs=1)
    report, _ = saved(tmp_path)
    assert [(e.source, e.message) for e in report.errors] == [
        ("lightning.export", "log_to_logger=True, but the Trainer has no TensorBoard or W&B logger")
    ]


def test_a_missing_val_loss_key_is_warned_about_once(tmp_path, caplog):
    torch.manual_seed(0)
    with caplog.at_level("WARNING", logger="nndx"):
        fit(TinyClassifier(), NndxCallback(val_loss_key="valid/loss"), tmp_path)
    report, _ = saved(tmp_path)
    assert "val" not in report.loss_history
    warnings_about_it = [r for r in caplog.records if "valid/loss" in r.getMessage()]
    assert len(warnings_about_it) == 1 and "val_loss" in warnings_about_it[0].getMessage()  # what was logged


def test_global_grad_norm_is_recorded_under_lightnings_closure_step(tmp_path):
    # forward and backward run inside optimizer.step(closure): the norm is read after backward all the same
    torch.manual_seed(0)
    fit(TinyClassifier(), NndxCallback(), tmp_path, max_epochs=1)
    report, _ = saved(tmp_path)
    assert len(report.loop.grad_norm_history) == SAMPLES // BATCH


class DivergingClassifier(TinyClassifier):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e4)  # the loss is NaN within a few steps


def test_stop_on_error_stops_the_fit_gracefully_and_saves_the_report(tmp_path):
    torch.manual_seed(0)
    module = DivergingClassifier()
    fit(module, NndxCallback(stop_on="error", alert_every=1), tmp_path, max_epochs=20)
    report, diagnosis = saved(tmp_path)

    assert report.loop.steps < 20 * SAMPLES // BATCH  # stopped long before max_epochs
    assert any(not math.isfinite(p.value) for p in report.loss_history["train"])
    stops = [e for e in report.errors if e.source == "lightning.stop_on"]
    assert len(stops) == 1 and stops[0].type == "TrainingFailure" and "nndx stopped training" in stops[0].message
    assert any(f.severity == "error" for f in diagnosis.findings)


def test_stop_on_is_checked_when_the_callback_is_made():
    with pytest.raises(ValueError, match="stop_on"):
        NndxCallback(stop_on="sometimes")


def test_preflight_checks_the_trainers_data_without_changing_its_shuffle(tmp_path):
    """The preflight reads a sample of the Trainer's loaders for the data checks and the
    label probes; a loader with its own generator still shuffles as it would have."""

    def own_loaders(leak: bool):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2 * SAMPLES, 4, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
        train = TensorDataset(x[:SAMPLES], y[:SAMPLES])
        val = train if leak else TensorDataset(x[SAMPLES:], y[SAMPLES:])
        return (DataLoader(train, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(7)),
                DataLoader(val, batch_size=32))

    def run(callback, root, leak=False):
        torch.manual_seed(0)
        module = TinyClassifier()
        # two epochs: the sample is read after the first epoch's order was drawn, so only
        # the second would show a generator the read had moved on
        trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
                             callbacks=[callback], num_sanity_val_steps=0)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, *own_loaders(leak))
        return module

    plain = run(NndxCallback(), tmp_path / "plain")
    probed = run(NndxCallback(preflight=True, loss_fn=nn.CrossEntropyLoss(), preflight_options=fast_preflight()),
                 tmp_path / "probed")  # fmt: skip
    assert probed.train_losses == plain.train_losses
    report, diagnosis = saved(tmp_path / "probed")
    assert report.data is not None and report.data.train.n_samples == SAMPLES and report.data.test is not None
    assert report.data.train_test_overlap == 0
    assert "DATA_LEAKAGE" not in {f.code.value for f in diagnosis.findings}
    run(NndxCallback(preflight=True, loss_fn=nn.CrossEntropyLoss(), preflight_options=fast_preflight()),
        tmp_path / "leak", leak=True)
    leaked, leaked_diagnosis = saved(tmp_path / "leak")
    assert leaked.data.train_test_overlap_fraction == 1.0
    assert "DATA_LEAKAGE" in {f.code.value for f in leaked_diagnosis.findings if f.severity != "info"}

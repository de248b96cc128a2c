"""TensorBoard and W&B exporters, tested against the real libraries: TensorBoard event
files are read back with tensorboard's own EventAccumulator, the offline W&B run from
its transaction log."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator
from torch.utils.tensorboard import SummaryWriter

from nndx.integrations import Exporter, export_report, make_sinks, report_series, step_scalars
from nndx.integrations.tensorboard import TensorBoardSink
from nndx.integrations.wandb import WandbSink
from nndx.report import DiagnosticReport, LossPoint

from . import wandb_files
from .conftest import DEAD_UNITS, HIDDEN, measured_report, measured_steps


def read_events(log_dir: Path) -> event_accumulator.EventAccumulator:
    accumulator = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    accumulator.Reload()
    return accumulator


def scalar_series(accumulator: event_accumulator.EventAccumulator, tag: str) -> dict[int, float]:
    return {event.step: event.value for event in accumulator.Scalars(tag)}


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict, dict | None]] = []
        self.closed = False

    def log_step(self, step, scalars, histograms=None):
        self.calls.append((step, dict(scalars), None if histograms is None else dict(histograms)))

    def flush(self):
        pass

    def close(self):
        self.closed = True


class BrokenSink(RecordingSink):
    def log_step(self, step, scalars, histograms=None):
        raise OSError("disk full")


# --------------------------------------------------------------------------- scalars


def test_step_scalars_from_real_measurements():
    step, loss, layers, params = measured_steps(1)[0]
    scalars = step_scalars(losses={"train": loss}, layers=layers, parameters=params)

    assert scalars["loss/train"] == pytest.approx(loss)
    # the planted dead units show after the ReLU ("1"), not in the final Linear's outputs
    assert scalars["dead_unit_fraction/1"] == pytest.approx(DEAD_UNITS / HIDDEN)
    assert scalars["dead_unit_fraction/2"] == 0.0
    expected_norm = math.sqrt(sum(p.grad_norm**2 for p in params))
    assert scalars["grad_norm"] == pytest.approx(expected_norm)
    assert {f"update_ratio/{p.name}" for p in params} <= scalars.keys()
    assert all(scalars[f"update_ratio/{p.name}"] > 0 for p in params if p.name != "0.bias")


def test_report_series_uses_the_loops_grad_norm_and_keeps_nan():
    report = measured_report(3)
    report.loss_history["val"] = [LossPoint(step=2, value=float("nan"), accuracy=0.5)]
    series = report_series(report)

    assert sorted(series) == [0, 1, 2]
    assert [series[s]["grad_norm"] for s in range(3)] == [10.0, 11.0, 12.0]
    assert math.isnan(series[2]["loss/val"]) and series[2]["accuracy/val"] == 0.5
    assert "loss/val" not in series[1]


# --------------------------------------------------------------------------- TensorBoard


def test_tensorboard_sink_writes_events_tensorboard_reads(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    sink = TensorBoardSink(writer)
    sink.log_step(0, {"loss/train": 2.0}, {"weights/w": [0.1, 0.2, 0.3, float("nan")]})
    sink.log_step(1, {"loss/train": float("nan")}, {"weights/w": [float("inf")]})
    sink.close()  # a writer passed in stays open: close() only flushes it
    writer.close()

    events = read_events(tmp_path)
    loss = scalar_series(events, "nndx/loss/train")
    assert loss[0] == 2.0 and math.isnan(loss[1])
    histograms = events.Histograms("nndx/weights/w")
    assert [h.step for h in histograms] == [0]  # step 1 had no finite value to bin
    assert histograms[0].histogram_value.num == 3
    assert scalar_series(events, "nndx/nonfinite_count/weights/w") == {0: 1.0, 1: 1.0}


def test_export_report_to_tensorboard_from_a_log_dir(tmp_path):
    report = measured_report(3)
    sink = TensorBoardSink(tmp_path / "tb")
    assert export_report(sink, report) == 3
    sink.close()

    events = read_events(tmp_path / "tb")
    assert scalar_series(events, "nndx/dead_unit_fraction/1") == {s: pytest.approx(DEAD_UNITS / HIDDEN) for s in range(3)}
    assert scalar_series(events, "nndx/loss/train") == {p.step: pytest.approx(p.value) for p in report.loss_history["train"]}
    assert scalar_series(events, "nndx/grad_norm") == {0: 10.0, 1: 11.0, 2: 12.0}


def test_sinks_reject_objects_that_are_not_writers_or_runs():
    with pytest.raises(TypeError, match="SummaryWriter"):
        TensorBoardSink(object())
    with pytest.raises(TypeError, match="wandb.init"):
        WandbSink(object())


# --------------------------------------------------------------------------- W&B


@pytest.mark.slow
def test_wandb_offline_run_holds_the_series(offline_wandb):
    import wandb

    run = wandb.init(project="nndx-test", name="export", dir=str(offline_wandb), mode="offline")
    try:
        sink = WandbSink(run)
        sink.log_step(5, {"loss/train": float("nan")}, {"weights/w": [0.0, 1.0, 2.0, float("inf")]})
        export_report(sink, measured_report(2))
    finally:
        run.finish()

    rows = wandb_files.history(wandb_files.run_file(offline_wandb))
    assert [row["nndx/step"] for row in rows] == [5, 0, 1]
    assert math.isnan(rows[0]["nndx/loss/train"])
    assert rows[0]["nndx/weights/w/_type"] == "histogram" and sum(rows[0]["nndx/weights/w/values"]) == 3
    assert rows[0]["nndx/nonfinite_count/weights/w"] == 1
    assert rows[1]["nndx/dead_unit_fraction/1"] == pytest.approx(DEAD_UNITS / HIDDEN)
    assert rows[2]["nndx/grad_norm"] == 11.0


# --------------------------------------------------------------------------- the Monitor's side


def test_make_sinks_builds_one_sink_per_destination(tmp_path):
    assert make_sinks() == []
    own = RecordingSink()
    sinks = make_sinks(tensorboard=SummaryWriter(log_dir=str(tmp_path)), wandb=own)
    assert isinstance(sinks[0], TensorBoardSink) and sinks[1] is own
    sinks[0].writer.close()


def test_exporter_histograms_only_every_n_steps():
    from .conftest import tiny_model

    sink = RecordingSink()
    exporter = Exporter([sink], histogram_every=2)
    model = tiny_model()
    for step in range(4):
        exporter.log_stats(step, grad_norm=1.0, lrs=[0.1], model=model)
    exporter.log_loss(3, "val", 0.5, accuracy=0.9)
    exporter.close()

    assert [step for step, _, hists in exporter_calls(sink) if hists] == [0, 2]
    assert set(sink.calls[0][2]) == {f"weights/{n}" for n, _ in model.named_parameters()}  # no grads yet
    assert sink.calls[0][1] == {"grad_norm": 1.0, "lr/group0": 0.1}
    assert sink.calls[-1][1] == {"loss/val": 0.5, "accuracy/val": 0.9}
    assert sink.closed


def exporter_calls(sink: RecordingSink) -> list[tuple[int, dict, dict | None]]:
    return [call for call in sink.calls if "grad_norm" in call[1]]


def test_exporter_records_a_broken_sink_once_and_keeps_the_others():
    good, broken = RecordingSink(), BrokenSink()
    exporter = Exporter([broken, good])
    for step in range(3):
        exporter.log_loss(step, "train", 1.0)

    assert [e.model_dump() for e in exporter.errors] == [
        {"source": "export:BrokenSink", "type": "OSError", "message": "disk full"}
    ]
    assert [step for step, _, _ in good.calls] == [0, 1, 2]
    assert exporter.sinks == [good]


def test_exporter_rejects_a_negative_histogram_interval():
    with pytest.raises(ValueError, match="histogram_every"):
        Exporter([], histogram_every=-1)
    assert not Exporter([])


def test_export_report_of_an_empty_report_writes_nothing():
    sink = RecordingSink()
    assert export_report(sink, DiagnosticReport()) == 0
    assert sink.calls == []

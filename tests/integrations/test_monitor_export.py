"""Live export from the Monitor: ``Monitor(..., tensorboard=writer)`` and
``Monitor(..., wandb=run)`` write each recorded step as it happens (through
:func:`nndx.integrations.make_sinks` and :class:`nndx.integrations.Exporter`)."""

from __future__ import annotations

import math

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from nndx.integrations.monitor import Monitor

from . import wandb_files
from .conftest import DEAD_UNITS, HIDDEN, tiny_model

STEPS, EVERY = 6, 2


def train(**monitor_options) -> tuple[list[float], Monitor]:
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    losses = []
    with Monitor(model, optimizer, every=EVERY, **monitor_options) as monitor:
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            monitor.log(loss)
            losses.append(loss.item())
    return losses, monitor


def test_monitor_writes_live_series_to_tensorboard(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    losses, monitor = train(tensorboard=writer)
    writer.close()

    events = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    loss = {e.step: e.value for e in events.Scalars("nndx/loss/train")}
    assert loss == {step: pytest.approx(value) for step, value in enumerate(losses)}
    dead = {e.step: e.value for e in events.Scalars("nndx/dead_unit_fraction/1")}
    assert set(dead) == set(range(0, STEPS, EVERY)) and all(v == DEAD_UNITS / HIDDEN for v in dead.values())
    assert all(e.value > 0 for e in events.Scalars("nndx/grad_norm"))
    assert events.Tags()["histograms"], "histograms every N steps"
    assert monitor.report().errors == []


def test_monitor_logs_live_series_to_an_offline_wandb_run(offline_wandb):
    import wandb

    run = wandb.init(project="nndx-test", name="monitor", dir=str(offline_wandb), mode="offline")
    try:
        losses, _ = train(wandb=run)
    finally:
        run.finish()
    rows = wandb_files.history(wandb_files.run_file(offline_wandb))
    logged = {row["nndx/step"]: row["nndx/loss/train"] for row in rows if "nndx/loss/train" in row}
    assert logged == {step: pytest.approx(value) for step, value in enumerate(losses)}
    assert any(math.isclose(row.get("nndx/dead_unit_fraction/1", -1), DEAD_UNITS / HIDDEN) for row in rows)


def test_a_failing_exporter_is_recorded_and_training_goes_on(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.close()

    class ClosedWriter:  # what a writer on a full disk does: raise on every write
        def add_scalar(self, *args, **kwargs):
            raise OSError("No space left on device")

        def add_histogram(self, *args, **kwargs):
            raise OSError("No space left on device")

        def flush(self):
            pass

    losses, monitor = train(tensorboard=ClosedWriter())
    assert len(losses) == STEPS and monitor.report().loop.steps == STEPS
    errors = [e for e in monitor.report().errors if e.source.startswith("export:")]
    assert [(e.type, e.message) for e in errors] == [("OSError", "No space left on device")]

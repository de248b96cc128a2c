"""Shared fixtures: a tiny model with planted dead units, measured for real, and an
isolated offline W&B environment."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from nndx.collector.stats import LayerRecorder, parameter_stats, snapshot_parameters
from nndx.report import DiagnosticReport, GradNormPoint, LayerStats, LoopStats, LossPoint, ParameterStats

DEAD_UNITS = 2
HIDDEN = 8


def tiny_model() -> nn.Sequential:
    """Linear(4, 8) → ReLU → Linear(8, 3), with DEAD_UNITS hidden units whose bias is so
    negative that they are zero for every input, and the others biased to stay alive:
    a dead-unit fraction of exactly 2/8."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 3))
    with torch.no_grad():
        model[0].bias[:DEAD_UNITS] = -100.0
        model[0].bias[DEAD_UNITS:] = 5.0
    return model


def measured_steps(steps: int = 3) -> list[tuple[int, float, list[LayerStats], list[ParameterStats]]]:
    """Train the tiny model for a few steps, measuring each with the collector's own
    LayerRecorder and parameter_stats: (step, loss, layer stats, parameter stats)."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    rows = []
    with LayerRecorder(model) as recorder:
        for step in range(steps):
            recorder.start_step(step)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            before = snapshot_parameters(model)
            optimizer.step()
            rows.append((step, loss.item(), recorder.finish_step(), parameter_stats(model, before, step)))
    return rows


def measured_report(steps: int = 3) -> DiagnosticReport:
    rows = measured_steps(steps)
    return DiagnosticReport(
        loss_history={"train": [LossPoint(step=s, value=loss) for s, loss, _, _ in rows]},
        layers=[layer for _, _, layers, _ in rows for layer in layers],
        parameters=[p for _, _, _, params in rows for p in params],
        loop=LoopStats(steps=steps, grad_norm_history=[GradNormPoint(step=s, before_clip=10.0 + s) for s, *_ in rows]),
    )


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """W&B in offline mode with every directory it writes inside tmp_path: no network,
    no login, nothing left in the home directory. Returns the run directory root."""
    root = tmp_path / "wandb-root"
    for var, sub in (("WANDB_DIR", "runs"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        (root / sub).mkdir(parents=True)
        monkeypatch.setenv(var, str(root / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    return root / "runs"

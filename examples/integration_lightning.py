"""A learning rate far too high, caught in a PyTorch Lightning fit by ``NndxCallback``.

A LightningModule (an MLP on scikit-learn's digits, offline) is fitted twice on CPU
with ``NndxCallback(preflight=True)``:

- ``healthy``: SGD at lr 0.05;
- ``lr-too-high``: the same module with SGD at lr 8 — updates overshoot, the loss
  blows up to NaN within the first epoch, and nothing crashes.

Before the first step the callback runs the preflight probes on the first batch (on
copies: the fit is not changed): overfit one batch, LR range test (its suggested LR is
printed), gradient check. During the fit it watches the module and the optimizer
Lightning built; at the end it saves ``nndx-report.json`` and ``nndx-diagnosis.json``
into the run's log directory. The script prints each run's findings and exits 1 if the
broken run is not diagnosed LR_TOO_HIGH or the healthy one raises a warning.

Run: ``.venv/bin/python examples/integration_lightning.py`` (needs
``pip install 'nndx[lightning]'``).
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nndx.integrations.lightning import NndxCallback
from nndx.report import SEVERITY_ORDER, Diagnosis, DiagnosticReport


class DigitsMLP(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", self.loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loaders() -> tuple[DataLoader, DataLoader]:
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32)
    x = (x - x.mean(dim=0)) / x.std(dim=0).clamp_min(1e-6)
    y = torch.tensor(bunch.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = order[:1400], order[1400:]
    return (DataLoader(TensorDataset(x[train], y[train]), batch_size=64, shuffle=True),
            DataLoader(TensorDataset(x[val], y[val]), batch_size=256))  # fmt: skip


def fit(lr: float, root: Path) -> tuple[DiagnosticReport, Diagnosis]:
    torch.manual_seed(0)
    callback = NndxCallback(every=5, preflight=True, loss_fn=nn.CrossEntropyLoss())
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
                         callbacks=[callback], log_every_n_steps=5)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's dataloader-worker advice
        trainer.fit(DigitsMLP(lr), *loaders())
    report = DiagnosticReport.model_validate_json((root / "nndx-report.json").read_text())
    diagnosis = Diagnosis.model_validate_json((root / "nndx-diagnosis.json").read_text())
    return report, diagnosis


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="nndx-lightning-"))
    failures = 0
    for name, lr, expected in (("healthy", 0.05, None), ("lr-too-high", 8.0, "LR_TOO_HIGH")):
        report, diagnosis = fit(lr, root / name)
        alarms = [f for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]]
        codes = [f.code.value for f in alarms]
        ok = expected in codes if expected else not alarms
        failures += not ok
        train = report.loss_history["train"]
        suggested = report.probes.lr_range.suggested_lr if report.probes and report.probes.lr_range else None
        print(f"{name:12s} lr {lr:<5g} LR finder suggests {suggested or float('nan'):.3g}; "
              f"train loss {train[0].value:.3f} -> {train[-1].value:.3f} over {len(train)} steps; "
              f"findings: {', '.join(codes) or 'none'} {'ok' if ok else 'UNEXPECTED'}")  # fmt: skip
        for finding in alarms[:2]:
            print(f"    {finding.severity}: {finding.title} — fix: {finding.fix}")
    print(f"\nreports and diagnoses in {root}/<run>/nndx-*.json")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

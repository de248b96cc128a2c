"""The same scripts written for PyTorch Lightning: a LightningModule around the family's
model and loss, ``configure_optimizers`` from the spec, and the Trainer's own knobs for
what Lightning does itself (gradient clipping, accumulation, bf16 autocast)."""

from __future__ import annotations

import logging
import math
import tempfile
import warnings
from typing import Any

import torch

from .training import Built, Outcome, make_optimizer, make_scheduler, reference

_SILENCED = False


def quiet() -> None:
    """Lightning's banners and tips say nothing about the case."""
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True
    import pytorch_lightning  # noqa: F401 - it sets its loggers' levels on import: set ours after

    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(pytorch_)?lightning.*")
    warnings.filterwarnings("ignore", message=r".*(num_workers|does not have many workers|LightningModule).*")


def module_for(b: Built) -> Any:
    import pytorch_lightning as pl

    class CaseModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = b.model
            self.loss_fn = b.loss_fn
            self.losses: list[float] = []

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.losses.append(float(loss.detach()))
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            out = self.model(x)
            self.log("val_loss", self.loss_fn(out, y))

        def configure_optimizers(self):
            optimizer = make_optimizer(b.spec, b.family, self.parameters())
            scheduler = make_scheduler(b.spec, b, optimizer)
            if scheduler is None:
                return optimizer
            interval = "epoch" if b.spec.schedule == "step_per_epoch" else "step"  # "step" is the bug for step_per_batch
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    return CaseModule()


def loaders(b: Built) -> tuple[Any, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    spec = b.spec
    corrupt = torch.Generator().manual_seed(1000 * spec.seed + 3)

    def collate(items):
        x = torch.stack([i[0] for i in items])
        y = torch.stack([i[1] for i in items])
        if spec.zeroed_batch_fraction and torch.rand((), generator=corrupt) < spec.zeroed_batch_fraction:
            x = torch.zeros_like(x)
        return x, y

    train = DataLoader(TensorDataset(b.data.x, b.data.y), batch_size=min(b.batch_size, len(b.data.x)),
                       shuffle=spec.shuffle, drop_last=True, collate_fn=collate,
                       generator=torch.Generator().manual_seed(1000 * spec.seed + 1))  # fmt: skip
    val = DataLoader(TensorDataset(b.data.x_val, b.data.y_val), batch_size=len(b.data.x_val))
    return train, val


def fit(b: Built, callbacks: list[Any], measure_start: bool = False) -> Outcome:
    """Train with a Lightning Trainer; returns the harness's measurement of the run."""
    import pytorch_lightning as pl

    quiet()
    spec = b.spec
    initial = _reference(b)[1] if measure_start else None
    module = module_for(b)
    train, val = loaders(b)
    precision = "bf16-mixed" if spec.amp else ("64-true" if spec.dtype == "float64" else "32-true")
    with tempfile.TemporaryDirectory() as directory:
        trainer = pl.Trainer(
            max_steps=b.steps // spec.accumulate, accelerator="cpu", devices=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, check_val_every_n_epoch=1, default_root_dir=directory,
            gradient_clip_val=spec.clip, accumulate_grad_batches=spec.accumulate, precision=precision,
            callbacks=callbacks,
        )  # fmt: skip
        outcome = Outcome(initial_ref_loss=initial)
        try:
            trainer.fit(module, train, val)
        except Exception as exc:  # noqa: BLE001 - the user's training raising is part of the case
            outcome.crashed = f"{type(exc).__name__}: {str(exc)[:300]}"
    outcome.train_losses = module.losses
    outcome.nonfinite = any(not math.isfinite(v) for v in module.losses)
    outcome.quality, outcome.ref_loss = _reference(b)
    outcome.nonfinite = (outcome.nonfinite or not math.isfinite(outcome.ref_loss)
                         or not all(bool(torch.isfinite(p).all()) for p in b.model.parameters()))  # fmt: skip
    return outcome


def _reference(b: Built) -> tuple[float | None, float]:
    """Lightning validates in eval mode itself; the harness measures the same way."""
    training = b.model.training
    b.model.eval()
    try:
        with torch.no_grad():
            return reference(b.family, b.model(b.data.x_val), b.data.y_val_true)
    finally:
        b.model.train(training)

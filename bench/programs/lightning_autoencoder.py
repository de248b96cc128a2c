"""Port of Lightning's basic autoencoder example: a LightningModule fitted by a ``Trainer``.

Source: github.com/Lightning-AI/pytorch-lightning, ``examples/pytorch/basics/autoencoder.py``
at commit 7f0c3436cd3f6ad3753125672024fc415cbcb414 (the repository's HEAD; Apache-2.0,
Copyright The Lightning AI team). Written anew from the facts of that file; no code copied.

Kept: ``LitAutoEncoder(hidden_dim=64, learning_rate=10e-3)`` with ``save_hyperparameters``;
``encoder`` = Linear(pixels, hidden) -> ReLU -> Linear(hidden, 3), ``decoder`` =
Linear(3, hidden) -> ReLU -> Linear(hidden, pixels); ``forward`` decodes the encoding;
``training_step`` / ``validation_step`` / ``test_step`` share ``_common_step``: the batch
``(x, _)`` flattened by ``_prepare_batch``, ``loss = F.mse_loss(x, self(x))`` logged as
``f"{stage}_loss"`` with ``on_step=True`` (training_step returns it); ``configure_optimizers``
returns ``Adam(self.parameters(), lr=self.hparams.learning_rate)``. ``MyDataModule``: the
train set (``ToTensor``: pixels in [0, 1]) split by ``random_split`` with
``torch.Generator().manual_seed(42)`` into train / val, a separate test set, unshuffled
``DataLoader``s of ``batch_size=32``. The CLI's flow: ``seed_everything(1234)``,
``trainer.fit(model, datamodule=dm)``, then ``trainer.test(ckpt_path="best", ...)``.
Shrunk: scikit-learn's 8x8 digits (0..255 uint8 like MNIST's raw files; 1,437 train split
1,237 / 200 instead of 55,000 / 5,000; 360 test) instead of MNIST 28x28, so pixels = 64
instead of 784; ``max_epochs=4`` instead of 10 (the CLI default); no ``LightningCLI`` (its
arguments are fixed here) and no ``ImageSampler`` callback (it only saves image grids, needs
torchvision); ``logger=False`` and no checkpoint files: with the default ``ModelCheckpoint``
(no ``monitor``) "best" is the last epoch, so the test runs on the fitted model itself.
Measure only (not in the program): the test reconstruction MSE in [0, 1] pixel units.

nndx, as the author would add it: Lightning's ``NndxCallback(every=5, preflight=True)`` in
the Trainer's callbacks (no ``loss_fn``: the batch ``(x, label)`` is not ``(input, target)``,
so the probes use the module's own ``training_step``), ``val_loss_key="val_loss_epoch"``
(what ``self.log("val_loss", on_step=True)`` puts in ``callback_metrics``); its report
(``callback.report``) diagnosed after the fit. Before the fit, ``nndx.probe`` on the first
training batch as (flattened images, flattened images) with the example's loss.
"""

from __future__ import annotations

import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lightning_autoencoder"
SOURCE = Source("Lightning-AI/pytorch-lightning", "examples/pytorch/basics/autoencoder.py",
                "7f0c3436cd3f6ad3753125672024fc415cbcb414", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "raw_pixels",
            "the datasets built from the raw uint8 images (``dataset.data``) without ``ToTensor``: pixels 0..255 "
            "are fed to the encoder and are the reconstruction target",
            (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
            ("https://github.com/keras-team/keras/issues/3642",
             "https://github.com/www0wwwjs1/Matrix-Capsules-EM-Tensorflow/issues/51",
             "https://github.com/pytorch/pytorch/issues/36647"),
            Measure("test_mse01", "test reconstruction MSE in [0, 1] pixel units at least 1.08x the healthy run's "
                    "(0.047/0.046/0.044 against 0.041/0.040/0.039 on seeds 0-2 in a plain run: Adam adapts to the "
                    "scale, the fit is 13-15% worse, not broken)",
                    lambda healthy, buggy: not buggy < 1.08 * healthy),
        ),
        Variant(
            "optimizer_encoder_only",
            "configure_optimizers returns Adam(self.encoder.parameters(), ...): the decoder keeps its random "
            "initial weights for the whole fit",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/zdebruine/MMVAE/issues/39",
             "https://github.com/cabralpinto/modular-diffusion/issues/17",
             "https://github.com/wiseodd/controlled-text-generation/issues/15"),
            Measure("test_mse01", "test reconstruction MSE in [0, 1] pixel units at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

PIXELS, HIDDEN_DIM, LEARNING_RATE, BATCH_SIZE, MAX_EPOCHS = 64, 64, 10e-3, 32, 4
N_VAL = 200


def _lightning_module_class() -> type:
    import pytorch_lightning as pl

    class LitAutoEncoder(pl.LightningModule):
        def __init__(self, hidden_dim: int = 64, learning_rate: float = 10e-3, variant: str = "healthy") -> None:
            super().__init__()
            self.save_hyperparameters()
            self.encoder = nn.Sequential(nn.Linear(PIXELS, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 3))
            self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, PIXELS))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.decoder(self.encoder(x))

        def training_step(self, batch, batch_idx):
            return self._common_step(batch, batch_idx, "train")

        def validation_step(self, batch, batch_idx):
            self._common_step(batch, batch_idx, "val")

        def test_step(self, batch, batch_idx):
            self._common_step(batch, batch_idx, "test")

        def configure_optimizers(self):
            if self.hparams.variant == "optimizer_encoder_only":
                return torch.optim.Adam(self.encoder.parameters(), lr=self.hparams.learning_rate)
            return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

        def _prepare_batch(self, batch):
            x, _ = batch
            return x.view(x.size(0), -1)

        def _common_step(self, batch, batch_idx, stage: str):
            x = self._prepare_batch(batch)
            loss = F.mse_loss(x, self(x))
            self.log(f"{stage}_loss", loss, on_step=True)
            return loss

    return LitAutoEncoder


def _datamodule_class() -> type:
    import pytorch_lightning as pl

    class MyDataModule(pl.LightningDataModule):
        def __init__(self, train_x, train_y, test_x, test_y, batch_size: int = 32) -> None:
            super().__init__()
            dataset = TensorDataset(train_x, train_y)
            self.mnist_test = TensorDataset(test_x, test_y)
            self.mnist_train, self.mnist_val = random_split(
                dataset, [len(dataset) - N_VAL, N_VAL], generator=torch.Generator().manual_seed(42))  # fmt: skip
            self.batch_size = batch_size

        def train_dataloader(self):
            return DataLoader(self.mnist_train, batch_size=self.batch_size)

        def val_dataloader(self):
            return DataLoader(self.mnist_val, batch_size=self.batch_size)

        def test_dataloader(self):
            return DataLoader(self.mnist_test, batch_size=self.batch_size)

    return MyDataModule


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    import pytorch_lightning as pl

    pl.seed_everything(1234 + seed, verbose=False)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    if variant == "raw_pixels":  # the uint8 images taken directly: 0..255, no ToTensor
        train_x, test_x = train_raw.unsqueeze(1).float(), test_raw.unsqueeze(1).float()
        scale = 255.0
    else:
        train_x, test_x = data.to_tensor(train_raw), data.to_tensor(test_raw)
        scale = 1.0
    dm = _datamodule_class()(train_x, train_labels, test_x, test_labels, batch_size=BATCH_SIZE)
    model = _lightning_module_class()(hidden_dim=HIDDEN_DIM, learning_rate=LEARNING_RATE, variant=variant)

    callbacks = []
    callback = None
    if nx.enabled:
        from nndx.integrations.lightning import NndxCallback

        first = next(iter(dm.train_dataloader()))[0]
        flat = first.view(first.size(0), -1)
        nx.preflight(model, (flat, flat), lambda output, target: F.mse_loss(target, output),
                     optimizer=model.configure_optimizers())  # fmt: skip
        callback = NndxCallback(every=5, preflight=True, val_loss_key="val_loss_epoch")
        callbacks.append(callback)

    root = tempfile.mkdtemp(prefix="nndx-lightning-ae-")
    trainer = pl.Trainer(max_epochs=MAX_EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                         callbacks=callbacks, log_every_n_steps=10, num_sanity_val_steps=2)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's dataloader-worker advice
        trainer.fit(model, datamodule=dm)
        fitted = {k: float(v) for k, v in trainer.callback_metrics.items()}
        tested = trainer.test(model, datamodule=dm, verbose=False)

    if callback is not None:
        import nndx

        started = time.perf_counter()
        try:
            report = callback.report
            nx.final_diagnoses.append(nndx.diagnose(report))
            nx._note_report_errors("final", report.errors)
        except Exception as exc:  # noqa: BLE001 - recorded like the harness records its own calls
            nx.errors.append(f"final diagnose raised {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        finally:
            nx.seconds += time.perf_counter() - started

    test_loss = float(tested[0]["test_loss_epoch"])
    return {
        "test_loss": test_loss,
        "test_mse01": test_loss / scale**2,
        "val_loss": fitted.get("val_loss_epoch", float("nan")),
        "train_loss": fitted.get("train_loss", float("nan")),
    }

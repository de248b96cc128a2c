"""Port of phlippe/uvadlc_notebooks' Tutorial 9 (deep autoencoders on CIFAR-10): a convolutional
``Encoder`` (stride-2 convs, GELU, a linear map to the latent) and ``Decoder`` (a linear map back,
``ConvTranspose2d`` upsampling, a ``Tanh`` output) trained on the summed-over-pixels MSE, with Adam
and ``ReduceLROnPlateau`` on the validation loss.

Source: github.com/phlippe/uvadlc_notebooks, ``docs/tutorial_notebooks/tutorial9/AE_CIFAR10.ipynb``
at commit 0da8037c7abc32f478ff6142acceb72dbcf088ee (MIT, Copyright (c) 2020 Phillip Lippe).
Written anew from the facts of that notebook; no code copied.

Kept: the transform ``ToTensor`` + ``Normalize((0.5,), (0.5,))`` (pixels to [-1, 1]); a
``random_split`` of the training set into train and val (seeded); loaders of batch 256, the
train loader shuffled with ``drop_last=True``, val and test not; ``Encoder`` (``Conv2d(c, c_hid,
3, padding=1, stride=2)``, GELU, ``Conv2d(c_hid, c_hid, 3, padding=1)``, GELU, ``Conv2d(c_hid,
2c_hid, 3, padding=1, stride=2)``, GELU, ``Conv2d(2c_hid, 2c_hid, 3, padding=1)``, GELU,
``Conv2d(2c_hid, 2c_hid, 3, padding=1, stride=2)``, GELU, ``Flatten``, ``Linear(2*16*c_hid,
latent_dim)``); ``Decoder`` (``Linear(latent_dim, 2*16*c_hid)``, GELU, reshape to
``(B, -1, 4, 4)``, ``ConvTranspose2d(2c_hid, 2c_hid, 3, output_padding=1, padding=1,
stride=2)``, GELU, ``Conv2d(2c_hid, 2c_hid, 3, padding=1)``, GELU, ``ConvTranspose2d(2c_hid,
c_hid, ...)``, GELU, ``Conv2d(c_hid, c_hid, 3, padding=1)``, GELU, ``ConvTranspose2d(c_hid, c,
...)``, ``Tanh``); ``Autoencoder.forward`` = decoder(encoder(x)); ``_get_reconstruction_loss``:
``F.mse_loss(x, x_hat, reduction="none").sum(dim=[1, 2, 3]).mean(dim=[0])``;
``configure_optimizers``: ``Adam(lr=1e-3)`` and ``ReduceLROnPlateau(mode="min", factor=0.2,
patience=20, min_lr=5e-5)`` monitoring ``val_loss``. Lightning replaced by the steps it runs: per
epoch, each training batch ``zero_grad``, the loss, ``backward``, ``step``; then the val loss
(eval mode, no grad, the batch-size-weighted mean of the val batches' losses, as Lightning's
``self.log`` averages it); then ``scheduler.step(val_loss)`` (Lightning's default interval for a
scheduler with ``monitor``: once per epoch); after fit, the test loss of the final weights
(``ModelCheckpoint(save_weights_only=True)`` keeps the last epoch) on val and test.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 16x16, one channel (1,437 train,
split 1,293 / 144 into train and val, 360 test) instead of CIFAR-10's 3x32x32 (45,000 / 5,000 /
10,000), so the three stride-2 convs end on a 2x2 map instead of 4x4 (the encoder's last
``Linear`` takes ``2*4*c_hid``, the decoder's first gives it and reshapes to ``(B, -1, 2, 2)``);
``base_channel_size`` 8 instead of 32, one ``latent_dim`` 32 instead of the sweep over 64..384;
100 epochs instead of 500 (5 steps an epoch); no ``GenerateCallback``,
``LearningRateMonitor``, TensorBoard, pretrained checkpoints or plots; CPU.
Measure only (not in the program): the number of times the learning rate was cut, besides the
notebook's test loss.

nndx, as the author would add it: the model computes no loss; the batch nndx gets is the first
training batch as ``(x, x)`` (an autoencoder's target is its input) and ``loss_fn(x_hat, x)`` is
the notebook's reconstruction loss; a preflight ``nndx.probe`` with the optimizer;
``nndx.Monitor(model, optimizer)`` around the loop, each batch's loss logged where
``training_step`` calls ``self.log('train_loss', loss)`` and each epoch's val loss logged as
``split="val"`` where ``validation_step`` logs ``val_loss``; after fit ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "uvadlc_autoencoder"
SOURCE = Source("phlippe/uvadlc_notebooks", "docs/tutorial_notebooks/tutorial9/AE_CIFAR10.ipynb",
                "0da8037c7abc32f478ff6142acceb72dbcf088ee", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 16x16 digits, 1 channel, c_hid 8, latent 32, 100 epochs)"),
        Variant(
            "sigmoid_output",
            "the decoder ends in nn.Sigmoid instead of nn.Tanh while the images are still normalised to [-1, 1]: "
            "the reconstruction cannot go below 0, so every background pixel (-1) keeps an error of at least 1",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/mikesj-public/convolutional_autoencoder/pull/9",
             "https://github.com/AntixK/PyTorch-VAE/issues/48",
             "https://github.com/fchollet/deep-learning-with-python-notebooks/issues/7"),
            Measure("test_loss", "test reconstruction loss at least 2x the healthy run's: 142.7 against 25.6 healthy on seed 0",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "plateau_stepped_per_batch",
            "the plain loop that replaces Lightning calls scheduler.step(loss) after every batch on the batch "
            "loss instead of once per epoch on val_loss: patience=20 counts batches, so the learning rate is "
            "cut by 5x whenever 20 noisy batch losses bring no new minimum and sinks to min_lr",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/Lightning-AI/pytorch-lightning/issues/673",
             "https://github.com/pytorch/pytorch/issues/2850",
             "https://github.com/abhishekkrthakur/wtfml/issues/7"),
            Measure("test_loss", "test reconstruction loss at least 15% above the healthy run's: 36.2 against 25.6 healthy on seed 0 "
                    "(the lr cut twice, to 1e-4; never cut in the healthy run)",
                    lambda healthy, buggy: not buggy < 1.15 * healthy),
        ),
    )
}

SIDE, CHANNELS, BASE_CHANNELS, LATENT_DIM = 16, 1, 8, 32
GRID = SIDE // 8  # the encoder's last feature map: 4x4 for CIFAR's 32x32, 2x2 here
BATCH_SIZE, EPOCHS, LR, VAL_SIZE = 256, 100, 1e-3, 144


class Encoder(nn.Module):
    def __init__(self, num_input_channels: int, base_channel_size: int, latent_dim: int, act_fn=nn.GELU) -> None:
        super().__init__()
        c_hid = base_channel_size
        self.net = nn.Sequential(
            nn.Conv2d(num_input_channels, c_hid, kernel_size=3, padding=1, stride=2),  # 16x16 => 8x8 (CIFAR: 32 => 16)
            act_fn(),
            nn.Conv2d(c_hid, c_hid, kernel_size=3, padding=1),
            act_fn(),
            nn.Conv2d(c_hid, 2 * c_hid, kernel_size=3, padding=1, stride=2),  # 8x8 => 4x4
            act_fn(),
            nn.Conv2d(2 * c_hid, 2 * c_hid, kernel_size=3, padding=1),
            act_fn(),
            nn.Conv2d(2 * c_hid, 2 * c_hid, kernel_size=3, padding=1, stride=2),  # 4x4 => 2x2
            act_fn(),
            nn.Flatten(),
            nn.Linear(2 * GRID * GRID * c_hid, latent_dim),
        )

    def forward(self, x):
        return self.net(x)


class Decoder(nn.Module):
    def __init__(self, num_input_channels: int, base_channel_size: int, latent_dim: int, act_fn=nn.GELU,
                 output_act=nn.Tanh) -> None:  # fmt: skip
        super().__init__()
        c_hid = base_channel_size
        self.linear = nn.Sequential(nn.Linear(latent_dim, 2 * GRID * GRID * c_hid), act_fn())
        self.net = nn.Sequential(
            nn.ConvTranspose2d(2 * c_hid, 2 * c_hid, kernel_size=3, output_padding=1, padding=1, stride=2),  # 2 => 4
            act_fn(),
            nn.Conv2d(2 * c_hid, 2 * c_hid, kernel_size=3, padding=1),
            act_fn(),
            nn.ConvTranspose2d(2 * c_hid, c_hid, kernel_size=3, output_padding=1, padding=1, stride=2),  # 4 => 8
            act_fn(),
            nn.Conv2d(c_hid, c_hid, kernel_size=3, padding=1),
            act_fn(),
            nn.ConvTranspose2d(c_hid, num_input_channels, kernel_size=3, output_padding=1, padding=1,
                               stride=2),  # 8 => 16  # fmt: skip
            output_act(),  # the notebook: Tanh, as the inputs are scaled to [-1, 1]
        )

    def forward(self, x):
        x = self.linear(x)
        x = x.reshape(x.shape[0], -1, GRID, GRID)
        x = self.net(x)
        return x


class Autoencoder(nn.Module):
    def __init__(self, base_channel_size: int, latent_dim: int, num_input_channels: int = 3,
                 output_act=nn.Tanh) -> None:  # fmt: skip
        super().__init__()
        self.encoder = Encoder(num_input_channels, base_channel_size, latent_dim)
        self.decoder = Decoder(num_input_channels, base_channel_size, latent_dim, output_act=output_act)

    def forward(self, x):
        z = self.encoder(x)
        x_hat = self.decoder(z)
        return x_hat


def reconstruction_loss(x_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``_get_reconstruction_loss`` after the forward: MSE summed over pixels, mean over the batch."""
    loss = F.mse_loss(x, x_hat, reduction="none")
    loss = loss.sum(dim=[1, 2, 3]).mean(dim=[0])
    return loss


def evaluate(model: nn.Module, images: torch.Tensor) -> float:
    """Lightning's val/test epoch: per-batch losses averaged weighted by batch size."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(images), BATCH_SIZE):
            x = images[s : s + BATCH_SIZE]
            total += reconstruction_loss(model(x), x).item() * len(x)
    model.train()
    return total / len(images)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(42 + seed)  # pl.seed_everything(42)
    train_raw, _, test_raw, _ = digits.digit_images(seed=seed)
    # transforms.ToTensor() + transforms.Normalize((0.5,), (0.5,))
    train_images = (digits.upscaled(train_raw, SIDE) - 0.5) / 0.5
    test_images = (digits.upscaled(test_raw, SIDE) - 0.5) / 0.5
    split = torch.randperm(len(train_images), generator=torch.Generator().manual_seed(42 + seed))
    val_set, train_set = train_images[split[:VAL_SIZE]], train_images[split[VAL_SIZE:]]

    model = Autoencoder(BASE_CHANNELS, LATENT_DIM, CHANNELS,
                        output_act=nn.Sigmoid if variant == "sigmoid_output" else nn.Tanh)  # fmt: skip
    optimizer = optim.Adam(model.parameters(), lr=LR)
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.2, patience=20, min_lr=5e-5)

    loader_gen = torch.Generator().manual_seed(seed)
    n_batches = len(train_set) // BATCH_SIZE  # drop_last=True
    first = train_set[torch.randperm(len(train_set), generator=torch.Generator().manual_seed(seed))[:BATCH_SIZE]]
    first_batch = (first, first)
    nx.preflight(model, first_batch, reconstruction_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    lr_cuts, last_lr = 0, LR
    train_losses: list[float] = []
    model.train()
    for _epoch in range(EPOCHS):
        perm = torch.randperm(len(train_set), generator=loader_gen)
        for b in range(n_batches):
            x = train_set[perm[b * BATCH_SIZE : (b + 1) * BATCH_SIZE]]
            optimizer.zero_grad()
            loss = reconstruction_loss(model(x), x)  # training_step
            nx.timed(lambda: mon.log(loss))  # noqa: B023 - self.log('train_loss', loss)
            loss.backward()
            optimizer.step()
            train_losses.append(loss.item())
            if variant == "plateau_stepped_per_batch":
                scheduler.step(loss.item())
        val_loss = evaluate(model, val_set)  # validation_step: self.log('val_loss', loss)
        nx.timed(lambda: mon.log(val_loss, split="val"))  # noqa: B023
        if variant != "plateau_stepped_per_batch":
            scheduler.step(val_loss)  # monitor="val_loss", interval "epoch"
        lr = optimizer.param_groups[0]["lr"]
        if lr < last_lr:
            lr_cuts, last_lr = lr_cuts + 1, lr

    nx.finish(mon, model, first_batch, reconstruction_loss, optimizer=optimizer)

    return {"test_loss": evaluate(model, test_images), "val_loss": evaluate(model, val_set),
            "final_train_loss": sum(train_losses[-5:]) / 5, "final_lr": optimizer.param_groups[0]["lr"],
            "lr_cuts": float(lr_cuts)}  # fmt: skip

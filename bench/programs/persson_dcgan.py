"""Port of aladdinpersson/Machine-Learning-Collection's DCGAN: a convolutional generator and
discriminator (``model.py``) trained adversarially with ``BCELoss`` and two Adam optimizers
(``train.py``).

Source: github.com/aladdinpersson/Machine-Learning-Collection, ``ML/Pytorch/GANs/2. DCGAN/model.py``
at commit 95362d7a23de81bc4e7d200bbbcad02a5377f2ef and ``ML/Pytorch/GANs/2. DCGAN/train.py`` at
commit 609b7511c82c3421459df79e2324c8ee5a5dbfc5 (MIT, Copyright (c) 2020 Aladdin Persson). Written
anew from the facts of those files; no code copied.

Kept (the original's shapes at 64x64; see Shrunk): ``Discriminator(channels_img, features_d)``: ``Conv2d(channels_img, f, 4, 2, 1,
bias=False)``, ``LeakyReLU(0.2)``, three ``_block``s (``Conv2d(.., 4, 2, 1, bias=False)``,
``BatchNorm2d``, ``LeakyReLU(0.2, True)``) to ``8f`` channels at 4x4, ``Conv2d(8f, 1, 4, 2, 0)``,
``Sigmoid``; ``Generator(channels_noise, channels_img, features_g)``: four ``_block``s
(``ConvTranspose2d(.., bias=False)``, ``BatchNorm2d``, ``ReLU``) from ``N x 100 x 1 x 1`` to ``2g``
channels at 32x32, ``ConvTranspose2d(2g, channels_img, 4, 2, 1, bias=False)``, ``Tanh``, 64x64
out; ``initialize_weights`` (conv weights N(0, 0.02), BatchNorm weights N(1, 0.02) and bias 0)
applied to both; ``LEARNING_RATE = 2e-4``, ``BATCH_SIZE = 128``,
``CHANNELS_IMG = 1``, ``NOISE_DIM = 100``; images through ``Resize(64)``, ``ToTensor``,
``Normalize([0.5], [0.5])`` (so in [-1, 1]); a shuffling ``DataLoader``; ``opt_gen`` and
``opt_disc`` ``Adam(lr=2e-4, betas=(0.5, 0.999))``; ``criterion = nn.BCELoss()``;
``gen.train()``/``disc.train()``; per batch: ``noise = torch.randn(BATCH_SIZE, NOISE_DIM, 1, 1)``
(BATCH_SIZE even for the short last batch), ``fake = gen(noise)``; the discriminator on
``real`` and on ``fake.detach()``, ``reshape(-1)``, ``loss_disc = (BCE(real, ones) + BCE(fake,
zeros)) / 2``, ``disc.zero_grad()``, ``backward``, ``opt_disc.step()``; the generator:
``output = disc(fake).reshape(-1)``, ``loss_gen = BCE(output, ones)``, ``gen.zero_grad()``,
``backward``, ``opt_gen.step()``; losses printed every 100 batches (here: recorded).
Replaced: MNIST by scikit-learn's 8x8 digits (1,437 training images), upsampled (bilinear) to
32x32 in place of ``Resize(64)`` and scaled to [-1, 1] as ``Normalize([0.5], [0.5])`` does.
Shrunk: ``IMAGE_SIZE`` 32 instead of 64, so one ``_block`` less in each network (the discriminator
stops at ``4f`` channels, the generator starts at ``8g``); ``FEATURES_DISC`` and ``FEATURES_GEN`` 8
instead of 64; 12 epochs of 12 batches (144 steps per network) instead of 5 epochs of 469; CPU;
no TensorBoard image grids.
Measure only (not in the program): after training, 256 samples from a fixed noise (drawn from a
separate generator, so the program's random stream is untouched) with the generator in eval
mode, average-pooled back to 8x8 (not used by the measures: at this budget the healthy samples are
still blobs) and compared with the 360 held-out digits made the same way:
``nn_dist`` (mean distance from a sample to its nearest held-out digit, pixels in [0, 1]),
``mean_gap`` (distance between the mean sample and the mean digit) and ``digit_conf`` (the mean
top probability a logistic-regression digit classifier fitted on the training digits gives the
samples); the last discriminator outputs on real and fake (``d_real``, ``d_fake``).

nndx, as the author would add it: two networks, each with its own optimizer and loss, so each
gets its own preflight ``nndx.probe`` and ``nndx.Monitor``: the discriminator on ``(real,
ones)`` with ``BCELoss`` and ``opt_disc``; the generator on ``(noise, target)`` (the targets its
loss uses) with ``loss_fn(fake, target) = criterion(disc(fake).reshape(-1), target)`` and
``opt_gen``; both Monitors around the epochs, each network's loss logged every batch; after
training ``nndx.probe(..., monitor=mon)`` per network on the same batches, and the author reads
both diagnoses, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_dcgan"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/GANs/2. DCGAN/train.py",
                "609b7511c82c3421459df79e2324c8ee5a5dbfc5", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 32x32 digits, one block less, features 8, 144 steps)"),
        Variant(
            "generator_trained_on_fake_labels",
            "the generator's loss is criterion(output, torch.zeros_like(output)): the generator is trained to make "
            "the discriminator call its samples fake, i.e. to help the discriminator instead of fooling it",
            (C.WRONG_LOSS,),
            ("https://github.com/keras-team/keras-io/issues/361",
             "https://github.com/shaohua0116/DCGAN-Tensorflow/issues/5",
             "https://github.com/yunjey/pytorch-tutorial/issues/45"),
            Measure("d_fake", "the discriminator's mean output on the last batch of fakes below a tenth of the "
                    "healthy run's (the generator never fools it)", lambda healthy, buggy: not buggy > 0.1 * healthy),
        ),
        Variant(
            "no_disc_zero_grad",
            "disc.zero_grad() removed from the discriminator step: the discriminator's gradients accumulate over "
            "all steps, including the gradients loss_gen.backward() leaves in it every step",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/pytorch/tutorials/pull/1116"),
            Measure("d_gap", "the discriminator's mean output on the last real batch minus that on the last fakes "
                    "below half the healthy run's (it no longer tells real from fake)",
                    lambda healthy, buggy: not buggy > 0.5 * healthy),
        ),
    )
}

LEARNING_RATE = 2e-4
BATCH_SIZE = 128
IMAGE_SIZE = 32
CHANNELS_IMG = 1
NOISE_DIM = 100
NUM_EPOCHS = 12
FEATURES_DISC = 8
FEATURES_GEN = 8


# --------------------------------------------------------------------------- model.py


class Discriminator(nn.Module):
    def __init__(self, channels_img: int, features_d: int) -> None:
        super().__init__()
        self.disc = nn.Sequential(
            nn.Conv2d(channels_img, features_d, kernel_size=4, stride=2, padding=1, bias=False),
            nn.LeakyReLU(0.2),
            self._block(features_d, features_d * 2, 4, 2, 1),
            self._block(features_d * 2, features_d * 4, 4, 2, 1),
            nn.Conv2d(features_d * 4, 1, kernel_size=4, stride=2, padding=0),
            nn.Sigmoid(),
        )

    def _block(self, in_channels, out_channels, kernel_size, stride, padding):
        return nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.LeakyReLU(0.2, True),
        )

    def forward(self, x):
        return self.disc(x)


class Generator(nn.Module):
    def __init__(self, channels_noise: int, channels_img: int, features_g: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            self._block(channels_noise, features_g * 8, 4, 1, 0),
            self._block(features_g * 8, features_g * 4, 4, 2, 1),
            self._block(features_g * 4, features_g * 2, 4, 2, 1),
            nn.ConvTranspose2d(features_g * 2, channels_img, kernel_size=4, stride=2, padding=1, bias=False),
            nn.Tanh(),
        )

    def _block(self, in_channels, out_channels, kernel_size, stride, padding):
        return nn.Sequential(
            nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )

    def forward(self, x):
        return self.net(x)


def initialize_weights(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


# --------------------------------------------------------------------------- measure only


def _to8(images: torch.Tensor) -> np.ndarray:
    """[-1, 1] images (N, 1, 32, 32) -> (N, 64) pixels in [0, 1] at 8x8."""
    return F.adaptive_avg_pool2d((images + 1) / 2, 8).reshape(len(images), -1).clamp(0, 1).numpy()


def _quality(gen: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression

    g = torch.Generator().manual_seed(12345)
    noise = torch.randn(256, NOISE_DIM, 1, 1, generator=g)
    gen.eval()
    with torch.no_grad():
        fake8 = _to8(gen(noise))
    gen.train()
    real8 = _to8(x_test)
    d2 = ((fake8[:, None, :] - real8[None, :, :]) ** 2).sum(-1)
    clf = LogisticRegression(max_iter=2000).fit(_to8(x_train), y_train.numpy())
    return {"nn_dist": float(np.sqrt(d2.min(1)).mean()),
            "mean_gap": float(np.linalg.norm(fake8.mean(0) - real8.mean(0))),
            "digit_conf": float(clf.predict_proba(fake8).max(1).mean())}  # fmt: skip


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    fake_labels_for_gen = variant == "generator_trained_on_fake_labels"
    disc_zero_grad = variant != "no_disc_zero_grad"

    tr_raw, _tr_y, te_raw, _ = digits.digit_images(seed=seed)
    x_train = digits.upscaled(tr_raw, IMAGE_SIZE) * 2 - 1  # Resize + ToTensor + Normalize([0.5], [0.5])
    x_test = digits.upscaled(te_raw, IMAGE_SIZE) * 2 - 1
    dataset = TensorDataset(x_train, _tr_y)
    dataloader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)
    gen = Generator(NOISE_DIM, CHANNELS_IMG, FEATURES_GEN)
    disc = Discriminator(CHANNELS_IMG, FEATURES_DISC)
    initialize_weights(gen)
    initialize_weights(disc)

    opt_gen = optim.Adam(gen.parameters(), lr=LEARNING_RATE, betas=(0.5, 0.999))
    opt_disc = optim.Adam(disc.parameters(), lr=LEARNING_RATE, betas=(0.5, 0.999))
    criterion = nn.BCELoss()

    gen.train()
    disc.train()

    def gen_target(output: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(output) if fake_labels_for_gen else torch.ones_like(output)

    def gen_loss_fn(fake: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return criterion(disc(fake).reshape(-1), target)

    with torch.random.fork_rng():  # the probe batches leave the program's random stream alone
        real0, _ = next(iter(dataloader))
        noise0 = torch.randn(BATCH_SIZE, NOISE_DIM, 1, 1)
    d_batch = (real0, torch.ones(len(real0)))
    g_batch = (noise0, gen_target(torch.empty(BATCH_SIZE)))
    nx.preflight(disc, d_batch, criterion, optimizer=opt_disc)
    nx.preflight(gen, g_batch, gen_loss_fn, optimizer=opt_gen)

    mon_disc = nx.monitor(disc, opt_disc)
    mon_gen = nx.monitor(gen, opt_gen)
    d_losses, g_losses = [], []
    for epoch in range(NUM_EPOCHS):
        for batch_idx, (real, _) in enumerate(dataloader):
            noise = torch.randn(BATCH_SIZE, NOISE_DIM, 1, 1)
            fake = gen(noise)

            disc_real = disc(real).reshape(-1)
            loss_disc_real = criterion(disc_real, torch.ones_like(disc_real))
            disc_fake = disc(fake.detach()).reshape(-1)
            loss_disc_fake = criterion(disc_fake, torch.zeros_like(disc_fake))
            loss_disc = (loss_disc_real + loss_disc_fake) / 2
            if disc_zero_grad:
                disc.zero_grad()
            loss_disc.backward()
            opt_disc.step()

            output = disc(fake).reshape(-1)
            loss_gen = criterion(output, gen_target(output))
            gen.zero_grad()
            loss_gen.backward()
            opt_gen.step()

            nx.timed(lambda: mon_disc.log(loss_disc))
            nx.timed(lambda: mon_gen.log(loss_gen))
            d_losses.append(loss_disc.item())
            g_losses.append(loss_gen.item())
    nx.finish(mon_disc, disc, d_batch, criterion, optimizer=opt_disc)
    nx.finish(mon_gen, gen, g_batch, gen_loss_fn, optimizer=opt_gen)

    metrics = _quality(gen, x_train, _tr_y, x_test)
    metrics.update(d_real=disc_real.mean().item(), d_fake=disc_fake.mean().item(),
                   d_gap=disc_real.mean().item() - disc_fake.mean().item(),
                   last_loss_disc=float(np.mean(d_losses[-12:])), last_loss_gen=float(np.mean(g_losses[-12:])))  # fmt: skip
    return metrics

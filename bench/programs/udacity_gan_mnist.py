"""Port of udacity/deep-learning-v2-pytorch's MNIST GAN solution: a fully connected
discriminator (leaky ReLU 0.2, dropout 0.3, one logit) against a fully connected generator
(leaky ReLU, dropout, tanh output), both trained with ``BCEWithLogitsLoss`` and Adam at 0.002.

Source: github.com/udacity/deep-learning-v2-pytorch, ``gan-mnist/MNIST_GAN_Solution.ipynb`` at
commit c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written anew
from the facts of the notebook; no code copied.

Kept: ``Discriminator(input_size, hidden_dim, output_size)``: ``fc1`` input -> 4h, ``fc2`` 4h ->
2h, ``fc3`` 2h -> h, ``fc4`` h -> 1, the image flattened with ``view``, ``F.leaky_relu(., 0.2)``
then ``Dropout(0.3)`` after each hidden layer, the last layer a raw logit; ``Generator(z_size,
hidden_dim, output_size)``: ``fc1`` z -> h, ``fc2`` h -> 2h, ``fc3`` 2h -> 4h, ``fc4`` 4h -> image,
leaky ReLU 0.2 + dropout 0.3 after each hidden layer, ``F.tanh`` on the output; ``d_hidden_size``
= ``g_hidden_size`` = 32, ``z_size`` = 100; ``real_loss(D_out, smooth)`` (labels
``torch.ones(batch_size) * 0.9`` when smoothing, else ones; a fresh ``nn.BCEWithLogitsLoss``
on ``D_out.squeeze()``) and ``fake_loss(D_out)`` (zeros); ``optim.Adam(D.parameters(), lr)``
and ``optim.Adam(G.parameters(), lr)`` at ``lr = 0.002``; a ``DataLoader`` of batch 64 without
shuffling over ``ToTensor()`` images in [0, 1]; the loop: ``D.train(); G.train()``, per batch
``real_images = real_images*2 - 1``, ``d_optimizer.zero_grad()``, ``real_loss(D(real),
smooth=True)``, fakes from ``np.random.uniform(-1, 1, (batch, z_size))`` under
``torch.no_grad()``, ``fake_loss(D(fake))``, ``d_loss = d_real_loss + d_fake_loss``,
backward, step; then ``g_optimizer.zero_grad()``, fresh z, ``g_loss = real_loss(D(G(z)))``
(the flipped labels), backward, step; the losses kept after each epoch; a fixed z sampled
through ``G.eval()`` / ``G.train()`` after each epoch.
Shrunk: scikit-learn's 8x8 digits (1,437 train images, pixels 0..255 -> [0, 1] as
``ToTensor`` gives) instead of 28x28 MNIST, so ``input_size`` = ``g_output_size`` = 64 and the
``view(-1, 28*28)`` is ``view(-1, 8*8)``; 40 epochs of 23 batches instead of 100 of 938; no
pickle, no plots; CPU.
Measure only (not in the program): after training, 1,000 samples of ``G.eval()`` on fresh z,
mapped back to pixel space the way the notebook's convention says (``(x + 1) / 2``), are
compared with the 360 held-out real digits in [0, 1] by the Frechet distance of the two
Gaussians fitted to the 64-pixel vectors (a pixel-space FID); also the mean of the samples.

nndx, as the author would add it: two models, two optimizers, so two of each: a preflight
``nndx.probe`` of ``D`` on the first batch (rescaled as the loop rescales it, with the
smoothed real labels) with ``loss_fn = BCEWithLogitsLoss`` on the squeezed logit and
``optimizer=d_optimizer``, and of ``G`` on a batch of z with the generator's loss as the
notebook writes it (the loss of ``D`` on ``G``'s images, the target ignored) and
``optimizer=g_optimizer``; ``nndx.Monitor(D, d_optimizer)`` and ``nndx.Monitor(G,
g_optimizer)`` around the loop, ``d_loss`` and ``g_loss`` logged every batch; after training
``nndx.probe(..., monitor=mon)`` on the same batches and ``nndx.diagnose`` for each, read
together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_gan_mnist"
SOURCE = Source("udacity/deep-learning-v2-pytorch", "gan-mnist/MNIST_GAN_Solution.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 8x8 digits, 40 epochs)"),
        Variant(
            "no_rescale_to_tanh_range",
            "the 'important rescaling step' real_images = real_images*2 - 1 left out: the discriminator sees "
            "real images in [0, 1] while the tanh generator's images live in [-1, 1], so the generator "
            "is pulled toward the [0, 1] range and its samples no longer match the pixel convention the "
            "rest of the program (and the display) assumes",
            (C.UNNORMALIZED_INPUTS, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/fchollet/deep-learning-with-python-notebooks/issues/7",
             "https://github.com/ImagingLab/Colorizing-with-GANs/issues/3",
             "https://github.com/udacity/deep-learning/issues/126",
             "https://github.com/soumith/ganhacks (trick 1: normalize the inputs to [-1, 1], tanh output)"),
            Measure("pixel_fid", "pixel-space Frechet distance of the samples to held-out digits at least 2x the "
                    "healthy run's: 13.2 against 5.76 healthy on seed 0 (sample mean pixel 0.64 against "
                    "0.29, the real digits' 0.31)", lambda healthy, buggy: buggy >= 2.0 * healthy),
        ),
        Variant(
            "generator_not_flipped_labels",
            "the generator is trained with g_loss = fake_loss(D_fake) instead of real_loss(D_fake): its target "
            "for its own images is 'fake' (0), so it learns to make images the discriminator rejects instead "
            "of fooling it",
            (C.WRONG_LOSS,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/45",
             "https://github.com/keras-team/keras-io/issues/361",
             "https://github.com/shaohua0116/DCGAN-Tensorflow/issues/5",
             "https://github.com/NVIDIA/pix2pixHD/issues/233"),
            Measure("pixel_fid", "pixel-space Frechet distance of the samples to held-out digits at least 2x the "
                    "healthy run's: 42.0 against 5.76 healthy on seed 0", lambda healthy, buggy: buggy >= 2.0 * healthy),
        ),
    )
}

SIDE = 8
BATCH_SIZE, NUM_EPOCHS, LR = 64, 40, 0.002
INPUT_SIZE, D_OUTPUT_SIZE, D_HIDDEN_SIZE = SIDE * SIDE, 1, 32
Z_SIZE, G_OUTPUT_SIZE, G_HIDDEN_SIZE = 100, SIDE * SIDE, 32


class Discriminator(nn.Module):
    def __init__(self, input_size: int, hidden_dim: int, output_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_dim * 4)
        self.fc2 = nn.Linear(hidden_dim * 4, hidden_dim * 2)
        self.fc3 = nn.Linear(hidden_dim * 2, hidden_dim)
        self.fc4 = nn.Linear(hidden_dim, output_size)
        self.dropout = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, SIDE * SIDE)
        x = F.leaky_relu(self.fc1(x), 0.2)
        x = self.dropout(x)
        x = F.leaky_relu(self.fc2(x), 0.2)
        x = self.dropout(x)
        x = F.leaky_relu(self.fc3(x), 0.2)
        x = self.dropout(x)
        out = self.fc4(x)
        return out


class Generator(nn.Module):
    def __init__(self, input_size: int, hidden_dim: int, output_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim * 2)
        self.fc3 = nn.Linear(hidden_dim * 2, hidden_dim * 4)
        self.fc4 = nn.Linear(hidden_dim * 4, output_size)
        self.dropout = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.fc1(x), 0.2)
        x = self.dropout(x)
        x = F.leaky_relu(self.fc2(x), 0.2)
        x = self.dropout(x)
        x = F.leaky_relu(self.fc3(x), 0.2)
        x = self.dropout(x)
        out = torch.tanh(self.fc4(x))  # F.tanh in the notebook (deprecated alias)
        return out


def real_loss(D_out: torch.Tensor, smooth: bool = False) -> torch.Tensor:
    batch_size = D_out.size(0)
    if smooth:
        labels = torch.ones(batch_size) * 0.9
    else:
        labels = torch.ones(batch_size)
    criterion = nn.BCEWithLogitsLoss()
    loss = criterion(D_out.squeeze(), labels)
    return loss


def fake_loss(D_out: torch.Tensor) -> torch.Tensor:
    batch_size = D_out.size(0)
    labels = torch.zeros(batch_size)
    criterion = nn.BCEWithLogitsLoss()
    loss = criterion(D_out.squeeze(), labels)
    return loss


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to the rows of ``a`` and ``b`` (measure only)."""
    from scipy import linalg

    mu_a, mu_b = a.mean(0), b.mean(0)
    eye = 1e-6 * np.eye(a.shape[1])  # the digits' corner pixels are constant: keep the covariances full rank
    cov_a, cov_b = np.cov(a, rowvar=False) + eye, np.cov(b, rowvar=False) + eye
    covmean = linalg.sqrtm(cov_a @ cov_b)
    covmean = np.real(covmean)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * covmean))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    rescale = variant != "no_rescale_to_tanh_range"
    g_loss_fn = fake_loss if variant == "generator_not_flipped_labels" else real_loss

    tr_raw, tr_y, te_raw, _ = digits.digit_images(seed=seed)
    train_data = TensorDataset(digits.to_tensor(tr_raw), tr_y)  # transforms.ToTensor()
    train_loader = DataLoader(train_data, batch_size=BATCH_SIZE, num_workers=0)

    D = Discriminator(INPUT_SIZE, D_HIDDEN_SIZE, D_OUTPUT_SIZE)
    G = Generator(Z_SIZE, G_HIDDEN_SIZE, G_OUTPUT_SIZE)
    d_optimizer = torch.optim.Adam(D.parameters(), LR)
    g_optimizer = torch.optim.Adam(G.parameters(), LR)

    # nndx: the first batch as the loop prepares it, and a batch of z for the generator
    first_real = next(iter(train_loader))[0]
    if rescale:
        first_real = first_real * 2 - 1
    d_batch = (first_real, torch.ones(first_real.size(0)) * 0.9)
    probe_z = torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, size=(BATCH_SIZE, Z_SIZE))).float()
    g_batch = (probe_z, torch.ones(BATCH_SIZE))
    bce = nn.BCEWithLogitsLoss()

    def d_loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return bce(out.squeeze(), target)

    def g_probe_loss(fake: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
        return g_loss_fn(D(fake))

    nx.preflight(D, d_batch, d_loss_fn, optimizer=d_optimizer)
    nx.preflight(G, g_batch, g_probe_loss, optimizer=g_optimizer)
    mon_d = nx.monitor(D, d_optimizer, every=10)
    mon_g = nx.monitor(G, g_optimizer, every=10)

    sample_size = 16
    fixed_z = torch.from_numpy(np.random.uniform(-1, 1, size=(sample_size, Z_SIZE))).float()
    losses, samples = [], []

    D.train()
    G.train()
    for _epoch in range(NUM_EPOCHS):
        for _batch_i, (real_images, _) in enumerate(train_loader):
            batch_size = real_images.size(0)
            if rescale:
                real_images = real_images * 2 - 1

            d_optimizer.zero_grad()
            D_real = D(real_images)
            d_real_loss = real_loss(D_real, smooth=True)
            with torch.no_grad():
                z = np.random.uniform(-1, 1, size=(batch_size, Z_SIZE))
                z = torch.from_numpy(z).float()
                fake_images = G(z)
            D_fake = D(fake_images)
            d_fake_loss = fake_loss(D_fake)
            d_loss = d_real_loss + d_fake_loss
            d_loss.backward()
            d_optimizer.step()

            g_optimizer.zero_grad()
            z = np.random.uniform(-1, 1, size=(batch_size, Z_SIZE))
            z = torch.from_numpy(z).float()
            fake_images = G(z)
            D_fake = D(fake_images)
            g_loss = g_loss_fn(D_fake)
            g_loss.backward()
            g_optimizer.step()

            nx.timed(lambda: mon_d.log(d_loss))  # noqa: B023
            nx.timed(lambda: mon_g.log(g_loss))  # noqa: B023

        losses.append((d_loss.item(), g_loss.item()))
        G.eval()
        with torch.no_grad():
            samples.append(G(fixed_z))
        G.train()

    nx.finish(mon_d, D, d_batch, d_loss_fn, optimizer=d_optimizer)
    nx.finish(mon_g, G, g_batch, g_probe_loss, optimizer=g_optimizer)

    # measure only
    G.eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1000 + seed)
        z = torch.rand(1000, Z_SIZE, generator=gen) * 2 - 1
        fake = ((G(z) + 1) / 2).numpy().astype(np.float64)
    real = digits.to_tensor(te_raw).view(-1, SIDE * SIDE).numpy().astype(np.float64)
    return {"pixel_fid": frechet(fake, real), "sample_mean": float(fake.mean()), "real_mean": float(real.mean()),
            "final_d_loss": losses[-1][0], "final_g_loss": losses[-1][1]}  # fmt: skip

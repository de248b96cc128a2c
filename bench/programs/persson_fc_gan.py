"""Port of Aladdin Persson's "SimpleGAN": a fully connected GAN (one hidden layer each) trained
with ``BCELoss`` and two Adam optimizers at 3e-4, the discriminator step backpropagated with
``retain_graph=True`` so that the generator step can reuse the same fake batch.

Source: github.com/aladdinpersson/Machine-Learning-Collection,
``ML/Pytorch/GANs/1. SimpleGAN/fc_gan.py`` at commit 65b8c8049560b19ace11ef754cb4dbe5aa415296
(MIT, Copyright (c) 2020 Aladdin Persson). Written anew from the facts of that file; no code
copied.

Kept: ``Discriminator(in_features)`` = ``Linear(in_features, 128)``, ``LeakyReLU(0.01)``,
``Linear(128, 1)``, ``Sigmoid``; ``Generator(z_dim, img_dim)`` = ``Linear(z_dim, 256)``,
``LeakyReLU(0.01)``, ``Linear(256, img_dim)``, ``Tanh`` (the script's comment: inputs are
normalised to [-1, 1] so the outputs are too); ``lr = 3e-4``, ``z_dim = 64``, ``batch_size =
32``; images through ``ToTensor`` + ``Normalize((0.5,), (0.5,))``; a shuffling ``DataLoader``;
``opt_disc = Adam(disc.parameters(), lr)``, ``opt_gen = Adam(gen.parameters(), lr)``,
``criterion = nn.BCELoss()``; the loop: ``real.view(-1, img_dim)``, noise ``randn(batch_size,
z_dim)``, ``fake = gen(noise)``; the discriminator step ``lossD = (BCE(disc(real), 1) +
BCE(disc(fake), 0)) / 2``, ``disc.zero_grad()``, ``lossD.backward(retain_graph=True)``,
``opt_disc.step()`` (``fake`` not detached); the generator step ``output = disc(fake)``,
``lossG = BCE(output, 1)``, ``gen.zero_grad()``, ``lossG.backward()``, ``opt_gen.step()``;
``fixed_noise`` drawn once; the losses printed at each epoch's first batch.
Shrunk: scikit-learn's 8x8 digits (1,437 train images) instead of MNIST, so ``image_dim`` is
64 instead of 784; 30 epochs instead of 50; no TensorBoard writers (the fixed-noise grids are
not drawn); CPU.
Measure only (not in the program): after training, 1,000 generator samples (fresh noise) are
put on the image scale the program's data have ([-1, 1] mapped back to [0, 1]: ``(x + 1) / 2``;
with the data left in [0, 1] the samples are taken as they come) and compared with the 360
held-out digits by the Frechet distance of their pixel means and covariances (64 dimensions),
the fraction of sample pixels outside the image range by more than 0.05, and the
discriminator's mean output on the held-out digits and on the samples.

nndx, as the author would add it: two models, two optimizers, so two ``nndx.Monitor`` (the
discriminator with ``opt_disc``, the generator with ``opt_gen``) around the epochs, ``lossD``
logged into the first and ``lossG`` into the second after each step; a preflight
``nndx.probe`` of each before training on the first real batch: the discriminator with
``(real, ones)`` and the ``BCELoss``, the generator with ``(noise, ones)`` and its loss as the
script computes it, ``BCE(disc(fake).view(-1), ones)``, each with its own optimizer; after
training ``nndx.probe(..., monitor=mon)`` of each on the same batches and ``nndx.diagnose``; the
author reads the two diagnoses ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_fc_gan"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/GANs/1. SimpleGAN/fc_gan.py",
                "65b8c8049560b19ace11ef754cb4dbe5aa415296", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 8x8 digits, image_dim 64, 30 epochs)"),
        Variant(
            "no_disc_zero_grad",
            "disc.zero_grad() left out of the discriminator step: its gradients accumulate over every step, the "
            "generator step's gradients through disc (lossG.backward) included, and opt_disc steps the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557"),
            Measure("frechet", "pixel-space Frechet distance of the samples to held-out digits at least 1.5x the "
                    "healthy run's: 13.3 against 6.6 on seed 0", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "data_not_scaled",
            "transforms.Normalize((0.5,), (0.5,)) left out: the real images stay in [0, 1] while the generator ends "
            "in Tanh ([-1, 1]), so the discriminator can tell fakes by their negative pixels",
            (C.WRONG_OUTPUT_ACTIVATION, C.UNNORMALIZED_INPUTS),
            ("https://github.com/fchollet/deep-learning-with-python-notebooks/issues/7",
             "https://github.com/khalooei/ALOCC-CVPR2018/issues/3"),
            Measure("out_of_range", "fraction of the samples' pixels outside the data's image range by more than "
                    "0.05 at least 0.05 above the healthy run's: 0.166 against 0.0 on seed 0 (the Frechet distance "
                    "is not worse: 6.52 against 6.61)", lambda healthy, buggy: buggy >= healthy + 0.05),
        ),
    )
}

LR = 3e-4
Z_DIM = 64
IMAGE_DIM = 8 * 8 * 1
BATCH_SIZE = 32
NUM_EPOCHS = 30


class Discriminator(nn.Module):
    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.disc = nn.Sequential(nn.Linear(in_features, 128), nn.LeakyReLU(0.01), nn.Linear(128, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.disc(x)


class Generator(nn.Module):
    def __init__(self, z_dim: int, img_dim: int) -> None:
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(z_dim, 256), nn.LeakyReLU(0.01), nn.Linear(256, img_dim),
                                 nn.Tanh())  # inputs in [-1, 1], so outputs in [-1, 1]  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gen(x)


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to the rows of ``a`` and of ``b``."""
    from scipy import linalg

    mu_a, mu_b = a.mean(0), b.mean(0)
    eye = 1e-6 * np.eye(a.shape[1])  # the digits' border pixels are constant: keep the covariances invertible
    cov_a, cov_b = np.cov(a, rowvar=False) + eye, np.cov(b, rowvar=False) + eye
    covmean = linalg.sqrtm(cov_a @ cov_b)
    covmean = covmean.real if np.iscomplexobj(covmean) else covmean
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * covmean))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    scaled = variant != "data_not_scaled"

    disc = Discriminator(IMAGE_DIM)
    gen = Generator(Z_DIM, IMAGE_DIM)
    fixed_noise = torch.randn((BATCH_SIZE, Z_DIM))  # noqa: F841 - drawn as the script draws it (for its grids)
    tr_raw, tr_y, te_raw, _ = digits.digit_images(seed=seed)
    images = digits.to_tensor(tr_raw)  # ToTensor: [0, 1]
    if scaled:
        images = (images - 0.5) / 0.5  # Normalize((0.5,), (0.5,))
    dataset = TensorDataset(images, tr_y)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)
    opt_disc = torch.optim.Adam(disc.parameters(), lr=LR)
    opt_gen = torch.optim.Adam(gen.parameters(), lr=LR)
    criterion = nn.BCELoss()

    def disc_loss(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # the loop's disc(real).view(-1)
        return criterion(scores.view(-1), target)

    def gen_loss(fake: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return criterion(disc(fake).view(-1), target)

    with torch.random.fork_rng():  # the probe batches leave the program's random stream alone
        probe_real = next(iter(loader))[0].view(-1, IMAGE_DIM)
        probe_noise = torch.randn(BATCH_SIZE, Z_DIM)
    ones = torch.ones(BATCH_SIZE)
    disc_batch, gen_batch = (probe_real, ones), (probe_noise, ones)
    nx.preflight(disc, disc_batch, disc_loss, optimizer=opt_disc)
    nx.preflight(gen, gen_batch, gen_loss, optimizer=opt_gen)
    mon_disc = nx.monitor(disc, opt_disc, every=10)
    mon_gen = nx.monitor(gen, opt_gen, every=10)

    first = {}
    for epoch in range(NUM_EPOCHS):
        for batch_idx, (real, _) in enumerate(loader):
            real = real.view(-1, IMAGE_DIM)
            batch_size = real.shape[0]

            # Train Discriminator: max log(D(x)) + log(1 - D(G(z)))
            noise = torch.randn(batch_size, Z_DIM)
            fake = gen(noise)
            disc_real = disc(real).view(-1)
            lossD_real = criterion(disc_real, torch.ones_like(disc_real))
            disc_fake = disc(fake).view(-1)
            lossD_fake = criterion(disc_fake, torch.zeros_like(disc_fake))
            lossD = (lossD_real + lossD_fake) / 2
            if variant != "no_disc_zero_grad":
                disc.zero_grad()
            lossD.backward(retain_graph=True)
            opt_disc.step()

            # Train Generator: min log(1 - D(G(z))) <-> max log(D(G(z)))
            output = disc(fake).view(-1)
            lossG = criterion(output, torch.ones_like(output))
            gen.zero_grad()
            lossG.backward()
            opt_gen.step()
            nx.timed(lambda: mon_disc.log(lossD))  # noqa: B023
            nx.timed(lambda: mon_gen.log(lossG))  # noqa: B023

            if batch_idx == 0:  # the script prints "Loss D: ..., loss G: ..." here
                first.setdefault("lossD", lossD.item())
                first.setdefault("lossG", lossG.item())
                last_d, last_g = lossD.item(), lossG.item()

    nx.finish(mon_disc, disc, disc_batch, disc_loss, optimizer=opt_disc)
    nx.finish(mon_gen, gen, gen_batch, gen_loss, optimizer=opt_gen)

    # measure only: samples against held-out digits, on the image scale of the program's data
    gen.eval()
    disc.eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1000 + seed)
        samples = gen(torch.randn(1000, Z_DIM, generator=g))
        held_out = digits.to_tensor(te_raw).view(-1, IMAGE_DIM)
        d_held = disc(held_out * 2 - 1 if scaled else held_out).mean().item()
        d_fake = disc(samples).mean().item()
        as_image = (samples + 1) / 2 if scaled else samples
    return {"frechet": frechet(as_image.double().numpy(), held_out.double().numpy()),
            "d_on_held_out": d_held, "d_on_samples": d_fake,
            "out_of_range": (as_image < -0.05).double().mean().item() + (as_image > 1.05).double().mean().item(),
            "frechet_clamped": frechet(as_image.clamp(0, 1).double().numpy(), held_out.double().numpy()),
            "sample_min": as_image.min().item(), "sample_mean": as_image.mean().item(),
            "last_lossD": last_d, "last_lossG": last_g}  # fmt: skip

"""Port of eriklindernoren/PyTorch-GAN: Softmax GAN (Lin 2017). An MLP generator (blocks of
Linear, BatchNorm1d(out, 0.8), LeakyReLU(0.2, inplace); Tanh output) and an MLP discriminator
(Linear, LeakyReLU(0.2, inplace), one unnormalised output) trained with the softmax GAN
losses over the batch: with the partition function ``Z = sum(exp(-d_real)) + sum(exp(-d_fake))``,
``d_loss = (1/B) * sum(d_real) + log(Z)`` and ``g_loss = (1/2B) * (sum(d_real) + sum(d_fake)) +
log(Z)`` (``log(x) = torch.log(x + 1e-8)``), both optimizers zeroed at the top of the iteration,
``d_loss.backward(retain_graph=True)``, ``optimizer_D.step()``, then ``g_loss.backward()``,
``optimizer_G.step()``; Adam at lr 0.0002, betas (0.5, 0.999) for both.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/softmax_gan/softmax_gan.py``
at commit 36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik Linder-Norén).
Written anew from the facts of that file; no code copied.

Kept: the two models' shapes of layers (the generator's first block without BatchNorm, the
``BatchNorm1d(out_feat, 0.8)`` whose second argument is eps, the in-place LeakyReLUs, the
``img.view(B, *img_shape)``), the losses as written (``torch.exp``/``torch.sum``, not
``logsumexp``; the ``1e-8`` inside the log), the gen_imgs *not* detached for the
discriminator's loss (so ``d_loss.backward`` also leaves gradients in the generator, which
``optimizer_G.step()`` then uses together with ``g_loss``'s: the published behaviour), the
noise ``np.random.normal(0, 1, (B, latent_dim))``, ``Normalize([0.5], [0.5])`` after
``ToTensor``, a shuffling DataLoader of batch 64, Adam(lr=0.0002, betas=(0.5, 0.999)).
Changed to run at all on torch >= 1.5: the published loop calls ``g_loss.backward()`` through
the graph of the discriminator's forward *after* ``optimizer_D.step()`` changed its weights in
place, which raises "one of the variables needed for gradient computation has been modified by
an inplace operation" on every torch since 1.5 (before, the backward silently used the
stepped weights). The port re-runs the discriminator on the same ``real_imgs`` / ``gen_imgs``
after ``optimizer_D.step()`` and builds ``g_loss`` (and its ``Z``) from that forward: the
gradient old torch computed, up to the activations being those of the stepped weights.
Shrunk / replaced: scikit-learn's 8x8 digits (``img_size`` 8, 1,437 train images) instead of
MNIST at 28; ``latent_dim`` 32 instead of 100; generator widths 32-64-128-256 instead of
128-256-512-1024, discriminator 64-128-64-1 instead of 784-512-256-1; 25 epochs (~575 steps)
instead of 200; no ``save_image``, no per-batch print.
Measure only (not in the program): the Frechet distance between 1,437 generated images and the
1,437 training images in raw 64-pixel space on the [0, 1] pixel scale (the generator's Tanh
output mapped back by (x + 1) / 2), and the mean
per-pixel standard deviation of the generated images.

nndx, as the author would add it: a preflight ``nndx.probe`` of each model before the loop on
the first batch: the discriminator on (real and generated images, which-are-real mask) with
the softmax discriminator loss, the generator on (noise, real images) with the generator loss
through the discriminator; ``nndx.Monitor(generator, optimizer_G)`` and
``nndx.Monitor(discriminator, optimizer_D)`` around the loop, ``d_loss`` and ``g_loss`` logged
where the script prints them; after training ``nndx.probe(..., monitor=mon)`` for each on the
same batches. The two diagnoses are read together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "softmax_gan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/softmax_gan/softmax_gan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published, with the re-forward that lets it run on torch >= 1.5 "
                "(shrunk: 8x8 digits, narrow MLPs, 25 epochs)"),
        Variant(
            "fake_detached",
            "the generated batch is detached where it is made (gen_imgs = generator(z).detach(), the usual "
            "'detach the fakes for D' applied once and reused for the generator's loss): no loss reaches the "
            "generator's weights, optimizer_G steps nothing",
            (C.DETACHED_GRAPH,),
            ("https://github.com/wangle53/CSA-CDGAN/issues/5",
             "https://github.com/nikhilsinghmus/image2reverb/issues/37",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/151"),
            Measure("frechet", "Frechet distance of the generated images at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "no_zero_grad_D",
            "optimizer_D.zero_grad() left out of the loop (optimizer_G.zero_grad() kept): the discriminator's "
            "gradients pile up across iterations, and with them the gradients g_loss.backward() leaves in it "
            "after its step, so every optimizer_D.step() follows the running sum of all earlier losses of both",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Lightning-AI/pytorch-lightning/issues/591",
             "https://github.com/Adversarial-Deep-Learning/code-soup/pull/73",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/6134"),
            Measure("frechet", "Frechet distance of the generated images at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

OPT = {"n_epochs": 25, "batch_size": 64, "lr": 0.0002, "b1": 0.5, "b2": 0.999, "latent_dim": 32, "img_size": 8,
       "channels": 1}  # fmt: skip
img_shape = (OPT["channels"], OPT["img_size"], OPT["img_size"])


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(OPT["latent_dim"], 32, normalize=False),
            *block(32, 64),
            *block(64, 128),
            *block(128, 256),
            nn.Linear(256, int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.shape[0], *img_shape)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.model = nn.Sequential(
            nn.Linear(OPT["img_size"] ** 2, 128),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(128, 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 1),
        )

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        validity = self.model(img_flat)
        return validity


def log(x):
    return torch.log(x + 1e-8)


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between two Gaussians fitted to the rows of a and b."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    wa, va = np.linalg.eigh(ca)
    sqrt_a = (va * np.sqrt(np.clip(wa, 0, None))) @ va.T
    m = sqrt_a @ cb @ sqrt_a
    wm = np.linalg.eigvalsh((m + m.T) / 2)
    tr_sqrt = np.sqrt(np.clip(wm, 0, None)).sum()
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(ca) + np.trace(cb) - 2 * tr_sqrt)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    detach_fakes = variant == "fake_detached"
    zero_grad_D = variant != "no_zero_grad_D"

    generator = Generator()
    discriminator = Discriminator()

    tr_raw, _, _, _ = digits.digit_images(seed=seed)
    imgs01 = digits.to_tensor(tr_raw)  # ToTensor: (N, 1, 8, 8) in [0, 1]
    imgs_all = (imgs01 - 0.5) / 0.5  # Normalize([0.5], [0.5])
    dataloader = DataLoader(TensorDataset(imgs_all, torch.zeros(len(imgs_all))), batch_size=OPT["batch_size"],
                            shuffle=True)  # fmt: skip

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=OPT["lr"], betas=(OPT["b1"], OPT["b2"]))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=OPT["lr"], betas=(OPT["b1"], OPT["b2"]))

    # the losses as nndx gets them
    def d_loss_fn(validity, is_real):
        d_real, d_fake = validity[is_real > 0.5], validity[is_real < 0.5]
        Z = torch.sum(torch.exp(-d_real)) + torch.sum(torch.exp(-d_fake))
        return (1 / d_real.shape[0]) * torch.sum(d_real) + log(Z)

    def g_loss_fn(gen_imgs, real_imgs):
        d_real, d_fake = discriminator(real_imgs), discriminator(gen_imgs)
        Z = torch.sum(torch.exp(-d_real)) + torch.sum(torch.exp(-d_fake))
        return (1 / (2 * real_imgs.shape[0])) * (torch.sum(d_real) + torch.sum(d_fake)) + log(Z)

    with torch.random.fork_rng():  # the probe batches leave the program's random stream alone
        probe_real = next(iter(dataloader))[0]
        probe_z = torch.from_numpy(np.random.RandomState(seed + 1).normal(0, 1, (len(probe_real), OPT["latent_dim"]))
                                   ).float()  # fmt: skip
        generator.eval()
        with torch.no_grad():
            probe_fake = generator(probe_z)
        generator.train()
    d_batch = (torch.cat([probe_real, probe_fake]), torch.cat([torch.ones(len(probe_real)), torch.zeros(len(probe_fake))]))
    g_batch = (probe_z, probe_real)
    nx.preflight(discriminator, d_batch, d_loss_fn, optimizer=optimizer_D)
    nx.preflight(generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    mon_G = nx.monitor(generator, optimizer_G, every=5)
    mon_D = nx.monitor(discriminator, optimizer_D, every=5)

    for epoch in range(OPT["n_epochs"]):
        for i, (imgs, _) in enumerate(dataloader):
            optimizer_G.zero_grad()
            if zero_grad_D:
                optimizer_D.zero_grad()

            batch_size = imgs.shape[0]
            g_target = 1 / (batch_size * 2)
            d_target = 1 / batch_size

            real_imgs = imgs.type(torch.FloatTensor)
            z = torch.FloatTensor(np.random.normal(0, 1, (imgs.shape[0], OPT["latent_dim"])))
            gen_imgs = generator(z)
            if detach_fakes:
                gen_imgs = gen_imgs.detach()

            d_real = discriminator(real_imgs)
            d_fake = discriminator(gen_imgs)
            Z = torch.sum(torch.exp(-d_real)) + torch.sum(torch.exp(-d_fake))
            d_loss = d_target * torch.sum(d_real) + log(Z)
            d_loss.backward(retain_graph=True)
            optimizer_D.step()

            # torch >= 1.5: the discriminator run again after its in-place step (see the docstring)
            d_real = discriminator(real_imgs)
            d_fake = discriminator(gen_imgs)
            Z = torch.sum(torch.exp(-d_real)) + torch.sum(torch.exp(-d_fake))
            g_loss = g_target * (torch.sum(d_real) + torch.sum(d_fake)) + log(Z)
            g_loss.backward()
            optimizer_G.step()

            nx.timed(lambda: mon_D.log(d_loss))  # noqa: B023
            nx.timed(lambda: mon_G.log(g_loss))  # noqa: B023

    nx.finish(mon_D, discriminator, d_batch, d_loss_fn, optimizer=optimizer_D)
    nx.finish(mon_G, generator, g_batch, g_loss_fn, optimizer=optimizer_G)

    # measure only: samples on the [0, 1] scale of the data
    generator.eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 7)
        z = torch.randn(len(imgs01), OPT["latent_dim"], generator=g)
        gen = generator(z)
    gen01 = (gen + 1) / 2
    gen_np = gen01.reshape(len(gen01), -1).double().numpy()
    real_np = imgs01.reshape(len(imgs01), -1).double().numpy()
    return {"frechet": frechet(gen_np, real_np), "gen_pixel_std": float(gen_np.std(0).mean()),
            "last_d_loss": float(d_loss.item()), "last_g_loss": float(g_loss.item())}

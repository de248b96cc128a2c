"""Port of eriklindernoren/PyTorch-GAN: the relativistic GAN (RGAN, and RaGAN with
``--rel_avg_gan``) on MNIST.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/relativistic_gan/relativistic_gan.py``
at commit 36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik Linder-Norén).
Written anew from the facts of that file; no code copied.

Kept: the ``Generator`` (``l1``: ``Linear(latent_dim, C * init_size**2)`` with ``init_size =
img_size // 4``, reshaped to (C, init_size, init_size); ``conv_blocks``: ``BatchNorm2d(C)``,
``Upsample(2)``, ``Conv2d(C, C, 3, 1, 1)``, ``BatchNorm2d(C, 0.8)`` (the script's 0.8 lands in
``eps``), ``LeakyReLU(0.2, inplace=True)``, ``Upsample(2)``, ``Conv2d(C, C/2, 3, 1, 1)``,
``BatchNorm2d(C/2, 0.8)``, ``LeakyReLU(0.2, inplace=True)``, ``Conv2d(C/2, channels, 3, 1, 1)``,
``Tanh``); the ``Discriminator`` (four ``discriminator_block``s of ``Conv2d(in, out, 3, 2, 1)``,
``LeakyReLU(0.2, inplace=True)``, ``Dropout2d(0.25)`` and, but for the first, ``BatchNorm2d(out,
0.8)``; ``adv_layer = Linear(F * ds_size**2, 1)`` with ``ds_size = img_size // 2**4``, no
sigmoid); ``adversarial_loss = BCEWithLogitsLoss()``; Adam for both nets at the script's lr 0.0002
and betas (0.5, 0.999); the data pipeline ``Resize(img_size)``, ``ToTensor``, ``Normalize([0.5],
[0.5])``, a shuffled loader of ``batch_size`` 64; the loop: ground truths ``valid``/``fake`` filled
with 1/0, the generator step first (``optimizer_G.zero_grad()``, ``z`` drawn with
``np.random.normal(0, 1, (batch, latent_dim))``, ``gen_imgs = generator(z)``, ``real_pred =
discriminator(real_imgs).detach()``, ``fake_pred = discriminator(gen_imgs)``, the relativistic
generator loss ``BCE(fake_pred - real_pred, valid)`` or, with ``rel_avg_gan``, ``BCE(fake_pred -
real_pred.mean(0, keepdim=True), valid)``, ``backward``, ``step``), then the discriminator step
(``optimizer_D.zero_grad()``, ``real_pred = discriminator(real_imgs)``, ``fake_pred =
discriminator(gen_imgs.detach())``, ``real_loss = BCE(real_pred - fake_pred, valid)``,
``fake_loss = BCE(fake_pred - real_pred, fake)`` (or the ``.mean(0, keepdim=True)`` versions),
``d_loss = (real_loss + fake_loss) / 2``, ``backward``, ``step``); the per-batch print becomes
the per-batch loss record.
The healthy program: the published script overwrites the relativistic ``g_loss`` with
``g_loss = adversarial_loss(discriminator(gen_imgs), valid)`` right after computing it (issue
#52, PR #210 of the repository); the healthy variant is the script with that line removed, as
the issue and the PR fix it. (The published line was tried as a bug variant and dropped: on this
port it moves the measure by 7%, 4.79 against 4.48, not measurably.) ``rel_avg_gan`` is the
script's default (off: the standard relativistic loss); both branches are ported.
Shrunk: scikit-learn's 8x8 digits resized (bilinear) to 32x32 (1,437 images) instead of MNIST;
img_size 32 as the script (init_size 8, ds_size 2: at 16x16 the last BatchNorm sees 1x1 maps, the
real and the fake batch are each normalised to the same mean and the relativistic discriminator
cannot learn at all); generator width C = 16 instead of 128; the discriminator's filters
8/16/32/64 instead of 16/32/64/128; latent_dim 32 instead of 100; 12 epochs (264 steps) instead
of 200; no image saving; CPU.
Measure only (not in the program): the Fréchet distance, in pixel space, between 1,024
generated images (drawn in the generator's training mode, as the script's saved samples are)
and the 1,437 training images, both average-pooled to 8x8 (64 features).

nndx, as the author would add it: two models, two optimizers, so two Monitors:
``nndx.Monitor(generator, optimizer_G)`` logging ``g_loss`` and ``nndx.Monitor(discriminator,
optimizer_D)`` logging ``d_loss`` each batch (where the script prints them); a preflight
``nndx.probe`` of each before the loop on the first batch: the generator on ``(z, valid)`` with
the generator loss as a function of its images (``generator_loss(gen_imgs, valid)`` against a
fixed batch of real predictions: the loop's own code), the discriminator on the real batch and a
detached fake batch stacked, with targets ``valid``/``fake`` and the loop's relativistic
discriminator loss over the two halves; after training ``nndx.probe(..., monitor=mon)`` on the
same batches and ``nndx.diagnose`` for each, read together.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import linalg
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "relativistic_gan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/relativistic_gan/relativistic_gan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script with issue #52's fix (the overwriting g_loss line removed); shrunk: 32x32 "
                "digits, narrower nets, 12 epochs"),
        Variant(
            "d_zero_grad_missing",
            "optimizer_D.zero_grad() left out of the discriminator step: each d_loss.backward() adds to the "
            "discriminator's gradients of every batch before, and Adam steps the discriminator along that "
            "ever-growing sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/Project-MONAI/GenerativeModels/issues/102",
             "https://github.com/Adversarial-Deep-Learning/code-soup/issues/69"),
            Measure("fid_pixels", "pixel-space Fréchet distance of the generated images to the real ones "
                    "(8x8 pooled), 1.5x the healthy run's or more: 10.78 against 4.48 on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "d_stepped_by_optimizer_G",
            "the discriminator step calls optimizer_G.zero_grad() / optimizer_G.step() instead of optimizer_D's "
            "(a copy-paste of the generator block): d_loss's gradients reach the discriminator's .grad but no "
            "optimizer ever steps the discriminator, so the generator trains against a fixed random critic",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/85",
             "https://github.com/Lornatang/ESRGAN-PyTorch/issues/39",
             "https://github.com/zhaoyuzhi/deepfillv2/pull/3"),
            Measure("fid_pixels", "pixel-space Fréchet distance of the generated images to the real ones "
                    "(8x8 pooled), 2x the healthy run's or more: 29.95 against 4.48 on seed 0",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
    )
}

OPT = {"n_epochs": 12, "batch_size": 64, "lr": 0.0002, "b1": 0.5, "b2": 0.999, "latent_dim": 32, "img_size": 32,
       "channels": 1, "rel_avg_gan": False}  # fmt: skip
G_WIDTH = 16
D_FILTERS = (8, 16, 32, 64)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.init_size = OPT["img_size"] // 4
        self.l1 = nn.Sequential(nn.Linear(OPT["latent_dim"], G_WIDTH * self.init_size**2))
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(G_WIDTH),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(G_WIDTH, G_WIDTH, 3, stride=1, padding=1),
            nn.BatchNorm2d(G_WIDTH, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(G_WIDTH, G_WIDTH // 2, 3, stride=1, padding=1),
            nn.BatchNorm2d(G_WIDTH // 2, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(G_WIDTH // 2, OPT["channels"], 3, stride=1, padding=1),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z)
        out = out.view(out.shape[0], G_WIDTH, self.init_size, self.init_size)
        return self.conv_blocks(out)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def discriminator_block(in_filters: int, out_filters: int, bn: bool = True) -> list[nn.Module]:
            block = [nn.Conv2d(in_filters, out_filters, 3, 2, 1), nn.LeakyReLU(0.2, inplace=True), nn.Dropout2d(0.25)]
            if bn:
                block.append(nn.BatchNorm2d(out_filters, 0.8))
            return block

        f1, f2, f3, f4 = D_FILTERS
        self.model = nn.Sequential(
            *discriminator_block(OPT["channels"], f1, bn=False),
            *discriminator_block(f1, f2),
            *discriminator_block(f2, f3),
            *discriminator_block(f3, f4),
        )
        ds_size = OPT["img_size"] // 2**4
        self.adv_layer = nn.Sequential(nn.Linear(f4 * ds_size**2, 1))

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        out = self.model(img)
        out = out.view(out.shape[0], -1)
        return self.adv_layer(out)


def fid_pixels(fake: torch.Tensor, real: torch.Tensor) -> float:
    """Fréchet distance between two image sets, on 8x8 average-pooled pixels."""
    a = nn.functional.adaptive_avg_pool2d(fake, 8).flatten(1).double().numpy()
    b = nn.functional.adaptive_avg_pool2d(real, 8).flatten(1).double().numpy()
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean, _ = linalg.sqrtm(s1 @ s2, disp=False)
    covmean = covmean.real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2.0 * np.trace(covmean))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    torch.manual_seed(seed)
    np.random.seed(seed)
    d_uses_opt_g = variant == "d_stepped_by_optimizer_G"
    d_zero_grad = variant != "d_zero_grad_missing"

    adversarial_loss = torch.nn.BCEWithLogitsLoss()
    generator = Generator()
    discriminator = Discriminator()

    tr_raw, _, _, _ = digits.digit_images(seed=seed)
    images = (digits.upscaled(tr_raw, opt["img_size"]) - 0.5) / 0.5  # Resize, ToTensor, Normalize([0.5], [0.5])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=opt["batch_size"],
                                         shuffle=True)  # fmt: skip

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))
    Tensor = torch.FloatTensor

    def generator_loss(gen_imgs: torch.Tensor, valid: torch.Tensor, real_pred: torch.Tensor) -> torch.Tensor:
        fake_pred = discriminator(gen_imgs)
        if opt["rel_avg_gan"]:
            g_loss = adversarial_loss(fake_pred - real_pred.mean(0, keepdim=True), valid)
        else:
            g_loss = adversarial_loss(fake_pred - real_pred, valid)
        return g_loss

    def discriminator_loss(real_pred: torch.Tensor, fake_pred: torch.Tensor, valid: torch.Tensor,
                           fake: torch.Tensor) -> torch.Tensor:  # fmt: skip
        if opt["rel_avg_gan"]:
            real_loss = adversarial_loss(real_pred - fake_pred.mean(0, keepdim=True), valid)
            fake_loss = adversarial_loss(fake_pred - real_pred.mean(0, keepdim=True), fake)
        else:
            real_loss = adversarial_loss(real_pred - fake_pred, valid)
            fake_loss = adversarial_loss(fake_pred - real_pred, fake)
        return (real_loss + fake_loss) / 2

    # ---- nndx, as the author adds it: the first batch, each net's loss as a function of its output
    with torch.random.fork_rng():
        state = np.random.get_state()
        (probe_real,) = next(iter(loader))
        probe_z = Tensor(np.random.normal(0, 1, (probe_real.shape[0], opt["latent_dim"])))
        np.random.set_state(state)
        n = probe_real.shape[0]
        probe_valid, probe_fake = Tensor(n, 1).fill_(1.0), Tensor(n, 1).fill_(0.0)
        with torch.no_grad():
            probe_real_pred = discriminator(probe_real)
            probe_gen = generator(probe_z)

    def g_loss_fn(gen_imgs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return generator_loss(gen_imgs, valid, probe_real_pred)

    def d_loss_fn(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        half = pred.shape[0] // 2
        return discriminator_loss(pred[:half], pred[half:], target[:half], target[half:])

    g_batch = (probe_z, probe_valid)
    d_batch = (torch.cat([probe_real, probe_gen]), torch.cat([probe_valid, probe_fake]))
    nx.preflight(generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    nx.preflight(discriminator, d_batch, d_loss_fn, optimizer=optimizer_D)
    mon_G = nx.monitor(generator, optimizer_G, every=10)
    mon_D = nx.monitor(discriminator, optimizer_D, every=10)

    g_losses, d_losses = [], []
    for _epoch in range(opt["n_epochs"]):
        for _i, (imgs,) in enumerate(loader):
            valid = Tensor(imgs.shape[0], 1).fill_(1.0)
            fake = Tensor(imgs.shape[0], 1).fill_(0.0)
            real_imgs = imgs.type(Tensor)

            # -----------------  Train Generator
            optimizer_G.zero_grad()
            z = Tensor(np.random.normal(0, 1, (imgs.shape[0], opt["latent_dim"])))
            gen_imgs = generator(z)
            real_pred = discriminator(real_imgs).detach()
            g_loss = generator_loss(gen_imgs, valid, real_pred)
            g_loss.backward()
            optimizer_G.step()

            # -----------------  Train Discriminator
            d_opt = optimizer_G if d_uses_opt_g else optimizer_D
            if d_zero_grad:
                d_opt.zero_grad()
            real_pred = discriminator(real_imgs)
            fake_pred = discriminator(gen_imgs.detach())
            d_loss = discriminator_loss(real_pred, fake_pred, valid, fake)
            d_loss.backward()
            d_opt.step()

            nx.timed(lambda: mon_G.log(g_loss))
            nx.timed(lambda: mon_D.log(d_loss))
            g_losses.append(g_loss.item())
            d_losses.append(d_loss.item())

    nx.finish(mon_G, generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    nx.finish(mon_D, discriminator, d_batch, d_loss_fn, optimizer=optimizer_D)

    # ---- measure only
    gen = torch.Generator().manual_seed(1000 + seed)
    samples = []
    with torch.no_grad():
        for _ in range(16):
            samples.append(generator(torch.randn(64, opt["latent_dim"], generator=gen)))
    fake_all = torch.cat(samples)
    return {
        "fid_pixels": fid_pixels(fake_all, images),
        "g_loss_last_epoch": float(np.mean(g_losses[-len(loader):])),
        "d_loss_last_epoch": float(np.mean(d_losses[-len(loader):])),
        "fake_pixel_std": float(fake_all.std()),
    }

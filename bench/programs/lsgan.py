"""Port of eriklindernoren/PyTorch-GAN's LSGAN: a DCGAN-like generator (Linear -> 128-channel
4x4 map -> Upsample/Conv/BatchNorm/LeakyReLU twice -> Conv -> Tanh) against a strided-conv
discriminator whose linear output is trained with the least-squares (MSE) adversarial loss.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/lsgan/lsgan.py`` at commit
36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik Linder-Norén). Written
anew from the facts of that file; no code copied.

Kept: ``weights_init_normal`` (Conv weights N(0, 0.02); BatchNorm weights N(1, 0.02), bias 0;
the Linear layers keep PyTorch's default init, as in the original, whose class-name test only
matches "Conv" and "BatchNorm"); the generator (``init_size = img_size // 4``; ``l1 =
Sequential(Linear(latent_dim, 128 * init_size**2))``; view to (N, 128, init, init);
``Upsample(2)``, ``Conv2d(128, 128, 3, 1, 1)``, ``BatchNorm2d(128, 0.8)`` (0.8 is the eps, as
the original passes it), ``LeakyReLU(0.2, inplace=True)``, ``Upsample(2)``, ``Conv2d(128, 64, 3,
1, 1)``, ``BatchNorm2d(64, 0.8)``, LeakyReLU, ``Conv2d(64, channels, 3, 1, 1)``, ``Tanh``); the
discriminator (four blocks ``Conv2d(in, out, 3, 2, 1)``, ``LeakyReLU(0.2, inplace=True)``,
``Dropout2d(0.25)``, then ``BatchNorm2d(out, 0.8)`` except in the first block, 16/32/64/128
filters; flattened to ``adv_layer = Linear(128 * ds_size**2, 1)``, no sigmoid);
``adversarial_loss = MSELoss()``; ``Adam(lr=0.0002, betas=(0.5, 0.999))`` for each net; the
loop: per batch ``valid`` = ones and ``fake`` = zeros of shape (N, 1); the generator step first
(``optimizer_G.zero_grad()``, ``z = np.random.normal(0, 1, (N, latent_dim))``, ``gen_imgs =
generator(z)``, ``g_loss = adversarial_loss(discriminator(gen_imgs), valid)``, backward,
step), then the discriminator step (``optimizer_D.zero_grad()``, ``real_loss`` on the real
images against ``valid``, ``fake_loss`` on ``gen_imgs.detach()`` against ``fake``, ``d_loss =
0.5 * (real_loss + fake_loss)``, backward, step); both nets in train mode throughout (the
original never calls eval); the data pipeline ``Resize(img_size)``, ``ToTensor``,
``Normalize([0.5], [0.5])`` (pixels in [-1, 1]) under a shuffled loader of batch 64.
Shrunk/replaced: scikit-learn's 8x8 digits (1,437 training images) upsampled (bilinear) to
32x32 (the original's ``img_size``, so ``ds_size = 2``) in place of MNIST; 16x16 was tried and
dropped: with ``ds_size = 1`` the last BatchNorm, in train mode over an all-real or all-fake
batch, makes the discriminator's batch-mean output its bias whatever the images, and nothing
trains; the generator's
widths 128/64 cut to 32/16 and ``latent_dim`` 100 to 32 (CPU seconds); 8 epochs (184 steps)
instead of 200 epochs; no ``save_image``.
Measure only (not in the program): 600 samples of the trained generator (still in train mode,
as the original samples) against the 360 held-out real digits: the Fréchet distance between
Gaussians fitted to their 20-component PCA projections (PCA fitted on the real training
images), and the share of samples that a logistic-regression classifier trained on the real
16x16 digits assigns with probability > 0.9 to one digit.

nndx, as the author would add it: two models, each with its own optimizer and loss. A
preflight ``nndx.probe`` of the generator on a batch ``(z, valid)`` with ``loss_fn(gen_imgs,
valid) = adversarial_loss(discriminator(gen_imgs), valid)`` (the generator's loss goes through
the discriminator), and of the discriminator on ``(cat(real, generator(z).detach()),
cat(valid, fake))`` with ``adversarial_loss`` (``d_loss`` is that MSE: both halves have the same
size); ``nndx.Monitor(generator, optimizer_G)`` and ``nndx.Monitor(discriminator,
optimizer_D)`` around the loop, ``g_loss`` and ``d_loss`` logged where the original prints
them; after training ``nndx.probe(..., monitor=mon)`` for each net on the same kind of batch
drawn afresh from the trained generator, and ``nndx.diagnose``; the author reads both
diagnoses, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lsgan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/lsgan/lsgan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "lsgan.py as published (shrunk: 32x32 digits, generator widths 32/16, 8 epochs)"),
        Variant(
            "generator_fake_target",
            "the generator's loss is taken against the 'fake' ground truth, g_loss = adversarial_loss("
            "discriminator(gen_imgs), fake), instead of 'valid': the generator is trained to make the "
            "discriminator call its samples fake, i.e. to help the discriminator, and never moves toward the data",
            (C.WRONG_LOSS,),
            ("https://github.com/ptran1203/pytorch-animeGAN/issues/17",
             "https://github.com/keras-team/keras-io/issues/284",
             "https://github.com/yunjey/pytorch-tutorial/issues/45"),
            Measure("frechet_pca", "Fréchet distance (PCA-20) of the samples to held-out digits at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "no_discriminator_zero_grad",
            "optimizer_D.zero_grad() left out of the discriminator step: the discriminator's .grad keeps "
            "accumulating every earlier discriminator step and the gradient that each generator step's "
            "g_loss.backward() leaves in it (pushing D's output on fakes toward 'valid'), so optimizer_D "
            "steps along a running sum of stale, partly adversarial gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/591"),
            Measure("frechet_pca", "Fréchet distance (PCA-20) of the samples to held-out digits at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

OPT = {"n_epochs": 8, "batch_size": 64, "lr": 0.0002, "b1": 0.5, "b2": 0.999, "latent_dim": 32, "img_size": 32,
       "channels": 1}  # fmt: skip
G_WIDTHS = (32, 16)  # the original's 128 / 64
N_SAMPLES, PCA_DIM = 600, 20


def weights_init_normal(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        w1, w2 = G_WIDTHS
        self.init_size = OPT["img_size"] // 4
        self.l1 = nn.Sequential(nn.Linear(OPT["latent_dim"], w1 * self.init_size**2))
        self.conv_blocks = nn.Sequential(
            nn.Upsample(scale_factor=2),
            nn.Conv2d(w1, w1, 3, stride=1, padding=1),
            nn.BatchNorm2d(w1, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(w1, w2, 3, stride=1, padding=1),
            nn.BatchNorm2d(w2, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(w2, OPT["channels"], 3, stride=1, padding=1),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z)
        out = out.view(out.shape[0], G_WIDTHS[0], self.init_size, self.init_size)
        return self.conv_blocks(out)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def discriminator_block(in_filters: int, out_filters: int, bn: bool = True) -> list[nn.Module]:
            block = [nn.Conv2d(in_filters, out_filters, 3, 2, 1), nn.LeakyReLU(0.2, inplace=True), nn.Dropout2d(0.25)]
            if bn:
                block.append(nn.BatchNorm2d(out_filters, 0.8))
            return block

        self.model = nn.Sequential(
            *discriminator_block(OPT["channels"], 16, bn=False),
            *discriminator_block(16, 32),
            *discriminator_block(32, 64),
            *discriminator_block(64, 128),
        )
        ds_size = OPT["img_size"] // 2**4
        self.adv_layer = nn.Linear(128 * ds_size**2, 1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        out = self.model(img)
        out = out.view(out.shape[0], -1)
        return self.adv_layer(out)


# --------------------------------------------------------------------------- measure only


def _quality(samples: np.ndarray, train_real: np.ndarray, train_labels: np.ndarray,
             test_real: np.ndarray) -> tuple[float, float]:  # fmt: skip
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression

    pca = PCA(n_components=PCA_DIM, random_state=0).fit(train_real)
    a, b = pca.transform(samples).astype(np.float64), pca.transform(test_real).astype(np.float64)
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    # trace sqrt(cov_a cov_b) from the eigenvalues of the product (real, non-negative up to rounding)
    eig = np.linalg.eigvals(cov_a @ cov_b)
    tr_sqrt = float(np.sqrt(np.clip(eig.real, 0, None)).sum())
    fd = float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * tr_sqrt)
    clf = LogisticRegression(max_iter=2000, C=0.5).fit(train_real, train_labels)
    confident = float((clf.predict_proba(samples).max(1) > 0.9).mean())
    return fd, confident


# --------------------------------------------------------------------------- lsgan.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    opt = OPT
    latent_dim = opt["latent_dim"]

    adversarial_loss = torch.nn.MSELoss()
    generator = Generator()
    discriminator = Discriminator()
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    tr_raw, tr_y, te_raw, _te_y = digits.digit_images(seed=seed)
    x_train = (digits.upscaled(tr_raw, opt["img_size"]) - 0.5) / 0.5  # Resize, ToTensor, Normalize([0.5], [0.5])
    x_test = (digits.upscaled(te_raw, opt["img_size"]) - 0.5) / 0.5
    dataloader = DataLoader(TensorDataset(x_train, tr_y), batch_size=opt["batch_size"], shuffle=True)

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))

    def g_loss_fn(gen_imgs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return adversarial_loss(discriminator(gen_imgs), valid)

    probe_rng = np.random.RandomState(10_000 + seed)  # the probe batches leave the program's noise stream alone

    def probe_batches() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        n = opt["batch_size"]
        z = torch.tensor(probe_rng.normal(0, 1, (n, latent_dim)), dtype=torch.float32)
        valid, fake = torch.ones(n, 1), torch.zeros(n, 1)
        gen = generator(z).detach()
        return (z, valid), (torch.cat([x_train[:n], gen]), torch.cat([valid, fake]))

    g_batch, d_batch = probe_batches()
    nx.preflight(generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    nx.preflight(discriminator, d_batch, adversarial_loss, optimizer=optimizer_D)
    mon_G = nx.monitor(generator, optimizer_G, every=10)
    mon_D = nx.monitor(discriminator, optimizer_D, every=10)

    d_losses, g_losses = [], []
    for _epoch in range(opt["n_epochs"]):
        for _i, (imgs, _) in enumerate(dataloader):
            valid = torch.ones(imgs.shape[0], 1)
            fake = torch.zeros(imgs.shape[0], 1)
            real_imgs = imgs.float()

            #  Train Generator
            optimizer_G.zero_grad()
            z = torch.tensor(np.random.normal(0, 1, (imgs.shape[0], latent_dim)), dtype=torch.float32)
            gen_imgs = generator(z)
            g_target = fake if variant == "generator_fake_target" else valid
            g_loss = adversarial_loss(discriminator(gen_imgs), g_target)
            g_loss.backward()
            optimizer_G.step()

            #  Train Discriminator
            if variant != "no_discriminator_zero_grad":
                optimizer_D.zero_grad()
            real_loss = adversarial_loss(discriminator(real_imgs), valid)
            fake_loss = adversarial_loss(discriminator(gen_imgs.detach()), fake)
            d_loss = 0.5 * (real_loss + fake_loss)
            d_loss.backward()
            optimizer_D.step()

            # where the original prints "[D loss: %f] [G loss: %f]"
            nx.timed(lambda: mon_D.log(d_loss))  # noqa: B023
            nx.timed(lambda: mon_G.log(g_loss))  # noqa: B023
            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())

    g_batch, d_batch = probe_batches()
    nx.finish(mon_G, generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    nx.finish(mon_D, discriminator, d_batch, adversarial_loss, optimizer=optimizer_D)

    sample_rng = np.random.RandomState(20_000 + seed)
    with torch.no_grad():
        z = torch.tensor(sample_rng.normal(0, 1, (N_SAMPLES, latent_dim)), dtype=torch.float32)
        samples = generator(z).reshape(N_SAMPLES, -1).numpy()
    flat_train = x_train.reshape(len(x_train), -1).numpy()
    fd, confident = _quality(samples, flat_train, tr_y.numpy(), x_test.reshape(len(x_test), -1).numpy())
    tail = max(1, len(d_losses) // 10)
    return {"frechet_pca": fd, "confident_fraction": confident, "final_d_loss": float(np.mean(d_losses[-tail:])),
            "final_g_loss": float(np.mean(g_losses[-tail:])), "sample_std": float(samples.std())}  # fmt: skip

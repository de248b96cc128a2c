"""Port of eriklindernoren/PyTorch-GAN's EBGAN: a convolutional generator against an
auto-encoder discriminator whose energy is its reconstruction error, with a margin on the
fakes' energy and the pull-away term on the discriminator's embedding of the fakes.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/ebgan/ebgan.py`` at commit
36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik Linder-Norén). Written
anew from the facts of that file; no code copied.

Kept: ``weights_init_normal`` (``Conv*`` weights N(0, 0.02); ``BatchNorm2d`` weights N(1, 0.02),
bias 0) applied to both nets; the ``Generator`` (``Linear(latent_dim, 128 * init_size**2)``,
reshaped, ``Upsample(2)``, ``Conv2d(128, 128, 3, 1, 1)``, ``BatchNorm2d(128, 0.8)``,
``LeakyReLU(0.2, inplace=True)``, ``Upsample(2)``, ``Conv2d(128, 64, 3, 1, 1)``,
``BatchNorm2d(64, 0.8)``, ``LeakyReLU(0.2, inplace=True)``, ``Conv2d(64, channels, 3, 1, 1)``,
``Tanh``; the 0.8 is BatchNorm's eps, as in the original); the ``Discriminator`` (``down``:
``Conv2d(channels, 64, 3, 2, 1)``, ``ReLU``; ``embedding``: ``Linear(64 * (img_size//2)**2, 32)``;
``fc``: ``BatchNorm1d(32, 0.8)``, ``ReLU(inplace=True)``, ``Linear(32, down_dim)``,
``BatchNorm1d(down_dim)``, ``ReLU(inplace=True)``; ``up``: ``Upsample(2)``, ``Conv2d(64,
channels, 3, 1, 1)``; returns ``(out, embedding)``); ``pixelwise_loss = nn.MSELoss()``;
``pullaway_loss`` (row norms by ``sqrt(sum(e**2, -1, keepdim=True))``, cosine-similarity matrix,
``(sum - batch_size) / (batch_size * (batch_size - 1))``); ``lambda_pt = 0.1``, ``margin =
max(1, batch_size / 64)``; Adam at ``lr = 0.0002``, ``betas = (0.5, 0.999)`` for each net; data
through ``Resize``, ``ToTensor``, ``Normalize([0.5], [0.5])``; the loop: per batch the
generator step (``optimizer_G.zero_grad()``, ``z`` from ``np.random.normal(0, 1, (n,
latent_dim))``, ``gen_imgs = generator(z)``, ``recon_imgs, img_embeddings =
discriminator(gen_imgs)``, ``g_loss = pixelwise_loss(recon_imgs, gen_imgs.detach()) + lambda_pt
* pullaway_loss(img_embeddings)``, backward, step) then the discriminator step
(``optimizer_D.zero_grad()``, reconstructions of the real and of ``gen_imgs.detach()``,
``d_loss = d_loss_real`` and ``d_loss += margin - d_loss_fake`` when ``(margin -
d_loss_fake.data).item() > 0``, backward, step).
Shrunk: scikit-learn's 8x8 digits resized (bilinear) to 16x16 (1,437 train / 360 test) instead
of MNIST at 32x32; the widths ``latent_dim`` 62 -> 16, the generator's 128/64 channels -> 32/16,
the discriminator's 64 channels -> 16 (its embedding stays 32); 12 epochs of batch 64 (276
steps) instead of 200 epochs; no image saving, no print; CPU.
Measure only (not in the program): after training (nets in eval mode), 256 generated images: their
diversity, the per-pixel standard deviation over the samples averaged over the pixels
(``gen_std``), and each one's mean squared distance to its nearest training image
(``gen_nn_dist``, reported only: at this size the healthy generator is not yet closer to the
digits than the untrained one), and the discriminator's reconstruction
error on the 360 held-out real images in eval mode (``test_recon``).

nndx, as the author would add it: a preflight ``nndx.probe`` per net before the loop:
``generator`` on a batch of noise (a zeros placeholder as target) with the generator's loss as
the script computes it (the discriminator's reconstruction error of the generated images plus
the pull-away term); ``discriminator`` on a batch of real images, the images their own target,
with the reconstruction loss of its first output. ``nndx.Monitor(generator, optimizer_G)`` and
``nndx.Monitor(discriminator, optimizer_D)`` around the loop, ``g_loss`` / ``d_loss`` logged
where the script prints them; after training ``nndx.probe(..., monitor=mon)`` for each net on
fresh batches of the same kind, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ebgan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/ebgan/ebgan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the EBGAN script as published (shrunk: 16x16 digits, narrower nets, 12 epochs)"),
        Variant(
            "no_discriminator_zero_grad",
            "optimizer_D.zero_grad() left out of the discriminator step: the discriminator's gradients pile up "
            "across steps, including the ones the generator's loss sends into it, and Adam follows their sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25"),
            Measure("test_recon", "the discriminator's held-out reconstruction error at least 1.5x the healthy "
                    "run's: 1.31 against 0.29 healthy on seed 0", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "generator_step_on_detached_fake",
            "the generator step feeds discriminator(gen_imgs.detach()) (the detach moved from the target to the "
            "input, as issue #18 of this repository asks about): g_loss reaches no generator weight, "
            "optimizer_G.step() never moves the generator",
            (C.DETACHED_GRAPH,),
            ("https://github.com/eriklindernoren/PyTorch-GAN/issues/18",
             "https://github.com/tamarott/SinGAN/pull/117",
             "https://github.com/wangle53/CSA-CDGAN/issues/5"),
            Measure("gen_std", "diversity of the generated images (per-pixel std over 256 samples, averaged) at "
                    "most half the healthy run's: 0.0071 against 0.039 healthy on seed 0 (the untrained "
                    "generator's "
                    "near-constant output)", lambda healthy, buggy: not buggy > 0.5 * healthy),
        ),
    )
}

OPT = {"n_epochs": 12, "batch_size": 64, "lr": 0.0002, "b1": 0.5, "b2": 0.999, "latent_dim": 16,
       "img_size": 16, "channels": 1}  # fmt: skip
G_CH, G_CH2, D_CH, EMB = 32, 16, 16, 32


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm2d") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


class Generator(nn.Module):
    def __init__(self, opt):
        super().__init__()
        self.init_size = opt["img_size"] // 4
        self.l1 = nn.Sequential(nn.Linear(opt["latent_dim"], G_CH * self.init_size**2))
        self.conv_blocks = nn.Sequential(
            nn.Upsample(scale_factor=2),
            nn.Conv2d(G_CH, G_CH, 3, stride=1, padding=1),
            nn.BatchNorm2d(G_CH, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(G_CH, G_CH2, 3, stride=1, padding=1),
            nn.BatchNorm2d(G_CH2, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(G_CH2, opt["channels"], 3, stride=1, padding=1),
            nn.Tanh(),
        )

    def forward(self, noise):
        out = self.l1(noise)
        out = out.view(out.shape[0], G_CH, self.init_size, self.init_size)
        img = self.conv_blocks(out)
        return img


class Discriminator(nn.Module):
    def __init__(self, opt):
        super().__init__()
        # Upsampling
        self.down = nn.Sequential(nn.Conv2d(opt["channels"], D_CH, 3, 2, 1), nn.ReLU())
        # Fully-connected layers
        self.down_size = opt["img_size"] // 2
        down_dim = D_CH * (opt["img_size"] // 2) ** 2
        self.embedding = nn.Linear(down_dim, EMB)
        self.fc = nn.Sequential(
            nn.BatchNorm1d(EMB, 0.8),
            nn.ReLU(inplace=True),
            nn.Linear(EMB, down_dim),
            nn.BatchNorm1d(down_dim),
            nn.ReLU(inplace=True),
        )
        # Upsampling
        self.up = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(D_CH, opt["channels"], 3, 1, 1))

    def forward(self, img):
        out = self.down(img)
        embedding = self.embedding(out.view(out.size(0), -1))
        out = self.fc(embedding)
        out = self.up(out.view(out.size(0), D_CH, self.down_size, self.down_size))
        return out, embedding


def pullaway_loss(embeddings):
    norm = torch.sqrt(torch.sum(embeddings**2, -1, keepdim=True))
    normalized_emb = embeddings / norm
    similarity = torch.matmul(normalized_emb, normalized_emb.transpose(1, 0))
    batch_size = embeddings.size(0)
    loss_pt = (torch.sum(similarity) - batch_size) / (batch_size * (batch_size - 1))
    return loss_pt


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    torch.manual_seed(seed)
    np.random.seed(seed)
    zero_grad_D = variant != "no_discriminator_zero_grad"
    detach_g_input = variant == "generator_step_on_detached_fake"

    # Reconstruction loss of AE
    pixelwise_loss = nn.MSELoss()

    # Initialize generator and discriminator
    generator = Generator(opt)
    discriminator = Discriminator(opt)
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    # Configure data loader: Resize(img_size), ToTensor(), Normalize([0.5], [0.5])
    tr_raw, tr_y, te_raw, _te_y = digits.digit_images(seed=seed)
    x_train = (digits.upscaled(tr_raw, opt["img_size"]) - 0.5) / 0.5
    x_test = (digits.upscaled(te_raw, opt["img_size"]) - 0.5) / 0.5
    dataloader = DataLoader(TensorDataset(x_train, tr_y), batch_size=opt["batch_size"], shuffle=True)

    # Optimizers
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))

    # BEGAN hyper parameters
    lambda_pt = 0.1
    margin = max(1, opt["batch_size"] / 64.0)

    # nndx: the losses as the script computes them, and probe batches from their own random stream
    def g_loss_fn(gen_imgs, _target):
        recon_imgs, img_embeddings = discriminator(gen_imgs)
        return pixelwise_loss(recon_imgs, gen_imgs.detach()) + lambda_pt * pullaway_loss(img_embeddings)

    def d_loss_fn(outputs, imgs):
        return pixelwise_loss(outputs[0], imgs)

    probe_rng = np.random.RandomState(10_000 + seed)

    def probe_batches():
        n = opt["batch_size"]
        z = torch.tensor(probe_rng.normal(0, 1, (n, opt["latent_dim"])), dtype=torch.float32)
        real = x_train[torch.from_numpy(probe_rng.choice(len(x_train), n, replace=False))]
        return (z, torch.zeros(n)), (real, real)

    g_batch, d_batch = probe_batches()
    nx.preflight(generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    nx.preflight(discriminator, d_batch, d_loss_fn, optimizer=optimizer_D)
    mon_G = nx.monitor(generator, optimizer_G, every=10)
    mon_D = nx.monitor(discriminator, optimizer_D, every=10)

    # ----------
    #  Training
    # ----------
    d_losses, g_losses = [], []
    for _epoch in range(opt["n_epochs"]):
        for _i, (imgs, _) in enumerate(dataloader):
            # Configure input
            real_imgs = imgs.float()

            #  Train Generator
            optimizer_G.zero_grad()
            # Sample noise as generator input
            z = torch.tensor(np.random.normal(0, 1, (imgs.shape[0], opt["latent_dim"])), dtype=torch.float32)
            # Generate a batch of images
            gen_imgs = generator(z)
            recon_imgs, img_embeddings = discriminator(gen_imgs.detach() if detach_g_input else gen_imgs)
            # Loss measures generator's ability to fool the discriminator
            g_loss = pixelwise_loss(recon_imgs, gen_imgs.detach()) + lambda_pt * pullaway_loss(img_embeddings)
            g_loss.backward()
            optimizer_G.step()

            #  Train Discriminator
            if zero_grad_D:
                optimizer_D.zero_grad()
            # Measure discriminator's ability to classify real from generated samples
            real_recon, _ = discriminator(real_imgs)
            fake_recon, _ = discriminator(gen_imgs.detach())
            d_loss_real = pixelwise_loss(real_recon, real_imgs)
            d_loss_fake = pixelwise_loss(fake_recon, gen_imgs.detach())
            d_loss = d_loss_real
            if (margin - d_loss_fake.data).item() > 0:
                d_loss += margin - d_loss_fake
            d_loss.backward()
            optimizer_D.step()

            # Log Progress (where the script prints "[D loss: %f] [G loss: %f]")
            nx.timed(lambda: mon_D.log(d_loss))  # noqa: B023
            nx.timed(lambda: mon_G.log(g_loss))  # noqa: B023
            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())

    g_batch, d_batch = probe_batches()
    nx.finish(mon_G, generator, g_batch, g_loss_fn, optimizer=optimizer_G)
    nx.finish(mon_D, discriminator, d_batch, d_loss_fn, optimizer=optimizer_D)

    # measure only: sample quality and the discriminator's held-out reconstruction
    generator.eval()
    discriminator.eval()
    sample_rng = np.random.RandomState(20_000 + seed)
    with torch.no_grad():
        z = torch.tensor(sample_rng.normal(0, 1, (256, opt["latent_dim"])), dtype=torch.float32)
        samples = generator(z).flatten(1)
        dists = torch.cdist(samples, x_train.flatten(1)) ** 2 / samples.shape[1]
        gen_nn_dist = dists.min(1).values.mean().item()
        gen_std = samples.std(0).mean().item()
        test_recon = pixelwise_loss(discriminator(x_test)[0], x_test).item()
    return {"gen_std": gen_std, "gen_nn_dist": gen_nn_dist, "test_recon": test_recon, "d_loss_last": float(np.mean(d_losses[-20:])),
            "g_loss_last": float(np.mean(g_losses[-20:]))}  # fmt: skip

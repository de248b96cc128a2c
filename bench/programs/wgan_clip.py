"""Port of eriklindernoren's PyTorch-GAN ``implementations/wgan/wgan.py``: the original
Wasserstein GAN (MLP generator and critic, the critic's weights clipped to [-c, c] after each
of its steps, the generator trained every n_critic batches, RMSprop).

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/wgan/wgan.py`` at the
repository's HEAD 36d3c77e5ff20ebe0aeefd322326a134a279b93e (the file last changed in
c5d6be170013db8975d96806084df573d87e5d26; MIT, Copyright (c) 2018 Erik Linder-Norén).
Written anew from the facts of that file; no code copied.

Kept: the generator, an ``nn.Sequential`` of ``block``s (``Linear`` -> ``BatchNorm1d(out_feat,
0.8)`` except the first -> ``LeakyReLU(0.2, inplace=True)``), then ``Linear`` to the image and
``Tanh``, viewed as ``(batch, *img_shape)``; the critic, ``img.view(batch, -1)`` -> ``Linear``
-> ``LeakyReLU(0.2, inplace=True)`` -> ``Linear`` -> ``LeakyReLU(0.2, inplace=True)`` ->
``Linear(.., 1)``, no sigmoid; PyTorch's default init; one ``RMSprop(lr=0.00005)`` per model;
``clip_value = 0.01``, ``n_critic = 5``; images through ``ToTensor`` + ``Normalize([0.5],
[0.5])`` and a shuffled loader of batch 64 (partial last batch kept); ``z`` drawn with
``np.random.normal``; each batch ``optimizer_D.zero_grad()``, ``fake_imgs =
generator(z).detach()``, ``loss_D = -mean(D(real)) + mean(D(fake))``, ``backward``,
``optimizer_D.step()``, then every critic parameter ``p.data.clamp_(-clip_value,
clip_value)``; when ``i % n_critic == 0`` (``i`` restarting each epoch)
``optimizer_G.zero_grad()``, ``gen_imgs = generator(z)`` with the same ``z``, ``loss_G =
-mean(D(gen_imgs))``, ``backward``, ``optimizer_G.step()``.
Shrunk: scikit-learn's 8x8 digits (1,797 images, 64 pixels) instead of 28x28 MNIST;
``latent_dim`` 16 instead of 100; generator widths 32-64-128-256 instead of 128-256-512-1024,
critic widths 128-64 instead of 512-256; 60 epochs of 29 batches instead of 200 of 938 (the
published ``lr`` 5e-5 kept); no saved images.
Measure only (not in the program): 1,000 generated images (the training-mode generator, as
the program saves them) mapped to [0, 1] against the real digits: their mean distance to
the nearest real digit (per pixel) and the gap between the mean generated and mean real image.

nndx, as a GAN author would add it (like the WGAN-GP port): a preflight ``nndx.probe`` of
the critic, the one model with a loss of its own, on 32 real and 32 generated images with
the critic's Wasserstein loss written as ``loss_fn(validity, is_real)``; one ``nndx.Monitor``
per model/optimizer pair, ``loss_D``/``loss_G`` logged to their Monitors; after training
``nndx.probe(discriminator, ..., monitor=monD)`` and the generator Monitor's report, each
diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "wgan_clip"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/wgan/wgan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "generator_loss_sign_flipped",
            "loss_G = torch.mean(discriminator(gen_imgs)) (the minus dropped, or backward(one) for backward(mone)): "
            "the generator minimises the critic's score and is pushed away from the real digits",
            (C.WRONG_LOSS,),
            ("https://github.com/Zeleni9/pytorch-wgan/pull/53", "https://github.com/Zeleni9/pytorch-wgan/issues/42",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/136"),
            Measure("nearest_real_distance", "generated images' mean distance to their nearest real digit, 1.2x "
                    "the healthy run's or more", lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
        Variant(
            "generator_output_detached",
            "gen_imgs = generator(z).detach() in the generator step too (the critic step's line copied): loss_G "
            "still backpropagates into the critic, but no gradient reaches the generator, which never learns",
            (C.DETACHED_GRAPH,),
            ("https://github.com/wangle53/CSA-CDGAN/issues/5", "https://github.com/eriklindernoren/PyTorch-GAN/issues/151",
             "https://github.com/heykeetae/Self-Attention-GAN/issues/48"),
            Measure("nearest_real_distance", "generated images' mean distance to their nearest real digit, 1.2x "
                    "the healthy run's or more", lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

n_epochs = 60
batch_size = 64
lr = 0.00005
latent_dim = 16
img_size = 8
channels = 1
n_critic = 5
clip_value = 0.01
img_shape = (channels, img_size, img_size)
PROBE = 32
N_SAMPLES = 1000


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def block(in_feat: int, out_feat: int, normalize: bool = True) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(latent_dim, 32, normalize=False),
            *block(32, 64),
            *block(64, 128),
            *block(128, 256),
            nn.Linear(256, int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        img = self.model(z)
        return img.view(img.shape[0], *img_shape)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 128),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(128, 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 1),
        )

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.model(img.view(img.shape[0], -1))


def critic_loss(validity: torch.Tensor, is_real: torch.Tensor) -> torch.Tensor:
    """The critic's Wasserstein loss on a mixed batch, as loss_fn(output, target)."""
    return -torch.mean(validity[is_real == 1]) + torch.mean(validity[is_real == 0])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np_rng = np.random.RandomState(seed)  # the original draws z from np.random
    train_images, train_labels, _, _ = data.digit_images(seed=seed, test_size=0)
    images_01 = data.to_tensor(train_images)  # ToTensor
    dataset = TensorDataset((images_01 - 0.5) / 0.5, train_labels)  # Normalize([0.5], [0.5])
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))

    generator = Generator()
    discriminator = Discriminator()
    optimizer_G = torch.optim.RMSprop(generator.parameters(), lr=lr)
    optimizer_D = torch.optim.RMSprop(discriminator.parameters(), lr=lr)

    with torch.no_grad():  # the preflight batch: real images and the untrained generator's
        probe_fake = generator(torch.randn(PROBE, latent_dim, generator=torch.Generator().manual_seed(seed + 1)))
    probe_batch = (torch.cat([dataset.tensors[0][:PROBE], probe_fake]),
                   torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]))  # fmt: skip
    nx.preflight(discriminator, probe_batch, critic_loss, optimizer=optimizer_D)
    monD = nx.monitor(discriminator, optimizer_D, every=10)
    monG = nx.monitor(generator, optimizer_G, every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    for epoch in range(n_epochs):
        for i, (imgs, _) in enumerate(dataloader):
            real_imgs = imgs

            # train the critic
            optimizer_D.zero_grad()
            z = torch.tensor(np_rng.normal(0, 1, (imgs.shape[0], latent_dim)), dtype=torch.float32)
            fake_imgs = generator(z).detach()
            loss_D = -torch.mean(discriminator(real_imgs)) + torch.mean(discriminator(fake_imgs))
            loss_D.backward()
            optimizer_D.step()
            monD.log(loss_D)
            d_losses.append(loss_D.item())

            for p in discriminator.parameters():  # clip the critic's weights
                p.data.clamp_(-clip_value, clip_value)

            # train the generator every n_critic iterations
            if i % n_critic == 0:
                optimizer_G.zero_grad()
                gen_imgs = generator(z).detach() if variant == "generator_output_detached" else generator(z)
                if variant == "generator_loss_sign_flipped":
                    loss_G = torch.mean(discriminator(gen_imgs))
                else:
                    loss_G = -torch.mean(discriminator(gen_imgs))
                loss_G.backward()
                optimizer_G.step()
                monG.log(loss_G)
                g_losses.append(loss_G.item())

    nx.finish(monD, discriminator, probe_batch, critic_loss, optimizer=optimizer_D)
    nx.finish(monG)
    return {
        "late_d_loss": float(np.mean(d_losses[-50:])),
        "late_g_loss": float(np.mean(g_losses[-20:])),
        **measure(generator, images_01, seed),
    }


def measure(generator: nn.Module, real_01: torch.Tensor, seed: int) -> dict[str, float]:
    """Generated images (train-mode generator, as the program saves them) against the digits."""
    rng = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        fake = generator(torch.randn(N_SAMPLES, latent_dim, generator=rng))
        shown = (fake.view(N_SAMPLES, -1) + 1) / 2  # Tanh range to [0, 1] pixels
        digits = real_01.view(len(real_01), -1)
        nearest = torch.cdist(shown, digits).min(1).values.mean() / 8.0
        mean_gap = (shown.mean(0) - digits.mean(0)).abs().mean()
    return {"nearest_real_distance": float(nearest), "mean_image_gap": float(mean_gap)}

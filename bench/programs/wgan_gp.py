"""Port of eriklindernoren's PyTorch-GAN ``implementations/wgan_gp/wgan_gp.py``: a WGAN with
gradient penalty (MLP generator and critic, n_critic critic steps per generator step).

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/wgan_gp/wgan_gp.py`` at
commit e0a8f3cd5e497805bcaab4c6111c6305afd75a15 (the file is the same at the repository's
HEAD, 36d3c77e5ff20ebe0aeefd322326a134a279b93e; MIT, Copyright (c) 2018 Erik
Linder-Norén). Written anew from the facts of that file; no code copied.

Kept: the generator, an ``nn.Sequential`` of ``block``s (``Linear`` -> ``BatchNorm1d(out_feat,
0.8)`` except the first -> ``LeakyReLU(0.2, inplace=True)``), then ``Linear`` to the image
and ``Tanh``, viewed as ``(batch, *img_shape)``; the critic, ``img.view(batch, -1)`` ->
``Linear`` -> ``LeakyReLU(0.2, inplace=True)`` -> ``Linear`` -> ``LeakyReLU(0.2,
inplace=True)`` -> ``Linear(.., 1)``, no sigmoid, no batch norm; PyTorch's default init;
``lambda_gp = 10``; one ``Adam(lr=0.0002, betas=(0.5, 0.999))`` per model; images through
``ToTensor`` + ``Normalize([0.5], [0.5])``, a shuffled loader of batch 64 (partial last
batch kept); ``z`` drawn with ``np.random.normal`` and the interpolation weights with
``np.random.random((batch, 1, 1, 1))``; ``compute_gradient_penalty``: interpolates of
``real.data`` and ``fake.data`` with ``requires_grad_(True)``, ``autograd.grad(outputs=D(x_hat),
inputs=x_hat, grad_outputs=ones, create_graph=True, retain_graph=True, only_inputs=True)[0]``
viewed as ``(batch, -1)``, ``((norm(2, dim=1) - 1) ** 2).mean()``; each batch
``optimizer_D.zero_grad()``, ``fake_imgs = generator(z)`` (not detached),
``d_loss = -mean(D(real)) + mean(D(fake)) + lambda_gp * gp``, ``d_loss.backward()``,
``optimizer_D.step()``, ``optimizer_G.zero_grad()``; every ``n_critic = 5`` batches (``i %
n_critic == 0``, ``i`` restarting each epoch) ``generator(z)`` with the same ``z``,
``g_loss = -mean(D(fake))``, ``g_loss.backward()``, ``optimizer_G.step()``.
Shrunk: scikit-learn's 8x8 digits (1,797 images, 64 pixels) instead of 28x28 MNIST;
``latent_dim`` 16 instead of 100; generator widths 32-64-128-256 instead of 128-256-512-1024,
critic widths 128-64 instead of 512-256; 60 epochs of 29 batches instead of 200 of 938.
Measure only (not in the program): the critic's gradient norm at 512 fresh interpolates
(the quantity the penalty holds at 1), the critic's score gap between real and generated
images, and 1,000 generated images (the training-mode generator, as the program saves
them) mapped to [0, 1] against the real digits.

nndx, as a GAN author would add it (like the DCGAN port): a preflight ``nndx.probe`` of the
critic, the one model with a loss of its own, on 32 real and 32 generated images with the
critic's Wasserstein loss written as ``loss_fn(validity, is_real)`` (the penalty needs the
inputs, which a ``loss_fn(output, target)`` does not see, so it is left out); one
``nndx.Monitor`` per model/optimizer pair, ``d_loss``/``g_loss`` logged to their
Monitors; after training ``nndx.probe(discriminator, ..., monitor=monD)`` and the generator
Monitor's report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.autograd as autograd
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "wgan_gp"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/wgan_gp/wgan_gp.py",
                "e0a8f3cd5e497805bcaab4c6111c6305afd75a15", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "gp_without_create_graph",
            "autograd.grad(..., create_graph=False) in compute_gradient_penalty: the penalty is computed and "
            "added to d_loss, but as a constant, cut from the critic's parameters, so the critic is unconstrained",
            (C.DETACHED_GRAPH,),
            ("https://github.com/igul222/improved_wgan_training/issues/18",
             "https://github.com/ooples/AiDotNet/issues/1844",
             "https://github.com/caogang/wgan-gp/issues/4"),
            Measure("critic_grad_norm", "the critic's input-gradient norm at fresh interpolates, 3x the healthy "
                    "run's or more (the penalty holds it near 1): 55.6/49.8/35.4 against 1.10/1.09/1.11 healthy "
                    "on seeds 0-2",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
        Variant(
            "sigmoid_critic",
            "the critic ends in nn.Sigmoid() like a standard GAN discriminator: its scores are squashed into "
            "(0, 1), so the Wasserstein loss saturates",
            (C.WRONG_OUTPUT_ACTIVATION, C.SATURATED_ACTIVATIONS),
            ("https://github.com/ozanciga/gans-with-pytorch/issues/2", "https://github.com/bojone/T-GANs/issues/3",
             "https://github.com/hwalsuklee/tensorflow-generative-model-collections/issues/14"),
            Measure("nearest_real_distance", "generated images' mean distance to their nearest real digit, 1.2x "
                    "the healthy run's or more: 0.41/0.48/0.39 against 0.18/0.18/0.18 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

n_epochs = 60
batch_size = 64
lr, b1, b2 = 0.0002, 0.5, 0.999
latent_dim = 16
img_size = 8
channels = 1
n_critic = 5
img_shape = (channels, img_size, img_size)
lambda_gp = 10
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
    def __init__(self, sigmoid: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Linear(int(np.prod(img_shape)), 128),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(128, 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 1),
        ]
        if sigmoid:
            layers.append(nn.Sigmoid())
        self.model = nn.Sequential(*layers)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.model(img.view(img.shape[0], -1))


def compute_gradient_penalty(D: nn.Module, real_samples: torch.Tensor, fake_samples: torch.Tensor,
                             np_rng: np.random.RandomState, create_graph: bool = True) -> torch.Tensor:  # fmt: skip
    """The WGAN-GP penalty: (||grad_x D(x_hat)|| - 1)^2 at random interpolates of real and fake."""
    alpha = torch.tensor(np_rng.random((real_samples.size(0), 1, 1, 1)), dtype=torch.float32)
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = torch.ones(real_samples.shape[0], 1)
    gradients = autograd.grad(outputs=d_interpolates, inputs=interpolates, grad_outputs=fake,
                              create_graph=create_graph, retain_graph=True, only_inputs=True)[0]  # fmt: skip
    gradients = gradients.view(gradients.size(0), -1)
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


def critic_loss(validity: torch.Tensor, is_real: torch.Tensor) -> torch.Tensor:
    """The critic's Wasserstein loss on a mixed batch, as loss_fn(output, target)."""
    return -torch.mean(validity[is_real == 1]) + torch.mean(validity[is_real == 0])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np_rng = np.random.RandomState(seed)  # the original draws from np.random
    train_images, train_labels, _, _ = data.digit_images(seed=seed, test_size=0)
    images_01 = data.to_tensor(train_images)  # ToTensor
    dataset = TensorDataset((images_01 - 0.5) / 0.5, train_labels)  # Normalize([0.5], [0.5])
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))

    generator = Generator()
    discriminator = Discriminator(sigmoid=variant == "sigmoid_critic")
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=lr, betas=(b1, b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(b1, b2))
    create_graph = variant != "gp_without_create_graph"

    with torch.no_grad():  # the preflight batch: real images and the untrained generator's
        probe_fake = generator(torch.randn(PROBE, latent_dim, generator=torch.Generator().manual_seed(seed + 1)))
    probe_batch = (torch.cat([dataset.tensors[0][:PROBE], probe_fake]),
                   torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]))  # fmt: skip
    nx.preflight(discriminator, probe_batch, critic_loss, optimizer=optimizer_D)
    monD = nx.monitor(discriminator, optimizer_D, every=10)
    monG = nx.monitor(generator, optimizer_G, every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    batches_done = 0
    for epoch in range(n_epochs):
        for i, (imgs, _) in enumerate(dataloader):
            real_imgs = imgs

            # train the critic
            optimizer_D.zero_grad()
            z = torch.tensor(np_rng.normal(0, 1, (imgs.shape[0], latent_dim)), dtype=torch.float32)
            fake_imgs = generator(z)
            real_validity = discriminator(real_imgs)
            fake_validity = discriminator(fake_imgs)
            gradient_penalty = compute_gradient_penalty(discriminator, real_imgs.data, fake_imgs.data, np_rng,
                                                        create_graph=create_graph)  # fmt: skip
            d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + lambda_gp * gradient_penalty
            d_loss.backward()
            optimizer_D.step()
            monD.log(d_loss)
            d_losses.append(d_loss.item())

            optimizer_G.zero_grad()

            # train the generator every n_critic batches
            if i % n_critic == 0:
                fake_imgs = generator(z)
                fake_validity = discriminator(fake_imgs)
                g_loss = -torch.mean(fake_validity)
                g_loss.backward()
                optimizer_G.step()
                monG.log(g_loss)
                g_losses.append(g_loss.item())
                batches_done += n_critic

    nx.finish(monD, discriminator, probe_batch, critic_loss, optimizer=optimizer_D)
    nx.finish(monG)
    return {
        "late_d_loss": float(np.mean(d_losses[-50:])),
        "late_g_loss": float(np.mean(g_losses[-20:])),
        **measure(generator, discriminator, dataset.tensors[0], images_01, seed),
    }


def measure(generator: nn.Module, discriminator: nn.Module, real: torch.Tensor, real_01: torch.Tensor,
            seed: int) -> dict[str, float]:  # fmt: skip
    """The critic's input-gradient norm at fresh interpolates and its real-fake score gap;
    generated images (train-mode generator, as the program saves them) against the digits."""
    rng = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        fake = generator(torch.randn(N_SAMPLES, latent_dim, generator=rng))
    idx = torch.randperm(len(real), generator=rng)[:512]
    alpha = torch.rand(512, 1, 1, 1, generator=rng)
    x_hat = (alpha * real[idx] + (1 - alpha) * fake[:512]).requires_grad_(True)
    grads = autograd.grad(discriminator(x_hat).sum(), x_hat)[0].view(512, -1)
    with torch.no_grad():
        score_gap = discriminator(real[idx]).mean() - discriminator(fake[:512]).mean()
        shown = (fake.view(N_SAMPLES, -1) + 1) / 2  # Tanh range to [0, 1] pixels
        digits = real_01.view(len(real_01), -1)
        nearest = torch.cdist(shown, digits).min(1).values.mean() / 8.0
        mean_gap = (shown.mean(0) - digits.mean(0)).abs().mean()
    return {
        "critic_grad_norm": float(grads.norm(2, dim=1).mean()),
        "critic_score_gap": float(score_gap),
        "nearest_real_distance": float(nearest),
        "mean_image_gap": float(mean_gap),
    }

"""Port of yunjey's "Generative Adversarial Network" tutorial (an MLP GAN on MNIST: two
models, two optimizers, BCELoss, a Tanh generator).

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/03-advanced/generative_adversarial_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017). Written anew from
the facts of that file; no code copied.

Kept: images flattened to vectors, ``ToTensor`` + ``Normalize(mean=[0.5], std=[0.5])`` (pixels
in [-1, 1]); the discriminator ``D`` = ``nn.Sequential`` of ``Linear(image, hidden)`` ->
``LeakyReLU(0.2)`` -> ``Linear(hidden, hidden)`` -> ``LeakyReLU(0.2)`` -> ``Linear(hidden, 1)``
-> ``Sigmoid``; the generator ``G`` = ``Linear(latent, hidden)`` -> ``ReLU`` ->
``Linear(hidden, hidden)`` -> ``ReLU`` -> ``Linear(hidden, image)`` -> ``Tanh``; PyTorch's
default init; ``nn.BCELoss``; one ``Adam(lr=0.0002)`` per model (default betas); labels of
shape (batch, 1) (ones for real, zeros for fake); ``reset_grad()`` zeroing both optimizers;
each iteration: ``D(images)`` against ones, ``G(z)`` -> ``D(fake_images)`` against zeros
(the fake images *not* detached, as in the original), ``d_loss = d_loss_real + d_loss_fake``,
``reset_grad()``, ``d_loss.backward()``, ``d_optimizer.step()``; then a fresh ``z``,
``D(G(z))`` against ones (the non-saturating generator loss), ``reset_grad()``,
``g_loss.backward()``, ``g_optimizer.step()``; ``denorm`` = ``(x + 1) / 2`` clamped to
[0, 1] for the saved samples.
Shrunk: scikit-learn's 8x8 digits (1,797 images, 64 pixels) instead of 28x28 MNIST,
latent_size 16 instead of 64, hidden_size 128 instead of 256, 100 epochs of 17 full batches
of 100 instead of 200 epochs of 600 (the original reshapes every batch to ``batch_size``
rows, so only full batches). Measure only (not in the program): 1,000 samples of the
trained generator, mapped to [0, 1] the way the program would save them, against the real
images in [0, 1]; G's weights against their initial values.
Not planted: ``Normalize`` dropped (real images in [0, 1] against G's Tanh). At this size it
changed the game (about a fifth of generated pixels below any real one) but not the
samples' distance to real digits, so no measure shows it doing harm.

nndx, as a GAN author would add it (like the DCGAN port): a preflight ``nndx.probe`` of the
discriminator (the one model with a loss of its own) on 32 real and 32 generated images
against ones and zeros, one ``nndx.Monitor`` per model/optimizer pair, ``d_loss``/``g_loss``
logged to their Monitors; after training ``nndx.probe(D, ..., monitor=monD)`` and the
generator Monitor's report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mlp_gan"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/03-advanced/generative_adversarial_network/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published"),
        Variant(
            "lr_too_high",
            "both Adam optimizers at lr=0.01 instead of 0.0002 (50x): the discriminator overpowers the generator "
            "and G's loss runs into BCELoss's log clamp",
            (C.LR_TOO_HIGH,),
            ("https://github.com/tdeboissiere/DeepLearningImplementations/issues/11",
             "https://github.com/carpedm20/BEGAN-tensorflow/issues/30",
             "https://github.com/AutoResearch/EEG-GAN/issues/56"),
            Measure("late_g_loss", "mean g_loss of the last 50 iterations, 10x the healthy run's or more: "
                    "66.8/100/100 (BCELoss's clamp; D(G(z)) = 0) buggy against 2.86/2.41/1.92 healthy on seeds 0-2; "
                    "samples' distance to the nearest real digit 0.39/0.34/0.48 against 0.34/0.29/0.20",
                    lambda healthy, buggy: not buggy < 10 * healthy),
        ),
        Variant(
            "fake_detached_in_g_step",
            "the generator step scores D(fake_images.detach()): g_loss reaches D's parameters but none of G's, "
            "so G's gradients are None at g_optimizer.step() (reset_grad() cleared what d_loss.backward() left)",
            (C.DETACHED_GRAPH,),
            ("https://github.com/nikhilsinghmus/image2reverb/issues/37",
             "https://github.com/wangle53/CSA-CDGAN/issues/5",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/179"),
            Measure("g_weight_change", "relative change of G's weights over training, under a hundredth of "
                    "the healthy run's: 0 (G never moves; D(G(z)) falls to 0.0002) buggy against 0.85/0.75/0.77 "
                    "healthy on seeds 0-2",
                    lambda healthy, buggy: buggy < healthy / 100),
        ),
    )
}

latent_size = 16
hidden_size = 128
image_size = 64
num_epochs = 100
batch_size = 100
N_SAMPLES = 1000
PROBE = 32


def build() -> tuple[nn.Module, nn.Module]:
    D = nn.Sequential(
        nn.Linear(image_size, hidden_size),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden_size, hidden_size),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden_size, 1),
        nn.Sigmoid(),
    )
    G = nn.Sequential(
        nn.Linear(latent_size, hidden_size),
        nn.ReLU(),
        nn.Linear(hidden_size, hidden_size),
        nn.ReLU(),
        nn.Linear(hidden_size, image_size),
        nn.Tanh(),
    )
    return D, G


def denorm(x: torch.Tensor) -> torch.Tensor:
    return ((x + 1) / 2).clamp(0, 1)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, _, _, _ = data.digit_images(seed=seed, test_size=0)
    images_01 = data.to_tensor(train_images)  # ToTensor: [0, 1]
    dataset = (images_01 - 0.5) / 0.5  # Normalize(mean=[0.5], std=[0.5])
    D, G = build()
    criterion = nn.BCELoss()
    learning_rate = 0.01 if variant == "lr_too_high" else 0.0002
    d_optimizer = torch.optim.Adam(D.parameters(), lr=learning_rate)
    g_optimizer = torch.optim.Adam(G.parameters(), lr=learning_rate)
    g_start = [p.detach().clone() for p in G.parameters()]
    loader_rng = torch.Generator().manual_seed(seed)  # DataLoader(shuffle=True)'s sampler

    def reset_grad() -> None:
        d_optimizer.zero_grad()
        g_optimizer.zero_grad()

    with torch.no_grad():  # the preflight batch: real images and the untrained generator's
        probe_fake = G(torch.randn(PROBE, latent_size, generator=torch.Generator().manual_seed(seed + 1)))
    probe_batch = (torch.cat([dataset[:PROBE].reshape(PROBE, -1), probe_fake]),
                   torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]))  # fmt: skip
    nx.preflight(D, probe_batch, criterion, optimizer=d_optimizer)
    monD = nx.monitor(D, d_optimizer, every=10)
    monG = nx.monitor(G, g_optimizer, every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    real_scores: list[float] = []
    fake_scores: list[float] = []
    total_step = len(dataset) // batch_size
    for epoch in range(num_epochs):
        order = torch.randperm(len(dataset), generator=loader_rng)
        for i in range(total_step):
            images = dataset[order[i * batch_size : (i + 1) * batch_size]].reshape(batch_size, -1)
            real_labels = torch.ones(batch_size, 1)
            fake_labels = torch.zeros(batch_size, 1)

            # train the discriminator
            outputs = D(images)
            d_loss_real = criterion(outputs, real_labels)
            real_score = outputs
            z = torch.randn(batch_size, latent_size)
            fake_images = G(z)
            outputs = D(fake_images)
            d_loss_fake = criterion(outputs, fake_labels)
            fake_score = outputs
            d_loss = d_loss_real + d_loss_fake
            reset_grad()
            d_loss.backward()
            d_optimizer.step()
            monD.log(d_loss)

            # train the generator
            z = torch.randn(batch_size, latent_size)
            fake_images = G(z)
            if variant == "fake_detached_in_g_step":
                outputs = D(fake_images.detach())
            else:
                outputs = D(fake_images)
            g_loss = criterion(outputs, real_labels)
            reset_grad()
            g_loss.backward()
            g_optimizer.step()
            monG.log(g_loss)

            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())
            real_scores.append(real_score.mean().item())
            fake_scores.append(fake_score.mean().item())

    nx.finish(monD, D, probe_batch, criterion, optimizer=d_optimizer)
    nx.finish(monG)

    # measure only: samples of the trained generator against the real images
    with torch.no_grad():
        samples = G(torch.randn(N_SAMPLES, latent_size, generator=torch.Generator().manual_seed(seed + 2)))
        shown = denorm(samples)  # as the program saves them
        real = images_01.reshape(len(images_01), -1)
        mean_image_gap = (shown.mean(0) - real.mean(0)).abs().mean()
        # each sample's distance to its nearest real image, in [0, 1] pixel units
        nearest = torch.cdist(shown, real).min(1).values.mean() / image_size**0.5
        g_change = torch.stack([(p.detach() - p0).norm() / p0.norm() for p, p0 in zip(G.parameters(), g_start)]).mean()
    tail = slice(-50, None)
    return {
        "late_d_loss": sum(d_losses[tail]) / 50,
        "late_g_loss": sum(g_losses[tail]) / 50,
        "late_real_score": sum(real_scores[tail]) / 50,
        "late_fake_score": sum(fake_scores[tail]) / 50,
        "mean_image_gap": float(mean_image_gap),
        "nearest_real_distance": float(nearest),
        "g_weight_change": float(g_change),
    }

"""Port of yunjey/pytorch-tutorial's "Generative Adversarial Network" (03-advanced): a fully
connected GAN, ``D`` (LeakyReLU, Sigmoid) against ``G`` (ReLU, Tanh), ``BCELoss``, two Adam
optimizers at 0.0002, ``reset_grad`` zeroing both before each backward.

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/03-advanced/generative_adversarial_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017). Written anew from the
facts of that file; no code copied. (The same file is ported as ``mlp_gan`` with other bugs.)

Kept: ``ToTensor`` + ``Normalize(mean=[0.5], std=[0.5])`` (pixels in [-1, 1]) and a shuffling
``DataLoader`` of ``batch_size`` 100; every batch reshaped to ``(batch_size, -1)``;
``D = Sequential(Linear(image_size, hidden_size), LeakyReLU(0.2), Linear(hidden_size,
hidden_size), LeakyReLU(0.2), Linear(hidden_size, 1), Sigmoid())``; ``G = Sequential(
Linear(latent_size, hidden_size), ReLU(), Linear(hidden_size, hidden_size), ReLU(),
Linear(hidden_size, image_size), Tanh())``; default init; ``criterion = nn.BCELoss()``;
``d_optimizer``/``g_optimizer`` = ``Adam(..., lr=0.0002)``; ``denorm`` (``(x + 1) / 2`` clamped
to [0, 1]); ``reset_grad`` (both optimizers' ``zero_grad``); per batch ``real_labels`` = ones and
``fake_labels`` = zeros of shape (batch, 1); ``d_loss_real = criterion(D(images), real_labels)``,
``z = randn``, ``fake_images = G(z)`` (not detached), ``d_loss_fake = criterion(D(fake_images),
fake_labels)``, ``d_loss = d_loss_real + d_loss_fake``, ``reset_grad()``, ``d_loss.backward()``,
``d_optimizer.step()``; a fresh ``z``, ``g_loss = criterion(D(G(z)), real_labels)``,
``reset_grad()``, ``g_loss.backward()``, ``g_optimizer.step()``; the periodic print of d_loss,
g_loss, D(x) and D(G(z)).
Shrunk / replaced: scikit-learn's 8x8 digits (1,797 images, 64 pixels) instead of 28x28 MNIST
(image_size 64), latent_size 16 instead of 64, hidden_size 128 instead of 256, 60 epochs of
17 full batches instead of 200 epochs of 600 (``drop_last``: the original's reshape to
``batch_size`` rows needs full batches); no sample images or checkpoints saved.
Measure only (not in the program): 1,000 samples of the trained generator through ``denorm``
(as the program saves them) against the real images in [0, 1]: ``pixel_w1`` is the 1-D
Wasserstein distance between the two pixel-value distributions, ``mean_image_l1`` the mean
absolute difference of the two mean images; ``d_real``/``d_fake`` D's last D(x)/D(G(z)).

nndx, as a GAN author would add it after the README: a preflight ``nndx.probe`` of ``D`` (the
model whose loss has a target) on 50 real and 50 generated images against ones and zeros with
``criterion`` and ``d_optimizer``; one ``nndx.Monitor`` per model/optimizer pair, ``d_loss`` and
``g_loss`` logged every step to their Monitors; after training ``nndx.probe(D, ...,
monitor=mon_d)`` on the same batch and the generator Monitor's report, each diagnosed; the
author reads both, ranked together.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_gan"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/03-advanced/generative_adversarial_network/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 8x8 digits, 60 epochs, hidden 128, latent 16)"),
        Variant(
            "no_reset_grad",
            "both reset_grad() calls left out: neither optimizer is ever zeroed, so D's and G's gradients "
            "accumulate over all steps (and g_loss's gradient on D's weights adds into D's next step)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25",
             "https://github.com/Adversarial-Deep-Learning/code-soup/issues/69"),
            Measure("pixel_w1", "pixel-value distance of the samples to the real digits at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "sigmoid_generator_output",
            "G's last activation nn.Sigmoid() instead of nn.Tanh() while the real images are normalised to "
            "[-1, 1]: G can never draw the -1 background, and denorm maps its samples to [0.5, 1]",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/fchollet/deep-learning-with-python-notebooks/issues/7",
             "https://github.com/carpedm20/DCGAN-tensorflow/issues/163",
             "https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/522"),
            Measure("pixel_w1", "pixel-value distance of the samples to the real digits at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

LATENT_SIZE = 16
HIDDEN_SIZE = 128
IMAGE_SIZE = 64
NUM_EPOCHS = 60
BATCH_SIZE = 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    no_reset = variant == "no_reset_grad"
    sigmoid_out = variant == "sigmoid_generator_output"

    tr_raw, _tr_y, te_raw, _te_y = digits.digit_images(seed=seed)
    images_01 = digits.to_tensor(torch.cat([tr_raw, te_raw]))  # ToTensor
    mnist = TensorDataset((images_01 - 0.5) / 0.5, torch.zeros(len(images_01)))  # Normalize([0.5], [0.5])
    data_loader = DataLoader(mnist, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)

    D = nn.Sequential(
        nn.Linear(IMAGE_SIZE, HIDDEN_SIZE), nn.LeakyReLU(0.2),
        nn.Linear(HIDDEN_SIZE, HIDDEN_SIZE), nn.LeakyReLU(0.2),
        nn.Linear(HIDDEN_SIZE, 1), nn.Sigmoid())  # fmt: skip
    G = nn.Sequential(
        nn.Linear(LATENT_SIZE, HIDDEN_SIZE), nn.ReLU(),
        nn.Linear(HIDDEN_SIZE, HIDDEN_SIZE), nn.ReLU(),
        nn.Linear(HIDDEN_SIZE, IMAGE_SIZE), nn.Sigmoid() if sigmoid_out else nn.Tanh())  # fmt: skip

    criterion = nn.BCELoss()
    d_optimizer = torch.optim.Adam(D.parameters(), lr=0.0002)
    g_optimizer = torch.optim.Adam(G.parameters(), lr=0.0002)

    def denorm(x: torch.Tensor) -> torch.Tensor:
        out = (x + 1) / 2
        return out.clamp(0, 1)

    def reset_grad() -> None:
        if no_reset:
            return  # the bug: the calls are left out
        d_optimizer.zero_grad()
        g_optimizer.zero_grad()

    with torch.random.fork_rng():  # the probe batch leaves the program's random stream alone
        real = next(iter(data_loader))[0][:50].reshape(50, -1)
        with torch.no_grad():
            fake = G(torch.randn(50, LATENT_SIZE))
    probe_batch = (torch.cat([real, fake]), torch.cat([torch.ones(50, 1), torch.zeros(50, 1)]))
    nx.preflight(D, probe_batch, criterion, optimizer=d_optimizer)
    mon_d = nx.monitor(D, d_optimizer)
    mon_g = nx.monitor(G, g_optimizer)

    d_loss = g_loss = real_score = fake_score = None
    for _epoch in range(NUM_EPOCHS):
        for _i, (images, _) in enumerate(data_loader):
            images = images.reshape(BATCH_SIZE, -1)
            real_labels = torch.ones(BATCH_SIZE, 1)
            fake_labels = torch.zeros(BATCH_SIZE, 1)

            outputs = D(images)
            d_loss_real = criterion(outputs, real_labels)
            real_score = outputs
            z = torch.randn(BATCH_SIZE, LATENT_SIZE)
            fake_images = G(z)
            outputs = D(fake_images)
            d_loss_fake = criterion(outputs, fake_labels)
            fake_score = outputs

            d_loss = d_loss_real + d_loss_fake
            reset_grad()
            d_loss.backward()
            d_optimizer.step()
            nx.timed(lambda: mon_d.log(d_loss))  # noqa: B023

            z = torch.randn(BATCH_SIZE, LATENT_SIZE)
            fake_images = G(z)
            outputs = D(fake_images)
            g_loss = criterion(outputs, real_labels)

            reset_grad()
            g_loss.backward()
            g_optimizer.step()
            nx.timed(lambda: mon_g.log(g_loss))  # noqa: B023

    nx.finish(mon_d, D, probe_batch, criterion, optimizer=d_optimizer)
    nx.finish(mon_g)

    with torch.no_grad():
        samples = denorm(G(torch.randn(1000, LATENT_SIZE)))
    real01 = images_01.reshape(len(images_01), -1)
    a = torch.sort(samples.flatten()).values
    b = torch.sort(real01.flatten()).values
    qa = a[torch.linspace(0, len(a) - 1, 4096).long()]
    qb = b[torch.linspace(0, len(b) - 1, 4096).long()]
    return {"pixel_w1": (qa - qb).abs().mean().item(),
            "mean_image_l1": (samples.mean(0) - real01.mean(0)).abs().mean().item(),
            "d_loss": d_loss.item(), "g_loss": g_loss.item(),
            "d_real": real_score.mean().item(), "d_fake": fake_score.mean().item()}  # fmt: skip

"""Port of eriklindernoren's PyTorch-GAN conditional GAN (``cgan.py``): label embeddings
in both models, an LSGAN (MSE) adversarial loss, two Adam optimizers.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/cgan/cgan.py`` at commit
36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik Linder-Norén).
Written anew from the facts of that file; no code copied.

Kept: ``Generator`` = ``nn.Embedding(n_classes, n_classes)`` of the label concatenated in
front of the noise, ``block``s of ``Linear`` (+ ``BatchNorm1d(out, 0.8)`` from the second
block: the 0.8 lands on ``eps``, as in the original) + ``LeakyReLU(0.2, inplace=True)``
with widths 128-256-512-1024, a last ``Linear`` to the image, ``Tanh``, ``view`` to
(channels, size, size); ``Discriminator`` = the flattened image concatenated with its own
``nn.Embedding(n_classes, n_classes)`` of the label, ``Linear`` 512 + ``LeakyReLU(0.2)``, two
``Linear(512, 512)`` + ``Dropout(0.4)`` + ``LeakyReLU(0.2)``, ``Linear(512, 1)`` (no sigmoid);
``adversarial_loss = MSELoss()``; ``Adam(lr=2e-4, betas=(0.5, 0.999))`` per model; the
loader ``shuffle=True`` with a short last batch (``batch_size = imgs.shape[0]``); per batch
``valid``/``fake`` targets of shape (batch, 1), the generator step first
(``optimizer_G.zero_grad()``, noise ``N(0, 1)`` and labels ``randint(0, n_classes)`` from
numpy, ``g_loss = MSE(D(G(z, y), y), valid)``, backward, step), then the discriminator step
(``optimizer_D.zero_grad()``, real images with their labels against ``valid``,
``gen_imgs.detach()`` with ``gen_labels`` against ``fake``, ``d_loss = (real + fake) / 2``,
backward, step); images through ``ToTensor`` + ``Normalize([0.5], [0.5])``.
Shrunk: scikit-learn's 8x8 digits (1,797 images, ``img_size`` 8) instead of MNIST resized to
32; latent_dim 100 kept, the widths halved (generator 64-128-256-512, discriminator 256);
30 epochs of 29 batches of 64 instead of 200 epochs of 938; numpy's noise and labels drawn
from a seeded ``RandomState`` instead of the global one; the sample-grid ``save_image`` and
the print line left out (the losses kept as a record).
Measured only (after training): 500 samples generated for the labels 0..9 are read by a
nearest-class-mean classifier of the real digits (``cond_acc``: share read as the label asked
for), and each sample's distance to its nearest real digit, per pixel (``nearest_real``).

nndx, as the author would add it (as in the DCGAN port): a preflight ``nndx.probe`` of the
discriminator (the one model whose loss has targets) on the first real batch with the
labels the loop gives it and the untrained generator's images with their labels, the
targets (batch, 1) ones then zeros, with ``adversarial_loss``; one ``nndx.Monitor`` per
model/optimizer pair, ``g_loss``/``d_loss`` logged to them where they are computed; after
training ``nndx.probe(discriminator, ..., monitor=monD)`` and the generator Monitor's
report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cgan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/cgan/cgan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "real_images_with_sampled_labels",
            "the discriminator's real step is given gen_labels (the labels sampled for the generator) instead of "
            "the real images' own labels: the condition D learns no longer belongs to the image",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/mafda/generative_adversarial_networks_101/issues/2",
             "https://github.com/eriklindernoren/Keras-GAN/issues/105",
             "https://github.com/kmualim/CGAN-Pytorch/issues/1"),
            Measure("cond_acc", "share of 500 samples a digit classifier reads as the label they were generated "
                    "for, at least 0.3 below the healthy run's", lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "gen_imgs_detached_in_g_step",
            "validity = discriminator(gen_imgs.detach(), gen_labels) in the generator step: g_loss no longer "
            "reaches the generator, which never learns",
            (C.DETACHED_GRAPH,),
            ("https://github.com/nikhilsinghmus/image2reverb/issues/37",
             "https://github.com/wangle53/CSA-CDGAN/issues/5",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/179"),
            Measure("nearest_real", "mean per-pixel distance of 500 samples to their nearest real digit, 1.5x the "
                    "healthy run's or more", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

# the options, shrunk
n_epochs, batch_size, lr, b1, b2 = 30, 64, 0.0002, 0.5, 0.999
latent_dim, n_classes, img_size, channels = 100, 10, 8, 1
img_shape = (channels, img_size, img_size)
G_WIDTHS, D_WIDTH = (64, 128, 256, 512), 256  # the original's halved
N_SAMPLES = 500
PROBE = 32


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.label_emb = nn.Embedding(n_classes, n_classes)

        def block(in_feat: int, out_feat: int, normalize: bool = True) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(latent_dim + n_classes, G_WIDTHS[0], normalize=False),
            *block(G_WIDTHS[0], G_WIDTHS[1]),
            *block(G_WIDTHS[1], G_WIDTHS[2]),
            *block(G_WIDTHS[2], G_WIDTHS[3]),
            nn.Linear(G_WIDTHS[3], int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        gen_input = torch.cat((self.label_emb(labels), noise), -1)  # the label's embedding, then the noise
        img = self.model(gen_input)
        return img.view(img.size(0), *img_shape)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.label_embedding = nn.Embedding(n_classes, n_classes)
        self.model = nn.Sequential(
            nn.Linear(n_classes + int(np.prod(img_shape)), D_WIDTH),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(D_WIDTH, D_WIDTH),
            nn.Dropout(0.4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(D_WIDTH, D_WIDTH),
            nn.Dropout(0.4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(D_WIDTH, 1),
        )

    def forward(self, img: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        d_in = torch.cat((img.view(img.size(0), -1), self.label_embedding(labels)), -1)
        return self.model(d_in)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)  # the original's np.random
    train_images, train_labels, _, _ = data.digit_images(seed=seed, test_size=0)
    dataset_x = (data.to_tensor(train_images) - 0.5) / 0.5  # ToTensor + Normalize([0.5], [0.5])
    dataset_y = train_labels
    loader_rng = torch.Generator().manual_seed(seed)  # DataLoader(shuffle=True)'s sampler

    adversarial_loss = torch.nn.MSELoss()
    generator, discriminator = Generator(), Discriminator()
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=lr, betas=(b1, b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(b1, b2))

    def real_condition(labels: torch.Tensor, gen_labels: torch.Tensor) -> torch.Tensor:
        """The labels the discriminator's real step is given."""
        return gen_labels if variant == "real_images_with_sampled_labels" else labels

    # the preflight batch: real digits with the labels the loop gives them, the untrained generator's with theirs
    probe_rng = np.random.RandomState(seed + 1)
    with torch.no_grad():
        probe_gen_labels = torch.as_tensor(probe_rng.randint(0, n_classes, PROBE), dtype=torch.long)
        probe_z = torch.as_tensor(probe_rng.normal(0, 1, (PROBE, latent_dim)), dtype=torch.float32)
        probe_fake = generator(probe_z, probe_gen_labels)
    probe_batch = ((torch.cat([dataset_x[:PROBE], probe_fake]),
                    torch.cat([real_condition(dataset_y[:PROBE], probe_gen_labels), probe_gen_labels])),
                   torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]))  # fmt: skip
    nx.preflight(discriminator, probe_batch, adversarial_loss, optimizer=optimizer_D)
    monD = nx.monitor(discriminator, optimizer_D, every=10)
    monG = nx.monitor(generator, optimizer_G, every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    for epoch in range(n_epochs):
        order = torch.randperm(len(dataset_x), generator=loader_rng)
        for i in range(0, len(order), batch_size):
            imgs, labels = dataset_x[order[i : i + batch_size]], dataset_y[order[i : i + batch_size]]
            bs = imgs.shape[0]
            valid = torch.full((bs, 1), 1.0)  # adversarial ground truths
            fake = torch.full((bs, 1), 0.0)
            real_imgs = imgs.float()
            labels = labels.long()

            # train the generator
            optimizer_G.zero_grad()
            z = torch.as_tensor(rng.normal(0, 1, (bs, latent_dim)), dtype=torch.float32)
            gen_labels = torch.as_tensor(rng.randint(0, n_classes, bs), dtype=torch.long)
            gen_imgs = generator(z, gen_labels)
            if variant == "gen_imgs_detached_in_g_step":
                validity = discriminator(gen_imgs.detach(), gen_labels)
            else:
                validity = discriminator(gen_imgs, gen_labels)
            g_loss = adversarial_loss(validity, valid)
            g_loss.backward()
            optimizer_G.step()
            monG.log(g_loss)

            # train the discriminator
            optimizer_D.zero_grad()
            validity_real = discriminator(real_imgs, real_condition(labels, gen_labels))
            d_real_loss = adversarial_loss(validity_real, valid)
            validity_fake = discriminator(gen_imgs.detach(), gen_labels)
            d_fake_loss = adversarial_loss(validity_fake, fake)
            d_loss = (d_real_loss + d_fake_loss) / 2
            d_loss.backward()
            optimizer_D.step()
            monD.log(d_loss)

            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())

    nx.finish(monD, discriminator, probe_batch, adversarial_loss, optimizer=optimizer_D)
    nx.finish(monG)

    # measure only: class-conditional samples read by a digit classifier, and their distance to real digits
    real_flat = dataset_x.reshape(len(dataset_x), -1)
    centroids = torch.stack([real_flat[dataset_y == k].mean(0) for k in range(n_classes)])
    sample_rng = np.random.RandomState(seed + 2)
    asked = np.arange(N_SAMPLES) % n_classes
    with torch.no_grad():
        z = torch.as_tensor(sample_rng.normal(0, 1, (N_SAMPLES, latent_dim)), dtype=torch.float32)
        samples = generator(z, torch.as_tensor(asked, dtype=torch.long)).reshape(N_SAMPLES, -1)
        nearest = torch.cdist(samples, real_flat).min(1).values.mean() / samples.shape[1] ** 0.5
        read_as = torch.cdist(samples, centroids).argmin(1).numpy()
    cond_acc = float((read_as == asked).mean())
    tail = slice(-50, None)
    return {
        "cond_acc": cond_acc,
        "nearest_real": float(nearest),
        "late_d_loss": float(np.mean(d_losses[tail])),
        "late_g_loss": float(np.mean(g_losses[tail])),
    }

"""Port of eriklindernoren's PyTorch-GAN adversarial autoencoder (``aae.py``): an encoder
with the reparameterisation trick, a tanh decoder, a discriminator telling N(0, I) codes
from encoded ones; 0.001 adversarial + 0.999 L1 reconstruction for the autoencoder.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/aae/aae.py`` at commit
36d3c77e5ff20ebe0aeefd322326a134a279b93e (the file last changed in
c5d6be170013db8975d96806084df573d87e5d26; MIT, Copyright (c) 2018 Erik Linder-Norén).
Written anew from the facts of that file; no code copied.

Kept: ``reparameterization(mu, logvar)`` = ``mu + exp(logvar / 2) * N(0, 1)`` with the noise
from numpy; ``Encoder`` = ``Linear(img, 512)`` + ``LeakyReLU(0.2, inplace=True)`` +
``Linear(512, 512)`` + ``BatchNorm1d(512)`` + ``LeakyReLU(0.2, inplace=True)``, then two
heads ``mu`` and ``logvar`` (``Linear(512, latent_dim)``) and the reparameterised code;
``Decoder`` = ``Linear(latent, 512)`` + LeakyReLU + ``Linear(512, 512)`` + ``BatchNorm1d`` +
LeakyReLU + ``Linear(512, img)`` + ``Tanh``, ``view`` to the image shape;
``Discriminator`` on codes = ``Linear(latent, 512)`` + LeakyReLU + ``Linear(512, 256)`` +
LeakyReLU + ``Linear(256, 1)`` + ``Sigmoid``; ``adversarial_loss = BCELoss()``,
``pixelwise_loss = L1Loss()``; ``optimizer_G = Adam(chain(encoder, decoder), lr=2e-4,
betas=(0.5, 0.999))``, ``optimizer_D`` the same on the discriminator; the loader
(``ToTensor`` + ``Normalize([0.5], [0.5])``, shuffled, the last batch short); per batch
``valid``/``fake`` of shape (batch, 1), the autoencoder step (``encoded = encoder(real)``,
``decoded = decoder(encoded)``, ``g_loss = 0.001 * BCE(D(encoded), valid) + 0.999 *
L1(decoded, real)``, backward, step), then the discriminator step (``z ~ N(0, I)`` from
numpy against ``valid``, ``encoded.detach()`` against ``fake``, ``d_loss = 0.5 * (real +
fake)``, backward, step); the models never put in eval mode.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 held out) with ``img_size`` 8 instead
of MNIST resized to 32; hidden widths 128/128/64 instead of 512/512/256; latent_dim 10
kept; 50 epochs of 23 batches of 64 instead of 200 of 938; numpy's noise drawn from a
seeded ``RandomState``; the sample-grid ``save_image`` and the print line left out (the
losses kept as a record).
Measure only (not in the program): on the 360 held-out digits, the L1 reconstruction
error (``heldout_l1``, in the [-1, 1] units of the loss) and how far the aggregate
posterior of their codes is from N(0, I): the mean over latent dimensions of |mean| +
|std - 1| (``latent_gap``), and an RBF-kernel MMD against as many N(0, I) draws
(``latent_mmd``); both models in train mode as the program leaves them, the
reparameterisation noise from a fixed generator.

nndx, as the author would add it (as in the CycleGAN and cGAN ports, two model/optimizer
pairs): a preflight ``nndx.probe`` of the autoencoder (``nn.Sequential(encoder,
decoder)``, the images as their own targets, ``pixelwise_loss``, ``optimizer_G``) and of the
discriminator (the first batch's N(0, I) codes then the untrained encoder's codes, targets
(batch, 1) as the loop labels them, ``adversarial_loss``, ``optimizer_D``); one
``nndx.Monitor`` per optimizer, the autoencoder's over ``{"encoder", "decoder"}``,
``g_loss``/``d_loss`` logged where they are computed; after training the same two probes
with ``monitor=``, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "aae"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/aae/aae.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "decoder_not_in_optimizer",
            "optimizer_G = Adam(encoder.parameters(), ...): the itertools.chain with the decoder dropped, so "
            "the decoder is in g_loss but in no optimizer and keeps its random weights",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/zdebruine/MMVAE/issues/39",
             "https://github.com/wiseodd/controlled-text-generation/issues/15",
             "https://github.com/soumik12345/tf2_gans/issues/14"),
            Measure("heldout_l1", "held-out L1 reconstruction error 1.5x the healthy run's or more: 0.74 against "
                    "0.13 healthy on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "real_fake_swapped",
            "the discriminator's targets swapped, as PyTorch-GAN issue #152 proposes: the N(0, I) codes "
            "labelled fake and the encoded ones valid, while the autoencoder still asks D(encoded) = valid; the "
            "adversarial term no longer pulls the codes towards the prior",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/eriklindernoren/PyTorch-GAN/issues/152",
             "https://github.com/eriklindernoren/Keras-GAN/issues/34"),
            Measure("latent_mmd", "MMD of the held-out codes against N(0, I) 1.5x the healthy run's or more: 0.283 "
                    "against 0.045 healthy on seed 0 (|mean| + |std - 1| per dimension 1.39 against 0.36)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

OPT = {"n_epochs": 50, "batch_size": 64, "lr": 0.0002, "b1": 0.5, "b2": 0.999, "latent_dim": 10, "img_size": 8,
       "channels": 1}  # fmt: skip
H1, H2, H3 = 128, 128, 64  # 512, 512, 256 in the original
img_shape = (OPT["channels"], OPT["img_size"], OPT["img_size"])
IMG = int(np.prod(img_shape))


class Encoder(nn.Module):
    def __init__(self, rng: np.random.RandomState) -> None:
        super().__init__()
        self.rng = rng
        self.model = nn.Sequential(
            nn.Linear(IMG, H1), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(H1, H2), nn.BatchNorm1d(H2), nn.LeakyReLU(0.2, inplace=True),
        )  # fmt: skip
        self.mu = nn.Linear(H2, OPT["latent_dim"])
        self.logvar = nn.Linear(H2, OPT["latent_dim"])

    def reparameterization(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(logvar / 2)
        sampled_z = torch.tensor(self.rng.normal(0, 1, (mu.size(0), OPT["latent_dim"])), dtype=torch.float32)
        return sampled_z * std + mu

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.model(img.view(img.shape[0], -1))
        return self.reparameterization(self.mu(x), self.logvar(x))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(OPT["latent_dim"], H1), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(H1, H2), nn.BatchNorm1d(H2), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(H2, IMG), nn.Tanh(),
        )  # fmt: skip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        img_flat = self.model(z)
        return img_flat.view(img_flat.shape[0], *img_shape)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(OPT["latent_dim"], H1), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(H1, H3), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(H3, 1), nn.Sigmoid(),
        )  # fmt: skip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)  # numpy's global stream in the original
    train_images, train_labels, test_images, _ = data.digit_images(seed=seed)
    transform = lambda raw: (data.to_tensor(raw) - 0.5) / 0.5  # noqa: E731 - ToTensor, Normalize([0.5], [0.5])
    dataset = TensorDataset(transform(train_images), train_labels)
    dataloader = DataLoader(dataset, batch_size=OPT["batch_size"], shuffle=True,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip

    adversarial_loss = torch.nn.BCELoss()
    pixelwise_loss = torch.nn.L1Loss()
    encoder, decoder, discriminator = Encoder(rng), Decoder(), Discriminator()

    g_params = (encoder.parameters() if variant == "decoder_not_in_optimizer"
                else itertools.chain(encoder.parameters(), decoder.parameters()))  # fmt: skip
    optimizer_G = torch.optim.Adam(g_params, lr=OPT["lr"], betas=(OPT["b1"], OPT["b2"]))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=OPT["lr"], betas=(OPT["b1"], OPT["b2"]))
    Tensor = torch.FloatTensor

    # the preflight batches: the first images as their own targets; prior codes and encoded codes for D
    first = dataset.tensors[0][: OPT["batch_size"]]
    autoencoder = nn.Sequential(encoder, decoder)
    ae_batch = (first, first)
    probe_rng = np.random.RandomState(seed + 1)
    with torch.no_grad():
        enc_state = rng.get_state()
        probe_codes = encoder(first)
        rng.set_state(enc_state)  # the probe's draw leaves the program's noise stream as it was
    prior = torch.tensor(probe_rng.normal(0, 1, (len(first), OPT["latent_dim"])), dtype=torch.float32)
    ones, zeros = torch.ones(len(first), 1), torch.zeros(len(first), 1)
    if variant == "real_fake_swapped":  # the author's own labelling: prior codes fake, encoded valid
        d_batch = (torch.cat([prior, probe_codes]), torch.cat([zeros, ones]))
    else:
        d_batch = (torch.cat([prior, probe_codes]), torch.cat([ones, zeros]))
    nx.preflight(autoencoder, ae_batch, pixelwise_loss, optimizer=optimizer_G)
    nx.preflight(discriminator, d_batch, adversarial_loss, optimizer=optimizer_D)
    monG = nx.monitor({"encoder": encoder, "decoder": decoder}, optimizer_G, every=10)
    monD = nx.monitor(discriminator, optimizer_D, every=10)

    g_losses, d_losses = [], []
    for epoch in range(OPT["n_epochs"]):
        for i, (imgs, _) in enumerate(dataloader):
            valid = Tensor(imgs.shape[0], 1).fill_(1.0)
            fake = Tensor(imgs.shape[0], 1).fill_(0.0)
            real_imgs = imgs.type(Tensor)

            # the autoencoder ("generator")
            optimizer_G.zero_grad()
            encoded_imgs = encoder(real_imgs)
            decoded_imgs = decoder(encoded_imgs)
            g_loss = 0.001 * adversarial_loss(discriminator(encoded_imgs), valid) + 0.999 * pixelwise_loss(
                decoded_imgs, real_imgs)
            g_loss.backward()
            optimizer_G.step()
            monG.log(g_loss)

            # the discriminator
            optimizer_D.zero_grad()
            z = Tensor(rng.normal(0, 1, (imgs.shape[0], OPT["latent_dim"])))
            if variant == "real_fake_swapped":
                real_loss = adversarial_loss(discriminator(encoded_imgs.detach()), valid)
                fake_loss = adversarial_loss(discriminator(z), fake)
            else:
                real_loss = adversarial_loss(discriminator(z), valid)
                fake_loss = adversarial_loss(discriminator(encoded_imgs.detach()), fake)
            d_loss = 0.5 * (real_loss + fake_loss)
            d_loss.backward()
            optimizer_D.step()
            monD.log(d_loss)
            g_losses.append(g_loss.item())
            d_losses.append(d_loss.item())

    nx.finish(monG, autoencoder, ae_batch, pixelwise_loss, optimizer=optimizer_G)
    nx.finish(monD, discriminator, d_batch, adversarial_loss, optimizer=optimizer_D)
    return {"last_g_loss": float(np.mean(g_losses[-23:])), "last_d_loss": float(np.mean(d_losses[-23:])),
            **measure(encoder, decoder, transform(test_images), seed)}  # fmt: skip


@torch.no_grad()
def measure(encoder: Encoder, decoder: Decoder, x: torch.Tensor, seed: int) -> dict[str, float]:
    saved = encoder.rng
    encoder.rng = np.random.RandomState(seed + 11)
    training = (encoder.training, decoder.training)
    try:
        codes = encoder(x)
        recon = decoder(codes)
    finally:
        encoder.rng = saved
        encoder.train(training[0]), decoder.train(training[1])
    heldout_l1 = float((recon - x).abs().mean())
    gap = float((codes.mean(0).abs() + (codes.std(0) - 1).abs()).mean())
    prior = torch.randn(codes.shape, generator=torch.Generator().manual_seed(seed + 12))
    return {"heldout_l1": heldout_l1, "latent_gap": gap, "latent_mmd": mmd(codes, prior)}


def mmd(a: torch.Tensor, b: torch.Tensor) -> float:
    """Squared MMD with an RBF kernel of bandwidth sqrt(latent_dim) (biased estimate)."""
    scale = 2.0 * a.shape[1]
    k = lambda u, v: torch.exp(-torch.cdist(u, v) ** 2 / scale)  # noqa: E731
    return float(k(a, a).mean() + k(b, b).mean() - 2 * k(a, b).mean())

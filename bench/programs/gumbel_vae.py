"""Port of YongfeiYan's Gumbel_Softmax_VAE: a categorical VAE whose latent code is N one-of-K
variables sampled with the Gumbel-softmax relaxation (optionally straight-through hard).

Source: github.com/YongfeiYan/Gumbel_Softmax_VAE, ``gumbel_softmax_vae.py`` at commit
7d3df6c3c7ac9001e5d3a9ededd6f382a8421668 (no licence stated: the repository has no LICENSE
file). Written anew from the facts of that file; no code copied.

Kept: ``sample_gumbel`` (``-log(-log(U + eps) + eps)``, eps 1e-20); ``gumbel_softmax_sample``
(softmax over the last dim of ``(logits + g) / temperature``); ``gumbel_softmax`` (flattened
to ``latent_dim * categorical_dim``; with ``hard`` the argmax one-hot through ``scatter_`` and
the straight-through ``(y_hard - y).detach() + y``); ``VAE_gumbel``: ``fc1``-``fc3`` encoder
with ReLU after each, the last included (the logits are ReLU'd, as published), ``fc4``-``fc6``
decoder with ReLU, ReLU, ``Sigmoid``; ``forward`` returning the decoded sample and
``softmax(q_y)`` flattened; ``loss_function`` = ``binary_cross_entropy`` summed over pixels
and divided by the batch size + ``sum(qy * log(qy * categorical_dim + 1e-20))`` over the
categories, averaged (the KL to the uniform categorical); ``Adam(lr=1e-3)``; batch 100,
shuffled; ``temp`` 1.0 reset at the start of each epoch and annealed to
``max(temp * exp(-ANNEAL_RATE * batch_idx), temp_min)`` when ``batch_idx % 100 == 1``
(``ANNEAL_RATE`` 3e-5, ``temp_min`` 0.5); ``hard`` False by default; ``test`` under
``model.eval()`` with the same loss and annealing; ``torch.manual_seed(1)``; pixels from
``ToTensor`` in [0, 1].
Shrunk: scikit-learn's 8x8 digits (1,437 for training, 360 held out) upscaled to 28x28
(bilinear, in [0, 1]) instead of MNIST, so the 784 pixels and the BCE-to-KL balance are
kept (at 64 pixels the posterior collapses to the prior); hidden widths 128/64 instead of 512/256; ``latent_dim`` 8 instead
of 30 (``categorical_dim`` 10 kept); 40 epochs instead of 10 (15 batches an epoch instead
of 600). The saved reconstruction and sample images are left out.
Measure only (not in the program): the held-out negative ELBO per digit (the published
BCE + the correct KL to the uniform prior, soft samples at temperature 1, seeded), and its
reconstruction part.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch with the
program's ``loss_function`` unpacking the model's ``(recon, qy)``, the inputs
``(x, temp, hard)`` as ``forward`` takes them and ``x`` as the target;
``nndx.Monitor(model, optimizer)`` around the loop, each batch's loss logged and each
epoch's test loss as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "gumbel_vae"
SOURCE = Source("YongfeiYan/Gumbel_Softmax_VAE", "gumbel_softmax_vae.py", "7d3df6c3c7ac9001e5d3a9ededd6f382a8421668",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (soft samples, the default)"),
        Variant(
            "kl_sign_flipped",
            "KLD = -torch.sum(qy * log_ratio, dim=-1).mean(): the minus sign of the Gaussian VAE's KL carried over, "
            "so the loss rewards a posterior far from the uniform prior",
            (C.WRONG_LOSS,),
            ("https://github.com/dev4488/VAE_gumble_softmax/issues/1", "https://github.com/Kaixhin/Autoencoders/issues/9",
             "https://github.com/loeweX/AmortizedCausalDiscovery/issues/3"),
            Measure("test_neg_elbo", "held-out negative ELBO (BCE + the correct KL) per digit at least 2 nats above "
                    "the healthy run's (372.4 against 337.6 on seed 0, while the printed train loss is lower: 336.8 "
                    "against 339.3)", lambda healthy, buggy: not buggy < healthy + 2.0),
        ),
        Variant(
            "hard_without_straight_through",
            "run with --hard, and gumbel_softmax returns y_hard itself instead of (y_hard - y).detach() + y: the "
            "one-hot sample built by scatter_ has no gradient, so the reconstruction loss never reaches the encoder "
            "(only the KL term does)",
            (C.DETACHED_GRAPH,),
            ("https://github.com/pytorch/pytorch/issues/48574", "https://github.com/limaosen0/AS-GCN/issues/48",
             "https://github.com/ericjang/gumbel-softmax/issues/12"),
            Measure("test_neg_elbo", "held-out negative ELBO (BCE + the correct KL) per digit at least 2 nats above "
                    "the healthy run's (354.0, the posterior collapsed to the prior, against 337.6 on seed 0)",
                    lambda healthy, buggy: not buggy < healthy + 2.0),
        ),
    )
}

SIDE, H1, H2 = 28, 128, 64
PIXELS = SIDE * SIDE
latent_dim, categorical_dim = 8, 10
temp_min, ANNEAL_RATE = 0.5, 0.00003
EPOCHS, BATCH_SIZE, TEMP = 40, 100, 1.0


def sample_gumbel(shape: torch.Size, eps: float = 1e-20) -> torch.Tensor:
    U = torch.rand(shape)  # noqa: N806 - the source's name
    return -torch.log(-torch.log(U + eps) + eps)


def gumbel_softmax_sample(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    y = logits + sample_gumbel(logits.size())
    return F.softmax(y / temperature, dim=-1)


def gumbel_softmax(logits: torch.Tensor, temperature: float, hard: bool = False, straight_through: bool = True):
    y = gumbel_softmax_sample(logits, temperature)
    if not hard:
        return y.view(-1, latent_dim * categorical_dim)
    shape = y.size()
    _, ind = y.max(dim=-1)
    y_hard = torch.zeros_like(y).view(-1, shape[-1])
    y_hard.scatter_(1, ind.view(-1, 1), 1)
    y_hard = y_hard.view(*shape)
    if straight_through:
        y_hard = (y_hard - y).detach() + y
    return y_hard.view(-1, latent_dim * categorical_dim)


class VAE_gumbel(nn.Module):  # noqa: N801 - the source's name
    def __init__(self, temp: float, straight_through: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, H1)
        self.fc2 = nn.Linear(H1, H2)
        self.fc3 = nn.Linear(H2, latent_dim * categorical_dim)
        self.fc4 = nn.Linear(latent_dim * categorical_dim, H2)
        self.fc5 = nn.Linear(H2, H1)
        self.fc6 = nn.Linear(H1, PIXELS)
        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()
        self.straight_through = straight_through

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        h1 = self.relu(self.fc1(x))
        h2 = self.relu(self.fc2(h1))
        return self.relu(self.fc3(h2))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        h4 = self.relu(self.fc4(z))
        h5 = self.relu(self.fc5(h4))
        return self.sigmoid(self.fc6(h5))

    def forward(self, x: torch.Tensor, temp: float, hard: bool) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.encode(x.view(-1, PIXELS))
        q_y = q.view(q.size(0), latent_dim, categorical_dim)
        z = gumbel_softmax(q_y, temp, hard, self.straight_through)
        return self.decode(z), F.softmax(q_y, dim=-1).reshape(*q.size())


def make_loss_function(kl_sign: float = 1.0):
    def loss_function(recon_x: torch.Tensor, x: torch.Tensor, qy: torch.Tensor) -> torch.Tensor:
        BCE = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum") / x.shape[0]  # noqa: N806
        log_ratio = torch.log(qy * categorical_dim + 1e-20)
        KLD = kl_sign * torch.sum(qy * log_ratio, dim=-1).mean()  # noqa: N806
        return BCE + KLD

    return loss_function


def neg_elbo(model: VAE_gumbel, x: torch.Tensor, seed: int) -> tuple[float, float]:
    """Measure only: held-out BCE + the correct KL per digit (soft samples at temperature 1)."""
    model.eval()
    torch.manual_seed(1000 + seed)
    with torch.no_grad():
        recon, qy = model(x, 1.0, False)
        bce = F.binary_cross_entropy(recon, x.view(-1, PIXELS), reduction="sum").item() / len(x)
        q = qy.view(len(x), latent_dim, categorical_dim)
        kl = torch.sum(q * torch.log(q * categorical_dim + 1e-20), dim=(-2, -1)).mean().item()
    return bce + kl, bce


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    train_images, _, test_images, _ = data.digit_images(seed=seed)
    train_x = data.upscaled(train_images, SIDE).view(-1, PIXELS)
    test_x = data.upscaled(test_images, SIDE).view(-1, PIXELS)
    hard = variant == "hard_without_straight_through"
    model = VAE_gumbel(TEMP, straight_through=not hard)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    loss_function = make_loss_function(-1.0 if variant == "kl_sign_flipped" else 1.0)
    generator = torch.Generator().manual_seed(seed)

    def vae_loss(output, x):
        return loss_function(output[0], x, output[1])

    first_batch = ((train_x[:BATCH_SIZE], TEMP, hard), train_x[:BATCH_SIZE])
    nx.preflight(model, first_batch, vae_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_loss = test_loss = 0.0
    for _epoch in range(1, EPOCHS + 1):
        model.train()
        train_loss = 0.0
        temp = TEMP
        order = torch.randperm(len(train_x), generator=generator)
        for batch_idx, i in enumerate(range(0, len(order), BATCH_SIZE)):
            x = train_x[order[i : i + BATCH_SIZE]]
            optimizer.zero_grad()
            recon_batch, qy = model(x, temp, hard)
            loss = loss_function(recon_batch, x, qy)
            loss.backward()
            train_loss += loss.item() * len(x)
            optimizer.step()
            if batch_idx % 100 == 1:
                temp = np.maximum(temp * np.exp(-ANNEAL_RATE * batch_idx), temp_min)
            nx.timed(lambda: mon.log(loss))
        epoch_loss = train_loss / len(train_x)
        test_loss = test(model, test_x, loss_function, hard)
        nx.timed(lambda: mon.log(test_loss, split="val"))

    nx.finish(mon, model, first_batch, vae_loss, optimizer=optimizer)
    elbo, bce = neg_elbo(model, test_x, seed)
    return {"test_neg_elbo": elbo, "test_bce": bce, "final_train_loss": epoch_loss, "test_loss": test_loss}


def test(model: VAE_gumbel, x: torch.Tensor, loss_function, hard: bool) -> float:
    model.eval()
    total, temp = 0.0, TEMP
    for i, start in enumerate(range(0, len(x), BATCH_SIZE)):
        data_b = x[start : start + BATCH_SIZE]
        recon_batch, qy = model(data_b, temp, hard)
        total += loss_function(recon_batch, data_b, qy).item() * len(data_b)
        if i % 100 == 1:
            temp = np.maximum(temp * np.exp(-ANNEAL_RATE * i), temp_min)
    return total / len(x)

"""Port of the PyTorch variational auto-encoder example.

Source: github.com/pytorch/examples, ``vae/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``fc1`` -> ``F.relu`` -> (``fc21`` = mu, ``fc22`` = logvar); the
reparameterisation ``mu + randn_like(std) * exp(0.5 * logvar)`` inside ``forward`` (in
train and eval mode alike); ``fc3`` -> ``F.relu`` -> ``fc4`` -> ``torch.sigmoid``; the
model returns ``(recon, mu, logvar)``; ``loss_function`` = binary cross-entropy summed
over pixels and batch + the closed-form KL term ``-0.5 * sum(1 + logvar - mu^2 -
exp(logvar))``; Adam(lr=1e-3); batch 128; ``test`` under ``model.eval()`` and
``torch.no_grad()``; pixels from ``ToTensor`` alone, in [0, 1].
Shrunk: 64 pixels (8x8 digits) instead of 784, hidden 32 instead of 400, latent 4
instead of 20, 12 epochs of 1,437 images.

nndx, as the author would add it: a preflight ``nndx.probe`` with the example's own
``loss_function`` unpacking the output tuple, ``nndx.Monitor`` around the loop (its own
loss call), the per-sample loss it prints logged, the test loss as ``split="val"``;
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "vae"
SOURCE = Source("pytorch/examples", "vae/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "kl_sign_flipped",
            "KLD = 0.5 * sum(1 + logvar - mu^2 - exp(logvar)): the minus sign 'fixed' away, "
            "so the loss subtracts the KL divergence",
            (C.WRONG_LOSS,),
            ("https://github.com/pytorch/examples/issues/824", "https://github.com/pytorch/examples/issues/298",
             "https://github.com/SeldonIO/alibi-detect/issues/316"),
            Measure("final_train_loss",
                    "per-sample train loss of the last epoch: negative and below the healthy run's by 100 or more",
                    lambda healthy, buggy: not buggy > min(0.0, healthy - 100.0)),
        ),
    )
}

PIXELS, HIDDEN, LATENT = 64, 32, 4


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, HIDDEN)
        self.fc21 = nn.Linear(HIDDEN, LATENT)
        self.fc22 = nn.Linear(HIDDEN, LATENT)
        self.fc3 = nn.Linear(LATENT, HIDDEN)
        self.fc4 = nn.Linear(HIDDEN, PIXELS)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x.view(-1, PIXELS))
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def make_loss_function(variant: str):
    sign = 0.5 if variant == "kl_sign_flipped" else -0.5

    def loss_function(recon_x, x, mu, logvar):
        bce = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum")
        kld = sign * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return bce + kld

    return loss_function


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = 12, batch_size: int = 128) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    train_images, _, test_images, _ = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_function = make_loss_function(variant)
    generator = torch.Generator().manual_seed(seed)

    def vae_loss(output, x):
        return loss_function(output[0], x, output[1], output[2])

    first_batch = (train_x[:batch_size], train_x[:batch_size])
    nx.preflight(model, first_batch, vae_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    for epoch in range(1, epochs + 1):
        model.train()
        train_loss = 0.0
        order = torch.randperm(len(train_x), generator=generator)
        for i in range(0, len(order), batch_size):
            x = train_x[order[i : i + batch_size]]
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(x)
            loss = loss_function(recon_batch, x, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            mon.log(loss.item() / len(x))
        epoch_loss = train_loss / len(train_x)
        test_loss = test(model, test_x, loss_function, batch_size)
        mon.log(test_loss, split="val")

    nx.finish(mon, model, first_batch, vae_loss, optimizer=optimizer)
    return {"final_train_loss": epoch_loss, "test_loss": test_loss}


def test(model: nn.Module, x: torch.Tensor, loss_function, batch_size: int) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            recon, mu, logvar = model(x[i : i + batch_size])
            total += loss_function(recon, x[i : i + batch_size], mu, logvar).item()
    return total / len(x)

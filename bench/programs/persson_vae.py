"""Port of aladdinpersson/Machine-Learning-Collection's fully connected VAE: a Linear encoder to
mu and sigma, the reparameterisation ``z = mu + sigma * eps``, a sigmoid decoder, trained on
``BCELoss(reduction="sum")`` plus the KL term with Adam at 3e-4.

Source: github.com/aladdinpersson/Machine-Learning-Collection, ``ML/Pytorch/more_advanced/VAE/
model.py`` (commit 609b7511c82c3421459df79e2324c8ee5a5dbfc5) and ``ML/Pytorch/more_advanced/
VAE/train.py`` (commit ae581a64e6b1a9350adbdc726bc5a860cb6f5370), MIT. Written anew from the
facts of those files; no code copied.

Kept: ``VariationalAutoEncoder(input_dim, h_dim=200, z_dim=20)``: ``img_2hid`` Linear + ReLU,
``hid_2mu`` and ``hid_2sigma`` Linear heads (sigma unconstrained, as published), ``z_2hid``
Linear + ReLU, ``hid_2img`` Linear + ``torch.sigmoid``; ``forward`` returns ``(x_reconstructed,
mu, sigma)`` with ``epsilon = torch.randn_like(sigma)``; the training script: ``H_DIM`` 200,
``Z_DIM`` 20, ``BATCH_SIZE`` 32, ``LR_RATE`` 3e-4, ``optim.Adam``, ``nn.BCELoss(reduction="sum")``,
a shuffling ``DataLoader``, per batch ``x.view(x.shape[0], INPUT_DIM)``, ``reconstruction_loss =
loss_fn(x_reconstructed, x)``, ``kl_div = -torch.sum(1 + torch.log(sigma.pow(2)) - mu.pow(2) -
sigma.pow(2))`` (the published form, without the 1/2), ``loss = reconstruction_loss + kl_div``,
``zero_grad`` / ``backward`` / ``step``, the loss shown per batch (tqdm's postfix).
Shrunk / replaced: scikit-learn's ``load_digits`` (8x8, pixel values 0-16) divided by 16 to
[0, 1] (what ``ToTensor`` does for MNIST's 0-255) instead of MNIST, so ``INPUT_DIM`` is 64;
1,497 images trained on, 300 held out for the measure (MNIST's train set is all the script
uses); 30 epochs instead of 10 (47 batches an epoch instead of 1,875); no tqdm, no
``inference``/``save_image``; CPU.
Measure only (not in the program): on the 300 held-out images, the reconstruction BCE per image
(summed over pixels) and the pixel MSE of ``decode(mu)``, and the KL per image.

nndx, as the author would add it: the model returns ``(x_reconstructed, mu, sigma)`` and the loss
is the script's own sum, so nndx gets ``loss_fn(output, x)`` = BCE-sum of ``output[0]`` against
``x`` plus the script's KL of ``output[1]``, ``output[2]``, and the first training batch as
``(x, x)``; a preflight ``nndx.probe`` with the optimizer; ``nndx.Monitor(model, optimizer)``
around the epochs, every batch's loss logged (where the script sets tqdm's postfix); after
training ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_vae"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/more_advanced/VAE/train.py",
                "ae581a64e6b1a9350adbdc726bc5a860cb6f5370", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 8x8 digits scaled to [0, 1], 30 epochs)"),
        Variant(
            "bce_mean_reduction",
            "nn.BCELoss() with its default reduction='mean' instead of reduction='sum': the reconstruction term "
            "is averaged over the batch's pixels while the KL term is still summed over the batch, so the KL "
            "outweighs the reconstruction about 2,000-fold and the latent code collapses to the prior",
            (C.WRONG_LOSS,),
            ("https://github.com/pytorch/examples/issues/817",),
            Measure("test_mse", "held-out pixel MSE of decode(mu) at least 1.2x the healthy run's: 0.092 against "
                    "0.071 healthy on seed 0 (KL per image 0.19 against 0.49: the code collapses toward the prior)",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
        Variant(
            "kl_sign_flipped",
            "the KL term written without its leading minus (kl_div = torch.sum(1 + log sigma^2 - mu^2 - "
            "sigma^2)): the loss now rewards a large KL, pushing mu and sigma away from the prior without "
            "bound instead of toward it",
            (C.WRONG_LOSS,),
            ("https://github.com/FluxML/model-zoo/pull/147",
             "https://github.com/wiseodd/generative-models/issues/43",
             "https://github.com/AntixK/PyTorch-VAE/issues/68"),
            Measure("test_kl", "held-out KL per image at least 10x the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < 10 * healthy),
        ),
    )
}

INPUT_DIM, H_DIM, Z_DIM, NUM_EPOCHS, BATCH_SIZE, LR_RATE = 64, 200, 20, 30, 32, 3e-4
N_TEST = 300


# --------------------------------------------------------------------------- model.py


class VariationalAutoEncoder(nn.Module):
    def __init__(self, input_dim, h_dim=200, z_dim=20):
        super().__init__()
        # encoder
        self.img_2hid = nn.Linear(input_dim, h_dim)
        self.hid_2mu = nn.Linear(h_dim, z_dim)
        self.hid_2sigma = nn.Linear(h_dim, z_dim)
        # decoder
        self.z_2hid = nn.Linear(z_dim, h_dim)
        self.hid_2img = nn.Linear(h_dim, input_dim)
        self.relu = nn.ReLU()

    def encode(self, x):
        h = self.relu(self.img_2hid(x))
        mu, sigma = self.hid_2mu(h), self.hid_2sigma(h)
        return mu, sigma

    def decode(self, z):
        h = self.relu(self.z_2hid(z))
        return torch.sigmoid(self.hid_2img(h))

    def forward(self, x):
        mu, sigma = self.encode(x)
        epsilon = torch.randn_like(sigma)
        z_new = mu + sigma * epsilon
        x_reconstructed = self.decode(z_new)
        return x_reconstructed, mu, sigma


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.data))
    pixels = torch.tensor(digits.data, dtype=torch.float32)
    scaled = pixels / 16.0  # ToTensor's [0, 1]
    fed = scaled
    train_idx, test_idx = torch.from_numpy(order[N_TEST:]), torch.from_numpy(order[:N_TEST])
    dataset = TensorDataset(fed[train_idx], torch.from_numpy(digits.target[order[N_TEST:]]))
    train_loader = DataLoader(dataset=dataset, batch_size=BATCH_SIZE, shuffle=True)
    model = VariationalAutoEncoder(INPUT_DIM, H_DIM, Z_DIM)
    optimizer = optim.Adam(model.parameters(), lr=LR_RATE)
    loss_fn = nn.BCELoss() if variant == "bce_mean_reduction" else nn.BCELoss(reduction="sum")
    flipped = variant == "kl_sign_flipped"

    def kl_term(mu, sigma):
        if flipped:
            return torch.sum(1 + torch.log(sigma.pow(2)) - mu.pow(2) - sigma.pow(2))
        return -torch.sum(1 + torch.log(sigma.pow(2)) - mu.pow(2) - sigma.pow(2))

    def vae_loss(output, x):
        x_reconstructed, mu, sigma = output
        return loss_fn(x_reconstructed, x) + kl_term(mu, sigma)

    first_x = fed[train_idx[:BATCH_SIZE]].view(BATCH_SIZE, INPUT_DIM)
    nx.preflight(model, (first_x, first_x), vae_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    last_loss = float("nan")
    for epoch in range(NUM_EPOCHS):
        for i, (x, _) in enumerate(train_loader):
            # Forward pass
            x = x.view(x.shape[0], INPUT_DIM)
            x_reconstructed, mu, sigma = model(x)
            # Compute loss
            reconstruction_loss = loss_fn(x_reconstructed, x)
            kl_div = kl_term(mu, sigma)
            # Backprop
            loss = reconstruction_loss + kl_div
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            last_loss = loss.item()  # loop.set_postfix(loss=loss.item())

    nx.finish(mon, model, (first_x, first_x), vae_loss, optimizer=optimizer)

    with torch.no_grad():
        x_in, x_true = fed[test_idx], scaled[test_idx]
        mu, sigma = model.encode(x_in)
        recon = model.decode(mu)
        bce = nn.functional.binary_cross_entropy(recon, x_true, reduction="sum").item() / N_TEST
        kl = (-0.5 * torch.sum(1 + torch.log(sigma.pow(2)) - mu.pow(2) - sigma.pow(2))).item() / N_TEST
        mse = ((recon - x_true) ** 2).mean().item()
    return {"test_recon_bce": bce, "test_kl": kl, "test_mse": mse, "last_batch_loss": last_loss}

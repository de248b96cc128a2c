"""Port of Atcold/NYU-DLSP20's "11-VAE" notebook: a variational autoencoder with a Linear
encoder to (mu, logvar), the reparameterisation trick written with in-place ops, a sigmoid
decoder, and the loss BCE (summed) + KL divergence, trained with Adam at 1e-3; each epoch a
training pass then a pass over the test set (the untrained net tested first).

Source: github.com/Atcold/NYU-DLSP20, ``11-VAE.ipynb`` at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (the notebook last changed in c2643e27; CC BY-NC-SA
4.0, Alfredo Canziani). Written anew from the facts of that notebook; no code copied.

Kept: ``torch.manual_seed(1)``; ``batch_size = 256``, train and test loaders both shuffling;
``d = 20``; ``VAE``: ``encoder = Sequential(Linear(784, d**2), ReLU, Linear(d**2, 2d))``,
``decoder = Sequential(Linear(d, d**2), ReLU, Linear(d**2, 784), Sigmoid)``;
``reparameterise``: in training ``std = logvar.mul(0.5).exp_()``, ``eps =
std.new_empty(std.size()).normal_()``, ``eps.mul_(std).add_(mu)``, in eval ``mu``; ``forward``
views the encoder output as ``(-1, 2, d)`` and splits mu / logvar; ``Adam(lr=1e-3)``;
``loss_function(x_hat, x, mu, logvar, beta=1)`` = ``binary_cross_entropy(x_hat, x.view(-1, 784),
reduction='sum') + beta * 0.5 * sum(logvar.exp() - logvar - 1 + mu**2)``; the loop ``for epoch
in range(0, epochs + 1)``: epoch 0 only tests; otherwise ``model.train()``, per batch forward,
loss, ``train_loss += loss.item()``, ``zero_grad``, ``backward``, ``step``, the average loss
per sample printed; then ``with torch.no_grad(): model.eval()`` over the test set, the test
loss summed and divided by the test set's size; images through ``transforms.ToTensor()``.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 = 784 pixels (1,437 train /
360 test) instead of MNIST; 40 epochs of 6 batches (240 steps) instead of 10 epochs of 235;
no ``num_workers``/``pin_memory``; CPU; no plots, no t-SNE, no sampling cells.
Measure only (not in the program): on the test set in eval mode (z = mu), the summed BCE of
the reconstruction per image and the KL term per image, computed with the correct formula
whatever the variant's loss.

nndx, as the author would add it after README.md: ``loss_fn(output, x) =
loss_function(x_hat, x, mu, logvar)`` with ``x_hat, mu, logvar = output`` on the model's output tuple; a preflight ``nndx.probe(model,
(x, x), loss_fn, optimizer=optimizer)`` on the first training batch; ``nndx.Monitor(model,
optimizer, every=10)`` around the epochs, every batch's loss logged after
``optimizer.step()`` and each epoch's test loss logged as ``split="val"`` (where the notebook
prints them); after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_vae"
SOURCE = Source("Atcold/NYU-DLSP20", "11-VAE.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd", "CC-BY-NC-SA-4.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 digits, 40 epochs of 6 batches)"),
        Variant(
            "bce_mean_reduction",
            "the reconstruction term is binary_cross_entropy(x_hat, x.view(-1, 784)) with its default "
            "reduction='mean' while the KL term stays summed over the batch and the latent units: the KL "
            "outweighs the reconstruction by ~784 x 256, the posterior collapses to the prior and every "
            "reconstruction is the same blurry mean digit",
            (C.WRONG_LOSS,),
            ("https://github.com/pytorch/examples/issues/817",
             "https://github.com/zdebruine/MMVAE/pull/19",
             "https://github.com/podgorskiy/VAE/issues/1"),
            Measure("test_recon_bce", "test reconstruction BCE per image at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "kld_sign_flipped",
            "the KL term is written -0.5 * sum(logvar.exp() - logvar - 1 + mu**2): the minus of the "
            "1 + logvar - mu**2 - exp(logvar) form kept on the notebook's already-positive form, so the loss "
            "subtracts the KL divergence and rewards posteriors ever farther from the prior",
            (C.WRONG_LOSS,),
            ("https://github.com/FluxML/model-zoo/pull/147",
             "https://github.com/AntixK/PyTorch-VAE/issues/68",
             "https://github.com/pytorch/examples/issues/824"),
            Measure("test_kld", "test KL divergence per image at least 3x the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
    )
}

D, BATCH_SIZE, LEARNING_RATE, EPOCHS, SIDE = 20, 256, 1e-3, 40, 28


# --------------------------------------------------------------------------- the notebook's model


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(784, D**2), nn.ReLU(), nn.Linear(D**2, D * 2))
        self.decoder = nn.Sequential(nn.Linear(D, D**2), nn.ReLU(), nn.Linear(D**2, 784), nn.Sigmoid())

    def reparameterise(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        if self.training:
            std = logvar.mul(0.5).exp_()
            eps = std.new_empty(std.size()).normal_()
            return eps.mul_(std).add_(mu)
        return mu

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu_logvar = self.encoder(x.view(-1, 784)).view(-1, 2, D)
        mu = mu_logvar[:, 0, :]
        logvar = mu_logvar[:, 1, :]
        z = self.reparameterise(mu, logvar)
        return self.decoder(z), mu, logvar


# --------------------------------------------------------------------------- the notebook's loss and loop


def make_loss_function(variant: str):
    def loss_function(x_hat, x, mu, logvar, beta=1):
        if variant == "bce_mean_reduction":
            BCE = nn.functional.binary_cross_entropy(x_hat, x.view(-1, 784))
        else:
            BCE = nn.functional.binary_cross_entropy(x_hat, x.view(-1, 784), reduction="sum")
        if variant == "kld_sign_flipped":
            KLD = -0.5 * torch.sum(logvar.exp() - logvar - 1 + mu.pow(2))
        else:
            KLD = 0.5 * torch.sum(logvar.exp() - logvar - 1 + mu.pow(2))
        return BCE + beta * KLD

    return loss_function


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, SIDE), digits.upscaled(te_raw, SIDE)  # ToTensor: [0, 1]
    train_loader = DataLoader(TensorDataset(x_train, tr_y), batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, te_y), batch_size=BATCH_SIZE, shuffle=True)

    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_function = make_loss_function(variant)

    def loss_fn(output, x):
        x_hat, mu, logvar = output
        return loss_function(x_hat, x, mu, logvar)

    first = x_train[:BATCH_SIZE]
    nx.preflight(model, (first, first), loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    train_loss = test_loss = float("nan")
    for epoch in range(0, EPOCHS + 1):
        if epoch > 0:  # test untrained net first
            model.train()
            train_loss = 0.0
            for x, _ in train_loader:
                x_hat, mu, logvar = model(x)
                loss = loss_function(x_hat, x, mu, logvar)
                train_loss += loss.item()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_loss /= len(train_loader.dataset)
        with torch.no_grad():
            model.eval()
            test_loss = 0.0
            for x, _y in test_loader:
                x_hat, mu, logvar = model(x)
                test_loss += loss_function(x_hat, x, mu, logvar).item()
        test_loss /= len(test_loader.dataset)
        nx.timed(lambda: mon.log(test_loss, split="val"))  # noqa: B023

    nx.finish(mon, model, (first, first), loss_fn, optimizer=optimizer)

    model.eval()
    with torch.no_grad():
        x_hat, mu, logvar = model(x_test)
        recon = nn.functional.binary_cross_entropy(x_hat, x_test.view(-1, 784), reduction="sum").item()
        kld = (0.5 * torch.sum(logvar.exp() - logvar - 1 + mu.pow(2))).item()
    n = len(x_test)
    return {"test_recon_bce": recon / n, "test_kld": kld / n, "test_loss": test_loss,
            "train_loss": train_loss}  # fmt: skip

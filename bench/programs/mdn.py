"""Port of hardmaru's "Mixture Density Networks with PyTorch" notebook: a 5-Gaussian MDN
fitted to the inverted noisy sinusoid by the mixture's negative log-likelihood.

Source: github.com/hardmaru/pytorch_notebooks, ``mixture_density_networks.ipynb`` at
commit 8b01f05426614cd81a51878e5fc3000411a51b63 (the file's newest version; the
repository's HEAD is 83a0a20318eb2872537593a387069f3c74a186e8) (MIT, Copyright (c) 2017).
Written anew from the facts of that file; no code copied.

Kept: ``generate_data(n_samples)``: ``x ~ Uniform(-10.5, 10.5)``, ``y = 7 sin(0.75 x) +
0.5 x + eps`` with ``eps ~ N(0, 1)``, 1,000 samples, reshaped to ``(n_samples, 1)`` float32,
then inverted (the MDN's input is ``y``, its target ``x``: one input, several answers);
``MDN(n_hidden=20, n_gaussians=5)``: ``z_h = nn.Sequential(nn.Linear(1, n_hidden),
nn.Tanh())`` and three heads ``z_pi``, ``z_sigma``, ``z_mu``, the forward returning the
tuple ``(pi, sigma, mu)`` with ``pi = nn.functional.softmax(z_pi, -1)``, ``sigma =
torch.exp(z_sigma)``, ``mu`` raw; ``gaussian_distribution(y, mu, sigma)`` (``y`` expanded to
``mu``'s shape, ``torch.reciprocal(sigma)``, times ``1 / sqrt(2 pi)``) and ``mdn_loss_fn(pi,
sigma, mu, y)`` = mean over samples of ``-log(sum_k pi_k N_k)``, computed in probability
space as the notebook does; ``torch.optim.Adam(network.parameters())`` at its default
settings; ``train_mdn``: the whole data set as one batch every epoch, forward,
``mdn_loss_fn``, ``optimizer.zero_grad()``, ``backward``, ``step``, the loss printed every 500
epochs. (``Variable`` wrappers, a no-op since PyTorch 0.4, are left out; ``loss.data[0]``
is ``loss.item()``.)
Shrunk: 5,000 epochs instead of 10,000 (the held-out NLL is 1.68 at both on seed 0; the
longer run only fits the training set closer). Data drawn from a seeded ``RandomState``
instead of numpy's global one, so runs repeat. The notebook's first part (a plain
``Tanh`` regressor with ``MSELoss`` showing why an MDN is needed) is left out.
Measure only (not in the program): ``mdn_loss_fn`` of the trained network on 1,000 fresh
samples from ``generate_data`` (the notebook plots the fit on a ``linspace`` instead).

nndx, as the author would add it: a preflight ``nndx.probe`` on the training set (the
notebook's only batch) with ``mdn_loss_fn`` written as ``loss_fn(output, y)`` over the
network's tuple, the optimizer, and ``data=(x, y)``; ``nndx.Monitor(network, optimizer)``
around ``train_mdn``, each epoch's loss logged (the notebook has no validation loss);
then ``nndx.probe(..., monitor=mon, data=(x, y))`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mdn"
SOURCE = Source("hardmaru/pytorch_notebooks", "mixture_density_networks.ipynb",
                "8b01f05426614cd81a51878e5fc3000411a51b63", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's MDN as published (5,000 epochs)"),
        Variant(
            "pi_softmax_over_batch",
            "pi = softmax(z_pi, 0) instead of -1: the mixture weights are normalised over the samples of the "
            "batch, not over each sample's 5 Gaussians",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_RESHAPE),
            ("https://github.com/DeepReinforcementLearning/DeepReinforcementLearningInAction/issues/32",
             "https://github.com/perone/euclidesdb/issues/2",
             "https://github.com/Lackel/DPN/issues/1"),
            Measure("heldout_nll", "held-out NLL above the healthy run's by 1 nat or more: 6.87/6.77 "
                    "against 1.68/1.54 on seeds 0-1",
                    lambda healthy, buggy: not buggy < healthy + 1.0),
        ),
        Variant(
            "sigma_no_exp",
            "sigma = self.z_sigma(z_h): the exp that keeps the standard deviations positive left out, so "
            "components get sigma <= 0 and the mixture density goes negative inside the log",
            (C.WRONG_OUTPUT_ACTIVATION, C.LOG_OF_ZERO),
            ("https://github.com/tonyduan/mixture-density-network/pull/4",
             "https://github.com/cpmpercussion/keras-mdn-layer/issues/42",
             "https://github.com/keras-team/keras/issues/1061"),
            Measure("heldout_nll", "held-out NLL NaN or above the healthy run's by 1 nat or more: NaN from the "
                    "first epoch on seeds 0-1",
                    lambda healthy, buggy: not buggy < healthy + 1.0),
        ),
    )
}

n_samples, n_input = 1000, 1
EPOCHS = 5000
oneDivSqrtTwoPI = 1.0 / np.sqrt(2.0 * np.pi)  # the Gaussian's normalisation


def generate_data(rng: np.random.RandomState, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    epsilon = rng.normal(size=(n_samples))
    x_data = rng.uniform(-10.5, 10.5, n_samples)
    y_data = 7 * np.sin(0.75 * x_data) + 0.5 * x_data + epsilon
    return x_data, y_data


class MDN(nn.Module):
    def __init__(self, n_hidden: int, n_gaussians: int, variant: str = "healthy") -> None:
        super().__init__()
        self.z_h = nn.Sequential(nn.Linear(1, n_hidden), nn.Tanh())
        self.z_pi = nn.Linear(n_hidden, n_gaussians)
        self.z_sigma = nn.Linear(n_hidden, n_gaussians)
        self.z_mu = nn.Linear(n_hidden, n_gaussians)
        self.variant = variant

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z_h = self.z_h(x)
        pi = nn.functional.softmax(self.z_pi(z_h), 0 if self.variant == "pi_softmax_over_batch" else -1)
        sigma = self.z_sigma(z_h) if self.variant == "sigma_no_exp" else torch.exp(self.z_sigma(z_h))
        mu = self.z_mu(z_h)
        return pi, sigma, mu


def gaussian_distribution(y: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    # y copied once per component, centred on each mu, scaled by each sigma
    result = (y.expand_as(mu) - mu) * torch.reciprocal(sigma)
    result = -0.5 * (result * result)
    return (torch.exp(result) * torch.reciprocal(sigma)) * oneDivSqrtTwoPI


def mdn_loss_fn(pi: torch.Tensor, sigma: torch.Tensor, mu: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    result = gaussian_distribution(y, mu, sigma) * pi
    result = torch.sum(result, dim=1)
    result = -torch.log(result)
    return torch.mean(result)


def as_column(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.float32(values).reshape(len(values), n_input))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)
    x_data, y_data = generate_data(rng, n_samples)
    x_tensor, y_tensor = as_column(x_data), as_column(y_data)
    # inverted: predict x from y
    x_variable, y_variable = y_tensor, x_tensor

    network = MDN(n_hidden=20, n_gaussians=5, variant=variant)
    optimizer = torch.optim.Adam(network.parameters())

    def loss_fn(output, y):
        pi, sigma, mu = output
        return mdn_loss_fn(pi, sigma, mu, y)

    batch = (x_variable, y_variable)
    nx.preflight(network, batch, loss_fn, optimizer=optimizer, data=batch)
    mon = nx.monitor(network, optimizer, every=10)

    printed: list[float] = []
    for epoch in range(EPOCHS):
        pi_variable, sigma_variable, mu_variable = network(x_variable)
        loss = mdn_loss_fn(pi_variable, sigma_variable, mu_variable, y_variable)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log(loss)
        if epoch % 500 == 0:
            printed.append(loss.item())

    nx.finish(mon, network, batch, loss_fn, optimizer=optimizer, data=batch)
    # measure only: the loss on fresh samples of the same process
    x_new, y_new = generate_data(np.random.RandomState(seed + 1000), n_samples)
    with torch.no_grad():
        heldout = mdn_loss_fn(*network(as_column(y_new)), as_column(x_new))
    return {"last_printed_loss": printed[-1], "final_loss": loss.item(), "heldout_nll": float(heldout)}

"""Port of nitarshan's Bayes by Backprop notebook (Blundell et al. 2015, "Weight Uncertainty
in Neural Networks"): Bayesian linear layers with a Gaussian variational posterior per
weight, a scale-mixture prior, the sampled ELBO, Adam, and ensemble evaluation.

Source: github.com/nitarshan/bayes-by-backprop, ``Weight Uncertainty in Neural
Networks.ipynb`` at commit 186d9193fe12ac361d6fc6f5065f45e15a947aec (the notebook carries
no licence file; cited, not copied). Written anew from the facts of that notebook; no
code copied.

Kept: ``Gaussian(mu, rho)`` with ``sigma = log1p(exp(rho))``, ``sample() = mu + sigma *
eps`` (eps from ``Normal(0, 1)`` sampled per call) and ``log_prob`` summed over the
elements; ``ScaleMixtureGaussian(pi, sigma1, sigma2)`` with ``log(pi * p1 + (1 - pi) *
p2)`` summed (``PI = 0.5``, ``SIGMA_1 = exp(0)``, ``SIGMA_2 = exp(-6)``);
``BayesianLinear`` (``weight_mu``/``bias_mu`` ``U(-0.2, 0.2)``, ``weight_rho``/``bias_rho``
``U(-5, -4)``, weights sampled when training or ``sample=True``, else the means;
``log_prior`` and ``log_variational_posterior`` of the sampled weights stored on the layer
when training); ``BayesianNetwork`` of three such layers, ReLU, ReLU, ``log_softmax``;
``sample_elbo``: ``SAMPLES = 2`` forward passes, ``outputs.mean(0)`` of the log-probabilities,
the mean log prior and mean log posterior, ``nll_loss(..., reduction="sum")`` (the
notebook's ``size_average=False``), ``loss = (log_variational_posterior - log_prior) /
NUM_BATCHES + negative_log_likelihood``; the loop (``net.train()``, ``net.zero_grad()``,
``sample_elbo``, ``backward``, ``optimizer.step()``); ``optim.Adam(net.parameters())`` at
its defaults; ``test_ensemble`` (``net.eval()``, ``TEST_SAMPLES = 10`` sampled passes plus
the posterior mean, their log-probabilities averaged, argmax); ``ToTensor`` inputs.
Shrunk: scikit-learn's 8x8 digits (1,400 training images, 360 held out; 64 inputs)
instead of FashionMNIST's 28x28; hidden width 100 instead of 400; ``BATCH_SIZE`` 100 kept
(14 batches: the notebook asserts the training size is a multiple of it); 12 epochs
instead of 20; the TensorBoard writer, tqdm and the plots left out (the loss terms kept
as a record).
Measure only (after training): ``test_acc``, the accuracy of ``test_ensemble`` on the
held-out digits (the notebook's own number), and ``mean_entropy``, the mean entropy of the
ensemble's predictive distribution (the mean of the 11 passes' probabilities) on them.

nndx, as the author would add it: a preflight ``nndx.probe`` of the network on the first
training batch with the data term of the program's loss as the loss function
(``nll_loss`` of the network's log-probabilities with the program's reduction; the KL
term is stored on the layers of the model that ran, out of reach of a loss of
``(output, target)``), with the optimizer; ``nndx.Monitor(net, optimizer)``
around the epochs, each step's ELBO loss logged; after training ``nndx.probe(net, ...,
monitor=mon)`` on the same batch, diagnosed.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bayes_by_backprop"
SOURCE = Source("nitarshan/bayes-by-backprop", "Weight Uncertainty in Neural Networks.ipynb",
                "186d9193fe12ac361d6fc6f5065f45e15a947aec", "none stated")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "nll_mean_reduction",
            "negative_log_likelihood = F.nll_loss(outputs.mean(0), target) with the default mean reduction while "
            "the complexity cost is still the whole KL / NUM_BATCHES: the KL outweighs the data term by the batch "
            "size (100x) and the posterior stays near the prior",
            (C.WRONG_LOSS, C.UNDERFITTING),
            ("https://github.com/pawni/BayesByHypernet/issues/2",
             "https://github.com/tensorflow/probability/issues/719",
             "https://github.com/tensorflow/probability/issues/651"),
            Measure("test_acc", "held-out ensemble accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "missing_zero_grad",
            "net.zero_grad() dropped from the batch loop: every step's gradient is the sum of all gradients "
            "so far, Adam steps along a stale, ever-growing sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("test_acc", "held-out ensemble accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

# the options, shrunk
BATCH_SIZE, CLASSES, TRAIN_EPOCHS, SAMPLES, TEST_SAMPLES = 100, 10, 12, 2, 10
TRAIN_SIZE, TEST_SIZE, INPUTS, HIDDEN = 1400, 360, 64, 100
NUM_BATCHES = TRAIN_SIZE // BATCH_SIZE
PI = 0.5
SIGMA_1 = torch.FloatTensor([math.exp(-0)])
SIGMA_2 = torch.FloatTensor([math.exp(-6)])


class Gaussian:
    def __init__(self, mu: torch.Tensor, rho: torch.Tensor) -> None:
        self.mu, self.rho = mu, rho
        self.normal = torch.distributions.Normal(0, 1)

    @property
    def sigma(self) -> torch.Tensor:
        return torch.log1p(torch.exp(self.rho))

    def sample(self) -> torch.Tensor:
        epsilon = self.normal.sample(self.rho.size())
        return self.mu + self.sigma * epsilon

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        return (-math.log(math.sqrt(2 * math.pi)) - torch.log(self.sigma)
                - ((input - self.mu) ** 2) / (2 * self.sigma**2)).sum()  # fmt: skip


class ScaleMixtureGaussian:
    def __init__(self, pi: float, sigma1: torch.Tensor, sigma2: torch.Tensor) -> None:
        self.pi, self.sigma1, self.sigma2 = pi, sigma1, sigma2
        self.gaussian1 = torch.distributions.Normal(0, sigma1)
        self.gaussian2 = torch.distributions.Normal(0, sigma2)

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        prob1 = torch.exp(self.gaussian1.log_prob(input))
        prob2 = torch.exp(self.gaussian2.log_prob(input))
        return torch.log(self.pi * prob1 + (1 - self.pi) * prob2).sum()


class BayesianLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_mu = nn.Parameter(torch.Tensor(out_features, in_features).uniform_(-0.2, 0.2))
        self.weight_rho = nn.Parameter(torch.Tensor(out_features, in_features).uniform_(-5, -4))
        self.weight = Gaussian(self.weight_mu, self.weight_rho)
        self.bias_mu = nn.Parameter(torch.Tensor(out_features).uniform_(-0.2, 0.2))
        self.bias_rho = nn.Parameter(torch.Tensor(out_features).uniform_(-5, -4))
        self.bias = Gaussian(self.bias_mu, self.bias_rho)
        self.weight_prior = ScaleMixtureGaussian(PI, SIGMA_1, SIGMA_2)
        self.bias_prior = ScaleMixtureGaussian(PI, SIGMA_1, SIGMA_2)
        self.log_prior: torch.Tensor | float = 0
        self.log_variational_posterior: torch.Tensor | float = 0

    def forward(self, input: torch.Tensor, sample: bool = False, calculate_log_probs: bool = False) -> torch.Tensor:
        if self.training or sample:
            weight, bias = self.weight.sample(), self.bias.sample()
        else:
            weight, bias = self.weight.mu, self.bias.mu
        if self.training or calculate_log_probs:
            self.log_prior = self.weight_prior.log_prob(weight) + self.bias_prior.log_prob(bias)
            self.log_variational_posterior = self.weight.log_prob(weight) + self.bias.log_prob(bias)
        else:
            self.log_prior, self.log_variational_posterior = 0, 0
        return F.linear(input, weight, bias)


class BayesianNetwork(nn.Module):
    def __init__(self, mean_nll: bool = False) -> None:
        super().__init__()
        self.l1 = BayesianLinear(INPUTS, HIDDEN)
        self.l2 = BayesianLinear(HIDDEN, HIDDEN)
        self.l3 = BayesianLinear(HIDDEN, CLASSES)
        self.mean_nll = mean_nll  # the bug variant's reduction

    def forward(self, x: torch.Tensor, sample: bool = False) -> torch.Tensor:
        x = x.view(-1, INPUTS)
        x = F.relu(self.l1(x, sample))
        x = F.relu(self.l2(x, sample))
        return F.log_softmax(self.l3(x, sample), dim=1)

    def log_prior(self) -> torch.Tensor:
        return self.l1.log_prior + self.l2.log_prior + self.l3.log_prior

    def log_variational_posterior(self) -> torch.Tensor:
        return self.l1.log_variational_posterior + self.l2.log_variational_posterior + self.l3.log_variational_posterior

    def sample_elbo(self, input: torch.Tensor, target: torch.Tensor, samples: int = SAMPLES):
        outputs = torch.zeros(samples, BATCH_SIZE, CLASSES)
        log_priors = torch.zeros(samples)
        log_variational_posteriors = torch.zeros(samples)
        for i in range(samples):
            outputs[i] = self(input, sample=True)
            log_priors[i] = self.log_prior()
            log_variational_posteriors[i] = self.log_variational_posterior()
        log_prior = log_priors.mean()
        log_variational_posterior = log_variational_posteriors.mean()
        reduction = "mean" if self.mean_nll else "sum"
        negative_log_likelihood = F.nll_loss(outputs.mean(0), target, reduction=reduction)
        loss = (log_variational_posterior - log_prior) / NUM_BATCHES + negative_log_likelihood
        return loss, log_prior, log_variational_posterior, negative_log_likelihood


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed, test_size=TEST_SIZE)
    train_x, train_y = data.to_tensor(train_images)[:TRAIN_SIZE], train_labels[:TRAIN_SIZE]  # ToTensor
    test_x, test_y = data.to_tensor(test_images), test_labels
    loader_rng = torch.Generator().manual_seed(seed)  # DataLoader(shuffle=True)'s sampler

    net = BayesianNetwork(mean_nll=variant == "nll_mean_reduction")
    optimizer = optim.Adam(net.parameters())

    def elbo_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The data term of the program's loss for one sampled forward (the KL term lives on the layers of
        the model that ran, which a loss function of (output, target) cannot reach)."""
        reduction = "mean" if variant == "nll_mean_reduction" else "sum"
        return F.nll_loss(output, target, reduction=reduction)

    probe_batch = (train_x[:BATCH_SIZE], train_y[:BATCH_SIZE])
    nx.preflight(net, probe_batch, elbo_loss, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10)

    records: dict[str, list[float]] = {"loss": [], "complexity": [], "nll": []}
    for epoch in range(TRAIN_EPOCHS):
        net.train()
        order = torch.randperm(TRAIN_SIZE, generator=loader_rng)
        for batch_idx in range(NUM_BATCHES):
            idx = order[batch_idx * BATCH_SIZE : (batch_idx + 1) * BATCH_SIZE]
            data_b, target = train_x[idx], train_y[idx]
            if variant != "missing_zero_grad":
                net.zero_grad()
            loss, log_prior, log_variational_posterior, negative_log_likelihood = net.sample_elbo(data_b, target)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            records["loss"].append(loss.item())
            records["complexity"].append((log_variational_posterior - log_prior).item())
            records["nll"].append(negative_log_likelihood.item())

    nx.finish(mon, net, probe_batch, elbo_loss, optimizer=optimizer)

    # test_ensemble: TEST_SAMPLES sampled passes and the posterior mean, log-probabilities averaged
    net.eval()
    with torch.no_grad():
        outputs = torch.zeros(TEST_SAMPLES + 1, len(test_x), CLASSES)
        for i in range(TEST_SAMPLES):
            outputs[i] = net(test_x, sample=True)
        outputs[TEST_SAMPLES] = net(test_x, sample=False)
        pred = outputs.mean(0).argmax(1)
        probs = outputs.exp().mean(0)  # measure only: the predictive distribution
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(1).mean()
    tail = slice(-NUM_BATCHES, None)
    return {
        "test_acc": float((pred == test_y).float().mean()),
        "mean_entropy": float(entropy),
        "late_loss": float(np.mean(records["loss"][tail])),
        "late_complexity": float(np.mean(records["complexity"][tail])),
        "late_nll": float(np.mean(records["nll"][tail])),
    }

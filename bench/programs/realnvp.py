"""Port of karpathy's pytorch-normalizing-flows: RealNVP (affine coupling) fitted to 2-D moons
by maximum likelihood.

Source: github.com/karpathy/pytorch-normalizing-flows, ``nflib/flows.py`` and
``nflib/nets.py`` at commit b60e119b37be10ce2930ef9fa17e58686aaf2b3d (the repository's
HEAD), and the training loop of ``nflib1.ipynb`` (same tree). The repository states no
licence. Written anew from the facts of those files; no code copied.

Kept: ``DatasetMoons.sample(n)`` = scikit-learn's ``make_moons(n, noise=0.05)`` as float32,
fresh points every step; the prior ``TransformedDistribution(Uniform(0, 1),
SigmoidTransform().inv)`` (a standard logistic per dimension, with torch's support checks);
the notebook's RealNVP line, ``[AffineHalfFlow(dim=2, parity=i % 2) for i in range(9)]``;
``MLP`` = 4 ``Linear`` layers of width ``nh=24`` with ``nn.LeakyReLU(0.2)`` modules between;
``AffineHalfFlow``: ``x[:, ::2]`` / ``x[:, 1::2]`` swapped by the parity bit, ``s`` and
``t`` from two ``MLP``s of the untouched half (zero lambdas when scale or shift is off),
``z1 = exp(s) * x1 + t``, the halves written back into a ``torch.zeros`` tensor,
``log_det = sum(s, dim=1)``, and ``backward`` its inverse; ``NormalizingFlow`` (a
``ModuleList``, ``log_det`` accumulated from zeros, every intermediate ``z`` kept in
``zs``); ``NormalizingFlowModel.forward`` returning ``(zs, prior_logprob, log_det)`` and
``sample`` through the inverse; ``optim.Adam(lr=1e-4, weight_decay=1e-5)``; the loop
``model.train()``, ``x = d.sample(128)``, ``logprob = prior_logprob + log_det``, ``loss =
-torch.sum(logprob)``, ``model.zero_grad()``, ``backward``, ``step``, the loss printed every
100 steps; ``model.eval()`` after it.
Shrunk: nothing in the model or the first training loop (1,000 steps of 128 points, as in
the notebook); the notebook's second, plotting loop (500 more steps rendering the grid
warp) is left out. ``make_moons`` draws from a seeded ``RandomState`` instead of numpy's
global one, so runs repeat.
Measure only (not in the program): the per-point negative log-likelihood, by the correct
formula, of 1,024 held-out moons points after training, and of 1,024 model samples'
spread (the notebook plots both).
Not a variant: the log-det's sign flipped (``prior_logprob - log_det``, the bug of
VincentStimper/normalizing-flows#27) was tried first; its loss runs to -1e22 and the
prior's support check raises ValueError mid-training on seeds 0 and 2, so the harness
cannot measure it.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch with the
notebook's loss written as ``loss_fn(output, _)`` (a density model has no targets: the
batch is ``(x, None)``), with the optimizer; ``nndx.Monitor(model, optimizer)`` around the
loop, each step's loss logged (the notebook has no validation loss); then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn import datasets
from torch import nn, optim
from torch.distributions import SigmoidTransform, TransformedDistribution, Uniform

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "realnvp"
SOURCE = Source("karpathy/pytorch-normalizing-flows", "nflib/flows.py",
                "b60e119b37be10ce2930ef9fa17e58686aaf2b3d", "none stated")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's RealNVP as published"),
        Variant(
            "log_det_dropped",
            "logprob = prior_logprob: the log-det term of the change of variables left out of the NLL, so the "
            "flow is trained to squeeze every point onto the prior's mode instead of matching the density",
            (C.WRONG_LOSS,),
            ("https://github.com/MokkeMeguru/glow-realnvp-tutorial/issues/2",
             "https://github.com/Yang-Liu1082/InvDN/issues/9",
             "https://github.com/VincentStimper/normalizing-flows/issues/27"),
            Measure("heldout_nll", "held-out per-point NLL (correct formula) above the healthy run's by 1 nat or "
                    "more: 8.84/8.10 buggy against 0.70/0.93 healthy on seeds 0-1 (the training loss settles at "
                    "355 = 128 * 2 * log 4, the logistic prior's peak)",
                    lambda healthy, buggy: not buggy < healthy + 1.0),
        ),
        Variant(
            "no_zero_grad",
            "model.zero_grad() dropped from the loop: every Adam step is fed the sum of all the NLL gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/IDEA-Research/DN-DETR/issues/19",
             "https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/rll/deepul/issues/12"),
            Measure("heldout_nll", "held-out per-point NLL above the healthy run's by 0.5 nat or more: "
                    "2.00/1.90 against 0.70/0.93 on seeds 0-1",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
    )
}

STEPS, BATCH, N_FLOWS = 1000, 128, 9


class DatasetMoons:
    """two half-moons, fresh points on every call"""

    def __init__(self, rng: np.random.RandomState) -> None:
        self.rng = rng

    def sample(self, n: int) -> torch.Tensor:
        moons = datasets.make_moons(n_samples=n, noise=0.05, random_state=self.rng)[0].astype(np.float32)
        return torch.from_numpy(moons)


class MLP(nn.Module):
    """four Linear layers, LeakyReLU(0.2) between them"""

    def __init__(self, nin: int, nout: int, nh: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(nin, nh), nn.LeakyReLU(0.2),
            nn.Linear(nh, nh), nn.LeakyReLU(0.2),
            nn.Linear(nh, nh), nn.LeakyReLU(0.2),
            nn.Linear(nh, nout),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class AffineHalfFlow(nn.Module):
    """RealNVP coupling: one half scaled and shifted as a function of the other half,
    which half chosen by the parity bit."""

    def __init__(self, dim: int, parity: int, net_class=MLP, nh: int = 24, scale: bool = True,
                 shift: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.dim, self.parity = dim, parity
        self.s_cond = lambda x: x.new_zeros(x.size(0), self.dim // 2)
        self.t_cond = lambda x: x.new_zeros(x.size(0), self.dim // 2)
        if scale:
            self.s_cond = net_class(self.dim // 2, self.dim // 2, nh)
        if shift:
            self.t_cond = net_class(self.dim // 2, self.dim // 2, nh)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x0, x1 = x[:, ::2], x[:, 1::2]
        if self.parity:
            x0, x1 = x1, x0
        s, t = self.s_cond(x0), self.t_cond(x0)
        z0, z1 = x0, torch.exp(s) * x1 + t  # the second half moves, conditioned on the first
        if self.parity:
            z0, z1 = z1, z0
        z = torch.zeros((x.shape[0], self.dim))
        z[:, ::2], z[:, 1::2] = z0, z1
        return z, torch.sum(s, dim=1)

    def backward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z0, z1 = z[:, ::2], z[:, 1::2]
        if self.parity:
            z0, z1 = z1, z0
        s, t = self.s_cond(z0), self.t_cond(z0)
        x0, x1 = z0, (z1 - t) * torch.exp(-s)
        if self.parity:
            x0, x1 = x1, x0
        x = torch.zeros((z.shape[0], self.dim))
        x[:, ::2], x[:, 1::2] = x0, x1
        return x, torch.sum(-s, dim=1)


class NormalizingFlow(nn.Module):
    """flows in sequence"""

    def __init__(self, flows: list[nn.Module]) -> None:
        super().__init__()
        self.flows = nn.ModuleList(flows)

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        m, _ = x.shape
        log_det, zs = torch.zeros(m), [x]
        for flow in self.flows:
            x, ld = flow.forward(x)
            log_det += ld
            zs.append(x)
        return zs, log_det

    def backward(self, z: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        m, _ = z.shape
        log_det, xs = torch.zeros(m), [z]
        for flow in self.flows[::-1]:
            z, ld = flow.backward(z)
            log_det += ld
            xs.append(z)
        return xs, log_det


class NormalizingFlowModel(nn.Module):
    """a prior and a flow"""

    def __init__(self, prior, flows: list[nn.Module]) -> None:
        super().__init__()
        self.prior = prior
        self.flow = NormalizingFlow(flows)

    def forward(self, x: torch.Tensor):
        zs, log_det = self.flow.forward(x)
        prior_logprob = self.prior.log_prob(zs[-1]).view(x.size(0), -1).sum(1)
        return zs, prior_logprob, log_det

    def backward(self, z: torch.Tensor):
        return self.flow.backward(z)

    def sample(self, num_samples: int) -> list[torch.Tensor]:
        z = self.prior.sample((num_samples,))
        xs, _ = self.flow.backward(z)
        return xs


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    d = DatasetMoons(np.random.RandomState(seed))
    prior = TransformedDistribution(Uniform(torch.zeros(2), torch.ones(2)), SigmoidTransform().inv)  # logistic
    flows = [AffineHalfFlow(dim=2, parity=i % 2) for i in range(N_FLOWS)]
    model = NormalizingFlowModel(prior, flows)
    optimizer = optim.Adam(model.parameters(), lr=1e-4, weight_decay=1e-5)
    keep_log_det = variant != "log_det_dropped"

    def nll(output, _targets=None) -> torch.Tensor:
        """the notebook's loss, as a function of the model's output"""
        _zs, prior_logprob, log_det = output
        logprob = prior_logprob + log_det if keep_log_det else prior_logprob
        return -torch.sum(logprob)

    first_batch = (d.sample(BATCH), None)
    nx.preflight(model, first_batch, nll, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    printed: list[float] = []
    model.train()
    for k in range(STEPS):
        x = first_batch[0] if k == 0 else d.sample(BATCH)
        zs, prior_logprob, log_det = model(x)
        logprob = prior_logprob + log_det if keep_log_det else prior_logprob
        loss = -torch.sum(logprob)  # NLL
        if variant != "no_zero_grad":
            model.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log(loss)
        if k % 100 == 0:
            printed.append(loss.item())

    nx.finish(mon, model, first_batch, nll, optimizer=optimizer)
    model.eval()
    # measure only: held-out NLL by the correct formula, and the spread of the model's samples
    rng = torch.get_rng_state()
    x_val = DatasetMoons(np.random.RandomState(seed + 1000)).sample(1024)
    with torch.no_grad():
        _, prior_logprob, log_det = model(x_val)
        heldout = -(prior_logprob + log_det).mean()
        torch.manual_seed(seed + 2000)
        samples = model.sample(1024)[-1]
    torch.set_rng_state(rng)
    return {"last_printed_loss": printed[-1], "heldout_nll": float(heldout), "sample_std": float(samples.std())}

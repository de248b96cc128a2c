"""Port of DakshIdnani's pytorch-nice: NICE (additive coupling layers, a diagonal scaling
layer, a logistic prior) fitted to images by maximum likelihood.

Source: github.com/DakshIdnani/pytorch-nice, ``train.py``, ``nice.py``, ``modules.py`` and
``config.py`` at commit c184c0add1e181dfdb09af6a5c0ba2a97f8419f1 (the repository's HEAD;
MIT, Copyright (c) 2019 Daksh Idnani). Written anew from the facts of those files; no code
copied.

Kept: ``CouplingLayer`` = an MLP ``m`` of ``NUM_NET_LAYERS`` ``Linear`` layers (data_dim ->
hidden -> ... -> data_dim) with ``LeakyReLU(0.2)`` between them, applied to the masked half
``mask * x`` and added to the other half, ``y = mask * x + (1 - mask) * x + m(mask * x) *
(1 - mask)``, its log-det passed through unchanged (additive coupling: 0), and the inverse
subtracting the same term; ``NICE._get_mask`` (ones on the even indices, flipped for the
layers with ``i % 2 == 0``: consecutive layers alternate which half they transform);
``ScalingLayer`` with ``log_scale_vector = randn(1, data_dim)`` as a parameter, ``exp(s) *
x`` and ``log_det += sum(s)`` (its inverse ``exp(-s) * x``); ``LogisticDistribution.log_prob
= -(softplus(x) + softplus(-x))`` and its sampler ``log u - log(1 - u)``; ``NICE.forward``
returning ``(z, log_likelihood)`` with ``log_likelihood = sum(prior.log_prob(z), dim=1) +
log_det``; ``f_inverse`` through the scaling layer then the coupling layers in reverse;
``config.py``'s 4 coupling layers of 6 net layers, batch 256; ``train.py``: ``model.train()``,
``optim.Adam(model.parameters())`` (lr 1e-3), a shuffled loader, ``x = x.view(-1, D) +
torch.rand(D) / levels`` (one dequantisation noise vector per batch, broadcast over it, as
written), ``torch.clamp(x, 0, 1)``, ``loss = -torch.mean(likelihood)``, ``loss.backward()``,
``opt.step()``, ``model.zero_grad()`` (after the step, as written), the epoch's mean
log-likelihood printed (kept as a record).
Shrunk: scikit-learn's 8x8 digits (1,437 train, 360 held out; 64 dimensions, pixels 0..16
scaled to [0, 1] as ToTensor scales MNIST's 0..255; noise ``rand / 17`` for 17 levels
instead of ``rand / 256``) instead of MNIST's 784; 128 hidden units instead of 1000; 80
epochs of 6 batches (480 steps) instead of 75 of 235; CPU, no checkpoint saves (the
original's ``epoch`` is undefined there anyway). ``NICE.sample`` (which reads an undefined
``self.samples``) is written as meant: prior samples of shape (n, D) through ``f_inverse``.
Measure only (not in the program): the held-out NLL in bits per dimension (the correct
formula, each pixel dequantised with its own noise), and the mean top-class probability
that a logistic-regression classifier fitted to the training digits gives 256 model
samples (clamped to [0, 1]).

nndx, as the author would add it: the model returns ``(z, log_likelihood)`` and a density
model has no targets, so the batch is ``(x, None)`` and ``loss_fn(output, _)`` is
``-mean(output[1])``; a preflight ``nndx.probe`` on the first dequantised batch with the
optimizer, ``nndx.Monitor(model, opt)`` around the epochs with every batch's loss logged,
then ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.distributions import Uniform

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nice"
SOURCE = Source("DakshIdnani/pytorch-nice", "train.py", "c184c0add1e181dfdb09af6a5c0ba2a97f8419f1", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 64-dim digits, 128 hidden units, 80 epochs)"),
        Variant(
            "scaling_log_det_dropped",
            "ScalingLayer.forward returns logdet unchanged (the sum(log_scale_vector) term left out of the "
            "log-likelihood): the only non-volume-preserving layer is trained to shrink every point onto the "
            "logistic prior's mode, the loss falls while the true likelihood collapses",
            (C.WRONG_LOSS,),
            ("https://github.com/MokkeMeguru/glow-realnvp-tutorial/issues/2",
             "https://github.com/Information-Fusion-Lab-Umass/NuX/issues/10",
             "https://github.com/VincentStimper/normalizing-flows/issues/27"),
            Measure("heldout_bpd", "held-out NLL (correct formula) in bits/dim at least 0.5 above the healthy run's: "
                    "2.40 against 1.29 on seed 0 (the training NLL settles near 89 nats, the healthy one "
                    "falls to 57)",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "no_zero_grad",
            "model.zero_grad() dropped from the loop: every Adam step is fed the sum of all the NLL gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/rll/deepul/issues/12",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            Measure("heldout_bpd", "held-out NLL in bits/dim at least 0.2 above the healthy run's: "
                    "1e12 against 1.29 on seed 0 (the printed log-likelihood runs to -3e13)",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
    )
}

cfg = {"TRAIN_BATCH_SIZE": 256, "TRAIN_EPOCHS": 80, "NUM_COUPLING_LAYERS": 4, "NUM_NET_LAYERS": 6,
       "NUM_HIDDEN_UNITS": 128}  # fmt: skip
DATA_DIM, LEVELS = 64, 17


# --------------------------------------------------------------------------- modules.py


class CouplingLayer(nn.Module):
    """Additive coupling (NICE, section 3.2): the unmasked half moves by m(masked half)."""

    def __init__(self, data_dim: int, hidden_dim: int, mask: torch.Tensor, num_layers: int = 4) -> None:
        super().__init__()
        assert data_dim % 2 == 0
        self.mask = mask
        modules: list[nn.Module] = [nn.Linear(data_dim, hidden_dim), nn.LeakyReLU(0.2)]
        for _ in range(num_layers - 2):
            modules += [nn.Linear(hidden_dim, hidden_dim), nn.LeakyReLU(0.2)]
        modules.append(nn.Linear(hidden_dim, data_dim))
        self.m = nn.Sequential(*modules)

    def forward(self, x: torch.Tensor, logdet, invert: bool = False):
        kept, moved = self.mask * x, (1.0 - self.mask) * x
        shift = self.m(kept) * (1.0 - self.mask)
        return (kept + moved - shift if invert else kept + moved + shift), logdet


class ScalingLayer(nn.Module):
    """Diagonal scaling (NICE, section 3.3): the only layer with a log-det."""

    def __init__(self, data_dim: int, keep_log_det: bool = True) -> None:
        super().__init__()
        self.log_scale_vector = nn.Parameter(torch.randn(1, data_dim, requires_grad=True))
        self.keep_log_det = keep_log_det

    def forward(self, x: torch.Tensor, logdet, invert: bool = False):
        log_det_jacobian = torch.sum(self.log_scale_vector)
        if invert:
            return torch.exp(-self.log_scale_vector) * x, logdet - log_det_jacobian
        if not self.keep_log_det:  # the bug: the scaling's log-det never reaches the likelihood
            return torch.exp(self.log_scale_vector) * x, logdet
        return torch.exp(self.log_scale_vector) * x, logdet + log_det_jacobian


class LogisticDistribution:
    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return -(F.softplus(x) + F.softplus(-x))

    def sample(self, size) -> torch.Tensor:
        z = Uniform(torch.FloatTensor([0.0]), torch.FloatTensor([1.0])).sample(size)
        return torch.log(z) - torch.log(1.0 - z)


# --------------------------------------------------------------------------- nice.py


class NICE(nn.Module):
    def __init__(self, data_dim: int, num_coupling_layers: int = 3, keep_log_det: bool = True) -> None:
        super().__init__()
        self.data_dim = data_dim
        masks = [self._get_mask(data_dim, orientation=(i % 2 == 0)) for i in range(num_coupling_layers)]
        self.coupling_layers = nn.ModuleList([
            CouplingLayer(data_dim=data_dim, hidden_dim=cfg["NUM_HIDDEN_UNITS"], mask=masks[i],
                          num_layers=cfg["NUM_NET_LAYERS"])
            for i in range(num_coupling_layers)
        ])  # fmt: skip
        self.scaling_layer = ScalingLayer(data_dim=data_dim, keep_log_det=keep_log_det)
        self.prior = LogisticDistribution()

    def forward(self, x: torch.Tensor, invert: bool = False):
        if invert:
            return self.f_inverse(x)
        z, log_det_jacobian = self.f(x)
        log_likelihood = torch.sum(self.prior.log_prob(z), dim=1) + log_det_jacobian
        return z, log_likelihood

    def f(self, x: torch.Tensor):
        z, log_det_jacobian = x, 0
        for coupling_layer in self.coupling_layers:
            z, log_det_jacobian = coupling_layer(z, log_det_jacobian)
        return self.scaling_layer(z, log_det_jacobian)

    def f_inverse(self, z: torch.Tensor) -> torch.Tensor:
        x, _ = self.scaling_layer(z, 0, invert=True)
        for coupling_layer in reversed(self.coupling_layers):
            x, _ = coupling_layer(x, 0, invert=True)
        return x

    def sample(self, num_samples: int) -> torch.Tensor:
        z = self.prior.sample([num_samples, self.data_dim]).view(num_samples, self.data_dim)
        return self.f_inverse(z)

    @staticmethod
    def _get_mask(dim: int, orientation: bool = True) -> torch.Tensor:
        mask = np.zeros(dim)
        mask[::2] = 1.0
        if orientation:
            mask = 1.0 - mask  # flip the mask's orientation
        return torch.tensor(mask).float()


# --------------------------------------------------------------------------- train.py


def classifier_confidence(train_x: np.ndarray, train_y: np.ndarray, samples: np.ndarray) -> float:
    """Measure only: a logistic regression's mean top-class probability on the samples."""
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=300).fit(train_x, train_y)
    return float(clf.predict_proba(samples).max(axis=1).mean())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, _ = data.digit_images(seed=seed)
    # ToTensor's [0, 1] for the digits' 17 levels (0..16)
    train_x = torch.round(train_raw.float() * 16.0 / 255.0).div(16.0).view(-1, DATA_DIM)
    test_x = torch.round(test_raw.float() * 16.0 / 255.0).div(16.0).view(-1, DATA_DIM)
    dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_x, train_labels),
                                             batch_size=cfg["TRAIN_BATCH_SIZE"], shuffle=True,
                                             generator=torch.Generator().manual_seed(seed))  # fmt: skip

    model = NICE(data_dim=DATA_DIM, num_coupling_layers=cfg["NUM_COUPLING_LAYERS"],
                 keep_log_det=variant != "scaling_log_det_dropped")  # fmt: skip
    model.train()
    opt = optim.Adam(model.parameters())

    def nll(output, _targets=None) -> torch.Tensor:
        """the program's loss, as a function of the model's output"""
        _z, likelihood = output
        return -torch.mean(likelihood)

    probe_gen = torch.Generator().manual_seed(seed + 1)
    first_batch = (torch.clamp(train_x[: cfg["TRAIN_BATCH_SIZE"]] + torch.rand(DATA_DIM, generator=probe_gen) / LEVELS,
                               0, 1), None)  # fmt: skip
    nx.preflight(model, first_batch, nll, optimizer=opt)
    mon = nx.monitor(model, opt, every=5)

    printed: list[float] = []
    for _epoch in range(cfg["TRAIN_EPOCHS"]):
        mean_likelihood, num_minibatches = 0.0, 0
        for x, _ in dataloader:
            x = x.view(-1, DATA_DIM) + torch.rand(DATA_DIM) / LEVELS
            x = torch.clamp(x, 0, 1)
            z, likelihood = model(x)
            loss = -torch.mean(likelihood)  # NLL
            loss.backward()
            opt.step()
            if variant != "no_zero_grad":
                model.zero_grad()
            mon.log(loss)
            mean_likelihood -= loss.item()
            num_minibatches += 1
        printed.append(mean_likelihood / num_minibatches)  # 'Epoch {} completed. Log Likelihood: {}'

    nx.finish(mon, model, first_batch, nll, optimizer=opt)

    # measure only: held-out NLL in bits/dim by the correct formula, and the samples' legibility
    rng = torch.get_rng_state()
    torch.manual_seed(seed + 1000)
    model.eval()
    with torch.no_grad():
        x_val = torch.clamp(test_x + torch.rand_like(test_x) / LEVELS, 0, 1)
        zs = x_val
        log_det = torch.zeros(())
        for layer in model.coupling_layers:
            zs, log_det = layer(zs, log_det)
        zs = torch.exp(model.scaling_layer.log_scale_vector) * zs
        log_det = log_det + model.scaling_layer.log_scale_vector.sum()
        ll = model.prior.log_prob(zs).sum(1) + log_det
        heldout_bpd = float(-ll.mean() / (DATA_DIM * np.log(2.0)))
        samples = model.sample(256).clamp(0, 1).numpy()
    torch.set_rng_state(rng)
    confidence = classifier_confidence(train_x.numpy(), train_labels.numpy(), samples)
    return {"heldout_bpd": heldout_bpd, "sample_confidence": confidence, "last_printed_ll": printed[-1]}

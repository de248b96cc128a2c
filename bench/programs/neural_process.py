"""Port of EmilienDupont/neural-processes: a latent Neural Process on 1-D sine functions.

Source: github.com/EmilienDupont/neural-processes, ``neural_process.py``, ``models.py``,
``training.py``, ``utils.py``, ``datasets.py`` and the 1-D notebook ``example-1d.ipynb``
at commit b6f31c36a9f9df6b80d2a7f9ba756855fce0e13b (MIT, Copyright (c) 2019 Emilien
Dupont). Written anew from the facts of those files; no code copied.

Kept: ``Encoder`` (x, y) -> r_i: Linear(x+y, h), ReLU(inplace), Linear(h, h), ReLU,
Linear(h, r); ``MuSigmaEncoder``: Linear(r, r) + relu, then mu = Linear(r, z) and
sigma = 0.1 + 0.9 * sigmoid(Linear(r, z)); ``Decoder`` (x, z) -> y: z unsqueezed and
repeated over the points, concatenated with x, three Linear+ReLU layers of width h, then
mu = Linear(h, y) and sigma = 0.1 + 0.9 * softplus(Linear(h, y)); ``NeuralProcess``:
points flattened through the encoder, ``aggregate`` the mean over the points, in
training mode both q(z | target) and q(z | context), z = q_target.rsample(), p(y) =
Normal(decoder(x_target, z)); in test mode z from q(z | context) only;
``NeuralProcessTrainer``: per batch ``zero_grad``, the numbers of context and extra target
points drawn with python's ``randint`` from their ranges, ``context_target_split`` (one
``np.random.choice`` of locations without replacement for the whole batch, the context
the first ``num_context`` of them, the target all of them), the loss ``-log_prob(y_target)
.mean(dim=0).sum() + kl_divergence(q_target, q_context).mean(dim=0).sum()``, backward,
step, the per-epoch average loss history, a print every ``print_freq`` steps (kept as a
record); ``SineData``: a * sin(x - b), a ~ U(-1, 1), b ~ U(-0.5, 0.5), 100 points on
[-pi, pi]; the notebook's x/y/r/z/h dims 1/1/50/50/50, ``Adam(lr=3e-4)``, 4 context and 4
extra target points, the ``training`` flag set by hand (``neuralprocess.training =
True``/``False``) as the notebook does.
Shrunk: 600 training functions instead of 2,000, batch 8 instead of 2, 10 epochs instead
of 30 (750 steps instead of 30,000), so the learning rate is 3e-3 instead of 3e-4; the
amplitude range (-2, 2) instead of (-1, 1) (at (-1, 1) and 750 to 1,500 steps the latent
stays unused: the held-out mean is 0 everywhere, MSE equal to the functions' variance).
Measure only (not in the program): on 200 held-out functions (the notebook's last cell:
context from ``context_target_split``, the model in test mode, all 100 points as the
target), the mean per-point log-likelihood of the true y under p(y), and the MSE of its mean.

nndx, as the author would add it: the model's output is three distributions, so
``loss_fn`` is the trainer's ``_loss`` as a function of ``(p_y_pred, q_target, q_context)``
and ``y_target``, and a batch is ``((x_context, y_context, x_target, y_target),
y_target)``; a preflight ``nndx.probe`` on the first batch's split with the optimizer;
``nndx.Monitor(model, optimizer)`` around ``train``, every loss logged; then
``nndx.probe(..., monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import nn
from torch.distributions import Normal
from torch.distributions.kl import kl_divergence
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "neural_process"
SOURCE = Source("EmilienDupont/neural-processes", "training.py", "b6f31c36a9f9df6b80d2a7f9ba756855fce0e13b", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (the 1-D notebook, shrunk)"),
        Variant(
            "decoder_z_repeat_not_interleaved",
            "the decoder tiles z with z.repeat(num_points, 1) instead of z.unsqueeze(1).repeat(1, num_points, 1): "
            "the flattened (batch * points) rows of x are paired with the z of other functions in the batch",
            (C.WRONG_RESHAPE,),
            ("https://github.com/wenet-e2e/west/pull/121", "https://github.com/Li-Wanhua/POEs/issues/4",
             "https://github.com/huggingface/diffusers/issues/12292"),
            Measure("heldout_mse", "held-out MSE of the predicted mean 1.3x the healthy run's or more: 0.72 "
                    "against 0.14 on seed 0 (the prior's variance is 0.67: the context is not used)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "kl_misplaced_parenthesis",
            "the KL term written by hand from log-variances with the variance ratio inside the parenthesis "
            "divided by the prior variance: ((var_q / var_p + (mu_q - mu_p)**2) / var_p - 1 - log(var_q / var_p)) / 2",
            (C.WRONG_LOSS,),
            ("https://github.com/wassname/attentive-neural-processes/issues/5",
             "https://github.com/kasparmartens/NeuralProcesses/issues/1",
             "https://github.com/FluxML/model-zoo/pull/147"),
            Measure("heldout_loglik", "held-out per-point log-likelihood at least 0.1 below the healthy run's: "
                    "-1.12 against -0.17 on seed 0 (MSE 0.71 against 0.14)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

X_DIM, Y_DIM, R_DIM, Z_DIM, H_DIM = 1, 1, 50, 50, 50
N_TRAIN, N_TEST, NUM_POINTS, BATCH_SIZE, EPOCHS, LR = 600, 200, 100, 8, 10, 3e-3
AMPLITUDE_RANGE = (-2.0, 2.0)
NUM_CONTEXT, NUM_TARGET = 4, 4


# --------------------------------------------------------------------------- datasets.py


class SineData(Dataset):
    """f(x) = a * sin(x - b) on ``num_points`` points of [-pi, pi] (numpy's global RNG, as published)."""

    def __init__(self, amplitude_range=(-1.0, 1.0), shift_range=(-0.5, 0.5), num_samples=1000, num_points=100):
        self.num_samples, self.num_points = num_samples, num_points
        self.x_dim = self.y_dim = 1
        a_min, a_max = amplitude_range
        b_min, b_max = shift_range
        self.data = []
        for _ in range(num_samples):
            a = (a_max - a_min) * np.random.rand() + a_min
            b = (b_max - b_min) * np.random.rand() + b_min
            x = torch.linspace(-math.pi, math.pi, num_points).unsqueeze(1)
            self.data.append((x, a * torch.sin(x - b)))

    def __getitem__(self, index: int):
        return self.data[index]

    def __len__(self) -> int:
        return self.num_samples


# --------------------------------------------------------------------------- models.py


class Encoder(nn.Module):
    def __init__(self, x_dim: int, y_dim: int, h_dim: int, r_dim: int) -> None:
        super().__init__()
        self.input_to_hidden = nn.Sequential(nn.Linear(x_dim + y_dim, h_dim), nn.ReLU(inplace=True),
                                             nn.Linear(h_dim, h_dim), nn.ReLU(inplace=True),
                                             nn.Linear(h_dim, r_dim))  # fmt: skip

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.input_to_hidden(torch.cat((x, y), dim=1))


class MuSigmaEncoder(nn.Module):
    def __init__(self, r_dim: int, z_dim: int) -> None:
        super().__init__()
        self.r_to_hidden = nn.Linear(r_dim, r_dim)
        self.hidden_to_mu = nn.Linear(r_dim, z_dim)
        self.hidden_to_sigma = nn.Linear(r_dim, z_dim)

    def forward(self, r: torch.Tensor):
        hidden = torch.relu(self.r_to_hidden(r))
        mu = self.hidden_to_mu(hidden)
        sigma = 0.1 + 0.9 * torch.sigmoid(self.hidden_to_sigma(hidden))
        return mu, sigma


class Decoder(nn.Module):
    def __init__(self, x_dim: int, z_dim: int, h_dim: int, y_dim: int, tile_wrong: bool = False) -> None:
        super().__init__()
        self.x_dim, self.z_dim, self.h_dim, self.y_dim = x_dim, z_dim, h_dim, y_dim
        self.xz_to_hidden = nn.Sequential(nn.Linear(x_dim + z_dim, h_dim), nn.ReLU(inplace=True),
                                          nn.Linear(h_dim, h_dim), nn.ReLU(inplace=True),
                                          nn.Linear(h_dim, h_dim), nn.ReLU(inplace=True))  # fmt: skip
        self.hidden_to_mu = nn.Linear(h_dim, y_dim)
        self.hidden_to_sigma = nn.Linear(h_dim, y_dim)
        self.tile_wrong = tile_wrong

    def forward(self, x: torch.Tensor, z: torch.Tensor):
        batch_size, num_points, _ = x.size()
        if self.tile_wrong:  # the bug: [z0, z1, ..., z0, z1, ...] against x's [b0 p0, b0 p1, ...]
            z_flat = z.repeat(num_points, 1)
        else:
            z = z.unsqueeze(1).repeat(1, num_points, 1)
            z_flat = z.view(batch_size * num_points, self.z_dim)
        x_flat = x.view(batch_size * num_points, self.x_dim)
        hidden = self.xz_to_hidden(torch.cat((x_flat, z_flat), dim=1))
        mu = self.hidden_to_mu(hidden).view(batch_size, num_points, self.y_dim)
        pre_sigma = self.hidden_to_sigma(hidden).view(batch_size, num_points, self.y_dim)
        sigma = 0.1 + 0.9 * F.softplus(pre_sigma)
        return mu, sigma


# --------------------------------------------------------------------------- neural_process.py


class NeuralProcess(nn.Module):
    def __init__(self, x_dim: int, y_dim: int, r_dim: int, z_dim: int, h_dim: int, tile_wrong: bool = False) -> None:
        super().__init__()
        self.x_dim, self.y_dim, self.r_dim, self.z_dim, self.h_dim = x_dim, y_dim, r_dim, z_dim, h_dim
        self.xy_to_r = Encoder(x_dim, y_dim, h_dim, r_dim)
        self.r_to_mu_sigma = MuSigmaEncoder(r_dim, z_dim)
        self.xz_to_y = Decoder(x_dim, z_dim, h_dim, y_dim, tile_wrong=tile_wrong)

    def aggregate(self, r_i: torch.Tensor) -> torch.Tensor:
        return torch.mean(r_i, dim=1)

    def xy_to_mu_sigma(self, x: torch.Tensor, y: torch.Tensor):
        batch_size, num_points, _ = x.size()
        x_flat = x.view(batch_size * num_points, self.x_dim)
        y_flat = y.contiguous().view(batch_size * num_points, self.y_dim)
        r_i = self.xy_to_r(x_flat, y_flat).view(batch_size, num_points, self.r_dim)
        return self.r_to_mu_sigma(self.aggregate(r_i))

    def forward(self, x_context, y_context, x_target, y_target=None):
        if self.training:
            mu_target, sigma_target = self.xy_to_mu_sigma(x_target, y_target)
            mu_context, sigma_context = self.xy_to_mu_sigma(x_context, y_context)
            q_target = Normal(mu_target, sigma_target)
            q_context = Normal(mu_context, sigma_context)
            z_sample = q_target.rsample()
            y_pred_mu, y_pred_sigma = self.xz_to_y(x_target, z_sample)
            return Normal(y_pred_mu, y_pred_sigma), q_target, q_context
        mu_context, sigma_context = self.xy_to_mu_sigma(x_context, y_context)
        z_sample = Normal(mu_context, sigma_context).rsample()
        y_pred_mu, y_pred_sigma = self.xz_to_y(x_target, z_sample)
        return Normal(y_pred_mu, y_pred_sigma)


# --------------------------------------------------------------------------- utils.py


def context_target_split(x, y, num_context: int, num_extra_target: int):
    num_points = x.shape[1]
    locations = np.random.choice(num_points, size=num_context + num_extra_target, replace=False)
    x_context = x[:, locations[:num_context], :]
    y_context = y[:, locations[:num_context], :]
    x_target = x[:, locations, :]
    y_target = y[:, locations, :]
    return x_context, y_context, x_target, y_target


# --------------------------------------------------------------------------- training.py


def kl_misplaced(q_target: Normal, q_context: Normal) -> torch.Tensor:
    """The hand-written KL(q_target || q_context) from log-variances, parenthesis misplaced (the bug)."""
    log_var_post, log_var_prior = 2 * q_target.scale.log(), 2 * q_context.scale.log()
    var_ratio_log = log_var_post - log_var_prior
    kl = (var_ratio_log.exp() + (q_target.loc - q_context.loc) ** 2) / log_var_prior.exp() - 1.0 - var_ratio_log
    return 0.5 * kl


class NeuralProcessTrainer:
    def __init__(self, neural_process: NeuralProcess, optimizer, num_context_range, num_extra_target_range,
                 print_freq: int = 100, variant: str = "healthy", nx: Nndx | None = None) -> None:  # fmt: skip
        self.neural_process, self.optimizer = neural_process, optimizer
        self.num_context_range, self.num_extra_target_range = num_context_range, num_extra_target_range
        self.print_freq = print_freq
        self.steps = 0
        self.epoch_loss_history: list[float] = []
        self.printed: list[str] = []
        self.variant, self.nx = variant, nx
        self.probe_batch = None
        self.mon = None

    def train(self, data_loader: DataLoader, epochs: int) -> None:
        for epoch in range(epochs):
            epoch_loss = 0.0
            for _i, data in enumerate(data_loader):
                self.optimizer.zero_grad()
                num_context = random.randint(*self.num_context_range)
                num_extra_target = random.randint(*self.num_extra_target_range)
                x, y = data
                x_context, y_context, x_target, y_target = context_target_split(x, y, num_context, num_extra_target)
                if self.probe_batch is None:  # the author's preflight, on the first split there is
                    self.probe_batch = ((x_context, y_context, x_target, y_target), y_target)
                    self.nx.preflight(self.neural_process, self.probe_batch, self.loss_fn, optimizer=self.optimizer)
                    self.mon = self.nx.monitor(self.neural_process, self.optimizer, every=10)
                p_y_pred, q_target, q_context = self.neural_process(x_context, y_context, x_target, y_target)
                loss = self._loss(p_y_pred, y_target, q_target, q_context)
                loss.backward()
                self.optimizer.step()
                self.mon.log(loss)
                epoch_loss += loss.item()
                self.steps += 1
                if self.steps % self.print_freq == 0:
                    self.printed.append(f"iteration {self.steps}, loss {loss.item():.3f}")
            self.printed.append(f"Epoch: {epoch}, Avg_loss: {epoch_loss / len(data_loader)}")
            self.epoch_loss_history.append(epoch_loss / len(data_loader))

    def loss_fn(self, output, y_target: torch.Tensor) -> torch.Tensor:
        """``_loss`` as a function of the model's output and the targets (for nndx)."""
        p_y_pred, q_target, q_context = output
        return self._loss(p_y_pred, y_target, q_target, q_context)

    def _loss(self, p_y_pred: Normal, y_target: torch.Tensor, q_target: Normal, q_context: Normal) -> torch.Tensor:
        log_likelihood = p_y_pred.log_prob(y_target).mean(dim=0).sum()
        if self.variant == "kl_misplaced_parenthesis":
            kl = kl_misplaced(q_target, q_context).mean(dim=0).sum()
        else:
            kl = kl_divergence(q_target, q_context).mean(dim=0).sum()
        return -log_likelihood + kl


# --------------------------------------------------------------------------- the notebook


def heldout(model: NeuralProcess, test: SineData) -> tuple[float, float]:
    """Measure only: context from ``context_target_split``, all points as target, test mode."""
    x = torch.stack([test[i][0] for i in range(len(test))])
    y = torch.stack([test[i][1] for i in range(len(test))])
    model.training = False
    with torch.no_grad():
        x_context, y_context, _, _ = context_target_split(x, y, NUM_CONTEXT, NUM_TARGET)
        p_y_pred = model(x_context, y_context, x)
        loglik = p_y_pred.log_prob(y).mean().item()
        mse = ((p_y_pred.loc - y) ** 2).mean().item()
    model.training = True
    return loglik, mse


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    dataset = SineData(amplitude_range=AMPLITUDE_RANGE, shift_range=(-0.5, 0.5), num_samples=N_TRAIN)
    test = SineData(amplitude_range=AMPLITUDE_RANGE, shift_range=(-0.5, 0.5), num_samples=N_TEST)
    neuralprocess = NeuralProcess(X_DIM, Y_DIM, R_DIM, Z_DIM, H_DIM,
                                  tile_wrong=variant == "decoder_z_repeat_not_interleaved")  # fmt: skip
    data_loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.Adam(neuralprocess.parameters(), lr=LR)
    np_trainer = NeuralProcessTrainer(neuralprocess, optimizer, num_context_range=(NUM_CONTEXT, NUM_CONTEXT),
                                      num_extra_target_range=(NUM_TARGET, NUM_TARGET), print_freq=200,
                                      variant=variant, nx=nx)  # fmt: skip
    neuralprocess.training = True
    np_trainer.train(data_loader, EPOCHS)
    if np_trainer.mon is not None:
        nx.finish(np_trainer.mon, neuralprocess, np_trainer.probe_batch, np_trainer.loss_fn, optimizer=optimizer)
    loglik, mse = heldout(neuralprocess, test)
    return {"heldout_loglik": loglik, "heldout_mse": mse, "final_epoch_loss": np_trainer.epoch_loss_history[-1],
            "steps": float(np_trainer.steps)}  # fmt: skip

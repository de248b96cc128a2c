"""Port of the Fourier Neural Operator's 1-D script (Li et al., "Fourier Neural Operator for
Parametric Partial Differential Equations"): the operator from a Burgers equation's initial
condition a(x) to its solution u(x, 1), learned by four Fourier layers.

Source: github.com/neuraloperator/neuraloperator (formerly zongyi-li/fourier_neural_operator),
``fourier_1d.py``, ``utilities3.py`` (``LpLoss``), ``Adam.py`` and the data generator
``data_generation/burgers/gen_burgers1.m``, ``GRF1.m``, ``burgers1.m`` at commit
e12ed83d2baeea55ef572ac0dda6247b04489032 (MIT, Copyright (c) 2020 Zongyi Li), the newest
commit that touches ``fourier_1d.py``: the repository's default branch has since become the
``neuralop`` library and no longer holds the script. Written anew from the facts of those
files; no code copied.

Kept: ``SpectralConv1d`` (complex weights ``scale * torch.rand(in, out, modes, cfloat)`` with
``scale = 1 / (in * out)``, ``torch.fft.rfft``, the lowest ``modes`` coefficients mixed by
``einsum("bix,iox->box")`` into a zero ``out_ft`` of ``out_channels``, ``irfft(n=x.size(-1))``);
``FNO1d`` (the grid ``linspace(0, 1, s)`` concatenated to a(x), ``fc0`` Linear(2, width),
``permute(0, 2, 1)``, four Fourier layers ``conv_i(x) + w_i(x)`` with ``w_i`` a 1x1 ``Conv1d``,
GELU after the first three, padding commented out as in the script, ``permute`` back, ``fc1``
Linear(width, 128), GELU, ``fc2`` Linear(128, 1)); ``LpLoss(size_average=False)``'s relative
L2 loss (the per-sample ``||out - y|| / ||y||`` summed over the batch), backpropagated, with the
MSE computed alongside for printing only; the repository's own ``Adam`` (coupled L2 weight
decay, the second moment ``grad * grad.conj()`` for the complex weights) with ``lr=1e-3,
weight_decay=1e-4``; ``StepLR(step_size, gamma=0.5)`` stepped once an epoch; the loop
(``model.train()``, ``zero_grad``, ``out.view(batch_size, -1)``, ``backward``, ``step``) and the
per-epoch test (``model.eval()``, ``no_grad``, the summed relative L2 over the test set divided by
``ntest``). The data as ``gen_burgers1.m`` makes it: initial conditions from the periodic
Gaussian random field ``GRF1`` (``gamma=2.5, tau=7, sigma=7^2``), the viscous Burgers equation
``u_t + (u^2/2)_x = nu u_xx`` on the periodic unit interval solved to t = 1 by a
pseudo-spectral method (``spin``'s role: here an integrating-factor RK4 with 2/3 dealiasing).
Shrunk: 250 samples (200 train / 50 test, the last 50 as in the script) instead of 1000 / 100
of ``burgers_data_R10.mat``; solved on 256 points and subsampled by 4 to ``s = 64`` instead of
8192 subsampled by 8; viscosity 1/100 instead of 1/1000 so the 256-point solve resolves the
fronts; ``width`` 32 instead of 64 (``modes`` 16 kept); 60 epochs with ``step_size`` 6 instead
of 500 with 50 (the same ten halvings); batch 20 kept; no plotting or ``.mat`` output.
Measure only (not in the program): the last epoch's test relative L2 (what the script prints).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the optimizer and the train/test tensors; ``nndx.Monitor(model, optimizer)`` around the
epochs with ``LpLoss`` as ``mon.loss_fn`` (the loop calls ``mon.loss_fn`` where it called
``myloss``; ``LpLoss.rel`` flattens both sides, so the probes may call it on the model's
``(batch, s, 1)`` output and ``(batch, s)`` targets), each batch's loss logged; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import Optimizer

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fno"
SOURCE = Source("neuraloperator/neuraloperator", "fourier_1d.py", "e12ed83d2baeea55ef572ac0dda6247b04489032", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 200 Burgers samples on 64 points, width 32, 60 epochs)"),
        Variant(
            "grid_0_to_2pi",
            "the location channel built as linspace(0, 2*pi, s) instead of linspace(0, 1, s): the grid fed to "
            "fc0 next to a(x) spans 0..6.28 while a(x) is of order 0.3 (the bug the script had until its "
            "'fix grid interval' commit)",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/neuraloperator/neuraloperator/commit/1c3c77fa79c16fb5c6ba29f78e050c4ebf785afa",),
            Measure("test_l2", "final test relative L2 at least 1.5x the healthy run's",
                    lambda healthy, buggy: buggy > 1.5 * healthy),
        ),
        Variant(
            "view_for_permute",
            "x.view(batch, width, s) instead of x.permute(0, 2, 1) after fc0 (and x.view(batch, s, width) "
            "instead of the permute back before fc1): channels and grid points scrambled for the Fourier layers",
            (C.WRONG_RESHAPE,),
            ("https://github.com/neuraloperator/neuraloperator/issues/23",
             "https://github.com/vitrioil/Speech-Separation/issues/4",
             "https://github.com/ohtlab/headpose-fsanet-pytorch/issues/10"),
            Measure("test_l2", "final test relative L2 at least 2x the healthy run's",
                    lambda healthy, buggy: buggy > 2.0 * healthy),
        ),
    )
}

NTRAIN, NTEST, SOLVE_GRID, SUB = 200, 50, 256, 4
VISCOSITY, SOLVE_DT = 1.0 / 100.0, 2e-3
BATCH_SIZE, LEARNING_RATE, EPOCHS, STEP_SIZE, GAMMA = 20, 0.001, 60, 6, 0.5
MODES, WIDTH = 16, 32


# --------------------------------------------------------------------------- data_generation/burgers


def grf1(n: int, s: int, rng: np.random.Generator, gamma: float = 2.5, tau: float = 7.0,
         sigma: float = 7.0**2) -> np.ndarray:  # fmt: skip
    """``GRF1(s/2, 0, gamma, tau, sigma, "periodic")`` sampled on ``s`` points of [0, 1): the
    Fourier coefficients ``sqrt(2) * sigma * ((2 pi k)^2 + tau^2)^(-gamma/2) * N(0, 1)`` of
    cos(2 pi k x) and sin(2 pi k x), k = 1..s/2, mean 0."""
    modes = s // 2
    k = np.arange(1, modes + 1)
    eigs = math.sqrt(2.0) * sigma * ((2.0 * math.pi * k) ** 2 + tau**2) ** (-gamma / 2.0)
    alpha = eigs * rng.standard_normal((n, modes))
    beta = eigs * rng.standard_normal((n, modes))
    coef = np.zeros((n, s // 2 + 1), dtype=np.complex128)
    coef[:, 1 : modes + 1] = (alpha - 1j * beta) * (s / 2.0)
    return np.fft.irfft(coef, n=s)


def burgers1(u0: np.ndarray, visc: float, t_end: float = 1.0, dt: float = SOLVE_DT) -> np.ndarray:
    """``burgers1``: u_t = -(u^2/2)_x + visc u_xx, periodic on [0, 1), to ``t_end``; an
    integrating-factor RK4 in Fourier space with the 2/3 rule (what ``spin`` does by ETDRK4)."""
    s = u0.shape[-1]
    freq = np.fft.rfftfreq(s, d=1.0 / s)
    k = 2.0 * math.pi * freq
    keep = freq < s / 3.0

    def nonlinear(v: np.ndarray) -> np.ndarray:
        u = np.fft.irfft(v, n=s)
        return -0.5j * k * np.fft.rfft(u * u) * keep

    half = np.exp(-visc * k**2 * dt / 2.0)
    full = half * half
    v = np.fft.rfft(u0)
    for _ in range(int(round(t_end / dt))):
        a = nonlinear(v)
        b = nonlinear(half * (v + dt / 2.0 * a))
        c = nonlinear(half * v + dt / 2.0 * b)
        d = nonlinear(full * v + dt * half * c)
        v = full * v + dt / 6.0 * (full * a + 2.0 * half * (b + c) + d)
    return np.fft.irfft(v, n=s)


@functools.lru_cache(maxsize=4)
def burgers_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` (initial conditions) and ``u`` (solutions at t = 1), (N, SOLVE_GRID) float32."""
    rng = np.random.default_rng(seed)
    a = grf1(NTRAIN + NTEST, SOLVE_GRID, rng)
    u = burgers1(a, VISCOSITY)
    return torch.tensor(a, dtype=torch.float), torch.tensor(u, dtype=torch.float)


# --------------------------------------------------------------------------- utilities3.py, Adam.py


class LpLoss:
    def __init__(self, d: int = 2, p: int = 2, size_average: bool = True, reduction: bool = True) -> None:
        assert d > 0 and p > 0
        self.d, self.p, self.reduction, self.size_average = d, p, reduction, size_average

    def rel(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        num_examples = x.size()[0]
        diff_norms = torch.norm(x.reshape(num_examples, -1) - y.reshape(num_examples, -1), self.p, 1)
        y_norms = torch.norm(y.reshape(num_examples, -1), self.p, 1)
        if self.reduction:
            return torch.mean(diff_norms / y_norms) if self.size_average else torch.sum(diff_norms / y_norms)
        return diff_norms / y_norms

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.rel(x, y)


class Adam(Optimizer):
    """``Adam.py``: Adam with L2 weight decay added to the gradient, and the second moment
    accumulated as ``grad * grad.conj()`` so that complex parameters get a real one."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False) -> None:  # fmt: skip
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"]
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad.conj(), value=1 - beta2)
                if group["amsgrad"]:
                    torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                    denom = (state["max_exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                else:
                    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                p.addcdiv_(exp_avg, denom, value=-group["lr"] / bias_correction1)
        return loss


# --------------------------------------------------------------------------- fourier_1d.py


class SpectralConv1d(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, modes1: int) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.modes1 = in_channels, out_channels, modes1
        self.scale = 1 / (in_channels * out_channels)
        self.weights1 = nn.Parameter(self.scale * torch.rand(in_channels, out_channels, self.modes1,
                                                             dtype=torch.cfloat))  # fmt: skip

    def compl_mul1d(self, input: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bix,iox->box", input, weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batchsize = x.shape[0]
        x_ft = torch.fft.rfft(x)
        out_ft = torch.zeros(batchsize, self.out_channels, x.size(-1) // 2 + 1, device=x.device, dtype=torch.cfloat)
        out_ft[:, :, : self.modes1] = self.compl_mul1d(x_ft[:, :, : self.modes1], self.weights1)
        return torch.fft.irfft(out_ft, n=x.size(-1))


class FNO1d(nn.Module):
    def __init__(self, modes: int, width: int, grid_end: float = 1.0, view_for_permute: bool = False) -> None:
        super().__init__()
        self.modes1, self.width = modes, width
        self.padding = 2  # pad the domain if input is non-periodic (unused, as in the script)
        self.grid_end = grid_end
        self.view_for_permute = view_for_permute
        self.fc0 = nn.Linear(2, self.width)
        self.conv0 = SpectralConv1d(self.width, self.width, self.modes1)
        self.conv1 = SpectralConv1d(self.width, self.width, self.modes1)
        self.conv2 = SpectralConv1d(self.width, self.width, self.modes1)
        self.conv3 = SpectralConv1d(self.width, self.width, self.modes1)
        self.w0 = nn.Conv1d(self.width, self.width, 1)
        self.w1 = nn.Conv1d(self.width, self.width, 1)
        self.w2 = nn.Conv1d(self.width, self.width, 1)
        self.w3 = nn.Conv1d(self.width, self.width, 1)
        self.fc1 = nn.Linear(self.width, 128)
        self.fc2 = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.get_grid(x.shape, x.device)
        x = torch.cat((x, grid), dim=-1)
        x = self.fc0(x)
        if self.view_for_permute:  # the bug: a view where the layout must be transposed
            x = x.view(x.shape[0], self.width, -1)
        else:
            x = x.permute(0, 2, 1)

        x1 = self.conv0(x)
        x2 = self.w0(x)
        x = F.gelu(x1 + x2)
        x1 = self.conv1(x)
        x2 = self.w1(x)
        x = F.gelu(x1 + x2)
        x1 = self.conv2(x)
        x2 = self.w2(x)
        x = F.gelu(x1 + x2)
        x1 = self.conv3(x)
        x2 = self.w3(x)
        x = x1 + x2

        if self.view_for_permute:
            x = x.view(x.shape[0], -1, self.width)
        else:
            x = x.permute(0, 2, 1)
        x = self.fc1(x)
        x = F.gelu(x)
        return self.fc2(x)

    def get_grid(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        batchsize, size_x = shape[0], shape[1]
        gridx = torch.tensor(np.linspace(0, self.grid_end, size_x), dtype=torch.float)
        return gridx.reshape(1, size_x, 1).repeat([batchsize, 1, 1]).to(device)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    a, u = burgers_data(seed)
    x_data, y_data = a[:, ::SUB], u[:, ::SUB]
    s = x_data.shape[1]
    x_train, y_train = x_data[:NTRAIN, :], y_data[:NTRAIN, :]
    x_test, y_test = x_data[-NTEST:, :], y_data[-NTEST:, :]
    x_train = x_train.reshape(NTRAIN, s, 1)
    x_test = x_test.reshape(NTEST, s, 1)
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train),
                                               batch_size=BATCH_SIZE, shuffle=True,
                                               generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_test, y_test), batch_size=BATCH_SIZE,
                                              shuffle=False)  # fmt: skip

    model = FNO1d(MODES, WIDTH, grid_end=2 * np.pi if variant == "grid_0_to_2pi" else 1.0,
                  view_for_permute=variant == "view_for_permute")  # fmt: skip
    optimizer = Adam(model.parameters(), lr=LEARNING_RATE, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    myloss = LpLoss(size_average=False)

    probe_batch = (x_train[:BATCH_SIZE], y_train[:BATCH_SIZE])
    splits = (x_train, y_train, x_test, y_test)
    nx.preflight(model, probe_batch, myloss, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=myloss)

    train_mse = train_l2 = test_l2 = 0.0
    for _ep in range(EPOCHS):
        model.train()
        train_mse = 0.0
        train_l2 = 0.0
        for x, y in train_loader:
            optimizer.zero_grad()
            out = model(x)
            mse = F.mse_loss(out.view(BATCH_SIZE, -1), y.view(BATCH_SIZE, -1), reduction="mean")
            l2 = mon.loss_fn(out.view(BATCH_SIZE, -1), y.view(BATCH_SIZE, -1))
            l2.backward()  # use the l2 relative loss
            optimizer.step()
            train_mse += mse.item()
            train_l2 += l2.item()
            nx.timed(lambda: mon.log(l2))  # noqa: B023
        scheduler.step()
        model.eval()
        test_l2 = 0.0
        with torch.no_grad():
            for x, y in test_loader:
                out = model(x)
                test_l2 += myloss(out.view(BATCH_SIZE, -1), y.view(BATCH_SIZE, -1)).item()
        train_mse /= len(train_loader)
        train_l2 /= NTRAIN
        test_l2 /= NTEST

    nx.finish(mon, model, probe_batch, myloss, optimizer=optimizer, data=splits)
    return {"test_l2": test_l2, "train_l2": train_l2, "train_mse": train_mse}

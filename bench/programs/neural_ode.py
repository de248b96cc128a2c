"""Port of rtqichen/torchdiffeq ``examples/ode_demo.py``: a neural ODE (an MLP ``ODEFunc``) fitted to
a 2-D spiral, trained with RMSprop on batches of short trajectory segments.

Source: github.com/rtqichen/torchdiffeq, ``examples/ode_demo.py`` at commit
657943acefa826ef04c025ebeb1ff5e9d60dc268 (MIT, Copyright (c) 2018 Ricky Tian Qi Chen).
Written anew from the facts of that file; no code copied. torchdiffeq is not installed:
``odeint(func, y0, t)`` here is a fixed-step classic Runge-Kutta (RK4) solver (one step
between consecutive requested times), returning the states at ``t`` stacked along a new
first dimension, as torchdiffeq's ``odeint`` returns them (the demo's default is the
adaptive ``dopri5``; the call and the shapes are the demo's).

Kept: the data: ``true_y0 = [[2., 0.]]``, ``t = linspace(0, 25, data_size)``, ``true_A =
[[-0.1, 2.0], [-2.0, -0.1]]``, the true dynamics ``Lambda``: ``dy/dt = (y**3) @ true_A``,
``true_y`` solved under ``no_grad``; ``get_batch``: ``batch_size`` start indices drawn
without replacement from ``arange(data_size - batch_time)``, ``batch_y0 = true_y[s]``
(shape (M, 1, D)), ``batch_t = t[:batch_time]``, ``batch_y`` the stacked segments (T, M,
1, D); ``ODEFunc``: ``Linear(2, 50)``, ``Tanh``, ``Linear(50, 2)`` applied to ``y**3``,
weights ``normal(0, 0.1)`` and biases 0; ``RMSprop(lr=1e-3)``; per iteration
``zero_grad``, ``get_batch``, ``pred_y = odeint(func, batch_y0, batch_t)``, ``loss =
mean(abs(pred_y - batch_y))``, ``backward``, ``step``, the ``RunningAverageMeter(0.97)`` of
the loss; every ``test_freq`` iterations, under ``no_grad``, the whole trajectory from
``true_y0`` and its "Total Loss" ``mean(abs(pred_y - true_y))``.
Shrunk: ``niters`` 600 instead of 2,000, ``data_size`` 500 instead of 1,000 (the same
time span), ``test_freq`` 100 instead of 20; RK4 with one step per time interval
(0.05) instead of ``dopri5``; no plots.
Measure only (not in the program): the last "Total Loss" (the number the demo prints),
and the loss meter's average at the end.

nndx, as the author would add it: ``odeint(func, y0, batch_t)`` wrapped in a small module
of ``y0`` holding ``batch_t`` (which never changes: ``t[:batch_time]``), so a batch is
``(batch_y0, batch_y)`` scored by the demo's L1 loss; the preflight ``nndx.probe`` on the
first batch with the optimizer; ``nndx.Monitor(wrapper, optimizer)`` around the
iterations (the loop calls the wrapper, which is the demo's call), every loss logged and
every "Total Loss" logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` on the
first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "neural_ode"
SOURCE = Source("rtqichen/torchdiffeq", "examples/ode_demo.py", "657943acefa826ef04c025ebeb1ff5e9d60dc268", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the demo as published (RK4 instead of dopri5, 600 iterations, 500 time points)"),
        Variant(
            "lr_too_high",
            "RMSprop(func.parameters(), lr=1e-2) instead of 1e-3: the steps overshoot, the learned field "
            "oscillates between iterations and the whole-trajectory loss stays high",
            (C.LR_TOO_HIGH,),
            ("https://github.com/rtqichen/torchdiffeq/issues/58",
             "https://github.com/patrick-kidger/diffrax/issues/671"),
            Measure("total_loss", "last Total Loss 1.5x the healthy run's or more (0.64 against 0.36 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "state_detached",
            "ODEFunc.forward evaluates the net on y.detach() (a detach left in the dynamics, as in the "
            "torchdiffeq report): no gradient flows back through the solver's states, only through each "
            "step's direct use of the parameters",
            (C.DETACHED_GRAPH,),
            ("https://github.com/rtqichen/torchdiffeq/issues/79",
             "https://github.com/rtqichen/torchdiffeq/issues/189"),
            Measure("total_loss", "last Total Loss 1.5x the healthy run's or more (0.71 against 0.36 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

LR_TOO_HIGH = 1e-2
DATA_SIZE, BATCH_TIME, BATCH_SIZE, NITERS, TEST_FREQ, SUBSTEPS = 500, 10, 20, 600, 100, 1


# --------------------------------------------------------------------------- torchdiffeq's odeint (fixed-step RK4)


def odeint(func, y0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """States at the times ``t`` (``t[0]`` is ``y0``'s), stacked along a new dim 0."""
    ys, y = [y0], y0
    for i in range(len(t) - 1):
        t0, h = t[i], (t[i + 1] - t[i]) / SUBSTEPS
        for j in range(SUBSTEPS):
            tj = t0 + j * h
            k1 = func(tj, y)
            k2 = func(tj + h / 2, y + h / 2 * k1)
            k3 = func(tj + h / 2, y + h / 2 * k2)
            k4 = func(tj + h, y + h * k3)
            y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        ys.append(y)
    return torch.stack(ys, 0)


# --------------------------------------------------------------------------- ode_demo.py


class Lambda(nn.Module):
    def __init__(self, true_A: torch.Tensor) -> None:  # noqa: N803
        super().__init__()
        self.true_A = true_A

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.mm(y**3, self.true_A)


class ODEFunc(nn.Module):
    def __init__(self, detach_state: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 2))
        for m in self.net.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0, std=0.1)
                nn.init.constant_(m.bias, val=0)
        self.detach_state = detach_state

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.detach_state:
            y = y.detach()
        return self.net(y**3)


class Trajectory(nn.Module):
    """The author's wrapper for nndx: ``odeint(func, y0, batch_t)`` as a module of ``y0``."""

    def __init__(self, func: ODEFunc, batch_t: torch.Tensor) -> None:
        super().__init__()
        self.func, self.batch_t = func, batch_t

    def forward(self, y0: torch.Tensor) -> torch.Tensor:
        return odeint(self.func, y0, self.batch_t)


class RunningAverageMeter:
    def __init__(self, momentum: float = 0.99) -> None:
        self.momentum = momentum
        self.val: float | None = None
        self.avg = 0.0

    def update(self, val: float) -> None:
        self.avg = val if self.val is None else self.avg * self.momentum + val * (1 - self.momentum)
        self.val = val


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    true_y0 = torch.tensor([[2.0, 0.0]])
    t = torch.linspace(0.0, 25.0, DATA_SIZE)
    true_A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]])  # noqa: N806
    with torch.no_grad():
        true_y = odeint(Lambda(true_A), true_y0, t)

    def get_batch():
        s = torch.from_numpy(np.random.choice(np.arange(DATA_SIZE - BATCH_TIME, dtype=np.int64), BATCH_SIZE,
                                              replace=False))  # fmt: skip
        batch_y0 = true_y[s]  # (M, 1, D)
        batch_t = t[:BATCH_TIME]
        batch_y = torch.stack([true_y[s + i] for i in range(BATCH_TIME)], dim=0)  # (T, M, 1, D)
        return batch_y0, batch_t, batch_y

    def loss_fn(pred_y: torch.Tensor, batch_y: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.abs(pred_y - batch_y))

    func = ODEFunc(detach_state=variant == "state_detached")
    optimizer = optim.RMSprop(func.parameters(), lr=LR_TOO_HIGH if variant == "lr_too_high" else 1e-3)
    loss_meter = RunningAverageMeter(0.97)

    first = get_batch()
    model = Trajectory(func, first[1])
    probe_batch = (first[0], first[2])
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)
    totals = []
    for itr in range(1, NITERS + 1):
        optimizer.zero_grad()
        batch_y0, batch_t, batch_y = first if itr == 1 else get_batch()
        pred_y = model(batch_y0)  # odeint(func, batch_y0, batch_t): batch_t is always t[:batch_time]
        loss = torch.mean(torch.abs(pred_y - batch_y))
        loss.backward()
        optimizer.step()
        mon.log(loss)
        loss_meter.update(loss.item())
        if itr % TEST_FREQ == 0:
            with torch.no_grad():
                pred_y = odeint(func, true_y0, t)
                total = torch.mean(torch.abs(pred_y - true_y))
            totals.append(total.item())
            mon.log(total, split="val")
    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    return {"total_loss": totals[-1], "loss_meter": loss_meter.avg, "first_total_loss": totals[0]}

"""Port of pytorch/tutorials' "PyTorch: Custom nn Modules": a third-order polynomial
``Polynomial3`` (four scalar ``nn.Parameter``s, ``a + b x + c x^2 + d x^3``) fitted to sin(x) on
[-pi, pi] by full-batch SGD on the summed squared error.

Source: github.com/pytorch/tutorials, ``beginner_source/examples_nn/polynomial_module.py`` at
commit 1d189709801e98f5f184af0567c7f06b8b5156c2 (BSD-3-Clause, Copyright (c) 2017-2022
PyTorch contributors); its siblings ``beginner_source/examples_autograd/polynomial_autograd.py``
(the same fit with hand-written updates and hand-zeroed gradients) read for context. Written
anew from the facts of that file; no code copied.

Kept, unshrunk (it runs in about a second): ``x = torch.linspace(-math.pi, math.pi, 2000)``,
``y = torch.sin(x)``; ``Polynomial3`` with its parameters drawn by ``torch.randn(())``;
``criterion = torch.nn.MSELoss(reduction='sum')``; ``torch.optim.SGD(model.parameters(),
lr=1e-6)``; 2000 full-batch steps of forward, loss, ``zero_grad``, ``backward``, ``step``; the
loss printed every 100 steps (kept as a list). Measure only: the final summed squared error and
the fitted coefficients.

nndx, as the author would add it after the README: a preflight ``nndx.probe(model, (x, y),
criterion, optimizer=optimizer)``; ``nndx.Monitor(model, optimizer, every=10)`` around the loop,
``mon.log(loss)`` after every step; after training ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "polynomial_module"
SOURCE = Source("pytorch/tutorials", "beginner_source/examples_nn/polynomial_module.py",
                "1d189709801e98f5f184af0567c7f06b8b5156c2", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (not shrunk)"),
        Variant(
            "mse_mean_reduction",
            "criterion = torch.nn.MSELoss() (the default reduction='mean') with the tutorial's lr=1e-6, which was "
            "set for reduction='sum' over 2000 points: every step is 2000 times smaller and after 2000 steps the "
            "polynomial has hardly moved from its random start",
            (C.LR_TOO_LOW,),
            ("https://github.com/d2l-ai/d2l-en/pull/993",
             "https://github.com/wiseodd/generative-models/issues/40",
             "https://github.com/wkentaro/pytorch-fcn/issues/17"),
            Measure("final_sse", "final summed squared error at least 5x the healthy run's: 148,428 against 12.3 on seed 0",
                    lambda healthy, buggy: not buggy < 5 * healthy),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: loss.backward() adds each step's gradient to the "
            "sum of all earlier ones, so SGD steps along the accumulated gradient",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/tutorials/pull/3397",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/cvxpy/cvxpylayers/pull/102"),
            Measure("final_sse", "final summed squared error at least 2x the healthy run's, or not finite: 139,129 against 12.3 on seed 0",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

STEPS, LR = 2000, 1e-6


class Polynomial3(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(()))
        self.b = torch.nn.Parameter(torch.randn(()))
        self.c = torch.nn.Parameter(torch.randn(()))
        self.d = torch.nn.Parameter(torch.randn(()))

    def forward(self, x):
        return self.a + self.b * x + self.c * x**2 + self.d * x**3

    def string(self) -> str:
        return f"y = {self.a.item()} + {self.b.item()} x + {self.c.item()} x^2 + {self.d.item()} x^3"


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)

    model = Polynomial3()
    criterion = torch.nn.MSELoss() if variant == "mse_mean_reduction" else torch.nn.MSELoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    nx.preflight(model, (x, y), criterion, optimizer=optimizer)

    mon = nx.monitor(model, optimizer, every=10)
    printed = []
    for t in range(STEPS):
        y_pred = model(x)
        loss = criterion(y_pred, y)
        if t % 100 == 99:
            printed.append((t, loss.item()))

        if variant != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))

    nx.finish(mon, model, (x, y), criterion, optimizer=optimizer)

    with torch.no_grad():
        final_sse = ((model(x) - y) ** 2).sum().item()
    return {"final_sse": final_sse, "a": model.a.item(), "b": model.b.item(), "c": model.c.item(),
            "d": model.d.item(), "loss_at_99": printed[0][1]}  # fmt: skip

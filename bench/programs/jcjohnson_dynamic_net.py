"""Port of jcjohnson/pytorch-examples, ``nn/dynamic_net.py``: the ``DynamicNet`` (an input
``Linear``, a middle ``Linear`` reused a random 0-3 times per forward pass, an output ``Linear``,
``clamp(min=0)`` as the ReLU) fitted to random targets with ``MSELoss(reduction='sum')`` and SGD
with momentum.

Source: github.com/jcjohnson/pytorch-examples, ``nn/dynamic_net.py`` at commit
0003fcdc606a79951e53bf8f46f8574fa4739f23 (MIT, Copyright (c) 2017 Justin Johnson). Written anew
from the facts of that file; no code copied.

Kept: everything: ``N, D_in, H, D_out = 64, 1000, 100, 10``; ``x = torch.randn(N, D_in)``, ``y =
torch.randn(N, D_out)``; ``DynamicNet``: ``h_relu = input_linear(x).clamp(min=0)``, then
``random.randint(0, 3)`` times ``h_relu = middle_linear(h_relu).clamp(min=0)`` (Python's
``random``, drawn on every forward pass), ``y_pred = output_linear(h_relu)``;
``torch.nn.MSELoss(reduction='sum')``; ``torch.optim.SGD(model.parameters(), lr=1e-4,
momentum=0.9)``; 500 full-batch steps in the script's order: forward, loss, print,
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``.
Shrunk / replaced: nothing (the script runs in about a second on a CPU); the seeds are set
(``torch.manual_seed``, ``random.seed``: the script sets none); no prints.
Measure only (not in the program): after training, the sum-of-squares loss on ``(x, y)`` for
each of the four depths (0-3 reuses of the middle layer) averaged, so the random depth of one
forward pass does not decide the number; and the mean of the last 20 printed losses.

nndx, as the author would add it after the README: the model returns the prediction and the
script's ``criterion`` takes ``(y_pred, y)``, so nndx gets ``criterion`` and the whole data set
``(x, y)`` as the batch (the loop is full batch); a preflight ``nndx.probe`` with the optimizer;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, each step's loss logged where the
script prints it (after the loss, before ``zero_grad``); after the loop ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "jcjohnson_dynamic_net"
SOURCE = Source("jcjohnson/pytorch-examples", "nn/dynamic_net.py", "0003fcdc606a79951e53bf8f46f8574fa4739f23", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "dynamic_net.py as published (seeded)"),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: every backward adds to the gradients of all the steps "
            "before it, and SGD with momentum 0.9 steps along the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch"),
            Measure("final_sum_loss", "final sum-of-squares loss at least 2x the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "mean_reduction",
            "torch.nn.MSELoss() (reduction='mean', the default; what size_average=False turns into when it is "
            "dropped) with the lr of 1e-4 chosen for the summed loss kept: the gradient is N*D_out = 640x "
            "smaller, so the steps are 640x too small and the net barely moves in 500 steps",
            (C.LR_TOO_LOW,),
            ("https://github.com/twtygqyy/pytorch-SRResNet/issues/15",
             "https://github.com/jfzhang95/pytorch-deeplab-xception/issues/55",
             "https://github.com/pytorch/tutorials/pull/187"),
            Measure("final_sum_loss", "final sum-of-squares loss at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

N, D_IN, H, D_OUT = 64, 1000, 100, 10
STEPS, LR, MOMENTUM = 500, 1e-4, 0.9


class DynamicNet(torch.nn.Module):
    def __init__(self, D_in: int, H: int, D_out: int) -> None:
        super().__init__()
        self.input_linear = torch.nn.Linear(D_in, H)
        self.middle_linear = torch.nn.Linear(H, H)
        self.output_linear = torch.nn.Linear(H, D_out)
        self.fixed_depth: int | None = None  # measure only: None in training, as in the script

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_relu = self.input_linear(x).clamp(min=0)
        depth = random.randint(0, 3) if self.fixed_depth is None else self.fixed_depth
        for _ in range(depth):
            h_relu = self.middle_linear(h_relu).clamp(min=0)
        y_pred = self.output_linear(h_relu)
        return y_pred


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    random.seed(seed)

    x = torch.randn(N, D_IN)
    y = torch.randn(N, D_OUT)

    model = DynamicNet(D_IN, H, D_OUT)

    criterion = torch.nn.MSELoss() if variant == "mean_reduction" else torch.nn.MSELoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    nx.preflight(model, (x, y), criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)
    printed = []
    for t in range(STEPS):
        y_pred = model(x)

        loss = criterion(y_pred, y)
        printed.append(loss.item())  # print(t, loss.item())
        nx.timed(lambda: mon.log(loss))  # noqa: B023

        if variant != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    nx.finish(mon, model, (x, y), criterion, optimizer=optimizer)

    # measure only: the summed loss for each depth, averaged
    sum_mse = torch.nn.MSELoss(reduction="sum")
    with torch.no_grad():
        per_depth = []
        for depth in range(4):
            model.fixed_depth = depth
            per_depth.append(sum_mse(model(x), y).item())
        model.fixed_depth = None
    scale = N * D_OUT if variant == "mean_reduction" else 1
    last = [v * scale for v in printed[-20:]]
    return {"final_sum_loss": sum(per_depth) / 4, "last20_printed_sum_loss": sum(last) / len(last),
            "first_sum_loss": printed[0] * scale}  # fmt: skip

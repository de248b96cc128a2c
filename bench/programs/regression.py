"""Port of the PyTorch regression example (a degree-4 polynomial fitted by one Linear layer).

Source: github.com/pytorch/examples, ``regression/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: a random target polynomial (``W_target = randn(4, 1) * 5``, ``b_target = randn(1) *
5``); ``make_features`` building the columns x, x^2, x^3, x^4; ``get_batch`` drawing 32
fresh ``torch.randn`` points per step, the target ``x.mm(W_target) + b_target.item()`` of
shape (32, 1); one ``torch.nn.Linear(4, 1)``; ``fc.zero_grad()``; ``F.smooth_l1_loss``;
the update written by hand, ``param.data.add_(-0.1 * param.grad)``, no optimizer object;
the loop stopping once a batch's loss is under 1e-3.
Shrunk: nothing but the loop's end — the published loop runs ``for batch_idx in
count(1)`` until the loss is under 1e-3, which a broken run never reaches; the port also
stops after 3,000 batches (the healthy run stops after 250-850 on seeds 0-3). The target
polynomial is drawn after ``torch.manual_seed`` instead of at import, so runs repeat.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch, then
``nndx.Monitor(fc, optimizer)`` around the loop — which has no optimizer to give — the
loss logged where the example computes it, then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``. The program has no held-out set to log.
"""

from __future__ import annotations

from itertools import count

import torch
import torch.nn.functional as F

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "regression"
SOURCE = Source("pytorch/examples", "regression/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "target_flattened",
            "get_batch returns y.view(-1), shape (32,), against fc's (32, 1) output: smooth_l1_loss broadcasts "
            "them to (32, 32) (PyTorch only warns) and every output is fitted to every target",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/mlcommons/GaNDLF/issues/134",
             "https://github.com/jiwei0921/CoNet/issues/3"),
            Measure("heldout_loss", "smooth-L1 loss of the fitted polynomial on 1,000 fresh points (shapes matched), "
                    "10x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 10 * healthy),
        ),
    )
}

POLY_DEGREE = 4
MAX_BATCHES = 3000


def make_features(x: torch.Tensor) -> torch.Tensor:
    """The matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, POLY_DEGREE + 1)], 1)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.mm(W_target) + b_target.item()

    def get_batch(batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        x = make_features(torch.randn(batch_size))
        y = f(x)
        if variant == "target_flattened":
            y = y.view(-1)
        return x, y

    fc = torch.nn.Linear(W_target.size(0), 1)

    first_batch = get_batch()
    nx.preflight(fc, first_batch, F.smooth_l1_loss)
    optimizer = None  # the example updates the parameters by hand
    mon = nx.monitor(fc, optimizer, every=10)

    batch_x, batch_y = first_batch
    for batch_idx in count(1):
        if batch_idx > 1:
            batch_x, batch_y = get_batch()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        mon.log(output)
        if loss < 1e-3 or batch_idx >= MAX_BATCHES:
            break

    nx.finish(mon, fc, first_batch, F.smooth_l1_loss)

    with torch.no_grad():
        gen = torch.Generator().manual_seed(10_000 + seed)
        x = make_features(torch.randn(1000, generator=gen))
        heldout = F.smooth_l1_loss(fc(x), f(x)).item()
        coef_error = (fc.weight.view(-1) - W_target.view(-1)).abs().sum() + (fc.bias - b_target).abs().sum()
    return {
        "batches": float(batch_idx),
        "final_loss": loss,
        "heldout_loss": heldout,
        "coefficient_error": coef_error.item(),
    }

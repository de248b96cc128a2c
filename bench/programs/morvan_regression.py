"""Port of MorvanZhou/PyTorch-Tutorial's ``301_regression.py``: fit y = x^2 plus noise on [-1, 1]
with a two-layer ReLU net, full-batch SGD on ``MSELoss``.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/301_regression.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written
anew from the facts of that file; no code copied.

Kept (everything that trains): the data (``x = unsqueeze(linspace(-1, 1, 100), dim=1)``, shape
(100, 1); ``y = x.pow(2) + 0.2 * rand(x.size())``); ``Net(n_feature=1, n_hidden=10,
n_output=1)``: ``hidden = Linear(1, 10)``, ``F.relu``, ``predict = Linear(10, 1)`` (linear
output); ``torch.optim.SGD(net.parameters(), lr=0.2)``; ``torch.nn.MSELoss()``; 200 full-batch
steps of ``prediction = net(x)``, ``loss = loss_func(prediction, y)``, ``zero_grad``,
``backward``, ``step``; every 5 steps the loss (what the tutorial prints on its plot).
Shrunk or replaced: nothing shrunk (the tutorial already runs in a second on a CPU); the
matplotlib animation is dropped (the loss it shows is still read at the same place);
``torch.manual_seed(seed)`` set (the tutorial leaves ``torch.manual_seed(1)`` commented out).
Measure only (not in the program): the net's mean squared error against the (100, 1) targets
after training (``fit_mse``, shape-correct whatever the variant fed the loss) and against the
noise-free curve x^2 + 0.1 on 1,000 points of [-1, 1] (``curve_mse``).

nndx, as the author would add it after reading the README: a preflight ``nndx.probe(net, (x,
y), loss_func, optimizer=optimizer)`` on the full batch; ``nndx.Monitor(net, optimizer,
every=10)`` around the loop, ``mon.log(loss)`` after every step; after the loop
``nndx.probe(net, (x, y), loss_func, optimizer=optimizer, monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_regression"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/301_regression.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (nothing shrunk; no plots)"),
        Variant(
            "target_shape_broadcast",
            "the targets are built from the 1-D linspace before it is unsqueezed (y has shape (100,), the "
            "prediction (100, 1)): MSELoss broadcasts them to (100, 100), every prediction is pulled towards every "
            "target, and the best the net can do is the mean of y everywhere (PyTorch only prints a UserWarning)",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/16045",
             "https://github.com/pytorch/pytorch/pull/18349",
             "https://github.com/deepset-ai/FARM/issues/229"),
            Measure("fit_mse", "the net's MSE against the (100, 1) targets at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: each backward adds to the gradients of all earlier "
            "steps, so SGD steps along the running sum of every gradient so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/greebear/pytorch-learning/issues/1",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("fit_mse", "the net's MSE against the targets at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
    )
}

N_POINTS, N_HIDDEN, LR, STEPS = 100, 10, 0.2, 200


class Net(torch.nn.Module):
    def __init__(self, n_feature: int, n_hidden: int, n_output: int) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(n_feature, n_hidden)  # hidden layer
        self.predict = torch.nn.Linear(n_hidden, n_output)  # output layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.hidden(x))  # activation function for hidden layer
        x = self.predict(x)  # linear output
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    if variant == "target_shape_broadcast":
        t = torch.linspace(-1, 1, N_POINTS)
        x = torch.unsqueeze(t, dim=1)  # x data, shape=(100, 1)
        y = t.pow(2) + 0.2 * torch.rand(t.size())  # y data, shape=(100,)
    else:
        x = torch.unsqueeze(torch.linspace(-1, 1, N_POINTS), dim=1)  # x data, shape=(100, 1)
        y = x.pow(2) + 0.2 * torch.rand(x.size())  # noisy y data, shape=(100, 1)

    net = Net(n_feature=1, n_hidden=N_HIDDEN, n_output=1)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    loss_func = torch.nn.MSELoss()  # mean squared loss for regression

    nx.preflight(net, (x, y), loss_func, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10)
    shown_loss = float("nan")
    for t_step in range(STEPS):
        prediction = net(x)
        loss = loss_func(prediction, y)

        if variant != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023

        if t_step % 5 == 0:  # the tutorial's plot: the loss
            shown_loss = float(loss.data)

    nx.finish(mon, net, (x, y), loss_func, optimizer=optimizer)

    # measure only
    with torch.no_grad():
        y_col = y.view(-1, 1)
        fit_mse = float(((net(x) - y_col) ** 2).mean())
        grid = torch.linspace(-1, 1, 1000)[:, None]
        curve_mse = float(((net(grid) - (grid.pow(2) + 0.1)) ** 2).mean())
    return {"final_loss": float(loss), "shown_loss": shown_loss, "fit_mse": fit_mse, "curve_mse": curve_mse}

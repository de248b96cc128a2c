"""Port of MorvanZhou/PyTorch-Tutorial ``306_optimizer.py``: four copies of one small
regression ``Net`` trained side by side, batch by batch, each by its own optimizer (SGD,
Momentum, RMSprop, Adam), on y = x^2 + noise, with ``MSELoss``; the four loss histories are
the result.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/306_optimizer.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou).
Written anew from the facts of that file; no code copied.

Kept: ``LR = 0.01``, ``BATCH_SIZE = 32``, ``EPOCH = 12``; the data (``x`` = 1,000 points of
``linspace(-1, 1)`` unsqueezed to (1000, 1), ``y = x.pow(2) + 0.1 * normal(zeros)``); a
``TensorDataset`` and a shuffling ``DataLoader``; ``Net`` = ``hidden = Linear(1, 20)``, ReLU,
``predict = Linear(20, 1)``; four nets ``net_SGD``, ``net_Momentum``, ``net_RMSprop``,
``net_Adam``; ``SGD(lr=LR)``, ``SGD(lr=LR, momentum=0.8)``, ``RMSprop(lr=LR, alpha=0.9)``,
``Adam(lr=LR, betas=(0.9, 0.99))``; the loop (for each batch, for each (net, opt, history):
forward, ``loss_func(output, b_y)``, ``opt.zero_grad()``, ``backward``, ``opt.step()``,
``l_his.append(loss.data.numpy())``).
Shrunk / replaced: nothing shrunk (12 epochs of 32 batches, about 1 s); ``num_workers=2`` ->
0 (one process); ``torch.manual_seed(seed)`` set (the script's is commented out); no plots.
Measure only (not in the program): after training, each net's MSE against the noiseless
curve x^2 on 201 points of [-1, 1]; ``fit_mse_mean`` is the mean over the four nets; the
mean of each history's last 32 losses as well.

nndx, as the author would add it: the four nets watched by one Monitor, as nndx documents for
several models and optimizers (``Monitor({"SGD": net_SGD, ...}, [opt_SGD, ...], every=10)``),
each net's loss logged where the script appends it to its history; a preflight
``nndx.probe`` of each net with its own optimizer on the first batch, and after training
``nndx.probe(net, batch, loss_func, optimizer=opt, monitor=mon)`` for each net; the author
reads the four diagnoses ranked together.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.data as Data

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_optimizers"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/306_optimizer.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")

_FIT = Measure("fit_mse_mean", "mean over the four nets of the MSE against the noiseless x^2 at least 2x the "
               "healthy run's: seed 0, 0.091 (shape broadcast) and 2.1e21 (missing zero_grad: Momentum diverges) against "
               "0.016 healthy", lambda healthy, buggy: not buggy < 2.0 * healthy)

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (seeded; no plots)"),
        Variant(
            "target_shape_broadcast",
            "y is computed from the 1-D linspace before x is unsqueezed, so b_y is (32,) while each net outputs "
            "(32, 1): MSELoss broadcasts them to (32, 32) (a UserWarning only) and every net fits the batch mean "
            "of y instead of x^2",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/4938",
             "https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/Photon-AI-Research/NeuralSolvers/issues/20"),
            _FIT,
        ),
        Variant(
            "missing_zero_grad",
            "opt.zero_grad() left out of the per-net step: each net's gradients accumulate over every batch "
            "since the start",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/pytorch/pytorch/issues/47175"),
            _FIT,
        ),
    )
}

LR = 0.01
BATCH_SIZE = 32
EPOCH = 12


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super(Net, self).__init__()
        self.hidden = torch.nn.Linear(1, 20)  # hidden layer
        self.predict = torch.nn.Linear(20, 1)  # output layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.hidden(x))  # activation function for hidden layer
        x = self.predict(x)  # linear output
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)

    # fake dataset
    if variant == "target_shape_broadcast":
        x = torch.linspace(-1, 1, 1000)
        y = x.pow(2) + 0.1 * torch.normal(torch.zeros(*x.size()))
        x = torch.unsqueeze(x, dim=1)
    else:
        x = torch.unsqueeze(torch.linspace(-1, 1, 1000), dim=1)
        y = x.pow(2) + 0.1 * torch.normal(torch.zeros(*x.size()))

    torch_dataset = Data.TensorDataset(x, y)
    loader = Data.DataLoader(dataset=torch_dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=0)

    # different nets
    net_SGD = Net()
    net_Momentum = Net()
    net_RMSprop = Net()
    net_Adam = Net()
    nets = [net_SGD, net_Momentum, net_RMSprop, net_Adam]

    # different optimizers
    opt_SGD = torch.optim.SGD(net_SGD.parameters(), lr=LR)
    opt_Momentum = torch.optim.SGD(net_Momentum.parameters(), lr=LR, momentum=0.8)
    opt_RMSprop = torch.optim.RMSprop(net_RMSprop.parameters(), lr=LR, alpha=0.9)
    opt_Adam = torch.optim.Adam(net_Adam.parameters(), lr=LR, betas=(0.9, 0.99))
    optimizers = [opt_SGD, opt_Momentum, opt_RMSprop, opt_Adam]

    loss_func = torch.nn.MSELoss()
    losses_his = [[], [], [], []]  # record loss

    labels = ["SGD", "Momentum", "RMSprop", "Adam"]
    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_batch = next(iter(loader))
    for net, opt in zip(nets, optimizers):
        nx.preflight(net, probe_batch, loss_func, optimizer=opt)
    mon = nx.monitor(dict(zip(labels, nets)), optimizers, every=10)

    zero_grad = variant != "missing_zero_grad"
    # training
    for epoch in range(EPOCH):
        for step, (b_x, b_y) in enumerate(loader):  # for each training step
            for net, opt, l_his in zip(nets, optimizers, losses_his):
                output = net(b_x)  # get output for every net
                loss = loss_func(output, b_y)  # compute loss for every net
                if zero_grad:
                    opt.zero_grad()  # clear gradients for next train
                loss.backward()  # backpropagation, compute gradients
                opt.step()  # apply gradients
                l_his.append(loss.data.numpy())  # loss recoder
                nx.timed(lambda: mon.log(loss))

    for net, opt in zip(nets, optimizers):
        nx.finish(mon, net, probe_batch, loss_func, optimizer=opt)

    grid = torch.unsqueeze(torch.linspace(-1, 1, 201), dim=1)
    out: dict[str, float] = {}
    fits = []
    with torch.no_grad():
        for label, net, l_his in zip(labels, nets, losses_his):
            fit = (net(grid) - grid.pow(2)).pow(2).mean().item()
            fits.append(fit)
            out[f"fit_mse_{label}"] = fit
            out[f"last_loss_{label}"] = float(sum(float(v) for v in l_his[-32:]) / 32)
    out["fit_mse_mean"] = sum(fits) / len(fits)
    return out

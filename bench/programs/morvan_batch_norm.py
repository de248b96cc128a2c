"""Port of MorvanZhou/PyTorch-Tutorial's batch-normalization lesson: two deep tanh MLP regressors
(8 hidden layers of 10 units, a deliberately bad bias init of -0.2) fitted side by side to noisy
x^2 data, one without and one with ``BatchNorm1d`` (on the input and before every tanh), each
with its own Adam, on the same mini-batches.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/504_batch_normalization.py``
at commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 Morvan). Written
anew from the facts of that file; no code copied.

Kept: the hyper-parameters (``N_SAMPLES = 2000``, ``BATCH_SIZE = 64``, ``EPOCH = 12``, ``LR =
0.03``, ``N_HIDDEN = 8``, ``ACTIVATION = torch.tanh``, ``B_INIT = -0.2``); the data
(``x = np.linspace(-7, 10, 2000)[:, None]``, ``y = x^2 - 5 + N(0, 2)``; 200 test points the
same way), float tensors, a shuffled ``DataLoader`` of batch 64; ``Net(batch_normalization)``
as written: the hidden ``Linear`` layers and the ``BatchNorm1d(10, momentum=0.5)`` layers kept
in plain Python lists and registered one by one with ``setattr(self, 'fc%i' % i, ...)``, an
input ``BatchNorm1d(1, momentum=0.5)``, ``_set_init`` (weights ``N(0, 0.1)``, biases
``B_INIT``) on every ``Linear``, ``forward`` returning ``(out, layer_input, pre_activation)``;
``nets = [Net(False), Net(True)]``, one ``Adam(lr=LR)`` each, ``MSELoss``; each epoch first
evaluates both nets on the test set (``net.eval()``, the test loss recorded, ``net.train()``)
then, per batch, steps each net in turn (forward, loss, ``zero_grad``, ``backward``,
``step``); at the end both nets in eval mode predict the test set.
Shrunk / replaced: nothing of the training; ``num_workers=2`` -> 0; no matplotlib
(histograms and plots dropped); the seeds, commented out in the file, are set to the run's
seed. Measure only: the final test MSE of each net (the file plots those predictions).

nndx, as the author would add it: ``forward`` returns a tuple, so nndx gets
``loss_fn(output, y) = loss_func(output[0], y)``; one batch from the train loader (drawn
under ``torch.random.fork_rng`` so the loader's own shuffles are untouched) and the train /
test tensors as ``data``; per net a preflight ``nndx.probe`` with its optimizer and an
``nndx.Monitor(net, opt, every=10)`` over the whole loop, each net's batch loss logged after
its ``opt.step()`` and its per-epoch test loss logged as ``split="val"``; after training
``nndx.probe(..., monitor=mon)`` per net on the same batch and ``nndx.diagnose``; the author
reads the two diagnoses ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.data as Data
from torch import nn
from torch.nn import init

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_batch_norm"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/504_batch_normalization.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the lesson as published (both nets, 12 epochs, CPU, no plots)"),
        Variant(
            "train_mode_not_restored",
            "the net.train() after each epoch's test evaluation is left out: both nets train in eval mode from "
            "the first epoch on, so the BN net normalizes with running statistics frozen at their init (mean 0, "
            "var 1) and its batch normalization does nothing",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/wkentaro/pytorch-fcn/issues/57",
             "https://github.com/ermongroup/ncsn/issues/2",
             "https://github.com/ServiceNow/LCFCN/issues/20"),
            Measure("bn_test_loss", "final test MSE of the BN net at least 2x the healthy run's: 685 (the "
                    "plain net's) against 85 healthy on seed 0", lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "layers_in_plain_list",
            "the hidden Linear and BatchNorm1d layers are only appended to the Python lists self.fcs / self.bns "
            "(both setattr(self, 'fc%i' % i, ...) / setattr(self, 'bn%i' % i, ...) registrations left out): "
            "net.parameters() does not hold them, Adam never updates them (and net.eval() never reaches the BN "
            "layers), so both nets fit with 8 hidden layers frozen at their init",
            (C.OPTIMIZER_NOT_CONNECTED, C.FROZEN_PARAMETERS),
            ("https://github.com/pytorch/pytorch/issues/666",
             "https://github.com/pytorch/pytorch/issues/715",
             "https://github.com/open-mmlab/mmdetection/issues/472"),
            Measure("bn_test_loss", "final test MSE of the BN net at least 2x the healthy run's: 631 against 85 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
    )
}

N_SAMPLES, BATCH_SIZE, EPOCH, LR, N_HIDDEN = 2000, 64, 12, 0.03, 8
ACTIVATION = torch.tanh
B_INIT = -0.2  # a bad bias constant initializer, on purpose


class Net(nn.Module):
    def __init__(self, batch_normalization: bool = False, register_layers: bool = True) -> None:
        super().__init__()
        self.do_bn = batch_normalization
        self.fcs = []
        self.bns = []
        self.bn_input = nn.BatchNorm1d(1, momentum=0.5)  # for input data

        for i in range(N_HIDDEN):  # hidden layers and BN layers
            input_size = 1 if i == 0 else 10
            fc = nn.Linear(input_size, 10)
            if register_layers:
                setattr(self, "fc%i" % i, fc)  # IMPORTANT: register the layer with the Module
            self._set_init(fc)
            self.fcs.append(fc)
            if self.do_bn:
                bn = nn.BatchNorm1d(10, momentum=0.5)
                if register_layers:
                    setattr(self, "bn%i" % i, bn)
                self.bns.append(bn)

        self.predict = nn.Linear(10, 1)  # output layer
        self._set_init(self.predict)

    def _set_init(self, layer: nn.Linear) -> None:
        init.normal_(layer.weight, mean=0.0, std=0.1)
        init.constant_(layer.bias, B_INIT)

    def forward(self, x):
        pre_activation = [x]
        if self.do_bn:
            x = self.bn_input(x)  # input batch normalization
        layer_input = [x]
        for i in range(N_HIDDEN):
            x = self.fcs[i](x)
            pre_activation.append(x)
            if self.do_bn:
                x = self.bns[i](x)
            x = ACTIVATION(x)
            layer_input.append(x)
        out = self.predict(x)
        return out, layer_input, pre_activation


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    register_layers = variant != "layers_in_plain_list"
    restore_train_mode = variant != "train_mode_not_restored"

    # training data
    x = np.linspace(-7, 10, N_SAMPLES)[:, np.newaxis]
    noise = np.random.normal(0, 2, x.shape)
    y = np.square(x) - 5 + noise
    # test data
    test_x = np.linspace(-7, 10, 200)[:, np.newaxis]
    noise = np.random.normal(0, 2, test_x.shape)
    test_y = np.square(test_x) - 5 + noise

    train_x, train_y = torch.from_numpy(x).float(), torch.from_numpy(y).float()
    test_x = torch.from_numpy(test_x).float()
    test_y = torch.from_numpy(test_y).float()

    train_dataset = Data.TensorDataset(train_x, train_y)
    train_loader = Data.DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=0)

    nets = [Net(batch_normalization=False, register_layers=register_layers),
            Net(batch_normalization=True, register_layers=register_layers)]  # fmt: skip
    opts = [torch.optim.Adam(net.parameters(), lr=LR) for net in nets]
    loss_func = torch.nn.MSELoss()

    def loss_fn(output, target):
        return loss_func(output[0], target)

    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffles alone
        probe_batch = next(iter(train_loader))
    splits = (train_x, train_y, test_x, test_y)
    mons = []
    for net, opt in zip(nets, opts):
        nx.preflight(net, probe_batch, loss_fn, optimizer=opt, data=splits)
    for net, opt in zip(nets, opts):
        mons.append(nx.monitor(net, opt, every=10))

    losses = [[], []]  # test loss of each net, per epoch
    for _epoch in range(EPOCH):
        for net, l, mon in zip(nets, losses, mons):
            net.eval()  # fix moving_mean and moving_var
            pred, _, _ = net(test_x)
            l.append(loss_func(pred, test_y).data.item())
            nx.timed(lambda: mon.log(l[-1], split="val"))  # noqa: B023
            if restore_train_mode:
                net.train()  # free moving_mean and moving_var

        for _step, (b_x, b_y) in enumerate(train_loader):
            for net, opt, mon in zip(nets, opts, mons):  # train each network
                pred, _, _ = net(b_x)
                loss = loss_func(pred, b_y)
                opt.zero_grad()
                loss.backward()
                opt.step()  # also learns the BatchNorm parameters
                nx.timed(lambda: mon.log(loss))  # noqa: B023

    for net, opt, mon in zip(nets, opts, mons):
        nx.finish(mon, net, probe_batch, loss_fn, optimizer=opt, data=splits)

    [net.eval() for net in nets]  # freeze the BN statistics
    with torch.no_grad():
        preds = [net(test_x)[0] for net in nets]
        final = [loss_func(p, test_y).item() for p in preds]
        train_preds = [net(train_x)[0] for net in nets]
        train_final = [loss_func(p, train_y).item() for p in train_preds]
    return {"plain_test_loss": final[0], "bn_test_loss": final[1], "plain_train_loss": train_final[0],
            "bn_train_loss": train_final[1], "plain_first_test_loss": losses[0][0],
            "bn_first_test_loss": losses[1][0]}  # fmt: skip

"""Port of MorvanZhou/PyTorch-Tutorial: dropout against overfitting. Twenty noisy points on a
line; two 1-300-300-1 ReLU MLPs trained side by side on the whole set for 500 steps, one
plain (``net_overfitting``) and one with ``Dropout(0.5)`` after each hidden ``Linear``
(``net_dropped``); each has its own Adam(lr=0.01), one ``MSELoss``; every 10 steps both are
put in ``eval()`` to draw their test predictions and test loss, then back in ``train()``.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/503_dropout.py`` at commit
dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written anew
from the facts of that file; no code copied.

Kept: the data (``x = linspace(-1, 1, 20)`` unsqueezed to (20, 1), ``y = x + 0.3 * normal``;
a test set drawn the same way), both ``nn.Sequential`` nets with ``N_HIDDEN = 300``, the two
Adam optimizers at lr 0.01, ``MSELoss``, 500 full-batch steps in the author's order (both
forwards, both losses, both ``zero_grad``, both ``backward``, both ``step``), the
``t % 10 == 0`` block that switches both nets to ``eval()``, computes the test predictions
and test losses, and switches them back to ``train()``.
Shrunk/replaced: nothing in size (it already runs in seconds on a CPU); ``torch.manual_seed``
instead of the commented-out seed; the matplotlib drawing dropped (the test losses it prints
are kept as numbers).
Measure only (not in the program): after training, both nets' MSE in ``eval()`` on the train
and the test points (targets taken as (N, 1)).

nndx, as the author would add it: two models, so a preflight ``nndx.probe`` of each with its
Adam, the full (x, y) batch, the ``MSELoss`` and the train/test points as ``data``; one
``nndx.Monitor(net, optimizer)`` per net, each step's loss logged and the test loss of the
``t % 10`` block logged as ``split="val"``; after training ``nndx.probe(..., monitor=mon)`` per
net; the author reads both diagnoses ranked together.
"""

from __future__ import annotations

import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_dropout"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/503_dropout.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (20 points, 300-unit nets, 500 Adam steps)"),
        Variant(
            "stays_in_eval_mode",
            "the net_overfitting.train() / net_dropped.train() calls after the t % 10 evaluation block are left "
            "out: from step 1 on both nets train in eval() mode, so the dropout net trains with dropout off and "
            "overfits like the plain one",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/shubhamagarwal92/mmd/issues/14",
             "https://github.com/pytorch/tutorials/issues/1624",
             "https://github.com/tk-rusch/coRNN/issues/1"),
            Measure("drop_train_mse", "eval-mode train MSE of the dropout net below half the healthy run's "
                    "(it memorises the noise)", lambda healthy, buggy: buggy < 0.5 * healthy),
        ),
        Variant(
            "target_1d_broadcast",
            "the targets are built 1-D (y = x.squeeze(1) + 0.3 * normal(zeros(N))), so MSELoss compares the (20, 1) "
            "predictions with (20,) targets, broadcasts to (20, 20) and both nets learn to predict the mean of y",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/16045",
             "https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/mlcommons/GaNDLF/issues/134"),
            Measure("ofit_train_mse", "eval-mode train MSE of the plain net (targets as (N, 1)) at least 5x the "
                    "healthy run's", lambda healthy, buggy: buggy > 5.0 * healthy),
        ),
    )
}

N_SAMPLES = 20
N_HIDDEN = 300
STEPS = 500


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    stays_eval = variant == "stays_in_eval_mode"
    flat_y = variant == "target_1d_broadcast"

    # training data
    x = torch.unsqueeze(torch.linspace(-1, 1, N_SAMPLES), 1)
    if flat_y:
        y = x.squeeze(1) + 0.3 * torch.normal(torch.zeros(N_SAMPLES), torch.ones(N_SAMPLES))
    else:
        y = x + 0.3 * torch.normal(torch.zeros(N_SAMPLES, 1), torch.ones(N_SAMPLES, 1))
    # test data
    test_x = torch.unsqueeze(torch.linspace(-1, 1, N_SAMPLES), 1)
    if flat_y:
        test_y = test_x.squeeze(1) + 0.3 * torch.normal(torch.zeros(N_SAMPLES), torch.ones(N_SAMPLES))
    else:
        test_y = test_x + 0.3 * torch.normal(torch.zeros(N_SAMPLES, 1), torch.ones(N_SAMPLES, 1))

    net_overfitting = torch.nn.Sequential(
        torch.nn.Linear(1, N_HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(N_HIDDEN, N_HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(N_HIDDEN, 1),
    )
    net_dropped = torch.nn.Sequential(
        torch.nn.Linear(1, N_HIDDEN),
        torch.nn.Dropout(0.5),
        torch.nn.ReLU(),
        torch.nn.Linear(N_HIDDEN, N_HIDDEN),
        torch.nn.Dropout(0.5),
        torch.nn.ReLU(),
        torch.nn.Linear(N_HIDDEN, 1),
    )

    optimizer_ofit = torch.optim.Adam(net_overfitting.parameters(), lr=0.01)
    optimizer_drop = torch.optim.Adam(net_dropped.parameters(), lr=0.01)
    loss_func = torch.nn.MSELoss()

    splits = (x, y, test_x, test_y)
    nx.preflight(net_overfitting, (x, y), loss_func, optimizer=optimizer_ofit, data=splits)
    nx.preflight(net_dropped, (x, y), loss_func, optimizer=optimizer_drop, data=splits)
    mon_ofit = nx.monitor(net_overfitting, optimizer_ofit, every=10)
    mon_drop = nx.monitor(net_dropped, optimizer_drop, every=10)

    test_losses = (float("nan"), float("nan"))
    for t in range(STEPS):
        pred_ofit = net_overfitting(x)
        pred_drop = net_dropped(x)
        loss_ofit = loss_func(pred_ofit, y)
        loss_drop = loss_func(pred_drop, y)

        optimizer_ofit.zero_grad()
        optimizer_drop.zero_grad()
        loss_ofit.backward()
        loss_drop.backward()
        optimizer_ofit.step()
        optimizer_drop.step()
        nx.timed(lambda: mon_ofit.log(loss_ofit))
        nx.timed(lambda: mon_drop.log(loss_drop))

        if t % 10 == 0:
            # change to eval mode in order to fix drop out effect
            net_overfitting.eval()
            net_dropped.eval()
            test_pred_ofit = net_overfitting(test_x)
            test_pred_drop = net_dropped(test_x)
            test_loss_ofit = loss_func(test_pred_ofit, test_y)
            test_loss_drop = loss_func(test_pred_drop, test_y)
            test_losses = (test_loss_ofit.item(), test_loss_drop.item())  # what plt.text shows
            nx.timed(lambda: mon_ofit.log(test_loss_ofit, split="val"))
            nx.timed(lambda: mon_drop.log(test_loss_drop, split="val"))
            if not stays_eval:
                # change back to train mode
                net_overfitting.train()
                net_dropped.train()

    nx.finish(mon_ofit, net_overfitting, (x, y), loss_func, optimizer=optimizer_ofit, data=splits)
    nx.finish(mon_drop, net_dropped, (x, y), loss_func, optimizer=optimizer_drop, data=splits)

    # measure only: eval-mode errors with (N, 1) targets
    y2, ty2 = y.reshape(-1, 1), test_y.reshape(-1, 1)
    net_overfitting.eval()
    net_dropped.eval()
    with torch.no_grad():
        out = {
            "ofit_train_mse": torch.mean((net_overfitting(x) - y2) ** 2).item(),
            "drop_train_mse": torch.mean((net_dropped(x) - y2) ** 2).item(),
            "ofit_test_mse": torch.mean((net_overfitting(test_x) - ty2) ** 2).item(),
            "drop_test_mse": torch.mean((net_dropped(test_x) - ty2) ** 2).item(),
        }
    out["last_plotted_test_loss_ofit"], out["last_plotted_test_loss_drop"] = test_losses
    out["last_train_loss_drop"] = loss_drop.item()
    return out

"""Port of Atcold/NYU-DLSP20's ``05-regression.ipynb``: an ensemble of two-layer networks
(half ReLU, half Tanh) fitted full-batch to a noisy cubic with MSE and Adam, then the
ensemble's spread plotted inside and outside the data's range.

Source: github.com/Atcold/NYU-DLSP20, ``05-regression.ipynb`` at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (CC BY-NC-SA 4.0, Alfredo Canziani). Written anew from
the facts of that notebook; no code copied.

Kept: the data (``X = linspace(-1, 1, 100)`` unsqueezed to (100, 1), ``y = X.pow(3) + 0.3 *
torch.rand(X.size())``); ``D = 1``, ``C = 1``, ``H = 100``; the "Two-layered network" section:
for each of ``n_networks`` models ``nn.Sequential(nn.Linear(D, H), nn.ReLU() if mod <
n_networks // 2 else nn.Tanh(), nn.Linear(H, C))``, ``torch.nn.MSELoss()``,
``torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-5)``, 1,000 full-batch steps
of forward, (the output at ``t == 0`` kept as the pre-train prediction), ``criterion(y_pred,
y)``, the loss printed every step (not printed here), ``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``; ``dense_prediction`` after training: each model
under ``torch.no_grad()`` on ``X_new = linspace(-4, 4, 1001)``, the ensemble's variance and
standard deviation across models.
Shrunk: 4 networks (2 ReLU, 2 Tanh) instead of 10, so that nndx's probe of each trained model
fits the benchmark's time; the notebook's first section (the purely linear model trained with
SGD) is not ported; the seed is the harness's instead of 1; CPU; no plots.
Measure only (not in the program): each model's MSE on the training points with the shapes
matched ((100, 1) against (100, 1)), averaged over the ensemble and per family; the ensemble's
standard deviation on ``X_new`` inside [-1, 1] and outside [-2, 2].

nndx, as the author would add it: a preflight ``nndx.probe`` of the first model before it is
trained, on the full batch ``(X, y)`` with the ``MSELoss`` and that model's Adam; then each
model's 1,000 steps wrapped in ``nndx.Monitor(model, optimizer, every=10)``, the loss logged
where the notebook prints it, and once the model is trained ``nndx.probe(model, (X, y),
criterion, optimizer=optimizer, monitor=mon)`` + ``nndx.diagnose``; the author reads the
diagnoses of all the models, ranked together. The notebook has no held-out set to log.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_regression"
SOURCE = Source("Atcold/NYU-DLSP20", "05-regression.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's two-layer ensemble as published (shrunk: 4 networks instead of 10)"),
        Variant(
            "target_not_unsqueezed",
            "the target is built from the 1-D linspace before X is unsqueezed, so y has shape (100,) against "
            "the model's (100, 1) output: MSELoss broadcasts them to (100, 100) (PyTorch only warns) and every "
            "output is fitted to every target, i.e. to their mean",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/16045",
             "https://github.com/pytorch/pytorch/pull/18349",
             "https://github.com/deepset-ai/FARM/issues/229"),
            Measure("mean_mse", "training-set MSE (shapes matched) averaged over the ensemble, at least 3x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
        Variant(
            "nonlinearity_dropped",
            "the ReLU/Tanh between the two Linear layers is left out of the nn.Sequential (Linear(1, 100), "
            "Linear(100, 1)): every network of the ensemble is a linear function of x and cannot fit the cubic",
            (C.MISSING_ACTIVATION,),
            ("https://github.com/aymericdamien/TensorFlow-Examples/issues/207",
             "https://github.com/aymericdamien/TensorFlow-Examples/issues/270",
             "https://github.com/soumith/cvpr2015/issues/6"),
            Measure("mean_mse", "training-set MSE averaged over the ensemble, at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

D, C_OUT, H = 1, 1, 100
N_NETWORKS = 4
STEPS = 1000
LEARNING_RATE = 1e-3
LAMBDA_L2 = 1e-5


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    torch.manual_seed(seed)

    # ## Create the data
    if variant == "target_not_unsqueezed":
        x_line = torch.linspace(-1, 1, 100)
        y = x_line.pow(3) + 0.3 * torch.rand(x_line.size())
        X = torch.unsqueeze(x_line, dim=1)
    else:
        X = torch.unsqueeze(torch.linspace(-1, 1, 100), dim=1)
        y = X.pow(3) + 0.3 * torch.rand(X.size())

    # ## Two-layered network
    models, y_pretrain = [], []
    criterion = torch.nn.MSELoss()
    for mod in range(N_NETWORKS):
        if variant == "nonlinearity_dropped":
            model = nn.Sequential(nn.Linear(D, H), nn.Linear(H, C_OUT))
        else:
            model = nn.Sequential(
                nn.Linear(D, H),
                nn.ReLU() if mod < N_NETWORKS // 2 else nn.Tanh(),
                nn.Linear(H, C_OUT),
            )
        models.append(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, weight_decay=LAMBDA_L2)

        if mod == 0:
            nx.preflight(model, (X, y), criterion, optimizer=optimizer)
        mon = nx.monitor(model, optimizer, every=10)
        for t in range(STEPS):
            y_pred = model(X)
            if t == 0:
                y_pretrain.append(y_pred.detach())
            loss = criterion(y_pred, y)
            nx.timed(lambda: mon.log(loss))  # where the notebook prints the loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        nx.finish(mon, model, (X, y), criterion, optimizer=optimizer)

    # ## Predictions: after training (dense_prediction, without the plots)
    X_new = torch.unsqueeze(torch.linspace(-4, 4, 1001), dim=1)
    preds = []
    for model in models:
        with torch.no_grad():
            preds.append(model(X_new))
    y_combo = torch.stack(preds)
    std = y_combo.var(dim=0).sqrt().view(-1)
    inside = X_new.view(-1).abs() <= 1
    outside = X_new.view(-1).abs() >= 2

    # measure only: each model's MSE on the training points, shapes matched
    y_col = y.view(-1, 1)
    with torch.no_grad():
        mses = [float(((m(X) - y_col) ** 2).mean()) for m in models]
    half = N_NETWORKS // 2
    return {"mean_mse": sum(mses) / len(mses), "relu_mse": sum(mses[:half]) / half,
            "tanh_mse": sum(mses[half:]) / (N_NETWORKS - half), "final_loss": float(loss.detach()),
            "ensemble_std_inside": float(std[inside].mean()), "ensemble_std_outside": float(std[outside].mean()),
            "pretrain_var": float(torch.stack(y_pretrain).var(dim=0).view(-1).mean())}  # fmt: skip

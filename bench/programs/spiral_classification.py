"""Port of NYU Deep Learning (Atcold, Spring 2020), notebook 04 "Spiral classification": the
three-arm spiral, first fitted by a "linear model" (two stacked ``nn.Linear`` with no
non-linearity, SGD), then by a two-layer net (``Linear -> ReLU -> Linear``, Adam), each trained
full-batch with ``nn.CrossEntropyLoss`` for 1,000 epochs.

Source: github.com/Atcold/NYU-DLSP20, ``04-spiral_classification.ipynb`` (and ``res/plot_lib.py``,
only its plotting, which is not kept) at commit 3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd
(CC BY-NC-SA 4.0, Alfredo Canziani). Written anew from the facts of that notebook; no code copied.

Kept: ``seed = 12345`` for ``random`` and ``torch``; ``N = 1000`` samples per class, ``D = 2``,
``C = 3`` classes, ``H = 100`` hidden units; the data built sample by sample as in the notebook
(for class ``c``: ``t = linspace(0, 1, N)``, an angle ``linspace(2*pi/C * c, 2*pi/C * (2 + c), N)``
plus ``randn(N) * 0.2``, the point ``t * (sin(angle), cos(angle))``, label ``c``); the linear
model ``nn.Sequential(nn.Linear(D, H), nn.Linear(H, C))`` with ``torch.optim.SGD(lr=1e-3,
weight_decay=1e-5)``; the two-layer net ``nn.Sequential(nn.Linear(D, H), nn.ReLU(),
nn.Linear(H, C))`` with ``torch.optim.Adam(lr=1e-3, weight_decay=1e-5)``; ``criterion =
torch.nn.CrossEntropyLoss()``; each loop: 1,000 full-batch epochs of ``y_pred = model(X)``,
``loss = criterion(y_pred, y)``, ``score, predicted = torch.max(y_pred, 1)``, ``acc = (y ==
predicted).sum().float() / len(y)``, the print of epoch/loss/accuracy, then
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``.
Shrunk: nothing of the training (it already runs in seconds on a CPU); the CUDA device, the
per-epoch print, ``display.clear_output`` and the plots (``plot_data``/``plot_model``) left out.
Measure only (not in the program): the last epoch's accuracy and loss of each model, as the
notebook prints them (on the training points: the notebook has no held-out set).

nndx, as the author would add it, in each of the two training cells: a preflight
``nndx.probe(model, (X, y), criterion, optimizer=optimizer)`` before the loop (full batch:
the notebook's only batch); ``nndx.Monitor(model, optimizer, every=10)`` around the loop,
the loss and accuracy logged where the notebook prints them; after the loop
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``. The author reads the
two cells' diagnoses together.
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "spiral_classification"
SOURCE = Source("Atcold/NYU-DLSP20", "04-spiral_classification.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published: the linear model (SGD) then the two-layer net (Adam)"),
        Variant(
            "relu_left_out",
            "the nn.ReLU() left out of the two-layer net's nn.Sequential: Linear(D, H) -> Linear(H, C) is one "
            "linear map, the same model as the notebook's linear model, and cannot separate the spiral's arms",
            (C.MISSING_ACTIVATION,),
            ("https://github.com/nutonomy/nuscenes-devkit/issues/728",
             "https://github.com/stanfordnlp/stanza/pull/1610",
             "https://github.com/facebookresearch/DeepConvexity/issues/2"),
            Measure("two_layer_accuracy", "the two-layer net's final accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "optimizer_from_previous_model",
            "in the two-layer cell the Adam optimizer is built from model.parameters() before model is reassigned "
            "to the new two-layer net (the optimizer line run above the model line, as when cells are re-run out of "
            "order): Adam holds the linear model's parameters, and the two-layer net never changes",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/tensorflow/tfjs-core/issues/502",
             "https://github.com/microsoft/nni/issues/4521",
             "https://github.com/kitzeslab/opensoundscape/issues/351"),
            Measure("two_layer_accuracy", "the two-layer net's final accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

N, D, NUM_CLASSES, H = 1000, 2, 3, 100  # samples per class, dimensions, classes, hidden units
LEARNING_RATE, LAMBDA_L2, EPOCHS = 1e-3, 1e-5, 1000


def make_spiral() -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.zeros(N * NUM_CLASSES, D)
    y = torch.zeros(N * NUM_CLASSES, dtype=torch.long)
    for c in range(NUM_CLASSES):
        index = 0
        t = torch.linspace(0, 1, N)
        inner_var = torch.linspace((2 * math.pi / NUM_CLASSES) * c, (2 * math.pi / NUM_CLASSES) * (2 + c), N) \
            + torch.randn(N) * 0.2  # fmt: skip
        for ix in range(N * c, N * (c + 1)):
            X[ix] = t[index] * torch.FloatTensor((math.sin(inner_var[index]), math.cos(inner_var[index])))
            y[ix] = c
            index += 1
    return X, y


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, criterion: nn.Module, X: torch.Tensor, y: torch.Tensor,
        nx: Nndx) -> tuple[float, float]:  # fmt: skip
    """One training cell of the notebook (the two cells are the same code)."""
    nx.preflight(model, (X, y), criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)
    loss_value = acc_value = float("nan")
    for _t in range(EPOCHS):
        # Feed forward to get the logits
        y_pred = model(X)
        # Compute the loss and accuracy
        loss = criterion(y_pred, y)
        score, predicted = torch.max(y_pred, 1)
        acc = (y == predicted).sum().float() / len(y)
        loss_value, acc_value = loss.item(), acc.item()  # print("[EPOCH]: %i, [LOSS]: %.6f, [ACCURACY]: %.3f" ...)
        nx.timed(lambda: mon.log(loss, accuracy=acc_value))  # noqa: B023
        # zero the gradients before running the backward pass
        optimizer.zero_grad()
        # Backward pass to compute the gradient of loss w.r.t our learnable params
        loss.backward()
        # Update params
        optimizer.step()
    nx.finish(mon, model, (X, y), criterion, optimizer=optimizer)
    return loss_value, acc_value


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(12345 + seed)
    torch.manual_seed(12345 + seed)
    X, y = make_spiral()

    # Linear model
    model = nn.Sequential(nn.Linear(D, H), nn.Linear(H, NUM_CLASSES))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, weight_decay=LAMBDA_L2)  # built-in L2
    linear_loss, linear_acc = fit(model, optimizer, criterion, X, y, nx)

    # Two-layered network
    if variant == "optimizer_from_previous_model":  # the optimizer line above the model line
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, weight_decay=LAMBDA_L2)
    if variant == "relu_left_out":
        model = nn.Sequential(nn.Linear(D, H), nn.Linear(H, NUM_CLASSES))
    else:
        model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, NUM_CLASSES))
    criterion = torch.nn.CrossEntropyLoss()
    if variant != "optimizer_from_previous_model":
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, weight_decay=LAMBDA_L2)  # built-in L2
    two_layer_loss, two_layer_acc = fit(model, optimizer, criterion, X, y, nx)

    return {"linear_accuracy": linear_acc, "linear_loss": linear_loss,
            "two_layer_accuracy": two_layer_acc, "two_layer_loss": two_layer_loss}  # fmt: skip

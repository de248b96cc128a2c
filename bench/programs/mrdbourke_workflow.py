"""Port of mrdbourke/pytorch-deep-learning's "PyTorch workflow" notebook: a hand-written linear
model (``weights * x + bias``, both ``nn.Parameter``) fitted to a straight line with
``L1Loss`` and SGD, full batch, with a test pass in ``model.eval()`` and
``torch.inference_mode()`` every epoch.

Source: github.com/mrdbourke/pytorch-deep-learning, ``01_pytorch_workflow.ipynb`` (sections
1-3: data, ``LinearRegressionModel``, the training/testing loop) at commit
baa27b691617461c173ecf3439793cd8cde74e13 (MIT, Copyright (c) 2021 Daniel Bourke). Written anew
from the facts of that notebook; no code copied.

Kept: everything. The data: ``weight = 0.7``, ``bias = 0.3``, ``X = torch.arange(0, 1,
0.02).unsqueeze(dim=1)``, ``y = weight * X + bias``, the first 80% (40 points) for training
and the last 10 for testing, unshuffled; ``LinearRegressionModel`` (``self.weights =
nn.Parameter(torch.randn(1, dtype=torch.float), requires_grad=True)``, the same for
``self.bias``, ``forward`` returning ``self.weights * x + self.bias``) built after
``torch.manual_seed(42)``; ``nn.L1Loss()``; ``torch.optim.SGD(params=model_0.parameters(),
lr=0.01)``; ``torch.manual_seed(42)`` again, then 100 epochs of: ``model_0.train()``, forward on
``X_train``, loss, ``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``;
``model_0.eval()`` and, under ``torch.inference_mode()``, the forward on ``X_test`` and the
test loss against ``y_test.type(torch.float)``; every 10 epochs the epoch and both losses
appended to the lists the notebook plots.
Shrunk: nothing (100 epochs on 40 points take milliseconds); the seed 42 is ``42 + seed``; no
plots, no saving/loading.
Measure only (not in the program): the final test loss (the notebook's last ``test_loss``)
and the learned ``weights``/``bias`` (the notebook prints ``model_0.state_dict()`` against
0.7 and 0.3).

nndx, as the author would add it after the README's quick start: a preflight ``nndx.probe``
on the training set ``(X_train, y_train)`` (the one batch the loop trains on) with the
``L1Loss`` and the optimizer; ``nndx.Monitor(model_0, optimizer, every=10)`` (the notebook
records the losses every 10 epochs) around the loop, each epoch's train loss logged after
the step and its test loss logged as ``split="val"`` after the test pass; after the loop
``nndx.probe(model_0, (X_train, y_train), loss_fn, optimizer=optimizer, monitor=mon,
data=(X_train, y_train, X_test, y_test))`` (the README's data checks, with the notebook's
split) and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mrdbourke_workflow"
SOURCE = Source("mrdbourke/pytorch-deep-learning", "01_pytorch_workflow.ipynb",
                "baa27b691617461c173ecf3439793cd8cde74e13", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "01_pytorch_workflow.ipynb's first model and loop as published"),
        Variant(
            "stale_optimizer",
            "the model cell re-run after the optimizer cell (a new model_0 = LinearRegressionModel()): the SGD "
            "still holds the first instance's parameters, so the model that is trained and evaluated gets "
            "gradients that no optimizer applies and never moves",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/mrdbourke/pytorch-deep-learning/issues/399",
             "https://github.com/mrdbourke/pytorch-deep-learning/discussions/398"),
            Measure("test_loss", "final test L1 loss at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "missing_zero_grad",
            "optimizer.zero_grad() (the loop's step 3) left out: each backward adds to the gradients of all "
            "the earlier epochs, so every step applies the running sum and the line overshoots and oscillates",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/greebear/pytorch-learning/issues/1",
             "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_loss", "final test L1 loss at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

WEIGHT, BIAS, START, END, STEP, LR, EPOCHS = 0.7, 0.3, 0, 1, 0.02, 0.01, 100


class LinearRegressionModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.randn(1, dtype=torch.float), requires_grad=True)
        self.bias = nn.Parameter(torch.randn(1, dtype=torch.float), requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weights * x + self.bias


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    # 1. Data
    X = torch.arange(START, END, STEP).unsqueeze(dim=1)
    y = WEIGHT * X + BIAS
    train_split = int(0.8 * len(X))
    X_train, y_train = X[:train_split], y[:train_split]
    X_test, y_test = X[train_split:], y[train_split:]

    # 2. Model, loss, optimizer
    torch.manual_seed(42 + seed)
    model_0 = LinearRegressionModel()
    loss_fn = nn.L1Loss()
    optimizer = torch.optim.SGD(params=model_0.parameters(), lr=LR)
    if variant == "stale_optimizer":  # the model cell run again after the optimizer cell
        torch.manual_seed(42 + seed)
        model_0 = LinearRegressionModel()

    nx.preflight(model_0, (X_train, y_train), loss_fn, optimizer=optimizer)

    # 3. Training
    torch.manual_seed(42 + seed)
    epochs = EPOCHS
    train_loss_values, test_loss_values, epoch_count = [], [], []
    mon = nx.monitor(model_0, optimizer, every=10)
    loss = test_loss = torch.tensor(float("nan"))
    for epoch in range(epochs):
        ### Training
        model_0.train()
        y_pred = model_0(X_train)
        loss = loss_fn(y_pred, y_train)
        if variant != "missing_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023

        ### Testing
        model_0.eval()
        with torch.inference_mode():
            test_pred = model_0(X_test)
            test_loss = loss_fn(test_pred, y_test.type(torch.float))
            if epoch % 10 == 0:
                epoch_count.append(epoch)
                train_loss_values.append(loss.detach().numpy())
                test_loss_values.append(test_loss.detach().numpy())
        nx.timed(lambda: mon.log(test_loss, split="val"))  # noqa: B023

    nx.finish(mon, model_0, (X_train, y_train), loss_fn, optimizer=optimizer,
              data=(X_train, y_train, X_test, y_test))  # fmt: skip

    state = model_0.state_dict()
    return {"test_loss": float(test_loss.item()), "train_loss": float(loss.item()),
            "weights": float(state["weights"].item()), "bias": float(state["bias"].item())}  # fmt: skip

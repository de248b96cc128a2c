"""Port of patrickloeber/pytorchTutorial, tutorial 08 (logistic regression): one ``nn.Linear``
with ``torch.sigmoid`` inside ``forward``, ``BCELoss`` and SGD, full batch, on scikit-learn's
breast-cancer data standardised with a ``StandardScaler``.

Source: github.com/patrickloeber/pytorchTutorial, ``08_logistic_regression.py`` at commit
69637721ed9fa2ccf81a1093a928a52bbb591439 (MIT, Copyright (c) 2020 Patrick Loeber). Written anew
from the facts of that file; no code copied.

Kept: ``datasets.load_breast_cancer()`` (569 x 30, shipped with scikit-learn);
``train_test_split(test_size=0.2, random_state=1234)``; ``StandardScaler`` fitted on the train
split (``fit_transform``) and applied to the test split (``transform``); ``float32`` tensors, the
targets viewed as ``[N, 1]``; ``Model``: ``self.linear = nn.Linear(n_features, 1)``, ``forward``
returns ``torch.sigmoid(self.linear(x))``; ``num_epochs = 100``, ``learning_rate = 0.01``,
``nn.BCELoss()``, ``torch.optim.SGD(model.parameters(), lr=learning_rate)``; the loop's order:
forward, loss, ``loss.backward()``, ``optimizer.step()``, then ``optimizer.zero_grad()`` ("zero
grad before new step"), a print every 10 epochs; the test accuracy under ``torch.no_grad()``:
``model(X_test).round()``, ``.eq(y_test).sum() / float(y_test.shape[0])``.
Shrunk / replaced: nothing (the script runs in well under a second on a CPU); the model's
initial weights come from ``torch.manual_seed(seed)`` (the script sets no seed); no prints.
Measure only (not in the program): the final train loss (the last epoch's, as printed) next to
the script's test accuracy.

nndx, as the author would add it after the README: the model returns probabilities and the
loss is ``BCELoss`` on ``[N, 1]`` targets, so nndx gets the script's ``criterion`` and the whole
training set as the batch (the loop is full batch); a preflight ``nndx.probe`` with the
optimizer; ``nndx.Monitor(model, optimizer, every=10)`` around the loop (the script prints every
10 epochs), every epoch's loss logged after the update; after the loop ``nndx.probe(...,
monitor=mon, data=(X_train, y_train, X_test, y_test))`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn import datasets
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "loeber_logistic"
SOURCE = Source("patrickloeber/pytorchTutorial", "08_logistic_regression.py",
                "69637721ed9fa2ccf81a1093a928a52bbb591439", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (not shrunk)"),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: every backward adds to the gradients of all the "
            "epochs before, so each step moves along the running sum of past gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/patrickloeber/pytorchTutorial/issues/19",
             "https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("train_loss", "final train loss differs from the healthy run's by more than 25% of it",
                    lambda healthy, buggy: not abs(buggy - healthy) <= 0.25 * healthy),
        ),
        Variant(
            "no_standard_scaler",
            "the StandardScaler step left out: the raw breast-cancer features (areas up to ~4,250, "
            "smoothness ~0.1) go into the linear layer, the sigmoid saturates and SGD at 0.01 jumps between "
            "saturated solutions",
            (C.UNNORMALIZED_INPUTS,),
            ("https://newbe.dev/pytorch-binary-classification-same-network-structure-simpler-data-but-worse-"
             "performance (Stack Overflow answer: 'Your input data is not normalized')",
             "https://github.com/cmuzeau/breast-cancer (breast cancer logistic regression: 'The values ... are "
             "huge and when they get inputed into the sigmoid, they saturate ... We need to normalize')",
             "https://discuss.pytorch.org/t/loss-not-converging-on-a-binary-classification-problem/177433"),
            Measure("train_loss", "final train loss at least twice the healthy run's",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

NUM_EPOCHS, LEARNING_RATE = 100, 0.01


class Model(nn.Module):
    def __init__(self, n_input_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_input_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y_pred = torch.sigmoid(self.linear(x))
        return y_pred


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    # 0) Prepare data
    bc = datasets.load_breast_cancer()
    X, y = bc.data, bc.target
    n_samples, n_features = X.shape
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=1234)

    if variant != "no_standard_scaler":
        sc = StandardScaler()
        X_train = sc.fit_transform(X_train)
        X_test = sc.transform(X_test)

    X_train = torch.from_numpy(X_train.astype(np.float32))
    X_test = torch.from_numpy(X_test.astype(np.float32))
    y_train = torch.from_numpy(y_train.astype(np.float32))
    y_test = torch.from_numpy(y_test.astype(np.float32))
    y_train = y_train.view(y_train.shape[0], 1)
    y_test = y_test.view(y_test.shape[0], 1)

    # 1) Model
    torch.manual_seed(seed)
    model = Model(n_features)

    # 2) Loss and optimizer
    criterion = nn.BCELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    nx.preflight(model, (X_train, y_train), criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    # 3) Training loop
    loss = None
    with mon:
        for _epoch in range(NUM_EPOCHS):
            y_pred = model(X_train)
            loss = criterion(y_pred, y_train)

            loss.backward()
            optimizer.step()

            if variant != "no_zero_grad":
                optimizer.zero_grad()
            nx.timed(lambda: mon.log(loss))  # noqa: B023

    nx.finish(mon, model, (X_train, y_train), criterion, optimizer=optimizer,
              data=(X_train, y_train, X_test, y_test))  # fmt: skip

    with torch.no_grad():
        y_predicted = model(X_test)
        y_predicted_cls = y_predicted.round()
        acc = y_predicted_cls.eq(y_test).sum() / float(y_test.shape[0])
    return {"test_acc": float(acc.item()), "train_loss": float(loss.item())}

"""Port of mrdbourke/pytorch-deep-learning's binary classification notebook, the non-linear
model: ``make_circles``, ``CircleModelV2`` (Linear-ReLU-Linear-ReLU-Linear), ``BCEWithLogitsLoss``,
SGD at lr 0.1, full-batch train/test loop with ``torch.round(torch.sigmoid(logits))`` and
``accuracy_fn``.

Source: github.com/mrdbourke/pytorch-deep-learning, ``02_pytorch_classification.ipynb``
(cells 83-95: data, ``CircleModelV2``, loss and optimizer, the training/testing loop; cell 38:
``accuracy_fn``; cell 58: ``CircleModelV1``, which the notebook built before) at commit
baa27b691617461c173ecf3439793cd8cde74e13 (MIT, Copyright (c) 2021 Daniel Bourke). Written anew
from the facts of that notebook; no code copied.

Kept: ``make_circles(n_samples=1000, noise=0.03, random_state=42)``; ``torch.from_numpy(...).type(torch.float)``
for X and y; ``train_test_split(X, y, test_size=0.2, random_state=42)``; ``CircleModelV2``
(``layer_1 = Linear(2, 10)``, ``layer_2 = Linear(10, 10)``, ``layer_3 = Linear(10, 1)``,
``self.relu = nn.ReLU()``, forward ``layer_3(relu(layer_2(relu(layer_1(x)))))``);
``nn.BCEWithLogitsLoss()``; ``torch.optim.SGD(model_3.parameters(), lr=0.1)``; 1,000 epochs of
the full-batch loop: ``y_logits = model_3(X_train).squeeze()``, ``y_pred =
torch.round(torch.sigmoid(y_logits))``, ``loss_fn(y_logits, y_train)``, ``accuracy_fn(y_true,
y_pred)`` (``torch.eq(...).sum().item() / len(y_pred) * 100``), ``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``, then ``model_3.eval()`` and, under
``torch.inference_mode()``, the test logits, predictions, loss and accuracy (the notebook never
calls ``model_3.train()`` again; the model has no dropout or batch norm); the final
predictions ``torch.round(torch.sigmoid(model_3(X_test))).squeeze()``. ``model_1 =
CircleModelV1()`` is built before ``model_3`` as in the notebook (not trained here: only the
optimizer bug uses it).
Shrunk / replaced: nothing in size (the notebook already runs in a second on a CPU); the seed is
the harness's (``torch.manual_seed(seed)`` before the models are built and before the loop,
where the notebook uses 42); no prints, plots or ``helper_functions.py`` download.
Measure only (not in the program): nothing; the variants are measured by the notebook's own
final test accuracy (in percent) and test loss.

nndx, as the author would add it: the loop squeezes the logits to ``[N]``; nndx calls
``model(inputs)`` (``[N, 1]``) and then the loss, so the author gives it the training split with
the targets unsqueezed to ``[N, 1]`` and the notebook's ``loss_fn``; a preflight ``nndx.probe``
with the optimizer and ``data=(X_train, y_train, X_test, y_test)``; ``nndx.Monitor(model_3,
optimizer)`` around the loop, each epoch's train loss logged with its accuracy (as a fraction)
and the test loss and accuracy logged as ``split="val"``; after the loop ``nndx.probe(...,
monitor=mon)`` on the same batch and data, then ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from sklearn.datasets import make_circles
from sklearn.model_selection import train_test_split
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mrdbourke_circles_v2"
SOURCE = Source("mrdbourke/pytorch-deep-learning", "02_pytorch_classification.ipynb",
                "baa27b691617461c173ecf3439793cd8cde74e13", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's CircleModelV2 section as published (1,000 full-batch epochs, lr 0.1)"),
        Variant(
            "sigmoid_in_model",
            "the notebook's commented-out option taken: CircleModelV2 ends in self.sigmoid = nn.Sigmoid(), while "
            "the loss stays BCEWithLogitsLoss and the predictions stay torch.round(torch.sigmoid(logits)): the "
            "sigmoid is applied twice, the loss's gradient is squashed, and every prediction rounds "
            "sigmoid(p) >= 0.5 to class 1",
            (C.WRONG_OUTPUT_ACTIVATION, C.DOUBLE_SOFTMAX),
            ("https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/YecanLee/min-LSTM-torch/pull/1",
             "https://github.com/zijundeng/R3Net/issues/3",
             "https://github.com/mrdbourke/pytorch-deep-learning/issues/262"),
            Measure("test_acc", "final test accuracy at least 15 points below the healthy run's: 50.0/50.0 "
                    "against 80.5/94.5 healthy on seeds 0/1", lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
        Variant(
            "optimizer_on_model_1",
            "the optimizer cell left as it was for the previous model: torch.optim.SGD(model_1.parameters(), "
            "lr=0.1) while the loop trains model_3 (CircleModelV2): model_3's gradients are computed (and never "
            "zeroed) but nothing steps its weights",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/mrdbourke/pytorch-deep-learning/issues/399",
             "https://github.com/spro/practical-pytorch/issues/9"),
            Measure("test_acc", "final test accuracy at least 15 points below the healthy run's: 50.0/46.0 "
                    "against 80.5/94.5 healthy on seeds 0/1", lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
    )
}

EPOCHS = 1000


class CircleModelV1(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer_1 = nn.Linear(in_features=2, out_features=10)
        self.layer_2 = nn.Linear(in_features=10, out_features=10)
        self.layer_3 = nn.Linear(in_features=10, out_features=1)

    def forward(self, x):
        return self.layer_3(self.layer_2(self.layer_1(x)))


class CircleModelV2(nn.Module):
    def __init__(self, sigmoid_output: bool = False):
        super().__init__()
        self.layer_1 = nn.Linear(in_features=2, out_features=10)
        self.layer_2 = nn.Linear(in_features=10, out_features=10)
        self.layer_3 = nn.Linear(in_features=10, out_features=1)
        self.relu = nn.ReLU()
        self.sigmoid_output = sigmoid_output
        if sigmoid_output:
            self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        z = self.layer_3(self.relu(self.layer_2(self.relu(self.layer_1(x)))))
        return self.sigmoid(z) if self.sigmoid_output else z


def accuracy_fn(y_true, y_pred):
    correct = torch.eq(y_true, y_pred).sum().item()
    acc = (correct / len(y_pred)) * 100
    return acc


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    X, y = make_circles(n_samples=1000, noise=0.03, random_state=42)
    X = torch.from_numpy(X).type(torch.float)
    y = torch.from_numpy(y).type(torch.float)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=42)

    torch.manual_seed(seed)
    model_1 = CircleModelV1()
    model_3 = CircleModelV2(sigmoid_output=variant == "sigmoid_in_model")

    loss_fn = nn.BCEWithLogitsLoss()
    trained = model_1 if variant == "optimizer_on_model_1" else model_3
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)

    torch.manual_seed(seed)
    epochs = EPOCHS
    probe_batch = (X_train, y_train.unsqueeze(dim=1))
    splits = (X_train, y_train, X_test, y_test)
    nx.preflight(model_3, probe_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model_3, optimizer)

    first_loss = None
    for epoch in range(epochs):
        y_logits = model_3(X_train).squeeze()
        y_pred = torch.round(torch.sigmoid(y_logits))

        loss = loss_fn(y_logits, y_train)
        acc = accuracy_fn(y_true=y_train, y_pred=y_pred)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss, accuracy=acc / 100))
        first_loss = loss.item() if first_loss is None else first_loss

        model_3.eval()
        with torch.inference_mode():
            test_logits = model_3(X_test).squeeze()
            test_pred = torch.round(torch.sigmoid(test_logits))
            test_loss = loss_fn(test_logits, y_test)
            test_acc = accuracy_fn(y_true=y_test, y_pred=test_pred)
        nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc / 100))

    nx.finish(mon, model_3, probe_batch, loss_fn, optimizer=optimizer, data=splits)

    model_3.eval()
    with torch.inference_mode():
        y_preds = torch.round(torch.sigmoid(model_3(X_test))).squeeze()
    final_test_acc = accuracy_fn(y_true=y_test, y_pred=y_preds)
    return {"test_acc": final_test_acc, "test_loss": float(test_loss), "train_acc": float(acc),
            "train_loss": float(loss.item()), "first_train_loss": float(first_loss)}

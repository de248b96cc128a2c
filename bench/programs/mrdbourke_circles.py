"""Port of mrdbourke/pytorch-deep-learning, notebook 02 (PyTorch classification): a three-layer
ReLU MLP (``CircleModelV2``) learns scikit-learn's two concentric circles with
``BCEWithLogitsLoss`` and SGD, full batch, with the notebook's train/test loop and ``accuracy_fn``.

Source: github.com/mrdbourke/pytorch-deep-learning, ``02_pytorch_classification.ipynb`` (section
6.2-6.3, "Building a model with non-linearity" / "Training a model with non-linearity") at commit
baa27b691617461c173ecf3439793cd8cde74e13 (MIT, Copyright (c) 2021 Daniel Bourke). Written anew
from the facts of that notebook; no code copied.

Kept: ``make_circles(n_samples=1000, noise=0.03, random_state=42)``; ``torch.from_numpy(...)
.type(torch.float)`` for X and y; ``train_test_split(test_size=0.2, random_state=42)`` (800 train /
200 test); ``CircleModelV2``: ``layer_1 = Linear(2, 10)``, ``layer_2 = Linear(10, 10)``,
``layer_3 = Linear(10, 1)``, one ``nn.ReLU`` module called twice in ``forward``
(``layer_3(relu(layer_2(relu(layer_1(x)))))``); ``nn.BCEWithLogitsLoss()``; ``torch.optim.SGD(
model_3.parameters(), lr=0.1)``; ``torch.manual_seed(42)`` before the loop; 1000 epochs of the
notebook's full-batch loop: ``y_logits = model(X_train).squeeze()``, ``y_pred =
torch.round(torch.sigmoid(y_logits))``, ``loss = loss_fn(y_logits, y_train)``, ``acc =
accuracy_fn(...)`` (percent), ``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``;
then ``model_3.eval()`` and the test forward under ``torch.inference_mode()`` with the test loss
and accuracy, every epoch (the notebook never calls ``model.train()`` again: no dropout or
batch norm, so harmless, and kept); the final predictions ``torch.round(torch.sigmoid(
model_3(X_test))).squeeze()``.
Shrunk / replaced: nothing shrunk (the notebook already runs on a CPU in about a second); the
model's initial weights come from ``torch.manual_seed(42 + seed)`` set right before the model is
built (the notebook builds it from whatever state earlier cells left); no plots
(``plot_decision_boundary``), no device moves (CPU).
Measure only (not in the program): nothing; the variants are measured by the notebook's own
final test accuracy (percent) and test loss.

nndx, as the author would add it after the README: the model outputs ``[N, 1]`` and the loop
squeezes before ``BCEWithLogitsLoss``, so nndx gets ``loss_fn(logits, y) =
BCEWithLogitsLoss()(logits.squeeze(), y)`` and the training set itself as the batch (the loop is
full batch); a preflight ``nndx.probe`` with the optimizer before the loop;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, each epoch's train loss logged
with its accuracy and each epoch's test loss logged as ``split="val"`` with the test accuracy
(the values the notebook prints, accuracy in its percent); after the loop
``nndx.probe(..., monitor=mon, data=(X_train, y_train, X_test, y_test))`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from sklearn.datasets import make_circles
from sklearn.model_selection import train_test_split
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mrdbourke_circles"
SOURCE = Source("mrdbourke/pytorch-deep-learning", "02_pytorch_classification.ipynb",
                "baa27b691617461c173ecf3439793cd8cde74e13", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's CircleModelV2 training as published (not shrunk)"),
        Variant(
            "sigmoid_in_forward",
            "the model ends in nn.Sigmoid (the notebook's commented-out 'self.sigmoid = nn.Sigmoid()' option, "
            "'you don't need to use it on the predictions') while the loss stays BCEWithLogitsLoss, which applies "
            "a sigmoid itself: the loss sees probabilities as logits (sigmoid twice), its gradient shrinks and the "
            "notebook's round(sigmoid(output)) predicts class 1 for every point",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/Lightning-AI/pytorch-lightning/pull/7096",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/YXNTU/GeneralDyG/issues/6",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("test_acc", "final test accuracy (percent) at least 15 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
        Variant(
            "relu_not_applied",
            "self.relu is defined in __init__ but forward returns layer_3(layer_2(layer_1(x))): three stacked "
            "Linear layers are one linear map, which cannot separate the circles (the notebook's own "
            "CircleModelV1 failure, here reached by forgetting to call the activation)",
            (C.MISSING_ACTIVATION,),
            ("https://github.com/pytorch/tutorials/issues/647",
             "https://github.com/cleverhans-lab/cleverhans/issues/1237",
             "https://github.com/mrdbourke/pytorch-deep-learning/blob/main/02_pytorch_classification.ipynb "
             "(section 6, 'The missing piece: non-linearity')"),
            Measure("test_acc", "final test accuracy (percent) at least 15 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
    )
}

EPOCHS, LR = 1000, 0.1


class CircleModelV2(nn.Module):
    def __init__(self, variant: str = "healthy") -> None:
        super().__init__()
        self.variant = variant
        self.layer_1 = nn.Linear(in_features=2, out_features=10)
        self.layer_2 = nn.Linear(in_features=10, out_features=10)
        self.layer_3 = nn.Linear(in_features=10, out_features=1)
        self.relu = nn.ReLU()
        # the notebook: "Can also put sigmoid in the model" (commented out there)
        if variant == "sigmoid_in_forward":
            self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant == "relu_not_applied":
            return self.layer_3(self.layer_2(self.layer_1(x)))
        out = self.layer_3(self.relu(self.layer_2(self.relu(self.layer_1(x)))))
        if self.variant == "sigmoid_in_forward":
            out = self.sigmoid(out)
        return out


def accuracy_fn(y_true: torch.Tensor, y_pred: torch.Tensor) -> float:
    correct = torch.eq(y_true, y_pred).sum().item()
    return (correct / len(y_pred)) * 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    X, y = make_circles(n_samples=1000, noise=0.03, random_state=42)
    X = torch.from_numpy(X).type(torch.float)
    y = torch.from_numpy(y).type(torch.float)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=42)

    torch.manual_seed(42 + seed)
    model_3 = CircleModelV2(variant)
    loss_fn = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.SGD(model_3.parameters(), lr=LR)

    def nndx_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits.squeeze(), target)

    nx.preflight(model_3, (X_train, y_train), nndx_loss, optimizer=optimizer)
    mon = nx.monitor(model_3, optimizer, every=10)

    torch.manual_seed(42 + seed)
    loss = acc = test_loss = test_acc = float("nan")
    with mon:
        for _epoch in range(EPOCHS):
            # 1. Forward pass
            y_logits = model_3(X_train).squeeze()
            y_pred = torch.round(torch.sigmoid(y_logits))
            # 2. Loss and accuracy
            loss = loss_fn(y_logits, y_train)
            acc = accuracy_fn(y_true=y_train, y_pred=y_pred)
            # 3-5. zero grad, backward, step
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss, accuracy=acc))  # noqa: B023

            # Testing
            model_3.eval()
            with torch.inference_mode():
                test_logits = model_3(X_test).squeeze()
                test_pred = torch.round(torch.sigmoid(test_logits))
                test_loss = loss_fn(test_logits, y_test)
                test_acc = accuracy_fn(y_true=y_test, y_pred=test_pred)
            nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc))  # noqa: B023

    nx.finish(mon, model_3, (X_train, y_train), nndx_loss, optimizer=optimizer,
              data=(X_train, y_train, X_test, y_test))  # fmt: skip

    model_3.eval()
    with torch.inference_mode():
        y_preds = torch.round(torch.sigmoid(model_3(X_test))).squeeze()
    return {"test_acc": accuracy_fn(y_test, y_preds), "test_loss": float(test_loss),
            "train_loss": loss.item(), "train_acc": float(acc)}  # fmt: skip

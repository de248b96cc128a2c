"""Port of mrdbourke/pytorch-deep-learning, notebook 03 (computer vision), model 2: TinyVGG
(``FashionMNISTModelV2``) trained with the notebook's ``train_step`` / ``test_step`` and
``accuracy_fn``, ``CrossEntropyLoss`` and SGD at lr 0.1.

Source: github.com/mrdbourke/pytorch-deep-learning, ``03_pytorch_computer_vision.ipynb`` (the
cells of models 1 and 2, ``train_step``, ``test_step``) and ``helper_functions.py``
(``accuracy_fn``) at commit baa27b691617461c173ecf3439793cd8cde74e13 (MIT, Copyright (c) 2021
Daniel Bourke). Written anew from the facts of those files; no code copied.

Kept: ``FashionMNISTModelV2(input_shape=1, hidden_units=10, output_shape=10)``: ``block_1`` =
Conv2d(1, 10, 3, stride 1, padding 1) - ReLU - Conv2d(10, 10, 3, padding 1) - ReLU -
MaxPool2d(2, 2); ``block_2`` the same at 10 channels; ``classifier`` = Flatten -
Linear(10*7*7, 10); ``torch.manual_seed(42)`` before the model and before the loop;
``nn.CrossEntropyLoss()``; ``torch.optim.SGD(params=model_2.parameters(), lr=0.1)``;
``DataLoader(batch_size=32, shuffle=True)`` for train, ``shuffle=False`` for test; the notebook's
``next(iter(train_dataloader))`` look at a batch; 3 epochs of ``train_step`` (no
``model.train()``; per batch forward, ``loss = loss_fn(y_pred, y)``, ``train_loss += loss`` (a
tensor, as the notebook adds it), ``accuracy_fn(y_true=y, y_pred=y_pred.argmax(dim=1))``,
``zero_grad``, ``backward``, ``step``; the sums divided by ``len(data_loader)``) then
``test_step`` (``model.eval()``, ``torch.inference_mode()``, the same sums); ``accuracy_fn`` =
``torch.eq(y_true, y_pred).sum().item() / len(y_pred) * 100``. The notebook's model 1
(``FashionMNISTModelV1``: Flatten - Linear(784, 10) - ReLU - Linear(10, 10) - ReLU) and its
SGD are built as in its cells (model 1's own training is left out: nothing of it reaches
model 2 but its optimizer object, which one bug reuses).
Replaced / shrunk: FashionMNIST (60,000 + 10,000 28x28 images) by scikit-learn's 8x8 digits
(1,437 train + 360 test), turned to tensors as ``ToTensor`` does ([0, 1], shape [1, 8, 8])
and resized bilinearly to 28x28 so every layer keeps its shape (Linear(10*7*7, 10)); no
plots, no prints, no timers; CPU.
Measure only (not in the program): the numbers ``test_step`` prints after the last epoch
(test loss and accuracy) and ``train_step``'s last-epoch loss and accuracy.

nndx, as the author would add it after the README: the model returns logits for
``CrossEntropyLoss``, so nndx gets ``loss_fn`` and the batch the notebook already draws with
``next(iter(train_dataloader))``; a preflight ``nndx.probe`` with the optimizer;
``nndx.Monitor(model_2, optimizer, every=10)`` around the epochs, each batch's loss logged in
``train_step`` after the step and each epoch's test loss and accuracy logged as
``split="val"`` in ``test_step`` (where the notebook prints them); after training
``nndx.probe(..., monitor=mon, data=(X_train, y_train, X_test, y_test))`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mrdbourke_tinyvgg"
SOURCE = Source("mrdbourke/pytorch-deep-learning", "03_pytorch_computer_vision.ipynb",
                "baa27b691617461c173ecf3439793cd8cde74e13", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "model 2 of the notebook as published (shrunk: 8x8 digits resized to 28x28)"),
        Variant(
            "optimizer_over_model_1",
            "the cell that builds model 2's optimizer is not rerun: the loop steps the leftover "
            "torch.optim.SGD(params=model_1.parameters(), lr=0.1) from the model 1 cells, so model 2's "
            "gradients are computed every batch and never applied",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/pytorch/pytorch/issues/14467",
             "https://github.com/namisan/mt-dnn/issues/5",
             "https://github.com/mrdbourke/pytorch-deep-learning/issues/1168"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "unscaled_pixels",
            "the images reach the model as raw 0..255 pixel values (the dataset's .data tensor cast to float, "
            "ToTensor's division by 255 left out), with SGD still at lr 0.1",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/delijati/pytorch-siamese/issues/3",
             "https://github.com/chainer/chainercv/issues/358"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
    )
}

BATCH_SIZE, EPOCHS, LR, HIDDEN_UNITS, SIDE = 32, 10, 0.1, 10, 28


# --------------------------------------------------------------------------- helper_functions.py


def accuracy_fn(y_true: torch.Tensor, y_pred: torch.Tensor) -> float:
    correct = torch.eq(y_true, y_pred).sum().item()
    return (correct / len(y_pred)) * 100


# --------------------------------------------------------------------------- the notebook's models


class FashionMNISTModelV1(nn.Module):
    def __init__(self, input_shape: int, hidden_units: int, output_shape: int) -> None:
        super().__init__()
        self.layer_stack = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features=input_shape, out_features=hidden_units),
            nn.ReLU(),
            nn.Linear(in_features=hidden_units, out_features=output_shape),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_stack(x)


class FashionMNISTModelV2(nn.Module):
    def __init__(self, input_shape: int, hidden_units: int, output_shape: int) -> None:
        super().__init__()
        self.block_1 = nn.Sequential(
            nn.Conv2d(in_channels=input_shape, out_channels=hidden_units, kernel_size=3, stride=1, padding=1),
            nn.ReLU(),
            nn.Conv2d(in_channels=hidden_units, out_channels=hidden_units, kernel_size=3, stride=1, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.block_2 = nn.Sequential(
            nn.Conv2d(hidden_units, hidden_units, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden_units, hidden_units, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features=hidden_units * 7 * 7, out_features=output_shape),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block_1(x)
        x = self.block_2(x)
        x = self.classifier(x)
        return x


# --------------------------------------------------------------------------- train_step / test_step


def train_step(model, data_loader, loss_fn, optimizer, accuracy_fn, nx, mon) -> tuple[float, float]:
    train_loss, train_acc = 0, 0
    for batch, (X, y) in enumerate(data_loader):
        y_pred = model(X)
        loss = loss_fn(y_pred, y)
        train_loss += loss
        train_acc += accuracy_fn(y_true=y, y_pred=y_pred.argmax(dim=1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
    train_loss /= len(data_loader)
    train_acc /= len(data_loader)
    return train_loss.item(), float(train_acc)


def test_step(data_loader, model, loss_fn, accuracy_fn, nx, mon) -> tuple[float, float]:
    test_loss, test_acc = 0, 0
    model.eval()
    with torch.inference_mode():
        for X, y in data_loader:
            test_pred = model(X)
            test_loss += loss_fn(test_pred, y)
            test_acc += accuracy_fn(y_true=y, y_pred=test_pred.argmax(dim=1))
        test_loss /= len(data_loader)
        test_acc /= len(data_loader)
    test_loss, test_acc = float(test_loss), float(test_acc)
    nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc))
    return test_loss, test_acc


# --------------------------------------------------------------------------- the notebook


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, SIDE), digits.upscaled(te_raw, SIDE)  # ToTensor: [0, 1]
    if variant == "unscaled_pixels":  # the raw pixel values, the division by 255 left out
        x_train, x_test = x_train * 255.0, x_test * 255.0
    train_data, test_data = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    class_names = list(range(10))

    train_dataloader = DataLoader(train_data, batch_size=BATCH_SIZE, shuffle=True)
    test_dataloader = DataLoader(test_data, batch_size=BATCH_SIZE, shuffle=False)
    train_features_batch, train_labels_batch = next(iter(train_dataloader))

    # model 1's cells: the model and its loss / optimizer
    torch.manual_seed(42 + seed)
    model_1 = FashionMNISTModelV1(input_shape=SIDE * SIDE, hidden_units=10, output_shape=len(class_names))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(params=model_1.parameters(), lr=LR)

    # model 2's cells
    torch.manual_seed(42 + seed)
    model_2 = FashionMNISTModelV2(input_shape=1, hidden_units=HIDDEN_UNITS, output_shape=len(class_names))
    if variant != "optimizer_over_model_1":  # the bug: this cell is not run, model 1's optimizer stays
        loss_fn = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(params=model_2.parameters(), lr=LR)

    nx.preflight(model_2, (train_features_batch, train_labels_batch), loss_fn, optimizer=optimizer)
    mon = nx.monitor(model_2, optimizer, every=10)

    torch.manual_seed(42 + seed)
    train_loss = train_acc = test_loss = test_acc = float("nan")
    for _epoch in range(EPOCHS):
        train_loss, train_acc = train_step(model_2, train_dataloader, loss_fn, optimizer, accuracy_fn, nx, mon)
        test_loss, test_acc = test_step(test_dataloader, model_2, loss_fn, accuracy_fn, nx, mon)

    nx.finish(mon, model_2, (train_features_batch, train_labels_batch), loss_fn, optimizer=optimizer,
              data=(x_train, tr_y, x_test, te_y))  # fmt: skip
    return {"test_acc": test_acc, "test_loss": test_loss, "train_acc": train_acc, "train_loss": train_loss}

"""Port of the PyTorch "Quickstart" tutorial (Learn the Basics): an MLP on FashionMNIST.

Source: github.com/pytorch/tutorials, ``beginner_source/basics/quickstart_tutorial.py`` at
commit afcd669d56554c2ef46f2da92edbfaf8c54043ec (BSD-3-Clause, Copyright (c) 2017-2022
PyTorch contributors). Written anew from the facts of that file; no code copied.

Kept: the data through ``ToTensor`` only (pixels in [0, 1], no normalisation);
``DataLoader(batch_size=64)`` for both splits, without ``shuffle`` (as published);
``NeuralNetwork``: ``nn.Flatten`` then ``linear_relu_stack`` = ``Linear(H*W, 512)``,
``ReLU``, ``Linear(512, 512)``, ``ReLU``, ``Linear(512, 10)``, returning the logits;
``loss_fn = nn.CrossEntropyLoss()``; ``torch.optim.SGD(model.parameters(), lr=1e-3)``;
``train(dataloader, model, loss_fn, optimizer)`` with ``model.train()`` and the
tutorial's order ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad()``;
``test(dataloader, model, loss_fn)`` with ``model.eval()`` + ``torch.no_grad()``, the mean
of the batch losses and the accuracy; the epoch loop calling ``train`` then ``test``.
Shrunk: scikit-learn's 8x8 digits instead of FashionMNIST, 1,437 training and 360 test
images instead of 60,000 / 10,000, each upscaled (bilinear) to 28x28 so the first
``Linear`` is the tutorial's ``28*28 -> 512``; 200 epochs (4,600 steps) instead of 5
(4,690 steps): the same number of the small plain-SGD steps.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the data splits, ``nndx.Monitor`` around the epoch loop with the tutorial's
``loss_fn`` argument given as ``mon.loss_fn``, each training batch's loss and each
epoch's test loss (``split="val"``, with the accuracy) logged; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "quickstart"
SOURCE = Source("pytorch/tutorials", "beginner_source/basics/quickstart_tutorial.py",
                "afcd669d56554c2ef46f2da92edbfaf8c54043ec", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published"),
        Variant(
            "softmax_in_model",
            "nn.Softmax(dim=1) appended to linear_relu_stack (the model returns probabilities, as the "
            "'Build Model' page's pred_probab) while loss_fn stays nn.CrossEntropyLoss",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/shaoxiongji/federated-learning/issues/9",
             "https://github.com/illiterate/BertClassifier/issues/2"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.31/0.31/0.36 "
                    "(train loss stuck at 2.297) against 0.86/0.89/0.88 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "optimizer_of_first_model",
            "the optimizer is built on one NeuralNetwork and the model cell is run again "
            "(model = NeuralNetwork()) before training: the trained model's parameters are not the optimizer's",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/spro/practical-pytorch/issues/9", "https://github.com/pytorch/pytorch/issues/14467"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.09/0.03/0.20 "
                    "(the untrained model) against 0.86/0.89/0.88 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

SIDE = 28  # the digits, upscaled to FashionMNIST's size
batch_size = 64
epochs = 200


class NeuralNetwork(nn.Module):
    def __init__(self, softmax: bool = False) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        layers = [nn.Linear(SIDE * SIDE, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)]
        if softmax:
            layers.append(nn.Softmax(dim=1))
        self.linear_relu_stack = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(x)
        return self.linear_relu_stack(x)


def train_epoch(dataloader, model, loss_fn, optimizer, mon) -> float:
    """The tutorial's ``train``; returns the mean batch loss (measure only)."""
    model.train()
    total = 0.0
    for batch, (X, y) in enumerate(dataloader):
        pred = model(X)
        loss = loss_fn(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mon.log(loss)
        total += loss.item()
    return total / len(dataloader)


def test(dataloader, model, loss_fn) -> tuple[float, float]:
    size, num_batches = len(dataloader.dataset), len(dataloader)
    model.eval()
    test_loss, correct = 0.0, 0.0
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    return test_loss / num_batches, correct / size


def images(raw: torch.Tensor) -> torch.Tensor:
    """``ToTensor`` on the digits, upscaled to 28x28: (N, 1, 28, 28) in [0, 1]."""
    return data.upscaled(raw, SIDE)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    x_train, x_test = images(train_images), images(test_images)
    train_dataloader = DataLoader(TensorDataset(x_train, train_labels), batch_size=batch_size)
    test_dataloader = DataLoader(TensorDataset(x_test, test_labels), batch_size=batch_size)

    model = NeuralNetwork(softmax=variant == "softmax_in_model")
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if variant == "optimizer_of_first_model":
        model = NeuralNetwork()  # the model cell run again; the optimizer still holds the first model's

    splits = (x_train, train_labels, x_test, test_labels)
    first_batch = next(iter(train_dataloader))
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_fn)

    train_losses = []
    for t in range(epochs):
        train_losses.append(train_epoch(train_dataloader, model, mon.loss_fn, optimizer, mon))
        test_loss, accuracy = test(test_dataloader, model, loss_fn)
        mon.log(test_loss, split="val", accuracy=accuracy)

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer, data=splits)
    return {"final_train_loss": train_losses[-1], "test_loss": test_loss, "test_accuracy": accuracy}

"""Port of the PyTorch 60-minute blitz "Training a Classifier": a small CNN on CIFAR-10.

Source: github.com/pytorch/tutorials, ``beginner_source/blitz/cifar10_tutorial.py`` at
commit c53e7d4efc0e39e455c531d21ec7db28ba220214 (BSD-3-Clause, Copyright (c) 2017-2022
PyTorch contributors). Written anew from the facts of that file; no code copied.

Kept: the images through ``ToTensor`` + ``Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))``
(pixels in [-1, 1]); ``batch_size = 4``, a shuffled train loader and an unshuffled test
loader; ``Net``: ``Conv2d(3, 6, 5)``, ``MaxPool2d(2, 2)``, ``Conv2d(6, 16, 5)``, the same
pool, ``torch.flatten(x, 1)``, ``Linear(16 * 5 * 5, 120)``, ``Linear(120, 84)``,
``Linear(84, 10)``, ``F.relu`` after each convolution and the two hidden ``Linear``s, the
class scores returned raw; ``criterion = nn.CrossEntropyLoss()``; ``optim.SGD(lr=0.001,
momentum=0.9)``; the loop ``optimizer.zero_grad()``, forward, ``loss.backward()``,
``optimizer.step()``, ``running_loss += loss.item()`` printed and reset every so many
mini-batches; the test pass under ``torch.no_grad()`` taking ``torch.max(outputs.data, 1)``
as the prediction. (The tutorial never calls ``net.train()``/``net.eval()``; neither does
the port: the net has no dropout or batch norm.)
Shrunk: scikit-learn's 8x8 digits instead of CIFAR-10, 1,437 training and 360 test images
instead of 50,000 / 10,000, each upscaled (bilinear) to 32x32 and repeated over 3 channels
so ``Net``'s shapes are the tutorial's; 4 epochs (1,440 steps) instead of 2 (25,000 steps);
running loss printed (here: kept) every 100 mini-batches instead of 2,000.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the data splits, ``nndx.Monitor`` around the loop with ``criterion`` called as
``mon.loss_fn``, each mini-batch's loss logged; the tutorial has no validation loss
during training, so none is logged; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cifar10_tutorial"
SOURCE = Source("pytorch/tutorials", "beginner_source/blitz/cifar10_tutorial.py",
                "c53e7d4efc0e39e455c531d21ec7db28ba220214", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published"),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: each step applies (with momentum 0.9) the sum of "
            "every gradient so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/IBM/aihwkit/issues/446", "https://github.com/IKMLab/course_material/issues/3",
             "https://github.com/Project-MONAI/research-contributions/issues/392"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.09/0.08/0.11 "
                    "(running loss 22-28) against 0.96/0.95/0.95 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "relu_on_logits",
            "x = F.relu(self.fc3(x)): the last Linear followed by a ReLU like the two before it, so the class "
            "scores fed to CrossEntropyLoss cannot go below 0",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/pytorch/glow/pull/927", "https://github.com/pytorch/examples/pull/117",
             "https://github.com/martinwicke/tf-dev-summit-tensorboard-tutorial/issues/3"),
            Measure("test_loss", "test cross-entropy 1.3x the healthy run's or more: 0.42/1.33/0.48 against "
                    "0.14/0.14/0.16 healthy on seeds 0-2 (accuracy 0.84/0.58/0.86 against 0.96/0.95/0.95)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

SIDE = 32  # CIFAR-10's size
batch_size = 4
epochs = 4


class Net(nn.Module):
    def __init__(self, relu_on_logits: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.relu_on_logits = relu_on_logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return F.relu(x) if self.relu_on_logits else x


def images(raw: torch.Tensor) -> torch.Tensor:
    """The digits as CIFAR-10 images through the tutorial's transform: upscaled to 32x32,
    3 channels, ``ToTensor`` then ``Normalize((0.5,) * 3, (0.5,) * 3)``."""
    x = data.upscaled(raw, SIDE)
    return (x.repeat(1, 3, 1, 1) - 0.5) / 0.5


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    x_train, x_test = images(train_images), images(test_images)
    trainloader = DataLoader(TensorDataset(x_train, train_labels), batch_size=batch_size, shuffle=True,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
    testloader = DataLoader(TensorDataset(x_test, test_labels), batch_size=batch_size, shuffle=False)

    net = Net(relu_on_logits=variant == "relu_on_logits")
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=0.001, momentum=0.9)

    splits = (x_train, train_labels, x_test, test_labels)
    first_batch = next(iter(DataLoader(TensorDataset(x_train, train_labels), batch_size=batch_size)))
    nx.preflight(net, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(net, optimizer, every=10, loss_fn=criterion)

    printed: list[float] = []
    for epoch in range(epochs):
        running_loss = 0.0
        for i, (inputs, labels) in enumerate(trainloader, 0):
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            outputs = net(inputs)
            loss = mon.loss_fn(outputs, labels)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            running_loss += loss.item()
            if i % 100 == 99:
                printed.append(running_loss / 100)  # the tutorial's print
                running_loss = 0.0

    nx.finish(mon, net, first_batch, criterion, optimizer=optimizer, data=splits)
    # the tutorial's test pass, plus (measure only) the test cross-entropy
    correct, total, test_loss = 0, 0, 0.0
    with torch.no_grad():
        for images_, labels in testloader:
            outputs = net(images_)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
            test_loss += F.cross_entropy(outputs, labels, reduction="sum").item()
    return {"last_running_loss": printed[-1], "test_loss": test_loss / total, "test_accuracy": correct / total}

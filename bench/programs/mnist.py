"""Port of the PyTorch MNIST example (a small CNN).

Source: github.com/pytorch/examples, ``mnist/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: two 3x3 convolutions with ``F.relu``, ``F.max_pool2d(2)``, ``Dropout(0.25)``,
flatten, a hidden ``Linear`` with ``F.relu`` and ``Dropout(0.5)``, ``F.log_softmax`` on
the output, ``F.nll_loss``; Adadelta(lr=1.0); ``StepLR(step_size=1, gamma=0.7)`` stepped
once per epoch; ``model.train()`` / ``model.eval()`` + ``torch.no_grad()`` in ``test``;
inputs through ``ToTensor`` + ``Normalize(mean, std)``.
Shrunk: 8x8 digits (scikit-learn) instead of 28x28 MNIST, 16/32 channels instead of
32/64 (kept wider than the 10 classes, as in the original), a 32-unit hidden layer
instead of 128, 6 epochs of 2x1,437 images instead of 14 of 60,000.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch, the loop
under ``nndx.Monitor`` with the example's loss called through ``mon.loss_fn`` (the
README's style), the test loss logged as ``split="val"``, then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mnist"
SOURCE = Source("pytorch/examples", "mnist/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "raw_pixels",
            "images built with torch.tensor(uint8 array).float(): 0-255 pixels, no ToTensor scaling, no Normalize",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/rasbt/python-machine-learning-book-2nd-edition/issues/68",
             "https://github.com/udacity/sdc-issue-reports/issues/834"),
            Measure("first_epoch_loss", "mean train loss of the first epoch, 1.3x the healthy run's or more "
                    "(1.4-1.7x on seeds 0-2: Adadelta's per-parameter steps absorb much of the 255x input scale, "
                    "so the damage is a slow start, not divergence)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "scheduler_per_batch",
            "scheduler.step() inside the batch loop: StepLR(step_size=1, gamma=0.7) decays the LR every batch",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/pytorch/vision/issues/1261", "https://github.com/pytorch/tutorials/pull/640"),
            Measure("final_lr", "LR at the end, under 1e-3 of the healthy run's",
                    lambda healthy, buggy: buggy < 1e-3 * healthy),
        ),
        Variant(
            "softmax_into_nll",
            "F.softmax instead of F.log_softmax before F.nll_loss (NLL fed probabilities)",
            (C.WRONG_LOSS,),
            ("https://github.com/AshwinRJ/Federated-Learning-PyTorch/issues/30",
             "https://github.com/midas-research/man-sf-emnlp/issues/2"),
            Measure("test_accuracy", "test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}


class Net(nn.Module):
    def __init__(self, output_activation: str = "log_softmax") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(32 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 10)
        self.output_activation = output_activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        if self.output_activation == "softmax":
            return F.softmax(x, dim=1)
        return F.log_softmax(x, dim=1)


def loaders(variant: str, seed: int, batch_size: int = 64, passes: int = 2):
    """The example's DataLoaders, as tensors: ToTensor + Normalize((mean,), (std,)).
    One "epoch" is ``passes`` shuffled passes over the digits: an MNIST epoch is 40x
    larger, and the per-epoch schedule needs a few hundred steps to act on."""
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    if variant == "raw_pixels":
        train_x, test_x = train_images.unsqueeze(1).float(), test_images.unsqueeze(1).float()
    else:
        train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)
        mean, std = train_x.mean().item(), train_x.std().item()  # MNIST's (0.1307,), (0.3081,)
        train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    generator = torch.Generator().manual_seed(seed)

    def train_batches():
        for _ in range(passes):
            order = torch.randperm(len(train_labels), generator=generator)
            for i in range(0, len(order), batch_size):
                idx = order[i : i + batch_size]
                yield train_x[idx], train_labels[idx]

    return train_batches, (train_x, train_labels, test_x, test_labels)


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = 6) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    train_batches, (train_x, train_y, test_x, test_y) = loaders(variant, seed)
    model = Net("softmax" if variant == "softmax_into_nll" else "log_softmax")
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    first_batch = next(train_batches())
    nx.preflight(model, first_batch, F.nll_loss, optimizer=optimizer, data=(train_x, train_y, test_x, test_y))
    mon = nx.monitor(model, optimizer, every=10, loss_fn=F.nll_loss)

    epoch_losses: list[float] = []
    accuracy = 0.0
    for epoch in range(1, epochs + 1):
        model.train()
        losses = []
        for x, target in train_batches():
            optimizer.zero_grad()
            output = model(x)
            loss = mon.loss_fn(output, target)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
            if variant == "scheduler_per_batch":
                scheduler.step()
        epoch_losses.append(sum(losses) / len(losses))
        test_loss, accuracy = test(model, test_x, test_y)
        mon.log(test_loss, split="val", accuracy=accuracy)
        if variant != "scheduler_per_batch":
            scheduler.step()

    nx.finish(mon, model, first_batch, F.nll_loss, optimizer=optimizer, data=(train_x, train_y, test_x, test_y))
    return {
        "first_epoch_loss": epoch_losses[0],
        "final_train_loss": epoch_losses[-1],
        "test_loss": test_loss,
        "test_accuracy": accuracy,
        "final_lr": optimizer.param_groups[0]["lr"],
    }


def test(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
    model.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            output = model(x[i : i + batch_size])
            total += F.nll_loss(output, y[i : i + batch_size], reduction="sum").item()
            correct += output.argmax(dim=1).eq(y[i : i + batch_size]).sum().item()
    return total / len(y), correct / len(y)

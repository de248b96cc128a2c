"""Port of the PyTorch MNIST-with-an-LSTM example (image rows as a sequence).

Source: github.com/pytorch/examples, ``mnist_rnn/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``input.reshape(-1, rows, cols)`` into ``nn.LSTM(batch_first=True)``, the last
time step's output, ``BatchNorm1d``, ``Dropout2d(0.25)`` and ``Dropout2d(0.5)`` applied
to 2-D (batch, features) tensors exactly as the original does (torch treats such input
as one unbatched (channels, length) sample, so whole rows of the batch are dropped), a
hidden ``Linear`` with ``F.relu``, ``F.log_softmax``, ``F.nll_loss``; Adadelta;
``StepLR(step_size=1, gamma=0.7)`` per epoch; ``test`` under ``model.eval()`` and
``torch.no_grad()``; ``ToTensor`` + ``Normalize``.
Shrunk: 8x8 digits (8 rows of 8 pixels) instead of 28x28, hidden size 32 instead of 64,
a 16-unit hidden layer instead of 32, 8 epochs of 2x1,437 images instead of 14 of
60,000, and Adadelta's lr 1.0 (the sibling mnist example's) instead of 0.1, which needs
the original's ~13,000 steps (here ~370; at 0.1 the healthy run stays near 50% accuracy).

nndx, as the author would add it: a preflight ``nndx.probe``, ``nndx.Monitor`` around the
loop with the example's own ``F.nll_loss`` call, the test loss logged as ``split="val"``,
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.mnist import loaders
from nndx.report import CauseCode as C

NAME = "mnist_rnn"
SOURCE = Source("pytorch/examples", "mnist_rnn/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "batch_first_missing",
            "nn.LSTM(input_size, hidden_size) without batch_first=True, fed (batch, rows, cols): it runs along the batch",
            (C.WRONG_RESHAPE,),
            ("https://github.com/pytorch/pytorch/issues/1538", "https://github.com/salesforce/cove/issues/10"),
            Measure("test_accuracy", "test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "eval_mode_forgotten",
            "test() without model.eval(): BatchNorm uses batch statistics and Dropout2d stays on while testing",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/issues/3",
             "https://github.com/nshaud/DeepHyperX/issues/51"),
            Measure("test_loss_error",
                    "relative error of the reported test loss against eval mode, over 0.05 and 5x the healthy run's",
                    lambda healthy, buggy: buggy > max(0.05, 5 * healthy)),
        ),
    )
}

ROWS = COLS = 8


class Net(nn.Module):
    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size=COLS, hidden_size=32, batch_first=batch_first)
        self.batchnorm = nn.BatchNorm1d(32)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(32, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        input = input.reshape(-1, ROWS, COLS)
        output, _hidden = self.rnn(input)
        output = output[:, -1, :]
        output = self.batchnorm(output)
        output = self.dropout1(output)
        output = F.relu(self.fc1(output))
        output = self.dropout2(output)
        output = self.fc2(output)
        return F.log_softmax(output, dim=1)


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = 8) -> dict[str, float]:
    warnings.filterwarnings("ignore", message=".*dropout2d.*")  # the original's 2-D input to Dropout2d
    torch.manual_seed(1 + seed)
    train_batches, (train_x, train_y, test_x, test_y) = loaders("healthy", seed)
    model = Net(batch_first=variant != "batch_first_missing")
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    first_batch = next(train_batches())
    nx.preflight(model, first_batch, F.nll_loss, optimizer=optimizer, data=(train_x, train_y, test_x, test_y))
    mon = nx.monitor(model, optimizer, every=10)

    for epoch in range(1, epochs + 1):
        model.train()
        for x, target in train_batches():
            optimizer.zero_grad()
            output = model(x)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            mon.log(loss)
        test_loss, accuracy = test(model, test_x, test_y, eval_mode=variant != "eval_mode_forgotten")
        mon.log(test_loss, split="val", accuracy=accuracy)
        scheduler.step()

    nx.finish(mon, model, first_batch, F.nll_loss, optimizer=optimizer, data=(train_x, train_y, test_x, test_y))
    # the measure, outside the program: what test() reported against the model in eval mode
    true_loss, _ = test(model, test_x, test_y, eval_mode=True)
    return {"test_loss": test_loss, "test_accuracy": accuracy, "test_loss_error": abs(test_loss - true_loss) / true_loss}


def test(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eval_mode: bool = True,
         batch_size: int = 1000) -> tuple[float, float]:  # fmt: skip
    if eval_mode:
        model.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            output = model(x[i : i + batch_size])
            total += F.nll_loss(output, y[i : i + batch_size], reduction="sum").item()
            correct += output.argmax(dim=1).eq(y[i : i + batch_size]).sum().item()
    return total / len(y), correct / len(y)


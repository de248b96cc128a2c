"""Port of yunjey/pytorch-tutorial's "Recurrent Neural Network" (02-intermediate): a two-layer
LSTM reads an image row by row (many-to-one) and a Linear layer classifies its last hidden
state.

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/02-intermediate/recurrent_neural_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 Yunjey Choi). Written anew
from the facts of that file; no code copied.

Kept: ``RNN``: ``nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)``, zero
``h0``/``c0`` of shape ``(num_layers, x.size(0), hidden_size)`` built in ``forward``, ``out, _ =
self.lstm(x, (h0, c0))``, ``self.fc(out[:, -1, :])``; ``sequence_length = input_size = 28``,
``num_layers = 2``, ``num_classes = 10``, ``batch_size = 100``, ``learning_rate = 0.01``;
``nn.CrossEntropyLoss``; ``torch.optim.Adam``; ``ToTensor`` images (pixels in [0, 1]) in a
shuffling train loader and a non-shuffling test loader; per batch
``images.reshape(-1, sequence_length, input_size)``, forward, loss, ``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``, the loss printed every 100th step; the test loop
(``model.eval()``, ``torch.no_grad()``, ``torch.max(outputs.data, 1)``, accuracy in percent).
Shrunk / replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 instead of MNIST:
1,437 train / 360 test images instead of 60,000 / 10,000 (15 batches an epoch instead of
600); ``hidden_size = 32`` instead of 128; 8 epochs instead of 2 (120 Adam steps against
1,200); the loss printed every 5th step; no checkpoint saved; CPU.
Measure only (not in the program): the test cross-entropy over the test set after training.

nndx, as the author would add it: a preflight ``nndx.probe(model, first_batch, criterion,
optimizer=optimizer, data=...)`` on the first reshaped training batch;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, each step's loss logged where
the program prints it (every step here, the Monitor subsamples); after training
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_rnn"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/02-intermediate/recurrent_neural_network/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 28x28 digits, hidden 32, 8 epochs of 15 batches)"),
        Variant(
            "no_batch_first",
            "nn.LSTM built without batch_first=True (and h0/c0 sized from x.size(1), the batch dimension of the "
            "default (seq, batch, feature) layout) while the images are still fed as (batch, 28, 28): the LSTM "
            "runs over the 100 images of the batch as time steps (28 chains, one per image row) and "
            "out[:, -1, :] reads, for each image, the chain that runs over every image's last row",
            (C.WRONG_RESHAPE,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/196",
             "https://github.com/pytorch/pytorch/issues/1538",
             "https://github.com/salesforce/cove/issues/10"),
            Measure("test_acc", "test accuracy at least 20 points below the healthy run's: 50.6 against 85.0 "
                    "healthy on seed 0", lambda healthy, buggy: buggy < healthy - 20.0),
        ),
        Variant(
            "missing_zero_grad",
            "optimizer.zero_grad() left out of the batch loop: each backward adds to the gradients of every step "
            "before, so Adam steps along the running sum of all past gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/fchollet/deep-learning-with-python-notebooks/issues/293",
             "https://github.com/pytorch/tutorials/issues/156"),
            Measure("test_acc", "test accuracy at least 20 points below the healthy run's: 13.9 against 85.0 "
                    "healthy on seed 0", lambda healthy, buggy: buggy < healthy - 20.0),
        ),
    )
}

sequence_length = 28
input_size = 28
hidden_size = 32
num_layers = 2
num_classes = 10
batch_size = 100
num_epochs = 8
learning_rate = 0.01
PRINT_EVERY = 5


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, num_classes, batch_first=True):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=batch_first)
        self.fc = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        n = x.size(0) if self.batch_first else x.size(1)
        h0 = torch.zeros(self.num_layers, n, self.hidden_size)
        c0 = torch.zeros(self.num_layers, n, self.hidden_size)
        out, _ = self.lstm(x, (h0, c0))
        out = self.fc(out[:, -1, :])
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, 28), digits.upscaled(te_raw, 28)  # ToTensor, MNIST's 28x28
    train_loader = DataLoader(TensorDataset(x_train, tr_y), batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, te_y), batch_size=batch_size, shuffle=False)

    model = RNN(input_size, hidden_size, num_layers, num_classes, batch_first=variant != "no_batch_first")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        images, labels = next(iter(train_loader))
    first_batch = (images.reshape(-1, sequence_length, input_size), labels)
    splits = (x_train.reshape(-1, sequence_length, input_size), tr_y,
              x_test.reshape(-1, sequence_length, input_size), te_y)  # fmt: skip
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    total_step = len(train_loader)
    printed = []
    for epoch in range(num_epochs):
        for i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, sequence_length, input_size)
            outputs = model(images)
            loss = criterion(outputs, labels)
            if variant != "missing_zero_grad":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            if (i + 1) % PRINT_EVERY == 0:
                printed.append((epoch + 1, i + 1, total_step, loss.item()))

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)

    model.eval()
    test_loss, correct, total = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in test_loader:
            images = images.reshape(-1, sequence_length, input_size)
            outputs = model(images)
            test_loss += nn.functional.cross_entropy(outputs, labels, reduction="sum").item()
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    return {"test_acc": 100 * correct / total, "test_loss": test_loss / total, "last_train_loss": printed[-1][3]}

"""Port of patrickloeber/pytorch-examples ``rnn-lstm-gru/main.py``: an image classifier that reads
each image as a sequence of its rows through a 2-layer ``nn.RNN`` (``batch_first=True``) and
classifies from the last time step's output with a linear layer, trained with Adam.

Source: github.com/patrickloeber/pytorch-examples, ``rnn-lstm-gru/main.py`` at commit
500afab9676b676d8a975ca797f93d1137ca5e0c (no licence file in the repository; written anew from
the facts of the file, no code copied).

Kept: the ``RNN`` module (``nn.RNN(input_size, hidden_size, num_layers, batch_first=True)``, a
zero ``h0`` of shape ``(num_layers, x.size(0), hidden_size)`` built in every ``forward``,
``out[:, -1, :]`` -> ``fc``); ``nn.CrossEntropyLoss``; ``torch.optim.Adam(lr=0.001)``; images
through ``ToTensor`` (pixels in [0, 1], no Normalize), a shuffling train loader of batch 100 and
an unshuffled test loader; the loop (``images.reshape(-1, sequence_length, input_size)``,
forward, loss, ``zero_grad``, ``backward``, ``step``, a print every 100 steps); the test under
``torch.no_grad()`` with ``torch.max(outputs.data, 1)`` and accuracy in percent.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of MNIST, so
``sequence_length = input_size = 8`` instead of 28; ``hidden_size`` 64 instead of 128;
12 epochs instead of 2 (the digits set has 1/40 of MNIST's images); CPU.
Measure only (not in the program): the test accuracy and the summed-then-averaged test
cross-entropy.

nndx, as the author would add it after reading the README: a preflight ``nndx.probe(model,
(images, labels), criterion, optimizer=optimizer, data=...)`` on the first training batch
(reshaped as the loop reshapes it) with the train/test tensors as ``data``;
``nndx.Monitor(model, optimizer, every=10)`` around the epochs, every step's loss logged where
the script prints; after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "loeber_rnn"
SOURCE = Source("patrickloeber/pytorch-examples", "rnn-lstm-gru/main.py",
                "500afab9676b676d8a975ca797f93d1137ca5e0c", "no licence stated")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits read as 8 rows of 8 pixels, hidden 64)"),
        Variant(
            "batch_first_dropped_reshaped",
            "batch_first=True dropped from nn.RNN and the dimensions 'changed respectively' with a reshape: "
            "images.reshape(sequence_length, -1, input_size) instead of a transpose, h0 sized x.size(1), "
            "out[-1, :, :] as the last step: every sequence is stitched from rows of different images",
            (C.WRONG_RESHAPE,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/89",
             "https://github.com/yunjey/pytorch-tutorial/issues/196",
             "https://github.com/pytorch/pytorch/issues/1538"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "lr_0_1",
            "learning_rate = 0.1 instead of 0.001 for Adam on the vanilla tanh RNN (a hyper-parameter typo)",
            (C.LR_TOO_HIGH,),
            ("https://arxiv.org/abs/1211.5063",
             "https://karpathy.github.io/2019/04/25/recipe/"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

num_classes = 10
num_epochs = 12
batch_size = 100
learning_rate = 0.001
input_size = 8
sequence_length = 8
hidden_size = 64
num_layers = 2


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    bf_bug = variant == "batch_first_dropped_reshaped"
    lr = 0.1 if variant == "lr_0_1" else learning_rate

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)  # transforms.ToTensor()
    train_loader = DataLoader(TensorDataset(x_train, tr_y), batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, te_y), batch_size=batch_size, shuffle=False)

    class RNN(nn.Module):
        def __init__(self, input_size, hidden_size, num_layers, num_classes):
            super().__init__()
            self.num_layers = num_layers
            self.hidden_size = hidden_size
            self.rnn = nn.RNN(input_size, hidden_size, num_layers, batch_first=not bf_bug)
            self.fc = nn.Linear(hidden_size, num_classes)

        def forward(self, x):
            if bf_bug:  # x: (seq, n, input) as the bug's author believes
                h0 = torch.zeros(self.num_layers, x.size(1), self.hidden_size)
                out, _ = self.rnn(x, h0)
                out = out[-1, :, :]
            else:
                h0 = torch.zeros(self.num_layers, x.size(0), self.hidden_size)
                out, _ = self.rnn(x, h0)
                out = out[:, -1, :]
            out = self.fc(out)
            return out

    def as_sequence(images):
        if bf_bug:
            return images.reshape(sequence_length, -1, input_size)
        return images.reshape(-1, sequence_length, input_size)

    model = RNN(input_size, hidden_size, num_layers, num_classes)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        images0, labels0 = next(iter(train_loader))
    probe_batch = (as_sequence(images0), labels0)
    splits = (x_train, tr_y, x_test, te_y)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    n_total_steps = len(train_loader)
    first_epoch_loss, last_epoch_loss = 0.0, 0.0
    for epoch in range(num_epochs):
        running = 0.0
        for i, (images, labels) in enumerate(train_loader):
            images = as_sequence(images)
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            running += loss.item()
            if (i + 1) % 100 == 0:
                print(f"Epoch [{epoch + 1}/{num_epochs}], Step [{i + 1}/{n_total_steps}], Loss: {loss.item():.4f}")
        if epoch == 0:
            first_epoch_loss = running / n_total_steps
        last_epoch_loss = running / n_total_steps

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    with torch.no_grad():
        n_correct, n_samples, test_loss = 0, 0, 0.0
        for images, labels in test_loader:
            images = as_sequence(images)
            outputs = model(images)
            test_loss += nn.functional.cross_entropy(outputs, labels, reduction="sum").item()
            _, predicted = torch.max(outputs.data, 1)
            n_samples += labels.size(0)
            n_correct += (predicted == labels).sum().item()
        acc = 100.0 * n_correct / n_samples
    return {"test_acc": acc, "test_loss": test_loss / n_samples, "first_epoch_loss": first_epoch_loss,
            "last_epoch_loss": last_epoch_loss}  # fmt: skip

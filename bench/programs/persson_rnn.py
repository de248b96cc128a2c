"""Port of Aladdin Persson's RNN/GRU/LSTM example: a many-to-one LSTM that reads each image row
as one time step (``batch_first=True``), a linear layer over the hidden states of *all* time
steps, Adam and cross-entropy, then ``check_accuracy`` with ``model.eval()``.

Source: github.com/aladdinpersson/Machine-Learning-Collection,
``ML/Pytorch/Basics/pytorch_rnn_gru_lstm.py`` at commit e6c7f42c46a6414f12b2d8820e00e4474be7bbd8
(MIT, Copyright (c) 2020 Aladdin Persson). Written anew from the facts of that file; no code
copied.

Kept: ``RNN_LSTM`` (the class the script instantiates): ``nn.LSTM(input_size, hidden_size,
num_layers, batch_first=True)`` called with explicit zero states ``h0``/``c0`` of shape
``(num_layers, x.size(0), hidden_size)``, the output ``(batch, seq, hidden)`` reshaped to
``(batch, seq * hidden)`` and ``nn.Linear(hidden_size * sequence_length, num_classes)``; the
images through ``transforms.ToTensor`` (pixels / 255), a ``DataLoader`` with ``shuffle=True``
for train and test alike, each batch ``.squeeze(1)`` into ``(batch, rows, columns)``;
``nn.CrossEntropyLoss``; ``optim.Adam(model.parameters(), lr=0.005)``; the loop's order
(forward, loss, ``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``), no
validation during training; ``check_accuracy`` (``model.eval()``, ``no_grad``, ``scores.max(1)``,
correct / samples, ``model.train()`` after) on the train and the test loader;
``num_layers`` 2, ``batch_size`` 64, ``learning_rate`` 0.005.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test; 8 time steps of 8 features) in place
of MNIST (28 of 28); ``hidden_size`` 64 instead of 256; 8 epochs instead of 3 (the digits are 40x
fewer than MNIST's images: 184 steps instead of 2,814); CPU; no tqdm. The script's unused
``RNN`` and ``RNN_GRU`` classes are left out.
Measure only (not in the program): nothing; the variants are measured by ``check_accuracy`` on
the test and train loaders (in percent) and the last epoch's mean training loss.

nndx, as the author would add it after reading the README: a preflight ``nndx.probe`` on the
first training batch with the ``CrossEntropyLoss``, the optimizer and the train/test tensors as
``data``; ``nndx.Monitor(model, optimizer, every=10)`` around the training loop, each batch's
loss logged after ``optimizer.step()``; after training ``nndx.probe(..., monitor=mon)`` on the
same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_rnn"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/Basics/pytorch_rnn_gru_lstm.py",
                "e6c7f42c46a6414f12b2d8820e00e4474be7bbd8", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 8x8 digits as 8 steps of 8 features, hidden 64, 8 epochs)"),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop (it sits between the loss and backward in the script, and "
            "goes when the loop is rearranged): every backward adds to the gradients of all earlier batches, so Adam "
            "steps along the running sum of the epoch's gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20",
             "https://github.com/wenet-e2e/wekws/issues/72",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_acc", "test accuracy at least 15 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
        Variant(
            "optimizer_on_stale_model",
            "the network is re-created after the optimizer was built (the script invites swapping RNN / GRU / LSTM "
            "in the 'Initialize network' line; re-running it, the optimizer line not re-run): Adam holds the first "
            "instance's parameters, the model that is trained and evaluated gets gradients that no optimizer applies",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/pytorch/pytorch/issues/14467",
             "https://github.com/microsoft/nni/issues/4521",
             "https://github.com/tensorflow/tfjs-core/issues/502"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

input_size = 8
hidden_size = 64
num_layers = 2
num_classes = 10
sequence_length = 8
learning_rate = 0.005
batch_size = 64
num_epochs = 8


# Recurrent neural network with LSTM (many-to-one)
class RNN_LSTM(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int, num_classes: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size * sequence_length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Set initial hidden and cell states
        h0 = torch.zeros(self.num_layers, x.size(0), self.hidden_size)
        c0 = torch.zeros(self.num_layers, x.size(0), self.hidden_size)
        out, _ = self.lstm(x, (h0, c0))  # out: (batch_size, seq_length, hidden_size)
        out = out.reshape(out.shape[0], -1)
        return self.fc(out)


def check_accuracy(loader: DataLoader, model: nn.Module) -> float:
    num_correct = 0
    num_samples = 0
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            x = x.squeeze(1)
            scores = model(x)
            _, predictions = scores.max(1)
            num_correct += (predictions == y).sum()
            num_samples += predictions.size(0)
    model.train()
    return float(num_correct) / float(num_samples)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)  # transforms.ToTensor(): 0..1
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=batch_size, shuffle=True)

    model = RNN_LSTM(input_size, hidden_size, num_layers, num_classes)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=learning_rate)
    if variant == "optimizer_on_stale_model":  # the network cell re-run after the optimizer cell
        model = RNN_LSTM(input_size, hidden_size, num_layers, num_classes)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_x, probe_y = next(iter(train_loader))
    probe_batch = (probe_x.squeeze(1), probe_y)
    splits = (x_train.squeeze(1), tr_y, x_test.squeeze(1), te_y)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_loss = float("nan")
    for _epoch in range(num_epochs):
        losses = []
        for _batch_idx, (data, targets) in enumerate(train_loader):
            data = data.squeeze(1)

            # forward
            scores = model(data)
            loss = criterion(scores, targets)

            # backward
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            loss.backward()

            # gradient descent update step/adam step
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            losses.append(loss.item())
        epoch_loss = sum(losses) / len(losses)

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    return {"test_acc": 100.0 * check_accuracy(test_loader, model),
            "train_acc": 100.0 * check_accuracy(train_loader, model), "last_epoch_loss": epoch_loss}  # fmt: skip

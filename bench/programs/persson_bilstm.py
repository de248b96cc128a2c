"""Port of aladdinpersson/Machine-Learning-Collection's bidirectional LSTM on image rows: each
image's rows are the time steps of a two-layer ``nn.LSTM(batch_first=True,
bidirectional=True)``, the last time step's output (``out[:, -1, :]``, both directions) goes
into a ``Linear(2 * hidden_size, num_classes)``; Adam, cross-entropy, ``check_accuracy``.

Source: github.com/aladdinpersson/Machine-Learning-Collection,
``ML/Pytorch/Basics/pytorch_bidirectional_lstm.py`` at commit
28bd89ea9c07db15ebaa232328a53e03614b1c88 (MIT, Copyright (c) 2020 Aladdin Persson). Written
anew from the facts of that file; no code copied.

Kept: ``BRNN(input_size, hidden_size, num_layers, num_classes)``: ``nn.LSTM(input_size,
hidden_size, num_layers, batch_first=True, bidirectional=True)`` and ``nn.Linear(hidden_size *
2, num_classes)``; forward builds ``h0`` and ``c0`` as zeros of ``(num_layers * 2, x.size(0),
hidden_size)``, runs ``out, _ = self.lstm(x, (h0, c0))`` and returns ``self.fc(out[:, -1,
:])``; two layers; ``nn.CrossEntropyLoss()``; ``optim.Adam(model.parameters(), lr=0.001)``;
batch size 64; images through ``transforms.ToTensor()`` (pixels / 255) and ``.squeeze(1)`` to
``(N, rows, columns)``; train and test loaders with ``shuffle=True``; the loop (forward,
loss, ``optimizer.zero_grad()``, ``backward``, ``step``); ``check_accuracy`` (``model.eval()``,
``no_grad``, ``scores.max(1)``, ``model.train()``) on the train and the test set.
Shrunk / replaced: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of MNIST, so
``input_size`` and ``sequence_length`` are 8 instead of 28; ``hidden_size`` 64 instead of 256;
12 epochs (276 steps) instead of 2 epochs of 938 steps; CPU.
Measure only (not in the program): the mean batch loss of the last epoch.

nndx, as the author would add it (README): a preflight ``nndx.probe`` on the first training
batch with the criterion, the optimizer and the train/test tensors as ``data``;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, each batch's loss logged after
``optimizer.step()``; after the loop ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``, before ``check_accuracy``.
"""

from __future__ import annotations

import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_bilstm"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/Basics/pytorch_bidirectional_lstm.py",
                "28bd89ea9c07db15ebaa232328a53e03614b1c88", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits as 8 steps of 8, hidden 64, 12 epochs)"),
        Variant(
            "adam_lr_0_1",
            "learning_rate = 0.1 instead of 0.001 (an SGD-sized rate given to Adam): the LSTM's steps are 100x "
            "too large, the loss rises above ln(10) in the first epoch and the net settles far from the "
            "healthy accuracy",
            (C.LR_TOO_HIGH,),
            ("https://github.com/rajveermalviya/language-modeling/issues/3",
             "https://github.com/OpenNMT/OpenNMT-py/issues/805"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's: 72.5 against 91.9 healthy on seed 0 "
                    "(first-epoch loss 3.02 against 2.30)",
                    lambda healthy, buggy: not buggy > healthy - 0.10),
        ),
        Variant(
            "final_hidden_view_not_permute",
            "the classifier reads the final hidden states instead of out[:, -1, :] and flattens the last layer's "
            "two directions with hn[-2:].view(x.size(0), -1) instead of permuting them to (batch, 2, hidden): "
            "the view mixes the hidden states of different samples in the batch, so each sample is classified "
            "from other samples' features",
            (C.WRONG_RESHAPE,),
            ("https://medium.com/mcgill-artificial-intelligence-review/"
             "the-dangers-of-reshaping-and-other-fun-mistakes-ive-learnt-from-pytorch-b6a5bdc1c275",
             "https://discuss.pytorch.org/t/for-beginners-do-not-use-view-or-reshape-to-swap-dimensions-of-tensors/75524"),
            Measure("test_acc", "test accuracy at least 20 points below the healthy run's: 10.6 against 91.9 healthy on seed 0 "
                    "(last-epoch loss 2.30, chance)",
                    lambda healthy, buggy: not buggy > healthy - 0.20),
        ),
    )
}

INPUT_SIZE, SEQUENCE_LENGTH, NUM_LAYERS, HIDDEN_SIZE, NUM_CLASSES = 8, 8, 2, 64, 10
LEARNING_RATE, BATCH_SIZE, NUM_EPOCHS = 0.001, 64, 12


class BRNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int, num_classes: int,
                 view_hidden: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(hidden_size * 2, num_classes)
        self.view_hidden = view_hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = torch.zeros(self.num_layers * 2, x.size(0), self.hidden_size)
        c0 = torch.zeros(self.num_layers * 2, x.size(0), self.hidden_size)
        out, (hn, _) = self.lstm(x, (h0, c0))
        if self.view_hidden:
            return self.fc(hn[-2:].view(x.size(0), -1))
        return self.fc(out[:, -1, :])


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
    x_train, x_test = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)  # transforms.ToTensor()
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=BATCH_SIZE, shuffle=True)

    model = BRNN(INPUT_SIZE, HIDDEN_SIZE, NUM_LAYERS, NUM_CLASSES,
                 view_hidden=variant == "final_hidden_view_not_permute")  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    learning_rate = 0.1 if variant == "adam_lr_0_1" else LEARNING_RATE
    optimizer = optim.Adam(model.parameters(), lr=learning_rate)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        images, labels = next(iter(train_loader))
    probe_batch = (images.squeeze(1), labels)
    splits = (x_train.squeeze(1), tr_y, x_test.squeeze(1), te_y)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses: list[float] = []
    for _ in range(NUM_EPOCHS):
        batch_losses = []
        for _batch_idx, (data, targets) in enumerate(train_loader):
            data = data.squeeze(1)
            scores = model(data)
            loss = criterion(scores, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            batch_losses.append(loss.item())
        epoch_losses.append(sum(batch_losses) / len(batch_losses))

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    return {"train_acc": check_accuracy(train_loader, model), "test_acc": check_accuracy(test_loader, model),
            "last_epoch_loss": epoch_losses[-1], "first_epoch_loss": epoch_losses[0]}  # fmt: skip

"""Port of the PyTorch tutorial "Training with PyTorch" (introyt): a LeNet-5 variant classifies
Fashion-MNIST with cross-entropy and SGD + momentum, one epoch at a time, the running loss
reported every N batches, then a validation pass under ``model.eval()`` and
``torch.no_grad()`` and the best model's weights kept.

Source: github.com/pytorch/tutorials, ``beginner_source/introyt/trainingyt.py`` at commit
db77dcf6e3637924f43852c014f2af9978b0f891 (BSD-3-Clause, Copyright (c) 2017-2022 PyTorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``GarmentClassifier`` (``Conv2d(1, 6, 5)``, ``MaxPool2d(2, 2)``, ``Conv2d(6, 16, 5)``,
``Linear(16 * 4 * 4, 120)``, ``Linear(120, 84)``, ``Linear(84, 10)``; ReLU after each conv
and the first two Linear layers; ``x.view(-1, 16 * 4 * 4)``); images through ``ToTensor`` +
``Normalize((0.5,), (0.5,))``; a training ``DataLoader`` of batch 4 with ``shuffle=True`` and a
validation one of batch 4 with ``shuffle=False``; ``torch.nn.CrossEntropyLoss()``;
``torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)``; ``train_one_epoch`` (for each
batch: ``optimizer.zero_grad()``, forward, loss, ``backward``, ``optimizer.step()``,
``running_loss += loss.item()``, and every ``REPORT_EVERY`` batches ``last_loss =
running_loss / REPORT_EVERY`` reported and ``running_loss`` reset; returns ``last_loss``); the
epoch loop (``model.train(True)``, ``train_one_epoch``, ``model.eval()``, the validation
losses summed under ``torch.no_grad()`` and divided by ``i + 1``, the best ``avg_vloss``
tracked and that epoch's ``state_dict`` saved); ``EPOCHS = 5``.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train / 360
validation) instead of Fashion-MNIST (60,000 / 10,000), so an epoch is 360 batches instead of
15,000 and the running loss is reported every 100 batches instead of every 1,000;
``num_workers=0`` instead of 2; the best model's ``state_dict`` kept in memory instead of
written to disk; no TensorBoard writer, no image grid, no dummy-output demonstration; CPU.
Measure only (not in the program): after the last epoch, the model's accuracy and mean
cross-entropy on the validation set (argmax of the outputs), and the best ``avg_vloss``.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the ``CrossEntropyLoss``, the SGD and the train/validation tensors as ``data``; the epoch
loop inside ``nndx.Monitor(model, optimizer, every=10)``, each batch's loss logged in
``train_one_epoch`` next to the running loss, and each epoch's ``avg_vloss`` logged with
``split="val"``; after training ``nndx.probe(..., monitor=mon)`` on the same batch +
``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "introyt_training"
SOURCE = Source("pytorch/tutorials", "beginner_source/introyt/trainingyt.py",
                "db77dcf6e3637924f43852c014f2af9978b0f891", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 28x28 digits, 5 epochs of 360 batches of 4)"),
        Variant(
            "zero_grad_once_per_epoch",
            "optimizer.zero_grad() is called once at the top of train_one_epoch instead of for every batch: "
            "each step applies the sum of every gradient since the epoch began",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("val_acc", "validation accuracy after the last epoch at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "GarmentClassifier.forward returns F.softmax(self.fc3(x), dim=1) and the tutorial's CrossEntropyLoss "
            "applies log-softmax again: the gradients reaching the network shrink and it learns far more slowly",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/NaJaeMin92/pytorch-DANN/issues/7",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32",
             "https://github.com/doronharitan/human_activity_recognition_LRCN/issues/4"),
            Measure("val_acc", "validation accuracy after the last epoch at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
    )
}

SIDE = 28
EPOCHS = 5
BATCH_SIZE = 4
REPORT_EVERY = 100  # the tutorial's 1000, for an epoch of 360 batches instead of 15,000


class GarmentClassifier(nn.Module):
    def __init__(self, softmax_output: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.softmax_output = softmax_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        if self.softmax_output:
            x = F.softmax(x, dim=1)
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    zero_grad_per_epoch = variant == "zero_grad_once_per_epoch"

    # ToTensor + Normalize((0.5,), (0.5,)) on the stand-in images
    tr_raw, tr_y, va_raw, va_y = digits.digit_images(seed=seed)
    x_train = (digits.upscaled(tr_raw, SIDE) - 0.5) / 0.5
    x_val = (digits.upscaled(va_raw, SIDE) - 0.5) / 0.5
    training_set, validation_set = TensorDataset(x_train, tr_y), TensorDataset(x_val, va_y)
    training_loader = DataLoader(training_set, batch_size=BATCH_SIZE, shuffle=True, num_workers=0)
    validation_loader = DataLoader(validation_set, batch_size=BATCH_SIZE, shuffle=False, num_workers=0)

    model = GarmentClassifier(softmax_output=variant == "softmax_before_cross_entropy")
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_batch = next(iter(training_loader))
    splits = (x_train, tr_y, x_val, va_y)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    def train_one_epoch(epoch_index: int) -> float:
        running_loss = 0.0
        last_loss = 0.0
        if zero_grad_per_epoch:
            optimizer.zero_grad()
        for i, data in enumerate(training_loader):
            inputs, labels = data
            if not zero_grad_per_epoch:
                optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            nx.timed(lambda: mon.log(loss))
            if i % REPORT_EVERY == REPORT_EVERY - 1:
                last_loss = running_loss / REPORT_EVERY  # loss per batch
                running_loss = 0.0
        return last_loss

    epoch_number = 0
    best_vloss = 1_000_000.0
    best_state = None
    avg_loss = avg_vloss = float("nan")
    for _ in range(EPOCHS):
        model.train(True)
        avg_loss = train_one_epoch(epoch_number)

        running_vloss = 0.0
        model.eval()
        with torch.no_grad():
            for i, vdata in enumerate(validation_loader):
                vinputs, vlabels = vdata
                voutputs = model(vinputs)
                vloss = loss_fn(voutputs, vlabels)
                running_vloss += vloss
        avg_vloss = running_vloss / (i + 1)
        nx.timed(lambda: mon.log(avg_vloss, split="val"))

        if avg_vloss < best_vloss:
            best_vloss = avg_vloss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), model_path)
        epoch_number += 1

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer, data=splits)

    # measure only: the last epoch's model on the validation set
    model.eval()
    with torch.no_grad():
        out = model(x_val)
        logits = torch.log(out.clamp_min(1e-12)) if model.softmax_output else out
        val_ce = float(F.cross_entropy(logits, va_y))
        val_acc = 100.0 * float((out.argmax(1) == va_y).float().mean())
    del best_state
    return {"val_acc": val_acc, "val_ce": val_ce, "best_vloss": float(best_vloss), "last_avg_vloss": float(avg_vloss),
            "last_train_loss": float(avg_loss)}  # fmt: skip

"""Port of aladdinpersson/Machine-Learning-Collection, ``ML/Pytorch/Basics/pytorch_lr_ratescheduler.py``:
a very small feed-forward net on MNIST trained with Adam at lr 0.1 and a ``ReduceLROnPlateau``
scheduler stepped once an epoch on the epoch's mean training loss.

Source: github.com/aladdinpersson/Machine-Learning-Collection at commit
066299e9a8645836662ec43f785358ca195d65ad, ``ML/Pytorch/Basics/pytorch_lr_ratescheduler.py``
(MIT, Copyright (c) 2020 Aladdin Persson). Written anew from the facts of that file; no code copied.

Kept: the model ``nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))``;
``nn.CrossEntropyLoss()``; ``optim.Adam(model.parameters(), lr=0.1)``;
``ReduceLROnPlateau(optimizer, factor=0.1, patience=5)``; a shuffling ``DataLoader`` of batch
128 over ``ToTensor`` images; ``for epoch in range(1, num_epochs)`` with ``num_epochs = 100``
(99 epochs); per batch: ``data.reshape(data.shape[0], -1)``, forward, loss,
``losses.append(loss.item())``, ``loss.backward()``, ``optimizer.step()``,
``optimizer.zero_grad()`` (in that order: the zeroing after the step); the author's
commented-out ``# scheduler.step(loss)`` inside the batch loop; after each epoch
``mean_loss = sum(losses)/len(losses)`` and ``scheduler.step(mean_loss)``; ``check_accuracy``
(``model.eval()``, ``no_grad``, ``scores.max(1)``, ``model.train()`` after) on the train loader.
Shrunk / replaced: MNIST (downloaded by torchvision) is replaced by scikit-learn's 8x8 digits
upsampled (bilinear) to 20x20 and centred on a 28x28 zero canvas (MNIST's own layout: digits
size-normalised to a 20x20 box; mean pixel 0.156 against MNIST's 0.131), in [0, 1]
(``ToTensor``'s range), 1,437 training images (12 batches an epoch instead of 469), so the
784-input layer is kept; ``verbose=True`` dropped from the scheduler (torch 2.13 removed
the argument; it only printed); no per-epoch print; CPU. ``check_accuracy`` flattens its
batch as the training loop does (the original passes the unflattened ``(N, 1, 28, 28)``
batch to ``Linear(784, 50)``, which raises).
Measure only (not in the program): the accuracy on 360 held-out digits, the last epoch's
mean loss and the final learning rate.
Note on the healthy run: Adam at the script's lr 0.1 silences most hidden ReLUs in the first
epoch (on seed 0, 45 of 50 units output zero for every training image after training; the
first epoch's mean loss is 6.4); the few left still reach 92.2% held-out accuracy on seed 0,
while seeds 1 and 2 end at 28.6% and 77.8%. That is the published program's behaviour at its
published learning rate, kept as the healthy baseline.

nndx, as the author would add it: a preflight ``nndx.probe(model, batch, criterion,
optimizer=optimizer)`` on the first (flattened) training batch before the loop;
``nndx.Monitor(model, optimizer)`` around the epochs, every batch's loss logged right after
``optimizer.step()`` (where the README logs it); after training ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_lr_scheduler"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/Basics/pytorch_lr_ratescheduler.py",
                "066299e9a8645836662ec43f785358ca195d65ad", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 8x8 digits upsampled to 20x20 on a 28x28 canvas "
                "instead of MNIST)"),
        Variant(
            "scheduler_stepped_per_batch",
            "ReduceLROnPlateau stepped inside the batch loop on the batch's loss (the author's own commented-out "
            "'scheduler.step(loss)' used instead of the per-epoch scheduler.step(mean_loss)): patience=5 counts "
            "batches, the noisy per-batch loss misses a new best every few batches, and the learning rate is "
            "cut tenfold again and again until training stops",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/Lightning-AI/pytorch-lightning/issues/673",
             "https://github.com/pytorch/pytorch/issues/2850",
             "https://github.com/pytorch/vision/issues/1261"),
            Measure("test_acc", "held-out accuracy at least 20 points below the healthy run's: 24.4 against 92.2 "
                    "healthy on seed 0 (last epoch's mean loss 3.58 against 0.082)",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "an nn.Softmax(dim=1) appended to the model while the loss stays nn.CrossEntropyLoss (which applies "
            "log-softmax itself): the loss is computed on softmaxed probabilities, its gradients shrink as the "
            "outputs saturate and the loss cannot fall below ~1.46",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/shaoxiongji/federated-learning/issues/9",
             "https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10",
             "https://github.com/gitabcworld/MatchingNetworks/issues/5"),
            Measure("test_acc", "held-out accuracy at least 20 points below the healthy run's: 9.2 against 92.2 "
                    "healthy on seed 0 (last epoch's mean loss 2.37 against 0.082)",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
    )
}

NUM_CLASSES, LEARNING_RATE, BATCH_SIZE, NUM_EPOCHS = 10, 0.1, 128, 100
SIDE, BOX, PAD = 28, 20, 4


def mnist_like(raw: torch.Tensor) -> torch.Tensor:
    """MNIST's layout: each digit fills a 20x20 box centred on a 28x28 canvas, pixels in [0, 1]."""
    return F.pad(digits.upscaled(raw, BOX), (PAD, PAD, PAD, PAD))


def check_accuracy(loader: DataLoader, model: nn.Module) -> float:
    num_correct = 0
    num_samples = 0
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            x = x.reshape(x.shape[0], -1)
            scores = model(x)
            _, predictions = scores.max(1)
            num_correct += (predictions == y).sum()
            num_samples += predictions.size(0)
    model.train()
    return float(num_correct) / float(num_samples) * 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    per_batch = variant == "scheduler_stepped_per_batch"

    layers = [nn.Linear(SIDE * SIDE, 50), nn.ReLU(), nn.Linear(50, NUM_CLASSES)]
    if variant == "softmax_before_cross_entropy":
        layers.append(nn.Softmax(dim=1))
    model = nn.Sequential(*layers)

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_dataset = TensorDataset(mnist_like(tr_raw), tr_y)  # transforms.ToTensor()
    test_dataset = TensorDataset(mnist_like(te_raw), te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True)

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.1, patience=5)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        x0, y0 = next(iter(train_loader))
    probe_batch = (x0.reshape(x0.shape[0], -1), y0)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    mean_loss = float("nan")
    for epoch in range(1, NUM_EPOCHS):
        losses = []
        for batch_idx, (data, targets) in enumerate(train_loader):
            data = data.reshape(data.shape[0], -1)

            scores = model(data)
            loss = criterion(scores, targets)

            losses.append(loss.item())

            loss.backward()

            if per_batch:
                scheduler.step(loss)
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            optimizer.zero_grad()

        mean_loss = sum(losses) / len(losses)
        if not per_batch:
            scheduler.step(mean_loss)

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)

    train_acc = check_accuracy(train_loader, model)
    test_acc = check_accuracy(DataLoader(test_dataset, batch_size=BATCH_SIZE), model)
    return {"final_mean_loss": mean_loss, "train_acc": train_acc, "test_acc": test_acc,
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip

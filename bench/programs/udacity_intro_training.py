"""Port of udacity/deep-learning-v2-pytorch's "Part 3 - Training Neural Networks" solution: an
``nn.Sequential`` 784-128-64-10 MLP ending in ``LogSoftmax``, ``NLLLoss``, SGD at lr 0.003, and
the notebook's manual epoch loop with ``optimizer.zero_grad()`` and a ``running_loss``.

Source: github.com/udacity/deep-learning-v2-pytorch,
``intro-to-pytorch/Part 3 - Training Neural Networks (Solution).ipynb`` at commit
c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written anew from the
facts of that file; no code copied.

Kept: ``transforms.Compose([ToTensor(), Normalize((0.5,), (0.5,))])`` (pixels in [-1, 1]); a
shuffling ``DataLoader`` of batch 64; ``nn.Sequential(Linear(784, 128), ReLU(), Linear(128, 64),
ReLU(), Linear(64, 10), LogSoftmax(dim=1))``; ``nn.NLLLoss()``; ``optim.SGD(model.parameters(),
lr=0.003)``; the loop: per epoch ``running_loss = 0``, per batch ``images.view(images.shape[0],
-1)``, ``optimizer.zero_grad()``, ``output = model(images)``, ``loss = criterion(output,
labels)``, ``backward``, ``step``, ``running_loss += loss.item()``; the ``for ... else`` that
prints ``running_loss/len(trainloader)`` per epoch.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 instead of MNIST (1,437 train
images); 200 epochs instead of 5, so that the loop takes about as many SGD steps (4,600) as the
notebook's 5 MNIST epochs (4,690); no ``helper.view_classify`` plot; CPU.
Measure only (not in the program): the accuracy of the trained model on the 360 held-out digits
(the notebook only looks at one image's class probabilities), under ``torch.no_grad()`` as the
notebook's last cell.

nndx, as the author would add it after the README: a preflight ``nndx.probe(model, (images,
labels), criterion, optimizer=optimizer)`` on the first batch, flattened as the loop flattens it;
``nndx.Monitor(model, optimizer, every=10)`` around the epoch loop, every batch's loss logged
where ``running_loss`` is summed; after the loop ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_intro_training"
SOURCE = Source(
    "udacity/deep-learning-v2-pytorch",
    "intro-to-pytorch/Part 3 - Training Neural Networks (Solution).ipynb",
    "c9404fc86181fc3f0906b368697268257f348535",
    "MIT",
)

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's training loop as published (shrunk: 28x28 digits, 1,437 images, "
                "200 epochs)"),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the training pass: each backward adds to the gradients of all "
            "earlier batches and SGD steps their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/IBM/aihwkit/issues/446"),
            Measure("heldout_acc", "held-out accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
        Variant(
            "nll_without_logsoftmax",
            "the Sequential ends at Linear(64, 10), without LogSoftmax(dim=1), as in the notebook's first "
            "(CrossEntropyLoss) cell, while the criterion is nn.NLLLoss: the loss is minus the raw score of the "
            "true class, unbounded below",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/pytorch/pytorch/pull/12703",
             "https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9",
             "https://github.com/pandeykartikey/Hierarchical-Attention-Network/issues/3"),
            Measure("heldout_acc", "held-out accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
    )
}

EPOCHS = 200


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_x = (digits.upscaled(tr_raw, 28) - 0.5) / 0.5  # ToTensor() + Normalize((0.5,), (0.5,))
    test_x = (digits.upscaled(te_raw, 28) - 0.5) / 0.5
    trainset = TensorDataset(train_x, tr_y)
    trainloader = DataLoader(trainset, batch_size=64, shuffle=True)

    layers = [nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)]
    if variant != "nll_without_logsoftmax":
        layers.append(nn.LogSoftmax(dim=1))
    model = nn.Sequential(*layers)
    criterion = nn.NLLLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.003)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        images, labels = next(iter(trainloader))
    probe_batch = (images.view(images.shape[0], -1), labels)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    epochs = EPOCHS
    epoch_losses = []
    for _e in range(epochs):
        running_loss = 0
        for images, labels in trainloader:
            images = images.view(images.shape[0], -1)

            if variant != "no_zero_grad":
                optimizer.zero_grad()

            output = model(images)
            loss = criterion(output, labels)
            loss.backward()
            optimizer.step()

            running_loss += loss.item()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
        else:
            epoch_losses.append(running_loss / len(trainloader))

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)

    with torch.no_grad():
        logps = model(test_x.view(test_x.shape[0], -1))
    heldout_acc = 100.0 * (logps.argmax(1) == te_y).float().mean().item()
    return {"heldout_acc": heldout_acc, "last_epoch_loss": epoch_losses[-1], "first_epoch_loss": epoch_losses[0]}

"""Port of patrickloeber/pytorchTutorial's CNN (tutorial 14): a LeNet-style ``ConvNet`` on
CIFAR-10, ``nn.CrossEntropyLoss``, plain SGD at lr 0.001 with batches of 4, then the overall
and the per-class test accuracy.

Source: github.com/patrickloeber/pytorchTutorial, ``14_cnn.py`` at commit
69637721ed9fa2ccf81a1093a928a52bbb591439 (MIT, Copyright (c) 2020 Patrick Loeber). Written anew
from the facts of that file; no code copied.

Kept: ``batch_size`` 4, ``learning_rate`` 0.001; images through ``ToTensor`` +
``Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))`` (3 x 32 x 32 in [-1, 1]); a shuffling train
``DataLoader`` and an unshuffled test one; ``ConvNet``: ``Conv2d(3, 6, 5)``, ``MaxPool2d(2, 2)``,
``Conv2d(6, 16, 5)``, ``Linear(16 * 5 * 5, 120)``, ``Linear(120, 84)``, ``Linear(84, 10)``, the
forward ``pool(relu(conv1))``, ``pool(relu(conv2))``, ``x.view(-1, 16 * 5 * 5)``, ``relu(fc1)``,
``relu(fc2)``, ``fc3``; ``nn.CrossEntropyLoss()``; ``torch.optim.SGD(model.parameters(),
lr=learning_rate)``; the loop: per batch forward, ``loss = criterion(outputs, labels)``,
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``, the loss printed every
2,000 steps (kept as a recorded number); the test under ``torch.no_grad()``: ``torch.max(outputs,
1)``, the overall accuracy and ``n_class_correct`` / ``n_class_samples`` per class over ``for i
in range(batch_size)``.
Shrunk / replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 32 x 32 and repeated over
3 channels (1,437 train / 360 test; 10 classes named "0".."9") instead of CIFAR-10; 20 epochs
of 360 steps (7,200 in all) instead of 5 of 12,500; the loss recorded every 360 steps instead of 2,000; no
``imshow`` of a batch, no checkpoint saved; CPU.
Measure only (not in the program): the test accuracy, the lowest per-class accuracy and the
mean train loss of the last epoch.

nndx, as the author would add it after the README: a preflight ``nndx.probe(model, (images,
labels), criterion, optimizer=optimizer)`` on the first training batch; ``nndx.Monitor(model,
optimizer, every=10)`` around the loop with every step's loss logged (``mon.log(loss)``); after
training ``nndx.probe(..., monitor=mon, data=(train images, train labels, test images, test
labels))`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "loeber_cnn"
SOURCE = Source("patrickloeber/pytorchTutorial", "14_cnn.py", "69637721ed9fa2ccf81a1093a928a52bbb591439", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 32x32 3-channel digits for CIFAR-10, 20 epochs)"),
        Variant(
            "relu_on_logits",
            "the forward ends with x = F.relu(self.fc3(x)) like the hidden layers: the logits handed to "
            "CrossEntropyLoss are clipped at zero",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/hunkim/PyTorchZeroToAll/pull/4",
             "https://github.com/pytorch/tutorials/pull/1654",
             "https://github.com/pytorch/examples/pull/117",
             "https://github.com/huyng/tensorflow-vgg/issues/13"),
            Measure("test_accuracy", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
        Variant(
            "zero_grad_per_epoch",
            "optimizer.zero_grad() called once at the start of each epoch instead of every batch: the gradients "
            "of all the epoch's batches accumulate into every step",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/patrickloeber/pytorchTutorial/issues/19",
             "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("test_accuracy", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
    )
}

NUM_EPOCHS, BATCH_SIZE, LEARNING_RATE, PRINT_EVERY = 20, 4, 0.001, 360
CLASSES = tuple(str(d) for d in range(10))


class ConvNet(nn.Module):
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
        x = self.pool(F.relu(self.conv1(x)))  # -> n, 6, 14, 14
        x = self.pool(F.relu(self.conv2(x)))  # -> n, 16, 5, 5
        x = x.view(-1, 16 * 5 * 5)  # -> n, 400
        x = F.relu(self.fc1(x))  # -> n, 120
        x = F.relu(self.fc2(x))  # -> n, 84
        x = self.fc3(x)  # -> n, 10
        if self.relu_on_logits:  # the bug
            x = F.relu(x)
        return x


def images_3x32(raw: torch.Tensor) -> torch.Tensor:
    """ToTensor + Normalize((0.5,)*3, (0.5,)*3) on the digits made CIFAR-shaped: (N, 3, 32, 32)."""
    x = digits.upscaled(raw, 32).repeat(1, 3, 1, 1)
    return (x - 0.5) / 0.5


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    tr_x, te_x = images_3x32(tr_raw), images_3x32(te_raw)
    train_loader = DataLoader(TensorDataset(tr_x, tr_y), batch_size=BATCH_SIZE, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(TensorDataset(te_x, te_y), batch_size=BATCH_SIZE, shuffle=False)

    model = ConvNet(relu_on_logits=variant == "relu_on_logits")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    probe_batch = (tr_x[:BATCH_SIZE], tr_y[:BATCH_SIZE])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    printed: list[float] = []
    epoch_losses: list[float] = []
    for epoch in range(NUM_EPOCHS):
        epoch_losses = []
        if variant == "zero_grad_per_epoch":  # the bug: once an epoch
            optimizer.zero_grad()
        for i, (images, labels) in enumerate(train_loader):
            outputs = model(images)
            loss = criterion(outputs, labels)
            if variant != "zero_grad_per_epoch":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_losses.append(loss.item())
            if (i + 1) % PRINT_EVERY == 0:
                printed.append(loss.item())

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=(tr_x, tr_y, te_x, te_y))

    with torch.no_grad():
        n_correct = 0
        n_samples = 0
        n_class_correct = [0 for _ in range(10)]
        n_class_samples = [0 for _ in range(10)]
        for images, labels in test_loader:
            outputs = model(images)
            _, predicted = torch.max(outputs, 1)
            n_samples += labels.size(0)
            n_correct += (predicted == labels).sum().item()
            for i in range(BATCH_SIZE):
                label = labels[i]
                pred = predicted[i]
                if label == pred:
                    n_class_correct[label] += 1
                n_class_samples[label] += 1
        acc = 100.0 * n_correct / n_samples
        class_acc = [100.0 * n_class_correct[i] / n_class_samples[i] for i in range(10)]
    mean_loss = sum(epoch_losses) / len(epoch_losses)
    return {"test_accuracy": acc, "min_class_accuracy": min(class_acc), "final_train_loss": mean_loss,
            "last_printed_loss": printed[-1] if printed else float("nan")}  # fmt: skip

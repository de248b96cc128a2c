"""Port of yunjey/pytorch-tutorial's logistic regression: one ``nn.Linear(input_size,
num_classes)`` on flattened images, ``nn.CrossEntropyLoss``, plain SGD at lr 0.001.

Source: github.com/yunjey/pytorch-tutorial, ``tutorials/01-basics/logistic_regression/main.py``
at commit 0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 yunjey). Written
anew from the facts of that file; no code copied.

Kept: the hyper-parameters' roles (``input_size`` = the pixels of one image, ``num_classes``
10, ``batch_size`` 100, ``learning_rate`` 0.001); images through ``ToTensor`` (uint8 pixels to
float in [0, 1], shape (N, 1, H, W)); a shuffling train ``DataLoader`` and an unshuffled test
one; the model ``nn.Linear(input_size, num_classes)``; ``nn.CrossEntropyLoss()`` ("computes
softmax internally"); ``torch.optim.SGD(model.parameters(), lr=learning_rate)``; the loop: per
batch ``images.reshape(-1, input_size)``, ``outputs = model(images)``, ``loss =
criterion(outputs, labels)``, ``optimizer.zero_grad()``, ``loss.backward()``,
``optimizer.step()``, the loss printed every 100 steps (kept as a recorded number); the test
under ``torch.no_grad()`` with ``torch.max(outputs.data, 1)`` and the accuracy in percent.
Shrunk / replaced: scikit-learn's 8x8 digits (1,437 train / 360 test, stored as 0..255 uint8
pixels as MNIST's files are) instead of MNIST, so ``input_size`` is 8 * 8 = 64 instead of 784;
400 epochs instead of 5 (15 steps a epoch, 6,000 in all, twice the original's 5 x 600:
with 64 inputs instead of 784 each step moves the logits less); no checkpoint saved; CPU.
Measure only (not in the program): the final test accuracy and the mean train loss of the last
epoch.

nndx, as the author would add it after the README: a preflight ``nndx.probe(model, (images,
labels), criterion, optimizer=optimizer)`` on the first training batch (reshaped as the loop
reshapes it); ``nndx.Monitor(model, optimizer, every=10)`` around the loop with every step's
loss logged (``mon.log(loss)``); after training ``nndx.probe(..., monitor=mon,
data=(X_train, y_train, X_test, y_test))`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_logistic"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/01-basics/logistic_regression/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 8x8 digits for MNIST, 400 epochs of 15 steps)"),
        Variant(
            "softmax_before_ce",
            "the model's outputs go through F.softmax(outputs, dim=1) before nn.CrossEntropyLoss (the user 'adds "
            "the missing logistic/softmax part'): CrossEntropyLoss applies log-softmax again, to probabilities",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/147",
             "https://github.com/vinhkhuc/PyTorch-Mini-Tutorials/issues/1",
             "https://github.com/IBM/dstc-noesis/issues/18",
             "https://github.com/meta-pytorch/captum/issues/1010"),
            Measure("test_accuracy", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
        Variant(
            "images_shuffled_alone",
            "the training images are shuffled once with a permutation (tr_x = tr_x[perm]) and the labels are "
            "not, before the TensorDataset is built: every image is paired with another image's label",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/caicloud/tensorflow-tutorial/issues/114",
             "https://github.com/udacity/sdc-issue-reports/issues/1326",
             "https://github.com/amanbasu/ECG-Authentication/issues/3"),
            Measure("test_accuracy", "test accuracy at least 20 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
    )
}

NUM_CLASSES, NUM_EPOCHS, BATCH_SIZE, LEARNING_RATE = 10, 400, 100, 0.001


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    tr_x, te_x = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)
    if variant == "images_shuffled_alone":  # the bug: the images reordered, the labels left as they were
        tr_x = tr_x[torch.randperm(len(tr_x), generator=torch.Generator().manual_seed(seed + 1))]
    input_size = tr_x.shape[-1] * tr_x.shape[-2]  # 8 * 8 (MNIST: 28 * 28)

    train_loader = DataLoader(TensorDataset(tr_x, tr_y), batch_size=BATCH_SIZE, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(TensorDataset(te_x, te_y), batch_size=BATCH_SIZE, shuffle=False)

    model = nn.Linear(input_size, NUM_CLASSES)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    if variant == "softmax_before_ce":
        def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return criterion(F.softmax(outputs, dim=1), labels)
    else:
        loss_fn = criterion

    first_images, first_labels = next(iter(DataLoader(TensorDataset(tr_x, tr_y), batch_size=BATCH_SIZE)))
    probe_batch = (first_images.reshape(-1, input_size), first_labels)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    printed: list[float] = []
    epoch_losses: list[float] = []
    for epoch in range(NUM_EPOCHS):
        epoch_losses = []
        for i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, input_size)
            outputs = model(images)
            loss = loss_fn(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_losses.append(loss.item())
            if (i + 1) % 5 == 0 and (epoch + 1) % 100 == 0:  # the tutorial's print (every 100 of 600 steps)
                printed.append(loss.item())

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer,
              data=(tr_x.reshape(-1, input_size), tr_y, te_x.reshape(-1, input_size), te_y))  # fmt: skip

    with torch.no_grad():
        correct = 0
        total = 0
        for images, labels in test_loader:
            images = images.reshape(-1, input_size)
            outputs = model(images)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    return {"test_accuracy": 100.0 * correct / total, "final_train_loss": sum(epoch_losses) / len(epoch_losses),
            "last_printed_loss": printed[-1] if printed else float("nan")}  # fmt: skip

"""Port of facebookresearch/mixup-cifar10: mixup training of a small CNN (LeNet) with SGD.

Source: github.com/facebookresearch/mixup-cifar10, ``train.py`` (``mixup_data``,
``mixup_criterion``, ``train``, ``test``, ``adjust_learning_rate``) and ``models/lenet.py``
at commit eaff31ab397a90fbc0a4aac71fb5311144b3608b (CC BY-NC 4.0, Copyright (c) 2017-present,
Facebook, Inc.). Written anew from the facts of those files; no code copied.

Kept: ``LeNet``: ``Conv2d(3, 6, 5)``, ``Conv2d(6, 16, 5)``, ``Linear(16*5*5, 120)``,
``Linear(120, 84)``, ``Linear(84, 10)``, ``F.relu`` then ``F.max_pool2d(., 2)`` after each
convolution, ``out.view(out.size(0), -1)``, raw scores out; the test transform's
``Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))``; a shuffled train loader
and an unshuffled test loader of 100; ``criterion = nn.CrossEntropyLoss()``;
``optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4)``; ``mixup_data``: ``lam`` drawn from
``np.random.beta(alpha, alpha)`` (alpha 1), one ``torch.randperm`` index, ``lam * x + (1 -
lam) * x[index, :]``, targets ``y`` and ``y[index]``; ``mixup_criterion`` = ``lam *
criterion(pred, y_a) + (1 - lam) * criterion(pred, y_b)``; ``train``: ``net.train()``, mix,
forward, loss, the lam-weighted train accuracy, ``zero_grad``/``backward``/``step``;
``test``: ``net.eval()``, the plain criterion and accuracy; ``adjust_learning_rate`` after
each epoch (lr / 10 from the 50% mark, / 100 from the 75% mark).
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) upscaled to 32x32 over 3
channels instead of CIFAR-10; ``--no-augment`` (the author's flag: no random crop/flip,
a flipped digit is another digit); batch 64 instead of 128; 16 epochs instead of 200
(the decay at epochs 8 and 12 instead of 100 and 150); numpy and torch seeded with the seed;
lr 0.01 instead of the default 0.1 (tuned for ResNet-18: LeNet stays at chance with it here).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first (unmixed)
training batch with ``criterion`` and the data splits; ``nndx.Monitor`` around the epochs
with ``criterion`` wrapped, passed to ``mixup_criterion`` as ``mon.loss_fn`` (called twice
per step), each step's mixup loss logged with its lam-weighted accuracy, the test loss and
accuracy logged as ``split="val"`` after each epoch; then ``nndx.probe(..., monitor=mon)``
and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mixup"
SOURCE = Source("facebookresearch/mixup-cifar10", "train.py", "eaff31ab397a90fbc0a4aac71fb5311144b3608b",
                "CC-BY-NC-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--model LeNet --no-augment)"),
        Variant(
            "labels_permuted_separately",
            "mixup_data draws a second torch.randperm for the targets: y_b = y[randperm] belongs to another image "
            "than the one mixed into x, so the (1 - lam) share of every loss is on a wrong label",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/xudonmao/VMT/issues/1",),
            Measure("test_loss", "test cross-entropy 1.2x the healthy run's or more: 0.88/0.79 against 0.16/0.17 "
                    "healthy on seeds 0-1", lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
        Variant(
            "lam_swapped",
            "mixup_criterion weighs the targets the other way round: (1 - lam) * criterion(pred, y_a) + lam * "
            "criterion(pred, y_b), so each label's weight is the other image's share of the mix",
            (C.LABEL_NOISE, C.LABELS_MISALIGNED),
            ("https://github.com/clovaai/CutMix-PyTorch/issues/1", "https://github.com/alexrame/mixmo-pytorch/issues/7"),
            Measure("test_loss", "test cross-entropy 1.2x the healthy run's or more: 1.07/0.97 against 0.16/0.17 "
                    "healthy on seeds 0-1", lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
ARGS = dict(lr=0.01, batch_size=64, epoch=16, decay=1e-4, alpha=1.0)


class LeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.max_pool2d(F.relu(self.conv1(x)), 2)
        out = F.max_pool2d(F.relu(self.conv2(out)), 2)
        out = out.view(out.size(0), -1)
        out = F.relu(self.fc1(out))
        out = F.relu(self.fc2(out))
        return self.fc3(out)


def images(raw: torch.Tensor) -> torch.Tensor:
    x = data.upscaled(raw, 32).repeat(1, 3, 1, 1)
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def make_mixup(variant: str):
    def mixup_data(x, y, alpha=1.0):
        lam = np.random.beta(alpha, alpha) if alpha > 0 else 1
        batch_size = x.size()[0]
        index = torch.randperm(batch_size)
        mixed_x = lam * x + (1 - lam) * x[index, :]
        if variant == "labels_permuted_separately":
            y_a, y_b = y, y[torch.randperm(batch_size)]
        else:
            y_a, y_b = y, y[index]
        return mixed_x, y_a, y_b, lam

    def mixup_criterion(criterion, pred, y_a, y_b, lam):
        if variant == "lam_swapped":
            return (1 - lam) * criterion(pred, y_a) + lam * criterion(pred, y_b)
        return lam * criterion(pred, y_a) + (1 - lam) * criterion(pred, y_b)

    return mixup_data, mixup_criterion


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    x_train, x_test = images(train_images), images(test_images)
    trainloader = DataLoader(TensorDataset(x_train, train_labels), batch_size=ARGS["batch_size"], shuffle=True,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
    testloader = DataLoader(TensorDataset(x_test, test_labels), batch_size=100, shuffle=False)
    mixup_data, mixup_criterion = make_mixup(variant)

    net = LeNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=ARGS["lr"], momentum=0.9, weight_decay=ARGS["decay"])

    splits = (x_train, train_labels, x_test, test_labels)
    first_batch = (x_train[: ARGS["batch_size"]], train_labels[: ARGS["batch_size"]])
    nx.preflight(net, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(net, optimizer, every=10, loss_fn=criterion)

    def train_epoch() -> tuple[float, float]:
        net.train()
        train_loss, correct, total = 0.0, 0.0, 0
        for batch_idx, (inputs, targets) in enumerate(trainloader):
            inputs, targets_a, targets_b, lam = mixup_data(inputs, targets, ARGS["alpha"])
            outputs = net(inputs)
            loss = mixup_criterion(mon.loss_fn, outputs, targets_a, targets_b, lam)
            train_loss += loss.item()
            _, predicted = torch.max(outputs.data, 1)
            total += targets.size(0)
            batch_correct = (lam * predicted.eq(targets_a).sum().float()
                             + (1 - lam) * predicted.eq(targets_b).sum().float())  # fmt: skip
            correct += batch_correct.item()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss, accuracy=batch_correct / targets.size(0))
        return train_loss / (batch_idx + 1), correct / total

    def test_epoch() -> tuple[float, float]:
        net.eval()
        test_loss, correct, total = 0.0, 0, 0
        with torch.no_grad():
            for inputs, targets in testloader:
                outputs = net(inputs)
                test_loss += criterion(outputs, targets).item() * targets.size(0)
                _, predicted = torch.max(outputs.data, 1)
                total += targets.size(0)
                correct += predicted.eq(targets).sum().item()
        return test_loss / total, correct / total

    def adjust_learning_rate(epoch: int) -> None:
        lr = ARGS["lr"]
        if epoch >= ARGS["epoch"] // 2:
            lr /= 10
        if epoch >= 3 * ARGS["epoch"] // 4:
            lr /= 10
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

    for epoch in range(ARGS["epoch"]):
        train_loss, train_acc = train_epoch()
        test_loss, test_acc = test_epoch()
        mon.log(test_loss, split="val", accuracy=test_acc)
        adjust_learning_rate(epoch)

    nx.finish(mon, net, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"train_loss": train_loss, "train_acc": train_acc, "test_loss": test_loss, "test_accuracy": test_acc}

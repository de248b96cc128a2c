"""Port of kuangliu's pytorch-cifar: ResNet18 trained on CIFAR-10 with SGD and a cosine schedule.

Source: github.com/kuangliu/pytorch-cifar, ``main.py`` and ``models/resnet.py`` at commit
49b7aa97b0c12fe0d4054e670403a16b6b834ddd (MIT, Copyright (c) 2017 liukuang). Written anew
from the facts of those files; no code copied.

Kept: ``ResNet(BasicBlock, [2, 2, 2, 2])`` (ResNet18): a 3x3 stem conv (no bias) +
``BatchNorm2d`` + ``F.relu``, four ``_make_layer`` stages (strides 1, 2, 2, 2, widths
doubling), each ``BasicBlock`` = conv3x3 -> BN -> ``F.relu`` -> conv3x3 -> BN, ``out +=
self.shortcut(x)`` (an empty ``nn.Sequential`` or a 1x1 conv + BN when the stride or
width changes), ``F.relu``; ``F.avg_pool2d`` over the last map, ``view``, ``Linear``;
``nn.CrossEntropyLoss``; ``optim.SGD(lr=0.1, momentum=0.9, weight_decay=5e-4)``;
``CosineAnnealingLR(T_max=<number of epochs>)`` stepped after each epoch's ``train`` and
``test``; ``train(epoch)``: ``net.train()``, per batch ``zero_grad`` / forward /
``criterion`` / ``backward`` / ``step``, running ``train_loss`` and accuracy from
``outputs.max(1)``; ``test(epoch)``: ``net.eval()`` + ``torch.no_grad()``, test loss and
accuracy (the checkpoint save of the best accuracy kept as a copy in memory); the
training transform ``RandomCrop(size, padding)`` + ``RandomHorizontalFlip`` + ``ToTensor``
+ ``Normalize`` with the author's CIFAR-10 mean/std, the test transform without the
augmentation; a shuffled train loader of 128 and an unshuffled test loader of 100.
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16 (3 equal channels) instead of 32x32
CIFAR-10 (so ``avg_pool2d(out, 2)`` over a 2x2 map instead of 4 over 4x4); widths
8/16/32/64 instead of 64/128/256/512; padding 2 instead of 4; 8 epochs (T_max 8) instead
of 200; 1,437 training and 360 test images instead of 50,000 / 10,000.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the data splits, ``nndx.Monitor`` around the epochs, each batch's loss and accuracy
logged, each ``test``'s loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pytorch_cifar"
SOURCE = Source("kuangliu/pytorch-cifar", "main.py", "49b7aa97b0c12fe0d4054e670403a16b6b834ddd", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (net = ResNet18())"),
        Variant(
            "train_mode_not_restored",
            "net.train() left out of train(epoch): after the first test(epoch) calls net.eval(), every later epoch "
            "trains in eval mode (BatchNorm normalises with its frozen running averages and stops updating them)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/optuna/optuna/pull/1725", "https://github.com/neuroailab/ptutils/issues/22",
             "https://github.com/d2l-ai/d2l-en/pull/1110"),
            Measure("test_loss", "final test loss 1.3x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "scheduler_per_batch",
            "scheduler.step() moved into the batch loop of train(epoch): CosineAnnealingLR(T_max=epochs) anneals "
            "to 0 within T_max batches and then cycles back up, so training ends at whatever LR the cycle is at",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/pytorch/vision/issues/1261", "https://github.com/sthalles/SimCLR/issues/8",
             "https://github.com/ivadomed/ivadomed/issues/57"),
            Measure("test_loss", "final test loss 1.3x the healthy run's or more (the annealed end is lost: the last "
                    "LR is 0.1 against 0.004 healthy)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

SIZE, PAD, EPOCHS = 16, 2, 8
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)  # main.py's Normalize


# --------------------------------------------------------------------------- models/resnet.py


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, num_classes: int = 10, width: int = 64, pool: int = 4) -> None:
        super().__init__()
        self.in_planes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(block, width, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 2 * width, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, num_blocks[3], stride=2)
        self.linear = nn.Linear(8 * width * block.expansion, num_classes)
        self.pool = pool

    def _make_layer(self, block, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.avg_pool2d(out, self.pool)
        out = out.view(out.size(0), -1)
        return self.linear(out)


def ResNet18() -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], width=8, pool=2)  # shrunk: 64 -> 8 wide, 4x4 -> 2x2 last map


# --------------------------------------------------------------------------- main.py


class DigitsCIFAR(Dataset):
    """The digits as torchvision's CIFAR10 with main.py's transforms; the random crop and flip
    draw from the dataset's own generator."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, train: bool, generator=None) -> None:
        self.images, self.labels, self.train, self.generator = images, labels, train, generator
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = self.images[i]
        if self.train:  # RandomCrop(SIZE, padding=PAD), RandomHorizontalFlip()
            padded = F.pad(img, (PAD, PAD, PAD, PAD))
            top, left = torch.randint(0, 2 * PAD + 1, (2,), generator=self.generator).tolist()
            img = padded[:, top : top + SIZE, left : left + SIZE]
            if torch.rand(1, generator=self.generator).item() < 0.5:
                img = img.flip(-1)
        return (img - self.mean) / self.std, self.labels[i]  # ToTensor(), Normalize(MEAN, STD)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train = data.upscaled(train_raw, SIZE).repeat(1, 3, 1, 1)
    x_test = data.upscaled(test_raw, SIZE).repeat(1, 3, 1, 1)
    trainset = DigitsCIFAR(x_train, train_labels, train=True, generator=torch.Generator().manual_seed(seed))
    trainloader = DataLoader(trainset, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(seed))
    testloader = DataLoader(DigitsCIFAR(x_test, test_labels, train=False), batch_size=100, shuffle=False)

    net = ResNet18()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)

    normalise = lambda x: (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)  # noqa: E731
    splits = (normalise(x_train), train_labels, normalise(x_test), test_labels)
    first_batch = (splits[0][:128], train_labels[:128])
    nx.preflight(net, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(net, optimizer, every=5, loss_fn=criterion)

    best = {"acc": 0.0}
    history: dict[str, list[float]] = {"train_loss": [], "test_loss": [], "test_acc": []}

    def train_epoch(epoch: int) -> None:
        if variant != "train_mode_not_restored":
            net.train()
        train_loss, correct, total = 0.0, 0, 0
        for batch_idx, (inputs, targets) in enumerate(trainloader):
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = mon.loss_fn(outputs, targets)
            loss.backward()
            optimizer.step()
            if variant == "scheduler_per_batch":
                scheduler.step()
            train_loss += loss.item()
            _, predicted = outputs.max(1)
            total += targets.size(0)
            correct += predicted.eq(targets).sum().item()
            mon.log(loss, accuracy=predicted.eq(targets).float().mean())
        history["train_loss"].append(train_loss / (batch_idx + 1))

    def test(epoch: int) -> None:
        net.eval()
        test_loss, correct, total = 0.0, 0, 0
        with torch.no_grad():
            for batch_idx, (inputs, targets) in enumerate(testloader):
                outputs = net(inputs)
                test_loss += criterion(outputs, targets).item()
                _, predicted = outputs.max(1)
                total += targets.size(0)
                correct += predicted.eq(targets).sum().item()
        acc = 100.0 * correct / total
        history["test_loss"].append(test_loss / (batch_idx + 1))
        history["test_acc"].append(acc)
        mon.log(test_loss / (batch_idx + 1), split="val", accuracy=acc / 100.0)
        if acc > best["acc"]:  # 'Saving..': the checkpoint, kept in memory
            best.update(acc=acc, net=copy.deepcopy(net.state_dict()), epoch=epoch)

    final_lr = float("nan")
    for epoch in range(EPOCHS):
        train_epoch(epoch)
        final_lr = optimizer.param_groups[0]["lr"]  # the LR the epoch's last step used (per-batch variant)
        test(epoch)
        if variant != "scheduler_per_batch":
            final_lr = optimizer.param_groups[0]["lr"]
            scheduler.step()

    nx.finish(mon, net, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_loss": history["test_loss"][-1], "test_accuracy": history["test_acc"][-1] / 100.0,
            "best_accuracy": best["acc"] / 100.0, "final_train_loss": history["train_loss"][-1],
            "final_lr": final_lr}  # fmt: skip

"""Port of clovaai/CutMix-PyTorch: CutMix augmentation (a random box of each image replaced by
the same box of another image of the batch, the loss mixed between the two labels by the box's
area) training a CIFAR-style ResNet with SGD + Nesterov momentum and a step-wise learning rate,
validated every epoch.

Source: github.com/clovaai/CutMix-PyTorch, ``train.py`` and ``resnet.py`` at commit
2d8eb68faff7fe4962776ad51d175c3b01a25734 (MIT, Copyright (c) 2019-present NAVER Corp.). Written
anew from the facts of those files; no code copied.

Kept: the CIFAR branch of ``train.py``: ``Normalize`` with the CIFAR-10 mean/std, train
transform ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip`` + ``ToTensor`` + normalize,
test transform ``ToTensor`` + normalize, both loaders ``shuffle=True`` (as the original writes
the CIFAR val loader); ``RN.ResNet('cifar10', depth, 10, bottleneck)``: ``conv1`` 3x3 to 16
channels (no bias), BN, ReLU, ``layer1..3`` of ``BasicBlock`` (16/32/64 planes, strides 1/2/2,
1x1-conv + BN downsample when the shape changes, ``out += residual``, in-place ReLUs),
``AvgPool2d(8)``, ``fc``; its init (conv weights ``normal_(0, sqrt(2 / (k*k*out)))``, BN weight
1, bias 0, in ``.data``); ``nn.CrossEntropyLoss``; ``SGD(lr, momentum=0.9, weight_decay=1e-4,
nesterov=True)``; per epoch ``adjust_learning_rate(optimizer, epoch)`` (CIFAR rule: ``lr * 0.1 **
(epoch // (epochs * 0.5)) * 0.1 ** (epoch // (epochs * 0.75))``), ``train`` and ``validate``;
``train``: ``model.train()``, per batch ``r = np.random.rand(1)``, and when ``beta > 0 and r <
cutmix_prob``: ``lam = np.random.beta(beta, beta)``, ``rand_index = torch.randperm(batch)``,
``rand_bbox(input.size(), lam)`` (``W = size[2]``, ``H = size[3]``, ``cut_rat = sqrt(1 -
lam)``, ``int`` cut sizes, a uniform centre, clipped corners), the box pasted in place
(``input[:, :, bbx1:bbx2, bby1:bby2] = input[rand_index, :, bbx1:bbx2, bby1:bby2]``), ``lam``
adjusted to the pasted area (``1 - box area / (W * H)``) and ``loss = criterion(output,
target_a) * lam + criterion(output, target_b) * (1. - lam)``; else the plain loss; top-1/top-5
error on ``output.data`` against ``target``; ``zero_grad``, ``backward``, ``step``;
``validate``: ``model.eval()`` (no ``torch.no_grad``, as the original), the loss and top-1/top-5
errors averaged over the set; the best top-1 error kept.
Shrunk / replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 16x16 and repeated to three
channels (1,437 train / 360 val) instead of CIFAR-10's 32x32, so ``RandomCrop(16, padding=2)`` and
``AvgPool2d(4)`` (the final 4x4 map; 8x8 on CIFAR); ``--net_type resnet --depth 8
--no-bottleneck`` (one BasicBlock per stage) instead of the README's PyramidNet-200; 16 epochs
of ``--batch_size 128 --lr 0.1`` (the argparse defaults); ``--beta 1.0 --cutmix_prob 0.5`` (the
README's CIFAR command); no ``DataParallel``/CUDA, no checkpoint files, no printing.
Measure only (not in the program): the final epoch's validation loss and top-1 error and the
best top-1 error, as ``validate`` returns them, and the learning rate of the last step.

nndx, as the author would add it: a preflight ``nndx.probe(model, first_batch, criterion,
optimizer=optimizer)`` once the optimizer exists (the first batch of the train loader, not
mixed); ``nndx.Monitor(model, optimizer, every=10)`` around the epochs, each batch's loss
logged where ``train`` prints it (``print_freq`` 1), each epoch's val loss and top-1 accuracy
logged as ``split="val"`` after ``validate``; after the last epoch ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cutmix"
SOURCE = Source("clovaai/CutMix-PyTorch", "train.py", "2d8eb68faff7fe4962776ad51d175c3b01a25734", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "train.py as published, CIFAR branch (shrunk: 16x16 digits, ResNet-8, 16 epochs)"),
        Variant(
            "lam_weights_swapped",
            "the two labels' weights are swapped in the mixed loss: criterion(output, target_a) * (1 - lam) + "
            "criterion(output, target_b) * lam, with lam the share of the image still showing sample a (lam taken "
            "as the pasted box's share, as kornia's RandomCutMixV2 returned it): the label of the pasted patch gets "
            "the weight of the background, so a small patch takes most of the label",
            (C.LABEL_NOISE,),
            ("https://github.com/kornia/kornia/issues/3077",
             "https://github.com/alexrame/mixmo-pytorch/issues/7",
             "https://github.com/growingnet/gromo/pull/67"),
            Measure("val_loss", "final validation loss at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "lr_adjusted_per_iteration",
            "adjust_learning_rate(optimizer, epoch) moved into the batch loop and given the iteration count "
            "(epoch * len(train_loader) + i): the step-wise rule meant for epochs divides the learning rate by 10 "
            "after epochs/2 iterations and keeps dividing, so training stops moving within the first two epochs",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/1",
             "https://github.com/pytorch/pytorch/issues/3814",
             "https://github.com/ScrollPrize/villa/pull/1495"),
            Measure("best_err1", "best validation top-1 error at least 20 points above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 20.0),
        ),
    )
}

ARGS = {"epochs": 16, "batch_size": 128, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "depth": 8,
        "bottleneck": False, "beta": 1.0, "cutmix_prob": 0.5, "dataset": "cifar10"}  # fmt: skip
MEAN = torch.tensor([x / 255.0 for x in [125.3, 123.0, 113.9]]).view(3, 1, 1)
SIDE, PAD = 16, 2  # CIFAR's 32 and padding 4, halved
STD = torch.tensor([x / 255.0 for x in [63.0, 62.1, 66.7]]).view(3, 1, 1)


# --------------------------------------------------------------------------- resnet.py (CIFAR branch)


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, dataset: str, depth: int, num_classes: int, bottleneck: bool = False) -> None:
        super().__init__()
        self.dataset = dataset
        self.inplanes = 16
        assert not bottleneck
        n = int((depth - 2) / 6)
        block = BasicBlock
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, 16, n)
        self.layer2 = self._make_layer(block, 32, n, stride=2)
        self.layer3 = self._make_layer(block, 64, n, stride=2)
        self.avgpool = nn.AvgPool2d(SIDE // 4)  # AvgPool2d(8) on CIFAR's 32x32
        self.fc = nn.Linear(64 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / fan))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x


# --------------------------------------------------------------------------- the data (CIFAR-10 stand-in)


class DigitsRGB(Dataset):
    """The digits as 3xSIDExSIDE images in [0, 1] (ToTensor), then the CIFAR transforms per item."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, train: bool) -> None:
        self.images = digits.upscaled(images, SIDE).repeat(1, 3, 1, 1)
        self.labels, self.train = labels, train

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = self.images[i]
        if self.train:  # RandomCrop(SIDE, padding=PAD), RandomHorizontalFlip()
            padded = torch.nn.functional.pad(img, (PAD, PAD, PAD, PAD))
            top, left = (int(v) for v in torch.randint(0, 2 * PAD + 1, (2,)))
            img = padded[:, top : top + SIDE, left : left + SIDE]
            if torch.rand(1).item() < 0.5:
                img = img.flip(-1)
        return (img - MEAN) / STD, self.labels[i]


# --------------------------------------------------------------------------- train.py


def rand_bbox(size, lam: float):
    W = size[2]
    H = size[3]
    cut_rat = np.sqrt(1.0 - lam)
    cut_w = int(W * cut_rat)
    cut_h = int(H * cut_rat)
    cx = np.random.randint(W)
    cy = np.random.randint(H)
    bbx1 = np.clip(cx - cut_w // 2, 0, W)
    bby1 = np.clip(cy - cut_h // 2, 0, H)
    bbx2 = np.clip(cx + cut_w // 2, 0, W)
    bby2 = np.clip(cy + cut_h // 2, 0, H)
    return bbx1, bby1, bbx2, bby2


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)):
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    res = []
    for k in topk:
        correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
        wrong_k = batch_size - correct_k
        res.append(wrong_k.mul_(100.0 / batch_size))
    return res


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def adjust_learning_rate(optimizer: torch.optim.Optimizer, epoch: int, args: dict) -> None:
    lr = args["lr"] * (0.1 ** (epoch // (args["epochs"] * 0.5))) * (0.1 ** (epoch // (args["epochs"] * 0.75)))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    swap = variant == "lam_weights_swapped"
    lr_per_iter = variant == "lr_adjusted_per_iteration"

    tr_raw, tr_y, va_raw, va_y = digits.digit_images(seed=seed)
    train_loader = DataLoader(DigitsRGB(tr_raw, tr_y, train=True), batch_size=args["batch_size"], shuffle=True)
    val_loader = DataLoader(DigitsRGB(va_raw, va_y, train=False), batch_size=args["batch_size"], shuffle=True)
    numberofclass = 10

    model = ResNet(args["dataset"], args["depth"], numberofclass, args["bottleneck"])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args["lr"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"], nesterov=True)  # fmt: skip

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first_batch = next(iter(train_loader))
    nx.preflight(model, first_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def train_epoch(epoch: int) -> float:
        losses = AverageMeter()
        model.train()
        for i, (input, target) in enumerate(train_loader):
            if lr_per_iter:  # the bug: the epoch rule stepped with the iteration count
                adjust_learning_rate(optimizer, epoch * len(train_loader) + i, args)
            r = np.random.rand(1)
            if args["beta"] > 0 and r < args["cutmix_prob"]:
                lam = np.random.beta(args["beta"], args["beta"])
                rand_index = torch.randperm(input.size()[0])
                target_a = target
                target_b = target[rand_index]
                bbx1, bby1, bbx2, bby2 = rand_bbox(input.size(), lam)
                input[:, :, bbx1:bbx2, bby1:bby2] = input[rand_index, :, bbx1:bbx2, bby1:bby2]
                lam = 1 - ((bbx2 - bbx1) * (bby2 - bby1) / (input.size()[-1] * input.size()[-2]))
                output = model(input)
                if swap:  # the bug: each label weighted by the other sample's share of the image
                    loss = criterion(output, target_a) * (1.0 - lam) + criterion(output, target_b) * lam
                else:
                    loss = criterion(output, target_a) * lam + criterion(output, target_b) * (1.0 - lam)
            else:
                output = model(input)
                loss = criterion(output, target)
            err1, err5 = accuracy(output.data, target, topk=(1, 5))
            losses.update(loss.item(), input.size(0))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023 - where train() prints (print_freq 1)
        return losses.avg

    def validate() -> tuple[float, float, float]:
        losses, top1, top5 = AverageMeter(), AverageMeter(), AverageMeter()
        model.eval()
        for input, target in val_loader:
            output = model(input)
            loss = criterion(output, target)
            err1, err5 = accuracy(output.data, target, topk=(1, 5))
            losses.update(loss.item(), input.size(0))
            top1.update(err1.item(), input.size(0))
            top5.update(err5.item(), input.size(0))
        return top1.avg, top5.avg, losses.avg

    best_err1 = 100.0
    train_loss = err1 = val_loss = float("nan")
    for epoch in range(0, args["epochs"]):
        if not lr_per_iter:
            adjust_learning_rate(optimizer, epoch, args)
        train_loss = train_epoch(epoch)
        err1, err5, val_loss = validate()
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=1.0 - err1 / 100.0))  # noqa: B023
        best_err1 = min(err1, best_err1)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer)
    return {"val_loss": val_loss, "err1": err1, "best_err1": best_err1, "train_loss": train_loss,
            "last_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip

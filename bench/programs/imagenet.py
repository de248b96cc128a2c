"""Port of pytorch/examples ``imagenet/main.py``: a torchvision ResNet-18 trained with SGD + StepLR.

Source: github.com/pytorch/examples, ``imagenet/main.py`` at commit
493da9304e56ff5160f78d01a54992db35df2a98 (BSD-3-Clause, Copyright (c) 2017 PyTorch
contributors); the model is torchvision's ``resnet18`` (``torchvision/models/resnet.py``,
BSD-3-Clause), written out here because torchvision is not installed. Written anew from the
facts of those files; no code copied.

Kept: ``main_worker``'s ``criterion = nn.CrossEntropyLoss()``, ``torch.optim.SGD(lr=0.1,
momentum=0.9, weight_decay=1e-4)``, ``StepLR(step_size=30, gamma=0.1)`` stepped once per
epoch after ``train`` and ``validate``; the epoch loop keeping ``best_acc1`` and a
checkpoint of the best model (here a copy in memory, not ``torch.save``); ``train``:
``model.train()``, per batch forward, ``criterion``, ``accuracy(output, target,
topk=(1, 5))`` into ``AverageMeter``s (``update(val, n)``, running ``avg``), then
``optimizer.zero_grad()`` / ``loss.backward()`` / ``optimizer.step()``, the progress line every
``print_freq`` batches (kept as a record instead of printed); ``validate``: ``model.eval()``,
``torch.no_grad()``, the same meters, returns ``top1.avg``; ``accuracy``: ``topk`` of the
outputs, transposed, compared with the expanded target, percent per k; the train transform
``RandomResizedCrop`` + ``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize`` with the
ImageNet mean/std, the val transform ``Resize`` + ``CenterCrop`` (ratio 256/224) +
``ToTensor`` + ``Normalize``; a shuffled train loader and an unshuffled val loader of the
same batch size. torchvision's ResNet-18: ``conv1`` 7x7 stride 2 (no bias) + ``bn1`` +
``ReLU(inplace=True)`` + ``MaxPool2d(3, 2, 1)``, four ``_make_layer`` stages of two
``BasicBlock``s (conv3x3 -> BN -> ReLU -> conv3x3 -> BN, ``out += identity`` with a
``downsample`` of conv1x1 + BN when the stride or the width changes, ReLU), widths doubling,
strides 1/2/2/2, ``AdaptiveAvgPool2d((1, 1))``, ``torch.flatten``, ``fc``; the init
(``kaiming_normal_(mode="fan_out", nonlinearity="relu")`` for convolutions, BN weight 1 and
bias 0).
Shrunk: scikit-learn's 8x8 digits (10 classes, 1,437 train / 360 val) stored at 32x32 and
cropped to 16x16 (val: resized to 18, centre crop 16) instead of ImageNet at 224x224 (1000
classes), 3 equal channels; widths 8/16/32/64 instead of 64/128/256/512;
``RandomResizedCrop`` scale (0.5, 1) instead of (0.08, 1) (a crop of 8% of a digit is
unreadable); batch 64 instead of 256 (lr kept at 0.1);
9 epochs with ``step_size=3`` instead of 90 with 30; single process, CPU, no
DataParallel/DistributedDataParallel.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(through the val transform) with the data splits, ``nndx.Monitor`` around the epochs with
``criterion`` called as ``mon.loss_fn``, each batch's loss and top-1 accuracy logged, each
``validate``'s loss and top-1 logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "imagenet"
SOURCE = Source("pytorch/examples", "imagenet/main.py", "493da9304e56ff5160f78d01a54992db35df2a98", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (resnet18, the default --arch)"),
        Variant(
            "val_labels_misaligned",
            "the val labels read in another class order than the train folders' (the devkit's ILSVRC2012 ids "
            "against torchvision's sorted wnids): every val image carries the index of a different class",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/huggingface/pytorch-image-models/issues/1081",
             "https://github.com/fra31/sparse-rs/issues/4",
             "https://github.com/facebookresearch/ImageNet-Adversarial-Training/issues/24",
             "https://github.com/open-mmlab/mmpretrain/issues/11"),
            Measure("val_acc1", "final val top-1 (as validate() reports it) at least 0.3 below the healthy run's: "
                    "0.078/0.017/0.058 against 0.833/0.719/0.781 healthy on seeds 0-2 (training unchanged)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "scheduler_per_batch",
            "scheduler.step() moved into train()'s batch loop: StepLR(step_size=3) divides the LR by 10 every "
            "3 batches instead of every 3 epochs, so it is ~0 before the first epoch ends",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/1", "https://github.com/pytorch/pytorch/issues/3814",
             "https://github.com/pytorch/vision/issues/1261"),
            Measure("val_loss", "final val loss 1.3x the healthy run's or more: 2.33/2.29/2.03 against 0.55/0.78/0.58 "
                    "healthy on seeds 0-2 (top-1 0.21/0.17/0.26 against 0.83/0.72/0.78; LR 1e-69 at the end)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

STORED, CROP, RESIZE = 32, 16, 18  # the "JPEG" size, the crop (224), the val resize (256)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ARGS = {"epochs": 9, "batch_size": 64, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "print_freq": 10,
        "step_size": 3}  # fmt: skip
# the val ground truth in the devkit's class order: devkit id -> torchvision (sorted folder) index
DEVKIT_ORDER = (3, 7, 0, 9, 1, 5, 8, 2, 6, 4)


# --------------------------------------------------------------------------- torchvision's resnet18


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))  # fmt: skip
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes, width=8)  # shrunk: 64 -> 8 wide


# --------------------------------------------------------------------------- the data (ImageFolder stand-in)


class DigitFolder(Dataset):
    """The digits as ``datasets.ImageFolder`` with main.py's transforms: the train one draws its
    crop and flip from the dataset's own generator."""

    def __init__(self, stored: torch.Tensor, labels: torch.Tensor, train: bool, generator=None) -> None:
        self.stored, self.labels, self.train, self.generator = stored, labels, train, generator
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = self.stored[i]  # (1, STORED, STORED) in [0, 1]
        img = random_resized_crop(img, self.generator) if self.train else center_crop(img)
        if self.train and torch.rand(1, generator=self.generator).item() < 0.5:  # RandomHorizontalFlip
            img = img.flip(-1)
        img = img.expand(3, -1, -1)  # the RGB channels of a grey image
        return (img - self.mean) / self.std, self.labels[i]  # ToTensor(), normalize


def random_resized_crop(img: torch.Tensor, generator, scale=(0.5, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    """``RandomResizedCrop(CROP)``: a box of random area and aspect ratio, resized to CROP."""
    height, width = img.shape[-2:]
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(1, generator=generator).item())
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * torch.rand(1, generator=generator).item())
        w, h = round(math.sqrt(target_area * aspect)), round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            box = img[:, top : top + h, left : left + w]
            return F.interpolate(box[None], size=(CROP, CROP), mode="bilinear", align_corners=False)[0]
    return center_crop(img)


def center_crop(img: torch.Tensor) -> torch.Tensor:
    """``Resize(RESIZE)`` then ``CenterCrop(CROP)``."""
    resized = F.interpolate(img[None], size=(RESIZE, RESIZE), mode="bilinear", align_corners=False)[0]
    offset = (RESIZE - CROP) // 2
    return resized[:, offset : offset + CROP, offset : offset + CROP]


# --------------------------------------------------------------------------- main.py's helpers


class AverageMeter:
    """Computes and stores the average and current value."""

    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name, self.fmt = name, fmt
        self.reset()

    def reset(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self) -> str:
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    """The accuracy (percent) over the k top predictions, for each k."""
    with torch.no_grad():
        maxk, batch_size = max(topk), target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / batch_size) for k in topk]


# --------------------------------------------------------------------------- main_worker


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, train_labels, val_raw, val_labels = data.digit_images(seed=seed)
    train_stored, val_stored = data.upscaled(train_raw, STORED), data.upscaled(val_raw, STORED)
    if variant == "val_labels_misaligned":  # the ground-truth file's ids, taken as torchvision's indices
        val_labels = torch.tensor(DEVKIT_ORDER)[val_labels]

    model = resnet18(num_classes=10)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args["lr"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"])  # fmt: skip
    scheduler = StepLR(optimizer, step_size=args["step_size"], gamma=0.1)

    train_dataset = DigitFolder(train_stored, train_labels, train=True, generator=torch.Generator().manual_seed(seed))
    val_dataset = DigitFolder(val_stored, val_labels, train=False)
    train_loader = DataLoader(train_dataset, batch_size=args["batch_size"], shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    val_loader = DataLoader(val_dataset, batch_size=args["batch_size"], shuffle=False)

    plain_train = DigitFolder(train_stored, train_labels, train=False)  # the train images through the val transform
    x_train = torch.stack([plain_train[i][0] for i in range(len(plain_train))])
    x_val = torch.stack([val_dataset[i][0] for i in range(len(val_dataset))])
    splits = (x_train, train_labels, x_val, val_labels)
    first_batch = (x_train[: args["batch_size"]], train_labels[: args["batch_size"]])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    progress: list[str] = []

    def meters() -> tuple[AverageMeter, AverageMeter, AverageMeter]:
        return AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f"), AverageMeter("Acc@5", ":6.2f")

    def train_one_epoch(epoch: int) -> float:
        losses, top1, top5 = meters()
        model.train()
        for i, (images, target) in enumerate(train_loader):
            output = model(images)
            loss = mon.loss_fn(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0].item(), images.size(0))
            top5.update(acc5[0].item(), images.size(0))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if variant == "scheduler_per_batch":
                scheduler.step()
            mon.log(loss, accuracy=acc1[0].item() / 100.0)
            if i % args["print_freq"] == 0:
                progress.append(f"Epoch: [{epoch}][{i + 1}/{len(train_loader)}]\t{losses}\t{top1}\t{top5}")
        return losses.avg

    def validate() -> tuple[float, float]:
        losses, top1, top5 = meters()
        model.eval()
        with torch.no_grad():
            for images, target in val_loader:
                output = model(images)
                loss = criterion(output, target)
                acc1, acc5 = accuracy(output, target, topk=(1, 5))
                losses.update(loss.item(), images.size(0))
                top1.update(acc1[0].item(), images.size(0))
                top5.update(acc5[0].item(), images.size(0))
        progress.append(f" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f}")
        mon.log(losses.avg, split="val", accuracy=top1.avg / 100.0)
        return top1.avg, losses.avg

    best_acc1, best = 0.0, {}
    train_loss = val_loss = acc1 = float("nan")
    for epoch in range(args["epochs"]):
        train_loss = train_one_epoch(epoch)
        acc1, val_loss = validate()
        if variant != "scheduler_per_batch":
            scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if is_best:  # save_checkpoint(..., is_best): kept in memory
            best = {"epoch": epoch + 1, "state_dict": copy.deepcopy(model.state_dict()), "best_acc1": best_acc1}

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"val_acc1": acc1 / 100.0, "val_loss": val_loss, "best_acc1": best_acc1 / 100.0,
            "train_loss": train_loss, "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip

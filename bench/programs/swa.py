"""Port of timgaripov/swa: Stochastic Weight Averaging of a pre-activation ResNet trained by SGD
with a schedule that decays to a constant SWA learning rate, a running average of the weights
kept in a second model, and that model's BatchNorm statistics recomputed before it is evaluated.

Source: github.com/timgaripov/swa, ``train.py``, ``utils.py`` and ``models/preresnet.py`` at
commit 411b2fcad59bec60c6c9eb1eb19ab906540e5ea2 (BSD-2-Clause, Copyright (c) 2018, Pavel Izmailov,
Dmitrii Podoprikhin, Timur Garipov, Dmitry Vetrov, Andrew Gordon Wilson). Written anew from the
facts of those files; no code copied.

Kept: ``PreResNet`` with ``BasicBlock`` (depth < 44: ``n = (depth - 2) // 6`` blocks per stage;
BN, ReLU, 3x3 conv (stride), BN, ReLU, 3x3 conv, plus the input or a strided 1x1 conv shortcut
added in place), a 3x3 stem conv to 16 channels, stages of 16, 32 and 64 channels (strides 1, 2,
2), a last BN and ReLU, ``AvgPool2d`` over the last feature map, ``view`` and ``Linear``; convs
initialised ``normal(0, sqrt(2 / (k * k * out_channels)))``, BN weight 1 / bias 0, the Linear left
at PyTorch's default; the CIFAR-10 PreResNet recipe of the README (``--lr_init 0.1 --wd 3e-4 --swa
--swa_lr 0.01``, ``swa_start`` at 56% of the epochs), batch 128, ``momentum`` 0.9, ``eval_freq``
5, ``swa_c_epochs`` 1; ``criterion = F.cross_entropy``; ``schedule(epoch)`` (``t = epoch /
swa_start``, factor 1 until t = 0.5, linear to ``swa_lr / lr_init`` at t = 0.9, then constant)
set once per epoch by ``adjust_learning_rate``; ``train_epoch`` (``model.train()``, then per
batch forward, loss, ``zero_grad``, ``backward``, ``step``; the summed loss and correct count over
the dataset); ``eval`` (``model.eval()``, the same sums; run at epoch 0, every ``eval_freq``-th
epoch and the last); the SWA branch: a second ``PreResNet`` built the same way,
``moving_average(swa_model, model, 1 / (swa_n + 1))`` over ``parameters()`` once ``epoch + 1 >=
swa_start``, and on evaluation epochs ``bn_update`` (if the model has BatchNorm: ``train()``,
running mean/var reset to 0/1, momentum ``b / (n + b)`` per batch so every batch of one pass over
the train loader weighs equally, the momenta restored) then ``eval`` of the SWA model; the
transforms: random crop with padding, ``ToTensor``, ``Normalize`` with the CIFAR-10 mean/std
constants of ``models/preresnet.py``; a shuffled train loader, an unshuffled test loader.
Shrunk: scikit-learn's 8x8 digits (10 classes, 1,437 train / 360 test) upscaled to 16x16 and
repeated over 3 channels instead of 32x32 CIFAR-10 (``AvgPool2d(4)`` where the original has 8,
the side of the last feature map either way; crop padding 2 instead of 4); depth 8 (one block
per stage) instead of 110/164; 15 epochs with ``swa_start`` 8 instead of 225 and 126; no
horizontal flip (digits are not mirror-symmetric); no checkpoints, directories, ``tabulate``
table or ``--resume``; seeds from the harness; CPU, no loader workers.
Measure only (not in the program): nothing beyond the table's columns of the last epoch (the SGD
model's and the SWA model's test loss and accuracy, train loss and accuracy).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch with
``F.cross_entropy``, the SGD optimizer and the data splits; ``nndx.Monitor(model, optimizer,
loss_fn=criterion)`` around the epochs, its ``mon.loss_fn`` handed to ``train_epoch`` as the
criterion, each batch's loss and accuracy logged there and each evaluation of the SGD model
logged as ``split="val"`` (the SWA model, a separate module that no optimizer trains, is not
monitored); then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose`` on the SGD model.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "swa"
SOURCE = Source("timgaripov/swa", "train.py", "411b2fcad59bec60c6c9eb1eb19ab906540e5ea2", "BSD-2-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published with the README's CIFAR-10 PreResNet SWA recipe (shrunk)"),
        Variant(
            "train_mode_not_restored",
            "model.train() moved out of train_epoch to once before the epoch loop: eval() of the SGD model at "
            "epoch 0 (and every eval_freq-th epoch) leaves it in eval mode, so every later epoch trains with "
            "BatchNorm normalising by frozen running statistics that no longer update",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/tutorials/issues/1624", "https://github.com/tk-rusch/coRNN/issues/1",
             "https://github.com/microsoft/robustdg/issues/30"),
            Measure("swa_test_accuracy", "the SWA model's final test accuracy at least 10 points below the healthy "
                    "run's", lambda healthy, buggy: not buggy > healthy - 0.10),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "PreResNet.forward ends with a softmax over the classes (the ResNet paper's 'fc + softmax'), and the "
            "program's criterion F.cross_entropy applies its own log_softmax on top: the loss is bounded near "
            "ln(10) and its gradients shrink as the model grows confident",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/kuangliu/pytorch-cifar/issues/132",
             "https://github.com/Lornatang/pytorch-alexnet-cifar100/issues/4",
             "https://github.com/weiaicunzai/pytorch-cifar100/issues/26"),
            Measure("swa_test_accuracy", "the SWA model's final test accuracy at least 10 points below the healthy "
                    "run's", lambda healthy, buggy: not buggy > healthy - 0.10),
        ),
    )
}

ARGS = {"batch_size": 128, "epochs": 15, "eval_freq": 5, "lr_init": 0.1, "momentum": 0.9, "wd": 3e-4,
        "swa": True, "swa_start": 8.0, "swa_lr": 0.01, "swa_c_epochs": 1, "depth": 8}  # fmt: skip
SIDE, PAD = 16, 2
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


# --------------------------------------------------------------------------- models/preresnet.py


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        out = self.bn1(x)
        out = self.relu(out)
        out = self.conv1(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv2(out)
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        return out


class PreResNet(nn.Module):
    def __init__(self, num_classes: int = 10, depth: int = 110, pool: int = 8, softmax_head: bool = False) -> None:
        super().__init__()
        assert depth < 44 and (depth - 2) % 6 == 0, "depth should be 6n+2"
        n = (depth - 2) // 6
        block = BasicBlock
        self.softmax_head = softmax_head
        self.inplanes = 16
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1, bias=False)
        self.layer1 = self._make_layer(block, 16, n)
        self.layer2 = self._make_layer(block, 32, n, stride=2)
        self.layer3 = self._make_layer(block, 64, n, stride=2)
        self.bn = nn.BatchNorm2d(64 * block.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AvgPool2d(pool)
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
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1,
                                                 stride=stride, bias=False))  # fmt: skip
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.bn(x)
        x = self.relu(x)
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        if self.softmax_head:  # the planted bug: class probabilities out of the model
            x = F.softmax(x, dim=1)
        return x


# --------------------------------------------------------------------------- utils.py


def adjust_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> float:
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    return lr


def train_epoch(loader, model: nn.Module, criterion, optimizer: torch.optim.Optimizer, nx: Nndx, mon,
                set_train: bool = True) -> dict[str, float]:  # fmt: skip
    loss_sum, correct, n = 0.0, 0.0, 0
    if set_train:
        model.train()
    for input, target in loader:
        output = model(input)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * input.size(0)
        pred = output.data.max(1, keepdim=True)[1]
        batch_correct = pred.eq(target.data.view_as(pred)).sum().item()
        correct += batch_correct
        n += input.size(0)
        nx.timed(lambda: mon.log(loss, accuracy=batch_correct / input.size(0)))
    return {"loss": loss_sum / n, "accuracy": correct / n * 100.0}


def evaluate(loader, model: nn.Module, criterion) -> dict[str, float]:
    loss_sum, correct, n = 0.0, 0.0, 0
    model.eval()
    with torch.no_grad():
        for input, target in loader:
            output = model(input)
            loss = criterion(output, target)
            loss_sum += loss.item() * input.size(0)
            pred = output.data.max(1, keepdim=True)[1]
            correct += pred.eq(target.data.view_as(pred)).sum().item()
            n += input.size(0)
    return {"loss": loss_sum / n, "accuracy": correct / n * 100.0}


def moving_average(net1: nn.Module, net2: nn.Module, alpha: float = 1.0) -> None:
    for param1, param2 in zip(net1.parameters(), net2.parameters()):
        param1.data *= 1.0 - alpha
        param1.data += param2.data * alpha


def _check_bn(module: nn.Module, flag: list[bool]) -> None:
    if issubclass(module.__class__, torch.nn.modules.batchnorm._BatchNorm):
        flag[0] = True


def check_bn(model: nn.Module) -> bool:
    flag = [False]
    model.apply(lambda module: _check_bn(module, flag))
    return flag[0]


def reset_bn(module: nn.Module) -> None:
    if issubclass(module.__class__, torch.nn.modules.batchnorm._BatchNorm):
        module.running_mean = torch.zeros_like(module.running_mean)
        module.running_var = torch.ones_like(module.running_var)


def _get_momenta(module: nn.Module, momenta: dict) -> None:
    if issubclass(module.__class__, torch.nn.modules.batchnorm._BatchNorm):
        momenta[module] = module.momentum


def _set_momenta(module: nn.Module, momenta: dict) -> None:
    if issubclass(module.__class__, torch.nn.modules.batchnorm._BatchNorm):
        module.momentum = momenta[module]


def bn_update(loader, model: nn.Module) -> None:
    """One pass over the train loader with the BN buffers reset, every batch weighted equally."""
    if not check_bn(model):
        return
    model.train()
    momenta: dict = {}
    model.apply(reset_bn)
    model.apply(lambda module: _get_momenta(module, momenta))
    n = 0
    for input, _ in loader:
        b = input.size(0)
        momentum = b / (n + b)
        for module in momenta.keys():
            module.momentum = momentum
        model(input)
        n += b
    model.apply(lambda module: _set_momenta(module, momenta))


# --------------------------------------------------------------------------- the data (torchvision stand-in)


class Loader:
    """A DataLoader over in-memory images: random crop with padding on the [0, 1] images, then
    Normalize (the train transform) or Normalize alone (the test transform)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, shuffle: bool, augment: bool,
                 generator: torch.Generator) -> None:  # fmt: skip
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.shuffle, self.augment, self.generator = shuffle, augment, generator
        self.dataset = labels

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self):
        n = len(self.labels)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            x = self.images[idx]
            if self.augment:
                x = random_crop(x, self.generator)
            yield normalize(x), self.labels[idx]


def random_crop(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    n, _, h, w = x.shape
    padded = F.pad(x, (PAD, PAD, PAD, PAD))
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=generator)
    return torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def normalize(x: torch.Tensor) -> torch.Tensor:
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_images = data.upscaled(train_raw, SIDE).expand(-1, 3, -1, -1).contiguous()
    test_images = data.upscaled(test_raw, SIDE).expand(-1, 3, -1, -1).contiguous()
    generator = torch.Generator().manual_seed(seed)
    loaders = {
        "train": Loader(train_images, train_labels, args["batch_size"], shuffle=True, augment=True,
                        generator=generator),
        "test": Loader(test_images, test_labels, args["batch_size"], shuffle=False, augment=False,
                       generator=generator),
    }  # fmt: skip
    num_classes = int(train_labels.max()) + 1

    softmax_head = variant == "softmax_before_cross_entropy"
    model = PreResNet(num_classes=num_classes, depth=args["depth"], pool=SIDE // 4, softmax_head=softmax_head)
    swa_model = PreResNet(num_classes=num_classes, depth=args["depth"], pool=SIDE // 4, softmax_head=softmax_head)
    swa_n = 0

    def schedule(epoch: int) -> float:
        t = epoch / (args["swa_start"] if args["swa"] else args["epochs"])
        lr_ratio = args["swa_lr"] / args["lr_init"] if args["swa"] else 0.01
        if t <= 0.5:
            factor = 1.0
        elif t <= 0.9:
            factor = 1.0 - (1.0 - lr_ratio) * (t - 0.5) / 0.4
        else:
            factor = lr_ratio
        return args["lr_init"] * factor

    criterion = F.cross_entropy
    optimizer = torch.optim.SGD(model.parameters(), lr=args["lr_init"], momentum=args["momentum"],
                                weight_decay=args["wd"])  # fmt: skip

    first_batch = (normalize(train_images[: args["batch_size"]]), train_labels[: args["batch_size"]])
    splits = (normalize(train_images), train_labels, normalize(test_images), test_labels)
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    restore_train = variant != "train_mode_not_restored"
    if not restore_train:
        model.train()  # the planted bug: once, before the loop, instead of in train_epoch
    swa_res = {"loss": float("nan"), "accuracy": float("nan")}
    test_res = {"loss": float("nan"), "accuracy": float("nan")}
    train_res: dict[str, float] = {}
    lr = args["lr_init"]
    for epoch in range(args["epochs"]):
        lr = schedule(epoch)
        adjust_learning_rate(optimizer, lr)
        train_res = train_epoch(loaders["train"], model, mon.loss_fn, optimizer, nx, mon, set_train=restore_train)
        evaluating = epoch == 0 or epoch % args["eval_freq"] == args["eval_freq"] - 1 or epoch == args["epochs"] - 1
        if evaluating:
            test_res = evaluate(loaders["test"], model, criterion)
            nx.timed(lambda: mon.log(test_res["loss"], split="val", accuracy=test_res["accuracy"] / 100.0))

        if args["swa"] and (epoch + 1) >= args["swa_start"] and (epoch + 1 - args["swa_start"]) % args["swa_c_epochs"] == 0:
            moving_average(swa_model, model, 1.0 / (swa_n + 1))
            swa_n += 1
            if evaluating:
                bn_update(loaders["train"], swa_model)
                swa_res = evaluate(loaders["test"], swa_model, criterion)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {
        "swa_test_accuracy": swa_res["accuracy"] / 100.0,
        "swa_test_loss": swa_res["loss"],
        "test_accuracy": test_res["accuracy"] / 100.0,
        "test_loss": test_res["loss"],
        "train_accuracy": train_res["accuracy"] / 100.0,
        "train_loss": train_res["loss"],
        "final_lr": lr,
    }

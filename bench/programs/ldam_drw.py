"""Port of kaidic/LDAM-DRW: long-tailed classification with the label-distribution-aware
margin (LDAM) loss on a cosine (normalised) classifier scaled by ``s``, and deferred
re-weighting (DRW) that switches class-balanced weights on late in training; a CIFAR
ResNet trained by SGD with a linear warm-up and step decay.

Source: github.com/kaidic/LDAM-DRW, ``cifar_train.py``, ``losses.py``,
``models/resnet_cifar.py`` and ``imbalance_cifar.py`` at commit
2536330f2afdaa65618323cb5a5850efccce762a (MIT, Copyright (c) 2019 Kaidi Cao). Written anew
from the facts of those files; no code copied.

Kept: the README's LDAM-DRW run (``--loss_type LDAM --train_rule DRW --imb_type exp``):
``ResNet_s(BasicBlock, ...)`` with ``use_norm = loss_type == 'LDAM'``: a 3x3 stem conv (no
bias) + ``BatchNorm2d`` + ``F.relu``, three ``_make_layer`` stages of widths 16/32/64 (strides
1, 2, 2), each ``BasicBlock`` conv3x3 -> BN -> relu -> conv3x3 -> BN, ``out +=
shortcut(x)`` with option A (a ``LambdaLayer`` that subsamples ``x[:, :, ::2, ::2]`` and
zero-pads the channels ``planes // 4`` on each side), relu; ``F.avg_pool2d`` over the last
map, ``view``, and the classifier ``NormedLinear(64, num_classes)`` (a weight ``(in, out)``
drawn ``uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)``, forward
``F.normalize(x, dim=1).mm(F.normalize(weight, dim=0))``); ``_weights_init``
(``kaiming_normal_`` on every ``nn.Linear`` and ``nn.Conv2d``); ``LDAMLoss(cls_num_list,
max_m=0.5, s=30, weight=per_cls_weights)``: margins ``m_j`` proportional to ``n_j ** -1/4``
scaled so the largest is 0.5, subtracted from the target logit only (``scatter_`` one-hot,
``matmul`` of the margins with it, ``torch.where``), then ``F.cross_entropy(s * output,
target, weight)``; the long-tailed train set of ``IMBALANCECIFAR10`` (per class
``img_max * imb_factor ** (i / (C - 1))`` images, ``img_max = len(data) / C``, chosen after
``np.random.seed(rand_number)`` + a shuffle of each class's indices) against the balanced
test set; ``SGD(lr=0.1, momentum=0.9, weight_decay=2e-4)``; ``adjust_learning_rate`` once per
epoch (``epoch + 1`` below the warm-up: ``lr * (epoch + 1) / warmup``; past the first
drop ``lr * 0.01``, past the second ``lr * 0.0001``); per epoch DRW's ``idx = epoch //
drw_epoch``, ``betas = [0, 0.9999]``, ``effective_num = 1 - beta ** n_j``,
``per_cls_weights = (1 - beta) / effective_num`` normalised to sum to ``C``, and the
criterion built anew with them; ``train``: ``model.train()``, per batch forward /
criterion / ``zero_grad`` / ``backward`` / ``step`` with the running loss and top-1;
``validate``: ``model.eval()`` + ``torch.no_grad()``, top-1 and the per-class accuracy from
``confusion_matrix``; the best top-1 kept (the checkpoint, in memory). The train transform
``RandomCrop(size, padding)`` + ``ToTensor`` + ``Normalize``, the test transform without
the crop; a shuffled train loader of 128, an unshuffled test loader of 100.
Shrunk: scikit-learn's 8x8 digits (one channel, 1,437 train / 360 test, so ``img_max`` 143
and, at the README's ``imb_factor=0.01``, 143 images of class 0 down to 1 of class 9)
instead of 32x32 CIFAR-10; one ``BasicBlock`` per stage (a ResNet-8) instead of five
(ResNet-32); ``RandomCrop(8, padding=1)`` instead of ``(32, padding=4)``, no horizontal flip
(a mirrored digit is another glyph); 40 epochs instead of 200, with the schedule's
milestones scaled alike: warm-up 2 epochs instead of 5, DRW and the first LR drop at epoch
32 instead of 160, the second at 36 instead of 180. No log files, TensorBoard or
checkpoints on disk. ``torch.where`` gets a bool mask (the uint8 mask of the PyTorch 1.2 era
is an error in current PyTorch); ``torch.cuda.FloatTensor`` becomes the CPU tensor.
Measure only (not in the program): the last ``validate``'s top-1 and the mean accuracy of
the three rarest classes (7, 8, 9), read from its per-class accuracies.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the first epoch's criterion (LDAM without weights), the optimizer and the data
splits (the long-tailed train set, the balanced test set), ``nndx.Monitor`` around the
epochs, each batch's loss and accuracy logged, each ``validate``'s loss and top-1 logged as
``split="val"``; after training ``nndx.probe(..., monitor=mon)`` with the last criterion
(DRW's weights on) and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import confusion_matrix
from torch import nn
from torch.nn import Parameter
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ldam_drw"
SOURCE = Source("kaidic/LDAM-DRW", "cifar_train.py", "2536330f2afdaa65618323cb5a5850efccce762a", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the README's LDAM-DRW run (shrunk: long-tailed 8x8 digits, ResNet-8, 40 epochs)"),
        Variant(
            "plain_linear_classifier",
            "the model built with use_norm=False (the plain nn.Linear head) while the loss stays LDAMLoss(s=30): "
            "the scale meant for cosine logits in [-1, 1] multiplies unbounded logits",
            (C.WRONG_OUTPUT_ACTIVATION, C.EXPLODING_GRADIENTS),
            ("https://github.com/kaidic/LDAM-DRW/issues/20",
             "https://github.com/cvqluu/Angular-Penalty-Softmax-Losses-Pytorch/issues/3",
             "https://github.com/ronghuaiyang/arcface-pytorch/issues/68"),
            Measure("test_accuracy", "final validate() top-1 at least 0.1 below the healthy run's: 0.169 buggy "
                    "(the training loss erratic between 16 and 280) against 0.786 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "scale_s_dropped",
            "LDAMLoss returns F.cross_entropy(output, target, weight) without the s * (the user who asked why the "
            "logits are multiplied by 30): cosine logits in [-1, 1] reach the softmax unscaled, so no class can get "
            "a confident probability and the loss has a high floor",
            (C.WRONG_LOSS, C.UNDERFITTING),
            ("https://github.com/kaidic/LDAM-DRW/issues/13",
             "https://github.com/arthurdouillard/incremental_learning.pytorch/issues/37",
             "https://github.com/layumi/Person_reID_baseline_pytorch/issues/304"),
            Measure("test_accuracy", "final validate() top-1 at least 0.1 below the healthy run's: 0.369 buggy "
                    "(the training loss stuck near 1.6) against 0.786 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

# the README's arguments (cifar_train.py defaults), and the shrink
LR, MOMENTUM, WEIGHT_DECAY, BATCH_SIZE = 0.1, 0.9, 2e-4, 128
IMB_TYPE, IMB_FACTOR, RAND_NUMBER = "exp", 0.01, 0
MAX_M, S = 0.5, 30
EPOCHS, WARMUP, DRW_EPOCH, DROP1, DROP2 = 40, 2, 32, 32, 36  # 200, 5, 160, 160, 180 in cifar_train.py
SIZE, PAD = 8, 1
NUM_CLASSES = 10
TAIL = (7, 8, 9)


# --------------------------------------------------------------------------- models/resnet_cifar.py


def _weights_init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        nn.init.kaiming_normal_(m.weight)


class NormedLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = Parameter(torch.Tensor(in_features, out_features))
        self.weight.data.uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1).mm(F.normalize(self.weight, dim=0))


class LambdaLayer(nn.Module):
    def __init__(self, lambd) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lambd(x)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes:  # option A
            pad = planes // 4
            self.shortcut = LambdaLayer(lambda x: F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, pad, pad), "constant", 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class ResNet_s(nn.Module):  # noqa: N801 - the source's name
    def __init__(self, block, num_blocks, num_classes: int = 10, use_norm: bool = False, in_channels: int = 1) -> None:
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._make_layer(block, 16, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 32, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, 64, num_blocks[2], stride=2)
        self.linear: nn.Module = NormedLinear(64, num_classes) if use_norm else nn.Linear(64, num_classes)
        self.apply(_weights_init)

    def _make_layer(self, block, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.avg_pool2d(out, out.size()[3])
        out = out.view(out.size(0), -1)
        return self.linear(out)


def resnet8(num_classes: int = 10, use_norm: bool = False) -> ResNet_s:
    return ResNet_s(BasicBlock, [1, 1, 1], num_classes=num_classes, use_norm=use_norm)  # [5, 5, 5]: resnet32


# --------------------------------------------------------------------------- losses.py


class LDAMLoss(nn.Module):
    def __init__(self, cls_num_list, max_m: float = 0.5, weight: torch.Tensor | None = None, s: float = 30,
                 scale_dropped: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.scale_dropped = scale_dropped
        m_list = 1.0 / np.sqrt(np.sqrt(cls_num_list))
        m_list = m_list * (max_m / np.max(m_list))
        self.m_list = torch.FloatTensor(m_list)
        assert s > 0
        self.s = s
        self.weight = weight

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        index = torch.zeros_like(x, dtype=torch.bool)
        index.scatter_(1, target.data.view(-1, 1), True)
        index_float = index.type(torch.FloatTensor)
        batch_m = torch.matmul(self.m_list[None, :], index_float.transpose(0, 1))
        batch_m = batch_m.view((-1, 1))
        x_m = x - batch_m
        output = torch.where(index, x_m, x)
        if self.scale_dropped:  # the bug
            return F.cross_entropy(output, target, weight=self.weight)
        return F.cross_entropy(self.s * output, target, weight=self.weight)


# --------------------------------------------------------------------------- imbalance_cifar.py (the data)


def long_tailed(images: torch.Tensor, labels: torch.Tensor, imb_factor: float, rand_number: int):
    """IMBALANCECIFAR10's get_img_num_per_cls('exp') + gen_imbalanced_data on the digits."""
    rng = np.random.RandomState(rand_number)
    img_max = len(labels) / NUM_CLASSES
    img_num_per_cls = [int(img_max * (imb_factor ** (i / (NUM_CLASSES - 1.0)))) for i in range(NUM_CLASSES)]
    targets_np = labels.numpy()
    new_data, new_targets, num_per_cls = [], [], {}
    for the_class, the_img_num in zip(np.unique(targets_np), img_num_per_cls):
        idx = np.where(targets_np == the_class)[0]
        rng.shuffle(idx)
        selec_idx = idx[:the_img_num]
        num_per_cls[int(the_class)] = len(selec_idx)
        new_data.append(images[selec_idx])
        new_targets.extend([int(the_class)] * len(selec_idx))
    cls_num_list = [num_per_cls[i] for i in range(NUM_CLASSES)]
    return torch.cat(new_data), torch.tensor(new_targets), cls_num_list


class Digits(Dataset):
    """The digits as the repository's CIFAR datasets with its transforms; the random crop
    draws from the dataset's own generator."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float, train: bool,
                 generator: torch.Generator | None = None) -> None:  # fmt: skip
        self.images, self.labels, self.train, self.generator = images, labels, train, generator
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = self.images[i]
        if self.train:  # RandomCrop(SIZE, padding=PAD)
            padded = F.pad(img, (PAD, PAD, PAD, PAD))
            top, left = torch.randint(0, 2 * PAD + 1, (2,), generator=self.generator).tolist()
            img = padded[:, top : top + SIZE, left : left + SIZE]
        return (img - self.mean) / self.std, self.labels[i]  # ToTensor(), Normalize(mean, std)


# --------------------------------------------------------------------------- cifar_train.py


def adjust_learning_rate(optimizer: torch.optim.Optimizer, epoch: int) -> None:
    epoch = epoch + 1
    if epoch <= WARMUP:
        lr = LR * epoch / WARMUP
    elif epoch > DROP2:
        lr = LR * 0.0001
    elif epoch > DROP1:
        lr = LR * 0.01
    else:
        lr = LR
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def drw_weights(epoch: int, cls_num_list: list[int]) -> torch.Tensor:
    idx = epoch // DRW_EPOCH
    betas = [0, 0.9999]
    effective_num = 1.0 - np.power(betas[idx], cls_num_list)
    per_cls_weights = (1.0 - betas[idx]) / np.array(effective_num)
    per_cls_weights = per_cls_weights / np.sum(per_cls_weights) * len(cls_num_list)
    return torch.FloatTensor(per_cls_weights)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    lt_raw, lt_labels, cls_num_list = long_tailed(train_raw, train_labels, IMB_FACTOR, RAND_NUMBER)
    x_lt, x_test = data.to_tensor(lt_raw), data.to_tensor(test_raw)
    mean, std = float(x_lt.mean()), float(x_lt.std())  # the Normalize constants, from the train images
    train_dataset = Digits(x_lt, lt_labels, mean, std, train=True, generator=torch.Generator().manual_seed(seed))
    val_dataset = Digits(x_test, test_labels, mean, std, train=False)
    train_loader = DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    val_loader = DataLoader(val_dataset, batch_size=100, shuffle=False)

    use_norm = variant != "plain_linear_classifier"  # the program: use_norm = loss_type == 'LDAM'
    model = resnet8(num_classes=NUM_CLASSES, use_norm=use_norm)
    optimizer = torch.optim.SGD(model.parameters(), LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    splits = ((x_lt - mean) / std, lt_labels, (x_test - mean) / std, test_labels)
    first = torch.randperm(len(lt_labels), generator=torch.Generator().manual_seed(seed + 1))[:BATCH_SIZE]
    first_batch = (splits[0][first], lt_labels[first])
    no_s = variant == "scale_s_dropped"
    criterion = LDAMLoss(cls_num_list=cls_num_list, max_m=MAX_M, s=S, weight=drw_weights(0, cls_num_list),
                         scale_dropped=no_s)  # fmt: skip
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5)

    best_acc1 = 0.0
    history: dict[str, list] = {"train_loss": [], "val_loss": [], "val_acc": [], "cls_acc": []}

    def train_epoch(criterion: nn.Module) -> None:
        model.train()
        total, n = 0.0, 0
        for inp, target in train_loader:
            output = model(inp)
            loss = criterion(output, target)
            acc1 = (output.argmax(1) == target).float().mean()
            total += loss.item() * inp.size(0)
            n += inp.size(0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss, accuracy=acc1)
        history["train_loss"].append(total / n)

    def validate(criterion: nn.Module) -> float:
        model.eval()
        all_preds, all_targets = [], []
        total, n, correct = 0.0, 0, 0
        with torch.no_grad():
            for inp, target in val_loader:
                output = model(inp)
                loss = criterion(output, target)
                total += loss.item() * inp.size(0)
                n += inp.size(0)
                _, pred = torch.max(output, 1)
                correct += (pred == target).sum().item()
                all_preds.extend(pred.numpy())
                all_targets.extend(target.numpy())
        cf = confusion_matrix(all_targets, all_preds, labels=list(range(NUM_CLASSES))).astype(float)
        cls_acc = np.diag(cf) / np.maximum(cf.sum(axis=1), 1)
        top1 = correct / n
        history["val_loss"].append(total / n)
        history["val_acc"].append(top1)
        history["cls_acc"].append(cls_acc)
        mon.log(total / n, split="val", accuracy=top1)
        return top1

    for epoch in range(EPOCHS):
        adjust_learning_rate(optimizer, epoch)
        per_cls_weights = drw_weights(epoch, cls_num_list)  # train_rule == 'DRW'
        criterion = LDAMLoss(cls_num_list=cls_num_list, max_m=MAX_M, s=S, weight=per_cls_weights, scale_dropped=no_s)
        train_epoch(criterion)
        acc1 = validate(criterion)
        if acc1 > best_acc1:  # save_checkpoint(is_best): kept in memory
            best_acc1 = acc1
            _best_state = copy.deepcopy(model.state_dict())

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    cls_acc = history["cls_acc"][-1]
    return {
        "test_accuracy": history["val_acc"][-1],
        "best_accuracy": best_acc1,
        "tail_accuracy": float(np.mean([cls_acc[c] for c in TAIL])),
        "head_accuracy": float(np.mean(cls_acc[:3])),
        "final_train_loss": history["train_loss"][-1],
        "final_val_loss": history["val_loss"][-1],
    }

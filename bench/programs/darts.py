"""Port of quark0/darts (CNN search): a DARTS supernet whose mixed edges weight eight candidate
operations by ``softmax(alpha)``, the network weights trained by SGD on one half of the
training set and the architecture parameters by their own Adam on the other half.

Source: github.com/quark0/darts, ``cnn/train_search.py``, ``cnn/architect.py``,
``cnn/model_search.py``, ``cnn/operations.py`` and ``cnn/genotypes.py`` at commit
f276dd346a09ae3160f8e3aca5c7b193fda1da37 (Apache-2.0, Copyright (c) 2018 Hanxiao Liu).
Written anew from the facts of those files; no code copied.

Kept: ``OPS`` (none/``Zero``, 3x3 max and avg pooling (``count_include_pad=False``), skip
(``Identity`` or ``FactorizedReduce`` when strided), ``SepConv`` 3x3 and 5x5, ``DilConv``
3x3 and 5x5, each ReLU-conv-BN with ``affine=False`` in the search); ``MixedOp`` (a pooling
op followed by ``BatchNorm2d(affine=False)``; ``sum(w * op(x))``); ``Cell`` (``preprocess0``
a ``FactorizedReduce`` after a reduction cell, else ``ReLUConvBN`` 1x1, ``preprocess1``
``ReLUConvBN`` 1x1; ``steps`` intermediate nodes, each the sum of the mixed ops on every
earlier state, stride 2 on the two inputs of a reduction cell; the last ``multiplier``
states concatenated); ``Network`` (stem conv3x3 without bias + BN at ``stem_multiplier * C``
channels, reduction cells at ``layers//3`` and ``2*layers//3`` doubling the width,
``softmax(alphas_reduce | alphas_normal, dim=-1)`` per cell, global average pooling,
``Linear``; ``_loss`` through its own criterion; ``alphas_*`` = ``1e-3 * randn(k, 8)``
tensors with ``requires_grad``, *not* registered parameters, so ``model.parameters()`` is
the weights alone; ``genotype()`` parsing the two strongest non-``none`` edges per node);
``Architect`` first order (``unrolled=False``, the default): ``Adam(arch_parameters,
lr=3e-4, betas=(0.5, 0.999), weight_decay=1e-3)``, ``step`` = ``zero_grad``, the model's
own loss on a search batch, ``backward``, ``step``; ``train_search.py``: ``SGD(lr=0.025,
momentum=0.9, weight_decay=3e-4)`` over ``model.parameters()``, ``CosineAnnealingLR(epochs,
eta_min=0.001)`` stepped at the start of each epoch (before training, as the program
does), ``train_portion`` 0.5 (the first half of the training indices feeds the weights,
the second half the architecture, each through a ``SubsetRandomSampler``), per step
``model.train()``, a search batch drawn by ``next(iter(valid_queue))``, ``architect.step``,
``optimizer.zero_grad()``, ``criterion(model(input), target)``, ``backward``,
``clip_grad_norm_(model.parameters(), 5)``, ``optimizer.step()``; ``infer`` on the search
half with ``model.eval()``; top-1 accuracy.
Shrunk: scikit-learn's 8x8 digits, one channel, normalised with their mean/std, instead of
32x32 CIFAR-10 (the stem takes 1 channel, not 3); ``init_channels`` 4 instead of 16,
``layers`` 3 instead of 8 (cells: normal, reduction, reduction), ``steps`` 2 and
``multiplier`` 2 instead of 4 and 4; batch 64; 6 epochs instead of 50; no cutout, logging,
checkpoints or CUDA; the 1,437 training digits split in halves (718 / 719) and 360 digits
kept aside as a test set for the measure.
Measure only (not in the program): the test-set accuracy of the searched supernet (eval
mode), and how far the architecture moved (the mean absolute change of
``softmax(alpha)``).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the weight optimizer and the two halves as the data splits; ``nndx.Monitor(model,
optimizer)`` over the network and its SGD (the architecture parameters are plain tensors
outside ``model.parameters()``, so there is no module/optimizer pair to give their Adam),
the criterion as ``mon.loss_fn`` in the weight step, each step's loss and accuracy logged
and each ``infer``'s loss and accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "darts"
SOURCE = Source("quark0/darts", "cnn/train_search.py", "f276dd346a09ae3160f8e3aca5c7b193fda1da37", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (first-order search, shrunk: 8x8 digits, 3 cells, 6 epochs)"),
        Variant(
            "zero_grad_dropped",
            "optimizer.zero_grad() left out of train(): the weights' .grad is never cleared, so each SGD step follows "
            "the sum of every earlier step's training gradient and of every architect step's validation gradient "
            "(the architect's backward reaches the weights too)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/automl/ConfigurableOptimizer/pull/173",
             "https://github.com/piergiaj/pytorch-i3d/issues/57",
             "https://github.com/meta-pytorch/torchforge/pull/71"),
            Measure("alpha_shift", "the architecture barely moves: mean |change of softmax(alpha)| under 0.6x the "
                    "healthy run's (0.0005 against 0.0015 on seed 0; the weights, fitted to the search half as "
                    "well, leave the architect's validation loss nothing to teach; test accuracy rises, 0.975 "
                    "against 0.869, from the extra data and the summed steps)",
                    lambda healthy, buggy: buggy < 0.6 * healthy),
        ),
        Variant(
            "train_mode_not_restored",
            "model.train() left out of train(): after the first infer() calls model.eval(), every later epoch "
            "trains weights and architecture in eval mode (the affine-free BatchNorms normalise with the running "
            "averages of epoch 0 and stop updating them)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/tutorials/issues/1624", "https://github.com/wkentaro/pytorch-fcn/pull/56",
             "https://github.com/joeynmt/joeynmt/issues/184"),
            Measure("test_acc", "supernet test accuracy at least 0.05 below the healthy run's (0.753 against "
                    "0.869 on seed 0)", lambda healthy, buggy: buggy < healthy - 0.05),
        ),
    )
}

ARGS = {"batch_size": 64, "learning_rate": 0.025, "learning_rate_min": 0.001, "momentum": 0.9, "weight_decay": 3e-4,
        "epochs": 6, "init_channels": 4, "layers": 3, "grad_clip": 5.0, "train_portion": 0.5,
        "arch_learning_rate": 3e-4, "arch_weight_decay": 1e-3}  # fmt: skip
STEPS, MULTIPLIER, STEM_MULTIPLIER = 2, 2, 3
CLASSES = 10

# --------------------------------------------------------------------------- genotypes.py / operations.py

PRIMITIVES = ["none", "max_pool_3x3", "avg_pool_3x3", "skip_connect", "sep_conv_3x3", "sep_conv_5x5",
              "dil_conv_3x3", "dil_conv_5x5"]  # fmt: skip


class ReLUConvBN(nn.Module):
    def __init__(self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, affine: bool = True) -> None:
        super().__init__()
        self.op = nn.Sequential(nn.ReLU(inplace=False),
                                nn.Conv2d(C_in, C_out, kernel_size, stride=stride, padding=padding, bias=False),
                                nn.BatchNorm2d(C_out, affine=affine))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class DilConv(nn.Module):
    def __init__(self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, dilation: int,
                 affine: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.op = nn.Sequential(
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_in, kernel_size, stride=stride, padding=padding, dilation=dilation, groups=C_in,
                      bias=False),
            nn.Conv2d(C_in, C_out, kernel_size=1, padding=0, bias=False),
            nn.BatchNorm2d(C_out, affine=affine),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class SepConv(nn.Module):
    def __init__(self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, affine: bool = True) -> None:
        super().__init__()
        self.op = nn.Sequential(
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_in, kernel_size, stride=stride, padding=padding, groups=C_in, bias=False),
            nn.Conv2d(C_in, C_in, kernel_size=1, padding=0, bias=False),
            nn.BatchNorm2d(C_in, affine=affine),
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_in, kernel_size, stride=1, padding=padding, groups=C_in, bias=False),
            nn.Conv2d(C_in, C_out, kernel_size=1, padding=0, bias=False),
            nn.BatchNorm2d(C_out, affine=affine),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Zero(nn.Module):
    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            return x.mul(0.0)
        return x[:, :, :: self.stride, :: self.stride].mul(0.0)


class FactorizedReduce(nn.Module):
    def __init__(self, C_in: int, C_out: int, affine: bool = True) -> None:
        super().__init__()
        assert C_out % 2 == 0
        self.relu = nn.ReLU(inplace=False)
        self.conv_1 = nn.Conv2d(C_in, C_out // 2, 1, stride=2, padding=0, bias=False)
        self.conv_2 = nn.Conv2d(C_in, C_out // 2, 1, stride=2, padding=0, bias=False)
        self.bn = nn.BatchNorm2d(C_out, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], dim=1))


OPS = {
    "none": lambda C, stride, affine: Zero(stride),
    "avg_pool_3x3": lambda C, stride, affine: nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False),
    "max_pool_3x3": lambda C, stride, affine: nn.MaxPool2d(3, stride=stride, padding=1),
    "skip_connect": lambda C, stride, affine: Identity() if stride == 1 else FactorizedReduce(C, C, affine=affine),
    "sep_conv_3x3": lambda C, stride, affine: SepConv(C, C, 3, stride, 1, affine=affine),
    "sep_conv_5x5": lambda C, stride, affine: SepConv(C, C, 5, stride, 2, affine=affine),
    "dil_conv_3x3": lambda C, stride, affine: DilConv(C, C, 3, stride, 2, 2, affine=affine),
    "dil_conv_5x5": lambda C, stride, affine: DilConv(C, C, 5, stride, 4, 2, affine=affine),
}

# --------------------------------------------------------------------------- model_search.py


class MixedOp(nn.Module):
    def __init__(self, C: int, stride: int) -> None:
        super().__init__()
        self._ops = nn.ModuleList()
        for primitive in PRIMITIVES:
            op = OPS[primitive](C, stride, False)
            if "pool" in primitive:
                op = nn.Sequential(op, nn.BatchNorm2d(C, affine=False))
            self._ops.append(op)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return sum(w * op(x) for w, op in zip(weights, self._ops))


class Cell(nn.Module):
    def __init__(self, steps: int, multiplier: int, C_prev_prev: int, C_prev: int, C: int, reduction: bool,
                 reduction_prev: bool) -> None:  # fmt: skip
        super().__init__()
        self.reduction = reduction
        if reduction_prev:
            self.preprocess0 = FactorizedReduce(C_prev_prev, C, affine=False)
        else:
            self.preprocess0 = ReLUConvBN(C_prev_prev, C, 1, 1, 0, affine=False)
        self.preprocess1 = ReLUConvBN(C_prev, C, 1, 1, 0, affine=False)
        self._steps, self._multiplier = steps, multiplier
        self._ops = nn.ModuleList()
        for i in range(self._steps):
            for j in range(2 + i):
                stride = 2 if reduction and j < 2 else 1
                self._ops.append(MixedOp(C, stride))

    def forward(self, s0: torch.Tensor, s1: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        states = [self.preprocess0(s0), self.preprocess1(s1)]
        offset = 0
        for _ in range(self._steps):
            s = sum(self._ops[offset + j](h, weights[offset + j]) for j, h in enumerate(states))
            offset += len(states)
            states.append(s)
        return torch.cat(states[-self._multiplier :], dim=1)


class Network(nn.Module):
    def __init__(self, C: int, num_classes: int, layers: int, criterion: nn.Module, steps: int = STEPS,
                 multiplier: int = MULTIPLIER, stem_multiplier: int = STEM_MULTIPLIER, in_channels: int = 1) -> None:  # fmt: skip
        super().__init__()
        self._C, self._num_classes, self._layers = C, num_classes, layers
        self._criterion = criterion
        self._steps, self._multiplier = steps, multiplier
        C_curr = stem_multiplier * C
        self.stem = nn.Sequential(nn.Conv2d(in_channels, C_curr, 3, padding=1, bias=False), nn.BatchNorm2d(C_curr))
        C_prev_prev, C_prev, C_curr = C_curr, C_curr, C
        self.cells = nn.ModuleList()
        reduction_prev = False
        for i in range(layers):
            if i in [layers // 3, 2 * layers // 3]:
                C_curr *= 2
                reduction = True
            else:
                reduction = False
            cell = Cell(steps, multiplier, C_prev_prev, C_prev, C_curr, reduction, reduction_prev)
            reduction_prev = reduction
            self.cells += [cell]
            C_prev_prev, C_prev = C_prev, multiplier * C_curr
        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(C_prev, num_classes)
        self._initialize_alphas()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        s0 = s1 = self.stem(input)
        for cell in self.cells:
            weights = F.softmax(self.alphas_reduce if cell.reduction else self.alphas_normal, dim=-1)
            s0, s1 = s1, cell(s0, s1, weights)
        out = self.global_pooling(s1)
        return self.classifier(out.view(out.size(0), -1))

    def _loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._criterion(self(input), target)

    def _initialize_alphas(self) -> None:
        k = sum(1 for i in range(self._steps) for _ in range(2 + i))
        num_ops = len(PRIMITIVES)
        # plain tensors (the original's Variable(..., requires_grad=True)): not in model.parameters()
        self.alphas_normal = (1e-3 * torch.randn(k, num_ops)).requires_grad_(True)
        self.alphas_reduce = (1e-3 * torch.randn(k, num_ops)).requires_grad_(True)
        self._arch_parameters = [self.alphas_normal, self.alphas_reduce]

    def arch_parameters(self) -> list[torch.Tensor]:
        return self._arch_parameters

    def genotype(self) -> tuple[list, list]:
        def _parse(weights: np.ndarray) -> list[tuple[str, int]]:
            gene, n, start = [], 2, 0
            none = PRIMITIVES.index("none")
            for i in range(self._steps):
                W = weights[start : start + n].copy()
                edges = sorted(range(i + 2), key=lambda x: -max(W[x][k] for k in range(len(W[x])) if k != none))[:2]
                for j in edges:
                    k_best = max((k for k in range(len(W[j])) if k != none), key=lambda k: W[j][k])
                    gene.append((PRIMITIVES[k_best], j))
                start += n
                n += 1
            return gene

        with torch.no_grad():
            return (_parse(F.softmax(self.alphas_normal, dim=-1).numpy()),
                    _parse(F.softmax(self.alphas_reduce, dim=-1).numpy()))  # fmt: skip


# --------------------------------------------------------------------------- architect.py (first order)


class Architect:
    def __init__(self, model: Network, args: dict) -> None:
        self.network_momentum = args["momentum"]
        self.network_weight_decay = args["weight_decay"]
        self.model = model
        self.optimizer = torch.optim.Adam(self.model.arch_parameters(), lr=args["arch_learning_rate"],
                                          betas=(0.5, 0.999), weight_decay=args["arch_weight_decay"])  # fmt: skip

    def step(self, input_valid: torch.Tensor, target_valid: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = self.model._loss(input_valid, target_valid)
        loss.backward()
        self.optimizer.step()


# --------------------------------------------------------------------------- train_search.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    np.random.seed(seed)
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = digits.digit_images(seed=seed)
    x_all = digits.to_tensor(train_raw)
    mean, std = x_all.mean(), x_all.std()  # Normalize(mean, std) of the training images
    x_all = (x_all - mean) / std
    x_test = (digits.to_tensor(test_raw) - mean) / std
    train_data = TensorDataset(x_all, train_labels)

    criterion = nn.CrossEntropyLoss()
    model = Network(args["init_channels"], CLASSES, args["layers"], criterion)
    optimizer = torch.optim.SGD(model.parameters(), args["learning_rate"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"])  # fmt: skip

    num_train = len(train_data)
    indices = list(range(num_train))
    split = int(np.floor(args["train_portion"] * num_train))
    gen = torch.Generator().manual_seed(seed)
    train_queue = DataLoader(train_data, batch_size=args["batch_size"],
                             sampler=SubsetRandomSampler(indices[:split], generator=gen))  # fmt: skip
    valid_queue = DataLoader(train_data, batch_size=args["batch_size"],
                             sampler=SubsetRandomSampler(indices[split:num_train], generator=gen))  # fmt: skip
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, float(args["epochs"]),
                                                           eta_min=args["learning_rate_min"])  # fmt: skip
    architect = Architect(model, args)
    alphas_start = [F.softmax(a.detach(), dim=-1).clone() for a in model.arch_parameters()]

    bs = args["batch_size"]
    first_batch = (x_all[:bs], train_labels[:bs])
    splits = (x_all[:split], train_labels[:split], x_all[split:], train_labels[split:])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)
    restore_train_mode = variant != "train_mode_not_restored"
    zero_grad = variant != "zero_grad_dropped"

    def train_epoch() -> tuple[float, float]:
        correct, total, loss_sum = 0, 0, 0.0
        for step, (input, target) in enumerate(train_queue):
            if restore_train_mode:
                model.train()
            n = input.size(0)
            input_search, target_search = next(iter(valid_queue))  # a random search batch, with replacement
            architect.step(input_search, target_search)
            if zero_grad:
                optimizer.zero_grad()
            logits = model(input)
            loss = mon.loss_fn(logits, target)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), args["grad_clip"])
            optimizer.step()
            prec1 = (logits.argmax(1) == target).float().mean().item()
            mon.log(loss, accuracy=prec1)
            correct += prec1 * n
            total += n
            loss_sum += loss.item() * n
        return correct / total, loss_sum / total

    def infer(x: torch.Tensor, y: torch.Tensor, log: bool) -> tuple[float, float]:
        model.eval()
        with torch.no_grad():
            logits = model(x)
            loss = criterion(logits, y).item()
            acc = (logits.argmax(1) == y).float().mean().item()
        if log:
            mon.log(loss, split="val", accuracy=acc)
        return acc, loss

    train_acc = train_obj = valid_acc = valid_obj = float("nan")
    for _epoch in range(args["epochs"]):
        scheduler.step()  # at the epoch's start, as the program does
        train_acc, train_obj = train_epoch()
        valid_acc, valid_obj = infer(x_all[split:], train_labels[split:], log=True)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)

    test_acc, test_loss = infer(x_test, test_labels, log=False)
    alphas_end = [F.softmax(a.detach(), dim=-1) for a in model.arch_parameters()]
    alpha_shift = float(np.mean([(e - s).abs().mean().item() for s, e in zip(alphas_start, alphas_end)]))
    return {"train_acc": train_acc, "train_loss": train_obj, "valid_acc": valid_acc, "valid_loss": valid_obj,
            "test_acc": test_acc, "test_loss": test_loss, "alpha_shift": alpha_shift,
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip

"""Port of Raschka-research-group/coral-cnn: CORAL, rank-consistent ordinal regression with a ResNet
whose last layer is one shared weight vector plus K-1 independent biases.

Source: github.com/Raschka-research-group/coral-cnn, ``model-code/afad-coral.py`` at commit
726e54579db008d9c16868fa76b2292b9dec9fbc (MIT, Copyright (c) 2019 Sebastian Raschka). Written
anew from the facts of that file; no code copied.

Kept: the dataset's ``__getitem__`` returning ``(img, label, levels)`` with ``levels = [1]*label
+ [0]*(NUM_CLASSES - 1 - label)`` as float32; ``BasicBlock`` (two bias-free 3x3 convs, each
followed by ``BatchNorm2d``, ReLU(inplace) after the first and after the residual sum, a 1x1
conv + BN downsample when the shape changes); ``ResNet`` (7x7 stride-2 bias-free conv, BN,
ReLU, 3x3 stride-2 max pool, four stages of ``BasicBlock``, ``AvgPool2d``, flatten, ``fc =
nn.Linear(.., 1, bias=False)`` plus ``linear_1_bias = nn.Parameter(torch.zeros(NUM_CLASSES-1))``,
``logits = fc(x) + linear_1_bias``, ``probas = sigmoid(logits)``, ``forward`` returning
``(logits, probas)``; convs initialised N(0, sqrt(2/n)) with n = k*k*out_channels, BN weight 1
and bias 0); ``cost_fn(logits, levels, imp)`` = mean over the batch of ``-sum_k
(logsigmoid(logits)*levels + (logsigmoid(logits) - logits)*(1-levels))*imp``, with ``imp`` all
ones (``--imp_weight 0``, the default); ``Adam(model.parameters(), lr=0.0005)``; the loop:
``model.train()``, per batch ``logits, probas = model(features)``, ``cost = cost_fn(...)``,
``zero_grad`` / ``backward`` / ``step``; per epoch ``model.eval()`` and, under
``torch.set_grad_enabled(False)``, ``compute_mae_and_mse`` on the valid split (predicted label
= number of ``probas > 0.5``; MAE and MSE, RMSE = sqrt(MSE)); the best-valid-MAE model kept
(``torch.save`` of its state dict there, an in-memory copy here) and, after training, reloaded
and scored on the test split; shuffle for the train loader only.
Shrunk: scikit-learn's 8x8 digits (1,437 train; the 360 held out split into 180 valid and
180 test) as the faces, each drawn on a 32x32 canvas at one of 10 sizes (12 to 30 pixels a
side) at a random place, the size rank 0..9 the ordinal 'age' label (NUM_CLASSES 10 instead
of AFAD's 26 ages 15..40); one channel (the script's ``GRAYSCALE`` switch), pixels in [0, 1]
as ``ToTensor`` gives them (no resize/random crop); ResNet stages of one block each with
widths 16/32/64/128 instead of ResNet-34's (3, 4, 6, 3) blocks at 64/128/256/512, the final
``AvgPool2d`` kernel 1 (the 32x32 input ends at 1x1 where AFAD's 120x120 ends at 4x4, kernel
4); batch 32 instead of 256, 12 epochs instead of 200 (540 steps instead of about 125,000),
so Adam's lr 0.005 instead of 0.0005 (at 0.0005 the nine thresholds, which move about one lr
per step, cannot spread in 540 steps: test MAE 1.9 after 10 epochs); no log files; CPU.
Measure only (not in the program): nothing; the variants are measured by the program's own
numbers, the best model's test MAE and RMSE.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
``(features, levels)`` with the loss ``loss_fn(output, levels) = cost_fn(output[0], levels,
imp)`` (the model returns ``(logits, probas)``), the optimizer and the data splits (images and
their levels); ``nndx.Monitor(model, optimizer, loss_fn=loss_fn)`` around the epochs, the
loop's cost computed as ``mon.loss_fn(model(features), levels)``, every batch's cost logged
and each epoch's valid MAE logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)``
on the same batch and ``nndx.diagnose`` once training ends.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "coral_ordinal"
SOURCE = Source("Raschka-research-group/coral-cnn", "model-code/afad-coral.py",
                "726e54579db008d9c16868fa76b2292b9dec9fbc", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: digits as 10 ordinal ranks, a one-block ResNet)"),
        Variant(
            "probas_into_cost",
            "cost_fn is handed probas, the model's sigmoid outputs, instead of logits: the loss's logsigmoid "
            "applies a second sigmoid, so every task's probability is squeezed into [0.5, 0.73] inside the loss "
            "and its gradient nearly vanishes",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/itakurah/focal-loss-pytorch/pull/5",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/NVIDIA-Merlin/models/pull/1175"),
            Measure("test_mae", "best model's test MAE at least 1.25x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.25 * healthy),
        ),
        Variant(
            "bias_not_parameter",
            "linear_1_bias created as torch.zeros(NUM_CLASSES - 1, requires_grad=True) instead of wrapped in "
            "nn.Parameter: it is not in model.parameters(), so Adam never updates the K-1 thresholds; they stay "
            "0 and every task shares one logit",
            (C.OPTIMIZER_NOT_CONNECTED, C.FROZEN_PARAMETERS),
            ("https://github.com/lululxvi/deepxde/pull/1023",
             "https://github.com/shenweichen/DeepCTR-Torch/pull/61"),
            Measure("test_mae", "best model's test MAE at least 0.5 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
    )
}

NUM_CLASSES, SIDE, GRAYSCALE = 10, 32, True
LEARNING_RATE, NUM_EPOCHS, BATCH_SIZE = 0.005, 12, 32
LAYERS, WIDTHS = (1, 1, 1, 1), (16, 32, 64, 128)
N_VALID = 180


# --------------------------------------------------------------------------- the dataset


def grown_digits(images: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The offline stand-in for AFAD's faces and ages: each 8x8 digit drawn on a 32x32 canvas at
    one of NUM_CLASSES sizes (12, 14, ..., 30 pixels a side, bilinear) at a random position; the
    size rank is the ordinal label, a visible 'age' the digit's identity does not give away.
    (N, 1, 32, 32) in [0, 1] and the labels 0..NUM_CLASSES-1 (int64)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    labels = torch.randint(NUM_CLASSES, (len(images),), generator=gen)
    pixels = data.to_tensor(images)
    canvas = torch.zeros(len(images), 1, SIDE, SIDE)
    for i, label in enumerate(labels.tolist()):
        side = 12 + 2 * label
        drawn = F.interpolate(pixels[i : i + 1], size=(side, side), mode="bilinear", align_corners=False)
        top, left = (int(v) for v in torch.randint(SIDE - side + 1, (2,), generator=gen))
        canvas[i, :, top : top + side, left : left + side] = drawn[0].clamp(0, 1)
    return canvas, labels


def levels_of(labels: torch.Tensor) -> torch.Tensor:
    """The dataset's ``levels = [1]*label + [0]*(NUM_CLASSES - 1 - label)``, per sample."""
    rows = [[1] * int(label) + [0] * (NUM_CLASSES - 1 - int(label)) for label in labels]
    return torch.tensor(rows, dtype=torch.float32)


# --------------------------------------------------------------------------- the model


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


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
        residual = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes: int, grayscale: bool, widths=(64, 128, 256, 512),
                 pool: int = 4, bias_as_parameter: bool = True) -> None:  # fmt: skip
        self.num_classes = num_classes
        self.inplanes = widths[0]
        in_dim = 1 if grayscale else 3
        super().__init__()
        self.conv1 = nn.Conv2d(in_dim, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, widths[0], layers[0])
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
        self.avgpool = nn.AvgPool2d(pool)
        self.fc = nn.Linear(widths[3], 1, bias=False)
        if bias_as_parameter:
            self.linear_1_bias = nn.Parameter(torch.zeros(self.num_classes - 1).float())
        else:  # the bug: a plain tensor, outside model.parameters()
            self.linear_1_bias = torch.zeros(self.num_classes - 1, requires_grad=True)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, (2.0 / n) ** 0.5)
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

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        logits = self.fc(x)
        logits = logits + self.linear_1_bias
        probas = torch.sigmoid(logits)
        return logits, probas


def cost_fn(logits: torch.Tensor, levels: torch.Tensor, imp: torch.Tensor) -> torch.Tensor:
    val = -torch.sum((F.logsigmoid(logits) * levels + (F.logsigmoid(logits) - logits) * (1 - levels)) * imp, dim=1)
    return torch.mean(val)


def compute_mae_and_mse(model: nn.Module, batches) -> tuple[float, float]:
    mae, mse, num_examples = 0.0, 0.0, 0
    for features, targets, _levels in batches:
        _logits, probas = model(features)
        predicted_labels = torch.sum(probas > 0.5, dim=1)
        num_examples += targets.size(0)
        mae += torch.sum(torch.abs(predicted_labels - targets)).item()
        mse += torch.sum((predicted_labels - targets) ** 2).item()
    return mae / num_examples, mse / num_examples


# --------------------------------------------------------------------------- the script


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    train_raw, _digit, held_raw, _held_digit = data.digit_images(seed=seed)
    x_train, train_labels = grown_digits(train_raw, seed)
    x_held, held_labels = grown_digits(held_raw, seed + 1)
    x_valid, valid_labels = x_held[:N_VALID], held_labels[:N_VALID]
    x_test, test_labels = x_held[N_VALID:], held_labels[N_VALID:]
    train_levels, valid_levels = levels_of(train_labels), levels_of(valid_labels)
    test_levels = levels_of(test_labels)

    def loader(x, y, lv, shuffle: bool, generator: torch.Generator | None = None):
        order = torch.randperm(len(y), generator=generator) if shuffle else torch.arange(len(y))
        for start in range(0, len(y), BATCH_SIZE):
            idx = order[start : start + BATCH_SIZE]
            yield x[idx], y[idx], lv[idx]

    imp = torch.ones(NUM_CLASSES - 1, dtype=torch.float)

    torch.manual_seed(seed)
    model = ResNet(BasicBlock, LAYERS, NUM_CLASSES, GRAYSCALE, widths=WIDTHS, pool=1,
                   bias_as_parameter=variant != "bias_not_parameter")  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    def loss_fn(output, levels):
        logits, probas = output
        if variant == "probas_into_cost":
            return cost_fn(probas, levels, imp)
        return cost_fn(logits, levels, imp)

    first_batch = (x_train[:BATCH_SIZE], train_levels[:BATCH_SIZE])
    splits = (x_train, train_levels, x_valid, valid_levels)
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=loss_fn)
    shuffle_gen = torch.Generator().manual_seed(seed)

    best_mae, best_rmse, best_epoch, best_state = 999.0, 999.0, -1, None
    cost_value = float("nan")
    for epoch in range(NUM_EPOCHS):
        model.train()
        for features, _targets, levels in loader(x_train, train_labels, train_levels, True, shuffle_gen):
            output = model(features)
            cost = mon.loss_fn(output, levels)
            optimizer.zero_grad()
            cost.backward()
            optimizer.step()
            cost_value = cost.item()
            nx.timed(lambda: mon.log(cost))  # noqa: B023

        model.eval()
        with torch.set_grad_enabled(False):
            valid_mae, valid_mse = compute_mae_and_mse(model, loader(x_valid, valid_labels, valid_levels, False))
        nx.timed(lambda: mon.log(valid_mae, split="val"))  # noqa: B023
        if valid_mae < best_mae:
            best_mae, best_rmse, best_epoch = valid_mae, valid_mse**0.5, epoch
            best_state = copy.deepcopy(model.state_dict())

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer, data=splits)

    last_valid_mae = valid_mae
    model.load_state_dict(best_state)
    model.eval()
    with torch.set_grad_enabled(False):
        test_mae, test_mse = compute_mae_and_mse(model, loader(x_test, test_labels, test_levels, False))
    return {"test_mae": test_mae, "test_rmse": test_mse**0.5, "best_valid_mae": best_mae,
            "best_valid_rmse": best_rmse, "last_valid_mae": last_valid_mae, "best_epoch": float(best_epoch),
            "final_cost": cost_value}  # fmt: skip

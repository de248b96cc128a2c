"""Port of facebookresearch/ConvNeXt: a ConvNeXt image classifier trained with AdamW, label
smoothing and a per-iteration cosine schedule with linear warmup.

Source: github.com/facebookresearch/ConvNeXt, ``models/convnext.py``, ``main.py``,
``engine.py``, ``optim_factory.py`` and ``utils.py`` at commit
048efcea897d999aed302f2639b6270aedf8d4c8 (MIT, Copyright (c) Meta Platforms, Inc. and
affiliates). Written anew from the facts of those files; no code copied. timm is not
installed: its ``trunc_normal_``, ``DropPath`` and ``LabelSmoothingCrossEntropy`` are
written out here.

Kept: ``Block`` (7x7 depthwise conv with padding 3, permute to (N, H, W, C), ``LayerNorm``
channels-last eps 1e-6, ``pwconv1`` Linear to 4x width, GELU, ``pwconv2`` back, layer
scale ``gamma`` initialised to 1e-6, permute back, ``input + drop_path(x)``);
``ConvNeXt`` (stem: 4x4 stride-4 conv + channels-first ``LayerNorm``; three downsampling
layers channels-first ``LayerNorm`` + 2x2 stride-2 conv; four stages of blocks with drop
path rates rising linearly from 0 to ``drop_path_rate``; global average pooling, final
``nn.LayerNorm``, ``head``; ``trunc_normal_(std=.02)`` weights and zero biases for convs and
linears, ``head_init_scale`` 1); the channels-first ``LayerNorm`` (mean and biased variance
over dim 1); ``optim_factory``'s parameter groups (1-d parameters, biases: no weight decay;
the rest ``weight_decay`` 0.05) under ``AdamW(eps=1e-8)``; ``utils.cosine_scheduler`` (linear
warmup from 0 over ``warmup_epochs * niter_per_ep`` iterations, then cosine to ``min_lr``)
applied per iteration in ``train_one_epoch`` as ``lr_schedule_values[start_steps + step]``
on every param group; ``LabelSmoothingCrossEntropy(smoothing=0.1)`` for training and plain
cross-entropy in ``evaluate`` (``model.eval()``, ``no_grad``, top-1 accuracy); the
non-finite-loss assertion; the best-accuracy bookkeeping.
Shrunk: scikit-learn's 8x8 digits (10 classes, 1,437 train / 360 val) upsampled to 32x32,
3 equal channels, normalised with the ImageNet mean/std (``imagenet_default_mean_and_std``)
instead of ImageNet at 224; ``dims`` (16, 32, 48, 64) and ``depths`` (1, 1, 2, 1) instead of
convnext_tiny's (96, 192, 384, 768) and (3, 3, 9, 3); ``drop_path`` 0.1; batch 64 instead of
4096 (lr 2e-3 instead of 4e-3), 8 epochs with 1 warmup epoch instead of 300 with 20; no
mixup/cutmix, RandAugment, random erasing or model EMA (their defaults need timm); single
process, CPU, no AMP, ``update_freq`` 1.
Measure only (not in the program): nothing; the variants are measured by ``evaluate``'s
top-1 accuracy and loss on the val split.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the optimizer and the data splits; ``nndx.Monitor(model, optimizer)`` around the
epochs with the criterion as ``mon.loss_fn``, each batch's loss and accuracy logged and
each ``evaluate``'s loss and accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
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

NAME = "convnext"
SOURCE = Source("facebookresearch/ConvNeXt", "main.py", "048efcea897d999aed302f2639b6270aedf8d4c8", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (a shrunk convnext, AdamW, cosine schedule with warmup)"),
        Variant(
            "zero_grad_dropped",
            "the optimizer.zero_grad() after each optimizer.step() in train_one_epoch dropped (only the one at the "
            "epoch's start is left): every step's gradient is added to all earlier ones of the epoch, so AdamW "
            "steps along a running sum of stale gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/IDEA-Research/DN-DETR/issues/19", "https://github.com/wenet-e2e/wekws/issues/72",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("val_loss", "final val loss 1.3x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "schedule_by_epoch",
            "train_one_epoch reads lr_schedule_values[epoch] instead of [start_steps + step]: the per-iteration "
            "schedule is indexed by the epoch count, so the LR stays inside the first epoch's warmup ramp "
            "(0 for all of epoch 0, under a third of the base LR at the end) and the cosine decay never comes",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/Vision-CAIR/MiniGPT-4/pull/263",
             "https://github.com/open-mmlab/mmdetection/issues/6785",
             "https://github.com/Tony-Y/pytorch_warmup/issues/14"),
            Measure("val_loss", "final val loss 1.3x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

SIDE = 32
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ARGS = {"batch_size": 64, "epochs": 8, "lr": 2e-3, "min_lr": 1e-6, "warmup_epochs": 1, "weight_decay": 0.05,
        "smoothing": 0.1, "drop_path": 0.1, "layer_scale_init_value": 1e-6, "opt_eps": 1e-8}  # fmt: skip
DEPTHS, DIMS = (1, 1, 2, 1), (16, 32, 48, 64)


# --------------------------------------------------------------------------- timm pieces


def trunc_normal_(tensor: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """Normal(0, std) truncated to [-2, 2] (timm's defaults a=-2, b=2, absolute bounds)."""
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2.0, b=2.0)


def drop_path(x: torch.Tensor, drop_prob: float, training: bool) -> torch.Tensor:
    if drop_prob == 0.0 or not training:
        return x
    keep = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = x.new_empty(shape).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)


class LabelSmoothingCrossEntropy(nn.Module):
    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__()
        self.smoothing, self.confidence = smoothing, 1.0 - smoothing

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logprobs = F.log_softmax(x, dim=-1)
        nll = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
        smooth = -logprobs.mean(dim=-1)
        return (self.confidence * nll + self.smoothing * smooth).mean()


# --------------------------------------------------------------------------- models/convnext.py


class LayerNorm(nn.Module):
    """LayerNorm over the last dim (channels_last) or over dim 1 of (N, C, H, W) (channels_first)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6, data_format: str = "channels_last") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps, self.data_format = eps, data_format
        self.normalized_shape = (normalized_shape,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class Block(nn.Module):
    def __init__(self, dim: int, drop_path: float = 0.0, layer_scale_init_value: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = (nn.Parameter(layer_scale_init_value * torch.ones(dim), requires_grad=True)
                      if layer_scale_init_value > 0 else None)  # fmt: skip
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        x = self.norm(x)
        x = self.pwconv2(self.act(self.pwconv1(x)))
        if self.gamma is not None:
            x = self.gamma * x
        x = x.permute(0, 3, 1, 2)
        return shortcut + self.drop_path(x)


class ConvNeXt(nn.Module):
    def __init__(self, in_chans: int = 3, num_classes: int = 1000, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768),
                 drop_path_rate: float = 0.0, layer_scale_init_value: float = 1e-6, head_init_scale: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        self.downsample_layers = nn.ModuleList()
        self.downsample_layers.append(nn.Sequential(nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
                                                    LayerNorm(dims[0], eps=1e-6, data_format="channels_first")))
        for i in range(3):
            self.downsample_layers.append(nn.Sequential(LayerNorm(dims[i], eps=1e-6, data_format="channels_first"),
                                                        nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2)))
        rates = [r.item() for r in torch.linspace(0, drop_path_rate, sum(depths))]
        self.stages = nn.ModuleList()
        cur = 0
        for i in range(4):
            self.stages.append(nn.Sequential(*[
                Block(dims[i], drop_path=rates[cur + j], layer_scale_init_value=layer_scale_init_value)
                for j in range(depths[i])]))  # fmt: skip
            cur += depths[i]
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)
        self.apply(self._init_weights)
        self.head.weight.data.mul_(head_init_scale)
        self.head.bias.data.mul_(head_init_scale)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            trunc_normal_(m.weight, std=0.02)
            nn.init.constant_(m.bias, 0)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(4):
            x = self.stages[i](self.downsample_layers[i](x))
        return self.norm(x.mean([-2, -1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


# --------------------------------------------------------------------------- optim_factory.py, utils.py


def get_parameter_groups(model: nn.Module, weight_decay: float, skip_list=()) -> list[dict]:
    groups = {"decay": {"weight_decay": weight_decay, "params": [], "lr_scale": 1.0},
              "no_decay": {"weight_decay": 0.0, "params": [], "lr_scale": 1.0}}  # fmt: skip
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        key = "no_decay" if param.ndim == 1 or name.endswith(".bias") or name in skip_list else "decay"
        groups[key]["params"].append(param)
    return list(groups.values())


def cosine_scheduler(base_value: float, final_value: float, epochs: int, niter_per_ep: int, warmup_epochs: int = 0,
                     start_warmup_value: float = 0.0) -> np.ndarray:  # fmt: skip
    warmup_iters = warmup_epochs * niter_per_ep
    warmup = np.linspace(start_warmup_value, base_value, warmup_iters) if warmup_epochs > 0 else np.array([])
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    cosine = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
    schedule = np.concatenate((warmup, cosine))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


# --------------------------------------------------------------------------- main.py / engine.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, train_labels, val_raw, val_labels = data.digit_images(seed=seed)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    x_train = (data.upscaled(train_raw, SIDE).expand(-1, 3, -1, -1) - mean) / std
    x_val = (data.upscaled(val_raw, SIDE).expand(-1, 3, -1, -1) - mean) / std

    model = ConvNeXt(num_classes=10, depths=DEPTHS, dims=DIMS, drop_path_rate=args["drop_path"],
                     layer_scale_init_value=args["layer_scale_init_value"])  # fmt: skip
    optimizer = torch.optim.AdamW(get_parameter_groups(model, args["weight_decay"]), lr=args["lr"],
                                  eps=args["opt_eps"])  # fmt: skip
    criterion = LabelSmoothingCrossEntropy(smoothing=args["smoothing"])
    n_train, bs = len(train_labels), args["batch_size"]
    steps_per_epoch = n_train // bs  # drop_last=True for the train loader
    lr_schedule_values = cosine_scheduler(args["lr"], args["min_lr"], args["epochs"], steps_per_epoch,
                                          warmup_epochs=args["warmup_epochs"])  # fmt: skip

    splits = (x_train, train_labels, x_val, val_labels)
    first_batch = (x_train[:bs], train_labels[:bs])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)
    generator = torch.Generator().manual_seed(seed)

    def train_one_epoch(epoch: int, start_steps: int) -> float:
        model.train(True)
        order = torch.randperm(n_train, generator=generator)
        losses = []
        optimizer.zero_grad()
        for step in range(steps_per_epoch):
            it = epoch if variant == "schedule_by_epoch" else start_steps + step
            for group in optimizer.param_groups:
                group["lr"] = float(lr_schedule_values[it]) * group["lr_scale"]
            idx = order[step * bs : (step + 1) * bs]
            samples, targets = x_train[idx], train_labels[idx]
            output = model(samples)
            loss = mon.loss_fn(output, targets)
            loss_value = loss.item()
            assert math.isfinite(loss_value), f"Loss is {loss_value}, stopping training"
            loss.backward()
            optimizer.step()
            if variant != "zero_grad_dropped":
                optimizer.zero_grad()
            class_acc = (output.max(-1)[-1] == targets).float().mean().item()
            mon.log(loss, accuracy=class_acc)
            losses.append(loss_value)
        return float(np.mean(losses))

    def evaluate() -> tuple[float, float]:
        model.eval()
        total_loss, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(val_labels), bs):
                images, target = x_val[start : start + bs], val_labels[start : start + bs]
                output = model(images)
                total_loss += F.cross_entropy(output, target).item() * len(target)
                correct += (output.argmax(-1) == target).sum().item()
        acc, loss = correct / len(val_labels), total_loss / len(val_labels)
        mon.log(loss, split="val", accuracy=acc)
        return acc, loss

    max_accuracy = 0.0
    train_loss = acc1 = val_loss = float("nan")
    for epoch in range(args["epochs"]):
        train_loss = train_one_epoch(epoch, epoch * steps_per_epoch)
        acc1, val_loss = evaluate()
        max_accuracy = max(max_accuracy, acc1)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"val_acc1": acc1, "val_loss": val_loss, "max_accuracy": max_accuracy, "train_loss": train_loss,
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip

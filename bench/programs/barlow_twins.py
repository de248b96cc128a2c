"""Port of facebookresearch/barlowtwins: Barlow Twins, two distorted views through one backbone +
projector, the cross-correlation matrix of the batch-normalised embeddings pushed to the identity,
trained with LARS under warmup + cosine.

Source: github.com/facebookresearch/barlowtwins, ``main.py`` at commit
8e8d284ca0bc02f88b92328e53f9b901e86b4a3c (MIT, Copyright (c) Facebook, Inc. and its affiliates).
Written anew from the facts of that file; no code copied.

Kept: ``BarlowTwins``: a backbone whose ``fc`` is ``nn.Identity``, the projector built from
``sizes = [features] + projector`` as (Linear without bias -> BatchNorm1d -> ReLU) for every size but
the last, then a Linear without bias; ``self.bn = BatchNorm1d(sizes[-1], affine=False)``; ``forward(y1,
y2)``: ``c = bn(z1).T @ bn(z2)`` divided by ``args.batch_size`` (the all_reduce over GPUs is a no-op on
one process), ``on_diag = (diag(c) - 1)^2`` summed, ``off_diag`` the squares of ``off_diagonal(c)`` (the
flatten / view(n - 1, n + 1) trick) summed, ``loss = on_diag + lambd * off_diag`` with ``lambd`` 0.0051;
the parameter groups (weights: ``ndim != 1``; biases and BN parameters: ``ndim == 1``); ``LARS`` (momentum
0.9, eta 0.001, ``weight_decay`` 1e-6 with ``weight_decay_filter`` and ``lars_adaptation_filter`` excluding
1-D parameters, the trust ratio ``eta * ||p|| / ||dp||`` where both norms are positive, the momentum
buffer ``mu``, ``p -= lr * mu``), created with ``lr=0``; ``adjust_learning_rate`` per step (``base_lr =
batch_size / 256``, linear warmup over the first epochs' steps, then cosine from ``base_lr`` to ``base_lr *
0.001``, times ``learning_rate_weights`` 0.2 for the weights group and ``learning_rate_biases`` 0.0048 for
the biases group); the loop (``step`` counted across epochs as ``enumerate(loader, start=epoch *
len(loader))``, ``adjust_learning_rate``, ``zero_grad``, ``loss = model.forward(y1, y2)``, backward,
step, a stats dict every ``print_freq`` steps); the loader without ``drop_last``; ``Transform`` and
``transform_prime`` (``RandomResizedCrop``, ``RandomHorizontalFlip``, ``ColorJitter(0.4, 0.4, 0.2, 0.1)`` with
p 0.8, ``RandomGrayscale`` 0.2, ``GaussianBlur`` with p 1.0 / 0.1 and sigma uniform in [0.1, 2.0],
``Solarization`` with p 0.0 / 0.2, ``Normalize``).
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out), one grey channel (so the
saturation, hue and grayscale steps are no-ops), normalised with the grey mean/std 0.449/0.226, instead of
ImageNet; a 3-conv backbone (16/32/64 channels, BN + ReLU, strides 1/2/2, global average pool: 64
features) instead of ResNet-50 (2048); projector ``128-128-128`` instead of ``8192-8192-8192``; batch 128
instead of 2048 (base_lr 0.5); 25 epochs with 2 of warmup instead of 1000 with 10; ``RandomResizedCrop``
scale (0.3, 1) instead of (0.08, 1) (an 8% crop of an 8x8 digit is a pixel) and bilinear instead of
bicubic, the blur a 3-tap kernel, every distortion batched; CPU float32 (no GradScaler/autocast); one
process, no SyncBatchNorm/DDP, no checkpoints.
Added, as the SimSiam/MoCo CIFAR demos do: a kNN monitor after each epoch (``model.eval()``, a weighted
kNN, k 20, t 0.1, on the normalised backbone features of the held-out images against the training
images), with ``model.train()`` at the start of each epoch.

Measure only (not in the program): the last kNN monitor accuracy; a linear probe (logistic
regression, LBFGS) on the frozen backbone features (both near 0.94 already for the untrained net on
digits, so they hardly separate variants); the kNN accuracy of distorted held-out views (``transform``)
against the clean training bank (0.30 untrained), which asks for the invariance the method learns; and
the held-out objective: main.py's loss, with the batch-normalised embeddings and batch statistics, on
distorted pairs of the 360 held-out images (a copy of the model in train mode).

nndx, as the author would add it: the model returns its loss, so the preflight ``nndx.probe`` gets the
first batch's two views as ``((y1, y2), None)`` and ``loss_fn = lambda loss, _: loss``, with the LARS
optimizer; ``nndx.Monitor(model, optimizer)`` around the loop with each step's loss logged; then
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.simsiam import knn_acc, linear_probe
from nndx.report import CauseCode as C

NAME = "barlow_twins"
SOURCE = Source("facebookresearch/barlowtwins", "main.py", "8e8d284ca0bc02f88b92328e53f9b901e86b4a3c", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (main.py defaults, shrunk)"),
        Variant(
            "no_bn_before_correlation",
            "forward computes c = z1.T @ z2 / batch_size from the raw projector outputs, without the "
            "affine-free BatchNorm1d: c is no longer a correlation matrix, so pushing it to the identity "
            "does not decorrelate (standardise) the features",
            (C.WRONG_LOSS,),
            ("https://github.com/galilai-group/stable-pretraining/pull/34",
             "https://github.com/lightly-ai/lightly/pull/1806",
             "https://github.com/pytorch-lifestream/pytorch-lifestream/issues/79"),
            Measure("heldout_loss", "the Barlow Twins objective as main.py defines it, on distorted pairs of "
                    "the held-out images, at least 1.3x the healthy run's (58.0 against 33.4 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "train_mode_not_restored",
            "the epoch loop lacks its model.train(), so after the first kNN monitor's model.eval() every "
            "epoch trains in eval mode: the backbone's, projector's and the loss's BatchNorm layers normalise "
            "with running statistics instead of the batch's",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/zcao0420/MOFormer/issues/12",
             "https://github.com/facebookresearch/tacto/issues/25",
             "https://github.com/milesial/Pytorch-UNet/issues/31"),
            Measure("distorted_knn", "kNN accuracy of distorted held-out views against the clean training "
                    "bank at least 0.05 below the healthy run's (0.30, the untrained net's, against 0.42 on seed 0)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

SIZE = 8
MEAN, STD = 0.449, 0.226
ARGS = {"epochs": 25, "warmup_epochs": 2, "batch_size": 128, "learning_rate_weights": 0.2,
        "learning_rate_biases": 0.0048, "weight_decay": 1e-6, "lambd": 0.0051, "projector": "128-128-128",
        "print_freq": 10}  # fmt: skip


# --------------------------------------------------------------------------- the model


class Backbone(nn.Module):
    """The ResNet-50 stand-in: three conv + BN + ReLU stages and a global average pool; ``fc`` is
    set to ``nn.Identity`` by the caller, as main.py does."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.fc = nn.Linear(64, 1000)
        self.num_features = 64

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def off_diagonal(x: torch.Tensor) -> torch.Tensor:
    n, m = x.shape
    assert n == m
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


class BarlowTwins(nn.Module):
    def __init__(self, args: dict, normalise: bool = True) -> None:
        super().__init__()
        self.args = args
        self.normalise = normalise  # the bug when False: no self.bn before the correlation
        self.backbone = Backbone()
        self.backbone.fc = nn.Identity()
        sizes = [self.backbone.num_features] + [int(s) for s in args["projector"].split("-")]
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 2):
            layers += [nn.Linear(sizes[i], sizes[i + 1], bias=False), nn.BatchNorm1d(sizes[i + 1]), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(sizes[-2], sizes[-1], bias=False))
        self.projector = nn.Sequential(*layers)
        self.bn = nn.BatchNorm1d(sizes[-1], affine=False)

    def forward(self, y1: torch.Tensor, y2: torch.Tensor) -> torch.Tensor:
        z1 = self.projector(self.backbone(y1))
        z2 = self.projector(self.backbone(y2))
        c = self.bn(z1).T @ self.bn(z2) if self.normalise else z1.T @ z2
        c.div_(self.args["batch_size"])
        # torch.distributed.all_reduce(c): one process
        on_diag = torch.diagonal(c).add_(-1).pow_(2).sum()
        off_diag = off_diagonal(c).pow_(2).sum()
        return on_diag + self.args["lambd"] * off_diag


class LARS(optim.Optimizer):
    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001, weight_decay_filter=False,
                 lars_adaptation_filter=False) -> None:  # fmt: skip
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta,
                        weight_decay_filter=weight_decay_filter, lars_adaptation_filter=lars_adaptation_filter)
        super().__init__(params, defaults)

    @staticmethod
    def exclude_bias_and_norm(p: torch.Tensor) -> bool:
        return p.ndim == 1

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                dp = p.grad
                if dp is None:
                    continue
                if not g["weight_decay_filter"] or not self.exclude_bias_and_norm(p):
                    dp = dp.add(p, alpha=g["weight_decay"])
                if not g["lars_adaptation_filter"] or not self.exclude_bias_and_norm(p):
                    param_norm, update_norm = torch.norm(p), torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0.0,
                                    torch.where(update_norm > 0, g["eta"] * param_norm / update_norm, one), one)
                    dp = dp.mul(q)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(g["momentum"]).add_(dp)
                p.add_(mu, alpha=-g["lr"])


def adjust_learning_rate(args: dict, optimizer, steps_per_epoch: int, step: int) -> None:
    max_steps = args["epochs"] * steps_per_epoch
    warmup_steps = args["warmup_epochs"] * steps_per_epoch
    base_lr = args["batch_size"] / 256
    if step < warmup_steps:
        lr = base_lr * step / warmup_steps
    else:
        step -= warmup_steps
        max_steps -= warmup_steps
        q = 0.5 * (1 + math.cos(math.pi * step / max_steps))
        end_lr = base_lr * 0.001
        lr = base_lr * q + end_lr * (1 - q)
    optimizer.param_groups[0]["lr"] = lr * args["learning_rate_weights"]
    optimizer.param_groups[1]["lr"] = lr * args["learning_rate_biases"]


# --------------------------------------------------------------------------- Transform (batched)


def _u(n: int, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen)


def distort(imgs: torch.Tensor, gen: torch.Generator, blur_p: float, solarize_p: float) -> torch.Tensor:
    """One of main.py's two Compose pipelines on a batch of (N, 1, 8, 8) images in [0, 1]."""
    n = imgs.shape[0]
    # RandomResizedCrop(scale=(0.3, 1)) + RandomHorizontalFlip
    area = _u(n, 0.3, 1.0, gen)
    aspect = _u(n, math.log(3 / 4), math.log(4 / 3), gen).exp()
    w, h = (area * aspect).sqrt().clamp(max=1.0), (area / aspect).sqrt().clamp(max=1.0)
    cx, cy = (1 - w) * _u(n, -1, 1, gen), (1 - h) * _u(n, -1, 1, gen)
    flip = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w * flip, cx, h, cy
    grid = F.affine_grid(theta, list(imgs.shape), align_corners=False)
    x = F.grid_sample(imgs, grid, mode="bilinear", padding_mode="border", align_corners=False)
    # RandomApply(ColorJitter(brightness=0.4, contrast=0.4, ...), p=0.8): grey, so saturation/hue do nothing
    jitter = (torch.rand(n, generator=gen) < 0.8).view(n, 1, 1, 1)
    b, c = _u(n, 0.6, 1.4, gen).view(n, 1, 1, 1), _u(n, 0.6, 1.4, gen).view(n, 1, 1, 1)
    bright_first = (torch.rand(n, generator=gen) < 0.5).view(n, 1, 1, 1)

    def brightness(t):
        return (t * b).clamp(0, 1)

    def contrast(t):
        return (c * t + (1 - c) * t.mean(dim=(1, 2, 3), keepdim=True)).clamp(0, 1)

    jittered = torch.where(bright_first, contrast(brightness(x)), brightness(contrast(x)))
    x = torch.where(jitter, jittered, x)
    # GaussianBlur(p): sigma uniform in [0.1, 2.0], a 3-tap separable kernel
    sigma = _u(n, 0.1, 2.0, gen).view(n, 1)
    taps = torch.exp(-torch.tensor([-1.0, 0.0, 1.0]).view(1, 3) ** 2 / (2 * sigma**2))
    taps = taps / taps.sum(dim=1, keepdim=True)
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    kernel = (taps[:, :, None] * taps[:, None, :]).unsqueeze(1)  # (N, 1, 3, 3)
    blurred = F.conv2d(padded.view(1, n, SIZE + 2, SIZE + 2), kernel, groups=n).view(n, 1, SIZE, SIZE)
    x = torch.where((torch.rand(n, generator=gen) < blur_p).view(n, 1, 1, 1), blurred, x)
    # Solarization(p): ImageOps.solarize inverts the pixels at or above the threshold (128 of 255)
    solarized = torch.where(x >= 0.5, 1.0 - x, x)
    x = torch.where((torch.rand(n, generator=gen) < solarize_p).view(n, 1, 1, 1), solarized, x)
    return (x - MEAN) / STD  # ToTensor (already), Normalize


def transform_pair(imgs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``Transform.__call__``: ``transform`` (blur 1.0, solarize 0.0) and ``transform_prime`` (0.1, 0.2)."""
    return distort(imgs, gen, 1.0, 0.0), distort(imgs, gen, 0.1, 0.2)


# --------------------------------------------------------------------------- measure / monitor


@torch.no_grad()
def backbone_features(model: BarlowTwins, x: torch.Tensor) -> torch.Tensor:
    return model.backbone(x)


@torch.no_grad()
def heldout_barlow_loss(model: BarlowTwins, pictures: torch.Tensor, seed: int) -> float:
    """The Barlow Twins objective as main.py defines it (batch-normalised embeddings, batch statistics)
    on distorted pairs of the held-out images, on a copy of the model in train mode."""
    twin = copy.deepcopy(model).train()
    twin.normalise = True
    gen = torch.Generator().manual_seed(7_000 + seed)
    y1, y2 = transform_pair(pictures, gen)
    twin.args = dict(twin.args, batch_size=len(pictures))
    return float(twin(y1, y2))


@torch.no_grad()
def distorted_knn(model: BarlowTwins, memory, memory_labels, pictures, labels, seed: int) -> float:
    """kNN accuracy of distorted held-out views (``transform``) against the clean training bank."""
    model.eval()
    gen = torch.Generator().manual_seed(8_000 + seed)
    views = distort(pictures, gen, 1.0, 0.0)
    return knn_acc(backbone_features(model, memory), memory_labels, backbone_features(model, views), labels)


def knn_monitor(model: BarlowTwins, memory, memory_labels, test, test_labels) -> float:
    model.eval()
    return knn_acc(backbone_features(model, memory), memory_labels, backbone_features(model, test), test_labels)


# --------------------------------------------------------------------------- main_worker


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)

    model = BarlowTwins(args, normalise=variant != "no_bn_before_correlation")
    param_weights, param_biases = [], []
    for param in model.parameters():
        (param_biases if param.ndim == 1 else param_weights).append(param)
    parameters = [{"params": param_weights}, {"params": param_biases}]
    optimizer = LARS(parameters, lr=0, weight_decay=args["weight_decay"], weight_decay_filter=True,
                     lars_adaptation_filter=True)  # fmt: skip

    loader_gen = torch.Generator().manual_seed(seed + 1)
    aug_gen = torch.Generator().manual_seed(seed + 2)
    steps_per_epoch = math.ceil(len(train_x) / args["batch_size"])  # no drop_last

    probe_views = transform_pair(train_x[: args["batch_size"]], torch.Generator().manual_seed(seed + 3))
    probe_batch = (probe_views, None)

    def barlow_loss(loss, _target):
        return loss

    nx.preflight(model, probe_batch, barlow_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    memory, test_in = (train_x - MEAN) / STD, (test_x - MEAN) / STD
    stats: list[dict] = []
    knn_accs: list[float] = []
    losses: list[float] = []
    for epoch in range(args["epochs"]):
        if variant != "train_mode_not_restored":
            model.train()
        order = torch.randperm(len(train_x), generator=loader_gen)
        for i in range(steps_per_epoch):
            step = epoch * steps_per_epoch + i
            idx = order[i * args["batch_size"] : (i + 1) * args["batch_size"]]
            y1, y2 = transform_pair(train_x[idx], aug_gen)
            adjust_learning_rate(args, optimizer, steps_per_epoch, step)
            optimizer.zero_grad()
            loss = model.forward(y1, y2)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
            if step % args["print_freq"] == 0:
                stats.append(dict(epoch=epoch, step=step, lr_weights=optimizer.param_groups[0]["lr"],
                                  lr_biases=optimizer.param_groups[1]["lr"], loss=loss.item()))  # fmt: skip
        knn_accs.append(knn_monitor(model, memory, train_labels, test_in, test_labels))
    nx.finish(mon, model, probe_batch, barlow_loss, optimizer=optimizer)

    model.eval()
    bank, feats = backbone_features(model, memory), backbone_features(model, test_in)
    return {
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-steps_per_epoch:])),
        "knn_acc": knn_accs[-1],
        "linear_acc": linear_probe(bank, train_labels, feats, test_labels),
        "distorted_knn": distorted_knn(model, memory, train_labels, test_x, test_labels, seed),
        "heldout_loss": heldout_barlow_loss(model, test_x, seed),
    }

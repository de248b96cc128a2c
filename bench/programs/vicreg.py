"""Port of facebookresearch/vicreg: VICReg, two augmented views through one backbone + expander,
trained with the invariance / variance / covariance loss under LARS with warmup + cosine.

Source: github.com/facebookresearch/vicreg, ``main_vicreg.py`` and ``augmentations.py`` at commit
4e12602fd495af83efd1631fbe82523e6db092e0 (MIT, Copyright (c) Meta Platforms, Inc. and affiliates).
Written anew from the facts of those files; no code copied.

Kept: ``VICReg``: a backbone returning its pooled features and the ``Projector`` (the expander) built
from ``f"{embedding}-{mlp}"`` as (Linear with bias -> BatchNorm1d -> ReLU(True)) for every size but the
last, then a Linear without bias; ``forward(x, y)``: both views through backbone + projector,
``repr_loss = F.mse_loss(x, y)``, both centred on the batch mean, ``std = sqrt(var(dim=0) + 0.0001)``,
``std_loss = mean(relu(1 - std_x)) / 2 + mean(relu(1 - std_y)) / 2``, ``cov = x.T @ x / (batch_size -
1)``, ``cov_loss`` the squared off-diagonal (the flatten / view(n - 1, n + 1) trick) summed and divided
by ``num_features``, for both views; ``loss = 25 * repr_loss + 25 * std_loss + 1 * cov_loss`` (the
FullGatherLayer is the identity on one process); ``LARS(model.parameters(), lr=0, weight_decay=1e-6,
weight_decay_filter=exclude_bias_and_norm, lars_adaptation_filter=exclude_bias_and_norm)`` (momentum
0.9, eta 0.001, the trust ratio ``eta * ||p|| / ||dp||`` where both norms are positive, the ``mu``
buffer, ``p -= lr * mu``); ``adjust_learning_rate`` every step (``base_lr * batch_size / 256``, linear
warmup over the first ``10 * len(loader)`` steps, then cosine to ``base_lr * 0.001``, the same LR for
every group); the loop (``step`` counted from ``epoch * len(loader)``, ``adjust_learning_rate``,
``zero_grad``, ``loss = model.forward(x, y)``, backward, step, a stats line); ``TrainTransform``
(``transform``: RandomResizedCrop, flip, ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8, RandomGrayscale
0.2, GaussianBlur p 1.0, Solarization p 0.0, Normalize; ``transform_prime``: blur p 0.1, solarization
p 0.2) - the batched version of ``bench.programs.barlow_twins`` is used, as Barlow Twins' and VICReg's
``augmentations`` are the same pipeline.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out), one grey channel, instead of
ImageNet; a 3-conv backbone (16/32/64 channels, BN + ReLU, strides 1/2/2, average pooled: 64 features)
instead of ResNet-50 (2048); ``mlp`` ``128-128-128`` instead of ``8192-8192-8192``; batch 128 instead
of 2048; ``base_lr`` 3.0 instead of 0.2 (LR 1.5 instead of 0.4 at batch 2048: at 0.2 the healthy run's
loss falls only from 22.1 to 20.2 in 20 epochs and the probes do not move); 25 epochs with 2 of warmup
instead of 100 with 10;
RandomResizedCrop scale (0.3, 1) (an 8% crop of an 8x8 digit is a pixel); CPU float32 (no
GradScaler/autocast), one process, no SyncBatchNorm/DDP, no checkpoints.

Measure only (not in the program): ``evaluate.py``'s linear evaluation in small: a logistic
regression (LBFGS) on the frozen backbone features of the training images, accuracy on the held-out
images (``linear_acc``; already ~0.9 for an untrained conv net on digits) and on distorted views of the
held-out images (``distorted_linear_acc``, ``transform``; it asks for the invariance VICReg learns);
the mean per-dimension std of the held-out embeddings divided by their overall std
(``embedding_std``: near 1 when every dimension varies across images, near 0 when the embeddings
collapse, what VICReg's variance term prevents); the same linear probe on the held-out embeddings
(``embedding_linear_acc``).

nndx, as the author would add it: the model returns its loss, so the preflight ``nndx.probe`` gets the
first batch's two views as ``((x, y), None)`` and ``loss_fn = lambda loss, _: loss``, with the LARS
optimizer; ``nndx.Monitor(model, optimizer)`` around the loop with each step's loss logged; then
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.barlow_twins import MEAN, STD, distort, transform_pair
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.simsiam import linear_probe
from nndx.report import CauseCode as C

NAME = "vicreg"
SOURCE = Source("facebookresearch/vicreg", "main_vicreg.py", "4e12602fd495af83efd1631fbe82523e6db092e0", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (main_vicreg.py defaults, shrunk)"),
        Variant(
            "variance_over_features",
            "std_x = sqrt(x.var(dim=1) + 0.0001): the variance term measured across each embedding's "
            "features instead of across the batch for each feature, so it no longer stops the embeddings "
            "of different images from collapsing onto one another",
            (C.WRONG_LOSS,),
            ("https://github.com/facebookresearch/vicreg/issues/14",
             "https://github.com/lightly-ai/lightly/issues/1445",
             "https://github.com/KevinMusgrave/pytorch-metric-learning/pull/470"),
            Measure("embedding_std", "the mean per-dimension std of the held-out embeddings relative to their "
                    "overall std at least 0.3 below the healthy run's (0.21 against 0.92 on seed 0; the probes "
                    "on the backbone hardly move: linear 0.97 against 0.96): the embeddings collapse while the printed loss falls further than the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "lr_never_adjusted",
            "the adjust_learning_rate(...) call left out of the loop: LARS was created with lr=0, so every "
            "step multiplies its update by 0 and the network stays at its initialisation while the loss is "
            "printed every step",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/huggingface/transformers/issues/2331",
             "https://github.com/pytorch/text/issues/671",
             "https://github.com/s920128/NAR-BERT-ASR/issues/3"),
            Measure("distorted_linear_acc", "linear-probe accuracy on distorted held-out views at least 0.05 "
                    "below the healthy run's (0.24 against 0.34 on seed 0; the loss stays at 22.1 against 18.5)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

ARGS = {"epochs": 25, "warmup_epochs": 2, "batch_size": 128, "base_lr": 3.0, "wd": 1e-6, "mlp": "128-128-128",
        "sim_coeff": 25.0, "std_coeff": 25.0, "cov_coeff": 1.0, "log_freq": 10}  # fmt: skip


# --------------------------------------------------------------------------- the model


class Backbone(nn.Module):
    """The ResNet-50 stand-in (``resnet.__dict__[arch]`` returns the net and its embedding size)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


def Projector(args: dict, embedding: int) -> nn.Sequential:  # noqa: N802 - the original's name
    sizes = [int(s) for s in f"{embedding}-{args['mlp']}".split("-")]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 2):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.BatchNorm1d(sizes[i + 1]), nn.ReLU(True)]
    layers.append(nn.Linear(sizes[-2], sizes[-1], bias=False))
    return nn.Sequential(*layers)


def off_diagonal(x: torch.Tensor) -> torch.Tensor:
    n, m = x.shape
    assert n == m
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


class VICReg(nn.Module):
    def __init__(self, args: dict, var_dim: int = 0) -> None:
        super().__init__()
        self.args = args
        self.num_features = int(args["mlp"].split("-")[-1])
        self.backbone, self.embedding = Backbone(), 64
        self.projector = Projector(args, self.embedding)
        self.var_dim = var_dim  # 0 as published; 1 is the variance_over_features bug

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.projector(self.backbone(x))
        y = self.projector(self.backbone(y))
        repr_loss = F.mse_loss(x, y)
        # FullGatherLayer: one process, the identity
        x = x - x.mean(dim=0)
        y = y - y.mean(dim=0)
        std_x = torch.sqrt(x.var(dim=self.var_dim) + 0.0001)
        std_y = torch.sqrt(y.var(dim=self.var_dim) + 0.0001)
        std_loss = torch.mean(F.relu(1 - std_x)) / 2 + torch.mean(F.relu(1 - std_y)) / 2
        cov_x = (x.T @ x) / (self.args["batch_size"] - 1)
        cov_y = (y.T @ y) / (self.args["batch_size"] - 1)
        cov_loss = off_diagonal(cov_x).pow_(2).sum().div(self.num_features) + off_diagonal(cov_y).pow_(2).sum().div(
            self.num_features)
        return self.args["sim_coeff"] * repr_loss + self.args["std_coeff"] * std_loss + self.args["cov_coeff"] * cov_loss


def exclude_bias_and_norm(p: torch.Tensor) -> bool:
    return p.ndim == 1


class LARS(optim.Optimizer):
    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001, weight_decay_filter=None,
                 lars_adaptation_filter=None) -> None:  # fmt: skip
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta,
                        weight_decay_filter=weight_decay_filter, lars_adaptation_filter=lars_adaptation_filter)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                dp = p.grad
                if dp is None:
                    continue
                if g["weight_decay_filter"] is None or not g["weight_decay_filter"](p):
                    dp = dp.add(p, alpha=g["weight_decay"])
                if g["lars_adaptation_filter"] is None or not g["lars_adaptation_filter"](p):
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


def adjust_learning_rate(args: dict, optimizer, steps_per_epoch: int, step: int) -> float:
    max_steps = args["epochs"] * steps_per_epoch
    warmup_steps = args["warmup_epochs"] * steps_per_epoch
    base_lr = args["base_lr"] * args["batch_size"] / 256
    if step < warmup_steps:
        lr = base_lr * step / warmup_steps
    else:
        step -= warmup_steps
        max_steps -= warmup_steps
        q = 0.5 * (1 + math.cos(math.pi * step / max_steps))
        end_lr = base_lr * 0.001
        lr = base_lr * q + end_lr * (1 - q)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    return lr


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def measures(model: VICReg, train_x, train_y, test_x, test_y, seed: int) -> dict[str, float]:
    model.eval()
    bank = model.backbone((train_x - MEAN) / STD)
    feats = model.backbone((test_x - MEAN) / STD)
    views = distort(test_x, torch.Generator().manual_seed(8_000 + seed), 1.0, 0.0)
    view_feats = model.backbone(views)
    emb = model.projector(feats)
    return {
        "linear_acc": linear_probe(bank, train_y, feats, test_y),
        "distorted_linear_acc": linear_probe(bank, train_y, view_feats, test_y),
        "embedding_std": float(emb.std(dim=0).mean() / (emb.std() + 1e-12)),
        "embedding_linear_acc": linear_probe(model.projector(bank), train_y, emb, test_y),
    }


# --------------------------------------------------------------------------- main


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)

    model = VICReg(args, var_dim=1 if variant == "variance_over_features" else 0)
    optimizer = LARS(model.parameters(), lr=0, weight_decay=args["wd"], weight_decay_filter=exclude_bias_and_norm,
                     lars_adaptation_filter=exclude_bias_and_norm)  # fmt: skip

    loader_gen = torch.Generator().manual_seed(seed + 1)  # DistributedSampler(shuffle=True)
    aug_gen = torch.Generator().manual_seed(seed + 2)
    steps_per_epoch = math.ceil(len(train_x) / args["batch_size"])

    probe_views = transform_pair(train_x[: args["batch_size"]], torch.Generator().manual_seed(seed + 3))
    probe_batch = (probe_views, None)

    def vicreg_loss(loss, _target):
        return loss

    nx.preflight(model, probe_batch, vicreg_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    stats: list[dict] = []
    losses: list[float] = []
    model.train()
    for epoch in range(args["epochs"]):
        order = torch.randperm(len(train_x), generator=loader_gen)
        for i in range(steps_per_epoch):
            step = epoch * steps_per_epoch + i
            idx = order[i * args["batch_size"] : (i + 1) * args["batch_size"]]
            x, y = transform_pair(train_x[idx], aug_gen)
            lr = optimizer.param_groups[0]["lr"]
            if variant != "lr_never_adjusted":
                lr = adjust_learning_rate(args, optimizer, steps_per_epoch, step)
            optimizer.zero_grad()
            loss = model.forward(x, y)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
            if step % args["log_freq"] == 0:
                stats.append(dict(epoch=epoch, step=step, loss=loss.item(), lr=lr))
    nx.finish(mon, model, probe_batch, vicreg_loss, optimizer=optimizer)

    out = measures(model, train_x, train_labels, test_x, test_labels, seed)
    out.update(first_loss=float(np.mean(losses[:10])), final_loss=float(np.mean(losses[-steps_per_epoch:])))
    return out

"""Port of lukasruff/Deep-SVDD-PyTorch (One-Class Deep SVDD: a bias-free encoder trained to
pull the representations of normal data towards a fixed centre c).

Source: github.com/lukasruff/Deep-SVDD-PyTorch, ``src/optim/deepSVDD_trainer.py``,
``src/networks/mnist_LeNet.py``, ``src/datasets/mnist.py`` and
``src/datasets/preprocessing.py`` at commit 1901612d595e23675fb75c4ebb563dd0ffebc21e (MIT,
Copyright (c) 2018 Lukas Ruff). Written anew from the facts of those files; no code copied.

Kept: ``MNIST_LeNet`` (conv5x5 pad 2 without bias -> BatchNorm2d(eps=1e-4, affine=False) ->
leaky_relu -> MaxPool2d(2), twice, 8 then 4 channels, then ``fc1`` without bias to
``rep_dim`` 32); ``DeepSVDDTrainer.train``: ``Adam(lr, weight_decay)``, ``MultiStepLR(
milestones, gamma=0.1)`` stepped at the start of every epoch, ``init_center_c`` (``net.eval()``,
the mean of the untrained network's outputs over the train loader, entries within ``eps=0.1``
of zero pushed to ``+-eps``), ``net.train()``, per batch ``zero_grad``, ``dist = sum((out -
c)^2, 1)``, the one-class loss ``mean(dist)``, ``backward``, ``step``; ``test``:
``net.eval()``, ``no_grad``, score = ``dist``, ``roc_auc_score(labels, scores)`` with label 1 for
the outlier classes; the data: train on the normal class only, global contrast
normalisation with the L1 scale per image, then min-max scaling with the normal class's
(min, max) (computed here from the train split, as the pre-computed table was for MNIST).
The README's example run: ``--objective one-class --lr 0.0001 --lr_milestone 50
--batch_size 200 --weight_decay 0.5e-6 --normal_class 3``.
Shrunk: scikit-learn's 8x8 digits upscaled to 28x28 stand in for MNIST (normal class 3:
~145 train images; test: the 360 test digits, ~10% normal); 150 epochs with the milestone
at 50 as in the README, lr 1e-3 (the program's default) instead of the README's 1e-4;
batch 64 instead of 200 (weight decay 0.5e-6 as in the README); no autoencoder pretraining (``--pretrain False``).
Measure only (not in the program): the test AUROC the program logs, and the mean test score
of normal and anomalous digits.

nndx, as the author would add it: a preflight ``nndx.probe`` of the network on the first train
batch, the target the centre c repeated per sample and the loss ``mean(sum((out - c)^2, 1))``
(the one-class objective as a function of output and target); ``nndx.Monitor`` around the
epochs, each batch's loss logged; after training ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deep_svdd"
SOURCE = Source("lukasruff/Deep-SVDD-PyTorch", "src/optim/deepSVDD_trainer.py",
                "1901612d595e23675fb75c4ebb563dd0ffebc21e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (one-class objective; shrunk: 28x28 digits, batch 64)"),
        Variant(
            "bias_terms",
            "the encoder built with bias terms (nn.Conv2d/nn.Linear defaults) and affine BatchNorm: the network can "
            "output the constant c for every input, the loss collapses towards 0 and the scores stop separating "
            "anomalies (hypersphere collapse, Ruff et al. Proposition 2)",
            (C.WRONG_LOSS,),
            ("https://github.com/yzhao062/pyod/issues/385", "https://github.com/yzhao062/pyod/pull/711",
             "https://github.com/nuclearboy95/Anomaly-Detection-PatchSVDD-PyTorch/issues/2"),
            Measure("anomaly_score", "mean test score of the anomalies at least 25% below the healthy run's (the "
                    "hypersphere shrinking: 0.31 against 0.53 on seed 0; the AUROC itself barely moves at this size, "
                    "0.994 against 0.996)", lambda healthy, buggy: not buggy > 0.75 * healthy),
        ),
        Variant(
            "trained_on_all_classes",
            "the train set not subset to the normal class (get_target_label_idx skipped): the hypersphere is fitted "
            "to every digit, anomalies included, so anomalies score as low as the normal class",
            (C.DATA_LEAKAGE, C.LABEL_NOISE),
            ("https://github.com/adaptive-machine-learning/CapyMOA/pull/415",
             "https://github.com/lukasruff/Deep-SVDD-PyTorch/issues/11"),
            Measure("test_auc", "test AUROC at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

normal_class, lr, n_epochs, lr_milestones, batch_size, weight_decay = 3, 1e-3, 150, (50,), 64, 0.5e-6
SIDE = 28


# --------------------------------------------------------------------------- networks/mnist_LeNet.py


class MNIST_LeNet(nn.Module):  # noqa: N801 - the source's name
    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.rep_dim = 32
        self.pool = nn.MaxPool2d(2, 2)
        self.conv1 = nn.Conv2d(1, 8, 5, bias=bias, padding=2)
        self.bn1 = nn.BatchNorm2d(8, eps=1e-04, affine=bias)
        self.conv2 = nn.Conv2d(8, 4, 5, bias=bias, padding=2)
        self.bn2 = nn.BatchNorm2d(4, eps=1e-04, affine=bias)
        self.fc1 = nn.Linear(4 * 7 * 7, self.rep_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.pool(F.leaky_relu(self.bn1(x)))
        x = self.conv2(x)
        x = self.pool(F.leaky_relu(self.bn2(x)))
        x = x.view(x.size(0), -1)
        return self.fc1(x)


# --------------------------------------------------------------------------- datasets


def global_contrast_normalization(x: torch.Tensor) -> torch.Tensor:
    """Per image: subtract the mean over its pixels, divide by the mean absolute value (L1 scale)."""
    x = x - x.mean(dim=(1, 2, 3), keepdim=True)
    return x / x.abs().mean(dim=(1, 2, 3), keepdim=True)


def dataset(seed: int, all_classes: bool = False):
    train_raw, train_y, test_raw, test_y = data.digit_images(seed=seed)
    train_x = global_contrast_normalization(data.upscaled(train_raw, SIDE))
    test_x = global_contrast_normalization(data.upscaled(test_raw, SIDE))
    normal = train_x[train_y == normal_class]
    if all_classes:  # the bug: the train set is every digit, not the normal class's Subset
        lo, hi = normal.min().item(), normal.max().item()
        return (train_x - lo) / (hi - lo), (test_x - lo) / (hi - lo), (test_y != normal_class).long()
    lo, hi = normal.min().item(), normal.max().item()  # the normal class's (min, max) after GCN
    scale = lambda x: (x - lo) / (hi - lo)  # noqa: E731 - transforms.Normalize([min], [max - min])
    return scale(normal), scale(test_x), (test_y != normal_class).long()  # label 1: outlier


# --------------------------------------------------------------------------- optim/deepSVDD_trainer.py


def init_center_c(batches: list[torch.Tensor], net: MNIST_LeNet, eps: float = 0.1) -> torch.Tensor:
    n_samples = 0
    c = torch.zeros(net.rep_dim)
    net.eval()
    with torch.no_grad():
        for inputs in batches:
            outputs = net(inputs)
            n_samples += outputs.shape[0]
            c += torch.sum(outputs, dim=0)
    c /= n_samples
    c[(abs(c) < eps) & (c < 0)] = -eps
    c[(abs(c) < eps) & (c > 0)] = eps
    return c


def one_class_loss(outputs: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The one-class objective as a function of output and target (c, one row per sample)."""
    return torch.mean(torch.sum((outputs - c) ** 2, dim=1))


def test(net: MNIST_LeNet, c: torch.Tensor, test_x: torch.Tensor, labels: torch.Tensor):
    net.eval()
    scores = []
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            outputs = net(test_x[start : start + batch_size])
            scores.append(torch.sum((outputs - c) ** 2, dim=1))
    scores_np = torch.cat(scores).numpy()
    return float(roc_auc_score(labels.numpy(), scores_np)), scores_np


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_x, test_x, test_labels = dataset(seed, all_classes=variant == "trained_on_all_classes")
    gen = torch.Generator().manual_seed(seed)

    def loader() -> list[torch.Tensor]:  # DataLoader(train_set, batch_size, shuffle=True)
        order = torch.randperm(len(train_x), generator=gen)
        return [train_x[order[i : i + batch_size]] for i in range(0, len(order), batch_size)]

    net = MNIST_LeNet(bias=variant == "bias_terms")
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay, amsgrad=False)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(lr_milestones), gamma=0.1)
    c = init_center_c(loader(), net)

    first = train_x[:batch_size]
    probe_batch = (first, c.expand(len(first), -1).clone())
    nx.preflight(net, probe_batch, one_class_loss, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5)

    net.train()
    epoch_losses: list[float] = []
    for _epoch in range(n_epochs):
        scheduler.step()  # at the epoch's start, as the trainer does
        loss_epoch, n_batches = 0.0, 0
        for inputs in loader():
            optimizer.zero_grad()
            outputs = net(inputs)
            dist = torch.sum((outputs - c) ** 2, dim=1)
            loss = torch.mean(dist)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            loss_epoch += loss.item()
            n_batches += 1
        epoch_losses.append(loss_epoch / n_batches)

    nx.finish(mon, net, probe_batch, one_class_loss, optimizer=optimizer)
    auc, scores = test(net, c, test_x, test_labels)
    labels = test_labels.numpy()
    return {
        "test_auc": auc,
        "final_loss": epoch_losses[-1],
        "normal_score": float(scores[labels == 0].mean()),
        "anomaly_score": float(scores[labels == 1].mean()),
    }

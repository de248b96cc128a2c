"""Port of KaiyangZhou/pytorch-center-loss: LeNet++ with a 2-d feature layer, trained with
softmax cross-entropy plus a center loss whose centers have their own optimizer.

Source: github.com/KaiyangZhou/pytorch-center-loss, ``main.py``, ``center_loss.py`` and
``models.py`` at commit 082ffa21c065426843f26129be51bb1cfd554806 (MIT, Copyright (c) 2018
Kaiyang). Written anew from the facts of those files; no code copied.

Kept: ``ConvNet`` (LeNet++: three stages of 5x5 convolutions with padding 2, each
followed by its own PReLU, a 2x2 max-pool after each stage, ``fc1`` to a 2-d feature +
PReLU, ``fc2`` to the logits; ``forward`` returns ``(features, logits)``); ``CenterLoss``
(``centers = Parameter(randn(num_classes, feat_dim))``, the squared distance matrix
``|x|^2 + |c|^2 - 2 x c^T``, masked to each sample's own class, clamped to [1e-12, 1e12],
summed and divided by the batch size); ``main``: ``CrossEntropyLoss``, ``CenterLoss(
feat_dim=2)``, ``SGD(model, lr=lr_model, weight_decay=5e-4, momentum=0.9)``,
``SGD(criterion_cent.parameters(), lr=lr_cent)``, ``StepLR(stepsize, gamma)`` stepped after
each epoch, test every ``eval_freq`` epochs and at the last; ``train``: ``model.train()``,
``loss = xent + weight_cent * cent``, both optimizers' ``zero_grad``, ``backward``, the
model's step, then the centers' gradients multiplied by ``1 / weight_cent`` ("so that
weight_cent does not change the learning of the centers") and the centers' step, the
``AverageMeter``s and the print line every ``print_freq`` batches (kept as a record);
``test``: ``model.eval()``, ``no_grad``, argmax accuracy in percent; lr_cent 0.5,
weight_cent 1, gamma 0.5, batch 128, the MNIST transform ``ToTensor`` + ``Normalize(
(0.1307,), (0.3081,))``.
Shrunk: scikit-learn's 8x8 digits as they are (1,437 train / 360 test) instead of
MNIST's 28x28, so the last pool gives 1x1 instead of 3x3; one convolution (+ PReLU) per
stage instead of two and widths 16/32/64 instead of 32/64/128 (with two per stage the
plain 7-layer stack sat at chance for the few hundred steps there are here); 24 epochs
with ``stepsize`` 8 instead of 100 with 20, ``lr_model`` 0.05 instead of 0.001 (12
batches an epoch instead of 469; at 0.01 the healthy run reaches 0.29 test accuracy);
``eval_freq`` 8; CPU, no plots.
Measure only (not in the program): the intra-class spread of the test features (the mean
distance of a test feature to its class's mean feature, divided by the mean distance
between the class means: scale-free, lower is more compact), beside the program's own
test accuracy.

nndx, as the author would add it: a preflight ``nndx.probe`` of the model on the first
training batch with the program's total loss (``xent(logits) + weight_cent *
center_loss(features)``) as a function of the model's ``(features, logits)`` and the
model's optimizer; ``nndx.Monitor({"model": model, "center_loss": criterion_cent},
[optimizer_model, optimizer_centloss])`` around the epochs (the centers are trained
parameters too, by their own optimizer), each batch's total loss
logged with its batch accuracy; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``. ``test`` computes no loss (an accuracy only), so nothing is logged as
``val``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "center_loss"
SOURCE = Source("KaiyangZhou/pytorch-center-loss", "main.py", "082ffa21c065426843f26129be51bb1cfd554806", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (lr_cent 0.5, weight_cent 1, shrunk)"),
        Variant(
            "scheduler_step_per_batch",
            "scheduler.step() moved from after each epoch into the batch loop: StepLR(stepsize=8, gamma=0.5) halves "
            "the model's LR every 8 batches instead of every 8 epochs, ~1e-12 of it by the end",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/pytorch/pytorch/issues/3814", "https://github.com/Lornatang/SRGAN-PyTorch/issues/1",
             "https://github.com/pytorch/vision/issues/1261"),
            Measure("test_acc", "final test accuracy at least 0.1 below the healthy run's: 0.108 against "
                    "0.828 healthy on seed 0 (spread 0.45 against 0.082)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "cent_zero_grad_missing",
            "optimizer_centloss.zero_grad() left out (only the model's optimizer is zeroed): the centers' "
            "gradients accumulate over every batch and each step moves them by the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://github.com/KaiyangZhou/pytorch-center-loss/issues/11"),
            Measure("spread", "intra-class spread of the test features at least 1.3x the healthy run's: 0.149 "
                    "against 0.082 healthy on seed 0 (test accuracy 0.19 against 0.83)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

SIDE, MEAN, STD = 8, 0.1307, 0.3081
ARGS = {"batch_size": 128, "lr_model": 0.05, "lr_cent": 0.5, "weight_cent": 1.0, "max_epoch": 24, "stepsize": 8,
        "gamma": 0.5, "eval_freq": 8, "print_freq": 5}  # fmt: skip
WIDTHS = (16, 32, 64)


# --------------------------------------------------------------------------- models.py, center_loss.py


class ConvNet(nn.Module):
    """LeNet++ as in the center loss paper (widths shrunk)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        a, b, c = WIDTHS
        self.conv1_1, self.prelu1_1 = nn.Conv2d(1, a, 5, stride=1, padding=2), nn.PReLU()
        self.conv2_1, self.prelu2_1 = nn.Conv2d(a, b, 5, stride=1, padding=2), nn.PReLU()
        self.conv3_1, self.prelu3_1 = nn.Conv2d(b, c, 5, stride=1, padding=2), nn.PReLU()
        self.flat = c * (SIDE // 8) ** 2
        self.fc1, self.prelu_fc1 = nn.Linear(self.flat, 2), nn.PReLU()
        self.fc2 = nn.Linear(2, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1_1(self.conv1_1(x)), 2)
        x = F.max_pool2d(self.prelu2_1(self.conv2_1(x)), 2)
        x = F.max_pool2d(self.prelu3_1(self.conv3_1(x)), 2)
        x = self.prelu_fc1(self.fc1(x.view(-1, self.flat)))
        return x, self.fc2(x)


class CenterLoss(nn.Module):
    """Center loss (Wen et al., ECCV 2016): squared distance of each feature to its class center."""

    def __init__(self, num_classes: int = 10, feat_dim: int = 2) -> None:
        super().__init__()
        self.num_classes, self.feat_dim = num_classes, feat_dim
        self.centers = nn.Parameter(torch.randn(num_classes, feat_dim))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch_size = x.size(0)
        distmat = (x.pow(2).sum(dim=1, keepdim=True).expand(batch_size, self.num_classes)
                   + self.centers.pow(2).sum(dim=1, keepdim=True).expand(self.num_classes, batch_size).t())
        distmat = torch.addmm(distmat, x, self.centers.t(), beta=1, alpha=-2)
        classes = torch.arange(self.num_classes).long()
        mask = labels.unsqueeze(1).expand(batch_size, self.num_classes).eq(classes.expand(batch_size, self.num_classes))
        dist = distmat * mask.float()
        return dist.clamp(min=1e-12, max=1e12).sum() / batch_size


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


# --------------------------------------------------------------------------- main.py


def feature_spread(features: np.ndarray, labels: np.ndarray) -> float:
    classes = sorted(set(labels.tolist()))
    means = np.stack([features[labels == c].mean(0) for c in classes])
    intra = np.mean([np.linalg.norm(features[labels == c] - means[i], axis=1).mean() for i, c in enumerate(classes)])
    between = np.linalg.norm(means[:, None] - means[None], axis=-1)
    return float(intra / between[np.triu_indices(len(classes), 1)].mean())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(1 + seed)  # --seed 1
    num_classes = 10
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train = (data.upscaled(train_raw, SIDE) - MEAN) / STD
    x_test = (data.upscaled(test_raw, SIDE) - MEAN) / STD

    def trainloader():  # DataLoader(shuffle=True, batch_size=128)
        order = torch.randperm(len(x_train))
        for start in range(0, len(order), args["batch_size"]):
            idx = order[start : start + args["batch_size"]]
            yield x_train[idx], train_labels[idx]

    model = ConvNet(num_classes)
    criterion_xent = nn.CrossEntropyLoss()
    criterion_cent = CenterLoss(num_classes=num_classes, feat_dim=2)
    optimizer_model = torch.optim.SGD(model.parameters(), lr=args["lr_model"], weight_decay=5e-04, momentum=0.9)
    optimizer_centloss = torch.optim.SGD(criterion_cent.parameters(), lr=args["lr_cent"])
    scheduler = lr_scheduler.StepLR(optimizer_model, step_size=args["stepsize"], gamma=args["gamma"])

    def total_loss(output: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        features, outputs = output
        return criterion_xent(outputs, labels) + criterion_cent(features, labels) * args["weight_cent"]

    first_batch = (x_train[: args["batch_size"]], train_labels[: args["batch_size"]])
    nx.preflight(model, first_batch, total_loss, optimizer=optimizer_model)
    mon = nx.monitor({"model": model, "center_loss": criterion_cent}, [optimizer_model, optimizer_centloss], every=5)

    log: list[str] = []

    def train_epoch() -> float:
        model.train()
        xent_losses, cent_losses, losses = AverageMeter(), AverageMeter(), AverageMeter()
        for batch_idx, (data_, labels) in enumerate(trainloader()):
            features, outputs = model(data_)
            loss_xent = criterion_xent(outputs, labels)
            loss_cent = criterion_cent(features, labels)
            loss_cent = loss_cent * args["weight_cent"]
            loss = loss_xent + loss_cent
            optimizer_model.zero_grad()
            if variant != "cent_zero_grad_missing":
                optimizer_centloss.zero_grad()
            loss.backward()
            optimizer_model.step()
            for param in criterion_cent.parameters():  # weight_cent must not change the centers' learning
                param.grad.data *= 1.0 / args["weight_cent"]
            optimizer_centloss.step()
            if variant == "scheduler_step_per_batch":
                scheduler.step()
            batch_acc = float((outputs.detach().argmax(1) == labels).float().mean())
            nx.timed(lambda: mon.log(loss, accuracy=batch_acc))
            losses.update(loss.item(), labels.size(0))
            xent_losses.update(loss_xent.item(), labels.size(0))
            cent_losses.update(loss_cent.item(), labels.size(0))
            if (batch_idx + 1) % args["print_freq"] == 0:
                log.append(f"Batch {batch_idx + 1}\t Loss {losses.val:.6f} ({losses.avg:.6f}) XentLoss "
                           f"{xent_losses.val:.6f} ({xent_losses.avg:.6f}) CenterLoss {cent_losses.val:.6f} "
                           f"({cent_losses.avg:.6f})")  # fmt: skip
        return losses.avg

    def test() -> tuple[float, np.ndarray]:
        model.eval()
        with torch.no_grad():
            features, outputs = model(x_test)
        correct = (outputs.argmax(1) == test_labels).sum().item()
        return correct * 100.0 / len(test_labels), features.numpy()

    acc, feats, train_loss = float("nan"), None, float("nan")
    for epoch in range(args["max_epoch"]):
        train_loss = train_epoch()
        if variant != "scheduler_step_per_batch":
            scheduler.step()
        if args["eval_freq"] > 0 and (epoch + 1) % args["eval_freq"] == 0 or (epoch + 1) == args["max_epoch"]:
            acc, feats = test()

    nx.finish(mon, model, first_batch, total_loss, optimizer=optimizer_model)
    return {"test_acc": acc / 100.0, "spread": feature_spread(feats, test_labels.numpy()), "train_loss": train_loss,
            "center_norm": float(criterion_cent.centers.detach().norm(dim=1).mean())}  # fmt: skip

"""Port of PointNet classification (fxia22/pointnet.pytorch): ``PointNetCls`` with the input
and feature transform networks, trained with Adam, StepLR and the NLL of log-softmax outputs.

Source: github.com/fxia22/pointnet.pytorch, ``pointnet/model.py``,
``utils/train_classification.py`` and ``pointnet/dataset.py`` at commit
bafbf401e0af19be3262e448c59313fd2be0e421 (MIT, Copyright (c) 2017 Fei Xia). Written anew
from the facts of those files; no code copied.

Kept: ``STN3d`` (1x1 ``Conv1d`` 3 -> 64 -> 128 -> 1024 with ``BatchNorm1d`` and ``F.relu``,
max over the points, ``Linear`` 1024 -> 512 -> 256 -> 9 with batch norm on the first two,
the flattened identity added, viewed as 3x3) and ``STNkd`` (the same on k channels, k*k
out); ``PointNetfeat`` (``trans = self.stn(x)``, the points transposed, ``torch.bmm`` with
``trans``, transposed back; conv1 + bn1 + relu; with ``feature_transform`` the 64-channel
features multiplied by ``fstn``'s k x k matrix the same way; conv2 + bn2 + relu, conv3 +
bn3 with no relu, max over the points, ``view(-1, 1024)``; returns ``(x, trans,
trans_feat)``); ``PointNetCls`` (fc1 + bn1 + relu, fc2 -> ``Dropout(p=0.3)`` -> bn2 ->
relu, fc3; returns ``(F.log_softmax(x, dim=1), trans, trans_feat)``; an unused ``nn.ReLU``
member as in the original); ``feature_transform_regularizer`` (mean over the batch of
the Frobenius norm of ``A A^T - I``); the dataset's ``__getitem__`` (points resampled
with replacement by ``np.random.choice``, centred, scaled into the unit sphere; for
training, a random rotation in the x-z plane and N(0, 0.02) jitter; the label as a
1-element int64 tensor); ``train_classification.py``'s loop: shuffled train *and* test
loaders; ``Adam(lr=0.001, betas=(0.9, 0.999))``; ``StepLR(step_size=20, gamma=0.5)``
stepped at the *start* of each epoch (before any ``optimizer.step()``, as published);
per batch ``target = target[:, 0]``, ``points.transpose(2, 1)``, ``zero_grad``,
``classifier = classifier.train()``, forward, ``F.nll_loss(pred, target)`` plus
``feature_transform_regularizer(trans_feat) * 0.001`` (``--feature_transform`` on),
``backward``, ``step``, the batch accuracy; every 10 batches one batch of a fresh
iterator over the test loader under ``classifier = classifier.eval()`` (no
``torch.no_grad()``, as published); after training, the accuracy over the whole test
loader under ``eval()``.
Shrunk: ShapeNet/ModelNet (downloaded) replaced by point clouds sampled at run time on 4
surfaces (sphere, cube, cylinder, cone), each stretched by a random factor in
[0.8, 1.2] per axis and turned about y, 384 points a cloud; 240 training and 120 test
clouds; ``num_points`` 64 instead of 2,500; ``batchSize`` 16 instead of 32; every width
divided by 8 (64/128/1024 -> 8/16/128, 512/256 -> 64/32, the feature transform's k 64 ->
8); 12 epochs (180 steps) instead of 250 with ``step_size`` 4 instead of 20 (three
halvings instead of twelve); ``num_workers`` 0; a fixed seed instead of
``random.randint(1, 10000)``. No checkpoints are saved.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(points already transposed to (B, 3, N), ``target[:, 0]``) with the loop's loss (NLL plus
the regulariser, reading the model's tuple output) and the train/test clouds as
``data``; ``nndx.Monitor`` around the loop, ``F.nll_loss`` called as ``mon.loss_fn``, each
batch's loss logged and the in-loop test batch's loss and accuracy logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pointnet"
SOURCE = Source("fxia22/pointnet.pytorch", "utils/train_classification.py",
                "bafbf401e0af19be3262e448c59313fd2be0e421", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--feature_transform on)"),
        Variant(
            "train_mode_not_restored",
            "classifier = classifier.train() left out of the batch loop: after the first in-loop test batch "
            "switches the model to eval(), every later step trains with batch norm on its stale running "
            "statistics and dropout off",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/tutorials/issues/1624", "https://github.com/tk-rusch/coRNN/issues/1",
             "https://github.com/HazyResearch/metal/issues/70"),
            Measure("test_accuracy", "final test accuracy at least 0.1 below the healthy run's (0.74/0.76/0.83 "
                    "healthy, 0.43/0.34/0.25 buggy on seeds 0-2; the test NLL stays near ln 4)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "view_for_transpose",
            "points = points.view(B, 3, N) instead of points.transpose(2, 1): the (B, N, 3) clouds are "
            "reinterpreted, not transposed, so each 'point' the network sees is three consecutive numbers of "
            "the flattened xyz list (coordinates of different points, mixed)",
            (C.WRONG_RESHAPE,),
            ("https://github.com/liuxuexun/RandLA-Net-Pytorch-New/issues/20",
             "https://github.com/torch-points3d/torch-points3d/pull/76",
             "https://github.com/ohtlab/headpose-fsanet-pytorch/issues/10"),
            Measure("test_accuracy", "final test accuracy at least 0.1 below the healthy run's (0.74/0.76/0.83 "
                    "healthy, 0.55/0.60/0.63 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

SHAPES = ("sphere", "cube", "cylinder", "cone")
RAW_POINTS = 384
N_TRAIN, N_TEST = 240, 120
num_points = 64
batchSize = 16
nepoch = 12
STEP_SIZE = 4
feature_transform = True
# the original widths divided by 8
W64, W128, W1024, W512, W256 = 8, 16, 128, 64, 32


# --------------------------------------------------------------------------- model.py


class STN3d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(3, W64, 1)
        self.conv2 = nn.Conv1d(W64, W128, 1)
        self.conv3 = nn.Conv1d(W128, W1024, 1)
        self.fc1 = nn.Linear(W1024, W512)
        self.fc2 = nn.Linear(W512, W256)
        self.fc3 = nn.Linear(W256, 9)
        self.relu = nn.ReLU()
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(W64), nn.BatchNorm1d(W128), nn.BatchNorm1d(W1024)
        self.bn4, self.bn5 = nn.BatchNorm1d(W512), nn.BatchNorm1d(W256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batchsize = x.size()[0]
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.max(x, 2, keepdim=True)[0]
        x = x.view(-1, W1024)
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        x = self.fc3(x)
        iden = torch.from_numpy(np.eye(3).flatten().astype(np.float32)).view(1, 9).repeat(batchsize, 1)
        x = x + iden
        return x.view(-1, 3, 3)


class STNkd(nn.Module):
    def __init__(self, k: int = W64) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(k, W64, 1)
        self.conv2 = nn.Conv1d(W64, W128, 1)
        self.conv3 = nn.Conv1d(W128, W1024, 1)
        self.fc1 = nn.Linear(W1024, W512)
        self.fc2 = nn.Linear(W512, W256)
        self.fc3 = nn.Linear(W256, k * k)
        self.relu = nn.ReLU()
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(W64), nn.BatchNorm1d(W128), nn.BatchNorm1d(W1024)
        self.bn4, self.bn5 = nn.BatchNorm1d(W512), nn.BatchNorm1d(W256)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batchsize = x.size()[0]
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.max(x, 2, keepdim=True)[0]
        x = x.view(-1, W1024)
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        x = self.fc3(x)
        iden = torch.from_numpy(np.eye(self.k).flatten().astype(np.float32)).view(1, self.k * self.k)
        x = x + iden.repeat(batchsize, 1)
        return x.view(-1, self.k, self.k)


class PointNetfeat(nn.Module):
    def __init__(self, global_feat: bool = True, feature_transform: bool = False) -> None:
        super().__init__()
        self.stn = STN3d()
        self.conv1 = nn.Conv1d(3, W64, 1)
        self.conv2 = nn.Conv1d(W64, W128, 1)
        self.conv3 = nn.Conv1d(W128, W1024, 1)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(W64), nn.BatchNorm1d(W128), nn.BatchNorm1d(W1024)
        self.global_feat = global_feat
        self.feature_transform = feature_transform
        if self.feature_transform:
            self.fstn = STNkd(k=W64)

    def forward(self, x: torch.Tensor):
        n_pts = x.size()[2]
        trans = self.stn(x)
        x = torch.bmm(x.transpose(2, 1), trans).transpose(2, 1)
        x = F.relu(self.bn1(self.conv1(x)))
        if self.feature_transform:
            trans_feat = self.fstn(x)
            x = torch.bmm(x.transpose(2, 1), trans_feat).transpose(2, 1)
        else:
            trans_feat = None
        pointfeat = x
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        x = torch.max(x, 2, keepdim=True)[0]
        x = x.view(-1, W1024)
        if self.global_feat:
            return x, trans, trans_feat
        x = x.view(-1, W1024, 1).repeat(1, 1, n_pts)
        return torch.cat([x, pointfeat], 1), trans, trans_feat


class PointNetCls(nn.Module):
    def __init__(self, k: int = 2, feature_transform: bool = False) -> None:
        super().__init__()
        self.feature_transform = feature_transform
        self.feat = PointNetfeat(global_feat=True, feature_transform=feature_transform)
        self.fc1 = nn.Linear(W1024, W512)
        self.fc2 = nn.Linear(W512, W256)
        self.fc3 = nn.Linear(W256, k)
        self.dropout = nn.Dropout(p=0.3)
        self.bn1 = nn.BatchNorm1d(W512)
        self.bn2 = nn.BatchNorm1d(W256)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor):
        x, trans, trans_feat = self.feat(x)
        x = F.relu(self.bn1(self.fc1(x)))
        x = F.relu(self.bn2(self.dropout(self.fc2(x))))
        x = self.fc3(x)
        return F.log_softmax(x, dim=1), trans, trans_feat


def feature_transform_regularizer(trans: torch.Tensor) -> torch.Tensor:
    d = trans.size()[1]
    eye = torch.eye(d)[None, :, :]
    return torch.mean(torch.norm(torch.bmm(trans, trans.transpose(2, 1)) - eye, dim=(1, 2)))


# --------------------------------------------------------------------------- the data (dataset.py, synthetic)


def surface(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points (n, 3) on the surface of a unit ``shape``, y up."""
    if shape == "sphere":
        p = rng.normal(size=(n, 3))
        return p / np.linalg.norm(p, axis=1, keepdims=True)
    if shape == "cube":
        p = rng.uniform(-1, 1, size=(n, 3))
        axis = rng.integers(3, size=n)
        p[np.arange(n), axis] = rng.choice([-1.0, 1.0], size=n)
        return p
    theta = rng.uniform(0, 2 * np.pi, size=n)
    if shape == "cylinder":  # side area 4*pi, caps 2*pi
        side = rng.random(n) < 2 / 3
        r = np.where(side, 1.0, np.sqrt(rng.random(n)))
        y = np.where(side, rng.uniform(-1, 1, size=n), rng.choice([-1.0, 1.0], size=n))
    else:  # cone, apex up, height 2, radius 1: side area pi*sqrt(5), base pi
        side = rng.random(n) < np.sqrt(5) / (1 + np.sqrt(5))
        t = np.sqrt(rng.random(n))  # uniform over the lateral surface
        r = np.where(side, t, np.sqrt(rng.random(n)))
        y = np.where(side, 1 - 2 * t, -1.0)
    return np.stack([r * np.cos(theta), y, r * np.sin(theta)], axis=1)


def make_clouds(count: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The 'files': ``count`` raw clouds, classes in turn, each stretched and turned."""
    rng = np.random.default_rng(seed)
    clouds, labels = [], np.arange(count) % len(SHAPES)
    for label in labels:
        p = surface(SHAPES[label], RAW_POINTS, rng) * rng.uniform(0.8, 1.2, size=3)
        a = rng.uniform(0, 2 * np.pi)
        turn = np.array([[np.cos(a), 0, -np.sin(a)], [0, 1, 0], [np.sin(a), 0, np.cos(a)]])
        clouds.append((p @ turn).astype(np.float32))
    return clouds, labels


class PointClouds(Dataset):
    """``ModelNetDataset``'s ``__getitem__`` on in-memory clouds."""

    def __init__(self, clouds: list[np.ndarray], labels: np.ndarray, npoints: int = 2500,
                 data_augmentation: bool = True) -> None:  # fmt: skip
        self.clouds, self.labels = clouds, labels
        self.npoints, self.data_augmentation = npoints, data_augmentation
        self.classes = list(SHAPES)

    def __getitem__(self, index: int):
        pts = self.clouds[index]
        choice = np.random.choice(len(pts), self.npoints, replace=True)
        point_set = pts[choice, :]
        point_set = point_set - np.expand_dims(np.mean(point_set, axis=0), 0)  # center
        dist = np.max(np.sqrt(np.sum(point_set**2, axis=1)), 0)
        point_set = point_set / dist  # scale
        if self.data_augmentation:
            theta = np.random.uniform(0, np.pi * 2)
            rotation_matrix = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
            point_set[:, [0, 2]] = point_set[:, [0, 2]].dot(rotation_matrix)  # random rotation
            point_set += np.random.normal(0, 0.02, size=point_set.shape)  # random jitter
        point_set = torch.from_numpy(point_set.astype(np.float32))
        cls = torch.from_numpy(np.array([self.labels[index]]).astype(np.int64))
        return point_set, cls

    def __len__(self) -> int:
        return len(self.clouds)


# --------------------------------------------------------------------------- train_classification.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    manual_seed = 1234 + seed  # the original draws random.randint(1, 10000)
    random.seed(manual_seed)
    np.random.seed(manual_seed)
    torch.manual_seed(manual_seed)

    def to_channels(points: torch.Tensor) -> torch.Tensor:
        if variant == "view_for_transpose":
            return points.view(points.size(0), 3, -1)  # the bug: a reinterpretation, not a transpose
        return points.transpose(2, 1)

    dataset = PointClouds(*make_clouds(N_TRAIN, seed), npoints=num_points)
    test_dataset = PointClouds(*make_clouds(N_TEST, seed + 1000), npoints=num_points, data_augmentation=False)
    dataloader = DataLoader(dataset, batch_size=batchSize, shuffle=True, num_workers=0,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip
    testdataloader = DataLoader(test_dataset, batch_size=batchSize, shuffle=True, num_workers=0,
                                generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip
    num_classes = len(dataset.classes)

    classifier = PointNetCls(k=num_classes, feature_transform=feature_transform)
    optimizer = optim.Adam(classifier.parameters(), lr=0.001, betas=(0.9, 0.999))
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=0.5)

    def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
        """The loop's loss on the model's tuple output (for the probes)."""
        pred, _trans, trans_feat = output
        loss = F.nll_loss(pred, target)
        if feature_transform:
            loss = loss + feature_transform_regularizer(trans_feat) * 0.001
        return loss

    # what the author hands to nndx (built in both runs: the dataset draws from np.random)
    first_points, first_target = next(iter(DataLoader(dataset, batch_size=batchSize)))
    first_batch = (to_channels(first_points), first_target[:, 0])
    train_x, train_y = map(torch.stack, zip(*(dataset[i] for i in range(len(dataset)))))
    test_x, test_y = map(torch.stack, zip(*(test_dataset[i] for i in range(len(test_dataset)))))
    splits = (to_channels(train_x), train_y[:, 0], to_channels(test_x), test_y[:, 0])
    nx.preflight(classifier, first_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(classifier, optimizer, every=10, loss_fn=F.nll_loss)

    train_accuracies: list[float] = []
    test_losses: list[float] = []
    for epoch in range(nepoch):
        scheduler.step()  # at the start of the epoch, as published
        for i, data in enumerate(dataloader, 0):
            points, target = data
            target = target[:, 0]
            points = to_channels(points)
            optimizer.zero_grad()
            if variant != "train_mode_not_restored":
                classifier = classifier.train()
            pred, trans, trans_feat = classifier(points)
            loss = mon.loss_fn(pred, target)
            if feature_transform:
                loss += feature_transform_regularizer(trans_feat) * 0.001
            loss.backward()
            optimizer.step()
            mon.log(loss)
            pred_choice = pred.data.max(1)[1]
            correct = pred_choice.eq(target.data).cpu().sum()
            train_accuracies.append(correct.item() / float(batchSize))  # the printed train accuracy
            if i % 10 == 0:
                j, data = next(enumerate(testdataloader, 0))
                points, target = data
                target = target[:, 0]
                points = to_channels(points)
                classifier = classifier.eval()
                pred, _, _ = classifier(points)
                loss = F.nll_loss(pred, target)
                pred_choice = pred.data.max(1)[1]
                correct = pred_choice.eq(target.data).cpu().sum()
                test_losses.append(loss.item())
                mon.log(loss.item(), split="val", accuracy=correct.item() / float(batchSize))

    nx.finish(mon, classifier, first_batch, loss_fn, optimizer=optimizer, data=splits)
    total_correct, total_testset, total_loss = 0, 0, 0.0
    for i, data in enumerate(testdataloader, 0):
        points, target = data
        target = target[:, 0]
        points = to_channels(points)
        classifier = classifier.eval()
        pred, _, _ = classifier(points)
        pred_choice = pred.data.max(1)[1]
        correct = pred_choice.eq(target.data).cpu().sum()
        total_correct += correct.item()
        total_testset += points.size()[0]
        total_loss += F.nll_loss(pred, target, reduction="sum").item()  # measure only
    return {
        "test_accuracy": total_correct / float(total_testset),
        "test_loss": total_loss / total_testset,
        "last_train_accuracy": sum(train_accuracies[-15:]) / 15,
        "last_test_batch_loss": test_losses[-1],
    }

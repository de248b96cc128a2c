"""Port of DGCNN point-cloud classification (WangYueFt/dgcnn, the PyTorch version): EdgeConv on
a k-nearest-neighbour graph rebuilt from the features at every layer, label-smoothed cross
entropy, SGD with momentum and a per-epoch cosine annealing schedule.

Source: github.com/WangYueFt/dgcnn, ``pytorch/main.py``, ``pytorch/model.py``,
``pytorch/util.py`` and ``pytorch/data.py`` at commit f765b469a67730658ba554e97dc11723a7bab628
(MIT, Copyright (c) Massachusetts Institute of Technology and its affiliates). Written anew
from the facts of those files; no code copied.

Kept: ``knn`` (pairwise distances as ``-xx - (-2 x^T x) - xx^T``, the ``k`` largest, i.e. the
nearest, per point, the point itself included); ``get_graph_feature`` (the features viewed as
``(B, C, N)``, the neighbour indices offset by ``idx_base`` = batch index x ``num_points``, the
transposed features gathered for every edge, the edge feature ``cat(x_j - x_i, x_i)``
permuted to ``(B, 2C, N, k)``); ``DGCNN`` (four EdgeConv blocks, each a 1x1 ``Conv2d``
without bias + ``BatchNorm2d`` + ``LeakyReLU(0.2)`` with the max over the k neighbours, the
graph rebuilt from the previous block's output; the four outputs concatenated; a 1x1
``Conv1d`` + ``BatchNorm1d`` + ``LeakyReLU(0.2)`` to ``emb_dims``; adaptive max and average
pooling over the points, concatenated; ``Linear`` (no bias) + ``BatchNorm1d`` + leaky ReLU +
``Dropout``, ``Linear`` + ``BatchNorm1d`` + leaky ReLU + ``Dropout``, ``Linear`` to the
classes); ``util.cal_loss`` (label smoothing with ``eps`` 0.2: ``1 - eps`` on the true
class and ``eps / (n_class - 1)`` on each other, against ``log_softmax``, summed over the
classes and averaged over the batch; used for training and for the test loss);
``main.train``: the model wrapped in ``nn.DataParallel``; ``use_sgd`` on (the default):
``SGD(lr=args.lr * 100, momentum=0.9, weight_decay=1e-4)`` with ``--lr`` 0.001;
``CosineAnnealingLR(T_max=epochs, eta_min=args.lr)`` stepped at the start of every epoch
(before any ``optimizer.step()``, as published); per epoch ``model.train()``, per batch the
labels squeezed, ``data.permute(0, 2, 1)``, ``zero_grad``, forward, ``cal_loss``,
``backward``, ``step``, the predictions by ``logits.max(dim=1)``; then ``model.eval()`` and
the test loop (no ``torch.no_grad()``, as published), the overall and the class-balanced
accuracy (``sklearn.metrics``) and the best test accuracy kept; a shuffled train loader
with ``drop_last=True`` and a shuffled test loader; ``data.py``'s ``ModelNet40`` (the first
``num_points`` points of each cloud; for training ``translate_pointcloud``: each axis
scaled by U(2/3, 3/2) and shifted by U(-0.2, 0.2), then the points shuffled); dropout 0.5.
Shrunk: ModelNet40 (downloaded) replaced by clouds sampled at run time on the surfaces of 6
solids (sphere, box, cylinder, cone, torus, square pyramid), each stretched by U(0.7, 1.3)
per axis, centred and scaled into the unit sphere as ModelNet's files are, 512 points a
cloud in random order; 480 training and 192 test clouds; ``num_points`` 96 instead of
1,024 and ``k`` 10 instead of 20; every width divided by 4 (EdgeConv 64/64/128/256 ->
16/16/32/64, ``emb_dims`` 1024 -> 256, the head 512/256 -> 128/64); ``batch_size`` 32 and
``test_batch_size`` 16 (kept); 10 epochs instead of 250; ``num_workers`` 0; the hard-coded
``torch.device('cuda')`` in ``get_graph_feature`` replaced by the features' device (the
program cannot run on a CPU otherwise); no checkpoint files, no log file.
Measure only (not in the program): the last epoch's test accuracy, class-balanced test
accuracy and test loss, as the program prints them; the best test accuracy and the last
train accuracy are returned too. Without nndx, seeds 0/1/2: healthy test accuracy
0.85/0.93/0.85; sgd_lr_given_as_0_1 0.17 (chance, NaN loss) on all three;
train_mode_not_restored 0.38/0.65/0.17.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(points permuted to (B, 3, N), labels squeezed) with ``cal_loss``, the optimizer and the
train/test clouds as ``data``; ``nndx.Monitor(model, opt)`` around the epochs with
``cal_loss`` called as ``mon.loss_fn``, each batch's loss logged with its accuracy and each
epoch's test loss and accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import numpy as np
import sklearn.metrics as metrics
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import CosineAnnealingLR
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dgcnn"
SOURCE = Source("WangYueFt/dgcnn", "pytorch/main.py", "f765b469a67730658ba554e97dc11723a7bab628", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--use_sgd, --lr 0.001 scaled by 100, cosine annealing)"),
        Variant(
            "sgd_lr_given_as_0_1",
            "run with --lr 0.1, the value the --lr help text gives for SGD ('0.1 if using sgd'), while "
            "main.py multiplies --lr by 100 for SGD: SGD runs at lr 10 (momentum 0.9), and the cosine "
            "schedule's floor eta_min=args.lr is 0.1",
            (C.LR_TOO_HIGH,),
            ("https://github.com/FlyingGiraffe/vnn/issues/7", "https://github.com/FlyingGiraffe/vnn/issues/6",
             "https://github.com/facebookresearch/maskrcnn-benchmark/issues/295"),
            Measure("test_acc", "final test accuracy at least 0.15 below the healthy run's (0.85/0.93/0.85 "
                    "healthy, 0.17/0.17/0.17 buggy on seeds 0-2: the loss turns NaN)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "train_mode_not_restored",
            "model.train() called once before the epoch loop instead of at the start of every epoch: after "
            "the first test loop's model.eval(), every later epoch trains with batch norm on its running "
            "statistics and both dropouts off",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/MILVLG/mcan-vqa/issues/26", "https://github.com/pytorch/tutorials/issues/1624",
             "https://github.com/wkentaro/pytorch-fcn/pull/56"),
            Measure("test_acc", "final test accuracy at least 0.15 below the healthy run's (0.85/0.93/0.85 "
                    "healthy, 0.38/0.65/0.17 buggy on seeds 0-2; seed 2's loss turns NaN)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

SHAPES = ("sphere", "box", "cylinder", "cone", "torus", "pyramid")
RAW_POINTS = 512
N_TRAIN, N_TEST = 480, 192
ARGS = {"batch_size": 32, "test_batch_size": 16, "epochs": 10, "use_sgd": True, "lr": 0.001, "momentum": 0.9,
        "num_points": 96, "dropout": 0.5, "emb_dims": 256, "k": 10}  # fmt: skip
WIDTHS = (16, 16, 32, 64)  # the original's 64, 64, 128, 256
HEAD = (128, 64)  # the original's 512, 256


# --------------------------------------------------------------------------- model.py


def knn(x: torch.Tensor, k: int) -> torch.Tensor:
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x**2, dim=1, keepdim=True)
    pairwise_distance = -xx - inner - xx.transpose(2, 1)
    return pairwise_distance.topk(k=k, dim=-1)[1]  # (batch_size, num_points, k)


def get_graph_feature(x: torch.Tensor, k: int = 20, idx: torch.Tensor | None = None) -> torch.Tensor:
    batch_size = x.size(0)
    num_points = x.size(2)
    x = x.view(batch_size, -1, num_points)
    if idx is None:
        idx = knn(x, k=k)
    device = x.device  # torch.device('cuda') in the original
    idx_base = torch.arange(0, batch_size, device=device).view(-1, 1, 1) * num_points
    idx = (idx + idx_base).view(-1)
    _, num_dims, _ = x.size()
    x = x.transpose(2, 1).contiguous()  # (B, N, C)
    feature = x.view(batch_size * num_points, -1)[idx, :]
    feature = feature.view(batch_size, num_points, k, num_dims)
    x = x.view(batch_size, num_points, 1, num_dims).repeat(1, 1, k, 1)
    return torch.cat((feature - x, x), dim=3).permute(0, 3, 1, 2).contiguous()


class DGCNN(nn.Module):
    def __init__(self, args: dict, output_channels: int = 40) -> None:
        super().__init__()
        self.args = args
        self.k = args["k"]
        w1, w2, w3, w4 = WIDTHS
        emb = args["emb_dims"]
        self.bn1, self.bn2 = nn.BatchNorm2d(w1), nn.BatchNorm2d(w2)
        self.bn3, self.bn4 = nn.BatchNorm2d(w3), nn.BatchNorm2d(w4)
        self.bn5 = nn.BatchNorm1d(emb)
        self.conv1 = nn.Sequential(nn.Conv2d(3 * 2, w1, kernel_size=1, bias=False), self.bn1, nn.LeakyReLU(0.2))
        self.conv2 = nn.Sequential(nn.Conv2d(w1 * 2, w2, kernel_size=1, bias=False), self.bn2, nn.LeakyReLU(0.2))
        self.conv3 = nn.Sequential(nn.Conv2d(w2 * 2, w3, kernel_size=1, bias=False), self.bn3, nn.LeakyReLU(0.2))
        self.conv4 = nn.Sequential(nn.Conv2d(w3 * 2, w4, kernel_size=1, bias=False), self.bn4, nn.LeakyReLU(0.2))
        self.conv5 = nn.Sequential(nn.Conv1d(sum(WIDTHS), emb, kernel_size=1, bias=False), self.bn5,
                                   nn.LeakyReLU(0.2))  # fmt: skip
        self.linear1 = nn.Linear(emb * 2, HEAD[0], bias=False)
        self.bn6 = nn.BatchNorm1d(HEAD[0])
        self.dp1 = nn.Dropout(p=args["dropout"])
        self.linear2 = nn.Linear(HEAD[0], HEAD[1])
        self.bn7 = nn.BatchNorm1d(HEAD[1])
        self.dp2 = nn.Dropout(p=args["dropout"])
        self.linear3 = nn.Linear(HEAD[1], output_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size = x.size(0)
        x = get_graph_feature(x, k=self.k)
        x1 = self.conv1(x).max(dim=-1, keepdim=False)[0]
        x = get_graph_feature(x1, k=self.k)
        x2 = self.conv2(x).max(dim=-1, keepdim=False)[0]
        x = get_graph_feature(x2, k=self.k)
        x3 = self.conv3(x).max(dim=-1, keepdim=False)[0]
        x = get_graph_feature(x3, k=self.k)
        x4 = self.conv4(x).max(dim=-1, keepdim=False)[0]
        x = self.conv5(torch.cat((x1, x2, x3, x4), dim=1))
        x1 = F.adaptive_max_pool1d(x, 1).view(batch_size, -1)
        x2 = F.adaptive_avg_pool1d(x, 1).view(batch_size, -1)
        x = torch.cat((x1, x2), 1)
        x = self.dp1(F.leaky_relu(self.bn6(self.linear1(x)), negative_slope=0.2))
        x = self.dp2(F.leaky_relu(self.bn7(self.linear2(x)), negative_slope=0.2))
        return self.linear3(x)


# --------------------------------------------------------------------------- util.py


def cal_loss(pred: torch.Tensor, gold: torch.Tensor, smoothing: bool = True) -> torch.Tensor:
    """Cross entropy with label smoothing (eps 0.2)."""
    gold = gold.contiguous().view(-1)
    if smoothing:
        eps = 0.2
        n_class = pred.size(1)
        one_hot = torch.zeros_like(pred).scatter(1, gold.view(-1, 1), 1)
        one_hot = one_hot * (1 - eps) + (1 - one_hot) * eps / (n_class - 1)
        log_prb = F.log_softmax(pred, dim=1)
        return -(one_hot * log_prb).sum(dim=1).mean()
    return F.cross_entropy(pred, gold, reduction="mean")


# --------------------------------------------------------------------------- data.py (synthetic ModelNet)


def surface(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points (n, 3) on the surface of a unit ``shape``, y up, roughly uniform by area."""
    if shape == "sphere":
        p = rng.normal(size=(n, 3))
        return p / np.linalg.norm(p, axis=1, keepdims=True)
    if shape == "box":
        p = rng.uniform(-1, 1, size=(n, 3))
        face = rng.integers(3, size=n)
        p[np.arange(n), face] = rng.choice([-1.0, 1.0], size=n)
        return p
    theta = rng.uniform(0, 2 * np.pi, size=n)
    if shape == "cylinder":  # side area 4 pi, caps 2 pi
        side = rng.random(n) < 2 / 3
        r = np.where(side, 1.0, np.sqrt(rng.random(n)))
        y = np.where(side, rng.uniform(-1, 1, size=n), rng.choice([-1.0, 1.0], size=n))
        return np.stack([r * np.cos(theta), y, r * np.sin(theta)], axis=1)
    if shape == "cone":  # apex up: lateral pi sqrt(5), base pi
        side = rng.random(n) < np.sqrt(5) / (1 + np.sqrt(5))
        t = np.sqrt(rng.random(n))
        r = np.where(side, t, np.sqrt(rng.random(n)))
        y = np.where(side, 1 - 2 * t, -1.0)
        return np.stack([r * np.cos(theta), y, r * np.sin(theta)], axis=1)
    if shape == "torus":  # ring radius 0.75, tube 0.25 (rejection on the tube angle for uniform area)
        phi = np.empty(n)
        filled = 0
        while filled < n:
            cand = rng.uniform(0, 2 * np.pi, size=2 * n)
            keep = cand[rng.random(2 * n) < (0.75 + 0.25 * np.cos(cand)) / 1.0]
            take = keep[: n - filled]
            phi[filled : filled + len(take)] = take
            filled += len(take)
        ring = 0.75 + 0.25 * np.cos(phi)
        return np.stack([ring * np.cos(theta), 0.25 * np.sin(phi), ring * np.sin(theta)], axis=1)
    # square pyramid, apex up: four triangular faces and the square base
    face = rng.integers(5, size=n)
    u, v = rng.random(n), rng.random(n)
    flip = u + v > 1
    u, v = np.where(flip, 1 - u, u), np.where(flip, 1 - v, v)
    corners = np.array([[-1, -1, -1], [1, -1, -1], [1, -1, 1], [-1, -1, 1]], dtype=float)
    apex = np.array([0.0, 1.0, 0.0])
    a, b = corners[face % 4], corners[(face + 1) % 4]
    tri = apex + u[:, None] * (a - apex) + v[:, None] * (b - apex)
    base = np.stack([rng.uniform(-1, 1, n), -np.ones(n), rng.uniform(-1, 1, n)], axis=1)
    return np.where((face == 4)[:, None], base, tri)


def make_clouds(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The 'h5 files': (count, RAW_POINTS, 3) float32 clouds in the unit sphere and (count, 1) int64 labels."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(count) % len(SHAPES))
    clouds = []
    for label in labels:
        p = surface(SHAPES[label], RAW_POINTS, rng) * rng.uniform(0.7, 1.3, size=3)
        p = p - p.mean(axis=0)
        clouds.append(p / np.linalg.norm(p, axis=1).max())
    return np.stack(clouds).astype("float32"), labels[:, None].astype("int64")


def translate_pointcloud(pointcloud: np.ndarray) -> np.ndarray:
    xyz1 = np.random.uniform(low=2.0 / 3.0, high=3.0 / 2.0, size=[3])
    xyz2 = np.random.uniform(low=-0.2, high=0.2, size=[3])
    return np.add(np.multiply(pointcloud, xyz1), xyz2).astype("float32")


class ModelNet40(Dataset):
    def __init__(self, data: np.ndarray, label: np.ndarray, num_points: int, partition: str = "train") -> None:
        self.data, self.label = data, label
        self.num_points, self.partition = num_points, partition

    def __getitem__(self, item: int):
        pointcloud = self.data[item][: self.num_points]
        label = self.label[item]
        if self.partition == "train":
            pointcloud = translate_pointcloud(pointcloud)
            np.random.shuffle(pointcloud)
        return pointcloud, label

    def __len__(self) -> int:
        return self.data.shape[0]


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    if variant == "sgd_lr_given_as_0_1":
        args["lr"] = 0.1
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    train_set = ModelNet40(*make_clouds(N_TRAIN, seed), num_points=args["num_points"], partition="train")
    test_set = ModelNet40(*make_clouds(N_TEST, seed + 1000), num_points=args["num_points"], partition="test")
    train_loader = DataLoader(train_set, num_workers=0, batch_size=args["batch_size"], shuffle=True, drop_last=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(test_set, num_workers=0, batch_size=args["test_batch_size"], shuffle=True,
                             drop_last=False, generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip

    model = DGCNN(args, output_channels=len(SHAPES))
    model = nn.DataParallel(model)  # on a CPU, DataParallel calls the module itself
    if args["use_sgd"]:
        opt = optim.SGD(model.parameters(), lr=args["lr"] * 100, momentum=args["momentum"], weight_decay=1e-4)
    else:
        opt = optim.Adam(model.parameters(), lr=args["lr"], weight_decay=1e-4)
    scheduler = CosineAnnealingLR(opt, args["epochs"], eta_min=args["lr"])
    criterion = cal_loss

    # what the author hands to nndx (drawn in both runs: the train set draws from np.random)
    first_data, first_label = next(iter(DataLoader(train_set, batch_size=args["batch_size"])))
    first_batch = (first_data.permute(0, 2, 1), first_label.squeeze())
    train_x, train_y = map(torch.from_numpy, map(np.stack, zip(*(train_set[i] for i in range(len(train_set))))))
    test_x, test_y = map(torch.from_numpy, map(np.stack, zip(*(test_set[i] for i in range(len(test_set))))))
    splits = (train_x.permute(0, 2, 1), train_y.squeeze(), test_x.permute(0, 2, 1), test_y.squeeze())
    nx.preflight(model, first_batch, criterion, optimizer=opt, data=splits)
    mon = nx.monitor(model, opt, every=5, loss_fn=criterion)

    best_test_acc = 0.0
    test_acc = avg_per_class_acc = test_loss = train_acc = float("nan")
    if variant == "train_mode_not_restored":
        model.train()
    for epoch in range(args["epochs"]):
        scheduler.step()
        # Train
        train_loss, count = 0.0, 0.0
        if variant != "train_mode_not_restored":
            model.train()
        train_pred, train_true = [], []
        for data, label in train_loader:
            data, label = data, label.squeeze()
            data = data.permute(0, 2, 1)
            batch_size = data.size()[0]
            opt.zero_grad()
            logits = model(data)
            loss = mon.loss_fn(logits, label)
            loss.backward()
            opt.step()
            preds = logits.max(dim=1)[1]
            count += batch_size
            train_loss += loss.item() * batch_size
            train_true.append(label.cpu().numpy())
            train_pred.append(preds.detach().cpu().numpy())
            mon.log(loss, accuracy=(preds == label).float().mean().item())
        train_acc = metrics.accuracy_score(np.concatenate(train_true), np.concatenate(train_pred))
        # Test
        test_loss, count = 0.0, 0.0
        model.eval()
        test_pred, test_true = [], []
        for data, label in test_loader:
            data, label = data, label.squeeze()
            data = data.permute(0, 2, 1)
            batch_size = data.size()[0]
            logits = model(data)
            loss = criterion(logits, label)
            preds = logits.max(dim=1)[1]
            count += batch_size
            test_loss += loss.item() * batch_size
            test_true.append(label.cpu().numpy().reshape(-1))
            test_pred.append(preds.detach().cpu().numpy().reshape(-1))
        test_true_all, test_pred_all = np.concatenate(test_true), np.concatenate(test_pred)
        test_acc = metrics.accuracy_score(test_true_all, test_pred_all)
        avg_per_class_acc = metrics.balanced_accuracy_score(test_true_all, test_pred_all)
        test_loss = test_loss / count
        mon.log(test_loss, split="val", accuracy=test_acc)
        if test_acc >= best_test_acc:
            best_test_acc = test_acc

    nx.finish(mon, model, first_batch, criterion, optimizer=opt, data=splits)
    return {"test_acc": test_acc, "test_avg_acc": avg_per_class_acc, "test_loss": test_loss,
            "best_test_acc": best_test_acc, "train_acc": train_acc}  # fmt: skip

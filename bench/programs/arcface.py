"""Port of ronghuaiyang/arcface-pytorch: a face-embedding backbone trained through an
additive angular margin head (ArcFace), checked by pair verification on held-out images.

Source: github.com/ronghuaiyang/arcface-pytorch, ``train.py`` with ``models/metrics.py``
(``ArcMarginProduct``), ``models/resnet.py`` (``resnet_face18``), ``models/focal_loss.py``,
``config/config.py``, ``data/dataset.py`` and ``test.py`` at commit
47ace80b128042cd8d2efd408f55c5a3e156b032 (the repository carries no licence file).
Written anew from the facts of those files; no code copied.

Kept: ``ResNetFace`` (3x3 ``conv1``, BN, PReLU, 2x2 max-pool, stages of ``IRBlock``s --
BN, conv3x3, BN, PReLU, conv3x3 (strided), BN, a 1x1 conv + BN shortcut when the shape
changes, PReLU after the sum, no SE as ``use_se`` is False -- then ``bn4``, ``Dropout()``
(p 0.5), flatten, ``fc5`` to the embedding, ``bn5``; xavier-normal conv and linear init,
BN weight 1 bias 0); ``ArcMarginProduct`` (xavier-uniform class weights,
``cosine = linear(normalize(x), normalize(W))``, ``sine = sqrt(clamp(1 - cos^2, 0, 1))``,
``phi = cos*cos_m - sin*sin_m``, ``easy_margin`` False: ``phi`` where ``cosine > th =
cos(pi - m)`` else ``cosine - mm`` with ``mm = sin(pi - m) * m``, the one-hot mix of
``phi`` for the target class and ``cosine`` for the others, times ``s``; ``s`` 30, ``m``
0.5); ``config``'s ``loss = 'focal_loss'`` (``FocalLoss(gamma=2)``: the batch-mean
cross-entropy ``logp``, ``p = exp(-logp)``, ``(1 - p)^gamma * logp``);
``SGD([backbone params, metric_fc params], lr=0.1, weight_decay=5e-4)``;
``StepLR(step_size=lr_step, gamma=0.1)`` stepped at the start of every epoch; each epoch
``model.train()``, the shuffled loader, ``feature = model(x)``, ``output =
metric_fc(feature, label)``, ``loss = criterion(output, label)``, ``zero_grad`` /
``backward`` / ``step``, every ``print_freq`` iterations the batch accuracy of
``argmax(output)``; after each epoch ``model.eval()`` and ``lfw_test``: each test image and
its horizontal mirror through the model, the two embeddings concatenated, the cosine of
each pair's embeddings, ``cal_accuracy`` (the best accuracy over every threshold taken
from the scores); ``Dataset``'s normalisation ``(x - 0.5) / 0.5`` and random crop.
Shrunk: scikit-learn's 8x8 digits as the identities (10 of them; 1,437 training images,
the 360 held-out images making 600 pairs, half of the same digit, drawn by the seed)
instead of CASIA-WebFace's 10,575 identities and LFW's 6,000 pairs; the random crop 8 of
the image reflect-padded by 1 instead of 128 of 144, no training flip (a mirrored digit
is another digit); conv1 16 channels, two stages of one ``IRBlock`` (16, 32) instead of
four of two (64-512), a 64-d embedding instead of 512; 8 epochs of 90 iterations
(``train_batch_size`` 16 as configured) with ``lr_step`` 2 instead of 50 epochs with
``lr_step`` 10 (the same four decades of decay); no checkpoints, visdom or
DataParallel; CPU.
Measure only (not in the program): nothing; the last ``lfw_test`` verification
accuracy is what the program prints.

nndx, as the author would add it: a preflight ``nndx.probe`` of the backbone on the first
training batch with the loss as a function of its embeddings (``criterion(metric_fc(
feature, label), label)``, the head part of the loss), and the optimizer;
``nndx.Monitor({"backbone": model, "metric_fc": metric_fc}, optimizer)`` around the epochs
with the criterion wrapped (``mon.loss_fn``), each iteration's loss logged with its batch
accuracy; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. The program has no
validation loss (``lfw_test`` gives an accuracy only), so nothing is logged as ``val``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import Parameter
from torch.optim.lr_scheduler import StepLR

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "arcface"
SOURCE = Source("ronghuaiyang/arcface-pytorch", "train.py", "47ace80b128042cd8d2efd408f55c5a3e156b032",
                "no licence file")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (config.py's arc_margin + focal_loss settings, shrunk)"),
        Variant(
            "scheduler_step_per_batch",
            "scheduler.step() moved from the top of the epoch loop into the batch loop: the StepLR meant to "
            "divide the LR by 10 every lr_step epochs divides it every lr_step iterations, so the LR is ~0 "
            "after a few dozen steps and the embedding stops learning",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/ivadomed/ivadomed/pull/55", "https://github.com/pytorch/tutorials/pull/640",
             "https://github.com/pytorch/vision/issues/1261", "https://github.com/pytorch/pytorch/issues/3814"),
            Measure("lfw_acc", "the final pair-verification accuracy at least 0.02 below the healthy run's: "
                    "0.813 against 0.943 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.02),
        ),
        Variant(
            "eval_mode_forgotten",
            "model.eval() left out before lfw_test (the loop's model.train() at the top of each epoch kept): the "
            "test embeddings are made with Dropout(0.5) active and BatchNorm on each test batch's statistics",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/mrzhu-cool/pix2pix-pytorch/issues/14",
             "https://github.com/callmeray/PointMVSNet/issues/16",
             "https://github.com/facebookresearch/active-mri-acquisition/issues/17"),
            Measure("lfw_acc", "the final pair-verification accuracy at least 0.02 below the healthy run's: "
                    "0.920 against 0.943 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.02),
        ),
    )
}

SIDE, N_IDS = 8, 10
OPT = {"max_epoch": 8, "lr": 1e-1, "lr_step": 2, "weight_decay": 5e-4, "train_batch_size": 16,
       "test_batch_size": 60, "print_freq": 10, "s": 30.0, "m": 0.5, "easy_margin": False, "embedding": 64,
       "pairs": 600}  # fmt: skip


# --------------------------------------------------------------------------- models/resnet.py


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class IRBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.bn0 = nn.BatchNorm2d(inplanes)
        self.conv1 = conv3x3(inplanes, inplanes)
        self.bn1 = nn.BatchNorm2d(inplanes)
        self.prelu = nn.PReLU()
        self.conv2 = conv3x3(inplanes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        out = self.prelu(self.bn1(self.conv1(self.bn0(x))))
        out = self.bn2(self.conv2(out))
        return self.prelu(out + residual)


class ResNetFace(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32), embedding: int = 64) -> None:
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(1, widths[0], kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.prelu = nn.PReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.layers = nn.Sequential(*[self._make_layer(w, 1, stride=1 if i == 0 else 2) for i, w in enumerate(widths)])
        side = SIDE // 2 // 2 ** (len(widths) - 1)
        self.bn4 = nn.BatchNorm2d(widths[-1])
        self.dropout = nn.Dropout()
        self.fc5 = nn.Linear(widths[-1] * side * side, embedding)
        self.bn5 = nn.BatchNorm1d(embedding)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_normal_(m.weight)
            elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes))  # fmt: skip
        layers = [IRBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [IRBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.prelu(self.bn1(self.conv1(x))))
        x = self.dropout(self.bn4(self.layers(x)))
        return self.bn5(self.fc5(x.view(x.size(0), -1)))


# --------------------------------------------------------------------------- models/metrics.py, focal_loss.py


class ArcMarginProduct(nn.Module):
    """cos(theta + m) for the target class, cos(theta) for the others, times s."""

    def __init__(self, in_features: int, out_features: int, s: float = 30.0, m: float = 0.50,
                 easy_margin: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.out_features, self.s, self.m = in_features, out_features, s, m
        self.weight = Parameter(torch.empty(out_features, in_features))
        nn.init.xavier_uniform_(self.weight)
        self.easy_margin = easy_margin
        self.cos_m, self.sin_m = math.cos(m), math.sin(m)
        self.th = math.cos(math.pi - m)
        self.mm = math.sin(math.pi - m) * m

    def forward(self, inp: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        cosine = F.linear(F.normalize(inp), F.normalize(self.weight))
        sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))
        phi = cosine * self.cos_m - sine * self.sin_m
        phi = torch.where(cosine > 0, phi, cosine) if self.easy_margin else torch.where(cosine > self.th, phi,
                                                                                           cosine - self.mm)
        one_hot = torch.zeros(cosine.size(), device=cosine.device)
        one_hot.scatter_(1, label.view(-1, 1).long(), 1)
        output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
        return output * self.s


class FocalLoss(nn.Module):
    def __init__(self, gamma: float = 0, eps: float = 1e-7) -> None:
        super().__init__()
        self.gamma, self.eps = gamma, eps
        self.ce = nn.CrossEntropyLoss()

    def forward(self, inp: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logp = self.ce(inp, target)
        p = torch.exp(-logp)
        return ((1 - p) ** self.gamma * logp).mean()


# --------------------------------------------------------------------------- test.py


def cosin_metric(x1: np.ndarray, x2: np.ndarray) -> float:
    return float(np.dot(x1, x2) / (np.linalg.norm(x1) * np.linalg.norm(x2)))


def cal_accuracy(y_score, y_true) -> tuple[float, float]:
    y_score, y_true = np.asarray(y_score), np.asarray(y_true)
    best_acc = best_th = 0.0
    for th in y_score:
        acc = float(np.mean(((y_score >= th) == y_true).astype(int)))
        if acc > best_acc:
            best_acc, best_th = acc, float(th)
    return best_acc, best_th


def get_features(model: nn.Module, images: torch.Tensor, batch_size: int) -> np.ndarray:
    """Each image and its mirror through the model; the two embeddings side by side."""
    features = []
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        both = torch.stack((chunk, torch.flip(chunk, dims=[-1])), dim=1).reshape(-1, *chunk.shape[1:])
        with torch.no_grad():
            output = model(both).numpy()
        features.append(np.hstack((output[::2], output[1::2])))
    return np.vstack(features)


def lfw_test(model: nn.Module, images: torch.Tensor, pairs: list[tuple[int, int, int]], batch_size: int) -> float:
    features = get_features(model, images, batch_size)
    sims = [cosin_metric(features[a], features[b]) for a, b, _ in pairs]
    acc, _th = cal_accuracy(sims, [label for _, _, label in pairs])
    return acc


def make_pairs(labels: np.ndarray, count: int, rng: np.random.RandomState) -> list[tuple[int, int, int]]:
    """``lfw_test_pair.txt``: half the pairs one identity (label 1), half two (label 0)."""
    pairs = []
    while len(pairs) < count:
        a = int(rng.randint(len(labels)))
        same = len(pairs) % 2 == 0
        pool = np.flatnonzero((labels == labels[a]) if same else (labels != labels[a]))
        pool = pool[pool != a]
        pairs.append((a, int(rng.choice(pool)), int(same)))
    return pairs


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    np.random.seed(seed)
    torch.manual_seed(seed)
    aug_rng = np.random.RandomState(seed + 1)

    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)

    def to_input(images: np.ndarray) -> torch.Tensor:  # ToTensor + Normalize(mean=[0.5], std=[0.5])
        return (torch.from_numpy(np.ascontiguousarray(images)).float().div(255.0).unsqueeze(-3) - 0.5) / 0.5

    def random_crop(img: np.ndarray) -> np.ndarray:
        padded = np.pad(img, 1, mode="reflect")
        top, left = aug_rng.randint(0, 3, size=2)
        return padded[top : top + SIDE, left : left + SIDE]

    train_images, train_y = train_raw.numpy(), train_labels.clone()
    test_x = to_input(test_raw.numpy())
    pairs = make_pairs(test_labels.numpy(), opt["pairs"], np.random.RandomState(seed + 7))

    def trainloader():
        """``DataLoader(shuffle=True, batch_size=train_batch_size)``: the last batch kept."""
        order = torch.randperm(len(train_images)).numpy()
        for start in range(0, len(order), opt["train_batch_size"]):
            idx = order[start : start + opt["train_batch_size"]]
            if len(idx) < 2:  # BatchNorm1d needs two samples (a 1-image tail would crash the original too)
                continue
            yield to_input(np.stack([random_crop(train_images[i]) for i in idx])), train_y[idx].to(torch.int32)

    criterion = FocalLoss(gamma=2)
    model = ResNetFace(embedding=opt["embedding"])
    metric_fc = ArcMarginProduct(opt["embedding"], N_IDS, s=opt["s"], m=opt["m"], easy_margin=opt["easy_margin"])
    optimizer = torch.optim.SGD([{"params": model.parameters()}, {"params": metric_fc.parameters()}],
                                lr=opt["lr"], weight_decay=opt["weight_decay"])  # fmt: skip
    scheduler = StepLR(optimizer, step_size=opt["lr_step"], gamma=0.1)

    def arc_loss(feature: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return criterion(metric_fc(feature, label), label)

    first_input, first_label = next(trainloader())
    first_batch = (first_input, first_label.long())
    nx.preflight(model, first_batch, arc_loss, optimizer=optimizer)
    mon = nx.monitor({"backbone": model, "metric_fc": metric_fc}, optimizer, every=10, loss_fn=criterion)

    log: list[dict[str, float]] = []
    acc = loss_value = train_acc = float("nan")
    iters = 0
    for i in range(opt["max_epoch"]):
        if variant != "scheduler_step_per_batch":
            scheduler.step()
        model.train()
        for ii, (data_input, label) in enumerate(trainloader()):
            label = label.long()
            feature = model(data_input)
            output = metric_fc(feature, label)
            loss = mon.loss_fn(output, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if variant == "scheduler_step_per_batch":
                scheduler.step()
            iters = i * 90 + ii
            batch_acc = float(np.mean((np.argmax(output.detach().numpy(), axis=1) == label.numpy()).astype(int)))
            nx.timed(lambda: mon.log(loss, accuracy=batch_acc))
            loss_value, train_acc = loss.item(), batch_acc
            if iters % opt["print_freq"] == 0:
                log.append({"epoch": i, "iter": ii, "loss": loss_value, "acc": batch_acc})
        if variant != "eval_mode_forgotten":
            model.eval()
        acc = lfw_test(model, test_x, pairs, opt["test_batch_size"])

    nx.finish(mon, model, first_batch, arc_loss, optimizer=optimizer)
    return {"lfw_acc": acc, "train_loss": loss_value, "train_acc": train_acc,
            "lr_last": optimizer.param_groups[0]["lr"]}  # fmt: skip

"""Port of hendrycks/outlier-exposure: fine-tuning a pre-trained CIFAR classifier (a Wide ResNet)
with Outlier Exposure: the in-distribution cross-entropy plus 0.5 x the cross-entropy from the
softmax of the outliers' logits to the uniform distribution, SGD (Nesterov) with a cosine learning
rate stepped every batch, the in-distribution and outlier batches concatenated into one forward.

Source: github.com/hendrycks/outlier-exposure, ``CIFAR/oe_tune.py`` (the fine-tuning),
``CIFAR/baseline.py`` (the checkpoint it loads), ``CIFAR/models/wrn.py`` (``WideResNet``),
``utils/tinyimages_80mn_loader.py`` (the outlier set: unlabelled images returned with class 0,
read from a random offset every epoch) and ``CIFAR/test.py`` (the OOD score) at commit
e6ede98a5474a0620d9befa50b38eaf584df4401 (Apache-2.0, Copyright Dan Hendrycks et al.). Written
anew from the facts of those files; no code copied.

Kept: ``WideResNet`` as published (``BasicBlock`` pre-activation BN-ReLU-conv with the
``equalInOut`` shortcut logic, ``F.dropout`` at ``dropRate``, the conv init ``normal_(0,
sqrt(2/n))``, BN weight 1 / bias 0, Linear bias 0, global average pooling, ``fc``); the CIFAR
mean/std normalisation; training augmentation ``RandomHorizontalFlip`` + ``RandomCrop`` with
padding; the outlier loader unshuffled, read from ``offset = np.random.randint(len)`` each epoch
with the same augmentation; ``baseline.py``'s loop (SGD lr 0.1, momentum 0.9, Nesterov, weight
decay 5e-4, ``LambdaLR`` with ``cosine_annealing(step, epochs * len(loader), 1, 1e-6 / lr)``,
``scheduler.step()`` before ``optimizer.zero_grad()``, plain cross-entropy) producing the
checkpoint; ``oe_tune.py``'s loop: the checkpoint restored, SGD lr 0.001 (the default), momentum
0.9, Nesterov, weight decay 5e-4, the same per-batch cosine ``LambdaLR``; per batch
``torch.cat((in_set[0], out_set[0]))``, one forward, ``scheduler.step()``, ``zero_grad``,
``F.cross_entropy(x[:len(in_set[0])], target)`` ``+= 0.5 * -(x_out.mean(1) -
torch.logsumexp(x_out, dim=1)).mean()``, ``backward``, ``step``, the 0.8/0.2 moving average of
the loss; ``test()`` per epoch (``net.eval()``, no grad, mean batch cross-entropy and accuracy);
``test.py``'s OOD score ``output.mean(1) - logsumexp(output)`` (``--use_xent``; higher = more
anomalous after the sign test.py applies) scored by AUROC.
Shrunk: synthetic 3x16x16 images instead of CIFAR-10 (4 classes: oriented colour gratings with
noise; 512 train / 256 test) and instead of 80 Million Tiny Images (unlabelled noise and texture
images: smoothed Gaussian noise, uniform noise, checkerboards, radial rings, random blobs; 1,024
for training, 256 held out for the OOD test); WRN depth 10 / widen 1 instead of 40 / 2 (the
avg-pool 8 becomes 4 for 16 px; RandomCrop padding 2 instead of 4); batch 32 and outlier batch 64
instead of 128 / 256; the baseline 8 epochs instead of 100, the OE fine-tuning 4 epochs instead
of 10; CPU; no checkpoints written (the baseline is trained in the same process, once per seed,
and restored by ``load_state_dict`` as the script restores its file).
Measure only (not in the program): the AUROC of the OE score between the in-distribution test
set and the held-out outliers (test.py's ``get_measures``), the mean max-softmax probability on
the held-out outliers (test.py's default score), and the test accuracy.

nndx, as the author would add it: a preflight ``nndx.probe`` of the restored net on the first
concatenated batch ``(data, target)`` with the OE loss as ``loss_fn(x, target)`` (the in part of
``x`` is ``x[:len(target)]``) and the optimizer; ``nndx.Monitor(net, optimizer)`` around the
fine-tuning, each batch's loss logged where the moving average is taken and each epoch's test
loss and accuracy logged as ``split="val"``; after it ``nndx.probe(..., monitor=mon)`` on the
same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "outlier_exposure"
SOURCE = Source("hendrycks/outlier-exposure", "CIFAR/oe_tune.py", "e6ede98a5474a0620d9befa50b38eaf584df4401",
                "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "oe_tune.py as published (shrunk: synthetic 16 px images and outliers, WRN-10-1)"),
        Variant(
            "lambda_returns_lr",
            "the LambdaLR's lambda returns the learning rate itself (cosine_annealing(step, total, "
            "args.learning_rate, 1e-6)) instead of a multiplicative factor (1, 1e-6 / lr): LambdaLR multiplies it "
            "by the base lr again, so the fine-tuning runs at lr^2 = 1e-6 and Outlier Exposure never takes hold",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/lhoyer/MIC/issues/60",
             "https://github.com/gao-hongnan/omniverse/issues/82",
             "https://github.com/val-iisc/SDAT (examples/cdan_mcc_sdat.py, same bug, cited in MIC#60)"),
            Measure("ood_msp", "mean max-softmax probability on the held-out outliers at least 0.08 above the "
                    "healthy run's: 0.658 against 0.504 healthy on seed 0 (the baseline checkpoint's: 0.627)",
                    lambda healthy, buggy: not buggy < healthy + 0.08),
        ),
        Variant(
            "oe_term_sign_flipped",
            "the outlier term written without its minus sign: loss += 0.5 * (x_out.mean(1) - "
            "logsumexp(x_out)).mean(), i.e. minus the cross-entropy to the uniform distribution: minimising it "
            "makes the outliers' softmax as confident as possible instead of uniform (and is unbounded below)",
            (C.WRONG_LOSS,),
            ("https://github.com/hendrycks/outlier-exposure/issues/12",
             "https://github.com/hendrycks/outlier-exposure/issues/19",
             "https://github.com/Jingkang50/OpenOOD/issues/138"),
            Measure("ood_auroc", "OOD AUROC at least 0.1 below the healthy run's: 0.475 against 0.958 healthy on "
                    "seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

SIDE, N_CLASSES, N_TRAIN, N_TEST, N_OUT, N_OUT_TEST = 16, 4, 512, 256, 1024, 256
BASE = {"epochs": 8, "learning_rate": 0.1, "batch_size": 32}
ARGS = {"epochs": 4, "learning_rate": 0.001, "batch_size": 32, "oe_batch_size": 64, "test_bs": 128,
        "momentum": 0.9, "decay": 0.0005, "layers": 10, "widen_factor": 1, "droprate": 0.3}  # fmt: skip
MEAN = torch.tensor([x / 255 for x in [125.3, 123.0, 113.9]]).view(3, 1, 1)
STD = torch.tensor([x / 255 for x in [63.0, 62.1, 66.7]]).view(3, 1, 1)


# --------------------------------------------------------------------------- CIFAR/models/wrn.py


class BasicBlock(nn.Module):
    def __init__(self, in_planes, out_planes, stride, dropRate=0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.droprate = dropRate
        self.equalInOut = in_planes == out_planes
        self.convShortcut = (not self.equalInOut) and nn.Conv2d(
            in_planes, out_planes, kernel_size=1, stride=stride, padding=0, bias=False) or None

    def forward(self, x):
        if not self.equalInOut:
            x = self.relu1(self.bn1(x))
        else:
            out = self.relu1(self.bn1(x))
        if self.equalInOut:
            out = self.relu2(self.bn2(self.conv1(out)))
        else:
            out = self.relu2(self.bn2(self.conv1(x)))
        if self.droprate > 0:
            out = F.dropout(out, p=self.droprate, training=self.training)
        out = self.conv2(out)
        if not self.equalInOut:
            return torch.add(self.convShortcut(x), out)
        return torch.add(x, out)


class NetworkBlock(nn.Module):
    def __init__(self, nb_layers, in_planes, out_planes, block, stride, dropRate=0.0):
        super().__init__()
        self.layer = nn.Sequential(*[block(i == 0 and in_planes or out_planes, out_planes,
                                           i == 0 and stride or 1, dropRate) for i in range(nb_layers)])

    def forward(self, x):
        return self.layer(x)


class WideResNet(nn.Module):
    def __init__(self, depth, num_classes, widen_factor=1, dropRate=0.0):
        super().__init__()
        nChannels = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        assert (depth - 4) % 6 == 0
        n = (depth - 4) // 6
        self.conv1 = nn.Conv2d(3, nChannels[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.block1 = NetworkBlock(n, nChannels[0], nChannels[1], BasicBlock, 1, dropRate)
        self.block2 = NetworkBlock(n, nChannels[1], nChannels[2], BasicBlock, 2, dropRate)
        self.block3 = NetworkBlock(n, nChannels[2], nChannels[3], BasicBlock, 2, dropRate)
        self.bn1 = nn.BatchNorm2d(nChannels[3])
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(nChannels[3], num_classes)
        self.nChannels = nChannels[3]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.bias.data.zero_()

    def forward(self, x):
        out = self.conv1(x)
        out = self.block1(out)
        out = self.block2(out)
        out = self.block3(out)
        out = self.relu(self.bn1(out))
        out = F.avg_pool2d(out, SIDE // 4)
        out = out.view(-1, self.nChannels)
        return self.fc(out)


# --------------------------------------------------------------------------- the data (synthetic)


def _grid() -> tuple[torch.Tensor, torch.Tensor]:
    coords = torch.arange(SIDE, dtype=torch.float32) / SIDE
    return torch.meshgrid(coords, coords, indexing="ij")


def in_distribution(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Oriented colour gratings, one orientation per class, random phase/frequency/colour, noise: [0, 1]."""
    yy, xx = _grid()
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    theta = labels.float() * math.pi / N_CLASSES + 0.15 * torch.randn(n, generator=g)
    freq = 2.0 + 2.0 * torch.rand(n, generator=g)
    phase = 2 * math.pi * torch.rand(n, generator=g)
    proj = xx[None] * torch.cos(theta)[:, None, None] + yy[None] * torch.sin(theta)[:, None, None]
    wave = 0.5 + 0.5 * torch.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None])
    colour = 0.4 + 0.6 * torch.rand(n, 3, 1, 1, generator=g)
    images = wave[:, None] * colour + 0.08 * torch.randn(n, 3, SIDE, SIDE, generator=g)
    return images.clamp(0, 1), labels


def outliers(n: int, g: torch.Generator) -> torch.Tensor:
    """Unlabelled noise and texture images: the kinds of Tiny Images that are no CIFAR class: [0, 1]."""
    yy, xx = _grid()
    kind = torch.randint(0, 5, (n,), generator=g)
    out = torch.empty(n, 3, SIDE, SIDE)
    for i in range(n):
        k = int(kind[i])
        if k == 0:  # smoothed Gaussian noise
            img = F.avg_pool2d(torch.randn(1, 3, SIDE + 2, SIDE + 2, generator=g), 3, 1)[0] * 0.6 + 0.5
        elif k == 1:  # uniform noise
            img = torch.rand(3, SIDE, SIDE, generator=g)
        elif k == 2:  # checkerboard
            size = int(torch.randint(2, 6, (1,), generator=g))
            board = ((torch.arange(SIDE)[:, None] // size + torch.arange(SIDE)[None] // size) % 2).float()
            img = board[None] * torch.rand(3, 1, 1, generator=g) + 0.1 * torch.randn(3, SIDE, SIDE, generator=g)
        elif k == 3:  # radial rings
            cx, cy = torch.rand(2, generator=g)
            r = ((xx - cx) ** 2 + (yy - cy) ** 2).sqrt()
            f = 3.0 + 4.0 * float(torch.rand(1, generator=g))
            img = (0.5 + 0.5 * torch.sin(2 * math.pi * f * r))[None] * torch.rand(3, 1, 1, generator=g)
        else:  # random blobs
            img = torch.zeros(3, SIDE, SIDE)
            for _ in range(3):
                cx, cy, s = torch.rand(3, generator=g)
                blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (0.01 + 0.05 * s))
                img += blob[None] * torch.rand(3, 1, 1, generator=g)
        out[i] = img
    return out.clamp(0, 1)


def normalize(images: torch.Tensor) -> torch.Tensor:  # trn.Normalize(mean, std)
    return (images - MEAN) / STD


def augment(images: torch.Tensor, g: torch.Generator, pad: int = 2) -> torch.Tensor:
    """RandomHorizontalFlip + RandomCrop(SIDE, padding=pad), per image."""
    n = images.shape[0]
    flip = torch.rand(n, generator=g) < 0.5
    images = torch.where(flip[:, None, None, None], images.flip(3), images)
    padded = F.pad(images, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=g)
    return torch.stack([padded[i, :, int(a):int(a) + SIDE, int(b):int(b) + SIDE]
                        for i, (a, b) in enumerate(offsets)])  # fmt: skip


class InLoader:
    """DataLoader(train_data_in, batch_size, shuffle=True) with the training transform."""

    def __init__(self, images, labels, batch_size, g):
        self.images, self.labels, self.batch_size, self.g = images, labels, batch_size, g

    def __len__(self):
        return math.ceil(len(self.images) / self.batch_size)

    def __iter__(self):
        perm = torch.randperm(len(self.images), generator=self.g)
        for s in range(0, len(perm), self.batch_size):
            idx = perm[s : s + self.batch_size]
            yield normalize(augment(self.images[idx], self.g)), self.labels[idx]


class OutLoader:
    """DataLoader(ood_data, batch_size=oe_batch_size, shuffle=False) reading from ``dataset.offset``."""

    def __init__(self, images, batch_size, g):
        self.images, self.batch_size, self.g, self.offset = images, batch_size, g, 0

    def __len__(self):
        return math.ceil(len(self.images) / self.batch_size)

    def __iter__(self):
        n = len(self.images)
        for s in range(0, n, self.batch_size):
            idx = (torch.arange(s, min(s + self.batch_size, n)) + self.offset) % n
            yield normalize(augment(self.images[idx], self.g)), torch.zeros(len(idx), dtype=torch.long)


def cosine_annealing(step, total_steps, lr_max, lr_min):
    return lr_min + (lr_max - lr_min) * 0.5 * (1 + np.cos(step / total_steps * np.pi))


def test(net, x_test, y_test, bs):
    net.eval()
    loss_avg, correct, n_batches = 0.0, 0, 0
    with torch.no_grad():
        for s in range(0, len(x_test), bs):
            data, target = x_test[s : s + bs], y_test[s : s + bs]
            output = net(data)
            loss = F.cross_entropy(output, target)
            pred = output.data.max(1)[1]
            correct += pred.eq(target.data).sum().item()
            loss_avg += float(loss.data)
            n_batches += 1
    return loss_avg / n_batches, correct / len(x_test)


def ood_scores(net, images, bs):
    """test.py with --use_xent: output.mean(1) - logsumexp(output) (highest, -log C, for a uniform softmax)."""
    net.eval()
    scores = []
    with torch.no_grad():
        for s in range(0, len(images), bs):
            output = net(images[s : s + bs])
            scores.append(output.mean(1) - torch.logsumexp(output, dim=1))
    return torch.cat(scores).numpy()


def auroc(out_score: np.ndarray, in_score: np.ndarray) -> float:
    """P(score(out) > score(in)), ties one half: higher score = more anomalous (get_measures' AUROC)."""
    diff = out_score[:, None] - in_score[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


# --------------------------------------------------------------------------- CIFAR/baseline.py (the checkpoint)

_CHECKPOINTS: dict[int, dict[str, torch.Tensor]] = {}


def baseline_checkpoint(seed: int, x_train, y_train) -> dict[str, torch.Tensor]:
    """baseline.py trained once per seed (the file oe_tune.py restores)."""
    if seed in _CHECKPOINTS:
        return _CHECKPOINTS[seed]
    with torch.random.fork_rng():
        torch.manual_seed(1 + seed)
        g = torch.Generator().manual_seed(100 + seed)
        net = WideResNet(ARGS["layers"], N_CLASSES, ARGS["widen_factor"], dropRate=ARGS["droprate"])
        loader = InLoader(x_train, y_train, BASE["batch_size"], g)
        optimizer = torch.optim.SGD(net.parameters(), BASE["learning_rate"], momentum=ARGS["momentum"],
                                    weight_decay=ARGS["decay"], nesterov=True)  # fmt: skip
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda=lambda step: cosine_annealing(step, BASE["epochs"] * len(loader), 1,
                                                               1e-6 / BASE["learning_rate"]))  # fmt: skip
        for _epoch in range(BASE["epochs"]):
            net.train()
            for data, target in loader:
                x = net(data)
                scheduler.step()
                optimizer.zero_grad()
                loss = F.cross_entropy(x, target)
                loss.backward()
                optimizer.step()
        _CHECKPOINTS[seed] = {k: v.clone() for k, v in net.state_dict().items()}
    return _CHECKPOINTS[seed]


# --------------------------------------------------------------------------- CIFAR/oe_tune.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    g_data = torch.Generator().manual_seed(1234 + seed)
    x_train_raw, y_train = in_distribution(N_TRAIN, g_data)
    x_test_raw, y_test = in_distribution(N_TEST, g_data)
    out_train_raw, out_test_raw = outliers(N_OUT, g_data), outliers(N_OUT_TEST, g_data)
    x_test, out_test = normalize(x_test_raw), normalize(out_test_raw)

    checkpoint = baseline_checkpoint(seed, x_train_raw, y_train)

    torch.manual_seed(1 + seed)
    np.random.seed(1 + seed)
    g_aug = torch.Generator().manual_seed(seed)
    train_loader_in = InLoader(x_train_raw, y_train, args["batch_size"], g_aug)
    train_loader_out = OutLoader(out_train_raw, args["oe_batch_size"], g_aug)

    net = WideResNet(args["layers"], N_CLASSES, args["widen_factor"], dropRate=args["droprate"])
    net.load_state_dict(checkpoint)  # Model restored!

    optimizer = torch.optim.SGD(net.parameters(), args["learning_rate"], momentum=args["momentum"],
                                weight_decay=args["decay"], nesterov=True)  # fmt: skip
    if variant == "lambda_returns_lr":
        lr_lambda = lambda step: cosine_annealing(  # noqa: E731
            step, args["epochs"] * len(train_loader_in), args["learning_rate"], 1e-6)
    else:
        lr_lambda = lambda step: cosine_annealing(  # noqa: E731
            step, args["epochs"] * len(train_loader_in),
            1,  # since lr_lambda computes multiplicative factor
            1e-6 / args["learning_rate"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_lambda)

    def oe_loss(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        n_in = len(target)
        loss = F.cross_entropy(x[:n_in], target)
        # cross-entropy from softmax distribution to uniform distribution
        if variant == "oe_term_sign_flipped":
            loss += 0.5 * (x[n_in:].mean(1) - torch.logsumexp(x[n_in:], dim=1)).mean()
        else:
            loss += 0.5 * -(x[n_in:].mean(1) - torch.logsumexp(x[n_in:], dim=1)).mean()
        return loss

    with torch.random.fork_rng():  # the probe batch is drawn without moving the program's streams
        g_probe = torch.Generator().manual_seed(10_000 + seed)
        in_set = next(iter(InLoader(x_train_raw, y_train, args["batch_size"], g_probe)))
        out_set = next(iter(OutLoader(out_train_raw, args["oe_batch_size"], g_probe)))
    probe_batch = (torch.cat((in_set[0], out_set[0]), 0), in_set[1])
    nx.preflight(net, probe_batch, oe_loss, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5)

    train_loss = test_loss = test_acc = float("nan")
    for _epoch in range(args["epochs"]):
        net.train()
        loss_avg = 0.0
        train_loader_out.offset = np.random.randint(len(out_train_raw))
        for in_set, out_set in zip(train_loader_in, train_loader_out):
            data = torch.cat((in_set[0], out_set[0]), 0)
            target = in_set[1]
            x = net(data)
            scheduler.step()
            optimizer.zero_grad()
            loss = F.cross_entropy(x[: len(in_set[0])], target)
            if variant == "oe_term_sign_flipped":
                loss += 0.5 * (x[len(in_set[0]) :].mean(1) - torch.logsumexp(x[len(in_set[0]) :], dim=1)).mean()
            else:
                loss += 0.5 * -(x[len(in_set[0]) :].mean(1) - torch.logsumexp(x[len(in_set[0]) :], dim=1)).mean()
            loss.backward()
            optimizer.step()
            loss_avg = loss_avg * 0.8 + float(loss) * 0.2
            nx.timed(lambda: mon.log(loss))  # noqa: B023
        train_loss = loss_avg
        test_loss, test_acc = test(net, x_test, y_test, args["test_bs"])
        nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc))  # noqa: B023

    nx.finish(mon, net, probe_batch, oe_loss, optimizer=optimizer)

    in_score = ood_scores(net, x_test, args["test_bs"])
    out_score = ood_scores(net, out_test, args["test_bs"])
    base = WideResNet(args["layers"], N_CLASSES, args["widen_factor"], dropRate=args["droprate"])
    base.load_state_dict(checkpoint)
    base_auroc = auroc(ood_scores(base, out_test, args["test_bs"]), ood_scores(base, x_test, args["test_bs"]))
    with torch.no_grad():
        ood_msp = float(F.softmax(net(out_test), dim=1).max(1)[0].mean())
    return {"ood_auroc": auroc(out_score, in_score), "ood_msp": ood_msp, "test_acc": test_acc, "test_loss": test_loss,
            "train_loss": train_loss, "baseline_ood_auroc": base_auroc,
            "baseline_ood_msp": float(F.softmax(base(out_test), dim=1).max(1)[0].mean().detach()),
            "final_lr": float(optimizer.param_groups[0]["lr"])}  # fmt: skip

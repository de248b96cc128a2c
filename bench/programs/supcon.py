"""Port of HobbitLong/SupContrast: supervised contrastive pre-training of a ResNet with a projection
head (``SupConLoss``), then a linear classifier trained on the frozen encoder.

Source: github.com/HobbitLong/SupContrast, ``main_supcon.py``, ``losses.py``, ``main_linear.py``,
``main_ce.py`` (its ``set_loader``, which ``main_linear.py`` imports), ``util.py`` and
``networks/resnet_big.py`` at commit 66a8fe53880d6a1084b2e4e0db0a019024d6d41a (BSD-2-Clause,
Copyright (c) 2020, Yonglong Tian). Written anew from the facts of those files; no code copied.

Kept, stage 1 (``main_supcon.py``): ``TwoCropTransform`` (two independent draws of one pipeline per
image) over the pipeline ``RandomResizedCrop(size, scale=(0.2, 1.))``, ``RandomHorizontalFlip()``,
``RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8)`` (the four adjustments in a random order
per image), ``RandomGrayscale(p=0.2)``, ``ToTensor()``, ``Normalize(mean, std)``; the shuffled
loader (no ``drop_last``); ``SupConResNet(name='resnet18', head='mlp', feat_dim=128)``: the
CIFAR-style ResNet of ``resnet_big.py`` (3x3 stride-1 ``conv1`` without max-pool, ``BasicBlock``s
``[2, 2, 2, 2]`` with 1x1-conv+BN shortcuts, ``F.relu`` after the addition, adaptive average pool,
flatten; Kaiming-normal fan-out convolutions, BN weight 1 bias 0) with the head ``Linear(dim_in,
dim_in), ReLU(inplace=True), Linear(dim_in, 128)`` and ``F.normalize(head(feat), dim=1)``;
``SupConLoss(temperature=0.07)`` as in ``losses.py`` (``contrast_mode='all'``, the label-equality
mask, ``torch.cat(torch.unbind(features, dim=1), dim=0)``, the row max subtracted, the self-contrast
mask by ``scatter``, ``log_prob``, the positive-pair count with the zero-pair guard of the newest
commit, ``-(T / base_T) * mean_log_prob_pos`` averaged over ``anchor_count x batch_size``);
``train``: ``model.train()``, ``images = torch.cat([images[0], images[1]])``, ``bsz``,
``warmup_learning_rate`` (only when ``opt.warm``: off, since it is switched on for batches above
256 only), ``features = model(images)``, ``torch.split`` into ``f1, f2``,
``torch.cat([f1.unsqueeze(1), f2.unsqueeze(1)], dim=1)``, ``criterion(features, labels)``,
``zero_grad``/``backward``/``step``; ``set_optimizer`` (``SGD(lr=0.05, momentum=0.9,
weight_decay=1e-4)``, the defaults); ``adjust_learning_rate`` at the start of every epoch (the
step decay by 0.1 past each of ``lr_decay_epochs``: 700, 800, 900 of 1,000, the default without
``--cosine``).
Kept, stage 2 (``main_linear.py``): the encoder of the trained ``SupConResNet`` (the checkpoint
handed over in memory instead of ``torch.load``); ``LinearClassifier`` (``Linear(dim_in,
n_cls)``); ``set_loader`` of ``main_ce.py`` (training: ``RandomResizedCrop(scale=(0.2, 1.))``,
``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize``; validation: ``ToTensor()``,
``Normalize``); ``CrossEntropyLoss``; ``set_optimizer`` over the classifier (``SGD(lr=0.1,
momentum=0.9, weight_decay=0)``); ``adjust_learning_rate`` (x0.2 past 60, 75 and 90 of 100 epochs);
``train``: ``model.eval()``, ``classifier.train()``, the features of ``model.encoder`` under
``torch.no_grad()``, ``classifier(features.detach())``, the loss, ``accuracy`` top-1,
``zero_grad``/``backward``/``step``; ``validate`` (both in eval mode, ``no_grad``, loss and top-1
on the test split) after every epoch; ``best_acc``.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out) instead of CIFAR-10, upscaled
to 16x16 and grey in three equal channels (``size`` 16 instead of 32; ``ColorJitter`` acts through
brightness and contrast, saturation, hue and ``RandomGrayscale`` leave grey images as they are;
digits painted in random colours were tried first: at this size every run, at any learning rate,
collapsed the embeddings to one point); ``RandomResizedCrop`` scale (0.5, 1.) instead of (0.2,
1.) in both stages (a 20% crop of an upscaled 8x8 digit is unreadable; at 0.2 the healthy run
learns little in 12 epochs); the dataset's own per-channel mean/std for ``Normalize``; the
ResNet-18's widths 8/16/32/64 instead of 64/128/256/512 (``dim_in`` 64, ``feat_dim`` 128 kept);
batch 64 instead of 256 in both stages; stage 1: 12 epochs instead of 1,000 with the decays past
epochs 8, 10 and 11 (the same fractions); stage 2: 10 epochs instead of 100 with the decays past
epochs 6, 8 and 9; the augmentations applied to a batch at once (``collate_fn``), each image
drawing its own parameters, with torch's global generator; CPU, one process, no
``DataParallel``, apex, TensorBoard logger or checkpoints. At this size the SupCon loss falls from
4.84 (ln 127, chance) to about 3.2-3.35 and the linear classifier reaches 0.91-0.96 held-out
accuracy on seeds 0-2.
Measure only (not in the program): nothing; the variants are measured by ``validate``'s last
top-1 accuracy of the linear classifier on the held-out split (``val_acc``, the number
``main_linear.py`` prints) and by ``best_acc``.

nndx, as the author would add it, once per training loop (the program trains two model/optimizer
pairs, one after the other): stage 1, a preflight ``nndx.probe`` of ``SupConResNet`` on the first
batch of views ``(torch.cat([view1, view2]), labels)`` with the loss function the loop computes
(split, stacked, ``SupConLoss``) and the SGD optimizer; ``nndx.Monitor(model, optimizer)`` around
the epochs with ``SupConLoss`` called through ``mon.loss_fn``, each step's loss logged; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. Stage 2, the same for the
``LinearClassifier`` on the first batch of frozen-encoder features with ``CrossEntropyLoss``, its
optimizer and the data splits (the encoder's features of the training images and of the held-out
images through the validation transform, with their labels); each step's loss and accuracy
logged, each ``validate`` logged as ``split="val"``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "supcon"
SOURCE = Source("HobbitLong/SupContrast", "main_supcon.py", "66a8fe53880d6a1084b2e4e0db0a019024d6d41a",
                "BSD-2-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (main_supcon.py then main_linear.py defaults, shrunk)"),
        Variant(
            "features_viewed_not_stacked",
            "features = features.view(bsz, 2, -1) in place of the split into f1, f2 and the stack along dim 1: "
            "the (bsz, n_views, dim) tensor SupConLoss is given pairs rows 2i and 2i+1 of torch.cat([view1, "
            "view2]) (views of two different images) under label i, so anchors, their 'other view' and the "
            "label mask no longer belong together",
            (C.WRONG_RESHAPE, C.LABELS_MISALIGNED),
            ("https://github.com/user0407/CLUDA/issues/6", "https://github.com/HobbitLong/SupContrast/issues/95",
             "https://github.com/HobbitLong/SupContrast/issues/99"),
            Measure("val_acc", "the linear classifier's final held-out accuracy at least 0.05 below the healthy run's "
                    "(0.956/0.931/0.911 healthy, 0.492/0.511/0.492 buggy on seeds 0-2: the SupCon loss stays at "
                    "4.83, chance)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "lr_without_warmup",
            "stage 1 run with --learning_rate 0.5, the README's SupCon setting (meant for batch 1024 with "
            "--cosine and --warm), at the small batch and without the warm-up (opt.warm is switched on by "
            "itself only above batch 256): ten times the default 0.05",
            (C.LR_TOO_HIGH,),
            ("https://github.com/HobbitLong/SupContrast/issues/42",
             "https://github.com/HobbitLong/SupContrast/issues/127",
             "https://github.com/HobbitLong/SupContrast/issues/3"),
            Measure("val_acc", "the linear classifier's final held-out accuracy at least 0.05 below the healthy run's "
                    "(0.956/0.931/0.911 healthy, 0.725/0.650/0.789 buggy on seeds 0-2: the SupCon loss ends at "
                    "4.2-4.4 against 3.2-3.35)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

SIZE = 16
SCALE = (0.5, 1.0)  # RandomResizedCrop's (0.2, 1.): a 20% crop of an upscaled 8x8 digit is unreadable
WIDTHS = (8, 16, 32, 64)
N_CLASSES = 10
SUPCON = {"batch_size": 64, "epochs": 12, "learning_rate": 0.05, "lr_decay_epochs": (8, 10, 11), "lr_decay_rate": 0.1,
          "weight_decay": 1e-4, "momentum": 0.9, "temp": 0.07, "warm": False, "cosine": False}  # fmt: skip
LINEAR = {"batch_size": 64, "epochs": 10, "learning_rate": 0.1, "lr_decay_epochs": (6, 8, 9), "lr_decay_rate": 0.2,
          "weight_decay": 0.0, "momentum": 0.9, "warm": False, "cosine": False}  # fmt: skip


# --------------------------------------------------------------------------- torchvision's transforms, batched


def random_resized_crop(imgs: torch.Tensor, size: int, scale=(0.2, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    """``RandomResizedCrop(size, scale)`` on each image of (N, C, H, W): up to 10 tries of a random
    area and log-uniform aspect ratio, the central crop when none fits; bilinear resize."""
    n, _, height, width = imgs.shape
    area = height * width
    tries = 10
    target = area * torch.empty(n, tries).uniform_(scale[0], scale[1])
    aspect = torch.exp(torch.empty(n, tries).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    w = torch.sqrt(target * aspect).round()
    h = torch.sqrt(target / aspect).round()
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(ok.any(1), ok.float().argmax(1), torch.zeros(n, dtype=torch.long))
    w = torch.where(ok.any(1), w[torch.arange(n), first], torch.full((n,), float(width)))
    h = torch.where(ok.any(1), h[torch.arange(n), first], torch.full((n,), float(height)))
    top = torch.floor(torch.rand(n) * (height - h + 1))
    left = torch.floor(torch.rand(n) * (width - w + 1))
    # the crop box as an affine map of the normalised output grid onto the input
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = w / width
    theta[:, 1, 1] = h / height
    theta[:, 0, 2] = (2 * left + w) / width - 1
    theta[:, 1, 2] = (2 * top + h) / height - 1
    grid = F.affine_grid(theta, [n, imgs.shape[1], size, size], align_corners=False)
    return F.grid_sample(imgs, grid, mode="bilinear", padding_mode="border", align_corners=False)


def horizontal_flip(imgs: torch.Tensor, p: float = 0.5) -> torch.Tensor:
    flip = torch.rand(len(imgs)) < p
    return torch.where(flip[:, None, None, None], imgs.flip(-1), imgs)


def _grey(imgs: torch.Tensor) -> torch.Tensor:
    return (0.299 * imgs[:, 0] + 0.587 * imgs[:, 1] + 0.114 * imgs[:, 2]).unsqueeze(1)


def _adjust_hue(imgs: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """RGB -> HSV, hue turned by ``shift`` (fraction of the circle, one per image), back to RGB."""
    r, g, b = imgs[:, 0], imgs[:, 1], imgs[:, 2]
    maxc, _ = imgs.max(1)
    minc, _ = imgs.min(1)
    delta = maxc - minc
    sat = torch.where(maxc > 0, delta / maxc.clamp(min=1e-12), torch.zeros_like(maxc))
    d = delta.clamp(min=1e-12)
    hue = torch.where(maxc == r, ((g - b) / d) % 6, torch.where(maxc == g, (b - r) / d + 2, (r - g) / d + 4)) / 6
    hue = torch.where(delta > 0, hue, torch.zeros_like(hue))
    hue = (hue + shift[:, None, None]) % 1.0
    sector = torch.floor(hue * 6)
    frac = hue * 6 - sector
    v = maxc
    p, q, t = v * (1 - sat), v * (1 - sat * frac), v * (1 - sat * (1 - frac))
    sector = sector.long() % 6
    table = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = torch.zeros_like(imgs)
    for k, (rr, gg, bb) in enumerate(table):
        sel = sector == k
        out[:, 0] = torch.where(sel, rr, out[:, 0])
        out[:, 1] = torch.where(sel, gg, out[:, 1])
        out[:, 2] = torch.where(sel, bb, out[:, 2])
    return out


def color_jitter(imgs: torch.Tensor, brightness: float, contrast: float, saturation: float, hue: float,
                 p: float) -> torch.Tensor:  # fmt: skip
    """``RandomApply([ColorJitter(b, c, s, h)], p)``: per image, with probability p, the four
    adjustments with their own factors in their own random order."""
    n = len(imgs)
    applied = torch.rand(n) < p
    factors = [torch.empty(n).uniform_(max(0.0, 1 - s), 1 + s) for s in (brightness, contrast, saturation)]
    factors.append(torch.empty(n).uniform_(-hue, hue))
    order = torch.argsort(torch.rand(n, 4), dim=1)  # torch.randperm(4) per image
    out = imgs
    for position in range(4):
        for op in range(4):
            sel = applied & (order[:, position] == op)
            if not sel.any():
                continue
            x, f = out[sel], factors[op][sel]
            if op == 0:
                x = (x * f[:, None, None, None]).clamp(0, 1)
            elif op == 1:
                mean = _grey(x).mean(dim=(1, 2, 3), keepdim=True)
                x = (f[:, None, None, None] * x + (1 - f[:, None, None, None]) * mean).clamp(0, 1)
            elif op == 2:
                x = (f[:, None, None, None] * x + (1 - f[:, None, None, None]) * _grey(x)).clamp(0, 1)
            else:
                x = _adjust_hue(x, f)
            out = out.clone()
            out[sel] = x
    return out


def random_grayscale(imgs: torch.Tensor, p: float) -> torch.Tensor:
    grey = torch.rand(len(imgs)) < p
    return torch.where(grey[:, None, None, None], _grey(imgs).expand_as(imgs), imgs)


class Normalize:
    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean, self.std = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)

    def __call__(self, imgs: torch.Tensor) -> torch.Tensor:
        return (imgs - self.mean) / self.std


class TwoCropTransform:
    """Create two crops of the same image."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.transform(x), self.transform(x)]


def pictures(images: torch.Tensor) -> torch.Tensor:
    """The digits as the loaders' PIL images would be: (N, 3, SIZE, SIZE) in [0, 1], upscaled, grey in
    three equal channels."""
    return data.upscaled(images, SIZE).repeat(1, 3, 1, 1)


class Pictures(Dataset):
    def __init__(self, pictures: torch.Tensor, labels: torch.Tensor) -> None:
        self.pictures, self.labels = pictures, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.pictures[index], self.labels[index]


def batch_transform(transform):
    """A collate_fn applying ``transform`` to the stacked batch (every image draws its own parameters)."""

    def collate(items):
        imgs = torch.stack([x for x, _ in items])
        return transform(imgs), torch.stack([y for _, y in items])

    return collate


# --------------------------------------------------------------------------- networks/resnet_big.py


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, is_last: bool = False) -> None:
        super().__init__()
        self.is_last = is_last
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x: torch.Tensor):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        preact = out
        out = F.relu(out)
        return (out, preact) if self.is_last else out


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, in_channel: int = 3, widths=WIDTHS) -> None:
        super().__init__()
        self.in_planes = widths[0]
        self.conv1 = nn.Conv2d(in_channel, widths[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.layer1 = self._make_layer(block, widths[0], num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, widths[1], num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], num_blocks[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return torch.flatten(self.avgpool(out), 1)


def resnet18(**kwargs) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], **kwargs)


model_dict = {"resnet18": [resnet18, WIDTHS[-1]]}


class SupConResNet(nn.Module):
    """backbone + projection head"""

    def __init__(self, name: str = "resnet18", head: str = "mlp", feat_dim: int = 128) -> None:
        super().__init__()
        model_fun, dim_in = model_dict[name]
        self.encoder = model_fun()
        if head == "linear":
            self.head = nn.Linear(dim_in, feat_dim)
        elif head == "mlp":
            self.head = nn.Sequential(nn.Linear(dim_in, dim_in), nn.ReLU(inplace=True), nn.Linear(dim_in, feat_dim))
        else:
            raise NotImplementedError(f"head not supported: {head}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.encoder(x)), dim=1)


class LinearClassifier(nn.Module):
    def __init__(self, name: str = "resnet18", num_classes: int = 10) -> None:
        super().__init__()
        _, feat_dim = model_dict[name]
        self.fc = nn.Linear(feat_dim, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)


# --------------------------------------------------------------------------- losses.py


class SupConLoss(nn.Module):
    """Supervised Contrastive Learning (the unsupervised SimCLR loss when labels and mask are None)."""

    def __init__(self, temperature: float = 0.07, contrast_mode: str = "all", base_temperature: float = 0.07) -> None:
        super().__init__()
        self.temperature = temperature
        self.contrast_mode = contrast_mode
        self.base_temperature = base_temperature

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        if len(features.shape) < 3:
            raise ValueError("`features` needs to be [bsz, n_views, ...], at least 3 dimensions are required")
        if len(features.shape) > 3:
            features = features.view(features.shape[0], features.shape[1], -1)
        batch_size = features.shape[0]
        if labels is not None and mask is not None:
            raise ValueError("Cannot define both `labels` and `mask`")
        elif labels is None and mask is None:
            mask = torch.eye(batch_size, dtype=torch.float32)
        elif labels is not None:
            labels = labels.contiguous().view(-1, 1)
            if labels.shape[0] != batch_size:
                raise ValueError("Num of labels does not match num of features")
            mask = torch.eq(labels, labels.T).float()
        else:
            mask = mask.float()

        contrast_count = features.shape[1]
        contrast_feature = torch.cat(torch.unbind(features, dim=1), dim=0)
        if self.contrast_mode == "one":
            anchor_feature, anchor_count = features[:, 0], 1
        elif self.contrast_mode == "all":
            anchor_feature, anchor_count = contrast_feature, contrast_count
        else:
            raise ValueError(f"Unknown mode: {self.contrast_mode}")

        anchor_dot_contrast = torch.div(torch.matmul(anchor_feature, contrast_feature.T), self.temperature)
        logits_max, _ = torch.max(anchor_dot_contrast, dim=1, keepdim=True)  # for numerical stability
        logits = anchor_dot_contrast - logits_max.detach()

        mask = mask.repeat(anchor_count, contrast_count)
        logits_mask = torch.scatter(torch.ones_like(mask), 1, torch.arange(batch_size * anchor_count).view(-1, 1), 0)
        mask = mask * logits_mask

        exp_logits = torch.exp(logits) * logits_mask
        log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))

        mask_pos_pairs = mask.sum(1)
        mask_pos_pairs = torch.where(mask_pos_pairs < 1e-6, 1, mask_pos_pairs)
        mean_log_prob_pos = (mask * log_prob).sum(1) / mask_pos_pairs

        loss = -(self.temperature / self.base_temperature) * mean_log_prob_pos
        return loss.view(anchor_count, batch_size).mean()


# --------------------------------------------------------------------------- util.py


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n
        self.avg = self.sum / self.count


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[float]:
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum().item() * 100.0 / target.size(0) for k in topk]


def adjust_learning_rate(args: dict, optimizer, epoch: int) -> None:
    lr = args["learning_rate"]
    if args["cosine"]:
        eta_min = lr * (args["lr_decay_rate"] ** 3)
        lr = eta_min + (lr - eta_min) * (1 + math.cos(math.pi * epoch / args["epochs"])) / 2
    else:
        steps = np.sum(epoch > np.asarray(args["lr_decay_epochs"]))
        if steps > 0:
            lr = lr * (args["lr_decay_rate"] ** steps)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def warmup_learning_rate(args: dict, epoch: int, batch_id: int, total_batches: int, optimizer) -> None:
    if args["warm"] and epoch <= args["warm_epochs"]:
        p = (batch_id + (epoch - 1) * total_batches) / (args["warm_epochs"] * total_batches)
        lr = args["warmup_from"] + p * (args["warmup_to"] - args["warmup_from"])
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr


def set_optimizer(args: dict, model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=args["learning_rate"], momentum=args["momentum"],
                           weight_decay=args["weight_decay"])  # fmt: skip


# --------------------------------------------------------------------------- main_supcon.py


def train_supcon(train_loader, model, criterion, optimizer, epoch: int, opt: dict, variant: str, nx: Nndx,
                 mon) -> float:  # fmt: skip
    """one epoch training"""
    model.train()
    losses = AverageMeter()
    for idx, (images, labels) in enumerate(train_loader):
        images = torch.cat([images[0], images[1]], dim=0)
        bsz = labels.shape[0]
        warmup_learning_rate(opt, epoch, idx, len(train_loader), optimizer)

        features = model(images)
        if variant == "features_viewed_not_stacked":
            features = features.view(bsz, 2, -1)
        else:
            f1, f2 = torch.split(features, [bsz, bsz], dim=0)
            features = torch.cat([f1.unsqueeze(1), f2.unsqueeze(1)], dim=1)
        loss = mon.loss_fn(features, labels)
        losses.update(loss.item(), bsz)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
    return losses.avg


# --------------------------------------------------------------------------- main_linear.py


def train_linear(train_loader, model, classifier, criterion, optimizer, epoch: int, opt: dict, nx: Nndx,
                 mon) -> tuple[float, float]:  # fmt: skip
    """one epoch training"""
    model.eval()
    classifier.train()
    losses, top1 = AverageMeter(), AverageMeter()
    for idx, (images, labels) in enumerate(train_loader):
        bsz = labels.shape[0]
        warmup_learning_rate(opt, epoch, idx, len(train_loader), optimizer)
        with torch.no_grad():
            features = model.encoder(images)
        output = classifier(features.detach())
        loss = mon.loss_fn(output, labels)
        losses.update(loss.item(), bsz)
        acc1 = accuracy(output, labels)[0]
        top1.update(acc1, bsz)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss, accuracy=acc1 / 100.0))  # noqa: B023
    return losses.avg, top1.avg


def validate(val_loader, model, classifier, criterion) -> tuple[float, float]:
    model.eval()
    classifier.eval()
    losses, top1 = AverageMeter(), AverageMeter()
    with torch.no_grad():
        for images, labels in val_loader:
            output = classifier(model.encoder(images))
            losses.update(criterion(output, labels).item(), labels.shape[0])
            top1.update(accuracy(output, labels)[0], labels.shape[0])
    return losses.avg, top1.avg


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    opt = dict(SUPCON)
    if variant == "lr_without_warmup":
        opt["learning_rate"] = 0.5

    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_pictures, test_pictures = pictures(train_raw), pictures(test_raw)
    mean, std = train_pictures.mean(dim=(0, 2, 3)), train_pictures.std(dim=(0, 2, 3))
    normalize = Normalize(mean, std)

    # ---- stage 1: main_supcon.py
    def supcon_transform(imgs: torch.Tensor) -> torch.Tensor:
        imgs = random_resized_crop(imgs, SIZE, scale=SCALE)
        imgs = horizontal_flip(imgs)
        imgs = color_jitter(imgs, 0.4, 0.4, 0.4, 0.1, p=0.8)
        imgs = random_grayscale(imgs, p=0.2)
        return normalize(imgs)

    train_dataset = Pictures(train_pictures, train_labels)
    train_loader = DataLoader(train_dataset, batch_size=opt["batch_size"], shuffle=True,
                              collate_fn=batch_transform(TwoCropTransform(supcon_transform)))  # fmt: skip
    model = SupConResNet(name="resnet18")
    criterion = SupConLoss(temperature=opt["temp"])
    optimizer = set_optimizer(opt, model)

    def supcon_loss(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        bsz = labels.shape[0]
        f1, f2 = torch.split(output, [bsz, bsz], dim=0)
        return criterion(torch.cat([f1.unsqueeze(1), f2.unsqueeze(1)], dim=1), labels)

    first_views, first_labels = next(iter(DataLoader(train_dataset, batch_size=opt["batch_size"],
                                                     collate_fn=batch_transform(TwoCropTransform(supcon_transform)))))
    probe_batch = (torch.cat(first_views, dim=0), first_labels)
    nx.preflight(model, probe_batch, supcon_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)
    supcon_losses = []
    for epoch in range(1, opt["epochs"] + 1):
        adjust_learning_rate(opt, optimizer, epoch)
        supcon_losses.append(train_supcon(train_loader, model, criterion, optimizer, epoch, opt, variant, nx, mon))
    nx.finish(mon, model, probe_batch, supcon_loss, optimizer=optimizer)

    # ---- stage 2: main_linear.py
    lin = dict(LINEAR)

    def ce_train_transform(imgs: torch.Tensor) -> torch.Tensor:
        return normalize(horizontal_flip(random_resized_crop(imgs, SIZE, scale=SCALE)))

    lin_train_loader = DataLoader(train_dataset, batch_size=lin["batch_size"], shuffle=True,
                                  collate_fn=batch_transform(ce_train_transform))  # fmt: skip
    val_loader = DataLoader(Pictures(test_pictures, test_labels), batch_size=256, shuffle=False,
                            collate_fn=batch_transform(normalize))  # fmt: skip
    classifier = LinearClassifier(name="resnet18", num_classes=N_CLASSES)
    ce = nn.CrossEntropyLoss()
    lin_optimizer = set_optimizer(lin, classifier)

    model.eval()
    with torch.no_grad():
        first_images, first_y = next(iter(DataLoader(train_dataset, batch_size=lin["batch_size"],
                                                     collate_fn=batch_transform(ce_train_transform))))
        lin_batch = (model.encoder(first_images), first_y)
        splits = (model.encoder(normalize(train_pictures)), train_labels.clone(),
                  model.encoder(normalize(test_pictures)), test_labels.clone())  # fmt: skip
    nx.preflight(classifier, lin_batch, ce, optimizer=lin_optimizer, data=splits)
    lin_mon = nx.monitor(classifier, lin_optimizer, every=5, loss_fn=ce)
    best_acc = 0.0
    val_loss = val_acc = float("nan")
    train_acc = float("nan")
    for epoch in range(1, lin["epochs"] + 1):
        adjust_learning_rate(lin, lin_optimizer, epoch)
        _, train_acc = train_linear(lin_train_loader, model, classifier, ce, lin_optimizer, epoch, lin, nx, lin_mon)
        val_loss, val_acc = validate(val_loader, model, classifier, ce)
        nx.timed(lambda: lin_mon.log(val_loss, split="val", accuracy=val_acc / 100.0))  # noqa: B023
        best_acc = max(best_acc, val_acc)
    nx.finish(lin_mon, classifier, lin_batch, ce, optimizer=lin_optimizer, data=splits)

    return {
        "val_acc": val_acc / 100.0,
        "best_acc": best_acc / 100.0,
        "val_loss": val_loss,
        "linear_train_acc": train_acc / 100.0,
        "supcon_first_loss": supcon_losses[0],
        "supcon_final_loss": supcon_losses[-1],
    }

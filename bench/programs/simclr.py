"""Port of sthalles/SimCLR: contrastive pre-training of a ResNet-18 with the InfoNCE loss.

Source: github.com/sthalles/SimCLR, ``run.py``, ``simclr.py``, ``models/resnet_simclr.py``,
``data_aug/contrastive_learning_dataset.py``, ``data_aug/view_generator.py`` and
``data_aug/gaussian_blur.py`` at commit 1848fc934ad844ae630e6c452300433fe99acfd9 (MIT,
Copyright (c) 2020 Thalles Silva). Written anew from the facts of those files; no code copied.

Kept: ``ContrastiveLearningViewGenerator`` (the dataset's transform returns a list of
``n_views = 2`` independent draws of one augmentation pipeline); the pipeline of
``get_simclr_pipeline_transform(size)``: ``RandomResizedCrop(size)`` (scale 0.08-1, ratio
3/4-4/3), ``RandomHorizontalFlip()``, ``RandomApply([ColorJitter(0.8, 0.8, 0.8, 0.2)],
p=0.8)``, ``RandomGrayscale(p=0.2)``, the repository's ``GaussianBlur(kernel_size=int(0.1 *
size))`` (a separable kernel with sigma drawn from [0.1, 2.0], reflection padding, always
applied), ``ToTensor()`` and no normalisation; the DataLoader (shuffled, ``drop_last=True``);
``ResNetSimCLR``: torchvision's ``resnet18(num_classes=out_dim)`` with its ``fc`` replaced by
``Sequential(Linear(dim_mlp, dim_mlp), ReLU(), fc)`` (the projection head), returning the
projections; ``info_nce_loss``: labels from ``arange(batch_size)`` repeated per view, an
equality matrix, ``F.normalize`` on the features, the cosine similarity matrix, the main
diagonal dropped from both, the positives gathered first and the negatives after them,
``logits / temperature`` and all-zero targets, scored by ``nn.CrossEntropyLoss``; the loop
``images = torch.cat(images, dim=0)``, forward, loss, ``optimizer.zero_grad()``, backward,
``step`` (the ``GradScaler``/``autocast`` pair is disabled without ``--fp16-precision``: a
plain backward and step), top-1/top-5 of the logits every ``log_every_n_steps``;
``Adam(lr=0.0003, weight_decay=1e-4)``; ``CosineAnnealingLR(T_max=len(train_loader),
eta_min=0)`` stepped once per epoch after the warm-up epochs; ``temperature = 0.07``,
``out_dim = 128``; torchvision's ResNet init (Kaiming-normal fan-out convolutions, BatchNorm
1/0).
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out) as CIFAR-10-like
colour images instead of STL10's 100,000 96x96 photos: each digit upscaled to 32x32 and
painted in its own random foreground colour on its own random background colour (grey
digits alone leave crops of one image no more alike than crops of two images of the same
class, and the ColorJitter leaves them nothing else); ``get_simclr_pipeline_transform(32)``
(the repository's CIFAR-10 setting); the ResNet-18's stage widths 8/16/32/64 instead of
64/128/256/512 (``dim_mlp`` 64); batch 32 instead of 256; 4 epochs (176 steps) instead of
200, with 1 warm-up epoch instead of 10; ``log_every_n_steps`` 5 instead of 100. The
augmentations draw from torch's global generator (the repository's blur draws sigma from
numpy's). At this size the run is SimCLR's first few hundred steps: the loss falls from
about 4.6 to 4.1 (ln 63 = 4.14 is chance) and held-out positives are ranked first 3-5% of
the time (chance 1.6%); the repository's linear evaluation (``feature_eval``) is not ported:
its accuracy does not move this early. The measure (not part of the program) is the
InfoNCE loss on held-out images with two independent augmentations, the model in eval mode.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch of views
``(torch.cat(images), zeros)`` (the zeros being the targets ``info_nce_loss`` gives the
criterion) with ``criterion(info_nce_loss(features)[0], targets)`` as the loss function,
``nndx.Monitor`` around ``SimCLR.train`` with the criterion called through ``mon.loss_fn``,
each step's loss logged (pre-training has no validation split), then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
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

NAME = "simclr"
SOURCE = Source("sthalles/SimCLR", "simclr.py", "1848fc934ad844ae630e6c452300433fe99acfd9", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "views_not_independent",
            "the view generator returns [base_transform(x)] * n_views (one augmented draw, listed twice) "
            "instead of one draw per view: every positive pair is two identical images, the task is trivial",
            (C.DATA_LEAKAGE,),
            ("https://github.com/catalyst-team/catalyst/pull/1278",
             "https://github.com/microsoft/A-CLIP/pull/4",
             "https://github.com/sthalles/SimCLR/issues/9"),
            Measure("heldout_loss", "InfoNCE loss on held-out images with two independent augmentations (the "
                    "right positives), at least 1.15x the healthy run's (4.07/4.10/4.04 healthy, 7.59/7.80/7.81 "
                    "buggy on seeds 0-2, while its training loss falls to 0.01)",
                    lambda healthy, buggy: not buggy < 1.15 * healthy),
        ),
        Variant(
            "features_not_normalized",
            "F.normalize(features, dim=1) left out of info_nce_loss: the 'cosine' similarity matrix is raw dot "
            "products of the projections, divided by the temperature 0.07",
            (C.WRONG_LOSS,),
            ("https://github.com/tensorflow/similarity/issues/237",
             "https://github.com/lucidrains/CoCa-pytorch/issues/10",
             "https://github.com/Link-Li/CLMLF/issues/3"),
            Measure("heldout_loss", "InfoNCE loss (with normalised features) on held-out images with two "
                    "independent augmentations, at least 1.1x the healthy run's (4.07/4.10/4.04 healthy, "
                    "5.21/4.73/5.06 buggy on seeds 0-2; first training losses 72-131 against 4.6-4.9)",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
    )
}

SIZE = 32  # CIFAR-10's, get_simclr_pipeline_transform(32)
WIDTHS = (8, 16, 32, 64)
ARGS = {"batch_size": 32, "epochs": 4, "warmup_epochs": 1, "lr": 0.0003, "weight_decay": 1e-4, "out_dim": 128,
        "log_every_n_steps": 5, "temperature": 0.07, "n_views": 2}  # fmt: skip


# --------------------------------------------------------------------------- data_aug (torchvision's, by hand)


def _uniform(low: float, high: float, generator: torch.Generator | None) -> float:
    return low + (high - low) * torch.rand(1, generator=generator).item()


def random_resized_crop(img: torch.Tensor, size: int, generator=None, scale=(0.08, 1.0),
                        ratio=(3 / 4, 4 / 3)) -> torch.Tensor:  # fmt: skip
    """``transforms.RandomResizedCrop(size)``: a random area/aspect crop, resized (bilinear)."""
    _, height, width = img.shape
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * _uniform(scale[0], scale[1], generator)
        aspect = math.exp(_uniform(log_ratio[0], log_ratio[1], generator))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            j = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            break
    else:  # torchvision's fallback: a central crop
        h, w = height, width
        i, j = 0, 0
    crop = img[:, i : i + h, j : j + w].unsqueeze(0)
    return F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]


def _grey(img: torch.Tensor) -> torch.Tensor:
    return (0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2]).unsqueeze(0)


def _hue_shift(img: torch.Tensor, shift: float) -> torch.Tensor:
    """``adjust_hue``: RGB -> HSV, the hue turned by ``shift`` (a fraction of the circle), back to RGB."""
    r, g, b = img[0], img[1], img[2]
    maxc, _ = img.max(dim=0)
    minc, _ = img.min(dim=0)
    v, delta = maxc, maxc - minc
    s = torch.where(maxc > 0, delta / maxc.clamp(min=1e-12), torch.zeros_like(maxc))
    d = delta.clamp(min=1e-12)
    h = torch.where(maxc == r, ((g - b) / d) % 6, torch.where(maxc == g, (b - r) / d + 2, (r - g) / d + 4)) / 6
    h = torch.where(delta > 0, h, torch.zeros_like(h))
    h = (h + shift) % 1.0
    i = torch.floor(h * 6)
    f = h * 6 - i
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    i = i.long() % 6
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = torch.zeros_like(img)
    for k, (rr, gg, bb) in enumerate(choices):
        sel = i == k
        out[0] = torch.where(sel, rr, out[0])
        out[1] = torch.where(sel, gg, out[1])
        out[2] = torch.where(sel, bb, out[2])
    return out


def color_jitter(img: torch.Tensor, strength: float, hue: float, generator=None) -> torch.Tensor:
    """``ColorJitter(brightness, contrast, saturation = strength, hue)``: the four in a random order."""
    factors = [_uniform(max(0.0, 1 - strength), 1 + strength, generator) for _ in range(3)]
    factors.append(_uniform(-hue, hue, generator))
    for k in torch.randperm(4, generator=generator).tolist():
        f = factors[k]
        if k == 0:
            img = (img * f).clamp(0, 1)
        elif k == 1:
            img = (f * img + (1 - f) * _grey(img).mean()).clamp(0, 1)
        elif k == 2:
            img = (f * img + (1 - f) * _grey(img)).clamp(0, 1)
        else:
            img = _hue_shift(img, f)
    return img


def gaussian_blur(img: torch.Tensor, kernel_size: int, generator=None) -> torch.Tensor:
    """The repository's ``GaussianBlur``: a separable kernel of odd size 2 * (k // 2) + 1, sigma
    uniform in [0.1, 2.0], reflection padding, applied to every image."""
    radius = kernel_size // 2
    sigma = _uniform(0.1, 2.0, generator)
    x = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-(x**2) / (2 * sigma * sigma))
    kernel = kernel / kernel.sum()
    out = F.pad(img.unsqueeze(0), (radius, radius, radius, radius), mode="reflect")[0] if radius else img
    size_h, size_w = img.shape[-2:]
    out = sum(w * out[:, i : i + size_h, :] for i, w in enumerate(kernel.tolist()))  # blur_h
    out = sum(w * out[:, :, i : i + size_w] for i, w in enumerate(kernel.tolist()))  # blur_v
    return out


def simclr_pipeline_transform(size: int, s: float = 1.0):
    """``get_simclr_pipeline_transform(size, s)``: the Compose, as one function of an image
    (3, H, W) in [0, 1] (``ToTensor`` last: the images already are float tensors)."""

    def transform(img: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        img = random_resized_crop(img, size, generator)
        if torch.rand(1, generator=generator).item() < 0.5:  # RandomHorizontalFlip
            img = img.flip(-1)
        if torch.rand(1, generator=generator).item() < 0.8:  # RandomApply([color_jitter], p=0.8)
            img = color_jitter(img, 0.8 * s, 0.2 * s, generator)
        if torch.rand(1, generator=generator).item() < 0.2:  # RandomGrayscale(p=0.2)
            img = _grey(img).repeat(3, 1, 1)
        return gaussian_blur(img, kernel_size=int(0.1 * size), generator=generator)

    return transform


class ContrastiveLearningViewGenerator:
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform, n_views: int = 2, independent: bool = True) -> None:
        self.base_transform = base_transform
        self.n_views = n_views
        self.independent = independent

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.independent:  # the bug: one draw, listed n_views times
            return [self.base_transform(x)] * self.n_views
        return [self.base_transform(x) for _ in range(self.n_views)]


def coloured(images: torch.Tensor, seed: int) -> torch.Tensor:
    """The digits as CIFAR-10-like colour images (N, 3, 32, 32) in [0, 1]: each upscaled digit
    painted in its own random foreground colour on its own random background colour."""
    rng = np.random.default_rng(seed)
    fg = torch.from_numpy(rng.random((len(images), 3, 1, 1))).float()
    bg = torch.from_numpy(rng.random((len(images), 3, 1, 1))).float()
    mask = data.upscaled(images, SIZE)
    return mask * fg + (1 - mask) * bg


class DigitImages(Dataset):
    """The dataset: the coloured digits, with their (unused) labels."""

    def __init__(self, pictures: torch.Tensor, labels: torch.Tensor, transform=None) -> None:
        self.images = pictures
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        img = self.images[index]
        return (self.transform(img) if self.transform else img), self.labels[index]


# --------------------------------------------------------------------------- models/resnet_simclr.py


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's ``resnet18(pretrained=False, num_classes=...)``, narrower."""

    def __init__(self, num_classes: int = 1000, widths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        widths = widths or WIDTHS
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, stages = widths[0], []
        for i, planes in enumerate(widths):
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, 1 if i == 0 else 2), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class ResNetSimCLR(nn.Module):
    def __init__(self, base_model: str, out_dim: int) -> None:
        super().__init__()
        self.resnet_dict = {"resnet18": lambda: ResNet18(num_classes=out_dim)}
        self.backbone = self._get_basemodel(base_model)
        dim_mlp = self.backbone.fc.in_features
        # add mlp projection head
        self.backbone.fc = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), self.backbone.fc)

    def _get_basemodel(self, model_name: str) -> nn.Module:
        if model_name not in self.resnet_dict:
            raise ValueError("Invalid backbone architecture: pass resnet18")
        return self.resnet_dict[model_name]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)


# --------------------------------------------------------------------------- simclr.py


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[float]:
    """utils.accuracy: the top-k hit rates, in percent."""
    with torch.no_grad():
        _, pred = output.topk(max(topk), 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum().item() * 100.0 / target.size(0) for k in topk]


class SimCLR:
    def __init__(self, model: nn.Module, optimizer, scheduler, args: dict, normalize: bool = True) -> None:
        self.args, self.model, self.optimizer, self.scheduler = args, model, optimizer, scheduler
        self.criterion = nn.CrossEntropyLoss()
        self.normalize = normalize
        self.logged: list[tuple[int, float, float, float]] = []  # the SummaryWriter's scalars

    def info_nce_loss(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size, n_views = self.args["batch_size"], self.args["n_views"]
        labels = torch.cat([torch.arange(batch_size) for _ in range(n_views)], dim=0)
        labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
        if self.normalize:  # the bug: left out, the "cosine" similarities are raw dot products
            features = F.normalize(features, dim=1)
        similarity_matrix = torch.matmul(features, features.T)
        # the main diagonal out of both
        mask = torch.eye(labels.shape[0], dtype=torch.bool)
        labels = labels[~mask].view(labels.shape[0], -1)
        similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)
        positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)
        negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)
        logits = torch.cat([positives, negatives], dim=1)
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        return logits / self.args["temperature"], labels

    def train(self, train_loader, mon) -> list[float]:
        n_iter = 0
        losses: list[float] = []
        for epoch_counter in range(self.args["epochs"]):
            for images, _ in train_loader:
                images = torch.cat(images, dim=0)
                features = self.model(images)
                logits, labels = self.info_nce_loss(features)
                loss = mon.loss_fn(logits, labels)

                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                mon.log(loss)
                losses.append(loss.item())

                if n_iter % self.args["log_every_n_steps"] == 0:
                    top1, top5 = accuracy(logits, labels, topk=(1, 5))
                    self.logged.append((n_iter, loss.item(), top1, top5))
                n_iter += 1

            # warmup for the first epochs
            if epoch_counter >= self.args["warmup_epochs"]:
                self.scheduler.step()
        return losses


# --------------------------------------------------------------------------- run.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)  # simclr.py's torch.manual_seed(0)
    args = dict(ARGS)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    views = ContrastiveLearningViewGenerator(simclr_pipeline_transform(SIZE), args["n_views"],
                                             independent=variant != "views_not_independent")  # fmt: skip
    train_pictures, test_pictures = coloured(train_images, seed), coloured(test_images, seed + 1)
    train_dataset = DigitImages(train_pictures, train_labels, transform=views)
    train_loader = DataLoader(train_dataset, batch_size=args["batch_size"], shuffle=True, drop_last=True)

    model = ResNetSimCLR(base_model="resnet18", out_dim=args["out_dim"])
    optimizer = torch.optim.Adam(model.parameters(), args["lr"], weight_decay=args["weight_decay"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(train_loader), eta_min=0,
                                                           last_epoch=-1)  # fmt: skip
    simclr = SimCLR(model, optimizer, scheduler, args, normalize=variant != "features_not_normalized")

    def contrastive_loss(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return simclr.criterion(simclr.info_nce_loss(features)[0], targets)

    first_views, _ = next(iter(DataLoader(train_dataset, batch_size=args["batch_size"])))
    first_images = torch.cat(first_views, dim=0)
    first_batch = (first_images, torch.zeros(len(first_images), dtype=torch.long))  # info_nce_loss's targets
    nx.preflight(model, first_batch, contrastive_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=simclr.criterion)
    losses = simclr.train(train_loader, mon)
    nx.finish(mon, model, first_batch, contrastive_loss, optimizer=optimizer)

    heldout_loss, heldout_top1 = heldout_contrastive(model, test_pictures, args["batch_size"], seed)
    return {
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-10:])),
        "logged_top1": float(np.mean([row[2] for row in simclr.logged[-5:]])),
        "heldout_loss": heldout_loss,
        "heldout_top1": heldout_top1,
    }


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def heldout_contrastive(model: nn.Module, pictures: torch.Tensor, batch_size: int, seed: int) -> tuple[float, float]:
    """SimCLR's own task on held-out images, scored with the right positives: two independent
    augmentations of each image (a fixed generator: the same views for every variant), in
    batches of the training batch size; (InfoNCE loss, top-1 %: the positive ranked first
    among the 2B - 1 other views), model in eval mode."""
    model.eval()
    transform = simclr_pipeline_transform(SIZE)
    generator = torch.Generator().manual_seed(10_000 + seed)
    scorer = SimCLR(model, None, None, dict(ARGS, batch_size=batch_size))
    losses, top1s = [], []
    for start in range(0, len(pictures) - batch_size + 1, batch_size):
        chunk = pictures[start : start + batch_size]
        views = [torch.stack([transform(p, generator) for p in chunk]) for _ in range(2)]
        logits, labels = scorer.info_nce_loss(model(torch.cat(views, dim=0)))
        losses.append(F.cross_entropy(logits, labels).item())
        top1s.append(accuracy(logits, labels)[0])
    return float(np.mean(losses)), float(np.mean(top1s))

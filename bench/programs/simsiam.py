"""Port of facebookresearch/simsiam: SimSiam, two augmented views through one encoder + projector,
a predictor on each, the negative cosine of each prediction against the other view's stop-gradient
projection.

Source: github.com/facebookresearch/simsiam, ``main_simsiam.py`` and ``simsiam/builder.py`` (with
``simsiam/loader.py``'s ``TwoCropsTransform`` and ``GaussianBlur``) at commit
a7bc1772896d0dad0806c51f0bb6f3b16d290468 (CC-BY-NC 4.0, Copyright (c) Facebook, Inc. and its
affiliates). Written anew from the facts of those files; no code copied.

Kept: ``SimSiam(base_encoder, dim, pred_dim)``: the encoder built with ``num_classes=dim`` and
``zero_init_residual=True``, its ``fc`` replaced by the 3-layer projector (Linear(no bias) -> BN ->
ReLU, twice, then the original ``fc`` with its bias frozen (``requires_grad = False``, "followed by
BN") and ``BatchNorm1d(dim, affine=False)``); the 2-layer predictor (Linear(no bias) -> BN -> ReLU
-> Linear); ``forward(x1, x2)`` returning ``p1, p2, z1.detach(), z2.detach()``; the criterion
``nn.CosineSimilarity(dim=1)`` and the loss ``-(cos(p1, z2).mean() + cos(p2, z1).mean()) * 0.5``;
``init_lr = lr * batch_size / 256`` with lr 0.05, ``SGD(momentum=0.9, weight_decay=1e-4)`` over all
parameters (``--fix-pred-lr`` off, its default), ``adjust_learning_rate`` (half-cosine decay per
epoch, set before each epoch); the augmentation (``RandomResizedCrop(scale=(0.2, 1))``,
``RandomApply(ColorJitter(0.4, 0.4, 0.4, 0.1), p=0.8)``, ``RandomGrayscale(0.2)``,
``RandomApply(GaussianBlur([.1, 2.]), p=0.5)``, ``RandomHorizontalFlip``, ``Normalize`` with the
ImageNet mean/std), two draws per image (``TwoCropsTransform``); shuffled ``drop_last`` batches,
``model.train()``, ``zero_grad``, ``backward``, ``step`` each step; seeded with ``random.seed`` and
``torch.manual_seed``.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out) upscaled to 16x16, grey in 3
channels, in [0, 1], instead of ImageNet; the ResNet-18 of the SimCLR port (widths 8/16/32/64, 64
features) instead of ResNet-50; ``dim`` 64 and ``pred_dim`` 16 instead of 2048 and 512 (the same
4:1 bottleneck); batch 64 instead of 512 (so ``init_lr`` 0.0125), 4 epochs instead of 100; the
blur a 3-tap kernel (the images are 16 pixels); no DDP/SyncBatchNorm (one process), no checkpoints.
Added, as the SimSiam/MoCo CIFAR demos do: a kNN monitor before training and after each epoch
(``model.eval()``, then a weighted kNN, k 20, t 0.1, on the normalised backbone features, the
``avgpool`` output before the projector, of the held-out images against the training images);
``train`` sets ``model.train()`` again at the start of each epoch, as ``main_simsiam.py`` does.

Measure only (not in the program): the last kNN monitor accuracy; a linear probe (logistic regression, 300 full-batch LBFGS
steps) on the same frozen features; and the paper's collapse indicator, the mean per-channel std of
the l2-normalised projections ``z`` of the held-out images (about 1/sqrt(dim) = 0.125 when not
collapsed, 0 when collapsed).

nndx, as the author would add it: a preflight ``nndx.probe`` on the ``SimSiam`` model with the
first batch's two views as its inputs and the program's loss as a function of the model's
``(p1, p2, z1, z2)`` output, ``nndx.Monitor(model, optimizer)`` around the loop with each step's
loss logged, then ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.moco import DigitImages, TwoCropsTransform, grey
from bench.programs.simclr import ResNet18, _grey, color_jitter, gaussian_blur, random_resized_crop
from nndx.report import CauseCode as C

NAME = "simsiam"
SOURCE = Source("facebookresearch/simsiam", "main_simsiam.py", "a7bc1772896d0dad0806c51f0bb6f3b16d290468",
                "CC-BY-NC-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (main_simsiam.py defaults, shrunk)"),
        Variant(
            "no_stop_gradient",
            "SimSiam.forward returns z1, z2 without .detach(): the gradient flows through both branches "
            "of the symmetric loss (no stop-gradient), the collapsing solution the paper's Sec. 4.1 shows",
            (C.WRONG_LOSS,),
            ("https://github.com/PatrickHua/SimSiam/issues/39",
             "https://github.com/facebookresearch/simsiam/issues/40",
             "https://github.com/vturrisi/solo-learn/pull/36"),
            Measure("z_std", "mean channel std of the held-out l2-normalised projections at most 0.6x the "
                    "healthy run's (collapse)",
                    lambda healthy, buggy: buggy < 0.6 * healthy),
        ),
        Variant(
            "train_mode_not_restored",
            "train() lacks its model.train() line, so after the kNN monitor's model.eval() every epoch trains "
            "in eval mode: the BatchNorm layers (the projector's and predictor's included) normalise with their "
            "running statistics instead of the batch's",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/tk-rusch/coRNN/issues/1",
             "https://github.com/facebookresearch/tacto/issues/25",
             "https://github.com/milesial/Pytorch-UNet/issues/31"),
            Measure("linear_acc", "held-out linear-probe accuracy of the frozen backbone features at least 0.05 "
                    "below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

SIZE = 16
CROP_SCALE = (0.2, 1.0)
ARGS = {"batch_size": 64, "epochs": 4, "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "dim": 64,
        "pred_dim": 16, "print_freq": 10}  # fmt: skip
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


# --------------------------------------------------------------------------- main_simsiam's augmentation


def simsiam_augmentation(img: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    img = random_resized_crop(img, SIZE, generator, scale=CROP_SCALE)
    if torch.rand(1, generator=generator).item() < 0.8:  # RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8)
        img = color_jitter(img, 0.4, 0.1, generator)
    if torch.rand(1, generator=generator).item() < 0.2:  # RandomGrayscale(p=0.2)
        img = _grey(img).repeat(3, 1, 1)
    if torch.rand(1, generator=generator).item() < 0.5:  # RandomApply([GaussianBlur([.1, 2.])], p=0.5)
        img = gaussian_blur(img, 3, generator)
    if torch.rand(1, generator=generator).item() < 0.5:  # RandomHorizontalFlip
        img = img.flip(-1)
    return (img - IMAGENET_MEAN) / IMAGENET_STD  # ToTensor (already one), normalize


# --------------------------------------------------------------------------- simsiam/builder.py


def resnet18(num_classes: int, zero_init_residual: bool = False) -> nn.Module:
    """torchvision's ``resnet18(num_classes=..., zero_init_residual=...)`` (narrowed)."""
    net = ResNet18(num_classes=num_classes)
    if zero_init_residual:
        for m in net.modules():
            if hasattr(m, "bn2") and isinstance(m.bn2, nn.BatchNorm2d):
                nn.init.constant_(m.bn2.weight, 0)
    return net


class SimSiam(nn.Module):
    def __init__(self, base_encoder, dim: int = 2048, pred_dim: int = 512, stop_gradient: bool = True) -> None:
        super().__init__()
        self.stop_gradient = stop_gradient
        self.encoder = base_encoder(num_classes=dim, zero_init_residual=True)
        prev_dim = self.encoder.fc.weight.shape[1]
        self.encoder.fc = nn.Sequential(
            nn.Linear(prev_dim, prev_dim, bias=False), nn.BatchNorm1d(prev_dim), nn.ReLU(inplace=True),
            nn.Linear(prev_dim, prev_dim, bias=False), nn.BatchNorm1d(prev_dim), nn.ReLU(inplace=True),
            self.encoder.fc, nn.BatchNorm1d(dim, affine=False),
        )  # fmt: skip
        self.encoder.fc[6].bias.requires_grad = False  # followed by BN: no bias
        self.predictor = nn.Sequential(nn.Linear(dim, pred_dim, bias=False), nn.BatchNorm1d(pred_dim),
                                       nn.ReLU(inplace=True), nn.Linear(pred_dim, dim))  # fmt: skip

    def forward(self, x1: torch.Tensor, x2: torch.Tensor):
        z1 = self.encoder(x1)
        z2 = self.encoder(x2)
        p1 = self.predictor(z1)
        p2 = self.predictor(z2)
        if not self.stop_gradient:  # the bug: no stop-gradient on the targets
            return p1, p2, z1, z2
        return p1, p2, z1.detach(), z2.detach()


def adjust_learning_rate(optimizer, init_lr: float, epoch: int, args: dict) -> None:
    cur_lr = init_lr * 0.5 * (1.0 + math.cos(math.pi * epoch / args["epochs"]))
    for param_group in optimizer.param_groups:
        if param_group.get("fix_lr"):
            param_group["lr"] = init_lr
        else:
            param_group["lr"] = cur_lr


def train_one_epoch(train_loader, model, criterion, optimizer, mon, losses: list, restore_train_mode: bool) -> None:
    if restore_train_mode:
        model.train()  # the bug: this line left out
    for images, _ in train_loader:
        p1, p2, z1, z2 = model(x1=images[0], x2=images[1])
        loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log(loss)
        losses.append(loss.item())


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def frozen_features(model: SimSiam, x: torch.Tensor) -> torch.Tensor:
    return model.encoder.features(x)


@torch.no_grad()
def knn_acc(bank: torch.Tensor, bank_labels: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor,
            k: int = 20, t: float = 0.1) -> float:  # fmt: skip
    bank, feats = F.normalize(bank, dim=1), F.normalize(feats, dim=1)
    sim_weight, sim_indices = (feats @ bank.T).topk(k=k, dim=-1)
    one_hot = torch.zeros(len(feats), k, 10).scatter_(-1, bank_labels[sim_indices].unsqueeze(-1), 1.0)
    scores = (one_hot * (sim_weight / t).exp().unsqueeze(-1)).sum(dim=1)
    return float((scores.argmax(1) == labels).float().mean())


def knn_monitor(model: SimSiam, memory, memory_labels, test, test_labels) -> float:
    """The author's kNN monitor, run before training and after each epoch: ``model.eval()``, a weighted
    kNN on the backbone features (the MoCo/SimSiam CIFAR demos' ``test``)."""
    model.eval()
    return knn_acc(frozen_features(model, memory), memory_labels, frozen_features(model, test), test_labels)


def linear_probe(train_f: torch.Tensor, train_y: torch.Tensor, test_f: torch.Tensor, test_y: torch.Tensor) -> float:
    mean, std = train_f.mean(0), train_f.std(0) + 1e-6
    a, b = (train_f - mean) / std, (test_f - mean) / std
    gen = torch.Generator().manual_seed(0)
    head = nn.Linear(a.shape[1], 10)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.01)
        head.bias.zero_()
    opt = torch.optim.LBFGS(head.parameters(), lr=0.5, max_iter=300, history_size=20)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(head(a), train_y) + 1e-4 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float((head(b).argmax(1) == test_y).float().mean())


# --------------------------------------------------------------------------- main_worker


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    torch.manual_seed(seed)
    args = dict(ARGS)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_pictures, test_pictures = grey(train_images), grey(test_images)
    train_dataset = DigitImages(train_pictures, train_labels, TwoCropsTransform(simsiam_augmentation))
    train_loader = DataLoader(train_dataset, batch_size=args["batch_size"], shuffle=True, drop_last=True)

    model = SimSiam(resnet18, args["dim"], args["pred_dim"], stop_gradient=variant != "no_stop_gradient")
    init_lr = args["lr"] * args["batch_size"] / 256
    criterion = nn.CosineSimilarity(dim=1)
    optimizer = torch.optim.SGD(model.parameters(), init_lr, momentum=args["momentum"],
                                weight_decay=args["weight_decay"])  # fmt: skip

    def simsiam_loss(output, _target) -> torch.Tensor:
        p1, p2, z1, z2 = output
        return -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5

    gen = torch.Generator().manual_seed(5_000 + seed)
    first = [train_pictures[i] for i in range(args["batch_size"])]
    probe_views = [torch.stack([simsiam_augmentation(p, gen) for p in first]) for _ in range(2)]
    probe_batch = ((probe_views[0], probe_views[1]), None)
    nx.preflight(model, probe_batch, simsiam_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    memory = (train_pictures - IMAGENET_MEAN) / IMAGENET_STD
    test_inputs = (test_pictures - IMAGENET_MEAN) / IMAGENET_STD
    losses: list[float] = []
    knn_accs = [knn_monitor(model, memory, train_labels, test_inputs, test_labels)]
    for epoch in range(args["epochs"]):
        adjust_learning_rate(optimizer, init_lr, epoch, args)
        train_one_epoch(train_loader, model, criterion, optimizer, mon, losses,
                        restore_train_mode=variant != "train_mode_not_restored")  # fmt: skip
        knn_accs.append(knn_monitor(model, memory, train_labels, test_inputs, test_labels))
    nx.finish(mon, model, probe_batch, simsiam_loss, optimizer=optimizer)

    model.eval()
    bank, feats = frozen_features(model, memory), frozen_features(model, test_inputs)
    with torch.no_grad():
        z = F.normalize(model.encoder(test_inputs), dim=1)
    return {
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-10:])),
        "knn_acc": knn_accs[-1],
        "linear_acc": linear_probe(bank, train_labels, feats, test_labels),
        "z_std": float(z.std(dim=0).mean()),
    }

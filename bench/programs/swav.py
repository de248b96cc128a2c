"""Port of facebookresearch/swav: SwAV, swapped prediction of Sinkhorn-Knopp cluster codes.

Source: github.com/facebookresearch/swav, ``main_swav.py``, ``src/resnet50.py`` and
``src/multicropdataset.py`` at commit 06b1b7cbaf6ba2a792300d79c7299db98b93b7f9 (CC-BY-NC 4.0,
Copyright (c) Facebook, Inc. and its affiliates); LARC as apex's ``apex/parallel/LARC.py``
describes it. Written anew from the facts of those files; no code copied.

Kept: the ``ResNet`` of ``src/resnet50.py`` with its SwAV parts: the ``ConstantPad2d(1, 0)`` before
``conv1`` (padding reduced by one to match), BN, ReLU, ``_make_layer`` stages of torchvision-style
``BasicBlock`` s (the file's own) with a conv1x1 + BN ``downsample``, ``AdaptiveAvgPool2d``,
``flatten``; ``forward_head``: the projection head ``Linear`` -> ``BatchNorm1d`` -> ReLU ->
``Linear`` to ``feat_dim``, ``F.normalize(dim=1)`` when ``normalize=True`` (main_swav.py builds
with ``normalize=True``), and the prototypes, a bias-free ``Linear(feat_dim, nmb_prototypes)``;
``forward`` on the list of crops grouped by size with ``unique_consecutive`` (one backbone pass
per resolution, concatenated); the init (``kaiming_normal_(mode="fan_out")`` for convolutions,
BN weight 1 / bias 0). ``MultiCropDataset``: per crop ``RandomResizedCrop(size, scale=(min,
max))``, ``RandomHorizontalFlip``, ``get_color_distortion`` (``ColorJitter(0.8, 0.8, 0.8, 0.2)``
with p 0.8, ``RandomGrayscale`` p 0.2), ``PILRandomGaussianBlur`` (p 0.5, radius 0.1..2),
``Normalize`` with the file's mean/std (std 0.228 for red, as written there). ``main``:
``fix_random_seeds``, the loader with ``drop_last=True``, ``SGD(lr=base_lr, momentum=0.9,
weight_decay=wd)`` wrapped in ``LARC(trust_coefficient=0.001, clip=False)`` (weight decay folded
into the gradient, each gradient scaled by ``trust * |w| / (|g| + wd |w| + eps)``, then the inner
SGD steps with weight decay 0), the per-iteration schedule (``np.linspace`` warm-up from
``start_warmup`` then cosine to ``final_lr``) written into every param group each iteration at
``epoch * len(loader) + it``; ``train``: the prototypes re-normalised (``dim=1``) under
``no_grad`` before every forward, ``embedding.detach()``, for each crop in ``crops_for_assign``
the codes ``distributed_sinkhorn(out)`` under ``no_grad`` (``exp(out / epsilon).t()``, divided
by its sum, ``sinkhorn_iterations`` rounds of row then column normalisation, times ``B``), the
swapped prediction ``-mean(sum(q * log_softmax(x / temperature)))`` over the other crops,
averaged; ``zero_grad``, ``backward``, the prototypes' gradients set to ``None`` while
``iteration < freeze_prototypes_niters``, ``step``; the ``AverageMeter`` of the loss and the log
line every 50 iterations (kept as a record). Defaults kept: ``temperature`` 0.1, ``epsilon``
0.05, ``sinkhorn_iterations`` 3, ``crops_for_assign`` [0, 1], ``queue_length`` 0 (no queue),
``base_lr`` 4.8, ``final_lr`` 0, ``wd`` 1e-6, ``start_warmup`` 0.
Shrunk: scikit-learn's 8x8 digits (1,024 for training, 360 held out; the 413 others unused),
grey in 3 equal channels, instead of ImageNet; multi-crop shrunk to the default 2 crops of 8x8
(the digit itself) with scale (0.6, 1) instead of 224 with (0.14, 1) (at (0.3, 1) the healthy run
sat at the ln K plateau of the README's collapse note and issue #12, loss 3.401 = ln 30, and its
kNN fell below the untrained network's: 0.71 against 0.77); colour jitter acts through
brightness and contrast (saturation, hue and grayscale do nothing on grey images); the blur
radius scaled by 8/224; the ResNet: a 3x3 stride-1 ``conv1`` and no max-pool (an 8x8 input has
no room for them), two stages of one ``BasicBlock`` (widths 16, 32) instead of ResNet-50's four
stages of Bottlenecks; ``hidden_mlp`` 64, ``feat_dim`` 16, ``nmb_prototypes`` 30 instead of
2048, 128, 3000; batch 64 (one process) instead of 64 per GPU on 64 GPUs; 15 epochs of 16
iterations with 2 warm-up epochs instead of 100 with 10; ``freeze_prototypes_niters`` 16 (one
epoch) instead of 313 (one ImageNet epoch at 4,096); fp32 (no apex AMP), no DDP/SyncBN
(``all_reduce`` over one process is the identity), no checkpoints or queue files.
Measure only (not in the program): the held-out kNN top-1 (k 20, cosine similarity,
votes weighted ``exp(sim / 0.07)``) of the frozen backbone's pooled features of the 360 held-out
digits against the 1,024 training digits (whole images, eval mode), and the last epoch's
average loss.

nndx, as the author would add it: a preflight ``nndx.probe`` of the model on the first batch of
crops (the list the model takes) with, as targets, the Sinkhorn codes of the two crops computed
at that moment and, as ``loss_fn``, the swapped-prediction cross-entropy against them (the codes
are computed without gradient in the loop too, so fixing them is the loop's own loss);
``nndx.Monitor(model, optimizer.optim)`` around the epochs (the LARC wrapper is not a
``torch.optim.Optimizer``; the program itself reaches the inner SGD as ``optimizer.optim`` for its
log line), every iteration's loss logged; after training ``nndx.probe(..., monitor=mon)`` on that
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "swav"
SOURCE = Source("facebookresearch/swav", "main_swav.py", "06b1b7cbaf6ba2a792300d79c7299db98b93b7f9", "CC-BY-NC-4.0")

_KNN = ("held-out kNN top-1 of the frozen backbone at least 0.05 below the healthy run's (seed 0: 0.867 healthy, "
        "0.767 untrained; 0.092 epsilon_too_low; 0.444 loss_sign_flipped)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, 2 crops, a 2-block ResNet)"),
        Variant(
            "epsilon_too_low",
            "--epsilon 0.005 instead of 0.05 (the README's advice against collapse, a lower epsilon, taken too far): "
            "exp(out / epsilon) in the Sinkhorn overflows to inf once a score passes 0.44, the codes, the loss "
            "and then every weight become NaN (within the first 20 iterations); training runs on to the end",
            (C.NUMERICAL_OVERFLOW,),
            ("https://github.com/facebookresearch/swav/issues/67",
             "https://github.com/facebookresearch/swav/blob/06b1b7cbaf6ba2a792300d79c7299db98b93b7f9/README.md",
             "https://github.com/facebookresearch/vissl/issues/250"),
            Measure("knn_top1", _KNN, lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "loss_sign_flipped",
            "subloss += mean(sum(q * log_softmax(x / temperature))) instead of -=: the swapped prediction's "
            "cross-entropy is maximised, the loss printed goes negative and keeps falling",
            (C.WRONG_LOSS,),
            ("https://github.com/p-giakoumoglou/pyssl/issues/5", "https://github.com/davharris/mistnet/issues/29",
             "https://github.com/peterroelants/peterroelants.github.io/pull/24"),
            Measure("knn_top1", _KNN, lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

ARGS = {"nmb_crops": [2], "size_crops": [8], "min_scale_crops": [0.6], "max_scale_crops": [1.0],
        "crops_for_assign": [0, 1], "temperature": 0.1, "epsilon": 0.05, "sinkhorn_iterations": 3, "feat_dim": 16,
        "nmb_prototypes": 30, "queue_length": 0, "epochs": 15, "batch_size": 64, "base_lr": 4.8, "final_lr": 0.0,
        "freeze_prototypes_niters": 16, "wd": 1e-6, "warmup_epochs": 2, "start_warmup": 0.0, "hidden_mlp": 64,
        "world_size": 1, "n_train": 1024, "knn_k": 20, "knn_t": 0.07}  # fmt: skip
MEAN, STD = (0.485, 0.456, 0.406), (0.228, 0.224, 0.225)


# --------------------------------------------------------------------------- src/resnet50.py


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], width: int = 16, normalize: bool = False, output_dim: int = 0,
                 hidden_mlp: int = 0, nmb_prototypes: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.padding = nn.ConstantPad2d(1, 0.0)
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=0, bias=False)  # pad 1 -> 0: self.padding
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        num_out_filters = 2 * width
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.l2norm = normalize
        if output_dim == 0:
            self.projection_head = None
        elif hidden_mlp == 0:
            self.projection_head = nn.Linear(num_out_filters * block.expansion, output_dim)
        else:
            self.projection_head = nn.Sequential(
                nn.Linear(num_out_filters * block.expansion, hidden_mlp), nn.BatchNorm1d(hidden_mlp),
                nn.ReLU(inplace=True), nn.Linear(hidden_mlp, output_dim),
            )  # fmt: skip
        self.prototypes = nn.Linear(output_dim, nmb_prototypes, bias=False) if nmb_prototypes > 0 else None
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))  # fmt: skip
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward_backbone(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(self.padding(x))))
        x = self.layer2(self.layer1(x))
        return torch.flatten(self.avgpool(x), 1)

    def forward_head(self, x: torch.Tensor):
        if self.projection_head is not None:
            x = self.projection_head(x)
        if self.l2norm:
            x = F.normalize(x, dim=1, p=2)
        if self.prototypes is not None:
            return x, self.prototypes(x)
        return x

    def forward(self, inputs):
        if not isinstance(inputs, list):
            inputs = [inputs]
        idx_crops = torch.cumsum(torch.unique_consecutive(torch.tensor([inp.shape[-1] for inp in inputs]),
                                                          return_counts=True)[1], 0)  # fmt: skip
        start_idx, output = 0, None
        for end_idx in idx_crops:
            _out = self.forward_backbone(torch.cat(inputs[start_idx:end_idx]))
            output = _out if start_idx == 0 else torch.cat((output, _out))
            start_idx = end_idx
        return self.forward_head(output)


def resnet_tiny(**kwargs) -> ResNet:
    return ResNet(BasicBlock, [1, 1], **kwargs)


# --------------------------------------------------------------------------- apex LARC


class LARC:
    """apex's LARC wrapper (not a torch.optim.Optimizer): per-parameter adaptive LR, clip=False."""

    def __init__(self, optimizer: torch.optim.Optimizer, trust_coefficient: float = 0.02, clip: bool = True,
                 eps: float = 1e-8) -> None:  # fmt: skip
        self.optim, self.trust_coefficient, self.clip, self.eps = optimizer, trust_coefficient, clip, eps

    @property
    def param_groups(self):
        return self.optim.param_groups

    def zero_grad(self) -> None:
        self.optim.zero_grad()

    def step(self) -> None:
        with torch.no_grad():
            weight_decays = []
            for group in self.optim.param_groups:
                weight_decay = group.get("weight_decay", 0)
                weight_decays.append(weight_decay)
                group["weight_decay"] = 0
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    param_norm, grad_norm = torch.norm(p.data), torch.norm(p.grad.data)
                    if param_norm != 0 and grad_norm != 0:
                        adaptive_lr = self.trust_coefficient * param_norm / (
                            grad_norm + param_norm * weight_decay + self.eps)
                        if self.clip:
                            adaptive_lr = min(adaptive_lr / group["lr"], 1)
                        p.grad.data += weight_decay * p.data
                        p.grad.data *= adaptive_lr
        self.optim.step()
        for i, group in enumerate(self.optim.param_groups):
            group["weight_decay"] = weight_decays[i]


# --------------------------------------------------------------------------- src/multicropdataset.py


class MultiCrop:
    """The crops of a batch of images (N, 3, 8, 8) in [0, 1], per image as the dataset's transforms
    draw them (from one generator), then ``Normalize``."""

    def __init__(self, size_crops, nmb_crops, min_scale_crops, max_scale_crops, generator: torch.Generator) -> None:
        self.specs = [(size_crops[i], min_scale_crops[i], max_scale_crops[i])
                      for i in range(len(size_crops)) for _ in range(nmb_crops[i])]  # fmt: skip
        self.g = generator
        self.mean, self.std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)

    def _u(self, n: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=self.g)

    def one(self, images: torch.Tensor, size: int, smin: float, smax: float) -> torch.Tensor:
        n = images.shape[0]
        # RandomResizedCrop: area in [smin, smax], log-uniform ratio in [3/4, 4/3], as an affine grid
        area = self._u(n, smin, smax)
        ratio = torch.exp(self._u(n, math.log(3 / 4), math.log(4 / 3)))
        w = torch.sqrt(area * ratio).clamp(max=1.0)
        h = torch.sqrt(area / ratio).clamp(max=1.0)
        cx, cy = self._u(n) * (1 - w) + w / 2, self._u(n) * (1 - h) + h / 2
        flip = torch.where(self._u(n) < 0.5, -1.0, 1.0)  # RandomHorizontalFlip
        theta = torch.zeros(n, 2, 3)
        theta[:, 0, 0], theta[:, 0, 2] = w * flip, 2 * cx - 1
        theta[:, 1, 1], theta[:, 1, 2] = h, 2 * cy - 1
        grid = F.affine_grid(theta, (n, 3, size, size), align_corners=False)
        x = F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
        # get_color_distortion: ColorJitter(0.8, 0.8, 0.8, 0.2) with p 0.8 (brightness, contrast on grey)
        jitter = (self._u(n) < 0.8).float().view(n, 1, 1, 1)
        bright = self._u(n, 0.2, 1.8).view(n, 1, 1, 1)
        contrast = self._u(n, 0.2, 1.8).view(n, 1, 1, 1)
        jittered = (x * bright).clamp(0, 1)
        mean = jittered.mean(dim=(1, 2, 3), keepdim=True)
        jittered = ((jittered - mean) * contrast + mean).clamp(0, 1)
        x = jitter * jittered + (1 - jitter) * x
        # PILRandomGaussianBlur(p=0.5, radius 0.1..2), the radius scaled by 8/224
        blur = self._u(n) <= 0.5
        sigma = self._u(n, 0.1 * 8 / 224, 2.0 * 8 / 224)
        if blur.any():
            k = torch.arange(-1, 2, dtype=torch.float32)
            kern = torch.exp(-(k.view(1, -1) ** 2) / (2 * sigma.view(-1, 1) ** 2))
            kern = kern / kern.sum(1, keepdim=True)  # (n, 3)
            blurred = x
            for dim in (2, 3):
                pad = (0, 0, 1, 1) if dim == 2 else (1, 1, 0, 0)
                padded = F.pad(blurred, pad, mode="replicate")
                shifted = [padded.narrow(dim, i, size) for i in range(3)]
                blurred = sum(kern[:, i].view(n, 1, 1, 1) * shifted[i] for i in range(3))
            x = torch.where(blur.view(n, 1, 1, 1), blurred, x)
        return (x - self.mean) / self.std  # ToTensor, Normalize

    def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
        return [self.one(images, size, smin, smax) for size, smin, smax in self.specs]


# --------------------------------------------------------------------------- main_swav.py


@torch.no_grad()
def distributed_sinkhorn(out: torch.Tensor, args: dict) -> torch.Tensor:
    Q = torch.exp(out / args["epsilon"]).t()  # noqa: N806 - K x B, as in the paper
    B = Q.shape[1] * args["world_size"]  # noqa: N806
    K = Q.shape[0]  # noqa: N806
    sum_Q = torch.sum(Q)  # noqa: N806 - all_reduce over one process: the identity
    Q /= sum_Q
    for _ in range(args["sinkhorn_iterations"]):
        sum_of_rows = torch.sum(Q, dim=1, keepdim=True)
        Q /= sum_of_rows
        Q /= K
        Q /= torch.sum(Q, dim=0, keepdim=True)
        Q /= B
    Q *= B
    return Q.t()


def swapped_prediction(output: torch.Tensor, codes: list[torch.Tensor], bs: int, args: dict,
                       sign: float = -1.0) -> torch.Tensor:  # fmt: skip
    """train()'s loss for the prototype scores ``output`` of all crops, given the codes of each crop
    in ``crops_for_assign`` (``sign`` +1: the loop's flipped sign in the ``loss_sign_flipped`` variant)."""
    n_crops = int(np.sum(args["nmb_crops"]))
    loss = 0
    for i, crop_id in enumerate(args["crops_for_assign"]):
        q = codes[i]
        subloss = 0
        for v in np.delete(np.arange(n_crops), crop_id):
            x = output[bs * v : bs * (v + 1)] / args["temperature"]
            subloss = subloss + sign * torch.mean(torch.sum(q * F.log_softmax(x, dim=1), dim=1))
        loss += subloss / (n_crops - 1)
    return loss / len(args["crops_for_assign"])


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def knn_top1(backbone: ResNet, train_x, train_y, test_x, test_y, k: int, t: float) -> float:
    """Measure only: weighted kNN on the L2-normalised pooled features (whole images, eval mode)."""
    backbone.eval()
    with torch.no_grad():
        f_train = F.normalize(backbone.forward_backbone(train_x), dim=1)
        f_test = F.normalize(backbone.forward_backbone(test_x), dim=1)
    if not (torch.isfinite(f_train).all() and torch.isfinite(f_test).all()):
        f_train, f_test = torch.nan_to_num(f_train), torch.nan_to_num(f_test)
    sim = f_test @ f_train.t()
    top, idx = sim.topk(k, dim=1)
    votes = torch.zeros(len(test_x), 10).scatter_add_(1, train_y[idx], torch.exp(top / t))
    return (votes.argmax(1) == test_y).float().mean().item()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    random.seed(seed)  # fix_random_seeds
    torch.manual_seed(seed)
    np.random.seed(seed)

    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_images = data.to_tensor(train_raw[: args["n_train"]]).expand(-1, 3, -1, -1).contiguous()
    train_labels = train_labels[: args["n_train"]]
    test_images = data.to_tensor(test_raw).expand(-1, 3, -1, -1).contiguous()
    transform = MultiCrop(args["size_crops"], args["nmb_crops"], args["min_scale_crops"], args["max_scale_crops"],
                          torch.Generator().manual_seed(seed))  # fmt: skip
    loader_gen = torch.Generator().manual_seed(seed)
    n_batches = len(train_images) // args["batch_size"]  # drop_last=True

    def train_loader():
        order = torch.randperm(len(train_images), generator=loader_gen)
        for b in range(n_batches):
            yield transform(train_images[order[b * args["batch_size"] : (b + 1) * args["batch_size"]]])

    if variant == "epsilon_too_low":
        args["epsilon"] = 0.005
    model = resnet_tiny(normalize=True, hidden_mlp=args["hidden_mlp"],
                        output_dim=args["feat_dim"], nmb_prototypes=args["nmb_prototypes"])  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=args["base_lr"], momentum=0.9, weight_decay=args["wd"])
    optimizer = LARC(optimizer=optimizer, trust_coefficient=0.001, clip=False)
    warmup_lr_schedule = np.linspace(args["start_warmup"], args["base_lr"], n_batches * args["warmup_epochs"])
    iters = np.arange(n_batches * (args["epochs"] - args["warmup_epochs"]))
    cosine_lr_schedule = np.array([
        args["final_lr"] + 0.5 * (args["base_lr"] - args["final_lr"])
        * (1 + math.cos(math.pi * t / (n_batches * (args["epochs"] - args["warmup_epochs"])))) for t in iters
    ])  # fmt: skip
    lr_schedule = np.concatenate((warmup_lr_schedule, cosine_lr_schedule))

    # the preflight batch: the first crops and their codes at this moment
    probe_crops = transform(train_images[: args["batch_size"]])
    bs = args["batch_size"]
    model.eval()
    with torch.no_grad():
        _, probe_out = model(probe_crops)
        probe_codes = torch.stack([distributed_sinkhorn(probe_out[bs * c : bs * (c + 1)], args)
                                   for c in args["crops_for_assign"]])  # fmt: skip
    model.train()
    probe_batch = ((probe_crops,), probe_codes)

    def swav_loss(outputs, codes: torch.Tensor) -> torch.Tensor:
        _, output = outputs
        return swapped_prediction(output, list(codes), len(codes[0]), args,
                                  sign=1.0 if variant == "loss_sign_flipped" else -1.0)  # the loop's own loss

    nx.preflight(model, probe_batch, swav_loss, optimizer=optimizer.optim)
    mon = nx.monitor(model, optimizer.optim, every=10)

    log: list[str] = []
    losses = AverageMeter()
    for epoch in range(args["epochs"]):
        model.train()
        losses = AverageMeter()
        for it, inputs in enumerate(train_loader()):
            iteration = epoch * n_batches + it
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr_schedule[iteration]

            with torch.no_grad():  # normalize the prototypes
                w = model.prototypes.weight.data.clone()
                w = F.normalize(w, dim=1, p=2)
                model.prototypes.weight.copy_(w)

            embedding, output = model(inputs)
            embedding = embedding.detach()
            bs = inputs[0].size(0)

            loss = 0
            for i, crop_id in enumerate(args["crops_for_assign"]):
                with torch.no_grad():
                    out = output[bs * crop_id : bs * (crop_id + 1)].detach()
                    q = distributed_sinkhorn(out, args)[-bs:]
                subloss = 0
                for v in np.delete(np.arange(np.sum(args["nmb_crops"])), crop_id):
                    x = output[bs * v : bs * (v + 1)] / args["temperature"]
                    if variant == "loss_sign_flipped":
                        subloss += torch.mean(torch.sum(q * F.log_softmax(x, dim=1), dim=1))
                    else:
                        subloss -= torch.mean(torch.sum(q * F.log_softmax(x, dim=1), dim=1))
                loss += subloss / (np.sum(args["nmb_crops"]) - 1)
            loss /= len(args["crops_for_assign"])

            optimizer.zero_grad()
            loss.backward()
            if iteration < args["freeze_prototypes_niters"]:  # cancel gradients for the prototypes
                for name, p in model.named_parameters():
                    if "prototypes" in name:
                        p.grad = None
            optimizer.step()
            nx.timed(lambda: mon.log(loss))

            losses.update(loss.item(), inputs[0].size(0))
            if it % 50 == 0:
                log.append(f"Epoch: [{epoch}][{it}]\tLoss {losses.val:.4f} ({losses.avg:.4f})\t"
                           f"Lr: {optimizer.optim.param_groups[0]['lr']:.4f}")  # fmt: skip

    nx.finish(mon, model, probe_batch, swav_loss, optimizer=optimizer.optim)
    knn = knn_top1(model, (train_images - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1),
                   train_labels, (test_images - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1),
                   test_labels, args["knn_k"], args["knn_t"])  # fmt: skip
    return {"knn_top1": knn, "last_epoch_loss": losses.avg,
            "final_lr": float(optimizer.optim.param_groups[0]["lr"])}  # fmt: skip

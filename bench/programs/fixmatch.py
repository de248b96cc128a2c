"""Port of kekmodel/FixMatch-pytorch: semi-supervised learning from a few labels, with
pseudo-labels taken from a weakly augmented view of each unlabelled image (kept when the
softmax is confident) and trained on a strongly augmented view of it.

Source: github.com/kekmodel/FixMatch-pytorch, ``train.py`` with ``models/wideresnet.py``,
``models/ema.py``, ``dataset/cifar.py`` and ``dataset/randaugment.py`` at commit
040be3b8950300b052f810df31a0c6c09561e09f (MIT, Copyright (c) 2019 Jungdae Kim, Qing Yu).
Written anew from the facts of those files; no code copied.

Kept: ``x_u_split`` (``num_labeled / num_classes`` images drawn per class with
``np.random.choice``, the unlabelled set all training images, the labelled indices
repeated ``ceil(batch_size * eval_step / num_labeled)`` times when there are fewer labels
than a batch, then shuffled); the labelled transform (random crop with
``int(side * 0.125)`` reflect padding, ``ToTensor``, ``Normalize`` by the dataset's mean
and std); ``TransformFixMatch`` (a weak view: the crop; a strong view: the crop then
``RandAugmentMC(n=2, m=10)``: two ops drawn with replacement from the FixMatch pool, each
applied with probability 0.5 at a magnitude ``randint(1, m)``, then ``CutoutAbs`` of half
the side filled with grey); the test transform (``ToTensor``, ``Normalize``); the
``RandomSampler`` loaders with ``drop_last`` (labelled ``batch_size``, unlabelled
``batch_size * mu``) restarted when exhausted; ``WideResNet`` (3x3 ``conv1`` to 16
channels, three ``NetworkBlock``s of pre-activation ``BasicBlock``s -- BN, LeakyReLU(0.1),
conv3x3, BN, LeakyReLU(0.1), conv3x3, a 1x1 shortcut conv when the width changes,
``activate_before_residual`` in the first -- a final BN/LeakyReLU, global average pooling,
``fc``; kaiming-normal fan-out conv init, BN weight 1 bias 0, xavier-normal ``fc``);
the optimizer's two parameter groups (``bias``/``bn`` without weight decay),
``SGD(lr=0.03, momentum=0.9, nesterov=True)``, ``wdecay`` 5e-4,
``get_cosine_schedule_with_warmup`` (``num_cycles`` 7/16, no warmup) stepped every
iteration; ``ModelEMA`` (a deep copy in eval mode, its parameters averaged with
``decay``, its buffers copied from the student); ``train``: ``model.train()`` once before
the epochs, ``interleave`` of ``cat(inputs_x, inputs_u_w, inputs_u_s)`` into
``2 * mu + 1`` groups, one forward pass, ``de_interleave``, ``Lx`` the mean cross-entropy
on the labelled logits, the pseudo-label ``softmax(logits_u_w.detach() / T)`` with
``T`` 1, its max and argmax, the mask ``max_probs >= threshold`` (0.95), ``Lu`` the
masked per-sample cross-entropy of the strong logits averaged over the whole unlabelled
batch, ``loss = Lx + lambda_u * Lu`` (``lambda_u`` 1), ``backward``, ``optimizer.step``,
``scheduler.step``, ``ema_model.update``, ``model.zero_grad``, the loss / mask meters;
after every epoch (``eval_step`` iterations) ``test`` of the EMA model (``model.eval()``,
cross-entropy and precision@1), ``best_acc`` and the mean of the last 20 test accuracies.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test, one channel) with 100 labels
(10 per class) instead of CIFAR-10 with 4,000; no ``RandomHorizontalFlip`` (a mirrored
digit is another digit); the FixMatch augment pool on 8x8 grey images in numpy
(``Color`` is the identity on one channel; ``Rotate``/``Shear`` through
``scipy.ndimage``; translations fill with grey 128 as PIL's ``fillcolor``); cutout 4
pixels; WideResNet depth 10 (one block per group) and widen factor 1 instead of 28x2;
``batch_size`` 8 (``mu`` 7: 56 unlabelled images, 120 forwarded per step) instead of 64;
6 epochs of 50 steps (300 in all) instead of 1,024 of 1,024; BN momentum 0.01 instead of
0.001 and ``ema_decay`` 0.99 instead of 0.999 (the same averages over 3,000 times fewer
steps); no checkpoints, TensorBoard, tqdm, AMP or DistributedDataParallel; CPU.
Measure only (not in the program): nothing; the EMA model's last ``test`` accuracy is
what the program reports.

nndx, as the author would add it: a preflight ``nndx.probe`` of the student on the first
labelled batch (the weak crop, its labels) with ``Lx`` as the loss, its optimizer, and
the data splits (the 100 labelled images through the test transform with their labels,
the test images and labels); ``nndx.Monitor(model, optimizer)`` around the epochs with
``F.cross_entropy`` wrapped for ``Lx`` (``mon.loss_fn``), each step's total loss logged
with the labelled batch's precision@1, each epoch's ``test`` of the EMA model logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. The EMA
model has no optimizer and is not watched.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fixmatch"
SOURCE = Source("kekmodel/FixMatch-pytorch", "train.py", "040be3b8950300b052f810df31a0c6c09561e09f", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (the CIFAR-10 settings, shrunk)"),
        Variant(
            "student_left_in_eval",
            "test() is also run on the student (its accuracy logged next to the EMA model's) and calls "
            "model.eval(); model.train() stays where train.py has it, once before the epochs, so from the "
            "second epoch on the student trains in eval mode (BN on its running statistics)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/lyakaap/VAT-pytorch/issues/7", "https://github.com/pytorch/tutorials/issues/1540",
             "https://github.com/pytorch/tutorials/pull/1602"),
            Measure("test_acc", "the EMA model's final test accuracy at least 0.05 below the healthy run's: "
                    "0.081 against 0.919 healthy on seed 0 (the loss turns NaN in the 2nd epoch)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "no_de_interleave",
            "the logits of the interleaved batch are split without de_interleave: logits_x are the "
            "predictions for every (2*mu+1)-th image of the mixed batch (mostly unlabelled ones) scored "
            "against the labelled targets, and the weak/strong pairs no longer belong to the same images",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/google-research/mixmatch/issues/5",
             "https://github.com/kekmodel/FixMatch-pytorch/issues/36",
             "https://github.com/UCSD-E4E/acoustic-multiclass-training/pull/4"),
            Measure("test_acc", "the EMA model's final test accuracy at least 0.05 below the healthy run's: "
                    "0.264 against 0.919 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

SIDE, N_CLASSES = 8, 10
ARGS = {"num_labeled": 100, "eval_step": 50, "epochs": 6, "batch_size": 8, "mu": 7, "lr": 0.03, "warmup": 0,
        "wdecay": 5e-4, "nesterov": True, "ema_decay": 0.99, "lambda_u": 1.0, "T": 1.0, "threshold": 0.95,
        "depth": 10, "widen_factor": 1, "bn_momentum": 0.01}  # fmt: skip


# --------------------------------------------------------------------------- dataset/randaugment.py (8x8 grey, numpy)


def _float_parameter(v: int, max_v: float) -> float:
    return float(v) * max_v / 10


def _int_parameter(v: int, max_v: float) -> int:
    return int(v * max_v / 10)


def _blend(img: np.ndarray, other: np.ndarray, factor: float) -> np.ndarray:
    return np.clip(other + factor * (img - other), 0, 255)


def auto_contrast(img, v, max_v, bias, rng):
    lo, hi = img.min(), img.max()
    return img if hi <= lo else (img - lo) * (255.0 / (hi - lo))


def brightness(img, v, max_v, bias, rng):
    return _blend(img, np.zeros_like(img), _float_parameter(v, max_v) + bias)


def color(img, v, max_v, bias, rng):  # saturation: nothing to change on one channel
    return img


def contrast(img, v, max_v, bias, rng):
    return _blend(img, np.full_like(img, img.mean()), _float_parameter(v, max_v) + bias)


def equalize(img, v, max_v, bias, rng):
    ranks = np.argsort(np.argsort(img.ravel(), kind="stable"), kind="stable").reshape(img.shape)
    return ranks * (255.0 / max(img.size - 1, 1))


def identity(img, v, max_v, bias, rng):
    return img


def posterize(img, v, max_v, bias, rng):
    bits = _int_parameter(v, max_v) + bias
    shift = 8 - bits
    return ((img.astype(np.uint8) >> shift) << shift).astype(np.float64)


def rotate(img, v, max_v, bias, rng):
    angle = _int_parameter(v, max_v) * (-1 if rng.rand() < 0.5 else 1)
    return ndimage.rotate(img, angle, reshape=False, order=1, mode="constant", cval=0.0)


def sharpness(img, v, max_v, bias, rng):
    smooth = ndimage.uniform_filter(img, size=3, mode="nearest")
    return _blend(img, smooth, _float_parameter(v, max_v) + bias)


def _shear(img, v, max_v, rng, axis: int):
    s = _float_parameter(v, max_v) * (-1 if rng.rand() < 0.5 else 1)
    matrix = np.eye(2)
    matrix[axis, 1 - axis] = s
    return ndimage.affine_transform(img, matrix, order=1, mode="constant", cval=0.0)


def shear_x(img, v, max_v, bias, rng):
    return _shear(img, v, max_v, rng, axis=1)


def shear_y(img, v, max_v, bias, rng):
    return _shear(img, v, max_v, rng, axis=0)


def solarize(img, v, max_v, bias, rng):
    threshold = 256 - _int_parameter(v, max_v)
    return np.where(img < threshold, img, 255 - img)


def _translate(img, v, max_v, rng, axis: int):
    shift = int(round(_float_parameter(v, max_v) * img.shape[axis])) * (-1 if rng.rand() < 0.5 else 1)
    out = np.full_like(img, 128.0)
    src = [slice(None)] * 2
    dst = [slice(None)] * 2
    if shift >= 0:
        src[axis], dst[axis] = slice(0, img.shape[axis] - shift), slice(shift, None)
    else:
        src[axis], dst[axis] = slice(-shift, None), slice(0, img.shape[axis] + shift)
    out[tuple(dst)] = img[tuple(src)]
    return out


def translate_x(img, v, max_v, bias, rng):
    return _translate(img, v, max_v, rng, axis=1)


def translate_y(img, v, max_v, bias, rng):
    return _translate(img, v, max_v, rng, axis=0)


def cutout_abs(img: np.ndarray, size: int, rng: np.random.RandomState) -> np.ndarray:
    h, w = img.shape
    x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
    x0, y0 = int(max(0, x0 - size / 2.0)), int(max(0, y0 - size / 2.0))
    out = img.copy()
    out[y0 : min(h, y0 + size), x0 : min(w, x0 + size)] = 127.0
    return out


def fixmatch_augment_pool():
    return [(auto_contrast, None, None), (brightness, 0.9, 0.05), (color, 0.9, 0.05), (contrast, 0.9, 0.05),
            (equalize, None, None), (identity, None, None), (posterize, 4, 4), (rotate, 30, 0),
            (sharpness, 0.9, 0.05), (shear_x, 0.3, 0), (shear_y, 0.3, 0), (solarize, 256, 0),
            (translate_x, 0.3, 0), (translate_y, 0.3, 0)]  # fmt: skip


class RandAugmentMC:
    def __init__(self, n: int, m: int, rng: np.random.RandomState) -> None:
        assert n >= 1 and 1 <= m <= 10
        self.n, self.m, self.rng = n, m, rng
        self.augment_pool = fixmatch_augment_pool()

    def __call__(self, img: np.ndarray) -> np.ndarray:
        for k in self.rng.randint(len(self.augment_pool), size=self.n):  # random.choices: with replacement
            op, max_v, bias = self.augment_pool[k]
            v = self.rng.randint(1, self.m)
            if self.rng.rand() < 0.5:
                img = op(img, v, max_v, bias, self.rng)
        return cutout_abs(img, int(SIDE * 0.5), self.rng)


# --------------------------------------------------------------------------- dataset/cifar.py


def random_crop_reflect(img: np.ndarray, padding: int, rng: np.random.RandomState) -> np.ndarray:
    """``RandomCrop(size=side, padding=padding, padding_mode='reflect')``."""
    padded = np.pad(img, padding, mode="reflect")
    top, left = rng.randint(0, 2 * padding + 1, size=2)
    return padded[top : top + img.shape[0], left : left + img.shape[1]]


def x_u_split(labels: np.ndarray, num_labeled: int, num_classes: int, batch_size: int, eval_step: int):
    label_per_class = num_labeled // num_classes
    unlabeled_idx = np.arange(len(labels))  # all the training images (issue #10 of the repository)
    labeled_idx = []
    for i in range(num_classes):
        idx = np.where(labels == i)[0]
        labeled_idx.extend(np.random.choice(idx, label_per_class, False))
    labeled_idx = np.array(labeled_idx)
    assert len(labeled_idx) == num_labeled
    if num_labeled < batch_size * eval_step:  # expand_labels, or num_labeled < batch_size
        num_expand_x = math.ceil(batch_size * eval_step / num_labeled)
        labeled_idx = np.hstack([labeled_idx for _ in range(num_expand_x)])
    np.random.shuffle(labeled_idx)
    return labeled_idx, unlabeled_idx


class SSLDataset:
    """``CIFAR10SSL``: the images at ``indexs`` with their targets and a transform."""

    def __init__(self, images: np.ndarray, targets: np.ndarray, indexs, transform) -> None:
        self.data = images[indexs] if indexs is not None else images
        self.targets = targets[indexs] if indexs is not None else targets
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        return self.transform(self.data[index].astype(np.float64)), int(self.targets[index])


def random_loader(dataset: SSLDataset, batch_size: int, collate):
    """``DataLoader(sampler=RandomSampler, batch_size, drop_last=True)``: one pass, reshuffled."""
    order = torch.randperm(len(dataset)).tolist()
    for start in range(0, len(order) - batch_size + 1, batch_size):
        yield collate([dataset[i] for i in order[start : start + batch_size]])


# --------------------------------------------------------------------------- models/wideresnet.py


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, out_planes: int, stride: int, bn_momentum: float,
                 activate_before_residual: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes, momentum=bn_momentum)
        self.relu1 = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes, momentum=bn_momentum)
        self.relu2 = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.equal_in_out = in_planes == out_planes
        self.conv_shortcut = None if self.equal_in_out else nn.Conv2d(in_planes, out_planes, kernel_size=1,
                                                                       stride=stride, padding=0, bias=False)
        self.activate_before_residual = activate_before_residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.equal_in_out and self.activate_before_residual:
            x = self.relu1(self.bn1(x))
            out = x
        else:
            out = self.relu1(self.bn1(x))
        out = self.relu2(self.bn2(self.conv1(out if self.equal_in_out else x)))
        out = self.conv2(out)
        return (x if self.equal_in_out else self.conv_shortcut(x)) + out


class NetworkBlock(nn.Module):
    def __init__(self, nb_layers: int, in_planes: int, out_planes: int, stride: int, bn_momentum: float,
                 activate_before_residual: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.layer = nn.Sequential(*[
            BasicBlock(in_planes if i == 0 else out_planes, out_planes, stride if i == 0 else 1, bn_momentum,
                       activate_before_residual)
            for i in range(nb_layers)
        ])  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    def __init__(self, num_classes: int, depth: int, widen_factor: int, bn_momentum: float, in_channels: int = 1) -> None:
        super().__init__()
        channels = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        assert (depth - 4) % 6 == 0
        n = (depth - 4) // 6
        self.conv1 = nn.Conv2d(in_channels, channels[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.block1 = NetworkBlock(n, channels[0], channels[1], 1, bn_momentum, activate_before_residual=True)
        self.block2 = NetworkBlock(n, channels[1], channels[2], 2, bn_momentum)
        self.block3 = NetworkBlock(n, channels[2], channels[3], 2, bn_momentum)
        self.bn1 = nn.BatchNorm2d(channels[3], momentum=bn_momentum)
        self.relu = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.fc = nn.Linear(channels[3], num_classes)
        self.channels = channels[3]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="leaky_relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1.0)
                nn.init.constant_(m.bias, 0.0)
            elif isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)
                nn.init.constant_(m.bias, 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = self.relu(self.bn1(out))
        out = F.adaptive_avg_pool2d(out, 1).view(-1, self.channels)
        return self.fc(out)


# --------------------------------------------------------------------------- models/ema.py


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float) -> None:
        self.ema = copy.deepcopy(model)
        self.ema.eval()
        self.decay = decay
        self.param_keys = [k for k, _ in self.ema.named_parameters()]
        self.buffer_keys = [k for k, _ in self.ema.named_buffers()]
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model: nn.Module) -> None:
        with torch.no_grad():
            msd, esd = model.state_dict(), self.ema.state_dict()
            for k in self.param_keys:
                esd[k].copy_(esd[k] * self.decay + (1.0 - self.decay) * msd[k].detach())
            for k in self.buffer_keys:
                esd[k].copy_(msd[k])


# --------------------------------------------------------------------------- train.py


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int,
                                    num_cycles: float = 7.0 / 16.0, last_epoch: int = -1) -> LambdaLR:  # fmt: skip
    def _lr_lambda(current_step: int) -> float:
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        no_progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0.0, math.cos(math.pi * num_cycles * no_progress))

    return LambdaLR(optimizer, _lr_lambda, last_epoch)


def interleave(x: torch.Tensor, size: int) -> torch.Tensor:
    s = list(x.shape)
    return x.reshape([-1, size] + s[1:]).transpose(0, 1).reshape([-1] + s[1:])


def de_interleave(x: torch.Tensor, size: int) -> torch.Tensor:
    s = list(x.shape)
    return x.reshape([size, -1] + s[1:]).transpose(0, 1).reshape([-1] + s[1:])


def accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    return float((output.argmax(1) == target).float().mean()) * 100.0


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n
        self.avg = self.sum / self.count


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    np.random.seed(seed)
    torch.manual_seed(seed)
    aug_rng = np.random.RandomState(seed + 1)  # the transforms' own draws (random / np.random in the original)

    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_images, test_images = train_raw.numpy().astype(np.float64), test_raw.numpy().astype(np.float64)
    train_targets = train_labels.numpy()
    mean, std = float(train_images.mean() / 255.0), float(train_images.std() / 255.0)

    def normalize(img: np.ndarray) -> torch.Tensor:  # ToTensor + Normalize
        return (torch.from_numpy(np.ascontiguousarray(img)).float().div(255.0)[None] - mean) / std

    padding = max(1, int(SIDE * 0.125))

    def transform_labeled(img):
        return normalize(random_crop_reflect(img, padding, aug_rng))

    strong_aug = RandAugmentMC(n=2, m=10, rng=aug_rng)

    def transform_fixmatch(img):
        weak = random_crop_reflect(img, padding, aug_rng)
        strong = strong_aug(random_crop_reflect(img, padding, aug_rng))
        return normalize(weak), normalize(strong)

    labeled_idx, unlabeled_idx = x_u_split(train_targets, args["num_labeled"], N_CLASSES, args["batch_size"],
                                           args["eval_step"])  # fmt: skip
    labeled_dataset = SSLDataset(train_images, train_targets, labeled_idx, transform_labeled)
    unlabeled_dataset = SSLDataset(train_images, train_targets, unlabeled_idx, transform_fixmatch)

    def collate_x(items):
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    def collate_u(items):
        return (torch.stack([w for (w, _), _ in items]), torch.stack([s for (_, s), _ in items])), \
            torch.tensor([y for _, y in items])

    test_x = torch.stack([normalize(img) for img in test_images])
    test_y = test_labels.clone()

    model = WideResNet(N_CLASSES, args["depth"], args["widen_factor"], args["bn_momentum"])
    no_decay = ["bias", "bn"]
    grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args["wdecay"]},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.SGD(grouped_parameters, lr=args["lr"], momentum=0.9, nesterov=args["nesterov"])
    total_steps = args["epochs"] * args["eval_step"]
    scheduler = get_cosine_schedule_with_warmup(optimizer, args["warmup"], total_steps)
    ema_model = ModelEMA(model, args["ema_decay"])

    def lx_loss(logits, targets):
        return F.cross_entropy(logits, targets, reduction="mean")

    labeled_iter = random_loader(labeled_dataset, args["batch_size"], collate_x)
    unlabeled_iter = random_loader(unlabeled_dataset, args["batch_size"] * args["mu"], collate_u)
    first_x = next(labeled_iter)
    pending_x = [first_x]  # the probe's batch is the loop's first labelled batch
    distinct = np.unique(labeled_idx)  # the 100 labelled images, each once (the loader's copy is repeated)
    labelled_eval = torch.stack([normalize(img) for img in train_images[distinct]])
    splits = (labelled_eval, torch.from_numpy(train_targets[distinct]).long(), test_x, test_y)
    nx.preflight(model, first_x, lx_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=F.cross_entropy)

    def test(net: nn.Module) -> tuple[float, float]:
        losses, top1 = AverageMeter(), AverageMeter()
        with torch.no_grad():
            for start in range(0, len(test_x), 64):
                net.eval()
                inputs, targets = test_x[start : start + 64], test_y[start : start + 64]
                outputs = net(inputs)
                losses.update(F.cross_entropy(outputs, targets).item(), inputs.shape[0])
                top1.update(accuracy(outputs, targets), inputs.shape[0])
        return losses.avg, top1.avg

    best_acc = 0.0
    test_accs: list[float] = []
    student_accs: list[float] = []
    test_loss = test_acc = float("nan")
    losses = losses_x = losses_u = mask_probs = AverageMeter()
    model.train()
    for epoch in range(args["epochs"]):
        losses, losses_x, losses_u, mask_probs = AverageMeter(), AverageMeter(), AverageMeter(), AverageMeter()
        for _batch_idx in range(args["eval_step"]):
            try:
                inputs_x, targets_x = pending_x.pop() if pending_x else next(labeled_iter)
            except StopIteration:
                labeled_iter = random_loader(labeled_dataset, args["batch_size"], collate_x)
                inputs_x, targets_x = next(labeled_iter)
            try:
                (inputs_u_w, inputs_u_s), _ = next(unlabeled_iter)
            except StopIteration:
                unlabeled_iter = random_loader(unlabeled_dataset, args["batch_size"] * args["mu"], collate_u)
                (inputs_u_w, inputs_u_s), _ = next(unlabeled_iter)

            batch_size = inputs_x.shape[0]
            inputs = interleave(torch.cat((inputs_x, inputs_u_w, inputs_u_s)), 2 * args["mu"] + 1)
            logits = model(inputs)
            if variant != "no_de_interleave":
                logits = de_interleave(logits, 2 * args["mu"] + 1)
            logits_x = logits[:batch_size]
            logits_u_w, logits_u_s = logits[batch_size:].chunk(2)
            del logits

            Lx = mon.loss_fn(logits_x, targets_x, reduction="mean")
            pseudo_label = torch.softmax(logits_u_w.detach() / args["T"], dim=-1)
            max_probs, targets_u = torch.max(pseudo_label, dim=-1)
            mask = max_probs.ge(args["threshold"]).float()
            Lu = (F.cross_entropy(logits_u_s, targets_u, reduction="none") * mask).mean()
            loss = Lx + args["lambda_u"] * Lu

            loss.backward()
            losses.update(loss.item())
            losses_x.update(Lx.item())
            losses_u.update(Lu.item())
            optimizer.step()
            scheduler.step()
            ema_model.update(model)
            model.zero_grad()
            mask_probs.update(mask.mean().item())
            acc_x = accuracy(logits_x.detach(), targets_x) / 100.0
            nx.timed(lambda: mon.log(loss, accuracy=acc_x))

        test_loss, test_acc = test(ema_model.ema)
        nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc / 100.0))
        if variant == "student_left_in_eval":
            student_accs.append(test(model)[1])  # the student's accuracy, logged beside the EMA's
        best_acc = max(test_acc, best_acc)
        test_accs.append(test_acc)

    nx.finish(mon, model, first_x, lx_loss, optimizer=optimizer, data=splits)
    return {
        "test_acc": test_acc / 100.0,
        "best_acc": best_acc / 100.0,
        "mean_acc": float(np.mean(test_accs[-20:])) / 100.0,
        "test_loss": test_loss,
        "train_loss": losses.avg,
        "train_loss_x": losses_x.avg,
        "train_loss_u": losses_u.avg,
        "mask": mask_probs.avg,
    }

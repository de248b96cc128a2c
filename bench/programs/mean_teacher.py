"""Port of CuriousAI/mean-teacher (PyTorch): a student trained on a few labels plus a
consistency cost to its exponential-moving-average teacher on every image.

Source: github.com/CuriousAI/mean-teacher, ``pytorch/main.py`` with
``pytorch/mean_teacher/{architectures,data,losses,ramps,datasets}.py`` and the CIFAR-10
settings of ``pytorch/experiments/cifar10_test.py`` at commit
546348ff863c998c26be4339021425df973b4a36 (CC BY-NC 4.0, Copyright (c) 2018 Curious AI Ltd).
Written anew from the facts of those files; no code copied.

Kept: ``NO_LABEL = -1``; ``relabel_dataset`` (images named in the labels file get their
class index, every other image ``NO_LABEL``; labelled and unlabelled index lists);
``TwoStreamBatchSampler`` (an epoch is one shuffled pass over the unlabelled indices, the
labelled ones iterated forever, ``batch_size - labeled_batch_size`` of the first and
``labeled_batch_size`` of the second per batch, ``np.random.permutation`` shuffles);
``TransformTwice`` (two independently augmented views, one for the student, one for the
teacher) of ``RandomTranslateWithReflect`` + ``ToTensor`` + ``Normalize``; the eval transform
``ToTensor`` + ``Normalize``; ``cifar_shakeshake26``'s ``ResNet32x32`` (a 3x3 ``conv1``, three
stages of ``ShakeShakeBlock``s -- two branches of ReLU/conv3x3/BN/ReLU/conv3x3/BN mixed by
``Shake``: a random per-sample gate forward, another random gate backward, 0.5 in eval --
with ``ShiftConvDownsample`` (two shifted subsamplings, ReLU, a grouped 1x1 conv, BN)
between stages, ``AvgPool2d``, two heads ``fc1``/``fc2``), its init (conv weights
N(0, sqrt(2/n)), BN weight 1 and bias 0); ``create_model(ema=True)``'s ``detach_()`` of the
teacher's parameters; ``SGD(lr, momentum=0.9, weight_decay=2e-4, nesterov=True)``;
``adjust_learning_rate`` per batch (linear ramp-up of 0 epochs, then
``cosine_rampdown(epoch, lr_rampdown_epochs)``); ``train``: ``model.train()`` and
``ema_model.train()``, ``CrossEntropyLoss(size_average=False, ignore_index=NO_LABEL)``,
``softmax_mse_loss`` consistency, ``symmetric_mse_loss`` between the student's two heads
times ``logit_distance_cost`` 0.01, ``class_loss`` on ``fc1`` and the consistency on ``fc2``
against the teacher's detached ``fc1``, each divided by the whole minibatch size,
``consistency * sigmoid_rampup(epoch, consistency_rampup)`` (100, 5 epochs), the loss
explosion assert, precision@1 over the labelled samples of the batch, ``zero_grad`` /
``backward`` / ``step``, ``global_step += 1``, ``update_ema_variables`` (``alpha = min(1 - 1 /
(global_step + 1), ema_decay)``, ema = alpha * ema + (1 - alpha) * param); ``validate`` of
the student and of the teacher after every epoch (``model.eval()``, the class loss and
precision@1), ``best_prec1`` kept on the teacher's; the 1000-label run's ``ema_decay``
0.97 and ``lr_rampdown_epochs`` = epochs * 210 / 180.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) at their own 8x8, one channel,
with 100 labels (10 per class, drawn by the seed: the ``*_balanced_labels`` files) instead
of CIFAR-10's 32x32 RGB with 1,000/4,000 labels; the translation 1 pixel instead of 4 (the
same share of the side) and no ``RandomHorizontalFlip`` (a mirrored digit is another
digit); widths 8/16/32 with one block per stage instead of 96/192/384 with four,
``AvgPool2d(2)`` instead of ``(8)``; ``batch_size`` 64 with 16 labelled instead of 128 with
31; 12 epochs (27 batches each) instead of 180, ``lr_rampdown_epochs`` 14 instead of 210;
no checkpoints, no log files (the meters are kept in memory); CPU, no DataParallel.
Measure only (not in the program): nothing; the teacher's final precision@1 on the test
images is what ``validate`` reports.

nndx, as the author would add it: a preflight ``nndx.probe`` of the student on the first
training batch (the student's view, its targets with ``NO_LABEL`` for the unlabelled
images) with the class loss as a function of the model's two outputs
(``class_criterion(fc1, target) / minibatch_size``) and the data splits (the training images
through the eval transform with the relabelled targets, the test images and labels);
``nndx.Monitor(model, optimizer)`` around the epochs with ``class_criterion`` wrapped (the
student's class loss computed through ``mon.loss_fn``), each step's total loss logged with
the batch's precision@1, each ``validate`` of the student logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. The teacher has no optimizer and is
not watched.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import Function
from torch.utils.data import DataLoader, Dataset, Sampler

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mean_teacher"
SOURCE = Source("CuriousAI/mean-teacher", "pytorch/main.py", "546348ff863c998c26be4339021425df973b4a36",
                "CC-BY-NC-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (the 1000-label CIFAR-10 settings, shrunk)"),
        Variant(
            "unlabeled_targets_zero",
            "relabel_dataset leaves the unlabelled images' targets at 0 instead of NO_LABEL (the targets array "
            "made with zeros, only the labelled entries written): ignore_index=-1 never fires and 3/4 of every "
            "batch is trained as digit 0",
            (C.LABEL_NOISE, C.CLASS_IMBALANCE),
            ("https://github.com/pytorch/pytorch/issues/25166",
             "https://github.com/perrying/realistic-ssl-evaluation-pytorch/issues/2",
             "https://github.com/nyu-mll/jiant-v1-legacy/issues/925"),
            Measure("ema_prec1", "the teacher's final test precision@1 at least 0.1 below the healthy run's: "
                    "0.125 against 0.925 healthy on seed 0 (it predicts 0 for most digits)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "softmax_in_model",
            "the network returns F.softmax of fc1 and fc2 (the softmax main.py once computed and left unused, moved "
            "into the model): CrossEntropyLoss and softmax_mse_loss apply a second softmax to probabilities",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/CuriousAI/mean-teacher/pull/6", "https://github.com/tflearn/tflearn/pull/562",
             "https://github.com/AntreasAntoniou/MatchingNetworks/pull/14",
             "https://github.com/pytorch/tutorials/issues/663"),
            Measure("ema_prec1", "the teacher's final test precision@1 at least 0.1 below the healthy run's: "
                    "0.453 against 0.925 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

NO_LABEL = -1
SIDE, TRANSLATE, N_LABELS = 8, 1, 100
ARGS = {"epochs": 12, "batch_size": 64, "labeled_batch_size": 16, "lr": 0.05, "initial_lr": 0.0, "lr_rampup": 0,
        "lr_rampdown_epochs": 14, "momentum": 0.9, "nesterov": True, "weight_decay": 2e-4, "ema_decay": 0.97,
        "consistency": 100.0, "consistency_type": "mse", "consistency_rampup": 5, "logit_distance_cost": 0.01,
        "print_freq": 10, "channels": 8}  # fmt: skip


# --------------------------------------------------------------------------- mean_teacher/ramps.py


def sigmoid_rampup(current: float, rampup_length: float) -> float:
    """Exponential rampup from https://arxiv.org/abs/1610.02242"""
    if rampup_length == 0:
        return 1.0
    current = np.clip(current, 0.0, rampup_length)
    phase = 1.0 - current / rampup_length
    return float(np.exp(-5.0 * phase * phase))


def linear_rampup(current: float, rampup_length: float) -> float:
    assert current >= 0 and rampup_length >= 0
    return 1.0 if current >= rampup_length else current / rampup_length


def cosine_rampdown(current: float, rampdown_length: float) -> float:
    assert 0 <= current <= rampdown_length
    return float(0.5 * (np.cos(np.pi * current / rampdown_length) + 1))


# --------------------------------------------------------------------------- mean_teacher/losses.py


def softmax_mse_loss(input_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Softmax on both sides, summed squared error over the batch, divided by the classes."""
    assert input_logits.size() == target_logits.size()
    input_softmax = F.softmax(input_logits, dim=1)
    target_softmax = F.softmax(target_logits, dim=1)
    num_classes = input_logits.size()[1]
    return F.mse_loss(input_softmax, target_softmax, reduction="sum") / num_classes


def symmetric_mse_loss(input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
    """Like mse_loss summed, with gradients to both sides."""
    assert input1.size() == input2.size()
    num_classes = input1.size()[1]
    return torch.sum((input1 - input2) ** 2) / num_classes


# --------------------------------------------------------------------------- mean_teacher/data.py


def random_translate_with_reflect(img: np.ndarray, max_translation: int, rng: np.random.RandomState) -> np.ndarray:
    """``RandomTranslateWithReflect``: shift an (H, W) image by up to ``max_translation``
    pixels on each axis, the uncovered border filled by reflection."""
    xt, yt = rng.randint(-max_translation, max_translation + 1, size=2)
    pad = max_translation
    padded = np.pad(img, pad, mode="reflect")
    h, w = img.shape
    top, left = pad - yt, pad - xt
    return padded[top : top + h, left : left + w]


class TransformTwice:
    def __init__(self, transform) -> None:
        self.transform = transform

    def __call__(self, inp):
        return self.transform(inp), self.transform(inp)


def relabel_dataset(dataset: DigitFolder, labels: dict[int, int], fill_unlabeled: int = NO_LABEL):
    """Images named in ``labels`` get their class index, the others ``fill_unlabeled``."""
    unlabeled_idxs = []
    for idx in range(len(dataset.imgs)):
        if idx in labels:
            dataset.targets[idx] = labels[idx]
        else:
            dataset.targets[idx] = fill_unlabeled
            unlabeled_idxs.append(idx)
    labeled_idxs = sorted(set(range(len(dataset.imgs))) - set(unlabeled_idxs))
    return labeled_idxs, unlabeled_idxs


def iterate_once(iterable):
    return np.random.permutation(iterable)


def iterate_eternally(indices):
    def infinite_shuffles():
        while True:
            yield np.random.permutation(indices)

    return itertools.chain.from_iterable(infinite_shuffles())


def grouper(iterable, n: int):
    args = [iter(iterable)] * n
    return zip(*args)


class TwoStreamBatchSampler(Sampler):
    """An epoch is one pass over the primary indices; the secondary ones repeat forever."""

    def __init__(self, primary_indices, secondary_indices, batch_size: int, secondary_batch_size: int) -> None:
        self.primary_indices, self.secondary_indices = primary_indices, secondary_indices
        self.secondary_batch_size = secondary_batch_size
        self.primary_batch_size = batch_size - secondary_batch_size
        assert len(self.primary_indices) >= self.primary_batch_size > 0
        assert len(self.secondary_indices) >= self.secondary_batch_size > 0

    def __iter__(self):
        primary_iter = iterate_once(self.primary_indices)
        secondary_iter = iterate_eternally(self.secondary_indices)
        return (list(p) + list(s) for p, s in zip(grouper(primary_iter, self.primary_batch_size),
                                                  grouper(secondary_iter, self.secondary_batch_size)))  # fmt: skip

    def __len__(self) -> int:
        return len(self.primary_indices) // self.primary_batch_size


class DigitFolder(Dataset):
    """``torchvision.datasets.ImageFolder`` over the digits: ``imgs`` and ``targets``, a transform."""

    def __init__(self, images: np.ndarray, labels: torch.Tensor, transform) -> None:
        self.imgs, self.targets, self.transform = images, labels.clone(), transform

    def __len__(self) -> int:
        return len(self.imgs)

    def __getitem__(self, i: int):
        return self.transform(self.imgs[i]), int(self.targets[i])


# --------------------------------------------------------------------------- mean_teacher/architectures.py


class Shake(Function):
    @staticmethod
    def forward(ctx, inp1: torch.Tensor, inp2: torch.Tensor, training: bool) -> torch.Tensor:
        assert inp1.size() == inp2.size()
        gate = inp1.new_empty([inp1.size(0)] + [1] * (inp1.dim() - 1))
        gate.uniform_(0, 1) if training else gate.fill_(0.5)
        return inp1 * gate + inp2 * (1.0 - gate)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        gate = grad_output.new_empty([grad_output.size(0)] + [1] * (grad_output.dim() - 1)).uniform_(0, 1)
        grad1 = grad_output * gate if ctx.needs_input_grad[0] else None
        grad2 = grad_output * (1 - gate) if ctx.needs_input_grad[1] else None
        return grad1, grad2, None


def shake(inp1: torch.Tensor, inp2: torch.Tensor, training: bool = False) -> torch.Tensor:
    return Shake.apply(inp1, inp2, training)


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class ShakeShakeBlock(nn.Module):
    @classmethod
    def out_channels(cls, planes: int, groups: int) -> int:
        assert groups == 1
        return planes

    def __init__(self, inplanes: int, planes: int, groups: int, stride: int = 1, downsample=None) -> None:
        super().__init__()
        self.conv_a1, self.bn_a1 = conv3x3(inplanes, planes, stride), nn.BatchNorm2d(planes)
        self.conv_a2, self.bn_a2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.conv_b1, self.bn_b1 = conv3x3(inplanes, planes, stride), nn.BatchNorm2d(planes)
        self.conv_b2, self.bn_b2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample, self.stride = downsample, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(x, inplace=False)
        a = F.relu(self.bn_a1(self.conv_a1(a)), inplace=True)
        a = self.bn_a2(self.conv_a2(a))
        b = F.relu(x, inplace=False)
        b = F.relu(self.bn_b1(self.conv_b1(b)), inplace=True)
        b = self.bn_b2(self.conv_b2(b))
        ab = shake(a, b, training=self.training)
        residual = self.downsample(x) if self.downsample is not None else x
        return residual + ab


class ShiftConvDownsample(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(2 * in_channels, out_channels, kernel_size=1, groups=2)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat((x[:, :, 0::2, 0::2], x[:, :, 1::2, 1::2]), dim=1)
        return self.bn(self.conv(self.relu(x)))


class ResNet32x32(nn.Module):
    def __init__(self, block, layers: list[int], channels: int, groups: int = 1, num_classes: int = 1000,
                 downsample: str = "basic", in_channels: int = 3, pool: int = 8) -> None:  # fmt: skip
        super().__init__()
        assert len(layers) == 3
        self.downsample_mode = downsample
        self.softmax_out = False
        self.inplanes = 16
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.layer1 = self._make_layer(block, channels, groups, layers[0])
        self.layer2 = self._make_layer(block, channels * 2, groups, layers[1], stride=2)
        self.layer3 = self._make_layer(block, channels * 4, groups, layers[2], stride=2)
        self.avgpool = nn.AvgPool2d(pool)
        self.fc1 = nn.Linear(block.out_channels(channels * 4, groups), num_classes)
        self.fc2 = nn.Linear(block.out_channels(channels * 4, groups), num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()

    def _make_layer(self, block, planes: int, groups: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != block.out_channels(planes, groups):
            if self.downsample_mode == "basic" or stride == 1:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, block.out_channels(planes, groups), kernel_size=1, stride=stride,
                              bias=False),
                    nn.BatchNorm2d(block.out_channels(planes, groups)),
                )  # fmt: skip
            elif self.downsample_mode == "shift_conv":
                downsample = ShiftConvDownsample(self.inplanes, block.out_channels(planes, groups))
            else:
                raise AssertionError(self.downsample_mode)
        layers = [block(self.inplanes, planes, groups, stride, downsample)]
        self.inplanes = block.out_channels(planes, groups)
        layers += [block(self.inplanes, planes, groups) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor):
        x = self.conv1(x)
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        if self.softmax_out:
            return F.softmax(self.fc1(x), dim=1), F.softmax(self.fc2(x), dim=1)
        return self.fc1(x), self.fc2(x)


def cifar_shakeshake26(num_classes: int, channels: int) -> ResNet32x32:
    """Shrunk: one block per stage (four), ``channels`` wide (96), one input channel, 8x8 input."""
    return ResNet32x32(ShakeShakeBlock, layers=[1, 1, 1], channels=channels, downsample="shift_conv",
                       num_classes=num_classes, in_channels=1, pool=SIDE // 4)  # fmt: skip


# --------------------------------------------------------------------------- main.py


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class AverageMeterSet:
    def __init__(self) -> None:
        self.meters: dict[str, AverageMeter] = {}

    def __getitem__(self, key: str) -> AverageMeter:
        return self.meters[key]

    def update(self, name: str, value: float, n: int = 1) -> None:
        self.meters.setdefault(name, AverageMeter()).update(value, n)


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    """Precision@k over the labelled samples of the batch (percent)."""
    maxk = max(topk)
    labeled_minibatch_size = max(int(target.ne(NO_LABEL).sum()), 1e-8)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / labeled_minibatch_size) for k in topk]


def update_ema_variables(model: nn.Module, ema_model: nn.Module, alpha: float, global_step: int) -> None:
    alpha = min(1 - 1 / (global_step + 1), alpha)  # the true average until the EMA is more correct
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        ema_param.data.mul_(alpha).add_(param.data, alpha=1 - alpha)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    np.random.seed(seed)
    torch.manual_seed(seed)
    aug_rng = np.random.RandomState(seed + 1)  # the transforms' own draws (np.random in the original)

    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_images, test_images = train_raw.numpy(), test_raw.numpy()  # (N, 8, 8) uint8: the "image files"
    mean, std = float(train_images.mean() / 255.0), float(train_images.std() / 255.0)  # the dataset's channel_stats

    def eval_transformation(img: np.ndarray) -> torch.Tensor:
        return (torch.from_numpy(img).float().div(255.0)[None] - mean) / std  # ToTensor, Normalize

    def augment(img: np.ndarray) -> torch.Tensor:
        return eval_transformation(random_translate_with_reflect(img, TRANSLATE, aug_rng))

    train_transformation = TransformTwice(augment)

    # the balanced labels file: N_LABELS / 10 images of each class, drawn by the data seed
    label_rng = np.random.RandomState(seed + 10)
    labels = {int(i): int(train_labels[i]) for c in range(10)
              for i in label_rng.choice(np.flatnonzero(train_labels.numpy() == c), N_LABELS // 10, replace=False)}  # fmt: skip

    dataset = DigitFolder(train_images, train_labels, train_transformation)
    labeled_idxs, unlabeled_idxs = relabel_dataset(
        dataset, labels, fill_unlabeled=0 if variant == "unlabeled_targets_zero" else NO_LABEL)
    batch_sampler = TwoStreamBatchSampler(unlabeled_idxs, labeled_idxs, args["batch_size"], args["labeled_batch_size"])
    train_loader = DataLoader(dataset, batch_sampler=batch_sampler, num_workers=0)
    eval_loader = DataLoader(DigitFolder(test_images, test_labels, eval_transformation), batch_size=args["batch_size"],
                             shuffle=False, drop_last=False)  # fmt: skip

    def create_model(ema: bool = False) -> nn.Module:
        model = cifar_shakeshake26(num_classes=10, channels=args["channels"])
        model.softmax_out = variant == "softmax_in_model"
        if ema:
            for param in model.parameters():
                param.detach_()
        return model

    model = create_model()
    ema_model = create_model(ema=True)
    optimizer = torch.optim.SGD(model.parameters(), args["lr"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"], nesterov=args["nesterov"])  # fmt: skip

    class_criterion = nn.CrossEntropyLoss(reduction="sum", ignore_index=NO_LABEL)  # size_average=False
    consistency_criterion = softmax_mse_loss
    residual_logit_criterion = symmetric_mse_loss

    def class_loss_fn(output, target: torch.Tensor) -> torch.Tensor:
        """The class loss as a function of the model's (fc1, fc2) output (what the probes train)."""
        return class_criterion(output[0], target) / len(target)

    (first_input, _), first_target = next(iter(DataLoader(dataset, batch_sampler=batch_sampler)))
    first_batch = (first_input, first_target)
    splits = (torch.stack([eval_transformation(img) for img in train_images]), dataset.targets.clone(),
              torch.stack([eval_transformation(img) for img in test_images]), test_labels)  # fmt: skip
    nx.preflight(model, first_batch, class_loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=class_criterion)

    def adjust_learning_rate(epoch: int, step_in_epoch: int, total_steps_in_epoch: int) -> None:
        epoch = epoch + step_in_epoch / total_steps_in_epoch
        lr = linear_rampup(epoch, args["lr_rampup"]) * (args["lr"] - args["initial_lr"]) + args["initial_lr"]
        if args["lr_rampdown_epochs"]:
            assert args["lr_rampdown_epochs"] >= args["epochs"]
            lr *= cosine_rampdown(epoch, args["lr_rampdown_epochs"])
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

    def get_current_consistency_weight(epoch: int) -> float:
        return args["consistency"] * sigmoid_rampup(epoch, args["consistency_rampup"])

    global_step = 0
    log: list[dict[str, float]] = []

    def train_epoch(epoch: int) -> AverageMeterSet:
        nonlocal global_step
        meters = AverageMeterSet()
        model.train()
        ema_model.train()
        for i, ((inp, ema_input), target) in enumerate(train_loader):
            adjust_learning_rate(epoch, i, len(train_loader))
            meters.update("lr", optimizer.param_groups[0]["lr"])
            minibatch_size = len(target)
            labeled_minibatch_size = int(target.ne(NO_LABEL).sum())
            assert labeled_minibatch_size > 0
            meters.update("labeled_minibatch_size", labeled_minibatch_size)

            with torch.no_grad():  # volatile=True
                ema_model_out = ema_model(ema_input)
            model_out = model(inp)
            logit1, logit2 = model_out
            ema_logit, _ = ema_model_out
            ema_logit = ema_logit.detach()

            if args["logit_distance_cost"] >= 0:
                class_logit, cons_logit = logit1, logit2
                res_loss = args["logit_distance_cost"] * residual_logit_criterion(class_logit, cons_logit) / minibatch_size
                meters.update("res_loss", res_loss.item())
            else:
                class_logit, cons_logit = logit1, logit1
                res_loss = 0

            class_loss = mon.loss_fn(class_logit, target) / minibatch_size
            meters.update("class_loss", class_loss.item())
            ema_class_loss = class_criterion(ema_logit, target) / minibatch_size
            meters.update("ema_class_loss", ema_class_loss.item())

            if args["consistency"]:
                consistency_weight = get_current_consistency_weight(epoch)
                meters.update("cons_weight", consistency_weight)
                consistency_loss = consistency_weight * consistency_criterion(cons_logit, ema_logit) / minibatch_size
                meters.update("cons_loss", consistency_loss.item())
            else:
                consistency_loss = 0
                meters.update("cons_loss", 0)

            loss = class_loss + consistency_loss + res_loss
            assert not (np.isnan(loss.item()) or loss.item() > 1e5), f"Loss explosion: {loss.item()}"
            meters.update("loss", loss.item())

            (prec1,) = accuracy(class_logit.detach(), target, topk=(1,))
            meters.update("top1", prec1.item(), labeled_minibatch_size)
            (ema_prec1,) = accuracy(ema_logit, target, topk=(1,))
            meters.update("ema_top1", ema_prec1.item(), labeled_minibatch_size)

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            global_step += 1
            update_ema_variables(model, ema_model, args["ema_decay"], global_step)
            nx.timed(lambda: mon.log(loss, accuracy=prec1.item() / 100.0))

            if i % args["print_freq"] == 0:
                log.append({"epoch": epoch + i / len(train_loader), "step": global_step, "class_loss": class_loss.item(),
                            "cons_loss": meters["cons_loss"].val, "top1": meters["top1"].val})  # fmt: skip
        return meters

    def validate(net: nn.Module, watched: bool) -> tuple[float, float]:
        meters = AverageMeterSet()
        net.eval()
        with torch.no_grad():
            for inp, target in eval_loader:
                minibatch_size = len(target)
                labeled_minibatch_size = int(target.ne(NO_LABEL).sum())
                output1, _ = net(inp)
                class_loss = class_criterion(output1, target) / minibatch_size
                (prec1,) = accuracy(output1, target, topk=(1,))
                meters.update("class_loss", class_loss.item(), labeled_minibatch_size)
                meters.update("top1", prec1.item(), labeled_minibatch_size)
        if watched:
            nx.timed(lambda: mon.log(meters["class_loss"].avg, split="val", accuracy=meters["top1"].avg / 100.0))
        return meters["top1"].avg, meters["class_loss"].avg

    best_prec1 = 0.0
    prec1 = ema_prec1 = val_loss = float("nan")
    meters = None
    for epoch in range(args["epochs"]):
        meters = train_epoch(epoch)
        prec1, val_loss = validate(model, watched=True)
        ema_prec1, _ = validate(ema_model, watched=False)
        best_prec1 = max(ema_prec1, best_prec1)

    nx.finish(mon, model, first_batch, class_loss_fn, optimizer=optimizer, data=splits)
    return {
        "ema_prec1": ema_prec1 / 100.0,
        "prec1": prec1 / 100.0,
        "best_prec1": best_prec1 / 100.0,
        "val_class_loss": val_loss,
        "train_class_loss": meters["class_loss"].avg if meters else float("nan"),
        "train_cons_loss": meters["cons_loss"].avg if meters else float("nan"),
    }

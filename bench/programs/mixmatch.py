"""Port of YU1ut/MixMatch-pytorch: MixMatch semi-supervised learning (label guessing over two
augmentations, sharpening, MixUp of labelled and unlabelled images, an EMA model evaluated).

Source: github.com/YU1ut/MixMatch-pytorch, ``train.py`` with ``models/wideresnet.py``,
``dataset/cifar10.py`` and ``utils/eval.py`` at commit cc7ef42cffe61288d06eec1428268b384674009a
(MIT, Copyright (c) 2019 Qing Yu). Written anew from the facts of those files; no code copied.

Kept: ``train_val_split`` (per class: the indices shuffled with ``np.random.shuffle``, the first
``n_labeled / 10`` labelled, the last ``val`` per class the validation split, the rest unlabelled;
each list shuffled again); ``normalize`` by the dataset's mean and std (``x -= mean * 255; x *=
1 / (255 * std)``) and ``transpose`` to NCHW at construction, as ``CIFAR10_labeled`` does;
``RandomPadandCrop`` (reflect padding, the offset drawn by ``np.random.randint(0, h - new_h)``,
so the last offset is never drawn), ``ToTensor``; ``TransformTwice`` for the unlabelled set,
whose targets are -1; the four loaders (labelled and unlabelled shuffled with ``drop_last``,
validation and test in order), the iterators restarted when exhausted; ``WideResNet`` (3x3
``conv1`` to 16 channels, three ``NetworkBlock``s of pre-activation ``BasicBlock``s -- BN with
``momentum``, LeakyReLU(0.1), conv3x3, BN, LeakyReLU(0.1), conv3x3, a 1x1 shortcut conv when the
width changes, ``activate_before_residual`` in the first -- a final BN and LeakyReLU,
``F.avg_pool2d`` over the whole map, ``fc``; convolutions ``normal_(0, sqrt(2 / (k * k *
out_channels)))``, BN weight 1 bias 0, xavier-normal ``fc`` with zero bias);
``create_model(ema=True)`` (the EMA model's parameters ``detach_()``-ed); ``SemiLoss`` (``Lx``
the soft-target cross-entropy of ``log_softmax``, ``Lu`` the mean squared error between
``softmax(outputs_u)`` and the guessed targets, the weight ``lambda_u * linear_rampup(epoch +
batch_idx / train_iteration)`` with ``rampup_length = epochs``); ``WeightEMA`` over the
``state_dict`` values (parameters and BN buffers; the model first given the EMA model's values;
``ema = alpha * ema + (1 - alpha) * param`` for float32 entries, then the model's entry decayed
by ``1 - 0.02 * lr``); ``Adam(lr=0.002)``; ``train``: ``model.train()`` once per epoch, one-hot
``targets_x`` by ``scatter_``, under ``no_grad`` the guess ``(softmax(model(u1)) +
softmax(model(u2))) / 2`` sharpened by ``p ** (1 / T)`` and renormalised, ``l ~ Beta(alpha,
alpha)``, ``l = max(l, 1 - l)``, one ``randperm`` over ``cat(x, u1, u2)`` mixing inputs and
targets, ``interleave`` of the batch-size splits (the labelled split swapping a slice with each
unlabelled split), one forward per split, ``interleave`` back, ``Lx``/``Lu``/``w``, ``loss = Lx +
w * Lu``, ``zero_grad``/``backward``/``step``, ``ema_optimizer.step()``; after every epoch
``validate`` of the EMA model (``model.eval()``, ``no_grad``, cross-entropy, precision@1) on the
labelled, validation and test loaders; ``best_acc`` by validation accuracy, the mean of the last
20 test accuracies.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test, one channel) instead of CIFAR-10, with
50 labels (5 per class) instead of 250 and 15 validation images per class instead of 500 (the
rest, 1,237, unlabelled); ``RandomPadandCrop(8)`` with 1 pixel of padding instead of 4 of 32;
no ``RandomFlip`` (a mirrored digit is another digit); the average pool over the final 2x2 map
instead of 8x8; WideResNet depth 10 (one block per group) and widen factor 1 instead of 28x2;
batch 16 instead of 64; 8 epochs of 64 iterations (512 steps) instead of 1,024 of 1,024 (the
ramp-up of ``lambda_u`` still spans all epochs); BN momentum 0.01 instead of 0.001 and
``ema_decay`` 0.99 instead of 0.999 (the same averages over 2,000 times fewer steps); no
checkpoints, TensorBoard, logger or progress bar; CPU. At this size the EMA model reaches 0.94-0.97
test accuracy on seeds 0-2 (0.91 on seed 0 with ``lambda_u`` 0, the labelled loss alone).
Measure only (not in the program): nothing; the EMA model's last ``test`` accuracy is what the
program reports (and ``best_acc`` / ``mean_acc``).

nndx, as the author would add it: a preflight ``nndx.probe`` of the model on the first labelled
batch (its integer labels) with the supervised part of ``SemiLoss`` (``Lx`` on one-hot targets) as
the loss, the Adam optimizer and the data splits (the 50 labelled images and the validation
images, through the validation transform, with their labels); ``nndx.Monitor(model, optimizer)``
around the epochs, each step's total loss logged, each epoch's ``validate`` of the EMA model on the
validation split logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``. ``SemiLoss`` takes five arguments and returns three values, so the loop keeps
its own loss call; the EMA model has no optimizer and is not watched.
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

NAME = "mixmatch"
SOURCE = Source("YU1ut/MixMatch-pytorch", "train.py", "cc7ef42cffe61288d06eec1428268b384674009a", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (the CIFAR-10 settings, shrunk)"),
        Variant(
            "lu_on_logits",
            "SemiLoss's Lu takes the squared error between the raw logits of the mixed unlabelled batch and the "
            "guessed label distributions (probs_u = outputs_u, the softmax left out): the consistency term, "
            "weighted up to lambda_u = 75, pulls every logit towards a probability in [0, 1]",
            (C.WRONG_LOSS, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/CuriousAI/mean-teacher/issues/62",
             "https://github.com/facebookresearch/mixup-cifar10/issues/18",
             "https://github.com/octo-models/octo/pull/79"),
            Measure("test_acc", "the EMA model's final test accuracy at least 0.05 below the healthy run's "
                    "(0.956/0.967/0.939 healthy, 0.608/0.619/0.692 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() dropped from the step: every backward adds to the gradients of all the "
            "steps before it, which Adam then follows",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/yastrebksv/TennisCourtDetector/issues/7", "https://github.com/wenet-e2e/wekws/pull/73",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1"),
            Measure("test_acc", "the EMA model's final test accuracy at least 0.05 below the healthy run's "
                    "(0.956/0.967/0.939 healthy, 0.864/0.658/0.717 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

N_CLASSES, SIDE = 10, 8
ARGS = {"epochs": 8, "batch_size": 16, "lr": 0.002, "n_labeled": 50, "val_per_class": 15, "train_iteration": 64,
        "alpha": 0.75, "lambda_u": 75.0, "T": 0.5, "ema_decay": 0.99, "depth": 10, "widen_factor": 1,
        "bn_momentum": 0.01, "pad": 1}  # fmt: skip


# --------------------------------------------------------------------------- dataset/cifar10.py


def train_val_split(labels: np.ndarray, n_labeled_per_class: int, val_per_class: int):
    labels = np.array(labels)
    train_labeled_idxs, train_unlabeled_idxs, val_idxs = [], [], []
    for i in range(N_CLASSES):
        idxs = np.where(labels == i)[0]
        np.random.shuffle(idxs)
        train_labeled_idxs.extend(idxs[:n_labeled_per_class])
        train_unlabeled_idxs.extend(idxs[n_labeled_per_class:-val_per_class])
        val_idxs.extend(idxs[-val_per_class:])
    np.random.shuffle(train_labeled_idxs)
    np.random.shuffle(train_unlabeled_idxs)
    np.random.shuffle(val_idxs)
    return train_labeled_idxs, train_unlabeled_idxs, val_idxs


def normalize(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    x = np.array(x, np.float32)
    x -= mean * 255
    x *= 1.0 / (255 * std)
    return x


def transpose(x: np.ndarray) -> np.ndarray:
    return x[:, None]  # NHW (one channel) -> NCHW


def pad(x: np.ndarray, border: int) -> np.ndarray:
    return np.pad(x, [(0, 0), (border, border), (border, border)], mode="reflect")


class RandomPadandCrop:
    def __init__(self, output_size: int, border: int) -> None:
        self.output_size = (output_size, output_size)
        self.border = border

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = pad(x, self.border)
        h, w = x.shape[1:]
        new_h, new_w = self.output_size
        top = np.random.randint(0, h - new_h)
        left = np.random.randint(0, w - new_w)
        return x[:, top : top + new_h, left : left + new_w]


class ToTensor:
    def __call__(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x))


class Compose:
    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class TransformTwice:
    def __init__(self, transform) -> None:
        self.transform = transform

    def __call__(self, inp):
        return self.transform(inp), self.transform(inp)


class DigitsLabeled(Dataset):
    """``CIFAR10_labeled``: the images at ``indexs``, normalised and transposed once."""

    def __init__(self, images: np.ndarray, targets: np.ndarray, mean: float, std: float, indexs=None,
                 transform=None) -> None:  # fmt: skip
        self.data, self.targets = images, np.array(targets)
        if indexs is not None:
            self.data = self.data[indexs]
            self.targets = np.array(targets)[indexs]
        self.data = transpose(normalize(self.data, mean, std))
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        img, target = self.data[index], self.targets[index]
        if self.transform is not None:
            img = self.transform(img)
        return img, int(target)


class DigitsUnlabeled(DigitsLabeled):
    def __init__(self, images, targets, mean, std, indexs, transform=None) -> None:
        super().__init__(images, targets, mean, std, indexs, transform)
        self.targets = np.array([-1 for _ in range(len(self.targets))])


# --------------------------------------------------------------------------- models/wideresnet.py


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, out_planes: int, stride: int, bn_momentum: float, drop_rate: float = 0.0,
                 activate_before_residual: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes, momentum=bn_momentum)
        self.relu1 = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes, momentum=bn_momentum)
        self.relu2 = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.droprate = drop_rate
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
        if self.droprate > 0:
            out = F.dropout(out, p=self.droprate, training=self.training)
        out = self.conv2(out)
        return torch.add(x if self.equal_in_out else self.conv_shortcut(x), out)


class NetworkBlock(nn.Module):
    def __init__(self, nb_layers: int, in_planes: int, out_planes: int, stride: int, bn_momentum: float,
                 activate_before_residual: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.layer = nn.Sequential(*[
            BasicBlock(in_planes if i == 0 else out_planes, out_planes, stride if i == 0 else 1, bn_momentum,
                       activate_before_residual=activate_before_residual)
            for i in range(nb_layers)
        ])  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    def __init__(self, num_classes: int, depth: int, widen_factor: int, bn_momentum: float,
                 in_channels: int = 1) -> None:  # fmt: skip
        super().__init__()
        n_channels = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        assert (depth - 4) % 6 == 0
        n = (depth - 4) // 6
        self.conv1 = nn.Conv2d(in_channels, n_channels[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.block1 = NetworkBlock(n, n_channels[0], n_channels[1], 1, bn_momentum, activate_before_residual=True)
        self.block2 = NetworkBlock(n, n_channels[1], n_channels[2], 2, bn_momentum)
        self.block3 = NetworkBlock(n, n_channels[2], n_channels[3], 2, bn_momentum)
        self.bn1 = nn.BatchNorm2d(n_channels[3], momentum=bn_momentum)
        self.relu = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.fc = nn.Linear(n_channels[3], num_classes)
        self.n_channels = n_channels[3]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / fan))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight.data)
                m.bias.data.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = self.relu(self.bn1(out))
        out = F.avg_pool2d(out, out.shape[-1])  # 8 on CIFAR's 32x32: the whole final map
        return self.fc(out.view(-1, self.n_channels))


# --------------------------------------------------------------------------- utils/eval.py, utils/misc.py


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
    return [correct[:k].reshape(-1).float().sum(0).mul_(100.0 / batch_size) for k in topk]


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n
        self.avg = self.sum / self.count


# --------------------------------------------------------------------------- train.py


def linear_rampup(current: float, rampup_length: int) -> float:
    if rampup_length == 0:
        return 1.0
    return float(np.clip(current / rampup_length, 0.0, 1.0))


class SemiLoss:
    def __init__(self, args: dict, softmax_u: bool = True) -> None:
        self.args = args
        self.softmax_u = softmax_u  # the bug: False, Lu on the logits

    def __call__(self, outputs_x, targets_x, outputs_u, targets_u, epoch: float):
        probs_u = torch.softmax(outputs_u, dim=1) if self.softmax_u else outputs_u
        Lx = -torch.mean(torch.sum(F.log_softmax(outputs_x, dim=1) * targets_x, dim=1))
        Lu = torch.mean((probs_u - targets_u) ** 2)
        return Lx, Lu, self.args["lambda_u"] * linear_rampup(epoch, self.args["epochs"])


class WeightEMA:
    def __init__(self, model: nn.Module, ema_model: nn.Module, lr: float, alpha: float = 0.999) -> None:
        self.model, self.ema_model, self.alpha = model, ema_model, alpha
        self.params = list(model.state_dict().values())
        self.ema_params = list(ema_model.state_dict().values())
        self.wd = 0.02 * lr
        for param, ema_param in zip(self.params, self.ema_params):
            param.data.copy_(ema_param.data)

    def step(self) -> None:
        one_minus_alpha = 1.0 - self.alpha
        for param, ema_param in zip(self.params, self.ema_params):
            if ema_param.dtype == torch.float32:
                ema_param.mul_(self.alpha)
                ema_param.add_(param * one_minus_alpha)
                param.mul_(1 - self.wd)  # customized weight decay


def interleave_offsets(batch: int, nu: int) -> list[int]:
    groups = [batch // (nu + 1)] * (nu + 1)
    for x in range(batch - sum(groups)):
        groups[-x - 1] += 1
    offsets = [0]
    for g in groups:
        offsets.append(offsets[-1] + g)
    assert offsets[-1] == batch
    return offsets


def interleave(xy: list[torch.Tensor], batch: int) -> list[torch.Tensor]:
    nu = len(xy) - 1
    offsets = interleave_offsets(batch, nu)
    xy = [[v[offsets[p] : offsets[p + 1]] for p in range(nu + 1)] for v in xy]
    for i in range(1, nu + 1):
        xy[0][i], xy[i][i] = xy[i][i], xy[0][i]
    return [torch.cat(v, dim=0) for v in xy]


class Restartable:
    """``iter(loader)`` restarted on exhaustion, as the ``try: next() except: iter()`` pair does."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.it = iter(loader)

    def next(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)


def train_epoch(labeled: Restartable, unlabeled: Restartable, model, optimizer, ema_optimizer, criterion,
                epoch: int, args: dict, variant: str, nx: Nndx, mon) -> tuple[float, float, float]:  # fmt: skip
    losses, losses_x, losses_u, ws = AverageMeter(), AverageMeter(), AverageMeter(), AverageMeter()
    model.train()
    for batch_idx in range(args["train_iteration"]):
        inputs_x, targets_x = labeled.next()
        (inputs_u, inputs_u2), _ = unlabeled.next()
        batch_size = inputs_x.size(0)

        targets_x = torch.zeros(batch_size, N_CLASSES).scatter_(1, targets_x.view(-1, 1).long(), 1)

        with torch.no_grad():
            outputs_u = model(inputs_u)
            outputs_u2 = model(inputs_u2)
            p = (torch.softmax(outputs_u, dim=1) + torch.softmax(outputs_u2, dim=1)) / 2
            pt = p ** (1 / args["T"])
            targets_u = pt / pt.sum(dim=1, keepdim=True)
            targets_u = targets_u.detach()

        all_inputs = torch.cat([inputs_x, inputs_u, inputs_u2], dim=0)
        all_targets = torch.cat([targets_x, targets_u, targets_u], dim=0)
        lam = np.random.beta(args["alpha"], args["alpha"])
        lam = max(lam, 1 - lam)
        idx = torch.randperm(all_inputs.size(0))
        input_a, input_b = all_inputs, all_inputs[idx]
        target_a, target_b = all_targets, all_targets[idx]
        mixed_input = lam * input_a + (1 - lam) * input_b
        mixed_target = lam * target_a + (1 - lam) * target_b

        # interleave labeled and unlabeled samples between batches to get correct batchnorm calculation
        mixed_input = interleave(list(torch.split(mixed_input, batch_size)), batch_size)
        logits = [model(mixed_input[0])]
        for inp in mixed_input[1:]:
            logits.append(model(inp))
        # put interleaved samples back
        logits = interleave(logits, batch_size)
        logits_x = logits[0]
        logits_u = torch.cat(logits[1:], dim=0)

        Lx, Lu, w = criterion(logits_x, mixed_target[:batch_size], logits_u, mixed_target[batch_size:],
                              epoch + batch_idx / args["train_iteration"])  # fmt: skip
        loss = Lx + w * Lu

        losses.update(loss.item(), inputs_x.size(0))
        losses_x.update(Lx.item(), inputs_x.size(0))
        losses_u.update(Lu.item(), inputs_x.size(0))
        ws.update(w, inputs_x.size(0))

        if variant != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema_optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
    return losses.avg, losses_x.avg, losses_u.avg


def validate(valloader, model, criterion) -> tuple[float, float]:
    losses, top1 = AverageMeter(), AverageMeter()
    model.eval()
    with torch.no_grad():
        for inputs, targets in valloader:
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            prec1 = accuracy(outputs, targets)[0]
            losses.update(loss.item(), inputs.size(0))
            top1.update(prec1.item(), inputs.size(0))
    return losses.avg, top1.avg


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    np.random.seed(seed)  # the program's np.random.seed(args.manualSeed)
    torch.manual_seed(seed)

    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_images, test_images = train_raw.numpy(), test_raw.numpy()
    train_targets, test_targets = train_labels.numpy(), test_labels.numpy()
    mean, std = float(train_images.mean() / 255.0), float(train_images.std() / 255.0)

    transform_train = Compose([RandomPadandCrop(SIDE, args["pad"]), ToTensor()])
    transform_val = Compose([ToTensor()])
    labeled_idxs, unlabeled_idxs, val_idxs = train_val_split(train_targets, args["n_labeled"] // N_CLASSES,
                                                             args["val_per_class"])  # fmt: skip
    train_labeled_set = DigitsLabeled(train_images, train_targets, mean, std, labeled_idxs, transform_train)
    train_unlabeled_set = DigitsUnlabeled(train_images, train_targets, mean, std, unlabeled_idxs,
                                          TransformTwice(transform_train))  # fmt: skip
    val_set = DigitsLabeled(train_images, train_targets, mean, std, val_idxs, transform_val)
    test_set = DigitsLabeled(test_images, test_targets, mean, std, None, transform_val)
    bs = args["batch_size"]
    labeled_trainloader = DataLoader(train_labeled_set, batch_size=bs, shuffle=True, drop_last=True)
    unlabeled_trainloader = DataLoader(train_unlabeled_set, batch_size=bs, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=bs, shuffle=False)
    test_loader = DataLoader(test_set, batch_size=bs, shuffle=False)

    def create_model(ema: bool = False) -> WideResNet:
        model = WideResNet(N_CLASSES, args["depth"], args["widen_factor"], args["bn_momentum"])
        if ema:
            for param in model.parameters():
                param.detach_()
        return model

    model = create_model()
    ema_model = create_model(ema=True)
    train_criterion = SemiLoss(args, softmax_u=variant != "lu_on_logits")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"])
    ema_optimizer = WeightEMA(model, ema_model, args["lr"], alpha=args["ema_decay"])

    def lx_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        one_hot = torch.zeros(targets.size(0), N_CLASSES).scatter_(1, targets.view(-1, 1).long(), 1)
        return -torch.mean(torch.sum(F.log_softmax(outputs, dim=1) * one_hot, dim=1))

    labeled = Restartable(labeled_trainloader)
    unlabeled = Restartable(unlabeled_trainloader)
    labeled_eval = DigitsLabeled(train_images, train_targets, mean, std, labeled_idxs, transform_val)
    splits = (torch.from_numpy(labeled_eval.data), torch.from_numpy(labeled_eval.targets).long(),
              torch.from_numpy(val_set.data), torch.from_numpy(val_set.targets).long())  # fmt: skip
    first_x, first_y = next(iter(DataLoader(train_labeled_set, batch_size=bs)))
    nx.preflight(model, (first_x, first_y), lx_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5)

    best_acc = 0.0
    test_accs: list[float] = []
    train_loss = train_loss_x = train_loss_u = float("nan")
    test_loss = test_acc = val_acc = float("nan")
    for epoch in range(args["epochs"]):
        train_loss, train_loss_x, train_loss_u = train_epoch(labeled, unlabeled, model, optimizer, ema_optimizer,
                                                             train_criterion, epoch, args, variant, nx, mon)
        _, train_acc = validate(labeled_trainloader, ema_model, criterion)
        val_loss, val_acc = validate(val_loader, ema_model, criterion)
        test_loss, test_acc = validate(test_loader, ema_model, criterion)
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc / 100.0))  # noqa: B023
        best_acc = max(val_acc, best_acc)
        test_accs.append(test_acc)
    nx.finish(mon, model, (first_x, first_y), lx_loss, optimizer=optimizer, data=splits)
    return {
        "test_acc": test_acc / 100.0,
        "best_acc": best_acc / 100.0,
        "mean_acc": float(np.mean(test_accs[-20:])) / 100.0,
        "val_acc": val_acc / 100.0,
        "test_loss": test_loss,
        "train_loss": train_loss,
        "train_loss_x": train_loss_x,
        "train_loss_u": train_loss_u,
    }

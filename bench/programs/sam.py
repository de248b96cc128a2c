"""Port of davda54/sam: Sharpness-Aware Minimization (adaptive SAM, "ASAM", by default) around a
base SGD optimizer, training a Wide ResNet with label smoothing and a step learning-rate
schedule; two forward/backward passes per step, BatchNorm running statistics frozen on the
second.

Source: github.com/davda54/sam, ``sam.py``, ``example/train.py``,
``example/model/wide_res_net.py``, ``example/model/smooth_cross_entropy.py``,
``example/utility/step_lr.py``, ``example/utility/bypass_bn.py``, ``example/utility/cutout.py``
and ``example/data/cifar.py`` at commit 3c3afdbd71cff2462ec91c734b3d1170bd0f3707 (MIT, Copyright
(c) 2021 David Samuel). Written anew from the facts of those files; no code copied.

Kept: ``SAM`` as a ``torch.optim.Optimizer`` subclass wrapping ``base_optimizer(self.param_groups,
**kwargs)`` and sharing its param groups; ``first_step(zero_grad=False)`` (the gradient norm over
every parameter's ``(|p| if adaptive else 1) * grad``, ``e_w = (p^2 if adaptive else 1) * grad *
rho / (norm + 1e-12)``, the old weights saved in ``state[p]["old_p"]``, ``p.add_(e_w)``, then
``zero_grad`` if asked); ``second_step(zero_grad=False)`` (weights restored from ``old_p``, the
base optimizer's ``step()``, then ``zero_grad`` if asked); the closure-driven ``step`` (unused
by the example, kept); the example's defaults: ``adaptive=True``, ``rho=2.0``, SGD ``lr=0.1``,
``momentum=0.9``, ``weight_decay=5e-4``, ``label_smoothing=0.1``, ``dropout=0.0``, batch 128;
``WideResNet`` (a 3x3 stem convolution to 16 channels, three ``Block``s of a ``DownsampleUnit``
(BatchNorm, ReLU, then a 3x3 conv of the given stride, BatchNorm, ReLU, Dropout, 3x3 conv, plus a
1x1 strided shortcut from the normalised input) and ``(depth - 4) // 6`` ``BasicUnit``s (BN, ReLU,
conv, BN, ReLU, Dropout, conv, added to the input), a last BatchNorm, ReLU, ``AvgPool2d``,
``Flatten`` and ``Linear``; widths 16, 16k, 32k, 64k; Kaiming-normal (fan_in, relu) convolutions,
BatchNorm weight 1 / bias 0, the classifier initialised to zero); ``smooth_crossentropy``
(``smoothing / (C - 1)`` off the target, ``1 - smoothing`` on it, ``F.kl_div(log_softmax, ...,
reduction="none").sum(-1)``, a per-sample loss); the loop: ``model.train()`` each epoch;
``enable_running_stats`` (BN momentum restored from ``backup_momentum``), forward, loss,
``loss.mean().backward()``, ``optimizer.first_step(zero_grad=True)``; ``disable_running_stats``
(BN momentum backed up and set to 0), a second full forward, ``.mean().backward()``,
``optimizer.second_step(zero_grad=True)``; then, under ``no_grad``, the batch's accuracy from the
first pass's predictions and ``scheduler(epoch)`` (the repository's own ``StepLR``: the base LR
until 30% of the epochs, then x0.2, x0.04 at 60%, x0.008 at 80%) called after every batch; the
test loop under ``model.eval()`` and ``no_grad`` with the smoothed loss (default smoothing 0.1) and
accuracy; the data pipeline: the training set's per-channel mean/std (``Cifar._get_statistics``),
random crop with padding, ``Normalize``, ``Cutout`` (half the side, p 0.5, zeros after
normalisation); a shuffled train loader and an unshuffled test loader.
Shrunk: scikit-learn's 8x8 digits (10 classes, 1,437 train / 360 test) at their own 8x8, one
channel, instead of 32x32 CIFAR-10 (so ``AvgPool2d`` has kernel 2 where the original has 8, the
side of the last feature map either way; crop padding 1 and cutout 4 instead of 4 and 16, the same
fractions of the side); ``depth`` 10 (one ``BasicUnit`` per block) and ``width_factor`` 2 instead
of 16 and 8; 8 epochs of 12 batches instead of 200 of 391 (the ``StepLR`` milestones, 30/60/80%
of the epochs, fall at the starts of epochs 3, 5 and 7); no horizontal flip (digits are not mirror-symmetric); seeds from the harness
instead of 42; CPU, no loader threads, no loading bar (the ``Log`` class's averages are computed
in place).
Measure only (not in the program): nothing beyond the test loop's loss and accuracy of the last
epoch and the train accuracy of the last epoch.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch with the
label-smoothed loss as ``loss_fn(predictions, targets)`` (its batch mean), the SAM optimizer and
the data splits; ``nndx.Monitor(model, optimizer)`` around the epochs, the first pass's mean loss
and the batch's accuracy logged after each step (the loop keeps its own loss calls) and each test
pass's loss and accuracy logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sam"
SOURCE = Source("davda54/sam", "example/train.py", "3c3afdbd71cff2462ec91c734b3d1170bd0f3707", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (adaptive SAM around SGD, WRN, label smoothing, StepLR; shrunk)"),
        Variant(
            "zero_grad_args_dropped",
            "optimizer.first_step() and optimizer.second_step() called without zero_grad=True (both default to "
            "False) and no zero_grad anywhere else: every backward of both passes adds to the gradients of all "
            "earlier steps, so the ascent direction and the SGD update follow a running sum of stale gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/davda54/sam/issues/62", "https://github.com/rollovd/LookSAM/issues/3"),
            Measure("test_accuracy", "final test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.10),
        ),
        Variant(
            "step_lr_by_iteration",
            "scheduler(step) called with the global iteration count instead of scheduler(epoch): the StepLR "
            "milestones, meant in epochs (2.4, 4.8, 6.4 of 8), are passed at global steps 3, 5 and 7, so the LR "
            "is 0.1 x 0.008 = 8e-4 from the ninth of 96 batches on",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/davda54/sam/issues/28", "https://github.com/pytorch/pytorch/issues/3814",
             "https://github.com/rpryzant/causal-bert-pytorch/issues/9"),
            Measure("test_accuracy", "final test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.10),
        ),
    )
}

ARGS = {"adaptive": True, "batch_size": 128, "depth": 10, "dropout": 0.0, "epochs": 8, "label_smoothing": 0.1,
        "learning_rate": 0.1, "momentum": 0.9, "rho": 2.0, "weight_decay": 0.0005, "width_factor": 2}  # fmt: skip
SIDE, PAD, CUTOUT = 8, 1, 4


# --------------------------------------------------------------------------- sam.py


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho: float = 0.05, adaptive: bool = False, **kwargs) -> None:
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"
        defaults = dict(rho=rho, adaptive=adaptive, **kwargs)
        super().__init__(params, defaults)
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                e_w = (torch.pow(p, 2) if group["adaptive"] else 1.0) * p.grad * scale.to(p)
                p.add_(e_w)  # to the local maximum w + e(w)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.data = self.state[p]["old_p"]  # back to w
        self.base_optimizer.step()  # the sharpness-aware update
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure, but it was not provided"
        closure = torch.enable_grad()(closure)
        self.first_step(zero_grad=True)
        closure()
        self.second_step()

    def _grad_norm(self) -> torch.Tensor:
        shared_device = self.param_groups[0]["params"][0].device
        return torch.norm(torch.stack([
            ((torch.abs(p) if group["adaptive"] else 1.0) * p.grad).norm(p=2).to(shared_device)
            for group in self.param_groups for p in group["params"] if p.grad is not None]), p=2)  # fmt: skip

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self.base_optimizer.param_groups = self.param_groups


# --------------------------------------------------------------------------- model/wide_res_net.py


class BasicUnit(nn.Module):
    def __init__(self, channels: int, dropout: float) -> None:
        super().__init__()
        self.block = nn.Sequential(OrderedDict([
            ("0_normalization", nn.BatchNorm2d(channels)),
            ("1_activation", nn.ReLU(inplace=True)),
            ("2_convolution", nn.Conv2d(channels, channels, (3, 3), stride=1, padding=1, bias=False)),
            ("3_normalization", nn.BatchNorm2d(channels)),
            ("4_activation", nn.ReLU(inplace=True)),
            ("5_dropout", nn.Dropout(dropout, inplace=True)),
            ("6_convolution", nn.Conv2d(channels, channels, (3, 3), stride=1, padding=1, bias=False)),
        ]))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class DownsampleUnit(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.norm_act = nn.Sequential(OrderedDict([
            ("0_normalization", nn.BatchNorm2d(in_channels)),
            ("1_activation", nn.ReLU(inplace=True)),
        ]))  # fmt: skip
        self.block = nn.Sequential(OrderedDict([
            ("0_convolution", nn.Conv2d(in_channels, out_channels, (3, 3), stride=stride, padding=1, bias=False)),
            ("1_normalization", nn.BatchNorm2d(out_channels)),
            ("2_activation", nn.ReLU(inplace=True)),
            ("3_dropout", nn.Dropout(dropout, inplace=True)),
            ("4_convolution", nn.Conv2d(out_channels, out_channels, (3, 3), stride=1, padding=1, bias=False)),
        ]))  # fmt: skip
        self.downsample = nn.Conv2d(in_channels, out_channels, (1, 1), stride=stride, padding=0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_act(x)
        return self.block(x) + self.downsample(x)


class Block(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.block = nn.Sequential(DownsampleUnit(in_channels, out_channels, stride, dropout),
                                   *(BasicUnit(out_channels, dropout) for _ in range(depth)))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class WideResNet(nn.Module):
    def __init__(self, depth: int, width_factor: int, dropout: float, in_channels: int, labels: int,
                 pool: int = 8) -> None:  # fmt: skip
        super().__init__()
        self.filters = [16, 1 * 16 * width_factor, 2 * 16 * width_factor, 4 * 16 * width_factor]
        self.block_depth = (depth - 4) // (3 * 2)
        self.f = nn.Sequential(OrderedDict([
            ("0_convolution", nn.Conv2d(in_channels, self.filters[0], (3, 3), stride=1, padding=1, bias=False)),
            ("1_block", Block(self.filters[0], self.filters[1], 1, self.block_depth, dropout)),
            ("2_block", Block(self.filters[1], self.filters[2], 2, self.block_depth, dropout)),
            ("3_block", Block(self.filters[2], self.filters[3], 2, self.block_depth, dropout)),
            ("4_normalization", nn.BatchNorm2d(self.filters[3])),
            ("5_activation", nn.ReLU(inplace=True)),
            ("6_pooling", nn.AvgPool2d(kernel_size=pool)),
            ("7_flattening", nn.Flatten()),
            ("8_classification", nn.Linear(in_features=self.filters[3], out_features=labels)),
        ]))  # fmt: skip
        self._initialize()

    def _initialize(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight.data, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    m.bias.data.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.weight.data.zero_()
                m.bias.data.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x)


# --------------------------------------------------------------------------- model/, utility/


def smooth_crossentropy(pred: torch.Tensor, gold: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    n_class = pred.size(1)
    one_hot = torch.full_like(pred, fill_value=smoothing / (n_class - 1))
    one_hot.scatter_(dim=1, index=gold.unsqueeze(1), value=1.0 - smoothing)
    log_prob = F.log_softmax(pred, dim=1)
    return F.kl_div(input=log_prob, target=one_hot, reduction="none").sum(-1)


class StepLR:
    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: float, total_epochs: int) -> None:
        self.optimizer, self.total_epochs, self.base = optimizer, total_epochs, learning_rate

    def __call__(self, epoch: int) -> None:
        if epoch < self.total_epochs * 3 / 10:
            lr = self.base
        elif epoch < self.total_epochs * 6 / 10:
            lr = self.base * 0.2
        elif epoch < self.total_epochs * 8 / 10:
            lr = self.base * 0.2**2
        else:
            lr = self.base * 0.2**3
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]


def disable_running_stats(model: nn.Module) -> None:
    def _disable(module: nn.Module) -> None:
        if isinstance(module, _BatchNorm):
            module.backup_momentum = module.momentum
            module.momentum = 0

    model.apply(_disable)


def enable_running_stats(model: nn.Module) -> None:
    def _enable(module: nn.Module) -> None:
        if isinstance(module, _BatchNorm) and hasattr(module, "backup_momentum"):
            module.momentum = module.backup_momentum

    model.apply(_enable)


def train_augment(x: torch.Tensor, normalize, generator: torch.Generator) -> torch.Tensor:
    """RandomCrop(side, padding) on the [0, 1] images (zero padding), Normalize, then Cutout, per image."""
    n, _, h, w = x.shape
    padded = F.pad(x, (PAD, PAD, PAD, PAD))
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=generator)
    out = normalize(torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)]))
    half = CUTOUT // 2
    for i in range(n):  # Cutout(size, p=0.5)
        if torch.rand(1, generator=generator).item() > 0.5:
            continue
        left = int(torch.randint(-half, h - half, (1,), generator=generator))
        top = int(torch.randint(-half, w - half, (1,), generator=generator))
        out[i, :, max(0, left) : min(h, left + CUTOUT), max(0, top) : min(w, top + CUTOUT)] = 0
    return out


# --------------------------------------------------------------------------- example/train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train01, x_test01 = data.to_tensor(train_raw), data.to_tensor(test_raw)
    mean, std = x_train01.mean(dim=[0, 2, 3]), x_train01.std(dim=[0, 2, 3])  # Cifar._get_statistics

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return (x - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)

    x_test = normalize(x_test01)
    model = WideResNet(args["depth"], args["width_factor"], args["dropout"], in_channels=1, labels=10,
                       pool=SIDE // 4)  # fmt: skip
    base_optimizer = torch.optim.SGD
    optimizer = SAM(model.parameters(), base_optimizer, rho=args["rho"], adaptive=args["adaptive"],
                    lr=args["learning_rate"], momentum=args["momentum"], weight_decay=args["weight_decay"])  # fmt: skip
    scheduler = StepLR(optimizer, args["learning_rate"], args["epochs"])
    smoothing = args["label_smoothing"]

    def criterion(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return smooth_crossentropy(predictions, targets, smoothing=smoothing).mean()

    bs, n_train = args["batch_size"], len(train_labels)
    generator = torch.Generator().manual_seed(seed)
    first_batch = (normalize(x_train01[:bs]), train_labels[:bs])
    splits = (normalize(x_train01), train_labels, x_test, test_labels)
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5)

    zero = variant != "zero_grad_args_dropped"
    global_step = 0
    train_acc = test_loss = test_acc = float("nan")
    for epoch in range(args["epochs"]):
        model.train()
        order = torch.randperm(n_train, generator=generator)
        correct_sum, seen = 0.0, 0
        for start in range(0, n_train, bs):
            idx = order[start : start + bs]
            inputs = train_augment(x_train01[idx], normalize, generator)
            targets = train_labels[idx]

            # first forward-backward step
            enable_running_stats(model)
            predictions = model(inputs)
            loss = smooth_crossentropy(predictions, targets, smoothing=smoothing)
            loss.mean().backward()
            if zero:
                optimizer.first_step(zero_grad=True)
            else:
                optimizer.first_step()

            # second forward-backward step
            disable_running_stats(model)
            smooth_crossentropy(model(inputs), targets, smoothing=smoothing).mean().backward()
            if zero:
                optimizer.second_step(zero_grad=True)
            else:
                optimizer.second_step()

            with torch.no_grad():
                correct = torch.argmax(predictions.data, 1) == targets
                correct_sum += correct.sum().item()
                seen += len(targets)
                scheduler(global_step if variant == "step_lr_by_iteration" else epoch)
            nx.timed(lambda: mon.log(loss.mean(), accuracy=correct.float().mean().item()))
            global_step += 1
        train_acc = correct_sum / seen

        model.eval()
        total_loss, total_correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(test_labels), bs):
                inputs, targets = x_test[start : start + bs], test_labels[start : start + bs]
                predictions = model(inputs)
                loss = smooth_crossentropy(predictions, targets)
                total_loss += loss.sum().item()
                total_correct += (torch.argmax(predictions, 1) == targets).sum().item()
        test_loss, test_acc = total_loss / len(test_labels), total_correct / len(test_labels)
        nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc))

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_accuracy": test_acc, "test_loss": test_loss, "train_accuracy": train_acc,
            "final_lr": scheduler.lr()}  # fmt: skip

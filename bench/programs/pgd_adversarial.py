"""Port of locuslab/robust_overfitting ``train_cifar.py``: PGD adversarial training (Madry et al.)
of a pre-activation ResNet-18 with SGD and a piecewise learning-rate schedule.

Source: github.com/locuslab/robust_overfitting, ``train_cifar.py``, ``preactresnet.py`` and
``utils.py`` at commit c47a25c5e00c8b2bb35488d962c04dd771b7e9af (Rice, Wong & Kolter 2020;
the repository ships no licence file). Written anew from the facts of those files; no code
copied.

Kept: ``PreActBlock`` (BN, ReLU, the 1x1 shortcut taken from the activated input when the
shape changes, conv3x3 with stride, BN, ReLU, conv3x3, ``out += shortcut``) and
``PreActResNet`` (a 3x3 stem conv, four stages of strides 1/2/2/2, a last BN + ReLU, average
pooling, ``linear``); ``normalize(X) = (X - mu) / std`` applied inside every call of the
model, the attack working on pixels in [0, 1] (``lower_limit, upper_limit = 0, 1``);
``attack_pgd`` with the l_inf norm: per restart a ``delta`` drawn uniform in
[-epsilon, epsilon], clamped so ``X + delta`` stays in [0, 1], ``requires_grad``, then
``attack_iters`` steps of ``F.cross_entropy(model(normalize(X + delta)), y)``,
``loss.backward()``, ``delta + alpha * sign(grad)`` clamped to the epsilon ball and to the
valid range, ``delta.grad.zero_()``; the per-example max-loss selection over restarts;
``epsilon = args.epsilon / 255.``, ``pgd_alpha = args.pgd_alpha / 255.``; ``SGD(lr_max,
momentum=0.9, weight_decay=5e-4)``; ``CrossEntropyLoss``; the ``piecewise`` schedule (lr_max
for the first half, /10 to three quarters, /100 after) set on ``param_groups[0]`` every
batch at ``epoch + (i + 1) / len(train_batches)``; the training loop with the model in
train mode during the attack, ``robust_output = model(normalize(clamp(X + delta)))``,
``opt.zero_grad()`` / ``robust_loss.backward()`` / ``opt.step()`` after the attack, then a
clean forward for the logged train loss/accuracy; the test loop with ``model.eval()``, PGD
on every test batch (``early_stop`` off), clean and robust loss/accuracy; ``best`` robust
accuracy tracked (the checkpoint kept in memory, not ``torch.save``d); the
random-crop augmentation from a reflect-padded copy (``Crop`` of ``pad(.., 4)``).
Shrunk: scikit-learn's 8x8 digits (one channel, pixels in [0, 1], 360 held out as the test
set) instead of CIFAR-10; stage widths 8/16/32/64 with one block per stage instead of
64-512 with two; reflect padding 1 instead of 4 (an 8x8 image) and no ``FlipLR`` (digits are
not mirror-symmetric); ``--epsilon 24 --pgd-alpha 6`` (0.094 and 0.024 on [0, 1]; 8/255 is
below one grey level of the 17 the digits have) instead of 8 and 2; ``attack_iters`` 7
instead of 10; batch 128 kept; 10 epochs instead of 200 (the schedule's breakpoints scale
with them); no logger, no DataParallel, no ``--val``/``--mixup``/``--l1``/``--l2``/cutout branches.
Measure only (not in the program): the last epoch's clean and PGD test accuracy, as the
program logs them.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(clean, in [0, 1]; the model normalizes itself here, see ``Normalized``) with the optimizer
and the clean data splits; ``nndx.Monitor(model, opt)`` around the epochs with
``criterion`` called as ``mon.loss_fn`` for the robust loss, each batch's robust loss and
robust accuracy logged, each test pass's clean loss/accuracy logged as ``split="val"``;
then ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pgd_adversarial"
SOURCE = Source("locuslab/robust_overfitting", "train_cifar.py", "c47a25c5e00c8b2bb35488d962c04dd771b7e9af",
                "none stated")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (PGD l_inf training, piecewise schedule; shrunk)"),
        Variant(
            "epsilon_not_scaled",
            "epsilon and pgd_alpha used as given on the 0-255 scale (24 and 6) on images in [0, 1]: the "
            "attack may move every pixel anywhere in [0, 1], the training inputs become saturated "
            "loss-maximising patterns that carry almost nothing of the digit",
            (C.UNDERFITTING, C.LABEL_NOISE),
            ("https://github.com/MadryLab/mnist_challenge/issues/13",
             "https://github.com/ytongbai/ViTs-vs-CNNs/issues/7",
             "https://github.com/hendrycks/ss-ood/issues/8"),
            Measure("test_acc", "last clean test accuracy at least 0.2 below the healthy run's: 0.09 against 0.91 "
                    "on seed 0 (PGD accuracy 0.09 against 0.67)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "train_mode_forgotten",
            "the model.train() at the top of each epoch dropped (only the one before the loop kept): after the "
            "first test pass's model.eval(), every later epoch attacks and trains in eval mode (BatchNorm on "
            "its frozen running statistics, which stop updating)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/facebookresearch/clevr-iep/pull/22",
             "https://github.com/deep-learning-with-pytorch/dlwpt-code/issues/104",
             "https://github.com/wolny/pytorch-3dunet/issues/53"),
            Measure("test_acc", "last clean test accuracy at least 0.1 below the healthy run's: 0.76 against 0.91 "
                    "on seed 0 (PGD accuracy 0.53 against 0.67)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ARGS = {"batch_size": 128, "epochs": 10, "lr_max": 0.1, "epsilon": 24, "pgd_alpha": 6, "attack_iters": 7,
        "restarts": 1, "pad": 1}  # fmt: skip
WIDTHS = (8, 16, 32, 64)
lower_limit, upper_limit = 0.0, 1.0


# --------------------------------------------------------------------------- preactresnet.py


class PreActBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out) if hasattr(self, "shortcut") else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class PreActResNet(nn.Module):
    def __init__(self, num_blocks=(1, 1, 1, 1), num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.in_planes = WIDTHS[0]
        self.conv1 = nn.Conv2d(in_channels, WIDTHS[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.layer1 = self._make_layer(WIDTHS[0], num_blocks[0], 1)
        self.layer2 = self._make_layer(WIDTHS[1], num_blocks[1], 2)
        self.layer3 = self._make_layer(WIDTHS[2], num_blocks[2], 2)
        self.layer4 = self._make_layer(WIDTHS[3], num_blocks[3], 2)
        self.bn = nn.BatchNorm2d(WIDTHS[3])
        self.linear = nn.Linear(WIDTHS[3], num_classes)

    def _make_layer(self, planes: int, n: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (n - 1):
            layers.append(PreActBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        out = F.relu(self.bn(out))
        out = F.adaptive_avg_pool2d(out, 1)  # avg_pool2d(out, 4) on CIFAR's 4x4 map; here 1x1
        return self.linear(out.view(out.size(0), -1))


class Normalized(nn.Module):
    """``model(normalize(X))`` as one module, so nndx sees what the program calls."""

    def __init__(self, net: nn.Module, mu: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mu", mu)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mu) / self.std)


# --------------------------------------------------------------------------- train_cifar.py


def clamp(X, lower, upper):
    return torch.max(torch.min(X, upper), lower)


def attack_pgd(model, X, y, epsilon, alpha, attack_iters, restarts):
    max_loss = torch.zeros(y.shape[0])
    max_delta = torch.zeros_like(X)
    for _ in range(restarts):
        delta = torch.zeros_like(X).uniform_(-epsilon, epsilon)
        delta = clamp(delta, lower_limit - X, upper_limit - X)
        delta.requires_grad = True
        for _ in range(attack_iters):
            output = model(X + delta)
            loss = F.cross_entropy(output, y)
            loss.backward()
            grad = delta.grad.detach()
            d = torch.clamp(delta + alpha * torch.sign(grad), min=-epsilon, max=epsilon)
            d = clamp(d, lower_limit - X, upper_limit - X)
            delta.data[:] = d
            delta.grad.zero_()
        all_loss = F.cross_entropy(model(X + delta), y, reduction="none")
        better = all_loss >= max_loss
        max_delta[better] = delta.detach()[better]
        max_loss = torch.max(max_loss, all_loss)
    return max_delta


def random_crop(X: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """``Crop(h, w)`` of the reflect-padded images, one random offset per image."""
    n, _, h, w = X.shape
    padded = F.pad(X, (pad, pad, pad, pad), mode="reflect")
    x0 = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    y0 = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    return torch.stack([padded[i, :, y0[i] : y0[i] + h, x0[i] : x0[i] + w] for i in range(n)])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    X_train, X_test = data.to_tensor(train_raw), data.to_tensor(test_raw)  # (N, 1, 8, 8) in [0, 1]
    mu, std = X_train.mean().view(1, 1, 1), X_train.std().view(1, 1, 1)  # cifar10_mean/std stand-ins

    if variant == "epsilon_not_scaled":
        epsilon, pgd_alpha = float(args["epsilon"]), float(args["pgd_alpha"])
    else:
        epsilon, pgd_alpha = args["epsilon"] / 255.0, args["pgd_alpha"] / 255.0

    model = Normalized(PreActResNet(), mu, std)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args["lr_max"], momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    epochs = args["epochs"]

    def lr_schedule(t: float) -> float:
        if t / epochs < 0.5:
            return args["lr_max"]
        if t / epochs < 0.75:
            return args["lr_max"] / 10.0
        return args["lr_max"] / 100.0

    gen = torch.Generator().manual_seed(seed)
    bs = args["batch_size"]
    n_batches = (len(train_labels) + bs - 1) // bs
    first_batch = (X_train[:bs], train_labels[:bs])
    splits = (X_train, train_labels, X_test, test_labels)
    nx.preflight(model, first_batch, criterion, optimizer=opt, data=splits)
    mon = nx.monitor(model, opt, every=5, loss_fn=criterion)

    log: list[tuple] = []
    best_test_robust_acc, best = 0.0, None
    test_acc = test_robust_acc = test_loss = test_robust_loss = train_robust_loss = float("nan")
    for epoch in range(epochs):
        if variant != "train_mode_forgotten":
            model.train()
        train_loss = train_acc = train_robust_loss_sum = train_robust_acc = 0.0
        train_n = 0
        order = torch.randperm(len(train_labels), generator=gen)
        X_epoch = random_crop(X_train[order], args["pad"], gen)
        y_epoch = train_labels[order]
        lr = args["lr_max"]
        for i in range(n_batches):
            X, y = X_epoch[i * bs : (i + 1) * bs], y_epoch[i * bs : (i + 1) * bs]
            lr = lr_schedule(epoch + (i + 1) / n_batches)
            opt.param_groups[0].update(lr=lr)
            delta = attack_pgd(model, X, y, epsilon, pgd_alpha, args["attack_iters"], args["restarts"]).detach()
            robust_output = model(torch.clamp(X + delta[: X.size(0)], min=lower_limit, max=upper_limit))
            robust_loss = mon.loss_fn(robust_output, y)
            opt.zero_grad()
            robust_loss.backward()
            opt.step()
            robust_correct = (robust_output.max(1)[1] == y).sum().item()
            mon.log(robust_loss, accuracy=robust_correct / y.size(0))

            output = model(X)
            loss = criterion(output, y)
            train_robust_loss_sum += robust_loss.item() * y.size(0)
            train_robust_acc += robust_correct
            train_loss += loss.item() * y.size(0)
            train_acc += (output.max(1)[1] == y).sum().item()
            train_n += y.size(0)
        train_robust_loss = train_robust_loss_sum / train_n

        model.eval()
        test_loss_sum = test_acc_sum = test_robust_loss_sum = test_robust_acc_sum = 0.0
        test_n = 0
        for j in range(0, len(test_labels), bs):
            X, y = X_test[j : j + bs], test_labels[j : j + bs]
            delta = attack_pgd(model, X, y, epsilon, pgd_alpha, args["attack_iters"], args["restarts"]).detach()
            with torch.no_grad():
                robust_output = model(torch.clamp(X + delta[: X.size(0)], min=lower_limit, max=upper_limit))
                robust_loss = criterion(robust_output, y)
                output = model(X)
                loss = criterion(output, y)
            test_robust_loss_sum += robust_loss.item() * y.size(0)
            test_robust_acc_sum += (robust_output.max(1)[1] == y).sum().item()
            test_loss_sum += loss.item() * y.size(0)
            test_acc_sum += (output.max(1)[1] == y).sum().item()
            test_n += y.size(0)
        test_loss, test_acc = test_loss_sum / test_n, test_acc_sum / test_n
        test_robust_loss, test_robust_acc = test_robust_loss_sum / test_n, test_robust_acc_sum / test_n
        mon.log(test_loss, split="val", accuracy=test_acc)
        log.append((epoch, lr, train_loss / train_n, train_acc / train_n, train_robust_loss,
                    train_robust_acc / train_n, test_loss, test_acc, test_robust_loss, test_robust_acc))
        if test_robust_acc > best_test_robust_acc:
            best_test_robust_acc = test_robust_acc
            best = {"state_dict": copy.deepcopy(model.state_dict()), "test_robust_acc": test_robust_acc}

    nx.finish(mon, model, first_batch, criterion, optimizer=opt, data=splits)
    return {"test_acc": test_acc, "test_robust_acc": test_robust_acc, "test_loss": test_loss,
            "test_robust_loss": test_robust_loss, "train_robust_loss": train_robust_loss,
            "best_test_robust_acc": best_test_robust_acc}  # fmt: skip

"""The 46 broken and 9 healthy hand-written cases (the benchmark before the generated
one), kept as one more family, "handwritten", reported separately: they were written
next to the rules, so they measure fit, not generalization.

Each case is a short training script with one bug planted the way people write it, run
through the same pipeline as before: the user's loop under ``nndx.Monitor`` with the
wrapped loss, then ``nndx.probe`` (all probes, with the data checks; overfit 150 steps,
LR range 50 steps), then ``nndx.diagnose``. A crash of the user's loop is recorded in the
report as an ``ErrorRecord`` (source "training"), as a wrapper around the loop would.
The lesson's ``NetworkDebugger`` (bench/network_debugger.py) is hooked into the same loop
as a baseline, with the lesson's loss-curve check reconstructed from what it prints (NaN
-> LR too high; a last-10-steps spread under 1e-3 -> "not decreasing"; direction changes
in over half of the last 10 steps -> "oscillating").
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import nndx
from nndx.report import CauseCode as C
from nndx.report import ErrorRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for network_debugger

from network_debugger import NetworkDebugger  # noqa: E402

from .runner import CASE_TIMEOUT_S, score, time_limit  # noqa: E402
from .styles import StyleResult  # noqa: E402

SEED = 0

# --------------------------------------------------------------------------- data


def blobs(n: int = 640, features: int = 20, classes: int = 4, seed: int | None = None, spread: float = 2.0):
    """Gaussian blobs: learnable, standardised, shuffled."""
    gen = torch.Generator().manual_seed(SEED if seed is None else seed)
    centers = torch.randn(classes, features, generator=gen) * spread
    y = torch.randint(0, classes, (n,), generator=gen)
    x = centers[y] + torch.randn(n, features, generator=gen)
    x = (x - x.mean(0)) / x.std(0)
    return x, y


def rings(n: int = 640, classes: int = 3, seed: int | None = None):
    """Concentric rings: class by radius, which no linear model can separate."""
    gen = torch.Generator().manual_seed(SEED if seed is None else seed)
    y = torch.randint(0, classes, (n,), generator=gen)
    angle = torch.rand(n, generator=gen) * 2 * math.pi
    radius = 1.0 + y.float() + 0.15 * torch.randn(n, generator=gen)
    x = torch.stack([radius * angle.cos(), radius * angle.sin()], 1)
    return (x - x.mean(0)) / x.std(0), y


def digits(raw: bool = False):
    """scikit-learn's 8x8 digits (ships offline). Standardised unless ``raw``."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(y), generator=gen)
    x, y = x[order], y[order]
    if raw:
        return x * 16.0, y  # the 0-16 scale as 0-255 "pixels"
    return (x - x.mean(0)) / (x.std(0) + 1e-6), y


def regression(n: int = 640, features: int = 8, seed: int | None = None):
    gen = torch.Generator().manual_seed(SEED if seed is None else seed)
    x = torch.randn(n, features, generator=gen)
    w = torch.randn(features, generator=gen)
    y = torch.sin(x @ w / 2) + 0.1 * torch.randn(n, generator=gen)
    return x, ((y - y.mean()) / y.std()).unsqueeze(1)


def split(x, y, n_val: int = 128):
    return x[n_val:], y[n_val:], x[:n_val], y[:n_val]


def mlp(inputs: int = 20, outputs: int = 4, hidden: int = 64, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), act(), nn.Linear(hidden, hidden), act(), nn.Linear(hidden, outputs))


# --------------------------------------------------------------------------- the user's loop


@dataclass
class Setup:
    """What a user's training script holds: model, optimizer, loss, data, and its loop."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable
    x: torch.Tensor
    y: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    loop: Callable[["Setup", nndx.Monitor], None] | None = None
    steps: int = 80
    batch_size: int = 64
    classification: bool = True
    scheduler: object = None
    losses: list[float] = field(default_factory=list)


def batches(s: Setup, shuffle: bool = True):
    """(step, x, y) for s.steps steps, reshuffled every epoch like DataLoader(shuffle=True)."""
    gen = torch.Generator().manual_seed(1)
    per_epoch = max(1, len(s.x) // s.batch_size)
    order = torch.arange(len(s.x))
    for step in range(s.steps):
        if step % per_epoch == 0 and shuffle:
            order = torch.randperm(len(s.x), generator=gen)
        idx = order[(step % per_epoch) * s.batch_size : (step % per_epoch + 1) * s.batch_size]
        yield step, s.x[idx], s.y[idx]


def accuracy(s: Setup, out: torch.Tensor, y: torch.Tensor) -> float | None:
    if not s.classification or out.dim() != 2 or out.shape[1] < 2 or y.dim() != 1:
        return None
    return (out.argmax(1) == y).float().mean().item()


def evaluate(s: Setup, mon: nndx.Monitor, train_mode: bool = False) -> None:
    if not train_mode:
        s.model.eval()
    with torch.no_grad():
        out = s.model(s.x_val)
        mon.log(s.loss_fn(out, s.y_val), split="val", accuracy=accuracy(s, out, s.y_val))
    s.model.train()


def standard_loop(s: Setup, mon: nndx.Monitor) -> None:
    """The correct loop every case starts from."""
    for step, xb, yb in batches(s):
        s.model.train()
        s.optimizer.zero_grad()
        out = s.model(xb)
        loss = mon.loss_fn(out, yb)
        loss.backward()
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss, accuracy=accuracy(s, out, yb))
        if s.scheduler is not None and (step + 1) % (len(s.x) // s.batch_size) == 0:
            s.scheduler.step()  # per epoch
        if step % 10 == 9:
            evaluate(s, mon)


def classifier(model: nn.Module, data=None, lr: float = 1e-2, opt: str = "adam", **fields) -> Setup:
    x, y, xv, yv = data if data is not None else split(*blobs())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr) if opt == "adam" else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return Setup(model, optimizer, fields.pop("loss_fn", nn.CrossEntropyLoss()), x, y, xv, yv, **fields)


def regressor(model: nn.Module, data=None, lr: float = 1e-2, **fields) -> Setup:
    x, y, xv, yv = data if data is not None else split(*regression())
    return Setup(model, torch.optim.Adam(model.parameters(), lr=lr), fields.pop("loss_fn", nn.MSELoss()), x, y, xv, yv, classification=False, **fields)


# --------------------------------------------------------------------------- broken loops


def loop_no_zero_grad(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s):
        out = s.model(xb)
        loss = mon.loss_fn(out, yb)
        loss.backward()  # optimizer.zero_grad() forgotten
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)


def loop_accumulate_unscaled(s: Setup, mon: nndx.Monitor, k: int = 8) -> None:
    for step, xb, yb in batches(s):
        if step % k == 0:
            s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()  # should be (loss / k).backward()
        s.losses.append(loss.item())
        mon.log(loss)
        if step % k == k - 1:
            s.optimizer.step()


def loop_accumulate_scaled(s: Setup, mon: nndx.Monitor, k: int = 4) -> None:
    for step, xb, yb in batches(s):
        if step % k == 0:
            s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        (loss / k).backward()
        s.losses.append(loss.item())
        mon.log(loss)
        if step % k == k - 1:
            s.optimizer.step()


def loop_eval_in_train_mode(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s):
        s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)
        if step % 10 == 9:
            evaluate(s, mon, train_mode=True)  # model.eval() forgotten


def loop_tiny_clip(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s):
        s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(s.model.parameters(), max_norm=1e-3)
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)


def loop_healthy_clip(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s):
        s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(s.model.parameters(), max_norm=5.0)
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)
        if step % 10 == 9:
            evaluate(s, mon)


def loop_scheduler_per_batch(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s):
        s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()
        s.optimizer.step()
        s.scheduler.step()  # a per-epoch StepLR stepped every batch
        s.losses.append(loss.item())
        mon.log(loss)


def loop_one_cycle(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s):
        s.optimizer.zero_grad()
        out = s.model(xb)
        loss = mon.loss_fn(out, yb)
        loss.backward()
        s.optimizer.step()
        s.scheduler.step()  # OneCycleLR is meant to step per batch
        s.losses.append(loss.item())
        mon.log(loss, accuracy=accuracy(s, out, yb))
        if step % 10 == 9:
            evaluate(s, mon)


def loop_zeroed_batches(s: Setup, mon: nndx.Monitor) -> None:
    gen = torch.Generator().manual_seed(3)
    for step, xb, yb in batches(s):
        if torch.rand((), generator=gen) < 0.25:  # a decode error swallowed by the collate
            xb = torch.zeros_like(xb)
        s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)


def loop_unshuffled(s: Setup, mon: nndx.Monitor) -> None:
    for step, xb, yb in batches(s, shuffle=False):
        s.optimizer.zero_grad()
        loss = mon.loss_fn(s.model(xb), yb)
        loss.backward()
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)


class Recurrent(nn.Module):
    """A state carried from batch to batch (like an RNN over a long sequence)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.rec, self.out = nn.Linear(20, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x, h=None):
        h = torch.zeros(x.shape[0], 32) if h is None else h
        h = torch.tanh(self.inp(x) + self.rec(h))
        return self.out(h), h


def loop_state_not_detached(s: Setup, mon: nndx.Monitor) -> None:
    h = None
    for step, xb, yb in batches(s):
        s.optimizer.zero_grad()
        out, h = s.model(xb, h)  # h should be h.detach()
        loss = mon.loss_fn(out, yb)
        loss.backward()
        s.optimizer.step()
        s.losses.append(loss.item())
        mon.log(loss)


# --------------------------------------------------------------------------- broken models and losses


class DetachedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.body(x).detach())  # "only train the head for now"


class InplaceSigmoid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(20, 64), nn.Linear(64, 4)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        h *= 2.0  # in place on a tensor sigmoid saved for backward
        return self.fc2(h)


class ScaledLogits(nn.Module):
    """An MLP whose logits are multiplied by a "temperature" of 1000 by mistake."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return self.net(x) * 1000.0


class NaiveSoftmax(nn.Module):
    def forward(self, x):
        e = torch.exp(x)  # no max subtraction
        return e / e.sum(dim=1, keepdim=True)


class ScaleBy(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Standardize(nn.Module):
    def forward(self, x):
        return (x - x.mean(0)) / x.std(0)  # no eps: a constant feature gives 0/0


class WrongGradLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return grad_out @ weight, 0.5 * grad_out.t() @ x, grad_out.sum(0)  # weight grad halved


class CustomLinear(nn.Linear):
    def forward(self, x):
        return WrongGradLinear.apply(x, self.weight, self.bias)


class SmallCNN(nn.Module):
    def __init__(self, flat: int = 16 * 4 * 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(flat, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x.view(-1, 1, 8, 8)))))
        return self.fc(self.drop(torch.flatten(x, 1)))


def nll_of_softmax(out, y):
    """The loss written out by hand: log of the softmax probability, unclamped."""
    probs = torch.softmax(out, dim=1)
    return -torch.log(probs[torch.arange(len(y)), y]).mean()


def deep(layers: int, act: type[nn.Module], width: int = 64, init_std: float | None = None, outputs: int = 4) -> nn.Sequential:
    mods: list[nn.Module] = [nn.Linear(20, width), act()]
    for _ in range(layers - 2):
        mods += [nn.Linear(width, width), act()]
    mods.append(nn.Linear(width, outputs))
    model = nn.Sequential(*mods)
    if init_std is not None:
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=init_std)
    return model


# --------------------------------------------------------------------------- the cases


def case_lr_10():
    return classifier(mlp(), lr=10.0, opt="sgd")


def case_adam_lr_1():
    return classifier(mlp(), lr=1.0)


def case_lr_too_low():
    return classifier(mlp(), lr=1e-6, opt="sgd")


def case_no_zero_grad():
    return classifier(mlp(), lr=0.05, opt="sgd", loop=loop_no_zero_grad)


def case_accum_unscaled():
    return classifier(mlp(), lr=0.5, opt="sgd", loop=loop_accumulate_unscaled, steps=160, batch_size=16)


def case_optimizer_stale_model():
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model = mlp()  # re-created after the optimizer (e.g. a reload), which holds the old one
    x, y, xv, yv = split(*blobs())
    return Setup(model, optimizer, nn.CrossEntropyLoss(), x, y, xv, yv)


def case_optimizer_missing_head():
    model = mlp()
    setup = classifier(model)
    setup.optimizer = torch.optim.Adam(model[:4].parameters(), lr=1e-2)  # the head was left out
    return setup


def case_detached_body():
    return classifier(DetachedHead())


def case_all_frozen():
    model = mlp()
    model[4] = nn.Linear(64, 4)  # new head for "fine-tuning"
    for p in model.parameters():  # meant: freeze the backbone only
        p.requires_grad = False
    return classifier(model)


def case_eval_in_train_mode():
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
    return classifier(model, loop=loop_eval_in_train_mode)


def case_scheduler_per_batch():
    setup = classifier(mlp(), lr=0.05, opt="sgd", loop=loop_scheduler_per_batch)
    setup.scheduler = torch.optim.lr_scheduler.StepLR(setup.optimizer, step_size=10, gamma=0.1)
    return setup


def case_clip_too_small():
    return classifier(mlp(), lr=0.05, opt="sgd", loop=loop_tiny_clip)


def case_mse_on_one_hot():
    x, y, xv, yv = split(*blobs())
    return classifier(mlp(), data=(x, F.one_hot(y, 4).float(), xv, F.one_hot(yv, 4).float()), loss_fn=nn.MSELoss())


def case_softmax_before_ce():
    return classifier(nn.Sequential(*mlp(), nn.Softmax(dim=1)))


def case_nll_on_probabilities():
    return classifier(nn.Sequential(*mlp(), nn.Softmax(dim=1)), loss_fn=nn.NLLLoss())


def case_shape_broadcast():
    x, y, xv, yv = split(*regression())
    return regressor(mlp(8, 1), data=(x, y.squeeze(1), xv, yv.squeeze(1)))


def case_float_labels_to_ce():
    x, y, xv, yv = split(*blobs())
    return classifier(mlp(), data=(x, y.float(), xv, yv.float()))


def case_relu_on_logits():
    return classifier(nn.Sequential(*mlp(), nn.ReLU()))


def case_sigmoid_on_regression():
    return regressor(nn.Sequential(*mlp(8, 1), nn.Sigmoid()))


def case_no_activation():
    model = nn.Sequential(nn.Linear(2, 64), nn.Linear(64, 64), nn.Linear(64, 3))
    return classifier(model, data=split(*rings()))


def case_narrow_model():
    model = nn.Sequential(nn.Linear(2, 1), nn.ReLU(), nn.Linear(1, 3))
    return classifier(model, data=split(*rings()))


def case_dead_relu_bias():
    model = mlp()
    nn.init.constant_(model[0].bias, -5.0)
    return classifier(model, lr=0.05, opt="sgd")


def case_saturated_tanh():
    return classifier(deep(4, nn.Tanh, init_std=1.0), lr=1e-3)


def case_vanishing_sigmoid():
    return classifier(deep(12, nn.Sigmoid), lr=1e-2, opt="sgd")


def case_zero_init():
    model = mlp()
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)
    return classifier(model, lr=0.05, opt="sgd")


def case_init_too_large():
    return classifier(deep(8, nn.ReLU, init_std=1.0), lr=1e-3)


def case_raw_pixels():
    return classifier(mlp(64, 10), data=split(*digits(raw=True), n_val=300), lr=1e-3)


def case_unnormalized_targets():
    x, y, xv, yv = split(*regression())
    return regressor(mlp(8, 1), data=(x, y * 1000 + 5000, xv, yv * 1000 + 5000))


def case_nan_in_inputs():
    x, y, xv, yv = split(*blobs())
    x = x.clone()
    x[37, 3] = float("nan")  # one missing value in the CSV
    return classifier(mlp(), data=(x, y, xv, yv))


def case_leaked_validation():
    x, y, xv, yv = split(*blobs(spread=0.6))
    return classifier(mlp(), data=(x, y, x[:128], y[:128]))  # validated on training rows


def case_duplicated_rows():
    x, y, xv, yv = split(*blobs())
    x, y = torch.cat([x[:128]] * 4), torch.cat([y[:128]] * 4)  # oversampled by concatenation
    return classifier(mlp(), data=(x, y, xv, yv))


def case_class_imbalance():
    x, y = blobs(n=2000, classes=2, spread=0.5)
    keep = (y == 0) | (torch.arange(len(y)) % 20 == 0)
    x, y = x[keep], y[keep]
    return classifier(mlp(20, 2), data=split(x, y))


def case_labels_shuffled_separately():
    x, y, xv, yv = split(*blobs())
    gen = torch.Generator().manual_seed(5)
    return classifier(mlp(), data=(x, y[torch.randperm(len(y), generator=gen)], xv, yv))


def case_labels_collapsed():
    x, y, xv, yv = split(*blobs())
    collapse = lambda t: (t.float() / t.max()).long()  # noqa: E731 - "normalised" the labels
    return classifier(mlp(), data=(x, collapse(y), xv, collapse(yv)))


def case_sorted_by_class():
    x, y, xv, yv = split(*blobs())
    order = torch.argsort(y, stable=True)
    return classifier(mlp(), data=(x[order], y[order], xv, yv), loop=loop_unshuffled)


def case_zeroed_batches():
    return classifier(mlp(), loop=loop_zeroed_batches)


def case_log_of_zero():
    return classifier(ScaledLogits(), loss_fn=nll_of_softmax)


def case_naive_softmax():
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4), ScaleBy(500.0), NaiveSoftmax())
    return classifier(model, loss_fn=lambda p, y: F.nll_loss(torch.log(p), y))


def case_division_by_zero():
    x, y, xv, yv = split(*blobs())
    x, xv = x.clone(), xv.clone()
    x[:, 5] = 0.0  # a sensor that never fired
    xv[:, 5] = 0.0
    return classifier(nn.Sequential(Standardize(), *mlp()), data=(x, y, xv, yv))


def case_wrong_custom_backward():
    model = nn.Sequential(CustomLinear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    return classifier(model)


def case_inplace_op():
    return classifier(InplaceSigmoid())


def case_state_not_detached():
    return classifier(Recurrent(), loop=loop_state_not_detached, loss_fn=nn.CrossEntropyLoss())


def case_wrong_flatten():
    return classifier(SmallCNN(flat=16 * 3 * 3), data=split(*digits(), n_val=300))


def case_overfitting():
    x, y, xv, yv = split(*digits(), n_val=400)
    gen = torch.Generator().manual_seed(2)
    noisy = y[:48].clone()
    flip = torch.rand(48, generator=gen) < 0.3
    noisy[flip] = torch.randint(0, 10, (int(flip.sum()),), generator=gen)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return classifier(model, data=(x[:48], noisy, xv, yv), lr=3e-3, steps=300, batch_size=48)


def case_batch_of_two():
    return classifier(mlp(), lr=0.1, opt="sgd", batch_size=2, steps=160)


def case_constant_lr_plateau():
    x, y = regression(n=6000)
    model = mlp(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # constant: fine early, too big to settle
    return Setup(model, optimizer, nn.MSELoss(), *split(x, y, n_val=500), classification=False, steps=300, batch_size=16)


# healthy runs


def healthy_mlp():
    return classifier(mlp(), lr=1e-3, steps=120)


def healthy_sgd_momentum():
    return classifier(mlp(), lr=0.05, opt="sgd", steps=120)


def healthy_cnn_dropout_bn():
    return classifier(SmallCNN(), data=split(*digits(), n_val=300), lr=3e-3, steps=120)


def healthy_regression():
    return regressor(mlp(8, 1), lr=3e-3, steps=120)


def healthy_accumulation():
    return classifier(mlp(), lr=0.05, opt="sgd", loop=loop_accumulate_scaled, steps=160, batch_size=16)


def healthy_frozen_backbone():
    x, y, xv, yv = split(*blobs())
    backbone = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    pretrain = nn.Sequential(backbone, nn.Linear(64, 4))
    optimizer = torch.optim.Adam(pretrain.parameters(), lr=1e-2)
    for _ in range(60):  # "pretrained" elsewhere
        optimizer.zero_grad()
        F.cross_entropy(pretrain(x), y).backward()
        optimizer.step()
    backbone.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    return Setup(model, torch.optim.Adam(model[1].parameters(), lr=1e-2), nn.CrossEntropyLoss(), x, y, xv, yv, steps=100)


def healthy_one_cycle():
    setup = classifier(mlp(), lr=0.1, opt="sgd", loop=loop_one_cycle, steps=160)
    setup.scheduler = torch.optim.lr_scheduler.OneCycleLR(setup.optimizer, max_lr=0.1, total_steps=160)
    return setup


def healthy_noisy_task():
    x, y = blobs(n=6000, classes=2, spread=0.35)
    gen = torch.Generator().manual_seed(4)
    flip = torch.rand(len(y), generator=gen) < 0.2  # a fifth of the labels are wrong: the loss floor is high
    y = torch.where(flip, 1 - y, y)
    return classifier(mlp(20, 2), data=split(x, y, n_val=500), lr=3e-3, steps=200)


def healthy_clipped():
    return classifier(mlp(), lr=0.05, opt="sgd", loop=loop_healthy_clip, steps=120)


BROKEN: tuple[tuple[str, C, Callable[[], Setup]], ...] = (
    ("lr_10", C.LR_TOO_HIGH, case_lr_10),
    ("adam_lr_1", C.LR_TOO_HIGH, case_adam_lr_1),
    ("lr_too_low", C.LR_TOO_LOW, case_lr_too_low),
    ("constant_lr_plateau", C.NO_LR_SCHEDULE, case_constant_lr_plateau),
    ("scheduler_per_batch", C.LR_SCHEDULE_MISUSE, case_scheduler_per_batch),
    ("clip_too_small", C.GRAD_CLIP_TOO_SMALL, case_clip_too_small),
    ("accum_unscaled", C.GRAD_ACCUM_SCALING, case_accum_unscaled),
    ("dead_relu_bias", C.DEAD_RELU, case_dead_relu_bias),
    ("vanishing_sigmoid", C.VANISHING_GRADIENTS, case_vanishing_sigmoid),
    ("saturated_tanh", C.SATURATED_ACTIVATIONS, case_saturated_tanh),
    ("zero_init", C.BAD_INIT, case_zero_init),
    ("init_too_large", C.BAD_INIT, case_init_too_large),
    ("no_activation", C.MISSING_ACTIVATION, case_no_activation),
    ("relu_on_logits", C.WRONG_OUTPUT_ACTIVATION, case_relu_on_logits),
    ("sigmoid_on_regression", C.WRONG_OUTPUT_ACTIVATION, case_sigmoid_on_regression),
    ("mse_on_one_hot", C.WRONG_LOSS, case_mse_on_one_hot),
    ("nll_on_probabilities", C.WRONG_LOSS, case_nll_on_probabilities),
    ("softmax_before_ce", C.DOUBLE_SOFTMAX, case_softmax_before_ce),
    ("no_zero_grad", C.MISSING_ZERO_GRAD, case_no_zero_grad),
    ("optimizer_stale_model", C.OPTIMIZER_NOT_CONNECTED, case_optimizer_stale_model),
    ("optimizer_missing_head", C.OPTIMIZER_NOT_CONNECTED, case_optimizer_missing_head),
    ("detached_body", C.DETACHED_GRAPH, case_detached_body),
    ("all_frozen", C.FROZEN_PARAMETERS, case_all_frozen),
    ("eval_in_train_mode", C.EVAL_MODE_FORGOTTEN, case_eval_in_train_mode),
    ("raw_pixels", C.UNNORMALIZED_INPUTS, case_raw_pixels),
    ("unnormalized_targets", C.UNNORMALIZED_TARGETS, case_unnormalized_targets),
    ("labels_shuffled_separately", C.LABELS_MISALIGNED, case_labels_shuffled_separately),
    ("labels_collapsed", C.LABEL_NOISE, case_labels_collapsed),
    ("float_labels_to_ce", C.LABEL_DTYPE, case_float_labels_to_ce),
    ("shape_broadcast", C.SHAPE_BROADCAST, case_shape_broadcast),
    ("wrong_flatten", C.WRONG_RESHAPE, case_wrong_flatten),
    ("sorted_by_class", C.UNSHUFFLED_DATA, case_sorted_by_class),
    ("zeroed_batches", C.SILENT_DATA_LOSS, case_zeroed_batches),
    ("log_of_zero", C.LOG_OF_ZERO, case_log_of_zero),
    ("division_by_zero", C.DIVISION_BY_ZERO, case_division_by_zero),
    ("naive_softmax", C.NUMERICAL_OVERFLOW, case_naive_softmax),
    ("nan_in_inputs", C.NAN_IN_DATA, case_nan_in_inputs),
    ("overfitting", C.OVERFITTING, case_overfitting),
    ("narrow_model", C.UNDERFITTING, case_narrow_model),
    ("leaked_validation", C.DATA_LEAKAGE, case_leaked_validation),
    ("duplicated_rows", C.DUPLICATE_SAMPLES, case_duplicated_rows),
    ("class_imbalance", C.CLASS_IMBALANCE, case_class_imbalance),
    ("batch_of_two", C.BATCH_TOO_SMALL, case_batch_of_two),
    ("wrong_custom_backward", C.BROKEN_BACKWARD, case_wrong_custom_backward),
    ("inplace_op", C.INPLACE_AUTOGRAD, case_inplace_op),
    ("state_not_detached", C.GRAPH_RETAINED, case_state_not_detached),
)

HEALTHY: tuple[tuple[str, Callable[[], Setup]], ...] = (
    ("mlp_adam", healthy_mlp),
    ("mlp_sgd_momentum", healthy_sgd_momentum),
    ("cnn_dropout_batchnorm", healthy_cnn_dropout_bn),
    ("regression", healthy_regression),
    ("accumulation", healthy_accumulation),
    ("frozen_backbone", healthy_frozen_backbone),
    ("one_cycle_per_batch", healthy_one_cycle),
    ("noisy_task_plateau", healthy_noisy_task),
    ("healthy_clipping", healthy_clipped),
)

# --------------------------------------------------------------------------- the pipeline


def lesson_messages(losses: list[float], debugger: NetworkDebugger) -> list[tuple[str, C]]:
    """The lesson's verdicts in the order it prints them, each mapped to the cause it names."""
    messages: list[tuple[str, C]] = []
    if any(not math.isfinite(v) for v in losses):
        messages.append(("loss is NaN/Inf: lower the learning rate", C.LR_TOO_HIGH))
    recent = [v for v in losses[-10:] if math.isfinite(v)]
    if len(recent) >= 10:
        if max(recent) - min(recent) < 1e-3:
            messages.append(("loss not decreasing: check the learning rate", C.LR_TOO_LOW))
        diffs = [b - a for a, b in zip(recent, recent[1:])]
        changes = sum(1 for a, b in zip(diffs, diffs[1:]) if a * b < 0)
        if changes > len(diffs) / 2:
            messages.append(("loss oscillating: lower the learning rate", C.LR_TOO_HIGH))
    codes = {"dead ReLUs": C.DEAD_RELU, "vanishing": C.VANISHING_GRADIENTS, "exploding": C.EXPLODING_GRADIENTS}
    for text in debugger.check_health():
        messages.append((text, next(code for key, code in codes.items() if key in text)))
    return messages



CASES: dict[str, tuple[C | None, Callable[[], Setup]]] = {
    **{name: (code, build) for name, code, build in BROKEN},
    **{f"healthy_{name}": (None, build) for name, build in HEALTHY},
}


def run_case(name: str) -> dict[str, Any]:
    """One hand-written case through Monitor + probe + diagnose, as a benchmark record."""
    with time_limit(CASE_TIMEOUT_S):
        return _run_case(name)


def _run_case(name: str) -> dict[str, Any]:
    expected, build = CASES[name]
    started = time.perf_counter()
    torch.manual_seed(SEED)
    s = build()
    loop = s.loop or standard_loop
    mon = nndx.Monitor(s.model, s.optimizer, every=5, loss_fn=s.loss_fn, name=name)
    debugger = NetworkDebugger(s.model).register_hooks()
    crash = None
    try:
        loop(s, mon)
    except Exception as exc:  # noqa: BLE001 - the user's loop crashing is part of the case
        crash = ErrorRecord(source="training", type=type(exc).__name__, message=str(exc)[:2000])
    finally:
        mon.close()
        debugger.close()
    report = nndx.probe(s.model, (s.x[:64], s.y[:64]), s.loss_fn, optimizer=s.optimizer, monitor=mon,
                        data=(s.x, s.y, s.x_val, s.y_val), overfit_one_batch={"steps": 150}, lr_range={"steps": 50})  # fmt: skip
    if crash is not None:
        report.errors.append(crash)
    result = StyleResult(report=report, diagnosis=nndx.diagnose(report))
    lesson = lesson_messages(s.losses, debugger) if crash is None else []
    accepted = (expected.value,) if expected is not None else ()
    record: dict[str, Any] = {
        "id": f"{name}/handwritten/wrapped/s{SEED}", "kind": "broken" if expected else "healthy",
        "item": name, "family": "handwritten", "half": "handwritten", "style": "wrapped", "seed": SEED,
        "expected": accepted[0] if accepted else None, "accepted": list(accepted),
        "twin": None, "lesson_top3": [code.value for _, code in lesson[:3]],
    }  # fmt: skip
    score(record, result, accepted, plain_crash=crash.message if crash else None)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record

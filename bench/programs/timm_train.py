"""Port of huggingface/pytorch-image-models ``train.py``: a classifier trained with Mixup/CutMix
soft targets, ``SoftTargetCrossEntropy``, AdamW, a per-update cosine schedule with warmup and
a model EMA that is evaluated alongside the model.

Source: github.com/huggingface/pytorch-image-models, ``train.py`` (``train_one_epoch``,
``validate``, the main loop), ``timm/data/mixup.py`` (``Mixup``, ``mixup_target``,
``rand_bbox``, ``cutmix_bbox_and_lam``), ``timm/loss/cross_entropy.py``
(``SoftTargetCrossEntropy``), ``timm/utils/model_ema.py`` (``ModelEmaV3``),
``timm/scheduler/cosine_lr.py`` and ``timm/scheduler/scheduler.py`` (``CosineLRScheduler``,
``step_update``) and ``timm/optim`` (``param_groups_weight_decay``) at commit
aa4b5850c1543fa488abf260f18390eda46cf85d (Apache-2.0, Copyright 2019 Ross Wightman).
Written anew from the facts of those files, without timm; no code copied.

Kept: ``Mixup(mixup_alpha, cutmix_alpha, prob=1.0, switch_prob=0.5, mode='batch',
correct_lam=True, label_smoothing=0.1, num_classes)``: per batch one ``lam`` from
``np.random.beta``, CutMix or mixup chosen with ``switch_prob``, CutMix's box from
``rand_bbox`` (side ``sqrt(1 - lam)``, centre uniform, clipped) with ``lam`` corrected to the
box's area, the batch mixed in place with its flip along the batch (``x.flip(0)``), the
targets made by ``mixup_target``: smoothed one-hot (off ``smoothing / num_classes``, on
``1 - smoothing + off``) of ``target`` and of ``target.flip(0)``, ``lam``-weighted;
``SoftTargetCrossEntropy``: ``sum(-target * log_softmax(x), -1).mean()`` as the train
loss and ``nn.CrossEntropyLoss()`` as the validate loss; ``adamw`` with weight decay only on
the parameters of more than one dimension (biases and norm weights in a no-decay group);
``CosineLRScheduler(t_initial=epochs * updates_per_epoch, lr_min=0, warmup_t=warmup_epochs *
updates_per_epoch, warmup_lr_init=1e-5, t_in_epochs=False)`` (``--sched-on-updates``):
the LR set to ``warmup_lr_init`` on construction, linear warmup, then half-cosine, moved by
``lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)`` after each
update; ``ModelEmaV3(model, decay)``: a deep copy, ``update(model, step=num_updates)``
lerping parameters and buffers toward the model's after each optimizer step; per epoch
``train_one_epoch`` (``model.train()``, mixup, forward, loss, ``zero_grad`` / ``backward`` /
``step``, ``num_updates += 1``, EMA update, ``step_update``) then ``validate`` of the model
and of the EMA (``eval()``, ``no_grad``, CE loss and top-1/top-5), and
``lr_scheduler.step(epoch + 1)`` (a no-op for an update-based schedule).
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 val) at 8x8, one channel,
standardised, instead of ImageNet; a ResNet-ish CNN (3x3 stem of 16, BasicBlocks of 16,
32 (stride 2), 64 (stride 2), global average pool, linear) instead of a timm model; batch
64 (drop_last), 10 epochs with 2 warmup epochs (220 updates) instead of 300 epochs; lr 2e-3, weight decay
0.05, mixup 0.8 / cutmix 1.0 (a DeiT-style recipe's values); EMA decay 0.99 instead of
0.9998 (220 updates, not ~375,000); no AMP, no channels_last, no distributed, no
checkpoints.
Measure only: the EMA model's val top-1 and val loss after the last epoch (as ``validate``
reports them).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
after ``mixup_fn`` (images and soft targets) with ``train_loss_fn``, the optimizer and the
data splits; ``nndx.Monitor`` around the epochs with ``train_loss_fn`` called as
``mon.loss_fn``, each update's loss logged, the model's val loss and top-1 logged as
``split="val"`` after each epoch; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "timm_train"
SOURCE = Source("huggingface/pytorch-image-models", "train.py", "aa4b5850c1543fa488abf260f18390eda46cf85d",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "train.py with --mixup 0.8 --cutmix 1.0 --model-ema --sched-on-updates, AdamW"),
        Variant(
            "sched_t_in_epochs",
            "CosineLRScheduler built with its default t_in_epochs=True while t_initial and warmup_t are counted "
            "in updates: step_update(num_updates) is a no-op for an epoch-based schedule and only the main "
            "loop's step(epoch + 1) moves it, one warmup update per epoch: the LR crawls from 1e-5 to 4.6e-4 "
            "(of 2e-3) over the run and never decays",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/huggingface/pytorch-image-models/issues/2125",
             "https://github.com/facebookresearch/ParlAI/pull/4384", "https://github.com/sthalles/SimCLR/issues/8"),
            Measure("ema_val_acc", "final EMA val top-1 at least 0.05 below the healthy run's: 0.822 against "
                    "0.931 healthy on seed 0 (EMA val loss 1.89 against 1.18)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "mixup_partner_mismatch",
            "the images are mixed with a torch.randperm partner (the mixup-cifar10 idiom) while mixup_target still "
            "pairs each target with target.flip(0): the (1 - lam) share of every soft target names another "
            "image's class than the one mixed in",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/xudonmao/VMT/issues/1", "https://github.com/leehomyc/mixup_pytorch/issues/3",
             "https://github.com/TakuyaFujimura/dcase-asd-toolkit/pull/16"),
            Measure("ema_val_loss", "final EMA val cross-entropy 1.15x the healthy run's or more: 1.52 against "
                    "1.18 healthy on seed 0 (EMA top-1 0.914 against 0.931: the digits stay easy to tell apart; "
                    "the model's own val loss 0.64 against 0.23)", lambda healthy, buggy: not buggy < 1.15 * healthy),
        ),
    )
}

ARGS = dict(batch_size=64, epochs=10, warmup_epochs=2, lr=2e-3, warmup_lr=1e-5, min_lr=0.0, weight_decay=0.05,
            mixup=0.8, cutmix=1.0, mixup_prob=1.0, mixup_switch_prob=0.5, smoothing=0.1, model_ema_decay=0.99,
            num_classes=10, log_interval=10)  # fmt: skip
SIDE = 8


# --------------------------------------------------------------------------- timm/data/mixup.py


def one_hot(x: torch.Tensor, num_classes: int, on_value: float = 1.0, off_value: float = 0.0) -> torch.Tensor:
    return torch.full((x.size(0), num_classes), off_value).scatter_(1, x.long().view(-1, 1), on_value)


def mixup_target(target: torch.Tensor, num_classes: int, lam: float = 1.0, smoothing: float = 0.0) -> torch.Tensor:
    off_value = smoothing / num_classes
    on_value = 1.0 - smoothing + off_value
    y1 = one_hot(target, num_classes, on_value, off_value)
    y2 = one_hot(target.flip(0), num_classes, on_value, off_value)
    return y1 * lam + y2 * (1.0 - lam)


def rand_bbox(img_shape, lam: float):
    ratio = np.sqrt(1 - lam)
    img_h, img_w = img_shape[-2:]
    cut_h, cut_w = int(img_h * ratio), int(img_w * ratio)
    cy, cx = np.random.randint(0, img_h), np.random.randint(0, img_w)
    yl, yh = np.clip(cy - cut_h // 2, 0, img_h), np.clip(cy + cut_h // 2, 0, img_h)
    xl, xh = np.clip(cx - cut_w // 2, 0, img_w), np.clip(cx + cut_w // 2, 0, img_w)
    return yl, yh, xl, xh


def cutmix_bbox_and_lam(img_shape, lam: float, correct_lam: bool = True):
    yl, yu, xl, xu = rand_bbox(img_shape, lam)
    if correct_lam:
        lam = 1.0 - (yu - yl) * (xu - xl) / float(img_shape[-2] * img_shape[-1])
    return (yl, yu, xl, xu), lam


class Mixup:
    """``mode='batch'`` only: one lam and one choice (mixup or CutMix) per batch."""

    def __init__(self, mixup_alpha=1.0, cutmix_alpha=0.0, prob=1.0, switch_prob=0.5, correct_lam=True,
                 label_smoothing=0.1, num_classes=1000, partner="flip") -> None:  # fmt: skip
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.mix_prob, self.switch_prob, self.correct_lam = prob, switch_prob, correct_lam
        self.label_smoothing, self.num_classes = label_smoothing, num_classes
        self.mixup_enabled = True
        self.partner = partner  # "flip" (timm) or "randperm" (the bug)

    def _params_per_batch(self):
        lam, use_cutmix = 1.0, False
        if self.mixup_enabled and np.random.rand() < self.mix_prob:
            if self.mixup_alpha > 0.0 and self.cutmix_alpha > 0.0:
                use_cutmix = np.random.rand() < self.switch_prob
                lam_mix = (np.random.beta(self.cutmix_alpha, self.cutmix_alpha) if use_cutmix
                           else np.random.beta(self.mixup_alpha, self.mixup_alpha))  # fmt: skip
            elif self.mixup_alpha > 0.0:
                lam_mix = np.random.beta(self.mixup_alpha, self.mixup_alpha)
            else:
                use_cutmix = True
                lam_mix = np.random.beta(self.cutmix_alpha, self.cutmix_alpha)
            lam = float(lam_mix)
        return lam, use_cutmix

    def _mix_batch(self, x: torch.Tensor) -> float:
        lam, use_cutmix = self._params_per_batch()
        if lam == 1.0:
            return 1.0
        other = x.flip(0) if self.partner == "flip" else x[torch.randperm(len(x))]
        if use_cutmix:
            (yl, yh, xl, xh), lam = cutmix_bbox_and_lam(x.shape, lam, correct_lam=self.correct_lam)
            x[:, :, yl:yh, xl:xh] = other[:, :, yl:yh, xl:xh]
        else:
            x.mul_(lam).add_(other.mul(1.0 - lam))
        return lam

    def __call__(self, x: torch.Tensor, target: torch.Tensor):
        assert len(x) % 2 == 0, "Batch size should be even when using this"
        lam = self._mix_batch(x)
        return x, mixup_target(target, self.num_classes, lam, self.label_smoothing)


# --------------------------------------------------------------------------- loss, EMA, scheduler


class SoftTargetCrossEntropy(nn.Module):
    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.sum(-target * F.log_softmax(x, dim=-1), dim=-1).mean()


class ModelEmaV3(nn.Module):
    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model: nn.Module, step: int | None = None) -> None:
        ema_state, model_state = self.module.state_dict(), model.state_dict()
        for name, ema_v in ema_state.items():
            model_v = model_state[name]
            if ema_v.is_floating_point():
                ema_v.lerp_(model_v, weight=1.0 - self.decay)
            else:
                ema_v.copy_(model_v)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class CosineLRScheduler:
    """timm's ``Scheduler`` + ``CosineLRScheduler`` (one cycle, no noise, k_decay 1)."""

    def __init__(self, optimizer, t_initial: int, lr_min: float = 0.0, warmup_t: int = 0,
                 warmup_lr_init: float = 0.0, t_in_epochs: bool = True) -> None:  # fmt: skip
        self.optimizer, self.t_initial, self.lr_min = optimizer, t_initial, lr_min
        self.warmup_t, self.warmup_lr_init, self.t_in_epochs = warmup_t, warmup_lr_init, t_in_epochs
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_values = [group["initial_lr"] for group in optimizer.param_groups]
        if self.warmup_t:
            self.warmup_steps = [(v - warmup_lr_init) / self.warmup_t for v in self.base_values]
            self._update_groups([self.warmup_lr_init] * len(self.base_values))
        else:
            self.warmup_steps = [1 for _ in self.base_values]

    def _get_lr(self, t: int) -> list[float]:
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * s for s in self.warmup_steps]
        i, t_curr = t // self.t_initial, t - self.t_initial * (t // self.t_initial)
        if i < 1:
            return [self.lr_min + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * t_curr / self.t_initial))
                    for v in self.base_values]  # fmt: skip
        return [self.lr_min for _ in self.base_values]

    def _get_values(self, t: int, on_epoch: bool = True):
        proceed = (on_epoch and self.t_in_epochs) or (not on_epoch and not self.t_in_epochs)
        return self._get_lr(t) if proceed else None

    def step(self, epoch: int, metric: float | None = None) -> None:
        values = self._get_values(epoch, on_epoch=True)
        if values is not None:
            self._update_groups(values)

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        values = self._get_values(num_updates, on_epoch=False)
        if values is not None:
            self._update_groups(values)

    def _update_groups(self, values: list[float]) -> None:
        for group, value in zip(self.optimizer.param_groups, values):
            group["lr"] = value


def param_groups_weight_decay(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


# --------------------------------------------------------------------------- the model


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act(self.bn1(self.conv1(x)))
        return self.act(self.bn2(self.conv2(x)) + shortcut)


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.layers = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(x.mean((2, 3)))


# --------------------------------------------------------------------------- train.py


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[float]:
    maxk = min(max(topk), output.size(1))
    _, pred = output.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.reshape(1, -1).expand(maxk, -1))
    return [correct[: min(k, maxk)].reshape(-1).float().sum(0).item() * 100.0 / target.size(0) for k in topk]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, y_train, val_raw, y_val = data.digit_images(seed=seed)
    x_train, x_val = data.upscaled(train_raw, SIDE), data.upscaled(val_raw, SIDE)
    mean, std = x_train.mean(), x_train.std()
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std

    model = SmallResNet(args["num_classes"])
    optimizer = torch.optim.AdamW(param_groups_weight_decay(model, args["weight_decay"]), lr=args["lr"])
    model_ema = ModelEmaV3(model, decay=args["model_ema_decay"])
    mixup_fn = Mixup(mixup_alpha=args["mixup"], cutmix_alpha=args["cutmix"], prob=args["mixup_prob"],
                     switch_prob=args["mixup_switch_prob"], label_smoothing=args["smoothing"],
                     num_classes=args["num_classes"],
                     partner="randperm" if variant == "mixup_partner_mismatch" else "flip")  # fmt: skip
    train_loss_fn, validate_loss_fn = SoftTargetCrossEntropy(), nn.CrossEntropyLoss()

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train),
                                         batch_size=args["batch_size"], shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))  # fmt: skip
    loader_eval = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_val, y_val), batch_size=128)
    updates_per_epoch = len(loader)
    lr_scheduler = CosineLRScheduler(
        optimizer, t_initial=args["epochs"] * updates_per_epoch, lr_min=args["min_lr"],
        warmup_t=args["warmup_epochs"] * updates_per_epoch, warmup_lr_init=args["warmup_lr"],
        t_in_epochs=variant == "sched_t_in_epochs",
    )  # fmt: skip

    probe_x, probe_y = mixup_fn(x_train[: args["batch_size"]].clone(), y_train[: args["batch_size"]])
    first_batch = (probe_x, probe_y)
    splits = (x_train, y_train, x_val, y_val)
    nx.preflight(model, first_batch, train_loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=train_loss_fn)

    log: list[str] = []

    def train_one_epoch(epoch: int) -> float:
        model.train()
        num_updates = epoch * updates_per_epoch
        losses = []
        for batch_idx, (input, target) in enumerate(loader):
            input, target = mixup_fn(input.clone(), target)
            output = model(input)
            loss = mon.loss_fn(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            num_updates += 1
            model_ema.update(model, step=num_updates)
            mon.log(loss)
            if batch_idx % args["log_interval"] == 0:
                log.append(f"Train: {epoch} [{batch_idx}/{updates_per_epoch}] Loss: {loss.item():.3g} "
                           f"LR: {optimizer.param_groups[0]['lr']:.3e}")  # fmt: skip
            lr_scheduler.step_update(num_updates=num_updates, metric=float(np.mean(losses)))
        return float(np.mean(losses))

    def validate(net: nn.Module) -> tuple[float, float]:
        net.eval()
        total_loss, top1, n = 0.0, 0.0, 0
        with torch.no_grad():
            for input, target in loader_eval:
                output = net(input)
                total_loss += validate_loss_fn(output, target).item() * input.size(0)
                top1 += accuracy(output, target)[0] * input.size(0)
                n += input.size(0)
        return total_loss / n, top1 / n / 100.0

    train_loss = val_loss = val_acc = ema_loss = ema_acc = float("nan")
    for epoch in range(args["epochs"]):
        train_loss = train_one_epoch(epoch)
        val_loss, val_acc = validate(model)
        ema_loss, ema_acc = validate(model_ema.module)
        mon.log(val_loss, split="val", accuracy=val_acc)
        lr_scheduler.step(epoch + 1, ema_loss)

    nx.finish(mon, model, first_batch, train_loss_fn, optimizer=optimizer, data=splits)
    return {"ema_val_acc": ema_acc, "ema_val_loss": ema_loss, "val_acc": val_acc, "val_loss": val_loss,
            "train_loss": train_loss, "final_lr": optimizer.param_groups[1]["lr"]}  # fmt: skip

"""From a Spec to a running training script: build the model, loss, optimizer and data,
and run the user's loop — a plain torch loop, a loop with hand-written parameter
updates, or a Lightning module — optionally watched by an nndx Monitor.

The loops read the spec's knobs the way a user's code is written (``if spec.zero_grad:
optimizer.zero_grad()``); nndx sees an ordinary loop. Every run also returns an
:class:`Outcome` measured by the harness, independently of nndx, for the buggy/fixed
twin check: the final validation quality against the true labels, the reference loss,
non-finite values, a crash, and the growth of the autograd graph.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .families import FAMILIES, Family
from .spec import Data, Spec

EVAL_EVERY = 25


@dataclass
class Built:
    spec: Spec
    family: Family
    data: Data
    model: nn.Module
    loss_fn: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None

    @property
    def batch_size(self) -> int:
        return self.spec.batch_size or self.family.batch_size

    @property
    def steps(self) -> int:
        return self.spec.steps or self.family.steps


@dataclass
class Outcome:
    """What the harness measured of one run (not nndx)."""

    crashed: str | None = None
    nonfinite: bool = False
    quality: float | None = None  # accuracy (classification), R² (regression); None for the VAE
    ref_loss: float | None = None  # the family's correct loss on the true validation labels
    initial_ref_loss: float | None = None
    train_losses: list[float] = field(default_factory=list)
    graph_nodes: list[int] = field(default_factory=list)  # autograd nodes behind the loss, first and last step

    @property
    def graph_growth(self) -> float:
        return self.graph_nodes[-1] / max(self.graph_nodes[0], 1) if len(self.graph_nodes) >= 2 else 1.0

    def summary(self) -> dict[str, Any]:
        r = lambda v: None if v is None else (v if not isinstance(v, float) or not math.isfinite(v) else round(v, 4))  # noqa: E731
        return {"crashed": self.crashed, "nonfinite": self.nonfinite, "quality": r(self.quality),
                "ref_loss": r(self.ref_loss), "initial_ref_loss": r(self.initial_ref_loss),
                "final_train_loss": r(self.train_losses[-1]) if self.train_losses else None,
                "graph_growth": round(self.graph_growth, 2)}  # fmt: skip


# --------------------------------------------------------------------------- data


@functools.lru_cache(maxsize=64)
def _base_data(family: str, seed: int, token_inputs: bool) -> Data:
    spec = Spec(family=family, seed=seed, token_inputs=token_inputs)
    data = FAMILIES[family].data(seed, spec)
    data.y_val_true = data.y_val
    return data


def load_data(spec: Spec) -> Data:
    base = _base_data(spec.family, spec.seed, spec.token_inputs)
    data = Data(base.x, base.y, base.x_val, base.y_val, base.num_classes, base.y_val_true)
    gen = torch.Generator().manual_seed(1000 * spec.seed + 11)
    for op in spec.data_ops:
        data = op(data, gen, spec)
    if spec.dtype == "float64":
        data = _to_double(data)
    return data


def _to_double(data: Data) -> Data:
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.double() if t.is_floating_point() else t

    return Data(cast(data.x), cast(data.y), cast(data.x_val), cast(data.y_val), data.num_classes, cast(data.y_val_true))


def batches(b: Built, epochs_seed: int = 1):
    """(step, x, y) like DataLoader(shuffle=spec.shuffle, drop_last=True), with the
    spec's silently zeroed batches."""
    spec, data = b.spec, b.data
    gen = torch.Generator().manual_seed(1000 * spec.seed + epochs_seed)
    corrupt = torch.Generator().manual_seed(1000 * spec.seed + 3)
    n, size = len(data.x), b.batch_size
    per_epoch = max(1, n // size)
    order = torch.arange(n)
    for step in range(b.steps):
        if step % per_epoch == 0 and spec.shuffle:
            order = torch.randperm(n, generator=gen)
        idx = order[(step % per_epoch) * size : (step % per_epoch + 1) * size]
        xb, yb = data.x[idx], data.y[idx]
        if spec.zeroed_batch_fraction and torch.rand((), generator=corrupt) < spec.zeroed_batch_fraction:
            xb = torch.zeros_like(xb)  # a decode error swallowed by the collate
        yield step, xb, yb


def first_batch(b: Built) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``next(iter(loader))`` gives the user."""
    _, xb, yb = next(batches(b))
    return xb, yb


def data_tuple(b: Built) -> tuple[torch.Tensor, ...]:
    return (b.data.x, b.data.y, b.data.x_val, b.data.y_val)


# --------------------------------------------------------------------------- losses


def mse_on_class_index(out, y):
    return F.mse_loss(out, y.float().unsqueeze(-1))  # broadcasts over the classes


def log_likelihood(out, y):
    return F.log_softmax(out, -1).gather(-1, y.unsqueeze(-1)).mean()  # the minus sign forgotten


def log_of_softmax(out, y):
    return -torch.log(torch.softmax(out, -1).gather(-1, y.unsqueeze(-1))).mean()  # log(0) when a prob underflows


def naive_softmax_nll(out, y):
    e = torch.exp(out)  # no max subtraction
    return -torch.log((e / e.sum(-1, keepdim=True)).gather(-1, y.unsqueeze(-1))).mean()


def binary_log_likelihood(out, y):
    return (y * F.logsigmoid(out) + (1 - y) * F.logsigmoid(-out)).mean()  # the minus sign forgotten


def bce_by_hand(out, y):
    p = torch.sigmoid(out)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()  # log(0) when p rounds to 1


def vae_loss(out, x):
    recon, mu, logvar = out
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (F.binary_cross_entropy_with_logits(recon, x, reduction="sum") + kl) / len(x)


def vae_loss_kl_sign(out, x):
    recon, mu, logvar = out
    kl = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())  # the KL term's sign flipped
    return (F.binary_cross_entropy_with_logits(recon, x, reduction="sum") + kl) / len(x)


def _per_token(loss: Callable) -> Callable:
    def lm_loss(logits, y):
        return loss(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    lm_loss.__name__ = f"lm_{getattr(loss, '__name__', type(loss).__name__)}"
    return lm_loss


def make_loss(spec: Spec, family: Family, data: Data) -> Callable[..., torch.Tensor]:
    """The loss the user's script calls, as written (a torch loss module or a function)."""
    if family.task == "vae":
        return vae_loss_kl_sign if spec.loss == "kl_sign" else vae_loss
    if family.task == "regression":
        return nn.MSELoss()
    if family.task == "binary":
        if spec.loss == "missing_minus":
            return binary_log_likelihood
        if spec.loss == "log_unclamped":
            return bce_by_hand
        pos_weight = None
        if spec.class_weights:
            positives = float(data.y.sum())
            pos_weight = torch.tensor([(len(data.y) - positives) / max(positives, 1.0)], dtype=data.x.dtype)
        return nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    weight = None
    if spec.class_weights:
        counts = torch.bincount(data.y.reshape(-1), minlength=data.num_classes).float().clamp(min=1)
        weight = (counts.sum() / counts / len(counts)).to(data.x.dtype if data.x.is_floating_point() else torch.float32)
    loss = {
        "default": lambda: nn.CrossEntropyLoss(weight=weight, label_smoothing=spec.label_smoothing),
        "nll": nn.NLLLoss,
        "mse_index": lambda: mse_on_class_index,
        "missing_minus": lambda: log_likelihood,
        "log_unclamped": lambda: log_of_softmax,
        "naive_softmax": lambda: naive_softmax_nll,
    }[spec.loss]()
    if family.task == "lm":
        return _per_token(loss)
    return loss


def reference(family: Family, out: Any, y: torch.Tensor) -> tuple[float | None, float]:
    """(quality, reference loss) of validation outputs against the true labels."""
    with torch.no_grad():
        if family.task == "vae":
            return None, float(vae_loss(tuple(t.float() for t in out), y.float()))
        out = out.float()
        if family.task == "regression":
            if out.shape != y.shape:
                out = out.reshape(y.shape)
            mse = float(F.mse_loss(out, y.float()))
            return 1.0 - mse / max(float(y.float().var()), 1e-12), mse
        if family.task == "binary":
            y = (y > 0).float()  # a label bug may have re-encoded them
            return float(((out > 0).float() == y).float().mean()), float(F.binary_cross_entropy_with_logits(out, y))
        logits, labels = out.reshape(-1, out.size(-1)), y.reshape(-1)
        return float((logits.argmax(-1) == labels).float().mean()), float(F.cross_entropy(logits, labels))


# --------------------------------------------------------------------------- building


def build(spec: Spec, optimizer: bool = True) -> Built:
    family = FAMILIES[spec.family]
    data = load_data(spec)
    torch.manual_seed(spec.seed)
    model = _make_model(spec, family, data)
    built = Built(spec, family, data, model, make_loss(spec, family, data))
    if optimizer:
        built.optimizer = make_optimizer(spec, family, model.parameters())
        built.scheduler = make_scheduler(spec, built, built.optimizer)
        if spec.stale_optimizer:  # re-created after the optimizer (a reload, a refactor): the optimizer holds the old one
            torch.manual_seed(spec.seed + 7)
            built.model = _make_model(spec, family, data)
    return built


def _make_model(spec: Spec, family: Family, data: Data) -> nn.Module:
    model = family.model(spec, data)
    if spec.init == "zero":
        for m in model.modules():
            for name, p in m.named_parameters(recurse=False):
                if not isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                    nn.init.zeros_(p)
    elif spec.init == "large":
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d, nn.LSTM, nn.Embedding)):
                for name, p in m.named_parameters(recurse=False):
                    if "weight" in name:
                        nn.init.normal_(p, std=spec.init_std)
    elif spec.init == "dead_bias":
        with torch.no_grad():
            family.dead_bias(model).fill_(-10.0)
    if spec.freeze is not None:
        if spec.freeze == "pretrained":
            _pretrain(model, spec, family, data)
            model.head.reset_parameters()  # transfer learning's recipe: a new head on the pretrained body
        for name, p in model.named_parameters():
            if not name.startswith("head.") and ".head." not in f".{name}":
                p.requires_grad_(False)
    if spec.dtype == "float64":
        model = model.double()
    return model


def _pretrain(model: nn.Module, spec: Spec, family: Family, data: Data) -> None:
    """"Pretrained elsewhere": a few full-batch epochs on the training data."""
    loss_fn = make_loss(Spec(family=spec.family, seed=spec.seed), family, data)
    optimizer = torch.optim.Adam(model.parameters(), lr=family.lr)
    for _ in range(40):
        optimizer.zero_grad()
        loss_fn(model(data.x[:256]), data.y[:256]).backward()
        optimizer.step()


def make_optimizer(spec: Spec, family: Family, params) -> torch.optim.Optimizer:
    kind = spec.optimizer or family.optimizer
    base_lr = spec.lr or (family.sgd_lr if kind == "sgd" and spec.optimizer else family.lr)
    lr = base_lr * spec.lr_scale
    params = [p for p in params if p.requires_grad]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=spec.weight_decay)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=spec.weight_decay or 0.01)
    return torch.optim.Adam(params, lr=lr, weight_decay=spec.weight_decay)


def _per_epoch(b: Built) -> int:
    return max(1, len(b.data.x) // b.batch_size)


def make_scheduler(spec: Spec, b: Built, optimizer: torch.optim.Optimizer) -> Any:
    sched = torch.optim.lr_scheduler
    updates = max(1, b.steps // spec.accumulate)
    if spec.schedule in ("step_per_batch", "step_per_epoch"):
        return sched.StepLR(optimizer, step_size=10, gamma=0.1)  # written for epochs
    if spec.schedule == "onecycle":
        return sched.OneCycleLR(optimizer, max_lr=3 * optimizer.param_groups[0]["lr"], total_steps=updates)
    if spec.schedule == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=updates)
    if spec.schedule == "warmup_cosine":
        warm = max(1, updates // 10)
        return sched.LambdaLR(optimizer, lambda t: (t + 1) / warm if t < warm
                              else 0.5 * (1 + math.cos(math.pi * (t - warm) / max(1, updates - warm))))  # fmt: skip
    return None


def scheduler_steps_now(spec: Spec, update: int, b: Built) -> bool:
    """After optimizer update number ``update`` (from 0), does the loop step the scheduler?"""
    if spec.schedule is None:
        return False
    if spec.schedule == "step_per_epoch":
        return (update + 1) % max(1, _per_epoch(b) // spec.accumulate) == 0
    return True  # per batch: right for OneCycle/cosine/warmup, the bug for step_per_batch


# --------------------------------------------------------------------------- evaluation


def forward(model: nn.Module, x: torch.Tensor, state: Any = None):
    if getattr(model, "stateful", False):
        return model(x, state)
    return model(x), None


def _validation_outputs(model: nn.Module, x: torch.Tensor, size: int) -> Any:
    """The model's outputs over the validation set, in loader-sized batches (batch-norm
    in train mode uses each batch's statistics, as it would in the user's loop)."""
    parts = [forward(model, x[i : i + size])[0] for i in range(0, len(x), size)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(p) for p in zip(*parts))
    return torch.cat(parts)


def evaluate(b: Built, loss_fn: Callable, mon: Any = None) -> tuple[float | None, float]:
    """The user's validation (logged to the Monitor with the user's loss) and the
    harness's reference numbers on the true labels, from the same forwards."""
    model = b.model
    if b.spec.eval_mode:
        model.eval()
    try:
        with torch.no_grad():
            out = _validation_outputs(model, b.data.x_val, b.batch_size)
            if mon is not None:
                user_loss = loss_fn(out, b.data.y_val)
                quality, _ = reference(b.family, out, b.data.y_val) if b.family.task != "vae" else (None, 0.0)
                mon.log(user_loss, split="val", accuracy=quality)
            return reference(b.family, out, b.data.y_val_true)
    finally:
        if b.spec.train_after_eval:
            model.train()


def graph_size(loss: torch.Tensor) -> int:
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    return len(seen)


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def _finish(b: Built, outcome: Outcome, loss_fn: Callable, mon: Any) -> Outcome:
    quality, ref = evaluate(b, loss_fn, mon)
    outcome.quality, outcome.ref_loss = quality, ref
    params_finite = all(bool(torch.isfinite(p).all()) for p in b.model.parameters())
    outcome.nonfinite = outcome.nonfinite or not _finite(ref) or not params_finite
    return outcome


# --------------------------------------------------------------------------- loops


def _running_loss(spec: Spec, running: Any, loss: torch.Tensor, step: int, b: Built, outcome: Outcome) -> Any:
    """The epoch's loss total the loop keeps for printing: ``running += loss.item()``, or
    with ``spec.running_loss_tensor`` the tensor itself (its graph kept alive). The harness
    measures the graph kept behind the loss (or the total) at the first and last step."""
    running = running + (loss if spec.running_loss_tensor else float(loss.detach()))
    if (spec.carry_state or spec.running_loss_tensor) and step in (0, b.steps - 1):
        outcome.graph_nodes.append(graph_size(running if spec.running_loss_tensor else loss))
    return running


def torch_loop(b: Built, loss_fn: Callable, mon: Any = None, measure_start: bool = False) -> Outcome:
    """The user's loop with a torch optimizer. Raises what the user's loop raises."""
    spec, model, optimizer = b.spec, b.model, b.optimizer
    outcome = Outcome()
    if measure_start:
        outcome.initial_ref_loss = evaluate(b, loss_fn)[1]
    scaler = torch.amp.GradScaler("cpu") if spec.amp else None
    k, state, update, running = spec.accumulate, None, 0, 0.0
    for step, xb, yb in batches(b):
        if step == 0 or spec.train_after_eval:
            model.train()
        if spec.zero_grad and step % k == 0:
            optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.amp):
            out, state = forward(model, xb, state)
            loss = loss_fn(out, yb)
        backward_loss = loss / k if (k > 1 and spec.divide_accumulated) else loss
        if scaler is not None:
            backward_loss = scaler.scale(backward_loss)
        running = _running_loss(spec, running, loss, step, b, outcome)
        backward_loss.backward(retain_graph=spec.carry_state == "retain")
        if spec.carry_state == "detach":
            state = tuple(s.detach() for s in state)
        if step % k == k - 1:
            if scaler is not None:
                scaler.unscale_(optimizer)
            if spec.clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
            if spec.optimizer_step:
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            if b.scheduler is not None and scheduler_steps_now(spec, update, b):
                b.scheduler.step()
            update += 1
        value = float(loss.detach())
        outcome.train_losses.append(value)
        outcome.nonfinite = outcome.nonfinite or not math.isfinite(value)
        if mon is not None:
            mon.log(loss.detach())
        if step % EVAL_EVERY == EVAL_EVERY - 1 and step != b.steps - 1:
            evaluate(b, loss_fn, mon)
    return _finish(b, outcome, loss_fn, mon)


def manual_lr(spec: Spec, b: Built, update: int) -> float:
    lr = (spec.lr or b.family.manual_lr) * spec.lr_scale
    if spec.schedule == "step_per_batch":
        return lr * 0.1 ** (update // 10)  # "decay every 10 epochs", counted in batches
    if spec.schedule == "step_per_epoch":
        return lr * 0.1 ** ((update // _per_epoch(b)) // 10)
    if spec.schedule == "cosine":
        return lr * 0.5 * (1 + math.cos(math.pi * update / max(1, b.steps // spec.accumulate)))
    return lr


def manual_loop(b: Built, loss_fn: Callable, mon: Any = None, measure_start: bool = False) -> Outcome:
    """Hand-written SGD (``p -= lr * p.grad``), no optimizer object, as in the PyTorch
    word-language-model example."""
    spec, model = b.spec, b.model
    params = [p for p in model.parameters() if p.requires_grad]
    outcome = Outcome()
    if measure_start:
        outcome.initial_ref_loss = evaluate(b, loss_fn)[1]
    k, state, update, running = spec.accumulate, None, 0, 0.0
    clip = spec.clip if spec.clip is not None else b.family.manual_clip
    for step, xb, yb in batches(b):
        if step == 0 or spec.train_after_eval:
            model.train()
        if spec.zero_grad and step % k == 0:
            for p in params:
                p.grad = None
        out, state = forward(model, xb, state)
        loss = loss_fn(out, yb)
        running = _running_loss(spec, running, loss, step, b, outcome)
        (loss / k if (k > 1 and spec.divide_accumulated) else loss).backward(retain_graph=spec.carry_state == "retain")
        if spec.carry_state == "detach":
            state = tuple(s.detach() for s in state)
        if step % k == k - 1:
            if clip is not None:
                nn.utils.clip_grad_norm_(params, clip)
            if spec.optimizer_step:
                lr = manual_lr(spec, b, update)
                for p in params:
                    if p.grad is not None:
                        p.data.add_(p.grad, alpha=-lr)  # as the word-language-model example writes it
            update += 1
        value = float(loss.detach())
        outcome.train_losses.append(value)
        outcome.nonfinite = outcome.nonfinite or not math.isfinite(value)
        if mon is not None:
            mon.log(loss.detach())
        if step % EVAL_EVERY == EVAL_EVERY - 1 and step != b.steps - 1:
            evaluate(b, loss_fn, mon)
    return _finish(b, outcome, loss_fn, mon)

"""The per-step series: logged losses, learning rates, the global gradient norm
(before and after clipping) and the norm of each training input batch.

Every value is read without a host synchronisation when it is taken: the records hold
0-d tensors until the Monitor fetches all pending values at once, every ``every``
steps (see :class:`~nndx.collector.watch.base.Deferred`).
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any, NamedTuple

import torch
from torch import nn

from nndx.collector._common import iter_tensors, stored_values
from nndx.collector.stats import norms, single_threaded
from nndx.collector.watch.base import History, StepContext, Watched, Watcher
from nndx.report import GradNormPoint, LossPoint, LRPoint, ScalarPoint


class LossRecord(NamedTuple):
    step: int
    value: Any  # float, or a 0-d tensor until fetched
    accuracy: Any


class LossHistory(Watcher):
    """The losses the loop logs with ``mon.log(loss, split=..., accuracy=...)``, one
    bounded history per split. Non-finite values are kept as they are."""

    name = "loss"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.splits: dict[str, History] = {}

    def log(self, ctx: StepContext, loss: Any, split: str, accuracy: Any, step: int | None) -> LossRecord:
        """Validate and queue one logged loss; returns its record (values not fetched)."""
        if not isinstance(split, str) or not split:
            raise ValueError(f"split must be a non-empty string, got {split!r}")
        value = _scalar(loss, "loss")
        acc = None if accuracy is None else _scalar(accuracy, "accuracy")
        if step is None:
            # a train loss belongs to the step its backward belonged to; any other split
            # (validation) to the last completed step
            step = ctx.backward_step if split == "train" else max(ctx.step - 1, 0)
        elif not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        history = self.splits.get(split)
        if history is None:
            history = self.splits[split] = History(self.capacity)
        record = LossRecord(step, value, acc)
        ctx.defer(history, record)
        return record

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loss_history": {
            split: history.models(_loss_point, newest=window) for split, history in self.splits.items()
        }}


def _loss_point(r: LossRecord) -> LossPoint:
    return LossPoint(step=r.step, value=r.value, accuracy=r.accuracy)


def _scalar(value: Any, what: str) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"log a scalar {what}; got a tensor of shape {list(value.shape)}")
        return value.detach()
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number or a tensor, got a bool")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number or a one-element tensor, got {type(value).__name__}") from None


class LRRecord(NamedTuple):
    step: int
    lrs: tuple[float, ...]  # every param group of every optimizer, in order


class LearningRate(Watcher):
    """The learning rate of each param group, at every optimizer step."""

    name = "lr"

    def __init__(self, watched: Watched, capacity: int) -> None:
        self.watched = watched
        self.history = History(capacity)

    def current(self) -> list[float]:
        return [float(g["lr"]) for o in self.watched.optimizers for g in o.param_groups]

    def on_step_begin(self, ctx: StepContext) -> None:
        if self.watched.optimizers:  # without one the LR is unknown: nothing is recorded, not 0
            ctx.defer(self.history, LRRecord(ctx.step, tuple(self.current())))

    def report(self, window: int | None) -> dict[str, Any]:
        groups = [g for o in self.watched.optimizers for g in o.param_groups]
        # OneCycleLR's initial_lr is max_lr / div_factor, where its warm-up starts: it rises to max_lr
        scheduled = ([float(g.get("max_lr", g["initial_lr"])) for g in groups]
                     if groups and all("initial_lr" in g for g in groups) else [])  # fmt: skip
        return {"loop": {"lr_history": self.history.models(_lr_point, newest=window), "scheduled_lrs": scheduled}}


def _lr_point(r: LRRecord) -> LRPoint:
    return LRPoint(step=r.step, lrs=list(r.lrs))


# an update this aligned with the gradient itself (cosine) climbed it: momentum overshooting
# a ravine turns single steps against the gradient, rarely this squarely
ASCENT = 0.5


class EffectiveLearningRate(Watcher):
    """In a loop without an optimizer the LR is a number in the user's code: measure the
    step instead, ‖Δw‖ / ‖gradient‖ (the median over weight matrices) on recorded steps.
    That is plain SGD's LR exactly and a constant multiple of it under momentum, so a
    schedule that collapses the LR shows in its shape. Negative when the update went up
    the gradient (its cosine with the gradient's direction below ``-ASCENT``): an LR
    that turned negative, a linear decay run past its end. Listens to the records of
    :class:`~nndx.collector.watch.layers.ParameterUpdates`."""

    name = "effective_lr"

    def __init__(self, parameters: Any, capacity: int) -> None:
        parameters.listeners.append(self._on_records)
        self.history = History(capacity)
        self._grad_norms: tuple[int, dict[str, Any]] = (-1, {})

    def on_backward_end(self, ctx: StepContext) -> None:
        # kept from backward: a loop that resets .grad to None before its next forward (where
        # the update is detected) leaves no gradient to measure at the step's end
        self._grad_norms = (ctx.step, dict(ctx.grad_norms or {}) if ctx.recording else {})

    def _on_records(self, records: list) -> None:
        """A recorded step's parameter records, once fetched."""
        step, grad_norms = self._grad_norms
        sizes = []
        for r in records:
            # zero at the step's end: the loop zeroed the gradients in place after its update
            grad = r.grad_norm if r.grad_norm else grad_norms.get(r.name) if step == r.step else None
            grad = None if grad is None else float(grad)
            if len(r.shape) >= 2 and r.update_ratio is not None and grad:
                size = r.update_ratio * r.weight_norm / grad
                if r.descent is not None and r.descent < -ASCENT:
                    size = -size
                if math.isfinite(size):
                    sizes.append(size)
        if sizes:
            self.history.append(LRRecord(records[0].step, (statistics.median(sizes),)))

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"effective_lr_history": self.history.models(_lr_point, newest=window)}}


class GradNormRecord(NamedTuple):
    step: int
    before_clip: Any
    after_clip: Any  # None unless the gradients changed between backward and the step


class GradientNorm(Watcher):
    """The global gradient norm at the end of backward and, when the loop changed the
    gradients before ``optimizer.step()`` (clipping, or unscaling by a GradScaler), again
    at the step. One pass over every gradient, so on recorded steps only; its
    per-parameter norms are shared through ``ctx.grad_norms`` (parameter statistics
    reuse them: run this watcher before :class:`ParameterUpdates`)."""

    name = "grad_norm"

    def __init__(self, watched: Watched, capacity: int) -> None:
        self.watched = watched
        self.history = History(capacity)
        self._versions: list[tuple[int, int]] = []
        self._recorded = False
        self._clip_factor: Any = None

    def clipped(self, total_norm: Any, max_norm: Any) -> None:
        """``clip_grad_norm_`` ran (seen in loops without an optimizer): the factor it
        multiplied every gradient by, as torch computes it, stands in for a norm measured at
        the step when the loop resets the gradients before the Monitor sees the update."""
        if isinstance(total_norm, torch.Tensor):
            self._clip_factor = (float(max_norm) / (total_norm.detach().float() + 1e-6)).clamp(max=1.0)

    def on_backward_end(self, ctx: StepContext) -> None:
        self._clip_factor = None
        ctx.grad_norms = ctx.total_grad_norm = None
        named = [(n, p.grad) for n, p in self.watched.params if p.grad is not None] if ctx.recording else []
        if not named:
            return
        grads = [g for _, g in named]
        with single_threaded(grads[0].device):
            per_param = norms(grads)  # one pass: per-parameter norms and their total
            ctx.total_grad_norm = torch.linalg.vector_norm(torch.stack([n.to(per_param[0].device) for n in per_param]))
        ctx.grad_norms = {n: norm for (n, _), norm in zip(named, per_param)}
        self._versions = [(id(g), g._version) for g in grads]

    def on_step_begin(self, ctx: StepContext) -> None:
        self._recorded = ctx.backward_since_step and ctx.total_grad_norm is not None
        if not self._recorded:
            return
        after = self._changed_norm()  # unscale_ does not move version counters: only clipping shows
        clipped = None if self._clip_factor is None else ctx.total_grad_norm * self._clip_factor.to(
            ctx.total_grad_norm.device)
        if after is not None and ctx.optimizer is None:
            # no optimizer: the step is heard after the update, and gradients zeroed in place by then
            # (``p.grad.zero_()``) were reset, not clipped to 0: clipped as clip_grad_norm_ said, or not
            after = torch.where(after == 0, ctx.total_grad_norm if clipped is None else clipped, after)
        if after is None and clipped is not None:  # clipped, then reset before we looked
            after = clipped
        self._clip_factor = None
        scale = _loss_scale() if ctx.optimizer is not None else None  # only an optimizer step runs in a scaler
        before = ctx.total_grad_norm if scale is None else ctx.total_grad_norm / scale.to(ctx.total_grad_norm.device)
        if after is not None or scale is not None:
            ctx.grad_norms = None  # changed since backward: parameter statistics measure anew
        ctx.defer(self.history, GradNormRecord(ctx.step, before, after))

    def on_step_end(self, ctx: StepContext) -> None:
        if not self._recorded and ctx.backward_since_step and ctx.total_grad_norm is not None:
            # a closure step (LBFGS, Lightning): backward ran inside optimizer.step(), and so
            # did any clipping after it (Lightning's gradient_clip_val): the gradients the
            # step left are the clipped ones
            ctx.defer(self.history, GradNormRecord(ctx.step, ctx.total_grad_norm, self._changed_norm()))
        self._recorded = False

    def _changed_norm(self) -> Any:
        """The total gradient norm now, when a gradient changed since backward; else None."""
        grads = [p.grad for _, p in self.watched.params if p.grad is not None]
        if not grads or [(id(g), g._version) for g in grads] == self._versions:
            return None
        with single_threaded(grads[0].device):
            return torch.nn.utils.get_total_norm([stored_values(g) for g in grads])

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"grad_norm_history": self.history.models(_grad_norm_point, newest=window)}}


def _loss_scale(depth: int = 16) -> torch.Tensor | None:
    """The loss scale a GradScaler divided the gradients by, when this optimizer step runs
    inside ``scaler.step(optimizer)`` (which unscales first, if ``unscale_`` was not called);
    else None. Found on the call stack, so it works whoever calls the scaler (a hand-written
    loop, Lightning, Hugging Face) without the Monitor being told about it. Without it, a
    norm measured at backward (scaled, x65536 by default) over one measured at the step
    (unscaled, then clipped) reads as clipping by 2**-16, and the norm's history is in
    the scale's units."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.amp.GradScaler):
            scale = getattr(owner, "_scale", None)
            return scale.detach().reshape(()).float() if owner.is_enabled() and scale is not None else None
        frame = frame.f_back
    return None


def _grad_norm_point(r: GradNormRecord) -> GradNormPoint:
    # clip_grad_norm_ rescales in place even under its threshold (by 1.0): a changed
    # gradient whose norm did not change was not clipped
    after, before = r.after_clip, r.before_clip
    unclipped = after is None or after == before or abs(after - before) <= 1e-6 * abs(before)
    return GradNormPoint(step=r.step, before_clip=before, after_clip=None if unclipped else after)


class ScalarRecord(NamedTuple):
    step: int
    value: Any


class InputNorms(Watcher):
    """The L2 norm of each training input batch (forwards with grad enabled): a zeroed
    or corrupted batch shows as a norm far from its neighbours. The input is the first
    tensor given to the model's forward (positional or keyword); when it holds integers
    (token ids) it has no meaningful norm, and only its dtype is recorded."""

    name = "inputs"

    def __init__(self, capacity: int) -> None:
        self.history = History(capacity)
        self.dtype: str | None = None

    def on_forward(self, ctx: StepContext, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled():
            return
        x = next(iter_tensors((args, kwargs)), None)
        if x is None:
            return
        self.dtype = str(x.dtype).removeprefix("torch.")
        if x.is_floating_point():
            with single_threaded(x.device):
                norm = torch.linalg.vector_norm(stored_values(x.detach()).float())
            ctx.defer(self.history, ScalarRecord(ctx.step, norm))

    def report(self, window: int | None) -> dict[str, Any]:
        # no live rule reads input norms: a live report (window set) leaves them out
        points = [] if window is not None else self.history.models(_scalar_point)
        return {"loop": {"input_norm_history": points, "input_dtype": self.dtype}}


def _scalar_point(r: ScalarRecord) -> ScalarPoint:
    return ScalarPoint(step=r.step, value=r.value)

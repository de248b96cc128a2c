"""Gradients scaled down after ``optimizer.step()``: a clip placed after the step (d2l's
``grad_clipping`` moved below ``updater.step()``, ``clip_grad_norm_`` after ``step()``). The
clip runs and shrinks the gradients, but the step already used them unclipped, so the loss
blows up as if nothing were clipped, and the loop looks clipped.

On recorded steps, a sample of each gradient is kept at the step's end and compared at the
loop's next event (a forward, a ``zero_grad``, a backward pass). Gradients a clip scaled are
every changed one multiplied by one common factor under 1; gradients reset to zero, replaced
(``set_to_none``), or added to by another backward (a GAN's generator pass through its
discriminator) are not. Sparse gradients (an embedding's ``sparse=True``) are left out. The
comparison runs on the device and is fetched with the step's other values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from nndx.collector.stats import flat_sample
from nndx.collector.watch.base import History, StepContext, Watched, Watcher
from nndx.report import ScalarPoint

SAMPLE = 64  # elements of each gradient compared: a clip scales every one of them alike
SAME_FACTOR = 1e-4  # relative spread of the element ratios within which they are one factor
CLIPPED = 0.999  # a common factor under this shrank the gradients (clip_grad_norm_ multiplies by 1 otherwise)


class ScaleRecord(NamedTuple):
    step: int
    factor: Any  # 0-d tensors until fetched: the mean ratio of the changed gradients' samples, after / at the step
    spread: Any  # ...and the largest relative distance of a ratio from it


class ClipAfterStep(Watcher):
    """Per recorded step, the factor the gradients were scaled by between ``optimizer.step()``
    and the loop's next event, when they all were scaled by one."""

    name = "clip_after_step"

    def __init__(self, watched: Watched, capacity: int) -> None:
        self.watched = watched
        self.history = History(capacity)
        self._kept: tuple[int, list[tuple[torch.Tensor, int, int, torch.Tensor]]] | None = None

    def on_step_end(self, ctx: StepContext) -> None:
        self._kept = None
        if not ctx.recording or ctx.optimizer is None:  # a manual update is heard after it: no step end to watch
            return
        with torch.no_grad():
            kept = [(p, id(p.grad), p.grad._version, flat_sample(p.grad, SAMPLE).reshape(-1).double().clone())
                    for _, p in self.watched.params_of(ctx.optimizer)
                    if p.grad is not None and p.grad.layout == torch.strided and p.grad.is_floating_point()]
        self._kept = (ctx.step, kept) if kept else None

    def _compare(self, ctx: StepContext, *_: Any) -> None:
        if self._kept is None:
            return
        step, kept = self._kept
        self._kept = None
        # the same gradient tensor, changed in place: a reset replaces it (set_to_none) or zeroes it
        changed = [(p.grad, before) for p, ident, version, before in kept
                   if p.grad is not None and id(p.grad) == ident and p.grad._version != version]  # fmt: skip
        if not changed:
            return
        with torch.no_grad():
            device = changed[0][1].device
            now = torch.cat([flat_sample(g, SAMPLE).reshape(-1).double().to(device) for g, _ in changed])
            before = torch.cat([b for _, b in changed])
            counted = before != 0  # masked, not indexed: indexing by a mask reads the count on the host
            ratios = torch.where(counted, now / torch.where(counted, before, 1.0), 0.0)
            factor = ratios.sum() / counted.sum().clamp(min=1)  # 0 when no element counted: no record
            spread = torch.where(counted, (ratios - factor).abs(), 0.0).max() / factor.abs().clamp(min=1e-30)
            ctx.defer(self.history, ScaleRecord(step, factor, spread))

    on_forward = on_zero_grad = on_backward_start = _compare  # the loop's next event after the step

    def report(self, window: int | None) -> dict[str, Any]:
        points = [ScalarPoint(step=r.step, value=float(r.factor)) for r in self.history.values()
                  if 0 < float(r.factor) < CLIPPED and float(r.spread) <= SAME_FACTOR]  # fmt: skip
        return {"loop": {"clipped_after_step": points}}

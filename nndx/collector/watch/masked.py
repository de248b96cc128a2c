"""Gradients of live weights zeroed by the loop between backward and ``optimizer.step()``:
a mask applied to ``.grad`` by hand (pruning code that freezes what it calls pruned, and
with ``tensor < eps`` also every negative weight). A zero gradient autograd gave (a weight
on an input pixel that is always 0) is no mask; a zero weight's masked gradient (a pruned
weight kept at 0) is what such code is for.

On recorded steps, the entries with a zero gradient and a non-zero weight are counted at
the end of backward and, for the gradients the loop changed since (their version or storage),
again at the step; what the step has more of was zeroed between. A gradient under
``NEGLIGIBLE`` of the parameter's largest counts as zero at both ends: a clip that scales every
gradient (by 0.01, say) flushes the subnormal ones of saturated gates (~1e-44) to exactly 0,
which masks nothing. Counted over the first
``MAX_COUNTED`` entries of each parameter (a mask applied by hand spreads over the tensor), on
the device, and fetched with the step's other values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from nndx.collector.watch.base import History, StepContext, Watched, Watcher

MAX_COUNTED = 1 << 16  # entries of each parameter: bounds a recorded step's cost at a few passes of this size
NEGLIGIBLE = 1e-7  # a gradient this far under its parameter's largest is zero to a step, and a rescale may flush it


class MaskRecord(NamedTuple):
    step: int
    names: tuple[str, ...]
    share: Any  # 0-d tensor until fetched: the largest share of a parameter's non-zero entries masked
    which: Any  # 0-d tensor: that parameter's index in names


class MaskedGradients(Watcher):
    """Per recorded step, the parameter whose non-zero weights lost the largest share of
    their gradients between backward and the step, and that share."""

    name = "masked_gradients"

    def __init__(self, watched: Watched, capacity: int) -> None:
        self.watched = watched
        self.history = History(capacity)
        # per parameter at the end of backward: (gradient version, storage, zero-gradient live entries)
        self._at_backward: dict[int, tuple[int, int, torch.Tensor]] = {}

    def on_backward_end(self, ctx: StepContext) -> None:
        self._at_backward = {}
        if ctx.recording and not self.watched.manual:  # a manual update is heard after it, gradients maybe reset
            self._at_backward = {id(p): (p.grad._version, p.grad.data_ptr(), _masked_entries(p))
                                 for _, p in self.watched.params if _counted(p)}  # fmt: skip

    def on_step_begin(self, ctx: StepContext) -> None:
        if not self._at_backward or ctx.optimizer is None:
            return
        # each optimizer's own: one backward may feed several steps (an actor's and a critic's)
        named = [(n, p) for n, p in self.watched.params_of(ctx.optimizer) if id(p) in self._at_backward and _counted(p)]
        before = {id(p): self._at_backward.pop(id(p)) for _, p in named}
        # only gradients the loop changed since backward (a mask in place, or .grad.data replaced)
        named = [(n, p) for n, p in named if before[id(p)][:2] != (p.grad._version, p.grad.data_ptr())]
        if not named:
            return
        with torch.no_grad():
            device = named[0][1].device
            masked = torch.stack([(_masked_entries(p) - before[id(p)][2]).clamp(min=0).to(device) for _, p in named])
            live = torch.stack([torch.count_nonzero(_first(p.detach())).to(device) for _, p in named]).clamp(min=1)
            shares = masked.float() / live.float()  # float32: MPS has no float64
            ctx.defer(self.history, MaskRecord(ctx.step, tuple(n for n, _ in named), shares.max(), shares.argmax()))

    def report(self, window: int | None) -> dict[str, Any]:
        worst: dict[str, float] = {}
        for record in self.history.values():
            if record.share > 0:
                name = record.names[int(record.which)]
                worst[name] = max(worst.get(name, 0.0), float(record.share))
        return {"loop": {"grads_masked_by_hand": worst}}


def _counted(p: torch.Tensor) -> bool:
    return p.requires_grad and p.grad is not None and p.grad.layout == torch.strided and p.grad.shape == p.shape


def _masked_entries(p: torch.Tensor) -> torch.Tensor:
    grad = _first(p.grad).abs()
    return ((grad <= NEGLIGIBLE * grad.amax()) & (_first(p.detach()) != 0)).sum()


def _first(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)[:MAX_COUNTED]

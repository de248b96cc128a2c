"""Recorded-step statistics: per-layer activation and gradient statistics, and
per-parameter weight norm, gradient norm and update/weight ratio.

Both run every ``every`` steps only (the recorded steps). To bound the cost on a CPU,
each layer's statistics come from the leading samples of the batch that fit in
``max_elements`` and update ratios from an evenly spread sample of each parameter
(see :mod:`nndx.collector.stats`); weight and gradient norms are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nndx.collector.stats import (
    PENDING_BYTES,
    LayerRecord,
    LayerRecorder,
    ParameterRecord,
    parameter_records,
    snapshot_parameters,
)
from nndx.collector.watch.base import History, StepContext, Watched, Watcher, recorded_steps


class LayerStatistics(Watcher):
    """Activation statistics of each hooked layer's output and gradient statistics of
    the gradient w.r.t. it (:class:`~nndx.collector.stats.LayerRecorder`), every
    recorded step."""

    name = "layers"

    def __init__(self, watched: Watched, max_elements: int | None, capacity: int, guard: Callable) -> None:
        self.recorder = LayerRecorder(watched.root, max_elements=max_elements, roots=watched.models.values(), guard=guard)
        self.history = History(capacity)
        self.forward_order: list[str] | None = None  # names in the order they ran, once seen
        self._ran: set[str] = set()  # every layer seen at a recorded step

    def attach(self) -> list:
        """Hook the layers (the Monitor calls it, and records a failure as a limitation)."""
        self.recorder.attach()
        return []

    def on_record_start(self, ctx: StepContext) -> None:
        self.recorder.start_step(ctx.step)

    def on_step_end(self, ctx: StepContext) -> None:
        if not self.recorder.recording:
            return
        ctx.defer.statistics(self.recorder.finish_step_pending(), self._append)

    def _append(self, records: list[LayerRecord]) -> None:
        if records:
            self._ran.update(r.name for r in records)
            self.history.append(tuple(records), pinned=any(r.nonfinite for r in records))
            if self.forward_order is None:
                self.forward_order = [r.name for r in records]

    def latest(self) -> list[LayerRecord]:
        """The newest recorded step's records."""
        steps = self.history.values(newest=1)
        return list(steps[-1]) if steps else []

    @property
    def workspace_bytes(self) -> int:
        return self.recorder.workspace_bytes

    def report(self, window: int | None) -> dict[str, Any]:
        # hooked layers with parameters no recorded step saw run (a head the forward never calls)
        never = [name for name, module in self.recorder.modules if name not in self._ran
                 and next(nn.Module.parameters(module, recurse=False), None) is not None] if self._ran else []  # fmt: skip
        return {"layers": recorded_steps(self.history, _layer_models, window), "loop": {"layers_never_run": never}}

    def close(self) -> None:
        self.recorder.detach()


def _layer_models(records: tuple[LayerRecord, ...]) -> list:
    return [r.model() for r in records]


class ParameterUpdates(Watcher):
    """Weight norm, gradient norm and update/weight ratio of each parameter: a snapshot
    of the trainable parameters the optimizer steps, taken before ``optimizer.step()``
    (in loops without an optimizer: at the end of backward) and compared after it; the
    spent snapshot's memory is reused by the next one (fresh memory costs a page fault
    per 4 KiB on a CPU) unless it passes ``stats.PENDING_BYTES``."""

    name = "parameters"

    def __init__(self, watched: Watched, max_elements: int | None, capacity: int) -> None:
        self.watched = watched
        self.max_elements = max_elements
        self.history = History(capacity)
        self._snapshot: dict | None = None
        self._spent: dict | None = None  # memory for the next snapshot
        self._grads: dict | None = None  # without an optimizer: the gradients the update is made from
        self.listeners: list[Callable[[list[ParameterRecord]], None]] = []  # told each recorded step's records

    def on_backward_end(self, ctx: StepContext) -> None:
        if ctx.recording and self.watched.manual:  # updated by hand: the next thing we hear is after the update
            self._snapshot = snapshot_parameters(self.watched.params, self.max_elements, into=self._snapshot or self._spent)
            # the loop may zero them right after its update, before anything we hear
            grads = [(n, p.grad) for n, p in self.watched.params
                     if p.grad is not None and p.grad.layout == torch.strided]
            self._grads = snapshot_parameters(grads, self.max_elements, into=self._grads)

    def on_step_begin(self, ctx: StepContext) -> None:
        if ctx.recording and not self.watched.manual:
            # not those only another optimizer steps (a GAN's other network): they do not move now
            self._snapshot = snapshot_parameters(self.watched.params_of(ctx.optimizer), self.max_elements, into=self._spent)

    def on_step_end(self, ctx: StepContext) -> None:
        if not ctx.recording or self._snapshot is None:
            return
        named = self.watched.named_tensors()
        grads = self._grads if self.watched.manual else None
        pending = parameter_records(named, self._snapshot, ctx.step, self.max_elements, ctx.grad_norms, grads)
        self._spent = self._snapshot if _nbytes(self._snapshot) <= PENDING_BYTES else None
        self._snapshot = None
        ctx.defer.statistics(pending, self._append)

    def _append(self, records: list[ParameterRecord]) -> None:
        if records:
            self.history.append(tuple(records), pinned=any(r.nonfinite for r in records))
            for listener in self.listeners:
                listener(records)

    def latest(self) -> list[ParameterRecord]:
        steps = self.history.values(newest=1)
        return list(steps[-1]) if steps else []

    @property
    def workspace_bytes(self) -> int:
        return _nbytes(self._spent or {}) + _nbytes(self._grads or {})

    def report(self, window: int | None) -> dict[str, Any]:
        return {"parameters": recorded_steps(self.history, _parameter_models, window)}

    def close(self) -> None:
        self._snapshot = self._spent = self._grads = None


def _parameter_models(records: tuple[ParameterRecord, ...]) -> list:
    return [r.model() for r in records]


def _nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())

"""Hook-statistics probe: one recorded forward + backward and one optimizer step, on a copy.

How to use::

    stats = hook_statistics(model, (x, y), loss_fn, optimizer=optimizer)
    stats.layers, stats.parameters, stats.model   # -> report.layers / .parameters / .model

The statistics themselves come from :mod:`nndx.collector.stats` (``LayerRecorder``,
``parameter_stats``), the same code the Monitor uses, so a probe and a training run
report comparable numbers. The update/weight ratio needs a real optimizer step: it is
taken on a copy with a copy of the user's optimizer when it holds the model's
parameters (so the ratio reflects the user's learning rate), else with a fresh
optimizer (see ``copy_with_optimizer``). The user's model and optimizer are never stepped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    copy_with_optimizer,
    forward,
    preserved_rng,
    split_batch,
)
from nndx.collector.stats import (
    LayerRecorder,
    iter_named_leaves,
    parameter_stats,
    snapshot_parameters,
    summarize_model,
)
from nndx.collector.probes import ProbeSpec
from nndx.report import DiagnosticReport, LayerStats, ModelSummary, ParameterStats


class HookStatistics(NamedTuple):
    layers: list[LayerStats]
    parameters: list[ParameterStats]
    model: ModelSummary
    optimizer: str  # which optimizer took the step, in words


def hook_statistics(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    step: int = 0,
) -> HookStatistics:
    """Per-layer activation/gradient statistics and per-parameter weight norm, grad norm
    and update/weight ratio over one batch. ``lr`` is for nndx's own Adam, used only when
    no usable ``optimizer`` is given."""
    inputs, targets = split_batch(batch)
    with preserved_rng():
        model_copy, opt, note = copy_with_optimizer(model, optimizer, lambda p: torch.optim.Adam(p, lr=lr))
        opt.zero_grad(set_to_none=True)  # the copy may carry the user's stale .grad
        # the recorder hooks only layers worth statistics; the summary wants every leaf
        # (dropout, flatten...) in the order it ran
        order: list[str] = []
        handles = [m.register_forward_hook(lambda *_, n=n: order.append(n) if n not in order else None)
                   for n, m in iter_named_leaves(model_copy)]  # fmt: skip
        try:
            with LayerRecorder(model_copy) as recorder:
                recorder.start_step(step)
                loss = compute_loss(loss_fn, forward(model_copy, inputs), targets)
                loss.backward()
                layers = recorder.finish_step()
        finally:
            for h in handles:
                h.remove()
        before = snapshot_parameters(model_copy)
        opt.step()
        parameters = parameter_stats(model_copy, before, step)
    return HookStatistics(layers, parameters, summarize_model(model, order), note)


def _record(report: DiagnosticReport, stats: HookStatistics) -> str:
    report.layers, report.parameters, report.model = stats.layers, stats.parameters, stats.model
    return "done"


# named "hooks" in reports, options and the CLI since before this module had its name
SPEC = ProbeSpec(name="hooks", title="layer statistics", function=hook_statistics, order=10, record=_record)

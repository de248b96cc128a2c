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

import contextlib
from typing import NamedTuple

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    copy_with_optimizer,
    forward,
    optimizer_step,
    preserved_rng,
    split_batch,
    train_in_float32,
)
from nndx.collector.probes._observe import ForwardObserver, observed_summary
from nndx.collector.stats import (
    LayerRecorder,
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
        # nndx's own Adam on float16 weights is NaN in one step (its eps is 0 in float16):
        # then the step is taken as mixed precision takes it; the user's optimizer as it is
        precision = train_in_float32(model_copy, opt) if note.startswith("nndx's own") else contextlib.nullcontext()
        with LayerRecorder(model_copy) as recorder, ForwardObserver(model_copy, layer_stats=True) as seen, precision:
            recorder.start_step(step)
            output = forward(model_copy, inputs)
            loss = compute_loss(loss_fn, output, targets)
        loss.backward()
        layers = _in_forward_order(recorder.finish_step() + seen.layer_records(step), seen.timeline)
        before = snapshot_parameters(model_copy)
        optimizer_step(opt, lambda: compute_loss(loss_fn, forward(model_copy, inputs), targets))
        parameters = parameter_stats(model_copy, before, step)
    # the summary wants every leaf (dropout, flatten...) in the order it ran
    summary = observed_summary(summarize_model(model, [n for n in seen.timeline if n in dict(model.named_modules())]),
                               seen, output)  # fmt: skip
    return HookStatistics(layers, parameters, summary, note)


def _in_forward_order(layers: list[LayerStats], timeline: list[str]) -> list[LayerStats]:
    rank = {name: i for i, name in enumerate(timeline)}
    return sorted(layers, key=lambda layer: rank.get(layer.name, len(rank)))


def _record(report: DiagnosticReport, stats: HookStatistics) -> str:
    report.layers, report.parameters, report.model = stats.layers, stats.parameters, stats.model
    return "done"


# named "hooks" in reports, options and the CLI since before this module had its name
SPEC = ProbeSpec(name="hooks", title="layer statistics", function=hook_statistics, order=10, record=_record)

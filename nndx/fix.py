"""Fixes: functions that turn a diagnosis into a change, each returning what it changed.

How to use::

    from nndx.fix import suggest_clip_norm, resurrect_dead_units

    suggestion = suggest_clip_norm(report)            # reads report.loop.grad_norm_history
    torch.nn.utils.clip_grad_norm_(model.parameters(), suggestion.clip_norm)

    result = resurrect_dead_units(model, (x, y))      # MODIFIES model: re-inits dead ReLU units
    print(result.dead_fraction_before, "->", result.dead_fraction_after)

``suggest_clip_norm`` only reads a report, so this module imports no torch at import
time (the rules cite it in the EXPLODING_GRADIENTS finding); ``resurrect_dead_units``
imports torch when called.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from nndx.report import Count, DiagnosticReport, EvidenceValue, Float, Fraction, Schema

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "ClipSuggestion",
    "DeadUnitLayer",
    "ResurrectionResult",
    "resurrect_dead_units",
    "suggest_clip_norm",
]

# A norm more than SPIKE_FACTOR times the median of the recent healthy norms is not healthy.
SPIKE_FACTOR = 10.0
# The first norms cannot be judged against a history; they count as healthy.
MIN_HISTORY = 5
# The median baseline looks at this many recent healthy norms (bounded cost per step).
BASELINE_WINDOW = 100
MIN_HEALTHY_STEPS = 5
CLIP_PERCENTILE = 95.0


# --------------------------------------------------------------------------- clip norm


class ClipSuggestion(Schema):
    """A gradient-clipping threshold and the numbers it came from."""

    clip_norm: Float | None = Field(None, description="suggested max_norm for clip_grad_norm_; None if unknown")
    percentile: Float = CLIP_PERCENTILE
    source: Literal["grad_norm_history", "parameters", "none"] = "none"
    steps: Count = 0
    healthy_steps: Count = 0
    spike_steps: list[int] = Field(default_factory=list, description="isolated steps left out as spikes")
    exploding_from_step: Count | None = Field(None, description="first step of the exploding tail")
    nonfinite_steps: Count = 0
    median_healthy_norm: Float | None = None
    max_healthy_norm: Float | None = None
    max_finite_norm: Float | None = None
    message: str = ""

    def evidence(self) -> dict[str, EvidenceValue]:
        """The numbers a Finding cites."""
        return {
            "suggested_clip_norm": self.clip_norm,
            "clip_percentile": self.percentile,
            "healthy_steps": self.healthy_steps,
            "median_healthy_grad_norm": self.median_healthy_norm,
            "max_healthy_grad_norm": self.max_healthy_norm,
            "exploding_from_step": self.exploding_from_step,
            "nonfinite_grad_norm_steps": self.nonfinite_steps,
            "max_finite_grad_norm": self.max_finite_norm,
        }


def suggest_clip_norm(report: DiagnosticReport, *, percentile: float = CLIP_PERCENTILE) -> ClipSuggestion:
    """Suggest ``max_norm`` for ``torch.nn.utils.clip_grad_norm_`` from the total
    gradient norms a report recorded: the ``percentile`` of the *healthy* steps.

    Why healthy steps: the norms of the exploding tail (and NaN/Inf steps) are the
    symptom, not the scale of useful gradients; a percentile over all steps would
    suggest a threshold that clips nothing. Healthy means finite and at most
    ``SPIKE_FACTOR`` times the median of the recent healthy norms. Unhealthy steps that
    run to the end of the history are the exploding tail; others are isolated spikes.

    Reads ``report.loop.grad_norm_history`` (``before_clip``), or else the per-step
    parameter grad norms in ``report.parameters``. With fewer than
    ``MIN_HEALTHY_STEPS`` healthy steps, ``clip_norm`` is None and ``message`` says why.
    """
    if not 0.0 < percentile <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], not {percentile}")
    steps, norms, source = _total_grad_norms(report)
    if not norms:
        return ClipSuggestion(percentile=percentile, message="the report holds no gradient norms")

    healthy_flags: list[bool] = []
    recent: deque[float] = deque(maxlen=BASELINE_WINDOW)
    for norm in norms:
        ok = math.isfinite(norm) and not (
            len(recent) >= MIN_HISTORY and norm > SPIKE_FACTOR * statistics.median(recent)
        )
        healthy_flags.append(ok)
        if ok:
            recent.append(norm)
    tail_start = len(norms)
    while tail_start > 0 and not healthy_flags[tail_start - 1]:
        tail_start -= 1
    healthy = sorted(n for n, ok in zip(norms, healthy_flags) if ok)
    finite = [n for n in norms if math.isfinite(n)]
    suggestion = ClipSuggestion(
        percentile=percentile,
        source=source,
        steps=len(norms),
        healthy_steps=len(healthy),
        spike_steps=[s for s, ok, i in zip(steps, healthy_flags, range(len(norms))) if not ok and i < tail_start],
        exploding_from_step=steps[tail_start] if tail_start < len(norms) else None,
        nonfinite_steps=len(norms) - len(finite),
        median_healthy_norm=statistics.median(healthy) if healthy else None,
        max_healthy_norm=healthy[-1] if healthy else None,
        max_finite_norm=max(finite) if finite else None,
    )
    if len(healthy) < MIN_HEALTHY_STEPS:
        suggestion.message = (
            f"only {len(healthy)} healthy gradient-norm steps (need {MIN_HEALTHY_STEPS}); "
            "record more steps before the explosion, or lower the learning rate"
        )
        return suggestion
    suggestion.clip_norm = _percentile(healthy, percentile)
    suggestion.message = (
        f"clip_grad_norm_(max_norm={suggestion.clip_norm:.4g}): the {percentile:g}th percentile of "
        f"{len(healthy)} healthy steps (median {suggestion.median_healthy_norm:.4g})"
        + (f"; norms explode from step {suggestion.exploding_from_step}" if suggestion.exploding_from_step is not None else "")
    )
    return suggestion


def _total_grad_norms(report: DiagnosticReport) -> tuple[list[int], list[float], Literal["grad_norm_history", "parameters", "none"]]:
    """(steps, total gradient norms) in step order."""
    if report.loop is not None and report.loop.grad_norm_history:
        points = sorted(report.loop.grad_norm_history, key=lambda p: p.step)
        return [p.step for p in points], [float(p.before_clip) for p in points], "grad_norm_history"
    squares: dict[int, float] = {}
    for param in report.parameters:
        if param.step is not None and param.grad_norm is not None:
            squares[param.step] = squares.get(param.step, 0.0) + float(param.grad_norm) ** 2
    if squares:
        ordered = sorted(squares)
        return ordered, [math.sqrt(squares[s]) for s in ordered], "parameters"
    return [], [], "none"


def _percentile(sorted_values: Sequence[float], percentile: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    position = (len(sorted_values) - 1) * percentile / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


# --------------------------------------------------------------------------- dead units


class DeadUnitLayer(Schema):
    """One layer whose output feeds a ReLU, and the units re-initialised in it."""

    layer: str = Field(description="the Linear/Conv whose rows were re-initialised")
    activation: str = Field(description="the ReLU module that follows it")
    units: Count
    dead_units: Count
    reinitialized: list[int] = Field(default_factory=list, description="unit (row / output channel) indices")


class ResurrectionResult(Schema):
    layers: list[DeadUnitLayer] = Field(default_factory=list)
    total_units: Count = 0
    dead_units_before: Count = 0
    dead_units_after: Count = 0
    dead_fraction_before: Fraction = 0.0
    dead_fraction_after: Fraction = 0.0
    skipped: list[str] = Field(
        default_factory=list, description="ReLUs whose input does not come straight from a Linear/Conv"
    )
    seed: int = 0


def resurrect_dead_units(model: nn.Module, batch: Any, *, seed: int = 0) -> ResurrectionResult:
    """Re-initialise the ReLU units that are dead on ``batch``. **Modifies ``model``.**

    A unit is dead when the ReLU output is exactly zero for every sample (every position
    of a conv channel) of the batch: it passes no gradient, so training never revives it.
    For each ReLU (``nn.ReLU``/``nn.ReLU6``) whose input is the output of an
    ``nn.Linear``/``nn.Conv*d``, the dead units' incoming weight rows get Kaiming-normal
    values (std ``sqrt(2 / fan_in)``) and their biases 0; live units stay bit-identical.
    ReLUs fed by anything else (a BatchNorm, an addition, a transposed conv) are listed
    in ``skipped``. Only ReLU *modules* are seen: a ``torch.relu``/``F.relu`` call inside
    ``forward`` is invisible to hooks (then ``layers`` is empty and nothing changes).

    ``batch`` is the model input, or an ``(input, target)`` tuple/list whose first item
    is the input. The detection forward runs in eval mode without gradients (the
    model's train/eval flags are restored); new weights come from a local
    ``torch.Generator(seed)``, so the global RNG is untouched. Optimizer state (Adam
    moments) of the re-initialised rows is stale: recreate the optimizer afterwards.
    """
    import torch

    from nndx.collector.remedies import dead_relu_units, reinitialize_units

    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    before = dead_relu_units(model, inputs)
    generator = torch.Generator().manual_seed(seed)
    result = ResurrectionResult(seed=seed)
    with torch.no_grad():
        for relu_name, producer_name, producer, dead in before:
            if producer is None:
                result.skipped.append(relu_name)
                continue
            indices = torch.nonzero(dead).flatten().tolist()
            layer = DeadUnitLayer(layer=producer_name, activation=relu_name, units=dead.numel(), dead_units=len(indices))
            if indices:
                reinitialize_units(producer, indices, generator)
                layer.reinitialized = indices
            result.layers.append(layer)
    result.total_units = sum(layer.units for layer in result.layers)
    result.dead_units_before = sum(layer.dead_units for layer in result.layers)
    after = dead_relu_units(model, inputs)
    result.dead_units_after = int(sum(int(dead.sum()) for _, _, producer, dead in after if producer is not None))
    if result.total_units:
        result.dead_fraction_before = result.dead_units_before / result.total_units
        result.dead_fraction_after = result.dead_units_after / result.total_units
    return result

"""Eval-mode consistency probe: would evaluating the model as it is now be reproducible?

How to use::

    result = eval_mode_consistency(model, (x, y))   # targets are not used
    result.training, result.max_abs_diff, result.status

Forwards of the same batch in the model's current mode, under ``no_grad``, on a copy
(batch-norm running statistics of the user's model never move) with the RNG restored
afterwards. Each forward runs under a fixed seed: two forwards under different seeds
show what randomness does (``max_abs_diff``), and which random op made it is seen
through :class:`~nndx.collector.probes._observe.ForwardObserver`:

- dropout active in the current mode (train mode): evaluating in this state gives
  noisy, pessimistic numbers — the forgotten ``model.eval()`` (EVAL_MODE_FORGOTTEN);
- dropout active even after ``model.eval()`` (``F.dropout(x, training=True)``): a bug
  whatever mode the user is in (``ignores_eval``);
- other randomness (a VAE's reparameterisation noise, sampling in a generative model)
  is the model's purpose, not a forgotten ``eval()``: noted, never a failure.

Batch-norm in train mode gives the same output twice for the same batch, so the first
half of the batch also runs alone: in train mode its outputs change because batch
statistics do.

Differences are judged against ``tolerance``, the rounding two evaluations of the same
outputs may differ by (from the dtype's eps, the outputs' magnitude and the layers'
reduction sizes, :func:`~nndx.collector._common.roundoff_tolerance`; the dtype is the
least precise one the forward computed in, autocast included): a half batch
reduces in a different order and differs by ~1e-8 in float32, never exactly 0. A
float16/bfloat16 model is compared on a float32 copy: what dropout and batch statistics
do does not depend on the dtype, and float32 resolves it.

Status ``failed`` means the current mode is not fit for evaluation; whether that is a
bug depends on whether the user was evaluating, which ``training`` tells the rules.
"""

from __future__ import annotations

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    forward,
    iter_tensors,
    map_tensors,
    preserved_rng,
    relates_samples,
    roundoff_tolerance,
    seed_all,
    set_mode,
    split_batch,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._observe import ForwardObserver
from nndx.collector.stats import has_batchnorm, has_dropout, is_batchnorm
from nndx.report import EvalModeResult

SEEDS = (1, 2)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def eval_mode_consistency(model: nn.Module, batch: Batch) -> EvalModeResult:
    """Compare forwards of the batch's inputs (and of its first half) in the current mode,
    and in eval mode."""
    inputs, targets = split_batch(batch)
    training = model.training
    dropout, batchnorm = has_dropout(model), has_batchnorm(model)
    with preserved_rng(), torch.no_grad():
        model_copy = working_copy(model)
        if any(p.dtype in LOW_PRECISION for p in nn.Module.parameters(model_copy)):
            model_copy.float()
            inputs = map_tensors(inputs, lambda t: t.float() if t.dtype in LOW_PRECISION else t)
        with ForwardObserver(model_copy) as seen:
            first = _outputs(model_copy, inputs, SEEDS[0])
            diff = _max_abs_diff(first, _outputs(model_copy, inputs, SEEDS[1])) or 0.0
            active = _dropout_active(seen) or bool(seen.drawn_masks)
            axis = _sample_axis(inputs, targets)
            half = _first_half(inputs, axis) if axis is not None else None
            batch_diff = None
            if half is not None:
                try:
                    batch_diff = _max_abs_diff(_first_rows(first, axis, _size(inputs, axis)),
                                               _outputs(model_copy, half, SEEDS[0]))  # fmt: skip
                except Exception:  # noqa: BLE001 - a half batch the model cannot take is the probe's doing
                    batch_diff = None
            statistics = seen.functional_batch_statistics or _batch_statistics(model_copy)
            # F.dropout in forward too, and masks drawn by hand
            dropout = dropout or any(p > 0 for p, _ in seen.dropout_calls) or bool(seen.drawn_masks)
            set_mode(model_copy, False)
            seen.dropout_calls.clear()
            seen.drawn_masks.clear()
            evaluated = _outputs(model_copy, inputs, SEEDS[0])
            eval_diff = _max_abs_diff(evaluated, _outputs(model_copy, inputs, SEEDS[1])) or 0.0
            tolerance = roundoff_tolerance(model_copy, first + evaluated, seen.lowest_precision)
            ignores_eval = _dropout_active(seen) or (bool(seen.drawn_masks) and eval_diff > tolerance)
            dropout = dropout or ignores_eval
    mode = "train" if training else "eval"
    sampling = ""
    if eval_diff > tolerance and not ignores_eval:
        sampling = (f"; outputs vary by {eval_diff:.3g} with the random seed even in eval mode, from random ops "
                    "that are not dropout (sampling, e.g. a VAE's reparameterisation): the model's own purpose")
    if ignores_eval:
        status, message = "failed", (f"outputs differ by {eval_diff:.3g} between two forwards even in eval mode: "
                                     "a dropout ignores model.eval() (e.g. F.dropout(x, training=True), or a mask "
                                     "drawn by hand, torch.rand(x.shape) > p, with no check of self.training)")
    elif active and diff > tolerance:
        status, message = "failed", (f"two forwards of the same batch in {mode} mode differ by {diff:.3g}: dropout "
                                     "is active; call model.eval() (and torch.no_grad()) before evaluating")
    elif batch_diff is not None and batch_diff > tolerance and statistics:
        status, message = "failed", (f"outputs of the same samples change by {batch_diff:.3g} with the rest of the "
                                     f"batch in {mode} mode: batch-norm uses batch statistics; call model.eval()")
    elif batch_diff is not None and batch_diff > tolerance:
        status, message = "failed", (f"outputs of the same samples change by {batch_diff:.3g} with the rest of the "
                                     f"batch in {mode} mode, with no batch statistics in the forward: it mixes samples "
                                     "(a sort, a sum or a view across the batch axis), whatever the mode")
    else:
        status, message = "passed", (f"outputs in {mode} mode are reproducible and independent of the batch "
                                     f"(within the rounding tolerance {tolerance:.3g})")
    return EvalModeResult(status=status, message=message + sampling, training=training, has_dropout=dropout,
                          has_batchnorm=batchnorm, max_abs_diff=diff, batch_dependence_diff=batch_diff,
                          eval_abs_diff=eval_diff, ignores_eval=ignores_eval, tolerance=tolerance,
                          batch_statistics=statistics)  # fmt: skip


def _batch_statistics(model: nn.Module) -> bool:
    """Whether a batch-norm module normalises with the batch's statistics in the current
    mode: in train mode, or always when it keeps no running statistics."""
    return any(is_batchnorm(m) and (m.training or not getattr(m, "track_running_stats", True))
               for m in nn.Module.modules(model))  # fmt: skip


def _dropout_active(seen: ForwardObserver) -> bool:
    return any(p > 0 and training for p, training in seen.dropout_calls)


def _outputs(model: nn.Module, inputs: object, seed: int) -> list[torch.Tensor]:
    """The floating outputs of one forward under ``seed``: the same random draws every
    time, so that only a change of seed shows what randomness does."""
    seed_all(seed)
    # a scalar (a loss the model computed over the batch) says nothing per sample
    return [t.detach().float() for t in iter_tensors(forward(model, inputs)) if t.is_floating_point() and t.dim()]


def _max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    """Largest absolute difference, or None when the outputs cannot be lined up (an
    output that is not batch-first, whose first half is not the half batch's output)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    diffs = [float((x - y).abs().max()) for x, y in zip(a, b) if x.numel()]
    return max(diffs, default=0.0)


def _sample_axis(inputs: object, targets: object) -> int | None:
    """The inputs' axis that holds the samples: 0 when the targets say so (or there are
    none, an autoencoder's batch); the one axis of the targets' length when the batch is
    time-major ((time, batch, features) with a target per sample); None when the targets
    cannot line up with any (flattened per-position targets), so that a time axis is never
    halved as if it were the batch (a causal mask (T, T) halved with it breaks the model,
    and attention over a halved sequence is no batch statistic)."""
    first = next(iter_tensors(inputs), None)
    target = next(iter_tensors(targets), None) if targets is not None else None
    if first is None or first.dim() == 0:
        return None
    if target is None or target.dim() == 0 or target.shape[0] == first.shape[0]:
        return 0
    axes = [a for a in range(first.dim()) if first.shape[a] == target.shape[0]]
    return axes[0] if len(axes) == 1 else None


def _size(inputs: object, axis: int) -> int:
    return int(next(iter_tensors(inputs)).shape[axis])


def _first_half(inputs: object, axis: int) -> object | None:
    """The first half of the batch along ``axis``; None when the batch has < 4 samples, an
    input is not batched along it (a mask shared by the batch, a graph's edges) or relates
    the samples to each other (a dense adjacency): what halving those would do to the model
    is not the batch statistics' doing."""
    size = _size(inputs, axis)
    unbatched = any(t.dim() <= axis or t.shape[axis] != size or t.layout != torch.strided for t in iter_tensors(inputs))
    if size < 4 or unbatched or relates_samples(inputs, size):
        return None
    return map_tensors(inputs, lambda t: t.narrow(axis, 0, size // 2))


def _first_rows(outputs: list[torch.Tensor], axis: int, size: int) -> list[torch.Tensor]:
    """The half batch's part of each output: along the inputs' sample axis when the output
    has the batch there, else along its first axis if that has it; else the whole output
    (which then cannot line up with the half batch's)."""
    return [t.narrow(a, 0, size // 2) if (a := _axis_of(t, axis, size)) is not None else t for t in outputs]


def _axis_of(t: torch.Tensor, axis: int, size: int) -> int | None:
    return next((a for a in (axis, 0) if t.dim() > a and t.shape[a] == size), None)


SPEC = ProbeSpec(name="eval_mode", title=EvalModeResult.title, function=eval_mode_consistency,
                 result=EvalModeResult, order=30, needs_finite_parameters=True)  # fmt: skip

"""Eval-mode consistency probe: would evaluating the model as it is now be reproducible?

How to use::

    result = eval_mode_consistency(model, (x, y))   # targets are not used
    result.training, result.max_abs_diff, result.status

Two forwards of the same batch in the model's current mode, under ``no_grad``, on a
copy (batch-norm running statistics of the user's model never move) with the RNG
restored afterwards. Different outputs with dropout present mean dropout is active:
evaluating in this state gives noisy, pessimistic numbers — the forgotten
``model.eval()`` (EVAL_MODE_FORGOTTEN). Batch-norm in train mode gives the same output
twice for the same batch, so a second measurement runs the first half of the batch
alone: in train mode its outputs change because batch statistics do.

The copy is also run twice in eval mode: outputs that still differ mean a dropout that
ignores eval mode (``F.dropout(x, training=True)``), a bug whatever mode the user is in.

Status ``failed`` means the current mode is not fit for evaluation; whether that is a
bug depends on whether the user was evaluating, which ``training`` tells the rules.
"""

from __future__ import annotations

import torch
from torch import nn

from nndx.collector._common import Batch, forward, iter_tensors, map_tensors, preserved_rng, split_batch, working_copy
from nndx.collector.stats import has_batchnorm, has_dropout
from nndx.collector.probes import ProbeSpec
from nndx.report import EvalModeResult

# float32 noise between two runs of the same deterministic forward is exactly zero on
# CPU; the tolerance absorbs non-deterministic GPU kernels.
TOLERANCE = 1e-6


def eval_mode_consistency(model: nn.Module, batch: Batch) -> EvalModeResult:
    """Compare two forwards of the batch's inputs (and of its first half) in the current mode."""
    inputs, _ = split_batch(batch)
    training = model.training
    dropout, batchnorm = has_dropout(model), has_batchnorm(model)
    with preserved_rng(), torch.no_grad():
        model_copy = working_copy(model)
        first, second = _outputs(model_copy, inputs), _outputs(model_copy, inputs)
        diff = _max_abs_diff(first, second) or 0.0
        half = _first_half(inputs)
        batch_diff = None
        if half is not None:
            batch_diff = _max_abs_diff(_first_rows(first, _batch_size(half)), _outputs(model_copy, half))
        model_copy.eval()
        eval_diff = _max_abs_diff(_outputs(model_copy, inputs), _outputs(model_copy, inputs)) or 0.0
    mode = "train" if training else "eval"
    if eval_diff > TOLERANCE:
        status, message = "failed", (f"outputs differ by {eval_diff:.3g} between two forwards even in eval mode: "
                                     "a dropout or random op ignores model.eval() (e.g. F.dropout(x, training=True))")
    elif diff > TOLERANCE:
        status, message = "failed", (f"two forwards of the same batch in {mode} mode differ by {diff:.3g}: dropout "
                                     "is active; call model.eval() (and torch.no_grad()) before evaluating")
    elif batch_diff is not None and batch_diff > TOLERANCE:
        status, message = "failed", (f"outputs of the same samples change by {batch_diff:.3g} with the rest of the "
                                     f"batch in {mode} mode: batch-norm uses batch statistics; call model.eval()")
    else:
        status, message = "passed", f"outputs in {mode} mode are reproducible and independent of the batch"
    return EvalModeResult(status=status, message=message, training=training, has_dropout=dropout,
                          has_batchnorm=batchnorm, max_abs_diff=diff, batch_dependence_diff=batch_diff,
                          eval_abs_diff=eval_diff)  # fmt: skip


def _outputs(model: nn.Module, inputs: object) -> list[torch.Tensor]:
    return [t.detach().float() for t in iter_tensors(forward(model, inputs)) if t.is_floating_point()]


def _max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    """Largest absolute difference, or None when the outputs cannot be lined up (an
    output that is not batch-first, whose first half is not the half batch's output)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    diffs = [float((x - y).abs().max()) for x, y in zip(a, b) if x.numel()]
    return max(diffs, default=0.0)


def _batch_size(inputs: object) -> int | None:
    first = next(iter_tensors(inputs), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else None


def _first_half(inputs: object) -> object | None:
    """The first half of the batch along dim 0 (None when the batch has < 4 samples)."""
    size = _batch_size(inputs)
    if size is None or size < 4:
        return None
    if any(t.dim() == 0 or t.shape[0] != size for t in iter_tensors(inputs)):
        return None
    return map_tensors(inputs, lambda t: t[: size // 2])


def _first_rows(outputs: list[torch.Tensor], rows: int | None) -> list[torch.Tensor]:
    return [t[:rows] if t.dim() > 0 else t for t in outputs]


SPEC = ProbeSpec(name="eval_mode", title=EvalModeResult.title, function=eval_mode_consistency,
                 result=EvalModeResult, order=30, needs_finite_parameters=True)  # fmt: skip

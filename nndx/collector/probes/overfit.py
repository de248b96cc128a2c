"""Overfit-one-batch probe: can the model, its loss and its backward fit a single batch?

How to use::

    result = overfit_one_batch(model, (x, y), loss_fn)   # OverfitResult
    result.status, result.losses

A network that cannot drive the loss of one small batch near zero has a bug in its
architecture, loss or gradient path (Karpathy's "overfit one batch" recipe). Pass is
judged relative to the start — final loss under ``target_ratio`` (1%) of the initial
loss, or 100% accuracy on the batch for classification — not the absolute
``loss < 0.1``, which fails healthy regression targets of large scale.

It cannot detect misaligned labels: networks memorise random labels (Zhang et al.
2017, "Understanding deep learning requires rethinking generalization"), so a batch with
shuffled labels overfits just as well. The label-alignment probe
(:mod:`nndx.collector.probes.label_alignment`) tests that.

Runs on a deep copy with nndx's own Adam (the user's learning rate may be the bug), the
model kept in its current train/eval mode; the user's RNG is restored afterwards. A
float16 model trains as mixed precision does (float32 weights, float16 autocast).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    accuracy,
    compute_loss,
    forward,
    infer_task,
    preserved_rng,
    split_batch,
    train_in_float32,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.report import OverfitResult


def overfit_one_batch(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    steps: int = 300,
    lr: float = 1e-2,
    target_ratio: float = 0.01,
) -> OverfitResult:
    """Train a copy on ``batch`` for up to ``steps`` Adam steps; stop early on success."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    inputs, targets = split_batch(batch)
    task = infer_task(loss_fn, targets)
    losses: list[float] = []
    final_accuracy: float | None = None
    passed = False
    with preserved_rng():
        model_copy = working_copy(model)
        params = [p for p in model_copy.parameters() if p.requires_grad]
        if not params:
            return OverfitResult(status="failed", task=task, lr=lr,
                                 message="the model has no trainable parameters")  # fmt: skip
        precision = train_in_float32(model_copy)
        optimizer = torch.optim.Adam(params, lr=lr)
        for step in range(steps + 1):  # measure after each of the ``steps`` updates
            optimizer.zero_grad(set_to_none=True)
            with precision:
                output = forward(model_copy, inputs)
                loss = compute_loss(loss_fn, output, targets)
            losses.append(float(loss.detach()))
            if task == "classification":
                final_accuracy = accuracy(loss_fn, output, targets)
            if not math.isfinite(losses[-1]):
                break
            if _fits(losses, final_accuracy, target_ratio):
                passed = True
                break
            if step < steps:
                loss.backward()
                optimizer.step()
    initial, final = losses[0], losses[-1]
    if passed:
        status, message = "passed", f"fitted one batch in {len(losses) - 1} steps"
    elif not math.isfinite(final):
        status, message = "failed", f"loss became non-finite ({final}) at step {len(losses) - 1}"
    elif initial < 0:
        status, message = "skipped", "initial loss is negative: a relative criterion is undefined"
    else:
        status = "failed"
        message = (f"loss fell only to {final / initial:.3g} of its initial value in {steps} steps "
                   f"(target {target_ratio:g}); the model, loss or backward cannot fit one batch")  # fmt: skip
    return OverfitResult(status=status, message=message, task=task, steps=len(losses) - 1, lr=lr,
                         initial_loss=initial, final_loss=final, final_accuracy=final_accuracy,
                         losses=losses)  # fmt: skip


def _fits(losses: list[float], batch_accuracy: float | None, target_ratio: float) -> bool:
    if batch_accuracy == 1.0:
        return True
    initial, current = losses[0], losses[-1]
    return initial >= 0 and current <= target_ratio * initial


SPEC = ProbeSpec(name="overfit_one_batch", title=OverfitResult.title, function=overfit_one_batch,
                 result=OverfitResult, order=50, needs_finite_parameters=True, trains=True)  # fmt: skip

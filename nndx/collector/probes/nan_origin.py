"""NaN-origin probe: where does the first non-finite value appear?

How to use::

    result = nan_origin(model, (x, y), loss_fn)
    result.input_nonfinite_count, result.forward_module, result.backward_module

One forward and one backward on a copy, with a forward hook on every module (leaves
and containers). Forward hooks fire when a module finishes, so children report before
their parent: the first module in that order with a non-finite output is the innermost
one that produced it (a container is named only when its own code, between finite
children, made the value). In backward, ``backward_module`` is the first module — in
the order gradients arrive — whose output gradient is non-finite; the operation that
made it is the module (or loss) that consumed that output.

Non-finite inputs are counted first: NaN already in the data is a different cause
(NAN_IN_DATA) than NaN made by the model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    forward,
    iter_tensors,
    nonfinite_count,
    preserved_rng,
    split_batch,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.report import NanOriginResult


def _has_nonfinite(obj: object) -> bool:
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in iter_tensors(obj))


def nan_origin(model: nn.Module, batch: Batch, loss_fn: LossFn) -> NanOriginResult:
    """Find the first module whose output, and the first whose gradient, is non-finite."""
    inputs, targets = split_batch(batch)
    input_bad = nonfinite_count(inputs)
    target_bad = nonfinite_count(targets)
    forward_hit: list[tuple[str, str]] = []
    backward_hit: list[tuple[str, str]] = []
    with preserved_rng():
        model_copy = working_copy(model)

        def watch(name: str, module: nn.Module):
            def on_forward(_module: nn.Module, _inputs: object, output: object) -> None:
                if not forward_hit and _has_nonfinite(output):
                    forward_hit.append((name, type(module).__name__))
                for t in iter_tensors(output):
                    if t.requires_grad:
                        t.register_hook(on_grad)

            def on_grad(grad: torch.Tensor) -> None:
                if not backward_hit and not bool(torch.isfinite(grad).all()):
                    backward_hit.append((name, type(module).__name__))

            return on_forward

        handles = [m.register_forward_hook(watch(n or type(m).__name__, m)) for n, m in model_copy.named_modules()]
        try:
            loss = compute_loss(loss_fn, forward(model_copy, inputs), targets)
            loss_finite = math.isfinite(float(loss.detach()))
            if loss.requires_grad:
                loss.backward()
        finally:
            for h in handles:
                h.remove()
    fwd = forward_hit[0] if forward_hit else (None, None)
    bwd = backward_hit[0] if backward_hit else (None, None)
    problems = []
    if input_bad:
        problems.append(f"{input_bad} non-finite input values")
    if target_bad:
        problems.append(f"{target_bad} non-finite target values")
    if fwd[0] is not None:
        problems.append(f"first non-finite output in forward: {fwd[0]} ({fwd[1]})")
    if not loss_finite:
        problems.append("the loss is non-finite")
    if bwd[0] is not None:
        problems.append(f"first non-finite gradient in backward: output of {bwd[0]} ({bwd[1]})")
    return NanOriginResult(
        status="failed" if problems else "passed",
        message="; ".join(problems) if problems else "every output, the loss and every gradient are finite",
        input_nonfinite_count=input_bad + target_bad,
        loss_finite=loss_finite,
        forward_module=fwd[0], forward_module_type=fwd[1],
        backward_module=bwd[0], backward_module_type=bwd[1],
    )  # fmt: skip


SPEC = ProbeSpec(name="nan_origin", title=NanOriginResult.title, function=nan_origin, result=NanOriginResult, order=20)

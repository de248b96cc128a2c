"""NaN-origin probe: where does the first non-finite value appear?

How to use::

    result = nan_origin(model, (x, y), loss_fn)
    result.input_nonfinite_count, result.forward_module, result.backward_module

One forward and one backward on a copy. In forward, every module's output and every
op called by a module's own code (``torch.log``, ``x / x.std()``, ``torch.exp`` written
in ``forward``, seen through :class:`~nndx.collector.probes._observe.ForwardObserver`)
is checked as it is made, and then every op of the loss function (``forward_module``
"loss" when its code made the first one: an ``exp`` without the max subtracted): the first non-finite one names the module whose code made it
(``forward_module``) and, for functional code, the op (``forward_op``: ``log``,
``exp``, ``div``...). Forward hooks fire when a module finishes, so children report
before their parent: a container is named only when its own code made the value. In backward, ``backward_module`` is the first module — in
the order gradients arrive — whose output gradient is non-finite; the operation that
made it is the module (or loss) that consumed that output.

Non-finite inputs are counted first: NaN already in the data is a different cause
(NAN_IN_DATA) than NaN made by the model.

A non-finite value that reaches neither the loss nor any gradient is a mask, not a bug:
attention fills the scores it hides with ``-inf`` (``masked_fill(mask, float("-inf"))``)
and the softmax turns them into exact zeros. The probe then passes and its message names
where the masked values were made. The same holds for ``-inf`` passed in as an input (the
float causal mask of ``nn.Transformer.generate_square_subsequent_mask``): it is not
counted as non-finite data unless the loss or a gradient is non-finite.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    forward,
    has_nonfinite,
    iter_tensors,
    loss_name,
    nonfinite_count,
    preserved_rng,
    split_batch,
    stored_values,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._observe import ForwardObserver
from nndx.report import NanOriginResult


def nan_origin(model: nn.Module, batch: Batch, loss_fn: LossFn) -> NanOriginResult:
    """Find the first module whose output, and the first whose gradient, is non-finite."""
    inputs, targets = split_batch(batch)
    input_bad = nonfinite_count(inputs)
    target_bad = nonfinite_count(targets)
    backward_hit: list[tuple[str, str]] = []
    with preserved_rng():
        model_copy = working_copy(model)

        def watch(name: str, module: nn.Module):
            def on_forward(_module: nn.Module, _inputs: object, output: object) -> None:
                for t in iter_tensors(output):
                    if t.requires_grad:
                        t.register_hook(on_grad)

            def on_grad(grad: torch.Tensor | None) -> None:
                # None: an output the loss never reads (an LSTM's sequence when only its last state is used)
                if grad is not None and not backward_hit and not bool(torch.isfinite(grad).all()):
                    backward_hit.append((name, type(module).__name__))

            return on_forward

        handles = [m.register_forward_hook(watch(n or type(m).__name__, m)) for n, m in model_copy.named_modules()]
        try:
            with ForwardObserver(model_copy, nonfinite=True) as seen:
                output = forward(model_copy, inputs)
            in_loss = FirstNonfiniteOp()
            with in_loss:
                loss = compute_loss(loss_fn, output, targets)
            loss_finite = math.isfinite(float(loss.detach()))
            if loss.requires_grad:
                loss.backward()
        finally:
            for h in handles:
                h.remove()
    bwd = backward_hit[0] if backward_hit else (None, None)
    mask_note = ""
    minus_inf = _minus_inf_count(inputs) if input_bad else 0
    if input_bad and input_bad == minus_inf and loss_finite and bwd[0] is None:
        # nn.Transformer.generate_square_subsequent_mask: -inf where attention is hidden, passed
        # in as an input and added to the scores; the softmax turns it into exact zeros
        mask_note = f"; {input_bad} -inf input values reach neither the loss nor a gradient (an additive mask)"
        input_bad = 0
    fwd = seen.first_nonfinite or (None, None, None)
    if fwd[0] is None and in_loss.op is not None and not input_bad and not target_bad:
        # every module's output finite, the loss's own code made it: exp without the max
        # subtracted, log of a 0, a division by 0 written in a loss function
        fwd = ("loss", loss_name(loss_fn), in_loss.op)
    masked = ""
    if fwd[0] is not None and loss_finite and bwd[0] is None and not input_bad and not target_bad:
        masked = (f"; non-finite values made in {fwd[0]} ({fwd[1]})" + (f" by {fwd[2]}()" if fwd[2] else "")
                  + " reach neither the loss nor a gradient (a mask)")  # fmt: skip
        fwd = (None, None, None)
    problems = []
    if input_bad:
        problems.append(f"{input_bad} non-finite input values")
    if target_bad:
        problems.append(f"{target_bad} non-finite target values")
    if fwd[0] is not None:
        if fwd[0] == "loss":
            problems.append(f"every module's output is finite; the loss function ({fwd[1]}) made the first "
                            f"non-finite value, by {fwd[2]}()")  # fmt: skip
        else:
            problems.append(f"first non-finite output in forward: {fwd[0]} ({fwd[1]})"
                            + (f", made by {fwd[2]}() in its forward" if fwd[2] else ""))
    if not loss_finite:
        problems.append("the loss is non-finite")
    if bwd[0] is not None:
        problems.append(f"first non-finite gradient in backward: output of {bwd[0]} ({bwd[1]})")
    if problems:
        message = "; ".join(problems) + mask_note
    elif masked or mask_note:
        message = "the loss and every gradient are finite" + masked + mask_note
    else:
        message = "every output, the loss and every gradient are finite"
    return NanOriginResult(
        status="failed" if problems else "passed",
        message=message,
        input_nonfinite_count=input_bad + target_bad,
        input_minus_inf_count=minus_inf if input_bad else 0,
        loss_finite=loss_finite,
        forward_module=fwd[0], forward_module_type=fwd[1], forward_op=fwd[2],
        backward_module=bwd[0], backward_module_type=bwd[1],
    )  # fmt: skip


def _minus_inf_count(inputs: Any) -> int:
    """-inf elements of the floating input tensors that hold no other non-finite value."""
    count = 0
    for t in iter_tensors(inputs):
        if t.is_floating_point():
            values = stored_values(t)
            minus_inf = int((values == float("-inf")).sum())
            if minus_inf == int((~torch.isfinite(values)).sum()):
                count += minus_inf
    return count


class FirstNonfiniteOp(TorchFunctionMode):
    """Inside, the name of the first torch op that made a NaN/Inf from finite inputs (``op``)."""

    def __init__(self) -> None:
        super().__init__()
        self.op: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.op is None and has_nonfinite(out) and not has_nonfinite(args) and not has_nonfinite(kwargs or {}):
            self.op = getattr(func, "__name__", type(func).__name__)
        return out


SPEC = ProbeSpec(name="nan_origin", title=NanOriginResult.title, function=nan_origin, result=NanOriginResult, order=20,
                 needs_finite_parameters=True)  # fmt: skip

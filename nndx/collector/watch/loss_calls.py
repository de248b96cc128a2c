"""What reached the loss function: ``Monitor(..., loss_fn=...)`` wraps the loss as
``mon.loss_fn``, and each call's output and target shapes and dtypes are recorded, with
evidence of probabilities where logits belong (outputs in [0, 1] whose rows sum to one)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from nndx.collector._common import loss_name
from nndx.collector.watch.base import StepContext, Watcher
from nndx.report import LossCall

MAX_LOSS_SIGNATURES = 32


class LossCalls(Watcher):
    """One entry per distinct (loss type, shapes, dtypes) signature, at most
    ``MAX_LOSS_SIGNATURES``; the value evidence (min, max, rows summing to one) is
    measured on a signature's first call and on recorded steps."""

    name = "loss_calls"

    def __init__(self) -> None:
        self.calls: dict[tuple, dict[str, Any]] = {}

    def wrap(self, loss_fn: Callable[..., torch.Tensor], ctx: StepContext, guard: Callable) -> Callable[..., torch.Tensor]:
        """``loss_fn`` with each call recorded first; ``guard(source, fn)`` turns an
        exception of the recording into a report error."""
        loss_type = loss_name(loss_fn)
        observe = guard("loss_fn", lambda output, target: self.observe(ctx, loss_type, output, target))

        @functools.wraps(loss_fn)
        def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
            observe(args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("target"))
            return loss_fn(*args, **kwargs)

        return wrapped

    def observe(self, ctx: StepContext, loss_type: str, output: Any, target: Any) -> None:
        if not isinstance(output, torch.Tensor):
            return
        target_t = target if isinstance(target, torch.Tensor) else None
        key = (
            loss_type,
            tuple(output.shape),
            None if target_t is None else tuple(target_t.shape),
            str(output.dtype),
            None if target_t is None else str(target_t.dtype),
        )
        entry = self.calls.get(key)
        if entry is not None:
            entry["calls"] += 1
            if not ctx.recording:
                return
        elif len(self.calls) >= MAX_LOSS_SIGNATURES:
            return
        else:
            entry = self.calls[key] = {
                "loss_type": loss_type,
                "output_shape": list(output.shape),
                "target_shape": None if target_t is None else list(target_t.shape),
                "output_dtype": str(output.dtype).removeprefix("torch."),
                "target_dtype": None if target_t is None else str(target_t.dtype).removeprefix("torch."),
                "calls": 1,
            }
        if output.is_floating_point() and output.numel() > 0:
            evidence = value_evidence(output.detach(), None if target_t is None else target_t.detach())
            lo, hi, rows_off_one = evidence["output_min"], evidence["output_max"], evidence.pop("rows_off_one")
            entry.update(evidence)  # the newest measurement; the extremes over all of them
            entry["output_min"] = lo if entry.get("output_min") is None else min(entry["output_min"], lo)
            entry["output_max"] = hi if entry.get("output_max") is None else max(entry["output_max"], hi)
            if rows_off_one is not None:
                looks = lo >= 0.0 and hi <= 1.0 and rows_off_one < 1e-3
                entry["output_rows_sum_to_one"] = looks and entry.get("output_rows_sum_to_one", True) is not False

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"loss_calls": [LossCall(**entry) for entry in self.calls.values()]}}


def value_evidence(output: torch.Tensor, target: torch.Tensor | None) -> dict[str, Any]:
    """What a loss's inputs say about the model's last layer and the targets, with one
    host read: the outputs' extremes, the share of exact zeros (a ReLU on logits clips
    about half), the largest |row sum - 1| over the class axis (dim 1; None without one:
    probabilities where logits belong), and floating targets' mean and std."""
    x = output.float()
    lo, hi = torch.aminmax(x)
    parts = {"output_min": lo, "output_max": hi, "output_zero_fraction": (x == 0).float().mean()}
    if x.dim() >= 2 and x.shape[1] > 1:
        parts["rows_off_one"] = (x.sum(dim=1) - 1.0).abs().max()
    if target is not None and target.is_floating_point() and target.numel() > 1:
        t = target.float()
        parts["target_mean"], parts["target_std"] = t.mean(), t.std()
    values = dict(zip(parts, torch.stack(list(parts.values())).tolist()))
    values.setdefault("rows_off_one", None)
    return values

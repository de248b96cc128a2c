"""What reached the loss function: ``Monitor(..., loss_fn=...)`` wraps the loss as
``mon.loss_fn`` and records each call in a :class:`~nndx.collector.loss_call.LossCallLog`,
the same log the probes fill, so the loss-fit rules read one kind of evidence."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from nndx.collector._common import loss_name
from nndx.collector.loss_call import LossCallLog
from nndx.collector.watch.base import StepContext, Watcher


class LossCalls(Watcher):
    """The wrapped loss's calls, one entry per signature; the value evidence is measured
    on a signature's first call and on recorded steps."""

    name = "loss_calls"

    def __init__(self) -> None:
        self.log = LossCallLog()

    def wrap(self, loss_fn: Callable[..., torch.Tensor], ctx: StepContext, guard: Callable) -> Callable[..., torch.Tensor]:
        """``loss_fn`` with each call recorded first; ``guard(source, fn)`` turns an
        exception of the recording into a report error."""
        loss_type = loss_name(loss_fn)
        observe = guard("loss_fn", lambda output, target: self.log.add(
            loss_type, output, target, measure=ctx.recording, defer=ctx.defer.statistics,
            class_weight=getattr(loss_fn, "weight", None)))

        @functools.wraps(loss_fn)
        def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
            observe(args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("target"))
            return loss_fn(*args, **kwargs)

        return wrapped

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"loss_calls": self.log.records()}}

"""The static part of a report: what was trained (the model summary) and the run
(names, timestamps, torch version, device, dtype)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from nndx.collector.stats import summarize_model
from nndx.collector.watch.base import Watched, Watcher
from nndx.report import ModelSummary, RunInfo


class RunFacts(Watcher):
    """``report().run`` and ``report().model``. The model summary walks every module:
    a live window reuses the last one while the layers' forward order is unchanged."""

    name = "run"

    def __init__(self, watched: Watched, name: str | None, project: str | None, forward_order: Any) -> None:
        self.watched = watched
        self.run_name, self.project = name, project
        self.forward_order = forward_order  # () -> the layers' names in forward order, or None
        self.started_at = datetime.now(timezone.utc)
        self.finished_at: datetime | None = None
        self._summary: tuple[tuple[str, ...], ModelSummary] | None = None

    def close(self) -> None:
        self.finished_at = datetime.now(timezone.utc)

    def report(self, window: int | None) -> dict[str, Any]:
        first = next(nn.Module.parameters(self.watched.root), None)
        run = RunInfo(
            name=self.run_name,
            project=self.project,
            started_at=self.started_at,
            finished_at=self.finished_at,
            torch_version=torch.__version__,
            device=str(first.device) if first is not None else None,
            dtype=str(first.dtype).removeprefix("torch.") if first is not None else None,
        )
        return {"run": run, "model": self._model_summary(cached=window is not None)}

    def _model_summary(self, cached: bool) -> ModelSummary:
        order = tuple(self.forward_order() or ())
        if not (cached and self._summary is not None and self._summary[0] == order):
            self._summary = (order, summarize_model(self.watched.root, list(order) or None))
        return self._summary[1]

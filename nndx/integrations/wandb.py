"""Export nndx's series to Weights & Biases.

How to use::

    import wandb
    run = wandb.init(project="my-project")    # WANDB_MODE=offline works the same
    sink = WandbSink(run)                      # or WandbSink(wandb), the active run
    sink.log_step(step, {"loss/train": 0.7}, {"weights/fc.weight": fc.weight})
    export_report(sink, report)                # a finished report's whole series

Keys are ``nndx/<series>`` (names in :mod:`nndx.integrations._common`), each plotted
against its own step metric ``nndx/step`` (``run.define_metric``), so nndx's step
numbers never fight the step counter of the user's own ``run.log`` calls. The sink
does not finish the run: the run is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nndx.integrations._common import Histograms, export_report, finite_values, require

__all__ = ["WandbSink", "export_report"]


class WandbSink:
    """Logs scalars and histograms through a W&B run (``wandb.init()``'s result, or the
    ``wandb`` module itself, which logs to the active run)."""

    def __init__(self, run: Any, *, prefix: str = "nndx") -> None:
        if not (hasattr(run, "log") and hasattr(run, "define_metric")):
            raise TypeError(f"WandbSink needs a W&B run (the result of wandb.init()); got {type(run).__name__}")
        self.run = run
        self.prefix = prefix
        self.step_metric = f"{prefix}/step"
        run.define_metric(self.step_metric)
        run.define_metric(f"{prefix}/*", step_metric=self.step_metric)
        self._wandb: Any = None

    def log_step(self, step: int, scalars: Mapping[str, float], histograms: Histograms | None = None) -> None:
        payload: dict[str, Any] = {f"{self.prefix}/{name}": float(value) for name, value in scalars.items()}
        for name, values in (histograms or {}).items():
            finite, dropped = finite_values(values)
            if dropped:  # a histogram cannot hold NaN/Inf; keep how many there were
                payload[f"{self.prefix}/nonfinite_count/{name}"] = float(dropped)
            if finite.size:
                payload[f"{self.prefix}/{name}"] = self._histogram(finite)
        payload[self.step_metric] = step
        self.run.log(payload)

    def _histogram(self, values: Any) -> Any:
        if self._wandb is None:
            self._wandb = require("wandb", "wandb", "nndx's W&B export")
        return self._wandb.Histogram(values)

    def flush(self) -> None:
        """W&B streams on its own; nothing to flush."""

    def close(self) -> None:
        """The run stays open: the caller started it and finishes it."""

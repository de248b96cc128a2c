"""Integrations: put nndx where people already train.

- Exporters — :class:`~nndx.integrations.tensorboard.TensorBoardSink` and
  :class:`~nndx.integrations.wandb.WandbSink` write the Monitor's series (loss, global
  grad norm, per-layer dead-unit fraction, update ratio, histograms every N steps).
- Callbacks — ``nndx.integrations.lightning.NndxCallback`` (PyTorch Lightning) and
  ``nndx.integrations.hf.NndxCallback`` (Hugging Face ``Trainer``) attach a Monitor to
  the model and optimizer the framework builds and save ``nndx-report.json`` and
  ``nndx-diagnosis.json`` with the run's artefacts.

Every library here is an optional extra (``pip install 'nndx[tensorboard]'``,
``[wandb]``, ``[lightning]``, ``[hf]``). Importing this package or its modules never
needs them; using a part whose library is missing raises :class:`MissingExtraError`
naming the extra.

A Monitor uses the exporters through :class:`Exporter`::

    exporter = Exporter(make_sinks(tensorboard=writer, wandb=run), histogram_every=100)
    exporter.log_stats(step, layers=layer_stats, parameters=param_stats, model=model)
    exporter.log_loss(step, "train", 0.71)
    exporter.close()        # exporter.errors: what the sinks raised, as ErrorRecords
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nndx.integrations._common import (
    MissingExtraError,
    Sink,
    export_report,
    model_histograms,
    report_series,
    require,
    save_artifacts,
    step_scalars,
)
from nndx.report import ErrorRecord, LayerStats, ParameterStats

__all__ = [
    "Exporter",
    "MissingExtraError",
    "Sink",
    "export_report",
    "make_sinks",
    "model_histograms",
    "report_series",
    "require",
    "save_artifacts",
    "step_scalars",
]


def make_sinks(tensorboard: Any = None, wandb: Any = None) -> list[Sink]:
    """Sinks for what a Monitor was given: ``tensorboard`` a ``SummaryWriter`` or a log
    directory, ``wandb`` a W&B run (or the ``wandb`` module: the active run). An object
    that already is a sink is used as it is. None gives no sink."""
    sinks: list[Sink] = []
    if tensorboard is not None:
        from nndx.integrations.tensorboard import TensorBoardSink

        sinks.append(tensorboard if _is_sink(tensorboard) else TensorBoardSink(tensorboard))
    if wandb is not None:
        from nndx.integrations.wandb import WandbSink

        sinks.append(wandb if _is_sink(wandb) else WandbSink(wandb))
    return sinks


def _is_sink(obj: Any) -> bool:
    return callable(getattr(obj, "log_step", None))


class Exporter:
    """Fans a Monitor's measurements out to its sinks, every recorded step.

    A sink that raises (a full disk, a closed writer, a network error) must not crash
    the user's training: its exception becomes an :class:`ErrorRecord` in
    :attr:`errors` (source ``export:<SinkClass>``) and that sink is dropped, so one
    broken exporter costs one record, not one per step.
    """

    def __init__(self, sinks: Iterable[Sink], *, histogram_every: int = 100) -> None:
        if histogram_every < 0:
            raise ValueError(f"histogram_every must be >= 0 (0: never); got {histogram_every}")
        self.sinks = list(sinks)
        self.histogram_every = histogram_every
        self.errors: list[ErrorRecord] = []

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def log_stats(
        self,
        step: int,
        *,
        layers: Iterable[LayerStats] = (),
        parameters: Iterable[ParameterStats] = (),
        grad_norm: float | None = None,
        grad_norm_clipped: float | None = None,
        lrs: Iterable[float] | None = None,
        model: Any = None,
    ) -> None:
        """One recorded step's statistics; histograms of ``model`` when ``step`` is a
        multiple of ``histogram_every``."""
        if not self.sinks:
            return
        scalars = step_scalars(
            layers=layers, parameters=parameters, grad_norm=grad_norm, grad_norm_clipped=grad_norm_clipped, lrs=lrs
        )
        histograms = None
        if model is not None and self.histogram_every and step % self.histogram_every == 0:
            histograms = model_histograms(model)
        self._publish(step, scalars, histograms)

    def log_loss(self, step: int, split: str, value: float, accuracy: float | None = None) -> None:
        """A loss the training loop logged (it arrives after the step's statistics)."""
        if self.sinks:
            self._publish(step, step_scalars(losses={split: value}, accuracies={split: accuracy}), None)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if self.sinks:
            self._publish(step, scalars, None)

    def close(self) -> None:
        for sink in list(self.sinks):
            self._guard(sink, sink.close)
        self.sinks = []

    def _publish(self, step: int, scalars: Mapping[str, float], histograms: Mapping[str, Any] | None) -> None:
        for sink in list(self.sinks):
            self._guard(sink, lambda: sink.log_step(step, scalars, histograms))

    def _guard(self, sink: Sink, action: Any) -> None:
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - an exporter never stops training
            self.errors.append(ErrorRecord.of(f"export:{type(sink).__name__}", exc))
            if sink in self.sinks:
                self.sinks.remove(sink)

"""``nndx.Monitor``: the collector's Monitor wired to its sinks — live alerts (the rules
of :mod:`nndx.rules.live`) and, when given, TensorBoard / W&B exporters.

The collector knows no rules and no exporters; this layer, above both, connects them
as Monitor observers. How to use::

    with nndx.Monitor(model, optimizer, every=10, stop_on="error") as mon:
        ...                                   # the loop; see nndx.collector.monitor
    mon.findings                              # live findings, in firing order
    mon.check_now()                           # evaluate the live rules now

    mon = nndx.watch(model, optimizer)        # the same, without ``with``; call mon.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nndx.collector.monitor import Monitor as _CollectorMonitor
from nndx.integrations import Exporter, make_sinks
from nndx.report import Finding
from nndx.rules.live import LiveAlerts, TrainingFailure

__all__ = ["Monitor", "TrainingFailure", "watch"]


class _Export:
    """An observer writing each recorded step and logged loss to an Exporter's sinks."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    def on_step(self, monitor: _CollectorMonitor, step: int, recorded: bool) -> None:
        if not recorded:
            return
        layers = [r.model() for r in monitor.layers.latest() if r.step == step]
        params = [r.model() for r in monitor.parameters.latest() if r.step == step]
        if not (layers or params):
            return
        norm = monitor.ctx.total_grad_norm
        lrs = [float(g["lr"]) for o in monitor.watched.optimizers for g in o.param_groups]
        self.exporter.log_stats(step, layers=layers, parameters=params, grad_norm=None if norm is None else float(norm),
                                lrs=lrs, model=monitor.watched.root)  # fmt: skip

    def on_log(self, monitor: _CollectorMonitor, step: int, split: str, value: float, accuracy: float | None) -> None:
        self.exporter.log_loss(step, split, value, accuracy)

    def report(self, window: int | None) -> dict[str, Any]:
        return {"errors": list(self.exporter.errors)}

    def close(self) -> None:
        self.exporter.close()


class Monitor(_CollectorMonitor):
    """:class:`nndx.collector.monitor.Monitor` (same arguments) with live alerts and
    exporters.

    ``alert_every``: steps between live rule evaluations (default ``max(every, 10)``;
    0 disables them); ``on_finding``: called with each new live finding; ``stop_on``:
    "warning" or "error" — raise :class:`TrainingFailure` from ``optimizer.step()`` when
    a live finding of that severity fires. ``tensorboard`` (a ``SummaryWriter`` or log
    directory) / ``wandb`` (a W&B run): write each recorded step and logged loss there
    live, histograms every ``histogram_every`` steps (extras ``nndx[tensorboard]`` /
    ``nndx[wandb]``).
    """

    def __init__(
        self,
        *args: Any,
        on_finding: Callable[[Finding], None] | None = None,
        stop_on: str | None = None,
        alert_every: int | None = None,
        tensorboard: Any = None,
        wandb: Any = None,
        histogram_every: int = 100,
        **options: Any,
    ) -> None:
        alerts = LiveAlerts(0, on_finding=on_finding, stop_on=stop_on)  # checks stop_on before anything attaches
        super().__init__(*args, **options)
        alerts.alert_every = max(self.every, 10) if alert_every is None else int(alert_every)
        self.alerts = alerts
        self.observers.insert(0, alerts)
        if tensorboard is not None or wandb is not None:
            try:
                exporter = Exporter(make_sinks(tensorboard=tensorboard, wandb=wandb), histogram_every=histogram_every)
            except BaseException:
                self.close()
                raise
            if exporter:
                self.observers.append(_Export(exporter))

    @property
    def findings(self) -> list[Finding]:
        """Every live finding so far, in firing order (``.step``: when it first fired)."""
        return list(self.alerts.findings.values())

    def check_now(self) -> list[Finding]:
        """Evaluate the live rules on what was seen so far; returns the findings that are
        new since the last evaluation, each stamped with the step it first fired at.
        (Called every ``alert_every`` steps; callable by hand, e.g. with alert_every=0.)"""
        return self.alerts.check(self, max(self.steps - 1, 0))


def watch(*args: Any, **options: Any) -> Monitor:
    """Start watching a training loop, the function form of :class:`Monitor` (same
    arguments); call ``.close()`` when training ends, ``.report()`` any time."""
    return Monitor(*args, **options)

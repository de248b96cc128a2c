"""PyTorch Lightning: ``NndxCallback`` watches a ``Trainer.fit`` and saves nndx's report.

How to use::

    from nndx.integrations.lightning import NndxCallback

    trainer = pl.Trainer(callbacks=[NndxCallback(every=10, preflight=True)])
    trainer.fit(module, datamodule)
    # trainer.log_dir / nndx-report.json and nndx-diagnosis.json

What it does, hook by hook:

- first training batch (``on_train_batch_start``): with ``preflight=True``, runs
  :func:`nndx.probe` (every probe a batch allows; ``preflight_probes`` narrows it) once on that
  batch, on copies of the module and optimizer; then attaches a
  :class:`~nndx.collector.monitor.Monitor` to the ``LightningModule`` and
  ``trainer.optimizers[0]``. Attaching here rather than in ``on_fit_start`` keeps the
  sanity-check validation out of the training statistics.
- ``on_train_batch_end``: the training loss (``outputs["loss"]``).
- ``on_train_batch_end`` also: with ``stop_on="error"`` (or ``"warning"``), a live
  finding of that severity sets ``trainer.should_stop``, Lightning's graceful stop, so
  the fit still ends through ``on_fit_end`` and its report is saved.
- ``on_validation_end``: the validation loss, ``trainer.callback_metrics[val_loss_key]``
  (log it in ``validation_step`` with ``self.log("val_loss", loss)``).
- ``on_fit_end`` / ``on_exception``: closes the Monitor and saves
  ``nndx-report.json`` and ``nndx-diagnosis.json`` into ``save_dir``, else
  ``trainer.log_dir`` (the logger's version directory, or ``default_root_dir``). A run
  that crashed is saved too, with the exception in ``report.errors``. With
  ``log_to_logger=True`` the report's series (see :mod:`nndx.integrations`) are also
  written to the Trainer's own TensorBoard or W&B logger, under ``nndx/``.

The probes need a loss of (model output, targets): pass ``loss_fn`` (e.g.
``nn.CrossEntropyLoss()``) for a batch ``(x, y)`` and ``module(x)``. Without it they
use the module's own ``training_step`` as the loss, which works for any batch but
cannot run under manual optimization.

Importing this module needs no Lightning; ``NndxCallback`` is built on first use from
``pytorch_lightning`` (or the unified ``lightning`` package) and raises
``MissingExtraError`` naming ``nndx[lightning]`` when neither is installed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nndx.integrations._callback import PREFLIGHT_PROBES, TrainingSession, model_output_loss
from nndx.integrations._common import MissingExtraError, require

__all__ = ["NndxCallback"]

logger = logging.getLogger("nndx")


class _LightningHooks:
    """The callback's behaviour; combined with Lightning's ``Callback`` base in
    :func:`_callback_class`, so that this module imports without Lightning."""

    def __init__(
        self,
        *,
        every: int = 1,
        loss_fn: Callable[..., Any] | None = None,
        preflight: bool = False,
        preflight_probes: Sequence[str] | None = PREFLIGHT_PROBES,
        preflight_options: dict[str, dict[str, Any]] | None = None,
        val_loss_key: str = "val_loss",
        save_dir: str | Path | None = None,
        filename_prefix: str = "nndx",
        log_to_logger: bool = False,
        **monitor_options: Any,
    ) -> None:
        super().__init__()
        self.loss_fn = loss_fn
        self.log_to_logger = log_to_logger
        self.val_loss_key = val_loss_key
        self.save_dir = save_dir
        self._session_options = {
            "source": "lightning",
            "preflight": preflight,
            "preflight_probes": preflight_probes,
            "preflight_options": preflight_options,
            "monitor_options": {"every": every, **monitor_options},
            "filename_prefix": filename_prefix,
        }
        self.session = TrainingSession(**self._session_options)  # checks the options now, not mid-fit
        self._fitting = False  # validate()/test() runs are not recorded
        self._started = False
        self._warned_no_val_loss = False

    @property
    def report(self) -> Any:
        """The last fit's DiagnosticReport (None before a fit has ended)."""
        return self.session.report

    # -- Lightning hooks
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.session = TrainingSession(**self._session_options)  # a fresh record per fit
        self._fitting = True
        self._started = False
        self._warned_no_val_loss = False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        session = self.session
        if self._started or not self._fitting:
            return
        self._started = True
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        if session.preflight:
            if self.loss_fn is not None:
                session.run_preflight(pl_module, batch, self.loss_fn, optimizer, loaders=_loaders(trainer))
            else:
                session.run_preflight(training_step_view(pl_module), ((batch,), None), model_output_loss, optimizer,
                                      loaders=_loaders(trainer), labels=False)
        if optimizer is None:
            session.record_error("monitor", ValueError("the Trainer has no optimizer to watch"))
            return
        session.attach(pl_module, optimizer, name=type(pl_module).__name__)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if hasattr(loss, "numel") and loss.numel() == 1:
            self.session.log(loss, "train")
        if self.session.should_stop():
            trainer.should_stop = True  # Lightning's graceful stop: on_fit_end still runs

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.val_loss_key)
        if value is None and not self._warned_no_val_loss:
            self._warned_no_val_loss = True
            logger.warning("nndx: no %r in trainer.callback_metrics (logged: %s); the report will have no "
                           "validation loss — pass NndxCallback(val_loss_key=...)",
                           self.val_loss_key, sorted(trainer.callback_metrics))  # fmt: skip
        self.session.log(value, "val")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(trainer, failure=exception)

    def _finish(self, trainer: Any, failure: BaseException | None = None) -> None:
        if not self._fitting:
            return
        self._fitting = False
        if self.save_dir is not None:
            directory: Any = self.save_dir
        elif failure is not None and trainer.world_size > 1:
            # log_dir is a collective broadcast, which a failing process group may never finish
            directory = trainer.default_root_dir
        else:
            directory = trainer.log_dir
        self.session.finish(None, failure=failure)
        if not trainer.is_global_zero:
            return
        if self.log_to_logger:
            self.session.export(self._logger_sinks(trainer))
        self.session.save(directory)

    def _logger_sinks(self, trainer: Any) -> list[Any]:
        """Sinks over the Trainer's own TensorBoard / W&B loggers' experiments."""
        from nndx.integrations import make_sinks

        sinks: list[Any] = []
        for lightning_logger in trainer.loggers:
            try:
                experiment = lightning_logger.experiment
                if hasattr(experiment, "add_scalar"):
                    sinks += make_sinks(tensorboard=experiment)
                elif hasattr(experiment, "define_metric"):
                    sinks += make_sinks(wandb=experiment)
            except Exception as exc:  # noqa: BLE001
                self.session.report.errors.append(self.session.record_error("export", exc))
        if not sinks:
            error = ValueError("log_to_logger=True, but the Trainer has no TensorBoard or W&B logger")
            self.session.report.errors.append(self.session.record_error("export", error))
        return sinks


def training_step_view(pl_module: Any) -> Any:
    """A torch module that *is* ``pl_module``'s layers and whose forward is its
    ``training_step`` (returning the loss), so the probes can train and perturb it like
    any model, on their own copies.

    It shares, not copies, the module's parameter, buffer and sub-module dicts: parameter
    names stay those the Monitor reports, and a deep copy of the view copies those dicts
    once (one memo), together with the LightningModule it calls (whose ``__getstate__``
    drops the trainer).
    """
    view = _training_step_view_class()()
    view._parameters = pl_module._parameters
    view._buffers = pl_module._buffers
    view._modules = pl_module._modules
    view.training = pl_module.training
    object.__setattr__(view, "lightning_module", pl_module)  # not registered: no name prefix
    return view


@functools.cache
def _training_step_view_class() -> type:
    import torch

    class TrainingStepView(torch.nn.Module):
        def forward(self, batch: Any) -> Any:
            return model_output_loss(self.lightning_module.training_step(batch, 0))

    return TrainingStepView


@functools.cache
def _callback_class() -> type:
    try:
        base = require("pytorch_lightning", "lightning", "nndx's Lightning callback").Callback
    except MissingExtraError:
        try:
            base = require("lightning.pytorch", "lightning", "nndx's Lightning callback").Callback
        except MissingExtraError as exc:
            raise MissingExtraError(
                "nndx's Lightning callback needs PyTorch Lightning, which is not installed. "
                "Install it with: pip install 'nndx[lightning]'"
            ) from exc.__cause__
    doc = "Lightning callback: watch a fit with nndx's Monitor and save its report (see nndx.integrations.lightning)."
    return type("NndxCallback", (_LightningHooks, base), {"__module__": __name__, "__doc__": doc})


def __getattr__(name: str) -> Any:
    if name == "NndxCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _loaders(trainer: Any) -> list[Any]:
    """The Trainer's training DataLoader, then its first validation one (if any)."""
    loaders = []
    train = getattr(trainer, "train_dataloader", None)
    if train is not None:
        loaders.append(train)
        val = getattr(trainer, "val_dataloaders", None)
        val = val[0] if isinstance(val, (list, tuple)) and val else val
        if val is not None and not isinstance(val, (list, tuple)):
            loaders.append(val)
    return loaders

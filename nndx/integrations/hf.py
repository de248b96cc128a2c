"""Hugging Face ``Trainer``: ``NndxCallback`` watches ``trainer.train()`` and saves
nndx's report with the run's outputs.

How to use::

    from nndx.integrations.hf import NndxCallback

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
                      callbacks=[NndxCallback(every=10, preflight=True)])
    trainer.train()
    # args.output_dir / nndx-report.json and nndx-diagnosis.json

What it does, event by event:

- ``on_train_begin``: with ``preflight=True``, runs :func:`nndx.probe` (every probe
  a batch allows; ``preflight_probes`` narrows it) once, on copies, on the first
  ``per_device_train_batch_size`` samples of the training set collated by the
  Trainer's own collator; then attaches a :class:`~nndx.collector.monitor.Monitor` to
  the ``model`` and the torch optimizer inside the Trainer's (accelerate-wrapped)
  ``optimizer``.
- ``on_log``: the training loss (``logs["loss"]``, averaged by the Trainer over
  ``logging_steps``) and the evaluation loss (``logs["eval_loss"]``). The Trainer
  replaces NaN/Inf training losses before logging them unless
  ``TrainingArguments(logging_nan_inf_filter=False)``: set it to see them in the
  report (the Monitor still sees non-finite gradients and activations either way).
- ``on_step_end``: with ``stop_on="error"`` (or ``"warning"``), a live finding of that
  severity sets ``control.should_training_stop``: the Trainer stops after the step and
  still ends through ``on_train_end``, so the report is saved.
- ``on_train_end``: closes the Monitor and saves ``nndx-report.json`` and
  ``nndx-diagnosis.json`` into ``save_dir``, else ``args.output_dir`` (main process only).

The probes use the loss the model computes itself from the batch's ``labels``
(``output.loss``); pass ``loss_fn(output, labels)`` when the model does not compute it.
The Trainer has no exception event: a run that crashes before ``on_train_end`` saves no
report (call ``callback.finish(dir)`` in your ``except`` to keep what was seen).

Importing this module needs no transformers; ``NndxCallback`` is built on first use and
raises ``MissingExtraError`` naming ``nndx[hf]`` when transformers is not installed.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nndx.integrations._callback import PREFLIGHT_PROBES, TrainingSession, innermost_optimizer, model_output_loss
from nndx.integrations._common import require
from nndx.report import DiagnosticReport

__all__ = ["NndxCallback"]


class _TrainerHooks:
    """The callback's behaviour; combined with transformers' ``TrainerCallback`` in
    :func:`_callback_class`, so that this module imports without transformers."""

    def __init__(
        self,
        *,
        every: int = 1,
        loss_fn: Callable[..., Any] | None = None,
        preflight: bool = False,
        preflight_probes: Sequence[str] | None = PREFLIGHT_PROBES,
        preflight_options: dict[str, dict[str, Any]] | None = None,
        save_dir: str | Path | None = None,
        filename_prefix: str = "nndx",
        **monitor_options: Any,
    ) -> None:
        super().__init__()
        self.loss_fn = loss_fn
        self.save_dir = save_dir
        self._session_options = {
            "source": "hf",
            "preflight": preflight,
            "preflight_probes": preflight_probes,
            "preflight_options": preflight_options,
            "monitor_options": {"every": every, **monitor_options},
            "filename_prefix": filename_prefix,
        }
        self.session = TrainingSession(**self._session_options)  # checks the options now, not mid-run

    @property
    def report(self) -> DiagnosticReport | None:
        """The last training run's DiagnosticReport (None before it has ended)."""
        return self.session.report

    # -- TrainerCallback events
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session = self.session = TrainingSession(**self._session_options)
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if session.preflight and model is not None:
            try:
                batch = first_batch(kwargs.get("train_dataloader"), args.per_device_train_batch_size, model)
            except Exception as exc:  # noqa: BLE001 - no batch, no preflight; training goes on
                session.record_error("preflight", exc)
            else:
                labels = batch.get("labels") if isinstance(batch, dict) else None
                session.run_preflight(model, (batch, labels), self.loss_fn or model_output_loss,
                                      innermost_optimizer(optimizer))  # fmt: skip
        if model is None or optimizer is None:
            session.record_error("monitor", ValueError("the Trainer passed no model or optimizer to its callbacks"))
            return
        session.attach(model, optimizer, name=type(model).__name__)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session.should_stop():
            control.should_training_stop = True  # the Trainer's graceful stop: on_train_end still runs

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        if "loss" in logs:
            self.session.log(logs["loss"], "train")
        if "eval_loss" in logs:
            self.session.log(logs["eval_loss"], "val")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        directory = self.save_dir if self.save_dir is not None else args.output_dir
        self.finish(directory if state.is_world_process_zero else None)

    def finish(self, directory: str | Path | None) -> DiagnosticReport | None:
        """Close the Monitor and save the report into ``directory`` (None: do not save)."""
        return self.session.finish(directory)


def first_batch(dataloader: Any, size: int, model: Any) -> Any:
    """The first ``size`` training samples, collated by the Trainer's collator and moved
    to the model's device.

    Read from the dataset, not by iterating the dataloader: a fresh iterator would draw
    from the user's RNG (the shuffling sampler) and register with accelerate's gradient
    state, so training would no longer be what it is without nndx. Random augmentation
    in the dataset draws too, so the random state is restored afterwards.
    """
    if dataloader is None:
        raise ValueError("the Trainer passed no train_dataloader to its callbacks")
    dataset = getattr(dataloader, "dataset", None)
    collate = getattr(dataloader, "collate_fn", None)
    if dataset is None or collate is None:
        raise TypeError(f"cannot read samples from a {type(dataloader).__name__} without .dataset and .collate_fn")
    from nndx.collector._common import map_tensors, preserved_rng

    with preserved_rng():
        if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
            samples = [dataset[i] for i in range(min(size, len(dataset)))]
        else:  # an IterableDataset
            samples = list(itertools.islice(iter(dataset), size))
        if not samples:
            raise ValueError("the training set is empty")
        batch = collate(samples)
    if isinstance(batch, Mapping):  # a BatchEncoding is a UserDict: the probes call model(**dict)
        batch = dict(batch)
    device = next(model.parameters()).device
    return map_tensors(batch, lambda t: t.to(device))


@functools.cache
def _callback_class() -> type:
    base = require("transformers", "hf", "nndx's Hugging Face callback").TrainerCallback
    doc = "Hugging Face Trainer callback: watch training with nndx's Monitor and save its report (see nndx.integrations.hf)."
    return type("NndxCallback", (_TrainerHooks, base), {"__module__": __name__, "__doc__": doc})


def __getattr__(name: str) -> Any:
    if name == "NndxCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

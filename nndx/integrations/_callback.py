"""The framework-neutral half of the Lightning and Hugging Face callbacks.

A :class:`TrainingSession` does what both callbacks do — optionally run the preflight
probes on one batch, attach a Monitor to the model and optimizer the framework built,
take the losses the framework reports, and save ``nndx-report.json`` and
``nndx-diagnosis.json`` at the end — so each callback only translates its framework's
hooks into these calls.

Nothing here may break the user's training: a preflight, a Monitor or a save that
raises becomes an :class:`~nndx.report.ErrorRecord` in the saved report (a crash is
evidence), and training goes on. Stopping a doomed run (``stop_on=...``) goes through
the framework's own graceful stop, never an exception from inside its loop.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nndx.collector.merge import merge_monitor
from nndx.integrations._common import save_artifacts
from nndx.integrations.monitor import Monitor
from nndx.report import SEVERITY_ORDER, DiagnosticReport, ErrorRecord, Finding
from nndx.rules.live import TrainingFailure

logger = logging.getLogger("nndx")

# every probe a batch allows (None: nndx.probe's default set), so a framework run gets the
# same evidence as a loop that calls nndx.probe itself; a tuple narrows it
PREFLIGHT_PROBES: Sequence[str] | None = None
# samples read from each of the trainer's loaders for the data checks and label probes
DATA_SAMPLES = 2048


def model_output_loss(output: Any, targets: Any = None) -> Any:
    """The loss a model computed itself (``output.loss`` of a Hugging Face model given
    labels, ``output["loss"]``, or the output when it already is the loss): the
    ``loss_fn`` the probes call when the model owns its loss."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and hasattr(output, "dim") and output.dim() == 0:
        loss = output
    if loss is None:
        raise ValueError(
            "the model's output holds no loss (no .loss / ['loss']); pass loss_fn=... to NndxCallback "
            "or include the labels in the batch"
        )
    return loss


def innermost_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under framework wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer): hooks on a wrapper never fire, because the wrapper
    calls the inner optimizer's ``step``."""
    seen = set()
    while hasattr(optimizer, "optimizer") and id(optimizer) not in seen:
        seen.add(id(optimizer))
        optimizer = optimizer.optimizer
    return optimizer


class TrainingSession:
    """One training run seen by a framework callback.

    ``monitor_options`` go to :class:`~nndx.integrations.monitor.Monitor` (e.g.
    ``every=10``); ``preflight_options`` to :func:`nndx.probe`, keyed by probe name
    (e.g. ``{"overfit_one_batch": {"steps": 50}}``).

    ``stop_on`` ("warning" or "error") is not handed to the Monitor, whose
    ``TrainingFailure`` would escape from inside ``optimizer.step()``: the session
    collects the live findings of that severity instead, and the callback asks its
    framework to stop gracefully when :meth:`should_stop` says so, so the run still
    ends through its normal path and its report is saved.
    """

    def __init__(
        self,
        *,
        source: str,
        preflight: bool = False,
        preflight_probes: Sequence[str] | None = PREFLIGHT_PROBES,
        preflight_options: dict[str, dict[str, Any]] | None = None,
        monitor_options: dict[str, Any] | None = None,
        filename_prefix: str = "nndx",
    ) -> None:
        self.source = source
        self.preflight = preflight
        self.preflight_probes = None if preflight_probes is None else list(preflight_probes)
        self.preflight_options = dict(preflight_options or {})
        self.monitor_options = dict(monitor_options or {})
        self.stop_on = self.monitor_options.pop("stop_on", None)
        if self.stop_on not in (None, "warning", "error"):
            raise ValueError(f"stop_on must be None, 'warning' or 'error', got {self.stop_on!r}")
        self._user_on_finding = self.monitor_options.pop("on_finding", None)
        self.stop_findings: list[Finding] = []
        self._stop_recorded = False
        self.filename_prefix = filename_prefix
        self.monitor: Any = None
        self.preflight_report: DiagnosticReport | None = None
        self.errors: list[ErrorRecord] = []
        self.report: DiagnosticReport | None = None
        self.saved: tuple[Path, Path | None] | None = None

    # -- recording what went wrong, without raising into the training loop
    def record_error(self, what: str, exc: BaseException) -> ErrorRecord:
        record = ErrorRecord.of(f"{self.source}.{what}", exc)
        self.errors.append(record)
        logger.warning("nndx %s: %s failed with %s: %s (recorded in the report; training continues)",
                       self.source, what, type(exc).__name__, exc)  # fmt: skip
        return record

    # -- the run
    def run_preflight(self, model: Any, batch: Any, loss_fn: Callable[..., Any], optimizer: Any = None,
                      loaders: Sequence[Any] = (), labels: bool = True) -> None:  # fmt: skip
        """Run the preflight probes once, on copies (the probes never touch the model,
        optimizer or RNG). Call it before :meth:`attach`, so the Monitor's hooks do not
        see the probes' forwards. ``loaders``: the trainer's training DataLoader, then
        its validation one; a bounded sample of each becomes the probes' ``data`` (the
        data checks and the label probes), read without changing their shuffle order.
        ``labels=False``: the items' second part is not known to be what the model is
        trained to predict (no loss_fn: an autoencoder's digit labels), so only the inputs
        are checked."""
        if not self.preflight or self.preflight_report is not None:
            return
        try:
            from nndx.collector.probe import probe

            with warnings.catch_warnings():
                # a copy has no trainer: Lightning warns on every self.log() the probes trigger
                warnings.filterwarnings("ignore", message=r".*self\.log\(\)")
                self.preflight_report = probe(
                    model, batch, loss_fn, probes=self.preflight_probes, optimizer=optimizer,
                    data=self._data(loaders, labels), **self.preflight_options,
                )
        except Exception as exc:  # noqa: BLE001 - a preflight never stops training
            self.record_error("preflight", exc)

    def _data(self, loaders: Sequence[Any], labels: bool = True) -> tuple[Any, ...] | None:
        """``(X_train, y_train[, X_val, y_val])`` from the loaders, or None (recorded why)."""
        if not loaders or "data" in self.preflight_options:
            return None
        from nndx.collector.data import sample_arrays

        splits = []
        for loader, name in zip(loaders, ("train", "validation")):
            try:
                x, y = sample_arrays(loader, max_samples=DATA_SAMPLES, name=name)
            except Exception as exc:  # noqa: BLE001 - no data checks, never a stopped training
                self.record_error(f"data.{name}", exc)
                break
            if y is None:
                break
            splits += [x, y if labels else None]
        return tuple(splits) if splits else None

    def attach(self, model: Any, optimizer: Any, *, name: str | None = None) -> None:
        if self.monitor is not None:
            return
        try:
            options = {"name": name, **self.monitor_options, "on_finding": self._on_finding}
            self.monitor = Monitor(model, innermost_optimizer(optimizer), **options)
        except Exception as exc:  # noqa: BLE001
            self.record_error("monitor", exc)

    def _on_finding(self, finding: Finding) -> None:
        if self.stop_on is not None and SEVERITY_ORDER[finding.severity] >= SEVERITY_ORDER[self.stop_on]:
            self.stop_findings.append(finding)
        if self._user_on_finding is not None:
            self._user_on_finding(finding)

    def should_stop(self) -> bool:
        """True once a live finding of severity ``stop_on`` or worse has fired. The first
        time, the stop is recorded in the report (as the Monitor's TrainingFailure would
        be) and logged."""
        if not self.stop_findings:
            return False
        if not self._stop_recorded:
            self._stop_recorded = True
            failure = TrainingFailure(self.stop_findings)
            self.errors.append(ErrorRecord.of(f"{self.source}.stop_on", failure))
            logger.error("%s (stop_on=%r); asking the %s trainer to stop", failure, self.stop_on, self.source)
        return True

    def log(self, value: Any, split: str) -> None:
        if self.monitor is None or self.report is not None or value is None:
            return
        try:
            self.monitor.log(value, split=split)
        except Exception as exc:  # noqa: BLE001
            self.record_error(f"log_{split}", exc)

    def finish(self, directory: str | Path | None, *, failure: BaseException | None = None) -> DiagnosticReport:
        """Close the Monitor, build the run's report (preflight + what the Monitor saw +
        errors) and, with a directory, save it and its diagnosis there. Idempotent."""
        if self.report is not None:
            return self.report
        if failure is not None:
            self.record_error("training", failure)
        report = self.preflight_report or DiagnosticReport()
        if self.monitor is not None:
            try:
                self.monitor.close()
                watched = self.monitor.report()
                if self.preflight_report is None:
                    report = watched
                else:
                    merge_monitor(report, watched)
            except Exception as exc:  # noqa: BLE001
                self.record_error("report", exc)
        report.errors = [*report.errors, *self.errors]
        self.report = report
        if directory is not None:
            self.save(directory)
        return report

    def export(self, sinks: Sequence[Any]) -> None:
        """Write the finished report's series to ``sinks`` (e.g. the framework's own
        TensorBoard writer); a sink that raises is recorded in the report."""
        if self.report is None:
            raise RuntimeError("export() needs a finished run: call finish() first")
        from nndx.integrations import export_report

        for sink in sinks:
            try:
                export_report(sink, self.report)
            except Exception as exc:  # noqa: BLE001
                self.report.errors.append(self.record_error(f"export:{type(sink).__name__}", exc))

    def save(self, directory: str | Path) -> None:
        """Save the finished report and its diagnosis into ``directory``."""
        if self.report is None:
            raise RuntimeError("save() needs a finished run: call finish() first")
        try:
            self.saved = save_artifacts(self.report, directory, prefix=self.filename_prefix)
            logger.info("nndx: saved %s", ", ".join(str(p) for p in self.saved if p is not None))
        except Exception as exc:  # noqa: BLE001 - losing the report must not lose the run
            self.record_error("save", exc)

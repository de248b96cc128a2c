"""``nndx.probe``: run the active probes on a copy and collect one DiagnosticReport.

How to use::

    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer)
    report = nndx.probe(model, (x, y), loss_fn, probes=["grad_check", "nan_origin"],
                        grad_check={"mode": "elementwise"}, overfit_one_batch={"steps": 50})
    nndx.diagnose(report)

Every probe works on a copy of the model with the random state restored, so the
user's model, optimizer and RNG are exactly as before (tested). A probe that raises
(a dtype or device mismatch, an in-place op that breaks autograd...) becomes an
``ErrorRecord`` in ``report.errors`` and that probe's result has status ``error``: the
others still run, and the caller's process never crashes because of nndx. Warnings
torch raises while a probe runs (a loss broadcasting mismatched shapes) are recorded
the same way, once each, with the warning category as ``type``.

Per-probe options go in a keyword argument named after the probe, as a dict of the
probe function's keyword arguments (see ``nndx.collector.probes``, one module per
probe); an unknown one is a TypeError before anything runs.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    forward,
    infer_task,
    num_classes,
    optimizer_coverage,
    preserved_rng,
    split_batch,
    working_copy,
)
from nndx.collector.probes import ProbeSpec, specs
from nndx.collector.stats import has_batchnorm, has_dropout, summarize_model
from nndx.report import MAX_ERROR_MESSAGE, DiagnosticReport, ErrorRecord, LoopStats, RunInfo

# name -> spec of every probe, cheap first
PROBES: dict[str, ProbeSpec] = {spec.name: spec for spec in specs()}
MAX_WARNINGS = 20
# library housekeeping, not evidence about the user's training
IGNORED_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning, ImportWarning, ResourceWarning)
TORCH_DIR = os.path.dirname(torch.__file__)


def probe(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    probes: Sequence[str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    monitor: Any = None,
    data: Sequence[Any] | None = None,
    progress: bool = False,
    **options: dict[str, Any],
) -> DiagnosticReport:
    """Run the selected probes and return the report: by default every batch probe,
    and the data probes (label alignment) when ``data`` is given.

    ``optimizer`` is never stepped: it is checked for parameters it does not hold
    (``report.loop.params_not_in_optimizer``) and copied for the probes whose numbers
    depend on it (update/weight ratio, LR range). ``monitor`` is a
    :class:`nndx.collector.monitor.Monitor` whose ``report()`` is merged in; ``data`` is
    ``(X_train, y_train[, X_val, y_val])`` for :func:`nndx.collector.data.check_data` and
    the data probes (on the training split, for classification).
    """
    data_error = None
    if data is not None and (not isinstance(data, (tuple, list)) or len(data) not in (2, 4)):
        data_error = TypeError("data must be (X_train, y_train) or (X_train, y_train, X_val, y_val)")
    selected = _select(probes, data is not None and data_error is None)
    for name, given in options.items():
        if name not in PROBES:
            raise TypeError(f"unknown probe options {name!r}; options are keyed by probe name: {list(PROBES)}")
        PROBES[name].check_options(given)
    say = _progress_printer(progress)
    report = DiagnosticReport(run=_run_info(model), errors=[])
    guard = _Guard(report)

    guard.attempt("model", lambda: _describe_model(report, model, optimizer))
    guard.attempt("describe", lambda: _describe_task(report, model, batch, loss_fn))
    nonfinite = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    total = len(selected)
    for i, spec in enumerate(selected, start=1):
        head = f"[{i}/{total}] {spec.name}"
        if spec.needs == "data" and (data is None or data_error is not None):
            spec.store_status(report, "skipped", "needs the training data: pass data=(X_train, y_train)")
            say(f"{head} skipped (no data)")
            continue
        if nonfinite and spec.needs_finite_parameters:
            spec.store_status(report, "skipped", (
                f"{len(nonfinite)} parameter tensor(s) are already non-finite (first: {nonfinite[0]}); "
                "a diverged model says nothing about why it diverged: probe before training "
                "or from the last finite checkpoint"))
            say(f"{head} skipped (non-finite parameters)")
            continue
        say(f"{head} ...")
        started = time.perf_counter()
        ok, outcome = guard.attempt(spec.name, lambda: spec.call(model, batch, loss_fn, optimizer, data,
                                                                 options.get(spec.name, {})), warn=True)  # fmt: skip
        if not ok:
            spec.store_status(report, "error", outcome)
            say(f"{head} error: {outcome[:200]}")
            continue
        status = spec.store(report, outcome)
        say(f"{head} {status} ({time.perf_counter() - started:.1f}s)")
    if monitor is not None:
        guard.attempt("monitor", lambda: _merge_monitor(report, monitor.report()))
    if data is not None:
        say("data checks ...")
        if data_error is not None:
            guard.error("data", data_error)
        else:
            ok, checked = guard.attempt("data", lambda: _check_data(data, report))
            if ok:
                report.data = checked
    report.run.finished_at = datetime.now(timezone.utc)
    return report


class _Guard:
    """The one place where a probe that raises becomes evidence: an ``ErrorRecord`` in
    ``report.errors`` (and, for a probe, status ``error`` with the same message), never a
    crash of the caller. Warnings torch raises while a probe runs (a loss broadcasting
    mismatched shapes) are recorded the same way, once each, with the warning category
    as ``type``."""

    def __init__(self, report: DiagnosticReport) -> None:
        self.report = report
        self.warned: set[tuple[str, str]] = set()

    def error(self, source: str, exc: Exception) -> str:
        record = ErrorRecord.of(source, exc)
        self.report.errors.append(record)
        return f"{record.type}: {record.message}"

    def attempt(self, source: str, fn: Callable[[], Any], warn: bool = False) -> tuple[bool, Any]:
        """(True, what ``fn`` returned) or (False, the recorded error as text)."""
        try:
            if not warn:
                return True, fn()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    return True, fn()
                finally:
                    self._warnings(source, caught)
        except Exception as exc:  # noqa: BLE001 - a crash is evidence, never the user's crash
            return False, self.error(source, exc)

    def _warnings(self, source: str, caught: list[warnings.WarningMessage]) -> None:
        """Warnings of other libraries (a Lightning module's ``self.log`` outside a
        Trainer) say nothing about the training and are left out."""
        for w in caught:
            key = (w.category.__name__, str(w.message))
            if (issubclass(w.category, IGNORED_WARNINGS) or not str(w.filename).startswith(TORCH_DIR)
                    or key in self.warned or len(self.warned) >= MAX_WARNINGS):  # fmt: skip
                continue
            self.warned.add(key)
            self.report.errors.append(ErrorRecord(source=source, type=key[0], message=key[1][:MAX_ERROR_MESSAGE]))


def _select(probes: Sequence[str] | str | None, with_data: bool) -> list[ProbeSpec]:
    if probes is None:
        return [spec for spec in PROBES.values() if spec.needs == "batch" or with_data]
    if isinstance(probes, str):
        probes = [probes]
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ValueError(f"unknown probes {unknown}; choose from {list(PROBES)}")
    return [spec for spec in PROBES.values() if spec.name in probes]  # run in the cheap-first order, once each


def _progress_printer(enabled: bool) -> Callable[[str], None]:
    def say(text: str) -> None:
        if enabled:
            print(f"nndx: {text}", file=sys.stderr, flush=True)

    return say


def _run_info(model: nn.Module) -> RunInfo:
    first = next(model.parameters(), None)
    return RunInfo(
        started_at=datetime.now(timezone.utc),
        torch_version=torch.__version__,
        device=str(first.device) if first is not None else "cpu",
        dtype=str(first.dtype).removeprefix("torch.") if first is not None else None,
        seed=torch.initial_seed(),
    )


def _describe_model(report: DiagnosticReport, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Static facts: model summary and optimizer coverage."""
    report.model = summarize_model(model)
    loop = LoopStats(
        trainable_param_count=sum(p.numel() for p in model.parameters() if p.requires_grad),
        frozen_params=[n for n, p in model.named_parameters() if not p.requires_grad],
        has_dropout=has_dropout(model),
        has_batchnorm=has_batchnorm(model),
    )
    if optimizer is not None:
        loop.params_not_in_optimizer, loop.optimizer_params_not_in_model = optimizer_coverage(model, optimizer)
    report.loop = loop


def _describe_task(report: DiagnosticReport, model: nn.Module, batch: Batch, loss_fn: LossFn) -> None:
    """Task and number of classes, from the loss and one forward on a copy."""
    inputs, targets = split_batch(batch)
    report.task = infer_task(loss_fn, targets)
    with preserved_rng(), torch.no_grad():
        output = forward(working_copy(model), inputs)
    report.num_classes = num_classes(loss_fn, output) if report.task == "classification" else None


def _union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _merge_monitor(report: DiagnosticReport, watched: DiagnosticReport) -> None:
    """Fold a Monitor's report in: its loop, loss history and recorded steps are what the
    training run saw; the probes' own static facts fill what it left out."""
    if watched.loop is not None:
        loop = watched.loop
        if report.loop is not None:
            loop = loop.model_copy(update={
                "params_not_in_optimizer": _union(loop.params_not_in_optimizer, report.loop.params_not_in_optimizer),
                "frozen_params": _union(loop.frozen_params, report.loop.frozen_params),
                "has_dropout": loop.has_dropout or report.loop.has_dropout,
                "has_batchnorm": loop.has_batchnorm or report.loop.has_batchnorm,
                "trainable_param_count": loop.trainable_param_count or report.loop.trainable_param_count,
            })  # fmt: skip
        report.loop = loop
    for split, points in watched.loss_history.items():
        report.loss_history.setdefault(split, []).extend(points)
    # the probe measured the model as it is now, after the monitored steps: stamp its
    # records with the next step so they neither collide with nor precede the loop's
    seen = [r.step for r in (*watched.layers, *watched.parameters) if r.step is not None]
    now = max([watched.loop.steps if watched.loop else 0, *(s + 1 for s in seen)])
    probed = [r.model_copy(update={"step": now}) for r in report.layers]
    probed_params = [r.model_copy(update={"step": now}) for r in report.parameters]
    report.layers = watched.layers + probed
    report.parameters = watched.parameters + probed_params
    report.errors.extend(watched.errors)
    report.model = report.model or watched.model
    report.task = report.task or watched.task
    report.num_classes = report.num_classes if report.num_classes is not None else watched.num_classes
    if watched.run is not None and report.run is not None:
        report.run.name = report.run.name or watched.run.name
        report.run.project = report.run.project or watched.run.project
        report.run.started_at = watched.run.started_at or report.run.started_at


def _check_data(data: Sequence[Any], report: DiagnosticReport) -> Any:
    from nndx.collector.data import check_data  # numpy-only callers of check_data never load torch

    x_val, y_val = (data[2], data[3]) if len(data) == 4 else (None, None)
    return check_data(data[0], data[1], x_test=x_val, y_test=y_val, task=report.task, num_classes=report.num_classes)

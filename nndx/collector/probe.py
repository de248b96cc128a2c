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
probe function's keyword arguments (see ``PROBES``); an unknown one is a TypeError
before anything runs.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
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
from nndx.collector.eval_mode import eval_mode_consistency
from nndx.collector.gradcheck import grad_check
from nndx.collector.hooks import hook_statistics
from nndx.collector.lr_range import lr_range_test
from nndx.collector.merge import merge_monitor
from nndx.collector.nan_origin import nan_origin
from nndx.collector.overfit import overfit_one_batch
from nndx.collector.stats import has_batchnorm, has_dropout, summarize_model
from nndx.report import (
    DiagnosticReport,
    ErrorRecord,
    EvalModeResult,
    GradCheckResult,
    LabelAlignmentResult,
    LoopStats,
    LRRangeResult,
    NanOriginResult,
    OverfitResult,
    Probes,
    RunInfo,
)

# probe name -> (result model, probe function). Cheap probes first. Each function takes
# (model, batch[, loss_fn]) and keyword options; those with an ``optimizer`` keyword get
# the user's optimizer.
PROBES: dict[str, tuple[type | None, Callable[..., Any]]] = {
    "hooks": (None, hook_statistics),
    "nan_origin": (NanOriginResult, nan_origin),
    "eval_mode": (EvalModeResult, eval_mode_consistency),
    "grad_check": (GradCheckResult, grad_check),
    "overfit_one_batch": (OverfitResult, overfit_one_batch),
    "lr_range": (LRRangeResult, lr_range_test),
}
# probes whose answer is meaningless on a model whose weights are already NaN/Inf (a
# diverged run): every output is non-finite, so they would "diverge" at the smallest LR
# or fail the gradient check everywhere. nan_origin still runs: a parameter-free module
# before the first NaN weight (a standardisation dividing by a zero std) is still found.
NEED_FINITE_PARAMETERS = frozenset({"eval_mode", "grad_check", "overfit_one_batch", "lr_range"})
MAX_MESSAGE = 2000
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
    """Run the selected probes (all of ``PROBES`` by default) and return the report.

    ``optimizer`` is never stepped: it is checked for parameters it does not hold
    (``report.loop.params_not_in_optimizer``) and copied for the probes whose numbers
    depend on it (update/weight ratio, LR range). ``monitor`` is a
    :class:`nndx.collector.monitor.Monitor` whose ``report()`` is merged in; ``data`` is
    ``(X_train, y_train[, X_val, y_val])`` for :func:`nndx.collector.data.check_data` and,
    for classification, :func:`nndx.collector.label_alignment.label_alignment` on the
    training split.
    """
    selected = _select(probes)
    _check_options(options)
    say = _progress_printer(progress)
    report = DiagnosticReport(run=_run_info(model), errors=[])
    results: dict[str, Any] = {}

    def record_error(source: str, exc: Exception) -> str:
        report.errors.append(ErrorRecord.of(source, exc))
        return report.errors[-1].message

    warned: set[tuple[str, str]] = set()

    def record_warnings(source: str, caught: list[warnings.WarningMessage]) -> None:
        """A warning torch raises inside the model or loss is evidence too ("Using a target
        size that is different to the input size" is a silent broadcast); each is kept
        once. Warnings of other libraries (a Lightning module's ``self.log`` outside a
        Trainer) say nothing about the training and are left out."""
        for w in caught:
            key = (w.category.__name__, str(w.message))
            if (issubclass(w.category, IGNORED_WARNINGS) or not str(w.filename).startswith(TORCH_DIR)
                    or key in warned or len(warned) >= MAX_WARNINGS):  # fmt: skip
                continue
            warned.add(key)
            report.errors.append(ErrorRecord(source=source, type=key[0], message=key[1][:MAX_MESSAGE]))

    _describe(report, model, batch, loss_fn, optimizer, record_error)
    nonfinite = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    for i, name in enumerate(selected, start=1):
        result_type, run = PROBES[name]
        if nonfinite and name in NEED_FINITE_PARAMETERS:
            results[name] = result_type(status="skipped", message=(
                f"{len(nonfinite)} parameter tensor(s) are already non-finite (first: {nonfinite[0]}); "
                "a diverged model says nothing about why it diverged: probe before training "
                "or from the last finite checkpoint"))
            say(f"[{i}/{len(selected)}] {name} skipped (non-finite parameters)")
            continue
        say(f"[{i}/{len(selected)}] {name} ...")
        started = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    outcome = _call(run, model, batch, loss_fn, optimizer, options.get(name, {}))
                finally:
                    record_warnings(name, caught)
        except Exception as exc:  # noqa: BLE001 - a crash is evidence, never the user's crash
            message = record_error(name, exc)
            if result_type is not None:
                results[name] = result_type(status="error", message=f"{type(exc).__name__}: {message}")
            say(f"[{i}/{len(selected)}] {name} error: {type(exc).__name__}: {message[:200]}")
            continue
        if name == "hooks":
            report.layers, report.parameters, report.model = outcome.layers, outcome.parameters, outcome.model
            status = "done"
        else:
            results[name] = outcome
            status = outcome.status
        say(f"[{i}/{len(selected)}] {name} {status} ({time.perf_counter() - started:.1f}s)")
    if results:
        report.probes = Probes(**results)
    if monitor is not None:
        try:
            merge_monitor(report, monitor.report())
        except Exception as exc:  # noqa: BLE001
            record_error("monitor", exc)
    if data is not None:
        say("data checks ...")
        try:
            report.data = _check_data(data, report)
        except Exception as exc:  # noqa: BLE001
            record_error("data", exc)
        if report.task == "classification" and report.data is not None:
            # overfit-one-batch cannot see labels that do not belong to their inputs
            # (networks memorise random labels); real vs permuted labels on held-out data can
            say("label alignment ...")
            from nndx.collector.label_alignment import label_alignment

            try:
                alignment = label_alignment(data[0], data[1])
            except Exception as exc:  # noqa: BLE001
                alignment = LabelAlignmentResult(status="error", message=f"{type(exc).__name__}: {record_error('label_alignment', exc)}")
            report.probes = (report.probes or Probes()).model_copy(update={"label_alignment": alignment})
    report.run.finished_at = datetime.now(timezone.utc)
    return report


def _options_of(fn: Callable[..., Any]) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "optimizer"]  # fmt: skip


def _check_options(options: dict[str, Any]) -> None:
    """Fail before anything runs: a misspelt option must not become a probe 'error'."""
    for name, given in options.items():
        if name not in PROBES:
            raise TypeError(f"unknown probe options {name!r}; options are keyed by probe name: {list(PROBES)}")
        if not isinstance(given, dict):
            raise TypeError(f"options for {name} must be a dict of keyword arguments, got {type(given).__name__}")
        allowed = _options_of(PROBES[name][1])
        wrong = sorted(set(given) - set(allowed))
        if wrong:
            raise TypeError(f"{name} has no option(s) {wrong}; it takes {allowed}")


def _call(fn: Callable[..., Any], model: nn.Module, batch: Batch, loss_fn: LossFn,
          optimizer: torch.optim.Optimizer | None, options: dict[str, Any]) -> Any:  # fmt: skip
    parameters = inspect.signature(fn).parameters
    args = (model, batch, loss_fn) if "loss_fn" in parameters else (model, batch)
    kwargs = {**options, **({"optimizer": optimizer} if "optimizer" in parameters else {})}
    return fn(*args, **kwargs)


def _select(probes: Sequence[str] | str | None) -> list[str]:
    if probes is None:
        return list(PROBES)
    if isinstance(probes, str):
        probes = [probes]
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ValueError(f"unknown probes {unknown}; choose from {list(PROBES)}")
    return [p for p in PROBES if p in probes]  # run in the cheap-first order, once each


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


def _describe(report: DiagnosticReport, model: nn.Module, batch: Batch, loss_fn: LossFn,
              optimizer: torch.optim.Optimizer | None, record_error: Callable[[str, Exception], str]) -> None:  # fmt: skip
    """Static facts: model summary, task, classes, optimizer coverage. Each may fail alone."""
    try:
        report.model = summarize_model(model)
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
        loop = LoopStats(
            trainable_param_count=sum(p.numel() for p in model.parameters() if p.requires_grad),
            frozen_params=frozen,
            has_dropout=has_dropout(model),
            has_batchnorm=has_batchnorm(model),
        )
        if optimizer is not None:
            loop.params_not_in_optimizer, loop.optimizer_params_not_in_model = optimizer_coverage(model, optimizer)
        report.loop = loop
    except Exception as exc:  # noqa: BLE001
        record_error("model", exc)
    try:
        inputs, targets = split_batch(batch)
        report.task = infer_task(loss_fn, targets)
        with preserved_rng(), torch.no_grad():
            output = forward(working_copy(model), inputs)
        report.num_classes = num_classes(loss_fn, output) if report.task == "classification" else None
    except Exception as exc:  # noqa: BLE001
        record_error("describe", exc)


def _check_data(data: Sequence[Any], report: DiagnosticReport) -> Any:
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 4):
        raise TypeError("data must be (X_train, y_train) or (X_train, y_train, X_val, y_val)")
    from nndx.collector.data import check_data  # the data engineer's module; imported lazily

    x_val, y_val = (data[2], data[3]) if len(data) == 4 else (None, None)
    return check_data(data[0], data[1], x_test=x_val, y_test=y_val, task=report.task, num_classes=report.num_classes)

"""What every integration shares: the sink interface, the scalars derived from nndx's
measurements, writing a finished report's series, the clear "install the extra" error,
and saving a report + diagnosis next to a run's other artefacts.

The exporters (TensorBoard, W&B) are *sinks*: small objects with one method,
``log_step(step, scalars, histograms)``. The measurements are turned into scalars here,
once, so every sink shows the same series under the same names:

==============================  ====================================================
``loss/<split>``                 the loss the training loop logged (``train``, ``val``)
``accuracy/<split>``             when logged
``grad_norm``                    global L2 norm of all gradients, before clipping
``grad_norm_clipped``            after clipping, when the loop clipped
``lr/group<i>``                  learning rate of each optimizer param group
``dead_unit_fraction/<layer>``   units zero for every sample of the batch
``update_ratio/<parameter>``     ‖Δw‖ / ‖w‖ of the last optimizer step
==============================  ====================================================

Histograms (``weights/<parameter>``, ``grads/<parameter>``) come from
:func:`model_histograms`, which the caller runs only every N steps: it copies every
parameter to the host.
"""

from __future__ import annotations

import importlib
import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from nndx.errors import MissingExtraError
from nndx.report import DiagnosticReport, ErrorRecord, LayerStats, ParameterStats

if TYPE_CHECKING:
    from nndx.report import Diagnosis

Histograms = Mapping[str, Any]  # name -> array-like (list of floats, numpy array, tensor)


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the nndx extra
    that installs it, so the fix is in the message."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs the '{module.split('.')[0]}' package, which is not installed "
            f"({exc}). Install it with: pip install 'nndx[{extra}]'"
        ) from exc


@runtime_checkable
class Sink(Protocol):
    """Where a training run's nndx series go (a TensorBoard writer, a W&B run...).

    ``scalars`` map a series name (see the module docstring) to its value at ``step``;
    ``histograms`` map a name to the values to bin. Non-finite values are kept: a NaN
    loss is the datum that matters most.
    """

    def log_step(self, step: int, scalars: Mapping[str, float], histograms: Histograms | None = None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- scalars


def step_scalars(
    *,
    losses: Mapping[str, float] | None = None,
    accuracies: Mapping[str, float | None] | None = None,
    layers: Iterable[LayerStats] = (),
    parameters: Iterable[ParameterStats] = (),
    grad_norm: float | None = None,
    grad_norm_clipped: float | None = None,
    lrs: Iterable[float] | None = None,
) -> dict[str, float]:
    """The scalar series of one recorded step, from what the Monitor measured.

    ``grad_norm`` defaults to the global norm over ``parameters``' gradient norms
    (√Σ‖g‖²), which is what ``clip_grad_norm_`` computes and clips.
    """
    scalars: dict[str, float] = {}
    for split, value in (losses or {}).items():
        scalars[f"loss/{split}"] = float(value)
    for split, value in (accuracies or {}).items():
        if value is not None:
            scalars[f"accuracy/{split}"] = float(value)
    parameters = list(parameters)
    if grad_norm is None:
        grad_norms = [p.grad_norm for p in parameters if p.grad_norm is not None]
        if grad_norms:
            grad_norm = math.sqrt(sum(g * g for g in grad_norms))
    if grad_norm is not None:
        scalars["grad_norm"] = float(grad_norm)
    if grad_norm_clipped is not None:
        scalars["grad_norm_clipped"] = float(grad_norm_clipped)
    for group, lr in enumerate(lrs or ()):
        scalars[f"lr/group{group}"] = float(lr)
    for layer in layers:
        if layer.activation is not None:
            scalars[f"dead_unit_fraction/{layer.name}"] = layer.activation.dead_unit_fraction
    for param in parameters:
        if param.update_ratio is not None:
            scalars[f"update_ratio/{param.name}"] = param.update_ratio
    return scalars


def report_series(report: DiagnosticReport) -> dict[int, dict[str, float]]:
    """Every step's scalars in a finished report, in step order.

    Layer and parameter statistics without a step (a one-off probe) are placed at step 0.
    """
    losses: dict[int, dict[str, float]] = defaultdict(dict)
    accuracies: dict[int, dict[str, float | None]] = defaultdict(dict)
    for split, points in report.loss_history.items():
        for point in points:
            losses[point.step][split] = point.value
            accuracies[point.step][split] = point.accuracy
    layers: dict[int, list[LayerStats]] = defaultdict(list)
    for layer in report.layers:
        layers[layer.step or 0].append(layer)
    parameters: dict[int, list[ParameterStats]] = defaultdict(list)
    for param in report.parameters:
        parameters[param.step or 0].append(param)
    grad_norms: dict[int, tuple[float, float | None]] = {}
    lrs: dict[int, list[float]] = {}
    if report.loop is not None:
        grad_norms = {p.step: (p.before_clip, p.after_clip) for p in report.loop.grad_norm_history}
        lrs = {p.step: p.lrs for p in report.loop.lr_history}
    steps = sorted(set(losses) | set(layers) | set(parameters) | set(grad_norms) | set(lrs))
    series = {}
    for step in steps:
        before, after = grad_norms.get(step, (None, None))
        scalars = step_scalars(
            losses=losses.get(step),
            accuracies=accuracies.get(step),
            layers=layers.get(step, ()),
            parameters=parameters.get(step, ()),
            grad_norm=before,  # the loop's own record wins over the per-parameter estimate
            grad_norm_clipped=after,
            lrs=lrs.get(step),
        )
        if scalars:
            series[step] = scalars
    return series


def export_report(sink: Sink, report: DiagnosticReport) -> int:
    """Write a finished report's series to ``sink`` (e.g. a report loaded from JSON, or
    one the Monitor produced without a live sink). Returns the number of steps written."""
    series = report_series(report)
    for step, scalars in series.items():
        sink.log_step(step, scalars, None)
    sink.flush()
    return len(series)


# --------------------------------------------------------------------------- histograms


def model_histograms(model: Any) -> dict[str, Any]:
    """Weights and gradients of every trainable parameter of a torch model, as flat CPU
    tensors, named ``weights/<parameter>`` and ``grads/<parameter>``. A host copy of the
    whole model: call it every N steps, not every step."""
    histograms: dict[str, Any] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        histograms[f"weights/{name}"] = param.detach().reshape(-1).float().cpu()
        if param.grad is not None:
            histograms[f"grads/{name}"] = param.grad.detach().reshape(-1).float().cpu()
    return histograms


def finite_values(values: Any) -> tuple[Any, int]:
    """(finite values of ``values`` as a 1-D float64 numpy array, count of non-finite
    ones dropped): histogram binning is undefined on NaN/Inf."""
    import numpy as np

    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().float().cpu().numpy()
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = np.isfinite(array)
    return array[finite], int(array.size - finite.sum())


# --------------------------------------------------------------------------- a run's artefacts


def save_artifacts(report: DiagnosticReport, directory: str | os.PathLike[str], prefix: str = "nndx") -> tuple[Path, Path | None]:
    """Write ``<prefix>-report.json`` and ``<prefix>-diagnosis.json`` into ``directory``.

    The report is written first and atomically, so a failing rule engine never costs the
    measurements: its exception is recorded in the report (source ``diagnose``) and the
    diagnosis path returned is None.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    report_path = directory / f"{prefix}-report.json"
    diagnosis_path = directory / f"{prefix}-diagnosis.json"
    diagnosis: Diagnosis | None = None
    try:
        from nndx.rules import diagnose

        diagnosis = diagnose(report)
    except Exception as exc:  # noqa: BLE001 - the report must still be saved
        report = report.model_copy(
            update={"errors": [*report.errors, ErrorRecord.of("diagnose", exc)]}
        )
    _write_atomic(report_path, report.model_dump_json(indent=2))
    if diagnosis is None:
        return report_path, None
    _write_atomic(diagnosis_path, diagnosis.model_dump_json(indent=2))
    return report_path, diagnosis_path


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

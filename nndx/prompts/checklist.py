"""The pre-training checklist, each item marked from a report and its diagnosis.

The items are the report's own checks (data, output and loss, initialisation, layer
statistics, wiring, zero_grad, validation) and one item per probe, which the probe's
result model declares (``ProbeResult.checklist``): a new probe brings its item with it.

An item is
- ``failed`` when a finding of severity warning or above names one of the item's
  cause codes, when the item's own probe reported ``failed``, or when the numbers are
  a failure by definition (a non-finite loss fails "no NaN/Inf");
- ``passed`` when the report holds the item's evidence and nothing failed it;
- ``not run`` when the report holds no evidence for it (a probe that errored or was
  skipped counts as not run, with its message): absence of evidence is never a pass.

Each cause code belongs to at most one item, so one finding fails one item; findings
whose code no item covers are listed separately by the template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal, NamedTuple

from nndx.prompts.evidence import latest_by_name, names_text
from nndx.report import (
    SEVERITY_ORDER,
    CauseCode,
    Diagnosis,
    DiagnosticReport,
    Finding,
    ProbeResult,
    Probes,
)
from nndx.views.text import num

CheckStatus = Literal["passed", "failed", "not run"]


@dataclass(frozen=True)
class CheckItem:
    key: str
    title: str
    how: str
    status: CheckStatus = "not run"
    detail: str = ""
    findings: tuple[str, ...] = ()


class Measured(NamedTuple):
    """What the report holds for an item. ``counts``: the detail is evidence enough to
    pass the item; ``failed``: the numbers alone fail it (non-finite values are a fact,
    not a threshold, so no rule is needed to call them a failure)."""

    detail: str
    counts: bool = True
    failed: bool = False


@dataclass(frozen=True)
class _ItemSpec:
    key: str
    title: str
    how: str
    codes: frozenset[CauseCode] = field(default_factory=frozenset)
    probe: str | None = None  # the field of report.probes whose result settles the item
    evidence: Callable[[DiagnosticReport], Measured | None] | None = None  # None: not measured


def _codes(*names: str) -> frozenset[CauseCode]:
    return frozenset(CauseCode(n) for n in names)


def _data_evidence(report: DiagnosticReport) -> Measured | None:
    data = report.data
    if data is None or data.train is None:
        return None
    t = data.train
    parts = [
        f"{t.n_samples} training samples",
        f"input NaN/Inf {t.input_nan_count}/{t.input_inf_count}",
        f"label NaN/Inf {t.label_nan_count}/{t.label_inf_count}",
        f"input mean {num(t.input_mean)}, std {num(t.input_std)}",
        f"duplicates {t.duplicate_count}",
    ]
    if t.imbalance_ratio is not None:
        parts.append(f"imbalance {num(t.imbalance_ratio)}:1")
    if data.test is not None:
        parts.append(f"test rows also in train {data.train_test_overlap}")
    nonfinite = t.input_nan_count + t.input_inf_count + t.label_nan_count + t.label_inf_count
    return Measured(", ".join(parts), failed=nonfinite > 0)


def _output_loss_evidence(report: DiagnosticReport) -> Measured | None:
    parts = []
    if report.loop and report.loop.loss_calls:
        c = report.loop.loss_calls[0]
        target = "×".join(map(str, c.target_shape)) if c.target_shape is not None else "none"
        parts.append(f"{c.loss_type} on output {'×'.join(map(str, c.output_shape)) or 'scalar'} "
                     f"({c.output_dtype or '?'}), target {target} ({c.target_dtype or '?'})")  # fmt: skip
    if report.model is not None and report.model.last_layer:
        parts.append(f"last layer {report.model.last_layer}, output activation "
                     f"{report.model.output_activation or 'none'}")  # fmt: skip
    return Measured("; ".join(parts)) if parts else None


def _initial_loss(report: DiagnosticReport) -> tuple[str, float] | None:
    """(what it is, value): the first training loss; without a loss history, the loss
    before the overfit probe (the model's initial loss when probed before training)."""
    train = report.loss_history.get("train")
    if train:
        return f"first training loss (step {train[0].step})", train[0].value
    overfit = report.probes.overfit_one_batch if report.probes else None
    if overfit is not None and overfit.initial_loss is not None:
        return "loss before the overfit probe", overfit.initial_loss
    return None


def _init_evidence(report: DiagnosticReport) -> Measured | None:
    initial = _initial_loss(report)
    if initial is None:
        return None
    what, loss = initial
    text = f"{what} {num(loss)}"
    if report.task == "classification" and report.num_classes and report.num_classes > 1:
        # A classifier that starts at uniform predictions has loss ln(C).
        text += f" (ln {report.num_classes} = {num(math.log(report.num_classes))})"
    return Measured(text, failed=not math.isfinite(loss))


def _hooks_evidence(report: DiagnosticReport) -> Measured | None:
    layers = latest_by_name(report.layers)
    if not layers:
        return None
    with_act = [layer for layer in layers if layer.activation is not None]
    with_grad = [layer for layer in layers if layer.gradient is not None]
    step = max((layer.step or 0) for layer in layers)
    parts = [f"{len(layers)} layers at step {step}"]
    if with_act:
        worst = max(with_act, key=lambda layer: layer.activation.dead_unit_fraction)
        parts.append(f"max dead-unit fraction {num(worst.activation.dead_unit_fraction)} ({worst.name})")
        parts.append(f"non-finite activations {sum(layer.activation.nonfinite_count for layer in with_act)}")
    if with_grad:
        means = [layer.gradient.abs_mean for layer in with_grad]
        parts.append(f"gradient abs-mean {num(min(means))} … {num(max(means))}")
        parts.append(f"non-finite gradients {sum(layer.gradient.nonfinite_count for layer in with_grad)}")
    return Measured(", ".join(parts))


def _wiring_evidence(report: DiagnosticReport) -> Measured | None:
    loop = report.loop
    if loop is None or loop.steps == 0:
        return None
    return Measured(f"not in optimizer: {names_text(loop.params_not_in_optimizer)}; "
            f"grad stayed None: {names_text(loop.params_grad_none)}; "
            f"frozen: {names_text(loop.frozen_params)}")  # fmt: skip


def _zero_grad_evidence(report: DiagnosticReport) -> Measured | None:
    loop = report.loop
    if loop is None or loop.steps == 0:
        return None
    return Measured(f"zero_grad {loop.zero_grad_calls} calls for {loop.steps} optimizer steps, "
                    f"{loop.backward_calls} backward calls")


def _eval_evidence(report: DiagnosticReport) -> Measured | None:
    # Zero such forwards proves nothing (the loop may never have evaluated), so this
    # detail never passes the item on its own; the eval-mode probe does.
    loop = report.loop
    if loop is None or loop.no_grad_forwards_in_train_mode == 0:
        return None
    return Measured(f"no-grad forwards while model.training: {loop.no_grad_forwards_in_train_mode}", counts=False)


def _nonfinite_evidence(report: DiagnosticReport) -> Measured | None:
    parts = []
    total = 0
    for split, points in report.loss_history.items():
        bad = [p for p in points if not math.isfinite(p.value)]
        total += len(bad)
        if points:
            parts.append(f"{split} loss non-finite {len(bad)} of {len(points)}"
                         + (f" (first at step {bad[0].step})" if bad else ""))  # fmt: skip
    layers = latest_by_name(report.layers)
    if layers:
        count = sum((layer.activation.nonfinite_count if layer.activation else 0)
                    + (layer.gradient.nonfinite_count if layer.gradient else 0) for layer in layers)  # fmt: skip
        parts.append(f"non-finite activations+gradients {count}")
        total += count
    return Measured(", ".join(parts), failed=total > 0) if parts else None


def _validation_evidence(report: DiagnosticReport) -> Measured | None:
    splits = [s for s, points in report.loss_history.items() if s != "train" and points]
    if not splits:
        return None
    parts = []
    for split in sorted(splits):
        points = report.loss_history[split]
        finite = [p for p in points if math.isfinite(p.value)]
        best = min(finite, key=lambda p: p.value) if finite else None
        parts.append(f"{split} loss {num(points[0].value)} → {num(points[-1].value)}"
                     + (f" (min {num(best.value)} at step {best.step})" if best else ""))  # fmt: skip
    return Measured(", ".join(parts))


def _intervention_evidence(report: DiagnosticReport) -> Measured | None:
    """The baseline twin and what each remedy changed; a confirmed remedy fails the item
    (its cause's own item fails too, through the finding the rules weigh by it)."""
    iv = report.interventions
    if iv is None:
        return None
    if iv.status != "done" or (iv.baseline_initial_loss is None and not iv.results):
        return Measured(f"{iv.status if iv.status != 'done' else 'nothing run'}: {iv.message}", counts=False)
    confirmed = [r for r in iv.results if r.status == "confirmed"]
    parts = [f"baseline loss {num(iv.baseline_initial_loss)} → {num(iv.baseline_final_loss)} in {iv.steps} steps"]
    parts += [f"confirmed {r.cause} ({r.remedy}: loss {num(r.remedied_initial_loss)} → "
              f"{num(r.remedied_final_loss)} with it, {num(r.baseline_initial_loss)} → "
              f"{num(r.baseline_final_loss)} without)" for r in confirmed]  # fmt: skip
    if not iv.results:
        parts.append("no remedy needed")
    elif not confirmed:
        parts.append(f"{len(iv.results)} remedies tried, none confirmed")
    return Measured(", ".join(parts), failed=bool(confirmed))


# the report's own checks, before and after the probes' items
BEFORE_PROBES: tuple[_ItemSpec, ...] = (
    _ItemSpec("data",
              "Data checked: no NaN/Inf, inputs normalised, no duplicates or train/test leakage, classes balanced",
              "nndx.check_data(x, y, x_test=..., y_test=...)",
              _codes("NAN_IN_DATA", "UNNORMALIZED_INPUTS", "UNNORMALIZED_TARGETS", "DATA_LEAKAGE",
                     "DUPLICATE_SAMPLES", "CLASS_IMBALANCE", "UNSHUFFLED_DATA", "SILENT_DATA_LOSS",
                     "BATCH_TOO_SMALL"),
              evidence=_data_evidence),
    _ItemSpec("output_loss", "Output layer, loss and label encoding match the task",
              "raw logits into CrossEntropyLoss with int64 class indices; no softmax before it; "
              "output and target shapes equal for regression",
              _codes("WRONG_OUTPUT_ACTIVATION", "WRONG_LOSS", "DOUBLE_SOFTMAX", "LABEL_DTYPE", "SHAPE_BROADCAST"),
              evidence=_output_loss_evidence),
    _ItemSpec("init", "Initialisation sane: initial loss near ln(classes), non-linearities between layers",
              "compare the first loss with ln(number of classes); check the model summary",
              _codes("BAD_INIT", "MISSING_ACTIVATION"), evidence=_init_evidence),
)
AFTER_PROBES: tuple[_ItemSpec, ...] = (
    _ItemSpec("hooks", "Activation and gradient statistics healthy in every layer",
              "forward/backward hooks: dead units, saturation, gradient size per layer",
              _codes("DEAD_RELU", "VANISHING_GRADIENTS", "EXPLODING_GRADIENTS", "SATURATED_ACTIVATIONS"),
              evidence=_hooks_evidence),
    _ItemSpec("wiring", "Every trainable parameter is in the optimizer and receives a gradient",
              "compare model.parameters() with the optimizer's param groups; check .grad after backward",
              _codes("OPTIMIZER_NOT_CONNECTED", "DETACHED_GRAPH", "FROZEN_PARAMETERS"),
              evidence=_wiring_evidence),
    _ItemSpec("zero_grad", "optimizer.zero_grad() once per step (accumulated losses divided by micro-batches)",
              "count zero_grad() against optimizer.step() calls",
              _codes("MISSING_ZERO_GRAD", "GRAD_ACCUM_SCALING"), evidence=_zero_grad_evidence),
    _ItemSpec("validation", "Validation loss tracked alongside training loss",
              "log a held-out split every epoch; compare it with train",
              _codes("OVERFITTING", "UNDERFITTING"), evidence=_validation_evidence),
    _ItemSpec("interventions", "A short run of the setup as given learns on one batch (else: which remedy makes it learn)",
              "nndx.probe runs it last: the setup trained from its initial state beside copies with one remedy each",
              evidence=_intervention_evidence),
)
# what the report measures besides the probe for a probe's item, by the item's key
EXTRA_EVIDENCE: dict[str, Callable[[DiagnosticReport], Measured | None]] = {
    "eval_mode": _eval_evidence,
    "nonfinite": _nonfinite_evidence,
}


def _probe_item(name: str, result_type: type[ProbeResult]) -> _ItemSpec:
    item = result_type.checklist
    if item is None:
        raise TypeError(f"{result_type.__name__} declares no checklist item")
    return _ItemSpec(item.key, item.title, item.how, _codes(*item.codes), probe=name,
                     evidence=EXTRA_EVIDENCE.get(item.key))  # fmt: skip


ITEMS: tuple[_ItemSpec, ...] = (
    *BEFORE_PROBES,
    *(_probe_item(name, result_type) for name, result_type in Probes.result_types().items()),
    *AFTER_PROBES,
)

COVERED_CODES: frozenset[CauseCode] = frozenset().union(*(spec.codes for spec in ITEMS))


def _is_alarm(finding: Finding) -> bool:
    return SEVERITY_ORDER[finding.severity] >= SEVERITY_ORDER["warning"]


def _mark(spec: _ItemSpec, report: DiagnosticReport, diagnosis: Diagnosis) -> CheckItem:
    failing = [f for f in diagnosis.findings if _is_alarm(f) and f.code in spec.codes]
    details = []
    measured_failed = False
    ran = False
    result = getattr(report.probes, spec.probe) if spec.probe is not None and report.probes is not None else None
    if result is not None:
        if result.status in ("passed", "failed"):
            ran = True
            measured_failed = result.status == "failed"
            details.append(result.summary(num))
        else:
            details.append(f"probe {result.status}" + (f": {result.message}" if result.message else ""))
    if spec.evidence is not None:
        measured = spec.evidence(report)
        if measured is not None:
            ran = ran or measured.counts
            measured_failed = measured_failed or measured.failed
            details.append(measured.detail)
    if failing or measured_failed:
        status: CheckStatus = "failed"
    elif ran:
        status = "passed"
    else:
        status = "not run"
    return CheckItem(spec.key, spec.title, spec.how, status, "; ".join(details),
                     tuple(f"{f.rule_id} ({f.code.value})" for f in failing))  # fmt: skip


def build_checklist(report: DiagnosticReport | None, diagnosis: Diagnosis | None) -> list[CheckItem]:
    """Every checklist item, marked from the report (all ``not run`` without one)."""
    if report is None:
        return [CheckItem(spec.key, spec.title, spec.how) for spec in ITEMS]
    return [_mark(spec, report, diagnosis or Diagnosis()) for spec in ITEMS]


def uncovered_findings(diagnosis: Diagnosis | None) -> list[Finding]:
    """Alarms whose cause code no checklist item covers (shown after the list)."""
    if diagnosis is None:
        return []
    return [f for f in diagnosis.findings if _is_alarm(f) and f.code not in COVERED_CODES]

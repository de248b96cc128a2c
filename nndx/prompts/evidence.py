"""The measured evidence of a report as Markdown tables, ready for the templates.

Each function takes the report and returns Markdown (built with ``markdown.table``, so
every cell is escaped) or ``""`` when the report holds no such evidence; the templates
decide what to say about missing evidence. Nothing here judges the numbers: that is the
rule engine's job, and a second set of thresholds here would contradict it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nndx.prompts.markdown import fence, table, value_text
from nndx.report import (
    DiagnosticReport,
    Finding,
    LayerStats,
    LossPoint,
    ParameterStats,
    Probes,
    SplitStats,
)
from nndx.views.text import MISSING, num

MAX_LAYER_ROWS = 60
MAX_NAMES = 8
MAX_ERRORS = 20
MAX_MESSAGE_CHARS = 2000


def names_text(names: Sequence[str]) -> str:
    """A short list of names (unescaped): ``a, b, c … (12 in all)``."""
    if not names:
        return "none"
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" … ({len(names)} in all)" if len(names) > MAX_NAMES else "")


def _split_order(splits: Sequence[str]) -> list[str]:
    known = {"train": 0, "val": 1, "validation": 1, "test": 2}
    return sorted(splits, key=lambda s: (known.get(s, 3), s))


def loss_summary_rows(history: dict[str, list[LossPoint]]) -> list[list[str]]:
    rows = []
    for split in _split_order(list(history)):
        points = history[split]
        if not points:
            rows.append([split, "0", MISSING, MISSING, MISSING, MISSING, "0", MISSING])
            continue
        finite = [p for p in points if math.isfinite(p.value)]
        nonfinite = [p for p in points if not math.isfinite(p.value)]
        best = min(finite, key=lambda p: p.value) if finite else None
        accuracy = points[-1].accuracy
        rows.append(
            [
                split,
                str(len(points)),
                f"{points[0].step}–{points[-1].step}",
                num(points[0].value),
                f"{num(best.value)} @ {best.step}" if best else MISSING,
                num(points[-1].value),
                str(len(nonfinite)) + (f" (first @ {nonfinite[0].step})" if nonfinite else ""),
                num(accuracy),
            ]
        )
    return rows


def loss_table(report: DiagnosticReport) -> str:
    if not report.loss_history:
        return ""
    headers = ["split", "points", "steps", "first", "min @ step", "last", "non-finite", "last accuracy"]
    return table(headers, loss_summary_rows(report.loss_history))


def latest_by_name(records: Sequence[LayerStats] | Sequence[ParameterStats]) -> list:
    """The record of the latest step for each name, in order of first appearance."""
    latest: dict[str, LayerStats | ParameterStats] = {}
    for record in records:
        current = latest.get(record.name)
        if current is None or (record.step or 0) >= (current.step or 0):
            latest[record.name] = record
    return list(latest.values())


def _more_rows_note(total: int) -> str:
    return f"\n\n({total - MAX_LAYER_ROWS} more not shown.)" if total > MAX_LAYER_ROWS else ""


def layer_table(report: DiagnosticReport) -> str:
    layers = latest_by_name(report.layers)
    if not layers:
        return ""
    headers = [
        "layer", "type", "step", "act mean", "act std", "act min", "act max", "zero frac",
        "dead units", "saturated", "act non-finite", "grad abs-mean", "grad max", "grad norm",
        "grad non-finite",
    ]  # fmt: skip
    rows = []
    for layer in layers[:MAX_LAYER_ROWS]:
        a, g = layer.activation, layer.gradient
        rows.append(
            [layer.name, layer.type, num(layer.step)]
            + ([num(a.mean), num(a.std), num(a.min), num(a.max), num(a.zero_fraction),
                num(a.dead_unit_fraction), num(a.saturated_fraction), num(a.nonfinite_count)]
               if a else [MISSING] * 8)
            + ([num(g.abs_mean), num(g.max), num(g.norm), num(g.nonfinite_count)] if g else [MISSING] * 4)
        )  # fmt: skip
    return table(headers, rows) + _more_rows_note(len(layers))


def parameter_table(report: DiagnosticReport) -> str:
    params = latest_by_name(report.parameters)
    if not params:
        return ""
    headers = ["parameter", "shape", "step", "trainable", "weight norm", "grad norm", "update/weight"]
    rows = [
        [p.name, "×".join(map(str, p.shape)) or "scalar", num(p.step), num(p.requires_grad),
         num(p.weight_norm), num(p.grad_norm), num(p.update_ratio)]
        for p in params[:MAX_LAYER_ROWS]
    ]  # fmt: skip
    return table(headers, rows) + _more_rows_note(len(params))


def probe_rows(probes: Probes) -> list[tuple[str, str, str, str | None]]:
    """(title, status, the numbers behind it, message) of each probe that reported, in
    the order of :class:`Probes`. A probe that errored or was skipped measured nothing:
    no numbers are shown for it."""
    return [(result.title, result.status,
             result.summary(num) if result.status in ("passed", "failed") else MISSING, result.message)
            for result in probes.results().values()]  # fmt: skip


def probe_table(report: DiagnosticReport) -> str:
    if report.probes is None:
        return ""
    rows = [[title, status, numbers, message or ""] for title, status, numbers, message in probe_rows(report.probes)]
    return table(["probe", "status", "numbers", "message"], rows) if rows else ""


def _losses(initial: float | None, final: float | None) -> str:
    return MISSING if initial is None and final is None else f"{num(initial)} → {num(final)}"


def intervention_summary(report: DiagnosticReport) -> str:
    """One line (unescaped) on the baseline twin: its loss, and why no remedy ran if none did."""
    iv = report.interventions
    if iv is None:
        return ""
    if iv.status != "done":
        return f"{iv.status}: {iv.message or 'no reason recorded'}"
    line = (f"baseline (the setup as given, {iv.steps} steps on the batch): loss "
            f"{_losses(iv.baseline_initial_loss, iv.baseline_final_loss)}")  # fmt: skip
    return line + (f"; {iv.message}" if iv.message else "")


def intervention_table(report: DiagnosticReport) -> str:
    """Each remedy tried on a copy: the loss without it (the baseline twin) and with it."""
    iv = report.interventions
    if iv is None or not iv.results:
        return ""
    rows = [[r.cause, r.remedy, r.status.replace("_", " "), _losses(r.baseline_initial_loss, r.baseline_final_loss),
             _losses(r.remedied_initial_loss, r.remedied_final_loss), num(r.steps) if r.steps else MISSING,
             r.message or ""] for r in iv.results]  # fmt: skip
    return table(["cause", "remedy", "status", "loss without", "loss with", "steps", "message"], rows)


def run_table(report: DiagnosticReport) -> str:
    run = report.run
    rows: list[list[str]] = []
    if run:
        fields = [("run name", run.name), ("project", run.project), ("started", run.started_at),
                  ("finished", run.finished_at), ("torch", run.torch_version), ("device", run.device),
                  ("dtype", run.dtype), ("seed", run.seed)]  # fmt: skip
        rows += [[k, v.isoformat() if hasattr(v, "isoformat") else value_text(v)] for k, v in fields if v is not None]
        rows += [["probes", note] for note in run.notes]
    if report.task:
        rows.append(["task", report.task])
    if report.num_classes is not None:
        rows.append(["classes", str(report.num_classes)])
    return table(["fact", "value"], rows) if rows else ""


def model_table(report: DiagnosticReport) -> str:
    m = report.model
    if m is None:
        return ""
    rows = [
        ["parameters", f"{m.param_count} ({m.trainable_param_count} trainable)"],
        ["leaf layers", str(len(m.layers))],
        ["activations", names_text(m.activations)],
        ["last layer", m.last_layer or MISSING],
        ["output activation", m.output_activation or "none"],
        ["normalisation layers", names_text(m.normalization_layers)],
        ["dropout", num(m.has_dropout)],
        ["batch norm", num(m.has_batchnorm)],
    ]
    return table(["fact", "value"], rows)


def model_layers_table(report: DiagnosticReport) -> str:
    if report.model is None or not report.model.layers:
        return ""
    layers = report.model.layers
    rows = [
        [layer.name, layer.type, "×".join(map(str, layer.output_shape)) if layer.output_shape else MISSING,
         str(layer.param_count), str(layer.trainable_param_count)]
        for layer in layers[:MAX_LAYER_ROWS]
    ]  # fmt: skip
    return table(["layer", "type", "output shape", "params", "trainable"], rows) + _more_rows_note(len(layers))


def loop_table(report: DiagnosticReport) -> str:
    loop = report.loop
    if loop is None:
        return ""
    rows = [
        ["optimizer steps", str(loop.steps)],
        ["backward calls", str(loop.backward_calls)],
        ["zero_grad calls", str(loop.zero_grad_calls)],
        ["forward calls", str(loop.forward_calls)],
        ["trainable parameters", str(loop.trainable_param_count)],
        ["parameters not in the optimizer", names_text(loop.params_not_in_optimizer)],
        ["optimizer parameters not in the model", str(loop.optimizer_params_not_in_model)],
        ["trainable parameters whose grad stayed None", names_text(loop.params_grad_none)],
        ["frozen parameters", names_text(loop.frozen_params)],
        ["no-grad forwards while model.training", str(loop.no_grad_forwards_in_train_mode)],
        ["dropout / batch norm", f"{num(loop.has_dropout)} / {num(loop.has_batchnorm)}"],
    ]
    if loop.lr_history:
        first, last = loop.lr_history[0], loop.lr_history[-1]
        lrs = f"{value_text(first.lrs)} @ {first.step}"
        if len(loop.lr_history) > 1:
            lrs += f" → {value_text(last.lrs)} @ {last.step}"
        rows.append(["learning rate (first → last)", lrs])
    if loop.grad_norm_history:
        before = [p.before_clip for p in loop.grad_norm_history]
        clipped = [p for p in loop.grad_norm_history if p.after_clip is not None]
        rows.append(["grad norm before clip (first / max / last)",
                     f"{num(before[0])} / {num(max(before, key=_nan_high))} / {num(before[-1])}"])  # fmt: skip
        if clipped:
            rows.append(["clipped steps",
                         f"{len(clipped)} of {len(before)}, last after clip {num(clipped[-1].after_clip)}"])
    if loop.input_norm_history:
        norms = [p.value for p in loop.input_norm_history]
        rows.append(["input norm (first / min / last)",
                     f"{num(norms[0])} / {num(min(norms, key=_nan_low))} / {num(norms[-1])}"])
    if loop.world_size > 1:
        rows.append(["world size", str(loop.world_size)])
        rows.append(["desynchronised steps", f"{len(loop.desync_steps)} (max difference {num(loop.max_desync)})"])
    return table(["fact", "value"], rows)


def _nan_high(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _nan_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x


def loss_call_table(report: DiagnosticReport) -> str:
    if report.loop is None or not report.loop.loss_calls:
        return ""
    rows = [
        [c.loss_type, "×".join(map(str, c.output_shape)) or "scalar", c.output_dtype or MISSING,
         "×".join(map(str, c.target_shape)) if c.target_shape is not None else MISSING, c.target_dtype or MISSING,
         f"{num(c.output_min)} … {num(c.output_max)}", num(c.output_rows_sum_to_one), str(c.calls)]
        for c in report.loop.loss_calls
    ]  # fmt: skip
    headers = ["loss", "output shape", "output dtype", "target shape", "target dtype", "output range",
               "rows sum to 1", "calls"]  # fmt: skip
    return table(headers, rows)


def _split_rows(split: SplitStats) -> list[tuple[str, str]]:
    s = split
    shape = "×".join(map(str, s.input_shape)) or MISSING
    rows = [
        ("samples", f"{s.n_samples}{' (sampled)' if s.sampled else ''}"),
        ("input shape / dtype", f"{shape} / {s.input_dtype or MISSING}"),
        ("input mean / std", f"{num(s.input_mean)} / {num(s.input_std)}"),
        ("input min / max", f"{num(s.input_min)} / {num(s.input_max)}"),
        ("feature std ratio (max/min)", num(s.feature_scale_ratio)),
        ("constant features", str(len(s.constant_features))),
        ("raw range", s.raw_range or "none detected"),
        ("input NaN / Inf", f"{s.input_nan_count} / {s.input_inf_count}"),
        ("label NaN / Inf", f"{s.label_nan_count} / {s.label_inf_count}"),
        ("label dtype / kind", f"{s.label_dtype or MISSING} / {s.label_kind or MISSING}"),
        ("target mean / std", f"{num(s.target_mean)} / {num(s.target_std)}"),
        ("classes", str(len(s.class_counts)) if s.class_counts else MISSING),
        ("imbalance (max/min count)", num(s.imbalance_ratio)),
        ("duplicate rows", f"{s.duplicate_count} ({num(s.duplicate_fraction)})"),
        ("all-zero samples", num(s.zero_sample_fraction)),
        ("same label as previous sample", num(s.label_runs_fraction)),
        ("target's rank correlation with its position", num(s.target_order_correlation)),
    ]
    return rows


def data_table(report: DiagnosticReport) -> str:
    data = report.data
    if data is None or (data.train is None and data.test is None):
        return ""
    splits = [(name, s) for name, s in (("train", data.train), ("test", data.test)) if s is not None]
    per_split = [dict(_split_rows(s)) for _, s in splits]
    keys = [k for k, _ in _split_rows(splits[0][1])]
    rows = [[k] + [values[k] for values in per_split] for k in keys]
    if data.test is not None and data.train is not None:
        rows.append(["test rows also in train", f"{data.train_test_overlap} ({num(data.train_test_overlap_fraction)})"]
                    + [""] * (len(splits) - 1))  # fmt: skip
    if data.expected_num_classes is not None:
        rows.append(["expected classes", str(data.expected_num_classes)] + [""] * (len(splits) - 1))
    return table(["statistic"] + [name for name, _ in splits], rows)


def error_entries(report: DiagnosticReport) -> list[dict[str, str]]:
    """Caught exceptions (the first ``MAX_ERRORS``), each message fenced and cut to
    ``MAX_MESSAGE_CHARS``: a traceback is evidence, a megabyte of it only fills the prompt."""
    entries = []
    for error in report.errors[:MAX_ERRORS]:
        message = error.message
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + f"\n… ({len(error.message)} characters in all)"
        entries.append({"source": error.source, "type": error.type, "message_block": fence(message)})
    return entries


def evidence_table(finding: Finding) -> str:
    if not finding.evidence:
        return ""
    return table(["evidence", "value"], [[k, value_text(v)] for k, v in finding.evidence.items()])

"""Report merging, in one place: several reports of one training run become one.

Two cases, one rule each:

- :func:`merge_ranks`: the per-rank reports of one data-parallel run (rank 0 first),
  as ``Monitor.report()`` gathers them under ``torch.distributed``.
- :func:`merge_monitor`: what a Monitor saw of the training loop folded into a probe
  report (``nndx.probe(..., monitor=mon)``, the framework callbacks' preflight).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nndx.collector.loss_call import merge_loss_calls
from nndx.report import (
    ActivationStats,
    DiagnosticReport,
    ErrorRecord,
    GradientStats,
    LayerStats,
    LossPoint,
    ScalarPoint,
)

__all__ = ["merge_monitor", "merge_ranks"]


def merge_ranks(reports: Sequence[DiagnosticReport]) -> DiagnosticReport:
    """One report from the per-rank reports of one data-parallel run (rank 0 first).

    How each part combines, and why:

    - run, model, parameters, LR and gradient-norm histories, desync: rank 0's. DDP
      keeps parameters, gradients and schedules identical across ranks; the desync
      check is what says when they are not.
    - counters (steps, backward passes, resets, forwards): rank 0's; ``world_size`` is
      the number of reports. Lists of parameter names: union. Counts of suspicious
      events (no-grad forwards in train mode, optimizer parameters not in the model):
      the largest over ranks. Limitations: union.
    - losses: mean over ranks per (split, step) — the loss of the global batch. Input
      norms: the smallest per step, so a zeroed batch on any one rank still shows.
    - layer statistics, per (layer, step): means averaged, min of minima, max of maxima,
      non-finite counts summed, ``dead_unit_fraction`` the smallest over ranks (a unit
      is dead on the global batch only if it is dead on every rank's shard).
    - errors: all, each source prefixed with its rank.
    """
    if not reports:
        raise ValueError("merge_ranks needs at least one report")
    first = reports[0]
    merged = first.model_copy(deep=True)
    if len(reports) == 1:
        return merged
    loops = [r.loop for r in reports if r.loop is not None]
    if merged.loop is not None:
        loop = merged.loop
        loop.world_size = len(reports)
        loop.params_not_in_optimizer = _union(l.params_not_in_optimizer for l in loops)
        loop.params_grad_none = _union(l.params_grad_none for l in loops)
        loop.params_grad_nonfinite = _union(l.params_grad_nonfinite for l in loops)
        loop.unregistered_params = _union(l.unregistered_params for l in loops)
        loop.frozen_params = _union(l.frozen_params for l in loops)
        loop.frozen_tracking = _union(l.frozen_tracking for l in loops)
        loop.limitations = _union(l.limitations for l in loops)
        loop.no_grad_forwards_in_train_mode = max(l.no_grad_forwards_in_train_mode for l in loops)
        loop.train_mode_evaluations = max(l.train_mode_evaluations for l in loops)
        loop.no_grad_train_forward_steps = max(l.no_grad_train_forward_steps for l in loops)
        loop.backward_after_eval_forward = max(l.backward_after_eval_forward for l in loops)
        loop.optimizer_params_not_in_model = max(l.optimizer_params_not_in_model for l in loops)
        loop.input_norm_history = _min_by_step([l.input_norm_history for l in loops])
    merged.loss_history = _mean_losses([r.loss_history for r in reports])
    merged.layers = _merge_layers([r.layers for r in reports])
    merged.errors = [
        ErrorRecord(source=f"rank{i}.{e.source}", type=e.type, message=e.message)
        for i, r in enumerate(reports)
        for e in r.errors
    ]
    return merged


def _union(lists: Iterable[Iterable[str]]) -> list[str]:
    """The names of every list, each once, in first-seen order."""
    seen: dict[str, None] = {}
    for names in lists:
        seen.update(dict.fromkeys(names))
    return list(seen)


def _min_by_step(histories: list[list[ScalarPoint]]) -> list[ScalarPoint]:
    # several forwards can share a step (accumulation): pair them by position within it
    best: dict[tuple[int, int], float] = {}
    for history in histories:
        seen: dict[int, int] = {}
        for point in history:
            k = seen.get(point.step, 0)
            seen[point.step] = k + 1
            key = (point.step, k)
            best[key] = point.value if key not in best else min(best[key], point.value)
    return [ScalarPoint(step=s, value=v) for (s, _), v in sorted(best.items())]


def _mean_losses(histories: list[dict[str, list[LossPoint]]]) -> dict[str, list[LossPoint]]:
    out: dict[str, list[LossPoint]] = {}
    for split in dict.fromkeys(s for h in histories for s in h):
        values: dict[int, list[LossPoint]] = {}
        for history in histories:
            for point in history.get(split, []):
                values.setdefault(point.step, []).append(point)
        points = []
        for step in sorted(values):
            group = values[step]
            accuracies = [p.accuracy for p in group if p.accuracy is not None]
            points.append(LossPoint(
                step=step,
                value=sum(p.value for p in group) / len(group),
                accuracy=sum(accuracies) / len(accuracies) if accuracies else None,
            ))
        out[split] = points
    return out


def _merge_layers(per_rank: list[list[LayerStats]]) -> list[LayerStats]:
    groups: dict[tuple[str, int | None], list[LayerStats]] = {}
    for layers in per_rank:
        for layer in layers:
            groups.setdefault((layer.name, layer.step), []).append(layer)
    return [
        LayerStats(
            name=group[0].name,
            type=group[0].type,
            step=group[0].step,
            activation=_merge_activations([g.activation for g in group if g.activation is not None]),
            gradient=_merge_gradients([g.gradient for g in group if g.gradient is not None]),
        )
        for group in groups.values()
    ]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _merge_activations(stats: list[ActivationStats]) -> ActivationStats | None:
    if not stats:
        return None
    saturated = [s.saturated_fraction for s in stats if s.saturated_fraction is not None]
    return ActivationStats(
        mean=_mean([s.mean for s in stats]),
        std=_mean([s.std for s in stats]),
        min=min(s.min for s in stats),
        max=max(s.max for s in stats),
        zero_fraction=_mean([s.zero_fraction for s in stats]),
        dead_unit_fraction=min(s.dead_unit_fraction for s in stats),
        saturated_fraction=_mean(saturated) if saturated else None,
        nonfinite_count=sum(s.nonfinite_count for s in stats),
        unit_count=stats[0].unit_count,
        values_per_unit=sum(s.values_per_unit for s in stats),
    )


def _merge_gradients(stats: list[GradientStats]) -> GradientStats | None:
    if not stats:
        return None
    return GradientStats(
        abs_mean=_mean([s.abs_mean for s in stats]),
        max=max(s.max for s in stats),
        norm=_mean([s.norm for s in stats]),
        nonfinite_count=sum(s.nonfinite_count for s in stats),
    )


def merge_monitor(report: DiagnosticReport, watched: DiagnosticReport, at_start: Sequence[LayerStats] = ()) -> None:
    """Fold a Monitor's report into ``report`` (a probe report), in place: the Monitor's
    loop, loss history and recorded steps are what the training run saw; the probes'
    own static facts fill what it left out. ``at_start``: layers the probes measured at the
    initial state (functional activations, which the Monitor does not see), recorded at
    the Monitor's first step where the Monitor has no record of them."""
    if watched.loop is not None:
        loop = watched.loop
        if report.loop is not None:
            loop = loop.model_copy(update={
                "params_not_in_optimizer": _union([loop.params_not_in_optimizer, report.loop.params_not_in_optimizer]),
                "frozen_params": _union([loop.frozen_params, report.loop.frozen_params]),
                "loss_targets_from_output": report.loop.loss_targets_from_output,
                "frozen_tracking": _union([loop.frozen_tracking, report.loop.frozen_tracking]),
                **({"frozen_at_init": report.loop.frozen_at_init, "frozen_checked": report.loop.frozen_checked}
                   if loop.frozen_at_init is None else {}),
                "has_dropout": loop.has_dropout or report.loop.has_dropout,
                "has_batchnorm": loop.has_batchnorm or report.loop.has_batchnorm,
                "trainable_param_count": loop.trainable_param_count or report.loop.trainable_param_count,
            })  # fmt: skip
        report.loop = loop.model_copy(update={"loss_calls": merge_loss_calls(
            loop.loss_calls, report.loop.loss_calls if report.loop is not None else [])})  # fmt: skip
    for split, points in watched.loss_history.items():
        report.loss_history.setdefault(split, []).extend(points)
    # the probe measured the model as it is now, after the monitored steps: stamp its
    # records with the next step so they neither collide with nor precede the loop's
    seen = [r.step for r in (*watched.layers, *watched.parameters) if r.step is not None]
    now = max([watched.loop.steps if watched.loop else 0, *(s + 1 for s in seen)])
    probed = [r.model_copy(update={"step": now}) for r in report.layers]
    probed_params = [r.model_copy(update={"step": now}) for r in report.parameters]
    known = {r.name for r in watched.layers}
    first = min(seen, default=0)
    started = [r.model_copy(update={"step": first}) for r in at_start if r.name not in known and first < now]
    # the first step's records in forward order (the probe's), functional ones among the modules:
    # rules read a step's first record as the input side
    if started:
        rank = {r.name: i for i, r in enumerate(report.layers)}
        at_first = [r for r in watched.layers if r.step == first] + started
        at_first.sort(key=lambda r: rank.get(r.name, len(rank)))
        report.layers = at_first + [r for r in watched.layers if r.step != first] + probed
    else:
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

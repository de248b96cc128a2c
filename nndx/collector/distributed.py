"""The Monitor under ``torch.distributed``: replica checksums and merged reports.

Each rank's Monitor collects locally. Two things need the process group:

- :func:`checksum_spread`: every N steps, each rank reduces its parameters to two floats
  (sum of the per-tensor norms, and that sum weighted by tensor position so a swap of
  two tensors also shows) and all-gathers them; the largest relative difference to
  rank 0 is the desync. Under a correct DDP loop the replicas are bit-identical and the
  spread is exactly 0; when a rank bypasses the wrapper (``ddp.module(x)``) or trains
  unsynchronised parameters, it grows.
- :func:`gather_and_merge`: ``Monitor.report()`` all-gathers every rank's report and
  rank 0 merges them with :func:`merge_reports`.

Both are collectives: every rank must call them at the same point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from nndx.report import (
    ActivationStats,
    DiagnosticReport,
    ErrorRecord,
    GradientStats,
    LayerStats,
    LossPoint,
    ScalarPoint,
)

# relative checksum difference above which replicas count as out of sync; in-sync DDP
# replicas are bit-identical, so anything above float noise is real drift
DESYNC_TOLERANCE = 1e-6


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_size(group: Any = None) -> int:
    return torch.distributed.get_world_size(group) if is_initialized() else 1


def rank(group: Any = None) -> int:
    return torch.distributed.get_rank(group) if is_initialized() else 0


def parameter_checksum(model: nn.Module) -> torch.Tensor:
    """Two float64 numbers that differ between replicas whose parameters differ."""
    params = [p.detach() for p in model.parameters()]
    if not params:
        return torch.zeros(2, dtype=torch.float64)
    norms = torch.stack([torch.linalg.vector_norm(p.float()) for p in params]).double()
    position = torch.arange(1, len(params) + 1, dtype=torch.float64, device=norms.device)
    return torch.stack([norms.sum(), (norms * position).sum()])


def checksum_spread(model: nn.Module, group: Any = None) -> float:
    """Largest relative difference of any rank's checksum to rank 0's (a collective)."""
    local = parameter_checksum(model)
    if torch.distributed.get_backend(group) == "nccl" and local.device.type != "cuda":
        local = local.cuda()
    gathered = [torch.empty_like(local) for _ in range(world_size(group))]
    torch.distributed.all_gather(gathered, local, group=group)
    reference = gathered[0]
    scale = reference.abs().clamp_min(1e-12)
    return max(float(((g - reference).abs() / scale).max()) for g in gathered)


def gather_and_merge(local: DiagnosticReport, group: Any = None) -> DiagnosticReport:
    """All ranks' reports merged on rank 0; every other rank gets ``local`` back."""
    payload = local.model_dump_json()
    gathered: list[Any] = [None] * world_size(group)
    torch.distributed.all_gather_object(gathered, payload, group=group)
    if rank(group) != 0:
        return local
    return merge_reports([DiagnosticReport.model_validate_json(p) for p in gathered])


def merge_reports(reports: Sequence[DiagnosticReport]) -> DiagnosticReport:
    """One report from the per-rank reports of one data-parallel run (rank 0 first).

    How each part combines, and why:

    - run, model, parameters, LR and gradient-norm histories, desync: rank 0's. DDP
      keeps parameters, gradients and schedules identical across ranks; the desync
      check is what says when they are not.
    - counters (steps, backward passes, resets, forwards): rank 0's; ``world_size`` is
      the number of reports. Lists of parameter names: union. Counts of suspicious
      events (no-grad forwards in train mode, optimizer parameters not in the model):
      the largest over ranks.
    - losses: mean over ranks per (split, step) — the loss of the global batch. Input
      norms: the smallest per step, so a zeroed batch on any one rank still shows.
    - layer statistics, per (layer, step): means averaged, min of minima, max of maxima,
      non-finite counts summed, ``dead_unit_fraction`` the smallest over ranks (a unit
      is dead on the global batch only if it is dead on every rank's shard).
    - errors: all, each source prefixed with its rank.
    """
    if not reports:
        raise ValueError("merge_reports needs at least one report")
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
        loop.frozen_params = _union(l.frozen_params for l in loops)
        loop.no_grad_forwards_in_train_mode = max(l.no_grad_forwards_in_train_mode for l in loops)
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


def _union(lists: Any) -> list[str]:
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

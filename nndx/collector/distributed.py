"""The Monitor under ``torch.distributed``: replica checksums and merged reports.

Each rank's Monitor collects locally. Two things need the process group:

- :func:`checksum_spread`: every N steps, each rank reduces its parameters to two floats
  (sum of the per-tensor norms, and that sum weighted by tensor position so a swap of
  two tensors also shows) and all-gathers them; the largest relative difference to
  rank 0 is the desync. Under a correct DDP loop the replicas are bit-identical and the
  spread is exactly 0; when a rank bypasses the wrapper (``ddp.module(x)``) or trains
  unsynchronised parameters, it grows.
- :func:`gather_and_merge`: ``Monitor.report()`` all-gathers every rank's report and
  rank 0 merges them with :func:`nndx.collector.merge.merge_ranks`.

Both are collectives: every rank must call them at the same point.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nndx.collector.merge import merge_ranks
from nndx.report import DiagnosticReport

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
    params = [p.detach() for p in nn.Module.parameters(model)]
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
    return merge_ranks([DiagnosticReport.model_validate_json(p) for p in gathered])

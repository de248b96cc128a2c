"""Data-parallel replicas drifting apart: under ``torch.distributed`` (world size > 1),
every ``checksum_every`` steps the ranks compare a checksum of the parameters (one
all-gather of two floats, see :func:`nndx.collector.distributed.checksum_spread`) and
record the steps where the replicas differ. A collective: every rank steps alike."""

from __future__ import annotations

from typing import Any

from nndx.collector import distributed
from nndx.collector.watch.base import StepContext, Watched, Watcher


class Desync(Watcher):
    name = "desync"

    def __init__(self, watched: Watched, checksum_every: int, group: Any, world_size: int) -> None:
        self.watched = watched
        self.checksum_every = checksum_every
        self.group = group
        self.world_size = world_size
        self.steps: list[int] = []
        self.max_desync: float | None = None
        self._checked_after: int | None = None  # steps completed at the last check

    def on_step_end(self, ctx: StepContext) -> None:
        if (ctx.step + 1) % self.checksum_every == 0:
            self.check(ctx.step + 1)

    def check(self, completed_steps: int) -> None:
        """Compare the ranks' checksums after ``completed_steps`` steps (once per count)."""
        if self._checked_after == completed_steps:
            return
        self._checked_after = completed_steps
        relative = distributed.checksum_spread(self.watched.root, self.group)
        if relative > distributed.DESYNC_TOLERANCE:
            self.steps.append(max(completed_steps - 1, 0))
            self.max_desync = max(self.max_desync or 0.0, relative)
        elif self.max_desync is None:
            self.max_desync = relative

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"world_size": self.world_size, "desync_steps": list(self.steps), "max_desync": self.max_desync}}

"""The sizes each recurrent layer (``nn.RNN``, ``nn.LSTM``, ``nn.GRU``) takes along its time and
batch axes over the run. A layer built time-major (``batch_first=False``, the default) and fed
batch-first batches, or the other way round, runs its recurrence across the samples of a batch
and treats the time steps as samples: every shape is legal both ways, and the loss falls on what
structure is left. Over a run the two axes tell: padded sequences of varying length vary the time
axis from batch to batch, while the loader holds the batch size. Read from the input's shape in a
forward pre-hook: host integers, no pass over any tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from nndx.collector.watch.base import Watched, Watcher
from nndx.report import RecurrentInput

MAX_SIZES = 16  # distinct sizes kept per axis: enough to tell an axis that varies from one that holds


class RecurrentAxes(Watcher):
    """Per recurrent layer: its ``batch_first``, its forwards, and the distinct sizes of its time
    and batch axes (packed sequences, which carry their own lengths, are not read)."""

    name = "recurrent_axes"

    def __init__(self, watched: Watched, guard: Callable) -> None:
        self.watched = watched
        self.guard = guard  # a hook that raises is recorded, never the user's crash
        self.seen: dict[str, RecurrentInput] = {}

    def attach(self) -> list:
        """Hook the recurrent layers (the Monitor calls it, and records a failure as a limitation)."""
        return [module.register_forward_pre_hook(self.guard("forward", partial(self._forward, name)))
                for name, module in self.watched.root.named_modules() if isinstance(module, nn.RNNBase)]  # fmt: skip

    def _forward(self, name: str, module: nn.RNNBase, args: tuple) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() != 3:  # unbatched (2-d) or packed: no batch axis to read
            return
        entry = self.seen.setdefault(name, RecurrentInput(name=name, batch_first=bool(module.batch_first)))
        time_axis, batch_axis = (1, 0) if module.batch_first else (0, 1)
        entry.forwards += 1
        for sizes, axis in ((entry.time_lengths, time_axis), (entry.batch_sizes, batch_axis)):
            if len(sizes) < MAX_SIZES and int(x.shape[axis]) not in sizes:
                sizes.append(int(x.shape[axis]))

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"recurrent_inputs": [r.model_copy(update={"time_lengths": sorted(r.time_lengths),
                                                                    "batch_sizes": sorted(r.batch_sizes)})
                                              for r in self.seen.values()]}}  # fmt: skip

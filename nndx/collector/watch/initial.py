"""The parameters as they were when the Monitor attached: a copy for probes that must
start from the initial state (:meth:`Monitor.initial_state`), and which trainable
parameters never moved from it."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from nndx.collector.watch.base import Watched, Watcher


class InitialState(Watcher):
    """A copy of every parameter and buffer at attach time (``state_dict`` keys), on
    ``device`` ("cpu" by default; None keeps none). Bounded: past ``max_bytes`` nothing
    is kept and the report's ``loop.limitations`` says so. The copies are never the
    user's tensors (no aliasing), and training never touches them."""

    name = "initial_state"

    def __init__(self, watched: Watched, device: str | torch.device | None, max_bytes: int) -> None:
        self.watched = watched
        self.state: dict[str, torch.Tensor] | None = None
        self.limitation: str | None = None
        if device is None:
            return
        tensors = watched.root.state_dict(keep_vars=True)
        lazy = [k for k, t in tensors.items() if nn.parameter.is_lazy(t)]
        if lazy:
            self.limitation = (f"initial state not kept: {len(lazy)} lazy parameters ({', '.join(lazy[:3])}) "
                               "had no values when the Monitor attached; attach it after a first forward to keep one")
            return
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if size > max_bytes:
            self.limitation = (f"initial state not kept: its {size / 2**20:.0f} MiB of parameters and buffers are over "
                               f"initial_state_max_bytes ({max_bytes / 2**20:.0f} MiB); probes cannot start from it")  # fmt: skip
            return
        with torch.no_grad():
            self.state = {k: t.detach().to(device, copy=True) for k, t in tensors.items()}

    def of(self, model: nn.Module | str | None = None) -> dict[str, torch.Tensor] | None:
        """The copy for all watched models, or for one of several (by name or module),
        keyed as that model's ``state_dict``. None when none was kept."""
        models = self.watched.models
        if self.state is None or model is None or len(models) == 1:
            return None if self.state is None else dict(self.state)
        key = model if isinstance(model, str) else next((k for k, m in models.items() if m is model), None)
        if key not in models:
            raise KeyError(f"not a watched model: {model!r}; the models are {list(models)}")
        return {k.removeprefix(f"{key}."): t for k, t in self.state.items() if k.startswith(f"{key}.")}

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"limitations": [self.limitation]}} if self.limitation else {}


class UnchangedParameters(Watcher):
    """Trainable parameters whose values never moved: a float64 norm of each at attach
    time, compared with one taken when the report is made (one pass over the
    parameters, at ``report()`` only — not in live windows)."""

    name = "unchanged"

    def __init__(self, watched: Watched) -> None:
        self.watched = watched
        self._initial = self._norms()

    def _norms(self) -> list[float]:
        if any(nn.parameter.is_lazy(p) for _, p in self.watched.params):  # no values yet: changed once they have
            return [math.nan] * len(self.watched.params)
        params = [p.detach() for _, p in self.watched.params]
        if not params:
            return []
        with torch.no_grad():
            return torch.stack([n.to(params[0].device) for n in torch._foreach_norm(params, 2, dtype=torch.float64)]).tolist()

    def report(self, window: int | None) -> dict[str, Any]:
        if window is not None:
            return {}
        unchanged = [n for (n, p), before, now in zip(self.watched.params, self._initial, self._norms())
                     if p.requires_grad and (before == now or before != before and now != now)]  # fmt: skip
        return {"loop": {"params_never_changed": unchanged}}

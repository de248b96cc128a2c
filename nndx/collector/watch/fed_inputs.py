"""The value range of what another watched model feeds a model, beside the range of what
else reaches the same input. A GAN's discriminator takes the generator's samples and real
data through one input: when the generator ends in Tanh ([-1, 1]) and the data was left in
[0, 1] (``Normalize((0.5,), (0.5,))`` forgotten), or ends in Sigmoid while the data is in
[-1, 1], the discriminator tells fakes by their range alone and the game teaches the
generator nothing else. So does a critic fed an actor's actions beside a replay buffer's.

Per positional input of a watched model's forward: a tensor that is (a view or a
``.detach()`` of) the last output of another watched model (of this Monitor or another)
counts as fed; any
other floating-point tensor with as many values per sample at that position as the model's
own input. Their smallest and largest values are kept on the device (no host
synchronisation) and fetched once, for the report. Nothing is measured while fewer than two
watched models are alive: one model's run pays nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nndx.collector.watch.base import StepContext, Watched, Watcher
from nndx.collector.watch.loop import other_models_output, watched_outputs
from nndx.report import FedInput

MAX_POSITIONS = 4  # positional inputs read per forward (a critic's (state, action))


class _Extent:
    """Smallest and largest value seen, as 0-d tensors, and how many forwards."""

    def __init__(self) -> None:
        self.low: torch.Tensor | None = None
        self.high: torch.Tensor | None = None
        self.forwards = 0

    def add(self, t: torch.Tensor) -> None:
        with torch.no_grad():
            low, high = torch.aminmax(t.detach())  # one pass over the input, not two
            self.low = low if self.low is None else torch.minimum(self.low, low)
            self.high = high if self.high is None else torch.maximum(self.high, high)
        self.forwards += 1


class FedInputs(Watcher):
    """Per watched model and input position: the extent of the values another watched model
    fed it, and of the other values that reached that position."""

    name = "fed_inputs"

    def __init__(self, watched: Watched) -> None:
        self._names = {id(m): name for name, m in watched.models.items()}
        self._seen: dict[tuple[int, int], tuple[int, _Extent, _Extent]] = {}

    def on_forward(self, ctx: StepContext, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if id(module) not in self._names or watched_outputs() < 2:
            return
        for position, t in enumerate(args[:MAX_POSITIONS]):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 1 or t.numel() == 0 \
                    or t.layout != torch.strided:  # fmt: skip
                continue
            # per sample, its number of values: real images (N, 1, 8, 8) beside flat fakes (N, 64) that
            # the model views alike
            per_sample = t[0].numel()
            size, fed, own = self._seen.setdefault((id(module), position), (per_sample, _Extent(), _Extent()))
            if per_sample != size:
                continue
            (fed if other_models_output(t, {id(module)}) else own).add(t)

    def report(self, window: int | None) -> dict[str, Any]:
        if window is not None:
            return {}
        found = []
        for (model, position), (_, fed, own) in self._seen.items():
            if not fed.forwards or not own.forwards:
                continue
            values = [float(v) for v in (fed.low, fed.high, own.low, own.high)]
            found.append(FedInput(model=self._names[model], position=position, fed_forwards=fed.forwards,
                                  own_forwards=own.forwards, fed_min=values[0], fed_max=values[1],
                                  own_min=values[2], own_max=values[3]))  # fmt: skip
        return {"loop": {"fed_inputs": found}}

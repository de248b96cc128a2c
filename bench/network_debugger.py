"""The lesson's ``NetworkDebugger``, reimplemented faithfully as a baseline (bench only).

What the lesson's class does, and this one with it: a forward hook on every Linear,
Conv2d and ReLU that computes activation statistics with one ``.item()`` per statistic
and appends them to a per-layer history; a full backward hook on the same modules that
does the same for the output gradient; both on every step, forever. ``check_health``
prints its verdicts with the lesson's thresholds (over 50% zeros = "dead ReLUs",
gradient norm under 1e-7 = vanishing, over 1e3 = exploding). It is here to be measured
against (bench/overhead.py), not used.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn


class NetworkDebugger:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.activation_history: dict[str, list[dict[str, float]]] = defaultdict(list)
        self.gradient_history: dict[str, list[dict[str, float]]] = defaultdict(list)
        self.hooks: list[torch.utils.hooks.RemovableHandle] = []

    def register_hooks(self) -> NetworkDebugger:
        for name, module in self.model.named_modules():
            if isinstance(module, (nn.Linear, nn.Conv2d, nn.ReLU)):
                self.hooks.append(module.register_forward_hook(self._activation_hook(name)))
                self.hooks.append(module.register_full_backward_hook(self._gradient_hook(name)))
        return self

    def _activation_hook(self, name: str):
        def hook(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
            out = output.detach()
            self.activation_history[name].append({
                "mean": out.mean().item(),
                "std": out.std().item(),
                "min": out.min().item(),
                "max": out.max().item(),
                "fraction_zeros": (out == 0).float().mean().item(),
            })

        return hook

    def _gradient_hook(self, name: str):
        def hook(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
            grad = grad_output[0]
            if grad is None:
                return
            self.gradient_history[name].append({
                "mean": grad.mean().item(),
                "std": grad.std().item(),
                "norm": grad.norm().item(),
            })

        return hook

    def check_health(self) -> list[str]:
        messages = []
        for name, history in self.activation_history.items():
            if history and history[-1]["fraction_zeros"] > 0.5:
                messages.append(f"{name}: over 50% zeros - dead ReLUs")
        for name, history in self.gradient_history.items():
            if history and history[-1]["norm"] < 1e-7:
                messages.append(f"{name}: vanishing gradients")
            elif history and history[-1]["norm"] > 1e3:
                messages.append(f"{name}: exploding gradients")
        return messages

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()


if __name__ == "__main__":
    # `make bench` runs every bench/*.py: show what the baseline says about a healthy
    # ReLU network (bench/overhead.py measures its cost).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    debugger = NetworkDebugger(model).register_hooks()
    x, y = torch.randn(256, 20), torch.randint(0, 3, (256,))
    nn.functional.cross_entropy(model(x), y).backward()
    debugger.close()
    print("The lesson's NetworkDebugger on a healthy, freshly initialised ReLU MLP:")
    print()
    print("| layer | fraction of zeros | verdict |")
    print("|---|---|---|")
    verdicts = debugger.check_health()
    for name, history in debugger.activation_history.items():
        said = [v for v in verdicts if v.startswith(f"{name}:")]
        print(f"| {name} | {history[-1]['fraction_zeros']:.2f} | {said[0] if said else 'ok'} |")

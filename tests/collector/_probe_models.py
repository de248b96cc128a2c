"""Tiny healthy and broken models shared by the probe tests, and a state snapshot to
prove that a probe left the user's model, optimizer and RNG untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def single_thread():
    """One intra-op thread while a probe test runs: on this shared 2-core machine some
    float64 kernels spend milliseconds per call waiting on a contended thread pool.
    Import this fixture into a test module to use it; the setting is restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(n: int = 16, features: int = 8, classes: int = 3, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)


def train_under(monitor, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                steps: int = 3, after=None) -> None:
    """The user's loop under a Monitor: ``steps`` cross-entropy steps, ``after()`` after each."""
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        monitor.log(loss)
        if after is not None:
            after()


def mlp(hidden: int = 16, out: int = 3, seed: int = 0, dropout: float = 0.0, batchnorm: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(8, hidden)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(hidden))
    layers.append(nn.ReLU())
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)]
    return nn.Sequential(*layers)


def dead_relu_mlp() -> nn.Sequential:
    """Every first-layer ReLU unit dead from a -5 bias (inputs ~ N(0, 1))."""
    model = mlp()
    with torch.no_grad():
        model[0].weight.mul_(0.1)
        model[0].bias.fill_(-5.0)
    return model


class _LinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b with a hand-written backward that can be planted with a bug."""

    @staticmethod
    def forward(ctx, x, weight, bias, bug):
        ctx.save_for_backward(x, weight)
        ctx.bug = bug
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_weight = grad_out.t() @ x
        if ctx.bug == "transposed":  # the classic: W's gradient computed as if W were Wᵀ
            grad_weight = (x.t() @ grad_out).reshape(grad_weight.shape)
        elif ctx.bug == "scaled":
            grad_weight = grad_weight * 1.5
        elif ctx.bug == "far_element":  # one element, far from the start of the tensor
            grad_weight = grad_weight.clone()
            grad_weight[-3, -2] += 0.05 + grad_weight.abs().max()
        return grad_out @ weight, grad_weight, grad_out.sum(0), None


class CustomLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bug: str | None = None) -> None:
        super().__init__(in_features, out_features)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearFunction.apply(x, self.weight, self.bias, self.bug)


def custom_backward_mlp(bug: str | None, hidden: int = 16) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), CustomLinear(hidden, hidden, bug), nn.Tanh(),
                         nn.Linear(hidden, 3))  # fmt: skip


class Log(nn.Module):
    """log of a value that can be negative: NaN in forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Sqrt(nn.Module):
    """sqrt of an exact zero: finite forward (0), but d sqrt/du = inf, times du/dx = 0 → NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x * 0.0) + x


class InplaceSigmoid(nn.Module):
    """Modifies sigmoid's saved output in place: backward raises."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x)
        y.mul_(2.0)
        return y


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        "dtypes": {n: p.dtype for n, p in model.named_parameters()},
        "training": [m.training for m in model.modules()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
        "optimizer": None if optimizer is None else copy.deepcopy(optimizer.state_dict()),
        "rng": torch.get_rng_state(),
    }


def assert_untouched(before: dict, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    after = snapshot(model, optimizer)
    assert before["state"].keys() == after["state"].keys()
    for k in before["state"]:
        assert torch.equal(before["state"][k], after["state"][k]), f"model state {k} changed"
    for n, g in before["grads"].items():
        assert (g is None) == (after["grads"][n] is None) and (g is None or torch.equal(g, after["grads"][n])), n
    assert before["dtypes"] == after["dtypes"]
    assert before["training"] == after["training"]
    assert before["hooks"] == after["hooks"], "hooks left on the user's model"
    assert torch.equal(before["rng"], after["rng"]), "global RNG state changed"
    if optimizer is not None:
        _assert_same(before["optimizer"], after["optimizer"])


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b

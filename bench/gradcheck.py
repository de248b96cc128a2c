"""Gradient-check benchmark: forward passes, wall time and bugs caught (not a test).

Compares, on a 10-64-64-2 MLP whose middle layer has a hand-written backward:

- nndx directional check (``nndx.collector.probes.grad_check.grad_check``): a few random
  directions over all parameters, localised per tensor when it fails;
- the lesson's per-element check: central difference with eps=1e-5 for every element
  of every parameter, relative error, bug above 1e-3;
- the lesson's check as written: the same, on the first 5 elements of each tensor;
- ``torch.autograd.gradcheck`` (fast mode, and the default slow mode) on the loss as a
  function of the parameters.

Planted bugs in the middle layer's weight gradient: transposed, scaled by 1.5, and one
wrong element far from the start of the tensor. Run: ``python bench/gradcheck.py``.
Forwards are counted with a forward pre-hook on the model; times are from this run
only, on one intra-op thread (this machine is shared).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from nndx.collector.probes.grad_check import grad_check

EPS = 1e-5
BUG = 1e-3
BUGS = (None, "transposed", "scaled", "far_element")


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, bug):
        ctx.save_for_backward(x, weight)
        ctx.bug = bug
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_weight = grad_out.t() @ x
        if ctx.bug == "transposed":
            grad_weight = (x.t() @ grad_out).reshape(grad_weight.shape)
        elif ctx.bug == "scaled":
            grad_weight = grad_weight * 1.5
        elif ctx.bug == "far_element":
            grad_weight = grad_weight.clone()
            grad_weight[40, 50] += 0.05 + grad_weight.abs().max()
        return grad_out @ weight, grad_weight, grad_out.sum(0), None


class CustomLinear(nn.Linear):
    def __init__(self, n_in: int, n_out: int, bug: str | None) -> None:
        super().__init__(n_in, n_out)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearFunction.apply(x, self.weight, self.bias, self.bug)


def make(bug: str | None, activation: type[nn.Module] = nn.ReLU) -> tuple[nn.Module, list[int]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), activation(), CustomLinear(64, 64, bug), activation(), nn.Linear(64, 2))
    counter = [0]
    model.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    return model, counter


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 10, generator=g), torch.randint(0, 2, (32,), generator=g)


LOSS = nn.CrossEntropyLoss()


def nndx_directional(model: nn.Module) -> list[str]:
    result = grad_check(model, data(), LOSS)
    return [p.name for p in result.parameters if p.status == "bug"] or (["?"] if result.status == "failed" else [])


def per_element(model: nn.Module, first: int | None = None) -> list[str]:
    """The lesson's check, reimplemented: every element (or the first ``first``)."""
    model = model.double()
    x, y = data()
    x = x.double()
    model.zero_grad()
    LOSS(model(x), y).backward()
    faulty = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat, grad = p.view(-1), p.grad.view(-1)
            worst = 0.0
            for i in range(flat.numel() if first is None else min(first, flat.numel())):
                original = float(flat[i])
                flat[i] = original + EPS
                plus = float(LOSS(model(x), y))
                flat[i] = original - EPS
                minus = float(LOSS(model(x), y))
                flat[i] = original
                numeric, analytic = (plus - minus) / (2 * EPS), float(grad[i])
                worst = max(worst, abs(numeric - analytic) / max(abs(numeric), abs(analytic), 1e-8))
            if worst > BUG:
                faulty.append(name)
    return faulty


def torch_gradcheck(model: nn.Module, fast_mode: bool) -> list[str]:
    model = model.double()
    x, y = data()
    x = x.double()
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())

    def loss(*values: torch.Tensor) -> torch.Tensor:
        return LOSS(torch.func.functional_call(model, dict(zip(names, values)), (x,)), y)

    ok = torch.autograd.gradcheck(loss, params, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=fast_mode,
                                  raise_exception=False)  # fmt: skip
    return [] if ok else ["(fails; names no tensor)"]


METHODS = {
    "nndx directional": nndx_directional,
    "per-element, all elements": per_element,
    "lesson: first 5 per tensor": lambda m: per_element(m, first=5),
    "torch gradcheck fast_mode": lambda m: torch_gradcheck(m, True),
    "torch gradcheck (slow)": lambda m: torch_gradcheck(m, False),
}


def main() -> None:
    torch.set_num_threads(1)
    print(f"gradient check on a 10-64-64-2 MLP ({sum(p.numel() for p in make(None)[0].parameters())} parameters), "
          "batch 32, planted bug in layer 2's weight gradient; 1 thread. With ReLU this seed puts a pre-activation "
          "4e-8 from its kink, so every eps=1e-5 difference through it crosses the kink.")  # fmt: skip
    header = ["method", "activation", "forwards healthy", "forwards with bug", "per-element / this (healthy)",
              "time healthy s", "false alarm on healthy"] + [f"{b} caught" for b in BUGS[1:]]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for activation in (nn.ReLU, nn.Tanh):
        rows = []
        for method, check in METHODS.items():
            cells = []
            for bug in BUGS:
                model, counter = make(bug, activation)
                started = time.perf_counter()
                faulty = check(model)
                cells.append((counter[0], time.perf_counter() - started, faulty))
            rows.append((method, cells))
        base_forwards = dict(rows)["per-element, all elements"][0][0]
        for method, cells in rows:
            forwards, seconds, healthy = cells[0]
            line = [method, activation.__name__, str(forwards), str(max(c[0] for c in cells[1:])),
                    f"{base_forwards / forwards:.0f}x", f"{seconds:.3f}",
                    f"yes ({', '.join(healthy)})" if healthy else "no"]  # fmt: skip
            line += [f"yes ({', '.join(faulty)})" if faulty else "NO" for _, _, faulty in cells[1:]]
            print("| " + " | ".join(line) + " |", flush=True)
    localisation()


class Branches(nn.Module):
    """``width`` parallel Linear layers summed, one with a scaled backward: every tensor's
    gradient of one size, so only the localisation's cost grows with the tensor count."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(CustomLinear(10, 16, "scaled" if i == width * 2 // 3 else None)
                                      for i in range(width))  # fmt: skip
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(sum(branch(x) for branch in self.branches) / 4))


def localisation() -> None:
    """Forwards to name the one faulty tensor as the tensor count grows: nndx halves the tensors
    whose confined check is not clean; checking them one by one (as nndx did before 2026-12-06)
    takes at least 3 directions x 2 forwards per tensor."""
    print("\nlocalising one wrong backward among n tensors (nndx directional, 3 directions)\n")
    print("| tensors | forwards (nndx, halving) | one by one: at least | ratio | named |")
    print("|---|---|---|---|---|")
    for width in (4, 16, 32):
        torch.manual_seed(0)
        result = grad_check(Branches(width), data(), LOSS)
        tensors, one_by_one, forwards = len(result.parameters), 3 * 2 * len(result.parameters), result.forward_passes
        named = ", ".join(p.name for p in result.parameters if p.status == "bug") or "NONE"
        print(f"| {tensors} | {forwards} | {one_by_one} | {one_by_one / forwards:.1f}x | {named} |", flush=True)


if __name__ == "__main__":
    main()

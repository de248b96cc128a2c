"""Gradient-check a hand-written numpy MLP — a mini-framework with its own backward.

The network is 4 → 16 → 16 → 3 with tanh and a softmax cross-entropy, every gradient
derived by hand. ``backward(..., bug=True)`` plants the classic mistake: the middle
weight's gradient computed as ``dz2ᵀ h1`` instead of ``h1ᵀ dz2`` — the transpose, which
has the right shape for a square matrix and so raises nothing. nndx's framework-free
checker takes the named parameter arrays, the loss function and the analytic gradients,
and names the faulty parameter.

Run: ``python examples/numpy_mlp_gradcheck.py`` (exit code 0 when the check names W2).
"""

from __future__ import annotations

import numpy as np

from nndx.collector.probes.grad_check import grad_check_arrays
from nndx.report import GradCheckResult


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "W1": rng.normal(0, 0.5, (4, 16)), "b1": np.zeros(16),
        "W2": rng.normal(0, 0.25, (16, 16)), "b2": np.zeros(16),
        "W3": rng.normal(0, 0.25, (16, 3)), "b3": np.zeros(3),
    }  # fmt: skip


def data(n: int = 32, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)), rng.integers(0, 3, n)


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    h1 = np.tanh(x @ params["W1"] + params["b1"])
    h2 = np.tanh(h1 @ params["W2"] + params["b2"])
    logits = h2 @ params["W3"] + params["b3"]
    return logits, {"x": x, "h1": h1, "h2": h2}


def loss(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    logits, _ = forward(params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)  # the max-subtraction trick
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean())


def backward(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, bug: bool = False) -> dict[str, np.ndarray]:
    logits, cache = forward(params, x)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    dlogits = probs
    dlogits[np.arange(len(y)), y] -= 1
    dlogits /= len(y)
    h1, h2 = cache["h1"], cache["h2"]
    grads = {"W3": h2.T @ dlogits, "b3": dlogits.sum(axis=0)}
    dz2 = (dlogits @ params["W3"].T) * (1 - h2**2)
    grads["W2"] = dz2.T @ h1 if bug else h1.T @ dz2
    grads["b2"] = dz2.sum(axis=0)
    dz1 = (dz2 @ params["W2"].T) * (1 - h1**2)
    grads["W1"], grads["b1"] = x.T @ dz1, dz1.sum(axis=0)
    return grads


def check(bug: bool, mode: str = "directional") -> GradCheckResult:
    params, (x, y) = init_params(), data()
    return grad_check_arrays(params, lambda p: loss(p, x, y), backward(params, x, y, bug=bug), mode=mode)


def main() -> int:
    for bug in (False, True):
        result = check(bug)
        print(f"{'with' if bug else 'without'} the transposed-W2 bug: {result.status} — {result.message} "
              f"({result.forward_passes} loss evaluations)")  # fmt: skip
        for p in result.parameters:
            print(f"    {p.name}: relative error {p.relative_error:.2e} ({p.status})")
    named = [p.name for p in check(True).parameters if p.status == "bug"]
    return 0 if named == ["W2"] and check(False).status == "passed" else 1


if __name__ == "__main__":
    raise SystemExit(main())

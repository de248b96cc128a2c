"""Gradient check: does the backward agree with finite differences of the loss?

How to use::

    result = grad_check(model, (x, y), loss_fn)              # torch model, on a float64 copy
    result = grad_check_arrays(params, loss, grads)           # any framework: numpy arrays
    [p.name for p in result.parameters if p.status == "bug"]  # the faulty tensors

Directional mode (default) checks every parameter at once along a few random
directions v: the central difference (L(w+εv) − L(w−εv)) / 2ε against ⟨∇L, v⟩. Each
direction costs two forwards, whatever the number of parameters, and an error in any
element of any tensor shows in it. Each tensor gets an equal share of ‖v‖, so a small
tensor (a bias) is not drowned by a large one. When the joint check is not clean the
probe localises: the same check with directions confined to one tensor at a time names
the faulty tensor(s).

Element-wise mode perturbs single elements sampled across each tensor (one per
stratum, so the far end of a tensor is checked too — the lesson checks only the first 5
elements, and a wrong gradient in element 6 passes) and reports the worst index.

Thresholds (relative error): ≤ 1e-5 ok, ≤ 1e-3 suspect, above that a bug.

Randomness: the loss must be the same function at every evaluation, so every forward
runs with the same seed (identical dropout masks); batch-norm in train mode is a
deterministic function of the batch and is checked as is. The check runs in float64 on
a copy; the user's model and RNG are untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    forward,
    map_tensors,
    preserved_rng,
    split_batch,
    working_copy,
)
from nndx.report import GradCheckParam, GradCheckResult

OK_THRESHOLD = 1e-5
BUG_THRESHOLD = 1e-3
# Denominator floor of the relative error, relative to max(1, |L|): a derivative this
# small is indistinguishable from float64 round-off in the finite difference, so a
# truly-zero gradient (an unused parameter, a dead unit) is not reported as a bug.
RELATIVE_FLOOR = 1e-8

Mode = Literal["directional", "elementwise"]


class _Problem:
    """The function under test: flat float64 parameter vectors, their analytic
    gradients, and L evaluated at substituted parameter values (counting forwards)."""

    def __init__(
        self,
        values: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        shapes: dict[str, list[int]],
        loss_at: Callable[[Mapping[str, torch.Tensor]], float],
        base_loss: float,
    ) -> None:
        self.values, self.grads, self.shapes = values, grads, shapes
        self._loss_at = loss_at
        self.base_loss = base_loss
        self.forward_passes = 0

    def loss(self, substituted: Mapping[str, torch.Tensor]) -> float:
        self.forward_passes += 1
        return self._loss_at(substituted)

    def central_difference(self, direction: Mapping[str, torch.Tensor], eps: float) -> float:
        plus = {n: self.values[n] + eps * d for n, d in direction.items()}
        minus = {n: self.values[n] - eps * d for n, d in direction.items()}
        return (self.loss(plus) - self.loss(minus)) / (2 * eps)

    def analytic(self, direction: Mapping[str, torch.Tensor]) -> float:
        return float(sum(torch.dot(self.grads[n], d) for n, d in direction.items()))

    def relative_error(self, numeric: float, analytic: float) -> float:
        if not (math.isfinite(numeric) and math.isfinite(analytic)):
            return math.inf
        floor = RELATIVE_FLOOR * max(1.0, abs(self.base_loss))
        return abs(numeric - analytic) / max(abs(numeric), abs(analytic), floor)


def grad_check(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    mode: Mode = "directional",
    directions: int = 3,
    elements_per_tensor: int = 8,
    eps: float = 1e-5,
    seed: int = 0,
) -> GradCheckResult:
    """Check the model's autograd gradients of ``loss_fn`` on ``batch`` in float64."""
    inputs, targets = split_batch(batch)
    with preserved_rng():
        model_copy = working_copy(model).double()
        inputs, targets = (map_tensors(t, lambda x: x.double() if x.is_floating_point() else x)
                           for t in (inputs, targets))  # fmt: skip
        named = [(n, p) for n, p in model_copy.named_parameters() if p.requires_grad]
        if not named:
            return GradCheckResult(status="skipped", mode=mode, eps=eps, message="no trainable parameters")

        def loss_now() -> torch.Tensor:
            torch.manual_seed(seed)  # the same dropout mask at every evaluation
            return compute_loss(loss_fn, forward(model_copy, inputs), targets)

        model_copy.zero_grad(set_to_none=True)
        base = loss_now()
        base.backward()
        values = {n: p.detach().reshape(-1).clone() for n, p in named}
        grads = {n: (p.grad.detach().reshape(-1).clone() if p.grad is not None else torch.zeros_like(values[n]))
                 for n, p in named}  # fmt: skip
        params = dict(named)

        @torch.no_grad()
        def loss_at(substituted: Mapping[str, torch.Tensor]) -> float:
            for n, v in substituted.items():
                params[n].copy_(v.reshape(params[n].shape))
            try:
                return float(loss_now())
            finally:
                for n in substituted:
                    params[n].copy_(values[n].reshape(params[n].shape))

        problem = _Problem(values, grads, {n: list(p.shape) for n, p in named}, loss_at, float(base.detach()))
        problem.forward_passes = 1  # the forward behind the analytic gradient
        device = next(iter(values.values())).device
        return _run(problem, mode, directions, elements_per_tensor, eps, seed, device)


def grad_check_arrays(
    params: Mapping[str, object],
    loss: Callable[[dict[str, object]], float],
    grads: Mapping[str, object],
    *,
    mode: Mode = "directional",
    directions: int = 3,
    elements_per_tensor: int = 8,
    eps: float = 1e-5,
    seed: int = 0,
) -> GradCheckResult:
    """The same check for any framework: ``params`` maps names to numpy arrays,
    ``loss(params)`` returns the scalar loss, ``grads`` maps the same names to the
    analytic gradients the framework computed. ``loss`` is called with float64 copies
    of the arrays; ``params`` themselves are never modified."""
    import numpy as np

    missing = set(params) ^ set(grads)
    if missing:
        raise ValueError(f"params and grads must have the same names; mismatched: {sorted(missing)}")
    arrays = {n: np.asarray(a, dtype=np.float64) for n, a in params.items()}
    shapes = {n: list(a.shape) for n, a in arrays.items()}
    for n, g in grads.items():
        if np.shape(g) != tuple(shapes[n]):
            raise ValueError(f"gradient of {n!r} has shape {list(np.shape(g))}, parameter has {shapes[n]}")
    values = {n: torch.from_numpy(a.reshape(-1).copy()) for n, a in arrays.items()}
    grad_values = {n: torch.from_numpy(np.asarray(g, dtype=np.float64).reshape(-1).copy()) for n, g in grads.items()}

    def loss_at(substituted: Mapping[str, torch.Tensor]) -> float:
        current = {n: a.copy() for n, a in arrays.items()}
        for n, v in substituted.items():
            current[n] = v.numpy().reshape(shapes[n]).copy()
        return float(loss(current))

    base_loss = float(loss({n: a.copy() for n, a in arrays.items()}))
    problem = _Problem(values, grad_values, shapes, loss_at, base_loss)
    problem.forward_passes = 1
    return _run(problem, mode, directions, elements_per_tensor, eps, seed, torch.device("cpu"))


# --------------------------------------------------------------------------- the check


def _status(error: float) -> Literal["ok", "suspect", "bug"]:
    if error <= OK_THRESHOLD:
        return "ok"
    return "suspect" if error <= BUG_THRESHOLD else "bug"


def _run(problem: _Problem, mode: Mode, directions: int, elements_per_tensor: int, eps: float,
         seed: int, device: torch.device) -> GradCheckResult:  # fmt: skip
    if directions < 1 or elements_per_tensor < 1 or not eps > 0:
        raise ValueError("directions and elements_per_tensor must be >= 1 and eps > 0")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    joint: float | None = None
    if mode == "directional":
        joint, parameters = _directional(problem, directions, eps, generator, device)
    elif mode == "elementwise":
        parameters = _elementwise(problem, elements_per_tensor, eps, generator)
    else:
        raise ValueError(f"mode must be 'directional' or 'elementwise', got {mode!r}")
    worst = max([p.relative_error for p in parameters] + ([joint] if joint is not None else []), default=0.0)
    bugs = [p.name for p in parameters if p.status == "bug"]
    suspects = [p.name for p in parameters if p.status == "suspect"]
    if bugs:
        status, text = "failed", f"gradient disagrees with finite differences in: {', '.join(bugs)}"
    elif _status(worst) == "bug":
        status, text = "failed", "the joint check failed but no single tensor did: the error is spread over tensors"
    elif suspects or _status(worst) == "suspect":
        status = "passed"
        text = (f"suspect (relative error between {OK_THRESHOLD:g} and {BUG_THRESHOLD:g})"
                + (f": {', '.join(suspects)}" if suspects else ""))
    elif joint is not None and not parameters:
        status, text = "passed", f"all {len(problem.values)} tensors agree along {directions} random directions"
    else:
        status, text = "passed", f"{len(parameters)} tensors agree with finite differences"
    return GradCheckResult(status=status, message=text, mode=mode, eps=eps, max_relative_error=worst,
                           forward_passes=problem.forward_passes, parameters=parameters)  # fmt: skip


def _random_unit(shape_numel: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    v = torch.randn(shape_numel, generator=generator, dtype=torch.float64).to(device)
    return v / torch.linalg.vector_norm(v).clamp_min(1e-300)


def _directional(problem: _Problem, directions: int, eps: float, generator: torch.Generator,
                 device: torch.device) -> tuple[float, list[GradCheckParam]]:  # fmt: skip
    """(worst joint error, per-tensor results — empty when the joint check is clean)."""
    names = list(problem.values)
    share = 1.0 / math.sqrt(len(names))
    joint_errors = []
    for _ in range(directions):
        direction = {n: share * _random_unit(problem.values[n].numel(), generator, device) for n in names}
        joint_errors.append(problem.relative_error(problem.central_difference(direction, eps),
                                                   problem.analytic(direction)))  # fmt: skip
    joint = max(joint_errors)
    if joint <= OK_THRESHOLD:
        return joint, []
    # localise: the same check confined to one tensor at a time
    parameters = []
    for n in names:
        errors = []
        for _ in range(directions):
            direction = {n: _random_unit(problem.values[n].numel(), generator, device)}
            errors.append(problem.relative_error(problem.central_difference(direction, eps),
                                                 problem.analytic(direction)))  # fmt: skip
        error = max(errors)
        parameters.append(GradCheckParam(name=n, relative_error=error, status=_status(error)))
    return joint, parameters


def _elementwise(problem: _Problem, elements_per_tensor: int, eps: float,
                 generator: torch.Generator) -> list[GradCheckParam]:  # fmt: skip
    parameters = []
    for n, value in problem.values.items():
        numel = value.numel()
        worst_error, worst_flat = 0.0, 0
        for flat in _spread_indices(numel, elements_per_tensor, generator):
            unit = torch.zeros_like(value)
            unit[flat] = 1.0
            error = problem.relative_error(problem.central_difference({n: unit}, eps),
                                           float(problem.grads[n][flat]))  # fmt: skip
            if error >= worst_error:
                worst_error, worst_flat = error, flat
        index = list(torch.unravel_index(torch.tensor(worst_flat), problem.shapes[n])) if problem.shapes[n] else []
        parameters.append(GradCheckParam(name=n, relative_error=worst_error, status=_status(worst_error),
                                         worst_index=[int(i) for i in index]))  # fmt: skip
    return parameters


def _spread_indices(numel: int, count: int, generator: torch.Generator) -> list[int]:
    """One random index per equal stratum of the flat tensor: every region is sampled."""
    if numel <= count:
        return list(range(numel))
    bounds = torch.linspace(0, numel, count + 1).long().tolist()
    return [lo + int(torch.randint(hi - lo, (1,), generator=generator)) for lo, hi in zip(bounds, bounds[1:])]

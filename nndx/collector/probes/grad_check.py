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
probe localises by halving: the same check with directions confined to half the tensors,
then to half of a half that is not clean, down to the faulty tensor(s) — a few dozen
checks for a network of hundreds of tensors, not one per tensor.

Element-wise mode perturbs single elements sampled across each tensor (one per
stratum, so the far end of a tensor is checked too — the lesson checks only the first 5
elements, and a wrong gradient in element 6 passes) and reports the worst index.

Thresholds (relative error): ≤ 1e-5 ok, ≤ 1e-3 suspect, above that a bug.

Round-off: L itself is only known to about ``ROUNDOFF · max(1, |L|)`` in float64 — an
absolute noise, not one relative to L: a cross-entropy near 0 is −log p with p near 1,
whose rounding is ~1e-16 per sample however small L is. The central difference carries
a noise of ``ROUNDOFF · max(1, |L|) / ε``, which grows as ε shrinks and dominates a
trained model's tiny directional derivatives (loss 1e-5: derivatives ~1e-7, noise
~1e-9 at ε = 1e-8). The relative error is the discrepancy beyond that noise; a
difference is "ok" only when that error is ≤ 1e-5 *and* the noise is under 1e-3 of the
derivative (a bug-sized error would have shown); one whose noise is too large to tell
makes a tensor at most "suspect" (as does a kink), while a "bug" needs an error above
1e-3 beyond the noise.

Kinks: a difference across a ReLU kink is wrong however right the backward is, and in a
ReLU network some pre-activation is often within ε of zero. So every forward records
which side of its kink each non-smooth operation is on: the sign of every leaf
module's input and output, and, seen through
:class:`~nndx.collector.probes._observe.ForwardObserver`, the input of every functional
``relu``/``abs``/``leaky_relu``, the bounds of ``clamp``/``hardtanh``, a max-pool's
argmax, ``maximum``'s winner and every comparison (``h > 0.01`` in a ``torch.where``).
When w±εv changes that pattern, the difference is redone with ε/10 (up to 4 times), and
one that still crosses can make a tensor "suspect", never a "bug". The numpy form sees
no kinks.

Precision: the check runs on a float64 copy. A forward that computes in less (an
explicit ``.float()`` inside it, a model that cannot run in float64 and is checked in
float32) rounds at that precision: the round-off and the step ε are taken from the
least precise dtype the forward computed in (ε at least eps^(1/3), which balances
rounding against curvature), so float32 rounding is not called a wrong backward.

An embedding's ``padding_idx`` only zeroes its row's gradient, by design (the row is never
trained, though a forward may read it: MemN2N refills its nil rows with ``normal_``): the copy's
embeddings drop it, so the backward checked is the forward's true derivative.

Whose backward: torch's own derivatives are tested code. A failed check whose backward graph
has no node of anyone else's (no custom ``autograd.Function``, no module or gradient hook, no
``.data`` or ``detach`` in the forward) is the forward's rounding, not a wrong backward: its
tensors are "suspect" (node2vec's ``log(1 - sigmoid(x) + 1e-15)`` at x > 30 was off by 15%). A
tensor with no autograd gradient at all stays a bug: the graph is cut. A tensor whose loss is
flat (no difference along any checked direction, though autograd gives it a gradient) is read
through a sign, round or step and given a surrogate gradient on purpose, a straight-through
estimator's (BinaryNet's binarized weights): it is marked ``loss_flat`` and does not fail the check.

Randomness and state: the loss must be the same function at every evaluation, so every
forward runs with the same seed (identical dropout masks); batch-norm in train mode is
a deterministic function of the batch and is checked as is. Two more evaluations at the
unchanged parameters must give the same loss: a forward that keeps state between calls
or draws randomness outside torch's generator is no function of the parameters, and
the check says ``skipped`` instead of blaming the backward; so does one that writes the
model's own untrained tensors (MoCo's momentum update of its key encoder from the
trained one: a path around autograd by design). Autocast is off. The user's
model and RNG are untouched.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    dense_gradients,
    forward,
    forwards_under_autocast,
    forward_writes,
    is_torch_code,
    iter_tensors,
    loss_name,
    map_tensors,
    preserved_rng,
    seed_all,
    split_batch,
    trainable_tensors,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.collector.stats import iter_named_leaves
from nndx.collector.probes._observe import ForwardObserver, coarsest, float_dtypes
from nndx.report import GradCheckParam, GradCheckResult

OK_THRESHOLD = 1e-5
BUG_THRESHOLD = 1e-3
# Denominator floor of the relative error, relative to max(1, |L|): a derivative this
# small is indistinguishable from float64 round-off in the finite difference, so a
# truly-zero gradient (an unused parameter, a dead unit) is not reported as a bug.
RELATIVE_FLOOR = 1e-8
# Bound on the float64 round-off of one loss evaluation, relative to max(1, |L|) (the
# machine epsilon; measured on a cross-entropy of 1e-5: ~3e-17 absolute). The central
# difference (L+ − L−) / 2ε is then uncertain by ROUNDOFF · max(1, |L|) / ε.
ROUNDOFF = 2.0**-52
# A forward that computes in float32 or less (an explicit .float() inside it) rounds in
# every op, not once: its loss is known to about this many of its eps.
LOW_PRECISION_SAFETY = 16.0
# The loss's own gradient (w.r.t. the outputs) off its finite difference by more than this
# share: a stop-gradient in the loss, not rounding (see _loss_stops_gradients)
STOP_GRADIENT_GAP = 1e-2
# the first forward's detaches whose paths are compared, and the nodes walked from each
MAX_RECORDED_DETACHES = 64  # a chain shows in its first links: bounds the walks at 64 x MAX_WALKED_NODES
MAX_WALKED_NODES = 10_000

Mode = Literal["directional", "elementwise"]


Pattern = list[torch.Tensor]  # which side of each kink every activation is on
# One central difference: (relative error beyond round-off, smooth: crossed no kink,
# resolved: its round-off could not hide a bug-sized error)
Difference = tuple[float, bool, bool]
# A finite difference that crosses a kink (a ReLU input changing sign between w−εv and
# w+εv) is wrong however correct the backward is; ε is divided by 10 up to this many times.
MAX_SHRINKS = 4


class _OutOfForwards(Exception):
    """The check's budget of forwards is spent."""


class _Problem:
    """The function under test: flat float64 parameter vectors, their analytic
    gradients, and L evaluated at substituted parameter values (counting forwards).

    ``loss_at`` returns the loss and, for a torch model, the kink pattern of that
    forward (``None`` when unknown); ``base_pattern`` is the pattern at w, where the
    analytic gradient was taken."""

    def __init__(
        self,
        values: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        shapes: dict[str, list[int]],
        loss_at: Callable[[Mapping[str, torch.Tensor]], tuple[float, Pattern | None]],
        base_loss: float,
        base_pattern: Pattern | None = None,
        roundoff: float = ROUNDOFF,
        max_forwards: int | None = None,
    ) -> None:
        self.values, self.grads, self.shapes = values, grads, shapes
        self.roundoff = roundoff
        self._loss_at = loss_at
        self.base_loss = base_loss
        self.base_pattern = base_pattern
        self.forward_passes = 0
        self.kinks_avoided = 0  # differences redone with a smaller ε
        self.kinks_unresolved = 0
        self.max_forwards = self.budget = max_forwards
        self.out_of_forwards = False

    def loss(self, substituted: Mapping[str, torch.Tensor]) -> tuple[float, Pattern | None]:
        if self.max_forwards is not None and self.forward_passes >= self.max_forwards:
            self.out_of_forwards = True
            raise _OutOfForwards
        self.forward_passes += 1
        return self._loss_at(substituted)

    def check(self, direction: Mapping[str, torch.Tensor], analytic: float, eps: float) -> Difference:
        """The central difference along ``direction`` against ``analytic``: (relative error
        beyond round-off, whether it was smooth — crossed no kink —, whether round-off was
        small enough to resolve a bug-sized error)."""
        for _ in range(MAX_SHRINKS + 1):
            (plus, plus_pattern), (minus, minus_pattern) = self.either_side(direction, eps)
            error, resolved = self.relative_error((plus - minus) / (2 * eps), analytic, eps)
            if self.base_pattern is None or (_same(plus_pattern, self.base_pattern)
                                             and _same(minus_pattern, self.base_pattern)):  # fmt: skip
                return error, True, resolved
            if error <= OK_THRESHOLD and resolved:  # crossed, but too little to matter
                return error, True, resolved
            self.kinks_avoided += 1
            eps /= 10
        self.kinks_unresolved += 1
        return error, False, resolved

    def either_side(self, direction: Mapping[str, torch.Tensor], eps: float) -> tuple[tuple, tuple]:
        """The loss (and its kink pattern) at w + εv and at w − εv."""
        return tuple(self.loss({n: self.values[n] + sign * eps * d for n, d in direction.items()})
                     for sign in (1.0, -1.0))  # fmt: skip

    def flat(self, direction: Mapping[str, torch.Tensor], eps: float) -> bool:
        """Whether the loss does not move at all along ``direction``, beyond its round-off: the
        forward reads the tensor through a sign, round or step, flat wherever it is defined."""
        (plus, _), (minus, _) = self.either_side(direction, eps)
        return abs(plus - minus) <= 2 * self.roundoff * max(1.0, abs(self.base_loss))

    def analytic(self, direction: Mapping[str, torch.Tensor]) -> float:
        return float(sum(torch.dot(self.grads[n].double(), d.double()) for n, d in direction.items()))

    def relative_error(self, numeric: float, analytic: float, eps: float) -> tuple[float, bool]:
        """(|numeric − analytic| beyond the round-off of the difference at ``eps``, relative
        to the larger derivative (at least the floor); whether that round-off is below
        BUG_THRESHOLD of the derivative, so that a bug-sized error would show)."""
        if not (math.isfinite(numeric) and math.isfinite(analytic)):
            return math.inf, True
        scale = max(1.0, abs(self.base_loss))
        noise = self.roundoff * scale / eps
        floor = RELATIVE_FLOOR * scale
        magnitude = max(abs(numeric), abs(analytic))
        error = max(0.0, abs(numeric - analytic) - noise) / max(magnitude, floor)
        # a derivative under the floor counts as zero (agreeing to within the floor is ok)
        return error, magnitude <= floor or noise <= BUG_THRESHOLD * magnitude


def _same(a: Pattern | None, b: Pattern) -> bool:
    return a is not None and len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# Activations whose kinks are not at 0: (lower, upper) bounds of their linear piece.
_KINKS: dict[type[nn.Module], tuple[float, float]] = {
    nn.ReLU6: (0.0, 6.0), nn.Hardtanh: (-1.0, 1.0), nn.Hardsigmoid: (-3.0, 3.0), nn.Hardswish: (-3.0, 3.0),
}  # fmt: skip


def _record_kinks(model: nn.Module, pattern: Pattern) -> list[torch.utils.hooks.RemovableHandle]:
    """Forward hooks that append, for every leaf module, the sign of its output and of
    its first input (a ReLU module's input, or a Linear output fed to ``F.relu`` in the
    parent's code), plus the bounds of hard-clipping activations. Conservative beside the
    ops the observer records: a sign change where no kink is only costs a retry with a
    smaller ε. (Without them, SRGAN's healthy generator failed the check: its last conv's
    gradient off by 14% at the step and at half of it; the cause is not found yet.)"""

    def hook(module: nn.Module, inputs: tuple, output: object) -> None:
        first_input = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
        for t in (first_input, output):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.layout == torch.strided:  # not a sparse input
                pattern.append(t.detach() > 0)
        bounds = _KINKS.get(type(module))
        if bounds is not None and first_input is not None:
            lo = getattr(module, "min_val", bounds[0])
            hi = getattr(module, "max_val", bounds[1])
            pattern.append((first_input.detach() > lo) & (first_input.detach() < hi))

    return [m.register_forward_hook(hook) for _, m in iter_named_leaves(model)]


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
    max_forwards: int = 300,
) -> GradCheckResult:
    """Check the model's autograd gradients of ``loss_fn`` on ``batch`` in float64 (in
    float32 when the model cannot run in float64). ``max_forwards`` bounds the check's cost on
    a model whose differences cross kinks wherever they go (hundreds of tensors behind ReLUs
    and max-pools): the check stops there and says so."""
    inputs, targets = split_batch(batch)

    def check(dtype: torch.dtype, **options: Any) -> GradCheckResult:
        return _check_in(dtype, model, inputs, targets, loss_fn, mode, directions, elements_per_tensor, eps, seed,
                         max_forwards, **options)  # fmt: skip

    with preserved_rng(), _no_autocast(model):
        try:
            stopped = _StopGradients()
            result = check(torch.float64, through=stopped)
            if result.status == "failed" and is_torch_code(loss_fn) and not result.loss_projected:
                # torch's own loss is tested code: outputs at the edge of its domain (BCELoss clamps
                # p(1 - p) in its backward) make its gradient differ from its differences there
                again = check(torch.float64, project=True)
                if again.status != "failed":  # but through saturated outputs, agreeing says little: not a pass
                    again.status = "skipped"
                    again.message = (f"{loss_name(loss_fn)}'s own gradient disagrees with its differences at "
                                     "these outputs (at the edge of its domain: a clamp in saturation); the model's "
                                     "backward, checked through a random projection of its outputs instead, does "
                                     "not, which at saturated outputs proves little: "
                                     + (again.message or ""))  # fmt: skip
                    return again
            if result.status == "failed" and result.stop_gradients:
                return _through_stop_gradients(result, stopped, lambda through: check(torch.float64, through=through))
            return result
        except (RuntimeError, ValueError, TypeError) as exc:  # an RNN's dtype check raises ValueError
            if "dtype" not in str(exc).lower() and "double" not in str(exc).lower():
                raise
            result = check(torch.float32)
            result.message = (f"checked in float32: the model does not run in float64 ({str(exc)[:120]}); "
                              + (result.message or ""))  # fmt: skip
            return result


class _LowestPrecision(TorchFunctionMode):
    """The least precise floating dtype any torch call computed while active: a loss that
    casts with ``.float()`` (Pytorch-UNet's Dice term) rounds in float32 whatever the
    model's copy computes in."""

    def __init__(self) -> None:
        super().__init__()
        self.lowest: torch.dtype | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.lowest = coarsest([self.lowest, *float_dtypes(out)])
        return out


class _StopGradients(TorchFunctionMode):
    """Counts the ``detach()`` calls made while active; with ``let_through``, each returns
    its input instead, so gradients flow where the forward meant to stop them. Counts too,
    in ``by_hand``, the other ways a forward makes a gradient that is not torch's own
    derivative of its ops: a hook on a tensor's gradient, and ``.data``, through which writes
    reach saved tensors unseen by autograd."""

    def __init__(self, let_through: bool = False) -> None:
        super().__init__()
        self.let_through = let_through
        self.calls = 0
        self.by_hand = 0
        self.recording = True  # the first forward's detaches, in order
        self.sources: list[set[Any]] = []
        self.links: list[set[int]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in ("detach", "detach_") and args and isinstance(args[0], torch.Tensor) and not _called_by_nndx():
            self.calls += 1
            if self.recording and len(self.links) < MAX_RECORDED_DETACHES:
                self._record(args[0].grad_fn)
            if self.let_through:
                return args[0]
        data = name == "__get__" and getattr(func, "__self__", None) is torch.Tensor.data
        if (data or name in ("register_hook", "register_post_accumulate_grad_hook")) and not _called_by_nndx():
            self.by_hand += 1
        return func(*args, **(kwargs or {}))

    def _record(self, node: Any) -> None:
        """Which earlier detaches' inputs this one's input is computed from (``links``). Letting
        gradients through, a detach is the identity, so its input's node is what a later input
        reaches when computed from its output; stopping them, only another path reaches it, or
        the nodes it was computed from (a straight-through ``x + (q - x).detach()`` keeps ``x``)."""
        reached = _reached_nodes(node, MAX_WALKED_NODES)
        self.links.append({k for k, source in enumerate(self.sources) if source & reached})
        if node is None:
            self.sources.append(set())
        elif self.let_through:
            self.sources.append({node})
        else:
            self.sources.append({node, *(n for n, _ in node.next_functions
                                         if n is not None and type(n).__name__ != "AccumulateGrad")})


def _reached_nodes(node: Any, budget: float) -> set[Any]:
    """The backward nodes reachable from ``node``, parameters' accumulators left out (shared
    by every use of a parameter, they say nothing about the path), at most ``budget``."""
    seen: set[Any] = set()
    stack = [node]
    while stack and len(seen) < budget:
        current = stack.pop()
        if current is None or current in seen or type(current).__name__ == "AccumulateGrad":
            continue
        seen.add(current)
        stack.extend(n for n, _ in current.next_functions)
    return seen


def chained_detaches(stopped: _StopGradients, through: _StopGradients) -> int:
    """The detaches whose input is computed from an earlier detach's output with no other
    path for the gradient: a state detached and computed on, the cut repeated at every step
    of a recurrence or a tree. Not a target branch (SimSiam's ``z.detach()``: nothing is
    computed from it) nor a straight-through estimator (its input keeps a path)."""
    return sum(bool(linked - kept) for linked, kept in zip(through.links, stopped.links))


def _custom_backward_nodes(loss: torch.Tensor, params: list[torch.Tensor]) -> int:
    """The backward nodes behind ``loss`` that run Python code of someone's own: custom
    ``autograd.Function``s and module backward hooks (torch's ``BackwardCFunction``), and
    gradient hooks on the parameters."""
    custom = torch.autograd.function.BackwardCFunction
    count = sum(isinstance(node, custom) for node in _reached_nodes(loss.grad_fn, math.inf))
    hooked = sum(bool(getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None))
                 for p in params)  # fmt: skip
    return count + hooked


def _torch_derivatives_only(result: GradCheckResult) -> None:
    """A failed check of a backward made only of torch's own derivatives: the disagreement
    is the forward's rounding, not a wrong backward. Torch's derivatives are tested; the
    differences of a forward that loses its precision are not (node2vec's ``log(1 -
    sigmoid(x) + 1e-15)`` at x > 30, where ``1 - sigmoid(x)`` is a staircase of float64's
    quanta: off by 15% although every node is torch's; softmax without the max subtracted).
    A tensor with no autograd gradient at all stays a bug (NNDX615's: the graph is cut)."""
    for param in result.parameters:
        if param.status == "bug" and not param.autograd_zero and math.isfinite(param.relative_error):
            param.status = "suspect"
    if any(p.status == "bug" for p in result.parameters) or not math.isfinite(result.max_relative_error or 0.0):
        return
    result.status = "passed"
    result.message = (f"differences disagree with the backward (max relative error {result.max_relative_error:.3g}), "
                      "but every node of the backward is torch's own derivative (no custom autograd.Function, no "
                      "gradient hook, no .data or detach in the forward): the forward's rounding, not a wrong "
                      "backward (a loss that loses its precision, such as log(1 - sigmoid(x)) at large x)")


def _called_by_nndx() -> bool:
    """Whether the code calling into torch is nndx's own (the observers' hooks record
    kinks with ``t.detach() > 0``): only the model's and the loss's detaches count."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch"):
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith("nndx.")


def _through_stop_gradients(failed: GradCheckResult, stopped: _StopGradients,
                            check: Callable[[_StopGradients], GradCheckResult]) -> GradCheckResult:  # fmt: skip
    """A check that failed where the forward detaches, rerun with the detaches letting
    gradients through. Agreement then says the backward is right and the disagreement was
    the stop-gradients: on purpose in SimSiam's targets and straight-through estimators, a
    bug where they cut a path the loss needs (torchdiffeq's state detached inside the
    dynamics). A tensor with no autograd gradient at all is NNDX615's, and stays failed."""
    if any(p.autograd_zero for p in failed.parameters if p.status == "bug"):
        return failed
    through = _StopGradients(let_through=True)
    try:
        again = check(through)
    except Exception:  # noqa: BLE001 - a forward that needs its detach (x.detach().numpy()) keeps the verdict
        return failed
    if again.status == "failed":
        return failed
    again.stop_gradients = failed.stop_gradients
    again.chained_stop_gradients = chained_detaches(stopped, through)
    again.forward_passes += failed.forward_passes
    error = f" (max relative error {failed.max_relative_error:.3g})" if failed.max_relative_error is not None else ""
    again.message = (f"the backward differs from finite differences{error} only through the forward's "
                     f"{failed.stop_gradients} detach() calls: with them letting gradients through, it agrees. Those "
                     "stop-gradients are the difference — on purpose for a target branch (SimSiam, BYOL) or a "
                     "straight-through estimator; a bug where they cut a path the loss needs (a recurrent or ODE "
                     "state detached inside the step"
                     + (f": {again.chained_stop_gradients} of them detach a tensor computed from an earlier detach's "
                        "output, with no other path for its gradient" if again.chained_stop_gradients else "")
                     + "); " + (again.message or ""))  # fmt: skip
    return again


def _no_autocast(model: nn.Module) -> contextlib.AbstractContextManager:
    """Autocast off: the check is of the backward's math, in float64, whatever the
    training's precision."""
    stack = contextlib.ExitStack()
    stack.enter_context(forwards_under_autocast(None))
    device = next((p.device.type for p in nn.Module.parameters(model)), "cpu")
    if device in ("cpu", "cuda"):
        stack.enter_context(torch.autocast(device_type=device, enabled=False))
    return stack


def _check_in(dtype: torch.dtype, model: nn.Module, inputs: object, targets: object, loss_fn: LossFn, mode: Mode,
              directions: int, elements_per_tensor: int, eps: float, seed: int, max_forwards: int | None = None,
              project: bool = False, through: _StopGradients | None = None) -> GradCheckResult:  # fmt: skip
    model_copy = dense_gradients(working_copy(model)).to(dtype)
    for module in nn.Module.modules(model_copy):
        if type(module) is nn.Embedding:  # padding_idx only zeroes its row's gradient (an EmbeddingBag's leaves it out)
            module.padding_idx = None
    inputs, targets = (map_tensors(t, lambda x: x.to(dtype) if x.is_floating_point() else x)
                       for t in (inputs, targets))  # fmt: skip
    named = trainable_tensors(model_copy)
    if not named:
        return GradCheckResult(status="skipped", mode=mode, eps=eps, message="no trainable parameters")
    checked_loss = loss_fn is not None
    try:
        stops = _loss_stops_gradients(model_copy, inputs, targets, loss_fn, seed, project) if checked_loss else None
    except Exception:  # noqa: BLE001 - outputs the loss cannot take rebuilt: check the loss as it is
        stops = None
    if stops is not None:
        loss_fn, targets = stops

    in_loss = _LowestPrecision()
    detaches = through or _StopGradients()

    def loss_now() -> torch.Tensor:
        seed_all(seed)  # the same dropout mask at every evaluation
        seen.kink_pattern = pattern  # functional kinks (F.relu, clamp, max-pool, comparisons) join the modules'
        with detaches:
            output = forward(model_copy, inputs)
            with in_loss:
                return compute_loss(loss_fn, output, targets)

    pattern: Pattern = []
    handles = _record_kinks(model_copy, pattern)
    try:
        with ForwardObserver(model_copy, kinks=True) as seen:
            nn.Module.zero_grad(model_copy, set_to_none=True)  # not an override: MAML's takes no set_to_none
            base = loss_now()
            detaches.recording = False
            detach_calls = detaches.calls  # in one forward and loss
            torch_only = (detaches.by_hand == 0 and detach_calls == 0
                          and _custom_backward_nodes(base, [p for _, p in named]) == 0)  # fmt: skip
            base.backward()
            base_pattern = list(pattern)
            # the least precise dtype the forward or the loss computed in (an explicit .float()
            # inside either, say): its rounding, not float64's, is what the differences can resolve
            precision = coarsest([seen.lowest_precision, in_loss.lowest, dtype])
            values = {n: p.detach().reshape(-1).clone() for n, p in named}
            grads = {n: (p.grad.detach().reshape(-1).clone() if p.grad is not None else torch.zeros_like(values[n]))
                     for n, p in named}  # fmt: skip
            params = dict(named)

            @torch.no_grad()
            def loss_at(substituted: Mapping[str, torch.Tensor]) -> tuple[float, Pattern]:
                for n, v in substituted.items():
                    params[n].copy_(v.reshape(params[n].shape))
                pattern.clear()
                try:
                    return float(loss_now()), list(pattern)
                finally:
                    for n in substituted:
                        params[n].copy_(values[n].reshape(params[n].shape))

            roundoff = torch.finfo(precision).eps * (1.0 if precision == torch.float64 else LOW_PRECISION_SAFETY)
            problem = _Problem(values, grads, {n: list(p.shape) for n, p in named}, loss_at,
                               float(base.detach()), base_pattern, roundoff, max_forwards)  # fmt: skip
            problem.forward_passes = 1  # the forward behind the analytic gradient
            unstable = _not_a_function(problem)
            if unstable is None:
                problem.forward_passes += 1
                unstable = _random_backward(loss_now, named, grads, seed)
            overwritten, rewritten = _overwritten(params, values, loss_now) if unstable is None else ({}, [])
            pattern.clear()
            problem.forward_passes += 2 if unstable is None else 0  # _overwritten's two nudged forwards
            if rewritten:
                unstable = (f"the forward rewrites {', '.join(rewritten[:3])} in place from its own values (a "
                            "renormalisation through weight.data): its loss depends on those parameters outside "
                            "autograd, which finite differences see and the backward by design does not")  # fmt: skip
            for n, entries in overwritten.items():  # no forward reads what a step puts there: no gradient to check
                grads[n] = grads[n].masked_fill(entries, 0.0)
            written = forward_writes(model_copy)
            if unstable is None and written:
                unstable = (f"the forward writes the model's own untrained tensors ({', '.join(written[:3])}: "
                            "a momentum update, a queue): its loss depends on the parameters outside autograd, which "
                            "finite differences see and the backward by design does not")  # fmt: skip
            if unstable is not None:
                return GradCheckResult(status="skipped", mode=mode, eps=eps, forward_passes=problem.forward_passes,
                                       message=unstable)  # fmt: skip
            step = max(eps, torch.finfo(precision).eps ** (1 / 3))  # the step that balances rounding and curvature
            device = next(iter(values.values())).device
            result = _run(problem, mode, directions, elements_per_tensor, step, seed, device)
    finally:
        for h in handles:
            h.remove()
    if result.status == "failed" and torch_only:
        _torch_derivatives_only(result)
    if result.status == "failed" and not detaches.let_through:
        result.stop_gradients = detach_calls
    if checked_loss:
        result.forward_passes += 1  # the forward whose outputs the loss's own gradient was checked on
    if overwritten:
        entries = sum(int(m.sum()) for m in overwritten.values())
        result.message = (f"the forward overwrites {entries} entries of {', '.join(list(overwritten)[:3])} itself (a "
                          "mask applied to weight.data in place): no forward reads what a step puts there, so their "
                          "gradients were left out; " + (result.message or "")).rstrip("; ")  # fmt: skip
    if stops is not None and not project:
        result.loss_projected = True
        result.message = (STOP_GRADIENT_NOTE + "; " + (result.message or "")).rstrip("; ")
    if precision != torch.float64:
        result.message = (f"the forward or the loss computes in {str(precision).removeprefix('torch.')}: "
                          f"differences judged against its rounding (eps {step:.2g}); "
                          + (result.message or ""))  # fmt: skip
    return result


STOP_GRADIENT_NOTE = (
    "the loss's own gradient is not the derivative of its value (a stop-gradient in it: .detach() or .item() "
    "on the outputs, as actor-critic advantages and target networks do on purpose): checked the gradient of "
    "a fixed random projection of the model's outputs instead"
)


def _loss_stops_gradients(model_copy: nn.Module, inputs: object, targets: object, loss_fn: LossFn,
                          seed: int, always: bool = False) -> tuple[LossFn, None] | None:  # fmt: skip
    """A stand-in for ``loss_fn`` when the loss itself, as a function of the model's
    outputs, has an autograd gradient that finite differences contradict; else None.

    Such a loss stops gradients on purpose (an advantage ``R - value.detach()``, a
    target computed from the outputs under ``no_grad``): differences of it see the
    stopped path, autograd does not, and every model would look broken. The backward
    worth checking is the model's, so the stand-in is ``<r, outputs>`` for a fixed random
    ``r``, which any correct backward differentiates exactly. (A custom backward inside
    the loss itself is then not checked.) ``always``: the stand-in without comparing."""
    torch.manual_seed(seed)
    with torch.no_grad():
        output = forward(model_copy, inputs)
    floats = [t for t in iter_tensors(output) if t.is_floating_point()]
    if not floats:
        return None

    def with_floats(values: list[torch.Tensor]) -> object:
        queue = iter(values)
        rebuilt = map_tensors(output, lambda t: next(queue) if t.is_floating_point() else t)
        if isinstance(output, dict) and type(output) is not dict:
            rebuilt = type(output)(**rebuilt)  # a Hugging Face ModelOutput: the loss reads .logits
        return rebuilt

    generator = torch.Generator().manual_seed(seed)

    def projected(out: object, _targets: object) -> torch.Tensor:
        return sum(((w * t).sum() for w, t in zip(weights, (t for t in iter_tensors(out) if t.is_floating_point()))),
                   torch.zeros((), dtype=weights[0].dtype))  # fmt: skip

    if always:
        weights = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in floats]
        return projected, None
    leaves = [t.detach().clone().requires_grad_() for t in floats]
    in_loss = _LowestPrecision()
    with in_loss:
        # clones of the leaves: a loss that works in place on what it is given (CenterNet's sigmoid_)
        # may not on a leaf that requires grad, and gets through a clone to the leaf all the same
        loss = compute_loss(loss_fn, with_floats([t.clone() for t in leaves]), targets)
    if not loss.requires_grad:
        return None
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    precision = coarsest([*float_dtypes(floats), in_loss.lowest])
    step = torch.finfo(precision).eps ** (1 / 3)
    noise = torch.finfo(precision).eps * max(1.0, abs(float(loss.detach()))) / step
    for _ in range(2):
        direction = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in leaves]
        norm = math.sqrt(sum(float((d * d).sum()) for d in direction)) or 1.0
        direction = [d / norm for d in direction]
        analytic = sum(float((g * d).sum()) for g, d in zip(grads, direction) if g is not None)
        with torch.no_grad():
            plus, minus = (float(compute_loss(loss_fn, with_floats([t + sign * step * d
                                                                    for t, d in zip(leaves, direction)]), targets))
                           for sign in (1.0, -1.0))  # fmt: skip
        numeric = (plus - minus) / (2 * step)
        gap = abs(numeric - analytic)
        if gap > 64 * noise and gap > STOP_GRADIENT_GAP * max(abs(numeric), abs(analytic)):
            weights = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in floats]
            return projected, None
    return None


@torch.no_grad()
def _overwritten(params: Mapping[str, nn.Parameter], values: Mapping[str, torch.Tensor],
                 loss_now: Callable[[], torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:  # fmt: skip
    """Entries of the trainable parameters that the forward itself overwrites, as flat
    masks: jzbontar/pixelcnn-pytorch masks its convolutions with ``weight.data *= mask`` at
    every forward. Autograd gives the masked entries a gradient, but a value put there (one
    forward after a nudge of every entry) never survives to be used, and finite differences
    rightly see no effect. Entries it rewrites from their own values (TransE renormalises its
    entity rows with ``weight.data.div_(norm)``) make the loss a function of the parameters
    outside autograd: their names come back second, and no gradient of theirs can be checked."""
    written = []
    for size in (1e-3, 2e-3):  # a mask writes the same value whatever was there
        nudged = {n: v + (v.abs() + 1.0) * size for n, v in values.items()}
        for n, v in nudged.items():
            params[n].copy_(v.reshape(params[n].shape))
        try:
            loss_now()
            written.append({n: (params[n].detach().reshape(-1) != v, params[n].detach().reshape(-1).clone())
                            for n, v in nudged.items()})  # fmt: skip
        finally:
            for n in nudged:
                params[n].copy_(values[n].reshape(params[n].shape))
    (first, second) = written
    found = {n: m for n, (m, _) in first.items() if bool(m.any())}
    rewritten = [n for n, m in found.items() if bool((first[n][1][m] != second[n][1][m]).any())]
    return found, rewritten


def _not_a_function(problem: _Problem) -> str | None:
    """Why finite differences cannot check this loss, or None: evaluated twice more at
    the same parameters it must give the same value (within rounding). A forward that
    keeps state between calls (a counter, a cached hidden state) or draws randomness
    outside torch's generator is no function of the parameters."""
    again = [problem.loss({})[0] for _ in range(2)]
    spread = max(abs(v - problem.base_loss) for v in again)
    allowed = 64 * problem.roundoff * max(1.0, abs(problem.base_loss))
    if math.isfinite(spread) and spread <= allowed:
        return None
    return (f"the loss changed by {spread:.3g} between evaluations at the same parameters (rounding allows "
            f"{allowed:.2g}): the forward keeps state between calls or draws randomness outside torch's "
            "generator, so finite differences cannot check its gradient")


def _random_backward(loss_now: Callable[[], torch.Tensor], named: list[tuple[str, nn.Parameter]],
                     grads: Mapping[str, torch.Tensor], seed: int) -> str | None:
    """Why the backward cannot be checked, or None: the same forward differentiated from
    another random state must give the same gradient. Shake-shake draws its gate afresh in
    backward by design; no finite difference can reproduce such a gradient."""
    loss = loss_now()
    seed_all(seed + 7919)  # the forward drew as before; the backward, if it draws, draws otherwise
    again = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    for (name, _), g in zip(named, again):
        g = g.detach().reshape(-1) if g is not None else torch.zeros_like(grads[name])
        scale = float(grads[name].abs().max()) if grads[name].numel() else 0.0
        if float((g - grads[name]).abs().max()) > 1e-6 * max(scale, 1e-12) + 1e-12:
            return (f"the backward draws randomness of its own ({name}'s gradient changed with the random state "
                    "before backward, the forward alike): a gradient by design not the loss's derivative, as "
                    "shake-shake's gate is, which finite differences cannot check")
    return None


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

    def loss_at(substituted: Mapping[str, torch.Tensor]) -> tuple[float, None]:
        current = {n: a.copy() for n, a in arrays.items()}
        for n, v in substituted.items():
            current[n] = v.numpy().reshape(shapes[n]).copy()
        return float(loss(current)), None

    base_loss = float(loss({n: a.copy() for n, a in arrays.items()}))
    problem = _Problem(values, grad_values, shapes, loss_at, base_loss)
    problem.forward_passes = 1
    return _run(problem, mode, directions, elements_per_tensor, eps, seed, torch.device("cpu"))


# --------------------------------------------------------------------------- the check


def _status(error: float, smooth: bool = True, resolved: bool = True) -> Literal["ok", "suspect", "bug"]:
    """A difference that crossed a kink at every ε tried is no proof of a bug: at most
    suspect; one whose round-off could hide a bug-sized error is no proof of health."""
    if error > BUG_THRESHOLD and smooth:
        return "bug"
    return "ok" if error <= OK_THRESHOLD and resolved else "suspect"


_RANK = {"ok": 0, "suspect": 1, "bug": 2}


def _worst(results: list[Difference]) -> Difference:
    """Worst difference over the smooth ones (by status, then error); only when none was
    smooth, the best of the kinked ones."""
    smooth = [r for r in results if r[1]]
    if smooth:
        return max(smooth, key=lambda r: (_RANK[_status(*r)], r[0]))
    return min(results, key=lambda r: (_RANK[_status(*r)], r[0]))


def _run(problem: _Problem, mode: Mode, directions: int, elements_per_tensor: int, eps: float,
         seed: int, device: torch.device) -> GradCheckResult:  # fmt: skip
    if directions < 1 or elements_per_tensor < 1 or not eps > 0:
        raise ValueError("directions and elements_per_tensor must be >= 1 and eps > 0")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    joint: Difference | None = None
    if mode not in ("directional", "elementwise"):
        raise ValueError(f"mode must be 'directional' or 'elementwise', got {mode!r}")
    try:
        if mode == "directional":
            joint, parameters = _directional(problem, directions, eps, generator, device)
        else:
            parameters = _elementwise(problem, elements_per_tensor, eps, generator)
    except _OutOfForwards:
        return GradCheckResult(status="skipped", mode=mode, eps=eps, forward_passes=problem.forward_passes, message=(
            f"the budget of {problem.budget} forwards ran out before every tensor was checked once "
            "(max_forwards)"))  # fmt: skip
    worst = max([p.relative_error for p in parameters] + ([joint[0]] if joint else []), default=0.0)
    bugs = [p.name for p in parameters if p.status == "bug" and not p.loss_flat]
    suspects = [p.name for p in parameters if p.status == "suspect"]
    surrogates = [p.name for p in parameters if p.loss_flat]
    if bugs:
        status, text = "failed", f"gradient disagrees with finite differences in: {', '.join(bugs)}"
    elif surrogates:
        status = "passed"
        text = (f"the loss is flat in {', '.join(surrogates[:5])}{' ...' if len(surrogates) > 5 else ''} (finite "
                "differences see no slope; a sign, round or step in the forward) and the backward gives them a "
                "gradient anyway: a surrogate such as a straight-through estimator, not a wrong derivative")
    elif joint and _status(*joint) == "bug" and not suspects:
        status, text = "failed", "the joint check failed but no single tensor did: the error is spread over tensors"
    elif suspects or any(p.status != "ok" for p in parameters) or (joint and _status(*joint) != "ok"):
        status = "passed"
        text = (f"suspect (relative error between {OK_THRESHOLD:g} and {BUG_THRESHOLD:g}, across a kink, or "
                f"float64 round-off too large to tell)"
                + (f": {', '.join(suspects)}" if suspects else ""))
    elif joint and not parameters:
        status, text = "passed", f"all {len(problem.values)} tensors agree along {directions} random directions"
    else:
        status, text = "passed", f"{len(parameters)} tensors agree with finite differences"
    if problem.kinks_avoided:
        text += (f"; {problem.kinks_avoided} differences crossed a kink (ReLU-like) and were redone with a smaller ε"
                 + (f", {problem.kinks_unresolved} still crossing one" if problem.kinks_unresolved else ""))
    if problem.out_of_forwards:
        text += (f"; the search for the tensors behind it stopped at its budget of {problem.budget} forwards "
                 f"({len(parameters)} of {len(problem.values)} tensors checked on their own)")
    return GradCheckResult(status=status, message=text, mode=mode, eps=eps, max_relative_error=worst,
                           forward_passes=problem.forward_passes, parameters=parameters)  # fmt: skip


def _random_unit(shape_numel: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    v = torch.randn(shape_numel, generator=generator, dtype=torch.float64).to(device)
    return v / torch.linalg.vector_norm(v).clamp_min(1e-300)


def _directional(problem: _Problem, directions: int, eps: float, generator: torch.Generator,
                 device: torch.device) -> tuple[Difference, list[GradCheckParam]]:  # fmt: skip
    """(worst joint difference, per-tensor results — empty when the joint check is clean)."""
    names = list(problem.values)
    joint = _confined(problem, names, directions, eps, generator, device)
    if _status(*joint) == "ok":
        return joint, []
    found: dict[str, Difference] = {}
    with contextlib.suppress(_OutOfForwards):  # what was found so far is reported, and that it stopped
        _localise(problem, names, directions, eps, generator, device, found)
    parameters = [GradCheckParam(name=n, relative_error=found[n][0], status=_status(*found[n]),
                                 autograd_zero=not bool(problem.grads[n].any()))
                  for n in names if n in found]  # fmt: skip
    problem.max_forwards = None  # a few forwards more, to tell a surrogate from a bug already found
    for param in parameters:
        if param.status == "bug" and not param.autograd_zero:
            param.loss_flat = all(
                problem.flat({param.name: _random_unit(problem.values[param.name].numel(), generator, device)}, eps)
                for _ in range(directions))  # fmt: skip
    return joint, parameters


def _confined(problem: _Problem, names: list[str], directions: int, eps: float, generator: torch.Generator,
              device: torch.device) -> Difference:  # fmt: skip
    """The worst of ``directions`` checks along directions confined to ``names``, each tensor an equal share."""
    share = 1.0 / math.sqrt(len(names))
    results = []
    for _ in range(directions):
        direction = {n: share * _random_unit(problem.values[n].numel(), generator, device) for n in names}
        results.append(problem.check(direction, problem.analytic(direction), eps))
    return _worst(results)


def _localise(problem: _Problem, names: list[str], directions: int, eps: float, generator: torch.Generator,
              device: torch.device, found: dict[str, Difference]) -> None:  # fmt: skip
    """Name the faulty tensors among ``names``, whose joint check was not clean, by halving: a half
    whose confined check is clean is clean in each of its tensors, a half that is not is halved again.
    A wrong backward in one of DenseNet's 360 tensors costs ~2 log2(360) checks instead of 360. When
    both halves pass though the whole did not (their errors only add up together), each tensor is
    checked alone."""
    if len(names) == 1:
        found[names[0]] = _confined(problem, names, directions, eps, generator, device)
        return
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    checked = [(half, _confined(problem, half, directions, eps, generator, device)) for half in halves]
    if all(_status(*difference) == "ok" for _, difference in checked):
        for n in names:
            found[n] = _confined(problem, [n], directions, eps, generator, device)
        return
    for half, difference in checked:
        if len(half) == 1 or _status(*difference) == "ok":
            found.update(dict.fromkeys(half, difference))
        else:
            _localise(problem, half, directions, eps, generator, device, found)


def _elementwise(problem: _Problem, elements_per_tensor: int, eps: float,
                 generator: torch.Generator) -> list[GradCheckParam]:  # fmt: skip
    parameters = []
    for n, value in problem.values.items():
        results, indices = [], _spread_indices(value.numel(), elements_per_tensor, generator)
        for flat in indices:
            unit = torch.zeros_like(value)
            unit[flat] = 1.0
            results.append(problem.check({n: unit}, float(problem.grads[n][flat]), eps))
        worst = _worst(results)
        error, smooth, resolved = worst
        worst_flat = next(i for i, r in zip(indices, results) if r == worst)
        index = torch.unravel_index(torch.tensor(worst_flat), problem.shapes[n]) if problem.shapes[n] else ()
        parameters.append(GradCheckParam(name=n, relative_error=error, status=_status(error, smooth, resolved),
                                         worst_index=[int(i) for i in index],
                                         autograd_zero=not bool(problem.grads[n].any())))  # fmt: skip
    return parameters


def _spread_indices(numel: int, count: int, generator: torch.Generator) -> list[int]:
    """One random index per equal stratum of the flat tensor: every region is sampled."""
    if numel <= count:
        return list(range(numel))
    bounds = torch.linspace(0, numel, count + 1).long().tolist()
    return [lo + int(torch.randint(hi - lo, (1,), generator=generator)) for lo, hi in zip(bounds, bounds[1:])]


SPEC = ProbeSpec(name="grad_check", title=GradCheckResult.title, function=grad_check, result=GradCheckResult,
                 order=40, needs_finite_parameters=True, trains=True)  # fmt: skip

"""Overfit-one-batch probe: can the model, its loss and its backward fit a single batch?

How to use::

    result = overfit_one_batch(model, (x, y), loss_fn)   # OverfitResult
    result.status, result.losses

A network that cannot drive the loss of one small batch to its minimum has a bug in its
architecture, loss or gradient path (Karpathy's "overfit one batch" recipe). Pass is
judged relative to the start — the loss's distance from its floor under ``target_ratio``
(1%) of where it started, or 100% accuracy on the batch for classification — not the
absolute ``loss < 0.1``, which fails healthy regression targets of large scale.

The floor is the loss that perfect predictions would get (:class:`PerfectPredictions`):
0 for class indices and regression, but the targets' entropy for soft targets (a VAE's
pixels in [0, 1] with BCE) and with label smoothing. Where nndx cannot compute it (a loss
written by hand), the batch counts as fitted when the loss is stationary in the model's
output (its gradient there under ``target_ratio`` of its start). A term the floor cannot see (a
KL term, targets that identical inputs contradict) keeps a healthy model above 1%;
the rule reading this result (NNDX601) tells a model that barely learns from one that
nearly fits.

It cannot detect misaligned labels: networks memorise random labels (Zhang et al.
2017, "Understanding deep learning requires rethinking generalization"), so a batch with
shuffled labels overfits just as well. The label-alignment probe
(:mod:`nndx.collector.probes.label_alignment`) tests that.

Runs on a deep copy with nndx's own Adam (the user's learning rate may be the bug), the
model kept in its current train/eval mode, with dropout off: the question is whether the
model *can* fit, and a regulariser that zeroes a random share of units at every step keeps
a healthy model's loss on one batch far above 1% of its start (``nn.Dropout``,
``F.dropout`` and attention's ``dropout_p`` alike; an LSTM's internal dropout is out of
reach). Every forward draws the same random numbers, so what a forward samples without a
dropout function (stochastic depth, a VAE's z, word dropout) is one fixed function of the
batch to fit. The user's RNG is restored afterwards. A
float16 model trains as mixed precision does (float32 weights, float16 autocast).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nndx import vocab
from nndx.collector._common import (
    Batch,
    LossFn,
    accuracy,
    backward_and_step,
    compute_loss,
    dense_gradients,
    forward,
    graph_leaves,
    infer_task,
    iter_tensors,
    loss_name,
    loss_scaler,
    map_tensors,
    preserved_rng,
    seed_all,
    split_batch,
    train_in_float32,
    trainable_tensors,
    working_copy,
)
from nndx.collector.loss_call import InnerLossCalls
from nndx.collector.loss_terms import batch_reductions
from nndx.collector.probes import ProbeSpec
from nndx.report import LossTerm, OverfitResult, flat_since


def overfit_one_batch(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    steps: int = 300,
    lr: float = 1e-2,
    target_ratio: float = 0.01,
) -> OverfitResult:
    """Train a copy on ``batch`` for up to ``steps`` Adam steps; stop early on success.
    When the loss jumps above its start in the first steps and the copy fails, a second
    copy trains at ``lr / 10``: Adam at 1e-2 overshoots some healthy networks (a CNN with
    BatchNorm went from 2.4 to 30 in one step and ended at 0.64 of its start), and the
    question is whether the model can fit, not whether it can at 1e-2."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    inputs, targets = split_batch(batch)
    task = infer_task(loss_fn, targets)
    with preserved_rng():
        first = _train(model, inputs, targets, loss_fn, task, steps, lr, target_ratio)
        if first is None:
            return OverfitResult(status="failed", task=task, lr=lr,
                                 message="the model has no trainable parameters")  # fmt: skip
        losses, passed, floor, final_accuracy, opponent, terms = first
        note = "" if passed else _destroyed_by_lr(losses)
        if note:
            note = f" at lr {lr / 10:g} (at {lr:g} {note})"
            lr = lr / 10
            losses, passed, floor, final_accuracy, opponent, terms = _train(model, inputs, targets, loss_fn, task,
                                                                            steps, lr, target_ratio)  # fmt: skip
    initial, final = losses[0], losses[-1]
    above = "" if not floor else f" above its floor {floor:.4g}"
    if passed:
        status, message = "passed", f"fitted one batch in {len(losses) - 1} steps{note}"
        if not _fits(losses, floor or 0.0, final_accuracy, target_ratio):
            message += (f" (the loss, {final:.4g} from {initial:.4g}, is stationary in the model's output: its "
                        f"gradient there fell under {target_ratio:g} of its start; its floor is unknown)")
    elif not math.isfinite(final):
        status, message = "failed", f"loss became non-finite ({final}) at step {len(losses) - 1}{note}"
    elif initial < 0:
        status, message = "skipped", "initial loss is negative: a relative criterion is undefined"
    else:
        status = "failed"
        share = (final - (floor or 0.0)) / (initial - (floor or 0.0))
        message = (f"loss{above} fell only to {share:.3g} of where it started in {steps} steps{note} "
                   f"(target {target_ratio:g}); the model, loss or backward does not fit one batch")  # fmt: skip
    return OverfitResult(status=status, message=message, task=task, steps=len(losses) - 1, lr=lr,
                         initial_loss=initial, final_loss=final, loss_floor=floor, final_accuracy=final_accuracy,
                         losses=losses, loss_through_other_parameters=opponent, loss_terms=terms)  # fmt: skip


# every forward of the copy draws the same random numbers (seeded with this): one batch is then one
# function to fit, whatever a forward samples (stochastic depth, a VAE's z, word dropout, noise)
SAME_DRAWS = 0

GRAPH_NODES = 10_000  # autograd nodes walked from the first loss for parameters outside the copy

# a loss above OVERSHOOT times its start within the first OVERSHOOT_STEPS steps: the LR overshot
OVERSHOOT, OVERSHOOT_STEPS = 1.5, 10


def _train(model: nn.Module, inputs: Any, targets: Any, loss_fn: LossFn, task: str | None, steps: int, lr: float,
           target_ratio: float) -> tuple[list[float], bool, float | None, float | None, bool, list[LossTerm]] | None:
    """One copy trained on the batch: (losses, passed, floor, batch accuracy, whether the loss
    reached trainable parameters outside the copy, the first loss's terms); None when it has no
    trainable parameters."""
    # a loss of the user's own: accuracy is read off what it hands to torch's loss
    own_loss = loss_fn is not None and vocab.loss_kind(loss_name(loss_fn)) is None
    losses: list[float] = []
    final_accuracy: float | None = None
    floor: float | None = None
    slopes: list[float] = []  # |d loss / d output| per step, where the floor is unknown
    model_copy = dense_gradients(working_copy(model))
    params = [p for _, p in trainable_tensors(model_copy)]
    if not params:
        return None
    precision = train_in_float32(model_copy)
    optimizer = torch.optim.Adam(params, lr=lr)
    scaler = loss_scaler(params[0].device, precision)
    groups = _same_inputs(inputs)
    opponent = False
    terms: list[LossTerm] = []
    with NoDropout():
        for step in range(steps + 1):  # measure after each of the ``steps`` updates
            optimizer.zero_grad(set_to_none=True)
            inner = InnerLossCalls()
            seed_all(SAME_DRAWS)
            with precision:
                output = forward(model_copy, inputs)
                with inner if own_loss else contextlib.nullcontext():
                    loss = compute_loss(loss_fn, output, targets)
            losses.append(float(loss.detach()))
            if step == 0:
                floor = loss_floor(loss_fn, output, targets, losses[0])
                # a generator's loss runs through its discriminator, which this probe does not train
                own = {id(p) for p in params}
                opponent = any(isinstance(leaf, nn.Parameter) and leaf.requires_grad and id(leaf) not in own
                               for leaf in graph_leaves(loss, limit=GRAPH_NODES))  # fmt: skip
                terms = batch_reductions(loss, output, inputs, targets)
            if task == "classification":
                final_accuracy = (accuracy(loss_fn, output, targets) if inner.last is None
                                  else accuracy(None, inner.last[1], inner.last[2], loss_type=inner.last[0]))  # fmt: skip
            if not math.isfinite(losses[-1]):
                break
            if _fits(losses, floor or 0.0, final_accuracy, target_ratio) or _stationary(losses, slopes, target_ratio):
                return losses, True, floor, final_accuracy, opponent, terms
            if step < steps:
                # every output but a loss the model computes itself (its gradient is 1)
                watched = [t for t in iter_tensors(output) if t.is_floating_point() and t.requires_grad and t.dim()]
                watched = watched if floor is None and scaler is None else []
                for t in watched:
                    t.retain_grad()
                backward_and_step(loss, optimizer, lambda: loss, scaler)
                if watched and (step == 0 or slopes):
                    slopes.append(_slope(watched, groups))
    return losses, False, floor, final_accuracy, opponent, terms


def _destroyed_by_lr(losses: list[float]) -> str:
    """Why a failed copy failed for the probe's LR rather than the model's, or "". Two
    ways: the loss jumped above OVERSHOOT times its start within OVERSHOOT_STEPS steps, or
    it moved and then stood still to the end (every gradient zero, its units dead on the one
    batch): from one of those steps (one Adam step at 1e-2 drove a ReLU6 ranking score below
    0 for every document: RankNet's copy froze at ln 2 from step 1 while the model trains at
    1e-3), or later, for the last tenth of the steps, after a first step that threw the loss
    above its start (Udacity's CIFAR CNN: to 1.2x its start, then down to 0.87 of it, frozen
    from step 231; at 1e-3 it fits in 20 steps). A loss that never moved is not this: the
    model is as stuck at any LR; nor one that crept down and froze with no such step."""
    if not all(map(math.isfinite, losses)) or losses[0] <= 0:
        # a jump needs a positive start: a loss that falls below 0 without bound (a sign error) is evidence as it is
        return ""
    peak = max(losses[1 : OVERSHOOT_STEPS + 1], default=0.0)
    if peak > OVERSHOOT * losses[0]:
        return f"the loss jumped from {losses[0]:.4g} to {peak:.4g}"
    frozen_from = flat_since(losses)
    froze_early = 0 < frozen_from <= OVERSHOOT_STEPS and len(losses) - frozen_from >= len(losses) // 2
    # later, after a first step that threw the loss above its start: that step is what killed the units
    froze_late = (peak > losses[0] and 0 < frozen_from < len(losses) - 1
                  and len(losses) - frozen_from >= len(losses) // 10)
    if froze_early or froze_late:
        return f"the loss moved from {losses[0]:.4g} and froze at {losses[-1]:.4g} from step {frozen_from}"
    return ""


def _stationary(losses: list[float], slopes: list[float], target_ratio: float) -> bool:
    """A loss whose floor nndx cannot compute (one written by hand: a soft-target
    cross-entropy, a distributional RL loss) fits when it is stationary in the model's
    output: the gradient at the output fell under ``target_ratio`` of its start, with the
    loss not above its start. The model then predicts what minimises the loss for these
    targets, whatever that minimum's value; a model that cannot fit keeps a gradient there."""
    return (len(slopes) >= 2 and math.isfinite(slopes[-1]) and slopes[0] > 0
            and slopes[-1] <= target_ratio * slopes[0] and losses[-2] <= losses[0])


def _same_inputs(inputs: Any) -> torch.Tensor | None:
    """Which samples of the batch are the same input (an index per sample), when some are:
    one board seen twice in self-play with two outcomes, one image under two labels. The
    model gives them one output, and its loss is stationary where their gradients cancel."""
    tensors = list(iter_tensors(inputs))
    if len(tensors) != 1 or tensors[0].dim() < 1 or tensors[0].shape[0] < 2:
        return None
    rows = tensors[0].detach().reshape(tensors[0].shape[0], -1)
    _, index = torch.unique(rows, dim=0, return_inverse=True)
    return index if int(index.max()) + 1 < rows.shape[0] else None


def _slope(outputs: list[torch.Tensor], groups: torch.Tensor | None = None) -> float:
    """|d loss / d output| over the model's outputs, taken at the logits where an output is a
    softmax or log-softmax over its class axis (read off its values: they sum to 1): the loss
    of log-probabilities against soft targets (AlphaZero's ``-sum(pi * log_p)``) keeps a
    gradient ``-pi`` at the log-probabilities at its minimum, and none at the logits. Samples
    that are one input (``groups``) have their gradients summed: they can only move together."""
    total = 0.0
    for out in outputs:
        if out.grad is None:
            continue
        g = _project(out.grad.detach().float(), out.detach().float())
        if groups is not None and g.dim() >= 1 and g.shape[0] == groups.numel():
            g = g.new_zeros((int(groups.max()) + 1, *g.shape[1:])).index_add_(0, groups.to(g.device), g)
        total += float(g.square().sum())
    return math.sqrt(total)


def _project(g: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The gradient ``g`` at an output ``o``, carried back through a softmax or log-softmax
    that made ``o`` (read off its values)."""
    for axis in (1, -1) if o.dim() >= 2 else ():
        if bool((o <= 0).all()) and _sums_to_one(o.exp(), axis):
            return g - o.exp() * g.sum(axis, keepdim=True)  # through log_softmax
        if bool((o >= 0).all()) and _sums_to_one(o, axis):
            return o * (g - (o * g).sum(axis, keepdim=True))  # through softmax
    return g


def _sums_to_one(p: torch.Tensor, axis: int) -> bool:
    return bool(((p.sum(axis) - 1).abs() <= 1e-3).all())


def _fits(losses: list[float], floor: float, batch_accuracy: float | None, target_ratio: float) -> bool:
    if batch_accuracy == 1.0:
        return True
    initial, current = losses[0], losses[-1]
    return initial >= 0 and current - floor <= target_ratio * (initial - floor)


def loss_floor(loss_fn: LossFn, output: Any, targets: Any, initial: float) -> float | None:
    """The loss of perfect predictions for these targets (see :class:`PerfectPredictions`);
    None when a loss nndx cannot idealise is involved, or the floor is not below the
    initial loss (then it would tell nothing)."""
    ideal = PerfectPredictions()
    with torch.no_grad(), ideal:
        try:
            # a copy of its own: a loss that works in place on what it is given (CenterNet's sigmoid_)
            # must not modify the output the probe's backward still needs
            value = float(compute_loss(loss_fn, map_tensors(output, lambda t: t.detach().clone()), targets))
        except Exception:  # noqa: BLE001 - an idealised output the user's loss cannot take: no floor
            return None
    if ideal.unknown or not ideal.seen or not math.isfinite(value) or not 0.0 <= value < initial:
        return None
    return value


# the logit of a probability this close to 0 or 1 stands for it (its loss is ~1e-6 per element)
_CLAMP = 1e-6


class PerfectPredictions(TorchFunctionMode):
    """Inside, each of torch's losses (``F.cross_entropy``, ``nn.BCELoss``... and those a
    loss function of the user's own calls) gets, instead of the model's output, the output
    that fits its target best; other terms (a KL penalty) are computed as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False  # a torch loss was called
        self.unknown = False  # one whose perfect output nndx does not know

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        kind = vocab.loss_kind(getattr(func, "__name__", None))
        if kind is None:
            return func(*args, **kwargs)
        self.seen = True
        output = args[0] if args else kwargs.get("input")
        target = args[1] if len(args) > 1 else kwargs.get("target")
        ideal = _perfect(kind, output, target, kwargs)
        if ideal is None:
            self.unknown = True
            return func(*args, **kwargs)
        if args:
            args = (ideal, *args[1:])
        else:
            kwargs["input"] = ideal
        return func(*args, **kwargs)


def _perfect(kind: vocab.LossKind, output: Any, target: Any, kwargs: dict) -> torch.Tensor | None:
    """The output that minimises a loss of this kind for ``target``; None when unknown."""
    if not isinstance(output, torch.Tensor) or not isinstance(target, torch.Tensor) or not output.is_floating_point():
        return None
    if kind.class_axis and output.dim() >= 2 and not target.is_floating_point():
        classes = output.shape[1]
        index = torch.where((target >= 0) & (target < classes), target, 0)  # ignore_index rows: any class
        q = nn.functional.one_hot(index, classes).movedim(-1, 1).to(output.dtype)
        smoothing = float(kwargs.get("label_smoothing", 0.0) or 0.0)
        q = (1 - smoothing) * q + smoothing / classes
        if kind.name == "MultiMarginLoss":
            return q * 2.0  # the right class ahead of every other by the margin (1)
        return q.clamp_min(1e-12).log()  # logits or log-probabilities: both log q
    if target.shape != output.shape:
        return None
    if kind.class_axis and target.is_floating_point():  # class probabilities as targets
        smoothing = float(kwargs.get("label_smoothing", 0.0) or 0.0)
        q = (1 - smoothing) * target + smoothing / output.shape[1]
        return q.clamp_min(1e-12).log().to(output.dtype)
    p = target.to(output.dtype)
    if kind.expects == "values" and kind.name != "GaussianNLLLoss":
        return p
    if kind.name == "KLDivLoss":
        return p if kwargs.get("log_target") else p.clamp_min(1e-12).log()
    if kind.expects == "probabilities":
        return p
    if kind.binary or kind.name == "MultiLabelSoftMarginLoss":
        return torch.logit(p.clamp(_CLAMP, 1 - _CLAMP))
    return None


# torch functions that zero a random share of their input; the overfit probe runs them as identities
_DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                       "feature_dropout"})  # fmt: skip


class NoDropout(TorchFunctionMode):
    """Inside, dropout is off wherever it is written: the ``nn.Dropout`` modules (they call
    ``F.dropout``), ``F.dropout``/``torch.dropout`` in a forward, and the ``dropout_p`` of
    attention (``scaled_dot_product_attention``, ``nn.MultiheadAttention``)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in _DROPOUTS and args and isinstance(args[0], torch.Tensor):
            return args[0]
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        elif name in ("scaled_dot_product_attention", "multi_head_attention_forward"):
            args = _without_dropout_p(func, args)
        return func(*args, **kwargs)


def _without_dropout_p(func: Callable, args: tuple) -> tuple:
    """``args`` with a positional ``dropout_p`` set to 0."""
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # a builtin: scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, ...)
        names = ["query", "key", "value", "attn_mask", "dropout_p"]
    if "dropout_p" in names and names.index("dropout_p") < len(args):
        index = names.index("dropout_p")
        args = args[:index] + (0.0,) + args[index + 1 :]
    return args


SPEC = ProbeSpec(name="overfit_one_batch", title=OverfitResult.title, function=overfit_one_batch,
                 result=OverfitResult, order=50, needs_finite_parameters=True, trains=True)  # fmt: skip

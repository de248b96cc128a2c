"""How each term of a loss scales with the batch, read off the loss's autograd graph.

How to use::

    terms = batch_reductions(loss, output, inputs, targets)   # -> list[LossTerm]; [] when unreadable

Why it exists: a loss that adds a term averaged over the batch to one summed over it (a VAE's
``F.binary_cross_entropy(x_hat, x)``, whose default reduction is the mean over every pixel of
every image, beside a KL divergence written ``torch.sum(...)``) weighs the summed term
thousands of times more than its author meant, and the balance moves with the batch size.
Nothing crashes; the averaged term is all but ignored (the VAE's reconstructions collapse to
the mean image). No curve shows it, but the loss's graph does: the additive nodes at its top
(add, subtract, negate, scale by a constant) lead to the reductions, and each reduction says
whether it averages or sums the batch.

A term is read only when its reduction is one of torch's losses (its ``reduction``), a
``sum``/``mean`` of a tensor holding the batch axis, or such a ``sum``/``mean`` over the
batch axis under a full reduction; a sum divided by the batch size is a mean, a mean times
it a sum. A term that never reaches the model's outputs (a penalty on the weights) does not
scale with the batch and is left out. Anything else at the top (a product of two terms, a
norm, a custom autograd function), or a reduction over pairs of samples (an MMD's (N, N) kernel
matrix, where a weight of 100 / (N (N - 1)) and a divisor of N / 100 read the same), makes the
whole reading unknown: ``[]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from nndx.collector._common import iter_tensors
from nndx.report import LossTerm

# autograd nodes walked below a term for the model's outputs (a loss reaches them in a few ops)
SEARCH_NODES = 400
# above the reductions every value is a scalar: reshaping or copying it changes nothing
PASS_THROUGH = {"AddBackward0", "SubBackward0", "NegBackward0", "ToCopyBackward0", "CloneBackward0", "ViewBackward0",
                "UnsafeViewBackward0", "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0"}
REDUCTION = {1: "mean", 2: "sum"}  # torch's loss-function reduction codes


def batch_reductions(loss: torch.Tensor, output: Any, inputs: Any, targets: Any) -> list[LossTerm]:
    """The terms of ``loss`` that carry the batch, each as a mean or a sum over it; ``[]``
    when the loss has no graph, is not a scalar, or any term cannot be read. The batch size
    is the targets' first axis (the inputs' when there are no targets)."""
    sized = [t for t in iter_tensors(targets) if t.dim()] or [t for t in iter_tensors(inputs) if t.dim()]
    batch_size = sized[0].shape[0] if sized else 0
    if loss.grad_fn is None or loss.numel() != 1 or batch_size < 2:
        return []
    # id -> node: holding the nodes keeps their ids unique while they are compared
    outputs = {id(node): node for node in (t.grad_fn for t in iter_tensors(output)) if node is not None}
    outputs.pop(id(loss.grad_fn), None)
    if not outputs:
        return []
    terms: list[LossTerm] = []
    todo: list[tuple[Any, float]] = [(loss.grad_fn, 1.0)]
    while todo:
        node, scale = todo.pop()
        name = type(node).__name__
        live = [n for n, _ in node.next_functions if n is not None]
        scalar_reduction = name in ("SumBackward0", "MeanBackward0") and not list(node._saved_self_sym_sizes)
        if name in PASS_THROUGH or scalar_reduction:  # loss.mean() of a scalar loss
            todo.extend((n, scale) for n in live)
            continue
        if name.startswith(("MulBackward", "DivBackward")) and len(live) == 1:
            factor = _constant_factor(node, name)
            if factor is None:
                return []
            todo.append((live[0], scale * factor))
            continue
        if not _reaches(node, outputs):
            continue  # a penalty on the weights, a constant: nothing per sample
        term = _term(node, name, batch_size, scale)
        if term is None:
            return []
        terms.append(term)
    return terms


def _constant_factor(node: Any, name: str) -> float | None:
    """The scalar a Mul/Div node scales its one live input by (division: 1/divisor)."""
    first_live = node.next_functions[0][0] is not None
    try:
        if name.startswith("Div"):
            value = getattr(node, "_saved_other", None)
            return None if value is None or not first_live else 1.0 / _scalar(value)
        value = getattr(node, "_saved_other" if first_live else "_saved_self", None)
        return None if value is None else _scalar(value)
    except (RuntimeError, ValueError, ZeroDivisionError):
        return None


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError("not a scalar")
        value = value.item()
    number = float(value)
    if not math.isfinite(number) or number == 0:
        raise ValueError("no usable scale")
    return number


def _term(node: Any, name: str, batch_size: int, scale: float) -> LossTerm | None:
    """One reduction at the top of the loss, as a mean or a sum over the batch; None when unreadable."""
    reduction = getattr(node, "_saved_reduction", None)
    if isinstance(reduction, int):
        if reduction not in REDUCTION:
            return None
        values = _saved_numel(node)
        return _scaled(name.removesuffix("Backward0"), REDUCTION[reduction], values, batch_size, scale)
    if name in ("SumBackward0", "MeanBackward0"):
        sizes = list(getattr(node, "_saved_self_sym_sizes", ()))
        kind = "sum" if name.startswith("Sum") else "mean"
        if sizes.count(batch_size) >= 2:
            return None  # pairs of samples (an MMD's kernel matrix): a weight and a divisor read the same there
        if batch_size in sizes:
            return _scaled(kind, kind, math.prod(sizes), batch_size, scale)
        live = [n for n, _ in node.next_functions if n is not None]
        if len(live) == 1 and type(live[0]).__name__ in ("SumBackward1", "MeanBackward1"):
            inner = _over_batch(live[0], batch_size)  # x.mean(0).sum(): the batch went in the inner reduction
            return None if inner is None else _scaled(*inner, batch_size, scale)
        return None
    if name in ("SumBackward1", "MeanBackward1"):
        inner = _over_batch(node, batch_size)
        return None if inner is None else _scaled(*inner, batch_size, scale)
    return None


def _over_batch(node: Any, batch_size: int) -> tuple[str, str, int] | None:
    """A sum or mean over given dims that includes the batch axis: (op, kind, values)."""
    sizes = list(getattr(node, "_saved_self_sym_sizes", ()))
    dims = getattr(node, "_saved_dim", None)
    if not sizes or dims is None:
        return None
    axes = {d % len(sizes) for d in dims} if dims else set(range(len(sizes)))
    if sum(sizes[a] == batch_size for a in axes) != 1:
        return None  # no batch axis, or pairs of samples
    kind = "sum" if type(node).__name__.startswith("Sum") else "mean"
    return kind, kind, math.prod(sizes)


def _saved_numel(node: Any) -> int:
    for attr in ("_saved_target", "_saved_self"):
        try:
            value = getattr(node, attr, None)
        except RuntimeError:
            value = None
        if isinstance(value, torch.Tensor):
            return value.numel()
    return 0


def _scaled(op: str, kind: str, values: int, batch_size: int, scale: float) -> LossTerm:
    """A sum divided by at least the batch size averages it (by the batch, by its tokens, by a
    count of the values it kept); a mean multiplied by the batch size sums it."""
    if kind == "sum" and 1.0 / abs(scale) >= batch_size * (1 - 1e-6):
        kind = "mean"
    elif kind == "mean" and math.isclose(abs(scale), batch_size, rel_tol=1e-6):
        kind = "sum"
    return LossTerm(op=op, reduction=kind, values=values, scale=scale)


def _reaches(node: Any, targets: dict[int, Any]) -> bool:
    """Whether the graph below ``node`` reaches one of ``targets`` within SEARCH_NODES nodes."""
    seen: dict[int, Any] = {}  # held, as ``targets`` are: an id is unique only while its node lives
    todo = [node]
    while todo and len(seen) < SEARCH_NODES:
        current = todo.pop()
        if id(current) in targets:
            return True
        if id(current) in seen:
            continue
        seen[id(current)] = current
        todo.extend(n for n, _ in current.next_functions if n is not None)
    return False

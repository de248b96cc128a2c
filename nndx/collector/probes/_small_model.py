"""A small reference model the data probes train on the user's arrays.

How to use::

    with one_thread():  # two models on x: y and its permutation
        train_mlps([x, x], [y, y[perm]], num_classes, seeds=[0, 0], steps=200, checkpoints={50, 200},
                   at_checkpoint=lambda predict, step: scores.append(predict(torch.as_tensor(x_test))))

The label probes ask what the *data* supports, not what the user's model does: a
one-hidden-layer ReLU MLP, full-batch Adam, its own ``torch.Generator`` (the global RNGs
are untouched), trained on standardised features. ``predict`` returns each model's logits.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from nndx.collector.data import _as_array, as_inputs

Predict = Callable[[Any], list[torch.Tensor]]
# Float labels with integral values and at most this many distinct values are classes.
MAX_FLOAT_CLASSES = 100


class ClassData(NamedTuple):
    """Features (rows, float64) and class indices 0..C-1 of a classification split.

    ``groups``: for rows cut from sequences (:func:`token_data`), the sequence each row
    came from, rows of a sequence adjacent; held-out rows must be whole sequences, and a
    sequence, not a position, is one independent sample. None: every row is a sample."""

    features: np.ndarray
    targets: np.ndarray
    num_classes: int
    note: str  # rows left out, in words ("" when none)
    groups: np.ndarray | None = None


def class_data(x: Any, y: Any, *, min_samples: int, max_samples: int,
               seed: int) -> ClassData | RegressionData | str:  # fmt: skip
    """The usable rows of ``(x, y)`` as :class:`ClassData` (a seeded random subset of at
    most ``max_samples``), :class:`RegressionData` when the targets are real values, or why
    the labels cannot be judged."""
    ya, _ = _as_array(y, "labels")
    xa, _, ids = as_inputs(x, "inputs", ya.shape[0] if ya.ndim else None)
    if ids:
        xa = _ids_one_hot(xa, ids)
    if xa.ndim == 0 or ya.ndim == 0 or xa.shape[0] != ya.shape[0]:
        raise ValueError(f"inputs of shape {list(xa.shape)} and labels of shape {list(ya.shape)}: need one label per input")
    if xa.dtype.kind == "i" and xa.ndim >= 2 and np.unique(xa).size > 2:
        # uint8 pixels are magnitudes and stay; signed integer rows are ids (tokens, categories)
        return ("integer inputs (token or category ids): the probe's small MLP would read ids as magnitudes, "
                "so its predictions say nothing about the labels")
    classes, reason = _class_labels(ya)
    if classes is None and reason == REGRESSION:
        return _regression_data(xa, ya, min_samples=min_samples, max_samples=max_samples, seed=seed)
    if classes is None:
        return reason
    rows = _usable_rows(xa, classes, classes >= 0, min_samples=min_samples, max_samples=max_samples, seed=seed)
    if isinstance(rows, str):
        return rows
    features, classes, note = rows
    _, targets = np.unique(classes, return_inverse=True)
    if targets.max() < 1:
        return f"only one class in the labels{note}"
    return ClassData(features, targets, int(targets.max()) + 1, note)


# an id column of a multi-input model's inputs with at most this many distinct ids gets one-hot
# columns for the small model; one with more (a user id) is left out: as a magnitude it means nothing
MAX_ONE_HOT_IDS = 32


def _ids_one_hot(xa: np.ndarray, ids: list[int]) -> np.ndarray:
    """The float columns of a multi-input model's rows, with each id column one-hot."""
    columns = [np.delete(xa, ids, axis=1)]
    for column in ids:
        values, codes = np.unique(xa[:, column], return_inverse=True)
        if 1 < values.size <= MAX_ONE_HOT_IDS:
            columns.append(np.eye(values.size, dtype=xa.dtype)[codes])
    return np.concatenate(columns, axis=1)


class RegressionData(NamedTuple):
    """Features and real-valued targets (rows, float64; targets one column per output) of a
    regression split."""

    features: np.ndarray
    targets: np.ndarray
    note: str


def _regression_data(xa: np.ndarray, ya: np.ndarray, *, min_samples: int, max_samples: int,
                     seed: int) -> RegressionData | str:  # fmt: skip
    targets = ya.reshape(ya.shape[0], -1).astype(np.float64)
    rows = _usable_rows(xa, targets, np.isfinite(targets).all(axis=1), min_samples=min_samples,
                        max_samples=max_samples, seed=seed)  # fmt: skip
    return rows if isinstance(rows, str) else RegressionData(*rows)


def _usable_rows(xa: np.ndarray, labels: np.ndarray, labelled: np.ndarray, *, min_samples: int, max_samples: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray, str] | str:  # fmt: skip
    """(features as float64 rows, labels, a note on rows left out) for the rows whose inputs
    are finite and whose label is usable (``labelled``), a seeded random subset of at most
    ``max_samples``; or why there are too few."""
    features = xa.reshape(xa.shape[0], -1).astype(np.float64)
    usable = np.isfinite(features).all(axis=1) & labelled
    features, labels = features[usable], labels[usable]
    dropped = int((~usable).sum())
    note = f" ({dropped} rows with non-finite inputs/labels left out)" if dropped else ""
    if features.shape[0] < min_samples:
        return f"only {features.shape[0]} usable samples; need {min_samples}{note}"
    order = np.random.default_rng(seed).permutation(features.shape[0])[:max_samples]
    return features[order], labels[order], note


# Token ids are identities, never magnitudes: the most frequent ids each get a one-hot
# column (and a target class); rarer ids share one "other".
TOKEN_IDS = 64
MIN_SEQUENCES = 8
SHORT_ROW = 4  # rows of at most this many ids are read column by column (see token_data)


def token_data(x: Any, y: Any, *, min_samples: int, max_samples: int, min_per_class: int,
               seed: int, by_column: bool = False) -> ClassData | str:  # fmt: skip
    """Integer token sequences ``x`` [N, T] and their class targets as :class:`ClassData`,
    or why they cannot be read so. Token ids are identities: the most frequent ids each
    get a one-hot column, rarer ids share one.

    - One target per position (a language model's next tokens, a tagger's tags: ``y`` of
      ``x``'s shape): one row per scored position, its features the ids of the token there
      and of the one before it and its sequence's bag of ids (what a position-aligned target
      can depend on without a model of the whole sequence: the next character on the last
      ones, a translation's word on the source's words); ``groups`` are the sequences.
      Negative targets (``ignore_index``) are left out.
    - One class per sequence (a text classifier): one row per sequence, its features its
      bag of ids (richer features, adjacent pairs or positions, made the small model's
      held-out losses too noisy to bound a weak signal). Rows of at most ``SHORT_ROW`` ids
      are columns more than a text (an n-gram's context words, a recommender's user and
      item): each position gets its own one-hot code, so that user 5 is not item 5; so do
      longer rows with ``by_column`` (categorical fields).

    Whole sequences are taken in a seeded random order, at most ``max_samples`` rows."""
    xa, _ = _as_array(x, "inputs")
    ya, _ = _as_array(y, "labels")
    if xa.ndim != 2 or xa.dtype.kind != "i":
        return "not integer token sequences"
    per_position = xa.shape == ya.shape and ya.dtype.kind in "iu"
    rows = max_samples // xa.shape[1] if per_position and xa.shape[1] else max_samples
    order = np.random.default_rng(seed).permutation(xa.shape[0])[: max(1, rows)]
    ids, width = _frequent_ids(xa[order].astype(np.int64), TOKEN_IDS)
    if ids.shape[0] < MIN_SEQUENCES:
        return f"only {ids.shape[0]} sequences; need {MIN_SEQUENCES}"
    current = np.eye(width + 1)[ids]
    if not per_position and (xa.shape[1] <= SHORT_ROW or by_column):
        columns = [_frequent_ids(column, TOKEN_IDS) for column in xa[order].astype(np.int64).T]
        bag = np.concatenate([np.eye(size + 1)[codes] for codes, size in columns], axis=1)
    else:
        bag = current.mean(axis=1)
    if not per_position:
        classes, reason = _class_labels(ya[order])
        if classes is None:
            return reason
        labelled = classes >= 0  # a non-finite label is left out
        features, classes = bag[labelled], classes[labelled]
        if features.shape[0] < min_samples:
            return f"only {features.shape[0]} sequences; need {min_samples}"
        _, targets = np.unique(classes, return_inverse=True)
        if targets.max() < 1:
            return "only one class in the labels"
        return ClassData(features, targets, int(targets.max()) + 1, f" (one row per sequence, {ids.shape[0]} in all)")
    ys = ya[order].astype(np.int64)
    # code width + 1: no token before the first
    previous = np.concatenate([np.full((ids.shape[0], 1), width + 1), ids[:, :-1]], axis=1)
    features = np.concatenate([current, np.eye(width + 2)[previous], bag[:, None].repeat(ids.shape[1], axis=1)], axis=2)
    groups = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    features, targets = features.reshape(-1, features.shape[2]), ys.reshape(-1)
    scored = targets >= 0
    classes, count = _frequent_ids(targets[scored], TOKEN_IDS)
    rare = np.bincount(classes, minlength=count + 1) < min_per_class
    keep = np.flatnonzero(scored)[~rare[classes]]  # a class too rare to score stays out, "other" included
    left_out = int(scored.sum()) - keep.size
    note = f" (one row per position of {ids.shape[0]} sequences" + (
        f"; {left_out} positions with a rare target left out)" if left_out else ")")
    if keep.size < min_samples:
        return f"only {keep.size} scored positions with a common target; need {min_samples}"
    _, targets = np.unique(classes[~rare[classes]], return_inverse=True)
    if targets.max() < 1:
        return "one target id at every scored position"
    return ClassData(features[keep], targets, int(targets.max()) + 1, note, groups[keep])


def _frequent_ids(ids: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """``ids`` recoded: the ``k`` most frequent values 0..k-1 (in value order), every other
    value k; and how many codes there are besides that "other" (at most k)."""
    values, counts = np.unique(ids, return_counts=True)
    top = np.sort(values[np.argsort(-counts, kind="stable")[:k]])
    at = np.searchsorted(top, ids).clip(0, top.size - 1)
    return np.where(top[at] == ids, at, top.size), top.size


REGRESSION = "regression targets"


def _class_labels(y: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Class indices from ``y`` (index, one-hot or integral float), or None and why not."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2:
        if np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all():
            return y.argmax(axis=1).astype(np.int64), ""
        if y.dtype.kind == "f" and not np.isin(y[np.isfinite(y)], (0, 1)).all():
            return None, REGRESSION  # several real-valued targets per sample
        return None, "labels are neither class indices nor one-hot rows (multi-label)"
    if y.ndim != 1:
        return None, f"labels of shape {list(y.shape)}: the probe needs one class per sample"
    if y.dtype.kind in "biu":
        return y.astype(np.int64), ""
    finite = np.isfinite(y)
    values = y[finite]
    if not np.array_equal(values, np.floor(values)) or np.unique(values).size > MAX_FLOAT_CLASSES:
        return None, REGRESSION
    # non-finite labels become -1 and are left out with the non-finite inputs
    return np.where(finite, y, -1).astype(np.int64), ""





@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch single-threaded, then restore the thread count: on these tiny matrices
    thread hand-offs cost more than they save (measured 3-8x slower with two threads on
    a busy two-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def standardise(train_x: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Every array standardised with the training split's statistics (a constant
    feature is left at 0), so unnormalised inputs do not look like a label problem."""
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)
    std = np.where(std == 0, 1.0, std)
    return [(a - mean) / std for a in (train_x, *others)]


def train_mlps(
    inputs: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    num_outputs: int,
    *,
    seeds: Sequence[int],
    steps: int,
    hidden: int = 64,
    lr: float = 1e-2,
    checkpoints: Collection[int] = (),
    at_checkpoint: Callable[[Predict, int], None] | None = None,
) -> Predict:
    """Train one MLP per (``inputs[k]``, ``targets[k]``, ``seeds[k]``), full-batch, for
    ``steps`` Adam steps; call ``at_checkpoint(predict, step)`` after each step in
    ``checkpoints``. ``predict(xs)`` takes one input array per model (or one for all) and
    returns each model's logits. Integer targets are classes (cross-entropy), float ones
    real values (MSE, one column per output). A seed gives the same initialisation
    wherever it appears.

    Why stacked: the probes train a few models each (permuted-label nulls, folds) on a few
    hundred rows, where each step is all Python overhead; the models train as one batch
    of independent weights (padded rows carry no weight), each exactly as if alone, in a
    quarter of the time for four."""
    count = len(inputs)
    if not count == len(targets) == len(seeds):
        raise ValueError("train_mlps needs as many targets and seeds as inputs")
    n_features = inputs[0].shape[1]
    rows = max(x.shape[0] for x in inputs)

    def init(seed: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)

        def uniform(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
            return (torch.rand(shape, generator=generator) * 2 - 1) / math.sqrt(fan_in)

        return [uniform((n_features, hidden), n_features), uniform((hidden,), n_features),
                uniform((hidden, num_outputs), hidden), uniform((num_outputs,), hidden)]  # fmt: skip

    w1, b1, w2, b2 = (torch.stack(group).requires_grad_() for group in zip(*(init(seed) for seed in seeds)))
    regression = targets[0].dtype.kind == "f"
    x = torch.zeros(count, rows, n_features)
    y = torch.zeros((count, rows, num_outputs) if regression else (count, rows),
                    dtype=torch.float32 if regression else torch.long)  # fmt: skip
    weight = torch.zeros(count, rows)  # 1/n on a model's own rows: the sum is each model's mean loss
    for k, (features, labels) in enumerate(zip(inputs, targets)):
        n = features.shape[0]
        x[k, :n] = torch.as_tensor(features, dtype=torch.float32)
        y[k, :n] = torch.as_tensor(labels, dtype=y.dtype).reshape(y[k, :n].shape)
        weight[k, :n] = 1.0 / n
    optimizer = torch.optim.Adam([w1, b1, w2, b2], lr=lr, fused=True)

    def forward(batch: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(b2[:, None], torch.relu(torch.baddbmm(b1[:, None], batch, w1)), w2)

    @torch.no_grad()
    def predict(xs: Any) -> list[torch.Tensor]:
        xs = [xs] * count if isinstance(xs, torch.Tensor) else xs
        return [torch.relu(xk @ w1[k] + b1[k]) @ w2[k] + b2[k] for k, xk in enumerate(xs)]

    for step in range(1, steps + 1):
        with torch.enable_grad():
            optimizer.zero_grad(set_to_none=True)
            out = forward(x)
            if regression:
                per_row = (out - y).square().mean(dim=2)
            else:
                per_row = F.cross_entropy(out.reshape(-1, num_outputs), y.reshape(-1), reduction="none")
            (per_row.reshape(count, rows) * weight).sum().backward()
            optimizer.step()
        if at_checkpoint is not None and step in checkpoints:
            at_checkpoint(predict, step)
    return predict


__all__ = ["ClassData", "RegressionData", "class_data", "one_thread", "standardise", "train_mlps"]

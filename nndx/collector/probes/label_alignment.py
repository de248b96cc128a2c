"""Label alignment probe: do the labels belong to their inputs?

How to use::

    result = label_alignment(x, y)        # -> LabelAlignmentResult
    result.status                         # "failed": evidence for LABELS_MISALIGNED

Why it exists: labels shuffled separately from their inputs (two ``shuffle`` calls, an
off-by-one join, a sorted file of labels next to an unsorted folder of images) crash
nothing and pass the classic sanity check. Overfitting one batch cannot see it: a
network memorises random labels as easily as real ones (Zhang et al. 2017,
"Understanding deep learning requires rethinking generalization"), so a loss that
reaches 0 on one batch proves the model *can fit*, not that there is anything to learn.
What random labels cannot do is *generalise*.

How: a small MLP (one hidden ReLU layer, full-batch Adam) is trained twice with the same
initialisation and the same step budget — once on the real labels, once on a random
permutation of them — and both are scored on a held-out split with the real labels.
With aligned labels the real-label model is far better; with misaligned labels both sit
at chance. The score is *balanced* accuracy (the mean of per-class recalls, chance =
1/C), so a majority-class predictor does not look like learning on imbalanced data.
``failed`` means the real-label score does not beat the permuted one by more than three
standard errors of the difference (at least 0.02). With only hundreds of samples the
margin is wide (0.13 for 250 held-out samples of two classes), so a weak but real signal
can fall inside it: read ``real_accuracy`` against ``chance_accuracy`` before blaming the
labels.

The probe works on a copy of the data, seeds its own ``torch.Generator`` and numpy
generator, and leaves the global RNGs untouched. Inputs are standardised internally
(with training-split statistics), so unnormalised data does not masquerade as
misaligned labels — that is a separate check (``check_data``). Regression targets, a
single class, or too little data give ``skipped`` with the reason.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from nndx.collector.data import _as_array
from nndx.collector.probes import ProbeSpec
from nndx.report import LabelAlignmentResult

__all__ = ["label_alignment"]

MIN_SAMPLES = 40
MIN_HOLDOUT = 20
# Float labels with integral values and at most this many distinct values are classes.
MAX_FLOAT_CLASSES = 100


def label_alignment(
    x: Any,
    y: Any,
    *,
    steps: int = 200,
    seed: int = 0,
    hidden: int = 64,
    lr: float = 1e-2,
    holdout_fraction: float = 0.25,
    max_samples: int = 5000,
) -> LabelAlignmentResult:
    """Compare held-out balanced accuracy after training on the real labels and on
    permuted labels (same model, init and budget). ``x``/``y``: arrays or tensors, one
    label per input (class indices, one-hot rows, or integral floats). At most
    ``max_samples`` rows are used (a seeded random subset)."""
    if steps < 1 or hidden < 1 or not 0.0 < holdout_fraction < 1.0 or max_samples < MIN_SAMPLES:
        raise ValueError(
            "label_alignment needs steps >= 1, hidden >= 1, 0 < holdout_fraction < 1 and "
            f"max_samples >= {MIN_SAMPLES}"
        )
    xa, _ = _as_array(x, "inputs")
    ya, _ = _as_array(y, "labels")
    if xa.ndim == 0 or ya.ndim == 0 or xa.shape[0] != ya.shape[0]:
        raise ValueError(f"inputs of shape {list(xa.shape)} and labels of shape {list(ya.shape)}: need one label per input")

    classes, reason = _class_labels(ya)
    if classes is None:
        return LabelAlignmentResult(status="skipped", message=reason, steps=0)
    features = xa.reshape(xa.shape[0], -1).astype(np.float64)
    usable = np.isfinite(features).all(axis=1) & (classes >= 0)
    features, classes = features[usable], classes[usable]
    dropped = int((~usable).sum())
    note = f" ({dropped} rows with non-finite inputs/labels left out)" if dropped else ""
    if features.shape[0] < MIN_SAMPLES:
        return LabelAlignmentResult(
            status="skipped", message=f"only {features.shape[0]} usable samples; need {MIN_SAMPLES}{note}", steps=0
        )

    rng = np.random.default_rng(seed)
    order = rng.permutation(features.shape[0])[:max_samples]
    features, classes = features[order], classes[order]
    _, targets = np.unique(classes, return_inverse=True)
    num_classes = int(targets.max()) + 1
    if num_classes < 2:
        return LabelAlignmentResult(status="skipped", message=f"only one class in the labels{note}", steps=0)
    n_holdout = max(MIN_HOLDOUT, int(round(features.shape[0] * holdout_fraction)))
    train_x, test_x = features[n_holdout:], features[:n_holdout]
    train_y, test_y = targets[n_holdout:], targets[:n_holdout]
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)
    std[std == 0] = 1.0
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    permuted_y = train_y[rng.permutation(train_y.shape[0])]

    with _one_thread():
        real = _train_and_score(train_x, train_y, test_x, test_y, num_classes, steps, seed, hidden, lr)
        permuted = _train_and_score(train_x, permuted_y, test_x, test_y, num_classes, steps, seed, hidden, lr)

    margin = _margin(test_y, num_classes)
    chance = 1.0 / num_classes
    if real - permuted > margin:
        status, verdict = "passed", "clearly better than"
    else:
        status, verdict = "failed", "not clearly better than"
    message = (
        f"held-out balanced accuracy with the real labels {real:.3f} is {verdict} with permuted labels "
        f"{permuted:.3f} (margin {margin:.3f}, chance {chance:.3f}, {train_x.shape[0]} train / "
        f"{n_holdout} held-out samples){note}"
    )
    if status == "failed":
        message += "; the labels probably do not belong to their inputs"
    return LabelAlignmentResult(
        status=status,
        message=message,
        real_accuracy=real,
        permuted_accuracy=permuted,
        chance_accuracy=chance,
        steps=steps,
    )


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch single-threaded for the probe, then restore the thread count: on these
    tiny matrices thread hand-offs cost more than they save (measured 3-8x slower with
    two threads on a busy two-core machine)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _class_labels(y: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Class indices from ``y`` (index, one-hot or integral float), or None and why not."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2:
        if np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all():
            return y.argmax(axis=1).astype(np.int64), ""
        return None, "labels are neither class indices nor one-hot rows (multi-label or multi-target)"
    if y.ndim != 1:
        return None, f"labels of shape {list(y.shape)}: the probe needs one class per sample"
    if y.dtype.kind in "biu":
        return y.astype(np.int64), ""
    finite = np.isfinite(y)
    values = y[finite]
    if not np.array_equal(values, np.floor(values)) or np.unique(values).size > MAX_FLOAT_CLASSES:
        return None, "regression targets: label alignment needs class labels"
    # non-finite labels become -1 and are left out with the non-finite inputs
    return np.where(finite, y, -1).astype(np.int64), ""


def _train_and_score(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    num_classes: int,
    steps: int,
    seed: int,
    hidden: int,
    lr: float,
) -> float:
    """Train a one-hidden-layer MLP full-batch with Adam; balanced accuracy on the test split."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)  # same init for both runs; global RNG untouched
    n_features = train_x.shape[1]

    def uniform(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
        bound = 1.0 / math.sqrt(fan_in)
        return ((torch.rand(shape, generator=generator) * 2 - 1) * bound).requires_grad_()

    w1, b1 = uniform((n_features, hidden), n_features), uniform((hidden,), n_features)
    w2, b2 = uniform((hidden, num_classes), hidden), uniform((num_classes,), hidden)
    params = [w1, b1, w2, b2]
    inputs = torch.as_tensor(train_x, dtype=torch.float32)
    targets = torch.as_tensor(train_y, dtype=torch.long)
    optimizer = torch.optim.Adam(params, lr=lr)

    def forward(batch: torch.Tensor) -> torch.Tensor:
        return torch.relu(batch @ w1 + b1) @ w2 + b2

    test_inputs = torch.as_tensor(test_x, dtype=torch.float32)
    # Scored at a few checkpoints and the best kept (alike for both runs): a small MLP
    # overfits weak but real signal long before the budget ends.
    checkpoints = {max(1, steps // 8), max(1, steps // 4), max(1, steps // 2), steps}
    best = 0.0
    for step in range(1, steps + 1):
        with torch.enable_grad():
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(forward(inputs), targets).backward()
            optimizer.step()
        if step in checkpoints:
            with torch.no_grad():
                predicted = forward(test_inputs).argmax(dim=1).numpy()
            best = max(best, _balanced_accuracy(test_y, predicted, num_classes))
    return best


def _balanced_accuracy(truth: np.ndarray, predicted: np.ndarray, num_classes: int) -> float:
    recalls = [float(np.mean(predicted[truth == c] == c)) for c in range(num_classes) if np.any(truth == c)]
    return float(np.mean(recalls))


def _margin(test_y: np.ndarray, num_classes: int) -> float:
    """Three standard errors of the difference of two balanced accuracies near chance."""
    counts = np.bincount(test_y, minlength=num_classes)
    counts = counts[counts > 0]
    q = 1.0 / num_classes
    variance = float(np.sum(q * (1 - q) / counts)) / counts.size**2
    return max(0.02, 3.0 * math.sqrt(2.0 * variance))


SPEC = ProbeSpec(name="label_alignment", title=LabelAlignmentResult.title, function=label_alignment,
                 result=LabelAlignmentResult, order=70, needs="data")  # fmt: skip

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

How: a small MLP (one hidden ReLU layer, full-batch Adam) is trained on the real labels
and, from the same initialisation and with the same budget, on a few random
permutations of them; all are scored with the real labels on samples they did not see,
in folds: the first quarter held out, and when that cannot tell, every sample held out
once (a single held-out quarter leaves two classes' small gain hidden in its noise). The
test is paired, sample by sample: the held-out cross-entropy of the true label under
the permuted-label models minus under the real-label model (each at its best
checkpoint), with the probabilities mixed half and half with the training prior (a model
that memorised labels is confidently wrong on a few held-out samples, whose huge losses
would be the noise). Cross-entropy, not accuracy, because a barely trained network's
argmax is its initialisation's luck (on clustered data it "separates" the classes
whatever the labels), while its probabilities are near uniform and carry no such luck.
Labels that carry no signal at all (two classes drawn from one distribution) are
indistinguishable from misaligned ones; the message says "probably".

- ``passed``: the real labels lower the held-out cross-entropy by more than
  ``Z_ALIGNED`` standard errors;
- ``failed`` (LABELS_MISALIGNED): they do not, and the held-out samples are enough to
  have seen a gain of ``MIN_EFFECT`` of the prior's entropy (the one-sided 95% bound of
  the gain stays under it);
- ``skipped``: too few samples (a class with fewer than ``MIN_PER_CLASS``; for real-valued
  targets, fewer than ``MIN_HOLDOUT`` held out), or inconclusive — a weak signal on small data is not
  evidence of misaligned labels.

``real_accuracy`` and ``permuted_accuracy`` are the held-out *balanced* accuracies (the
mean of per-class recalls, chance = 1/C), reported for reading, not for the verdict.

The probe works on a copy of the data, seeds its own ``torch.Generator`` and numpy
generator, and leaves the global RNGs untouched. Inputs are standardised internally
(with training-split statistics), so unnormalised data does not masquerade as
misaligned labels — that is a separate check (``check_data``). Real-valued (regression)
targets get the same paired test on the held-out squared error (:func:`_regression`). A
single class, or too little data give ``skipped`` with the reason.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._small_model import (
    ClassData, RegressionData, class_data, one_thread, standardise, token_data, train_mlps,
)
from nndx.report import LabelAlignmentResult

__all__ = ["label_alignment"]

MIN_SAMPLES = 40
# below these, held-out scores are too coarse to judge: "skipped", never "failed"
MIN_HOLDOUT = 30
MIN_PER_CLASS = 3
PERMUTATIONS = 3
Z_ALIGNED = 3.0  # the real labels beat the permuted ones by this many standard errors: aligned
Z_BOUND = 1.64  # one-sided 95% upper bound of the gain
MIN_EFFECT = 0.02  # of the prior's entropy: the least gain aligned labels give a model that learns at all
# a second reading of a row of ids as fields, one one-hot code per column, up to this many features
MAX_FIELD_FEATURES = 4096
MIN_REGRESSION_EFFECT = 0.05  # of the targets' variance: the same for real-valued targets (an R² of 5%)


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
    data = class_data(x, y, min_samples=MIN_SAMPLES, max_samples=max_samples, seed=seed)
    if isinstance(data, str):  # token ids: by position, or by sequence (see token_data)
        tokens = token_data(x, y, min_samples=MIN_SAMPLES, max_samples=max_samples, min_per_class=MIN_PER_CLASS,
                            seed=seed)  # fmt: skip
        data = tokens if isinstance(tokens, ClassData) else data
    if isinstance(data, RegressionData):
        return _regression(data, steps=steps, seed=seed, hidden=hidden, lr=lr, holdout_fraction=holdout_fraction)
    if not isinstance(data, ClassData):
        return LabelAlignmentResult(status="skipped", message=data, steps=0)
    result = _classification(data, steps=steps, seed=seed, hidden=hidden, lr=lr, holdout_fraction=holdout_fraction)
    if result.status == "failed" and "one row per sequence" in data.note:
        # a row of ids may be fields (DeepFM's categories, each column its own vocabulary) rather than a
        # text: read so, a bag of ids loses which field an id came from; a signal either reading finds is one
        fields = token_data(x, y, min_samples=MIN_SAMPLES, max_samples=max_samples, min_per_class=MIN_PER_CLASS,
                            seed=seed, by_column=True)  # fmt: skip
        if isinstance(fields, ClassData) and fields.features.shape[1] <= MAX_FIELD_FEATURES:
            again = _classification(fields, steps=steps, seed=seed, hidden=hidden, lr=lr,
                                    holdout_fraction=holdout_fraction)  # fmt: skip
            if again.status == "passed":
                again.message = f"read column by column (the ids as fields, not a text): {again.message}"
                return again
    return result


def _classification(data: ClassData, *, steps: int, seed: int, hidden: int, lr: float,
                    holdout_fraction: float) -> LabelAlignmentResult:  # fmt: skip
    features, targets, num_classes, note, groups = data
    # a sample is a row, or a whole sequence for rows cut from sequences
    groups = np.arange(targets.size) if groups is None else groups
    rng = np.random.default_rng(seed + 1)
    counts = np.bincount(targets, minlength=num_classes)
    if counts.min() < MIN_PER_CLASS:
        return LabelAlignmentResult(status="skipped", steps=0, message=(
            f"too few samples to judge: the rarest class {int(counts.min())} times (need {MIN_PER_CLASS}){note}"))

    # folds that hold out every sample once (cross-fitting), for when the first alone cannot
    # tell: two classes' entropy, and so the gain to detect, is small
    folds, held_out = [], []  # held_out: each fold's held-out samples (rows' groups)
    for held_groups in np.array_split(np.unique(groups), max(2, round(1 / holdout_fraction))):
        held = np.flatnonzero(np.isin(groups, held_groups))
        train = np.setdiff1d(np.arange(features.shape[0]), held)
        train_x, test_x = standardise(features[train], features[held])
        train_y = targets[train]
        # the null: the same model from the same initialisation, on labels that belong to nothing
        labels = [train_y] + [train_y[rng.permutation(train_y.shape[0])] for _ in range(PERMUTATIONS)]
        folds.append((train_x, labels, test_x, targets[held]))
        held_out.append(groups[held])
    prior = counts / counts.sum()
    effect = MIN_EFFECT * float(-(prior[prior > 0] * np.log(prior[prior > 0])).sum())
    chance = 1.0 / num_classes
    scores: list[list[tuple[float, np.ndarray]]] = []
    # the first fold alone mostly settles it (many classes, a clear signal); the others only
    # when it cannot tell, which keeps the usual cost at one fold's
    for group in (folds[:1], folds[1:]):
        with one_thread():
            scores += _score(group, num_classes, steps, seed, hidden, lr)
        real_loss = np.concatenate([fold[0][1] for fold in scores])
        null_loss = np.concatenate([np.mean([loss for _, loss in fold[1:]], axis=0) for fold in scores])
        # per sample, in nats: a sequence's positions are one sample, their mean its gain
        _, sample = np.unique(np.concatenate(held_out[: len(scores)]), return_inverse=True)
        gains = np.bincount(sample, weights=null_loss - real_loss) / np.bincount(sample)
        weights = [len(fold[3]) for fold in folds[: len(scores)]]
        real = float(np.average([fold[0][0] for fold in scores], weights=weights))
        null = float(np.average([np.mean([accuracy for accuracy, _ in fold[1:]]) for fold in scores], weights=weights))
        facts = (f"held-out balanced accuracy with the real labels {real:.3f}, with permuted labels {null:.3f} "
                 f"(chance {chance:.3f}); the real labels lower the held-out cross-entropy by")  # fmt: skip
        status, message = _verdict(gains, effect, facts, "nats", "labels", f"{gains.size} held-out samples in "
                                   f"{len(scores)} of {len(folds)} folds{note}")  # fmt: skip
        if status != "skipped":
            break
    return LabelAlignmentResult(
        status=status,
        message=message,
        real_accuracy=real,
        permuted_accuracy=null,
        chance_accuracy=chance,
        steps=steps,
    )


def _regression(data: RegressionData, *, steps: int, seed: int, hidden: int, lr: float,
                holdout_fraction: float) -> LabelAlignmentResult:  # fmt: skip
    """The same paired test for real-valued targets: the held-out squared error (targets
    standardised with the training split's statistics, so the mean predictor scores 1 per
    column) under permuted-target models minus under the real-target model. As with classes,
    predictions are shrunk half-way to the training mean: a model that memorised targets is
    far off on a few held-out rows, whose squared errors would be the noise."""
    features, targets, note = data
    n_holdout = int(round(features.shape[0] * holdout_fraction))
    if n_holdout < MIN_HOLDOUT:
        return LabelAlignmentResult(status="skipped", steps=0, message=(
            f"too few samples to judge: {n_holdout} held out (need {MIN_HOLDOUT}){note}"))  # fmt: skip
    train_x, test_x = standardise(features[n_holdout:], features[:n_holdout])
    train_y, test_y = standardise(targets[n_holdout:], targets[:n_holdout])
    test_inputs = torch.as_tensor(test_x, dtype=torch.float32)
    rng = np.random.default_rng(seed + 1)

    labels = [train_y] + [train_y[rng.permutation(train_y.shape[0])] for _ in range(PERMUTATIONS)]
    errors: list[list[np.ndarray]] = [[] for _ in labels]

    def at_checkpoint(predict: Any, _step: int) -> None:
        for kept, predicted in zip(errors, predict(test_inputs)):
            kept.append(((0.5 * predicted.double().numpy() - test_y) ** 2).sum(axis=1))

    checkpoints = {max(1, steps // 8), max(1, steps // 4), max(1, steps // 2), steps}
    with one_thread():
        train_mlps([train_x] * len(labels), labels, train_y.shape[1], seeds=[seed] * len(labels), steps=steps,
                   hidden=hidden, lr=lr, checkpoints=checkpoints, at_checkpoint=at_checkpoint)  # fmt: skip
    real, *permuted = (min(kept, key=lambda e: e.mean()) for kept in errors)
    gains = np.mean(permuted, axis=0) - real
    columns = test_y.shape[1]
    effect = MIN_REGRESSION_EFFECT * columns  # of the targets' variance (1 per standardised column)
    facts = (f"held-out squared error (standardised targets; the mean predictor scores {columns}) with the real "
             f"targets {real.mean():.3g}, with permuted targets {np.mean(permuted):.3g}: the real targets lower it by")
    status, message = _verdict(gains, effect, facts, "", "targets", f"{train_x.shape[0]} train / {n_holdout} "
                               f"held-out samples{note}")  # fmt: skip
    return LabelAlignmentResult(status=status, message=message, steps=steps)


def _verdict(gains: np.ndarray, effect: float, facts: str, unit: str, what: str, samples: str) -> tuple[str, str]:
    """The paired test's status and message from the per-sample ``gains`` of the real
    labels (or targets) over permuted ones: passed when their mean is Z_ALIGNED standard
    errors above 0, failed when even its one-sided 95% bound stays under ``effect``."""
    gain, error = float(gains.mean()), float(gains.std(ddof=1)) / math.sqrt(gains.size)
    z = gain / max(error, 1e-12)
    unit = f" {unit}" if unit else ""
    facts = f"{facts} {gain:.3g} ± {error:.2g}{unit} (z = {z:.1f}; {samples})"
    if z >= Z_ALIGNED:
        return "passed", f"{facts}: the {what} carry signal a model learns"
    if gain + Z_BOUND * error < effect:
        return "failed", (f"{facts}: no better than {what} that belong to nothing, with samples enough to have seen "
                          f"a gain of {effect:.2g}{unit}; the {what} probably do not belong to their inputs")  # fmt: skip
    return "skipped", f"{facts}: inconclusive, the held-out samples cannot tell a weak signal from none"


def _score(folds: list[tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]], num_classes: int, steps: int,
           seed: int, hidden: int, lr: float) -> list[list[tuple[float, np.ndarray]]]:  # fmt: skip
    """Per fold (train inputs, sets of train labels, held-out inputs, held-out labels), per
    set of labels: (best held-out balanced accuracy, the held-out cross-entropy per sample
    at the checkpoint where its mean was lowest). One model per set, all from the same
    initialisation, all trained at once, scored at a few checkpoints alike for every model:
    a small MLP overfits weak but real signal long before the budget ends."""
    models = [(k, train_x, y, test_x, test_y) for k, (train_x, sets, test_x, test_y) in enumerate(folds) for y in sets]
    tests = [torch.as_tensor(test_x, dtype=torch.float32) for _, _, _, test_x, _ in models]
    priors = [torch.as_tensor(np.bincount(folds[k][1][0], minlength=num_classes) / folds[k][1][0].size)
              for k, *_ in models]  # fmt: skip
    scores: list[list[tuple[float, np.ndarray]]] = [[] for _ in models]

    def at_checkpoint(predict: Any, _step: int) -> None:
        for kept, logits, prior, (_, _, _, _, test_y) in zip(scores, predict(tests), priors, models):
            # half the model's probabilities, half the training prior: a model that memorised
            # labels is confidently wrong on most held-out samples, and without the prior those
            # few samples' huge losses are the noise that hides a real signal
            probabilities = 0.5 * torch.softmax(logits.double(), dim=1) + 0.5 * prior
            losses = -torch.log(probabilities.gather(1, torch.as_tensor(test_y)[:, None])[:, 0]).numpy()
            kept.append((_balanced_accuracy(test_y, logits.argmax(dim=1).numpy(), num_classes), losses))

    checkpoints = {max(1, steps // 8), max(1, steps // 4), max(1, steps // 2), steps}
    train_mlps([m[1] for m in models], [m[2] for m in models], num_classes, seeds=[seed] * len(models), steps=steps,
               hidden=hidden, lr=lr, checkpoints=checkpoints, at_checkpoint=at_checkpoint)  # fmt: skip
    best = [(max(a for a, _ in kept), min((losses for _, losses in kept), key=lambda losses: losses.mean()))
            for kept in scores]  # fmt: skip
    per_set = len(folds[0][1])
    return [best[k * per_set:(k + 1) * per_set] for k in range(len(folds))]


def _balanced_accuracy(truth: np.ndarray, predicted: np.ndarray, num_classes: int) -> float:
    recalls = [float(np.mean(predicted[truth == c] == c)) for c in range(num_classes) if np.any(truth == c)]
    return float(np.mean(recalls))


SPEC = ProbeSpec(name="label_alignment", title=LabelAlignmentResult.title, function=label_alignment,
                 result=LabelAlignmentResult, order=70, needs="data")  # fmt: skip

"""Label-noise probe: what share of the labels disagrees with confident out-of-sample predictions?

How to use::

    result = label_noise(x, y)            # -> LabelNoiseResult
    result.noise_fraction                  # estimated share of wrong labels
    result.status                          # "failed": evidence for LABEL_NOISE

Why it exists: labels flipped at random (careless annotation, a join that mixes rows, a
preprocessing step applied to the labels) crash nothing; the network memorises the wrong
labels along with the right ones, and the only symptom is a validation accuracy that
stops well short of what the data allows. Collapsed labels (one class everywhere) are
seen by the data checks; scattered wrong labels are not.

How (cross-validated disagreement, after the "label errors" recipe of confident
learning): a small MLP is trained on 3 of 4 folds and predicts the 4th, so every sample
gets an out-of-sample prediction from a model that never saw its label. Where that
prediction is confident, a label that disagrees with it is probably wrong. Noise flipped
at random does not care where a sample lies, so the share of disagreeing labels is the
same among the most confidently predicted samples as anywhere; a task that is merely
hard has its disagreements where the classes overlap, where no prediction is confident.
So the estimate is the disagreement among the ``CONFIDENT_SHARE`` most confidently
predicted samples, and ``failed`` means its one-sided 95% lower bound exceeds
``NOISE_FLOOR``.

When the confident predictions are nearly all of one class (click-through data: the surest
predictions are all "no click"), the disagreement among them is how often the other
classes occur where that one is likeliest: an outcome drawn at random (a click, a loan
default) gives it as surely as wrong labels do, and the probe says ``skipped``.

A task whose classes overlap *everywhere* to the same degree is indistinguishable from
clean data with that much noise: the estimate then reads "at least this share of labels
disagrees with the data", which is what the user needs to know either way. The probe
works on a copy of the data, seeds its own generators, leaves the global RNGs untouched,
and says ``skipped`` for regression targets, a single class, or too few samples.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._small_model import ClassData, class_data, one_thread, standardise, train_mlps
from nndx.report import LabelNoiseResult

MIN_SAMPLES = 100
FOLDS = 4
CONFIDENT_SHARE = 0.25  # of the samples, the most confidently predicted, where disagreement is judged
NOISE_FLOOR = 0.10  # a lower bound of the wrong-label share above this is evidence of noise
# random flips hit every class: confident predictions of a second class at least this share, or no verdict
MIN_CONFIDENT_CLASS_SHARE = 0.1
Z_BOUND = 1.64  # one-sided 95%


def label_noise(
    x: Any,
    y: Any,
    *,
    steps: int = 150,
    seed: int = 0,
    hidden: int = 64,
    lr: float = 1e-2,
    max_samples: int = 3000,
) -> LabelNoiseResult:
    """Estimate the share of wrong labels from 4-fold out-of-sample predictions of a
    small MLP. ``x``/``y``: arrays or tensors, one label per input (class indices,
    one-hot rows, or integral floats); at most ``max_samples`` rows (a seeded subset)."""
    if steps < 1 or hidden < 1:
        raise ValueError("label_noise needs steps >= 1 and hidden >= 1")
    data = class_data(x, y, min_samples=MIN_SAMPLES, max_samples=max_samples, seed=seed)
    if not isinstance(data, ClassData):
        reason = data if isinstance(data, str) else "regression targets: label noise needs class labels"
        return LabelNoiseResult(status="skipped", message=reason)
    features, targets, num_classes, note, _ = data
    probabilities = _out_of_sample(features, targets, num_classes, steps, seed, hidden, lr)
    predicted, confidence = probabilities.argmax(axis=1), probabilities.max(axis=1)
    disagree = predicted != targets
    confident = np.argsort(-confidence, kind="stable")[: max(1, int(CONFIDENT_SHARE * targets.size))]
    share = float(disagree[confident].mean())
    lower = share - Z_BOUND * math.sqrt(max(share * (1 - share), 1e-12) / confident.size)
    facts = (f"{share:.1%} of the labels disagree with a confident out-of-sample prediction (the "
             f"{confident.size} most confident of {targets.size} samples; {float(disagree.mean()):.1%} of all "
             f"disagree; {FOLDS}-fold cross-validated MLP){note}")  # fmt: skip
    counts = np.sort(np.bincount(predicted[confident], minlength=num_classes))[::-1]
    one_class = counts.size < 2 or counts[1] < MIN_CONFIDENT_CLASS_SHARE * confident.size
    if lower > NOISE_FLOOR and one_class:
        status, message = "skipped", (
            f"{facts}, but the confident predictions are nearly all of one class ({counts[0]} of {confident.size}): "
            "the disagreement there is how often the other classes occur where that one is likeliest, which an "
            "outcome drawn at random (a click, a default) gives as surely as wrong labels")  # fmt: skip
    elif lower > NOISE_FLOOR:
        status, message = "failed", (f"{facts}: at least {lower:.0%} of the labels look wrong, more than "
                                     f"{NOISE_FLOOR:.0%}")  # fmt: skip
    else:
        status, message = "passed", f"{facts}: no evidence of more than {NOISE_FLOOR:.0%} wrong labels"
    return LabelNoiseResult(status=status, message=message, noise_fraction=share, noise_lower_bound=max(lower, 0.0),
                            disagreement_fraction=float(disagree.mean()), confident_samples=int(confident.size),
                            samples=int(targets.size), classes=int(num_classes))  # fmt: skip


def _out_of_sample(features: np.ndarray, targets: np.ndarray, num_classes: int, steps: int, seed: int, hidden: int,
                   lr: float) -> np.ndarray:  # fmt: skip
    """Each sample's class probabilities from the model trained on the other folds, at
    the checkpoint (the same for every fold) with the lowest out-of-sample loss."""
    fold = np.arange(targets.size) % FOLDS  # the rows come shuffled from class_data
    checkpoints = sorted({max(1, steps // 4), max(1, steps // 2), steps})
    logits = {step: np.zeros((targets.size, num_classes)) for step in checkpoints}
    splits = [standardise(features[fold != k], features[fold == k]) for k in range(FOLDS)]
    held_inputs = [torch.as_tensor(held_x, dtype=torch.float32) for _, held_x in splits]

    def keep(predict: Any, step: int) -> None:
        for k, predicted in enumerate(predict(held_inputs)):
            logits[step][fold == k] = predicted.double().numpy()

    with one_thread():
        train_mlps([train_x for train_x, _ in splits], [targets[fold != k] for k in range(FOLDS)], num_classes,
                   seeds=[seed + k for k in range(FOLDS)], steps=steps, hidden=hidden, lr=lr, checkpoints=checkpoints,
                   at_checkpoint=keep)  # fmt: skip
    truth = torch.as_tensor(targets)
    best = min(checkpoints, key=lambda step: float(F.cross_entropy(torch.as_tensor(logits[step]), truth)))
    return torch.softmax(torch.as_tensor(logits[best]), dim=1).numpy()


SPEC = ProbeSpec(name="label_noise", title=LabelNoiseResult.title, function=label_noise, result=LabelNoiseResult,
                 order=75, needs="data")  # fmt: skip

"""Synthetic training runs that look like real ones (a small CNN, 300 steps, recorded
every 10), for the browser test and its screenshots: healthy, dead ReLUs appearing
mid-run, and a learning rate so high the loss goes to NaN."""

from __future__ import annotations

import math
import random
from datetime import datetime, timezone

from nndx.report import (
    ActivationStats,
    DataStats,
    DiagnosticReport,
    GradientStats,
    GradNormPoint,
    LayerInfo,
    LayerStats,
    LiveFinding,
    LossPoint,
    LoopStats,
    LRPoint,
    LRRangeResult,
    ModelSummary,
    OverfitResult,
    ParameterStats,
    Probes,
    RunInfo,
    ScalarPoint,
    SplitStats,
)

LAYERS = [("features.conv1", "Conv2d"), ("features.relu1", "ReLU"), ("features.conv2", "Conv2d"),
          ("features.relu2", "ReLU"), ("classifier.fc1", "Linear"), ("classifier.relu", "ReLU"),
          ("classifier.fc2", "Linear")]  # fmt: skip
PARAMS = ["features.conv1.weight", "features.conv1.bias", "features.conv2.weight", "features.conv2.bias",
          "classifier.fc1.weight", "classifier.fc1.bias", "classifier.fc2.weight", "classifier.fc2.bias"]  # fmt: skip
STEPS, EVERY = 300, 10


def run(name: str, project: str = "digits-cnn", *, bug: str | None = None, seed: int = 0, lr: float = 3e-3) -> DiagnosticReport:
    """``bug``: None, "dead_relu" (features.relu2 dies from step 120) or "lr_too_high"
    (the loss explodes and turns NaN at step 140)."""
    rng = random.Random(seed)
    broken_at = {"dead_relu": 120, "lr_too_high": 140}.get(bug or "", STEPS + 1)
    train, val, grad_norms, lrs, inputs = [], [], [], [], []
    loss = 2.3
    for step in range(STEPS):
        schedule = lr * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        if bug == "lr_too_high":
            loss = loss * (1.0 + 0.04 * rng.random()) + 0.02 if step > 60 else loss * 0.99
            value = loss if step < broken_at else math.nan
        else:
            target = 0.08 if bug is None else 0.9 if step > broken_at else 0.5
            loss = target + (loss - target) * 0.985
            value = loss * (1 + 0.08 * rng.gauss(0, 1))
        accuracy = max(0.0, min(1.0, 1.0 - value / 2.5)) if math.isfinite(value) else 0.1
        train.append(LossPoint(step=step, value=value, accuracy=accuracy))
        if step % 50 == 49:
            val.append(LossPoint(step=step, value=value * 1.15 if math.isfinite(value) else value,
                                 accuracy=accuracy * 0.97))  # fmt: skip
        lrs.append(LRPoint(step=step, lrs=[schedule]))
        inputs.append(ScalarPoint(step=step, value=28.0 + rng.gauss(0, 0.4)))
        if step % EVERY == 0:
            norm = 1.5 * math.exp(-step / 200) + 0.3 * rng.random()
            if bug == "lr_too_high":
                norm = 2.0 * 1.12 ** max(0, step - 60) if step < broken_at else math.inf
            grad_norms.append(GradNormPoint(step=step, before_clip=norm))
    layers, parameters = [], []
    for step in range(0, STEPS, EVERY):
        dead_now = step >= broken_at and bug == "dead_relu"
        for depth, (layer, kind) in enumerate(LAYERS):
            dead = 1.0 if dead_now and layer == "features.relu2" else 0.01 + 0.01 * rng.random() if kind == "ReLU" else 0.0
            std = 0.0 if dead == 1.0 else 0.9 / (1 + 0.2 * depth)
            exploded = bug == "lr_too_high" and step >= broken_at
            gradient = 0.0 if dead_now and depth <= 3 else 0.02 / (1 + depth) ** 0.5
            layers.append(LayerStats(
                name=layer, type=kind, step=step,
                activation=ActivationStats(mean=math.nan if exploded else 0.3, std=math.nan if exploded else std,
                                           min=0.0, max=3.0, zero_fraction=0.5 if kind == "ReLU" else 0.0,
                                           dead_unit_fraction=dead, unit_count=64),
                gradient=GradientStats(abs_mean=math.nan if exploded else gradient / 30, max=gradient,
                                       norm=math.inf if exploded else gradient, nonfinite_count=64 if exploded else 0),
            ))  # fmt: skip
        for i, param in enumerate(PARAMS):
            ratio = 1.2e-3 * (1 + 0.3 * rng.random()) / (1 + 0.3 * (i % 2))
            if bug == "lr_too_high":
                ratio = ratio * 1.08 ** max(0, step - 60) if step < broken_at else math.nan
            if bug == "dead_relu" and step >= broken_at and i < 4:
                ratio = 0.0
            parameters.append(ParameterStats(name=param, step=step, weight_norm=3.0, update_ratio=ratio))
    alerts = {
        "dead_relu": [LiveFinding(rule_id="NNDX208", code="DEAD_RELU", severity="error", step=broken_at + 10,
                                  title="Units died during training")],
        "lr_too_high": [LiveFinding(rule_id="NNDX204", code="EXPLODING_GRADIENTS", severity="error", step=110,
                                    title="Exploding gradients"),
                        LiveFinding(rule_id="NNDX102", code="LR_TOO_HIGH", severity="error", step=broken_at,
                                    title="Loss became NaN/Inf after training started")],
    }.get(bug or "", [])  # fmt: skip
    sweep = [10 ** (-6 + 7 * k / 59) for k in range(60)]
    curve = [2.3 - 1.6 / (1 + math.exp(-(math.log10(x) + 2.5) * 3)) + (0 if x < 0.3 else (x - 0.3) * 40) for x in sweep]
    curve[-4:] = [curve[-5] * 3, curve[-5] * 8, math.inf, math.nan]
    return DiagnosticReport(
        run=RunInfo(name=name, project=project, torch_version="2.13.0+cpu", device="cpu", dtype="float32", seed=seed,
                    started_at=datetime(2026, 5, 1, 9, 30, tzinfo=timezone.utc)),
        model=ModelSummary(param_count=206922, trainable_param_count=206922,
                           layers=[LayerInfo(name=n, type=t) for n, t in LAYERS], activations=["ReLU"] * 3,
                           last_layer="Linear"),
        task="classification", num_classes=10,
        loss_history={"train": train, "val": val},
        layers=layers, parameters=parameters,
        loop=LoopStats(steps=STEPS, backward_calls=STEPS, zero_grad_calls=STEPS, forward_calls=STEPS,
                       lr_history=lrs, grad_norm_history=grad_norms, input_norm_history=inputs,
                       live_findings=alerts),
        probes=Probes(
            lr_range=LRRangeResult(status="passed", lrs=sweep, losses=curve, smoothed=curve, suggested_lr=3.2e-3,
                                   valley_lr=1.1e-3, min_over_10_lr=2.4e-2, diverged_at_lr=sweep[-2],
                                   message="steepest descent at lr 0.0032"),
            overfit_one_batch=OverfitResult(status="passed", task="classification", steps=120, lr=3e-3,
                                            initial_loss=2.31, final_loss=0.004,
                                            losses=[2.31 * math.exp(-s / 18) for s in range(120)]),
        ),
        data=DataStats(
            train=SplitStats(n_samples=1437, input_shape=[1, 8, 8], input_dtype="float32", input_mean=0.0,
                             input_std=1.0, input_min=-1.2, input_max=2.9, feature_means=[0.0], feature_stds=[1.0],
                             label_dtype="int64", label_kind="class_index",
                             class_counts={str(c): 140 + (c * 7) % 12 for c in range(10)}, imbalance_ratio=1.08),
            test=SplitStats(n_samples=360, input_shape=[1, 8, 8], input_dtype="float32", feature_stds=[1.02],
                            label_dtype="int64", label_kind="class_index",
                            class_counts={str(c): 36 for c in range(10)}, imbalance_ratio=1.0),
            expected_num_classes=10,
        ),
    )  # fmt: skip

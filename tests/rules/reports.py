"""Hand-built reports for the rule tests: realistic healthy runs and one broken report
per rule. Built by hand because the rules must be judged on what a report says, and
the collectors that fill reports are tested on their own."""

from __future__ import annotations

import math
import random

from nndx.report import (
    ActivationStats,
    DataStats,
    DiagnosticReport,
    EvalModeResult,
    GradCheckParam,
    GradCheckResult,
    GradientStats,
    GradNormPoint,
    LabelAlignmentResult,
    LayerInfo,
    LayerStats,
    LossCall,
    LossPoint,
    LoopStats,
    LRPoint,
    LRRangeResult,
    ModelSummary,
    NanOriginResult,
    OverfitResult,
    ParameterStats,
    Probes,
    ScalarPoint,
    SplitStats,
)

# --------------------------------------------------------------------------- curves


def points(values: list[float], accuracies: list[float] | None = None, every: int = 1) -> list[LossPoint]:
    return [
        LossPoint(step=i * every, value=v, accuracy=None if accuracies is None else accuracies[i])
        for i, v in enumerate(values)
    ]


def noisy_decreasing(seed: int, n: int = 200, start: float = 2.3, end: float = 0.3, noise: float = 0.08) -> list[float]:
    """Exponential decay toward ``end`` with multiplicative minibatch noise, like real training."""
    rng = random.Random(seed)
    values = []
    for i in range(n):
        level = end + (start - end) * math.exp(-5 * i / n)
        values.append(max(1e-4, level * (1 + rng.gauss(0, noise))))
    return values


def plateau_curve(seed: int, n: int = 200, start: float = 0.693, floor: float = 0.61, noise: float = 0.04) -> list[float]:
    """Falls quickly to the task's noise floor, then stays there (a noisy task)."""
    rng = random.Random(seed)
    return [max(1e-4, (floor + (start - floor) * math.exp(-15 * i / n)) * (1 + rng.gauss(0, noise))) for i in range(n)]


def flat(seed: int, n: int = 100, level: float = 2.3026, noise: float = 0.005) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.gauss(0, noise)) for _ in range(n)]


# --------------------------------------------------------------------------- layers / parameters

MLP_LAYERS = [
    LayerInfo(name="0", type="Linear", output_shape=[32, 64], param_count=50240, trainable_param_count=50240),
    LayerInfo(name="1", type="ReLU", output_shape=[32, 64]),
    LayerInfo(name="2", type="Linear", output_shape=[32, 64], param_count=4160, trainable_param_count=4160),
    LayerInfo(name="3", type="ReLU", output_shape=[32, 64]),
    LayerInfo(name="4", type="Linear", output_shape=[32, 10], param_count=650, trainable_param_count=650),
]


def mlp_model(**changes) -> ModelSummary:
    fields = dict(
        param_count=55050,
        trainable_param_count=55050,
        layers=MLP_LAYERS,
        activations=["ReLU", "ReLU"],
        last_layer="Linear",
    )
    fields.update(changes)
    return ModelSummary(**fields)


def act(mean=0.4, std=0.6, zero=0.5, dead=0.02, sat=None, units=64, nonfinite=0) -> ActivationStats:
    return ActivationStats(
        mean=mean,
        std=std,
        min=0.0 if zero else -2.0,
        max=3.0,
        zero_fraction=zero,
        dead_unit_fraction=dead,
        saturated_fraction=sat,
        nonfinite_count=nonfinite,
        unit_count=units,
    )


def grad(norm: float, abs_mean: float | None = None, nonfinite: int = 0) -> GradientStats:
    return GradientStats(abs_mean=abs_mean if abs_mean is not None else norm / 40, max=norm / 5, norm=norm, nonfinite_count=nonfinite)


def mlp_layers(steps=(0, 50, 100, 150), dead=0.02, grads=(0.05, 0.08, 0.1)) -> list[LayerStats]:
    """Linear/ReLU stats per recorded step; healthy by default (about half the outputs zero)."""
    layers = []
    for step in steps:
        layers += [
            LayerStats(name="0", type="Linear", step=step, activation=act(mean=0.0, std=1.0, zero=0.0, dead=0.0), gradient=grad(grads[0])),
            LayerStats(name="1", type="ReLU", step=step, activation=act(dead=dead), gradient=grad(grads[0])),
            LayerStats(name="2", type="Linear", step=step, activation=act(mean=0.0, std=0.8, zero=0.0, dead=0.0), gradient=grad(grads[1])),
            LayerStats(name="3", type="ReLU", step=step, activation=act(dead=dead), gradient=grad(grads[1])),
            LayerStats(name="4", type="Linear", step=step, activation=act(mean=0.0, std=1.2, zero=0.0, dead=0.0, units=10), gradient=grad(grads[2])),
        ]
    return layers


def mlp_params(steps=(0, 50, 100, 150), ratio=1.2e-3) -> list[ParameterStats]:
    params = []
    for step in steps:
        for name, shape, norm in (
            ("0.weight", [64, 784], 8.0),
            ("0.bias", [64], 0.3),
            ("2.weight", [64, 64], 4.6),
            ("2.bias", [64], 0.3),
            ("4.weight", [10, 64], 1.8),
            ("4.bias", [10], 0.1),
        ):
            params.append(
                ParameterStats(name=name, shape=shape, step=step, weight_norm=norm, grad_norm=0.1, update_ratio=ratio * (1.5 if len(shape) == 1 else 1.0))
            )
    return params


# --------------------------------------------------------------------------- loop / data / probes


def healthy_loop(steps: int = 200, lr: float = 1e-3, **changes) -> LoopStats:
    rng = random.Random(7)
    fields = dict(
        steps=steps,
        backward_calls=steps,
        zero_grad_calls=steps,
        forward_calls=steps + 20,
        trainable_param_count=55050,
        lr_history=[LRPoint(step=i, lrs=[lr]) for i in range(0, steps, 10)],
        grad_norm_history=[GradNormPoint(step=i, before_clip=1.5 * math.exp(-i / steps) * (1 + 0.2 * rng.random())) for i in range(0, steps, 5)],
        input_norm_history=[ScalarPoint(step=i, value=28.0 + rng.random()) for i in range(0, steps, 5)],
        loss_calls=[
            LossCall(
                loss_type="CrossEntropyLoss",
                output_shape=[32, 10],
                target_shape=[32],
                output_dtype="torch.float32",
                target_dtype="torch.int64",
                output_min=-4.1,
                output_max=5.3,
                output_rows_sum_to_one=False,
                calls=steps,
            )
        ],
    )
    fields.update(changes)
    return LoopStats(**fields)


def healthy_split(n: int = 1500, **changes) -> SplitStats:
    fields = dict(
        n_samples=n,
        input_shape=[784],
        input_dtype="torch.float32",
        input_mean=0.01,
        input_std=0.99,
        input_min=-1.2,
        input_max=4.5,
        feature_scale_ratio=3.0,
        label_dtype="torch.int64",
        label_kind="class_index",
        class_counts={str(c): n // 10 for c in range(10)},
        imbalance_ratio=1.0,
        duplicate_count=0,
        duplicate_fraction=0.0,
        zero_sample_fraction=0.0,
        label_runs_fraction=0.1,
    )
    fields.update(changes)
    return SplitStats(**fields)


def healthy_data(**changes) -> DataStats:
    fields = dict(train=healthy_split(), test=healthy_split(n=300, label_runs_fraction=0.11), expected_num_classes=10)
    fields.update(changes)
    return DataStats(**fields)


def healthy_probes(**changes) -> Probes:
    fields = dict(
        overfit_one_batch=OverfitResult(status="passed", task="classification", steps=100, lr=1e-3, initial_loss=2.3, final_loss=0.004, final_accuracy=1.0),
        lr_range=LRRangeResult(status="passed", suggested_lr=3e-3, valley_lr=2e-3, min_over_10_lr=1e-3, min_loss=0.9, diverged_at_lr=0.3),
        grad_check=GradCheckResult(status="passed", max_relative_error=2e-8, parameters=[GradCheckParam(name="0.weight", relative_error=2e-8, status="ok")]),
        nan_origin=NanOriginResult(status="passed", input_nonfinite_count=0, loss_finite=True),
        eval_mode=EvalModeResult(status="passed", training=False, has_dropout=False, has_batchnorm=False, max_abs_diff=0.0),
        label_alignment=LabelAlignmentResult(status="passed", real_accuracy=0.9, permuted_accuracy=0.1, chance_accuracy=0.1, steps=100),
    )
    fields.update(changes)
    return Probes(**fields)


def healthy_mlp(seed: int = 0, **changes) -> DiagnosticReport:
    """An MLP on a 10-class task training normally: everything the collectors fill."""
    train = noisy_decreasing(seed)
    val = noisy_decreasing(seed + 100, n=20, start=2.25, end=0.35, noise=0.03)
    fields = dict(
        task="classification",
        num_classes=10,
        model=mlp_model(),
        loss_history={
            "train": points(train, [min(0.97, 0.1 + 0.85 * (1 - v / 2.3)) for v in train]),
            "val": points(val, [min(0.95, 0.1 + 0.8 * (1 - v / 2.3)) for v in val], every=10),
        },
        layers=mlp_layers(),
        parameters=mlp_params(),
        probes=healthy_probes(),
        loop=healthy_loop(),
        data=healthy_data(),
    )
    fields.update(changes)
    return DiagnosticReport(**fields)


def with_loop(report: DiagnosticReport, **changes) -> DiagnosticReport:
    return report.model_copy(update={"loop": report.loop.model_copy(update=changes)})


def healthy_reports() -> dict[str, DiagnosticReport]:
    """Realistic healthy runs, each a kind of run a naive rule might mistake for a bug."""
    base = healthy_mlp()
    reports = {"mlp": base, "mlp_seed1": healthy_mlp(seed=1), "mlp_seed2": healthy_mlp(seed=2)}
    # high minibatch noise (small batch of 16) but still decreasing
    noisy = noisy_decreasing(3, noise=0.2)
    reports["noisy_decreasing"] = base.model_copy(update={"loss_history": {"train": points(noisy)}})
    # dropout + batch-norm CNN evaluated correctly in eval mode
    cnn = ModelSummary(
        param_count=20000,
        trainable_param_count=20000,
        layers=[
            LayerInfo(name="conv1", type="Conv2d"),
            LayerInfo(name="bn1", type="BatchNorm2d"),
            LayerInfo(name="relu1", type="ReLU"),
            LayerInfo(name="pool", type="MaxPool2d"),
            LayerInfo(name="flat", type="Flatten"),
            LayerInfo(name="drop", type="Dropout"),
            LayerInfo(name="fc", type="Linear"),
        ],
        activations=["ReLU"],
        last_layer="Linear",
        normalization_layers=["BatchNorm2d"],
        has_dropout=True,
        has_batchnorm=True,
    )
    reports["dropout_batchnorm_cnn"] = base.model_copy(
        update={
            "model": cnn,
            "loop": base.loop.model_copy(update={"has_dropout": True, "has_batchnorm": True, "no_grad_forwards_in_train_mode": 0}),
            # probed mid-training: the probe finds dropout active in train mode, which is fine
            "probes": healthy_probes(
                eval_mode=EvalModeResult(status="failed", training=True, has_dropout=True, has_batchnorm=True, max_abs_diff=0.3, eval_abs_diff=0.0)
            ),
        }
    )
    # deliberate gradient accumulation: 4 backward per zero_grad, one zero_grad per step
    reports["accumulation"] = with_loop(base, steps=50, backward_calls=200, zero_grad_calls=50)
    # frozen backbone, trained head
    reports["frozen_backbone"] = base.model_copy(
        update={
            "model": mlp_model(trainable_param_count=650),
            "loop": base.loop.model_copy(update={"frozen_params": ["0.weight", "0.bias", "2.weight", "2.bias"], "trainable_param_count": 650}),
            "parameters": [p.model_copy(update={"requires_grad": p.name.startswith("4.")}) for p in base.parameters],
        }
    )
    # per-batch one-cycle schedule: warm up to max_lr, anneal to max_lr / 1e4 at the very end
    steps = 200
    lrs = []
    for i in range(steps):
        if i < 60:
            lr = 0.004 + (0.1 - 0.004) * i / 60
        else:
            lr = 1e-5 + (0.1 - 1e-5) * (1 + math.cos(math.pi * (i - 60) / (steps - 61))) / 2
        lrs.append(LRPoint(step=i, lrs=[lr]))
    reports["one_cycle"] = with_loop(base, lr_history=lrs)
    # noisy binary task: drops to its noise floor and stays there
    noisy_task = plateau_curve(4)
    val = plateau_curve(5, n=20, floor=0.615, noise=0.01)
    reports["noisy_task_plateau"] = base.model_copy(
        update={
            "num_classes": 2,
            "loss_history": {"train": points(noisy_task), "val": points(val, every=10)},
            "data": healthy_data(
                train=healthy_split(class_counts={"0": 750, "1": 750}, label_runs_fraction=0.5),
                test=healthy_split(n=300, class_counts={"0": 150, "1": 150}, label_runs_fraction=0.5),
                expected_num_classes=2,
            ),
        }
    )
    # regression with an MSE head, normalised targets
    reports["regression"] = base.model_copy(
        update={
            "task": "regression",
            "num_classes": None,
            "loss_history": {"train": points(noisy_decreasing(6, start=1.0, end=0.05))},
            "loop": base.loop.model_copy(
                update={"loss_calls": [LossCall(loss_type="MSELoss", output_shape=[32, 1], target_shape=[32, 1], target_dtype="torch.float32", output_min=-2.0, output_max=2.0)]}
            ),
            "data": DataStats(train=healthy_split(label_kind="float_continuous", label_dtype="torch.float32", class_counts={}, imbalance_ratio=None, target_mean=0.0, target_std=1.0, label_runs_fraction=None)),
            "probes": healthy_probes(overfit_one_batch=OverfitResult(status="passed", task="regression", steps=100, initial_loss=1.0, final_loss=0.001)),
        }
    )
    # healthy clipping: clips only the occasional spike
    history = [GradNormPoint(step=i, before_clip=0.8 if i % 10 else 3.0, after_clip=0.8 if i % 10 else 1.0) for i in range(0, 200, 2)]
    reports["occasional_clipping"] = with_loop(base, grad_norm_history=history)
    # per-epoch step decay: lr 0.1 -> 0.01 -> 0.001
    reports["step_decay"] = with_loop(base, lr_history=[LRPoint(step=i, lrs=[0.1 if i < 100 else 0.01 if i < 150 else 0.001]) for i in range(0, 200, 5)])
    # Adam at a larger LR with bigger (still healthy) updates
    reports["sgd_momentum"] = base.model_copy(update={"parameters": mlp_params(ratio=2e-2)})
    # Adam at lr=1e-2 on small weights: every update is ~30% of the weight, and the loss falls
    reports["adam_large_ratio"] = base.model_copy(update={"parameters": mlp_params(ratio=0.3)})
    return reports

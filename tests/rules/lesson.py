"""Reports shaped like the lesson's three broken networks, built by hand."""

from __future__ import annotations

import math

from nndx.report import DiagnosticReport, GradNormPoint, LayerStats, LRRangeResult, ParameterStats

from .reports import act, grad, healthy_loop, healthy_mlp, healthy_probes, mlp_layers, points, with_loop


def lr_10() -> DiagnosticReport:
    """SGD at lr=10: the loss bounces, gradients blow up, the loss turns NaN at step 24."""
    values = [2.3, 9.8, 4.1, 31.0, 7.5, 120.0, 15.0, 430.0, 60.0, 2100.0, 900.0, 8800.0] + [
        1e4 * 3**i for i in range(12)
    ] + [math.nan] * 26
    base = healthy_mlp()
    layers = []
    for step in (0, 10, 20, 30):
        for layer in mlp_layers(steps=(step,), grads=(0.05 * 10 ** (step / 5), 0.08 * 10 ** (step / 5), 0.1 * 10 ** (step / 5))):
            if step == 30:
                layer = layer.model_copy(update={"gradient": grad(math.nan, abs_mean=math.nan, nonfinite=640)})
            layers.append(layer)
    params = [
        ParameterStats(name=n, shape=s, step=step, weight_norm=5.0 * (1 + step), grad_norm=10.0 * (1 + step), update_ratio=3.0)
        for step in (0, 10, 20)
        for n, s in (("0.weight", [64, 784]), ("2.weight", [64, 64]), ("4.weight", [10, 64]))
    ]
    loop = healthy_loop(
        steps=50,
        lr=10.0,
        grad_norm_history=[GradNormPoint(step=i, before_clip=2.0 * 1.6**i) for i in range(24)]
        + [GradNormPoint(step=i, before_clip=math.nan) for i in range(24, 50)],
    )
    return base.model_copy(
        update={
            "loss_history": {"train": points(values)},
            "layers": layers,
            "parameters": params,
            "loop": loop,
            "probes": healthy_probes(lr_range=LRRangeResult(status="passed", suggested_lr=0.05, min_over_10_lr=0.02, diverged_at_lr=0.8)),
        }
    )


def dead_relu_bias() -> DiagnosticReport:
    """Every hidden bias initialised to -5: all ReLU units dead, loss stuck at ln(10)."""
    base = healthy_mlp()
    layers = []
    for step in (0, 50, 100):
        layers += [
            LayerStats(name="0", type="Linear", step=step, activation=act(mean=-5.0, std=0.9, zero=0.0, dead=0.0), gradient=grad(0.0, abs_mean=0.0)),
            LayerStats(name="1", type="ReLU", step=step, activation=act(mean=0.0, std=0.0, zero=1.0, dead=1.0), gradient=grad(0.0, abs_mean=0.0)),
            LayerStats(name="2", type="Linear", step=step, activation=act(mean=-5.0, std=0.0, zero=0.0, dead=0.0), gradient=grad(0.0, abs_mean=0.0)),
            LayerStats(name="3", type="ReLU", step=step, activation=act(mean=0.0, std=0.0, zero=1.0, dead=1.0), gradient=grad(0.0, abs_mean=0.0)),
            LayerStats(name="4", type="Linear", step=step, activation=act(mean=0.0, std=0.01, zero=0.0, dead=0.0, units=10), gradient=grad(0.03)),
        ]
    params = [p.model_copy(update={"update_ratio": 0.0 if not p.name.startswith("4.") else 1e-3}) for p in base.parameters]
    values = [math.log(10) + 0.001 * math.sin(i) for i in range(100)]
    return base.model_copy(
        update={
            "loss_history": {"train": points(values, [0.1] * 100)},
            "layers": layers,
            "parameters": params,
            "probes": healthy_probes(
                overfit_one_batch=healthy_probes().overfit_one_batch.model_copy(update={"status": "failed", "final_loss": 2.30, "final_accuracy": 0.1})
            ),
        }
    )


def missing_zero_grad() -> DiagnosticReport:
    """optimizer.zero_grad() never called: gradients and updates grow, the loss oscillates."""
    base = healthy_mlp()
    values = [2.3, 2.0, 1.8, 2.4, 1.5, 3.1, 1.9, 4.2, 2.2, 5.5, 1.7, 6.0, 3.3, 7.1, 2.5, 6.6, 4.0, 8.2, 3.1, 7.4]
    loop = with_loop(
        base,
        steps=20,
        backward_calls=20,
        zero_grad_calls=0,
        grad_norm_history=[GradNormPoint(step=i, before_clip=1.0 * (i + 1) ** 1.2) for i in range(20)],
    ).loop
    params = [p.model_copy(update={"update_ratio": 0.3}) for p in base.parameters]
    return base.model_copy(update={"loss_history": {"train": points(values)}, "loop": loop, "parameters": params})

"""Reports and diagnoses built by hand for the prompts tests (imported by conftest.py
and tests/prompts/update_golden.py; the name is unique so it cannot clash with
another test directory's helpers).

Hand-made diagnoses keep these tests about rendering: what the rules conclude is the
rules tests' business. ``healthy`` is a small MLP that learns; ``broken`` diverges to
NaN with dead ReLUs, no zero_grad and a gradient check that crashed.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from nndx.report import (
    ActivationStats,
    CauseCode,
    DataStats,
    Diagnosis,
    DiagnosticReport,
    ErrorRecord,
    EvalModeResult,
    Finding,
    GradCheckParam,
    GradCheckResult,
    GradientStats,
    InterventionResult,
    Interventions,
    LayerInfo,
    LayerStats,
    LossCall,
    LossPoint,
    LRPoint,
    LRRangeResult,
    ModelSummary,
    LoopStats,
    OverfitResult,
    ParameterStats,
    Probes,
    RunInfo,
    SplitStats,
)


def _layers(step: int, dead: float, grad_scale: float, nonfinite: int = 0) -> list[LayerStats]:
    def act(mean: float, dead_fraction: float) -> ActivationStats:
        return ActivationStats(mean=mean, std=0.8, min=0.0, max=3.2, zero_fraction=0.51,
                               dead_unit_fraction=dead_fraction, nonfinite_count=nonfinite, unit_count=32)  # fmt: skip

    def grad(scale: float) -> GradientStats:
        return GradientStats(abs_mean=scale, max=scale * 20, norm=scale * 40, nonfinite_count=nonfinite)

    return [
        LayerStats(name="fc1", type="Linear", step=step, activation=act(0.01, 0.0), gradient=grad(grad_scale)),
        LayerStats(name="act1", type="ReLU", step=step, activation=act(0.4, dead), gradient=grad(grad_scale / 2)),
        LayerStats(name="fc2", type="Linear", step=step, activation=act(-0.02, 0.0), gradient=grad(grad_scale * 3)),
    ]


def _model() -> ModelSummary:
    return ModelSummary(
        param_count=2410, trainable_param_count=2410,
        layers=[LayerInfo(name="fc1", type="Linear", output_shape=[32, 32], param_count=2080, trainable_param_count=2080),
                LayerInfo(name="act1", type="ReLU", output_shape=[32, 32]),
                LayerInfo(name="fc2", type="Linear", output_shape=[32, 10], param_count=330, trainable_param_count=330)],
        activations=["ReLU"], last_layer="Linear",
    )  # fmt: skip


def _run(name: str) -> RunInfo:
    return RunInfo(name=name, project="nndx-tests", started_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
                   torch_version="2.13.0", device="cpu", dtype="float32", seed=0)  # fmt: skip


def _data(nan_count: int = 0) -> DataStats:
    split = SplitStats(n_samples=1437, input_shape=[64], input_dtype="float32", input_mean=0.0012, input_std=0.9987,
                       input_min=-2.5, input_max=7.9, input_nan_count=nan_count, label_dtype="int64",
                       label_kind="class_index", class_counts={str(c): 143 + c for c in range(10)},
                       imbalance_ratio=1.063)  # fmt: skip
    return DataStats(train=split, test=split.model_copy(update={"n_samples": 360}), expected_num_classes=10)


def make_healthy_report() -> DiagnosticReport:
    train = [LossPoint(step=s, value=2.31 * math.exp(-s / 60) + 0.05, accuracy=min(0.99, 0.1 + s / 200)) for s in range(0, 201, 20)]
    val = [LossPoint(step=s, value=2.32 * math.exp(-s / 70) + 0.09) for s in range(0, 201, 50)]
    return DiagnosticReport(
        run=_run("digits-mlp"),
        model=_model(),
        task="classification",
        num_classes=10,
        loss_history={"train": train, "val": val},
        layers=_layers(0, 0.0, 0.02) + _layers(200, 0.03125, 0.011),
        parameters=[ParameterStats(name="fc1.weight", shape=[32, 64], step=200, weight_norm=4.52, grad_norm=0.031, update_ratio=0.0011),
                    ParameterStats(name="fc2.weight", shape=[10, 32], step=200, weight_norm=2.1, grad_norm=0.08, update_ratio=0.0009)],
        probes=Probes(
            overfit_one_batch=OverfitResult(status="passed", task="classification", steps=200, lr=0.01,
                                            initial_loss=2.3104, final_loss=0.00412, final_accuracy=1.0,
                                            losses=[2.3104, 1.2, 0.3, 0.00412]),
            lr_range=LRRangeResult(status="passed", lrs=[1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0],
                                   losses=[2.3, 2.3, 2.1, 1.2, 0.9, 4.0], suggested_lr=0.003162, min_loss=0.9,
                                   min_over_10_lr=0.01, diverged_at_lr=1.0),
            grad_check=GradCheckResult(status="passed", eps=1e-6, max_relative_error=1.23e-9, forward_passes=8,
                                       parameters=[GradCheckParam(name="fc1.weight", relative_error=1.23e-9, status="ok"),
                                                   GradCheckParam(name="fc2.weight", relative_error=4.0e-10, status="ok")]),
            eval_mode=EvalModeResult(status="passed", training=False, max_abs_diff=0.0),
        ),
        loop=LoopStats(steps=200, backward_calls=200, zero_grad_calls=200, forward_calls=210, trainable_param_count=4,
                       lr_history=[LRPoint(step=0, lrs=[0.003]), LRPoint(step=200, lrs=[0.003])],
                       loss_calls=[LossCall(loss_type="CrossEntropyLoss", output_shape=[32, 10], target_shape=[32],
                                            output_dtype="float32", target_dtype="int64", output_min=-4.1,
                                            output_max=6.3, output_rows_sum_to_one=False, calls=200)]),
        data=_data(),
        interventions=Interventions(steps=100, baseline_initial_loss=2.3104, baseline_final_loss=0.1832,
                                    budget_seconds=30.0, seconds=0.41,
                                    message="the baseline learns on this batch: nothing for a remedy to explain"),
    )  # fmt: skip


def make_healthy_diagnosis() -> Diagnosis:
    return Diagnosis(
        rules_run=42,
        findings=[Finding(rule_id="NNDX-I001", code=CauseCode.NO_LR_SCHEDULE, severity="info",
                          title="Constant learning rate", symptom="the learning rate never changed",
                          evidence={"lr": 0.003, "steps": 200}, fix="consider a decay schedule")],
    )  # fmt: skip


def make_broken_report() -> DiagnosticReport:
    train = [LossPoint(step=s, value=2.30 + 0.001 * s) for s in range(0, 120, 20)]
    train += [LossPoint(step=120, value=math.inf), LossPoint(step=140, value=math.nan)]
    return DiagnosticReport(
        run=_run("diverging-run"),
        model=_model(),
        task="classification",
        num_classes=10,
        loss_history={"train": train},
        layers=_layers(140, 0.875, 3.0e4, nonfinite=17),
        probes=Probes(
            overfit_one_batch=OverfitResult(status="failed", steps=200, lr=1.0, initial_loss=2.3026,
                                            final_loss=math.nan, losses=[2.3026, 51.2, math.inf, math.nan]),
            grad_check=GradCheckResult(status="error", message="RuntimeError: one of the variables needed for "
                                       "gradient computation has been modified by an inplace operation"),
        ),
        loop=LoopStats(steps=140, backward_calls=140, zero_grad_calls=0, forward_calls=140,
                       lr_history=[LRPoint(step=0, lrs=[1.0])]),
        errors=[ErrorRecord(source="grad_check", type="RuntimeError",
                            message="one of the variables needed for gradient computation has been modified\n"
                                    "by an inplace operation: [torch.FloatTensor [32, 32]] is at version 2")],
        interventions=Interventions(
            steps=100, baseline_initial_loss=2.3026, baseline_final_loss=math.nan, budget_seconds=30.0, seconds=2.5,
            results=[
                InterventionResult(cause="LR_TOO_HIGH", remedy="the learning rate divided by 10", status="confirmed",
                                   steps=100, baseline_initial_loss=2.3026, baseline_final_loss=math.nan,
                                   remedied_initial_loss=2.3026, remedied_final_loss=0.0412,
                                   baseline_progress=-math.inf, remedied_progress=0.98, seconds=0.4),
                InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10",
                                   status="not_confirmed", steps=3, baseline_initial_loss=2.3026,
                                   baseline_final_loss=math.nan, remedied_initial_loss=2.3026,
                                   remedied_final_loss=math.inf, baseline_progress=-math.inf,
                                   remedied_progress=-math.inf, seconds=0.01),
                InterventionResult(cause="DEAD_RELU", remedy="the dead ReLU units re-initialised", status="skipped",
                                   message="the time budget of 30 s was spent"),
            ]),
    )  # fmt: skip


def make_broken_diagnosis() -> Diagnosis:
    return Diagnosis(
        rules_run=42,
        findings=[
            Finding(rule_id="NNDX-E010", code=CauseCode.LR_TOO_HIGH, severity="error",
                    title="Loss diverged to non-finite values", symptom="train loss became inf at step 120",
                    evidence={"first_nonfinite_step": 120, "lr": 1.0, "losses": [2.3, 2.32, math.inf, math.nan]},
                    fix="lower the learning rate 10x and clip gradients", next_probe="run the LR range test",
                    score=1.0, step=120, confirmation="confirmed"),
            Finding(rule_id="NNDX-E020", code=CauseCode.MISSING_ZERO_GRAD, severity="error",
                    title="Gradients accumulate across steps", symptom="zero_grad was never called",
                    evidence={"zero_grad_calls": 0, "steps": 140}, fix="call optimizer.zero_grad() every step",
                    score=0.95),
            Finding(rule_id="NNDX-W003", code=CauseCode.DEAD_RELU, severity="warning",
                    title="Dead ReLU units", symptom="87.5% of the units of act1 are zero for every sample",
                    evidence={"layer": "act1", "dead_unit_fraction": 0.875}, fix="lower the learning rate; use LeakyReLU",
                    score=0.875, explained_by="NNDX-E010"),
            Finding(rule_id="NNDX-W040", code=CauseCode.DDP_DESYNC, severity="warning",
                    title="Replicas drift apart", symptom="parameter checksums differ", evidence={"max_desync": 0.5},
                    fix="wrap the model in DistributedDataParallel and call it, not .module", score=0.5),
        ],
    )  # fmt: skip

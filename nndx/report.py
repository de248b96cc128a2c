"""The one schema every part of nndx shares: the DiagnosticReport and the Diagnosis.

A report is what the collector measured; a diagnosis is what the rules concluded.
Both cross every boundary (collector → rules, client → server, server → prompt) as
JSON, so this module imports nothing heavier than pydantic.

Non-finite floats: a NaN loss is the most important datum a report can carry, and
plain JSON has no NaN. nndx encodes NaN, +Inf and -Inf as the JSON *strings*
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` wherever a float is expected. The output
is strict JSON any language can read and write; the JSON Schema of every float field
says so. ``DiagnosticReport.model_validate_json(r.model_dump_json())`` round-trips
them exactly.

Every part of a report is optional so that a partial report (a monitor with no
probes, a data check alone, a JSON document from another language) is still
diagnosable.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

SCHEMA_VERSION = "1.0"

Float = Annotated[
    float,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number"},
                {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]},
            ],
            "description": "a number; NaN and infinities as the strings NaN, Infinity, -Infinity",
        }
    ),
]
Count = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class Schema(BaseModel):
    """Base of every report model: unknown fields are errors, non-finite floats are strings."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings", validate_assignment=False)


# --------------------------------------------------------------------------- run / model


class RunInfo(Schema):
    name: str | None = None
    project: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    torch_version: str | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int | None = None


class LayerInfo(Schema):
    name: str
    type: str
    output_shape: list[Count] | None = None
    param_count: Count = 0
    trainable_param_count: Count = 0


class ModelSummary(Schema):
    """Static facts about the model; ``layers`` are leaf modules in forward order when known."""

    param_count: Count = 0
    trainable_param_count: Count = 0
    layers: list[LayerInfo] = Field(default_factory=list)
    activations: list[str] = Field(default_factory=list, description="activation module types, in order")
    last_layer: str | None = Field(None, description="type of the module that produces the output")
    output_activation: str | None = Field(
        None, description="activation applied last, if the model ends in one (e.g. Softmax)"
    )
    normalization_layers: list[str] = Field(default_factory=list)
    has_dropout: bool = False
    has_batchnorm: bool = False


# --------------------------------------------------------------------------- loss history


class LossPoint(Schema):
    step: Count
    value: Float
    accuracy: Float | None = None


# --------------------------------------------------------------------------- layer statistics


class ActivationStats(Schema):
    """Statistics of one module's output over one batch.

    ``dead_unit_fraction`` counts units (features of a Linear output, channels of a conv
    output) that are exactly zero for every sample of the batch; ``zero_fraction`` counts
    zero elements, which is ~50% on every healthy ReLU layer and no evidence of anything.
    """

    mean: Float
    std: Float
    min: Float
    max: Float
    zero_fraction: Fraction
    dead_unit_fraction: Fraction
    saturated_fraction: Fraction | None = Field(
        None, description="share of outputs within 1e-3 of a sigmoid/tanh bound; None for others"
    )
    nonfinite_count: Count = 0
    unit_count: Count = 0


class GradientStats(Schema):
    """Statistics of the gradient flowing out of a module (w.r.t. its output)."""

    abs_mean: Float
    max: Float = Field(description="largest absolute value")
    norm: Float
    nonfinite_count: Count = 0


class LayerStats(Schema):
    name: str
    type: str
    step: Count | None = None
    activation: ActivationStats | None = None
    gradient: GradientStats | None = None


class ParameterStats(Schema):
    name: str
    shape: list[Count] = Field(default_factory=list)
    step: Count | None = None
    requires_grad: bool = True
    weight_norm: Float
    grad_norm: Float | None = None
    update_ratio: Float | None = Field(None, description="‖Δw‖ / ‖w‖ over one optimizer step")


# --------------------------------------------------------------------------- probes

ProbeStatus = Literal["passed", "failed", "error", "skipped"]


class ProbeResult(Schema):
    """Common head of every probe result. A probe that did not run says ``skipped`` or
    ``error`` with a message; it never reports ``passed``."""

    status: ProbeStatus
    message: str | None = None


class OverfitResult(ProbeResult):
    task: Literal["classification", "regression"] | None = None
    steps: Count = 0
    lr: Float | None = None
    initial_loss: Float | None = None
    final_loss: Float | None = None
    final_accuracy: Float | None = None
    losses: list[Float] = Field(default_factory=list)


class LRRangeResult(ProbeResult):
    lrs: list[Float] = Field(default_factory=list)
    losses: list[Float] = Field(default_factory=list)
    smoothed: list[Float] = Field(default_factory=list)
    suggested_lr: Float | None = Field(None, description="steepest descent of the smoothed curve")
    valley_lr: Float | None = None
    min_over_10_lr: Float | None = Field(None, description="lr at the minimum loss, divided by 10")
    min_loss: Float | None = None
    diverged_at_lr: Float | None = None


class GradCheckParam(Schema):
    name: str
    relative_error: Float
    status: Literal["ok", "suspect", "bug"]
    worst_index: list[Count] | None = Field(None, description="element with the largest error (element-wise mode)")


class GradCheckResult(ProbeResult):
    mode: Literal["directional", "elementwise"] = "directional"
    eps: Float | None = None
    max_relative_error: Float | None = None
    forward_passes: Count = 0
    parameters: list[GradCheckParam] = Field(default_factory=list)


class NanOriginResult(ProbeResult):
    input_nonfinite_count: Count = 0
    loss_finite: bool | None = None
    forward_module: str | None = Field(None, description="first module, in forward order, with a non-finite output")
    forward_module_type: str | None = None
    backward_module: str | None = Field(None, description="first module in backward order whose gradient is non-finite")
    backward_module_type: str | None = None


class EvalModeResult(ProbeResult):
    training: bool | None = Field(None, description="model.training when the probe ran")
    has_dropout: bool = False
    has_batchnorm: bool = False
    max_abs_diff: Float | None = Field(None, description="between two forwards of the same batch")
    batch_dependence_diff: Float | None = Field(
        None, description="change of the first half's outputs when run without the rest of the batch (batch-norm)"
    )
    eval_abs_diff: Float | None = Field(
        None, description="between two forwards in eval mode: non-zero means randomness that ignores eval()"
    )


class LabelAlignmentResult(ProbeResult):
    real_accuracy: Float | None = None
    permuted_accuracy: Float | None = None
    chance_accuracy: Float | None = None
    steps: Count = 0


class Probes(Schema):
    overfit_one_batch: OverfitResult | None = None
    lr_range: LRRangeResult | None = None
    grad_check: GradCheckResult | None = None
    nan_origin: NanOriginResult | None = None
    eval_mode: EvalModeResult | None = None
    label_alignment: LabelAlignmentResult | None = None


# --------------------------------------------------------------------------- interventions

InterventionStatus = Literal["confirmed", "not_confirmed", "inconclusive", "skipped", "error"]


class InterventionResult(Schema):
    """One candidate cause tested by applying its remedy to a copy of the model (from its
    initial state) and rerunning a short training probe beside an untouched twin.

    ``confirmed``: with the remedy the loss fell clearly further than without it;
    ``not_confirmed``: the remedy changed nothing (or made it worse); ``inconclusive``:
    it helped, but not clearly enough to decide; ``skipped``/``error``: the remedy could
    not be tried (the message says why). Only the first two are evidence."""

    cause: str = Field(description="the CauseCode value the remedy tests")
    remedy: str = Field(description="what was changed, e.g. 'learning rate 10 -> 1'")
    status: InterventionStatus
    message: str | None = None
    steps: Count = 0
    baseline_initial_loss: Float | None = None
    baseline_final_loss: Float | None = None
    remedied_initial_loss: Float | None = None
    remedied_final_loss: Float | None = None
    baseline_progress: Float | None = Field(
        None, description="1 - final/initial loss of the untouched twin (initial: or the chance-level loss if lower); "
        "-Infinity when it diverged"
    )
    remedied_progress: Float | None = Field(None, description="the same with the remedy")
    seconds: Float | None = None


class Interventions(Schema):
    """Diagnosis by intervention: the user's setup run briefly as it is (the baseline), and
    what each remedy changed, within a time budget. No remedy is tried when the baseline
    learns: then there is nothing on this batch for a remedy to explain (``message``)."""

    steps: Count = 0
    baseline_initial_loss: Float | None = None
    baseline_final_loss: Float | None = None
    message: str | None = None
    budget_seconds: Float | None = None
    seconds: Float = 0.0
    results: list[InterventionResult] = Field(default_factory=list)


# --------------------------------------------------------------------------- the user's loop


class LRPoint(Schema):
    step: Count
    lrs: list[Float] = Field(description="learning rate of each param group")


class GradNormPoint(Schema):
    step: Count
    before_clip: Float
    after_clip: Float | None = Field(None, description="set when the user clipped this step")


class ScalarPoint(Schema):
    step: Count
    value: Float


class GraphPoint(Schema):
    """The autograd graph behind the model's outputs at one recorded step."""

    step: Count
    nodes: Count = Field(description="autograd nodes reachable from the outputs (a bounded walk: at most the cap)")
    earlier_nodes: Count = Field(
        0, description="of those, nodes created at an earlier recorded step: a graph kept alive across steps"
    )
    truncated: bool = Field(False, description="the walk stopped at its cap; nodes is a lower bound")


class LossCall(Schema):
    """What reached the loss function, seen when the Monitor wraps ``loss_fn``."""

    loss_type: str
    output_shape: list[Count]
    target_shape: list[Count] | None = None
    output_dtype: str | None = None
    target_dtype: str | None = None
    output_min: Float | None = None
    output_max: Float | None = None
    output_rows_sum_to_one: bool | None = Field(None, description="outputs look like probabilities already")
    output_zero_fraction: Fraction | None = Field(
        None, description="share of output elements exactly 0 (a ReLU on the logits clips about half of them)"
    )
    target_mean: Float | None = Field(None, description="mean of floating-point targets")
    target_std: Float | None = Field(None, description="standard deviation of floating-point targets")
    calls: Count = 1


class LiveFinding(Schema):
    """A finding raised while training ran (Monitor live alerts): when it first fired."""

    rule_id: str
    code: str = Field(description="a CauseCode value")
    severity: Literal["info", "warning", "error"]
    title: str
    step: Count = Field(description="training step at which the finding first fired (time to detection)")


class LoopStats(Schema):
    steps: Count = Field(0, description="optimizer.step() calls")
    backward_calls: Count = 0
    zero_grad_calls: Count = 0
    forward_calls: Count = 0
    trainable_param_count: Count = 0
    params_not_in_optimizer: list[str] = Field(default_factory=list)
    optimizer_params_not_in_model: Count = 0
    params_grad_none: list[str] = Field(default_factory=list, description="trainable, but .grad stayed None")
    frozen_params: list[str] = Field(default_factory=list, description="requires_grad=False")
    no_grad_forwards_in_train_mode: Count = 0
    has_dropout: bool = False
    has_batchnorm: bool = False
    lr_history: list[LRPoint] = Field(default_factory=list)
    grad_norm_history: list[GradNormPoint] = Field(default_factory=list)
    input_norm_history: list[ScalarPoint] = Field(default_factory=list)
    loss_calls: list[LossCall] = Field(default_factory=list)
    world_size: Count = 1
    desync_steps: list[Count] = Field(default_factory=list, description="steps where rank parameter checksums differed")
    max_desync: Float | None = None
    live_findings: list[LiveFinding] = Field(
        default_factory=list, description="findings the Monitor's live rule evaluation raised, in firing order"
    )
    optimizers: list[str] | None = Field(
        None, description="class names of the optimizers the Monitor watched; [] when the loop updated the "
        "parameters by hand (steps are then the updates detected from parameter changes, and the learning rate "
        "is unknown: lr_history stays empty); None when no Monitor watched the loop"
    )
    input_dtype: str | None = Field(
        None, description="dtype of the model's first tensor input; an integer dtype means token ids, which get "
        "no input norm"
    )
    graph_nodes_history: list[GraphPoint] = Field(
        default_factory=list, description="size of the autograd graph behind the model's outputs, per recorded step"
    )
    params_never_changed: list[str] | None = Field(
        None, description="trainable parameters whose values when the report was made equal those when the "
        "Monitor attached (None: not checked)"
    )
    limitations: list[str] = Field(
        default_factory=list, description="what the Monitor could not attach to or measure, in words"
    )
    backward_calls_in_step: Count = Field(
        0, description="of backward_calls, those run inside optimizer.step() (a closure, as L-BFGS evaluates "
        "the loss several times per step): not gradient accumulation"
    )


# --------------------------------------------------------------------------- data


class SplitStats(Schema):
    """Statistics of one split (inputs and labels)."""

    n_samples: Count = 0
    sampled: bool = Field(False, description="statistics from a bounded sample of a Dataset")
    input_shape: list[Count] = Field(default_factory=list, description="shape of one sample")
    input_dtype: str | None = None
    input_mean: Float | None = None
    input_std: Float | None = None
    input_min: Float | None = None
    input_max: Float | None = None
    feature_means: list[Float] = Field(default_factory=list, description="per feature, or per channel for images")
    feature_stds: list[Float] = Field(default_factory=list)
    feature_scale_ratio: Float | None = Field(None, description="largest / smallest non-zero feature std")
    constant_features: list[Count] = Field(default_factory=list)
    raw_range: str | None = Field(None, description="e.g. '0-255' when inputs look like raw pixels")
    input_nan_count: Count = 0
    input_inf_count: Count = 0
    label_nan_count: Count = 0
    label_inf_count: Count = 0
    label_dtype: str | None = None
    label_kind: Literal["class_index", "one_hot", "float_continuous", "float_integral", "other"] | None = None
    target_mean: Float | None = None
    target_std: Float | None = None
    class_counts: dict[str, Count] = Field(default_factory=dict)
    imbalance_ratio: Float | None = None
    duplicate_count: Count = Field(0, description="rows that repeat an earlier row exactly")
    duplicate_fraction: Fraction = 0.0
    zero_sample_fraction: Fraction = Field(0.0, description="samples whose inputs are all zero")
    label_runs_fraction: Fraction | None = Field(
        None, description="share of consecutive samples with the same label (order check)"
    )
    checked_samples: Count | None = Field(
        None, description="samples the statistics were computed on (< n_samples when sampled)"
    )
    missing_classes: list[str] = Field(
        default_factory=list,
        description="classes expected (num_classes, a gap in the label range, or seen in the other split) "
        "with no sample in this split",
    )


class DataStats(Schema):
    train: SplitStats | None = None
    test: SplitStats | None = None
    train_test_overlap: Count = 0
    train_test_overlap_fraction: Fraction = Field(0.0, description="share of test rows found in train")
    expected_num_classes: Count | None = None


# --------------------------------------------------------------------------- errors


MAX_ERROR_MESSAGE = 2000


class ErrorRecord(Schema):
    """An exception a probe caught: a crash is evidence."""

    source: str = Field(description="probe or component that raised, e.g. 'overfit_one_batch'")
    type: str
    message: str

    @classmethod
    def of(cls, source: str, exc: BaseException) -> ErrorRecord:
        """The record of ``exc`` caught in ``source`` (the message cut to MAX_ERROR_MESSAGE)."""
        return cls(source=source, type=type(exc).__name__, message=str(exc)[:MAX_ERROR_MESSAGE])


# --------------------------------------------------------------------------- the report


class DiagnosticReport(Schema):
    schema_version: Literal["1.0"] = SCHEMA_VERSION
    run: RunInfo | None = None
    model: ModelSummary | None = None
    task: Literal["classification", "regression"] | None = None
    num_classes: Count | None = None
    loss_history: dict[str, list[LossPoint]] = Field(
        default_factory=dict, description="per split ('train', 'val', ...): loss by step"
    )
    layers: list[LayerStats] = Field(default_factory=list, description="per layer, per recorded step")
    parameters: list[ParameterStats] = Field(default_factory=list, description="per parameter, per recorded step")
    probes: Probes | None = None
    interventions: Interventions | None = None
    loop: LoopStats | None = None
    data: DataStats | None = None
    errors: list[ErrorRecord] = Field(default_factory=list)


# --------------------------------------------------------------------------- diagnosis


class CauseCode(str, enum.Enum):
    """Stable cause vocabulary (DESIGN.md). Add members; never rename one."""

    LR_TOO_HIGH = "LR_TOO_HIGH"
    LR_TOO_LOW = "LR_TOO_LOW"
    NO_LR_SCHEDULE = "NO_LR_SCHEDULE"
    LR_SCHEDULE_MISUSE = "LR_SCHEDULE_MISUSE"
    GRAD_CLIP_TOO_SMALL = "GRAD_CLIP_TOO_SMALL"
    GRAD_ACCUM_SCALING = "GRAD_ACCUM_SCALING"
    DEAD_RELU = "DEAD_RELU"
    VANISHING_GRADIENTS = "VANISHING_GRADIENTS"
    EXPLODING_GRADIENTS = "EXPLODING_GRADIENTS"
    SATURATED_ACTIVATIONS = "SATURATED_ACTIVATIONS"
    BAD_INIT = "BAD_INIT"
    MISSING_ACTIVATION = "MISSING_ACTIVATION"
    WRONG_OUTPUT_ACTIVATION = "WRONG_OUTPUT_ACTIVATION"
    WRONG_LOSS = "WRONG_LOSS"
    DOUBLE_SOFTMAX = "DOUBLE_SOFTMAX"
    MISSING_ZERO_GRAD = "MISSING_ZERO_GRAD"
    OPTIMIZER_NOT_CONNECTED = "OPTIMIZER_NOT_CONNECTED"
    DETACHED_GRAPH = "DETACHED_GRAPH"
    FROZEN_PARAMETERS = "FROZEN_PARAMETERS"
    EVAL_MODE_FORGOTTEN = "EVAL_MODE_FORGOTTEN"
    UNNORMALIZED_INPUTS = "UNNORMALIZED_INPUTS"
    UNNORMALIZED_TARGETS = "UNNORMALIZED_TARGETS"
    LABELS_MISALIGNED = "LABELS_MISALIGNED"
    LABEL_NOISE = "LABEL_NOISE"
    LABEL_DTYPE = "LABEL_DTYPE"
    SHAPE_BROADCAST = "SHAPE_BROADCAST"
    WRONG_RESHAPE = "WRONG_RESHAPE"
    UNSHUFFLED_DATA = "UNSHUFFLED_DATA"
    SILENT_DATA_LOSS = "SILENT_DATA_LOSS"
    LOG_OF_ZERO = "LOG_OF_ZERO"
    DIVISION_BY_ZERO = "DIVISION_BY_ZERO"
    NUMERICAL_OVERFLOW = "NUMERICAL_OVERFLOW"
    NAN_IN_DATA = "NAN_IN_DATA"
    OVERFITTING = "OVERFITTING"
    UNDERFITTING = "UNDERFITTING"
    DATA_LEAKAGE = "DATA_LEAKAGE"
    DUPLICATE_SAMPLES = "DUPLICATE_SAMPLES"
    CLASS_IMBALANCE = "CLASS_IMBALANCE"
    BATCH_TOO_SMALL = "BATCH_TOO_SMALL"
    BROKEN_BACKWARD = "BROKEN_BACKWARD"
    INPLACE_AUTOGRAD = "INPLACE_AUTOGRAD"
    DEVICE_MISMATCH = "DEVICE_MISMATCH"
    GRAPH_RETAINED = "GRAPH_RETAINED"
    DDP_DESYNC = "DDP_DESYNC"
    NOTHING_MEASURED = "NOTHING_MEASURED"


Severity = Literal["info", "warning", "error"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "error": 2}

EvidenceValue = Float | int | str | bool | None | list[Float] | list[str]


class Finding(Schema):
    rule_id: str
    code: CauseCode
    severity: Severity
    title: str
    symptom: str
    evidence: dict[str, EvidenceValue] = Field(default_factory=dict, description="numbers from the report")
    fix: str
    next_probe: str | None = Field(None, description="what to run when the evidence is thin")
    score: Float = Field(0.0, description="strength of the evidence, for ranking within a severity")
    confirmation: Literal["confirmed", "not_confirmed"] | None = Field(
        None, description="what applying this cause's remedy to a copy showed (report.interventions)"
    )
    explained_by: str | None = Field(None, description="rule_id of the root-cause finding that explains this symptom")
    explains: list[str] = Field(
        default_factory=list, description="rule_ids of the symptoms folded under this root finding"
    )
    step: Count | None = Field(None, description="training step at which the finding first fired")


class Diagnosis(Schema):
    schema_version: Literal["1.0"] = SCHEMA_VERSION
    findings: list[Finding] = Field(default_factory=list, description="ranked: severity, then score")
    rules_run: Count = 0

    @property
    def healthy(self) -> bool:
        """True when no finding is of severity warning or above."""
        return all(SEVERITY_ORDER[f.severity] < SEVERITY_ORDER["warning"] for f in self.findings)

    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def roots(self) -> list[Finding]:
        """The root findings, in rank order (each symptom is folded under one of them)."""
        return [f for f in self.findings if f.explained_by is None]

    def symptoms_of(self, root: Finding) -> list[Finding]:
        """The findings folded under ``root``, in rank order."""
        return [f for f in self.findings if f.explained_by == root.rule_id]

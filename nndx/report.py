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
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

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
    notes: list[str] = Field(
        default_factory=list, description="how the probes ran: on what batch, from which state, under autocast"
    )


class LayerInfo(Schema):
    name: str
    type: str
    output_shape: list[Count] | None = None
    param_count: Count = 0
    trainable_param_count: Count = 0
    input_from: str | None = Field(
        None, description="the layer whose output was this layer's input in an observed forward (through "
        "reshapes, dropout and normalisation only); None when not observed or made by anything else")
    readers: Count | None = Field(
        None, description="how many layers and functional ops read this layer's output (through reshapes, dropout "
        "and normalisation) in an observed forward: 2 or more is a stream several paths branch from, such as a "
        "ResNet stem that a block's shortcut projection and its residual branch both read")
    padding_idx: int | None = Field(
        None, description="an embedding's padding index: the id that stands for no token (its row gets no gradient)")
    residual_end: bool | None = Field(
        None, description="this layer's output was added to another tensor of its shape in an observed forward: "
        "the end of a residual branch, which may start at zero on purpose (zero_init_residual, ReZero, LoRA)")


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
    forward_observed: bool = Field(
        False, description="layers are in the order a forward ran them, functional activations included, "
        "with input_from set; otherwise in registration order")
    unused_modules: list[str] = Field(
        default_factory=list, description="modules whose trainable parameters got no gradient in the probe's "
        "backward and cannot move the loss: they never ran, or their output, perturbed, left the loss unchanged "
        "(computed and discarded, e.g. a classifier under a feature hook); a .detach() whose value reaches the "
        "loss is not one. Also parameters (by name) that no torch call of the forward read")
    moved_axes: list[str] = Field(
        default_factory=list, description="views/reshapes in the model's own code (or of its outputs in a loss of "
        "the user's own, prefixed 'loss:') that put an input axis's "
        "length where that axis cannot come from (elements interleaved), e.g. 'attn.forward: view [32, 16, 96] "
        "-> [32, 4, 16, 24]'; at most 8")


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
    values_per_unit: Count = Field(
        0, description="outputs each unit gave over the batch (samples x positions): a unit is dead when all "
        "of them are zero, which on one or two values says nothing; 0 when not recorded"
    )


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
    descent: Float | None = Field(
        None, description="loops without an optimizer: the cosine of the update with minus the gradient it was "
        "made from (1 under plain SGD; below 0: the step climbed the loss)")


# --------------------------------------------------------------------------- probes

ProbeStatus = Literal["passed", "failed", "error", "skipped"]
NumberFormat = Callable[[Any], str]


class ChecklistItem(NamedTuple):
    """The pre-training checklist item a probe settles: ``key`` (stable), the item's
    ``title``, ``how`` to check it, and the cause ``codes`` (CauseCode values) a finding
    of which fails it. ``nndx.prompts.checklist`` marks it from the probe's result."""

    key: str
    title: str
    how: str
    codes: tuple[str, ...] = ()


class ProbeResult(Schema):
    """Common head of every probe result. A probe that did not run says ``skipped`` or
    ``error`` with a message; it never reports ``passed``.

    Each subclass also says, torch-free, what the views need: its display ``title``,
    what to ``ask`` for in the generic prompt, its ``checklist`` item, and
    :meth:`summary`, the numbers behind its status in one line. A probe is a field of
    :class:`Probes`; the prompt, the checklist and the error rules iterate those fields,
    so a new probe needs no edit there."""

    title: ClassVar[str] = "probe"
    ask: ClassVar[str] = ""
    checklist: ClassVar[ChecklistItem | None] = None

    status: ProbeStatus
    message: str | None = None

    def summary(self, num: NumberFormat = str) -> str:
        """The numbers behind the status in one line; ``num`` formats each number."""
        return ""


# a value that repeats the last one to within this share of it has stopped moving
FLAT_TOLERANCE = 1e-6


def flat_since(values: list[float]) -> int:
    """The index from which ``values`` repeat their last one to the end (``len - 1`` when the last
    step moved; 0 when they never moved). A probe's copy whose units died repeats its loss (the
    overfit probe retries at a lower LR; the rules discount it); a schedule that ran out holds its
    floor LR (NNDX307)."""
    last, start = values[-1], len(values) - 1
    while start > 0 and abs(values[start - 1] - last) <= FLAT_TOLERANCE * abs(last):
        start -= 1
    return start


class LossTerm(Schema):
    """One additive term of a loss, as it reduces the batch (read off the loss's autograd graph)."""

    op: str = Field(description="the reduction: a torch loss (BinaryCrossEntropy, NllLoss, ...), 'sum' or 'mean'")
    reduction: Literal["mean", "sum"] = Field(
        description="how the term scales with the batch: 'mean' stays, 'sum' grows with the number of samples")
    values: Count = Field(0, description="how many values the reduction took in (0: unknown)")
    scale: Float = Field(1.0, description="the constant the term is multiplied by in the loss")


class OverfitResult(ProbeResult):
    title: ClassVar[str] = "overfit one batch"
    ask: ClassVar[str] = "loss before → after, steps"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "overfit", "Overfit one batch: the loss on a single batch goes to ~0",
        "overfit-one-batch probe: ~200 steps on one small batch")  # fmt: skip

    task: Literal["classification", "regression"] | None = None
    steps: Count = 0
    lr: Float | None = None
    initial_loss: Float | None = None
    final_loss: Float | None = None
    # the loss perfect predictions would get (the targets' entropy for soft targets); None when unknown
    loss_floor: Float | None = None
    final_accuracy: Float | None = None
    losses: list[Float] = Field(default_factory=list)
    loss_through_other_parameters: bool | None = Field(
        None, description="the loss reached trainable parameters outside the model, which the probe does not "
        "train (a generator's loss through its discriminator): one batch fitted against a fixed opponent")
    loss_terms: list[LossTerm] = Field(
        default_factory=list, description="the terms of the first loss that carry the batch, each a mean or a sum "
        "over it (empty when the graph could not be read)")

    def summary(self, num: NumberFormat = str) -> str:
        text = f"loss {num(self.initial_loss)} → {num(self.final_loss)} in {self.steps} steps"
        if self.lr is not None:
            text += f", lr {num(self.lr)}"
        if self.final_accuracy is not None:
            text += f", accuracy {num(self.final_accuracy)}"
        return text


class LRRangeResult(ProbeResult):
    title: ClassVar[str] = "LR range test"
    ask: ClassVar[str] = "suggested lr"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "lr_range", "Learning rate chosen with an LR range test",
        "LR range test (nndx.lr_find): sweep the lr exponentially, train at its suggestion or inside its interval",
        ("LR_TOO_HIGH", "LR_TOO_LOW", "NO_LR_SCHEDULE", "LR_SCHEDULE_MISUSE", "GRAD_CLIP_TOO_SMALL"))  # fmt: skip

    lrs: list[Float] = Field(default_factory=list)
    losses: list[Float] = Field(default_factory=list)
    smoothed: list[Float] = Field(default_factory=list)
    suggested_lr: Float | None = Field(None, description="the lr to train with (nndx.collector.probes.lr_range.suggest)")
    interval_low_lr: Float | None = Field(None, description="lowest lr of the interval that trains well")
    interval_high_lr: Float | None = Field(None, description="highest lr of the interval that trains well")
    valley_lr: Float | None = Field(None, description="fastai's valley reading; not a suggestion")
    min_over_10_lr: Float | None = Field(None, description="lr at the minimum loss, divided by 10; not a suggestion")
    min_loss: Float | None = None
    diverged_at_lr: Float | None = None

    def summary(self, num: NumberFormat = str) -> str:
        """The suggestion with its interval; the valley and min/10 readings are left out:
        they are not suggestions (bench/lr_suggestion.py shows them training slowly)."""
        interval = (f"{num(self.interval_low_lr)} to {num(self.interval_high_lr)}"
                    if self.interval_low_lr is not None and self.interval_high_lr is not None else None)  # fmt: skip
        known = [(label, value) for label, value in (
            ("suggested lr", self.suggested_lr and num(self.suggested_lr)), ("trains well from", interval),
            ("min loss", self.min_loss is not None and num(self.min_loss)),
            ("diverged at lr", self.diverged_at_lr is not None and num(self.diverged_at_lr))) if value]  # fmt: skip
        return ", ".join([f"{label} {value}" for label, value in known] + [f"{len(self.lrs)} lrs tried"])


class GradCheckParam(Schema):
    name: str
    relative_error: Float
    status: Literal["ok", "suspect", "bug"]
    worst_index: list[Count] | None = Field(None, description="element with the largest error (element-wise mode)")
    autograd_zero: bool = Field(False, description="autograd gave this tensor no gradient at all (None or all "
                                "zeros): where finite differences see a slope, the graph is cut before it")
    loss_flat: bool = Field(False, description="finite differences saw no slope at all while autograd gave a "
                            "gradient: the forward reads this tensor through a sign, round or step, and the backward's "
                            "gradient is a surrogate (a straight-through estimator), not a wrong derivative")


class GradCheckResult(ProbeResult):
    title: ClassVar[str] = "gradient check"
    ask: ClassVar[str] = "max relative error"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "grad_check", "Gradients agree with finite differences (custom layers and losses)",
        "gradient-check probe (directional finite differences in float64)",
        ("BROKEN_BACKWARD", "INPLACE_AUTOGRAD"))  # fmt: skip

    mode: Literal["directional", "elementwise"] = "directional"
    eps: Float | None = None
    max_relative_error: Float | None = None
    forward_passes: Count = 0
    parameters: list[GradCheckParam] = Field(default_factory=list)
    stop_gradients: Count | None = Field(
        None, description="detach() calls in the forward and loss; set on a pass that needed them letting gradients "
        "through (the backward agrees then: the stop-gradients were the difference)")
    chained_stop_gradients: Count | None = Field(
        None, description="of those, the detach() calls whose input the forward computed from an earlier detach's "
        "output with no other path for the gradient: a state detached and computed on (a recurrence or a tree cut "
        "at every step); a target branch or a straight-through estimator has none")
    loss_projected: bool = Field(
        False, description="the loss's own gradient is not the derivative of its value (a stop-gradient in it), so "
        "the check differentiated a fixed random projection of the model's outputs instead")

    def summary(self, num: NumberFormat = str) -> str:
        bad = [p for p in self.parameters if p.status != "ok"]
        worst = ", ".join(f"{p.name}: {num(p.relative_error)} ({p.status})" for p in bad[:3])
        if len(bad) > 3:
            worst += f" … ({len(bad)} in all)"
        text = f"{self.mode}, max relative error {num(self.max_relative_error)}"
        if self.parameters:
            text += f" over {len(self.parameters)} tensors"
        text += f", eps {num(self.eps)}, {self.forward_passes} forwards"
        return text + (f"; not ok: {worst}" if worst else "")


class NanOriginResult(ProbeResult):
    title: ClassVar[str] = "NaN origin"
    ask: ClassVar[str] = "first module"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "nonfinite", "No NaN/Inf in loss, activations or gradients",
        "NaN-origin probe: first module whose output or gradient is non-finite",
        ("LOG_OF_ZERO", "DIVISION_BY_ZERO", "NUMERICAL_OVERFLOW"))  # fmt: skip

    input_nonfinite_count: Count = 0
    input_minus_inf_count: Count = Field(0, description="of the inputs' non-finite values, those that are -inf (what "
                                         "log(0) gives; 0/0 gives NaN)")
    loss_finite: bool | None = None
    forward_module: str | None = Field(None, description="first module, in forward order, with a non-finite output")
    forward_module_type: str | None = None
    forward_op: str | None = Field(
        None, description="the functional op (log, exp, div...) in forward_module's code that made the first NaN/Inf"
    )
    backward_module: str | None = Field(None, description="first module in backward order whose gradient is non-finite")
    backward_module_type: str | None = None

    def summary(self, num: NumberFormat = str) -> str:
        forward_type = f" ({self.forward_module_type})" if self.forward_module_type else ""
        if self.forward_op:
            forward_type += f" in {self.forward_op}()"
        backward_type = f" ({self.backward_module_type})" if self.backward_module_type else ""
        return (f"non-finite inputs {self.input_nonfinite_count}, loss finite {num(self.loss_finite)}, "
                f"first non-finite forward: {self.forward_module or 'none'}{forward_type}, "
                f"first non-finite backward: {self.backward_module or 'none'}{backward_type}")  # fmt: skip


class EvalModeResult(ProbeResult):
    title: ClassVar[str] = "eval-mode consistency"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "eval_mode", "model.eval() for evaluation, model.train() back for training",
        "eval-mode probe: two forwards of the same batch in eval mode must agree",
        ("EVAL_MODE_FORGOTTEN",))  # fmt: skip

    training: bool | None = Field(None, description="model.training when the probe ran")
    has_dropout: bool = Field(False, description="a dropout module, or a functional dropout (F.dropout2d) the "
                              "forward was seen calling")
    has_batchnorm: bool = False
    max_abs_diff: Float | None = Field(None, description="between two forwards of the same batch")
    batch_dependence_diff: Float | None = Field(
        None, description="change of the first half's outputs when run without the rest of the batch (batch-norm)"
    )
    eval_abs_diff: Float | None = Field(
        None, description="between two forwards in eval mode under different seeds (dropout or sampling)"
    )
    ignores_eval: bool | None = Field(None, description="a dropout stayed active after model.eval()")
    batch_statistics: bool | None = Field(
        None, description="the forward normalised with the batch's statistics in the mode probed (a batch-norm in "
        "train mode or without running statistics, or F.batch_norm(training=True)); a batch dependence without them "
        "is samples mixed by the forward itself")
    tolerance: Float | None = Field(None, description="the rounding difference allowed (dtype eps, magnitudes, reductions)")

    def summary(self, num: NumberFormat = str) -> str:
        return (f"model.training {num(self.training)}, dropout {num(self.has_dropout)}, "
                f"batchnorm {num(self.has_batchnorm)}, max diff between two forwards {num(self.max_abs_diff)}")


class SampleIndependenceResult(ProbeResult):
    title: ClassVar[str] = "sample independence"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "independence", "Each sample's output depends on that sample only (in eval mode)",
        "sample-independence probe: replace half of the batch, the other samples' outputs must not move",
        ("WRONG_RESHAPE",))  # fmt: skip

    batch_axis: Count | None = Field(None, description="the inputs' axis whose entries are samples")
    samples: Count = 0
    replaced_samples: Count = Field(1, description="samples at the start of the batch replaced by others")
    changed_samples: Count = Field(0, description="samples not replaced whose outputs moved beyond the tolerance")
    max_change: Float | None = Field(None, description="largest change of such a sample's output")
    tolerance: Float | None = None
    reordered: bool | None = Field(None, description="the samples moved because the model returns them in an "
                                   "order of its own (the reversed batch gave the same outputs, not reversed)")
    batch_reduction: str | None = Field(
        None, description="the samples moved through a reduction over every axis of a batched tensor (no dim=), "
        "broadcast back onto every sample: the reversed batch gave the same outputs reversed, and the forward "
        "computed this reduction")
    no_context: str | None = Field(
        None, description="the recurrent layer (its module name) of a model with targets per position whose outputs "
        "each read their own position alone, along every axis the inputs share with the targets: it runs over "
        "another axis (batch_first=False fed one (1, time, features) sequence)")
    position_dependent: bool | None = Field(
        None, description="each sample's output depends on its position in the batch: replacing half of the samples "
        "moved no other, yet the reversed batch gave outputs that are no reordering of the batch's (a table indexed "
        "along the batch axis, such as a time-major positional encoding added to batch-first inputs)")
    stitched: dict[str, Float] | None = Field(
        None, description="the inputs' sequences are stitched from pieces of several samples: as given, neighbouring "
        "samples are alike and neighbouring steps are not; read in the other axis order (the same values), the steps "
        "are alike and the samples are not. Each entry is a mean distance between neighbours over that between "
        "entries half the axis apart (1: no order), along the batch and the time axis, as given and re-read; for a "
        "token batch, padded_lines_reread: the share of its lines, read in the other axis order, that end in padding")

    def summary(self, num: NumberFormat = str) -> str:
        others = max(self.samples - self.replaced_samples, 0)
        return (f"replacing {self.replaced_samples} samples moved {self.changed_samples} of the {others} other "
                f"samples' outputs (max change {num(self.max_change)}, tolerance {num(self.tolerance)}), "
                f"batch axis {num(self.batch_axis)}")


class CausalityResult(ProbeResult):
    title: ClassVar[str] = "next-token causality"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "causality", "A next-token model cannot see what it predicts (targets shifted, no future tokens visible)",
        "causality probe: which input token the loss asks each position to predict; change later tokens, the "
        "earlier positions' outputs must not move")  # fmt: skip
    # no codes of its own: LABELS_MISALIGNED and DATA_LEAKAGE belong to the labels and data items (a code
    # fails one item); this item fails when the probe does

    time_axis: Count | None = Field(None, description="the token inputs' time axis (1: batch-first, 0: time-major)")
    samples: Count = 0
    positions: Count = 0
    scored_positions: Count = Field(0, description="positions the loss scores (not ignored)")
    copy_fraction: Fraction | None = Field(
        None, description="scored positions whose target is the last input token the position reads (at that same "
        "position, or input_shift back)")
    next_fraction: Fraction | None = Field(
        None, description="scored positions whose target is the token after the last one the position reads")
    input_shift: Count | None = Field(
        None, description="how far back the last token each position reads sits (1: a decoder handed its targets "
        "reads trg[t - 1] for output t; 0: a language model)")
    unshifted: bool | None = Field(None, description="the targets are the inputs: the shift by one is missing")
    target_offset: int | None = Field(
        None, description="how far ahead of the last input token each scored position reads its target sits, where "
        "one offset holds at >= 0.9 of them and it is not 0 or 1 (2: shifted twice; -1: the previous token)")
    cut: Count | None = Field(None, description="the last position kept; every later token was changed")
    changed_positions: Count = Field(0, description="positions <= cut whose outputs moved beyond the tolerance")
    max_change: Float | None = Field(None, description="largest change of an output at a position <= cut")
    tolerance: Float | None = None
    future_visible: bool | None = Field(None, description="outputs depend on later tokens")
    target_input: Count | None = Field(
        None, description="which input tensor holds the float targets verbatim (a forecaster's decoder input), if any")
    target_start: Count | None = Field(None, description="where along its time axis the targets sit in that input")
    batch_next_fraction: Fraction | None = Field(
        None, description="share of positions whose target in the batch is the next input token, when the loss "
        "pairs the outputs with other positions' targets")
    target_position: Count | None = Field(
        None, description="one target per sample, found as the input token at this position of (nearly) every "
        "sample's window, a position the model reads")
    autoregressive: bool | None = Field(
        None, description="read as an autoregressive density model over float inputs (PixelCNN, MADE): positions "
        "changed one at a time; changed_positions counts those whose own output moved with them")
    padding_id: int | None = Field(
        None, description="the id that ends the target sequences in runs of varying length (padding), if any")
    scored_padding_fraction: Fraction | None = Field(
        None, description="share of the scored positions that are padding after each run's first token")
    time_information: Float | None = Field(
        None, description="what adjacent input tokens along the time axis tell of each other (mutual information, "
        "nats, above that of each token paired with another sample's token at the same position)")
    batch_information: Float | None = Field(
        None, description="the same across the batch axis: adjacent samples' tokens at one position")
    text_across_batch: bool | None = Field(
        None, description="the text runs across the batch, not along time: each sequence holds every B-th token "
        "(a batchify that views (-1, B) where (B, -1) was meant)")

    @property
    def offset_in_words(self) -> str | None:
        """Where the misplaced targets sit in the inputs ("2 positions ahead", "1 position back")."""
        offset = self.target_offset
        if offset is None:
            return None
        return f"{abs(offset)} position{'' if abs(offset) == 1 else 's'} {'ahead' if offset > 0 else 'back'}"

    def summary(self, num: NumberFormat = str) -> str:
        if self.target_input is not None:
            return (f"input {self.target_input} holds the targets from position {self.target_start}; changing a "
                    f"target's own value there moved its prediction at {self.changed_positions} of "
                    f"{self.scored_positions} positions")  # fmt: skip
        if self.autoregressive:
            return (f"autoregressive over its inputs: {self.changed_positions} of {self.scored_positions} positions' "
                    f"own outputs moved with their own input (max change {num(self.max_change)}, tolerance "
                    f"{num(self.tolerance)})")  # fmt: skip
        return (f"targets = input at the same position {num(self.copy_fraction)}, = next input "
                f"{num(self.next_fraction)} of {self.scored_positions} scored positions; changing tokens after "
                f"position {num(self.cut)} moved {self.changed_positions} earlier positions (max change "
                f"{num(self.max_change)}, tolerance {num(self.tolerance)})")


class LabelAlignmentResult(ProbeResult):
    title: ClassVar[str] = "label alignment"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "labels", "Labels belong to their inputs (real labels learn, shuffled labels do not)",
        "label-alignment probe: train briefly on real and on permuted labels",
        ("LABELS_MISALIGNED",))  # fmt: skip

    real_accuracy: Float | None = None
    permuted_accuracy: Float | None = None
    chance_accuracy: Float | None = None
    steps: Count = 0

    def summary(self, num: NumberFormat = str) -> str:
        if self.real_accuracy is None:  # real-valued targets, or not run: the message has the numbers
            return f"{self.message}, {self.steps} steps" if self.message else f"{self.steps} steps"
        return (f"accuracy on real labels {num(self.real_accuracy)}, on permuted labels "
                f"{num(self.permuted_accuracy)}, chance {num(self.chance_accuracy)}, {self.steps} steps")


class LabelNoiseResult(ProbeResult):
    title: ClassVar[str] = "label noise"
    ask: ClassVar[str] = "share of wrong labels"
    checklist: ClassVar[ChecklistItem] = ChecklistItem(
        "label_noise", "Few labels are wrong (they agree with confident out-of-sample predictions)",
        "label-noise probe: cross-validated predictions of a small model against the given labels",
        ("LABEL_NOISE",))  # fmt: skip

    noise_fraction: Fraction | None = Field(None, description="disagreeing labels among the confident predictions")
    noise_lower_bound: Fraction | None = Field(None, description="its one-sided 95% lower bound")
    disagreement_fraction: Fraction | None = Field(None, description="disagreeing labels among all samples")
    confident_samples: Count = 0
    samples: Count = 0
    classes: Count | None = Field(None, description="classes among the labels the probe read")

    def summary(self, num: NumberFormat = str) -> str:
        return (f"{num(self.noise_fraction)} of the {self.confident_samples} confidently predicted labels disagree "
                f"(at least {num(self.noise_lower_bound)}); {num(self.disagreement_fraction)} of all "
                f"{self.samples}")


class Probes(Schema):
    """One field per probe, in the order the views list them."""

    overfit_one_batch: OverfitResult | None = None
    lr_range: LRRangeResult | None = None
    grad_check: GradCheckResult | None = None
    nan_origin: NanOriginResult | None = None
    eval_mode: EvalModeResult | None = None
    sample_independence: SampleIndependenceResult | None = None
    causality: CausalityResult | None = None
    label_alignment: LabelAlignmentResult | None = None
    label_noise: LabelNoiseResult | None = None

    @classmethod
    def result_types(cls) -> dict[str, type[ProbeResult]]:
        """Field name → result model, for every probe, in field order."""
        return {name: _result_type(field.annotation) for name, field in cls.model_fields.items()}

    def results(self) -> dict[str, ProbeResult]:
        """Field name → result of every probe that reported, in field order."""
        return {name: result for name in type(self).model_fields if (result := getattr(self, name)) is not None}


def _result_type(annotation: Any) -> type[ProbeResult]:
    for candidate in typing.get_args(annotation) or (annotation,):
        if isinstance(candidate, type) and issubclass(candidate, ProbeResult):
            return candidate
    raise TypeError(f"a Probes field must be a ProbeResult model or None, not {annotation!r}")


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
    learns: then there is nothing on this batch for a remedy to explain (``message``).
    ``status`` is ``skipped``/``error`` when the probe did not run to its end (``message``
    says why; an error is also in ``report.errors``)."""

    status: Literal["done", "skipped", "error"] = "done"
    steps: Count = 0
    baseline_initial_loss: Float | None = None
    baseline_final_loss: Float | None = None
    message: str | None = None
    budget_seconds: Float | None = None
    seconds: Float = 0.0
    optimizer: Literal["user", "default"] | None = Field(
        None, description="what the runs trained with: 'user' (a copy of the user's optimizer, or SGD at the step "
        "size a Monitor measured) or 'default' (nndx's Adam at 1e-3: none was known), which makes a "
        "confirmation weaker evidence")
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


class RecurrentInput(Schema):
    """The sizes a recurrent layer (nn.RNN, nn.LSTM, nn.GRU) took along its time and batch axes, read
    as its ``batch_first`` lays them, over every forward of the run (at most 16 distinct sizes each)."""

    name: str
    batch_first: bool
    forwards: Count = 0
    time_lengths: list[Count] = Field(default_factory=list, description="distinct sizes of its time axis")
    batch_sizes: list[Count] = Field(default_factory=list, description="distinct sizes of its batch axis")


class FedInput(Schema):
    """What reached one positional input of a watched model over the run: values another watched
    model's last output held (a GAN's generated samples, an actor's actions), and the other values
    with as many values per sample (real data, a replay buffer's actions), by their extremes."""

    model: str = Field(description="the watched model's name in its Monitor ('' for a single model)")
    position: Count = Field(description="the positional argument of its forward")
    fed_forwards: Count
    own_forwards: Count
    fed_min: Float
    fed_max: Float
    own_min: Float
    own_max: Float


class GraphPoint(Schema):
    """The autograd graph behind the model's outputs at one recorded step."""

    step: Count
    nodes: Count = Field(description="autograd nodes reachable from the outputs (a bounded walk: at most the cap)")
    earlier_nodes: Count = Field(
        0, description="of those, nodes created at an earlier recorded step: a graph kept alive across steps"
    )
    truncated: bool = Field(False, description="the walk stopped at its cap; nodes is a lower bound")
    older_graphs_alive: Count = Field(
        0, description="recorded steps before the previous one whose output graph is still alive now (held by "
        "something that outlives the step: a running sum of loss tensors, outputs kept without .detach())")
    older_graphs_holding: Count | None = Field(
        None, description="of older_graphs_alive, those that still hold their saved tensors (no backward pass freed "
        "them: the activations are kept too); 0 when backward freed every one of them (a list of loss tensors "
        "appended after backward keeps only the graphs' structure); None when not known")
    stored_nodes: Count = Field(
        0, description="autograd nodes reachable, at the end of the step, from the tensors the model keeps beside "
        "its parameters (buffers, plain attributes: moving statistics, a recurrent state)")
    stored_earlier_nodes: Count = Field(0, description="of those, nodes created at an earlier recorded step")
    stored_holder: str | None = Field(
        None, description="the kept tensor whose graph reaches back to an earlier step (else the first kept tensor "
        "with a graph)")


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
    output_log_rows_off_zero: Float | None = Field(
        None, description="largest |logsumexp| over the class axis (dim 1) of a row: 0 for log-probabilities over "
        "the classes, far from 0 for log_softmax over another axis")
    output_zero_fraction: Fraction | None = Field(
        None, description="share of output elements exactly 0 (a ReLU on the logits clips about half of them)"
    )
    applies: Literal["softmax", "log_softmax"] | None = Field(
        None, description="what a loss of the user's own was seen applying over the outputs' last or class axis "
        "itself (a label-smoothing cross-entropy's log_softmax): it expects logits")
    squashes_again: str | None = Field(
        None, description="a sigmoid or softmax (or its log) that a loss of the user's own applied to what an "
        "activation bounded to [0, 1] made, as 'Sigmoid -> log_sigmoid': it was given probabilities where it "
        "expects logits")
    broadcast_shape: list[Count] | None = Field(
        None, description="the shape an elementwise op inside a loss of the user's own broadcast an output-shaped "
        "and a target-shaped tensor to, larger than both ([N, 1] - [N] is [N, N]); or a tensor computed from the "
        "output and one computed from the targets alone, whose batch axes broadcast against each other")
    broadcast_operands: list[list[Count]] | None = Field(
        None, description="the shapes of the two operands that broadcast to broadcast_shape")
    output_activation: str | None = Field(
        None, description="for a loss the model computes in its own forward, the activation an observed forward saw "
        "make the outputs it was given (through views and indexing): 'Sigmoid' before a loss on logits squashes "
        "twice")
    target_mean: Float | None = Field(None, description="mean of floating-point targets")
    target_std: Float | None = Field(None, description="standard deviation of floating-point targets")
    target_min: Float | None = Field(None, description="smallest floating-point target seen")
    target_max: Float | None = Field(None, description="largest floating-point target seen")
    ignore_index: int | None = Field(None, description="the class index the loss was told to skip (when >= 0)")
    class_weight_ratio: Float | None = Field(
        None, description="largest over smallest of the per-class weights the loss was given (CrossEntropyLoss's "
        "weight=, one per class), over its calls: classes weighted against an imbalance")
    ignored_target_fraction: Fraction | None = Field(
        None, description="largest share of a call's targets equal to ignore_index")
    scored_classes: Count | None = Field(
        None, description="most distinct target classes a call still scored beside ignore_index")
    top_target: int | None = Field(
        None, description="the most common integer target among those the loss scores (not its ignore_index, not "
        "negative), in the measured call where it was most common")
    top_target_fraction: Fraction | None = Field(None, description="that target's share of the scored targets")
    calls: Count = 1
    measured_batches: Count = Field(0, description="calls whose targets (2 or more values) were measured")
    single_target_batches: Count = Field(
        0, description="of the measured calls, those whose targets all held one value: a batch of one class")
    single_target_values: list[Float] = Field(
        default_factory=list, description="the values those one-value batches held, each once (at most 16)")


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
    unregistered_params: list[str] = Field(
        default_factory=list, description="tensors a module holds outside its parameters (a layer in a Python list, "
        "nn.Parameter(...).to(device) kept as an attribute) that received gradients and that no optimizer holds")
    params_grad_none: list[str] = Field(default_factory=list, description="trainable, but .grad stayed None")
    params_grad_nonfinite: list[str] = Field(
        default_factory=list, description="trainable parameters whose .grad held an inf or NaN when the report was "
        "made (gradients that overflowed and were never reset)")
    logged_loss_reaches_params: bool | None = Field(
        None, description="whether the first logged losses with an autograd graph (up to 3) reach any watched "
        "trainable parameter; None when none was logged as a tensor with a graph")
    logged_loss_through_other_models: bool | None = Field(
        None, description="whether those losses also run through trainable parameters the Monitor does not watch "
        "(a GAN's generator loss through the discriminator) or through another Monitor's model's output, or the "
        "model was fed such an output (a GAN's players, each frozen while the other steps): an adversarial loss "
        "need not fall")
    ops_before_loss: list[list[str]] = Field(
        default_factory=list, description="the autograd ops from the op that made a watched model's output to those "
        "logged losses, one path per output reached, without the 'Backward0' suffix (['Addmm', 'Softmax', 'Index', "
        "'LogSoftmax', 'NllLoss', 'Mean']; an op entered through its second input or later as 'KlDiv#1'): what the loop "
        "did to the outputs, whichever way it called its loss")
    loss_targets_from_output: bool | None = Field(
        None, description="whether the loss function computes the targets it compares with from the model's output "
        "(self-training: DEC's target distribution, pseudo-labels), so its objective moves as the model does; None "
        "when not checked (the probe checks a loss function of the user's own)")
    frozen_params: list[str] = Field(default_factory=list, description="requires_grad=False")
    frozen_at_init: list[str] | None = Field(
        None, description="frozen weights whose values still fit a standard initialisation (PyTorch's default, "
        "a He/Xavier/LeCun normal, a norm layer's ones): never trained or loaded; None when no frozen weight "
        "could be checked")
    frozen_checked: Count = Field(0, description="frozen weight tensors the initialisation check could read")
    frozen_tracking: list[str] = Field(
        default_factory=list, description="frozen parameters that follow trained ones (a momentum encoder, a target "
        "network, an EMA teacher): a module whose frozen weights equal trainable ones of the same shape, or frozen "
        "parameters that changed during training with no gradient; frozen by design")
    no_grad_forwards_in_train_mode: Count = 0
    no_grad_train_forward_steps: Count = Field(
        0, description="the steps at which such forwards ran: nearly every step is part of the training step "
        "(MixMatch's label guessing, pseudo-labels), a few steps an evaluation")
    train_mode_evaluations: Count = Field(
        0, description="losses logged under an evaluation split (val, test...) after forwards with grad enabled in "
        "train mode and no backward since, in a model with dropout or batch-norm: a validation loop with neither "
        "torch.no_grad() nor model.eval()")
    backward_after_eval_forward: Count = Field(
        0, description="backward passes whose last forward of the model ran in eval mode, in a model with dropout "
        "or batch-norm: training after model.eval() without model.train() back")
    first_eval_backward_step: Count | None = Field(None, description="the step of the first such backward pass")
    frozen_train_mode_forwards: Count = Field(
        0, description="forwards with grad enabled of a model that had no trainable parameter at any forward, with "
        "its dropout or batch-norm in train mode: a fixed network run as if training (style transfer's extractor "
        "without .eval(): batch-norm on one image's statistics, its running statistics drifting)")
    has_dropout: bool = False
    has_batchnorm: bool = False
    lr_history: list[LRPoint] = Field(default_factory=list)
    scheduled_lrs: list[Float] = Field(
        default_factory=list, description="each param group's initial_lr (OneCycleLR's max_lr): the LR a torch LR "
        "scheduler scales (a warm-up rises to it), when every group has one")
    effective_lr_history: list[LRPoint] = Field(
        default_factory=list, description="loops without an optimizer: the median over weight matrices of "
        "‖Δw‖ / ‖gradient‖ at recorded steps — plain SGD's LR, a constant multiple of it under momentum; "
        "negative where the update climbed the gradient (cosine below -0.5)")
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
    optimizer_steps: list[Count] = Field(
        default_factory=list, description="steps of each optimizer in ``optimizers``, in that order")
    optimizer_steps_without_reset: list[Count] = Field(
        default_factory=list, description="of each optimizer's steps after its first, those whose gradients were "
        "not reset since its previous step (by zero_grad or by hand): a loop that resets one optimizer and "
        "forgets another")
    input_dtype: str | None = Field(
        None, description="dtype of the model's first tensor input; an integer dtype means token ids, which get "
        "no input norm"
    )
    graph_nodes_history: list[GraphPoint] = Field(
        default_factory=list, description="size of the autograd graph behind the model's outputs, per recorded step"
    )
    grads_masked_by_hand: dict[str, Float] = Field(
        default_factory=dict, description="per parameter, the largest share of its non-zero entries whose gradient the "
        "loop zeroed between backward and optimizer.step() on a recorded step (a mask applied to .grad by hand); "
        "parameters with none left out")
    recurrent_inputs: list[RecurrentInput] = Field(
        default_factory=list, description="per recurrent layer, the sizes its time and batch axes took over the run "
        "(padded sequences of varying length vary the time axis; a loader's batch size holds the batch axis)")
    fed_inputs: list[FedInput] = Field(
        default_factory=list, description="per input of a watched model that took both another watched model's "
        "outputs and other values (a discriminator's generated and real images), the extremes of each")
    clipped_after_step: list[ScalarPoint] = Field(
        default_factory=list, description="recorded steps whose gradients were all scaled by one factor under 1 "
        "after optimizer.step() and before the loop's next forward, zero_grad or backward (a clip placed after the "
        "step, which the step never saw), and that factor")
    params_never_changed: list[str] | None = Field(
        None, description="trainable parameters whose values when the report was made equal those when the "
        "Monitor attached (None: not checked)"
    )
    limitations: list[str] = Field(
        default_factory=list, description="what the Monitor could not attach to or measure, in words"
    )
    layers_never_run: list[str] = Field(
        default_factory=list, description="leaf layers with parameters that no recorded step saw run (the Monitor "
        "hooks every one): a head the forward never calls")
    live_window: Count | None = Field(
        None, description="set on the windowed report live alerts read while the loop runs (its newest points per "
        "history): the run has not ended, so nothing can be said of how it ends")
    backward_calls_in_step: Count = Field(
        0, description="of backward_calls, those run inside optimizer.step() (a closure, as L-BFGS evaluates "
        "the loss several times per step): not gradient accumulation"
    )
    backward_since_reset_at_steps: Count | None = Field(
        None, description="summed over the optimizer steps, the backward passes since the last gradient reset when "
        "each step began: steps for a plain loop, k x steps for k accumulated micro-batches; an adversarial "
        "attack's backward passes, reset before the training backward, add nothing. None without an optimizer"
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
    index_features: list[Count] = Field(
        default_factory=list, description="float columns the model reads as indices (embedding lookups): left out of "
        "the scale statistics above")
    scaled_features: list[Count] = Field(
        default_factory=list, description="columns the model standardises itself in its forward (a stored mean and "
        "std, a BatchNorm on the raw input): left out of the scale statistics above")
    input_nan_count: Count = 0
    input_inf_count: Count = 0
    label_nan_count: Count = 0
    label_inf_count: Count = 0
    label_dtype: str | None = None
    label_kind: Literal["class_index", "one_hot", "float_continuous", "float_integral", "other"] | None = None
    target_mean: Float | None = None
    target_std: Float | None = None
    target_min: Float | None = Field(None, description="smallest regression target")
    target_max: Float | None = Field(None, description="largest regression target")
    class_counts: dict[str, Count] = Field(default_factory=dict)
    imbalance_ratio: Float | None = None
    duplicate_count: Count = Field(0, description="rows that repeat an earlier row exactly")
    duplicate_fraction: Fraction = 0.0
    duplicate_label_conflict: Fraction | None = Field(
        None, description="share of the duplicate rows whose label differs from their input's first occurrence's: "
        "inputs that do not determine their label (a language model's n-gram contexts), not copied samples",
    )
    zero_sample_fraction: Fraction = Field(0.0, description="samples whose inputs are all zero")
    label_runs_fraction: Fraction | None = Field(
        None, description="share of consecutive samples with the same label (order check)"
    )
    target_order_correlation: Float | None = Field(
        None, description="rank correlation of a regression target with the sample's position (order check: "
        "±1 when sorted by target)",
    )
    checked_samples: Count | None = Field(
        None, description="samples the statistics were computed on (< n_samples when sampled)"
    )
    order_source: Literal["loader", "storage"] | None = Field(
        None, description="whose order the order checks read: a DataLoader's (the order training sees) or the "
        "storage order of arrays or a Dataset (an ImageFolder is sorted by class; a shuffling loader changes it)")
    missing_classes: list[str] = Field(
        default_factory=list,
        description="classes expected (num_classes, a gap in the label range, or seen in the other split) "
        "with no sample in this split",
    )
    ignored_label_count: Count = Field(
        0, description="samples whose label is an unlabelled marker (one negative value, -1 or -100, beside 0-based "
        "classes: what a loss's ignore_index skips); left out of class_counts and the order check")


class DataStats(Schema):
    train: SplitStats | None = None
    test: SplitStats | None = None
    batch: SplitStats | None = Field(
        None, description="without data=: the input statistics of the probes' batch (scale, range, non-finite "
        "values); no labels, duplicates or order, which one batch cannot judge")
    train_test_overlap: Count = 0
    train_test_overlap_fraction: Fraction = Field(0.0, description="share of test rows found in train")
    input_space_size: Float | None = Field(
        None, description="how many distinct input rows the values seen allow, when every feature takes integer "
        "values (ids, codes, counts) and there are at most 1e12 such rows: drawn from so small a space, rows repeat "
        "and recur across splits by chance; None for continuous inputs or a larger space")
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
    refuted: bool = Field(
        False, description="the rule's own evidence speaks against its cause (the LR range test trains well at the "
        "loop's LR): shown as context, it explains no other finding"
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

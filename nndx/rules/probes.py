"""Probe rules (NNDX6xx): what the active probes measured on a copy of the model."""

from __future__ import annotations

import math

from nndx import vocab
from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, NanOriginResult, flat_since
from nndx.rules._series import (
    RANGE_READING, finite, frozen_untrained, generalizes, loss_calls, loss_curve, loss_is_moving, loss_learned,
    no_floor, num_classes, samples_axis, slope_significance, trains_well_up_to, used_lr,
)
from nndx.rules.layers import units_died
from nndx.rules.loss import NO_LEARNING_CAUSES, NONFINITE_CAUSES
from nndx.rules.engine import Hit, rule

# the share of disagreeing labels that labels drawn without looking at the inputs would give, in
# units of 1 - 1/C; at 0.9 of it the labels are no longer noisy but unrelated (NNDX612)
CHANCE_DISAGREEMENT = 0.9
# a model whose loss above its floor on one batch fell by less than half in the overfit probe's
# 300 Adam steps barely learns (dead units, no gradient, a loss that cannot reach its floor): NNDX601
# warns; below this share it nearly fits, and says so as info
BARELY_LEARNS = 0.5
# a gradient within this share of the finite differences in every tensor is right in direction and
# size: no wrong step follows from it (NNDX604 warns, or notes when the run learned)
NEARLY_RIGHT = 1e-2
# a head on a frozen trained body fits a batch only as far as the body's features allow: a fall of a
# tenth shows that the head and the loss work together
HEAD_FALLS = 0.9
# a loss nndx cannot name (no torch loss inside it: forward-forward's goodness loss) has no floor
# nndx knows, so "1% of its start" assumes a floor of 0 it cannot check: when the run's own loss
# learned, a fall to this share in the probe shows that the model and the loss work together
UNNAMED_FALLS = 0.75
# a copy whose loss moved and then repeated itself to this relative tolerance for the probe's last half
# has every gradient zero: its units died on the one batch (Adam drove a ReLU6 ranking score to 0 for
# every document of RankNet's one query) -- when the run's own loss fell by this share, the copy
# stopped, not the model
RUN_FELL = 0.5
# a run whose own train loss ended under this share of its start (and not below zero) fit its data: the
# model and the loss can fit, so a probe that failed to fit one batch ran out of steps (a 4-unit ReLU RNN
# that needs a thousand steps to leave ln 2)
RUN_FIT = 0.1


def _probe(report: DiagnosticReport, name: str):
    return getattr(report.probes, name) if report.probes is not None else None


@rule(
    "NNDX601",
    C.WRONG_LOSS,
    "warning",
    "The model cannot overfit a single batch",
    detects="The overfit-one-batch probe failed: with its own correct loop and many steps on one batch "
    "the loss did not fall to a small share of its start above its floor (or accuracy did not reach "
    "100%). A warning when the lowest loss above its floor is more than half its start; info when it fell further "
    "but not to 1% — a term the floor cannot see (a KL penalty, targets that identical inputs "
    "contradict) stops healthy models there too; info as well when it fell by a tenth and most parameters "
    "are frozen trained weights (a head on a pretrained body), or by a quarter on a loss nndx cannot name "
    "(no floor it knows) while the run's own loss learned, or fell by a tenth and the probe's as far or further, or "
    "the probe's loss was still falling when it stopped (its last half's least-squares slope two standard errors "
    "or more below zero: Cox's partial likelihood ranks a batch slowly); "
    f"info when the run's own train loss ended under {RUN_FIT:.0%} of its start (and not below zero): the run fit "
    "its data, so the probe's budget ran out (a small ReLU RNN that takes a thousand steps to leave ln 2); "
    "info when the probe's loss fell below zero and on to -inf (an objective with no floor, a GAN generator's "
    "against a fixed discriminator: NNDX111 asks whether it should have one); info when the loss runs through "
    "trainable parameters outside the model (a generator's through its discriminator, which the probe does not "
    "train: a generator's own preflight); info when the model is fed another watched model's outputs beside real "
    "data (a discriminator after training: its opponent's samples look like the data, and the batch's labels are "
    "then ones its inputs barely tell apart); "
    "info too when the copy's loss moved and then froze (every gradient zero: its units died on the one batch) "
    f"while the run's own loss fell by {RUN_FELL:.0%} or more; and when the model has fewer trainable parameters "
    "than the batch has samples (a calibration temperature, a linear probe): memorising takes about one a sample.",
    why="Any working model/loss pair memorises one batch. Failing means a bug between the output and "
    "the loss (wrong loss, double softmax, mismatched shapes or label dtype) or in the model (dead "
    "units, detached or frozen layers, a broken backward) — not the learning rate of your own loop.",
    fix="Check the loss matches the outputs (logits to CrossEntropyLoss, long labels, equal shapes), then "
    "the gradient flow (hooks probe) and the gradient check.",
    # a NaN the data or the forward makes ends a one-batch fit as surely as any step
    explained_by=NO_LEARNING_CAUSES + NONFINITE_CAUSES + (C.UNDERFITTING,),
    symptom=True,
)
def overfit_failed(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "overfit_one_batch")
    if result is None or result.status != "failed":
        return None
    if result.initial_loss is not None and not math.isfinite(result.initial_loss):
        return None  # the model already produces NaN: the NaN rules say why, this adds nothing
    floor = result.loss_floor or 0.0
    # the lowest loss reached, not the last: a loss that swings from step to step (a VQ-VAE's codebook
    # assignments switching) ends on whatever sample the last step drew
    best = min((v for v in result.losses if math.isfinite(v)), default=result.final_loss)
    ratio = None
    if result.initial_loss is not None and best is not None and result.initial_loss > floor:
        ratio = (best - floor) / (result.initial_loss - floor)
    nearly = ratio is not None and ratio <= BARELY_LEARNS
    head_only = _head_on_trained_body(report) and ratio is not None and ratio <= HEAD_FALLS
    still_falling = _still_falling(result.losses)
    unnamed = (ratio is not None and ratio <= UNNAMED_FALLS and _loss_unnamed(report) and not nearly
               and (loss_learned(report) or _fell_as_far_as_the_run(report, ratio) or still_falling))
    died = _copy_died(result.losses) and loss_curve(report).n >= 6 and loss_curve(report).progress >= RUN_FELL
    too_few = _fewer_parameters_than_samples(report)
    run_fit = _run_fit_its_data(report) and not (nearly or head_only or unnamed or died or too_few)
    # below zero and on to -inf: an objective with no floor (a GAN generator's log(1 - D(G(z))) against a fixed
    # discriminator) was fitted all the way down; whether it should have a floor is NNDX111's question
    bottomless = (result.final_loss == -math.inf and best is not None and best < min(0.0, result.initial_loss or 0.0)
                  and not (nearly or head_only or unnamed or died or too_few or run_fit))  # fmt: skip
    # a generator's loss through its discriminator, which the probe leaves untrained: how far one batch
    # goes against a fixed, untrained opponent says nothing of the generator
    opponent = bool(result.loss_through_other_parameters) and not (
        nearly or head_only or unnamed or died or too_few or run_fit or bottomless)
    # a discriminator after training: its batch's generated half comes from an opponent that learned to look
    # like the real half, and no model memorises labels its inputs barely tell apart
    discriminating = bool(report.loop is not None and report.loop.fed_inputs) and not (
        nearly or head_only or unnamed or died or too_few or run_fit or bottomless or opponent)
    return Hit(
        symptom=f"overfit_one_batch failed after {result.steps} steps"
        + (f" (the loss above its floor fell at best to {ratio:.2g} of its start, not to 0.01)" if nearly or head_only else "")
        + (": most parameters are frozen trained weights, and a head alone need not memorise a batch" if head_only else "")
        + (f" (the loss fell at best to {ratio:.2g} of its start, not to 0.01): a loss nndx cannot name has no floor it "
           "knows, and " + ("the probe's loss was still falling when it stopped" if still_falling
                            else "the run's own loss learned") if unnamed and not head_only else "")
        + (f": the copy's loss moved and then froze at {result.losses[-1]:.4g} (every gradient zero, its units died "
           f"on the one batch) while the run's own loss fell by {loss_curve(report).progress:.0%}"
           if died and not (nearly or head_only or unnamed) else "")
        + (f": the model has {too_few[0]} trainable parameter{'s' if too_few[0] != 1 else ''}, fewer than the batch's "
           f"{too_few[1]} samples, and memorises no batch that size (a temperature, a linear probe)"
           if too_few and not (nearly or head_only or unnamed or died) else "")
        + (f": the run's own train loss fell to {loss_curve(report).end / loss_curve(report).start:.2g} of its start, "
           f"so the model and the loss can fit; the probe's {result.steps} steps were too few" if run_fit else "")
        + (f": the loss fell below zero, to {best:.3g} and then -inf: it has no floor to fit to" if bottomless else "")
        + (": the loss runs through parameters outside the model (a generator's through its discriminator), which "
           "the probe does not train: one batch against a fixed opponent" if opponent else "")
        + (": the model is fed another watched model's outputs beside real data (a discriminator), and samples of "
           "an opponent that learned look like the data: labels their inputs barely tell apart" if discriminating
           else ""),
        evidence={
            "steps": result.steps,
            "lr": result.lr,
            "initial_loss": result.initial_loss,
            "final_loss": result.final_loss,
            "best_loss": best,
            "loss_floor": result.loss_floor,
            "best_to_initial": ratio,
            "final_accuracy": result.final_accuracy,
        },
        severity="info" if nearly or head_only or unnamed or died or too_few or run_fit or bottomless or opponent
        or discriminating else None,
        score=2.0,
        next_probe="grad_check and hooks (gradient flow per layer)",
    )


def _fewer_parameters_than_samples(report: DiagnosticReport) -> tuple[int, int] | None:
    """(trainable parameters, samples) when the model has fewer trainable parameters than the
    smallest batch that reached the loss has samples: memorising a batch takes about a parameter
    per sample, so such a model (a calibration temperature, a linear probe) fails the overfit
    probe by its size, not by a bug."""
    model = report.model
    axis = samples_axis(report)
    sizes = [c.output_shape[axis] if len(c.output_shape) > axis + 1 else c.output_shape[0]
             for c in loss_calls(report) if c.output_shape]  # fmt: skip
    if model is None or not sizes or not 0 < model.trainable_param_count < min(sizes):
        return None
    return model.trainable_param_count, min(sizes)


def _copy_died(losses: list[float]) -> bool:
    """The copy's loss moved, then repeated one value for the probe's last half or more."""
    if len(losses) < 4 or not all(map(math.isfinite, losses)):
        return False
    return 0 < flat_since(losses) <= len(losses) // 2


def _still_falling(losses: list[float]) -> bool:
    """The probe's loss over its last half still falls beyond its noise: the probe ran out of
    steps before the loss reached whatever floor it has."""
    values = finite(losses)
    return len(values) >= 20 and slope_significance(values[len(values) // 2 :]) <= -2.0


def _run_fit_its_data(report: DiagnosticReport) -> bool:
    """Whether the run's own train loss ended at or above zero and under :data:`RUN_FIT` of its
    (positive) start: a model and loss that fit the whole training set can fit one batch."""
    curve = loss_curve(report)
    return curve.n >= 6 and curve.start > 0 and 0 <= curve.end <= RUN_FIT * curve.start


def _fell_as_far_as_the_run(report: DiagnosticReport, ratio: float) -> bool:
    """Whether the run's own loss fell by a tenth or more, and the probe's one batch fell at least
    as far (to ``ratio`` of its start or less): the model and the loss then work together, and
    what stops both short is the loss's floor (Glow's bits per dimension: the run from 5.3 to
    3.7, one batch to 0.57 of its start; the data's entropy is far above 0)."""
    curve = loss_curve(report)
    return curve.n >= 6 and curve.start > 0 and curve.progress >= 0.1 and ratio <= curve.end / curve.start


def _loss_unnamed(report: DiagnosticReport) -> bool:
    """Loss calls were seen, and none of them is a loss nndx knows (not even one called inside
    a function of the user's own)."""
    calls = loss_calls(report)
    return bool(calls) and all(vocab.loss_kind(c.loss_type) is None for c in calls)


def _head_on_trained_body(report: DiagnosticReport) -> bool:
    """Most parameters frozen, and trained (not at their initialisation): transfer
    learning, whose trainable rest is a small head."""
    model = report.model
    if model is None or frozen_untrained(report) is not False:
        return False
    return 0 < model.trainable_param_count <= model.param_count / 2


def _lr_range(report: DiagnosticReport):
    """The LR range result when it says something: a sweep that diverged at its very first
    LR started from a broken (NaN) model and measured nothing about the LR."""
    result = _probe(report, "lr_range")
    if result is None or result.status not in ("passed", "failed"):
        return None
    first = result.lrs[0] if result.lrs else None
    if result.diverged_at_lr is not None and first is not None and result.diverged_at_lr <= first:
        return None
    if result.min_loss is not None and not math.isfinite(result.min_loss):
        return None
    return result


def _collapsed_after_overshoot(report: DiagnosticReport) -> tuple[float, float] | None:
    """(the early peak, ln C) when a classification run's loss rose to :data:`OVERSHOOT` times
    its start within its first quarter and ended within 5% of ln C, the loss of a constant
    prediction; None otherwise (or when the report cannot tell)."""
    classes, curve = num_classes(report), loss_curve(report)
    if classes is None or classes < 2 or curve.n < 10 or curve.start <= 0:
        return None
    chance = math.log(classes)
    early = finite(curve.values[: max(3, curve.n // 4)])
    peak = max(early, default=0.0)
    if abs(curve.end - chance) > 0.05 * chance or peak < OVERSHOOT * max(curve.start, chance):
        return None
    return peak, chance


def _readings(result) -> list[float]:
    """The sweep's readings of an LR to train at: its suggestion and its minimum's lr / 10.
    A sweep whose loss never clearly fell (Adadelta's first steps are tiny at any lr) has its
    minimum at its first lr, and one whose loss went below zero (a WGAN critic's, a
    log-likelihood's) has no floor: its minimum is where the sweep stopped. Neither reads one."""
    if result.status != "passed":
        return []
    readings = [result.suggested_lr]
    if result.min_loss is None or result.min_loss >= 0:
        readings.append(result.min_over_10_lr)
    return finite([v for v in readings if v is not None and v > 0])


# an LR this many times the top of the range test's interval that killed units overshot
ABOVE_RANGE = 4.0
# a run whose loss rose to this multiple of its start in its first quarter overshot there
OVERSHOOT = 2.0


@rule(
    "NNDX602",
    C.LR_TOO_HIGH,
    "warning",
    "The learning rate used is beyond the LR range test's usable range",
    detects="The peak LR of the user's optimizer is at or above the LR where the range "
    "test's loss diverged, or over 30x the suggested LR (of a sweep whose loss clearly fell), or over "
    f"{ABOVE_RANGE:g}x the top of the range where the sweep trains well while units died during training "
    "(NNDX208 at warning or above: the harm an overshoot does that no divergence shows), or over "
    f"{RANGE_READING:g}x that top while the run's classification loss rose to {OVERSHOOT:g}x its start in its "
    "first quarter and ended at chance, ln(C) (the model collapsed to a constant prediction after the overshoot, "
    "with no NaN and no unit to die: a transformer under AdamW at 3e-2). Error when the "
    "loss also misbehaves; info when the train loss is decreasing anyway, or hovers around zero (a policy "
    "gradient's objective has no floor: its sweep reads no LR).",
    why="Beyond the divergence point each step overshoots the minimum.",
    fix="Train at the range test's suggested LR, or inside its interval (nndx.lr_find: .suggestion, .interval).",
)
def lr_above_range(report: DiagnosticReport) -> Hit | None:
    result, lr = _lr_range(report), used_lr(report)
    if result is None or lr is None or lr <= 0:
        return None
    suggestions = _readings(result)
    diverged = result.diverged_at_lr is not None and math.isfinite(result.diverged_at_lr) and lr >= result.diverged_at_lr
    too_far = bool(suggestions) and lr > 30 * max(suggestions)
    top = trains_well_up_to(report)
    killed = [h for h in units_died(report) if h.severity != "info"] if top is not None and lr > ABOVE_RANGE * top \
        else []  # fmt: skip
    collapsed = _collapsed_after_overshoot(report) if top is not None and lr > RANGE_READING * top else None
    if not (diverged or too_far or killed or collapsed):
        return None
    if collapsed and not (diverged or too_far or killed):
        peak, chance = collapsed
        return Hit(
            symptom=f"lr {lr:.3g} is {lr / top:.1f}x the top of the range where the LR range test trains well "
            f"({top:.3g}); the run's loss jumped to {peak:.3g} early, then settled at chance ({chance:.4g}): the model "
            "collapsed to a constant prediction",
            evidence={"used_lr": lr, "interval_high_lr": top, "suggested_lr": result.suggested_lr,
                      "diverged_at_lr": result.diverged_at_lr, "early_peak_loss": peak, "chance_loss": chance},
            score=1.5,
        )
    if killed and not (diverged or too_far):
        return Hit(
            symptom=f"lr {lr:.3g} is {lr / top:.0f}x the top of the range where the LR range test trains well "
            f"({top:.3g}), and units died during training ({killed[0].evidence['layer']})",
            evidence={"used_lr": lr, "interval_high_lr": top, "suggested_lr": result.suggested_lr,
                      "diverged_at_lr": result.diverged_at_lr, "dead_layer": killed[0].evidence["layer"],
                      "dead_unit_fraction": killed[0].evidence["dead_unit_fraction"]},  # fmt: skip
            score=1.5,
        )
    moving = loss_is_moving(report)
    # a loss with no floor (a policy gradient's) falls without end on the sweep's batch: no
    # reading of that sweep is a verdict on the LR
    floorless = no_floor(report)
    return Hit(
        symptom=f"lr {lr:.3g} is "
        + (f"above the divergence point {result.diverged_at_lr:.3g}" if diverged else "over 30x the suggestion")
        + ("; the run's loss hovers around zero, an objective with no floor, whose range test reads no LR" if floorless
           else ""),
        evidence={
            "used_lr": lr,
            "suggested_lr": result.suggested_lr,
            "min_over_10_lr": result.min_over_10_lr,
            "diverged_at_lr": result.diverged_at_lr,
        },
        severity="info" if moving or floorless else ("error" if moving is False and diverged else "warning"),
        score=1.0 + (2.0 if diverged else 0.0),
    )


@rule(
    "NNDX603",
    C.LR_TOO_LOW,
    "warning",
    "The learning rate used is far below the LR range test's suggestion",
    detects="The peak LR of the user's optimizer is under 1/100 of both the suggested LR and min_over_10_lr "
    "(of a sweep whose loss clearly fell and stayed above zero: a loss with no floor, a WGAN critic's, falls "
    "until the sweep stops), "
    "and the train loss is not clearly decreasing (info when it is).",
    why="Steps that small need orders of magnitude more of them; the loss looks stuck.",
    fix="Raise the LR to the range test's suggestion, or inside its interval (nndx.lr_find: .suggestion, .interval).",
    explained_by=(C.LR_SCHEDULE_MISUSE,),  # a schedule that drove the LR down is why it is low
)
def lr_below_range(report: DiagnosticReport) -> Hit | None:
    result, lr = _lr_range(report), used_lr(report)
    if result is None or lr is None or lr <= 0:
        return None
    suggestions = _readings(result)
    if not suggestions or lr >= min(suggestions) / 100:
        return None
    moving = loss_is_moving(report)
    return Hit(
        symptom=f"lr {lr:.3g} is {min(suggestions) / lr:.0f}x below the range test's suggestion",
        evidence={"used_lr": lr, "suggested_lr": result.suggested_lr, "min_over_10_lr": result.min_over_10_lr},
        severity="info" if moving else "warning",
        score=1.0 + min(3.0, math.log10(min(suggestions) / lr) - 2),
    )


@rule(
    "NNDX604",
    C.BROKEN_BACKWARD,
    "error",
    "Autograd gradients disagree with finite differences",
    detects="The gradient check failed: at least one parameter tensor's relative error is finite and at "
    "the 'bug' level (over 1e-3 in float64). The probe re-measures differences that cross a ReLU kink "
    "with a smaller step and marks what it cannot resolve 'suspect', which does not fire; so is a "
    "disagreement where every backward node is torch's own derivative (no custom autograd.Function, hook, "
    ".data or detach in the forward): that is the forward's rounding (log(1 - sigmoid(x)) at large x). "
    "Non-finite errors (weights already NaN) are no evidence and do not fire, nor does a gradient where finite "
    "differences see no slope at all (a sign or round read through a straight-through estimator: BinaryNet's "
    "binarized weights). A warning when every "
    f"tensor's error is under {NEARLY_RIGHT:g} (each gradient 99% right: no wrong step follows from it), info "
    "when the run's loss also learned: a term added in a backward on purpose is that small (RWKV's L2Wrap "
    "pushes the logits toward 0 by 1e-4 of their maximum: 0.15%).",
    why="A custom autograd.Function with a wrong backward trains on wrong gradients; nothing errors.",
    fix="Fix the backward of the named parameter's custom Function (transposes and scale factors are "
    "the usual suspects); re-run the gradient check.",
    # a detached or frozen tensor has autograd gradient 0 where finite differences see a slope
    explained_by=(C.DETACHED_GRAPH, C.FROZEN_PARAMETERS),
)
def broken_backward(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "grad_check")
    if result is None or result.status != "failed":
        return None
    # Non-finite errors come from a NaN loss (weights already blown up), not from the backward.
    # a surrogate gradient where the loss is flat (a straight-through estimator) is the design
    bad = [p for p in result.parameters if p.status == "bug" and math.isfinite(p.relative_error) and not p.autograd_zero
           and not p.loss_flat]
    if not result.parameters and result.max_relative_error is not None:
        error = result.max_relative_error
        if not math.isfinite(error):
            return None
        worst = error
    else:
        if not bad:
            return None
        worst = max(p.relative_error for p in bad)
    small, learned = worst < NEARLY_RIGHT, loss_learned(report)
    return Hit(
        symptom="gradient check failed" + (f" for {', '.join(p.name for p in bad[:5])}" if bad else "")
        + (f", by at most {worst:.2g} of the gradient: a term added in a backward on purpose is that small"
           + (", and the run's loss learned" if learned else "") if small else ""),
        evidence={
            "max_relative_error": result.max_relative_error,
            "parameters": [p.name for p in bad],
            "relative_errors": [p.relative_error for p in bad],
            "mode": result.mode,
        },
        severity=("info" if learned else "warning") if small else None,
        score=3.0 + min(2.0, math.log10(max(worst, 1e-3) / 1e-3)),
    )


@rule(
    "NNDX615",
    C.DETACHED_GRAPH,
    "error",
    "The gradient check found parameters the graph is cut from",
    detects="The gradient check's autograd gradient is None or all zeros for a parameter tensor where finite "
    "differences see the loss change: the loss depends on it, but not through the autograd graph.",
    why="A .detach(), a torch.no_grad() block, .data or .item() between a parameter and the loss keeps "
    "the forward's values but drops the gradient: those parameters never train, and nothing errors. A "
    "wrong custom backward gives a wrong gradient, rarely exactly none.",
    fix="Remove the detach/no_grad/.data/.item() between these parameters and the loss.",
)
def graph_cut(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "grad_check")
    if result is None or result.status != "failed":
        return None
    cut = [p for p in result.parameters if p.status == "bug" and p.autograd_zero]
    if not cut:
        return None
    return Hit(
        symptom=f"no autograd gradient for {', '.join(p.name for p in cut[:5])}, yet the loss depends on them",
        evidence={"parameters": [p.name for p in cut], "relative_errors": [p.relative_error for p in cut]},
        score=3.0 + min(1.0, len(cut) / max(1, len(result.parameters))),
    )


def _origin(report: DiagnosticReport) -> NanOriginResult | None:
    result = _probe(report, "nan_origin")
    if result is None or result.status not in ("passed", "failed"):
        return None
    return result


_ORIGIN_WORDS = {
    C.LOG_OF_ZERO: ("log",),
    C.NUMERICAL_OVERFLOW: ("exp", "softmax", "softplus", "pow", "cosh", "sinh"),
    C.DIVISION_BY_ZERO: ("div", "norm", "standard", "scale", "whiten", "recip"),
}


def _origin_code(result: NanOriginResult) -> C | None:
    """The cause the op that made the first non-finite value (``forward_op``, when the
    module's own code made it) or else the module's type and name point to."""
    texts = [result.forward_op or "", f"{result.forward_module_type or ''} {result.forward_module or ''}"]
    for text in (t.lower() for t in texts if t.strip()):
        for code, words in _ORIGIN_WORDS.items():  # log first: LogSoftmax is a log, not an exp
            if any(word in text for word in words):
                return code
    return None


def _origin_hit(report: DiagnosticReport, code: C) -> Hit | None:
    result = _origin(report)
    if result is None or result.input_nonfinite_count:
        return None
    if _origin_code(result) == code:
        return Hit(
            symptom=f"first non-finite output at {result.forward_module} ({result.forward_module_type})"
            + (f", made by {result.forward_op}()" if result.forward_op else ""),
            evidence={
                "forward_module": result.forward_module,
                "forward_module_type": result.forward_module_type,
                "forward_op": result.forward_op,
                "backward_module": result.backward_module,
                "loss_finite": result.loss_finite,
            },
            score=3.0,
        )
    return None


@rule(
    "NNDX605",
    C.LOG_OF_ZERO,
    "error",
    "NaN/Inf first produced by a log (or by the loss itself)",
    detects="The nan_origin probe's first non-finite module is a log (its type or name says so), or every "
    "module's output is finite with finite inputs but the loss is not — a log of 0 inside the loss.",
    why="log(0) = -inf and log(x<0) = NaN; probabilities that reach exactly 0 (a softmax that "
    "underflows, a clamp missing) produce them.",
    fix="Work in log space (log_softmax, CrossEntropyLoss on logits, BCEWithLogitsLoss) or clamp: "
    "torch.log(p.clamp_min(1e-12)).",
)
def nan_from_log(report: DiagnosticReport) -> Hit | None:
    hit = _origin_hit(report, C.LOG_OF_ZERO)
    if hit is not None:
        return hit
    result = _origin(report)
    if result is None or result.input_nonfinite_count or result.forward_module or result.loss_finite is not False:
        return None
    return Hit(
        symptom="every module's output is finite but the loss is not",
        evidence={"forward_module": None, "loss_finite": False, "backward_module": result.backward_module},
        score=2.0,
        next_probe="inspect the loss function for log/division without eps",
    )


@rule(
    "NNDX606",
    C.NUMERICAL_OVERFLOW,
    "error",
    "NaN/Inf first produced by exp/softmax overflow",
    detects="The nan_origin probe's first non-finite module is an exp, softmax or similar.",
    why="exp(x) overflows float32 for x > 88; a hand-written softmax without the max-subtraction trick "
    "returns inf/inf = NaN.",
    fix="Subtract the row max before exp (or use torch.softmax / log_softmax, which do).",
)
def nan_from_exp(report: DiagnosticReport) -> Hit | None:
    return _origin_hit(report, C.NUMERICAL_OVERFLOW)


@rule(
    "NNDX607",
    C.DIVISION_BY_ZERO,
    "error",
    "NaN/Inf first produced by a division or normalisation",
    detects="The nan_origin probe's first non-finite module divides or normalises (its type or name says "
    "so).",
    why="A normalisation by a std or norm that is 0 (a constant feature, an all-zero row) gives inf or "
    "0/0 = NaN.",
    fix="Add eps to the denominator: x / (x.std() + 1e-8); drop constant features.",
)
def nan_from_division(report: DiagnosticReport) -> Hit | None:
    return _origin_hit(report, C.DIVISION_BY_ZERO)


@rule(
    "NNDX608",
    C.EXPLODING_GRADIENTS,
    "warning",
    "NaN/Inf first produced by a weighted layer",
    detects="The nan_origin probe's first non-finite module is neither a log, an exp nor a division (for "
    "instance a Linear whose weights overflowed).",
    why="With finite inputs, a layer whose output overflows has weights that grew out of range — the "
    "trace of exploding gradients or a too-high LR.",
    fix="Lower the learning rate, clip gradients, and check the gradient-norm history.",
    explained_by=(C.LR_TOO_HIGH, C.MISSING_ZERO_GRAD, C.GRAD_ACCUM_SCALING, C.BAD_INIT, C.UNNORMALIZED_INPUTS),
    symptom=True,
)
def nan_from_layer(report: DiagnosticReport) -> Hit | None:
    result = _origin(report)
    if result is None or result.input_nonfinite_count or not result.forward_module or _origin_code(result):
        return None
    return Hit(
        symptom=f"first non-finite output at {result.forward_module} ({result.forward_module_type})",
        evidence={"forward_module": result.forward_module, "forward_module_type": result.forward_module_type},
        score=1.5,
    )


@rule(
    "NNDX609",
    C.EVAL_MODE_FORGOTTEN,
    "error",
    "Randomness that ignores model.eval()",
    detects="The eval-mode probe saw a dropout active with the model in eval mode (ignores_eval), e.g. "
    "F.dropout(x, training=True); in reports without that field, two eval-mode forwards that differ beyond "
    "the probe's rounding tolerance (1e-6 when none is given); or, with the model in eval mode, outputs of the "
    "same samples that change with the rest of the batch (batch statistics used anyway, e.g. "
    "F.batch_norm(..., training=True); a forward that mixes samples with no batch statistics — a sort, a sum over "
    "the batch — is not eval mode and does not fire). Sampling that is not dropout (a VAE) does "
    "not fire, nor does a model the probe only found in train mode (dropout or batch statistics active, "
    "as every model is before training): that is a bug only if you evaluate in that state, which "
    "NNDX306 sees in your loop.",
    why="Evaluation must be deterministic; active dropout or batch statistics make metrics noisy and "
    "wrong, and no call to model.eval() can switch a functional dropout with training=True off.",
    fix="In custom modules pass training=self.training to F.dropout (or use nn.Dropout); call "
    "model.eval() before evaluating.",
)
def eval_mode_probe(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "eval_mode")
    if result is None or result.status != "failed":
        return None
    evidence = {
        "training": result.training,
        "max_abs_diff": result.max_abs_diff,
        "eval_abs_diff": result.eval_abs_diff,
        "batch_dependence_diff": result.batch_dependence_diff,
        "has_dropout": result.has_dropout,
        "has_batchnorm": result.has_batchnorm,
    }
    if result.ignores_eval is not None:  # the probe saw which random op it was (dropout, not sampling)
        ignores_eval = result.ignores_eval
    else:
        ignores_eval = result.eval_abs_diff is not None and result.eval_abs_diff > (result.tolerance or 1e-6)
    if ignores_eval:
        return Hit(symptom="two forwards of the same batch differ in eval mode", evidence=evidence, score=3.0)
    if result.training is False and result.batch_statistics is not False:  # batch statistics used anyway
        # (without them the forward mixes samples in any mode: the sample-independence probe names that)
        return Hit(symptom="in eval mode, the outputs of the same samples change with the rest of the batch",
                   evidence=evidence, score=3.0)  # fmt: skip
    # only the model's train mode at probe time (dropout or batch statistics active): a
    # model is in train mode before training, so this says nothing; evaluating in that state
    # is NNDX306, seen in the loop
    return None


@rule(
    "NNDX610",
    C.LABELS_MISALIGNED,
    "error",
    "Labels do not belong to their inputs",
    detects="The label-alignment probe: a small model trained on the real labels (or real-valued targets) is "
    "not better on held-out data than one trained on permuted ones. Info when the run's own validation accuracy "
    "ends over twice chance and 0.25 above it: labels that do not belong to their inputs never allow that, so "
    "the probe's stand-in (an MLP on the raw inputs) could not read these inputs (point sets, node ids).",
    why="Labels shuffled separately from their inputs, or offset by one, look like valid data but carry "
    "no signal; the network memorises them (so overfit-one-batch passes) and generalises at chance.",
    fix="Shuffle inputs and labels together (one permutation, or a Dataset returning (x, y) pairs); check "
    "indexing and joins.",
    # balanced accuracy of a briefly trained model says little when a class has few samples
    explained_by=(C.CLASS_IMBALANCE,),
)
def labels_misaligned(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "label_alignment")
    if result is None or result.status != "failed":
        return None
    held_out = generalizes(report)
    if held_out is not None and result.real_accuracy is not None:
        return Hit(symptom=f"the probe's small model learned nothing from these labels, but the run's own model "
                   f"reaches {held_out:.3f} validation accuracy: the labels carry signal its stand-in (an MLP on the "
                   "raw inputs) cannot read", severity="info",
                   evidence={"real_accuracy": result.real_accuracy, "permuted_accuracy": result.permuted_accuracy,
                             "chance_accuracy": result.chance_accuracy, "run_val_accuracy": held_out},
                   score=0.5)  # fmt: skip
    if result.real_accuracy is None:  # real-valued targets: the probe compared squared errors
        return Hit(symptom="held-out error with the real targets is no better than with permuted targets",
                   evidence={"probe": result.message}, score=3.0)  # fmt: skip
    return Hit(
        symptom="held-out accuracy on real labels is no better than on permuted labels",
        evidence={
            "real_accuracy": result.real_accuracy,
            "permuted_accuracy": result.permuted_accuracy,
            "chance_accuracy": result.chance_accuracy,
        },
        score=3.0,
    )


@rule(
    "NNDX611",
    C.WRONG_RESHAPE,
    "error",
    "Samples leak into each other's outputs",
    detects="The sample-independence probe replaced the first half of the batch's samples and the eval-mode "
    "outputs of the other samples moved beyond the rounding tolerance.",
    why="In eval mode every sample must be computed on its own. When another sample's output moves, a "
    "layer runs along the batch axis: an LSTM/GRU built with batch_first=False fed (batch, time, features) "
    "runs over the batch, or a view/reshape where permute was meant interleaves samples. Training still "
    "runs and the loss still falls, on the wrong problem.",
    fix="Give recurrent layers the layout they expect (batch_first=True for (batch, time, features), or "
    "x.transpose(0, 1)); reorder axes with permute, not view/reshape; print the shapes through forward.",
)
def samples_mixed(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "sample_independence")
    if result is None or result.status != "failed" or not result.changed_samples or result.reordered \
            or result.batch_reduction:  # fmt: skip
        return None
    return Hit(
        symptom=f"replacing {result.replaced_samples} samples moved the outputs of {result.changed_samples} of "
        f"the other {result.samples - result.replaced_samples}",
        evidence={
            "changed_samples": result.changed_samples,
            "samples": result.samples,
            "max_change": result.max_change,
            "tolerance": result.tolerance,
            "batch_axis": result.batch_axis,
        },
        score=3.0,
    )


@rule(
    "NNDX625",
    C.WRONG_RESHAPE,
    "error",
    "Each input sequence is stitched from pieces of other samples",
    detects="The sample-independence probe, on a time-major floating-point input (samples along its second axis) "
    "of a model with a time-major recurrent layer or cell: neighbouring samples are alike and neighbouring steps "
    "are not (mean distance between neighbours at most 0.8, and at least 0.85, of that between entries half the "
    "axis apart), and the same values read in the other axis order (reshaped to the swapped sizes) give the "
    "reverse: steps alike, samples not. Or, on a 2-d token batch: neither axis has lines that end in padding (a "
    "run of one id that nothing else in the line holds, in a quarter of the lines or more), but the same ids "
    "reshaped to the swapped sizes do.",
    why="Data of shape (batch, time, features) turned time-major with reshape or view instead of transpose (or the "
    "other way round) keeps the memory order: each 'sequence' the model reads is a step of one sample, then a step "
    "of another, while one sample's steps land in neighbouring samples. The shapes are legal, the labels still "
    "belong to the batch's positions, and the model learns what single steps say at best.",
    fix="x.transpose(0, 1) (or permute) to swap time and batch; reshape only to split or merge neighbouring axes. "
    "Print one sample of the batch the model gets: it must read as one sequence.",
)
def stitched_inputs(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "sample_independence")
    if result is None or result.status != "failed" or not result.stitched:
        return None
    ratios = result.stitched
    if "padded_lines_reread" in ratios:
        return Hit(
            symptom="the token batch has padding in the middle of its lines along both axes, while the same ids "
            f"read in the other axis order are sentences ending in padding ({ratios['padded_lines_reread']:.0%} of "
            "them padded): each sequence the model reads is pieces of several",
            evidence={"batch_axis": result.batch_axis, "samples": result.samples, **ratios},
            score=3.0,
        )
    return Hit(
        symptom=f"neighbouring samples of the input are alike ({ratios.get('batch_as_given', float('nan')):.2f}) and "
        f"neighbouring steps are not ({ratios.get('time_as_given', float('nan')):.2f}); read in the other axis order "
        "the values form sequences of independent samples",
        evidence={"batch_axis": result.batch_axis, "samples": result.samples, **ratios},
        score=3.0,
    )


@rule(
    "NNDX620",
    C.WRONG_RESHAPE,
    "error",
    "A recurrent layer reads no context along the sequence",
    detects="The sample-independence probe, on a model with a recurrent layer (RNN, LSTM, GRU or a cell) and "
    "targets per position: replacing the first half of the entries along each axis the inputs share with the "
    "targets moved the outputs of the entries replaced and of no other, along every such axis (a batch of one "
    "sequence, so no axis can be the batch the layer runs over).",
    why="A recurrent layer exists to carry what came before. nn.RNN/LSTM/GRU read (time, batch, features) unless "
    "built with batch_first=True: fed one (1, time, features) sequence, they read a batch of one-step sequences, "
    "and each output sees its own input alone. The loss still falls, to what one step can predict.",
    fix="Build the layer with batch_first=True for (batch, time, features) inputs, or feed it x.transpose(0, 1); "
    "print the shapes the layer sees (its input and its hidden state).",
)
def no_context(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "sample_independence")
    if result is None or result.status != "failed" or not result.no_context:
        return None
    return Hit(
        symptom=f"{result.no_context} carries nothing along the sequence: replacing {result.replaced_samples} of "
        f"{result.samples} positions moved no other position's output",
        evidence={"recurrent_layer": result.no_context, "positions": result.samples, "axis": result.batch_axis,
                  "max_change": result.max_change, "tolerance": result.tolerance},
        score=3.0,
    )


@rule(
    "NNDX619",
    C.SHAPE_BROADCAST,
    "error",
    "A reduction over the whole batch is broadcast onto every sample",
    detects="The sample-independence probe: replacing half of the batch moved the other samples' eval-mode "
    "outputs, the reversed batch gave the same outputs reversed (the samples are coupled through a statistic "
    "of the batch as a whole, not by position), and the forward reduces every axis of a batched tensor "
    "(torch.sum(x), x.mean() with no dim=).",
    why="A per-sample term written as torch.sum(ix) instead of torch.sum(ix, dim=1, keepdim=True) (a "
    "factorisation machine's pairwise term, a norm, a mean) becomes one number for the whole batch, which "
    "broadcasting adds to every sample's output without an error. Each prediction then depends on the other "
    "samples; the loss still falls, to a worse model, and predictions change with the batch they are in.",
    fix="Give the reduction the sample's own axes: x.sum(dim=1, keepdim=True) (or dim=-1), and check the "
    "shape after it: it must keep the batch axis.",
)
def batch_reduction(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "sample_independence")
    if result is None or result.status != "failed" or not result.batch_reduction:
        return None
    return Hit(
        symptom=f"replacing {result.replaced_samples} samples moved the outputs of {result.changed_samples} of the "
        f"other {result.samples - result.replaced_samples}, through a reduction of the whole batch "
        f"({result.batch_reduction})",
        evidence={"reduction": result.batch_reduction, "changed_samples": result.changed_samples,
                  "samples": result.samples, "max_change": result.max_change, "batch_axis": result.batch_axis},
        score=3.0,
    )


@rule(
    "NNDX621",
    C.SHAPE_BROADCAST,
    "error",
    "A sample's output depends on its position in the batch",
    detects="The sample-independence probe: replacing half of the batch moved no other sample's eval-mode output "
    "(each sample is computed on its own), yet the reversed batch gave outputs that are no reordering of the "
    "batch's. With targets per position, only the leading axis is tried, and only when its entries are computed "
    "each on its own (a time-major model's positions read each other). A forward that draws random numbers in eval "
    "mode is not judged.",
    why="A table indexed along the batch axis broadcasts onto the samples without an error: the PyTorch tutorial's "
    "time-major PositionalEncoding, a (max_len, 1, d) buffer added as pe[:x.size(0)], adds to batch-first "
    "(batch, time, d) inputs row b of the table to every position of sample b. The model loses its positions (a "
    "transformer can no longer reverse a sequence) and each prediction changes with where its sample sits in the "
    "batch. The loss still falls, to what a bag of tokens predicts.",
    fix="Index the table along the time axis (pe[:, :x.size(1)] on a (1, max_len, d) table for batch-first "
    "inputs), or feed the layer the (time, batch, d) layout it was written for; print its shapes.",
)
def position_in_batch(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "sample_independence")
    if result is None or result.status != "failed" or not result.position_dependent:
        return None
    return Hit(
        symptom=f"the reversed batch of {result.samples} samples did not give the outputs reversed, though replacing "
        f"{result.replaced_samples} of them moved no other: each output depends on its position in the batch",
        evidence={"samples": result.samples, "batch_axis": result.batch_axis, "tolerance": result.tolerance},
        score=3.0,
    )


@rule(
    "NNDX617",
    C.LABELS_MISALIGNED,
    "error",
    "The model returns its samples in an order of its own",
    detects="The sample-independence probe: replacing half of the batch moved the other samples' eval-mode "
    "outputs, and the reversed batch gave the very same output rows in another order than reversed. Each "
    "sample is computed on its own, then returned sorted (by length, say). A model that returns the ordering "
    "beside its outputs (a sort_ind for the loss) is not flagged.",
    why="Sorting a batch by length for pack_padded_sequence(enforce_sorted=True) and returning the "
    "predictions in that order pairs prediction i with another sample's label i. Nothing crashes: the loss "
    "sits near chance, or the model learns what the sorted order happens to correlate with.",
    fix="Undo the sort before returning (outputs[unsort_idx], with unsort_idx = sort_idx.argsort()), or pack "
    "with enforce_sorted=False, which sorts and unsorts for you.",
)
def samples_reordered(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "sample_independence")
    if result is None or result.status != "failed" or not result.reordered:
        return None
    return Hit(
        symptom=f"the reversed batch's outputs are the batch's own outputs in another order than reversed "
        f"({result.changed_samples} of {result.samples - result.replaced_samples} samples moved when half the "
        "batch was replaced)",
        evidence={"samples": result.samples, "changed_samples": result.changed_samples,
                  "batch_axis": result.batch_axis, "tolerance": result.tolerance},
        score=3.5,
    )


@rule(
    "NNDX618",
    C.DETACHED_GRAPH,
    "info",
    "The forward stops gradients the loss depends on",
    detects="The gradient check disagreed with finite differences, and agreed once the forward's detach() calls "
    "let gradients through: every parameter still gets a gradient, but not along the detached paths. A warning "
    "when a detach's input was computed from an earlier detach's output with no other path for the gradient (a "
    "state detached and computed on, step after step: a recurrence or a tree cut at every step). Info otherwise: "
    "the same holds for stop-gradients on purpose (SimSiam's and BYOL's target branch, a VQ-VAE's "
    "straight-through estimator, which keeps a path); a tensor left with no gradient at all is NNDX615.",
    why="A detach() on a tensor the loss needs through the parameters (a recurrent or ODE state detached inside "
    "each step, a feature detached before a head that should train the body) trains on part of the gradient. "
    "Nothing crashes; the loss falls more slowly or to a worse value.",
    fix="Remove the detach() (or .data) where the gradient should flow; keep it only on targets and "
    "straight-through estimators, where stopping the gradient is the method.",
)
def stop_gradients(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "grad_check")
    if result is None or result.status != "passed" or not result.stop_gradients:
        return None
    chained = result.chained_stop_gradients or 0
    return Hit(
        symptom=f"the backward agrees with finite differences only with the forward's {result.stop_gradients} "
        "detach() calls letting gradients through"
        + (f"; {chained} of them detach a state computed from an earlier detach's output alone, so no gradient "
           "reaches the steps before" if chained else ""),
        evidence={"stop_gradients": result.stop_gradients, "chained_stop_gradients": chained,
                  "max_relative_error": result.max_relative_error},
        severity="warning" if chained else None,
        score=2.0 if chained else 1.0,
    )


@rule(
    "NNDX612",
    C.LABEL_NOISE,
    "warning",
    "Many labels disagree with what the data predicts",
    detects="The label-noise probe: among the samples a cross-validated model predicts most confidently, "
    "the share whose label disagrees has a 95% lower bound over 10%. Error when that bound is over 25%. "
    "When the share reaches 0.9 of what labels drawn at random would give (1 - 1/C), the labels do not belong "
    "to their inputs at all: reported as LABELS_MISALIGNED (info when the run's own validation accuracy ends over "
    "twice chance and 0.25 above it, which random labels never allow: the stand-in could not read the inputs). "
    "A warning when the label-alignment probe, the same stand-in against permuted labels, could not decide, and info "
    "then if the run's own train loss learned: a stand-in that reads nothing in the inputs disagrees at chance too.",
    why="Wrong labels (careless annotation, rows mixed in a join, preprocessing applied to the labels) are "
    "memorised with the right ones: training still converges, and validation accuracy stops short of what "
    "the data allows. Random flips do not care where a sample lies, so they show among confident "
    "predictions, where a merely hard task has no disagreements.",
    fix="Inspect the samples whose labels disagree with confident out-of-sample predictions (the label "
    "pipeline, joins, augmentations applied to labels); relabel or drop them, or train with a noise-robust "
    "loss (label smoothing, a noise-aware loss) if the noise is inherent.",
)
def label_noise(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "label_noise")
    if result is None or result.status != "failed" or result.noise_lower_bound is None:
        return None
    # the probe's own count where the run names none (labels beside a generative model's loss: a CVAE's)
    classes = num_classes(report) or result.classes
    if classes and classes > 1 and result.noise_fraction >= CHANCE_DISAGREEMENT * (1 - 1 / classes):
        # as many disagree as if labels were drawn without looking at the inputs: not
        # noise on top of a signal but labels that do not belong to their inputs — unless the
        # run's own model generalises from them, which random labels never allow
        held_out = generalizes(report)
        if held_out is not None:
            return Hit(symptom=f"{result.noise_fraction:.0%} of the probe's confident predictions disagree with their "
                       f"labels, but the run's own model reaches {held_out:.3f} validation accuracy: its stand-in (an "
                       "MLP on the raw inputs) cannot read these inputs", severity="info",
                       evidence={"noise_fraction": result.noise_fraction, "run_val_accuracy": held_out},
                       score=0.5, code=C.LABELS_MISALIGNED)  # fmt: skip
        alignment = _probe(report, "label_alignment")
        if alignment is not None and alignment.status == "skipped" and alignment.real_accuracy is not None:
            # the label-alignment probe trained the same stand-in on these labels and on permuted ones
            # and could not decide: a stand-in that reads nothing in the inputs (point sets) disagrees
            # with every label as often as with random ones; the run's own loss is the better witness
            learned = loss_learned(report)
            return Hit(symptom=f"{result.noise_fraction:.0%} of the probe's confident predictions disagree with their "
                       "labels, as labels drawn at random would, but the label-alignment probe could not tell the real "
                       "labels from permuted ones either way: its stand-in (an MLP on the raw inputs) may not read "
                       "these inputs" + ("; the run's own loss learned" if learned else ""),
                       severity="info" if learned else None,
                       evidence={"noise_fraction": result.noise_fraction, "chance_disagreement": 1 - 1 / classes,
                                 "alignment_real_accuracy": alignment.real_accuracy,
                                 "alignment_permuted_accuracy": alignment.permuted_accuracy},
                       score=0.5 if learned else 1.5, code=C.LABELS_MISALIGNED)  # fmt: skip
        return Hit(
            symptom=f"{result.noise_fraction:.0%} of confidently predicted labels disagree, as many as labels "
            f"drawn at random from {classes} classes would",
            evidence={"noise_fraction": result.noise_fraction, "chance_disagreement": 1 - 1 / classes,
                      "confident_samples": result.confident_samples, "samples": result.samples},  # fmt: skip
            severity="error",
            score=6.0,
            code=C.LABELS_MISALIGNED,
        )
    return Hit(
        symptom=f"{result.noise_fraction:.0%} of confidently predicted labels disagree (at least "
        f"{result.noise_lower_bound:.0%})",
        evidence={
            "noise_fraction": result.noise_fraction,
            "noise_lower_bound": result.noise_lower_bound,
            "disagreement_fraction": result.disagreement_fraction,
            "confident_samples": result.confident_samples,
            "samples": result.samples,
        },
        severity="error" if result.noise_lower_bound > 0.25 else None,
        score=2.0 + 4.0 * result.noise_lower_bound,
    )


@rule(
    "NNDX613",
    C.LABELS_MISALIGNED,
    "error",
    "Each position is asked to predict the token it is given (not shifted, not masked) or one further off",
    detects="The causality probe: at (nearly) every position the loss scores, the target the loss pulls the "
    "output towards is the last input token that position reads (copy_fraction >= 0.9), or the token 2 or 3 "
    "positions ahead of it or the one before (target_offset), and far more often than it is the next input "
    "token; or, in a sequence model over float steps (frames, vectors) whose targets are its inputs, the output "
    "at a step moves with that step's own input. Which target goes with which output is read from the loss's "
    "gradient, so a loss that shifts internally (labels = input_ids) is not flagged; with several targets and "
    "outputs (BERT's "
    "next-sentence and masked-token heads), the per-token ones are read. With one target per sample over a "
    "window of tokens (a next-character MLP): the target is, in >= 0.9 of the samples, the input token at one "
    "position the model reads (the window slid before the target was taken). Or: the batch's targets are the next "
    "input tokens (>= 0.9), but the loss pairs the outputs with other positions' targets (outputs and targets "
    "flattened in different orders). What a position reads is measured: a "
    "teacher-forced decoder handed its targets reads trg[t - 1] for output t, so output[:-1] against trg[1:] "
    "asks two tokens ahead.",
    why="A next-token model must predict inputs[t + 1] from inputs[..t]; a masked language model must "
    "recover tokens hidden from it. With the answer in the input the loss falls to almost zero, and the model "
    "learns to copy, not to predict. Shifted twice (labels shifted by hand for a Hugging Face model that "
    "shifts them again), it learns the token after next: the loss plateaus well above a right run's. Nothing "
    "crashes, and the falling loss looks like success.",
    fix="Next-token model: shift by one, and once: inputs = tokens[:, :-1], targets = tokens[:, 1:] (or "
    "logits[:, :-1] against labels[:, 1:] in the loss; a Hugging Face model wants labels = input_ids). "
    "Masked language model: replace the scored positions' input tokens "
    "(80% by the mask id, 10% by random ids, 10% kept) before the forward.",
    # a recurrent layer run over the batch, or a view that interleaves batch and time, hands the loss
    # outputs in another layout than the targets: the reshape is the cause, the pairing its effect
    explained_by=(C.WRONG_RESHAPE,),
)
def lm_targets_unshifted(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "causality")
    if result is None or result.status != "failed" or not (result.unshifted or result.target_offset is not None
                                                           or result.batch_next_fraction):  # fmt: skip
        return None
    if result.batch_next_fraction:
        return Hit(symptom=f"the batch's targets are the next tokens at {result.batch_next_fraction:.0%} of the "
                   "positions, but the loss pairs them with outputs of other positions (outputs and targets flattened "
                   "in different orders)",
                   evidence={"batch_next_fraction": result.batch_next_fraction, "next_fraction": result.next_fraction,
                             "scored_positions": result.scored_positions}, score=4.0)  # fmt: skip
    evidence = {
        "copy_fraction": result.copy_fraction,
        "next_fraction": result.next_fraction,
        "scored_positions": result.scored_positions,
        "time_axis": result.time_axis,
    }
    if result.unshifted and result.autoregressive:
        evidence = {"own_input_steps": result.changed_positions, "steps_changed": result.scored_positions}
        symptom = (f"the targets are the steps the model is given: at {result.changed_positions} of "
                   f"{result.scored_positions} steps the output moved with its own input")  # fmt: skip
    elif result.unshifted and result.target_position is not None:
        evidence = {"copy_fraction": result.copy_fraction, "target_position": result.target_position,
                    "samples": result.samples}  # fmt: skip
        symptom = (f"in {result.copy_fraction:.0%} of the samples the target is the input token at position "
                   f"{result.target_position} of the window, which the model reads")  # fmt: skip
    elif result.unshifted:
        symptom = (f"{result.copy_fraction:.0%} of the scored positions' targets are their own input token (the next "
                   f"token: {result.next_fraction:.0%})")  # fmt: skip
    else:
        evidence["target_offset"] = result.target_offset
        symptom = (f"the scored positions' targets are the input token {result.offset_in_words} of the last one "
                   f"each reads (the next token: {result.next_fraction:.0%})")  # fmt: skip
    return Hit(symptom=symptom, evidence=evidence, score=4.0)


@rule(
    "NNDX614",
    C.DATA_LEAKAGE,
    "error",
    "A next-token model sees the tokens it must predict",
    detects="The causality probe, on a model whose loss targets are the next input tokens: changing the "
    "tokens after a position moved the eval-mode outputs at that position or before beyond the rounding "
    "tolerance. On an autoregressive density model over float inputs (targets the inputs themselves, or "
    "quantised from them; outputs that read the other positions one way only: PixelCNN, MADE): changing a "
    "position's input moved its own output. On a model handed float targets verbatim inside a longer input (a "
    "forecaster's decoder input): changing a target's own value there moved the prediction for it.",
    why="The output at position t is trained to predict token t + 1; if it can see token t + 1 it copies it. "
    "The training loss falls towards zero while generation (which has no future tokens) fails. Typical "
    "causes: attention without the causal (tril) mask or with it transposed, a bidirectional LSTM/GRU used "
    "as a language model, a convolution padded on both sides instead of on the left.",
    fix="Mask attention scores above the diagonal (masked_fill(tril == 0, -inf), or is_causal=True); use a "
    "unidirectional recurrent layer; pad convolutions on the left only (F.pad(x, (k - 1, 0))).",
    # attention heads merged back with a view where a permute was due mix the positions: each position then
    # holds values of later ones through the reshape, not through a mask (d2l's transpose_output without permute)
    explained_by=(C.WRONG_RESHAPE,),
)
def lm_sees_future(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "causality")
    if result is None or result.status != "failed" or not result.future_visible:
        return None
    if result.target_input is not None:
        return Hit(
            symptom=f"input {result.target_input} holds the targets verbatim from position {result.target_start}, "
            "and the prediction for a target moves with its own value there",
            evidence={"target_input": result.target_input, "target_start": result.target_start,
                      "moved_positions": result.changed_positions, "max_change": result.max_change,
                      "tolerance": result.tolerance},  # fmt: skip
            score=4.0,
        )
    if result.autoregressive:
        return Hit(
            symptom=f"an autoregressive model's outputs moved with their own input at {result.changed_positions} of "
            f"{result.scored_positions} positions: each sees the value it must predict",
            evidence={"own_input_positions": result.changed_positions, "positions_changed": result.scored_positions,
                      "max_change": result.max_change, "tolerance": result.tolerance},  # fmt: skip
            score=4.0,
        )
    return Hit(
        symptom=f"changing the tokens after position {result.cut} moved the outputs at {result.changed_positions} "
        "earlier positions",
        evidence={
            "changed_positions": result.changed_positions,
            "cut": result.cut,
            "max_change": result.max_change,
            "tolerance": result.tolerance,
            "next_fraction": result.next_fraction,
            "time_axis": result.time_axis,
        },
        score=4.0,
    )


@rule(
    "NNDX622",
    C.WRONG_RESHAPE,
    "error",
    "The text runs across the batch, not along each sequence",
    detects="The causality probe, on a next-token model (targets the next inputs along the time axis): adjacent "
    "input tokens across the batch tell each other at least 0.1 nats more than each token paired with another "
    "sample's token at the same position does (their mutual information: sequences on one template, a start "
    "token at a fixed place, tell their position either way), and over 3x what adjacent tokens along time tell.",
    why="A language model learns from what each token says of the next along its sequence. Text batched as "
    "data.view(-1, batch_size) where data.view(batch_size, -1) was meant (or the PyTorch example's batchify "
    "without its .t(), or with one too many) puts consecutive tokens in consecutive samples: each sequence then "
    "holds every batch_size-th token. The targets are still the next inputs, nothing crashes, and the loss "
    "stays near that of predicting the unigram frequencies.",
    fix="Batch-first: data[: n * batch_size].view(batch_size, -1), each row a stretch of the text; time-major: "
    "data.view(batch_size, -1).t().contiguous(). Print one decoded row of a batch: it must read as text.",
)
def text_across_batch(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "causality")
    if result is None or result.status != "failed" or not result.text_across_batch:
        return None
    return Hit(
        symptom=f"adjacent tokens across the batch tell each other {result.batch_information:.2f} nats, along time "
        f"{result.time_information:.2f}",
        evidence={"batch_information": result.batch_information, "time_information": result.time_information,
                  "time_axis": result.time_axis},  # fmt: skip
        score=4.0,
    )


# padding after each run's first token, as a share of the scored positions: above this the padding
# is a large part of what the model is trained and scored on
SCORED_PADDING = 0.1


@rule(
    "NNDX616",
    C.WRONG_LOSS,
    "warning",
    "The loss scores padding positions",
    detects="The causality probe, on a sequence model whose loss targets are the next tokens: the targets end "
    "in runs of one id (padding to the longest sequence: runs of 2 or more, of varying length, in at least a "
    "quarter of the sequences) and the loss scores them — at least 10% of the scored positions are padding "
    "after each run's first token (that one may be a real end-of-sequence token).",
    why="Without ignore_index (or a mask) the model is trained to predict padding after padding, which is "
    "trivial: the loss and accuracy it reports are inflated by easy positions, and the real tokens get a "
    "smaller share of the gradient. Nothing crashes and the loss looks better than it is.",
    fix="CrossEntropyLoss(ignore_index=pad_id) (or set the padded targets to -100), or multiply the per-token "
    "loss by the padding mask and divide by the number of real tokens.",
)
def padding_scored(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "causality")
    if result is None or result.scored_padding_fraction is None or result.scored_padding_fraction < SCORED_PADDING:
        return None
    return Hit(
        symptom=f"{result.scored_padding_fraction:.0%} of the positions the loss scores are padding (id "
        f"{result.padding_id}) after the end of their sequence",
        evidence={"padding_id": result.padding_id, "scored_padding_fraction": result.scored_padding_fraction,
                  "scored_positions": result.scored_positions},  # fmt: skip
        score=1.0 + result.scored_padding_fraction,
    )

@rule(
    "NNDX626",
    C.WRONG_LOSS,
    "warning",
    "The loss adds a term averaged over the batch to one summed over it",
    detects="The overfit probe's first loss, read off its autograd graph: of its additive terms that reach the "
    "model's outputs, at least one averages over the batch (a torch loss with reduction='mean', .mean()) and at "
    "least one sums over it (reduction='sum', torch.sum of a tensor holding the batch axis). Constant factors "
    "count: a sum divided by at least the batch size is an average, a mean times the batch size a sum. Terms "
    "that never reach the outputs (a penalty on the weights) do not scale with the batch and are left out; a "
    "reduction over pairs of samples (an MMD's kernel matrix, whose weight and divisor read the same) leaves the "
    "whole loss unread.",
    why="The two terms are then weighed by an accident of reduction, not by intent: a mean over N samples of D "
    "values each is divided by N*D, the sum is not, so the summed term weighs thousands of times more per value "
    "and the balance moves with the batch size. A VAE with F.binary_cross_entropy left at its default "
    "reduction='mean' beside a KL divergence written torch.sum(...) trains smoothly while the KL term wins: the "
    "posterior collapses and every reconstruction is the mean image.",
    fix="Reduce every term the same way: sum each over a sample's values and average over the batch "
    "(F.binary_cross_entropy(x_hat, x, reduction='sum') / batch_size + kld.sum() / batch_size), or sum all of "
    "them as the reference implementation does; then weight the terms on purpose (a beta).",
)
def mixed_batch_reductions(report: DiagnosticReport) -> Hit | None:
    result = _probe(report, "overfit_one_batch")
    if result is None or not result.loss_terms:
        return None
    means = [t for t in result.loss_terms if t.reduction == "mean"]
    sums = [t for t in result.loss_terms if t.reduction == "sum"]
    if not means or not sums:
        return None
    averaged = max(means, key=lambda t: t.values)
    weight = (averaged.values or 1) * abs(sums[0].scale / averaged.scale)

    def named(t):
        op = f"torch.{t.op}" if t.op in ("sum", "mean") else t.op
        return f"{op} of {t.values} values" if t.values else op

    return Hit(
        symptom=f"the loss adds {', '.join(named(t) for t in means)}, averaged over the batch, to "
        f"{', '.join(named(t) for t in sums)}, summed over it: per value the summed term weighs about "
        f"{weight:.3g} times the averaged one, and the balance moves with the batch size",
        evidence={"averaged_terms": [named(t) for t in means], "summed_terms": [named(t) for t in sums],
                  "relative_weight": weight},  # fmt: skip
        score=1.0 + min(math.log10(max(weight, 1.0)), 6.0) / 6,
    )

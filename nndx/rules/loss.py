"""Loss-curve rules (NNDX1xx): what the train/val loss history shows.

Every threshold is relative to the curve itself — its initial level and its own
minibatch noise — so a loss of scale 1e4 and one of scale 1e-2 are judged alike, and a
healthy noisy decreasing curve never reads as oscillation.
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import median

from nndx import vocab
from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, LossPoint
from nndx.rules._series import (
    HEALTHY_UPDATE_RATIO, LARGE_UPDATE_RATIO, STEADY_UPDATE_RATIO, Curve, accuracies, adversarial, finite,
    line_search, loss_calls, loss_curve, lr_within_range, no_floor, num_classes, self_targeted,
    slope_significance, starts_fitted, stays_fitted, stepped_lr, train_curve, trains_well_up_to, uninformed_loss, update_ratio_summary, used_lr, window,
)
from nndx.rules.engine import Hit, rule

# Causes that make a loss stop moving; the symptom rules below cite them when present.
NO_LEARNING_CAUSES = (
    C.LR_TOO_HIGH,
    C.LR_TOO_LOW,
    C.OPTIMIZER_NOT_CONNECTED,
    C.DETACHED_GRAPH,
    C.FROZEN_PARAMETERS,
    C.DEAD_RELU,
    C.SATURATED_ACTIVATIONS,
    C.BAD_INIT,
    C.MISSING_ZERO_GRAD,
    C.LR_SCHEDULE_MISUSE,
    C.GRAD_CLIP_TOO_SMALL,
    C.LABELS_MISALIGNED,
    C.LABEL_NOISE,
    C.DOUBLE_SOFTMAX,
    C.WRONG_OUTPUT_ACTIVATION,
    C.WRONG_LOSS,
    C.SHAPE_BROADCAST,
    C.WRONG_RESHAPE,  # the loss scores scrambled positions or samples: nothing consistent to fit
    C.LABEL_DTYPE,
    C.UNNORMALIZED_INPUTS,
    C.UNNORMALIZED_TARGETS,
    C.SILENT_DATA_LOSS,
    C.BROKEN_BACKWARD,
    C.MISSING_ACTIVATION,
    C.UNSHUFFLED_DATA,
)
DIVERGENCE_CAUSES = (
    C.LR_SCHEDULE_MISUSE,  # a schedule that cycles back to its peak, or takes the LR below zero
    C.MISSING_ZERO_GRAD,
    C.GRAD_ACCUM_SCALING,
    C.UNNORMALIZED_INPUTS,
    C.UNNORMALIZED_TARGETS,
    C.BAD_INIT,
)
NONFINITE_CAUSES = (C.NAN_IN_DATA, C.LOG_OF_ZERO, C.DIVISION_BY_ZERO, C.NUMERICAL_OVERFLOW)


def _first_nonfinite(report: DiagnosticReport) -> tuple[int, int, float] | None:
    """(index, step, value) of the first non-finite train loss."""
    for i, point in enumerate(train_curve(report)):
        if not math.isfinite(point.value):
            return i, point.step, point.value
    return None


def _nonfinite_from_start(report: DiagnosticReport, want_nan: bool) -> Hit | None:
    first = _first_nonfinite(report)
    if first is None or first[0] > 1 or math.isnan(first[2]) != want_nan:
        return None
    index, step, value = first
    return Hit(
        symptom=f"train loss is {value} at step {step}, recorded point {index}",
        evidence={"first_nonfinite_step": step, "first_nonfinite_index": index, "loss": value},
        score=2.0,
        step=step,
        next_probe="nan_origin on the model as initialised (names the first module whose output is "
        "non-finite) and check_data",
    )


@rule(
    "NNDX101",
    C.LOG_OF_ZERO,
    "error",
    "Loss is infinite from the first steps",
    detects="A train loss that is +Inf or -Inf at one of the first two recorded steps, before any update "
    "could have pushed the weights out of range.",
    why="At step 0 the learning rate has not acted yet, so the infinity comes from the forward pass or "
    "the loss: -log(0) = +Inf when a probability underflows to exactly 0 (unclamped softmax, a "
    "hand-written cross-entropy), or an exp that overflows.",
    fix="Compute the loss in log space (log_softmax, CrossEntropyLoss / BCEWithLogitsLoss on logits) or "
    "clamp probabilities before log (p.clamp_min(1e-12)); subtract the max before exp.",
    explained_by=NONFINITE_CAUSES + (C.BAD_INIT, C.UNNORMALIZED_INPUTS),
    symptom=True,
)
def infinite_from_start(report: DiagnosticReport) -> Hit | None:
    return _nonfinite_from_start(report, want_nan=False)


@rule(
    "NNDX110",
    C.NUMERICAL_OVERFLOW,
    "error",
    "Loss is NaN from the first steps",
    detects="A train loss that is NaN at one of the first two recorded steps, before any update could "
    "have pushed the weights out of range.",
    why="NaN at step 0 comes from the data or the forward pass: inf/inf from an exp that overflowed (a "
    "softmax without the max-subtraction trick), 0/0 from a division by a zero std, the log of a "
    "negative number, or NaN already in the inputs.",
    fix="Check the inputs for NaN; subtract the max before exp (or use torch.softmax / log_softmax); add "
    "eps to every division and inside sqrt.",
    explained_by=NONFINITE_CAUSES + (C.BAD_INIT, C.UNNORMALIZED_INPUTS),
    symptom=True,
)
def nan_from_start(report: DiagnosticReport) -> Hit | None:
    return _nonfinite_from_start(report, want_nan=True)


@rule(
    "NNDX102",
    C.LR_TOO_HIGH,
    "error",
    "Loss became NaN/Inf after training started",
    detects="A train loss that is finite for several recorded steps and then NaN or infinite.",
    why="When the first steps are finite the forward pass can compute the loss; the weights were then "
    "pushed out of range — most often by a learning rate too high or gradients that explode.",
    fix="Lower the learning rate (10x), add gradient clipping (clip_grad_norm_), check for exploding "
    "gradients; if the NaN coincides with one batch, check that batch for NaN/Inf.",
    # a loss with no floor (NLLLoss on raw scores, a KL term subtracted) ends in -inf at any LR
    explained_by=(C.LR_TOO_HIGH, C.WRONG_LOSS) + DIVERGENCE_CAUSES + NONFINITE_CAUSES,
    symptom=True,
)
def nonfinite_after_steps(report: DiagnosticReport) -> Hit | None:
    first = _first_nonfinite(report)
    if first is None or first[0] <= 1:
        return None
    index, step, value = first
    before = finite([p.value for p in train_curve(report)[:index]])
    rose = before[-1] > before[0] if len(before) >= 2 else False
    return Hit(
        symptom=f"train loss finite for {index} recorded steps, then {value} at step {step}"
        + (" after rising" if rose else ""),
        evidence={
            "first_nonfinite_step": step,
            "finite_points_before": index,
            "loss_at_start": before[0],
            "last_finite_loss": before[-1],
            "loss": value,
        },
        score=2.0 + (1.0 if rose else 0.0),
        step=step,
        next_probe="lr_range (compare the used LR with diverged_at_lr) and nan_origin",
    )


# a loss that fell this share from its very first value has learned: a later stall is no verdict on the LR
LEARNED_DROP = 0.3
# recorded steps of update ratios it takes to say the steps stayed small
MIN_RATIO_STEPS = 10


def _train_accuracy_rose(report: DiagnosticReport) -> bool:
    """Whether a logged train accuracy (6 points or more) rose by more than 0.05 from its first tenth to its
    last (medians): whatever the loss says, the model learned something."""
    logged = accuracies(report, "train")
    w = window(len(logged))
    return len(logged) >= 6 and median(logged[-w:]) - median(logged[:w]) > 0.05


@rule(
    "NNDX103",
    C.LR_TOO_LOW,
    "warning",
    "Loss is not decreasing",
    detects="A train loss whose last tenth (median) is within 5% of its first tenth, or over 10% above "
    "its very first value, over at least 10 recorded steps, with no accuracy gain either. Judged relative to the initial loss, so the "
    "rule does not depend on the loss's scale. Info when the loss starts under half the loss of a prediction that "
    "ignores the inputs (ln C, or the targets' variance for MSE) and has not risen from its first value or still "
    "ends under that half: the model already fits, as a pretrained one does. A loss that ends above twice its "
    "start (or 10x its very first value) climbed: that is NNDX104's divergence, not this. Info for a logged loss "
    "that runs through another trained network (a GAN's generator loss: it need not fall), and for a loss that "
    "computes its targets from the model's output (DEC's self-training: its objective moves with the model). "
    "At an LR within 3x of "
    "the range the LR range test trains well in, the finding says so and ranks after other symptoms (info when "
    "LR x 10 did not help either: two measurements against the LR), and is info "
    f"when the loss first fell by {LEARNED_DROP:.0%} or more from its very first value (it learned, then stalled). "
    "Info too, and refuted, when the measured update/weight ratios peak above 0.1 (NNDX205's reading): steps that "
    "large are not too small, whatever holds the loss (a healthy SGD language model at lr 30 early in a short run). "
    f"When their median over the run ({MIN_RATIO_STEPS} recorded steps or more) is at healthy training's ~1e-3 or "
    "above, the finding says so and ranks after other symptoms, as at an LR the range test trains well at; and "
    "is info when the loss still falls at that pace (its least-squares slope two standard errors or more below "
    "zero, ending under its first value): a short run, as a federated client's few local steps, not a small step. "
    "Silent on a "
    "loss that hovers around zero (a fifth or more of its second half on each side): an objective with no floor, "
    "as a policy gradient's, makes no progress to measure.",
    why="A loss that does not move means no useful update reaches the weights: the LR is far too "
    "low (or too high and bouncing), units are dead, the optimizer is not connected, or the data "
    "and labels do not match.",
    fix="Run the LR range test and train at its suggestion; check that the optimizer holds the "
    "model's parameters, that gradients reach every layer, and that labels belong to their inputs.",
    explained_by=NO_LEARNING_CAUSES + (C.VANISHING_GRADIENTS,),
    symptom=True,
)
def not_decreasing(report: DiagnosticReport) -> Hit | None:
    points = train_curve(report)
    curve = loss_curve(report)
    if curve.n < 10 or len(curve.values) < len(points) or no_floor(report):  # NaN curves have their own rules
        return None
    if curve.start > 0 and (curve.end > 2 * curve.start or curve.end > 10 * curve.initial > 0):
        return None  # a loss that climbed is diverging (NNDX104), not short of a larger step
    # ended clearly above its very first value (after a blow-up, say) counts as not decreasing
    from_initial = (curve.initial - curve.end) / max(abs(curve.initial), 1e-12)
    if curve.progress >= 0.05 and from_initial >= -0.1:
        return None
    if _train_accuracy_rose(report):
        return None
    frozen = curve.noise == 0.0 and curve.start == curve.end
    # the LR range test trains well within 3x of the LR used: the LR is not what stopped it,
    # so the symptom stays and its LR_TOO_LOW guess ranks after other symptoms' guesses
    sweep = report.probes.lr_range if report.probes is not None else None
    lr = used_lr(report)
    lr_fine = (lr is not None and sweep is not None and sweep.status == "passed" and sweep.interval_low_lr is not None
               and sweep.interval_high_lr is not None and sweep.interval_low_lr / 3 <= lr <= 3 * sweep.interval_high_lr)
    # a fitted start's first value can be a batch it memorised: rising from there while staying
    # under half an uninformed prediction's loss is still a model that fits
    fitted = starts_fitted(report) and (from_initial >= -0.1 or stays_fitted(report))
    # fell far from its first value, then stalled, at an LR the range test trains well at: the
    # model learned, and what holds the logged loss up now (a term that grows by design, as a
    # beta-VAE's capacity ramp) is no evidence against the LR
    learned_first = lr_fine and from_initial >= LEARNED_DROP
    # the steps were measured large (NNDX205's reading): whatever holds the loss, a step too small is not it
    updates = update_ratio_summary(report)
    big_steps = updates is not None and updates[0] > LARGE_UPDATE_RATIO
    # steps of healthy training's size over the run: not too small either, so the LR guess ranks after
    # other symptoms' (labels at chance, units dead), as at an LR the range test trains well at
    sized = (not big_steps and updates is not None and updates[2] >= MIN_RATIO_STEPS
             and updates[1] >= HEALTHY_UPDATE_RATIO)  # fmt: skip
    # falling, only slowly, at steps of that size: the loss moves at healthy training's pace and the
    # run is short for the task (a federated client's few local steps), no step too small
    slow_fall = sized and slope_significance(curve.values) <= -2.0 and curve.end < curve.initial
    return Hit(
        severity="info" if fitted or learned_first or big_steps or slow_fall or adversarial(report)
        or self_targeted(report) else None,
        symptom=("train loss did not change at all" if frozen else "train loss is not decreasing")
        + (" from a level the model already fits to (under half an uninformed prediction's loss)" if fitted else "")
        + (f" after falling {from_initial:.0%} from its first value" if learned_first else "")
        + (f" at lr {lr:.3g}, within 3x of the range the LR range test trains well in: not the LR" if lr_fine
           else "")
        + (f", with update/weight ratios up to {updates[0]:.3g}: the steps are large, not too small" if big_steps
           else f", with a median update/weight ratio of {updates[1]:.2g} (healthy training's is ~1e-3): the steps "
           "are not too small" + (", and it falls steadily at that pace: the run is short for the task" if slow_fall
                                  else "") if sized and updates is not None and not lr_fine else ""),
        evidence={
            "loss_initial": curve.initial,
            "loss_start": curve.start,
            "loss_end": curve.end,
            "relative_progress": min(curve.progress, from_initial),
            "relative_noise": curve.relative_noise,
            "points": curve.n,
        },
        refuted=big_steps or lr_fine,
        score=0.5 if lr_fine or big_steps or sized
        else 1.0 + (1.0 if frozen else 0.0) + min(3.0, max(0.0, -min(curve.progress, from_initial))),
        next_probe="lr_range and overfit_one_batch",
    )


@rule(
    "NNDX104",
    C.LR_TOO_HIGH,
    "warning",
    "Loss is oscillating or diverging",
    detects="A train loss that jumps above 10x its first values (10x its level over the first fifth of the run, "
    "when larger, for a loss that goes below zero or runs through another trained network; a single such jump under "
    "10x the run's median that the loss comes back from, the median of the points after it under the jump, is one "
    "hard batch), or is above twice "
    "its initial level at "
    "least twice in its second half (for a loss that starts under half an uninformed prediction's, "
    "both also above that prediction's loss), or whose step-to-step swings "
    "exceed 25% of the initial loss while it makes under 50% progress (info when those swings are all "
    "there is and the loss still made 20% progress, or started under half an uninformed prediction's loss; info "
    "too when the loss ends under half its start without a jump to 10x: spikes around so low a level are single "
    "hard samples of a small batch; and when its jumps to 10x all fall in the run's first tenth (its first 3 points "
    "on a short run) and it ends under half "
    "its first value: an early overshoot the run recovered from; and without a jump to 10x for a logged loss that runs "
    "through another trained "
    "network, as a GAN's generator loss does). Losses logged inside optimizer.step(), several per step (L-BFGS's "
    "closure evaluations, its line search's rejected trial points among them), count jumps and spikes only when "
    "they are a tenth of the points or more. Info too, without jumps to 10x on 1% of the points or more (or any to "
    "100x), when the loop stepped at an LR within twice the top of the range where the LR range test trains well: "
    "a loss that climbs there is not "
    "overshooting (a value network's bootstrapped targets grow as its estimates do); and when the loss hovers "
    "around zero (a fifth or more of its second half on each side): an objective with no floor, a policy "
    "gradient's, swings by its returns; and when the measured update/weight ratios (NNDX205's windowed median, "
    f"{MIN_RATIO_STEPS} recorded steps or more) stay at or under 0.01: an overshoot makes large steps, and a loss "
    "that climbs beside small ones climbs with its targets (IQL's value loss as the Q-values grow toward the "
    "returns). Those three refute the LR: the finding then roots no other finding.",
    why="Updates that overshoot make the loss bounce and climb; healthy minibatch noise is small "
    "relative to the initial loss and rides on a downward trend, so it does not trip this rule.",
    fix="Lower the learning rate (try 10x lower), or use a warm-up; if the batch is tiny, increase it.",
    explained_by=(C.LR_TOO_HIGH, C.BATCH_TOO_SMALL, C.UNSHUFFLED_DATA) + DIVERGENCE_CAUSES,
    symptom=True,
)
def oscillating(report: DiagnosticReport) -> Hit | None:
    curve = loss_curve(report)
    if curve.n < 10 or curve.start <= 0:
        return None
    after = curve.values[curve.n // 2 :]
    # a loss that starts where the model already fits (a pretrained backbone) is so small that
    # its minibatches swing by multiples of it; it diverges only when it climbs past what a
    # prediction that ignores the inputs would get
    floor = (uninformed_loss(report) or 0.0) if starts_fitted(report) else 0.0
    spikes = sum(1 for v in after if v > max(2.0 * curve.start, floor))
    # a jump to 10x the first values: healthy noise never does that, an overshoot does
    reference = _jump_reference(report, curve)
    jump = max(10.0 * reference, floor)
    blow_ups = sum(1 for v in curve.values[1:] if reference > 0 and v > jump)
    # one jump, under 10x the run's median and come back from (the median of the points after it back
    # under the jump), is one hard batch of a small batch measured against a lucky first one: no divergence
    if blow_ups == 1:
        at = next(i for i, v in enumerate(curve.values) if i > 0 and v > jump)
        after = curve.values[at + 1 :]
        hard_batch = curve.values[at] < 10.0 * median(curve.values) and len(after) >= 5 and median(after) <= jump
        blow_ups = 0 if hard_batch else blow_ups
    # jumps confined to the run's first tenth, the loss then ending under half its first value: an overshoot
    # the run recovered from (fastbook's from-scratch MLP, 3.4 -> 115 -> 0.2), context for a warm-up
    jumps_at = [i for i, v in enumerate(curve.values) if i > 0 and reference > 0 and v > jump]
    recovered = bool(jumps_at) and max(jumps_at) < max(3, curve.n // 10) and curve.end < 0.5 * curve.initial
    if line_search(report):  # a line search's rejected trial points: only a sustained climb counts
        spikes = spikes if spikes >= max(2, len(after) // 10) else 0
        blow_ups = blow_ups if blow_ups >= max(2, curve.n // 10) else 0
    swinging = curve.relative_noise > 0.25 and curve.progress < 0.5
    if spikes < 2 and not swinging and not blow_ups:
        return None
    # swings alone, on a loss that still falls (a fifth of the way or more), are as likely
    # minibatch noise on a task that starts near its floor: context, not an alarm
    # or on a loss that starts where the model already fits (a pretrained backbone): the
    # swings of minibatches are large next to so small a level
    # or on a loss that ends under half its start: spikes over twice the start around so low a
    # level are single hard samples of a small batch (one sample per step: a misclassified
    # one's loss is several times the mean), not a loss that climbs
    noisy_but_learning = (recovered and spikes < 2) or not blow_ups and (
        adversarial(report) or curve.progress >= 0.5 or spikes < 2 and (curve.progress >= 0.2 or starts_fitted(report)))
    # the range test, on a copy from the same start, trains well at this LR: whatever makes the
    # loss climb (targets that move with the model, as TD learning's do), it is not the step size
    # (a few jumps to 10x, none to 100x, are a hard target-network sync, not an overshoot: a DQN's TD loss)
    transient = blow_ups < max(1, curve.n // 100) and max(curve.values) < 100.0 * curve.initial
    lr_fine = (not blow_ups or transient) and lr_within_range(report)
    floorless = no_floor(report)
    # the measured steps stayed sane (Adam's, near 1e-3 of the weights): an overshoot makes large ones,
    # so what makes this loss climb is its targets (a value network's, regressed on returns that grow)
    updates = update_ratio_summary(report)
    step_peak = updates[0] if updates is not None and updates[2] >= MIN_RATIO_STEPS else None
    small_steps = step_peak is not None and step_peak <= STEADY_UPDATE_RATIO
    return Hit(
        severity="info" if noisy_but_learning or lr_fine or floorless or small_steps else None,
        refuted=lr_fine or floorless or small_steps,
        symptom="train loss swings on both sides of zero: an objective with no floor (a policy gradient's), whose "
        "swings are no overshoot" if floorless
        else f"train loss climbs or swings at lr {stepped_lr(report):.3g}, where the LR range test still trains "
        f"well (up to {trains_well_up_to(report):.3g}): not an overshoot" if lr_fine and not noisy_but_learning
        else f"train loss climbs or swings while the steps stay at most {step_peak:.2g} of the weights (median "
        "update/weight ratio): not an overshoot" if small_steps and not noisy_but_learning
        else f"train loss jumped to {max(curve.values) / curve.initial:.3g}x its first value in its first "
        f"{max(jumps_at) + 1} points, then fell to {curve.end:.3g}: an early overshoot the run recovered from (a "
        "warm-up avoids it)" if recovered and noisy_but_learning
        else "train loss is diverging" if (spikes >= 2 and not noisy_but_learning) or blow_ups
        else f"train loss rises over twice its start {spikes} times; it runs through another trained network "
        "(an adversarial loss rises as its opponent improves)" if adversarial(report)
        else f"train loss spikes over twice its start {spikes} times while its level fell" if spikes >= 2
        else "train loss is oscillating",
        evidence={
            "loss_initial": curve.initial,
            "loss_start": curve.start,
            "loss_max": max(curve.values),
            "points_above_10x_initial": blow_ups,
            "points_above_2x_start": spikes,
            "relative_noise": curve.relative_noise,
            "relative_progress": curve.progress,
        },
        score=1.0 + min(5.0, curve.relative_noise + (spikes + blow_ups) / max(1, len(after))),
        next_probe="lr_range",
    )


def _jump_reference(report: DiagnosticReport, curve: Curve) -> float:
    """The level a jump to 10x is measured against: the first value, for a loss that is never
    negative and runs through no other trained network. Otherwise the first value has no
    scale in it: SN-GAN's hinge generator loss -D(G(z)) starts at 0.04, the untrained
    critic's ~0, and crosses zero as the critic learns; its level over the first fifth of the
    run stands in when larger."""
    if min(curve.values) >= 0 and not adversarial(report):
        return curve.initial
    first = [abs(v) for v in curve.values[: max(1, curve.n // 5)]]
    return max(curve.initial, median(first))


def _lr_decays(report: DiagnosticReport) -> bool:
    if report.loop is None or len(report.loop.lr_history) < 2:
        return False
    firsts = [max(finite(p.lrs) or [0.0]) for p in sorted(report.loop.lr_history, key=lambda p: p.step)]
    # from its peak: a warm-up first (Hugging Face's linear schedule starts at 0) is no decay, nor is it constant
    peak = max(range(len(firsts)), key=lambda i: firsts[i])
    return min(firsts[peak:]) < 0.5 * firsts[peak]


@rule(
    "NNDX105",
    C.NO_LR_SCHEDULE,
    "info",
    "Loss decreased, then plateaued at a constant learning rate",
    detects="A train loss that fell by over 30% in its first half and, over its second half, moved less "
    "than 2% of its initial level or a twentieth of the first half's drop, or (at the noise floor) fell "
    "by less than its step-to-step minibatch noise while that noise exceeds the loss level, with a "
    "learning rate that never decayed. A loss under 1% of its start, or under 5% and quieter than its own "
    "level, has converged and is left alone, as is one that hovers around zero (no floor to plateau above).",
    why="A plateau at a constant LR often means the step is too large to settle into the minimum; "
    "a decay usually buys another drop. A noisy task also plateaus legitimately, so this is context, "
    "not an alarm.",
    fix="Add a schedule (ReduceLROnPlateau, cosine or step decay stepped per epoch).",
    explained_by=(C.LR_TOO_HIGH,),
    symptom=True,
)
def plateau(report: DiagnosticReport) -> Hit | None:
    curve = loss_curve(report)
    if curve.n < 20 or _lr_decays(report) or no_floor(report):
        return None
    first_half = curve.values[: curve.n // 2]
    first_half_progress = (curve.start - median(first_half[-window(len(first_half)) :])) / curve.scale
    second_half_progress = curve.second_half_progress()
    flat = abs(second_half_progress) < max(0.02, 0.05 * first_half_progress)
    # at a constant LR, SGD settles into a noise ball whose size grows with the LR: there the
    # minibatch loss swings by more than its own level, and the second half's whole drop is
    # smaller than one step's swing
    at_noise_floor = second_half_progress * curve.scale < curve.noise and curve.noise >= curve.end
    if first_half_progress < 0.3 or not (flat or at_noise_floor):
        return None
    # converged, nothing left to gain: under 1% of the start, or under 5% with steps quieter than the level
    if curve.end < 0.01 * curve.start or (curve.end < 0.05 * curve.start and curve.noise < curve.end):
        return None
    return Hit(
        symptom="train loss plateaued after decreasing",
        evidence={
            "loss_start": curve.start,
            "loss_end": curve.end,
            "first_half_progress": first_half_progress,
            "second_half_progress": second_half_progress,
            "step_noise": curve.noise,
        },
        score=first_half_progress,
    )


@rule(
    "NNDX106",
    C.VANISHING_GRADIENTS,
    "warning",
    "Loss stuck at ln(num_classes): the model predicts uniformly",
    detects="A classification loss that stays within 5% of ln(C), the loss of a uniform prediction "
    "over C classes, from start to end of at least 10 recorded steps.",
    why="The output layer produces (nearly) constant logits: no usable gradient reaches the layers "
    "that decide the output — dead units, vanishing gradients, a disconnected optimizer — or the "
    "labels are unlearnable.",
    fix="Check the output layer and the gradients flowing to it (layer statistics); check for dead "
    "ReLUs and that the optimizer holds the parameters; then check label alignment.",
    explained_by=NO_LEARNING_CAUSES + (C.VANISHING_GRADIENTS,),
    symptom=True,
)
def stuck_at_chance(report: DiagnosticReport) -> Hit | None:
    at_chance = _at_chance(report)
    if at_chance is None:
        return None
    classes, chance, curve = at_chance
    return Hit(
        symptom=f"train loss stays at ln({classes}) = {chance:.4f}",
        evidence={"num_classes": classes, "ln_num_classes": chance, "loss_start": curve.start, "loss_end": curve.end},
        score=2.0 - abs(curve.end - chance) / chance,
        next_probe="hooks (layer statistics: dead units, gradient flow) and label_alignment",
    )


def _at_chance(report: DiagnosticReport, points: int = 10) -> tuple[int, float, Curve] | None:
    """(classes, ln C, the train curve) when a classification loss starts and ends within 5% of
    ln C, the loss of a uniform prediction, over ``points`` recorded steps or more."""
    classes = num_classes(report)
    curve = loss_curve(report)
    if classes is None or classes < 2 or curve.n < points or len(curve.values) < curve.n:
        return None
    chance = math.log(classes)
    near = lambda v: abs(v - chance) <= 0.05 * chance  # noqa: E731
    return (classes, chance, curve) if near(curve.end) and near(curve.start) else None


CHANCE_POINTS = 20  # recorded steps at chance, with a model that fits and healthy steps, to blame the labels


@rule(
    "NNDX112",
    C.LABELS_MISALIGNED,
    "warning",
    "The loss stays at chance though the model fits a batch with steps of healthy size",
    detects=f"A classification loss within 5% of ln(C) from start to end over {CHANCE_POINTS} recorded steps or "
    "more (and no train accuracy gain), while the overfit probe fitted one batch, the run's measured update/weight "
    f"ratios have a median of healthy training's ~1e-3 or more ({MIN_RATIO_STEPS} recorded steps or more) and "
    "peak at 0.1 or less, and the loss calls measured saw targets of two or more values in most batches (a GAN's "
    "discriminator is scored on batches of one label: its loss sits near ln 2 by design).",
    why="The model and the loss can fit (the probe memorised a batch), and the loop moves the weights at a "
    "healthy pace, yet the run never gets better than a uniform guess: what the loop pairs with each input "
    "carries nothing the inputs say. Labels shuffled or sorted apart from their inputs (a bucket iterator that "
    "sorts the texts and their lengths but not the labels), an index offset, or inputs scrambled before the "
    "model do this; a network memorises a batch of random labels just as well, so the probe alone cannot tell.",
    fix="Print a few inputs beside the labels the loop gives them; shuffle and sort inputs, lengths and labels "
    "with one index; pass the training data to nndx.probe(..., data=(x, y)) to run the label-alignment probe.",
    # (a batch of two keeps the loss at chance through noise alone, at any step size)
    explained_by=tuple(c for c in NO_LEARNING_CAUSES if c not in (C.LABELS_MISALIGNED, C.LR_TOO_LOW))
    + (C.BATCH_TOO_SMALL,),
)
def chance_though_fits(report: DiagnosticReport) -> Hit | None:
    at_chance = _at_chance(report, CHANCE_POINTS)
    overfit = report.probes.overfit_one_batch if report.probes is not None else None
    updates = update_ratio_summary(report)
    if at_chance is None or overfit is None or overfit.status != "passed" or updates is None:
        return None
    peak, typical, steps = updates
    if steps < MIN_RATIO_STEPS or typical < HEALTHY_UPDATE_RATIO or peak > LARGE_UPDATE_RATIO:
        return None
    calls = loss_calls(report)
    measured = sum(c.measured_batches for c in calls)
    if not measured or 2 * sum(c.single_target_batches for c in calls) >= measured:
        return None
    if _train_accuracy_rose(report):
        return None
    classes, chance, curve = at_chance
    return Hit(
        symptom=f"the train loss stays at ln({classes}) = {chance:.4f} over {curve.n} recorded steps, while the "
        f"overfit probe fitted one batch in {overfit.steps} steps and the run's updates were {typical:.2g} of the "
        "weights (healthy training's ~1e-3): the model can fit and the steps are not too small, so what the loop "
        "pairs with the inputs carries nothing they say",
        evidence={"num_classes": classes, "loss_start": curve.start, "loss_end": curve.end, "points": curve.n,
                  "overfit_steps": overfit.steps, "median_update_ratio": typical},  # fmt: skip
        score=2.5,
        next_probe="label_alignment (pass the training data as data=(x, y))",
    )


OPPONENT_BEATEN = 1e-3  # of its start: a loss through a trained opponent that the opponent no longer resists


@rule(
    "NNDX113",
    C.WRONG_LOSS,
    "warning",
    "A loss through a trained opponent falls to zero",
    detects=f"A train loss that runs through another trained network's parameters (a GAN's generator loss through "
    f"the discriminator), never below zero, whose last tenth (median) ends under {OPPONENT_BEATEN:g} of its first "
    "three points (median), over at least 10 recorded steps. Not a discriminator's (a model fed the other's "
    "outputs beside data): its loss at zero is a generator that lost, whatever the cause.",
    why="A generator's loss measures how well it fools a discriminator that trains at the same time to resist it; "
    "in a healthy game neither wins outright, and the generator's loss stays near its opponent's level (about ln 2 "
    "to a few nats for BCE). Driven to zero, the opponent agrees with it: the generator trained toward the label the "
    "discriminator gives fakes (fake_loss(D(G(z))) where real_loss was meant, zeros_like where ones_like was "
    "meant), so both minimise the same thing and the samples never improve; or the discriminator does not train.",
    fix="Train the generator toward the real label (BCE(D(G(z)), ones)), the discriminator toward real on data and "
    "fake on samples; check that the discriminator's optimizer steps its parameters.",
)
def opponent_beaten(report: DiagnosticReport) -> Hit | None:
    curve = loss_curve(report)
    if not adversarial(report) or curve.n < 10 or len(curve.values) < curve.n or min(curve.values) < 0:
        return None
    if report.loop is not None and report.loop.fed_inputs:
        return None  # a discriminator, fed the generator's samples beside data: a loss at zero is its opponent failing
    first = median(curve.values[:3])  # the first tenth's median may already be the collapse (udacity's: 6e-8)
    if first <= 0 or curve.end > OPPONENT_BEATEN * first:
        return None
    return Hit(
        symptom=f"the loss through its opponent fell from {first:.3g} to {curve.end:.3g}: the opponent no longer "
        "resists it",
        evidence={"loss_first": first, "loss_end": curve.end, "points": curve.n},
        score=2.0,
    )


def _val_turn(report: DiagnosticReport) -> tuple[Curve, Curve, float, int] | None:
    """(train, val, val minimum, index of the minimum) when both curves are usable."""
    train = loss_curve(report)
    val_points = train_curve(report, "val")
    val = loss_curve(report, "val")
    if train.n < 5 or val.n < 5 or len(val.values) < len(val_points):
        return None
    smooth = val.smooth
    best = min(range(len(smooth)), key=lambda i: (smooth[i], i))
    return train, val, smooth[best], best


@rule(
    "NNDX107",
    C.OVERFITTING,
    "warning",
    "Validation loss rises while train loss falls (overfitting)",
    detects="A validation loss whose smoothed curve bottomed out and then rose by over 10% of its "
    "minimum (and by more than its noise) while the train loss kept falling. Or a train loss that fell "
    "under a tenth of its start and a twentieth of the validation loss while validation stopped improving: a warning "
    "when validation improved by under 10% of its first value (the train set was memorised), info otherwise.",
    why="The model fits the training set's noise instead of the signal; every further epoch makes "
    "it worse on new data.",
    fix="Stop early at the validation minimum; add weight decay, dropout or augmentation; get more "
    "data; use a smaller model.",
    # gradients never reset step ever larger: the model grows overconfident and the validation loss climbs
    explained_by=(C.DATA_LEAKAGE, C.LABELS_MISALIGNED, C.LABEL_NOISE, C.DUPLICATE_SAMPLES, C.MISSING_ZERO_GRAD),
)
def overfitting(report: DiagnosticReport) -> Hit | None:
    turn = _val_turn(report)
    if turn is None:
        return None
    train, val, val_min, best = turn
    rise = val.end - val_min
    if best >= val.n - window(val.n) or rise <= 0.1 * abs(val_min) or rise <= 2 * val.noise:
        return _memorised(train, val)
    # falling at the end and over the run: a train loss that climbed (gradients summed over steps) and
    # dipped late is no fit that validation failed to follow
    if train.second_half_progress() <= 0 or train.end >= train.start:
        return None
    return Hit(
        symptom="validation loss rose after its minimum while train loss kept falling",
        evidence={
            "val_min": val_min,
            "val_min_step": val.points[best].step,
            "val_end": val.end,
            "train_end": train.end,
            "relative_rise": rise / max(abs(val_min), 1e-12),
        },
        score=rise / max(abs(val_min), 1e-12),
        step=val.points[best].step,
    )


def _memorised(train: Curve, val: Curve) -> Hit | None:
    """The other face of overfitting: the train loss fell to a tenth of its start and under a
    twentieth of the validation loss, which has stopped improving. A warning when validation barely improved
    at all (under 10%): nothing learned carries over. Context otherwise: a well-trained model on
    a small data set often ends that way, and more data or regularisation is a choice."""
    if train.start <= 0 or val.end <= 0 or train.end > 0.1 * train.start or train.end > 0.05 * val.end:
        return None
    if val.second_half_progress() > 0.05:  # validation still improving
        return None
    # from its first value: validation is measured rarely, and a first window's median can
    # already sit past most of its improvement
    first = val.initial
    improved = (first - val.end) / first if first > 0 else 0.0
    transfers = improved >= 0.1
    return Hit(
        severity="info" if transfers else None,
        symptom=f"train loss fell to {train.end:.3g} while validation stopped at {val.end:.3g}"
        + ("" if transfers else f", barely below its first value {first:.3g}: the train set was memorised"),
        evidence={"train_start": train.start, "train_end": train.end, "val_first": first, "val_end": val.end,
                  "val_relative_progress": improved},  # fmt: skip
        score=1.0 + min(2.0, math.log10(val.end / max(train.end, 1e-12)) / 2),
    )


@rule(
    "NNDX108",
    C.UNDERFITTING,
    "info",
    "Train and validation loss both plateaued high (underfitting?)",
    detects="Train and validation losses that agree within 20% and both stopped improving over the "
    "second half while still above half the initial loss.",
    why="A model too small or too constrained stops at a high loss on both splits; a task with noisy "
    "labels does too, so this is context until overfit_one_batch says whether the model can fit.",
    fix="Try a bigger model or longer training, reduce regularisation; run overfit_one_batch to tell "
    "capacity from a noisy task.",
    explained_by=NO_LEARNING_CAUSES,
    symptom=True,
)
def underfitting(report: DiagnosticReport) -> Hit | None:
    turn = _val_turn(report)
    if turn is None:
        return None
    train, val, _, _ = turn
    if train.end <= 0.5 * train.start or abs(train.second_half_progress()) >= 0.05:
        return None
    if abs(val.end - train.end) > 0.2 * abs(train.end):
        return None
    return Hit(
        symptom="train and validation loss both plateaued high",
        evidence={"train_start": train.start, "train_end": train.end, "val_end": val.end},
        score=train.end / train.scale,
        next_probe="overfit_one_batch",
    )


@rule(
    "NNDX109",
    C.LABELS_MISALIGNED,
    "warning",
    "Validation accuracy stays at chance",
    detects="A validation accuracy no more than 0.05 (absolute) plus a quarter of the chance level of 1/C "
    "above chance at the end of training, over at least 5 recorded points, or at every one of 3 or 4 (an evaluation "
    "per epoch) — with train accuracy at chance too, or rising well above it (memorisation). Below chance counts: "
    "a model that learned anything predicts held-out samples no worse than a guess unless their labels mean "
    "something else (a split of class-sorted rows, labels shuffled apart from their inputs, a label vocabulary "
    "built per split); the farther below, the higher the score.",
    why="A model that never beats chance on held-out data learned nothing that transfers: labels that "
    "do not belong to their inputs, a model that does not learn at all, or one that memorised a training "
    "set too small to generalise from (then the overfitting seen directly ranks first).",
    fix="Check that inputs and labels are shuffled together and indexed the same way; run the "
    "label-alignment probe; check that gradients reach the weights and that the training set is not tiny.",
    explained_by=NO_LEARNING_CAUSES + (C.UNDERFITTING, C.OVERFITTING),
    symptom=True,
)
def val_at_chance(report: DiagnosticReport) -> Hit | None:
    classes = num_classes(report)
    val = accuracies(report, "val")
    if classes is None or classes < 2 or len(val) < 3:
        return None
    chance = 1.0 / classes
    tolerance = 0.05 + 0.25 * chance
    val_end = median(val[-window(len(val)) :])
    # an evaluation per epoch over a few epochs (a fine-tuning script's three): every one at chance
    if val_end - chance > tolerance or (len(val) < 5 and max(val) - chance > tolerance):
        return None
    train = accuracies(report, "train")
    train_end = median(train[-window(len(train)) :]) if len(train) >= 3 else None
    below = max(0.0, chance - tolerance - val_end)  # worse than any guess: the labels disagree
    return Hit(
        symptom=("validation accuracy below chance" if below else "validation accuracy at chance")
        + ("" if train_end is None else f" while train accuracy is {train_end:.3f}"),
        evidence={"chance_accuracy": chance, "val_accuracy_end": val_end, "train_accuracy_end": train_end},
        score=1.0 + (0.0 if train_end is None else max(0.0, train_end - chance)) + below / chance,
        next_probe="label_alignment",
    )


# losses that cannot be negative: a negative value means the loss is not what it claims
_NON_NEGATIVE_LOSSES = vocab.REGRESSION_LOSS_NAMES - {"GaussianNLLLoss"} | {
    "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "MultiMarginLoss", "MultiLabelSoftMarginLoss",
    "KLDivLoss",
}  # fmt: skip


@rule(
    "NNDX111",
    C.WRONG_LOSS,
    "error",
    "The loss falls below what it can reach",
    detects="A train loss that goes negative while every loss function seen is one that cannot be "
    "(MSE, cross-entropy, BCE, KL...), or a loss of any kind that ends negative and still falling, at over "
    "10x the magnitude of its start (at least 1), or over 2x below it while its second half falls as fast "
    "as its first (a bounded loss slows near its floor): it has no lower bound. The overfit-one-batch "
    "probe's loss is read too, where only a fall to over 100x its start counts (one batch can be fitted "
    "further than a data set); neither for a loss of any kind while the run's own loss hovers around zero (a fifth "
    "or more of its second half on each side: a policy gradient's has no floor, on one batch least of all: info); "
    "info for a logged loss of no known kind that runs through another trained network (a generator's -mean D(fake) "
    "falls as far as its critic's outputs grow); "
    "info when the run's own loss was recorded and stayed non-negative (the loss "
    "given to the probes then lacks a term of the loop's, as a WGAN critic's gradient penalty).",
    why="A loss that can fall forever rewards the model for something other than the task — a sign "
    "error (adding the KL term with a minus, maximising the likelihood's negative), NLLLoss fed "
    "probabilities instead of log-probabilities. The number goes down; the model gets worse.",
    fix="Check the sign of every term (loss = reconstruction + kl, not minus); NLLLoss only after "
    "log_softmax; a custom loss must be bounded below.",
    explained_by=(C.LABEL_DTYPE, C.UNNORMALIZED_TARGETS),  # BCE on -1/+1 labels or on 0..255 targets: no minimum
)
def loss_unbounded(report: DiagnosticReport) -> Hit | None:
    overfit = report.probes.overfit_one_batch if report.probes is not None else None
    probe_losses = [LossPoint(step=i, value=v) for i, v in enumerate(overfit.losses)] if overfit else []
    train = loss_curve(report)
    hit = _unbounded(report, "train loss", train, False)
    if hit is not None and adversarial(report) and not hit.evidence.get("loss_types"):
        # a generator's -mean D(fake) falls as far as the critic's outputs grow: a critic without
        # its Lipschitz constraint (a gradient penalty cut from its graph), not a sign error here
        return replace(hit, severity="info", symptom=hit.symptom + "; it runs through another trained network (a GAN's "
                       "critic), whose outputs growing without bound take it along: check that network's constraint "
                       "(gradient penalty, weight clipping)")  # fmt: skip
    if hit is not None:
        return hit
    hit = _unbounded(report, "overfit-one-batch loss", Curve(probe_losses), True)
    if hit is not None and no_floor(report) and not hit.evidence.get("loss_types"):
        # a policy gradient has no floor on a fixed batch: its probe pushes the log-probability
        # of every action with a negative return to -inf, while the run's own loss hovers at 0
        return replace(hit, severity="info", symptom=hit.symptom + "; the run's own loss hovers around zero: an "
                       "objective with no floor (log-probabilities weighted by returns of both signs) does this on one "
                       "batch")  # fmt: skip
    if hit is not None and train.n >= 10 and train.end >= 0:
        # the run's own loss stayed bounded: the probes were given a loss without a term the
        # loop adds (a WGAN critic's gradient penalty), so theirs is not the run's objective
        return replace(hit, severity="info", symptom=hit.symptom + "; the run's own loss stayed bounded, so the loss "
                       "the probes were given may lack a term the loop adds (a WGAN's gradient penalty)")  # fmt: skip
    return hit


def _unbounded(report: DiagnosticReport, where: str, curve: Curve, one_batch: bool) -> Hit | None:
    if curve.n < 5:
        return None
    lowest = min(curve.values)
    types = {c.loss_type for c in loss_calls(report)}
    # float noise can take a loss of ~0 a hair below it: judge against the curve's own scale
    below_floor = lowest < -1e-4 * max(abs(curve.initial), 1.0)
    if types and types <= _NON_NEGATIVE_LOSSES and below_floor:
        return Hit(
            symptom=f"{', '.join(sorted(types))} reached {lowest:.3g} ({where}), below its minimum of 0",
            evidence={"loss_types": sorted(types), "loss_min": lowest, "loss_initial": curve.initial, "curve": where},
            score=3.0,
        )
    if not one_batch and no_floor(report):
        return None  # swings on both sides of zero, not a fall without end
    scale = max(abs(curve.initial), 1.0)
    still_falling = curve.second_half_progress() > 0
    # a bounded loss slows down as it nears its floor; one with no floor falls as fast or
    # faster in its second half as in its first (within 20%)
    middle = median(curve.values[curve.n // 2 - window(curve.n) // 2 : curve.n // 2 + window(curve.n) // 2 + 1])
    not_slowing = curve.start - middle > 0 and middle - curve.end >= 0.8 * (curve.start - middle)
    # one batch can be fitted much further than a data set (a Gaussian NLL's variance shrinks
    # towards 0 on it), so there only a fall by two orders of magnitude counts
    if one_batch:
        far = abs(curve.end) > 100 * scale
    else:
        far = abs(curve.end) > 10 * scale or (not_slowing and curve.start - curve.end > 2 * scale)
    if curve.end < 0 and far and still_falling:
        return Hit(
            symptom=f"{where} fell from {curve.initial:.3g} to {curve.end:.3g} and keeps falling",
            evidence={"loss_initial": curve.initial, "loss_end": curve.end, "loss_min": lowest, "curve": where},
            score=2.0 + min(3.0, math.log10(abs(curve.end) / scale)),
        )
    return None

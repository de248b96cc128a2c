"""Layer rules (NNDX2xx): per-layer activation and gradient statistics, per-parameter
update/weight ratios."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import median

from nndx import vocab
from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, LayerStats
from nndx.rules._series import (
    HEALTHY_UPDATE_RATIO,
    LARGE_UPDATE_RATIO,
    STEADY_UPDATE_RATIO,
    clips_most_steps,
    finite,
    latest_layers,
    layer_steps,
    loss_curve,
    loss_learned,
    lr_within_range,
    share_of_trainable,
    started_at_zero,
    step_update_ratios,
    stepped_lr,
    trains_well_up_to,
    train_curve,
    update_ratio_summary,
    weight_params,
)
from nndx.rules.engine import Hit, rule

DEAD_THRESHOLD = 0.5
MIN_VALUES_PER_UNIT = vocab.MIN_VALUES_PER_UNIT
SATURATED_THRESHOLD = 0.5
# all-zero outputs of these are dead units (NNDX201), not a constant initialisation
RELU_TYPES = {"ReLU", "ReLU6", "Hardtanh", "Threshold"}
MAX_INIT_GAIN = vocab.MAX_INIT_GAIN


def _gone_layers(report: DiagnosticReport, from_start: bool, share: Callable[[LayerStats], float | None],
                 threshold: float) -> list[tuple[LayerStats, float, float | None, int | None]]:  # fmt: skip
    """(layer, share now, share at the first recorded step, that step; None when the start is
    unknown) for the layers
    whose ``share`` (of dead units, of saturated outputs) reaches ``threshold`` at the last
    recorded step; ``from_start`` selects those already there at the first recorded step,
    or with no record of the start in a model that never trained (a preflight). Found so
    in a trained model with no record of its start (a functional activation only the
    probes see, after training): when it began is not known, so it counts as during
    training, which more causes explain."""
    steps = layer_steps(report)
    if not steps:
        return []
    trained = report.loop is not None and report.loop.steps > 0
    first = {s.name: s for s in steps[0]}
    found = []
    for layer in steps[-1]:
        now = share(layer)
        if now is None or now < threshold:
            continue
        start = first.get(layer.name)
        at_start = share(start) if start is not None else None
        unknown = len(steps) == 1 or at_start is None
        began_at_start = not trained if unknown else at_start >= threshold
        if began_at_start == from_start:
            found.append((layer, now, at_start, None if unknown else start.step))
    return found


def _since(at_start: float | None, start_step: int | None, from_start: bool) -> str:
    if from_start:
        return ""
    return " after training (no record of its start)" if start_step is None else f" (from {at_start:.0%} at step {start_step})"


def _dead_share(layer: LayerStats) -> float | None:
    act = layer.activation
    if layer.type not in RELU_TYPES or act is None or act.unit_count < 2:
        return None
    # on one sample, half of a healthy ReLU layer is zero and so "dead for every sample";
    # a layer that passes nothing at all is still a fact
    if 0 < act.values_per_unit < MIN_VALUES_PER_UNIT and act.dead_unit_fraction < 1.0:
        return None
    return act.dead_unit_fraction


def _dead_layers(report: DiagnosticReport, from_start: bool) -> list[Hit]:
    """Layers with most units dead at the last recorded step (see _gone_layers)."""
    hits = []
    for layer, dead, start_dead, start_step in _gone_layers(report, from_start, _dead_share, DEAD_THRESHOLD):
        act = layer.activation
        # units that went silent in training at an LR the range test trains well at, short of the
        # whole layer: no overshoot killed them; on one batch a trained network's units are sparse
        sparse = not from_start and dead < 0.9 and lr_within_range(report)
        hits.append(
            Hit(
                symptom=f"{dead:.0%} of the units of {layer.name} are dead" + _since(start_dead, start_step, from_start)
                + (", at an LR the range test trains well at" if sparse else ""),
                evidence={
                    "layer": layer.name,
                    "layer_type": layer.type,
                    "dead_unit_fraction": dead,
                    "dead_unit_fraction_at_start": start_dead,
                    "unit_count": act.unit_count,
                    "zero_fraction": act.zero_fraction,
                },
                # dead units the loss does not miss are context: sparse units of a trained
                # network can be silent on every sample of one small batch
                severity="info" if _loss_healthy(report) or sparse else "error" if dead >= 0.9 else "warning",
                score=dead,
                step=layer.step,
            )
        )
    return hits


@rule(
    "NNDX201",
    C.DEAD_RELU,
    "warning",
    "Dead units from the start: outputs zero for every sample",
    detects="A ReLU-family layer where at least half of the units (features or channels) output exactly "
    "zero for every sample of the batch at the last recorded step and already at the first (or in a "
    "preflight, before any training step); error from "
    "90%. "
    "A unit counts as dead only over at least 8 outputs (samples x positions): on a batch of one sample "
    "half of a live layer is zero, so there only a layer with every unit zero counts. "
    "Uses dead_unit_fraction, never zero_fraction: about half of a healthy ReLU layer's outputs are "
    "zero. Info when the train loss fell by over 30% and stayed finite.",
    why="A dead ReLU unit has zero gradient for every input and never recovers; dead from the first step "
    "means the initialisation (a negative bias, a bad scale) killed it, and with most units dead the "
    "layer passes no signal and the loss stalls.",
    fix="Use Kaiming init and zero (not negative) biases, or LeakyReLU/GELU; "
    "nndx.fix.resurrect_dead_units re-initialises dead units.",
    explained_by=(C.BAD_INIT, C.UNNORMALIZED_INPUTS),
)
def dead_units(report: DiagnosticReport) -> list[Hit]:
    return _dead_layers(report, from_start=True)


@rule(
    "NNDX208",
    C.DEAD_RELU,
    "warning",
    "Units died during training",
    detects="A ReLU-family layer with at least half of its units dead at the last recorded step that was "
    "mostly alive at the first (dead over at least 8 outputs per unit, as NNDX201 counts), or found dead in "
    "a trained model with no record of its start (then any "
    "cause of dead units explains it); error from 90%; info when the train loss fell by over 30% and stayed "
    "finite (units silent on one batch of a network that learns are sparse, not dead), and under 90% at an LR "
    "within twice the top of the range where the LR range test trains well (no overshoot killed them; a value "
    "network's TD loss need not fall).",
    why="Units die when an update pushes their pre-activation negative for every input — typically a "
    "step far too large (high LR, accumulated gradients); once dead they never recover.",
    fix="Lower the learning rate (and fix what makes updates too large), use LeakyReLU/GELU; "
    "nndx.fix.resurrect_dead_units re-initialises dead units.",
    # BatchNorm left in eval mode while the weights train normalises by its initial running statistics
    explained_by=(C.LR_TOO_HIGH, C.MISSING_ZERO_GRAD, C.GRAD_ACCUM_SCALING, C.UNNORMALIZED_INPUTS, C.BAD_INIT,
                  C.EVAL_MODE_FORGOTTEN),
)
def units_died(report: DiagnosticReport) -> list[Hit]:
    return _dead_layers(report, from_start=False)


def _saturated_share(layer: LayerStats) -> float | None:
    return layer.activation.saturated_fraction if layer.activation is not None else None


def _saturated_layers(report: DiagnosticReport, from_start: bool) -> list[Hit]:
    # outputs that saturated while the loss learned did it no visible harm: a trained attention's
    # tanh energies pin at ±1 as it grows sure (Bahdanau's, 58% in a healthy seq2seq)
    learned = not from_start and _loss_healthy(report)
    # the calls of one functional activation in one module (attn.forward:tanh#0, #1... of a decoder
    # unrolled over time, a ConvLSTM cell's gates at every step) are one finding: the most saturated
    calls: dict[str, list[tuple[LayerStats, float, float | None, int | None]]] = {}
    for found in _gone_layers(report, from_start, _saturated_share, SATURATED_THRESHOLD):
        calls.setdefault(found[0].name.split("#")[0], []).append(found)
    hits = []
    for group in calls.values():
        layer, now, start, start_step = max(group, key=lambda found: found[1])
        more = f" (and {len(group) - 1} more calls of it)" if len(group) > 1 else ""
        hits.append(Hit(
            symptom=f"{now:.0%} of the outputs of {layer.name} are saturated" + _since(start, start_step, from_start)
            + (", while the train loss learned" if learned else "") + more,
            evidence={"layer": layer.name, "layer_type": layer.type, "saturated_fraction": now,
                      "saturated_fraction_at_start": start, "calls": len(group)},  # fmt: skip
            severity="info" if learned else None,
            score=now,
            step=layer.step,
        ))
    return hits


@rule(
    "NNDX202",
    C.SATURATED_ACTIVATIONS,
    "warning",
    "Saturated sigmoid/tanh activations",
    detects="A sigmoid/tanh layer with at least half of its outputs within 1e-3 of a bound at the last "
    "recorded step and already at the first (or in a preflight, before any training step).",
    why="At the bounds the derivative of sigmoid/tanh is ~0, so almost no gradient passes through.",
    fix="Normalise the inputs, use a smaller init scale (Xavier), add normalisation layers, or use ReLU.",
    explained_by=(C.UNNORMALIZED_INPUTS, C.BAD_INIT),
)
def saturated(report: DiagnosticReport) -> list[Hit]:
    return _saturated_layers(report, from_start=True)


@rule(
    "NNDX209",
    C.SATURATED_ACTIVATIONS,
    "warning",
    "Sigmoid/tanh activations saturated during training",
    detects="A sigmoid/tanh layer (the calls of one functional activation in one module, a decoder's per-step "
    "tanh, counted as one) with at least half of its outputs within 1e-3 of a bound at the last "
    "recorded step that was mostly unsaturated at the first, or found saturated in a trained model with no "
    "record of its start (then any cause of saturation explains it). Info when the train loss fell by over 30% "
    "and stayed finite: units that grew sure while the loss learned did it no visible harm.",
    why="Pre-activations grew until the units pinned at their bounds, where almost no gradient passes: "
    "updates far too large (a high LR, gradients summed over steps) push them there.",
    fix="Find what makes the updates large (the LR, a missing zero_grad, unscaled accumulation); then "
    "normalisation layers or a smaller init scale.",
    explained_by=(C.LR_TOO_HIGH, C.MISSING_ZERO_GRAD, C.GRAD_ACCUM_SCALING, C.UNNORMALIZED_INPUTS, C.BAD_INIT),
)
def saturated_in_training(report: DiagnosticReport) -> list[Hit]:
    return _saturated_layers(report, from_start=False)


def _gradient_layers(report: DiagnosticReport) -> list:
    return [s for s in latest_layers(report) if s.gradient is not None and math.isfinite(s.gradient.norm)]


@rule(
    "NNDX203",
    C.VANISHING_GRADIENTS,
    "warning",
    "Vanishing gradients toward the input layers",
    detects="At the last recorded step, the gradient norm at the input end (the best-fed of the first tenth of the "
    "layers in forward order: a model of several inputs starts with several) is under 1e-3 of the last "
    "layer's (an activation at the output, a softmax or sigmoid, is not the last layer: the gradient at "
    "probabilities is not the network's), or that layer's mean absolute gradient is under 1e-8 while the "
    "last layer's is still "
    "over 1e-5 (a converged model, all of whose gradients are tiny, does not fire; nor the first step of a network "
    "whose output layer starts at zero, which passes no gradient back).",
    why="Layers near the input then barely learn, however long training runs.",
    fix="Use ReLU-family activations, Kaiming/Xavier init, normalisation layers or residual connections.",
    explained_by=(C.SATURATED_ACTIVATIONS, C.DEAD_RELU, C.BAD_INIT),
)
def vanishing(report: DiagnosticReport) -> Hit | None:
    layers = _gradient_layers(report)
    # the gradient at an output activation's output is not the network's (a softmax policy's
    # dL/dp is R / p, huge for an unlikely action): compare with the layer that feeds it
    while layers and vocab.activation_kind(layers[-1].type) is not None:
        layers = layers[:-1]
    if len(layers) < 3:
        return None
    if _blocked_start([p for p in weight_params(report) if (p.step or 0) == (layers[-1].step or 0)]):
        return None  # a zero output layer passes no gradient back at its first step (DiT's)
    # the input end is the first tenth of the layers, fed as well as its best-fed one: a model of
    # several inputs starts with several layers (a Temporal Fusion Transformer's embedding of the
    # series id gets a 1e-3 share beside the day-of-week's 0.3), and a vanishing chain starves them all
    first = max(layers[: max(1, len(layers) // 10)], key=lambda layer: layer.gradient.norm)
    last = layers[-1]
    if last.gradient.norm <= 0 or last.gradient.abs_mean < 1e-8:
        return None
    ratio = first.gradient.norm / last.gradient.norm
    # absolute: the first layer gets ~nothing while the output still has a real gradient
    # (on a converged model every gradient is tiny, and that is no vanishing)
    starved = first.gradient.abs_mean < 1e-8 and last.gradient.abs_mean >= 1e-5
    if ratio >= 1e-3 and not starved:
        return None
    return Hit(
        symptom=f"gradient norm at {first.name} is {ratio:.2e} of that at {last.name}",
        evidence={
            "first_layer": first.name,
            "last_layer": last.name,
            "first_grad_norm": first.gradient.norm,
            "last_grad_norm": last.gradient.norm,
            "first_to_last_ratio": ratio,
            "first_grad_abs_mean": first.gradient.abs_mean,
        },
        score=min(10.0, -math.log10(max(ratio, 1e-30)) / 3),
        step=first.step,
    )


ZERO_GRADIENT_RECORDS = 3  # recorded steps with an exactly zero gradient: a flat loss, not a lucky cancellation


def _zero_gradient_params(report: DiagnosticReport) -> tuple[list[str], int]:
    """Trainable parameters whose gradient norm is exactly 0 at every recorded step (at least
    ZERO_GRADIENT_RECORDS) at which another parameter's is above 0, and how many such steps. A
    .grad left None (a cut graph) is NNDX304's; a step where no parameter got a gradient says
    nothing about one of them."""
    by_step: dict[int, list] = {}
    for p in report.parameters:
        if p.requires_grad and p.grad_norm is not None:
            by_step.setdefault(p.step or 0, []).append(p)
    live = [params for params in by_step.values() if any(p.grad_norm > 0 for p in params)]
    norms: dict[str, list[float]] = {}
    for params in live:
        for p in params:
            norms.setdefault(p.name, []).append(p.grad_norm)
    zero = [name for name, values in norms.items() if len(values) >= ZERO_GRADIENT_RECORDS and not any(values)]
    return zero, len(live)


@rule(
    "NNDX210",
    C.VANISHING_GRADIENTS,
    "warning",
    "Parameters get an exactly zero gradient at every step",
    detects=f"Trainable parameters whose gradient is exactly 0 at every recorded step ({ZERO_GRADIENT_RECORDS} or "
    "more) while other parameters get one. Info when they are at most a tenth of the trainable tensors and the "
    "train loss still learned: a part of the model the loss never weighs (an auxiliary head at weight 0); or when "
    "they are biases whose module's weights get a gradient (weight_norm's weight_g and weight_v count): a shift "
    "the loss is invariant to (a critic's hinge or "
    "Wasserstein loss over as many real as fake samples gives its last bias mean(1) - mean(1) = 0).",
    why="Autograd reached them, and every path back from the loss multiplied by an exact zero: a derivative that "
    "is 0 almost everywhere. A loss on the network's input derivative (a Hamiltonian network, a PINN, a gradient "
    "penalty) differentiates each activation twice, and ReLU's second derivative is 0: its hidden biases never "
    "train. So do the weights before a round, sign, argmax or comparison without a straight-through estimator, "
    "and a value clamped at its bound. The optimizer still moves them by weight decay and momentum.",
    fix="Where the loss differentiates the network, use a smooth activation (tanh, softplus, SiLU); pass a "
    "quantizer's gradient straight through (x + (q(x) - x).detach()); check what multiplies these parameters by "
    "zero.",
    # units dead for every input or pinned at a hard bound, and weights initialised to zero, pass exactly
    # nothing back
    explained_by=(C.DEAD_RELU, C.SATURATED_ACTIVATIONS, C.FROZEN_PARAMETERS, C.BAD_INIT),
)
def zero_gradients(report: DiagnosticReport) -> Hit | None:
    names, steps = _zero_gradient_params(report)
    if not names:
        return None
    share = share_of_trainable(names, report)
    # biases alone, each beside a weight that gets a gradient: the loss is invariant to shifting that
    # layer's output (a critic's hinge or Wasserstein loss over as many real as fake samples)
    # (the weight by any name: weight_norm splits it into weight_g and weight_v)
    trained = {p.name.rpartition(".")[0] for p in report.parameters if p.grad_norm and not p.name.endswith("bias")}
    shifts_only = all(n.endswith("bias") and n.rpartition(".")[0] in trained for n in names)
    few = share <= 0.1 and (loss_learned(report) or shifts_only)
    return Hit(
        symptom=f"{len(names)} trainable parameters got an exactly zero gradient at every one of {steps} recorded "
        f"steps ({names[0]}{', ...' if len(names) > 1 else ''})",
        evidence={"zero_gradient_params": names[:20], "zero_gradient_count": len(names), "recorded_steps": steps,
                  "share_of_trainable": share},  # fmt: skip
        severity="info" if few else "warning",
        score=1.0 + share,
    )


LEARNED_PROGRESS = 0.5  # a train loss that fell by half beside growing gradients: not an explosion


@rule(
    "NNDX204",
    C.EXPLODING_GRADIENTS,
    "warning",
    "Exploding gradients",
    detects="Non-finite gradients in any layer or in the recorded global gradient norm, or a global "
    "gradient norm (before clipping) whose last-tenth median is over 100x its first-tenth median, unless the "
    f"train loss fell by {LEARNED_PROGRESS:.0%} of its start meanwhile (and stayed at or above 0), or the "
    f"recorded update/weight ratios of that last tenth stayed at or under {STEADY_UPDATE_RATIO:g} (an adaptive "
    "optimizer divides the gradient's scale out: ACGAN's gradients grow from 2e-6 at init under Adam's steady steps).",
    why="Growing gradients make every update larger until the weights overflow to Inf/NaN.",
    fix="Clip gradients (torch.nn.utils.clip_grad_norm_ at about the healthy-step norm, see "
    "nndx.fix.suggest_clip_norm), lower the LR, use normalisation layers and a scaled init.",
    explained_by=(C.LR_TOO_HIGH, C.LR_SCHEDULE_MISUSE, C.MISSING_ZERO_GRAD, C.GRAD_ACCUM_SCALING, C.BAD_INIT,
                  C.UNNORMALIZED_INPUTS),
)
def exploding(report: DiagnosticReport) -> Hit | None:
    bad_layers = [s for s in report.layers if s.gradient is not None and s.gradient.nonfinite_count > 0]
    history = sorted(report.loop.grad_norm_history, key=lambda p: p.step) if report.loop else []
    norms = [p.before_clip for p in history]
    bad_steps = [p.step for p in history if not math.isfinite(p.before_clip)]
    if bad_layers or bad_steps:
        first_step = min([s.step for s in bad_layers if s.step is not None] + bad_steps, default=None)
        return Hit(
            symptom="non-finite gradients",
            evidence={
                "layers_with_nonfinite_grad": sorted({s.name for s in bad_layers}),
                "steps_with_nonfinite_grad_norm": len(bad_steps),
                "healthy_grad_norm_median": median(finite(norms)) if finite(norms) else None,
            },
            severity="error",
            score=2.0,
            step=first_step,
        )
    if len(norms) < 10:
        return None
    w = max(3, len(norms) // 10)
    start, end = median(norms[:w]), median(norms[-w:])
    if start <= 0 or end / start <= 100:
        return None
    curve = loss_curve(report)
    if curve.n >= 10 and curve.start > 0 and curve.end >= 0 and curve.progress >= LEARNED_PROGRESS:
        # growth from a start near zero (a pointer network's uniform scores at init) while the loss
        # falls by half: learning breaking a symmetry, not updates blowing up
        return None
    late = [r for step, r in step_update_ratios(report) if step >= history[-w].step]
    if late and max(late) <= STEADY_UPDATE_RATIO:
        return None  # an adaptive optimizer divides the gradient's scale out: the steps stayed small
    return Hit(
        symptom=f"gradient norm grew {end / start:.0f}x",
        evidence={"grad_norm_start": start, "grad_norm_end": end, "growth": end / start},
        score=min(5.0, math.log10(end / start) / 2),
    )


def _loss_healthy(report: DiagnosticReport) -> bool:
    """The train loss fell clearly, or ended well under an uninformed prediction's loss (a
    pretrained model that stays fitted, a text near its entropy floor), and stayed finite:
    large or small updates then did no visible harm, so what they show is context, not an alarm."""
    points = train_curve(report)
    curve = loss_curve(report)
    return len(curve.values) == len(points) and loss_learned(report)


@rule(
    "NNDX205",
    C.LR_TOO_HIGH,
    "warning",
    "Updates far larger than ~1e-3 of the weights",
    detects="Per recorded step, the median update/weight ratio ‖Δw‖/‖w‖ over the weight matrices; over "
    "the window of steps where it is largest (a fifth of the run; a weight zero before its update, whose ratio is 1 "
    "at any LR, left out; so are the steps after the weights went non-finite, unless from the first: NaN weights say "
    "nothing of the step size), a median above 0.1 (healthy "
    "training sits near 1e-3). Error from 1.0 or when every ratio is non-finite. Info when the train "
    "loss still fell by over 30%, or ended under 70% of an uninformed prediction's loss (ln C; the targets' "
    "variance), and stayed finite: Adam at a high-ish LR on small weights has large "
    "ratios and trains fine; before training (no loss from the loop), info when the interventions' baseline (a "
    "copy trained with the user's optimizer at the user's LR on the probe's batch) fitted it to a tenth of its "
    "start, and the ratio stays under 1. Info too when the LR the loop stepped with (without an optimizer: the "
    "measured step size) is within twice the top of the interval where the LR range test trains well "
    "(the sweep reads the LR to about that factor) and the ratio stays under 1: the LR is then not too "
    "high (a fresh small head's weights are small); and when the loop's gradient clip cut most recorded steps "
    "and the ratio stays under 1: each step is then LR x max_norm by the loop's design (an RNN language model "
    "at SGD lr 20-30, clip 0.25); and when every recorded gradient norm (3 or more) is exactly 0: the steps are "
    "then weight decay or momentum, which Adam scales to a full step at any LR, and the loss sends no gradient. "
    "Those three refute the LR: the finding then roots no other finding.",
    why="Each step then rewrites a large share of every weight: the optimiser overshoots and the loss "
    "oscillates, diverges, or the units die and the loss freezes.",
    fix="Lower the learning rate until the ratio is near 1e-3 (run the LR range test).",
    # NaN gradients from the data or the forward pass make non-finite updates too; batches of one
    # class pull every weight toward that class in turn; inputs or targets of a large scale make
    # gradients (and a plain SGD step) that large at any sensible LR; BatchNorm over a batch of two
    # divides by the spread of two samples, and the steps through it blow up at the LR batch 32 trains at;
    # a loss with no floor grows the weights and their steps as it falls, whatever the LR
    explained_by=(C.WRONG_LOSS, C.MISSING_ZERO_GRAD, C.GRAD_ACCUM_SCALING, C.UNSHUFFLED_DATA, C.BATCH_TOO_SMALL)
    + (C.NAN_IN_DATA, C.LOG_OF_ZERO, C.DIVISION_BY_ZERO, C.NUMERICAL_OVERFLOW)
    + (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
)
def update_ratio_high(report: DiagnosticReport) -> Hit | None:
    found = update_ratio_summary(report)
    if found is None or found[0] <= LARGE_UPDATE_RATIO:
        return None
    peak, typical, count = found
    severity = "error" if peak >= 1.0 else "warning"
    lr, top = stepped_lr(report), trains_well_up_to(report)
    # a ratio of 1 rewrites every weight each step: no LR reading excuses that
    in_range = lr_within_range(report) and peak < 1.0
    # the loop's clip bounds every step at LR x max_norm: the step size is the loop's choice
    # (RNN language models train at SGD lr 20-30 with a clip of 0.25), not an LR gone wrong
    clipped = clips_most_steps(report) and peak < 1.0
    # no gradient from the loss at any recorded step: the steps are weight decay and momentum, which Adam
    # scales up to a full-size step whatever the LR; why the loss sends nothing is the finding to read
    gradless = _no_loss_gradient(report)
    if _loss_healthy(report) or in_range or clipped or gradless or (_user_setup_fits(report) and peak < 1.0):
        severity = "info"
    return Hit(
        symptom=f"median update/weight ratio reaches {peak:.3g}"
        + (f" at lr {lr:.3g}, where the LR range test still trains well (up to {top:.3g})" if in_range
           else " with the loop's gradient clip bounding most steps" if clipped
           else " while every recorded gradient norm is 0: the steps are the optimizer's weight decay or momentum, "
           "not the loss's" if gradless else ""),
        refuted=in_range or clipped or gradless,
        evidence={"peak_update_ratio": peak, "median_update_ratio": typical,
                  "healthy_update_ratio": HEALTHY_UPDATE_RATIO, "recorded_steps": count, "lr": lr,
                  "range_test_trains_well_up_to": top},  # fmt: skip
        severity=severity,
        score=min(10.0, 1.0 + math.log10(peak / HEALTHY_UPDATE_RATIO) if math.isfinite(peak) else 10.0),
    )


def _user_setup_fits(report: DiagnosticReport) -> bool:
    """Before training (no loss from the loop): the interventions' baseline, a copy trained with a
    copy of the user's optimizer at the user's LR on the probe's batch, fitted it to a tenth of its
    start and stayed finite. One probe step of Adam on small weights makes a large ratio at any
    sensible LR; a hundred steps that converge say the LR does not overshoot."""
    runs = report.interventions
    if runs is None or runs.optimizer != "user" or train_curve(report):
        return False
    start, end = runs.baseline_initial_loss, runs.baseline_final_loss
    return start is not None and end is not None and start > 0 and math.isfinite(end) and end <= 0.1 * start


def _no_loss_gradient(report: DiagnosticReport) -> bool:
    """Every recorded global gradient norm (at least 3) is exactly 0."""
    history = report.loop.grad_norm_history if report.loop is not None else []
    return len(history) >= 3 and all(p.before_clip == 0 for p in history)


@rule(
    "NNDX206",
    C.LR_TOO_LOW,
    "warning",
    "Updates far smaller than ~1e-3 of the weights",
    detects="A median update/weight ratio over the weight matrices and recorded steps below 1e-5 (and "
    "above 0), never above 1e-3 in any window of the run. Warning when the loss is not moving either; "
    "info when it still decreases, or learned (fell by over 30%, or ended under 70% of an uninformed prediction's "
    "loss) and stayed finite: a model that converged early takes tiny steps whatever the LR.",
    why="Steps that small barely change the model: training needs orders of magnitude more steps.",
    fix="Raise the learning rate (run the LR range test); check that a scheduler or clipping is not "
    "shrinking the updates.",
    explained_by=(C.GRAD_CLIP_TOO_SMALL, C.LR_SCHEDULE_MISUSE, C.VANISHING_GRADIENTS, C.DEAD_RELU),
)
def update_ratio_low(report: DiagnosticReport) -> Hit | None:
    found = update_ratio_summary(report)
    if found is None or not 0 < found[1] < 1e-5 or found[0] > HEALTHY_UPDATE_RATIO:
        return None
    peak, ratio, count = found
    curve = loss_curve(report)
    # or a loss that learned and converged (fell from its first value to under an uninformed prediction's
    # within the first window): the steps of a fitted model shrink, whatever the LR
    moving = curve.n >= 6 and curve.progress > 0.1 or _loss_healthy(report)
    return Hit(
        symptom=f"median update/weight ratio is {ratio:.3g}",
        evidence={
            "median_update_ratio": ratio,
            "peak_update_ratio": peak,
            "healthy_update_ratio": HEALTHY_UPDATE_RATIO,
            "recorded_steps": count,
            "loss_relative_progress": curve.progress if curve.n >= 6 else None,
        },
        severity="info" if moving else "warning",
        score=min(10.0, 1.0 + math.log10(HEALTHY_UPDATE_RATIO / ratio)),
        next_probe="lr_range",
    )


# a layer output whose std is under this share of its mean's size is a constant up to float rounding
ROUNDING_SPREAD = 1e-5
# activations with a smaller std carry too little to measure a gain from: behind embeddings initialised at
# 1e-4 (pointer-generator's), a later layer's default bias alone is a "growth" of 1e4
MIN_BASE_STD = 1e-4


@rule(
    "NNDX207",
    C.BAD_INIT,
    "warning",
    "Initialisation breaks learning",
    detects="At the first recorded step: a hidden layer whose outputs have zero spread across the batch "
    "(constant or symmetric weights; not a softmax, uniform over equal scores at the start; nor a layer whose zero "
    "weights have a gradient: Glow's ZeroConv2d and ControlNet's zero convolutions start a branch as nothing, and "
    "the first step moves them; nor one inside a residual branch whose last layer starts at zero: RWKV's time-mix "
    "zeros its key, receptance and output, and they move once the output has; nor one behind an output layer that "
    "starts at zero while most weights are random: DiT's adaLN-Zero modulations get no gradient until its zero final "
    "layer moved), a non-final weight matrix of norm 0 and no gradient to move it (not where the "
    "layer ends a residual branch, whose output is added to the stream: ResNet's zero_init_residual starts each "
    "block as the identity; nor a zero factor whose partner is random, as LoRA's B, which its gradient moves, or "
    "in a module whose zero weights have a gradient: ZeroConv2d's scale), "
    "activations whose std "
    "grows over 1000x from the first recorded layer to a later one (embedding lookups left out: their scale is "
    "the table's init; so are constants, whose std is rounding, under 1e-5 of their mean, and layers whose std is "
    "under 1e-4, whose scale a later bias alone exceeds), or a Linear/Conv weight whose gain "
    "(rms x sqrt(fan_in)) is over 5 (He init: 1.41; N(0, 1) init gives sqrt(fan_in)), from the norm before "
    "the recorded update; not when that update was half the weights' size or more (a far too high LR).",
    why="Identical units receive identical gradients and never differentiate; zero weights pass no "
    "signal; activations that blow up with depth saturate or overflow before training starts.",
    fix="Use the default (Kaiming/Xavier) init; never fill weights with a constant; scale random init "
    "by 1/sqrt(fan_in).",
)
def bad_init(report: DiagnosticReport) -> list[Hit]:
    hits = []
    layers = report.model.layers if report.model is not None else []
    residual_ends = {layer.name for layer in layers if layer.residual_end}
    weights = weight_params(report)
    first_step = min(((p.step or 0) for p in weights), default=0)
    at_start = [p for p in weights if (p.step or 0) == first_step]
    moving_zeros = _moving_zero_modules(at_start, weights)
    zero_branches = _zero_branches(at_start, residual_ends)
    steps = layer_steps(report)
    if steps:
        first = [s for s in steps[0] if s.activation is not None and math.isfinite(s.activation.std)]
        if len(first) >= 2 and first[0].activation.std > 0:
            upstream_dead = False  # a layer fed by dead units is constant because of them
            for layer in first[:-1]:
                act = layer.activation
                if act.dead_unit_fraction >= 0.9 and layer.type in RELU_TYPES:
                    upstream_dead = True
                # a softmax of equal scores is uniform at the start (attention before it learned anything)
                uniform = (kind := vocab.activation_kind(layer.type)) is not None and kind.over_classes
                # a zero branch adds nothing (the identity); zero weights their gradient moves are a deliberate start
                deliberate = (layer.name in residual_ends or layer.name in moving_zeros
                              or _inside(layer.name, zero_branches))  # fmt: skip
                if act.std == 0.0 and act.unit_count >= 2 and layer.type not in RELU_TYPES and not upstream_dead and (
                        not deliberate) and not uniform:  # fmt: skip
                    hits.append(
                        Hit(
                            symptom=f"{layer.name} outputs the same value for every sample and unit",
                            evidence={"layer": layer.name, "activation_std": act.std, "activation_mean": act.mean},
                            score=2.0,
                            step=layer.step,
                        )
                    )
            # an embedding's output is a table's init scale (DeepCTR's 1e-4), no gain through depth; a
            # constant's spread is rounding (a mixture of experts' softplus(x @ 0) noise scale at init)
            scaled = [s for s in first if not vocab.is_embedding(s.type) and s.activation.std >= MIN_BASE_STD
                      and s.activation.std > ROUNDING_SPREAD * abs(s.activation.mean)] or first
            base = scaled[0].activation.std
            worst = max(scaled, key=lambda s: s.activation.std)
            if base > 0 and worst.activation.std > 1000 * base:
                hits.append(
                    Hit(
                        symptom=f"activation std grows {worst.activation.std / base:.0f}x by {worst.name}",
                        evidence={
                            "first_layer": scaled[0].name,
                            "first_activation_std": base,
                            "layer": worst.name,
                            "activation_std": worst.activation.std,
                        },
                        score=min(5.0, math.log10(worst.activation.std / base)),
                        step=worst.step,
                    )
                )
    for param in at_start[:-1]:  # a zero-initialised final layer is a deliberate, harmless choice
        # as is a residual branch's last layer (zero_init_residual: each block starts as the identity)
        # and a zero weight with a gradient, which the first step moves off zero (LoRA's B beside a random A)
        owner = param.name.rpartition(".")[0]
        # or a zero factor beside a zero weight of its own module that moves (Glow's ZeroConv2d: its scale
        # gets a gradient once the conv's weights left zero)
        moves = owner in moving_zeros or owner.rpartition(".")[0] in moving_zeros
        if param.weight_norm == 0.0 and owner not in residual_ends and not moves and not _inside(owner, zero_branches):
            hits.append(
                Hit(
                    symptom=f"weight {param.name} is all zeros",
                    evidence={"parameter": param.name, "weight_norm": 0.0},
                    score=2.0,
                    step=param.step,
                )
            )
    hits += _overscaled(report, at_start)
    return hits


def _zero_branches(at_start: list, residual_ends: set[str]) -> set[str]:
    """The modules holding a residual branch whose last layer starts at zero (RWKV's time- and
    channel-mix blocks, whose output, key and receptance weights are all initialised to 0): such a
    branch starts as nothing on purpose, and its inner zeros get a gradient once its end moved."""
    zero = {p.name.rpartition(".")[0] for p in at_start if started_at_zero(p)}
    return {name.rpartition(".")[0] for name in residual_ends & zero} - {""}


def _blocked_start(at_start: list) -> bool:
    """The output layer (the last weight matrix) starts at zero and most weight matrices do not:
    the network starts as a constant output on purpose (DiT's final layer, guided diffusion's
    ``zero_module`` last convolution), and at its first step no gradient passes back through that
    layer, so every zero weight before it has none yet and every earlier layer's gradient is 0.
    Every weight zero is a broken init, not this."""
    if not at_start or not started_at_zero(at_start[-1]):
        return False
    return sum(map(started_at_zero, at_start)) <= len(at_start) // 2


def _inside(name: str, modules: set[str]) -> bool:
    """Whether the layer (or functional op: ``blocks.0.att.forward:sigmoid#0``) ``name`` lies in one of ``modules``."""
    path = name.split(".forward:")[0]
    return any(path == module or path.startswith(module + ".") for module in modules)


def _moving_zero_modules(at_start: list, weights: list) -> set[str]:
    """Modules, and the modules holding them, with a weight matrix that is all zeros at the first
    recorded step (``at_start``: its weight records) and moves: it has a gradient there (LoRA's B
    beside a random A; Glow's ZeroConv2d, ControlNet's zero convolutions, which start a branch as
    nothing), a later record (``weights``) finds it off zero, or the output layer starts at zero
    too while most weights are random (:func:`_blocked_start`: DiT's adaLN-Zero modulations get
    their gradient once its zero final layer moved). Its units differ by their gradients, so no
    symmetry holds them."""
    blocked = _blocked_start(at_start)
    moved = {p.name for p in weights if p.weight_norm != 0.0 and p.step != at_start[0].step} if at_start else set()
    names: set[str] = set()
    for param in at_start:
        moves = param.grad_norm is not None and math.isfinite(param.grad_norm) and param.grad_norm > 0
        if started_at_zero(param) and (moves or blocked or param.name in moved):
            owner = param.name.rpartition(".")[0]
            names |= {owner, owner.rpartition(".")[0]}
    return names - {""}


def _overscaled(report: DiagnosticReport, weights: list) -> list[Hit]:
    """Linear/Conv weights whose gain (rms x sqrt(fan_in): how much a layer scales its
    input's std) is far above any standard init's — He init's is 1.41, PyTorch's default
    0.58 — as N(0, 1) init gives (sqrt(fan_in)). Embedding tables (N(0, 1) by default) are
    no Linear and are left out."""
    types = {layer.name: layer.type for layer in report.model.layers} if report.model is not None else {}
    hits = []
    for param in weights:
        owner, _, kind = param.name.rpartition(".")
        numel = math.prod(param.shape)
        if kind != "weight" or types.get(owner) not in vocab.LINEAR_LAYER_NAMES or numel == 0 or not math.isfinite(param.weight_norm):
            continue
        # the first record may follow an update (the probe's step, the loop's first): the
        # initial norm is at least |w| / (1 + update_ratio); an update as large as half the
        # weights says more about the step (a far too high LR) than about the init
        ratio = max(0.0, param.update_ratio) if param.update_ratio is not None and math.isfinite(param.update_ratio) else 0.0
        if param.update_ratio is not None and not ratio < 0.5:
            continue
        fan_in = numel // param.shape[0]
        gain = param.weight_norm / (1.0 + ratio) / math.sqrt(numel) * math.sqrt(fan_in)
        if gain > MAX_INIT_GAIN:
            hits.append(Hit(
                symptom=f"{param.name} scales its input's std by about {gain:.0f}x (He init: 1.4x)",
                evidence={"parameter": param.name, "gain": gain, "fan_in": fan_in, "weight_rms": gain / math.sqrt(fan_in)},
                score=min(4.0, gain / MAX_INIT_GAIN + 1.0),
                step=param.step,
            ))  # fmt: skip
    return hits

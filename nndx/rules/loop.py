"""Loop rules (NNDX3xx): what the Monitor saw of the user's own training loop —
zero_grad/backward/step counts, the optimizer's parameters, gradients that stayed
None, learning rates, clipping, input norms, and what reached the loss function."""

from __future__ import annotations

import math
from statistics import median

from nndx import vocab
from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, LossCall, LoopStats, flat_since
from nndx.rules._series import (
    clip_ratios, clipped_steps, finite, frozen_untrained, is_classification, loss_calls, loss_curve, loss_learned,
    samples_axis, share_of_trainable, starts_fitted, train_curve, weight_shapes,
)
from nndx.rules.engine import Hit, rule


def _loop(report: DiagnosticReport) -> LoopStats | None:
    return report.loop


def _lr_trouble(report: DiagnosticReport) -> dict[str, float] | None:
    """Evidence that updates overshoot: NaN after finite steps, divergence, big updates."""
    curve = loss_curve(report)
    values = [p.value for p in train_curve(report)]
    evidence: dict[str, float] = {}
    if len(values) > 2 and math.isfinite(values[0]) and not all(math.isfinite(v) for v in values):
        evidence["nonfinite_loss_points"] = sum(1 for v in values if not math.isfinite(v))
    late = curve.values[curve.n // 2 :]
    if curve.n >= 10 and curve.start > 0 and sum(1 for v in late if v > 2 * curve.start) >= 2:
        evidence["loss_max_over_start"] = max(late) / curve.start
    ratios = [p.update_ratio for p in report.parameters if p.update_ratio is not None and len(p.shape) >= 2]
    # large updates on a loss that learned did no visible harm (BatchNorm'd weights take large
    # relative steps and train fine): they count only beside a loss that did not
    typical = median([r if math.isfinite(r) else math.inf for r in ratios]) if ratios else 0.0
    if typical > 0.1 and not loss_learned(report):
        evidence["median_update_ratio"] = typical
    return evidence or None


@rule(
    "NNDX301",
    C.MISSING_ZERO_GRAD,
    "error",
    "Gradients accumulate across optimizer steps (zero_grad missing)",
    detects="At least 3 optimizer steps with zero_grad never called (or called once, before the loop); "
    "or, in a loop with several optimizers, one of them stepped 3 times or more with its gradients reset "
    "before at most one of its steps (the others' reset: zero_grad counts over all of them look healthy); "
    "or at least 10 backward passes, fewer than 3 steps of a torch optimizer, zero_grad called at most once and "
    "gradients left inf or NaN (a GradScaler skipping every step on gradients that overflowed and were never "
    "reset); "
    "warning when zero_grad runs but only every k-th step while each step has one backward. Deliberate "
    "accumulation — k backward passes per zero_grad, one zero_grad per step — does not fire.",
    why="PyTorch adds each backward's gradient into .grad; without zero_grad every step applies the sum "
    "of all past gradients, so updates grow and training oscillates or diverges.",
    fix="Call optimizer.zero_grad() (set_to_none=True is the default) once per optimizer step, before "
    "backward.",
)
def missing_zero_grad(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None:
        return None
    forgotten = _optimizer_never_reset(loop)
    if forgotten is not None:
        return forgotten
    if loop.backward_calls < loop.steps:
        return None
    # a GradScaler skips optimizer.step() while a gradient is inf: gradients never reset overflow
    # once and stay inf, so such a loop shows almost no steps, only backward passes. Only a torch
    # optimizer's step can be skipped so: a hand-written loop that updates nothing (NNDX321) piles
    # up gradients that no step ever applies, and so does an optimizer no loop steps (a discriminator's gradients
    # stepped by the generator's optimizer, NNDX321): the gradients left must have overflowed
    skipped = (loop.steps < 3 and loop.backward_calls >= 10 and loop.zero_grad_calls <= 1 and bool(loop.optimizers)
               and bool(loop.params_grad_nonfinite))  # fmt: skip
    if loop.steps < 3 and not skipped:
        return None
    evidence = {
        "steps": loop.steps,
        "backward_calls": loop.backward_calls,
        "zero_grad_calls": loop.zero_grad_calls,
    }
    norms = finite([p.before_clip for p in sorted(loop.grad_norm_history, key=lambda p: p.step)])
    if len(norms) >= 4 and norms[0] > 0:
        evidence["grad_norm_growth"] = norms[-1] / norms[0]
    if skipped:
        return Hit(
            symptom=f"{loop.backward_calls} backward passes, {loop.steps} optimizer steps, zero_grad called "
            f"{loop.zero_grad_calls} times: the gradients sum over every backward (a GradScaler skips every step "
            "once they overflow)",
            evidence=evidence,
            score=3.0,
        )
    if loop.zero_grad_calls <= 1:
        return Hit(
            symptom=f"{loop.steps} optimizer steps, zero_grad called {loop.zero_grad_calls} times",
            evidence=evidence,
            score=3.0,
        )
    steps_per_zero = loop.steps / loop.zero_grad_calls
    backward_per_step = loop.backward_calls / loop.steps
    if steps_per_zero < 2 or backward_per_step > 1.5:
        return None
    return Hit(
        symptom=f"zero_grad called once every {steps_per_zero:.1f} optimizer steps",
        evidence=evidence | {"steps_per_zero_grad": steps_per_zero},
        severity="warning",
        score=1.0 + min(2.0, steps_per_zero / 10),
    )


def _optimizer_never_reset(loop: LoopStats) -> Hit | None:
    """One of several optimizers whose gradients were never (or once) reset between its
    steps, while another's were: an encoder-decoder loop that zeroes the encoder's
    optimizer and forgets the decoder's looks healthy in the counts over all of them."""
    steps, unreset = loop.optimizer_steps, loop.optimizer_steps_without_reset
    if len(loop.optimizers or []) < 2 or len(steps) != len(loop.optimizers) or len(unreset) != len(steps):
        return None
    never = [(i, name, n, without) for i, (name, n, without) in enumerate(zip(loop.optimizers or [], steps, unreset))
             if n >= 3 and without >= n - 2]  # fmt: skip
    if not never:
        return None
    i, name, n, without = never[0]
    others = ("" if len(never) == 1 else f" and {len(never) - 1} more optimizer{'s' if len(never) > 2 else ''} "
              f"({', '.join(f'{j} ({other})' for j, other, _, _ in never[1:])}) likewise")
    rest = ("; the other optimizers' were reset" if len(never) < len(steps)
            else f"; none of the {len(steps)} optimizers' gradients were reset")
    return Hit(
        symptom=f"optimizer {i} ({name}) stepped {n} times, its gradients reset before {n - 1 - without} of those "
        f"steps{others}{rest}",
        evidence={"optimizer": f"{i} ({name})", "optimizers_not_reset": len(never), "optimizer_steps": n,
                  "steps_without_reset": without, "zero_grad_calls": loop.zero_grad_calls,
                  "backward_calls": loop.backward_calls},  # fmt: skip
        score=3.0,
    )


@rule(
    "NNDX302",
    C.GRAD_ACCUM_SCALING,
    "info",
    "Gradient accumulation: check that each micro-batch loss is divided by k",
    detects="k > 1 backward passes per optimizer step and per zero_grad, with about one zero_grad per step "
    "(deliberate accumulation); backward passes a closure runs inside optimizer.step() (L-BFGS) count as one, "
    "and backward passes each preceded by a reset (a GAN's generator loss reaching the discriminator) "
    "accumulate nothing; nor do passes reset before the step that follows (counted at each step: PGD's attack "
    "backward passes, zeroed before the training backward). Info on its own; warning when the run also shows "
    "overshooting updates (NaN after "
    "finite steps, a loss above twice its start, median update/weight ratio over 0.1 beside a loss that did "
    "not learn), which is what "
    "an undivided accumulated loss — a k-times larger step — produces. Adam, RMSprop and the other "
    "optimizers that divide by a running gradient scale stay info: their steps do not grow with the loss. "
    "Silent in a loop without an optimizer whose loss turned non-finite (its steps are counted from weights "
    "that change, and NaN weights show no change).",
    why="Summing k micro-batch gradients without dividing each loss by k multiplies the effective "
    "learning rate by k (for SGD-like optimizers).",
    fix="Divide each micro-batch loss by the number of accumulation steps before backward.",
)
def grad_accum_scaling(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or loop.steps < 2 or loop.zero_grad_calls < 2:
        return None
    # backward passes inside optimizer.step() are a closure's (L-BFGS evaluates the loss
    # several times per step, Lightning once): they count as the step's one backward
    outside = loop.backward_calls - loop.backward_calls_in_step
    backward_per_step = outside / loop.steps + min(1.0, loop.backward_calls_in_step / loop.steps)
    # gradients reset before each backward accumulate nothing, however many backward passes a
    # step sees: a GAN's generator loss reaches the discriminator's weights too, whose reset
    # comes before its own backward
    backward_per_reset = (outside + min(loop.steps, loop.backward_calls_in_step)) / loop.zero_grad_calls
    if backward_per_step < 1.5 or backward_per_reset < 1.5 or loop.zero_grad_calls < 0.8 * loop.steps:
        return None
    # counted at each step: the passes since its last reset. An adversarial attack's backward
    # passes (PGD's seven per batch) are reset before the training backward: none reach a step
    at_steps = loop.backward_since_reset_at_steps
    if at_steps is not None and at_steps < 1.5 * loop.steps:
        return None
    if loop.optimizers == [] and any(not math.isfinite(p.value) for p in train_curve(report)):
        # no optimizer: steps are updates seen in the parameters, and weights gone NaN no
        # longer show one — backward passes without counted steps are no accumulation then
        return None
    # an adaptive optimizer divides a k-times larger gradient by a k-times larger scale: the
    # undivided sum cannot be what makes its updates large
    adaptive = bool(loop.optimizers) and set(loop.optimizers) <= vocab.SCALE_INVARIANT_OPTIMIZERS
    trouble = None if adaptive else _lr_trouble(report)
    return Hit(
        symptom=f"{backward_per_step:.1f} backward passes per optimizer step"
        + (" and overshooting updates" if trouble else "")
        + (f" ({', '.join(loop.optimizers)} steps do not grow with the gradient's scale)" if adaptive else ""),
        evidence={"backward_per_step": backward_per_step, "steps": loop.steps} | (trouble or {}),
        severity="warning" if trouble else "info",
        score=1.0 + (2.0 if trouble else 0.0),
    )


@rule(
    "NNDX303",
    C.OPTIMIZER_NOT_CONNECTED,
    "error",
    "The optimizer does not hold the model's trainable parameters",
    detects="Trainable model parameters that are in no optimizer param group (an optimizer built over "
    "another model, a stale copy, or part of the model). Optimizer parameters that are not the model's are "
    "evidence only beside these: one optimizer over two models (SAC's twin critics) holds every parameter of each. "
    "Also tensors that a module holds outside its parameters, that receive gradients and that no optimizer "
    "holds (the Monitor's final report): layers in a Python list instead of nn.ModuleList, "
    "nn.Parameter(...).to(device) kept as an attribute (a copy, with the Parameter behind it). Info when every "
    "parameter outside the optimizer gets no gradient from the loss (the probe's step) or moved during the run "
    "anyway (the Monitor's final report): a second optimizer trains them (CompressAI's aux optimizer over the "
    "entropy bottleneck's quantiles).",
    why="optimizer.step() never updates those parameters: they keep their initial values however long "
    "training runs.",
    fix="Build the optimizer from the model you train, after any .to(device)/deepcopy/re-creation: "
    "optimizer = torch.optim.Adam(model.parameters()). Register what the model trains: nn.ModuleList / "
    "nn.ModuleDict for layers in a list or dict, nn.Parameter(t.to(device)) (the move inside), never "
    "nn.Parameter(t).to(device).",
)
def optimizer_not_connected(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not (loop.params_not_in_optimizer or loop.unregistered_params):
        return None
    # what another optimizer trains (CompressAI's quantiles, in its aux optimizer): the loss sends them no
    # gradient (the preflight's step), or they moved over the run though the watched optimizer holds none of them
    gradless = {p.name for p in report.parameters} - {p.name for p in report.parameters if p.grad_norm is not None}
    unchanged = set(loop.params_never_changed) if loop.params_never_changed is not None else None
    elsewhere = [n for n in loop.params_not_in_optimizer
                 if n in gradless or (unchanged is not None and n not in unchanged)]
    if elsewhere and len(elsewhere) == len(loop.params_not_in_optimizer) and not loop.unregistered_params:
        return Hit(symptom=f"{len(elsewhere)} trainable parameters not in the optimizer, but "
                   + ("they moved during the run: something else trains them (a second optimizer, an auxiliary loss's)"
                      if unchanged is not None and not set(elsewhere) & gradless
                      else "the loss sends them no gradient: they are not this loss's to train (an auxiliary loss's, "
                      "in an optimizer of their own)"),
                   evidence={"params_not_in_optimizer": elsewhere[:20],
                             "params_not_in_optimizer_count": len(elsewhere)},
                   severity="info", score=0.5)  # fmt: skip
    share = share_of_trainable(loop.params_not_in_optimizer, report) if loop.params_not_in_optimizer else None
    symptom = (f"{len(loop.params_not_in_optimizer)} trainable parameters not in the optimizer, "
               f"{loop.optimizer_params_not_in_model} optimizer parameters not in the model")
    if loop.unregistered_params:
        symptom = (f"{len(loop.unregistered_params)} tensors get gradients but are no registered parameter of the "
                   "model and in no optimizer" + (f"; {symptom}" if loop.params_not_in_optimizer else ""))
    return Hit(
        symptom=symptom,
        evidence={
            "params_not_in_optimizer": loop.params_not_in_optimizer[:20],
            "params_not_in_optimizer_count": len(loop.params_not_in_optimizer),
            "optimizer_params_not_in_model": loop.optimizer_params_not_in_model,
            "unregistered_params": loop.unregistered_params[:20],
            "share_of_trainable": share,
        },
        score=2.0 + (share if share is not None else 1.0),
    )


# parameter tensors without gradient at this share of the trainable ones or less explain no stalled loss
SMALL_DETACHED_SHARE = 0.1


@rule(
    "NNDX304",
    C.DETACHED_GRAPH,
    "warning",
    "Trainable parameters receive no gradient",
    detects="Trainable parameters whose .grad stayed None after backward; error when they are at least "
    "half of the trainable parameter tensors (or the share is unknown and none has a gradient). Also an error "
    "when the first losses logged to the Monitor as tensors reach none of its model's trainable parameters "
    "(another loss's backward may still give them gradients: a GAN's generator stepped on a loss of "
    "detached fakes). Info when the probe found that every such parameter's module cannot move the loss "
    "(its output, perturbed, leaves the loss unchanged, or it never ran; or the Monitor, which hooks every leaf "
    "layer, never saw it run), or that no torch call of the forward "
    "read the parameter itself: wasted compute, not a cut graph. At most "
    f"{SMALL_DETACHED_SHARE:.0%} of the trainable parameter tensors (a cut head: 2 of 44) explain no other "
    "finding, nor do unused modules: the rest of the model still trains, and a loss that does not move has another "
    "cause.",
    why="The loss does not depend on them: a .detach(), a torch.no_grad() block, .item()/.numpy() in the "
    "forward, or a branch the forward never uses cuts them out of the graph.",
    fix="Remove the detach/no_grad/.item() between these parameters and the loss; delete unused modules "
    "or freeze them deliberately (requires_grad_(False)).",
)
def detached_graph(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    # a model with nothing trainable has no parameter for a loss to reach: what is frozen is NNDX305's
    nothing_trainable = loop is not None and loop.trainable_param_count == 0 and bool(loop.frozen_params)
    if loop is not None and loop.logged_loss_reaches_params is False and loop.steps > 0 and not nothing_trainable:
        return Hit(symptom="the loss logged for this model does not depend on any of its trainable parameters: the "
                   "steps follow a loss that never reaches them (computed from detached outputs, e.g. a "
                   "generator's loss on fake.detach())", evidence={"steps": loop.steps}, severity="error",
                   score=3.0)  # fmt: skip
    if loop is None or not loop.params_grad_none or loop.backward_calls == 0:
        return None
    share = share_of_trainable(loop.params_grad_none, report)
    severe = share is None or share >= 0.5
    unused = set(report.model.unused_modules) if report.model is not None else set()
    # or never ran: the Monitor hooks every leaf layer with parameters (JEM's energy head, which its model's
    # forward never calls, never showed)
    unused |= set(loop.layers_never_run)
    if not severe and all(name in unused or name.rpartition(".")[0] in unused for name in loop.params_grad_none):
        return Hit(
            symptom=f"{len(loop.params_grad_none)} trainable parameters got no gradient: their modules' outputs "
            "never reach the loss (computed and discarded, or never run)",
            evidence={"params_grad_none": loop.params_grad_none[:20], "unused_modules": sorted(unused)[:20],
                      "share_of_trainable": share},  # fmt: skip
            severity="info",
            score=0.5,
            refuted=True,  # modules the loss never reads explain nothing the rest of the model does
        )
    return Hit(
        symptom=f"{len(loop.params_grad_none)} trainable parameters got no gradient",
        evidence={
            "params_grad_none": loop.params_grad_none[:20],
            "params_grad_none_count": len(loop.params_grad_none),
            "share_of_trainable": share,
        },
        severity="error" if severe else "warning",
        score=1.0 + (share if share is not None else 1.0),
        # a head or two of many that gets no gradient cannot be why the rest learns nothing
        refuted=share is not None and share <= SMALL_DETACHED_SHARE,
    )


MASKED_SHARE = 0.05  # of a parameter's non-zero entries: no healthy loop zeroes their gradients by hand
MASKED_NOTED = 1e-3  # under this, a few weights a pruning threshold (abs(w) < eps) also catches: not worth a line


@rule(
    "NNDX330",
    C.FROZEN_PARAMETERS,
    "warning",
    "The loop zeroes the gradients of weights that are not zero",
    detects=f"On a recorded step, at least {MASKED_SHARE:.0%} of a parameter's non-zero entries had a gradient at "
    "the end of backward and none at optimizer.step(): the loop zeroed them in between (info under that share, "
    f"nothing under {MASKED_NOTED:.1%}: the few tiny weights a pruning threshold like abs(w) < eps also catches). "
    "Gradients autograd itself left at zero (weights on an input that is always 0) and the masked gradients of "
    "weights held at zero (pruned weights) do not count.",
    why="Pruning code freezes pruned weights by masking their gradients; a mask built with `w < eps` instead of "
    "`abs(w) < eps` (the Lottery Ticket code's) also freezes every negative weight: half the network never "
    "trains, and the run still converges, to a worse accuracy.",
    fix="Build the mask from the pruning mask itself (or abs(w) < eps), and check which weights it freezes; "
    "if you froze these weights on purpose, this is what you asked for.",
)
def gradients_masked_by_hand(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not loop.grads_masked_by_hand:
        return None
    name, share = max(loop.grads_masked_by_hand.items(), key=lambda item: (item[1], item[0]))
    if share < MASKED_NOTED:
        return None
    return Hit(
        symptom=f"{share:.0%} of the non-zero entries of {name} had their gradient zeroed between backward and the "
        "optimizer step",
        evidence={"parameter": name, "masked_share": share, "parameters_masked": len(loop.grads_masked_by_hand)},
        severity=None if share >= MASKED_SHARE else "info",
        score=1.5 + share,
    )


@rule(
    "NNDX305",
    C.FROZEN_PARAMETERS,
    "warning",
    "Parameters frozen (requires_grad=False) and nothing else learns",
    detects="Frozen parameters while nothing trainable remains (error; info when the optimizer trains tensors "
    "outside the model instead: an input image or a latent optimised through a fixed network, as neural style "
    "transfer does); frozen weights of which at least "
    "half still hold a standard initialisation — PyTorch's default uniform, a He/Xavier/LeCun normal, a "
    "norm layer's ones (warning); or "
    "frozen parameters, at least 1% of the model's, while the train loss is not moving (warning; DINO's fixed "
    "weight-norm gain is 0.2% and cannot be why nothing learns). A frozen trained backbone whose "
    "trainable head lowers the loss, or whose loss starts under half an uninformed prediction's, is "
    "reported as info. Frozen parameters that follow trained ones are left alone: a module whose frozen weight "
    "matrices mostly equal trainable ones of the same shape (the copy MoCo, BYOL, a DQN target or a mean teacher "
    "makes), or frozen parameters the Monitor saw change with no gradient (a momentum update).",
    why="Parameters left frozen by mistake (a fine-tuning recipe that never unfreezes, a copy-pasted "
    "requires_grad=False, a backbone frozen before its pretrained weights were loaded) stop the model "
    "learning or leave it random features under a head; deliberate freezing of trained weights is fine.",
    fix="Load the pretrained weights before freezing them, or set requires_grad=True on the parameters "
    "meant to train and rebuild the optimizer over them.",
)
def frozen(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not set(loop.frozen_params) - set(loop.frozen_tracking):
        return None  # nothing frozen, or only copies that follow the trained weights (a momentum encoder)
    trainable = report.model.trainable_param_count if report.model is not None else None
    if trainable is None or (report.model is not None and report.model.param_count == 0):
        trainable = loop.trainable_param_count
    curve = loss_curve(report)
    evidence = {
        "frozen_params": loop.frozen_params[:20],
        "frozen_count": len(loop.frozen_params),
        "trainable_param_count": trainable,
        "loss_relative_progress": curve.progress if curve.n >= 10 else None,
        "frozen_at_init": (loop.frozen_at_init or [])[:20],
        "frozen_checked": loop.frozen_checked,
    }
    if trainable == 0 and loop.optimizer_params_not_in_model:
        return Hit(symptom=f"every parameter of the model is frozen, and the optimizer trains "
                   f"{loop.optimizer_params_not_in_model} tensors outside it: an input or a latent being optimised "
                   "through a fixed model (style transfer, an adversarial example, GAN inversion)",
                   evidence=evidence | {"optimizer_params_not_in_model": loop.optimizer_params_not_in_model},
                   severity="info", score=0.5)  # fmt: skip
    if trainable == 0:
        return Hit(symptom="every parameter is frozen", evidence=evidence, severity="error", score=3.0)
    if frozen_untrained(report):
        return Hit(
            symptom=f"{len(loop.frozen_at_init or [])} of {loop.frozen_checked} frozen weight tensors still hold "
            "their random initialisation: the frozen part was never trained or loaded",
            evidence=evidence,
            score=2.5,
        )
    total = report.model.param_count if report.model is not None else 0
    tiny = bool(total) and trainable is not None and 0 < total - trainable < 0.01 * total
    if curve.n >= 10 and curve.progress < 0.05 and not starts_fitted(report) and not tiny:
        return Hit(
            symptom=f"{len(loop.frozen_params)} parameters frozen and the loss is not moving",
            evidence=evidence,
            score=2.0,
        )
    return Hit(
        symptom=f"{len(loop.frozen_params)} parameters frozen; the rest trains"
        + (" (under 1% of the model's: not why the loss is not moving)" if tiny else ""),
        evidence=evidence,
        severity="info",
        score=0.5,
        refuted=tiny,  # too small a part to explain a stalled loss
    )


@rule(
    "NNDX328",
    C.EVAL_MODE_FORGOTTEN,
    "warning",
    "A frozen network runs in train mode",
    detects="Forwards (3 or more) with gradients enabled of a model that had no trainable parameter at any of them "
    "while its dropout or batch-norm layers were in train mode: a fixed network (neural style transfer's "
    "feature extractor) run without .eval(), where nothing the Monitor watches trains. A frozen backbone under a "
    "head that trains, or a frozen encoder watched beside its decoder, is left alone: a fine-tuning recipe's choice.",
    why="requires_grad_(False) stops the weights, not the modes: batch-norm still normalises with the batch's own "
    "statistics (of a single image, in style transfer) and keeps overwriting its running statistics, and dropout "
    "still drops units, so the fixed network computes something else than the one that was trained.",
    fix="Call .eval() on the frozen network (and again after any .train() on a model that contains it).",
)
def frozen_in_train_mode(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or loop.frozen_train_mode_forwards < 3 or not (loop.has_dropout or loop.has_batchnorm):
        return None
    if loop.trainable_param_count:
        return None  # a frozen part beside one that trains (a captioning encoder under its decoder): the recipe's
    return Hit(
        symptom=f"{loop.frozen_train_mode_forwards} forwards of a model with no trainable parameter ran with its "
        + " and ".join(name for name, has in (("dropout", loop.has_dropout), ("batch-norm", loop.has_batchnorm)) if has)
        + " in train mode",
        evidence={"frozen_train_mode_forwards": loop.frozen_train_mode_forwards, "forward_calls": loop.forward_calls,
                  "has_dropout": loop.has_dropout, "has_batchnorm": loop.has_batchnorm},  # fmt: skip
        score=2.0,
    )


IN_STEP_SHARE = 0.8  # no-grad train-mode forwards at this share of the steps are part of the step


@rule(
    "NNDX306",
    C.EVAL_MODE_FORGOTTEN,
    "warning",
    "Evaluation ran in train mode (model.eval() forgotten)",
    detects="Forwards run under torch.no_grad()/inference_mode while model.training was True, in a model "
    f"with dropout or batch-norm. Info when they ran at {IN_STEP_SHARE:.0%} of the steps or more (5 at least): "
    "part of every training step (MixMatch's label guessing, pseudo-labels drawn in train mode by design), not "
    "an evaluation, which runs at a few steps. Or: losses logged under an evaluation split (val, test...) after "
    "forwards with grad enabled in train mode that no backward followed (a validation loop with neither "
    "torch.no_grad() nor model.eval()).",
    why="In train mode dropout drops units and batch-norm normalises with the batch's statistics (and "
    "updates its running ones): evaluation numbers are noisy and wrong, and the running stats drift.",
    fix="Call model.eval() before evaluating and model.train() before training again.",
)
def eval_mode_forgotten(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not (loop.has_dropout or loop.has_batchnorm):
        return None
    if loop.no_grad_forwards_in_train_mode == 0 and loop.train_mode_evaluations:
        return Hit(
            symptom=f"{loop.train_mode_evaluations} evaluation losses were logged after forwards in train mode that "
            "no backward followed",
            evidence={"train_mode_evaluations": loop.train_mode_evaluations, "steps": loop.steps,
                      "has_dropout": loop.has_dropout, "has_batchnorm": loop.has_batchnorm},  # fmt: skip
            score=1.5,
        )
    if loop.no_grad_forwards_in_train_mode == 0:
        return None
    in_step = loop.steps >= 5 and loop.no_grad_train_forward_steps >= IN_STEP_SHARE * loop.steps
    return Hit(
        symptom=f"{loop.no_grad_forwards_in_train_mode} no-grad forwards in train mode"
        + (f", at {loop.no_grad_train_forward_steps} of {loop.steps} steps: part of each training step (label "
           "guessing, pseudo-labels), not an evaluation" if in_step else ""),
        evidence={
            "no_grad_forwards_in_train_mode": loop.no_grad_forwards_in_train_mode,
            "no_grad_train_forward_steps": loop.no_grad_train_forward_steps,
            "steps": loop.steps,
            "forward_calls": loop.forward_calls,
            "has_dropout": loop.has_dropout,
            "has_batchnorm": loop.has_batchnorm,
        },
        severity="info" if in_step else None,
        score=(1.0 + min(1.0, loop.no_grad_forwards_in_train_mode / max(1, loop.forward_calls)))
        / (4 if in_step else 1),
    )


@rule(
    "NNDX323",
    C.EVAL_MODE_FORGOTTEN,
    "warning",
    "Training ran in eval mode (model.train() not called back)",
    detects="Backward passes whose forward ran with model.training False, in a model with dropout or batch-norm: "
    "at least 3, and a fifth of all backward passes. The usual origin is model.train() called once before the "
    "epoch loop and model.eval() inside it for validation, so every epoch after the first validation trains "
    "in eval mode.",
    why="In eval mode dropout drops nothing and batch-norm normalises with its running statistics, which eval "
    "mode also stops updating: the network trains as a different one, without regularisation and with "
    "normalisation frozen at whatever the statistics were.",
    fix="Call model.train() at the start of every training epoch (or right after each validation). If eval mode "
    "during training is deliberate (frozen batch-norm statistics when fine-tuning), set it on the norm layers "
    "only, so the rest trains in train mode.",
)
def train_mode_forgotten(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not (loop.has_dropout or loop.has_batchnorm):
        return None
    count, total = loop.backward_after_eval_forward, max(1, loop.backward_calls)
    if count < 3 or count < 0.2 * total:
        return None
    switch = loop.first_eval_backward_step
    # the loss finite and settled in train mode, then non-finite or three times its level within
    # a few steps of the switch: the switch, not the LR, set it off (batch-norm on statistics frozen
    # at their early values leaves activations unnormalised)
    points = train_curve(report) if switch is not None else []
    before = [p.value for p in points if p.step < switch]
    after = [p.value for p in points if switch <= p.step < switch + 10]
    diverged = (len(before) >= 3 and all(math.isfinite(v) for v in before)
                and any(not math.isfinite(v) or v > 3 * median(before) for v in after))  # fmt: skip
    return Hit(
        symptom=f"{count} of {loop.backward_calls} backward passes followed a forward in eval mode"
        + (f", from step {switch}" if switch is not None else "")
        + (", and the loss diverged within 10 steps of it" if diverged else ""),
        evidence={
            "backward_after_eval_forward": count,
            "backward_calls": loop.backward_calls,
            "first_eval_backward_step": switch,
            "diverged_after_switch": diverged,
            "has_dropout": loop.has_dropout,
            "has_batchnorm": loop.has_batchnorm,
        },
        severity="error" if diverged else None,
        # a divergence that starts at the switch is this rule's evidence, stronger than any update ratio it causes
        score=(10.0 if diverged else 0.0) + 1.0 + count / total,
        step=switch,
    )


# an LR at or under 1e-3 of its peak for at least this share of the recorded steps is a warning
COLLAPSED_SHARE = 0.5
# an LR at or under this share of its peak from the first tenth of the run on, for most of it, was
# decayed by a schedule sized in epochs and stepped every batch: published step decays cut at half
# the run or later (NNDX307)
DECAYED = 0.05
DECAYED_BY = 0.1
DECAYED_SHARE = 0.8
ZERO_LR_RECORDS = 3  # an LR of exactly 0 at this many recorded steps and every other
ZERO_SHARE = 0.1  # an LR of exactly 0 at this share of the recorded steps (a warm-up from 0 has one)
ASCENT_ROW = 3  # measured step sizes below zero in a row: an LR that turned negative, not an overshoot
# a schedule that decayed gradually (no two recorded LRs more than GRADUAL apart: a cosine or linear
# decay, not a step decay's or a plateau's cuts) to a floor at or under FLOOR_AT of its peak, and held
# it for the last FLOOR_SHARE of the run or more, was read faster than it was sized (Swin's
# step_update per micro-batch ran its cosine out at half the run); recipes cool down for a few percent
FLOOR_AT, FLOOR_SHARE, GRADUAL = 0.1, 0.4, 1.5
# an LR that never fell over this share of the run, still rising at its end: a warm-up longer than the run
WARMING_SHARE = 0.6


@rule(
    "NNDX307",
    C.LR_SCHEDULE_MISUSE,
    "warning",
    "The learning-rate schedule collapses or cycles the LR",
    detects=f"An optimizer's learning rate of exactly 0 at every recorded step ({ZERO_LR_RECORDS} or more; error: "
    "a warm-up never stepped, LARS built with lr=0 for an adjust_learning_rate the loop never calls); "
    "a learning rate below zero at any recorded step (error: every step then climbs the loss; a linear "
    "decay stepped past its end, LambdaLR's 1 - epoch / n stepped per batch, goes there; in a loop without an "
    f"optimizer: updates that climbed the gradient at {ASCENT_ROW} recorded steps in a row); a learning rate at or "
    "below 1e-3 of its maximum for more than a quarter of the recorded steps (info under half of them, unless a "
    "quarter are exactly 0: a published step decay's last stages, four 10x cuts, sit there for up to ~40% of the "
    "run; in a loop "
    "without an optimizer: the size of the step measured as |update| / |gradient|, whatever its sign, since under "
    "momentum one step in a few goes against the gradient; judged per param group too, of every "
    "optimizer, for a group that ends collapsed beside another group's LR that held to the end, as a center "
    "loss's own SGD beside the model's schedule); or an optimizer's LR that climbs "
    "back, gradually (through at least one step between), from under 10% of its peak to 90% of it twice or more; or "
    f"an LR at or under {DECAYED:g} of its peak from the first {DECAYED_BY:.0%} of the recorded steps on, for "
    f"{DECAYED_SHARE:.0%} of them or more (MultiStepLR's milestones in epochs reached in the first batches; info "
    f"when the loss still learned); or an LR of exactly 0 at {ZERO_SHARE:.0%} of the recorded steps or more, two at "
    "least (a per-iteration schedule read at the epoch; info when the loss still learned); or an LR that decayed "
    f"gradually (no two records more than {GRADUAL:g}x apart: a cosine or linear decay, not a step decay's cuts) to a "
    f"floor at or under {FLOOR_AT:g} of its peak and held it for the last {FLOOR_SHARE:.0%} of the recorded steps or "
    "more (a schedule stepped per micro-batch, or sized for a shorter run, runs out early); or an LR that never fell "
    f"over the last {WARMING_SHARE:.0%} of the recorded steps or more, rose over twice in them, ends at its peak "
    "and still rose in the last tenth (a warm-up longer than the run: llama2.c's warmup_iters=1000 for 400; info "
    "when the loss still learned: BERT-pytorch's Noam warm-up of 10,000 steps, which short runs stay inside; never "
    "in a live alert, where the run has not ended). "
    "Cosine or one-cycle schedules sized in batches only get low in the last few percent and climb once at "
    "most, so they do not fire; warm restarts jump back to the peak in one step, a cyclic LR stays above 10%.",
    why="A per-epoch schedule (StepLR, ExponentialLR) stepped every batch decays the LR to ~0 within "
    "the first epoch; training then stops. A cosine schedule sized in epochs (CosineAnnealingLR's T_max) and "
    "stepped every batch runs past its end and climbs back: the LR cycles between ~0 and its peak every few "
    "dozen batches and training ends wherever the cycle happens to be.",
    fix="Call scheduler.step() once per epoch for per-epoch schedules, or size the schedule in batches "
    "(OneCycleLR total_steps = epochs * batches; CosineAnnealingLR T_max = epochs * batches).",
)
def lr_schedule_misuse(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    # without an optimizer the LR is in the user's code: its measured step size stands for it
    measured = loop is not None and not loop.lr_history
    history = sorted((loop.lr_history or loop.effective_lr_history) if loop else [], key=lambda p: p.step)
    # a measured step is negative where the update went up the gradient: under momentum, one in a few is
    # (the velocity outlasts a gradient that turned); its size, not its sign, is what collapses
    lrs = [max(map(abs, finite(p.lrs)) if measured else finite(p.lrs), default=0.0) for p in history]
    if len(history) >= ZERO_LR_RECORDS and not measured and all(p.lrs and max(map(abs, p.lrs)) == 0 for p in history):
        return Hit(
            symptom=f"the learning rate was 0 at every one of {len(history)} recorded steps: no step can move the "
            "weights (a warm-up or schedule never stepped, an LR set by a function the loop never calls)",
            evidence={"lr_records": len(history), "lr_first_step": history[0].step, "lr_last_step": history[-1].step,
                      "scheduled_lrs": finite(loop.scheduled_lrs)[:4]},  # fmt: skip
            severity="error",
            score=3.0,
            step=history[0].step,
        )
    if len(history) < 8:
        return None
    peak = max(lrs)
    if peak <= 0:
        return None
    negative = [i for i, p in enumerate(history) if min(finite(p.lrs) or [0.0]) < 0]
    if measured:  # an update that climbed the gradient: one is an overshoot, a row of them an LR below zero
        negative = negative if _longest_row(negative) >= ASCENT_ROW else []
    if negative:
        lowest = min(min(finite(p.lrs)) for p in history if finite(p.lrs))
        return Hit(
            symptom=f"the learning rate went negative at step {history[negative[0]].step} (down to {lowest:.3g}): "
            "from there every step climbs the loss",
            evidence={"lr_peak": peak, "lr_lowest": lowest, "lr_final": lrs[-1],
                      "negative_share": len(negative) / len(lrs), "negative_from_step": history[negative[0]].step},
            severity="error",
            score=3.0,
            step=history[negative[0]].step,
        )
    collapsed = _collapsed(lrs, peak)
    share = len(collapsed) / len(lrs)
    group = None
    if share <= 0.25:
        rises = [] if measured else _gradual_rises(lrs, peak)
        if len(rises) >= 2:
            return Hit(
                symptom=f"the learning rate climbed back from under 10% of its peak to its peak {len(rises)} times: "
                "a schedule sized in epochs, stepped every batch, cycles",
                evidence={"lr_peak": peak, "lr_final": lrs[-1], "lr_cycles": len(rises),
                          "first_climb_step": history[rises[0]].step},  # fmt: skip
                score=1.0 + min(1.0, len(rises) / 10),
                step=history[rises[0]].step,
            )
        decayed = [] if measured else _decayed_early(lrs, peak)
        if decayed:
            learned = loss_learned(report)
            return Hit(
                symptom=f"the learning rate fell to {lrs[decayed[0]] / peak:.2g} of its peak by step "
                f"{history[decayed[0]].step}, within the first tenth of the run, and stayed there for "
                f"{len(decayed) / len(lrs):.0%} of it: milestones or a decay meant for epochs, stepped every batch"
                + ("; the loss still learned" if learned else ""),
                evidence={"lr_peak": peak, "lr_final": lrs[-1], "decayed_share": len(decayed) / len(lrs),
                          "decayed_from_step": history[decayed[0]].step},  # fmt: skip
                severity="info" if learned else None,
                score=1.0 + len(decayed) / len(lrs),
                step=history[decayed[0]].step,
            )
        zeros = [] if measured else [i for i, lr in enumerate(lrs) if lr == 0]
        if len(zeros) >= max(2, ZERO_SHARE * len(lrs)):
            learned = loss_learned(report)
            return Hit(
                symptom=f"the learning rate was exactly 0 at {len(zeros)} of {len(lrs)} recorded steps (from step "
                f"{history[zeros[0]].step}): those steps moved nothing (a schedule indexed by epoch where it "
                "expects the iteration, a warm-up from 0 stepped per epoch)" + ("; the loss still learned" if learned
                                                                               else ""),
                evidence={"lr_peak": peak, "lr_final": lrs[-1], "zero_share": len(zeros) / len(lrs),
                          "zero_from_step": history[zeros[0]].step},  # fmt: skip
                severity="info" if learned else None,
                score=1.0 + len(zeros) / len(lrs),
                step=history[zeros[0]].step,
            )
        # or one param group's LR collapsed behind another's steady one (center loss's own SGD at 0.5
        # beside the model's StepLR stepped every batch): judged per group, when it ends collapsed
        hidden = None if measured else _collapsed_group(history)
        if hidden is None:
            # live, the run has not ended: a warm-up under way is no warm-up longer than the run
            rising = [] if measured or loop.live_window is not None else _still_warming(lrs, peak)
            if rising:
                learned = loss_learned(report)
                return Hit(
                    symptom=f"the learning rate rose for the last {len(rising) / len(lrs):.0%} of the run and was "
                    f"still rising at its end ({lrs[rising[0]]:.3g} -> {lrs[-1]:.3g}): a warm-up longer than the run "
                    "never reached the LR the schedule aims at" + ("; the loss still learned" if learned else ""),
                    evidence={"lr_first": lrs[0], "lr_final": lrs[-1], "rising_share": len(rising) / len(lrs),
                              "rising_from_step": history[rising[0]].step},  # fmt: skip
                    severity="info" if learned else None,
                    score=1.0 + len(rising) / len(lrs),
                    step=history[rising[0]].step,
                )
            floored = [] if measured else _floored(lrs, peak)
            if floored:
                return Hit(
                    symptom=f"the learning rate decayed to its floor {lrs[-1]:.3g} ({lrs[-1] / peak:.2g} of its "
                    f"peak) by step {history[floored[0]].step} and stayed there for the last "
                    f"{len(floored) / len(lrs):.0%} of the run: a schedule read faster than it was sized (stepped per "
                    "micro-batch, or sized for a shorter run)",
                    evidence={"lr_peak": peak, "lr_final": lrs[-1], "floor_share": len(floored) / len(lrs),
                              "floor_from_step": history[floored[0]].step},  # fmt: skip
                    score=1.0 + len(floored) / len(lrs),
                    step=history[floored[0]].step,
                )
            return None
        group, lrs, peak, collapsed = hidden
        share = len(collapsed) / len(lrs)
    return Hit(
        symptom=f"learning rate at or under 1e-3 of its peak for {share:.0%} of the recorded steps"
        + (f" in param group {group} (of all optimizers, in order), while another group's LR held" if group is not None
           else ""),
        evidence={
            **({"param_group": group} if group is not None else {}),
            "lr_peak": peak,
            "lr_final": lrs[-1],
            "collapsed_share": share,
            "collapsed_from_step": history[collapsed[0]].step,
            "lr_source": "the step size measured as |update| / |gradient| (no optimizer)" if measured else "the optimizer",
        },
        # ArcFace's recipe (StepLR every 10 of 50 epochs) spends 40% of its run there by design;
        # an epoch schedule stepped every batch spends most of it there
        # an LR of exactly 0 is no recipe: a linear decay clamped after its end stopped training
        severity="info" if share < COLLAPSED_SHARE and sum(lr == 0 for lr in lrs) <= 0.25 * len(lrs) else None,
        score=1.0 + share,
        step=history[collapsed[0]].step,
    )


def _longest_row(indices: list[int]) -> int:
    """The longest run of consecutive numbers in the ascending ``indices``."""
    longest = run = 0
    for k, i in enumerate(indices):
        run = run + 1 if k and i == indices[k - 1] + 1 else 1
        longest = max(longest, run)
    return longest


def _decayed_early(lrs: list[float], peak: float) -> list[int]:
    """Indices where the LR is at or under DECAYED of its peak, when the first of them falls in
    the first DECAYED_BY of the run and they make DECAYED_SHARE of it or more; else none."""
    low = [i for i, lr in enumerate(lrs) if lr <= DECAYED * peak]
    early = low and low[0] < DECAYED_BY * len(lrs) and len(low) >= DECAYED_SHARE * len(lrs)
    return low if early else []


def _still_warming(lrs: list[float], peak: float) -> list[int]:
    """Indices of the run's rising tail, when the LR never fell over the last WARMING_SHARE of the
    run or more, ends at its peak, more than twice where that tail began, and still rose over the
    last tenth: a warm-up the run ended in; else none."""
    start = len(lrs) - 1
    while start > 0 and lrs[start - 1] <= lrs[start]:
        start -= 1
    tenth = max(1, len(lrs) // 10)
    if (len(lrs) - start < WARMING_SHARE * len(lrs) or lrs[-1] < peak or not lrs[-1] > 2 * lrs[start]
            or not lrs[-1] > lrs[-1 - tenth]):  # fmt: skip
        return []
    return list(range(start, len(lrs)))


def _floored(lrs: list[float], peak: float) -> list[int]:
    """Indices of the run's flat tail at the schedule's floor (0 < floor <= FLOOR_AT of the peak),
    when it holds for FLOOR_SHARE of the run or more and a gradual decay led there from the peak;
    else none."""
    floor = lrs[-1]
    if not 0 < floor <= FLOOR_AT * peak:
        return []
    start = flat_since(lrs)
    tops = [i for i in range(start) if lrs[i] >= 0.9 * peak]
    if len(lrs) - start < FLOOR_SHARE * len(lrs) or not tops:
        return []
    decay = lrs[tops[-1] : start + 1]
    if len(decay) < 4 or any(a > GRADUAL * b for a, b in zip(decay, decay[1:])):
        return []
    return list(range(start, len(lrs)))


def _collapsed(lrs: list[float], peak: float) -> list[int]:
    """Indices where the LR is at or under 1e-3 of its peak (to float precision:
    ReduceLROnPlateau(eps=1e-8) from 1e-5 stops exactly there)."""
    return [i for i, lr in enumerate(lrs) if lr <= 1e-3 * peak * (1 + 1e-6)]


def _collapsed_group(history: list) -> tuple[int, list[float], float, list[int]] | None:
    """(group index, its LRs, its peak, where it collapsed) of the param group (of every
    optimizer, in order) whose LR ends collapsed after more than a quarter of the recorded
    steps there, the longest such; None when no group does or the groups change in number.
    One that ends at its peak (a body unfrozen late) is a schedule, not a collapse; so is one
    beside which no group's LR held at the end: every group annealed together (ULMFiT's one-cycle
    stages with discriminative LRs, whose lowest group sits far under a peak it was given while
    frozen) is one schedule, judged as a whole."""
    widths = {len(p.lrs) for p in history}
    if len(widths) != 1 or (width := widths.pop()) < 2:
        return None
    worst, held = None, False
    for group in range(width):
        lrs = [lr if math.isfinite(lr) else 0.0 for lr in (p.lrs[group] for p in history)]
        peak = max(lrs)
        collapsed = _collapsed(lrs, peak) if peak > 0 else []
        held |= peak > 0 and (not collapsed or collapsed[-1] != len(lrs) - 1)
        if collapsed and collapsed[-1] == len(lrs) - 1 and len(collapsed) > 0.25 * len(lrs) and (
                worst is None or len(collapsed) > len(worst[3])):  # fmt: skip
            worst = (group, lrs, peak, collapsed)
    return worst if held else None


# a warm-up that kept the LR under this share of the LR its schedule scales (initial_lr) for the
# whole run, rising only in plateaus of at least PLATEAU_RECORDS equal recorded steps, advances
# once per epoch or iteration where it was sized in optimizer steps (NNDX327)
UNREACHED_SHARE = 0.1
# still climbing at the end of the run and under half its LR: a warm-up that was never going to end
CLIMBING_SHARE = 0.5
PLATEAU_RECORDS = 3


@rule(
    "NNDX327",
    C.LR_SCHEDULE_MISUSE,
    "warning",
    "A warm-up stepped too rarely never reaches its learning rate",
    detects="The optimizer's LR rose during the run but stayed under a tenth of the LR its scheduler scales (the "
    "param groups' initial_lr) — or under half of it while still climbing at the run's end, after 3 rises or "
    "more — and it rose in plateaus: the same LR over at least 3 recorded steps before each rise. A warm-up "
    "stepped every optimizer step rises at every record; one cut short by a short run does not "
    "plateau.",
    why="A warm-up sized in optimizer steps (LambdaLR(lambda s: min(1, (s + 1) / warmup_steps)), Hugging Face's "
    "get_linear_schedule_with_warmup) but stepped once per epoch or iteration advances a step at a time per "
    "epoch: the whole run trains at a small fraction of the intended LR, learns slowly and ends underfitted. "
    "Nothing crashes; the loss still falls.",
    fix="Call scheduler.step() after every optimizer.step() for schedules sized in steps (or size the warm-up in "
    "epochs for a per-epoch step).",
)
def warmup_stepped_rarely(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    scheduled = finite(loop.scheduled_lrs) if loop is not None else []
    history = sorted(loop.lr_history, key=lambda p: p.step) if loop is not None else []
    if not scheduled or max(scheduled) <= 0 or len(history) < 2 * PLATEAU_RECORDS:
        return None
    lrs = [max(finite(p.lrs) or [0.0]) for p in history]
    base, peak = max(scheduled), max(lrs)
    rises = [i for i in range(1, len(lrs)) if lrs[i] > lrs[i - 1] * (1 + 1e-9)]
    climbing = lrs[-1] >= peak and peak < CLIMBING_SHARE * base and len(rises) >= 3
    if not rises or (peak >= UNREACHED_SHARE * base and not climbing) or lrs[-1] <= lrs[0]:
        return None
    starts = [0] + rises
    if any(b - a < PLATEAU_RECORDS for a, b in zip(starts, starts[1:])):
        return None  # it rose between consecutive records somewhere: stepped as often as recorded
    return Hit(
        symptom=f"the LR rose from {lrs[0]:.3g} to {peak:.3g} in {len(rises)} jumps between plateaus and never "
        f"reached {'half' if peak >= UNREACHED_SHARE * base else 'a tenth'} of the {base:.3g} its scheduler scales: "
        "a warm-up stepped once per epoch or iteration",
        evidence={"scheduled_lr": base, "lr_peak": peak, "lr_first": lrs[0], "rises": len(rises),
                  "first_rise_step": history[rises[0]].step, "recorded_steps": len(lrs)},  # fmt: skip
        score=1.5,
        step=history[rises[0]].step,
    )


@rule(
    "NNDX331",
    C.LR_SCHEDULE_MISUSE,
    "warning",
    "The scheduler keeps the LR at a hundredth of its own from the first step",
    detects="Every recorded LR of the run (5 records or more) is under a hundredth of the LR its scheduler scales "
    "(the param groups' initial_lr), and the LR never rose to over twice its first value (a warm-up rises: "
    "NNDX327's).",
    why="LambdaLR multiplies the optimizer's lr by what its lambda returns: a lambda written to return the learning "
    "rate itself (cosine_annealing(step, total, lr, lr_min) where cosine_annealing(step, total, 1, lr_min / lr) was "
    "meant) trains at lr x lr — 1e-6 for lr 1e-3 — from the first step. Nothing crashes; the loss barely moves.",
    fix="Return a factor from a LambdaLR's lambda (1 at the start: cosine_annealing(step, total, 1, lr_min / lr)), "
    "or use a scheduler that takes learning rates (CosineAnnealingLR(optimizer, T_max, eta_min=lr_min)).",
)
def lr_scaled_twice(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    scheduled = finite(loop.scheduled_lrs) if loop is not None else []
    history = sorted(loop.lr_history, key=lambda p: p.step) if loop is not None else []
    lrs = [max(finite(p.lrs) or [0.0]) for p in history]
    if not scheduled or max(scheduled) <= 0 or len(lrs) < 5 or lrs[0] <= 0:
        return None
    base, peak = max(scheduled), max(lrs)
    if peak >= 0.01 * base or peak > 2 * lrs[0]:
        return None
    return Hit(
        symptom=f"the LR was {lrs[0]:.3g} from the first recorded step and at most {peak:.3g}, under a hundredth "
        f"of the {base:.3g} its scheduler scales",
        evidence={"scheduled_lr": base, "lr_first": lrs[0], "lr_peak": peak, "recorded_steps": len(lrs)},
        score=2.0 + min(2.0, math.log10(base / peak) - 2),
        step=history[0].step,
    )


def _gradual_rises(lrs: list[float], peak: float) -> list[int]:
    """Indices where the LR reached 90% of ``peak`` from under 10% of it through at least
    one value between: a cosine run past its end. A warm restart jumps in one step."""
    rises, low, between = [], False, False
    for i, lr in enumerate(lrs):
        if lr <= 0.1 * peak:
            low, between = True, False
        elif lr >= 0.9 * peak:
            if low and between:
                rises.append(i)
            low = False
        elif low:
            between = True
    return rises


@rule(
    "NNDX308",
    C.GRAD_CLIP_TOO_SMALL,
    "warning",
    "Gradient clipping shrinks almost every step",
    detects="Over at least 5 clipped steps, the median ratio of the gradient norm after clipping to "
    "before is under 0.1 and at least 80% of the steps are clipped. The Monitor reports the norm at "
    "backward with a GradScaler's loss scale divided out; in a report that still carries the scale "
    "(GradScaler.unscale_ divides the gradients by an exact power of two before clipping) it is "
    "recognised from the steps where only it changed the norm, and taken out. Info when the first fifth of "
    "the steps (at least 5) were clipped by a median ratio of 0.1 or more and the norm then grew tenfold, or "
    "when the train loss blew up past 10x its first value: a divergence cuts through any clip. Info as well "
    "when every optimizer divides by a running gradient scale (Adam, RMSprop, ...) and the clipped norm stays "
    "above 1e-6: such a step does not shrink with the gradient.",
    why="Clipping is a guard against rare spikes; a threshold below the typical gradient norm turns "
    "every step into a tiny one, like a far too low learning rate.",
    fix="Set max_norm near a high percentile of healthy-step gradient norms (nndx.fix.suggest_clip_norm).",
    # batches of one class pull every weight the same way: gradients far larger than the mixed
    # batches' a clip was set for
    explained_by=(C.UNSHUFFLED_DATA,),
)
def grad_clip_too_small(report: DiagnosticReport) -> Hit | None:
    clipped = clipped_steps(report)
    ratios = clip_ratios(report)
    if ratios is None:
        return None
    share = sum(1 for r in ratios if r < 0.999) / len(ratios)
    if median(ratios) >= 0.1 or share < 0.8:
        return None
    # a clip the first steps hardly needed, cutting hard only once the norm grew tenfold, is
    # what a divergence (an LR far too high) does to any clip: context, not the cause
    first = max(5, len(clipped) // 5)
    early, late = median(ratios[:first]), median([p.before_clip for p in clipped[-first:]])
    grew = early >= 0.1 and late > 10 * median([p.before_clip for p in clipped[:first]])
    curve = loss_curve(report)
    blew_up = curve.n >= 5 and curve.initial > 0 and max(curve.values) > 10 * curve.initial
    # Adam's step is m / sqrt(v): gradients scaled down by a clip move the weights as far as
    # unclipped ones (digits MLP, 10 epochs: 0.879 held-out accuracy with and without a clip at
    # 1e-4, where SGD fell to 0.106) — until the clipped entries sink toward eps
    after = median([p.after_clip for p in clipped])
    loop = _loop(report)
    adaptive = (loop is not None and bool(loop.optimizers) and set(loop.optimizers) <= vocab.SCALE_INVARIANT_OPTIMIZERS
                and after >= 1e-6)
    return Hit(
        symptom=f"clipping scales gradients by a median {median(ratios):.3g}"
        + (f", only since the gradient norm grew to {late:.3g} (the first steps: by {early:.3g})" if grew
           else ", while the loss blew up past 10x its first value" if blew_up
           else f" ({', '.join(loop.optimizers)} steps do not shrink with the gradient)" if adaptive else ""),
        evidence={
            "median_clip_ratio": median(ratios),
            "clipped_share": share,
            "median_norm_before": median([p.before_clip for p in clipped]),
            "median_norm_after": after,
            "early_clip_ratio": early,
        },
        severity="info" if grew or blew_up or adaptive else None,
        score=1.0 + min(3.0, -math.log10(max(median(ratios), 1e-12))),
    )


@rule(
    "NNDX309",
    C.SILENT_DATA_LOSS,
    "warning",
    "Some input batches arrive all zeros",
    detects="Recorded input-batch norms that are exactly 0 while others are not; error from 10% of "
    "the batches.",
    why="A zeroed batch (a failed decode, a mask applied twice, a collate bug) trains the model on "
    "nothing and biases it toward the label distribution.",
    fix="Find where the batch is zeroed in the data pipeline (decode errors swallowed, a transform "
    "returning zeros); assert non-zero inputs in the loader.",
)
def zero_batches(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or len(loop.input_norm_history) < 5:
        return None
    norms = [p.value for p in loop.input_norm_history]
    zero_steps = [p.step for p in loop.input_norm_history if p.value == 0.0]
    if not zero_steps or len(zero_steps) == len(norms):
        return None
    share = len(zero_steps) / len(norms)
    return Hit(
        symptom=f"{len(zero_steps)} of {len(norms)} input batches are all zeros",
        evidence={"zero_batches": len(zero_steps), "batches": len(norms), "first_zero_step": zero_steps[0]},
        severity="error" if share >= 0.1 else "warning",
        score=1.0 + share,
        step=zero_steps[0],
    )


@rule(
    "NNDX325",
    C.SILENT_DATA_LOSS,
    "error",
    "Validation ran, training never did",
    detects="A Monitor that saw no optimizer step, no backward pass and no logged train loss while at least two "
    "validation losses were logged: epochs went by over a training loader that yielded no batch.",
    why="A DataLoader with drop_last=True and a batch larger than the split (TabNet's fit default of 1024 on a "
    "smaller table), an empty split after filtering, or a sampler over zero indices yields nothing; the loop "
    "runs its epochs, validates the untrained model and prints a loss.",
    fix="Check len(train_loader) > 0 before training: lower the batch size below the split's size or set "
    "drop_last=False, and check the split and sampler are not empty.",
)
def no_training_step(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    validated = train_curve(report, "val")
    if loop is None or loop.steps or loop.backward_calls or train_curve(report) or len(validated) < 2:
        return None
    return Hit(symptom=f"{len(validated)} validation losses logged and not one training step",
               evidence={"val_points": len(validated), "steps": 0, "backward_calls": 0}, score=3.0)


@rule(
    "NNDX310",
    C.DDP_DESYNC,
    "error",
    "Data-parallel replicas drifted apart",
    detects="Steps where the parameter checksums of the ranks differed.",
    why="Replicas that disagree train different models: gradients were not all-reduced on some steps "
    "(the DDP wrapper bypassed, e.g. calling model.module directly) or parameters changed outside it.",
    fix="Always run the forward through the DDP-wrapped model; do not modify parameters on one rank "
    "only; broadcast buffers.",
)
def ddp_desync(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not loop.desync_steps:
        return None
    return Hit(
        symptom=f"rank parameters differ at {len(loop.desync_steps)} checked steps",
        evidence={
            "world_size": loop.world_size,
            "desync_steps": len(loop.desync_steps),
            "first_desync_step": min(loop.desync_steps),
            "max_desync": loop.max_desync,
        },
        score=2.0,
        step=min(loop.desync_steps),
    )


# a step whose loss averages over this many targets (a few images of pixels, a few long
# sequences of tokens) is no tiny batch, whatever its sample count
DENSE_TARGETS = 256
CONVERGED_PROGRESS = 0.9  # a loss that fell by this share of its start fit its data


@rule(
    "NNDX311",
    C.BATCH_TOO_SMALL,
    "warning",
    "Tiny batches make the loss noisy",
    detects="A batch of at most 4 samples at the loss (the size most loss calls were made with, so that "
    "evaluation on large batches does not hide it; along the axis the sample-independence probe found the "
    "samples on, else the first; a one-value output with no targets is a loss the model computed itself, "
    "no batch) together with step-to-step loss swings over 20% "
    "of the local loss level, or through BatchNorm whatever the swings (its batch statistics over a few "
    "samples are noise). Info in a preflight (no loss history): the probes' batch that small; "
    f"info too when each step averages over {DENSE_TARGETS} targets or more (a few images in "
    "super-resolution or segmentation, a few long sequences): there the swings are the samples' "
    "differences, and a small batch is a common, deliberate choice; when the loss fell by "
    f"{CONVERGED_PROGRESS:.0%} of its start or more: the run fit its data at that batch size (those three "
    "explain no other finding). Silent at a "
    "batch of one sample without BatchNorm: online training is a design (models written for one sequence "
    "at a time), not a slip, so it is no candidate cause of what the run gets wrong; that shows in other "
    "evidence (a swinging loss there is read as the LR's, as at any batch size).",
    why="Gradient noise grows as the batch shrinks; steps point in nearly random directions.",
    fix="Increase the batch size (or accumulate gradients over several micro-batches), and lower the LR "
    "if the batch must stay small; with BatchNorm, use GroupNorm or LayerNorm for batches that small "
    "(accumulation does not enlarge BatchNorm's batch).",
)
def batch_too_small(report: DiagnosticReport) -> Hit | None:
    # the training batch is the one most loss calls were made with: a few evaluation calls on
    # large batches are not what the steps were taken on
    calls: dict[int, int] = {}
    per_sample: dict[int, int] = {}  # targets per sample, by batch size
    axis = samples_axis(report)
    for c in loss_calls(report):
        # a model that computes its own loss (RetinaNet's forward returns its focal and box losses)
        # hands the loss one value of shape [1] and no targets: that is no batch of one
        if c.output_shape and not (len(c.output_shape) == 1 and c.output_shape[0] == 1 and c.target_shape is None):
            # an output with an axis after it: (time, batch, features); a time-major RNN's (batch, classes) head has not
            at = axis if len(c.output_shape) > axis + 1 else 0
            size = c.output_shape[at]
            calls[size] = calls.get(size, 0) + c.calls
            shape = c.target_shape if c.target_shape else [size]
            per_sample[size] = max(per_sample.get(size, 1), math.prod(shape) // max(1, size))
    curve = loss_curve(report)
    size = max(calls, key=lambda s: (calls[s], s)) if calls else None
    if size is None or size > 4:
        return None
    targets = size * per_sample[size]
    evidence = {"batch_size": size, "targets_per_step": targets}
    if curve.n < 10:  # a preflight: the batch is all there is to see
        return Hit(severity="info", symptom=f"the probes were given a batch of {size}: if training uses batches "
                   "this small, each step follows mostly noise", evidence=evidence, score=1.0,
                   refuted=True)  # fmt: skip
    # BatchNorm in training normalises each batch by its own statistics: of a few samples they
    # are noise, whatever the loss curve shows
    batchnorm = bool(report.loop and report.loop.has_batchnorm) or bool(report.model and report.model.has_batchnorm)
    if curve.multiplicative_noise <= 0.2 and not batchnorm:
        return None
    # one sample a step is a design, not a slip: online training, and models written for one
    # sequence at a time (the PyTorch n-gram, char-RNN and BiLSTM-CRF tutorials). Even as a note
    # it would be a candidate root of the run's alarms (a loss the LR makes swing), which a
    # design never is; what such a run gets wrong shows in its own evidence
    if size == 1 and not batchnorm:
        return None
    dense = targets >= DENSE_TARGETS
    # a loss that fell to a tenth of its start or below fit its data at that batch size: swings
    # relative to so low a level are a few samples' differences (the PyTorch CIFAR-10 tutorial
    # trains at batch 4 to 2% of its start loss)
    fitted = curve.progress >= CONVERGED_PROGRESS
    swings = f"step-to-step loss swings of {curve.multiplicative_noise:.0%}"
    return Hit(
        symptom=f"batch size {size} " + (f"through BatchNorm, which normalises with {size} samples' statistics; "
                                         if batchnorm else "with ") + swings
        + (f" ({targets} targets a step: the swings are mostly the samples' differences)" if dense else "")
        + (f"; the loss still fell to {1 - curve.progress:.0%} of its start" if fitted and not dense else ""),
        evidence=evidence | {"relative_swing": curve.multiplicative_noise, "relative_progress": curve.progress},
        severity="info" if dense or fitted else None,
        score=(1.0 + curve.multiplicative_noise) / (2 if dense or fitted else 1),
        refuted=dense or fitted,  # a deliberate size, or one the run fit its data at: it roots nothing
    )


# --------------------------------------------------------------------------- at the loss


@rule(
    "NNDX312",
    C.SHAPE_BROADCAST,
    "error",
    "Output and target shapes broadcast silently in the loss",
    detects="A regression loss (MSE, L1, SmoothL1, Huber) whose output and target shapes differ and broadcast "
    "to more elements than one of them holds, e.g. a [N, 1] output against a [N] target (at a batch of one, [1, 1] "
    "against [1] compares each output with its own target); or a loss of the user's own in which an elementwise "
    "op (u - u_pred) "
    "broadcast an output-shaped and a target-shaped tensor to a larger shape, or a tensor computed from the output "
    "and one from the targets alone whose batch axes met (a DQN's gathered [N, 1] Q-values minus [N] TD targets).",
    why="Broadcasting turns [N,1] - [N] into an [N,N] matrix: the loss compares every output with every "
    "target, training converges to the mean and nothing errors.",
    fix="Make the shapes equal: output.squeeze(-1) or target.unsqueeze(-1) / target.view_as(output).",
)
def shape_broadcast(report: DiagnosticReport) -> list[Hit]:
    hits = []
    for call in loss_calls(report):
        if call.broadcast_shape is not None:
            a, b = call.broadcast_operands or (call.output_shape, call.target_shape)
            hits.append(Hit(
                symptom=f"{call.loss_type} combines {a} from the output with {b} from the targets into "
                f"{call.broadcast_shape}",
                evidence={"loss_type": call.loss_type, "operand_shapes": [str(a), str(b)],
                          "broadcast_shape": [str(d) for d in call.broadcast_shape]},
                score=3.0))  # fmt: skip
        if call.loss_type in vocab.REGRESSION_LOSS_NAMES and call.target_shape is not None:
            if _broadcast_grows(call.output_shape, call.target_shape):
                hits.append(
                    Hit(
                        symptom=f"{call.loss_type} on output {call.output_shape} vs target {call.target_shape}",
                        evidence={
                            "loss_type": call.loss_type,
                            "output_shape": [str(d) for d in call.output_shape],
                            "target_shape": [str(d) for d in call.target_shape],
                        },
                        score=3.0,
                    )
                )
    return hits[:1]


def _broadcast_grows(a: list[int], b: list[int]) -> bool:
    """Whether broadcasting shapes ``a`` and ``b`` gives more elements than one of them holds
    (``[N, 1]`` with ``[N]`` is ``[N, N]``; ``[N, 4]`` with ``[N, 1]`` repeats each target
    4 times), or fails; ``[1, 1]`` with ``[1]`` (a batch of one) compares each output with
    its own target, as a loss should."""
    size = 1
    for x, y in zip(reversed([1] * (len(b) - len(a)) + list(a)), reversed([1] * (len(a) - len(b)) + list(b))):
        if x != y and 1 not in (x, y):
            return True
        size *= max(x, y)
    return size > min(math.prod(a), math.prod(b))


def _is_float(dtype: str | None) -> bool:
    return dtype is not None and ("float" in dtype or "double" in dtype or "half" in dtype)


def _is_int(dtype: str | None) -> bool:
    return dtype is not None and ("int" in dtype or "long" in dtype or "uint8" in dtype)


# the padding id's share of the scored targets above which the model is largely trained to predict it
SCORED_PLACEHOLDER = 0.1


@rule(
    "NNDX317",
    C.WRONG_LOSS,
    "warning",
    "The loss scores the padding id as a class",
    detects="A classification loss (cross-entropy, NLL) whose most common scored target (not its ignore_index) is "
    f"the padding_idx of an embedding of the same vocabulary (the output's classes at least half its rows and at "
    f"most twice them), at {SCORED_PLACEHOLDER:.0%} or more of the scored targets: the positions with nothing to "
    "predict (padding, BERT4Rec's unmasked items labelled 0) are scored as the padding token.",
    why="Targets set to the padding id mean 'no target here'. Without ignore_index the loss trains the model to "
    "predict padding at every such position: the easiest class takes most of the gradient, the loss looks low, "
    "and the real predictions get a small share of the training.",
    fix="CrossEntropyLoss(ignore_index=pad_id) (or set those targets to -100); or mask the per-position loss and "
    "divide by the number of real targets.",
)
def placeholder_scored(report: DiagnosticReport) -> Hit | None:
    model = report.model
    if model is None:
        return None
    rows = {name: shape[0] for name, shape in weight_shapes(report).items()}
    for layer in model.layers:  # without parameter statistics: the table's rows from its size and width
        if layer.padding_idx is not None and layer.name not in rows and layer.output_shape:
            rows[layer.name] = layer.param_count // max(1, layer.output_shape[-1])
    pads = {(layer.padding_idx, rows.get(layer.name)) for layer in model.layers if layer.padding_idx is not None}
    for call in loss_calls(report):
        share, top = call.top_target_fraction, call.top_target
        if call.loss_type not in vocab.SOFTMAX_LOSS_NAMES or top is None or share is None or share < SCORED_PLACEHOLDER:
            continue
        classes = call.output_shape[1] if len(call.output_shape) >= 2 else None
        if classes is None or call.ignore_index == top:
            continue
        for pad, size in pads:
            if pad == top and size and size / 2 <= classes <= 2 * size:
                return Hit(
                    symptom=f"{share:.0%} of the targets {call.loss_type} scores are {top}, the padding id of an "
                    f"embedding of {size} rows, against {classes} classes",
                    evidence={"loss_type": call.loss_type, "padding_id": top, "scored_share": share,
                              "classes": classes, "embedding_rows": size, "ignore_index": call.ignore_index},
                    score=1.0 + share,
                )
    return None


@rule(
    "NNDX313",
    C.LABEL_DTYPE,
    "error",
    "Labels of the wrong dtype or encoding for the loss",
    detects="Float class-index targets (one value per sample) to CrossEntropyLoss/NLLLoss, integer targets "
    "to BCE losses, BCE targets outside [0, 1] (labels encoded as -1/+1, as an SVM or tanh output wants; dense "
    "targets from 0 to above 1 are NNDX334's), "
    "or classification labels stored as integral floats (0.0, 1.0, 2.0) for a CrossEntropy model (warning).",
    why="CrossEntropyLoss reads float targets as class probabilities and integer ones as indices; "
    "passing the wrong kind either errors or silently computes a different loss. BCE's targets are "
    "probabilities: with a target of -1 its loss has no minimum, and the logits grow without bound.",
    fix="Class indices: y.long() of shape [N]; BCE targets: y.float() of the output's shape, in [0, 1] "
    "(from -1/+1 labels: (y + 1) / 2); soft labels: float of shape [N, C].",
)
def label_dtype(report: DiagnosticReport) -> Hit | None:
    for call in loss_calls(report):
        if call.target_dtype is None:
            continue
        one_per_sample = call.target_shape is not None and len(call.target_shape) == 1
        if call.loss_type in vocab.SOFTMAX_LOSS_NAMES and _is_float(call.target_dtype) and one_per_sample:
            reason = f"float targets {call.target_dtype} of shape {call.target_shape} to {call.loss_type}"
        elif call.loss_type in ("BCELoss", "BCEWithLogitsLoss") and _is_int(call.target_dtype):
            reason = f"integer targets {call.target_dtype} to {call.loss_type}"
        elif (call.loss_type in ("BCELoss", "BCEWithLogitsLoss") and call.target_min is not None
              and call.target_max is not None and (call.target_min < 0.0 or call.target_max > 1.0)
              and not _unscaled_dense_targets(call)):
            reason = f"targets from {call.target_min:.4g} to {call.target_max:.4g} to {call.loss_type}, which reads them as probabilities in [0, 1]"
        else:
            continue
        return Hit(
            symptom=reason,
            evidence={"loss_type": call.loss_type, "target_dtype": call.target_dtype, "target_shape": [str(d) for d in call.target_shape or []]},
            score=3.0,
        )
    train = report.data.train if report.data is not None else None
    types = {c.loss_type for c in loss_calls(report)}
    if train is not None and train.label_kind == "float_integral" and types & vocab.SOFTMAX_LOSS_NAMES:
        return Hit(
            symptom=f"class labels stored as {train.label_dtype} for {', '.join(sorted(types & vocab.SOFTMAX_LOSS_NAMES))}",
            evidence={"label_dtype": train.label_dtype, "label_kind": train.label_kind},
            severity="warning",
            score=1.0,
        )
    return None


def _unscaled_dense_targets(call: LossCall) -> bool:
    """BCE targets of several values per sample (an image, a reconstruction), none below 0 and some above 1:
    a range left unscaled (pixels in 0..255), not an encoding of labels."""
    dense = call.target_shape is not None and len(call.target_shape) >= 2 and math.prod(call.target_shape[1:]) > 1
    return dense and call.target_min is not None and call.target_min >= 0.0 and (call.target_max or 0.0) > 1.0


@rule(
    "NNDX334",
    C.UNNORMALIZED_TARGETS,
    "error",
    "BCE targets of an unscaled range",
    detects="BCELoss or BCEWithLogitsLoss given targets of several values per sample (an image, a reconstruction), "
    "none below 0 and some above 1 (pixels in 0..255).",
    why="Binary cross-entropy reads each target as a probability. A target of 255 has no matching prediction: "
    "BCE with logits then falls without bound (every logit pushed to +inf), and BCE on probabilities is minimised "
    "by outputs stuck at 1. An autoencoder given raw pixels as inputs and targets trains on neither scale.",
    fix="Scale the data to [0, 1] (x / 255, or ToTensor()) before it is both input and target; or use a regression "
    "loss (MSE) on standardised targets.",
)
def bce_targets_unscaled(report: DiagnosticReport) -> Hit | None:
    for call in loss_calls(report):
        if call.loss_type in ("BCELoss", "BCEWithLogitsLoss") and _unscaled_dense_targets(call):
            return Hit(
                symptom=f"{call.loss_type} given targets {list(call.target_shape or [])} from {call.target_min:.4g} to "
                f"{call.target_max:.4g}: probabilities in [0, 1] are what it reads",
                evidence={"loss_type": call.loss_type, "target_min": call.target_min, "target_max": call.target_max,
                          "target_shape": [str(d) for d in call.target_shape or []]},  # fmt: skip
                score=3.0,
            )
    return None


@rule(
    "NNDX314",
    C.DOUBLE_SOFTMAX,
    "error",
    "Softmax/sigmoid applied before a loss that applies its own",
    detects="The logged loss's autograd graph shows the loop applying softmax (sigmoid) to the model's outputs "
    "and the loss applying log_softmax (BCE with logits) after it, with only shape ops between (indexing, views: "
    "whichever way the loop called its loss); or "
    "CrossEntropyLoss, or a loss of the user's own seen applying softmax or log_softmax to the outputs "
    "itself, given outputs whose rows already sum to one, a loss of the user's own seen applying sigmoid, "
    "log-sigmoid, softmax or log_softmax to what a Sigmoid or Softmax made (the probabilities of a model that "
    "returns logits and probabilities, passed where the logits belong), BCEWithLogitsLoss given "
    "outputs all inside [0, 1] (from a model ending in Sigmoid, a loss the forward computes on a sigmoid's "
    "output, or 16 or more of them when no forward was observed to show what made them), or a model whose "
    "last activation is Softmax trained with either when the loss's input was not measured (measured rows that "
    "do not sum to one came another way).",
    why="CrossEntropyLoss applies log_softmax itself; a second softmax squashes the logits into [0, 1], "
    "so gradients shrink and the loss stalls far above its minimum.",
    fix="Remove the final Softmax/Sigmoid from the model and pass raw logits; apply softmax only when "
    "reporting probabilities.",
)
def double_softmax(report: DiagnosticReport) -> Hit | None:
    output_activation = report.model.output_activation if report.model is not None else None
    found = _ops_applied(report, (("Softmax", "LogSoftmax"), ("Sigmoid", "BinaryCrossEntropyWithLogits")))
    if found is not None:
        first, then, path = found
        return Hit(
            symptom=f"{first.lower()} on the model's outputs, then the loss applies "
            f"{'log_softmax' if then == 'LogSoftmax' else 'a sigmoid'} again: {path}",
            evidence={"ops_before_loss": path},
            score=3.0,
        )
    for call in loss_calls(report):
        applies_own = call.loss_type == "CrossEntropyLoss" or call.applies is not None
        # the model's last Softmax counts when what reached the loss was not measured: one measured
        # off the simplex came another way (MemN2N's Softmax feeds an output the loss never reads)
        unmeasured = call.output_rows_sum_to_one is None
        softmaxed = call.output_rows_sum_to_one or (output_activation == "Softmax" and unmeasured)
        if applies_own and softmaxed:
            return Hit(
                symptom=f"{call.loss_type}" + (f", which applies {call.applies} itself," if call.applies else "")
                + " received probabilities, not logits",
                evidence={
                    "loss_type": call.loss_type,
                    "loss_applies": call.applies,
                    "output_rows_sum_to_one": call.output_rows_sum_to_one,
                    "output_min": call.output_min,
                    "output_max": call.output_max,
                    "model_output_activation": output_activation,
                },
                score=3.0,
            )
        if call.squashes_again is not None:
            return Hit(
                symptom=f"the loss squashes a probability again: {call.squashes_again} (it expects logits)",
                evidence={"loss_type": call.loss_type, "squashes_again": call.squashes_again,
                          "model_output_activation": output_activation},  # fmt: skip
                score=3.0,
            )
        # logits of a batch of 16+ all inside [0, 1]: a sigmoid, even a functional one — unless
        # the observed forward (functional ops included) shows what made the output: no activation
        # (small logits of a model that has not learned much yet) or one not bounded to [0, 1]
        # (a ReLU on the logits: WRONG_OUTPUT_ACTIVATION's, not a second sigmoid)
        # the model's last activation, or the one seen making a loss's input inside the forward
        kinds = [vocab.activation_kind(a) for a in (output_activation, call.output_activation)]
        squashed = any(kind is not None and kind.bounds == (0.0, 1.0) for kind in kinds)
        observed = report.model is not None and report.model.forward_observed
        many = (math.prod(call.output_shape) >= 16 if call.output_shape else False) and not observed
        if (
            call.loss_type == "BCEWithLogitsLoss"
            and (squashed or many)
            and call.output_min is not None
            and call.output_max is not None
            and call.output_min >= 0.0
            and call.output_max <= 1.0
        ):
            return Hit(
                symptom="BCEWithLogitsLoss received sigmoid outputs, not logits",
                evidence={
                    "loss_type": call.loss_type,
                    "output_min": call.output_min,
                    "output_max": call.output_max,
                    "model_output_activation": output_activation,
                    "loss_input_activation": call.output_activation,
                },
                score=3.0,
            )
    return None


@rule(
    "NNDX326",
    C.WRONG_LOSS,
    "error",
    "The loss ignores a class its targets use, leaving one class to score",
    detects="A loss call with ignore_index set to a class index (>= 0) that some of its targets hold, after which "
    "at most one class is left to score (a two-class target with one class ignored). A padding index ignored "
    "beside a vocabulary (a masked language model's labels) leaves many classes and does not fire.",
    why="ignore_index drops every target equal to it from the loss: a shared criterion built for masked tokens "
    "(NLLLoss(ignore_index=0), BERT-pytorch's) also drops the next-sentence task's class 0, so the model only "
    "ever learns to say 'is next', and accuracy stays at chance.",
    fix="Give each task its own criterion: ignore_index only where the index marks no target (padding, "
    "unlabelled samples), never a real class.",
)
def ignored_real_class(report: DiagnosticReport) -> Hit | None:
    for call in loss_calls(report):
        if (call.ignore_index is not None and call.ignored_target_fraction and call.scored_classes is not None
                and call.scored_classes <= 1):  # fmt: skip
            return Hit(
                symptom=f"{call.loss_type} ignores class {call.ignore_index}, "
                f"{call.ignored_target_fraction:.0%} of its targets, and scores {call.scored_classes} class",
                evidence={"loss_type": call.loss_type, "ignore_index": call.ignore_index,
                          "ignored_target_fraction": call.ignored_target_fraction,
                          "scored_classes": call.scored_classes, "output_shape": call.output_shape},  # fmt: skip
                score=3.0,
            )
    return None


@rule(
    "NNDX329",
    C.WRONG_OUTPUT_ACTIVATION,
    "error",
    "A ReLU on log-probabilities zeroes every output before the loss",
    detects="The logged loss's autograd graph applies relu to the result of log_softmax or logsigmoid (in the model "
    "or in the loop), with only shape ops between.",
    why="A log-probability is never above 0, so its ReLU is 0 everywhere and passes no gradient: evidential "
    "deep learning's relu_evidence on a classifier that still ends in log_softmax gives every class the same "
    "evidence, the loss never moves, and only weight decay changes the weights. Nothing crashes.",
    fix="Give the loss the raw outputs (logits) it was written for: drop the log_softmax at the end of forward, "
    "or take the evidence from the logits (relu, softplus or exp of them).",
)
def relu_on_log_probabilities(report: DiagnosticReport) -> Hit | None:
    found = _ops_applied(report, (("LogSoftmax", "Relu"), ("LogSigmoid", "Relu")))
    if found is None:
        return None
    first, _, path = found
    return Hit(
        symptom=f"relu of {first.lower()}'s output, which is never above 0: zero everywhere, so no gradient reaches "
        f"the model ({path})",
        evidence={"ops_before_loss": path},
        score=4.0,
    )


def _ops_applied(report: DiagnosticReport, pairs: tuple[tuple[str, str], ...]) -> tuple[str, str, str] | None:
    """(first op, then op, the path written out) for the first path of ``loop.ops_before_loss``
    where one of ``pairs`` applies in order (see :func:`nndx.vocab.op_follows`); else None."""
    loop = _loop(report)
    for path in loop.ops_before_loss if loop is not None else []:
        for first, then in pairs:
            if vocab.op_follows(path, first, then):
                return first, then, " -> ".join(path)
    return None


LOG_ROWS_TOLERANCE = 0.1  # |log of the probability mass| of a row: 10% off one is no rounding
LOG_PROB_MAX = 1e-3  # a log-probability is at most 0; above this is no rounding


@rule(
    "NNDX324",
    C.WRONG_OUTPUT_ACTIVATION,
    "error",
    "Log-probabilities not normalised over the classes",
    detects="NLLLoss given outputs that look like log-probabilities (none above 0) whose rows do not: their "
    f"logsumexp over the class axis (dim 1) is more than {LOG_ROWS_TOLERANCE} away from 0 in some row.",
    why="NLLLoss reads dim 1 as the classes. log_softmax over another axis (dim=0: the batch, or the time axis "
    "of a sequence model's (time, classes) output) makes each column, not each row, a distribution: the loss "
    "still falls, but a sample's classes no longer compete, and its predictions are tied to the other samples "
    "or time steps in the batch.",
    fix="Apply log_softmax over the class axis (dim=1, or dim=-1 for (batch, classes) outputs), or use "
    "CrossEntropyLoss on the raw logits.",
)
def log_probabilities_off_class_axis(report: DiagnosticReport) -> Hit | None:
    for call in loss_calls(report):
        kind = vocab.loss_kind(call.loss_type)
        off = call.output_log_rows_off_zero
        if (kind is None or kind.expects != "log_probabilities" or not kind.class_axis or off is None
                or not math.isfinite(off) or call.output_max is None or call.output_max > 1e-3):  # fmt: skip
            continue
        if off > LOG_ROWS_TOLERANCE:
            return Hit(
                symptom=f"{call.loss_type} on log-probabilities whose rows' probabilities sum up to a factor "
                f"{math.exp(off):.3g} away from 1: normalised over another axis",
                evidence={"loss_type": call.loss_type, "output_shape": [str(d) for d in call.output_shape],
                          "log_rows_off_zero": off, "output_max": call.output_max},  # fmt: skip
                score=3.0,
            )
    return None


@rule(
    "NNDX315",
    C.WRONG_LOSS,
    "error",
    "The loss does not fit the task or the outputs",
    detects="A regression loss (MSE/L1) on class-index targets, on labels the data checks found to be "
    "class indices or one-hot rows, or a multi-column output against one target per sample; a loss that takes "
    "log-probabilities (NLLLoss, KLDivLoss, CTCLoss) on non-negative outputs (probabilities, not log-probabilities; "
    f"all zero is log(1) too, left to NNDX324) or on outputs above {LOG_PROB_MAX:g} (raw scores: a log-probability "
    "is never above 0), or after a softmax or sigmoid the loop applied (the logged loss's autograd graph: softmax "
    "then nll_loss, with only shape ops between); a "
    "regression loss on a task the report marks as classification (warning).",
    why="MSE on class indices treats class 7 as 'closer' to 8 than to 1 and gives weak gradients; NLLLoss "
    "on probabilities maximises p instead of log p; NLLLoss or CTCLoss on raw scores pushes the right score up "
    "without bound (the loss goes negative) instead of normalising against the others; KLDivLoss on "
    "probabilities (a distillation loss given the "
    "student's softmax) is negative and pulls the student's probabilities, not their logarithms, to the teacher's.",
    fix="Classification: CrossEntropyLoss on logits with long class indices. NLLLoss and KLDivLoss only after "
    "log_softmax.",
)
def wrong_loss(report: DiagnosticReport) -> Hit | None:
    for call in loss_calls(report):
        evidence = {
            "loss_type": call.loss_type,
            "output_shape": [str(d) for d in call.output_shape],
            "target_shape": [str(d) for d in call.target_shape or []],
            "target_dtype": call.target_dtype,
        }
        if call.loss_type in vocab.REGRESSION_LOSS_NAMES:
            many_columns = len(call.output_shape) == 2 and call.output_shape[1] > 1
            one_target = call.target_shape is not None and len(call.target_shape) == 1
            if _is_int(call.target_dtype) or (many_columns and one_target):
                return Hit(symptom=f"{call.loss_type} on class labels", evidence=evidence, score=3.0)
        # all zero is log(1) as much as a probability: log_softmax over an axis of length one
        # (dim=0 of a batch of one), which NNDX324 names
        all_zero = call.output_max is not None and call.output_max <= 0.0
        kind = vocab.loss_kind(call.loss_type)
        takes_logs = kind is not None and kind.expects == "log_probabilities"
        if takes_logs and call.output_min is not None and call.output_min >= 0.0 and not all_zero:
            return Hit(
                symptom=f"{call.loss_type} on non-negative outputs (probabilities, not log-probabilities)",
                evidence=evidence | {"output_min": call.output_min},
                score=3.0,
            )
        if takes_logs and call.output_max is not None and call.output_max > LOG_PROB_MAX:
            return Hit(
                symptom=f"{call.loss_type} on outputs up to {call.output_max:.3g}, above 0 where no log-probability "
                "is: raw scores, with no log_softmax before the loss",
                evidence=evidence | {"output_min": call.output_min, "output_max": call.output_max},
                score=3.0,
            )
    found = _ops_applied(report, tuple((a, t) for a in ("Softmax", "Sigmoid") for t in ("NllLoss", "NllLoss2D")))
    if found is not None:
        first, then, path = found
        return Hit(
            symptom=f"{first.lower()} on the model's outputs, and the probabilities go to a loss that takes "
            f"log-probabilities ({then}): {path}",
            evidence={"ops_before_loss": path},
            score=3.0,
        )
    types = {c.loss_type for c in loss_calls(report)}
    train = report.data.train if report.data is not None else None
    if train is not None and train.label_kind in ("class_index", "one_hot") and types and types <= vocab.REGRESSION_LOSS_NAMES:
        return Hit(
            symptom=f"{', '.join(sorted(types))} on {train.label_kind.replace('_', ' ')} labels",
            evidence={"label_kind": train.label_kind, "label_dtype": train.label_dtype, "loss_types": sorted(types)},
            score=2.5,
        )
    if is_classification(report) is True and report.task == "classification" and types and types <= vocab.REGRESSION_LOSS_NAMES:
        return Hit(
            symptom=f"{', '.join(sorted(types))} on a classification task",
            evidence={"task": report.task, "loss_types": sorted(types)},
            severity="warning",
            score=1.0,
        )
    return None


# --------------------------------------------------------------------------- loops nobody here wrote


GRAPHS_HELD_MANY = 32  # older graphs alive at once that no healthy loop holds (the watcher tracks 64)


@rule(
    "NNDX320",
    C.GRAPH_RETAINED,
    "warning",
    "The autograd graph is kept alive across steps and grows",
    detects="At least 4 recorded steps where the autograd graph behind the model's outputs holds nodes "
    "created at an earlier step (at 2 or more of them), and grows at each of the last 4 to at least 1.5x its "
    "first size; error from 3x or when the bounded walk hit its cap. Or: the output graphs of earlier recorded "
    "steps (before the previous one) still alive pile up — more at each of the last 4 recorded steps, 2 or "
    "more now (error from 4), or 32 at once — as a running sum of loss tensors keeps them; info when a backward "
    "pass freed the saved tensors of every one of them (a list of loss tensors appended after backward: the graphs' "
    "structure grows, not the activations, and the training is unaffected). Or: the graph behind the "
    "tensors the model keeps beside its parameters (buffers, plain attributes), walked at the end of each recorded "
    "step, holds nodes of earlier steps at 2 or more of them and grows at each of the last 4 to at least 1.5x its "
    "first size (error from 3x): moving statistics reassigned from the batch's mean without .data. A recurrent state "
    "detached each batch (truncated BPTT), a state holding only the current step's graph, or a graph that varies in "
    "size, does not fire.",
    why="A tensor carried from step to step without .detach() (an RNN hidden state, a running sum of "
    "losses) links every new graph to all the old ones: memory and step time grow with every step until "
    "the run dies, and backward needs retain_graph=True to run at all.",
    fix="Detach what crosses steps: hidden = hidden.detach() (repackage_hidden) at each batch; log "
    "loss.item() instead of summing loss tensors; update running statistics from .detach()ed (or .data) values; "
    "drop retain_graph=True.",
)
def graph_retained(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    points = sorted(loop.graph_nodes_history, key=lambda p: p.step) if loop is not None else []
    held = [p for p in points if p.older_graphs_alive >= 2]
    alive = [p.older_graphs_alive for p in points[-4:]]
    # a variable assigned every few steps holds its last graph for a while (a GAN's D loss):
    # a bounded number of graphs, constant; a leak holds more at each recorded step
    piling_up = len(alive) == 4 and all(b >= a for a, b in zip(alive, alive[1:])) and alive[-1] > alive[0]
    if alive and alive[-1] >= 2 and (piling_up or alive[-1] >= GRAPHS_HELD_MANY):
        last = points[-1]
        structure_only = last.older_graphs_holding == 0
        return Hit(
            symptom=f"the autograd graphs of {last.older_graphs_alive} earlier recorded steps are still alive at "
            f"step {last.step}: something keeps them across steps"
            + (" (their structure only: backward freed their saved tensors, so memory grows by the graphs' nodes, "
               "not the activations, and the training is unaffected)" if structure_only else ""),
            evidence={"older_graphs_alive": last.older_graphs_alive, "older_graphs_holding": last.older_graphs_holding,
                      "first_step_seen": held[0].step, "last_step": last.step},  # fmt: skip
            severity="info" if structure_only else "error" if last.older_graphs_alive >= 4 else "warning",
            score=1.0 + min(3.0, last.older_graphs_alive / 2),
            step=held[0].step,
        )
    kept = _kept_graph(points)
    if kept is not None:
        return kept
    if len(points) < 4 or sum(1 for p in points if p.earlier_nodes > 0) < 2:
        return None
    tail = points[-4:]
    growing = all(b.nodes > a.nodes or b.truncated for a, b in zip(tail, tail[1:]))
    first, last = points[0], points[-1]
    if not growing or last.nodes < 1.5 * max(first.nodes, 1):
        return None
    growth = last.nodes / max(first.nodes, 1)
    return Hit(
        symptom=f"the autograd graph grew from {first.nodes} nodes at step {first.step} to "
        f"{'at least ' if last.truncated else ''}{last.nodes} at step {last.step}, reaching back to earlier steps",
        evidence={
            "graph_nodes_first": first.nodes,
            "graph_nodes_last": last.nodes,
            "first_step": first.step,
            "last_step": last.step,
            "earlier_nodes_last": last.earlier_nodes,
            "walk_truncated": last.truncated,
        },
        severity="error" if growth >= 3 or last.truncated else "warning",
        score=1.0 + min(3.0, math.log10(growth) * 2),
        step=next((p.step for p in points if p.earlier_nodes > 0), None),
    )


def _kept_graph(points: list) -> Hit | None:
    """A graph kept on the model itself, where no output leads (moving statistics reassigned
    without .data), grows from recorded step to recorded step."""
    if len(points) < 4 or sum(1 for p in points if p.stored_earlier_nodes > 0) < 2:
        return None
    tail = points[-4:]
    if not all(b.stored_nodes > a.stored_nodes for a, b in zip(tail, tail[1:])):
        return None
    first = next(p for p in points if p.stored_nodes > 0)
    last = points[-1]
    if last.stored_nodes < 1.5 * first.stored_nodes:
        return None
    growth = last.stored_nodes / first.stored_nodes
    return Hit(
        symptom=f"{last.stored_holder}, a tensor the model keeps beside its parameters, holds an autograd graph that "
        f"grew from {first.stored_nodes} nodes at step {first.step} to {last.stored_nodes} at step {last.step}, "
        "reaching back to earlier steps",
        evidence={"kept_tensor": last.stored_holder, "kept_graph_nodes_first": first.stored_nodes,
                  "kept_graph_nodes_last": last.stored_nodes, "first_step": first.step, "last_step": last.step,
                  "earlier_nodes_last": last.stored_earlier_nodes},  # fmt: skip
        severity="error" if growth >= 3 else "warning",
        score=1.0 + min(3.0, math.log10(growth) * 2),
        step=next((p.step for p in points if p.stored_earlier_nodes > 0), None),
    )


@rule(
    "NNDX321",
    C.OPTIMIZER_NOT_CONNECTED,
    "error",
    "No optimizer step: backward passes, but the parameters are never updated",
    detects="At least 10 backward passes in a loop the Monitor watched and no optimizer.step() call (in a "
    "loop without an optimizer: no parameter update detected after any of them, or none that changed a value: "
    "every trainable parameter ends as it was when the Monitor attached, though a checkpoint loaded back "
    "moved their version counters).",
    why="The gradients are computed and thrown away: optimizer.step() is missing (or never reached), so "
    "the model stays at its initialisation however long it trains. Under a torch.amp.GradScaler, "
    "scaler.step(optimizer) also skips the step whenever a gradient is inf or NaN: gradients that are never "
    "reset (no zero_grad) overflow once and stay inf, and every later step is skipped.",
    fix="Call optimizer.step() after loss.backward() in every iteration (and after any gradient clipping); "
    "in a hand-written update, change the parameters in place under torch.no_grad(). With a GradScaler, "
    "call optimizer.zero_grad() every iteration and check scaler.get_scale(): a scale that keeps falling "
    "means non-finite gradients.",
)
def no_optimizer_step(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or loop.optimizers is None or loop.backward_calls < 10:
        return None
    # without an optimizer, a step is an update detected from the parameters; one that changed no value
    # (a checkpoint of the same values loaded back) is none
    unchanged = (not loop.optimizers and loop.steps < loop.backward_calls / 10
                 and share_of_trainable(loop.params_never_changed or [], report) == 1.0)  # fmt: skip
    if loop.steps > 0 and not unchanged:
        return None
    what = "optimizer.step() calls" if loop.optimizers else "parameter updates"
    if unchanged and loop.steps:
        what += f" that changed a value (every trainable parameter ends as it started; {loop.steps} detected)"
    return Hit(
        symptom=f"{loop.backward_calls} backward passes and 0 {what}",
        evidence={"backward_calls": loop.backward_calls, "steps": loop.steps, "optimizers": loop.optimizers},
        score=3.0,
    )


@rule(
    "NNDX623",
    C.EXPLODING_GRADIENTS,
    "warning",
    "Gradients clipped after optimizer.step(): the step used them unclipped",
    detects="At 2 or more recorded steps, every gradient scaled by one common factor under 1 between "
    "optimizer.step() and the loop's next forward, zero_grad or backward: a clip (clip_grad_norm_, or one written "
    "by hand) placed after the step. Error when the median factor is under 0.1 (the steps used gradients over ten "
    "times the norm the clip allows) and the loss did not learn.",
    why="The clip runs and the gradients it leaves look clipped, but the optimizer already stepped with the "
    "unclipped ones: each step is as large as with no clip at all, and a recurrent network whose gradients spike "
    "blows up as if nothing bounded them.",
    fix="Clip between loss.backward() and optimizer.step() (after scaler.unscale_(optimizer) under a GradScaler).",
)
def clipped_after_step(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    # a factor the Monitor records is in (0, 1); a posted report may carry any float
    points = sorted((p for p in loop.clipped_after_step if 0 < p.value < 1), key=lambda p: p.step) if loop else []
    if len(points) < 2:
        return None
    factor = median([p.value for p in points])
    return Hit(
        symptom=f"at {len(points)} recorded steps the gradients were scaled by {factor:.2g} (median) after "
        f"optimizer.step(), from step {points[0].step}: a clip after the step, so each step used gradients "
        f"{1 / factor:.3g}x the norm it allows",
        evidence={"clipped_steps": len(points), "median_factor": factor,
                  "smallest_factor": min(p.value for p in points), "first_step": points[0].step},  # fmt: skip
        severity="error" if factor < 0.1 and not loss_learned(report) else None,
        score=2.0 + min(2.0, math.log10(1 / factor)),
        step=points[0].step,
    )


# a recurrent layer's axes over a run: a time axis that holds (a loader's batch size, and its last batch) while
# the batch axis takes this many sizes (padded lengths) has them swapped
HELD_SIZES, VARYING_SIZES, AXES_FORWARDS = 2, 6, 8


@rule(
    "NNDX624",
    C.WRONG_RESHAPE,
    "warning",
    "A recurrent layer runs over the batch: its time and batch axes are swapped",
    detects=f"Over at least {AXES_FORWARDS} forwards the Monitor saw, a recurrent layer (nn.RNN, nn.LSTM, nn.GRU) "
    f"whose time axis, as its batch_first lays it, took at most {HELD_SIZES} sizes while its batch axis took "
    f"{VARYING_SIZES} or more: padded sequences of varying length vary the time axis, a loader holds the batch size, "
    "so the batches reach the layer with their axes swapped. Sequences of one length give no reading either way.",
    why="A layer built time-major (batch_first=False, the default) and fed (batch, time) batches, or the other way "
    "round, runs its recurrence across the samples of a batch and treats the time steps as samples. Every shape is "
    "legal both ways; the loss falls on whatever structure is left, and the model learns far less than it could.",
    fix="Build the layer with batch_first=True for (batch, time, features) inputs, or transpose the batch to (time, "
    "batch, ...) before it (pad_sequence(batch_first=False) for a time-major model).",
)
def recurrent_axes_swapped(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    swapped = [r for r in (loop.recurrent_inputs if loop is not None else [])
               if r.forwards >= AXES_FORWARDS and len(r.time_lengths) <= HELD_SIZES
               and len(r.batch_sizes) >= VARYING_SIZES]  # fmt: skip
    if not swapped:
        return None
    layer = swapped[0]
    held = ", ".join(map(str, layer.time_lengths))
    varying = ", ".join(map(str, layer.batch_sizes[:6])) + ("..." if len(layer.batch_sizes) > 6 else "")
    return Hit(
        symptom=f"{layer.name} (batch_first={layer.batch_first}) took {held} along its time axis over {layer.forwards} "
        f"forwards while its batch axis took {len(layer.batch_sizes)} sizes ({varying}): the lengths sit on its batch "
        "axis, the batch on its time axis",
        evidence={"layer": layer.name, "batch_first": layer.batch_first, "time_lengths": layer.time_lengths,
                  "batch_sizes": layer.batch_sizes, "forwards": layer.forwards},  # fmt: skip
        score=2.0 + min(1.0, len(layer.batch_sizes) / 16),
    )


@rule(
    "NNDX322",
    C.OPTIMIZER_NOT_CONNECTED,
    "warning",
    "Trainable parameters never changed",
    detects="After at least 5 steps, trainable parameters whose values equal those when the Monitor attached, "
    "leaving out those NNDX303/NNDX304 already name (not in the optimizer, no gradient) and, where gradients "
    "were recorded, those whose gradient norm never reached 1e-3 of their weight norm (behind dead units, or a "
    "bias before batch-norm: nothing to apply). Error when they are at least half of the trainable tensors.",
    why="They receive gradients but no update reaches them: gradients zeroed between backward and step, a "
    "learning rate of 0 for their group, or a hand-written update loop that skips them.",
    fix="Call optimizer.zero_grad() before backward, not between backward and step; check each param group's "
    "lr; in a hand-written update, loop over every trainable parameter.",
    explained_by=(C.DEAD_RELU, C.LR_SCHEDULE_MISUSE),
)
def params_never_changed(report: DiagnosticReport) -> Hit | None:
    loop = _loop(report)
    if loop is None or not loop.params_never_changed or loop.steps < 5 or loop.logged_loss_reaches_params is False:
        return None  # (a logged loss that reaches none of them: NNDX304 names the cut)
    named_elsewhere = {*loop.params_not_in_optimizer, *loop.params_grad_none, *loop.frozen_params}
    names = [n for n in loop.params_never_changed if n not in named_elsewhere]
    share = share_of_trainable(names, report)
    severe = share is None or share >= 0.5
    relative_grad: dict[str, float] = {}
    for p in report.parameters:
        if p.grad_norm is not None and math.isfinite(p.grad_norm) and p.weight_norm > 0:
            relative_grad[p.name] = max(relative_grad.get(p.name, 0.0), p.grad_norm / p.weight_norm)
    if relative_grad:
        # a parameter whose gradient was (nearly) zero had nothing to apply: that is a dead
        # or vanishing path (NNDX201/203), not an update that failed to reach it
        names = [n for n in names if relative_grad.get(n, 0.0) >= 1e-3]
    if not names:
        return None
    return Hit(
        symptom=f"{len(names)} trainable parameters unchanged after {loop.steps} steps",
        evidence={"params_never_changed": names[:20], "count": len(names), "share_of_trainable": share,
                  "steps": loop.steps},  # fmt: skip
        severity="error" if severe else "warning",
        score=1.0 + (share if share is not None else 1.0),
    )


REACH = 0.25  # of the data's span: generated values this far beyond its extremes, or short of them, differ in range
FED_FORWARDS = 10  # forwards of each kind before their extremes say anything
BOUNDED = 1.0 + 1e-3  # generated values within [-1, 1]: a Tanh's or a Sigmoid's, the ranges generators end in


def _fed_ranges(report: DiagnosticReport, beyond: bool) -> Hit | None:
    """The first fed input whose values go past the data's extremes (``beyond``), or stop short of one of them,
    by more than REACH of the data's span, where the fed values stayed in [-1, 1]: a bounded output activation's
    range. A generator with no output activation roams outside the data while it learns (Morvan's painter from
    -1.7 to 6.2 beside curves in [0, 3]; an adversarial autoencoder's codes beside its prior's samples)."""
    loop = _loop(report)
    for fed in loop.fed_inputs if loop is not None else []:
        span = fed.own_max - fed.own_min
        if min(fed.fed_forwards, fed.own_forwards) < FED_FORWARDS or not span > 0 or not math.isfinite(span):
            continue
        if fed.fed_min < -BOUNDED or fed.fed_max > BOUNDED:
            continue
        past = max(fed.own_min - fed.fed_min, fed.fed_max - fed.own_max) / span
        short = max(fed.fed_min - fed.own_min, fed.own_max - fed.fed_max) / span
        # the data past a bound the generated values never crossed (0: a Sigmoid's or a ReLU's; -1, 1: a Tanh's):
        # short of data within the bounds is a generator still learning, not one that cannot get there
        low = max((b for b in (-1.0, 0.0) if fed.fed_min >= b), default=-math.inf)
        high = min((b for b in (0.0, 1.0) if fed.fed_max <= b), default=math.inf)
        unreachable = max(low - fed.own_min, fed.own_max - high) / span
        if (past if beyond else min(short, unreachable)) > REACH and (beyond or past <= REACH):
            where = f"model {fed.model!r}, input {fed.position}" if fed.model else f"input {fed.position}"
            return Hit(
                symptom=f"{where}: another watched model fed it values in [{fed.fed_min:.3g}, {fed.fed_max:.3g}] "
                f"beside data in [{fed.own_min:.3g}, {fed.own_max:.3g}]",
                evidence={"model": fed.model, "position": fed.position, "fed_min": fed.fed_min,
                          "fed_max": fed.fed_max, "data_min": fed.own_min, "data_max": fed.own_max,
                          "fed_forwards": fed.fed_forwards, "data_forwards": fed.own_forwards},  # fmt: skip
                score=2.5,
            )
    return None


@rule(
    "NNDX332",
    C.UNNORMALIZED_INPUTS,
    "warning",
    "The data lies in a narrower range than the generated values fed beside it",
    detects=f"A watched model fed, through one input, both another watched model's outputs (a generator's samples, "
    f"an actor's actions) and other values with as many per sample (real data), {FED_FORWARDS} forwards or more "
    f"of each, where the generated values stayed in [-1, 1] (a Tanh's or a Sigmoid's range: an unbounded output "
    "roams while it learns) and went past the data's smallest or largest value by more than "
    f"{REACH:g} of the data's span.",
    why="A discriminator (a critic) that sees generated values where the data never is tells them apart by their "
    "range alone: a generator ending in Tanh ([-1, 1]) beside images left in [0, 1] (Normalize((0.5,), (0.5,)) or "
    "x * 2 - 1 forgotten). The loss looks like a game, and the generator learns what the range gives away, not "
    "what the data looks like.",
    fix="Scale the data to the generator's output range (images to [-1, 1] for a Tanh generator: "
    "Normalize((0.5,), (0.5,)), or x * 2 - 1) and map samples back for display.",
)
def data_narrower_than_generated(report: DiagnosticReport) -> Hit | None:
    return _fed_ranges(report, beyond=True)


@rule(
    "NNDX333",
    C.WRONG_OUTPUT_ACTIVATION,
    "warning",
    "Generated values fed beside the data never reach part of its range",
    detects=f"A watched model fed, through one input, both another watched model's outputs and other values of the "
    f"same number per sample (real data), {FED_FORWARDS} forwards or more of each, where the generated values stayed "
    f"in [-1, 1] and stop short of the data's smallest or largest value by more than {REACH:g} of the data's span "
    "over the whole run (and go past neither), where the data lies that far past a bound the generated values never "
    "crossed (0, the floor of a Sigmoid or a ReLU; -1 or 1, a Tanh's): short of data within reach is a generator "
    "still learning.",
    why="A generator whose output activation cannot reach part of the data's range (Sigmoid, (0, 1), beside images "
    "in [-1, 1]; a ReLU output beside signed data) can never produce samples like the data; the discriminator "
    "wins on the range, saturates, and the generator's gradients die.",
    fix="End the generator in the activation whose range is the data's (Tanh for [-1, 1], Sigmoid for [0, 1], "
    "none for unbounded values), or rescale the data to the activation's range.",
)
def generated_short_of_data(report: DiagnosticReport) -> Hit | None:
    return _fed_ranges(report, beyond=False)

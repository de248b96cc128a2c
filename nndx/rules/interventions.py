"""Intervention rules (NNDX8xx): what applying a remedy to a copy of the model showed.

The collector tests candidate causes by intervention (``report.interventions``): it
applies each cause's mechanical remedy to a copy of the model from its initial state and
reruns a short training probe beside an untouched twin. The engine weighs every finding
by that outcome (:func:`nndx.rules.engine.confirm`); the rules here name a confirmed
cause that no other rule saw — one rule per remedy.
"""

from __future__ import annotations

from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport
from nndx.rules._series import clips_most_steps, gradient_cut_params, loss_curve, lr_varies, self_targeted
from nndx.rules.engine import CONFIRMED_BY_INTERVENTION, Hit, Rule, add_rule

LR_CAUSES = (C.LR_TOO_LOW, C.LR_TOO_HIGH)
LEARNED_PROGRESS = 0.3  # the share of its way down a run's own loss made: it learned

WHY = ("A remedy that fixes the failure on a copy is the most direct evidence of its cause there is: the only "
       "difference between the two runs is the remedy.")  # fmt: skip

# (id, cause, the remedy the collector applies, the fix for the user's code)
REMEDIES: tuple[tuple[str, C, str, str], ...] = (
    (CONFIRMED_BY_INTERVENTION, C.LR_TOO_HIGH, "a smaller learning rate (divided by 10, 100 or 1000)",
     "Lower the learning rate (10x, or to the LR range test's suggestion)."),
    ("NNDX802", C.LR_TOO_LOW, "a larger learning rate (multiplied by 10, 100 or 1000)",
     "Raise the learning rate toward the LR range test's suggestion."),
    ("NNDX803", C.WRONG_OUTPUT_ACTIVATION, "the activation on the output removed",
     "End the model with a plain Linear producing logits (or unbounded values for regression)."),
    ("NNDX804", C.DOUBLE_SOFTMAX, "the softmax/sigmoid before the loss removed",
     "Pass raw logits to CrossEntropyLoss / BCEWithLogitsLoss; apply softmax only to report probabilities."),
    ("NNDX805", C.UNNORMALIZED_INPUTS, "the inputs standardised per feature",
     "Standardise the inputs with the train split's mean and std."),
    ("NNDX806", C.UNNORMALIZED_TARGETS, "the regression targets standardised (scaled to [0, 1] when none is negative)",
     "Standardise the targets for training and invert the transform for predictions."),
    ("NNDX807", C.DEAD_RELU, "the dead units re-initialised",
     "Use Kaiming init with zero biases or a LeakyReLU/GELU; nndx.fix.resurrect_dead_units re-initialises dead units."),
    ("NNDX809", C.BAD_INIT, "PyTorch's default init restored in the layers whose weights no standard init gives",
     "Drop the custom init (or use Kaiming/Xavier): weights of std 1 on a wide layer, or all zero, break learning."),
    ("NNDX808", C.WRONG_LOSS, "the loss that matches the targets (cross-entropy for classes)",
     "Use CrossEntropyLoss on logits with integer class labels; MSE only for continuous targets."),
)  # fmt: skip


# a remedy confirmed beside a deeper one: a sigmoid output is right for targets in [0, 1], and out of reach only
# of unscaled ones (raw 0..255 pixels); when scaling the targets made the copy learn too, that is the cause
EXPLAINED_BY: dict[str, tuple[C, ...]] = {"NNDX803": (C.UNNORMALIZED_TARGETS,)}


def _check(code: C):
    def check(report: DiagnosticReport) -> list[Hit]:
        results = report.interventions.results if report.interventions is not None else []
        hits = []
        if code == C.LR_TOO_LOW and gradient_cut_params(report):
            return []  # a larger LR only speeds up what still trains (engine.confirm drops it too)
        if code in LR_CAUSES and self_targeted(report):
            return []  # an objective that moves with the model: any step size change may lower it (engine.confirm)
        for result in results:
            if result.status != "confirmed" or result.cause != code.value:
                continue
            losses = (result.baseline_initial_loss, result.baseline_final_loss,
                      result.remedied_initial_loss, result.remedied_final_loss)  # fmt: skip
            symptom = (f"with {result.remedy} the loss fell {losses[2]:.4g} -> {losses[3]:.4g} in {result.steps} steps "
                       f"(without: {losses[0]:.4g} -> {losses[1]:.4g})") if None not in losses else (
                       f"with {result.remedy} the model learned")  # fmt: skip
            # a remedy that helps a probe from the initial state says little about a run that
            # learned at its own pace (a warm-up or OneCycle starts low; the probe's optimizer
            # lacks the loop's clipping): worth knowing, not an alarm
            curve = loss_curve(report)
            learned = curve.n >= 10 and curve.progress >= LEARNED_PROGRESS
            scheduled = code in LR_CAUSES and lr_varies(report)
            clipped = code == C.LR_TOO_HIGH and clips_most_steps(report)
            if learned:
                symptom += f"; the run itself learned (its loss made {curve.progress:.0%} of its way down)"
            elif scheduled:
                # the probe trained at the optimizer's LR of that moment: a warm-up's first LR,
                # or a decayed one after training — not the LR the run trains at
                symptom += "; the run's LR schedule moved its LR, so the probe's LR was not the one it trains at"
            elif clipped:
                symptom += "; the run clips its gradients on most steps, which bounds each step; the probe did not clip"
            # no other rule saw this cause, and the untouched twin learned in the probe itself
            # (slowly): the remedy speeds a healthy setup up (a third of a LSTM's ReLUs silent
            # at initialisation), which is worth knowing, not an alarm
            twin_learned = not (learned or scheduled or clipped) and (
                result.baseline_progress or 0.0) >= LEARNED_PROGRESS
            if twin_learned:
                symptom += f"; the untouched twin learned too ({result.baseline_progress:.0%} of its way down)"
            learned = learned or scheduled or clipped or twin_learned
            # confirmed with nndx's own Adam (no optimizer was known): a lead, not proof
            stand_in = report.interventions.optimizer == "default"
            if stand_in and not learned:
                symptom += "; tried with nndx's Adam at lr 1e-3 (no optimizer was given), not the user's"
            hits.append(
                Hit(
                    symptom=symptom,
                    severity="info" if learned else "warning" if stand_in else None,
                    evidence={
                        "remedy": result.remedy,
                        "steps": result.steps,
                        "baseline_initial_loss": losses[0],
                        "baseline_final_loss": losses[1],
                        "remedied_initial_loss": losses[2],
                        "remedied_final_loss": losses[3],
                    },
                    score=1.0 if learned else 5.0,
                )
            )
        return hits[:1]

    return check


for rule_id, code, remedy, fix in REMEDIES:
    add_rule(
        Rule(
            id=rule_id,
            code=code,
            severity="error",
            title=f"{code.value} confirmed: with {remedy} the model learns",
            detects=f"An intervention that applied {remedy} to a copy of the model from its initial state made the "
            "loss fall clearly further than on an untouched twin, while no other rule named this cause. Info "
            "when the untouched twin learned as well (30% or more of its way down in the probe), when the run's own "
            "loss did, or, for an LR remedy, when a schedule moved the LR (for a lower LR: when the run clips its "
            "gradients on most steps, which bounds each step as the probe's loop does not); a warning when the runs "
            "trained with nndx's own Adam (no optimizer was given). A 10x LR is no verdict when clipping shrinks every "
            "step or parameters get no gradient (frozen, outside the optimizer, cut from the loss): it speeds up the "
            "rest." + (" Explained by UNNORMALIZED_TARGETS when scaling the targets made the copy learn too: an output "
                       "activation is out of reach of unscaled targets only." if rule_id in EXPLAINED_BY else ""),
            why=WHY,
            fix=fix,
            family="interventions",
            check=_check(code),
            explained_by=EXPLAINED_BY.get(rule_id, ()),
        )
    )

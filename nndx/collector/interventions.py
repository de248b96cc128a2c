"""Diagnosis by intervention: which remedy makes a copy of the model learn?

How to use (``nndx.probe`` runs it last, within a time budget)::

    result = interventions(model, (x, y), loss_fn, optimizer=optimizer)   # Interventions
    [(r.cause, r.status) for r in result.results]

A symptom (a loss that does not fall, a NaN) has many possible causes; the rules can
name the likely ones, but only an experiment says which is real. This probe runs the
user's setup — a copy of the model from its current (initial, when probed before
training) state, a copy of the user's optimizer with its learning rate — for a few
dozen steps on one batch: the *baseline*. When the baseline fails to learn (its loss
ends above half of where it started — the start, or the chance-level loss if lower —
or turns non-finite), each applicable remedy of :mod:`nndx.collector.remedies` is
applied to a fresh copy and the same run is repeated with the same random seed. A
remedy that brings the loss to 75% of its start or below, and that share at least 0.2
below the baseline's, is ``confirmed``; one that does not lower the share by 0.02 is
``not_confirmed``. A remedy that keeps the loss and the targets must also end, measured
against the baseline's start, 0.2 below the baseline's share (a sigmoid removed from outputs
it rightly bounds starts worse and falls further, to about where the baseline ends). A
slower learning rate is also ``confirmed`` when the baseline's loss ended 1.5x above its
start and the slower one's does not end above its start: on one fixed batch that climb is
an overshoot, even where the batch leaves little to learn.
When the baseline learns, there is nothing to explain on this batch:
no remedy is tried (the bug, if any, lives in the user's loop or data, which the other
probes and the Monitor see). The learning-rate remedies come last and are skipped once
a structural remedy (the output activation, the loss, dead units, the data's scale) is
confirmed: a tiny gradient through a sigmoid on the logits is also "fixed" by a 10x
learning rate, which is compensation, not a second cause. And when only a large LR factor
made the setup learn (x100 or x1000, the smaller one did not), the remedies between the
output and the loss that showed nothing are tried again at that smaller factor (a softmax
before cross-entropy shrinks every gradient, which a larger LR makes up for; re-initialised
units would speed up any setup at a faster LR, so they are not): at a learning rate too slow
for even a correct model to move in ``steps`` steps, no remedy that leaves the step size
alone can show itself, and the one that makes the setup learn at the smaller factor is
the cause (the larger LR is then ``skipped``: it compensated). When the learning rate both
divided and multiplied made the setup learn, the experiment contradicts itself (on one
batch, an objective that moves with the model, such as a policy gradient or a critic's
loss, improves with any change of step size): both are ``inconclusive``, neither a cause.

The remedies and their causes: the learning rate ÷10, ÷100, ÷1000 (LR_TOO_HIGH) and
×10, ×100, ×1000 (LR_TOO_LOW), tried only when the baseline's loss ends above 90% of its
start (slow is not stuck); the activation on the output removed (WRONG_OUTPUT_ACTIVATION, or
DOUBLE_SOFTMAX before a loss that applies its own); inputs standardised
(UNNORMALIZED_INPUTS); regression targets standardised, or scaled to [0, 1] when none is negative
(UNNORMALIZED_TARGETS); dead ReLU
units re-initialised (DEAD_RELU); PyTorch's default init restored in layers whose
weights no standard init gives (BAD_INIT); cross-entropy for class labels given to a
regression loss (WRONG_LOSS). Each run is bounded by ``steps``; the whole probe by
``budget_seconds``, checked before every step: a run the budget cuts short is not judged
(a remedy is ``skipped`` with the reason, like the remedies not reached; a baseline cut
short tries no remedy), so a budget of 0 runs nothing. Warnings raised while a remedy
runs are nndx's own doing (a loss it swapped in) and are not recorded as evidence.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nndx import vocab
from nndx.collector._common import (
    Batch,
    LossFn,
    backward_and_step,
    compute_loss,
    copy_with_optimizer,
    first_output,
    forward,
    loss_name,
    loss_scaler,
    preserved_rng,
    set_mode,
    split_batch,
    working_copy,
)
from nndx.collector import remedies
from nndx.collector.remedies import NotApplicable, Setup
from nndx.report import InterventionResult, Interventions

STUCK_RATIO = 0.5  # a baseline whose loss ends above this share of its start did not clearly learn
LR_STUCK_RATIO = 0.9  # ...and above this one it did not learn at all: only then is the LR tried
CONFIRM_RATIO = 0.75  # a remedy must bring the loss to this share of its start...
CONFIRM_GAIN = 0.2  # ...and that share at least this much below the baseline's
NO_GAIN = 0.02  # a remedy whose share is not this much below the baseline's changed nothing
CLIMB_RATIO = 1.5  # a baseline that ends this far above its start climbed: a slower LR that stops it confirms
LR_FACTORS = (10.0, 100.0, 1000.0)  # an LR remedy tries these in turn and keeps the first that works
LR_CAUSES = ("LR_TOO_HIGH", "LR_TOO_LOW")  # tried last, and only when no structural remedy was confirmed
# bugs between the output and the loss, which shrink every gradient by a factor a larger LR makes up
# for: at an LR too slow to show anything, only their remedies are tried again at a faster one (fresh
# units or a new init would speed up any setup there, a body cut off from the gradient included)
OUTPUT_CAUSES = ("DOUBLE_SOFTMAX", "WRONG_OUTPUT_ACTIVATION", "WRONG_LOSS")
DEFAULT_BUDGET_SECONDS = 30.0
_clock = time.perf_counter  # one clock for the budget (a test may replace it with a deterministic one)


class _OutOfTime(Exception):
    """The budget ran out during a run: its losses are not comparable with a full run."""


@preserved_rng()  # a remedy's applicability check may run a dropout forward: the user's stream stays put
def interventions(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    steps: int = 100,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    seed: int = 0,
) -> Interventions:
    """Run the baseline and, when it fails to learn, each applicable remedy (see the module docs)."""
    if steps < 2:
        raise ValueError(f"steps must be >= 2, got {steps}")
    if not budget_seconds >= 0:
        raise ValueError(f"budget_seconds must be >= 0, got {budget_seconds}")
    started = _clock()
    deadline = started + budget_seconds
    inputs, targets = split_batch(batch)

    def fresh() -> Setup:
        model_copy, optimizer_copy, _ = copy_with_optimizer(model, optimizer, lambda p: torch.optim.Adam(p, lr=1e-3))
        return Setup(model_copy, optimizer_copy, inputs, targets, loss_fn)

    results: list[InterventionResult] = []
    baseline: list[float] | None = None
    crash = None

    def done(message: str | None = None) -> Interventions:
        return Interventions(steps=steps, baseline_initial_loss=baseline[0] if baseline else None,
                             baseline_final_loss=baseline[-1] if baseline else None, message=message,
                             budget_seconds=budget_seconds, seconds=_clock() - started,
                             optimizer="default" if optimizer is None else "user", results=results)  # fmt: skip

    if budget_seconds == 0:
        return done("the time budget is 0 s: nothing was run")
    chance = _chance_loss(model, inputs, loss_fn)
    try:
        baseline = _run(fresh(), steps, seed, deadline)
    except _OutOfTime as out:
        return done(f"the time budget of {budget_seconds:g} s ran out after {out} of the baseline's {steps} steps: "
                    "no remedy was tried (raise budget_seconds or lower steps)")  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the setup cannot even train: a remedy may fix that too
        crash = f"{type(exc).__name__}: {exc}"[:300]

    base_ratio = math.inf if baseline is None else _ratio(baseline, chance)
    if base_ratio is None:
        return done(f"the baseline's initial loss {baseline[0]:.4g} is not positive: progress is undefined")
    if base_ratio <= STUCK_RATIO:
        return done("the baseline learns on this batch: nothing for a remedy to explain")

    lr_candidates = optimizer if base_ratio > LR_STUCK_RATIO else None  # slow is not stuck
    candidates = _candidates(model, inputs, loss_fn, lr_candidates)
    for cause, remedy, apply in candidates:
        if any(r.cause == cause and r.status == "confirmed" for r in results):
            continue  # a larger LR factor after a smaller one worked says nothing new
        structural = next((r for r in results if r.status == "confirmed" and r.cause not in LR_CAUSES), None)
        if cause in LR_CAUSES and structural is not None:
            if not any(r.cause == cause for r in results):
                results.append(InterventionResult(
                    cause=cause, remedy=remedy, status="skipped",
                    message=f"{structural.remedy} already made it learn: a learning rate that works around "
                            "that bug is not a cause of its own"))  # fmt: skip
            continue
        out_of_time = InterventionResult(cause=cause, remedy=remedy, status="skipped",
                                         message=f"the time budget of {budget_seconds:g} s was spent")  # fmt: skip
        if _clock() >= deadline:
            results.append(out_of_time)
            continue
        t0 = _clock()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                remedied = apply(fresh())
                losses = _run(remedied, steps, seed, deadline)
        except _OutOfTime:
            if not any(r.cause == cause for r in results):
                results.append(out_of_time)
            continue
        except NotApplicable:
            continue  # not a candidate for this setup: nothing to record
        except Exception as exc:  # noqa: BLE001 - a remedy that crashes is no evidence either way
            message = f"{type(exc).__name__}: {exc}"[:300]
            if message != crash:  # failing as the setup itself fails says nothing about this remedy
                results.append(InterventionResult(cause=cause, remedy=remedy, status="error", message=message))
            continue
        ratio = _ratio(losses, chance)
        if baseline is None:  # the setup could not train at all: a remedy that lets it learn is the fix
            confirmed = ratio is not None and ratio < 1.0
        else:
            confirmed = ratio is not None and ratio <= CONFIRM_RATIO and ratio <= base_ratio - CONFIRM_GAIN
            if remedied.targets is targets and remedied.loss_fn is loss_fn:
                # the same loss of the same targets: the remedy must also end lower than the baseline on the
                # baseline's scale; a remedy that starts worse (a sigmoid removed from outputs it rightly
                # bounds) would otherwise be rewarded for falling from there
                reached = _ratio([baseline[0], losses[-1]], chance)
                confirmed &= reached is not None and reached <= base_ratio - CONFIRM_GAIN
            # on one fixed batch a loss that climbs far above its start overshoots; a slower LR that
            # stops the climb confirms it even where the batch leaves little to learn (a loss
            # that starts near its floor, as soft targets near uniform do)
            confirmed |= (cause == "LR_TOO_HIGH" and base_ratio >= CLIMB_RATIO and ratio is not None
                          and ratio <= 1.0)  # fmt: skip
        unchanged = ratio is None or ratio >= base_ratio - NO_GAIN
        # one result per cause: a confirmed factor replaces the ones tried before it
        results[:] = [r for r in results if not (confirmed and r.cause == cause)]
        if not confirmed and any(r.cause == cause for r in results):
            continue
        results.append(InterventionResult(
            cause=cause, remedy=remedy,
            status="confirmed" if confirmed else "not_confirmed" if unchanged else "inconclusive",
            message=None if baseline else f"the setup as given could not train: {crash}",
            steps=len(losses) - 1, baseline_initial_loss=baseline[0] if baseline else None,
            baseline_final_loss=baseline[-1] if baseline else None,
            remedied_initial_loss=losses[0], remedied_final_loss=losses[-1],
            baseline_progress=None if baseline is None else 1 - base_ratio,
            remedied_progress=None if ratio is None else 1 - ratio,
            seconds=_clock() - t0))  # fmt: skip
    if baseline is not None:
        remedy_of = {c: a for c, _, a in reversed(candidates)}  # each cause's first remedy
        _retry_structural_at_a_faster_lr(results, remedy_of, fresh, chance, steps, seed, deadline)
    _either_direction_is_no_direction(results)
    if baseline is not None:
        _no_run_learned_is_no_verdict(results, base_ratio, steps)
    return done()


def _no_run_learned_is_no_verdict(results: list[InterventionResult], base_ratio: float, steps: int) -> None:
    """A remedy that did not help is evidence against its cause only where a run of this
    experiment could learn: when neither the baseline nor any remedy (the faster learning
    rates included) came within ``CONFIRM_RATIO`` of its start in ``steps`` steps, the
    experiment had no power (plain SGD at 1e-3 on batches of 4: loeber's CNN with a ReLU on
    its logits moved 0.3% with it removed, 2% at a 10x LR), and its ``not_confirmed`` become
    ``inconclusive``."""
    judged = [r for r in results if r.status in ("confirmed", "not_confirmed", "inconclusive")]
    progress = [r.remedied_progress for r in judged if r.remedied_progress is not None]
    best = max(progress, default=-math.inf)
    if not judged or any(r.status == "confirmed" for r in judged) or max(best, 1 - base_ratio) >= 1 - CONFIRM_RATIO:
        return
    message = (f"no run of this experiment learned in {steps} steps (the baseline {1 - base_ratio:.0%} of its way "
               f"down, the best remedy {max(best, -1.0):.0%}): a remedy that did not help says nothing here")
    for result in judged:
        if result.status == "not_confirmed":
            results[results.index(result)] = result.model_copy(update={"status": "inconclusive", "message": message})


def _either_direction_is_no_direction(results: list[InterventionResult]) -> None:
    """A slower and a faster learning rate both confirmed say the batch rewards any change
    of step size, not that the LR is too high or too low: both become ``inconclusive``."""
    high, low = (next((r for r in results if r.cause == cause and r.status == "confirmed"), None) for cause in LR_CAUSES)
    if high is None or low is None:
        return
    message = (f"{high.remedy} and {low.remedy} both made it learn: on this batch any change of step size helps "
               "(an objective that moves with the model, such as a policy gradient or a critic's loss), so "
               "neither direction is a cause")  # fmt: skip
    for result in (high, low):
        results[results.index(result)] = result.model_copy(update={"status": "inconclusive", "message": message})


def _retry_structural_at_a_faster_lr(results: list[InterventionResult],
                                     remedy_of: dict[str, Callable[[Setup], Setup]], fresh: Callable[[], Setup],
                                     chance: float | None, steps: int, seed: int, deadline: float) -> None:
    """At the learning rate the setup runs at, a remedy that does not change the step size
    may show nothing in ``steps`` steps (plain SGD at 1e-3 barely moves a correct model
    either), while a 1000x LR makes even a softmax-before-cross-entropy model learn. When
    an LR factor confirmed after a smaller one did not, the remedies between the output and
    the loss (``OUTPUT_CAUSES``) that were not confirmed are tried again at that smaller factor, where the setup as given still
    does not learn: one that makes it learn there is confirmed, and the larger LR only
    compensated for it (its result becomes ``skipped``)."""
    low = next((r for r in results if r.cause == "LR_TOO_LOW" and r.status == "confirmed"), None)
    factor = next((f for f in LR_FACTORS if low is not None and low.remedy == f"the learning rate multiplied by {f:g}"),
                  None)  # fmt: skip
    if factor is None or factor == LR_FACTORS[0]:
        return
    smaller = LR_FACTORS[LR_FACTORS.index(factor) - 1]
    retry = [r for r in results if r.cause in OUTPUT_CAUSES and r.status in ("not_confirmed", "inconclusive")
             and r.cause in remedy_of]  # fmt: skip
    if not retry:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            slow = _ratio(_run(remedies.scale_lr(fresh(), smaller), steps, seed, deadline), chance)
            if slow is None or slow <= STUCK_RATIO:
                return  # the smaller factor learns after all: nothing to compare against
            for result in retry:
                try:
                    ratio = _ratio(_run(remedies.scale_lr(remedy_of[result.cause](fresh()), smaller), steps, seed,
                                        deadline), chance)  # fmt: skip
                except NotApplicable:
                    continue
                except _OutOfTime:
                    return
                except Exception:  # noqa: BLE001 - a remedy that crashes is no evidence either way
                    continue
                if ratio is None or ratio > CONFIRM_RATIO or ratio > slow - CONFIRM_GAIN:
                    continue
                index = results.index(result)
                results[index] = result.model_copy(update={
                    "status": "confirmed",
                    "remedy": f"{result.remedy}, with the learning rate multiplied by {smaller:g}",
                    "message": f"at the learning rate multiplied by {smaller:g} the setup as given still did not learn "
                               f"({1 - slow:.0%} of its way down in {steps} steps); with the remedy it learned "
                               f"({1 - ratio:.0%}): a remedy that leaves the step size alone could show nothing at the "
                               "setup's own learning rate",
                    "baseline_progress": 1 - slow, "remedied_progress": 1 - ratio})  # fmt: skip
                results[results.index(low)] = low.model_copy(update={
                    "status": "skipped",
                    "message": f"{result.remedy} made it learn at a {smaller:g}x learning rate, where the setup as "
                               f"given did not: the {factor:g}x learning rate compensated for that bug"})  # fmt: skip
                return
    except _OutOfTime:
        return


def _candidates(model: nn.Module, inputs: Any, loss_fn: LossFn,
                optimizer: torch.optim.Optimizer | None) -> list[tuple[str, str, Callable[[Setup], Setup]]]:  # fmt: skip
    """(cause, remedy in words, remedy) for each remedy that may apply, most specific first."""
    found: list[tuple[str, str, Callable[[Setup], Setup]]] = []
    with preserved_rng():
        output_activation = remedies.output_activation(set_mode(working_copy(model), False), inputs)
    if output_activation is not None:
        index, activation = output_activation
        cause = remedies.output_activation_cause(activation, loss_name(loss_fn))
        if cause is not None:
            found.append((cause, f"the {activation} on the output removed",
                          lambda s, i=index: remedies.drop_output_activation(s, i)))  # fmt: skip
    found += [
        ("WRONG_LOSS", "cross-entropy for the class labels", remedies.matching_loss),
        ("DEAD_RELU", "the dead ReLU units re-initialised", remedies.reinit_dead_units),
        ("BAD_INIT", "PyTorch's default init restored where a layer's was far from any standard init",
         remedies.default_init),
        ("UNNORMALIZED_INPUTS", "the inputs standardised", remedies.standardize_inputs),
        ("UNNORMALIZED_TARGETS", "the targets standardised", remedies.standardize_targets),
    ]
    if optimizer is not None:
        for factor in LR_FACTORS:
            found.append(("LR_TOO_HIGH", f"the learning rate divided by {factor:g}",
                          lambda s, f=factor: remedies.scale_lr(s, 1 / f)))  # fmt: skip
        for factor in LR_FACTORS:
            found.append(("LR_TOO_LOW", f"the learning rate multiplied by {factor:g}",
                          lambda s, f=factor: remedies.scale_lr(s, f)))  # fmt: skip
    return found


def _run(setup: Setup, steps: int, seed: int, deadline: float) -> list[float]:
    """Train the setup ``steps`` steps on its batch: the loss before each step and after
    the last (stops at the first non-finite loss). Raises _OutOfTime (with the number of
    steps done) when the deadline passes before the run ends."""
    losses: list[float] = []

    def setup_loss() -> torch.Tensor:  # each step, and again in an L-BFGS step's closure
        with remedies.bypassed_activation(setup):
            output = forward(setup.model, setup.inputs)
        return compute_loss(setup.loss_fn, output, setup.targets)

    scaler = loss_scaler(next(nn.Module.parameters(setup.model), torch.empty(0)).device)
    with preserved_rng():
        torch.manual_seed(seed)
        for step in range(steps + 1):
            if _clock() >= deadline:
                raise _OutOfTime(step)
            setup.optimizer.zero_grad(set_to_none=True)
            loss = setup_loss()
            losses.append(float(loss.detach()))
            if not math.isfinite(losses[-1]) or step == steps:
                break
            backward_and_step(loss, setup.optimizer, setup_loss, scaler)
    return losses


def _chance_loss(model: nn.Module, inputs: Any, loss_fn: LossFn) -> float | None:
    """The loss of a uniform prediction (ln C over C classes, ln 2 for a binary loss):
    a classifier whose loss fell from 170 to ln C has learned nothing. None for a loss
    summed over its batch (``reduction='sum'``), whose chance level is not one sample's."""
    kind = vocab.loss_kind(loss_name(loss_fn))
    if kind is None or kind.task != "classification" or getattr(loss_fn, "reduction", "mean") != "mean":
        return None
    if kind.binary:
        return math.log(2)
    with preserved_rng(), torch.no_grad():
        output = first_output(forward(working_copy(model), inputs))
    if output is None or output.dim() < 2 or output.shape[1] < 2:
        return None
    return math.log(output.shape[1])


def _ratio(losses: list[float], chance: float | None) -> float | None:
    """Final loss over where it started — the initial loss, or the chance-level loss if
    lower — inf when the run turned non-finite; None when undefined."""
    initial, final = losses[0], losses[-1]
    if not math.isfinite(initial) or initial <= 0:
        return None
    reference = min(initial, chance) if chance else initial
    return final / reference if math.isfinite(final) else math.inf

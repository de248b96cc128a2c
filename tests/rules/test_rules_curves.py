"""Loss-curve rules against the defects of the lesson's check_loss_health: oscillation
must not fire on noisy healthy curves, and "not decreasing" must be scale-aware."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from nndx.report import CauseCode, DiagnosticReport
from nndx.rules import diagnose

from .reports import flat, noisy_decreasing, plateau_curve, points


def _ids(values, **fields) -> set[str]:
    report = DiagnosticReport(loss_history={"train": points(values)}, **fields)
    return {f.rule_id for f in diagnose(report).findings}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("noise", [0.02, 0.1, 0.25])
def test_noisy_healthy_curves_raise_no_alarm(seed, noise):
    values = noisy_decreasing(seed, n=150, noise=noise)
    diagnosis = diagnose(DiagnosticReport(loss_history={"train": points(values)}))
    assert diagnosis.healthy
    # a converged curve may read as a plateau (info, context); never as oscillation or stuck
    assert {f.rule_id for f in diagnosis.findings} <= {"NNDX105"}


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_not_decreasing_is_scale_aware(scale):
    stuck = [scale * v for v in flat(1, level=1.0, noise=0.01)]
    falling = [scale * v for v in noisy_decreasing(1, start=1.0, end=0.5, noise=0.05)]
    assert "NNDX103" in _ids(stuck)
    assert "NNDX103" not in _ids(falling)


def test_slow_but_real_progress_is_not_stuck():
    values = [2.0 - 0.002 * i for i in range(100)]  # 10% over the run
    assert "NNDX103" not in _ids(values)


def test_oscillation_fires_on_large_swings_without_progress():
    values = [2.3 + (1.2 if i % 2 else -1.0) for i in range(60)]
    assert "NNDX104" in _ids(values)


def test_swings_on_a_loss_that_starts_near_its_floor_and_still_falls_are_context():
    """A small head on a frozen backbone: the loss starts near its floor, minibatch noise
    is large next to it, and it still falls by a third — info, not an LR alarm."""
    values = noisy_decreasing(4, n=100, start=0.36, end=0.22, noise=0.45)
    severities = {f.rule_id: f.severity for f in diagnose(DiagnosticReport(loss_history={"train": points(values)})).findings}
    assert severities.get("NNDX104") in (None, "info")
    stuck = [2.3 * (1 + (0.4 if i % 2 else -0.4)) for i in range(60)]  # as noisy, and no progress
    assert {f.rule_id: f.severity for f in diagnose(DiagnosticReport(loss_history={"train": points(stuck)})).findings}.get(
        "NNDX104") == "warning"


def test_single_sample_spikes_around_a_falling_level_are_context_a_climb_is_an_alarm():
    """One sample per step (the char-RNN tutorial): a misclassified sample's loss is several
    times the mean, so spikes over twice the start come with a level that fell by 80%."""
    rng = np.random.default_rng(0)
    level = np.linspace(1.8, 0.35, 400)
    per_sample = level * rng.exponential(1.0, 400)  # heavy-tailed losses of single samples
    assert sum(v > 3.6 for v in per_sample[200:]) >= 2  # the spikes are there
    severities = {f.rule_id: f.severity for f in diagnose(DiagnosticReport(loss_history={"train": points(
        list(per_sample))})).findings}  # fmt: skip
    assert severities.get("NNDX104") in (None, "info"), severities
    climbing = list(np.concatenate([level[:200], np.linspace(0.4, 4.0, 200)]) * rng.uniform(0.9, 1.1, 400))
    found = {f.rule_id: f for f in diagnose(DiagnosticReport(loss_history={"train": points(climbing)})).findings}
    assert found["NNDX104"].severity == "warning" and "diverging" in found["NNDX104"].symptom
    assert "NNDX103" not in found  # a loss that climbed is not short of a larger step


def test_infinite_at_step_0_points_to_a_log_of_zero():
    report = DiagnosticReport(loss_history={"train": points([math.inf] * 20)})
    assert diagnose(report).top().code is CauseCode.LOG_OF_ZERO


def test_nan_immediately_and_after_k_steps_point_to_different_causes():
    immediate = DiagnosticReport(loss_history={"train": points([math.nan] * 20)})
    later = DiagnosticReport(loss_history={"train": points(noisy_decreasing(0, n=40)[:20] + [math.inf] * 5)})
    first = {f.rule_id: f for f in diagnose(immediate).findings}
    second = {f.rule_id: f for f in diagnose(later).findings}
    assert set(first) == {"NNDX110"} and first["NNDX110"].code is CauseCode.NUMERICAL_OVERFLOW
    assert "NNDX102" in second and second["NNDX102"].code is CauseCode.LR_TOO_HIGH
    assert second["NNDX102"].step == 20


def test_stuck_at_ln_c_needs_the_class_count_and_uses_it():
    values = flat(2, level=math.log(5), noise=0.002)
    assert "NNDX106" not in _ids(values)
    assert "NNDX106" in _ids(values, num_classes=5)
    assert "NNDX106" not in _ids(values, num_classes=10)  # ln 10 != ln 5


def test_plateau_after_decrease_is_info_only():
    values = [2.0 * math.exp(-i / 8) + 0.7 for i in range(40)] + flat(3, n=60, level=0.7, noise=0.003)
    report = DiagnosticReport(loss_history={"train": points(values)})
    plateau = [f for f in diagnose(report).findings if f.rule_id == "NNDX105"]
    assert plateau and plateau[0].severity == "info"
    # a learning rate that decays is no constant one, warm-up from 0 first (Hugging Face's linear schedule)
    from nndx.report import LoopStats, LRPoint

    for warmup in (0.0, 1e-4):
        lrs = [warmup + (1e-3 - warmup) * i / 10 if i < 10 else 1e-3 * (100 - i) / 90 for i in range(0, 100, 2)]
        decaying = LoopStats(steps=100, lr_history=[LRPoint(step=2 * i, lrs=[lr]) for i, lr in enumerate(lrs)])
        assert "NNDX105" not in {f.rule_id for f in diagnose(report.model_copy(update={"loop": decaying})).findings}


def test_a_constant_lr_noise_floor_is_a_plateau_a_quiet_converged_loss_is_not():
    """Small-batch SGD at a constant LR: the loss falls to 5% of its start and slides on, but
    each step's minibatch loss swings by more than its own level, a noise ball that a decay
    would shrink. The same curve with quiet steps has converged."""

    def run(noise: float, floor: float = 0.03) -> set[str]:
        rng = random.Random(1)
        level = [floor * (2 - i / 300) + 1.3 * math.exp(-12 * i / 300) for i in range(300)]
        values = [v * math.exp(rng.gauss(0, noise)) for v in level]  # minibatch noise, multiplicative
        return {f.rule_id for f in diagnose(DiagnosticReport(loss_history={"train": points(values)})).findings}

    assert "NNDX105" in run(noise=1.0)
    assert "NNDX105" not in run(noise=0.2)
    assert "NNDX105" not in run(noise=1.0, floor=1e-5)  # fitted: under 1% of the start, noisy or not


def test_noisy_task_plateau_is_not_an_alarm():
    report = DiagnosticReport(num_classes=2, loss_history={"train": points(plateau_curve(9))})
    assert diagnose(report).healthy


def test_overfitting_needs_train_still_falling():
    val = [1.0, 0.8, 0.7, 0.65, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]
    falling = {"train": points(noisy_decreasing(0, n=100, end=0.05, noise=0.02)), "val": points(val, every=10)}
    assert "NNDX107" in {f.rule_id for f in diagnose(DiagnosticReport(loss_history=falling)).findings}
    healthy_val = [1.0, 0.8, 0.7, 0.65, 0.62, 0.6, 0.6, 0.59, 0.6, 0.59]
    fine = {"train": falling["train"], "val": points(healthy_val, every=10)}
    assert "NNDX107" not in {f.rule_id for f in diagnose(DiagnosticReport(loss_history=fine)).findings}
    # gradients summed over steps (no zero_grad, DeepAR): the train loss climbed from 46 to 69, dipping late
    climbing = [46 + 0.5 * i for i in range(60)] + [76 - 0.2 * i for i in range(40)]
    risen = {"train": points(climbing), "val": points(val, every=10)}
    assert "NNDX107" not in {f.rule_id for f in diagnose(DiagnosticReport(loss_history=risen)).findings}


def test_a_memorised_train_set_is_overfitting_even_when_validation_never_rises():
    """48 rows, 300 steps: the train loss goes to ~0 while validation stops where it started
    (nothing carries over: a warning) or part of the way down (context: a well-fitted small
    data set ends that way too). A 12x gap on a converged run is not flagged at all."""
    train = points(noisy_decreasing(0, n=100, start=1.4, end=1e-4, noise=0.02))

    def overfit(val: list[float]) -> str | None:
        report = DiagnosticReport(loss_history={"train": train, "val": points(val, every=10)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX107"), None)

    assert overfit([1.07, 1.05, 1.02, 1.04, 1.04, 1.04, 1.04, 1.04, 1.04, 1.04]) == "warning"
    assert overfit([1.5, 0.92, 0.76, 0.71, 0.70, 0.70, 0.65, 0.66, 0.71, 0.70]) == "info"
    assert overfit([1.5, 0.92, 0.76, 0.71, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4]) is None  # validation still improving
    # measured 5 times: most of the improvement (0.57 -> 0.25) is inside the first window
    assert overfit([0.567, 0.252, 0.267, 0.281, 0.288]) == "info"
    still = {"train": points(noisy_decreasing(0, n=100, end=0.05, noise=0.02)),
             "val": points([1.0, 0.8, 0.7, 0.65, 0.62, 0.6, 0.6, 0.59, 0.6, 0.59], every=10)}  # fmt: skip
    assert "NNDX107" not in {f.rule_id for f in diagnose(DiagnosticReport(loss_history=still)).findings}


def test_early_blow_up_then_collapse_is_divergence():
    # lr=10 without momentum: the loss jumps 1000x, then the dead network sits above its start
    values = [1.35, 350.0, 6900.0, 2.4] + flat(6, n=56, level=1.85, noise=0.1)
    found = {f.rule_id for f in diagnose(DiagnosticReport(loss_history={"train": points(values)})).findings}
    assert {"NNDX104", "NNDX103"} <= found


def test_validation_at_chance_beside_memorisation_ranks_overfitting_until_a_probe_says_misaligned():
    """Train accuracy rising, validation at chance and its loss climbing: a tiny training set
    memorised looks the same as labels that belong to nothing. The overfitting is seen
    directly and ranks first; once the label-alignment probe fails, misaligned labels are the
    root and explain both."""
    from nndx.report import LabelAlignmentResult, Probes

    from .broken import val_chance

    report = val_chance()
    found = diagnose(report).findings
    assert [f.rule_id for f in found][:2] == ["NNDX107", "NNDX109"]
    assert all(f.explained_by is None for f in found[:2])
    failed = LabelAlignmentResult(status="failed", message="no better than permuted labels", real_accuracy=0.1,
                                  permuted_accuracy=0.1, chance_accuracy=0.1, steps=200)  # fmt: skip
    probed = diagnose(report.model_copy(update={"probes": Probes(label_alignment=failed)})).findings
    assert probed[0].rule_id == "NNDX610" and {"NNDX107", "NNDX109"} <= set(probed[0].explains)


def test_three_evaluations_all_at_chance_are_enough_one_that_learned_is_not():
    """A fine-tuning script evaluates once per epoch, three epochs: every point at chance
    is the symptom; a first epoch at chance and two that learned are not."""
    from .reports import points

    train = points([0.69 + 0.002 * ((-1) ** i) for i in range(60)], [0.5] * 60)

    def found(val_accuracy):
        val = points([0.69] * len(val_accuracy), val_accuracy, every=20)
        return {f.rule_id for f in diagnose(DiagnosticReport(num_classes=2, loss_history={
            "train": train, "val": val})).findings}  # fmt: skip

    assert "NNDX109" in found([0.49, 0.54, 0.52])
    assert "NNDX109" not in found([0.52, 0.81, 0.93])
    assert "NNDX109" not in found([0.5, 0.51])  # two points: too few to say


def test_validation_accuracy_below_chance_is_the_symptom_too():
    """A split of class-sorted rows whose labels were not shuffled with the texts (Kim's CNN,
    labels left in file order): train learns a little, the dev tenth holds one class the model
    rarely predicts — worse than a coin. The farther below chance, the stronger the evidence."""
    from .reports import points

    train = points([0.68 - 0.001 * i for i in range(60)], [0.55 + 0.002 * i for i in range(60)])

    def found(val_accuracy):
        val = points([0.8] * len(val_accuracy), val_accuracy, every=5)
        return {f.rule_id: f for f in diagnose(DiagnosticReport(num_classes=2, loss_history={
            "train": train, "val": val})).findings}  # fmt: skip

    below = found([0.0] * 10 + [0.02, 0.05, 0.1])
    assert below["NNDX109"].code.value == "LABELS_MISALIGNED" and "below chance" in below["NNDX109"].symptom
    at = found([0.5] * 13)
    assert "below" not in at["NNDX109"].symptom and below["NNDX109"].score > at["NNDX109"].score
    assert "NNDX109" not in found([0.3] * 5 + [0.8] * 8)


def test_a_generator_loss_that_rises_as_its_discriminator_improves_is_context():
    """A GAN's generator loss runs through the discriminator and rises as it improves; the
    same curve on a loss of the model alone is divergence."""
    from nndx.report import LoopStats

    from .reports import points

    rising = points([0.66 + 2.4 * (1 - math.exp(-i / 60)) + 0.1 * ((-1) ** i) for i in range(300)])

    def nndx104(**loop):
        report = DiagnosticReport(loss_history={"train": rising}, loop=LoopStats(steps=300, **loop))
        return next(f for f in diagnose(report).findings if f.rule_id == "NNDX104")

    assert nndx104().severity == "warning"
    generator = nndx104(logged_loss_reaches_params=True, logged_loss_through_other_models=True)
    assert generator.severity == "info" and "another trained network" in generator.symptom


def test_a_generator_loss_that_starts_near_zero_and_crosses_it_has_no_scale_in_its_first_value():
    """SN-GAN's hinge generator loss -D(G(z)) starts at 0.04 (an untrained critic outputs ~0)
    and wanders over -0.4..1.5 as the critic learns: "80 points above 10x the first value" was
    a diverging warning. Its jumps are measured against its level over the first fifth; a
    climb to 20x that level is still divergence."""
    from nndx.report import LoopStats

    from .reports import points

    wander = [0.04, 0.05, 0.06] + [0.6 + 0.7 * math.sin(i / 7) for i in range(220)]  # under 0 a sixth of the time

    def nndx104(values):
        report = DiagnosticReport(loss_history={"train": points(values)}, loop=LoopStats(
            steps=len(values), logged_loss_reaches_params=True, logged_loss_through_other_models=True))
        return next((f for f in diagnose(report).findings if f.rule_id == "NNDX104"), None)

    quiet = nndx104(wander)
    assert quiet is None or quiet.severity == "info", quiet
    blown = nndx104(wander[:120] + [30.0 + i for i in range(100)])
    assert blown is not None and blown.severity == "warning" and "diverging" in blown.symptom


def test_a_loss_that_does_not_fall_at_an_lr_the_range_test_trains_well_at_is_not_blamed_on_the_lr():
    """Labels shuffled apart from their sentences: the loss stays at ln 2 and validation at
    chance. At an LR the range test trains well at, "LR too low" is the weaker guess; far
    below that range it is the stronger."""
    from nndx.report import LoopStats, LRPoint, LRRangeResult, Probes

    from .reports import points

    sweep = LRRangeResult(status="passed", interval_low_lr=2e-3, interval_high_lr=7e-3, suggested_lr=4e-3)
    train = points([0.693 + 0.002 * ((-1) ** i) for i in range(60)], [0.5] * 60)
    val = points([0.693] * 3, [0.49, 0.54, 0.52], every=20)

    def first(lr):
        report = DiagnosticReport(num_classes=2, loss_history={"train": train, "val": val},
                                  loop=LoopStats(steps=60, lr_history=[LRPoint(step=0, lrs=[lr])]),
                                  probes=Probes(lr_range=sweep))  # fmt: skip
        return [f.rule_id for f in diagnose(report).findings if f.rule_id in ("NNDX103", "NNDX109")]

    assert first(1e-3) == ["NNDX109", "NNDX103"]
    assert first(1e-7) == ["NNDX103", "NNDX109"]


def test_a_loss_that_climbs_at_an_lr_the_range_test_trains_well_at_is_context():
    """A DQN's TD loss: its bootstrapped targets grow as the Q-values do, so after a first
    drop the loss climbs back, at an LR the range test (from the same start) trains well at.
    Far above that range the same climb is an overshoot; a jump to 10x that lasts is one at any LR,
    one that a hard target sync makes on a few steps is not."""
    from nndx.report import LoopStats, LRPoint, LRRangeResult, Probes

    rng = np.random.default_rng(0)
    td = [0.5] + list(np.concatenate([np.linspace(0.02, 0.02, 100), np.linspace(0.02, 0.6, 300)])
                      * rng.uniform(0.5, 1.5, 400))
    sweep = LRRangeResult(status="passed", interval_low_lr=4e-4, interval_high_lr=1.7e-3, suggested_lr=8e-4)

    def nndx104(values, lr):
        report = DiagnosticReport(loss_history={"train": points(values)}, probes=Probes(lr_range=sweep),
                                  loop=LoopStats(steps=len(values), lr_history=[LRPoint(step=0, lrs=[lr])]))
        return next(f for f in diagnose(report).findings if f.rule_id == "NNDX104")

    fine = nndx104(td, 1e-3)
    assert fine.severity == "info" and "not an overshoot" in fine.symptom
    assert nndx104(td, 1e-2).severity == "warning"
    blown = td[:200] + [6.0] * 200
    assert nndx104(blown, 1e-3).severity == "warning"
    # a dueling DQN's hard target syncs: 3 of 400 points jump past 10x the first value, then settle
    synced = [14.0 if i % 130 == 100 else v for i, v in enumerate(td)]
    assert nndx104(synced, 1e-3).severity == "info"
    assert nndx104(synced, 1e-2).severity == "warning"


def test_a_climb_the_range_test_refutes_explains_no_other_finding():
    """The DQN's climbing TD loss at an LR the range test trains well at is context, and its
    LR_TOO_HIGH guess is refuted: it must not root (and lend its code to) what another rule
    saw, such as units found dead after training. Far above the range, the climb roots them."""
    from nndx.report import LayerStats, LoopStats, LRPoint, LRRangeResult, Probes

    from .reports import act

    rng = np.random.default_rng(0)
    td = [0.5] + list(np.linspace(0.02, 0.6, 400) * rng.uniform(0.5, 1.5, 400))
    sweep = LRRangeResult(status="passed", interval_low_lr=4e-4, interval_high_lr=1.7e-3, suggested_lr=8e-4)
    dead = LayerStats(name="forward:relu#1", type="ReLU", step=401, activation=act(dead=0.54, zero=0.6, units=128))

    def found(lr):
        report = DiagnosticReport(loss_history={"train": points(td)}, probes=Probes(lr_range=sweep), layers=[dead],
                                  loop=LoopStats(steps=401, lr_history=[LRPoint(step=0, lrs=[lr])]))  # fmt: skip
        return {f.rule_id: f for f in diagnose(report).findings}

    fine = found(1e-3)
    assert fine["NNDX104"].refuted and fine["NNDX104"].severity == "info" and not fine["NNDX104"].explains
    # units silent on one batch after training, at an LR the range test trains well at: sparse, not killed
    assert fine["NNDX208"].explained_by is None and fine["NNDX208"].severity == "info"
    high = found(1e-2)
    # far above the range: the range test's verdict (NNDX602, with the units killed) roots the climb and them
    assert not high["NNDX104"].refuted and high["NNDX104"].explained_by == "NNDX602"
    assert high["NNDX208"].explained_by == "NNDX602" and high["NNDX602"].code.value == "LR_TOO_HIGH"
    assert high["NNDX104"].severity == "warning"
    dead = dead.model_copy(update={"activation": act(dead=0.95, zero=0.97, units=128)})
    assert found(1e-3)["NNDX208"].severity == "error"  # the whole layer: dead whatever the LR


def test_a_loss_that_hovers_around_zero_has_no_floor_to_judge_progress_by():
    """REINFORCE: -log p(a) * R with returns normalised to mean 0. The loss swings on both sides
    of zero and, on one batch, falls without end (every action with a negative return pushed to
    p = 0). None of that is an alarm. A loss with a sign error crosses zero once and keeps
    falling: that one has no lower bound."""
    from nndx.report import OverfitResult, Probes

    rng = np.random.default_rng(1)
    policy = list(rng.normal(0.0, 3.0, 300) * np.linspace(0.3, 3.0, 300))
    probe = Probes(overfit_one_batch=OverfitResult(status="passed", losses=list(np.linspace(-0.9, -139.0, 60))))
    found = {f.rule_id: f for f in diagnose(DiagnosticReport(loss_history={"train": points(policy)},
                                                             probes=probe)).findings}  # fmt: skip
    assert all(f.severity == "info" for f in found.values()), {k: f.severity for k, f in found.items()}
    assert "NNDX103" not in found and "NNDX105" not in found
    assert "no floor" in found["NNDX111"].symptom
    sign_error = [2.0 - 0.05 * i for i in range(300)]  # recon - kl: through zero, on to -13
    found = {f.rule_id: f for f in diagnose(DiagnosticReport(loss_history={"train": points(sign_error)},
                                                             probes=probe)).findings}  # fmt: skip
    assert found["NNDX111"].severity == "error"


def test_a_loss_that_learned_then_stalled_at_an_lr_the_range_test_trains_well_at_is_context():
    """Beta-VAE's objective B: gamma * |KL - C| with C ramping up; the loss falls from 300 to
    ~130 in the first steps, then wanders (noise ~0.9 of its level) as C grows. At an LR the
    range test trains well at, a stall after real learning says nothing against the LR."""
    from nndx.report import LoopStats, LRPoint, LRRangeResult, Probes

    sweep = LRRangeResult(status="passed", interval_low_lr=2e-4, interval_high_lr=2.4e-3, suggested_lr=6e-4)
    rng = random.Random(0)
    learned = [300.0, 200.0] + [abs(127 + 30 * i / 400 + rng.gauss(0, 60)) for i in range(400)]

    def severity(values, lr):
        report = DiagnosticReport(loss_history={"train": points(values)},
                                  loop=LoopStats(steps=len(values), lr_history=[LRPoint(step=0, lrs=[lr])]),
                                  probes=Probes(lr_range=sweep))  # fmt: skip
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX103"), None)

    assert severity(learned, 5e-4) == "info"
    assert severity(learned, 1e-7) == "warning"  # far below the range: the LR is the guess
    stuck = [300.0 + rng.gauss(0, 3) for _ in range(400)]
    assert severity(stuck, 5e-4) == "warning"  # never learned: an alarm whatever the LR


def test_a_loss_that_climbs_while_the_steps_stay_small_is_no_overshoot():
    """IQL's value loss, from a Monitor alone (no range test): the expectile regression of V on
    the target critic's Q starts near 0 (both networks start near 0) and climbs 100x as the
    Q-values grow toward the returns, while Adam's steps stay at ~2e-3 of the weights. An
    overshoot makes large steps; the same climb with steps of a fifth of the weights is one."""
    from nndx.report import LoopStats, LRPoint

    from .reports import mlp_params

    rng = np.random.default_rng(0)
    climb = [0.006] + list(np.linspace(0.001, 0.1, 200) * rng.uniform(0.5, 1.5, 200))

    def nndx104(ratio):
        report = DiagnosticReport(loss_history={"train": points(climb)},
                                  parameters=mlp_params(range(0, 200, 10), ratio),
                                  loop=LoopStats(steps=200, lr_history=[LRPoint(step=0, lrs=[1e-3])]))  # fmt: skip
        return next(f for f in diagnose(report).findings if f.rule_id == "NNDX104")

    small = nndx104(2e-3)
    assert small.severity == "info" and small.refuted and "steps" in small.symptom
    large = nndx104(0.2)
    assert large.severity == "warning" and not large.refuted


def test_a_loss_that_does_not_fall_at_steps_of_a_healthy_size_is_not_blamed_on_the_lr_first():
    """JEM's p(y|x) scored against another loader's labels, from its Monitor alone (no range test):
    the loss stays at ln 10 and validation at chance while Adam's steps are 7e-3 of the weights,
    above healthy training's ~1e-3. Steps that size are not too small: labels at chance rank first.
    The same curve at steps of 1e-6 of the weights is an LR too low first."""
    from nndx.report import LoopStats, LRPoint

    from .reports import mlp_params

    train = points([2.3026 + 0.003 * ((-1) ** i) for i in range(60)], [0.1] * 60)
    val = points([2.3026] * 3, [0.1, 0.12, 0.09], every=20)

    def first(ratio):
        report = DiagnosticReport(num_classes=10, loss_history={"train": train, "val": val},
                                  parameters=mlp_params(range(0, 60, 5), ratio),
                                  loop=LoopStats(steps=60, lr_history=[LRPoint(step=0, lrs=[1e-3])]))  # fmt: skip
        return [f.rule_id for f in diagnose(report).findings if f.rule_id in ("NNDX103", "NNDX109", "NNDX206")]

    assert first(7e-3) == ["NNDX109", "NNDX103"]
    assert first(1e-6)[0] in ("NNDX103", "NNDX206")


def test_a_loss_that_falls_slowly_at_steps_of_a_healthy_size_is_a_short_run_not_a_small_lr():
    """A federated client's first round (FedAvg, from scratch): 75 SGD steps on its shard take the
    loss from 2.35 to 2.24, steadily under minibatch noise, at steps of 2.6e-3 of the weights. The
    loss falls at healthy training's pace, the run is short: context, not an LR too low. The same
    curve at steps of 1e-6 of the weights is an LR too low; a loss that does not fall at all at
    steps of a healthy size stays a warning (something else holds it)."""
    from nndx.report import LoopStats, LRPoint

    from .reports import mlp_params

    rng = np.random.default_rng(3)
    falling = list(np.linspace(2.35, 2.24, 75) + rng.normal(0.0, 0.08, 75))
    level = list(2.3 + rng.normal(0.0, 0.08, 75))

    def nndx103(curve, ratio):
        report = DiagnosticReport(loss_history={"train": points(curve)},
                                  parameters=mlp_params(range(0, 75, 5), ratio),
                                  loop=LoopStats(steps=75, lr_history=[LRPoint(step=0, lrs=[1e-2])]))  # fmt: skip
        return next(f for f in diagnose(report).findings if f.rule_id == "NNDX103")

    short = nndx103(falling, 2.6e-3)
    assert short.severity == "info" and "healthy" in short.symptom, short.symptom
    assert nndx103(falling, 1e-6).severity == "warning"
    assert nndx103(level, 2.6e-3).severity == "warning"


def test_a_monitor_that_saw_no_loss_call_reads_the_loss_off_its_graph():
    """A federated client's Monitor: the loop calls F.cross_entropy itself (no loss_fn given), and
    the client starts from the averaged model, already fitted; its batches of 10 swing. The logged
    loss's graph (LogSoftmax -> NllLoss) names the loss, the output layer's width the classes:
    ln 10 is what an uninformed prediction gets, and the start is fitted, not stuck."""
    import math

    from nndx.rules._series import uninformed_loss

    from .reports import healthy_mlp, points, with_loop

    swings = [0.3 + (1.6 if i % 9 == 4 else 0.25 * ((i * 7) % 5) / 4) for i in range(75)]
    client = with_loop(healthy_mlp(), loss_calls=[], ops_before_loss=[["Addmm", "LogSoftmax", "NllLoss"]])
    client = client.model_copy(update={"loss_history": {"train": points(swings)}, "data": None, "num_classes": None,
                                       "probes": None})
    assert uninformed_loss(client) == pytest.approx(math.log(10))
    found = {f.rule_id: f for f in diagnose(client).findings}
    assert all(f.severity == "info" for f in found.values()), [(f.rule_id, f.severity) for f in found.values()]
    # a graph that ends in no loss nndx knows (a term added to it) names none
    summed = with_loop(client, ops_before_loss=[["Addmm", "LogSoftmax", "NllLoss", "Add"]])
    assert uninformed_loss(summed) is None


def test_an_early_overshoot_the_run_recovers_from_is_context():
    """fastbook's from-scratch MLP: the loss jumps from 3.4 to 115 in its first steps, then falls
    steadily to 0.2. Jumps confined to the run's first tenth, with the loss ending under half its
    first value, are an overshoot the run recovered from (a warm-up would avoid it), not a
    divergence; the same jumps late in the run, or a loss that ends above its start, are."""
    recovered = [3.36, 15.7, 114.8, 85.9, 1.31] + [1.0 * 0.97**i for i in range(60)]

    def severity(values: list[float]) -> str | None:
        found = diagnose(DiagnosticReport(loss_history={"train": points(values)})).findings
        return next((f.severity for f in found if f.rule_id == "NNDX104"), None)

    assert severity(recovered) in ("info", None)
    assert severity(recovered[:5] + [3.0 + 0.01 * i for i in range(60)]) == "warning"  # never came back down
    assert severity(recovered[:1] + recovered[5:40] + recovered[1:5] + recovered[40:]) == "warning"  # jumps mid-run

"""Pairs a naive rule confuses: each bug next to the healthy run that looks like it."""

from __future__ import annotations

import math

import pytest

from nndx.report import DiagnosticReport, GradCheckParam, GradCheckResult, GradNormPoint, LRPoint
from nndx.rules import diagnose

from .reports import (
    flat,
    healthy_data,
    healthy_mlp,
    healthy_probes,
    healthy_reports,
    healthy_split,
    mlp_layers,
    mlp_model,
    points,
    with_loop,
)

BASE = healthy_mlp()


def _found(report) -> dict:
    return {f.rule_id: f for f in diagnose(report).findings}


def test_missing_zero_grad_vs_deliberate_accumulation():
    assert "NNDX301" in _found(with_loop(BASE, zero_grad_calls=0))
    assert "NNDX301" in _found(with_loop(BASE, zero_grad_calls=1))  # once, before the loop
    every_tenth = _found(with_loop(BASE, zero_grad_calls=20))
    assert every_tenth["NNDX301"].severity == "warning"
    assert "NNDX301" not in _found(with_loop(BASE, steps=50, backward_calls=200, zero_grad_calls=50))


def test_backward_passes_each_after_a_reset_are_no_accumulation():
    """A GAN's discriminator: its gradients are reset before its own backward and again
    before the generator's loss reaches it: two backward passes per step, none summed."""
    assert "NNDX302" in _found(with_loop(BASE, steps=50, backward_calls=200, zero_grad_calls=50))
    assert "NNDX302" not in _found(with_loop(BASE, steps=50, backward_calls=100, zero_grad_calls=100))


def test_frozen_backbone_is_info_but_all_frozen_is_an_error():
    backbone = _found(healthy_reports()["frozen_backbone"])["NNDX305"]
    assert backbone.severity == "info"
    from .broken import BROKEN

    assert _found(BROKEN["NNDX305"]())["NNDX305"].severity == "error"


def test_dead_units_use_dead_unit_fraction_not_zero_fraction():
    many_zeros = BASE.model_copy(update={"layers": [l.model_copy(update={"activation": l.activation.model_copy(update={"zero_fraction": 0.7})}) if l.type == "ReLU" else l for l in BASE.layers]})
    assert "NNDX201" not in _found(many_zeros)


def test_one_groups_collapsed_schedule_is_not_hidden_by_another_groups_steady_lr():
    """pytorch-center-loss: the model's SGD with StepLR stepped every batch beside the centers' own SGD at a
    constant 0.5. The largest LR never moves; the model's is ~0 after a tenth of the run."""
    per_batch = [LRPoint(step=i, lrs=[0.05 * 0.5 ** (i // 8), 0.5]) for i in range(200)]
    finding = _found(with_loop(BASE, lr_history=per_batch))["NNDX307"]
    assert finding.severity == "warning" and finding.evidence["param_group"] == 0
    # a body unfrozen half-way (LR 0, then its schedule) ends at its peak: a schedule, not a collapse
    unfrozen = [LRPoint(step=i, lrs=[0.0 if i < 100 else 1e-4, 1e-3]) for i in range(200)]
    assert "NNDX307" not in _found(with_loop(BASE, lr_history=unfrozen))
    # a cosine to 0 beside a steady group only gets low at the very end
    cosine = [LRPoint(step=i, lrs=[0.1 * (1 + math.cos(math.pi * i / 199)) / 2, 0.01]) for i in range(200)]
    assert "NNDX307" not in _found(with_loop(BASE, lr_history=cosine))


def _one_cycle(lr_max: float, n: int) -> list[float]:
    """fastai's fit_one_cycle: cosine up from lr_max/25 for a quarter, then down to lr_max/1e5."""
    def at(t: float) -> float:
        if t < 0.25:
            return lr_max / 25 + (lr_max - lr_max / 25) * (1 - math.cos(math.pi * t / 0.25)) / 2
        return lr_max / 1e5 + (lr_max - lr_max / 1e5) * (1 + math.cos(math.pi * (t - 0.25) / 0.75)) / 2

    return [at(i / (n - 1)) for i in range(n)]


def test_groups_annealed_together_are_one_schedule_not_a_group_collapse():
    """ULMFiT: gradual unfreezing in one-cycle stages (2e-2, then 1e-2, 5e-3, 1e-3) with
    discriminative LRs (the embedding group at lr / 2.6**4), the first stage given to every
    group while the body is frozen. The embedding group then sits far under that peak: "1e-3 of
    its peak for 33% of the steps while another group's LR held" outranked the labels bug. No
    group held: every group anneals at each stage's end. Beside a group that holds, it fires."""
    stages = [(2e-2, 1.0), (1e-2, 2.6**-4), (5e-3, 2.6**-4), (1e-3, 2.6**-4)]
    together = [(lr * div, lr) for top, div in stages for lr in _one_cycle(top, 50)]
    history = [LRPoint(step=i, lrs=list(lrs)) for i, lrs in enumerate(together)]
    assert "NNDX307" not in _found(with_loop(BASE, lr_history=history))
    beside = [LRPoint(step=i, lrs=[low, 1e-3]) for i, (low, _) in enumerate(together)]
    assert _found(with_loop(BASE, lr_history=beside))["NNDX307"].evidence["param_group"] == 0


def test_schedule_per_batch_collapse_vs_one_cycle():
    assert "NNDX307" not in _found(healthy_reports()["one_cycle"])
    cosine_to_zero = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[0.1 * (1 + math.cos(math.pi * i / 199)) / 2]) for i in range(200)])
    assert "NNDX307" not in _found(cosine_to_zero)
    exponential_per_batch = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[0.1 * 0.9**i]) for i in range(200)])
    assert "NNDX307" in _found(exponential_per_batch)


def test_a_warm_up_longer_than_the_run_never_reaches_its_peak():
    """llama2.c's train.py keeps warmup_iters=1000 for a 400-iteration run: the LR climbs
    linearly to 2/5 of learning_rate and the run ends mid-warm-up. A warm-up that ends, then
    holds, decays or cycles (one-cycle, triangular) is a schedule."""
    def found(lrs, report=BASE):
        history = [LRPoint(step=i, lrs=[lr]) for i, lr in enumerate(lrs)]
        return _found(with_loop(report, lr_history=history)).get("NNDX307")

    from .broken import train, update
    from .reports import flat

    stalled = update(**train(flat(0, level=2.2, noise=0.05)))
    assert found([1e-3 * i / 1000 for i in range(400)], stalled).severity == "warning"
    assert found([1e-3 * i / 1000 for i in range(400)]).severity == "info"  # the loss still learned
    assert found([1e-3 * 0.1 * 10 ** (i / 400) for i in range(400)])  # an exponential ramp, still rising
    assert not found([1e-3 * min(1.0, i / 40) for i in range(400)])  # warm-up, then constant
    assert not found([1e-3 * min(1.0, i / 300) for i in range(400)])  # a long warm-up that ended
    assert not found(_one_cycle(1e-3, 400))
    assert not found([1e-3 * (0.2 + 0.8 * abs((i % 100) - 50) / 50) for i in range(400)])  # triangular cycles


def test_occasional_clipping_is_fine_constant_tiny_clipping_is_not():
    assert "NNDX308" not in _found(healthy_reports()["occasional_clipping"])
    tight = with_loop(BASE, grad_norm_history=[GradNormPoint(step=i, before_clip=2.0, after_clip=0.05) for i in range(40)])
    assert "NNDX308" in _found(tight)


def test_a_clip_cutting_through_a_divergence_is_context():
    """An LR far too high: the norm grows a hundredfold and any clip cuts it. The same clip
    cutting from the first step on a loss that does not blow up is the cause."""
    from .reports import points

    tight = [GradNormPoint(step=i, before_clip=2.0, after_clip=0.05) for i in range(40)]
    assert _found(with_loop(BASE, grad_norm_history=tight))["NNDX308"].severity == "warning"
    growing = [GradNormPoint(step=i, before_clip=0.4 * 1.2**i, after_clip=min(0.5, 0.4 * 1.2**i)) for i in range(40)]
    assert _found(with_loop(BASE, grad_norm_history=growing))["NNDX308"].severity == "info"
    blown = with_loop(BASE, grad_norm_history=tight).model_copy(update={"loss_history": {"train": points(
        [2.3] + [700.0 - i for i in range(39)])}})  # fmt: skip
    assert _found(blown)["NNDX308"].severity == "info"


@pytest.mark.parametrize(("optimizers", "after", "severity"), [
    (["AdamW"], 0.05, "info"), (["Adam", "RMSprop"], 0.05, "info"), (["SGD"], 0.05, "warning"),
    (["Adam", "SGD"], 0.05, "warning"), (["Adam"], 1e-8, "warning"), (None, 0.05, "warning")])
def test_a_clip_under_an_adaptive_optimizer_is_context(optimizers, after, severity):
    """Adam divides the clipped gradient by its own running scale: the step keeps its size
    (ELECTRA's clip at 1.0 under AdamW, a healthy run). SGD's step, or Adam's once the clipped
    entries near eps, shrinks with the clip."""
    tight = [GradNormPoint(step=i, before_clip=2.0, after_clip=after) for i in range(40)]
    found = _found(with_loop(BASE, grad_norm_history=tight, optimizers=optimizers))["NNDX308"]
    assert found.severity == severity


def test_grad_check_on_a_nan_model_is_no_evidence_of_a_broken_backward():
    nan_check = GradCheckResult(status="failed", max_relative_error=math.inf, parameters=[GradCheckParam(name="0.weight", relative_error=math.nan, status="bug")])
    assert "NNDX604" not in _found(BASE.model_copy(update={"probes": healthy_probes(grad_check=nan_check)}))


def test_units_that_died_in_training_are_explained_by_the_big_updates():
    from .reports import mlp_params

    # at lr 1, far above where the LR range test trains well (its suggestion 3e-3, divergence 0.3)
    died = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[1.0]) for i in range(0, 101, 10)]).model_copy(
        update={"layers": mlp_layers(steps=(0, 50), dead=0.0) + mlp_layers(steps=(100,), dead=1.0), "parameters": mlp_params(ratio=0.5)}
    )
    found = _found(died)
    assert "NNDX201" not in found
    assert found["NNDX208"].explained_by == "NNDX205"
    # at an LR the range test trains well at, the big updates refute no LR and root nothing
    within = with_loop(died, lr_history=[LRPoint(step=i, lrs=[1e-3]) for i in range(0, 101, 10)])
    assert _found(within)["NNDX205"].refuted and _found(within)["NNDX208"].explained_by is None


def test_probe_statistics_stamped_step_0_do_not_hide_the_monitors_step_0():
    # merged report: the probe's end-of-training hook stats (dead) first, then the Monitor's
    probe_stats = mlp_layers(steps=(0,), dead=1.0)
    monitor_stats = mlp_layers(steps=(0, 50), dead=0.0) + mlp_layers(steps=(100,), dead=1.0)
    found = _found(BASE.model_copy(update={"layers": probe_stats + monitor_stats}))
    assert "NNDX208" in found and "NNDX201" not in found


def test_bottleneck_width_comes_from_the_weight_shapes():
    from nndx.report import ParameterStats

    from .reports import flat, points

    narrow = [
        ParameterStats(name="0.weight", shape=[1, 2], weight_norm=1.0),
        ParameterStats(name="2.weight", shape=[3, 1], weight_norm=1.0),
    ]
    stalled = {"train": points(flat(5, level=1.0))}
    report = BASE.model_copy(update={"num_classes": 3, "parameters": narrow, "loss_history": stalled})
    assert _found(report)["NNDX403"].evidence["width"] == 1
    # a Monitor's report declares neither task nor class count: the loss calls and data checks say them
    undeclared = report.model_copy(update={"task": None, "num_classes": None})
    assert undeclared.loop.loss_calls and _found(undeclared)["NNDX403"].evidence["num_classes"] == 10
    assert "NNDX403" not in _found(BASE)  # 64-unit hidden layers for 10 classes
    # an 8-channel convolution before a 10-class head holds 8 feature maps, not 8 features
    conv = [
        ParameterStats(name="conv.weight", shape=[8, 1, 3, 3], weight_norm=1.0),
        ParameterStats(name="head.weight", shape=[10, 128], weight_norm=1.0),
    ]
    convnet = BASE.model_copy(update={"num_classes": 10, "parameters": conv, "loss_history": stalled})
    assert "NNDX403" not in _found(convnet)
    # BERT's token-type table has 2 rows of 64 features: its width is 64, not 2
    from nndx.report import LayerInfo

    tables = [
        ParameterStats(name="embeddings.word.weight", shape=[30, 64], weight_norm=1.0),
        ParameterStats(name="embeddings.token_type.weight", shape=[2, 64], weight_norm=1.0),
        ParameterStats(name="head.weight", shape=[11, 64], weight_norm=1.0),
    ]
    layers = [LayerInfo(name="embeddings.word", type="Embedding"), LayerInfo(name="embeddings.token_type",
              type="Embedding"), LayerInfo(name="head", type="Linear")]  # fmt: skip
    bert = BASE.model_copy(update={"num_classes": 11, "parameters": tables, "loss_history": stalled,
                                   "model": BASE.model.model_copy(update={"layers": layers})})  # fmt: skip
    assert "NNDX403" not in _found(bert)


def test_grad_check_small_bug_is_an_error_but_unresolved_kinks_are_not():
    # the probe re-measures kink crossings itself: what it still calls a bug is one (a 1%-scaled backward)
    scaled = GradCheckResult(status="failed", max_relative_error=0.012, parameters=[GradCheckParam(name="0.bias", relative_error=0.012, status="bug")])
    finding = _found(BASE.model_copy(update={"probes": healthy_probes(grad_check=scaled)}))["NNDX604"]
    assert finding.severity == "error"
    kinks = GradCheckResult(status="failed", max_relative_error=0.012, parameters=[GradCheckParam(name="0.bias", relative_error=0.012, status="suspect")])
    assert "NNDX604" not in _found(BASE.model_copy(update={"probes": healthy_probes(grad_check=kinks)}))


def test_a_backward_off_by_a_tenth_of_a_percent_is_no_error():
    """RWKV's L2Wrap adds 1e-4 x the max logit to the logits' gradient on purpose: the check
    measures 0.15% off in two tensors while the run learns (3.1 -> 0.9). Every gradient 99%
    right is a note when the run learned, a warning when it did not; 1.2% off stays an error."""
    from .reports import flat, points

    def severity(error: float, learned: bool = True) -> str | None:
        check = GradCheckResult(status="failed", max_relative_error=error,
                                parameters=[GradCheckParam(name="head.weight", relative_error=error, status="bug")])
        report = BASE.model_copy(update={"probes": healthy_probes(grad_check=check)})
        if not learned:
            report = report.model_copy(update={"loss_history": {"train": points(flat(0, level=3.0))}})
        return _found(report)["NNDX604"].severity

    assert severity(0.0015) == "info"
    assert severity(0.0015, learned=False) == "warning"
    assert severity(0.012) == "error"


def test_steps_without_gradient_do_not_hide_huge_updates():
    from .reports import mlp_params

    huge = mlp_params(steps=(0, 5), ratio=0.9)
    no_gradient = [p.model_copy(update={"update_ratio": 0.0}) for p in mlp_params(steps=(10, 15, 20, 25, 30))]
    assert "NNDX205" in _found(BASE.model_copy(update={"parameters": huge + no_gradient}))


def test_steps_after_the_weights_went_nan_are_no_evidence_of_the_step_size():
    """MorvanZhou's GAN with the discriminator's Adam over the generator's parameters: the
    generator's steps were ~1e-3 of its weights until a log(0) made them NaN at step 1250,
    and every later ratio is NaN. Those say the weights are NaN (the NaN rules' business),
    not that the LR overshot. Ratios that climbed to 5 before the NaN, or NaN from the first
    step, still point at the LR."""
    from .reports import mlp_params

    def nan_after(finite: list[float]) -> list:
        before = [p for i, ratio in enumerate(finite) for p in mlp_params(steps=(i * 10,), ratio=ratio)]
        after = [p.model_copy(update={"update_ratio": math.nan, "weight_norm": math.nan})
                 for p in mlp_params(steps=tuple(range(len(finite) * 10, 400, 10)))]  # fmt: skip
        return before + after

    assert "NNDX205" not in _found(BASE.model_copy(update={"parameters": nan_after([1.2e-3] * 12)}))
    assert _found(BASE.model_copy(update={"parameters": nan_after([1e-3, 0.05, 0.5, 5.0])}))["NNDX205"]
    assert "NNDX205" in _found(BASE.model_copy(update={"parameters": nan_after([])}))


def test_a_converged_model_with_tiny_gradients_everywhere_is_not_vanishing():
    from .reports import grad

    tiny = [layer.model_copy(update={"gradient": grad(2e-7, abs_mean=5e-9)}) for layer in mlp_layers()]
    assert "NNDX203" not in _found(BASE.model_copy(update={"layers": tiny}))


def test_parallel_attention_projections_are_not_stacked_linears():
    from nndx.report import LayerInfo

    names = ["enc.attn.query", "enc.attn.key", "enc.attn.value", "enc.attn.dropout", "enc.out.dense", "enc.act", "head"]
    types = ["Linear", "Linear", "Linear", "Dropout", "Linear", "GELUActivation", "Linear"]
    attention = mlp_model(layers=[LayerInfo(name=n, type=t) for n, t in zip(names, types)], activations=["Tanh"])
    assert "NNDX401" not in _found(BASE.model_copy(update={"model": attention}))
    stacked = mlp_model(layers=[LayerInfo(name="net.0", type="Linear"), LayerInfo(name="net.1", type="Linear")])
    assert "NNDX401" in _found(BASE.model_copy(update={"model": stacked}))


def test_an_lr_that_kills_the_network_early_is_the_root_even_when_later_updates_are_tiny():
    from .broken import network_killed_by_lr

    diagnosis = diagnose(network_killed_by_lr())
    top = diagnosis.top()
    assert top.rule_id == "NNDX205" and top.code.value == "LR_TOO_HIGH"
    assert top.severity == "error"
    assert "NNDX206" not in {f.rule_id for f in diagnosis.findings}  # no 'LR too low' from the dead tail


def test_huge_updates_from_targets_of_a_large_scale_fold_under_the_targets():
    """A plain-SGD regression on targets in the thousands: the updates blow up (ratio 3)
    at the loop's LR. The targets are the root, the LR reading a symptom of them; the same
    updates with targets of unit scale stay an LR finding."""
    from nndx.report import LossCall

    from .broken import network_killed_by_lr

    killed = network_killed_by_lr().model_copy(update={"task": "regression", "data": None})
    call = LossCall(loss_type="MSELoss", output_shape=[32, 1], target_shape=[32, 1], target_dtype="float32",
                    target_mean=5000.0, target_std=999.0)  # fmt: skip
    huge = diagnose(with_loop(killed, loss_calls=[call]))
    assert huge.top().rule_id == "NNDX506"
    assert next(f for f in huge.findings if f.rule_id == "NNDX205").explained_by == "NNDX506"
    unit = call.model_copy(update={"target_mean": 0.1, "target_std": 1.0})
    assert diagnose(with_loop(killed, loss_calls=[unit])).top().rule_id == "NNDX205"


def test_targets_of_a_large_scale_that_the_run_fit_beyond_their_mean_are_context():
    """d2l's house prices: a linear model on raw prices (mean 1.7e5) under MSE, with Adam at lr 5, a
    step sized for them. Its train loss fell to 4.5% of its start, far under the 15% that predicting
    the mean alone reaches (std^2 / (mean^2 + std^2), from outputs starting near 0): the scale did
    not stop it learning. A run stuck at the mean keeps the warning."""
    from nndx.report import LossCall

    from .reports import noisy_decreasing

    call = LossCall(loss_type="MSELoss", output_shape=[64, 1], target_shape=[64, 1], target_dtype="float32",
                    target_mean=1.74e5, target_std=7.28e4, output_min=-1e4, output_max=4e5)  # fmt: skip
    regression = BASE.model_copy(update={"task": "regression", "data": None, "num_classes": None})

    def finding(end_share: float):
        curve = noisy_decreasing(0, start=3.6e10, end=end_share * 3.6e10, noise=0.02)
        report = with_loop(regression, loss_calls=[call]).model_copy(update={"loss_history": {"train": points(curve)}})
        return _found(report).get("NNDX506")

    fit = finding(0.045)
    assert fit.severity == "info" and fit.refuted, fit
    stuck = finding(0.16)
    assert stuck.severity == "warning" and not stuck.refuted, stuck


def test_pixels_in_0_255_against_outputs_squashed_into_0_1_through_a_loss_of_the_users_own():
    """NeRF's img2mse is a lambda: no loss nndx names. Its float outputs and targets of one shape
    are a regression's; targets 9..255 that no output (sigmoid colours, 0.43..1) ever came near
    are the root of a loss that climbs, not the LR."""
    from nndx.report import LossCall

    call = LossCall(loss_type="<lambda>", output_shape=[128, 3], target_shape=[128, 3], target_dtype="float32",
                    output_min=0.43, output_max=1.0, target_mean=214.0, target_std=84.0, target_min=9.0,
                    target_max=255.0, measured_batches=46)  # fmt: skip
    regression = BASE.model_copy(update={"task": "regression", "data": None, "num_classes": None})
    found = {f.rule_id: f for f in diagnose(with_loop(regression, loss_calls=[call])).findings}
    assert found["NNDX506"].severity == "error" and "no output reached" in found["NNDX506"].symptom
    scaled = call.model_copy(update={"target_mean": 0.84, "target_std": 0.33, "target_min": 0.035, "target_max": 1.0})
    assert "NNDX506" not in _found(with_loop(regression, loss_calls=[scaled]))
    # the same targets into outputs that reach them through a loss of the user's own, which may scale both
    # itself (fast neural style's images in 0..255, normalised inside the loss): no claim; into MSELoss, a warning
    reaching = call.model_copy(update={"output_min": -3.0, "output_max": 240.0})
    assert "NNDX506" not in _found(with_loop(regression, loss_calls=[reaching]))
    named = reaching.model_copy(update={"loss_type": "MSELoss"})
    assert _found(with_loop(regression, loss_calls=[named]))["NNDX506"].severity == "warning"
    # class ids into a loss of the user's own on logits of another shape are no regression targets
    logits = call.model_copy(update={"output_shape": [128, 256], "target_shape": [128]})
    assert "NNDX506" not in _found(with_loop(regression, loss_calls=[logits]))


def test_large_update_ratios_with_a_falling_loss_are_context_not_an_alarm():
    diagnosis = diagnose(healthy_reports()["adam_large_ratio"])
    assert diagnosis.healthy
    assert {f.rule_id: f.severity for f in diagnosis.findings} == {"NNDX205": "info"}


def test_large_update_ratios_before_training_are_context_when_the_users_setup_fits_the_batch():
    """The preflight: no loss from the loop yet, one probe step of the user's Adam at lr 0.02 on an
    RNN's small weights (ratio 0.19). The interventions' baseline, a copy trained with the user's
    optimizer at the user's LR, fitted the batch to 2e-5 of its start: the steps are large and converge,
    no alarm. With nndx's own Adam, or a baseline that did not fit, the ratio stays a warning."""
    from nndx.report import Interventions

    from .reports import mlp_params

    def severity(final, optimizer="user"):
        report = DiagnosticReport(parameters=mlp_params(steps=(0,), ratio=0.19), interventions=Interventions(
            steps=100, baseline_initial_loss=0.54, baseline_final_loss=final, optimizer=optimizer))
        return _found(report)["NNDX205"].severity

    assert severity(1.2e-5) == "info"
    assert severity(0.3) == "warning"
    assert severity(1.2e-5, optimizer="default") == "warning"
    assert severity(float("nan")) == "warning"


def test_a_symptom_never_outranks_a_cause_with_direct_evidence():
    from nndx.report import OverfitResult

    from .reports import act

    failed = OverfitResult(status="failed", task="classification", steps=200, initial_loss=2.3, final_loss=2.2)
    dead = [l.model_copy(update={"activation": act(dead=0.6, zero=0.8)}) if l.type == "ReLU" else l for l in mlp_layers()]
    report = BASE.model_copy(update={"layers": dead, "probes": healthy_probes(overfit_one_batch=failed)})
    diagnosis = diagnose(report)
    assert diagnosis.top().code.value == "DEAD_RELU"
    overfit = next(f for f in diagnosis.findings if f.rule_id == "NNDX601")
    assert overfit.explained_by == diagnosis.top().rule_id
    assert "NNDX601" in diagnosis.top().explains


def test_unnormalized_inputs_fire_on_wild_tabular_scales_not_on_tokens_or_unit_pixels():
    from .reports import healthy_data, healthy_split

    def with_train(**split):
        return BASE.model_copy(update={"data": healthy_data(train=healthy_split(**split))})

    tabular = with_train(input_shape=[3], input_mean=2e4, input_std=3e4, input_min=0.1, input_max=9e4, feature_scale_ratio=2e5)
    assert _found(tabular)["NNDX505"].severity == "error"  # no LR suits inputs of this scale
    pixels_0_255 = with_train(input_mean=33.0, input_std=70.0, input_min=0.0, input_max=255.0, raw_range="0-255")
    assert _found(pixels_0_255)["NNDX505"].severity == "warning"
    # flattened [0, 1] images: border pixels are near-constant, so per-pixel stds differ 1000x
    pixels = with_train(input_mean=0.13, input_std=0.3, input_min=0.0, input_max=1.0, feature_scale_ratio=1500.0)
    assert "NNDX505" not in _found(pixels)
    # a character-level language model: inputs are token ids 0..64
    tokens = with_train(input_shape=[64], input_dtype="torch.int64", input_mean=31.0, input_std=18.0,
                        input_min=0.0, input_max=64.0, raw_range="0-64", feature_scale_ratio=1.0)  # fmt: skip
    assert "NNDX505" not in _found(tokens)
    # the same values as floats are raw, unnormalised features
    assert "NNDX505" in _found(with_train(input_dtype="torch.float32", input_mean=31.0, input_std=18.0, raw_range="0-64"))


def test_unnormalized_inputs_seen_in_the_probes_batch_alone_are_weaker_evidence():
    """Without data= the scale comes from the probes' one batch: raw pixels stay a warning, but a
    large or uneven scale (N-BEATS's raw series, its zero-padded positions) in a run whose loss
    learned is context; the same numbers from the data checks, or before any training, warn."""
    from nndx.report import DataStats

    from .reports import healthy_data, healthy_split

    series = {"input_shape": [18], "input_mean": 47.0, "input_std": 55.0, "input_min": 0.0, "input_max": 300.0,
              "feature_scale_ratio": 554.0}
    batch = BASE.model_copy(update={"data": DataStats(batch=healthy_split(n=128, **series))})
    assert _found(batch)["NNDX505"].severity == "info"
    assert "batch" in _found(batch)["NNDX505"].symptom
    assert _found(batch.model_copy(update={"loss_history": {}}))["NNDX505"].severity == "warning"
    checked = BASE.model_copy(update={"data": healthy_data(train=healthy_split(**series))})
    assert _found(checked)["NNDX505"].severity == "warning"
    frames = DataStats(batch=healthy_split(n=32, input_mean=0.6, input_std=11.0, input_min=0.0, input_max=255.0,
                                           raw_range="0-255"))
    assert _found(BASE.model_copy(update={"data": frames}))["NNDX505"].severity == "warning"


def test_a_negative_loss_is_wrong_only_for_losses_that_cannot_be_negative():
    from nndx.report import LossCall

    from .reports import points

    dips = [0.5 * 0.9**i for i in range(40)] + [-0.02] * 10  # a cross-entropy that went below 0
    ce = LossCall(loss_type="CrossEntropyLoss", output_shape=[32, 10], target_shape=[32], target_dtype="int64")
    found = _found(with_loop(BASE, loss_calls=[ce]).model_copy(update={"loss_history": {"train": points(dips)}}))
    assert found["NNDX111"].code.value == "WRONG_LOSS"
    # a Gaussian-likelihood VAE's loss is negative and settles: healthy
    settles = [50.0 * math.exp(-i / 10) - 30.0 for i in range(80)]
    vae = with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {"train": points(settles)}})
    assert "NNDX111" not in _found(vae)
    # a healthy cross-entropy that converges to ~0 with float noise below it
    converged = [2.3 * math.exp(-i / 5) - 1e-9 for i in range(80)]
    assert "NNDX111" not in _found(with_loop(BASE, loss_calls=[ce]).model_copy(update={"loss_history": {"train": points(converged)}}))
    # a log-likelihood maximised as a loss by hand (no torch loss seen): -2.8 at the start, -76 and falling
    maximised = [-2.8 - 0.8 * i for i in range(100)]
    assert "NNDX111" in _found(with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {"train": points(maximised)}}))
    # only 8x below its start, but not slowing down: no floor ahead (a settling loss slows)
    steady = [-2.4 - 0.2 * i for i in range(100)]
    assert "NNDX111" in _found(with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {"train": points(steady)}}))
    slowing = [-2.4 - 20.0 * (1 - math.exp(-i / 15)) for i in range(100)]
    assert "NNDX111" not in _found(with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {"train": points(slowing)}}))


def test_a_generator_loss_that_falls_through_its_critic_is_the_critics_growth_not_a_sign_error():
    """StarGAN's generator loss, -mean D(fake), runs through the critic: when the critic's
    gradient penalty is cut from its graph, its outputs grow without bound and the generator's
    loss falls 8.5 -> -150 with them. Nothing is wrong with the generator's loss; the same fall
    in a loss of the model's own is a sign error."""
    from .reports import points

    falling = [8.5 - 1.6 * i for i in range(100)]
    alone = with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {"train": points(falling)}})
    assert _found(alone)["NNDX111"].severity == "error"
    through = with_loop(BASE, loss_calls=[], logged_loss_through_other_models=True).model_copy(
        update={"loss_history": {"train": points(falling)}})
    found = _found(through)["NNDX111"]
    assert found.severity == "info" and "another trained network" in found.symptom


def test_a_loss_without_bound_is_seen_in_the_overfit_probe_alone():
    from nndx.report import OverfitResult

    def preflight(losses: list[float]):
        probe = OverfitResult(status="skipped", steps=len(losses), losses=losses, initial_loss=losses[0])
        report = with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {}})
        return _found(report.model_copy(update={"probes": report.probes.model_copy(update={"overfit_one_batch": probe})}))

    # a log-likelihood maximised by hand: -1.4 on one batch, then -3e6 after 300 steps and still falling
    found = preflight([-1.4 * 1.05**i for i in range(300)])
    assert found["NNDX111"].evidence["curve"] == "overfit-one-batch loss"
    # a Gaussian NLL whose variance shrinks on one batch falls to -9 and keeps falling: bounded in practice
    assert "NNDX111" not in preflight([1.4 - 0.035 * i for i in range(300)])


def test_a_probe_loss_without_bound_beside_a_bounded_run_is_context():
    """A WGAN critic: the loop adds a gradient penalty that bounds its loss, but the loss
    the probes can be given is the Wasserstein term alone, which one batch drives to -1e7.
    The same probe curve with the run's own loss falling without bound stays an error."""
    from nndx.report import OverfitResult

    from .reports import points

    def after_training(train: list[float]):
        probe = OverfitResult(status="passed", steps=300, losses=[-0.1 * 1.06**i for i in range(300)], initial_loss=-0.1)
        report = with_loop(BASE, loss_calls=[]).model_copy(update={"loss_history": {"train": points(train)}})
        return _found(report.model_copy(update={"probes": report.probes.model_copy(update={"overfit_one_batch": probe})}))

    bounded = after_training([2.0 * math.exp(-i / 40) + 0.1 * (i % 3) for i in range(200)])
    assert bounded["NNDX111"].severity == "info" and "gradient penalty" in bounded["NNDX111"].symptom
    falling = after_training([-0.1 - 0.5 * i for i in range(200)])
    assert falling["NNDX111"].severity == "error" and falling["NNDX111"].evidence["curve"] == "train loss"


def test_squashed_logits_are_seen_from_their_values_whatever_produced_them():
    from nndx.report import LossCall

    def found(**fields):
        call = LossCall(loss_type="CrossEntropyLoss", output_shape=[64, 10], target_shape=[64], target_dtype="int64", **fields)
        return _found(with_loop(BASE, loss_calls=[call]))

    relu = found(output_min=0.0, output_max=3.2, output_zero_fraction=0.55)
    assert relu["NNDX402"].code.value == "WRONG_OUTPUT_ACTIVATION"
    sigmoid = found(output_min=0.02, output_max=0.98, output_rows_sum_to_one=False, output_zero_fraction=0.0)
    assert "NNDX402" in sigmoid
    softmax = found(output_min=0.0, output_max=0.9, output_rows_sum_to_one=True, output_zero_fraction=0.0)
    assert "NNDX402" not in softmax and "NNDX314" in softmax
    # healthy logits: signed, few exact zeros
    healthy = found(output_min=-4.1, output_max=5.3, output_rows_sum_to_one=False, output_zero_fraction=0.0)
    assert "NNDX402" not in healthy and "NNDX314" not in healthy
    bce = LossCall(loss_type="BCEWithLogitsLoss", output_shape=[64, 1], target_shape=[64, 1], target_dtype="float32",
                   output_min=0.03, output_max=0.97)  # fmt: skip
    assert "NNDX314" in _found(with_loop(BASE, loss_calls=[bce]))
    # small logits of a model whose observed forward ends in a plain Linear (no sigmoid): early training
    observed = BASE.model_copy(update={"model": BASE.model.model_copy(update={"forward_observed": True, "output_activation": None})})
    small = bce.model_copy(update={"output_min": 0.06, "output_max": 0.26})
    assert "NNDX314" not in _found(with_loop(observed, loss_calls=[small]))
    sigmoid = observed.model_copy(update={"model": observed.model.model_copy(update={"output_activation": "Sigmoid"})})
    assert "NNDX314" in _found(with_loop(sigmoid, loss_calls=[small]))
    # a ReLU on the logits keeps them in [0, 1] at first too: the wrong output activation, not a second sigmoid
    relu_out = observed.model_copy(update={"model": observed.model.model_copy(update={"output_activation": "ReLU"})})
    assert "NNDX314" not in _found(with_loop(relu_out, loss_calls=[small]))


def test_bce_targets_outside_zero_one_are_a_label_encoding_bug_and_soft_labels_are_not():
    from nndx.report import LossCall

    def found(low, high):
        call = LossCall(loss_type="BCEWithLogitsLoss", output_shape=[64, 1], target_shape=[64, 1], target_dtype="float32",
                        output_min=-3.0, output_max=4.0, target_mean=(low + high) / 2, target_std=0.5,
                        target_min=low, target_max=high)  # fmt: skip
        return _found(with_loop(BASE, loss_calls=[call]))

    assert found(-1.0, 1.0)["NNDX313"].code.value == "LABEL_DTYPE"  # -1/+1 labels
    assert "NNDX313" in found(0.0, 2.0)  # one label per sample (a class index): an encoding, not a scale
    assert "NNDX313" not in found(0.0, 1.0)  # hard labels
    assert "NNDX313" not in found(0.05, 0.95)  # label smoothing


def test_large_regression_targets_are_seen_at_the_loss_without_data_checks():
    from nndx.report import LossCall

    call = LossCall(loss_type="MSELoss", output_shape=[32, 1], target_shape=[32, 1], target_dtype="float32",
                    target_mean=2.4e5, target_std=9e4)  # fmt: skip
    report = with_loop(BASE, loss_calls=[call]).model_copy(update={"task": "regression", "data": None})
    assert "NNDX506" in _found(report)
    small = call.model_copy(update={"target_mean": 0.1, "target_std": 1.1})
    assert "NNDX506" not in _found(with_loop(BASE, loss_calls=[small]).model_copy(update={"task": "regression", "data": None}))


def test_large_targets_into_a_bounded_gradient_loss_are_context_not_an_alarm():
    """The PyTorch regression example: targets of std 35 into smooth_l1_loss, trained well
    at lr 0.1. Each sample's gradient is at most 1 there, so the scale only slows the fit:
    info, whatever the run did. The same targets into MSE stay a warning where the run did not fit
    them (its loss no lower than predicting their mean leaves)."""
    from nndx.report import LossCall

    from .reports import noisy_decreasing

    def severity(loss_type, end_share=0.13):
        call = LossCall(loss_type=loss_type, output_shape=[32, 1], target_shape=[32, 1], target_dtype="float32",
                        target_mean=3.0, target_std=35.2)  # fmt: skip
        curve = noisy_decreasing(1, start=1250.0, end=end_share * 1250.0, noise=0.02)
        report = with_loop(BASE, loss_calls=[call]).model_copy(update={"task": "regression", "data": None,
                                                                        "loss_history": {"train": points(curve)}})
        return next(f.severity for f in diagnose(report).findings if f.rule_id == "NNDX506")

    assert severity("SmoothL1Loss", 0.9) == "info" and severity("HuberLoss", 0.9) == "info"
    assert severity("L1Loss", 0.9) == "info"
    assert severity("MSELoss", 0.9) == "warning"
    assert severity("MSELoss", 0.13) == "info"  # fit well under the mean's 0.99


def test_a_gradscaler_unscaling_before_healthy_clipping_is_not_clipping_too_small():
    scale = 65536.0
    history = []
    for i in range(60):
        true_norm = 0.6 if i % 7 else 2.5  # clip at 1.0 bites on the occasional spike
        after = min(true_norm, 1.0)
        history.append(GradNormPoint(step=i, before_clip=true_norm * scale, after_clip=after))
    assert "NNDX308" not in _found(with_loop(BASE, grad_norm_history=history))
    # the same scaler with a clip threshold far below every gradient norm
    tight = [GradNormPoint(step=i, before_clip=(0.6 if i % 9 else 0.0001) * scale, after_clip=min(0.6 if i % 9 else 0.0001, 1e-3))
             for i in range(60)]  # fmt: skip
    assert "NNDX308" in _found(with_loop(BASE, grad_norm_history=tight))


def test_units_silent_on_one_batch_of_a_network_that_learns_are_context():
    # a OneCycle run at max_lr 0.5 reaches 97% validation accuracy with 60% of a layer's
    # units silent on a 32-sample batch: sparse, not a failure
    sparse = BASE.model_copy(update={"layers": mlp_layers(steps=(0, 50), dead=0.05) + mlp_layers(steps=(100,), dead=0.6)})
    found = _found(sparse)
    assert found["NNDX208"].severity == "info"
    from .broken import units_died

    assert _found(units_died())["NNDX208"].severity in ("warning", "error")


def test_a_warmup_is_judged_at_the_lr_it_reaches_not_at_its_first_step():
    from nndx.report import LRRangeResult

    lr_range = LRRangeResult(status="passed", lrs=[1e-5, 1e-1], losses=[2.3, 2.0], suggested_lr=1e-3, min_over_10_lr=2e-3)
    warmup = [LRPoint(step=i, lrs=[1e-3 * min(1.0, (i + 1) / 50)]) for i in range(200)]  # 2e-5 -> 1e-3
    report = with_loop(BASE, lr_history=warmup).model_copy(update={"probes": healthy_probes(lr_range=lr_range)})
    assert "NNDX603" not in _found(report)
    stuck_low = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[1e-6]) for i in range(200)])
    assert "NNDX603" in _found(stuck_low.model_copy(update={"probes": healthy_probes(lr_range=lr_range)}))


def test_a_sweep_whose_loss_has_no_floor_reads_no_lr_for_the_lr_rules():
    from nndx.report import LRRangeResult

    # a WGAN critic's loss falls without end on the sweep's batch (to -8e11 at lr 10): the
    # minimum is where the sweep stopped, and its lr / 10 is no LR to train at
    lrs = [10 ** (-7 + i * 8 / 99) for i in range(100)]
    floorless = LRRangeResult(status="passed", lrs=lrs, losses=[0.04 - 1.1**i for i in range(100)],
                              min_loss=-7.9e11, min_over_10_lr=1.0, valley_lr=7.6e-4)  # fmt: skip
    critic = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[2e-4]) for i in range(200)])
    stuck = critic.model_copy(update={"loss_history": {"train": points(flat(0, n=40, level=0.5), every=5)}})
    assert "NNDX603" not in _found(stuck.model_copy(update={"probes": healthy_probes(lr_range=floorless)}))
    # the same reading from a loss that stayed above zero is one
    floored = floorless.model_copy(update={"losses": [2.3 - 0.02 * i for i in range(100)], "min_loss": 0.3})
    assert "NNDX603" in _found(stuck.model_copy(update={"probes": healthy_probes(lr_range=floored)}))


def test_a_failed_overfit_warns_when_the_model_barely_learns_and_is_context_when_it_nearly_fits():
    from nndx.report import OverfitResult

    def overfit(**fields):
        result = OverfitResult(status="failed", task="classification", steps=300, **fields)
        return {f.rule_id: f.severity for f in diagnose(BASE.model_copy(update={"probes": healthy_probes(overfit_one_batch=result)})).findings}

    assert overfit(initial_loss=2.3, final_loss=1.5)["NNDX601"] == "warning"  # fell by a third: barely learns
    assert overfit(initial_loss=2.7, final_loss=0.05, final_accuracy=0.97)["NNDX601"] == "info"  # ambiguous targets
    # a VAE: 45 → 23 is half-way to zero, but a third of the way above its floor of 13.6 (the pixels' entropy)
    assert overfit(initial_loss=44.8, final_loss=23.2)["NNDX601"] == "warning"
    assert overfit(initial_loss=44.8, final_loss=23.2, loss_floor=13.6)["NNDX601"] == "info"
    # a loss that swings from step to step (a VQ-VAE's codes switching) is judged by the lowest value it reached
    swinging = [1.4, 1.9, 1.07, 0.85, 0.63, 0.56, 0.54, 1.75, 1.22, 0.52, 0.89, 1.84, 0.57, 0.92, 1.09, 1.16]
    assert overfit(initial_loss=1.4, final_loss=1.16, losses=swinging)["NNDX601"] == "info"
    assert overfit(initial_loss=1.4, final_loss=1.16, losses=[1.4, 1.3, 1.25, 1.2, 1.16])["NNDX601"] == "warning"


def test_a_discriminator_that_cannot_separate_a_trained_generators_samples_from_the_data_is_context():
    """d2l's GAN after training: the discriminator's probe batch stacks real points and its trained
    generator's, which now overlap: 11.09 -> 9.60 in 300 steps (sum over 16). A batch whose labels its
    inputs barely tell apart is the generator's success, not a broken loss. A model no other watched model
    feeds (the same curve) still warns."""
    from nndx.report import OverfitResult

    from .broken import fed_input

    failed = OverfitResult(status="failed", task="classification", steps=300, initial_loss=11.09, final_loss=9.60)
    plain = BASE.model_copy(update={"probes": healthy_probes(overfit_one_batch=failed)})
    discriminator = with_loop(plain, fed_inputs=[fed_input(-5.7, 10.5, -4.1, 10.3)])
    found = _found(discriminator)["NNDX601"]
    assert found.severity == "info" and "another watched model" in found.symptom
    assert _found(plain)["NNDX601"].severity == "warning"


def test_a_view_that_mixes_positions_explains_the_future_it_lets_them_see():
    """d2l's transformer with transpose_output reshaping heads back without a permute (blind round 38):
    the causality probe sees later tokens move earlier outputs, and NNDX404 sees the interleaving view.
    The view is the cause; the leak, alone, is still DATA_LEAKAGE."""
    from nndx.report import CausalityResult

    from .broken import interleaved_axes

    leak = CausalityResult(status="failed", future_visible=True, time_axis=1, samples=8, positions=12,
                           scored_positions=96, cut=5, changed_positions=6, max_change=6.5, tolerance=1e-5)
    both = interleaved_axes().model_copy(update={"probes": healthy_probes(causality=leak)})
    diagnosis = diagnose(both)
    assert diagnosis.top().rule_id == "NNDX404" and "NNDX614" in diagnosis.top().explains
    alone = BASE.model_copy(update={"probes": healthy_probes(causality=leak)})
    assert diagnose(alone).top().rule_id == "NNDX614"


def test_an_exception_only_the_probe_raised_beside_a_loop_that_trained_is_the_probes_call():
    """persson's DCGAN: nndx.probe(disc, batch, BCELoss()) on the discriminator's raw (N, 1, 1, 1) output raises
    a size mismatch; the loop reshapes to (N,) first and trained 144 steps with finite losses. The probe's
    call differs from the loop's, the training does not (info). In a preflight the exception is all there is,
    and an exception the training loop itself raised is still an error."""
    from nndx.report import ErrorRecord

    from .broken import error

    message = "Using a target size (torch.Size([128])) that is different to the input size (torch.Size([128, 1, 1, 1]))"
    preflight = error(message, "ValueError")
    assert _found(preflight)["NNDX705"].severity == "error"
    trained = BASE.model_copy(update={"errors": [ErrorRecord(source="describe", type="ValueError", message=message)]})
    found = _found(trained)["NNDX705"]
    assert found.severity == "info" and "what was handed to nndx.probe" in found.symptom
    raised = BASE.model_copy(update={"errors": [ErrorRecord(source="training", type="ValueError", message=message)]})
    assert _found(raised)["NNDX705"].severity == "error"
    diverged = with_loop(trained, steps=200).model_copy(update={"loss_history": {"train": points([2.3, math.nan] * 10)}})
    assert _found(diverged)["NNDX705"].severity == "error"


def test_a_model_with_fewer_parameters_than_the_batch_has_samples_need_not_memorise_it():
    """Temperature scaling fits one parameter to a classifier's logits: on a batch of 32 its NLL
    falls from 0.144 to 0.082 and can go no further, as no model of fewer parameters than the batch
    has samples memorises it (a calibration scalar, a linear probe on few features). The same curve
    from the 55,050-parameter MLP is a model that cannot learn its batch."""
    from nndx.report import OverfitResult

    failed = OverfitResult(status="failed", task="classification", steps=300, initial_loss=0.144, final_loss=0.082,
                           final_accuracy=0.983)  # fmt: skip

    def nndx601(trainable: int):
        report = BASE.model_copy(update={"probes": healthy_probes(overfit_one_batch=failed),
                                         "model": mlp_model(param_count=trainable, trainable_param_count=trainable)})
        return _found(report)["NNDX601"]

    scalar = nndx601(1)
    assert scalar.severity == "info" and "1 trainable parameter" in scalar.symptom
    assert nndx601(55050).severity == "warning"


def test_a_frozen_pretrained_backbone_whose_loss_starts_fitted_is_context_not_stuck():
    """A backbone trained first, then frozen under a head: the loss starts far below ln(C)
    and barely moves, with minibatch swings large next to so small a level. Not stuck, not
    an LR problem; the same flat curve at ln(C) (frozen layers trained from scratch) is."""
    from .reports import flat, points

    frozen = with_loop(BASE, frozen_params=["body.0.weight", "body.0.bias"])

    def alarms(level: float, noise: float) -> dict[str, str]:
        report = frozen.model_copy(update={"loss_history": {"train": points(flat(4, level=level, noise=noise))}})
        return {f.rule_id: f.severity for f in diagnose(report).findings if f.rule_id in ("NNDX103", "NNDX104", "NNDX305")}

    assert set(alarms(level=0.15, noise=0.3).values()) <= {"info"}  # 0.15 against ln(10) = 2.3
    at_chance = alarms(level=2.3026, noise=0.005)
    assert at_chance.get("NNDX103") in ("warning", "error") and at_chance.get("NNDX305") == "warning"
    # DINO fixes its head's weight-norm gain (requires_grad False): 0.2% of the model cannot be why it is stuck
    gain = frozen.model_copy(update={"model": mlp_model(param_count=55050 + 100, trainable_param_count=55050),
                                     "loss_history": {"train": points(flat(4, level=2.3026, noise=0.005))}})
    assert {f.rule_id: f.severity for f in diagnose(with_loop(gain, frozen_params=["head.weight_g"])).findings
            }.get("NNDX305", "info") == "info"  # fmt: skip


def test_a_head_on_a_frozen_backbone_that_stays_fitted_is_context_and_one_that_climbs_past_chance_is_not():
    """The first batches can be ones the pretrained model memorised (loss 0.08); the head's large
    updates then take the loss to its ordinary level (~0.25, batches up to 1.1) — still far under
    ln(10) = 2.3. Climbing past ln(10) undoes the fit: that is an LR too high."""
    import random

    from .broken import mlp_params
    from .reports import points

    rng = random.Random(0)
    fitted = [0.08] + [0.25 * math.exp(rng.gauss(0, 0.6)) for _ in range(119)]
    climbs = [0.08] + [0.25 + 0.05 * i for i in range(119)]

    def severities(values: list[float]) -> dict[str, str]:
        report = with_loop(BASE, frozen_params=["body.0.weight", "body.0.bias"])
        report = report.model_copy(update={"loss_history": {"train": points(values)}, "parameters": mlp_params(ratio=0.2)})
        return {f.rule_id: f.severity for f in diagnose(report).findings}

    calm = severities(fitted)
    assert max(fitted) < 2.3 and {calm.get(rule) for rule in ("NNDX103", "NNDX104", "NNDX205")} <= {"info", None}
    assert "NNDX205" in calm  # the large updates are still reported, as context
    assert severities(climbs).get("NNDX104") in ("warning", "error")


def test_accumulation_with_large_updates_warns_for_sgd_but_not_for_adam():
    """Adam divides a k-times larger gradient by a k-times larger scale: an undivided
    accumulated loss cannot be why its (always sizeable) updates are large."""
    from .broken import accum_unscaled

    def severity(optimizers, learns: bool = False):
        report = with_loop(accum_unscaled(), optimizers=optimizers)
        if learns:  # the same large updates on a loss that falls as healthy training's does
            report = report.model_copy(update={"loss_history": BASE.loss_history})
        return next(f.severity for f in diagnose(report).findings if f.rule_id == "NNDX302")

    assert severity(["SGD"]) == "warning"
    assert severity(None) == "warning"  # unknown optimizer: the large updates are the evidence
    assert severity(["AdamW"], learns=True) == "info"
    assert severity(["SGD"], learns=True) == "info"  # they did no visible harm (BatchNorm'd weights, say)


def test_a_manual_loop_whose_weights_went_nan_is_not_accumulating():
    """Without an optimizer, steps are counted from weights that change; NaN weights stop
    changing, so 120 backward passes over 6 counted steps are a divergence, not
    accumulation. With an optimizer the same counts are accumulation."""
    from .broken import accum_unscaled
    from .reports import points

    diverged = points([1.4, 1.6, 3.0, 40.0] + [math.nan] * 20)
    manual = with_loop(accum_unscaled(), optimizers=[], steps=6, backward_calls=120, zero_grad_calls=6)
    assert "NNDX302" not in {f.rule_id for f in diagnose(manual.model_copy(update={"loss_history": {"train": diverged}})).findings}
    assert "NNDX302" in {f.rule_id for f in diagnose(manual).findings}  # finite loss: still accumulation


def test_batches_of_one_class_explain_large_updates_and_a_zigzag_loss():
    """Data sorted by label: each batch pulls every weight toward its class. The large
    update ratios and the oscillating loss are its symptoms, not an LR of their own."""
    from .reports import healthy_data, healthy_split, mlp_params, points

    zigzag = [1.8 + (0.5 if i % 2 else -0.5) for i in range(100)]
    report = BASE.model_copy(update={
        "data": healthy_data(train=healthy_split(label_runs_fraction=0.99)),
        "parameters": mlp_params(ratio=0.27),
        "loss_history": {"train": points(zigzag)},
    })  # fmt: skip
    diagnosis = diagnose(report)
    assert diagnosis.top().code.value == "UNSHUFFLED_DATA"
    explained = {f.rule_id for f in diagnosis.findings if f.explained_by == diagnosis.top().rule_id}
    assert {"NNDX205", "NNDX104"} <= explained


def test_classes_missing_from_the_tail_of_an_imbalance_are_imbalance_not_collapsed_labels():
    from .reports import healthy_data, healthy_split

    def top(counts: dict[str, int]) -> str:
        split = healthy_split(n=sum(counts.values()), class_counts=counts, imbalance_ratio=None)
        return diagnose(BASE.model_copy(update={"data": healthy_data(train=split)})).top().code.value

    tail = {"0": 70, "1": 5, "2": 0, "3": 1, "4": 2, "5": 6, "6": 4, "7": 4, "8": 0, "9": 4}
    assert top(tail) == "CLASS_IMBALANCE"
    collapsed = {str(c): (300 if c < 5 else 0) for c in range(10)}  # half the classes mapped away
    assert top(collapsed) == "LABEL_NOISE"


def test_a_closure_optimizer_evaluating_the_loss_many_times_per_step_is_not_accumulating():
    """L-BFGS runs its closure (zero_grad, forward, backward) up to 20 times inside each
    optimizer.step(): 20 backward passes per step, none of them accumulation."""
    from .broken import accum_unscaled

    lbfgs = with_loop(accum_unscaled(), optimizers=["LBFGS"], steps=10, backward_calls=200, zero_grad_calls=200,
                      backward_calls_in_step=200)  # fmt: skip
    assert "NNDX302" not in {f.rule_id for f in diagnose(lbfgs).findings}
    # Lightning with accumulate_grad_batches=4: three backward passes outside the step, one in its closure
    lightning = with_loop(accum_unscaled(), optimizers=["SGD"], steps=10, backward_calls=40, zero_grad_calls=10,
                          backward_calls_in_step=10)  # fmt: skip
    assert "NNDX302" in {f.rule_id for f in diagnose(lightning).findings}


def test_tiny_training_batches_are_seen_beside_large_evaluation_batches():
    """120 loss calls on batches of 2 and 5 evaluation calls on 256 rows: the steps were taken
    on batches of 2. The same loop on batches of 32 is not flagged."""
    from .broken import loss_call, tiny_batch

    def found(train_rows: int) -> set[str]:
        calls = [loss_call(output_shape=[train_rows, 10], target_shape=[train_rows]).model_copy(update={"calls": 120}),
                 loss_call(output_shape=[256, 10], target_shape=[256]).model_copy(update={"calls": 5})]  # fmt: skip
        report = tiny_batch()
        return {f.rule_id for f in diagnose(report.model_copy(update={"loop": report.loop.model_copy(update={"loss_calls": calls})})).findings}

    assert "NNDX311" in found(2)
    assert "NNDX311" not in found(32)


def test_a_model_that_returns_its_own_loss_is_no_batch_of_one():
    """RetinaNet's forward returns its focal and box losses, shape [1] each, and the loss
    function only adds them: the loss call sees a one-value output and no targets. That is
    no batch of one (its BatchNorm made it a warning); outputs of one row with targets are."""
    from .broken import loss_call, tiny_batch

    def found(output_shape: list[int], target_shape: list[int] | None) -> set[str]:
        calls = [loss_call(output_shape=output_shape, target_shape=target_shape).model_copy(update={"calls": 120})]
        report = tiny_batch()
        loop = report.loop.model_copy(update={"loss_calls": calls, "has_batchnorm": True})
        return {f.rule_id for f in diagnose(report.model_copy(update={"loop": loop})).findings}

    assert "NNDX311" not in found([1], None)
    assert "NNDX311" in found([2, 10], [2]) and "NNDX311" in found([2], None)


def test_time_major_batches_are_counted_along_the_axis_that_holds_the_samples():
    """The NTM copy task's outputs are (time, batch, bits): sequences of 1-4 steps of a batch
    of 8. Read along axis 0 that was "batch size 4" and a BATCH_TOO_SMALL warning; the sample-
    independence probe found the samples on axis 1."""
    from nndx.report import Probes, SampleIndependenceResult

    from .broken import loss_call, tiny_batch

    def severity(batch_axis: int | None) -> str | None:
        calls = [loss_call(output_shape=[t, 8, 4], target_shape=[t, 8, 4]).model_copy(update={"calls": 30})
                 for t in (1, 2, 3, 4)]  # fmt: skip
        report = tiny_batch()
        report = report.model_copy(update={"loop": report.loop.model_copy(update={"loss_calls": calls})})
        if batch_axis is not None:
            probe = SampleIndependenceResult(status="passed", batch_axis=batch_axis, samples=8)
            report = report.model_copy(update={"probes": Probes(sample_independence=probe)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX311"), None)

    assert severity(None) == "warning"  # nothing says which axis holds the samples: the first
    assert severity(1) is None
    # a time-major RNN whose head returns (batch, classes): the batch is its first axis again
    calls = [loss_call(output_shape=[2, 10], target_shape=[2]).model_copy(update={"calls": 120})]
    report = tiny_batch()
    report = report.model_copy(update={"loop": report.loop.model_copy(update={"loss_calls": calls}), "probes": Probes(
        sample_independence=SampleIndependenceResult(status="passed", batch_axis=1, samples=2))})
    assert "NNDX311" in {f.rule_id for f in diagnose(report).findings}


def test_a_small_batch_of_dense_targets_is_context_not_an_alarm():
    """The PyTorch super-resolution example trains on batches of 4 images, each a 48x48
    target (9,216 targets a step); its loss swings from image to image. That is context.
    Batches of 4 class labels (or of 4 sequences of 16 tokens) with the same swings warn."""
    from .broken import loss_call, tiny_batch

    def severity(target_shape: list[int]) -> str | None:
        calls = [loss_call(output_shape=[4, *target_shape[1:]] if len(target_shape) > 1 else [4, 10],
                           target_shape=target_shape).model_copy(update={"calls": 120})]  # fmt: skip
        report = tiny_batch()
        report = report.model_copy(update={"loop": report.loop.model_copy(update={"loss_calls": calls})})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX311"), None)

    assert severity([4, 1, 48, 48]) == "info"
    assert severity([4]) == "warning" and severity([4, 16]) == "warning"


def test_regression_targets_sorted_by_value_are_unshuffled_data():
    from .reports import healthy_data, healthy_split

    def found(rho: float) -> set[str]:
        split = healthy_split(label_runs_fraction=None, class_counts={}, target_order_correlation=rho)
        return {f.rule_id for f in diagnose(BASE.model_copy(update={"data": healthy_data(train=split)})).findings}

    assert "NNDX508" in found(0.998) and "NNDX508" in found(-0.97)
    assert "NNDX508" not in found(0.04)  # random order


def test_one_hard_batch_of_a_fitted_model_is_no_divergence():
    """A FedAvg client in a late round: the global model already fits (losses around 0.4 against
    ln 10 = 2.3), batches of 10 swing from 0.02 to 1.5, the first one lucky (0.07), and one batch
    reaches 2.38, just over an uninformed prediction's loss, before the loss goes back to its level.
    One jump the loss recovers from is a hard batch; jumps that keep coming, or a loss that stays up,
    diverge."""
    from nndx.report import LossCall

    from .reports import points

    ce = LossCall(loss_type="CrossEntropyLoss", output_shape=[10, 10], target_shape=[10], target_dtype="int64",
                  calls=75)  # fmt: skip
    level = [0.36, 0.6, 0.58, 0.17, 0.1, 0.5, 0.46, 0.44, 1.16, 0.19, 0.38, 0.63, 0.32, 0.63, 0.23]

    def severity(values: list[float]) -> str | None:
        report = with_loop(BASE, loss_calls=[ce]).model_copy(
            update={"num_classes": 10, "loss_history": {"train": points(values)}, "parameters": [], "probes": None})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX104"), None)

    run = [0.074] + level * 4 + [2.38] + level[:10]
    assert severity(run) in ("info", None)
    assert severity([0.074] + level * 4 + [2.38, 2.5, 3.1, 2.9, 3.4, 3.0, 2.8, 3.3, 3.5, 3.2]) == "warning"
    assert severity([0.074] + (level + [2.6]) * 4 + level[:10]) == "warning"


def test_large_updates_on_a_run_that_ends_well_under_chance_are_context():
    """The PyTorch word-language-model example: SGD at lr 20 clipped to 0.25 makes large early
    updates; its loss falls only from 3.3 to 2.6 (a text with a high entropy floor) — yet that
    is far under ln(48) = 3.87. The same updates with the loss stuck at ln(48) are an alarm."""
    from nndx.report import LossCall

    from .broken import mlp_params
    from .reports import points

    nll = LossCall(loss_type="NLLLoss", output_shape=[160, 48], target_shape=[160], target_dtype="int64", calls=200)

    def severity(values: list[float]) -> str | None:
        report = with_loop(BASE, loss_calls=[nll], lr_history=[LRPoint(step=i, lrs=[20.0]) for i in range(0, 100, 10)])
        report = report.model_copy(
            update={"num_classes": 48, "loss_history": {"train": points(values)}, "parameters": mlp_params(ratio=0.12)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX205"), None)

    assert severity([3.3 - 0.7 * (1 - math.exp(-i / 30)) for i in range(100)]) == "info"
    assert severity([3.87 + 0.01 * math.sin(i) for i in range(100)]) in ("warning", "error")


def test_a_preflight_on_a_batch_of_two_says_so_as_context():
    from nndx.report import LossCall

    def severity(rows: int) -> str | None:
        call = LossCall(loss_type="CrossEntropyLoss", output_shape=[rows, 10], target_shape=[rows], target_dtype="int64")
        report = with_loop(BASE, loss_calls=[call]).model_copy(update={"loss_history": {}})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX311"), None)

    assert severity(2) == "info" and severity(64) is None


def test_a_sweep_whose_loss_never_fell_gives_no_lr_verdict():
    """Adadelta at its standard lr 1.0: its first steps are tiny at any lr, so the range test's
    loss never clearly falls and its minimum sits at the first lr (min/10 = 1e-8). That is no
    reference for 'lr 1.0 is 30x too high'; a divergence point still is."""
    from nndx.report import LRRangeResult

    from .reports import healthy_loop

    def found(**sweep) -> set[str]:
        lr_range = LRRangeResult(status="failed", min_over_10_lr=1e-8, **sweep)
        report = BASE.model_copy(update={"loop": healthy_loop(lr=1.0), "probes": healthy_probes(lr_range=lr_range)})
        return _found(report)

    assert "NNDX602" not in found() and "NNDX603" not in found()
    assert "NNDX602" in found(diverged_at_lr=0.5)


def test_a_model_probed_in_train_mode_is_no_finding_but_dropout_that_ignores_eval_is():
    from nndx.report import EvalModeResult

    def found(**result) -> set[str]:
        probe = EvalModeResult(status="failed", training=True, has_dropout=True, has_batchnorm=True, **result)
        return _found(BASE.model_copy(update={"probes": healthy_probes(eval_mode=probe)}))

    assert "NNDX609" not in found(max_abs_diff=1.6, eval_abs_diff=0.0, ignores_eval=False)  # every fresh model
    assert "NNDX609" in found(max_abs_diff=1.6, eval_abs_diff=0.4, ignores_eval=True)  # F.dropout(training=True)


def test_a_frozen_body_still_at_its_default_init_warns_a_trained_one_is_context():
    """The same frozen backbone under a head whose loss falls: trained weights (frozen_at_init
    empty) are transfer learning; weights still at PyTorch's default init were never loaded."""
    backbone = healthy_reports()["frozen_backbone"]
    assert _found(with_loop(backbone, frozen_at_init=[], frozen_checked=2))["NNDX305"].severity == "info"
    assert _found(with_loop(backbone, frozen_at_init=None))["NNDX305"].severity == "info"  # not checked: no claim
    random_body = _found(with_loop(backbone, frozen_at_init=["0.weight", "2.weight"], frozen_checked=2))["NNDX305"]
    assert random_body.severity == "warning" and random_body.evidence["frozen_at_init"] == ["0.weight", "2.weight"]
    assert diagnose(with_loop(backbone, frozen_at_init=["0.weight", "2.weight"], frozen_checked=2)).top().rule_id == "NNDX305"
    # one layer of twenty that barely moved in training (a wide layer, a short run) is no sign
    assert _found(with_loop(backbone, frozen_at_init=["2.weight"], frozen_checked=20))["NNDX305"].severity == "info"


def test_a_head_on_a_trained_frozen_body_need_not_memorise_a_batch():
    """A head of 650 parameters on a frozen trained body of 54,400 fits one batch only as far
    as the body's features allow: its overfit failure is context. The same failure stays an
    alarm when the body is random, unchecked, or when the loss did not fall at all."""
    from nndx.report import OverfitResult

    backbone = healthy_reports()["frozen_backbone"]

    def severities(at_init: list[str] | None, final_loss: float) -> dict[str, str]:
        failed = OverfitResult(status="failed", task="classification", steps=300, initial_loss=2.6, final_loss=final_loss)
        report = with_loop(backbone, frozen_at_init=at_init, frozen_checked=2).model_copy(
            update={"probes": healthy_probes(overfit_one_batch=failed)})
        return {f.rule_id: f.severity for f in diagnose(report).findings}

    trained = severities([], final_loss=1.4)  # fell to 0.54 of its start
    assert trained["NNDX601"] == "info" and trained["NNDX305"] == "info"
    assert severities([], final_loss=2.55)["NNDX601"] == "warning"  # the head does not learn at all
    assert severities(None, final_loss=1.4)["NNDX601"] == "warning"
    random_body = severities(["0.weight"], final_loss=1.4)
    assert random_body["NNDX601"] == "warning" and random_body["NNDX305"] == "warning"


def test_large_updates_at_an_lr_the_range_test_trains_well_at_are_context():
    """A fresh small head makes large update/weight ratios at any workable LR. When the loop's
    LR is inside what the LR range test found training well, the LR is not too high; the same
    ratios at ten times the interval's top are. The loss falls slowly (a head on a frozen
    body), as in the bench's frozen char-LM runs with a hand-written SGD loop."""
    from nndx.report import LRRangeResult

    from .reports import mlp_params, points

    def severity(lr: float) -> str | None:
        sweep = LRRangeResult(status="passed", suggested_lr=0.39, interval_low_lr=0.19, interval_high_lr=0.78)
        report = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i in range(0, 100, 10)]).model_copy(
            update={"loss_history": {"train": points([2.6 - 0.25 * i / 100 for i in range(100)])}, "parameters": mlp_params(ratio=0.12),
                    "probes": healthy_probes(lr_range=sweep)})  # fmt: skip
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX205"), None)

    assert severity(0.85) == "info"
    assert severity(8.5) in ("warning", "error")


def test_large_updates_in_a_loop_whose_clip_bounds_most_steps_are_context_and_root_nothing():
    """AWD-LSTM: SGD at lr 30 with clip_grad_norm_(0.25) makes update/weight ratios near 0.1 by
    design. With the clip cutting most steps the LR is the loop's choice: info, and it does not
    root the slow train loss of a heavily dropped-out run. Unclipped, the same ratios warn."""
    from nndx.report import GradNormPoint

    from .reports import mlp_params, points

    def found(clip: float | None):
        history = [GradNormPoint(step=i, before_clip=1.5, after_clip=clip) for i in range(0, 100, 10)]
        report = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[30.0]) for i in range(0, 100, 10)],
                           grad_norm_history=history).model_copy(
            update={"loss_history": {"train": points([3.87 - 0.4 * i / 100 for i in range(100)])},
                    "parameters": mlp_params(ratio=0.15)})  # fmt: skip
        return {f.rule_id: f for f in diagnose(report).findings}

    clipped = found(0.25)
    assert clipped["NNDX205"].severity == "info" and clipped["NNDX205"].refuted and not clipped["NNDX205"].explains
    assert found(None)["NNDX205"].severity in ("warning", "error")


def test_training_order_is_read_from_the_batches_not_from_how_the_data_is_stored():
    """An ImageFolder is stored class by class and a shuffling DataLoader mixes it: the
    arrays handed to the data check are sorted, the batches that reach the loss are not.
    The batches decide; the stored order alone is context."""
    from nndx.report import LossCall

    stored_sorted = healthy_split(label_runs_fraction=0.99, order_source="storage")

    def severity(split, *calls: LossCall) -> str | None:
        report = with_loop(BASE, loss_calls=list(calls)).model_copy(update={"data": healthy_data(train=split)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX508"), None)

    def batches(measured: int, single: int, values: list[float], rows: int = 64) -> LossCall:
        return LossCall(loss_type="CrossEntropyLoss", output_shape=[rows, 10], target_shape=[rows], target_dtype="int64",
                        calls=100, measured_batches=measured, single_target_batches=single, single_target_values=values)

    assert severity(stored_sorted, batches(10, 0, [])) is None  # the loader shuffles: mixed batches
    assert severity(stored_sorted) == "info"  # no batch seen: nndx cannot tell
    assert severity(stored_sorted.model_copy(update={"order_source": "loader"})) == "warning"
    assert severity(healthy_split(), batches(10, 9, [0.0, 3.0, 7.0])) == "warning"  # sorted batches, storage mixed
    assert severity(healthy_split(), batches(1, 1, [4.0])) == "warning"  # one batch of one class: 10 ** -63 by chance
    # a validation pass through the same loss (shuffled, another batch size) does not dilute the training batches
    assert severity(healthy_split(), batches(10, 8, [0.0, 3.0]), batches(30, 0, [], rows=400)) == "warning"
    # 97% of one class: batches of 8 of that class alone are common by chance
    skewed = healthy_split(class_counts={"0": 970, "1": 30}, label_runs_fraction=0.94)
    assert severity(skewed, batches(10, 8, [0.0], rows=8)) is None
    # batches of two of a balanced binary task hold one class half the time, of either class
    binary = healthy_split(class_counts={"0": 500, "1": 500}, label_runs_fraction=0.5)
    assert severity(binary, batches(20, 11, [0.0, 1.0], rows=2)) is None
    assert severity(binary, batches(20, 20, [0.0, 1.0], rows=16)) == "warning"


def test_regression_batches_that_are_slices_of_sorted_targets_are_unshuffled():
    from nndx.report import LossCall

    split = healthy_split(label_kind="float_continuous", class_counts={}, label_runs_fraction=None, target_mean=0.0,
                          target_std=1.0, target_order_correlation=0.01, order_source="storage")

    def severity(mean: float, std: float) -> str | None:
        call = LossCall(loss_type="MSELoss", output_shape=[64, 1], target_shape=[64, 1], target_dtype="float32",
                        measured_batches=1, target_mean=mean, target_std=std)
        report = with_loop(BASE, loss_calls=[call]).model_copy(update={"data": healthy_data(train=split, test=None)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX508"), None)

    assert severity(mean=-1.9, std=0.41) == "warning"  # the lowest 64 targets of a sorted split: off-centre
    assert severity(mean=0.02, std=0.05) == "warning"  # a middle slice: narrow
    assert severity(mean=0.1, std=0.97) is None  # a random batch
    # NeRF's rays of one image (the centre crop of its first steps): off-centre, but wider than the split
    assert severity(mean=-1.9, std=1.21) is None

    def forecast(mean: float, std: float) -> str | None:  # 32 windows x 96 steps x 7 series
        call = LossCall(loss_type="MSELoss", output_shape=[32, 96, 7], target_shape=[32, 96, 7],
                        target_dtype="float32", measured_batches=61, target_mean=mean, target_std=std)
        report = with_loop(BASE, loss_calls=[call]).model_copy(update={"data": healthy_data(train=split, test=None)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX508"), None)

    # a shuffled batch of forecast windows: the steps and series of one window are not 672 more
    # samples, so its mean is judged against 32 windows' standard error (PatchTST, DLinear)
    assert forecast(mean=0.5, std=0.99) is None
    assert forecast(mean=-1.9, std=0.41) == "warning"


def test_a_few_channels_pooled_into_a_head_are_a_bottleneck_a_language_models_width_is_not():
    """Channels averaged or max-pooled over space or time become that many features: 4
    channels pooled into a 10-class head hold 4 numbers per sample. A language model's
    24-wide representation under its 65-token vocabulary, and a 2-feature input (the data,
    not a layer), are no bottleneck."""
    from nndx.report import LayerInfo, ParameterStats

    from .reports import flat, points

    stalled = {"train": points(flat(5, level=2.3))}

    def found(layers: list[tuple[str, str, list[int]]], classes: int) -> dict:
        params = [ParameterStats(name=f"{name}.weight", shape=shape, weight_norm=1.0) for name, _, shape in layers]
        model = mlp_model(layers=[LayerInfo(name=n, type=t, param_count=math.prod(s)) for n, t, s in layers])
        return _found(BASE.model_copy(update={"num_classes": classes, "parameters": params, "model": model,
                                              "loss_history": stalled}))  # fmt: skip

    pooled = found([("stem", "Conv2d", [2, 1, 3, 3]), ("block", "Conv2d", [4, 2, 3, 3]), ("head", "Linear", [10, 4])], 10)
    assert pooled["NNDX403"].severity == "warning" and pooled["NNDX403"].evidence["width"] == 4
    assert "NNDX403" not in found([("stem", "Conv2d", [32, 1, 3, 3]), ("head", "Linear", [10, 32])], 10)
    lm = [("tok", "Embedding", [65, 24]), ("fc", "Linear", [96, 24]), ("proj", "Linear", [24, 96]),
          ("lm_head", "Linear", [65, 24])]  # fmt: skip
    assert "NNDX403" not in found(lm, 65)
    assert "NNDX403" not in found([("0", "Linear", [16, 2]), ("2", "Linear", [3, 16])], 3)  # xor's 2 input features
    # Mamba's dt_proj reads the first dt_rank = 2 of x_proj's 18 columns: a slice, no layer gives 2 features
    mamba = [("tok", "Embedding", [16, 32]), ("in_proj", "Linear", [128, 32]), ("conv1d", "Conv1d", [64, 1, 4]),
             ("x_proj", "Linear", [18, 64]), ("dt_proj", "Linear", [64, 2]), ("out_proj", "Linear", [32, 64]),
             ("lm_head", "Linear", [16, 32])]  # fmt: skip
    assert "NNDX403" not in found(mamba, 16)
    squeezed = [*mamba[:3], ("x_proj", "Linear", [2, 64]), *mamba[4:]]  # the whole representation through 2 features
    assert found(squeezed, 16)["NNDX403"].evidence["width"] == 2


def test_batches_of_two_through_batchnorm_are_too_small_even_when_the_loss_looks_calm():
    """BatchNorm normalises each training batch by its own mean and variance: over 2 samples
    they are noise, whether or not the loss swings. Without BatchNorm a calm loss at batch 2
    is no evidence; a preflight only says what batch it was given."""
    from nndx.report import LossCall

    from .reports import noisy_decreasing, points

    def severity(batchnorm: bool, history: bool = True) -> str | None:
        call = LossCall(loss_type="CrossEntropyLoss", output_shape=[2, 10], target_shape=[2], target_dtype="int64", calls=80)
        report = with_loop(BASE, loss_calls=[call], has_batchnorm=batchnorm).model_copy(
            update={"loss_history": {"train": points(noisy_decreasing(4, noise=0.05))} if history else {}})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX311"), None)

    assert severity(batchnorm=True) == "warning"
    assert severity(batchnorm=False) is None
    assert severity(batchnorm=True, history=False) == "info"


def test_updates_blown_up_through_batchnorm_over_two_samples_fold_under_the_batch():
    """makemore part 3 with a batch of two: BatchNorm divides by the spread of two samples, and
    at the LR batch 32 trains at the updates blow up (ratio 3) and the loss goes to NaN. The
    batch is the root, the update ratio its symptom; the same updates at batch 32, or at batch 2
    with no BatchNorm, stay an LR finding."""
    from nndx.report import LossCall

    from .broken import network_killed_by_lr

    def top(batch: int, batchnorm: bool) -> str:
        call = LossCall(loss_type="CrossEntropyLoss", output_shape=[batch, 27], target_shape=[batch],
                        target_dtype="int64", calls=80)  # fmt: skip
        return diagnose(with_loop(network_killed_by_lr(), loss_calls=[call], has_batchnorm=batchnorm)).top().rule_id

    assert top(2, batchnorm=True) == "NNDX311"
    assert top(32, batchnorm=True) == "NNDX205"
    assert top(2, batchnorm=False) == "NNDX205"


def test_training_in_eval_mode_vs_eval_mode_that_changes_nothing():
    """NNDX323 reads backward passes after eval-mode forwards: a model whose mode matters,
    most of training; not a few stray ones, nor a model without dropout or batch-norm."""
    from nndx.report import LossPoint

    broken = with_loop(BASE, has_batchnorm=True, backward_after_eval_forward=75, first_eval_backward_step=25)
    assert _found(broken)["NNDX323"].severity == "warning"
    assert "NNDX323" not in _found(with_loop(BASE, backward_after_eval_forward=75, first_eval_backward_step=25))
    assert "NNDX323" not in _found(with_loop(BASE, has_batchnorm=True, backward_after_eval_forward=2))
    assert "NNDX323" not in _found(with_loop(BASE, has_batchnorm=True, backward_after_eval_forward=10,
                                             backward_calls=100))  # fmt: skip
    # the loss settled in train mode, then NaN two steps after the switch: the switch set it off
    values = [2.3 - 0.05 * i for i in range(25)] + [2.0, 50.0] + [math.nan] * 73
    diverged = broken.model_copy(update={"loss_history": {"train": [LossPoint(step=i, value=v)
                                                                    for i, v in enumerate(values)]}})  # fmt: skip
    top = diagnose(diverged).findings[0]
    assert (top.rule_id, top.severity) == ("NNDX323", "error")
    assert top.evidence["diverged_after_switch"] is True


def test_a_clip_cutting_one_class_batches_is_folded_under_the_unshuffled_data():
    """Batches of one class pull every weight one way: their gradients outgrow the clip a
    mixed batch was given (the PyTorch text-classification tutorial's 0.1 at lr 5)."""
    from .broken import BROKEN

    clipped = _found(BROKEN["NNDX308"]())["NNDX308"]
    assert clipped.explained_by is None
    unshuffled = BROKEN["NNDX308"]().model_copy(update={"data": healthy_data(train=healthy_split(label_runs_fraction=0.99))})
    found = _found(unshuffled)
    assert found["NNDX308"].explained_by == "NNDX508"
    assert diagnose(unshuffled).top().rule_id == "NNDX508"


def test_one_optimizer_never_reset_among_several_vs_each_reset():
    two = dict(optimizers=["Adam", "Adam"], optimizer_steps=[30, 30])
    forgot = _found(with_loop(BASE, **two, optimizer_steps_without_reset=[0, 29]))
    assert forgot["NNDX301"].severity == "error" and forgot["NNDX301"].evidence["optimizer"] == "1 (Adam)"
    assert "the other optimizers' were reset" in forgot["NNDX301"].symptom
    # none of four reset (morvan's four optimizers compared side by side, zero_grad dropped for all): all named
    four = dict(optimizers=["SGD", "SGD", "RMSprop", "Adam"], optimizer_steps=[30] * 4)
    none = _found(with_loop(BASE, **four, optimizer_steps_without_reset=[29] * 4))["NNDX301"]
    assert none.evidence["optimizers_not_reset"] == 4 and "the other optimizers' were reset" not in none.symptom
    assert "3 (Adam)" in none.symptom and "none of the 4 optimizers' gradients were reset" in none.symptom
    assert "NNDX301" not in _found(with_loop(BASE, **two, optimizer_steps_without_reset=[0, 0]))
    assert "NNDX301" not in _found(with_loop(BASE, **two, optimizer_steps_without_reset=[0, 3]))  # a few skipped resets
    # one optimizer: its counts are the loop's, read by the rule's other branches
    assert "NNDX301" not in _found(with_loop(BASE, optimizers=["SGD"], optimizer_steps=[30],
                                             optimizer_steps_without_reset=[29]))  # fmt: skip


def test_units_found_dead_after_training_with_no_record_of_the_start_died_during_it():
    """One recorded step of layer statistics (the probes' own, of a functional ReLU): at
    the start of a preflight it is the start; after training nobody knows when the units
    died, so the causes of units dying in training (an LR far too high) explain them."""
    from .reports import flat, points

    dead_once = {"layers": mlp_layers(steps=(0,), dead=0.95), "loss_history": {"train": points(flat(0))}}
    preflight = with_loop(BASE.model_copy(update=dead_once), steps=0)
    assert "NNDX201" in _found(preflight) and "NNDX208" not in _found(preflight)
    trained = with_loop(BASE.model_copy(update=dead_once), steps=100)
    found = _found(trained)
    assert "NNDX201" not in found and "no record of its start" in found["NNDX208"].symptom
    from nndx.rules.engine import can_explain

    # and so an update ratio far too high (NNDX205, LR_TOO_HIGH) folds them, as it folds units that died
    assert can_explain("NNDX205", "NNDX208") and not can_explain("NNDX205", "NNDX201")


def test_saturation_from_the_start_vs_during_training():
    """Saturated from the first recorded step: the init or the inputs (NNDX202); saturated
    later: updates pushed the units there, which a missing zero_grad explains (NNDX209)."""
    from .broken import BROKEN

    start, later = _found(BROKEN["NNDX202"]()), _found(BROKEN["NNDX209"]())
    assert "NNDX202" in start and "NNDX209" not in start
    assert "NNDX209" in later and "NNDX202" not in later and "from 1%" in later["NNDX209"].symptom
    assert _found(with_loop(BROKEN["NNDX209"](), zero_grad_calls=0))["NNDX209"].explained_by == "NNDX301"
    # the same saturation while the loss fell from 2.3 to 0.3: units grown sure, context (a trained attention)
    learning = BROKEN["NNDX209"]().model_copy(update={"loss_history": BASE.loss_history})
    assert _found(learning)["NNDX209"].severity == "info" and "learned" in _found(learning)["NNDX209"].symptom


def test_a_tiny_batch_whose_loss_fit_its_data_is_context():
    """The PyTorch CIFAR-10 tutorial trains at batch 4: its loss falls from 2.30 to 0.04 and
    swings by 300% of so low a level from one 4-image batch to the next. That run fit its
    data; the same swings on a loss that fell by only half warn."""
    from .broken import tiny_batch
    from .reports import points

    def severity(end: float) -> str | None:
        values = [max(end, 2.3 * math.exp(-i / 12)) * (1 + (0.9 if i % 2 else -0.6)) for i in range(120)]
        report = tiny_batch().model_copy(update={"loss_history": {"train": points(values)}})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX311"), None)

    assert severity(0.04) == "info"
    assert severity(1.1) == "warning"


def test_a_failed_overfit_on_a_loss_nndx_cannot_name_is_context_when_the_run_learned():
    """pytorch/examples' forward-forward trains each layer on a goodness loss of its own
    (softplus of goodness minus a threshold, no torch loss inside): its floor is unknown, so
    a fall to half its start in the probe is no evidence against the loss when the run's own
    loss learned. A named loss, a run that did not learn, or a probe loss that barely moved
    still warn."""
    from nndx.report import LossCall, OverfitResult

    from .reports import flat, healthy_probes, points

    def severity(loss_type: str, final: float, learned: bool) -> str | None:
        probes = healthy_probes(overfit_one_batch=OverfitResult(status="failed", steps=300, initial_loss=1.12,
                                                                final_loss=final))  # fmt: skip
        call = LossCall(loss_type=loss_type, output_shape=[64, 1], target_shape=[64], calls=300)
        report = with_loop(BASE, loss_calls=[call]).model_copy(update={"probes": probes})
        if not learned:
            report = report.model_copy(update={"loss_history": {"train": points(flat(0, level=1.1))}})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX601"), None)

    assert severity("goodness_loss", 0.585, learned=True) == "info"
    assert severity("MSELoss", 0.585, learned=True) == "warning"
    assert severity("goodness_loss", 0.585, learned=False) == "warning"
    assert severity("goodness_loss", 1.0, learned=True) == "warning"


def test_a_failed_overfit_on_a_loss_nndx_cannot_name_that_fell_as_far_as_the_run_is_context():
    """Glow's bits per dimension fell from 5.3 to 3.7 over the run (27%: not "learned" by the
    30% mark) and to 0.57 of its start on one batch: the floor of such a loss is the data's
    entropy, far above 0. The probe fitting its batch as far as the run fit its data is
    context; a probe that fell less far than the run still warns."""
    from nndx.report import LossCall, OverfitResult

    from .reports import healthy_probes, points

    run = points([5.3 - 1.6 * (1 - math.exp(-i / 40)) for i in range(200)])

    def severity(final: float) -> str | None:
        probes = healthy_probes(overfit_one_batch=OverfitResult(status="failed", steps=300, initial_loss=5.3,
                                                                final_loss=final))  # fmt: skip
        call = LossCall(loss_type="loss_fn", output_shape=[64], calls=1)
        report = with_loop(BASE, loss_calls=[call])
        report = report.model_copy(update={"probes": probes, "loss_history": {"train": run}})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX601"), None)

    assert severity(3.04) == "info"
    assert severity(4.5) == "warning"


def test_a_failed_overfit_on_a_loss_nndx_cannot_name_still_falling_when_the_probe_stopped_is_context():
    """pycox's Cox partial likelihood (a user's function, no torch loss inside): on one batch of 256
    the probe's loss fell from 4.64 to 3.11 in 300 steps and was still falling, steadily, when the
    probe stopped; the run's own loss hardly moves (1.5%: a ranking loss over fresh risk sets) while
    its concordance learns. A loss nndx cannot name has no floor it knows, and one still falling
    has not failed to fit: context. The same fall that stopped halfway, flat for its second half,
    still warns."""
    import numpy as np

    from nndx.report import LossCall, OverfitResult

    from .reports import healthy_probes, points

    rng = np.random.default_rng(0)
    falling = list(4.64 - 1.53 * np.linspace(0.0, 1.0, 301) ** 0.8 + rng.normal(0.0, 0.05, 301))
    stalled = list(4.64 - 1.53 * np.minimum(np.linspace(0.0, 2.0, 301), 1.0) + rng.normal(0.0, 0.05, 301))
    run = points(list(4.47 - 0.07 * np.linspace(0.0, 1.0, 160) + rng.normal(0.0, 0.1, 160)))

    def severity(losses: list[float]) -> str | None:
        result = OverfitResult(status="failed", steps=300, initial_loss=4.64, final_loss=losses[-1], losses=losses)
        call = LossCall(loss_type="loss_fn", output_shape=[256, 1], calls=1)
        report = with_loop(BASE, loss_calls=[call])
        report = report.model_copy(update={"probes": healthy_probes(overfit_one_batch=result),
                                           "loss_history": {"train": run}})  # fmt: skip
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX601"), None)

    assert severity(falling) == "info"
    assert severity(stalled) == "warning"


def test_a_failed_overfit_whose_copy_died_while_the_run_learned_is_context():
    """RankNet (Adam, ReLU6 score): on its one query the copy's every score went to 0 within
    three steps, the loss froze at ln 2 for the remaining 297, while the run's own loss fell by
    72% over many queries. The copy stopped, not the model: info. A run that did not learn, or a
    copy that never moved (dead at any LR), still warns."""
    from nndx.report import OverfitResult

    from .reports import flat, healthy_probes, points

    died = [0.7128, 0.7051, 0.6981] + [0.693147] * 298
    never_moved = [0.693147] * 301

    def severity(losses: list[float], run: list[float]) -> str | None:
        result = OverfitResult(status="failed", steps=300, initial_loss=losses[0], final_loss=losses[-1], losses=losses)
        report = BASE.model_copy(update={"probes": healthy_probes(overfit_one_batch=result),
                                         "loss_history": {"train": points(run)}})  # fmt: skip
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX601"), None)

    learned = [0.65 * math.exp(-i / 60) + 0.18 for i in range(300)]
    assert severity(died, learned) == "info"
    assert severity(died, flat(0, level=0.69)) == "warning"
    assert severity(never_moved, learned) == "warning"


def test_a_failed_overfit_while_the_run_fit_its_data_far_better_is_context():
    """NYU-DLSP20's echo task: a 4-unit ReLU RNN under BCEWithLogitsLoss takes over a thousand
    steps to leave ln 2; the probe's 300 steps on one batch took its loss from 0.755 to 0.65,
    while the run's own loss fell from 0.69 to 0.003 (99.98% accuracy). A run that fit its data
    to under a tenth of its start shows the model and loss can fit: the probe's budget ran out,
    context. A run that fell by half, or a loss that went negative, still warns."""
    from nndx.report import LossCall, OverfitResult

    from .reports import healthy_probes, points

    def severity(run: list[float]) -> str | None:
        probes = healthy_probes(overfit_one_batch=OverfitResult(status="failed", steps=300, initial_loss=0.755,
                                                                final_loss=0.65, loss_floor=0.0))  # fmt: skip
        call = LossCall(loss_type="BCEWithLogitsLoss", output_shape=[5, 20, 1], target_shape=[5, 20, 1], calls=300)
        report = with_loop(BASE, loss_calls=[call])
        report = report.model_copy(update={"probes": probes, "loss_history": {"train": points(run)}})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX601"), None)

    def decay(end: float) -> list[float]:
        return [end + (0.69 - end) * math.exp(-i / 30) for i in range(200)]

    assert severity(decay(0.003)) == "info"
    assert severity(decay(0.35)) == "warning"
    assert severity(decay(-5.0)) == "warning"


def test_a_failed_overfit_whose_loss_fell_below_zero_to_minus_infinity_is_context():
    """MorvanZhou's GAN: the generator's loss mean(log(1 - D(G(z)))) against a fixed
    discriminator has no floor; on one batch the probe drove it from -0.72 to -9.6 and then
    to -inf (D's output reached 1). It fitted all the way down: there was nothing to fail.
    A loss that rose to +inf, or stalled above zero, still warns."""
    from nndx.report import OverfitResult

    from .reports import healthy_probes

    def severity(losses: list[float]) -> str | None:
        result = OverfitResult(status="failed", steps=len(losses) - 1, task="regression", initial_loss=losses[0],
                               final_loss=losses[-1], losses=losses)  # fmt: skip
        report = BASE.model_copy(update={"probes": healthy_probes(overfit_one_batch=result)})
        return next((f.severity for f in diagnose(report).findings if f.rule_id == "NNDX601"), None)

    falling = [-0.72 - 0.4 * i for i in range(22)]
    assert severity(falling + [-math.inf]) == "info"
    assert severity([0.72 + 0.4 * i for i in range(22)] + [math.inf]) == "warning"
    assert severity([0.72 - 0.01 * i for i in range(22)]) == "warning"


def test_units_zero_on_a_batch_of_one_sample_are_not_dead():
    """An n-gram model trained one context at a time: the probes' batch is that one context,
    on which half of a live ReLU layer is zero, so "zero for every sample". Counted over at
    least 8 outputs per unit it is dead; a layer with every unit zero is dead on any batch."""
    from .reports import flat, points

    def found(dead: float, values_per_unit: int) -> dict:
        layers = [l.model_copy(update={"activation": l.activation.model_copy(update={"values_per_unit": values_per_unit})})
                  for l in mlp_layers(steps=(0,), dead=dead)]  # fmt: skip
        return _found(with_loop(BASE.model_copy(update={"layers": layers, "loss_history": {"train": points(flat(0))}}),
                                steps=0))  # fmt: skip

    assert "NNDX201" not in found(0.5, values_per_unit=1)
    assert "NNDX201" in found(0.5, values_per_unit=32)
    assert "NNDX201" in found(0.5, values_per_unit=0)  # not recorded (an older report): as before
    assert "NNDX201" in found(1.0, values_per_unit=1)


def test_one_sample_a_step_is_online_training_not_a_tiny_batch():
    """The PyTorch BiLSTM-CRF and n-gram tutorials train one sentence or context per step by
    design: the same swings at batch 1 are no candidate cause (were it even a note, it would
    root the swings and outrank their LR reading), at batch 2 (a batch cut below the one its
    learning rate was tuned for) a warning; through BatchNorm, batch 1 is still a warning."""
    from .broken import loss_call, tiny_batch

    two = diagnose(tiny_batch())
    one_call = [loss_call(output_shape=[1, 10], target_shape=[1])]
    one = diagnose(with_loop(tiny_batch(), loss_calls=one_call))
    assert two.top().rule_id == "NNDX311" and two.top().severity == "warning"
    assert "NNDX311" not in {f.rule_id for f in one.findings}
    assert one.top() is None or one.top().code.value != "BATCH_TOO_SMALL"
    batchnorm = diagnose(with_loop(tiny_batch(), loss_calls=one_call, has_batchnorm=True))
    assert next(f for f in batchnorm.findings if f.rule_id == "NNDX311").severity == "warning"


def test_all_zero_outputs_into_nll_are_log_softmax_over_a_length_one_axis():
    """log_softmax(dim=0) of a (1, V) output (the n-gram and char-RNN tutorials train one
    sample at a time) is all zero: log(1), not probabilities. NNDX324 names it; NNDX315
    stays for outputs with positive values."""
    from .broken import calls, loss_call

    zeros = _found(calls(loss_call(loss_type="NLLLoss", output_shape=[1, 59], target_shape=[1], output_min=0.0,
                                   output_max=0.0, output_log_rows_off_zero=math.log(59))))  # fmt: skip
    assert "NNDX324" in zeros and "NNDX315" not in zeros
    probabilities = _found(calls(loss_call(loss_type="NLLLoss", output_shape=[8, 5], target_shape=[8], output_min=0.0,
                                           output_max=0.9)))  # fmt: skip
    assert "NNDX315" in probabilities


def test_a_plateau_schedule_that_stops_at_exactly_1e_3_of_its_peak_collapsed_too():
    """ReduceLROnPlateau(mode='min') stepped with a score that rises cuts 1e-5 ten times over
    until its eps=1e-8 stops it: exactly 1e-3 of the peak, for most of the run (Pytorch-UNet's
    scheduler given the Dice score in the wrong mode)."""
    lrs = [max(1e-5 * 0.1 ** (i // 10), 1e-8) for i in range(200)]
    assert "NNDX307" in _found(with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i, lr in enumerate(lrs)]))


@pytest.mark.parametrize(("lrs", "severity"), [
    ([0.1 * 0.1 ** ((i + 90) // 180) for i in range(720)], "info"),  # arcface-pytorch: /10 every 2 of 8 epochs
    ([0.1 * 0.1 ** (i // 10) for i in range(60)], "warning"),  # StepLR(10) for epochs, stepped per batch: 50%
    ([0.1 * 0.1 ** (i // 10) for i in range(200)], "warning"),
    ([0.1] * 140 + [0.0] * 60, "warning"),  # a linear decay clamped at 0 after its end: 30% stopped
])
def test_a_step_decay_that_sits_low_for_under_half_the_run_is_context(lrs, severity):
    """A published step decay spends its last stages at 1e-4 of the peak by design; an epoch
    schedule stepped every batch spends most of the run there, and an LR of exactly 0 is no recipe."""
    found = _found(with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i, lr in enumerate(lrs)]))
    assert found["NNDX307"].severity == severity


def test_milestones_meant_for_epochs_reached_in_the_first_batches_decay_the_run():
    """g1910/HyperNetworks' MultiStepLR stepped per batch with milestones in epochs: the LR is
    1/64 of its peak from batch 14 of 276 on (DeepSets' two 10x milestones: 1/100 from batch 48
    of 540), never 1e-3 of it, and the loss barely moves. A decay that late in the run, or a run
    whose loss still learned, is a schedule."""
    from .broken import train
    from .reports import flat, noisy_decreasing

    def found(lrs, losses):
        report = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i, lr in enumerate(lrs)])
        return _found(report.model_copy(update=train(losses))).get("NNDX307")

    early = [2e-3 * 0.25 ** min(3, i // 5) for i in range(276)]
    stuck = flat(0, n=276, level=2.2)
    assert found(early, stuck).severity == "warning" and found(early, stuck).evidence["decayed_from_step"] == 15
    assert found(early, noisy_decreasing(0, n=276)).severity == "info"
    published = [2e-3 * 0.1 ** ((i >= 138) + (i >= 207)) for i in range(276)]  # milestones at 50% and 75%
    assert found(published, stuck) is None


def test_a_line_searchs_rejected_trial_is_no_divergence_but_a_sustained_climb_is():
    """A PINN trained by one L-BFGS step(closure) of 200 evaluations, each logged: the
    strong-Wolfe line search tried a point 1000x worse once and rejected it. In a loop of
    200 steps the same jump is an overshoot; under L-BFGS, a climb over a third of the
    evaluations (its lr far too high) still is."""
    from .broken import train

    falling = [0.3 * 0.98**i for i in range(200)]
    trial = falling[:60] + [300.0] + falling[61:]
    line_search = {"steps": 1, "backward_calls": 200, "backward_calls_in_step": 200, "zero_grad_calls": 200}
    steps = {"steps": 200, "backward_calls": 200, "backward_calls_in_step": 0, "zero_grad_calls": 200}

    def alarm(values, loop):
        report = with_loop(BASE, **loop).model_copy(update=train(values))
        return {f.rule_id: f.severity for f in diagnose(report).findings}.get("NNDX104")

    assert alarm(trial, line_search) is None
    assert alarm(trial, steps) == "warning"
    climbing = falling[:130] + [30.0 * 1.1**i for i in range(70)]
    assert alarm(climbing, line_search) == "warning"


def test_mildly_scaled_inputs_in_a_run_that_learned_are_context():
    """hardmaru's mixture density network trains on x in +-14 (std 6) and fits well: the
    scale is a fact, not this run's problem. A flat loss, or a scale far off, keeps it a
    warning."""
    from .broken import flat, train
    from .reports import healthy_data, healthy_split

    def severity(std, learned=True):
        report = healthy_mlp().model_copy(update={"data": healthy_data(train=healthy_split(input_std=std, input_mean=0.1))})
        if not learned:
            report = report.model_copy(update=train(flat(0, n=60, level=2.3)))
        return {f.rule_id: f.severity for f in diagnose(report).findings}.get("NNDX505")

    assert severity(1.0) is None
    assert severity(6.0) == "info"
    assert severity(6.0, learned=False) == "warning"
    assert severity(60.0) == "warning"


def test_a_schedule_that_runs_out_at_half_the_run_and_sits_at_its_floor_is_misused():
    """Swin's step_update(epoch * num_steps + idx) without ``// accumulation_steps``: its cosine
    (warm-up, then down to lr_min = base / 100, then held) is read at twice the update count and
    runs out at half the run. The same cosine sized to the run, a step decay whose last stage
    is long, and a short cool-down at the floor are recipes."""
    import math

    from nndx.report import LRPoint

    def cosine(sized: int, steps: int = 400, floor: float = 0.01, warmup: int = 20) -> list[float]:
        return [min(1.0, (i + 1) / warmup) if i < warmup else
                floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warmup) / (sized - warmup))))
                for i in range(steps)]  # fmt: skip

    def found(lrs: list[float]) -> bool:
        return "NNDX307" in _found(with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i, lr in enumerate(lrs)]))

    assert found(cosine(sized=200))  # read twice as fast: the floor from step 200 of 400
    assert not found(cosine(sized=400))
    assert not found(cosine(sized=380))  # a cool-down of 5% at the floor
    assert not found(cosine(sized=200, floor=0.3))  # a floor that high still trains
    assert not found([1.0] * 100 + [0.1] * 100 + [0.01] * 200)  # a step decay whose last stage is half the run


def test_a_cosine_schedule_sized_in_epochs_and_stepped_per_batch_cycles():
    """kuangliu/pytorch-cifar's CosineAnnealingLR(T_max=epochs) stepped every batch: the LR
    climbs back to its peak every 2 * T_max batches. Warm restarts (a jump back), a cyclic
    LR (never under 10%), one cycle and a cosine sized in batches do not cycle so."""

    def fires(lrs):
        return "NNDX307" in _found(with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i, lr in enumerate(lrs)]))

    t_max, steps = 8, 240
    cosine = [0.05 * (1 + math.cos(math.pi * t / t_max)) for t in range(steps)]
    assert fires(cosine)
    assert fires(cosine[::5])  # sampled every 5th step: still climbs through the middle
    restarts = [0.05 * (1 + math.cos(math.pi * (t % 40) / 40)) for t in range(steps)]  # SGDR, T_0 = 40
    cyclic = [0.001 + 0.005 * (1 - abs((t % 40) / 20 - 1)) for t in range(steps)]  # CyclicLR's defaults
    one_cycle = [0.1 * (0.04 + 0.96 * math.sin(math.pi * t / steps)) for t in range(steps)]
    sized_in_batches = [0.05 * (1 + math.cos(math.pi * t / steps)) for t in range(steps)]
    assert not any(fires(lrs) for lrs in (restarts, cyclic, one_cycle, sized_in_batches))


def test_a_linear_decay_stepped_past_its_end_takes_the_lr_below_zero():
    """CycleGAN's LambdaLR(1 - max(0, epoch - decay_start) / (epochs - decay_start)) stepped per
    batch: the LR crosses zero and the optimizer climbs the loss, which blows up. The negative
    LR is the root; the blow-up is its symptom. A decay that stops at zero is the collapse."""
    from nndx.report import DiagnosticReport, LoopStats, LRPoint

    from .reports import points

    steps = list(range(0, 400, 5))
    lrs = [2e-4 * (1 - s / 200) for s in steps]  # zero at step 200, -2e-4 at the end
    losses = [0.5 - 0.001 * i for i in range(200)] + [0.3 * 1.05 ** i for i in range(200)]

    def found(lr_values):
        loop = LoopStats(steps=400, lr_history=[LRPoint(step=s, lrs=[lr]) for s, lr in zip(steps, lr_values)])
        return diagnose(DiagnosticReport(loss_history={"train": points(losses)}, loop=loop))

    crossed = found(lrs)
    top = crossed.top()
    assert (top.rule_id, top.severity) == ("NNDX307", "error") and "negative" in top.symptom
    assert {"NNDX104"} <= set(top.explains)
    stopped = next(f for f in found([max(lr, 0.0) for lr in lrs]).findings if f.rule_id == "NNDX307")
    assert stopped.severity == "warning" and "negative" not in stopped.symptom


def test_a_softmax_module_beside_logits_measured_at_the_loss_is_no_double_softmax():
    """MemN2N keeps an nn.Softmax for a second output the loss never reads: the cross-entropy's
    input was measured (rows off the simplex, values to -2.5e4), so the module is not what reached it.
    Unmeasured, the model's last Softmax still counts."""
    from nndx.report import LossCall

    from .broken import loss_call

    softmax_model = BASE.model.model_copy(update={"output_activation": "Softmax"})
    measured = with_loop(BASE, loss_calls=[loss_call(output_min=-25137.0, output_max=3157.0)])
    assert "NNDX314" not in _found(measured.model_copy(update={"model": softmax_model}))
    unmeasured = with_loop(BASE, loss_calls=[LossCall(loss_type="CrossEntropyLoss", output_shape=[32, 10])])
    assert "NNDX314" in _found(unmeasured.model_copy(update={"model": softmax_model}))


def test_gradients_at_a_softmax_output_are_not_the_last_layers():
    """REINFORCE's policy ends in a softmax: the gradient at its probabilities is R / p, 1e5 for an
    unlikely action, against 21 at the first Linear. The network's own last layer (the Linear
    feeding the softmax) is what the first is compared with. A real vanishing still fires."""
    from nndx.report import LayerStats

    from .reports import act, grad

    def layer(name, kind, norm):
        return LayerStats(name=name, type=kind, step=300, activation=act(), gradient=grad(norm))

    def vanishing(first):
        layers = [layer("affine1", "Linear", first), layer("relu", "ReLU", 15.0), layer("affine2", "Linear", 5.0),
                  layer("softmax", "Softmax", 3.5e5)]  # fmt: skip
        return [f for f in diagnose(DiagnosticReport(layers=layers)).findings if f.rule_id == "NNDX203"]

    assert vanishing(21.0) == []
    assert "affine2" in vanishing(1e-4)[0].symptom


def test_a_model_of_several_inputs_is_fed_at_its_best_fed_input_layer():
    """A Temporal Fusion Transformer starts with three embeddings: the series id's gets 8e-4 of
    the output layer's gradient norm 1.7 (one row per series, through many gates), the category's
    0.015. The input end is fed; when every early layer starves it still fires."""
    from nndx.report import LayerStats

    from .reports import act, grad

    def layer(name, kind, norm):
        return LayerStats(name=name, type=kind, step=300, activation=act(), gradient=grad(norm))

    def vanishing(category):
        inputs = [layer("series", "Embedding", 8e-4), layer("category", "Embedding", category),
                  layer("day_of_week", "Embedding", 0.52)]  # fmt: skip
        body = [layer(f"block{i}.fc", "Linear", 0.05 + 0.1 * i) for i in range(25)]
        layers = inputs + body + [layer("output_layer", "Linear", 1.7)]
        return [f for f in diagnose(DiagnosticReport(layers=layers)).findings if f.rule_id == "NNDX203"]

    assert vanishing(0.015) == []
    assert vanishing(1e-4)[0].evidence["first_layer"] == "series"


@pytest.mark.parametrize("val_accuracy, severity", [(0.74, "info"), (0.16, "error")])
def test_a_stand_in_that_finds_no_signal_is_refuted_by_a_run_that_generalises(val_accuracy, severity):
    """PointNet on point sets, GraphSAGE on node ids: the data probes' MLP on the raw inputs finds
    nothing, so labels look misaligned. The run's own model reaching 0.74 validation accuracy on 7
    classes is what misaligned labels never allow; at chance it is the evidence itself."""
    from nndx.report import LabelAlignmentResult, LabelNoiseResult, Probes

    from .reports import points

    probes = Probes(label_alignment=LabelAlignmentResult(status="failed", real_accuracy=0.15, permuted_accuracy=0.14,
                                                         chance_accuracy=1 / 7),
                    label_noise=LabelNoiseResult(status="failed", noise_fraction=0.85, noise_lower_bound=0.8,
                                                 disagreement_fraction=0.86, confident_samples=40, samples=240))
    val = points([1.2] * 6, [val_accuracy] * 6, every=20)
    report = DiagnosticReport(num_classes=7, probes=probes, loss_history={"val": val})
    found = {f.rule_id: f for f in diagnose(report).findings}
    assert found["NNDX610"].severity == severity and found["NNDX612"].severity == severity
    assert found["NNDX612"].code.value == "LABELS_MISALIGNED"
    # PointNet's report: the classes known from the data checks only (its loss is nll_loss in a lambda)
    from .reports import healthy_data, healthy_split

    four = healthy_data(expected_num_classes=None, test=None,
                        train=healthy_split(n=240, class_counts={str(c): 60 for c in range(4)}))
    pointnet = report.model_copy(update={"num_classes": None, "data": four, "probes": probes.model_copy(update={
        "label_noise": probes.label_noise.model_copy(update={"noise_fraction": 0.75, "noise_lower_bound": 0.66})})})
    noise = next(f for f in diagnose(pointnet).findings if f.rule_id == "NNDX612")
    assert noise.code.value == "LABELS_MISALIGNED" and noise.severity == ("info" if val_accuracy > 0.5 else "error")



@pytest.mark.parametrize("train_losses, severity", [([1.61 - 0.02 * i for i in range(60)], "info"),
                                                     ([1.61, 1.60] * 30, "warning")])
def test_chance_disagreement_the_alignment_probe_could_not_decide_is_not_an_error(train_losses, severity):
    """DeepSets on point clouds (manzilzaheer/DeepSets): the label-noise probe's MLP on the raw
    points disagrees with 84% of its confident predictions (chance: 80%), and the label-alignment
    probe, the same stand-in against permuted labels, could not decide (0.213 vs 0.223). The
    stand-in reads nothing in a set of points; the run's loss falling 1.61 -> 0.41 says the labels
    carry signal. A run whose loss stays at ln 5 leaves the candidate standing, as a warning."""
    from nndx.report import LabelAlignmentResult, LabelNoiseResult, Probes

    from .reports import points

    probes = Probes(label_alignment=LabelAlignmentResult(status="skipped", real_accuracy=0.213,
                                                         permuted_accuracy=0.223, chance_accuracy=0.2),
                    label_noise=LabelNoiseResult(status="failed", noise_fraction=0.84, noise_lower_bound=0.79,
                                                 disagreement_fraction=0.81, confident_samples=160, samples=640))
    report = DiagnosticReport(num_classes=5, probes=probes, loss_history={"train": points(train_losses)})
    noise = next(f for f in diagnose(report).findings if f.rule_id == "NNDX612")
    assert noise.code.value == "LABELS_MISALIGNED" and noise.severity == severity
    # a stand-in that reads nothing is weak evidence: a schedule stepped per batch that decayed the
    # LR from the first batches on (DeepSets' MultiStepLR) is the direct one and ranks first
    from nndx.report import LoopStats, LRPoint

    decayed = report.model_copy(update={"loop": LoopStats(lr_history=[
        LRPoint(step=i, lrs=[1e-3 * 0.1 ** min(2, i // 2)]) for i in range(len(train_losses))])})
    if severity == "warning":
        codes = [f.rule_id for f in diagnose(decayed).findings if f.severity != "info"]
        assert codes.index("NNDX307") < codes.index("NNDX612")
    # the alignment probe failed (enough samples to see a gain, none seen): the error stands
    failed = report.model_copy(update={"probes": probes.model_copy(update={
        "label_alignment": probes.label_alignment.model_copy(update={"status": "failed"})})})
    assert next(f for f in diagnose(failed).findings if f.rule_id == "NNDX612").severity == "error"


def test_a_binary_classifier_has_two_classes_from_its_loss_alone():
    """TabTransformer with float 0/1 labels (no class counts in the data checks) and
    BCEWithLogitsLoss on one logit per row: half the confident predictions disagreeing is
    what labels drawn at random give two classes."""
    from nndx.report import LabelNoiseResult, LossCall, LoopStats, Probes

    noise = LabelNoiseResult(status="failed", noise_fraction=0.49, noise_lower_bound=0.46, disagreement_fraction=0.49,
                             confident_samples=600, samples=2400)  # fmt: skip
    calls = [LossCall(loss_type="BCEWithLogitsLoss", output_shape=[256], target_shape=[256],
                      target_dtype="torch.float32")]  # fmt: skip
    report = DiagnosticReport(probes=Probes(label_noise=noise), loop=LoopStats(loss_calls=calls))
    assert next(f for f in diagnose(report).findings if f.rule_id == "NNDX612").code.value == "LABELS_MISALIGNED"
    many = report.model_copy(update={"loop": LoopStats(loss_calls=[calls[0].model_copy(update={"output_shape": [256, 5]})])})
    assert next(f for f in diagnose(many).findings if f.rule_id == "NNDX612").code.value == "LABEL_NOISE"


def test_a_broadcast_that_adds_no_elements_is_harmless():
    """CycleGAN at its batch size of 1: the discriminator's [1, 1] against a [1] target. The
    shapes differ but each output meets its own target; at [32, 1] against [32] the loss
    compares every output with every target."""
    from nndx.report import LoopStats, LossCall

    def nndx312(out, target):
        call = LossCall(loss_type="MSELoss", output_shape=out, target_shape=target, target_dtype="float32")
        found = diagnose(DiagnosticReport(loop=LoopStats(loss_calls=[call]))).findings
        return [f.rule_id for f in found if f.rule_id == "NNDX312"]

    assert nndx312([1, 1], [1]) == []
    assert nndx312([32, 1], [32]) == ["NNDX312"]
    assert nndx312([32, 3], [32]) == ["NNDX312"]  # does not broadcast at all: torch raises
    assert nndx312([32, 4], [32, 1]) == ["NNDX312"]  # each target repeated over 4 outputs


def test_parameters_without_gradient_in_a_discarded_head_vs_a_cut_graph():
    """BYOL taps a backbone's pooled features and never reads its classifier: no gradient
    reaches the classifier, and nothing is wrong with the training. The same missing
    gradients in a module whose value the loss does read (a .detach()) are a cut graph."""
    grad_none = with_loop(BASE, params_grad_none=["2.weight", "2.bias"])
    assert _found(grad_none)["NNDX304"].severity == "warning"
    discarded = grad_none.model_copy(update={"model": mlp_model(unused_modules=["2"])})
    assert _found(discarded)["NNDX304"].severity == "info"
    partly = grad_none.model_copy(update={"model": mlp_model(unused_modules=["0"])})
    assert _found(partly)["NNDX304"].severity == "warning"
    # a parameter the forward never read (GIN's eps with learn_eps off), named on its own
    unread = with_loop(BASE, params_grad_none=["eps"]).model_copy(update={"model": mlp_model(unused_modules=["eps"])})
    assert _found(unread)["NNDX304"].severity == "info"


def test_an_optimizer_over_this_model_and_another_vs_one_over_another_model_only():
    """SAC builds one Adam over both Q networks: probed alone, each is wholly in the optimizer."""
    shared = with_loop(BASE, optimizer_params_not_in_model=6)
    assert "NNDX303" not in _found(shared)
    names = [p.name for p in BASE.parameters]
    elsewhere = with_loop(BASE, params_not_in_optimizer=names, optimizer_params_not_in_model=6)
    assert _found(elsewhere)["NNDX303"].severity == "error"


def test_parameters_a_second_optimizer_trains_are_not_disconnected():
    """CompressAI: the entropy bottleneck's quantiles are in the aux optimizer, not the main one
    the user handed nndx. Before training (the preflight) the main loss sends them no gradient:
    they are no parameters of this loss; in the Monitor's final report they moved though the
    watched optimizer does not hold them: something else trains them. Context, not an error. A
    parameter outside the optimizer that gets the loss's gradient, or never moved, is still one."""
    names = [p.name for p in BASE.parameters]
    extra = BASE.parameters[-1].model_copy(update={"name": "eb.quantiles", "grad_norm": None, "update_ratio": None})
    preflight = with_loop(BASE, params_not_in_optimizer=["eb.quantiles"]).model_copy(
        update={"parameters": [*BASE.parameters, extra]})
    assert _found(preflight)["NNDX303"].severity == "info"
    with_gradient = preflight.model_copy(update={"parameters": [*BASE.parameters,
                                                               extra.model_copy(update={"grad_norm": 0.3})]})
    assert _found(with_gradient)["NNDX303"].severity == "error"
    # recorded at two steps, without a gradient at one only (before its first backward): it gets the loss's
    later = extra.model_copy(update={"grad_norm": 0.3, "step": 10})
    once = preflight.model_copy(update={"parameters": [*preflight.parameters, later]})
    assert _found(once)["NNDX303"].severity == "error"
    moved = with_loop(BASE, params_not_in_optimizer=["eb.quantiles"], params_never_changed=[])
    assert _found(moved)["NNDX303"].severity == "info"
    still = with_loop(BASE, params_not_in_optimizer=["eb.quantiles"], params_never_changed=["eb.quantiles"])
    assert _found(still)["NNDX303"].severity == "error"
    assert _found(with_loop(BASE, params_not_in_optimizer=names, params_never_changed=names))["NNDX303"].severity \
        == "error"


def test_tensors_trained_by_no_optimizer_outside_the_parameters_are_not_connected():
    """A Mixture-of-Experts gate kept as nn.Parameter(...).to(device): its copy is an attribute, the
    Parameter behind it gets every gradient and no optimizer step."""
    orphaned = with_loop(BASE, unregistered_params=["w_gate", "w_noise"])
    finding = _found(orphaned)["NNDX303"]
    assert finding.severity == "error" and finding.evidence["unregistered_params"] == ["w_gate", "w_noise"]
    assert "no registered parameter" in finding.symptom
    assert "NNDX303" not in _found(with_loop(BASE, unregistered_params=[]))


def test_an_output_activation_is_judged_against_the_targets_extremes_not_only_their_spread():
    """pix2pix: Tanh images in [-1, 1], mostly background at -1 (mean - std < -1 though no
    target lies below -1): healthy. Pixels in [0, 255] through a Sigmoid cannot be reached."""

    def fired(activation: str, **target) -> bool:
        split = healthy_split(label_kind="float_continuous", class_counts={}, label_runs_fraction=None, **target)
        report = with_loop(BASE, loss_calls=[]).model_copy(update={
            "task": "regression", "model": mlp_model(output_activation=activation),
            "data": healthy_data(train=split, test=None)})  # fmt: skip
        return "NNDX402" in _found(report)

    assert not fired("Tanh", target_mean=-0.39, target_std=0.637, target_min=-1.0, target_max=1.0)
    assert fired("Tanh", target_mean=-0.39, target_std=0.637, target_min=-1.6, target_max=1.0)
    assert fired("Tanh", target_mean=-0.39, target_std=0.637)  # extremes not measured: the spread decides
    assert fired("Sigmoid", target_mean=120.0, target_std=60.0, target_min=0.0, target_max=255.0)
    assert not fired("Sigmoid", target_mean=0.2, target_std=0.3, target_min=0.0, target_max=1.0)


def test_without_data_checks_the_targets_the_loss_was_given_are_judged_against_the_output_activation():
    """uvadlc's autoencoder given a Sigmoid in place of its Tanh, its images still in [-1, 1], and a
    loss of its own (summed MSE): no data checks ran, but the probes' loss call saw the targets. A
    classification loss's targets, or targets shaped unlike the outputs, say nothing of their range."""
    from .broken import loss_call

    def fired(activation: str, **call) -> bool:
        fields = dict(loss_type="reconstruction_loss", output_shape=[256, 1, 16, 16], target_shape=[256, 1, 16, 16],
                      target_dtype="torch.float32", output_min=0.5, output_max=0.53, target_mean=-0.38,
                      target_std=0.64, target_min=-1.0, target_max=1.0) | call  # fmt: skip
        report = with_loop(BASE, loss_calls=[loss_call(**fields)]).model_copy(update={
            "task": "regression", "model": mlp_model(output_activation=activation), "data": None})  # fmt: skip
        return "NNDX402" in _found(report)

    assert fired("Sigmoid")
    assert not fired("Tanh")
    assert not fired("Sigmoid", target_mean=0.3, target_std=0.3, target_min=0.0, target_max=1.0)
    assert not fired("Sigmoid", loss_type="BCELoss", target_mean=0.5, target_std=0.5, target_min=0.0, target_max=1.0)
    assert not fired("Sigmoid", target_shape=[256])  # one target per sample: not the outputs' values


def test_an_lr_several_times_above_the_range_where_the_sweep_trains_well_that_killed_units_is_the_root():
    """crnn.pytorch with Adam at its default 1e-2: the range test trains well up to 1.2e-3,
    diverges only at 0.74; in training half the units of a ReLU layer died (no update ratio
    looked huge), and the loss stalled on CTC's blank plateau."""
    from nndx.report import LRRangeResult, Probes

    from .reports import mlp_params, points

    sweep = LRRangeResult(status="passed", suggested_lr=5.8e-4, interval_low_lr=2.9e-4, interval_high_lr=1.2e-3,
                          diverged_at_lr=0.74, min_over_10_lr=1.8e-3)  # fmt: skip
    stalled = [24.0, 21.0, 10.0, 7.0] + [4.7 + 0.1 * ((-1) ** i) for i in range(97)]

    def found(lr, dead_at_end):
        report = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i in range(0, 101, 10)]).model_copy(
            update={"layers": mlp_layers(steps=(0, 50), dead=0.0) + mlp_layers(steps=(100,), dead=dead_at_end),
                    "parameters": mlp_params(ratio=0.01), "probes": Probes(lr_range=sweep),
                    "loss_history": {"train": points(stalled)}})  # fmt: skip
        return _found(report)

    died = found(1e-2, 0.7)
    assert died["NNDX602"].code.value == "LR_TOO_HIGH" and died["NNDX602"].severity == "warning"
    assert died["NNDX208"].explained_by == "NNDX602"
    assert "NNDX602" not in found(1e-2, 0.0)  # above the interval, but nothing was harmed
    assert "NNDX602" not in found(1.5e-3, 0.7)  # within the range test's reading


def test_an_lr_above_the_range_whose_loss_jumped_then_settled_at_chance_is_the_root():
    """LLMs-from-scratch ch06 with AdamW at 3e-2 (the chapter's issue #335): the range test
    trains well up to 8.9e-3; the run's loss jumped from 0.99 to 3.75 on its second step,
    swung, then settled at ln 2 for good: the classifier collapsed to a constant prediction,
    with no NaN and no ReLU to die. Within the range, a run stuck at chance from the start
    (no jump), or a run that learned after its jump is left alone."""
    from nndx.report import LRRangeResult, Probes

    from .reports import mlp_params, points

    sweep = LRRangeResult(status="passed", suggested_lr=4.5e-3, interval_low_lr=2.2e-3, interval_high_lr=8.9e-3,
                          diverged_at_lr=1.56, min_over_10_lr=2e-2)  # fmt: skip
    jumped = [0.985, 3.75, 0.73, 0.66, 0.59, 1.67, 0.61, 0.80, 0.72, 0.83, 0.67, 0.81, 0.46, 1.69, 0.71]
    collapsed = jumped + [0.6931 + 0.002 * ((-1) ** i) for i in range(150)]
    learned = jumped + [0.6 * math.exp(-i / 40) + 0.05 for i in range(150)]
    flat_from_start = [0.6931 + 0.002 * ((-1) ** i) for i in range(165)]

    def found(lr: float, run: list[float]) -> dict:
        report = with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[lr]) for i in range(0, 161, 10)]).model_copy(
            update={"num_classes": 2, "parameters": mlp_params(ratio=0.004), "probes": Probes(lr_range=sweep),
                    "loss_history": {"train": points(run)}})  # fmt: skip
        return _found(report)

    high = found(3e-2, collapsed)
    assert high["NNDX602"].code.value == "LR_TOO_HIGH" and high["NNDX602"].severity == "warning"
    assert high["NNDX106"].explained_by == "NNDX602"
    assert "NNDX602" not in found(1e-2, collapsed)  # within the range test's reading
    assert "NNDX602" not in found(3e-2, learned)
    assert "NNDX602" not in found(3e-2, flat_from_start)


def test_misplaced_targets_say_where_they_sit():
    from nndx.report import CausalityResult, Probes

    def symptom(offset: int) -> str:
        result = CausalityResult(status="failed", unshifted=False, target_offset=offset, next_fraction=0.02)
        return next(f.symptom for f in diagnose(DiagnosticReport(probes=Probes(causality=result))).findings
                    if f.rule_id == "NNDX613")  # fmt: skip

    assert "input token 2 positions ahead" in symptom(2)
    assert "input token 1 position back" in symptom(-1)


def test_a_uniform_softmax_at_the_first_step_is_no_dead_layer():
    """AutoInt's attention over 8 fields at DeepCTR's init: scores near 0, so every weight is
    exactly 1/8 at the first step, the same for every sample. Training moves it; a constant
    Linear output is still bad init."""
    from nndx.report import LayerStats

    from .reports import act

    def with_first(layer: LayerStats) -> DiagnosticReport:
        layers = mlp_layers()
        return BASE.model_copy(update={"layers": layers[:1] + [layer] + layers[1:]})

    uniform = LayerStats(name="attention:softmax#0", type="Softmax", step=0,
                         activation=act(mean=0.125, std=0.0, zero=0.0, dead=0.0, units=8))  # fmt: skip
    assert "NNDX207" not in _found(with_first(uniform))
    constant = uniform.model_copy(update={"name": "proj", "type": "Linear"})
    assert "NNDX207" in _found(with_first(constant))


def test_a_learning_rate_of_zero_at_every_step_is_the_schedule_not_a_disconnected_optimizer():
    """A warm-up never stepped (Hugging Face's LambdaLR at 0 / warmup until its first step) or
    LARS built with lr=0 waiting for an adjust_learning_rate the loop dropped: every recorded LR
    is 0, nothing moves. The zero LR is the cause; the unchanged parameters are its symptom. A
    warm-up from 0 that does rise is healthy."""
    from nndx.report import DiagnosticReport, LoopStats, LRPoint

    from .reports import points

    losses = [2.0 + 0.01 * math.sin(i) for i in range(60)]

    def found(lrs):
        loop = LoopStats(steps=60, lr_history=[LRPoint(step=5 * i, lrs=[lr]) for i, lr in enumerate(lrs)],
                         params_never_changed=["fc.weight", "fc.bias"], scheduled_lrs=[1e-3])  # fmt: skip
        return diagnose(DiagnosticReport(loss_history={"train": points(losses)}, loop=loop))

    top = found([0.0] * 12).top()
    assert (top.rule_id, top.code.value, top.severity) == ("NNDX307", "LR_SCHEDULE_MISUSE", "error")
    assert "0 at every" in top.symptom and "NNDX322" in top.explains
    warming = found([1e-3 * min(1.0, i / 4) for i in range(12)])
    assert not [f for f in warming.findings if f.rule_id == "NNDX307"]


def test_a_learning_rate_of_zero_for_a_stretch_of_the_run_is_the_schedule():
    """ConvNeXt's cosine schedule with warm-up is a list of per-iteration LRs; read at
    ``[epoch]`` instead of ``[iteration]`` the whole first epoch trains at 0 (11 of 88 records)
    and the rest climbs a staircase: no branch of NNDX307 fired, though the live alarm had. A
    warm-up from 0 (one record at 0) and a cosine decay that reaches 0 at its last step do not."""
    from nndx.report import DiagnosticReport, LoopStats, LRPoint

    from .reports import points

    losses = [2.3 * math.exp(-i / 40) + 0.2 for i in range(176)]

    def found(lrs):
        loop = LoopStats(steps=176, lr_history=[LRPoint(step=2 * i, lrs=[lr]) for i, lr in enumerate(lrs)])
        report = DiagnosticReport(loss_history={"train": points(losses)}, loop=loop)
        return next((f for f in diagnose(report).findings if f.rule_id == "NNDX307"), None)

    staircase = [0.0] * 11 + [6.7e-4 * (1 + k // 11) / 7 for k in range(77)]
    hit = found(staircase)
    assert hit is not None and "exactly 0" in hit.symptom and hit.severity == "info"  # the loss still learned
    assert found([2e-3 * min(1.0, i / 11) for i in range(88)]) is None
    assert found([1e-3 * (1 + math.cos(math.pi * i / 87)) / 2 for i in range(88)]) is None


def test_labels_beside_a_generative_loss_are_counted_by_the_label_noise_probe_itself():
    """A conditional VAE trained on a reconstruction loss: the run names no classes, but its
    digit labels (the condition) went through the label-noise probe, which counted ten. 91% of
    them disagreeing is what labels shuffled apart from their images give ten classes; 40% is
    noise."""
    from nndx.report import LabelNoiseResult, Probes

    def found(fraction):
        noise = LabelNoiseResult(status="failed", noise_fraction=fraction, noise_lower_bound=fraction - 0.03,
                                 disagreement_fraction=fraction, confident_samples=359, samples=1437,
                                 classes=10)  # fmt: skip
        return next(f for f in diagnose(DiagnosticReport(probes=Probes(label_noise=noise))).findings
                    if f.rule_id == "NNDX612")  # fmt: skip

    assert found(0.91).code.value == "LABELS_MISALIGNED" and found(0.91).severity == "error"
    assert found(0.4).code.value == "LABEL_NOISE"


def test_gradients_growing_from_near_zero_while_the_loss_falls_are_learning_not_an_explosion():
    """A pointer network's attention scores start uniform: its gradient norm is 2e-4 at init
    and 1.1 once it learns (2,000x) while the loss falls from 2.0 to 0.5. The same growth
    beside a loss that does not fall is an explosion."""
    from nndx.report import LoopStats

    from .reports import points

    norms = [GradNormPoint(step=5 * i, before_clip=2e-4 * 1.2**i) for i in range(48)]

    def found(losses):
        loop = LoopStats(steps=240, grad_norm_history=norms)
        return _found(DiagnosticReport(loss_history={"train": points(losses)}, loop=loop))

    assert "NNDX204" not in found([2.0 * 0.25 ** (i / 239) for i in range(240)])
    assert "NNDX204" in found([2.0 + 0.05 * math.sin(i) for i in range(240)])


@pytest.mark.parametrize("end_ratio", [1e-3, 0.05])
def test_gradients_growing_under_steps_an_adaptive_optimizer_keeps_small_are_no_explosion(end_ratio):
    """ACGAN's discriminator under Adam: the gradient norm grows from 2e-6 at init to 1 while the
    adversarial loss stays level, and every step stays ~1e-3 of the weights (Adam divides the
    gradient's scale out). Growth that makes the steps large (SGD's) is an explosion."""
    from nndx.report import LoopStats

    from .reports import mlp_params, points

    norms = [GradNormPoint(step=5 * i, before_clip=2e-6 * 1.35**i) for i in range(48)]
    loop = LoopStats(steps=240, grad_norm_history=norms)
    losses = points([1.4 + 0.05 * math.sin(i) for i in range(240)])
    params = mlp_params(steps=(0, 60, 120, 180, 235), ratio=end_ratio)
    found = _found(DiagnosticReport(loss_history={"train": losses}, loop=loop, parameters=params))
    assert ("NNDX204" in found) == (end_ratio > 0.01)


def test_the_calls_of_one_functional_activation_saturated_together_are_one_finding():
    """A decoder unrolled over 10 steps calls attn.forward's tanh 10 times (tanh#0 ... tanh#9):
    one finding for the module's tanh, the most saturated call named, the others counted."""
    from .broken import BROKEN

    broken = BROKEN["NNDX209"]()
    tanh = [layer for layer in broken.layers if layer.type == "Tanh"]
    names = sorted({layer.name for layer in tanh})
    calls = [layer.model_copy(update={"name": f"attn.forward:tanh#{k}", "activation": layer.activation.model_copy(
        update={"saturated_fraction": min(1.0, layer.activation.saturated_fraction + 0.01 * k)})})
        for k in range(10) for layer in tanh if layer.name == names[0]]  # fmt: skip
    report = broken.model_copy(update={"layers": [layer for layer in broken.layers if layer.type != "Tanh"] + calls})
    found = [f for f in diagnose(report).findings if f.rule_id == "NNDX209"]
    assert len(found) == 1 and found[0].evidence["calls"] == 10 and "tanh#9" in found[0].symptom


def test_a_small_head_without_gradient_explains_no_loss_stuck_at_chance():
    """2 of 28 parameter tensors (a head that ran, say JEM's energy head had it been called)
    get no gradient while the loss stays at ln 10 (labels drawn from another loader). The cut
    head is true and named, but the rest of the model trains: it explains no stuck loss. Most
    of the model without gradient does."""
    from nndx.report import ParameterStats

    from .broken import flat, train, update

    blocks = [ParameterStats(name=f"blocks.{i}.weight", shape=[8, 8], step=0, weight_norm=1.0, grad_norm=0.1,
                             update_ratio=1e-3) for i in range(20)]  # fmt: skip

    def found(grad_none):
        report = with_loop(update(**train(flat(0, level=math.log(10)))), params_grad_none=grad_none)
        return _found(report.model_copy(update={"parameters": report.parameters + blocks}))

    head = found(["energy_output.weight", "energy_output.bias"])
    assert head["NNDX304"].severity == "warning" and head["NNDX106"].explained_by != "NNDX304"
    assert found([f"blocks.{i}.weight" for i in range(20)])["NNDX106"].explained_by == "NNDX304"


def test_parameters_of_a_layer_the_monitor_never_saw_run_are_an_unused_head():
    """JEM's CCF holds an energy head its forward never calls: its parameters get no gradient
    and the Monitor (which hooks every leaf layer) never saw it run. That is an unused head;
    a layer that ran and got no gradient is a cut graph."""
    report = with_loop(BASE, params_grad_none=["energy_output.weight", "energy_output.bias"])
    never = report.model_copy(update={"loop": report.loop.model_copy(update={"layers_never_run": ["energy_output"]})})
    assert _found(never)["NNDX304"].severity == "info"
    assert _found(report)["NNDX304"].severity == "warning"


def test_the_ops_between_the_models_output_and_the_loss_name_what_the_loop_did_to_the_outputs():
    def found(*paths):
        return _found(with_loop(BASE, ops_before_loss=[list(p) for p in paths]))

    # Co-teaching's probabilities through an index into F.cross_entropy; a sigmoid before BCE with logits
    assert found(("Addmm", "Softmax", "Index", "LogSoftmax", "NllLoss", "Div"))["NNDX314"].code.value == "DOUBLE_SOFTMAX"
    assert "NNDX314" in found(("Convolution", "Sigmoid", "View", "BinaryCrossEntropyWithLogits", "Mean"))
    # probabilities into NLL; a ReLU on log-probabilities
    assert found(("Addmm", "Softmax", "NllLoss"))["NNDX315"].code.value == "WRONG_LOSS"
    assert "NNDX315" in found(("Convolution", "Softmax", "NllLoss2D", "Mean"))
    assert found(("LogSoftmax", "Relu", "Add", "Sum"))["NNDX329"].code.value == "WRONG_OUTPUT_ACTIVATION"
    # healthy loops that look alike: log of the softmax, log_softmax into NLL or KL, a temperature between,
    # probabilities compared with MSE, a ReLU on logits the loss takes as they are, softmax after log_softmax
    healthy = found(("Addmm", "Softmax", "Log", "NllLoss"), ("Addmm", "LogSoftmax", "NllLoss", "Mean"),
                    ("Addmm", "Div", "LogSoftmax", "Mul#1", "Sub#1"), ("Addmm", "Softmax", "MseLoss"),
                    ("Addmm", "Relu", "LogSoftmax", "NllLoss"), ("Addmm", "Softmax", "Mul", "LogSoftmax", "NllLoss"),
                    ("LogSoftmax", "Exp", "Relu", "Sum"),
                    ("Addmm", "Sigmoid", "BinaryCrossEntropyWithLogits#1"))  # fmt: skip  # soft targets in the graph
    assert not {"NNDX314", "NNDX315", "NNDX329"} & set(healthy), healthy


def test_gradients_masked_by_hand_are_weighed_by_the_share_of_live_weights_they_freeze():
    def masked(share):
        return _found(with_loop(BASE, grads_masked_by_hand={"fc.weight": share})).get("NNDX330")

    assert masked(0.44).severity == "warning" and masked(0.44).code.value == "FROZEN_PARAMETERS"
    assert masked(0.01).severity == "info"
    assert masked(3e-5) is None  # a weight or two a pruning threshold (abs(w) < eps) catches beside the pruned


def test_big_updates_with_no_gradient_from_the_loss_are_weight_decay_not_the_lr():
    """Evidential learning's relu of log-probabilities sends no gradient: Adam's weight decay alone
    makes updates of 0.14 of the weights. The LR is not why; the same updates with gradients are."""
    from .broken import big_updates

    def norms(value):
        return [GradNormPoint(step=s, before_clip=value) for s in range(0, 50, 5)]

    unprobed = big_updates()  # no LR range test to excuse the LR
    gradless = _found(with_loop(unprobed, grad_norm_history=norms(0.0)))["NNDX205"]
    assert gradless.severity == "info" and gradless.refuted and "weight decay" in gradless.symptom
    assert _found(with_loop(unprobed, grad_norm_history=norms(0.8)))["NNDX205"].severity == "warning"


def test_a_flat_loss_is_not_an_lr_too_low_when_the_measured_steps_are_large():
    """AWD-LSTM's healthy SGD phase at lr 30 (a short run, a loss down 5%) had LR_TOO_HIGH and
    LR_TOO_LOW warnings at once; measured steps of 0.8 of the weights are not too small."""
    from .broken import big_updates
    from .reports import mlp_params

    unprobed = big_updates()  # no LR range test to excuse the LR
    large = _found(unprobed)
    assert large["NNDX103"].severity == "info" and large["NNDX103"].refuted and "steps are large" in large["NNDX103"].symptom
    assert large["NNDX205"].severity in ("warning", "error")
    small = _found(unprobed.model_copy(update={"parameters": mlp_params(ratio=1e-4)}))
    assert small["NNDX103"].severity == "warning" and not small["NNDX103"].refuted


def test_exactly_zero_gradients_at_every_step_fire_and_a_zero_start_or_a_gradless_step_does_not():
    from .broken import zero_hidden_bias_gradients
    from .reports import mlp_params

    assert _found(zero_hidden_bias_gradients())["NNDX210"].severity == "warning"
    params = mlp_params(steps=tuple(range(0, 100, 10)))
    # LoRA's A or DiT's modulations: no gradient until the zero layer after them moved
    late = [p.model_copy(update={"grad_norm": 0.0}) if p.name == "2.weight" and p.step == 0 else p for p in params]
    assert "NNDX210" not in _found(BASE.model_copy(update={"parameters": late}))
    # a step at which no parameter got a gradient (a masked-out batch) says nothing about any one of them
    gradless = [p.model_copy(update={"grad_norm": 0.0}) if p.step in (0, 10, 20) else p for p in params]
    assert "NNDX210" not in _found(BASE.model_copy(update={"parameters": gradless}))
    # one tensor of many that the loss never weighs (an auxiliary head at weight 0), beside a loss that learns
    wide = params + [p.model_copy(update={"name": f"block{i}.{p.name}"}) for i in range(2) for p in params]
    aux = [p.model_copy(update={"grad_norm": 0.0}) if p.name == "block1.4.bias" else p for p in wide]
    assert _found(BASE.model_copy(update={"parameters": aux}))["NNDX210"].severity == "info"
    # MelGAN's critics: the hinge loss over as many real as fake samples, every output inside the margin,
    # gives the last bias mean(1) - mean(1) = 0 exactly while its weight trains, and an adversarial loss
    # need not fall: a bias the loss is invariant to, context. The whole head without gradient is not.
    # (the rule's own verdict: the flat loss's LR_TOO_LOW warning would be linked under it)
    from nndx.rules.layers import zero_gradients

    from .broken import flat, train

    critic = BASE.model_copy(update={"parameters": aux, **train(flat(0, level=1.9, noise=0.05))})
    assert zero_gradients(critic).severity == "info"
    # MelGAN's layers are weight-normalised: the weight trains as weight_g and weight_v
    normed = [p.model_copy(update={"name": p.name.replace("4.weight", "4.weight_v")}) for p in aux]
    assert zero_gradients(critic.model_copy(update={"parameters": normed})).severity == "info"
    head = [p.model_copy(update={"grad_norm": 0.0}) if p.name.startswith("block1.4.") else p for p in wide]
    assert zero_gradients(critic.model_copy(update={"parameters": head})).severity == "warning"


def test_units_that_die_while_batchnorm_trains_in_eval_mode_are_its_symptom():
    """DnCNN with model.train() moved out of the step loop: BatchNorm normalises by its
    initial running statistics while the weights train, and ReLUs die. The eval mode is the
    cause; the dead units rank under it."""
    from .broken import trained_in_eval_mode, units_died

    died = units_died()
    both = with_loop(died, has_batchnorm=True, backward_after_eval_forward=75, first_eval_backward_step=25)
    ranked = diagnose(both).findings
    assert ranked[0].code.value == "EVAL_MODE_FORGOTTEN"
    assert next(f for f in ranked if f.rule_id == "NNDX208").explained_by == ranked[0].rule_id
    assert diagnose(died).top().code.value == "DEAD_RELU"
    assert "NNDX208" not in _found(trained_in_eval_mode())


def test_zero_gradients_behind_weights_initialised_to_zero_are_the_inits_symptom():
    from .broken import bad_init
    from .reports import mlp_params

    # a zero weight matrix and no gradient to move it, at every recorded step
    params = [p.model_copy(update={"weight_norm": 0.0, "grad_norm": 0.0}) if p.name == "2.weight" else p
              for p in mlp_params(steps=tuple(range(0, 100, 10)))]  # fmt: skip
    findings = {f.rule_id: f for f in diagnose(bad_init().model_copy(update={"parameters": params})).findings}
    assert findings["NNDX210"].explained_by == "NNDX207"


def test_an_lr_far_below_the_range_test_is_explained_by_the_schedule_that_put_it_there():
    """outlier-exposure's LambdaLR returning an LR: the LR sits at 1e-6 from the first step, four
    decades under the range test's suggestion. The schedule is the cause; the low LR its symptom."""
    from .broken import BROKEN

    report = BROKEN["NNDX331"]()
    findings = {f.rule_id: f for f in diagnose(report).findings}
    assert findings["NNDX603"].explained_by == "NNDX331", findings


def test_tiny_updates_of_a_model_that_converged_early_are_context():
    """NYU's regression notebook with its nonlinearity dropped: full-batch Adam fits the best line to the
    cubic in 40 of 1,000 steps (0.30 -> 0.029, under an uninformed prediction's loss), then its steps shrink
    to 4e-6 of the weights. Every window after the first is flat: a model that converged, not an LR too low
    (the missing activation is the finding). The same ratios beside a loss that never fell stay a warning."""
    from nndx.rules.layers import update_ratio_low

    from .broken import train
    from .reports import mlp_params

    # (here on a 10-class report: from ln 10 down to a tenth of it within the first window, or stuck at ln 10)
    converged = [0.23 + 2.07 * math.exp(-i / 8) for i in range(1000)]
    stuck = [2.3 - 1e-6 * i for i in range(1000)]
    params = mlp_params(steps=tuple(range(0, 1000, 10)), ratio=3.9e-6)
    for values, severity in ((converged, "info"), (stuck, "warning")):
        report = BASE.model_copy(update={"parameters": params, **train(values)})
        assert update_ratio_low(report).severity == severity


def test_inputs_that_repeat_with_other_labels_are_contexts_not_copies():
    """makemore's MLP given data=: each row is a name's last three characters, the label the
    next one. 85% of the train rows repeat an earlier row, 60% of those with another next
    character, and 83% of the dev rows are in train: a language's contexts recur by nature.
    The same overlap with rows that repeat with their own labels is a leak."""
    from .reports import healthy_data, healthy_split

    def found(conflict: float | None) -> dict:
        train = healthy_split(duplicate_count=18797, duplicate_fraction=0.85, duplicate_label_conflict=conflict)
        test = healthy_split(duplicate_count=1616, duplicate_fraction=0.59, duplicate_label_conflict=conflict)
        data = healthy_data(train=train, test=test, train_test_overlap=2278, train_test_overlap_fraction=0.83)
        return _found(BASE.model_copy(update={"data": data}))

    contexts, copies = found(0.6), found(0.0)
    assert contexts["NNDX502"].severity == "info" and contexts["NNDX503"].severity == "info"
    assert copies["NNDX502"].severity == "error" and copies["NNDX503"].severity == "warning"
    assert found(None)["NNDX502"].severity == "error"  # no labels: nothing says what the rows are


def test_a_language_models_contexts_are_neither_imbalanced_classes_nor_zeroed_samples():
    """makemore's MLP given data=: rows of three character ids, the label the next character.
    Every name starts from the context [0, 0, 0] ('...'), 11% of the rows; the next character's
    counts follow the language ('e' 24x 'q'). With token ids whose rows are contexts (repeated
    with other labels), both are the data's nature: info. Float rows that are all zeros, and the
    same imbalance over rows that are samples, keep their warnings."""
    from .reports import healthy_data, healthy_split

    counts = {str(c): 40 * (c + 1) for c in range(27)}
    counts["0"] = 30

    def severities(conflict: float, dtype: str) -> dict:
        split = healthy_split(duplicate_count=18797, duplicate_fraction=0.85, duplicate_label_conflict=conflict,
                              input_dtype=dtype, input_shape=[3], input_min=0.0, input_max=26.0,
                              zero_sample_fraction=0.11, class_counts=counts, imbalance_ratio=1080 / 30)  # fmt: skip
        found = _found(BASE.model_copy(update={"data": healthy_data(train=split, test=None, expected_num_classes=27)}))
        return {rule_id: found[rule_id].severity for rule_id in ("NNDX504", "NNDX509") if rule_id in found}

    assert severities(0.6, "torch.int64") == {"NNDX504": "info", "NNDX509": "info"}
    assert severities(0.0, "torch.int64") == {"NNDX504": "warning", "NNDX509": "warning"}
    assert severities(0.6, "torch.float32") == {"NNDX504": "warning", "NNDX509": "warning"}


def test_a_loss_call_without_targets_is_no_regression_of_float_targets():
    """A loss of the user's own called with no target tensor (a VAE's loss of (recon, mu, logvar) and x
    passed elsewhere): target_shape is None. Neither NNDX506 nor NNDX402 may read it, nor fail on it."""
    from nndx.report import LossCall

    call = LossCall(loss_type="vae_loss", output_shape=[64, 10], target_shape=None, output_min=0.0, output_max=1.0)
    report = with_loop(BASE, loss_calls=[call]).model_copy(update={"task": "regression", "data": None,
                                                                    "model": mlp_model(output_activation="Sigmoid")})
    found = _found(report)
    assert "NNDX506" not in found and "NNDX402" not in found


def test_a_loss_that_falls_without_bound_roots_the_large_steps_and_the_inf_it_ends_in():
    """NLLLoss on raw scores (the LogSoftmax left out) is minus the true class's score: the
    loss falls to -1e14 and then -inf, the weights grow with every step and the update/weight
    ratios with them. Those are the unbounded loss's doing, not an LR to lower (udacity's
    intro notebook: LR_TOO_HIGH ranked over the WRONG_LOSS that explains it)."""
    from .broken import loss_call
    from .reports import mlp_params, points

    falling = [2.3 - 0.5 * 1.4**i for i in range(90)] + [-math.inf] * 10
    nll = loss_call(loss_type="NLLLoss", output_min=-0.18, output_max=0.19, output_log_rows_off_zero=2.35)
    report = with_loop(BASE, loss_calls=[nll]).model_copy(
        update={"loss_history": {"train": points(falling)}, "parameters": mlp_params(ratio=0.5), "probes": None})
    diagnosis = diagnose(report)
    found = {f.rule_id: f for f in diagnosis.findings}
    assert {"NNDX205", "NNDX102", "NNDX111"} <= set(found)
    assert diagnosis.top().code.value == "WRONG_LOSS"
    roots = {f.rule_id for f in diagnosis.findings if f.code.value == "WRONG_LOSS"}
    assert found["NNDX205"].explained_by in roots and found["NNDX102"].explained_by in roots
    # the same large steps and NaN with a loss that has its floor stay the LR's
    ce = loss_call()
    bounded = with_loop(BASE, loss_calls=[ce]).model_copy(
        update={"loss_history": {"train": points([2.3] * 90 + [math.nan] * 10)}, "parameters": mlp_params(ratio=0.5),
                "probes": None})
    assert diagnose(bounded).top().code.value == "LR_TOO_HIGH"


def test_a_hand_written_loop_whose_updates_change_nothing_has_no_optimizer_step_not_a_missing_zero_grad():
    """uvadlc's hand-written optimizer given a generator (``self.params = params``): its momentum
    dict uses the generator up, so step() and zero_grad() loop over nothing. 160 backward passes, no
    parameter changed; one update was 'detected' when the best checkpoint was loaded back (a version
    bump, the same values). The gradients do pile up, but with no step they harm nothing: the missing
    update is the bug. Under a GradScaler (a torch optimizer whose steps it skips), the pile-up is."""
    names = sorted({p.name for p in BASE.parameters if p.requires_grad})
    manual = with_loop(BASE, steps=1, backward_calls=160, zero_grad_calls=0, optimizers=[], params_never_changed=names)
    diagnosis = diagnose(manual)
    found = {f.rule_id: f for f in diagnosis.findings}
    assert diagnosis.top().rule_id == "NNDX321" and found["NNDX321"].severity == "error"
    assert "NNDX301" not in found
    scaled = with_loop(BASE, steps=1, backward_calls=40, zero_grad_calls=0, optimizers=["SGD"],
                       params_grad_nonfinite=names)  # fmt: skip
    assert diagnose(scaled).top().rule_id == "NNDX301"
    # a torch optimizer no loop steps (a discriminator's, its step() copy-pasted as the generator's), its
    # gradients finite: the missing step is the bug
    unstepped = with_loop(BASE, steps=0, backward_calls=40, zero_grad_calls=0, optimizers=["Adam"])
    assert diagnose(unstepped).top().rule_id == "NNDX321" and "NNDX301" not in _found(unstepped)
    # a hand-written loop that did update (some parameters moved) stays NNDX321-silent
    moved = with_loop(BASE, steps=1, backward_calls=160, zero_grad_calls=0, optimizers=[],
                      params_never_changed=names[:1])
    assert "NNDX321" not in _found(moved)


def test_measured_steps_against_the_gradient_under_momentum_are_no_collapsed_lr():
    """No optimizer: the step measured as |update| / |gradient|, negative where the update went up the
    gradient. Under momentum 0.9 both swing (uvadlc's hand-written SGDMomentum: 0.005 to 0.34, a step in
    four against the gradient). Those are momentum's, not an LR at 1e-3 of its peak; an LR that did
    collapse still reads as one."""
    from nndx.report import LRPoint

    from .reports import flat, points

    swings = [0.0, 0.0087, 0.08, 0.093, -3.89, 0.17, 0.11, 0.056, 0.34, 0.088, 0.042, 0.029, 0.046, -0.0067, 0.0074,
              0.022, 0.015, 0.005, 0.023, -0.0064, 0.052, 0.025, 0.0057, -0.06, -0.007, 0.0096, -0.12, -0.06,
              0.028, 0.0089, -0.013, 0.048, 0.03]
    history = [LRPoint(step=5 * i, lrs=[v]) for i, v in enumerate(swings)]
    stuck = BASE.model_copy(update={"loss_history": {"train": points(flat(3, level=2.28))}})
    manual = with_loop(stuck, optimizers=[], lr_history=[], effective_lr_history=history)
    assert "NNDX307" not in _found(manual)
    collapsed = [LRPoint(step=5 * i, lrs=[0.1 if i < 8 else 1e-6 * (-1) ** i]) for i in range(32)]
    assert "NNDX307" in _found(with_loop(stuck, optimizers=[], lr_history=[], effective_lr_history=collapsed))


def test_a_reshape_that_scrambles_the_outputs_explains_the_failed_overfit():
    """karpathy's bigram model with ``logits.view(B, C, T)`` for the (B, T, C) logits: the loss scores
    scrambled positions, one batch cannot be fitted, and NNDX601 stood beside NNDX404 as a second
    cause (WRONG_LOSS, warning) instead of under it. NaN in the data ends a one-batch fit too."""
    from .broken import BROKEN

    failed = BROKEN["NNDX601"]().probes
    for cause in ("NNDX404", "NNDX501"):
        broken = BROKEN[cause]()
        probes = failed if broken.probes is None else broken.probes.model_copy(
            update={"overfit_one_batch": failed.overfit_one_batch})
        found = {f.rule_id: f for f in diagnose(broken.model_copy(update={"probes": probes})).findings}
        assert found["NNDX601"].explained_by == cause, cause


def test_a_clip_after_the_step_ranks_before_the_loss_that_climbs_as_if_unclipped():
    """d2l's RNN with grad_clipping moved below updater.step(): the loss climbs (NNDX104, LR_TOO_HIGH) as
    though nothing were clipped, and the clip is seen shrinking gradients the step already used: that ranks
    first. A clip
    that cut once, or gradients scaled by 1 (clip_grad_norm_ under its threshold), say nothing."""
    from nndx.report import ScalarPoint

    from .reports import points

    climbing = [3.1, 2.8, 2.6, 3.5, 9.0, 2.7, 30.0, 12.0, 60.0, 4.0, 90.0, 120.0, 20.0, 80.0, 45.0] * 4
    base = BASE.model_copy(update={"loss_history": {"train": points(climbing)}})
    clipped = with_loop(base, clipped_after_step=[ScalarPoint(step=s, value=0.05) for s in range(0, 60, 5)])
    diagnosis = diagnose(clipped)
    found = {f.rule_id: f for f in diagnosis.findings}
    # first, though NNDX104 stays a root of its own: linking it under EXPLODING_GRADIENTS would stop it
    # rooting NNDX204 in turn (two rules never explain each other)
    assert diagnosis.top().rule_id == "NNDX623" and found["NNDX623"].severity == "error"
    assert "NNDX104" in found
    assert "NNDX623" not in _found(with_loop(base, clipped_after_step=[ScalarPoint(step=5, value=0.05)]))
    assert "NNDX623" not in _found(base)


def test_validation_loss_that_climbs_under_gradients_never_reset_is_their_doing():
    """tutorials' optimization page without optimizer.zero_grad(): the summed gradients make ever larger
    steps, the model grows overconfident, and the validation loss climbs 0.31 -> 8.3 while the train loss
    falls. NNDX107 (OVERFITTING) stood second, unlinked, under NNDX301's direct count."""
    from .broken import BROKEN

    report = with_loop(BROKEN["NNDX107"](), zero_grad_calls=0)
    found = {f.rule_id: f for f in diagnose(report).findings}
    assert found["NNDX107"].explained_by == "NNDX301"
    assert diagnose(BROKEN["NNDX107"]()).top().rule_id == "NNDX107"  # with zero_grad called: overfitting itself


def test_clip_factors_a_posted_report_may_carry_never_crash_the_rule():
    """A report posted to the service validates with any float: factors of 0, below 0 or NaN are no clip
    the Monitor measured, and the rule reads past them rather than raising."""
    from nndx.report import ScalarPoint

    odd = [ScalarPoint(step=s, value=v) for s, v in enumerate([0.0, -0.5, math.nan, math.inf, 2.0])]
    assert "NNDX623" not in _found(with_loop(BASE, clipped_after_step=odd))
    kept = odd + [ScalarPoint(step=10, value=0.05), ScalarPoint(step=20, value=0.05)]
    assert _found(with_loop(BASE, clipped_after_step=kept))["NNDX623"].evidence["clipped_steps"] == 2


def test_loss_at_chance_though_the_model_fits_blames_the_labels_only_with_healthy_steps_and_mixed_targets():
    """raschka's packed LSTM with its labels sorted apart from the texts: the loss sat at ln 2 for 256 steps
    at update ratios of 0.003 while the probe fitted a batch in 9 steps. Not when the steps are tiny (the LR),
    the overfit probe failed (the model), or every batch held one label (a GAN's discriminator at ln 2)."""
    from nndx.report import OverfitResult

    from .broken import labels_apart, mlp_params

    found = _found(labels_apart())
    assert found["NNDX112"].code.value == "LABELS_MISALIGNED" and found["NNDX112"].severity == "warning"
    assert found["NNDX106"].explained_by == "NNDX112"
    assert "NNDX112" not in _found(labels_apart().model_copy(update={"parameters": mlp_params(steps=tuple(range(0, 100, 5)), ratio=1e-5)}))
    failed = healthy_probes(overfit_one_batch=OverfitResult(status="failed", steps=300, initial_loss=2.3, final_loss=2.2))
    assert "NNDX112" not in _found(labels_apart().model_copy(update={"probes": failed}))
    assert "NNDX112" not in _found(labels_apart(single_target_batches=100))
    # batches of two keep the loss at chance through their noise: the tiny batch is the root (the benchmark's
    # batch_of_two on the binary family)
    pairs = _found(labels_apart(swing=0.3, output_shape=[2, 10], target_shape=[2]))
    assert pairs["NNDX112"].explained_by == "NNDX311"


def test_a_generator_loss_driven_to_zero_is_named_but_not_a_healthy_game_or_a_loss_of_its_own():
    """udacity's MNIST GAN with g_loss = fake_loss(D_fake): the generator and the discriminator minimise the same
    thing and the generator's loss fell to 1.5e-8. A healthy generator's loss swings around its opponent's level;
    a loss that runs through no other network may fall to zero (a memorised batch)."""
    from .broken import BROKEN, train, update

    assert _found(BROKEN["NNDX113"]())["NNDX113"].code.value == "WRONG_LOSS"
    game = [1.2 + 0.6 * math.sin(i / 3) for i in range(100)]
    assert "NNDX113" not in _found(with_loop(update(**train(game)), logged_loss_through_other_models=True))
    assert "NNDX113" not in _found(update(**train([1.4 * 0.8 ** i for i in range(100)])))
    from .broken import fed_input

    discriminator = with_loop(BROKEN["NNDX113"](), fed_inputs=[fed_input(0.0, 1.0, -1.0, 1.0)])
    assert "NNDX113" not in _found(discriminator)  # it won: its opponent lost (here to a Sigmoid, NNDX333)
    # a Wasserstein generator's loss (-D(G(z))) goes below zero by design: no floor to fall to
    wasserstein = [1.0 - 0.05 * i for i in range(100)]
    assert "NNDX113" not in _found(with_loop(update(**train(wasserstein)), logged_loss_through_other_models=True))


def test_generated_values_of_another_range_than_the_data_are_named_by_which_side_is_off():
    """Tanh samples beside data left in [0, 1]: the data was not scaled (NNDX332); Sigmoid samples beside data in
    [-1, 1]: the generator cannot reach it (NNDX333). A generator that nearly covers the data's range, one with no
    bounded output activation, or a few forwards, say nothing."""
    from .broken import fed_input

    def named(*fed):
        return set(_found(with_loop(BASE, fed_inputs=list(fed)))) & {"NNDX332", "NNDX333"}

    assert named(fed_input(-0.98, 0.99, 0.0, 1.0)) == {"NNDX332"}
    assert named(fed_input(0.02, 0.97, -1.0, 1.0)) == {"NNDX333"}
    assert named(fed_input(-0.7, 0.8, -1.0, 1.0)) == set()  # short of each end by 0.15 and 0.1 of the span
    # a Tanh generator still learning (EBGAN's, 276 steps in): short of the ends, which it can reach
    assert named(fed_input(-0.75, 0.45, -1.0, 1.0)) == set()
    assert named(fed_input(0.0, 0.9, -0.5, 1.0)) == {"NNDX333"}  # a ReLU output beside signed data
    assert named(fed_input(-0.9, 0.95, -3.0, 3.0)) == {"NNDX333"}  # a Tanh beside data far past -1 and 1
    assert named(fed_input(-1.3, 1.2, -1.0, 1.0)) == set()  # past each end by 0.15 and 0.1 of the span
    assert named(fed_input(-1.0, 1.0, 0.0, 1.0, forwards=5)) == set()
    # an unbounded generator roams while it learns: Morvan's painter beside curves in [0, 3], an adversarial
    # autoencoder's codes beside its prior's samples
    assert named(fed_input(-1.655, 6.193, 0.0, 3.0)) == set()
    assert named(fed_input(-5.99, 7.61, -5.0, 4.8)) == set()


def test_dense_bce_targets_above_one_are_an_unscaled_range_and_labels_above_one_an_encoding():
    """raschka's convolutional autoencoder on raw 0..255 pixels: BCE with logits given the images as targets fell
    to -1e15, and was read as LABEL_DTYPE. Targets of several values per sample from 0 to 255 are a range left
    unscaled (NNDX334); -1/+1 images, or one label per sample above 1, are still an encoding (NNDX313)."""
    from nndx.report import LossCall

    def found(low, high, shape):
        call = LossCall(loss_type="BCEWithLogitsLoss", output_shape=shape, target_shape=shape, target_dtype="float32",
                        output_min=-3.0, output_max=4.0, target_mean=(low + high) / 2, target_std=0.5,
                        target_min=low, target_max=high)  # fmt: skip
        return set(_found(with_loop(BASE, loss_calls=[call]))) & {"NNDX313", "NNDX334"}

    assert found(0.0, 255.0, [128, 1, 28, 28]) == {"NNDX334"}
    assert found(-1.0, 1.0, [128, 1, 28, 28]) == {"NNDX313"}
    assert found(0.0, 3.0, [128, 1]) == {"NNDX313"}
    assert found(0.0, 1.0, [128, 1, 28, 28]) == set()


def test_a_failed_overfit_against_a_fixed_opponent_is_info():
    """A generator's preflight: its loss runs through a discriminator the probe does not train."""
    from nndx.report import OverfitResult

    def severity(**fields):
        failed = OverfitResult(status="failed", task="classification", steps=300, initial_loss=0.65, final_loss=0.556,
                               losses=[0.65, 0.6, 0.556], **fields)  # fmt: skip
        return _found(BASE.model_copy(update={"probes": healthy_probes(overfit_one_batch=failed)}))["NNDX601"].severity

    assert severity() == "warning"
    assert severity(loss_through_other_parameters=True) == "info"

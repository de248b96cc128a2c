"""One broken report per rule id: the healthy MLP run with exactly one thing wrong."""

from __future__ import annotations

import math
from collections.abc import Callable

from nndx.report import (
    CausalityResult,
    DataStats,
    DiagnosticReport,
    ErrorRecord,
    EvalModeResult,
    FedInput,
    GradCheckParam,
    GradCheckResult,
    GradNormPoint,
    GraphPoint,
    InterventionResult,
    Interventions,
    LabelAlignmentResult,
    LabelNoiseResult,
    LayerInfo,
    LossCall,
    LossTerm,
    LRPoint,
    LRRangeResult,
    NanOriginResult,
    OverfitResult,
    Probes,
    RecurrentInput,
    SampleIndependenceResult,
    ScalarPoint,
)

from nndx.rules.interventions import REMEDIES

from .reports import (
    act,
    flat,
    healthy_data,
    healthy_loop,
    healthy_mlp,
    healthy_probes,
    healthy_split,
    mlp_layers,
    mlp_model,
    mlp_params,
    noisy_decreasing,
    plateau_curve,
    points,
    with_loop,
)

BASE = healthy_mlp()


def update(**changes) -> DiagnosticReport:
    return BASE.model_copy(update=changes)


def train(values, accuracies=None) -> dict:
    return {"loss_history": {"train": points(values, accuracies)}}


def loss_call(**fields) -> LossCall:
    base = dict(loss_type="CrossEntropyLoss", output_shape=[32, 10], target_shape=[32], target_dtype="torch.int64", output_min=-3.0, output_max=3.0, output_rows_sum_to_one=False)
    base.update(fields)
    return LossCall(**base)


def calls(*c: LossCall) -> DiagnosticReport:
    return with_loop(BASE, loss_calls=list(c))


def probe(**probes) -> DiagnosticReport:
    return update(probes=healthy_probes(**probes))


def error(message: str, type_: str = "RuntimeError") -> DiagnosticReport:
    """A preflight's probe that raised: no loop trained beside it (one that did, without raising, makes
    the probe's exception the probe's call: info)."""
    return update(errors=[ErrorRecord(source="overfit_one_batch", type=type_, message=message)], loop=None,
                  loss_history={})  # fmt: skip


def confirmed(code: str) -> DiagnosticReport:
    """Only an intervention's outcome: the remedy for ``code`` made a copy learn."""
    result = InterventionResult(cause=code, remedy="the remedy", status="confirmed", steps=50, baseline_initial_loss=2.3,
                                baseline_final_loss=2.29, remedied_initial_loss=2.3, remedied_final_loss=0.05)  # fmt: skip
    return DiagnosticReport(interventions=Interventions(results=[result]))


def dead_layers() -> DiagnosticReport:
    # dead from the start: the loss never leaves ln(10)
    return update(layers=mlp_layers(dead=0.95), **train(flat(2, level=math.log(10))))


def units_died() -> DiagnosticReport:
    # learning, then the units die and the loss freezes where it was
    stalled = [2.3 - 0.01 * i for i in range(50)] + [1.8 + 0.001 * (i % 3) for i in range(150)]
    return update(layers=mlp_layers(steps=(0, 50), dead=0.02) + [l for l in mlp_layers(steps=(100,), dead=0.95)],
                  **train(stalled))  # fmt: skip


def saturated_layers() -> DiagnosticReport:
    layers = [l.model_copy(update={"type": "Tanh", "activation": act(mean=0.0, std=0.99, zero=0.0, dead=0.0, sat=0.8)}) if l.type == "ReLU" else l for l in BASE.layers]
    return update(layers=layers)


def saturated_in_training() -> DiagnosticReport:
    """Tanh units unsaturated at the first recorded step, pinned at their bounds at the last."""
    first = min(l.step for l in BASE.layers)
    layers = [l.model_copy(update={"type": "Tanh", "activation": act(mean=0.0, std=0.99 if l.step != first else 0.5,
                                                                      zero=0.0, dead=0.0,
                                                                      sat=0.8 if l.step != first else 0.01)})
              if l.type == "ReLU" else l for l in BASE.layers]  # fmt: skip
    # the loss stops learning once they pin (a learning loss makes saturation context)
    stalled = [2.3 - 0.002 * i for i in range(50)] + [2.2 + 0.001 * (i % 3) for i in range(150)]
    return update(layers=layers, **train(stalled))


def nan_after() -> DiagnosticReport:
    values = noisy_decreasing(0, n=60)[:30] + [v * 3 for v in noisy_decreasing(1, n=60)[:10]] + [math.nan] * 20
    return update(**train(values))


def diverging() -> DiagnosticReport:
    values = [2.3, 2.1, 2.5, 4.0, 3.1, 8.0, 2.9, 12.0, 5.0, 20.0, 7.0, 15.0, 30.0, 9.0, 40.0]
    return update(**train(values))


def decrease_then_plateau() -> DiagnosticReport:
    values = [2.3 * math.exp(-i / 10) + 0.8 for i in range(50)] + [0.8 + 0.002 * ((-1) ** i) for i in range(100)]
    return update(**train(values))


def overfit() -> DiagnosticReport:
    val = [2.2, 1.6, 1.2, 1.0, 0.95, 1.0, 1.1, 1.25, 1.4, 1.55, 1.7, 1.85, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7]
    return update(loss_history={"train": points(noisy_decreasing(0, end=0.01, noise=0.02)), "val": points(val, every=10)})


def underfit() -> DiagnosticReport:
    tr = [2.3 - 0.5 * (1 - math.exp(-i / 10)) for i in range(100)]
    val = [2.3 - 0.5 * (1 - math.exp(-i / 2)) for i in range(20)]
    return update(loss_history={"train": points(tr), "val": points(val, every=5)})


def val_chance() -> DiagnosticReport:
    tr = noisy_decreasing(0)
    return update(
        loss_history={
            "train": points(tr, [min(0.99, 0.1 + 0.9 * (1 - v / 2.3)) for v in tr]),
            "val": points([2.3 + 0.05 * i for i in range(20)], [0.1 + 0.01 * ((-1) ** i) for i in range(20)], every=10),
        }
    )


def exploding() -> DiagnosticReport:
    # the gradient norm grows 1.1x a step while the loss stalls, then climbs; SGD's steps grow with it
    history = [GradNormPoint(step=i, before_clip=1.0 * (1.1**i)) for i in range(100)]
    growing = [p.model_copy(update={"update_ratio": p.update_ratio * 1.1 ** (p.step or 0)}) for p in mlp_params()]
    stalled = update(parameters=growing, **train([2.3 - 0.002 * i for i in range(60)] + [2.18 + 0.01 * i for i in range(40)]))
    return with_loop(stalled, grad_norm_history=history)


def vanishing() -> DiagnosticReport:
    return update(layers=mlp_layers(grads=(1e-9, 1e-5, 0.1)))


def zero_hidden_bias_gradients() -> DiagnosticReport:
    """A Hamiltonian network with ReLU: its loss is on dH/dx, and each hidden bias's gradient goes
    through ReLU's second derivative, 0: exactly zero at every step while the weights learn."""
    params = [p.model_copy(update={"grad_norm": 0.0}) if p.name in ("0.bias", "2.bias") else p for p in mlp_params()]
    return update(parameters=params, **train(plateau_curve(0, start=1.0, floor=0.4)))


def big_updates() -> DiagnosticReport:
    # an LR far too high wrecks the weights in the first steps; the loss then sits high (no LR range
    # test: the healthy base's says the LR is in range, which would excuse it)
    return update(parameters=mlp_params(ratio=0.8), probes=None, **train(flat(0, level=2.2, noise=0.05)))


def network_killed_by_lr() -> DiagnosticReport:
    """Huge updates in the first recorded steps kill the units; later updates are tiny, so a
    median over the whole run (1e-4) would hide the cause. No NaN ever appears."""
    early = mlp_params(steps=(0, 1, 2), ratio=3.0)
    late = mlp_params(steps=tuple(range(3, 20)), ratio=1e-4)
    return update(parameters=early + late, **train(flat(1, level=2.2, noise=0.01)))


def labels_apart(swing: float = 0.0, **loss_call_fields) -> DiagnosticReport:
    """Labels sorted apart from their texts: the loss sits at ln 10 for the whole run at healthy step
    sizes, while the overfit probe (healthy base: passed) memorises one batch. ``swing``: each step's loss that
    share above or below the level, alternately (a batch of two's noise)."""
    report = update(parameters=mlp_params(steps=tuple(range(0, 100, 5)), ratio=3e-3),
                    **train([v * (1 + swing * (-1) ** i) for i, v in enumerate(flat(0, level=math.log(10)))],
                            [0.1] * 100))
    return with_loop(report, loss_calls=[loss_call(calls=100, measured_batches=100, **loss_call_fields)])


def fed_input(fed_min: float, fed_max: float, own_min: float, own_max: float, forwards: int = 100) -> FedInput:
    """A discriminator's input: generated values beside real data, by their extremes."""
    return FedInput(model="", position=0, fed_forwards=2 * forwards, own_forwards=forwards, fed_min=fed_min,
                    fed_max=fed_max, own_min=own_min, own_max=own_max)


def tiny_updates() -> DiagnosticReport:
    return update(parameters=mlp_params(ratio=1e-7), **train(flat(0, level=1.9)))


def bad_init() -> DiagnosticReport:
    # all zeros and no gradient to move it (the layer after it zero as well): it stays there
    params = [p.model_copy(update={"weight_norm": 0.0, "grad_norm": 0.0}) if p.name == "2.weight" else p for p in BASE.parameters]
    return update(parameters=params)


def no_zero_grad() -> DiagnosticReport:
    return with_loop(BASE, zero_grad_calls=0)


def accum_unscaled() -> DiagnosticReport:
    # four undivided micro-batch losses: steps 4x too large, the loss bounces instead of falling
    r = with_loop(BASE, steps=50, backward_calls=200, zero_grad_calls=50)
    return r.model_copy(update={"parameters": mlp_params(ratio=0.5), **train(flat(0, level=2.2, noise=0.05))})


def not_in_optimizer() -> DiagnosticReport:
    return with_loop(BASE, params_not_in_optimizer=["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"])


def detached() -> DiagnosticReport:
    return with_loop(BASE, params_grad_none=["0.weight", "0.bias", "2.weight", "2.bias"])


def all_frozen() -> DiagnosticReport:
    r = with_loop(BASE, frozen_params=["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"], trainable_param_count=0)
    return r.model_copy(update={"model": mlp_model(trainable_param_count=0), **train(flat(1, level=2.3))})


def eval_in_train_mode() -> DiagnosticReport:
    return with_loop(BASE, has_dropout=True, no_grad_forwards_in_train_mode=20)


def trained_in_eval_mode() -> DiagnosticReport:
    return with_loop(BASE, has_batchnorm=True, backward_after_eval_forward=75, first_eval_backward_step=25)


def per_batch_step_lr() -> DiagnosticReport:
    return with_loop(BASE, lr_history=[LRPoint(step=i, lrs=[0.1 * 0.1 ** (i // 10)]) for i in range(100)])


def tight_clip() -> DiagnosticReport:
    return with_loop(BASE, grad_norm_history=[GradNormPoint(step=i, before_clip=5.0, after_clip=0.01) for i in range(50)])


def zero_batches() -> DiagnosticReport:
    norms = [ScalarPoint(step=i, value=0.0 if i % 4 == 0 else 28.0) for i in range(40)]
    return with_loop(BASE, input_norm_history=norms)


def desync() -> DiagnosticReport:
    return with_loop(BASE, world_size=2, desync_steps=[100, 200], max_desync=0.3)


def tiny_batch() -> DiagnosticReport:
    r = with_loop(BASE, loss_calls=[loss_call(output_shape=[2, 10], target_shape=[2])])
    return r.model_copy(update=train(noisy_decreasing(0, noise=0.6)))


def nan_origin(module: str | None, type_: str | None, inputs: int = 0, loss_finite: bool | None = False) -> DiagnosticReport:
    return probe(nan_origin=NanOriginResult(status="failed", forward_module=module, forward_module_type=type_, input_nonfinite_count=inputs, loss_finite=loss_finite))


def padding_scored() -> DiagnosticReport:
    """BERT4Rec without ignore_index: 85% of the scored targets are the item embedding's padding id."""
    layers = [LayerInfo(name="items", type="Embedding", param_count=22 * 16, output_shape=[16, 10, 16], padding_idx=0),
              LayerInfo(name="head", type="Linear", param_count=16 * 21 + 21)]  # fmt: skip
    call = loss_call(output_shape=[160, 21], target_shape=[160], top_target=0, top_target_fraction=0.85)
    return calls(call).model_copy(update={"model": mlp_model(layers=layers, activations=[])})


def missing_activation() -> DiagnosticReport:
    layers = [
        LayerInfo(name="0", type="Linear"),
        LayerInfo(name="1", type="ReLU"),
        LayerInfo(name="2", type="Linear"),
        LayerInfo(name="3", type="Linear"),
    ]
    return update(model=mlp_model(layers=layers, activations=["ReLU"]))


def narrow_model() -> DiagnosticReport:
    layers = [
        LayerInfo(name="0", type="Linear", output_shape=[32, 2]),
        LayerInfo(name="1", type="ReLU", output_shape=[32, 2]),
        LayerInfo(name="2", type="Linear", output_shape=[32, 10]),
    ]
    return update(model=mlp_model(layers=layers), parameters=[], **train(flat(4, level=1.9)))


def interleaved_axes() -> DiagnosticReport:
    """Attention heads split with a view to the permuted sizes, as the probe's forward saw."""
    return update(model=mlp_model().model_copy(update={"moved_axes": [
        "attn.forward: reshape [32, 16, 96] -> [32, 4, 16, 24]"]}))  # fmt: skip


def graph_growing() -> DiagnosticReport:
    """A hidden state carried without .detach(): each recorded step's graph reaches back."""
    history = [GraphPoint(step=s, nodes=8 + 6 * s, earlier_nodes=6 * s) for s in range(0, 50, 5)]
    return with_loop(BASE, graph_nodes_history=history, optimizers=["SGD"])


BROKEN: dict[str, Callable[[], DiagnosticReport]] = {
    "NNDX101": lambda: update(**train([math.inf] + noisy_decreasing(0)[1:])),
    "NNDX110": lambda: update(**train([math.nan] * 30)),
    "NNDX102": nan_after,
    "NNDX001": lambda: DiagnosticReport(
        probes=Probes(overfit_one_batch=OverfitResult(status="error", message="TypeError: batch must be (inputs, targets)")),
        errors=[ErrorRecord(source="overfit_one_batch", type="TypeError", message="batch must be (inputs, targets)")],
    ),
    "NNDX002": lambda: probe(lr_range=LRRangeResult(status="error", message="RuntimeError: CUDA out of memory")),
    "NNDX103": lambda: update(**train(flat(0))),
    "NNDX104": diverging,
    "NNDX105": decrease_then_plateau,
    "NNDX106": lambda: update(**train(flat(0, level=math.log(10)))),
    "NNDX112": lambda: labels_apart(),
    "NNDX113": lambda: with_loop(update(**train([1.4 * 0.8 ** i for i in range(100)])), logged_loss_through_other_models=True),
    "NNDX107": overfit,
    "NNDX108": underfit,
    "NNDX109": val_chance,
    # a VAE whose KL term was subtracted: the ELBO "improves" without bound
    "NNDX111": lambda: update(**train([100.0 - 3.0 * i * i for i in range(60)])),
    "NNDX201": dead_layers,
    **{rule_id: (lambda code=code: confirmed(code.value)) for rule_id, code, _, _ in REMEDIES},
    "NNDX202": saturated_layers,
    "NNDX203": vanishing,
    "NNDX204": exploding,
    "NNDX205": big_updates,
    "NNDX206": tiny_updates,
    "NNDX207": bad_init,
    "NNDX208": units_died,
    "NNDX209": saturated_in_training,
    "NNDX210": zero_hidden_bias_gradients,
    "NNDX301": no_zero_grad,
    "NNDX302": accum_unscaled,
    "NNDX303": not_in_optimizer,
    "NNDX304": detached,
    "NNDX305": all_frozen,
    "NNDX306": eval_in_train_mode,
    "NNDX307": per_batch_step_lr,
    "NNDX308": tight_clip,
    "NNDX309": zero_batches,
    "NNDX326": lambda: calls(loss_call(loss_type="NLLLoss", output_shape=[64, 2], target_shape=[64],
                                       ignore_index=0, ignored_target_fraction=0.5, scored_classes=1)),
    "NNDX325": lambda: with_loop(BASE, steps=0, backward_calls=0, zero_grad_calls=0).model_copy(
        update={"loss_history": {"val": points(flat(4, level=0.7))}}),
    "NNDX310": desync,
    "NNDX311": tiny_batch,
    "NNDX323": trained_in_eval_mode,
    "NNDX328": lambda: with_loop(BASE, has_batchnorm=True, frozen_train_mode_forwards=40, trainable_param_count=0),
    "NNDX329": lambda: with_loop(BASE, ops_before_loss=[["LogSoftmax", "Relu", "Add", "Sum", "Mean"]]),
    "NNDX330": lambda: with_loop(BASE, grads_masked_by_hand={"fc1.weight": 0.48, "fc2.weight": 0.51}),
    "NNDX324": lambda: calls(loss_call(loss_type="NLLLoss", output_min=-9.0, output_max=-0.01, output_log_rows_off_zero=1.2)),
    "NNDX317": padding_scored,
    "NNDX312": lambda: calls(loss_call(loss_type="MSELoss", output_shape=[32, 1], target_shape=[32], target_dtype="torch.float32")).model_copy(update={"task": "regression"}),
    "NNDX313": lambda: calls(loss_call(target_dtype="torch.float32")),
    "NNDX334": lambda: calls(loss_call(loss_type="BCEWithLogitsLoss", output_shape=[32, 1, 8, 8], target_shape=[32, 1, 8, 8], target_dtype="torch.float32", target_min=0.0, target_max=255.0)),
    "NNDX332": lambda: with_loop(BASE, fed_inputs=[fed_input(-1.0, 1.0, 0.0, 1.0)]),
    "NNDX333": lambda: with_loop(BASE, fed_inputs=[fed_input(0.0, 1.0, -1.0, 1.0)]),
    "NNDX314": lambda: calls(loss_call(output_min=0.0, output_max=0.9, output_rows_sum_to_one=True)),
    "NNDX315": lambda: calls(loss_call(loss_type="MSELoss", target_dtype="torch.int64")),
    "NNDX401": missing_activation,
    "NNDX402": lambda: calls(loss_call(output_shape=[32, 1], target_shape=[32])),
    "NNDX403": narrow_model,
    "NNDX404": interleaved_axes,
    "NNDX501": lambda: update(data=healthy_data(train=healthy_split(input_nan_count=12))),
    "NNDX502": lambda: update(data=healthy_data(train_test_overlap=60, train_test_overlap_fraction=0.2)),
    "NNDX503": lambda: update(data=healthy_data(train=healthy_split(duplicate_count=500, duplicate_fraction=0.33))),
    "NNDX504": lambda: update(data=healthy_data(train=healthy_split(class_counts={"0": 1400, "1": 100}, imbalance_ratio=14.0), expected_num_classes=2)),
    "NNDX505": lambda: update(data=healthy_data(train=healthy_split(input_mean=33.0, input_std=78.0, input_max=255.0, raw_range="0-255"))),
    "NNDX506": lambda: update(task="regression", data=DataStats(train=healthy_split(label_kind="float_continuous", class_counts={}, target_mean=250000.0, target_std=80000.0))),
    "NNDX507": lambda: update(data=healthy_data(train=healthy_split(class_counts={str(c): 150 for c in range(9)}))),
    "NNDX508": lambda: update(data=healthy_data(train=healthy_split(label_runs_fraction=0.99))),
    "NNDX509": lambda: update(data=healthy_data(train=healthy_split(zero_sample_fraction=0.2))),
    "NNDX601": lambda: probe(overfit_one_batch=OverfitResult(status="failed", task="classification", steps=200, initial_loss=2.3, final_loss=2.1)),
    "NNDX602": lambda: update(loop=healthy_loop(lr=10.0), **train(flat(0))),
    "NNDX603": lambda: update(loop=healthy_loop(lr=1e-7), **train(flat(0))),
    "NNDX604": lambda: probe(grad_check=GradCheckResult(status="failed", max_relative_error=0.4, parameters=[GradCheckParam(name="fc.weight", relative_error=0.4, status="bug")])),
    "NNDX615": lambda: probe(grad_check=GradCheckResult(status="failed", max_relative_error=1.0, parameters=[GradCheckParam(name="body.weight", relative_error=1.0, status="bug", autograd_zero=True)])),
    "NNDX605": lambda: nan_origin("log_probs", "SafeLog"),
    "NNDX606": lambda: nan_origin("act", "NaiveSoftmax"),
    "NNDX607": lambda: nan_origin("norm", "Normalize"),
    "NNDX608": lambda: nan_origin("fc2", "Linear"),
    "NNDX609": lambda: probe(eval_mode=EvalModeResult(status="failed", training=True, has_dropout=True, max_abs_diff=0.4, eval_abs_diff=0.3)),
    # misaligned labels leave validation at chance (a run that generalises refutes the probe)
    "NNDX610": lambda: probe(label_alignment=LabelAlignmentResult(status="failed", real_accuracy=0.11, permuted_accuracy=0.1, chance_accuracy=0.1, steps=100)).model_copy(
        update={"loss_history": {**BASE.loss_history, "val": points([2.3] * 5, [0.1] * 5, every=20)}}),
    "NNDX611": lambda: probe(sample_independence=SampleIndependenceResult(status="failed", batch_axis=0, samples=32, changed_samples=31, max_change=0.4, tolerance=1e-5)),
    "NNDX618": lambda: probe(grad_check=GradCheckResult(status="passed", max_relative_error=1e-8, stop_gradients=2)),
    "NNDX331": lambda: with_loop(BASE, scheduled_lrs=[1e-3], lr_history=[LRPoint(step=i, lrs=[1e-6 * (1 - i / 200)]) for i in range(100)]),
    "NNDX327": lambda: with_loop(BASE, scheduled_lrs=[1e-3], lr_history=[LRPoint(step=i, lrs=[1e-6 * (1 + i // 20)]) for i in range(100)]),
    "NNDX619": lambda: probe(sample_independence=SampleIndependenceResult(status="failed", batch_axis=0, samples=32, replaced_samples=16, changed_samples=16, max_change=0.4, tolerance=1e-5, batch_reduction="sum of a [32, 8] tensor in fm")),
    "NNDX620": lambda: probe(sample_independence=SampleIndependenceResult(status="failed", batch_axis=1, samples=10, replaced_samples=5, changed_samples=0, max_change=0.0, tolerance=1e-5, no_context="rnn")),
    "NNDX625": lambda: probe(sample_independence=SampleIndependenceResult(status="failed", batch_axis=1, samples=100, replaced_samples=50, changed_samples=0, max_change=0.0, tolerance=1e-5, stitched={"batch_as_given": 0.67, "time_as_given": 1.07, "batch_reread": 1.04, "time_reread": 0.62})),
    "NNDX621": lambda: probe(sample_independence=SampleIndependenceResult(status="failed", batch_axis=0, samples=32, replaced_samples=16, changed_samples=0, max_change=0.0, tolerance=1e-5, position_dependent=True)),
    "NNDX617": lambda: probe(sample_independence=SampleIndependenceResult(status="failed", reordered=True, batch_axis=0, samples=32, replaced_samples=16, changed_samples=15, max_change=0.4, tolerance=1e-5)),
    "NNDX613": lambda: probe(causality=CausalityResult(status="failed", time_axis=1, samples=8, positions=32, scored_positions=256, copy_fraction=1.0, next_fraction=0.04, unshifted=True)),
    "NNDX614": lambda: probe(causality=CausalityResult(status="failed", time_axis=1, samples=8, positions=32, scored_positions=256, copy_fraction=0.04, next_fraction=1.0, unshifted=False, cut=15, changed_positions=16, max_change=0.3, tolerance=2e-5, future_visible=True)),
    "NNDX622": lambda: probe(causality=CausalityResult(status="failed", time_axis=1, samples=20, positions=30, scored_positions=600, copy_fraction=0.02, next_fraction=1.0, unshifted=False, cut=14, future_visible=False, time_information=0.01, batch_information=0.6, text_across_batch=True)),
    "NNDX626": lambda: probe(overfit_one_batch=OverfitResult(status="passed", task="classification", steps=100, lr=1e-3, initial_loss=2.3, final_loss=0.004, final_accuracy=1.0, loss_terms=[LossTerm(op="NllLoss", reduction="mean", values=64), LossTerm(op="sum", reduction="sum", values=640, scale=0.5)])),
    "NNDX616": lambda: probe(causality=CausalityResult(status="passed", time_axis=1, samples=8, positions=32, scored_positions=256, copy_fraction=0.04, next_fraction=1.0, unshifted=False, cut=15, changed_positions=0, max_change=0.0, tolerance=2e-5, future_visible=False, padding_id=0, scored_padding_fraction=0.3)),
    "NNDX612": lambda: probe(label_noise=LabelNoiseResult(status="failed", noise_fraction=0.41, noise_lower_bound=0.36, disagreement_fraction=0.46, confident_samples=449, samples=1797)),
    "NNDX701": lambda: error("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"),
    "NNDX702": lambda: error("one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [3]]"),
    "NNDX703": lambda: error("expected target dtype to be Long or Byte, but got Float"),
    "NNDX704": lambda: error("Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed)."),
    "NNDX705": lambda: error("Target size (torch.Size([4])) must be the same as input size (torch.Size([4, 1]))", "ValueError"),
    "NNDX706": lambda: error("mat1 and mat2 shapes cannot be multiplied (4x6 and 5x3)"),
    "NNDX707": lambda: error("element 0 of tensors does not require grad and does not have a grad_fn"),
    "NNDX708": lambda: error("all elements of input should be between 0 and 1"),
    "NNDX709": lambda: error("Function 'LogBackward0' returned nan values in its 0th output."),
    "NNDX710": lambda: error("Function 'DivBackward0' returned nan values in its 1th output."),
    "NNDX711": lambda: error("Function 'ExpBackward0' returned nan values in its 0th output."),
    "NNDX320": graph_growing,
    "NNDX321": lambda: with_loop(BASE, steps=0, backward_calls=200, optimizers=["SGD"]),
    # bentrevett's seq2seq with pad_sequence(batch_first=True) into its time-major LSTM: lengths on the batch axis
    "NNDX624": lambda: with_loop(BASE, recurrent_inputs=[RecurrentInput(
        name="encoder.rnn", batch_first=False, forwards=400, time_lengths=[8, 32], batch_sizes=[3, 4, 5, 6, 7, 8])]),
    # d2l's grad_clipping moved below updater.step(): the clip shrinks gradients the step already used
    "NNDX623": lambda: with_loop(BASE, clipped_after_step=[ScalarPoint(step=s, value=0.04) for s in range(0, 50, 5)]),
    "NNDX322": lambda: with_loop(BASE, optimizers=["SGD"], params_never_changed=[p.name for p in BASE.parameters if p.step == BASE.parameters[0].step]),
}

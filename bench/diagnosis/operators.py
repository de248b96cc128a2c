"""Bug operators: one function per way people write a bug, each naming the cause code
a diagnosis should give (and, only where the bug truly is two things at once, the
alternates that also count).

An operator mutates the family's correct script (:class:`~.spec.Spec`); its ``fix``
gives the twin the buggy run is compared with (the family's correct script unless the
bug needs a setting to exist at all, e.g. SGD for a clipping bug). ``measure`` says how
the buggy run must differ from its twin for the case to count (see :mod:`.twins`).
``families`` and ``styles`` declare where the bug can be written: a ``batch_first``
mix-up needs a recurrent model, a missing ``zero_grad`` needs a loop nndx can see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .families import Family
from .spec import Data, Spec

ALL_STYLES = frozenset({"wrapped", "own_loss", "preflight", "lightning", "manual"})
LOOP = frozenset({"wrapped", "own_loss", "manual"})  # bugs written in a hand-written loop
TRAINING = ALL_STYLES - {"preflight"}  # visible only while training runs


@dataclass(frozen=True)
class Operator:
    name: str
    code: str
    mutate: Callable[[Spec], Spec]
    families: Callable[[Family], bool]
    styles: frozenset[str] = ALL_STYLES
    measure: str = "worse"  # "worse", "better", "nonfinite", "graph"
    fix: Callable[[Spec], Spec] | None = None
    alternates: tuple[str, ...] = ()
    doc: str = ""

    @property
    def accepted(self) -> tuple[str, ...]:
        return (self.code, *self.alternates)


# --------------------------------------------------------------------------- family predicates


def every(f: Family) -> bool:
    return True


def classifier(f: Family) -> bool:
    return f.task in ("multiclass", "binary")


def multiclass(f: Family) -> bool:
    return f.task == "multiclass"


def softmax_output(f: Family) -> bool:
    return f.task in ("multiclass", "lm")


def logit_output(f: Family) -> bool:
    return f.task in ("multiclass", "lm", "binary")


def float_inputs(f: Family) -> bool:
    return f.inputs != "tokens"


def has(*switches: str) -> Callable[[Family], bool]:
    return lambda f: set(switches) <= f.switches


def named(*names: str) -> Callable[[Family], bool]:
    return lambda f: f.name in names


def all_of(*predicates: Callable[[Family], bool]) -> Callable[[Family], bool]:
    return lambda f: all(p(f) for p in predicates)


# --------------------------------------------------------------------------- data operators


def _rows(data: Data, idx: torch.Tensor) -> Data:
    return Data(data.x[idx], data.y[idx], data.x_val, data.y_val, data.num_classes, data.y_val_true)


def raw_inputs(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """The normalisation step dropped: pixels as 0-255, tabular features in raw units."""
    if data.x.dim() == 4:  # images normalised as (x/16 - 0.30) / 0.37
        undo = lambda t: ((t * 0.37 + 0.30) * 255).round()  # noqa: E731
    else:
        width = data.x.shape[-1]
        scale = 10 ** (torch.rand(width, generator=gen) * 3)
        undo = lambda t: t * scale + 5 * scale  # noqa: E731
    return Data(undo(data.x), data.y, undo(data.x_val), data.y_val, data.num_classes, data.y_val_true)


def huge_targets(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    f = lambda t: t * 1000 + 5000  # noqa: E731 - prices in currency units
    return Data(data.x, f(data.y), data.x_val, f(data.y_val), data.num_classes, f(data.y_val_true))


def shuffle_labels(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Inputs and labels shuffled with two different permutations."""
    return Data(data.x, data.y[torch.randperm(len(data.y), generator=gen)], data.x_val, data.y_val,
                data.num_classes, data.y_val_true)  # fmt: skip


def target_not_shifted(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Language-model targets equal to the inputs (the shift by one forgotten)."""
    return Data(data.x, data.x.clone(), data.x_val, data.x_val.clone(), data.num_classes, data.y_val_true)


def flip_labels(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """40% of training labels replaced by another class (careless annotation)."""
    y = data.y.clone()
    flip = torch.rand(len(y), generator=gen) < 0.4
    if data.num_classes == 2:
        y[flip] = 1 - y[flip]
    else:
        y[flip] = (y[flip] + torch.randint(1, data.num_classes, (int(flip.sum()),), generator=gen)) % data.num_classes
    return Data(data.x, y, data.x_val, data.y_val, data.num_classes, data.y_val_true)


def collapse_labels(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Labels "normalised" like features: y / y.max() truncated (everything but the top class becomes 0)."""
    if data.num_classes == 2:
        f = lambda t: (t > 1).float()  # noqa: E731 - a threshold meant for 0-255 masks
    else:
        f = lambda t: (t.float() / t.max()).long()  # noqa: E731
    return Data(data.x, f(data.y), data.x_val, f(data.y_val), data.num_classes, data.y_val_true)


def plus_minus_labels(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Binary labels encoded as -1/+1 (an SVM habit) fed to BCEWithLogitsLoss."""
    f = lambda t: 2 * t - 1  # noqa: E731
    return Data(data.x, f(data.y), data.x_val, f(data.y_val), data.num_classes, data.y_val_true)


def squeeze_targets(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Regression targets of shape (N,) against outputs of shape (N, 1)."""
    return Data(data.x, data.y.squeeze(1), data.x_val, data.y_val.squeeze(1), data.num_classes, data.y_val_true)


def nan_in_inputs(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """One missing value in the training inputs."""
    x = data.x.clone()
    x.view(len(x), -1)[37, 3] = float("nan")
    y = x if data.y is data.x else data.y  # an autoencoder's target is its input
    return Data(x, y, data.x_val, data.y_val, data.num_classes, data.y_val_true)


def add_constant_feature(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """A sensor that never fired: a feature that is 0 everywhere (images have such pixels already)."""
    if data.x.dim() == 4 or spec.family == "vae":
        return data
    pad = lambda t: torch.cat([t, torch.zeros(*t.shape[:-1], 1)], -1)  # noqa: E731
    return Data(pad(data.x), data.y, pad(data.x_val), data.y_val, data.num_classes, data.y_val_true)


def duplicate_rows(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """An eighth of the training set oversampled by concatenation, 8 times."""
    keep = len(data.x) // 8
    return _rows(data, torch.arange(keep).repeat(8))


def leak_validation(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Validation rows taken from the training split."""
    n = len(data.x_val)
    y_true = data.y[:n]
    return Data(data.x, data.y, data.x[:n], data.y[:n], data.num_classes, y_true)


def sort_by_label(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    key = data.y.reshape(len(data.y), -1)[:, 0]
    return _rows(data, torch.argsort(key, stable=True))


def imbalance(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Every class but class 0 thinned to 1/20 (a rare-event dataset)."""
    y = data.y.reshape(len(data.y), -1)[:, 0]
    keep = (y == 0) | (torch.rand(len(y), generator=gen) < 0.05)
    return _rows(data, torch.nonzero(keep).squeeze(1))


def mild_imbalance(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    """Every class but class 0 thinned to 1/4: imbalanced, handled by class weights."""
    y = data.y.reshape(len(data.y), -1)[:, 0]
    keep = (y == 0) | (torch.rand(len(y), generator=gen) < 0.25)
    return _rows(data, torch.nonzero(keep).squeeze(1))


def tiny_train(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    return _rows(data, torch.arange(48))


def small_train(data: Data, gen: torch.Generator, spec: Spec) -> Data:
    return _rows(data, torch.arange(64))


# --------------------------------------------------------------------------- the operators


def _sgd(s: Spec) -> Spec:
    return s.with_(optimizer="sgd")


def micro_batches(s: Spec, divide: bool = True, k: int = 4) -> Spec:
    """The family's batch split into k micro-batches whose gradients accumulate; the
    number of optimizer updates stays close to the family's."""
    from .families import FAMILIES

    family = FAMILIES[s.family]
    return s.with_(accumulate=k, divide_accumulated=divide, batch_size=max(1, family.batch_size // k),
                   steps=(s.steps or family.steps) * k // 2)  # fmt: skip


OPERATORS: tuple[Operator, ...] = (
    # -- optimisation settings
    Operator("lr_x1000", "LR_TOO_HIGH", lambda s: s.with_(lr_scale=1000.0), every,
             doc="learning rate 1000x the working one (a missing 'e-3')"),
    Operator("lr_div1e4", "LR_TOO_LOW", lambda s: s.with_(lr_scale=1e-4), every,
             doc="learning rate 1e-4 of the working one"),
    Operator("scheduler_per_batch", "LR_SCHEDULE_MISUSE", lambda s: s.with_(schedule="step_per_batch"), every,
             styles=TRAINING, fix=lambda s: s.with_(schedule="step_per_epoch"),
             doc="StepLR(step_size=10, gamma=0.1) written for epochs, stepped every batch"),
    Operator("constant_lr_plateau", "NO_LR_SCHEDULE", lambda s: _sgd(s).with_(batch_size=16, steps=300),
             named("regression", "mlp", "binary", "cnn_bn", "rescnn"), styles=TRAINING,
             fix=lambda s: _sgd(s).with_(batch_size=16, steps=300, schedule="cosine"),
             doc="constant SGD learning rate with small batches: the loss stalls at the noise floor"),
    Operator("clip_1e-4", "GRAD_CLIP_TOO_SMALL", lambda s: _sgd(s).with_(clip=1e-4), every, styles=TRAINING,
             fix=_sgd, doc="clip_grad_norm_(max_norm=1e-4) with SGD"),
    Operator("accumulation_not_divided", "GRAD_ACCUM_SCALING", lambda s: micro_batches(_sgd(s), divide=False), every,
             styles=LOOP, fix=lambda s: micro_batches(_sgd(s)),
             doc="4 micro-batch losses summed, not averaged (SGD at the rate tuned for the full batch)"),
    Operator("batch_of_two", "BATCH_TOO_SMALL", lambda s: s.with_(batch_size=2), every,
             doc="batch size 2 at the learning rate tuned for the family's batch"),
    # -- the loop
    Operator("no_zero_grad", "MISSING_ZERO_GRAD", lambda s: s.with_(zero_grad=False), every, styles=LOOP),
    Operator("no_optimizer_step", "OPTIMIZER_NOT_CONNECTED", lambda s: s.with_(optimizer_step=False), every,
             styles=LOOP, doc="optimizer.step() (or the hand-written update) never called"),
    Operator("optimizer_over_old_model", "OPTIMIZER_NOT_CONNECTED", lambda s: s.with_(stale_optimizer=True), every,
             styles=frozenset({"wrapped", "own_loss", "preflight"}),
             doc="the model re-created after the optimizer was built over the first one"),
    Operator("eval_forgotten", "EVAL_MODE_FORGOTTEN", lambda s: s.with_(eval_mode=False),
             lambda f: f.dropout > 0 or f.has_batchnorm, styles=LOOP, doc="validation without model.eval()"),
    Operator("train_mode_not_restored", "EVAL_MODE_FORGOTTEN", lambda s: s.with_(train_after_eval=False),
             lambda f: f.dropout > 0 or f.has_batchnorm, styles=LOOP,
             doc="model.train() once before the loop: after the first validation's model.eval() it trains in eval mode"),
    Operator("functional_dropout_in_eval", "EVAL_MODE_FORGOTTEN", lambda s: s.plus_bugs("dropout_always"),
             has("dropout_always"), doc="F.dropout(h, 0.5) without training=self.training"),
    Operator("hidden_state_retained", "GRAPH_RETAINED", lambda s: s.with_(carry_state="retain"), named("lstm"),
             styles=LOOP, measure="graph", fix=lambda s: s.with_(carry_state="detach"),
             doc="recurrent state carried across batches without detach, backward(retain_graph=True); "
                 "with a torch optimizer the second backward raises, with p.data updates the graph grows"),
    Operator("loss_total_keeps_graph", "GRAPH_RETAINED", lambda s: s.with_(running_loss_tensor=True), every,
             styles=LOOP, measure="graph", doc="total_loss += loss (not loss.item()) for the epoch's printout"),
    # -- the model
    Operator("relu_on_logits", "WRONG_OUTPUT_ACTIVATION", lambda s: s.plus_bugs("relu_out"), has("relu_out")),
    Operator("sigmoid_on_regression", "WRONG_OUTPUT_ACTIVATION", lambda s: s.plus_bugs("sigmoid_out"),
             named("regression"), doc="sigmoid on a standardised (unbounded) regression target"),
    Operator("softmax_before_cross_entropy", "DOUBLE_SOFTMAX", lambda s: s.plus_bugs("softmax_out"),
             all_of(softmax_output, has("softmax_out"))),
    Operator("sigmoid_before_bce_with_logits", "DOUBLE_SOFTMAX", lambda s: s.plus_bugs("sigmoid_out"),
             named("binary", "vae")),
    Operator("missing_activation", "MISSING_ACTIVATION", lambda s: s.plus_bugs("no_activation"),
             has("no_activation")),
    Operator("custom_backward_wrong", "BROKEN_BACKWARD", lambda s: s.plus_bugs("broken_backward"),
             has("broken_backward"), doc="a hand-written ReLU Function whose backward drops grad_output"),
    Operator("inplace_on_saved_activation", "INPLACE_AUTOGRAD", lambda s: s.plus_bugs("inplace"), has("inplace"),
             doc="an in-place op on a tensor autograd saved (the user's loop raises at backward)"),
    Operator("detached_body", "DETACHED_GRAPH", lambda s: s.plus_bugs("detach_body"), has("detach_body")),
    Operator("frozen_from_scratch", "FROZEN_PARAMETERS", lambda s: s.with_(freeze="random"), every,
             doc="fine-tuning code (freeze all but the head) used on a model trained from scratch"),
    Operator("dead_relu_bias", "DEAD_RELU", lambda s: s.with_(init="dead_bias"), lambda f: f.dead_bias is not None,
             doc="the bias feeding the first ReLU initialised to -10"),
    Operator("zero_init", "BAD_INIT", lambda s: s.with_(init="zero"), every),
    Operator("init_std_1", "BAD_INIT", lambda s: s.with_(init="large"), every,
             doc="nn.init.normal_(w, std=1) on every weight"),
    Operator("deep_sigmoid", "VANISHING_GRADIENTS", lambda s: s.with_(act="sigmoid", depth=10),
             lambda f: f.mlp_like, doc="10 sigmoid layers"),
    Operator("saturated_tanh", "SATURATED_ACTIVATIONS", lambda s: s.with_(act="tanh", depth=4, init="large"),
             lambda f: f.mlp_like, alternates=("BAD_INIT",), doc="tanh layers initialised with std 1"),
    Operator("too_narrow", "UNDERFITTING", lambda s: s.with_(width=2), lambda f: f.name != "char_lm",
             doc="hidden width 2"),
    Operator("batch_first_mixup", "WRONG_RESHAPE", lambda s: s.plus_bugs("batch_first"), has("batch_first"),
             measure="either", doc="nn.LSTM(batch_first=False) fed (batch, time, features)"),
    Operator("view_instead_of_permute", "WRONG_RESHAPE",
             lambda s: s.plus_bugs("time_major_view" if s.family == "lstm" else "heads_view"),
             lambda f: bool({"time_major_view", "heads_view"} & f.switches),
             fix=lambda s: s.plus_bugs("time_major") if s.family == "lstm" else s, measure="either",
             doc="x.view(T, B, F) for x.transpose(0, 1); heads split with reshape(B, nh, T, hs)"),
    # -- the loss
    Operator("nll_on_probabilities", "WRONG_LOSS", lambda s: s.plus_bugs("softmax_out").with_(loss="nll"),
             all_of(softmax_output, has("softmax_out")), doc="NLLLoss on softmax outputs (not log-softmax)"),
    Operator("mse_on_class_index", "WRONG_LOSS", lambda s: s.with_(loss="mse_index"), softmax_output,
             alternates=("SHAPE_BROADCAST",), doc="MSELoss(logits, y.float().unsqueeze(-1)): classes as numbers, broadcast"),
    Operator("loss_sign_flipped", "WRONG_LOSS",
             lambda s: s.with_(loss="kl_sign" if s.family == "vae" else "missing_minus"),
             lambda f: f.task != "regression", doc="log-likelihood maximised as a loss; the KL term's sign in a VAE"),
    Operator("target_shape_broadcast", "SHAPE_BROADCAST", lambda s: s.plus_data(squeeze_targets),
             named("regression"), doc="MSELoss((N,1) outputs, (N,) targets) broadcasts to (N,N)"),
    Operator("labels_plus_minus_one", "LABEL_DTYPE", lambda s: s.plus_data(plus_minus_labels), named("binary"),
             doc="-1/+1 labels into BCEWithLogitsLoss"),
    # -- numerics
    Operator("log_of_softmax_unclamped", "LOG_OF_ZERO", lambda s: s.with_(loss="log_unclamped", logit_scale=1000.0),
             logit_output, measure="nonfinite", fix=lambda s: s.with_(logit_scale=1000.0),
             doc="-log(softmax(z)[y]) (or BCE by hand) on logits scaled by a temperature of 1e-3"),
    Operator("softmax_without_max_subtraction", "NUMERICAL_OVERFLOW",
             lambda s: s.with_(loss="naive_softmax", logit_scale=1000.0), softmax_output, measure="nonfinite",
             fix=lambda s: s.with_(logit_scale=1000.0), doc="exp(z) / exp(z).sum() on logits scaled by 1000"),
    Operator("standardize_without_eps", "DIVISION_BY_ZERO",
             lambda s: s.plus_bugs("std_no_eps").plus_data(add_constant_feature), has("std_no_eps"),
             measure="nonfinite", fix=lambda s: s.plus_bugs("std_eps").plus_data(add_constant_feature),
             doc="(x - x.mean(0)) / x.std(0) in forward, with a constant feature"),
    Operator("nan_in_inputs", "NAN_IN_DATA", lambda s: s.plus_data(nan_in_inputs), float_inputs, measure="nonfinite"),
    # -- the data
    Operator("raw_inputs", "UNNORMALIZED_INPUTS", lambda s: s.plus_data(raw_inputs),
             lambda f: f.inputs in ("image", "tabular", "sequence") and f.task != "vae"),
    Operator("huge_regression_targets", "UNNORMALIZED_TARGETS", lambda s: s.plus_data(huge_targets),
             named("regression")),
    Operator("labels_shuffled_separately", "LABELS_MISALIGNED", lambda s: s.plus_data(shuffle_labels),
             lambda f: f.task != "vae"),
    Operator("lm_target_not_shifted", "LABELS_MISALIGNED", lambda s: s.plus_data(target_not_shifted),
             named("char_lm"), alternates=("DATA_LEAKAGE",), doc="targets = inputs: the next character is visible"),
    Operator("labels_40pct_flipped", "LABEL_NOISE", lambda s: s.plus_data(flip_labels), classifier),
    Operator("labels_collapsed", "LABEL_NOISE", lambda s: s.plus_data(collapse_labels), classifier),
    Operator("sorted_by_label", "UNSHUFFLED_DATA", lambda s: s.plus_data(sort_by_label).with_(shuffle=False),
             lambda f: f.task in ("multiclass", "binary", "regression")),
    Operator("zeroed_batches", "SILENT_DATA_LOSS", lambda s: s.with_(zeroed_batch_fraction=0.25), float_inputs,
             styles=TRAINING, doc="a quarter of the batches silently zeroed by the collate"),
    Operator("duplicated_rows", "DUPLICATE_SAMPLES", lambda s: s.plus_data(duplicate_rows), every),
    Operator("leaked_validation", "DATA_LEAKAGE", lambda s: s.plus_data(leak_validation), every, measure="better"),
    Operator("class_imbalance", "CLASS_IMBALANCE", lambda s: s.plus_data(imbalance), classifier),
    Operator("overfit_tiny_train", "OVERFITTING", lambda s: s.plus_data(tiny_train).with_(steps=300, batch_size=48),
             lambda f: f.task in ("multiclass", "binary", "regression"), styles=TRAINING,
             fix=lambda s: s.with_(steps=300), doc="48 training rows, 300 steps"),
)  # fmt: skip

BY_NAME = {op.name: op for op in OPERATORS}
assert len(BY_NAME) == len(OPERATORS)

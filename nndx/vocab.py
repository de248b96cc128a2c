"""The kinds nndx reasons about — losses, activations, normalisation and dropout — once.

Torch-free on purpose: the collector maps what it sees onto these names, the rules read
the names back from a report, and a server that only diagnoses JSON never loads torch.
A report carries the *module* name of a loss or activation (``CrossEntropyLoss``,
``ReLU``); functional forms (``F.cross_entropy``, ``torch.relu``) are reported under
that same name, so one rule reads both.

How to use::

    from nndx import vocab
    kind = vocab.loss_kind("cross_entropy")      # the functional name works too
    kind.name, kind.task, kind.expects           # 'CrossEntropyLoss', 'classification', 'logits'
    vocab.activation_kind("sigmoid").bounds      # (0.0, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Task = Literal["classification", "regression"]
Expects = Literal["logits", "probabilities", "log_probabilities", "values"]


@dataclass(frozen=True)
class LossKind:
    """What a loss needs from the model's output and the targets.

    ``expects`` is what the output must be: raw ``logits`` (the loss applies its own
    softmax/sigmoid), ``probabilities`` (BCELoss), ``log_probabilities`` (NLLLoss) or plain
    ``values`` (regression). ``class_axis`` losses read classes along dim 1 (one row per
    sample); ``binary`` losses read one logit or probability per sample and label."""

    name: str
    functional: str
    task: Task | None
    expects: Expects
    class_axis: bool = False
    binary: bool = False


LOSSES: tuple[LossKind, ...] = (
    LossKind("CrossEntropyLoss", "cross_entropy", "classification", "logits", class_axis=True),
    LossKind("NLLLoss", "nll_loss", "classification", "log_probabilities", class_axis=True),
    LossKind("MultiMarginLoss", "multi_margin_loss", "classification", "logits", class_axis=True),
    LossKind("BCELoss", "binary_cross_entropy", "classification", "probabilities", binary=True),
    LossKind("BCEWithLogitsLoss", "binary_cross_entropy_with_logits", "classification", "logits", binary=True),
    LossKind("MultiLabelSoftMarginLoss", "multilabel_soft_margin_loss", "classification", "logits"),
    LossKind("MSELoss", "mse_loss", "regression", "values"),
    LossKind("L1Loss", "l1_loss", "regression", "values"),
    LossKind("SmoothL1Loss", "smooth_l1_loss", "regression", "values"),
    LossKind("HuberLoss", "huber_loss", "regression", "values"),
    LossKind("GaussianNLLLoss", "gaussian_nll_loss", "regression", "values"),
    LossKind("KLDivLoss", "kl_div", None, "log_probabilities"),
    # (time, batch, classes) log-probabilities of a sequence labeller against label sequences
    LossKind("CTCLoss", "ctc_loss", None, "log_probabilities"),
)
_LOSS_BY_NAME = {name: kind for kind in LOSSES for name in (kind.name, kind.functional)}


def loss_kind(name: str | None) -> LossKind | None:
    """The kind of a loss from its module name (``MSELoss``) or functional name (``mse_loss``)."""
    return _LOSS_BY_NAME.get(name) if name else None


def loss_name(name: str) -> str:
    """The name reports use: the module name for a known loss, else ``name`` as given."""
    kind = loss_kind(name)
    return kind.name if kind is not None else name


def loss_task(name: str | None) -> Task | None:
    kind = loss_kind(name)
    return kind.task if kind is not None else None


@dataclass(frozen=True)
class ActivationKind:
    """An element-wise non-linearity. ``bounds`` are the output limits of a saturating one
    (sigmoid, tanh), where gradients vanish; ``zeroes_negatives`` marks the ReLU family,
    whose units can die (output 0 for every input); ``over_classes`` marks softmax-like
    ones that normalise along the class axis."""

    name: str
    functional: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None
    zeroes_negatives: bool = False
    over_classes: bool = False
    log: bool = False


ACTIVATIONS: tuple[ActivationKind, ...] = (
    ActivationKind("ReLU", ("relu", "relu_"), zeroes_negatives=True),
    ActivationKind("ReLU6", ("relu6",), zeroes_negatives=True),
    ActivationKind("LeakyReLU", ("leaky_relu", "leaky_relu_")),
    ActivationKind("PReLU", ("prelu",)),
    ActivationKind("RReLU", ("rrelu", "rrelu_")),
    ActivationKind("ELU", ("elu", "elu_")),
    ActivationKind("SELU", ("selu", "selu_")),
    ActivationKind("CELU", ("celu", "celu_")),
    ActivationKind("GELU", ("gelu",)),
    ActivationKind("SiLU", ("silu",)),
    ActivationKind("Mish", ("mish",)),
    ActivationKind("Softplus", ("softplus",)),
    ActivationKind("GLU", ("glu",)),  # a half of the features gated by the sigmoid of the other
    ActivationKind("Sigmoid", ("sigmoid", "sigmoid_"), bounds=(0.0, 1.0)),
    ActivationKind("Tanh", ("tanh", "tanh_"), bounds=(-1.0, 1.0)),
    ActivationKind("Hardtanh", ("hardtanh", "hardtanh_"), bounds=(-1.0, 1.0)),
    ActivationKind("Hardsigmoid", ("hardsigmoid",), bounds=(0.0, 1.0)),
    ActivationKind("Hardswish", ("hardswish",)),
    ActivationKind("Softmax", ("softmax",), bounds=(0.0, 1.0), over_classes=True),
    ActivationKind("LogSoftmax", ("log_softmax",), over_classes=True, log=True),
)
_ACTIVATION_BY_NAME = {name: kind for kind in ACTIVATIONS for name in (kind.name, *kind.functional)}
ACTIVATION_NAMES = frozenset(kind.name for kind in ACTIVATIONS)


def is_embedding(name: str) -> bool:
    """Whether a layer type is an embedding lookup (Embedding, EmbeddingBag, a model's own
    AdaptiveEmbedding): its rows are a table, its output scale the table's init."""
    return "Embedding" in name


def activation_kind(name: str | None) -> ActivationKind | None:
    """The kind of an activation from its module name (``Sigmoid``) or function (``sigmoid``)."""
    return _ACTIVATION_BY_NAME.get(name) if name else None


# Normalisation and regularisation layers, by module class name (subclasses such as
# SyncBatchNorm or LazyBatchNorm2d are matched by the collector with isinstance; a BatchNorm
# written by hand by its name, d2l's ``BatchNorm``, or by its running statistics).
BATCHNORM_NAMES = frozenset({"BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
                             "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d"})  # fmt: skip
NORMALIZATION_NAMES = BATCHNORM_NAMES | frozenset({
    "LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm",
})  # fmt: skip
DROPOUT_NAMES = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"})
# modules that change no values at inference time (they never decide what the output is)
PASSTHROUGH_NAMES = DROPOUT_NAMES | frozenset({"Identity", "Flatten", "Unflatten"})
# layers whose weights apply one linear map (dense or convolutional): two in a row with nothing
# non-linear between compose to one (NNDX401); their weight's gain is how much they scale their
# input's std (NNDX207)
LINEAR_LAYER_NAMES = frozenset({"Linear", "LazyLinear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
                                "ConvTranspose2d", "ConvTranspose3d"})  # fmt: skip
# layers between two linear layers that leave their composition (nearly) linear: a Linear,
# a BatchNorm and a Linear are one affine map at inference
LINEAR_PRESERVING_NAMES = PASSTHROUGH_NAMES | BATCHNORM_NAMES | frozenset({"LayerNorm", "GroupNorm"})

# derived name sets the rules read
CLASSIFICATION_LOSS_NAMES = frozenset(k.name for k in LOSSES if k.task == "classification")
REGRESSION_LOSS_NAMES = frozenset(k.name for k in LOSSES if k.task == "regression")
# regression losses whose gradient per sample is bounded (|dL/dy| <= 1, or delta): targets of
# a large scale slow the fit of their offset but do not make the gradients large
BOUNDED_GRADIENT_LOSS_NAMES = frozenset({"L1Loss", "SmoothL1Loss", "HuberLoss"})
# losses that read a (log-)softmax over the class axis of an [N, C, ...] output
SOFTMAX_LOSS_NAMES = frozenset({"CrossEntropyLoss", "NLLLoss"})

# autograd ops (grad_fn names without "Backward0") that move or pick values without changing them
SHAPE_OPS = frozenset({"View", "Reshape", "ReshapeAlias", "UnsafeView", "AsStrided", "Index", "IndexSelect", "Select",
                       "Slice", "Narrow", "MaskedSelect", "Squeeze", "Unsqueeze", "Permute", "Transpose", "T", "Clone",
                       "Expand", "Cat", "Stack", "Split", "SplitWithSizes", "Unbind", "Flip", "Roll", "Repeat",
                       "ToCopy", "Alias"})  # fmt: skip


def op_follows(path: list[str], first: str, then: str) -> bool:
    """Whether ``then`` is applied to ``first``'s result (as its first input) with only shape
    ops between, in a path of autograd ops (``loop.ops_before_loss``): ``Softmax`` then
    ``LogSoftmax``; not ``Softmax`` then ``KlDiv#1``, a softmax that is kl_div's target."""
    for i, op in enumerate(path):
        if op == first:
            rest = [o for o in path[i + 1:] if o.split("#")[0] not in SHAPE_OPS]
            if rest and rest[0] == then:
                return True
    return False

# A layer's gain (weight rms x sqrt(fan_in): how much it scales its input's std) that no
# standard init gives: PyTorch's default gives 0.58, He 1.41; N(0, 1) gives sqrt(fan_in).
# NNDX207 reads it; the BAD_INIT remedy restores PyTorch's init where a gain is past it.
MAX_INIT_GAIN = 5.0

# A ReLU unit is called dead when its output was zero on every one of at least this many
# outputs (samples x positions): on one sample half of a live layer is zero. NNDX201/208
# read it; the DEAD_RELU remedy re-initialises only units judged so.
MIN_VALUES_PER_UNIT = 8

# Optimizers whose step divides by a running gradient scale: a loss (and its gradient) k
# times larger moves the weights by about the same amount (up to eps)
SCALE_INVARIANT_OPTIMIZERS = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad",
                                        "Adadelta", "SparseAdam", "Adafactor"})  # fmt: skip

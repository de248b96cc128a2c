"""Model rules (NNDX4xx): the static model summary against the loss that trains it."""

from __future__ import annotations

from nndx import vocab
from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, LayerInfo, LossCall, ModelSummary
from nndx.rules._series import (
    float_targets_like_outputs,
    is_classification,
    loss_calls,
    loss_curve,
    num_classes,
    weight_shapes,
)
from nndx.rules.engine import Hit, rule

# Layers that keep a stack linear: anything affine or that only reshapes/masks.
PASS_THROUGH_TYPES = vocab.LINEAR_PRESERVING_NAMES


def _sequential_neighbours(first: str, second: str) -> bool:
    """Whether two leaf modules are children of nn.Sequential containers, where the order
    of the children is the order of execution and nothing runs between them.

    Elsewhere module order proves nothing: attention's query/key/value are parallel
    Linears, and a custom forward may apply F.relu between two Linears.
    """
    a, b = first.split("."), second.split(".")
    if all(part.isdigit() for part in a + b):  # the model is (nested) Sequentials
        return True
    return a[:-1] == b[:-1] and a[-1].isdigit() and b[-1].isdigit()


@rule(
    "NNDX401",
    C.MISSING_ACTIVATION,
    "warning",
    "Stacked linear layers with no non-linearity between them",
    detects="A Linear/Conv layer whose input is another Linear/Conv layer's output with only reshapes, "
    "dropout or normalisation between them, as a probe's observed forward shows (functional activations "
    "such as F.relu count). Without an observed forward, two Linear/Conv children of nn.Sequential "
    "containers adjacent in registration order. When no forward was observed and the model has no activation "
    "module at all (a forward may call F.relu unseen), it warns only if the loss is not moving, and is info "
    "otherwise. Two Linears joined through a width narrower than the first's input and the second's output (an "
    "autoencoder's linear code: a low-rank map one layer cannot be) are no missing activation; nor is a layer "
    "reading a stream that other paths read too (a ResNet block's shortcut projection of the stem's output, "
    "beside a residual branch with its ReLUs); nor a gated linear unit's own projection, whose output goes "
    "through a GLU (a Temporal Fusion Transformer's gated residual networks). Info when every such pair joins "
    "layers of two kinds (a Linear whose output is viewed as maps for a ConvTranspose2d, an encoder's 1x1 Conv2d "
    "code read by a decoder's ConvTranspose2d) in a model with activations elsewhere: a change of representation "
    "is as often by design as a lost activation.",
    why="A composition of linear maps is one linear map: the extra layers add parameters but no "
    "capacity, and the model cannot fit a non-linear task.",
    fix="Insert an activation (nn.ReLU(), nn.GELU()) between the layers.",
)
def missing_activation(report: DiagnosticReport) -> Hit | None:
    model = report.model
    if model is None or len(model.layers) < 2:
        return None
    pairs = []
    kinds = {layer.name: layer.type for layer in model.layers}
    if model.forward_observed:
        # data flow, not module order: parallel branches and F.relu between layers are told apart
        linear = vocab.LINEAR_LAYER_NAMES
        by_name = {layer.name: layer for layer in model.layers}
        # a gated linear unit's own projection: its gate is the non-linearity the layer feeds
        gated = {layer.input_from for layer in model.layers if layer.type == "GLU"}
        pairs = [(layer.input_from, layer.name) for layer in model.layers
                 if layer.type in linear and kinds.get(layer.input_from or "") in linear
                 and not _linear_bottleneck(by_name[layer.input_from], layer)
                 and not (by_name[layer.input_from].readers or 0) >= 2 and layer.name not in gated]  # fmt: skip
    else:
        previous = None
        for layer in model.layers:
            if layer.type in vocab.LINEAR_LAYER_NAMES:
                if previous is not None and _sequential_neighbours(previous.name, layer.name):
                    pairs.append((previous.name, layer.name))
                previous = layer
            elif layer.type not in PASS_THROUGH_TYPES:
                previous = None
    if not pairs:
        return None
    # a layer of another kind read directly (a dense projection viewed as maps for a transposed convolution, an
    # encoder's 1x1 code read by a decoder) changes representation, by design as often as not; the same kind
    # twice (Linear, Linear; ConvTranspose2d, ConvTranspose2d) is a stack that lost its activation
    pairs.sort(key=lambda pair: kinds.get(pair[0]) != kinds.get(pair[1]))
    evidence = {"linear_pairs": [f"{a} -> {b}" for a, b in pairs], "activation_modules": len(model.activations)}
    if model.activations or model.forward_observed:
        # an observed forward sees functional activations too: none there is none at all
        changes_kind = kinds.get(pairs[0][0]) != kinds.get(pairs[0][1]) and bool(model.activations)
        return Hit(symptom=f"no activation between {pairs[0][0]} and {pairs[0][1]}"
                   + (f" ({kinds[pairs[0][0]]} into {kinds[pairs[0][1]]}, with activations elsewhere: a change of "
                      "representation, most often by design)" if changes_kind else ""),
                   evidence=evidence, severity="info" if changes_kind else None, score=0.5 if changes_kind else 2.0)
    curve = loss_curve(report)
    stalled = curve.n >= 10 and curve.progress < 0.5
    return Hit(
        symptom="the model has no activation module; its linear layers may compose to one linear map",
        evidence=evidence | {"loss_relative_progress": curve.progress if curve.n >= 10 else None},
        severity="warning" if stalled else "info",
        score=1.5 if stalled else 0.5,
        next_probe="overfit_one_batch on a non-linear batch; check the forward for functional activations",
    )


def _linear_bottleneck(first: LayerInfo, second: LayerInfo) -> bool:
    """Linear -> Linear through a width narrower than both the first's input and the
    second's output: a low-rank factorisation (an autoencoder's linear code), which a
    single layer could not be, so composing them is deliberate, not a lost activation."""
    if first.type not in ("Linear", "LazyLinear") or second.type not in ("Linear", "LazyLinear"):
        return False
    if not first.output_shape or not second.output_shape:
        return False
    width, out = first.output_shape[-1], second.output_shape[-1]
    fan_in = first.param_count // max(width, 1) - 1  # weight in x width (+ bias width): at least in - 1
    return 0 < width < min(fan_in, out)


def _ends_in_linear(model: ModelSummary | None) -> bool:
    return (model is not None and model.forward_observed and model.output_activation is None
            and model.last_layer in vocab.LINEAR_LAYER_NAMES)  # fmt: skip


# targets this far (relative to their scale) past an output activation's bound are outside it
RANGE_SLACK = 1e-3


@rule(
    "NNDX402",
    C.WRONG_OUTPUT_ACTIVATION,
    "error",
    "The last activation cannot produce the targets",
    detects="CrossEntropyLoss over a single output unit (the loss is always 0); a model ending in "
    "ReLU or Sigmoid trained with CrossEntropyLoss (logits clipped to >= 0 or squashed to [0, 1]: from the "
    "observed forward, or from the values reaching the loss when no forward was observed); a "
    "model ending in ReLU/Sigmoid/Tanh regressing targets outside that activation's range (mean ± std beyond "
    "it, and, where measured, the smallest or largest target too: images in [-1, 1], mostly background at -1, "
    "fit a Tanh however lopsided their spread). The targets are the data checks' training split's; without "
    "data checks, those a regression loss, or a loss of the user's own, was given shaped as the outputs.",
    why="The output layer then cannot express what the loss asks for: the loss is constant or stalls "
    "above its minimum.",
    fix="End classifiers with a plain Linear producing C >= 2 logits (or 1 logit with BCEWithLogitsLoss); "
    "end regressors with a plain Linear, and normalise the targets.",
)
def wrong_output_activation(report: DiagnosticReport) -> Hit | None:
    model = report.model
    output_activation = model.output_activation if model is not None else None
    for call in loss_calls(report):
        if call.loss_type in vocab.SOFTMAX_LOSS_NAMES and len(call.output_shape) >= 2 and call.output_shape[1] == 1:
            return Hit(
                symptom=f"{call.loss_type} over a single output unit: the softmax of one logit is always 1",
                evidence={"loss_type": call.loss_type, "output_shape": [str(d) for d in call.output_shape]},
                score=3.0,
            )
        # values only suggest a squashing activation; an observed forward that ended in a
        # Linear/Conv with nothing after it shows there is none (a narrow or dead network's
        # logits can all be small and positive)
        clipped = None if _ends_in_linear(model) else _logits_clipped(call)
        if clipped is not None:
            return Hit(
                symptom=f"the logits reaching {call.loss_type} {clipped}",
                evidence={
                    "loss_type": call.loss_type,
                    "output_min": call.output_min,
                    "output_max": call.output_max,
                    "output_zero_fraction": call.output_zero_fraction,
                    "output_activation": output_activation,
                },
                score=2.5,
            )
        if call.loss_type == "CrossEntropyLoss" and output_activation in ("ReLU", "Sigmoid"):
            return Hit(
                symptom=f"a model ending in {output_activation} trained with CrossEntropyLoss",
                evidence={
                    "loss_type": call.loss_type,
                    "output_activation": output_activation,
                    "output_min": call.output_min,
                    "output_max": call.output_max,
                },
                score=2.0,
            )
    bounds = {"ReLU": (0.0, None), "Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0)}
    targets = _value_targets(report) if output_activation in bounds else None
    if targets is not None:
        low, high = bounds[output_activation]
        mean, std, smallest, largest = targets
        # the extremes, where measured, say whether any target lies outside at all
        slack = RANGE_SLACK * max(1.0, abs(mean) + std)
        below = low is not None and mean - std < low and (smallest is None or smallest < low - slack)
        above = high is not None and mean + std > high and (largest is None or largest > high + slack)
        if below or above:
            return Hit(
                symptom=f"targets of mean {mean:.3g} ± {std:.3g} through a final {output_activation}",
                evidence={"output_activation": output_activation, "target_mean": mean, "target_std": std,
                          "target_min": smallest, "target_max": largest},  # fmt: skip
                score=2.0,
            )
    return None


def _value_targets(report: DiagnosticReport) -> tuple[float, float, float | None, float | None] | None:
    """(mean, std, min, max) of the targets the outputs are regressed on: the data checks' training
    split when it holds continuous targets; else the floating-point targets, shaped as the outputs, that
    a regression loss or one of the user's own was given (an autoencoder's images, no data checks run)."""
    train = report.data.train if report.data is not None else None
    if train is not None and train.label_kind == "float_continuous":
        if train.target_mean is None or train.target_std is None:
            return None
        return train.target_mean, train.target_std, train.target_min, train.target_max
    for call in loss_calls(report):
        kind = vocab.loss_kind(call.loss_type)
        if (kind is None or kind.task == "regression") and call.target_mean is not None \
                and call.target_std is not None and float_targets_like_outputs(call):  # fmt: skip
            return call.target_mean, call.target_std, call.target_min, call.target_max
    return None


def _logits_clipped(call: LossCall) -> str | None:
    """How the outputs a logits loss received were squashed, from their values alone (so a
    functional F.relu / torch.sigmoid shows as surely as a module): None when they look
    like logits."""
    kind = vocab.loss_kind(call.loss_type)
    if kind is None or kind.expects != "logits" or call.output_min is None or call.output_max is None:
        return None
    if call.output_min < 0.0 or call.output_rows_sum_to_one:  # probabilities are NNDX314's
        return None
    if call.output_zero_fraction is not None and call.output_zero_fraction >= 0.2:
        return f"are never negative and {call.output_zero_fraction:.0%} are exactly 0: a ReLU clips them"
    if kind.class_axis and call.output_max <= 1.0 and len(call.output_shape) >= 2 and call.output_shape[1] > 1:
        return "all lie in [0, 1] without summing to 1: a sigmoid squashes them"
    return None


def _layer_widths(report: DiagnosticReport) -> list[tuple[str, int]]:
    """(layer, output units) of the Linear layers in order: from the weight shapes
    ([out, in]) of the parameters, else from the recorded output shapes. A convolution's
    channels are no bottleneck (each is a whole feature map: 8 channels of 8x8 hold 512
    features), so conv kernels are left out; so are embedding tables ([rows, features]: BERT's
    token-type table of 2 rows gives 64 features, not 2)."""
    tables = {layer.name for layer in report.model.layers if vocab.is_embedding(layer.type)} if report.model else set()
    seen = [(layer, shape[0]) for layer, shape in weight_shapes(report).items()
            if len(shape) == 2 and layer not in tables]  # fmt: skip
    if seen:
        return seen
    model = report.model
    return [
        (layer.name, layer.output_shape[1])
        for layer in (model.layers if model is not None else [])
        if layer.type in ("Linear", "LazyLinear", "Bilinear") and layer.output_shape and len(layer.output_shape) == 2
    ]


# a hidden representation of this few features (a narrow Linear, channels pooled into a head) classified
# into more classes is a bottleneck; wider ones (a language model's d_model under its vocabulary) are not
NARROW_FEATURES = 8


def _hidden_inputs(report: DiagnosticReport) -> list[tuple[str, int]]:
    """(layer, input features) of the Linear layers whose input is a hidden representation:
    every Linear after the model's first parameterised layer (in forward order when it was
    observed), read off its weight's shape [out, in] — where another layer's weight gives that
    many features (a conv's channels pooled into a head). A width no layer gives is a slice of a
    wider output: Mamba's dt_proj reads the first dt_rank = 2 of x_proj's 18 columns."""
    model = report.model
    if model is None:
        return []
    shapes = weight_shapes(report)
    tables = {layer.name for layer in model.layers if vocab.is_embedding(layer.type)}
    given = [(name, shape[1] if name in tables and len(shape) == 2 else shape[0]) for name, shape in shapes.items()]
    layers = [layer for layer in model.layers if layer.param_count]
    return [(layer.name, shapes[layer.name][1]) for layer in layers[1:]
            if layer.type in ("Linear", "LazyLinear") and len(shapes.get(layer.name, ())) == 2
            and any(width == shapes[layer.name][1] for name, width in given if name != layer.name)]  # fmt: skip


# a hidden layer of this few units (or channels) through a non-linearity holds a 2-d picture of its
# input whatever the task; a linear 2-d code (an autoencoder's latent for plotting) is left alone
TINY_WIDTH = 2


def _heads(report: DiagnosticReport) -> set[str]:
    """Layers whose output an observed forward put through a softmax or a sigmoid: a head
    that is not the model's last layer (an actor's action probabilities beside a critic's
    value), attention weights from a score ``Linear(h, 1)``, or a gate. None of them is a
    hidden representation, however narrow."""
    model = report.model
    if model is None or not model.forward_observed:
        return set()
    return {layer.input_from for layer in model.layers if layer.input_from and _heading(layer.type)}


def _heading(name: str) -> bool:
    kind = vocab.activation_kind(name)
    return kind is not None and (kind.over_classes or kind.name == "Sigmoid")


def _tiny_non_linear(report: DiagnosticReport) -> list[tuple[str, int, str]]:
    """(layer, width, activation) for each weighted hidden layer of at most TINY_WIDTH outputs
    whose output an observed forward fed to an activation other than a head's (see _heads)."""
    model = report.model
    if model is None or not model.forward_observed:
        return []
    shapes = weight_shapes(report)
    weighted = [layer.name for layer in model.layers if len(shapes.get(layer.name, ())) >= 2]
    readers = _weighted_readers(model.layers, set(weighted))
    found = []
    for layer in model.layers:
        source = layer.input_from
        if vocab.activation_kind(layer.type) is None or _heading(layer.type) or source not in shapes or (
                source in weighted[-1:]) or source not in readers:  # fmt: skip
            continue
        width = shapes[source][0]
        # a narrowing, not a small sub-network: the output head reads it, or something wider (a Temporal
        # Fusion Transformer's variable selection over 2 inputs runs 2 units through an ELU into 2 more)
        narrowing = any(reader in weighted[-1:] or shapes[reader][0] > width for reader in readers[source])
        if len(shapes[source]) >= 2 and width <= TINY_WIDTH and narrowing:
            found.append((source, width, layer.type))
    return found


def _read_by_weighted(report: DiagnosticReport) -> set[str] | None:
    """The weighted layers another weighted layer reads in an observed forward (the hidden
    ones: a branch's last Linear whose output is summed into the logit is a head); None
    when no forward was observed."""
    model = report.model
    if model is None or not model.forward_observed:
        return None
    shapes = weight_shapes(report)
    weighted = {layer.name for layer in model.layers if len(shapes.get(layer.name, ())) >= 2}
    return set(_weighted_readers(model.layers, weighted))


def _weighted_readers(layers: list, weighted: set[str]) -> dict[str, list[str]]:
    """For each weighted layer whose output another weighted layer reads (through activations
    and other layers without weights: the hidden ones), those readers. A layer no weighted
    layer reads is a head (DeepAR's sigma head of one unit, put through a softplus into the
    output)."""
    made_by = {layer.name: layer.input_from for layer in layers}
    readers: dict[str, list[str]] = {}
    for layer in layers:
        if layer.name not in weighted:
            continue
        source, hops = made_by.get(layer.name), 0
        while source is not None and source not in weighted and hops < 16:
            source, hops = made_by.get(source), hops + 1
        if source is not None and source in weighted:
            readers.setdefault(source, []).append(layer.name)
    return readers


@rule(
    "NNDX403",
    C.UNDERFITTING,
    "warning",
    "A hidden layer narrower than the task needs",
    detects="A classifier with a hidden representation of at most 8 features and fewer than the classes "
    "(or a single unit): a hidden Linear layer's output (one another weighted layer reads, where a forward was "
    "observed: a branch's last Linear summed into the logit is a head), or the input of a Linear after the first layer "
    "(channels pooled into a head; a width no other layer gives is a slice of a wider output, as Mamba's dt_rank). "
    "In any model, a hidden Linear or convolution of at most 2 units or "
    "channels whose output an observed forward puts through an activation other than a softmax or a sigmoid "
    "(there it is a head, attention scores or a gate) and the output head or a weighted layer of more units then "
    "reads (else it is an output head: DeepAR's one-unit sigma through a softplus; or a small sub-network inside, "
    "2 units into 2). "
    "Warning while the train loss kept over half its initial level or the model could not overfit one batch; info "
    "when training still "
    "progresses.",
    why="A bottleneck that narrow caps what the layers after it can separate: the model underfits "
    "however long it trains.",
    fix="Widen the narrow layer (at least as many units as classes, usually far more).",
)
def narrow_bottleneck(report: DiagnosticReport) -> Hit | None:
    model = report.model
    # the task and class count as any path gives them (the data checks, the loss calls),
    # not only as a caller declared them
    classes = num_classes(report)
    if model is None or len(model.layers) < 2:
        return None
    narrow = []
    if is_classification(report) is True and classes:
        widths, heads, read = _layer_widths(report), _heads(report), _read_by_weighted(report)
        hidden = [(name, w, f"hidden layer {name} has {w} units") for name, w in widths[:-1]
                  if name not in heads and (read is None or name in read)]  # fmt: skip
        hidden += [(name, w, f"{name} is fed {w} features") for name, w in _hidden_inputs(report)]
        narrow = [entry for entry in hidden if entry[1] < max(2, classes) and entry[1] <= NARROW_FEATURES]
    narrow += [(name, w, f"{name} puts {w} units through {act}") for name, w, act in _tiny_non_linear(report)]
    if not narrow:
        return None
    width = min(w for _, w, _ in narrow)
    curve = loss_curve(report)
    overfit = report.probes.overfit_one_batch if report.probes is not None else None
    stalled = (curve.n >= 10 and curve.end > 0.5 * curve.start) or (overfit is not None and overfit.status == "failed")
    return Hit(
        symptom=narrow[0][2] + (f" for {classes} classes" if classes else ""),
        evidence={
            "layer": narrow[0][0],
            "width": width,
            "num_classes": classes,
            "loss_start": curve.start if curve.n else None,
            "loss_end": curve.end if curve.n else None,
            "overfit_status": overfit.status if overfit is not None else None,
        },
        severity="warning" if stalled else "info",
        score=2.0 if stalled else 0.5,
    )


@rule(
    "NNDX404",
    C.WRONG_RESHAPE,
    "warning",
    "A view or reshape interleaves two axes",
    detects="An observed forward (the probes' own) ran a view/reshape in the model's own code whose output "
    "has an axis that is neither a piece of one input axis nor whole input axes merged, but straddles the "
    "boundary between two, with the length of an input axis: x.view(T, B, F) for x.transpose(0, 1), "
    "x.view(B, nh, T, hs) to split attention heads; and (N, C, *positions) viewed as (N * positions, C), in the "
    "forward or in a loss of the user's own (per-pixel logits flattened without moving the classes last). "
    "An axis that takes a whole-number share of one input axis and every axis after it groups consecutive "
    "entries into the features (WaveNet-style FlattenConsecutive) and is not flagged, unless the output's sizes "
    "are the input's own reordered. torch's own modules are not read, nor a view of a tensor "
    "just padded by cat or pad: relative attention's skew (Transformer-XL's _rel_shift) interleaves on purpose.",
    why="view and reshape only regroup memory in order: asking for the sizes of a permuted tensor gives the "
    "right shape with the elements interleaved across the two axes (time steps mixed with samples, or with "
    "channels). Nothing errors; the model learns from scrambled inputs, or mixes positions in attention.",
    fix="Reorder axes with permute/transpose (then .contiguous() if a view follows): "
    "x.view(B, T, nh, hs).transpose(1, 2) for attention heads, x.transpose(0, 1) for time-major input.",
)
def moved_axes(report: DiagnosticReport) -> Hit | None:
    moved = report.model.moved_axes if report.model is not None else []
    if not moved:
        return None
    return Hit(
        symptom=f"{moved[0]} interleaves two axes" + (f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""),
        evidence={"reshapes": "; ".join(moved)},
        score=2.5,
    )

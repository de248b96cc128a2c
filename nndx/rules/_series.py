"""Small, pure helpers the rules share: loss-curve statistics and report look-ups.

Plain Python (no numpy, no torch) so results are identical everywhere and the rule
engine stays importable on a server that only diagnoses JSON.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from statistics import median
from typing import TypeVar

from nndx import vocab
from nndx.report import DiagnosticReport, GradNormPoint, LayerStats, LossCall, LossPoint, ParameterStats



T = TypeVar("T")

# Within one ``diagnose`` call every rule reads the same curves and layer groups; the
# memo computes each once per report (it was a third of the engine's time) and is
# dropped when the call returns. Outside ``diagnose`` nothing is cached.
_memo: ContextVar[dict[tuple[int, str], tuple[object, object]] | None] = ContextVar("nndx_rules_memo", default=None)


@contextmanager
def memoized() -> Iterator[None]:
    """Share derived values (curves, layer groups) between the rules run inside."""
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def _cached(report: DiagnosticReport, key: str, compute: Callable[[], T]) -> T:
    memo = _memo.get()
    if memo is None:
        return compute()
    entry = memo.get((id(report), key))
    if entry is None or entry[0] is not report:  # ``is``: an id can be reused
        entry = memo[(id(report), key)] = (report, compute())
    return entry[1]  # type: ignore[return-value]


def finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def train_curve(report: DiagnosticReport, split: str = "train") -> list[LossPoint]:
    """The loss history of ``split`` in step order. Read it, do not modify it."""
    return _cached(
        report, "points:" + split, lambda: sorted(report.loss_history.get(split, []), key=lambda p: p.step)
    )


def loss_curve(report: DiagnosticReport, split: str = "train") -> Curve:
    """The :class:`Curve` of ``split``'s loss history."""
    return _cached(report, "curve:" + split, lambda: Curve(train_curve(report, split)))


def no_floor(report: DiagnosticReport) -> bool:
    """Whether the train loss hovers around zero: over its second half (of at least 10
    points) a fifth or more of its values on each side. Such an objective has no floor to
    make progress towards — a policy gradient's log-probabilities weighted by returns
    normalised to mean 0 — so its level, its swings and its fall on one batch measure no fit."""
    curve = loss_curve(report)
    if curve.n < 10:
        return False
    second = curve.values[curve.n // 2 :]
    below = sum(1 for v in second if v < 0) / len(second)
    return 0.2 <= below <= 0.8


def accuracies(report: DiagnosticReport, split: str) -> list[float]:
    """The finite accuracies logged with ``split``'s loss, in step order."""
    return [p.accuracy for p in train_curve(report, split) if p.accuracy is not None and math.isfinite(p.accuracy)]


def generalizes(report: DiagnosticReport) -> float | None:
    """The run's own validation accuracy at its end (median of the last tenth of at least 3
    points) when it is clearly above chance — over twice 1/C and 0.25 above it — else None.
    Labels that do not belong to their inputs cannot give that: a data probe's stand-in that
    finds no signal in the same labels could not read these inputs (point sets, node ids)."""
    classes = num_classes(report)
    val = accuracies(report, "val")
    if classes is None or classes < 2 or len(val) < 3:
        return None
    end = median(val[-window(len(val)) :])
    return end if end > 2.0 / classes and end > 1.0 / classes + 0.25 else None


def labels_carry_nothing(report: DiagnosticReport) -> bool:
    """Whether the labels carry nothing the inputs predict: the label-alignment probe's stand-in
    learned no more from them than from permuted ones, and the run's own model does not generalise
    either (:func:`generalizes`). A copy that fits one batch of such labels memorises it."""
    probes = report.probes
    result = probes.label_alignment if probes is not None else None
    return result is not None and result.status == "failed" and generalizes(report) is None


def window(n: int) -> int:
    """Points averaged at each end of a curve: a tenth of it, at least 3."""
    return max(3, n // 10)


def trend(values: list[float], width: int = 5) -> list[float]:
    """Running median: follows the curve's shape, ignores single-step noise."""
    half = width // 2
    return [median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    # products, not **: float ** raises OverflowError near 1e308 where * gives inf
    return math.sqrt(sum((v - mean) * (v - mean) for v in values) / (len(values) - 1))


def slope_significance(values: list[float]) -> float:
    """The least-squares slope of a series per point over its standard error: -2 or below, the
    series falls however slowly, beyond what its noise could make of a flat one."""
    n = len(values)
    if n < 3:
        return 0.0
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    sxx = sum((i - x_mean) * (i - x_mean) for i in range(n))
    slope = sum((i - x_mean) * (v - y_mean) for i, v in enumerate(values)) / sxx
    residuals = [v - y_mean - slope * (i - x_mean) for i, v in enumerate(values)]
    residual = sum(r * r for r in residuals) / (n - 2)
    if residual <= 0.0:
        return 0.0 if slope == 0.0 else math.copysign(math.inf, slope)
    return slope / math.sqrt(residual / sxx)


class Curve:
    """Scale-aware summary of a loss curve (finite values only).

    ``start`` and ``end`` are medians of the first and last windows; ``noise`` is the
    step-to-step spread over the second half, so ordinary minibatch noise is measured
    rather than mistaken for a trend, and judged against the initial level.
    """

    def __init__(self, points: list[LossPoint]):
        self.points = points
        self.values = finite([p.value for p in points])
        n = len(self.values)
        self.n = n
        if n < 2:
            self.start = self.end = self.noise = self.multiplicative_noise = 0.0
            self.initial = self.values[0] if self.values else 0.0
            self.smooth = list(self.values)
            return
        w = window(n)
        self.start = median(self.values[:w])
        # the very first value: a blow-up later in the first window cannot inflate it
        self.initial = self.values[0]
        self.end = median(self.values[-w:])
        smooth = trend(self.values)
        self.smooth = smooth
        # Step-to-step differences see noise and oscillation alike (a running median
        # cannot see a period-2 bounce) while a smooth trend adds almost nothing to them;
        # for independent noise std(diff) = sqrt(2) * sigma.
        diffs = [b - a for a, b in zip(self.values, self.values[1:])]
        self.noise = std(diffs[n // 2 :]) / math.sqrt(2)
        # minibatch noise is roughly multiplicative: measure it relative to the local level
        relative = [d / s for d, s in zip(diffs, smooth) if s > 0]
        self.multiplicative_noise = std(relative) / math.sqrt(2)

    @property
    def scale(self) -> float:
        """The loss scale everything is judged against: the initial level."""
        return max(abs(self.start), 1e-12)

    @property
    def progress(self) -> float:
        """Share of the initial loss removed by the end (1 = reached zero)."""
        return (self.start - self.end) / self.scale

    @property
    def relative_noise(self) -> float:
        return self.noise / self.scale

    def second_half_progress(self) -> float:
        """Progress over the second half, relative to the initial level."""
        half = self.values[self.n // 2 :]
        w = window(len(half))
        return (median(half[:w]) - median(half[-w:])) / self.scale


def num_classes(report: DiagnosticReport) -> int | None:
    """Number of classes from the report, the data checks or the loss's output width."""
    if report.num_classes:
        return report.num_classes
    data = report.data
    if data is not None:
        if data.expected_num_classes:
            return data.expected_num_classes
        for split in (data.train, data.test):
            if split is not None and len(split.class_counts) >= 2:
                return len(split.class_counts)
    for call in loss_calls(report):
        if call.loss_type in vocab.SOFTMAX_LOSS_NAMES and len(call.output_shape) >= 2:
            return call.output_shape[1] if call.output_shape[1] >= 2 else None
        kind = vocab.loss_kind(call.loss_type)
        one_per_sample = len(call.output_shape) == 1 or (len(call.output_shape) >= 2 and call.output_shape[-1] == 1)
        if kind is not None and kind.binary and one_per_sample:
            return 2  # one logit (or probability) per sample: a binary classifier
    return None


# a run whose loss starts under this share of an uninformed prediction's loss already fits
# most of the way (a pretrained backbone under a new head): a loss that barely moves from there
# is not stuck
FITTED_SHARE = 0.5


def uninformed_loss(report: DiagnosticReport) -> float | None:
    """The loss of the best prediction that ignores the inputs: ln C for a softmax loss over
    C classes (a language model's vocabulary too), ln 2 for a binary one, the targets'
    variance for MSE; None when the report cannot say. With no loss call seen, the loss the
    logged loss's graph ends in (:func:`graph_loss`) stands in for one."""
    for call in loss_calls(report):
        if call.loss_type in vocab.SOFTMAX_LOSS_NAMES:
            classes = num_classes(report)
            return math.log(classes) if classes and classes >= 2 else None
        if call.loss_type in ("BCELoss", "BCEWithLogitsLoss"):
            return math.log(2.0)
        if call.loss_type == "MSELoss" and call.target_std is not None and call.target_std > 0:
            return call.target_std * call.target_std
    kind = graph_loss(report)
    if kind == "binary":
        return math.log(2.0)
    if kind != "softmax":
        return None
    # the classes from the data, else the width of the output layer, the last in forward order
    layers = latest_layers(report)
    width = layers[-1].activation.unit_count if layers and layers[-1].activation is not None else None
    classes = num_classes(report) or width
    return math.log(classes) if classes and classes >= 2 else None


# the autograd op each loss's graph ends in (cross_entropy is log_softmax, then nll_loss)
_GRAPH_LOSSES = {"NllLoss": "softmax", "NllLoss2D": "softmax", "BinaryCrossEntropy": "binary",
                 "BinaryCrossEntropyWithLogits": "binary"}  # fmt: skip


def graph_loss(report: DiagnosticReport) -> str | None:
    """'softmax' or 'binary' when no loss call was seen (a Monitor given no ``loss_fn``, the loop
    calling ``F.cross_entropy`` itself) and every path of the logged loss's graph from the
    model's output (``loop.ops_before_loss``) ends in that loss's op: the loss the run
    minimises, with nothing added to it. None otherwise."""
    loop = report.loop
    if loop is None or loop.loss_calls or not loop.ops_before_loss:
        return None
    kinds = {_GRAPH_LOSSES.get(path[-1]) if path else None for path in loop.ops_before_loss}
    return kinds.pop() if len(kinds) == 1 else None


def starts_fitted(report: DiagnosticReport) -> bool:
    """Whether the train loss starts under FITTED_SHARE of an uninformed prediction's loss."""
    curve, uninformed = loss_curve(report), uninformed_loss(report)
    return curve.n >= 2 and uninformed is not None and 0 <= curve.start < FITTED_SHARE * uninformed


def adversarial(report: DiagnosticReport) -> bool:
    """Whether the logged loss runs through another trained network's parameters (a GAN's
    generator loss through the discriminator): such a loss rises as its opponent improves,
    so its trend says nothing about the LR."""
    return report.loop is not None and report.loop.logged_loss_through_other_models is True


def self_targeted(report: DiagnosticReport) -> bool:
    """Whether the loss computes its targets from the model's own output (DEC's target
    distribution, pseudo-labels): its objective moves as the model does, so the run's loss need
    not fall, and on one batch any larger step lowers it, a collapse included."""
    return report.loop is not None and report.loop.loss_targets_from_output is True


def line_search(report: DiagnosticReport) -> bool:
    """Whether the logged losses are a closure's evaluations inside ``optimizer.step()``,
    several per step (L-BFGS: its iterations and its line search's trial points, which it
    rejects when they are worse): a single spike there is a rejected trial, not a step taken."""
    loop = report.loop
    return loop is not None and loop.backward_calls_in_step > loop.steps and 2 * loop.backward_calls_in_step >= (
        loop.backward_calls)


def stays_fitted(report: DiagnosticReport) -> bool:
    """Whether the train loss starts and ends under FITTED_SHARE of an uninformed prediction's
    loss: whatever the updates did, they did not undo the fit (a head trained on a frozen
    pretrained backbone, whose first batches may be ones it memorised)."""
    uninformed = uninformed_loss(report)
    return starts_fitted(report) and uninformed is not None and loss_curve(report).end < FITTED_SHARE * uninformed


# a loss that ends under this share of an uninformed prediction's loss has learned something
INFORMED_SHARE = 0.7


def ends_informed(report: DiagnosticReport) -> bool:
    """Whether the train loss ends under INFORMED_SHARE of an uninformed prediction's loss
    (ln C; the targets' variance for MSE): the model learned, whatever share of its own
    first values it removed (a text with a high entropy floor barely falls from there)."""
    uninformed, curve = uninformed_loss(report), loss_curve(report)
    return uninformed is not None and curve.n >= 2 and 0 <= curve.end < INFORMED_SHARE * uninformed


def loss_learned(report: DiagnosticReport) -> bool:
    """Whether the train loss fell by over 30% of its start or ends informed (:func:`ends_informed`):
    large updates or dead units beside such a loss did no visible harm."""
    curve = loss_curve(report)
    return curve.n >= 6 and (curve.progress > 0.3 or ends_informed(report))


def weight_shapes(report: DiagnosticReport) -> dict[str, list[int]]:
    """Each layer's weight shape, by layer name, in the order the parameters were recorded."""
    shapes: dict[str, list[int]] = {}
    for param in report.parameters:
        if param.name.endswith("weight") and param.shape:
            shapes.setdefault(param.name.rsplit(".", 1)[0], param.shape)
    return shapes


def loss_calls(report: DiagnosticReport) -> list[LossCall]:
    return list(report.loop.loss_calls) if report.loop is not None else []


def float_targets_like_outputs(call: LossCall) -> bool:
    """A call comparing float outputs with float targets of their very shape: what a regression, or a
    loss of the user's own that reconstructs its inputs, is given."""
    return bool(call.output_shape) and call.output_shape == call.target_shape and (
        (call.target_dtype or "").removeprefix("torch.").startswith(("float", "bfloat")))


def is_classification(report: DiagnosticReport) -> bool | None:
    """True/False when the report says, None when it cannot tell."""
    if report.task is not None:
        return report.task == "classification"
    if report.probes is not None and report.probes.overfit_one_batch is not None:
        task = report.probes.overfit_one_batch.task
        if task is not None:
            return task == "classification"
    if report.data is not None and report.data.train is not None:
        kind = report.data.train.label_kind
        if kind in ("class_index", "one_hot"):
            return True
        if kind == "float_continuous":
            return False
    types = {c.loss_type for c in loss_calls(report)}
    if types & vocab.CLASSIFICATION_LOSS_NAMES:
        return True
    return None


def layer_steps(report: DiagnosticReport) -> list[list[LayerStats]]:
    """Layer statistics grouped by recorded step, in step order, one entry per layer.

    A merged report can hold two entries for one layer at one step (the probes' hook
    statistics, stamped step 0 and listed first, next to the Monitor's own step 0); the
    later entry — the Monitor's, measured during training — is kept, in forward order.
    """
    def group() -> list[list[LayerStats]]:
        by_step: dict[int, dict[str, LayerStats]] = {}
        for s in report.layers:
            by_step.setdefault(s.step if s.step is not None else 0, {})[s.name] = s
        return [list(by_step[k].values()) for k in sorted(by_step)]

    return _cached(report, "layer_steps", group)


def latest_layers(report: DiagnosticReport) -> list[LayerStats]:
    """Layer statistics of the last recorded step, in forward order."""
    steps = layer_steps(report)
    return steps[-1] if steps else []


def weight_params(report: DiagnosticReport) -> list[ParameterStats]:
    """Trainable weight matrices/kernels (biases and norm scales say little about LR)."""
    return [p for p in report.parameters if p.requires_grad and len(p.shape) >= 2]


def used_lr(report: DiagnosticReport) -> float | None:
    """The peak learning rate of the user's optimizer over the recorded steps (the largest
    of its param groups): a warm-up starts far below the LR the run trains at, and a
    decay ends far below it, so neither end stands for the LR used."""
    if report.loop is None or not report.loop.lr_history:
        return None
    lrs = finite([lr for point in report.loop.lr_history for lr in point.lrs])
    return max(lrs) if lrs else None


def frozen_untrained(report: DiagnosticReport) -> bool | None:
    """Whether the frozen part was never trained or loaded: most of its checked weight
    tensors still hold a standard initialisation (one layer that barely moved in a trained
    network is no sign). None when nothing frozen could be checked."""
    loop = report.loop
    if loop is None or loop.frozen_at_init is None or not loop.frozen_checked:
        return None
    return 2 * len(loop.frozen_at_init) >= loop.frozen_checked


def stepped_lr(report: DiagnosticReport) -> float | None:
    """The LR the loop trained at: its optimizer's peak LR, or without an optimizer the
    median step size the Monitor measured (plain SGD's LR)."""
    lr = used_lr(report)
    if lr is not None or report.loop is None:
        return lr
    sizes = finite([lr for point in report.loop.effective_lr_history for lr in point.lrs if lr > 0])
    return statistics.median(sizes) if sizes else None


# the LR range test reads an LR to about this factor (its sweep's spacing and smoothing)
RANGE_READING = 2.0


def trains_well_up_to(report: DiagnosticReport) -> float | None:
    """The top of the interval where the LR range test's loss fell well (its suggestion
    when it found no interval); None when the test found neither."""
    result = report.probes.lr_range if report.probes is not None else None
    if result is None or result.status != "passed":
        return None
    top = result.interval_high_lr if result.interval_high_lr is not None else result.suggested_lr
    return top if top is not None and math.isfinite(top) and top > 0 else None


def lr_within_range(report: DiagnosticReport) -> bool:
    """Whether the LR the loop stepped with is no more than RANGE_READING times the top of
    the range where the LR range test trains well: then whatever the loss or the updates
    do, an overshoot of the LR is not what the measurements point at."""
    lr, top = stepped_lr(report), trains_well_up_to(report)
    return lr is not None and top is not None and lr <= RANGE_READING * top


def loss_is_moving(report: DiagnosticReport) -> bool | None:
    """Whether the train loss made clear progress; None without enough history."""
    curve = loss_curve(report)
    if curve.n < 6:
        return None
    return curve.progress > 0.1


def share_of_trainable(names: list[str], report: DiagnosticReport) -> float | None:
    """Share of the trainable parameter tensors that ``names`` make up, when known."""
    trainable = {p.name for p in report.parameters if p.requires_grad} | set(names)
    return len(set(names)) / len(trainable) if trainable and report.parameters else None


def gradient_cut_params(report: DiagnosticReport) -> list[str]:
    """Parameters that get no gradient or no update by construction: frozen, left out of
    every optimizer, ``.grad`` never set, or cut from the loss (the gradient check's
    autograd-zero tensors). A learning-rate remedy then speeds up only the rest: its
    verdict says nothing about the LR."""
    names: list[str] = []
    if report.loop is not None:
        names += report.loop.frozen_params + report.loop.params_not_in_optimizer + report.loop.params_grad_none
    check = report.probes.grad_check if report.probes is not None else None
    if check is not None:
        names += [p.name for p in check.parameters if p.status == "bug" and p.autograd_zero]
    return list(dict.fromkeys(names))


def _power_of_two(ratio: float) -> int | None:
    """k when ``ratio`` is 2**k (to float precision) with k <= -4, else None."""
    if ratio <= 0 or not math.isfinite(ratio):
        return None
    k = math.log2(ratio)
    return round(k) if abs(k - round(k)) < 1e-4 and round(k) <= -4 else None


def _unscaled_clip_ratios(ratios: list[float]) -> list[float] | None:
    """The clip ratios with a mixed-precision loss scale taken out.

    The Monitor measures the gradient norm at the end of backward and again at
    optimizer.step(). Under a GradScaler the first is the *scaled* norm (x65536 by
    default) and ``unscale_`` divides every gradient by the scale before clipping, so
    the ratio is 2**-16 on steps where clipping did not bite — a change of the norm
    that is no clipping at all. Steps with a ratio of exactly a power of two reveal the
    scale; every ratio is then divided by the scale in force at its step. Returns None
    when every step was only unscaled."""
    exponents = [_power_of_two(r) for r in ratios]
    if not any(k is not None for k in exponents):
        return ratios
    out, scale = [], None
    first_scale = next(2.0**k for k in exponents if k is not None)
    for ratio, k in zip(ratios, exponents):
        if k is not None:
            scale = 2.0**k
            continue  # unscaled only: no clipping on this step
        out.append(ratio / (scale or first_scale))
    return out or None


def clipped_steps(report: DiagnosticReport) -> list[GradNormPoint]:
    """The recorded steps whose gradient norm was measured before and after a clip."""
    loop = report.loop
    if loop is None:
        return []
    return [p for p in loop.grad_norm_history
            if p.after_clip is not None and math.isfinite(p.before_clip) and p.before_clip > 0]


def clip_ratios(report: DiagnosticReport) -> list[float] | None:
    """Norm after the clip over norm before, per clipped step, a GradScaler's loss scale
    taken out; None under 5 clipped steps, or when every step was only unscaled."""
    clipped = clipped_steps(report)
    if len(clipped) < 5:
        return None
    return _unscaled_clip_ratios([p.after_clip / p.before_clip for p in clipped])


def clips_most_steps(report: DiagnosticReport) -> bool:
    """Whether the loop's clip cut the gradient on at least half its recorded steps: then each
    step is bounded by LR x max_norm, which a probe or a remedy without the clip does not see."""
    ratios = clip_ratios(report)
    return ratios is not None and sum(1 for r in ratios if r < 0.999) >= len(ratios) / 2


def lr_varies(report: DiagnosticReport) -> bool:
    """Whether the recorded LR changed over the run by more than 2x (a warm-up, a decay):
    then the LR of any one moment — the one a probe from the initial state, or after
    training, ran at — is not the LR the run trains at."""
    loop = report.loop
    # a loop without an optimizer: the step size the Monitor measured is its LR
    history = (loop.lr_history or loop.effective_lr_history) if loop is not None else []
    lrs = [lr for point in history for lr in point.lrs if lr > 0]
    return bool(lrs) and max(lrs) > 2 * min(lrs)


def samples_axis(report: DiagnosticReport) -> int:
    """The axis that holds the samples: the one the sample-independence probe found in the
    inputs (1 for time-major sequences: the NTM copy task's (time, batch, bits)), else 0."""
    probe = report.probes.sample_independence if report.probes is not None else None
    found = probe is not None and probe.status in ("passed", "failed") and probe.batch_axis is not None
    return probe.batch_axis if found else 0


def step_update_ratios(report: DiagnosticReport) -> list[tuple[int, float]]:
    """(step, median update/weight ratio over the weight matrices) per recorded step.

    A ratio of exactly 0 is a step with no gradient for that tensor (dead or frozen
    units): no evidence about the step size, so it is left out; so is a ratio of a weight that
    was zero before the update (1, whatever the LR). Once the weights are NaN
    every later ratio is NaN: a step whose ratios are all non-finite counts as inf."""

    def compute() -> list[tuple[int, float]]:
        by_step: dict[int, list[float]] = {}
        for p in weight_params(report):
            # a weight zero before the update has ratio 1 whatever the LR: its first step is all of it
            if p.update_ratio is not None and p.update_ratio != 0.0 and not started_at_zero(p):
                by_step.setdefault(p.step or 0, []).append(p.update_ratio)
        out = []
        for step in sorted(by_step):
            ratios = finite(by_step[step])
            out.append((step, median(ratios) if ratios else math.inf))
        return out

    return _cached(report, "step_update_ratios", compute)


# healthy training's update/weight ratio (Karpathy's rule of thumb, measured so across the bench's families)
HEALTHY_UPDATE_RATIO = 1e-3
# a peak update/weight ratio above this rewrites a tenth of the weights each step: steps that are large
LARGE_UPDATE_RATIO = 0.1
# steps at most this share of the weights are sane ones (healthy training sits near 1e-3): whatever grows
# beside them (a gradient Adam divides out, a loss whose targets climb), it is not the step size
STEADY_UPDATE_RATIO = 1e-2


def update_ratio_summary(report: DiagnosticReport) -> tuple[float, float, int] | None:
    """(peak, typical, recorded steps) of the per-step median update ratios.

    ``peak`` is the largest median over a window of a fifth of the recorded steps (at
    least one): an LR that wrecks the network in its first steps and leaves it dead —
    tiny updates from then on — shows there, where a median over the whole run hides
    it. ``typical`` is the median over all steps. Steps after the first non-finite one
    count in neither, unless the first step already is. Read by NNDX205, NNDX206 and
    NNDX103: computed once per report."""

    def compute() -> tuple[float, float, int] | None:
        values = [v for _, v in step_update_ratios(report)]
        if not values:
            return None
        if math.isfinite(values[0]):
            # the steps after the weights went NaN: they say the weights are NaN (the NaN rules say why),
            # not how large a step the LR makes; a run NaN from its first step keeps them
            values = values[: next((i for i, v in enumerate(values) if not math.isfinite(v)), len(values))]
        width = max(1, len(values) // 5)
        peak = max(median(values[i : i + width]) for i in range(len(values) - width + 1))
        return peak, median(values), len(values)

    return _cached(report, "update_ratio_summary", compute)


def started_at_zero(param) -> bool:
    """All zeros at its first record, or recorded after a step whose update was the whole weight
    (||dw|| / ||w|| = 1): zero before it."""
    return param.weight_norm == 0.0 or (param.update_ratio is not None and abs(param.update_ratio - 1.0) <= 1e-6)

"""Data rules (NNDX5xx): the data checks' statistics of the train and test splits."""

from __future__ import annotations

import itertools
import math

from nndx import vocab
from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, SplitStats
from nndx.rules._series import (
    float_targets_like_outputs,
    is_classification,
    loss_calls,
    loss_curve,
    loss_learned,
    samples_axis,
)
from nndx.rules.engine import Hit, rule


def _splits(report: DiagnosticReport) -> list[tuple[str, SplitStats]]:
    data = report.data
    if data is None:
        return []
    return [(name, split) for name, split in (("train", data.train), ("test", data.test)) if split is not None]


@rule(
    "NNDX501",
    C.NAN_IN_DATA,
    "error",
    "NaN or Inf in the inputs or labels",
    detects="Non-zero NaN/Inf counts in a split's inputs or labels, a non-finite input-batch norm seen by "
    "the Monitor, or inputs the nan_origin probe found non-finite. Named LOG_OF_ZERO when every non-finite input "
    "value the probe saw is -inf and no split counted a NaN: a log of 0 in the preprocessing.",
    why="One NaN input makes that batch's loss and every gradient NaN, and the next update spreads it "
    "into all weights.",
    fix="Find and drop or impute the rows (torch.isnan(x).any(1)); check the preprocessing that produced "
    "them (division by a zero std, log of 0, missing values).",
)
def nan_in_data(report: DiagnosticReport) -> Hit | None:
    evidence: dict[str, int] = {}
    for name, split in _splits(report):
        for field in ("input_nan_count", "input_inf_count", "label_nan_count", "label_inf_count"):
            count = getattr(split, field)
            if count:
                evidence[f"{name}_{field}"] = count
    if report.loop is not None:
        bad = [p.step for p in report.loop.input_norm_history if not math.isfinite(p.value)]
        if bad:
            evidence["nonfinite_input_batches"] = len(bad)
    origin = report.probes.nan_origin if report.probes is not None else None
    if origin is not None and origin.input_nonfinite_count:
        evidence["probe_input_nonfinite_count"] = origin.input_nonfinite_count
    if not evidence:
        return None
    if origin is not None and origin.input_nonfinite_count and origin.input_minus_inf_count == \
            origin.input_nonfinite_count and not any(v for k, v in evidence.items() if "nan_count" in k):  # fmt: skip
        return Hit(symptom=f"every non-finite input value the probe saw is -inf ({origin.input_minus_inf_count}): what "
                   "a log of 0 gives, in the preprocessing before the model (a log-spectrogram or log-count without "
                   "its clamp)", evidence=evidence, score=3.0, code=C.LOG_OF_ZERO,
                   fix="Clamp before the log (torch.log(x.clamp(min=1e-5)), or log1p for counts) where the inputs "
                   "are made; then check no input is non-finite (torch.isfinite(x).all()).")  # fmt: skip
    return Hit(symptom="non-finite values in the data", evidence=evidence, score=3.0)


# duplicate rows this often labelled otherwise than their first occurrence are contexts of a target they do not
# determine (a character model's last three characters), not copied samples
CONTEXTS = 0.25


def _contexts(split: SplitStats | None) -> bool:
    return split is not None and (split.duplicate_label_conflict or 0.0) >= CONTEXTS


def _token_ids(split: SplitStats) -> bool:
    """Integer inputs other than uint8 images are indices (token ids, categories): their
    scale is an index, not a magnitude the first layer multiplies."""
    dtype = (split.input_dtype or "").removeprefix("torch.")
    return dtype.startswith(("int", "long")) and dtype != "uint8"


def _language(split: SplitStats | None) -> bool:
    """Token ids whose rows are contexts: a language model's windows. The next token's counts follow the
    language, and the first window of every text is all padding (makemore's '...' is [0, 0, 0])."""
    return split is not None and _token_ids(split) and _contexts(split)


@rule(
    "NNDX502",
    C.DATA_LEAKAGE,
    "warning",
    "Test samples also appear in the training data",
    detects="At least 1% of the test rows (and at least 2 rows) found exactly in the train split; error "
    "from 10%. When the inputs are integers from a small space of possible rows (a recommender's user and "
    "item ids), only the rows beyond what chance gives (the train split's distinct rows over that space; 3 "
    "standard deviations above it) count — unless the train split lists its ids once each (under 1% repeats "
    "where random draws would give a tenth): a graph's nodes split in two, where any overlap counts. Info when "
    f"at least {CONTEXTS:.0%} of the train split's repeated rows (not all zero) carry another label than their "
    "first occurrence and the overlap is no larger than train's own share of repeats (+5%): the inputs are contexts "
    "of a target they do not determine (a character model's last three characters), which recur by nature.",
    why="Test metrics then measure memorisation, not generalisation: the model looks better than it is.",
    fix="Split before any augmentation or deduplicate across splits (hash rows); split by entity/time "
    "when samples are correlated.",
)
def data_leakage(report: DiagnosticReport) -> Hit | None:
    data = report.data
    if data is None or data.train_test_overlap < 2 or data.train_test_overlap_fraction < 0.01:
        return None
    fraction = data.train_test_overlap_fraction
    train, test = data.train, data.test
    if data.input_space_size and train is not None and test is not None and _drawn(train, data.input_space_size):
        distinct = (train.checked_samples or train.n_samples) - train.duplicate_count
        chance = min(1.0, distinct / data.input_space_size)
        if not _beyond_chance(data.train_test_overlap, test.checked_samples or test.n_samples, chance):
            return None  # the test rows land on train rows as often as rows drawn at random would
    # inputs that repeat with other labels within train recur in test as often by nature: no sign of a copy
    natural = train is not None and _contexts(train) and fraction <= train.duplicate_fraction + 0.05
    return Hit(
        symptom=f"{fraction:.1%} of the test rows are in the train split"
        + (f", no more than train repeats its own rows ({train.duplicate_fraction:.0%}), "
           f"{train.duplicate_label_conflict:.0%} of them with another label: the inputs are contexts of a target "
           "they do not determine (a language model's last tokens), which recur by nature" if natural else ""),
        evidence={"train_test_overlap": data.train_test_overlap, "train_test_overlap_fraction": fraction},
        severity="info" if natural else "error" if fraction >= 0.1 else "warning",
        score=1.0 + fraction,
    )


def _beyond_chance(count: int, n: int, chance: float) -> bool:
    """Whether ``count`` of ``n`` rows exceed ``chance``'s share by 3 standard deviations
    (and by 1% of the rows): more repeats than rows drawn at random would give."""
    expected = n * chance
    return count > expected + max(0.01 * n, 3 * math.sqrt(n * chance * (1 - chance)))


def _drawn(split: SplitStats, space: float) -> bool:
    """Whether a split's rows may be draws from ``space`` (a recommender's sampled
    negatives repeat). Ids listed once each — under 1% repeats where random draws would
    give a tenth or more (a graph's nodes split into train and validation) — are a
    partition, where any overlap is a leak."""
    n = split.checked_samples or split.n_samples
    return split.duplicate_count >= 0.01 * n or _chance_repeats(n, space) < 0.1


def _chance_repeats(n: int, space: float) -> float:
    """The share of ``n`` rows drawn uniformly from ``space`` possible ones that repeat an
    earlier one: 1 - E[distinct] / n, E[distinct] = space * (1 - (1 - 1/space) ** n)."""
    if n < 1:
        return 0.0
    return 1.0 - space * -math.expm1(n * math.log1p(-1.0 / space)) / n if space > 1 else 1.0 - 1.0 / n


@rule(
    "NNDX503",
    C.DUPLICATE_SAMPLES,
    "warning",
    "Many samples are exact duplicates",
    detects="At least 10% of a split's rows repeat an earlier row exactly; not when the inputs are integers "
    "from a small space of possible rows, only repeats beyond what as many rows drawn at random from it would "
    "give (3 standard deviations above it) count: negatives sampled for a recommender repeat by chance. Info "
    f"when at least {CONTEXTS:.0%} of the repeated rows (not all zero) carry another label than their first "
    "occurrence: inputs that do not determine their label are contexts (a character model's last characters).",
    why="Duplicates over-weight some samples, inflate apparent accuracy and, across splits, leak.",
    fix="Deduplicate (hash rows) before splitting; if repetition is oversampling, use a weighted sampler.",
)
def duplicates(report: DiagnosticReport) -> list[Hit]:
    hits = []
    space = report.data.input_space_size if report.data is not None else None
    for name, split in _splits(report):
        rows = split.checked_samples or split.n_samples
        beyond = _beyond_chance(split.duplicate_count, rows, _chance_repeats(rows, space)) if space else True
        if split.duplicate_fraction >= 0.1 and beyond:
            contexts = _contexts(split)
            hits.append(
                Hit(
                    symptom=f"{split.duplicate_fraction:.0%} of the {name} rows are duplicates"
                    + (f", {split.duplicate_label_conflict:.0%} of them with another label than their first "
                       "occurrence: the inputs are contexts of a target they do not determine (a language model's "
                       "last tokens), not copied samples" if contexts else ""),
                    severity="info" if contexts else None,
                    evidence={
                        "split": name,
                        "duplicate_count": split.duplicate_count,
                        "duplicate_fraction": split.duplicate_fraction,
                        "n_samples": split.n_samples,
                    },
                    score=split.duplicate_fraction,
                )
            )
    return hits


WEIGHTED_CLASSES = 2.0  # per-class loss weights this far apart are a deliberate re-weighting


@rule(
    "NNDX504",
    C.CLASS_IMBALANCE,
    "warning",
    "Classes imbalanced over 10:1",
    detects="A train split whose largest class has more than 10 times the samples of its smallest (classes "
    "per sample; a segmentation mask's pixels are left alone: background outnumbers every object by nature). "
    f"Info when the loss was given per-class weights {WEIGHTED_CLASSES:g}x apart or more (weight=, as LDAM-DRW's "
    "deferred re-weighting sets them): the imbalance is being handled. A sampler that balances the batches shows "
    "as balanced counts when the data checks read the DataLoader. Info for token ids whose rows are contexts (at "
    f"least {CONTEXTS:.0%} of the repeated rows labelled otherwise): the next token's counts follow the language.",
    why="The model can score high accuracy by predicting the majority class; minority classes get few "
    "gradient signals.",
    fix="Use class weights in the loss or a weighted sampler; report per-class metrics, not accuracy.",
    explained_by=(C.LABEL_NOISE,),
)
def class_imbalance(report: DiagnosticReport) -> Hit | None:
    train = report.data.train if report.data is not None else None
    if train is None:
        return None
    if train.label_kind == "other":
        return None  # a class per pixel: background outnumbers every object, by nature
    ratio = train.imbalance_ratio
    present = [count for count in train.class_counts.values() if count > 0]
    if (ratio is None or not math.isfinite(ratio)) and len(present) >= 2:
        ratio = max(present) / min(present)  # missing classes are NNDX507's business
    if ratio is None or not math.isfinite(ratio) or not ratio > 10:
        return None
    absent = len({k for k, count in train.class_counts.items() if count == 0} | set(train.missing_classes))
    weighted = max((c.class_weight_ratio or 1.0 for c in loss_calls(report)), default=1.0)
    handled = weighted >= WEIGHTED_CLASSES
    if _language(train):
        return Hit(symptom=f"largest class {ratio:.1f}x the smallest: the next token of a language model's contexts, "
                   "whose counts follow the language", evidence={"imbalance_ratio": ratio}, severity="info", score=0.1)
    symptom = f"largest class {ratio:.1f}x the smallest" + (f"; {absent} expected classes have no sample" if absent else "")
    return Hit(
        symptom=symptom + (f"; the loss weights the classes ({weighted:.3g}x apart)" if handled else ""),
        evidence={"imbalance_ratio": ratio, "class_counts": [f"{k}: {v}" for k, v in sorted(train.class_counts.items())],
                  "loss_class_weight_ratio": weighted if weighted > 1.0 else None},  # fmt: skip
        severity="info" if handled else None,
        score=min(5.0, math.log10(ratio)) / (4 if handled else 1),
    )


def _value_range(split: SplitStats) -> float | None:
    if split.input_min is None or split.input_max is None:
        return None
    spread = split.input_max - split.input_min
    return spread if math.isfinite(spread) else None


MILD_INPUT_SCALE = 20.0  # a mean or std up to this, in a run whose loss learned, did no visible harm
# a mean or std beyond this (raw counts in the hundreds of thousands) leaves no step size that suits every
# layer: the scale is the cause a too-high LR or dead units are the symptoms of
EXTREME_INPUT_SCALE = 1000.0


@rule(
    "NNDX505",
    C.UNNORMALIZED_INPUTS,
    "warning",
    "Inputs are not normalised",
    detects="Floating-point train inputs (the data checks'; without data=, the probes' batch) that look like raw "
    "pixels (0-255), or whose mean or std is over 5 "
    "in absolute value, or whose per-feature stds differ over 100x while the values span over 10. "
    "Integer inputs (token ids, category indices) are indices, not magnitudes, and never fire. Info when the "
    f"scale is mild (mean and std within {MILD_INPUT_SCALE:g}, no raw pixels, no uneven features; from the batch "
    "alone: no raw pixels) and the train loss learned (fell by over 30%, or ended informed): the run shows the scale "
    "did no visible harm. Error when "
    f"the mean or std is over {EXTREME_INPUT_SCALE:g} (raw counts or prices): no learning rate suits such inputs, "
    "and the LR the range test then calls too high is their symptom. Info too when the first layer (a Linear or "
    "convolution) feeds a normalisation layer directly (a ResNet stem's BatchNorm): that takes the scale out.",
    why="Large or unevenly scaled inputs make the first layer's pre-activations huge: sigmoid/tanh "
    "saturate, ReLUs die, and one LR cannot suit every feature.",
    fix="Standardise each feature with the train split's mean and std ((x - mean) / std), or scale "
    "pixels to [0, 1] and normalise per channel.",
)
def unnormalized_inputs(report: DiagnosticReport) -> Hit | None:
    data = report.data
    train = (data.train or data.batch) if data is not None else None
    if train is None or _token_ids(train):
        return None
    reasons = []
    if train.raw_range:
        reasons.append(f"raw range {train.raw_range}")
    if train.input_mean is not None and math.isfinite(train.input_mean) and abs(train.input_mean) > 5:
        reasons.append(f"mean {train.input_mean:.3g}")
    if train.input_std is not None and math.isfinite(train.input_std) and train.input_std > 5:
        reasons.append(f"std {train.input_std:.3g}")
    # Uneven feature scales matter when some feature is large: [0, 1] pixels whose border is
    # near-constant have per-pixel stds 1000x apart and are normalised all the same.
    spread = _value_range(train)
    uneven = train.feature_scale_ratio is not None and train.feature_scale_ratio > 100 and spread is not None and (
        spread > 10)
    if uneven:
        reasons.append(f"feature stds differ {train.feature_scale_ratio:.0f}x")
    if not reasons:
        return None
    scale = max(abs(train.input_mean or 0.0), train.input_std or 0.0)
    # one batch's per-feature stds are noisy (padded positions), and raw values a model is built for
    # (N-BEATS on raw series under a relative loss) learn: from the batch alone, a run that learned
    # leaves only raw pixels an alarm
    from_batch = train is not data.train
    learned = not train.raw_range and (from_batch or not uneven and scale <= MILD_INPUT_SCALE) and loss_learned(report)
    absorbed = _normalised_first_layer(report)
    return Hit(
        symptom=("inputs of the probes' batch not normalised: " if from_batch else "inputs not normalised: ")
        + ", ".join(reasons) + ("; the loss still learned" if learned else "")
        + (f"; the first layer's outputs go straight into {absorbed}, which takes their scale out" if absorbed
           else ""),
        severity="info" if learned or absorbed else ("error" if scale > EXTREME_INPUT_SCALE else None),
        evidence={
            "input_mean": train.input_mean,
            "input_std": train.input_std,
            "input_min": train.input_min,
            "input_max": train.input_max,
            "raw_range": train.raw_range,
            "feature_scale_ratio": train.feature_scale_ratio,
        },
        score=len(reasons) / (2.0 if from_batch else 1.0),  # one batch is weaker evidence than the data
    )


def _normalised_first_layer(report: DiagnosticReport) -> str | None:
    """The type of the normalisation layer that reads the first layer's output, when the first
    layer a forward ran is a linear map of the inputs (Linear, ConvNd): the inputs' scale then
    scales that layer's output alone, which the normalisation divides out, in the forward and in
    the gradient (a ResNet stem on uint8 pixels trains as it does on [0, 1] pixels)."""
    model = report.model
    if model is None or not model.forward_observed or not model.layers:
        return None
    # padding and reshapes before it scale nothing
    leading = [layer.name for layer in itertools.takewhile(
        lambda layer: layer.type in vocab.PASSTHROUGH_NAMES or "Pad" in layer.type, model.layers)]
    first = model.layers[len(leading)] if len(leading) < len(model.layers) else None
    if first is None or first.type not in vocab.LINEAR_LAYER_NAMES or first.input_from not in (None, *leading):
        return None
    return next((layer.type for layer in model.layers[1:]
                 if layer.input_from == first.name and layer.type in vocab.NORMALIZATION_NAMES), None)


@rule(
    "NNDX506",
    C.UNNORMALIZED_TARGETS,
    "warning",
    "Regression targets of a large scale",
    detects="Continuous regression targets (from the data checks, or as they reached a regression loss) whose "
    "mean or std exceeds 20 in absolute value; error when no output ever came within half of any target (sigmoid "
    "colours in [0, 1] against pixels in 0..255), which a loss of the user's own comparing float outputs with float "
    "targets of their shape also shows; info when the loss's gradient is bounded (L1, smooth L1, Huber), or when "
    "under MSE the run's train loss fell to under half the share of its start that predicting the targets' mean "
    "reaches (std^2 / (mean^2 + std^2)): the model learned their spread at that scale (an optimizer whose step "
    "was sized for it: d2l's house prices under Adam at lr 5).",
    why="An output layer initialised near 0 needs huge weights to reach targets in the hundreds: the "
    "first gradients are enormous (MSE grows with the square of the scale) and training is unstable "
    "or slow. An L1-type loss caps each sample's gradient, so there the scale only slows the fit.",
    fix="Standardise the targets ((y - mean) / std) for training and invert the transform for "
    "predictions.",
)
def unnormalized_targets(report: DiagnosticReport) -> Hit | None:
    if is_classification(report) is True:
        return None
    # a regression loss nndx names; or one of the user's own comparing float outputs with float targets of
    # their very shape (NeRF's img2mse lambda), only where no output came near a target: such a loss may
    # scale what it compares itself (fast neural style's images in 0..255 normalised inside the loss)
    calls = [c for c in loss_calls(report) if c.loss_type in vocab.REGRESSION_LOSS_NAMES]
    own = [c for c in loss_calls(report) if vocab.loss_kind(c.loss_type) is None and float_targets_like_outputs(c)]
    if not calls and own and _outputs_never_reach(own):
        calls = own
    train = report.data.train if report.data is not None else None
    if train is not None and train.label_kind == "float_continuous":
        mean, std = train.target_mean, train.target_std
    else:  # what reached a regression loss, seen by the probes or the Monitor
        measured = [c for c in calls if c.target_std is not None]
        if not measured:
            return None
        mean, std = measured[0].target_mean, measured[0].target_std
    scale = max(abs(mean or 0.0), abs(std or 0.0))
    if not math.isfinite(scale) or scale <= 20:
        return None
    bounded = bool(calls) and all(c.loss_type in vocab.BOUNDED_GRADIENT_LOSS_NAMES for c in calls)
    unreached = _outputs_never_reach(calls)
    fit = None if unreached else _fit_beyond_mean(report, calls, mean, std)
    return Hit(
        symptom=(f"targets of mean {mean} and std {std}" if mean is None or std is None else
                 f"targets of mean {mean:.3g} and std {std:.3g}")
        + (f" into {calls[0].loss_type}, whose gradient is bounded" if bounded else "")
        + (f"; no output reached any target (outputs {unreached[0]:.3g} to {unreached[1]:.3g}, targets "
           f"{unreached[2]:.3g} to {unreached[3]:.3g})" if unreached else "")
        + (f"; the run's train loss fell to {fit:.2g} of its start, under what predicting their mean reaches: the "
           "scale did not stop it learning" if fit is not None else ""),
        evidence={"target_mean": mean, "target_std": std, "loss_type": calls[0].loss_type if calls else None,
                  "outputs_and_targets_range": list(unreached) if unreached else None,
                  "train_loss_end_to_start": fit},  # fmt: skip
        severity="info" if bounded or fit is not None else "error" if unreached else None,
        refuted=fit is not None,
        score=min(5.0, math.log10(scale)) / (2 if bounded else 1) + (1.0 if unreached else 0.0),
    )


def _fit_beyond_mean(report: DiagnosticReport, calls: list, mean: float | None, std: float | None) -> float | None:
    """The run's train loss, end over start, when under MSE it fell to under half what predicting the
    targets' mean reaches from outputs near 0 (std^2 over mean^2 + std^2, whatever the reduction): the
    model learned the targets' spread at their scale, which therefore did not stop it. None otherwise."""
    if mean is None or std is None or not std > 0 or not calls or any(c.loss_type != "MSELoss" for c in calls):
        return None
    curve = loss_curve(report)
    if curve.n < 10 or not curve.start > 0 or not math.isfinite(curve.end):
        return None
    share = curve.end / curve.start
    mean_only = 1.0 / (1.0 + min(abs(mean) / std, 1e150) ** 2)
    return share if share < 0.5 * mean_only else None


def _outputs_never_reach(calls: list) -> tuple[float, float, float, float] | None:
    """(output min, output max, target min, target max) over the calls when every target lies
    beyond twice the outputs' reach on one side: outputs squashed into [0, 1] against pixels in
    0..255 never come near a target, whatever the LR."""
    ranges = [(c.output_min, c.output_max, c.target_min, c.target_max) for c in calls]
    ranges = [r for r in ranges if all(v is not None and math.isfinite(v) for v in r)]
    if not ranges:
        return None
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    t_lo, t_hi = min(r[2] for r in ranges), max(r[3] for r in ranges)
    reach = max(abs(lo), abs(hi))
    beyond = (t_lo > 0 and t_lo > 2 * max(hi, 0.0) and t_lo > 2 * reach) or (t_hi < 0 and -t_hi > 2 * reach)
    return (lo, hi, t_lo, t_hi) if beyond else None


@rule(
    "NNDX507",
    C.LABEL_NOISE,
    "warning",
    "Labels collapsed: classes missing from the labels",
    detects="A train split with a single label class (error), or classes the task expects (num_classes, "
    "a gap in the label range, a class seen only in the test split) with no train sample (warning) — unless "
    "other classes appear only once or twice: then the missing ones are the tail of an imbalance (NNDX504).",
    why="Preprocessing applied to the labels (a normalisation, a cast that truncates, a filter) can "
    "collapse them; a model cannot learn classes it never sees.",
    fix="Inspect the label pipeline (print torch.unique(y, return_counts=True)); do not transform labels "
    "with the inputs' transform.",
)
def labels_collapsed(report: DiagnosticReport) -> Hit | None:
    data = report.data
    train = data.train if data is not None else None
    if train is None or not train.class_counts:
        return None
    observed = sum(1 for count in train.class_counts.values() if count > 0)
    expected = data.expected_num_classes or report.num_classes
    if observed == 1 and train.n_samples > 1:
        return Hit(
            symptom="every train label is the same class",
            evidence={"observed_classes": observed, "expected_classes": expected, "n_samples": train.n_samples},
            severity="error",
            score=3.0,
        )
    if train.missing_classes or (expected is not None and observed < expected):
        missing = len(train.missing_classes) or (expected or 0) - observed
        if min(count for count in train.class_counts.values() if count > 0) <= 2:
            # classes seen once or twice: the missing ones are the tail of an imbalance (NNDX504
            # counts them), not labels a preprocessing step collapsed
            return None
        return Hit(
            symptom=f"{missing} expected classes have no train sample",
            evidence={
                "observed_classes": observed,
                "expected_classes": expected,
                "missing_classes": train.missing_classes[:20],
            },
            score=1.0 + missing / max(1, observed + missing),
        )
    return None


ORDERED_TARGETS = 0.9  # |rank correlation with position| above this: sorted (random order: ~1/sqrt(n))


# random order gives a batch of one class with probability sum_c p_c^B; under this it is no accident
ONE_CLASS_CHANCE = 0.05
# a regression batch whose targets spread less than this share of the whole split's, or whose mean is
# this many standard errors off the split's with a narrower spread, is one slice of targets in order
NARROW_BATCH = 0.25
OFF_CENTRE = 8.0


@rule(
    "NNDX508",
    C.UNSHUFFLED_DATA,
    "warning",
    "Training data ordered by label",
    detects="Batches that reached the loss (the probes' batch, the Monitor's recorded steps) mostly of one "
    "class, over twice as often as random order gives (sum_c p_c^B from the class counts) and with two or "
    "more classes among them or that chance under 5% (without class counts: batches of 8 or more, of two "
    "or more classes), or regression batches whose target std is under "
    "a quarter of the split's or whose mean is over 8 standard errors off the split's with a spread under the "
    "split's (a slice of sorted targets is never wider than the split; the error of the batch's samples, not of "
    "its elements: a forecast window's steps move together). Without a batch "
    "that tells, the data checks' order: consecutive samples sharing a label far more often than random "
    "order would (label_runs_fraction over 0.95, or closing "
    "80% of the gap from the random-order value to 1), or regression targets whose rank correlation with "
    "their position is over 0.9 in size — a warning when a DataLoader yielded that order, info for "
    "arrays or a Dataset (stored by class, as an ImageFolder is; a shuffling loader makes it harmless). "
    "Batches that mix classes overrule a sorted storage order.",
    why="Batches of one class pull the model back and forth between classes: the loss zigzags and the "
    "final model favours the last classes seen.",
    fix="Shuffle the training data every epoch (DataLoader(..., shuffle=True)).",
)
def unshuffled(report: DiagnosticReport) -> Hit | None:
    train = report.data.train if report.data is not None else None
    batches = _batch_order(report, train)
    if batches is not None:
        return batches or None
    if train is not None and train.target_order_correlation is not None:
        rho = train.target_order_correlation
        if abs(rho) <= ORDERED_TARGETS:
            return None
        return _stored_order(train, f"train targets are sorted: rank correlation {rho:.2f} with their position",
                             {"target_order_correlation": rho}, 1.0 + abs(rho))  # fmt: skip
    if train is None or train.label_runs_fraction is None:
        return None
    counts = [c for c in train.class_counts.values() if c > 0]
    if len(counts) == 1:
        return None
    random_order = sum((c / sum(counts)) ** 2 for c in counts) if counts else None
    threshold = 0.95 if random_order is None else random_order + 0.8 * (1 - random_order)
    runs = train.label_runs_fraction
    if runs <= max(threshold, 0.5):
        return None
    return _stored_order(train, f"{runs:.0%} of consecutive train samples share their label",
                         {"label_runs_fraction": runs, "random_order_expectation": random_order}, 1.0 + runs)


def _stored_order(train: SplitStats, symptom: str, evidence: dict, score: float) -> Hit:
    if train.order_source != "storage":
        return Hit(symptom=symptom, evidence={**evidence, "order_source": train.order_source}, score=score)
    return Hit(symptom=symptom + " as stored (arrays or a Dataset); a loader that shuffles makes this harmless, "
               "and no batch that reached the loss showed the order",
               evidence={**evidence, "order_source": "storage"}, severity="info", score=score / 4)  # fmt: skip


def _batch_order(report: DiagnosticReport, train: SplitStats | None) -> Hit | bool | None:
    """What the batches that reached the loss say of the order: a Hit when they come in
    label order, False when they mix (the order training sees is fine, whatever the
    storage order), None when they do not tell. Each loss-call signature is judged on its
    own: a validation pass through the same loss must not dilute the training batches."""
    calls = [c for c in loss_calls(report) if c.measured_batches and c.target_shape]
    counts = [c for c in train.class_counts.values() if c > 0] if train is not None else []
    axis = samples_axis(report)
    verdicts = [_call_order(c, counts, train, axis) for c in calls]
    hits = [v for v in verdicts if isinstance(v, Hit)]
    if hits:
        return max(hits, key=lambda h: h.score)
    return False if verdicts and all(v is False for v in verdicts) else None


def _call_order(call, counts: list[int], train: SplitStats | None, axis: int) -> Hit | bool | None:
    rows = math.prod(call.target_shape)
    # the samples of a batch: a window's steps and series are no more samples (they move together)
    samples = call.target_shape[axis] if axis < len(call.target_shape) else rows
    measured, single, values = call.measured_batches, call.single_target_batches, set(call.single_target_values)
    chance = sum((c / sum(counts)) ** rows for c in counts) if len(counts) >= 2 else None
    evidence = {"measured_batches": measured, "single_class_batches": single, "batch_rows": rows,
                "one_class_chance": chance}  # fmt: skip
    share = single / measured
    # far more one-class batches than random order gives (without class counts: batches of
    # at least 8 of two or more classes, where chance is small for any balance worth training)
    beyond_chance = share > 2 * chance and (len(values) >= 2 or chance < ONE_CLASS_CHANCE) if chance is not None \
        else rows >= 8 and len(values) >= 2
    if single and share >= 0.5 and beyond_chance:
        return Hit(symptom=f"{single} of {measured} measured batches that reached the loss held one class"
                   + (f" ({len(values)} different ones)" if len(values) >= 2 else ""),
                   evidence=evidence, score=1.0 + single / measured)  # fmt: skip
    if call.target_std is not None and call.target_mean is not None and rows >= 8 and train is not None \
            and train.label_kind == "float_continuous" and train.target_std and train.target_mean is not None:
        spread = call.target_std / train.target_std
        # a batch drawn at random has its mean within a few standard errors of the split's
        off_centre = abs(call.target_mean - train.target_mean) / (train.target_std / math.sqrt(samples))
        # a slice of sorted targets is never wider than the split: an off-centre batch that is (NeRF's rays from
        # one image's centre crop, the pixels of one image alike) is a cluster, not an order
        if spread < NARROW_BATCH or (off_centre > OFF_CENTRE and spread < 1.0):
            return Hit(symptom=f"a batch's targets are one slice of the train split's: their std is {spread:.2g} "
                       f"of the split's, their mean {off_centre:.1f} standard errors off its mean",
                       evidence={**evidence, "batch_to_split_target_std": spread, "batch_mean_standard_errors": off_centre},
                       score=1.5)  # fmt: skip
        return False if spread > 2 * NARROW_BATCH and off_centre < OFF_CENTRE / 2 else None
    classes = bool(counts) or (call.target_dtype or "").startswith(("int", "uint", "bool"))
    if classes and (single == 0 or (chance is not None and single / measured <= 2 * chance)):
        return False  # mixed batches, or as many one-class batches as chance gives
    return None


@rule(
    "NNDX509",
    C.SILENT_DATA_LOSS,
    "warning",
    "Samples whose inputs are all zeros",
    detects="At least 5% of a split's samples with every input exactly zero. Info for token ids whose rows are "
    f"contexts (at least {CONTEXTS:.0%} of the repeated rows labelled otherwise): a language model's first window "
    "is padding.",
    why="All-zero samples usually come from a failed load or decode that was swallowed; the model trains "
    "on nothing for them.",
    fix="Find where the samples are zeroed (decode errors, masks, padding) and fix or drop them.",
)
def zero_samples(report: DiagnosticReport) -> list[Hit]:
    hits = []
    for name, split in _splits(report):
        if split.zero_sample_fraction >= 0.05:
            padding = _language(split)
            hits.append(
                Hit(
                    symptom=f"{split.zero_sample_fraction:.0%} of the {name} samples are all zeros"
                    + (": token 0 throughout, a language model's first context (padding)" if padding else ""),
                    evidence={"split": name, "zero_sample_fraction": split.zero_sample_fraction},
                    severity="info" if padding else None,
                    score=1.0 + split.zero_sample_fraction,
                )
            )
    return hits

"""Sample-independence probe: does one sample's output depend on the other samples?

How to use::

    result = sample_independence(model, (x, y))   # SampleIndependenceResult
    result.changed_samples, result.max_change      # > 0: samples leak into each other

In eval mode a model computes every sample on its own. When it does not, a layer runs
along the wrong axis: an LSTM built with ``batch_first=False`` fed ``(batch, time,
features)`` runs *over the batch* (each sample's state carries the previous samples'),
a ``view`` where ``permute`` was meant interleaves samples, attention sums over the
batch. None of this crashes, and a half-batch check cannot see the recurrent case (the
first samples never see the later ones). So: replace the first half of the batch's
samples by the last half's, run both batches on an eval-mode copy under the same seed,
and compare the outputs of the samples *not* replaced. Any change beyond the rounding
tolerance is evidence of WRONG_RESHAPE (samples mixed). Half, not one: a statistic over
the batch (a softmax over the batch axis, a batch mean) dilutes one sample's change by
1/N, which on a thousand samples stayed under the rounding tolerance.

A model that returns its samples in an order of its own — it sorts the batch by length
for ``pack_padded_sequence`` and never undoes the sort — moves the other samples too, but
differently: the reversed batch gives the same output rows in another order than
reversed. Then the outputs are paired with other samples' targets (LABELS_MISALIGNED),
unless the model returns the ordering beside them (a ``sort_ind`` for the loss to apply
to the targets, as image-captioning decoders do): that is skipped.

Samples coupled only through a statistic of the whole batch come back *reversed* from the
reversed batch, whatever their order. When the forward also reduces every axis of a batched
tensor (``torch.sum(ix)`` where ``torch.sum(ix, dim=1)`` was meant), that reduction is named
(``batch_reduction``): one number for the whole batch, broadcast onto every sample
(SHAPE_BROADCAST), not a reshape.

Which axis holds the samples: the inputs' axis whose length is the number of targets
(one target per sample: class indices, regression values, one-hot rows). A time-major
batch ``(time, batch, features)`` with targets ``(batch,)`` is read right; targets per step
(``(time, batch, 4)`` beside ``(time, batch, 3)`` inputs: World Models' MDRNN) are per position. Two axes of
that length (64 reviews of 64 tokens) are both tried: the batch passes when either keeps
the other samples in place, and fails only when both move them (whichever holds the
samples, they mix); a recurrent model is as causal along time as a bug is along the
batch, so one moving axis alone proves nothing. Targets per position (a tagger's
``(batch, time)`` labels look the same as time-major ones; a 1-D run of token ids with a
target each is one unbatched sentence as much as a batch of tokens) or no targets: the
probe says ``skipped`` — unless one axis length is shared by every tensor of the batch: a
decoder's ``(time, batch)`` targets beside a source of another length have the batch only
in common; or the targets are the inputs one step on along exactly one of the first two axes
(a language model's next tokens, a forecaster's next values): that axis is time, the other
the batch. Windows that overlap row to row in order shift along both: still ``skipped``.
A model whose outputs for one batch differ between two calls (a state it keeps from call to
call where the probe's copy does not put it back) moves every output: ``skipped``. No targets
at all (a model that computes its own loss: ProdLDA's, whose decoder softmax ran over the
batch): every axis of 3 entries or more is tried, as above.

A sample's output must not depend on where the sample sits in the batch either. When half
the batch moved no other sample (and the inputs have one axis of the samples' count), the
reversed batch must give the outputs reversed; outputs that are no reordering of the batch's
fail with ``position_dependent``: a table indexed along the batch axis (the PyTorch
tutorial's time-major ``(max_len, 1, d)`` positional encoding added as ``pe[:x.size(0)]`` to
batch-first inputs). With targets per position the leading axis alone is tried this way, and
only this failure is reported: a time-major model's positions read each other, so its leading
axis never passes the first test. A forward that draws random numbers in eval mode is not judged.

A model that keeps its samples apart may still be fed samples stitched from pieces of each
other: ``images.reshape(seq_len, -1, input_size)`` where ``images.transpose(0, 1)`` was meant
(yunjey/pytorch-tutorial#89) hands a time-major RNN "sequences" whose steps are rows of
different images, while the rows of one image lie in neighbouring samples. When a time-major
recurrent layer (``batch_first=False``, or a cell stepped by the loop) reads a floating-point
input whose samples lie along its second axis (a feature axis or none after them), the probe
reads that layout off the values: neighbouring samples alike and neighbouring steps not, and
the same values read in the other order (``reshape`` to the swapped sizes, as the loop's
``reshape`` took them) steps alike and samples not (``stitched``). Sorted batches (neighbouring
samples alike for a reason) and windows that overlap in order keep their steps alike as given;
data with no order along time reads no order either way. Batch-first inputs are not read:
there a sorted batch of unordered features (a flattened image's pixels) looks the same.

Nodes of one graph are no batch: when an input, or a tensor the model keeps beside its
parameters (vgae_pytorch's normalised adjacency is an attribute of its layers), is a matrix
over the samples, they depend on each other by design and the probe says ``skipped``.

A variance or standard deviation the model's own code takes over the leading axis of a view
of the batch (a minibatch standard deviation: ProGAN's and StyleGAN's critics append the
spread of each feature over groups of samples as one more channel, to see mode collapse)
couples the samples by design: moved outputs then say ``skipped``, with the statistic named.

Randomness in the forward: both forwards start from one seed, so a draw that does not
depend on the samples (pytorch-seq2seq's teacher-forcing coin per step) is the same in
both. A forward that draws as many times as the samples say (GraphSAGE's neighbour
sampling) ends the stream elsewhere for the changed batch; then moved outputs cannot tell
mixing from sampling, and the probe says ``skipped``.
"""

from __future__ import annotations

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    forward,
    global_draws,
    iter_tensors,
    map_tensors,
    prediction,
    preserved_rng,
    recurrent_layers,
    relates_samples,
    roundoff_tolerance,
    seed_all,
    set_mode,
    split_batch,
    trailing_runs,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._observe import ForwardObserver
from nndx.collector.stats import batch_statistics_only
from nndx.report import SampleIndependenceResult

MIN_SAMPLES = 3
STITCH_SAMPLES, STITCH_STEPS = 16, 4  # enough neighbours along each axis to read an order off the values
ALIKE, UNORDERED = 0.8, 0.85  # neighbours' distance over that of entries half the axis apart
NEXT_SHARE = 0.9  # of a sequence's targets that are its next inputs, for the axis to be read as time
SEED = 0


def sample_independence(model: nn.Module, batch: Batch) -> SampleIndependenceResult:
    """Replace the first half of the batch by the last half; count the samples not replaced
    whose eval-mode outputs move. When the samples moved, reverse the batch: outputs that
    come back as the same rows in another order than the reversal were reordered."""
    inputs, targets = split_batch(batch)
    first = next(iter_tensors(inputs), None)
    if first is not None and (stitched := _stitched_padding(model, first)) is not None:
        return stitched
    axes, why = _batch_axes(inputs, targets)
    if 1 in axes and _one_sequence(model, next(iter_tensors(inputs))):
        axes, why = [a for a in axes if a != 1], (
            "one sequence (batch axis of 1) into a batch_first recurrent layer: its steps, which the targets count, "
            "are no samples")  # fmt: skip
    if axes and (held := _held_matrix(model, int(next(iter_tensors(inputs)).shape[axes[0]]))):
        axes, why = [], (f"the model holds {held}, a matrix over the samples (a graph's adjacency): they depend on "
                         "each other by design")  # fmt: skip
    if not axes:
        recurrent = next((name for name, _ in recurrent_layers(model)), None)
        if recurrent is not None and _per_position(inputs, targets):
            with preserved_rng(), torch.no_grad():
                no_context = _reads_no_context(set_mode(working_copy(model), False), inputs, targets, recurrent)
            if no_context is not None:
                return no_context
        if _per_position(inputs, targets) and next(iter_tensors(inputs)).shape[0] >= MIN_SAMPLES:
            # batch-first or time-major cannot be told; but entries of the leading axis computed each on its own
            # are samples, and an output that then depends on where a sample sits in the batch is a table indexed
            # along the batch axis (a time-major positional encoding added to batch-first inputs)
            with preserved_rng(), torch.no_grad():
                leading = _trial(set_mode(working_copy(model), False), inputs, 0, check_position=True)
            if leading.position_dependent:
                return leading
        return SampleIndependenceResult(status="skipped", message=why)
    with preserved_rng(), torch.no_grad():
        model_copy = set_mode(working_copy(model), False)
        trials = []
        for axis in axes:
            trial = _trial(model_copy, inputs, axis, check_position=len(axes) == 1)
            if trial.status == "passed":
                if len(axes) > 1:
                    trial.message += f" (of the axes {axes} with as many entries as samples, the one that holds them)"
                return _stitched(model, inputs, axis, trial)
            trials.append(trial)
    if len(axes) == 1 or all(t.status == "failed" for t in trials):
        # with several candidate axes, along each of them other samples moved: whichever holds
        # the samples, they mix
        reordered = next((t for t in trials if t.reordered), None)
        return reordered or trials[0]
    return SampleIndependenceResult(status="skipped", message=(
        f"{len(axes)} axes of the inputs have the samples' count {list(axes)}, and none kept the other samples' "
        f"outputs in place: {trials[0].message}"))  # fmt: skip


def _one_sequence(model: nn.Module, first: torch.Tensor) -> bool:
    """A batch of one sequence for a model whose recurrent layers are all batch_first: axis 1 of
    its (1, time, features) input is time (udacity's Simple_RNN, one sine window a step, its 20
    steps flattened to 20 output rows beside 20 targets); the recurrence carries each step into
    the next, which is no mixing of samples."""
    recurrent = [m for _, m in recurrent_layers(model)]
    return (first.dim() >= 2 and first.shape[0] == 1 and bool(recurrent)
            and all(isinstance(m, nn.RNNBase) and m.batch_first for m in recurrent))


def _trial(model: nn.Module, inputs: object, axis: int, check_position: bool = False) -> SampleIndependenceResult:
    """The probe with ``axis`` as the samples' axis, on the eval-mode copy; with ``check_position``,
    samples that did not move are also reversed: their outputs must come back reversed."""
    first = next(iter_tensors(inputs))
    samples = int(first.shape[axis])
    replaced = samples // 2
    changed_inputs = map_tensors(inputs, lambda t: _replace_first(t, axis, samples, replaced))
    if all(torch.equal(a, b) for a, b in zip(iter_tensors(inputs), iter_tensors(changed_inputs))):
        return SampleIndependenceResult(status="skipped", batch_axis=axis, samples=samples,
                                        message="the batch's two halves hold the same samples: nothing to change")  # fmt: skip
    with ForwardObserver(model) as seen:
        (before, order), drawn = _prediction(model, inputs)
        try:
            (after, _), drawn_after = _prediction(model, changed_inputs)
        except Exception as exc:  # noqa: BLE001 - the model's own verdict on a batch it cannot take
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return SampleIndependenceResult(status="skipped", batch_axis=axis, samples=samples, message=(
                f"the model refused the batch with its first {replaced} samples replaced by its last ones "
                f"({type(exc).__name__}: {first_line}): it takes only batches in an order of its own (sorted by "
                "length for pack_padded_sequence, say), so samples cannot be swapped to compare"))  # fmt: skip
    if not bool(torch.isfinite(before).all()):
        return SampleIndependenceResult(status="skipped", batch_axis=axis, samples=samples, message=(
            "the eval-mode outputs are not all finite (NaN in the inputs or the weights): NaN equals nothing, so "
            "there is nothing to compare"))  # fmt: skip
    # both forwards start from one seed: the same draws in both (a teacher-forcing coin per
    # step) leave the streams where each other left them; draws that follow the samples do not
    draws = drawn != drawn_after
    out_axis = _output_axis(before, samples, axis)
    if out_axis is None or after.shape != before.shape:
        return SampleIndependenceResult(status="skipped", batch_axis=axis, samples=samples, message=(
            f"the output {list(before.shape)} has no axis of the batch's {samples} samples to compare"))
    tolerance = roundoff_tolerance(model, [before], seen.lowest_precision)
    change = (after - before).abs().movedim(out_axis, 0).reshape(samples, -1).amax(dim=1)[replaced:]
    moved = int((change > tolerance).sum())
    largest = float(change.max())
    common = dict(batch_axis=axis, samples=samples, replaced_samples=replaced, changed_samples=moved,
                  max_change=largest, tolerance=tolerance)  # fmt: skip
    what = f"replacing the first {replaced} samples by the last {replaced}"
    if moved and _moves_again(model, inputs, before, tolerance):
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but the same batch "
            "forwarded twice gives other outputs the second time: the model keeps a state from call to call (a "
            "hidden state carried over to the next batch, as stateful language models do), so this cannot tell "
            "mixing from that state"))  # fmt: skip
    batch_norms = [name for name, m in model.named_modules() if batch_statistics_only(m)]
    if moved and (seen.functional_batch_statistics or batch_norms):
        how = (f"{batch_norms[0] or 'the model'} is a BatchNorm with track_running_stats=False" if batch_norms
               else "the forward calls batch_norm as a function with training=True")  # fmt: skip
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but {how}: batch "
            "statistics couple the samples in any mode, by design in a few-shot learner (MAML's, Reptile's); the "
            "eval-mode probe judges batch statistics"))  # fmt: skip
    spreads = [what for what, length in seen.leading_spreads if 1 < length <= samples and samples % length == 0]
    if moved and spreads:
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but the forward takes "
            f"a spread statistic across the samples ({spreads[0]}): a minibatch standard deviation (ProGAN's and "
            "StyleGAN's critics) that shows the critic the batch's variety couples the samples by design"))  # fmt: skip
    if moved and draws:
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but the forward draws "
            "from Python's or numpy's random stream as many times as the samples say (sampling a graph's "
            "neighbours): other samples' draws shift with the replaced ones, so this cannot tell mixing from "
            "sampling"))  # fmt: skip
    if moved and samples in seen.sorted_lengths and _moves_again(model, inputs, before, tolerance, SEED + 1):
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but the forward sorts "
            "the samples and draws random numbers in eval mode (Sentence-VAE's z, sampled after a sort by length): "
            "the draws go to the samples in an order the replaced ones change, so this cannot tell mixing from "
            "sampling"))  # fmt: skip
    if moved and order is not None:
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, and the model returns "
            "an ordering of its samples (a sort_ind, as models that sort a batch by length do): its outputs are "
            "in that order, which the loss must apply to the targets"))  # fmt: skip
    reversal = _reversal(model, inputs, axis, before, out_axis, tolerance) if moved else None
    reductions = [what for what, shape in seen.whole_reductions if samples in shape]
    if reversal == "reordered":
        return SampleIndependenceResult(status="failed", reordered=True, **common, message=(
            f"{what} moved the eval-mode outputs of {moved} of the other {samples - replaced} samples, and the "
            "reversed batch gave the same outputs in another order than reversed: the model returns its samples "
            "in an order of its own (a sort by length never undone), so output i is paired with another "
            "sample's target"))  # fmt: skip
    if moved and reversal == "reversed" and reductions:
        return SampleIndependenceResult(status="failed", reordered=False, batch_reduction=reductions[0], **common,
                                        message=(
            f"{what} moved the eval-mode outputs of {moved} of the other {samples - replaced} samples (by up to "
            f"{largest:.3g}), the reversed batch gave the same outputs reversed (a statistic of the batch as a whole, "
            f"not of positions in it), and the forward reduces every axis of a batched tensor ({reductions[0]}): a "
            "sum or mean without dim= folds every sample into one number that is broadcast back onto each"))
    if moved:
        return SampleIndependenceResult(status="failed", reordered=False, **common, message=(
            f"{what} moved the eval-mode outputs of {moved} of the other {samples - replaced} samples (by up to "
            f"{largest:.3g}, tolerance {tolerance:.3g}): the model mixes samples along the batch axis — a recurrent "
            "layer run over the batch (batch_first), a view/reshape where permute was meant, or statistics over "
            "the batch in eval mode"))  # fmt: skip
    if check_position and _reversal(model, inputs, axis, before, out_axis, tolerance) is None \
            and not _moves_again(model, inputs, before, tolerance, SEED + 1):  # fmt: skip
        return SampleIndependenceResult(status="failed", position_dependent=True, **common, message=(
            f"{what} left the other {samples - replaced} samples' outputs unchanged, but the reversed batch gave "
            "outputs that are no reordering of the batch's: each sample's output depends on its position in the "
            "batch (a table indexed along the batch axis: a time-major (max_len, 1, d) positional encoding added "
            "to batch-first inputs)"))  # fmt: skip
    return SampleIndependenceResult(status="passed", **common, message=(
        f"{what} left the other {samples - replaced} samples' outputs unchanged (within {tolerance:.3g})"))


def _stitched(model: nn.Module, inputs: object, axis: int, passed: SampleIndependenceResult
              ) -> SampleIndependenceResult:  # fmt: skip
    """``passed``, or a failure when the time-major first input's samples are stitched from each
    other's pieces."""
    x = next(iter_tensors(inputs))
    if not _time_major_recurrent(model) or not x.is_floating_point() or x.dim() not in (2, 3) or axis != 1:
        return passed
    x = (x if x.dim() == 3 else x[..., None]).double()  # (time, batch, features)
    if x.shape[1] < STITCH_SAMPLES or x.shape[0] < STITCH_STEPS:
        return passed
    reread = x.reshape(x.shape[1], x.shape[0], -1)  # the same values as (batch, time, features)
    ratios = {"batch_as_given": _neighbour_ratio(x, 1), "time_as_given": _neighbour_ratio(x, 0),
              "batch_reread": _neighbour_ratio(reread, 0), "time_reread": _neighbour_ratio(reread, 1)}
    if not (ratios["batch_as_given"] <= ALIKE and ratios["time_as_given"] >= UNORDERED
            and ratios["time_reread"] <= ALIKE and ratios["batch_reread"] >= UNORDERED):
        return passed
    return passed.model_copy(update={"status": "failed", "stitched": ratios, "message": (
        f"the model keeps its samples apart, but its time-major inputs {list(x.shape[:2])} are stitched from "
        f"pieces of each other: neighbouring samples are alike ({ratios['batch_as_given']:.2f} of the distance "
        f"between samples half the batch apart) and neighbouring steps are not ({ratios['time_as_given']:.2f}); "
        f"the same values read as {list(reread.shape[:2])} give steps alike ({ratios['time_reread']:.2f}) and "
        f"samples that are not ({ratios['batch_reread']:.2f}): a reshape or view made (batch, time) data "
        "time-major where transpose or permute was meant")})  # fmt: skip


def _time_major_recurrent(model: nn.Module) -> bool:
    """A recurrent layer built time-major (batch_first=False) or a cell the loop steps through time."""
    return any(isinstance(m, nn.RNNCellBase) or not m.batch_first for _, m in recurrent_layers(model))


def _neighbour_ratio(x: torch.Tensor, axis: int) -> float:
    """Mean distance between neighbours along ``axis`` over that between entries half the axis
    apart: under 1 where the axis is ordered (steps of a signal, sorted samples), about 1 where not."""
    length = int(x.shape[axis])
    near = (x.narrow(axis, 1, length - 1) - x.narrow(axis, 0, length - 1)).abs().mean()
    far = (x - x.roll(length // 2, axis)).abs().mean()
    return float(near / far) if float(far) > 0 else 1.0


def _reads_no_context(model: nn.Module, inputs: object, targets: object, recurrent: str
                      ) -> SampleIndependenceResult | None:  # fmt: skip
    """Targets per position, and a recurrent layer: some axis the inputs share with the targets
    must carry context, each position's output reading the positions before it (the sequence,
    whichever axis it is). When replacing the first half of the entries moves the outputs of those
    replaced along every such axis, and of no other entry along any, the recurrent layer runs over
    an axis of its own: ``batch_first=False`` fed one ``(1, time, features)`` sequence reads
    ``time`` as a batch of one-step sequences. None when some axis carries context, or no axis
    could be tried."""
    first = next(iter_tensors(inputs))
    target = next(iter_tensors(targets))
    axes = [a for a in range(min(first.dim(), target.dim())) if first.shape[a] == target.shape[a] > 1]
    tried = []
    (before, _), _ = _prediction(model, inputs) if axes else ((None, None), None)
    for axis in axes:
        length = int(first.shape[axis])
        replaced = length // 2
        changed_inputs = map_tensors(inputs, lambda t: _replace_first(t, axis, length, replaced))  # noqa: B023
        (after, _), _ = _prediction(model, changed_inputs)
        out_axis = _output_axis(before, length, axis)
        if out_axis is None or after.shape != before.shape:
            return None
        tolerance = roundoff_tolerance(model, [before])
        change = (after - before).abs().movedim(out_axis, 0).reshape(length, -1).amax(dim=1)
        if bool((change[replaced:] > tolerance).any()) or not bool((change[:replaced] > tolerance).any()):
            return None  # context along this axis, or the replaced entries' own outputs did not move
        tried.append((axis, length, replaced, float(change[replaced:].max()), tolerance))
    if not tried:
        return None
    axis, length, replaced, largest, tolerance = tried[-1]
    return SampleIndependenceResult(
        status="failed", batch_axis=axis, samples=length, replaced_samples=replaced, changed_samples=0,
        max_change=largest, tolerance=tolerance, no_context=recurrent, message=(
            f"targets per position, and along every axis they share with the inputs ({[t[0] for t in tried]}) each "
            f"output reads its own position alone: replacing the first {replaced} of {length} positions moved their "
            f"outputs and none of the other {length - replaced} (within {tolerance:.3g}). The recurrent layer "
            f"{recurrent} carries nothing along the sequence: it runs over another axis (batch_first=False fed "
            "(batch, time, features))"))  # fmt: skip


def _per_position(inputs: object, targets: object) -> bool:
    """Targets with an entry per position of the first input (a sequence model's)."""
    first = next(iter_tensors(inputs), None)
    target = next(iter_tensors(targets), None) if targets is not None else None
    if first is None or target is None or target.dim() < 2:
        return False
    return tuple(target.shape) == tuple(first.shape[: target.dim()]) or (
        target.dim() >= 3 and target.dim() == first.dim() and tuple(target.shape[:-1]) == tuple(first.shape[:-1]))


def _reversal(model: nn.Module, inputs: object, axis: int, before: torch.Tensor, out_axis: int,
              tolerance: float) -> str | None:  # fmt: skip
    """What the reversed batch gives: "reordered" when its outputs are the batch's outputs,
    row for row, in an order other than reversed (each sample computed on its own, returned
    in the model's own order: sorted by length, say); "reversed" when they are the batch's
    outputs reversed (samples coupled only through a statistic of the whole batch, which
    no order changes); None when rows match none (samples mixed by position); "unknown" when
    the model refused the reversed batch or returned another shape."""
    samples = int(before.shape[out_axis])
    reversed_inputs = map_tensors(inputs, lambda t: t if (along := _samples_axis(t, axis, samples)) is None
                                  else t.flip(along))  # fmt: skip
    try:
        (flipped, _), _ = _prediction(model, reversed_inputs)
    except Exception:  # noqa: BLE001 - a model that takes its batches in one order only: no verdict
        return "unknown"
    if flipped.shape != before.shape:
        return "unknown"
    # compared directly first: saturated outputs (sigmoids at 1.0) match many rows at once
    if float((flipped.flip(out_axis) - before).abs().max()) <= tolerance:
        return "reversed"
    rows, flipped_rows = (t.movedim(out_axis, 0).reshape(samples, -1) for t in (before, flipped))
    distance = torch.cdist(flipped_rows.double(), rows.double(), p=float("inf"))  # no (B, B, outputs) tensor
    nearest = distance.argmin(dim=1)
    matched = bool((distance.gather(1, nearest[:, None]) <= tolerance).all())
    is_permutation = torch.unique(nearest).numel() == samples
    return "reordered" if matched and is_permutation else None


def _batch_axes(inputs: object, targets: object) -> tuple[list[int], str]:
    """The inputs' axes with as many entries as there are targets (any of them may hold the
    samples: 64 reviews of 64 tokens), or why none can be told."""
    first = next(iter_tensors(inputs), None)
    target = next(iter_tensors(targets), None) if targets is not None else None
    if first is None or first.dim() == 0:
        return [], "the inputs hold no batched tensor"
    if any(t.layout != torch.strided for t in iter_tensors(inputs)):
        return [], "a sparse input (a graph's adjacency, say): its rows are not samples the probe can swap"
    if target is None or target.dim() == 0:
        return _axes_without_targets(inputs, first)
    # (a leading axis the inputs and targets agree on is the batch, of one image even: style transfer's
    # [1, 3, 8, 8] image beside [1, 8, 8, 8] features share only their 8 pixels a side, which are no samples)
    shared = _shared_length(inputs, targets) if target.dim() >= 2 and target.shape[0] != first.shape[0] else None
    # per position, or per step with features of another width ((time, batch, 4) next latents for
    # (time, batch, 3) actions); a trailing axis of one (a regression's (N, 1) targets for (N, 1)
    # inputs) is no time axis
    if _per_position(inputs, targets) and max(target.shape[1:]) > 1 and shared is None:
        batch_axis = _beside_time(first, target)
        batch_axis = _beside_padding(first) if batch_axis is None else batch_axis
        if batch_axis is None:
            return [], (f"targets {list(target.shape)} per position of inputs {list(first.shape)} (a sequence model): "
                          "the batch axis cannot be told from a time axis")  # fmt: skip
        if first.shape[batch_axis] < MIN_SAMPLES:
            return [], f"only {first.shape[batch_axis]} samples; need {MIN_SAMPLES}"
        return [batch_axis], ""
    if first.dim() == 1 and not first.is_floating_point() and tuple(target.shape) == tuple(first.shape):
        return [], (f"token ids {list(first.shape)} with a target each: one unbatched sequence (an LSTM tagger "
                      "fed a sentence at a time) cannot be told from a batch of single tokens")  # fmt: skip
    # targets per position of a decoder (time, batch) beside a source of another length: the
    # batch is the one length every tensor has
    samples = shared if shared is not None else int(target.shape[0])
    axes = [a for a in range(first.dim()) if first.shape[a] == samples]
    if not axes:
        return [], f"no axis of the inputs {list(first.shape)} has the {samples} samples of the targets"
    if samples < MIN_SAMPLES:
        return [], f"only {samples} samples; need {MIN_SAMPLES}"
    if relates_samples(inputs, samples):
        return [], (f"an input is a {samples} x {samples} matrix over the samples (a graph's adjacency): they "
                    "depend on each other by design")  # fmt: skip
    return axes, ""


def _beside_time(first: torch.Tensor, target: torch.Tensor) -> int | None:
    """The batch axis of a sequence batch whose targets are its inputs one step on (a language
    model's next tokens, a forecaster's next values): time is the one of the first two axes along
    which ``target[t] == inputs[t + 1]`` nearly everywhere, the batch the other. None when neither
    or both are (windows that overlap row to row, in order)."""
    if first.dim() < 2 or tuple(target.shape) != tuple(first.shape):
        return None
    along = []
    for axis in (0, 1):
        length = int(first.shape[axis])
        if length < MIN_SAMPLES:
            continue
        same = target.narrow(axis, 0, length - 1) == first.narrow(axis, 1, length - 1)
        along.append((axis, float(same.float().mean())))
    times = [axis for axis, share in along if share >= NEXT_SHARE]
    if len(times) != 1 or any(share >= 0.5 for axis, share in along if axis != times[0]):
        return None
    return 1 - times[0]


def _beside_padding(tokens: torch.Tensor) -> int | None:
    """The batch axis of a padded token batch: time is the one of its two axes along which every
    line ends in a run of one id (the padding, or an end-of-sequence id) that nothing else holds,
    in a quarter of the lines or more; the batch the other. A seq2seq batch of sentences padded
    to the longest tells (bentrevett's Multi30k batches, time-major, or batch-first by mistake),
    where the targets, a translation, are no shift of the inputs. None when neither axis or both
    read so (batches sorted by length pad both ways), or the batch is no 2-d integer tensor."""
    if tokens.dim() != 2 or tokens.is_floating_point() or tokens.is_complex() or min(tokens.shape) < MIN_SAMPLES:
        return None
    ended = [axis for axis in (0, 1) if _padded_share(tokens.movedim(axis, -1)) is not None]
    return 1 - ended[0] if len(ended) == 1 else None


def _padded_share(lines: torch.Tensor) -> float | None:
    """The share of ``lines`` (a 2-d integer tensor's rows) that end in a run of one id which
    nothing else holds, once it appears, to the line's end; None when under a quarter do."""
    found = trailing_runs(lines)
    if found is None:
        return None
    pad, run = found
    run_to_the_end = bool(((lines == pad).sum(dim=1) == run).all())  # once the id, the id to the line's end
    padded = float(((run > 0) & (run < lines.shape[1])).float().mean())
    return padded if run_to_the_end and padded >= 0.25 else None


def _stitched_padding(model: nn.Module, tokens: torch.Tensor) -> SampleIndependenceResult | None:
    """A failure when a 2-d token batch reads as padded sentences only in memory order: neither of
    its axes has lines that end in padding, but the same ids reshaped to the swapped sizes do
    (persson's seq2seq with batch-first padding made time-major by ``reshape(seq_len, N)``, not
    ``.t()``: every column the model reads as a sentence is pieces of several, the padding in
    their middles). None otherwise."""
    if (tokens.dim() != 2 or tokens.is_floating_point() or tokens.is_complex() or min(tokens.shape) < MIN_SAMPLES
            or any(_padded_share(tokens.movedim(axis, -1)) is not None for axis in (0, 1))):
        return None
    reread = tokens.reshape(tokens.shape[1], tokens.shape[0])
    share = _padded_share(reread)
    if share is None:
        return None
    axis = 1 if _time_major_recurrent(model) else 0
    return SampleIndependenceResult(
        status="failed", batch_axis=axis, samples=int(tokens.shape[axis]), stitched={"padded_lines_reread": share},
        message=(f"the token batch {list(tokens.shape)} has padding in the middle of its lines along both axes, "
                 f"but the same ids read as {list(reread.shape)} are sentences that end in padding ({share:.0%} of "
                 "them padded): a reshape or view turned a padded (batch, time) batch into (time, batch) where "
                 "transpose was meant, so each sequence the model reads is pieces of several"))  # fmt: skip


def _axes_without_targets(inputs: object, first: torch.Tensor) -> tuple[list[int], str]:
    """No targets say which axis holds the samples (a model that computes its own loss, an
    autoencoder): every axis of the first input with ``MIN_SAMPLES`` entries or more is tried, in
    order, and the batch passes when any of them keeps the other samples in place. A leading axis
    shorter than that is one sample (an image to fit), and a 1-D input a sequence as much as a batch."""
    if first.dim() < 2 or first.shape[0] < MIN_SAMPLES:
        return [], (f"no targets to tell which axis of the inputs {list(first.shape)} holds the samples, and no "
                    f"leading axis of {MIN_SAMPLES} or more to try")  # fmt: skip
    if relates_samples(inputs, int(first.shape[0])):
        return [], (f"an input is a {first.shape[0]} x {first.shape[0]} matrix over the samples (a graph's "
                    "adjacency): they depend on each other by design")  # fmt: skip
    return [a for a in range(first.dim()) if first.shape[a] >= MIN_SAMPLES], ""


def _held_matrix(model: nn.Module, samples: int) -> str | None:
    """The name of a tensor the model keeps beside its parameters (a buffer, or a plain
    attribute as graph models keep their normalised adjacency) with two axes of the batch's
    ``samples``, if any: then the samples are nodes of one graph, not a batch."""
    for module_name, module in model.named_modules():
        for name, value in [*vars(module).items(), *module._buffers.items()]:
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.dim() >= 2 \
                    and sum(1 for n in value.shape if n == samples) >= 2:
                return f"{module_name + '.' if module_name else ''}{name} {list(value.shape)}"
    return None


def _shared_length(inputs: object, targets: object) -> int | None:
    """The one axis length (over 1) that every batched tensor of the batch has, if exactly one."""
    tensors = [t for t in (*iter_tensors(inputs), *iter_tensors(targets)) if t.dim() >= 1]
    common = set.intersection(*({int(n) for n in t.shape if n > 1} for t in tensors)) if tensors else set()
    return common.pop() if len(common) == 1 else None


def _samples_axis(t: torch.Tensor, axis: int, samples: int) -> int | None:
    """The axis of ``t`` that holds the batch's samples: ``axis`` where ``t`` has it with that many
    entries; else, for a tensor too short for ``axis``, its first when that has them (a (batch,)
    vector of lengths beside (time, batch) tokens: the PyTorch chatbot tutorial's encoder); else none."""
    if t.dim() > axis and t.shape[axis] == samples:
        return axis
    return 0 if 1 <= t.dim() <= axis and t.shape[0] == samples else None


def _replace_first(t: torch.Tensor, axis: int, samples: int, count: int) -> torch.Tensor:
    """``t`` with its first ``count`` samples along ``axis`` (:func:`_samples_axis`) replaced by its last ``count``."""
    along = _samples_axis(t, axis, samples)
    if along is None:
        return t
    changed = t.clone()
    changed.narrow(along, 0, count).copy_(t.narrow(along, samples - count, count))
    return changed


def _moves_again(model: nn.Module, inputs: object, before: torch.Tensor, tolerance: float, seed: int = SEED) -> bool:
    """Whether the same batch, forwarded again from ``seed``, gives other outputs than ``before``:
    from the first forward's seed, a state the model keeps from call to call; from another seed
    (``SEED + 1``), random numbers drawn in eval mode."""
    (again, _), _ = _prediction(model, inputs, seed)
    return again.shape != before.shape or float((again - before).abs().max()) > tolerance


def _prediction(model: nn.Module, inputs: object, seed: int = SEED
                ) -> tuple[tuple[torch.Tensor, torch.Tensor | None], tuple]:  # fmt: skip
    """The eval-mode prediction with the ordering of the samples the model returned beside
    it (an integer tensor holding a permutation of their indices), and where the forward
    left Python's and numpy's streams (it starts them from one seed)."""
    seed_all(seed)  # the same random draws in both forwards: only the changed sample differs
    output = forward(model, inputs)
    out = next(iter_tensors(prediction(output)), None)
    if out is None:
        raise ValueError("the model returned no tensor")
    order = next((t for t in iter_tensors(output) if _is_permutation(t)), None)
    return (out.detach().float(), order), global_draws()


def _is_permutation(t: torch.Tensor) -> bool:
    if t.dim() != 1 or t.numel() < MIN_SAMPLES or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        return False
    return torch.equal(t.sort().values.cpu(), torch.arange(t.numel()))


def _output_axis(out: torch.Tensor, samples: int, input_axis: int) -> int | None:
    axes = [a for a in range(out.dim()) if out.shape[a] == samples]
    if not axes:
        return None
    return input_axis if input_axis in axes else axes[0]


SPEC = ProbeSpec(name="sample_independence", title=SampleIndependenceResult.title, function=sample_independence,
                 result=SampleIndependenceResult, order=35, needs_finite_parameters=True)  # fmt: skip

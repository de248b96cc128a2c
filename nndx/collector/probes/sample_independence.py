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

Which axis holds the samples: the inputs' axis whose length is the number of targets
(one target per sample: class indices, regression values, one-hot rows). A time-major
batch ``(time, batch, features)`` with targets ``(batch,)`` is read right. When that is
ambiguous — targets per position (a language model's ``(batch, time)`` labels look the
same as time-major ones; a 1-D run of token ids with a target each is one unbatched
sentence as much as a batch of tokens), no targets, or two axes of that length — the probe says
``skipped``: a recurrent model over time is as causal along time as a bug is along the
batch, so guessing would raise false alarms.
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
    relates_samples,
    roundoff_tolerance,
    seed_all,
    set_mode,
    split_batch,
    working_copy,
)
from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._observe import ForwardObserver
from nndx.report import SampleIndependenceResult

MIN_SAMPLES = 3
SEED = 0


def sample_independence(model: nn.Module, batch: Batch) -> SampleIndependenceResult:
    """Replace the first half of the batch by the last half; count the samples not replaced
    whose eval-mode outputs move."""
    inputs, targets = split_batch(batch)
    axis, why = _batch_axis(inputs, targets)
    if axis is None:
        return SampleIndependenceResult(status="skipped", message=why)
    first = next(iter_tensors(inputs))
    samples = int(first.shape[axis])
    replaced = samples // 2
    changed_inputs = map_tensors(inputs, lambda t: _replace_first(t, axis, samples, replaced))
    if all(torch.equal(a, b) for a, b in zip(iter_tensors(inputs), iter_tensors(changed_inputs))):
        return SampleIndependenceResult(status="skipped", batch_axis=axis, samples=samples,
                                        message="the batch's two halves hold the same samples: nothing to change")  # fmt: skip
    with preserved_rng(), torch.no_grad():
        model_copy = set_mode(working_copy(model), False)
        with ForwardObserver(model_copy) as seen:
            before, draws = _prediction(model_copy, inputs)
            after, _ = _prediction(model_copy, changed_inputs)
    out_axis = _output_axis(before, samples, axis)
    if out_axis is None or after.shape != before.shape:
        return SampleIndependenceResult(status="skipped", batch_axis=axis, samples=samples, message=(
            f"the output {list(before.shape)} has no axis of the batch's {samples} samples to compare"))
    tolerance = roundoff_tolerance(model_copy, [before], seen.lowest_precision)
    change = (after - before).abs().movedim(out_axis, 0).reshape(samples, -1).amax(dim=1)[replaced:]
    moved = int((change > tolerance).sum())
    largest = float(change.max())
    common = dict(batch_axis=axis, samples=samples, replaced_samples=replaced, changed_samples=moved,
                  max_change=largest, tolerance=tolerance)  # fmt: skip
    what = f"replacing the first {replaced} samples by the last {replaced}"
    if moved and seen.functional_batch_statistics:
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but the forward calls "
            "batch_norm as a function with training=True: batch statistics couple the samples in any mode, by design "
            "in a functional learner (MAML's); the eval-mode probe judges batch statistics"))  # fmt: skip
    if moved and draws:
        return SampleIndependenceResult(status="skipped", **common, message=(
            f"{what} moved the outputs of {moved} of the other {samples - replaced} samples, but the forward draws "
            "from Python's or numpy's random stream (sampling a graph's neighbours, say): other samples' draws shift "
            "with the replaced ones, so this cannot tell mixing from sampling"))  # fmt: skip
    if moved:
        return SampleIndependenceResult(status="failed", **common, message=(
            f"{what} moved the eval-mode outputs of {moved} of the other {samples - replaced} samples (by up to "
            f"{largest:.3g}, tolerance {tolerance:.3g}): the model mixes samples along the batch axis — a recurrent "
            "layer run over the batch (batch_first), a view/reshape where permute was meant, or statistics over "
            "the batch in eval mode"))  # fmt: skip
    return SampleIndependenceResult(status="passed", **common, message=(
        f"{what} left the other {samples - replaced} samples' outputs unchanged (within {tolerance:.3g})"))


def _batch_axis(inputs: object, targets: object) -> tuple[int | None, str]:
    first = next(iter_tensors(inputs), None)
    target = next(iter_tensors(targets), None) if targets is not None else None
    if first is None or first.dim() == 0:
        return None, "the inputs hold no batched tensor"
    if any(t.layout != torch.strided for t in iter_tensors(inputs)):
        return None, "a sparse input (a graph's adjacency, say): its rows are not samples the probe can swap"
    if target is None or target.dim() == 0:
        return None, "no targets to tell which axis of the inputs holds the samples"
    # a trailing axis of one (a regression's (N, 1) targets for (N, 1) inputs) is no time axis
    if target.dim() >= 2 and tuple(target.shape) == tuple(first.shape[: target.dim()]) and max(target.shape[1:]) > 1:
        return None, (f"targets {list(target.shape)} per position of inputs {list(first.shape)} (a sequence model): "
                      "the batch axis cannot be told from a time axis")  # fmt: skip
    if first.dim() == 1 and not first.is_floating_point() and tuple(target.shape) == tuple(first.shape):
        return None, (f"token ids {list(first.shape)} with a target each: one unbatched sequence (an LSTM tagger "
                      "fed a sentence at a time) cannot be told from a batch of single tokens")  # fmt: skip
    samples = int(target.shape[0])
    axes = [a for a in range(first.dim()) if first.shape[a] == samples]
    if len(axes) != 1:
        return None, f"{len(axes)} axes of the inputs {list(first.shape)} have the {samples} samples of the targets"
    if samples < MIN_SAMPLES:
        return None, f"only {samples} samples; need {MIN_SAMPLES}"
    if relates_samples(inputs, samples):
        return None, (f"an input is a {samples} x {samples} matrix over the samples (a graph's adjacency): they "
                      "depend on each other by design")  # fmt: skip
    return axes[0], ""


def _replace_first(t: torch.Tensor, axis: int, samples: int, count: int) -> torch.Tensor:
    """``t`` with its first ``count`` samples along ``axis`` replaced by its last ``count``."""
    if t.dim() <= axis or t.shape[axis] != samples:
        return t
    changed = t.clone()
    changed.narrow(axis, 0, count).copy_(t.narrow(axis, samples - count, count))
    return changed


def _prediction(model: nn.Module, inputs: object) -> tuple[torch.Tensor, bool]:
    """The eval-mode prediction, and whether the forward drew from Python's or numpy's stream."""
    seed_all(SEED)  # the same random draws in both forwards: only the changed sample differs
    start = global_draws()
    out = next(iter_tensors(prediction(forward(model, inputs))), None)
    if out is None:
        raise ValueError("the model returned no tensor")
    return out.detach().float(), global_draws() != start


def _output_axis(out: torch.Tensor, samples: int, input_axis: int) -> int | None:
    axes = [a for a in range(out.dim()) if out.shape[a] == samples]
    if not axes:
        return None
    return input_axis if input_axis in axes else axes[0]


SPEC = ProbeSpec(name="sample_independence", title=SampleIndependenceResult.title, function=sample_independence,
                 result=SampleIndependenceResult, order=35, needs_finite_parameters=True)  # fmt: skip

"""Causality probe: can a next-token model see the token it must predict?

How to use::

    result = causality(model, (tokens, targets), loss_fn)   # CausalityResult
    result.copy_fraction, result.next_fraction   # targets the inputs themselves? (not shifted)
    result.changed_positions, result.max_change  # earlier outputs moved by later tokens? (leak)

A language model whose loss falls to almost zero has often been shown the answer, in one
of two ways, neither of which crashes:

- **targets not shifted**: the loss asks position ``t`` to predict ``inputs[t]``, the
  token it is given, instead of ``inputs[t + 1]`` (LABELS_MISALIGNED) — or, in a masked
  language model, the tokens it must recover were never masked in its input; shifted
  twice (``inputs[t + 2]``: labels shifted by hand for a Hugging Face model that shifts
  them itself) or backwards is misaligned too, though nothing is copied;
- **the future is visible**: the output at ``t`` depends on tokens after ``t`` — a
  missing or wrong causal mask, a bidirectional LSTM used as a language model, a
  convolution padded on both sides (DATA_LEAKAGE).

A model trained on several objectives (BERT's next-sentence label per sample beside its
masked-token labels) is read through the target and the output that have an entry per
token. Which target the loss pairs with each output position is read from the loss itself,
not from the batch: one backward of the loss on an eval-mode copy, and the token whose
logit the gradient at position ``t`` pushes up is that position's target (a loss that
shifts internally, as a Hugging Face model computing its own ``.loss`` from
``labels = input_ids`` does, is right, and is read right). Positions the loss ignores
(zero gradient: padding, ``ignore_index``) do not count. ``copy_fraction`` is the share of
scored positions whose target is the input token at that position, ``next_fraction``
the share whose target is the next input token; a correct language model has
``next_fraction`` ≈ 1, and ``copy_fraction`` only as high as the text repeats itself.

What a position reads, not where it sits, is what its target is compared with. A
teacher-forced decoder handed the target tensor (``model(src, trg)``, as
pytorch-seq2seq's) reads ``trg[t - 1]`` to give output ``t``, and a model that puts a
start token in front of its inputs reads ``x[t - 1]``: for them ``targets = trg`` is
right, and pairing ``output[:-1]`` with ``trg[1:]`` asks two tokens ahead. So once the
targets are read, one more forward with one token changed per sample (at a position that
differs from sample to sample) finds how far back the last token each position reads sits
(``input_shift``); the offsets are counted from there. The targets themselves are tried
as the token input last, and only when the outputs move with them (a model computing its
own loss is handed them without reading them).

Which axis is time: the one along which targets are the next inputs; a time-major
``(time, batch)`` batch is read right. When targets are neither the next tokens nor the
tokens themselves (a tagger's per-token labels, a masked language model), the objective
is not next-token prediction, a bidirectional model is legitimate, and the probe says
``skipped``; so it does for targets of another shape than the inputs (a classifier over a
whole sequence). Targets flattened to one axis (``targets.reshape(-1)`` against
``output.view(-1, V)``, as PyTorch's language-model examples write it) are read in the
layout of the token tensor they flatten.

Which axis holds the text: once time is known, adjacent input tokens must tell each other
more along it than across the batch (``time_information``, ``batch_information``: their
mutual information, less that of each token paired with another sample's at the same
position). Text that tells far
more across the batch was batched down it (``data.view(-1, batch_size)`` where
``data.view(batch_size, -1)`` was meant): each sequence holds every batch_size-th token
(``text_across_batch``), and the targets, still the next inputs, hide it.

Two more readings cover models fed floats rather than tokens, when the targets are no
integer tokens. An autoregressive density model (PixelCNN over pixels, MADE over binary
dimensions) has the inputs themselves as targets, or intensities quantised from them: one
sample's positions are changed one at a time in one eval-mode batch, and a model whose
outputs read the other positions one way only is autoregressive; an output that moves with
its own input sees what it must predict. A forecaster handed float targets verbatim inside a
longer input (a decoder input built from the whole target window) has the value at a
target's own position changed: the prediction for it must not move. A sequence model over
float steps (a recurrent layer, which reads its current step by design) whose targets are
its inputs has them unshifted; steps flattened into ``(N * T, F)`` rows are read in the
inputs' layout, and a model that takes only one sample runs its edited rows one by one.

Causality: the tokens after position ``cut`` are replaced by other ids of the batch and
both batches run on the eval-mode copy under one seed; the outputs at positions
``<= cut`` must not move beyond the rounding tolerance (dtype eps × magnitude ×
reduction sizes: :func:`~nndx.collector._common.roundoff_tolerance`); when they do, the two
forwards run again in train mode, where the loss trains, and a decoder that builds its causal
mask only when ``self.training`` (d2l's) passes. Which output
depends on which token does not depend on the dtype, so a float16/bfloat16 model, or
one probed under ``amp``, is compared on a float32 copy without autocast, where the
tolerance is tight. One backward and three or four forwards in all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    forward,
    forwards_under_autocast,
    iter_tensors,
    map_tensors,
    prediction,
    preserved_rng,
    recurrent_layers,
    roundoff_tolerance,
    seed_all,
    set_mode,
    split_batch,
    trailing_runs,
    working_copy,
)
from nndx.collector.loss_call import InnerLossCalls
from nndx.collector.probes import ProbeSpec
from nndx.collector.probes._observe import ForwardObserver
from nndx.report import CausalityResult

MIN_POSITIONS = 4
# a correct language model's targets are the next inputs at (nearly) every scored position;
# so are an unshifted one's the inputs themselves, or a misaligned one's those at another offset
NEXT_TOKEN_SHARE = 0.9
# ... and far more often than the next inputs: at over half the positions where the next input is not the
# target (text that repeats one token cannot tell the two; templated text whose next token equals the current
# one at 63% of the positions, unshifted, has its inputs as targets at 100%)
COPY_MARGIN = 0.5
SEED = 0
# targets this far ahead of their position (2: labels shifted by hand for a model that shifts
# them again) or behind it are misaligned
MISPLACED_OFFSETS = (2, 3, -1)
# padding ends at least this share of the target sequences (padded to the longest one)
PADDED_ROWS = 0.25
LOW_PRECISION = (torch.float16, torch.bfloat16)
# positions of one sample changed one at a time to read an autoregressive density model's order
DENSITY_POSITIONS = 256
# pairs of positions that read each other, as a share of the one-way reads: above it, no one order
MUTUAL_READS = 0.01
# outputs that move with their own input, as a share of the positions changed: fewer (but some) is no mask
OWN_READS = 0.5
# adjacent tokens across the batch telling each other this much (nats above chance), and this many times
# what those along time tell, is text laid down the batch; judged on at least this many pairs per axis
TEXT_INFORMATION = 0.1
TEXT_RATIO = 3.0
TEXT_PAIRS = 64


def causality(model: nn.Module, batch: Batch, loss_fn: LossFn) -> CausalityResult:
    """Read which token the loss asks each position to predict; change the later tokens
    and compare the earlier positions' eval-mode outputs."""
    inputs, targets = split_batch(batch)
    found = _token_inputs(inputs, targets)
    if isinstance(found, str):
        return (_density_model(model, inputs, targets) or _targets_in_inputs(model, inputs, targets)
                or _target_among_tokens(model, inputs, targets) or CausalityResult(status="skipped", message=found))
    target, candidates = found
    tokens = candidates[0]
    # what depends on which token does not depend on the dtype, and float32 resolves it: a
    # half-precision model (or autocast) is compared on a float32 copy
    with preserved_rng(), forwards_under_autocast(None):
        model_copy = set_mode(working_copy(model), False)
        _wake_zero_parameters(model_copy)
        if any(p.dtype in LOW_PRECISION for p in nn.Module.parameters(model_copy)):
            model_copy.float()
            inputs = map_tensors(inputs, lambda t: t.float() if t.dtype in LOW_PRECISION else t)
        read = _loss_targets(model_copy, inputs, targets, loss_fn, tokens, target)
        if isinstance(read, str):
            return CausalityResult(status="skipped", message=read)
        aimed, which_output, read_off_target = read
        if read_off_target:
            # the targets were read off the batch: the target tensor compared with itself says nothing
            candidates = [c for c in candidates if not (c.shape == target.shape and torch.equal(c, target))]
        scored = aimed >= 0
        n_scored = int(scored.sum())
        if n_scored == 0:
            return CausalityResult(status="skipped", message="the loss scores no position of the batch")
        with torch.no_grad(), ForwardObserver(model_copy) as seen:
            before_raw = _outputs(model_copy, inputs, which_output)
        tolerance = roundoff_tolerance(model_copy, [before_raw], seen.lowest_precision)
        reading, shift, unread = None, 0, False
        for candidate in candidates:
            found_reading = _reading(aimed, candidate)
            if found_reading is None:
                continue
            # what each position reads, not where it sits: a decoder handed its targets reads trg[t - 1]
            axes = (0, 1) if found_reading[1] == 0 else (found_reading[0],)
            shifts = {a: _input_shift(model_copy, inputs, candidate, a, which_output, before_raw, tolerance)
                      for a in axes}  # fmt: skip
            axis = max(shifts, key=lambda a: (shifts[a] if shifts[a] is not None else -1, a == found_reading[0]))
            is_target = any(candidate.shape == t.shape and torch.equal(candidate, t) for t in iter_tensors(targets))
            if shifts[axis] is None:
                # not read: the targets handed to a model that computes its own loss (expected), or tokens
                unread = unread or not is_target
                continue
            if is_target and _mixes_samples(model_copy, inputs, candidate, axis, which_output, before_raw, tolerance):
                continue  # samples that mix (a softmax over the batch) say nothing of what each position reads
            shift = shifts[axis]
            tokens = candidate
            reading = (axis if shift else found_reading[0], found_reading[1] + shift, found_reading[2])
            break
        copy = _best_share(aimed, tokens, -shift)[1] if shift else (
            float((aimed[scored] == tokens[scored]).float().mean()))
        time_axis = reading[0] if reading is not None and reading[1] == 1 else None
        next_share = reading[2] if time_axis is not None else _best_share(aimed, tokens, 1 - shift)[1]
        common = {"samples": int(tokens.shape[1 - time_axis]) if time_axis is not None else 0,
                  "positions": int(tokens.shape[time_axis]) if time_axis is not None else 0,
                  "time_axis": time_axis, "scored_positions": n_scored, "copy_fraction": copy,
                  "next_fraction": next_share, "input_shift": shift if reading is not None else None}  # fmt: skip
        if time_axis is not None:
            common.update(_scored_padding(aimed, time_axis))
        reads = _shift_in_words(shift)
        if reading is not None and reading[1] == 0:
            return CausalityResult(status="failed", unshifted=True, **common, message=(
                f"the loss asks {reading[2]:.0%} of the scored positions to predict the last input token they read"
                f"{reads} (the next token only {next_share:.0%}): the model is shown what it must predict — targets "
                "not shifted (use inputs[:, :-1] as inputs and inputs[:, 1:] as targets), or a masked language "
                "model's scored tokens not masked in its input"))  # fmt: skip
        if reading is not None and reading[1] != 1:
            (axis, offset, share) = reading
            common.update(time_axis=axis, samples=int(tokens.shape[1 - axis]), positions=int(tokens.shape[axis]))
            result = CausalityResult(status="failed", unshifted=False, target_offset=offset, **common)
            result.message = (
                f"the loss asks {share:.0%} of the scored positions to predict the input token "
                f"{result.offset_in_words} of the last one it reads{reads} (the next token only {next_share:.0%}): "
                "the targets are misaligned — shifted twice, say, by hand for a model "
                "that shifts its labels itself, or a decoder's output[:-1] paired with trg[1:]; next-token targets are "
                "inputs[:, 1:] for inputs[:, :-1]")  # fmt: skip
            return result
        if reading is None and unread:
            return CausalityResult(status="skipped", unshifted=False, **common, message=(
                "changing one token per sample moved no output: the outputs do not depend on the tokens the targets "
                "follow (a network whose prediction no longer depends on its input, or tokens the model does not "
                "read), so what each position sees cannot be told"))  # fmt: skip
        batch_next = _best_share(target.reshape(tokens.shape).to(tokens.device), tokens, 1)[1] \
            if target.numel() == tokens.numel() else 0.0  # fmt: skip
        # the loss pairs the outputs with the targets row by row; when the rows it pairs with one sample's
        # targets move with another sample's tokens, outputs and targets were flattened in different orders
        crossed = time_axis is not None and batch_next >= NEXT_TOKEN_SHARE and _mixes_samples(
            model_copy, inputs, tokens, time_axis, which_output, before_raw, tolerance)  # fmt: skip
        # or the loss pulls every output toward one of the batch's targets (the same tokens, as many of each),
        # none of them its own position's next token: d2l's (time, batch) outputs flattened against (batch, time)
        # targets. A loss whose gradient names no target (its sign flipped) pulls toward other tokens.
        paired_elsewhere = (time_axis is None and not read_off_target and batch_next >= NEXT_TOKEN_SHARE
                            and next_share < 1 - NEXT_TOKEN_SHARE + COPY_MARGIN
                            and _same_tokens(aimed[scored], target) >= NEXT_TOKEN_SHARE)  # fmt: skip
        if crossed or paired_elsewhere:
            return CausalityResult(status="failed", unshifted=False, batch_next_fraction=batch_next, **common, message=(
                f"the batch's targets are the next input tokens at {batch_next:.0%} of the positions, but the loss "
                + ("pairs one sample's targets with outputs that move with other samples' tokens" if crossed else
                   f"pulls the outputs toward the batch's targets, {next_share:.0%} of them their own next token")
                + ": outputs and targets are flattened in different orders (time-major outputs against batch-major "
                "targets: d2l's Y.T left out), so each output is scored against another position's token"))  # fmt: skip
        if time_axis is None:
            return CausalityResult(status="skipped", unshifted=False, **common, message=(
                f"the loss's targets are the next input token at only {next_share:.0%} of the scored positions (the "
                f"same token at {copy:.0%}): not next-token prediction (a tagger, a masked language model), where "
                "seeing later tokens is legitimate"))  # fmt: skip
        changed = _changed_future(tokens, time_axis)
        if changed is None:
            return CausalityResult(status="skipped", unshifted=False, **common,
                                   message="every input token is the same id: nothing to change")  # fmt: skip
        changed_inputs, cut = _with_tokens(inputs, tokens, changed), changed[1]
        with torch.no_grad():
            before = _per_position(before_raw, tokens.shape, time_axis)
            after = _per_position(_outputs(model_copy, changed_inputs, which_output), tokens.shape, time_axis)
    change = (after[:, : cut + 1] - before[:, : cut + 1]).abs().amax(dim=(0, 2))  # per earlier position
    moved = int((change > tolerance).sum())
    largest = float(change.max())
    common.update(unshifted=False, cut=cut, changed_positions=moved, max_change=largest, tolerance=tolerance)
    if moved and _causal_in_training(model_copy, inputs, changed_inputs, which_output, tokens.shape, time_axis, cut,
                                     tolerance):  # fmt: skip
        return CausalityResult(status="passed", future_visible=False, **common, message=(
            f"changing the tokens after position {cut} moved the eval-mode outputs at {moved} of the {cut + 1} "
            "earlier positions, but not the train-mode ones the loss trains on: the model masks the future only "
            "in training (d2l's decoder builds its causal mask when self.training, and predicts one token at a "
            "time)"))  # fmt: skip
    if moved:
        return CausalityResult(status="failed", future_visible=True, **common, message=(
            f"changing the tokens after position {cut} moved the eval-mode outputs at {moved} of the {cut + 1} "
            f"earlier positions (by up to {largest:.3g}, tolerance {tolerance:.3g}): each position sees tokens it "
            "must predict — a missing or wrong causal mask, a bidirectional recurrent layer, a convolution "
            "not padded on the left only"))  # fmt: skip
    information = _adjacent_information(tokens, time_axis)
    if information is not None:
        common.update(time_information=information[0], batch_information=information[1])
        if information[1] >= TEXT_INFORMATION and information[1] > TEXT_RATIO * max(information[0], 0.0):
            return CausalityResult(status="failed", future_visible=False, text_across_batch=True, **common, message=(
                f"adjacent tokens across the batch tell each other {information[1]:.2f} nats, along time "
                f"{information[0]:.2f}: the text runs down the batch, and each sequence holds tokens far apart in it "
                "(batchify as data.view(-1, batch_size) where data.view(batch_size, -1) was meant, or a transpose "
                "left out), so the model learns from no text"))  # fmt: skip
    return CausalityResult(status="passed", future_visible=False, **common, message=(
        f"targets are the next tokens at {next_share:.0%} of the scored positions{reads}, and changing the tokens "
        f"after position {cut} left the {cut + 1} earlier positions' outputs unchanged (within {tolerance:.3g})"))


def _causal_in_training(model: nn.Module, inputs: object, changed_inputs: object, which: _Which,
                        shape: torch.Size, time_axis: int, cut: int, tolerance: float) -> bool:  # fmt: skip
    """Whether the earlier positions stay put in train mode, where the loss trains (dropout drawn
    alike in both forwards; batch statistics left in eval mode, as they would mix the samples'
    later tokens into every position): a causal mask built only when ``self.training``."""
    set_mode(model, True)
    for module in model.modules():
        if getattr(module, "track_running_stats", False):
            module.train(False)
    try:
        with preserved_rng(), forwards_under_autocast(None), torch.no_grad():
            before = _per_position(_outputs(model, inputs, which), shape, time_axis)
            after = _per_position(_outputs(model, changed_inputs, which), shape, time_axis)
    except Exception:  # noqa: BLE001 - no train-mode reading: the eval-mode one stands
        return False
    finally:
        set_mode(model, False)
    return bool(((after[:, : cut + 1] - before[:, : cut + 1]).abs() <= tolerance).all())


def _adjacent_information(tokens: torch.Tensor, time_axis: int) -> tuple[float, float] | None:
    """(along time, across the batch): the mutual information of adjacent tokens' ids, in nats,
    less what the same first tokens show paired with the second token of another sample at the
    same position (a small sample's plug-in estimate is far above 0 for unrelated tokens, and
    sequences built on one template, a start token and a separator at fixed positions, tell each
    other their position across the batch: neither is text). Both from as many pairs. Text tells
    its next token; samples of a batch, drawn from places far apart, do not tell each other. None
    for too few pairs."""
    if tokens.dim() != 2 or min(tokens.shape) < 3:
        return None
    rows = tokens if time_axis == 1 else tokens.T  # (samples, time)
    pairs = [(rows[:, :-1], rows[:, 1:]), (rows[:-1], rows[1:])]  # along time, across the batch
    count = min(a.numel() for a, _ in pairs)
    if count < TEXT_PAIRS:
        return None
    generator = torch.Generator().manual_seed(SEED)
    found = []
    for first, second in pairs:
        keep = torch.randperm(first.numel(), generator=generator)[:count].to(first.device)
        others = [second[torch.randperm(second.shape[0], generator=generator).to(first.device)].reshape(-1)[keep]
                  for _ in range(4)]  # another sample's token at the same position  # fmt: skip
        first, second = first.reshape(-1)[keep], second.reshape(-1)[keep]
        found.append(_information(first, second) - sum(_information(first, o) for o in others) / len(others))
    return found[0], found[1]


def _information(first: torch.Tensor, second: torch.Tensor) -> float:
    """The plug-in mutual information of two aligned id sequences, in nats. Only the pairs seen are
    counted: a (vocabulary x vocabulary) table of a BPE model's 50k ids would not fit in memory."""
    ids, inverse = torch.unique(torch.cat([first, second]), return_inverse=True)
    k, n = ids.numel(), first.numel()
    a, b = inverse[:n], inverse[n:]
    pairs, counts = torch.unique(a * k + b, return_counts=True)
    p_first, p_second = (torch.bincount(x, minlength=k).double() / n for x in (a, b))
    joint = counts.double() / n
    return float((joint * (joint / (p_first[pairs // k] * p_second[pairs % k])).log()).sum())


def _wake_zero_parameters(model: nn.Module) -> None:
    """Give every parameter that is all zeros small random values, on the probe's copy. Which
    token an output reads is the architecture's, but a branch whose weights start at zero
    (RWKV's key, receptance and output; ReZero's gate; DiT's adaLN-Zero) reads nothing at
    initialisation: a token shift that looks ahead, behind a zero output projection, moves no
    output until training has moved the weights. Random values in those weights only wake
    what the architecture connects; they cannot open a path it does not have."""
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in nn.Module.parameters(model):
            if p.is_floating_point() and p.numel() and not bool(p.any()):
                scale = p.shape[1] ** -0.5 if p.dim() >= 2 else 0.1
                p.copy_(torch.randn(p.shape, generator=generator) * scale)


def _density_model(model: nn.Module, inputs: object, targets: object) -> CausalityResult | None:
    """An autoregressive density model over float inputs (PixelCNN over pixels, MADE over
    binary dimensions): the targets are the inputs themselves, position by position (or a
    coding that keeps their order: intensities quantised to classes), and each output must
    read only the positions before its own in some order. One sample's positions are
    changed one at a time (up to ``DENSITY_POSITIONS`` of them) in one eval-mode batch: a
    model that reads the others in one direction only (output i moves with input j, never j
    with i) is autoregressive, and one whose outputs then move with their own input sees what
    it must predict (a first layer masked as type B, a MADE output mask of <= where < is
    due). Outputs that read each other both ways (an autoencoder) or no other position at
    all are no such model: None, and the probe says why it skipped."""
    target = next((t for t in iter_tensors(targets) if t.dim() >= 2 and not t.is_complex()), None)
    if target is None:
        return None
    floats = [t for t in iter_tensors(inputs) if t.is_floating_point() and t.dim() >= 2]
    # a sequence's steps flattened into rows ((N * T, F) targets against (N, T, F) inputs, the outputs
    # viewed as (-1, hidden) before the head, as many RNN tutorials write it): read in the inputs' layout
    rows_of = next((t for t in floats if t.dim() >= 3 and tuple(t.shape[2:]) == tuple(target.shape[1:])
                    and target.shape[0] == t.shape[0] * t.shape[1] and not target.shape[0] == t.shape[0]), None)
    if rows_of is not None:
        target = target.reshape(rows_of.shape[:2] + target.shape[1:])
    steps_flat = rows_of.shape[1] if rows_of is not None else None

    def unflattened(out: torch.Tensor) -> torch.Tensor:
        if steps_flat is None or out.dim() < 1 or out.shape[0] % steps_flat:
            return out
        return out.reshape(out.shape[0] // steps_flat, steps_flat, *out.shape[1:])

    where = tuple(target.shape[1:])
    n, positions = target.shape[0], math.prod(where)

    def laid_out_like_targets(t: torch.Tensor) -> bool:  # (N, *where), or a few channels first: (N, C, *where)
        return tuple(t.shape[1:]) == where or (tuple(t.shape[2:]) == where and t.shape[1] <= 4)

    x = next((t for t in floats if t.shape[0] == n and laid_out_like_targets(t)), None)
    if x is None or positions < MIN_POSITIONS or not _codes_the_inputs(x.reshape(n, -1, positions).sum(1), target):
        return None
    order = _order(model, inputs, x, x[:1].reshape(1, -1, positions), lambda g: g.reshape(-1, *x.shape[1:]),
                   lambda out: _per_position_output(unflattened(out), where))  # fmt: skip
    steps, over_steps = where[0], len(where) >= 2 and tuple(x.shape[1:]) == where
    # a recurrent layer reads its current step by design (a sine fed to an RNN, one value per step): the
    # reading below, not a mask that lets a position see itself
    sequence = order is not None and over_steps and positions == steps and bool(recurrent_layers(model))
    if order is None and over_steps and steps >= MIN_POSITIONS:
        # a sequence of frames or vectors (a ConvLSTM's (N, T, C, H, W)): values within a step read each
        # other, so the order is read over the time axis, each step changed whole
        def per_step(out: torch.Tensor) -> torch.Tensor | None:
            out = unflattened(out)
            return out.reshape(out.shape[0], steps, -1).float() if out.shape[1:2] == (steps,) else None

        order = _order(model, inputs, x, x[:1].reshape(1, steps, -1).transpose(1, 2),
                       lambda g: g.transpose(1, 2).reshape(-1, *x.shape[1:]), per_step)  # fmt: skip
        positions, sequence = steps, True
    if sequence and order is not None and order[1]:
        # a sequence model reads its current step by design: its target is that step, not the next
        changed, own, *_, max_change, tolerance = order
        return CausalityResult(
            status="failed", unshifted=True, autoregressive=True, samples=1, positions=positions,
            scored_positions=changed, changed_positions=own, max_change=max_change, tolerance=tolerance,
            message=(f"a sequence model over its own inputs (each step's output reads that step and the ones "
                     f"before), whose targets are the steps it is given: at {own} of {changed} steps the output "
                     "moved with its own input, which is its target — targets not shifted (next-step targets "
                     "are inputs[:, 1:] for inputs[:, :-1])"))  # fmt: skip
    if order is None:
        return None
    changed, own, one_way, both_ways, max_change, tolerance = order
    common = {"samples": 1, "positions": positions, "scored_positions": changed, "changed_positions": own,
              "max_change": max_change, "tolerance": tolerance, "autoregressive": True}  # fmt: skip
    if own:
        return CausalityResult(status="failed", future_visible=True, **common, message=(
            f"an autoregressive model over its own inputs (changing one of {changed} positions moves only "
            f"outputs on one side of it: {one_way} reads one way, {both_ways} both ways), but {own} of those "
            "positions' own outputs moved with their own input: each output sees the value it must predict — a "
            "first masked convolution of type B where A is due, a MADE output mask of <= where < is, a mask "
            "applied after the layer that needed it"))  # fmt: skip
    return CausalityResult(status="passed", future_visible=False, **common, message=(
        f"an autoregressive model over its own inputs: changing one of {changed} positions moved outputs on "
        "one side of it only, and never its own output"))  # fmt: skip


def _order(model: nn.Module, inputs: object, x: torch.Tensor, grid: torch.Tensor,
           as_x: Callable[[torch.Tensor], torch.Tensor], per_position: Callable[[torch.Tensor], torch.Tensor | None],
           ) -> tuple[int, int, int, int, float, float] | None:  # fmt: skip
    """Which positions each output reads: ``grid`` is one sample of ``x`` as (1, values,
    positions), ``as_x`` lays rows of it out as ``x``; each of up to ``DENSITY_POSITIONS``
    positions is changed whole in its own row of one eval-mode batch. Returns (positions
    changed, outputs moved by their own input, one-way reads, both-way pairs, the largest
    change, the tolerance) when the outputs read the other positions one way only (an order
    exists), else None."""
    positions = grid.shape[2]
    changed = torch.linspace(0, positions - 1, min(positions, DENSITY_POSITIONS)).round().long().unique()
    rows = changed.numel() + 1
    sample = grid.repeat(rows, 1, 1)
    sample[torch.arange(1, rows), :, changed] += 1.0
    ran = _edited_sample(model, inputs, x, as_x(sample))
    laid_out = next((o for o in map(per_position, ran[0]) if o is not None), None) if ran else None
    if laid_out is None:
        return None
    tolerance = ran[1](laid_out)
    moved = (laid_out[1:] - laid_out[:1]).abs().amax(dim=2) > tolerance  # [changed position k, output i]
    reads = moved[:, changed]  # output changed[l] moved when changed[k] did
    others = reads & ~torch.eye(changed.numel(), dtype=torch.bool)
    one_way, both_ways = int(others.sum()), int((others & others.T).sum()) // 2
    own = int(reads.diagonal().sum())
    # an order reads, on average, at least one other position per position, and a mask lets (nearly) every
    # output see its own input or none: sparse reads and a few own ones are a discrete bottleneck's code
    # flips (a VQ-VAE's nearest codes), no order
    if one_way < changed.numel() or both_ways > MUTUAL_READS * one_way or 0 < own < OWN_READS * changed.numel():
        return None
    max_change = float((laid_out[1:] - laid_out[:1]).abs().max())
    return int(changed.numel()), own, one_way, both_ways, max_change, tolerance


def _target_among_tokens(model: nn.Module, inputs: object, targets: object) -> CausalityResult | None:
    """One class id per sample (a next-character model over a window of context: makemore's MLP)
    that is, in NEXT_TOKEN_SHARE of the samples or more, the input token at one position of the
    window: the window was slid before the target was taken, and the model is handed its answer.
    Only when the model reads that position (its eval-mode outputs move when that column's tokens
    are rolled between samples). None otherwise."""
    target = next((t for t in iter_tensors(targets) if t.dim() == 1 and not t.is_floating_point()
                   and not t.is_complex() and t.dtype != torch.bool), None)  # fmt: skip
    if target is None or target.numel() < 2 * MIN_POSITIONS or torch.unique(target).numel() < 2:
        return None
    for x in iter_tensors(inputs):
        if x.dim() != 2 or x.shape[0] != target.numel() or x.is_floating_point() or x.is_complex() \
                or x.dtype == torch.bool or x.shape[1] < 2:  # fmt: skip
            continue
        share = (x == target[:, None].to(x.device)).float().mean(dim=0)
        position = int(share.argmax())
        if float(share[position]) < NEXT_TOKEN_SHARE:
            continue
        rolled = x.clone()
        rolled[:, position] = x[:, position].roll(1)
        with preserved_rng(), torch.no_grad():
            model_copy = set_mode(working_copy(model), False)
            seed_all(SEED)
            before = next(iter_tensors(prediction(forward(model_copy, inputs))), None)
            seed_all(SEED)
            after = next(iter_tensors(prediction(forward(model_copy, map_tensors(inputs, lambda t: rolled if t is x
                                                                                  else t)))), None)  # fmt: skip
        if before is None or after is None or before.shape != after.shape:
            return None
        if float((after.float() - before.float()).abs().max()) <= roundoff_tolerance(model_copy, [before]):
            return None  # the model does not read that position: the copy is harmless
        n = target.numel()
        return CausalityResult(
            status="failed", unshifted=True, samples=n, positions=int(x.shape[1]), scored_positions=n,
            copy_fraction=float(share[position]), target_position=position, message=(
                f"one target per sample, and in {float(share[position]):.0%} of the {n} samples it is the input token "
                f"at position {position} of {x.shape[1]}, which the model reads: the context was advanced before the "
                "target was taken, and the model is handed its answer"))  # fmt: skip
    return None


def _targets_in_inputs(model: nn.Module, inputs: object, targets: object) -> CausalityResult | None:
    """Float targets found verbatim inside a longer input along its time axis (Informer's
    decoder input built from the whole ``batch_y``: the horizon it must forecast handed to
    it), with an output laid out like the targets. Changing the input value at a target's
    own position (the last one, and the middle one) must not move the prediction for it; a
    causal model handed the whole series reads only the values before. None when no target
    sits in an input."""
    found = None
    for target in (t for t in iter_tensors(targets) if t.is_floating_point() and t.dim() >= 2):
        n, length = target.shape[0], target.shape[1]
        for index, x in enumerate(iter_tensors(inputs)):
            if (not x.is_floating_point() or x.dim() != target.dim() or x.shape[0] != n or x.shape[1] <= length
                    or x.shape[2:] != target.shape[2:]):  # fmt: skip
                continue
            start = next((s for s in range(x.shape[1] - length + 1) if torch.equal(x[:, s : s + length], target)), None)
            if start is not None:
                found = (target, index, x, start)
                break
        if found is not None:
            break
    if found is None or found[0].shape[1] < MIN_POSITIONS or torch.unique(found[0]).numel() < 2:
        return None
    target, index, x, start = found
    length = target.shape[1]
    checked = sorted({length - 1, length // 2})
    sample = x[:1].repeat(len(checked) + 1, *[1] * (x.dim() - 1))
    for row, k in enumerate(checked, start=1):
        sample[row, start + k] += 1.0 + sample[row, start + k].abs()
    ran = _edited_sample(model, inputs, x, sample)
    outputs = [o for o in ran[0] if o.shape[1:] == target.shape[1:]] if ran else []
    if not outputs:
        return None
    out = outputs[0].float()
    tolerance = ran[1](out)
    change = [float((out[row, k] - out[0, k]).abs().max()) for row, k in enumerate(checked, start=1)]
    moved = sum(c > tolerance for c in change)
    common = {"samples": 1, "positions": length, "scored_positions": len(checked), "changed_positions": moved,
              "max_change": max(change), "tolerance": tolerance, "target_input": index,
              "target_start": start}  # fmt: skip
    where = f"input {index} holds the targets verbatim at positions {start}..{start + length - 1}"
    if moved:
        return CausalityResult(status="failed", future_visible=True, **common, message=(
            f"{where}, and changing the value at a target's own position moved the prediction for it ({moved} of "
            f"{len(checked)} positions, by up to {max(change):.3g}, tolerance {tolerance:.3g}): the model is handed "
            "what it must predict — a decoder input built from the whole target window instead of zeros (or the "
            "last known values) over the horizon"))  # fmt: skip
    return CausalityResult(status="passed", future_visible=False, **common, message=(
        f"{where}, but changing the value at a target's own position left the prediction for it in place: the "
        "model reads only the values before it"))  # fmt: skip


def _edited_sample(model: nn.Module, inputs: object, x: torch.Tensor, sample: torch.Tensor,
                   ) -> tuple[list[torch.Tensor], Callable[[torch.Tensor], float]] | None:  # fmt: skip
    """One eval-mode forward (on a copy, seeded) of ``sample`` — rows of one sample of ``x``,
    edited — in place of ``x``, the other inputs' first sample repeated beside it: the
    float outputs, and the rounding tolerance of an output. None when the model cannot take
    such a batch (a hidden state sized to the batch): these readings are then not made. A
    model handed one sample (one sequence, viewed as ``(-1, hidden)`` where only a batch of one
    is contiguous) runs the rows one by one when the batch fails."""

    def run(rows: torch.Tensor) -> list[torch.Tensor]:
        batch_inputs = map_tensors(inputs, lambda t: rows if t is x else (
            t[:1].repeat(len(rows), *[1] * (t.dim() - 1)) if t.dim() and t.shape[0] == x.shape[0] else t))
        seed_all(SEED)
        return _float_outputs(forward(model_copy, batch_inputs))

    with preserved_rng(), forwards_under_autocast(None), torch.no_grad():
        model_copy = set_mode(working_copy(model), False)
        with ForwardObserver(model_copy) as seen:
            try:
                outputs = run(sample)
            except Exception:  # noqa: BLE001 - a fallback reading: the probe says why it skipped instead
                if x.shape[0] != 1:
                    return None
                try:
                    outputs = [torch.cat(parts) for parts in zip(*(run(row[None]) for row in sample))]
                except Exception:  # noqa: BLE001 - as above
                    return None
    return [o.detach() for o in outputs], lambda out: roundoff_tolerance(model_copy, [out], seen.lowest_precision)


def _codes_the_inputs(values: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether the targets are the inputs, or a coding that keeps their order (quantised
    intensities): sorted by input value, the targets never fall, equal inputs have equal
    targets, and they take two values or more."""
    v, t = values.reshape(-1).double(), target.reshape(-1).double()
    if v.numel() != t.numel() or torch.unique(t).numel() < 2:
        return False
    order = torch.argsort(v * (1 + 4 * t.abs().max()) + t)  # by value, ties by target
    v, t = v[order], t[order]
    rising = bool((t[1:] >= t[:-1]).all())
    same_input = v[1:] == v[:-1]
    return rising and bool((t[1:][same_input] == t[:-1][same_input]).all())


def _per_position_output(out: torch.Tensor, where: tuple[int, ...]) -> torch.Tensor | None:
    """``out`` as (samples, positions, values per position): one value per position, or
    classes at dim 1 (a convolution's (N, C, H, W)) or last."""
    rows = out.shape[0]
    if tuple(out.shape[1:]) == where:
        return out.reshape(rows, -1, 1).float()
    if out.dim() == len(where) + 2 and tuple(out.shape[2:]) == where:
        return out.reshape(rows, out.shape[1], -1).transpose(1, 2).float()
    if out.dim() == len(where) + 2 and tuple(out.shape[1:-1]) == where:
        return out.reshape(rows, -1, out.shape[-1]).float()
    return None


def _token_inputs(inputs: object, targets: object) -> tuple[torch.Tensor, list[torch.Tensor]] | str:
    """A per-token target and the integer token tensors of the inputs it is laid out over,
    the likeliest first, or why none. Every target is tried in turn: a model trained on
    several objectives (BERT's next-sentence label per sample and masked-token labels per
    token) has its per-token targets anywhere among them."""
    targets = list(iter_tensors(targets)) if targets is not None else []
    found = [_tokens_for(inputs, t) for t in targets]
    if not found:
        return "no targets: nothing says what each position must predict"
    return next(((t, f) for t, f in zip(targets, found) if not isinstance(f, str)), found[0])


def _tokens_for(inputs: object, target: torch.Tensor) -> list[torch.Tensor] | str:
    if target.dim() not in (1, 2) or target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        return (f"targets of shape {list(target.shape)} and dtype {target.dtype}: the probe needs integer tokens "
                "per position (batch, time) of a next-token model")  # fmt: skip
    # flattened targets (targets.reshape(-1), as PyTorch's language-model examples pass them)
    # go with the 2-D token tensor they flatten
    fits = (lambda t: t.dim() == 2 and t.numel() == target.numel()) if target.dim() == 1 else (
        lambda t: t.shape == target.shape)
    tokens = [t for t in iter_tensors(inputs) if fits(t) and not t.is_floating_point()
              and not t.is_complex() and t.dtype != torch.bool]  # fmt: skip
    if not tokens and target.dim() == 1:
        return (f"targets of shape {list(target.shape)}, and no integer input with as many entries: one target per "
                "sample (a classifier over whole sequences), not one per position of the tokens")  # fmt: skip
    if not tokens:
        return (f"no integer input tensor of the targets' shape {list(target.shape)}: not a model fed the tokens "
                "it predicts")  # fmt: skip
    shape = tokens[0].shape
    if min(shape) < 1 or max(shape) < MIN_POSITIONS:
        return f"inputs of shape {list(shape)}: need {MIN_POSITIONS} positions"
    # the token ids first, not an attention mask of the same shape; the targets themselves last: a
    # model that computes its own loss is handed them and does not read them (model(idx, targets)),
    # a teacher-forced decoder reads trg[t - 1] for output t
    equal = [t for t in tokens if t.shape == target.shape and torch.equal(t, target)]
    others = [t for t in tokens if not any(t is e for e in equal)]
    return sorted(others, key=lambda t: -torch.unique(t).numel()) + equal


def _loss_targets(model: nn.Module, inputs: object, targets: object, loss_fn: LossFn, tokens: torch.Tensor,
                  target: torch.Tensor) -> tuple[torch.Tensor, _Which, bool] | str:  # fmt: skip
    """For each position of ``tokens``, the token the loss pushes that position's output
    towards (its most negative gradient), or -1 where the loss ignores the position; and
    which of the model's outputs (:func:`_float_outputs`) has an entry per position. An
    output of one value per position (a per-token loss the model computes itself, as
    Transformer-XL's; a score per position, as SASRec's) has no token to read: there the
    per-token ``target`` is what each position is asked for, where the loss reads it (and
    the last item says so)."""
    seed_all(SEED)
    with torch.enable_grad():
        output, outputs = _forward(model, inputs)
        if not outputs:
            return "the model returned no floating-point tensor, and called no loss of torch's on one"
        for out in outputs:
            if not out.requires_grad:
                out.requires_grad_()  # frozen or no-grad model: the gradient w.r.t. the outputs still says it
            out.retain_grad()
        compute_loss(loss_fn, output, targets).backward()
    reasons = []
    for index, out in enumerate(outputs):
        if out.grad is None or not bool(out.grad.any()):
            continue
        grad = _per_position(out.grad.detach().float(), tokens.shape, None)
        if isinstance(grad, str):
            reasons.append(grad)
            continue
        one_value = grad.shape[-1] == 1
        aimed = _aimed(grad, target, tokens, one_value)
        which = _Which(index)
        if out.dim() == 2 and not one_value and tokens.shape[0] != tokens.shape[1] and tokens.shape[0] > 1:
            # rows flattened from (time, batch) — d2l's RNN stacks its steps — read the same loss
            # the other way: the layout that makes the targets some offset of the tokens (the next
            # ones, or the tokens themselves when unshifted), when one does
            flipped = _Which(index, (int(tokens.shape[1]), int(tokens.shape[0])))
            other = _aimed(_per_position(flipped.batch_major(out.grad.detach().float()), tokens.shape, None), target,
                           tokens, one_value)  # fmt: skip
            if _matched_share(other, tokens) > _matched_share(aimed, tokens):
                aimed, which = other, flipped
        return aimed, which, one_value
    if reasons:
        return reasons[0]
    return "the loss does not depend on the model's outputs: no way to tell what each position predicts"


class _Which(NamedTuple):
    """Which of the model's outputs has an entry per position, and, for rows flattened from
    (time, batch) rather than (batch, time), those two lengths."""

    index: int
    rows_time_major: tuple[int, int] | None = None

    def batch_major(self, out: torch.Tensor) -> torch.Tensor:
        if self.rows_time_major is None:
            return out
        time, batch = self.rows_time_major
        return out.reshape(time, batch, -1).transpose(0, 1).reshape(time * batch, -1)


def _aimed(grad: torch.Tensor, target: torch.Tensor, tokens: torch.Tensor, one_value: bool) -> torch.Tensor:
    """Per position, the token its gradient pushes up (-1 where the loss ignores it)."""
    aimed = target.reshape(tokens.shape).to(grad.device) if one_value else grad.argmin(dim=-1)
    return torch.where(grad.abs().amax(dim=-1) > 0, aimed, torch.full_like(aimed, -1)).to(tokens.device)


def _forward(model: nn.Module, inputs: object) -> tuple[object, list[torch.Tensor]]:
    """The model's output and its floating-point outputs (:func:`_float_outputs`). A model
    that returns only the loss it computes itself (RWKV's ``L2Wrap.apply(loss, logits)``)
    has its outputs read where it hands them to a loss of torch's (``F.cross_entropy``)."""
    with InnerLossCalls() as inner:
        output = forward(model, inputs)
    outputs = _float_outputs(output)
    if not outputs and inner.last is not None:
        outputs = [t for t in iter_tensors(inner.last[1]) if t.is_floating_point() and t.dim() >= 2]
    return output, outputs


def _float_outputs(output: object) -> list[torch.Tensor]:
    """The model's floating-point outputs, what a loss reads first (:func:`prediction`)
    ahead of the rest (BERT's masked-token log-probs after its next-sentence ones)."""
    found: list[torch.Tensor] = []
    for t in (*iter_tensors(prediction(output)), *iter_tensors(output)):
        if t.is_floating_point() and t.dim() >= 2 and not any(t is f for f in found):
            found.append(t)
    return found


def _per_position(out: torch.Tensor, shape: torch.Size, time_axis: int | None):
    """``out`` as (A0, A1, values) in the tokens' layout — or, with a time axis, as
    (batch, time, values) — accepting (A0, A1, V), (A1, A0, V), (A0, V, A1) and the
    flattened (A0 * A1, V); a string when the output has no entry per position."""
    a0, a1 = shape
    if out.dim() == 2 and out.shape[0] == a0 * a1:
        aligned = out.reshape(a0, a1, -1)
    elif out.dim() == 3 and out.shape[:2] == (a0, a1):
        aligned = out
    elif out.dim() == 3 and out.shape[:2] == (a1, a0):
        aligned = out.transpose(0, 1)
    elif out.dim() == 3 and out.shape[0] == a0 and out.shape[2] == a1:
        aligned = out.movedim(2, 1)  # (batch, classes, time), the layout cross_entropy takes
    elif out.shape in ((a0, a1), (a1, a0)) or (out.dim() == 1 and out.numel() == a0 * a1):
        # one value per position (a per-token loss or score), in the tokens' layout first
        aligned = out.reshape(a0, a1, 1) if out.shape != (a1, a0) or a0 == a1 else out.transpose(0, 1)[..., None]
    else:
        message = f"the model's output {list(out.shape)} has no entry per input position {list(shape)}"
        if time_axis is None:
            return message
        raise ValueError(message)
    return aligned.transpose(0, 1) if time_axis == 0 else aligned


def _reading(aimed: torch.Tensor, tokens: torch.Tensor) -> tuple[int, int, float] | None:
    """(axis, offset, share): the one offset ``k`` such that the targets are ``tokens[t + k]``
    at ``NEXT_TOKEN_SHARE`` of the scored positions — 1 (next token) unless another offset
    (0: unshifted; ``MISPLACED_OFFSETS``) holds far more often than it (``COPY_MARGIN``); None when none
    holds (a tagger, a masked language model)."""
    axis, next_share = _best_share(aimed, tokens, 1)
    for offset in (0, *MISPLACED_OFFSETS):
        other_axis, share = _best_share(aimed, tokens, offset)
        beats_next = share - next_share >= COPY_MARGIN * (1 - next_share)
        if other_axis is not None and share >= NEXT_TOKEN_SHARE and beats_next:
            return other_axis, offset, share
    return (axis, 1, next_share) if axis is not None and next_share >= NEXT_TOKEN_SHARE else None


def _same_tokens(aimed: torch.Tensor, target: torch.Tensor) -> float:
    """The share of ``aimed`` that the batch's targets hold as many of (the overlap of the two
    histograms): 1 when the loss pulls the outputs toward the targets in another order."""
    wanted = target.reshape(-1)
    wanted, aimed = wanted[wanted >= 0].long().cpu(), aimed[aimed >= 0].long().cpu()
    if aimed.numel() == 0 or wanted.numel() == 0:
        return 0.0
    size = int(max(aimed.max(), wanted.max())) + 1
    return float(torch.minimum(torch.bincount(aimed, minlength=size), torch.bincount(wanted, minlength=size)).sum()
                 / aimed.numel())  # fmt: skip


def _matched_share(aimed: torch.Tensor, tokens: torch.Tensor) -> float:
    """The largest share of scored positions whose target is ``tokens[t + k]`` for one offset ``k``
    the probe reads (next, same, or misplaced)."""
    return max(_best_share(aimed, tokens, offset)[1] for offset in (1, 0, *MISPLACED_OFFSETS))


def _best_share(aimed: torch.Tensor, tokens: torch.Tensor, offset: int) -> tuple[int | None, float]:
    shares = _offset_shares(aimed, tokens, offset)
    best = max(shares, key=lambda a: shares[a], default=None)
    return best, shares.get(best, 0.0)


def _offset_shares(aimed: torch.Tensor, tokens: torch.Tensor, offset: int) -> dict[int, float]:
    """Per axis, the share of scored positions ``t`` whose target is ``tokens[t + offset]``."""
    shares = {}
    for axis in (1, 0):
        length = tokens.shape[axis]
        if length <= abs(offset):
            continue
        start = max(0, -offset)
        current = aimed.narrow(axis, start, length - abs(offset))
        ahead = tokens.narrow(axis, start + offset, length - abs(offset))
        scored = current >= 0
        if scored.any():
            shares[axis] = float((current[scored] == ahead[scored]).float().mean())
    return shares


def _mixes_samples(model: nn.Module, inputs: object, tokens: torch.Tensor, axis: int, which: _Which,
                   before_raw: torch.Tensor, tolerance: float) -> bool:  # fmt: skip
    """Whether changing the first sample's tokens moves another sample's outputs."""
    ids = torch.unique(tokens)
    if ids.numel() < 2 or tokens.shape[1 - axis] < 2:
        return False
    rows = (tokens if axis == 1 else tokens.T).clone()
    rows[0] = ids[(torch.searchsorted(ids, rows[0].contiguous()) + 1) % ids.numel()]
    with torch.no_grad():
        after = _outputs(model, _with_tokens(inputs, tokens, (rows if axis == 1 else rows.T, 0)), which)
        change = (_per_position(after, tokens.shape, axis) - _per_position(before_raw, tokens.shape, axis)).abs()
    return bool((change[1:] > tolerance).any())


def _shift_in_words(shift: int) -> str:
    if not shift:
        return ""
    return (f" (each position reads up to the token {shift} position{'s' if shift > 1 else ''} back: the model "
            "shifts its inputs itself, as a decoder handed its targets does)")


def _input_shift(model: nn.Module, inputs: object, tokens: torch.Tensor, axis: int, which: _Which,
                 before_raw: torch.Tensor, tolerance: float) -> int | None:  # fmt: skip
    """How many positions back the last token each output position reads sits: 0 for a
    language model (output t reads token t), 1 for a decoder handed its targets that reads
    ``trg[t - 1]`` to give output t, or a model that prepends a start token itself. Each
    sample gets one token changed, at a position that differs from sample to sample, in one
    forward; the fewest positions from a changed token to the first output that moved is the
    shift (a decoder that feeds back its own prediction at some steps reads the target at
    the others). 0 when an output before the change moved (the future test judges that);
    None when no output moved: the model does not read these tokens."""
    length, samples = tokens.shape[axis], tokens.shape[1 - axis]
    ids = torch.unique(tokens)
    if length < 3 or ids.numel() < 2:
        return 0
    rows = tokens if axis == 1 else tokens.T
    positions = 1 + torch.arange(samples, device=tokens.device) % (length - 2)
    at = torch.zeros_like(rows, dtype=torch.bool)
    at[torch.arange(samples, device=tokens.device), positions] = True
    other = ids[(torch.searchsorted(ids, rows.contiguous()) + 1) % ids.numel()]
    changed = torch.where(at, other, rows)
    with torch.no_grad():
        before = _per_position(before_raw, tokens.shape, axis)
        after = _outputs(model, _with_tokens(inputs, tokens, (changed if axis == 1 else changed.T, 0)), which)
        moved = (_per_position(after, tokens.shape, axis) - before).abs().amax(dim=-1) > tolerance
    reached = moved.any(dim=1)
    if not bool(reached.any()):
        return None
    first = moved.float().argmax(dim=1)
    return max(0, int((first - positions)[reached].min()))


def _scored_padding(aimed: torch.Tensor, time_axis: int) -> dict[str, object]:
    """Padding among the targets, and how much of it the loss scores. Padding is read off
    the targets where the loss scores them (``aimed``): an id that ends at least
    ``PADDED_ROWS`` of the sequences in runs of 2 or more, of more than one length (padding
    to the longest sequence; an end-of-sequence token is one, not a run). The first token of
    each run may be a real end of sequence (GPT-2 pads with its end token), so only the
    rest counts."""
    rows = aimed if time_axis == 1 else aimed.T
    found = trailing_runs(rows)
    if found is None:
        return {}
    pad, run = found
    is_pad = rows == pad
    padded = run >= 2
    if float(padded.float().mean()) < PADDED_ROWS or torch.unique(run).numel() < 2:
        return {}
    after_first = torch.arange(rows.shape[1], device=rows.device)[None, :] > (rows.shape[1] - run)[:, None]
    scored_padding = int((after_first & is_pad).sum())
    return {"padding_id": pad, "scored_padding_fraction": scored_padding / max(1, int((rows >= 0).sum()))}


def _changed_future(tokens: torch.Tensor, time_axis: int) -> tuple[torch.Tensor, int] | None:
    """The tokens with every position after ``cut`` (the middle) replaced by the next
    other id present in the batch (always a valid id, never the same one)."""
    ids = torch.unique(tokens)
    if ids.numel() < 2:
        return None
    length = tokens.shape[time_axis]
    cut = (length - 1) // 2
    other = ids[(torch.searchsorted(ids, tokens.contiguous()) + 1) % ids.numel()]
    later = (torch.arange(length, device=tokens.device) > cut).view((-1, 1) if time_axis == 0 else (1, -1))
    return torch.where(later, other, tokens), cut


def _with_tokens(inputs: object, tokens: torch.Tensor, changed: tuple[torch.Tensor, int]) -> object:
    return map_tensors(inputs, lambda t: changed[0] if t is tokens else t)


def _outputs(model: nn.Module, inputs: object, which: _Which) -> torch.Tensor:
    seed_all(SEED)  # the same random draws in both forwards: only the changed tokens differ
    outputs = _forward(model, inputs)[1]
    if len(outputs) <= which.index:
        raise ValueError("the model returned fewer floating-point tensors than in the first forward")
    return which.batch_major(outputs[which.index].detach().float())


SPEC = ProbeSpec(name="causality", title=CausalityResult.title, function=causality, result=CausalityResult,
                 order=36, needs_finite_parameters=True)  # fmt: skip

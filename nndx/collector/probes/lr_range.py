"""Learning-rate range test (Smith 2015; torch-lr-finder / fastai ``lr_find`` style).

How to use::

    result = lr_range_test(model, (x, y), loss_fn, optimizer=optimizer)
    result.suggested_lr, (result.interval_low_lr, result.interval_high_lr)
    to_csv(result, "lr.csv")     # nndx.lr_find draws it: .plot(ax), save_png (needs nndx[plot])

A copy of the model is trained while the learning rate grows exponentially from
``start_lr`` to ``end_lr``; the loss is smoothed with an exponential moving average
and the sweep stops when the smoothed loss exceeds ``diverge_factor`` × its best value
(or turns non-finite). The suggestion and its interval come from :func:`suggest_for`:
a quarter of the curve's knee (:func:`suggest`) for classification and unnamed losses,
the divergence point / 15 (SGD + momentum) or / 40 (Adam) for a mean-squared error, and
for other regression setups no point, only an interval and the reason (why those
readings, and how they were measured against training at a grid of lrs, is in their
docstrings and bench/lr_suggestion.py; the divisors assume the default
``diverge_factor``). ``valley_lr`` (fastai's ``valley``) and
``min_over_10_lr`` (the minimum's lr / 10) are kept as readings of the curve, not shown
as suggestions: on the bench they often land where training is slow.

The copy uses a copy of the user's optimizer when it holds the model's parameters (the
suggestion is specific to the optimizer), else nndx's own Adam; every param group gets
the same swept lr (per-group lr ratios are not kept). The user's model,
optimizer and RNG state are untouched. With a single batch the same batch is reused
each step; pass ``batches`` (e.g. a DataLoader, read pass after pass) to sweep over
real data.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from nndx import vocab
from nndx.collector._common import (
    Batch,
    LossFn,
    backward_and_step,
    compute_loss,
    copy_with_optimizer,
    forward,
    loss_name,
    loss_scaler,
    preserved_rng,
    split_batch,
    train_in_float32,
)
from nndx.collector.probes import ProbeSpec
from nndx.errors import UsageError
from nndx.report import LRRangeResult

# The moving average's warm-up: the curve's start level is the mean of these points.
SKIP_START = 5


def lr_range_test(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    steps: int = 100,
    smooth: float = 0.2,
    diverge_factor: float = 4.0,
    batches: Iterable[Batch] | None = None,
) -> LRRangeResult:
    """Sweep the learning rate on a copy and read suggestions off the loss curve.

    ``smooth`` is the weight of the newest loss in the moving average. A small weight
    (torch-lr-finder uses 0.05) suits noisy real batches but lags the curve by about
    (1 − smooth) / smooth steps, which shifts every suggestion to larger learning rates;
    one repeated batch is hardly noisy, so the default lags only ~4 steps.

    A model that raises on the batch it trained on at every lower lr (a flow's prior that
    rejects the NaNs its weights now give) has diverged there, and the sweep says so; on a
    loader's changing batches only when the weights are non-finite, else it raises."""
    if not 0 < start_lr < end_lr:
        raise ValueError(f"need 0 < start_lr < end_lr, got {start_lr} and {end_lr}")
    if steps < 2 or not 0 < smooth <= 1 or diverge_factor <= 1:
        raise ValueError("need steps >= 2, 0 < smooth <= 1 and diverge_factor > 1")
    source = itertools.repeat(batch) if batches is None else passes(batches)
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    diverged_at: float | None = None
    with preserved_rng():
        model_copy, opt, note = copy_with_optimizer(model, optimizer, lambda p: torch.optim.Adam(p, lr=start_lr))
        precision = train_in_float32(model_copy, opt)
        scaler = loss_scaler(next(nn.Module.parameters(model_copy), torch.empty(0)).device, precision)
        for i in range(steps):
            lr = start_lr * (end_lr / start_lr) ** (i / (steps - 1))
            for group in opt.param_groups:
                group["lr"] = lr
            inputs, targets = split_batch(next(source))

            def batch_loss() -> torch.Tensor:  # once here, again in an L-BFGS step's closure
                with precision:
                    return compute_loss(loss_fn, forward(model_copy, inputs), targets)

            opt.zero_grad(set_to_none=True)
            try:
                loss = batch_loss()
            except Exception as exc:
                # the batch that trained at every lower lr now fails: the weights the last step
                # left are to blame (a flow's prior rejects the NaNs they produce), not the setup
                if i == 0 or (batches is not None
                              and all(p.isfinite().all() for p in nn.Module.parameters(model_copy))):
                    raise
                lrs.append(lr)
                losses.append(math.nan)
                smoothed.append(math.nan)
                diverged_at = lr
                note += f"; at lr {lr:.3g} the model raised {type(exc).__name__}, read as the sweep's divergence"
                break
            value = float(loss.detach())
            lrs.append(lr)
            losses.append(value)
            smoothed.append(value if not smoothed else smooth * value + (1 - smooth) * smoothed[-1])
            if diverged(smoothed, diverge_factor):
                diverged_at = lr
                break
            backward_and_step(loss, opt, batch_loss, scaler)
    return analyse(lrs, losses, smoothed, diverged_at, note=f"swept with {note}", loss=loss_name(loss_fn),
                   optimizer=optimizer_family(opt))  # fmt: skip


SPEC = ProbeSpec(name="lr_range", title=LRRangeResult.title, function=lr_range_test, result=LRRangeResult,
                 order=60, needs_finite_parameters=True, trains=True)  # fmt: skip


def diverged(smoothed: list[float], factor: float) -> bool:
    """Whether the sweep's smoothed loss has left its best for good: non-finite, or above
    ``factor`` x its best. A loss that can be negative (a WGAN critic's, a Gaussian
    log-likelihood's) has no such ratio: there it is the rise above its best by ``factor - 1``
    times the larger of its best and its first value, in magnitude, so that a loss falling
    through zero is not read as diverging."""
    last, best = smoothed[-1], min(smoothed)
    if not math.isfinite(last):
        return True
    if best > 0:
        return last > factor * best
    return last - best > (factor - 1) * max(abs(best), abs(smoothed[0]), 1e-12)


def passes(batches: Iterable[Batch]) -> Iterator[Batch]:
    """Batches pass after pass, each pass a fresh ``iter(batches)``: a shuffling
    DataLoader reshuffles (``itertools.cycle`` would replay, and keep, the first pass)."""
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise UsageError("the loader (batches) yielded no batch")


def analyse(
    lrs: list[float],
    losses: list[float],
    smoothed: list[float],
    diverged_at: float | None = None,
    note: str = "",
    *,
    loss: str | None = None,
    optimizer: str | None = None,
) -> LRRangeResult:
    """The suggestion, its interval and the readings from a recorded sweep (also used for
    a sweep read from CSV). ``loss`` and ``optimizer`` name the loss (``MSELoss``) and the
    optimizer class (``SGD``) the sweep trained with: they choose the reading
    (:func:`suggest_for`); unknown (None), the knee rule of :func:`suggest` is used."""
    if not (len(lrs) == len(losses) == len(smoothed)):
        raise ValueError("lrs, losses and smoothed must have the same length")
    # the diverged point and anything non-finite tell nothing about where to train
    usable = [i for i, s in enumerate(smoothed) if math.isfinite(s)]
    if diverged_at is not None and usable and lrs[usable[-1]] == diverged_at:
        usable = usable[:-1]
    base = dict(lrs=lrs, losses=losses, smoothed=smoothed, diverged_at_lr=diverged_at)
    if len(usable) < 3:
        return LRRangeResult(status="failed", **base,
                             message=f"the loss diverged within {len(lrs)} steps: lower start_lr. {note}".strip())  # fmt: skip
    curve = [smoothed[i] for i in usable]
    curve_lrs = [lrs[i] for i in usable]
    best = min(range(len(curve)), key=curve.__getitem__)
    result = dict(base, min_loss=curve[best], min_over_10_lr=curve_lrs[best] / 10,
                  valley_lr=curve_lrs[_valley(curve)])  # fmt: skip
    if curve[best] < 0:
        # the knee is read against the loss's total drop to its floor; a loss that can go
        # negative (a WGAN critic's, a log-likelihood's) may have none, and keeps falling
        return LRRangeResult(status="passed", **result, message=(
            f"no suggested lr: the loss went below zero ({curve[best]:.3g}), so the sweep has no floor to read "
            f"a knee against. {note}").strip())  # fmt: skip
    found = suggest_for(curve_lrs, curve, diverged_at, loss=loss, optimizer=optimizer)
    if found is None:
        return LRRangeResult(status="failed", **result,
                             message=f"the loss never clearly decreased over the sweep. {note}".strip())  # fmt: skip
    if found.lr is None:  # a range that trains, but no point measured to reach the best grid lr's score
        return LRRangeResult(status="passed", interval_low_lr=found.low, interval_high_lr=found.high, **result,
                             message=f"no suggested lr: {found.why}; the lr trains from {found.low:.3g} to "
                                     f"{found.high:.3g}. {note}".strip())  # fmt: skip
    return LRRangeResult(status="passed", suggested_lr=found.lr, interval_low_lr=found.low,
                         interval_high_lr=found.high, **result,
                         message=f"suggested lr {found.lr:.3g} (trains well from {found.low:.3g} to "
                                 f"{found.high:.3g}; {found.why}). {note}".strip())  # fmt: skip


# The suggestion rules, chosen on bench/lr_suggestion.py (results in bench/README.md).
KNEE_FRACTION = 0.3  # the knee: where the loss is first within this share of its total drop from the minimum
SUGGESTION_DIVISOR = 4.0  # the suggestion: the knee's lr divided by this
INTERVAL_FACTOR = 2.0  # the interval: the suggestion divided and multiplied by this
MIN_RELATIVE_DROP = 0.05  # a smaller drop of the smoothed loss (relative to its start) is no evidence
# A mean-squared-error loss: the divergence point divided by this, per optimizer family
# measured (suggest_for says why; any other family gets an interval and no point)
SGD_MOMENTUM = "SGD with momentum"
DIVERGENCE_DIVISORS = {SGD_MOMENTUM: 15.0, "Adam": 40.0, "AdamW": 40.0}
EXPLOSIVE_LOSSES = frozenset({"MSELoss"})  # the regression losses whose divergence the divisors were measured on


def optimizer_family(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer as :func:`suggest_for` tells them apart: its class name, but SGD with
    a momentum near the 0.9 the bench measured (0.85–0.95) is ``"SGD with momentum"``, and
    another momentum is named with its value."""
    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.SGD):
        return name
    momentum = float(optimizer.param_groups[0].get("momentum", 0.0) or 0.0)
    if 0.85 <= momentum <= 0.95:
        return SGD_MOMENTUM
    return name if momentum == 0 else f"{name} with momentum {momentum:g}"


class Suggestion(NamedTuple):
    """What :func:`suggest_for` reads off a sweep: the lr to train with (None when no
    point is trusted), the interval that trains, and which reading it is, or why none."""

    lr: float | None
    low: float
    high: float
    why: str


def suggest_for(
    lrs: list[float],
    curve: list[float],
    diverged_at: float | None,
    *,
    loss: str | None = None,
    optimizer: str | None = None,
) -> Suggestion | None:
    """The suggestion for the sweep's loss and optimizer (:func:`optimizer_family`), from
    its smoothed loss (finite points, the diverged one left out); None when the curve
    shows no clear drop.

    Classification losses, and losses nndx cannot name: the knee rule (:func:`suggest`).

    Regression losses: the knee rule is 4–50× too low for an MLP regressor, whose loss
    keeps falling slowly for a decade of lr past the knee, so for a mean-squared error the
    point is read from where the sweep diverged instead. An MSE blows up soon after the lr
    passes the stability edge, so the divergence point marks that edge and the best
    constant lr sits a fixed factor below it: 1/15 with SGD + momentum 0.9, 1/40 with
    Adam, whose normalised steps let the loss climb more slowly past the edge, so the
    sweep stops further beyond it (bench/lr_suggestion.py: chosen on an MLP and an LSTM
    regressor, checked on unseen seeds and on an LSTM with Adam). Plain SGD is left out:
    on the bench its best lr sits right at the divergence edge, within a factor 2 that no
    reading hit reliably. With another regression loss (L1, Huber: bounded gradients, no
    explosion), another optimizer, or no divergence within the sweep, no point is given,
    only an interval: from the knee rule's suggestion (it trains, often slower than the
    best) to the divergence point / 15 (or the curve's minimum), and the reason."""
    knee = suggest(lrs, curve)
    if knee is None:
        return None
    kind = vocab.loss_kind(loss)
    if kind is None or kind.task != "regression":
        return Suggestion(*knee, why="a quarter of the knee of the loss curve")
    floor = knee[0]
    if loss in EXPLOSIVE_LOSSES and optimizer in DIVERGENCE_DIVISORS and diverged_at is not None:
        divisor = DIVERGENCE_DIVISORS[optimizer]
        lr = diverged_at / divisor
        return Suggestion(lr, lr / INTERVAL_FACTOR, lr * INTERVAL_FACTOR,
                          why=f"{loss} with {optimizer}: the divergence point {diverged_at:.3g} / {divisor:g}")  # fmt: skip
    if diverged_at is None:
        why = f"{loss} did not diverge within the sweep, and nndx reads a regression loss's point from where it does"
        high = lrs[min(range(len(curve)), key=curve.__getitem__)]
    else:
        if loss not in EXPLOSIVE_LOSSES:
            why = f"no point was measured to train well for {loss} (only for {', '.join(sorted(EXPLOSIVE_LOSSES))})"
        else:
            why = f"the point for {loss} was measured only with SGD + momentum 0.9 and Adam (AdamW), not {optimizer}"
        high = diverged_at / DIVERGENCE_DIVISORS[SGD_MOMENTUM]
    return Suggestion(None, floor, max(floor * INTERVAL_FACTOR, high), why=why)


def suggest(lrs: list[float], curve: list[float]) -> tuple[float, float, float] | None:
    """The knee rule: the learning rate to train with and an interval around it,
    ``(lr, low, high)``, read off a sweep's smoothed loss (finite points, the diverged one
    left out); None when the curve shows no clear drop. :func:`suggest_for` uses it for
    classification losses and losses it cannot name.

    Why this reading: training at a constant lr for hundreds of steps needs a margin
    below what a sweep, which spends a few steps at each lr, gets away with. The lr at
    which the loss first comes within 30% of its total drop from the minimum ("the
    knee") is where a larger lr stopped buying progress; a quarter of it is the
    suggestion, and the interval is half to twice that. bench/lr_suggestion.py trains at
    it and at a grid of lrs (results in bench/README.md): on classifiers (MLP, CNN, GRU;
    SGD, momentum, Adam) and an LSTM regressor it is within 1% of the best grid lr's
    score almost always and never far off, sweeping one batch or a DataLoader, where the
    steepest descent (the first, easy drop of a two-phase curve) and fastai's valley (the
    flat start of a single-batch curve) miss by far more, and the minimum / 10 moves with
    minibatch noise. It is too low for MLP regressors whose loss keeps falling slowly for
    a decade of lr past the knee: they train, slower than they could (hence the
    divergence rule of :func:`suggest_for` for regression losses)."""
    n = len(curve)
    if n < SKIP_START + 2:
        return None
    start = sum(curve[:SKIP_START]) / SKIP_START  # the moving average's warm-up, averaged
    best = min(range(n), key=curve.__getitem__)
    drop = start - curve[best]
    if best < SKIP_START or not drop > MIN_RELATIVE_DROP * abs(start):
        return None
    threshold = curve[best] + KNEE_FRACTION * drop
    knee = next(i for i in range(best + 1) if curve[i] <= threshold)
    lr = lrs[knee] / SUGGESTION_DIVISOR
    return lr, lr / INTERVAL_FACTOR, lr * INTERVAL_FACTOR


def _valley(values: list[float]) -> int:
    """fastai's ``valley``: find the longest decreasing subsequence and take the point
    half-way through its middle third (``start + len/3 + len/6``): inside the stretch
    where the loss falls, well before its bottom."""
    n = len(values)
    run = [1] * n
    max_start = max_end = 0
    for i in range(1, n):
        for j in range(i):
            if values[i] < values[j] and run[i] < run[j] + 1:
                run[i] = run[j] + 1
            if run[max_end] < run[i]:
                max_end = i
                max_start = max_end - run[max_end]
    sections = (max_end - max_start) / 3
    return min(max_start + int(sections) + int(sections / 2), n - 1)


# --------------------------------------------------------------------------- files

CSV_HEADER = ("lr", "loss", "smoothed")


def to_csv(result: LRRangeResult, path: str | Path) -> Path:
    """Write the sweep as ``lr,loss,smoothed`` rows (non-finite values as nan/inf)."""
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_HEADER)
        writer.writerows(zip(result.lrs, result.losses, result.smoothed))
    return path


def from_csv(path: str | Path, *, loss: str | None = None, optimizer: str | None = None) -> LRRangeResult:
    """Read a sweep written by :func:`to_csv` and recompute its suggestions; the file does
    not say which loss and optimizer swept it: name them (``loss="MSELoss"``,
    ``optimizer="SGD"``) for the reading :func:`suggest_for` makes for them, else the knee
    rule's."""
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
            raise ValueError(f"{path}: expected a header {','.join(CSV_HEADER)}, got {header}")
        rows = []
        for line_no, row in enumerate(reader, start=2):
            try:
                rows.append([float(v) for v in row])
            except ValueError as exc:
                raise ValueError(f"{path}:{line_no}: not a number: {row}") from exc
            if len(row) != 3:
                raise ValueError(f"{path}:{line_no}: expected 3 columns, got {len(row)}")
    if not rows:
        raise ValueError(f"{path}: no data rows")
    lrs, losses, smoothed = (list(col) for col in zip(*rows))
    # a sweep that stopped early ended on its diverged point
    last = smoothed[-1]
    diverged = lrs[-1] if not math.isfinite(last) or last > 4.0 * min(s for s in smoothed if math.isfinite(s)) else None
    return analyse(lrs, losses, smoothed, diverged, loss=loss, optimizer=optimizer)

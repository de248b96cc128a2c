"""Learning-rate range test (Smith 2015; torch-lr-finder / fastai ``lr_find`` style).

How to use::

    result = lr_range_test(model, (x, y), loss_fn, optimizer=optimizer)
    result.suggested_lr, result.valley_lr, result.min_over_10_lr
    to_csv(result, "lr.csv"); plot(result, "lr.png")      # plot needs nndx[plot]

A copy of the model is trained while the learning rate grows exponentially from
``start_lr`` to ``end_lr``; the loss is smoothed with an exponential moving average
and the sweep stops when the smoothed loss exceeds ``diverge_factor`` × its best value
(or turns non-finite). Three readings of the curve are reported side by side, because
none is right for every model:

- ``suggested_lr``: steepest descent of the smoothed curve (torch-lr-finder);
- ``valley_lr``: a point inside the longest descending stretch (fastai ``valley``);
- ``min_over_10_lr``: the lr of the minimum smoothed loss, divided by 10.

The copy uses a copy of the user's optimizer when it holds the model's parameters (the
suggestion is specific to the optimizer), else nndx's own Adam; every param group gets
the same swept lr (per-group lr ratios are not kept). The user's model,
optimizer and RNG state are untouched. With a single batch the same batch is reused
each step; pass ``batches`` (e.g. a DataLoader) to sweep over real data.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    copy_with_optimizer,
    forward,
    preserved_rng,
    split_batch,
    train_in_float32,
)
from nndx.collector.probes import ProbeSpec
from nndx.report import LRRangeResult

# Points skipped before looking for the steepest descent: the moving average's warm-up.
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
    one repeated batch is hardly noisy, so the default lags only ~4 steps."""
    if not 0 < start_lr < end_lr:
        raise ValueError(f"need 0 < start_lr < end_lr, got {start_lr} and {end_lr}")
    if steps < 2 or not 0 < smooth <= 1 or diverge_factor <= 1:
        raise ValueError("need steps >= 2, 0 < smooth <= 1 and diverge_factor > 1")
    source = itertools.cycle([batch]) if batches is None else itertools.cycle(batches)
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    diverged_at: float | None = None
    with preserved_rng():
        model_copy, opt, note = copy_with_optimizer(model, optimizer, lambda p: torch.optim.Adam(p, lr=start_lr))
        precision = train_in_float32(model_copy, opt)
        for i in range(steps):
            lr = start_lr * (end_lr / start_lr) ** (i / (steps - 1))
            for group in opt.param_groups:
                group["lr"] = lr
            inputs, targets = split_batch(next(source))
            opt.zero_grad(set_to_none=True)
            with precision:
                loss = compute_loss(loss_fn, forward(model_copy, inputs), targets)
            value = float(loss.detach())
            lrs.append(lr)
            losses.append(value)
            smoothed.append(value if not smoothed else smooth * value + (1 - smooth) * smoothed[-1])
            if not math.isfinite(smoothed[-1]) or smoothed[-1] > diverge_factor * min(smoothed):
                diverged_at = lr
                break
            loss.backward()
            opt.step()
    return analyse(lrs, losses, smoothed, diverged_at, note=f"swept with {note}")


SPEC = ProbeSpec(name="lr_range", title=LRRangeResult.title, function=lr_range_test, result=LRRangeResult,
                 order=60, needs_finite_parameters=True, trains=True)  # fmt: skip


def analyse(
    lrs: list[float], losses: list[float], smoothed: list[float], diverged_at: float | None = None, note: str = ""
) -> LRRangeResult:
    """The three suggestions from a recorded sweep (also used for a sweep read from CSV)."""
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
    # the descent that matters leads to the minimum: a recovery from a spike after it is noise
    window = range(SKIP_START, best + 1) if best >= SKIP_START + 2 else range(best + 1)
    slopes = _gradient(curve)
    steepest = min(window, key=slopes.__getitem__)
    result = dict(base, min_loss=curve[best], min_over_10_lr=curve_lrs[best] / 10,
                  valley_lr=curve_lrs[_valley(curve)])  # fmt: skip
    if slopes[steepest] >= 0 or curve[best] >= curve[0]:
        return LRRangeResult(status="failed", **result,
                             message=f"the loss never decreased over the sweep. {note}".strip())  # fmt: skip
    return LRRangeResult(status="passed", suggested_lr=curve_lrs[steepest], **result,
                         message=f"steepest descent at lr {curve_lrs[steepest]:.3g}. {note}".strip())  # fmt: skip


def _gradient(values: list[float]) -> list[float]:
    """Central differences (one-sided at the ends), per step: the lrs are log-spaced, so
    this is the slope against log(lr)."""
    n = len(values)
    if n == 1:
        return [0.0]
    return [
        (values[min(i + 1, n - 1)] - values[max(i - 1, 0)]) / (min(i + 1, n - 1) - max(i - 1, 0))
        for i in range(n)
    ]


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


def from_csv(path: str | Path) -> LRRangeResult:
    """Read a sweep written by :func:`to_csv` and recompute its suggestions."""
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
    return analyse(lrs, losses, smoothed, diverged)


def plot(result: LRRangeResult, path: str | Path) -> Path:
    """Draw loss and smoothed loss against lr (log scale) with the suggestions marked,
    as a PNG. Needs matplotlib: ``pip install 'nndx[plot]'``."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting the LR range test needs matplotlib: pip install 'nndx[plot]'") from exc
    if not result.lrs:
        raise ValueError("the LR range result has no points to plot")
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        ax.plot(result.lrs, result.losses, color="0.7", linewidth=1, label="loss")
        ax.plot(result.lrs, result.smoothed, color="C0", linewidth=2, label="smoothed loss")
        marks = [("suggested (steepest)", result.suggested_lr, "C3"), ("valley", result.valley_lr, "C2"),
                 ("min / 10", result.min_over_10_lr, "C1")]  # fmt: skip
        for label, lr, color in marks:
            if lr is not None:
                ax.axvline(lr, color=color, linestyle="--", linewidth=1, label=f"{label}: {lr:.2g}")
        ax.set_xscale("log")
        finite = [s for s in result.smoothed if math.isfinite(s)]
        if finite:  # keep the divergence spike from flattening the interesting part
            lo, hi = min(finite), max(finite)
            ax.set_ylim(lo - 0.05 * (hi - lo + 1e-12), hi + 0.05 * (hi - lo + 1e-12))
        ax.set_xlabel("learning rate")
        ax.set_ylabel("loss")
        ax.set_title("Learning-rate range test")
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
    return path

"""``nndx.lr_find``: the learning-rate range test in torch-lr-finder's shape, on a copy.

How to use::

    result = nndx.lr_find(model, optimizer, loss_fn, train_loader)   # device=, end_lr=10, steps=100
    result.suggestion        # the lr to train with (None when the sweep shows no clear drop, or for a
                             # regression setup no reading was measured for: result.record.message says)
    result.interval          # (low, high): the lrs around it that train well
    result.plot()            # a matplotlib Axes (drawn inline in a notebook); result.plot(ax=ax)
    result.to_csv("lr.csv")  # lr, loss, smoothed
    result.history           # {"lr": [...], "loss": [...]}, as torch-lr-finder names it

Like torch-lr-finder's ``LRFinder(model, optimizer, criterion).range_test(loader)`` but
with nothing to ``reset()``: the sweep trains a copy of the model and of the optimizer
(the one implementation in :mod:`nndx.collector.probes.lr_range`, which ``nndx.probe`` runs
too), so the user's model, optimizer and random state are left as they were. The
loader is read pass after pass, each pass a fresh ``iter(loader)``, so a shuffling
DataLoader reshuffles rather than replaying its first epoch; one batch ``(inputs,
targets)`` is also accepted, and repeated. ``result.record`` is the
:class:`~nndx.report.LRRangeResult` a report holds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    copy_pair,
    loader_generators,
    map_tensors,
    preserved_rng,
    torch_optimizer,
)
from nndx.collector.probes.lr_range import lr_range_test, passes, to_csv
from nndx.collector.progress import progress_bar
from nndx.errors import MissingExtraError, UsageError
from nndx.report import LRRangeResult


@dataclass(frozen=True)
class LRFinderResult:
    """What :func:`lr_find` found; ``record`` is the report's LRRangeResult."""

    record: LRRangeResult

    @property
    def suggestion(self) -> float | None:
        """The learning rate to train with (:func:`nndx.collector.probes.lr_range.suggest_for`);
        None when no point is trusted (``record.message`` says why; ``interval`` may still be set)."""
        return self.record.suggested_lr

    @property
    def interval(self) -> tuple[float, float] | None:
        """The lrs around the suggestion that train well, ``(low, high)``."""
        low, high = self.record.interval_low_lr, self.record.interval_high_lr
        return None if low is None or high is None else (low, high)

    @property
    def history(self) -> dict[str, list[float]]:
        """The sweep as torch-lr-finder's ``history``: ``{"lr": [...], "loss": [...]}``
        (the loss smoothed), plus the raw losses under ``"raw_loss"``."""
        return {"lr": list(self.record.lrs), "loss": list(self.record.smoothed), "raw_loss": list(self.record.losses)}

    def to_csv(self, path: str | Path) -> Path:
        """Write the sweep as ``lr,loss,smoothed`` rows (``nndx lr-plot`` reads it back)."""
        return to_csv(self.record, path)

    def plot(self, ax: Any = None) -> Any:
        """Draw the sweep on ``ax`` (a new figure's when None) and return the Axes: the
        raw and smoothed loss against the lr on a log axis, the interval shaded, the
        suggestion and the divergence point marked. Needs matplotlib (``nndx[plot]``)."""
        if ax is None:
            plt = _pyplot()
            _, ax = plt.subplots(figsize=(7, 4.5))
        return draw(self.record, ax)

    def __repr__(self) -> str:
        shown = f"{self.suggestion:.3g}" if self.suggestion is not None else None
        interval = f"({self.interval[0]:.3g}, {self.interval[1]:.3g})" if self.interval else None
        return f"LRFinderResult(status={self.record.status!r}, suggestion={shown}, interval={interval})"


def lr_find(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    loss_fn: LossFn,
    loader: Iterable[Batch] | Batch,
    *,
    device: torch.device | str | None = None,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    steps: int = 100,
    smooth: float = 0.2,
    diverge_factor: float = 4.0,
    progress: bool | None = None,
) -> LRFinderResult:
    """Sweep the lr from ``start_lr`` to ``end_lr`` over ``steps`` batches on a copy of
    ``model`` and ``optimizer`` (nndx's own Adam when ``optimizer`` is None) and return
    the suggestion, its interval and the curve.

    ``loader`` is a DataLoader (or any re-iterable of ``(inputs, targets)`` batches) or
    one batch. ``device`` moves the copy and every batch there (default: where the model
    is). ``progress`` shows a bar (default: when stderr is a terminal or in a notebook).
    ``smooth`` and ``diverge_factor`` are those of
    :func:`nndx.collector.probes.lr_range.lr_range_test`."""
    optimizer = torch_optimizer(optimizer)
    if not 0 < start_lr < end_lr:
        raise UsageError(f"need 0 < start_lr < end_lr, got {start_lr:g} and {end_lr:g}")
    if steps < 2 or not 0 < smooth <= 1 or diverge_factor <= 1:
        raise UsageError(f"need steps >= 2, 0 < smooth <= 1 and diverge_factor > 1; got {steps}, {smooth:g}, "
                         f"{diverge_factor:g}")  # fmt: skip
    if not _is_one_batch(loader) and isinstance(loader, Iterator):
        raise UsageError("lr_find needs a DataLoader or another re-iterable of batches (it reads several "
                         "passes), not a one-shot iterator; or pass one batch (inputs, targets)")  # fmt: skip
    # every pass over a shuffling DataLoader draws from the global RNG or the loader's own
    # generator: both are put back, so the user's next epoch has the order it would have had
    with preserved_rng(*([] if _is_one_batch(loader) else loader_generators(loader))):
        return _sweep(model, optimizer, loss_fn, loader, device, start_lr, end_lr, steps, smooth, diverge_factor,
                      progress)  # fmt: skip


def _sweep(model: nn.Module, optimizer: torch.optim.Optimizer | None, loss_fn: LossFn, loader: Any,
           device: torch.device | str | None, start_lr: float, end_lr: float, steps: int, smooth: float,
           diverge_factor: float, progress: bool | None) -> LRFinderResult:  # fmt: skip
    if _is_one_batch(loader):
        first, batches = loader, None
    else:
        batches = passes(loader)
        first = next(batches)
    sweep_model, sweep_optimizer = model, optimizer
    if device is not None:  # the sweep copies again, so the user's objects are never moved
        sweep_model, sweep_optimizer = copy_pair(model, optimizer, device)

        def to_device(batch: Batch) -> Batch:
            return map_tensors(batch, lambda t: t.to(device, non_blocking=True))

        first = to_device(first)
        batches = (to_device(b) for b in batches) if batches is not None else None
    if batches is not None:
        batches = itertools.chain([first], batches)
    bar = progress_bar(total=steps, desc="nndx lr_find", progress=progress, unit="step")
    counted = _count(batches if batches is not None else itertools.repeat(first), bar)
    try:
        record = lr_range_test(sweep_model, first, loss_fn, optimizer=sweep_optimizer, start_lr=start_lr,
                               end_lr=end_lr, steps=steps, smooth=smooth, diverge_factor=diverge_factor,
                               batches=counted)  # fmt: skip
    finally:
        bar.close()
    return LRFinderResult(record)


def draw(record: LRRangeResult, ax: Any) -> Any:
    """The LR sweep on a matplotlib Axes: what ``result.plot()`` and ``nndx lr-find --png``
    draw. Non-finite losses are left out of the lines, and the y range is the smoothed
    curve's before it diverged, so the divergence spike does not flatten the part that
    matters."""
    finite = [(lr, loss, smoothed) for lr, loss, smoothed in zip(record.lrs, record.losses, record.smoothed)
              if math.isfinite(loss) and math.isfinite(smoothed)]  # fmt: skip
    ax.set_title("Learning-rate range test")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("loss")
    if not finite:  # a model whose loss is NaN from the first step: the figure says so
        ax.text(0.5, 0.5, f"no finite loss in {len(record.lrs)} steps", transform=ax.transAxes, ha="center")
        return ax
    lrs, losses, smoothed = (list(column) for column in zip(*finite))
    ax.plot(lrs, losses, color="0.75", linewidth=1, label="loss")
    ax.plot(lrs, smoothed, color="C0", linewidth=2, label="smoothed loss")
    if record.interval_low_lr is not None and record.interval_high_lr is not None:
        ax.axvspan(record.interval_low_lr, record.interval_high_lr, color="C2", alpha=0.15,
                   label=f"trains well: {record.interval_low_lr:.2g} – {record.interval_high_lr:.2g}")  # fmt: skip
    if record.suggested_lr is not None:
        ax.axvline(record.suggested_lr, color="C3", linestyle="--", linewidth=1.5,
                   label=f"suggested lr: {record.suggested_lr:.2g}")  # fmt: skip
    if record.diverged_at_lr is not None:
        ax.axvline(record.diverged_at_lr, color="0.3", linestyle=":", linewidth=1,
                   label=f"diverged at: {record.diverged_at_lr:.2g}")  # fmt: skip
    ax.set_xscale("log")
    # the y range from the smoothed curve before it diverged: the spike would flatten the rest
    kept = smoothed[:-1] if record.diverged_at_lr is not None and len(smoothed) > 1 else smoothed
    low, high = min(kept), max(kept)
    pad = 0.05 * (high - low) or 0.05 * abs(high) or 0.05
    ax.set_ylim(low - pad, high + pad)
    ax.legend(loc="best", fontsize=8)
    return ax


def save_png(record: LRRangeResult, path: str | Path) -> Path:
    """Draw the sweep into a PNG file, with no global matplotlib state touched (no
    pyplot, no backend switch: a notebook's inline figures are unaffected)."""
    try:
        from matplotlib import figure as matplotlib_figure
    except ImportError as exc:
        raise MissingExtraError("plotting the LR sweep needs matplotlib: pip install 'nndx[plot]'") from exc
    figure = matplotlib_figure.Figure(figsize=(7, 4.5))
    draw(record, figure.subplots())
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, format="png", dpi=100)
    return path


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError("plotting the LR sweep needs matplotlib: pip install 'nndx[plot]'") from exc
    return plt


def _is_one_batch(loader: Any) -> bool:
    """(inputs, targets) with a tensor first, or a dict holding ``inputs``: one batch, not
    a sequence of batches."""
    if isinstance(loader, dict):
        return "inputs" in loader
    return isinstance(loader, (tuple, list)) and len(loader) == 2 and isinstance(loader[0], torch.Tensor)


def _count(batches: Iterable[Batch], bar: Any) -> Iterator[Batch]:
    """The sweep draws one batch per step: counting the draws moves the bar."""
    for batch in batches:
        bar.update()
        yield batch

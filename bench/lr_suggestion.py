"""Is the LR range test's suggestion one a user can train with? (not a test)

For each task × seed: train at every LR of a grid (4 per decade) for ``--steps``
minibatch steps to find the best result a constant LR reaches; run ``nndx.lr_find`` on the
single batch that ``nndx.probe`` sweeps by default and on a shuffling DataLoader; train at
its suggestion the same way, and report the score as a ratio to the best grid LR's. The
target is ratio >= 0.99; a reading that misses it is not shown as a suggestion (the
record keeps fastai's valley and the minimum / 10 as readings: their columns say why).
The interval's two ends are trained too (both within 5% of the best counts). Baseline:
torch-lr-finder's own suggestion (its ``range_test`` and steepest-gradient rule), when it
is installed. Two tasks were held out while the knee rule was chosen (HELD_OUT); the
regression rule (divergence point / divisor, for an MSE loss) was chosen on seeds 0–4 of
mlp_regression, mlp_regression_adam and lstm_sines, with three tasks held out
(HELD_OUT_REGRESSION) and seeds 5–9 unseen.

Scores: validation accuracy (classification) and validation R² = 1 − MSE / Var(y)
(regression), both "higher is better" with 0 for a run that diverged, so one ratio fits
every task. The same seed fixes the initialisation and the batch order of every run of a
task, so the grid and the suggestion differ only in the LR.

Then the sweep's cost: ``lr_range_test`` against torch-lr-finder's ``range_test`` on the
same CNN and batch, same number of steps, interleaved, median of per-round ratios.
torch-lr-finder is a bench-only package (``pip install torch-lr-finder``), never a
dependency of nndx; without it those columns are left out.

``--orders K`` averages every score over K batch orders (:func:`mean_score` says why).

Run: ``python bench/lr_suggestion.py [--seeds 5] [--steps 300] [--orders 1] [--save raw.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nndx.collector.lr_find import lr_find
from nndx.collector.probes.lr_range import lr_range_test
from nndx.collector.progress import progress_bar
from nndx.report import LRRangeResult

BATCH = 64
TARGET = 0.99


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # "classification" or "regression"
    optimizer: str  # "sgd", "momentum", "adam"
    grid: tuple[float, float]  # lowest and highest LR of the grid
    data: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    model: Callable[[], nn.Module]
    loss: str = ""  # "huber" trains a regressor with nn.HuberLoss; default: cross-entropy or MSE by kind

    def loss_fn(self) -> nn.Module:
        if self.loss == "huber":
            return nn.HuberLoss()
        return nn.CrossEntropyLoss() if self.kind == "classification" else nn.MSELoss()

    def make_optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr)
        return torch.optim.SGD(params, lr=lr, momentum=0.9 if self.optimizer == "momentum" else 0.0)


def _digits(seed: int):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    x_train, y_train, x_val, y_val = x[:1400], y[:1400], x[1400:], y[1400:]
    mean, std = x_train.mean(0), x_train.std(0) + 1e-3
    return (x_train - mean) / std, y_train, (x_val - mean) / std, y_val


def _friedman(seed: int):
    """Friedman #1: y = 10 sin(π x1 x2) + 20 (x3 − ½)² + 10 x4 + 5 x5 + noise, 10 inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(2000, 10, generator=g)
    y = 10 * torch.sin(math.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
    y = y + torch.randn(2000, generator=g)
    x = (x - 0.5) / math.sqrt(1 / 12)
    y = ((y - y[:1600].mean()) / y[:1600].std()).unsqueeze(1)
    return x[:1600], y[:1600], x[1600:], y[1600:]


def _sines(seed: int):
    """Noisy sine waves of random frequency and phase: predict the next value from 24."""
    g = torch.Generator().manual_seed(seed)
    n, length = 2000, 25
    freq = 0.1 + 0.4 * torch.rand(n, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    t = torch.arange(length).float()
    series = torch.sin(freq * t + phase) + 0.05 * torch.randn(n, length, generator=g)
    x, y = series[:, :-1].unsqueeze(-1), series[:, -1:]
    return x[:1600], y[:1600], x[1600:], y[1600:]


class RowGRU(nn.Module):
    """Digits read as a sequence of 8 rows of 8 pixels."""

    def __init__(self, inputs: int = 8, hidden: int = 32, outputs: int = 10, steps: int = 8) -> None:
        super().__init__()
        self.inputs, self.steps = inputs, steps
        self.gru = nn.GRU(inputs, hidden, batch_first=True)
        self.head = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.reshape(x.shape[0], self.steps, self.inputs))
        return self.head(out[:, -1])


class NextValueLSTM(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 16, 10),
    )  # fmt: skip


def _regression_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


HELD_OUT = ("cnn_digits_sgd", "mlp_regression_adam")
# added with the regression rule (divergence point / divisor) and not looked at while it was chosen
HELD_OUT_REGRESSION = ("mlp_regression_sgd", "lstm_sines_adam", "mlp_regression_huber")
TASKS = (
    Task("mlp_digits", "classification", "sgd", (1e-3, 10.0), _digits,
         lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))),
    Task("cnn_digits", "classification", "adam", (1e-5, 1.0), _digits, _cnn),
    Task("mlp_regression", "regression", "momentum", (1e-5, 1.0), _friedman, _regression_mlp),
    Task("gru_digits", "classification", "adam", (1e-5, 1.0), _digits, RowGRU),
    Task("lstm_sines", "regression", "momentum", (1e-4, 10.0), _sines, NextValueLSTM),
    # HELD_OUT: not looked at while the knee rule was chosen (mlp_regression_adam then helped choose the MSE rule)
    Task("cnn_digits_sgd", "classification", "momentum", (1e-4, 10.0), _digits, _cnn),
    Task("mlp_regression_adam", "regression", "adam", (1e-5, 1.0), _friedman, _regression_mlp),
    # HELD_OUT_REGRESSION: plain SGD, Adam on the LSTM, a Huber loss (nndx shows no point for the first and last)
    Task("mlp_regression_sgd", "regression", "sgd", (1e-4, 10.0), _friedman, _regression_mlp),
    Task("lstm_sines_adam", "regression", "adam", (1e-5, 1.0), _sines, NextValueLSTM),
    Task("mlp_regression_huber", "regression", "momentum", (1e-5, 1.0), _friedman, _regression_mlp, loss="huber"),
)  # fmt: skip


# --------------------------------------------------------------------------- training


def batches(x: torch.Tensor, y: torch.Tensor, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Minibatches forever, reshuffled every epoch, in an order fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(x) - BATCH + 1, BATCH):
            index = order[start:start + BATCH]
            yield x[index], y[index]


def score(task: Task, model: nn.Module, x_val: torch.Tensor, y_val: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        out = model(x_val)
    if not bool(torch.isfinite(out).all()):
        return 0.0
    if task.kind == "classification":
        return float((out.argmax(1) == y_val).float().mean())
    return max(0.0, 1.0 - float(((out - y_val) ** 2).mean() / y_val.var()))


def train(task: Task, init: nn.Module, data, lr: float, steps: int, seed: int) -> float:
    """Score after ``steps`` minibatch steps at a constant ``lr``; 0 once the loss is non-finite."""
    x_train, y_train, x_val, y_val = data
    model = copy.deepcopy(init)
    opt = task.make_optimizer(model.parameters(), lr)
    loss_fn = task.loss_fn()
    model.train()
    for step, (xb, yb) in enumerate(batches(x_train, y_train, seed)):
        if step == steps:
            break
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        if not math.isfinite(loss.item()):
            return 0.0
        loss.backward()
        opt.step()
    return score(task, model, x_val, y_val)


def mean_score(task: Task, init: nn.Module, data, lr: float, steps: int, seed: int, orders: int) -> float:
    """:func:`train`'s score averaged over ``orders`` batch orders (the first is ``seed``'s own).

    Why: near the best lr a run's score depends on its batch order by about as much as on
    the lr (one order's grid jitters by 1–2% between neighbouring lrs), so the best of one
    order's grid is partly a lucky draw that no reading taken before training can aim at.
    A user's run gets one random order; the mean over several is what an lr is worth to it."""
    return statistics.fmean(train(task, init, data, lr, steps, seed + 10_000 * k) for k in range(orders))


def grid(task: Task, per_decade: int = 4) -> list[float]:
    lo, hi = (math.log10(v) for v in task.grid)
    n = round((hi - lo) * per_decade)
    return [10 ** (lo + i / per_decade) for i in range(n + 1)]


def loader(x: torch.Tensor, y: torch.Tensor, seed: int) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed))  # fmt: skip


def sweep(task: Task, init: nn.Module, data, seed: int, mode: str) -> LRRangeResult:
    """``nndx.lr_find`` as a user runs it: on the first batch (what ``nndx.probe`` sweeps
    by default) or over a shuffling DataLoader, with the task's optimizer."""
    x_train, y_train = data[0], data[1]
    model = copy.deepcopy(init)
    optimizer = task.make_optimizer(model.parameters(), 1e-3)
    source = (x_train[:BATCH], y_train[:BATCH]) if mode == "batch" else loader(x_train, y_train, seed + 1000)
    return lr_find(model, optimizer, task.loss_fn(), source, progress=False).record


def finder_suggestion(task: Task, init: nn.Module, data, seed: int, mode: str) -> float | None:
    """torch-lr-finder's own suggestion: ``range_test`` (its defaults: smoothing 0.05,
    stop at 5× the best loss) from 1e-7 to 10 in 100 steps, then the steepest gradient of
    its loss history with 10 points skipped at the start and 5 at the end, as its
    ``plot(suggest_lr=True)`` computes it."""
    import numpy as np
    from torch_lr_finder import LRFinder, lr_finder

    lr_finder.tqdm = lambda iterable, **_: iterable  # its bar would flood this bench's table
    x_train, y_train = data[0], data[1]
    model = copy.deepcopy(init)
    optimizer = task.make_optimizer(model.parameters(), 1e-7)
    source = loader(x_train[:BATCH], y_train[:BATCH], 0) if mode == "batch" else loader(x_train, y_train, seed + 1000)
    finder = LRFinder(model, optimizer, task.loss_fn())
    with contextlib.redirect_stdout(io.StringIO()):  # "Learning rate search finished"
        finder.range_test(source, start_lr=1e-7, end_lr=10, num_iter=100)
    lrs, losses = finder.history["lr"][10:-5], finder.history["loss"][10:-5]
    if len(losses) < 2:
        return None
    return float(lrs[int(np.gradient(np.array(losses)).argmin())])


READINGS = ("suggested_lr", "interval_low_lr", "interval_high_lr", "valley_lr", "min_over_10_lr")


def run_task(task: Task, seed: int, steps: int, baseline: bool, orders: int = 1) -> dict:
    data = task.data(seed)
    torch.manual_seed(seed)
    init = task.model()
    grid_scores = {lr: mean_score(task, init, data, lr, steps, seed, orders) for lr in grid(task)}
    best_lr = max(grid_scores, key=grid_scores.__getitem__)
    row = {"task": task.name, "seed": seed, "grid": grid_scores, "best_lr": best_lr, "best": grid_scores[best_lr]}
    for mode in ("batch", "loader"):
        result = sweep(task, init, data, seed, mode)
        read = {name: getattr(result, name) for name in READINGS}
        if baseline:
            read["torch_lr_finder"] = finder_suggestion(task, init, data, seed, mode)
        trained = {name: (mean_score(task, init, data, lr, steps, seed, orders) if lr else None)
                   for name, lr in read.items()}
        row[mode] = {"readings": read, "scores": trained, "lrs": result.lrs, "losses": result.losses,
                     "smoothed": result.smoothed, "diverged_at_lr": result.diverged_at_lr, "status": result.status}  # fmt: skip
    return row


# --------------------------------------------------------------------------- sweep speed


def sweep_speed(rounds: int, steps: int = 100) -> dict[str, float]:
    """Median seconds of the probe's sweep (``lr_range_test``), of ``lr_find`` and of
    torch-lr-finder's ``range_test`` (+ ``reset``), on the same CNN and batch, same steps,
    exponential schedule ending before any early stop; interleaved, so each round's
    ratios compare runs made under the same load."""
    from torch_lr_finder import LRFinder, lr_finder

    lr_finder.tqdm = lambda iterable, **_: iterable
    data = _digits(0)
    xb, yb = data[0][:BATCH], data[1][:BATCH]
    one_batch = DataLoader(TensorDataset(xb, yb), batch_size=BATCH)
    torch.manual_seed(0)
    model = _cnn()
    times: dict[str, list[float]] = {"lr_range_test": [], "lr_find": [], "torch-lr-finder": []}
    for _ in range(rounds):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-7)
        start = time.perf_counter()
        lr_range_test(model, (xb, yb), nn.CrossEntropyLoss(), optimizer=optimizer, end_lr=1e-3, steps=steps)
        times["lr_range_test"].append(time.perf_counter() - start)
        start = time.perf_counter()
        lr_find(model, optimizer, nn.CrossEntropyLoss(), (xb, yb), end_lr=1e-3, steps=steps, progress=False)
        times["lr_find"].append(time.perf_counter() - start)
        start = time.perf_counter()
        finder = LRFinder(model, optimizer, nn.CrossEntropyLoss())
        with contextlib.redirect_stdout(io.StringIO()):
            finder.range_test(one_batch, start_lr=1e-7, end_lr=1e-3, num_iter=steps)
        finder.reset()
        times["torch-lr-finder"].append(time.perf_counter() - start)
    result = {name: statistics.median(values) for name, values in times.items()}
    for name in ("lr_range_test", "lr_find"):
        result[f"{name} ÷ torch-lr-finder"] = statistics.median(
            a / b for a, b in zip(times[name], times["torch-lr-finder"]))  # fmt: skip
    return result


# --------------------------------------------------------------------------- report


def summary(rows: list[dict]) -> list[dict]:
    """Per task and sweep: how many seeds reached TARGET of the best grid score at the
    suggestion (and the worst ratio); how many had both interval ends within 5% of it;
    the same count for the readings nndx does not show as suggestions."""
    table = []
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        for mode in ("batch", "loader"):
            def ratios(name: str) -> list[float]:
                return [(r[mode]["scores"].get(name) or 0.0) / r["best"] for r in mine]

            def cell(name: str) -> str:
                shown = [r for r in mine if r[mode]["readings"].get(name) is not None]
                if not shown:  # nndx gave an interval and no point (suggest_for says why)
                    return f"no point ({len(mine)}/{len(mine)})"
                values = ratios(name)
                missing = f", {len(mine) - len(shown)} no point" if len(shown) < len(mine) else ""
                return f"{sum(v >= TARGET for v in values)}/{len(values)} (min {min(values):.2f}{missing})"

            ends = [min(a, b) for a, b in zip(ratios("interval_low_lr"), ratios("interval_high_lr"))]
            line = {"task": task, "sweep on": "one batch" if mode == "batch" else "DataLoader",
                    "nndx suggestion": cell("suggested_lr"),
                    "interval ends >= 0.95": f"{sum(v >= 0.95 for v in ends)}/{len(ends)}"}  # fmt: skip
            if "torch_lr_finder" in mine[0][mode]["scores"]:
                line["torch-lr-finder"] = cell("torch_lr_finder")
            line["valley (not shown)"] = cell("valley_lr")
            line["min/10 (not shown)"] = cell("min_over_10_lr")
            table.append(line)
    return table


def print_table(rows: list[dict]) -> None:
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths)))


def _has_torch_lr_finder() -> bool:
    try:
        import torch_lr_finder  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300, help="training steps per grid point and per suggestion")
    parser.add_argument("--tasks", nargs="+", choices=[t.name for t in TASKS], help="default: all")
    parser.add_argument("--speed-rounds", type=int, default=5, help="0 skips the sweep-speed comparison")
    parser.add_argument("--orders", type=int, default=1,
                        help="batch orders each score is averaged over (mean_score says why)")
    parser.add_argument("--save", help="write every grid score, sweep and reading to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)  # this machine is shared: one intra-op thread keeps runs comparable

    tasks = [t for t in TASKS if args.tasks is None or t.name in args.tasks]
    runs = [(t, seed) for t in tasks for seed in range(args.first_seed, args.first_seed + args.seeds)]
    baseline = _has_torch_lr_finder()
    rows = []
    bar = progress_bar(runs, desc="bench lr_suggestion", unit="run")
    for task, seed in bar:
        bar.set_postfix_str(f"{task.name} seed {seed}")
        rows.append(run_task(task, seed, args.steps, baseline, args.orders))
    if not baseline:
        print("torch-lr-finder is not installed (pip install torch-lr-finder): its column is left out")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(rows, f)
    print(f"\nseeds whose score at each lr reached {TARGET} of the best grid lr's ({args.steps} steps, "
          f"mean of {args.orders} batch order(s), grid 4 per "
          f"decade; {', '.join(HELD_OUT)} held out while the knee rule was chosen, "
          f"{', '.join(HELD_OUT_REGRESSION)} while the regression rule was)\n")  # fmt: skip
    print_table(summary(rows))
    if args.speed_rounds and baseline:
        speed = sweep_speed(args.speed_rounds)
        print(f"\nsweep of 100 steps on the CNN, one batch of {BATCH}, median of {args.speed_rounds} interleaved rounds:")
        print_table([{"measure": name, "value": f"{value:.2f}" + ("" if "÷" in name else " s")}
                     for name, value in speed.items()])  # fmt: skip


if __name__ == "__main__":
    main()

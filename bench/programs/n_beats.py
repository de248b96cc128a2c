"""Port of ElementAI/N-BEATS: the generic N-BEATS model trained by its ``trainer`` on sampled windows.

Source: github.com/ElementAI/N-BEATS, ``experiments/trainer.py``, ``models/nbeats.py``,
``experiments/model.py``, ``common/sampler.py``, ``common/torch/losses.py`` and
``common/torch/ops.py`` at commit 04f56c4ca4c144071b94089f7195b1dd606072b0 (CC BY-NC 4.0,
Copyright (c) 2020 Element AI Inc.). Written anew from the facts of those files; no code
copied.

Kept: ``NBeatsBlock`` (a stack of ``Linear`` + ReLU layers, a ``Linear`` to the basis
parameters, the basis function), ``GenericBasis`` (theta's first ``backcast_size`` values are
the backcast, its last ``forecast_size`` the forecast), ``NBeats.forward(x, input_mask)``
(the input and its mask flipped in time, the forecast started at the last observed value
``x[:, -1:]``, each block's backcast subtracted from the residuals, which are re-masked, and
its forecast added), ``generic`` (``stacks`` blocks of theta size ``input_size +
output_size``); ``TimeseriesSampler`` (for each of ``batch_size`` windows a random series and
a random cut point in its last ``window_sampling_limit`` points, the insample window before
the cut and the outsample window after it, both zero-padded with 0/1 masks where the series
is too short); ``mape_loss`` (``divide_no_nan(mask, target)`` weights, mean absolute weighted
error), ``divide_no_nan``; ``trainer``: ``Adam(lr=0.001)``, per iteration ``model.train()``,
the next sampled batch, ``zero_grad``, forward, the loss by name, ``break`` when the loss is
NaN, ``backward``, ``clip_grad_norm_(..., 1.0)``, ``step``, then every param group's lr set
to ``learning_rate * 0.5 ** (i // lr_decay_step)`` with ``lr_decay_step = iterations // 3``;
the experiment's ``input_size = lookback * horizon`` and ``window_sampling_limit =
history_size * horizon``; the test forecast from ``last_insample_window`` of each training
series, scored against the held-out last ``horizon`` points.
Shrunk: 120 synthetic monthly-like series (length 48-96, a positive level, a linear trend,
a period-12 seasonality and noise) instead of M4; horizon 6, lookback 3, history_size 10;
``stacks`` 6 instead of 30, ``layer_size`` 64 instead of 512 (``layers`` 4 kept);
``batch_size`` 128 instead of 1024, 300 iterations instead of 15,000; one model (loss
MAPE) instead of the 180-model ensemble over losses, lookbacks and repeats; no snapshots.
Measure only (not in the program): the test sMAPE (M4's definition, percent) and MSE of
the forecasts.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first sampled batch,
inputs ``(x, x_mask)`` and target ``y``, with the training loss as a function of the
forecast and the target (the outsample mask is where the target is nonzero: every series
is positive, so only the padding is 0); ``nndx.Monitor(model, optimizer)`` around the
iterations, the training loss logged where the trainer registers it (after the step);
after training ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch as t
from torch import optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "n_beats"
SOURCE = Source("ElementAI/N-BEATS", "experiments/trainer.py", "04f56c4ca4c144071b94089f7195b1dd606072b0",
                "CC-BY-NC-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (generic model, MAPE loss; shrunk: 6 stacks of width 64)"),
        Variant(
            "mape_without_divide_no_nan",
            "mape_loss weights computed as mask / target instead of divide_no_nan(mask, target): the sampler's "
            "zero-padded outsample points give 0/0 = NaN, the trainer's `if isnan: break` ends training at the "
            "first batch and the untrained model is used for the forecast",
            (C.DIVISION_BY_ZERO, C.NAN_IN_DATA),
            ("https://github.com/Nixtla/neuralforecast/issues/72",
             "https://github.com/unit8co/darts/issues/2517",
             "https://github.com/unit8co/darts/pull/845",
             "https://github.com/VincLee8188/GMAN-PyTorch/issues/7"),
            Measure("test_smape", "test sMAPE at least 1.5x the healthy run's: 14.2 (0 iterations run) against 2.41 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "lr_decay_every_iteration",
            "the step decay written learning_rate * 0.5 ** i, without the // lr_decay_step: the lr halves at every "
            "iteration instead of every iterations // 3, so it is ~0 after a few dozen steps",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/pytorch/pytorch/issues/3814",
             "https://github.com/pytorch/vision/issues/1261",
             "https://github.com/Lornatang/SRGAN-PyTorch/issues/1"),
            Measure("test_smape", "test sMAPE at least 1.5x the healthy run's: 12.8 (lr 1e-93 at the end) against 2.41 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

HORIZON, LOOKBACK, HISTORY_SIZE = 6, 3, 10
STACKS, LAYERS, LAYER_SIZE = 6, 4, 64
BATCH_SIZE, ITERATIONS, LEARNING_RATE = 128, 300, 0.001
N_SERIES = 120


# --------------------------------------------------------------------------- the data (M4 stand-in)


def make_series(seed: int) -> list[np.ndarray]:
    """Positive seasonal + trend series of varying length (the full series, test points included)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N_SERIES):
        n = int(rng.integers(48, 97))
        time = np.arange(n)
        level, slope = rng.uniform(50, 150), rng.uniform(-0.3, 0.6)
        amp, phase = rng.uniform(5, 25), rng.uniform(0, 2 * np.pi)
        series = level + slope * time + amp * np.sin(2 * np.pi * time / 12 + phase) + rng.normal(0, 2.0, n)
        out.append(np.maximum(series, 1.0))
    return out


# --------------------------------------------------------------------------- common/


def divide_no_nan(a: t.Tensor, b: t.Tensor) -> t.Tensor:
    """a / b with the NaN and inf results set to 0."""
    result = a / b
    result[result != result] = 0.0
    result[result == np.inf] = 0.0
    return result


def mape_loss(forecast: t.Tensor, target: t.Tensor, mask: t.Tensor, no_nan: bool = True) -> t.Tensor:
    weights = divide_no_nan(mask, target) if no_nan else mask / target
    return t.mean(t.abs((forecast - target) * weights))


class TimeseriesSampler:
    def __init__(self, timeseries: list[np.ndarray], insample_size: int, outsample_size: int,
                 window_sampling_limit: int, batch_size: int = 1024) -> None:  # fmt: skip
        self.timeseries = list(timeseries)
        self.window_sampling_limit, self.batch_size = window_sampling_limit, batch_size
        self.insample_size, self.outsample_size = insample_size, outsample_size

    def __iter__(self):
        while True:
            insample = np.zeros((self.batch_size, self.insample_size))
            insample_mask = np.zeros((self.batch_size, self.insample_size))
            outsample = np.zeros((self.batch_size, self.outsample_size))
            outsample_mask = np.zeros((self.batch_size, self.outsample_size))
            sampled = np.random.randint(len(self.timeseries), size=self.batch_size)
            for i, index in enumerate(sampled):
                ts = self.timeseries[index]
                cut = np.random.randint(low=max(1, len(ts) - self.window_sampling_limit), high=len(ts), size=1)[0]
                window = ts[max(0, cut - self.insample_size) : cut]
                insample[i, -len(window):] = window
                insample_mask[i, -len(window):] = 1.0
                out = ts[cut : min(len(ts), cut + self.outsample_size)]
                outsample[i, : len(out)] = out
                outsample_mask[i, : len(out)] = 1.0
            yield insample, insample_mask, outsample, outsample_mask

    def last_insample_window(self) -> tuple[np.ndarray, np.ndarray]:
        insample = np.zeros((len(self.timeseries), self.insample_size))
        insample_mask = np.zeros((len(self.timeseries), self.insample_size))
        for i, ts in enumerate(self.timeseries):
            last = ts[-self.insample_size :]
            insample[i, -len(last):] = last
            insample_mask[i, -len(last):] = 1.0
        return insample, insample_mask


def to_tensor(array: np.ndarray) -> t.Tensor:
    return t.tensor(array, dtype=t.float32)


# --------------------------------------------------------------------------- models/


class NBeatsBlock(t.nn.Module):
    def __init__(self, input_size: int, theta_size: int, basis_function: t.nn.Module, layers: int,
                 layer_size: int) -> None:  # fmt: skip
        super().__init__()
        self.layers = t.nn.ModuleList([t.nn.Linear(input_size, layer_size)]
                                      + [t.nn.Linear(layer_size, layer_size) for _ in range(layers - 1)])  # fmt: skip
        self.basis_parameters = t.nn.Linear(layer_size, theta_size)
        self.basis_function = basis_function

    def forward(self, x: t.Tensor) -> tuple[t.Tensor, t.Tensor]:
        block_input = x
        for layer in self.layers:
            block_input = t.relu(layer(block_input))
        return self.basis_function(self.basis_parameters(block_input))


class NBeats(t.nn.Module):
    def __init__(self, blocks: t.nn.ModuleList) -> None:
        super().__init__()
        self.blocks = blocks

    def forward(self, x: t.Tensor, input_mask: t.Tensor) -> t.Tensor:
        residuals = x.flip(dims=(1,))
        input_mask = input_mask.flip(dims=(1,))
        forecast = x[:, -1:]
        for block in self.blocks:
            backcast, block_forecast = block(residuals)
            residuals = (residuals - backcast) * input_mask
            forecast = forecast + block_forecast
        return forecast


class GenericBasis(t.nn.Module):
    def __init__(self, backcast_size: int, forecast_size: int) -> None:
        super().__init__()
        self.backcast_size, self.forecast_size = backcast_size, forecast_size

    def forward(self, theta: t.Tensor) -> tuple[t.Tensor, t.Tensor]:
        return theta[:, : self.backcast_size], theta[:, -self.forecast_size :]


def generic(input_size: int, output_size: int, stacks: int, layers: int, layer_size: int) -> NBeats:
    return NBeats(t.nn.ModuleList([
        NBeatsBlock(input_size, input_size + output_size, GenericBasis(input_size, output_size), layers, layer_size)
        for _ in range(stacks)
    ]))  # fmt: skip


# --------------------------------------------------------------------------- the experiment + trainer


def smape(forecast: np.ndarray, target: np.ndarray) -> float:
    return float(np.mean(200.0 * np.abs(forecast - target) / (np.abs(forecast) + np.abs(target))))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    t.manual_seed(seed)
    np.random.seed(seed)
    full = make_series(seed)
    training_values = [s[:-HORIZON] for s in full]
    test_values = np.stack([s[-HORIZON:] for s in full])

    input_size = LOOKBACK * HORIZON
    sampler = TimeseriesSampler(training_values, input_size, HORIZON, int(HISTORY_SIZE * HORIZON), BATCH_SIZE)
    training_set = iter(sampler)
    model = generic(input_size, HORIZON, STACKS, LAYERS, LAYER_SIZE)
    no_nan = variant != "mape_without_divide_no_nan"

    def training_loss_fn(x, freq, forecast, target, target_mask):  # __loss_fn("MAPE")
        return mape_loss(forecast, target, target_mask, no_nan=no_nan)

    def loss_for_probe(forecast: t.Tensor, target: t.Tensor) -> t.Tensor:
        return mape_loss(forecast, target, (target != 0).float(), no_nan=no_nan)

    optimizer = optim.Adam(model.parameters(), lr=LEARNING_RATE)
    lr_decay_step = max(1, ITERATIONS // 3)

    x, x_mask, y, y_mask = map(to_tensor, next(training_set))
    first_batch = ((x, x_mask), y)
    nx.preflight(model, first_batch, loss_for_probe, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    losses: list[float] = []
    iterations_run = 0
    for i in range(1, ITERATIONS + 1):
        model.train()
        if i > 1:
            x, x_mask, y, y_mask = map(to_tensor, next(training_set))
        optimizer.zero_grad()
        forecast = model(x, x_mask)
        training_loss = training_loss_fn(x, 12, forecast, y, y_mask)
        if np.isnan(float(training_loss.detach())):
            break
        training_loss.backward()
        t.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        for param_group in optimizer.param_groups:
            if variant == "lr_decay_every_iteration":
                param_group["lr"] = LEARNING_RATE * 0.5 ** i
            else:
                param_group["lr"] = LEARNING_RATE * 0.5 ** (i // lr_decay_step)
        losses.append(float(training_loss.detach()))  # snapshot_manager.register(training_loss=...)
        mon.log(training_loss)
        iterations_run = i

    model.eval()
    with t.no_grad():
        window, window_mask = map(to_tensor, sampler.last_insample_window())
        forecasts = model(window, window_mask).numpy()
    nx.finish(mon, model, first_batch, loss_for_probe, optimizer=optimizer)
    return {
        "test_smape": smape(forecasts, test_values),
        "test_mse": float(np.mean((forecasts - test_values) ** 2)),
        "iterations": float(iterations_run),
        "final_train_loss": losses[-1] if losses else float("nan"),
    }

"""Port of udacity/deep-learning-v2-pytorch's Simple RNN: an ``nn.RNN`` (batch_first) with a
``Linear`` on every step's output predicts the next point of a sine wave, one window of 20
points per step, the hidden state carried from window to window (``hidden.data``).

Source: github.com/udacity/deep-learning-v2-pytorch,
``recurrent-neural-networks/time-series/Simple_RNN.ipynb`` (the only version of the notebook:
there is no separate solution notebook for it) at commit
c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written anew from
the facts of that notebook; no code copied.

Kept: the ``RNN`` module (``nn.RNN(input_size, hidden_dim, n_layers, batch_first=True)``,
``r_out.view(-1, hidden_dim)`` then ``nn.Linear(hidden_dim, output_size)``; forward returns
``(output, hidden)``); the hyperparameters (``input_size=1``, ``output_size=1``,
``hidden_dim=32``, ``n_layers=1``, ``seq_length=20``); ``nn.MSELoss`` and
``torch.optim.Adam(rnn.parameters(), lr=0.01)``; the ``train`` function as written: ``hidden =
None``, then for each of ``n_steps=75`` steps the window ``np.linspace(step*pi, (step+1)*pi,
seq_length+1)``, ``np.sin``, ``data.resize((seq_length+1, 1))``, ``x = data[:-1]``, ``y =
data[1:]``, ``torch.Tensor(x).unsqueeze(0)`` / ``torch.Tensor(y)``, ``prediction, hidden =
rnn(x_tensor, hidden)``, ``hidden = hidden.data``, loss, ``zero_grad``, ``backward``,
``step``; the loss read every ``print_every=15`` steps.
Shrunk or replaced: nothing shrunk (the notebook already runs in a second on a CPU); no plots;
``torch.manual_seed(seed)`` added (the notebook seeds nothing).
Measure only (not in the program): after training, the RNN runs on over the next 25 windows
(steps 75..99) without gradients, its hidden state carried as in training, and the mean
squared error of its prediction against the true next point (shapes matched) is the test
MSE; the same squared error on the last 15 training windows is the train MSE.

nndx, as the author would add it after reading the README: the forward takes the hidden state
as a second argument, so the batch is ``((x, hidden), y)`` with the first window and the
initial ``None`` state; a preflight ``nndx.probe`` with the ``MSELoss`` and the Adam;
``nndx.Monitor(rnn, optimizer)`` around ``train``, each step's loss logged after
``optimizer.step()``; after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_simple_rnn"
SOURCE = Source("udacity/deep-learning-v2-pytorch", "recurrent-neural-networks/time-series/Simple_RNN.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (75 steps of one 20-point sine window, Adam at 0.01)"),
        Variant(
            "target_flattened",
            "the target is flattened to match the flattened output (y_tensor = torch.Tensor(y).view(-1)): the "
            "prediction is (20, 1) and the target (20,), so MSELoss broadcasts them to (20, 20) and every "
            "output is fitted to all 20 targets of the window (a UserWarning, no error)",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/16045",
             "https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/timeseriesAI/tsai/issues/22",
             "https://github.com/andrewgcodes/xlstm/issues/4"),
            Measure("test_mse", "next-point test MSE at least 5x the healthy run's: 0.074/0.042/0.050 against "
                    "0.00045/0.00017/0.00024 healthy on seeds 0/1/2",
                    lambda healthy, buggy: not buggy < 5.0 * healthy),
        ),
        Variant(
            "target_not_shifted",
            "the target window is not shifted by one (y = data[:-1], the same points as x): the RNN learns to "
            "copy its input and never predicts the next point",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/keras-team/keras/issues/2856",
             "https://github.com/KIC/pandas-ml-quant/issues/25",
             "https://github.com/songlab-cal/tape/issues/32"),
            Measure("test_mse", "next-point test MSE at least 5x the healthy run's: 0.0124/0.0124/0.0123 (the "
                    "error of copying the input) against 0.00045/0.00017/0.00024 healthy on seeds 0/1/2",
                    lambda healthy, buggy: not buggy < 5.0 * healthy),
        ),
    )
}

seq_length = 20
input_size, output_size, hidden_dim, n_layers = 1, 1, 32, 1
N_STEPS, PRINT_EVERY, TEST_STEPS = 75, 15, 25


class RNN(nn.Module):
    def __init__(self, input_size: int, output_size: int, hidden_dim: int, n_layers: int) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.rnn = nn.RNN(input_size, hidden_dim, n_layers, batch_first=True)
        self.fc = nn.Linear(hidden_dim, output_size)

    def forward(self, x, hidden):
        batch_size = x.size(0)  # noqa: F841 - the notebook computes it and never uses it
        r_out, hidden = self.rnn(x, hidden)
        r_out = r_out.view(-1, self.hidden_dim)
        output = self.fc(r_out)
        return output, hidden


def window(step: int, variant: str):
    time_steps = np.linspace(step * np.pi, (step + 1) * np.pi, seq_length + 1)
    data = np.sin(time_steps)
    data.resize((seq_length + 1, 1))  # input_size=1
    x = data[:-1]
    y = data[:-1] if variant == "target_not_shifted" else data[1:]
    x_tensor = torch.Tensor(x).unsqueeze(0)
    y_tensor = torch.Tensor(y).view(-1) if variant == "target_flattened" else torch.Tensor(y)
    true_next = torch.Tensor(data[1:])  # measure only
    return x_tensor, y_tensor, true_next


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rnn = RNN(input_size, output_size, hidden_dim, n_layers)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(rnn.parameters(), lr=0.01)

    x0, y0, _ = window(0, variant)
    probe_batch = ((x0, None), y0)
    nx.preflight(rnn, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(rnn, optimizer)

    printed: list[float] = []
    train_sq: list[float] = []
    hidden = None
    for batch_i, step in enumerate(range(N_STEPS)):
        x_tensor, y_tensor, true_next = window(step, variant)
        prediction, hidden = rnn(x_tensor, hidden)
        hidden = hidden.data
        loss = criterion(prediction, y_tensor)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        if batch_i % PRINT_EVERY == 0:
            printed.append(loss.item())
        if step >= N_STEPS - 15:
            train_sq.append(float(((prediction.detach() - true_next) ** 2).mean()))

    nx.finish(mon, rnn, probe_batch, criterion, optimizer=optimizer)

    test_sq = []
    with torch.no_grad():
        for step in range(N_STEPS, N_STEPS + TEST_STEPS):
            x_tensor, _, true_next = window(step, variant)
            prediction, hidden = rnn(x_tensor, hidden)
            test_sq.append(float(((prediction - true_next) ** 2).mean()))
    return {"test_mse": float(np.mean(test_sq)), "train_mse": float(np.mean(train_sq)),
            "last_printed_loss": printed[-1], "first_loss": printed[0]}  # fmt: skip
